//! A channel over datagrams, as a [`Machine`]: the same [`Connection`] core, with each
//! handshake frame in its own datagram, retransmission on loss, and data in gear-protected
//! packets under the connection's datagram keys (explicit sequence numbers and a replay
//! window, so loss, duplication and reordering are tolerated). The simulator and the UDP
//! driver run it; groups use it for their pairwise channels.
//!
//! ```text
//!   datagram = kind u8 | payload
//!     kind 0x00: one handshake frame (ClientHello, ServerHello, ClientFinished, ServerAuth, Alert)
//!     kind 0x01: a protected packet (docs/wire.md), header "d" for data, "ok" for the
//!                server's confirmation that it holds the keys
//!
//!   client: ClientHello ─(retransmit until ServerHello)─▶
//!           ClientFinished ─(retransmit until any valid protected packet)─▶
//!   server: ServerHello [ServerAuth] ─(retransmit until ClientFinished)─▶
//!           [ServerAuth] confirmation ─(resent when a repeated ClientFinished arrives)─▶
//! ```
//!
//! Each side resends its flight on a timer until the next step arrives. The server also
//! answers a repeated ClientFinished (its final flight was lost) with that flight again, at
//! most every 100 ms; no other duplicate is answered, so duplication on the path cannot make
//! the two sides answer each other forever. A handshake frame that overtakes the one before
//! it is dropped and comes again with the next resend.

use crate::batch::BatchProof;
use crate::connection::{ChannelError, Connection, Event, SessionInfo};
use crate::endpoint::{Client, Server};
use crate::messages::peek_frame;
use crate::schedule::SessionId;
use cohort_core::{Machine, Timestamp, Transmit};
use cohort_gears::{DropCounters, GearId, Protector, ReceivePolicy, Unprotector};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

/// Datagram kind: one handshake frame.
pub const KIND_HANDSHAKE: u8 = 0x00;
/// Datagram kind: a gear-protected packet.
pub const KIND_PROTECTED: u8 = 0x01;
/// The first retransmission timeout; it doubles on each retry.
pub const INITIAL_RTO: Duration = Duration::from_millis(200);
/// The handshake gives up after this many retransmissions of one flight.
pub const MAX_RETRANSMITS: u32 = 8;
/// The server answers a repeated ClientFinished with its final flight at most this often.
pub const DUPLICATE_ANSWER_INTERVAL: Duration = Duration::from_millis(100);
const HEADER_DATA: &[u8] = b"d";
const HEADER_CONFIRM: &[u8] = b"ok";

/// What a [`DatagramChannel`] reports.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum DatagramEvent {
    /// The handshake is done on this side.
    Established(SessionInfo),
    /// Server, signature mode: sign this session ID and pass the proof to
    /// [`DatagramChannel::handle_batch_proof`].
    BatchSignatureNeeded(SessionId),
    /// Application data from the peer (each `send` arrives at most once, possibly out of
    /// order, or not at all).
    Data(Vec<u8>),
    /// The handshake failed; the channel is dead.
    Failed(ChannelError),
    /// The peer did not answer within [`MAX_RETRANSMITS`] retransmissions.
    TimedOut,
}

/// A two-party channel over datagrams.
pub struct DatagramChannel {
    conn: Connection,
    peer: SocketAddr,
    flight: Vec<Vec<u8>>,
    last_in: Option<Vec<u8>>,
    last_answer: Option<Timestamp>,
    outbox: VecDeque<Vec<u8>>,
    retransmit_at: Option<Timestamp>,
    rto: Duration,
    tries: u32,
    confirmed: bool,
    data: Option<(Protector, Unprotector, GearId)>,
    events: VecDeque<DatagramEvent>,
    dead: bool,
    dropped: u64,
}

impl std::fmt::Debug for DatagramChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatagramChannel")
            .field("peer", &self.peer)
            .field("conn", &self.conn)
            .field("confirmed", &self.confirmed)
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "fuzzing")]
impl DatagramChannel {
    /// A copy of this channel whose connection uses `client`'s or `server`'s caches (pass
    /// the forks of the endpoint it was made from; see
    /// [`Connection::fork`](crate::Connection::fork)): for the fuzz harnesses only
    /// (`fuzzing` feature). `None` when the connection cannot be copied.
    pub fn fork(&self, client: &Client, server: &Server) -> Option<DatagramChannel> {
        Some(DatagramChannel {
            conn: self.conn.fork(client, server)?,
            peer: self.peer,
            flight: self.flight.clone(),
            last_in: self.last_in.clone(),
            last_answer: self.last_answer,
            outbox: self.outbox.clone(),
            retransmit_at: self.retransmit_at,
            rto: self.rto,
            tries: self.tries,
            confirmed: self.confirmed,
            data: self.data.clone(),
            events: self.events.clone(),
            dead: self.dead,
            dropped: self.dropped,
        })
    }
}

