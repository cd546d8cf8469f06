//! `cohort tunnel server|client`: protect unmodified TCP applications (tcpcrypt's
//! compatibility goal) with a cohort channel between two tunnel ends.
//!
//! ```text
//!   app ──TCP──▶ tunnel client ══ cohort channel (TCP) ══▶ tunnel server ──TCP──▶ target
//! ```
//!
//! Each side logs, per connection, the session ID, the suites and the authentication result,
//! and with `--metrics ADDR` serves its counters (connections, bytes, handshakes full,
//! resumed and failed by reason, drops by reason, the gears in use, a handshake latency
//! histogram) in the Prometheus text format.
//!
//! Both ends are thin layers over the library's [`cohort::channel`]: the client is a
//! [`Connector`], the server an [`Acceptor`] behind this command's own accept loop, which
//! adds the flood limits (see [`Limits`]) that a general-purpose `Listener` does not have.

/// Writes one line to stderr in a single system call. `eprintln!` writes the unbuffered
/// stderr one formatted piece at a time, a system call each: about a dozen for a
/// connection's line, which the server pays for every connection.
macro_rules! log_line {
    ($($arg:tt)*) => {{
        let mut line = format!($($arg)*);
        line.push('\n');
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
    }};
}

mod copy;

use crate::UsageError;
use clap::{Args, Subcommand};
use cohort::channel::{
    as_channel_error, failure_reason, Acceptor, AuthMode, ChannelError, ClientAuth, Connector,
    HandshakeKind, Identity, KemSuite, PublicKey, SecureStream,
};
use cohort::metrics::Registry;
use cohort_channel::config::MIN_PSK_LEN;
use cohort_crypto::{CryptoProvider, Secret};
use cohort_net::stream;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use tokio::net::{TcpListener, TcpStream};

/// The most bytes moved per read in each direction (large enough for four full records per
/// write); each direction's buffer starts at 4 KiB and grows to this while reads fill it.
const COPY_BUFFER: usize = 64 * 1024;

/// Most connections the tunnel client serves at once; more wait in the kernel's accept
/// queue. (The server's limits are flags: see [`ServerArgs`] and [`Limits`].)
const MAX_CONNECTIONS: usize = 1024;
/// The server's listen queue (the kernel caps it at net.core.somaxconn, 4096 by default).
const LISTEN_BACKLOG: u32 = 4096;
/// File descriptors the server holds apart from its connections: stdio, the listener, the
/// runtime's epoll and wakers, and slack for connections being closed.
const BASE_FDS: usize = 64;
/// Handshake failures logged one by one per report interval; the rest are only counted.
const LOGGED_FAILURES_PER_INTERVAL: u64 = 10;
/// How often the server prints its flood counters (when any changed).
const REPORT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
/// A server that accepts passwords lets one client address start this many handshakes per
/// minute: SPAKE2 allows one guess per handshake, so this bounds online guessing.
const PASSWORD_HANDSHAKES_PER_MINUTE: u32 = 20;

/// Handshakes per client address in the current minute.
#[derive(Default)]
struct Attempts(std::collections::HashMap<std::net::IpAddr, (std::time::Instant, u32)>);

impl Attempts {
    /// Counts one handshake from `ip`; false if it is over the limit.
    #[allow(clippy::disallowed_methods)] // reason: the binary is the I/O shell and owns the clock
    fn allow(&mut self, ip: std::net::IpAddr) -> bool {
        let now = std::time::Instant::now();
        let minute = std::time::Duration::from_secs(60);
        if self.0.len() > 100_000 {
            self.0
                .retain(|_, (start, _)| now.duration_since(*start) < minute);
        }
        let entry = self.0.entry(ip).or_insert((now, 0));
        if now.duration_since(entry.0) >= minute {
            *entry = (now, 0);
        }
        entry.1 += 1;
        entry.1 <= PASSWORD_HANDSHAKES_PER_MINUTE
    }
}

/// The two ends of a tunnel.
#[derive(Subcommand)]
pub enum TunnelCommand {
    /// Accept cohort channels and forward each to a plain TCP target.
    #[command(after_long_help = SERVER_LIMITS_HELP)]
    Server(ServerArgs),
    /// Accept plain TCP from local applications and carry each over a cohort channel.
    Client(ClientArgs),
}

