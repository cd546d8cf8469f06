//! `cohort kdc serve|add-principal`: LSGC's key distribution center over UDP or a NATS
//! broker, and the way principals get registered with it.
//!
//! ```text
//!   add-principal NAME ── fresh K_NAME ─┬─▶ DIR/NAME.key   (mode 0600, for the principal)
//!                                       └─▶ database       (mode 0600, temp file + rename)
//!
//!   serve: database ─▶ Kdc ◀── UDP request ── leader
//!                       │ ──── UDP response ─▶ leader
//!                       ├─▶ stderr: one line per request (names and outcome, no secrets)
//!                       └─▶ metrics (optional): GET /metrics, Prometheus text
//!          SIGHUP: read the database again; SIGINT / SIGTERM: print the counters, exit
//! ```
//!
//! Both commands read the same configuration file:
//!
//! ```toml
//! listen = "0.0.0.0:7600"      # the KDC's UDP address
//! database = "kdc.db"          # relative to this file; created by add-principal
//! replay_cache = 16384         # optional: how many recent requests are remembered
//! metrics = "127.0.0.1:9600"   # optional: serve Prometheus metrics here (TCP)
//! ```
//!
//! Over NATS (issue 15; cargo feature `nats`) the KDC binds no socket: `listen` is its name,
//! which members in KDC mode give as their `kdc`; it listens on its own subject and
//! answers each request on the requesting member's subject (docs/wire.md, "KDC over
//! NATS"). Its answers are sealed under each member's long-term key, as over UDP, so the
//! broker carries no key:
//!
//! ```toml
//! transport = "nats"                 # "udp" (the default) or "nats"
//! nats = ["nats://10.0.0.1:4222"]    # the brokers, nearest first
//! nats_credentials = "kdc.creds"     # optional: a NATS credentials file
//! nats_ca = "ca.pem"                 # optional: a CA file (TLS is then required)
//! ```
//!
//! Any other key is an error, and every error names its key.

use crate::config_file::{err, from_toml, parse_addr, read_config, ConfigError, Whole};
use crate::keygen_cmd::{create_new, replace};
use crate::UsageError;
use clap::{Args, Subcommand};
use cohort_crypto::CryptoProvider;
use cohort_kdc::{Kdc, KeyFile, Outcome, PrincipalKey, PrincipalName, Registry, RegistryError};
use cohort_net::bundle;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use serde::Deserialize;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// `cohort kdc ...`
#[derive(Subcommand)]
pub enum KdcCommand {
    /// Run the key distribution center over UDP or NATS: answer pair-key requests from
    /// registered principals (one stderr line per request).
    Serve(ServeArgs),
    /// Register a principal: a fresh long-term key, added to the KDC's database and written
    /// to NAME.key for the principal (both owner-only).
    AddPrincipal(AddPrincipalArgs),
}

/// `cohort kdc serve`
#[derive(Args)]
pub struct ServeArgs {
    /// The KDC's configuration file (TOML: listen, database, optional replay_cache and
    /// metrics).
    #[arg(long)]
    pub config: PathBuf,
    /// Serve Prometheus metrics over HTTP on this address (GET /metrics), instead of the
    /// file's `metrics`.
    #[arg(long)]
    pub metrics: Option<SocketAddr>,
}

/// `cohort kdc add-principal`
#[derive(Args)]
pub struct AddPrincipalArgs {
    /// The principal's name: 1 to 31 characters of A-Z a-z 0-9 . _ -
    pub name: String,
    /// The KDC's configuration file (names the database; created if missing).
    #[arg(long)]
    pub config: PathBuf,
    /// Where to write NAME.key.
    #[arg(long, default_value = ".")]
    pub out: PathBuf,
    /// Give an existing principal a new key (its old key stops working) and replace its
    /// key file.
    #[arg(long)]
    pub force: bool,
}

/// Runs a `cohort kdc` command.
pub fn run(command: KdcCommand) -> Result<(), UsageError> {
    match command {
        KdcCommand::Serve(args) => serve(&args),
        KdcCommand::AddPrincipal(args) => add_principal(&args),
    }
}

/// The KDC's configuration, validated.
#[derive(Debug, PartialEq, Eq)]
pub struct KdcSetup {
    /// Where the KDC listens.
    pub listen: SocketAddr,
    /// The database file.
    pub database: PathBuf,
    /// How many recent `(requester, nonce)` pairs the KDC remembers.
    pub replay_cache: usize,
    /// Where to serve metrics, if anywhere.
    pub metrics: Option<SocketAddr>,
    /// How requests and answers travel.
    pub transport: KdcTransport,
}

