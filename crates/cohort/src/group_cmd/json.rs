//! The JSON lines `cohort group run` speaks: events out on standard output, commands in on
//! standard input. Payloads travel in standard base64 (with padding).

pub use crate::jsonl::CommandError;
use crate::jsonl::{self, CommandLine};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use cohort_group::{Channel, DropCounters, GroupEvent, MemberId, Status, View};
use serde_json::{json, Map, Value};
use std::net::SocketAddr;

/// The first line: who this member is and where it listens.
pub fn started(id: &cohort_group::MemberId, listen: SocketAddr) -> Value {
    json!({"event": "started", "id": id.to_string(), "listen": listen.to_string()})
}

/// A view's fields (without `"event"`).
pub fn view_fields(view: &View) -> Map<String, Value> {
    let members: Vec<String> = view.ids().map(|m| m.to_string()).collect();
    let addrs: Vec<String> = view.members.iter().map(|m| m.addr.to_string()).collect();
    let mut map = Map::new();
    map.insert("view_id".into(), json!(view.id.to_string()));
    map.insert("view_seq".into(), json!(view.id.seq));
    map.insert("members".into(), json!(members));
    map.insert("addrs".into(), json!(addrs));
    map.insert(
        "leader".into(),
        json!(view.members.first().map(|m| m.id.to_string())),
    );
    map.insert("key_epoch".into(), json!(view.key_epoch));
    map
}

/// One line for one event of the member.
pub fn event(event: &GroupEvent) -> Value {
    match event {
        GroupEvent::View(view) => {
            let mut map = Map::new();
            map.insert("event".into(), json!("view"));
            map.extend(view_fields(view));
            Value::Object(map)
        }
        GroupEvent::Deliver {
            channel,
            sender,
            view,
            seq,
            order,
            data,
        } => json!({
            "event": "deliver",
            "channel": channel.name(),
            "sender": sender.to_string(),
            "view_id": view.to_string(),
            "seq": seq,
            "order": order,
            "data": BASE64.encode(data),
        }),
        GroupEvent::Rekeyed {
            key_epoch,
            members,
            took,
        } => json!({
            "event": "rekey",
            "key_epoch": key_epoch,
            "members": members,
            "took_ms": took.map(|d| d.as_secs_f64() * 1e3),
        }),
        GroupEvent::Removed { member, reason } => json!({
            "event": "removed",
            "member": member.to_string(),
            "reason": reason.name(),
        }),
        GroupEvent::Expelled { reason } => json!({"event": "expelled", "reason": reason.name()}),
        GroupEvent::Insecure { from } => json!({"event": "insecure", "from": from.to_string()}),
        GroupEvent::TicketSent { to } => json!({"event": "ticket_sent", "to": to.to_string()}),
        GroupEvent::KeyExchanged {
            from,
            key_epoch,
            rekey_dropped,
        } => json!({
            "event": "key_exchanged",
            "from": from.to_string(),
            "key_epoch": key_epoch,
            "rekey_dropped": rekey_dropped,
        }),
        GroupEvent::Merging { leader, into } => json!({
            "event": "merging",
            "leader": leader.to_string(),
            "into": into.to_string(),
        }),
        GroupEvent::Refused { addr, reason } => json!({
            "event": "refused",
            "addr": addr.to_string(),
            "reason": reason,
        }),
        GroupEvent::TrustChanged {
            trusted,
            untrusted_members,
        } => json!({
            "event": "trust_changed",
            "trusted": trusted,
            "untrusted_members": untrusted_members.iter().map(|m| m.to_string()).collect::<Vec<_>>(),
        }),
        // An event kind added to the library after this writer: named, not dropped.
        other => crate::jsonl::other_event(other),
    }
}

/// One line for one event of the library's facade: the member's events as [`event`]
/// writes them, and the facade's own (`state`, `state_unavailable`, `snapshot_failed`,
/// `lost`).
pub fn facade_event(event: &cohort::group::Event) -> Value {
    use cohort::group::Event as E;
    let core = match event.clone() {
        E::View(view) => GroupEvent::View(view),
        E::Deliver {
            channel,
            sender,
            view,
            seq,
            order,
            data,
        } => GroupEvent::Deliver {
            channel,
            sender,
            view,
            seq,
            order,
            data,
        },
        E::Rekeyed {
            key_epoch,
            members,
            took,
        } => GroupEvent::Rekeyed {
            key_epoch,
            members,
            took,
        },
        E::Removed { member, reason } => GroupEvent::Removed { member, reason },
        E::Expelled { reason } => GroupEvent::Expelled { reason },
        E::Insecure { from } => GroupEvent::Insecure { from },
        E::Merging { leader, into } => GroupEvent::Merging { leader, into },
        E::Protocol(event) => event,
        E::State(bytes) => return json!({"event": "state", "data": BASE64.encode(bytes)}),
        E::StateUnavailable { reason } => {
            return json!({"event": "state_unavailable", "reason": reason})
        }
        E::SnapshotFailed { reason } => {
            return json!({"event": "snapshot_failed", "reason": reason})
        }
        E::Lost { count } => return json!({"event": "lost", "count": count}),
        E::Transport(what) => return json!({"event": "transport", "what": what}),
        other => return jsonl::other_event(&other),
    };
    self::event(&core)
}

