//! Each verdict does what it says.

mod toy;

use cohort_sim::{
    DelayRule, DropReason, DuplicateRule, FaultRuleExt, FnRule, LogKind, Loss, NodeId, ReorderRule,
    SimConfig, TamperRule, Verdict,
};
use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;
use toy::{at_ms, ms, payloads, plain};

fn ab() -> (NodeId, NodeId) {
    (NodeId::from_index(0), NodeId::from_index(1))
}

#[test]
fn passing_datagrams_arrive_after_the_latency() {
    let mut sim = plain(SimConfig::with_seed(1), 2);
    let (a, b) = ab();
    sim.with_node(a, |t, _| t.send(b.addr(), b"hi"));
    assert!(sim.step());
    assert_eq!(
        sim.now(),
        at_ms(10),
        "the clock jumps straight to the arrival"
    );
    assert_eq!(
        sim.node(b).received,
        vec![(at_ms(10), a.addr(), b"hi".to_vec())]
    );
    assert!(!sim.step(), "nothing left");
    assert_eq!(sim.now(), at_ms(10));
    let c = sim.counters();
    assert_eq!((c.sent, c.delivered, c.dropped()), (1, 1, 0));
}

#[test]
fn drop_means_never_delivered() {
    let mut sim = plain(SimConfig::with_seed(2), 2);
    let (a, b) = ab();
    sim.add_rule(Loss(1.0));
    for i in 0..20u8 {
        sim.with_node(a, |t, _| t.send(b.addr(), &[i]));
    }
    sim.run_until_quiet(ms(1_000)).unwrap();
    assert!(sim.node(b).received.is_empty());
    assert_eq!(sim.events_of(b).count(), 0);
    let c = sim.counters();
    assert_eq!((c.sent, c.delivered, c.dropped_by_rule), (20, 0, 20));
    let drops = sim
        .log()
        .iter()
        .filter(|e| {
            e.node == a
                && matches!(&e.kind, LogKind::Dropped { reason: DropReason::Rule(r), .. } if r == "loss")
        })
        .count();
    assert_eq!(drops, 20);
}

#[test]
fn loss_probability_is_honoured() {
    let mut sim = plain(SimConfig::with_seed(3), 2);
    let (a, b) = ab();
    sim.add_rule(Loss(0.5));
    for i in 0..2_000u32 {
        sim.with_node(a, |t, _| t.send(b.addr(), &i.to_be_bytes()));
    }
    sim.run_until_quiet(ms(1_000)).unwrap();
    let got = sim.node(b).received.len();
    assert!(
        (850..1_150).contains(&got),
        "{got} of 2000 delivered at 50% loss"
    );
    assert_eq!(sim.counters().dropped_by_rule as usize + got, 2_000);
}

#[test]
fn duplicate_delivers_twice_the_copy_slightly_later() {
    let config = SimConfig {
        seed: 4,
        duplicate_gap: ms(2),
        ..SimConfig::default()
    };
    let mut sim = plain(config, 2);
    let (a, b) = ab();
    sim.add_rule(DuplicateRule(1.0));
    for i in 0..5u8 {
        sim.with_node(a, |t, _| t.send(b.addr(), &[i]));
        sim.run_for(ms(50)).unwrap();
    }
    let got = &sim.node(b).received;
    assert_eq!(got.len(), 10);
    for (i, pair) in got.chunks(2).enumerate() {
        let sent_at = at_ms(50 * i as u64);
        assert_eq!(pair[0].2, vec![i as u8]);
        assert_eq!(pair[1].2, vec![i as u8]);
        assert_eq!(pair[0].0, sent_at + ms(10), "the first copy is on time");
        let gap = pair[1].0 - pair[0].0;
        assert!(gap > Duration::ZERO && gap <= ms(2), "copy {gap:?} later");
    }
    // Both deliveries of a datagram carry its number.
    let delivered: Vec<_> = sim
        .log()
        .iter()
        .filter_map(|e| match e.kind {
            LogKind::Delivered { packet, .. } => Some(packet.get()),
            _ => None,
        })
        .collect();
    assert_eq!(delivered, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]);
    assert_eq!(sim.counters().duplicated, 5);
}

#[test]
fn delay_arrives_later_by_the_drawn_amount() {
    let mut sim = plain(SimConfig::with_seed(5), 2);
    let (a, b) = ab();
    sim.add_rule(DelayRule(1.0, ms(30)..ms(40)));
    for i in 0..20u8 {
        sim.with_node(a, |t, _| t.send(b.addr(), &[i]));
    }
    sim.run_until_quiet(ms(1_000)).unwrap();
    let delays: Vec<Duration> = sim
        .log()
        .iter()
        .filter_map(|e| match e.kind {
            LogKind::Delayed { by, .. } => Some(by),
            _ => None,
        })
        .collect();
    assert_eq!(delays.len(), 20);
    let mut arrivals: Vec<_> = delays.iter().map(|&by| at_ms(10) + by).collect();
    arrivals.sort();
    let got: Vec<_> = sim.node(b).received.iter().map(|r| r.0).collect();
    assert_eq!(got, arrivals, "each arrives at latency + its delay");
    assert!(delays.iter().all(|d| (ms(30)..ms(40)).contains(d)));
    assert!(
        delays.windows(2).any(|w| w[0] != w[1]),
        "delays are drawn, not fixed"
    );
}

