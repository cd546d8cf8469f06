//! Group rekey at scale, in the simulator: how long a fresh group key takes to reach every
//! member of a group of 64 to 1,000 members over 1 ms links, by one message (LSGC) against
//! down a tree of pair channels (Ensemble).
//!
//! ```sh
//! cargo run --release -p cohort-group --example rekey_scale -- \
//!     --sizes 64,128,256,512,1000 --degrees 2,4,8 --rekeys 5 [--json] [--seed 1]
//! ```
//!
//! For each group size and each method the example builds a fresh simulated group (cohort-sim:
//! 1 ms one-way latency, no jitter, no loss, 64 KiB MTU), forms one view of all members
//! (member 0 founds the group alone; the others join through it, in batches), then asks the
//! leader to rekey `--rekeys` times. For each rekey it records the virtual time from the
//! `rekey` call until the last member installed the new key, the leader's own
//! `Rekeyed { took }`, the datagrams and bytes every member sent, and the wall-clock and
//! thread CPU time the simulator spent (it runs every member on this one thread, so that is
//! the total CPU cost of the rekey, crypto included, for all members together).
//!
//! The group is formed with `rekey_policy.on_membership_change = false`, so that joins do
//! not rekey (and, for a tree, do not open the tree's pair channels before the measured
//! rekeys); every measured rekey is an explicit `rekey()` with no membership change. Joins
//! go through member 0, which leads the group, so the leader already holds a pair channel
//! with every member when the first rekey starts; a tree's parents and children (other than
//! the leader's own children) open theirs during the first rekey.
//!
//! A rekey that does not complete within `--timeout-ms` of virtual time is reported, with
//! the reason when the simulator saw one (an Install larger than the MTU), and the row
//! stops there: the group is left mid-change, so later rekeys would measure something else.
use cohort_channel::identity::Identity;
use cohort_core::Transmit;
use cohort_gears::MAX_PACKET_LEN;
use cohort_group::{GroupConfig, GroupEvent, MemberId, RekeyMethod};
use cohort_sim::rand_core::RngCore;
use cohort_sim::{LogKind, NodeId, Sim, SimConfig};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Identities, clocks and statistics, shared with the tests and the benchmark.
#[path = "../tests/support/kit.rs"]
mod kit;
use kit::{identity, median, ms, opt, thread_cpu, wall_now, MemberNode, SendWatch};

/// A member and what it sent.
type Node = MemberNode<Sent>;

/// Datagrams and bytes a member sent.
#[derive(Default)]
struct Sent {
    packets: u64,
    bytes: u64,
}

impl SendWatch for Sent {
    fn sent(&mut self, t: &Transmit, _: &[u8]) {
        self.packets += 1;
        self.bytes += t.size as u64;
    }
}

struct Args {
    sizes: Vec<usize>,
    degrees: Vec<usize>,
    rekeys: usize,
    json: bool,
    seed: u64,
    batch: usize,
    timeout: Duration,
    cap: Duration,
}

fn usage() -> &'static str {
    "usage: rekey_scale [--sizes 64,128,256,512,1000] [--degrees 2,4,8] [--rekeys 5] [--json]\n\
     \x20                  [--seed 1] [--batch 32] [--timeout-ms 3000] [--cap-secs 180]\n\
     \x20 --batch       joiners started together while forming the group\n\
     \x20 --timeout-ms  virtual time a rekey may take before it is reported as not completing\n\
     \x20 --cap-secs    wall-clock seconds one size and method may take; then the row stops"
}

fn parse_list(v: &str) -> Result<Vec<usize>, String> {
    v.split(',')
        .map(|x| x.trim().parse::<usize>().map_err(|e| format!("{x}: {e}")))
        .collect()
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        sizes: vec![64, 128, 256, 512, 1000],
        degrees: vec![2, 4, 8],
        rekeys: 5,
        json: false,
        seed: 1,
        batch: 32,
        timeout: Duration::from_millis(3000),
        cap: Duration::from_secs(180),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--json" {
            a.json = true;
            continue;
        }
        if flag == "-h" || flag == "--help" {
            return Err(String::new());
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--sizes" => a.sizes = parse_list(&value)?,
            "--degrees" => a.degrees = parse_list(&value)?,
            "--rekeys" => a.rekeys = num(&value)? as usize,
            "--seed" => a.seed = num(&value)?,
            "--batch" => a.batch = num(&value)? as usize,
            "--timeout-ms" => a.timeout = Duration::from_millis(num(&value)?),
            "--cap-secs" => a.cap = Duration::from_secs(num(&value)?),
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    if a.sizes.iter().any(|n| *n < 2) {
        return Err("--sizes: at least 2 members".into());
    }
    if a.degrees.contains(&0) {
        return Err("--degrees: at least 1".into());
    }
    if a.rekeys == 0 || a.batch == 0 {
        return Err("--rekeys and --batch: at least 1".into());
    }
    Ok(a)
}

