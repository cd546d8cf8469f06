//! The standard faults that the protocol crates' simulator tests share: one mix of loss,
//! duplication, reordering, delay and tampering added (and removed) as a set, and the two
//! ways tests cut a network in two by a seeded choice. Owns nothing in the simulator: it only
//! calls `Sim::add_rule` / `Sim::remove_rule` and draws from the RNG it is given; it must not
//! change how rules judge datagrams (that is `fault.rs`).
//!
//! A seed replays the same schedule: the rules are added in a fixed order (loss, duplicate,
//! reorder, delay, tamper; the first verdict other than `Pass` wins), a rate of zero adds no
//! rule, and the splitting functions say exactly what they draw.

use crate::fault::{DelayRule, DuplicateRule, Loss, ReorderRule, TamperRule};
use crate::node::NodeId;
use crate::sim::{RuleId, Sim};
use cohort_core::Machine;
use rand_core::RngCore;
use std::fmt;
use std::ops::Range;
use std::time::Duration;

/// A mix of network faults, as probabilities per datagram. [`StandardFaults::add_to`] adds
/// one rule per non-zero rate, in the order of the fields.
///
/// ```
/// # use cohort_sim::StandardFaults;
/// # use std::time::Duration;
/// // The light mix without tampering, and with shorter delays.
/// let faults = StandardFaults {
///     tamper: 0.0,
///     delay_range: Duration::from_millis(1)..Duration::from_millis(30),
///     ..StandardFaults::light()
/// };
/// assert_eq!(faults.loss, 0.03);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct StandardFaults {
    /// Dropped ([`Loss`]).
    pub loss: f64,
    /// Duplicated: a copy a little later ([`DuplicateRule`]).
    pub duplicate: f64,
    /// Held back behind later datagrams ([`ReorderRule`]).
    pub reorder: f64,
    /// Delayed by a duration drawn from `delay_range` ([`DelayRule`]).
    pub delay: f64,
    /// How long a delayed datagram waits.
    pub delay_range: Range<Duration>,
    /// One random bit flipped ([`TamperRule`]).
    pub tamper: f64,
}

impl StandardFaults {
    /// No faults: adds no rule.
    pub fn none() -> StandardFaults {
        StandardFaults {
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            delay: 0.0,
            delay_range: Duration::from_millis(1)..Duration::from_millis(40),
            tamper: 0.0,
        }
    }

    /// 3 % each lost, duplicated and reordered, 5 % delayed by 1 to 40 ms, 1 % tampered.
    pub fn light() -> StandardFaults {
        StandardFaults {
            loss: 0.03,
            duplicate: 0.03,
            reorder: 0.03,
            delay: 0.05,
            tamper: 0.01,
            ..StandardFaults::none()
        }
    }

    /// 5 % each lost, duplicated, reordered and delayed by 1 to 40 ms, 2 % tampered.
    pub fn heavy() -> StandardFaults {
        StandardFaults {
            loss: 0.05,
            duplicate: 0.05,
            reorder: 0.05,
            delay: 0.05,
            tamper: 0.02,
            ..StandardFaults::none()
        }
    }

    /// Adds the rules to `sim`, after any it has: loss, duplicate, reorder, delay, tamper,
    /// each only if its rate is not zero. Returns them, to remove together.
    pub fn add_to<M>(&self, sim: &mut Sim<M>) -> FaultSet
    where
        M: Machine,
        M::Event: fmt::Debug,
    {
        let mut ids = Vec::new();
        if self.loss != 0.0 {
            ids.push(sim.add_rule(Loss(self.loss)));
        }
        if self.duplicate != 0.0 {
            ids.push(sim.add_rule(DuplicateRule(self.duplicate)));
        }
        if self.reorder != 0.0 {
            ids.push(sim.add_rule(ReorderRule(self.reorder)));
        }
        if self.delay != 0.0 {
            ids.push(sim.add_rule(DelayRule(self.delay, self.delay_range.clone())));
        }
        if self.tamper != 0.0 {
            ids.push(sim.add_rule(TamperRule(self.tamper)));
        }
        FaultSet { ids }
    }
}

/// The rules one [`StandardFaults::add_to`] added.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "keep it to remove the faults again"]
pub struct FaultSet {
    ids: Vec<RuleId>,
}

impl FaultSet {
    /// The rules, in the order they were added.
    pub fn ids(&self) -> &[RuleId] {
        &self.ids
    }

