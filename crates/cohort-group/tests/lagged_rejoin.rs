//! A member removed for lagging is alive and reachable: it must end up in a view again.
//!
//! Issue 17 §2: in the group chaos soak one member that was never killed answered every
//! status request without a view for 30 s while the eight others settled in one view. One
//! path leaves a live, connected member with no view and nothing that ever gives it one:
//! the sequencer's back-pressure removes the member holding the lowest acknowledgement
//! (reason `Lagged`) when the stable point has not moved for a suspicion timeout, and the
//! member removed so used to report `Expelled { Lagged }` and stop there (no view, no
//! join, no timer), while `cohort group run` kept running and answering `status`. A
//! member starved of CPU, or one whose data packets are lost for a while, lags so.
//!
//! Here the big packets (the relayed reliable messages) to one member are dropped for a
//! while under a steady reliable load, so that its acknowledgements stall while its
//! heartbeats still arrive; then the drops stop. Every member must share one view of all
//! four within the bound, and the survivors must have reported the victim removed as
//! `Lagged` in at least one seed (or the test does not exercise the path, and fails).

mod support;

use cohort_group::{Channel, GroupEvent, RemovalReason};
use cohort_sim::{FnRule, Verdict};
use std::time::Duration;
use support::Group;

const N: usize = 4;
const BOUND: Duration = Duration::from_secs(10);

/// Runs one seed; Ok(true) when the victim was removed as lagged and came back, Ok(false)
/// when it was never removed as lagged (the path not exercised), Err on a failure.
fn lagged_member_comes_back(seed: u64) -> Result<bool, String> {
    let mut g = Group::new(seed, N, |c| {
        c.backlog_limit = 32;
        c.send_window = 16;
    });
    g.start_all();
    let all: Vec<usize> = (0..N).collect();
    g.wait_converged(&all, BOUND).map_err(|e| e.to_string())?;
    let leader_id = g.current_views()[0]
        .as_ref()
        .map(|v| v.1[0])
        .ok_or("no view")?;
    let leader = g.index_of(&leader_id).ok_or("leader index")?;
    let victim = (leader + 1) % N;
    let to = g.nodes[victim];
    let rule = g.sim.add_rule(FnRule::new("big-to-victim", move |p, _| {
        if p.to == to && p.bytes.len() > 400 {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    }));
    let mut k = 0u64;
    // 2.5 s of steady reliable traffic (600-byte messages) from the others while the
    // victim loses every big packet, then 0.5 s more with the drops over.
    for step in 0..300 {
        if step == 250 {
            g.sim.remove_rule(rule);
        }
        for i in all.iter().copied().filter(|i| *i != victim) {
            let mut data = vec![0u8; 600];
            data[..8].copy_from_slice(&k.to_be_bytes());
            data[8] = i as u8;
            k += 1;
            g.send(i, Channel::Reliable, data);
        }
        g.run_for(Duration::from_millis(10))
            .map_err(|e| e.to_string())?;
    }
    // The survivors report the removal with its reason.
    let victim_id = g.ids[victim];
    let lagged = g.events_per_node().iter().flatten().any(|e| {
        matches!(
            e,
            GroupEvent::Removed {
                member,
                reason: RemovalReason::Lagged
            } if *member == victim_id
        )
    });
    g.wait_converged(&all, BOUND).map_err(|e| {
        format!(
            "victim n{victim} (lagged out: {lagged}), last events {:?}: {e}",
            g.events_per_node()[victim]
                .iter()
                .rev()
                .filter(|e| !matches!(e, GroupEvent::Deliver { .. }))
                .take(4)
                .collect::<Vec<_>>()
        )
    })?;
    g.run_for(Duration::from_secs(1))
        .map_err(|e| e.to_string())?;
    g.check_all().map_err(|e| e.to_string())?;
    Ok(lagged)
}

#[test]
fn a_member_removed_for_lagging_rejoins() {
    let mut failures = Vec::new();
    let mut exercised = 0;
    for seed in 0..8 {
        match lagged_member_comes_back(seed) {
            Ok(true) => exercised += 1,
            Ok(false) => {}
            Err(e) => failures.push(format!("seed {seed}: {e}")),
        }
    }
    println!("the victim was removed as lagged in {exercised} of 8 seeds");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        exercised > 0,
        "no seed removed the victim as lagged: the test does not exercise the path"
    );
}
