//! [`GroupConfig`]: a group member's configuration, the one struct its TOML file
//! deserializes into and code builds with [`GroupConfigBuilder`]; and its validation into
//! what `GroupMember::new` takes ([`MemberSetup`]).
//!
//! ```toml
//! identity = "alice.key"            # from `cohort keygen`; relative to this file
//! group = "ops"
//! listen = "127.0.0.1:7001"
//! peers = ["127.0.0.1:7002"]        # contacts; may be empty
//! trust = ["ed25519:<hex>"]         # principals allowed in
//! gear = "aes-128-gcm"              # an AEAD, "none", a MAC gear, or a comma list of MAC gears
//! ```
//!
//! KDC mode (LSGC: symmetric keys only) replaces `identity` with:
//!
//! ```toml
//! auth = "kdc"
//! principal_key = "alice.key"       # from `cohort kdc add-principal`; relative to this file
//! kdc = "10.0.0.1:7600"             # the KDC's address
//! trust = ["kdc:bob"]               # principals allowed in, and/or:
//! trust_any_registered = true       # every principal the KDC knows (LSGC's policy)
//! ```
//!
//! Over a NATS broker instead of UDP (issue 15; the `nats` cargo feature, on by default):
//!
//! ```toml
//! transport = "nats"                # "udp" (the default) or "nats"
//! nats = ["nats://10.0.0.1:4222"]   # the brokers, nearest first; async-nats fails over
//! nats_credentials = "alice.creds"  # optional: a NATS credentials file
//! nats_ca = "ca.pem"                # optional: a CA file (TLS is then required)
//! ```
//!
//! Over NATS `listen` is not bound: it is the member's name in views and on the broker
//! (its port may not be 0), and `peers` are other members' such names. In KDC mode over
//! NATS, `kdc` is the KDC's name on the broker (the `listen` of a `cohort kdc serve` run
//! with `transport = "nats"`): requests go to its subject, answers come back on the
//! member's own.
//!
//! Optional keys: `auth` (`"identity"`, the default, or `"kdc"`), `rekey` (`"one-message"`,
//! `"tree"` or `"lkh"`: a logical key hierarchy, identity or KDC mode), `tree_degree`, `lkh_degree`
//! (2 to 64, default 4),
//! `rekey_on_membership_change`, `rekey_period_secs` (0: never), `heartbeat_ms`,
//! `suspect_ms`, `flush_ms`, `key_grace_ms`, `backlog`, `send_window`, `max_message_len`
//! (the largest datagram payload; reliable messages up to [`MAX_MESSAGE`](super::MAX_MESSAGE)
//! are fragmented to it), `event_queue` (events held for a slow reader before they are
//! lost), `udp_bundle_bytes` (UDP: packets for one member sent together travel as bundles
//! of at most this size, 0 for none; default 1452, which fits a 1500-byte path unfragmented),
//! and for MAC gears `floor_bits` (default: the weakest listed gear's bound) and
//! `dual_tags` (default false). For the `cohort group run` daemon: `ctl` (the control
//! socket's path) and `metrics` (`IP:PORT` of the Prometheus endpoint). Any other key is an
//! error, and every error names its key.
//!
//! Reading is two steps: serde deserializes the text into a [`GroupConfig`] (unknown keys and
//! wrong types are toml's errors, with the key named), then [`GroupConfig::validate`] checks
//! what the values mean and builds the [`MemberSetup`]. [`GroupConfig::load`] and
//! [`GroupConfig::from_toml_str`] run both, so a bad file fails before anything starts.

pub use crate::config_file::ConfigError;
use crate::config_file::{
    err, from_toml, listen_addr, parse_addr, read_config, read_identity, Number, Whole,
};
use cohort_channel::identity::Identity;
use cohort_crypto::CryptoProvider;
use cohort_gears::{GearId, GearKind};
use cohort_group::kdc_pair::KdcCredentials;
pub use cohort_group::Credentials;
use cohort_group::{AuthMode, MemberId, Protection, RekeyMethod};
use cohort_kdc::KeyFile;
use serde::Deserialize;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// `config_file` is shared with the binary's other readers; the library's copy of its error
// is a std error, so that `?` works in applications.
impl std::error::Error for ConfigError {}

/// Everything needed to start one member: a validated [`GroupConfig`].
pub struct MemberSetup {
    /// The member's identity or KDC credentials.
    pub credentials: Credentials,
    /// The group's configuration, already validated.
    pub config: cohort_group::GroupConfig,
    /// The UDP address to bind and to be reached at.
    pub listen: SocketAddr,
    /// Contacts to join through.
    pub peers: Vec<SocketAddr>,
    /// How packets travel.
    pub transport: TransportSetup,
}

/// How a member's packets travel: the config's `transport` and its keys.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransportSetup {
    /// A UDP socket bound to `listen` (the default).
    Udp,
    /// A NATS connection (`transport = "nats"`).
    #[cfg(feature = "nats")]
    Nats(super::NatsSetup),
}

