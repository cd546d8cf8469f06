//! `cohort group bench --transport nats`: the same group run twice in one process, once
//! over a NATS broker (one publish per broadcast, the broker fans out) and once over UDP
//! fan-out (one datagram per member), through the library's facade, and the ratio.
//!
//! Each run: N members (the first founds, the others join through it) until one view of N;
//! then the leader keeps its reliable send window full for S seconds. Every message carries
//! its send time; every member records the delay to its delivery. Reported per transport:
//! messages delivered per second at the slowest member, datagrams (publishes over NATS) and
//! bytes the sender sent per message and all members together, the median and p99 delivery
//! latency over every member, and for NATS the broker's own CPU share (from
//! /proc/PID/stat) when the bench started the broker itself (it does unless `--nats` names
//! one). Over NATS the members share one connection, as `cohort group many` does (the
//! broker sends each broadcast to the process once), unless `--nats-per-member` gives each
//! its own (the broker then writes one copy per member).

use crate::UsageError;
use cohort::group::local_nats::LocalNatsServer;
use cohort::group::{Channel, Event, Events, Group, GroupConfig, MemberId, NatsLinks};
use cohort_channel::identity::Identity;
use cohort_crypto::CryptoProvider;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Most members this bench runs.
pub const MAX_MEMBERS: usize = 1024;
/// How long the view may take to form.
const VIEW_TIMEOUT: Duration = Duration::from_secs(180);
/// Latency samples kept per member.
const SAMPLES: usize = 50_000;

/// What the bench needs from the command line.
pub struct NatsBench<'a> {
    /// Members in the group.
    pub members: usize,
    /// Payload bytes per message (at least 8: the send time).
    pub size: usize,
    /// Seconds of sending.
    pub seconds: f64,
    /// The gear.
    pub gear: &'a str,
    /// A broker to use instead of starting one.
    pub nats: Option<&'a str>,
    /// A NATS connection per member, instead of one for the process.
    pub per_member: bool,
    /// One JSON object instead of text.
    pub json: bool,
}

/// One transport's numbers.
struct Run {
    transport: &'static str,
    view_s: f64,
    msgs_per_sec: f64,
    sent: u64,
    sender_datagrams: f64,
    sender_bytes: f64,
    all_datagrams: f64,
    all_bytes: f64,
    median_ms: f64,
    p99_ms: f64,
    view_held: bool,
    broker_cpu: Option<f64>,
    process_cpu: f64,
}

/// CPU seconds (user and system) of process `pid` so far.
fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Runs the bench: NATS, then UDP, in this process.
pub fn run(b: &NatsBench) -> Result<(), UsageError> {
    if !(2..=MAX_MEMBERS).contains(&b.members) {
        return Err(UsageError(format!(
            "--members must be 2 to {MAX_MEMBERS} with --transport nats, not {}",
            b.members
        )));
    }
    if b.size < 8 {
        return Err(UsageError(
            "--size must be at least 8 bytes (the send time)".into(),
        ));
    }
    let broker = match b.nats {
        Some(_) => None,
        None => Some(
            LocalNatsServer::start(&[], Duration::from_secs(10))
                .map_err(|e| UsageError(format!("{e} (is nats-server installed?)")))?,
        ),
    };
    let url = b
        .nats
        .map(str::to_string)
        .or_else(|| broker.as_ref().map(LocalNatsServer::url))
        .unwrap_or_default();
    let broker_pid = broker.as_ref().map(|x| x.pid().to_string());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| UsageError(format!("cannot start the runtime: {e}")))?;
    let nats = runtime
        .block_on(measure(b, Some(&url), broker_pid.as_deref()))
        .map_err(|e| UsageError(format!("group bench over NATS: {e}")))?;
    if !b.json {
        // Printed at once: the UDP run at hundreds of members may not form.
        print_run(b, &nats);
    }
    drop(broker);
    let udp = runtime
        .block_on(measure(b, None, None))
        .map_err(|e| UsageError(format!("group bench over UDP: {e}")))?;
    report(b, &nats, &udp);
    Ok(())
}

fn config(
    b: &NatsBench,
    identity: Identity,
    trust: &[MemberId],
    index: usize,
    nats: Option<&str>,
    leader: Option<SocketAddr>,
) -> Result<GroupConfig, String> {
    let listen = match nats {
        // Over NATS the address is a name: unique, never bound.
        Some(_) => SocketAddr::from(([127, 0, 0, 1], 20_000 + index as u16)),
        None => SocketAddr::from(([127, 0, 0, 1], 0)),
    };
    let mut builder = GroupConfig::builder("bench")
        .identity(identity)
        .listen(listen)
        .trust(trust.iter().copied())
        .gear(b.gear)
        .heartbeat(Duration::from_millis(200))
        .suspect_timeout(Duration::from_secs(5))
        .flush_timeout(Duration::from_secs(2))
        .max_datagram_payload(b.size.max(1400) as u64)
        .event_queue(1 << 20);
    if let Some(url) = nats {
        builder = builder.nats([url]);
    }
    if let Some(leader) = leader {
        builder = builder.peer(leader);
    }
    builder.build().map_err(|e| e.to_string())
}

