//! The control socket (as the ALPHA prototype's `alphacontrol`): a running `cohort hop run`
//! listens on a Unix socket; `cohort hop ctl` asks it for its associations and counters, or
//! tells it to open or close an association.
//!
//! ```text
//!   cohort hop ctl ──connect──▶ socket ──one JSON line──▶ accept task ──mpsc──▶ event loop
//!                  ◀──────────────────── one JSON line ◀── oneshot reply ◀──────┘
//! ```
//!
//! One request per connection: `{"cmd":"status"}`, `{"cmd":"open","peer":"IP:PORT",
//! "mode":"m:32"}`, `{"cmd":"close","peer":"IP:PORT","assoc":N}`. The answer is one JSON
//! object; a refused request answers `{"error":"..."}`. The socket file is created with mode
//! 0600 (only its owner may control the daemon) and removed when the daemon stops.

use crate::jsonl::Fields;
use crate::UsageError;
use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

/// Longest request line accepted.
const MAX_REQUEST: usize = 4096;
/// How long a client waits for the daemon's answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// A request, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Everything: associations, counters, peers.
    Status,
    /// Open an outgoing association to `peer`.
    Open {
        /// The peer endpoint.
        peer: Option<SocketAddr>,
        /// The mode as written (`m:32`); the loop parses it.
        mode: Option<String>,
    },
    /// Close association `assoc` to `peer`.
    Close {
        /// The peer endpoint.
        peer: Option<SocketAddr>,
        /// The association's id.
        assoc: u64,
    },
}

/// A request on its way to the event loop, with the way back.
pub struct CtlRequest {
    /// What was asked.
    pub request: Request,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Value>,
}

/// Removes the socket file when dropped.
pub struct SocketGuard(PathBuf);

impl Drop for SocketGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Binds the control socket at `path` and starts accepting; requests arrive on the
/// returned channel. A stale socket file (nobody answers on it) is replaced; a live one is
/// an error.
pub fn serve(path: &Path) -> std::io::Result<(mpsc::Receiver<CtlRequest>, SocketGuard)> {
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "another daemon answers on it",
            ));
        }
        std::fs::remove_file(path)?;
    }
    let listener = tokio::net::UnixListener::bind(path)?;
    let guard = SocketGuard(path.to_path_buf());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let _ = answer(stream, tx).await;
            });
        }
    });
    Ok((rx, guard))
}

async fn answer(
    stream: tokio::net::UnixStream,
    tx: mpsc::Sender<CtlRequest>,
) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = tokio::io::BufReader::new(read).take(MAX_REQUEST as u64);
    let reply = match tokio::time::timeout(CLIENT_TIMEOUT, reader.read_line(&mut line)).await {
        Ok(Ok(_)) => match parse_request(&line) {
            Ok(request) => {
                let (reply, answer) = oneshot::channel();
                if tx.send(CtlRequest { request, reply }).await.is_err() {
                    json!({"error": "the daemon is stopping"})
                } else {
                    answer
                        .await
                        .unwrap_or_else(|_| json!({"error": "the daemon is stopping"}))
                }
            }
            Err(e) => json!({ "error": e }),
        },
        _ => json!({"error": "no request line"}),
    };
    write.write_all(format!("{reply}\n").as_bytes()).await?;
    write.shutdown().await
}

/// Parses one request line.
pub fn parse_request(line: &str) -> Result<Request, String> {
    let fields = Fields::object(line, "request")?;
    let cmd = fields
        .get("cmd")
        .and_then(Value::as_str)
        .ok_or("missing \"cmd\"")?;
    let allowed: &[&str] = match cmd {
        "status" => &["cmd"],
        "open" => &["cmd", "peer", "mode"],
        "close" => &["cmd", "peer", "assoc"],
        other => return Err(format!("unknown command {other:?} (status, open, close)")),
    };
    fields.only(allowed)?;
    let peer = fields.opt_addr("peer")?;
    match cmd {
        "status" => Ok(Request::Status),
        "open" => {
            let mode = fields.opt_str("mode")?.map(str::to_string);
            Ok(Request::Open { peer, mode })
        }
        _ => {
            let assoc = fields
                .get("assoc")
                .and_then(Value::as_u64)
                .ok_or("\"assoc\" must be a whole number")?;
            Ok(Request::Close { peer, assoc })
        }
    }
}

/// `cohort hop ctl`.
#[derive(Args)]
pub struct CtlArgs {
    /// The daemon's control socket (its `ctl` setting; by default the config file's path
    /// with `.sock`).
    #[arg(long)]
    socket: PathBuf,
    /// Print the daemon's answer as JSON.
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    command: CtlCommand,
}

