//! The group control socket: a Unix socket through which an operator (or `cohort group ctl`)
//! asks a running member for its status, view and members, and tells it to send, rekey,
//! change its trust or leave. A thin adapter over a [`Group`] handle: every command is one
//! call on the handle, nothing is kept here but the socket.
//!
//! ```text
//!   cohort group ctl ──connect──▶ PATH (0600) ──one JSON line──▶ connection task
//!                    ◀──────────── one JSON line ◀── Group::{view, stats, send, rekey,
//!                                                           set_trust, leave} ──▶ member task
//! ```
//!
//! One request per connection, one answer, then the server closes it. Requests:
//!
//! | request | answer |
//! | --- | --- |
//! | `{"cmd":"status"}` | `{"id", "listen", "view", "stats"}` |
//! | `{"cmd":"view"}` | `{"view"}` (`null` before the first view) |
//! | `{"cmd":"members"}` | `{"members":[{"rank","id","addr","leader"}]}` |
//! | `{"cmd":"send","channel":"reliable"\|"unreliable","data":BASE64}` | `{"seq"}` |
//! | `{"cmd":"rekey"}` | `{"rekey":"requested"}` (the leader runs it; a rekey event follows) |
//! | `{"cmd":"trust"}` | `{"trusted":[ID, ...]}`, the principals trusted now |
//! | `{"cmd":"trust","set":[ID, ...]}` | `{"trusted":[...]}` after replacing them |
//! | `{"cmd":"trust","add":[ID, ...],"remove":[ID, ...]}` | `{"trusted":[...]}` after the change |
//! | `{"cmd":"leave"}` | `{"left":true}`, once the leave is done |
//!
//! Every answer carries `"ctl":"cohort-group-ctl/1"` ([`PROTOCOL`]), so that a client can
//! tell this socket from another program's; a refused request answers `{"error":"..."}`.
//! The socket file is created with mode 0600 (only its owner may control the member), a
//! live socket at the same path is never replaced (a stale one is), and the file is removed
//! when the [`CtlServer`] (or a [`CtlBinding`] never started) is closed or dropped.

use crate::group::{Channel, Group, MemberId, Stats, View};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde_json::{json, Map, Value};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

/// The protocol's name and version, in every answer's `"ctl"` field.
pub const PROTOCOL: &str = "cohort-group-ctl/1";
/// Longest request line: a 16 MiB message in base64 and the JSON around it.
pub const MAX_REQUEST: usize = 23 * 1024 * 1024;
/// How long a client may take to send its request line.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one command may wait on the member (a full send window, a leave).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(20);
/// Connections served at once (each may hold a request of [`MAX_REQUEST`] bytes).
const MAX_CONNECTIONS: usize = 8;

/// A request, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// The member's id, address, view and statistics.
    Status,
    /// The current view.
    View,
    /// The current view's members, by rank.
    Members,
    /// Send `data` on `channel`.
    Send {
        /// Which channel.
        channel: Channel,
        /// The message.
        data: Vec<u8>,
    },
    /// Start a rekey now.
    Rekey,
    /// Show the trusted principals, or change them.
    Trust(TrustChange),
    /// Leave the group.
    Leave,
}

/// What a `trust` request changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustChange {
    /// Replace the list with this one (applied before `add` and `remove`).
    pub set: Option<Vec<MemberId>>,
    /// Trust these too.
    pub add: Vec<MemberId>,
    /// Stop trusting these (wins over `add`).
    pub remove: Vec<MemberId>,
}

impl TrustChange {
    /// Whether the request only asks for the list.
    pub fn is_query(&self) -> bool {
        self.set.is_none() && self.add.is_empty() && self.remove.is_empty()
    }

    /// The list after the change, from the list `now`.
    pub fn apply(&self, now: Vec<MemberId>) -> Vec<MemberId> {
        let mut trusted: Vec<MemberId> = Vec::new();
        for id in self
            .set
            .clone()
            .unwrap_or(now)
            .into_iter()
            .chain(self.add.clone())
        {
            if !trusted.contains(&id) && !self.remove.contains(&id) {
                trusted.push(id);
            }
        }
        trusted
    }
}

