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
//! * Feedback reports (the receiver's load, its count of failed verifications and the gears
//!   it retired) always go under the controller's strongest gear: control traffic is never
//!   weakened (ACSA 4.1). Only a report newer than every earlier one counts, and a report
//!   older than [`FEEDBACK_STALE_AFTER`] feedback intervals is forgotten, so reordering or
//!   dropping reports cannot fake a failure burst or freeze an old load.
//! * A gear the peer retired (it hit its integrity limit there) leaves this end's ladder.
//!
//! # Keys
//! The shared secret must be fresh for every link (a new key exchange each time): sequence
//! numbers start at 0, so two links under one secret would reuse AEAD and GMAC nonces.
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
/// Fixed part of a feedback body: load, failures, replays, number of retired gears.
const FEEDBACK_FIXED_LEN: usize = 2 + 8 + 8 + 1;
/// Feedback older than this many feedback intervals is forgotten.
pub const FEEDBACK_STALE_AFTER: u32 = 4;
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
#[non_exhaustive]
pub enum LinkError {
    /// The controller configuration is unusable.
    Controller(crate::controller::ConfigError),
    /// Key derivation failed (secret shorter than 16 bytes, or a backend failure).
    Keys(CryptoError),
    /// A link setting is unusable.
    Config(&'static str),
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkError::Controller(e) => write!(f, "controller configuration: {e:?}"),
            LinkError::Keys(e) => write!(f, "key derivation: {e}"),
            LinkError::Config(what) => f.write_str(what),
        }
    }
}

impl std::error::Error for LinkError {}