/// What to ask.
#[derive(Subcommand)]
pub enum CtlCommand {
    /// Role, address, peers, and totals.
    Status,
    /// Every association: id, direction, mode, chain rounds left, queued, sent, received.
    Associations,
    /// The node's counters (packets verified, forwarded, dropped by reason).
    Counters,
    /// Open another outgoing association.
    Open {
        /// The peer endpoint (default: the only peer).
        #[arg(long)]
        peer: Option<SocketAddr>,
        /// Its mode: none, n, c:K, m:K (default: the peer's configured mode).
        #[arg(long)]
        mode: Option<String>,
    },
    /// Close an association.
    Close {
        /// The peer endpoint (default: the only peer).
        #[arg(long)]
        peer: Option<SocketAddr>,
        /// The association's id (see `associations`).
        #[arg(long)]
        assoc: u64,
    },
}

/// Runs `cohort hop ctl`.
pub fn run(args: &CtlArgs) -> Result<(), UsageError> {
    let request = match &args.command {
        CtlCommand::Status | CtlCommand::Associations | CtlCommand::Counters => {
            json!({"cmd": "status"})
        }
        CtlCommand::Open { peer, mode } => {
            json!({"cmd": "open", "peer": peer.map(|p| p.to_string()), "mode": mode})
        }
        CtlCommand::Close { peer, assoc } => {
            json!({"cmd": "close", "peer": peer.map(|p| p.to_string()), "assoc": assoc})
        }
    };
    let answer = ask(&args.socket, &request)?;
    if let Some(e) = answer.get("error").and_then(Value::as_str) {
        return Err(UsageError(format!("the daemon refused: {e}")));
    }
    let part = match args.command {
        CtlCommand::Associations => answer.get("associations").cloned().unwrap_or(json!([])),
        CtlCommand::Counters => answer.get("counters").cloned().unwrap_or(json!({})),
        _ => answer.clone(),
    };
    if args.json {
        println!("{part}");
        return Ok(());
    }
    match args.command {
        CtlCommand::Status => print!("{}", render_status(&answer)),
        CtlCommand::Associations => print!("{}", render_table(&part)),
        CtlCommand::Counters => print!("{}", render_counters(&part)),
        CtlCommand::Open { .. } | CtlCommand::Close { .. } => {
            println!("{}", render_fields(&answer))
        }
    }
    Ok(())
}

/// Sends one request to the socket at `path`; the answer.
pub fn ask(path: &Path, request: &Value) -> Result<Value, UsageError> {
    let shown = path.display();
    let mut stream = std::os::unix::net::UnixStream::connect(path).map_err(|e| {
        UsageError(format!(
            "cannot reach the daemon on {shown}: {e} (is `cohort hop run` running with this ctl socket?)"
        ))
    })?;
    let io_err = |e: std::io::Error| UsageError(format!("control socket {shown}: {e}"));
    stream
        .set_read_timeout(Some(CLIENT_TIMEOUT))
        .map_err(io_err)?;
    stream
        .write_all(format!("{request}\n").as_bytes())
        .map_err(io_err)?;
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .map_err(io_err)?;
    serde_json::from_str(&line).map_err(|e| {
        UsageError(format!(
            "control socket {shown}: the answer is not JSON: {e}"
        ))
    })
}

/// A JSON scalar for people: strings bare, null as `-` (shared with `cohort group ctl`).
pub fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// `key=value` pairs of an object's scalar fields, on one line.
pub fn render_fields(v: &Value) -> String {
    match v {
        Value::Object(map) => map
            .iter()
            .filter(|(_, v)| !v.is_object() && !v.is_array())
            .map(|(k, v)| format!("{k}={}", scalar(v)))
            .collect::<Vec<_>>()
            .join(" "),
        other => scalar(other),
    }
}

/// Columns shown first, in this order, when present.
const FIRST_COLUMNS: &[&str] = &[
    "peer",
    "initiator",
    "responder",
    "assoc",
    "dir",
    "mode",
    "open",
    "state",
];

