//! The LKH rekey (`RekeyMethod::Lkh`) in the simulator: joins, leaves, crashes and a
//! takeover in identity mode, partitions and merges, and KDC mode, each checked by the
//! `support` checkers and by the tree checks (`support::tree`): every key on a live member's path is
//! held by no one outside its view (forward secrecy, over every tree key, not only the
//! group key), every tree key a member ever held comes from a rekey whose view it
//! installed (backward secrecy: a joiner holds no key older than its join), and the members
//! of a converged view agree on the group key and the root.
//!
//! `COHORT_SIM_SEED=<seed>` replays one seed of the sweeps; `COHORT_SIM_SEEDS=<n>` runs `n`.

mod support;

use cohort_core::Timestamp;
use cohort_group::kdc_pair::KdcCredentials;
use cohort_group::{
    AuthMode, Channel, GroupConfig, GroupEvent, GroupMember, MemberId, RekeyMethod,
};
use cohort_kdc::Registry;
use cohort_sim::{split_prefix, sweep, Sim, SimFailure, StandardFaults};
use rand_core::RngCore;
use std::collections::{BTreeSet, HashSet};
use std::net::SocketAddr;
use std::time::Duration;
use support::kit::{principal_keys, principal_name, MemberOrKdc};
use support::tree::{check_agree, check_tree, left_as_coordinator, tree_checks};
use support::{adversary, fast_timers, sim_config, Group};

const BOUND: Duration = Duration::from_secs(8);

fn lkh_group(seed: u64, n: usize) -> Group {
    Group::new(seed, n, |c| c.rekey_method = RekeyMethod::lkh())
}

fn start(g: &mut Group, i: usize, contacts: &[usize]) {
    let addrs: Vec<SocketAddr> = contacts.iter().map(|c| g.sim.addr(g.nodes[*c])).collect();
    g.sim
        .with_node(g.nodes[i], |node, now| node.member.start(now, &addrs));
}

fn leader_of(g: &Group, i: usize) -> usize {
    let id = g.current_views()[i]
        .as_ref()
        .map(|v| v.1[0])
        .expect("a view");
    g.index_of(&id).expect("leader index")
}

/// Joins, leaves, a crash and a leader crash (a takeover, which reseeds), with the tree
/// checks after every view change and the wrap counts of the batches.
fn scripted(seed: u64) -> Result<(), SimFailure> {
    let n = 12;
    let mut g = lkh_group(seed, n);
    let mut started: BTreeSet<usize> = BTreeSet::new();
    let mut set: Vec<usize> = (0..7).collect();
    for i in &set {
        let contacts: Vec<usize> = set.iter().copied().filter(|j| j != i).collect();
        start(&mut g, *i, &contacts);
        started.insert(*i);
    }
    g.wait_converged(&set, BOUND)?;
    tree_checks(&g, &started, &set)?;
    let send = |g: &mut Group, set: &[usize], k: u64| {
        for i in set {
            g.send(*i, Channel::Reliable, format!("{i}-{k}").into_bytes());
        }
    };
    // Two join at once: one batch.
    for j in [7, 8] {
        start(&mut g, j, &set.clone());
        started.insert(j);
        set.push(j);
    }
    send(&mut g, &set, 1);
    g.wait_converged(&set, BOUND)?;
    tree_checks(&g, &started, &set)?;
    // A member leaves: a batch with no sealed path, a few wraps.
    let leader = leader_of(&g, set[0]);
    let leaver = *set.iter().find(|i| **i != leader).expect("a non-leader");
    g.sim
        .with_node(g.nodes[leaver], |node, now| node.member.leave(now));
    set.retain(|i| *i != leaver);
    send(&mut g, &set, 2);
    g.wait_converged(&set, BOUND)?;
    tree_checks(&g, &started, &set)?;
    let stats = g.sim.node(g.nodes[leader]).member.lkh_last_rekey().cloned();
    let Some(stats) = stats else {
        return Err(g.sim.failure("the leader ran no LKH rekey"));
    };
    if stats.reseed || stats.paths != 0 || stats.wraps == 0 || stats.wraps > 4 * 2 {
        return Err(g
            .sim
            .failure(format!("one leave from 8 members: {stats:?}")));
    }
    // A member crashes.
    let victim = *set.iter().rev().find(|i| **i != leader).expect("a victim");
    g.crash(victim);
    set.retain(|i| *i != victim);
    g.wait_converged(&set, BOUND)?;
    tree_checks(&g, &started, &set)?;
    // The leader crashes: the next in rank takes over and reseeds.
    g.crash(leader);
    set.retain(|i| *i != leader);
    send(&mut g, &set, 3);
    g.wait_converged(&set, BOUND)?;
    tree_checks(&g, &started, &set)?;
    let new_leader = leader_of(&g, set[0]);
    let stats = g
        .sim
        .node(g.nodes[new_leader])
        .member
        .lkh_last_rekey()
        .cloned();
    if !stats.as_ref().is_some_and(|s| s.reseed && s.wraps == 0) {
        return Err(g
            .sim
            .failure(format!("the takeover did not reseed: {stats:?}")));
    }
    // After the reseed the new leader holds the tree: the next join is a batch.
    start(&mut g, 9, &set.clone());
    started.insert(9);
    set.push(9);
    g.wait_converged(&set, BOUND)?;
    tree_checks(&g, &started, &set)?;
    let stats = g
        .sim
        .node(g.nodes[new_leader])
        .member
        .lkh_last_rekey()
        .cloned();
    if !stats.as_ref().is_some_and(|s| !s.reseed && s.paths == 1) {
        return Err(g.sim.failure(format!("a join after the reseed: {stats:?}")));
    }
    send(&mut g, &set, 4);
    g.run_for(Duration::from_secs(1))?;
    g.check_all()?;
    tree_checks(&g, &started, &set)
}

