//! The gear registry: every gear's wire id, name, lengths, forgery bound and limits.
//!
//! A gear is a MAC or AEAD at one strength-performance point (ACSA section 3). Its id is
//! carried in every protected packet, like ACSA's SPI, so sender and receiver stay in step
//! without any other signalling. Ids are stable: a published id is never reused.
//!
//! # Forgery bounds
//! [`GearInfo::forgery_bits`] is `-log2` of the best known (or proven) probability that one
//! forgery attempt on a packet of at most [`MAX_PACKET_LEN`] bytes is accepted. The
//! derivation for each gear is in [`GearInfo::bound_derivation`] and in `docs/gears.md`. For
//! partial MACs it is the bound against the weakest attack, a change to one body word; the
//! bound for data the tag does cover is [`GearInfo::covered_forgery_bits`].
//!
//! # Limits
//! * [`GearInfo::integrity_limit`]: failed verifications a receiver tolerates under one key
//!   before it retires the gear, chosen so that an attacker's total chance of success stays
//!   below 2^-20 (capped at 2^52, QUIC's AES-GCM integrity limit).
//! * [`GearInfo::usage_limit`]: packets a sender may protect under one key; the sender stops
//!   (and must rekey) rather than wrap a nonce or exceed an AEAD's confidentiality limit.

use std::fmt;

/// Largest protected packet any gear accepts, in bytes (header, body, tags and framing).
pub const MAX_PACKET_LEN: usize = 65_536;

/// A gear's wire id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum GearId {
    /// No security at all: a zero-length tag, no encryption. For fuzzing, simulation and
    /// baselines only; a receiver accepts it only if it was built to.
    DangerNullForTesting = 0x00,
    /// HMAC-SHA256, full 256-bit tag.
    HmacSha256 = 0x01,
    /// HMAC-SHA256 truncated to 128 bits.
    HmacSha256_128 = 0x02,
    /// Keyed BLAKE3, 128-bit output.
    Blake3_128 = 0x03,
    /// GMAC with AES-128 (AES-GCM over an empty plaintext), 128-bit tag.
    GmacAes128 = 0x10,
    /// UMAC-32 (RFC 4418).
    Umac32 = 0x11,
    /// UMAC-64 (RFC 4418).
    Umac64 = 0x12,
    /// UMAC-96 (RFC 4418).
    Umac96 = 0x13,
    /// UMAC-128 (RFC 4418).
    Umac128 = 0x14,
    /// Inner-function group with bit scattering (ACSA 3.2.1, Appendix A). Experimental.
    IfgExperimental = 0x20,
    /// Partial MAC with L = 2: each body word covered with probability 2/(2L+1) = 0.400 (ACSA 3.3).
    Partial2 = 0x30,
    /// Partial MAC with L = 4: each body word covered with probability 2/(2L+1) = 0.222.
    Partial4 = 0x31,
    /// Partial MAC with L = 8: each body word covered with probability 2/(2L+1) = 0.118.
    Partial8 = 0x32,
    /// Partial MAC with L = 16: each body word covered with probability 2/(2L+1) = 0.0606.
    Partial16 = 0x33,
    /// Partial MAC with L = 32: each body word covered with probability 2/(2L+1) = 0.0308.
    Partial32 = 0x34,
    /// Partial MAC with L = 64: each body word covered with probability 2/(2L+1) = 0.0155.
    Partial64 = 0x35,
    /// Partial MAC with L = 128: each body word covered with probability 2/(2L+1) = 0.0078.
    Partial128 = 0x36,
    /// Partial MAC with L = 256: each body word covered with probability 2/(2L+1) = 0.0039.
    Partial256 = 0x37,
    /// AES-128-GCM: authentication and privacy.
    Aes128Gcm = 0x40,
    /// AES-256-GCM: authentication and privacy.
    Aes256Gcm = 0x41,
    /// ChaCha20-Poly1305: authentication and privacy.
    ChaCha20Poly1305 = 0x42,
}

/// What a gear provides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GearKind {
    /// No protection (testing only).
    Null,
    /// A MAC: the body travels in clear, a tag authenticates it.
    Mac,
    /// An AEAD: the body is encrypted; the tag authenticates header and ciphertext.
    Aead,
}

/// How far a gear's security is established.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GearStatus {
    /// A standard construction with a proof or long analysis behind its bound.
    Standard,
    /// Heuristic security (ACSA's own words for bit scattering); measure before relying on it.
    Experimental,
    /// Gives no security at all.
    Danger,
}

impl fmt::Display for GearStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GearStatus::Standard => "standard",
            GearStatus::Experimental => "experimental",
            GearStatus::Danger => "danger",
        })
    }
}

