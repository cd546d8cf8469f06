//! `cohort group ctl`: the client of a running member's control socket
//! ([`cohort::group_ctl`]). One request per invocation; the answer is printed for people
//! (tables and `key=value` lines) or, with `--json`, as the member's JSON object.
//!
//! ```text
//!   cohort group ctl --socket S CMD ──one JSON line──▶ S ──▶ cohort group run --ctl S
//!        stdout ◀── table / key=value / JSON ◀── one JSON line ◀──┘
//! ```
//!
//! Anything that keeps the request from being answered (no such socket, nobody listening,
//! a socket that closes at once or answers something that is not this protocol, no answer
//! in time) and a refused request are one line on stderr and exit status 2.

use crate::hop_cmd::ctl::{render_counters, render_fields, scalar};
use crate::UsageError;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use clap::{Args, Subcommand, ValueEnum};
use cohort::group_ctl::PROTOCOL;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long the client waits for an answer (the member itself gives up on a command after
/// [`cohort::group_ctl::COMMAND_TIMEOUT`]).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// `cohort group ctl`.
#[derive(Args)]
pub struct CtlArgs {
    /// The member's control socket (`cohort group run --ctl PATH`).
    #[arg(long)]
    socket: PathBuf,
    /// Print the member's answer as one JSON object.
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    command: CtlCommand,
}

/// Which channel a message goes on.
#[derive(Clone, Copy, ValueEnum)]
pub enum ChannelArg {
    /// Atomic, totally ordered, virtually synchronous.
    Reliable,
    /// Best effort.
    Unreliable,
}

/// What to ask the member.
#[derive(Subcommand)]
pub enum CtlCommand {
    /// Id, address, view and counters.
    Status,
    /// The current view: id, leader, key epoch, members.
    View,
    /// The current view's members, by rank.
    Members,
    /// Send one message to the group (DATA as text, or standard input when DATA is left
    /// out; up to 16 MiB).
    Send {
        /// The channel.
        #[arg(long, value_enum, default_value = "reliable")]
        channel: ChannelArg,
        /// DATA is base64, not text.
        #[arg(long)]
        base64: bool,
        /// The message (default: all of standard input).
        data: Option<String>,
    },
    /// Ask for a fresh group key now (the leader runs the rekey).
    Rekey,
    /// Show the trusted principals (ed25519:<hex> or kdc:<name>), or change them; members
    /// no longer trusted are removed from the group.
    Trust {
        /// Replace the whole list with these (`--set` alone: trust nobody).
        #[arg(long, num_args = 0..)]
        set: Option<Vec<String>>,
        /// Trust this principal too (repeatable).
        #[arg(long)]
        add: Vec<String>,
        /// Stop trusting this principal (repeatable).
        #[arg(long)]
        remove: Vec<String>,
    },
    /// Leave the group; the member's process exits once the leave is done.
    Leave,
}

/// Runs `cohort group ctl`.
pub fn run(args: &CtlArgs) -> Result<(), UsageError> {
    let request = request(&args.command)?;
    let answer = ask(&args.socket, &request)?;
    if let Some(e) = answer.get("error").and_then(Value::as_str) {
        return Err(UsageError(format!("the member refused: {e}")));
    }
    let mut shown = answer.clone();
    if let Value::Object(map) = &mut shown {
        map.remove("ctl");
    }
    let out = if args.json {
        format!("{shown}\n")
    } else {
        render(&args.command, &shown)
    };
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(UsageError(format!("cannot write to standard output: {e}")))
        }
        _ => Ok(()),
    }
}

