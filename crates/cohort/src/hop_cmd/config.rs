//! The TOML configuration of `cohort hop run`, with command-line overrides, parsed into
//! plain data ([`HopSetup`]); [`mod@super::run`] turns it into the core's configuration.
//!
//! System-wide settings sit at the top; each peer known in advance has a `[[peer]]` table
//! (as the ALPHA daemon's configuration file: system-wide parameters plus per-peer settings,
//! with command-line switches overriding the file).
//!
//! An endpoint:
//! ```toml
//! role = "endpoint"
//! identity = "a.key"                 # from `cohort keygen`; relative to this file
//! listen = "10.77.1.1:7500"          # the overlay: UDP on the real interface
//! trust = ["ed25519:<hex>"]          # peers allowed in; empty or absent: any signed peer
//! app = "stdio"                      # or "tun" (Linux, root)
//! mode = "m:32"                      # default for peers: "none", "n", "c:K", "m:K"
//! associations = 1                   # outgoing associations opened per peer
//! # optional: ctl, delay_ms, metrics ("IP:PORT": Prometheus over HTTP), chain_rounds,
//! #           storage, delivery_reports, window (rounds in flight, 1..=8, default 8),
//! #           max_queue, retransmit_ms, max_retries
//!
//! [tun]                              # only with app = "tun"
//! name = "cohort0"
//! address = "10.200.0.1/24"          # the tunnel subnet: NOT the overlay's subnet
//! mtu = 1300
//! # fwmark = 1                     # mark cohort's own UDP packets, for policy routing
//! # offload = false                # no TSO reads / coalesced writes (default true)
//!
//! [[peer]]
//! address = "10.77.2.2:7500"         # the other endpoint's overlay address
//! via = "10.77.1.2:7500"             # first relay (absent: direct)
//! mode = "c:16"                      # overrides the top-level mode
//! associations = 2
//! trust = "ed25519:<hex>"            # added to the trust list
//! connect = true                     # start the handshake (false: wait for the peer)
//! ```
//!
//! A relay has `role = "relay"`, `listen`, optional `identity`, `trust`, `ctl`, `delay_ms`,
//! `metrics`,
//! and `[[peer]]` tables that are routes: packets for the endpoint `address` go to the next
//! hop `via` (endpoints without a route are sent to directly).
//!
//! Any other key is an error, and every error names its key (`peer[1].via`).
//!
//! Reading is two steps: serde deserializes the text into a [`HopFile`] (unknown keys and
//! wrong types are toml's errors, with the key named), then [`HopFile::validate`] checks
//! what the values mean for the role and builds the [`HopSetup`].

pub use crate::config_file::ConfigError;
use crate::config_file::{
    err, from_toml, listen_addr, parse_addr, read_config, read_identity, Whole,
};
use cohort_channel::identity::{Identity, PublicKey};
use cohort_crypto::CryptoProvider;
use serde::Deserialize;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use cohort_hop::{ChainStorage, Mode};

/// Everything `cohort hop run` needs, validated.
pub struct HopSetup {
    /// Endpoint or relay, with the settings only that role has.
    pub role: Role,
    /// The node's identity (required for endpoints, optional for relays).
    pub identity: Option<Identity>,
    /// The UDP address to bind and to be reached at.
    pub listen: SocketAddr,
    /// Where the control socket listens.
    pub ctl: PathBuf,
    /// Principals allowed in (top-level `trust` plus every peer's `trust`).
    pub trust: Vec<PublicKey>,
    /// How long every outgoing datagram is held before it is sent (user-space delay).
    pub delay: Duration,
    /// Where to serve Prometheus metrics (TCP), if anywhere.
    pub metrics: Option<SocketAddr>,
    /// The peers (endpoint) or routes (relay).
    pub peers: Vec<PeerSetup>,
}

/// What the node is.
pub enum Role {
    /// An ALPHA end host.
    Endpoint(EndpointSetup),
    /// An ALPHA relay (the "ALPHA filter").
    Relay,
}

/// Settings only an endpoint has.
pub struct EndpointSetup {
    /// Where application data comes from and goes to.
    pub app: App,
    /// Signature rounds per chain (`chain_rounds`).
    pub chain_rounds: Option<u32>,
    /// How chains are stored (`storage`).
    pub storage: Option<ChainStorage>,
    /// Ask for authenticated delivery reports (`delivery_reports`).
    pub delivery_reports: Option<bool>,
    /// Rounds an association may have in flight (`window`).
    pub window: Option<u8>,
    /// Most messages queued per association (`max_queue`).
    pub max_queue: Option<usize>,
    /// Retransmission interval for S1 / signalling (`retransmit_ms`).
    pub retransmit: Option<Duration>,
    /// Retransmissions before giving up (`max_retries`).
    pub max_retries: Option<u32>,
}