/// `cohort tunnel server`.
#[derive(Args)]
pub struct ServerArgs {
    /// Address to accept cohort channels on.
    #[arg(long)]
    listen: SocketAddr,
    /// Plain TCP target (HOST:PORT) for each channel's bytes.
    #[arg(long)]
    forward: String,
    /// Identity file from `cohort keygen`: enables `signature` authentication.
    #[arg(long)]
    key: Option<PathBuf>,
    /// Authentication modes accepted, comma separated: none, signature, psk, password.
    /// Default: `signature,none` with --key, else `none`.
    #[arg(long, value_delimiter = ',')]
    auth: Vec<AuthMode>,
    /// File holding the pre-shared key (at least 32 random bytes, in hex), for `psk`.
    #[arg(long)]
    psk_file: Option<PathBuf>,
    /// File holding the password (first line), for `password`.
    #[arg(long)]
    password_file: Option<PathBuf>,
    /// Seconds (1 to 10) a connection has to complete its handshake; then it is closed.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=10))]
    handshake_timeout: u64,
    /// Most connections in their handshake at once (1 file descriptor each). A new
    /// connection beyond this closes the oldest one still in its handshake.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_pending: u64,
    /// Most established tunnels at once (2 file descriptors each: the channel and the
    /// target). A new one beyond this closes the longest-idle one.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_established: u64,
    /// Seconds an established tunnel may carry no bytes in either direction; then it is
    /// closed.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    idle_timeout: u64,
    /// Serve Prometheus metrics over HTTP on this address (GET /metrics).
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// Threads that run connections (1 to 64). With 1 (the default), one thread does
    /// everything and no wake-up crosses threads: on a 2-core machine that cut the server's
    /// CPU per connection by about a quarter (docs/performance.md, issue 18). Raise it on a
    /// machine with cores to spare for many busy tunnels.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    threads: u16,
}

/// The server's limits and bounds, shown by `cohort tunnel server --help`.
const SERVER_LIMITS_HELP: &str = "\
Limits against floods (defaults; see docs/reliability.md):
  A connection that has not completed its handshake within --handshake-timeout (5 s, at
  most 10) is closed. At most --max-pending (1024) connections are in their handshake; a new
  one beyond that closes pending ones (a sixteenth of the cap at a time), first the oldest
  whose first flight the server has not answered (stalled clients), then the oldest, so a
  new client always gets its chance. The listen queue is 4096 connections. At most
  --max-established (1024) tunnels are open; a new one beyond that closes the tunnel idle the
  longest, and a tunnel that carries no bytes for --idle-timeout (300 s) is closed.
  File descriptors: at most max-pending + 2 x max-established + 64 (3136 by default); the
  server warns at start if `ulimit -n` is lower.
  Memory: about 11 KiB per pending connection and 13 KiB per idle tunnel (measured with
  10,000 and 5,000 of them), up to about 210 KiB per tunnel that has moved bulk data (its
  two copy buffers and the channel's read buffer start at 4 KiB and grow to 64 KiB while
  reads fill them), on top of about 16 MiB for the process: at most about 240 MiB with the
  defaults.
  Counters of closed, timed-out and evicted connections are printed every 10 s.";

/// `cohort tunnel client`.
#[derive(Args)]
pub struct ClientArgs {
    /// Address local applications connect to.
    #[arg(long)]
    listen: SocketAddr,
    /// The tunnel server's address.
    #[arg(long)]
    connect: String,
    /// The server's public key (`ed25519:...`, printed by `cohort keygen`): requires
    /// `signature` authentication by that key.
    #[arg(long)]
    pin: Option<PublicKey>,
    /// Authentication mode: none, signature, psk or password. Default: `signature` with
    /// --pin, else `none`.
    #[arg(long)]
    auth: Option<AuthMode>,
    /// KEM suite: x25519-mlkem768 (default), mlkem768, x25519, rsa2048-e3.
    #[arg(long, default_value = "x25519-mlkem768")]
    kem: KemSuite,
    /// File holding the pre-shared key (at least 32 random bytes, in hex), for `psk`.
    #[arg(long)]
    psk_file: Option<PathBuf>,
    /// File holding the password (first line), for `password`.
    #[arg(long)]
    password_file: Option<PathBuf>,
    /// A fresh key exchange for every connection: no session tickets kept or offered, and
    /// a new ephemeral key pair each time (instead of one reused for 30 s). For measuring
    /// full handshakes, and for forward secrecy per connection.
    #[arg(long)]
    no_resume: bool,
    /// If the server does not speak cohort, carry the bytes in the clear (with a loud
    /// warning) instead of refusing. Never with an authentication mode.
    #[arg(long)]
    allow_plaintext: bool,
    /// Serve Prometheus metrics over HTTP on this address (GET /metrics).
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// Threads that run connections (1 to 64). With 1, one thread does everything and no
    /// wake-up crosses threads.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    threads: u16,
}

/// Runs a tunnel end until interrupted.
pub fn run(command: TunnelCommand) -> Result<(), UsageError> {
    let threads = match &command {
        TunnelCommand::Server(a) => a.threads,
        TunnelCommand::Client(a) => a.threads,
    };
    let threads = usize::from(threads);
    let mut builder = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    let runtime = builder
        .enable_all()
        .build()
        .map_err(|e| UsageError(format!("cannot start the runtime: {e}")))?;
    let side = match &command {
        TunnelCommand::Server(_) => "server",
        TunnelCommand::Client(_) => "client",
    };
    let metrics_addr = match &command {
        TunnelCommand::Server(a) => a.metrics,
        TunnelCommand::Client(a) => a.metrics,
    };
    runtime.block_on(async move {
        // Bound before anything else starts, so an address in use stops us cleanly.
        let metrics = TunnelMetrics::new(side, metrics_addr).await?;
        match command {
            TunnelCommand::Server(args) => run_server(args, metrics).await,
            TunnelCommand::Client(args) => run_client(args, metrics).await,
        }
    })
}