/// Everything known about a gear, independent of any key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GearInfo {
    /// Wire id.
    pub id: GearId,
    /// Stable name used in configs and on the command line.
    pub name: &'static str,
    /// MAC, AEAD or null.
    pub kind: GearKind,
    /// Primary key length in bytes (derived per gear from the association secret).
    pub key_len: usize,
    /// Tag length in bytes.
    pub tag_len: usize,
    /// `-log2` of the per-attempt forgery probability (see the module docs).
    pub forgery_bits: f64,
    /// For partial MACs: the bound for changes to data the tag covers (header, chosen words).
    /// Equal to `forgery_bits` for every other gear.
    pub covered_forgery_bits: f64,
    /// How `forgery_bits` was derived.
    pub bound_derivation: &'static str,
    /// Failed verifications tolerated per key before the receiver retires the gear.
    pub integrity_limit: u64,
    /// Packets a sender may protect per key.
    pub usage_limit: u64,
    /// Standard, experimental or danger.
    pub status: GearStatus,
    /// For partial MACs: L, the mean step is L + 1/2 words (`None` for other gears).
    pub partial_l: Option<u32>,
}

impl GearInfo {
    /// For partial MACs, the chance that any one given body word is covered: 1 / (mean step)
    /// = 2 / (2L + 1), the same for every word because the walk's first landing is drawn
    /// from its equilibrium distribution. `None` for other gears.
    pub fn selection_probability(&self) -> Option<f64> {
        self.partial_l.map(|l| 2.0 / (2.0 * f64::from(l) + 1.0))
    }

    /// For partial MACs, ACSA's escape probability (1 - p)^w that a change to `w` body words
    /// goes unnoticed (equation 4): exact for one word, close for words several L apart, and
    /// too high for words closer than 2L (the walk cannot skip 2L of them);
    /// [`crate::partial::escape_probability`] gives the exact figure. `None` for other gears.
    pub fn escape_probability(&self, w: u32) -> Option<f64> {
        self.selection_probability()
            .map(|p| (1.0 - p).powi(w as i32))
    }
}

const fn integrity_limit_for(bits: u32) -> u64 {
    // Total success chance after `limit` failures is about limit * 2^-bits <= 2^-20.
    let exp = if bits > 72 {
        52
    } else {
        bits.saturating_sub(20)
    };
    1u64 << exp
}

const SEQ_SPACE: u64 = u64::MAX;

macro_rules! mac {
    ($id:ident, $name:literal, $key:expr, $tag:expr, $bits:expr, $why:literal) => {
        GearInfo {
            id: GearId::$id,
            name: $name,
            kind: GearKind::Mac,
            key_len: $key,
            tag_len: $tag,
            forgery_bits: $bits as f64,
            covered_forgery_bits: $bits as f64,
            bound_derivation: $why,
            integrity_limit: integrity_limit_for($bits),
            usage_limit: SEQ_SPACE,
            status: GearStatus::Standard,
            partial_l: None,
        }
    };
}

macro_rules! partial {
    ($id:ident, $name:literal, $l:expr, $bits:expr) => {
        GearInfo {
            id: GearId::$id,
            name: $name,
            kind: GearKind::Mac,
            key_len: 32,
            tag_len: 8,
            forgery_bits: $bits,
            covered_forgery_bits: 60.0,
            bound_derivation: "partial MAC: a change to any one body word escapes with \
                probability exactly 1 - 2/(2L+1) (the pseudorandom walk skips it); w words spread \
                apart escape with about (1-p)^w; header, length and chosen words are covered by \
                UMAC-64 (60 bits)",
            integrity_limit: integrity_limit_for(60),
            usage_limit: SEQ_SPACE,
            status: GearStatus::Standard,
            partial_l: Some($l),
        }
    };
}

