//! What operators get around the protocols: human logs on stderr filtered by COHORT_LOG /
//! RUST_LOG (stdout untouched), shell completions that load in bash, man pages in roff, and
//! contrib/'s systemd units checked by systemd-analyze.
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

mod support;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use support::{exits_2, need, tempdir, text};

const COHORT: &str = env!("CARGO_BIN_EXE_cohort");

/// Runs `cohort ARGS` with exactly the log variables given (the others removed).
fn with_log(args: &[&str], vars: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(COHORT);
    cmd.args(args)
        .env_remove("COHORT_LOG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn logs_go_to_stderr_filtered_by_cohort_log_and_stdout_stays_the_same() {
    let args = ["gears", "list"];
    let quiet = with_log(&args, &[]);
    assert!(quiet.status.success(), "{}", text(&quiet.stderr));
    assert!(!quiet.stdout.is_empty());
    // Default level warn: nothing on stderr for a command that goes well.
    assert_eq!(text(&quiet.stderr), "");

    let debug = with_log(&args, &[("COHORT_LOG", "debug")]);
    assert!(debug.status.success());
    assert_eq!(debug.stdout, quiet.stdout, "logging changed stdout");
    let stderr = text(&debug.stderr);
    let line = stderr
        .lines()
        .find(|l| l.contains("cohort starting"))
        .unwrap_or_else(|| panic!("no debug line on stderr: {stderr:?}"));
    assert!(line.contains("DEBUG"), "{line}");
    // Not a terminal: no colour codes in the log.
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");

    // RUST_LOG works when COHORT_LOG is unset, and COHORT_LOG wins over it.
    let rust = with_log(&args, &[("RUST_LOG", "debug")]);
    assert!(text(&rust.stderr).contains("cohort starting"));
    assert_eq!(rust.stdout, quiet.stdout);
    let both = with_log(&args, &[("RUST_LOG", "debug"), ("COHORT_LOG", "warn")]);
    assert_eq!(text(&both.stderr), "");
    assert_eq!(both.stdout, quiet.stdout);
}

#[test]
fn a_malformed_cohort_log_is_one_line_and_exit_2() {
    let out = with_log(&["gears", "list"], &[("COHORT_LOG", "cohort=[[[")]);
    let stderr = exits_2(&out);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("cohort: COHORT_LOG="), "{stderr}");
    assert!(out.stdout.is_empty());
    // A malformed RUST_LOG (perhaps meant for another program) only warns.
    let out = with_log(&["gears", "list"], &[("RUST_LOG", "cohort=[[[")]);
    assert!(out.status.success());
    assert!(text(&out.stderr).contains("ignoring RUST_LOG"));
}

#[test]
fn bash_completions_load_and_know_the_subcommands() {
    need("bash");
    let out = Command::new("bash")
        .args([
            "-c",
            r#"source <("$0" completions bash) && complete -p cohort"#,
            COHORT,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        shown.starts_with("complete ") && shown.trim_end().ends_with(" cohort"),
        "{shown}"
    );
    let script = text(&with_log(&["completions", "bash"], &[]).stdout);
    for word in ["group", "tunnel", "kdc", "completions", "man", "--config"] {
        assert!(script.contains(word), "{word} not in the bash script");
    }
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let out = with_log(&["completions", shell], &[]);
        assert!(out.status.success() && !out.stdout.is_empty(), "{shell}");
    }
    let out = with_log(&["completions", "tcsh"], &[]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}

#[test]
fn man_prints_roff_and_writes_one_page_per_command() {
    let out = with_log(&["man"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = text(&out.stdout);
    let head: Vec<&str> = page.lines().take(10).collect();
    assert!(
        head.iter().any(|l| l.starts_with(".TH cohort 1")),
        "{head:#?}"
    );
    assert!(page.contains(".SH NAME") && page.contains(".SH SYNOPSIS"));
    let dir = tempdir("ops-man");
    let out = with_log(&["man", "--dir", dir.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for name in [
        "cohort.1",
        "cohort-group.1",
        "cohort-group-run.1",
        "cohort-kdc-serve.1",
    ] {
        let page = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        assert!(page.contains(".TH "), "{name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn contrib_systemd_units_verify() {
    need("systemd-analyze");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/verify-units.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(COHORT)
        .output()
        .unwrap();
    let shown = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{shown}");
    for unit in [
        "cohort-group@.service",
        "cohort-tunnel-server@.service",
        "cohort-kdc.service",
    ] {
        assert!(shown.contains(&format!("ok: {unit} verified")), "{shown}");
    }
}