/// Labels with one pair (`reason`, `kind`, `direction`, `gear`).
type Label = [(&'static str, &'static str); 1];

/// What a tunnel end exports with `--metrics` (names carry the `cohort_tunnel_` prefix).
#[derive(Clone)]
struct TunnelMetrics {
    /// TCP connections accepted (server: from tunnel clients; client: from applications).
    connections: Counter,
    /// Tunnels open now (handshake done, bytes may flow).
    open: Gauge,
    /// Completed handshakes by kind (full, resumed).
    handshakes: Family<Label, Counter>,
    /// Failed handshakes by reason.
    failures: Family<Label, Counter>,
    /// Handshake durations.
    handshake_seconds: Histogram,
    /// Connections the end closed or refused, by reason.
    drops: Family<Label, Counter>,
    /// Plaintext bytes by direction: `sent` into the channel, `received` from it.
    bytes: Family<Label, Counter>,
    /// Open tunnels by record gear.
    gears: Family<Label, Gauge>,
}

impl TunnelMetrics {
    /// The families, registered and served on `addr` if given.
    async fn new(side: &str, addr: Option<SocketAddr>) -> Result<Self, UsageError> {
        let m = TunnelMetrics {
            connections: Counter::default(),
            open: Gauge::default(),
            handshakes: Family::default(),
            failures: Family::default(),
            handshake_seconds: Histogram::new(exponential_buckets(0.000_25, 2.0, 16)),
            drops: Family::default(),
            bytes: Family::default(),
            gears: Family::default(),
        };
        let Some(addr) = addr else { return Ok(m) };
        let mut registry = Registry::with_prefix("cohort_tunnel");
        registry.register(
            "connections",
            "TCP connections accepted",
            m.connections.clone(),
        );
        registry.register("open", "Tunnels open now", m.open.clone());
        registry.register(
            "handshakes",
            "Completed channel handshakes by kind (full, resumed)",
            m.handshakes.clone(),
        );
        registry.register(
            "handshake_failures",
            "Failed channel handshakes by reason",
            m.failures.clone(),
        );
        registry.register(
            "handshake_seconds",
            "Channel handshake duration",
            m.handshake_seconds.clone(),
        );
        registry.register(
            "drops",
            "Connections closed or refused by the tunnel, by reason",
            m.drops.clone(),
        );
        registry.register(
            "bytes",
            "Plaintext bytes, sent into or received from the channel",
            m.bytes.clone(),
        );
        registry.register(
            "gear_tunnels",
            "Open tunnels by record gear",
            m.gears.clone(),
        );
        let bound = cohort::metrics::serve(addr, registry)
            .await
            .map_err(|e| UsageError(format!("cannot serve metrics on {addr}: {e}")))?;
        log_line!("cohort tunnel {side}: metrics on http://{bound}/metrics");
        Ok(m)
    }

    fn drop_for(&self, reason: &'static str) {
        self.drops.get_or_create(&[("reason", reason)]).inc();
    }

    fn failed(&self, e: &std::io::Error) {
        self.failures
            .get_or_create(&[("reason", failure_reason(e))])
            .inc();
    }

    /// Counts a completed handshake; the returned guard keeps the tunnel counted as open.
    fn established(&self, secure: &SecureStream, took: std::time::Duration) -> OpenTunnel {
        self.handshakes
            .get_or_create(&[("kind", HandshakeKind::of(secure).name())])
            .inc();
        self.handshake_seconds.observe(took.as_secs_f64());
        let gears: Vec<&'static str> = secure
            .session()
            .map(|info| info.gears.iter().map(|g| g.name()).collect())
            .unwrap_or_default();
        for gear in &gears {
            self.gears.get_or_create(&[("gear", gear)]).inc();
        }
        self.open.inc();
        OpenTunnel {
            metrics: self.clone(),
            gears,
        }
    }

    fn byte_counter(&self, direction: &'static str) -> Counter {
        self.bytes
            .get_or_create(&[("direction", direction)])
            .clone()
    }
}

/// An open tunnel in the metrics; dropping it takes it out.
struct OpenTunnel {
    metrics: TunnelMetrics,
    gears: Vec<&'static str>,
}

impl Drop for OpenTunnel {
    fn drop(&mut self) {
        self.metrics.open.dec();
        for gear in &self.gears {
            self.metrics.gears.get_or_create(&[("gear", gear)]).dec();
        }
    }
}

fn read_file(path: &Path, what: &str) -> Result<String, UsageError> {
    std::fs::read_to_string(path)
        .map_err(|e| UsageError(format!("cannot read {what} {}: {e}", path.display())))
}

