//! `cohort group run|bench|ctl`: secure process groups over real UDP, as thin layers over the
//! library's [`cohort::group`] facade.
//!
//! ```text
//!   stdin JSON lines ──▶ reader thread ──▶ command worker ──▶ ┐
//!   1 s tick (drop counters) ───────────────────────────────▶ ├─ Group (cohort::group)
//!   SIGINT / SIGTERM, end of stdin (leave, exit) ───────────▶ ┘   │ member task, UDP socket
//!   control socket (--ctl, cohort::group_ctl) ──────────────▶ ┘   │
//!   stdout JSON lines ◀── one per event ◀── Events::next ◀────────┘
//! ```
//!
//! `run` is one member (see [`cohort::group::GroupConfig`] for its file and [`json`] for its
//! lines); `bench` runs many members in one process and measures them (see
//! [`bench`](mod@bench)); `many` runs several members of several configs in one process,
//! each with its own command and event files (see [`many`](mod@many)).

mod bench;
mod bench_check;
#[cfg(feature = "nats")]
mod bench_nats;
mod bench_shards;
pub mod json;
mod many;
pub mod shell;

use crate::jsonl;
use crate::UsageError;
use clap::{Args, Subcommand};
use cohort::group::{Group, GroupConfig, MemberId};
use cohort_crypto::CryptoProvider;
use cohort_group::DropCounters;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::mpsc;

/// `cohort group ...`
#[derive(Subcommand)]
pub enum GroupCommand {
    /// Run one member over UDP: JSON-line events on stdout, JSON-line commands on stdin.
    Run(RunArgs),
    /// Run N members on loopback in this process and measure throughput, rekeys and
    /// packet overhead.
    Bench(bench::BenchArgs),
    /// Control a running member through its control socket (`group run --ctl PATH`).
    Ctl(crate::group_ctl_cmd::CtlArgs),
    /// Run several members in this process, one config each: member `DIR/X.toml` reads
    /// JSON-line commands from `DIR/X.in` and writes timed JSON-line events to `DIR/X.out`.
    Many(many::ManyArgs),
}

/// `cohort group run`.
#[derive(Args)]
pub struct RunArgs {
    /// The member's configuration file (TOML; see the README).
    #[arg(long)]
    config: PathBuf,
    /// Listen on this address instead of the file's `listen`.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Serve a control socket at this path (`cohort group ctl`) instead of the file's
    /// `ctl`. With a control socket the member runs as a daemon: the end of standard input
    /// does not leave the group.
    #[arg(long)]
    ctl: Option<PathBuf>,
    /// With a control socket: leave the group and exit when standard input ends anyway.
    /// (Without one, the end of standard input always leaves.)
    #[arg(long)]
    exit_on_eof: bool,
    /// Serve Prometheus metrics over HTTP at this address (`GET /metrics`) instead of the
    /// file's `metrics`.
    #[arg(long)]
    metrics: Option<SocketAddr>,
}

/// Runs a `cohort group` command.
pub fn run(command: GroupCommand) -> Result<(), UsageError> {
    match command {
        GroupCommand::Run(args) => run_member(&args),
        GroupCommand::Bench(args) => bench::run(&args),
        GroupCommand::Ctl(args) => crate::group_ctl_cmd::run(&args),
        GroupCommand::Many(args) => many::run(&args),
    }
}

/// Longest command line read; longer lines are answered with an error and skipped. A
/// 16 MiB message is 22.4 MB of base64.
const MAX_LINE: usize = 24 << 20;

/// A fresh 32-byte seed from the operating system (the library's [`cohort::os_seed`]).
pub fn os_seed(provider: &CryptoProvider) -> Result<[u8; 32], UsageError> {
    cohort::os_seed(provider).map_err(|e| UsageError(e.to_string()))
}

fn run_member(args: &RunArgs) -> Result<(), UsageError> {
    let mut config = GroupConfig::load(&args.config).map_err(|e| UsageError(e.to_string()))?;
    if let Some(addr) = args.listen {
        config.set_listen(addr);
    }
    if args.ctl.is_some() {
        config.set_ctl(args.ctl.clone());
    }
    // One member is one socket and one task: a single thread is enough.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| UsageError(format!("cannot start the runtime: {e}")))?;
    runtime.block_on(serve(config, args.exit_on_eof, args.metrics))
}

/// Writes one JSON line and flushes it. A closed stdout means nobody listens: exit.
fn emit(value: &Value) {
    if jsonl::write_line(value).is_err() {
        std::process::exit(0);
    }
}

/// Binds the control socket (before the member starts, so a socket in use fails first).
fn bind_ctl(path: &Path) -> Result<cohort::group_ctl::CtlBinding, UsageError> {
    cohort::group_ctl::bind(path).map_err(|e| UsageError(format!("ctl {}: {e}", path.display())))
}