/// A running control socket. Dropping it stops accepting and removes the socket file.
pub struct CtlServer {
    file: SocketFile,
    accept: JoinHandle<()>,
    left: watch::Receiver<bool>,
    slots: Arc<Semaphore>,
}

impl CtlServer {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.file.0
    }

    /// Resolves once a `leave` request has been carried out and answered: the member has
    /// left, and the process that runs it may exit.
    pub fn left(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut left = self.left.clone();
        async move {
            // An error means the server is gone: nobody will ask for a leave any more.
            if left.wait_for(|l| *l).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Stops accepting, lets the requests under way finish (a `leave` gets its answer) for
    /// up to `grace`, and removes the socket file. Call it before the process exits.
    pub async fn close(self, grace: Duration) {
        self.accept.abort();
        let all = u32::try_from(MAX_CONNECTIONS).unwrap_or(u32::MAX);
        let _ = tokio::time::timeout(grace, self.slots.acquire_many(all)).await;
        // Drop removes the file.
    }
}

impl Drop for CtlServer {
    fn drop(&mut self) {
        // The socket file goes with `file`.
        self.accept.abort();
    }
}

/// A bound control socket that does not answer yet ([`bind`]): bind it before the member
/// starts, so that a socket in use fails with nothing started, then [`start`](Self::start)
/// it. Dropping it removes the socket file.
pub struct CtlBinding {
    file: SocketFile,
    listener: UnixListener,
}

impl CtlBinding {
    /// Serves `group` on the socket from tasks on the current tokio runtime.
    pub fn start(self, group: Group) -> CtlServer {
        start(self.file, self.listener, group)
    }
}

/// Removes the socket file when dropped.
struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Binds the control socket at `path` (mode 0600), not answering yet. Call it from inside
/// a tokio runtime.
///
/// Fails with `AddrInUse` if another process answers on `path`, with `AlreadyExists` if
/// `path` is something other than a socket; a socket file nobody answers on (left by a
/// crash) is replaced.
pub fn bind(path: &Path) -> io::Result<CtlBinding> {
    let listener = bind_private(path)?;
    Ok(CtlBinding {
        file: SocketFile(path.to_path_buf()),
        listener,
    })
}

/// [`bind`], then [`CtlBinding::start`] at once.
pub fn serve(path: &Path, group: Group) -> io::Result<CtlServer> {
    Ok(bind(path)?.start(group))
}

fn start(file: SocketFile, listener: UnixListener, group: Group) -> CtlServer {
    let (left_tx, left) = watch::channel(false);
    let left_tx = Arc::new(left_tx);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let server_slots = slots.clone();
    let accept = tokio::spawn(async move {
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors and the like: back off briefly, keep serving.
                    tracing::warn!(error = %e, "group ctl: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let group = group.clone();
            let left_tx = left_tx.clone();
            tokio::spawn(async move {
                if let Err(e) = answer(stream, &group, &left_tx).await {
                    tracing::debug!(error = %e, "group ctl: connection ended early");
                }
                drop(permit);
            });
        }
    });
    tracing::debug!(path = %file.0.display(), "group ctl: listening");
    CtlServer {
        file,
        accept,
        left,
        slots: server_slots,
    }
}

/// Binds a listener at `path` whose file has mode 0600 from the moment it has that name:
/// bound under a temporary name in the same directory, narrowed, then renamed into place.
fn bind_private(path: &Path) -> io::Result<UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "the path exists and is not a socket",
            ));
        }
        Ok(_) => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    "another process answers on this socket",
                ));
            }
            tracing::info!(path = %path.display(), "group ctl: replacing a stale socket");
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path has no file name"))?;
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(".{}.tmp", std::process::id()));
    let temp = path.with_file_name(temp_name);
    let _ = std::fs::remove_file(&temp);
    let listener = UnixListener::bind(&temp)?;
    let placed = std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&temp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&temp);
        return Err(e);
    }
    Ok(listener)
}

