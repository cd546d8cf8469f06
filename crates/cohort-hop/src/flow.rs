//! The two ends of one association: the signer ([`SendFlow`]) runs rounds over its
//! signature chain; the verifier ([`RecvFlow`]) acknowledges them from its acknowledgment
//! chain and delivers what verifies. Both keep a [`FlowGuard`], the same public checks a
//! relay makes, so an endpoint never trusts its own bookkeeping over the chains.
//!
//! ```text
//!  signer                                     verifier
//!  queue ─▶ start_round: S1(e_i1, MACs) ────▶ on_s1: guard, A1(a_i1 [, commitments])
//!           on_a1 ◀────────────────────────── (retransmitted S1 ⇒ the same A1 again)
//!           S2 × k (key e_i0, message[, path]) ─▶ on_s2: guard, deliver once
//!           then the next round's S1            A2(a_i0, ack|nack secret) when reports
//! ```
//!
//! With a window of `w` rounds the signer keeps up to `w` rounds between S1 and S2: their
//! S1s go out back to back, and each round's S2s leave once its A1 and the A1s of every
//! earlier round are in (keys are disclosed in round order). The verifier answers S1s in
//! round order too, holding a later round's A1 until the earlier S1s are in.

use crate::chain::{ChainStorage, HashChain};
use crate::config::Mode;
use crate::crypto::{self, Element, ELEMENT_LEN};
use crate::guard::{FlowGuard, Refusal, Taken};
use crate::merkle::MerkleTree;
use crate::resend::{self, Resend};
use crate::wire::{AnchorInfo, FlowHeader, Packet, PairId, ReportCommitment};
use cohort_core::Timestamp;
use cohort_crypto::CryptoProvider;
use rand_core::RngCore;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;
use zeroize::Zeroize;

/// A chain the endpoint owns, with the public description it announced.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(crate) struct OwnChain {
    pub info: AnchorInfo,
    pub chain: HashChain,
    /// The peer confirmed it (RenewAck, OpenAck or the handshake).
    pub confirmed: bool,
    /// Rounds in flight the chain is laid out for ([`crate::guard::round_indices`]).
    window: u32,
    /// With a window above one, elements walked past on the way down to a round's key that
    /// later rounds' S1s still need (index, element), at most `2 * window`.
    passed: Vec<(u32, Element)>,
}

impl Drop for OwnChain {
    fn drop(&mut self) {
        for (_, e) in &mut self.passed {
            e.zeroize();
        }
    }
}

impl OwnChain {
    pub fn generate(
        provider: &CryptoProvider,
        rng: &mut dyn RngCore,
        rounds: u32,
        start_round: u32,
        storage: ChainStorage,
    ) -> OwnChain {
        let mut chain_id = [0u8; crypto::CHAIN_ID_LEN];
        rng.fill_bytes(&mut chain_id);
        let mut seed = [0u8; ELEMENT_LEN];
        rng.fill_bytes(&mut seed);
        let length = rounds.max(1) * 2;
        let chain = HashChain::generate(provider, chain_id, seed, length, storage);
        seed.zeroize();
        OwnChain {
            info: AnchorInfo {
                chain_id,
                anchor: chain.anchor(),
                length,
                start_round,
            },
            chain,
            confirmed: false,
            window: 1,
            passed: Vec::new(),
        }
    }

    /// The same chain laid out for `window` rounds in flight (a signature chain).
    pub fn with_window(mut self, window: u32) -> OwnChain {
        self.window = window.max(1);
        self
    }

    /// `(i1, i0)` of `round`: the S1 (or A1) element's index and the key's (or A2's).
    fn indices(&self, round: u32) -> (u32, u32) {
        crate::guard::round_indices(&self.info, self.window, round)
    }

    fn serves(&self, round: u32) -> bool {
        round >= self.info.start_round && round - self.info.start_round < self.info.length / 2
    }

    fn end_round(&self) -> u32 {
        self.info.start_round.saturating_add(self.info.length / 2)
    }

