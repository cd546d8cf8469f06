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

use crate::config::{EndpointConfig, Mode};
use crate::event::{AssocId, EndpointEvent, HopCounters};
use crate::flow::{OwnChain, Received, RecvFlow, SendFlow, SendTimeout};
use crate::guard::{FlowGuard, Refusal};
use crate::resend::{self, Resend};
use crate::wire::{
    ack_signed_bytes, ackack_signed_bytes, control_signed_bytes, signed_envelope_bytes,
    syn_signed_bytes, AnchorInfo, Control, FlowHeader, HandshakeHeader, Packet, PairId,
    SignedHello, COOKIE_LEN, FLOW_FROM_RESPONDER, PAIR_ID_LEN,
};
use cohort_channel::identity::PublicKey;
use cohort_core::{Machine, Timestamp, Transmit};
use cohort_crypto::{ct_eq, CryptoProvider};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;
use zeroize::Zeroize;

/// How long a cookie stays valid.
const COOKIE_LIFETIME: Duration = Duration::from_secs(10);
/// Largest message `send` accepts (an S2 with a full Merkle path still fits a datagram).
pub const MAX_MESSAGE: usize = 65_000;
/// Highest association id (15 bits; the top bit of a flow is the direction).
const MAX_ASSOC: AssocId = crate::wire::ASSOC_MASK;
/// The control association.
const CONTROL: AssocId = 0;

/// A command the endpoint refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HopError {
    /// No pair with that peer (call `connect` first).
    UnknownPeer,
    /// The handshake with that peer has not completed.
    NotConnected,
    /// No such association, or it is not open yet.
    NotOpen,
    /// The association's queue is full; the message was dropped.
    QueueFull,
    /// The message is longer than [`MAX_MESSAGE`].
    TooLarge,
    /// The mode's batch size is out of range.
    BadMode,
    /// Every association id is in use.
    TooManyAssociations,
}

impl fmt::Display for HopError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HopError::UnknownPeer => "no pair with that peer",
            HopError::NotConnected => "the handshake with that peer has not completed",
            HopError::NotOpen => "no such open association",
            HopError::QueueFull => "the association's queue is full",
            HopError::TooLarge => "message too large",
            HopError::BadMode => "mode batch size out of range",
            HopError::TooManyAssociations => "no association id left",
        })
    }
}

impl std::error::Error for HopError {}

/// Where a pair's handshake stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PeerState {
    /// Initiator: Hello sent, waiting for the Challenge.
    Hello,
    /// Initiator: SYN sent, waiting for the ACK.
    Syn,
    /// Responder: ACK sent, waiting for the ACKACK.
    AckSent,
    /// Both sides hold each other's signed anchors.
    Established,
    /// Gave up.
    Failed,
}

/// A control message waiting for the peer's answer.
struct PendingControl {
    /// What answers it: (answer code, flow, which chain, start round).
    answer: (u8, u16, u8, u32),
    bytes: Vec<u8>,
    resend: Resend,
    /// Sent as a signed packet rather than on the control association.
    signed: bool,
}

struct Peer {
    addr: SocketAddr,
    next_hop: SocketAddr,
    pair_id: PairId,
    initiator: bool,
    state: PeerState,
    key: Option<PublicKey>,
    /// The last handshake packet we sent, for retransmission (and our signed part).
    handshake: Vec<u8>,
    /// When it was last sent and how often again.
    handshake_resend: Resend,
    /// Our signature on the last handshake packet we signed (binds the next one).
    our_signature: Vec<u8>,
    /// Our control chains until the handshake completes: signature chain, ack chain.
    pending_control: Option<(OwnChain, OwnChain)>,
    out_flows: BTreeMap<AssocId, SendFlow>,
    in_flows: BTreeMap<AssocId, RecvFlow>,
    next_assoc: AssocId,
    controls: Vec<PendingControl>,
    /// The last Renew sent for each (flow, which chain): sent again when a flow stalls, in
    /// case a relay on the path missed it (a replayed copy may have reached the peer).
    renewals: HashMap<(u16, u8), Vec<u8>>,
    srtt: Option<Duration>,
}

impl Peer {
    fn my_dir(&self) -> u16 {
        if self.initiator {
            0
        } else {
            FLOW_FROM_RESPONDER
        }
    }

    fn their_dir(&self) -> u16 {
        self.my_dir() ^ FLOW_FROM_RESPONDER
    }

    fn rto(&self, initial: Duration) -> Duration {
        match self.srtt {
            Some(srtt) => (srtt * 3).clamp(Duration::from_millis(2), Duration::from_secs(2)),
            None => initial,
        }
    }

    fn header(&self, local: SocketAddr) -> HandshakeHeader {
        if self.initiator {
            HandshakeHeader {
                pair_id: self.pair_id,
                initiator: local,
                responder: self.addr,
            }
        } else {
            HandshakeHeader {
                pair_id: self.pair_id,
                initiator: self.addr,
                responder: local,
            }
        }
    }
}

/// A snapshot of one association, for `hop ctl` and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AssocStatus {
    /// The association id (0: control).
    pub id: AssocId,
    /// Whether we send on it.
    pub outgoing: bool,
    /// Its mode.
    pub mode: Mode,
    /// Whether it is open.
    pub open: bool,
    /// Rounds left on confirmed signature chains (outgoing only).
    pub rounds_left: u32,
    /// Elements left on the current chain (signature chain if outgoing, ack chain if not).
    pub elements_left: u32,
    /// Messages queued (outgoing only).
    pub queued: usize,
    /// Messages sent or received.
    pub messages: u64,
    /// Outgoing: the next round to start; incoming: the highest round seen.
    pub round: u32,
    /// Outgoing: the round whose S1 awaits its A1, and how often it was sent again.
    pub awaiting_ack: Option<(u32, u32)>,
}

/// A snapshot of one peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerStatus {
    /// The peer's overlay address.
    pub addr: SocketAddr,
    /// Where packets for it go first (itself or a relay).
    pub next_hop: SocketAddr,
    /// The pair id on the wire.
    pub pair_id: PairId,
    /// Whether we started the handshake.
    pub initiator: bool,
    /// Its key, once known.
    pub key: Option<PublicKey>,
    /// Handshake state, as a word.
    pub state: &'static str,
    /// Smoothed round-trip time of S1 to A1, if measured.
    pub srtt: Option<Duration>,
    /// Its associations.
    pub associations: Vec<AssocStatus>,
}

/// A snapshot of an endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointStatus {
    /// This endpoint's overlay address.
    pub local: SocketAddr,
    /// This endpoint's key.
    pub key: PublicKey,
    /// Its peers.
    pub peers: Vec<PeerStatus>,
    /// Its counters.
    pub counters: HopCounters,
}

