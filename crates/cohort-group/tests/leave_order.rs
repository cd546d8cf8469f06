//! Total order and self delivery when the leader leaves: a leader that asks to leave
//! coordinates the view change that leaves it out, so it is no survivor of its own flush.
//! It delivered every position it ordered at once, perhaps before any survivor did; the
//! flush used to settle the view's last position from the survivors' answers alone, and
//! appended their pending messages at positions the leader had already delivered with
//! other messages: the survivors then delivered another order than the leaver's (total
//! order broken between members that passed to the same side), and a message only the
//! leader had delivered was lost (self delivery broken for its sender). Each case below
//! failed before the fix in `member/flush.rs` (the coordinator's own deliveries count).

mod support;

use cohort_group::Channel;
use std::time::Duration;
use support::Group;

const BOUND: Duration = Duration::from_secs(8);

/// Three members; the leader is cut off, orders a message of its own while a member sends
/// one, asks to leave, and the partition heals `delay_ms` later (before or after the
/// flush timeout, so that the leader's flush reaches the others, or not).
fn leader_leaves_cut_off(seed: u64, delay_ms: u64) -> Result<(), String> {
    let mut g = Group::new(seed, 3, |_| {});
    g.start_all();
    let all: Vec<usize> = (0..3).collect();
    g.wait_converged(&all, BOUND).map_err(|e| e.to_string())?;
    g.run_for(Duration::from_millis(200))
        .map_err(|e| e.to_string())?;
    let leader_id = g.current_views()[0]
        .as_ref()
        .map(|v| v.1[0])
        .ok_or("no view")?;
    let leader = g.index_of(&leader_id).ok_or("leader index")?;
    let others: Vec<usize> = all.iter().copied().filter(|i| *i != leader).collect();
    let a = [g.nodes[leader]];
    let b: Vec<_> = others.iter().map(|i| g.nodes[*i]).collect();
    g.sim.partition(&[&a, &b]);
    assert!(g.send(leader, Channel::Reliable, b"from the leader".to_vec()));
    assert!(g.send(others[0], Channel::Reliable, b"from a member".to_vec()));
    g.run_for(Duration::from_millis(10))
        .map_err(|e| e.to_string())?;
    g.sim
        .with_node(g.nodes[leader], |node, now| node.member.leave(now));
    g.run_for(Duration::from_millis(delay_ms))
        .map_err(|e| e.to_string())?;
    g.sim.heal();
    g.wait_converged(&others, BOUND)
        .map_err(|e| e.to_string())?;
    g.run_for(Duration::from_secs(1))
        .map_err(|e| e.to_string())?;
    g.check_all().map_err(|e| e.to_string())
}

#[test]
fn a_leader_that_leaves_while_cut_off_keeps_order_and_self_delivery() {
    let mut failures = Vec::new();
    for seed in 0..10 {
        for delay_ms in (0..300).step_by(7) {
            if let Err(e) = leader_leaves_cut_off(seed, delay_ms) {
                let first = e.lines().next().unwrap_or_default().to_string();
                failures.push(format!("seed {seed}, heal after {delay_ms} ms: {first}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