/// How a KDC's requests and answers travel: the config's `transport` and its keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KdcTransport {
    /// A UDP socket bound to `listen` (the default).
    Udp,
    /// A NATS connection; `listen` is the KDC's name on the broker.
    #[cfg(feature = "nats")]
    Nats(cohort::group::NatsSetup),
}

/// The KDC's config file as written, typed but not yet checked (see
/// [`KdcFile::validate`]).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KdcFile {
    /// The KDC's UDP `IP:PORT` (required).
    pub listen: Option<String>,
    /// The database file, relative to the config file (required).
    pub database: Option<String>,
    /// How many recent requests are remembered (default
    /// [`cohort_kdc::DEFAULT_REPLAY_CAPACITY`]).
    pub replay_cache: Option<Whole>,
    /// Serve Prometheus metrics on this TCP `IP:PORT` (optional).
    pub metrics: Option<String>,
    /// `"udp"` (the default) or `"nats"`.
    pub transport: Option<String>,
    /// The NATS server URLs, nearest first (`transport = "nats"`).
    #[serde(default)]
    pub nats: Vec<String>,
    /// A NATS credentials file, relative to the config file.
    pub nats_credentials: Option<String>,
    /// A CA file for TLS to the NATS servers, relative to the config file.
    pub nats_ca: Option<String>,
}

/// Largest replay cache accepted (about 64 MiB).
const MAX_REPLAY_CACHE: u64 = 1 << 20;

/// Reads and parses the configuration file at `path`.
pub fn load(path: &Path) -> Result<KdcSetup, ConfigError> {
    read_config(path, parse)
}

/// Parses a configuration's text; `database` is relative to `base`. A file-level problem
/// (bad TOML) comes back with an empty key.
pub fn parse(text: &str, base: &Path) -> Result<KdcSetup, ConfigError> {
    from_toml::<KdcFile>(text)?.validate(base)
}

impl KdcFile {
    /// Checks the values and applies the default; `database` is relative to `base`.
    pub fn validate(self, base: &Path) -> Result<KdcSetup, ConfigError> {
        let listen = self
            .listen
            .as_deref()
            .ok_or_else(|| err("listen", "missing"))?;
        let listen = parse_addr("listen", listen)?;
        let database = match self.database.as_deref() {
            None => return Err(err("database", "missing")),
            Some("") => return Err(err("database", "must not be empty")),
            Some(path) => base.join(path),
        };
        let replay_cache = match self.replay_cache {
            None => cohort_kdc::DEFAULT_REPLAY_CAPACITY,
            Some(Whole(n)) if n <= MAX_REPLAY_CACHE => n as usize,
            Some(Whole(n)) => {
                return Err(err(
                    "replay_cache",
                    format!("must be 0 to {MAX_REPLAY_CACHE} ({n})"),
                ))
            }
        };
        let metrics = match self.metrics.as_deref() {
            None => None,
            Some(text) => Some(parse_addr("metrics", text)?),
        };
        let transport = self.transport(base, listen)?;
        Ok(KdcSetup {
            listen,
            database,
            replay_cache,
            metrics,
            transport,
        })
    }

    /// Checks `transport` and the NATS keys.
    fn transport(&self, base: &Path, listen: SocketAddr) -> Result<KdcTransport, ConfigError> {
        match self.transport.as_deref() {
            None | Some("udp") => {
                for (key, present) in [
                    ("nats", !self.nats.is_empty()),
                    ("nats_credentials", self.nats_credentials.is_some()),
                    ("nats_ca", self.nats_ca.is_some()),
                ] {
                    if present {
                        return Err(err(key, "only with transport = \"nats\""));
                    }
                }
                Ok(KdcTransport::Udp)
            }
            Some("nats") => self.nats_transport(base, listen),
            Some(other) => Err(err(
                "transport",
                format!("unknown transport {other:?} (udp or nats)"),
            )),
        }
    }

