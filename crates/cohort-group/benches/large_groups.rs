//! Large groups in the simulator (issue 14, "What to show"): one group of 1,000 members
//! (10,000 once views past `MAX_VIEW_MEMBERS` exist), 5 ms links, the default timers
//! (heartbeat 100 ms, suspicion 1 s, flush 500 ms) and the default rekey policy (a fresh key
//! with every membership change).
//!
//! 1. **Rekey after one leave**, for each rekey method of [`methods`]: the member at the
//!    middle rank leaves (three times, 1 s apart; the medians); measured are the virtual
//!    time until every survivor installed the view without it (and holds one new key,
//!    checked by fingerprint), the bytes the leader sent and the thread CPU time spent in
//!    the leader's calls, both raw and less what the leader spends in the same time in
//!    steady state (heartbeats), then also less the cost of timing each call (two reads of
//!    the thread's CPU clock, a system call, measured at start: [`clock_overhead`]), and
//!    the wraps when the member reports them.
//! 2. **One view change**: a member joins and another leaves at the same instant; measured
//!    are the bytes everyone sent until every member shares the view with the joiner and
//!    without the leaver, raw and less steady state; then, for each row, what the members
//!    received in that window by message kind (`GroupMember::traffic`), beside as long a
//!    window of steady state.
//! 3. **Forming a group from cold**: member 0 founds the group and every other member starts
//!    at once with member 0 as its only contact (`cold`, the default), or in batches of 32,
//!    each once the leader admitted the previous one (`batched`, as `group_scaling` does);
//!    measured are the virtual time to one view of all with one key, the wall-clock time,
//!    and the process's resident memory per member.
//! 4. **Steady state**: datagrams a second in and out at the leader and at the member at the
//!    middle rank, over a window after the group formed.
//! 5. **The simulator alone** (`LARGE_GROUPS=sim`): synthetic nodes that only send
//!    heartbeat-like datagrams, to measure the simulator's cost per step at 1,000 and 10,000
//!    nodes and the size of its log.
//!
//! ```sh
//! cargo bench -p cohort-group --bench large_groups                     # 1,000 members
//! LARGE_GROUPS_SIZES=100 LARGE_GROUPS_FORM_SIZES=100,200 \
//!     cargo bench -p cohort-group --bench large_groups                 # a quick run
//! ```
//!
//! Environment (all optional):
//!
//! * `LARGE_GROUPS`: which parts, comma-separated, of `rekey`, `change`, `form`, `steady`,
//!   `fail`, `sim` (default the first four). `fail`: a crashed member's removal and a
//!   takeover after the leader and ranks 1..3 crash, in virtual time.
//! * `LARGE_GROUPS_SIM_SIZES`, `LARGE_GROUPS_SIM_SECS`: nodes and virtual seconds of the
//!   simulator's own benchmark, `sim` (`1000,10000`; 10).
//! * `LARGE_GROUPS_SIZES`: group sizes of parts 1, 2 and 4 (`1000`).
//! * `LARGE_GROUPS_FORM_SIZES`: group sizes of part 3 (`1000,2500,5000,10000`). Sizes above
//!   `cohort_group::MAX_VIEW_MEMBERS` are reported as skipped.
//! * `LARGE_GROUPS_FORM`: `cold` (the default) or `batched`: how parts 1, 2 and 4 form their
//!   group too.
//! * `LARGE_GROUPS_MODES`: `identity` (the default), `kdc`, or `identity,kdc`. KDC mode
//!   runs the one-message rekey only (the only method it allows).
//! * `LARGE_GROUPS_STEADY_SECS`: the steady-state window, in virtual seconds (5).
//! * `LARGE_GROUPS_LEAVES`: leaves measured one after the other in part 1 (3): each row
//!   shows their medians.
//! * `LARGE_GROUPS_METHODS`: part 1's methods, comma-separated, each matching the start of
//!   the names [`methods`] gives (`one-message,tree,lkh`; default all).
//! * `LARGE_GROUPS_CHANGE_METHODS`: part 2's methods, matched the same way
//!   (`one-message`; e.g. `one-message,lkh`).
//! * `LARGE_GROUPS_PERF=CTL,ACK`: the fifos of `perf record --control=fifo:CTL,ACK -D -1`;
//!   perf then samples only the leader's calls in part 1's leave windows (a profile of the
//!   leader's rekey without the forming around it).
//! * `LARGE_GROUPS_TRACE_LEADER`: print every datagram the leader sends in part 1's leave
//!   windows and part 2's view change (time, size, destination, first bytes), to stderr.
//! * `LARGE_GROUPS_SEED`: the simulator's seed (1).
//! * `LARGE_GROUPS_MTU`: the simulator's MTU in bytes (65,536, the largest UDP datagram);
//!   a smaller one shows at fewer members a message that would outgrow it at more.
//! * `LARGE_GROUPS_CAP_SECS`: wall-clock seconds one run may take before it is reported as
//!   capped (1800).
//!
//! Every member runs on this one thread; the leader's time is this thread's CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`) spent in its `handle_*` and `poll_*` calls. The simulator keeps no packet log and no timeout log
//! (`log_packets`, `log_timeouts`), and the nodes here report no events to it, so its log
//! stays empty however long a run is.
#![allow(clippy::expect_used)] // reason: a benchmark whose setup fails has nothing to report

use cohort_core::{Machine, Timestamp, Transmit};
use cohort_crypto::CryptoProvider;
use cohort_group::kdc_pair::KdcCredentials;
use cohort_group::traffic::{Count as Traffic, Traffic as Received};
use cohort_group::{
    AuthMode, GroupConfig, GroupEvent, GroupMember, MemberId, RekeyMethod, ViewId, MAX_VIEW_MEMBERS,
};
use cohort_kdc::{PrincipalKey, PrincipalName, Registry};
use cohort_sim::{NodeId, Sim, SimConfig};
use kit::{
    identity, median, ms, opt, principal_keys, principal_name, thread_cpu, wall_now, MemberOrKdc,
};
use rand_core::RngCore;
use std::cell::Cell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Identities, the KDC node, clocks and statistics, shared with the tests and the example.
#[path = "../tests/support/kit.rs"]
mod kit;

/// The rekey methods part 1 compares, with the names its table prints. A method added to
/// `RekeyMethod` is one more line here.
fn methods() -> Vec<(&'static str, RekeyMethod)> {
    vec![
        ("one-message", RekeyMethod::OneMessage),
        ("tree (degree 4)", RekeyMethod::Tree { degree: 4 }),
        ("lkh (degree 4)", RekeyMethod::Lkh { degree: 4 }),
    ]
}

