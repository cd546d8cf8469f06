//! Group scaling in the simulator (cohort-sim), identity-key mode against KDC mode:
//!
//! 1. **Merge latency after a heal**, against group size: one group forms, is cut in two
//!    halves until each half has its own view and key, then the cut heals; measured is the
//!    virtual time until every member shares one view and one key fingerprint.
//! 2. **Join/leave rate**, against group size: a group forms, then a pool of spare members
//!    keeps joining and leaving (several at once, so that view changes batch them); measured
//!    is the operations completed per second of virtual time, per second of wall-clock and
//!    of CPU time (every member and the KDC run on this one thread: a conservative bound),
//!    and per second of the leader's share of that time (an estimate for a leader on its own
//!    core). Identity-key mode runs the same workload as the baseline.
//!
//! ```sh
//! cargo bench -p cohort-group --bench group_scaling
//! GROUP_SCALING=merge GROUP_SCALING_MERGE_SIZES=4,8 GROUP_SCALING_SEEDS=1 \
//!     cargo bench -p cohort-group --bench group_scaling            # a quick run
//! ```
//!
//! Environment (all optional):
//!
//! * `GROUP_SCALING`: `merge`, `rate` or `all` (the default).
//! * `GROUP_SCALING_MODES`: `identity,kdc` (the default), or one of them.
//! * `GROUP_SCALING_MERGE_SIZES`: group sizes of the merge benchmark
//!   (`4,8,16,32,64,128,256`).
//! * `GROUP_SCALING_SEEDS`: seeds per merge size (10: seeds 1 to 10).
//! * `GROUP_SCALING_RATE_SIZES`: group sizes of the rate benchmark (`25,50,100,200`).
//! * `GROUP_SCALING_RATE_SPARES`: spare members joining and leaving at once (16).
//! * `GROUP_SCALING_RATE_SWEEP`: other numbers of spares, run at the largest rate size only
//!   (`4,64`; empty for none).
//! * `GROUP_SCALING_RATE_OPS`: operations measured per size, after a warm-up of one join
//!   and one leave per spare (480).
//! * `GROUP_SCALING_RATE_LATENCY_US`: one-way link latency of the rate benchmark, in
//!   microseconds (100).
//!
//! Both benchmarks keep the default `GroupConfig` timers (heartbeat 100 ms, suspicion 1 s,
//! flush 500 ms) and the default rekey policy (a fresh key with every membership change).
//! The merge benchmark uses 5 ms links, as `tests/exchange_sim.rs` does.
#![allow(clippy::expect_used)] // reason: a benchmark whose setup fails has nothing to report

use cohort_channel::identity::Identity;
use cohort_core::{Machine, Timestamp, Transmit};
use cohort_crypto::CryptoProvider;
use cohort_group::kdc_pair::KdcCredentials;
use cohort_group::{AuthMode, GroupConfig, GroupEvent, GroupMember, MemberId, View};
use cohort_kdc::{PrincipalKey, PrincipalName, Registry};
use cohort_sim::{FnRule, NodeId, Sim, SimConfig, Verdict};
use kit::{
    identity, median, ms, opt, principal_keys, principal_name, thread_cpu, wall_now, MemberOrKdc,
};
use rand_core::RngCore;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Identities, the KDC node, clocks and statistics, shared with the tests and the example.
#[path = "../tests/support/kit.rs"]
mod kit;

// ------------------------------------------------------------------------------ clocks

/// Wall-clock and CPU time from a start point.
struct Stopwatch {
    wall: Instant,
    cpu: Option<Duration>,
}

impl Stopwatch {
    fn start() -> Stopwatch {
        Stopwatch {
            wall: wall_now(),
            cpu: thread_cpu(),
        }
    }

    /// (wall, cpu) since the start.
    fn read(&self) -> (Duration, Option<Duration>) {
        let cpu = match (self.cpu, thread_cpu()) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        (self.wall.elapsed(), cpu)
    }
}

// ------------------------------------------------------------------------------ nodes

/// The two ways members authenticate.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// Ed25519 identity keys, hybrid-KEM pair channels (`GroupMember::new`).
    Identity,
    /// LSGC: long-term keys shared with a KDC, no public-key operation (`GroupMember::new` with KDC credentials).
    Kdc,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Identity => "identity",
            Mode::Kdc => "kdc",
        }
    }
}

