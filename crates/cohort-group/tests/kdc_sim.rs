//! A group in KDC mode (LSGC 2.1) in the simulator, with a KDC node: joins through the
//! session leader and the KDC, a fresh key with every view in one message, leave, merge
//! after a partition, a principal the KDC does not know, and replays. The members run
//! with a crypto provider that has no KEM at all and whose Ed25519 refuses and counts every
//! call: KDC mode must use no public-key operation anywhere.
//!
//! `COHORT_SIM_SEED=<seed>` replays one seed of the sweep; `COHORT_SIM_SEEDS=<n>` runs `n`.

use cohort_core::{Machine, Timestamp, Transmit};
use cohort_crypto::{CryptoError, CryptoProvider, KemFactory, Secret, SignatureScheme};
use cohort_group::kdc_pair::KdcCredentials;
use cohort_group::{
    AuthMode, Channel, Drop, GroupConfig, GroupEvent, GroupMember, MemberId, RemovalReason,
    PRESENT_WITNESSES,
};
use cohort_kdc::Registry;
use cohort_sim::{split_prefix, sweep, NodeId, Sim, SimFailure, StandardFaults};
use rand_core::RngCore;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use support::kit::{principal_keys, principal_name, MemberOrKdc};
use support::{fast_timers, sim_config};

mod support;

static PUBLIC_KEY_CALLS: AtomicUsize = AtomicUsize::new(0);

/// Ed25519 that counts and refuses every call.
struct NoSignatures;

impl SignatureScheme for NoSignatures {
    fn generate(&self) -> Result<(Secret, Vec<u8>), CryptoError> {
        PUBLIC_KEY_CALLS.fetch_add(1, Ordering::SeqCst);
        Err(CryptoError::Failed)
    }
    fn public_key(&self, _: &Secret) -> Result<Vec<u8>, CryptoError> {
        PUBLIC_KEY_CALLS.fetch_add(1, Ordering::SeqCst);
        Err(CryptoError::Failed)
    }
    fn sign(&self, _: &Secret, _: &[u8]) -> Result<Vec<u8>, CryptoError> {
        PUBLIC_KEY_CALLS.fetch_add(1, Ordering::SeqCst);
        Err(CryptoError::Failed)
    }
    fn verify(&self, _: &[u8], _: &[u8], _: &[u8]) -> Result<(), CryptoError> {
        PUBLIC_KEY_CALLS.fetch_add(1, Ordering::SeqCst);
        Err(CryptoError::Failed)
    }
}

static NO_SIGNATURES: NoSignatures = NoSignatures;
static NO_KEMS: [&dyn KemFactory; 0] = [];

/// The simulation's provider without public-key algorithms.
fn symmetric_only() -> CryptoProvider {
    CryptoProvider {
        ed25519: &NO_SIGNATURES,
        kems: &NO_KEMS,
        ..support::kit::provider()
    }
}

/// A member or the KDC, with a tap on what it sends (every 5th datagram, up to 300) for
/// the replaying adversary, and every gossip Present (LSGC message 5) it sent.
struct Peer {
    inner: MemberOrKdc,
    tap: Vec<(SocketAddr, Vec<u8>)>,
    sent: u64,
    presents: Vec<(SocketAddr, Vec<u8>)>,
}

/// Whether `d` is a gossip packet (0xC2, version 1) of kind 5, a Present.
fn is_gossip_present(d: &[u8]) -> bool {
    d.len() > 2 && d[0] == 0xC2 && d[1] == 0x01 && d[2] == 5
}

impl Machine for Peer {
    type Event = GroupEvent;
    fn handle_datagram(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        self.inner.handle_datagram(now, from, data);
    }
    fn handle_timeout(&mut self, now: Timestamp) {
        self.inner.handle_timeout(now);
    }
    fn poll_transmit(&mut self, now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
        let start = buf.len();
        let t = self.inner.poll_transmit(now, buf)?;
        self.sent += 1;
        if is_gossip_present(&buf[start..start + t.size]) {
            self.presents
                .push((t.destination, buf[start..start + t.size].to_vec()));
        }
        if self.sent.is_multiple_of(5) && self.tap.len() < 300 {
            self.tap
                .push((t.destination, buf[start..start + t.size].to_vec()));
        }
        Some(t)
    }
    fn poll_timeout(&self) -> Option<Timestamp> {
        self.inner.poll_timeout()
    }
    fn poll_event(&mut self) -> Option<GroupEvent> {
        self.inner.poll_event()
    }
}

