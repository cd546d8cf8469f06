//! The bytes of one view change that lets one member in and one out, in a group of 1,000
//! (`VIEW_CHANGE_MEMBERS` sets another size): every datagram any node sends is counted by
//! a simulator rule while the change runs, by kind (group packet or pair channel) and
//! size, minus the heartbeats of an equally long quiet window measured just before. Slow
//! timers (heartbeat 1 s) keep that background small. Ignored by default (it forms the
//! group first); run with `--ignored --nocapture` to read the figures.

mod support;

use cohort_group::pair::PAIR_KIND;
use cohort_sim::{FnRule, Verdict};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::Group;

#[derive(Default)]
struct Tally {
    on: bool,
    /// (kind, size) -> datagrams.
    sizes: BTreeMap<(&'static str, usize), u64>,
}

impl Tally {
    fn total(&self) -> (u64, u64) {
        self.sizes
            .iter()
            .fold((0, 0), |(n, b), ((_, s), c)| (n + c, b + c * *s as u64))
    }
}

#[test]
#[ignore = "forms a group of 1,000 first; run with --ignored --nocapture"]
fn one_join_one_leave_bytes() {
    let n: usize = std::env::var("VIEW_CHANGE_MEMBERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let mut g = Group::new(91, n + 1, |c| {
        c.heartbeat_interval = Duration::from_secs(1);
        c.suspect_timeout = Duration::from_secs(5);
        c.flush_timeout = Duration::from_millis(500);
    });
    let tally = Arc::new(Mutex::new(Tally::default()));
    let t = tally.clone();
    g.sim.add_rule(FnRule::new("count", move |p, _| {
        let mut t = t.lock().expect("lock");
        if t.on {
            let kind = match p.bytes.first() {
                Some(&PAIR_KIND) => "pair",
                Some(&cohort_gears::PACKET_VERSION) => "group",
                _ => "other",
            };
            *t.sizes.entry((kind, p.bytes.len())).or_insert(0) += 1;
        }
        Verdict::Pass
    }));
    let first: SocketAddr = g.sim.addr(g.nodes[0]);
    g.sim
        .with_node(g.nodes[0], |node, now| node.member.start(now, &[]));
    g.run_for(Duration::from_millis(50)).expect("run");
    // Members come up 50 every 100 ms (see large_group.rs).
    for (k, i) in (1..n).enumerate() {
        if k > 0 && k % 50 == 0 {
            g.run_for(Duration::from_millis(100)).expect("run");
        }
        g.sim
            .with_node(g.nodes[i], |node, now| node.member.start(now, &[first]));
    }
    let want: BTreeSet<_> = g.ids[..n].iter().copied().collect();
    let mut formed = false;
    for _ in 0..600 {
        g.run_for(Duration::from_millis(250)).expect("run");
        let views = g.current_views();
        let id = views[0].as_ref().map(|v| v.0);
        formed = views[..n].iter().all(|v| {
            v.as_ref().is_some_and(|(vid, m, _)| {
                Some(*vid) == id && m.iter().copied().collect::<BTreeSet<_>>() == want
            })
        });
        if formed {
            break;
        }
    }
    assert!(formed, "the group did not form");
    // Settle (grace periods, pair channels), then a quiet window for the background.
    g.run_for(Duration::from_secs(3)).expect("run");
    let window = Duration::from_secs(2);
    tally.lock().expect("lock").on = true;
    g.run_for(window).expect("run");
    let quiet = std::mem::take(&mut *tally.lock().expect("lock"));
    // The change: member n-1 leaves and member n joins (its pair channel with the leader
    // is part of the cost), counted over the same window.
    tally.lock().expect("lock").on = true;
    g.sim
        .with_node(g.nodes[n - 1], |node, now| node.member.leave(now));
    g.sim
        .with_node(g.nodes[n], |node, now| node.member.start(now, &[first]));
    g.run_for(window).expect("run");
    let change = std::mem::take(&mut *tally.lock().expect("lock"));
    let views = g.current_views();
    let leader_view = views[0].as_ref().expect("view");
    assert!(leader_view.1.contains(&g.ids[n]), "the joiner is not in");
    assert!(
        !leader_view.1.contains(&g.ids[n - 1]),
        "the leaver is still in"
    );
    let (qn, qb) = quiet.total();
    let (cn, cb) = change.total();
    println!("members: {n}; window {window:?}");
    println!("quiet window: {qn} datagrams, {qb} bytes");
    println!("change window: {cn} datagrams, {cb} bytes");
    println!(
        "the change: {} datagrams, {} bytes ({:.1} KiB)",
        cn.saturating_sub(qn),
        cb.saturating_sub(qb),
        cb.saturating_sub(qb) as f64 / 1024.0
    );
    println!("by kind and size (datagrams in the change window, quiet window):");
    let keys: BTreeSet<_> = change.sizes.keys().chain(quiet.sizes.keys()).collect();
    for k in keys {
        let c = change.sizes.get(k).copied().unwrap_or(0);
        let q = quiet.sizes.get(k).copied().unwrap_or(0);
        if c > 0 || q > 0 {
            println!("  {:5} {:6} bytes: {c:6} {q:6}", k.0, k.1);
        }
    }
}
