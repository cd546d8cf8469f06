//! A gear-protected datagram link between two peers: ACSA's data channel and control
//! channel in one sans-IO [`Machine`].
//!
//! ```text
//!   app ─send()─▶ Controller picks gear ─▶ Protector ─▶ [data packet] ─────────▶ peer
//!                       ▲                                                        │
//!                       │ observe(load, failures, feedback)            Unprotector, replay
//!                       │                                                        │
//!   peer ◀── [feedback: load, auth failures] ◀── every feedback_interval ◀───────┘
//! ```
//! * Each direction has its own keys, derived from the shared secret and the direction.
//! * Data goes under the controller's current gear; with `companion_strong_tag`, a packet
//!   under a fast gear also carries the strongest agreed tag, so a receiver with spare CPU
//!   verifies that one instead (ACSA 3.4).
//! * Feedback reports (the receiver's load and its count of failed verifications) always go
//!   under the strongest agreed gear: control traffic is never weakened (ACSA 4.1).
//! * The receiver verifies the strongest acceptable tag, or the cheapest while its own load
//!   is above the controller's high-water mark.

use crate::controller::{Controller, ControllerConfig, Observation, ReceiverFeedback, Shift};
use crate::{
    DropReason, GearId, GearKeys, GearKind, GearList, GearSet, ProtectError, Protector,
    ReceivePolicy, TagChoice, Unprotector,
};
use cohort_core::wire::{Reader, Writer};
use cohort_core::{Machine, Timer, TimerTable, Timestamp, Transmit};
use cohort_crypto::{CryptoError, CryptoProvider};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

const KIND_DATA: u8 = 1;
const KIND_FEEDBACK: u8 = 2;
const FEEDBACK_LEN: usize = 2 + 8 + 8;
/// Packets waiting to be sent before `send` refuses more (back-pressure).
const MAX_OUTBOX: usize = 1024;

/// Which end of the link this is (it picks the direction keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The end that opened the link.
    Initiator,
    /// The other end.
    Responder,
}

/// How a link behaves.
#[derive(Clone, Debug)]
pub struct LinkConfig {
    /// The controller's floor, gear set and thresholds.
    pub controller: ControllerConfig,
    /// Attach the strongest agreed tag next to a faster one (ACSA 3.4).
    pub companion_strong_tag: bool,
    /// How often this end reports its load and failures to the peer.
    pub feedback_interval: Duration,
    /// How often the controller samples its inputs.
    pub control_interval: Duration,
}

impl LinkConfig {
    /// Defaults around a floor and an agreed gear set.
    pub fn new(floor_bits: f64, gears: GearSet) -> Self {
        LinkConfig {
            controller: ControllerConfig::new(floor_bits, gears),
            companion_strong_tag: false,
            feedback_interval: Duration::from_millis(100),
            control_interval: Duration::from_millis(50),
        }
    }
}

/// Why a link could not be built (configuration: detailed).
#[derive(Debug)]
pub enum LinkError {
    /// The controller configuration is unusable.
    Controller(crate::controller::ConfigError),
    /// Key derivation failed (secret shorter than 16 bytes, or a backend failure).
    Keys(CryptoError),
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkError::Controller(e) => write!(f, "controller configuration: {e:?}"),
            LinkError::Keys(e) => write!(f, "key derivation: {e}"),
        }
    }
}

impl std::error::Error for LinkError {}

