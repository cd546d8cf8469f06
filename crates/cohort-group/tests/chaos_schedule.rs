//! The group chaos run's schedule in the simulator: nine members in three "namespaces",
//! the chaos script's timers, and its faults (a namespace cut off, one direction of a link
//! cut, members that stop trusting one of the others for a while, a crash and restart).
//! After every fault the live members must share one view again, and no member that did
//! not ask to leave may end up expelled.

mod support;

use cohort_group::{Channel, GroupEvent, RemovalReason};
use cohort_sim::{FnRule, SimFailure, Verdict};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use std::net::SocketAddr;
use std::time::Duration;
use support::{Group, Node, Tap};

const N: usize = 9;

/// The chaos script's promise: one view and one key within this long after a fault ends.
const HEAL_BOUND: Duration = Duration::from_secs(5);

fn chaos_timers(c: &mut cohort_group::GroupConfig) {
    c.heartbeat_interval = Duration::from_millis(50);
    c.suspect_timeout = Duration::from_millis(600);
    c.flush_timeout = Duration::from_millis(300);
}

fn namespace(k: usize) -> Vec<usize> {
    (3 * k..3 * k + 3).collect()
}

/// A member expelled without having asked to leave, by node index.
fn expelled_without_leaving(g: &Group) -> Option<(usize, RemovalReason)> {
    for (_, node, e) in g.sim.events() {
        if let GroupEvent::Expelled { reason } = e {
            let i = g.nodes.iter().position(|n| *n == node)?;
            return Some((i, *reason));
        }
    }
    None
}

/// `faults` faults on the schedule `seed` picks, with crashes and restarts among them if
/// `restarts`, and rekeys and (with `restarts`) killed leaders between them if `extras`. Runs without restarts end with every checker over the whole run (a
/// restarted member numbers its messages from 0 again, which the checkers' record of what
/// was sent cannot tell from a replay).
fn run(seed: u64, faults: usize, restarts: bool, extras: bool) -> Result<(), SimFailure> {
    let mut g = Group::new(seed, N, chaos_timers);
    let mut rng = g.sim.fork_rng();
    let mut extra = extras.then(|| ChaCha8Rng::seed_from_u64(seed));
    g.start_all();
    let all: Vec<usize> = (0..N).collect();
    g.wait_converged(&all, Duration::from_secs(30))?;
    for fault in 0..faults {
        let kind = rng.next_u32() % if restarts { 4 } else { 3 };
        let ms = |rng: &mut cohort_sim::SimRng, lo: u64, hi: u64| {
            Duration::from_millis(lo + rng.next_u64() % (hi - lo))
        };
        let what;
        match kind {
            0 => {
                let k = (rng.next_u32() % 3) as usize;
                let d = ms(&mut rng, 500, 4000);
                what = format!("namespace {k} cut off for {d:?}");
                let inside: Vec<_> = namespace(k).iter().map(|i| g.nodes[*i]).collect();
                let outside: Vec<_> = (0..N).filter(|i| i / 3 != k).map(|i| g.nodes[i]).collect();
                g.sim.partition(&[&inside, &outside]);
                traffic(&mut g, &mut rng, d)?;
                g.sim.heal();
            }
            1 => {
                let a = (rng.next_u32() % 3) as usize;
                let b = (a + 1 + (rng.next_u32() % 2) as usize) % 3;
                let d = ms(&mut rng, 300, 2000);
                what = format!("one direction cut, namespace {a} -> {b}, for {d:?}");
                let from: Vec<_> = namespace(a).iter().map(|i| g.nodes[*i]).collect();
                let to: Vec<_> = namespace(b).iter().map(|i| g.nodes[*i]).collect();
                let rule = g.sim.add_rule(FnRule::new("one-way", move |p, _| {
                    if from.contains(&p.from) && to.contains(&p.to) {
                        Verdict::Drop
                    } else {
                        Verdict::Pass
                    }
                }));
                traffic(&mut g, &mut rng, d)?;
                g.sim.remove_rule(rule);
            }
            2 => {
                let target = (rng.next_u32() % N as u32) as usize;
                let mut who: Vec<usize> = Vec::new();
                while who.len() < 3 {
                    let w = (rng.next_u32() % N as u32) as usize;
                    if w != target && !who.contains(&w) && !g.crashed.contains(&w) {
                        who.push(w);
                    }
                }
                let d = ms(&mut rng, 1000, 4000);
                what = format!("{who:?} stop trusting {target} for {d:?}");
                let without: Vec<_> = g
                    .ids
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != target)
                    .map(|(_, id)| *id)
                    .collect();
                for w in &who {
                    let t = without.clone();
                    g.sim
                        .with_node(g.nodes[*w], |n, now| n.member.set_trust(now, t));
                }
                traffic(&mut g, &mut rng, d)?;
                let everyone = g.ids.clone();
                for w in &who {
                    let t = everyone.clone();
                    g.sim
                        .with_node(g.nodes[*w], |n, now| n.member.set_trust(now, t));
                }
            }
            _ => {
                let victim = (rng.next_u32() % N as u32) as usize;
                let d = ms(&mut rng, 300, 2000);
                what = format!("crash {victim}, restart after {d:?}");
                crash_and_restart(&mut g, &mut rng, victim, d)?;
            }
        }
        healed(&mut g, &format!("fault {fault} ({what})"))?;
        if std::env::var("VERBOSE").is_ok() {
            println!("  {:?} fault {fault}: {what}", g.sim.now());
        }
        let settle = ms(&mut rng, 200, 1500);
        traffic(&mut g, &mut rng, settle)?;
        // The script's other faults, from a generator of their own (so that a schedule
        // without them stays the same): a rekey asked of any member, and the leader
        // killed and restarted.
        let Some(extra) = extra.as_mut() else {
            continue;
        };
        if extra.next_u32().is_multiple_of(4) {
            let i = (extra.next_u32() % N as u32) as usize;
            g.sim.with_node(g.nodes[i], |n, now| n.member.rekey(now));
            healed(&mut g, &format!("after fault {fault}, rekey at {i}"))?;
        }
        if restarts && extra.next_u32().is_multiple_of(6) {
            let leader = g.current_views()[0]
                .as_ref()
                .and_then(|(_, members, _)| g.index_of(&members[0]));
            if let Some(victim) = leader {
                let d = Duration::from_millis(300 + extra.next_u64() % 1700);
                crash_and_restart(&mut g, extra, victim, d)?;
                healed(
                    &mut g,
                    &format!("after fault {fault}, leader {victim} killed, restarted after {d:?}"),
                )?;
            }
        }
    }
    if restarts {
        return Ok(());
    }
    g.check_all()
}