/// How an endpoint's application talks to it.
#[derive(Debug, PartialEq, Eq)]
pub enum App {
    /// JSON lines: events on standard output, commands on standard input.
    Stdio,
    /// IP packets through a TUN device (Linux, root).
    Tun(TunSetup),
}

/// The TUN device (`[tun]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TunSetup {
    /// Interface name (`name`, default `cohort0`).
    pub name: String,
    /// The tunnel address of this end.
    pub address: Ipv4Addr,
    /// The tunnel subnet's prefix length.
    pub prefix: u8,
    /// The device MTU (`mtu`, default [`DEFAULT_TUN_MTU`]).
    pub mtu: u16,
    /// A firewall mark for cohort's own UDP socket (`fwmark`): with it, policy routing can
    /// send everything *unmarked* for the peer's real address into the tunnel while
    /// cohort's own (marked) packets take the normal route, as the ALPHA implementation
    /// report does (its Figure 3).
    pub fwmark: Option<u32>,
    /// The kernel's TUN offloads (`offload`, default on): TSO super-packets read and split,
    /// packets coalesced before they are written (see `hop_cmd::tun::TunDevice`).
    pub offload: bool,
}

/// One `[[peer]]` table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerSetup {
    /// The peer endpoint's overlay address.
    pub address: SocketAddr,
    /// Endpoint: the first relay; relay: the next hop towards `address`.
    pub via: Option<SocketAddr>,
    /// The mode of the outgoing associations opened to this peer.
    pub mode: Mode,
    /// How many outgoing associations to open.
    pub associations: u16,
    /// Whether this end starts the handshake.
    pub connect: bool,
}

/// Command-line flags that override the file.
#[derive(Default)]
pub struct Overrides {
    /// `--listen`.
    pub listen: Option<SocketAddr>,
    /// `--mode`: every peer's mode.
    pub mode: Option<String>,
    /// `--associations`: every peer's count.
    pub associations: Option<u16>,
    /// `--ctl`.
    pub ctl: Option<PathBuf>,
    /// `--delay-ms`.
    pub delay_ms: Option<u64>,
    /// `--metrics`.
    pub metrics: Option<SocketAddr>,
}

/// The TUN MTU unless configured: an IP packet of this size plus the largest ALPHA header
/// (ALPHA-M's S2 at batch 64: about 40 + 16 x 6 bytes) plus UDP/IPv4 (28 bytes) still fits a
/// 1500-byte Ethernet frame.
pub const DEFAULT_TUN_MTU: u16 = 1300;
/// Smallest TUN MTU (IPv4's minimum datagram size).
pub const MIN_TUN_MTU: u16 = 576;
/// Largest accepted per-peer association count.
pub const MAX_ASSOCIATIONS: u16 = 64;

/// A node's config file as written: every key either role may hold, typed but not yet
/// checked (see [`HopFile::validate`], which also refuses endpoint keys in a relay's file).
/// Absent keys are `None` (or empty lists); validation applies the defaults, so a library
/// API can take this struct as it is.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HopFile {
    /// `"endpoint"` or `"relay"`.
    pub role: Option<String>,
    /// The identity file (required for endpoints), relative to the config file.
    pub identity: Option<String>,
    /// The node's overlay `IP:PORT` (`--listen` overrides it).
    pub listen: Option<String>,
    /// The control socket's path (default: the config file's path with `.sock`).
    pub ctl: Option<String>,
    /// Public keys allowed in (each peer's `trust` is added).
    #[serde(default)]
    pub trust: Vec<String>,
    /// User-space delay on everything sent (`--delay-ms` overrides it).
    pub delay_ms: Option<Whole>,
    /// Serve Prometheus metrics on this TCP `IP:PORT` (`--metrics` overrides it).
    pub metrics: Option<String>,
    /// The `[[peer]]` tables: peers (endpoint) or routes (relay).
    #[serde(default)]
    pub peer: Vec<PeerFile>,
    /// Endpoint: `"stdio"` (the default) or `"tun"`.
    pub app: Option<String>,
    /// Endpoint: the peers' default mode (`--mode` overrides it).
    pub mode: Option<String>,
    /// Endpoint: the peers' default association count (`--associations` overrides it).
    pub associations: Option<Whole>,
    /// Endpoint: signature rounds per chain.
    pub chain_rounds: Option<Whole>,
    /// Endpoint: how chains are stored (see [`parse_storage`]).
    pub storage: Option<String>,
    /// Endpoint: ask for authenticated delivery reports.
    pub delivery_reports: Option<bool>,
    /// Endpoint: rounds an association may have between S1 and S2 at once.
    pub window: Option<Whole>,
    /// Endpoint: most messages queued per association.
    pub max_queue: Option<Whole>,
    /// Endpoint: retransmission interval.
    pub retransmit_ms: Option<Whole>,
    /// Endpoint: retransmissions before giving up.
    pub max_retries: Option<Whole>,
    /// Endpoint with `app = "tun"`: the TUN device.
    pub tun: Option<TunFile>,
}