/// The application's state-transfer callback: returns a snapshot of the state that every
/// event [`Events::next`](super::Events::next) returned so far has built, or why it cannot.
pub type SnapshotFn = Arc<dyn Fn() -> Result<Vec<u8>, String> + Send + Sync + 'static>;

/// Default for `event_queue`: events held for a slow reader before they are lost.
pub const DEFAULT_EVENT_QUEUE: usize = 4096;

/// A group member's configuration: every key its TOML file may hold, typed but not yet
/// checked (see [`GroupConfig::validate`]), plus what only code can give (an identity held in
/// memory, the state-transfer callback). Absent keys are `None` (or empty lists); the
/// defaults are applied by validation.
///
/// Read a file with [`GroupConfig::load`], text with [`GroupConfig::from_toml_str`], or
/// build one in code with [`GroupConfig::builder`]. A clone shares credentials given in
/// code: the first member started from either takes them.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupConfig {
    identity: Option<String>,
    auth: Option<String>,
    principal_key: Option<String>,
    kdc: Option<String>,
    trust_any_registered: Option<bool>,
    group: Option<String>,
    listen: Option<String>,
    #[serde(default)]
    peers: Vec<String>,
    #[serde(default)]
    trust: Vec<String>,
    gear: Option<String>,
    rekey: Option<String>,
    tree_degree: Option<Whole>,
    lkh_degree: Option<Whole>,
    rekey_on_membership_change: Option<bool>,
    rekey_period_secs: Option<Number>,
    heartbeat_ms: Option<Whole>,
    suspect_ms: Option<Whole>,
    flush_ms: Option<Whole>,
    key_grace_ms: Option<Whole>,
    backlog: Option<Whole>,
    send_window: Option<Whole>,
    max_message_len: Option<Whole>,
    floor_bits: Option<Number>,
    dual_tags: Option<bool>,
    event_queue: Option<Whole>,
    udp_bundle_bytes: Option<Whole>,
    ctl: Option<String>,
    metrics: Option<String>,
    transport: Option<String>,
    #[serde(default)]
    nats: Vec<String>,
    nats_credentials: Option<String>,
    nats_ca: Option<String>,
    /// Where relative paths start (the file's folder).
    #[serde(skip)]
    base: PathBuf,
    /// The command line's `--listen`, or the builder's address.
    #[serde(skip)]
    listen_override: Option<SocketAddr>,
    /// Credentials given by code (taken once, by the member that starts).
    #[serde(skip)]
    credentials: Option<Arc<Mutex<Option<Credentials>>>>,
    #[serde(skip)]
    snapshot: Option<SnapshotFn>,
}

impl fmt::Debug for GroupConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupConfig")
            .field("group", &self.group)
            .field(
                "listen",
                &self
                    .listen_override
                    .map(|a| a.to_string())
                    .or(self.listen.clone()),
            )
            .field("peers", &self.peers)
            .field("trust", &self.trust)
            .field("gear", &self.gear)
            .field("state_transfer", &self.snapshot.is_some())
            .finish_non_exhaustive()
    }
}

impl GroupConfig {
    /// Reads the file at `path` (relative key-file paths are relative to its folder) and
    /// validates it; every error names its key (or the file).
    pub fn load(path: &Path) -> Result<GroupConfig, ConfigError> {
        read_config(path, GroupConfig::from_toml_str_in)
    }

    /// Parses and validates a configuration's text; relative key-file paths are relative to
    /// the current directory.
    pub fn from_toml_str(text: &str) -> Result<GroupConfig, ConfigError> {
        GroupConfig::from_toml_str_in(text, Path::new("."))
    }

    /// As [`GroupConfig::from_toml_str`], with relative paths relative to `base`.
    pub fn from_toml_str_in(text: &str, base: &Path) -> Result<GroupConfig, ConfigError> {
        let mut config = from_toml::<GroupConfig>(text)?;
        config.base = base.to_path_buf();
        config.validate(&CryptoProvider::default_provider())?;
        Ok(config)
    }

    /// Starts a configuration in code for the group named `group`.
    pub fn builder(group: impl Into<String>) -> GroupConfigBuilder {
        GroupConfigBuilder {
            config: GroupConfig {
                group: Some(group.into()),
                ..GroupConfig::default()
            },
        }
    }

    /// Listens on `addr` instead of the file's `listen` (the command line's `--listen`).
    pub fn set_listen(&mut self, addr: SocketAddr) {
        self.listen_override = Some(addr);
    }

    /// The control socket's path (`ctl`), relative to the file's folder.
    pub fn ctl(&self) -> Option<PathBuf> {
        self.ctl.as_ref().map(|p| self.base.join(p))
    }

    /// Sets (or clears) the control socket's path (the command line's `--ctl`).
    /// A relative path is taken from the working directory (the file's own paths, such as
    /// `identity`, stay relative to the file).
    pub fn set_ctl(&mut self, path: Option<PathBuf>) {
        self.ctl = path.map(|p| {
            let p = if p.is_relative() {
                std::env::current_dir().map(|d| d.join(&p)).unwrap_or(p)
            } else {
                p
            };
            p.to_string_lossy().into_owned()
        });
    }

