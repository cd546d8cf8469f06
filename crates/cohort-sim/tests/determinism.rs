//! The same seed replays the same run; another seed gives another run.

mod toy;

use cohort_sim::{
    Counters, DelayRule, DuplicateRule, LogEntry, Loss, NodeId, ReorderRule, Sim, SimConfig,
    SimFailure, TamperRule,
};
use proptest::prelude::*;
use toy::{at_ms, ms, Toy, ToyEvent};

/// Six gossiping nodes under every kind of fault, a partition and a crash.
fn chaotic_run(seed: u64) -> Result<(Vec<LogEntry<ToyEvent>>, Counters), SimFailure> {
    let config = SimConfig {
        seed,
        jitter: ms(3),
        ..SimConfig::default()
    };
    let mut sim = Sim::new(config);
    let n = 6;
    let addrs: Vec<_> = (0..n).map(|i| NodeId::from_index(i).addr()).collect();
    for i in 0..n {
        let rng = sim.fork_rng();
        let peers = addrs.iter().copied().filter(|&a| a != addrs[i]).collect();
        let id = sim.add_node_with(|_, addr| Toy::gossip(addr, peers, rng));
        sim.with_node(id, |toy, now| toy.start_ticking(now, ms(20 + 3 * i as u64)));
    }
    sim.add_rule(Loss(0.1));
    sim.add_rule(DuplicateRule(0.05));
    sim.add_rule(ReorderRule(0.05));
    sim.add_rule(DelayRule(0.1, ms(1)..ms(20)));
    sim.add_rule(TamperRule(0.02));
    let ids: Vec<_> = sim.node_ids().collect();

    sim.run_until(at_ms(2_000))?;
    sim.partition(&[&ids[..3], &ids[3..]]);
    sim.run_until(at_ms(3_000))?;
    sim.crash(ids[5]);
    sim.run_until(at_ms(4_000))?;
    sim.heal();
    sim.run_until(at_ms(5_000))?;
    let rng = sim.fork_rng();
    let peers = addrs[..5].to_vec();
    sim.restart(ids[5], Toy::gossip(addrs[5], peers, rng));
    sim.with_node(ids[5], |toy, now| toy.start_ticking(now, ms(25)));
    sim.run_until(at_ms(6_000))?;
    Ok((sim.log().to_vec(), sim.counters()))
}

#[test]
fn same_seed_replays_the_same_log() {
    let (log_a, counters_a) = chaotic_run(7).unwrap();
    let (log_b, counters_b) = chaotic_run(7).unwrap();
    // The run must actually exercise every fault for the comparison to mean something.
    let c = counters_a;
    assert!(c.sent > 1_000, "{c:?}");
    assert!(
        c.dropped_by_rule > 0 && c.duplicated > 0 && c.reordered > 0,
        "{c:?}"
    );
    assert!(
        c.delayed > 0 && c.tampered > 0 && c.dropped_by_partition > 0,
        "{c:?}"
    );
    assert!(c.dropped_crashed > 0, "{c:?}");
    assert_eq!(counters_a, counters_b);
    assert_eq!(log_a.len(), log_b.len());
    // Compare entry by entry (timestamps included) so a mismatch names its first entry.
    for (i, (a, b)) in log_a.iter().zip(&log_b).enumerate() {
        assert_eq!(a, b, "log entry {i} differs");
    }
}

#[test]
fn another_seed_gives_another_run() {
    let (log_a, _) = chaotic_run(7).unwrap();
    let (log_b, _) = chaotic_run(8).unwrap();
    assert_ne!(log_a, log_b);
}

/// Two runs under loss only, with fixed tick periods: the seed alone decides which
/// datagrams are lost.
fn lossy_run(seed: u64, loss: f64) -> Result<Vec<LogEntry<ToyEvent>>, SimFailure> {
    let mut sim = toy::plain(SimConfig::with_seed(seed), 2);
    let (a, b) = (NodeId::from_index(0), NodeId::from_index(1));
    if loss > 0.0 {
        sim.add_rule(Loss(loss));
    }
    for i in 0..200u8 {
        sim.with_node(a, |t, _| t.send(b.addr(), &[i]));
        sim.run_for(ms(1))?;
    }
    sim.run_for(ms(100))?;
    Ok(sim.log().to_vec())
}

#[test]
fn seeds_differ_under_loss_and_not_without() {
    assert_ne!(lossy_run(1, 0.3).unwrap(), lossy_run(2, 0.3).unwrap());
    // With no random choice to make, the seed changes nothing.
    assert_eq!(lossy_run(1, 0.0).unwrap(), lossy_run(2, 0.0).unwrap());
}

#[test]
fn a_rule_with_probability_zero_changes_nothing() {
    let run = |extra: bool| {
        let config = SimConfig {
            seed: 3,
            jitter: ms(4),
            ..SimConfig::default()
        };
        let mut sim = toy::plain(config, 3);
        sim.add_rule(Loss(0.2));
        if extra {
            sim.add_rule(DuplicateRule(0.0));
        }
        for i in 0..100u8 {
            let to = NodeId::from_index(usize::from(i % 3)).addr();
            sim.with_node(NodeId::from_index(usize::from(i % 2)), |t, _| {
                t.send(to, &[i])
            });
            sim.run_for(ms(2)).unwrap();
        }
        sim.run_for(ms(100)).unwrap();
        sim.log().to_vec()
    };
    assert_eq!(run(false), run(true));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn any_seed_and_loss_replays(seed in any::<u64>(), loss in 0.0f64..1.0, jitter in 0u64..20) {
        let run = || {
            let config = SimConfig { seed, jitter: ms(jitter), ..SimConfig::default() };
            let mut sim = toy::plain(config, 3);
            sim.add_rule(Loss(loss));
            sim.add_rule(ReorderRule(0.1));
            for i in 0..60u8 {
                let (from, to) = (usize::from(i % 3), usize::from((i + 1) % 3));
                sim.with_node(NodeId::from_index(from), |t, _| {
                    t.send(NodeId::from_index(to).addr(), &[i]);
                });
                sim.run_for(ms(1)).unwrap();
            }
            sim.run_until_quiet(ms(1_000)).unwrap();
            sim.log().to_vec()
        };
        prop_assert_eq!(run(), run());
    }
}
