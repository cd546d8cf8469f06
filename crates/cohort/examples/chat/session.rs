//! The chat loop: lines from the input go to the group's reliable channel; the group's
//! events come out as lines. Generic over its input and output, so that `main.rs` runs it on
//! the terminal and `tests/examples_chat.rs` runs it in memory. Owns nothing else.
//!
//! The events are read by a task of their own that only ever awaits `Events::next` to the
//! end: a `select!` that dropped a pending `next` could drop the group's state-transfer
//! answer with it (`next` sends it to the member), and a joiner would wait for it.

use cohort::group::{Channel, Event, Events, Group, MemberId, View};
use std::io;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// A member id as the chat prints it: the first 8 hex digits of its key.
pub fn short(id: &MemberId) -> String {
    hex::encode(&id.as_bytes()[..4])
}

fn describe(view: &View) -> String {
    let members: Vec<String> = view.members.iter().map(|m| short(&m.id)).collect();
    format!("* view {}: {}", view.id, members.join(" "))
}

/// Runs the chat for `group` until the input ends (or a line is `/quit`), then leaves.
/// Prints `* joined as <id>` once the member is in a view, every delivery as
/// `[<sender>] <text>`, and every view, removal, lost-events signal and expulsion as one
/// `* ...` line.
pub async fn run<R, W>(group: Group, events: Events, input: R, mut out: W) -> io::Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    // The view itself comes next as an event.
    group.join().await.map_err(io::Error::other)?;
    let line = format!("* joined as {}\n", short(&group.id()));
    out.write_all(line.as_bytes()).await?;
    out.flush().await?;
    let (tx, mut printed) = mpsc::unbounded_channel();
    tokio::spawn(read_events(events, tx));
    let mut lines = input.lines();
    // Both branches are cancel-safe: a line or a message not taken stays for the next turn.
    loop {
        tokio::select! {
            line = lines.next_line() => match line? {
                Some(l) if l.trim() == "/quit" => break,
                Some(l) if l.is_empty() => {}
                Some(l) => {
                    if let Err(e) = group.send(Channel::Reliable, l.into_bytes()).await {
                        out.write_all(format!("* not sent: {e}\n").as_bytes()).await?;
                        out.flush().await?;
                    }
                }
                None => break,
            },
            text = printed.recv() => {
                // None: the event stream ended (the member is out of the group).
                let Some(text) = text else { break };
                out.write_all(format!("{text}\n").as_bytes()).await?;
                out.flush().await?;
            }
        }
    }
    group.leave().await.map_err(io::Error::other)?;
    // The stream ends after the leave's final event: print what is left.
    while let Some(text) = printed.recv().await {
        out.write_all(format!("{text}\n").as_bytes()).await?;
    }
    out.flush().await
}

/// Turns every event into the line to print, until the stream ends or the member is out.
async fn read_events(mut events: Events, printed: mpsc::UnboundedSender<String>) {
    while let Some(event) = events.next().await {
        let (text, last) = match event {
            Event::Deliver { sender, data, .. } => (
                format!("[{}] {}", short(&sender), String::from_utf8_lossy(&data)),
                false,
            ),
            Event::View(v) => (describe(&v), false),
            Event::Removed { member, reason } => (
                format!("* {} removed ({})", short(&member), reason.name()),
                false,
            ),
            Event::Lost { count } => (format!("* {count} events lost (reader too slow)"), false),
            Event::Expelled { reason } => (format!("* out of the group ({})", reason.name()), true),
            _ => continue,
        };
        if printed.send(text).is_err() || last {
            break;
        }
    }
}
