//! The adaptive gear controller (ACSA 2.3, 4.1): pure policy, no I/O, no clock.
//!
//! ```text
//!  floor_bits, agreed GearSet ──▶ ladder: allowed gears, strongest first (fixed until set_floor)
//!
//!  Observation { now, local load, local failures, receiver { load, failures } }
//!        │
//!        ├─ failures: deltas of both cumulative counters ─▶ sliding window ──▶ burst?
//!        │                                                   ──▶ jump to ladder[0], hold
//!        └─ load: max(local, receiver) ─▶ high / mid / low streak ──▶ after `dwell`:
//!                                          one rung down (faster) / one rung up (stronger)
//!        ▼
//!  current(): the gear to send under now
//! ```
//!
//! "To change gears, the controller within the sender system then selects among these agreed
//! upon security associations based on security policy and processor load. The controller
//! within the receiver system can effect gear changes by notifying the sender of observed
//! authentication errors and processor resource limitations in the receiver for the current
//! gear." (ACSA 2.3)
//!
//! # The floor
//! ACSA 4.1's load attack: an adversary who can raise a communicant's processor load can push
//! the controller towards weaker gears, and "this vulnerability cannot be solved within ACSA
//! [...] set an acceptable minimum strength gear." Here the floor is a hard filter applied
//! once, when the ladder is built: the controller can only ever choose a rung of the ladder,
//! and every rung has [`GearInfo::forgery_bits`](crate::GearInfo::forgery_bits) at or above
//! the floor. No observation can change the ladder; only [`Controller::set_floor`] can.
//!
//! Set [`ControllerConfig::high_load`] to `1.0` to follow ACSA's other advice, "not use
//! resource loads to determine ACSA gears": load then never shifts down.
//!
//! # Privacy
//! An AEAD gear encrypts the body, a MAC gear sends it in clear. A load-driven step from an
//! AEAD to a MAC would be a second load attack, on confidentiality. With
//! [`ControllerConfig::require_privacy`] (the default whenever the agreed set has an AEAD
//! gear that meets the floor) the ladder holds AEAD gears only.
//!
//! # Example
//! ```
//! use std::time::Duration;
//! use cohort_core::Timestamp;
//! use cohort_gears::controller::{Controller, ControllerConfig, Observation};
//! use cohort_gears::{GearId, GearSet};
//!
//! let gears: GearSet =
//!     [GearId::HmacSha256_128, GearId::Umac64, GearId::Umac32].into_iter().collect();
//! let mut config = ControllerConfig::new(60.0, gears); // never below 60 bits
//! config.dwell = Duration::from_secs(1);
//! let mut ctl = Controller::new(config).unwrap();
//! // umac-32 is below the floor: the controller can never choose it.
//! assert_eq!(ctl.ladder(), &[GearId::HmacSha256_128, GearId::Umac64]);
//!
//! let busy = |secs: u64| Observation {
//!     now: Timestamp::from_millis(secs * 1000),
//!     local_load: 0.99,
//!     local_auth_failures: 0,
//!     receiver: None,
//! };
//! for secs in 0..10 {
//!     ctl.observe(&busy(secs));
//! }
//! assert_eq!(ctl.current(), GearId::Umac64); // as fast as the floor allows, and no further
//!
//! // A burst of failed verifications shifts to the strongest gear at once.
//! let mut attacked = busy(10);
//! attacked.local_auth_failures = 100;
//! assert!(ctl.observe(&attacked).is_some());
//! assert_eq!(ctl.current(), GearId::HmacSha256_128);
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use cohort_core::Timestamp;

use crate::cost::nominal_cost;
use crate::gear::{GearId, GearKind, GearSet, GearStatus};

/// Most entries the failure window keeps; older entries are merged (see [`Controller`]).
const MAX_WINDOW_ENTRIES: usize = 32;

/// What the controller may choose and how eagerly it shifts.
#[derive(Clone, Debug, PartialEq)]
pub struct ControllerConfig {
    /// Minimum [`forgery_bits`](crate::GearInfo::forgery_bits) of any gear the controller may
    /// choose. Must be finite and `>= 0`. [`GearId::DangerNullForTesting`] (0 bits) can be
    /// chosen only with a floor of `0.0` and only if it is in `gears`.
    pub floor_bits: f64,
    /// The gears both peers agreed on.
    pub gears: GearSet,
    /// Choose AEAD gears only, so that load never turns encryption off.
    pub require_privacy: bool,
    /// Load above this (strictly) for [`dwell`](Self::dwell) shifts one rung down (faster,
    /// weaker). `1.0` disables load-driven downshifts.
    pub high_load: f32,
    /// Load below this (strictly) for [`dwell`](Self::dwell) shifts one rung up (stronger).
    /// Must be `< high_load`; `0.0` disables load-driven upshifts.
    pub low_load: f32,
    /// How long the load must stay past a threshold before a shift, and the least time
    /// between a load-driven shift and the shift before it. Must be non-zero.
    pub dwell: Duration,
    /// This many new authentication failures (local and receiver's, together) within
    /// [`failure_window`](Self::failure_window) shift to the strongest gear at once.
    /// Must be at least 1.
    pub failure_burst: u32,
    /// The window over which failures are counted (inclusive: a failure exactly this old
    /// still counts).
    pub failure_window: Duration,
    /// After a burst, no load-driven downshift for this long (counted from the last
    /// observation at which the window still held a burst).
    pub failure_hold: Duration,
}

