//! An ALPHA relay: forwards only what it verified against anchors it saw in a signed
//! handshake, with hashes alone per data packet.
//!
//! ```text
//!  Hello, Challenge, SYN, ACKACK ─▶ forwarded by the addresses in their header (no state)
//!  ACK (both signed parts) ───────▶ verify both signatures once ─▶ pair state, forward
//!  S1 A1 S2 A2 ──▶ pair (by id) ─▶ flow guard ─▶ forward toward the receiver or signer
//!                                   └─ control flow S2 ─▶ Open / OpenAck / Renew / Close
//!                                      (signed anchors checked once per chain)
//! ```
//!
//! A relay keeps no state for anything before an ACK, which an endpoint sends only after a
//! SYN carried a valid return-routability cookie; its pair table is bounded (the oldest pair
//! is evicted), and each flow remembers a bounded number of rounds.

use crate::config::{Mode, RelayConfig};
use crate::event::{HopCounters, RelayEvent};
use crate::guard::{FlowGuard, Refusal};
use crate::wire::{
    ack_signed_bytes, ackack_signed_bytes, control_signed_bytes, signed_envelope_bytes,
    syn_signed_bytes, Control, HandshakeHeader, Packet, PairId, FLOW_FROM_RESPONDER,
};
use cohort_channel::identity::PublicKey;
use cohort_core::{Machine, Timestamp, Transmit};
use cohort_crypto::CryptoProvider;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::net::SocketAddr;

const MAX_ASSOC: u16 = crate::wire::ASSOC_MASK;
/// The shortest wait between two sweeps for idle pairs.
const SWEEP_MIN: std::time::Duration = std::time::Duration::from_millis(100);

#[cfg_attr(feature = "fuzzing", derive(Clone))]
struct RelayPair {
    initiator: SocketAddr,
    responder: SocketAddr,
    initiator_key: PublicKey,
    responder_key: PublicKey,
    /// By flow (direction bit and association id).
    flows: BTreeMap<u16, FlowGuard>,
    /// When the pair last had a packet verified (a tick of [`Relay`]'s counter).
    last_used: u64,
    /// When the pair was learned or last had a packet verified: it is forgotten after
    /// `pair_idle` without one.
    last_seen: Timestamp,
    /// The responder's ACK signature, which the initiator's ACKACK signs.
    ack_signature: Vec<u8>,
    /// The ACK as verified (a repeat is compared, not verified again).
    ack: Vec<u8>,
    /// The ACKACK once verified (a repeat is compared, not verified again).
    ackack: Option<Vec<u8>>,
    /// Digests of the last signed packets verified: a repeat (a retransmitted renewal) is
    /// recognised without another signature check.
    signed_seen: VecDeque<[u8; 32]>,
}

impl RelayPair {
    /// The endpoint that sends on `flow`, and the one that receives.
    fn ends(&self, flow: u16) -> (SocketAddr, SocketAddr) {
        if flow & FLOW_FROM_RESPONDER == 0 {
            (self.initiator, self.responder)
        } else {
            (self.responder, self.initiator)
        }
    }

    fn sender_key(&self, flow: u16) -> PublicKey {
        if flow & FLOW_FROM_RESPONDER == 0 {
            self.initiator_key
        } else {
            self.responder_key
        }
    }
}

/// What a relay knows of one pair.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RelayPairStatus {
    /// The pair id.
    pub pair_id: PairId,
    /// The initiator's address.
    pub initiator: SocketAddr,
    /// The responder's address.
    pub responder: SocketAddr,
    /// Flows (both directions, control included) the relay verifies.
    pub flows: usize,
}

/// A snapshot of a relay, for `hop ctl` and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayStatus {
    /// The relay's address.
    pub local: SocketAddr,
    /// Pairs known.
    pub pairs: Vec<RelayPairStatus>,
    /// Counters.
    pub counters: HopCounters,
}

/// An ALPHA relay (the implementation report's "ALPHA-filter").
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub struct Relay {
    config: RelayConfig,
    provider: CryptoProvider,
    local: SocketAddr,
    pairs: HashMap<PairId, RelayPair>,
    /// A counter that orders pairs by use (ticks on every new pair and verified packet).
    use_clock: u64,
    /// When idle pairs are next looked for (every quarter of `pair_idle`, while any pair
    /// is known).
    next_sweep: Option<Timestamp>,
    out: VecDeque<(SocketAddr, Vec<u8>)>,
    events: VecDeque<RelayEvent>,
    counters: HopCounters,
    /// The sender of the datagram being handled (set by `handle_datagram`, read by
    /// `forward`): a packet is never forwarded back to where it came from.
    arrived_from: Option<SocketAddr>,
}

