//! `cohort group many` end to end, over UDP on loopback (no broker, no root): two members in
//! one process form a group through their own fifos and event files, a message goes from
//! one to the other, every line carries its time, closing the fifos makes both leave and
//! the process exit 0; a config that cannot be read is one line naming its file (exit 2).
//! The namespace script `scripts/group-nats-netns.sh` runs hundreds of members this way.
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

mod support;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde_json::{json, Value};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{arg, cohort, exits_2, free_port, keygen, spawn, tempdir, Guard, WAIT};

/// The JSON lines of `path` so far (none if it does not exist yet).
fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Waits until `path` has a line `pred` accepts; returns it.
fn wait_line(path: &Path, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = lines(path).into_iter().find(|v| pred(v)) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "no {what} in {} within {WAIT:?}: {:?}",
            path.display(),
            lines(path)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Makes `path` a fifo and opens it for writing without waiting for its reader.
fn fifo(path: &Path) -> File {
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

#[test]
fn two_members_in_one_process_form_talk_and_leave() {
    let dir = tempdir("group-many");
    let names = ["alice", "bob"];
    let trust: Vec<String> = names
        .iter()
        .map(|n| format!("{:?}", keygen(&dir, n)))
        .collect();
    let ports = [free_port(), free_port()];
    let mut inputs = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let config = format!(
            "identity = \"{name}.key\"\ngroup = \"many\"\nlisten = \"127.0.0.1:{}\"\n\
             peers = [\"127.0.0.1:{}\"]\ntrust = [{}]\nheartbeat_ms = 50\nsuspect_ms = 500\n\
             flush_ms = 300\n",
            ports[i],
            ports[1 - i],
            trust.join(", ")
        );
        std::fs::write(dir.join(format!("{name}.toml")), config).unwrap();
        inputs.push(fifo(&dir.join(format!("{name}.in"))));
    }
    let (a, b) = (dir.join("alice.toml"), dir.join("bob.toml"));
    let mut child = Guard(spawn(
        &["group", "many", "--config", arg(&a), "--config", arg(&b)],
        Stdio::null(),
        Stdio::null(),
        Stdio::piped(),
    ));
    for name in names {
        wait_line(&dir.join(format!("{name}.out")), "view of 2", |v| {
            v["event"] == "view" && v["members"].as_array().map(Vec::len) == Some(2)
        });
    }
    let send =
        json!({"cmd": "send", "channel": "reliable", "data": BASE64.encode(b"hello from alice")});
    inputs[0].write_all(format!("{send}\n").as_bytes()).unwrap();
    let got = wait_line(&dir.join("bob.out"), "delivery at bob", |v| {
        v["event"] == "deliver"
    });
    assert_eq!(got["data"], BASE64.encode(b"hello from alice"));
    let alice_id = lines(&dir.join("alice.out"))[0]["id"].clone();
    assert_eq!(got["sender"], alice_id);
    // Every line of both members carries the time it was written, in order.
    for name in names {
        let ls = lines(&dir.join(format!("{name}.out")));
        assert!(ls.len() >= 3, "{name}: {ls:?}");
        let times: Vec<f64> = ls
            .iter()
            .map(|v| {
                v["t"]
                    .as_f64()
                    .unwrap_or_else(|| panic!("{name}: no t in {v}"))
            })
            .collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{name}: {times:?}");
        assert!(times[0] > 1.6e9, "{name}: not Unix seconds: {times:?}");
    }
    // The end of both inputs: both leave, the process exits 0.
    drop(inputs);
    let status = child.exit_within(WAIT).expect("group many did not exit");
    assert!(status.success(), "{status:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_config_is_one_line_naming_its_file() {
    let dir = tempdir("group-many-bad");
    keygen(&dir, "alice");
    let good = dir.join("good.toml");
    std::fs::write(
        &good,
        "identity = \"alice.key\"\ngroup = \"many\"\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "identity = \"alice.key\"\ngroup = \"many\"\ncolour = \"blue\"\n",
    )
    .unwrap();
    let missing = dir.join("nowhere.toml");
    // A good config whose command file is missing.
    let no_input = dir.join("alone.toml");
    std::fs::copy(&good, &no_input).unwrap();
    std::fs::write(dir.join("good.in"), "").unwrap();
    for (config, says) in [
        (&bad, "colour: unknown key"),
        (&missing, "cannot read"),
        (&no_input, "alone.in: missing"),
    ] {
        // The good one first: nothing starts before every config has been read.
        let out = cohort(&[
            "group",
            "many",
            "--config",
            arg(&good),
            "--config",
            arg(config),
        ]);
        let stderr = exits_2(&out);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        let name = config.file_stem().unwrap().to_str().unwrap();
        assert!(stderr.contains(name) && stderr.contains(says), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