impl DatagramChannel {
    fn new(conn: Connection, peer: SocketAddr) -> Self {
        DatagramChannel {
            conn,
            peer,
            flight: Vec::new(),
            last_in: None,
            last_answer: None,
            outbox: VecDeque::new(),
            retransmit_at: None,
            rto: INITIAL_RTO,
            tries: 0,
            confirmed: false,
            data: None,
            events: VecDeque::new(),
            dead: false,
            dropped: 0,
        }
    }

    /// The client side, sending its ClientHello to `peer` at once.
    pub fn client(
        client: &Client,
        now: Timestamp,
        rng: &mut dyn rand_core::RngCore,
        server_name: &str,
        peer: SocketAddr,
    ) -> Result<Self, ChannelError> {
        let conn = client.connect(now, rng, server_name)?;
        let mut chan = DatagramChannel::new(conn, peer);
        chan.take_flight(now);
        Ok(chan)
    }

    /// The server side, waiting for `peer`'s ClientHello.
    pub fn server(server: &Server, peer: SocketAddr) -> Self {
        DatagramChannel::new(server.accept(), peer)
    }

    /// The connection inside (session details, exported secrets).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Datagrams dropped: from another address, malformed, unauthenticated, replayed, or
    /// before keys existed.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The data plane's drop counters, once established.
    pub fn counters(&self) -> Option<&DropCounters> {
        self.data.as_ref().map(|(_, u, _)| u.counters())
    }

    /// Whether data can be sent.
    pub fn is_established(&self) -> bool {
        self.data.is_some()
    }

    /// Sends `payload` as one protected datagram.
    pub fn send(&mut self, payload: &[u8]) -> Result<(), ChannelError> {
        let (protector, _, gear) = self.data.as_mut().ok_or(ChannelError::NotReady)?;
        let mut packet = vec![KIND_PROTECTED];
        protector
            .protect(&[*gear], HEADER_DATA, payload, &mut packet)
            .map_err(|_| ChannelError::Crypto)?;
        self.outbox.push_back(packet);
        Ok(())
    }

    /// Server, signature mode: the batch signer's proof.
    pub fn handle_batch_proof(&mut self, proof: &BatchProof) -> Result<(), ChannelError> {
        self.conn.handle_batch_proof(proof)?;
        // The ServerAuth joins the flight that is retransmitted.
        let mut frames = self.frames();
        if !frames.is_empty() {
            self.outbox.extend(frames.iter().cloned());
            self.flight.append(&mut frames);
        }
        self.after_input();
        Ok(())
    }

    /// The connection's pending output, one datagram per frame.
    fn frames(&mut self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        self.conn.take_output(&mut out);
        let mut frames = Vec::new();
        let mut at = 0;
        while let Some((_, len)) = peek_frame(&out[at..]) {
            let mut d = Vec::with_capacity(len + 1);
            d.push(KIND_HANDSHAKE);
            d.extend_from_slice(&out[at..at + len]);
            frames.push(d);
            at += len;
        }
        frames
    }

    /// Replaces the flight with the connection's new output, sends it, and arms the timer.
    fn take_flight(&mut self, now: Timestamp) {
        let frames = self.frames();
        if frames.is_empty() {
            return;
        }
        self.outbox.extend(frames.iter().cloned());
        self.flight = frames;
        self.tries = 0;
        self.rto = INITIAL_RTO;
        if !self.confirmed {
            self.retransmit_at = Some(now.saturating_add(self.rto));
        }
    }

    fn after_input(&mut self) {
        while let Some(event) = self.conn.poll_event() {
            match event {
                Event::Established => self.open(),
                Event::BatchSignatureNeeded(sid) => self
                    .events
                    .push_back(DatagramEvent::BatchSignatureNeeded(sid)),
                Event::PeerClosed => {}
            }
        }
    }