/// Why [`GearLink::send`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendError {
    /// Too many packets are waiting for `poll_transmit`; drain them first.
    Backlogged,
    /// The packet could not be protected (too long, or the key is exhausted: rekey).
    Protect(ProtectError),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Backlogged => f.write_str("too many packets waiting to be sent"),
            SendError::Protect(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for SendError {}

/// What a link reports to its application.
#[derive(Clone, Debug, PartialEq)]
pub enum LinkEvent {
    /// An authenticated data packet.
    Delivered {
        /// Its sequence number.
        seq: u64,
        /// The tag this end verified.
        verified_by: GearId,
        /// Every gear the packet carried.
        gears: GearList,
        /// The payload.
        payload: Vec<u8>,
    },
    /// A packet was dropped (already counted).
    Dropped {
        /// Why.
        reason: DropReason,
    },
    /// The controller changed the sending gear.
    GearShifted(Shift),
    /// The peer reported its load and failures.
    Feedback {
        /// Peer's load, 0.0 to 1.0.
        load: f32,
        /// Failed verifications at the peer so far.
        auth_failures: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LinkTimer {
    Feedback,
    Control,
}

impl Timer for LinkTimer {
    const ALL: &'static [Self] = &[LinkTimer::Feedback, LinkTimer::Control];
    fn index(self) -> usize {
        self as usize
    }
}

/// One end of a gear-protected link. See the module docs; the call order is [`Machine`]'s.
pub struct GearLink {
    peer: SocketAddr,
    config: LinkConfig,
    tx: Protector,
    rx: Unprotector,
    controller: Controller,
    local_load: f32,
    peer_feedback: Option<ReceiverFeedback>,
    timers: TimerTable<LinkTimer, 2>,
    outbox: VecDeque<Vec<u8>>,
    events: VecDeque<LinkEvent>,
}

impl std::fmt::Debug for GearLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GearLink")
            .field("peer", &self.peer)
            .field("gear", &self.controller.current())
            .finish_non_exhaustive()
    }
}

impl GearLink {
    /// One end of a link to `peer`, keyed from `shared_secret` (16 bytes or more, from a key
    /// exchange), started at `now`.
    pub fn new(
        provider: &CryptoProvider,
        shared_secret: &[u8],
        role: Role,
        peer: SocketAddr,
        config: LinkConfig,
        now: Timestamp,
    ) -> Result<GearLink, LinkError> {
        let gears = config.controller.gears;
        let controller =
            Controller::new(config.controller.clone()).map_err(LinkError::Controller)?;
        let (send_label, recv_label): (&[u8], &[u8]) = match role {
            Role::Initiator => (b"initiator to responder", b"responder to initiator"),
            Role::Responder => (b"responder to initiator", b"initiator to responder"),
        };
        let direction = |label: &[u8]| -> Result<GearKeys, CryptoError> {
            let mut secret = cohort_crypto::Secret::zeroed(32);
            provider.hkdf_sha256.derive(
                b"cohort-link/v1",
                shared_secret,
                &[label],
                secret.expose_mut(),
            )?;
            GearKeys::derive(provider, secret.expose(), gears)
        };
        let tx = Protector::new(direction(send_label).map_err(LinkError::Keys)?);
        let policy = ReceivePolicy::new(gears, config.controller.floor_bits);
        let rx = Unprotector::new(direction(recv_label).map_err(LinkError::Keys)?, policy);
        let mut timers = TimerTable::new();
        timers.set(LinkTimer::Feedback, now + config.feedback_interval);
        timers.set(LinkTimer::Control, now + config.control_interval);
        Ok(GearLink {
            peer,
            config,
            tx,
            rx,
            controller,
            local_load: 0.0,
            peer_feedback: None,
            timers,
            outbox: VecDeque::new(),
            events: VecDeque::new(),
        })
    }

    /// Queues `payload` for the peer under the current gear; returns its sequence number.
    pub fn send(&mut self, payload: &[u8]) -> Result<u64, SendError> {
        if self.outbox.len() >= MAX_OUTBOX {
            return Err(SendError::Backlogged);
        }
        let current = self.controller.current();
        let strongest = self.controller.strongest();
        let mut gears = vec![current];
        if self.config.companion_strong_tag
            && current != strongest
            && current.info().kind == GearKind::Mac
            && strongest.info().kind == GearKind::Mac
        {
            gears.push(strongest);
        }
        let mut packet = Vec::new();
        let seq = self
            .tx
            .protect(&gears, &[KIND_DATA], payload, &mut packet)
            .map_err(SendError::Protect)?;
        self.outbox.push_back(packet);
        Ok(seq)
    }

    /// Tells the link this end's CPU load (0.0 to 1.0), as the local resource manager would.
    pub fn set_local_load(&mut self, load: f32) {
        self.local_load = load;
        let busy = load > self.config.controller.high_load;
        let mut policy = *self.rx.policy();
        policy.choice = if busy {
            TagChoice::Cheapest
        } else {
            TagChoice::Strongest
        };
        self.rx.set_policy(policy);
    }

    /// The gear data is sent under now.
    pub fn current_gear(&self) -> GearId {
        self.controller.current()
    }

    /// The controller, for inspection.
    pub fn controller(&self) -> &Controller {
        &self.controller
    }

    /// Receive-side counters.
    pub fn counters(&self) -> &crate::DropCounters {
        self.rx.counters()
    }

    /// The peer's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    fn send_feedback(&mut self) {
        let mut body = Vec::with_capacity(FEEDBACK_LEN);
        let load = (self.local_load.clamp(0.0, 1.0) * 1000.0) as u16;
        Writer::new(&mut body)
            .u16(load)
            .u64(self.rx.counters().auth_failed)
            .u64(self.rx.counters().replayed);
        let mut packet = Vec::new();
        // Control traffic always goes under the strongest agreed gear.
        let strongest = self.controller.strongest();
        if self
            .tx
            .protect(&[strongest], &[KIND_FEEDBACK], &body, &mut packet)
            .is_ok()
        {
            self.outbox.push_back(packet);
        }
    }

    fn observe(&mut self, now: Timestamp) {
        let obs = Observation {
            now,
            local_load: self.local_load,
            local_auth_failures: self.rx.counters().auth_failed,
            receiver: self.peer_feedback,
        };
        if let Some(shift) = self.controller.observe(&obs) {
            self.events.push_back(LinkEvent::GearShifted(shift));
        }
    }
}

