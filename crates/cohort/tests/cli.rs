//! The `cohort` binary, run as a user would.
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

mod support;

use std::process::Stdio;
use support::{arg, cohort, cohort_fed, spawn, tempdir, text};

#[test]
fn gears_list_shows_every_gear() {
    let out = cohort(&["gears", "list"]);
    assert!(out.status.success());
    let stdout = text(&out.stdout);
    for g in cohort_gears::ALL_GEARS {
        assert!(stdout.contains(g.name), "{} missing", g.name);
    }
    let out = cohort(&["gears", "list", "--json"]);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), cohort_gears::ALL_GEARS.len());
    let umac32 = rows.iter().find(|r| r["name"] == "umac-32").unwrap();
    assert_eq!(umac32["id"], 0x11);
    assert_eq!(umac32["tag_bits"], 32);
    assert_eq!(umac32["forgery_bits"], 30.0);
    assert_eq!(
        rows.iter().find(|r| r["name"] == "ifg").unwrap()["status"],
        "experimental"
    );
}

#[test]
fn gears_tag_matches_rfc4418_from_file_and_stdin() {
    let key = hex::encode("abcdefghijklmnop");
    let nonce = hex::encode("bcdefghi");
    let message = "abc".repeat(500);
    let dir = tempdir("cli");
    let file = dir.join("msg");
    std::fs::write(&file, &message).unwrap();
    for (gear, want) in [
        ("umac-32", "abeb3c8b"),
        ("umac-64", "d4cf26ddefd5c01a"),
        ("umac-96", "8824a260c53c66a36c9260a6"),
        ("umac-128", "8824a260c53c66a36c9260a62cb83aa1"),
    ] {
        let args = [
            "gears",
            "tag",
            "--gear",
            gear,
            "--key-hex",
            &key,
            "--nonce-hex",
            &nonce,
        ];
        let from_file = cohort(&[&args[..], &[arg(&file)]].concat());
        assert!(from_file.status.success(), "{}", text(&from_file.stderr));
        assert_eq!(text(&from_file.stdout).trim(), want, "{gear} from a file");
        let from_stdin = cohort_fed(&[&args[..], &["-"]].concat(), message.as_bytes());
        assert_eq!(text(&from_stdin.stdout).trim(), want, "{gear} from stdin");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gears_tag_hmac_rfc4231_case_2() {
    let out = cohort_fed(
        &[
            "gears",
            "tag",
            "--gear",
            "hmac-sha256",
            "--key-hex",
            &hex::encode("Jefe"),
        ],
        b"what do ya want for nothing?",
    );
    assert_eq!(
        text(&out.stdout).trim(),
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
}

#[test]
fn user_errors_are_one_line_with_status_2() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["gears", "tag", "--gear", "umac-32", "--key-hex", "zz"],
            "not valid hex",
        ),
        (
            &[
                "gears",
                "tag",
                "--gear",
                "umac-32",
                "--key-hex",
                "00",
                "--nonce-hex",
                "01",
            ],
            "16 bytes",
        ),
        (
            &["gears", "tag", "--gear", "hmac-md5", "--key-hex", "00"],
            "unknown gear 'hmac-md5'",
        ),
        (
            &[
                "gears",
                "tag",
                "--gear",
                "gmac-aes128",
                "--key-hex",
                &"00".repeat(16),
                "--nonce-hex",
                "00",
            ],
            "12 bytes",
        ),
    ];
    for (args, expect) in cases {
        let out = cohort_fed(args, b"data");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = text(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
    }
}

#[test]
fn bench_json_has_the_promised_fields() {
    let out = cohort(&[
        "gears", "bench", "--sizes", "64,1500", "--millis", "2", "--json", "--gears", "umac-32",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    // hmac-sha256 is always measured as the baseline.
    assert_eq!(rows.len(), 4);
    for row in rows {
        assert!(row["gear"].is_string());
        assert!(row["size"].as_u64().unwrap() > 0);
        assert!(row["bytes_per_sec"].as_f64().unwrap() > 0.0);
    }
    let svg = std::env::temp_dir().join(format!("cohort-fig4-{}.svg", std::process::id()));
    let out = cohort(&[
        "gears",
        "bench",
        "--sizes",
        "8192",
        "--millis",
        "2",
        "--svg",
        arg(&svg),
    ]);
    assert!(out.status.success());
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.starts_with("<svg") && drawn.contains("umac-32") && drawn.contains("partial-64"));
    std::fs::remove_file(svg).unwrap();
}

/// `cohort group bench --json` says how much was bundled (every member's sockets over the
/// counted seconds) and what each rekey cost the scheduler.
#[test]
fn group_bench_json_counts_bundles_and_rekeys() {
    let out = cohort(&[
        "group",
        "bench",
        "--members",
        "3",
        "--size",
        "256",
        "--seconds",
        "0.5",
        "--rekeys",
        "2",
        "--bundle",
        "65507",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["join"], "founder", "{v}");
    let udp = &v["udp"];
    let n = |k: &str| udp[k].as_u64().unwrap_or_else(|| panic!("no {k}: {v}"));
    assert!(n("datagrams_sent") > 0, "{v}");
    assert!(n("packets_sent") >= n("datagrams_sent"), "{v}");
    assert!(n("packets_in_bundles_sent") >= 2 * n("bundles_sent"), "{v}");
    assert_eq!(n("malformed_bundles"), 0, "{v}");
    assert!(v["rekey_ms_median"].as_f64().unwrap() > 0.0, "{v}");
    // The scheduler's times are updated at switches and ticks: a short rekey may read 0.
    if std::path::Path::new("/proc/self/schedstat").exists() {
        assert!(v["rekey_cpu_ms_median"].as_f64().unwrap() >= 0.0, "{v}");
        assert!(v["rekey_runq_wait_ms_median"].is_f64(), "{v}");
    }
}

/// `cohort group bench --rekey lkh` configures the LKH rekey and reports the bytes of each
/// rekey; `--rekey` and `--degree` are refused where they would be ignored.
#[test]
fn group_bench_rekeys_with_lkh_and_counts_bytes() {
    let out = cohort(&[
        "group",
        "bench",
        "--members",
        "5",
        "--seconds",
        "0.2",
        "--rekey",
        "lkh",
        "--degree",
        "2",
        "--rekeys",
        "2",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    assert_eq!(v["rekey"], "lkh (degree 2)", "{v}");
    let each = v["rekey_bytes_each"].as_array().unwrap();
    assert_eq!(each.len(), 2, "{v}");
    // Each rekey reaches the 4 other members: at least one group packet each.
    for b in each {
        assert!(b.as_f64().unwrap() >= 4.0 * 40.0, "{v}");
    }
    assert!(v["rekey_bytes_median"].as_f64().unwrap() > 0.0, "{v}");
    for bad in [&["--degree", "4"][..], &["--rekey", "lkh", "--facade"][..]] {
        let mut args = vec!["group", "bench", "--members", "2", "--seconds", "0.1"];
        args.extend_from_slice(bad);
        let out = cohort(&args);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains("--degree") || text(&out.stderr).contains("--rekey"));
    }
}

#[test]
fn demo_tells_the_story_and_no_forgery_gets_through() {
    let out = cohort(&["demo"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("forged packets accepted:   0"), "{stdout}");
    // The channel part: equal session IDs on both ends, a resumption, and a man in the
    // middle seen as different IDs and refused with a PSK.
    let id = |prefix: &str| {
        stdout
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix(prefix)
                    .map(|r| r.split_whitespace().next().unwrap().to_owned())
            })
            .unwrap_or_else(|| panic!("no {prefix:?} line:\n{stdout}"))
    };
    let (at_alice, at_bob) = (id("session ID at alice:"), id("session ID at bob:"));
    assert_eq!(at_alice.len(), 64);
    assert_eq!(at_alice, at_bob);
    assert!(stdout.contains("resumed: true; kem: none"), "{stdout}");
    assert!(
        stdout.contains("alice refuses: authentication failed"),
        "{stdout}"
    );
    // The record shown on the wire does not carry the plaintext.
    assert!(stdout.contains("on the wire, alice's"), "{stdout}");
    assert!(!stdout.contains(&hex::encode("meet at the")), "{stdout}");
    assert!(
        stdout.contains("high load"),
        "the controller should shift down under load:\n{stdout}"
    );
    assert!(
        stdout.contains("authentication failures in the window"),
        "the forgery burst should shift up:\n{stdout}"
    );
    // The hop-by-hop act: every packet of the forger next to r1 died at r1, and r2 and b
    // dropped nothing.
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("summary: forged traffic"))
        .unwrap_or_else(|| panic!("no hop summary:\n{stdout}"));
    assert!(
        summary.contains("dies at the first hop") && summary.contains("r2 and b saw none"),
        "{stdout}"
    );
    let (dropped, injected) = summary
        .split_once("r1 dropped ")
        .and_then(|(_, rest)| rest.split_once(';'))
        .and_then(|(counts, _)| counts.split_once(" of "))
        .map(|(d, i)| (d.parse::<u32>().unwrap(), i.parse::<u32>().unwrap()))
        .unwrap_or_else(|| panic!("no drop counts:\n{stdout}"));
    assert!(dropped == injected && injected > 0, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "r1's drop counters rose by {injected} (the forger sent {injected}); r2's by 0, b's by 0"
        )),
        "{stdout}"
    );
}