fn load_psk(path: &Path) -> Result<Secret, UsageError> {
    let text = zeroize::Zeroizing::new(read_file(path, "PSK file")?);
    let bytes = hex::decode(text.trim()).map_err(|_| {
        UsageError(format!(
            "{} must hold the PSK in hex (for example from `head -c 32 /dev/urandom | xxd -p -c 64`); for a human-chosen secret use --auth password",
            path.display()
        ))
    })?;
    if bytes.len() < MIN_PSK_LEN {
        return Err(UsageError(format!(
            "the PSK in {} is {} bytes; at least {MIN_PSK_LEN} random bytes are needed (a weak PSK can be searched offline; use --auth password for human-chosen secrets)",
            path.display(),
            bytes.len()
        )));
    }
    Ok(Secret::new(bytes))
}

fn load_password(path: &Path) -> Result<Secret, UsageError> {
    let text = zeroize::Zeroizing::new(read_file(path, "password file")?);
    let line = text.lines().next().unwrap_or("");
    if line.is_empty() {
        return Err(UsageError(format!("{} holds no password", path.display())));
    }
    Ok(Secret::from_slice(line.as_bytes()))
}

async fn run_server(args: ServerArgs, metrics: TunnelMetrics) -> Result<(), UsageError> {
    let provider = CryptoProvider::default_provider();
    let mut builder = Acceptor::builder();
    let has_identity = args.key.is_some();
    if let Some(path) = &args.key {
        builder = builder.identity(
            Identity::from_file_text(&provider, &read_file(path, "identity")?)
                .map_err(|e| UsageError(format!("{}: {e}", path.display())))?,
        );
    }
    // The library's default with and without an identity: `signature,none` or `none`.
    let modes = if args.auth.is_empty() {
        if has_identity {
            vec![AuthMode::ServerSignature, AuthMode::None]
        } else {
            vec![AuthMode::None]
        }
    } else {
        args.auth.clone()
    };
    if let Some(path) = &args.psk_file {
        builder = builder.psk(load_psk(path)?);
    }
    if let Some(path) = &args.password_file {
        builder = builder.password(load_password(path)?);
    }
    // Name the missing flag (the library names the missing secret).
    for mode in &modes {
        let (given, need) = match mode {
            AuthMode::ServerSignature => (has_identity, "--key"),
            AuthMode::Psk => (args.psk_file.is_some(), "--psk-file"),
            AuthMode::Password => (args.password_file.is_some(), "--password-file"),
            AuthMode::None => (true, "nothing"),
        };
        if !given {
            return Err(UsageError(format!("--auth {mode} needs {need}")));
        }
    }
    let acceptor = builder
        .auth_modes(modes)
        .build()
        .map_err(|e| UsageError(e.to_string()))?;
    let listener = listen(args.listen)
        .map_err(|e| UsageError(format!("cannot listen on {}: {e}", args.listen)))?;
    log_line!(
        "cohort tunnel server: listening on {}, forwarding to {}",
        listener.local_addr().unwrap_or(args.listen),
        args.forward
    );
    let limits = Limits::new(&args);
    let forward = std::sync::Arc::new(args.forward);
    // Expired resumption keys are erased every minute even when no one connects.
    let expiring = acceptor.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
            expiring.expire_sessions();
        }
    });
    limits.check_fd_limit();
    tokio::spawn(limits.clone().sweep_and_report());
    let limit_passwords = acceptor.supports(AuthMode::Password);
    let mut attempts = Attempts::default();
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                log_line!("cohort tunnel server: accept failed: {e}");
                // Out of file descriptors (a limit below the stated bound): do not spin.
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        metrics.connections.inc();
        if limit_passwords && !attempts.allow(peer.ip()) {
            metrics.drop_for("password_rate_limit");
            log_line!(
                "cohort tunnel server: {peer}: refused: over {PASSWORD_HANDSHAKES_PER_MINUTE} handshakes a minute from {} (password guessing limit)",
                peer.ip()
            );
            continue;
        }
        let _ = tcp.set_nodelay(true);
        // Admitted before the task runs, so the oldest pending one is closed now (and its
        // file descriptor, before this one counts).
        let Some(pending) = limits.admit_pending().await else {
            return Ok(());
        };
        let (acceptor, forward, limits, metrics) = (
            acceptor.clone(),
            forward.clone(),
            limits.clone(),
            metrics.clone(),
        );
        tokio::spawn(serve(
            acceptor, forward, limits, metrics, tcp, peer, pending,
        ));
    }
}

