//! The kv example's tests. Owns: the store's unit tests (by including `examples/kv/store.rs`,
//! whose `#[cfg(test)]` module runs here); a crash and a joiner on loopback, where each member
//! runs the example's own glue (`examples/kv/node.rs`) on the library facade, on its own tokio
//! runtime (a crash drops that runtime: the member stops answering, as a killed process
//! does); and the partition-and-merge test, which runs in the deterministic simulator
//! (cohort-sim) with real `GroupMember`s.
//!
//! Why in-process on loopback and not `kv` processes: `cargo test --test examples_kv` does not
//! build the example binary, and the glue is the whole example besides argument parsing.
//!
//! Why the simulator for the partition: the merge rule must be shown on the protocol's real
//! behaviour (each side installs its own view and orders its own writes; Heal makes the
//! smaller side join the larger), and a partition on loopback needs a way to cut traffic
//! between chosen members that the library facade does not offer. The simulator cuts it
//! exactly and replays the same run from the seed. It has no facade, so the harness below plays
//! the facade's part in state transfer the way the facade documents it: the leader that
//! installs a view with newcomers takes a snapshot at that point (after its last delivery in
//! the old view), and each newcomer receives it before its first delivery in the new view. A
//! member is a newcomer when the view's leader was not in its previous view: that covers
//! every member of a dissolved component, not only its leader (the only one that gets the
//! core's `Merging` event). `examples/kv/README.md` says where the facade differs today.
//! Everything else is the example's own code (`store::Replica`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

#[path = "../examples/kv/node.rs"]
mod node;
#[path = "../examples/kv/store.rs"]
#[allow(dead_code)] // reason: the example uses parts of it that this test does not
mod store;

use cohort_channel::identity::Identity;
use cohort_crypto::{CryptoProvider, Secret};
use cohort_group::{Channel, GroupConfig, GroupEvent, GroupMember, MemberId, View, ViewId};
use cohort_sim::{NodeId, Sim, SimConfig};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;
use store::{Op, Replica};

/// How long the group may take to form or re-form a view in the simulator.
const CONVERGE_BOUND: Duration = Duration::from_secs(8);

/// Member `i`'s identity in a run seeded with `seed`.
fn identity(seed: u64, i: usize) -> Identity {
    let provider = CryptoProvider::default_provider();
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8..16].copy_from_slice(&(i as u64).to_le_bytes());
    bytes[16] = 0x6b;
    Identity::from_secret(&provider, Secret::from_slice(&bytes)).unwrap()
}

/// A simulated group of kv members: the protocol cores in the simulator, and beside each
/// one the example's replica, fed with that member's events in the order it reported them.
struct KvSim {
    sim: Sim<GroupMember>,
    nodes: Vec<NodeId>,
    ids: Vec<MemberId>,
    replicas: Vec<Replica>,
    /// The last view each member reported (none before its first, or after it was expelled).
    views: Vec<Option<View>>,
    /// State transfer: the snapshot the leader took when it installed a view with newcomers.
    snapshots: HashMap<ViewId, Vec<u8>>,
    /// Log entries already handed to the replicas.
    cursor: usize,
    /// State transfers that brought an old store back (merges sent).
    merges_sent: usize,
}