fn peer(inner: MemberOrKdc) -> Peer {
    Peer {
        inner,
        tap: Vec::new(),
        sent: 0,
        presents: Vec::new(),
    }
}

struct KdcGroup {
    sim: Sim<Peer>,
    kdc: NodeId,
    nodes: Vec<NodeId>,
    ids: Vec<MemberId>,
}

impl KdcGroup {
    /// `n` members named m0.. (registered with the KDC unless listed in `unregistered`),
    /// not started.
    fn new(seed: u64, n: usize, unregistered: &[usize]) -> KdcGroup {
        let mut sim: Sim<Peer> = Sim::new(sim_config(seed));
        let keys = principal_keys(seed, n);
        let mut registry = Registry::new();
        for (i, k) in keys.iter().enumerate() {
            if !unregistered.contains(&i) {
                registry.insert(principal_name(i), k.clone());
            }
        }
        let kdc = sim.add_node_with(|_, _| peer(MemberOrKdc::kdc(registry)));
        let kdc_addr = sim.addr(kdc);
        let mut config = GroupConfig::new("kdc-sim", Vec::new());
        config.auth = AuthMode::Kdc;
        config.trust_any_registered = true;
        fast_timers(&mut config);
        let mut nodes = Vec::new();
        for (i, key) in keys.into_iter().enumerate() {
            let mut seed_bytes = [0u8; 32];
            sim.rng().fill_bytes(&mut seed_bytes);
            let config = config.clone();
            let node = sim.add_node_with(|_, addr| {
                let credentials = KdcCredentials {
                    name: principal_name(i),
                    key,
                    kdc: kdc_addr,
                };
                peer(MemberOrKdc::Member(Box::new(
                    GroupMember::new(symmetric_only(), credentials, addr, config, seed_bytes)
                        .expect("member"),
                )))
            });
            nodes.push(node);
        }
        KdcGroup {
            sim,
            kdc,
            nodes,
            ids: (0..n)
                .map(|i| MemberId::from_principal(&principal_name(i)))
                .collect(),
        }
    }

    fn events(&self, i: usize) -> Vec<GroupEvent> {
        self.sim
            .events_of(self.nodes[i])
            .map(|(_, e)| e.clone())
            .collect()
    }

    fn member(&self, i: usize) -> &GroupMember {
        self.sim.node(self.nodes[i]).inner.member()
    }

    fn with_member<R>(&mut self, i: usize, f: impl FnOnce(&mut GroupMember, Timestamp) -> R) -> R {
        self.sim
            .with_node(self.nodes[i], |p, now| f(p.inner.member_mut(), now))
    }

    fn start(&mut self, i: usize, contacts: &[usize]) {
        let addrs: Vec<SocketAddr> = contacts
            .iter()
            .map(|c| self.sim.addr(self.nodes[*c]))
            .collect();
        self.with_member(i, |m, now| m.start(now, &addrs));
    }

    fn run_for(&mut self, d: Duration) -> Result<(), SimFailure> {
        let until = self.sim.now().saturating_add(d);
        self.sim.run_until(until)
    }