/// Serves one accepted connection: its handshake within the deadline (unless evicted
/// first), then the tunnel to the target until either end closes, the tunnel idles out or
/// it is evicted.
async fn serve(
    acceptor: Acceptor,
    forward: std::sync::Arc<String>,
    limits: Limits,
    metrics: TunnelMetrics,
    tcp: TcpStream,
    peer: SocketAddr,
    pending: Admitted,
) {
    let Admitted {
        slot: pending,
        closed: evicted,
        answered,
        ..
    } = pending;
    #[allow(clippy::disallowed_methods)] // reason: the binary is the I/O shell and owns the clock
    let started = std::time::Instant::now();
    let handshake = tokio::time::timeout(
        limits.handshake_timeout,
        acceptor.accept_tracked(tcp, &answered),
    );
    let mut secure = tokio::select! {
        result = handshake => match result {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                metrics.failed(&e);
                limits.count.failed.fetch_add(1, Relaxed);
                if limits.count.logged.fetch_add(1, Relaxed) < LOGGED_FAILURES_PER_INTERVAL {
                    log_line!("cohort tunnel server: {peer}: handshake failed: {e}");
                }
                return;
            }
            Err(_) => {
                metrics.failures.get_or_create(&[("reason", "timeout")]).inc();
                limits.count.timed_out.fetch_add(1, Relaxed);
                return;
            }
        },
        _ = evicted => {
            metrics.drop_for("evicted_pending");
            limits.count.evicted_pending.fetch_add(1, Relaxed);
            return;
        }
    };
    let _open = metrics.established(&secure, started.elapsed());
    log_session("server", peer, &secure);
    let Some(Admitted {
        slot: _established,
        closed: mut evicted,
        active,
        ..
    }) = limits.admit_established().await
    else {
        return;
    };
    // Its file descriptor now counts as an established tunnel's.
    drop(pending);
    let mut target = tokio::select! {
        result = TcpStream::connect(forward.as_str()) => match result {
            Ok(t) => t,
            Err(e) => {
                metrics.drop_for("target_unreachable");
                log_line!("cohort tunnel server: {peer}: cannot reach {forward}: {e}");
                return;
            }
        },
        _ = &mut evicted => {
            metrics.drop_for("evicted_idle");
            limits.count.evicted_idle.fetch_add(1, Relaxed);
            return;
        }
    };
    let _ = target.set_nodelay(true);
    let session = secure.session_id();
    // An idle tunnel waits here before the copy loop starts (its buffers come on its first
    // read).
    let ready = tokio::select! {
        r = secure.wait_readable() => Some(r),
        r = target.readable() => Some(r),
        _ = &mut evicted => None,
    };
    let result = match ready {
        None => None,
        Some(Err(e)) => Some(Err(e)),
        Some(Ok(())) => {
            let (received, sent) = (
                metrics.byte_counter("received"),
                metrics.byte_counter("sent"),
            );
            let mut channel = Active::new(&mut secure, &active, Some(&received));
            let mut plain = Active::new(&mut target, &active, Some(&sent));
            tokio::select! {
                r = copy::copy_both_ways(&mut channel, &mut plain, COPY_BUFFER, COPY_BUFFER) => Some(r),
                _ = &mut evicted => None,
            }
        }
    };
    match result {
        Some(Ok((up, down))) => log_line!(
            "cohort tunnel server: {peer}: session {session} closed cleanly ({up} bytes in, {down} out)"
        ),
        Some(Err(e)) => {
            log_line!("cohort tunnel server: {peer}: session {session} ended: {e}");
            // A reset, not a clean end: the target must not take a truncated stream for a
            // complete one.
            let _ = target.set_zero_linger();
        }
        None => {
            // Closed idle or for a newer tunnel: counted, and a reset for the target too.
            metrics.drop_for("evicted_idle");
            limits.count.evicted_idle.fetch_add(1, Relaxed);
            let _ = target.set_zero_linger();
        }
    }
}

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// What the server counts instead of logging each event (a flood would fill the log).
#[derive(Default)]
struct Counters {
    /// Handshakes not completed within the deadline.
    timed_out: AtomicU64,
    /// Pending connections closed to make room for a newer one.
    evicted_pending: AtomicU64,
    /// Established tunnels closed for idling out or to make room.
    evicted_idle: AtomicU64,
    /// Handshakes that failed (bad input, the peer left, authentication).
    failed: AtomicU64,
    /// Failures logged one by one in this interval.
    logged: AtomicU64,
}

/// One admitted connection in a [`Table`]. Closing it (eviction, or the table dropping
/// its entry) resolves the connection's receiver; the connection's [`Slot`] removes the
/// entry when the connection ends by itself.
struct Entry {
    /// Held, never sent: dropping it tells the connection to close.
    _close: tokio::sync::oneshot::Sender<()>,
    /// Nanoseconds on [`stream::now`]'s clock when bytes last moved.
    active: std::sync::Arc<AtomicU64>,
    /// Whether the server answered the client's first flight (pending connections).
    answered: std::sync::Arc<AtomicBool>,
}

/// What a connection gets on admission.
struct Admitted {
    /// Its place; dropped when the connection ends.
    slot: Slot,
    /// Resolves when the server closes it (eviction or idle).
    closed: tokio::sync::oneshot::Receiver<()>,
    /// Its activity clock.
    active: std::sync::Arc<AtomicU64>,
    /// Its handshake's progress.
    answered: std::sync::Arc<AtomicBool>,
}