    /// The element at `index`, walking the chain down to it. Elements above it are skipped
    /// for good with a window of one, and kept for later rounds' S1s with a wider one.
    /// `None` if the chain is already below `index`.
    fn take(&mut self, provider: &CryptoProvider, index: u32) -> Option<Element> {
        if let Some(at) = self.passed.iter().position(|(i, _)| *i == index) {
            let (_, e) = self.passed.swap_remove(at);
            return Some(e);
        }
        loop {
            let next = self.chain.next_index()?;
            if next < index {
                return None;
            }
            let (i, mut e) = self.chain.next(provider)?;
            if i == index {
                return Some(e);
            }
            if self.window > 1 {
                self.passed.push((i, e));
                // Only the lowest indices can still be needed: the highest belong to rounds
                // that are long gone.
                let keep = 2 * self.window as usize;
                if self.passed.len() > keep {
                    self.passed.sort_unstable_by_key(|(i, _)| *i);
                    for (_, old) in self.passed.drain(keep..) {
                        let mut old = old;
                        old.zeroize();
                    }
                }
            } else {
                e.zeroize();
            }
        }
    }
}

/// A round the signer has sent the S1 of and not yet finished.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
struct Inflight {
    round: u32,
    /// ALPHA-M: the round's Merkle tree.
    tree: Option<MerkleTree>,
    messages: Vec<Vec<u8>>,
    key: Element,
    s1: Vec<u8>,
    /// When the S1 was last sent and how often again.
    resend: Resend,
    first_sent_at: Timestamp,
    /// Its A1 has come (its S2s wait for the earlier rounds' A1s).
    acked: bool,
}

impl Drop for Inflight {
    fn drop(&mut self) {
        self.key.zeroize();
    }
}

/// What a signer's timer did.
pub(crate) enum SendTimeout {
    /// Nothing due.
    Nothing,
    /// The S1 was sent again, for the n-th time.
    Retransmitted(u32),
    /// The S1 went unanswered `max_retries` times (reported once; it is still resent).
    Stalled(u32),
}

/// The signer's end of an association.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(crate) struct SendFlow {
    pub flow: u16,
    pub mode: Mode,
    pub guard: FlowGuard,
    chains: VecDeque<OwnChain>,
    next_round: u32,
    plain_seq: u32,
    pub queue: VecDeque<Vec<u8>>,
    /// Rounds whose S1 went out and whose S2s did not yet, oldest first (at most the
    /// guard's window).
    inflight: VecDeque<Inflight>,
    /// Packets ready for the wire (S1, S2, PLAIN), in order.
    pub ready: VecDeque<Vec<u8>>,
    /// The peer accepted the flow (OpenAck seen).
    pub open: bool,
    /// A renewal's start round that the peer has not confirmed yet.
    pub renewing: Option<u32>,
    pub sent_messages: u64,
}

impl SendFlow {
    pub fn new(
        flow: u16,
        mode: Mode,
        reports: bool,
        window: u8,
        first: OwnChain,
        max_rounds: usize,
        max_skip_rounds: u32,
    ) -> Option<SendFlow> {
        let guard = FlowGuard::new(
            mode,
            reports,
            window,
            first.info,
            max_rounds,
            max_skip_rounds,
        )?;
        let first = first.with_window(u32::from(window));
        Some(SendFlow {
            flow,
            mode,
            guard,
            chains: VecDeque::from([first]),
            next_round: 0,
            plain_seq: 0,
            queue: VecDeque::new(),
            inflight: VecDeque::new(),
            ready: VecDeque::new(),
            open: false,
            renewing: None,
            sent_messages: 0,
        })
    }

    /// The first chain's public description (sent in Open or the handshake).
    pub fn first_anchor(&self) -> AnchorInfo {
        self.chains[0].info
    }

    /// Rounds left on confirmed chains.
    pub fn rounds_left(&self) -> u32 {
        self.chains
            .iter()
            .filter(|c| c.confirmed)
            .map(|c| {
                c.end_round()
                    .saturating_sub(self.next_round.max(c.info.start_round))
            })
            .sum()
    }

    /// The next round to start.
    pub fn next_round(&self) -> u32 {
        self.next_round
    }

    /// The oldest round whose S1 awaits its A1, and its retransmissions so far.
    pub fn awaiting_ack(&self) -> Option<(u32, u32)> {
        self.unacked().next().map(|f| (f.round, f.resend.tries))
    }

    /// When the oldest S1 still awaiting its A1 was first sent, if one is.
    pub fn awaiting_since(&self) -> Option<Timestamp> {
        self.unacked().map(|f| f.first_sent_at).min()
    }

