//! A simulated group and the checkers that read its events.
#![allow(dead_code)]

use cohort_channel::identity::Identity;
use cohort_core::Transmit;
use cohort_group::{Channel, GroupConfig, GroupEvent, MemberId, RemovalReason, ViewId};
use cohort_sim::{NodeId, Sim, SimConfig, SimFailure};
use rand_core::RngCore;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::SocketAddr;
use std::time::Duration;

pub mod kit;
pub mod tree;
pub use kit::identity;
use kit::{MemberNode, SendWatch};

/// One member's reliable deliveries in one view: (sender, message number), in order.
type Deliveries = Vec<(MemberId, u64)>;

/// A node's deliveries in one view and the view it went on to (`None`: none, at the end).
type InView = (usize, Deliveries, Option<ViewId>);

/// A member with a tap on what it sends, so the adversary can replay real packets.
pub type Node = MemberNode<Tap>;

/// A sample of what a member sent.
#[derive(Default)]
pub struct Tap {
    pub tap: Vec<(SocketAddr, Vec<u8>)>,
    pub sent_count: u64,
    /// When set, every datagram sent (destination and bytes) is hashed into it in order, so
    /// that two runs can be compared byte for byte (`Group::trace`).
    pub trace: Option<DefaultHasher>,
}

impl SendWatch for Tap {
    fn sent(&mut self, t: &Transmit, buf: &[u8]) {
        self.sent_count += 1;
        if let Some(trace) = self.trace.as_mut() {
            t.destination.hash(trace);
            buf[..t.size].hash(trace);
        }
        // Keep a sample of the packets (every 7th, and all gossip: Ids and tickets), up to 400.
        let gossip = buf.first() == Some(&cohort_group::exchange::GOSSIP_KIND);
        if (self.sent_count.is_multiple_of(7) || gossip) && self.tap.len() < 400 {
            self.tap.push((t.destination, buf[..t.size].to_vec()));
        }
    }
}

/// Everything a test needs about one simulated group.
pub struct Group {
    pub sim: Sim<Node>,
    pub nodes: Vec<NodeId>,
    pub ids: Vec<MemberId>,
    pub identities: Vec<Identity>,
    pub config: GroupConfig,
    /// What each node's application sent: (node index, channel, seq) -> data.
    pub sent: HashMap<(usize, Channel, u64), Vec<u8>>,
    /// Crashed node indexes.
    pub crashed: BTreeSet<usize>,
}

/// The simulator the group tests run in: 5 ms links, datagrams up to 64 KiB, no packet log.
/// Also restarts this thread's seeded crypto stream from `seed` (`kit::seed_crypto`), so
/// that the members' key shares replay with the run: call it when a run starts.
pub fn sim_config(seed: u64) -> SimConfig {
    kit::seed_crypto(seed);
    SimConfig {
        mtu: 65_536,
        log_packets: false,
        latency: Duration::from_millis(5),
        ..SimConfig::with_seed(seed)
    }
}

/// The group tests' timers: heartbeat 50 ms, suspicion 400 ms, flush 300 ms.
pub fn fast_timers(config: &mut GroupConfig) {
    config.heartbeat_interval = Duration::from_millis(50);
    config.suspect_timeout = Duration::from_millis(400);
    config.flush_timeout = Duration::from_millis(300);
}

impl Group {
    /// `n` members (not started) in a simulator seeded with `seed`.
    pub fn new(seed: u64, n: usize, tweak: impl Fn(&mut GroupConfig)) -> Group {
        Group::new_each(seed, n, |_, c| tweak(c))
    }

    /// `n` members (not started); `tweak` sees each member's index and config (say, to give
    /// each its own trust policy).
    pub fn new_each(seed: u64, n: usize, tweak: impl Fn(usize, &mut GroupConfig)) -> Group {
        Group::new_in(sim_config(seed), n, tweak)
    }

