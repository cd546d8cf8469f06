//! The glue between a `cohort::group::Group` and the store: commands from the input become
//! operations on the reliable channel, the group's events become `Replica` calls, and the
//! snapshot callback reads the replica. Owns no store logic (that is `store.rs`).

use crate::store::{Applied, Op, Replica, MAX_KEY_LEN};
use cohort::group::{Channel, Event, Events, Group, GroupConfig, MemberId, View};
use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// A replica shared between the event loop and the group's snapshot callback.
pub type Shared = Arc<Mutex<Replica>>;

/// Gives `config` the snapshot callback that state transfer calls, reading `replica`. The
/// group calls it from `Events::next` at a view boundary, after every earlier event was
/// returned; `run` applies each event before it asks for the next, so the snapshot is the
/// state those events built.
pub fn with_state_transfer(config: &mut GroupConfig, replica: &Shared) {
    let replica = replica.clone();
    config.set_snapshot(move || {
        Ok(replica
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .snapshot())
    });
}

/// A member id as the example prints it: the first 8 hex digits of its key.
pub fn short(id: &MemberId) -> String {
    hex::encode(&id.as_bytes()[..4])
}

fn describe(view: &View) -> String {
    let members: Vec<String> = view.members.iter().map(|m| short(&m.id)).collect();
    format!("* view {}: {}", view.id, members.join(" "))
}

/// One command line: `put KEY VALUE`, `del KEY`, `get KEY`, `dump`.
enum Command {
    Write(Op),
    Get(String),
    Dump,
}

fn parse(line: &str) -> Result<Command, String> {
    let line = line.trim_start();
    let (verb, rest) = line.split_once(' ').unwrap_or((line, ""));
    let (key, value) = rest
        .trim_start()
        .split_once(' ')
        .unwrap_or((rest.trim(), ""));
    let key = key.to_string();
    if matches!(verb, "put" | "del" | "get") && (key.is_empty() || key.len() > MAX_KEY_LEN) {
        return Err(format!("{verb}: a key of 1 to {MAX_KEY_LEN} bytes"));
    }
    match verb {
        "put" => Ok(Command::Write(Op::Put {
            key,
            value: value.as_bytes().to_vec(),
        })),
        "del" => Ok(Command::Write(Op::Delete { key })),
        "get" => Ok(Command::Get(key)),
        "dump" => Ok(Command::Dump),
        _ => Err("commands: put KEY VALUE | del KEY | get KEY | dump".into()),
    }
}

/// Runs one member of the store until the input ends, then leaves. Every line it prints is
/// one of: `* joined as ID`, `* view ...`, `* removed ID`, `state N keys clock C` (state
/// transfer), `merge sent N keys`, `ok put|del KEY @ C` (this member's write applied),
/// `applied put|del KEY by ID @ C`, `merged N keys from ID`, `KEY = VALUE`, `KEY not found`,
/// `dump N keys clock C` (after the pairs), `error: ...`.
///
/// The events are applied by a task of their own that only ever awaits `Events::next` to the
/// end: the snapshot callback runs inside `next` and needs every earlier event applied, and
/// a `select!` that dropped a pending `next` could drop the snapshot it was handing over.
pub async fn run<R, W>(
    group: Group,
    events: Events,
    replica: Shared,
    input: R,
    mut out: W,
) -> io::Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    // The view itself comes next as an event.
    group.join().await.map_err(io::Error::other)?;
    let me = group.id();
    let text = format!("* joined as {}\n", short(&me));
    out.write_all(text.as_bytes()).await?;
    out.flush().await?;
    let (tx, mut printed) = mpsc::unbounded_channel();
    tokio::spawn(apply_events(group.clone(), events, replica.clone(), tx));
    let mut lines = input.lines();
    // Both branches are cancel-safe: a line or a message not taken stays for the next turn.
    loop {
        let text = tokio::select! {
            line = lines.next_line() => {
                let Some(line) = line? else { break };
                command(&group, &replica, &line).await
            }
            text = printed.recv() => {
                // None: the event stream ended (the member is out of the group).
                let Some(text) = text else { break };
                text
            }
        };
        if !text.is_empty() {
            out.write_all(format!("{text}\n").as_bytes()).await?;
            out.flush().await?;
        }
    }
    group.leave().await.map_err(io::Error::other)?;
    // The stream ends after the leave's final event: print what is left.
    while let Some(text) = printed.recv().await {
        out.write_all(format!("{text}\n").as_bytes()).await?;
    }
    out.flush().await
}