/// The wraps the last rekey the leader coordinated made, if the member reports them
/// (it does not yet: the column prints `-` until it does).
fn leader_wraps(leader: &GroupMember) -> Option<u64> {
    leader.lkh_last_rekey().map(|s| s.wraps as u64)
}

/// Joiners started together in `batched` forming.
const FORM_BATCH: usize = 32;

/// Virtual time the harness runs after the last survivor installed a new view, so that
/// acknowledgements and the leader's last sends are counted (one heartbeat interval).
const TAIL: Duration = Duration::from_millis(100);

// ------------------------------------------------------------------------------ nodes

/// The two ways members authenticate.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// Ed25519 identity keys, hybrid-KEM pair channels.
    Identity,
    /// LSGC: long-term keys shared with a KDC.
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

/// A member or the KDC, with what the benchmarks read of it. Events are read here and not
/// handed to the simulator (whose log would keep each one, a full `View` included); only a
/// view's id, size and time are kept.
struct Peer {
    inner: MemberOrKdc,
    /// Events seen by every peer together: the harness looks at the members again only when
    /// this moved.
    ticks: Rc<Cell<u64>>,
    /// The time of the input being handled (the events it causes happen then).
    now: Timestamp,
    /// The last view installed: its id and size, and when.
    view: Option<(ViewId, usize)>,
    view_at: Timestamp,
    /// Views installed.
    views: u64,
    sent: Traffic,
    received: Traffic,
    /// Thread CPU time spent in this peer's calls, when kept (the leader's):
    /// `CLOCK_THREAD_CPUTIME_ID` read around each call, so time the thread spent descheduled
    /// on a loaded machine does not count.
    busy: Cell<Option<Duration>>,
    /// The calls `busy` timed (each one's two clock reads cost about [`clock_overhead`]).
    calls: Cell<u64>,
    /// `perf record --control` fifos: when set, perf samples only inside this peer's calls
    /// (the harness sets it on the leader for the leave windows; `LARGE_GROUPS_PERF`).
    perf: Option<Rc<PerfControl>>,
    /// Print every datagram this peer sends (`LARGE_GROUPS_TRACE_LEADER`: the leader's, in
    /// part 1's leave windows): virtual time, size, destination.
    trace: bool,
}

/// `perf record --control=fifo:CTL,ACK -D -1`'s fifos: `enable` and `disable` are written
/// to CTL and perf's `ack` read back, so that sampling covers exactly the calls between.
struct PerfControl {
    ctl: std::cell::RefCell<std::fs::File>,
    ack: std::cell::RefCell<std::fs::File>,
}

impl PerfControl {
    /// From `LARGE_GROUPS_PERF=CTL,ACK` (the fifos perf was started with).
    fn from_env() -> Option<Rc<PerfControl>> {
        let v = std::env::var("LARGE_GROUPS_PERF").ok()?;
        let (ctl, ack) = v.split_once(',')?;
        let ctl = std::fs::OpenOptions::new().write(true).open(ctl).ok()?;
        let ack = std::fs::File::open(ack).ok()?;
        Some(Rc::new(PerfControl {
            ctl: ctl.into(),
            ack: ack.into(),
        }))
    }

    fn send(&self, cmd: &str) {
        use std::io::{Read, Write};
        let _ = self.ctl.borrow_mut().write_all(cmd.as_bytes());
        let mut buf = [0u8; 5];
        let _ = self.ack.borrow_mut().read(&mut buf);
    }
}

impl Peer {
    fn new(inner: MemberOrKdc, ticks: Rc<Cell<u64>>) -> Peer {
        Peer {
            inner,
            ticks,
            now: Timestamp::ZERO,
            view: None,
            view_at: Timestamp::ZERO,
            views: 0,
            sent: Traffic::default(),
            received: Traffic::default(),
            busy: Cell::new(None),
            calls: Cell::new(0),
            perf: None,
            trace: false,
        }
    }

    /// The thread's CPU clock when this peer's time is kept.
    fn start_clock(&self) -> Option<Duration> {
        if let Some(p) = &self.perf {
            p.send("enable\n");
        }
        self.busy.get().and_then(|_| thread_cpu())
    }

    /// Adds the thread CPU time since `start` to this peer's.
    fn charge(&self, start: Option<Duration>) {
        if let (Some(t), Some(now), Some(b)) = (start, thread_cpu(), self.busy.get()) {
            self.busy.set(Some(b + now.saturating_sub(t)));
            self.calls.set(self.calls.get() + 1);
        }
        if let Some(p) = &self.perf {
            p.send("disable\n");
        }
    }
}

impl Machine for Peer {
    type Event = ();
    fn handle_datagram(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        let start = self.start_clock();
        self.now = now;
        self.received.add(data.len());
        self.inner.handle_datagram(now, from, data);
        self.charge(start);
    }
    fn handle_timeout(&mut self, now: Timestamp) {
        let start = self.start_clock();
        self.now = now;
        self.inner.handle_timeout(now);
        self.charge(start);
    }
    fn poll_transmit(&mut self, now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
        let start = self.start_clock();
        let t = self.inner.poll_transmit(now, buf);
        if let Some(t) = &t {
            self.sent.add(t.size);
            if self.trace {
                eprintln!(
                    "  leader sends at {:?}: {} bytes to {} (kind {:#04x}, {:02x?})",
                    now,
                    t.size,
                    t.destination,
                    buf.first().copied().unwrap_or(0),
                    &buf[..buf.len().min(12)]
                );
            }
        }
        self.charge(start);
        t
    }
    fn poll_timeout(&self) -> Option<Timestamp> {
        let start = self.start_clock();
        let t = self.inner.poll_timeout();
        self.charge(start);
        t
    }
    fn poll_event(&mut self) -> Option<()> {
        let start = self.start_clock();
        while let Some(e) = self.inner.poll_event() {
            self.ticks.set(self.ticks.get() + 1);
            if let GroupEvent::View(v) = e {
                self.view = Some((v.id, v.members.len()));
                self.view_at = self.now;
                self.views += 1;
            }
        }
        self.charge(start);
        None
    }
}

// ------------------------------------------------------------------------------ a world

/// The simulator's MTU: `LARGE_GROUPS_MTU`, or 65,536.
fn mtu() -> usize {
    std::env::var("LARGE_GROUPS_MTU")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(65_536)
}

/// A simulated group: member nodes (not started) and, in KDC mode, a KDC node.
struct World {
    sim: Sim<Peer>,
    kdc: Option<NodeId>,
    nodes: Vec<NodeId>,
    ids: Vec<MemberId>,
    ticks: Rc<Cell<u64>>,
    /// How often the harness looks at the members when no event came.
    poll: Duration,
    cap: Duration,
    started: Instant,
}