    /// `n` members (not started) in a simulator configured by `sim` (seeded by its seed).
    pub fn new_in(sim: SimConfig, n: usize, tweak: impl Fn(usize, &mut GroupConfig)) -> Group {
        let seed = sim.seed;
        let mut sim: Sim<Node> = Sim::new(sim);
        let identities: Vec<Identity> = (0..n).map(|i| identity(seed, i)).collect();
        let ids: Vec<MemberId> = identities.iter().map(|i| MemberId(i.public())).collect();
        let mut config = GroupConfig::new("sim", ids.clone());
        fast_timers(&mut config);
        let mut nodes = Vec::new();
        for (i, ident) in identities.iter().enumerate() {
            let mut seed_bytes = [0u8; 32];
            sim.rng().fill_bytes(&mut seed_bytes);
            let mut config = config.clone();
            tweak(i, &mut config);
            let ident = ident.clone();
            let node = sim.add_node_with(|_, addr| {
                Node::new(ident, addr, config, seed_bytes, Tap::default())
            });
            nodes.push(node);
        }
        tweak(0, &mut config);
        Group {
            sim,
            nodes,
            ids,
            identities,
            config,
            sent: HashMap::new(),
            crashed: BTreeSet::new(),
        }
    }

    /// Makes every member hash what it sends from now on ([`Tap::trace`]).
    pub fn start_tracing(&mut self) {
        for n in self.nodes.clone() {
            self.sim.node_mut(n).watch.trace = Some(DefaultHasher::new());
        }
    }

    /// One hash per member of every datagram it sent since [`start_tracing`], and one of
    /// the run's events (when, where and of which kind: formatting each in full took
    /// minutes at 10,000 members): equal for two runs that went byte for byte the same.
    ///
    /// [`start_tracing`]: Group::start_tracing
    pub fn trace(&self) -> Vec<u64> {
        let mut out: Vec<u64> = self
            .nodes
            .iter()
            .map(|n| {
                self.sim
                    .node(*n)
                    .watch
                    .trace
                    .as_ref()
                    .map_or(0, Hasher::finish)
            })
            .collect();
        let mut events = DefaultHasher::new();
        for (at, node, event) in self.sim.events() {
            (at, node, std::mem::discriminant(event)).hash(&mut events);
        }
        out.push(events.finish());
        out
    }

