//! Heal, Exchange and trust policies in the simulator (Ensemble sections 4, 5, 6.1 and
//! appendix 12.1): partitions that heal over random trust graphs, with a ledger of which
//! member ever held which key.
//!
//! `COHORT_SIM_SEED=<seed>` replays one seed of the sweep; `COHORT_SIM_SEEDS=<n>` runs `n`.

mod support;

use cohort_group::exchange::GOSSIP_KIND;
use cohort_group::{Channel, GroupEvent, MemberId, RemovalReason};
use cohort_sim::{split_by_coin, sweep, SimFailure, StandardFaults};
use rand_core::RngCore;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use support::{adversary, Group};

const BOUND: Duration = Duration::from_secs(6);

fn payload(i: usize, k: u64) -> Vec<u8> {
    format!("x{i}-{k}").into_bytes()
}

fn fingerprint(g: &Group, i: usize) -> Option<[u8; 8]> {
    g.sim.node(g.nodes[i]).member.key_fingerprint()
}

fn ledger(g: &Group, i: usize) -> BTreeSet<[u8; 8]> {
    g.sim
        .node(g.nodes[i])
        .member
        .key_ledger()
        .iter()
        .map(|(_, f)| *f)
        .collect()
}

fn view_of(g: &Group, i: usize) -> BTreeSet<usize> {
    g.current_views()[i]
        .as_ref()
        .map(|(_, m, _)| m.iter().filter_map(|id| g.index_of(id)).collect())
        .unwrap_or_default()
}

fn count(events: &[GroupEvent], f: impl Fn(&GroupEvent) -> bool) -> usize {
    events.iter().filter(|e| f(e)).count()
}

/// Starts node `i` with `contacts` (indexes).
fn start(g: &mut Group, i: usize, contacts: &[usize]) {
    let addrs: Vec<_> = contacts.iter().map(|c| g.sim.addr(g.nodes[*c])).collect();
    let n = g.nodes[i];
    g.sim
        .with_node(n, |node, now| node.member.start(now, &addrs));
}