/// Runs one command line; returns what to print.
async fn command(group: &Group, replica: &Shared, line: &str) -> String {
    if line.trim().is_empty() {
        return String::new();
    }
    let read = || replica.lock().unwrap_or_else(PoisonError::into_inner);
    match parse(line) {
        Err(e) => format!("error: {e}"),
        Ok(Command::Write(op)) => match group.send(Channel::Reliable, op.encode()).await {
            // `ok` is printed when the write comes back in the total order.
            Ok(_) => String::new(),
            Err(e) => format!("error: not sent: {e}"),
        },
        Ok(Command::Get(key)) => match read().store.get(&key) {
            Some(v) => format!("{key} = {}", String::from_utf8_lossy(v)),
            None => format!("{key} not found"),
        },
        Ok(Command::Dump) => {
            let r = read();
            let mut text = String::new();
            for (k, v) in r.store.iter() {
                text.push_str(&format!("{k} = {}\n", String::from_utf8_lossy(v)));
            }
            text.push_str(&format!(
                "dump {} keys clock {}",
                r.store.iter().count(),
                r.store.clock()
            ));
            text
        }
    }
}

/// Applies every event to the replica in order, sends the merges state transfer asks for,
/// and hands the lines to print to `printed`; until the stream ends or the member is out.
async fn apply_events(
    group: Group,
    mut events: Events,
    replica: Shared,
    printed: mpsc::UnboundedSender<String>,
) {
    let me = group.id();
    while let Some(event) = events.next().await {
        // Applied before the next call to `next`, which may call the snapshot callback.
        let Reaction {
            mut line,
            send,
            stop,
        } = on_event(&replica, me, event);
        if let Some(op) = send {
            if let Err(e) = group.send(Channel::Reliable, op.encode()).await {
                line.push_str(&format!("\nerror: merge not sent: {e}"));
            }
        }
        if (!line.is_empty() && printed.send(line).is_err()) || stop {
            break;
        }
    }
}

/// What the loop does after an event.
struct Reaction {
    /// The line to print (none if empty).
    line: String,
    /// An operation to send on the reliable channel.
    send: Option<Op>,
    /// The member is out of the group: stop.
    stop: bool,
}

/// Applies one event to the replica; says what to print and send.
fn on_event(replica: &Shared, me: MemberId, event: Event) -> Reaction {
    let mut r = replica.lock().unwrap_or_else(PoisonError::into_inner);
    let (line, send) = match event {
        Event::Deliver {
            channel: Channel::Reliable,
            sender,
            data,
            ..
        } => match r.on_deliver(*sender.as_bytes(), &data) {
            Ok(Applied::Wrote { key, stamp }) => {
                let verb = if r.store.get(&key).is_some() {
                    "put"
                } else {
                    "del"
                };
                if sender == me {
                    (format!("ok {verb} {key} @ {}", stamp.clock), None)
                } else {
                    let by = short(&sender);
                    (
                        format!("applied {verb} {key} by {by} @ {}", stamp.clock),
                        None,
                    )
                }
            }
            Ok(Applied::Merged { changed }) => (
                format!("merged {changed} keys from {}", short(&sender)),
                None,
            ),
            Err(e) => (format!("error: from {}: {e}", short(&sender)), None),
        },
        Event::State(bytes) => match r.on_state(&bytes) {
            Ok(merge) => {
                let mut line = format!(
                    "state {} keys clock {}",
                    r.store.iter().count(),
                    r.store.clock()
                );
                if let Some(Op::Merge(old)) = &merge {
                    line.push_str(&format!("\nmerge sent {} keys", old.iter().count()));
                }
                (line, merge)
            }
            Err(e) => (format!("error: state transfer: {e}"), None),
        },
        Event::StateUnavailable { reason } => (
            format!("error: no state transfer ({reason}): this copy may miss writes"),
            None,
        ),
        Event::View(v) => (describe(&v), None),
        Event::Merging { leader, .. } => (format!("* merging into {}", short(&leader)), None),
        Event::Removed { member, reason } => (
            format!("* {} removed ({})", short(&member), reason.name()),
            None,
        ),
        Event::Lost { count } => (
            format!("error: {count} events lost: this copy may miss writes; restart it"),
            None,
        ),
        Event::Expelled { reason } => {
            let line = format!("* out of the group ({})", reason.name());
            return Reaction {
                line,
                send: None,
                stop: true,
            };
        }
        _ => (String::new(), None),
    };
    Reaction {
        line,
        send,
        stop: false,
    }
}