#[test]
fn reorder_lets_later_datagrams_overtake() {
    let mut sim = plain(SimConfig::with_seed(6), 2);
    let (a, b) = ab();
    sim.add_rule(ReorderRule(1.0).when(|p| p.bytes == [0]));
    sim.with_node(a, |t, _| {
        for i in 0..10u8 {
            t.send(b.addr(), &[i]);
        }
    });
    sim.run_until_quiet(ms(1_000)).unwrap();
    let order: Vec<u8> = payloads(&sim, b).into_iter().map(|d| d[0]).collect();
    assert_eq!(order, [1, 2, 3, 4, 5, 6, 7, 8, 9, 0]);
    let held = sim.log().iter().find_map(|e| match e.kind {
        LogKind::Reordered { by, .. } => Some(by),
        _ => None,
    });
    let held = held.expect("logged");
    assert!(
        (ms(25)..=ms(50)).contains(&held),
        "{held:?} within the default window"
    );
    assert_eq!(sim.node(b).received[9].0, at_ms(10) + held);
}

#[test]
fn random_reorder_changes_order_but_loses_nothing() {
    let mut sim = plain(SimConfig::with_seed(7), 2);
    let (a, b) = ab();
    sim.add_rule(ReorderRule(0.3));
    for i in 0..50u8 {
        sim.with_node(a, |t, _| t.send(b.addr(), &[i]));
        sim.run_for(ms(1)).unwrap();
    }
    sim.run_until_quiet(ms(1_000)).unwrap();
    let order: Vec<u8> = payloads(&sim, b).into_iter().map(|d| d[0]).collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        (0..50).collect::<Vec<u8>>(),
        "every datagram arrives once"
    );
    assert_ne!(order, sorted, "some datagrams arrive out of order");
}

#[test]
fn tamper_flips_exactly_the_logged_bit() {
    let mut sim = plain(SimConfig::with_seed(8), 2);
    let (a, b) = ab();
    sim.add_rule(TamperRule(1.0));
    let sent: Vec<Vec<u8>> = (0..40u8)
        .map(|i| (0..=i % 13).map(|j| i ^ j).collect())
        .collect();
    for data in &sent {
        sim.with_node(a, |t, _| t.send(b.addr(), data));
    }
    sim.run_until_quiet(ms(1_000)).unwrap();
    let got = payloads(&sim, b);
    let flips: Vec<(usize, u8)> = sim
        .log()
        .iter()
        .filter_map(|e| match e.kind {
            LogKind::Tampered { byte, bit, .. } => Some((byte, bit)),
            _ => None,
        })
        .collect();
    assert_eq!((got.len(), flips.len()), (40, 40));
    for ((orig, recv), (byte, bit)) in sent.iter().zip(&got).zip(flips) {
        assert_eq!(orig.len(), recv.len());
        let differing: u32 = orig
            .iter()
            .zip(recv)
            .map(|(x, y)| (x ^ y).count_ones())
            .sum();
        assert_eq!(differing, 1, "exactly one bit differs");
        assert_eq!(
            orig[byte] ^ recv[byte],
            1 << bit,
            "and it is the logged one"
        );
    }
    assert_eq!(sim.counters().tampered, 40);
}

#[test]
fn tamper_passes_empty_datagrams() {
    let mut sim = plain(SimConfig::with_seed(9), 2);
    let (a, b) = ab();
    sim.add_rule(TamperRule(1.0));
    sim.with_node(a, |t, _| t.send(b.addr(), b""));
    sim.run_until_quiet(ms(100)).unwrap();
    assert_eq!(payloads(&sim, b), vec![Vec::<u8>::new()]);
    assert_eq!(sim.counters().tampered, 0);
}

#[test]
fn first_non_pass_verdict_wins_and_rules_come_and_go() {
    let mut sim = plain(SimConfig::with_seed(10), 2);
    let (a, b) = ab();
    let asked = Rc::new(Cell::new(0));
    let counter = Rc::clone(&asked);
    let loss = sim.add_rule(Loss(1.0));
    sim.add_rule(DuplicateRule(1.0));
    sim.add_rule(FnRule::new("count", move |_, _| {
        counter.set(counter.get() + 1);
        Verdict::Pass
    }));
    assert_eq!(sim.rule_names(), ["loss", "duplicate", "count"]);

    sim.with_node(a, |t, _| t.send(b.addr(), b"x"));
    sim.run_until_quiet(ms(100)).unwrap();
    assert_eq!(payloads(&sim, b).len(), 0, "loss is asked first and wins");
    assert_eq!(asked.get(), 0, "later rules are not asked");

    assert!(sim.remove_rule(loss).is_some());
    assert!(sim.remove_rule(loss).is_none(), "already removed");
    sim.with_node(a, |t, _| t.send(b.addr(), b"y"));
    sim.run_until_quiet(ms(100)).unwrap();
    assert_eq!(
        payloads(&sim, b),
        [b"y".to_vec(), b"y".to_vec()],
        "now duplicate wins"
    );
    assert_eq!(asked.get(), 0);

    sim.clear_rules();
    sim.with_node(a, |t, _| t.send(b.addr(), b"z"));
    sim.run_until_quiet(ms(100)).unwrap();
    assert_eq!(payloads(&sim, b).len(), 3);
}

