//! The JSON `cohort hop run` speaks: event lines on standard output, command lines on
//! standard input (stdio mode), and the control socket's status answer. Payloads travel in
//! standard base64 (with padding).
//!
//! Events: `started`, `connected`, `connect_failed`, `opened`, `closed`, `received`,
//! `report`, `renewed`, `round_abandoned`, `pair_learned` (relays), `counters` (when they
//! changed, at most once a second), `status`, `error`.
//!
//! Commands: `{"cmd":"send","data":"<base64>"[,"peer":"IP:PORT"][,"assoc":N]}` (without
//! `assoc`: the scheduler picks an open outgoing association), `{"cmd":"open"[,"peer":..]
//! [,"mode":"m:32"]}`, `{"cmd":"close","assoc":N[,"peer":..]}`, `{"cmd":"status"}`.
//! `peer` may be left out when the endpoint has exactly one peer.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use cohort_hop::{EndpointEvent, EndpointStatus, HopCounters, RelayEvent, RelayStatus};
use serde_json::{json, Map, Value};
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
    let map: Map<String, Value> = counters
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    Value::Object(map)
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

/// The first line.
pub fn started(role: &str, listen: SocketAddr, key: Option<String>, ctl: &str) -> Value {
    json!({"event": "started", "role": role, "listen": listen.to_string(), "key": key, "ctl": ctl})
}

/// An error answering a command (`cmd` is `None` when the line was not a command).
pub fn error(cmd: Option<&str>, error: &str) -> Value {
    json!({"event": "error", "cmd": cmd, "error": error})
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

/// Why a line is not a command: the command's name when it was known, and the problem.
#[derive(Debug, PartialEq, Eq)]
pub struct CommandError {
    /// The `cmd` field, if the line had a string one.
    pub cmd: Option<String>,
    /// What is wrong.
    pub error: String,
}

impl CommandError {
    /// The error line for it.
    pub fn to_json(&self) -> Value {
        error(self.cmd.as_deref(), &self.error)
    }
}

/// Parses one input line.
pub fn parse_command(line: &str) -> Result<Command, CommandError> {
    let fail = |cmd: Option<&str>, error: String| CommandError {
        cmd: cmd.map(str::to_string),
        error,
    };
    let value: Value =
        serde_json::from_str(line).map_err(|e| fail(None, format!("not JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(fail(None, "a command is a JSON object".into()));
    };
    let cmd = match map.get("cmd") {
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return Err(fail(None, "\"cmd\" must be a string".into())),
        None => return Err(fail(None, "missing \"cmd\"".into())),
    };
    let allowed: &[&str] = match cmd {
        "send" => &["cmd", "peer", "assoc", "data"],
        "open" => &["cmd", "peer", "mode"],
        "close" => &["cmd", "peer", "assoc"],
        "status" => &["cmd"],
        other => {
            return Err(fail(
                Some(other),
                "unknown command (send, open, close, status)".into(),
            ))
        }
    };
    if let Some(extra) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(fail(Some(cmd), format!("unknown field {extra:?}")));
    }
    let peer = match map.get("peer") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(
            s.parse::<SocketAddr>()
                .map_err(|e| fail(Some(cmd), format!("\"peer\" is not IP:PORT ({s:?}): {e}")))?,
        ),
        Some(_) => return Err(fail(Some(cmd), "\"peer\" must be a string".into())),
    };
    let assoc = match map.get("assoc") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .filter(|&n| n >= 1)
                .ok_or_else(|| fail(Some(cmd), "\"assoc\" must be 1..=32767".into()))?,
        ),
    };
    match cmd {
        "send" => {
            let data = map
                .get("data")
                .and_then(Value::as_str)
                .ok_or_else(|| fail(Some(cmd), "\"data\" must be a base64 string".into()))?;
            let data = BASE64
                .decode(data)
                .map_err(|e| fail(Some(cmd), format!("\"data\" is not base64: {e}")))?;
            Ok(Command::Send { peer, assoc, data })
        }
        "open" => {
            let mode = match map.get("mode") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(_) => return Err(fail(Some(cmd), "\"mode\" must be a string".into())),
            };
            Ok(Command::Open { peer, mode })
        }
        "close" => {
            let assoc =
                assoc.ok_or_else(|| fail(Some(cmd), "\"assoc\" must be 1..=32767".into()))?;
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
