//! `cohort group run|bench`: secure process groups over real UDP.
//!
//! ```text
//!   stdin JSON lines ──▶ reader thread ──▶ ┐
//!   1 s tick (drop counters) ────────────▶ ├─ main task ── closures ──▶ cohort-net driver
//!   SIGINT / SIGTERM (leave, exit) ──────▶ ┘      ▲                        │ Shell<GroupMember>
//!   stdout JSON lines ◀── one per event ─────────┴──── events + replies ◀─┘ UDP socket
//! ```
//!
//! `run` is one member (see [`config`] for its file and [`json`] for its lines); `bench`
//! runs many members in one process and measures them (see [`bench`](mod@bench)).

mod bench;
pub mod config;
pub mod json;
pub mod shell;

use crate::jsonl;
use crate::UsageError;
use clap::{Args, Subcommand};
use cohort_core::Timestamp;
use cohort_crypto::CryptoProvider;
use cohort_group::{DropCounters, GroupEvent, GroupMember, MemberId, RemovalReason};
use serde_json::Value;
use shell::{Shell, ShellEvent};
use std::net::SocketAddr;
use std::path::PathBuf;
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
    /// Leave the group and exit when standard input ends (by default the member keeps
    /// running until it is told to leave or gets SIGINT/SIGTERM).
    #[arg(long)]
    exit_on_eof: bool,
}

/// Runs a `cohort group` command.
pub fn run(command: GroupCommand) -> Result<(), UsageError> {
    match command {
        GroupCommand::Run(args) => run_member(&args),
        GroupCommand::Bench(args) => bench::run(&args),
    }
}

/// How long `leave` waits for the member to confirm before the process exits anyway.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest command line read; longer lines are answered with an error and skipped.
const MAX_LINE: usize = 64 * 1024;

/// A fresh 32-byte seed for a member's randomness, from the operating system.
pub fn os_seed(provider: &CryptoProvider) -> Result<[u8; 32], UsageError> {
    let mut seed = [0u8; 32];
    provider
        .random
        .fill(&mut seed)
        .map_err(|e| UsageError(format!("no randomness from the operating system: {e}")))?;
    Ok(seed)
}

fn run_member(args: &RunArgs) -> Result<(), UsageError> {
    let provider = CryptoProvider::default_provider();
    let setup = config::load(&provider, &args.config, args.listen)
        .map_err(|e| UsageError(e.to_string()))?;
    // One member is one socket and one task: a single thread is enough.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| UsageError(format!("cannot start the runtime: {e}")))?;
    runtime.block_on(serve(provider, setup, args.exit_on_eof))
}

/// Writes one JSON line and flushes it. A closed stdout means nobody listens: exit.
fn emit(value: &Value) {
    if jsonl::write_line(value).is_err() {
        std::process::exit(0);
    }
}

type Commands = mpsc::Sender<cohort_net::Command<Shell<GroupMember>>>;

/// Hands `f` to the driver; false (with an error line) if the driver cannot take it now.
fn command(
    commands: &Commands,
    cmd: &str,
    f: impl FnOnce(&mut Shell<GroupMember>, Timestamp) + Send + 'static,
) -> bool {
    match commands.try_send(Box::new(f)) {
        Ok(()) => true,
        Err(mpsc::error::TrySendError::Full(_)) => {
            emit(&jsonl::error(
                Some(cmd),
                "busy: the member's command queue is full",
            ));
            false
        }
        Err(mpsc::error::TrySendError::Closed(_)) => {
            emit(&jsonl::error(Some(cmd), "the member has stopped"));
            false
        }
    }
}