/// The request line for `command`.
fn request(command: &CtlCommand) -> Result<Value, UsageError> {
    Ok(match command {
        CtlCommand::Status => json!({"cmd": "status"}),
        CtlCommand::View => json!({"cmd": "view"}),
        CtlCommand::Members => json!({"cmd": "members"}),
        CtlCommand::Rekey => json!({"cmd": "rekey"}),
        CtlCommand::Leave => json!({"cmd": "leave"}),
        CtlCommand::Trust { set, add, remove } => {
            let mut r = json!({"cmd": "trust"});
            if let Some(set) = set {
                r["set"] = json!(set);
            }
            if !add.is_empty() {
                r["add"] = json!(add);
            }
            if !remove.is_empty() {
                r["remove"] = json!(remove);
            }
            r
        }
        CtlCommand::Send {
            channel,
            base64,
            data,
        } => {
            let bytes = match (data, base64) {
                (Some(text), false) => text.clone().into_bytes(),
                (Some(text), true) => BASE64
                    .decode(text.trim())
                    .map_err(|e| UsageError(format!("DATA is not base64: {e}")))?,
                (None, _) => {
                    let mut input = Vec::new();
                    std::io::stdin()
                        .take(cohort::group_ctl::MAX_REQUEST as u64)
                        .read_to_end(&mut input)
                        .map_err(|e| UsageError(format!("cannot read standard input: {e}")))?;
                    if *base64 {
                        BASE64
                            .decode(input.trim_ascii())
                            .map_err(|e| UsageError(format!("standard input is not base64: {e}")))?
                    } else {
                        input
                    }
                }
            };
            if bytes.len() > cohort::group::MAX_MESSAGE {
                return Err(UsageError(format!(
                    "the message is over the limit: {} bytes, at most {} (16 MiB)",
                    bytes.len(),
                    cohort::group::MAX_MESSAGE
                )));
            }
            let channel = match channel {
                ChannelArg::Reliable => "reliable",
                ChannelArg::Unreliable => "unreliable",
            };
            json!({"cmd": "send", "channel": channel, "data": BASE64.encode(bytes)})
        }
    })
}

/// Sends one request to the control socket at `path`; the member's answer. Every way this
/// can fail is a [`UsageError`] naming the socket.
pub fn ask(path: &Path, request: &Value) -> Result<Value, UsageError> {
    let shown = path.display();
    let mut stream = std::os::unix::net::UnixStream::connect(path).map_err(|e| {
        UsageError(format!(
            "cannot reach a group member on {shown}: {e} (is `cohort group run --ctl {shown}` running?)"
        ))
    })?;
    let io_err = |e: std::io::Error| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            UsageError(format!(
                "control socket {shown}: no answer within {} s",
                CLIENT_TIMEOUT.as_secs()
            ))
        } else {
            UsageError(format!("control socket {shown}: {e}"))
        }
    };
    stream
        .set_read_timeout(Some(CLIENT_TIMEOUT))
        .map_err(io_err)?;
    stream
        .set_write_timeout(Some(CLIENT_TIMEOUT))
        .map_err(io_err)?;
    // A peer that closes at once makes this write fail (EPIPE) or succeed into nothing;
    // either way the read below tells.
    let written = stream.write_all(format!("{request}\n").as_bytes());
    let mut line = String::new();
    let read = BufReader::new(stream.take(1024 * 1024)).read_line(&mut line);
    let closed = |e: &std::io::Error| {
        matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        )
    };
    match (read, written) {
        (Ok(0), _) | (Err(_), Err(_)) => {
            return Err(UsageError(format!(
                "control socket {shown} closed without an answer: not a cohort group member's control socket?"
            )))
        }
        (Err(e), Ok(())) if closed(&e) => {
            return Err(UsageError(format!(
                "control socket {shown} closed without an answer: not a cohort group member's control socket?"
            )))
        }
        (Err(e), Ok(())) => return Err(io_err(e)),
        (Ok(_), _) => {}
    }
    let foreign = || {
        UsageError(format!(
            "control socket {shown} does not speak {PROTOCOL}: not a cohort group member's control socket?"
        ))
    };
    let answer: Value = serde_json::from_str(&line).map_err(|_| foreign())?;
    if answer.get("ctl").and_then(Value::as_str) != Some(PROTOCOL) {
        return Err(foreign());
    }
    Ok(answer)
}

/// The answer to `command` for people.
fn render(command: &CtlCommand, answer: &Value) -> String {
    match command {
        CtlCommand::Status => {
            let mut out = format!("{}\n", render_fields(answer));
            out.push_str(&render_view(&answer["view"]));
            if let Value::Object(stats) = &answer["stats"] {
                out.push_str("\nstats (zero, false and unset left out; --json has all):\n");
                out.push_str(&render_counters(&without_zeros(&Value::Object(
                    stats.clone(),
                ))));
            }
            out
        }
        CtlCommand::View => render_view(&answer["view"]),
        CtlCommand::Members => render_members(&answer["members"]),
        CtlCommand::Send { .. } => format!("sent, seq {}\n", scalar(&answer["seq"])),
        CtlCommand::Rekey => "rekey requested\n".into(),
        CtlCommand::Trust { .. } => {
            let ids = answer["trusted"].as_array().cloned().unwrap_or_default();
            if ids.is_empty() {
                "trusting nobody\n".into()
            } else {
                let ids: Vec<String> = ids.iter().map(scalar).collect();
                format!("trusting {}\n", ids.join(" "))
            }
        }
        CtlCommand::Leave => "left the group\n".into(),
    }
}