fn method_name(m: RekeyMethod) -> String {
    match m {
        RekeyMethod::OneMessage => "one message".into(),
        RekeyMethod::Tree { degree } => format!("tree, degree {degree}"),
        RekeyMethod::Lkh { degree } => format!("lkh, degree {degree}"),
    }
}

/// One rekey, measured.
#[derive(Clone, Copy)]
struct Sample {
    /// From the `rekey` call until the last member installed the key (virtual).
    virt: Duration,
    /// The leader's `Rekeyed { took }`.
    took: Option<Duration>,
    /// Datagrams and bytes all members sent, from the call until [`SETTLE`] after the last
    /// install.
    packets: u64,
    bytes: u64,
    /// Wall-clock and thread CPU time of the simulator loop until the last install.
    wall: Duration,
    cpu: Option<Duration>,
}

/// Time run after the last install so that the members' acknowledgements are counted.
const SETTLE: Duration = Duration::from_millis(5);
/// Idle virtual time between two rekeys.
const IDLE: Duration = Duration::from_millis(50);

struct Row {
    members: usize,
    method: RekeyMethod,
    formation: Option<Duration>,
    formation_wall: Duration,
    samples: Vec<Sample>,
    /// Why the row stopped early.
    problem: Option<String>,
}

struct Bench {
    sim: Sim<Node>,
    nodes: Vec<NodeId>,
    ids: Vec<MemberId>,
    method: RekeyMethod,
    started: Instant,
    cap: Duration,
}

impl Bench {
    fn new(seed: u64, n: usize, method: RekeyMethod, cap: Duration) -> Bench {
        let mut sim: Sim<Node> = Sim::new(SimConfig {
            latency: Duration::from_millis(1),
            jitter: Duration::ZERO,
            mtu: 65_536,
            log_packets: false,
            max_steps: u64::MAX,
            ..SimConfig::with_seed(seed)
        });
        let identities: Vec<Identity> = (0..n).map(|i| identity(seed, i)).collect();
        let ids: Vec<MemberId> = identities.iter().map(|i| MemberId(i.public())).collect();
        let mut config = GroupConfig::new("rekey-scale", ids.clone());
        config.rekey_method = method;
        config.rekey_policy.on_membership_change = false;
        config.heartbeat_interval = Duration::from_millis(200);
        config.suspect_timeout = Duration::from_secs(5);
        config.flush_timeout = Duration::from_secs(2);
        let mut nodes = Vec::with_capacity(n);
        for ident in identities {
            let mut seed_bytes = [0u8; 32];
            sim.rng().fill_bytes(&mut seed_bytes);
            let config = config.clone();
            nodes.push(sim.add_node_with(|_, addr| {
                Node::new(ident, addr, config, seed_bytes, Sent::default())
            }));
        }
        Bench {
            sim,
            nodes,
            ids,
            method,
            started: wall_now(),
            cap,
        }
    }

    fn over_cap(&self) -> bool {
        self.started.elapsed() > self.cap
    }

    fn leader_view_len(&self) -> usize {
        self.sim
            .node(self.nodes[0])
            .member
            .view()
            .map_or(0, |v| v.members.len())
    }

    /// Whether every member is in one view with all members.
    fn formed(&self) -> bool {
        let Some(v) = self.sim.node(self.nodes[0]).member.view() else {
            return false;
        };
        v.members.len() == self.nodes.len()
            && self.nodes.iter().all(|n| {
                self.sim
                    .node(*n)
                    .member
                    .view()
                    .is_some_and(|w| w.id == v.id)
            })
    }