/// An array of objects as an aligned table.
pub fn render_table(rows: &Value) -> String {
    let Some(rows) = rows.as_array() else {
        return format!("{}\n", scalar(rows));
    };
    if rows.is_empty() {
        return "(none)\n".into();
    }
    // JSON objects have no order: well-known columns first, the rest alphabetically.
    let mut columns: Vec<String> = Vec::new();
    for &first in FIRST_COLUMNS {
        if rows.iter().any(|r| r.get(first).is_some()) {
            columns.push(first.to_string());
        }
    }
    for row in rows {
        if let Value::Object(map) = row {
            for k in map.keys() {
                if !columns.contains(k) {
                    columns.push(k.clone());
                }
            }
        }
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            columns
                .iter()
                .map(|c| row.get(c).map(scalar).unwrap_or_else(|| "-".into()))
                .collect()
        })
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| cells.iter().map(|r| r[i].len()).fold(c.len(), usize::max))
        .collect();
    let line = |items: &[String]| {
        items
            .iter()
            .zip(&widths)
            .map(|(s, w)| format!("{s:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = line(&columns.iter().map(|c| c.to_uppercase()).collect::<Vec<_>>());
    out.push('\n');
    for row in &cells {
        out.push_str(&line(row));
        out.push('\n');
    }
    out
}

/// Counters as `name  value` lines, nested objects flattened with dots.
pub fn render_counters(v: &Value) -> String {
    fn walk(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(map) => {
                for (k, v) in map {
                    let name = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&name, v, out);
                }
            }
            other => out.push((prefix.to_string(), scalar(other))),
        }
    }
    let mut items = Vec::new();
    walk("", v, &mut items);
    let width = items.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    items
        .iter()
        .map(|(k, v)| format!("{k:<width$}  {v}\n"))
        .collect()
}

/// The status answer for people: the scalar fields, the peers, the associations, the
/// counters that are not zero.
pub fn render_status(v: &Value) -> String {
    let mut out = format!("{}\n", render_fields(v));
    if let Some(peers) = v.get("peers") {
        out.push_str("\npeers:\n");
        out.push_str(&render_table(peers));
    }
    if let Some(assocs) = v.get("associations") {
        out.push_str("\nassociations:\n");
        out.push_str(&render_table(assocs));
    }
    if let Some(Value::Object(counters)) = v.get("counters") {
        let nonzero: Map<String, Value> = counters
            .iter()
            .filter(|(_, v)| v.as_u64() != Some(0))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        out.push_str("\ncounters (not zero):\n");
        out.push_str(&render_counters(&Value::Object(nonzero)));
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // reason: test code; a panic is the failure report
mod tests {
    use super::*;

    #[test]
    fn requests_parse() {
        assert_eq!(parse_request(r#"{"cmd":"status"}"#), Ok(Request::Status));
        assert_eq!(
            parse_request(r#"{"cmd":"open","peer":"127.0.0.1:5","mode":"m:8"}"#),
            Ok(Request::Open {
                peer: Some("127.0.0.1:5".parse().unwrap()),
                mode: Some("m:8".into())
            })
        );
        assert_eq!(
            parse_request(r#"{"cmd":"close","assoc":3,"peer":null}"#),
            Ok(Request::Close {
                peer: None,
                assoc: 3
            })
        );
        for bad in [
            "",
            "[]",
            r#"{"cmd":"dance"}"#,
            r#"{"cmd":"status","x":1}"#,
            r#"{"cmd":"close"}"#,
            r#"{"cmd":"open","peer":"nowhere"}"#,
            r#"{"cmd":"open","mode":3}"#,
        ] {
            assert!(parse_request(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tables_align_and_counters_flatten() {
        let rows = json!([{"id": 1, "mode": "m:32"}, {"id": 22, "mode": "n", "queued": 4}]);
        assert_eq!(
            render_table(&rows),
            "MODE  ID  QUEUED\nm:32  1   -\nn     22  4\n"
        );
        assert_eq!(render_table(&json!([])), "(none)\n");
        let c = json!({"dropped": {"bad_mac": 2}, "forwarded": 10});
        assert_eq!(
            render_counters(&c),
            "dropped.bad_mac  2\nforwarded        10\n"
        );
    }

    #[tokio::test]
    async fn a_request_travels_to_the_loop_and_back() {
        let path =
            std::env::temp_dir().join(format!("cohort-ctl-test-{}.sock", std::process::id()));
        let (mut rx, guard) = serve(&path).unwrap();
        // A second daemon on the same live socket is refused.
        assert!(serve(&path).is_err());
        tokio::spawn(async move {
            while let Some(req) = rx.recv().await {
                let _ = req
                    .reply
                    .send(json!({"role": "relay", "echo": format!("{:?}", req.request)}));
            }
        });
        let p = path.clone();
        let answer = tokio::task::spawn_blocking(move || ask(&p, &json!({"cmd": "status"})))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(answer["role"], "relay");
        let p = path.clone();
        let answer = tokio::task::spawn_blocking(move || ask(&p, &json!({"cmd": "fly"})))
            .await
            .unwrap()
            .unwrap();
        assert!(answer["error"]
            .as_str()
            .unwrap()
            .contains("unknown command"));
        drop(guard);
        assert!(!path.exists());
    }
}