    #[cfg(feature = "nats")]
    fn nats_transport(&self, base: &Path, listen: SocketAddr) -> Result<KdcTransport, ConfigError> {
        if listen.port() == 0 {
            return Err(err(
                "listen",
                "over NATS the address names the KDC: give it a port other than 0",
            ));
        }
        if self.nats.is_empty() {
            return Err(err("nats", "missing: the broker URLs (nats://host:4222)"));
        }
        for (i, url) in self.nats.iter().enumerate() {
            url.parse::<async_nats::ServerAddr>()
                .map_err(|e| err(format!("nats[{i}]"), format!("not a NATS URL: {e}")))?;
        }
        let path = |p: &Option<String>| p.as_ref().map(|p| base.join(p));
        Ok(KdcTransport::Nats(cohort::group::NatsSetup {
            urls: self.nats.clone(),
            credentials: path(&self.nats_credentials),
            ca: path(&self.nats_ca),
        }))
    }

    #[cfg(not(feature = "nats"))]
    fn nats_transport(&self, _: &Path, _: SocketAddr) -> Result<KdcTransport, ConfigError> {
        Err(err(
            "transport",
            "this build has no NATS transport (cargo feature `nats`)",
        ))
    }
}

/// Reads the database for `serve`: a missing or broken one is a configuration error that
/// names the `database` key.
fn read_database(path: &Path) -> Result<Registry, ConfigError> {
    let shown = path.display();
    Registry::load(path).map_err(|e| match e {
        RegistryError::Io(e) if e.kind() == io::ErrorKind::NotFound => err(
            "database",
            format!("{shown} does not exist (create it with `cohort kdc add-principal`)"),
        ),
        RegistryError::Io(e) => err("database", format!("cannot read {shown}: {e}")),
        RegistryError::Format(e) => err("database", format!("{shown}: {e}")),
        other => err("database", format!("{shown}: {other}")),
    })
}

fn add_principal(args: &AddPrincipalArgs) -> Result<(), UsageError> {
    let name = PrincipalName::new(&args.name)
        .map_err(|e| UsageError(format!("invalid principal name {:?}: {e}", args.name)))?;
    let setup = load(&args.config).map_err(|e| UsageError(e.to_string()))?;
    let db = &setup.database;
    let (mut registry, created) = match Registry::load(db) {
        Ok(r) => (r, false),
        Err(RegistryError::Io(e)) if e.kind() == io::ErrorKind::NotFound => (Registry::new(), true),
        Err(e) => {
            return Err(UsageError(format!(
                "cannot use the database {}: {e}",
                db.display()
            )))
        }
    };
    if registry.contains(&name) && !args.force {
        return Err(UsageError(format!(
            "principal {name} is already registered in {} (use --force to give it a new key)",
            db.display()
        )));
    }
    let key_path = args.out.join(format!("{name}.key"));
    let shown = key_path.display();
    let file = KeyFile {
        name,
        key: PrincipalKey::generate(&mut rand_core::OsRng),
    };
    let text = file.to_text();
    let written = if args.force {
        replace(&key_path, text.as_bytes())
    } else {
        create_new(&key_path, text.as_bytes())
    };
    written.map_err(|e| match e.kind() {
        io::ErrorKind::AlreadyExists => UsageError(format!(
            "{shown} already exists (use --force to replace it)"
        )),
        _ => UsageError(format!("cannot write {shown}: {e}")),
    })?;
    let replaced = registry.insert(name, file.key.clone()).is_some();
    if let Err(e) = registry.save(db) {
        // Without the database entry the key file is useless; do not leave it behind.
        let _ = std::fs::remove_file(&key_path);
        return Err(UsageError(format!(
            "cannot write the database {}: {e}",
            db.display()
        )));
    }
    println!(
        "{} principal {name} in {} ({}{}); its key is in {shown} (mode 0600)",
        if replaced { "re-keyed" } else { "added" },
        db.display(),
        if created { "created, " } else { "" },
        count(registry.len()),
    );
    Ok(())
}

fn serve(args: &ServeArgs) -> Result<(), UsageError> {
    let mut setup = load(&args.config).map_err(|e| UsageError(e.to_string()))?;
    if args.metrics.is_some() {
        setup.metrics = args.metrics;
    }
    let registry = read_database(&setup.database).map_err(|e| UsageError(e.to_string()))?;
    warn_if_readable_by_others(&setup.database);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| UsageError(format!("cannot start the runtime: {e}")))?;
    runtime.block_on(serve_loop(setup, registry))
}

