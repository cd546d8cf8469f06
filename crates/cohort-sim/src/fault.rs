//! Fault rules: small judges that see each datagram and return a [`Verdict`].
//!
//! The simulator asks its rules in the order they were added; the first verdict other than
//! [`Verdict::Pass`] decides the datagram's fate and the rest are not asked. Rules see only
//! datagrams that have a destination node, fit the MTU and cross no partition.

use crate::log::PacketId;
use crate::node::NodeId;
use cohort_core::Timestamp;
use rand_core::RngCore;
use std::ops::Range;
use std::time::Duration;

/// What a rule sees of a datagram at send time.
#[derive(Clone, Copy, Debug)]
pub struct PacketView<'a> {
    /// The simulator's number for this datagram (as in the log).
    pub packet: PacketId,
    /// The sending node.
    pub from: NodeId,
    /// The destination node.
    pub to: NodeId,
    /// When it is sent.
    pub now: Timestamp,
    /// The datagram's bytes.
    pub bytes: &'a [u8],
}

/// A rule's decision about one datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No opinion: ask the next rule, and deliver normally if none objects.
    Pass,
    /// Never deliver it.
    Drop,
    /// Deliver it this much later than the link would.
    Delay(Duration),
    /// Deliver it twice; the copy arrives a little later (see
    /// [`SimConfig::duplicate_gap`](crate::SimConfig::duplicate_gap)).
    Duplicate,
    /// Hold it back so that datagrams sent after it arrive first (see
    /// [`SimConfig::reorder_window`](crate::SimConfig::reorder_window)).
    Reorder,
    /// Flip one randomly chosen bit of the payload; the log records which. A datagram with
    /// no bytes passes unchanged.
    Tamper,
}

/// A fault injector consulted for every datagram.
pub trait FaultRule {
    /// Name recorded in the log next to the verdicts this rule gives.
    fn name(&self) -> &str;

