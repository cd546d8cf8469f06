//! `cohort group run` as a user runs it: bad configurations are refused with a message naming
//! the key; three members on loopback form a view, deliver reliable messages in one order,
//! carry unreliable ones, rekey, survive a SIGKILL of one of them, answer status and leave;
//! a leader told to stop trusting a member removes it, which goes on alone.
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

mod support;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::{
    assert_config_error, assert_missing_config, assert_refused, keygen, tempdir, Daemon, WAIT,
};

/// `cohort group run`.
const GROUP_RUN: &[&str] = &["group", "run"];

fn quoted(items: &[String]) -> String {
    let q: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", q.join(", "))
}

/// A running `cohort group run` (a [`Daemon`]) and the id and address it started with.
struct Member {
    daemon: Daemon,
    id: String,
    listen: String,
}

support::wraps_daemon!(Member);

impl Member {
    /// Starts member `name` (its key is `<name>.key` in `dir`) on a free loopback port.
    fn start(dir: &Path, name: &str, peers: &[String], trust: &[String]) -> Member {
        let config = format!(
            "identity = \"{name}.key\"\ngroup = \"test\"\nlisten = \"127.0.0.1:0\"\n\
             peers = {}\ntrust = {}\nheartbeat_ms = 50\nsuspect_ms = 500\nflush_ms = 300\n",
            quoted(peers),
            quoted(trust)
        );
        let daemon = Daemon::start(dir, name, GROUP_RUN, &config);
        Member {
            id: daemon.started_str("id"),
            listen: daemon.started_str("listen"),
            daemon,
        }
    }

    fn send(&mut self, channel: &str, data: &[u8]) {
        self.command(json!({"cmd": "send", "channel": channel, "data": BASE64.encode(data)}));
    }

    /// Waits for a view of `n` members with a key epoch above `epoch`.
    fn wait_view(&mut self, n: usize, epoch: i64) -> Value {
        self.wait(&format!("a view of {n} with key epoch > {epoch}"), |v| {
            v["event"] == "view"
                && v["members"].as_array().map(Vec::len) == Some(n)
                && v["key_epoch"].as_i64().unwrap() > epoch
        })
    }

    /// Waits until `n` reliable deliveries have been seen in total; returns them in order as
    /// (order, sender, seq, data).
    fn reliable(&mut self, n: usize) -> Vec<(i64, String, i64, String)> {
        self.wait_count(&format!("{n} reliable deliveries"), n, |v| {
            v["event"] == "deliver" && v["channel"] == "reliable"
        })
        .iter()
        .map(|v| {
            (
                v["order"].as_i64().unwrap(),
                v["sender"].as_str().unwrap().to_string(),
                v["seq"].as_i64().unwrap(),
                v["data"].as_str().unwrap().to_string(),
            )
        })
        .collect()
    }
}

/// Alice, then bob (who knows alice's address), then carol (who knows both), all trusting
/// all three, in a fresh scratch directory `name`: the directory and the three.
fn alice_bob_and_carol(name: &str) -> (PathBuf, [Member; 3]) {
    let dir = tempdir(name);
    let names = ["alice", "bob", "carol"];
    let trust: Vec<String> = names.iter().map(|n| keygen(&dir, n)).collect();
    let alice = Member::start(&dir, "alice", &[], &trust);
    let bob = Member::start(&dir, "bob", std::slice::from_ref(&alice.listen), &trust);
    let carol = Member::start(
        &dir,
        "carol",
        &[alice.listen.clone(), bob.listen.clone()],
        &trust,
    );
    (dir, [alice, bob, carol])
}

/// Waits until every member has installed the same view of `n` members with a key epoch
/// above `epoch`; returns it.
fn converge(members: &mut [&mut Member], n: usize, epoch: i64) -> Value {
    let mut latest: Vec<Value> = members.iter_mut().map(|m| m.wait_view(n, epoch)).collect();
    let deadline = Instant::now() + WAIT;
    loop {
        if latest.iter().all(|v| v["view_id"] == latest[0]["view_id"]) {
            return latest.swap_remove(0);
        }
        assert!(Instant::now() < deadline, "the views differ: {latest:?}");
        let top = latest
            .iter()
            .map(|v| v["view_seq"].as_i64().unwrap())
            .max()
            .unwrap();
        for (m, v) in members.iter_mut().zip(&mut latest) {
            if v["view_seq"].as_i64().unwrap() < top {
                *v = m.wait_view(n, epoch);
            }
        }
    }
}