    /// Rounds in flight whose A1 has not come.
    fn unacked(&self) -> impl Iterator<Item = &Inflight> {
        self.inflight.iter().filter(|f| !f.acked)
    }

    /// Rounds between S1 and S2 now.
    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// Elements left on the current chain.
    pub fn elements_left(&self) -> u32 {
        self.chains.front().map_or(0, |c| c.chain.remaining())
    }

    /// Whether a renewal should start: the confirmed chains run out within `margin` rounds
    /// and none is under way.
    pub fn wants_renewal(&self, margin: u32) -> Option<u32> {
        if self.mode == Mode::Unprotected || self.renewing.is_some() {
            return None;
        }
        let end = self.chains.back()?.end_round();
        (end.saturating_sub(self.next_round) <= margin).then_some(end)
    }

    /// Adds a renewed chain (not usable until confirmed).
    pub fn push_renewal(&mut self, chain: OwnChain) {
        let chain = chain.with_window(self.guard.window());
        self.renewing = Some(chain.info.start_round);
        self.guard.add_sig_chain(chain.info);
        self.chains.push_back(chain);
    }

    /// The peer confirmed the renewal starting at `start_round`.
    pub fn confirm_renewal(&mut self, start_round: u32) -> bool {
        let Some(chain) = self
            .chains
            .iter_mut()
            .find(|c| c.info.start_round == start_round)
        else {
            return false;
        };
        let newly = !chain.confirmed;
        chain.confirmed = true;
        if self.renewing == Some(start_round) {
            self.renewing = None;
        }
        newly
    }

    /// The chain for `round`, if confirmed.
    fn chain_for(&mut self, round: u32) -> Option<&mut OwnChain> {
        while self
            .chains
            .front()
            .is_some_and(|c| c.end_round() <= round && self.chains.len() > 1)
        {
            self.chains.pop_front();
        }
        self.chains
            .iter_mut()
            .find(|c| c.serves(round) && c.confirmed)
    }

    /// Queues a message; false if the queue is full.
    pub fn push(&mut self, data: &[u8], max_queue: usize) -> bool {
        if self.queue.len() >= max_queue {
            return false;
        }
        self.queue.push_back(data.to_vec());
        true
    }

    /// Starts rounds while the flow is open, has messages and has room in its window,
    /// writing their S1s (or, unprotected, sends everything queued). Returns whether
    /// anything was made ready.
    pub fn pump(&mut self, provider: &CryptoProvider, pair_id: &PairId, now: Timestamp) -> bool {
        if !self.open || self.queue.is_empty() {
            return false;
        }
        if self.mode == Mode::Unprotected {
            while let Some(message) = self.queue.pop_front() {
                let header = FlowHeader {
                    pair_id: *pair_id,
                    flow: self.flow,
                    round: self.plain_seq,
                };
                self.plain_seq = self.plain_seq.wrapping_add(1);
                let mut out = Vec::with_capacity(message.len() + 32);
                Packet::Plain {
                    header,
                    payload: &message,
                }
                .write(&mut out);
                self.ready.push_back(out);
                self.sent_messages += 1;
            }
            return true;
        }
        // A round starts at once when nothing is in flight; beside rounds in flight, only a
        // full one does. Partial rounds would spend the window (and an S1, an A1 and a
        // round's hashing each) on a few messages, while the messages queued behind them
        // would leave as soon as an earlier round's A1 comes anyway.
        let batch = usize::from(self.mode.batch());
        let mut started = false;
        while self.inflight.len() < self.guard.window() as usize
            && !self.queue.is_empty()
            && (self.inflight.is_empty() || self.queue.len() >= batch)
            && self.start_round(provider, pair_id, now)
        {
            started = true;
        }
        started
    }

