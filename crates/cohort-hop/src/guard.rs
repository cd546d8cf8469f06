//! The public half of one flow: what anybody on the path can check with the anchors of a
//! signed handshake and hashes alone. Relays run only this; a receiving endpoint runs it and
//! then delivers; a signer runs it over its own S1s and the peer's A1s and A2s.
//!
//! # The rules (ALPHA, with the relay safety argument spelled out)
//! Round `r` of a chain with anchor index `n` starting at round `s` uses signature-chain
//! elements `i1 = n - 1 - 2(r - s)` (disclosed in S1) and `i0 = i1 - 1` (the MAC key,
//! disclosed in S2), and acknowledgment-chain elements `i1` (A1) and `i0` (A2).
//! - **S1** opens a round only if its element is *fresh*: lower in the chain than anything
//!   seen. Then nothing that reveals the round's key has been seen here yet, so the MACs
//!   stored now were fixed before the key could be known.
//! - Nobody can check an S1's MACs before the key is out, and its element is public as soon
//!   as it is sent: an eavesdropper can repeat the element with MACs of its own. So a hop
//!   keeps up to [`MAX_CANDIDATES`] distinct S1s of a round until the round's A1 passes
//!   (exact repeats are retransmissions), and an S2 must verify against one of them. A
//!   forger cannot make MACs that a later key matches, so its candidates only take room.
//! - **A1** is taken only for a round whose S1 is stored, with a fresh ack element. The
//!   signer discloses the key only after the A1, and the A1 passed this hop after the MACs
//!   were stored; after it, no new S1 candidate is taken for the round.
//! - **S2** is taken only for an acknowledged round: the key must hash to the round's S1
//!   element, the MAC (or the Merkle path to the MAC'd root) must match a candidate's, and
//!   each message index is taken once. The first S2 that verifies settles the candidate.
//! - **A2** opens a commitment an A1 carried: the ack element must belong to the ack chain,
//!   an A1's MAC over its commitments (keyed with that element) must match, and the secret
//!   must hash to the ack or nack commitment. Like S1s, A1s that repeat the element with
//!   other commitments are kept as candidates (bounded). One report per round.
//!
//!
//! # A window of rounds
//! A flow opened with a window `w > 1` lets the signer have up to `w` rounds between S1 and
//! S2 at once. Its signature chain is laid out in disclosure order (see [`round_indices`]):
//! the S1 elements of the first `w` rounds, then round `r`'s key followed by round
//! `r + w`'s S1 element. So a round's S1 element never reveals the key of any round that may
//! still be waiting for its A1, and the keys go out in round order. Two rules change:
//! - An S1 for a round not stored yet may carry an element already seen (a later round's S1
//!   of the window passed first): it is taken as long as nothing at or below the round's
//!   key has been seen here, which is the safety condition itself.
//! - The verifier sends A1s in round order, so an A1 for a later round proves the earlier
//!   round's A1 was sent: once an A1 for a later round passed a hop, that hop takes no new
//!   S1 candidate for a round it holds, and an A1 that arrives after a later round's (its
//!   element already derivable) is still taken, without report commitments. A round this
//!   hop never stored is still taken then (while its key is secret): the verifier may have
//!   had its S1 from a replay injected past this hop, and the signer's retransmission must
//!   get through.
//!
//! The acknowledgment chain keeps the window-1 layout: the verifier discloses its elements
//! in round order anyway.
//!
//! State is bounded: at most `max_rounds` rounds per flow (the oldest is evicted, and
//! anything for an evicted round is stale) and three chain generations per direction.

use crate::chain::{ChainError, ChainVerifier, Checked};
use crate::config::Mode;
use crate::crypto::{self, Element, ELEMENT_LEN};
use crate::merkle;
use crate::wire::{AnchorInfo, FlowHeader, ReportCommitment};
use cohort_core::Timestamp;
use cohort_crypto::{ct_eq, CryptoProvider};
use std::collections::{BTreeMap, VecDeque};

/// Why a packet was not taken. Maps one to one onto the drop counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Does not fit the flow (mode, count, index out of range).
    Malformed,
    /// A chain element, MAC, path or report that does not verify.
    Forged,
    /// Seen before.
    Replayed,
    /// Round evicted, its key possibly public, or no chain for it.
    Stale,
    /// S2 for a round not acknowledged at this hop.
    Unverifiable,
    /// No such flow here (never opened, or closed).
    Unknown,
}

/// What happened to an S1 or A1 that was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// New information.
    New,
    /// An exact repeat of something taken before (a retransmission): pass it on again.
    Repeat,
}

/// Exact repeats of a round's S1 (and of its A1) a hop passes on freely; after that it
/// passes at most one every [`REPEAT_GAP`]. Retransmissions keep getting through (a signer
/// never gives a round up and resends at least every 2 s), while a replayer can make a hop
/// send at most one packet per round every `REPEAT_GAP`.
pub const MAX_REPEATS: u32 = 8;

/// See [`MAX_REPEATS`].
pub const REPEAT_GAP: std::time::Duration = std::time::Duration::from_millis(100);

/// Counts a repeat and says whether to pass it on.
fn pass_repeat(count: &mut u32, last_passed: &mut Timestamp, now: Timestamp) -> bool {
    let pass = *count < MAX_REPEATS || now >= *last_passed + REPEAT_GAP;
    *count = count.saturating_add(1);
    if pass {
        *last_passed = now;
    }
    pass
}

/// Most distinct S1s (same element, other MACs) a hop holds for one round before an A1.
pub const MAX_CANDIDATES: usize = 4;

fn split_elements(bytes: &[u8]) -> Vec<Element> {
    bytes
        .chunks_exact(ELEMENT_LEN)
        .map(|c| {
            let mut e = [0u8; ELEMENT_LEN];
            e.copy_from_slice(c);
            e
        })
        .collect()
}

