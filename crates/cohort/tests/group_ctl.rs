//! `cohort group ctl` against real processes: two `cohort group run` members started as
//! daemons (standard input closed, a `--ctl` socket each) and driven only through their
//! control sockets (status, view, members, trust, send, rekey, leave; each exits after its
//! leave); and a ctl command to a dead or a foreign socket, which is one line and exit 2.
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

mod support;

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::{arg, cohort, exits_2, keygen, spawn, tempdir, text, Guard, WAIT};

/// `cohort group ctl --socket SOCKET ARGS`.
fn ctl(socket: &Path, args: &[&str]) -> Output {
    cohort(&[&["group", "ctl", "--socket", arg(socket)], args].concat())
}

/// `cohort group ctl --socket SOCKET --json ARGS`, which must succeed; its JSON answer.
fn ctl_json(socket: &Path, args: &[&str]) -> Value {
    let out = cohort(&[&["group", "ctl", "--socket", arg(socket), "--json"], args].concat());
    assert!(out.status.success(), "ctl {args:?}: {}", text(&out.stderr));
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(answer.get("error").is_none(), "{answer}");
    answer
}

/// Asks `socket` with `args` (JSON) until `pred` holds on the answer; the answer.
fn poll(socket: &Path, args: &[&str], what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    let mut last = String::new();
    while Instant::now() < deadline {
        let out = cohort(&[&["group", "ctl", "--socket", arg(socket), "--json"], args].concat());
        if out.status.success() {
            let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
            if pred(&answer) {
                return answer;
            }
            last = answer.to_string();
        } else {
            last = text(&out.stderr);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "{}: no {what} within {WAIT:?}; last answer: {last}",
        socket.display()
    )
}

/// A `cohort group run --ctl SOCKET` with standard input closed; its stdout JSON lines are
/// read on a thread.
struct Daemon {
    process: Guard,
    socket: PathBuf,
    lines: mpsc::Receiver<Value>,
    stderr: PathBuf,
}

impl Daemon {
    fn start(dir: &Path, name: &str, peers: &[String], trust: &[String]) -> Daemon {
        let quoted = |items: &[String]| {
            let q: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
            format!("[{}]", q.join(", "))
        };
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(
            &config,
            format!(
                "identity = {:?}\ngroup = \"ctl-test\"\nlisten = \"127.0.0.1:0\"\n\
                 peers = {}\ntrust = {}\nheartbeat_ms = 50\nsuspect_ms = 500\nflush_ms = 300\n",
                // Absolute: `--ctl` must not change where the key file is looked for, but
                // this test is about the socket.
                arg(&dir.join(format!("{name}.key"))),
                quoted(peers),
                quoted(trust)
            ),
        )
        .unwrap();
        let socket = dir.join(format!("{name}.sock"));
        let stderr = dir.join(format!("{name}.stderr"));
        let mut child = spawn(
            &[
                "group",
                "run",
                "--config",
                arg(&config),
                "--ctl",
                arg(&socket),
            ],
            Stdio::null(),
            Stdio::piped(),
            std::fs::File::create(&stderr).unwrap(),
        );
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                let Ok(value) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if tx.send(value).is_err() {
                    return;
                }
            }
        });
        Daemon {
            process: Guard(child),
            socket,
            lines,
            stderr,
        }
    }

    /// The first stdout line from now on for which `pred` holds.
    fn wait_line(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(v) if pred(&v) => return v,
                Ok(_) => {}
                Err(_) => panic!(
                    "no {what} on stdout; stderr: {}",
                    std::fs::read_to_string(&self.stderr).unwrap_or_default()
                ),
            }
        }
    }
}

fn members(answer: &Value) -> usize {
    answer["members"].as_array().map_or(0, Vec::len)
}