/// A member or the KDC. A member's events are read here and not handed to the simulator
/// (whose log would keep every one of them): only what the benchmarks need is kept.
struct Peer {
    inner: MemberOrKdc,
    /// Events seen by every peer of the simulation together: the harness looks at the
    /// members again only when this moved.
    ticks: Rc<Cell<u64>>,
    /// The last view this member installed, and how many it installed.
    last_view: Option<View>,
    views: u64,
    /// Wall-clock time spent in this peer's calls, when kept (the leader's, in the rate
    /// benchmark).
    busy: Option<Duration>,
}

impl Peer {
    /// Adds the wall-clock time since `start` to the busy time, if it is kept.
    fn charge(&mut self, start: Option<Instant>) {
        if let (Some(t), Some(b)) = (start, self.busy.as_mut()) {
            *b += t.elapsed();
        }
    }
}

impl Machine for Peer {
    type Event = ();
    fn handle_datagram(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        let start = self.busy.is_some().then(wall_now);
        self.inner.handle_datagram(now, from, data);
        self.charge(start);
    }
    fn handle_timeout(&mut self, now: Timestamp) {
        let start = self.busy.is_some().then(wall_now);
        self.inner.handle_timeout(now);
        self.charge(start);
    }
    fn poll_transmit(&mut self, now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
        let start = self.busy.is_some().then(wall_now);
        let t = self.inner.poll_transmit(now, buf);
        self.charge(start);
        t
    }
    fn poll_timeout(&self) -> Option<Timestamp> {
        self.inner.poll_timeout()
    }
    fn poll_event(&mut self) -> Option<()> {
        let start = self.busy.is_some().then(wall_now);
        while let Some(e) = self.inner.poll_event() {
            self.ticks.set(self.ticks.get() + 1);
            if let GroupEvent::View(v) = e {
                self.last_view = Some(v);
                self.views += 1;
            }
        }
        self.charge(start);
        None
    }
}

// ------------------------------------------------------------------------------ a world

/// KDC mode: the principals registered with the KDC, handed out one by one.
struct Principals {
    names: Vec<PrincipalName>,
    keys: Vec<PrincipalKey>,
    /// Each member node's principal (an index into `names`).
    of: Vec<usize>,
    /// The next principal never used.
    next: usize,
}

/// A simulated group: `members` member nodes (not started) and, in KDC mode, a KDC node.
struct World {
    sim: Sim<Peer>,
    mode: Mode,
    kdc: Option<NodeId>,
    nodes: Vec<NodeId>,
    /// Each member node's current principal (a node restarted in KDC mode gets a new one).
    ids: Vec<MemberId>,
    ticks: Rc<Cell<u64>>,
    config: GroupConfig,
    identities: Vec<Identity>,
    principals: Principals,
    /// How often the harness looks at the members when no event came.
    poll: Duration,
    /// Wall-clock time one run may take.
    cap: Duration,
    started: Instant,
}

/// Joiners started together while a group forms (a KDC-mode leader keeps at most 32 KDC
/// requests outstanding).
const FORM_BATCH: usize = 32;