#[test]
fn a_healed_partition_merges_through_one_exchange_without_a_fresh_key() {
    let mut g = Group::new(11, 6, |_| {});
    g.start_all();
    let all = [0, 1, 2, 3, 4, 5];
    g.wait_converged(&all, BOUND).expect("one view");
    let (a, b) = ([0usize, 1, 2], [3usize, 4, 5]);
    g.split(&a, &b, BOUND * 2);
    for k in 0..5 {
        for i in all {
            g.send(i, Channel::Reliable, payload(i, k));
        }
    }
    g.run_for(Duration::from_secs(1)).expect("run");
    let (fa, fb) = (
        fingerprint(&g, 0).expect("a"),
        fingerprint(&g, 3).expect("b"),
    );
    assert_ne!(fa, fb, "the two sides rekeyed apart");
    let views = g.current_views();
    let leader = |i: usize| views[i].as_ref().map(|(_, m, _)| m[0]).expect("view");
    let (la, lb) = (leader(0), leader(3));
    let before: Vec<usize> = g.events_per_node().iter().map(Vec::len).collect();

    g.sim.heal();
    // While a member is between components (dissolved, not yet let in), the application
    // can still send reliably: the message goes out in the merged view (found by the
    // helper running the netns script: such sends used to be refused).
    let mut sent_between = false;
    for _ in 0..3000 {
        if let Some(i) = all
            .iter()
            .copied()
            .find(|i| g.current_views()[*i].is_none())
        {
            assert!(g.send(i, Channel::Reliable, b"between views".to_vec()));
            sent_between = true;
            break;
        }
        g.run_for(Duration::from_millis(1)).expect("run");
    }
    assert!(sent_between, "no member was ever between views");
    let took = g.wait_converged(&all, BOUND).expect("merged");
    g.run_for(Duration::from_secs(1)).expect("run");
    g.check_all().expect("checkers");
    let after: Vec<Vec<GroupEvent>> = g
        .events_per_node()
        .into_iter()
        .zip(&before)
        .map(|(e, n)| e[*n..].to_vec())
        .collect();
    let flat: Vec<GroupEvent> = after.iter().flatten().cloned().collect();
    let tickets = count(&flat, |e| matches!(e, GroupEvent::TicketSent { .. }));
    let exchanges = count(&flat, |e| matches!(e, GroupEvent::KeyExchanged { .. }));
    assert!(
        tickets >= 1 && exchanges >= 1,
        "{tickets} tickets, {exchanges} exchanges"
    );
    // The lower principal hands its key over, and the merged group keeps it (a merge of
    // members that hold the key needs no fresh one).
    let lower = la.min(lb);
    let sender = (0..6)
        .find(|i| {
            after[*i]
                .iter()
                .any(|e| matches!(e, GroupEvent::TicketSent { .. }))
        })
        .expect("a sender");
    assert_eq!(
        g.ids[sender], lower,
        "the ticket came from the higher principal"
    );
    let lower_key = if lower == la { fa } else { fb };
    for i in all {
        assert_eq!(fingerprint(&g, i), Some(lower_key), "node {i}");
    }
    println!("merged in {took:?}");

    // Replayed gossip (tickets included) changes nothing.
    let captured: Vec<Vec<u8>> = g
        .nodes
        .iter()
        .flat_map(|n| g.sim.node(*n).watch.tap.clone())
        .filter(|(_, p)| p.first() == Some(&GOSSIP_KIND))
        .map(|(_, p)| p)
        .collect();
    assert!(
        captured.iter().any(|p| p.get(2) == Some(&2)),
        "no ticket captured"
    );
    let view_before = g.current_views();
    let from = g.sim.addr(g.nodes[0]);
    for p in &captured {
        for n in g.nodes.clone() {
            g.sim.inject(from, n, p.clone(), Duration::from_millis(1));
        }
    }
    g.run_for(Duration::from_secs(2)).expect("run");
    assert_eq!(
        g.current_views(),
        view_before,
        "replayed gossip moved a view"
    );
    for i in all {
        assert_eq!(
            fingerprint(&g, i),
            Some(lower_key),
            "node {i} after replays"
        );
    }
    g.check_all().expect("checkers");
}

/// Three members p, q and s (0, 1, 2) in a simulator seeded with `seed`: q trusts p and s,
/// p and s trust only q.
fn trusting_only_q(seed: u64) -> Group {
    let (p, q, s) = (0, 1, 2);
    Group::new_each(seed, 3, |i, c| {
        let ids = c.trust.clone();
        c.trust = match i {
            0 => vec![ids[q]],
            1 => vec![ids[p], ids[s]],
            _ => vec![ids[q]],
        }
        .into();
    })
}

/// Ensemble 5.1: p and q trust each other, q and s trust each other, p and s do not. With
/// leaders p and s, the components {p} and {s, q} never merge.
#[test]
fn p_and_s_who_do_not_trust_each_other_lead_components_that_never_merge() {
    let (p, q, s) = (0, 1, 2);
    let mut g = trusting_only_q(21);
    start(&mut g, s, &[]);
    g.run_for(Duration::from_millis(200)).expect("run");
    start(&mut g, q, &[s]);
    g.wait_converged(&[q, s], BOUND).expect("s leads {s, q}");
    start(&mut g, p, &[q, s]);
    g.run_for(Duration::from_secs(15)).expect("run");
    assert_eq!(view_of(&g, p), BTreeSet::from([p]));
    assert_eq!(view_of(&g, s), BTreeSet::from([q, s]));
    assert_eq!(view_of(&g, q), BTreeSet::from([q, s]));
    let views = g.current_views();
    assert_eq!(views[s].as_ref().map(|v| v.1[0]), Some(g.ids[s]), "s leads");
    // p never shared a view or a key with s.
    for e in &g.events_per_node()[p] {
        if let GroupEvent::View(v) = e {
            assert!(!v.contains(&g.ids[s]), "p and s in one view");
        }
    }
    assert!(ledger(&g, p).is_disjoint(&ledger(&g, s)));
    assert!(ledger(&g, p).is_disjoint(&ledger(&g, q)));
    // s heard p's gossip (forwarded by q) and refused it as untrusted.
    let untrusted = g
        .sim
        .node(g.nodes[s])
        .member
        .counters()
        .get(cohort_group::Drop::Untrusted);
    assert!(untrusted > 0, "s never heard of p");
    g.check_all().expect("checkers");
}

