//! How a group behaves: timers, bounds, security, rekey policy and trust.

use crate::id::MemberId;
use cohort_gears::{GearId, GearKind};
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

/// The principals a member trusts, shared: cloning a config, or handing the list to the
/// pair-channel layer, copies a pointer, not the list (in a simulation of 10,000 members
/// in one process the list was held twice per member, 640 KiB each). It reads as a slice
/// in the order given; [`contains`](Self::contains) looks up a sorted copy, so a check
/// costs O(log n), not a scan of the list.
#[derive(Clone, Default)]
pub struct TrustList(Arc<TrustInner>);

/// The list in the order given and a sorted, deduplicated copy for lookups.
#[derive(Default)]
struct TrustInner {
    listed: Vec<MemberId>,
    sorted: Vec<MemberId>,
}

impl TrustList {
    /// Whether `id` is on the list.
    pub fn contains(&self, id: &MemberId) -> bool {
        self.0.sorted.binary_search(id).is_ok()
    }

    /// The principals in the order given.
    pub fn as_slice(&self) -> &[MemberId] {
        &self.0.listed
    }
}

impl From<Vec<MemberId>> for TrustList {
    fn from(listed: Vec<MemberId>) -> Self {
        let mut sorted = listed.clone();
        sorted.sort_unstable();
        sorted.dedup();
        TrustList(Arc::new(TrustInner { listed, sorted }))
    }
}

impl From<&[MemberId]> for TrustList {
    fn from(listed: &[MemberId]) -> Self {
        TrustList::from(listed.to_vec())
    }
}

impl FromIterator<MemberId> for TrustList {
    fn from_iter<I: IntoIterator<Item = MemberId>>(iter: I) -> Self {
        TrustList::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl Deref for TrustList {
    type Target = [MemberId];

    fn deref(&self) -> &[MemberId] {
        self.as_slice()
    }
}

impl PartialEq for TrustList {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for TrustList {}

impl fmt::Debug for TrustList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

/// How every packet of the group is protected. All three stacks run the same protocol;
/// they differ only in the gear (Ensemble's Encrypt layer on or off).
#[derive(Clone, Debug, PartialEq)]
pub enum Protection {
    /// Encrypt and authenticate with an AEAD gear (the default: `aes-128-gcm`).
    Encrypt(GearId),
    /// Authenticate only, with the MAC gears in `gears` (strongest first). With two or more,
    /// each sender's controller shifts among them from receivers' load and failure reports
    /// (ACSA 2.3); with `dual_tags`, every packet carries the strongest and the chosen fast
    /// tag so each receiver verifies the one it can afford (ACSA 3.4).
    Authenticate {
        /// Allowed MAC gears, strongest first.
        gears: Vec<GearId>,
        /// The weakest forgery bound, in bits, the group accepts.
        floor_bits: f64,
        /// Attach the strongest tag beside the chosen one.
        dual_tags: bool,
    },
    /// No protection at all (the null gear): a baseline for benchmarks and tests only.
    DangerNoneForTesting,
}

impl Default for Protection {
    fn default() -> Self {
        Protection::Encrypt(GearId::Aes128Gcm)
    }
}

/// When the group gets a fresh key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RekeyPolicy {
    /// Rekey with every view whose membership differs from the last (join, leave, failure).
    pub on_membership_change: bool,
    /// Rekey at least this often, if set.
    pub period: Option<Duration>,
}

impl Default for RekeyPolicy {
    fn default() -> Self {
        RekeyPolicy {
            on_membership_change: true,
            period: None,
        }
    }
}

/// How a fresh key reaches the members.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RekeyMethod {
    /// LSGC: one message carrying the key wrapped for each member under its pair key.
    #[default]
    OneMessage,
    /// Ensemble: the leader sends the key over pairwise channels down a tree of this degree;
    /// acks climb the tree; the key is installed with the next view.
    Tree {
        /// Children per node (at least 1).
        degree: usize,
    },
    /// A logical key hierarchy (Wong, Gouda, Lam 1998; RFC 2627) rekeyed in batches (Li,
    /// Yang, Gouda, Lam 2001): every member holds the keys on its path to the root, the root
    /// is the group key, and a view change replaces the keys on the paths of those who left
    /// or joined, each wrapped under its children's keys, in the Install (about
    /// d·log_d(n) wraps for one leave). Works in both auth modes.
    Lkh {
        /// Children per node: 2 to 64 ([`RekeyMethod::LKH_DEFAULT_DEGREE`] by default).
        degree: usize,
    },
}

impl RekeyMethod {
    /// The LKH tree's degree unless configured.
    pub const LKH_DEFAULT_DEGREE: usize = 4;