    /// The Prometheus endpoint's address (`metrics`), as written.
    pub fn metrics(&self) -> Option<&str> {
        self.metrics.as_deref()
    }

    /// The state-transfer callback, if any.
    pub fn snapshot(&self) -> Option<&SnapshotFn> {
        self.snapshot.as_ref()
    }

    /// Events held for a slow reader before they are counted as lost.
    pub fn event_queue(&self) -> usize {
        self.event_queue
            .and_then(|n| usize::try_from(n.0).ok())
            .unwrap_or(DEFAULT_EVENT_QUEUE)
    }

    /// The UDP bundle bound (`udp_bundle_bytes`; `None`: no bundles), see
    /// [`cohort_net::bundle`].
    pub fn udp_bundle_bytes(&self) -> Option<usize> {
        match self.udp_bundle_bytes {
            None => Some(cohort_net::bundle::DEFAULT_BUNDLE_BYTES),
            Some(Whole(0)) => None,
            Some(Whole(n)) => usize::try_from(n).ok(),
        }
    }

    /// Checks what the values mean, applies the defaults and reads the key files (relative
    /// to the file's folder): the check [`GroupConfig::load`] runs, and
    /// [`Group::start`](super::Group::start) again.
    pub fn validate(&self, provider: &CryptoProvider) -> Result<(), ConfigError> {
        self.resolve(provider, false).map(|_| ())
    }

    /// Validates and builds what `GroupMember::new` takes. Credentials given in code are
    /// taken (a configuration with them starts one member).
    pub fn setup(&self, provider: &CryptoProvider) -> Result<MemberSetup, ConfigError> {
        self.resolve(provider, true)?
            .ok_or_else(|| err("identity", "missing"))
    }