/// st-trust is transitive: p and s share a view through a leader q that both trust. When q
/// fails, the one of them that takes over does not trust the other, removes it with a fresh
/// key, and the two never merge again.
#[test]
fn members_linked_through_their_leader_split_when_it_fails() {
    let (p, q, s) = (0, 1, 2);
    let mut g = trusting_only_q(22);
    start(&mut g, q, &[]);
    g.run_for(Duration::from_millis(200)).expect("run");
    start(&mut g, p, &[q]);
    start(&mut g, s, &[q]);
    g.wait_converged(&[p, q, s], BOUND)
        .expect("q leads {q, p, s}");
    g.crash(q);
    g.run_for(Duration::from_secs(10)).expect("run");
    assert_eq!(view_of(&g, p), BTreeSet::from([p]));
    assert_eq!(view_of(&g, s), BTreeSet::from([s]));
    let (fp, fs) = (
        fingerprint(&g, p).expect("p"),
        fingerprint(&g, s).expect("s"),
    );
    assert!(!ledger(&g, s).contains(&fp), "s holds p's key");
    assert!(!ledger(&g, p).contains(&fs), "p holds s's key");
    let removed_untrusted = g.events_per_node().iter().flatten().any(|e| {
        matches!(
            e,
            GroupEvent::Removed {
                reason: RemovalReason::Untrusted,
                ..
            }
        )
    });
    assert!(removed_untrusted, "nobody was removed as untrusted");
}

#[test]
fn a_leader_that_stops_trusting_a_member_removes_it_with_a_fresh_key() {
    leader_distrusts(true);
}

/// Even when the policy keeps the key across membership changes (found in review: the
/// removal alone did not rekey then).
#[test]
fn a_member_removed_as_untrusted_loses_the_key_even_without_rekey_on_membership_change() {
    leader_distrusts(false);
}

fn leader_distrusts(rekey_on_change: bool) {
    let mut g = Group::new(23, 4, |c| {
        c.rekey_policy.on_membership_change = rekey_on_change
    });
    g.start_all();
    g.wait_converged(&[0, 1, 2, 3], BOUND).expect("one view");
    let views = g.current_views();
    let leader = g
        .index_of(&views[0].as_ref().expect("view").1[0])
        .expect("leader");
    let victim = (leader + 1) % 4;
    let rest: Vec<usize> = (0..4).filter(|i| *i != victim).collect();
    let trust: Vec<MemberId> = g
        .ids
        .iter()
        .copied()
        .filter(|m| *m != g.ids[victim])
        .collect();
    let n = g.nodes[leader];
    g.sim
        .with_node(n, |node, now| node.member.set_trust(now, trust));
    g.wait_converged(&rest, BOUND).expect("without the victim");
    let new_key = fingerprint(&g, leader).expect("key");
    assert!(
        !ledger(&g, victim).contains(&new_key),
        "the victim has the new key"
    );
    for i in &rest {
        let removed = g.events_per_node()[*i].iter().any(|e| {
            *e == GroupEvent::Removed {
                member: g.ids[victim],
                reason: RemovalReason::Untrusted,
            }
        });
        assert!(
            removed,
            "node {i} did not see the victim removed as untrusted"
        );
    }
    // The victim goes on alone and never gets back in: the leader refuses its gossip and
    // tickets.
    g.run_for(Duration::from_secs(6)).expect("run");
    assert_eq!(view_of(&g, victim), BTreeSet::from([victim]));
    assert!(g.converged(&rest));
    for k in 0..3 {
        g.send(leader, Channel::Reliable, payload(leader, k));
    }
    g.run_for(Duration::from_secs(1)).expect("run");
    let key = fingerprint(&g, leader).expect("key");
    assert!(
        !ledger(&g, victim).contains(&key),
        "the victim reads the group"
    );
    g.check_all().expect("checkers");
}

