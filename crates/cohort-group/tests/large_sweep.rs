//! Issue 14's simulator sweep at scale: a group of a few hundred members (a thousand in
//! CI) formed from cold, then run with the default timers under lost, duplicated,
//! reordered, delayed and tampered datagrams, a partition and its heal, crashes, leaves and
//! the replaying adversary, with the LKH rekey. At the end every checker of `support` holds
//! (integrity, FIFO and total order, agreement, self delivery, key secrecy), so do the tree
//! checks over every key of the LKH tree (`support::tree`), and the survivors converge on
//! one view and one key.
//!
//! The normal run sweeps 2 seeds at 150 members; `.ci/run` runs 40 at 300, 4 at 1,000 and
//! 2 at 10,000 (in a release build: 5 to 10 minutes and 16 to 23 GB a seed on 2 cores);
//! `scripts/large-sweep.sh` runs more by hand. A seed replays exactly: the members' key
//! shares come from the seeded provider (`support::kit::provider`), so a share the
//! simulator tampers with is the same bytes in every run. `COHORT_SIM_SEEDS=<n>` runs `n`
//! seeds, `COHORT_SIM_SEED=<seed>` replays one, `COHORT_LARGE_SWEEP_MEMBERS=<n>` sets the
//! size, `COHORT_LARGE_SWEEP_NO_CUT=1` leaves the partition out, and `COHORT_SIM_TRACE=1`
//! prints a hash of every datagram sent and every event of the run, to compare two runs.

mod support;

use cohort_core::Timestamp;
use cohort_group::{Channel, GroupConfig, GroupEvent, MemberId, RekeyMethod};
use cohort_sim::{sweep, NodeId, SimFailure, StandardFaults};
use rand_core::RngCore;
use std::collections::BTreeSet;
use std::time::Duration;
use support::tree::tree_checks;
use support::{adversary, sim_config, Group};

/// Members in the normal run's group.
const DEFAULT_MEMBERS: usize = 150;

/// Rounds of faults and traffic after the group formed (150 to 300 ms each).
const ROUNDS: u64 = 30;

/// How long the partition lasts.
const CUT_FOR: Duration = Duration::from_secs(3);

/// Whether the run cuts the group in two and heals it (`COHORT_LARGE_SWEEP_NO_CUT` unset).
/// The cut is what first kept this sweep from 10,000: each side's coordinator sent every
/// member it removed a whole Install listing every member removed (3.5 GB from one member
/// after one input), and every member left out then coordinated the others at once
/// (docs/performance.md, seventeenth and eighteenth sessions). Kept for runs by hand.
fn cut_enabled() -> bool {
    std::env::var_os("COHORT_LARGE_SWEEP_NO_CUT").is_none()
}

fn members() -> usize {
    std::env::var("COHORT_LARGE_SWEEP_MEMBERS")
        .ok()
        .map(|v| v.parse().expect("COHORT_LARGE_SWEEP_MEMBERS is a number"))
        .unwrap_or(DEFAULT_MEMBERS)
}

/// A random member index among `n` that is not in `out`.
fn pick(rng: &mut impl RngCore, n: usize, out: &BTreeSet<usize>) -> usize {
    loop {
        let i = (rng.next_u32() as usize) % n;
        if !out.contains(&i) {
            return i;
        }
    }
}