    /// Member 0 founds the group; the others join through it, `batch` at a time (each batch
    /// once the leader's view holds the previous one). Returns the virtual time taken.
    fn form(&mut self, batch: usize, limit: Duration) -> Result<Duration, String> {
        let begin = self.sim.now();
        let first = self.nodes[0];
        let contact = [self.sim.addr(first)];
        self.sim.with_node(first, |n, now| n.member.start(now, &[]));
        let step = Duration::from_millis(1);
        let mut started = 1;
        while started < self.nodes.len() {
            let end = (started + batch).min(self.nodes.len());
            for i in started..end {
                let node = self.nodes[i];
                self.sim
                    .with_node(node, |n, now| n.member.start(now, &contact));
            }
            started = end;
            while self.leader_view_len() < started {
                self.sim.run_for(step).map_err(|e| e.to_string())?;
                if self.sim.now().saturating_duration_since(begin) > limit {
                    return Err(format!(
                        "formation: the leader's view held {} of {} started members after {limit:?}",
                        self.leader_view_len(),
                        started
                    ));
                }
                if self.over_cap() {
                    return Err("formation: capped (wall clock)".into());
                }
            }
        }
        while !self.formed() {
            self.sim.run_for(step).map_err(|e| e.to_string())?;
            if self.sim.now().saturating_duration_since(begin) > limit {
                return Err(format!("formation: no single view of all after {limit:?}"));
            }
        }
        Ok(self.sim.now().saturating_duration_since(begin))
    }

    fn sent(&self) -> (u64, u64) {
        self.nodes.iter().fold((0, 0), |(p, b), n| {
            let node = self.sim.node(*n);
            (p + node.watch.packets, b + node.watch.bytes)
        })
    }

    /// How many members hold `epoch` in their view.
    fn holders(&self, epoch: u64) -> usize {
        self.nodes
            .iter()
            .filter(|n| {
                self.sim
                    .node(**n)
                    .member
                    .view()
                    .is_some_and(|v| v.key_epoch >= epoch)
            })
            .count()
    }

    /// One rekey by the leader; `Err` if it did not complete within `timeout`.
    fn rekey(&mut self, timeout: Duration) -> Result<Sample, String> {
        let leader_id = self
            .sim
            .node(self.nodes[0])
            .member
            .view()
            .map(|v| v.leader().id)
            .ok_or("no view")?;
        let li = self
            .ids
            .iter()
            .position(|id| *id == leader_id)
            .ok_or("leader unknown")?;
        let leader = self.nodes[li];
        let epoch = self
            .sim
            .node(leader)
            .member
            .view()
            .map(|v| v.key_epoch + 1)
            .ok_or("no view")?;
        let (p0, b0) = self.sent();
        let log0 = self.sim.log().len();
        let mtu0 = self.sim.counters().dropped_mtu;
        let t0 = self.sim.now();
        let n = self.nodes.len();
        let cpu0 = thread_cpu();
        let wall0 = wall_now();
        self.sim
            .with_node(leader, |node, now| node.member.rekey(now));
        let mut seen_events = u64::MAX;
        let started = self.started;
        let cap = self.cap;
        let mut capped = false;
        let result = self.sim.run_until_cond(timeout, |sim| {
            // Views change only with events: look again only when there are new ones.
            let events = sim.counters().events;
            if events == seen_events {
                return false;
            }
            seen_events = events;
            if started.elapsed() > cap {
                capped = true;
                return true;
            }
            let holders = (0..n)
                .filter(|i| {
                    sim.node(NodeId::from_index(*i))
                        .member
                        .view()
                        .is_some_and(|v| v.key_epoch >= epoch)
                })
                .count();
            holders == n
        });
        let wall = wall0.elapsed();
        let cpu = match (cpu0, thread_cpu()) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        if capped {
            return Err(format!(
                "capped: {:?} of wall clock reached during the rekey ({} of {n} members had the key)",
                self.cap,
                self.holders(epoch)
            ));
        }
        if result.is_err() {
            let mtu = self.sim.counters().dropped_mtu - mtu0;
            let install = self.one_message_install_len();
            let why = if mtu > 0 {
                format!(
                    "does not fit in one datagram: {mtu} datagrams over the simulator's {} byte \
                     MTU were dropped",
                    self.sim.config().mtu
                )
            } else if self.method == RekeyMethod::OneMessage && install > MAX_PACKET_LEN {
                format!(
                    "does not fit in one datagram: the Install for {n} members is at least \
                     {install} bytes, over the gears' {MAX_PACKET_LEN} byte packet limit, so \
                     the leader could not seal it and sent none (it installed the view alone)"
                )
            } else {
                "did not complete".into()
            };
            return Err(format!(
                "rekey to epoch {epoch} not complete after {timeout:?} of virtual time: {} of {n} \
                 members had the key; {why}",
                self.holders(epoch)
            ));
        }
        let done = self.sim.now();
        self.sim.run_for(SETTLE).map_err(|e| e.to_string())?;
        let (p1, b1) = self.sent();
        let took = self.sim.log()[log0..].iter().find_map(|e| match &e.kind {
            LogKind::Event(GroupEvent::Rekeyed {
                key_epoch, took, ..
            }) if e.node == leader && *key_epoch == epoch => *took,
            _ => None,
        });
        Ok(Sample {
            virt: done.saturating_duration_since(t0),
            took,
            packets: p1 - p0,
            bytes: b1 - b0,
            wall,
            cpu,
        })
    }

