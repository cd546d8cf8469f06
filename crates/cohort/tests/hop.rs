//! `cohort hop run|ctl|forge` as a user runs them: bad configurations are refused with a
//! message naming the key; two endpoints and a relay, three processes on loopback UDP,
//! handshake through the relay, open associations in several modes, exchange messages both
//! ways; `hop ctl` shows associations and counters and opens and closes associations; the
//! relay drops every packet `hop forge` sends and the endpoint delivers none of them.
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

mod support;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::{
    arg, assert_config_error, assert_missing_config, assert_refused, cohort, exits_2, keygen,
    tempdir, text, Daemon, WAIT,
};

/// `cohort hop run`.
const HOP_RUN: &[&str] = &["hop", "run"];

/// A running `cohort hop run` (a [`Daemon`]), the address it listens on and its control
/// socket.
struct Node {
    daemon: Daemon,
    listen: String,
    ctl: PathBuf,
}

support::wraps_daemon!(Node);

impl Node {
    /// Starts `hop run` with the config text `config` (written to `<name>.toml` in `dir`).
    fn start(dir: &Path, name: &str, config: &str) -> Node {
        let daemon = Daemon::start(dir, name, HOP_RUN, config);
        Node {
            listen: daemon.started_str("listen"),
            ctl: PathBuf::from(daemon.started_str("ctl")),
            daemon,
        }
    }

    fn send(&mut self, data: &[u8]) {
        self.command(json!({"cmd": "send", "data": BASE64.encode(data)}));
    }

    /// Waits until `n` messages have been received in total; returns their payloads.
    fn received(&mut self, n: usize) -> Vec<String> {
        self.wait_count(&format!("{n} received messages"), n, |v| {
            v["event"] == "received"
        })
        .iter()
        .map(|v| String::from_utf8(BASE64.decode(v["data"].as_str().unwrap()).unwrap()).unwrap())
        .collect()
    }