    /// The LKH rekey with the default degree.
    pub const fn lkh() -> RekeyMethod {
        RekeyMethod::Lkh {
            degree: Self::LKH_DEFAULT_DEGREE,
        }
    }
}

/// How members prove who they are and get the keys of their pair channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AuthMode {
    /// Ed25519 identity keys; pair channels with a hybrid KEM handshake (the default).
    #[default]
    IdentityKeys,
    /// LSGC: long-term symmetric keys registered with a KDC, Leighton-Micali pair keys, no
    /// public-key operation anywhere. Members are `kdc:<name>` principals; with
    /// `trust_any_registered` every principal the KDC knows is trusted. Needs the
    /// one-message rekey, and every view gets a fresh key (its Install is authenticated
    /// through each member's wrap).
    Kdc,
}

/// A group's configuration. Every member of a group must use the same `group`, `protection`
/// and `rekey_method`; timers may differ.
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// The group's name; packets of other groups are dropped.
    pub group: String,
    /// Principals allowed in. A member's own key need not be listed. Shared between
    /// clones (`TrustList::from(vec)` or `.into()` builds one).
    pub trust: TrustList,
    /// Identity keys (the default) or KDC mode.
    pub auth: AuthMode,
    /// KDC mode only: trust every principal the KDC knows (LSGC's policy: registration is
    /// the authorization), besides those in `trust`.
    pub trust_any_registered: bool,
    /// How packets are protected.
    pub protection: Protection,
    /// When to rekey.
    pub rekey_policy: RekeyPolicy,
    /// How keys are disseminated.
    pub rekey_method: RekeyMethod,
    /// How often members send heartbeats (members to the leader, the leader to all).
    pub heartbeat_interval: Duration,
    /// Silence after which a member is suspected (and the view changes without it).
    pub suspect_timeout: Duration,
    /// How long a coordinator waits for flush or rekey answers before it excludes the
    /// silent members and tries again.
    pub flush_timeout: Duration,
    /// How long the previous view's keys are kept for traffic in flight; then wiped.
    pub key_grace: Duration,
    /// Most reliable messages the sequencer keeps for retransmission. A member whose
    /// acknowledgements fall this far behind is removed.
    pub backlog_limit: usize,
    /// Most reliable messages one member may have sent and not yet seen ordered.
    pub send_window: usize,
    /// Largest application message, in bytes.
    pub max_message_len: usize,
    /// The carrier fans out (a broker such as NATS): a packet for every member is queued
    /// once, as [`Destination::Group`](crate::Destination::Group), for the driver to publish
    /// once, and the overlay no longer passes the leader's broadcasts down its tree (the
    /// carrier delivers them to every member). Off (the default): one copy per member, as
    /// UDP needs. Drivers that read [`Machine::poll_transmit`](cohort_core::Machine) get
    /// one copy per member either way.
    pub carrier_fans_out: bool,
}

/// Default largest application message: fits a flush answer and one UDP datagram.
pub const DEFAULT_MAX_MESSAGE_LEN: usize = 1400;

impl GroupConfig {
    /// Defaults for a group named `group` that trusts `trust`.
    pub fn new(group: impl Into<String>, trust: impl Into<TrustList>) -> Self {
        GroupConfig {
            group: group.into(),
            trust: trust.into(),
            auth: AuthMode::default(),
            trust_any_registered: false,
            protection: Protection::default(),
            rekey_policy: RekeyPolicy::default(),
            rekey_method: RekeyMethod::default(),
            heartbeat_interval: Duration::from_millis(100),
            suspect_timeout: Duration::from_millis(1000),
            flush_timeout: Duration::from_millis(500),
            key_grace: Duration::from_secs(2),
            backlog_limit: 4096,
            send_window: 32,
            max_message_len: DEFAULT_MAX_MESSAGE_LEN,
            carrier_fans_out: false,
        }
    }