/// One seed: form `n` members from cold (no faults), then `ROUNDS` rounds of traffic from a
/// few members at a time under light faults, with the adversary every third round, one
/// partition cutting about an eighth of the members off (healed `CUT_FOR` later), two
/// crashes and two leaves at random ranks (the leader among the candidates), then the faults
/// go, the survivors must converge, each sends once more, and every check runs.
fn large_run(seed: u64, n: usize) -> Result<(), SimFailure> {
    let degree = if seed % 2 == 1 { 2 } else { 4 };
    let mut sim = sim_config(seed);
    // The simulator stops a node that sends more than this after one input, as a livelock.
    // At 10,000 members (seed 0, without the cut, with the fast timers of an earlier
    // version of this test) the leader sent 139,935 datagrams of about 60 bytes to 9,995
    // members after one input, and then stopped: a burst, not a livelock. Their size is
    // that of the pending messages a coordinator appended, then one Ordered per message and
    // survivor (a burst of that shape at 3,000 members was; they go in OrderedRuns now);
    // that run was not replayed. The bound still grows only with n.
    sim.max_outputs_per_drain = sim.max_outputs_per_drain.max(n * 40);
    // The default timers (heartbeat 100 ms, suspicion 1 s, flush 500 ms), not the
    // other group tests' fast ones: a flush that must reach thousands of members through
    // the overlay under loss needs the default flush timeout.
    let defaults = GroupConfig::new("sim", Vec::new());
    let mut g = Group::new_in(sim, n, |_, c| {
        c.rekey_method = RekeyMethod::Lkh { degree };
        c.heartbeat_interval = defaults.heartbeat_interval;
        c.suspect_timeout = defaults.suspect_timeout;
        c.flush_timeout = defaults.flush_timeout;
    });
    // Every member starts at once with the founder as its only contact, as the benchmark's
    // cold start does (10,000 formed in 1.65 s of simulated time there); the bound is the
    // issue's 60 s for 10,000.
    let trace = std::env::var_os("COHORT_SIM_TRACE").is_some();
    if trace {
        g.start_tracing();
    }
    let formed = g.form_from_cold(n, Duration::from_secs(60))?;
    println!("seed {seed}: {n} members formed in {formed:?} of simulated time");
    let mut rng = g.sim.fork_rng();
    let faults = StandardFaults::light().add_to(&mut g.sim);
    let mut gone: BTreeSet<usize> = BTreeSet::new();
    let mut cut: Option<(Timestamp, BTreeSet<MemberId>)> = None;
    let mut healed = false;
    let cut_round = 2 + u64::from(rng.next_u32() % 6);
    let crash_rounds = [
        u64::from(rng.next_u32() % 20),
        u64::from(rng.next_u32() % 20),
    ];
    let leave_rounds = [
        u64::from(rng.next_u32() % 20),
        u64::from(rng.next_u32() % 20),
    ];
    for round in 0..ROUNDS {
        for _ in 0..6 {
            let i = pick(&mut rng, n, &gone);
            let channel = if rng.next_u32().is_multiple_of(4) {
                Channel::Unreliable
            } else {
                Channel::Reliable
            };
            g.send(i, channel, format!("m{i}-{round}").into_bytes());
        }
        if round % 3 == 0 {
            adversary(&mut g, &mut rng);
        }
        if round == cut_round && cut_enabled() {
            let (small, rest): (Vec<NodeId>, Vec<NodeId>) = g
                .nodes
                .iter()
                .partition(|_| rng.next_u32().is_multiple_of(8));
            g.sim.partition(&[&small, &rest]);
            cut = Some((
                g.sim.now(),
                small.iter().map(|n| g.ids[n.index()]).collect(),
            ));
        }
        // Healed once the cut lasted `CUT_FOR`: long enough, with the default timers, for
        // the members cut off to notice (suspicion 1 s), probe and install a view of their
        // own.
        if cut
            .as_ref()
            .is_some_and(|(at, _)| g.sim.now() >= *at + CUT_FOR)
            && !healed
        {
            healed = true;
            g.sim.heal();
        }
        for at in crash_rounds {
            if at == round {
                let victim = pick(&mut rng, n, &gone);
                g.crash(victim);
                gone.insert(victim);
            }
        }
        for at in leave_rounds {
            if at == round {
                let leaver = pick(&mut rng, n, &gone);
                g.sim
                    .with_node(g.nodes[leaver], |node, now| node.member.leave(now));
                gone.insert(leaver);
            }
        }
        g.run_for(Duration::from_millis(150 + u64::from(rng.next_u32() % 150)))?;
    }
    faults.remove(&mut g.sim);
    g.sim.heal();
    let live: Vec<usize> = (0..n).filter(|i| !gone.contains(i)).collect();
    let took = match g.wait_converged(&live, Duration::from_secs(30)) {
        Ok(took) => took,
        Err(e) => {
            left_behind(&g, &live);
            return Err(e);
        }
    };
    println!(
        "seed {seed}: {} survivors converged {took:?} after the faults ended",
        live.len()
    );
    for i in live.iter().step_by((live.len() / 8).max(1)) {
        g.send(*i, Channel::Reliable, format!("m{i}-last").into_bytes());
    }
    g.run_for(Duration::from_secs(2))?;
    if trace {
        let mut all = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&g.trace(), &mut all);
        println!(
            "seed {seed}: trace {:016x}",
            std::hash::Hasher::finish(&all)
        );
    }
    happened(&g, cut)?;
    g.check_all()?;
    let started: BTreeSet<usize> = (0..n).collect();
    tree_checks(&g, &started, &live)
}

