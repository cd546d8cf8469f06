//! The one test kit of the `cohort` binary's end-to-end tests (`cli.rs`, `group.rs`,
//! `hop.rs`, `kdc.rs`, `tunnel.rs`): scratch directories and key files, running `cohort` to
//! completion or in the background, refused configurations, a daemon's JSON lines and a
//! process's log read against a deadline, free ports, and killing on drop whatever a test
//! started.
//!
//! Owns: how a test starts, feeds, watches and stops a process, and the few rules that
//! several test files check alike (a user error exits with status 2; a config error is one
//! line naming its key). Must not hold any one test's expectations: what a line, a log or
//! an exit status must say stays in the test that says it, and nothing here skips or
//! softens a check. Each thing is done one way, here; a test file that needs it again uses
//! this module rather than a copy.
#![allow(dead_code)] // each test file uses part of the kit

use cohort_channel::identity::Identity;
use cohort_crypto::CryptoProvider;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long any one expected line, log text, port or datagram may take.
pub const WAIT: Duration = Duration::from_secs(20);

/// The binary under test.
const COHORT: &str = env!("CARGO_BIN_EXE_cohort");

/// A fresh, empty scratch directory `<tmp>/cohort-<name>-<pid>`.
pub fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cohort-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes a new identity to `<name>.key` in `dir`; returns its public key text.
pub fn keygen(dir: &Path, name: &str) -> String {
    let provider = CryptoProvider::default_provider();
    let id = Identity::generate(&provider).unwrap();
    std::fs::write(
        dir.join(format!("{name}.key")),
        id.to_file_text().as_bytes(),
    )
    .unwrap();
    id.public().to_string()
}

/// The permission bits of `path`.
#[cfg(unix)]
pub fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Output bytes as text (lossy).
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `path` as a command-line argument.
pub fn arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Runs `cohort ARGS` to completion with nothing on stdin.
pub fn cohort(args: &[&str]) -> Output {
    Command::new(COHORT)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Starts `cohort ARGS` with the given stdin, stdout and stderr. Every process the kit
/// runs in the background starts here.
pub fn spawn(args: &[&str], stdin: Stdio, stdout: Stdio, stderr: impl Into<Stdio>) -> Child {
    Command::new(COHORT)
        .args(args)
        .stdin(stdin)
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .expect("run cohort")
}

/// Runs `cohort ARGS` to completion with `input` on stdin.
pub fn cohort_fed(args: &[&str], input: &[u8]) -> Output {
    let mut child = spawn(args, Stdio::piped(), Stdio::piped(), Stdio::piped());
    // A command that fails before reading its input (a usage error) may exit first; the
    // write then meets a closed pipe, which is not what any test is about.
    match child.stdin.take().unwrap().write_all(input) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        result => result.unwrap(),
    }
    child.wait_with_output().unwrap()
}

/// Asserts that a finished `cohort` refused what it was given as a user error (exit status
/// 2); returns its stderr.
pub fn exits_2(out: &Output) -> String {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    stderr
}

/// Runs `cohort CMD --config CONFIG`, asserts that it exits with status 2 (a configuration
/// error), and returns its stderr.
pub fn refused(cmd: &[&str], config: &Path) -> String {
    let out = cohort(&[cmd, &["--config", arg(config)]].concat());
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{cmd:?} with {}: {stderr}",
        std::fs::read_to_string(config).unwrap_or_default()
    );
    stderr
}

/// Writes `config` to `bad.toml` in `dir` and [`refused`]s it.
pub fn refused_config(dir: &Path, cmd: &[&str], config: &str) -> String {
    let path = dir.join("bad.toml");
    std::fs::write(&path, config).unwrap();
    refused(cmd, &path)
}

/// `cohort CMD` refuses `config` (written to `bad.toml` in `dir`) with exit status 2 and a
/// stderr that contains `says`; returns that stderr.
pub fn assert_refused(dir: &Path, cmd: &[&str], config: &str, says: &str) -> String {
    let stderr = refused_config(dir, cmd, config);
    assert!(stderr.contains(says), "{config}: {stderr}");
    stderr
}

/// The rule every daemon's config reader keeps: `cohort CMD` refuses `config` (written to
/// `bad.toml` in `dir`) with exit status 2 and one line of stderr that says `config error:
/// KEY...` and names the file (`(in .../bad.toml)`).
pub fn assert_config_error(dir: &Path, cmd: &[&str], config: &str, key: &str) {
    let stderr = assert_refused(dir, cmd, config, &format!("config error: {key}"));
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    let file = format!("(in {})", dir.join("bad.toml").display());
    assert!(stderr.contains(&file), "names the file, {file}: {stderr}");
}