impl KvSim {
    fn new(seed: u64, n: usize) -> KvSim {
        let mut sim: Sim<GroupMember> = Sim::new(SimConfig {
            mtu: 65_536,
            log_packets: false,
            latency: Duration::from_millis(5),
            ..SimConfig::with_seed(seed)
        });
        let identities: Vec<Identity> = (0..n).map(|i| identity(seed, i)).collect();
        let ids: Vec<MemberId> = identities.iter().map(|i| MemberId(i.public())).collect();
        let mut config = GroupConfig::new("kv", ids.clone());
        config.heartbeat_interval = Duration::from_millis(50);
        config.suspect_timeout = Duration::from_millis(400);
        config.flush_timeout = Duration::from_millis(300);
        config.max_message_len = 16_000;
        let mut nodes = Vec::new();
        for (i, ident) in identities.into_iter().enumerate() {
            let mut seed_bytes = [0u8; 32];
            seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
            seed_bytes[8] = i as u8;
            let config = config.clone();
            nodes.push(sim.add_node_with(|_, addr| {
                GroupMember::new(
                    CryptoProvider::default_provider(),
                    ident,
                    addr,
                    config,
                    seed_bytes,
                )
                .unwrap()
            }));
        }
        let addrs: Vec<SocketAddr> = nodes.iter().map(|n| sim.addr(*n)).collect();
        for (i, n) in nodes.iter().enumerate() {
            let contacts: Vec<SocketAddr> = addrs
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, a)| *a)
                .collect();
            sim.with_node(*n, |m, now| m.start(now, &contacts));
        }
        KvSim {
            sim,
            nodes,
            ids,
            replicas: vec![Replica::new(); n],
            views: vec![None; n],
            snapshots: HashMap::new(),
            cursor: 0,
            merges_sent: 0,
        }
    }

    /// Hands the events logged since the last call to the replicas, in log order, and sends
    /// what state transfer gives back (old stores, as merges).
    fn process(&mut self) {
        let fresh: Vec<(NodeId, GroupEvent)> = self
            .sim
            .events()
            .skip(self.cursor)
            .map(|(_, n, e)| (n, e.clone()))
            .collect();
        self.cursor += fresh.len();
        let mut to_send = Vec::new();
        for (node, event) in fresh {
            let i = self.nodes.iter().position(|n| *n == node).unwrap();
            match event {
                GroupEvent::View(v) => {
                    let me = self.ids[i];
                    let leader = v.leader().id;
                    let prev = self.views[i].take();
                    let newcomers = v
                        .ids()
                        .any(|m| !prev.as_ref().is_some_and(|p| p.contains(&m)));
                    if leader == me && newcomers {
                        self.snapshots.insert(v.id, self.replicas[i].snapshot());
                    }
                    let joined =
                        leader != me && !prev.as_ref().is_some_and(|p| p.contains(&leader));
                    if joined {
                        let snapshot = self
                            .snapshots
                            .get(&v.id)
                            .expect("the leader installed the view before the joiner");
                        if let Some(op) = self.replicas[i].on_state(snapshot).unwrap() {
                            to_send.push((i, op));
                        }
                    }
                    self.views[i] = Some(v);
                }
                GroupEvent::Deliver {
                    channel: Channel::Reliable,
                    sender,
                    data,
                    ..
                } => {
                    self.replicas[i]
                        .on_deliver(*sender.as_bytes(), &data)
                        .unwrap();
                }
                GroupEvent::Expelled { .. } => self.views[i] = None,
                _ => {}
            }
        }
        for (i, op) in to_send {
            self.merges_sent += 1;
            self.write(i, &op);
        }
    }

    /// Member `i` sends `op` on the reliable channel.
    fn write(&mut self, i: usize, op: &Op) {
        let bytes = op.encode();
        self.sim
            .with_node(self.nodes[i], |m, now| {
                m.send(now, Channel::Reliable, &bytes)
            })
            .expect("send");
    }

    fn put(&mut self, i: usize, key: &str, value: &str) {
        self.write(
            i,
            &Op::Put {
                key: key.into(),
                value: value.as_bytes().to_vec(),
            },
        );
    }

    fn run_for(&mut self, d: Duration) {
        let until = self.sim.now().saturating_add(d);
        while self.sim.now() < until {
            self.sim
                .run_for(Duration::from_millis(2))
                .expect("simulator");
            self.process();
        }
    }

    /// Whether members `set` share one settled view made of exactly them, and equal stores.
    fn converged(&self, set: &[usize]) -> bool {
        let mut view = None;
        for i in set {
            let m = self.sim.node(self.nodes[*i]);
            let Some(v) = m.view() else { return false };
            if m.status().changing_view || v.members.len() != set.len() {
                return false;
            }
            if *view.get_or_insert(v.id) != v.id {
                return false;
            }
            if self.replicas[*i].store != self.replicas[set[0]].store {
                return false;
            }
        }
        set.iter().all(|i| {
            let v = self.sim.node(self.nodes[*i]).view().unwrap();
            set.iter().all(|j| v.contains(&self.ids[*j]))
        })
    }

    fn wait_converged(&mut self, set: &[usize]) {
        let start = self.sim.now();
        while !self.converged(set) {
            assert!(
                self.sim.now().saturating_duration_since(start) < CONVERGE_BOUND,
                "members {set:?} did not converge (seed {}): views {:?}",
                self.sim.seed(),
                self.views
                    .iter()
                    .map(|v| v.as_ref().map(|v| (v.id.to_string(), v.members.len())))
                    .collect::<Vec<_>>()
            );
            self.run_for(Duration::from_millis(20));
        }
    }

    fn get(&self, i: usize, key: &str) -> Option<String> {
        self.replicas[i]
            .store
            .get(key)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

/// Five members; a partition into {0,1,2} and {3,4}; both sides write, to keys of their own and
/// to a key both write; the partition heals; the two sides merge into one view and every
/// member ends with the same store, holding both sides' writes; a write after the merge wins
/// over both sides' partition writes.
fn partition_and_merge(seed: u64) {
    let mut g = KvSim::new(seed, 5);
    let all = [0, 1, 2, 3, 4];
    g.wait_converged(&all);
    g.put(0, "before", "0");
    g.put(4, "shared", "before");
    g.run_for(Duration::from_millis(300));
    g.wait_converged(&all);
    assert_eq!(g.get(3, "shared").as_deref(), Some("before"));

    let (big, small) = ([0usize, 1, 2], [3usize, 4]);
    let big_nodes: Vec<NodeId> = big.iter().map(|i| g.nodes[*i]).collect();
    let small_nodes: Vec<NodeId> = small.iter().map(|i| g.nodes[*i]).collect();
    g.sim.partition(&[&big_nodes, &small_nodes]);
    g.wait_converged(&big);
    g.wait_converged(&small);

    // Both sides accept writes. The small side writes more, so its clock runs ahead.
    g.put(1, "big-only", "b");
    g.put(2, "shared", "from-big");
    for k in 0..4 {
        g.put(3, "shared", &format!("from-small-{k}"));
    }
    g.put(4, "small-only", "s");
    g.run_for(Duration::from_millis(500));
    g.wait_converged(&big);
    g.wait_converged(&small);
    assert_eq!(g.get(0, "shared").as_deref(), Some("from-big"));
    assert_eq!(g.get(4, "shared").as_deref(), Some("from-small-3"));
    assert_eq!(
        g.get(0, "small-only"),
        None,
        "no traffic crossed the partition"
    );
    assert_eq!(
        g.get(3, "big-only"),
        None,
        "no traffic crossed the partition"
    );

    g.sim.heal();
    g.wait_converged(&all);
    // One view again; the small side's members got the big side's store by state transfer
    // and sent their old stores as merges: let those be delivered.
    g.run_for(Duration::from_millis(300));
    g.wait_converged(&all);
    assert!(
        g.merges_sent >= 1,
        "the merge went through state transfer and an Op::Merge"
    );
    for i in all {
        assert_eq!(g.get(i, "before").as_deref(), Some("0"), "member {i}");
        assert_eq!(g.get(i, "big-only").as_deref(), Some("b"), "member {i}");
        assert_eq!(g.get(i, "small-only").as_deref(), Some("s"), "member {i}");
        // Both sides wrote it: the larger stamp wins, the small side's (clock ran further).
        assert_eq!(
            g.get(i, "shared").as_deref(),
            Some("from-small-3"),
            "member {i}"
        );
    }
    // After the merge, one history again: a write from the big side wins everywhere.
    g.put(0, "shared", "after");
    g.run_for(Duration::from_millis(300));
    g.wait_converged(&all);
    for i in all {
        assert_eq!(g.get(i, "shared").as_deref(), Some("after"), "member {i}");
    }
}

#[test]
fn a_partition_heals_and_the_stores_converge_in_the_simulator() {
    for seed in 1..=10 {
        partition_and_merge(seed);
    }
}

/// A member crashes while the group writes: the survivors install a view without it and hold
/// equal stores with every write a survivor made.
#[test]
fn a_crash_leaves_the_survivors_with_equal_stores_in_the_simulator() {
    let mut g = KvSim::new(11, 3);
    g.wait_converged(&[0, 1, 2]);
    for k in 0..5 {
        g.put(k % 3, &format!("k{k}"), "v");
    }
    g.run_for(Duration::from_millis(5));
    g.sim.crash(g.nodes[2]);
    g.put(0, "after-crash", "a");
    g.put(1, "after-crash-2", "b");
    g.run_for(Duration::from_secs(1));
    g.wait_converged(&[0, 1]);
    for i in [0, 1] {
        assert_eq!(g.get(i, "after-crash").as_deref(), Some("a"));
        assert_eq!(g.get(i, "after-crash-2").as_deref(), Some("b"));
        for k in [0, 1, 3, 4] {
            assert_eq!(g.get(i, &format!("k{k}")).as_deref(), Some("v"), "k{k}");
        }
    }
}

// ------------------------------------------------------------------------------ loopback

/// How long a line may take to show up on loopback.
const WAIT: Duration = Duration::from_secs(15);

/// One kv member on loopback: its own runtime, the write end of its input, what it printed.
struct Member {
    rt: Option<tokio::runtime::Runtime>,
    input: tokio::io::DuplexStream,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
    id: MemberId,
    addr: SocketAddr,
}

impl Member {
    fn start(identity: Identity, trust: &[MemberId], peer: Option<SocketAddr>) -> Member {
        use tokio::io::AsyncBufReadExt;
        let mut b = cohort::group::GroupConfig::builder("kv-test")
            .identity(identity)
            .listen("127.0.0.1:0".parse().unwrap())
            .trust(trust.iter().copied())
            .heartbeat(Duration::from_millis(50))
            .suspect_timeout(Duration::from_millis(600))
            .flush_timeout(Duration::from_millis(300));
        if let Some(p) = peer {
            b = b.peer(p);
        }
        let mut config = b.build().unwrap();
        let replica = std::sync::Arc::new(std::sync::Mutex::new(Replica::new()));
        node::with_state_transfer(&mut config, &replica);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (group, events) = {
            let _in_rt = rt.enter();
            cohort::group::Group::start(config).unwrap()
        };
        let (id, addr) = (group.id(), group.local_addr());
        let (input, member_in) = tokio::io::duplex(1 << 16);
        let (member_out, output) = tokio::io::duplex(1 << 16);
        rt.spawn(async move {
            let input = tokio::io::BufReader::new(member_in);
            node::run(group, events, replica, input, member_out)
                .await
                .unwrap();
        });
        let (tx, lines) = std::sync::mpsc::channel();
        rt.spawn(async move {
            let mut out = tokio::io::BufReader::new(output).lines();
            while let Ok(Some(line)) = out.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Member {
            rt: Some(rt),
            input,
            lines,
            seen: Vec::new(),
            id,
            addr,
        }
    }

    fn type_line(&mut self, line: &str) {
        use tokio::io::AsyncWriteExt;
        let rt = self.rt.as_ref().unwrap();
        rt.block_on(self.input.write_all(format!("{line}\n").as_bytes()))
            .unwrap();
    }

    /// Waits for a line `want` accepts among those printed from index `from` on; returns its
    /// index.
    fn wait_from(&mut self, from: usize, what: &str, want: impl Fn(&str) -> bool) -> usize {
        if let Some(i) = self.seen.iter().skip(from).position(|l| want(l)) {
            return from + i;
        }
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line);
                    if want(self.seen.last().unwrap()) {
                        return self.seen.len() - 1;
                    }
                }
                Err(_) => panic!("no line {what} within {WAIT:?}; saw {:#?}", self.seen),
            }
        }
    }

    fn wait(&mut self, what: &str, want: impl Fn(&str) -> bool) -> usize {
        self.wait_from(0, what, want)
    }

    fn wait_line(&mut self, line: &str) -> usize {
        self.wait(line, |l| l == line)
    }

    fn wait_view(&mut self, n: usize) {
        self.wait(&format!("a view of {n}"), |l| {
            l.starts_with("* view ")
                && l.split(": ").nth(1).map(|m| m.split(' ').count()) == Some(n)
        });
    }

    /// The store's live pairs and its clock line, as `dump` prints them.
    fn dump(&mut self) -> Vec<String> {
        let from = self.seen.len();
        self.type_line("dump");
        let end = self.wait_from(from, "dump", |l| l.starts_with("dump "));
        let mut out = vec![self.seen[end].clone()];
        let mut i = end;
        while i > from && self.seen[i - 1].contains(" = ") {
            i -= 1;
            out.push(self.seen[i].clone());
        }
        out.reverse();
        out
    }

    /// Stops the member without a word to the group, as a killed process does.
    fn crash(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.crash();
    }
}