fn parse_feedback(body: &[u8]) -> Option<(f32, u64)> {
    let mut r = Reader::new(body);
    let load = r.u16().ok()?;
    let failures = r.u64().ok()?;
    let _replayed = r.u64().ok()?;
    if !r.is_empty() || load > 1000 {
        return None;
    }
    Some((f32::from(load) / 1000.0, failures))
}

impl Machine for GearLink {
    type Event = LinkEvent;

    fn handle_datagram(&mut self, now: Timestamp, _from: SocketAddr, data: &[u8]) {
        // The source address is not trusted; the tags are.
        let mut packet = data.to_vec();
        let opened = match self.rx.unprotect(&mut packet) {
            Ok(opened) => opened,
            Err(reason) => {
                self.events.push_back(LinkEvent::Dropped { reason });
                return;
            }
        };
        match opened.header {
            [KIND_DATA] => self.events.push_back(LinkEvent::Delivered {
                seq: opened.seq,
                verified_by: opened.verified_by,
                gears: opened.gears,
                payload: opened.body.to_vec(),
            }),
            [KIND_FEEDBACK] => {
                // Feedback must come under a gear at least as strong as the strongest agreed.
                let strong_enough = opened.verified_by.info().forgery_bits
                    >= self.controller.strongest().info().forgery_bits;
                match parse_feedback(opened.body) {
                    Some((load, auth_failures)) if strong_enough => {
                        self.peer_feedback = Some(ReceiverFeedback {
                            load,
                            auth_failures,
                        });
                        self.events.push_back(LinkEvent::Feedback {
                            load,
                            auth_failures,
                        });
                        self.observe(now);
                    }
                    _ => self.events.push_back(LinkEvent::Dropped {
                        reason: DropReason::Malformed,
                    }),
                }
            }
            _ => self.events.push_back(LinkEvent::Dropped {
                reason: DropReason::Malformed,
            }),
        }
    }

    fn handle_timeout(&mut self, now: Timestamp) {
        let expired: Vec<LinkTimer> = self.timers.take_expired(now).collect();
        for timer in expired {
            match timer {
                LinkTimer::Feedback => {
                    self.send_feedback();
                    self.timers
                        .set(LinkTimer::Feedback, now + self.config.feedback_interval);
                }
                LinkTimer::Control => {
                    self.observe(now);
                    self.timers
                        .set(LinkTimer::Control, now + self.config.control_interval);
                }
            }
        }
    }

    fn poll_transmit(&mut self, _now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
        let packet = self.outbox.pop_front()?;
        buf.extend_from_slice(&packet);
        Some(Transmit {
            destination: self.peer,
            size: packet.len(),
        })
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        self.timers.next_deadline()
    }

    fn poll_event(&mut self) -> Option<LinkEvent> {
        self.events.pop_front()
    }
}