/// One `[[peer]]` table as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerFile {
    /// The peer endpoint's overlay `IP:PORT` (required).
    pub address: Option<String>,
    /// Endpoint: the first relay; relay: the next hop (required for a relay).
    pub via: Option<String>,
    /// Endpoint: this peer's mode.
    pub mode: Option<String>,
    /// Endpoint: this peer's association count.
    pub associations: Option<Whole>,
    /// A public key added to the trust list.
    pub trust: Option<String>,
    /// Endpoint: start the handshake (default true).
    pub connect: Option<bool>,
}

/// The `[tun]` table as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TunFile {
    /// Interface name (default `cohort0`).
    pub name: Option<String>,
    /// `ADDRESS/PREFIX` of this end of the tunnel (required).
    pub address: Option<String>,
    /// Device MTU (default [`DEFAULT_TUN_MTU`]).
    pub mtu: Option<Whole>,
    /// Firewall mark for cohort's own UDP socket.
    pub fwmark: Option<Whole>,
    /// The kernel's TUN offloads (default true).
    pub offload: Option<bool>,
}

/// The keys a relay's file may hold.
const RELAY_KEYS: &[&str] = &[
    "role", "identity", "listen", "ctl", "trust", "delay_ms", "peer",
];
/// The keys a relay's route may hold.
const RELAY_PEER_KEYS: &[&str] = &["address", "via", "trust"];

/// Reads and parses the file at `path`; `ctl` defaults to the file's path with `.sock`.
pub fn load(
    provider: &CryptoProvider,
    path: &Path,
    overrides: &Overrides,
) -> Result<HopSetup, ConfigError> {
    let default_ctl = path.with_extension("sock");
    read_config(path, |text, base| {
        parse(provider, text, base, &default_ctl, overrides)
    })
}

/// Parses a configuration's text; relative paths are relative to `base`. A file-level
/// problem (bad TOML) comes back with an empty key.
pub fn parse(
    provider: &CryptoProvider,
    text: &str,
    base: &Path,
    default_ctl: &Path,
    overrides: &Overrides,
) -> Result<HopSetup, ConfigError> {
    from_toml::<HopFile>(text)?.validate(provider, base, default_ctl, overrides)
}

/// The first of `present` (key, is it there) that is there, as an unknown key of a relay.
fn relay_refuses(present: &[(&str, bool)], what: &str, known: &[&str]) -> Result<(), ConfigError> {
    let mut there: Vec<&str> = present
        .iter()
        .filter(|(_, p)| *p)
        .map(|(k, _)| *k)
        .collect();
    there.sort_unstable();
    match there.first() {
        Some(key) => Err(err(
            *key,
            format!("unknown key for {what} (known keys: {})", known.join(", ")),
        )),
        None => Ok(()),
    }
}