    /// Bytes of a one-message Install's body for this group, from the wire layout: per
    /// member a 32-byte id, a 7-byte IPv4 address, two 8-byte numbers (next message number,
    /// incarnation) and a 49-byte wrap of the key. A lower bound: the message header, the
    /// packet header and the AEAD tag come on top.
    fn one_message_install_len(&self) -> usize {
        self.nodes.len() * (32 + 7 + 8 + 8 + 49)
    }
}

fn run_row(args: &Args, n: usize, method: RekeyMethod) -> Row {
    let mut row = Row {
        members: n,
        method,
        formation: None,
        formation_wall: Duration::ZERO,
        samples: Vec::new(),
        problem: None,
    };
    let mut b = Bench::new(args.seed, n, method, args.cap);
    let w = wall_now();
    match b.form(args.batch, Duration::from_secs(600)) {
        Ok(d) => row.formation = Some(d),
        Err(e) => {
            row.problem = Some(e);
            return row;
        }
    }
    row.formation_wall = w.elapsed();
    if let Err(e) = b.sim.run_for(IDLE) {
        row.problem = Some(e.to_string());
        return row;
    }
    for _ in 0..args.rekeys {
        match b.rekey(args.timeout) {
            Ok(s) => row.samples.push(s),
            Err(e) => {
                row.problem = Some(e);
                return row;
            }
        }
        if let Err(e) = b.sim.run_for(IDLE) {
            row.problem = Some(e.to_string());
            return row;
        }
    }
    row
}

/// Summary of the later rekeys (all but the first).
struct Later {
    count: usize,
    virt_median: Option<f64>,
    virt_max: Option<f64>,
    took_median: Option<f64>,
    packets: Option<f64>,
    bytes: Option<f64>,
    wall: Option<f64>,
    cpu: Option<f64>,
}

fn later(row: &Row) -> Later {
    let rest = row.samples.get(1..).unwrap_or(&[]);
    let col =
        |f: &dyn Fn(&Sample) -> Option<f64>| -> Vec<f64> { rest.iter().filter_map(f).collect() };
    Later {
        count: rest.len(),
        virt_median: median(col(&|s| Some(ms(s.virt)))),
        virt_max: col(&|s| Some(ms(s.virt))).into_iter().reduce(f64::max),
        took_median: median(col(&|s| s.took.map(ms))),
        packets: median(col(&|s| Some(s.packets as f64))),
        bytes: median(col(&|s| Some(s.bytes as f64))),
        wall: median(col(&|s| Some(ms(s.wall)))),
        cpu: median(col(&|s| s.cpu.map(ms))),
    }
}