impl ControllerConfig {
    /// A configuration with the given floor and agreed gears and these defaults:
    /// `require_privacy` if `gears` has an AEAD gear meeting the floor; `high_load` 0.85;
    /// `low_load` 0.50; `dwell` 5 s; `failure_burst` 8 within a `failure_window` of 10 s;
    /// `failure_hold` 60 s.
    pub fn new(floor_bits: f64, gears: GearSet) -> Self {
        let require_privacy = gears
            .iter()
            .any(|g| g.info().kind == GearKind::Aead && g.info().forgery_bits >= floor_bits);
        ControllerConfig {
            floor_bits,
            gears,
            require_privacy,
            high_load: 0.85,
            low_load: 0.50,
            dwell: Duration::from_secs(5),
            failure_burst: 8,
            failure_window: Duration::from_secs(10),
            failure_hold: Duration::from_secs(60),
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let (low, high) = (self.low_load, self.high_load);
        if !(low.is_finite() && high.is_finite() && 0.0 <= low && low < high && high <= 1.0) {
            return Err(ConfigError::InvalidThresholds {
                low_load: low,
                high_load: high,
            });
        }
        if self.dwell.is_zero() {
            return Err(ConfigError::ZeroDwell);
        }
        if self.failure_burst == 0 {
            return Err(ConfigError::ZeroFailureBurst);
        }
        Ok(())
    }
}

/// Why a controller configuration (or a new floor) was refused.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The floor is NaN, infinite or negative.
    InvalidFloor {
        /// The floor given.
        floor_bits: f64,
    },
    /// No agreed gear (of the required kind) reaches the floor.
    NoGearMeetsFloor {
        /// The floor given.
        floor_bits: f64,
        /// Whether only AEAD gears were eligible.
        require_privacy: bool,
        /// The strongest eligible agreed gear's bound, if there is any eligible gear.
        best_bits: Option<f64>,
    },
    /// The load thresholds are not `0.0 <= low_load < high_load <= 1.0`.
    InvalidThresholds {
        /// The `low_load` given.
        low_load: f32,
        /// The `high_load` given.
        high_load: f32,
    },
    /// `dwell` is zero, which would disable hysteresis.
    ZeroDwell,
    /// `failure_burst` is zero, which would make every observation a burst.
    ZeroFailureBurst,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::InvalidFloor { floor_bits } => {
                write!(
                    f,
                    "security floor {floor_bits} is not a finite number of bits >= 0"
                )
            }
            ConfigError::NoGearMeetsFloor {
                floor_bits,
                require_privacy,
                best_bits,
            } => {
                let kind = if *require_privacy {
                    "AEAD gear"
                } else {
                    "gear"
                };
                match best_bits {
                    Some(best) => write!(
                        f,
                        "no agreed {kind} reaches the security floor of {floor_bits} bits \
                         (the strongest has {best})"
                    ),
                    None => write!(f, "no {kind} is agreed (security floor {floor_bits} bits)"),
                }
            }
            ConfigError::InvalidThresholds {
                low_load,
                high_load,
            } => write!(
                f,
                "load thresholds must satisfy 0 <= low_load < high_load <= 1, \
                 got low_load {low_load}, high_load {high_load}"
            ),
            ConfigError::ZeroDwell => f.write_str("dwell must be non-zero"),
            ConfigError::ZeroFailureBurst => f.write_str("failure_burst must be at least 1"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// One sample of the controller's inputs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Observation {
    /// When the sample was taken. A time earlier than an earlier sample's is treated as that
    /// earlier time: no time passes.
    pub now: Timestamp,
    /// This end's CPU load, `0.0` (idle) to `1.0` (saturated). Finite values outside that
    /// range are clamped into it; NaN and infinities are ignored (see [`Controller`]).
    pub local_load: f32,
    /// Failed verifications seen here, cumulative over the association. A value below the
    /// previous one is taken as a counter reset (see [`Controller`]).
    pub local_auth_failures: u64,
    /// The receiver's latest feedback, if any.
    pub receiver: Option<ReceiverFeedback>,
}

/// What the receiver reports back (ACSA 2.3: "observed authentication errors and processor
/// resource limitations in the receiver").
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReceiverFeedback {
    /// The receiver's CPU load, interpreted like [`Observation::local_load`].
    pub load: f32,
    /// Failed verifications at the receiver, cumulative, interpreted like
    /// [`Observation::local_auth_failures`].
    pub auth_failures: u64,
}

/// Why the controller shifted.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum ShiftReason {
    /// At least `failure_burst` authentication failures within `failure_window`.
    FailureBurst {
        /// Failures in the window when the burst was detected.
        failures: u64,
    },
    /// The load stayed above `high_load` for `dwell`: one rung down.
    HighLoad {
        /// The load (the busier side's) at the sample that triggered the shift.
        load: f32,
    },
    /// The load stayed below `low_load` for `dwell`: one rung up.
    LowLoad {
        /// The load (the busier side's) at the sample that triggered the shift.
        load: f32,
    },
    /// [`Controller::set_floor`] raised the floor above the current gear.
    FloorRaised {
        /// The new floor.
        floor_bits: f64,
    },
    /// [`Controller::retire`] took the current gear off the ladder.
    GearRetired {
        /// The retired gear.
        gear: GearId,
    },
}

impl fmt::Display for ShiftReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShiftReason::FailureBurst { failures } => {
                write!(f, "{failures} authentication failures in the window")
            }
            ShiftReason::HighLoad { load } => write!(f, "high load {load:.2}"),
            ShiftReason::LowLoad { load } => write!(f, "low load {load:.2}"),
            ShiftReason::FloorRaised { floor_bits } => {
                write!(f, "security floor raised to {floor_bits} bits")
            }
            ShiftReason::GearRetired { gear } => {
                write!(f, "{gear} retired after too many failed verifications")
            }
        }
    }
}

/// A gear change.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shift {
    /// The gear before.
    pub from: GearId,
    /// The gear after (now [`Controller::current`]).
    pub to: GearId,
    /// Why.
    pub reason: ShiftReason,
}

impl fmt::Display for Shift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -> {} ({})", self.from, self.to, self.reason)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Band {
    High,
    Mid,
    Low,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Streak {
    band: Band,
    since: Timestamp,
}

/// Chooses the gear to send under (ACSA 2.3), never below the floor (ACSA 4.1).
///
/// # Policy
/// * **Ladder.** The agreed gears (AEAD only with `require_privacy`) whose
///   `forgery_bits >= floor_bits`, strongest first. Gears with equal bounds are one rung,
///   represented by the preferred one: standard before experimental, then the lowest
///   [`nominal_cost`], then the shortest tag, then the lowest wire id. (The others give the
///   same security for more work, so stepping between them would waste a dwell.) The ladder
///   is strictly decreasing in `forgery_bits`.
/// * **Failures.** Both cumulative counters (local and the receiver's) are turned into
///   deltas against the previous value seen; both baselines start at 0 (counters count from
///   the start of the association). A counter that goes down was reset: its delta is its
///   new value (the failures since the reset, at least). Deltas saturate; nothing
///   underflows. Receiver feedback that is absent leaves the receiver baseline as it was.
/// * **Burst.** If the window holds `failure_burst` or more failures, jump straight to
///   `ladder[0]` (no dwell) and hold: no load-driven downshift until `failure_hold` after
///   the last observation at which the window held a burst. Any failure still in the window
///   also vetoes a downshift, burst or not: no weakening while someone is probing.
/// * **Load.** The larger of the local and the receiver's load (the busier side
///   constrains). Finite loads are clamped into `0.0..=1.0`; a NaN or infinite load is
///   ignored, and if neither side has a usable load the sample is "unknown". A downshift
///   (one rung) needs the load above `high_load` at every sample for at least `dwell`; an
///   upshift (one rung) needs it below `low_load` at every sample for `dwell`. A mid or
///   unknown sample breaks the streak. Both also need `dwell` since the previous shift, and
///   a shift restarts the streak, so load-driven shifts are at least `dwell` apart.
/// * **Time.** The controller's clock is the latest `now` seen; an earlier `now` counts as
///   that latest time, so time never runs backwards and a stale sample cannot satisfy a
///   dwell. Its failures still count.
/// * **Memory.** The window keeps at most 32 entries; when full, the two oldest merge under
///   the later timestamp, so failures may be remembered slightly longer than
///   `failure_window`, never shorter.
#[derive(Clone, Debug, PartialEq)]
pub struct Controller {
    config: ControllerConfig,
    /// Non-empty; `pos < ladder.len()`.
    ladder: Vec<GearId>,
    pos: usize,
    clock: Option<Timestamp>,
    streak: Option<Streak>,
    last_shift: Option<Timestamp>,
    hold_until: Option<Timestamp>,
    last_local_failures: u64,
    last_receiver_failures: u64,
    /// (time, new failures), times non-decreasing.
    window: VecDeque<(Timestamp, u64)>,
}

impl Controller {
    /// A controller for `config`, starting at the strongest allowed gear.
    pub fn new(config: ControllerConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let ladder = build_ladder(config.gears, config.floor_bits, config.require_privacy)?;
        Ok(Controller {
            config,
            ladder,
            pos: 0,
            clock: None,
            streak: None,
            last_shift: None,
            hold_until: None,
            last_local_failures: 0,
            last_receiver_failures: 0,
            window: VecDeque::new(),
        })
    }