#[cfg(unix)]
fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path) {
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            eprintln!(
                "cohort kdc: warning: {} has mode {mode:o}; it holds every principal's key \
                 (chmod 600 it)",
                path.display()
            );
        }
    }
}

#[cfg(not(unix))]
fn warn_if_readable_by_others(_path: &Path) {}

/// "1 principal", "2 principals".
fn count(principals: usize) -> String {
    match principals {
        1 => "1 principal".into(),
        n => format!("{n} principals"),
    }
}

/// Largest datagram read: a request is at most 114 bytes, but a member's UDP driver may pack
/// several into one bundle of up to [`bundle::MAX_BUNDLE_BYTES`].
const MAX_DATAGRAM: usize = bundle::MAX_BUNDLE_BYTES;

/// Labels with one pair (`outcome`, `reason`, `direction`).
type Label = [(&'static str, &'static str); 1];

/// What `kdc serve --metrics` exports (names carry the `cohort_kdc_` prefix).
#[derive(Default)]
struct KdcMetrics {
    /// Requests answered, by outcome (answered, unknown_principal, unknown_requester).
    requests: Family<Label, Counter>,
    /// Requests dropped without an answer, by reason (malformed, bad_mac, replayed; over
    /// NATS also not_a_request: not carriage, or no acceptable reply subject).
    drops: Family<Label, Counter>,
    /// UDP payload bytes, received and sent.
    bytes: Family<Label, Counter>,
    /// Principals in the database.
    principals: Gauge,
    /// Database reloads (SIGHUP), by result.
    reloads: Family<Label, Counter>,
    /// Time to handle one request (parse, verify, answer).
    handle_seconds: Option<Histogram>,
}

impl KdcMetrics {
    /// The families, registered and served on `addr`; binds first so that an address in use
    /// fails before the KDC starts.
    async fn serve(addr: SocketAddr) -> Result<Self, UsageError> {
        let m = KdcMetrics {
            handle_seconds: Some(Histogram::new(exponential_buckets(0.000_002, 2.0, 16))),
            ..KdcMetrics::default()
        };
        let mut registry = cohort::metrics::Registry::with_prefix("cohort_kdc");
        registry.register(
            "requests",
            "Requests answered, by outcome",
            m.requests.clone(),
        );
        registry.register("drops", "Requests dropped, by reason", m.drops.clone());
        registry.register("bytes", "UDP payload bytes by direction", m.bytes.clone());
        registry.register(
            "principals",
            "Principals in the database",
            m.principals.clone(),
        );
        registry.register("reloads", "Database reloads by result", m.reloads.clone());
        if let Some(h) = &m.handle_seconds {
            registry.register("handle_seconds", "Time to handle one request", h.clone());
        }
        let bound = cohort::metrics::serve(addr, registry)
            .await
            .map_err(|e| UsageError(format!("cannot serve metrics on {addr}: {e}")))?;
        eprintln!("cohort kdc: metrics on http://{bound}/metrics");
        Ok(m)
    }

    fn count(&self, outcome: &Outcome, received: usize, took: std::time::Duration) {
        let (family, key, label) = match outcome {
            Outcome::Answered { .. } => (&self.requests, "outcome", "answered"),
            Outcome::UnknownPrincipal { .. } => (&self.requests, "outcome", "unknown_principal"),
            Outcome::UnknownRequester { .. } => (&self.requests, "outcome", "unknown_requester"),
            Outcome::Malformed(_) => (&self.drops, "reason", "malformed"),
            Outcome::BadMac { .. } => (&self.drops, "reason", "bad_mac"),
            Outcome::Replayed { .. } => (&self.drops, "reason", "replayed"),
        };
        family.get_or_create(&[(key, label)]).inc();
        self.bytes
            .get_or_create(&[("direction", "received")])
            .inc_by(received as u64);
        if let Some(h) = &self.handle_seconds {
            h.observe(took.as_secs_f64());
        }
    }
}

/// Where the KDC's requests come from and its answers go.
enum Carrier {
    /// A UDP socket bound to `listen`.
    Udp(tokio::net::UdpSocket),
    /// A NATS connection; `listen` is the KDC's name.
    #[cfg(feature = "nats")]
    Nats(Box<cohort::group::NatsKdc>),
}

/// Where an answer goes.
enum ReplyTo {
    Udp(SocketAddr),
    #[cfg(feature = "nats")]
    Nats(cohort::group::ReplySubject),
}