    /// Starts every member with every other member as a contact.
    pub fn start_all(&mut self) {
        let addrs: Vec<SocketAddr> = self.nodes.iter().map(|n| self.sim.addr(*n)).collect();
        for (i, n) in self.nodes.clone().into_iter().enumerate() {
            let contacts: Vec<SocketAddr> = addrs
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, a)| *a)
                .collect();
            self.sim
                .with_node(n, |node, now| node.member.start(now, &contacts));
        }
    }

    pub fn run_for(&mut self, d: Duration) -> Result<(), SimFailure> {
        let until = self.sim.now().saturating_add(d);
        self.sim.run_until(until)
    }

    /// Sends from node `i`; records what was accepted.
    pub fn send(&mut self, i: usize, channel: Channel, data: Vec<u8>) -> bool {
        if self.crashed.contains(&i) {
            return false;
        }
        let n = self.nodes[i];
        let d = data.clone();
        let r = self
            .sim
            .with_node(n, |node, now| node.member.send(now, channel, &d));
        match r {
            Ok(seq) => {
                self.sent.insert((i, channel, seq), data);
                true
            }
            Err(_) => false,
        }
    }

    pub fn crash(&mut self, i: usize) {
        self.crashed.insert(i);
        self.sim.crash(self.nodes[i]);
    }

    pub fn index_of(&self, id: &MemberId) -> Option<usize> {
        self.ids.iter().position(|x| x == id)
    }

    /// The latest view each live node installed (and has not been expelled since).
    pub fn current_views(&self) -> Vec<Option<(ViewId, Vec<MemberId>, u64)>> {
        self.nodes
            .iter()
            .map(|n| {
                self.sim
                    .node(*n)
                    .member
                    .view()
                    .map(|v| (v.id, v.ids().collect(), v.key_epoch))
            })
            .collect()
    }

    /// Whether the live nodes in `set` share one view whose members are exactly `set`, and
    /// none of them is in the middle of a view change. The view ids and sizes are compared
    /// first; each member list is read in full only once those agree, so that waiting on a
    /// group of thousands does not copy every list at every step.
    pub fn converged(&self, set: &[usize]) -> bool {
        let mut id = None;
        for i in set {
            let m = &self.sim.node(self.nodes[*i]).member;
            if m.status().changing_view {
                return false;
            }
            let Some(v) = m.view() else {
                return false;
            };
            if *id.get_or_insert(v.id) != v.id || v.members.len() != set.len() {
                return false;
            }
        }
        set.iter().all(|i| {
            let v = self.sim.node(self.nodes[*i]).member.view();
            v.is_some_and(|v| set.iter().all(|j| v.contains(&self.ids[*j])))
        })
    }

    /// Starts member 0 alone, then every other member with member 0 as its only contact,
    /// `per_100ms` of them every 100 ms (all at once when it is at least the group's size),
    /// and runs until all share one view (checked every 250 ms, up to `bound`). Returns the
    /// simulated time from the first joiner's start.
    pub fn form_from_cold(
        &mut self,
        per_100ms: usize,
        bound: Duration,
    ) -> Result<Duration, SimFailure> {
        let n = self.nodes.len();
        let first = self.sim.addr(self.nodes[0]);
        self.sim
            .with_node(self.nodes[0], |node, now| node.member.start(now, &[]));
        self.run_for(Duration::from_millis(50))?;
        let start = self.sim.now();
        for (k, i) in (1..n).enumerate() {
            if k > 0 && k % per_100ms.max(1) == 0 {
                self.run_for(Duration::from_millis(100))?;
            }
            self.sim
                .with_node(self.nodes[i], |node, now| node.member.start(now, &[first]));
        }
        let all: Vec<usize> = (0..n).collect();
        loop {
            self.run_for(Duration::from_millis(250))?;
            let took = self.sim.now().saturating_duration_since(start);
            if self.converged(&all) {
                return Ok(took);
            }
            if took > bound {
                let mut sizes: std::collections::BTreeMap<String, (usize, usize)> =
                    Default::default();
                let mut without = 0;
                for n in &self.nodes {
                    match self.sim.node(*n).member.view() {
                        Some(v) => {
                            sizes
                                .entry(v.id.to_string())
                                .or_insert((v.members.len(), 0))
                                .1 += 1
                        }
                        None => without += 1,
                    }
                }
                let leader = &self.sim.node(self.nodes[0]).member;
                return Err(self.sim.failure(format!(
                    "{n} members did not form one view within {bound:?}: {without} without a \
                     view; views (id: members, nodes holding it) {sizes:?}; leader {}; leader \
                     drops {:?}",
                    leader.debug_state(),
                    leader.counters()
                )));
            }
        }
    }

    /// Runs until `set` converges or `bound` passes; returns the time it took.
    pub fn wait_converged(
        &mut self,
        set: &[usize],
        bound: Duration,
    ) -> Result<Duration, SimFailure> {
        let start = self.sim.now();
        let step = Duration::from_millis(20);
        loop {
            if self.converged(set) {
                return Ok(self.sim.now().saturating_duration_since(start));
            }
            if self.sim.now().saturating_duration_since(start) > bound {
                let views = self.current_views();
                return Err(self.sim.failure(format!(
                    "members {set:?} did not converge within {bound:?}: views {:?}",
                    views
                        .iter()
                        .map(|v| v.as_ref().map(|(id, m, e)| (id.to_string(), m.len(), *e)))
                        .collect::<Vec<_>>()
                )));
            }
            self.run_for(step)?;
        }
    }

    /// Cuts the network between members `a` and `b`, then waits (up to `bound` each) until
    /// each side has a view of its own. Panics if a side does not get one.
    pub fn split(&mut self, a: &[usize], b: &[usize], bound: Duration) {
        let na: Vec<_> = a.iter().map(|i| self.nodes[*i]).collect();
        let nb: Vec<_> = b.iter().map(|i| self.nodes[*i]).collect();
        self.sim.partition(&[&na, &nb]);
        self.wait_converged(a, bound).expect("side a");
        self.wait_converged(b, bound).expect("side b");
    }

    /// Every checker over the recorded events.
    pub fn check_all(&self) -> Result<(), SimFailure> {
        let per_node = self.event_refs_per_node();
        self.check_integrity(&per_node)?;
        self.check_fifo_and_order(&per_node)?;
        self.check_agreement(&per_node)?;
        self.check_self_delivery(&per_node)?;
        self.check_key_secrecy()?;
        Ok(())
    }

    pub fn events_per_node(&self) -> Vec<Vec<GroupEvent>> {
        self.event_refs_per_node()
            .into_iter()
            .map(|events| events.into_iter().cloned().collect())
            .collect()
    }

    /// As [`Group::events_per_node`], borrowed from the log: the checkers read millions of
    /// events at 10,000 members, where a copy of each (and a search of the node list per
    /// event) took a fifth of a run.
    pub fn event_refs_per_node(&self) -> Vec<Vec<&GroupEvent>> {
        let index: HashMap<NodeId, usize> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (*n, i))
            .collect();
        let mut out: Vec<Vec<&GroupEvent>> = vec![Vec::new(); self.nodes.len()];
        for (_, node, e) in self.sim.events() {
            if let Some(i) = index.get(&node) {
                out[*i].push(e);
            }
        }
        out
    }

    /// No delivery of anything the application did not send, no duplicates, and data
    /// exactly as sent (no forged, replayed or modified message gets through).
    fn check_integrity(&self, per_node: &[Vec<&GroupEvent>]) -> Result<(), SimFailure> {
        for (i, events) in per_node.iter().enumerate() {
            let mut seen = HashSet::new();
            for e in events {
                if let GroupEvent::Deliver {
                    channel,
                    sender,
                    seq,
                    data,
                    ..
                } = e
                {
                    let Some(s) = self.index_of(sender) else {
                        return Err(self
                            .sim
                            .failure(format!("node {i} delivered from a stranger")));
                    };
                    match self.sent.get(&(s, *channel, *seq)) {
                        Some(d) if d == data => {}
                        Some(_) => {
                            return Err(self.sim.failure(format!(
                                "node {i} delivered a modified message {s}/{channel:?}/{seq}"
                            )))
                        }
                        None => {
                            return Err(self.sim.failure(format!(
                                "node {i} delivered a message never sent: {s}/{channel:?}/{seq}"
                            )))
                        }
                    }
                    if !seen.insert((s, *channel, *seq)) {
                        return Err(self
                            .sim
                            .failure(format!("node {i} delivered {s}/{channel:?}/{seq} twice")));
                    }
                }
            }
        }
        Ok(())
    }

    /// Reliable deliveries: per-sender FIFO at every node, positions contiguous within each
    /// view, and total order: two members that deliver in one view and go on to the same next
    /// view (or are both still in it) deliver the same sequence there, one a prefix of the
    /// other. Members whose next views differ split in a partition; the last messages of the
    /// view they split from may then be ordered differently on the two sides (this is
    /// "agreed", not "safe", delivery; see the crate README). A member that left has no next
    /// view of its own: it is on the side of the view that others installed without it,
    /// naming it as left (it coordinated that view, or its leave was granted there), and is
    /// held to that side's order. One that no such view names left alone (its leave reached
    /// no one: a leader cut off by a partition): a side of its own, as a crashed member.
    fn check_fifo_and_order(&self, per_node: &[Vec<&GroupEvent>]) -> Result<(), SimFailure> {
        // (view, member) -> the view installed from it without the member, which left.
        let mut left_into: HashMap<(ViewId, MemberId), ViewId> = HashMap::new();
        for events in per_node {
            let mut current: Option<ViewId> = None;
            let mut leavers = Vec::new();
            for e in events {
                match e {
                    GroupEvent::Removed {
                        member,
                        reason: RemovalReason::Left,
                    } => leavers.push(*member),
                    GroupEvent::View(v) => {
                        if let Some(c) = current {
                            for m in leavers.drain(..) {
                                left_into.insert((c, m), v.id);
                            }
                        }
                        leavers.clear();
                        current = Some(v.id);
                    }
                    _ => {}
                }
            }
        }
        // Members that left through a view change no one else installed (say, a leader cut
        // off by a partition, which went alone): a side of their own, as a crashed member.
        let mut left_alone: HashSet<usize> = HashSet::new();
        // (view) -> node -> (deliveries, next view)
        let mut by_view: HashMap<ViewId, Vec<InView>> = HashMap::new();
        for (i, events) in per_node.iter().enumerate() {
            let mut last: HashMap<MemberId, u64> = HashMap::new();
            let mut current: Option<(ViewId, Vec<(MemberId, u64)>)> = None;
            for e in events {
                match e {
                    GroupEvent::View(v) => {
                        if let Some((id, list)) = current.take() {
                            by_view.entry(id).or_default().push((i, list, Some(v.id)));
                        }
                        current = Some((v.id, Vec::new()));
                    }
                    GroupEvent::Deliver {
                        channel: Channel::Reliable,
                        sender,
                        view,
                        seq,
                        order,
                        ..
                    } => {
                        if let Some(prev) = last.get(sender) {
                            if seq <= prev {
                                return Err(self.sim.failure(format!(
                                    "node {i}: FIFO broken for {sender:?}: {seq} after {prev}"
                                )));
                            }
                        }
                        last.insert(*sender, *seq);
                        let Some((id, list)) = current.as_mut() else {
                            return Err(self
                                .sim
                                .failure(format!("node {i} delivered outside a view")));
                        };
                        if *id != *view || *order != Some(list.len() as u64) {
                            return Err(self.sim.failure(format!(
                                "node {i}: delivered {order:?} of view {view}, expected {} of {id}",
                                list.len()
                            )));
                        }
                        list.push((*sender, *seq));
                    }
                    _ => {}
                }
            }
            if let Some((id, list)) = current.take() {
                let next = left_into.get(&(id, self.ids[i])).copied();
                let left = events
                    .iter()
                    .rev()
                    .take_while(|e| !matches!(e, GroupEvent::View(_)))
                    .any(|e| {
                        matches!(
                            e,
                            GroupEvent::Expelled {
                                reason: RemovalReason::Left
                            }
                        )
                    });
                if left && next.is_none() {
                    left_alone.insert(i);
                }
                by_view.entry(id).or_default().push((i, list, next));
            }
        }
        // Two nodes' lists must agree on their common prefix when the two went on to the same
        // next view, or when either has no next view (it was still in this one at the end).
        // A crashed member's last view has no successor: it may have been on either side of
        // a split, and is held to neither; so is a member that left alone. Lists that
        // agree pairwise on their common prefixes are exactly the prefixes of the longest
        // of them, so each group of nodes that must agree is checked against its longest
        // list: linear in the nodes, not quadratic (views of thousands of members).
        for (view, nodes) in &by_view {
            let dead = |n: &usize, s: &Option<ViewId>| {
                s.is_none() && (self.crashed.contains(n) || left_alone.contains(n))
            };
            let open: Vec<&InView> = nodes
                .iter()
                .filter(|(n, _, s)| s.is_none() && !dead(n, s))
                .collect();
            let mut by_next: HashMap<ViewId, Vec<&InView>> = HashMap::new();
            for node in nodes {
                if let Some(next) = node.2 {
                    by_next.entry(next).or_default().push(node);
                }
            }
            let mut groups: Vec<Vec<&InView>> = by_next
                .into_values()
                .map(|mut side| {
                    side.extend(open.iter().copied());
                    side
                })
                .collect();
            if groups.is_empty() {
                groups.push(open);
            }
            for group in &groups {
                let Some(longest) = group.iter().max_by_key(|(_, list, _)| list.len()) else {
                    continue;
                };
                for (n, list, _) in group {
                    if longest.1[..list.len()] != list[..] {
                        return Err(self.sim.failure(format!(
                            "total order broken in view {view}: nodes {n} and {} differ",
                            longest.0
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// Agreement: members that pass together from V1 to V2 delivered the same messages in V1,
    /// in the same order.
    fn check_agreement(&self, per_node: &[Vec<&GroupEvent>]) -> Result<(), SimFailure> {
        // For each node: list of (view, next view, delivered set in view).
        let mut transitions: HashMap<(ViewId, ViewId), Vec<(usize, Deliveries)>> = HashMap::new();
        for (i, events) in per_node.iter().enumerate() {
            let mut current: Option<ViewId> = None;
            let mut delivered = Vec::new();
            for e in events {
                match e {
                    GroupEvent::View(v) => {
                        if let Some(c) = current {
                            transitions
                                .entry((c, v.id))
                                .or_default()
                                .push((i, std::mem::take(&mut delivered)));
                        }
                        delivered.clear();
                        current = Some(v.id);
                    }
                    GroupEvent::Expelled { .. } => {
                        current = None;
                        delivered.clear();
                    }
                    GroupEvent::Deliver {
                        channel: Channel::Reliable,
                        sender,
                        seq,
                        view,
                        ..
                    } => {
                        if Some(*view) != current {
                            return Err(self.sim.failure(format!(
                                "node {i} delivered in view {view} while in {current:?}"
                            )));
                        }
                        delivered.push((*sender, *seq));
                    }
                    _ => {}
                }
            }
        }
        for ((v1, v2), list) in &transitions {
            for w in list.windows(2) {
                if w[0].1 != w[1].1 {
                    return Err(self.sim.failure(format!(
                        "agreement broken from {v1} to {v2}: node {} delivered {} messages, node {} delivered {}",
                        w[0].0,
                        w[0].1.len(),
                        w[1].0,
                        w[1].1.len()
                    )));
                }
            }
        }
        Ok(())
    }

    /// Self delivery: every reliable message a live node sent reached its own application,
    /// unless the node was expelled or crashed (checked at the end, after a quiet period).
    fn check_self_delivery(&self, per_node: &[Vec<&GroupEvent>]) -> Result<(), SimFailure> {
        for (i, events) in per_node.iter().enumerate() {
            if self.crashed.contains(&i) {
                continue;
            }
            if events
                .iter()
                .any(|e| matches!(e, GroupEvent::Expelled { .. }))
            {
                continue;
            }
            let delivered: HashSet<u64> = events
                .iter()
                .filter_map(|e| match e {
                    GroupEvent::Deliver {
                        channel: Channel::Reliable,
                        sender,
                        seq,
                        ..
                    } if *sender == self.ids[i] => Some(*seq),
                    _ => None,
                })
                .collect();
            for (s, ch, seq) in self.sent.keys() {
                if *s == i && *ch == Channel::Reliable && !delivered.contains(seq) {
                    return Err(self.sim.failure(format!(
                        "self delivery: node {i} never delivered its own message {seq}"
                    )));
                }
            }
        }
        Ok(())
    }

    /// A member not in a live member's current view never held that view's key (with the
    /// default policy, which rekeys on every membership change), unless the key went to the
    /// other's component through an Exchange: then both components hold it on purpose, and
    /// their leaders trust each other (the trust sweep in `exchange_sim.rs` checks who).
    fn check_key_secrecy(&self) -> Result<(), SimFailure> {
        if !self.config.rekey_policy.on_membership_change {
            return Ok(());
        }
        let exchanged: HashSet<[u8; 8]> = self
            .nodes
            .iter()
            .flat_map(|n| self.sim.node(*n).member.exchanged_keys().to_vec())
            .collect();
        for (i, n) in self.nodes.iter().enumerate() {
            if self.crashed.contains(&i) {
                continue;
            }
            let m = &self.sim.node(*n).member;
            let (Some(view), Some(fp)) = (m.view(), m.key_fingerprint()) else {
                continue;
            };
            if exchanged.contains(&fp) {
                continue;
            }
            for (j, other) in self.nodes.iter().enumerate() {
                if view.contains(&self.ids[j]) {
                    continue;
                }
                let ledger = self.sim.node(*other).member.key_ledger();
                if ledger.iter().any(|(_, f)| *f == fp) {
                    return Err(self.sim.failure(format!(
                        "node {j}, outside node {i}'s view {}, holds its key (epoch {})",
                        view.id, view.key_epoch
                    )));
                }
            }
        }
        Ok(())
    }
}

/// The adversary: replays packets captured from real members (same and old views, gossip
/// too), flips a bit, truncates, and forges with a valid-looking header.
pub fn adversary(g: &mut Group, rng: &mut impl RngCore) {
    let n = g.nodes.len();
    for _ in 0..4 {
        let src = (rng.next_u32() as usize) % n;
        let dst = g.nodes[(rng.next_u32() as usize) % n];
        let tap = &g.sim.node(g.nodes[src]).watch.tap;
        if tap.is_empty() {
            continue;
        }
        let (_, pkt) = tap[(rng.next_u32() as usize) % tap.len()].clone();
        let from = g.sim.addr(g.nodes[src]);
        g.sim
            .inject(from, dst, pkt.clone(), Duration::from_millis(1));
        let mut flipped = pkt.clone();
        let at = (rng.next_u32() as usize) % flipped.len();
        flipped[at] ^= 1 << (rng.next_u32() % 8);
        g.sim.inject(from, dst, flipped, Duration::from_millis(2));
        g.sim.inject(
            from,
            dst,
            pkt[..pkt.len() / 2].to_vec(),
            Duration::from_millis(3),
        );
        let mut forged = pkt;
        let len = forged.len();
        for b in forged[len.saturating_sub(40)..].iter_mut() {
            *b = rng.next_u32() as u8;
        }
        g.sim.inject(from, dst, forged, Duration::from_millis(4));
    }
}