    /// Starts the next round: its elements, MACs (or Merkle root) and S1.
    fn start_round(&mut self, provider: &CryptoProvider, pair_id: &PairId, now: Timestamp) -> bool {
        let round = self.next_round;
        let mode = self.mode;
        let Some(chain) = self.chain_for(round) else {
            return false; // waiting for a renewal to be confirmed
        };
        let (i1, i0) = chain.indices(round);
        let (Some(element), Some(key)) = (chain.take(provider, i1), chain.take(provider, i0))
        else {
            return false;
        };
        let take = usize::from(mode.batch()).min(self.queue.len());
        let messages: Vec<Vec<u8>> = self.queue.drain(..take).collect();
        let count = u16::try_from(messages.len()).unwrap_or(u16::MAX);
        let header = FlowHeader {
            pair_id: *pair_id,
            flow: self.flow,
            round,
        };
        let fh = header.to_bytes();
        let mut macs = Vec::with_capacity(ELEMENT_LEN * messages.len());
        let mut tree = None;
        match mode {
            Mode::M { .. } => {
                let leaves: Vec<Element> = messages
                    .iter()
                    .map(|m| crypto::merkle_leaf(provider, m))
                    .collect();
                let Some(built) = MerkleTree::new(provider, &leaves) else {
                    return false;
                };
                macs.extend_from_slice(&crypto::mac(
                    provider,
                    &key,
                    &[&fh, &count.to_be_bytes(), &built.root()],
                ));
                // Kept for the S2s' paths: no message is hashed twice.
                tree = Some(built);
            }
            _ => {
                for (j, m) in messages.iter().enumerate() {
                    let j = u16::try_from(j).unwrap_or(u16::MAX);
                    macs.extend_from_slice(&crypto::mac(
                        provider,
                        &key,
                        &[&fh, &j.to_be_bytes(), m],
                    ));
                }
            }
        }
        let mut s1 = Vec::with_capacity(40 + macs.len());
        Packet::S1 {
            header,
            mode: mode.code(),
            element,
            count,
            macs: &macs,
        }
        .write(&mut s1);
        // The elements are spent: this round number is used up whatever happens next.
        self.next_round = round.saturating_add(1);
        // Our own S1 goes through the same checks a relay makes; if it fails them (it should
        // not), the messages wait for the next round.
        if self
            .guard
            .on_s1(provider, &header, mode.code(), &element, count, &macs, now)
            .is_err()
        {
            for m in messages.into_iter().rev() {
                self.queue.push_front(m);
            }
            return false;
        }
        self.ready.push_back(s1.clone());
        self.inflight.push_back(Inflight {
            round,
            tree,
            messages,
            key,
            s1,
            resend: Resend::new(now),
            first_sent_at: now,
            acked: false,
        });
        true
    }

    /// The earliest retransmission deadline of an S1 awaiting its A1.
    pub fn deadline(&self, rto: Duration) -> Option<Timestamp> {
        self.unacked()
            .map(|f| f.resend.deadline(resend::S1, rto))
            .min()
    }

    /// Retransmits the S1s whose time is up (never gives a round up). Reports the first
    /// round that just stalled, else the most retransmissions made now.
    pub fn on_timeout(&mut self, now: Timestamp, rto: Duration, max_retries: u32) -> SendTimeout {
        let mut outcome = SendTimeout::Nothing;
        // A round is never given up: moving on would disclose the next elements, and one
        // of them hashes to this round's key while hops may still take an S1 for it (a
        // forger could then finish the round with a message of its own). The S1 is sent
        // again, backing off, until its A1 comes.
        for inflight in self.inflight.iter_mut().filter(|f| !f.acked) {
            if now < inflight.resend.deadline(resend::S1, rto) {
                continue;
            }
            inflight.resend.resent(now);
            self.ready.push_back(inflight.s1.clone());
            let tries = inflight.resend.tries;
            outcome = match outcome {
                SendTimeout::Stalled(_) => outcome,
                _ if tries == max_retries => SendTimeout::Stalled(inflight.round),
                SendTimeout::Retransmitted(most) => SendTimeout::Retransmitted(most.max(tries)),
                SendTimeout::Nothing => SendTimeout::Retransmitted(tries),
            };
        }
        outcome
    }

