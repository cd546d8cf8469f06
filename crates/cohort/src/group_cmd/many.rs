//! `cohort group many`: several members, one config each, in one process (issue 15: a few
//! processes carry hundreds of members across namespaces). Each member is what `group run`
//! makes of its config, with its lines moved from the process's standard streams to files
//! beside its config: member `DIR/X.toml` reads its JSON-line commands from `DIR/X.in`
//! (normally a fifo the driver holds open; its end makes the member leave) and writes its
//! JSON-line events to `DIR/X.out`, each line with one more field, `t`: the wall-clock time
//! it was written (Unix seconds), so that a driver can time view changes across members.
//!
//! Owns: the multi-member process. Must not hold the line formats ([`super::json`]) nor
//! what one member does with its commands ([`super::worker`]). No control socket and no
//! metrics endpoint here: those stay with `group run`.

use super::{json, worker, Emit, MAX_LINE};
use crate::jsonl;
use crate::UsageError;
use clap::Args;
use cohort::group::{Events, Group, GroupConfig};
use cohort_group::DropCounters;
use serde_json::Value;
use std::fs::File;
use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `cohort group many`.
#[derive(Args)]
pub struct ManyArgs {
    /// A member's configuration file (repeat for each member): member `DIR/X.toml` reads
    /// commands from `DIR/X.in` and writes events to `DIR/X.out`.
    #[arg(long = "config", required = true)]
    configs: Vec<PathBuf>,
}

/// Runs every member of `args` until all of them have stopped (SIGINT or SIGTERM makes
/// each leave; so does the end of its `.in`).
pub fn run(args: &ManyArgs) -> Result<(), UsageError> {
    // The members share one thread: a process of many members is meant to share the cores
    // with its siblings, not to claim them all.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| UsageError(format!("cannot start the runtime: {e}")))?;
    runtime.block_on(serve(&args.configs))
}

/// `DIR/X.toml` -> (`DIR/X.in`, `DIR/X.out`).
fn io_paths(config: &Path) -> (PathBuf, PathBuf) {
    (config.with_extension("in"), config.with_extension("out"))
}

/// A member's `.out`: one JSON line per write, with its time.
fn file_emitter(path: &Path) -> Result<Emit, UsageError> {
    let file = File::create(path).map_err(|e| UsageError(format!("{}: {e}", path.display())))?;
    let file = Mutex::new(file);
    Ok(Arc::new(move |value: &Value| {
        let mut value = value.clone();
        if let Value::Object(map) = &mut value {
            let t = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            map.insert("t".into(), t.into());
        }
        let mut line = value.to_string();
        line.push('\n');
        if let Ok(mut file) = file.lock() {
            // A full disk loses lines of this member only; the member goes on.
            let _ = file.write_all(line.as_bytes());
        }
    }))
}

async fn serve(configs: &[PathBuf]) -> Result<(), UsageError> {
    // Every config is read before any member starts, and every member connected before
    // any runs: a bad one fails the start with one line naming its file.
    let loaded = configs
        .iter()
        .map(|path| {
            GroupConfig::load(path)
                .map(|config| (path, config))
                .map_err(|e| UsageError(format!("{}: {e}", path.display())))
        })
        .collect::<Result<Vec<_>, _>>()?;
    for (path, _) in &loaded {
        // Without its command file a member would read the end of its input at once and
        // leave: refuse instead.
        let (input, _) = io_paths(path);
        if !input.exists() {
            return Err(UsageError(format!(
                "{}: missing (the member's commands: make it a fifo with mkfifo)",
                input.display()
            )));
        }
    }
    let mut members = Vec::with_capacity(configs.len());
    // Over NATS the members share a connection per set of servers and credentials: the
    // broker then sends the process each broadcast once.
    #[cfg(feature = "nats")]
    let links = cohort::group::NatsLinks::new();
    for (path, config) in loaded {
        let (input, output) = io_paths(path);
        let emit = file_emitter(&output)?;
        #[cfg(feature = "nats")]
        let started = Group::connect_sharing(config, &links).await;
        #[cfg(not(feature = "nats"))]
        let started = Group::connect(config).await;
        let (group, events) =
            started.map_err(|e| UsageError(format!("{}: {e}", path.display())))?;
        emit(&json::started(&group.id(), group.local_addr()));
        members.push((group, events, input, emit));
    }

    let mut loops = tokio::task::JoinSet::new();
    let mut groups = Vec::with_capacity(members.len());
    for (group, events, input, emit) in members {
        let commands = jsonl::commands_from(
            move || File::open(&input).map(BufReader::new),
            MAX_LINE,
            json::parse_command,
        );
        tokio::spawn(worker(group.clone(), commands, true, emit.clone()));
        groups.push(group.clone());
        loops.spawn(events_loop(group, events, emit));
    }

    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate())
        .map_err(|e| UsageError(format!("cannot watch SIGTERM: {e}")))?;
    let mut interrupt = signal(SignalKind::interrupt())
        .map_err(|e| UsageError(format!("cannot watch SIGINT: {e}")))?;
    loop {
        tokio::select! {
            done = loops.join_next() => if done.is_none() { break },
            _ = interrupt.recv() => leave_all(&groups),
            _ = terminate.recv() => leave_all(&groups),
        }
    }
    Ok(())
}

fn leave_all(groups: &[Group]) {
    for group in groups {
        let group = group.clone();
        tokio::spawn(async move { group.leave().await });
    }
}

/// One member's events into its `.out` (and its drop counters once a second when they
/// change), until the member stops.
async fn events_loop(group: Group, mut events: Events, emit: Emit) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_dropped = DropCounters::default();
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(event) => emit(&json::facade_event(&event)),
                None => return,
            },
            _ = tick.tick() => {
                if let Ok(stats) = group.stats().await {
                    if stats.status.dropped != last_dropped {
                        emit(&json::dropped(&stats.status.dropped));
                        last_dropped = stats.status.dropped;
                    }
                }
            }
        }
    }
}