/// The rule for a config file that is not there: `cohort CMD --config <dir>/nowhere.toml`
/// exits with status 2 and says `nowhere.toml: cannot read`.
pub fn assert_missing_config(dir: &Path, cmd: &[&str]) {
    let stderr = refused(cmd, &dir.join("nowhere.toml"));
    assert!(stderr.contains("nowhere.toml: cannot read"), "{stderr}");
}

/// A loopback port, free for both TCP and UDP a moment ago, for a child process to bind.
///
/// It is taken below the kernel's ephemeral range (32768 and up on Linux), so no socket bound
/// to port 0 and no outgoing connection, in this test or in one running beside it, can take
/// it between this call and the child's bind. (Handing out a port the kernel chose for
/// `127.0.0.1:0` raced that way: CI once saw `Address already in use`.) The candidates start
/// at a place set by the process id and move on with a counter, so two tests in one binary
/// never get the same port and two test binaries rarely start at the same place.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(2_654_435_761) % SPAN;
    for _ in 0..SPAN {
        let port = (FIRST + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN) as u16;
        let tcp = TcpListener::bind(("127.0.0.1", port));
        let udp = std::net::UdpSocket::bind(("127.0.0.1", port));
        if tcp.is_ok() && udp.is_ok() {
            return port;
        }
    }
    panic!("no free loopback port between {FIRST} and {}", FIRST + SPAN)
}

/// Waits until something accepts TCP connections on loopback `port`.
pub fn wait_for_port(port: u16) {
    let deadline = Instant::now() + WAIT;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the log file at `path` contains `needle`; returns all of its text.
pub fn wait_for_log(path: &Path, needle: &str) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{} never said {needle:?}; it said:\n{text}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Asserts that `tool` is on the PATH: a test that needs it fails loudly, never skips. Only
/// the file is looked for (an executable of that name in a PATH directory): tools differ
/// in how they answer `--version` (`openssl` has none).
pub fn need(tool: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path).any(|dir| {
        std::fs::metadata(dir.join(tool))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    });
    assert!(
        found,
        "this test needs `{tool}` on the PATH (install it; .ci/run does)"
    );
}

/// `n` fresh identities and the trust list naming them all.
pub fn identities(n: usize) -> (Vec<Identity>, Vec<cohort::group::MemberId>) {
    let provider = CryptoProvider::default_provider();
    let ids: Vec<Identity> = (0..n)
        .map(|_| Identity::generate(&provider).unwrap())
        .collect();
    let trust = ids
        .iter()
        .map(|i| cohort::group::MemberId(i.public()))
        .collect();
    (ids, trust)
}

