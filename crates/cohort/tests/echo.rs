//! The secure echo example (`cargo run -p cohort --example echo`) as a user runs it: both
//! sides in one process, then as two processes (server printing its key, client pinning it),
//! and a client pinning the wrong key refused.
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The example's binary: `cargo test` builds the examples next to the test binaries
/// (target/<profile>/examples).
fn echo_example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let path = profile_dir.join("examples").join("echo");
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build -p cohort --example echo` (cargo test -p cohort builds it)",
        path.display()
    );
    path
}

#[test]
fn both_sides_in_one_process_echo_every_message() {
    let out = Command::new(echo_example()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let oks: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("echo OK"))
        .collect();
    assert_eq!(oks.len(), 3, "{stdout}");
    assert!(oks[0].starts_with("echo OK 19 bytes"), "{stdout}");
    assert!(oks[2].starts_with("echo OK 1048576 bytes"), "{stdout}");
    // The client caches the session: the later channels resume it.
    assert!(oks[1].ends_with(", resumed)"), "{stdout}");
}

#[test]
fn server_and_client_as_two_processes() {
    let mut server = Command::new(echo_example())
        .args(["server", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let addr = lines.next().unwrap().unwrap();
    let addr = addr.strip_prefix("server on ").unwrap().to_string();
    let key = lines.next().unwrap().unwrap();
    let key = key.strip_prefix("key ").unwrap().to_string();

    let out = Command::new(echo_example())
        .args(["client", &addr, &key, "one", "two words"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("echo OK")).count(),
        2,
        "{stdout}"
    );
    assert!(stdout.contains("echo OK 9 bytes"), "{stdout}");

    // Another key: the server's signature does not verify, nothing is echoed.
    let other = "ed25519:".to_string() + &"11".repeat(32);
    let out = Command::new(echo_example())
        .args(["client", &addr, &other, "secret"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(!stdout.contains("echo OK"), "{stdout}");
    assert!(stderr.contains("echo:"), "{stderr}");
    server.kill().unwrap();
    server.wait().unwrap();
}