fn json_num(v: Option<f64>) -> String {
    v.map_or("null".into(), |x| format!("{x:.3}"))
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn print_json(row: &Row) {
    let l = later(row);
    let first = row.samples.first();
    let degree = match row.method {
        RekeyMethod::OneMessage => "null".to_string(),
        RekeyMethod::Tree { degree } | RekeyMethod::Lkh { degree } => degree.to_string(),
    };
    println!(
        "{{\"members\":{},\"method\":{},\"degree\":{},\"formation_ms\":{},\"formation_wall_ms\":{:.1},\
         \"first_virtual_ms\":{},\"first_leader_took_ms\":{},\"first_packets\":{},\"first_bytes\":{},\
         \"first_wall_ms\":{},\"first_cpu_ms\":{},\"later_rekeys\":{},\"later_virtual_ms_median\":{},\
         \"later_virtual_ms_max\":{},\"later_leader_took_ms_median\":{},\"later_packets_median\":{},\
         \"later_bytes_median\":{},\"later_wall_ms_median\":{},\"later_cpu_ms_median\":{},\"problem\":{}}}",
        row.members,
        json_str(match row.method {
            RekeyMethod::OneMessage => "one-message",
            RekeyMethod::Tree { .. } => "tree",
            RekeyMethod::Lkh { .. } => "lkh",
        }),
        degree,
        json_num(row.formation.map(ms)),
        ms(row.formation_wall),
        json_num(first.map(|s| ms(s.virt))),
        json_num(first.and_then(|s| s.took).map(ms)),
        json_num(first.map(|s| s.packets as f64)),
        json_num(first.map(|s| s.bytes as f64)),
        json_num(first.map(|s| ms(s.wall))),
        json_num(first.and_then(|s| s.cpu).map(ms)),
        l.count,
        json_num(l.virt_median),
        json_num(l.virt_max),
        json_num(l.took_median),
        json_num(l.packets),
        json_num(l.bytes),
        json_num(l.wall),
        json_num(l.cpu),
        row.problem.as_deref().map_or("null".into(), json_str),
    );
}

const HEADER: &str = "| members | method | formed in (virtual) | first rekey: virtual ms / leader took ms | first: packets / bytes | first: wall / cpu ms | later (n): virtual ms median / max | later: leader took ms | later: packets / bytes (median) | later: wall / cpu ms (median) |";

fn print_row(row: &Row) {
    let l = later(row);
    let first = row.samples.first();
    let formed = row.formation.map_or("-".into(), |d| {
        format!(
            "{:.0} ms ({:.1} s wall)",
            ms(d),
            row.formation_wall.as_secs_f64()
        )
    });
    println!(
        "| {} | {} | {} | {} / {} | {} / {} | {} / {} | ({}) {} / {} | {} | {} / {} | {} / {} |",
        row.members,
        method_name(row.method),
        formed,
        opt(first.map(|s| ms(s.virt)), 1),
        opt(first.and_then(|s| s.took).map(ms), 1),
        opt(first.map(|s| s.packets as f64), 0),
        opt(first.map(|s| s.bytes as f64), 0),
        opt(first.map(|s| ms(s.wall)), 1),
        opt(first.and_then(|s| s.cpu).map(ms), 1),
        l.count,
        opt(l.virt_median, 1),
        opt(l.virt_max, 1),
        opt(l.took_median, 1),
        opt(l.packets, 0),
        opt(l.bytes, 0),
        opt(l.wall, 1),
        opt(l.cpu, 1),
    );
    if let Some(p) = &row.problem {
        println!("|   | ^ {} |", p);
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("rekey_scale: {e}");
            }
            eprintln!("{}", usage());
            return ExitCode::from(2);
        }
    };
    let mut methods = vec![RekeyMethod::OneMessage];
    methods.extend(
        args.degrees
            .iter()
            .map(|d| RekeyMethod::Tree { degree: *d }),
    );
    if !args.json {
        println!(
            "# seed {}, 1 ms links, no jitter or loss, MTU 65536, aes-128-gcm; {} rekeys per row \
             (the first shown apart); virtual times from the simulator's clock, wall and cpu \
             from this process",
            args.seed, args.rekeys
        );
        println!("{HEADER}");
        println!("|{}", "---|".repeat(HEADER.matches(" | ").count() + 1));
    }
    for &n in &args.sizes {
        for &m in &methods {
            let row = run_row(&args, n, m);
            if args.json {
                print_json(&row);
            } else {
                print_row(&row);
            }
        }
    }
    ExitCode::SUCCESS
}