#[test]
fn a_member_that_stops_trusting_its_leader_leaves_and_goes_on_alone() {
    let mut g = Group::new(24, 4, |_| {});
    g.start_all();
    g.wait_converged(&[0, 1, 2, 3], BOUND).expect("one view");
    let views = g.current_views();
    let leader_id = views[0].as_ref().expect("view").1[0];
    let leader = g.index_of(&leader_id).expect("leader");
    let m = (leader + 2) % 4;
    let rest: Vec<usize> = (0..4).filter(|i| *i != m).collect();
    let trust: Vec<MemberId> = g.ids.iter().copied().filter(|x| *x != leader_id).collect();
    let n = g.nodes[m];
    g.sim
        .with_node(n, |node, now| node.member.set_trust(now, trust));
    assert_eq!(
        view_of(&g, m),
        BTreeSet::from([m]),
        "m did not go alone at once"
    );
    g.wait_converged(&rest, BOUND).expect("the rest");
    let key = fingerprint(&g, leader).expect("key");
    assert!(!ledger(&g, m).contains(&key));
    g.run_for(Duration::from_secs(6)).expect("run");
    assert_eq!(view_of(&g, m), BTreeSet::from([m]), "m merged back");
    g.check_all().expect("checkers");
}

/// Found by scripts/group-chaos.sh (identity mode, seed 317): a member that stopped
/// trusting its leader went on alone and, once it trusted the leader again, never got back.
/// The leader refused its Id for good (the member was seen leaving, so no ticket may hand it
/// the key drawn to keep it out), and the member, leading a component of its own, never
/// joined. Now it comes back as a member that left does, by joining: its component
/// dissolves into the old leader's group, which draws a fresh key. One view again, and the
/// member never holds the key drawn to keep it out.
#[test]
fn a_member_that_went_alone_merges_back_once_it_trusts_its_leader_again() {
    for seed in [24u64, 25, 26] {
        let mut g = Group::new(seed, 4, |_| {});
        g.start_all();
        g.wait_converged(&[0, 1, 2, 3], BOUND).expect("one view");
        let views = g.current_views();
        let leader_id = views[0].as_ref().expect("view").1[0];
        let leader = g.index_of(&leader_id).expect("leader");
        let m = (leader + 2) % 4;
        let rest: Vec<usize> = (0..4).filter(|i| *i != m).collect();
        let all = g.ids.clone();
        let trust: Vec<MemberId> = all.iter().copied().filter(|x| *x != leader_id).collect();
        let n = g.nodes[m];
        g.sim
            .with_node(n, |node, now| node.member.set_trust(now, trust));
        assert_eq!(
            view_of(&g, m),
            BTreeSet::from([m]),
            "seed {seed}: m did not go alone"
        );
        g.wait_converged(&rest, BOUND).expect("the rest");
        let kept_out = fingerprint(&g, leader).expect("key");
        for k in 0..3 {
            g.send(leader, Channel::Reliable, payload(leader, k));
        }
        g.run_for(Duration::from_secs(1)).expect("run");
        g.sim
            .with_node(n, |node, now| node.member.set_trust(now, all));
        g.wait_converged(&[0, 1, 2, 3], BOUND * 2)
            .unwrap_or_else(|e| panic!("seed {seed}: m never merged back: {e:?}"));
        assert!(
            !ledger(&g, m).contains(&kept_out),
            "seed {seed}: m holds the key drawn to keep it out"
        );
        g.check_all().expect("checkers");
    }
}