/// Kills (and reaps) its child when the test ends, however it ends.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Guard {
    /// Sends `signal` (a name such as "TERM" or "HUP") to the child with `kill`.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([format!("-{signal}"), self.0.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal}");
    }

    /// The child's exit status, if it exits within `within`.
    pub fn exit_within(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Starts `cohort ARGS` in the background: stdout discarded, stderr written to `log` (read it
/// with [`wait_for_log`]).
pub fn spawn_logged(args: &[&str], log: &Path) -> Guard {
    let file = std::fs::File::create(log).unwrap();
    Guard(spawn(args, Stdio::inherit(), Stdio::null(), file))
}

/// The lines of a child's pipe, read on a thread of their own.
struct Lines(mpsc::Receiver<String>);

impl Lines {
    fn read(pipe: impl Read + Send + 'static) -> Lines {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Lines(rx)
    }

    /// The next line, unless none comes before `deadline` (or the pipe closes).
    fn next_before(&self, deadline: Instant) -> Option<String> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.0.recv_timeout(left).ok()
    }
}

/// Makes a wrapper `struct $t { daemon: Daemon, .. }` (a daemon and what a test file reads
/// from its `started` line) usable as its [`Daemon`].
#[allow(unused_macros)] // only the daemon tests use it
macro_rules! wraps_daemon {
    ($t:ty) => {
        impl std::ops::Deref for $t {
            type Target = support::Daemon;
            fn deref(&self) -> &support::Daemon {
                &self.daemon
            }
        }
        impl std::ops::DerefMut for $t {
            fn deref_mut(&mut self) -> &mut support::Daemon {
                &mut self.daemon
            }
        }
    };
}
#[allow(unused_imports)] // only the daemon tests use it
pub(crate) use wraps_daemon;

/// A running `cohort` daemon that takes JSON commands on stdin and prints JSON lines on
/// stdout (`group run`, `hop run`); its stderr goes to `<name>.stderr`. Killed when dropped.
pub struct Daemon {
    /// The name it was started under, for failure messages.
    pub name: String,
    /// Every line read so far, in order.
    pub seen: Vec<Value>,
    /// Its first line, `{"event": "started", ...}`.
    pub started: Value,
    process: Guard,
    stdin: Option<ChildStdin>,
    lines: Lines,
    stderr: PathBuf,
}

impl Daemon {
    /// Writes `config` to `<name>.toml` in `dir`, starts `cohort CMD --config <that file>` and
    /// waits for its `started` line.
    pub fn start(dir: &Path, name: &str, cmd: &[&str], config: &str) -> Daemon {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, config).unwrap();
        let stderr = dir.join(format!("{name}.stderr"));
        let mut child = spawn(
            &[cmd, &["--config", arg(&path)]].concat(),
            Stdio::piped(),
            Stdio::piped(),
            std::fs::File::create(&stderr).unwrap(),
        );
        let lines = Lines::read(child.stdout.take().unwrap());
        let stdin = child.stdin.take();
        let mut daemon = Daemon {
            name: name.to_string(),
            seen: Vec::new(),
            started: Value::Null,
            process: Guard(child),
            stdin,
            lines,
            stderr,
        };
        daemon.started = daemon.wait("the started line", |v| v["event"] == "started");
        daemon
    }

    /// A string field of the `started` line.
    pub fn started_str(&self, key: &str) -> String {
        self.started[key].as_str().unwrap().to_string()
    }

    /// Writes one command line.
    pub fn command(&mut self, cmd: Value) {
        self.raw(&cmd.to_string());
    }

    /// Writes one line as it is (JSON or not).
    pub fn raw(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// The first line from now on that satisfies `pred` (earlier lines stay in `seen`); a
    /// line that is not JSON fails the test.
    pub fn wait(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + WAIT;
        while let Some(line) = self.lines.next_before(deadline) {
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("{}: not JSON ({e}): {line}", self.name));
            self.seen.push(v.clone());
            if pred(&v) {
                return v;
            }
        }
        panic!(
            "{} never printed {what}; it printed:\n{}\nstderr:\n{}",
            self.name,
            self.seen
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join("\n"),
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        )
    }

    /// Waits until `n` lines that satisfy `pred` have been seen in total; returns all of
    /// them in order.
    pub fn wait_count(
        &mut self,
        what: &str,
        n: usize,
        pred: impl Fn(&Value) -> bool,
    ) -> Vec<Value> {
        while self.seen.iter().filter(|v| pred(v)).count() < n {
            self.wait(what, &pred);
        }
        self.seen.iter().filter(|v| pred(v)).cloned().collect()
    }

    /// Waits for the process to end by itself; its exit status.
    pub fn exit_status(&mut self, within: Duration) -> ExitStatus {
        let name = &self.name;
        self.process
            .exit_within(within)
            .unwrap_or_else(|| panic!("{name} did not exit"))
    }

    /// SIGTERM (not SIGKILL), and waits up to 5 s for the process to end.
    pub fn terminate(&mut self) {
        self.process.signal("TERM");
        let name = &self.name;
        assert!(
            self.process.exit_within(Duration::from_secs(5)).is_some(),
            "{name} ignored SIGTERM"
        );
    }
}

/// A running `cohort` process watched through the lines of its stderr (`kdc serve`).
/// Killed when dropped.
pub struct StderrWatch {
    /// The process; signal it with [`Guard::signal`].
    pub process: Guard,
    /// Every stderr line read so far, in order.
    pub seen: Vec<String>,
    lines: Lines,
}

impl StderrWatch {
    /// Starts `cohort ARGS` with no stdin and stdout discarded.
    pub fn start(args: &[&str]) -> StderrWatch {
        let mut child = spawn(args, Stdio::null(), Stdio::null(), Stdio::piped());
        let lines = Lines::read(child.stderr.take().unwrap());
        StderrWatch {
            process: Guard(child),
            seen: Vec::new(),
            lines,
        }
    }

    /// The first stderr line, seen before or read from now on, that contains `needle`.
    pub fn wait_for(&mut self, needle: &str) -> String {
        if let Some(line) = self.seen.iter().find(|l| l.contains(needle)) {
            return line.clone();
        }
        let deadline = Instant::now() + WAIT;
        while let Some(line) = self.lines.next_before(deadline) {
            self.seen.push(line.clone());
            if line.contains(needle) {
                return line;
            }
        }
        panic!("no line with {needle:?}; saw {:#?}", self.seen)
    }
}