/// Pending or established connections, oldest admitted first.
#[derive(Default)]
struct Table {
    next: u64,
    entries: std::collections::BTreeMap<u64, Entry>,
}

type Shared = std::sync::Arc<std::sync::Mutex<Table>>;

fn lock(table: &Shared) -> std::sync::MutexGuard<'_, Table> {
    // A panic while holding the lock cannot leave the map inconsistent: keep going.
    table
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A connection's place in a [`Table`], and its file descriptors' permit; dropping it
/// (after the connection's sockets are closed) frees both.
struct Slot {
    table: Shared,
    id: u64,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.table).entries.remove(&self.id);
    }
}

/// The server's flood limits: caps on pending and established connections with eviction,
/// the handshake deadline and the idle timeout.
#[derive(Clone)]
struct Limits {
    handshake_timeout: std::time::Duration,
    idle_timeout: std::time::Duration,
    max_pending: usize,
    max_established: usize,
    pending: Shared,
    established: Shared,
    /// One permit per pending connection whose socket is open, evicted or not.
    pending_open: std::sync::Arc<tokio::sync::Semaphore>,
    /// One permit per established tunnel whose sockets are open, evicted or not.
    established_open: std::sync::Arc<tokio::sync::Semaphore>,
    count: std::sync::Arc<Counters>,
}

impl Limits {
    fn new(args: &ServerArgs) -> Self {
        let cap = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        Limits {
            handshake_timeout: std::time::Duration::from_secs(args.handshake_timeout),
            idle_timeout: std::time::Duration::from_secs(args.idle_timeout),
            max_pending: cap(args.max_pending),
            max_established: cap(args.max_established),
            pending: Shared::default(),
            established: Shared::default(),
            pending_open: std::sync::Arc::new(tokio::sync::Semaphore::new(cap(args.max_pending))),
            established_open: std::sync::Arc::new(tokio::sync::Semaphore::new(cap(
                args.max_established
            ))),
            count: std::sync::Arc::default(),
        }
    }

    /// Most file descriptors the server holds.
    fn fd_bound(&self) -> usize {
        self.max_pending + 2 * self.max_established + BASE_FDS
    }

    /// Warns if the process may not open as many file descriptors as the limits allow.
    fn check_fd_limit(&self) {
        let bound = self.fd_bound();
        log_line!(
            "cohort tunnel server: limits: handshake {} s, {} pending, {} established, idle {} s; at most {bound} file descriptors",
            self.handshake_timeout.as_secs(),
            self.max_pending,
            self.max_established,
            self.idle_timeout.as_secs()
        );
        match open_files_limit() {
            Some(limit) if limit < bound as u64 => log_line!(
                "cohort tunnel server: WARNING: `ulimit -n` is {limit}, below the {bound} file descriptors the limits allow: raise it (ulimit -n {bound}) or lower --max-pending/--max-established, or accepts will fail under load"
            ),
            _ => {}
        }
    }

    /// Admits a connection into its handshake, first closing pending ones if the table is
    /// full: each the oldest whose first flight the server has not answered (a stalling
    /// client), else the oldest.
    async fn admit_pending(&self) -> Option<Admitted> {
        // A sixteenth at a time: the accept loop then waits for closed sockets once per
        // that many connections, not for each, and keeps ahead of a flood.
        let batch = (self.max_pending / 16).max(1);
        admit(
            &self.pending,
            &self.pending_open,
            self.max_pending,
            batch,
            |table: &mut Table| {
                let stalled = table
                    .entries
                    .iter()
                    .find(|(_, e)| !e.answered.load(Relaxed))
                    .map(|(id, _)| *id);
                match stalled {
                    Some(id) => {
                        table.entries.remove(&id);
                    }
                    None => {
                        table.entries.pop_first();
                    }
                }
            },
        )
        .await
    }

    /// Admits an established tunnel, first closing the longest-idle one if the table is
    /// full.
    async fn admit_established(&self) -> Option<Admitted> {
        admit(
            &self.established,
            &self.established_open,
            self.max_established,
            1,
            |table: &mut Table| {
                let idlest = table
                    .entries
                    .iter()
                    .min_by_key(|(_, e)| e.active.load(Relaxed))
                    .map(|(id, _)| *id);
                if let Some(id) = idlest {
                    table.entries.remove(&id);
                }
            },
        )
        .await
    }

