//! The group's security stacks and attacks on them, in the simulator: the three protection
//! modes, gears chosen at run time, replays across views, removed members, lagging members,
//! and the bytes protection adds to a packet.

mod support;

use cohort_core::Machine;
use cohort_gears::GearId;
use cohort_group::{Channel, Drop, GroupEvent, Protection, RemovalReason};
use cohort_sim::FnRule;
use cohort_sim::Verdict;
use std::time::Duration;
use support::Group;

const BOUND: Duration = Duration::from_secs(6);

fn talk(g: &mut Group, rounds: u64) {
    let n = g.nodes.len();
    for k in 0..rounds {
        for i in 0..n {
            g.send(i, Channel::Reliable, format!("r{i}-{k}").into_bytes());
        }
        g.send(
            k as usize % n,
            Channel::Unreliable,
            format!("u{k}").into_bytes(),
        );
    }
}

fn reliable_count(g: &Group, i: usize) -> usize {
    g.events_per_node()[i]
        .iter()
        .filter(|e| {
            matches!(
                e,
                GroupEvent::Deliver {
                    channel: Channel::Reliable,
                    ..
                }
            )
        })
        .count()
}

#[test]
fn every_protection_mode_runs_the_same_protocol() {
    let modes = [
        Protection::Encrypt(GearId::Aes128Gcm),
        Protection::Encrypt(GearId::ChaCha20Poly1305),
        Protection::Authenticate {
            gears: vec![GearId::HmacSha256, GearId::Umac64],
            floor_bits: 60.0,
            dual_tags: true,
        },
        Protection::DangerNoneForTesting,
    ];
    for (k, mode) in modes.into_iter().enumerate() {
        let mut g = Group::new(20 + k as u64, 4, |c| c.protection = mode.clone());
        g.start_all();
        g.wait_converged(&[0, 1, 2, 3], BOUND).expect("one view");
        talk(&mut g, 10);
        g.run_for(Duration::from_secs(1)).expect("run");
        g.check_all().expect("checkers");
        for i in 0..4 {
            assert_eq!(reliable_count(&g, i), 40, "mode {mode:?}, node {i}");
        }
    }
}

#[test]
fn aead_packets_hide_the_payload_and_mac_packets_do_not() {
    for (mode, visible) in [
        (Protection::Encrypt(GearId::Aes128Gcm), false),
        (
            Protection::Authenticate {
                gears: vec![GearId::HmacSha256],
                floor_bits: 100.0,
                dual_tags: false,
            },
            true,
        ),
    ] {
        let mut g = Group::new(31, 2, |c| c.protection = mode.clone());
        g.start_all();
        g.wait_converged(&[0, 1], BOUND).expect("one view");
        for _ in 0..20 {
            g.send(0, Channel::Unreliable, b"SECRET-PAYLOAD-MARKER".to_vec());
        }
        g.run_for(Duration::from_millis(200)).expect("run");
        let tap = &g.sim.node(g.nodes[0]).watch.tap;
        let seen = tap
            .iter()
            .any(|(_, p)| p.windows(21).any(|w| w == b"SECRET-PAYLOAD-MARKER"));
        assert_eq!(seen, visible, "{mode:?}");
    }
}

#[test]
fn protection_adds_32_bytes_with_an_aead_gear() {
    // A packet carrying an unreliable message of n bytes: gears prefix, group header and
    // tag (the protection) plus the destination rank, the message type and the message
    // number (the protocol).
    let mut g = Group::new(32, 2, |_| {});
    g.start_all();
    g.wait_converged(&[0, 1], BOUND).expect("one view");
    let payload = vec![0x5a; 1000];
    let dest = g.sim.addr(g.nodes[1]);
    let n = g.nodes[0];
    let packets = g.sim.with_node(n, |node, now| {
        node.member
            .send(now, Channel::Unreliable, &payload)
            .expect("send");
        let mut out = Vec::new();
        let mut buf = Vec::new();
        while let Some(t) = node.member.poll_transmit(now, &mut buf) {
            out.push((t.destination, buf[..t.size].to_vec()));
            buf.clear();
        }
        out
    });
    let (_, packet) = packets
        .iter()
        .find(|(to, p)| *to == dest && p.len() > 1000)
        .expect("the unreliable packet");
    let protocol = 2 + 1 + 8;
    let protection = packet.len() - payload.len() - protocol;
    assert_eq!(protection, 32, "packet of {} bytes", packet.len());
}