    /// Judges one datagram. Every random choice must come from `rng` (the simulation's
    /// seeded RNG) so that the seed replays the run.
    fn judge(&mut self, packet: &PacketView<'_>, rng: &mut dyn RngCore) -> Verdict;
}

/// True with probability `p`. `p <= 0` (or NaN) is never and `p >= 1` always; neither
/// consumes randomness, so adding a rule with probability zero leaves a run unchanged.
pub fn chance(rng: &mut dyn RngCore, p: f64) -> bool {
    if p >= 1.0 {
        return true;
    }
    if p.is_nan() || p <= 0.0 {
        return false;
    }
    // 53 random bits make a uniform float in [0, 1).
    let x = (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
    x < p
}

/// A number drawn uniformly from `[0, n)`; zero when `n` is zero (without drawing).
pub fn below(rng: &mut dyn RngCore, n: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    // Lemire's multiply-shift: the bias is below 2^-64 * n, far under anything a test sees.
    ((u128::from(rng.next_u64()) * u128::from(n)) >> 64) as u64
}

/// A duration drawn uniformly from `range` (nanosecond resolution); `range.start` when the
/// range is empty.
pub fn duration_in(rng: &mut dyn RngCore, range: Range<Duration>) -> Duration {
    let Some(span) = range.end.checked_sub(range.start) else {
        return range.start;
    };
    let span = u64::try_from(span.as_nanos()).unwrap_or(u64::MAX);
    range.start + Duration::from_nanos(below(rng, span))
}

/// Drops each datagram with probability `.0`.
#[derive(Clone, Debug)]
pub struct Loss(pub f64);

impl FaultRule for Loss {
    fn name(&self) -> &str {
        "loss"
    }
    fn judge(&mut self, _packet: &PacketView<'_>, rng: &mut dyn RngCore) -> Verdict {
        if chance(rng, self.0) {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    }
}

/// With probability `.0`, delays a datagram by a duration drawn from the range `.1`.
#[derive(Clone, Debug)]
pub struct DelayRule(pub f64, pub Range<Duration>);

impl FaultRule for DelayRule {
    fn name(&self) -> &str {
        "delay"
    }
    fn judge(&mut self, _packet: &PacketView<'_>, rng: &mut dyn RngCore) -> Verdict {
        if chance(rng, self.0) {
            Verdict::Delay(duration_in(rng, self.1.clone()))
        } else {
            Verdict::Pass
        }
    }
}

/// Duplicates each datagram with probability `.0`.
#[derive(Clone, Debug)]
pub struct DuplicateRule(pub f64);

impl FaultRule for DuplicateRule {
    fn name(&self) -> &str {
        "duplicate"
    }
    fn judge(&mut self, _packet: &PacketView<'_>, rng: &mut dyn RngCore) -> Verdict {
        if chance(rng, self.0) {
            Verdict::Duplicate
        } else {
            Verdict::Pass
        }
    }
}

/// Holds each datagram back behind later ones with probability `.0`.
#[derive(Clone, Debug)]
pub struct ReorderRule(pub f64);

impl FaultRule for ReorderRule {
    fn name(&self) -> &str {
        "reorder"
    }
    fn judge(&mut self, _packet: &PacketView<'_>, rng: &mut dyn RngCore) -> Verdict {
        if chance(rng, self.0) {
            Verdict::Reorder
        } else {
            Verdict::Pass
        }
    }
}

/// Flips one bit of each datagram with probability `.0`.
#[derive(Clone, Debug)]
pub struct TamperRule(pub f64);

impl FaultRule for TamperRule {
    fn name(&self) -> &str {
        "tamper"
    }
    fn judge(&mut self, _packet: &PacketView<'_>, rng: &mut dyn RngCore) -> Verdict {
        if chance(rng, self.0) {
            Verdict::Tamper
        } else {
            Verdict::Pass
        }
    }
}

/// A rule made from a name and a closure, for faults the ready-made rules do not cover
/// (one-way cuts, dropping one message type, capturing bytes for a later replay).
///
/// ```
/// use cohort_sim::{FnRule, NodeId, Verdict};
///
/// let a = NodeId::from_index(0);
/// // Datagrams from node 0 whose first byte is 7 never arrive.
/// let rule = FnRule::new("drop-type-7-from-n0", move |p, _rng| {
///     if p.from == a && p.bytes.first() == Some(&7) { Verdict::Drop } else { Verdict::Pass }
/// });
/// # let _ = rule;
/// ```
pub struct FnRule<F> {
    name: String,
    judge: F,
}

impl<F> FnRule<F>
where
    F: FnMut(&PacketView<'_>, &mut dyn RngCore) -> Verdict,
{
    /// A rule called `name` that asks `judge`.
    pub fn new(name: impl Into<String>, judge: F) -> Self {
        FnRule {
            name: name.into(),
            judge,
        }
    }
}

impl<F> FaultRule for FnRule<F>
where
    F: FnMut(&PacketView<'_>, &mut dyn RngCore) -> Verdict,
{
    fn name(&self) -> &str {
        &self.name
    }
    fn judge(&mut self, packet: &PacketView<'_>, rng: &mut dyn RngCore) -> Verdict {
        (self.judge)(packet, rng)
    }
}

impl<F> std::fmt::Debug for FnRule<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FnRule")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A rule that only judges the datagrams a predicate selects; see [`FaultRuleExt::when`].
#[derive(Clone, Debug)]
pub struct When<R, P> {
    rule: R,
    select: P,
}

impl<R: FaultRule, P: FnMut(&PacketView<'_>) -> bool> FaultRule for When<R, P> {
    fn name(&self) -> &str {
        self.rule.name()
    }
    fn judge(&mut self, packet: &PacketView<'_>, rng: &mut dyn RngCore) -> Verdict {
        if (self.select)(packet) {
            self.rule.judge(packet, rng)
        } else {
            Verdict::Pass
        }
    }
}

/// A rule under another name; see [`FaultRuleExt::named`].
#[derive(Clone, Debug)]
pub struct Named<R> {
    rule: R,
    name: String,
}

impl<R: FaultRule> FaultRule for Named<R> {
    fn name(&self) -> &str {
        &self.name
    }
    fn judge(&mut self, packet: &PacketView<'_>, rng: &mut dyn RngCore) -> Verdict {
        self.rule.judge(packet, rng)
    }
}

/// Combinators for every [`FaultRule`].
///
/// ```
/// use cohort_sim::{FaultRuleExt, Loss, NodeId};
///
/// let (a, b) = (NodeId::from_index(0), NodeId::from_index(1));
/// // Half of what a sends to b is lost; other links are untouched.
/// let rule = Loss(0.5).when(move |p| p.from == a && p.to == b).named("lossy a->b");
/// # let _ = rule;
/// ```
pub trait FaultRuleExt: FaultRule + Sized {
    /// Judges only datagrams for which `select` returns true; the others pass (and consume
    /// no randomness).
    fn when<P: FnMut(&PacketView<'_>) -> bool>(self, select: P) -> When<Self, P> {
        When { rule: self, select }
    }

    /// Logs this rule's verdicts under `name`.
    fn named(self, name: impl Into<String>) -> Named<Self> {
        Named {
            rule: self,
            name: name.into(),
        }
    }
}

impl<R: FaultRule> FaultRuleExt for R {}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha8Rng;
    use rand_core::SeedableRng;

    #[test]
    fn chance_extremes_consume_nothing() {
        let mut a = ChaCha8Rng::seed_from_u64(1);
        let b = a.clone();
        assert!(chance(&mut a, 1.0));
        assert!(!chance(&mut a, 0.0));
        assert!(!chance(&mut a, f64::NAN));
        assert_eq!(a, b);
        let hits = (0..10_000).filter(|_| chance(&mut a, 0.25)).count();
        assert!((2_200..2_800).contains(&hits), "{hits}");
    }

    #[test]
    fn durations_stay_in_range() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let ms = Duration::from_millis;
        for _ in 0..1000 {
            let d = duration_in(&mut rng, ms(5)..ms(7));
            assert!(d >= ms(5) && d < ms(7));
        }
        assert_eq!(duration_in(&mut rng, ms(9)..ms(3)), ms(9));
        assert_eq!(below(&mut rng, 0), 0);
        assert!((0..1000).all(|_| below(&mut rng, 3) < 3));
    }
}