/// Most rounds a flow may have in flight at once (its window).
pub const MAX_WINDOW: u8 = 8;

/// The chain indices `(i1, i0)` of `round` in a chain described by `info` laid out for
/// `window` rounds in flight: `i1` is disclosed by the round's S1 (or A1), `i0` by its S2
/// (or A2). Elements are disclosed from the top of the chain down, in this order: the S1
/// elements of the first `window` rounds, then for each round `r` its key followed by the
/// S1 element of round `r + window`, and at the end the keys left. With `window = 1` this
/// is `i1 = n - 1 - 2(r - s)`, `i0 = i1 - 1`. Meaningful when the chain serves the round
/// and `1 <= window <= n / 2` (what a flow's guard checks); other inputs give indices
/// clamped to the chain, never a panic.
pub fn round_indices(info: &AnchorInfo, window: u32, round: u32) -> (u32, u32) {
    let rounds = info.length / 2;
    let r = round.saturating_sub(info.start_round);
    let twice = r.saturating_mul(2);
    let s1_position = r.max(twice.saturating_add(1).saturating_sub(window));
    let key_position = window.saturating_add(twice).min(rounds.saturating_add(r));
    let top = info.length.saturating_sub(1);
    (
        top.saturating_sub(s1_position),
        top.saturating_sub(key_position),
    )
}

/// One chain generation: the rounds it serves and its verifier.
#[derive(Clone, Debug)]
struct Generation {
    info: AnchorInfo,
    verifier: ChainVerifier,
    /// Rounds in flight the chain is laid out for (1 for acknowledgment chains).
    window: u32,
}

impl Generation {
    fn rounds(&self) -> u32 {
        self.info.length / 2
    }

    fn serves(&self, round: u32) -> bool {
        round >= self.info.start_round && round - self.info.start_round < self.rounds()
    }

    /// (S1 or A1 index, S2 key or A2 index) for `round`.
    fn indices(&self, round: u32) -> (u32, u32) {
        round_indices(&self.info, self.window, round)
    }
}

/// Chains of one kind (signature or acknowledgment) for one flow: up to three generations.
#[derive(Clone, Debug, Default)]
struct Chains {
    generations: VecDeque<Generation>,
}

impl Chains {
    fn add(&mut self, info: AnchorInfo, max_skip_rounds: u32, window: u32) -> bool {
        // The chain's rounds must fit the round counter (a peer may announce anything), and
        // it must serve at least a window of rounds.
        if info.length < 2
            || !info.length.is_multiple_of(2)
            || info.start_round.checked_add(info.length / 2).is_none()
            || info.length / 2 < window
        {
            return false;
        }
        if let Some(last) = self.generations.back() {
            // A renewal continues where the last generation ends; a repeat is harmless.
            if last.info == info || self.generations.iter().any(|g| g.info == info) {
                return true;
            }
            if Some(info.start_round) != last.info.start_round.checked_add(last.rounds()) {
                return false;
            }
        }
        let verifier = ChainVerifier::new(
            info.chain_id,
            info.anchor,
            info.length,
            max_skip_rounds
                .saturating_add(window)
                .saturating_mul(2)
                .saturating_add(2),
        );
        self.generations.push_back(Generation {
            info,
            verifier,
            window,
        });
        while self.generations.len() > 3 {
            self.generations.pop_front();
        }
        true
    }

    fn find(&mut self, round: u32) -> Option<&mut Generation> {
        self.generations.iter_mut().find(|g| g.serves(round))
    }

    /// Whether the lower element of `round` (the S2 key, or the A2 element) may be public
    /// here: anything at or below it has been seen, or no generation serves the round.
    fn lower_element_public(&mut self, round: u32) -> bool {
        self.find(round).is_none_or(|g| {
            let (_, i0) = g.indices(round);
            g.verifier.known_index() <= i0
        })
    }

    /// Checks the upper element of a round not stored before (an S1's, or an A1's) against
    /// its chain: `Ok(true)` if it is fresh. A repeat or an old element was already
    /// disclosed here; with a window of one that means the round's lower element may be
    /// public, so nothing new can be trusted for it (`Stale`). With a wider window
    /// (`windowed`) it is `Ok(false)` and the caller decides (see the module's rules).
    fn verify_upper_element(
        &mut self,
        provider: &CryptoProvider,
        round: u32,
        element: &Element,
        windowed: bool,
    ) -> Result<bool, Refusal> {
        let generation = self.find(round).ok_or(Refusal::Stale)?;
        let (i1, _) = generation.indices(round);
        match generation.verifier.verify(provider, i1, element) {
            Ok(Checked::Fresh) => Ok(true),
            Ok(Checked::Repeat | Checked::Old) if windowed => Ok(false),
            Ok(Checked::Repeat | Checked::Old) => Err(Refusal::Stale),
            Err(ChainError::TooFar) => Err(Refusal::Stale),
            Err(ChainError::Mismatch) => Err(Refusal::Forged),
        }
    }
}

/// The refusal for a packet of a round this hop does not hold: `Stale` if the round was
/// evicted, `Unverifiable` if its S1 has not been seen yet.
fn unknown_round(round: u32, evicted_below: u32) -> Refusal {
    if round < evicted_below {
        Refusal::Stale
    } else {
        Refusal::Unverifiable
    }
}