#[test]
fn replays_from_an_earlier_view_are_refused() {
    let mut g = Group::new(33, 3, |_| {});
    g.start_all();
    g.wait_converged(&[0, 1, 2], BOUND).expect("one view");
    talk(&mut g, 10);
    g.run_for(Duration::from_millis(500)).expect("run");
    let captured: Vec<(std::net::SocketAddr, Vec<u8>)> = g.sim.node(g.nodes[0]).watch.tap.clone();
    assert!(!captured.is_empty());
    let before: Vec<usize> = (0..3).map(|i| reliable_count(&g, i)).collect();
    // Same view first: every replay hits a replay window.
    let from = g.sim.addr(g.nodes[0]);
    for (_, p) in &captured {
        g.sim
            .inject(from, g.nodes[1], p.clone(), Duration::from_millis(1));
    }
    g.run_for(Duration::from_millis(100)).expect("run");
    let c = *g.sim.node(g.nodes[1]).member.counters();
    assert!(c.get(Drop::Replayed) > 0, "{c:?}");
    // Then a rekey, and the same packets again: under keys no longer held (or, within the
    // grace window, the old view's replay windows).
    let leader = g.nodes[0];
    g.sim.with_node(leader, |node, now| node.member.rekey(now));
    g.run_for(Duration::from_secs(3)).expect("run");
    for (_, p) in &captured {
        g.sim
            .inject(from, g.nodes[1], p.clone(), Duration::from_millis(1));
    }
    g.run_for(Duration::from_millis(100)).expect("run");
    let after: Vec<usize> = (0..3).map(|i| reliable_count(&g, i)).collect();
    assert_eq!(before, after, "a replay was delivered");
    let c2 = *g.sim.node(g.nodes[1]).member.counters();
    assert!(
        c2.get(Drop::KeyNotHeld) > c.get(Drop::KeyNotHeld),
        "old-view replays not counted as under a key not held: {c2:?}"
    );
    g.check_all().expect("checkers");
}

#[test]
fn a_member_that_left_cannot_read_what_follows() {
    let mut g = Group::new(34, 3, |_| {});
    g.start_all();
    g.wait_converged(&[0, 1, 2], BOUND).expect("one view");
    let leaver = g.nodes[2];
    g.sim.with_node(leaver, |node, now| node.member.leave(now));
    g.wait_converged(&[0, 1], BOUND).expect("two remain");
    // What the others send now, copied to the leaver, is refused.
    g.sim.node_mut(g.nodes[0]).watch.tap.clear();
    talk(&mut g, 5);
    g.run_for(Duration::from_millis(500)).expect("run");
    let from = g.sim.addr(g.nodes[0]);
    let copies: Vec<Vec<u8>> = g
        .sim
        .node(g.nodes[0])
        .watch
        .tap
        .iter()
        .map(|(_, p)| p.clone())
        .collect();
    assert!(!copies.is_empty());
    for p in copies {
        g.sim.inject(from, leaver, p, Duration::from_millis(1));
    }
    g.run_for(Duration::from_millis(100)).expect("run");
    let delivered_after_leaving = g.events_per_node()[2]
        .iter()
        .skip_while(|e| !matches!(e, GroupEvent::Expelled { .. }))
        .filter(|e| matches!(e, GroupEvent::Deliver { .. }))
        .count();
    assert_eq!(delivered_after_leaving, 0);
    // And its key ledger never got the survivors' new key (check_all's key secrecy).
    g.check_all().expect("checkers");
}