async fn serve(
    provider: CryptoProvider,
    setup: config::MemberSetup,
    exit_on_eof: bool,
) -> Result<(), UsageError> {
    let socket = cohort_net::bind_udp(setup.listen)
        .map_err(|e| UsageError(format!("cannot listen on {}: {e}", setup.listen)))?;
    let local = socket
        .local_addr()
        .map_err(|e| UsageError(format!("cannot read the socket's address: {e}")))?;
    let seed = os_seed(&provider)?;
    let member = GroupMember::new(provider, setup.credentials, local, setup.config, seed)
        .map_err(|e| UsageError(format!("config error: {e}")))?;
    emit(&json::started(&member.id(), local));

    let cohort_net::Driver {
        commands,
        mut events,
        task,
    } = cohort_net::spawn(Shell::new(member), socket);
    let peers = setup.peers;
    command(&commands, "start", move |s, now| {
        s.member_mut().start(now, &peers)
    });

    let mut stdin = jsonl::commands(MAX_LINE, json::parse_command);
    let mut stdin_open = true;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_dropped = DropCounters::default();
    let mut leave_deadline: Option<tokio::time::Instant> = None;
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate())
        .map_err(|e| UsageError(format!("cannot watch SIGTERM: {e}")))?;
    let mut interrupt = signal(SignalKind::interrupt())
        .map_err(|e| UsageError(format!("cannot watch SIGINT: {e}")))?;

    let leave = |commands: &Commands, deadline: &mut Option<tokio::time::Instant>| {
        if deadline.is_none() && command(commands, "leave", |s, now| s.member_mut().leave(now)) {
            *deadline = Some(tokio::time::Instant::now() + LEAVE_TIMEOUT);
        }
    };

    loop {
        tokio::select! {
            event = events.recv() => match event {
                Some(ShellEvent::Group(event)) => {
                    emit(&json::event(&event));
                    if leave_deadline.is_some()
                        && event == (GroupEvent::Expelled { reason: RemovalReason::Left })
                    {
                        break;
                    }
                }
                Some(ShellEvent::SendFailed(error)) => emit(&jsonl::error(Some("send"), &error)),
                Some(ShellEvent::Status(status, queued)) => {
                    let mut line = json::status(&status);
                    line["queued"] = queued.into();
                    emit(&line);
                }
                Some(ShellEvent::Counters(counters)) => {
                    if counters != last_dropped {
                        emit(&json::dropped(&counters));
                        last_dropped = counters;
                    }
                }
                Some(ShellEvent::Probe { .. }) => {}
                None => break,
            },
            input = stdin.recv(), if stdin_open => match input {
                Some(line) => match line {
                    Ok(json::Command::Send { channel, data }) => {
                        command(&commands, "send", move |s, now| s.send(now, channel, data));
                    }
                    Ok(json::Command::Rekey) => {
                        command(&commands, "rekey", |s, now| s.member_mut().rekey(now));
                    }
                    Ok(json::Command::Status) => {
                        command(&commands, "status", |s, _| {
                            let status = s.member().status();
                            let queued = s.queued();
                            s.reply(ShellEvent::Status(Box::new(status), queued));
                        });
                    }
                    Ok(json::Command::Leave) => leave(&commands, &mut leave_deadline),
                    Ok(json::Command::Trust { add, remove }) => {
                        command(&commands, "trust", move |s, now| {
                            let m = s.member_mut();
                            let mut trust: Vec<MemberId> = m
                                .trust()
                                .iter()
                                .copied()
                                .filter(|t| !remove.contains(t))
                                .collect();
                            for a in add {
                                if !trust.contains(&a) && !remove.contains(&a) {
                                    trust.push(a);
                                }
                            }
                            m.set_trust(now, trust);
                        });
                    }
                    Err(line) => emit(&line),
                },
                None => {
                    stdin_open = false;
                    if exit_on_eof {
                        leave(&commands, &mut leave_deadline);
                    }
                }
            },
            _ = tick.tick() => {
                // Best effort: a busy driver skips a report, the next tick catches up.
                let _ = commands.try_send(Box::new(|s: &mut Shell<GroupMember>, _| {
                    let counters = *s.member().counters();
                    s.reply(ShellEvent::Counters(counters));
                }));
            }
            () = sleep_until(leave_deadline) => break,
            _ = interrupt.recv() => leave(&commands, &mut leave_deadline),
            _ = terminate.recv() => leave(&commands, &mut leave_deadline),
        }
    }
    drop(commands);
    match tokio::time::timeout(Duration::from_secs(1), task).await {
        Ok(Ok(Err(e))) => Err(UsageError(format!("the UDP socket failed: {e}"))),
        _ => Ok(()),
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