impl HopFile {
    /// Checks what the values mean for the role, applies the defaults and the command
    /// line's `overrides`, reads the identity file (relative to `base`) and builds the
    /// setup; the control socket is `default_ctl` unless the file or a flag says otherwise.
    pub fn validate(
        self,
        provider: &CryptoProvider,
        base: &Path,
        default_ctl: &Path,
        overrides: &Overrides,
    ) -> Result<HopSetup, ConfigError> {
        let endpoint = match self.role.as_deref() {
            Some("endpoint") => true,
            Some("relay") => false,
            Some(other) => {
                return Err(err(
                    "role",
                    format!("unknown role {other:?} (endpoint or relay)"),
                ))
            }
            None => return Err(err("role", "missing (endpoint or relay)")),
        };
        if !endpoint {
            relay_refuses(
                &[
                    ("app", self.app.is_some()),
                    ("mode", self.mode.is_some()),
                    ("associations", self.associations.is_some()),
                    ("chain_rounds", self.chain_rounds.is_some()),
                    ("storage", self.storage.is_some()),
                    ("delivery_reports", self.delivery_reports.is_some()),
                    ("window", self.window.is_some()),
                    ("max_queue", self.max_queue.is_some()),
                    ("retransmit_ms", self.retransmit_ms.is_some()),
                    ("max_retries", self.max_retries.is_some()),
                    ("tun", self.tun.is_some()),
                ],
                "a relay",
                RELAY_KEYS,
            )?;
        }

        let identity = match &self.identity {
            Some(file) => Some(read_identity(provider, &base.join(file))?),
            None if endpoint => {
                return Err(err("identity", "missing (an endpoint signs its anchors)"))
            }
            None => None,
        };
        let listen = listen_addr(overrides.listen, self.listen.as_deref(), "others", "node")?;
        let ctl = match (&overrides.ctl, self.ctl.as_deref()) {
            (Some(path), _) => path.clone(),
            (None, Some("")) => return Err(err("ctl", "must not be empty")),
            (None, Some(path)) => base.join(path),
            (None, None) => default_ctl.to_path_buf(),
        };
        let mut trust = self
            .trust
            .iter()
            .enumerate()
            .map(|(i, text)| parse_key(&format!("trust[{i}]"), text))
            .collect::<Result<Vec<_>, _>>()?;
        let delay_ms = match overrides.delay_ms {
            Some(ms) => ms,
            None => self.delay_ms.map_or(0, |ms| ms.0),
        };
        if delay_ms > 10_000 {
            return Err(err("delay_ms", format!("at most 10000 ms ({delay_ms})")));
        }

        let default_mode = match &overrides.mode {
            Some(text) => parse_mode(text).map_err(|e| err("--mode", e))?,
            None if endpoint => match &self.mode {
                Some(text) => parse_mode(text).map_err(|e| err("mode", e))?,
                None => Mode::M { batch: 32 },
            },
            None => Mode::N,
        };
        let default_associations = match overrides.associations {
            Some(n) => check_associations("--associations", u64::from(n))?,
            None => match self.associations {
                Some(n) => check_associations("associations", n.0)?,
                None => 1,
            },
        };

        let mut peers = Vec::new();
        for (i, peer) in self.peer.iter().enumerate() {
            let key = |k: &str| format!("peer[{i}].{k}");
            if !endpoint {
                relay_refuses(
                    &[
                        (&key("mode"), peer.mode.is_some()),
                        (&key("associations"), peer.associations.is_some()),
                        (&key("connect"), peer.connect.is_some()),
                    ],
                    "a relay's route",
                    RELAY_PEER_KEYS,
                )?;
            }
            let address = peer
                .address
                .as_deref()
                .ok_or_else(|| err(key("address"), "missing"))?;
            let address = parse_addr(&key("address"), address)?;
            let via = peer
                .via
                .as_deref()
                .map(|text| parse_addr(&key("via"), text))
                .transpose()?;
            if !endpoint && via.is_none() {
                return Err(err(key("via"), "missing (a route names its next hop)"));
            }
            if peers.iter().any(|p: &PeerSetup| p.address == address) {
                return Err(err(key("address"), format!("{address} is listed twice")));
            }
            if address == listen || via == Some(listen) {
                return Err(err(key("address"), "this node's own address"));
            }
            let mode = match (&overrides.mode, &peer.mode) {
                (None, Some(text)) => parse_mode(text).map_err(|e| err(key("mode"), e))?,
                _ => default_mode,
            };
            let associations = match (overrides.associations, peer.associations) {
                (None, Some(n)) => check_associations(&key("associations"), n.0)?,
                _ => default_associations,
            };
            if let Some(text) = &peer.trust {
                let k = parse_key(&key("trust"), text)?;
                if !trust.contains(&k) {
                    trust.push(k);
                }
            }
            peers.push(PeerSetup {
                address,
                via,
                mode,
                associations,
                connect: peer.connect.unwrap_or(true),
            });
        }

        let role = if endpoint {
            Role::Endpoint(self.endpoint(listen, &peers)?)
        } else {
            Role::Relay
        };
        let metrics = match (overrides.metrics, self.metrics.as_deref()) {
            (Some(addr), _) => Some(addr),
            (None, Some(text)) => Some(parse_addr("metrics", text)?),
            (None, None) => None,
        };
        Ok(HopSetup {
            role,
            identity,
            listen,
            ctl,
            trust,
            delay: Duration::from_millis(delay_ms),
            metrics,
            peers,
        })
    }