/// Reads one request from `stream`, carries it out and writes the answer.
async fn answer(stream: UnixStream, group: &Group, left: &watch::Sender<bool>) -> io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = Vec::new();
    let mut reader = tokio::io::BufReader::new(read).take(MAX_REQUEST as u64 + 1);
    let read = tokio::time::timeout(READ_TIMEOUT, reader.read_until(b'\n', &mut line)).await;
    let (request, mut reply) = match read {
        Ok(Ok(_)) if line.len() > MAX_REQUEST => (
            None,
            error(format!("request longer than {MAX_REQUEST} bytes")),
        ),
        Ok(Ok(_)) => match std::str::from_utf8(&line)
            .map_err(|_| "the request is not UTF-8".to_string())
            .and_then(parse_request)
        {
            Ok(request) => {
                let reply = carry_out(group, &request).await;
                (Some(request), reply)
            }
            Err(e) => (None, error(e)),
        },
        Ok(Err(e)) => return Err(e),
        Err(_) => (None, error("no request line within 10 s")),
    };
    reply.insert("ctl".into(), json!(PROTOCOL));
    tracing::debug!(
        ?request,
        ok = !reply.contains_key("error"),
        "group ctl: request"
    );
    write
        .write_all(format!("{}\n", Value::Object(reply)).as_bytes())
        .await?;
    write.shutdown().await?;
    if request == Some(Request::Leave) {
        left.send_replace(true);
    }
    Ok(())
}

fn error(message: impl Into<String>) -> Map<String, Value> {
    let mut map = Map::new();
    map.insert("error".into(), json!(message.into()));
    map
}

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => {
            let mut map = Map::new();
            map.insert("value".into(), other);
            map
        }
    }
}

/// Runs `request` on `group`; the answer's fields.
async fn carry_out(group: &Group, request: &Request) -> Map<String, Value> {
    let timed = |what: &str| format!("the member did not {what} within {COMMAND_TIMEOUT:?}");
    match request {
        Request::Status => {
            let stats = match tokio::time::timeout(COMMAND_TIMEOUT, group.stats()).await {
                Ok(Ok(stats)) => stats_json(&stats),
                Ok(Err(e)) => return error(e.to_string()),
                Err(_) => return error(timed("report its statistics")),
            };
            object(json!({
                "id": group.id().to_string(),
                "listen": group.local_addr().to_string(),
                "view": group.view().as_ref().map(view_json),
                "stats": stats,
            }))
        }
        Request::View => object(json!({ "view": group.view().as_ref().map(view_json) })),
        Request::Members => object(json!({ "members": members_json(group.view().as_ref()) })),
        Request::Send { channel, data } => {
            match tokio::time::timeout(COMMAND_TIMEOUT, group.send(*channel, data.clone())).await {
                Ok(Ok(seq)) => object(json!({ "seq": seq })),
                Ok(Err(e)) => error(e.to_string()),
                Err(_) => error(timed("take the message")),
            }
        }
        Request::Rekey => match tokio::time::timeout(COMMAND_TIMEOUT, group.rekey()).await {
            Ok(Ok(())) => object(json!({ "rekey": "requested" })),
            Ok(Err(e)) => error(e.to_string()),
            Err(_) => error(timed("rekey")),
        },
        Request::Trust(change) => {
            let work = async {
                let now = group.trust().await?;
                if change.is_query() {
                    return Ok(now);
                }
                let trusted = change.apply(now);
                group.set_trust(trusted.clone()).await?;
                Ok::<_, crate::group::Error>(trusted)
            };
            match tokio::time::timeout(COMMAND_TIMEOUT, work).await {
                Ok(Ok(trusted)) => {
                    let shown: Vec<String> = trusted.iter().map(ToString::to_string).collect();
                    object(json!({ "trusted": shown }))
                }
                Ok(Err(e)) => error(e.to_string()),
                Err(_) => error(timed("change its trust")),
            }
        }
        Request::Leave => match tokio::time::timeout(COMMAND_TIMEOUT, group.leave()).await {
            Ok(Ok(())) => object(json!({ "left": true })),
            Ok(Err(e)) => error(e.to_string()),
            Err(_) => error(timed("finish leaving")),
        },
    }
}