/// Binds the metrics endpoint: the command line's address, else the file's `metrics`.
async fn bind_metrics(
    flag: Option<SocketAddr>,
    config: &GroupConfig,
) -> Result<Option<cohort::group_metrics::MetricsBinding>, UsageError> {
    let addr = match (flag, config.metrics()) {
        (Some(addr), _) => addr,
        (None, Some(text)) => text
            .parse()
            .map_err(|e| UsageError(format!("config error: metrics: {text:?}: {e}")))?,
        (None, None) => return Ok(None),
    };
    cohort::group_metrics::GroupMetrics::bind(addr)
        .await
        .map(Some)
        .map_err(|e| UsageError(format!("metrics {addr}: {e}")))
}

async fn serve(
    config: GroupConfig,
    exit_on_eof: bool,
    metrics_flag: Option<SocketAddr>,
) -> Result<(), UsageError> {
    let ctl = config.ctl();
    // Everything that can fail at start-up fails before the member starts.
    let ctl_binding = match &ctl {
        Some(path) => Some(bind_ctl(path)?),
        None => None,
    };
    let metrics_binding = bind_metrics(metrics_flag, &config).await?;
    let (group, mut events) = Group::connect(config)
        .await
        .map_err(|e| UsageError(e.to_string()))?;
    let metrics = metrics_binding.map(|binding| binding.start(group.clone()));
    let ctl_server = ctl_binding.map(|binding| binding.start(group.clone()));
    emit(&json::started(&group.id(), group.local_addr()));

    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate())
        .map_err(|e| UsageError(format!("cannot watch SIGTERM: {e}")))?;
    let mut interrupt = signal(SignalKind::interrupt())
        .map_err(|e| UsageError(format!("cannot watch SIGINT: {e}")))?;

    // Standard input's commands run one after another on their own task, so a send that
    // waits for the window holds back the commands behind it (and the reading of standard
    // input), never the events printed here.
    let leave_on_eof = ctl.is_none() || exit_on_eof;
    tokio::spawn(worker(
        group.clone(),
        jsonl::commands(MAX_LINE, json::parse_command),
        leave_on_eof,
        std::sync::Arc::new(emit),
    ));
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_dropped = DropCounters::default();
    let leave = |group: &Group| {
        let group = group.clone();
        tokio::spawn(async move { group.leave().await });
    };

    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(event) => {
                    if let Some(metrics) = &metrics {
                        metrics.observe(&event);
                    }
                    emit(&json::facade_event(&event));
                }
                // The member stopped: it left (or its socket failed).
                None => break,
            },
            _ = tick.tick() => {
                if let Ok(stats) = group.stats().await {
                    if stats.status.dropped != last_dropped {
                        emit(&json::dropped(&stats.status.dropped));
                        last_dropped = stats.status.dropped;
                    }
                }
            }
            _ = interrupt.recv() => leave(&group),
            _ = terminate.recv() => leave(&group),
        }
    }
    if let Some(server) = ctl_server {
        // A `leave` through the socket gets its answer before the process exits.
        server.close(Duration::from_secs(1)).await;
    }
    Ok(())
}

/// Where a member's answers and error lines go: standard output, or (`group many`) its
/// own file.
type Emit = std::sync::Arc<dyn Fn(&Value) + Send + Sync>;

/// Runs standard input's commands in order, answering through `emit`; at its end, leaves
/// if `leave_on_eof`.
async fn worker(
    group: Group,
    mut stdin: mpsc::Receiver<Result<json::Command, Value>>,
    leave_on_eof: bool,
    emit: Emit,
) {
    while let Some(line) = stdin.recv().await {
        let command = match line {
            Ok(command) => command,
            Err(error_line) => {
                emit(&error_line);
                continue;
            }
        };
        match command {
            json::Command::Send { channel, data } => {
                if let Err(e) = group.send(channel, data).await {
                    emit(&jsonl::error(Some("send"), &e.to_string()));
                }
            }
            json::Command::Rekey => {
                if let Err(e) = group.rekey().await {
                    emit(&jsonl::error(Some("rekey"), &e.to_string()));
                }
            }
            json::Command::Status => match group.stats().await {
                Ok(stats) => {
                    let mut line = json::status(&stats.status);
                    line["queued"] = stats.queued.into();
                    emit(&line);
                }
                Err(e) => emit(&jsonl::error(Some("status"), &e.to_string())),
            },
            json::Command::Leave => {
                let _ = group.leave().await;
                return;
            }
            json::Command::Trust { add, remove } => {
                let result = async {
                    let mut trust: Vec<MemberId> = group
                        .trust()
                        .await?
                        .into_iter()
                        .filter(|t| !remove.contains(t))
                        .collect();
                    for a in add {
                        if !trust.contains(&a) && !remove.contains(&a) {
                            trust.push(a);
                        }
                    }
                    group.set_trust(trust).await
                }
                .await;
                if let Err(e) = result {
                    emit(&jsonl::error(Some("trust"), &e.to_string()));
                }
            }
        }
    }
    if leave_on_eof {
        let _ = group.leave().await;
    }
}