    /// An A1 arrived. On the first valid one for a round in flight, that round is
    /// acknowledged, and the S2s of every acknowledged round with no unacknowledged round
    /// before it are made ready; returns the round-trip sample (first try only).
    pub fn on_a1(
        &mut self,
        provider: &CryptoProvider,
        header: &FlowHeader,
        element: &Element,
        report: Option<&ReportCommitment>,
        now: Timestamp,
    ) -> Result<Option<Duration>, Refusal> {
        if self.guard.on_a1(provider, header, element, report, now)? == Taken::Repeat {
            return Err(Refusal::Replayed);
        }
        let Some(acked) = self
            .inflight
            .iter_mut()
            .find(|f| f.round == header.round && !f.acked)
        else {
            return Ok(None);
        };
        acked.acked = true;
        let sample =
            (acked.resend.tries == 0).then(|| now.saturating_duration_since(acked.first_sent_at));
        // Keys go out in round order: a round's S2s wait for every earlier round's A1.
        while self.inflight.front().is_some_and(|f| f.acked) {
            if let Some(inflight) = self.inflight.pop_front() {
                self.release(provider, header, inflight, now);
            }
        }
        Ok(sample)
    }

    /// Makes an acknowledged round's S2s ready (after starting the round that takes its
    /// place in the window).
    fn release(
        &mut self,
        provider: &CryptoProvider,
        header: &FlowHeader,
        inflight: Inflight,
        now: Timestamp,
    ) {
        let count = inflight.messages.len();
        // The next round's S1 goes out ahead of this round's S2s: its element reveals this
        // round's key, but every hop has locked this round's MACs (the A1 passed them), and
        // its A1 can be on the way back while the S2s are still being sent.
        self.pump(provider, &header.pair_id, now);
        for (j, message) in inflight.messages.iter().enumerate() {
            let path: Vec<u8> = inflight
                .tree
                .as_ref()
                .and_then(|t| t.path(j))
                .map(|p| p.concat())
                .unwrap_or_default();
            let mut out = Vec::with_capacity(message.len() + 40 + path.len());
            Packet::S2 {
                header: FlowHeader {
                    round: inflight.round,
                    ..*header
                },
                index: u16::try_from(j).unwrap_or(u16::MAX),
                key: inflight.key,
                path: &path,
                payload: message,
            }
            .write(&mut out);
            self.ready.push_back(out);
        }
        self.sent_messages += count as u64;
    }

    /// An A2 arrived: the verified delivery verdict.
    pub fn on_a2(
        &mut self,
        provider: &CryptoProvider,
        header: &FlowHeader,
        element: &Element,
        delivered: bool,
        secret: &Element,
    ) -> Result<bool, Refusal> {
        self.guard
            .on_a2(provider, header, element, delivered, secret)
            .map(|()| delivered)
    }

    /// Whether nothing is queued, in flight or waiting for the wire.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.inflight.is_empty() && self.ready.is_empty()
    }
}

/// What a verifier did with an S1 or S2.
pub(crate) enum Received {
    /// Nothing to deliver (an S1, or a repeat answered again).
    Nothing,
    /// A verified message.
    Message(Vec<u8>),
}

/// The verifier's end of an association.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(crate) struct RecvFlow {
    pub flow: u16,
    pub mode: Mode,
    pub guard: FlowGuard,
    ack_chains: VecDeque<OwnChain>,
    /// A1s sent, by round, to answer a retransmitted S1 with the same A1.
    a1_sent: BTreeMap<u32, Vec<u8>>,
    /// The next round to acknowledge: A1s go out in round order.
    next_a1: u32,
    /// Rounds of the window whose S1 came before an earlier round's: their A1s wait.
    held: BTreeMap<u32, FlowHeader>,
    /// A2 elements and report secrets waiting for their round to finish.
    pending_reports: BTreeMap<u32, Element>,
    report_key: Element,
    /// Outgoing packets (A1, A2), in order.
    pub ready: VecDeque<Vec<u8>>,
    pub received_messages: u64,
    pub highest_round: u32,
    pub renewing: bool,
    /// S1s that came again after we had answered them (our A1s are not getting through).
    pub repeated_s1: u32,
}

impl Drop for RecvFlow {
    fn drop(&mut self) {
        self.report_key.zeroize();
        for e in self.pending_reports.values_mut() {
            e.zeroize();
        }
    }
}

