//! `cohort group bench`: N members on loopback in one process, each with its own UDP socket
//! and driver task, measured as an application sees them.
//!
//! 1. Start every member with every other as a contact; wait for one view of N.
//! 2. Probe the packet overhead: the leader sends one reliable and one unreliable message,
//!    a follower one reliable message, and the sizes of the datagrams each send produced
//!    (seen by the [`Shell`] around the member) minus the payload are the overheads.
//! 3. `--rekeys K`: K times, ask the leader for a fresh key and time until every member has
//!    installed a view with the new key epoch (wall clock) and the leader's own `took`.
//! 4. Every member keeps its reliable send window full for `--warmup` seconds, then for S
//!    seconds more; the throughput is the reliable messages delivered at every member per
//!    second of those S (the smallest per-member count). If the view changes meanwhile (a
//!    member fell behind and was removed), the report says so.
//! 5. After sending stops, every member must reach the same total-order position with the
//!    same history (see [`bench_check`](super::bench_check)): the report gives the order
//!    check's verdict and the process's CPU time over the S seconds.
//!
//! `--baseline` repeats all of it with gear `none` in the same process. `--facade` runs the
//! members through the library's `cohort::group` facade instead of the protocol core (no
//! packet probe then).

use super::bench_check::{agree, process_cpu, scheduler_times, OrderCheck};
use super::bench_shards::Shards;
use super::os_seed;
use super::shell::{Shell, ShellEvent};
use crate::UsageError;
use clap::{Args, ValueEnum};
use cohort::group::parse_gear;
use cohort_channel::identity::Identity;
use cohort_crypto::CryptoProvider;
use cohort_group::config::DEFAULT_MAX_MESSAGE_LEN;
use cohort_group::{
    Channel, GroupConfig, GroupEvent, GroupMember, MemberId, Protection, RekeyMethod, View,
};
use cohort_net::batch::{BundleCounts, SharedBundleCounts};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// `cohort group bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// Members in the group.
    #[arg(long, default_value_t = 4)]
    members: usize,
    /// Application payload per message, in bytes.
    #[arg(long, default_value_t = 256)]
    size: usize,
    /// Gear: an AEAD, `none`, a MAC gear or a comma list of MAC gears.
    #[arg(long, default_value = "aes-128-gcm")]
    gear: String,
    /// Seconds of sending, counted.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Seconds of sending before the counted seconds (not counted).
    #[arg(long, default_value_t = 0.0)]
    warmup: f64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Rekeys to time after the view forms.
    #[arg(long, default_value_t = 0)]
    rekeys: usize,
    /// Also run with gear `none` and print the ratio.
    #[arg(long)]
    baseline: bool,
    /// The tokio runtime. current-thread is the default: on a 2-core machine (4 members,
    /// 256 bytes, --followers-only) it delivered 47k msgs/s with the view intact, where
    /// multi-thread's parallel drivers burst past the loopback receive buffers (kernel
    /// drops) and a member was removed.
    #[arg(long, value_enum, default_value_t = RuntimeKind::Current)]
    runtime: RuntimeKind,
    /// With `--runtime sharded`: how many shards (threads) the members are spread over
    /// (default: one per core, at most one per member).
    #[arg(long)]
    shards: Option<usize>,
    /// Only members other than the leader send (the leader sequences its own messages with
    /// no network round trip, so its window never fills and it can outrun the others).
    #[arg(long)]
    followers_only: bool,
    /// Reliable send window per member (default: the group default).
    #[arg(long)]
    send_window: Option<usize>,
    /// Drive the members through the library's `cohort::group` facade (what applications
    /// and `group run` use: fragment headers, the send queue, the event queue) instead of
    /// the protocol core directly. The packet overhead probe needs the core: with
    /// `--facade` it is not measured.
    #[arg(long)]
    facade: bool,
    /// `nats`: run the group over a NATS broker and over UDP fan-out in the same process,
    /// through the facade, and print both and the ratio (see `bench_nats.rs`; up to
    /// 1024 members).
    #[arg(long, value_enum, default_value_t = BenchTransport::Udp)]
    transport: BenchTransport,
    /// Bundle bound in bytes: the packets a member's driver sends to one destination in one
    /// flush travel as bundles of at most this size (`docs/wire.md`, "UDP bundles"); 0:
    /// no bundles. The default, 1452, fits a 1500-byte path without IP fragmentation;
    /// loopback's MTU is 65,536, so up to 65507 does not fragment here. Not used by
    /// `--facade` (the facade's own `udp_bundle_bytes` setting applies) nor with
    /// `COHORT_UDP_BATCH=off` (the path before batching sends no bundles).
    #[arg(long, default_value_t = cohort_net::bundle::DEFAULT_BUNDLE_BYTES)]
    bundle: usize,
    /// How the view of N forms: `founder` (the default) starts the first member alone, and
    /// once it has founded the group starts the rest with it as their only contact (N - 1
    /// pair handshakes, joins in the leader's batches); `all` starts every member at once
    /// with every other as a contact (N x (N - 1) handshakes; on a loaded 2-core machine 64
    /// members started so split into components of 4 to 14 that did not merge within the
    /// bench's 30 s). Through the protocol core only (`--facade` starts members one after
    /// another).
    #[arg(long, value_enum, default_value_t = Forming::Founder)]
    join: Forming,
    /// How the group rekeys (`rekey` in a member's configuration): `one-message` (one
    /// wrap per member in the Install), `tree` (shares down a tree of pair channels) or
    /// `lkh` (a logical key hierarchy). Through the protocol core only.
    #[arg(long, value_enum, default_value_t = BenchRekey::OneMessage)]
    rekey: BenchRekey,
    /// The degree of the `tree` or `lkh` rekey (default: 4).
    #[arg(long)]
    degree: Option<usize>,
    /// With `--transport nats`: the broker's URL (default: start a nats-server on a free
    /// loopback port, and stop it after).
    #[arg(long)]
    nats: Option<String>,
    /// With `--transport nats`: each member on a NATS connection of its own, instead of
    /// one connection for the whole process (what `cohort group many` uses), on which
    /// the broker sends each broadcast to the process once.
    #[arg(long)]
    nats_per_member: bool,
}