/// A view as JSON: id, sequence number, leader, key epoch, member ids and addresses.
pub fn view_json(view: &View) -> Value {
    json!({
        "view_id": view.id.to_string(),
        "view_seq": view.id.seq,
        "leader": view.members.first().map(|m| m.id.to_string()),
        "key_epoch": view.key_epoch,
        "members": view.members.iter().map(|m| m.id.to_string()).collect::<Vec<_>>(),
        "addrs": view.members.iter().map(|m| m.addr.to_string()).collect::<Vec<_>>(),
    })
}

/// The members of `view` as rows (`[]` without a view).
pub fn members_json(view: Option<&View>) -> Value {
    let Some(view) = view else {
        return json!([]);
    };
    Value::Array(
        view.members
            .iter()
            .enumerate()
            .map(|(rank, m)| {
                json!({
                    "rank": rank,
                    "id": m.id.to_string(),
                    "addr": m.addr.to_string(),
                    "leader": rank == 0,
                })
            })
            .collect(),
    )
}

/// The member's statistics as JSON.
pub fn stats_json(stats: &Stats) -> Value {
    let status = &stats.status;
    let dropped: Map<String, Value> = status
        .dropped
        .iter()
        .map(|(reason, n)| (reason.to_string(), json!(n)))
        .collect();
    json!({
        "gear": status.gear,
        "key_fingerprint": status.key_fingerprint,
        "changing_view": status.changing_view,
        "pending": status.pending,
        "queued": stats.queued,
        "sent_messages": stats.sent_messages,
        "sent_bytes": stats.sent_bytes,
        "delivered_messages": stats.delivered_messages,
        "delivered_bytes": stats.delivered_bytes,
        "datagrams_sent": stats.datagrams_sent,
        "datagram_bytes_sent": stats.datagram_bytes_sent,
        "datagrams_received": stats.datagrams_received,
        "datagram_bytes_received": stats.datagram_bytes_received,
        "views": stats.views,
        "rekeys": stats.rekeys,
        "last_rekey_ms": stats.last_rekey.map(|d| d.as_secs_f64() * 1e3),
        "reassembly_bytes": stats.reassembly_bytes,
        "events_queued": stats.events_queued,
        "events_lost": stats.events_lost,
        "snapshots_sent": stats.snapshots_sent,
        "snapshots_received": stats.snapshots_received,
        "dropped": dropped,
        "fragments_dropped": {
            "garbage": stats.fragments.garbage,
            "over_limit": stats.fragments.over_limit,
            "sender_left": stats.fragments.sender_left,
        },
    })
}