/// Dropped-packet counters as an object of `name: count`.
pub fn counters(counters: &DropCounters) -> Value {
    jsonl::counts(counters.iter())
}

/// The answer to a `status` command.
pub fn status(status: &Status) -> Value {
    json!({
        "event": "status",
        "view": status.view.as_ref().map(|v| Value::Object(view_fields(v))),
        "changing_view": status.changing_view,
        "delivered_reliable": status.delivered_reliable,
        "delivered_unreliable": status.delivered_unreliable,
        "pending": status.pending,
        "gear": status.gear,
        "key_fingerprint": status.key_fingerprint,
        "dropped": counters(&status.dropped),
    })
}

/// The periodic line when drop counters changed.
pub fn dropped(dropped: &DropCounters) -> Value {
    let mut map = Map::new();
    map.insert("event".into(), json!("dropped"));
    if let Value::Object(c) = counters(dropped) {
        map.extend(c);
    }
    map.insert("total".into(), json!(dropped.total()));
    Value::Object(map)
}

/// A command read from standard input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Send `data` on `channel`.
    Send {
        /// Which channel.
        channel: Channel,
        /// The decoded payload.
        data: Vec<u8>,
    },
    /// Ask for a fresh group key.
    Rekey,
    /// Leave the group and exit.
    Leave,
    /// Report the member's status.
    Status,
    /// Change the trust policy: trust `add`, stop trusting `remove`.
    Trust {
        /// Principals to trust.
        add: Vec<MemberId>,
        /// Principals to stop trusting.
        remove: Vec<MemberId>,
    },
}