    fn open(&mut self) {
        let (Ok((send, recv)), Some(info)) = (self.conn.datagram_keys(), self.conn.session())
        else {
            return;
        };
        let info = info.clone();
        let set = send.gears();
        let floor = info
            .gears
            .iter()
            .map(|g| g.info().forgery_bits)
            .fold(f64::INFINITY, f64::min);
        let gear = self.conn.send_gear().unwrap_or(info.gears[0]);
        let mut protector = Protector::new(send);
        if !self.conn.is_client() {
            // The server proves it holds the keys; until this arrives, the client keeps
            // sending its ClientFinished. Earlier frames (ServerAuth) stay in the flight.
            let mut packet = vec![KIND_PROTECTED];
            if protector
                .protect(&[gear], HEADER_CONFIRM, &[], &mut packet)
                .is_ok()
            {
                self.flight.retain(|d| {
                    d.get(1).copied() == Some(crate::messages::FrameType::ServerAuth as u8)
                });
                self.flight.push(packet.clone());
                self.outbox.push_back(packet);
            }
            self.confirmed = true;
            self.retransmit_at = None;
        }
        self.data = Some((
            protector,
            Unprotector::new(recv, ReceivePolicy::new(set, floor)),
            gear,
        ));
        self.events.push_back(DatagramEvent::Established(info));
    }

    fn fail(&mut self, event: DatagramEvent) {
        self.dead = true;
        self.retransmit_at = None;
        self.events.push_back(event);
    }
}

impl Machine for DatagramChannel {
    type Event = DatagramEvent;

    fn handle_datagram(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        if from != self.peer || self.dead {
            self.dropped += 1;
            return;
        }
        match data.split_first() {
            Some((&KIND_HANDSHAKE, frame)) => {
                if self.last_in.as_deref() == Some(frame) {
                    // The peer resent its last flight, so ours was lost. Only the server's
                    // final flight is resent this way, and at most once per interval: if
                    // both sides answered duplicates, duplication on the path would make
                    // them answer each other forever. Everything else waits for its timer.
                    let due = self.last_answer.is_none_or(|t| {
                        now.saturating_duration_since(t) >= DUPLICATE_ANSWER_INTERVAL
                    });
                    if !self.conn.is_client() && self.data.is_some() && due {
                        self.last_answer = Some(now);
                        self.outbox.extend(self.flight.iter().cloned());
                    } else {
                        self.dropped += 1;
                    }
                    return;
                }
                if self.data.is_some()
                    || !frame.first().is_some_and(|&t| self.conn.expects_frame(t))
                {
                    // An old retransmission after our handshake is done, or a frame that
                    // overtook the one before it: the peer will send it again.
                    self.dropped += 1;
                    return;
                }
                match self.conn.handle_input(now, frame) {
                    Ok(()) => {
                        self.last_in = Some(frame.to_vec());
                        self.take_flight(now);
                        self.after_input();
                    }
                    Err(e) => {
                        // Let the peer see an alert if the core queued one.
                        let alert = self.frames();
                        self.outbox.extend(alert);
                        self.fail(DatagramEvent::Failed(e));
                    }
                }
            }
            Some((&KIND_PROTECTED, packet)) => {
                let Some((_, unprotector, _)) = self.data.as_mut() else {
                    self.dropped += 1;
                    return;
                };
                let mut packet = packet.to_vec();
                match unprotector.unprotect(&mut packet) {
                    Ok(opened) => {
                        if !self.confirmed {
                            self.confirmed = true;
                            self.retransmit_at = None;
                        }
                        if opened.header == HEADER_DATA {
                            let body = opened.body.to_vec();
                            self.events.push_back(DatagramEvent::Data(body));
                        }
                    }
                    Err(_) => self.dropped += 1,
                }
            }
            _ => self.dropped += 1,
        }
    }

    fn handle_timeout(&mut self, now: Timestamp) {
        let Some(at) = self.retransmit_at else {
            return;
        };
        if now < at {
            return;
        }
        if self.tries >= MAX_RETRANSMITS {
            self.fail(DatagramEvent::TimedOut);
            return;
        }
        self.tries += 1;
        self.rto = (self.rto * 2).min(Duration::from_secs(10));
        self.outbox.extend(self.flight.iter().cloned());
        self.retransmit_at = Some(now.saturating_add(self.rto));
    }

    fn poll_transmit(&mut self, _now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
        let d = self.outbox.pop_front()?;
        buf.extend_from_slice(&d);
        Some(Transmit {
            destination: self.peer,
            size: d.len(),
        })
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        self.retransmit_at
    }

    fn poll_event(&mut self) -> Option<DatagramEvent> {
        self.events.pop_front()
    }
}