/// The transport `cohort group bench` measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BenchTransport {
    /// UDP only (the bench as before).
    Udp,
    /// NATS, against UDP fan-out in the same run.
    Nats,
}

/// The rekey method `cohort group bench` configures (see `--rekey`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BenchRekey {
    /// One message: each member's new key wrapped in the Install.
    OneMessage,
    /// Key shares down a tree of pair channels.
    Tree,
    /// A logical key hierarchy.
    Lkh,
}

impl BenchRekey {
    fn method(self, degree: Option<usize>) -> RekeyMethod {
        match self {
            BenchRekey::OneMessage => RekeyMethod::OneMessage,
            BenchRekey::Tree => RekeyMethod::Tree {
                degree: degree.unwrap_or(4),
            },
            BenchRekey::Lkh => RekeyMethod::Lkh {
                degree: degree.unwrap_or(RekeyMethod::LKH_DEFAULT_DEGREE),
            },
        }
    }
}

/// How `cohort group bench` forms its view (see `--join`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Forming {
    /// Every member at once, every other as a contact.
    All,
    /// The first member alone, then the rest through it.
    Founder,
}

/// Which tokio runtime runs the members.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RuntimeKind {
    /// One thread for every driver.
    Current,
    /// A worker per core.
    Multi,
    /// A current-thread runtime per core, members spread over them round-robin, the
    /// measuring on the main thread (see `bench_shards.rs`).
    Sharded,
}

impl RuntimeKind {
    fn name(self) -> &'static str {
        match self {
            RuntimeKind::Current => "current-thread",
            RuntimeKind::Multi => "multi-thread",
            RuntimeKind::Sharded => "sharded (a current-thread runtime per core)",
        }
    }
}

/// Most members a bench runs (as `--transport nats`; until issue 14's loopback rekey
/// measure it was 64, from the bench's first version).
const MAX_MEMBERS: usize = 1024;
/// How long the view, each rekey and each probe may take before the bench gives up.
const PHASE_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs the bench.
pub fn run(args: &BenchArgs) -> Result<(), UsageError> {
    if (args.rekey != BenchRekey::OneMessage || args.degree.is_some())
        && (args.facade || args.transport != BenchTransport::Udp)
    {
        return Err(UsageError(
            "--rekey and --degree: through the protocol core only (not with --facade or \
             --transport nats)"
                .into(),
        ));
    }
    if args.degree.is_some() && args.rekey == BenchRekey::OneMessage {
        return Err(UsageError(
            "--degree: only with --rekey tree or --rekey lkh".into(),
        ));
    }
    #[cfg(not(feature = "nats"))]
    if args.transport == BenchTransport::Nats {
        return Err(UsageError(
            "--transport nats: this build has no NATS transport (cargo feature `nats`)".into(),
        ));
    }
    #[cfg(feature = "nats")]
    if args.transport == BenchTransport::Nats {
        return super::bench_nats::run(&super::bench_nats::NatsBench {
            members: args.members,
            size: args.size,
            seconds: args.seconds,
            gear: &args.gear,
            nats: args.nats.as_deref(),
            per_member: args.nats_per_member,
            json: args.json,
        });
    }
    if !(1..=MAX_MEMBERS).contains(&args.members) {
        return Err(UsageError(format!(
            "--members must be 1 to {MAX_MEMBERS}, not {}",
            args.members
        )));
    }
    if !(args.seconds.is_finite() && args.seconds > 0.0 && args.seconds <= 3600.0) {
        return Err(UsageError(format!(
            "--seconds must be above 0 and at most 3600, not {}",
            args.seconds
        )));
    }
    if !(args.warmup.is_finite() && (0.0..=3600.0).contains(&args.warmup)) {
        return Err(UsageError(format!(
            "--warmup must be 0 to 3600 seconds, not {}",
            args.warmup
        )));
    }
    if args.size == 0 {
        return Err(UsageError("--size must be at least 1 byte".into()));
    }
    let protection = parse_gear(&args.gear).map_err(|e| UsageError(format!("--gear: {e}")))?;
    // Check the configuration before starting anything.
    group_config(args, protection.clone(), vec![])
        .validate()
        .map_err(|e| UsageError(format!("bench configuration: {e}")))?;

    let mut builder = match args.runtime {
        RuntimeKind::Current | RuntimeKind::Sharded => {
            tokio::runtime::Builder::new_current_thread()
        }
        RuntimeKind::Multi => tokio::runtime::Builder::new_multi_thread(),
    };
    let shards = match args.runtime {
        RuntimeKind::Sharded => {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let count = args.shards.unwrap_or(cores).clamp(1, args.members);
            Some(
                Shards::start(count)
                    .map_err(|e| UsageError(format!("cannot start the shards: {e}")))?,
            )
        }
        _ => None,
    };
    let shards = shards.as_ref();
    let runtime = builder
        .enable_all()
        .build()
        .map_err(|e| UsageError(format!("cannot start the runtime: {e}")))?;
    let one = |gear: &str, protection: Protection| {
        if args.facade {
            runtime.block_on(measure_facade(args, gear, shards))
        } else {
            runtime.block_on(measure(args, protection, shards))
        }
    };
    let main = one(&args.gear, protection)
        .map_err(|e| UsageError(format!("group bench ({}): {e}", args.gear)))?;
    let baseline = if args.baseline {
        Some(
            one("none", Protection::DangerNoneForTesting)
                .map_err(|e| UsageError(format!("group bench (baseline none): {e}")))?,
        )
    } else {
        None
    };
    report(args, shards.map(Shards::count), &main, baseline.as_ref());
    Ok(())
}