#[test]
fn fn_rules_and_selectors_see_the_packet() {
    let mut sim = plain(SimConfig::with_seed(11), 3);
    let (a, b) = ab();
    let c = NodeId::from_index(2);
    sim.add_rule(
        Loss(1.0)
            .when(move |p| p.from == a && p.to == b)
            .named("cut a->b"),
    );
    sim.add_rule(FnRule::new("slow to c", move |p, _| {
        if p.to == c {
            Verdict::Delay(ms(100))
        } else {
            Verdict::Pass
        }
    }));
    sim.with_node(a, |t, _| t.send(b.addr(), b"1"));
    sim.with_node(b, |t, _| t.send(a.addr(), b"2"));
    sim.with_node(a, |t, _| t.send(c.addr(), b"3"));
    sim.run_until_quiet(ms(1_000)).unwrap();
    assert!(payloads(&sim, b).is_empty(), "a->b is cut");
    assert_eq!(payloads(&sim, a), [b"2".to_vec()], "b->a is not");
    assert_eq!(sim.node(c).received[0].0, at_ms(110));
    let dropped_by = sim.log().iter().find_map(|e| match &e.kind {
        LogKind::Dropped {
            reason: DropReason::Rule(r),
            ..
        } => Some(r.clone()),
        _ => None,
    });
    assert_eq!(dropped_by.as_deref(), Some("cut a->b"));
}

#[test]
fn jitter_stays_within_bounds() {
    let config = SimConfig {
        seed: 12,
        jitter: ms(5),
        ..SimConfig::default()
    };
    let mut sim = plain(config, 2);
    let (a, b) = ab();
    for i in 0..100u8 {
        sim.with_node(a, |t, _| t.send(b.addr(), &[i]));
    }
    sim.run_until_quiet(ms(100)).unwrap();
    let times: Vec<_> = sim.node(b).received.iter().map(|r| r.0).collect();
    assert_eq!(times.len(), 100);
    assert!(times.iter().all(|&t| (at_ms(10)..=at_ms(15)).contains(&t)));
    assert!(times.windows(2).any(|w| w[0] != w[1]));
}

#[test]
fn oversized_and_unroutable_datagrams_are_dropped() {
    let config = SimConfig {
        seed: 13,
        mtu: 100,
        ..SimConfig::default()
    };
    let mut sim = plain(config, 2);
    let (a, b) = ab();
    sim.with_node(a, |t, _| {
        t.send(b.addr(), &[0; 100]);
        t.send(b.addr(), &[0; 101]);
        t.send("192.0.2.1:7000".parse().unwrap(), b"nobody");
        t.send(NodeId::from_index(5).addr(), b"not added");
    });
    sim.run_until_quiet(ms(100)).unwrap();
    assert_eq!(sim.node(b).received.len(), 1);
    let c = sim.counters();
    assert_eq!(
        (c.sent, c.dropped_mtu, c.dropped_no_route, c.delivered),
        (4, 1, 2, 1)
    );
}

/// `StandardFaults` adds the same rules as writing them out by hand, in the same order, so a
/// test that moves to it keeps its seeds' fault schedules, log for log.
#[test]
fn standard_faults_replay_the_hand_written_rules() {
    use cohort_sim::{Sim, StandardFaults};
    let run = |standard: bool, seed: u64| {
        let mut sim = plain(SimConfig::with_seed(seed), 3);
        let nodes: Vec<NodeId> = sim.node_ids().collect();
        for &n in &nodes {
            sim.node_mut(n).echo = true;
        }
        let set = if standard {
            Some(StandardFaults::light().add_to(&mut sim))
        } else {
            sim.add_rule(Loss(0.03));
            sim.add_rule(DuplicateRule(0.03));
            sim.add_rule(ReorderRule(0.03));
            sim.add_rule(DelayRule(0.05, ms(1)..ms(40)));
            sim.add_rule(TamperRule(0.01));
            None
        };
        for i in 0..300u32 {
            let (from, to) = (nodes[(i % 3) as usize], nodes[((i + 1) % 3) as usize]);
            sim.with_node(from, |t, _| t.send(to.addr(), format!("?{i}").as_bytes()));
            sim.run_for(ms(3)).unwrap();
        }
        if let Some(set) = set {
            set.remove(&mut sim);
        } else {
            sim.clear_rules();
        }
        sim.run_for(ms(500)).unwrap();
        let sim: Sim<_> = sim;
        format!("{:?}", sim.log())
    };
    for seed in 0..4 {
        let by_hand = run(false, seed);
        assert!(by_hand.contains("Tampered") && by_hand.contains("Duplicated"));
        assert_eq!(run(true, seed), by_hand, "seed {seed}");
    }
}