#[test]
fn a_closed_pipe_is_not_a_crash() {
    let mut child = spawn(
        &["gears", "list"],
        Stdio::inherit(),
        Stdio::piped(),
        Stdio::piped(),
    );
    // Read nothing and close our end, like `| head -0`.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
}

#[test]
fn gears_tag_reads_the_key_from_a_file() {
    let path = std::env::temp_dir().join(format!("cohort-key-{}", std::process::id()));
    std::fs::write(&path, format!("{}\n", hex::encode("abcdefghijklmnop"))).unwrap();
    let out = cohort_fed(
        &[
            "gears",
            "tag",
            "--gear",
            "umac-32",
            "--key-file",
            arg(&path),
            "--nonce-hex",
            &hex::encode("bcdefghi"),
        ],
        "abc".as_bytes(),
    );
    std::fs::remove_file(&path).unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "abf3a3a0");
    // Neither key option: a usage error (clap's own, status 2).
    let out = cohort_fed(&["gears", "tag", "--gear", "umac-32"], b"x");
    assert_eq!(out.status.code(), Some(2));
}

#[cfg(unix)]
mod keygen {
    use super::support::{arg, cohort, exits_2, mode, tempdir, text};
    use cohort_channel::identity::Identity;
    use cohort_crypto::CryptoProvider;
    use std::os::unix::fs::PermissionsExt;
    use std::path::{Path, PathBuf};