    /// Removes every rule of the set from `sim` (partitions stay: `Sim::heal` ends them).
    pub fn remove<M>(self, sim: &mut Sim<M>)
    where
        M: Machine,
        M::Event: fmt::Debug,
    {
        for id in self.ids {
            sim.remove_rule(id);
        }
    }
}

/// Cuts `nodes` in two after a point chosen by `rng`: the first side holds the first
/// `1 + rng.next_u32() % max_first` nodes (one draw), the second the rest.
///
/// # Panics
/// If `max_first` is zero.
pub fn split_prefix(
    rng: &mut dyn RngCore,
    nodes: &[NodeId],
    max_first: usize,
) -> (Vec<NodeId>, Vec<NodeId>) {
    assert!(max_first > 0, "split_prefix: max_first must be at least 1");
    let cut = (1 + (rng.next_u32() as usize) % max_first).min(nodes.len());
    (nodes[..cut].to_vec(), nodes[cut..].to_vec())
}

/// Puts each node of `nodes`, in order, on the first side when `rng.next_u32() % 2 == 0`,
/// else on the second (one draw per node).
pub fn split_by_coin(rng: &mut dyn RngCore, nodes: &[NodeId]) -> (Vec<NodeId>, Vec<NodeId>) {
    let mut sides = (Vec::new(), Vec::new());
    for &node in nodes {
        if rng.next_u32().is_multiple_of(2) {
            sides.0.push(node);
        } else {
            sides.1.push(node);
        }
    }
    sides
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SimConfig;
    use crate::sim::SimRng;
    use cohort_core::{Timestamp, Transmit};
    use rand_core::SeedableRng;
    use std::net::SocketAddr;

    /// A machine that does nothing: these tests look at rules, not traffic.
    struct Idle;

    impl Machine for Idle {
        type Event = ();
        fn handle_datagram(&mut self, _: Timestamp, _: SocketAddr, _: &[u8]) {}
        fn handle_timeout(&mut self, _: Timestamp) {}
        fn poll_transmit(&mut self, _: Timestamp, _: &mut Vec<u8>) -> Option<Transmit> {
            None
        }
        fn poll_timeout(&self) -> Option<Timestamp> {
            None
        }
        fn poll_event(&mut self) -> Option<()> {
            None
        }
    }

    #[test]
    fn rules_go_in_field_order_and_zero_rates_add_none() {
        let mut sim: Sim<Idle> = Sim::new(SimConfig::with_seed(1));
        let light = StandardFaults::light().add_to(&mut sim);
        assert_eq!(
            sim.rule_names(),
            ["loss", "duplicate", "reorder", "delay", "tamper"]
        );
        light.remove(&mut sim);
        assert!(sim.rule_names().is_empty());

        let other = sim.add_rule(Loss(0.5));
        let some = StandardFaults {
            delay: 0.0,
            tamper: 0.0,
            ..StandardFaults::heavy()
        }
        .add_to(&mut sim);
        assert_eq!(some.ids().len(), 3);
        assert_eq!(sim.rule_names(), ["loss", "loss", "duplicate", "reorder"]);
        some.remove(&mut sim);
        assert_eq!(sim.rule_names(), ["loss"], "other rules stay");
        assert!(sim.remove_rule(other).is_some());
        assert!(StandardFaults::none().add_to(&mut sim).ids().is_empty());
    }

    #[test]
    fn splits_draw_what_they_say() {
        let nodes: Vec<NodeId> = (0..5).map(NodeId::from_index).collect();
        for seed in 0..50 {
            let mut a = SimRng::seed_from_u64(seed);
            let mut b = SimRng::seed_from_u64(seed);
            let (first, second) = split_prefix(&mut a, &nodes, 4);
            let cut = 1 + (b.next_u32() as usize) % 4;
            assert_eq!(first, nodes[..cut]);
            assert_eq!(second, nodes[cut..]);

            let (x, y) = split_by_coin(&mut a, &nodes);
            let mut expected = (Vec::new(), Vec::new());
            for &n in &nodes {
                if b.next_u32() % 2 == 0 {
                    expected.0.push(n);
                } else {
                    expected.1.push(n);
                }
            }
            assert_eq!((x, y), expected);
            assert_eq!(a.next_u64(), b.next_u64(), "no more and no fewer draws");
        }
    }
}