/// What a hop remembers of one round.
#[derive(Clone, Debug)]
struct RoundState {
    s1_element: Element,
    /// S1s seen with this element: (digest, count, MACs), where the MACs are one per message
    /// (N, C) or one over the Merkle root (M). One, unless somebody repeated the element
    /// with MACs of its own; once an S2 verifies, only that candidate is left.
    candidates: Vec<(Element, u16, Vec<Element>)>,
    settled: bool,
    /// Exact repeats of the S1 and of the A1 passed on so far.
    s1_repeats: u32,
    s1_passed: Timestamp,
    a1_repeats: u32,
    a1_passed: Timestamp,
    a1_element: Option<Element>,
    /// Report commitments seen with the A1's element (candidates, as for S1s).
    reports: Vec<ReportCommitment>,
    /// The key, once an S2 showed it.
    key: Option<Element>,
    /// ALPHA-M: the root the MAC was checked over, and the nodes of its tree that
    /// verified messages have authenticated since.
    tree: Option<merkle::VerifiedNodes>,
    seen: Vec<bool>,
    seen_count: u16,
    reported: bool,
}

/// The verification state of one unidirectional flow.
#[derive(Clone, Debug)]
pub struct FlowGuard {
    mode: Mode,
    reports: bool,
    sig: Chains,
    ack: Chains,
    rounds: BTreeMap<u32, RoundState>,
    max_rounds: usize,
    max_skip_rounds: u32,
    /// Rounds below this were evicted.
    evicted_below: u32,
    /// Rounds the signer may have in flight (the signature chain's layout).
    window: u32,
    /// The highest round an A1 was taken for here.
    highest_a1: Option<u32>,
}

impl FlowGuard {
    /// A guard for a flow of `mode` with `window` rounds in flight (1 to [`MAX_WINDOW`],
    /// at most half of `max_rounds`) whose signature chain starts with `sig`.
    pub fn new(
        mode: Mode,
        reports: bool,
        window: u8,
        sig: AnchorInfo,
        max_rounds: usize,
        max_skip_rounds: u32,
    ) -> Option<FlowGuard> {
        let max_rounds = max_rounds.max(2);
        if window == 0 || window > MAX_WINDOW || usize::from(window) * 2 > max_rounds {
            return None;
        }
        let mut guard = FlowGuard {
            mode,
            reports,
            sig: Chains::default(),
            ack: Chains::default(),
            rounds: BTreeMap::new(),
            max_rounds,
            max_skip_rounds,
            evicted_below: 0,
            window: u32::from(window),
            highest_a1: None,
        };
        (mode == Mode::Unprotected || guard.sig.add(sig, max_skip_rounds, guard.window))
            .then_some(guard)
    }

    /// Rounds the signer may have in flight.
    pub fn window(&self) -> u32 {
        self.window
    }

    /// The first round of the oldest signature chain held.
    pub fn first_round(&self) -> u32 {
        self.sig
            .generations
            .front()
            .map_or(0, |g| g.info.start_round)
    }

    /// The flow's mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether the flow carries A2 delivery reports.
    pub fn reports(&self) -> bool {
        self.reports
    }

    /// Adds the next signature chain (a renewal); false if it does not continue the last.
    pub fn add_sig_chain(&mut self, info: AnchorInfo) -> bool {
        self.sig.add(info, self.max_skip_rounds, self.window)
    }

    /// Adds an acknowledgment chain (the first, from OpenAck, or a renewal).
    pub fn add_ack_chain(&mut self, info: AnchorInfo) -> bool {
        self.ack.add(info, self.max_skip_rounds, 1)
    }

    /// Whether an acknowledgment chain is known (the flow is fully open at this hop).
    pub fn has_ack_chain(&self) -> bool {
        !self.ack.generations.is_empty()
    }

    /// Whether every message of `round` has been taken (of the S1 its S2s verified against).
    pub fn round_complete(&self, round: u32) -> bool {
        self.rounds.get(&round).is_some_and(|r| {
            r.settled
                && r.candidates
                    .first()
                    .is_some_and(|(_, count, _)| r.seen_count == *count)
        })
    }