    /// The endpoint-only settings, checked against the node's `listen` and `peers`.
    fn endpoint(
        &self,
        listen: SocketAddr,
        peers: &[PeerSetup],
    ) -> Result<EndpointSetup, ConfigError> {
        let app = match self.app.as_deref() {
            None | Some("stdio") => {
                if self.tun.is_some() {
                    return Err(err("tun", "only with app = \"tun\""));
                }
                App::Stdio
            }
            Some("tun") => {
                let tun = match &self.tun {
                    Some(t) => t.validate()?,
                    None => return Err(err("tun", "missing (app = \"tun\" needs a [tun] table)")),
                };
                if peers.len() != 1 {
                    return Err(err(
                        "peer",
                        format!(
                            "app = \"tun\" sends every packet to one peer: configure exactly \
                             one [[peer]] (found {})",
                            peers.len()
                        ),
                    ));
                }
                if listen.is_ipv4() && in_subnet(listen.ip(), tun.address, tun.prefix) {
                    return Err(err(
                        "tun.address",
                        format!(
                            "the tunnel subnet {}/{} holds the overlay address {}: cohort's \
                             own UDP packets would loop into the tunnel",
                            tun.address,
                            tun.prefix,
                            listen.ip()
                        ),
                    ));
                }
                if let Some(p) = peers.iter().find(|p| {
                    in_subnet(p.address.ip(), tun.address, tun.prefix)
                        || p.via
                            .is_some_and(|v| in_subnet(v.ip(), tun.address, tun.prefix))
                }) {
                    return Err(err(
                        "tun.address",
                        format!(
                            "the tunnel subnet {}/{} holds the overlay address of peer {}: \
                             use a separate subnet for the tunnel",
                            tun.address, tun.prefix, p.address
                        ),
                    ));
                }
                App::Tun(tun)
            }
            Some(other) => return Err(err("app", format!("unknown app {other:?} (stdio or tun)"))),
        };
        let chain_rounds = match self.chain_rounds.map(|n| n.0) {
            None => None,
            Some(n) if (2..=1 << 24).contains(&n) => u32::try_from(n).ok(),
            Some(n) => return Err(err("chain_rounds", format!("must be 2..=16777216 ({n})"))),
        };
        let storage = self
            .storage
            .as_deref()
            .map(|t| parse_storage(t).map_err(|e| err("storage", e)))
            .transpose()?;
        let max_window = cohort_hop::MAX_WINDOW;
        let window = match self.window.map(|n| n.0) {
            None => None,
            Some(n) if (1..=u64::from(max_window)).contains(&n) => u8::try_from(n).ok(),
            Some(n) => return Err(err("window", format!("must be 1..={max_window} ({n})"))),
        };
        if let (Some(w), Some(rounds)) = (window, chain_rounds) {
            if u32::from(w) > rounds {
                return Err(err(
                    "window",
                    format!("must be at most chain_rounds ({w} > {rounds})"),
                ));
            }
        }
        let max_queue = match self.max_queue.map(|n| n.0) {
            Some(0) => return Err(err("max_queue", "must be at least 1")),
            Some(n) => Some(usize::try_from(n).map_err(|_| err("max_queue", "too large"))?),
            None => None,
        };
        let retransmit = match self.retransmit_ms {
            Some(Whole(0)) => return Err(err("retransmit_ms", "must be at least 1")),
            Some(ms) => Some(ms.millis()),
            None => None,
        };
        let max_retries = self
            .max_retries
            .map(|n| u32::try_from(n.0).map_err(|_| err("max_retries", "too large")))
            .transpose()?;
        Ok(EndpointSetup {
            app,
            chain_rounds,
            storage,
            delivery_reports: self.delivery_reports,
            window,
            max_queue,
            retransmit,
            max_retries,
        })
    }
}

/// Parses a mode as written: `none`, `n`, `c[:K]`, `m[:K]`.
pub fn parse_mode(text: &str) -> Result<Mode, String> {
    text.trim().parse::<Mode>()
}

/// Parses `full`, `checkpoint:N` or `log`.
pub fn parse_storage(text: &str) -> Result<ChainStorage, String> {
    text.trim().parse::<ChainStorage>()
}