/// Parses one request line.
pub fn parse_request(line: &str) -> Result<Request, String> {
    let value: Value =
        serde_json::from_str(line.trim()).map_err(|e| format!("the request is not JSON: {e}"))?;
    let Value::Object(fields) = value else {
        return Err("the request must be a JSON object".into());
    };
    let cmd = fields
        .get("cmd")
        .and_then(Value::as_str)
        .ok_or("missing \"cmd\"")?;
    let allowed: &[&str] = match cmd {
        "status" | "view" | "members" | "rekey" | "leave" => &["cmd"],
        "send" => &["cmd", "channel", "data"],
        "trust" => &["cmd", "set", "add", "remove"],
        other => {
            return Err(format!(
                "unknown command {other:?} (status, view, members, send, rekey, trust, leave)"
            ))
        }
    };
    if let Some(extra) = fields.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(format!("unknown field {extra:?} for {cmd:?}"));
    }
    match cmd {
        "status" => Ok(Request::Status),
        "view" => Ok(Request::View),
        "members" => Ok(Request::Members),
        "rekey" => Ok(Request::Rekey),
        "leave" => Ok(Request::Leave),
        "send" => {
            let channel = match fields.get("channel") {
                None => Channel::Reliable,
                Some(Value::String(s)) if s == "reliable" => Channel::Reliable,
                Some(Value::String(s)) if s == "unreliable" => Channel::Unreliable,
                Some(other) => {
                    return Err(format!(
                        "\"channel\" must be \"reliable\" or \"unreliable\", not {other}"
                    ))
                }
            };
            let data = fields
                .get("data")
                .and_then(Value::as_str)
                .ok_or("\"data\" must be a base64 string")?;
            let data = BASE64
                .decode(data)
                .map_err(|e| format!("\"data\" is not base64: {e}"))?;
            Ok(Request::Send { channel, data })
        }
        _ => {
            let list = |field: &str| -> Result<Option<Vec<MemberId>>, String> {
                let Some(v) = fields.get(field) else {
                    return Ok(None);
                };
                let items = v
                    .as_array()
                    .ok_or_else(|| format!("\"{field}\" must be a list of member ids"))?;
                items
                    .iter()
                    .map(|item| {
                        item.as_str()
                            .and_then(|t| t.parse::<MemberId>().ok())
                            .ok_or_else(|| {
                                format!(
                                    "\"{field}\": {item} is not a member id \
                                     (ed25519:<hex> or kdc:<name>)"
                                )
                            })
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(Some)
            };
            Ok(Request::Trust(TrustChange {
                set: list("set")?,
                add: list("add")?.unwrap_or_default(),
                remove: list("remove")?.unwrap_or_default(),
            }))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // reason: test code; a panic is the failure report
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_bad_ones_say_why() {
        assert_eq!(parse_request(r#"{"cmd":"status"}"#), Ok(Request::Status));
        assert_eq!(parse_request("{\"cmd\":\"view\"}\n"), Ok(Request::View));
        assert_eq!(
            parse_request(r#"{"cmd":"send","channel":"unreliable","data":"aGk="}"#),
            Ok(Request::Send {
                channel: Channel::Unreliable,
                data: b"hi".to_vec()
            })
        );
        assert_eq!(
            parse_request(r#"{"cmd":"send","data":""}"#),
            Ok(Request::Send {
                channel: Channel::Reliable,
                data: Vec::new()
            })
        );
        assert_eq!(
            parse_request(r#"{"cmd":"trust","set":[]}"#),
            Ok(Request::Trust(TrustChange {
                set: Some(Vec::new()),
                ..TrustChange::default()
            }))
        );
        assert_eq!(
            parse_request(r#"{"cmd":"trust"}"#),
            Ok(Request::Trust(TrustChange::default()))
        );
        for (bad, says) in [
            ("", "not JSON"),
            ("[]", "JSON object"),
            (r#"{"cmd":"dance"}"#, "unknown command"),
            (r#"{"cmd":"status","x":1}"#, "unknown field \"x\""),
            (r#"{"cmd":"send"}"#, "\"data\""),
            (r#"{"cmd":"send","data":"!!"}"#, "not base64"),
            (
                r#"{"cmd":"send","channel":"fast","data":""}"#,
                "\"channel\"",
            ),
            (r#"{"cmd":"trust","set":["nobody"]}"#, "not a member id"),
            (r#"{"cmd":"trust","add":"x"}"#, "\"add\" must be a list"),
        ] {
            let e = parse_request(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn trust_changes_apply_in_order() {
        let id = |b: u8| MemberId::from_bytes([b; 32]);
        let now = vec![id(1), id(2)];
        assert!(TrustChange::default().is_query());
        let add = TrustChange {
            add: vec![id(3), id(1)],
            remove: vec![id(2)],
            ..TrustChange::default()
        };
        assert_eq!(add.apply(now.clone()), vec![id(1), id(3)]);
        let set = TrustChange {
            set: Some(vec![id(4)]),
            add: vec![id(5)],
            remove: vec![id(4)],
        };
        assert_eq!(set.apply(now), vec![id(5)]);
    }

    #[tokio::test]
    async fn a_live_socket_is_kept_a_stale_one_replaced_a_file_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("cohort-group-ctl-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // A regular file is never removed.
        let file = dir.join("file.sock");
        std::fs::write(&file, b"keep me").unwrap();
        assert_eq!(
            bind_private(&file).err().map(|e| e.kind()),
            Some(io::ErrorKind::AlreadyExists)
        );
        assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
        // A live socket is refused; once its listener is gone, it is stale and replaced.
        let path = dir.join("m.sock");
        let live = bind_private(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            bind_private(&path).err().map(|e| e.kind()),
            Some(io::ErrorKind::AddrInUse)
        );
        drop(live);
        let again = bind_private(&path).unwrap();
        assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
        drop(again);
        // Nothing left behind but what the test made.
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["file.sock", "m.sock"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