    /// Checks the bounds; the error names the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        use ConfigField as F;
        if self.group.is_empty() || self.group.len() > 255 {
            return Err(ConfigError::new(
                F::Group,
                "the name must be 1 to 255 bytes",
            ));
        }
        if self.heartbeat_interval.is_zero() {
            return Err(ConfigError::new(F::HeartbeatInterval, "must be above zero"));
        }
        if self.suspect_timeout <= self.heartbeat_interval * 2 {
            return Err(ConfigError::new(
                F::SuspectTimeout,
                "must exceed two heartbeat intervals",
            ));
        }
        if self.backlog_limit < self.send_window.max(16) {
            return Err(ConfigError::new(
                F::BacklogLimit,
                "must be at least the send window and 16",
            ));
        }
        if self.send_window == 0 || self.send_window > 1024 {
            return Err(ConfigError::new(F::SendWindow, "must be 1 to 1024"));
        }
        if self.max_message_len == 0 || self.max_message_len > 16 * 1024 {
            return Err(ConfigError::new(F::MaxMessageLen, "must be 1 to 16384"));
        }
        if self.auth == AuthMode::Kdc {
            if matches!(self.rekey_method, RekeyMethod::Tree { .. }) {
                return Err(ConfigError::new(
                    F::RekeyMethod,
                    "KDC mode distributes keys in one message or by LKH only",
                ));
            }
            if let Some(m) = self.trust.iter().find(|m| m.principal().is_none()) {
                return Err(ConfigError::new(
                    F::Trust,
                    format!("{m} is not a kdc:<name> principal (KDC mode)"),
                ));
            }
        } else if self.trust_any_registered {
            return Err(ConfigError::new(F::TrustAnyRegistered, "only in KDC mode"));
        }
        if let RekeyMethod::Tree { degree } = self.rekey_method {
            if degree == 0 {
                return Err(ConfigError::new(
                    F::TreeDegree,
                    "tree degree must be at least 1",
                ));
            }
        }
        if let RekeyMethod::Lkh { degree } = self.rekey_method {
            if !(2..=crate::lkh::MAX_DEGREE).contains(&degree) {
                return Err(ConfigError::new(
                    F::LkhDegree,
                    format!("lkh degree must be 2 to {}", crate::lkh::MAX_DEGREE),
                ));
            }
        }
        match &self.protection {
            Protection::Encrypt(g) if !(g.info().kind == GearKind::Aead) => Err(ConfigError::new(
                F::Protection,
                format!("{} is not an AEAD gear", g.name()),
            )),
            Protection::Authenticate { gears, .. } if gears.is_empty() => Err(ConfigError::new(
                F::Protection,
                "name at least one MAC gear",
            )),
            Protection::Authenticate { gears, .. } => {
                match gears.iter().find(|g| {
                    (g.info().kind == GearKind::Aead) || **g == GearId::DangerNullForTesting
                }) {
                    Some(g) => Err(ConfigError::new(
                        F::Protection,
                        format!("{} is not a MAC gear", g.name()),
                    )),
                    None => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }
}

/// The [`GroupConfig`] field a [`ConfigError`] is about.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConfigField {
    /// `group`.
    Group,
    /// `auth`: the member was built with credentials of the other mode.
    Auth,
    /// `trust`.
    Trust,
    /// `trust_any_registered`.
    TrustAnyRegistered,
    /// `protection`.
    Protection,
    /// `rekey_method`: the method itself (KDC mode allows the one-message and LKH rekeys).
    RekeyMethod,
    /// `rekey_method`: the tree's degree.
    TreeDegree,
    /// `rekey_method`: the LKH tree's degree.
    LkhDegree,
    /// `heartbeat_interval`.
    HeartbeatInterval,
    /// `suspect_timeout`.
    SuspectTimeout,
    /// `backlog_limit`.
    BacklogLimit,
    /// `send_window`.
    SendWindow,
    /// `max_message_len`.
    MaxMessageLen,
}

impl ConfigField {
    /// The field's name in [`GroupConfig`].
    pub fn name(self) -> &'static str {
        match self {
            ConfigField::Group => "group",
            ConfigField::Auth => "auth",
            ConfigField::Trust => "trust",
            ConfigField::TrustAnyRegistered => "trust_any_registered",
            ConfigField::Protection => "protection",
            ConfigField::RekeyMethod | ConfigField::TreeDegree | ConfigField::LkhDegree => {
                "rekey_method"
            }
            ConfigField::HeartbeatInterval => "heartbeat_interval",
            ConfigField::SuspectTimeout => "suspect_timeout",
            ConfigField::BacklogLimit => "backlog_limit",
            ConfigField::SendWindow => "send_window",
            ConfigField::MaxMessageLen => "max_message_len",
        }
    }
}

/// A [`GroupConfig`] that cannot run: which field, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The field at fault.
    pub field: ConfigField,
    /// What is wrong, for people.
    pub problem: String,
}

impl ConfigError {
    /// An error about `field`.
    pub fn new(field: ConfigField, problem: impl Into<String>) -> Self {
        ConfigError {
            field,
            problem: problem.into(),
        }
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field.name(), self.problem)
    }
}

impl std::error::Error for ConfigError {}