/// A view: one line of fields, then its members.
fn render_view(view: &Value) -> String {
    if view.is_null() {
        return "no view yet\n".into();
    }
    let members: Vec<Value> = view["members"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .zip(view["addrs"].as_array().cloned().unwrap_or_default())
        .enumerate()
        .map(
            |(rank, (id, addr))| json!({"rank": rank, "id": id, "addr": addr, "leader": rank == 0}),
        )
        .collect();
    format!(
        "view {} (seq {}), key epoch {}, {} members\n{}",
        scalar(&view["view_id"]),
        scalar(&view["view_seq"]),
        scalar(&view["key_epoch"]),
        members.len(),
        render_members(&Value::Array(members))
    )
}

/// Members as an aligned table: RANK ID ADDR, the leader marked.
fn render_members(rows: &Value) -> String {
    let rows = rows.as_array().cloned().unwrap_or_default();
    if rows.is_empty() {
        return "(no members)\n".into();
    }
    let cells: Vec<[String; 3]> = rows
        .iter()
        .map(|r| {
            let lead = if r["leader"] == json!(true) {
                " (leader)"
            } else {
                ""
            };
            [
                scalar(&r["rank"]),
                format!("{}{lead}", scalar(&r["id"])),
                scalar(&r["addr"]),
            ]
        })
        .collect();
    let header = ["RANK".to_string(), "ID".into(), "ADDR".into()];
    let widths: Vec<usize> = (0..3)
        .map(|i| {
            cells
                .iter()
                .map(|c| c[i].len())
                .fold(header[i].len(), usize::max)
        })
        .collect();
    let line = |c: &[String; 3]| {
        format!(
            "{:<w0$}  {:<w1$}  {}",
            c[0],
            c[1],
            c[2],
            w0 = widths[0],
            w1 = widths[1]
        )
        .trim_end()
        .to_string()
            + "\n"
    };
    std::iter::once(&header).chain(&cells).map(line).collect()
}

/// `v` without the fields that are 0, false or null (objects left empty go too).
fn without_zeros(v: &Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), without_zeros(v)))
                .filter(|(_, v)| match v {
                    Value::Null | Value::Bool(false) => false,
                    Value::Number(n) => n.as_f64() != Some(0.0),
                    Value::Object(m) => !m.is_empty(),
                    _ => true,
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // reason: test code; a panic is the failure report
mod tests {
    use super::*;

    #[test]
    fn views_and_members_render_as_tables() {
        let view = json!({
            "view_id": "3@ab", "view_seq": 3, "key_epoch": 2,
            "members": ["ed25519:aa", "ed25519:bbbb"],
            "addrs": ["127.0.0.1:1", "127.0.0.1:22"],
        });
        assert_eq!(
            render_view(&view),
            "view 3@ab (seq 3), key epoch 2, 2 members\n\
             RANK  ID                   ADDR\n\
             0     ed25519:aa (leader)  127.0.0.1:1\n\
             1     ed25519:bbbb         127.0.0.1:22\n"
        );
        assert_eq!(render_view(&Value::Null), "no view yet\n");
        assert_eq!(render_members(&json!([])), "(no members)\n");
        assert_eq!(
            without_zeros(&json!({"a": 0, "b": {"c": 0}, "d": 2, "e": null, "f": "x", "g": false})),
            json!({"d": 2, "f": "x"})
        );
        assert_eq!(
            render_counters(&json!({"dropped": {"bad_tag": 2}, "queued": 0})),
            "dropped.bad_tag  2\nqueued           0\n"
        );
    }

    #[test]
    fn send_requests_carry_text_or_base64() {
        let r = request(&CtlCommand::Send {
            channel: ChannelArg::Unreliable,
            base64: false,
            data: Some("hi".into()),
        })
        .unwrap();
        assert_eq!(
            r,
            json!({"cmd": "send", "channel": "unreliable", "data": "aGk="})
        );
        let r = request(&CtlCommand::Send {
            channel: ChannelArg::Reliable,
            base64: true,
            data: Some("AAE=".into()),
        })
        .unwrap();
        assert_eq!(r["data"], "AAE=");
        let bad = request(&CtlCommand::Send {
            channel: ChannelArg::Reliable,
            base64: true,
            data: Some("!".into()),
        });
        assert!(bad.is_err());
    }
}