    /// Every second closes tunnels idle too long; every [`REPORT_INTERVAL`] prints the
    /// counters if they changed.
    async fn sweep_and_report(self) {
        let mut last = [0u64; 4];
        let mut since_report = std::time::Duration::ZERO;
        let tick = std::time::Duration::from_secs(1);
        loop {
            tokio::time::sleep(tick).await;
            let now = stream::now().as_nanos();
            let idle = u64::try_from(self.idle_timeout.as_nanos()).unwrap_or(u64::MAX);
            let closed = {
                let mut table = lock(&self.established);
                let before = table.entries.len();
                table
                    .entries
                    .retain(|_, e| now.saturating_sub(e.active.load(Relaxed)) < idle);
                before - table.entries.len()
            };
            if closed > 0 {
                log_line!(
                    "cohort tunnel server: closed {closed} tunnels idle for {} s",
                    self.idle_timeout.as_secs()
                );
            }
            since_report += tick;
            if since_report < REPORT_INTERVAL {
                continue;
            }
            since_report = std::time::Duration::ZERO;
            let c = &self.count;
            let now_counts = [
                c.timed_out.load(Relaxed),
                c.evicted_pending.load(Relaxed),
                c.evicted_idle.load(Relaxed),
                c.failed.load(Relaxed),
            ];
            let logged = c.logged.swap(0, Relaxed);
            if now_counts != last {
                let pending = lock(&self.pending).entries.len();
                let established = lock(&self.established).entries.len();
                log_line!(
                    "cohort tunnel server: so far: {} handshakes timed out, {} pending closed for newer ones, {} tunnels closed idle or for newer ones, {} handshakes failed ({} not logged); now {pending} pending, {established} established",
                    now_counts[0],
                    now_counts[1],
                    now_counts[2],
                    now_counts[3],
                    logged.saturating_sub(LOGGED_FAILURES_PER_INTERVAL),
                );
                last = now_counts;
            }
        }
    }
}

/// Admits into `table`: closes `batch` entries with `evict` when the table is at `max`
/// (closing several at once lets the next admissions go on without waiting), and waits until a closed connection's sockets are gone (its permit from `open` is free), so
/// the file descriptors never exceed the bound. None if the semaphore was closed.
async fn admit(
    table: &Shared,
    open: &std::sync::Arc<tokio::sync::Semaphore>,
    max: usize,
    batch: usize,
    evict: impl Fn(&mut Table),
) -> Option<Admitted> {
    let permit = loop {
        {
            let mut t = lock(table);
            if t.entries.len() >= max {
                for _ in 0..batch {
                    evict(&mut t);
                }
            }
        }
        if let Ok(permit) = open.clone().try_acquire_owned() {
            break permit;
        }
        // An evicted connection closes its sockets when its task next runs; if none is
        // closing (others took the permits), evict again after a moment.
        tokio::select! {
            permit = open.clone().acquire_owned() => break permit.ok()?,
            () = tokio::time::sleep(std::time::Duration::from_millis(1)) => {}
        }
    };
    let (close, closed) = tokio::sync::oneshot::channel();
    let active = std::sync::Arc::new(AtomicU64::new(stream::now().as_nanos()));
    let answered = std::sync::Arc::new(AtomicBool::new(false));
    let mut t = lock(table);
    let id = t.next;
    t.next += 1;
    t.entries.insert(
        id,
        Entry {
            _close: close,
            active: active.clone(),
            answered: answered.clone(),
        },
    );
    drop(t);
    Some(Admitted {
        slot: Slot {
            table: table.clone(),
            id,
            _permit: permit,
        },
        closed,
        active,
        answered,
    })
}

/// The soft limit on open files (`ulimit -n`), from /proc/self/limits.
fn open_files_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// A stream that records, on its connection's activity clock, when bytes last arrived.
struct Active<'a, S> {
    inner: &'a mut S,
    active: &'a AtomicU64,
    /// Counts the bytes read (for the metrics).
    bytes: Option<&'a Counter>,
}

impl<'a, S> Active<'a, S> {
    fn new(inner: &'a mut S, active: &'a AtomicU64, bytes: Option<&'a Counter>) -> Self {
        Active {
            inner,
            active,
            bytes,
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Active<'_, S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = std::pin::Pin::new(&mut *self.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        if read > 0 {
            self.active.store(stream::now().as_nanos(), Relaxed);
            if let Some(bytes) = self.bytes {
                bytes.inc_by(read as u64);
            }
        }
        result
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Active<'_, S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut *self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.inner).poll_shutdown(cx)
    }
}

/// Listens on `addr` with a queue of [`LISTEN_BACKLOG`] connections not yet accepted: a
/// burst of connections beyond the queue makes the kernel drop new clients' SYNs, which they
/// retry only after a second.
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

fn log_session(side: &str, peer: SocketAddr, secure: &SecureStream) {
    if let Some(info) = secure.session() {
        let gears: Vec<&str> = info.gears.iter().map(|g| g.name()).collect();
        log_line!(
            "cohort tunnel {side}: {peer}: session {} kem {} gears {} auth {}",
            info.session_id,
            info.kem.map_or("none (resumed)", |k| k.name()),
            gears.join(","),
            info.auth
        );
    }
}