/// Per member: its delivery count and latency samples (nanoseconds).
#[derive(Default)]
struct Tally {
    delivered: u64,
    samples: Vec<u64>,
}

async fn measure(
    b: &NatsBench<'_>,
    nats: Option<&str>,
    broker_pid: Option<&str>,
) -> Result<Run, String> {
    let provider = CryptoProvider::default_provider();
    let ids: Vec<Identity> = (0..b.members)
        .map(|_| Identity::generate(&provider).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let trust: Vec<MemberId> = ids.iter().map(|i| MemberId(i.public())).collect();
    let started = Instant::now();
    let mut groups: Vec<Group> = Vec::new();
    let mut streams: Vec<Events> = Vec::new();
    let links = NatsLinks::new();
    for (i, id) in ids.into_iter().enumerate() {
        let leader = groups.first().map(Group::local_addr);
        let config = config(b, id, &trust, i, nats, leader)?;
        let started = if b.per_member {
            Group::connect(config).await
        } else {
            Group::connect_sharing(config, &links).await
        };
        let (g, e) = started.map_err(|e| e.to_string())?;
        groups.push(g);
        streams.push(e);
    }
    let epoch = Instant::now();
    let tallies: Vec<Arc<Mutex<Tally>>> = (0..b.members).map(|_| Arc::default()).collect();
    let view_changed = Arc::new(AtomicBool::new(false));
    let full = Arc::new(tokio::sync::Barrier::new(b.members + 1));
    for (events, tally) in streams.into_iter().zip(&tallies) {
        tokio::spawn(read(
            events,
            tally.clone(),
            epoch,
            b.members,
            full.clone(),
            view_changed.clone(),
        ));
    }
    tokio::time::timeout(VIEW_TIMEOUT, full.wait())
        .await
        .map_err(|_| format!("no view of {} members within {VIEW_TIMEOUT:?}", b.members))?;
    view_changed.store(false, Ordering::Relaxed);
    let view_s = started.elapsed().as_secs_f64();
    // Settle the joins' rekeys and state answers before measuring.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let sender = &groups[0];
    let stats_before: Vec<_> = futures_stats(&groups).await?;
    let delivered_before: Vec<u64> = tallies
        .iter()
        .map(|t| t.lock().map_or(0, |t| t.delivered))
        .collect();
    for t in &tallies {
        if let Ok(mut t) = t.lock() {
            t.samples.clear();
        }
    }
    let broker_cpu0 = broker_pid.and_then(cpu_seconds);
    let self_cpu0 = cpu_seconds("self");
    let phase = Instant::now();
    let until = phase + Duration::from_secs_f64(b.seconds);
    let mut sent = 0u64;
    let mut payload = vec![0u8; b.size];
    while Instant::now() < until {
        let at = u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        payload[..8].copy_from_slice(&at.to_be_bytes());
        match tokio::time::timeout_at(
            (until).into(),
            sender.send(Channel::Reliable, payload.clone()),
        )
        .await
        {
            Ok(Ok(_)) => sent += 1,
            Ok(Err(e)) => return Err(format!("send: {e}")),
            Err(_) => break,
        }
    }
    // Let what is in flight arrive; count only up to the end of the phase plus this grace.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let wall = phase.elapsed().as_secs_f64();
    let broker_cpu = match (broker_pid.and_then(cpu_seconds), broker_cpu0) {
        (Some(a), Some(b0)) => Some((a - b0) / wall),
        _ => None,
    };
    let process_cpu = match (cpu_seconds("self"), self_cpu0) {
        (Some(a), Some(b0)) => (a - b0) / wall,
        _ => 0.0,
    };
    let stats_after = futures_stats(&groups).await?;
    let slowest = tallies
        .iter()
        .zip(&delivered_before)
        .map(|(t, before)| t.lock().map_or(0, |t| t.delivered) - before)
        .min()
        .unwrap_or(0);
    let mut samples: Vec<u64> = tallies
        .iter()
        .flat_map(|t| t.lock().map(|t| t.samples.clone()).unwrap_or_default())
        .collect();
    samples.sort_unstable();
    let pct = |p: f64| {
        if samples.is_empty() {
            0.0
        } else {
            let i = ((samples.len() - 1) as f64 * p / 100.0).round() as usize;
            samples[i] as f64 / 1e6
        }
    };
    let per = |x: u64| {
        if sent == 0 {
            0.0
        } else {
            x as f64 / sent as f64
        }
    };
    let diff =
        |f: fn(&cohort::group::Stats) -> u64, i: usize| f(&stats_after[i]) - f(&stats_before[i]);
    let all =
        |f: fn(&cohort::group::Stats) -> u64| (0..groups.len()).map(|i| diff(f, i)).sum::<u64>();
    let run = Run {
        transport: if nats.is_some() { "nats" } else { "udp" },
        view_s,
        msgs_per_sec: slowest as f64 / wall,
        sent,
        sender_datagrams: per(diff(|s| s.datagrams_sent, 0)),
        sender_bytes: per(diff(|s| s.datagram_bytes_sent, 0)),
        all_datagrams: per(all(|s| s.datagrams_sent)),
        all_bytes: per(all(|s| s.datagram_bytes_sent)),
        median_ms: pct(50.0),
        p99_ms: pct(99.0),
        view_held: !view_changed.load(Ordering::Relaxed),
        broker_cpu,
        process_cpu,
    };
    // Everyone leaves at once (one by one, each leave is a view change of its own); a
    // member that has not heard back stops after the facade's leave timeout anyway.
    let leaving: Vec<_> = groups
        .iter()
        .map(|g| {
            let g = g.clone();
            tokio::spawn(async move { g.leave().await })
        })
        .collect();
    for l in leaving {
        let _ = tokio::time::timeout(Duration::from_secs(3), l).await;
    }
    Ok(run)
}

async fn futures_stats(groups: &[Group]) -> Result<Vec<cohort::group::Stats>, String> {
    let mut out = Vec::with_capacity(groups.len());
    for g in groups {
        out.push(g.stats().await.map_err(|e| e.to_string())?);
    }
    Ok(out)
}

/// Reads one member's events: counts deliveries and their delays; passes the barrier once
/// its view holds every member; notes later view changes.
async fn read(
    mut events: Events,
    tally: Arc<Mutex<Tally>>,
    epoch: Instant,
    n: usize,
    full: Arc<tokio::sync::Barrier>,
    view_changed: Arc<AtomicBool>,
) {
    let mut waiting = Some(full);
    while let Some(event) = events.next().await {
        match event {
            Event::Deliver {
                channel: Channel::Reliable,
                data,
                ..
            } => {
                let Some(at) = data.first_chunk::<8>() else {
                    continue;
                };
                let delay = u64::try_from(epoch.elapsed().as_nanos())
                    .unwrap_or(u64::MAX)
                    .saturating_sub(u64::from_be_bytes(*at));
                if let Ok(mut t) = tally.lock() {
                    t.delivered += 1;
                    if t.samples.len() < SAMPLES {
                        t.samples.push(delay);
                    }
                }
            }
            Event::View(view) => {
                if view.members.len() == n {
                    if let Some(barrier) = waiting.take() {
                        let _ = barrier.wait().await;
                    }
                } else if waiting.is_none() {
                    view_changed.store(true, Ordering::Relaxed);
                }
            }
            _ => {}
        }
    }
}

fn report(b: &NatsBench, nats: &Run, udp: &Run) {
    let ratio = if udp.msgs_per_sec > 0.0 {
        nats.msgs_per_sec / udp.msgs_per_sec
    } else {
        0.0
    };
    let one = |r: &Run| {
        json!({
            "transport": r.transport,
            "view_s": r.view_s,
            "msgs_per_sec": r.msgs_per_sec,
            "sent": r.sent,
            "sender_datagrams_per_msg": r.sender_datagrams,
            "sender_bytes_per_msg": r.sender_bytes,
            "all_datagrams_per_msg": r.all_datagrams,
            "all_bytes_per_msg": r.all_bytes,
            "latency_median_ms": r.median_ms,
            "latency_p99_ms": r.p99_ms,
            "view_held": r.view_held,
            "broker_cpu": r.broker_cpu,
            "process_cpu": r.process_cpu,
        })
    };
    if b.json {
        println!(
            "{}",
            json!({
                "members": b.members,
                "size": b.size,
                "gear": b.gear,
                "seconds": b.seconds,
                "nats_connections": connections(b),
                "nats": one(nats),
                "udp": one(udp),
                "nats_over_udp": ratio,
            })
        );
        return;
    }
    print_run(b, udp);
    println!("  nats/udp: {ratio:.2}x");
}

/// Whether the NATS run's members share a connection: `process` or `member`.
fn connections(b: &NatsBench) -> &'static str {
    if b.per_member {
        "member"
    } else {
        "process"
    }
}

/// One transport's line (the first one also says what ran).
fn print_run(b: &NatsBench, r: &Run) {
    if r.transport == "nats" {
        println!(
            "group bench: {} members, {} bytes, gear {}, {} s, NATS connections: one per {}; the leader sends",
            b.members,
            b.size,
            b.gear,
            b.seconds,
            connections(b)
        );
    }
    println!(
        "  {:<4}: {:>9.0} msgs/s delivered (slowest member), view in {:.1} s{}; sender {:.1} datagrams {:.0} bytes/msg, all members {:.1} datagrams {:.0} bytes/msg; latency median {:.2} ms p99 {:.2} ms; this process {:.0}% CPU{}",
        r.transport,
        r.msgs_per_sec,
        r.view_s,
        if r.view_held { "" } else { " (the view changed while sending)" },
        r.sender_datagrams,
        r.sender_bytes,
        r.all_datagrams,
        r.all_bytes,
        r.median_ms,
        r.p99_ms,
        r.process_cpu * 100.0,
        r.broker_cpu
            .map(|c| format!(", broker {:.0}% CPU", c * 100.0))
            .unwrap_or_default(),
    );
}