impl TunFile {
    /// Checks the `[tun]` table and applies its defaults.
    pub fn validate(&self) -> Result<TunSetup, ConfigError> {
        let name = self.name.as_deref().unwrap_or("cohort0").to_string();
        // IFNAMSIZ is 16 with the terminating NUL.
        if name.is_empty()
            || name.len() > 15
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        {
            return Err(err(
                "tun.name",
                format!("{name:?} is not an interface name (1-15 of A-Z a-z 0-9 - _ .)"),
            ));
        }
        let text = self
            .address
            .as_deref()
            .ok_or_else(|| err("tun.address", "missing"))?;
        let (addr, prefix) = text.split_once('/').ok_or_else(|| {
            err(
                "tun.address",
                format!("{text:?} is not ADDRESS/PREFIX (e.g. 10.200.0.1/24)"),
            )
        })?;
        let address: Ipv4Addr = addr.parse().map_err(|e| {
            err(
                "tun.address",
                format!("{addr:?} is not an IPv4 address: {e}"),
            )
        })?;
        let prefix: u8 = match prefix.parse() {
            Ok(p) if (8..=30).contains(&p) => p,
            _ => {
                return Err(err(
                    "tun.address",
                    format!("prefix length must be 8..=30 ({prefix:?})"),
                ))
            }
        };
        let mtu = match self.mtu.map(|n| n.0) {
            None => DEFAULT_TUN_MTU,
            Some(n) if (u64::from(MIN_TUN_MTU)..=9000).contains(&n) => n as u16,
            Some(n) => {
                return Err(err(
                    "tun.mtu",
                    format!("must be {MIN_TUN_MTU}..=9000 ({n})"),
                ))
            }
        };
        let fwmark = match self.fwmark.map(|n| n.0) {
            None => None,
            Some(n) if (1..=u64::from(u32::MAX)).contains(&n) => Some(n as u32),
            Some(n) => return Err(err("tun.fwmark", format!("must be 1..={} ({n})", u32::MAX))),
        };
        Ok(TunSetup {
            name,
            address,
            prefix,
            mtu,
            fwmark,
            offload: self.offload.unwrap_or(true),
        })
    }
}

fn in_subnet(ip: std::net::IpAddr, net: Ipv4Addr, prefix: u8) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => {
            let mask = u32::MAX << (32 - u32::from(prefix));
            u32::from(v4) & mask == u32::from(net) & mask
        }
        std::net::IpAddr::V6(_) => false,
    }
}

fn check_associations(key: &str, n: u64) -> Result<u16, ConfigError> {
    match u16::try_from(n) {
        Ok(n) if (1..=MAX_ASSOCIATIONS).contains(&n) => Ok(n),
        _ => Err(err(key, format!("must be 1..={MAX_ASSOCIATIONS} ({n})"))),
    }
}