    /// `cohort hop ctl --socket <this node's> ARGS...`: stdout, asserting success.
    fn ctl(&self, args: &[&str]) -> String {
        let mut all = vec!["hop", "ctl", "--socket", arg(&self.ctl)];
        all.extend_from_slice(args);
        let out = cohort(&all);
        assert!(
            out.status.success(),
            "hop ctl {args:?} on {}: {}",
            self.name,
            text(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn ctl_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        serde_json::from_str(&self.ctl(&all)).unwrap()
    }
}

#[test]
fn bad_configs_exit_2_naming_the_key() {
    let dir = tempdir("hop-bad");
    let public = keygen(&dir, "a");
    let base = "role = \"endpoint\"\nidentity = \"a.key\"\nlisten = \"127.0.0.1:0\"\n";
    for (extra, key) in [
        (
            format!("trust = [\"{public}\", \"ed25519:xyz\"]"),
            "trust[1]: not an ed25519 public key",
        ),
        ("mode = \"q:3\"".to_string(), "mode: unknown mode"),
        ("colour = \"blue\"".to_string(), "colour: unknown key"),
        ("associations = 0".to_string(), "associations: must be"),
        ("storage = \"pebbles\"".to_string(), "storage:"),
        ("delay_ms = \"long\"".to_string(), "delay_ms: must be a whole number"),
        (
            "[[peer]]\naddress = \"127.0.0.1\"".to_string(),
            "peer[0].address: not an IP:PORT address",
        ),
        (
            "[[peer]]\naddress = \"127.0.0.1:9\"\nvia = \"relay\"".to_string(),
            "peer[0].via: not an IP:PORT address",
        ),
        (
            "app = \"tun\"\n[tun]\naddress = \"10.200.0.1/24\"\nmtu = 50\n[[peer]]\naddress = \"127.0.0.1:9\""
                .to_string(),
            "tun.mtu:",
        ),
        (
            "app = \"tun\"\n[tun]\naddress = \"127.0.0.1/8\"\n[[peer]]\naddress = \"127.0.0.2:9\""
                .to_string(),
            "tun.address: the tunnel subnet",
        ),
    ] {
        assert_config_error(&dir, HOP_RUN, &format!("{base}{extra}\n"), key);
    }
    for (text, key) in [
        (
            base.replace("a.key", "missing.key"),
            "identity: cannot read",
        ),
        (base.replace("endpoint", "router"), "role: unknown role"),
        (base.replace("127.0.0.1:0", "0.0.0.0:7000"), "listen:"),
        (
            "role = \"relay\"\nlisten = \"127.0.0.1:0\"\nmode = \"n\"".to_string(),
            "mode: unknown key for a relay",
        ),
        ("this is not toml".to_string(), "not valid TOML"),
    ] {
        assert_refused(&dir, HOP_RUN, &text, key);
    }
    assert_missing_config(&dir, HOP_RUN);
    // A flag that overrides the file is checked like the file.
    std::fs::write(dir.join("ok.toml"), base).unwrap();
    let out = cohort(&[
        "hop",
        "run",
        "--config",
        arg(&dir.join("ok.toml")),
        "--mode",
        "m:5000",
    ]);
    assert!(exits_2(&out).contains("--mode"));
    // ctl without a daemon.
    let out = cohort(&[
        "hop",
        "ctl",
        "--socket",
        arg(&dir.join("none.sock")),
        "status",
    ]);
    assert!(exits_2(&out).contains("cannot reach the daemon"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_endpoints_and_a_relay_talk_ctl_reports_and_forgeries_die_at_the_relay() {
    let dir = tempdir("hop-path");
    let ka = keygen(&dir, "a");
    let kb = keygen(&dir, "b");
    let mut relay = Node::start(
        &dir,
        "relay",
        &format!("role = \"relay\"\nlisten = \"127.0.0.1:0\"\ntrust = [\"{ka}\", \"{kb}\"]\n"),
    );
    // B has no configured peer: it answers A's handshake and opens its own association by
    // command.
    let mut b = Node::start(
        &dir,
        "b",
        &format!(
            "role = \"endpoint\"\nidentity = \"b.key\"\nlisten = \"127.0.0.1:0\"\ntrust = [\"{ka}\"]\n"
        ),
    );
    let mut a = Node::start(
        &dir,
        "a",
        &format!(
            "role = \"endpoint\"\nidentity = \"a.key\"\nlisten = \"127.0.0.1:0\"\n\
             mode = \"m:4\"\nassociations = 2\nchain_rounds = 64\n\
             [[peer]]\naddress = \"{}\"\nvia = \"{}\"\ntrust = \"{kb}\"\n",
            b.listen, relay.listen
        ),
    );

    // Handshake through the relay; A opens its two associations.
    a.wait("connected", |v| v["event"] == "connected");
    for _ in 0..2 {
        a.wait("an outgoing association", |v| {
            v["event"] == "opened" && v["dir"] == "out" && v["mode"] == "m:4"
        });
    }
    let connected = b.wait("connected", |v| v["event"] == "connected");
    assert_eq!(connected["peer"], a.listen.as_str());
    assert_eq!(connected["key"], ka.as_str());
    relay.wait("the pair learned", |v| v["event"] == "pair_learned");

    // A to B: every message arrives once, over both associations.
    let sent: BTreeSet<String> = (0..12).map(|i| format!("a-to-b {i}")).collect();
    for m in &sent {
        a.send(m.as_bytes());
    }
    let got = b.received(12);
    assert_eq!(got.iter().cloned().collect::<BTreeSet<_>>(), sent);
    assert_eq!(got.len(), 12, "no duplicates");
    let assocs: BTreeSet<i64> = b
        .seen
        .iter()
        .filter(|v| v["event"] == "received")
        .map(|v| v["assoc"].as_i64().unwrap())
        .collect();
    assert_eq!(assocs.len(), 2, "both associations carried data");

    // B opens an ALPHA-C association by command and answers.
    b.command(json!({"cmd": "open", "mode": "c:3"}));
    b.wait("its own association", |v| {
        v["event"] == "opened" && v["dir"] == "out" && v["mode"] == "c:3"
    });
    for i in 0..5 {
        b.send(format!("b-to-a {i}").as_bytes());
    }
    let back = a.received(5);
    assert_eq!(back.len(), 5);
    assert!(back.iter().all(|m| m.starts_with("b-to-a")));

    // Bad lines are answered with errors, not fatal.
    b.command(json!({"cmd": "send", "assoc": 77, "data": ""}));
    b.wait("an error for a missing association", |v| {
        v["event"] == "error" && v["cmd"] == "send"
    });
    b.command(json!({"cmd": "status"}));
    let status = b.wait("a status line", |v| v["event"] == "status");
    assert_eq!(status["role"], "endpoint");
    assert!(status["counters"]["delivered"].as_u64().unwrap() >= 12);

    // hop ctl: the relay verified and forwarded; A's associations and status.
    let counters = relay.ctl_json(&["counters"]);
    assert!(counters["forwarded"].as_u64().unwrap() > 0, "{counters}");
    assert!(counters["verified"].as_u64().unwrap() > 0, "{counters}");
    assert_eq!(counters["forged"], 0);
    let text = relay.ctl(&["associations"]);
    assert!(
        text.contains(&a.listen) && text.contains(&b.listen),
        "{text}"
    );
    let table = a.ctl(&["associations"]);
    assert!(table.starts_with("PEER"), "{table}");
    assert_eq!(table.matches("m:4").count(), 2, "{table}");
    assert!(table.contains("c:3"), "{table}");
    assert!(table.contains("ROUNDS_LEFT"), "{table}");
    let status = a.ctl_json(&["status"]);
    assert_eq!(status["peers"][0]["state"], "established");
    assert_eq!(status["peers"][0]["peer"], b.listen.as_str());
    let assocs = status["associations"].as_array().unwrap();
    let out_m4 = assocs
        .iter()
        .filter(|x| x["dir"] == "out" && x["mode"] == "m:4")
        .count();
    assert_eq!(out_m4, 2, "{status}");
    assert!(a.ctl(&["status"]).contains("established"));
    assert!(a.ctl(&["counters"]).contains("verified"));

    // ctl open / close.
    let opened = a.ctl_json(&["open", "--mode", "n"]);
    let id = opened["opening"].as_u64().expect("an association id");
    a.wait("the ctl-opened association", |v| {
        v["event"] == "opened" && v["dir"] == "out" && v["mode"] == "n"
    });
    a.ctl(&["close", "--assoc", &id.to_string()]);
    a.wait("its close", |v| {
        v["event"] == "closed" && v["assoc"] == id && v["dir"] == "out"
    });
    let bad = cohort(&[
        "hop",
        "ctl",
        "--socket",
        arg(&a.ctl),
        "close",
        "--assoc",
        "999",
    ]);
    assert!(exits_2(&bad).contains("no association 999"));

    // Forgeries at the relay, for the live associations A reports: all dropped, and B
    // delivers none of them.
    let before = relay.ctl_json(&["counters"]);
    let b_before = b.ctl_json(&["counters"]);
    let out = cohort(&[
        "hop",
        "forge",
        "--to",
        &relay.listen,
        "--ctl",
        arg(&a.ctl),
        "--rounds",
        "4",
        "--marker",
        "FORGED-MARKER",
    ]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let forged = report["sent"].as_u64().unwrap();
    assert!(forged > 0, "{report}");
    let dropped = |c: &Value| {
        [
            "malformed",
            "unknown",
            "forged",
            "replayed",
            "stale",
            "unverifiable",
        ]
        .iter()
        .map(|k| c[*k].as_u64().unwrap())
        .sum::<u64>()
    };
    let deadline = Instant::now() + WAIT;
    loop {
        let now = relay.ctl_json(&["counters"]);
        if dropped(&now) - dropped(&before) >= forged {
            assert_eq!(
                now["forwarded"], before["forwarded"],
                "nothing forged was forwarded"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the relay dropped {} of {forged}: {now}",
            dropped(&now) - dropped(&before)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let b_after = b.ctl_json(&["counters"]);
    assert_eq!(b_after["delivered"], b_before["delivered"]);
    // Real traffic still flows after the attack.
    a.send(b"after the attack");
    b.wait("a message after the attack", |v| {
        v["event"] == "received" && v["data"] == BASE64.encode("after the attack")
    });
    assert!(!b.seen.iter().any(|v| v["event"] == "received"
        && v["data"].as_str().is_some_and(|d| BASE64
            .decode(d)
            .unwrap()
            .windows(13)
            .any(|w| w == b"FORGED-MARKER"))));

    // The control socket goes away with the process.
    let ctl = a.ctl.clone();
    a.terminate();
    assert!(!ctl.exists(), "{} left behind", ctl.display());
    let _ = std::fs::remove_dir_all(&dir);
}
