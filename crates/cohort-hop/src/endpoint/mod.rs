//! An ALPHA endpoint: handshakes with peers, opens associations, signs what it sends and
//! verifies what it receives.
//!
//! ```text
//!  connect ─▶ Hello ─▶ (Challenge) ─▶ SYN(signed anchors) ─▶ (ACK) ─▶ ACKACK   [initiator]
//!  Hello ─▶ Challenge(cookie, no state) ; SYN+cookie ─▶ state, ACK ; ACKACK  [responder]
//!  open(mode) ─▶ Open on the control flow ─▶ OpenAck ─▶ rounds (S1 A1 S2 [A2])
//!  send / send_any ─▶ association queue ─▶ rounds ─▶ scheduler ─▶ poll_transmit
//! ```
//!
//! # Call order
//! As for every [`Machine`]: after any input (`handle_datagram`, `handle_timeout`, or a
//! command: [`Endpoint::connect`], [`Endpoint::open`], [`Endpoint::send`],
//! [`Endpoint::send_any`], [`Endpoint::close`]) call `poll_transmit` until `None`, then
//! `poll_event` until `None`, then `poll_timeout`.
//!
//! # Scheduling
//! Handshake packets, acknowledgments and control-association packets go out first, ahead
//! of any bulk data (they are small and everything waits for them). Data associations with
//! packets ready take turns, one packet each (round robin), so one busy association cannot
//! starve another.
//!
//! # Files
//! This file owns the [`Endpoint`] struct (configuration, RNG, the peer table, events and
//! counters) and the [`Machine`] dispatch; it holds no protocol logic. Each concern is a file
//! of its own, and a datagram goes through them in one direction:
//!
//! ```text
//!  handle_datagram ─┬─ Hello, Challenge, SYN, ACK, ACKACK ─▶ handshake.rs ─┐
//!                   ├─ S1, S2, PLAIN, A1, A2 ─▶ receive.rs ─┐               │
//!                   └─ SIGNED ──────────────────────────────┴▶ control.rs ──┤
//!  commands.rs (connect, open, send*, close) ───────────────────────────────┤
//!  handle_timeout ─▶ timers.rs (resends, stalls, give-up) ──────────────────┤
//!                                                                           v
//!                 schedule.rs (pump rounds, collect what is ready, Outbox) ─▶ poll_transmit
//! ```
//!
//! `peer.rs` is the per-peer record they share and `status.rs` the read-only snapshots.
//! The one backoff rule of every resend is `crate::resend`.

mod commands;
mod control;
mod handshake;
mod peer;
mod receive;
mod schedule;
mod status;
mod timers;

pub use commands::HopError;
pub use status::{AssocStatus, EndpointStatus, PeerStatus};

use crate::config::EndpointConfig;
use crate::event::{AssocId, EndpointEvent, HopCounters};
use crate::wire::{Packet, PairId};
use cohort_core::{Machine, Timestamp, Transmit};
use cohort_crypto::CryptoProvider;
use handshake::Cookies;
use peer::{Peer, PeerState};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use schedule::Outbox;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::SocketAddr;

/// Largest message `send` accepts (an S2 with a full Merkle path still fits a datagram).
pub const MAX_MESSAGE: usize = 65_000;
/// Highest association id (15 bits; the top bit of a flow is the direction).
const MAX_ASSOC: AssocId = crate::wire::ASSOC_MASK;
/// The control association.
const CONTROL: AssocId = 0;

/// An ALPHA endpoint.
///
/// # Call order
/// After any input (`handle_datagram`, `handle_timeout`, or a command: [`Endpoint::connect`],
/// [`Endpoint::open`], [`Endpoint::send`], [`Endpoint::send_keyed`], [`Endpoint::send_any`],
/// [`Endpoint::close`]) call `poll_transmit` until `None`, then `poll_event` until `None`,
/// then `poll_timeout` (as for every [`Machine`]).
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub struct Endpoint {
    config: EndpointConfig,
    provider: CryptoProvider,
    local: SocketAddr,
    rng: ChaCha20Rng,
    /// The secret of the handshake's cookies.
    cookies: Cookies,
    peers: HashMap<SocketAddr, Peer>,
    by_pair: HashMap<PairId, SocketAddr>,
    /// What waits to be sent, in the scheduler's order.
    outbox: Outbox,
    events: VecDeque<EndpointEvent>,
    counters: HopCounters,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("local", &self.local)
            .field("peers", &self.peers.len())
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// An endpoint at overlay address `local`. All its randomness (pair ids, chain seeds,
    /// the cookie secret) comes from `rng_seed`.
    pub fn new(
        config: EndpointConfig,
        provider: CryptoProvider,
        local: SocketAddr,
        rng_seed: [u8; 32],
    ) -> Endpoint {
        let mut rng = ChaCha20Rng::from_seed(rng_seed);
        let cookies = Cookies::new(&mut rng);
        Endpoint {
            config,
            provider,
            local,
            rng,
            cookies,
            peers: HashMap::new(),
            by_pair: HashMap::new(),
            outbox: Outbox::default(),
            events: VecDeque::new(),
            counters: HopCounters::default(),
        }
    }

    // ---- getters ------------------------------------------------------------------------

    /// This endpoint's overlay address.
    pub fn local(&self) -> SocketAddr {
        self.local
    }

    /// Its counters.
    pub fn counters(&self) -> &HopCounters {
        &self.counters
    }

    /// Whether the handshake with `peer` has completed.
    pub fn is_connected(&self, peer: SocketAddr) -> bool {
        self.peers
            .get(&peer)
            .is_some_and(|p| p.state == PeerState::Established)
    }

    /// Open outgoing associations to `peer`.
    pub fn open_associations(&self, peer: SocketAddr) -> Vec<AssocId> {
        self.peers.get(&peer).map_or_else(Vec::new, |p| {
            p.out_flows
                .iter()
                .filter(|(&id, f)| id != CONTROL && f.open)
                .map(|(&id, _)| id)
                .collect()
        })
    }
}

impl Machine for Endpoint {
    type Event = EndpointEvent;

    fn handle_datagram(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        let Ok(packet) = Packet::parse(data) else {
            self.counters.malformed += 1;
            return;
        };
        match packet {
            Packet::Hello(header) => self.on_hello(now, from, header),
            Packet::Challenge {
                header,
                timestamp,
                cookie,
            } => self.on_challenge(now, header, timestamp, cookie),
            Packet::Syn {
                header,
                timestamp,
                cookie,
                initiator,
            } => self.on_syn(now, from, header, timestamp, cookie, initiator),
            Packet::Ack {
                header,
                initiator,
                responder,
            } => self.on_ack(now, header, initiator, responder),
            Packet::AckAck { header, signature } => self.on_ackack(header, signature),
            Packet::Signed {
                pair_id,
                from_responder,
                message,
                signature,
            } => self.on_signed(now, pair_id, from_responder, message, signature),
            other => self.on_flow_packet(now, other),
        }
    }

    fn handle_timeout(&mut self, now: Timestamp) {
        self.on_timeout(now);
    }

    fn poll_transmit(&mut self, _now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
        let (destination, packet) = self.next_packet()?;
        buf.extend_from_slice(&packet);
        Some(Transmit {
            destination,
            size: packet.len(),
        })
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        self.next_deadline()
    }

    fn poll_event(&mut self) -> Option<EndpointEvent> {
        self.events.pop_front()
    }
}