#[test]
fn lkh_joins_leaves_crashes_and_a_takeover_keep_every_tree_key_secret() {
    sweep(4, scripted);
}

/// group_sim.rs's random run with the LKH rekey (degree 2 on odd seeds, 4 on even):
/// heavy faults, partitions, a crash and the replaying adversary; every checker and the
/// tree checks at the end.
fn random_run(seed: u64) -> Result<(), SimFailure> {
    let degree = if seed % 2 == 1 { 2 } else { 4 };
    let mut g = Group::new(seed, 5, |c| {
        c.rekey_method = RekeyMethod::Lkh { degree };
        if seed.is_multiple_of(3) {
            c.backlog_limit = 16;
            c.send_window = 8;
        }
    });
    let mut rng = g.sim.fork_rng();
    let faults = StandardFaults::heavy().add_to(&mut g.sim);
    g.start_all();
    g.run_for(Duration::from_secs(3))?;
    let mut crashes = 0;
    for round in 0..40u64 {
        for i in 0..5 {
            if rng.next_u32().is_multiple_of(3) {
                let ch = if rng.next_u32().is_multiple_of(4) {
                    Channel::Unreliable
                } else {
                    Channel::Reliable
                };
                g.send(i, ch, format!("m{i}-{round}").into_bytes());
            }
        }
        if round % 5 == 0 {
            adversary(&mut g, &mut rng);
        }
        if round % 13 == 4 && rng.next_u32().is_multiple_of(2) {
            let (a, b) = split_prefix(&mut rng, &g.nodes[..5], 4);
            g.sim.partition(&[&a, &b]);
        }
        if round % 13 == 10 {
            g.sim.heal();
        }
        if crashes < 1 && rng.next_u32().is_multiple_of(30) {
            let victim = (rng.next_u32() % 5) as usize;
            g.crash(victim);
            crashes += 1;
        }
        g.run_for(Duration::from_millis(25 + u64::from(rng.next_u32() % 50)))?;
    }
    faults.remove(&mut g.sim);
    g.sim.heal();
    let live: Vec<usize> = (0..5).filter(|i| !g.crashed.contains(i)).collect();
    g.wait_converged(&live, BOUND)?;
    for i in &live {
        g.send(*i, Channel::Reliable, format!("m{i}-999").into_bytes());
    }
    g.run_for(Duration::from_secs(2))?;
    g.check_all()?;
    let all: BTreeSet<usize> = (0..5).collect();
    tree_checks(&g, &all, &live)
}

#[test]
fn lkh_random_faults_crashes_and_an_adversary() {
    sweep(24, random_run);
}