    /// A fresh scratch directory and the key path `server.id` in it.
    fn scratch(name: &str) -> (PathBuf, PathBuf) {
        let dir = tempdir(&format!("keygen-{name}"));
        let path = dir.join("server.id");
        (dir, path)
    }

    fn loaded_key(path: &Path) -> String {
        let file = std::fs::read_to_string(path).unwrap();
        Identity::from_file_text(&CryptoProvider::default_provider(), &file)
            .unwrap()
            .public()
            .to_string()
    }

    /// Runs `cohort keygen --out PATH [extra...]` and returns the printed key.
    fn keygen(path: &Path, extra: &[&str]) -> String {
        let out = cohort(&[&["keygen", "--out", arg(path)], extra].concat());
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
        let stdout = text(&out.stdout);
        assert_eq!(stdout.lines().count(), 1, "{stdout}");
        stdout.trim_end().to_string()
    }

    #[test]
    fn writes_an_owner_only_file_and_prints_its_public_key() {
        let (dir, path) = scratch("new");
        let printed = keygen(&path, &[]);
        assert!(
            printed.starts_with("ed25519:") && printed.len() == 8 + 64,
            "{printed}"
        );
        assert_eq!(mode(&path), 0o600);
        assert_eq!(loaded_key(&path), printed);
        // Nothing else was left in the directory.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_to_overwrite_without_force() {
        let (dir, path) = scratch("refuse");
        let first = keygen(&path, &[]);
        let before = std::fs::read(&path).unwrap();
        let out = cohort(&["keygen", "--out", arg(&path)]);
        let stderr = exits_2(&out);
        assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains("already exists"), "{stderr}");
        assert!(stderr.contains("--force"), "{stderr}");
        assert_eq!(std::fs::read(&path).unwrap(), before);
        assert_eq!(loaded_key(&path), first);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn force_replaces_the_key_and_the_permissions() {
        let (dir, path) = scratch("force");
        let first = keygen(&path, &[]);
        let second = keygen(&path, &["--force"]);
        assert_ne!(first, second);
        assert_eq!(loaded_key(&path), second);
        assert_eq!(mode(&path), 0o600);
        // A world-readable file in the way ends up owner-only too: it is replaced, not
        // rewritten in place.
        std::fs::write(&path, "not a key").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let third = keygen(&path, &["--force"]);
        assert_eq!(mode(&path), 0o600);
        assert_eq!(loaded_key(&path), third);
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temp file left"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unwritable_path_is_a_one_line_error() {
        let (dir, _) = scratch("missing");
        let path = dir.join("no-such-dir").join("server.id");
        for extra in [&[][..], &["--force"][..]] {
            let out = cohort(&[&["keygen", "--out", arg(&path)], extra].concat());
            assert_eq!(out.status.code(), Some(2), "{extra:?}");
            let stderr = text(&out.stderr);
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
            assert!(stderr.contains("cannot write"), "{stderr}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