/// After the survivors failed to converge: the members of `live` outside the view most of
/// them hold (at most 12), each with its state and its last events other than deliveries,
/// so that a failure at thousands of members says who was left behind and how.
fn left_behind(g: &Group, live: &[usize]) {
    let mut count: std::collections::BTreeMap<String, usize> = Default::default();
    let views: Vec<Option<String>> = live
        .iter()
        .map(|i| {
            let v = g.sim.node(g.nodes[*i]).member.view();
            v.map(|v| format!("{} ({} members)", v.id, v.members.len()))
        })
        .collect();
    for v in views.iter().flatten() {
        *count.entry(v.clone()).or_default() += 1;
    }
    println!("views held by the survivors: {count:?}");
    let most = count
        .iter()
        .max_by_key(|(_, c)| **c)
        .map(|(v, _)| v.clone());
    let behind = live
        .iter()
        .zip(&views)
        .filter(|(i, v)| {
            v.as_ref() != most.as_ref() || g.sim.node(g.nodes[**i]).member.status().changing_view
        })
        .map(|(i, _)| *i);
    for i in behind.take(12) {
        let node = g.nodes[i];
        let mut state = g.sim.node(node).member.debug_state();
        state.truncate(600);
        println!("left behind: member {i} ({}): {state}", g.ids[i]);
        let events: Vec<String> = g
            .sim
            .events_of(node)
            .filter(|(_, e)| !matches!(e, GroupEvent::Deliver { .. }))
            .map(|(t, e)| match e {
                GroupEvent::View(v) => format!("{t:?} View {} of {}", v.id, v.members.len()),
                other => {
                    let mut s = format!("{t:?} {other:?}");
                    s.truncate(200);
                    s
                }
            })
            .collect();
        for e in &events[events.len().saturating_sub(12)..] {
            println!("    {e}");
        }
        // The views installed elsewhere after this member's own, and whether each lists it.
        let own = g.sim.node(node).member.view().map(|v| v.id);
        let mut seen = BTreeSet::new();
        let later: Vec<String> = g
            .sim
            .events()
            .filter_map(|(t, _, e)| match e {
                GroupEvent::View(v) if own.is_none_or(|o| v.id > o) && seen.insert(v.id) => {
                    Some(format!(
                        "{} of {} at {t:?}, lists it: {}",
                        v.id,
                        v.members.len(),
                        v.contains(&g.ids[i])
                    ))
                }
                _ => None,
            })
            .take(6)
            .collect();
        println!("    later views: {later:?}");
    }
}

/// That the run did what it says, so the checks have something to check: the members cut
/// off formed a view of their own (unless every one of them crashed or left first), the
/// group delivered reliable messages, and members dropped and counted bad packets (the
/// adversary's and the tampered ones).
fn happened(g: &Group, cut: Option<(Timestamp, BTreeSet<MemberId>)>) -> Result<(), SimFailure> {
    let (at, small) = match cut {
        Some(cut) => cut,
        None if !cut_enabled() => (Timestamp::MAX, BTreeSet::new()),
        None => return Err(g.sim.failure("no partition was made".to_string())),
    };
    let mut cut_off_view = false;
    let mut delivered = 0u64;
    for (time, _, e) in g.sim.events() {
        match e {
            GroupEvent::View(v) if time >= at => {
                cut_off_view |= v.ids().all(|id| small.contains(&id));
            }
            GroupEvent::Deliver {
                channel: Channel::Reliable,
                ..
            } => delivered += 1,
            _ => {}
        }
    }
    let small_live = small
        .iter()
        .any(|id| g.index_of(id).is_some_and(|i| !g.crashed.contains(&i)));
    let dropped: u64 = g
        .nodes
        .iter()
        .map(|n| g.sim.node(*n).member.counters().total())
        .sum();
    println!(
        "{} members cut off, a view of their own: {cut_off_view}; {delivered} reliable \
         deliveries; {dropped} packets dropped and counted",
        small.len()
    );
    if (small_live && !cut_off_view) || delivered == 0 || dropped == 0 {
        return Err(g.sim.failure(format!(
            "the run did not do what it should: cut-off view {cut_off_view} (cut-off members \
             live: {small_live}), {delivered} deliveries, {dropped} drops"
        )));
    }
    Ok(())
}

#[test]
fn a_few_hundred_members_under_faults_partitions_crashes_leaves_and_replays() {
    let n = members();
    sweep(2, |seed| large_run(seed, n));
}