/// Seeds of `random_run` that failed once, replayed on every run. 126: member m:03a16b60
/// went alone (after `Insecure`) and founded a component with a fresh key (epoch 1) but
/// kept the LKH path of its old component (root version 7); the leader m:ec015b30 took
/// that key through an Exchange (view 11) and the founder merged in without a rekey (view
/// 12): it held root version 7, the three others root version 1. A founder now holds a
/// one-member path whose root is its key (`member/lkh.rs`, `lkh_found`).
const RANDOM_RUN_SEEDS: [u64; 1] = [126];

#[test]
fn lkh_random_run_regressions() {
    for seed in RANDOM_RUN_SEEDS {
        random_run(seed).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
}

/// Light faults, two leaves, a partition and the replaying adversary, with `method`.
fn faulty(seed: u64, method: RekeyMethod) -> Result<(), SimFailure> {
    let n = 8;
    let mut g = Group::new(seed, n, |c| c.rekey_method = method);
    let mut rng = g.sim.fork_rng();
    let faults = StandardFaults::light().add_to(&mut g.sim);
    g.start_all();
    g.run_for(Duration::from_secs(2))?;
    let mut left = BTreeSet::new();
    for round in 0..20u64 {
        for i in 0..n {
            if rng.next_u32().is_multiple_of(3) {
                g.send(i, Channel::Reliable, format!("{i}-{round}").into_bytes());
            }
        }
        if round == 6 || round == 12 {
            let who = 1 + (rng.next_u32() as usize) % (n - 1);
            if g.sim.node(g.nodes[who]).member.status().view.is_some()
                && g.current_views()[who].as_ref().map(|v| v.1[0]) != Some(g.ids[who])
            {
                g.sim
                    .with_node(g.nodes[who], |node, now| node.member.leave(now));
                left.insert(who);
            }
        }
        if round == 9 {
            let (a, b) = split_prefix(&mut rng, &g.nodes, 3);
            g.sim.partition(&[&a, &b]);
        }
        if round == 15 {
            g.sim.heal();
        }
        if round % 4 == 0 {
            adversary(&mut g, &mut rng);
        }
        g.run_for(Duration::from_millis(100 + u64::from(rng.next_u32() % 100)))?;
    }
    faults.remove(&mut g.sim);
    g.sim.heal();
    let live: Vec<usize> = (0..n).filter(|i| !left.contains(i)).collect();
    g.wait_converged(&live, BOUND * 2)?;
    g.run_for(Duration::from_secs(1))?;
    g.check_all()?;
    if matches!(method, RekeyMethod::Lkh { .. }) {
        let all: BTreeSet<usize> = (0..n).collect();
        tree_checks(&g, &all, &live)?;
    }
    Ok(())
}

#[test]
fn lkh_under_faults_partitions_leaves_and_replays() {
    sweep(8, |seed| faulty(seed, RekeyMethod::lkh()));
}

/// The same scenario with the one-message rekey.
#[test]
fn one_message_under_faults_partitions_leaves_and_replays() {
    sweep(8, |seed| faulty(seed, RekeyMethod::OneMessage));
}

/// Seeds at which this scenario reported total order broken: 12, 15, 30 and 34 on main
/// before issue 14 (6b6d016) and on the LKH branch, 1, 20, 22 and 29 on the merged tree
/// (69176b7). In the four on the merged tree (each looked at), a member left while others
/// split off from the same view: the leaver's deliveries were a prefix of its own side's,
/// and differed from the split members' only in the tail that a partition may order
/// differently on each side. The checker held a member that left to every side's order; it
/// now holds it to the side of the view that removed it as left (and, with the fix in
/// `member/flush.rs`, a leader that leaves is held to its survivors' order too:
/// tests/leave_order.rs).
const ORDER_SEEDS: [u64; 8] = [1, 12, 15, 20, 22, 29, 30, 34];

#[test]
fn faults_leaves_and_a_partition_keep_total_order() {
    for seed in ORDER_SEEDS {
        faulty(seed, RekeyMethod::OneMessage).expect("one message");
        faulty(seed, RekeyMethod::lkh()).expect("lkh");
    }
}

/// A partition heals through an Exchange and the merged group goes on rekeying by LKH.
#[test]
fn lkh_components_merge_after_a_partition_and_rekey_again() {
    let mut g = lkh_group(41, 6);
    g.start_all();
    let all: Vec<usize> = (0..6).collect();
    g.wait_converged(&all, BOUND).expect("one view");
    g.split(&[0, 1, 2], &[3, 4, 5], BOUND);
    g.sim.heal();
    g.wait_converged(&all, BOUND * 2).expect("merged");
    let all_set: BTreeSet<usize> = all.iter().copied().collect();
    // A leave after the merge: the merged group's leader rekeys (a reseed if it does not
    // hold a tree of exactly this view, a batch otherwise), and every check holds.
    let leader = leader_of(&g, 0);
    let leaver = if leader == 5 { 4 } else { 5 };
    g.sim
        .with_node(g.nodes[leaver], |node, now| node.member.leave(now));
    let rest: Vec<usize> = all.iter().copied().filter(|i| *i != leaver).collect();
    g.wait_converged(&rest, BOUND).expect("without the leaver");
    tree_checks(&g, &all_set, &rest).expect("tree checks");
    // And once more: now a batch.
    let leaver2 = *rest.iter().rev().find(|i| **i != leader).expect("another");
    g.sim
        .with_node(g.nodes[leaver2], |node, now| node.member.leave(now));
    let rest2: Vec<usize> = rest.iter().copied().filter(|i| *i != leaver2).collect();
    g.wait_converged(&rest2, BOUND)
        .expect("without the second leaver");
    tree_checks(&g, &all_set, &rest2).expect("tree checks");
    let stats = g
        .sim
        .node(g.nodes[leader])
        .member
        .lkh_last_rekey()
        .cloned()
        .expect("stats");
    assert!(!stats.reseed && stats.paths == 0, "{stats:?}");
    g.run_for(Duration::from_secs(1)).expect("run");
    g.check_all().expect("checkers");
}

/// KDC mode: `n` members (m0..) registered with a KDC, all with the LKH rekey.
struct KdcLkh {
    sim: Sim<MemberOrKdc>,
    kdc: cohort_sim::NodeId,
    nodes: Vec<cohort_sim::NodeId>,
}

impl KdcLkh {
    fn new(seed: u64, n: usize) -> KdcLkh {
        let mut sim: Sim<MemberOrKdc> = Sim::new(sim_config(seed));
        let keys = principal_keys(seed, n);
        let mut registry = Registry::new();
        for (i, k) in keys.iter().enumerate() {
            registry.insert(principal_name(i), k.clone());
        }
        let kdc = sim.add_node_with(|_, _| MemberOrKdc::kdc(registry));
        let kdc_addr = sim.addr(kdc);
        let mut config = GroupConfig::new("kdc-lkh", Vec::new());
        config.auth = AuthMode::Kdc;
        config.trust_any_registered = true;
        config.rekey_method = RekeyMethod::lkh();
        fast_timers(&mut config);
        let mut nodes = Vec::new();
        for (i, key) in keys.into_iter().enumerate() {
            let mut seed_bytes = [0u8; 32];
            sim.rng().fill_bytes(&mut seed_bytes);
            let config = config.clone();
            nodes.push(sim.add_node_with(|_, addr| {
                let credentials = KdcCredentials {
                    name: principal_name(i),
                    key,
                    kdc: kdc_addr,
                };
                MemberOrKdc::Member(Box::new(
                    GroupMember::new(
                        support::kit::provider(),
                        credentials,
                        addr,
                        config,
                        seed_bytes,
                    )
                    .expect("member"),
                ))
            }));
        }
        KdcLkh { sim, kdc, nodes }
    }

    fn member(&self, i: usize) -> &GroupMember {
        self.sim.node(self.nodes[i]).member()
    }

    fn with_member<R>(&mut self, i: usize, f: impl FnOnce(&mut GroupMember, Timestamp) -> R) -> R {
        self.sim
            .with_node(self.nodes[i], |p, now| f(p.member_mut(), now))
    }

    fn start(&mut self, i: usize, contacts: &[usize]) {
        let addrs: Vec<SocketAddr> = contacts
            .iter()
            .map(|c| self.sim.addr(self.nodes[*c]))
            .collect();
        self.with_member(i, |m, now| m.start(now, &addrs));
    }

    fn view(&self, i: usize) -> BTreeSet<MemberId> {
        self.member(i)
            .view()
            .map(|v| v.ids().collect())
            .unwrap_or_default()
    }

    fn wait(&mut self, set: &[usize]) -> Result<(), SimFailure> {
        let want: BTreeSet<MemberId> = set.iter().map(|i| self.member(*i).id()).collect();
        let start = self.sim.now();
        loop {
            let fp = self.member(set[0]).key_fingerprint();
            if set.iter().all(|i| {
                let m = self.member(*i);
                !m.status().changing_view && self.view(*i) == want && m.key_fingerprint() == fp
            }) {
                return Ok(());
            }
            if self.sim.now().saturating_duration_since(start) > BOUND * 2 {
                return Err(self.sim.failure(format!("{set:?} did not converge")));
            }
            let until = self.sim.now().saturating_add(Duration::from_millis(20));
            self.sim.run_until(until)?;
        }
    }

    fn checks(&self, started: &BTreeSet<usize>, set: &[usize]) -> Result<(), SimFailure> {
        let exchanged: HashSet<[u8; 8]> = (0..self.nodes.len())
            .flat_map(|i| self.member(i).exchanged_keys().to_vec())
            .collect();
        let members: Vec<(usize, bool, &GroupMember)> = started
            .iter()
            .map(|i| (*i, true, self.member(*i)))
            .collect();
        let left = left_as_coordinator(
            self.nodes
                .iter()
                .flat_map(|n| self.sim.events_of(*n).map(|(_, e)| e)),
        );
        check_tree(&members, &exchanged, &left).map_err(|e| self.sim.failure(e))?;
        let agreeing: Vec<&GroupMember> = set.iter().map(|i| self.member(*i)).collect();
        check_agree(&agreeing).map_err(|e| self.sim.failure(e))
    }
}

/// KDC mode: joins (each joiner's path over its KDC pair channel), a leave (a batch), a
/// partition and its merge, with faults; the tree checks after each.
fn kdc_run(seed: u64) -> Result<(), SimFailure> {
    let n = 7;
    let mut g = KdcLkh::new(seed, n);
    let mut rng = g.sim.fork_rng();
    let mut started = BTreeSet::new();
    let mut set: Vec<usize> = (0..5).collect();
    for i in &set {
        let contacts: Vec<usize> = set.iter().copied().filter(|j| j != i).collect();
        g.start(*i, &contacts);
        started.insert(*i);
    }
    g.wait(&set)?;
    g.checks(&started, &set)?;
    for j in [5, 6] {
        g.start(j, &set.clone());
        started.insert(j);
        set.push(j);
    }
    g.wait(&set)?;
    g.checks(&started, &set)?;
    let leader_id = g.member(set[0]).view().map(|v| v.members[0].id);
    let leaver = *set
        .iter()
        .find(|i| Some(g.member(**i).id()) != leader_id)
        .expect("a non-leader");
    g.with_member(leaver, |m, now| m.leave(now));
    set.retain(|i| *i != leaver);
    g.wait(&set)?;
    g.checks(&started, &set)?;
    let leader = (0..n)
        .find(|i| Some(g.member(*i).id()) == leader_id)
        .expect("leader");
    let stats = g.member(leader).lkh_last_rekey().cloned();
    if !stats
        .as_ref()
        .is_some_and(|s| !s.reseed && s.paths == 0 && s.wraps > 0)
    {
        return Err(g.sim.failure(format!("a KDC-mode leave: {stats:?}")));
    }
    let faults = StandardFaults {
        delay: 0.0,
        tamper: 0.0,
        ..StandardFaults::light()
    }
    .add_to(&mut g.sim);
    let live: Vec<cohort_sim::NodeId> = set.iter().map(|i| g.nodes[*i]).collect();
    let (a, mut b) = split_prefix(&mut rng, &live, 2);
    b.push(g.kdc);
    g.sim.partition(&[&a, &b]);
    for k in 0..10u64 {
        for i in &set {
            let _ = g.with_member(*i, |m, now| {
                m.send(now, Channel::Reliable, format!("{i}-{k}").as_bytes())
            });
        }
        let until = g.sim.now().saturating_add(Duration::from_millis(120));
        g.sim.run_until(until)?;
    }
    faults.remove(&mut g.sim);
    g.sim.heal();
    g.wait(&set)?;
    g.checks(&started, &set)?;
    let expelled = g
        .sim
        .events_of(g.nodes[leaver])
        .any(|(_, e)| matches!(e, GroupEvent::Expelled { .. }));
    if !expelled {
        return Err(g
            .sim
            .failure(format!("member {leaver} never finished leaving")));
    }
    Ok(())
}

#[test]
fn lkh_in_kdc_mode_joins_leaves_and_merges() {
    sweep(4, kdc_run);
}