#[test]
fn bad_configs_exit_2_naming_the_key() {
    let dir = tempdir("group-bad");
    let public = keygen(&dir, "alice");
    std::fs::write(dir.join("junk.key"), "not a key\n").unwrap();
    let base = "identity = \"alice.key\"\ngroup = \"ops\"\nlisten = \"127.0.0.1:0\"\n";
    for (extra, key) in [
        (
            format!("trust = [\"{public}\", \"ed25519:xyz\"]"),
            "trust[1]: not a member id",
        ),
        ("gear = \"rot13\"".to_string(), "gear: unknown gear"),
        (
            "peers = [\"127.0.0.1\"]".to_string(),
            "peers[0]: not an IP:PORT address",
        ),
        ("colour = \"blue\"".to_string(), "colour: unknown key"),
        ("suspect_ms = 10".to_string(), "suspect_ms:"),
        ("send_window = 0".to_string(), "send_window:"),
        (
            "heartbeat_ms = \"fast\"".to_string(),
            "heartbeat_ms: must be a whole number",
        ),
    ] {
        assert_config_error(&dir, GROUP_RUN, &format!("{base}{extra}\n"), key);
    }
    for (text, key) in [
        (
            base.replace("alice.key", "missing.key"),
            "identity: cannot read",
        ),
        (base.replace("alice.key", "junk.key"), "identity:"),
        (base.replace("127.0.0.1:0", "127.0.0.1"), "listen:"),
        ("identity = \"alice.key\"\n".to_string(), "group: missing"),
        ("this is not toml".to_string(), "not valid TOML"),
    ] {
        assert_refused(&dir, GROUP_RUN, &text, key);
    }
    assert_missing_config(&dir, GROUP_RUN);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn three_members_form_a_group_talk_rekey_survive_a_kill_and_leave() {
    let (dir, [mut alice, mut bob, mut carol]) = alice_bob_and_carol("group-three");

    // One view of 3, the same at all three.
    let view = converge(&mut [&mut alice, &mut bob, &mut carol], 3, -1);
    for id in [&alice.id, &bob.id, &carol.id] {
        assert!(view["members"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m == id.as_str()));
    }
    assert_eq!(view["leader"], view["members"][0]);

    // Reliable: the same messages in the same order everywhere.
    for i in 0..5 {
        alice.send("reliable", format!("a{i}").as_bytes());
        bob.send("reliable", format!("b{i}").as_bytes());
    }
    let orders: Vec<_> = [&mut alice, &mut bob, &mut carol]
        .into_iter()
        .map(|m| m.reliable(10))
        .collect();
    assert_eq!(orders[0].len(), 10);
    assert!(orders.iter().all(|o| o == &orders[0]), "{orders:?}");
    let a_order: Vec<&String> = orders[0]
        .iter()
        .filter(|(_, sender, _, _)| *sender == alice.id)
        .map(|(_, _, _, data)| data)
        .collect();
    let expected: Vec<String> = (0..5).map(|i| BASE64.encode(format!("a{i}"))).collect();
    assert_eq!(
        a_order,
        expected.iter().collect::<Vec<_>>(),
        "alice's FIFO order"
    );

    // Unreliable: on loopback, at least one of three arrives at each other member.
    for i in 0..3 {
        carol.send("unreliable", format!("u{i}").as_bytes());
    }
    for m in [&mut alice, &mut bob] {
        let got = m.wait("an unreliable delivery", |v| {
            v["event"] == "deliver" && v["channel"] == "unreliable"
        });
        assert_eq!(got["sender"], carol.id.as_str());
        assert!(got["order"].is_null());
    }

    // Status, and bad lines answered with errors.
    alice.raw("this is not json");
    alice.wait("an error for a bad line", |v| {
        v["event"] == "error" && v["cmd"].is_null()
    });
    alice.command(json!({"cmd": "send", "data": "!!!"}));
    alice.wait("an error for bad base64", |v| {
        v["event"] == "error" && v["cmd"] == "send"
    });
    alice.command(json!({"cmd": "status"}));
    let status = alice.wait("a status line", |v| v["event"] == "status");
    assert_eq!(status["view"]["members"].as_array().unwrap().len(), 3);
    assert!(status["delivered_reliable"].as_u64().unwrap() >= 10);
    assert!(status["dropped"].is_object());

    // Rekey: a higher key epoch at all three.
    let epoch = |m: &Member| {
        m.seen
            .iter()
            .filter(|v| v["event"] == "view")
            .filter_map(|v| v["key_epoch"].as_i64())
            .max()
            .unwrap()
    };
    let before = epoch(&alice).max(epoch(&bob)).max(epoch(&carol));
    alice.command(json!({"cmd": "rekey"}));
    let after = converge(&mut [&mut alice, &mut bob, &mut carol], 3, before);
    assert!(after["key_epoch"].as_i64().unwrap() > before);

    // SIGKILL carol: a view of 2 with a higher key epoch, and carol removed.
    let carol_id = carol.id.clone();
    let top = after["key_epoch"].as_i64().unwrap();
    drop(carol);
    let two = converge(&mut [&mut alice, &mut bob], 2, top);
    assert!(!two["members"]
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x == carol_id.as_str()));
    for m in [&mut alice, &mut bob] {
        let removed = |v: &Value| v["event"] == "removed" && v["member"] == carol_id.as_str();
        if !m.seen.iter().any(removed) {
            m.wait("carol's removal", removed);
        }
    }

    // Bob leaves: his process exits 0; alice carries on alone.
    bob.command(json!({"cmd": "leave"}));
    let status = bob.exit_status(Duration::from_secs(10));
    assert!(status.success(), "bob: {status}");
    alice.wait_view(1, -1);
    alice.command(json!({"cmd": "status"}));
    let status = alice.wait("a status line", |v| v["event"] == "status");
    assert_eq!(status["view"]["members"].as_array().unwrap().len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_leader_that_stops_trusting_a_member_removes_it() {
    let (dir, mut members) = alice_bob_and_carol("group-trust");
    let view = {
        let [a, b, c] = &mut members;
        converge(&mut [a, b, c], 3, -1)
    };
    let epoch = view["key_epoch"].as_i64().unwrap();
    let leader = members
        .iter()
        .position(|m| view["leader"] == m.id.as_str())
        .expect("the leader is one of the three");
    // The member after the leader in our list (never the leader) loses the leader's trust.
    let victim = (leader + 1) % 3;
    let victim_id = members[victim].id.clone();

    // Malformed trust commands are answered with an error naming the problem, and change
    // nothing.
    let l = &mut members[leader];
    l.command(json!({"cmd": "trust", "remove": ["ed25519:zz"]}));
    let e = l.wait("an error for a malformed key", |v| v["event"] == "error");
    assert_eq!(e["cmd"], "trust", "{e}");
    // It names the field and the bad key (the wording around them may change).
    let text = e["error"].as_str().unwrap();
    assert!(
        text.contains("\"remove\"") && text.contains("\"ed25519:zz\""),
        "{e}"
    );
    l.command(json!({"cmd": "trust", "add": victim_id.as_str()}));
    let e = l.wait("an error for a key that is not in a list", |v| {
        v["event"] == "error"
    });
    assert_eq!(e["cmd"], "trust", "{e}");
    assert!(
        e["error"].as_str().unwrap().contains("must be a list"),
        "{e}"
    );
    l.command(json!({"cmd": "status"}));
    let status = l.wait("a status line", |v| v["event"] == "status");
    assert_eq!(status["view"]["members"].as_array().unwrap().len(), 3);
    assert!(
        !l.seen.iter().any(|v| v["event"] == "trust_changed"),
        "a malformed trust command changed the policy"
    );

    // The leader stops trusting the victim: it says so, and removes it with a fresh key.
    l.command(json!({"cmd": "trust", "remove": [victim_id]}));
    let changed = l.wait("trust_changed", |v| v["event"] == "trust_changed");
    assert_eq!(changed["trusted"], 2, "{changed}");
    assert_eq!(
        changed["untrusted_members"],
        json!([victim_id]),
        "{changed}"
    );
    let mut survivors: Vec<&mut Member> = members
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .map(|(_, m)| m)
        .collect();
    let two = converge(&mut survivors, 2, epoch);
    assert!(
        !two["members"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m == victim_id.as_str()),
        "{two}"
    );
    let removed = |v: &Value| v["event"] == "removed" && v["member"] == victim_id.as_str();
    for m in survivors.iter_mut() {
        let r = match m.seen.iter().find(|v| removed(v)) {
            Some(r) => r.clone(),
            None => m.wait("the victim's removal", removed),
        };
        assert_eq!(r["reason"], "untrusted", "{}: {r}", m.name);
    }

    // The victim goes on alone, in a view of its own.
    let alone = members[victim].wait_view(1, -1);
    assert_eq!(alone["members"], json!([victim_id]), "{alone}");

    // And it stays apart: the leader's gossip reaches it (it still trusts the leader), but
    // the leader takes neither a ticket nor a merge from a principal it does not trust.
    std::thread::sleep(Duration::from_millis(1500));
    let mut fingerprints = Vec::new();
    for (i, m) in members.iter_mut().enumerate() {
        m.command(json!({"cmd": "status"}));
        let s = m.wait("a status line", |v| v["event"] == "status");
        let n = if i == victim { 1 } else { 2 };
        assert_eq!(
            s["view"]["members"].as_array().unwrap().len(),
            n,
            "{}: {s}",
            m.name
        );
        fingerprints.push(s["key_fingerprint"].as_str().unwrap().to_string());
    }
    let other = 3 - leader - victim;
    assert_eq!(fingerprints[leader], fingerprints[other]);
    assert_ne!(fingerprints[leader], fingerprints[victim]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts `cohort group run` alone with the given stdin; returns the process and its
/// stdout lines so far once it printed `started`.
fn run_alone(dir: &Path, name: &str, stdin: std::process::Stdio) -> (support::Guard, PathBuf) {
    let public = keygen(dir, name);
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(
        &config,
        format!(
            "identity = \"{name}.key\"\ngroup = \"alone\"\nlisten = \"127.0.0.1:0\"\n\
             trust = [\"{public}\"]\nheartbeat_ms = 50\nsuspect_ms = 500\n"
        ),
    )
    .unwrap();
    let out = dir.join(format!("{name}.out"));
    let child = support::spawn(
        &["group", "run", "--config", support::arg(&config)],
        stdin,
        std::fs::File::create(&out).unwrap().into(),
        std::process::Stdio::null(),
    );
    (support::Guard(child), out)
}

/// The JSON lines a finished member printed.
fn lines(out: &Path) -> Vec<Value> {
    std::fs::read_to_string(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn run_with_stdin_closed_leaves_and_exits_0() {
    let dir = tempdir("group-eof");
    let (mut member, out) = run_alone(&dir, "alice", std::process::Stdio::null());
    let status = member
        .exit_within(Duration::from_secs(10))
        .expect("group run </dev/null still runs after 10 s");
    assert!(status.success(), "{status}");
    let lines = lines(&out);
    assert_eq!(lines[0]["event"], "started", "{lines:?}");
    assert_eq!(
        lines.last().unwrap(),
        &json!({"event": "expelled", "reason": "left"}),
        "{lines:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_leaves_and_exits_0() {
    let dir = tempdir("group-term");
    let (mut member, out) = run_alone(&dir, "alice", std::process::Stdio::piped());
    let deadline = Instant::now() + WAIT;
    while !lines(&out).iter().any(|v| v["event"] == "view") {
        assert!(Instant::now() < deadline, "no view");
        std::thread::sleep(Duration::from_millis(20));
    }
    member.signal("TERM");
    let status = member
        .exit_within(Duration::from_secs(10))
        .expect("group run still runs 10 s after SIGTERM");
    assert!(status.success(), "{status}");
    assert_eq!(
        lines(&out).last().unwrap(),
        &json!({"event": "expelled", "reason": "left"})
    );
    let _ = std::fs::remove_dir_all(&dir);
}