/// Every gear cohort knows, in wire-id order.
pub const ALL_GEARS: &[GearInfo] = &[
    GearInfo {
        id: GearId::DangerNullForTesting,
        name: "danger-null-for-testing",
        kind: GearKind::Null,
        key_len: 0,
        tag_len: 0,
        forgery_bits: 0.0,
        covered_forgery_bits: 0.0,
        bound_derivation: "no tag: every modification is accepted",
        integrity_limit: u64::MAX,
        usage_limit: SEQ_SPACE,
        status: GearStatus::Danger,
        partial_l: None,
    },
    mac!(
        HmacSha256,
        "hmac-sha256",
        32,
        32,
        128,
        "HMAC-SHA256 is a PRF; guessing a 256-bit tag is 2^-256 but generic attacks on the \
         256-bit chaining state need about 2^128 queries, so 128 bits is claimed"
    ),
    mac!(
        HmacSha256_128,
        "hmac-sha256-128",
        32,
        16,
        128,
        "HMAC-SHA256 is a PRF; a 128-bit tag is guessed with probability 2^-128"
    ),
    mac!(
        Blake3_128,
        "blake3-128",
        32,
        16,
        128,
        "keyed BLAKE3 is a PRF; a 128-bit tag is guessed with probability 2^-128"
    ),
    mac!(
        GmacAes128,
        "gmac-aes128",
        16,
        16,
        116,
        "GHASH is (l+1)/2^128-almost-xor-universal for l 16-byte blocks; at most 2^12 blocks \
         in a 64 KiB packet gives about 2^-116 per attempt"
    ),
    mac!(
        Umac32,
        "umac-32",
        16,
        4,
        30,
        "RFC 4418 section 6.4: UMAC-32 forgery probability about 2^-30 per attempt"
    ),
    mac!(
        Umac64,
        "umac-64",
        16,
        8,
        60,
        "RFC 4418 section 6.4: UMAC-64 forgery probability about 2^-60 per attempt"
    ),
    mac!(
        Umac96,
        "umac-96",
        16,
        12,
        90,
        "RFC 4418 section 6.4: UMAC-96 forgery probability about 2^-90 per attempt"
    ),
    mac!(
        Umac128,
        "umac-128",
        16,
        16,
        120,
        "RFC 4418 section 6.4: UMAC-128 forgery probability about 2^-120 per attempt"
    ),
    GearInfo {
        id: GearId::IfgExperimental,
        name: "ifg",
        kind: GearKind::Mac,
        key_len: 64,
        tag_len: 8,
        forgery_bits: 30.0,
        covered_forgery_bits: 30.0,
        bound_derivation: "proven part: scattering is a bijection of each word pair, so any \
            change alters at least one bin, whose UHASH-32 collides with probability about \
            2^-30 even if the mask were known; the outer PRF is keyed BLAKE3. Heuristic part \
            (ACSA eq. 3): guessing how t changed bits were scattered, (k/n)^t, is not claimed",
        integrity_limit: integrity_limit_for(30),
        usage_limit: SEQ_SPACE,
        status: GearStatus::Experimental,
        partial_l: None,
    },
    partial!(Partial2, "partial-2", 2, 0.736965594166206),
    partial!(Partial4, "partial-4", 4, 0.362570079384708),
    partial!(Partial8, "partial-8", 8, 0.180572245641821),
    partial!(Partial16, "partial-16", 16, 0.090197808971578),
    partial!(Partial32, "partial-32", 32, 0.045087889528538),
    partial!(Partial64, "partial-64", 64, 0.022542568651088),
    partial!(Partial128, "partial-128", 128, 0.011271112335020),
    partial!(Partial256, "partial-256", 256, 0.005635534669433),
    GearInfo {
        id: GearId::Aes128Gcm,
        name: "aes-128-gcm",
        kind: GearKind::Aead,
        key_len: 16,
        tag_len: 16,
        forgery_bits: 116.0,
        covered_forgery_bits: 116.0,
        bound_derivation: "GCM's authentication is GHASH: about (l+1)/2^128 per attempt for l \
            16-byte blocks, 2^-116 for a 64 KiB packet",
        integrity_limit: integrity_limit_for(116),
        usage_limit: 1 << 23,
        status: GearStatus::Standard,
        partial_l: None,
    },
    GearInfo {
        id: GearId::Aes256Gcm,
        name: "aes-256-gcm",
        kind: GearKind::Aead,
        key_len: 32,
        tag_len: 16,
        forgery_bits: 116.0,
        covered_forgery_bits: 116.0,
        bound_derivation: "as aes-128-gcm: GHASH bounds forgery at about 2^-116 per attempt \
            for a 64 KiB packet",
        integrity_limit: integrity_limit_for(116),
        usage_limit: 1 << 23,
        status: GearStatus::Standard,
        partial_l: None,
    },
    GearInfo {
        id: GearId::ChaCha20Poly1305,
        name: "chacha20-poly1305",
        kind: GearKind::Aead,
        key_len: 32,
        tag_len: 16,
        forgery_bits: 91.0,
        covered_forgery_bits: 91.0,
        bound_derivation: "Poly1305: at most 8*ceil(l/16)/2^106 per attempt for l bytes; \
            2^-91 for a 64 KiB packet",
        integrity_limit: 1 << 36,
        usage_limit: 1 << 62,
        status: GearStatus::Standard,
        partial_l: None,
    },
];

impl GearId {
    /// The gear with wire id `byte`, if cohort knows one.
    pub fn from_u8(byte: u8) -> Option<GearId> {
        ALL_GEARS.iter().find(|g| g.id as u8 == byte).map(|g| g.id)
    }

