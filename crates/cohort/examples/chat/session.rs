//! The chat loop: lines from the input go to the group's reliable channel; the group's
//! events come out as lines. Generic over its input and output, so that `main.rs` runs it on
//! the terminal and `tests/examples_chat.rs` runs it in memory. Owns nothing else.

use cohort::group::{Channel, Event, Group, MemberId, View};
use std::io;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};

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
pub async fn run<R, W>(
    group: Group,
    mut events: cohort::group::Events,
    input: R,
    mut out: W,
) -> io::Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    // The view itself comes next as an event.
    group.join().await.map_err(io::Error::other)?;
    let line = format!("* joined as {}\n", short(&group.id()));
    out.write_all(line.as_bytes()).await?;
    out.flush().await?;
    let mut lines = input.lines();
    loop {
        tokio::select! {
            line = lines.next_line() => match line? {
                Some(l) if l.trim() == "/quit" => break,
                Some(l) if l.is_empty() => {}
                Some(l) => {
                    if let Err(e) = group.send(Channel::Reliable, l.into_bytes()).await {
                        out.write_all(format!("* not sent: {e}\n").as_bytes()).await?;
                    }
                }
                None => break,
            },
            event = events.next() => {
                let Some(event) = event else { break };
                let text = match event {
                    Event::Deliver { sender, data, .. } => {
                        format!("[{}] {}", short(&sender), String::from_utf8_lossy(&data))
                    }
                    Event::View(v) => describe(&v),
                    Event::Removed { member, reason } => {
                        format!("* {} removed ({})", short(&member), reason.name())
                    }
                    Event::Lost { count } => format!("* {count} events lost (reader too slow)"),
                    Event::Expelled { reason } => {
                        let line = format!("* out of the group ({})\n", reason.name());
                        out.write_all(line.as_bytes()).await?;
                        break;
                    }
                    _ => continue,
                };
                out.write_all(text.as_bytes()).await?;
                out.write_all(b"\n").await?;
                out.flush().await?;
            }
        }
    }
    group.leave().await.map_err(io::Error::other)?;
    out.flush().await
}