impl fmt::Debug for Relay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("local", &self.local)
            .field("pairs", &self.pairs.len())
            .finish_non_exhaustive()
    }
}

impl Relay {
    /// A relay at `local`.
    pub fn new(config: RelayConfig, provider: CryptoProvider, local: SocketAddr) -> Relay {
        Relay {
            config,
            provider,
            local,
            pairs: HashMap::new(),
            use_clock: 0,
            next_sweep: None,
            out: VecDeque::new(),
            events: VecDeque::new(),
            counters: HopCounters::default(),
            arrived_from: None,
        }
    }

    /// Its counters.
    pub fn counters(&self) -> &HopCounters {
        &self.counters
    }

    /// A snapshot.
    pub fn status(&self) -> RelayStatus {
        let mut pairs: Vec<_> = self
            .pairs
            .iter()
            .map(|(id, p)| RelayPairStatus {
                pair_id: *id,
                initiator: p.initiator,
                responder: p.responder,
                flows: p.flows.len(),
            })
            .collect();
        pairs.sort();
        RelayStatus {
            local: self.local,
            pairs,
            counters: self.counters,
        }
    }

    fn trusted(&self, key: &[u8; 32]) -> bool {
        crate::config::trusted(&self.config.trust, key)
    }

    fn forward(&mut self, to_endpoint: SocketAddr, data: &[u8]) {
        let next = self.config.next_hop(to_endpoint);
        if next == self.local || Some(next) == self.arrived_from {
            // A packet whose endpoint address leads back to this relay would come straight
            // back and be forwarded again, forever: one forged Challenge naming the relay as
            // its initiator kept it busy (found by the `hop_relay` fuzz target). A relay
            // bound to a wildcard address (0.0.0.0:7000) does not know its own address, so
            // the same packet reaches it once more, from itself: the second check stops it
            // there, and also a packet bounced between two relays whose routes for an
            // endpoint point at each other. A loop through three or more relays needs a hop
            // limit in the wire format, which it does not have (docs/wire.md).
            self.counters.malformed += 1;
            return;
        }
        self.counters.forwarded += 1;
        self.out.push_back((next, data.to_vec()));
    }

    /// Forgets every pair idle for `pair_idle` at `now`, and plans the next sweep.
    fn sweep(&mut self, now: Timestamp) {
        let idle = self.config.pair_idle;
        let before = self.pairs.len();
        self.pairs.retain(|_, p| now < p.last_seen + idle);
        self.counters.expired += (before - self.pairs.len()) as u64;
        self.next_sweep = (!self.pairs.is_empty()).then(|| now + (idle / 4).max(SWEEP_MIN));
    }

    fn on_ack(&mut self, now: Timestamp, data: &[u8], packet: &Packet<'_>) {
        let Packet::Ack {
            header,
            initiator,
            responder,
        } = packet
        else {
            return;
        };
        if let Some(existing) = self.pairs.get(&header.pair_id) {
            // A retransmitted ACK of a pair we know: forward it if it is the same ACK.
            if existing.ack.as_slice() == data {
                self.forward(header.initiator, data);
            } else {
                self.counters.stale += 1;
            }
            return;
        }
        if !self.trusted(&initiator.public_key) || !self.trusted(&responder.public_key) {
            self.counters.untrusted += 1;
            return;
        }
        let initiator_key = PublicKey::from_bytes(initiator.public_key);
        let responder_key = PublicKey::from_bytes(responder.public_key);
        let provider = self.provider;
        if !initiator_key.verify(
            &provider,
            &syn_signed_bytes(header, initiator),
            initiator.signature,
        ) || !responder_key.verify(
            &provider,
            &ack_signed_bytes(header, initiator.signature, responder),
            responder.signature,
        ) {
            self.counters.forged += 1;
            return;
        }
        let max_rounds = self.config.max_rounds;
        let skip = self.config.max_skip_rounds;
        let control = |sig, ack| {
            let mut g = FlowGuard::new(Mode::N, false, 1, sig, max_rounds, skip)?;
            g.add_ack_chain(ack).then_some(g)
        };
        let (Some(from_initiator), Some(from_responder)) = (
            control(initiator.control_sig, responder.control_ack),
            control(responder.control_sig, initiator.control_ack),
        ) else {
            self.counters.malformed += 1;
            return;
        };
        if self.pairs.len() >= self.config.max_pairs.max(1) {
            // Bounded: the pair idle longest goes (a flood of new pairs displaces only pairs
            // quieter than itself).
            if let Some(oldest) = self
                .pairs
                .iter()
                .min_by_key(|(_, p)| p.last_used)
                .map(|(id, _)| *id)
            {
                self.pairs.remove(&oldest);
                self.counters.no_room += 1;
            }
        }
        self.use_clock += 1;
        self.pairs.insert(
            header.pair_id,
            RelayPair {
                initiator: header.initiator,
                responder: header.responder,
                initiator_key,
                responder_key,
                flows: BTreeMap::from([(0, from_initiator), (FLOW_FROM_RESPONDER, from_responder)]),
                last_used: self.use_clock,
                last_seen: now,
                ack_signature: responder.signature.to_vec(),
                ack: data.to_vec(),
                ackack: None,
                signed_seen: VecDeque::new(),
            },
        );
        if self.next_sweep.is_none() {
            self.next_sweep = Some(now + (self.config.pair_idle / 4).max(SWEEP_MIN));
        }
        self.events.push_back(RelayEvent::PairLearned {
            initiator: header.initiator,
            responder: header.responder,
        });
        self.forward(header.initiator, data);
    }