fn group_config(args: &BenchArgs, protection: Protection, trust: Vec<MemberId>) -> GroupConfig {
    let mut config = GroupConfig::new("bench", trust);
    config.protection = protection;
    config.max_message_len = args.size.max(DEFAULT_MAX_MESSAGE_LEN);
    config.rekey_method = args.rekey.method(args.degree);
    if let Some(window) = args.send_window {
        config.send_window = window;
        config.backlog_limit = config.backlog_limit.max(window * 4);
    }
    config
}

/// What one run measured.
struct Measurement {
    view_ms: f64,
    msgs_per_sec: f64,
    mbit_per_sec: f64,
    /// Sequenced reliable data packet, as the leader sends it to members.
    overhead_ordered: Option<usize>,
    /// A follower's reliable message on its way to the sequencer.
    overhead_submit: Option<usize>,
    /// An unreliable data packet.
    overhead_unreliable: Option<usize>,
    /// Wall time until every member installed the new key, per rekey.
    rekey_ms: Vec<f64>,
    /// Bytes every member received from the rekey until every member held the new key
    /// (what else they received meanwhile, heartbeats, included), per rekey. Empty through
    /// the facade.
    rekey_bytes: Vec<f64>,
    /// The leader's own `Rekeyed.took`, per rekey.
    rekey_took_ms: Vec<f64>,
    /// Per rekey, the time the process's threads spent on CPU and waiting in a run queue
    /// while it ran (ms, every thread summed; empty where /proc has no schedstat).
    rekey_cpu_ms: Vec<f64>,
    rekey_runq_ms: Vec<f64>,
    /// Process CPU time (user + system, every thread) over the counted seconds, if known.
    cpu_s: Option<f64>,
    /// Every member delivered one total order with no gap, repeat or reordering (`None`:
    /// not checked, or the members did not reach a common position in time).
    order_ok: Option<bool>,
    /// Whether the view of N held through the sending phase.
    view_held: bool,
    /// The fewest members any member's view had at the end of the sending phase.
    smallest_view: usize,
    /// Datagrams and bundles of every member's socket together over the counted seconds
    /// (`None` through the facade, whose sockets the bench does not see).
    udp: Option<BundleCounts>,
}

/// The members' shared view of what happened, updated from their event streams.
struct Watch {
    events: mpsc::UnboundedReceiver<(usize, ShellEvent)>,
    views: Vec<Option<View>>,
    took: Vec<(u64, Option<Duration>)>,
}

impl Watch {
    fn apply(&mut self, index: usize, event: ShellEvent) -> Option<ShellEvent> {
        match event {
            ShellEvent::Group(GroupEvent::View(view)) => {
                if let Some(slot) = self.views.get_mut(index) {
                    *slot = Some(view);
                }
                None
            }
            ShellEvent::Group(GroupEvent::Rekeyed {
                key_epoch, took, ..
            }) => {
                self.took.push((key_epoch, took));
                None
            }
            other => Some(other),
        }
    }

    /// Keeps reading the members' events (views, probes) for `seconds`, so nothing backs
    /// up.
    async fn watch_for(&mut self, seconds: f64) {
        let _ = tokio::time::timeout(Duration::from_secs_f64(seconds), async {
            while let Some((i, event)) = self.events.recv().await {
                self.apply(i, event);
            }
        })
        .await;
    }