/// An ALPHA endpoint.
///
/// # Call order
/// After any input (`handle_datagram`, `handle_timeout`, or a command: [`Endpoint::connect`],
/// [`Endpoint::open`], [`Endpoint::send`], [`Endpoint::send_keyed`], [`Endpoint::send_any`],
/// [`Endpoint::close`]) call `poll_transmit` until `None`, then `poll_event` until `None`,
/// then `poll_timeout` (as for every [`Machine`]).
pub struct Endpoint {
    config: EndpointConfig,
    provider: CryptoProvider,
    local: SocketAddr,
    rng: ChaCha20Rng,
    cookie_secret: [u8; 32],
    peers: HashMap<SocketAddr, Peer>,
    by_pair: HashMap<PairId, SocketAddr>,
    /// Handshake, acknowledgment and control packets: sent first.
    urgent: VecDeque<(SocketAddr, Vec<u8>)>,
    /// Data flows with packets ready, in round-robin order.
    active: VecDeque<(SocketAddr, AssocId)>,
    events: VecDeque<EndpointEvent>,
    counters: HopCounters,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.cookie_secret.zeroize();
    }
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
        let mut cookie_secret = [0u8; 32];
        rng.fill_bytes(&mut cookie_secret);
        Endpoint {
            config,
            provider,
            local,
            rng,
            cookie_secret,
            peers: HashMap::new(),
            by_pair: HashMap::new(),
            urgent: VecDeque::new(),
            active: VecDeque::new(),
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

    /// A snapshot of everything, for operators.
    pub fn status(&self) -> EndpointStatus {
        let mut peers: Vec<PeerStatus> = self
            .peers
            .values()
            .map(|p| {
                let mut associations: Vec<AssocStatus> = p
                    .out_flows
                    .iter()
                    .map(|(&id, f)| AssocStatus {
                        id,
                        outgoing: true,
                        mode: f.mode,
                        open: f.open,
                        rounds_left: f.rounds_left(),
                        elements_left: f.elements_left(),
                        queued: f.queue.len(),
                        messages: f.sent_messages,
                        round: f.next_round(),
                        awaiting_ack: f.awaiting_ack(),
                    })
                    .collect();
                associations.extend(p.in_flows.iter().map(|(&id, f)| AssocStatus {
                    id,
                    outgoing: false,
                    mode: f.mode,
                    open: true,
                    rounds_left: 0,
                    elements_left: f.elements_left(),
                    queued: 0,
                    messages: f.received_messages,
                    round: f.highest_round,
                    awaiting_ack: None,
                }));
                PeerStatus {
                    addr: p.addr,
                    next_hop: p.next_hop,
                    pair_id: p.pair_id,
                    initiator: p.initiator,
                    key: p.key,
                    state: match p.state {
                        PeerState::Hello => "hello-sent",
                        PeerState::Syn => "syn-sent",
                        PeerState::AckSent => "ack-sent",
                        PeerState::Established => "established",
                        PeerState::Failed => "failed",
                    },
                    srtt: p.srtt,
                    associations,
                }
            })
            .collect();
        peers.sort_by_key(|p| p.addr);
        EndpointStatus {
            local: self.local,
            key: self.config.identity.public(),
            peers,
            counters: self.counters,
        }
    }

    // ---- commands -----------------------------------------------------------------------

    /// Starts a handshake with `peer`, sending through `via` (the first relay) or directly.
    /// A pair that exists already is left alone unless it failed.
    pub fn connect(&mut self, now: Timestamp, peer: SocketAddr, via: Option<SocketAddr>) {
        if self
            .peers
            .get(&peer)
            .is_some_and(|p| p.state != PeerState::Failed)
        {
            return;
        }
        self.forget(peer);
        let mut pair_id = [0u8; PAIR_ID_LEN];
        self.rng.fill_bytes(&mut pair_id);
        let control = self.control_chains();
        let mut p = Peer {
            addr: peer,
            next_hop: via.unwrap_or(peer),
            pair_id,
            initiator: true,
            state: PeerState::Hello,
            key: None,
            handshake: Vec::new(),
            handshake_resend: Resend::new(now),
            our_signature: Vec::new(),
            pending_control: Some(control),
            out_flows: BTreeMap::new(),
            in_flows: BTreeMap::new(),
            next_assoc: 1,
            controls: Vec::new(),
            renewals: HashMap::new(),
            srtt: None,
        };
        Packet::Hello(p.header(self.local)).write(&mut p.handshake);
        self.urgent.push_back((p.next_hop, p.handshake.clone()));
        self.by_pair.insert(pair_id, peer);
        self.peers.insert(peer, p);
    }

    /// Opens an outgoing association to a connected `peer`. It is usable once the event
    /// [`EndpointEvent::Opened`] says so; messages sent before then wait in its queue.
    pub fn open(
        &mut self,
        now: Timestamp,
        peer: SocketAddr,
        mode: Mode,
    ) -> Result<AssocId, HopError> {
        if !mode.is_valid() {
            return Err(HopError::BadMode);
        }
        let chain = OwnChain::generate(
            &self.provider,
            &mut self.rng,
            self.config.chain_rounds,
            0,
            self.config.storage,
        );
        let p = self.peers.get_mut(&peer).ok_or(HopError::UnknownPeer)?;
        if p.state != PeerState::Established {
            return Err(HopError::NotConnected);
        }
        let assoc = (p.next_assoc..=MAX_ASSOC)
            .chain(1..p.next_assoc)
            .find(|a| !p.out_flows.contains_key(a))
            .ok_or(HopError::TooManyAssociations)?;
        p.next_assoc = if assoc == MAX_ASSOC { 1 } else { assoc + 1 };
        let flow = p.my_dir() | assoc;
        let reports = self.config.delivery_reports && mode != Mode::Unprotected;
        let mut send = SendFlow::new(
            flow,
            mode,
            reports,
            chain,
            self.config.max_rounds,
            self.config.max_skip_rounds,
        )
        .ok_or(HopError::BadMode)?;
        let anchor = send.first_anchor();
        send.confirm_renewal(anchor.start_round);
        p.out_flows.insert(assoc, send);
        let mut message = Control::Open {
            flow,
            mode: mode.code(),
            batch: mode.batch(),
            reports,
            chain: anchor,
            signature: &[],
        };
        let pair_id = p.pair_id;
        let signature = self.sign_control(&pair_id, &message);
        if let Control::Open { signature: s, .. } = &mut message {
            *s = &signature;
        }
        let mut bytes = Vec::new();
        message.write(&mut bytes);
        let answer = (crate::wire::control_code::OPEN_ACK, flow, 0, 0);
        self.send_control(now, peer, bytes, Some(answer));
        Ok(assoc)
    }

    /// Queues `data` on an outgoing association.
    pub fn send(
        &mut self,
        now: Timestamp,
        peer: SocketAddr,
        assoc: AssocId,
        data: &[u8],
    ) -> Result<(), HopError> {
        if data.len() > MAX_MESSAGE {
            return Err(HopError::TooLarge);
        }
        let p = self.peers.get_mut(&peer).ok_or(HopError::UnknownPeer)?;
        let flow = p
            .out_flows
            .get_mut(&assoc)
            .filter(|_| assoc != CONTROL)
            .ok_or(HopError::NotOpen)?;
        if !flow.push(data, self.config.max_queue) {
            self.counters.queue_full += 1;
            return Err(HopError::QueueFull);
        }
        self.pump(now, peer, assoc);
        Ok(())
    }

    /// Queues `data` on the open outgoing association to `peer` with the shortest queue.
    pub fn send_any(
        &mut self,
        now: Timestamp,
        peer: SocketAddr,
        data: &[u8],
    ) -> Result<(), HopError> {
        let p = self.peers.get(&peer).ok_or(HopError::UnknownPeer)?;
        let assoc = p
            .out_flows
            .iter()
            .filter(|(&id, f)| id != CONTROL && f.open)
            .min_by_key(|(&id, f)| (f.queue.len() + usize::from(!f.is_idle()), id))
            .map(|(&id, _)| id)
            .ok_or(HopError::NotOpen)?;
        self.send(now, peer, assoc, data)
    }

    /// Queues `data` on one of the open outgoing associations to `peer`, chosen by `key`:
    /// messages with the same key always take the same association, so they stay in order
    /// (rounds of different associations complete independently). A tunnel passes a hash of
    /// each packet's connection (addresses, protocol, ports), so one TCP connection is never
    /// reordered while several spread over the associations.
    pub fn send_keyed(
        &mut self,
        now: Timestamp,
        peer: SocketAddr,
        key: u64,
        data: &[u8],
    ) -> Result<(), HopError> {
        let p = self.peers.get(&peer).ok_or(HopError::UnknownPeer)?;
        let open: Vec<AssocId> = p
            .out_flows
            .iter()
            .filter(|(&id, f)| id != CONTROL && f.open)
            .map(|(&id, _)| id)
            .collect();
        if open.is_empty() {
            return Err(HopError::NotOpen);
        }
        let pick = open[(key % open.len() as u64) as usize];
        self.send(now, peer, pick, data)
    }

    /// Closes an association (ours or the peer's); the peer is told.
    pub fn close(&mut self, now: Timestamp, peer: SocketAddr, assoc: AssocId, outgoing: bool) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        if assoc == CONTROL {
            return;
        }
        let flow = if outgoing {
            p.out_flows.remove(&assoc);
            p.my_dir() | assoc
        } else {
            p.in_flows.remove(&assoc);
            p.their_dir() | assoc
        };
        self.events.push_back(EndpointEvent::Closed {
            peer,
            assoc,
            outgoing,
        });
        let mut bytes = Vec::new();
        Control::Close { flow }.write(&mut bytes);
        let answer = (crate::wire::control_code::CLOSE_ACK, flow, 0, 0);
        self.send_control(now, peer, bytes, Some(answer));
    }

    // ---- internals: handshake -----------------------------------------------------------

    fn control_chains(&mut self) -> (OwnChain, OwnChain) {
        let sig = OwnChain::generate(
            &self.provider,
            &mut self.rng,
            self.config.chain_rounds,
            0,
            self.config.storage,
        );
        let ack = OwnChain::generate(
            &self.provider,
            &mut self.rng,
            self.config.chain_rounds,
            0,
            self.config.storage,
        );
        (sig, ack)
    }

    fn forget(&mut self, peer: SocketAddr) {
        if let Some(p) = self.peers.remove(&peer) {
            self.by_pair.remove(&p.pair_id);
            self.active.retain(|(a, _)| *a != peer);
        }
    }

    fn trusted(&self, key: &[u8; 32]) -> bool {
        crate::config::trusted(&self.config.trust, key)
    }

    fn cookie(
        &self,
        header: &HandshakeHeader,
        from: SocketAddr,
        timestamp: u64,
    ) -> [u8; COOKIE_LEN] {
        let mut text = Vec::with_capacity(96);
        let mut raw = Vec::new();
        Packet::Hello(*header).write(&mut raw);
        text.extend_from_slice(&raw[2..]);
        text.extend_from_slice(from.to_string().as_bytes());
        text.extend_from_slice(&timestamp.to_be_bytes());
        let mut out = [0u8; COOKIE_LEN];
        self.provider.keyed_blake3.hash(
            &self.cookie_secret,
            &[b"cohort-hop v1 cookie", &text],
            &mut out,
        );
        out
    }

    fn sign(&self, message: &[u8]) -> Vec<u8> {
        sign_with(&self.config, &self.provider, message)
    }

    fn sign_control(&self, pair_id: &PairId, message: &Control<'_>) -> Vec<u8> {
        self.sign(&control_signed_bytes(pair_id, message))
    }

    fn signed_hello(&self, sig: &AnchorInfo, ack: &AnchorInfo) -> SignedHello<'static> {
        SignedHello {
            public_key: *self.config.identity.public().as_bytes(),
            control_sig: *sig,
            control_ack: *ack,
            signature: &[],
        }
    }

    fn on_hello(&mut self, now: Timestamp, from: SocketAddr, header: HandshakeHeader) {
        let timestamp = now.as_nanos() / 1_000_000;
        let cookie = self.cookie(&header, from, timestamp);
        let mut out = Vec::with_capacity(64);
        Packet::Challenge {
            header,
            timestamp,
            cookie,
        }
        .write(&mut out);
        self.urgent.push_back((from, out));
    }

    fn on_challenge(
        &mut self,
        now: Timestamp,
        header: HandshakeHeader,
        timestamp: u64,
        cookie: [u8; COOKIE_LEN],
    ) {
        let Some(addr) = self.by_pair.get(&header.pair_id).copied() else {
            self.counters.unknown += 1;
            return;
        };
        let local = self.local;
        let Some(p) = self.peers.get(&addr) else {
            return;
        };
        if p.state != PeerState::Hello || p.header(local) != header {
            self.counters.stale += 1;
            return;
        }
        let Some((sig, ack)) = p.pending_control.as_ref().map(|(s, a)| (s.info, a.info)) else {
            return;
        };
        let part = self.signed_hello(&sig, &ack);
        let signature = self.sign(&syn_signed_bytes(&header, &part));
        let mut out = Vec::with_capacity(300);
        Packet::Syn {
            header,
            timestamp,
            cookie,
            initiator: SignedHello {
                signature: &signature,
                ..part
            },
        }
        .write(&mut out);
        let Some(p) = self.peers.get_mut(&addr) else {
            return;
        };
        p.state = PeerState::Syn;
        p.handshake = out.clone();
        p.handshake_resend = Resend::new(now);
        p.our_signature = signature;
        self.urgent.push_back((p.next_hop, out));
    }

    fn on_syn(
        &mut self,
        now: Timestamp,
        from: SocketAddr,
        header: HandshakeHeader,
        timestamp: u64,
        cookie: [u8; COOKIE_LEN],
        initiator: SignedHello<'_>,
    ) {
        // Cheap checks first: the cookie proves the initiator saw our Challenge at `from`.
        let now_ms = now.as_nanos() / 1_000_000;
        let fresh = timestamp <= now_ms && now_ms - timestamp <= COOKIE_LIFETIME.as_millis() as u64;
        if !fresh || !ct_eq(&self.cookie(&header, from, timestamp), &cookie) {
            self.counters.bad_cookie += 1;
            return;
        }
        // A retransmitted SYN of a pair we hold: answer with the same ACK.
        if let Some(p) = self
            .by_pair
            .get(&header.pair_id)
            .and_then(|a| self.peers.get(a))
        {
            if !p.initiator && p.addr == header.initiator {
                if p.state == PeerState::AckSent || p.state == PeerState::Established {
                    self.urgent.push_back((p.next_hop, p.handshake.clone()));
                }
            } else {
                self.counters.stale += 1;
            }
            return;
        }
        if !self.trusted(&initiator.public_key) {
            self.counters.untrusted += 1;
            return;
        }
        let key = PublicKey::from_bytes(initiator.public_key);
        if !key.verify(
            &self.provider,
            &syn_signed_bytes(&header, &initiator),
            initiator.signature,
        ) {
            self.counters.forged += 1;
            return;
        }
        // Simultaneous open: both sides connected to each other. The side with the lower
        // address stays initiator; the other gives up its own attempt.
        if let Some(existing) = self.peers.get(&header.initiator) {
            let ours_wins = existing.initiator
                && existing.state != PeerState::Established
                && existing.state != PeerState::Failed
                && self.local < header.initiator;
            if ours_wins {
                self.counters.stale += 1;
                return;
            }
        }
        if !self.peers.contains_key(&header.initiator) && self.peers.len() >= self.config.max_peers
        {
            self.counters.no_room += 1;
            return;
        }
        let was_connected = self.is_connected(header.initiator);
        self.forget(header.initiator);
        let (my_sig, my_ack) = self.control_chains();
        let part = self.signed_hello(&my_sig.info, &my_ack.info);
        let signature = self.sign(&ack_signed_bytes(&header, initiator.signature, &part));
        let mut ack = Vec::with_capacity(400);
        Packet::Ack {
            header,
            initiator,
            responder: SignedHello {
                signature: &signature,
                ..part
            },
        }
        .write(&mut ack);
        let mut p = Peer {
            addr: header.initiator,
            next_hop: from,
            pair_id: header.pair_id,
            initiator: false,
            state: PeerState::AckSent,
            key: Some(key),
            handshake: ack.clone(),
            handshake_resend: Resend::new(now),
            our_signature: signature,
            pending_control: None,
            out_flows: BTreeMap::new(),
            in_flows: BTreeMap::new(),
            next_assoc: 1,
            controls: Vec::new(),
            renewals: HashMap::new(),
            srtt: None,
        };
        if !self.install_control(
            &mut p,
            my_sig,
            my_ack,
            initiator.control_sig,
            initiator.control_ack,
        ) {
            self.counters.malformed += 1;
            return;
        }
        if was_connected {
            // The peer restarted: everything we had with it is gone.
            self.events.push_back(EndpointEvent::ConnectFailed {
                peer: header.initiator,
                reason: "peer restarted",
            });
        }
        self.urgent.push_back((from, ack));
        self.by_pair.insert(header.pair_id, header.initiator);
        self.peers.insert(header.initiator, p);
    }

    /// Sets up both control flows from our chains and the peer's anchors.
    fn install_control(
        &mut self,
        p: &mut Peer,
        my_sig: OwnChain,
        my_ack: OwnChain,
        their_sig: AnchorInfo,
        their_ack: AnchorInfo,
    ) -> bool {
        let mut my_sig = my_sig;
        my_sig.confirmed = true;
        let Some(mut send) = SendFlow::new(
            p.my_dir(),
            Mode::N,
            false,
            my_sig,
            self.config.max_rounds,
            self.config.max_skip_rounds,
        ) else {
            return false;
        };
        if !send.guard.add_ack_chain(their_ack) {
            return false;
        }
        send.open = true;
        let Some(guard) = FlowGuard::new(
            Mode::N,
            false,
            their_sig,
            self.config.max_rounds,
            self.config.max_skip_rounds,
        ) else {
            return false;
        };
        let Some(recv) = RecvFlow::new(p.their_dir(), guard, my_ack, &mut self.rng) else {
            return false;
        };
        p.out_flows.insert(CONTROL, send);
        p.in_flows.insert(CONTROL, recv);
        true
    }

    fn on_ack(
        &mut self,
        now: Timestamp,
        header: HandshakeHeader,
        initiator: SignedHello<'_>,
        responder: SignedHello<'_>,
    ) {
        let Some(addr) = self.by_pair.get(&header.pair_id).copied() else {
            self.counters.unknown += 1;
            return;
        };
        let local = self.local;
        let Some(p) = self.peers.get(&addr) else {
            return;
        };
        if !p.initiator || p.header(local) != header {
            self.counters.stale += 1;
            return;
        }
        if p.state == PeerState::Established {
            // Our ACKACK was lost: send it again.
            if p.key.is_some_and(|k| k.as_bytes() == &responder.public_key) {
                self.urgent.push_back((p.next_hop, p.handshake.clone()));
            } else {
                self.counters.stale += 1;
            }
            return;
        }
        if p.state != PeerState::Syn {
            self.counters.stale += 1;
            return;
        }
        // The echo must be exactly what we signed.
        if initiator.signature != p.our_signature.as_slice()
            || initiator.public_key != *self.config.identity.public().as_bytes()
        {
            self.counters.forged += 1;
            return;
        }
        if !self.trusted(&responder.public_key) {
            // Dropped, not fatal: anybody who saw our SYN can answer it with a key of its
            // own; the real ACK may still come (if none does, the handshake times out).
            self.counters.untrusted += 1;
            return;
        }
        let key = PublicKey::from_bytes(responder.public_key);
        if !key.verify(
            &self.provider,
            &ack_signed_bytes(&header, initiator.signature, &responder),
            responder.signature,
        ) {
            self.counters.forged += 1;
            return;
        }
        let signature = self.sign(&ackack_signed_bytes(&header, responder.signature));
        let mut out = Vec::with_capacity(128);
        Packet::AckAck {
            header,
            signature: &signature,
        }
        .write(&mut out);
        let Some(mut p) = self.peers.remove(&addr) else {
            return;
        };
        let Some((my_sig, my_ack)) = p.pending_control.take() else {
            self.peers.insert(addr, p);
            return;
        };
        if !self.install_control(
            &mut p,
            my_sig,
            my_ack,
            responder.control_sig,
            responder.control_ack,
        ) {
            self.counters.malformed += 1;
            p.state = PeerState::Failed;
            self.peers.insert(addr, p);
            return;
        }
        p.state = PeerState::Established;
        p.key = Some(key);
        p.handshake = out.clone();
        p.handshake_resend.sent_at = now;
        self.urgent.push_back((p.next_hop, out));
        self.peers.insert(addr, p);
        self.events
            .push_back(EndpointEvent::Connected { peer: addr, key });
    }

    fn on_ackack(&mut self, header: HandshakeHeader, signature: &[u8]) {
        let Some(addr) = self.by_pair.get(&header.pair_id).copied() else {
            self.counters.unknown += 1;
            return;
        };
        let local = self.local;
        let provider = self.provider;
        let Some(p) = self.peers.get_mut(&addr) else {
            return;
        };
        if p.initiator || p.header(local) != header {
            self.counters.stale += 1;
            return;
        }
        if p.state != PeerState::AckSent {
            return; // a repeat
        }
        let Some(key) = p.key else {
            return;
        };
        let Some(Packet::Ack {
            responder: ours, ..
        }) = Packet::parse(&p.handshake).ok()
        else {
            return;
        };
        if !key.verify(
            &provider,
            &ackack_signed_bytes(&header, ours.signature),
            signature,
        ) {
            self.counters.forged += 1;
            return;
        }
        p.state = PeerState::Established;
        self.events
            .push_back(EndpointEvent::Connected { peer: addr, key });
    }

    fn fail(&mut self, peer: SocketAddr, reason: &'static str) {
        if let Some(p) = self.peers.get_mut(&peer) {
            p.state = PeerState::Failed;
            p.out_flows.clear();
            p.in_flows.clear();
            p.controls.clear();
            self.events
                .push_back(EndpointEvent::ConnectFailed { peer, reason });
        }
    }

    // ---- internals: data ----------------------------------------------------------------

    fn on_flow_packet(&mut self, now: Timestamp, packet: Packet<'_>) {
        let Some(header) = packet.flow_header().copied() else {
            return;
        };
        let Some(addr) = self.by_pair.get(&header.pair_id).copied() else {
            self.counters.unknown += 1;
            return;
        };
        let provider = self.provider;
        let Some(p) = self.peers.get_mut(&addr) else {
            self.counters.unknown += 1;
            return;
        };
        let dir = header.flow & FLOW_FROM_RESPONDER;
        let assoc = header.flow & MAX_ASSOC;
        let theirs = dir == p.their_dir();
        let result = match packet {
            Packet::S1 {
                mode,
                element,
                count,
                macs,
                ..
            } if theirs => match p.in_flows.get_mut(&assoc) {
                Some(f) => {
                    let repeated = f.repeated_s1;
                    let r = f.on_s1(&provider, &header, mode, &element, count, macs, now);
                    if f.repeated_s1 > repeated && f.repeated_s1 % 2 == 0 {
                        // Our A1s for this flow are not getting through: maybe a relay
                        // never saw our latest ack chain.
                        if let Some(renew) = p.renewals.get(&(header.flow, 1)) {
                            let packet = envelope(&self.config, &provider, p, renew);
                            self.urgent.push_back((p.next_hop, packet));
                        }
                    }
                    if r.is_ok() && assoc == CONTROL && p.state == PeerState::AckSent {
                        // Only the initiator, holding our ACK, can run its control chain:
                        // the handshake is complete even if its ACKACK was lost.
                        p.state = PeerState::Established;
                        if let Some(key) = p.key {
                            self.events
                                .push_back(EndpointEvent::Connected { peer: addr, key });
                        }
                    }
                    r.map(|()| Received::Nothing)
                }
                None => Err(Refusal::Unknown),
            },
            Packet::S2 {
                index,
                key,
                path,
                payload,
                ..
            } if theirs => match p.in_flows.get_mut(&assoc) {
                Some(f) => f.on_s2(&provider, &header, index, &key, path, payload),
                None => Err(Refusal::Unknown),
            },
            Packet::Plain { payload, .. } if theirs => match p.in_flows.get_mut(&assoc) {
                Some(f) if f.mode == Mode::Unprotected => Ok(f.on_plain(payload)),
                _ => Err(Refusal::Stale),
            },
            Packet::A1 {
                element, report, ..
            } if !theirs => match p.out_flows.get_mut(&assoc) {
                Some(f) => match f.on_a1(&provider, &header, &element, report.as_ref(), now) {
                    Ok(sample) => {
                        if let Some(sample) = sample {
                            p.srtt = Some(match p.srtt {
                                Some(s) => (s * 7 + sample) / 8,
                                None => sample,
                            });
                        }
                        Ok(Received::Nothing)
                    }
                    Err(e) => Err(e),
                },
                None => Err(Refusal::Unknown),
            },
            Packet::A2 {
                element,
                delivered,
                secret,
                ..
            } if !theirs => match p.out_flows.get_mut(&assoc) {
                Some(f) => match f.on_a2(&provider, &header, &element, delivered, &secret) {
                    Ok(delivered) => {
                        self.events.push_back(EndpointEvent::Report {
                            peer: addr,
                            assoc,
                            round: header.round,
                            delivered,
                        });
                        Ok(Received::Nothing)
                    }
                    Err(e) => Err(e),
                },
                None => Err(Refusal::Unknown),
            },
            _ => Err(Refusal::Malformed),
        };
        match result {
            Ok(received) => {
                self.counters.verified += 1;
                if let Received::Message(data) = received {
                    if assoc == CONTROL {
                        self.on_control(now, addr, &data);
                        // A control message may have opened a flow or confirmed a chain
                        // that messages were waiting for.
                        self.pump_all(now, addr);
                    } else {
                        if matches!(packet_kind(&header, p), Some(Mode::Unprotected)) {
                            self.counters.unprotected += 1;
                        }
                        self.counters.delivered += 1;
                        self.events.push_back(EndpointEvent::Received {
                            peer: addr,
                            assoc,
                            data,
                        });
                    }
                }
            }
            Err(refusal) => count_refusal(&mut self.counters, refusal),
        }
        self.pump(now, addr, assoc);
        self.collect_ready(addr);
    }

    fn on_control(&mut self, now: Timestamp, peer: SocketAddr, bytes: &[u8]) {
        let Ok(message) = Control::parse(bytes) else {
            self.counters.malformed += 1;
            return;
        };
        let provider = self.provider;
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        let Some(key) = p.key else {
            return;
        };
        let signed_ok = |m: &Control<'_>, signature: &[u8]| {
            key.verify(&provider, &control_signed_bytes(&p.pair_id, m), signature)
        };
        use crate::wire::control_code as cc;
        let mut reply: Option<Vec<u8>> = None;
        let mut answered: Option<(u8, u16, u8, u32)> = None;
        match message {
            Control::Open {
                flow,
                mode,
                batch,
                reports,
                chain,
                signature,
            } => {
                if flow & FLOW_FROM_RESPONDER != p.their_dir() || flow & MAX_ASSOC == CONTROL {
                    self.counters.malformed += 1;
                    return;
                }
                if !signed_ok(&message, signature) {
                    self.counters.forged += 1;
                    return;
                }
                let Some(mode) = Mode::from_code(mode, batch) else {
                    self.counters.malformed += 1;
                    return;
                };
                let assoc = flow & MAX_ASSOC;
                let ack_anchor = match p.in_flows.get(&assoc) {
                    // A retransmitted Open: answer again with the same chain.
                    Some(existing) if existing.guard.mode() == mode => existing.first_ack_anchor(),
                    _ => {
                        let Some(guard) = FlowGuard::new(
                            mode,
                            reports,
                            chain,
                            self.config.max_rounds,
                            self.config.max_skip_rounds,
                        ) else {
                            self.counters.malformed += 1;
                            return;
                        };
                        let ack_chain = OwnChain::generate(
                            &provider,
                            &mut self.rng,
                            self.config.chain_rounds,
                            0,
                            self.config.storage,
                        );
                        let Some(recv) = RecvFlow::new(flow, guard, ack_chain, &mut self.rng)
                        else {
                            self.counters.malformed += 1;
                            return;
                        };
                        let anchor = recv.first_ack_anchor();
                        p.in_flows.insert(assoc, recv);
                        self.events.push_back(EndpointEvent::Opened {
                            peer,
                            assoc,
                            outgoing: false,
                            mode,
                        });
                        anchor
                    }
                };
                let mut m = Control::OpenAck {
                    flow,
                    chain: ack_anchor,
                    signature: &[],
                };
                let sig = sign_with(
                    &self.config,
                    &provider,
                    &control_signed_bytes(&p.pair_id, &m),
                );
                if let Control::OpenAck { signature, .. } = &mut m {
                    *signature = &sig;
                }
                let mut out = Vec::new();
                m.write(&mut out);
                reply = Some(out);
            }
            Control::OpenAck {
                flow,
                chain,
                signature,
            } => {
                if !signed_ok(&message, signature) {
                    self.counters.forged += 1;
                    return;
                }
                let assoc = flow & MAX_ASSOC;
                if flow & FLOW_FROM_RESPONDER == p.my_dir() {
                    if let Some(f) = p.out_flows.get_mut(&assoc) {
                        if !f.open && (f.mode == Mode::Unprotected || f.guard.add_ack_chain(chain))
                        {
                            f.open = true;
                            self.events.push_back(EndpointEvent::Opened {
                                peer,
                                assoc,
                                outgoing: true,
                                mode: f.mode,
                            });
                        }
                    }
                }
                answered = Some((cc::OPEN_ACK, flow, 0, 0));
            }
            Control::Renew {
                flow,
                which,
                chain,
                signature,
            } => {
                if !signed_ok(&message, signature) {
                    self.counters.forged += 1;
                    return;
                }
                let assoc = flow & MAX_ASSOC;
                let ours = flow & FLOW_FROM_RESPONDER == p.my_dir();
                let ok = match (which, ours) {
                    // The peer renews its signature chain of its flow.
                    (0, false) => p
                        .in_flows
                        .get_mut(&assoc)
                        .is_some_and(|f| f.guard.add_sig_chain(chain)),
                    // The peer renews its ack chain for our flow.
                    (1, true) => p
                        .out_flows
                        .get_mut(&assoc)
                        .is_some_and(|f| f.guard.add_ack_chain(chain)),
                    _ => false,
                };
                if ok {
                    let mut out = Vec::new();
                    Control::RenewAck {
                        flow,
                        which,
                        start_round: chain.start_round,
                    }
                    .write(&mut out);
                    reply = Some(out);
                } else {
                    self.counters.stale += 1;
                }
            }
            Control::RenewAck {
                flow,
                which,
                start_round,
            } => {
                let assoc = flow & MAX_ASSOC;
                let ours = flow & FLOW_FROM_RESPONDER == p.my_dir();
                match (which, ours) {
                    (0, true) => {
                        if let Some(f) = p.out_flows.get_mut(&assoc) {
                            if f.confirm_renewal(start_round) {
                                self.events.push_back(EndpointEvent::Renewed {
                                    peer,
                                    assoc,
                                    outgoing: true,
                                });
                            }
                        }
                    }
                    (1, false) => {
                        if let Some(f) = p.in_flows.get_mut(&assoc) {
                            if f.renewing {
                                f.renewing = false;
                                self.events.push_back(EndpointEvent::Renewed {
                                    peer,
                                    assoc,
                                    outgoing: false,
                                });
                            }
                        }
                    }
                    _ => {}
                }
                answered = Some((cc::RENEW_ACK, flow, which, start_round));
            }
            Control::Close { flow } => {
                let assoc = flow & MAX_ASSOC;
                let ours = flow & FLOW_FROM_RESPONDER == p.my_dir();
                let removed = if ours {
                    p.out_flows.remove(&assoc).is_some()
                } else {
                    p.in_flows.remove(&assoc).is_some()
                };
                if removed && assoc != CONTROL {
                    self.events.push_back(EndpointEvent::Closed {
                        peer,
                        assoc,
                        outgoing: ours,
                    });
                }
                let mut out = Vec::new();
                Control::CloseAck { flow }.write(&mut out);
                reply = Some(out);
            }
            Control::CloseAck { flow } => {
                answered = Some((cc::CLOSE_ACK, flow, 0, 0));
            }
        }
        if let Some(answer) = answered {
            p.controls.retain(|c| c.answer != answer);
        }
        if let Some(bytes) = reply {
            self.send_control(now, peer, bytes, None);
        }
    }

    /// Queues a control message on our control flow; `answer` says what reply ends its
    /// retransmissions (none for replies themselves).
    fn send_control(
        &mut self,
        now: Timestamp,
        peer: SocketAddr,
        bytes: Vec<u8>,
        answer: Option<(u8, u16, u8, u32)>,
    ) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        let Some(control) = p.out_flows.get_mut(&CONTROL) else {
            return;
        };
        // Renewals travel signed, outside the control association: renewing the control
        // association's own chains through itself could deadlock once both ran out.
        let signed = matches!(
            bytes.first(),
            Some(&(crate::wire::control_code::RENEW | crate::wire::control_code::RENEW_ACK))
        );
        if signed {
            let envelope = envelope(&self.config, &self.provider, p, &bytes);
            self.urgent.push_back((p.next_hop, envelope));
        } else {
            // Control messages are few; the queue bound is for data.
            control.queue.push_back(bytes.clone());
        }
        if let Some(answer) = answer {
            p.controls.push(PendingControl {
                answer,
                bytes,
                resend: Resend::new(now),
                signed,
            });
        }
        self.pump(now, peer, CONTROL);
        self.collect_ready(peer);
    }

    fn on_signed(
        &mut self,
        now: Timestamp,
        pair_id: PairId,
        from_responder: bool,
        message: &[u8],
        signature: &[u8],
    ) {
        let Some(addr) = self.by_pair.get(&pair_id).copied() else {
            self.counters.unknown += 1;
            return;
        };
        let Some(p) = self.peers.get(&addr) else {
            return;
        };
        let their_dir_is_responder = p.their_dir() == FLOW_FROM_RESPONDER;
        let Some(key) = p.key.filter(|_| p.state == PeerState::Established) else {
            self.counters.unverifiable += 1;
            return;
        };
        if from_responder != their_dir_is_responder
            || !key.verify(
                &self.provider,
                &signed_envelope_bytes(&pair_id, from_responder, message),
                signature,
            )
        {
            self.counters.forged += 1;
            return;
        }
        self.counters.verified += 1;
        self.on_control(now, addr, message);
        self.pump_all(now, addr);
    }

    /// Starts rounds where possible, and renews chains that are running out.
    fn pump(&mut self, now: Timestamp, peer: SocketAddr, assoc: AssocId) {
        let provider = self.provider;
        let margin = (self.config.chain_rounds / 4).max(2);
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        if p.state != PeerState::Established && p.state != PeerState::AckSent {
            return;
        }
        let pair_id = p.pair_id;
        let mut renewals: Vec<(u16, u8, u32)> = Vec::new();
        if let Some(f) = p.out_flows.get_mut(&assoc) {
            if let Some(start) = f.wants_renewal(margin) {
                renewals.push((f.flow, 0, start));
            }
            let started = f.pump(&provider, &pair_id, now);
            if started
                && assoc != CONTROL
                && !f.ready.is_empty()
                && !self.active.contains(&(peer, assoc))
            {
                self.active.push_back((peer, assoc));
            }
        }
        if let Some(f) = p.in_flows.get(&assoc) {
            if let Some(start) = f.wants_renewal(margin) {
                renewals.push((f.flow, 1, start));
            }
        }
        for (flow, which, start) in renewals {
            self.renew(now, peer, flow, which, start);
        }
    }

    /// [`Endpoint::pump`] for every association of `peer`, then collects what is ready.
    fn pump_all(&mut self, now: Timestamp, peer: SocketAddr) {
        let assocs: Vec<AssocId> = self
            .peers
            .get(&peer)
            .map(|p| {
                p.out_flows
                    .keys()
                    .chain(p.in_flows.keys())
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        for assoc in assocs {
            self.pump(now, peer, assoc);
        }
        self.collect_ready(peer);
    }

    fn renew(&mut self, now: Timestamp, peer: SocketAddr, flow: u16, which: u8, start: u32) {
        let chain = OwnChain::generate(
            &self.provider,
            &mut self.rng,
            self.config.chain_rounds,
            start,
            self.config.storage,
        );
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        let assoc = flow & MAX_ASSOC;
        let info = chain.info;
        match which {
            0 => match p.out_flows.get_mut(&assoc) {
                Some(f) => f.push_renewal(chain),
                None => return,
            },
            _ => match p.in_flows.get_mut(&assoc) {
                Some(f) => f.push_renewal(chain),
                None => return,
            },
        }
        let mut m = Control::Renew {
            flow,
            which,
            chain: info,
            signature: &[],
        };
        let pair_id = p.pair_id;
        let sig = sign_with(
            &self.config,
            &self.provider,
            &control_signed_bytes(&pair_id, &m),
        );
        if let Control::Renew { signature, .. } = &mut m {
            *signature = &sig;
        }
        let mut bytes = Vec::new();
        m.write(&mut bytes);
        p.renewals.insert((flow, which), bytes.clone());
        let answer = (crate::wire::control_code::RENEW_ACK, flow, which, start);
        self.send_control(now, peer, bytes, Some(answer));
    }

    /// Moves packets that flows made ready to the output queues.
    fn collect_ready(&mut self, peer: SocketAddr) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        let next_hop = p.next_hop;
        for (&assoc, f) in p.in_flows.iter_mut() {
            let _ = assoc;
            while let Some(packet) = f.ready.pop_front() {
                self.urgent.push_back((next_hop, packet));
            }
        }
        if let Some(control) = p.out_flows.get_mut(&CONTROL) {
            while let Some(packet) = control.ready.pop_front() {
                self.urgent.push_back((next_hop, packet));
            }
        }
        for (&assoc, f) in p.out_flows.iter() {
            if assoc != CONTROL && !f.ready.is_empty() && !self.active.contains(&(peer, assoc)) {
                self.active.push_back((peer, assoc));
            }
        }
    }

    fn next_data_packet(&mut self) -> Option<(SocketAddr, Vec<u8>)> {
        while let Some((peer, assoc)) = self.active.pop_front() {
            let Some(p) = self.peers.get_mut(&peer) else {
                continue;
            };
            let next_hop = p.next_hop;
            let Some(f) = p.out_flows.get_mut(&assoc) else {
                continue;
            };
            let Some(packet) = f.ready.pop_front() else {
                continue;
            };
            if !f.ready.is_empty() {
                self.active.push_back((peer, assoc));
            }
            return Some((next_hop, packet));
        }
        None
    }
}