/// What [`Carrier::recv`] brings.
enum Arrived {
    /// A request of `len` bytes at the start of the buffer, from `from`.
    Request {
        from: SocketAddr,
        len: usize,
        reply: ReplyTo,
    },
    /// A change of the broker connection, for the log.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    // reason: only NATS has connection events
    Event(String),
    /// Nothing for the KDC (an ICMP error on the UDP socket).
    Nothing,
}

impl Carrier {
    /// Binds the socket or connects to the brokers; also returns where the KDC serves, for
    /// the log.
    async fn open(setup: &KdcSetup) -> Result<(Carrier, String), UsageError> {
        let listen = setup.listen;
        match &setup.transport {
            KdcTransport::Udp => {
                let socket = cohort_net::bind_udp(listen)
                    .map_err(|e| UsageError(format!("cannot listen on {listen}: {e}")))?;
                let local = socket
                    .local_addr()
                    .map_err(|e| UsageError(format!("cannot read the socket's address: {e}")))?;
                Ok((Carrier::Udp(socket), format!("listening on {local}")))
            }
            #[cfg(feature = "nats")]
            KdcTransport::Nats(nats) => {
                let kdc = cohort::group::serve_kdc(nats, listen)
                    .await
                    .map_err(UsageError)?;
                let at = format!(
                    "serving {listen} on NATS subject {} via {}",
                    kdc.subject(),
                    nats.urls.join(", ")
                );
                Ok((Carrier::Nats(Box::new(kdc)), at))
            }
        }
    }

    /// The next request or event. Cancel-safe. An error ends the KDC.
    async fn recv(&mut self, buf: &mut [u8]) -> Result<Arrived, UsageError> {
        match self {
            Carrier::Udp(socket) => match socket.recv_from(buf).await {
                Ok((len, from)) => Ok(Arrived::Request {
                    from,
                    len,
                    reply: ReplyTo::Udp(from),
                }),
                // ICMP errors (port unreachable) surface here; they are not fatal.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(Arrived::Nothing),
                Err(e) => Err(UsageError(format!("the UDP socket failed: {e}"))),
            },
            #[cfg(feature = "nats")]
            Carrier::Nats(kdc) => match kdc.recv(buf).await {
                Ok(cohort::group::KdcCarried::Request { from, reply, len }) => {
                    Ok(Arrived::Request {
                        from,
                        len,
                        reply: ReplyTo::Nats(reply),
                    })
                }
                Ok(cohort::group::KdcCarried::Event(e)) => Ok(Arrived::Event(e)),
                Err(e) => Err(UsageError(format!("the NATS connection failed: {e}"))),
            },
        }
    }

    /// Sends an answer; returns the bytes handed to the socket or the broker.
    async fn send(&mut self, to: ReplyTo, reply: &[u8]) -> io::Result<usize> {
        match (self, to) {
            (Carrier::Udp(socket), ReplyTo::Udp(addr)) => socket.send_to(reply, addr).await,
            #[cfg(feature = "nats")]
            (Carrier::Nats(kdc), ReplyTo::Nats(subject)) => kdc.reply(subject, reply).await,
            #[cfg(feature = "nats")]
            _ => Err(io::Error::other("an answer for another carrier")),
        }
    }

    /// Messages the carrier dropped before the KDC saw them (NATS: not carriage, no reply
    /// subject, or a reply subject that is not the sender's).
    fn dropped(&self) -> u64 {
        match self {
            Carrier::Udp(_) => 0,
            #[cfg(feature = "nats")]
            Carrier::Nats(kdc) => kdc.dropped(),
        }
    }
}

/// Handles one datagram from `from`: a request, or (over UDP) a bundle of requests, which
/// a member's UDP driver makes of what one flush queues for the KDC (pair-key requests for
/// several members); each request in it is answered on its own, as if it had come alone.
/// False if it was a bundle that does not parse (dropped whole, counted as malformed).
async fn answer_datagram(
    kdc: &mut Kdc,
    carrier: &mut Carrier,
    metrics: &KdcMetrics,
    from: SocketAddr,
    datagram: &[u8],
    reply_to: ReplyTo,
) -> bool {
    if !(matches!(reply_to, ReplyTo::Udp(_)) && bundle::is_bundle(datagram)) {
        answer(kdc, carrier, metrics, from, datagram, reply_to).await;
        return true;
    }
    let received = |n: usize| {
        metrics
            .bytes
            .get_or_create(&[("direction", "received")])
            .inc_by(n as u64);
    };
    match bundle::parse(datagram) {
        Ok(requests) => {
            let mut inside = 0;
            for request in requests {
                inside += request.len();
                answer(kdc, carrier, metrics, from, request, ReplyTo::Udp(from)).await;
            }
            // The bundle's own header bytes (each request counted its own).
            received(datagram.len() - inside);
            true
        }
        Err(e) => {
            metrics
                .drops
                .get_or_create(&[("reason", "malformed")])
                .inc();
            received(datagram.len());
            eprintln!("cohort kdc: {from}: dropped, malformed bundle: {e}");
            false
        }
    }
}