/// NEEDS THE LEAD'S WIRING: `cohort group run --ctl PATH` and `cohort group ctl`.
#[test]
fn a_member_with_closed_stdin_is_driven_only_through_its_ctl_socket() {
    let dir = tempdir("group-ctl-daemon");
    let a_pub = keygen(&dir, "a");
    let b_pub = keygen(&dir, "b");
    let trust = [a_pub.clone(), b_pub.clone()];
    let a = Daemon::start(&dir, "a", &[], &trust);
    let status = poll(&a.socket, &["status"], "status", |_| true);
    assert_eq!(status["id"], a_pub.as_str(), "{status}");
    let a_listen = status["listen"].as_str().unwrap().to_string();
    let b = Daemon::start(&dir, "b", std::slice::from_ref(&a_listen), &trust);

    // Both end up in one view of two, though neither has a standard input.
    let answer = poll(&a.socket, &["members"], "a view of 2", |v| members(v) == 2);
    let rows = answer["members"].as_array().unwrap();
    assert_eq!(rows[0]["id"], a_pub.as_str());
    assert_eq!(rows[0]["leader"], true);
    assert_eq!(rows[1]["id"], b_pub.as_str());
    let view = poll(&b.socket, &["view"], "a view of 2 at b", |v| {
        v["view"]["members"].as_array().map(Vec::len) == Some(2)
    });
    let epoch = view["view"]["key_epoch"].as_u64().unwrap();
    // The socket is the owner's only.
    assert_eq!(support::mode(&a.socket), 0o600);
    // A second member on the same (live) socket is refused before it starts anything.
    let out = cohort(&[
        "group",
        "run",
        "--config",
        arg(&dir.join("b.toml")),
        "--ctl",
        arg(&a.socket),
    ]);
    let stderr = exits_2(&out);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("another process answers"), "{stderr}");
    assert!(out.stdout.is_empty(), "it started: {}", text(&out.stdout));

    // Human output by default.
    let out = ctl(&a.socket, &["view"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        shown.contains("2 members") && shown.contains(&a_listen),
        "{shown}"
    );
    let out = ctl(&a.socket, &["status"]);
    assert!(text(&out.stdout).contains(&format!("id={a_pub}")));

    // Trust: the list from the config, then set to the same two again (nobody removed).
    let trusted = ctl_json(&a.socket, &["trust"]);
    assert_eq!(trusted["trusted"], serde_json::json!(trust), "{trusted}");
    let trusted = ctl_json(&a.socket, &["trust", "--set", &b_pub, &a_pub]);
    assert_eq!(trusted["trusted"], serde_json::json!([&b_pub, &a_pub]));

    // A message sent through a's socket is delivered at b (and shown on b's stdout).
    let sent = ctl_json(&a.socket, &["send", "hello over ctl"]);
    assert!(sent["seq"].is_u64(), "{sent}");
    let delivered = b.wait_line("the delivery", |v| v["event"] == "deliver");
    assert_eq!(delivered["sender"], a_pub.as_str());
    assert_eq!(delivered["data"], "aGVsbG8gb3ZlciBjdGw=");
    let out = ctl(&a.socket, &["send", "--channel", "unreliable", "u"]);
    assert!(
        text(&out.stdout).starts_with("sent, seq"),
        "{}",
        text(&out.stderr)
    );

    // A rekey through the socket: both see a newer key epoch.
    ctl_json(&a.socket, &["rekey"]);
    for socket in [&a.socket, &b.socket] {
        poll(socket, &["view"], "a newer key epoch", |v| {
            v["view"]["key_epoch"].as_u64() > Some(epoch)
        });
    }

    // b leaves through its socket: the answer comes, then b exits 0 and its socket is gone;
    // a goes on alone.
    let mut b = b;
    let out = ctl(&b.socket, &["leave"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "left the group\n");
    let exit = b.process.exit_within(Duration::from_secs(5));
    assert_eq!(
        exit.and_then(|s| s.code()),
        Some(0),
        "b did not exit 0 after leave"
    );
    assert!(!b.socket.exists(), "b's socket is still there");
    poll(&a.socket, &["members"], "a view of 1", |v| members(v) == 1);
    let out = ctl(&b.socket, &["status"]);
    assert!(exits_2(&out).contains("cannot reach a group member"));

    let mut a = a;
    ctl_json(&a.socket, &["leave"]);
    let exit = a.process.exit_within(Duration::from_secs(5));
    assert_eq!(
        exit.and_then(|s| s.code()),
        Some(0),
        "a did not exit 0 after leave"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Asserts that `out` is one stderr line containing `says`, nothing on stdout, exit 2.
fn one_line_exit_2(out: &Output, says: &str) {
    let stderr = exits_2(out);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(says), "{says:?} not in {stderr:?}");
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
}

/// A foreign "daemon" on `path` that answers each connection with `answer` (or closes it
/// at once when `answer` is None), reading the request first when `read_first`.
fn foreign(path: &Path, answer: Option<&'static [u8]>, read_first: bool) {
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            if read_first {
                let mut line = String::new();
                let _ = BufReader::new(&mut stream).read_line(&mut line);
            }
            if let Some(answer) = answer {
                let _ = stream.write_all(answer);
            }
        }
    });
}