impl RecvFlow {
    pub fn new(
        flow: u16,
        guard: FlowGuard,
        mut first_ack: OwnChain,
        rng: &mut dyn RngCore,
    ) -> Option<RecvFlow> {
        let mut guard = guard;
        if guard.mode() != Mode::Unprotected && !guard.add_ack_chain(first_ack.info) {
            return None;
        }
        first_ack.confirmed = true;
        let mut report_key = [0u8; ELEMENT_LEN];
        rng.fill_bytes(&mut report_key);
        Some(RecvFlow {
            flow,
            mode: guard.mode(),
            next_a1: guard.first_round(),
            guard,
            ack_chains: VecDeque::from([first_ack]),
            a1_sent: BTreeMap::new(),
            held: BTreeMap::new(),
            pending_reports: BTreeMap::new(),
            report_key,
            ready: VecDeque::new(),
            received_messages: 0,
            highest_round: 0,
            renewing: false,
            repeated_s1: 0,
        })
    }

    /// The first acknowledgment chain's description (for OpenAck or the handshake).
    pub fn first_ack_anchor(&self) -> AnchorInfo {
        self.ack_chains[0].info
    }

    /// Elements left on the current acknowledgment chain.
    pub fn elements_left(&self) -> u32 {
        self.ack_chains.front().map_or(0, |c| c.chain.remaining())
    }

    /// Whether the acknowledgment chain needs renewing: it ends within `margin` rounds of
    /// the highest round seen. Returns the next chain's start round.
    pub fn wants_renewal(&self, margin: u32) -> Option<u32> {
        if self.mode == Mode::Unprotected || self.renewing {
            return None;
        }
        let end = self.ack_chains.back()?.end_round();
        (end.saturating_sub(self.highest_round) <= margin).then_some(end)
    }

    /// Adds a renewed acknowledgment chain (used at once; the Renew is on its way).
    pub fn push_renewal(&mut self, chain: OwnChain) {
        self.guard.add_ack_chain(chain.info);
        self.ack_chains.push_back(chain);
        self.renewing = true;
    }

    fn secret(&self, provider: &CryptoProvider, fh: &[u8], delivered: bool) -> Element {
        let label: &[u8] = if delivered { b"ack" } else { b"nack" };
        crypto::mac(provider, &self.report_key, &[fh, label])
    }

    /// An S1 arrived: check it, and answer with an A1 (the same one for a repeat).
    #[allow(clippy::too_many_arguments)] // the S1's fields, as parsed, and the time
    pub fn on_s1(
        &mut self,
        provider: &CryptoProvider,
        header: &FlowHeader,
        mode: u8,
        element: &Element,
        count: u16,
        macs: &[u8],
        now: Timestamp,
    ) -> Result<(), Refusal> {
        let round = header.round;
        match self
            .guard
            .on_s1(provider, header, mode, element, count, macs, now)
        {
            Ok(_) if self.a1_sent.contains_key(&round) => {
                if let Some(a1) = self.a1_sent.get(&round) {
                    self.ready.push_back(a1.clone());
                }
                self.repeated_s1 += 1;
                return Ok(());
            }
            // A new round, or one stored whose A1 could not be made before (no ack chain
            // for it yet): make the A1 now.
            Ok(_) => {}
            Err(Refusal::Forged) => {
                // Another S1 for a round we acknowledged. If it is the signer's (a forger's
                // S1 got here first), answering keeps the flow moving: the round's messages
                // will fail here, the next round will not.
                if let Some(a1) = self.a1_sent.get(&round) {
                    self.ready.push_back(a1.clone());
                }
                return Err(Refusal::Forged);
            }
            Err(e) => return Err(e),
        }
        self.highest_round = self.highest_round.max(round);
        let window = self.guard.window();
        // A round still open when a round `window + 1` later starts will not complete:
        // report it.
        if self.guard.reports() {
            // The signer sends a round's S1 ahead of the S2s of the round `window` before it,
            // so only rounds before that one are given up on.
            let unfinished: Vec<u32> = self
                .pending_reports
                .keys()
                .copied()
                .filter(|&r| r.saturating_add(window) < round)
                .collect();
            for r in unfinished {
                self.send_report(provider, header, r, false);
            }
        }
        // A1s go out in round order (each one's element reveals the earlier ones'). A round
        // of the window whose S1 overtook an earlier round's waits; a round a whole window
        // ahead means the signer finished the rounds before it, so they are not waited for.
        if round >= self.next_a1.saturating_add(window) {
            self.next_a1 = round + 1 - window;
        }
        if round > self.next_a1 {
            self.held.insert(round, *header);
            return Ok(());
        }
        self.send_a1(provider, header, now)?;
        self.next_a1 = self.next_a1.max(round.saturating_add(1));
        // A held round that cannot be answered now (no acknowledgment chain for it yet) stays
        // held and next in line: its S1's retransmission tries again, as for any round.
        while let Some(held) = self.held.get(&self.next_a1).copied() {
            if self.send_a1(provider, &held, now).is_err() {
                break;
            }
            self.held.remove(&held.round);
            self.next_a1 = held.round.saturating_add(1);
        }
        let next = self.next_a1;
        self.held.retain(|&r, _| r > next);
        Ok(())
    }

