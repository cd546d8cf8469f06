//! Partitions, crashes, timers, injection, addressing and the step budget.

mod toy;

use cohort_sim::{DropReason, FailureKind, LogKind, NodeId, Sim, SimConfig};
use toy::{at_ms, ms, payloads, plain, Toy, ToyEvent};

fn abc() -> (NodeId, NodeId, NodeId) {
    (
        NodeId::from_index(0),
        NodeId::from_index(1),
        NodeId::from_index(2),
    )
}

fn drops(sim: &Sim<Toy>, why: &DropReason) -> Vec<(cohort_core::Timestamp, NodeId)> {
    sim.log()
        .iter()
        .filter(|e| matches!(&e.kind, LogKind::Dropped { reason, .. } if reason == why))
        .map(|e| (e.at, e.node))
        .collect()
}

#[test]
fn partition_blocks_cross_traffic_and_heal_restores_it() {
    let mut sim = plain(SimConfig::with_seed(1), 4);
    let (a, b, c) = abc();
    let d = NodeId::from_index(3);
    // c and d are not listed: each is alone.
    sim.partition(&[&[a, b]]);
    assert!(sim.can_reach(a, b) && sim.can_reach(b, a) && sim.can_reach(c, c));
    assert!(!sim.can_reach(a, c) && !sim.can_reach(c, d) && !sim.can_reach(d, b));
    assert_eq!(sim.components(), vec![vec![a, b], vec![c], vec![d]]);

    sim.with_node(a, |t, _| {
        t.send(b.addr(), b"a->b");
        t.send(c.addr(), b"a->c");
    });
    sim.with_node(c, |t, _| t.send(d.addr(), b"c->d"));
    sim.run_until_quiet(ms(100)).unwrap();
    assert_eq!(payloads(&sim, b), [b"a->b".to_vec()]);
    assert!(payloads(&sim, c).is_empty() && payloads(&sim, d).is_empty());
    assert_eq!(
        drops(&sim, &DropReason::Partition),
        [(at_ms(0), a), (at_ms(0), c)]
    );
    assert_eq!(sim.counters().dropped_by_partition, 2);

    sim.heal();
    assert_eq!(sim.components(), vec![vec![a, b, c, d]]);
    sim.with_node(a, |t, _| t.send(c.addr(), b"a->c again"));
    sim.with_node(c, |t, _| t.send(d.addr(), b"c->d again"));
    sim.run_until_quiet(ms(100)).unwrap();
    assert_eq!(payloads(&sim, c), [b"a->c again".to_vec()]);
    assert_eq!(payloads(&sim, d), [b"c->d again".to_vec()]);

    // Every node logged the partition with its component, and the heal.
    let seen: Vec<_> = sim
        .log()
        .iter()
        .filter_map(|e| match &e.kind {
            LogKind::Partitioned { component } => Some((e.node, component.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        seen,
        [(a, vec![a, b]), (b, vec![a, b]), (c, vec![c]), (d, vec![d])]
    );
    assert_eq!(
        sim.log()
            .iter()
            .filter(|e| e.kind == LogKind::Healed)
            .count(),
        4
    );
}

#[test]
fn datagrams_in_flight_across_a_new_cut_are_dropped() {
    let mut sim = plain(SimConfig::with_seed(2), 3);
    let (a, b, c) = abc();
    sim.with_node(a, |t, _| {
        t.send(c.addr(), b"doomed");
        t.send(b.addr(), b"fine");
    });
    sim.run_until(at_ms(5)).unwrap();
    assert_eq!(sim.in_flight(), 2);
    sim.partition(&[&[a, b], &[c]]);
    sim.run_until_quiet(ms(100)).unwrap();
    assert!(payloads(&sim, c).is_empty());
    assert_eq!(payloads(&sim, b), [b"fine".to_vec()]);
    // Dropped on arrival, logged at the destination.
    assert_eq!(
        drops(&sim, &DropReason::PartitionInFlight),
        [(at_ms(10), c)]
    );

    // And a datagram sent before a heal but arriving after it is delivered.
    sim.with_node(a, |t, _| t.send(c.addr(), b"early"));
    sim.heal();
    sim.run_until_quiet(ms(100)).unwrap();
    assert!(payloads(&sim, c).is_empty(), "it was dropped at send time");
    sim.partition(&[&[a], &[c]]);
    sim.heal();
    sim.with_node(a, |t, _| t.send(c.addr(), b"late"));
    sim.run_until_quiet(ms(100)).unwrap();
    assert_eq!(payloads(&sim, c), [b"late".to_vec()]);
}

#[test]
fn new_nodes_are_isolated_while_partitioned() {
    let mut sim = plain(SimConfig::with_seed(3), 2);
    let (a, b, _) = abc();
    sim.partition(&[&[a, b]]);
    let c = sim.add_node_with(|_, addr| Toy::new(addr));
    assert!(!sim.can_reach(a, c) && !sim.can_reach(c, b) && sim.can_reach(a, b));
    sim.heal();
    assert!(sim.can_reach(a, c));
}

#[test]
#[should_panic(expected = "two partition groups")]
fn a_node_in_two_groups_is_rejected() {
    let mut sim = plain(SimConfig::with_seed(4), 3);
    let (a, b, c) = abc();
    sim.partition(&[&[a, b], &[b, c]]);
}

#[test]
fn timers_fire_at_their_virtual_times() {
    let mut sim = plain(SimConfig::with_seed(5), 1);
    let a = NodeId::from_index(0);
    sim.with_node(a, |t, now| t.start_ticking(now, ms(100)));
    assert_eq!(sim.next_event_time(), Some(at_ms(100)));
    sim.run_until(at_ms(350)).unwrap();
    assert_eq!(
        sim.now(),
        at_ms(350),
        "run_until leaves the clock at its limit"
    );
    let ticks: Vec<_> = sim.events_of(a).map(|(at, e)| (at, e.clone())).collect();
    assert_eq!(
        ticks,
        [
            (at_ms(100), ToyEvent::Tick { n: 1 }),
            (at_ms(200), ToyEvent::Tick { n: 2 }),
            (at_ms(300), ToyEvent::Tick { n: 3 }),
        ]
    );
    let timeouts = sim
        .log()
        .iter()
        .filter(|e| e.kind == LogKind::Timeout)
        .map(|e| e.at);
    assert_eq!(
        timeouts.collect::<Vec<_>>(),
        [at_ms(100), at_ms(200), at_ms(300)]
    );

    // A ticking node never goes quiet: the run stops at its limit and says so.
    let err = sim.run_until_quiet(ms(1_000)).unwrap_err();
    assert_eq!(err.kind(), FailureKind::Deadline);
    assert_eq!(sim.now(), at_ms(1_350));
    assert_eq!(sim.node(a).ticks, 13);

    sim.with_node(a, |t, _| t.stop_ticking());
    assert_eq!(sim.run_until_quiet(ms(1_000)).unwrap(), at_ms(1_350));
}

#[test]
fn arrivals_go_before_deadlines_at_the_same_time() {
    let mut sim = plain(SimConfig::with_seed(6), 2);
    let (a, b, _) = abc();
    sim.with_node(b, |t, now| t.start_ticking(now, ms(10)));
    sim.with_node(a, |t, _| t.send(b.addr(), b"x"));
    sim.run_until(at_ms(10)).unwrap();
    let kinds: Vec<_> = sim.events_of(b).map(|(at, e)| (at, e.clone())).collect();
    assert_eq!(
        kinds,
        [
            (
                at_ms(10),
                ToyEvent::Got {
                    from: a.addr(),
                    data: b"x".to_vec()
                }
            ),
            (at_ms(10), ToyEvent::Tick { n: 1 }),
        ]
    );
}

#[test]
fn crashed_nodes_hear_nothing_and_restart_fresh() {
    let mut sim = plain(SimConfig::with_seed(7), 2);
    let (a, b, _) = abc();
    sim.with_node(b, |t, now| t.start_ticking(now, ms(50)));
    sim.run_until(at_ms(120)).unwrap();
    assert_eq!(sim.node(b).ticks, 2);

    sim.with_node(a, |t, _| t.send(b.addr(), b"in flight"));
    sim.crash(b);
    assert!(sim.is_crashed(b));
    sim.with_node(a, |t, _| t.send(b.addr(), b"after"));
    sim.run_until(at_ms(1_000)).unwrap();
    assert_eq!(sim.node(b).ticks, 2, "its timers stopped");
    assert!(payloads(&sim, b).is_empty());
    assert_eq!(
        drops(&sim, &DropReason::Crashed),
        [(at_ms(130), b), (at_ms(130), b)]
    );

    sim.restart(b, Toy::new(b.addr()));
    assert!(!sim.is_crashed(b));
    sim.with_node(a, |t, _| t.send(b.addr(), b"welcome back"));
    sim.run_until_quiet(ms(100)).unwrap();
    assert_eq!(payloads(&sim, b), [b"welcome back".to_vec()]);
    let marks: Vec<_> = sim
        .log()
        .iter()
        .filter(|e| matches!(e.kind, LogKind::Crashed | LogKind::Restarted))
        .map(|e| (e.at, e.node))
        .collect();
    assert_eq!(marks, [(at_ms(120), b), (at_ms(1_000), b)]);
}

#[test]
fn node_mut_is_drained_before_the_next_step() {
    let mut sim = plain(SimConfig::with_seed(8), 2);
    let (a, b, _) = abc();
    sim.node_mut(a).send(b.addr(), b"queued");
    assert_eq!(sim.counters().sent, 0, "not drained yet");
    sim.run_until_quiet(ms(100)).unwrap();
    assert_eq!(payloads(&sim, b), [b"queued".to_vec()]);
    assert_eq!(
        sim.node(b).received[0].0,
        at_ms(10),
        "sent at the time of the command"
    );
}

#[test]
fn echo_round_trip_takes_two_latencies() {
    let mut sim = Sim::new(SimConfig::with_seed(9));
    let a = sim.add_node_with(|_, addr| Toy::new(addr));
    let b = sim.add_node_with(|_, addr| Toy::new(addr).echoing());
    sim.with_node(a, |t, _| t.send(b.addr(), b"?ping"));
    let quiet_at = sim.run_until_quiet(ms(1_000)).unwrap();
    assert_eq!(quiet_at, at_ms(20));
    assert_eq!(
        sim.node(a).received,
        [(at_ms(20), b.addr(), b"!ping".to_vec())]
    );
}

#[test]
fn injected_datagrams_reach_the_node_even_across_partitions() {
    let mut sim = plain(SimConfig::with_seed(10), 2);
    let (a, b, _) = abc();
    sim.partition(&[&[a], &[b]]);
    let forger = "203.0.113.9:4444".parse().unwrap();
    sim.inject(forger, b, b"forged".to_vec(), ms(3));
    sim.inject(a.addr(), b, b"replayed".to_vec(), ms(4));
    sim.run_until_quiet(ms(100)).unwrap();
    assert_eq!(
        sim.node(b).received,
        [
            (at_ms(3), forger, b"forged".to_vec()),
            (at_ms(4), a.addr(), b"replayed".to_vec())
        ]
    );
    assert_eq!(sim.counters().injected, 2);
}

#[test]
fn hundreds_of_nodes_get_distinct_routable_addresses() {
    let mut sim = plain(SimConfig::with_seed(11), 300);
    let last = NodeId::from_index(299);
    assert_eq!(sim.addr(last), "10.0.1.46:7000".parse().unwrap());
    let mut addrs: Vec<_> = sim.node_ids().map(|id| sim.addr(id)).collect();
    for id in sim.node_ids() {
        assert_eq!(sim.node_by_addr(sim.addr(id)), Some(id));
    }
    addrs.sort();
    addrs.dedup();
    assert_eq!(addrs.len(), 300);
    assert_eq!(sim.node_by_addr(NodeId::from_index(300).addr()), None);
    sim.with_node(NodeId::from_index(0), |t, _| t.send(last.addr(), b"far"));
    sim.run_until_quiet(ms(100)).unwrap();
    assert_eq!(payloads(&sim, last), [b"far".to_vec()]);
}

#[test]
fn a_livelock_hits_the_step_budget_instead_of_hanging() {
    let config = SimConfig {
        seed: 99,
        latency: std::time::Duration::ZERO,
        max_steps: 1_000,
        ..SimConfig::default()
    };
    let mut sim = Sim::new(config);
    let a = sim.add_node_with(|_, addr| Toy::new(addr).bouncing());
    let b = sim.add_node_with(|_, addr| Toy::new(addr).bouncing());
    sim.with_node(a, |t, _| t.send(b.addr(), b"ball"));
    let err = sim.run_for(ms(1)).unwrap_err();
    assert_eq!(err.kind(), FailureKind::StepLimit);
    assert_eq!(err.seed(), 99);
    assert_eq!(sim.now(), at_ms(0), "time never moved");
    assert_eq!(sim.counters().steps, 1_000);
    let text = err.to_string();
    assert!(
        text.contains("seed 99") && text.contains("COHORT_SIM_SEED=99"),
        "{text}"
    );
    assert_eq!(err.log_tail().len(), 30);
    assert!(
        err.log_tail().iter().any(|l| l.contains("delivered")),
        "{text}"
    );
}