impl World {
    /// `members` member nodes using `method`, on 5 ms links.
    fn new(mode: Mode, seed: u64, members: usize, method: RekeyMethod, cap: Duration) -> World {
        let mut sim: Sim<Peer> = Sim::new(SimConfig {
            mtu: mtu(),
            log_packets: false,
            log_timeouts: false,
            log_partitions: false,
            latency: Duration::from_millis(5),
            jitter: Duration::ZERO,
            max_steps: u64::MAX,
            ..SimConfig::with_seed(seed)
        });
        let ticks = Rc::new(Cell::new(0));
        let provider = CryptoProvider::default_provider();
        let mut nodes = Vec::with_capacity(members);
        let ids: Vec<MemberId>;
        let mut kdc = None;
        match mode {
            Mode::Identity => {
                let identities: Vec<_> = (0..members).map(|i| identity(seed, i)).collect();
                ids = identities.iter().map(|i| MemberId(i.public())).collect();
                let mut config = GroupConfig::new("large", ids.clone());
                config.rekey_method = method;
                for ident in identities {
                    let mut s = [0u8; 32];
                    sim.rng().fill_bytes(&mut s);
                    let (config, provider, t) = (config.clone(), provider, ticks.clone());
                    nodes.push(sim.add_node_with(|_, addr| {
                        let m = GroupMember::new(provider, ident, addr, config, s).expect("member");
                        Peer::new(MemberOrKdc::Member(Box::new(m)), t)
                    }));
                }
            }
            Mode::Kdc => {
                let keys: Vec<PrincipalKey> = principal_keys(seed, members);
                let names: Vec<PrincipalName> = (0..members).map(principal_name).collect();
                let mut registry = Registry::new();
                for (name, key) in names.iter().zip(&keys) {
                    registry.insert(*name, key.clone());
                }
                let t = ticks.clone();
                let k = sim.add_node_with(|_, _| Peer::new(MemberOrKdc::kdc(registry), t));
                kdc = Some(k);
                ids = names.iter().map(MemberId::from_principal).collect();
                // LSGC: registration is the authorization.
                let mut config = GroupConfig::new("large", Vec::new());
                config.auth = AuthMode::Kdc;
                config.trust_any_registered = true;
                config.rekey_method = method;
                let kdc_addr = sim.addr(k);
                for (name, key) in names.iter().zip(keys) {
                    let mut s = [0u8; 32];
                    sim.rng().fill_bytes(&mut s);
                    let (config, provider, t) = (config.clone(), provider, ticks.clone());
                    let credentials = KdcCredentials {
                        name: *name,
                        key,
                        kdc: kdc_addr,
                    };
                    nodes.push(sim.add_node_with(|_, addr| {
                        let m = GroupMember::new(provider, credentials, addr, config, s)
                            .expect("member");
                        Peer::new(MemberOrKdc::Member(Box::new(m)), t)
                    }));
                }
            }
        }
        World {
            sim,
            kdc,
            nodes,
            ids,
            ticks,
            poll: Duration::from_millis(10),
            cap,
            started: wall_now(),
        }
    }

    fn peer(&self, i: usize) -> &Peer {
        self.sim.node(self.nodes[i])
    }

    fn peer_mut(&mut self, i: usize) -> &mut Peer {
        self.sim.node_mut(self.nodes[i])
    }

    fn member(&self, i: usize) -> &GroupMember {
        self.peer(i).inner.member()
    }

    fn with_member<R>(&mut self, i: usize, f: impl FnOnce(&mut GroupMember, Timestamp) -> R) -> R {
        self.sim.with_node(self.nodes[i], |p, now| {
            p.now = now;
            f(p.inner.member_mut(), now)
        })
    }

    fn start(&mut self, i: usize, contacts: &[SocketAddr]) {
        let contacts = contacts.to_vec();
        self.with_member(i, |m, now| m.start(now, &contacts));
    }

    /// The leader's view: its id and members.
    fn leader_view(&self) -> Option<(ViewId, usize)> {
        self.member(0).view().map(|v| (v.id, v.members.len()))
    }

    /// Whether every member of `set` installed the view `id`, with `len` members, and is not
    /// changing views (cheap: the peers' notes, not the members' views).
    fn all_in(&self, set: &[usize], id: ViewId, len: usize) -> bool {
        set.iter().all(|i| self.peer(*i).view == Some((id, len)))
            && set.iter().all(|i| !self.member(*i).status().changing_view)
    }

    /// Whether the members of `set` hold one key, other than `not`; the key's fingerprint.
    fn one_key(&self, set: &[usize], not: Option<[u8; 8]>) -> Result<[u8; 8], String> {
        let fp = self.member(set[0]).key_fingerprint().ok_or("no key")?;
        if Some(fp) == not {
            return Err("the old key is still in use".into());
        }
        let differ = set
            .iter()
            .filter(|i| self.member(**i).key_fingerprint() != Some(fp))
            .count();
        if differ > 0 {
            return Err(format!("{differ} members hold another key"));
        }
        Ok(fp)
    }