impl World {
    /// `members` members and, in KDC mode, `principals` registered principals (at least
    /// `members`; the rest are for restarted members).
    fn new(
        mode: Mode,
        seed: u64,
        members: usize,
        principals: usize,
        latency: Duration,
        cap: Duration,
    ) -> World {
        let mut sim: Sim<Peer> = Sim::new(SimConfig {
            mtu: 65_536,
            log_packets: false,
            latency,
            jitter: Duration::ZERO,
            max_steps: u64::MAX,
            ..SimConfig::with_seed(seed)
        });
        let ticks = Rc::new(Cell::new(0));
        let mut identities = Vec::new();
        let mut names = Vec::new();
        let mut keys = Vec::new();
        let mut kdc = None;
        let mut config;
        let ids: Vec<MemberId> = match mode {
            Mode::Identity => {
                identities = (0..members).map(|i| identity(seed, i)).collect();
                let ids: Vec<MemberId> = identities.iter().map(|i| MemberId(i.public())).collect();
                config = GroupConfig::new("scaling", ids.clone());
                ids
            }
            Mode::Kdc => {
                let count = principals.max(members);
                keys = principal_keys(seed, count);
                names = (0..count).map(principal_name).collect();
                let mut registry = Registry::new();
                for (name, key) in names.iter().zip(&keys) {
                    registry.insert(*name, key.clone());
                }
                let t = ticks.clone();
                kdc = Some(sim.add_node_with(|_, _| Peer {
                    inner: MemberOrKdc::kdc(registry),
                    ticks: t,
                    last_view: None,
                    views: 0,
                    busy: None,
                }));
                // Every registered principal is trusted, listed (LSGC: registration is the
                // authorization).
                let trust: Vec<MemberId> = names.iter().map(MemberId::from_principal).collect();
                config = GroupConfig::new("scaling", trust);
                config.auth = AuthMode::Kdc;
                names
                    .iter()
                    .take(members)
                    .map(MemberId::from_principal)
                    .collect()
            }
        };
        let mut w = World {
            sim,
            mode,
            kdc,
            nodes: Vec::new(),
            ids,
            ticks,
            config,
            identities,
            principals: Principals {
                of: (0..members).collect(),
                names,
                keys,
                next: members,
            },
            poll: Duration::from_millis(10),
            cap,
            started: wall_now(),
        };
        for i in 0..members {
            let mut seed_bytes = [0u8; 32];
            w.sim.rng().fill_bytes(&mut seed_bytes);
            let peer = w.make_peer(i, NodeId::from_index(w.sim.node_count()).addr(), seed_bytes);
            let node = w.sim.add_node_with(|_, _| peer);
            w.nodes.push(node);
        }
        w
    }

    /// A fresh member for member index `i` (identity mode: its identity; KDC mode: the
    /// principal `self.ids[i]`).
    fn make_peer(&self, i: usize, addr: SocketAddr, seed: [u8; 32]) -> Peer {
        let provider = CryptoProvider::default_provider();
        let member = match self.mode {
            Mode::Identity => GroupMember::new(
                provider,
                self.identities[i].clone(),
                addr,
                self.config.clone(),
                seed,
            ),
            Mode::Kdc => {
                let p = self.principals.of[i];
                let kdc = self.sim.addr(self.kdc.expect("a KDC"));
                let credentials = KdcCredentials {
                    name: self.principals.names[p],
                    key: self.principals.keys[p].clone(),
                    kdc,
                };
                GroupMember::new(provider, credentials, addr, self.config.clone(), seed)
            }
        }
        .expect("member");
        Peer {
            inner: MemberOrKdc::Member(Box::new(member)),
            ticks: self.ticks.clone(),
            last_view: None,
            views: 0,
            busy: None,
        }
    }

    /// Replaces member `i` with a fresh machine (KDC mode: under a principal never used
    /// before) and starts it with `contacts`.
    fn restart(&mut self, i: usize, contacts: &[SocketAddr]) -> Result<(), String> {
        if self.mode == Mode::Kdc {
            let p = self.principals.next;
            let name = self
                .principals
                .names
                .get(p)
                .ok_or("out of registered principals")?;
            self.ids[i] = MemberId::from_principal(name);
            self.principals.of[i] = p;
            self.principals.next += 1;
        }
        let mut seed = [0u8; 32];
        self.sim.rng().fill_bytes(&mut seed);
        let node = self.nodes[i];
        let peer = self.make_peer(i, self.sim.addr(node), seed);
        self.sim.restart(node, peer);
        self.start(i, contacts);
        Ok(())
    }

    fn peer(&self, i: usize) -> &Peer {
        self.sim.node(self.nodes[i])
    }

    fn member(&self, i: usize) -> &GroupMember {
        self.peer(i).inner.member()
    }

    fn with_member<R>(&mut self, i: usize, f: impl FnOnce(&mut GroupMember, Timestamp) -> R) -> R {
        self.sim
            .with_node(self.nodes[i], |p, now| f(p.inner.member_mut(), now))
    }

    fn start(&mut self, i: usize, contacts: &[SocketAddr]) {
        let contacts = contacts.to_vec();
        self.with_member(i, |m, now| m.start(now, &contacts));
    }

    fn kdc_requests(&self) -> u64 {
        self.kdc.map_or(0, |k| match &self.sim.node(k).inner {
            MemberOrKdc::Kdc(k) => k.kdc.counters().total(),
            MemberOrKdc::Member(_) => 0,
        })
    }