    /// The gear named `name` (as printed by `cohort gears list`).
    pub fn from_name(name: &str) -> Option<GearId> {
        ALL_GEARS.iter().find(|g| g.name == name).map(|g| g.id)
    }

    /// The wire byte.
    pub const fn to_u8(self) -> u8 {
        self as u8
    }

    /// Everything known about this gear.
    pub fn info(self) -> &'static GearInfo {
        // Every variant has exactly one row; a test checks it.
        ALL_GEARS
            .iter()
            .find(|g| g.id == self)
            .unwrap_or(&ALL_GEARS[0])
    }

    /// The stable name.
    pub fn name(self) -> &'static str {
        self.info().name
    }
}

impl fmt::Display for GearId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of gears, e.g. the gears two peers agreed on. Iterates in wire-id order.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct GearSet([u64; 4]);

impl GearSet {
    /// The empty set.
    pub const fn empty() -> Self {
        GearSet([0; 4])
    }

    /// Every gear except [`GearId::DangerNullForTesting`].
    pub fn all_secure() -> Self {
        ALL_GEARS
            .iter()
            .filter(|g| g.status != GearStatus::Danger)
            .map(|g| g.id)
            .collect()
    }

    /// Adds `gear`.
    pub fn insert(&mut self, gear: GearId) {
        let b = usize::from(gear.to_u8());
        self.0[b / 64] |= 1 << (b % 64);
    }

    /// Removes `gear`.
    pub fn remove(&mut self, gear: GearId) {
        let b = usize::from(gear.to_u8());
        self.0[b / 64] &= !(1 << (b % 64));
    }

    /// Whether `gear` is in the set.
    pub fn contains(&self, gear: GearId) -> bool {
        let b = usize::from(gear.to_u8());
        self.0[b / 64] & (1 << (b % 64)) != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0 == [0; 4]
    }

    /// The gears in the set, in wire-id order.
    pub fn iter(&self) -> impl Iterator<Item = GearId> + '_ {
        ALL_GEARS
            .iter()
            .map(|g| g.id)
            .filter(move |&g| self.contains(g))
    }
}

impl FromIterator<GearId> for GearSet {
    fn from_iter<I: IntoIterator<Item = GearId>>(iter: I) -> Self {
        let mut set = GearSet::empty();
        for g in iter {
            set.insert(g);
        }
        set
    }
}

impl fmt::Debug for GearSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.iter().map(GearId::name))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_is_consistent() {
        let mut seen = GearSet::empty();
        for (i, g) in ALL_GEARS.iter().enumerate() {
            assert!(!seen.contains(g.id), "duplicate id {:?}", g.id);
            seen.insert(g.id);
            assert_eq!(GearId::from_u8(g.id.to_u8()), Some(g.id));
            assert_eq!(GearId::from_name(g.name), Some(g.id));
            assert_eq!(g.id.info(), g, "row {i}");
            if i > 0 {
                assert!(ALL_GEARS[i - 1].id < g.id, "rows must be in wire-id order");
            }
            assert!(g.integrity_limit >= 1);
            assert!(g.forgery_bits <= g.covered_forgery_bits);
            assert!(!g.bound_derivation.is_empty());
        }
        assert_eq!(GearId::from_u8(0xff), None);
        assert_eq!(GearId::from_name("hmac-md5"), None);
    }

    #[test]
    fn partial_bounds_match_the_selection_rate() {
        for g in ALL_GEARS.iter().filter(|g| g.partial_l.is_some()) {
            let p = g.selection_probability().unwrap();
            let bits = -(1.0 - p).log2();
            assert!(
                (bits - g.forgery_bits).abs() < 1e-9,
                "{}: {bits} vs {}",
                g.name,
                g.forgery_bits
            );
            let l = g.partial_l.unwrap();
            assert_eq!(g.name, format!("partial-{l}"));
            assert!((g.escape_probability(3).unwrap() - (1.0 - p).powi(3)).abs() < 1e-12);
        }
    }

    #[test]
    fn gear_set_operations() {
        let mut s = GearSet::empty();
        assert!(s.is_empty());
        s.insert(GearId::Umac32);
        s.insert(GearId::ChaCha20Poly1305);
        assert!(s.contains(GearId::Umac32));
        assert!(!s.contains(GearId::Umac64));
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            vec![GearId::Umac32, GearId::ChaCha20Poly1305]
        );
        s.remove(GearId::Umac32);
        assert!(!s.contains(GearId::Umac32));
        assert!(!GearSet::all_secure().contains(GearId::DangerNullForTesting));
    }
}