    fn view(&self, i: usize) -> BTreeSet<usize> {
        self.member(i)
            .view()
            .map(|v| {
                v.ids()
                    .filter_map(|m| self.ids.iter().position(|x| *x == m))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn converged(&self, set: &[usize]) -> bool {
        let want: BTreeSet<usize> = set.iter().copied().collect();
        let fp = self.member(set[0]).key_fingerprint();
        set.iter().all(|i| {
            let m = self.member(*i);
            !m.status().changing_view && self.view(*i) == want && m.key_fingerprint() == fp
        })
    }

    fn wait(&mut self, set: &[usize], bound: Duration) -> Result<Duration, SimFailure> {
        let start = self.sim.now();
        while !self.converged(set) {
            if self.sim.now().saturating_duration_since(start) > bound {
                let views: Vec<_> = (0..self.nodes.len()).map(|i| self.view(i)).collect();
                if std::env::var("DEBUG_KDC").is_ok() {
                    for i in 0..self.nodes.len() {
                        let m = self.member(i);
                        eprintln!(
                            "n{i}: {} {:?}",
                            m.debug_state(),
                            m.counters().iter().collect::<Vec<_>>()
                        );
                        eprintln!(
                            "   events: {:?}",
                            self.events(i)
                                .iter()
                                .filter(|e| !matches!(e, GroupEvent::Deliver { .. }))
                                .rev()
                                .take(8)
                                .collect::<Vec<_>>()
                        );
                    }
                }
                return Err(self
                    .sim
                    .failure(format!("{set:?} did not converge in {bound:?}: {views:?}")));
            }
            self.run_for(Duration::from_millis(20))?;
        }
        Ok(self.sim.now().saturating_duration_since(start))
    }

    fn ledger(&self, i: usize) -> BTreeSet<[u8; 8]> {
        self.member(i)
            .key_ledger()
            .iter()
            .map(|(_, f)| *f)
            .collect()
    }

    fn delivered(&self, i: usize) -> Vec<Vec<u8>> {
        self.events(i)
            .into_iter()
            .filter_map(|e| match e {
                GroupEvent::Deliver {
                    channel: Channel::Reliable,
                    data,
                    ..
                } => Some(data),
                _ => None,
            })
            .collect()
    }
}

const BOUND: Duration = Duration::from_secs(6);

#[test]
fn a_kdc_group_forms_delivers_rekeys_and_merges_with_no_public_key_operation() {
    let before = PUBLIC_KEY_CALLS.load(Ordering::SeqCst);
    let mut g = KdcGroup::new(41, 4, &[]);
    g.start(0, &[]);
    g.run_for(Duration::from_millis(100)).expect("run");
    g.start(1, &[0]);
    g.wait(&[0, 1], BOUND).expect("0 and 1");
    for i in 2..4 {
        g.start(i, &[0]);
    }
    g.wait(&[0, 1, 2, 3], BOUND).expect("one view");
    // Joiners 2 and 3 presented their tokens (LSGC message 5) to member 1, already in.
    assert!(
        g.member(1).tokens_checked() >= 2,
        "member 1 did not check the tokens"
    );
    // Member 0 let the three others in: in LSGC the member a joiner asks is the one that
    // asks the KDC, so it received at least one KDC answer for each of them, counted apart
    // from the group's own traffic.
    let kinds = g.member(0).traffic().by_kind();
    let kdc = kinds
        .iter()
        .find(|(kind, _)| *kind == "kdc")
        .map(|(_, c)| *c);
    assert!(
        kdc.is_some_and(|c| c.datagrams >= 3 && c.bytes > 0),
        "member 0's KDC datagrams: {kdc:?}"
    );
    for i in 0..4 {
        g.with_member(i, |m, now| {
            m.send(now, Channel::Reliable, format!("hi {i}").as_bytes())
        })
        .expect("send");
    }
    g.run_for(Duration::from_secs(1)).expect("run");
    for i in 0..4 {
        let got = g.delivered(i);
        for j in 0..4 {
            assert!(
                got.contains(&format!("hi {j}").into_bytes()),
                "{i} missed {j}"
            );
        }
    }
    // A leave: a fresh key the member that left never holds.
    g.with_member(3, |m, now| m.leave(now));
    g.wait(&[0, 1, 2], BOUND).expect("without 3");
    let key = g.member(0).key_fingerprint().expect("key");
    assert!(
        !g.ledger(3).contains(&key),
        "the member that left holds the new key"
    );
    // A partition, then a heal: the two sides merge under one key.
    let (a, b) = ([g.nodes[0]], [g.nodes[1], g.nodes[2], g.kdc]);
    g.sim.partition(&[&a, &b]);
    g.run_for(Duration::from_secs(3)).expect("run");
    assert_ne!(g.view(0), g.view(1), "the partition did not split the view");
    g.sim.heal();
    let took = g.wait(&[0, 1, 2], BOUND).expect("merged");
    println!("merged in {took:?}");
    let exchanged = (0..4)
        .flat_map(|i| g.events(i))
        .any(|e| matches!(e, GroupEvent::KeyExchanged { .. }));
    assert!(exchanged, "no Exchange ran");
    assert_eq!(
        PUBLIC_KEY_CALLS.load(Ordering::SeqCst),
        before,
        "a KDC-mode member called Ed25519"
    );
}

#[test]
fn a_principal_the_kdc_does_not_know_is_refused_with_a_clear_event() {
    let mut g = KdcGroup::new(42, 3, &[2]);
    g.start(0, &[]);
    g.run_for(Duration::from_millis(100)).expect("run");
    g.start(1, &[0]);
    g.wait(&[0, 1], BOUND).expect("0 and 1");
    g.start(2, &[0]);
    g.run_for(Duration::from_secs(3)).expect("run");
    assert_eq!(
        g.view(0),
        BTreeSet::from([0, 1]),
        "the unknown principal got in"
    );
    let (e0, e2) = (g.events(0), g.events(2));
    let refused_at_leader = e0.iter().any(
        |e| matches!(e, GroupEvent::Refused { reason, .. } if reason.contains("KDC does not know")),
    );
    let refused_at_joiner = e2.iter().any(
        |e| matches!(e, GroupEvent::Refused { reason, .. } if reason.contains("KDC does not know")),
    );
    assert!(refused_at_leader, "no event at the leader: {e0:?}");
    assert!(refused_at_joiner, "no event at the joiner: {e2:?}");
    let key = g.member(0).key_fingerprint().expect("key");
    assert!(!g.ledger(2).contains(&key));
}

/// Every gossip Present sent so far, by sender index: (destination, bytes).
fn presents_sent(g: &KdcGroup) -> Vec<(usize, SocketAddr, Vec<u8>)> {
    (0..g.nodes.len())
        .flat_map(|i| {
            g.sim
                .node(g.nodes[i])
                .presents
                .iter()
                .map(move |(to, d)| (i, *to, d.clone()))
        })
        .collect()
}

#[test]
fn message_5_goes_to_the_leader_and_two_witnesses_not_to_every_member() {
    // 20 members form, then 19 join at once: with message 5 to every member each joiner
    // sent a gossip Present to each of the 19 members besides the leader (361 in all);
    // now each sends at most PRESENT_WITNESSES per Grant it gets.
    let (first, then) = (20, 19);
    let n = first + then + 1;
    let mut g = KdcGroup::new(43, n, &[]);
    g.start(0, &[]);
    g.run_for(Duration::from_millis(100)).expect("run");
    for i in 1..first {
        g.start(i, &[0]);
    }
    let formed: Vec<usize> = (0..first).collect();
    g.wait(&formed, BOUND * 2).expect("the first 20");
    let before = presents_sent(&g).len();
    let checked_before: u64 = (0..first).map(|i| g.member(i).tokens_checked()).sum();
    for i in first..first + then {
        g.start(i, &[0]);
    }
    let all: Vec<usize> = (0..first + then).collect();
    g.wait(&all, BOUND * 2).expect("all 39");
    let sent = presents_sent(&g);
    let new = &sent[before..];
    assert!(
        new.len() >= then,
        "each joiner presents to at least one witness: {} Presents",
        new.len()
    );
    assert!(
        new.len() <= 2 * PRESENT_WITNESSES * then,
        "{} Presents for {then} joiners: message 5 goes to every member again",
        new.len()
    );
    // Only the leader's first successors are witnesses.
    let witnesses: BTreeSet<SocketAddr> = new.iter().map(|(_, to, _)| *to).collect();
    assert!(
        witnesses.len() <= PRESENT_WITNESSES,
        "Presents went to {} members",
        witnesses.len()
    );
    let checked: u64 = (0..first).map(|i| g.member(i).tokens_checked()).sum();
    assert!(
        checked - checked_before >= then as u64,
        "the witnesses did not check the tokens"
    );

    // One more joiner: its Present replayed, and forged, at a witness is dropped and
    // counted, and checked once.
    let last = n - 1;
    let sent_before = g.sim.node(g.nodes[last]).presents.len();
    g.start(last, &[0]);
    let start = g.sim.now();
    while g.sim.node(g.nodes[last]).presents.len() == sent_before {
        assert!(
            g.sim.now().saturating_duration_since(start) < BOUND,
            "the last joiner presented no token"
        );
        assert!(g.sim.step(), "nothing scheduled");
    }
    let (to, bytes) = g.sim.node(g.nodes[last]).presents[sent_before].clone();
    let from = g.sim.addr(g.nodes[last]);
    let w = g.sim.node_by_addr(to).expect("a witness");
    let wi = g.nodes.iter().position(|x| *x == w).expect("a member");
    let (checked, replayed, failed) = {
        let m = g.member(wi);
        (
            m.tokens_checked(),
            m.counters().get(Drop::Replayed),
            m.counters().get(Drop::AuthFailed),
        )
    };
    let mut forged = bytes.clone();
    let end = forged.len() - 1;
    forged[end] ^= 1; // the token's tag
    g.sim.inject(from, w, bytes, Duration::from_millis(1));
    g.sim.inject(from, w, forged, Duration::from_millis(2));
    g.run_for(Duration::from_millis(50)).expect("run");
    let m = g.member(wi);
    assert_eq!(m.tokens_checked(), checked + 1, "one token, checked once");
    assert_eq!(m.counters().get(Drop::Replayed), replayed + 1, "the copy");
    assert_eq!(
        m.counters().get(Drop::AuthFailed),
        failed + 1,
        "the forgery"
    );
    let everyone: Vec<usize> = (0..n).collect();
    g.wait(&everyone, BOUND * 2).expect("all 40");
}

/// A run of joins, leaves, crashes, partitions, loss, duplication, reordering and replays
/// (including KDC answers and pair handshakes) in KDC mode; then quiet: all live members in
/// one view with one key, no public-key call, and departed members never hold a later key.
fn kdc_run(seed: u64) -> Result<(), SimFailure> {
    let before = PUBLIC_KEY_CALLS.load(Ordering::SeqCst);
    let n = 5;
    let mut g = KdcGroup::new(seed, n, &[]);
    let mut rng = g.sim.fork_rng();
    let faults = StandardFaults {
        delay: 0.0,
        tamper: 0.0,
        ..StandardFaults::light()
    }
    .add_to(&mut g.sim);
    for i in 0..n {
        let contacts: Vec<usize> = (0..n).filter(|j| *j != i).collect();
        g.start(i, &contacts);
    }
    g.run_for(Duration::from_secs(3))?;
    let mut left: BTreeSet<usize> = BTreeSet::new();
    for round in 0..30u64 {
        for i in 0..n {
            if !left.contains(&i) && rng.next_u32().is_multiple_of(3) {
                let _ = g.with_member(i, |m, now| {
                    m.send(now, Channel::Reliable, format!("{i}-{round}").as_bytes())
                });
            }
        }
        if round == 10 && rng.next_u32().is_multiple_of(2) {
            let who = (rng.next_u32() as usize) % n;
            g.with_member(who, |m, now| m.leave(now));
            left.insert(who);
        }
        if round % 10 == 3 {
            let (a, mut b) = split_prefix(&mut rng, &g.nodes[..n], 3);
            b.push(g.kdc);
            g.sim.partition(&[&a, &b]);
        }
        if round % 10 == 8 {
            g.sim.heal();
        }
        // Replays: datagrams members and the KDC sent, to where they went or elsewhere.
        if round % 5 == 0 {
            for _ in 0..6 {
                let all: Vec<NodeId> = g.nodes.iter().copied().chain([g.kdc]).collect();
                let src = all[(rng.next_u32() as usize) % all.len()];
                let tap = g.sim.node(src).tap.clone();
                if tap.is_empty() {
                    continue;
                }
                let (to, bytes) = tap[(rng.next_u32() as usize) % tap.len()].clone();
                let from = g.sim.addr(src);
                let dst = if rng.next_u32().is_multiple_of(2) {
                    g.sim.node_by_addr(to).unwrap_or(g.nodes[0])
                } else {
                    g.nodes[(rng.next_u32() as usize) % n]
                };
                g.sim.inject(from, dst, bytes, Duration::from_millis(1));
            }
        }
        g.run_for(Duration::from_millis(50 + u64::from(rng.next_u32() % 50)))?;
    }
    faults.remove(&mut g.sim);
    g.sim.heal();
    let live: Vec<usize> = (0..n).filter(|i| !left.contains(i)).collect();
    g.wait(&live, BOUND * 2)?;
    // A member that left hears of its removal over its pair channel; give that a moment.
    g.run_for(Duration::from_secs(1))?;
    let key = g.member(live[0]).key_fingerprint();
    for i in &left {
        if key.is_some_and(|k| g.ledger(*i).contains(&k)) {
            return Err(g
                .sim
                .failure(format!("member {i} left and holds the current key")));
        }
        let expelled = g.events(*i).iter().any(|e| {
            *e == GroupEvent::Expelled {
                reason: RemovalReason::Left,
            }
        });
        if !expelled {
            return Err(g.sim.failure(format!("member {i} never finished leaving")));
        }
    }
    if PUBLIC_KEY_CALLS.load(Ordering::SeqCst) != before {
        return Err(g
            .sim
            .failure("a KDC-mode member called Ed25519".to_string()));
    }
    Ok(())
}

#[test]
fn kdc_mode_under_faults_partitions_leaves_and_replays() {
    sweep(12, kdc_run);
}