fn identities(n: usize) -> (Vec<Identity>, Vec<MemberId>) {
    let provider = CryptoProvider::default_provider();
    let ids: Vec<Identity> = (0..n)
        .map(|_| Identity::generate(&provider).unwrap())
        .collect();
    let trust = ids.iter().map(|i| MemberId(i.public())).collect();
    (ids, trust)
}

/// Two members write; a third joins and gets the store by state transfer before its first
/// delivery, then takes part in writes; all three end with the same store.
#[test]
fn a_joiner_gets_the_store_by_state_transfer_before_its_first_delivery() {
    let (ids, trust) = identities(3);
    let mut ids = ids.into_iter();
    let mut a = Member::start(ids.next().unwrap(), &trust, None);
    a.wait("joined", |l| l.starts_with("* joined as "));
    let mut b = Member::start(ids.next().unwrap(), &trust, Some(a.addr));
    a.wait_view(2);
    b.wait_view(2);
    a.type_line("put colour blue");
    a.type_line("put size 3");
    // b deletes size only once the put is applied there, so the delete is ordered after it.
    b.wait("a's put", |l| l.starts_with("applied put size by"));
    b.type_line("put shape round");
    b.type_line("del size");
    a.wait("b's delete", |l| l.starts_with("applied del size by"));
    b.wait_line("ok del size @ 4");

    let mut c = Member::start(ids.next().unwrap(), &trust, Some(a.addr));
    c.wait_view(3);
    let state = c.wait("state transfer", |l| l.starts_with("state "));
    // The snapshot holds the two live keys and the clock of the four writes (the delete
    // left a tombstone), and nothing was delivered to c before it.
    assert_eq!(c.seen[state], "state 2 keys clock 4");
    assert!(
        !c.seen[..state]
            .iter()
            .any(|l| l.starts_with("applied ") || l.starts_with("ok ")),
        "{:#?}",
        c.seen
    );
    c.type_line("get colour");
    c.wait_line("colour = blue");
    c.type_line("get size");
    c.wait_line("size not found");
    c.type_line("put colour green");
    let c_short = node::short(&c.id);
    for m in [&mut a, &mut b] {
        m.wait("c's write", |l| {
            l == format!("applied put colour by {c_short} @ 5")
        });
    }
    c.wait_line("ok put colour @ 5");
    let want = a.dump();
    assert_eq!(
        want,
        ["colour = green", "shape = round", "dump 2 keys clock 5"]
    );
    assert_eq!(b.dump(), want);
    assert_eq!(c.dump(), want);
}