    /// Waits until `done` holds for the views, handling events meanwhile; returns the
    /// other events seen (probes).
    async fn until(
        &mut self,
        what: &str,
        mut done: impl FnMut(&[Option<View>]) -> bool,
    ) -> Result<Vec<(usize, ShellEvent)>, String> {
        let deadline = tokio::time::Instant::now() + PHASE_TIMEOUT;
        let mut others = Vec::new();
        while !done(&self.views) {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Some((i, event))) => {
                    if let Some(other) = self.apply(i, event) {
                        others.push((i, other));
                    }
                }
                Ok(None) => return Err(format!("the members stopped while waiting for {what}")),
                Err(_) => {
                    return Err(format!(
                        "no {what} within {PHASE_TIMEOUT:?} (views: {})",
                        self.describe()
                    ))
                }
            }
        }
        Ok(others)
    }

    fn describe(&self) -> String {
        self.views
            .iter()
            .map(|v| match v {
                Some(v) => format!("{} of {} epoch {}", v.id, v.members.len(), v.key_epoch),
                None => "none".into(),
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The common view if every member has installed the same one with `n` members.
    fn common(views: &[Option<View>], n: usize) -> Option<&View> {
        let first = views.first()?.as_ref()?;
        let same = views.iter().all(|v| v.as_ref() == Some(first));
        (same && first.members.len() == n).then_some(first)
    }
}

type Commands = mpsc::Sender<cohort_net::Command<Shell<GroupMember>>>;

async fn send(
    commands: &Commands,
    f: impl FnOnce(&mut Shell<GroupMember>, cohort_core::Timestamp) + Send + 'static,
) -> Result<(), String> {
    commands
        .send(Box::new(f))
        .await
        .map_err(|_| "a member's driver stopped".to_string())
}

/// The bytes every member received so far (`GroupMember::traffic`), summed: each
/// member's driver is asked in turn.
async fn received_bytes<T>(drivers: &[(Commands, T)]) -> Result<u64, String> {
    let mut total = 0;
    for (commands, _) in drivers {
        let (tx, rx) = tokio::sync::oneshot::channel();
        send(commands, move |s, _| {
            let _ = tx.send(s.member_mut().traffic().total().bytes);
        })
        .await?;
        total += rx
            .await
            .map_err(|_| "a member's driver stopped".to_string())?;
    }
    Ok(total)
}

async fn measure(
    args: &BenchArgs,
    protection: Protection,
    shards: Option<&Shards>,
) -> Result<Measurement, String> {
    let provider = CryptoProvider::default_provider();
    let n = args.members;
    let mut identities = Vec::with_capacity(n);
    let mut sockets = Vec::with_capacity(n);
    let mut addrs: Vec<SocketAddr> = Vec::with_capacity(n);
    for index in 0..n {
        identities.push(Identity::generate(&provider).map_err(|e| format!("keygen: {e}"))?);
        // With shards, the socket registers with its member's shard's reactor.
        let _shard = shards.map(|s| s.for_member(index).enter());
        let socket = cohort_net::bind_udp(SocketAddr::from(([127, 0, 0, 1], 0)))
            .map_err(|e| format!("cannot bind a loopback socket: {e}"))?;
        addrs.push(socket.local_addr().map_err(|e| e.to_string())?);
        sockets.push(socket);
    }
    let trust: Vec<MemberId> = identities.iter().map(|i| MemberId(i.public())).collect();

    let (event_tx, event_rx) = mpsc::unbounded_channel();
    let delivered: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let checks: Arc<Vec<Mutex<OrderCheck>>> =
        Arc::new((0..n).map(|_| Mutex::new(OrderCheck::default())).collect());
    let udp_counts: Vec<Arc<SharedBundleCounts>> = (0..n).map(|_| Arc::default()).collect();
    let mut drivers = Vec::with_capacity(n);
    let mut pumps = Vec::with_capacity(n);
    for (index, (identity, socket)) in identities.into_iter().zip(sockets).enumerate() {
        let config = group_config(args, protection.clone(), trust.clone());
        let seed = os_seed(&provider).map_err(|e| e.0)?;
        let member = GroupMember::new(provider, identity, addrs[index], config, seed)
            .map_err(|e| e.to_string())?;
        // With shards, the driver and its pump run on the member's shard.
        let _shard = shards.map(|s| s.for_member(index).enter());
        let cohort_net::Driver {
            commands,
            mut events,
            task,
        } = cohort_net::spawn_with(
            Shell::new(member),
            socket,
            cohort_net::UdpOptions {
                bundle: (args.bundle > 0).then_some(args.bundle),
                counts: Some(udp_counts[index].clone()),
            },
        );
        let (tx, counter, checks) = (event_tx.clone(), delivered.clone(), checks.clone());
        // Every member's events are read at once (a full event channel would stall its
        // driver); deliveries are counted and order-checked, the rest goes to the watcher.
        pumps.push(tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                match event {
                    ShellEvent::Group(GroupEvent::Deliver {
                        channel: Channel::Reliable,
                        sender,
                        view,
                        seq,
                        order,
                        ..
                    }) => {
                        if let Some(c) = counter.get(index) {
                            c.fetch_add(1, Ordering::Relaxed);
                        }
                        if let Some(Ok(mut check)) = checks.get(index).map(|c| c.lock()) {
                            check.deliver(view, sender, seq, order);
                        }
                    }
                    ShellEvent::Group(GroupEvent::Deliver { .. }) => {}
                    other => {
                        let _ = tx.send((index, other));
                    }
                }
            }
        }));
        drivers.push((commands, task));
    }
    drop(event_tx);
    let mut watch = Watch {
        events: event_rx,
        views: vec![None; n],
        took: Vec::new(),
    };

    let started = Instant::now();
    for (i, (commands, _)) in drivers.iter().enumerate() {
        let contacts: Vec<SocketAddr> = match args.join {
            Forming::All => addrs
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, a)| *a)
                .collect(),
            // The founder starts with no contact and founds at once.
            Forming::Founder if i == 0 => Vec::new(),
            Forming::Founder => addrs[..1].to_vec(),
        };
        send(commands, move |s, now| s.member_mut().start(now, &contacts)).await?;
        if args.join == Forming::Founder && i == 0 {
            watch
                .until("the founder's view", |v| {
                    v.first().is_some_and(Option::is_some)
                })
                .await?;
        }
    }
    watch
        .until(&format!("one view of {n}"), |v| {
            Watch::common(v, n).is_some()
        })
        .await?;
    let view_ms = started.elapsed().as_secs_f64() * 1e3;
    let view = Watch::common(&watch.views, n)
        .cloned()
        .ok_or("the view vanished")?;
    let leader = view
        .members
        .first()
        .and_then(|m| addrs.iter().position(|a| *a == m.addr))
        .ok_or("the leader is not one of the bench's members")?;
    let follower = (0..n).find(|i| *i != leader);

    // Packet overhead: one probed send at a time, each followed by its probe report.
    let mut overheads = Vec::new();
    let mut probes = vec![(leader, Channel::Reliable), (leader, Channel::Unreliable)];
    if let Some(f) = follower {
        probes.push((f, Channel::Reliable));
    }
    for (who, channel) in probes {
        // A send can meet a view change still settling (the rekey after the last join):
        // try again a little later.
        let mut attempts = 0;
        let seen = loop {
            let payload = vec![0x5a; args.size];
            send(&drivers[who].0, move |s, now| {
                s.probe(now, channel, payload)
            })
            .await?;
            match watch.until_probe(who).await? {
                Ok(seen) => break seen,
                Err(e) if attempts >= 50 => return Err(format!("probe send failed: {e}")),
                Err(_) => {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        overheads.push(seen);
    }

    // Rekeys.
    let mut rekey_bytes = Vec::new();
    let mut rekey_ms = Vec::new();
    let mut rekey_took_ms = Vec::new();
    let mut rekey_cpu_ms = Vec::new();
    let mut rekey_runq_ms = Vec::new();
    for _ in 0..args.rekeys {
        let epoch = watch
            .views
            .iter()
            .flatten()
            .map(|v| v.key_epoch)
            .max()
            .unwrap_or(0);
        let received_before = received_bytes(&drivers).await?;
        let sched_before = scheduler_times();
        let t0 = Instant::now();
        let took_before = watch.took.len();
        send(&drivers[leader].0, |s, now| s.member_mut().rekey(now)).await?;
        watch
            .until("a rekey at every member", |views| {
                views.iter().all(|v| {
                    v.as_ref()
                        .is_some_and(|v| v.key_epoch > epoch && v.members.len() == n)
                })
            })
            .await?;
        rekey_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        let received_after = received_bytes(&drivers).await?;
        rekey_bytes.push(received_after.saturating_sub(received_before) as f64);
        if let (Some((cpu0, wait0)), Some((cpu1, wait1))) = (sched_before, scheduler_times()) {
            rekey_cpu_ms.push(cpu1.saturating_sub(cpu0).as_secs_f64() * 1e3);
            rekey_runq_ms.push(wait1.saturating_sub(wait0).as_secs_f64() * 1e3);
        }
        if let Some(took) = watch.took[took_before..].iter().find_map(|(_, t)| *t) {
            rekey_took_ms.push(took.as_secs_f64() * 1e3);
        }
    }

    // Throughput.
    let payload = vec![0xa5u8; args.size];
    for (i, (commands, _)) in drivers.iter().enumerate() {
        if args.followers_only && i == leader && n > 1 {
            continue;
        }
        let data = payload.clone();
        send(commands, move |s, now| {
            s.set_flood(now, Some((Channel::Reliable, data)))
        })
        .await?;
    }
    if args.warmup > 0.0 {
        watch.watch_for(args.warmup).await;
    }
    let before = counts(&delivered);
    let view_before = Watch::common(&watch.views, n).map(|v| v.id);
    let udp_before = total_udp(&udp_counts);
    let cpu_before = process_cpu();
    let t0 = Instant::now();
    watch.watch_for(args.seconds).await;
    let cpu_s = process_cpu()
        .zip(cpu_before)
        .map(|(after, before)| after.saturating_sub(before).as_secs_f64());
    let count = smallest_gain(&before, &counts(&delivered));
    let udp = total_udp(&udp_counts).since(&udp_before);
    let view_after = Watch::common(&watch.views, n).map(|v| v.id);
    let view_held = view_before.is_some() && view_before == view_after;
    let smallest_view = watch
        .views
        .iter()
        .map(|v| v.as_ref().map_or(0, |v| v.members.len()))
        .min()
        .unwrap_or(0);
    let elapsed = t0.elapsed().as_secs_f64();
    for (commands, _) in &drivers {
        send(commands, |s, now| s.set_flood(now, None)).await?;
    }
    let msgs_per_sec = count as f64 / elapsed;
    let order_ok = if view_held {
        settle_order(&checks).await
    } else {
        None
    };

    for (commands, task) in drivers {
        drop(commands);
        let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
    }
    for pump in pumps {
        let _ = tokio::time::timeout(Duration::from_secs(2), pump).await;
    }
    Ok(Measurement {
        view_ms,
        msgs_per_sec,
        mbit_per_sec: msgs_per_sec * args.size as f64 * 8.0 / 1e6,
        overhead_ordered: overheads.first().copied().flatten(),
        overhead_unreliable: overheads.get(1).copied().flatten(),
        overhead_submit: overheads.get(2).copied().flatten(),
        rekey_ms,
        rekey_bytes,
        rekey_took_ms,
        rekey_cpu_ms,
        rekey_runq_ms,
        cpu_s,
        order_ok,
        view_held,
        smallest_view,
        udp: Some(udp),
    })
}

/// Every member's socket counts together.
fn total_udp(shared: &[Arc<SharedBundleCounts>]) -> BundleCounts {
    shared
        .iter()
        .fold(BundleCounts::default(), |sum, c| sum.plus(&c.load()))
}

fn counts(delivered: &[AtomicU64]) -> Vec<u64> {
    delivered
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .collect()
}

/// Messages delivered at every member between two readings of the counters: the smallest
/// per-member gain.
fn smallest_gain(before: &[u64], after: &[u64]) -> u64 {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| a.saturating_sub(*b))
        .min()
        .unwrap_or(0)
}

/// Waits (up to [`PHASE_TIMEOUT`]) until every member stands at the same total-order
/// position, and says whether their histories agree with no violations.
async fn settle_order(checks: &[Mutex<OrderCheck>]) -> Option<bool> {
    let deadline = Instant::now() + PHASE_TIMEOUT;
    loop {
        let mut violations = 0;
        let mut positions = Vec::with_capacity(checks.len());
        for check in checks {
            let check = check.lock().ok()?;
            violations += check.violations;
            positions.push(check.position());
        }
        if let Some(same) = agree(&positions) {
            return Some(same && violations == 0);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// As [`measure`], through the library's facade: every member is a [`cohort::group::Group`],
/// started one after another with the ones before as contacts; the flood is one task per
/// member awaiting `send` in a loop (the facade's back-pressure). No packet probe.
async fn measure_facade(
    args: &BenchArgs,
    gear: &str,
    shards: Option<&Shards>,
) -> Result<Measurement, String> {
    use cohort::group::{self as facade, Event, Group};
    let provider = CryptoProvider::default_provider();
    let n = args.members;
    let identities = (0..n)
        .map(|_| Identity::generate(&provider).map_err(|e| format!("keygen: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let trust: Vec<MemberId> = identities.iter().map(|i| MemberId(i.public())).collect();
    let default_backlog = GroupConfig::new("bench", Vec::new()).backlog_limit;
    let payload = (args.size + facade::frag::HEADER).clamp(DEFAULT_MAX_MESSAGE_LEN, 16 * 1024);
    let delivered: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let took: Arc<std::sync::Mutex<Vec<Duration>>> = Arc::default();
    let mut groups: Vec<Group> = Vec::with_capacity(n);
    let mut pumps = Vec::with_capacity(n);
    let started = Instant::now();
    for (index, identity) in identities.into_iter().enumerate() {
        let mut builder = facade::GroupConfig::builder("bench")
            .identity(identity)
            .listen(SocketAddr::from(([127, 0, 0, 1], 0)))
            .trust(trust.iter().copied())
            .gear(gear)
            .max_datagram_payload(payload as u64);
        for g in &groups {
            builder = builder.peer(g.local_addr());
        }
        if let Some(window) = args.send_window {
            builder = builder
                .send_window(window as u64)
                .backlog(default_backlog.max(window * 4) as u64);
        }
        let config = builder.build().map_err(|e| e.to_string())?;
        let _shard = shards.map(|s| s.for_member(index).enter());
        let (group, mut events) = Group::start(config).map_err(|e| e.to_string())?;
        let (counter, took) = (delivered.clone(), took.clone());
        pumps.push(tokio::spawn(async move {
            while let Some(event) = events.next().await {
                match event {
                    Event::Deliver {
                        channel: Channel::Reliable,
                        ..
                    } => {
                        if let Some(c) = counter.get(index) {
                            c.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Event::Rekeyed { took: Some(t), .. } => {
                        if let Ok(mut took) = took.lock() {
                            took.push(t);
                        }
                    }
                    _ => {}
                }
            }
        }));
        groups.push(group);
    }
    let common = |groups: &[Group]| -> Option<View> {
        let first = groups.first()?.view()?;
        groups
            .iter()
            .all(|g| g.view().as_ref() == Some(&first))
            .then_some(first)
    };
    wait_for(&groups, &format!("one view of {n}"), |g| {
        common(g).is_some_and(|v| v.members.len() == n)
    })
    .await?;
    let view_ms = started.elapsed().as_secs_f64() * 1e3;
    let view = common(&groups).ok_or("the view vanished")?;
    let leader = groups
        .iter()
        .position(|g| g.id() == view.leader().id)
        .ok_or("the leader is not one of the bench's members")?;

    let mut rekey_ms = Vec::new();
    let mut rekey_took_ms = Vec::new();
    for _ in 0..args.rekeys {
        let epoch = groups
            .iter()
            .filter_map(|g| g.view().map(|v| v.key_epoch))
            .max()
            .unwrap_or(0);
        let took_before = took.lock().map(|t| t.len()).unwrap_or(0);
        let t0 = Instant::now();
        groups[leader].rekey().await.map_err(|e| e.to_string())?;
        wait_for(&groups, "a rekey at every member", |g| {
            g.iter().all(|g| {
                g.view()
                    .is_some_and(|v| v.key_epoch > epoch && v.members.len() == n)
            })
        })
        .await?;
        rekey_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        if let Some(t) = took.lock().ok().and_then(|t| t.get(took_before).copied()) {
            rekey_took_ms.push(t.as_secs_f64() * 1e3);
        }
    }

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut floods = Vec::new();
    for (i, group) in groups.iter().enumerate() {
        if args.followers_only && i == leader && n > 1 {
            continue;
        }
        let (group, stop, data) = (group.clone(), stop.clone(), vec![0xa5u8; args.size]);
        floods.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if group.send(Channel::Reliable, data.clone()).await.is_err() {
                    break;
                }
            }
        }));
    }
    if args.warmup > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(args.warmup)).await;
    }
    let view_before = common(&groups).map(|v| v.id);
    let before = counts(&delivered);
    let cpu_before = process_cpu();
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(args.seconds)).await;
    let cpu_s = process_cpu()
        .zip(cpu_before)
        .map(|(after, before)| after.saturating_sub(before).as_secs_f64());
    let count = smallest_gain(&before, &counts(&delivered));
    let elapsed = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let view_after = common(&groups).map(|v| v.id);
    let smallest_view = groups
        .iter()
        .map(|g| g.view().map_or(0, |v| v.members.len()))
        .min()
        .unwrap_or(0);
    let msgs_per_sec = count as f64 / elapsed;
    for group in &groups {
        let _ = tokio::time::timeout(Duration::from_secs(3), group.leave()).await;
    }
    for task in floods.into_iter().chain(pumps) {
        let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
    }
    Ok(Measurement {
        view_ms,
        msgs_per_sec,
        mbit_per_sec: msgs_per_sec * args.size as f64 * 8.0 / 1e6,
        overhead_ordered: None,
        overhead_unreliable: None,
        overhead_submit: None,
        rekey_ms,
        rekey_bytes: Vec::new(),
        rekey_took_ms,
        rekey_cpu_ms: Vec::new(),
        rekey_runq_ms: Vec::new(),
        cpu_s,
        order_ok: None,
        view_held: view_before.is_some() && view_before == view_after,
        smallest_view,
        udp: None,
    })
}

/// Polls the members' views every millisecond until `done` holds (the facade keeps
/// `view()` current): view and rekey times are up to 1 ms late.
async fn wait_for(
    groups: &[cohort::group::Group],
    what: &str,
    done: impl Fn(&[cohort::group::Group]) -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + PHASE_TIMEOUT;
    while !done(groups) {
        if Instant::now() > deadline {
            return Err(format!("no {what} within {PHASE_TIMEOUT:?}"));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

impl Watch {
    /// Waits for member `who`'s probe report; the overhead is the most common size among
    /// the datagrams at least as large as the payload, minus the payload (`None` if the
    /// send produced no such datagram, for example because the core batches messages).
    /// The inner error is a refused send, worth retrying.
    async fn until_probe(&mut self, who: usize) -> Result<Result<Option<usize>, String>, String> {
        let deadline = tokio::time::Instant::now() + PHASE_TIMEOUT;
        loop {
            let (i, event) = tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .map_err(|_| "no probe report".to_string())?
                .ok_or("the members stopped")?;
            match self.apply(i, event) {
                Some(ShellEvent::Probe { payload, packets }) if i == who => {
                    let mut sizes: Vec<usize> = packets
                        .iter()
                        .map(|(_, size)| *size)
                        .filter(|s| *s >= payload)
                        .collect();
                    sizes.sort_unstable();
                    let mode = sizes
                        .chunk_by(|a, b| a == b)
                        .max_by_key(|run| run.len())
                        .and_then(|run| run.first());
                    return Ok(Ok(mode.map(|size| size - payload)));
                }
                Some(ShellEvent::SendFailed(e)) if i == who => return Ok(Err(e)),
                _ => {}
            }
        }
    }
}

fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    // Nearest rank.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted.get(rank.min(sorted.len()) - 1).copied()
}

/// `--rekey` as configured: `one-message`, `tree (degree D)` or `lkh (degree D)`.
fn rekey_name(args: &BenchArgs) -> String {
    match args.rekey.method(args.degree) {
        RekeyMethod::OneMessage => "one-message".into(),
        RekeyMethod::Tree { degree } => format!("tree (degree {degree})"),
        RekeyMethod::Lkh { degree } => format!("lkh (degree {degree})"),
    }
}

fn sorted(values: &[f64]) -> Vec<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

fn report(
    args: &BenchArgs,
    shards: Option<usize>,
    m: &Measurement,
    baseline: Option<&Measurement>,
) {
    let rekeys = sorted(&m.rekey_ms);
    let took = sorted(&m.rekey_took_ms);
    let ratio = baseline.map(|b| {
        if b.msgs_per_sec > 0.0 {
            m.msgs_per_sec / b.msgs_per_sec
        } else {
            0.0
        }
    });
    if args.json {
        let mut out = json!({
            "members": args.members,
            "size": args.size,
            "gear": args.gear,
            "seconds": args.seconds,
            "runtime": args.runtime.name(),
            "shards": shards,
            "via": if args.facade { "facade" } else { "core" },
            "bundle_bytes": args.bundle,
            "join": format!("{:?}", args.join).to_lowercase(),
            "rekey": rekey_name(args),
            "udp_batching": format!("{:?}", cohort_net::batch::Batching::from_env()),
            "view_ms": m.view_ms,
            "msgs_per_sec": m.msgs_per_sec,
            "mbit_per_sec": m.mbit_per_sec,
            "counted": "delivered at every member (smallest per-member count)",
            "warmup_seconds": args.warmup,
            "cpu_seconds": m.cpu_s,
            "cpu_per_wall": m.cpu_s.map(|c| c / args.seconds),
            "order_ok": m.order_ok,
            "view_held": m.view_held,
            "smallest_view": m.smallest_view,
            "overhead_bytes": m.overhead_ordered,
            "overhead_submit_bytes": m.overhead_submit,
            "overhead_unreliable_bytes": m.overhead_unreliable,
            "udp": m.udp.as_ref().map(udp_json),
        });
        if args.rekeys > 0 {
            out["rekeys"] = json!(args.rekeys);
            out["rekey_ms_median"] = json!(percentile(&rekeys, 50.0));
            out["rekey_ms_p90"] = json!(percentile(&rekeys, 90.0));
            out["rekey_ms_max"] = json!(rekeys.last());
            out["rekey_took_ms_median"] = json!(percentile(&took, 50.0));
            out["rekey_cpu_ms_median"] = json!(percentile(&sorted(&m.rekey_cpu_ms), 50.0));
            out["rekey_runq_wait_ms_median"] = json!(percentile(&sorted(&m.rekey_runq_ms), 50.0));
            out["rekey_ms_each"] = json!(m.rekey_ms);
            out["rekey_bytes_median"] = json!(percentile(&sorted(&m.rekey_bytes), 50.0));
            out["rekey_bytes_each"] = json!(m.rekey_bytes);
            out["rekey_bytes_counted"] = json!(
                "received by every member from the rekey until all held the new key, \
                 heartbeats meanwhile included"
            );
            out["rekey_runq_wait_ms_each"] = json!(m.rekey_runq_ms);
        }
        if let (Some(b), Some(ratio)) = (baseline, ratio) {
            out["baseline_msgs_per_sec"] = json!(b.msgs_per_sec);
            out["baseline_mbit_per_sec"] = json!(b.mbit_per_sec);
            out["baseline_overhead_bytes"] = json!(b.overhead_ordered);
            out["baseline_view_held"] = json!(b.view_held);
            out["baseline_order_ok"] = json!(b.order_ok);
            out["baseline_cpu_seconds"] = json!(b.cpu_s);
            out["baseline_udp"] = json!(b.udp.as_ref().map(udp_json));
            out["ratio"] = json!(ratio);
        }
        println!("{out}");
        return;
    }
    let bytes = |o: Option<usize>| o.map_or("not measured".to_string(), |b| format!("{b} bytes"));
    println!(
        "cohort group bench: {} members on loopback, {}-byte messages, gear {}, {} s, {} runtime, through the {}",
        args.members,
        args.size,
        args.gear,
        args.seconds,
        match shards {
            Some(k) => format!("{} ({k} shards)", args.runtime.name()),
            None => args.runtime.name().to_string(),
        },
        if args.facade { "cohort::group facade" } else { "protocol core" }
    );
    println!(
        "  UDP: batching {:?}, bundles {}",
        cohort_net::batch::Batching::from_env(),
        if args.facade {
            "as the facade's config says".to_string()
        } else if args.bundle == 0
            || cohort_net::batch::Batching::from_env() == cohort_net::batch::Batching::Off
        {
            "off".to_string()
        } else {
            format!(
                "up to {} bytes",
                args.bundle.min(cohort_net::bundle::MAX_BUNDLE_BYTES)
            )
        }
    );
    println!(
        "  one view of {} after     {:.0} ms ({})",
        args.members,
        m.view_ms,
        match args.join {
            Forming::All => "every member started at once, every other as a contact",
            Forming::Founder => "the first member founded, the rest joined through it",
        }
    );
    let cpu = |r: &Measurement| {
        r.cpu_s.map_or("CPU time not known".to_string(), |c| {
            format!("process CPU {:.2} s per s", c / args.seconds)
        })
    };
    let order = |r: &Measurement| match r.order_ok {
        Some(true) => "one total order at every member",
        Some(false) => "ORDER CHECK FAILED",
        None => "order not checked",
    };
    println!(
        "  reliable, delivered at every member: {:.0} msgs/s, {:.1} Mbit/s of payload ({}; {}; after {} s of warm-up)",
        m.msgs_per_sec,
        m.mbit_per_sec,
        cpu(m),
        order(m),
        args.warmup
    );
    for (name, run) in [("", Some(m)), ("baseline ", baseline)] {
        if let Some(run) = run.filter(|r| !r.view_held) {
            println!(
                "  WARNING: the {name}view of {} did not hold while sending (smallest view at the end: {}): members fell behind and were removed",
                args.members, run.smallest_view
            );
        }
    }
    println!(
        "  overhead per data packet: {} sequenced, {} submitted, {} unreliable",
        bytes(m.overhead_ordered),
        bytes(m.overhead_submit),
        bytes(m.overhead_unreliable)
    );
    if args.rekeys > 0 {
        let ms = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2} ms"));
        println!(
            "  rekey ({}x), until every member has the new key: median {}, p90 {}, max {}",
            args.rekeys,
            ms(percentile(&rekeys, 50.0)),
            ms(percentile(&rekeys, 90.0)),
            ms(rekeys.last().copied())
        );
        println!(
            "  rekey ({}), the leader's own measure (took): median {}",
            rekey_name(args),
            ms(percentile(&took, 50.0))
        );
        if let Some(b) = percentile(&sorted(&m.rekey_bytes), 50.0) {
            println!(
                "  rekey, bytes every member received until all held the new key (heartbeats \
                 meanwhile included): median {:.1} KiB",
                b / 1024.0
            );
        }
        println!(
            "  rekey, the process's threads summed: on CPU median {}, waiting in a run queue median {}",
            ms(percentile(&sorted(&m.rekey_cpu_ms), 50.0)),
            ms(percentile(&sorted(&m.rekey_runq_ms), 50.0))
        );
    }
    for (name, run) in [("", Some(m)), ("baseline, ", baseline)] {
        if let Some(udp) = run.and_then(|r| r.udp.as_ref()) {
            println!(
                "  {name}UDP over the counted seconds, all members: {}",
                udp_text(udp)
            );
        }
    }
    if let (Some(b), Some(ratio)) = (baseline, ratio) {
        println!(
            "  baseline, gear none: {:.0} msgs/s, {:.1} Mbit/s ({}; {}); ratio {ratio:.2}",
            b.msgs_per_sec,
            b.mbit_per_sec,
            cpu(b),
            order(b)
        );
    }
}

/// Packets per datagram, if any datagram was counted.
fn per_datagram(packets: u64, datagrams: u64) -> Option<f64> {
    (datagrams > 0).then(|| packets as f64 / datagrams as f64)
}

/// The counts as the bench's JSON gives them (every member's socket together).
fn udp_json(c: &BundleCounts) -> serde_json::Value {
    json!({
        "datagrams_sent": c.datagrams_sent,
        "packets_sent": c.packets_sent_total(),
        "bundles_sent": c.sent,
        "packets_in_bundles_sent": c.packets_sent,
        "packets_per_datagram_sent": per_datagram(c.packets_sent_total(), c.datagrams_sent),
        "datagrams_received": c.datagrams_received,
        "packets_received": c.packets_received_total(),
        "bundles_received": c.received,
        "packets_in_bundles_received": c.packets_received,
        "malformed_bundles": c.malformed,
    })
}

/// The counts in one line of text.
fn udp_text(c: &BundleCounts) -> String {
    let ratio = |p, d| per_datagram(p, d).map_or("-".to_string(), |r| format!("{r:.2}"));
    format!(
        "sent {} packets in {} datagrams ({} per datagram; {} bundles carried {}), received {} packets in {} datagrams ({} bundles carried {}), {} malformed bundles",
        c.packets_sent_total(),
        c.datagrams_sent,
        ratio(c.packets_sent_total(), c.datagrams_sent),
        c.sent,
        c.packets_sent,
        c.packets_received_total(),
        c.datagrams_received,
        c.received,
        c.packets_received,
        c.malformed
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let v = sorted(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(percentile(&v, 50.0), Some(3.0));
        assert_eq!(percentile(&v, 90.0), Some(5.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[7.0], 90.0), Some(7.0));
    }
}