    /// Makes and sends the A1 for the round of `header`, whose S1 the guard has taken.
    fn send_a1(
        &mut self,
        provider: &CryptoProvider,
        header: &FlowHeader,
        now: Timestamp,
    ) -> Result<(), Refusal> {
        let round = header.round;
        let Some((i1, i0)) = self.guard.ack_indices(round) else {
            return Err(Refusal::Stale);
        };
        while self
            .ack_chains
            .front()
            .is_some_and(|c| c.end_round() <= round && self.ack_chains.len() > 1)
        {
            self.ack_chains.pop_front();
            self.renewing = false;
        }
        let Some(chain) = self.ack_chains.iter_mut().find(|c| c.serves(round)) else {
            return Err(Refusal::Stale);
        };
        let Some(a1_element) = chain.take(provider, i1) else {
            return Err(Refusal::Stale);
        };
        let report = if self.guard.reports() {
            let Some(a2_element) = chain.take(provider, i0) else {
                return Err(Refusal::Stale);
            };
            let fh = header.to_bytes();
            let ack = crypto::commitment(provider, &self.secret(provider, &fh, true));
            let nack = crypto::commitment(provider, &self.secret(provider, &fh, false));
            let mac = crypto::mac(provider, &a2_element, &[&fh, &ack, &nack]);
            self.pending_reports.insert(round, a2_element);
            Some(ReportCommitment { ack, nack, mac })
        } else {
            None
        };
        self.guard
            .on_a1(provider, header, &a1_element, report.as_ref(), now)?;
        let mut a1 = Vec::with_capacity(96);
        Packet::A1 {
            header: *header,
            element: a1_element,
            report,
        }
        .write(&mut a1);
        self.ready.push_back(a1.clone());
        self.a1_sent.insert(round, a1);
        // Enough to answer the retransmitted S1 of any round of the widest window.
        while self.a1_sent.len() > 2 * usize::from(crate::guard::MAX_WINDOW) {
            self.a1_sent.pop_first();
        }
        while self.pending_reports.len() > 64 {
            self.pending_reports.pop_first();
        }
        Ok(())
    }

    /// An S2 arrived: check it and hand back the message if it is new.
    #[allow(clippy::too_many_arguments)] // the S2's fields, as parsed
    pub fn on_s2(
        &mut self,
        provider: &CryptoProvider,
        header: &FlowHeader,
        index: u16,
        key: &Element,
        path: &[u8],
        payload: &[u8],
    ) -> Result<Received, Refusal> {
        self.guard
            .on_s2(provider, header, index, key, path, payload)?;
        self.received_messages += 1;
        if self.guard.reports() && self.guard.round_complete(header.round) {
            self.send_report(provider, header, header.round, true);
        }
        Ok(Received::Message(payload.to_vec()))
    }

    /// A PLAIN message on an unprotected flow.
    pub fn on_plain(&mut self, payload: &[u8]) -> Received {
        self.received_messages += 1;
        Received::Message(payload.to_vec())
    }

    fn send_report(
        &mut self,
        provider: &CryptoProvider,
        header: &FlowHeader,
        round: u32,
        delivered: bool,
    ) {
        let Some(element) = self.pending_reports.remove(&round) else {
            return;
        };
        let header = FlowHeader { round, ..*header };
        let secret = self.secret(provider, &header.to_bytes(), delivered);
        if self
            .guard
            .on_a2(provider, &header, &element, delivered, &secret)
            .is_err()
        {
            return;
        }
        let mut a2 = Vec::with_capacity(64);
        Packet::A2 {
            header,
            element,
            delivered,
            secret,
        }
        .write(&mut a2);
        self.ready.push_back(a2);
    }
}