    /// Whether the members `set` share one view whose members are exactly `set`, one key,
    /// and none of them is changing views.
    fn converged(&self, set: &[usize]) -> bool {
        let Some(&first) = set.first() else {
            return true;
        };
        let m0 = self.member(first);
        let (Some(view), Some(fp)) = (m0.view(), m0.key_fingerprint()) else {
            return false;
        };
        if view.members.len() != set.len() || !set.iter().all(|i| view.contains(&self.ids[*i])) {
            return false;
        }
        set.iter().all(|i| {
            let m = self.member(*i);
            m.view().is_some_and(|v| v.id == view.id)
                && m.key_fingerprint() == Some(fp)
                && !m.status().changing_view
        })
    }

    /// Steps the simulation until `cond` holds (looked at after every event, and every
    /// `self.poll` of virtual time) or `limit` of virtual time passes; returns the virtual
    /// time it took.
    fn run_until(
        &mut self,
        limit: Duration,
        what: &str,
        mut cond: impl FnMut(&World) -> bool,
    ) -> Result<Duration, String> {
        let start = self.sim.now();
        let deadline = start.saturating_add(limit);
        let mut seen = u64::MAX;
        let mut next_poll = start;
        loop {
            let now = self.sim.now();
            let ticks = self.ticks.get();
            if ticks != seen || now >= next_poll {
                seen = ticks;
                next_poll = now.saturating_add(self.poll);
                if cond(self) {
                    return Ok(now.saturating_duration_since(start));
                }
                if self.started.elapsed() > self.cap {
                    return Err(format!("{what}: capped after {:?} of wall clock", self.cap));
                }
            }
            let next = self.sim.next_event_time();
            if next.is_none_or(|t| t > deadline) {
                return Err(format!("{what}: not within {limit:?} of virtual time"));
            }
            // Stop at the next poll so the condition is looked at on time.
            if next.is_some_and(|t| t > next_poll) {
                self.sim
                    .run_until(next_poll)
                    .map_err(|e| format!("{what}: {e}"))?;
            } else {
                self.sim.step();
            }
        }
    }

    /// Member 0 founds the group; members `1..n` join through it, [`FORM_BATCH`] at a time
    /// (each batch once the leader's view holds the previous one); then waits for one view
    /// of all with one key. Returns the virtual time taken.
    fn form(&mut self, n: usize, limit: Duration) -> Result<Duration, String> {
        let begin = self.sim.now();
        self.start(0, &[]);
        let contact = [self.sim.addr(self.nodes[0])];
        let mut started = 1;
        while started < n {
            let end = (started + FORM_BATCH).min(n);
            for i in started..end {
                self.start(i, &contact);
            }
            started = end;
            let want = started;
            self.run_until(limit, "forming", |w| {
                w.member(0).view().map_or(0, |v| v.members.len()) >= want
            })?;
        }
        let all: Vec<usize> = (0..n).collect();
        self.run_until(limit, "forming (one view of all)", |w| w.converged(&all))?;
        Ok(self.sim.now().saturating_duration_since(begin))
    }

    /// The member indexes of `0..n` in the order of their rank in member 0's view.
    fn by_rank(&self, n: usize) -> Vec<usize> {
        let Some(view) = self.member(0).view() else {
            return (0..n).collect();
        };
        let mut order: Vec<usize> = view
            .members
            .iter()
            .filter_map(|m| self.ids[..n].iter().position(|id| *id == m.id))
            .collect();
        for i in 0..n {
            if !order.contains(&i) {
                order.push(i);
            }
        }
        order
    }

