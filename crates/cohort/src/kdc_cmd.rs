//! `cohort kdc serve|add-principal`: LSGC's key distribution center over UDP, and the way
//! principals get registered with it.
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
//! Any other key is an error, and every error names its key.

use crate::config_file::{err, from_toml, parse_addr, read_config, ConfigError, Whole};
use crate::keygen_cmd::{create_new, replace};
use crate::UsageError;
use clap::{Args, Subcommand};
use cohort_crypto::CryptoProvider;
use cohort_kdc::{Kdc, KeyFile, Outcome, PrincipalKey, PrincipalName, Registry, RegistryError};
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
    /// Run the key distribution center over UDP: answer pair-key requests from registered
    /// principals (one stderr line per request).
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
        let listen = self.listen.ok_or_else(|| err("listen", "missing"))?;
        let listen = parse_addr("listen", &listen)?;
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
        Ok(KdcSetup {
            listen,
            database,
            replay_cache,
            metrics,
        })
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

/// Largest datagram read (requests are at most 114 bytes; anything longer is malformed).
const MAX_DATAGRAM: usize = 2048;

/// Labels with one pair (`outcome`, `reason`, `direction`).
type Label = [(&'static str, &'static str); 1];

/// What `kdc serve --metrics` exports (names carry the `cohort_kdc_` prefix).
#[derive(Default)]
struct KdcMetrics {
    /// Requests answered, by outcome (answered, unknown_principal, unknown_requester).
    requests: Family<Label, Counter>,
    /// Requests dropped without an answer, by reason (malformed, bad_mac, replayed).
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

async fn serve_loop(setup: KdcSetup, registry: Registry) -> Result<(), UsageError> {
    use tokio::signal::unix::{signal, SignalKind};
    // Bound before anything else starts, so an address in use stops us cleanly.
    let metrics = match setup.metrics {
        Some(addr) => KdcMetrics::serve(addr).await?,
        None => KdcMetrics::default(),
    };
    metrics.principals.set(registry.len() as i64);
    let listen = setup.listen;
    let socket = cohort_net::bind_udp(listen)
        .map_err(|e| UsageError(format!("cannot listen on {listen}: {e}")))?;
    let local = socket
        .local_addr()
        .map_err(|e| UsageError(format!("cannot read the socket's address: {e}")))?;
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
        "cohort kdc: listening on {local} ({} from {})",
        count(principals),
        setup.database.display()
    );
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        tokio::select! {
            received = socket.recv_from(&mut buf) => match received {
                Ok((len, from)) => {
                    #[allow(clippy::disallowed_methods)] // reason: the binary is the I/O shell and owns the clock
                    let started = std::time::Instant::now();
                    let handled = kdc.handle(from, &buf[..len]);
                    metrics.count(&handled.outcome, len, started.elapsed());
                    eprintln!("cohort kdc: {from}: {}", handled.outcome);
                    if let Some(reply) = handled.reply {
                        match socket.send_to(&reply, from).await {
                            Ok(n) => {
                                metrics.bytes.get_or_create(&[("direction", "sent")]).inc_by(n as u64);
                            }
                            Err(e) => {
                                eprintln!("cohort kdc: {from}: cannot send the response: {e}");
                            }
                        }
                    }
                }
                // ICMP errors (port unreachable) surface here; they are not fatal.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
                Err(e) => return Err(UsageError(format!("the UDP socket failed: {e}"))),
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
    }
    let c = kdc.counters();
    eprintln!(
        "cohort kdc: stopping: answered {}, unknown principal {}, unknown requester {}, \
         malformed {}, bad MAC {}, replayed {}",
        c.answered, c.unknown_principal, c.unknown_requester, c.malformed, c.bad_mac, c.replayed
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        ] {
            let e = parse(text, base).unwrap_err();
            assert_eq!(e.key, key, "{text:?}: {e}");
        }
    }
}