    fn on_ackack(&mut self, data: &[u8], header: &HandshakeHeader, signature: &[u8]) {
        let provider = self.provider;
        let Some(pair) = self.pairs.get_mut(&header.pair_id) else {
            self.counters.unknown += 1;
            return;
        };
        if pair.initiator != header.initiator || pair.responder != header.responder {
            self.counters.forged += 1;
            return;
        }
        let ok = match &pair.ackack {
            Some(known) => known.as_slice() == data,
            None => pair.initiator_key.verify(
                &provider,
                &ackack_signed_bytes(header, &pair.ack_signature),
                signature,
            ),
        };
        if !ok {
            self.counters.forged += 1;
            return;
        }
        pair.ackack = Some(data.to_vec());
        self.counters.verified += 1;
        let to = header.responder;
        self.forward(to, data);
    }

    /// A signed control message (a chain renewal): one signature check, then the same
    /// processing as a control message that arrived on the control association.
    fn on_signed(
        &mut self,
        data: &[u8],
        pair_id: PairId,
        from_responder: bool,
        message: &[u8],
        signature: &[u8],
    ) {
        let provider = self.provider;
        let Some(pair) = self.pairs.get_mut(&pair_id) else {
            self.counters.unknown += 1;
            return;
        };
        let (key, to, control_flow) = if from_responder {
            (pair.responder_key, pair.initiator, FLOW_FROM_RESPONDER)
        } else {
            (pair.initiator_key, pair.responder, 0)
        };
        let digest = provider.sha256.sha256(&[data]);
        if !pair.signed_seen.contains(&digest) {
            if !key.verify(
                &provider,
                &signed_envelope_bytes(&pair_id, from_responder, message),
                signature,
            ) {
                self.counters.forged += 1;
                return;
            }
            pair.signed_seen.push_back(digest);
            if pair.signed_seen.len() > 16 {
                pair.signed_seen.pop_front();
            }
        }
        self.counters.verified += 1;
        self.on_control(pair_id, control_flow, message);
        self.forward(to, data);
    }

    fn on_flow_packet(&mut self, now: Timestamp, data: &[u8], packet: &Packet<'_>) {
        let Some(header) = packet.flow_header().copied() else {
            return;
        };
        let provider = self.provider;
        let Some(pair) = self.pairs.get_mut(&header.pair_id) else {
            self.counters.unknown += 1;
            return;
        };
        let (sender, receiver) = pair.ends(header.flow);
        let Some(guard) = pair.flows.get_mut(&header.flow) else {
            self.counters.unknown += 1;
            return;
        };
        let (result, toward) = match packet {
            Packet::S1 {
                mode,
                element,
                count,
                macs,
                ..
            } => (
                guard
                    .on_s1(&provider, &header, *mode, element, *count, macs, now)
                    .map(|_| ()),
                receiver,
            ),
            Packet::A1 {
                element, report, ..
            } => (
                guard
                    .on_a1(&provider, &header, element, report.as_ref(), now)
                    .map(|_| ()),
                sender,
            ),
            Packet::S2 {
                index,
                key,
                path,
                payload,
                ..
            } => (
                guard.on_s2(&provider, &header, *index, key, path, payload),
                receiver,
            ),
            Packet::A2 {
                element,
                delivered,
                secret,
                ..
            } => (
                guard.on_a2(&provider, &header, element, *delivered, secret),
                sender,
            ),
            Packet::Plain { .. } => {
                if guard.mode() == Mode::Unprotected {
                    self.counters.unprotected += 1;
                    self.forward(receiver, data);
                } else {
                    self.counters.malformed += 1;
                }
                return;
            }
            _ => return,
        };
        // An S1 that differs from the one this hop holds for an acknowledged round is the
        // signer's, retransmitting because the A1 got lost on the way back (a forger's copy
        // got here first): send the A1 back toward it, so the flow moves on. The round's
        // messages die at the first hop that holds the forger's MACs; the next round is
        // clean. Throttled like any repeat.
        if let (Packet::S1 { element, .. }, Err(Refusal::Forged)) = (packet, &result) {
            if let Some((a1_element, report)) = guard.a1_to_resend(header.round, element, now) {
                let mut a1 = Vec::with_capacity(96);
                Packet::A1 {
                    header,
                    element: a1_element,
                    report,
                }
                .write(&mut a1);
                let next = self.config.next_hop(sender);
                self.out.push_back((next, a1));
            }
        }
        if result.is_ok() {
            self.use_clock += 1;
            if let Some(pair) = self.pairs.get_mut(&header.pair_id) {
                pair.last_used = self.use_clock;
                pair.last_seen = now;
            }
        }
        match result {
            Ok(()) => {
                self.counters.verified += 1;
                if let Packet::S2 { payload, .. } = packet {
                    if header.flow & MAX_ASSOC == 0 {
                        self.on_control(header.pair_id, header.flow, payload);
                    }
                }
                self.forward(toward, data);
            }
            Err(refusal) => self.counters.count_refusal(refusal),
        }
    }