#[test]
fn a_member_that_falls_behind_the_backlog_is_removed() {
    let mut g = Group::new(35, 4, |c| {
        c.backlog_limit = 64;
        c.send_window = 16;
        c.suspect_timeout = Duration::from_secs(5);
    });
    g.start_all();
    g.wait_converged(&[0, 1, 2, 3], Duration::from_secs(20))
        .expect("one view");
    // Node 3 stops receiving big packets (ordered messages; its own packets still go out
    // and heartbeats still arrive, so it is not suspected): it can only fall behind.
    let victim = g.nodes[3];
    let deaf = g.sim.add_rule(FnRule::new(
        "deaf",
        move |p: &cohort_sim::PacketView<'_>, _rng: &mut dyn rand_core::RngCore| {
            if p.to == victim && p.bytes.len() > 200 {
                Verdict::Drop
            } else {
                Verdict::Pass
            }
        },
    ));
    // Big messages, so the rule can tell them from heartbeats.
    for k in 0..30u64 {
        for i in 0..4 {
            g.send(i, Channel::Reliable, vec![k as u8; 300]);
        }
        g.run_for(Duration::from_millis(100)).expect("run");
    }

    g.wait_converged(&[0, 1, 2], Duration::from_secs(10))
        .expect("the others go on without it");
    let removed_as_lagging = g.events_per_node()[0].iter().any(|e| {
        matches!(
            e,
            GroupEvent::Removed {
                reason: RemovalReason::Lagged,
                ..
            }
        )
    });
    assert!(removed_as_lagging, "not removed for lagging");
    // Once it hears again, it finds it is alone (its own messages are delivered in its
    // own view) and merges back.
    g.sim.remove_rule(deaf);
    g.wait_converged(&[0, 1, 2, 3], Duration::from_secs(40))
        .expect("all four again");
    g.check_all().expect("checkers");
}

#[test]
fn the_controller_shifts_to_a_faster_gear_under_reported_load() {
    let mut g = Group::new(36, 3, |c| {
        c.protection = Protection::Authenticate {
            gears: vec![GearId::HmacSha256, GearId::Umac64],
            floor_bits: 60.0,
            dual_tags: true,
        };
    });
    g.start_all();
    g.wait_converged(&[0, 1, 2], BOUND).expect("one view");
    let gear0 = g.sim.node(g.nodes[1]).member.status().gear;
    assert_eq!(gear0, "hmac-sha256");
    // Receivers report a saturated CPU in their heartbeats; the leader passes the worst
    // load on; after the controller's dwell every sender shifts down.
    for n in g.nodes.clone() {
        g.sim.with_node(n, |node, _| node.member.set_load(0.97));
    }
    for _ in 0..80 {
        talk(&mut g, 1);
        g.run_for(Duration::from_millis(100)).expect("run");
    }
    for (i, n) in g.nodes.iter().enumerate() {
        let gear = g.sim.node(*n).member.status().gear;
        assert_eq!(gear, "umac-64", "node {i} still on {gear}");
    }
    g.check_all().expect("checkers");
}

#[test]
fn periodic_rekey_and_rekey_free_views_when_the_policy_says_so() {
    // A key every second, and none on membership changes.
    let mut g = Group::new(37, 3, |c| {
        c.rekey_policy.period = Some(Duration::from_secs(1));
        c.rekey_policy.on_membership_change = false;
    });
    g.start_all();
    g.wait_converged(&[0, 1, 2], BOUND).expect("one view");
    let first = g.current_views()[0].as_ref().map(|v| v.2).expect("view");
    talk(&mut g, 5);
    g.run_for(Duration::from_millis(3500)).expect("run");
    let later = g.current_views()[0].as_ref().map(|v| v.2).expect("view");
    assert!(later >= first + 3, "epochs {first} -> {later} in 3.5 s");
    g.check_all().expect("checkers");
    // A leave without a rekey: the view changes, the key epoch does not.
    let before = g.current_views()[0]
        .as_ref()
        .map(|v| (v.0, v.2))
        .expect("view");
    let n = g.nodes[2];
    g.sim.with_node(n, |node, now| node.member.leave(now));
    g.run_for(Duration::from_millis(300)).expect("run");
    let after = g.current_views()[0]
        .as_ref()
        .map(|v| (v.0, v.2))
        .expect("view");
    assert_ne!(before.0, after.0, "no new view");
    assert_eq!(before.1, after.1, "rekeyed although the policy says not to");
}