    /// Steps until `cond` holds (looked at when an event came and every `self.poll` of
    /// virtual time) or `limit` of virtual time passes; returns the virtual time it took.
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
            if next.is_some_and(|t| t > next_poll) {
                self.sim
                    .run_until(next_poll)
                    .map_err(|e| format!("{what}: {e}"))?;
            } else {
                self.sim.step();
            }
        }
    }

    /// Runs `d` of virtual time.
    fn run_for(&mut self, d: Duration) -> Result<(), String> {
        self.sim.run_for(d).map_err(|e| e.to_string())
    }

    /// Member 0 founds the group and members `1..n` join through it (`cold`: all at once;
    /// `batched`: [`FORM_BATCH`] at a time); then waits for one view of all `n` with one key.
    /// Returns the virtual time taken.
    fn form(&mut self, n: usize, batched: bool, limit: Duration) -> Result<Duration, String> {
        let begin = self.sim.now();
        self.start(0, &[]);
        let contact = [self.sim.addr(self.nodes[0])];
        if batched {
            let mut started = 1;
            while started < n {
                let end = (started + FORM_BATCH).min(n);
                for i in started..end {
                    self.start(i, &contact);
                }
                started = end;
                let want = started;
                self.run_until(limit, "forming", |w| {
                    w.leader_view().is_some_and(|(_, len)| len >= want)
                })?;
            }
        } else {
            for i in 1..n {
                self.start(i, &contact);
            }
        }
        let all: Vec<usize> = (0..n).collect();
        // LARGE_GROUPS_VERBOSE: the leader's view size each time it changes, with the
        // virtual and wall-clock time (where forming spends its time).
        let trace = std::env::var_os("LARGE_GROUPS_VERBOSE").is_some();
        let last = Cell::new(0usize);
        let wall = wall_now();
        self.run_until(limit, "forming (one view of all)", |w| {
            let view = w.leader_view();
            if let Some((_, len)) = view.filter(|(_, len)| trace && *len != last.get()) {
                last.set(len);
                let id = view.map(|(id, _)| id);
                let (mut here, mut other, mut none) = (0usize, 0usize, 0usize);
                let mut dropped: Vec<(&str, u64)> = w.member(0).counters().iter().collect();
                dropped.iter_mut().for_each(|(_, c)| *c = 0);
                for i in 0..n {
                    match w.peer(i).view {
                        Some((v, _)) if Some(v) == id => here += 1,
                        Some(_) => other += 1,
                        None => none += 1,
                    }
                    for (sum, (_, c)) in dropped.iter_mut().zip(w.member(i).counters().iter()) {
                        sum.1 += c;
                    }
                }
                let drops: Vec<String> = dropped
                    .into_iter()
                    .filter(|(_, c)| *c > 0)
                    .map(|(name, c)| format!("{name} {c}"))
                    .collect();
                eprintln!(
                    "  {:>8.3} s virtual, {:>7.1} s wall: leader's view {len}; members already in it {here}, in an earlier or another view {other}, in none {none}; drops of all members: {}",
                    w.sim.now().saturating_duration_since(begin).as_secs_f64(),
                    wall.elapsed().as_secs_f64(),
                    drops.join(", ")
                );
            }
            view.is_some_and(|(id, len)| len == n && w.all_in(&all, id, n))
        })
        .map_err(|e| format!("{e}: {}", self.summary(n)))?;
        self.one_key(&all, None)?;
        Ok(self.sim.now().saturating_duration_since(begin))
    }

    /// The member indexes of the leader's view, by rank.
    fn by_rank(&self) -> Vec<usize> {
        let Some(view) = self.member(0).view() else {
            return Vec::new();
        };
        let index: HashMap<MemberId, usize> = self
            .ids
            .iter()
            .enumerate()
            .map(|(i, id)| (*id, i))
            .collect();
        view.members
            .iter()
            .filter_map(|m| index.get(&m.id).copied())
            .collect()
    }

    /// For a failure report: the leader's view size, and how many members are in it.
    fn summary(&self, n: usize) -> String {
        let leader = self.peer(0).view;
        let same = (0..n).filter(|i| self.peer(*i).view == leader).count();
        format!(
            "leader's view has {} members; {same} of {n} members share it",
            leader.map_or(0, |v| v.1)
        )
    }

    /// What all members received, by kind (`GroupMember::traffic`).
    fn received(&self) -> Received {
        let mut r = Received::default();
        for i in 0..self.nodes.len() {
            r.add(self.member(i).traffic());
        }
        r
    }

    /// Everything all member nodes sent.
    fn total_sent(&self) -> Traffic {
        let mut t = Traffic::default();
        for i in 0..self.nodes.len() {
            let p = self.peer(i);
            t.datagrams += p.sent.datagrams;
            t.bytes += p.sent.bytes;
        }
        if let Some(k) = self.kdc {
            let p = self.sim.node(k);
            t.datagrams += p.sent.datagrams;
            t.bytes += p.sent.bytes;
        }
        t
    }
}

// ------------------------------------------------------------------------------ measuring

/// This process's resident memory, in bytes (Linux: `VmRSS` of `/proc/self/status`).
fn rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

fn kib(bytes: f64) -> String {
    format!("{:.1}", bytes / 1024.0)
}

/// What the leader (and everyone) does per second of virtual time in steady state.
#[derive(Clone)]
struct Baseline {
    /// Leader: bytes sent and busy seconds per virtual second.
    leader_bytes: f64,
    leader_busy: f64,
    /// Leader: calls timed per virtual second.
    leader_calls: f64,
    /// Everyone: bytes sent per virtual second.
    all_bytes: f64,
    /// Everyone: what members received in the window, by kind, and the window's seconds.
    received: (Received, f64),
}

/// What reading the thread's CPU clock twice costs, as [`Peer::charge`] counts it (the time
/// between the two reads of an empty call): the least of 20 rounds' means of 2,000 pairs,
/// measured once.
fn clock_overhead() -> Duration {
    static OVERHEAD: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *OVERHEAD.get_or_init(|| {
        (0..20)
            .filter_map(|_| {
                let mut sum = Duration::ZERO;
                for _ in 0..2_000 {
                    let a = thread_cpu()?;
                    let b = thread_cpu()?;
                    sum += b.saturating_sub(a);
                }
                Some(sum / 2_000)
            })
            .min()
            .unwrap_or_default()
    })
}

/// Measures the steady state over `window` (the leader's busy time must be kept).
fn baseline(w: &mut World, window: Duration) -> Result<Baseline, String> {
    let (b0, c0, s0, a0, r0) = (
        w.peer(0).busy.get().unwrap_or_default(),
        w.peer(0).calls.get(),
        w.peer(0).sent,
        w.total_sent(),
        w.received(),
    );
    w.run_for(window)?;
    let secs = window.as_secs_f64();
    Ok(Baseline {
        leader_bytes: w.peer(0).sent.since(s0).bytes as f64 / secs,
        leader_busy: (w.peer(0).busy.get().unwrap_or_default() - b0).as_secs_f64() / secs,
        leader_calls: (w.peer(0).calls.get() - c0) as f64 / secs,
        all_bytes: w.total_sent().since(a0).bytes as f64 / secs,
        received: (w.received().since(&r0), secs),
    })
}

// ------------------------------------------------------------------------------ 1. rekey

struct RekeySample {
    /// From the `leave` call until the last survivor installed the view without the leaver.
    virt: Duration,
    /// The window measured: `virt` and [`TAIL`].
    window: Duration,
    leader_sent: Traffic,
    leader_busy: Duration,
    /// The leader's calls timed in the window.
    leader_calls: u64,
    wraps: Option<u64>,
    base: Baseline,
    wall: Duration,
    /// Views the leader installed in the window.
    views: u64,
}

/// Forms a group of `n` members using `method`, measures its steady state, then lets the
/// member at the middle rank leave, `opts.leaves` times in a row (1 s apart), measuring each.
fn rekey_run(
    mode: Mode,
    n: usize,
    method: RekeyMethod,
    opts: &Opts,
) -> Result<Vec<RekeySample>, String> {
    let mut w = World::new(mode, opts.seed, n, method, opts.cap);
    w.form(n, opts.batched, opts.form_limit(n))?;
    w.run_for(Duration::from_secs(1))?;
    w.peer(0).busy.set(Some(Duration::ZERO));
    w.sim.flush();
    let base = baseline(&mut w, Duration::from_secs(2))?;
    let mut samples = Vec::new();
    for _ in 0..opts.leaves {
        samples.push(leave_once(&mut w, base.clone())?);
        w.run_for(Duration::from_secs(1))?;
    }
    Ok(samples)
}