#[test]
fn dead_and_foreign_sockets_are_one_line_and_exit_2() {
    let dir = tempdir("group-ctl-bad");
    // Nothing at the path.
    one_line_exit_2(
        &ctl(&dir.join("none.sock"), &["status"]),
        "cannot reach a group member on",
    );
    // A socket file nobody listens on any more (a crashed daemon's).
    let stale = dir.join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    one_line_exit_2(&ctl(&stale, &["view"]), "cannot reach a group member on");
    // A regular file.
    let file = dir.join("file.sock");
    std::fs::write(&file, b"x").unwrap();
    one_line_exit_2(&ctl(&file, &["members"]), "cannot reach a group member on");

    // Something that closes at once, with or without reading.
    for (name, read_first) in [("close.sock", false), ("readclose.sock", true)] {
        let path = dir.join(name);
        foreign(&path, None, read_first);
        one_line_exit_2(&ctl(&path, &["status"]), "closed without an answer");
    }
    // Garbage, and JSON of another protocol (a hop ctl's refusal).
    let garbage = dir.join("garbage.sock");
    foreign(&garbage, Some(b"HTTP/1.1 400 Bad Request\r\n\r\n"), true);
    one_line_exit_2(
        &ctl(&garbage, &["status"]),
        "does not speak cohort-group-ctl/1",
    );
    let other = dir.join("other.sock");
    foreign(
        &other,
        Some(b"{\"error\":\"unknown command \\\"view\\\" (status, open, close)\"}\n"),
        true,
    );
    one_line_exit_2(&ctl(&other, &["view"]), "does not speak cohort-group-ctl/1");
    // A send with bad base64 never reaches the socket.
    one_line_exit_2(
        &ctl(&other, &["send", "--base64", "!!!"]),
        "DATA is not base64",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Sanity of the helper above: the foreign server really answers what it is given (so the
/// exit-2 checks fail for the reason they name).
#[test]
fn the_foreign_server_answers() {
    let dir = tempdir("group-ctl-foreign");
    let path = dir.join("x.sock");
    foreign(&path, Some(b"hi\n"), true);
    let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
    s.write_all(b"{}\n").unwrap();
    let mut got = String::new();
    s.read_to_string(&mut got).unwrap();
    assert_eq!(got, "hi\n");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A message over the 16 MiB limit is refused before any socket is asked: one line, exit 2.
#[test]
fn a_message_over_the_limit_is_one_line_and_exit_2() {
    let dir = tempdir("group-ctl-big");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cohort"))
        .args([
            "group",
            "ctl",
            "--socket",
            arg(&dir.join("any.sock")),
            "send",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        // The command may stop reading at its limit: a broken pipe is fine.
        let _ = stdin.write_all(&vec![b'x'; (16 << 20) + 1]);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    one_line_exit_2(&out, "over the limit");
}
