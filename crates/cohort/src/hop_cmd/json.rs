//! The JSON `cohort hop run` speaks: event lines on standard output, command lines on
//! standard input (stdio mode), and the control socket's status answer. Payloads travel in
//! standard base64 (with padding).
//!
//! Events: `started`, `connected`, `connect_failed`, `disconnected` (a pair died or the
//! peer restarted: its associations are gone, the endpoint handshakes again by itself and
//! `connected` follows), `opened`, `closed`, `received`,
//! `report`, `renewed`, `round_abandoned`, `pair_learned` (relays), `counters` (when they
//! changed, at most once a second), `status`, `error`.
//!
//! Commands: `{"cmd":"send","data":"<base64>"[,"peer":"IP:PORT"][,"assoc":N]}` (without
//! `assoc`: the scheduler picks an open outgoing association), `{"cmd":"open"[,"peer":..]
//! [,"mode":"m:32"]}`, `{"cmd":"close","assoc":N[,"peer":..]}`, `{"cmd":"status"}`.
//! `peer` may be left out when the endpoint has exactly one peer.

pub use crate::jsonl::CommandError;
use crate::jsonl::{self, CommandLine};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use cohort_hop::{EndpointEvent, EndpointStatus, HopCounters, RelayEvent, RelayStatus};
use serde_json::{json, Value};
use std::net::SocketAddr;

/// One line for one endpoint event.
pub fn endpoint_event(event: &EndpointEvent) -> Value {
    match event {
        EndpointEvent::Connected { peer, key } => {
            json!({"event": "connected", "peer": peer.to_string(), "key": key.to_string()})
        }
        EndpointEvent::ConnectFailed { peer, reason } => {
            json!({"event": "connect_failed", "peer": peer.to_string(), "reason": reason})
        }
        EndpointEvent::Disconnected { peer, reason } => {
            json!({"event": "disconnected", "peer": peer.to_string(), "reason": reason})
        }
        EndpointEvent::Opened {
            peer,
            assoc,
            outgoing,
            mode,
        } => json!({
            "event": "opened",
            "peer": peer.to_string(),
            "assoc": assoc,
            "dir": dir(*outgoing),
            "mode": mode.to_string(),
        }),
        EndpointEvent::Closed {
            peer,
            assoc,
            outgoing,
        } => json!({
            "event": "closed",
            "peer": peer.to_string(),
            "assoc": assoc,
            "dir": dir(*outgoing),
        }),
        EndpointEvent::Received { peer, assoc, data } => json!({
            "event": "received",
            "peer": peer.to_string(),
            "assoc": assoc,
            "data": BASE64.encode(data),
        }),
        EndpointEvent::Report {
            peer,
            assoc,
            round,
            delivered,
        } => json!({
            "event": "report",
            "peer": peer.to_string(),
            "assoc": assoc,
            "round": round,
            "delivered": delivered,
        }),
        EndpointEvent::Renewed {
            peer,
            assoc,
            outgoing,
        } => json!({
            "event": "renewed",
            "peer": peer.to_string(),
            "assoc": assoc,
            "dir": dir(*outgoing),
        }),
        EndpointEvent::Stalled { peer, assoc, round } => json!({
            "event": "stalled",
            "peer": peer.to_string(),
            "assoc": assoc,
            "round": round,
        }),
        // An event kind added to the library after this writer: named, not dropped.
        other => crate::jsonl::other_event(other),
    }
}

/// One line for one relay event.
pub fn relay_event(event: &RelayEvent) -> Value {
    match event {
        RelayEvent::PairLearned {
            initiator,
            responder,
        } => json!({
            "event": "pair_learned",
            "initiator": initiator.to_string(),
            "responder": responder.to_string(),
        }),
        other => crate::jsonl::other_event(other),
    }
}

fn dir(outgoing: bool) -> &'static str {
    if outgoing {
        "out"
    } else {
        "in"
    }
}

/// Counters as an object of `name: count`.
pub fn counters(counters: &HopCounters) -> Value {
    jsonl::counts(counters.iter())
}

/// An endpoint's status: scalar fields, `peers`, a flat `associations` list (one row per
/// association, control association included), `counters`.
pub fn endpoint_status(status: &EndpointStatus) -> Value {
    let peers: Vec<Value> = status
        .peers
        .iter()
        .map(|p| {
            json!({
                "peer": p.addr.to_string(),
                "next_hop": p.next_hop.to_string(),
                "pair_id": hex::encode(p.pair_id),
                "initiator": p.initiator,
                "state": p.state,
                "key": p.key.map(|k| k.to_string()),
                "srtt_ms": p.srtt.map(|d| (d.as_secs_f64() * 1e4).round() / 10.0),
                "associations": p.associations.iter().filter(|a| a.id != 0).count(),
            })
        })
        .collect();
    let associations: Vec<Value> = status
        .peers
        .iter()
        .flat_map(|p| {
            p.associations.iter().map(move |a| {
                json!({
                    "peer": p.addr.to_string(),
                    "assoc": a.id,
                    "dir": dir(a.outgoing),
                    "mode": if a.id == 0 { "control".to_string() } else { a.mode.to_string() },
                    "open": a.open,
                    "rounds_left": a.rounds_left,
                    "elements_left": a.elements_left,
                    "queued": a.queued,
                    "messages": a.messages,
                    "window": a.window,
                    "in_flight": a.in_flight,
                })
            })
        })
        .collect();
    json!({
        "role": "endpoint",
        "listen": status.local.to_string(),
        "key": status.key.to_string(),
        "peers": peers,
        "associations": associations,
        "counters": counters(&status.counters),
    })
}