fn parse_key(key: &str, text: &str) -> Result<PublicKey, ConfigError> {
    text.parse::<PublicKey>()
        .map_err(|e| err(key, format!("not an ed25519 public key: {e}")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // reason: test code; a panic is the failure report
mod tests {
    use super::*;

    use crate::config_file::test_support::Dir;

    /// A temporary directory holding `a.key`; returns it and a's public key.
    fn dir_with_key(name: &str) -> (Dir, String) {
        crate::config_file::test_support::dir_with_key(&format!("hcfg-{name}"), "a.key")
    }

    fn parse_with(dir: &Dir, text: &str, o: &Overrides) -> Result<HopSetup, ConfigError> {
        let ctl = dir.0.join("default.sock");
        parse(&CryptoProvider::default_provider(), text, &dir.0, &ctl, o)
    }

    fn parse_in(dir: &Dir, text: &str) -> Result<HopSetup, ConfigError> {
        parse_with(dir, text, &Overrides::default())
    }

    const EP: &str = "role = \"endpoint\"\nidentity = \"a.key\"\nlisten = \"127.0.0.1:7500\"\n";
    const PEER: &str = "[[peer]]\naddress = \"127.0.0.1:7501\"\n";

    #[test]
    fn a_full_endpoint_config_parses() {
        let (dir, public) = dir_with_key("full");
        let text = format!(
            "{EP}trust = [\"{public}\"]\nmode = \"c:16\"\nassociations = 2\ndelay_ms = 5\n\
             chain_rounds = 500\nstorage = \"checkpoint:8\"\ndelivery_reports = true\n\
             window = 8\n\
             max_queue = 100\nretransmit_ms = 40\nmax_retries = 3\nctl = \"x.sock\"\n\
             [[peer]]\naddress = \"127.0.0.1:7501\"\nvia = \"127.0.0.1:7600\"\nmode = \"m:8\"\n\
             associations = 4\nconnect = false\n\
             [[peer]]\naddress = \"[::1]:7502\"\n"
        );
        let setup = parse_in(&dir, &text).unwrap();
        assert_eq!(
            setup.identity.as_ref().unwrap().public().to_string(),
            public
        );
        assert_eq!(setup.trust.len(), 1);
        assert_eq!(setup.delay, Duration::from_millis(5));
        assert_eq!(setup.ctl, dir.0.join("x.sock"));
        assert_eq!(setup.peers.len(), 2);
        let p = &setup.peers[0];
        assert_eq!(p.via, Some("127.0.0.1:7600".parse().unwrap()));
        assert_eq!(p.mode, Mode::M { batch: 8 });
        assert_eq!((p.associations, p.connect), (4, false));
        let q = &setup.peers[1];
        assert_eq!(
            (q.mode, q.associations, q.connect),
            (Mode::C { batch: 16 }, 2, true)
        );
        let Role::Endpoint(e) = &setup.role else {
            panic!("not an endpoint")
        };
        assert_eq!(e.app, App::Stdio);
        assert_eq!(e.chain_rounds, Some(500));
        assert_eq!(e.window, Some(8));
        assert_eq!(e.storage, Some(ChainStorage::Checkpoint { interval: 8 }));
        assert_eq!(e.retransmit, Some(Duration::from_millis(40)));
        // Defaults.
        let minimal = parse_in(&dir, EP).unwrap();
        assert_eq!(minimal.ctl, dir.0.join("default.sock"));
        assert!(minimal.peers.is_empty() && minimal.trust.is_empty());
        assert_eq!(minimal.delay, Duration::ZERO);
    }

    #[test]
    fn the_command_line_overrides_the_file() {
        let (dir, _) = dir_with_key("over");
        let text =
            format!("{EP}mode = \"n\"\ndelay_ms = 9\n{PEER}mode = \"c:4\"\nassociations = 3\n");
        let o = Overrides {
            listen: Some("127.0.0.1:9000".parse().unwrap()),
            mode: Some("none".into()),
            associations: Some(8),
            ctl: Some(PathBuf::from("/tmp/x.sock")),
            delay_ms: Some(0),
            metrics: None,
        };
        let setup = parse_with(&dir, &text, &o).unwrap();
        assert_eq!(setup.listen.port(), 9000);
        assert_eq!(setup.peers[0].mode, Mode::Unprotected);
        assert_eq!(setup.peers[0].associations, 8);
        assert_eq!(setup.ctl, PathBuf::from("/tmp/x.sock"));
        assert_eq!(setup.delay, Duration::ZERO);
    }

    #[test]
    fn tun_and_relay_configs_parse() {
        let (dir, public) = dir_with_key("tun");
        let text = format!(
            "role = \"endpoint\"\nidentity = \"a.key\"\nlisten = \"10.77.1.1:7500\"\n\
             app = \"tun\"\n[tun]\nname = \"hop0\"\naddress = \"10.200.0.1/24\"\n\
             [[peer]]\naddress = \"10.77.2.2:7500\"\nvia = \"10.77.1.2:7500\"\ntrust = \"{public}\"\n"
        );
        let setup = parse_in(&dir, &text).unwrap();
        let Role::Endpoint(e) = &setup.role else {
            panic!("not an endpoint")
        };
        assert_eq!(
            e.app,
            App::Tun(TunSetup {
                name: "hop0".into(),
                address: Ipv4Addr::new(10, 200, 0, 1),
                prefix: 24,
                mtu: DEFAULT_TUN_MTU,
                fwmark: None,
                offload: true,
            })
        );
        assert_eq!(setup.trust.len(), 1);
        let no_offload = text.replace("name = \"hop0\"\n", "name = \"hop0\"\noffload = false\n");
        let Role::Endpoint(e) = parse_in(&dir, &no_offload).unwrap().role else {
            panic!("not an endpoint")
        };
        assert!(matches!(e.app, App::Tun(TunSetup { offload: false, .. })));
        let relay = "role = \"relay\"\nlisten = \"10.77.1.2:7500\"\n\
                     [[peer]]\naddress = \"10.77.2.2:7500\"\nvia = \"10.77.2.1:7500\"\n";
        let setup = parse_in(&dir, relay).unwrap();
        assert!(matches!(setup.role, Role::Relay));
        assert!(setup.identity.is_none());
        assert_eq!(setup.peers[0].via, Some("10.77.2.1:7500".parse().unwrap()));
    }

    #[test]
    fn every_error_names_its_key() {
        let (dir, _) = dir_with_key("errors");
        let tun = "app = \"tun\"\n[tun]\naddress = \"10.200.0.1/24\"\n";
        let cases: &[(&str, &str)] = &[
            ("colour = \"blue\"", "colour"),
            ("trust = [\"ed25519:00\"]", "trust[0]"),
            ("mode = \"x\"", "mode"),
            ("mode = \"m:0\"", "mode"),
            ("associations = 0", "associations"),
            ("associations = 1000", "associations"),
            ("delay_ms = -1", "delay_ms"),
            ("delay_ms = 100000", "delay_ms"),
            ("chain_rounds = 1", "chain_rounds"),
            ("storage = \"pebbles\"", "storage"),
            ("storage = \"checkpoint:0\"", "storage"),
            ("max_queue = 0", "max_queue"),
            ("window = 0", "window"),
            ("window = 9", "window"),
            ("chain_rounds = 2\nwindow = 3", "window"),
            ("retransmit_ms = \"soon\"", "retransmit_ms"),
            ("app = \"gui\"", "app"),
            ("ctl = \"\"", "ctl"),
            ("[tun]\naddress = \"10.200.0.1/24\"", "tun"),
            ("app = \"tun\"", "tun"),
            ("[[peer]]\naddress = \"nowhere\"", "peer[0].address"),
            ("[[peer]]\nvia = \"127.0.0.1:1\"", "peer[0].address"),
            (
                "[[peer]]\naddress = \"127.0.0.1:1\"\nvia = \"x\"",
                "peer[0].via",
            ),
            (
                "[[peer]]\naddress = \"127.0.0.1:1\"\nmode = \"q\"",
                "peer[0].mode",
            ),
            (
                "[[peer]]\naddress = \"127.0.0.1:1\"\ncolour = 1",
                "peer[0].colour",
            ),
            (
                "[[peer]]\naddress = \"127.0.0.1:1\"\ntrust = \"k\"",
                "peer[0].trust",
            ),
            (
                "[[peer]]\naddress = \"127.0.0.1:1\"\n[[peer]]\naddress = \"127.0.0.1:1\"",
                "peer[1].address",
            ),
            ("[[peer]]\naddress = \"127.0.0.1:7500\"", "peer[0].address"),
            ("peer = 3", "peer"),
        ];
        for (line, key) in cases {
            let text = format!("{EP}{line}\n");
            let e = parse_in(&dir, &text)
                .err()
                .unwrap_or_else(|| panic!("{line} parsed"));
            assert_eq!(&e.key, key, "{line}: {e}");
        }
        let tun_cases: &[(&str, &str)] = &[
            ("", "peer"),
            ("name = \"a b\"", "tun.name"),
            ("mtu = 100", "tun.mtu"),
            ("fwmark = 0", "tun.fwmark"),
            ("offload = 1", "tun.offload"),
            ("size = 3", "tun.size"),
        ];
        for (line, key) in tun_cases {
            let text = format!("{EP}{tun}{line}\n");
            let e = parse_in(&dir, &text).err().unwrap();
            assert_eq!(&e.key, key, "{line}: {e}");
        }
        let with_peer = format!("{EP}{tun}[[peer]]\naddress = \"10.200.0.2:7500\"\n");
        assert_eq!(parse_in(&dir, &with_peer).err().unwrap().key, "tun.address");
        let bad_prefix = format!("{EP}app = \"tun\"\n{PEER}[tun]\naddress = \"10.200.0.1/33\"\n");
        assert_eq!(
            parse_in(&dir, &bad_prefix).err().unwrap().key,
            "tun.address"
        );
        for (text, key) in [
            ("identity = \"a.key\"", "role"),
            ("role = \"router\"", "role"),
            ("role = \"endpoint\"\nlisten = \"127.0.0.1:1\"", "identity"),
            ("role = \"endpoint\"\nidentity = \"nope.key\"", "identity"),
            ("role = \"endpoint\"\nidentity = \"a.key\"", "listen"),
            (
                "role = \"endpoint\"\nidentity = \"a.key\"\nlisten = \"0.0.0.0:1\"",
                "listen",
            ),
            (
                "role = \"relay\"\nlisten = \"127.0.0.1:1\"\nmode = \"n\"",
                "mode",
            ),
            (
                "role = \"relay\"\nlisten = \"127.0.0.1:1\"\n[[peer]]\naddress = \"127.0.0.1:2\"",
                "peer[0].via",
            ),
            (
                "role = \"relay\"\nlisten = \"127.0.0.1:1\"\n[[peer]]\naddress = \"127.0.0.1:2\"\n\
                 via = \"127.0.0.1:3\"\nmode = \"n\"",
                "peer[0].mode",
            ),
            ("role = [", ""),
        ] {
            let e = parse_in(&dir, text)
                .err()
                .unwrap_or_else(|| panic!("{text} parsed"));
            assert_eq!(e.key, key, "{text}: {e}");
        }
    }

    #[test]
    fn storage_choices_parse() {
        assert_eq!(parse_storage("full"), Ok(ChainStorage::Full));
        assert_eq!(parse_storage(" log"), Ok(ChainStorage::Logarithmic));
        assert!(parse_storage("checkpoint:x").is_err());
        assert!(parse_storage("full:3").is_err());
    }
}