    /// The gear to send under now.
    pub fn current(&self) -> GearId {
        self.ladder[self.pos]
    }

    /// The top of the ladder: the gear a burst shifts to, and the one to use for a companion
    /// strong tag (ACSA 3.4) or for control traffic.
    pub fn strongest(&self) -> GearId {
        self.ladder[0]
    }

    /// The gears the controller may choose, strongest first (see [`Controller`] for ties).
    pub fn ladder(&self) -> &[GearId] {
        &self.ladder
    }

    /// The configuration in force (with the floor as last set).
    pub fn config(&self) -> &ControllerConfig {
        &self.config
    }

    /// Takes one sample of the inputs; returns the shift it caused, if any. The gear after
    /// this sample is [`current`](Self::current).
    pub fn observe(&mut self, obs: &Observation) -> Option<Shift> {
        let now = match self.clock {
            Some(latest) if latest > obs.now => latest,
            _ => obs.now,
        };
        self.clock = Some(now);

        let new_failures = self.new_failures(obs);
        self.record_failures(now, new_failures);
        let in_window = self.failures_in_window(now);
        let load = effective_load(obs);
        let band = load.map(|l| self.band(l));
        self.streak = match (band, self.streak) {
            (None, _) => None,
            (Some(b), Some(s)) if s.band == b => Some(s),
            (Some(b), _) => Some(Streak {
                band: b,
                since: now,
            }),
        };

        if in_window >= u64::from(self.config.failure_burst) {
            self.hold_until = Some(now.saturating_add(self.config.failure_hold));
            if self.pos == 0 {
                return None;
            }
            return Some(self.shift_to(
                0,
                now,
                ShiftReason::FailureBurst {
                    failures: in_window,
                },
            ));
        }

        let (Some(streak), Some(load)) = (self.streak, load) else {
            return None;
        };
        let dwell = self.config.dwell;
        let dwelt = now.saturating_duration_since(streak.since) >= dwell
            && self
                .last_shift
                .is_none_or(|t| now.saturating_duration_since(t) >= dwell);
        if !dwelt {
            return None;
        }
        match streak.band {
            Band::High => {
                let holding = self.hold_until.is_some_and(|h| now < h);
                if self.pos + 1 < self.ladder.len() && !holding && in_window == 0 {
                    Some(self.shift_to(self.pos + 1, now, ShiftReason::HighLoad { load }))
                } else {
                    None
                }
            }
            Band::Low if self.pos > 0 => {
                Some(self.shift_to(self.pos - 1, now, ShiftReason::LowLoad { load }))
            }
            Band::Low | Band::Mid => None,
        }
    }

    /// Changes the floor at run time (a policy change). Lowering it only lengthens the
    /// ladder; raising it above the current gear moves at once to the weakest gear that meets
    /// it. On error (invalid floor, or no gear meets it) nothing changes.
    pub fn set_floor(&mut self, floor_bits: f64) -> Result<Option<Shift>, ConfigError> {
        let ladder = build_ladder(self.config.gears, floor_bits, self.config.require_privacy)?;
        let from = self.current();
        let (pos, shift) = match ladder.iter().position(|&g| g == from) {
            Some(pos) => (pos, None),
            None => {
                // Tie-breaks do not depend on the floor, so `from` is missing only because it is
                // below the new floor: every rung of the new ladder is stronger.
                let pos = ladder.len().saturating_sub(1);
                let reason = ShiftReason::FloorRaised { floor_bits };
                (
                    pos,
                    Some(Shift {
                        from,
                        to: ladder[pos],
                        reason,
                    }),
                )
            }
        };
        self.config.floor_bits = floor_bits;
        self.ladder = ladder;
        self.pos = pos;
        if shift.is_some() {
            // No time comes with a policy change; restart the dwell from the latest sample.
            self.last_shift = self.clock;
            if let (Some(s), Some(t)) = (self.streak.as_mut(), self.clock) {
                s.since = t;
            }
        }
        Ok(shift)
    }

    /// Takes `gear` off the ladder for good, e.g. because the receiver retired it after too
    /// many failed verifications (its integrity limit): sending under it would only be
    /// dropped. If it was the current gear, moves to the next stronger rung (or, at the top,
    /// to the new top). On error (nothing would be left) nothing changes.
    pub fn retire(&mut self, gear: GearId) -> Result<Option<Shift>, ConfigError> {
        if !self.config.gears.contains(gear) {
            return Ok(None);
        }
        let mut gears = self.config.gears;
        gears.remove(gear);
        let ladder = build_ladder(gears, self.config.floor_bits, self.config.require_privacy)?;
        let from = self.current();
        let pos = match ladder.iter().position(|&g| g == from) {
            Some(pos) => pos,
            // The current gear was retired: the rung above it (rungs above the current one
            // are all still on the new ladder, in the same order, unless one was retired).
            None => ladder
                .iter()
                .rposition(|g| g.info().forgery_bits > from.info().forgery_bits)
                .unwrap_or(0),
        };
        self.config.gears = gears;
        self.ladder = ladder;
        self.pos = pos;
        if self.current() == from {
            return Ok(None);
        }
        self.last_shift = self.clock;
        Ok(Some(Shift {
            from,
            to: self.current(),
            reason: ShiftReason::GearRetired { gear },
        }))
    }

    fn shift_to(&mut self, pos: usize, now: Timestamp, reason: ShiftReason) -> Shift {
        let from = self.current();
        self.pos = pos;
        self.last_shift = Some(now);
        if let Some(s) = self.streak.as_mut() {
            s.since = now;
        }
        Shift {
            from,
            to: self.current(),
            reason,
        }
    }

    fn band(&self, load: f32) -> Band {
        if load > self.config.high_load {
            Band::High
        } else if load < self.config.low_load {
            Band::Low
        } else {
            Band::Mid
        }
    }

    fn new_failures(&mut self, obs: &Observation) -> u64 {
        let local = counter_delta(&mut self.last_local_failures, obs.local_auth_failures);
        let receiver = match obs.receiver {
            Some(r) => counter_delta(&mut self.last_receiver_failures, r.auth_failures),
            None => 0,
        };
        local.saturating_add(receiver)
    }

    fn record_failures(&mut self, now: Timestamp, count: u64) {
        if count == 0 {
            return;
        }
        if let Some(last) = self.window.back_mut() {
            if last.0 == now {
                last.1 = last.1.saturating_add(count);
                return;
            }
        }
        if self.window.len() >= MAX_WINDOW_ENTRIES {
            if let Some((_, oldest)) = self.window.pop_front() {
                if let Some(next) = self.window.front_mut() {
                    next.1 = next.1.saturating_add(oldest);
                }
            }
        }
        self.window.push_back((now, count));
    }

    fn failures_in_window(&mut self, now: Timestamp) -> u64 {
        while let Some(&(t, _)) = self.window.front() {
            if now.saturating_duration_since(t) > self.config.failure_window {
                self.window.pop_front();
            } else {
                break;
            }
        }
        self.window
            .iter()
            .fold(0u64, |sum, &(_, n)| sum.saturating_add(n))
    }
}

/// The delta of a cumulative counter since `*prev`, treating a decrease as a reset.
fn counter_delta(prev: &mut u64, now: u64) -> u64 {
    let delta = now.checked_sub(*prev).unwrap_or(now);
    *prev = now;
    delta
}