/// A relay's status: `pairs` (also as `associations`, so `hop ctl associations` shows what a
/// relay verifies) and `counters`.
pub fn relay_status(status: &RelayStatus) -> Value {
    let pairs: Vec<Value> = status
        .pairs
        .iter()
        .map(|p| {
            json!({
                "pair_id": hex::encode(p.pair_id),
                "initiator": p.initiator.to_string(),
                "responder": p.responder.to_string(),
                "flows": p.flows,
            })
        })
        .collect();
    json!({
        "role": "relay",
        "listen": status.local.to_string(),
        "pairs": pairs.len(),
        "associations": pairs,
        "counters": counters(&status.counters),
    })
}

/// The first line. `hop run` adds `tun` (the device's name) in TUN mode and `metrics` (the
/// bound metrics address, useful with port 0) when metrics are served.
pub fn started(role: &str, listen: SocketAddr, key: Option<String>, ctl: &str) -> Value {
    json!({"event": "started", "role": role, "listen": listen.to_string(), "key": key, "ctl": ctl})
}

/// A command read from standard input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Send `data` to `peer` on `assoc` (or any open outgoing association).
    Send {
        /// The peer; `None`: the only one.
        peer: Option<SocketAddr>,
        /// The association; `None`: the scheduler's choice.
        assoc: Option<u16>,
        /// The decoded payload.
        data: Vec<u8>,
    },
    /// Open an outgoing association.
    Open {
        /// The peer; `None`: the only one.
        peer: Option<SocketAddr>,
        /// The mode as written; `None`: the peer's configured mode.
        mode: Option<String>,
    },
    /// Close an association.
    Close {
        /// The peer; `None`: the only one.
        peer: Option<SocketAddr>,
        /// The association.
        assoc: u16,
    },
    /// Report the node's status.
    Status,
}

/// Parses one input line.
pub fn parse_command(line: &str) -> Result<Command, CommandError> {
    let line = CommandLine::parse(line)?;
    let allowed: Option<&[&str]> = match line.cmd.as_str() {
        "send" => Some(&["cmd", "peer", "assoc", "data"]),
        "open" => Some(&["cmd", "peer", "mode"]),
        "close" => Some(&["cmd", "peer", "assoc"]),
        "status" => Some(&["cmd"]),
        _ => None,
    };
    line.allow(allowed, "send, open, close, status")?;
    let fields = &line.fields;
    let peer = fields.opt_addr("peer").map_err(|e| line.fail(e))?;
    let assoc = match fields.get("assoc") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .filter(|&n| n >= 1)
                .ok_or_else(|| line.fail("\"assoc\" must be 1..=32767"))?,
        ),
    };
    match line.cmd.as_str() {
        "send" => {
            let data = fields.base64("data").map_err(|e| line.fail(e))?;
            Ok(Command::Send { peer, assoc, data })
        }
        "open" => {
            let mode = fields.opt_str("mode").map_err(|e| line.fail(e))?;
            Ok(Command::Open {
                peer,
                mode: mode.map(str::to_string),
            })
        }
        "close" => {
            let assoc = assoc.ok_or_else(|| line.fail("\"assoc\" must be 1..=32767"))?;
            Ok(Command::Close { peer, assoc })
        }
        _ => Ok(Command::Status),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // reason: test code; a panic is the failure report
mod tests {
    use super::*;

    #[test]
    fn commands_parse() {
        assert_eq!(
            parse_command(r#"{"cmd":"send","data":"aGk="}"#),
            Ok(Command::Send {
                peer: None,
                assoc: None,
                data: b"hi".to_vec()
            })
        );
        assert_eq!(
            parse_command(r#"{"cmd":"send","peer":"127.0.0.1:4","assoc":2,"data":""}"#),
            Ok(Command::Send {
                peer: Some("127.0.0.1:4".parse().unwrap()),
                assoc: Some(2),
                data: vec![]
            })
        );
        assert_eq!(
            parse_command(r#"{"cmd":"open","mode":"c:8"}"#),
            Ok(Command::Open {
                peer: None,
                mode: Some("c:8".into())
            })
        );
        assert_eq!(
            parse_command(r#"{"cmd":"close","assoc":3}"#),
            Ok(Command::Close {
                peer: None,
                assoc: 3
            })
        );
        assert_eq!(parse_command(r#"{"cmd":"status"}"#), Ok(Command::Status));
        for (line, cmd) in [
            ("", None),
            ("[]", None),
            (r#"{"cmd":1}"#, None),
            (r#"{"cmd":"fly"}"#, Some("fly")),
            (r#"{"cmd":"send"}"#, Some("send")),
            (r#"{"cmd":"send","data":"!!"}"#, Some("send")),
            (r#"{"cmd":"send","data":"","assoc":0}"#, Some("send")),
            (r#"{"cmd":"send","data":"","peer":"x"}"#, Some("send")),
            (r#"{"cmd":"close"}"#, Some("close")),
            (r#"{"cmd":"status","x":1}"#, Some("status")),
        ] {
            let e = parse_command(line).unwrap_err();
            assert_eq!(e.cmd.as_deref(), cmd, "{line}");
            assert_eq!(e.to_json()["event"], "error");
        }
    }
}