/// Why [`GearLink::send`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
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
#[non_exhaustive]
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
    /// The peer retired the only gear this end could still send under: rekey.
    PeerRetiredLastGear(GearId),
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
    /// When the newest feedback arrived, and its sequence number.
    peer_feedback_at: Timestamp,
    peer_feedback_seq: Option<u64>,
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
    /// exchange), started at `now`. The secret must be fresh for this link: sequence numbers
    /// start at 0, so a reused secret would reuse AEAD and GMAC nonces.
    pub fn new(
        provider: &CryptoProvider,
        shared_secret: &[u8],
        role: Role,
        peer: SocketAddr,
        config: LinkConfig,
        now: Timestamp,
    ) -> Result<GearLink, LinkError> {
        if config.feedback_interval.is_zero() || config.control_interval.is_zero() {
            return Err(LinkError::Config(
                "feedback and control intervals must be above zero",
            ));
        }
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
        // A link that requires privacy accepts only encrypted packets, too.
        let accepted: GearSet = if config.controller.require_privacy {
            gears
                .iter()
                .filter(|g| g.info().kind == GearKind::Aead)
                .collect()
        } else {
            gears
        };
        let policy = ReceivePolicy::new(accepted, config.controller.floor_bits);
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
            peer_feedback_at: now,
            peer_feedback_seq: None,
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
        let retired: Vec<u8> = self.rx.retired().iter().map(GearId::to_u8).collect();
        let mut body = Vec::with_capacity(FEEDBACK_FIXED_LEN + retired.len());
        let load = (self.local_load.clamp(0.0, 1.0) * 1000.0) as u16;
        Writer::new(&mut body)
            .u16(load)
            .u64(self.rx.counters().auth_failed)
            .u64(self.rx.counters().replayed)
            .u8(retired.len() as u8) // at most 256 gear ids exist, fewer are ever agreed
            .bytes(&retired);
        let mut packet = Vec::new();
        // Control traffic always goes under the strongest gear the controller has.
        let strongest = self.controller.strongest();
        if self
            .tx
            .protect(&[strongest], &[KIND_FEEDBACK], &body, &mut packet)
            .is_ok()
        {
            self.outbox.push_back(packet);
        }
    }

    fn take_feedback(&mut self, now: Timestamp, seq: u64, report: FeedbackReport) {
        self.peer_feedback_seq = Some(seq);
        self.peer_feedback_at = now;
        self.peer_feedback = Some(ReceiverFeedback {
            load: report.load,
            auth_failures: report.auth_failures,
        });
        self.events.push_back(LinkEvent::Feedback {
            load: report.load,
            auth_failures: report.auth_failures,
        });
        for gear in report.retired.iter() {
            match self.controller.retire(gear) {
                Ok(Some(shift)) => self.events.push_back(LinkEvent::GearShifted(shift)),
                Ok(None) => {}
                // The last gear cannot be retired; the link needs a new key (the caller
                // sees every send dropped by the peer, and the retired gear in its events).
                Err(_) => self.events.push_back(LinkEvent::PeerRetiredLastGear(gear)),
            }
        }
        self.observe(now);
    }

    fn observe(&mut self, now: Timestamp) {
        let stale = now.saturating_duration_since(self.peer_feedback_at)
            > self.config.feedback_interval * FEEDBACK_STALE_AFTER;
        if stale {
            // Keep the failure count (a baseline for the next report), forget the load.
            if let Some(f) = self.peer_feedback.as_mut() {
                f.load = f32::NAN;
            }
        }
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

/// A feedback report as it travels (see `docs/wire.md`).
#[derive(Clone, Debug, PartialEq)]
pub struct FeedbackReport {
    /// The sender's load, 0.0 to 1.0.
    pub load: f32,
    /// Failed verifications at the sender of the report, cumulative.
    pub auth_failures: u64,
    /// Replayed packets it dropped, cumulative.
    pub replayed: u64,
    /// Gears it retired (integrity limit reached).
    pub retired: GearSet,
}

/// Parses a feedback body; `None` if it is malformed (length, load above 1000 per mille,
/// or an unknown gear id).
pub fn parse_feedback(body: &[u8]) -> Option<FeedbackReport> {
    let mut r = Reader::new(body);
    let load = r.u16().ok()?;
    let auth_failures = r.u64().ok()?;
    let replayed = r.u64().ok()?;
    let n = r.u8().ok()?;
    let ids = r.bytes(usize::from(n)).ok()?;
    if !r.is_empty() || load > 1000 {
        return None;
    }
    let mut retired = GearSet::empty();
    for &id in ids {
        retired.insert(GearId::from_u8(id)?);
    }
    Some(FeedbackReport {
        load: f32::from(load) / 1000.0,
        auth_failures,
        replayed,
        retired,
    })
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
                // Feedback must come under a gear at least as strong as this end's strongest.
                let strong_enough = opened.verified_by.info().forgery_bits
                    >= self.controller.strongest().info().forgery_bits;
                // Only a report newer than every earlier one counts: a reordered old report
                // would look like a counter reset, i.e. like a burst of failures.
                let newer = self.peer_feedback_seq.is_none_or(|last| opened.seq > last);
                let seq = opened.seq;
                match parse_feedback(opened.body) {
                    _ if !strong_enough => self.events.push_back(LinkEvent::Dropped {
                        reason: DropReason::NoAcceptableTag,
                    }),
                    Some(_) if !newer => self.events.push_back(LinkEvent::Dropped {
                        reason: DropReason::Replayed,
                    }),
                    Some(report) => self.take_feedback(now, seq, report),
                    None => self.events.push_back(LinkEvent::Dropped {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::ShiftReason;
    use std::net::{Ipv4Addr, SocketAddr};

    const A_ADDR: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 1);
    const B_ADDR: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 2);

    fn pair(gears: &[GearId], floor: f64) -> (GearLink, GearLink) {
        let set: GearSet = gears.iter().copied().collect();
        let mut config = LinkConfig::new(floor, set);
        config.controller.dwell = Duration::from_millis(200);
        let p = CryptoProvider::default_provider();
        let a = GearLink::new(
            &p,
            &[7; 32],
            Role::Initiator,
            B_ADDR,
            config.clone(),
            Timestamp::ZERO,
        )
        .unwrap();
        let b = GearLink::new(
            &p,
            &[7; 32],
            Role::Responder,
            A_ADDR,
            config,
            Timestamp::ZERO,
        )
        .unwrap();
        (a, b)
    }

    /// Everything `from` wants to send.
    fn drain(from: &mut GearLink, now: Timestamp) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = Vec::new();
        while let Some(t) = from.poll_transmit(now, &mut buf) {
            out.push(buf[..t.size].to_vec());
            buf.clear();
        }
        out
    }

    fn events(link: &mut GearLink) -> Vec<LinkEvent> {
        std::iter::from_fn(|| link.poll_event()).collect()
    }

    fn forge(into: &mut GearLink, gear: GearId, n: u64, now: Timestamp) {
        let set: GearSet = [gear].into_iter().collect();
        let keys = GearKeys::derive(&CryptoProvider::default_provider(), &[9; 32], set).unwrap();
        let mut forger = Protector::new(keys);
        for i in 0..n {
            let mut p = Vec::new();
            forger
                .protect_with_seq(1_000_000 + i, &[gear], &[KIND_DATA], b"x", &mut p)
                .unwrap();
            into.handle_datagram(now, A_ADDR, &p);
        }
    }

    #[test]
    fn zero_intervals_are_refused() {
        let set: GearSet = [GearId::Umac64].into_iter().collect();
        let mut config = LinkConfig::new(0.0, set);
        config.feedback_interval = Duration::ZERO;
        let p = CryptoProvider::default_provider();
        let err = GearLink::new(
            &p,
            &[1; 32],
            Role::Initiator,
            B_ADDR,
            config,
            Timestamp::ZERO,
        );
        assert!(matches!(err, Err(LinkError::Config(_))));
    }

    #[test]
    fn a_reordered_old_report_is_not_a_failure_burst() {
        let (mut a, mut b) = pair(&[GearId::HmacSha256_128, GearId::Umac64], 0.0);
        let t = |ms| Timestamp::from_millis(ms);
        forge(&mut b, GearId::HmacSha256_128, 5, t(10));
        b.handle_timeout(t(100)); // report 1: 5 failures
        let first = drain(&mut b, t(100));
        forge(&mut b, GearId::HmacSha256_128, 5, t(150));
        b.handle_timeout(t(200)); // report 2: 10 failures
        let second = drain(&mut b, t(200));
        assert!(!first.is_empty() && !second.is_empty());
        for p in second.iter().chain(&first) {
            a.handle_datagram(t(210), B_ADDR, p);
        }
        let evs = events(&mut a);
        assert!(
            evs.contains(&LinkEvent::Dropped {
                reason: DropReason::Replayed
            }),
            "{evs:?}"
        );
        // 10 failures in all, in two honest reports; the stale one must not add 5 more.
        let feedback: Vec<_> = evs
            .iter()
            .filter(|e| matches!(e, LinkEvent::Feedback { .. }))
            .collect();
        assert_eq!(feedback.len(), 1);
        assert_eq!(a.peer_feedback.map(|f| f.auth_failures), Some(10));
    }

    #[test]
    fn a_gear_the_peer_retired_leaves_the_ladder() {
        let (mut a, mut b) = pair(&[GearId::HmacSha256_128, GearId::Umac32], 0.0);
        // Push A down to umac-32 with sustained load.
        a.set_local_load(0.99);
        let mut now = Timestamp::ZERO;
        while a.current_gear() != GearId::Umac32 {
            now += Duration::from_millis(50);
            assert!(now < Timestamp::from_millis(10_000), "never shifted down");
            a.handle_timeout(now);
        }
        // An attacker spends umac-32's integrity limit at B.
        forge(
            &mut b,
            GearId::Umac32,
            GearId::Umac32.info().integrity_limit,
            now,
        );
        assert!(b.rx.retired().contains(GearId::Umac32));
        // B's next report takes umac-32 off A's ladder, and A's data gets through again.
        now += Duration::from_millis(100);
        b.handle_timeout(now);
        for p in drain(&mut b, now) {
            a.handle_datagram(now, B_ADDR, &p);
        }
        let shifted = events(&mut a).into_iter().any(|e| {
            matches!(e, LinkEvent::GearShifted(s)
                if s.reason == ShiftReason::GearRetired { gear: GearId::Umac32 })
        });
        assert!(shifted);
        assert_eq!(a.current_gear(), GearId::HmacSha256_128);
        assert!(!a.controller().ladder().contains(&GearId::Umac32));
        a.send(b"after").unwrap();
        events(&mut b);
        for p in drain(&mut a, now) {
            b.handle_datagram(now, A_ADDR, &p);
        }
        assert!(events(&mut b)
            .iter()
            .any(|e| matches!(e, LinkEvent::Delivered { .. })));
    }

    #[test]
    fn stale_feedback_stops_driving_the_controller() {
        let gears = [
            GearId::HmacSha256,
            GearId::Umac128,
            GearId::Umac96,
            GearId::Umac64,
            GearId::Umac32,
        ];
        let (mut a, mut b) = pair(&gears, 0.0);
        b.set_local_load(0.99);
        let t = |ms| Timestamp::from_millis(ms);
        b.handle_timeout(t(100)); // one report of high load, then nothing more reaches A
        for p in drain(&mut b, t(100)) {
            a.handle_datagram(t(100), B_ADDR, &p);
        }
        let mut now = t(100);
        while now < t(5_000) {
            now += Duration::from_millis(50);
            a.handle_timeout(now);
        }
        // The report counts for FEEDBACK_STALE_AFTER intervals (400 ms): enough for at most
        // two 200 ms dwells. A frozen report would have walked A to the bottom; instead, once
        // it is stale, A's own low load brings it back to the top.
        let downs = events(&mut a)
            .into_iter()
            .filter(|e| matches!(e, LinkEvent::GearShifted(s) if matches!(s.reason, ShiftReason::HighLoad { .. })))
            .count();
        assert!((1..=2).contains(&downs), "{downs} downshifts");
        assert_eq!(a.current_gear(), GearId::HmacSha256);
    }

    #[test]
    fn privacy_links_refuse_clear_packets() {
        let (_, mut b) = pair(&[GearId::Aes128Gcm, GearId::HmacSha256], 0.0);
        let set: GearSet = [GearId::HmacSha256].into_iter().collect();
        // Even a correctly keyed MAC-only packet is refused on a link that requires privacy.
        let p = CryptoProvider::default_provider();
        let mut secret = cohort_crypto::Secret::zeroed(32);
        p.hkdf_sha256
            .derive(
                b"cohort-link/v1",
                &[7; 32],
                &[b"initiator to responder"],
                secret.expose_mut(),
            )
            .unwrap();
        let mut tx = Protector::new(GearKeys::derive(&p, secret.expose(), set).unwrap());
        let mut packet = Vec::new();
        tx.protect(
            &[GearId::HmacSha256],
            &[KIND_DATA],
            b"in clear",
            &mut packet,
        )
        .unwrap();
        b.handle_datagram(Timestamp::ZERO, A_ADDR, &packet);
        assert_eq!(
            events(&mut b),
            vec![LinkEvent::Dropped {
                reason: DropReason::NoAcceptableTag
            }]
        );
    }
}