/// The member at the middle rank leaves; measured until every survivor installed the view
/// without it and holds one new key.
fn leave_once(w: &mut World, base: Baseline) -> Result<RekeySample, String> {
    let order = w.by_rank();
    let leaver = order[order.len() / 2];
    let survivors: Vec<usize> = order.iter().copied().filter(|i| *i != leaver).collect();
    let old_key = w.member(0).key_fingerprint();
    let (busy0, calls0, sent0, views0) = (
        w.peer(0).busy.get().unwrap_or_default(),
        w.peer(0).calls.get(),
        w.peer(0).sent,
        w.peer(0).views,
    );
    let t0 = w.sim.now();
    let wall = wall_now();
    w.peer_mut(0).perf = PerfControl::from_env();
    w.peer_mut(0).trace = std::env::var_os("LARGE_GROUPS_TRACE_LEADER").is_some();
    w.with_member(leaver, |m, now| m.leave(now));
    let gone = w.ids[leaver];
    w.run_until(Duration::from_secs(30), "rekey after a leave", |w| {
        let Some(v) = w.member(0).view() else {
            return false;
        };
        !v.contains(&gone) && w.all_in(&survivors, v.id, v.members.len())
    })?;
    let wall = wall.elapsed();
    let done = survivors
        .iter()
        .map(|i| w.peer(*i).view_at)
        .max()
        .unwrap_or(t0);
    let virt = done.saturating_duration_since(t0);
    w.one_key(&survivors, old_key)?;
    let end = done.saturating_add(TAIL);
    w.sim.run_until(end).map_err(|e| e.to_string())?;
    w.peer_mut(0).perf = None;
    w.peer_mut(0).trace = false;
    Ok(RekeySample {
        virt,
        window: end.saturating_duration_since(t0),
        leader_sent: w.peer(0).sent.since(sent0),
        leader_busy: w.peer(0).busy.get().unwrap_or_default() - busy0,
        leader_calls: w.peer(0).calls.get() - calls0,
        wraps: leader_wraps(w.member(0)),
        base,
        wall,
        views: w.peer(0).views - views0,
    })
}

fn rekey_bench(opts: &Opts) {
    println!(
        "\n## 1. Rekey after one leave (5 ms links, default timers; the member at the middle \
         rank leaves, {} times 1 s apart; medians)\n",
        opts.leaves
    );
    println!(
        "Leader bytes and CPU are counted from the `leave` call until {} ms after the last \
         survivor installed the new view; \"less steady state\" subtracts what the leader \
         sends and spends in as long a window of steady state (heartbeats), measured over \
         2 s just before. \"Less clock reads\" also subtracts the cost of reading the \
         thread's CPU clock around each of the leader's calls ({:.0} ns a call, measured at \
         start: `CLOCK_THREAD_CPUTIME_ID` is a system call, and a rekey at 10,000 members \
         makes tens of thousands of calls).\n",
        TAIL.as_millis(),
        clock_overhead().as_secs_f64() * 1e9
    );
    println!(
        "| mode | members | method | leaves | time until all hold the new key, virtual ms: \
         median (min - max) | wraps | leader sent: datagrams / KiB | leader KiB less steady \
         state | leader CPU ms | leader CPU ms less steady state | leader CPU ms less \
         steady state and clock reads | leader calls | leader views | wall s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for &mode in &opts.modes {
        for &n in &opts.sizes {
            for (name, method) in methods() {
                if mode == Mode::Kdc && method != RekeyMethod::OneMessage {
                    continue;
                }
                if !opts.methods.is_empty() && !opts.methods.iter().any(|m| name.starts_with(m)) {
                    continue;
                }
                if n > MAX_VIEW_MEMBERS {
                    println!(
                        "| {} | {n} | {name} | skipped: above MAX_VIEW_MEMBERS ({MAX_VIEW_MEMBERS}) |",
                        mode.name()
                    );
                    continue;
                }
                match rekey_run(mode, n, method, opts) {
                    Ok(samples) => {
                        let med = |f: &dyn Fn(&RekeySample) -> f64| -> f64 {
                            median(samples.iter().map(f).collect()).unwrap_or(f64::NAN)
                        };
                        let virt = samples.iter().map(|s| ms(s.virt)).collect::<Vec<_>>();
                        let range = format!(
                            "{:.1} - {:.1}",
                            virt.iter().copied().fold(f64::INFINITY, f64::min),
                            virt.iter().copied().fold(0.0, f64::max)
                        );
                        let less_bytes = |s: &RekeySample| {
                            s.leader_sent.bytes as f64
                                - s.base.leader_bytes * s.window.as_secs_f64()
                        };
                        let less_cpu = |s: &RekeySample| {
                            ms(s.leader_busy) - s.base.leader_busy * s.window.as_secs_f64() * 1e3
                        };
                        let less_clock = |s: &RekeySample| {
                            let calls = s.leader_calls as f64
                                - s.base.leader_calls * s.window.as_secs_f64();
                            less_cpu(s) - calls * ms(clock_overhead())
                        };
                        let wraps = samples.iter().map(|s| s.wraps).collect::<Option<Vec<_>>>();
                        println!(
                            "| {} | {n} | {name} | {} | {:.1} ({range}) | {} | {:.0} / {} | {} | \
                             {:.2} | {:.2} | {:.2} | {:.0} | {:.0} | {:.1} |",
                            mode.name(),
                            samples.len(),
                            med(&|s| ms(s.virt)),
                            wraps.map_or("-".into(), |w| opt(
                                median(w.iter().map(|x| *x as f64).collect()),
                                0
                            )),
                            med(&|s| s.leader_sent.datagrams as f64),
                            kib(med(&|s| s.leader_sent.bytes as f64)),
                            kib(med(&less_bytes)),
                            med(&|s| ms(s.leader_busy)),
                            med(&less_cpu),
                            med(&less_clock),
                            med(&|s| s.leader_calls as f64),
                            med(&|s| s.views as f64),
                            med(&|s| s.wall.as_secs_f64()),
                        );
                    }
                    Err(e) => println!("| {} | {n} | {name} | failed: {e} |", mode.name()),
                }
            }
        }
    }
}

// ------------------------------------------------------------------------------ 2. change

struct ChangeSample {
    virt: Duration,
    window: Duration,
    all_sent: Traffic,
    /// What members received in the window, by kind.
    received: Received,
    base: Baseline,
    views: u64,
}