/// Appendix 12.1: a rekey asked for at the leader that receives a ticket. Whichever
/// completes first wins; either way the components end up merged under one key.
#[test]
fn a_rekey_racing_an_exchange_still_ends_in_one_merged_group() {
    for seed in [31u64, 32, 33, 34] {
        let mut g = Group::new(seed, 4, |_| {});
        g.start_all();
        g.wait_converged(&[0, 1, 2, 3], BOUND).expect("one view");
        let (na, nb) = ([g.nodes[0], g.nodes[1]], [g.nodes[2], g.nodes[3]]);
        g.sim.partition(&[&na, &nb]);
        g.wait_converged(&[0, 1], BOUND * 2).expect("a");
        g.wait_converged(&[2, 3], BOUND * 2).expect("b");
        let views = g.current_views();
        let la = views[0].as_ref().expect("a").1[0];
        let lb = views[2].as_ref().expect("b").1[0];
        // The ticket goes to the higher principal; it rekeys at the heal (seeds 31, 33)
        // or as soon as its Exchange view change starts (32, 34).
        let recipient = g.index_of(&la.max(lb)).expect("recipient");
        g.sim.heal();
        if seed % 2 == 1 {
            let n = g.nodes[recipient];
            g.sim.with_node(n, |node, now| node.member.rekey(now));
        } else {
            let mut waited = Duration::ZERO;
            loop {
                g.run_for(Duration::from_millis(1)).expect("run");
                waited += Duration::from_millis(1);
                let changing = g.sim.node(g.nodes[recipient]).member.status().changing_view;
                if changing || waited > BOUND {
                    break;
                }
            }
            let n = g.nodes[recipient];
            g.sim.with_node(n, |node, now| node.member.rekey(now));
        }
        g.wait_converged(&[0, 1, 2, 3], BOUND * 2)
            .expect("merged after the race");
        let fp = fingerprint(&g, 0);
        for i in 1..4 {
            assert_eq!(fingerprint(&g, i), fp, "seed {seed} node {i}");
        }
        g.check_all().expect("checkers");
    }
}

/// st-trust classes: the connected components of mutual trust.
fn st_classes(trust: &[BTreeSet<usize>]) -> Vec<usize> {
    let n = trust.len();
    let mut class: Vec<usize> = (0..n).collect();
    loop {
        let mut changed = false;
        for a in 0..n {
            for b in 0..n {
                if trust[a].contains(&b) && trust[b].contains(&a) && class[a] != class[b] {
                    let (lo, hi) = (class[a].min(class[b]), class[a].max(class[b]));
                    for c in class.iter_mut() {
                        if *c == hi {
                            *c = lo;
                        }
                    }
                    changed = true;
                }
            }
        }
        if !changed {
            return class;
        }
    }
}