fn sanitize_load(load: f32) -> Option<f32> {
    load.is_finite().then(|| load.clamp(0.0, 1.0))
}

/// The busier side's load, or `None` if neither side reported a usable one.
fn effective_load(obs: &Observation) -> Option<f32> {
    let local = sanitize_load(obs.local_load);
    let remote = obs.receiver.and_then(|r| sanitize_load(r.load));
    match (local, remote) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

fn status_rank(status: GearStatus) -> u8 {
    match status {
        GearStatus::Standard => 0,
        GearStatus::Experimental => 1,
        GearStatus::Danger => 2,
    }
}

fn build_ladder(
    gears: GearSet,
    floor_bits: f64,
    require_privacy: bool,
) -> Result<Vec<GearId>, ConfigError> {
    if !floor_bits.is_finite() || floor_bits < 0.0 {
        return Err(ConfigError::InvalidFloor { floor_bits });
    }
    // The null gear is chosen only when it is the whole set: an explicit no-security stack
    // for comparison, never a rung that load could push a sender down to.
    let null_only = gears.iter().all(|g| g == GearId::DangerNullForTesting);
    let eligible = |g: &GearId| {
        (!require_privacy || g.info().kind == GearKind::Aead)
            && (*g != GearId::DangerNullForTesting || null_only)
    };
    let mut ladder: Vec<GearId> = gears
        .iter()
        .filter(eligible)
        .filter(|g| g.info().forgery_bits >= floor_bits)
        .collect();
    if ladder.is_empty() {
        let best_bits = gears
            .iter()
            .filter(eligible)
            .map(|g| g.info().forgery_bits)
            .reduce(f64::max);
        return Err(ConfigError::NoGearMeetsFloor {
            floor_bits,
            require_privacy,
            best_bits,
        });
    }
    ladder.sort_by(|a, b| {
        let (ia, ib) = (a.info(), b.info());
        ib.forgery_bits
            .total_cmp(&ia.forgery_bits)
            .then(status_rank(ia.status).cmp(&status_rank(ib.status)))
            .then(nominal_cost(*a).cmp(&nominal_cost(*b)))
            .then(ia.tag_len.cmp(&ib.tag_len))
            .then(a.cmp(b))
    });
    ladder.dedup_by(|later, kept| {
        later
            .info()
            .forgery_bits
            .total_cmp(&kept.info().forgery_bits)
            .is_eq()
    });
    Ok(ladder)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gear::ALL_GEARS;
    use proptest::prelude::*;

    const DWELL_MS: u64 = 1_000;

    fn set(gears: &[GearId]) -> GearSet {
        gears.iter().copied().collect()
    }

    /// Four MAC rungs: 128, 90, 60, 30 bits.
    fn macs() -> GearSet {
        set(&[
            GearId::HmacSha256_128,
            GearId::Umac96,
            GearId::Umac64,
            GearId::Umac32,
        ])
    }

    fn config(floor_bits: f64, gears: GearSet) -> ControllerConfig {
        let mut c = ControllerConfig::new(floor_bits, gears);
        c.dwell = Duration::from_millis(DWELL_MS);
        c.failure_burst = 5;
        c.failure_window = Duration::from_secs(2);
        c.failure_hold = Duration::from_secs(10);
        c
    }

    fn obs(ms: u64, load: f32, failures: u64) -> Observation {
        Observation {
            now: Timestamp::from_millis(ms),
            local_load: load,
            local_auth_failures: failures,
            receiver: None,
        }
    }

    /// Feeds `load` every 100 ms over `[from, to)`; returns the shifts.
    fn run(ctl: &mut Controller, from: u64, to: u64, load: f32, failures: u64) -> Vec<Shift> {
        (from..to)
            .step_by(100)
            .filter_map(|ms| ctl.observe(&obs(ms, load, failures)))
            .collect()
    }

    #[test]
    fn ladder_is_filtered_by_the_floor_and_strongest_first() {
        let ctl = Controller::new(config(60.0, macs())).unwrap();
        assert_eq!(
            ctl.ladder(),
            &[GearId::HmacSha256_128, GearId::Umac96, GearId::Umac64]
        );
        assert_eq!(ctl.current(), GearId::HmacSha256_128);
        assert_eq!(ctl.strongest(), GearId::HmacSha256_128);
        assert_eq!(ctl.config().floor_bits, 60.0);
    }

    #[test]
    fn ties_collapse_to_the_preferred_gear() {
        let mut c = config(0.0, GearSet::all_secure());
        c.require_privacy = false;
        let ctl = Controller::new(c).unwrap();
        let ladder = ctl.ladder();
        // 128 bits: hmac-sha256 and hmac-sha256-128 cost the same; the shorter tag wins;
        // blake3-128 costs more.
        assert_eq!(ladder[0], GearId::HmacSha256_128);
        // 116 bits: gmac is cheaper than either AES-GCM.
        assert!(ladder.contains(&GearId::GmacAes128));
        assert!(!ladder.contains(&GearId::Aes128Gcm) && !ladder.contains(&GearId::Aes256Gcm));
        // 30 bits: the standard umac-32 before the experimental ifg.
        assert!(ladder.contains(&GearId::Umac32) && !ladder.contains(&GearId::IfgExperimental));
        assert_eq!(*ladder.last().unwrap(), GearId::Partial256);
        for pair in ladder.windows(2) {
            assert!(
                pair[0].info().forgery_bits > pair[1].info().forgery_bits,
                "{pair:?}"
            );
        }
        assert!(!ladder.contains(&GearId::DangerNullForTesting));
    }

    #[test]
    fn null_gear_only_alone_and_with_a_zero_floor() {
        // Next to any other gear, the null gear is never a rung (load must not reach it).
        let gears = set(&[GearId::DangerNullForTesting, GearId::Partial256]);
        let ctl = Controller::new(config(0.0, gears)).unwrap();
        assert_eq!(ctl.ladder(), &[GearId::Partial256]);
        let ctl = Controller::new(config(0.001, gears)).unwrap();
        assert_eq!(ctl.ladder(), &[GearId::Partial256]);
        let only_null = set(&[GearId::DangerNullForTesting]);
        assert!(Controller::new(config(0.001, only_null)).is_err());
        assert_eq!(
            Controller::new(config(0.0, only_null)).unwrap().current(),
            only_null.iter().next().unwrap()
        );
    }

    #[test]
    fn privacy_is_required_when_an_aead_gear_is_agreed() {
        let gears = set(&[
            GearId::ChaCha20Poly1305,
            GearId::Aes128Gcm,
            GearId::HmacSha256,
            GearId::Umac32,
        ]);
        let c = config(30.0, gears);
        assert!(c.require_privacy);
        let ctl = Controller::new(c.clone()).unwrap();
        assert_eq!(ctl.ladder(), &[GearId::Aes128Gcm, GearId::ChaCha20Poly1305]);
        // The AEADs are below a 120-bit floor, so privacy cannot be had: the default is off.
        assert!(!config(120.0, gears).require_privacy);
        // Asking for privacy that no gear reaching the floor gives is a configuration error.
        let mut strict = config(120.0, gears);
        strict.require_privacy = true;
        assert_eq!(
            Controller::new(strict).unwrap_err(),
            ConfigError::NoGearMeetsFloor {
                floor_bits: 120.0,
                require_privacy: true,
                best_bits: Some(116.0)
            }
        );
        assert!(!config(0.0, macs()).require_privacy);
    }

    #[test]
    fn retiring_gears_moves_up_and_never_empties_the_ladder() {
        let gears = set(&[GearId::HmacSha256, GearId::Umac64, GearId::Umac32]);
        let mut ctl = Controller::new(config(0.0, gears)).unwrap();
        // Retiring a gear that is not current changes the ladder only.
        assert_eq!(ctl.retire(GearId::Umac64).unwrap(), None);
        assert_eq!(ctl.ladder(), &[GearId::HmacSha256, GearId::Umac32]);
        // Push down to umac-32 with sustained load, then retire it: back up to hmac-sha256.
        let mut t = 0;
        while ctl.current() != GearId::Umac32 {
            t += 100;
            assert!(t < 100_000, "never reached umac-32");
            ctl.observe(&obs(t, 0.99, 0));
        }
        let shift = ctl.retire(GearId::Umac32).unwrap().unwrap();
        assert_eq!((shift.from, shift.to), (GearId::Umac32, GearId::HmacSha256));
        assert!(matches!(
            shift.reason,
            ShiftReason::GearRetired {
                gear: GearId::Umac32
            }
        ));
        // The last gear cannot go: that would leave nothing to send under.
        let before = ctl.clone();
        assert!(ctl.retire(GearId::HmacSha256).is_err());
        assert_eq!(ctl, before);
        // Retiring again, or a gear never agreed, is a no-op.
        assert_eq!(ctl.retire(GearId::Umac32).unwrap(), None);
        assert_eq!(ctl.retire(GearId::Aes128Gcm).unwrap(), None);
    }

    #[test]
    fn configuration_errors_are_detailed() {
        assert_eq!(
            Controller::new(config(129.0, macs())).unwrap_err(),
            ConfigError::NoGearMeetsFloor {
                floor_bits: 129.0,
                require_privacy: false,
                best_bits: Some(128.0)
            }
        );
        assert_eq!(
            Controller::new(config(1.0, GearSet::empty())).unwrap_err(),
            ConfigError::NoGearMeetsFloor {
                floor_bits: 1.0,
                require_privacy: false,
                best_bits: None
            }
        );
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0] {
            assert!(matches!(
                Controller::new(config(bad, macs())).unwrap_err(),
                ConfigError::InvalidFloor { .. }
            ));
        }
        for (low, high) in [
            (0.5, 0.5),
            (0.9, 0.1),
            (-0.1, 0.5),
            (0.1, 1.1),
            (f32::NAN, 0.5),
            (0.1, f32::INFINITY),
        ] {
            let mut c = config(0.0, macs());
            c.low_load = low;
            c.high_load = high;
            assert!(
                matches!(
                    Controller::new(c).unwrap_err(),
                    ConfigError::InvalidThresholds { .. }
                ),
                "{low} {high}"
            );
        }
        let mut c = config(0.0, macs());
        c.dwell = Duration::ZERO;
        assert_eq!(Controller::new(c).unwrap_err(), ConfigError::ZeroDwell);
        let mut c = config(0.0, macs());
        c.failure_burst = 0;
        assert_eq!(
            Controller::new(c).unwrap_err(),
            ConfigError::ZeroFailureBurst
        );
        let msg = ConfigError::NoGearMeetsFloor {
            floor_bits: 129.0,
            require_privacy: false,
            best_bits: Some(128.0),
        }
        .to_string();
        assert!(msg.contains("129") && msg.contains("128"), "{msg}");
    }

    #[test]
    fn sustained_high_load_steps_down_one_rung_per_dwell_to_the_floor() {
        let mut ctl = Controller::new(config(30.0, macs())).unwrap();
        let shifts = run(&mut ctl, 0, 20_000, 0.95, 0);
        let tos: Vec<GearId> = shifts.iter().map(|s| s.to).collect();
        assert_eq!(tos, vec![GearId::Umac96, GearId::Umac64, GearId::Umac32]);
        for s in &shifts {
            assert!(matches!(s.reason, ShiftReason::HighLoad { load } if load == 0.95));
        }
        assert_eq!(ctl.current(), GearId::Umac32);
        // Exactly one dwell per rung: the first at 1 s, then every second.
        let mut ctl = Controller::new(config(30.0, macs())).unwrap();
        for ms in (0..3_000).step_by(100) {
            let shift = ctl.observe(&obs(ms, 0.95, 0));
            assert_eq!(
                shift.is_some(),
                ms == 1_000 || ms == 2_000,
                "at {ms} ms: {shift:?}"
            );
        }
    }

    #[test]
    fn low_load_steps_back_up() {
        let mut ctl = Controller::new(config(30.0, macs())).unwrap();
        run(&mut ctl, 0, 10_000, 0.95, 0);
        assert_eq!(ctl.current(), GearId::Umac32);
        let shifts = run(&mut ctl, 10_000, 11_000, 0.1, 0);
        assert!(shifts.is_empty(), "{shifts:?}");
        let shifts = run(&mut ctl, 11_000, 30_000, 0.1, 0);
        let tos: Vec<GearId> = shifts.iter().map(|s| s.to).collect();
        assert_eq!(
            tos,
            vec![GearId::Umac64, GearId::Umac96, GearId::HmacSha256_128]
        );
        assert!(shifts
            .iter()
            .all(|s| matches!(s.reason, ShiftReason::LowLoad { .. })));
    }

    #[test]
    fn load_between_the_thresholds_never_shifts() {
        let mut ctl = Controller::new(config(30.0, macs())).unwrap();
        run(&mut ctl, 0, 1_500, 0.95, 0);
        assert_eq!(ctl.current(), GearId::Umac96);
        assert!(run(&mut ctl, 1_500, 60_000, 0.7, 0).is_empty());
        assert_eq!(ctl.current(), GearId::Umac96);
    }

    #[test]
    fn a_burst_goes_to_the_top_and_the_hold_keeps_it_there() {
        let mut ctl = Controller::new(config(30.0, macs())).unwrap();
        run(&mut ctl, 0, 10_000, 0.95, 0);
        assert_eq!(ctl.current(), GearId::Umac32);
        // Five failures in one sample: a burst, despite the high load.
        let shift = ctl.observe(&obs(10_000, 0.95, 5)).unwrap();
        assert_eq!(shift.from, GearId::Umac32);
        assert_eq!(shift.to, GearId::HmacSha256_128);
        assert_eq!(shift.reason, ShiftReason::FailureBurst { failures: 5 });
        assert!(
            shift.to_string().contains("umac-32 -> hmac-sha256-128"),
            "{shift}"
        );
        // The failures stay in the 2 s window until 12 s, and the 10 s hold runs from the last
        // sample that still saw the burst: the top is kept until 22 s despite high load.
        assert!(run(&mut ctl, 10_100, 22_000, 0.95, 5).is_empty());
        assert_eq!(ctl.current(), GearId::HmacSha256_128);
        // Once it expires, high load steps down again, one rung per dwell.
        let shifts = run(&mut ctl, 22_000, 23_000, 0.95, 5);
        assert_eq!(shifts.len(), 1, "{shifts:?}");
        assert_eq!(shifts[0].from, GearId::HmacSha256_128);
        assert_eq!(shifts[0].to, GearId::Umac96);
    }

    #[test]
    fn failures_spread_within_the_window_add_up() {
        let mut ctl = Controller::new(config(30.0, macs())).unwrap();
        run(&mut ctl, 0, 1_100, 0.95, 0);
        assert_eq!(ctl.current(), GearId::Umac96);
        // Two failures at 1.1 s, two at 2.1 s: below the burst, but they veto downshifts.
        assert_eq!(ctl.observe(&obs(1_100, 0.95, 2)), None);
        assert_eq!(ctl.observe(&obs(2_100, 0.95, 4)), None);
        assert_eq!(ctl.current(), GearId::Umac96);
        // The fifth failure at 3.1 s: 1.1 s is outside the 2 s window, 2.1 s is inside: 3.
        assert_eq!(ctl.observe(&obs(3_200, 0.95, 5)), None);
        // Two more at 3.3 s: 2 + 1 + 2 = 5 within the window.
        let shift = ctl.observe(&obs(3_300, 0.95, 7)).unwrap();
        assert_eq!(shift.reason, ShiftReason::FailureBurst { failures: 5 });
    }

    #[test]
    fn receiver_load_alone_shifts_down() {
        let mut ctl = Controller::new(config(30.0, macs())).unwrap();
        let mut shifts = Vec::new();
        for ms in (0..1_500).step_by(100) {
            let mut o = obs(ms, 0.1, 0);
            o.receiver = Some(ReceiverFeedback {
                load: 0.99,
                auth_failures: 0,
            });
            shifts.extend(ctl.observe(&o));
        }
        assert_eq!(shifts.len(), 1);
        assert_eq!(shifts[0].to, GearId::Umac96);
        assert_eq!(shifts[0].reason, ShiftReason::HighLoad { load: 0.99 });
    }

    #[test]
    fn receiver_failures_count_and_resets_do_not_underflow() {
        let mut ctl = Controller::new(config(30.0, macs())).unwrap();
        run(&mut ctl, 0, 2_100, 0.95, 0);
        assert_eq!(ctl.current(), GearId::Umac64);
        let fb = |ms, failures| Observation {
            receiver: Some(ReceiverFeedback {
                load: 0.95,
                auth_failures: failures,
            }),
            ..obs(ms, 0.95, 0)
        };
        // A receiver that has seen a billion failures before the association's first sample
        // and then resets its counter: both count (from 0, and the value after the reset).
        assert_eq!(ctl.observe(&fb(2_100, 3)), None);
        assert_eq!(ctl.observe(&fb(2_200, 1)), None); // reset: +1, 4 in the window
        let shift = ctl.observe(&fb(2_300, 2)).unwrap(); // +1: 5
        assert_eq!(shift.reason, ShiftReason::FailureBurst { failures: 5 });
        ctl.observe(&fb(2_400, u64::MAX));
        ctl.observe(&fb(2_500, 0));
        ctl.observe(&fb(2_600, u64::MAX));
        assert_eq!(ctl.current(), GearId::HmacSha256_128);
    }

    #[test]
    fn local_failure_baseline_starts_at_zero() {
        let mut ctl = Controller::new(config(30.0, macs())).unwrap();
        run(&mut ctl, 0, 1_100, 0.95, 0);
        assert_eq!(ctl.current(), GearId::Umac96);
        let mut ctl2 = Controller::new(config(30.0, macs())).unwrap();
        assert_eq!(ctl2.observe(&obs(0, 0.95, 7)), None); // at the top already; but held
        assert!(run(&mut ctl2, 100, 9_000, 0.95, 7).is_empty());
    }

    #[test]
    fn unusable_loads_are_ignored_and_break_the_streak() {
        let mut ctl = Controller::new(config(30.0, macs())).unwrap();
        for ms in (0..5_000).step_by(100) {
            // Every fifth sample is garbage: the 1 s streak never completes.
            let load = if ms % 500 == 0 { f32::NAN } else { 0.95 };
            assert_eq!(ctl.observe(&obs(ms, load, 0)), None, "at {ms}");
        }
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut ctl = Controller::new(config(30.0, macs())).unwrap();
            assert!(run(&mut ctl, 0, 10_000, bad, 0).is_empty());
            assert_eq!(ctl.current(), GearId::HmacSha256_128);
        }
        // Out-of-range finite loads are clamped: 7.0 is saturated, -3.0 is idle.
        let mut ctl = Controller::new(config(30.0, macs())).unwrap();
        let shifts = run(&mut ctl, 0, 1_100, 7.0, 0);
        assert_eq!(shifts[0].reason, ShiftReason::HighLoad { load: 1.0 });
        let shifts = run(&mut ctl, 1_100, 2_300, -3.0, 0);
        assert_eq!(shifts[0].reason, ShiftReason::LowLoad { load: 0.0 });
        // A NaN on one side leaves the other side's load in charge.
        let mut ctl = Controller::new(config(30.0, macs())).unwrap();
        for ms in (0..1_100).step_by(100) {
            let mut o = obs(ms, f32::NAN, 0);
            o.receiver = Some(ReceiverFeedback {
                load: 0.9,
                auth_failures: 0,
            });
            ctl.observe(&o);
        }
        assert_eq!(ctl.current(), GearId::Umac96);
    }

    #[test]
    fn time_going_backwards_is_no_time_passing() {
        let mut ctl = Controller::new(config(30.0, macs())).unwrap();
        ctl.observe(&obs(50_000, 0.95, 0));
        for ms in (0..50_000).step_by(100) {
            assert_eq!(ctl.observe(&obs(ms, 0.95, 0)), None, "at {ms}");
        }
        assert!(run(&mut ctl, 50_000, 51_000, 0.95, 0).is_empty());
        assert_eq!(
            ctl.observe(&obs(51_000, 0.95, 0)).map(|s| s.to),
            Some(GearId::Umac96)
        );
        assert_eq!(ctl.observe(&obs(0, 0.95, 0)), None);
        // Failures in a stale sample still count.
        assert!(ctl.observe(&obs(0, 0.95, 5)).is_some());
        assert_eq!(ctl.current(), GearId::HmacSha256_128);
    }

    #[test]
    fn raising_the_floor_moves_up_at_once_and_lowering_it_does_not_move() {
        let mut ctl = Controller::new(config(30.0, macs())).unwrap();
        run(&mut ctl, 0, 10_000, 0.95, 0);
        assert_eq!(ctl.current(), GearId::Umac32);
        let shift = ctl.set_floor(60.0).unwrap().unwrap();
        assert_eq!(shift.from, GearId::Umac32);
        assert_eq!(shift.to, GearId::Umac64);
        assert_eq!(shift.reason, ShiftReason::FloorRaised { floor_bits: 60.0 });
        assert_eq!(ctl.current(), GearId::Umac64);
        assert_eq!(ctl.config().floor_bits, 60.0);
        // Still at the ladder's end: high load cannot go further.
        assert!(run(&mut ctl, 10_000, 20_000, 0.95, 0).is_empty());
        // Lowering keeps the gear; the ladder grows and load may use it after a dwell.
        assert_eq!(ctl.set_floor(0.0), Ok(None));
        assert_eq!(ctl.current(), GearId::Umac64);
        assert_eq!(ctl.ladder().len(), 4);
        assert_eq!(run(&mut ctl, 20_000, 21_100, 0.95, 0).len(), 1);
        assert_eq!(ctl.current(), GearId::Umac32);
        // Raising to the top's own bound.
        assert_eq!(
            ctl.set_floor(128.0).unwrap().map(|s| s.to),
            Some(GearId::HmacSha256_128)
        );
        assert_eq!(ctl.ladder(), &[GearId::HmacSha256_128]);
    }

    #[test]
    fn a_refused_floor_changes_nothing() {
        let mut ctl = Controller::new(config(30.0, macs())).unwrap();
        run(&mut ctl, 0, 3_000, 0.95, 1);
        let before = ctl.clone();
        for bad in [128.5, 1e300, f64::INFINITY, f64::NAN, -0.5] {
            assert!(ctl.set_floor(bad).is_err());
            assert_eq!(ctl, before);
        }
    }

    #[test]
    fn the_failure_window_stays_small() {
        let mut c = config(30.0, macs());
        c.failure_burst = u32::MAX;
        c.failure_window = Duration::from_secs(1_000_000);
        let mut ctl = Controller::new(c).unwrap();
        for i in 0..10_000u64 {
            ctl.observe(&obs(i, 0.5, i));
            assert!(ctl.window.len() <= MAX_WINDOW_ENTRIES);
        }
        // Merged, not forgotten: 9_999 failures so far.
        assert_eq!(
            ctl.failures_in_window(Timestamp::from_millis(10_000)),
            9_999
        );
    }

    // ---- property tests ----

    #[derive(Clone, Debug)]
    enum Step {
        /// Forward by this many milliseconds.
        Forward(u64),
        /// To this absolute time (often backwards).
        Jump(u64),
    }

    #[derive(Clone, Copy, Debug)]
    enum Counter {
        Add(u64),
        Set(u64),
    }

    impl Counter {
        fn apply(self, value: u64) -> u64 {
            match self {
                Counter::Add(n) => value.saturating_add(n),
                Counter::Set(v) => v,
            }
        }
    }

    #[derive(Clone, Debug)]
    struct Sample {
        step: Step,
        local_load: f32,
        local: Counter,
        receiver: Option<(f32, Counter)>,
        floor: Option<f64>,
    }

    /// `lo/1000 ..= hi/1000`. (Integer-based: proptest's f32 range sampler trips a debug
    /// assertion now and then.)
    fn fraction(lo: u16, hi: u16) -> impl Strategy<Value = f32> {
        (lo..=hi).prop_map(|n| f32::from(n) / 1_000.0)
    }

    fn arb_load() -> impl Strategy<Value = f32> {
        prop_oneof![
            4 => fraction(0, 1_000),
            1 => any::<f32>(),
            1 => prop::sample::select(vec![
                f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -1.0, -0.0, 0.0, 1.0, 2.0, f32::MAX,
            ]),
        ]
    }

    fn arb_counter() -> impl Strategy<Value = Counter> {
        prop_oneof![
            8 => Just(Counter::Add(0)),
            4 => (0u64..3).prop_map(Counter::Add),
            1 => (0u64..40).prop_map(Counter::Add),
            1 => (0u64..10).prop_map(Counter::Set),
            1 => any::<u64>().prop_map(Counter::Set),
        ]
    }

    fn arb_step() -> impl Strategy<Value = Step> {
        prop_oneof![
            10 => (0u64..3_000).prop_map(Step::Forward),
            1 => any::<u64>().prop_map(Step::Jump),
            1 => (0u64..100_000_000_000).prop_map(Step::Jump),
        ]
    }

    fn arb_floor() -> impl Strategy<Value = f64> {
        prop_oneof![
            prop::sample::select(vec![
                0.0, 0.5, 0.7, 30.0, 60.0, 90.0, 91.0, 116.0, 120.0, 128.0
            ]),
            (0u32..130_000).prop_map(|n| f64::from(n) / 1_000.0),
        ]
    }

    fn arb_sample(load: BoxedStrategy<f32>) -> impl Strategy<Value = Sample> {
        (
            arb_step(),
            load.clone(),
            arb_counter(),
            prop::option::of((load, arb_counter())),
            prop::option::weighted(0.02, arb_floor()),
        )
            .prop_map(|(step, local_load, local, receiver, floor)| Sample {
                step,
                local_load,
                local,
                receiver,
                floor,
            })
    }

    fn arb_config() -> impl Strategy<Value = ControllerConfig> {
        (
            prop::collection::vec(any::<bool>(), ALL_GEARS.len()),
            arb_floor(),
            any::<bool>(),
            (fraction(0, 900), fraction(10, 1_000)),
            1u64..5_000,
            1u32..20,
            0u64..5_000,
            0u64..20_000,
        )
            .prop_map(
                |(mask, floor, privacy, (low, gap), dwell, burst, window, hold)| {
                    let gears = ALL_GEARS
                        .iter()
                        .zip(mask)
                        .filter(|(_, m)| *m)
                        .map(|(g, _)| g.id)
                        .collect();
                    let mut c = ControllerConfig::new(floor, gears);
                    c.require_privacy = privacy;
                    c.low_load = low;
                    c.high_load = (low + gap).min(1.0);
                    c.dwell = Duration::from_millis(dwell);
                    c.failure_burst = burst;
                    c.failure_window = Duration::from_millis(window);
                    c.failure_hold = Duration::from_millis(hold);
                    c
                },
            )
    }

    /// Turns samples into observations, keeping the counters and the clock.
    struct Driver {
        now: u64,
        local: u64,
        receiver: u64,
    }

    impl Driver {
        fn new() -> Self {
            Driver {
                now: 0,
                local: 0,
                receiver: 0,
            }
        }

        fn next(&mut self, s: &Sample) -> Observation {
            self.now = match s.step {
                Step::Forward(ms) => self.now.saturating_add(ms.saturating_mul(1_000_000)),
                Step::Jump(t) => t,
            };
            self.local = s.local.apply(self.local);
            let receiver = s.receiver.map(|(load, c)| {
                self.receiver = c.apply(self.receiver);
                ReceiverFeedback {
                    load,
                    auth_failures: self.receiver,
                }
            });
            Observation {
                now: Timestamp::from_nanos(self.now),
                local_load: s.local_load,
                local_auth_failures: self.local,
                receiver,
            }
        }
    }

    /// The spec's failure counting, exactly (no merging): deltas, resets, an inclusive window.
    struct Reference {
        clock: Option<Timestamp>,
        first: Option<Timestamp>,
        local: u64,
        receiver: u64,
        events: Vec<(Timestamp, u64)>,
    }

    impl Reference {
        fn new() -> Self {
            Reference {
                clock: None,
                first: None,
                local: 0,
                receiver: 0,
                events: Vec::new(),
            }
        }

        /// Returns (new failures, failures within the window).
        fn observe(&mut self, o: &Observation, window: Duration) -> (u64, u64) {
            let now = self.clock.map_or(o.now, |c| c.max(o.now));
            self.clock = Some(now);
            self.first.get_or_insert(now);
            let delta = |prev: &mut u64, v: u64| {
                let d = if v >= *prev { v - *prev } else { v };
                *prev = v;
                d
            };
            let mut new = delta(&mut self.local, o.local_auth_failures);
            if let Some(r) = o.receiver {
                new = new.saturating_add(delta(&mut self.receiver, r.auth_failures));
            }
            self.events.push((now, new));
            let in_window = self
                .events
                .iter()
                .filter(|(t, _)| now.saturating_duration_since(*t) <= window)
                .fold(0u64, |a, (_, n)| a.saturating_add(*n));
            (new, in_window)
        }

        fn elapsed(&self) -> Duration {
            match (self.first, self.clock) {
                (Some(a), Some(b)) => b.saturating_duration_since(a),
                _ => Duration::ZERO,
            }
        }
    }

    fn check_invariants(ctl: &Controller) -> Result<(), TestCaseError> {
        let c = ctl.config();
        let cur = ctl.current();
        prop_assert!(c.gears.contains(cur), "{cur:?} not agreed");
        prop_assert!(
            cur.info().forgery_bits >= c.floor_bits,
            "{cur:?} below floor {}",
            c.floor_bits
        );
        prop_assert!(ctl.ladder().contains(&cur));
        prop_assert_eq!(ctl.strongest(), ctl.ladder()[0]);
        if c.require_privacy {
            prop_assert_eq!(cur.info().kind, GearKind::Aead);
        }
        if cur == GearId::DangerNullForTesting {
            prop_assert!(c.floor_bits <= 0.0);
        }
        for g in ctl.ladder() {
            prop_assert!(c.gears.contains(*g) && g.info().forgery_bits >= c.floor_bits);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Property 1 (and 4's no-panic half): whatever the inputs, including floor changes,
        /// the gear is agreed and at or above the floor.
        #[test]
        fn never_below_the_floor(
            config in arb_config(),
            samples in prop::collection::vec(arb_sample(arb_load().boxed()), 0..200),
        ) {
            let Ok(mut ctl) = Controller::new(config.clone()) else {
                // Refused only if no eligible agreed gear reaches the floor.
                let eligible_meets = config.gears.iter().any(|g| {
                    g.info().forgery_bits >= config.floor_bits
                        && (!config.require_privacy || g.info().kind == GearKind::Aead)
                });
                prop_assert!(!eligible_meets);
                return Ok(());
            };
            check_invariants(&ctl)?;
            let mut driver = Driver::new();
            for s in &samples {
                if let Some(floor) = s.floor {
                    let before = ctl.clone();
                    match ctl.set_floor(floor) {
                        Ok(Some(shift)) => {
                            let (to, from) = (shift.to.info(), shift.from.info());
                            prop_assert!(to.forgery_bits > from.forgery_bits);
                            prop_assert_eq!(shift.to, ctl.current());
                        }
                        Ok(None) => prop_assert_eq!(before.current(), ctl.current()),
                        Err(_) => prop_assert_eq!(&before, &ctl),
                    }
                    check_invariants(&ctl)?;
                }
                let before = ctl.current();
                let shift = ctl.observe(&driver.next(s));
                if let Some(shift) = shift {
                    prop_assert_eq!(shift.from, before);
                    prop_assert_eq!(shift.to, ctl.current());
                    prop_assert_ne!(shift.from, shift.to);
                } else {
                    prop_assert_eq!(before, ctl.current());
                }
                check_invariants(&ctl)?;
            }
        }

        /// Property 2: a burst within the window means the strongest gear right after it.
        /// Property 3: shifts are bounded by elapsed time over dwell plus bursts.
        #[test]
        fn bursts_go_to_the_top_and_shifts_are_bounded(
            config in arb_config(),
            samples in prop::collection::vec(arb_sample(arb_load().boxed()), 1..200),
            // Runs of one local load, so that streaks long enough to shift actually happen.
            blocks in prop::collection::vec((arb_load(), 1usize..40), 1..20),
        ) {
            let Ok(mut ctl) = Controller::new(config.clone()) else { return Ok(()) };
            let mut driver = Driver::new();
            let mut reference = Reference::new();
            let (mut load_shifts, mut burst_shifts, mut failing_samples) = (0u128, 0u128, 0u128);
            let loads = blocks.iter().flat_map(|&(l, n)| std::iter::repeat_n(l, n)).cycle();
            for (s, local_load) in samples.iter().zip(loads) {
                let o = Observation { local_load, ..driver.next(s) };
                let shift = ctl.observe(&o);
                let (new, in_window) = reference.observe(&o, config.failure_window);
                if new > 0 {
                    failing_samples += 1;
                }
                if in_window >= u64::from(config.failure_burst) {
                    prop_assert_eq!(ctl.current(), ctl.strongest());
                }
                match shift.map(|s| s.reason) {
                    Some(ShiftReason::FailureBurst { failures }) => {
                        burst_shifts += 1;
                        prop_assert!(failures >= u64::from(config.failure_burst));
                        prop_assert_eq!(ctl.current(), ctl.strongest());
                    }
                    Some(ShiftReason::HighLoad { .. } | ShiftReason::LowLoad { .. }) => {
                        load_shifts += 1;
                    }
                    Some(other) => prop_assert!(false, "unexpected {other:?}"),
                    None => {}
                }
            }
            let dwells = reference.elapsed().as_nanos() / config.dwell.as_nanos();
            prop_assert!(load_shifts <= dwells, "{load_shifts} load shifts in {dwells} dwells");
            prop_assert!(burst_shifts <= failing_samples);
            prop_assert!(load_shifts + burst_shifts <= 1 + dwells + failing_samples);
        }

        /// Property 3, second half: load strictly between the thresholds never shifts on load.
        #[test]
        fn mid_load_never_shifts_on_load(
            config in arb_config(),
            frac in prop::collection::vec((fraction(1, 999), fraction(1, 999)), 200),
            samples in prop::collection::vec(arb_sample(Just(0.0f32).boxed()), 1..200),
        ) {
            let Ok(mut ctl) = Controller::new(config.clone()) else { return Ok(()) };
            let (low, high) = (config.low_load, config.high_load);
            let mid = |f: f32| {
                let l = low + (high - low) * f;
                (l > low && l < high).then_some(l)
            };
            let mut driver = Driver::new();
            for (s, (a, b)) in samples.iter().zip(frac) {
                let mut o = driver.next(s);
                let (Some(a), Some(b)) = (mid(a), mid(b)) else { continue };
                o.local_load = a;
                if let Some(r) = o.receiver.as_mut() {
                    r.load = b;
                }
                if let Some(shift) = ctl.observe(&o) {
                    let is_burst = matches!(shift.reason, ShiftReason::FailureBurst { .. });
                    prop_assert!(is_burst, "{shift:?}");
                }
            }
        }

        /// Property 4: a floor no gear meets is refused and changes nothing.
        #[test]
        fn unreachable_floors_change_nothing(
            config in arb_config(),
            samples in prop::collection::vec(arb_sample(arb_load().boxed()), 0..100),
            excess in prop_oneof![
                (1u32..1_000_000_000).prop_map(|n| f64::from(n) / 1_000.0),
                Just(f64::INFINITY),
                Just(f64::NAN),
                Just(-1.0),
            ],
        ) {
            let Ok(mut ctl) = Controller::new(config) else { return Ok(()) };
            let mut driver = Driver::new();
            for s in &samples {
                ctl.observe(&driver.next(s));
            }
            let top = ctl.strongest().info().forgery_bits;
            let floor = if excess.is_finite() && excess > 0.0 { top + excess } else { excess };
            let before = ctl.clone();
            prop_assert!(ctl.set_floor(floor).is_err());
            prop_assert_eq!(&before, &ctl);
        }
    }
}