/// After a fault: no member expelled, and one view of all nine within [`HEAL_BOUND`].
fn healed(g: &mut Group, label: &str) -> Result<(), SimFailure> {
    let all: Vec<usize> = (0..N).collect();
    let converged = g.wait_converged(&all, HEAL_BOUND);
    if let Some((i, reason)) = expelled_without_leaving(g) {
        return Err(g.sim.failure(format!(
            "{label}: member {i} expelled ({reason:?}) without asking to leave"
        )));
    }
    converged
        .map(|_| ())
        .map_err(|e| g.sim.failure(format!("{label}: {e}")))
}

/// Crashes member `victim` and restarts it (a new process: new incarnation, empty state)
/// after `d`, with traffic meanwhile.
fn crash_and_restart(
    g: &mut Group,
    rng: &mut impl RngCore,
    victim: usize,
    d: Duration,
) -> Result<(), SimFailure> {
    g.crash(victim);
    traffic(g, rng, d)?;
    let mut seed_bytes = [0u8; 32];
    rng.fill_bytes(&mut seed_bytes);
    let addrs: Vec<SocketAddr> = g.nodes.iter().map(|n| g.sim.addr(*n)).collect();
    let addr = addrs[victim];
    let mut config = g.config.clone();
    chaos_timers(&mut config);
    let node = Node::new(
        g.identities[victim].clone(),
        addr,
        config,
        seed_bytes,
        Tap::default(),
    );
    g.sim.restart(g.nodes[victim], node);
    g.crashed.remove(&victim);
    let contacts: Vec<SocketAddr> = addrs.iter().copied().filter(|a| *a != addr).collect();
    g.sim
        .with_node(g.nodes[victim], |n, now| n.member.start(now, &contacts));
    Ok(())
}

/// Reliable and unreliable messages from random members while `d` passes.
fn traffic(g: &mut Group, rng: &mut impl RngCore, d: Duration) -> Result<(), SimFailure> {
    let until = g.sim.now().saturating_add(d);
    let mut k = 0u64;
    while g.sim.now() < until {
        let i = (rng.next_u32() % N as u32) as usize;
        let ch = if rng.next_u32().is_multiple_of(3) {
            Channel::Unreliable
        } else {
            Channel::Reliable
        };
        let mut data = vec![i as u8];
        data.extend_from_slice(&k.to_be_bytes());
        data.extend_from_slice(&rng.next_u64().to_be_bytes());
        g.send(i, ch, data);
        k += 1;
        g.run_for(Duration::from_millis(40))?;
    }
    Ok(())
}

/// Seeds 97 and 179 (with restarts) are the schedules that expelled a member "left"
/// although it never asked to leave (before the fix, 2 of seeds 0..300 did). The others are
/// a short sweep, half without restarts (every checker runs there); `explore` runs a long
/// one.
#[test]
fn no_member_is_expelled_and_every_fault_heals() {
    let mut runs: Vec<(u64, bool, bool)> = vec![(97, true, false), (179, true, false)];
    runs.extend((0..10).map(|s| (s, s % 2 == 0, true)));
    let failed: Vec<String> = runs
        .iter()
        .filter_map(|(s, r, x)| run(*s, 40, *r, *x).err().map(|e| e.to_string()))
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");
}

/// A sweep: `FROM` (0), `COUNT` (10) seeds of `FAULTS` (30) faults each, with restarts
/// unless `NO_RESTARTS` is set and rekeys and killed leaders unless `NO_EXTRAS` is;
/// `VERBOSE` prints the faults. `cargo test -p cohort-group --test chaos_schedule -- --ignored --nocapture`.
#[test]
#[ignore]
fn explore() {
    let var = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let (from, count, faults) = (var("FROM", 0), var("COUNT", 10), var("FAULTS", 30));
    let mut failed = Vec::new();
    for seed in from..from + count {
        let restarts = std::env::var("NO_RESTARTS").is_err();
        match run(
            seed,
            faults as usize,
            restarts,
            std::env::var("NO_EXTRAS").is_err(),
        ) {
            Ok(()) => println!("seed {seed}: ok"),
            Err(e) => {
                println!("seed {seed}: FAILED {e}");
                failed.push(seed);
            }
        }
    }
    println!("failed: {failed:?}");
    assert!(failed.is_empty(), "failed seeds: {failed:?}");
}