/// One run: 5 members and an outsider nobody trusts, over a random trust graph (domains of
/// mutual trust, one-way trust across them, sometimes a missing link inside a domain);
/// partitions that heal, loss, duplication, reordering, delay and an adversary that replays
/// real packets (gossip and tickets included). Then the network heals and is quiet.
/// Checked: every view and every key stays inside one st-trust class; the outsider holds
/// nothing of anyone's; each domain whose members all trust each other ends in one view.
fn trust_run(seed: u64) -> Result<(), SimFailure> {
    let n = 6;
    let outsider = 5;
    let mut pick = rand_chacha_like(seed);
    let domains = 1 + (pick() % 3) as usize;
    let domain: Vec<usize> = (0..n)
        .map(|i| {
            if i == outsider {
                99
            } else {
                (pick() % domains as u64) as usize
            }
        })
        .collect();
    let mut trust: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
    for a in 0..n {
        for b in 0..n {
            if a == b {
                continue;
            }
            let same = domain[a] == domain[b] && a != outsider;
            let one_way = domain[a] < domain[b] && b != outsider && pick().is_multiple_of(3);
            if same || one_way || (a == outsider) {
                trust[a].insert(b);
            }
        }
    }
    // Sometimes a domain misses one link (p, q, s shapes).
    let mut complete: BTreeSet<usize> = (0..domains).collect();
    if pick().is_multiple_of(3) {
        let a = (pick() % 5) as usize;
        let b = (pick() % 5) as usize;
        if a != b && domain[a] == domain[b] {
            trust[a].remove(&b);
            complete.remove(&domain[a]);
        }
    }
    let class = st_classes(&trust);
    let trust_for = trust.clone();
    let mut g = Group::new_each(seed, n, |i, c| {
        let ids = c.trust.clone();
        c.trust = trust_for[i].iter().map(|j| ids[*j]).collect();
    });
    let mut rng = g.sim.fork_rng();
    let faults = StandardFaults {
        delay: 0.03,
        delay_range: Duration::from_millis(1)..Duration::from_millis(30),
        tamper: 0.0,
        ..StandardFaults::light()
    }
    .add_to(&mut g.sim);
    g.start_all();
    g.run_for(Duration::from_secs(3))?;
    for round in 0..40u64 {
        for i in 0..n {
            if rng.next_u32().is_multiple_of(3) {
                g.send(i, Channel::Reliable, payload(i, round));
            }
        }
        if round % 6 == 0 {
            adversary(&mut g, &mut rng);
        }
        if round % 10 == 2 {
            let (a, b) = split_by_coin(&mut rng, &g.nodes[..n]);
            g.sim.partition(&[&a, &b]);
        }
        if round % 10 == 7 {
            g.sim.heal();
        }
        g.run_for(Duration::from_millis(40 + u64::from(rng.next_u32() % 60)))?;
    }
    faults.remove(&mut g.sim);
    g.sim.heal();
    // Quiet: give merges time (redirected joiners found alone after 5 suspicion timeouts,
    // then gossip and Exchange).
    let mut merged = false;
    for _ in 0..40 {
        g.run_for(Duration::from_millis(250))?;
        merged = (0..domains).filter(|d| complete.contains(d)).all(|d| {
            let set: Vec<usize> = (0..5).filter(|i| domain[*i] == d).collect();
            set.is_empty() || g.converged(&set)
        });
        if merged {
            break;
        }
    }
    // Safety: every view anyone installed and every key anyone held stays in one class.
    let per_node = g.events_per_node();
    for (i, events) in per_node.iter().enumerate() {
        for e in events {
            if let GroupEvent::View(v) = e {
                let classes: BTreeSet<usize> = v
                    .ids()
                    .filter_map(|m| g.index_of(&m))
                    .map(|j| class[j])
                    .collect();
                if classes.len() > 1 {
                    return Err(g.sim.failure(format!(
                        "node {i} installed view {} mixing st-classes {classes:?} (trust {trust:?})",
                        v.id
                    )));
                }
            }
        }
    }
    let mut holders: BTreeMap<[u8; 8], BTreeSet<usize>> = BTreeMap::new();
    for i in 0..n {
        for fp in ledger(&g, i) {
            holders.entry(fp).or_default().insert(i);
        }
    }
    for (fp, who) in &holders {
        let classes: BTreeSet<usize> = who.iter().map(|j| class[*j]).collect();
        if classes.len() > 1 {
            return Err(g.sim.failure(format!(
                "key {} held across st-classes by {who:?} (trust {trust:?})",
                hex(fp)
            )));
        }
        if who.contains(&outsider) && who.len() > 1 {
            return Err(g
                .sim
                .failure(format!("the outsider shares key {}", hex(fp))));
        }
    }
    if !merged {
        let views: Vec<_> = (0..n).map(|i| view_of(&g, i)).collect();
        return Err(g.sim.failure(format!(
            "domains {domain:?} (complete {complete:?}) did not merge: views {views:?}, trust {trust:?}"
        )));
    }
    // A member whose component dissolved into one whose leader does not trust it is never
    // let in; it goes on alone five suspicion timeouts after it began to join. New traffic
    // waits until every member holds a view again, so that each can deliver its own (seed
    // 930: node 0 sent its message 2 s after its join began, and still held no view 2 s
    // later at the checks).
    for _ in 0..40 {
        let settled = (0..n).all(|i| {
            let m = &g.sim.node(g.nodes[i]).member;
            m.view().is_some() && !m.status().changing_view
        });
        if settled {
            break;
        }
        g.run_for(Duration::from_millis(250))?;
    }
    // New traffic reaches each merged domain; the checkers hold.
    for i in 0..5 {
        g.send(i, Channel::Reliable, payload(i, 999));
    }
    g.run_for(Duration::from_secs(2))?;
    g.check_all()?;
    Ok(())
}