async fn run_client(args: ClientArgs, metrics: TunnelMetrics) -> Result<(), UsageError> {
    let mode = args.auth.unwrap_or(if args.pin.is_some() {
        AuthMode::ServerSignature
    } else {
        AuthMode::None
    });
    let auth = match mode {
        AuthMode::None => ClientAuth::None,
        AuthMode::ServerSignature => ClientAuth::ServerSignature {
            pinned: args
                .pin
                .ok_or_else(|| UsageError("--auth signature needs --pin".into()))?,
        },
        AuthMode::Psk => ClientAuth::Psk(load_psk(
            args.psk_file
                .as_deref()
                .ok_or_else(|| UsageError("--auth psk needs --psk-file".into()))?,
        )?),
        AuthMode::Password => {
            ClientAuth::Password(load_password(args.password_file.as_deref().ok_or_else(
                || UsageError("--auth password needs --password-file".into()),
            )?)?)
        }
    };
    if args.pin.is_some() && mode != AuthMode::ServerSignature {
        return Err(UsageError(format!(
            "--pin needs --auth signature (it was --auth {mode}, which would ignore the pin)"
        )));
    }
    if args.allow_plaintext && mode != AuthMode::None {
        return Err(UsageError(format!(
            "--allow-plaintext cannot be combined with --auth {mode}: authentication is never dropped"
        )));
    }
    let mut connector = Connector::builder(auth).kem(args.kem);
    if args.no_resume {
        connector = connector
            .resumption(false)
            .ephemeral_lifetime(std::time::Duration::ZERO);
    }
    let connector = connector.build();
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| UsageError(format!("cannot listen on {}: {e}", args.listen)))?;
    log_line!(
        "cohort tunnel client: listening on {}, tunnelling to {} (kem {}, auth {mode}{})",
        listener.local_addr().unwrap_or(args.listen),
        args.connect,
        args.kem,
        if args.no_resume {
            ", no resumption"
        } else {
            ""
        }
    );
    let remote = std::sync::Arc::new(args.connect);
    // Expired tickets and their resumption keys are erased every minute, even when idle.
    let expiring = connector.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
            expiring.expire_sessions();
        }
    });
    let allow_plaintext = args.allow_plaintext;
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return Ok(());
        };
        let (mut local, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                log_line!("cohort tunnel client: accept failed: {e}");
                continue;
            }
        };
        let _ = local.set_nodelay(true);
        metrics.connections.inc();
        let (connector, remote, metrics) = (connector.clone(), remote.clone(), metrics.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let tcp = match TcpStream::connect(remote.as_str()).await {
                Ok(t) => t,
                Err(e) => {
                    metrics.drop_for("server_unreachable");
                    log_line!("cohort tunnel client: {peer}: cannot reach {remote}: {e}");
                    return;
                }
            };
            let _ = tcp.set_nodelay(true);
            #[allow(clippy::disallowed_methods)]
            // reason: the binary is the I/O shell and owns the clock
            let started = std::time::Instant::now();
            let result = connector.connect_tcp(tcp, &remote).await;
            if let Err(e) = &result {
                metrics.failed(e);
            }
            let mut secure = match result {
                Ok(s) => s,
                Err(e) if as_channel_error(&e) == Some(ChannelError::NotCohort) => {
                    if !allow_plaintext {
                        log_line!(
                            "cohort tunnel client: {peer}: REFUSED: {remote} does not speak cohort (use --allow-plaintext to fall back to an unprotected connection)"
                        );
                        return;
                    }
                    log_line!(
                        "cohort tunnel client: {peer}: WARNING: {remote} does not speak cohort; THIS CONNECTION IS NOT ENCRYPTED OR AUTHENTICATED (--allow-plaintext)"
                    );
                    plaintext(local, &remote).await;
                    return;
                }
                Err(e) => {
                    log_line!("cohort tunnel client: {peer}: handshake with {remote} failed: {e}");
                    return;
                }
            };
            let _open = metrics.established(&secure, started.elapsed());
            log_session("client", peer, &secure);
            let (received, sent) = (
                metrics.byte_counter("received"),
                metrics.byte_counter("sent"),
            );
            let never = AtomicU64::new(0);
            let copied = {
                let mut plain = Active::new(&mut local, &never, Some(&sent));
                let mut channel = Active::new(&mut secure, &never, Some(&received));
                copy::copy_both_ways(&mut plain, &mut channel, COPY_BUFFER, COPY_BUFFER).await
            };
            match copied {
                Ok((up, down)) => log_line!(
                    "cohort tunnel client: {peer}: session {} closed cleanly ({up} bytes out, {down} in)",
                    secure.session_id()
                ),
                Err(e) => {
                    log_line!(
                        "cohort tunnel client: {peer}: session {} ended: {e}",
                        secure.session_id()
                    );
                    // A reset, not a clean end: the application must not take a truncated
                    // stream for a complete one.
                    let _ = local.set_zero_linger();
                }
            }
        });
    }
}

async fn plaintext(mut local: TcpStream, remote: &str) {
    match TcpStream::connect(remote).await {
        Ok(mut tcp) => {
            let _ = tokio::io::copy_bidirectional(&mut local, &mut tcp).await;
        }
        Err(e) => log_line!("cohort tunnel client: cannot reach {remote}: {e}"),
    }
}