    /// A verified control message: learn or forget flows and chains.
    fn on_control(&mut self, pair_id: PairId, control_flow: u16, bytes: &[u8]) {
        let Ok(message) = Control::parse(bytes) else {
            return;
        };
        let provider = self.provider;
        let max_rounds = self.config.max_rounds;
        let skip = self.config.max_skip_rounds;
        let Some(pair) = self.pairs.get_mut(&pair_id) else {
            return;
        };
        // The control flow a message came on says who sent it.
        let author = pair.sender_key(control_flow);
        let author_dir = control_flow & FLOW_FROM_RESPONDER;
        let signed = |m: &Control<'_>, signature: &[u8]| {
            author.verify(&provider, &control_signed_bytes(&pair_id, m), signature)
        };
        match &message {
            Control::Open {
                flow,
                mode,
                batch,
                reports,
                window,
                chain,
                signature,
            } => {
                if flow & FLOW_FROM_RESPONDER != author_dir || flow & MAX_ASSOC == 0 {
                    return;
                }
                if pair.flows.contains_key(flow) || !signed(&message, signature) {
                    return;
                }
                let Some(mode) = Mode::from_code(*mode, *batch) else {
                    return;
                };
                if let Some(g) = FlowGuard::new(mode, *reports, *window, *chain, max_rounds, skip) {
                    pair.flows.insert(*flow, g);
                }
            }
            Control::OpenAck {
                flow,
                chain,
                signature,
            } => {
                if flow & FLOW_FROM_RESPONDER == author_dir || !signed(&message, signature) {
                    return;
                }
                if let Some(g) = pair.flows.get_mut(flow) {
                    if g.mode() != Mode::Unprotected && !g.has_ack_chain() {
                        g.add_ack_chain(*chain);
                    }
                }
            }
            Control::Renew {
                flow,
                which,
                chain,
                signature,
            } => {
                // Signature chains are renewed by the flow's sender, ack chains by its
                // receiver.
                let by_sender = flow & FLOW_FROM_RESPONDER == author_dir;
                if (*which == 0) != by_sender || !signed(&message, signature) {
                    return;
                }
                if let Some(g) = pair.flows.get_mut(flow) {
                    if *which == 0 {
                        g.add_sig_chain(*chain);
                    } else {
                        g.add_ack_chain(*chain);
                    }
                }
            }
            Control::Close { flow } => {
                if flow & MAX_ASSOC != 0 {
                    pair.flows.remove(flow);
                }
            }
            Control::RenewAck { .. } | Control::CloseAck { .. } => {}
        }
    }
}

impl Machine for Relay {
    type Event = RelayEvent;

    fn handle_datagram(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        self.arrived_from = Some(from);
        let Ok(packet) = Packet::parse(data) else {
            self.counters.malformed += 1;
            return;
        };
        match &packet {
            // The return-routability exchange passes unchecked: a relay holds no state for it
            // and cannot check the responder's cookie, and verifying the SYN's signature for
            // anyone who asks would make the relay the cheapest target on the path. The
            // responder checks the cookie, then the signature; nothing is stored anywhere
            // before that.
            Packet::Hello(h) | Packet::Syn { header: h, .. } => {
                let to = h.responder;
                self.forward(to, data);
            }
            Packet::AckAck { header, signature } => self.on_ackack(data, header, signature),
            Packet::Signed {
                pair_id,
                from_responder,
                message,
                signature,
            } => self.on_signed(data, *pair_id, *from_responder, message, signature),
            Packet::Challenge { header, .. } => {
                let to = header.initiator;
                self.forward(to, data);
            }
            Packet::Ack { .. } => self.on_ack(now, data, &packet),
            _ => self.on_flow_packet(now, data, &packet),
        }
    }