/// `n` members using `method`; node `n` joins while the member at the middle rank leaves.
fn change_run(
    mode: Mode,
    n: usize,
    method: RekeyMethod,
    opts: &Opts,
) -> Result<ChangeSample, String> {
    let mut w = World::new(mode, opts.seed, n + 1, method, opts.cap);
    w.form(n, opts.batched, opts.form_limit(n))?;
    w.run_for(Duration::from_secs(1))?;
    w.peer(0).busy.set(Some(Duration::ZERO));
    w.sim.flush();
    let base = baseline(&mut w, Duration::from_secs(2))?;
    let order = w.by_rank();
    let leaver = order[n / 2];
    let joiner = n;
    let mut after: Vec<usize> = order.iter().copied().filter(|i| *i != leaver).collect();
    after.push(joiner);
    let (sent0, views0, received0) = (w.total_sent(), w.peer(0).views, w.received());
    let t0 = w.sim.now();
    w.peer_mut(0).trace = std::env::var_os("LARGE_GROUPS_TRACE_LEADER").is_some();
    let contact = [w.sim.addr(w.nodes[0])];
    w.start(joiner, &contact);
    w.with_member(leaver, |m, now| m.leave(now));
    let (gone, new) = (w.ids[leaver], w.ids[joiner]);
    w.run_until(Duration::from_secs(30), "one join and one leave", |w| {
        let Some(v) = w.member(0).view() else {
            return false;
        };
        !v.contains(&gone) && v.contains(&new) && w.all_in(&after, v.id, v.members.len())
    })?;
    let done = after.iter().map(|i| w.peer(*i).view_at).max().unwrap_or(t0);
    w.one_key(&after, None)?;
    let end = done.saturating_add(TAIL);
    w.sim.run_until(end).map_err(|e| e.to_string())?;
    w.peer_mut(0).trace = false;
    Ok(ChangeSample {
        virt: done.saturating_duration_since(t0),
        window: end.saturating_duration_since(t0),
        all_sent: w.total_sent().since(sent0),
        received: w.received().since(&received0),
        base,
        views: w.peer(0).views - views0,
    })
}

// ------------------------------------------------------------------------------ 6. failures

/// `LARGE_GROUPS=fail`: a group of n forms and runs 1 s; the member at the middle rank
/// crashes (it stops, silently), and the virtual time until every survivor installed a view
/// without it is measured (detection by the failure detector, and the view change); 1 s
/// later the leader and ranks 1 to 3 crash together, and the virtual time until every
/// survivor shares one view without them (takeover by rank 4 and its view change).
fn fail_bench(opts: &Opts) {
    println!(
        "\n## 6. Failures: one crashed member removed, and a takeover after the leader and \
         ranks 1..3 crash (5 ms links, default timers: suspicion 1 s)\n"
    );
    println!(
        "| mode | members | crashed member out of every view (virtual ms) | leader + ranks 1..3 \
         crashed: one view of the survivors (virtual ms) |"
    );
    println!("|---|---|---|---|");
    for &mode in &opts.modes {
        for &n in &opts.sizes {
            match fail_run(mode, n, opts) {
                Ok((detect, takeover)) => println!(
                    "| {} | {n} | {:.0} | {:.0} |",
                    mode.name(),
                    ms(detect),
                    ms(takeover)
                ),
                Err(e) => println!("| {} | {n} | failed: {e} |", mode.name()),
            }
        }
    }
}

fn fail_run(mode: Mode, n: usize, opts: &Opts) -> Result<(Duration, Duration), String> {
    let mut w = World::new(mode, opts.seed, n, RekeyMethod::OneMessage, opts.cap);
    w.form(n, opts.batched, opts.form_limit(n))?;
    w.run_for(Duration::from_secs(1))?;
    let order = w.by_rank();
    let crashed = order[n / 2];
    let left: Vec<usize> = order.iter().copied().filter(|i| *i != crashed).collect();
    w.sim.crash(w.nodes[crashed]);
    let detect = w.run_until(Duration::from_secs(30), "a crashed member removed", |w| {
        w.member(left[0])
            .view()
            .is_some_and(|v| v.members.len() == n - 1 && w.all_in(&left, v.id, n - 1))
    })?;
    w.run_for(Duration::from_secs(1))?;
    let order = w.by_rank();
    let dead: Vec<usize> = order.iter().copied().take(4).collect();
    let alive: Vec<usize> = order.iter().copied().skip(4).collect();
    for i in &dead {
        w.sim.crash(w.nodes[*i]);
    }
    let len = alive.len();
    let takeover = w.run_until(Duration::from_secs(60), "takeover", |w| {
        w.member(alive[0])
            .view()
            .is_some_and(|v| v.members.len() == len && w.all_in(&alive, v.id, len))
    })?;
    Ok((detect, takeover))
}