/// Three members write; the leader crashes; the survivors install a view without it, agree
/// on what was delivered, and go on writing.
#[test]
fn the_store_survives_a_crash_of_the_leader() {
    let (ids, trust) = identities(3);
    let mut ids = ids.into_iter();
    let mut a = Member::start(ids.next().unwrap(), &trust, None);
    a.wait("joined", |l| l.starts_with("* joined as "));
    let mut b = Member::start(ids.next().unwrap(), &trust, Some(a.addr));
    let mut c = Member::start(ids.next().unwrap(), &trust, Some(a.addr));
    for m in [&mut a, &mut b, &mut c] {
        m.wait_view(3);
    }
    for k in 0..5 {
        a.type_line(&format!("put a{k} {k}"));
        b.type_line(&format!("put b{k} {k}"));
    }
    b.wait("b's last write", |l| l.starts_with("ok put b4 @"));
    a.wait("a's last write", |l| l.starts_with("ok put a4 @"));
    // a leads (it founded the group); it crashes with writes in flight.
    a.type_line("put in-flight x");
    a.crash();
    for m in [&mut b, &mut c] {
        m.wait_view(2);
        let short_a = node::short(&a.id);
        m.wait("a's removal", |l| {
            l.starts_with(&format!("* {short_a} removed"))
        });
    }
    b.type_line("put after crash");
    c.type_line("del b0");
    b.wait("b's write", |l| l.starts_with("ok put after @"));
    c.wait("c's delete", |l| l.starts_with("ok del b0 @"));
    b.wait("c's delete", |l| l.starts_with("applied del b0 by"));
    c.wait("b's write", |l| l.starts_with("applied put after by"));
    let dump = b.dump();
    assert_eq!(c.dump(), dump, "the survivors hold the same store");
    for k in 0..5 {
        assert!(dump.contains(&format!("a{k} = {k}")), "{dump:?}");
        if k > 0 {
            assert!(dump.contains(&format!("b{k} = {k}")), "{dump:?}");
        }
    }
    assert!(dump.contains(&"after = crash".to_string()), "{dump:?}");
    assert!(!dump.iter().any(|l| l.starts_with("b0 = ")), "{dump:?}");
}