    fn handle_timeout(&mut self, now: Timestamp) {
        if self.next_sweep.is_some_and(|t| now >= t) {
            self.sweep(now);
        }
    }

    fn poll_transmit(&mut self, _now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
        let (destination, packet) = self.out.pop_front()?;
        buf.extend_from_slice(&packet);
        Some(Transmit {
            destination,
            size: packet.len(),
        })
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        self.next_sweep
    }

    fn poll_event(&mut self) -> Option<RelayEvent> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Challenge (kind, pair id, initiator `initiator`, responder 10.0.0.2:7000, the rest):
    /// a relay forwards it without state to its initiator.
    fn challenge(initiator: SocketAddr) -> Vec<u8> {
        let SocketAddr::V4(v4) = initiator else {
            unreachable!("the tests use IPv4")
        };
        let mut c = vec![
            crate::wire::VERSION,
            0x02,
            0x9b,
            0x32,
            0x58,
            0x24,
            0x7b,
            0xaa,
            0xf7,
            0x21,
            0x04,
        ];
        c.extend_from_slice(&v4.ip().octets());
        c.extend_from_slice(&v4.port().to_be_bytes());
        c.extend_from_slice(&[0x04, 0x0a, 0x00, 0x00, 0x02, 0x1b, 0x58]);
        c.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0x03, 0xe8]);
        c.extend_from_slice(&[0x5a; 16]);
        c
    }

    fn relay(local: &str) -> Relay {
        Relay::new(
            RelayConfig::new(),
            CryptoProvider::default_provider(),
            local.parse().unwrap(),
        )
    }

    fn sent(relay: &mut Relay) -> Vec<SocketAddr> {
        let mut out = Vec::new();
        let mut buf = Vec::new();
        while let Some(t) = relay.poll_transmit(Timestamp::ZERO, &mut buf) {
            out.push(t.destination);
            buf.clear();
        }
        out
    }

    #[test]
    fn a_wildcard_bound_relay_stops_a_packet_that_comes_back_from_itself() {
        // Bound to 0.0.0.0:7000, the relay cannot tell that 10.0.0.3:7000 is itself: it
        // forwards the forged Challenge once ...
        let me: SocketAddr = "10.0.0.3:7000".parse().unwrap();
        let stranger: SocketAddr = "10.0.0.9:7000".parse().unwrap();
        let mut r = relay("0.0.0.0:7000");
        let c = challenge(me);
        assert!(
            matches!(Packet::parse(&c), Ok(Packet::Challenge { header, .. }) if header.initiator == me)
        );
        r.handle_datagram(Timestamp::ZERO, stranger, &c);
        assert_eq!(sent(&mut r), vec![me]);
        // ... and when it arrives from that address, it goes no further.
        r.handle_datagram(Timestamp::ZERO, me, &c);
        assert_eq!(sent(&mut r), Vec::<SocketAddr>::new());
        assert_eq!((r.counters().forwarded, r.counters().malformed), (1, 1));
    }

    #[test]
    fn a_relay_does_not_send_a_packet_back_to_its_sender() {
        // Two relays whose routes for an endpoint point at each other: R2 sent this
        // Challenge for 10.0.0.1:7000 to R1, whose route for it is R2.
        let r2: SocketAddr = "10.0.0.4:7000".parse().unwrap();
        let endpoint: SocketAddr = "10.0.0.1:7000".parse().unwrap();
        let mut config = RelayConfig::new();
        config.routes.push((endpoint, r2));
        let mut r1 = Relay::new(
            config,
            CryptoProvider::default_provider(),
            "10.0.0.3:7000".parse().unwrap(),
        );
        r1.handle_datagram(Timestamp::ZERO, r2, &challenge(endpoint));
        assert_eq!(sent(&mut r1), Vec::<SocketAddr>::new());
        assert_eq!(r1.counters().malformed, 1);
        // From anyone else it goes to R2, as the route says.
        r1.handle_datagram(
            Timestamp::ZERO,
            "10.0.0.2:7000".parse().unwrap(),
            &challenge(endpoint),
        );
        assert_eq!(sent(&mut r1), vec![r2]);
    }
}