/// Handles one request (a datagram, or one packet of a bundle) from `from`: counts it, logs
/// its outcome and sends the answer, if any, to `reply_to`.
async fn answer(
    kdc: &mut Kdc,
    carrier: &mut Carrier,
    metrics: &KdcMetrics,
    from: SocketAddr,
    request: &[u8],
    reply_to: ReplyTo,
) {
    #[allow(clippy::disallowed_methods)] // reason: the binary is the I/O shell and owns the clock
    let started = std::time::Instant::now();
    let handled = kdc.handle(from, request);
    metrics.count(&handled.outcome, request.len(), started.elapsed());
    eprintln!("cohort kdc: {from}: {}", handled.outcome);
    if let Some(reply) = handled.reply {
        match carrier.send(reply_to, &reply).await {
            Ok(n) => {
                metrics
                    .bytes
                    .get_or_create(&[("direction", "sent")])
                    .inc_by(n as u64);
            }
            Err(e) => eprintln!("cohort kdc: {from}: cannot send the response: {e}"),
        }
    }
}

async fn serve_loop(setup: KdcSetup, registry: Registry) -> Result<(), UsageError> {
    use tokio::signal::unix::{signal, SignalKind};
    // Bound before anything else starts, so an address in use stops us cleanly.
    let metrics = match setup.metrics {
        Some(addr) => KdcMetrics::serve(addr).await?,
        None => KdcMetrics::default(),
    };
    metrics.principals.set(registry.len() as i64);
    let (mut carrier, serving) = Carrier::open(&setup).await?;
    let watch = |kind: SignalKind, name: &str| {
        signal(kind).map_err(|e| UsageError(format!("cannot watch {name}: {e}")))
    };
    let mut terminate = watch(SignalKind::terminate(), "SIGTERM")?;
    let mut interrupt = watch(SignalKind::interrupt(), "SIGINT")?;
    let mut hangup = watch(SignalKind::hangup(), "SIGHUP")?;
    let provider = CryptoProvider::default_provider();
    let principals = registry.len();
    let mut kdc = Kdc::with_replay_capacity(provider, registry, setup.replay_cache);
    eprintln!(
        "cohort kdc: {serving} ({} from {})",
        count(principals),
        setup.database.display()
    );
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut carrier_dropped = 0;
    let mut bad_bundles = 0u64;
    loop {
        tokio::select! {
            arrived = carrier.recv(&mut buf) => match arrived? {
                Arrived::Request { from, len, reply: reply_to } => {
                    let datagram = &buf[..len];
                    if !answer_datagram(&mut kdc, &mut carrier, &metrics, from, datagram, reply_to).await {
                        bad_bundles += 1;
                    }
                }
                Arrived::Event(e) => eprintln!("cohort kdc: broker connection: {e}"),
                Arrived::Nothing => {}
            },
            _ = hangup.recv() => match read_database(&setup.database) {
                Ok(registry) => {
                    eprintln!(
                        "cohort kdc: reloaded {} ({})",
                        setup.database.display(),
                        count(registry.len())
                    );
                    metrics.principals.set(registry.len() as i64);
                    metrics.reloads.get_or_create(&[("result", "ok")]).inc();
                    kdc.replace_registry(registry);
                }
                Err(e) => {
                    metrics.reloads.get_or_create(&[("result", "failed")]).inc();
                    eprintln!("cohort kdc: not reloaded, keeping the old database: {e}");
                }
            },
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
        }
        let dropped = carrier.dropped();
        if dropped > carrier_dropped {
            metrics
                .drops
                .get_or_create(&[("reason", "not_a_request")])
                .inc_by(dropped - carrier_dropped);
            carrier_dropped = dropped;
        }
    }
    let c = kdc.counters();
    eprintln!(
        "cohort kdc: stopping: answered {}, unknown principal {}, unknown requester {}, \
         malformed {}, bad MAC {}, replayed {}, not a request {}",
        c.answered,
        c.unknown_principal,
        c.unknown_requester,
        c.malformed + bad_bundles,
        c.bad_mac,
        c.replayed,
        carrier.dropped()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "nats")]
    #[test]
    fn a_nats_config_parses_and_its_mistakes_name_their_key() {
        let base = Path::new("/etc/cohort");
        let nats = "transport = \"nats\"\nnats = [\"nats://10.0.0.1:4222\"]\n";
        let ok = parse(
            &format!(
                "listen = \"10.0.0.1:7600\"\ndatabase = \"kdc.db\"\n{nats}nats_ca = \"ca.pem\"\n"
            ),
            base,
        )
        .unwrap();
        assert_eq!(
            ok.transport,
            KdcTransport::Nats(cohort::group::NatsSetup {
                urls: vec!["nats://10.0.0.1:4222".into()],
                credentials: None,
                ca: Some(PathBuf::from("/etc/cohort/ca.pem")),
            })
        );
        for (text, key) in [
            (format!("listen = \"127.0.0.1:0\"\ndatabase = \"x\"\n{nats}"), "listen"),
            (
                "listen = \"127.0.0.1:1\"\ndatabase = \"x\"\ntransport = \"nats\"\n".to_string(),
                "nats",
            ),
            (
                "listen = \"127.0.0.1:1\"\ndatabase = \"x\"\ntransport = \"nats\"\nnats = [\"http://10.0.0.1\"]\n"
                    .to_string(),
                "nats[0]",
            ),
        ] {
            let e = parse(&text, base).unwrap_err();
            assert_eq!(e.key, key, "{text:?}: {e}");
        }
    }

    #[test]
    fn configs_parse_and_errors_name_the_key() {
        let base = Path::new("/etc/cohort");
        let ok = parse("listen = \"127.0.0.1:7600\"\ndatabase = \"kdc.db\"\n", base).unwrap();
        assert_eq!(
            ok,
            KdcSetup {
                listen: "127.0.0.1:7600".parse().unwrap(),
                database: PathBuf::from("/etc/cohort/kdc.db"),
                replay_cache: cohort_kdc::DEFAULT_REPLAY_CAPACITY,
                metrics: None,
                transport: KdcTransport::Udp,
            }
        );
        let with_cache = parse(
            "listen = \"[::1]:1\"\ndatabase = \"/var/kdc.db\"\nreplay_cache = 0\n",
            base,
        )
        .unwrap();
        assert_eq!(with_cache.database, PathBuf::from("/var/kdc.db"));
        assert_eq!(with_cache.replay_cache, 0);

        for (text, key) in [
            ("database = \"x\"", "listen"),
            ("listen = \"127.0.0.1:1\"", "database"),
            ("listen = \"nowhere\"\ndatabase = \"x\"", "listen"),
            ("listen = 7600\ndatabase = \"x\"", "listen"),
            ("listen = \"127.0.0.1:1\"\ndatabase = \"\"", "database"),
            (
                "listen = \"127.0.0.1:1\"\ndatabase = \"x\"\nreplay_cache = -1",
                "replay_cache",
            ),
            (
                "listen = \"127.0.0.1:1\"\ndatabase = \"x\"\nreplay_cache = \"big\"",
                "replay_cache",
            ),
            (
                "listen = \"127.0.0.1:1\"\ndatabase = \"x\"\nport = 1",
                "port",
            ),
            (
                "listen = \"127.0.0.1:1\"\ndatabase = \"x\"\nmetrics = \"nowhere\"",
                "metrics",
            ),
            ("listen = ", ""),
            (
                "listen = \"127.0.0.1:1\"\ndatabase = \"x\"\nnats = [\"nats://127.0.0.1:4222\"]",
                "nats",
            ),
            (
                "listen = \"127.0.0.1:1\"\ndatabase = \"x\"\nnats_ca = \"ca.pem\"",
                "nats_ca",
            ),
            (
                "listen = \"127.0.0.1:1\"\ndatabase = \"x\"\ntransport = \"tcp\"",
                "transport",
            ),
        ] {
            let e = parse(text, base).unwrap_err();
            assert_eq!(e.key, key, "{text:?}: {e}");
        }
    }
}