    /// Checks an S1 and stores its MACs (as a new round, or as another candidate).
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
    ) -> Result<Taken, Refusal> {
        if mode != self.mode.code() || count > self.mode.batch() {
            return Err(Refusal::Malformed);
        }
        let round = header.round;
        let digest = crypto::s1_digest(provider, &header.to_bytes(), element, count, macs);
        if let Some(state) = self.rounds.get_mut(&round) {
            if !ct_eq(&state.s1_element, element) {
                return Err(Refusal::Forged);
            }
            if state.candidates.iter().any(|(d, _, _)| ct_eq(d, &digest)) {
                return if pass_repeat(&mut state.s1_repeats, &mut state.s1_passed, now) {
                    Ok(Taken::Repeat)
                } else {
                    Err(Refusal::Replayed)
                };
            }
            if state.a1_element.is_some() || state.candidates.len() >= MAX_CANDIDATES {
                return Err(Refusal::Forged);
            }
            // A later round's A1 passed here: this round's A1 was sent before it.
            if self.highest_a1.is_some_and(|h| h > round) {
                return Err(Refusal::Stale);
            }
            // Once anything at or below the round's key has been seen here (a later round's
            // S1, or an S2), the key may be public: no MAC offered now can be trusted.
            if self.sig.lower_element_public(round) {
                return Err(Refusal::Stale);
            }
            state.candidates.push((digest, count, split_elements(macs)));
            return Ok(Taken::New);
        }
        if round < self.evicted_below {
            return Err(Refusal::Stale);
        }
        // A repeated or old element was already disclosed here (a later round's S1 or S2 has
        // been seen) and this round was never stored: with a window of one its key may be
        // public, so no MAC can be trusted for it any more. With a wider window a later
        // round's S1 may simply have come first: what matters is whether the key may be.
        let windowed = self.window > 1;
        let fresh = self
            .sig
            .verify_upper_element(provider, round, element, windowed)?;
        // (An A1 for a later round may have passed already: the verifier can have had this
        // round's S1 from elsewhere, a replay injected past this hop. Refusing the round here
        // then would refuse the signer's retransmission for good; storing it is safe while
        // its key is secret.)
        if !fresh && self.sig.lower_element_public(round) {
            return Err(Refusal::Stale);
        }
        self.rounds.insert(
            round,
            RoundState {
                s1_element: *element,
                candidates: vec![(digest, count, split_elements(macs))],
                settled: false,
                s1_repeats: 0,
                s1_passed: now,
                a1_repeats: 0,
                a1_passed: now,
                a1_element: None,
                reports: Vec::new(),
                key: None,
                tree: None,
                seen: Vec::new(),
                seen_count: 0,
                reported: false,
            },
        );
        while self.rounds.len() > self.max_rounds {
            if let Some((&oldest, _)) = self.rounds.iter().next() {
                self.rounds.remove(&oldest);
                self.evicted_below = self.evicted_below.max(oldest + 1);
            }
        }
        Ok(Taken::New)
    }

    /// Checks an A1 for a stored round.
    pub fn on_a1(
        &mut self,
        provider: &CryptoProvider,
        header: &FlowHeader,
        element: &Element,
        report: Option<&ReportCommitment>,
        now: Timestamp,
    ) -> Result<Taken, Refusal> {
        if report.is_some() != self.reports {
            return Err(Refusal::Malformed);
        }
        let round = header.round;
        // With a window of one, any later round stored means a later A1 may be out; with a
        // wider window later S1s come early, and only a later A1 counts.
        let later_round_seen = self.highest_a1.is_some_and(|h| h > round)
            || (self.window == 1
                && self
                    .rounds
                    .range(round.saturating_add(1)..)
                    .next()
                    .is_some());
        let Some(state) = self.rounds.get_mut(&round) else {
            return Err(unknown_round(round, self.evicted_below));
        };
        if let Some(seen) = state.a1_element {
            if !ct_eq(&seen, element) {
                return Err(Refusal::Forged);
            }
            let repeat = match report {
                None => true,
                Some(r) => state.reports.contains(r),
            };
            if repeat {
                return if pass_repeat(&mut state.a1_repeats, &mut state.a1_passed, now) {
                    Ok(Taken::Repeat)
                } else {
                    Err(Refusal::Replayed)
                };
            }
            // The same element with other report commitments: another candidate.
            let Some(r) = report else {
                return Err(Refusal::Forged);
            };
            if state.reported || state.reports.len() >= MAX_CANDIDATES {
                return Err(Refusal::Forged);
            }
            // The report MAC's key (this round's A2 element) is public once the verifier sent
            // the next round's A1 (its element hashes to it) or this round's A2. The verifier
            // sends those only after this round's S2s or the next round's S1 passed every hop:
            // once this hop saw either (or a later A1), no new candidate.
            let public =
                later_round_seen || state.key.is_some() || self.ack.lower_element_public(round);
            if public {
                return Err(Refusal::Stale);
            }
            state.reports.push(*r);
            return Ok(Taken::New);
        }
        // Fresh, or (window > 1) already derivable from a later round's A1 that came first:
        // the round is acknowledged either way, but then its report MAC's key may be public,
        // so its commitments are not kept (the round goes unreported at this hop).
        let windowed = self.window > 1;
        let fresh = self
            .ack
            .verify_upper_element(provider, round, element, windowed)?;
        state.a1_element = Some(*element);
        if fresh {
            state.reports.extend(report.copied());
        }
        self.highest_a1 = Some(self.highest_a1.map_or(round, |h| h.max(round)));
        let most = state
            .candidates
            .iter()
            .map(|(_, count, _)| *count)
            .max()
            .unwrap_or(0);
        state.seen = vec![false; usize::from(most)];
        Ok(Taken::New)
    }

    /// The A1 this hop passed for `round` (element and first report commitment), to send
    /// back for an S1 that carries the round's real `s1_element` (the signer's own, when this
    /// hop holds a forger's MACs), if the repeat throttle lets it go now.
    pub fn a1_to_resend(
        &mut self,
        round: u32,
        s1_element: &Element,
        now: Timestamp,
    ) -> Option<(Element, Option<ReportCommitment>)> {
        let state = self.rounds.get_mut(&round)?;
        if !ct_eq(&state.s1_element, s1_element) {
            return None;
        }
        let element = state.a1_element?;
        let report = state.reports.first().copied();
        pass_repeat(&mut state.a1_repeats, &mut state.a1_passed, now).then_some((element, report))
    }

    /// Checks an S2; on success the message index is marked taken.
    #[allow(clippy::too_many_arguments)] // the S2's fields, as parsed
    pub fn on_s2(
        &mut self,
        provider: &CryptoProvider,
        header: &FlowHeader,
        index: u16,
        key: &Element,
        path: &[u8],
        payload: &[u8],
    ) -> Result<(), Refusal> {
        let round = header.round;
        let Some(state) = self.rounds.get_mut(&round) else {
            return Err(unknown_round(round, self.evicted_below));
        };
        if state.a1_element.is_none() {
            return Err(Refusal::Unverifiable);
        }
        let slot = usize::from(index);
        if slot >= state.seen.len() {
            return Err(Refusal::Malformed);
        }
        if state.seen[slot] {
            return Err(Refusal::Replayed);
        }
        // The key must hash forward to the S1's element (one step with a window of one).
        match state.key {
            Some(known) => {
                if !ct_eq(&known, key) {
                    return Err(Refusal::Forged);
                }
            }
            None => {
                let generation = self.sig.find(round).ok_or(Refusal::Stale)?;
                let (i1, i0) = generation.indices(round);
                let chain_id = generation.info.chain_id;
                if !ct_eq(
                    &crypto::chain_walk(provider, &chain_id, i0, key, i1),
                    &state.s1_element,
                ) {
                    return Err(Refusal::Forged);
                }
                // Move the chain verifier down to the key (it is public now).
                let _ = generation.verifier.verify(provider, i0, key);
                state.key = Some(*key);
            }
        }
        let fh = header.to_bytes();
        // Which candidate S1 this message verifies against.
        let matched = match self.mode {
            Mode::M { .. } => {
                let leaf = crypto::merkle_leaf(provider, payload);
                let path_nodes = split_elements(path);
                match state.tree.as_mut() {
                    // Settled: one candidate left, and its root is known.
                    Some(tree) => tree.check(provider, &leaf, slot, &path_nodes).then_some(0),
                    None => {
                        let mut matched = None;
                        for (c, (_, count, macs)) in state.candidates.iter().enumerate() {
                            let leaves = usize::from(*count);
                            let Some(root) =
                                merkle::root_from_path(provider, &leaf, slot, leaves, &path_nodes)
                            else {
                                continue;
                            };
                            let mac =
                                crypto::mac(provider, key, &[&fh, &count.to_be_bytes(), &root]);
                            if ct_eq(&mac, &macs[0]) {
                                // Remember the path's nodes for the round's later messages
                                // (one more walk, once per round).
                                let mut tree = merkle::VerifiedNodes::new(leaves, root)
                                    .ok_or(Refusal::Malformed)?;
                                let learned = tree.check(provider, &leaf, slot, &path_nodes);
                                debug_assert!(learned, "the path just gave this root");
                                state.tree = Some(tree);
                                matched = Some(c);
                                break;
                            }
                        }
                        matched
                    }
                }
            }
            Mode::N | Mode::C { .. } => {
                if !path.is_empty() {
                    return Err(Refusal::Malformed);
                }
                let mac = crypto::mac(provider, key, &[&fh, &index.to_be_bytes(), payload]);
                state
                    .candidates
                    .iter()
                    .position(|(_, _, macs)| macs.get(slot).is_some_and(|m| ct_eq(m, &mac)))
            }
            Mode::Unprotected => return Err(Refusal::Malformed),
        };
        let Some(c) = matched else {
            return Err(Refusal::Forged);
        };
        if !state.settled {
            let keep = state.candidates.swap_remove(c);
            state.candidates = vec![keep];
            state.settled = true;
        }
        state.seen[slot] = true;
        state.seen_count += 1;
        Ok(())
    }

    /// Checks an A2 against the commitments of the round's A1.
    pub fn on_a2(
        &mut self,
        provider: &CryptoProvider,
        header: &FlowHeader,
        element: &Element,
        delivered: bool,
        secret: &Element,
    ) -> Result<(), Refusal> {
        let round = header.round;
        let Some(state) = self.rounds.get_mut(&round) else {
            return Err(Refusal::Stale);
        };
        if state.reports.is_empty() {
            return Err(Refusal::Unverifiable);
        }
        if state.reported {
            return Err(Refusal::Replayed);
        }
        let generation = self.ack.find(round).ok_or(Refusal::Stale)?;
        let (_, i0) = generation.indices(round);
        match generation.verifier.verify(provider, i0, element) {
            Ok(_) => {}
            Err(ChainError::TooFar) => return Err(Refusal::Stale),
            Err(ChainError::Mismatch) => return Err(Refusal::Forged),
        }
        let fh = header.to_bytes();
        let opened = crypto::commitment(provider, secret);
        let ok = state.reports.iter().any(|report| {
            let mac = crypto::mac(provider, element, &[&fh, &report.ack, &report.nack]);
            let commitment = if delivered { report.ack } else { report.nack };
            ct_eq(&mac, &report.mac) && ct_eq(&opened, &commitment)
        });
        if !ok {
            return Err(Refusal::Forged);
        }
        state.reported = true;
        Ok(())
    }

    /// Index of the element an A1 for `round` discloses, and of the A2's, in the ack chain.
    pub fn ack_indices(&mut self, round: u32) -> Option<(u32, u32)> {
        self.ack.find(round).map(|g| g.indices(round))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::{ChainStorage, HashChain};

    fn chain(p: &CryptoProvider, id: u8, rounds: u32) -> (HashChain, AnchorInfo) {
        let c = HashChain::generate(p, [id; 8], [id; 16], rounds * 2, ChainStorage::Full);
        let info = AnchorInfo {
            chain_id: [id; 8],
            anchor: c.anchor(),
            length: rounds * 2,
            start_round: 0,
        };
        (c, info)
    }

    const T0: Timestamp = Timestamp::ZERO;

    fn header(round: u32) -> FlowHeader {
        FlowHeader {
            pair_id: [1; 8],
            flow: 1,
            round,
        }
    }

    /// A forger who learns a round's A2 element from the next round's A1 must not be able to
    /// slip in report commitments of its own and open them.
    #[test]
    fn report_commitments_close_once_the_a2_element_is_public() {
        let p = CryptoProvider::default_provider();
        let (mut sig, sig_info) = chain(&p, 1, 8);
        let (mut ack, ack_info) = chain(&p, 2, 8);
        let mut g = FlowGuard::new(Mode::N, true, 1, sig_info, 16, 8).unwrap();
        assert!(g.add_ack_chain(ack_info));
        let report = |mac_key: &Element, fh: &FlowHeader, secret: &Element| {
            let c = crypto::commitment(&p, secret);
            ReportCommitment {
                ack: c,
                nack: c,
                mac: crypto::mac(&p, mac_key, &[&fh.to_bytes(), &c, &c]),
            }
        };
        let mut a2_elements = Vec::new();
        for round in 0..2 {
            let (_, e1) = sig.next(&p).unwrap();
            let (_, _key) = sig.next(&p).unwrap();
            let h = header(round);
            assert_eq!(
                g.on_s1(&p, &h, crate::wire::mode_code::N, &e1, 1, &[0u8; 16], T0),
                Ok(Taken::New)
            );
            let (_, a1) = ack.next(&p).unwrap();
            let (_, a2) = ack.next(&p).unwrap();
            let real = report(&a2, &h, &[9; 16]);
            assert_eq!(g.on_a1(&p, &h, &a1, Some(&real), T0), Ok(Taken::New));
            a2_elements.push((a1, a2));
        }
        // Round 1's A1 is out: anyone can hash it to round 0's A2 element.
        let (a1_0, _) = a2_elements[0];
        let (a1_1, _) = a2_elements[1];
        let derived = crypto::chain_step(&p, &[2; 8], 14, &a1_1);
        assert_eq!(derived, a2_elements[0].1);
        let forged_secret = [0x66; 16];
        let forged = report(&derived, &header(0), &forged_secret);
        assert_eq!(
            g.on_a1(&p, &header(0), &a1_0, Some(&forged), T0),
            Err(Refusal::Stale)
        );
        assert_eq!(
            g.on_a2(&p, &header(0), &derived, true, &forged_secret),
            Err(Refusal::Forged)
        );
        // The real report still opens.
        assert_eq!(g.on_a2(&p, &header(0), &derived, true, &[9; 16]), Ok(()));
    }

    /// ALPHA-M after the first S2 of a round: later messages are checked against the nodes
    /// earlier paths authenticated, and a path or payload changed anywhere is still refused
    /// without spending the message's index.
    #[test]
    fn merkle_messages_check_against_known_nodes() {
        use crate::merkle::MerkleTree;
        let p = CryptoProvider::default_provider();
        let (mut sig, sig_info) = chain(&p, 1, 8);
        let (mut ack, ack_info) = chain(&p, 2, 8);
        let mut g = FlowGuard::new(Mode::M { batch: 8 }, false, 1, sig_info, 16, 8).unwrap();
        assert!(g.add_ack_chain(ack_info));
        let messages: Vec<Vec<u8>> = (0..7u8).map(|i| vec![i; 100 + usize::from(i)]).collect();
        let leaves: Vec<Element> = messages
            .iter()
            .map(|m| crypto::merkle_leaf(&p, m))
            .collect();
        let tree = MerkleTree::new(&p, &leaves).unwrap();
        let (_, e1) = sig.next(&p).unwrap();
        let (_, key) = sig.next(&p).unwrap();
        let h = header(0);
        let count = messages.len() as u16;
        let mac = crypto::mac(
            &p,
            &key,
            &[&h.to_bytes(), &count.to_be_bytes(), &tree.root()],
        );
        let m = crate::wire::mode_code::M;
        assert_eq!(g.on_s1(&p, &h, m, &e1, count, &mac, T0), Ok(Taken::New));
        let (_, a1) = ack.next(&p).unwrap();
        assert_eq!(g.on_a1(&p, &h, &a1, None, T0), Ok(Taken::New));
        let path = |i: usize| tree.path(i).unwrap().concat();
        let s2 = |g: &mut FlowGuard, i: usize, path: &[u8], payload: &[u8]| {
            g.on_s2(&p, &h, i as u16, &key, path, payload)
        };
        assert_eq!(s2(&mut g, 0, &path(0), &messages[0]), Ok(()));
        // Leaf 5's path ends in the known left half: a change there is caught by comparing.
        let mut bad = path(5);
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert_eq!(s2(&mut g, 5, &bad, &messages[5]), Err(Refusal::Forged));
        assert_eq!(
            s2(&mut g, 5, &path(5)[16..], &messages[5]),
            Err(Refusal::Forged)
        );
        // Leaf 1 is known from leaf 0's path: a changed payload no longer matches it.
        assert_eq!(s2(&mut g, 1, &path(1), &messages[2]), Err(Refusal::Forged));
        let mut bad = path(1);
        bad[0] ^= 1;
        assert_eq!(s2(&mut g, 1, &bad, &messages[1]), Err(Refusal::Forged));
        for i in [5, 1, 6, 3, 2, 4] {
            assert_eq!(s2(&mut g, i, &path(i), &messages[i]), Ok(()), "message {i}");
        }
        assert_eq!(
            s2(&mut g, 3, &path(3), &messages[3]),
            Err(Refusal::Replayed)
        );
    }

    /// A hop passes on the first repeats of an S1 or A1 (retransmissions), then one per
    /// `REPEAT_GAP`: a replayer gets a bounded rate through, a signer that keeps resending
    /// still does.
    #[test]
    fn repeats_are_passed_on_a_bounded_number_of_times() {
        let p = CryptoProvider::default_provider();
        let (mut sig, sig_info) = chain(&p, 1, 8);
        let (mut ack, ack_info) = chain(&p, 2, 8);
        let mut g = FlowGuard::new(Mode::N, false, 1, sig_info, 16, 8).unwrap();
        assert!(g.add_ack_chain(ack_info));
        let (_, e1) = sig.next(&p).unwrap();
        let h = header(0);
        let s1 = |g: &mut FlowGuard, ms: u64| {
            g.on_s1(
                &p,
                &h,
                crate::wire::mode_code::N,
                &e1,
                1,
                &[7u8; 16],
                Timestamp::from_millis(ms),
            )
        };
        assert_eq!(s1(&mut g, 0), Ok(Taken::New));
        // 100 repeats 10 ms apart (one second): the first 8 pass, then one per 100 ms.
        let passed = (1..=100)
            .filter(|i| s1(&mut g, i * 10) == Ok(Taken::Repeat))
            .count();
        assert_eq!(passed, 8 + 9);
        let (_, a1) = ack.next(&p).unwrap();
        let a1_at =
            |g: &mut FlowGuard, ms: u64| g.on_a1(&p, &h, &a1, None, Timestamp::from_millis(ms));
        assert_eq!(a1_at(&mut g, 0), Ok(Taken::New));
        let passed = (1..=100)
            .filter(|i| a1_at(&mut g, i * 10) == Ok(Taken::Repeat))
            .count();
        assert_eq!(passed, 8 + 9);
        // Much later, a retransmission passes again.
        assert_eq!(a1_at(&mut g, 60_000), Ok(Taken::Repeat));
    }

    /// Once a hop saw the next round's S1 (whose element hashes to this round's key), it
    /// takes no new S1 candidate for this round, even before this round's A1.
    #[test]
    fn no_candidate_once_the_round_key_may_be_public() {
        let p = CryptoProvider::default_provider();
        let (mut sig, sig_info) = chain(&p, 1, 8);
        let mut g = FlowGuard::new(Mode::N, false, 1, sig_info, 16, 8).unwrap();
        let (_, e1) = sig.next(&p).unwrap();
        let (_, _key0) = sig.next(&p).unwrap();
        let (_, e1_next) = sig.next(&p).unwrap();
        let n = crate::wire::mode_code::N;
        assert_eq!(
            g.on_s1(&p, &header(0), n, &e1, 1, &[1; 16], T0),
            Ok(Taken::New)
        );
        // A second candidate is fine while nothing revealed the key.
        assert_eq!(
            g.on_s1(&p, &header(0), n, &e1, 1, &[2; 16], T0),
            Ok(Taken::New)
        );
        assert_eq!(
            g.on_s1(&p, &header(1), n, &e1_next, 1, &[3; 16], T0),
            Ok(Taken::New)
        );
        assert_eq!(
            g.on_s1(&p, &header(0), n, &e1, 1, &[4; 16], T0),
            Err(Refusal::Stale)
        );
    }

    /// Every element of the chain: `all[i]` is `h_i`.
    fn elements(p: &CryptoProvider, id: u8, rounds: u32) -> Vec<Element> {
        let (mut c, _) = chain(p, id, rounds);
        let mut all = vec![[0u8; ELEMENT_LEN]; (rounds * 2) as usize];
        while let Some((i, e)) = c.next(p) {
            all[i as usize] = e;
        }
        all
    }

    /// A signature chain (id 1) and an acknowledgment chain (id 2) of 8 rounds: every
    /// element of each, and their descriptions.
    fn signature_and_ack_chains(
        p: &CryptoProvider,
    ) -> (Vec<Element>, AnchorInfo, Vec<Element>, AnchorInfo) {
        let (_, sig_info) = chain(p, 1, 8);
        let (_, ack_info) = chain(p, 2, 8);
        (elements(p, 1, 8), sig_info, elements(p, 2, 8), ack_info)
    }

    /// The layout for a window: every element is used once, a round's key is disclosed
    /// after the S1s of the whole window before it and before the S1 of the round a window
    /// later, keys go out in round order, and a window of one is the classic layout.
    #[test]
    fn window_layout_discloses_keys_in_order_and_after_the_window() {
        for rounds in [8u32, 9, 64] {
            let info = AnchorInfo {
                chain_id: [0; 8],
                anchor: [0; ELEMENT_LEN],
                length: rounds * 2,
                start_round: 5,
            };
            for window in 1..=u32::from(MAX_WINDOW).min(rounds) {
                let mut used = vec![false; (rounds * 2) as usize];
                for r in 5..5 + rounds {
                    let (i1, i0) = round_indices(&info, window, r);
                    assert!(i0 < i1, "w {window} r {r}");
                    for i in [i1, i0] {
                        assert!(!used[i as usize], "w {window}: index {i} used twice");
                        used[i as usize] = true;
                    }
                    if window == 1 {
                        assert_eq!(i1, info.length - 1 - 2 * (r - 5));
                        assert_eq!(i0, i1 - 1);
                    }
                    // The S1s of the rounds of the window are disclosed before this key.
                    for later in r + 1..(r + window).min(5 + rounds) {
                        assert!(
                            round_indices(&info, window, later).0 > i0,
                            "w {window} r {r}"
                        );
                    }
                    // The S1 of the round a window later comes after it, and so do the keys
                    // of later rounds.
                    if r + window < 5 + rounds {
                        assert!(round_indices(&info, window, r + window).0 < i0);
                    }
                    if r + 1 < 5 + rounds {
                        assert!(round_indices(&info, window, r + 1).1 < i0);
                    }
                }
                assert!(used.iter().all(|&u| u), "w {window}: an element is unused");
            }
        }
    }

    /// With a window of two: a later round's S1 may come first, and the earlier round is
    /// still taken while its key is secret; an S1 whose element a forger derived from the
    /// later one stays a harmless candidate; once the key is out, or a later round's A1
    /// passed, nothing new is taken for the round; and an A1 overtaken by a later one is
    /// taken without its report commitments.
    #[test]
    fn a_window_takes_early_s1s_while_the_key_is_secret() {
        let p = CryptoProvider::default_provider();
        let (all, sig_info, acks, ack_info) = signature_and_ack_chains(&p);
        let n = crate::wire::mode_code::N;
        let window = 2;
        let at = |r: u32| round_indices(&sig_info, window, r);
        let e = |i: u32| all[i as usize];
        let mut g = FlowGuard::new(Mode::N, true, 2, sig_info, 16, 8).unwrap();
        assert!(g.add_ack_chain(ack_info));
        let mac = |r: u32, msg: &[u8]| {
            let key = e(at(r).1);
            crypto::mac(&p, &key, &[&header(r).to_bytes(), &0u16.to_be_bytes(), msg])
        };
        // Round 1's S1 first, then round 0's (its element is now derivable, its key is not).
        let s1 = |g: &mut FlowGuard, r: u32, macs: &Element| {
            g.on_s1(&p, &header(r), n, &e(at(r).0), 1, macs, T0)
        };
        assert_eq!(s1(&mut g, 1, &mac(1, b"one")), Ok(Taken::New));
        // A forger's S1 for round 0, with the element derived from round 1's.
        let derived = crypto::chain_walk(&p, &[1; 8], at(1).0, &e(at(1).0), at(0).0);
        assert_eq!(derived, e(at(0).0));
        let forged_mac = crypto::mac(&p, &[0x66; 16], &[b"EVIL"]);
        assert_eq!(s1(&mut g, 0, &forged_mac), Ok(Taken::New));
        // The signer's S1 for round 0 is another candidate.
        assert_eq!(s1(&mut g, 0, &mac(0, b"zero")), Ok(Taken::New));
        // Round 0's A1 (with reports), then round 1's.
        let report = |r: u32| {
            let c = crypto::commitment(&p, &[9; 16]);
            let (_, a0) = round_indices(&ack_info, 1, r);
            ReportCommitment {
                ack: c,
                nack: c,
                mac: crypto::mac(&p, &acks[a0 as usize], &[&header(r).to_bytes(), &c, &c]),
            }
        };
        let a1 = |r: u32| acks[round_indices(&ack_info, 1, r).0 as usize];
        assert_eq!(
            g.on_a1(&p, &header(0), &a1(0), Some(&report(0)), T0),
            Ok(Taken::New)
        );
        // After the A1, no new candidate for round 0.
        assert_eq!(s1(&mut g, 0, &mac(0, b"late")), Err(Refusal::Forged));
        // Round 0's S2 with the key: the forger's candidate does not match, the signer's does.
        let key0 = e(at(0).1);
        assert_eq!(
            g.on_s2(&p, &header(0), 0, &key0, &[], b"EVIL"),
            Err(Refusal::Forged)
        );
        assert_eq!(g.on_s2(&p, &header(0), 0, &key0, &[], b"zero"), Ok(()));
        // Round 0's key is out, and with it the S1 element of round 2, a window later.
        assert_eq!(s1(&mut g, 2, &mac(2, b"two")), Ok(Taken::New));
        // Round 2's A1 overtakes round 1's: round 1's is still taken (fresh or not), but
        // its report commitments are not kept, so no A2 for round 1 passes here.
        assert_eq!(
            g.on_a1(&p, &header(2), &a1(2), Some(&report(2)), T0),
            Ok(Taken::New)
        );
        assert_eq!(
            g.on_a1(&p, &header(1), &a1(1), Some(&report(1)), T0),
            Ok(Taken::New)
        );
        let (_, a2_1) = round_indices(&ack_info, 1, 1);
        assert_eq!(
            g.on_a2(&p, &header(1), &acks[a2_1 as usize], true, &[9; 16]),
            Err(Refusal::Unverifiable)
        );
        // Round 1's messages still verify.
        assert_eq!(g.on_s2(&p, &header(1), 0, &e(at(1).1), &[], b"one"), Ok(()));
    }

    /// Once a later round's A1 passed a hop, an earlier round it never stored is still taken
    /// while its key is secret (the verifier may have had that S1 from a replay injected
    /// past this hop, and the signer's retransmission must get through), but a round it
    /// holds takes no new candidate.
    #[test]
    fn a_round_behind_a_later_a1() {
        let p = CryptoProvider::default_provider();
        let (all, sig_info, acks, ack_info) = signature_and_ack_chains(&p);
        let n = crate::wire::mode_code::N;
        let at = |r: u32| round_indices(&sig_info, 4, r);
        let mut g = FlowGuard::new(Mode::N, false, 4, sig_info, 16, 8).unwrap();
        assert!(g.add_ack_chain(ack_info));
        let s1 = |g: &mut FlowGuard, r: u32| {
            g.on_s1(&p, &header(r), n, &all[at(r).0 as usize], 1, &[7; 16], T0)
        };
        assert_eq!(s1(&mut g, 2), Ok(Taken::New));
        let a1_2 = acks[round_indices(&ack_info, 1, 2).0 as usize];
        assert_eq!(g.on_a1(&p, &header(2), &a1_2, None, T0), Ok(Taken::New));
        assert_eq!(s1(&mut g, 1), Ok(Taken::New));
        assert_eq!(s1(&mut g, 0), Ok(Taken::New));
        assert_eq!(s1(&mut g, 3), Ok(Taken::New));
        // Round 1 is held now: another candidate for it is refused.
        assert_eq!(
            g.on_s1(&p, &header(1), n, &all[at(1).0 as usize], 1, &[8; 16], T0),
            Err(Refusal::Stale)
        );
    }

    /// A window must fit the flow's bounds.
    #[test]
    fn windows_out_of_bounds_are_refused() {
        let p = CryptoProvider::default_provider();
        let (_, info) = chain(&p, 1, 8);
        assert!(FlowGuard::new(Mode::N, false, 0, info, 16, 8).is_none());
        assert!(FlowGuard::new(Mode::N, false, MAX_WINDOW + 1, info, 32, 8).is_none());
        assert!(FlowGuard::new(Mode::N, false, 8, info, 15, 8).is_none());
        assert!(FlowGuard::new(Mode::N, false, 8, info, 16, 8).is_some());
        // A chain shorter than the window.
        let (_, short) = chain(&p, 1, 2);
        assert!(FlowGuard::new(Mode::N, false, 4, short, 16, 8).is_none());
    }

    /// A chain whose rounds would run past the round counter is refused, first or renewed.
    #[test]
    fn chains_past_the_round_counter_are_refused() {
        let p = CryptoProvider::default_provider();
        let (_, mut info) = chain(&p, 1, 8);
        info.start_round = u32::MAX - 2;
        assert!(FlowGuard::new(Mode::N, false, 1, info, 16, 8).is_none());
        info.start_round = u32::MAX - 8;
        let mut g = FlowGuard::new(Mode::N, false, 1, info, 16, 8).unwrap();
        let (_, mut next) = chain(&p, 2, 8);
        next.start_round = u32::MAX;
        assert!(!g.add_sig_chain(next));
        assert!(!g.add_ack_chain(AnchorInfo {
            start_round: u32::MAX - 1,
            ..next
        }));
    }
}