    fn resolve(
        &self,
        provider: &CryptoProvider,
        take: bool,
    ) -> Result<Option<MemberSetup>, ConfigError> {
        if let Some(n) = self.event_queue {
            if n.0 == 0 || n.0 > 1 << 24 {
                return Err(err("event_queue", "must be 1 to 16777216"));
            }
        }
        if let Some(Whole(n)) = self.udp_bundle_bytes {
            if n > cohort_net::bundle::MAX_BUNDLE_BYTES as u64 {
                return Err(err("udp_bundle_bytes", "must be 0 to 65507"));
            }
        }
        if let Some(text) = &self.metrics {
            parse_addr("metrics", text)?;
        }
        if let Some(ctl) = &self.ctl {
            if ctl.is_empty() {
                return Err(err("ctl", "empty path"));
            }
        }
        let base = self.base.as_path();
        let listen = self.listen_override;
        let auth = match self.auth.as_deref() {
            None | Some("identity") => AuthMode::IdentityKeys,
            Some("kdc") => AuthMode::Kdc,
            Some(other) => {
                return Err(err(
                    "auth",
                    format!("unknown mode {other:?} (identity or kdc)"),
                ))
            }
        };
        let given = self.credentials.as_ref();
        let credentials = match auth {
            _ if given.is_some() => {
                for (key, present) in [
                    ("identity", self.identity.is_some()),
                    ("principal_key", self.principal_key.is_some()),
                ] {
                    if present {
                        return Err(err(key, "credentials were given in code as well"));
                    }
                }
                None
            }
            AuthMode::IdentityKeys => {
                for (key, present) in [
                    ("principal_key", self.principal_key.is_some()),
                    ("kdc", self.kdc.is_some()),
                    ("trust_any_registered", self.trust_any_registered.is_some()),
                ] {
                    if present {
                        return Err(err(key, "only with auth = \"kdc\""));
                    }
                }
                let identity_path = base.join(required("identity", &self.identity)?);
                Some(Credentials::Identity(read_identity(
                    provider,
                    &identity_path,
                )?))
            }
            AuthMode::Kdc => {
                if self.identity.is_some() {
                    return Err(err(
                        "identity",
                        "not with auth = \"kdc\" (KDC mode uses principal_key)",
                    ));
                }
                let path = base.join(required("principal_key", &self.principal_key)?);
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    err(
                        "principal_key",
                        format!("cannot read {}: {e}", path.display()),
                    )
                })?;
                let file = KeyFile::parse(&text).map_err(|e| {
                    err(
                        "principal_key",
                        format!("{} is not a principal key file: {e}", path.display()),
                    )
                })?;
                let kdc = parse_addr("kdc", required("kdc", &self.kdc)?)?;
                Some(Credentials::Kdc(KdcCredentials {
                    name: file.name,
                    key: file.key,
                    kdc,
                }))
            }
        };
        let group = required("group", &self.group)?;

        let listen = listen_addr(listen, self.listen.as_deref(), "peers", "member")?;
        let transport = self.transport_setup(listen)?;
        let peers = self
            .peers
            .iter()
            .enumerate()
            .map(|(i, text)| parse_addr(&format!("peers[{i}]"), text))
            .collect::<Result<Vec<_>, _>>()?;
        let trust = self
            .trust
            .iter()
            .enumerate()
            .map(|(i, text)| {
                text.parse::<MemberId>().map_err(|e| {
                    err(
                        format!("trust[{i}]"),
                        format!("not a member id (ed25519:<hex> or kdc:<name>): {e}"),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;

        let mut config = cohort_group::GroupConfig::new(group, trust);
        config.auth = auth;
        if let Some(any) = self.trust_any_registered {
            config.trust_any_registered = any;
        }
        let gear = self.gear.as_deref().unwrap_or("aes-128-gcm");
        config.protection = parse_gear(gear).map_err(|e| err("gear", e))?;
        if let Protection::Authenticate {
            floor_bits,
            dual_tags,
            ..
        } = &mut config.protection
        {
            if let Some(bits) = self.floor_bits {
                *floor_bits = bits.non_negative("floor_bits")?;
            }
            if let Some(dual) = self.dual_tags {
                *dual_tags = dual;
            }
        } else {
            for (key, present) in [
                ("floor_bits", self.floor_bits.is_some()),
                ("dual_tags", self.dual_tags.is_some()),
            ] {
                if present {
                    return Err(err(key, "only for MAC gears (gear names MAC gears)"));
                }
            }
        }

        let rekey = self.rekey.as_deref();
        if self.tree_degree.is_some() && rekey != Some("tree") {
            return Err(err("tree_degree", "only with rekey = \"tree\""));
        }
        if self.lkh_degree.is_some() && rekey != Some("lkh") {
            return Err(err("lkh_degree", "only with rekey = \"lkh\""));
        }
        config.rekey_method = match rekey {
            None | Some("one-message") => RekeyMethod::OneMessage,
            Some("tree") => RekeyMethod::Tree {
                degree: usize::try_from(self.tree_degree.map_or(4, |d| d.0))
                    .map_err(|_| err("tree_degree", "too large"))?,
            },
            Some("lkh") => RekeyMethod::Lkh {
                degree: usize::try_from(
                    self.lkh_degree
                        .map_or(RekeyMethod::LKH_DEFAULT_DEGREE as u64, |d| d.0),
                )
                .map_err(|_| err("lkh_degree", "too large"))?,
            },
            Some(other) => {
                return Err(err(
                    "rekey",
                    format!("unknown method {other:?} (one-message, tree or lkh)"),
                ))
            }
        };
        if let Some(on) = self.rekey_on_membership_change {
            config.rekey_policy.on_membership_change = on;
        }
        if let Some(secs) = self.rekey_period_secs {
            let secs = secs.non_negative("rekey_period_secs")?;
            config.rekey_policy.period = if secs == 0.0 {
                None
            } else {
                Some(
                    Duration::try_from_secs_f64(secs)
                        .map_err(|_| err("rekey_period_secs", "not a usable number of seconds"))?,
                )
            };
        }
        for (ms, slot) in [
            (self.heartbeat_ms, &mut config.heartbeat_interval),
            (self.suspect_ms, &mut config.suspect_timeout),
            (self.flush_ms, &mut config.flush_timeout),
            (self.key_grace_ms, &mut config.key_grace),
        ] {
            if let Some(ms) = ms {
                *slot = ms.millis();
            }
        }
        for (key, n, slot) in [
            ("backlog", self.backlog, &mut config.backlog_limit),
            ("send_window", self.send_window, &mut config.send_window),
            (
                "max_message_len",
                self.max_message_len,
                &mut config.max_message_len,
            ),
        ] {
            if let Some(n) = n {
                *slot = usize::try_from(n.0).map_err(|_| err(key, "too large"))?;
            }
        }
        config.validate().map_err(core_error)?;
        if !take {
            return Ok(None);
        }
        let credentials = match (credentials, given) {
            (Some(c), _) => c,
            (None, Some(slot)) => slot
                .lock()
                .map_err(|_| err("identity", "the credentials' lock is poisoned"))?
                .take()
                .ok_or_else(|| {
                    err(
                        "identity",
                        "the credentials given in code were used by a member started before",
                    )
                })?,
            (None, None) => return Err(err("identity", "missing")),
        };
        Ok(Some(MemberSetup {
            credentials,
            config,
            listen,
            peers,
            transport,
        }))
    }

    /// Checks `transport` and the NATS keys.
    fn transport_setup(&self, listen: SocketAddr) -> Result<TransportSetup, ConfigError> {
        let nats_keys = [
            ("nats", !self.nats.is_empty()),
            ("nats_credentials", self.nats_credentials.is_some()),
            ("nats_ca", self.nats_ca.is_some()),
        ];
        match self.transport.as_deref() {
            None | Some("udp") => {
                for (key, present) in nats_keys {
                    if present {
                        return Err(err(key, "only with transport = \"nats\""));
                    }
                }
                Ok(TransportSetup::Udp)
            }
            Some("nats") => self.nats_setup(listen),
            Some(other) => Err(err(
                "transport",
                format!("unknown transport {other:?} (udp or nats)"),
            )),
        }
    }

    #[cfg(not(feature = "nats"))]
    fn nats_setup(&self, _: SocketAddr) -> Result<TransportSetup, ConfigError> {
        Err(err(
            "transport",
            "this build has no NATS transport (cargo feature `nats`)",
        ))
    }

    #[cfg(feature = "nats")]
    fn nats_setup(&self, listen: SocketAddr) -> Result<TransportSetup, ConfigError> {
        if listen.port() == 0 {
            return Err(err(
                "listen",
                "over NATS the address names the member: give it a port other than 0",
            ));
        }
        if self.nats.is_empty() {
            return Err(err("nats", "missing: the broker URLs (nats://host:4222)"));
        }
        for (i, url) in self.nats.iter().enumerate() {
            url.parse::<async_nats::ServerAddr>()
                .map_err(|e| err(format!("nats[{i}]"), format!("not a NATS URL: {e}")))?;
        }
        let path = |p: &Option<String>| p.as_ref().map(|p| self.base.join(p));
        Ok(TransportSetup::Nats(super::NatsSetup {
            urls: self.nats.clone(),
            credentials: path(&self.nats_credentials),
            ca: path(&self.nats_ca),
        }))
    }
}

/// Builds a [`GroupConfig`] in code: the same keys as the file, typed.
///
/// ```
/// use cohort::group::GroupConfig;
/// use std::time::Duration;
/// let config = GroupConfig::builder("ops")
///     .listen("127.0.0.1:0".parse().unwrap())
///     .gear("chacha20-poly1305")
///     .heartbeat(Duration::from_millis(100));
/// // An identity (or KDC credentials) is still needed before `build`.
/// assert!(config.build().is_err());
/// ```
#[must_use]
pub struct GroupConfigBuilder {
    config: GroupConfig,
}

impl GroupConfigBuilder {
    /// The member's Ed25519 identity (identity-key mode).
    pub fn identity(mut self, identity: Identity) -> Self {
        self.config.credentials = Some(Arc::new(Mutex::new(Some(Credentials::Identity(identity)))));
        self.config.auth = None;
        self
    }

    /// The member's principal key and KDC (KDC mode, LSGC).
    pub fn kdc_credentials(mut self, credentials: KdcCredentials) -> Self {
        self.config.kdc = None;
        self.config.credentials = Some(Arc::new(Mutex::new(Some(Credentials::Kdc(credentials)))));
        self.config.auth = Some("kdc".into());
        self
    }

    /// KDC mode: trust every principal the KDC knows.
    pub fn trust_any_registered(mut self, any: bool) -> Self {
        self.config.trust_any_registered = Some(any);
        self
    }

    /// The UDP address to bind and to be reached at (port 0: any free port).
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.config.listen_override = Some(addr);
        self
    }

    /// A contact to join through (may be called again for more).
    pub fn peer(mut self, addr: SocketAddr) -> Self {
        self.config.peers.push(addr.to_string());
        self
    }

    /// Principals allowed in (replaces the list).
    pub fn trust(mut self, trusted: impl IntoIterator<Item = MemberId>) -> Self {
        self.config.trust = trusted.into_iter().map(|m| m.to_string()).collect();
        self
    }

    /// The gear choice, as the file's `gear` key (see [`parse_gear`]).
    pub fn gear(mut self, gear: impl Into<String>) -> Self {
        self.config.gear = Some(gear.into());
        self
    }

    /// Rekey with a key tree of `degree` instead of one message.
    pub fn tree_rekey(mut self, degree: u64) -> Self {
        self.config.rekey = Some("tree".into());
        self.config.tree_degree = Some(Whole(degree));
        self
    }

    /// Rekey with a logical key hierarchy of `degree` (LKH) instead of one message.
    pub fn lkh_rekey(mut self, degree: u64) -> Self {
        self.config.rekey = Some("lkh".into());
        self.config.lkh_degree = Some(Whole(degree));
        self
    }

    /// Rekey when the membership changes (default true).
    pub fn rekey_on_membership_change(mut self, on: bool) -> Self {
        self.config.rekey_on_membership_change = Some(on);
        self
    }

    /// Rekey every `period` (`None`: never).
    pub fn rekey_period(mut self, period: Option<Duration>) -> Self {
        self.config.rekey_period_secs = Some(Number(period.map_or(0.0, |p| p.as_secs_f64())));
        self
    }

    /// Heartbeat interval.
    pub fn heartbeat(mut self, interval: Duration) -> Self {
        self.config.heartbeat_ms = Some(Whole(millis(interval)));
        self
    }

    /// Silence after which a member is suspected.
    pub fn suspect_timeout(mut self, timeout: Duration) -> Self {
        self.config.suspect_ms = Some(Whole(millis(timeout)));
        self
    }

    /// How long a flush may take.
    pub fn flush_timeout(mut self, timeout: Duration) -> Self {
        self.config.flush_ms = Some(Whole(millis(timeout)));
        self
    }

    /// Reliable send window (messages in flight).
    pub fn send_window(mut self, window: u64) -> Self {
        self.config.send_window = Some(Whole(window));
        self
    }

    /// Most messages held back for members that lag.
    pub fn backlog(mut self, messages: u64) -> Self {
        self.config.backlog = Some(Whole(messages));
        self
    }

    /// The largest datagram payload (the protocol's `max_message_len`, at most 16 KiB);
    /// reliable messages above it are fragmented.
    pub fn max_datagram_payload(mut self, bytes: u64) -> Self {
        self.config.max_message_len = Some(Whole(bytes));
        self
    }

    /// Carries the member's packets over the NATS servers at `urls` (`transport = "nats"`).
    /// The member's `listen` address is then its name, not bound.
    pub fn nats(mut self, urls: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.config.transport = Some("nats".into());
        self.config.nats = urls.into_iter().map(Into::into).collect();
        self
    }

    /// A NATS credentials file (`nats_credentials`).
    pub fn nats_credentials(mut self, path: impl Into<String>) -> Self {
        self.config.nats_credentials = Some(path.into());
        self
    }

    /// A CA file for TLS to the NATS servers (`nats_ca`).
    pub fn nats_ca(mut self, path: impl Into<String>) -> Self {
        self.config.nats_ca = Some(path.into());
        self
    }

    /// Events held for a slow reader before they are counted as lost.
    pub fn event_queue(mut self, events: u64) -> Self {
        self.config.event_queue = Some(Whole(events));
        self
    }

    /// UDP bundle bound in bytes (`udp_bundle_bytes`; 0: no bundles).
    pub fn udp_bundle_bytes(mut self, bytes: u64) -> Self {
        self.config.udp_bundle_bytes = Some(Whole(bytes));
        self
    }

    /// State transfer: `snapshot` returns the application's state at a view boundary, for
    /// a member that joins (see the module guide).
    pub fn snapshot(
        mut self,
        snapshot: impl Fn() -> Result<Vec<u8>, String> + Send + Sync + 'static,
    ) -> Self {
        self.config.snapshot = Some(Arc::new(snapshot));
        self
    }

    /// Validates and returns the configuration.
    pub fn build(self) -> Result<GroupConfig, ConfigError> {
        self.config.validate(&CryptoProvider::default_provider())?;
        Ok(self.config)
    }
}

impl GroupConfig {
    /// Sets the state-transfer callback on a configuration read from a file.
    pub fn set_snapshot(
        &mut self,
        snapshot: impl Fn() -> Result<Vec<u8>, String> + Send + Sync + 'static,
    ) {
        self.snapshot = Some(Arc::new(snapshot));
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A key the file must hold.
fn required<'a>(key: &str, value: &'a Option<String>) -> Result<&'a str, ConfigError> {
    value.as_deref().ok_or_else(|| err(key, "missing"))
}

/// Parses a gear choice: an AEAD gear name (encrypt), `none` (no protection at all), a MAC
/// gear name, or a comma-separated list of MAC gears, strongest first (authenticate only,
/// adaptive with two or more). The floor is the weakest listed gear's bound.
pub fn parse_gear(text: &str) -> Result<Protection, String> {
    let text = text.trim();
    if text == "none" {
        return Ok(Protection::DangerNoneForTesting);
    }
    let mut gears = Vec::new();
    for name in text.split(',').map(str::trim) {
        let gear = GearId::from_name(name)
            .ok_or_else(|| format!("unknown gear {name:?} (see `cohort gears list`)"))?;
        if gears.contains(&gear) {
            return Err(format!("{name} is listed twice"));
        }
        gears.push(gear);
    }
    match gears.as_slice() {
        [one] if one.info().kind == GearKind::Aead => Ok(Protection::Encrypt(*one)),
        [one] if one.info().kind == GearKind::Null => Err(format!(
            "{} is not a group gear; use \"none\" for an unprotected test group",
            one.name()
        )),
        _ => {
            if let Some(g) = gears.iter().find(|g| g.info().kind != GearKind::Mac) {
                return Err(format!(
                    "{} is not a MAC gear (a list may hold MAC gears only)",
                    g.name()
                ));
            }
            let floor_bits = gears
                .iter()
                .map(|g| g.info().forgery_bits)
                .fold(f64::INFINITY, f64::min);
            Ok(Protection::Authenticate {
                gears,
                floor_bits,
                dual_tags: false,
            })
        }
    }
}

/// `GroupConfig::validate` names struct fields; the user wrote config keys.
pub(super) fn core_error(e: cohort_group::ConfigError) -> ConfigError {
    use cohort_group::ConfigField as F;
    let key = match e.field {
        F::HeartbeatInterval => "heartbeat_ms",
        F::SuspectTimeout => "suspect_ms",
        F::BacklogLimit => "backlog",
        F::RekeyMethod => "rekey",
        F::TreeDegree => "tree_degree",
        F::LkhDegree => "lkh_degree",
        F::Protection => "gear",
        other => other.name(),
    };
    err(key, e.problem)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // reason: test code; a panic is the failure report
mod tests {
    use super::*;
    use crate::config_file::test_support::Dir;

    /// A temporary directory holding `alice.key`; returns it and alice's public key.
    fn dir_with_key(name: &str) -> (Dir, String) {
        crate::config_file::test_support::dir_with_key(&format!("gcfg-{name}"), "alice.key")
    }

    fn parse(
        provider: &CryptoProvider,
        text: &str,
        base: &Path,
        listen: Option<SocketAddr>,
    ) -> Result<MemberSetup, ConfigError> {
        let mut config = from_toml::<GroupConfig>(text)?;
        config.base = base.to_path_buf();
        if let Some(addr) = listen {
            config.set_listen(addr);
        }
        config.setup(provider)
    }

    fn parse_in(dir: &Dir, text: &str) -> Result<MemberSetup, ConfigError> {
        parse(&CryptoProvider::default_provider(), text, &dir.0, None)
    }

    const BASE: &str = "identity = \"alice.key\"\ngroup = \"ops\"\nlisten = \"127.0.0.1:7001\"\n";

    #[test]
    fn a_kdc_mode_config_parses_and_its_mistakes_name_their_key() {
        let (dir, _) = dir_with_key("kdc");
        let file = cohort_kdc::KeyFile {
            name: cohort_kdc::PrincipalName::new("alice").unwrap(),
            key: cohort_kdc::PrincipalKey::from_bytes([7; 32]),
        };
        std::fs::write(dir.0.join("alice.pk"), file.to_text().as_bytes()).unwrap();
        let kdc = "auth = \"kdc\"\nprincipal_key = \"alice.pk\"\nkdc = \"127.0.0.1:7600\"\n\
                   group = \"ops\"\nlisten = \"127.0.0.1:7001\"\n";
        let setup = parse_in(&dir, &format!("{kdc}trust = [\"kdc:bob\"]\n")).unwrap();
        let Credentials::Kdc(c) = &setup.credentials else {
            panic!("KDC mode expected")
        };
        assert_eq!(c.name.as_str(), "alice");
        assert_eq!(c.kdc, "127.0.0.1:7600".parse().unwrap());
        assert_eq!(setup.config.auth, AuthMode::Kdc);
        assert_eq!(setup.config.trust[0].to_string(), "kdc:bob");
        let lkh = parse_in(&dir, &format!("{kdc}rekey = \"lkh\"\nlkh_degree = 8\n")).unwrap();
        assert_eq!(lkh.config.rekey_method, RekeyMethod::Lkh { degree: 8 });
        let cases = [
            (format!("{kdc}identity = \"alice.key\"\n"), "identity"),
            (format!("{kdc}trust = [\"kdc:b b\"]\n"), "trust[0]"),
            (format!("{kdc}rekey = \"tree\"\n"), "rekey"),
            (kdc.replace("kdc = \"127.0.0.1:7600\"\n", ""), "kdc"),
            (kdc.replace("alice.pk", "alice.key"), "principal_key"),
            (format!("{BASE}kdc = \"127.0.0.1:1\"\n"), "kdc"),
            (format!("{BASE}auth = \"pgp\"\n"), "auth"),
        ];
        for (text, key) in cases {
            let e = parse_in(&dir, &text).err().expect("an error");
            assert!(
                e.key.contains(key) || e.problem.contains(key),
                "{text:?}: {e:?} does not name {key}"
            );
        }
    }

    #[test]
    fn rekey_lkh_parses_with_its_default_degree() {
        let (dir, _) = dir_with_key("lkh");
        let setup = parse_in(&dir, &format!("{BASE}rekey = \"lkh\"\n")).unwrap();
        assert_eq!(setup.config.rekey_method, RekeyMethod::lkh());
        let setup = parse_in(&dir, &format!("{BASE}rekey = \"lkh\"\nlkh_degree = 16\n")).unwrap();
        assert_eq!(setup.config.rekey_method, RekeyMethod::Lkh { degree: 16 });
    }

    #[test]
    fn a_full_config_parses() {
        let (dir, public) = dir_with_key("full");
        let text = format!(
            "{BASE}peers = [\"127.0.0.1:7002\", \"[::1]:7003\"]\ntrust = [\"{public}\"]\n\
             gear = \"umac-64, umac-32\"\nrekey = \"tree\"\ntree_degree = 3\n\
             rekey_on_membership_change = false\nrekey_period_secs = 2.5\nheartbeat_ms = 50\n\
             suspect_ms = 500\nflush_ms = 300\nbacklog = 100\nsend_window = 8\n\
             max_message_len = 1000\ndual_tags = true\n"
        );
        let setup = parse_in(&dir, &text).unwrap();
        let Credentials::Identity(identity) = &setup.credentials else {
            panic!("identity mode expected")
        };
        assert_eq!(identity.public().to_string(), public);
        assert_eq!(setup.peers.len(), 2);
        assert_eq!(setup.config.trust.len(), 1);
        assert_eq!(setup.config.rekey_method, RekeyMethod::Tree { degree: 3 });
        assert!(!setup.config.rekey_policy.on_membership_change);
        assert_eq!(
            setup.config.rekey_policy.period,
            Some(Duration::from_millis(2500))
        );
        assert_eq!(setup.config.heartbeat_interval, Duration::from_millis(50));
        assert_eq!(setup.config.send_window, 8);
        match &setup.config.protection {
            Protection::Authenticate {
                gears,
                floor_bits,
                dual_tags,
            } => {
                assert_eq!(gears, &[GearId::Umac64, GearId::Umac32]);
                assert_eq!(*floor_bits, GearId::Umac32.info().forgery_bits);
                assert!(dual_tags);
            }
            other => panic!("{other:?}"),
        }
        let minimal = parse_in(&dir, BASE).unwrap();
        assert_eq!(minimal.config.protection, Protection::default());
        assert!(minimal.peers.is_empty());
    }

    #[test]
    fn every_error_names_its_key() {
        let (dir, public) = dir_with_key("errors");
        let cases: &[(&str, &str)] = &[
            ("trust = [\"ed25519:00\"]", "trust[0]"),
            ("trust = [\"PUBLIC\", \"nope\"]", "trust[1]"),
            ("trust = \"PUBLIC\"", "trust"),
            ("peers = [\"localhost\"]", "peers[0]"),
            ("peers = [7]", "peers[0]"),
            ("gear = \"rot13\"", "gear"),
            ("gear = \"umac-64,aes-128-gcm\"", "gear"),
            ("gear = \"danger-null-for-testing\"", "gear"),
            ("colour = \"blue\"", "colour"),
            ("heartbeat_ms = -5", "heartbeat_ms"),
            ("heartbeat_ms = 0", "heartbeat_ms"),
            ("suspect_ms = 10", "suspect_ms"),
            ("send_window = 0", "send_window"),
            ("backlog = 1", "backlog"),
            ("rekey = \"carrier-pigeon\"", "rekey"),
            ("tree_degree = 2", "tree_degree"),
            ("rekey = \"tree\"\ntree_degree = 0", "tree_degree"),
            ("lkh_degree = 4", "lkh_degree"),
            ("rekey = \"tree\"\nlkh_degree = 4", "lkh_degree"),
            ("rekey = \"lkh\"\nlkh_degree = 1", "lkh_degree"),
            ("rekey = \"lkh\"\nlkh_degree = 65", "lkh_degree"),
            ("rekey = \"lkh\"\ntree_degree = 4", "tree_degree"),
            ("rekey_period_secs = -1.0", "rekey_period_secs"),
            ("dual_tags = true", "dual_tags"),
            ("max_message_len = 100000", "max_message_len"),
        ];
        for (line, key) in cases {
            let text = format!("{BASE}{}\n", line.replace("PUBLIC", &public));
            let e = parse_in(&dir, &text)
                .err()
                .unwrap_or_else(|| panic!("{line} parsed"));
            assert_eq!(&e.key, key, "{line}: {e}");
        }
        let e = parse_in(&dir, "group = \"ops\"\nlisten = \"127.0.0.1:1\"")
            .err()
            .unwrap();
        assert_eq!(e.key, "identity");
        let e = parse_in(&dir, "identity = \"missing.key\"\ngroup = \"x\"")
            .err()
            .unwrap();
        assert_eq!(e.key, "identity");
        std::fs::write(dir.0.join("bad.key"), "hello\n").unwrap();
        let e = parse_in(&dir, "identity = \"bad.key\"\ngroup = \"x\"")
            .err()
            .unwrap();
        assert_eq!(e.key, "identity");
        let e = parse_in(&dir, "identity = \"alice.key\"\ngroup = \"x\"")
            .err()
            .unwrap();
        assert_eq!(e.key, "listen");
        let text = BASE.replace("127.0.0.1:7001", "0.0.0.0:7001");
        assert_eq!(parse_in(&dir, &text).err().unwrap().key, "listen");
        let e = parse_in(&dir, "identity = [").err().unwrap();
        assert_eq!(e.key, "");
        let e = parse_in(&dir, &BASE.replace("\"ops\"", "\"\""))
            .err()
            .unwrap();
        assert_eq!(e.key, "group");
    }

    #[test]
    fn the_command_line_overrides_listen() {
        let (dir, _) = dir_with_key("listen");
        let addr: SocketAddr = "127.0.0.1:9999".parse().unwrap();
        let provider = CryptoProvider::default_provider();
        let setup = parse(&provider, BASE, &dir.0, Some(addr)).unwrap();
        assert_eq!(setup.listen, addr);
        let text = "identity = \"alice.key\"\ngroup = \"ops\"\n";
        assert_eq!(
            parse(&provider, text, &dir.0, Some(addr)).unwrap().listen,
            addr
        );
    }

    #[test]
    fn gears_parse_to_protections() {
        assert_eq!(
            parse_gear("none").unwrap(),
            Protection::DangerNoneForTesting
        );
        assert_eq!(
            parse_gear("chacha20-poly1305").unwrap(),
            Protection::Encrypt(GearId::ChaCha20Poly1305)
        );
        assert!(matches!(
            parse_gear("hmac-sha256").unwrap(),
            Protection::Authenticate { ref gears, .. } if gears == &[GearId::HmacSha256]
        ));
        assert!(parse_gear("aes-128-gcm,aes-256-gcm").is_err());
        assert!(parse_gear("umac-64,umac-64").is_err());
        assert!(parse_gear("").is_err());
    }
}