/// A control message in a signed packet.
fn envelope(
    config: &EndpointConfig,
    provider: &CryptoProvider,
    p: &Peer,
    message: &[u8],
) -> Vec<u8> {
    let from_responder = !p.initiator;
    let signature = sign_with(
        config,
        provider,
        &signed_envelope_bytes(&p.pair_id, from_responder, message),
    );
    let mut out = Vec::with_capacity(message.len() + 80);
    Packet::Signed {
        pair_id: p.pair_id,
        from_responder,
        message,
        signature: &signature,
    }
    .write(&mut out);
    out
}

/// Signs with the endpoint's identity. Ed25519 signing with a valid key does not fail; an
/// empty signature would simply never verify at the peer.
fn sign_with(config: &EndpointConfig, provider: &CryptoProvider, message: &[u8]) -> Vec<u8> {
    config.identity.sign(provider, message).unwrap_or_default()
}

fn packet_kind(header: &FlowHeader, p: &Peer) -> Option<Mode> {
    p.in_flows.get(&(header.flow & MAX_ASSOC)).map(|f| f.mode)
}

pub(crate) fn count_refusal(counters: &mut HopCounters, refusal: Refusal) {
    match refusal {
        Refusal::Malformed => counters.malformed += 1,
        Refusal::Forged => counters.forged += 1,
        Refusal::Replayed => counters.replayed += 1,
        Refusal::Stale => counters.stale += 1,
        Refusal::Unverifiable => counters.unverifiable += 1,
        Refusal::Unknown => counters.unknown += 1,
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
        let initial = self.config.retransmit;
        let max_retries = self.config.max_retries;
        let addrs: Vec<SocketAddr> = self.peers.keys().copied().collect();
        for addr in addrs {
            let Some(p) = self.peers.get_mut(&addr) else {
                continue;
            };
            let rto = p.rto(initial);
            // Handshake retransmissions.
            let handshaking = matches!(
                p.state,
                PeerState::Hello | PeerState::Syn | PeerState::AckSent
            );
            if handshaking && p.handshake_resend.is_due(now, resend::SIGNALLING, initial) {
                if p.handshake_resend.tries >= max_retries {
                    if p.initiator {
                        self.fail(addr, "no answer to the handshake");
                    } else {
                        self.forget(addr);
                    }
                    continue;
                }
                p.handshake_resend.resent(now);
                self.urgent.push_back((p.next_hop, p.handshake.clone()));
            }
            // S1 retransmissions.
            let mut stalled_rounds = Vec::new();
            let mut stalled = Vec::new();
            for (&assoc, f) in p.out_flows.iter_mut() {
                match f.on_timeout(now, rto, max_retries) {
                    SendTimeout::Stalled(round) => stalled_rounds.push((assoc, round)),
                    SendTimeout::Retransmitted(tries) if tries >= 2 => {
                        // No A1 after two tries: maybe a relay missed our latest chain.
                        if let Some(renew) = p.renewals.get(&(f.flow, 0)) {
                            stalled.push(renew.clone());
                        }
                    }
                    SendTimeout::Retransmitted(_) | SendTimeout::Nothing => {}
                }
            }
            // Control messages not answered.
            let mut resend = Vec::new();
            let mut resend_signed = Vec::new();
            for c in p.controls.iter_mut() {
                if c.resend.is_due(now, resend::SIGNALLING, initial) {
                    c.resend.resent(now);
                    if c.signed {
                        resend_signed.push(c.bytes.clone());
                    } else {
                        resend.push(c.bytes.clone());
                    }
                }
            }
            for bytes in resend_signed.iter().chain(&stalled) {
                let packet = envelope(&self.config, &self.provider, p, bytes);
                self.urgent.push_back((p.next_hop, packet));
            }
            let give_up = p.controls.iter().any(|c| c.resend.tries > max_retries * 2);
            if let Some(control) = p.out_flows.get_mut(&CONTROL) {
                control.queue.extend(resend);
            }
            for (assoc, round) in stalled_rounds {
                self.events.push_back(EndpointEvent::Stalled {
                    peer: addr,
                    assoc,
                    round,
                });
            }
            if give_up {
                self.fail(addr, "peer stopped answering control messages");
                continue;
            }
            self.pump_all(now, addr);
        }
    }

    fn poll_transmit(&mut self, _now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
        let (destination, packet) = match self.urgent.pop_front() {
            Some(item) => item,
            None => self.next_data_packet()?,
        };
        buf.extend_from_slice(&packet);
        Some(Transmit {
            destination,
            size: packet.len(),
        })
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        let initial = self.config.retransmit;
        let mut next: Option<Timestamp> = None;
        let mut consider = |t: Timestamp| next = Some(next.map_or(t, |n: Timestamp| n.min(t)));
        for p in self.peers.values() {
            if matches!(
                p.state,
                PeerState::Hello | PeerState::Syn | PeerState::AckSent
            ) {
                consider(p.handshake_resend.deadline(resend::SIGNALLING, initial));
            }
            let rto = p.rto(initial);
            for f in p.out_flows.values() {
                if let Some(t) = f.deadline(rto) {
                    consider(t);
                }
            }
            for c in &p.controls {
                consider(c.resend.deadline(resend::SIGNALLING, initial));
            }
        }
        next
    }

    fn poll_event(&mut self) -> Option<EndpointEvent> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::ChainStorage;
    use cohort_channel::identity::Identity;
    use cohort_crypto::Secret;

    /// Two open data associations with packets ready, and a control packet: the control
    /// packet goes first, then the associations take turns one packet at a time.
    #[test]
    fn signalling_goes_first_and_associations_take_turns() {
        let provider = CryptoProvider::default_provider();
        let identity = Identity::from_secret(&provider, Secret::new(vec![3; 32])).unwrap();
        let local: SocketAddr = "10.0.0.1:1".parse().unwrap();
        let peer: SocketAddr = "10.0.0.2:1".parse().unwrap();
        let mut e = Endpoint::new(EndpointConfig::new(identity), provider, local, [4; 32]);
        let mut rng = ChaCha20Rng::from_seed([5; 32]);
        let mut p = Peer {
            addr: peer,
            next_hop: peer,
            pair_id: [1; 8],
            initiator: true,
            state: PeerState::Established,
            key: None,
            handshake: Vec::new(),
            handshake_resend: Resend::new(Timestamp::ZERO),
            our_signature: Vec::new(),
            pending_control: None,
            out_flows: BTreeMap::new(),
            in_flows: BTreeMap::new(),
            next_assoc: 3,
            controls: Vec::new(),
            renewals: HashMap::new(),
            srtt: None,
        };
        for assoc in [1u16, 2] {
            let chain = OwnChain::generate(&provider, &mut rng, 4, 0, ChainStorage::Full);
            let mut f = SendFlow::new(assoc, Mode::Unprotected, false, chain, 4, 4).unwrap();
            f.open = true;
            for i in 0..3u8 {
                f.ready.push_back(vec![assoc as u8, i]);
            }
            p.out_flows.insert(assoc, f);
        }
        e.peers.insert(peer, p);
        e.active.push_back((peer, 1));
        e.active.push_back((peer, 2));
        e.urgent.push_back((peer, vec![0xcc]));
        let mut order = Vec::new();
        let mut buf = Vec::new();
        while let Some(t) = e.poll_transmit(Timestamp::ZERO, &mut buf) {
            assert_eq!(t.destination, peer);
            order.push(buf.clone());
            buf.clear();
        }
        let expected: Vec<Vec<u8>> = vec![
            vec![0xcc],
            vec![1, 0],
            vec![2, 0],
            vec![1, 1],
            vec![2, 1],
            vec![1, 2],
            vec![2, 2],
        ];
        assert_eq!(order, expected);
    }
}