fn change_bench(opts: &Opts) {
    println!(
        "\n## 2. One view change: one join and one leave at the same instant (5 ms links, \
         default timers)\n"
    );
    println!(
        "Bytes every node sent from the join and leave until {} ms after the last member \
         installed the view with the joiner and without the leaver; \"less steady state\" \
         subtracts what all nodes send in as long a window of steady state.\n",
        TAIL.as_millis()
    );
    println!(
        "| mode | members | method | views the leader installed | virtual ms until all in the \
         view | all sent: datagrams / KiB | KiB less steady state |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut breakdowns = Vec::new();
    for &mode in &opts.modes {
        for &n in &opts.sizes {
            for (name, method) in methods() {
                if !opts.change_methods.iter().any(|m| name.starts_with(m))
                    || (mode == Mode::Kdc && method != RekeyMethod::OneMessage)
                {
                    continue;
                }
                if let Some(s) = change_row(mode, n, name, method, opts) {
                    breakdowns.push((format!("{}, {n}, {name}", mode.name()), s));
                }
            }
        }
    }
    for (label, s) in &breakdowns {
        print_received(label, s);
    }
}

/// Where the bytes of one view change went: what the members received in the window, by
/// message kind, beside what they received by kind in as long a window of steady state.
fn print_received(label: &str, s: &ChangeSample) {
    println!(
        "\n### Received by kind ({label}): the view change's window ({:.0} virtual ms) and \
         as long a window of steady state\n",
        ms(s.window)
    );
    println!(
        "| kind | datagrams | KiB | bytes each | steady state: datagrams / KiB | KiB less \
         steady state |"
    );
    println!("|---|---|---|---|---|---|");
    let (base, secs) = &s.base.received;
    let scale = s.window.as_secs_f64() / secs.max(f64::MIN_POSITIVE);
    let steady: HashMap<&str, (f64, f64)> = base
        .by_kind()
        .into_iter()
        .map(|(k, c)| (k, (c.datagrams as f64 * scale, c.bytes as f64 * scale)))
        .collect();
    let mut kinds: Vec<&str> = s.received.by_kind().iter().map(|(k, _)| *k).collect();
    for (k, _) in base.by_kind() {
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    let now: HashMap<&str, (u64, u64)> = s
        .received
        .by_kind()
        .into_iter()
        .map(|(k, c)| (k, (c.datagrams, c.bytes)))
        .collect();
    for k in kinds {
        let (d, b) = now.get(k).copied().unwrap_or_default();
        let (sd, sb) = steady.get(k).copied().unwrap_or_default();
        let each = b.checked_div(d).unwrap_or(0);
        println!(
            "| {k} | {d} | {} | {each} | {sd:.0} / {} | {} |",
            kib(b as f64),
            kib(sb),
            kib(b as f64 - sb)
        );
    }
    let total = s.received.total();
    println!(
        "| all | {} | {} | | | {} |",
        total.datagrams,
        kib(total.bytes as f64),
        kib(total.bytes as f64 - base.total().bytes as f64 * scale)
    );
}

/// One row of part 2; the sample, for its breakdown.
fn change_row(
    mode: Mode,
    n: usize,
    name: &str,
    method: RekeyMethod,
    opts: &Opts,
) -> Option<ChangeSample> {
    if n + 1 > MAX_VIEW_MEMBERS {
        println!(
            "| {} | {n} | {name} | skipped: above MAX_VIEW_MEMBERS ({MAX_VIEW_MEMBERS}) |",
            mode.name()
        );
        return None;
    }
    match change_run(mode, n, method, opts) {
        Ok(s) => {
            let less = s.all_sent.bytes as f64 - s.base.all_bytes * s.window.as_secs_f64();
            println!(
                "| {} | {n} | {name} | {} | {:.1} | {} / {} | {} |",
                mode.name(),
                s.views,
                ms(s.virt),
                s.all_sent.datagrams,
                kib(s.all_sent.bytes as f64),
                kib(less),
            );
            Some(s)
        }
        Err(e) => {
            println!("| {} | {n} | {name} | failed: {e} |", mode.name());
            None
        }
    }
}

// ------------------------------------------------------------------------------ 3. form

fn form_bench(opts: &Opts) {
    let how = if opts.batched {
        "in batches of 32, each once the leader admitted the previous"
    } else {
        "all at once, through member 0"
    };
    println!(
        "\n## 3. Forming a group from cold (5 ms links, default timers; joiners start {how})\n"
    );
    println!(
        "| mode | members | virtual s to one view of all | wall s | cpu s | RSS before / nodes \
         built / formed, MiB | RSS per member: built / formed, KiB |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &mode in &opts.modes {
        for &n in &opts.form_sizes {
            if n > MAX_VIEW_MEMBERS {
                println!(
                    "| {} | {n} | skipped: above MAX_VIEW_MEMBERS ({MAX_VIEW_MEMBERS}) |",
                    mode.name()
                );
                continue;
            }
            let before = rss();
            let wall = wall_now();
            let cpu = thread_cpu();
            let mut w = World::new(mode, opts.seed, n, RekeyMethod::OneMessage, opts.cap);
            let built = rss();
            let r = w.form(n, opts.batched, opts.form_limit(n));
            let wall = wall.elapsed();
            let cpu = match (cpu, thread_cpu()) {
                (Some(a), Some(b)) => Some(b.saturating_sub(a)),
                _ => None,
            };
            let after = rss();
            match r {
                Ok(virt) => {
                    let mib = |b: Option<u64>| opt(b.map(|b| b as f64 / 1048576.0), 0);
                    let mem = format!("{} / {} / {}", mib(before), mib(built), mib(after));
                    let per = |a: Option<u64>| match (before, a) {
                        (Some(b), Some(a)) => kib(a.saturating_sub(b) as f64 / n as f64),
                        _ => "-".into(),
                    };
                    let per = format!("{} / {}", per(built), per(after));
                    println!(
                        "| {} | {n} | {:.2} | {:.1} | {} | {mem} | {per} |",
                        mode.name(),
                        virt.as_secs_f64(),
                        wall.as_secs_f64(),
                        cpu.map_or("-".into(), |c| format!("{:.1}", c.as_secs_f64())),
                    );
                }
                Err(e) => println!("| {} | {n} | failed: {e} |", mode.name()),
            }
            if std::env::var_os("LARGE_GROUPS_VERBOSE").is_some() {
                eprintln!(
                    "  n={n}: sim log {} entries, counters {:?}",
                    w.sim.log().len(),
                    w.sim.counters()
                );
            }
        }
    }
}

// ------------------------------------------------------------------------------ 4. steady

fn steady_bench(opts: &Opts) {
    let window = opts.steady;
    println!(
        "\n## 4. Steady state: datagrams a second at the leader and at the member at the \
         middle rank (5 ms links, default timers; a {} s window starting 1 s after the group \
         formed)\n",
        window.as_secs()
    );
    println!(
        "| mode | members | leader in / out per s | leader KiB/s in / out | member in / out \
         per s | member KiB/s in / out |"
    );
    println!("|---|---|---|---|---|---|");
    for &mode in &opts.modes {
        for &n in &opts.sizes {
            if n > MAX_VIEW_MEMBERS {
                println!(
                    "| {} | {n} | skipped: above MAX_VIEW_MEMBERS ({MAX_VIEW_MEMBERS}) |",
                    mode.name()
                );
                continue;
            }
            let r = (|| -> Result<[(Traffic, Traffic); 2], String> {
                let mut w = World::new(mode, opts.seed, n, RekeyMethod::OneMessage, opts.cap);
                w.form(n, opts.batched, opts.form_limit(n))?;
                w.run_for(Duration::from_secs(1))?;
                let order = w.by_rank();
                let watched = [0, order[n / 2]];
                let at = |w: &World| watched.map(|i| (w.peer(i).received, w.peer(i).sent));
                let start = at(&w);
                w.run_for(window)?;
                let end = at(&w);
                Ok([0, 1].map(|k| (end[k].0.since(start[k].0), end[k].1.since(start[k].1))))
            })();
            match r {
                Ok([leader, member]) => {
                    let secs = window.as_secs_f64();
                    let rate = |t: Traffic| t.datagrams as f64 / secs;
                    let kibs = |t: Traffic| t.bytes as f64 / secs / 1024.0;
                    println!(
                        "| {} | {n} | {:.0} / {:.0} | {:.1} / {:.1} | {:.1} / {:.1} | {:.2} / \
                         {:.2} |",
                        mode.name(),
                        rate(leader.0),
                        rate(leader.1),
                        kibs(leader.0),
                        kibs(leader.1),
                        rate(member.0),
                        rate(member.1),
                        kibs(member.0),
                        kibs(member.1),
                    );
                }
                Err(e) => println!("| {} | {n} | failed: {e} |", mode.name()),
            }
        }
    }
}

// ------------------------------------------------------------------------------ 5. the simulator

/// A synthetic node for measuring the simulator alone: every `period` it sends `len` bytes
/// to node 0 (heartbeats to a leader); node 0 sends them to every node (the leader's).
struct Beat {
    period: Duration,
    len: usize,
    /// Node 0: every node's address; the others: node 0's.
    to: Vec<SocketAddr>,
    next: Timestamp,
    queue: Vec<SocketAddr>,
}

impl Machine for Beat {
    type Event = ();
    fn handle_datagram(&mut self, _: Timestamp, _: SocketAddr, _: &[u8]) {}
    fn handle_timeout(&mut self, now: Timestamp) {
        if now >= self.next {
            self.queue.extend_from_slice(&self.to);
            self.next = now.saturating_add(self.period);
        }
    }
    fn poll_transmit(&mut self, _: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
        let destination = self.queue.pop()?;
        buf.resize(self.len, 0x5a);
        Some(Transmit {
            destination,
            size: self.len,
        })
    }
    fn poll_timeout(&self) -> Option<Timestamp> {
        Some(self.next)
    }
    fn poll_event(&mut self) -> Option<()> {
        None
    }
}

/// The simulator alone: `n` [`Beat`] nodes (100 ms period, 64-byte datagrams) for `secs` of
/// virtual time; wall time per step, and the log's length (timeouts logged or not).
fn sim_bench(sizes: &[usize], secs: u64) {
    println!(
        "\n## 5. The simulator alone: n synthetic nodes, each sending a 64-byte datagram to \
         node 0 every 100 ms and node 0 one to each node every 100 ms, {secs} s of virtual \
         time\n"
    );
    println!(
        "| nodes | log_timeouts | steps | wall s | ns per step | log entries | RSS after, MiB |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &n in sizes {
        for log_timeouts in [false, true] {
            let mut sim: Sim<Beat> = Sim::new(SimConfig {
                log_packets: false,
                log_timeouts,
                latency: Duration::from_millis(5),
                max_steps: u64::MAX,
                ..SimConfig::with_seed(1)
            });
            let leader = NodeId::from_index(0).addr();
            let all: Vec<SocketAddr> = (1..n).map(|i| NodeId::from_index(i).addr()).collect();
            let period = Duration::from_millis(100);
            for i in 0..n {
                // Spread the nodes' first beats over one period.
                let first = Timestamp::ZERO + period * (i as u32) / (n as u32);
                let to = if i == 0 { all.clone() } else { vec![leader] };
                sim.add_node(Beat {
                    period,
                    len: 64,
                    to,
                    next: first,
                    queue: Vec::new(),
                });
            }
            let wall = wall_now();
            let until = Timestamp::ZERO + Duration::from_secs(secs);
            if let Err(e) = sim.run_until(until) {
                println!("| {n} | {log_timeouts} | failed: {e} |");
                continue;
            }
            let wall = wall.elapsed();
            let steps = sim.counters().steps;
            println!(
                "| {n} | {log_timeouts} | {steps} | {:.2} | {:.0} | {} | {} |",
                wall.as_secs_f64(),
                wall.as_secs_f64() * 1e9 / steps.max(1) as f64,
                sim.log().len(),
                rss().map_or("-".into(), |r| format!("{:.0}", r as f64 / 1048576.0)),
            );
        }
    }
}

// ------------------------------------------------------------------------------ main

struct Opts {
    modes: Vec<Mode>,
    sizes: Vec<usize>,
    form_sizes: Vec<usize>,
    batched: bool,
    steady: Duration,
    leaves: usize,
    /// Part 1's methods, by the start of their names (all when empty).
    methods: Vec<String>,
    /// Part 2's methods, by the start of their names.
    change_methods: Vec<String>,
    seed: u64,
    cap: Duration,
}

impl Opts {
    /// Virtual time forming `n` members may take: 60 s (the issue's goal at 10,000), and
    /// 20 ms a member beyond that.
    fn form_limit(&self, n: usize) -> Duration {
        Duration::from_secs(60).max(Duration::from_millis(20) * n as u32)
    }
}

fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .split(',')
            .filter_map(|x| x.trim().parse().ok())
            .filter(|n| *n >= 4)
            .collect(),
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
    let parts = std::env::var("LARGE_GROUPS").unwrap_or_else(|_| "rekey,change,form,steady".into());
    let parts: Vec<&str> = parts.split(',').map(str::trim).collect();
    let modes = match std::env::var("LARGE_GROUPS_MODES").as_deref() {
        Ok("kdc") => vec![Mode::Kdc],
        Ok("identity,kdc") | Ok("kdc,identity") => vec![Mode::Identity, Mode::Kdc],
        _ => vec![Mode::Identity],
    };
    let opts = Opts {
        modes,
        sizes: env_list("LARGE_GROUPS_SIZES", &[1000]),
        form_sizes: env_list("LARGE_GROUPS_FORM_SIZES", &[1000, 2500, 5000, 10_000]),
        batched: std::env::var("LARGE_GROUPS_FORM").as_deref() == Ok("batched"),
        steady: Duration::from_secs(env_num("LARGE_GROUPS_STEADY_SECS", 5).max(1)),
        leaves: env_num("LARGE_GROUPS_LEAVES", 3).max(1) as usize,
        methods: std::env::var("LARGE_GROUPS_METHODS")
            .map(|v| v.split(',').map(|m| m.trim().to_string()).collect())
            .unwrap_or_default(),
        change_methods: std::env::var("LARGE_GROUPS_CHANGE_METHODS")
            .unwrap_or_else(|_| "one-message".into())
            .split(',')
            .map(|m| m.trim().to_string())
            .collect(),
        seed: env_num("LARGE_GROUPS_SEED", 1),
        cap: Duration::from_secs(env_num("LARGE_GROUPS_CAP_SECS", 1800)),
    };
    println!(
        "# large_groups: cohort-sim, every member on this one thread ({}); virtual times \
         from the simulator's clock, wall and cpu from this process; seed {}",
        cpu_model(),
        opts.seed
    );
    if parts.contains(&"form") {
        form_bench(&opts);
    }
    if parts.contains(&"steady") {
        steady_bench(&opts);
    }
    if parts.contains(&"rekey") {
        rekey_bench(&opts);
    }
    if parts.contains(&"change") {
        change_bench(&opts);
    }
    if parts.contains(&"fail") {
        fail_bench(&opts);
    }
    if parts.contains(&"sim") {
        let sizes = env_list("LARGE_GROUPS_SIM_SIZES", &[1000, 10_000]);
        sim_bench(&sizes, env_num("LARGE_GROUPS_SIM_SECS", 10).max(1));
    }
}