fn hex(fp: &[u8; 8]) -> String {
    fp.iter().map(|b| format!("{b:02x}")).collect()
}

/// A small deterministic generator for the trust graph (the simulator's RNG drives the rest).
fn rand_chacha_like(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

#[test]
fn random_partitions_over_random_trust_graphs() {
    sweep(16, trust_run);
}

/// A member of a dissolving component that misses the merge Install gets it again: the
/// dissolving coordinator stays until every member confirms. (Found by the group chaos runs:
/// the coordinator used to send the one copy and leave at once, so a member that missed it
/// waited out its takeover turn, went alone, and merged through an Exchange of its own, the
/// heals of 6.85 s and 7.23 s in docs/reliability.md.)
#[test]
fn a_member_that_misses_the_merge_install_gets_it_again() {
    use cohort_sim::{FnRule, Verdict};
    use std::sync::{Arc, Mutex};
    let mut g = Group::new(11, 6, |_| {});
    g.start_all();
    let all = [0, 1, 2, 3, 4, 5];
    g.wait_converged(&all, BOUND).expect("one view");
    g.split(&[0, 1, 2], &[3, 4, 5], BOUND * 2);
    g.run_for(Duration::from_millis(500)).expect("run");
    // After the heal, once a leader decides to dissolve its component, the first large
    // group datagram it sends to one of its members (the merge Install; flushes and
    // heartbeats are small; pair channel and gossip datagrams are not group packets, whose
    // first byte is the gears packet version; over 150 bytes: the Install, without its
    // two view ids since `GROUP_VERSION` 10, is about 180) is lost.
    let armed: Arc<Mutex<Option<(cohort_sim::NodeId, cohort_sim::NodeId)>>> =
        Arc::new(Mutex::new(None));
    let dropped = Arc::new(Mutex::new(0usize));
    let (rule_armed, rule_dropped) = (armed.clone(), dropped.clone());
    g.sim
        .add_rule(FnRule::new("drop-merge-install", move |p, _| {
            let target = *rule_armed.lock().expect("lock");
            let mut n = rule_dropped.lock().expect("lock");
            let group_packet = p.bytes.first() == Some(&cohort_gears::PACKET_VERSION);
            if *n == 0 && target == Some((p.from, p.to)) && group_packet && p.bytes.len() > 150 {
                eprintln!("dropped a group datagram of {} bytes", p.bytes.len());
                *n += 1;
                return Verdict::Drop;
            }
            Verdict::Pass
        }));
    let before: Vec<usize> = g.events_per_node().iter().map(Vec::len).collect();
    g.sim.heal();
    let mut merging_at = None;
    for _ in 0..6000 {
        g.run_for(Duration::from_millis(1)).expect("run");
        let events = g.events_per_node();
        let leader = (0..6).find(|i| {
            events[*i][before[*i]..]
                .iter()
                .any(|e| matches!(e, GroupEvent::Merging { .. }))
        });
        if let Some(l) = leader {
            let member = view_of(&g, l)
                .into_iter()
                .find(|m| *m != l)
                .expect("the dissolving component has another member");
            *armed.lock().expect("lock") = Some((g.nodes[l], g.nodes[member]));
            merging_at = Some((g.sim.now(), l, member));
            break;
        }
    }
    let (at, leader, member) = merging_at.expect("a component dissolved");
    g.wait_converged(&all, BOUND).expect("merged");
    let took = g.sim.now().saturating_duration_since(at);
    assert_eq!(
        *dropped.lock().expect("lock"),
        1,
        "the Install was not dropped"
    );
    // Without the resend, the member waits out its takeover turn first: at least one
    // suspicion timeout (400 ms here) of silence.
    println!("merged {took:?} after the dissolve began");
    assert!(
        took < Duration::from_millis(400),
        "merged {took:?} after the dissolve began"
    );
    let events = g.events_per_node();
    let lone = events[member][before[member]..].iter().any(|e| {
        matches!(e, GroupEvent::Removed { member: m, reason: RemovalReason::Suspected }
            if *m == g.ids[leader])
    });
    assert!(!lone, "member {member} suspected its leader {leader}");
    g.run_for(Duration::from_secs(1)).expect("run");
    g.check_all().expect("checkers");
}

/// A leader that handed its key over through an Exchange and then leaves instead of
/// merging does not keep the other group's key: the group rekeys once the merge is overdue.
/// (Found by the KDC-mode soak, seed 493, once view changes waited for confirmations.)
#[test]
fn a_key_giver_that_leaves_instead_of_merging_is_rekeyed_away() {
    // Which side hands its key over depends on the principals: try each end of the order
    // as the lone side until the lone member is the giver.
    for lone_pick in 0..2 {
        let mut g = Group::new(11, 4, |_| {});
        let mut order: Vec<usize> = (0..4).collect();
        order.sort_by_key(|i| g.ids[*i]);
        let lone = if lone_pick == 0 { order[0] } else { order[3] };
        let others: Vec<usize> = (0..4).filter(|i| *i != lone).collect();
        g.start_all();
        let all = [0, 1, 2, 3];
        g.wait_converged(&all, BOUND).expect("one view");
        g.split(&others, &[lone], BOUND * 2);
        g.run_for(Duration::from_millis(500)).expect("run");
        let before: Vec<usize> = g.events_per_node().iter().map(Vec::len).collect();
        g.sim.heal();
        let mut exchange = None;
        for _ in 0..6000 {
            g.run_for(Duration::from_millis(1)).expect("run");
            let events = g.events_per_node();
            exchange = (0..4).find_map(|i| {
                events[i][before[i]..].iter().find_map(|e| match e {
                    GroupEvent::KeyExchanged { from, .. } => Some((i, *from)),
                    _ => None,
                })
            });
            if exchange.is_some() {
                break;
            }
        }
        let (taker, giver) = exchange.expect("an Exchange");
        if g.index_of(&giver) != Some(lone) {
            continue;
        }
        let handed = fingerprint(&g, taker).expect("key");
        assert!(
            ledger(&g, lone).contains(&handed),
            "the giver holds the key it gave"
        );
        // The giver leaves instead of merging.
        let n = g.nodes[lone];
        g.sim.with_node(n, |node, now| node.member.leave(now));
        // Five suspicion timeouts (400 ms here) for the merge, then a rekey.
        g.run_for(Duration::from_secs(4)).expect("run");
        g.wait_converged(&others, BOUND).expect("the rest");
        let now_key = fingerprint(&g, others[0]).expect("key");
        assert_ne!(
            now_key, handed,
            "the group still uses the departed giver's key"
        );
        assert!(
            !ledger(&g, lone).contains(&now_key),
            "the giver holds the current key"
        );
        g.check_all().expect("checkers");
        return;
    }
    panic!("the lone member never handed its key over");
}