    /// One line per member: its view (size and id) and key, for a failure report.
    fn views_summary(&self, set: &[usize]) -> String {
        let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for i in set {
            let m = self.member(*i);
            let key = m
                .key_fingerprint()
                .map_or("-".into(), |f| hex::encode(&f[..3]));
            let k = match m.view() {
                Some(v) => format!(
                    "view {} of {} key {key}{}",
                    v.id,
                    v.members.len(),
                    if m.status().changing_view {
                        " (changing)"
                    } else {
                        ""
                    }
                ),
                None => "no view".into(),
            };
            groups.entry(k).or_default().push(*i);
        }
        groups
            .iter()
            .map(|(k, v)| format!("{} members in {k}", v.len()))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

// ------------------------------------------------------------------------------ statistics

fn min_max(v: &[f64]) -> Option<(f64, f64)> {
    let min = v.iter().copied().reduce(f64::min)?;
    let max = v.iter().copied().reduce(f64::max)?;
    Some((min, max))
}

// ------------------------------------------------------------------------------ merge

/// One merge run, measured.
struct MergeSample {
    /// Virtual time from the heal until one view and one key (the benchmark's number).
    merge: Duration,
    /// Virtual time from the cut until each half had its own view and key.
    split: Duration,
    /// Virtual time to form the group.
    form: Duration,
    /// Wall-clock and CPU time of the heal phase, and of the whole run.
    heal_wall: Duration,
    heal_cpu: Option<Duration>,
    run_wall: Duration,
    run_cpu: Option<Duration>,
    /// Views member 0 installed between the heal and the merge.
    views_after_heal: u64,
}

fn merge_run(mode: Mode, n: usize, seed: u64, cap: Duration) -> Result<MergeSample, String> {
    let run = Stopwatch::start();
    let mut w = World::new(mode, seed, n, n, Duration::from_millis(5), cap);
    let form = w.form(n, Duration::from_secs(120))?;
    w.sim
        .run_for(Duration::from_millis(200))
        .map_err(|e| e.to_string())?;
    // Cut by rank, alternately (ranks 0, 2, 4.. and 1, 3, 5..), so that the lowest rank of
    // the half without the leader is 1 and it takes over after one suspicion timeout
    // (contiguous halves would wait rank x suspicion timeout: 64 s at 128 members). The KDC
    // reaches both halves (a cut of the members' network only).
    let order = w.by_rank(n);
    let a: Vec<usize> = order.iter().step_by(2).copied().collect();
    let b: Vec<usize> = order.iter().skip(1).step_by(2).copied().collect();
    let mut side = vec![0u8; w.sim.node_count()];
    for i in &a {
        side[w.nodes[*i].index()] = 1;
    }
    for i in &b {
        side[w.nodes[*i].index()] = 2;
    }
    let cut = w.sim.add_rule(FnRule::new("cut", move |p, _| {
        let (x, y) = (side[p.from.index()], side[p.to.index()]);
        if x != 0 && y != 0 && x != y {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    }));
    let t_cut = w.sim.now();
    let (a2, b2) = (a.clone(), b.clone());
    w.run_until(Duration::from_secs(60), "split", |w| {
        w.converged(&a2) && w.converged(&b2)
    })
    .map_err(|e| format!("{e}: {}", w.views_summary(&order)))?;
    let split = w.sim.now().saturating_duration_since(t_cut);
    let (fa, fb) = (
        w.member(a[0]).key_fingerprint(),
        w.member(b[0]).key_fingerprint(),
    );
    if fa == fb {
        return Err("the two halves hold one key after the split".into());
    }
    // Heal at a random point of the leaders' gossip cycle (about one suspicion timeout
    // long): without this, every size would heal at the same phase of it for a given seed.
    let offset = Duration::from_millis(w.sim.rng().next_u64() % 1100);
    w.sim.run_for(offset).map_err(|e| e.to_string())?;
    w.sim.remove_rule(cut);
    let views0 = w.peer(0).views;
    let heal = Stopwatch::start();
    let all: Vec<usize> = (0..n).collect();
    let merge = w
        .run_until(Duration::from_secs(60), "merge", |w| w.converged(&all))
        .map_err(|e| format!("{e}: {}", w.views_summary(&order)))?;
    let (heal_wall, heal_cpu) = heal.read();
    let views_after_heal = w.peer(0).views - views0;
    let (run_wall, run_cpu) = run.read();
    Ok(MergeSample {
        merge,
        split,
        form,
        heal_wall,
        heal_cpu,
        run_wall,
        run_cpu,
        views_after_heal,
    })
}

fn merge_bench(modes: &[Mode], sizes: &[usize], seeds: u64) {
    println!(
        "\n## Merge latency after a heal (5 ms links, heartbeat 100 ms, suspicion 1 s, \
         flush 500 ms; seeds 1..={seeds})\n"
    );
    println!(
        "| mode | members | merge virtual ms: median (min - max) | split virtual ms (median) | \
         views at member 0 after the heal (median) | heal: wall / cpu ms (median) | \
         whole run: wall / cpu s (median) | failed |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for &mode in modes {
        for &n in sizes {
            let mut samples = Vec::new();
            let mut failures = Vec::new();
            for seed in 1..=seeds {
                match merge_run(mode, n, seed, Duration::from_secs(120)) {
                    Ok(s) => samples.push(s),
                    Err(e) => failures.push(format!("seed {seed}: {e}")),
                }
            }
            let col = |f: &dyn Fn(&MergeSample) -> Option<f64>| -> Vec<f64> {
                samples.iter().filter_map(f).collect()
            };
            let merge = col(&|s| Some(ms(s.merge)));
            let range = min_max(&merge).map_or("-".into(), |(a, b)| format!("{a:.0} - {b:.0}"));
            println!(
                "| {} | {n} | {} ({range}) | {} | {} | {} / {} | {} / {} | {} |",
                mode.name(),
                opt(median(merge.clone()), 0),
                opt(median(col(&|s| Some(ms(s.split)))), 0),
                opt(median(col(&|s| Some(s.views_after_heal as f64))), 0),
                opt(median(col(&|s| Some(ms(s.heal_wall)))), 1),
                opt(median(col(&|s| s.heal_cpu.map(ms))), 1),
                opt(median(col(&|s| Some(s.run_wall.as_secs_f64()))), 2),
                opt(median(col(&|s| s.run_cpu.map(|d| d.as_secs_f64()))), 2),
                failures.len(),
            );
            if std::env::var_os("GROUP_SCALING_VERBOSE").is_some() {
                for s in &samples {
                    eprintln!(
                        "  {} n={n}: formed in {:.0} ms, split {:.0} ms, merged {:.0} ms \
                         ({} views at member 0)",
                        mode.name(),
                        ms(s.form),
                        ms(s.split),
                        ms(s.merge),
                        s.views_after_heal
                    );
                }
            }
            for f in failures {
                println!("|   | ^ {f} |");
            }
        }
    }
}

// ------------------------------------------------------------------------------ rate

/// A spare member's place in its join-leave cycle.
#[derive(Clone, Copy)]
enum Cycle {
    /// Started (with a fresh machine) at `since`, waiting to be in a view.
    Joining { since: Timestamp },
    /// Asked to leave at `since`, waiting for the leader's view without it.
    Leaving { since: Timestamp },
}

/// Where the measured window of a rate run began.
struct Window {
    at: Timestamp,
    watch: Stopwatch,
    /// Views the leader had installed, KDC requests served, and (leader, KDC) busy time.
    views: u64,
    kdc_requests: u64,
    busy: (Duration, Duration),
}

struct RateSample {
    /// Wall-clock time spent in the leader's calls, and in the KDC's, in the window.
    leader_busy: Duration,
    kdc_busy: Duration,
    ops: u64,
    virt: Duration,
    wall: Duration,
    cpu: Option<Duration>,
    view_changes: u64,
    kdc_requests: u64,
    join_ms: Option<f64>,
    leave_ms: Option<f64>,
}

/// A group of `n` members forms; then `spares` more members each join (through the
/// leader), leave as soon as they are in, and join again with a fresh machine (in KDC mode
/// under a principal never used before, so that every join costs the leader a KDC
/// request), over and over. A join counts when the joiner has installed a view with itself
/// in it; a leave when the leader has installed a view without the member. After a warm-up
/// of `2 * spares` operations, `ops` operations are measured.
fn rate_run(
    mode: Mode,
    n: usize,
    spares: usize,
    ops: u64,
    latency: Duration,
) -> Result<RateSample, String> {
    let warmup = 2 * spares as u64;
    // Each operation of a spare's cycles uses up at most one principal (per join).
    let principals = n + spares + (warmup + ops) as usize + 16;
    let cap = Duration::from_secs(300);
    let mut w = World::new(mode, 1, n + spares, principals, latency, cap);
    w.form(n, Duration::from_secs(120))?;
    w.sim
        .run_for(Duration::from_millis(100))
        .map_err(|e| e.to_string())?;
    let leader = [w.sim.addr(w.nodes[0])];
    w.sim.node_mut(w.nodes[0]).busy = Some(Duration::ZERO);
    if let Some(k) = w.kdc {
        w.sim.node_mut(k).busy = Some(Duration::ZERO);
    }
    let busy = |w: &World| {
        let kdc = w.kdc.and_then(|k| w.sim.node(k).busy).unwrap_or_default();
        (w.peer(0).busy.unwrap_or_default(), kdc)
    };
    let mut cycle = Vec::with_capacity(spares);
    for s in 0..spares {
        w.start(n + s, &leader);
        cycle.push(Cycle::Joining { since: w.sim.now() });
    }
    let mut seen_views: Vec<u64> = vec![0; spares];
    let mut leader_views_seen = w.peer(0).views;
    let mut done = 0u64;
    let mut join_lat = Vec::new();
    let mut leave_lat = Vec::new();
    let mut window: Option<Window> = None;
    let mut result = None;
    let mut seen_ticks = u64::MAX;
    let limit = Duration::from_secs(600);
    let deadline = w.sim.now().saturating_add(limit);
    while result.is_none() {
        let ticks = w.ticks.get();
        if ticks != seen_ticks {
            seen_ticks = ticks;
            let leader_views = w.peer(0).views;
            let leader_moved = leader_views != leader_views_seen;
            leader_views_seen = leader_views;
            for s in 0..spares {
                let i = n + s;
                match cycle[s] {
                    Cycle::Joining { since } => {
                        let views = w.peer(i).views;
                        if views == seen_views[s] {
                            continue;
                        }
                        seen_views[s] = views;
                        let id = w.ids[i];
                        if w.peer(i)
                            .last_view
                            .as_ref()
                            .is_some_and(|v| v.contains(&id))
                        {
                            done += 1;
                            let now = w.sim.now();
                            if window.is_some() {
                                join_lat.push(ms(now.saturating_duration_since(since)));
                            }
                            w.with_member(i, |m, now| m.leave(now));
                            cycle[s] = Cycle::Leaving { since: now };
                        }
                    }
                    Cycle::Leaving { since } => {
                        if !leader_moved {
                            continue;
                        }
                        let id = w.ids[i];
                        let gone = w
                            .peer(0)
                            .last_view
                            .as_ref()
                            .is_some_and(|v| !v.contains(&id));
                        if gone {
                            done += 1;
                            let now = w.sim.now();
                            if window.is_some() {
                                leave_lat.push(ms(now.saturating_duration_since(since)));
                            }
                            w.restart(i, &leader)?;
                            seen_views[s] = 0;
                            cycle[s] = Cycle::Joining { since: now };
                        }
                    }
                }
            }
            if window.is_none() && done >= warmup {
                window = Some(Window {
                    at: w.sim.now(),
                    watch: Stopwatch::start(),
                    views: w.peer(0).views,
                    kdc_requests: w.kdc_requests(),
                    busy: busy(&w),
                });
                done = 0;
            }
            if let Some(start) = &window {
                if done >= ops {
                    let (wall, cpu) = start.watch.read();
                    let busy = busy(&w);
                    result = Some(RateSample {
                        leader_busy: busy.0.saturating_sub(start.busy.0),
                        kdc_busy: busy.1.saturating_sub(start.busy.1),
                        ops: done,
                        virt: w.sim.now().saturating_duration_since(start.at),
                        wall,
                        cpu,
                        view_changes: w.peer(0).views - start.views,
                        kdc_requests: w.kdc_requests() - start.kdc_requests,
                        join_ms: median(join_lat.clone()),
                        leave_ms: median(leave_lat.clone()),
                    });
                    break;
                }
            }
            if w.started.elapsed() > cap {
                return Err(format!(
                    "capped after {cap:?} of wall clock ({done} operations)"
                ));
            }
        }
        if w.sim.next_event_time().is_none_or(|t| t > deadline) {
            return Err(format!("{done} operations after {limit:?} of virtual time"));
        }
        w.sim.step();
    }
    result.ok_or_else(|| "no result".to_string())
}

/// The rates of one run, in operations per second: virtual time, wall clock, the thread's
/// CPU time, and the leader's share of that CPU time.
struct Rates {
    virt: f64,
    wall: f64,
    cpu: f64,
    leader: f64,
}

fn rate_bench(modes: &[Mode], runs: &[(usize, usize)], ops: u64, latency: Duration) {
    println!(
        "\n## Join/leave rate ({} us links, default timers; `spares` members join and leave \
         at once; {ops} operations measured after a warm-up of one join and one leave per \
         spare)\n",
        latency.as_micros(),
    );
    println!(
        "| members | spares | mode | ops/s virtual | ops/s wall | ops/s cpu | leader share \
         of cpu | ops/s by leader cpu (est.) | ops per view change | KDC requests (us each) | \
         join / leave ms (median, virtual) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut ratios = Vec::new();
    for &(n, spares) in runs {
        let mut rates: Vec<(Mode, Rates)> = Vec::new();
        for &mode in modes {
            let s = match rate_run(mode, n, spares, ops, latency) {
                Ok(s) => s,
                Err(e) => {
                    println!("| {n} | {spares} | {} | failed: {e} |", mode.name());
                    continue;
                }
            };
            let per = |d: Duration| s.ops as f64 / d.as_secs_f64();
            // The leader's calls are timed by the wall clock; its share of the wall time,
            // applied to the thread's CPU time, estimates its CPU time.
            let share = s.leader_busy.as_secs_f64() / s.wall.as_secs_f64();
            let cpu = s.cpu.map_or(f64::NAN, per);
            let r = Rates {
                virt: per(s.virt),
                wall: per(s.wall),
                cpu,
                leader: cpu / share,
            };
            let kdc = if s.kdc_requests > 0 {
                format!(
                    "{} ({:.1})",
                    s.kdc_requests,
                    s.kdc_busy.as_secs_f64() * 1e6 / s.kdc_requests as f64
                )
            } else {
                "0".into()
            };
            println!(
                "| {n} | {spares} | {} | {:.0} | {:.0} | {:.0} | {:.0}% | {:.0} | {:.1} | {kdc} | \
                 {} / {} |",
                mode.name(),
                r.virt,
                r.wall,
                r.cpu,
                share * 100.0,
                r.leader,
                s.ops as f64 / s.view_changes.max(1) as f64,
                opt(s.join_ms, 2),
                opt(s.leave_ms, 2),
            );
            rates.push((mode, r));
        }
        let find = |m: Mode| rates.iter().find(|r| r.0 == m).map(|r| &r.1);
        if let (Some(k), Some(i)) = (find(Mode::Kdc), find(Mode::Identity)) {
            ratios.push((
                n,
                spares,
                [
                    k.virt / i.virt,
                    k.wall / i.wall,
                    k.cpu / i.cpu,
                    k.leader / i.leader,
                ],
            ));
        }
    }
    if !ratios.is_empty() {
        println!(
            "\n| members | spares | KDC / identity: virtual | wall | cpu | leader cpu (est.) |"
        );
        println!("|---|---|---|---|---|---|");
        for (n, spares, r) in ratios {
            println!(
                "| {n} | {spares} | {:.2} | {:.2} | {:.2} | {:.2} |",
                r[0], r[1], r[2], r[3]
            );
        }
    }
}

// ------------------------------------------------------------------------------ main

fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    match std::env::var(name) {
        Ok(v) => v.split(',').filter_map(|x| x.trim().parse().ok()).collect(),
        Err(_) => default.to_vec(),
    }
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn main() {
    let which = std::env::var("GROUP_SCALING").unwrap_or_else(|_| "all".into());
    let modes: Vec<Mode> = match std::env::var("GROUP_SCALING_MODES").as_deref() {
        Ok("identity") => vec![Mode::Identity],
        Ok("kdc") => vec![Mode::Kdc],
        _ => vec![Mode::Identity, Mode::Kdc],
    };
    println!(
        "# group_scaling: cohort-sim, every member (and the KDC) on this one thread; \
         virtual times from the simulator's clock, wall and cpu from this process"
    );
    if which == "all" || which == "merge" {
        let sizes = env_list("GROUP_SCALING_MERGE_SIZES", &[4, 8, 16, 32, 64, 128, 256]);
        let seeds = env_num("GROUP_SCALING_SEEDS", 10).max(1);
        merge_bench(&modes, &sizes, seeds);
    }
    if which == "all" || which == "rate" {
        let sizes = env_list("GROUP_SCALING_RATE_SIZES", &[25, 50, 100, 200]);
        let spares = env_num("GROUP_SCALING_RATE_SPARES", 16).max(1) as usize;
        let mut runs: Vec<(usize, usize)> = sizes.iter().map(|n| (*n, spares)).collect();
        // The sweep of concurrency, at the largest size.
        if let Some(&largest) = sizes.iter().max() {
            for s in env_list("GROUP_SCALING_RATE_SWEEP", &[4, 64]) {
                if s > 0 && s != spares {
                    runs.push((largest, s));
                }
            }
        }
        let ops = env_num("GROUP_SCALING_RATE_OPS", 480).max(1);
        let latency = Duration::from_micros(env_num("GROUP_SCALING_RATE_LATENCY_US", 100));
        rate_bench(&modes, &runs, ops, latency);
    }
}