/// Parses one input line.
pub fn parse_command(line: &str) -> Result<Command, CommandError> {
    let line = CommandLine::parse(line)?;
    let allowed: Option<&[&str]> = match line.cmd.as_str() {
        "send" => Some(&["cmd", "channel", "data"]),
        "rekey" | "leave" | "status" => Some(&["cmd"]),
        "trust" => Some(&["cmd", "add", "remove"]),
        _ => None,
    };
    line.allow(allowed, "send, rekey, leave, status, trust")?;
    let fields = &line.fields;
    match line.cmd.as_str() {
        "send" => {
            let channel = match fields.get("channel") {
                None => Channel::Reliable,
                Some(Value::String(s)) => match s.as_str() {
                    "reliable" => Channel::Reliable,
                    "unreliable" => Channel::Unreliable,
                    other => {
                        return Err(line.fail(format!(
                            "unknown channel {other:?} (reliable or unreliable)"
                        )))
                    }
                },
                Some(_) => return Err(line.fail("\"channel\" must be a string")),
            };
            let data = fields.base64("data").map_err(|e| line.fail(e))?;
            Ok(Command::Send { channel, data })
        }
        "rekey" => Ok(Command::Rekey),
        "leave" => Ok(Command::Leave),
        "trust" => {
            let list = |field: &str| -> Result<Vec<MemberId>, CommandError> {
                let Some(v) = fields.get(field) else {
                    return Ok(Vec::new());
                };
                let Some(items) = v.as_array() else {
                    return Err(line.fail(format!("\"{field}\" must be a list of member ids")));
                };
                items
                    .iter()
                    .map(|item| {
                        item.as_str()
                            .and_then(|t| t.parse::<MemberId>().ok())
                            .ok_or_else(|| {
                                line.fail(format!(
                                    "\"{field}\": {item} is not a member id \
                                     (ed25519:<hex> or kdc:<name>)"
                                ))
                            })
                    })
                    .collect()
            };
            Ok(Command::Trust {
                add: list("add")?,
                remove: list("remove")?,
            })
        }
        _ => Ok(Command::Status),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // reason: test code; a panic is the failure report
mod tests {
    use super::*;
    use cohort_group::{Member, RemovalReason, ViewId};
    use std::time::Duration;

    fn member(byte: u8) -> MemberId {
        MemberId::from_bytes([byte; 32])
    }

    #[test]
    fn trust_commands_parse_and_name_bad_keys() {
        let k = member(7).to_string();
        assert_eq!(
            parse_command(&format!(r#"{{"cmd":"trust","add":["{k}"]}}"#)),
            Ok(Command::Trust {
                add: vec![member(7)],
                remove: Vec::new()
            })
        );
        assert_eq!(
            parse_command(&format!(r#"{{"cmd":"trust","remove":["{k}"]}}"#)),
            Ok(Command::Trust {
                add: Vec::new(),
                remove: vec![member(7)]
            })
        );
        let e = parse_command(r#"{"cmd":"trust","remove":["nope"]}"#).unwrap_err();
        assert!(
            e.error.contains("\"nope\" is not a member id"),
            "{}",
            e.error
        );
        let e = parse_command(r#"{"cmd":"trust","remove":"x"}"#).unwrap_err();
        assert!(e.error.contains("must be a list"), "{}", e.error);
    }

    #[test]
    fn commands_parse() {
        assert_eq!(
            parse_command(r#"{"cmd":"send","channel":"unreliable","data":"aGk="}"#),
            Ok(Command::Send {
                channel: Channel::Unreliable,
                data: b"hi".to_vec()
            })
        );
        assert_eq!(
            parse_command(r#"{"cmd":"send","data":""}"#),
            Ok(Command::Send {
                channel: Channel::Reliable,
                data: vec![]
            })
        );
        assert_eq!(parse_command(r#"{"cmd":"rekey"}"#), Ok(Command::Rekey));
        assert_eq!(parse_command(r#" {"cmd":"leave"} "#), Ok(Command::Leave));
        assert_eq!(parse_command(r#"{"cmd":"status"}"#), Ok(Command::Status));
    }

    #[test]
    fn bad_commands_are_errors_with_the_command_named() {
        for (line, cmd) in [
            ("", None),
            ("nonsense", None),
            ("[1,2]", None),
            (r#"{"cmd":5}"#, None),
            (r#"{"data":"aGk="}"#, None),
            (r#"{"cmd":"dance"}"#, Some("dance")),
            (r#"{"cmd":"send"}"#, Some("send")),
            (r#"{"cmd":"send","data":"!!"}"#, Some("send")),
            (r#"{"cmd":"send","data":7}"#, Some("send")),
            (
                r#"{"cmd":"send","channel":"smoke","data":""}"#,
                Some("send"),
            ),
            (r#"{"cmd":"send","channel":1,"data":""}"#, Some("send")),
            (r#"{"cmd":"rekey","now":true}"#, Some("rekey")),
        ] {
            let e = parse_command(line).unwrap_err();
            assert_eq!(e.cmd.as_deref(), cmd, "{line}");
            assert_eq!(e.to_json()["event"], "error");
        }
    }

    #[test]
    fn events_have_the_documented_fields() {
        let view = View {
            id: ViewId {
                seq: 3,
                coordinator: member(1),
            },
            members: vec![
                Member {
                    id: member(1),
                    addr: "127.0.0.1:1".parse().unwrap(),
                },
                Member {
                    id: member(2),
                    addr: "127.0.0.1:2".parse().unwrap(),
                },
            ]
            .into(),
            key_epoch: 7,
        };
        let v = event(&GroupEvent::View(view.clone()));
        assert_eq!(v["event"], "view");
        assert_eq!(v["view_id"], "3:01010101");
        assert_eq!(v["view_seq"], 3);
        assert_eq!(v["members"][1], member(2).to_string());
        assert_eq!(v["leader"], member(1).to_string());
        assert_eq!(v["key_epoch"], 7);
        let d = event(&GroupEvent::Deliver {
            channel: Channel::Reliable,
            sender: member(2),
            view: view.id,
            seq: 4,
            order: Some(9),
            data: b"hi".to_vec(),
        });
        assert_eq!(
            (&d["channel"], &d["seq"], &d["order"], &d["data"]),
            (&json!("reliable"), &json!(4), &json!(9), &json!("aGk="))
        );
        let d = event(&GroupEvent::Deliver {
            channel: Channel::Unreliable,
            sender: member(2),
            view: view.id,
            seq: 4,
            order: None,
            data: vec![],
        });
        assert!(d["order"].is_null());
        let r = event(&GroupEvent::Rekeyed {
            key_epoch: 2,
            members: 3,
            took: Some(Duration::from_micros(1500)),
        });
        assert_eq!(r["took_ms"], 1.5);
        let r = event(&GroupEvent::Removed {
            member: member(2),
            reason: RemovalReason::Suspected,
        });
        assert_eq!(r["reason"], "suspected");
        let mut c = DropCounters::default();
        c.count(cohort_group::Drop::AuthFailed);
        let s = status(&Status {
            view: Some(view),
            changing_view: false,
            delivered_reliable: 1,
            delivered_unreliable: 2,
            pending: 0,
            gear: "aes-128-gcm",
            dropped: c,
            key_fingerprint: Some("0011223344556677".into()),
        });
        assert_eq!(s["view"]["key_epoch"], 7);
        assert_eq!(s["key_fingerprint"], "0011223344556677");
        assert_eq!(s["dropped"]["auth_failed"], 1);
        assert_eq!(dropped(&c)["total"], 1);
    }
}
