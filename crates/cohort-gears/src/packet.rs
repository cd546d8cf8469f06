//! Protected packets: the wire format, the sender's [`Protector`] and the receiver's
//! [`Unprotector`].
//!
//! ```text
//!  0       1       2 .. 2+n      +8            +2
//! +-------+-------+-------------+-------------+-------------+--------+------+-----------+
//! | ver=1 | ntags | gear id × n | seq (u64 BE)| hdr len (BE)| header | body | tag × n   |
//! +-------+-------+-------------+-------------+-------------+--------+------+-----------+
//! |<------------------------- authenticated by every tag ------------------>|
//! ```
//! * `ntags` is 1 to [`MAX_TAGS`]; the gear ids are distinct and each names its tag's length.
//! * An AEAD gear stands alone (`ntags == 1`): the body is its ciphertext and its tag covers
//!   everything before the body as associated data. The null gear also stands alone.
//! * Partial MACs cover everything before the body in full and chosen body words.
//! * The sequence number is never `u64::MAX`, and a sender never reuses one under a key.
//!
//! Receiving runs the cheap checks first: version, lengths, gear ids, the receiver's policy
//! (accepted gears, floor), the replay window; only then one tag is verified: the one the
//! receiver chooses (ACSA 3.4). A packet that fails anything is dropped and counted; nothing
//! a peer sends can panic.

use crate::gear::{GearId, GearKind, GearSet, MAX_PACKET_LEN};
use crate::keys::GearKey;
use crate::replay::{ReplayError, ReplayWindow};
use cohort_core::wire::{Reader, Writer};
use cohort_crypto::{CryptoError, CryptoProvider};
use std::fmt;
use std::ops::Range;

/// Wire version of the protected packet format.
pub const PACKET_VERSION: u8 = 1;
/// Most tags one packet may carry.
pub const MAX_TAGS: usize = 4;
/// Bytes before the header for a packet with `ntags` tags.
pub const fn prefix_len(ntags: usize) -> usize {
    2 + ntags + 8 + 2
}

/// Keys for a set of gears, all derived from one association secret. Cloning shares them.
#[derive(Clone)]
pub struct GearKeys {
    /// One key per gear of `gears`, in the set's order: a handful at most, so a scan finds
    /// one as fast as an index would, and deriving keys for a new sender allocates only
    /// what it uses (a 256-slot table per sender was most of a group leader's CPU in a
    /// view change at 10,000 members).
    keys: std::sync::Arc<[(GearId, GearKey)]>,
    gears: GearSet,
}

impl fmt::Debug for GearKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GearKeys")
            .field("gears", &self.gears)
            .finish_non_exhaustive()
    }
}

impl GearKeys {
    /// Derives a key for every gear in `gears` from `association_secret` (16 bytes or more).
    pub fn derive(
        provider: &CryptoProvider,
        association_secret: &[u8],
        gears: GearSet,
    ) -> Result<GearKeys, CryptoError> {
        let keys = gears
            .iter()
            .map(|gear| Ok((gear, GearKey::derive(provider, association_secret, gear)?)))
            .collect::<Result<std::sync::Arc<[_]>, CryptoError>>()?;
        Ok(GearKeys { keys, gears })
    }

    /// The gears these keys cover.
    pub fn gears(&self) -> GearSet {
        self.gears
    }

    /// The key for `gear`, if derived.
    pub fn get(&self, gear: GearId) -> Option<&GearKey> {
        self.keys
            .iter()
            .find_map(|(g, key)| (*g == gear).then_some(key))
    }
}

/// Why [`Protector::protect`] refused. These are API misuse or exhausted keys, so detailed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtectError {
    /// No gear was named.
    NoGears,
    /// More than [`MAX_TAGS`] gears.
    TooManyTags,
    /// A gear was named twice.
    DuplicateGear(GearId),
    /// A gear has no key in this protector.
    GearNotInSuite(GearId),
    /// An AEAD or the null gear must be the only gear on a packet.
    MustStandAlone(GearId),
    /// The header is longer than 65535 bytes.
    HeaderTooLong,
    /// The packet would exceed [`MAX_PACKET_LEN`].
    PacketTooLong,
    /// The key reached its usage limit or the sequence space ran out: rekey.
    KeyExhausted(GearId),
    /// A sequence number was used twice or went backwards in [`Protector::protect_with_seq`].
    SequenceReused,
    /// The crypto backend failed.
    Crypto,
}

impl fmt::Display for ProtectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtectError::NoGears => f.write_str("no gear named"),
            ProtectError::TooManyTags => write!(f, "more than {MAX_TAGS} tags"),
            ProtectError::DuplicateGear(g) => write!(f, "gear {g} named twice"),
            ProtectError::GearNotInSuite(g) => write!(f, "gear {g} has no key here"),
            ProtectError::MustStandAlone(g) => write!(f, "gear {g} must be the only tag"),
            ProtectError::HeaderTooLong => f.write_str("header longer than 65535 bytes"),
            ProtectError::PacketTooLong => write!(f, "packet longer than {MAX_PACKET_LEN} bytes"),
            ProtectError::KeyExhausted(g) => write!(f, "key for {g} reached its usage limit"),
            ProtectError::SequenceReused => f.write_str("sequence number reused"),
            ProtectError::Crypto => f.write_str("crypto backend failure"),
        }
    }
}

impl std::error::Error for ProtectError {}

/// The sending side of a one-way association: assigns sequence numbers and writes packets.
///
/// `Clone` only under the `fuzzing` feature (a fuzz harness copies a formed group once per
/// input): a copy would seal under the same keys with the same sequence numbers, so ordinary
/// builds cannot make one.
#[derive(Debug)]
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub struct Protector {
    keys: GearKeys,
    next_seq: u64,
    sent: [u64; 256],
}

impl Protector {
    /// A protector with `keys`, starting at sequence number 0.
    pub fn new(keys: GearKeys) -> Self {
        Protector {
            keys,
            next_seq: 0,
            sent: [0; 256],
        }
    }

    /// The gears this protector can use.
    pub fn gears(&self) -> GearSet {
        self.keys.gears()
    }

    /// The sequence number the next packet will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Appends a packet carrying `header` and `body`, tagged by each of `gears`, to `out`;
    /// returns its sequence number.
    pub fn protect(
        &mut self,
        gears: &[GearId],
        header: &[u8],
        body: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<u64, ProtectError> {
        let seq = self.next_seq;
        self.protect_with_seq(seq, gears, header, body, out)?;
        Ok(seq)
    }

    /// As [`Protector::protect`] with a sequence number the caller manages; it must be larger
    /// than every one used before on this protector.
    pub fn protect_with_seq(
        &mut self,
        seq: u64,
        gears: &[GearId],
        header: &[u8],
        body: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), ProtectError> {
        if seq < self.next_seq || seq == u64::MAX {
            return Err(ProtectError::SequenceReused);
        }
        self.check_gears(gears)?;
        let infos = || gears.iter().map(|g| g.info());
        let header_len = u16::try_from(header.len()).map_err(|_| ProtectError::HeaderTooLong)?;
        let tags_len: usize = infos().map(|i| i.tag_len).sum();
        let total = prefix_len(gears.len()) + header.len() + body.len() + tags_len;
        if total > MAX_PACKET_LEN {
            return Err(ProtectError::PacketTooLong);
        }
        for info in infos() {
            // The limit counts packets protected under this gear's key, not sequence numbers
            // (which every gear of the protector shares).
            if self.sent[usize::from(info.id.to_u8())] >= info.usage_limit {
                return Err(ProtectError::KeyExhausted(info.id));
            }
        }

        let start = out.len();
        out.reserve(total);
        let mut w = Writer::new(out);
        w.u8(PACKET_VERSION).u8(gears.len() as u8);
        for g in gears {
            w.u8(g.to_u8());
        }
        w.u64(seq).u16(header_len).bytes(header);
        let body_start = out.len() - start;
        out.extend_from_slice(body);
        let result = self.write_tags(seq, gears, start, body_start, out);
        if result.is_err() {
            out.truncate(start);
            return result;
        }
        self.next_seq = seq + 1;
        for g in gears {
            self.sent[usize::from(g.to_u8())] += 1;
        }
        Ok(())
    }

    /// Pretends `count` packets were already protected under `gear` (tests of the usage
    /// limit, which cannot send 2^23 packets).
    #[cfg(test)]
    pub(crate) fn set_sent_for_testing(&mut self, gear: GearId, count: u64) {
        self.sent[usize::from(gear.to_u8())] = count;
    }

    /// Checks that `gears` may protect a packet together (no allocation: this runs for
    /// every packet).
    fn check_gears(&self, gears: &[GearId]) -> Result<(), ProtectError> {
        if gears.is_empty() {
            return Err(ProtectError::NoGears);
        }
        if gears.len() > MAX_TAGS {
            return Err(ProtectError::TooManyTags);
        }
        for (i, &g) in gears.iter().enumerate() {
            if gears[..i].contains(&g) {
                return Err(ProtectError::DuplicateGear(g));
            }
            if self.keys.get(g).is_none() {
                return Err(ProtectError::GearNotInSuite(g));
            }
            let info = g.info();
            if info.kind != GearKind::Mac && gears.len() > 1 {
                return Err(ProtectError::MustStandAlone(g));
            }
        }
        Ok(())
    }

    fn write_tags(
        &self,
        seq: u64,
        gears: &[GearId],
        start: usize,
        body_start: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), ProtectError> {
        let key = |g: GearId| self.keys.get(g).ok_or(ProtectError::GearNotInSuite(g));
        if let [single] = gears {
            let k = key(*single)?;
            if k.is_aead() {
                let (aad, body) = out[start..].split_at_mut(body_start);
                let tag = k.seal(seq, aad, body).map_err(|_| ProtectError::Crypto)?;
                out.extend_from_slice(&tag);
                return Ok(());
            }
        }
        let authenticated_end = out.len();
        for &g in gears {
            let k = key(g)?;
            let tag_len = k.info().tag_len;
            let at = out.len();
            out.resize(at + tag_len, 0);
            let (data, tag) = out.split_at_mut(at);
            k.tag(seq, &data[start..authenticated_end], body_start, tag)
                .map_err(|_| ProtectError::Crypto)?;
        }
        Ok(())
    }
}

/// Why a packet was dropped. Each reason has a counter in [`DropCounters`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// Lengths or fields do not parse.
    Malformed,
    /// Unknown wire version.
    BadVersion,
    /// A gear id cohort does not know.
    UnknownGear,
    /// No tag on the packet is one this receiver accepts (not agreed, below its floor, or
    /// retired after too many failures).
    NoAcceptableTag,
    /// Sequence number already accepted.
    Replayed,
    /// Sequence number behind the replay window.
    TooOld,
    /// The chosen tag did not verify (or the AEAD did not open).
    AuthFailed,
}

impl DropReason {
    /// Every reason, for reports.
    pub const ALL: [DropReason; 7] = [
        DropReason::Malformed,
        DropReason::BadVersion,
        DropReason::UnknownGear,
        DropReason::NoAcceptableTag,
        DropReason::Replayed,
        DropReason::TooOld,
        DropReason::AuthFailed,
    ];

    /// A short name for logs.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::Malformed => "malformed",
            DropReason::BadVersion => "bad-version",
            DropReason::UnknownGear => "unknown-gear",
            DropReason::NoAcceptableTag => "no-acceptable-tag",
            DropReason::Replayed => "replayed",
            DropReason::TooOld => "too-old",
            DropReason::AuthFailed => "auth-failed",
        }
    }
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Counts of packets accepted and dropped, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropCounters {
    /// Packets accepted.
    pub accepted: u64,
    /// Dropped: malformed.
    pub malformed: u64,
    /// Dropped: unknown version.
    pub bad_version: u64,
    /// Dropped: unknown gear id.
    pub unknown_gear: u64,
    /// Dropped: no acceptable tag.
    pub no_acceptable_tag: u64,
    /// Dropped: replayed.
    pub replayed: u64,
    /// Dropped: behind the replay window.
    pub too_old: u64,
    /// Dropped: tag did not verify.
    pub auth_failed: u64,
}

impl DropCounters {
    /// The counter for `reason`.
    pub fn get(&self, reason: DropReason) -> u64 {
        match reason {
            DropReason::Malformed => self.malformed,
            DropReason::BadVersion => self.bad_version,
            DropReason::UnknownGear => self.unknown_gear,
            DropReason::NoAcceptableTag => self.no_acceptable_tag,
            DropReason::Replayed => self.replayed,
            DropReason::TooOld => self.too_old,
            DropReason::AuthFailed => self.auth_failed,
        }
    }

    /// All drops together.
    pub fn dropped(&self) -> u64 {
        DropReason::ALL.iter().map(|&r| self.get(r)).sum()
    }

    fn count(&mut self, reason: DropReason) {
        let c = match reason {
            DropReason::Malformed => &mut self.malformed,
            DropReason::BadVersion => &mut self.bad_version,
            DropReason::UnknownGear => &mut self.unknown_gear,
            DropReason::NoAcceptableTag => &mut self.no_acceptable_tag,
            DropReason::Replayed => &mut self.replayed,
            DropReason::TooOld => &mut self.too_old,
            DropReason::AuthFailed => &mut self.auth_failed,
        };
        *c = c.saturating_add(1);
    }
}

/// Which of a packet's tags the receiver verifies (ACSA 3.4: the receiver chooses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TagChoice {
    /// The acceptable tag with the highest forgery bound.
    Strongest,
    /// The acceptable tag that is cheapest to verify (lowest nominal cost).
    Cheapest,
}

/// What a receiver accepts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReceivePolicy {
    /// Gears the receiver agreed to (others are ignored on the packet).
    pub accepted: GearSet,
    /// Minimum [`GearInfo::forgery_bits`](crate::gear::GearInfo::forgery_bits) of the tag the
    /// receiver verifies.
    pub floor_bits: f64,
    /// Which acceptable tag to verify.
    pub choice: TagChoice,
    /// Accept [`GearId::DangerNullForTesting`] (no security at all) when it is in
    /// `accepted`. Off unless set explicitly: for fuzzing, simulation and baselines only.
    pub danger_accept_null_for_testing: bool,
}

impl ReceivePolicy {
    /// Accepts every gear in `accepted` at or above `floor_bits` (never the null gear),
    /// verifying the strongest tag.
    pub fn new(accepted: GearSet, floor_bits: f64) -> Self {
        ReceivePolicy {
            accepted,
            floor_bits,
            choice: TagChoice::Strongest,
            danger_accept_null_for_testing: false,
        }
    }
}

/// A packet that passed every check.
#[derive(Debug, PartialEq, Eq)]
pub struct Opened<'a> {
    /// Its sequence number.
    pub seq: u64,
    /// The gear whose tag was verified.
    pub verified_by: GearId,
    /// Every gear the packet names, in order.
    pub gears: GearList,
    /// The header (authenticated, never encrypted).
    pub header: &'a [u8],
    /// The body (decrypted if the gear is an AEAD).
    pub body: &'a [u8],
}

/// The gear ids a packet names, in order.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct GearList {
    ids: [GearId; MAX_TAGS],
    len: usize,
}

impl fmt::Debug for GearList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.as_slice().iter().map(|g| g.name()))
            .finish()
    }
}

impl GearList {
    /// The ids as a slice.
    pub fn as_slice(&self) -> &[GearId] {
        &self.ids[..self.len]
    }
}

/// The layout of a packet that parsed.
#[derive(Clone, Debug)]
struct Layout {
    gears: GearList,
    seq: u64,
    header: Range<usize>,
    body: Range<usize>,
    /// Tag `i` starts at `tags[i]`.
    tags: [usize; MAX_TAGS],
}

/// Parses the framing of a packet, checking version, lengths and gear ids together.
fn parse(packet: &[u8]) -> Result<Layout, DropReason> {
    if packet.len() > MAX_PACKET_LEN {
        return Err(DropReason::Malformed);
    }
    let mut r = Reader::new(packet);
    let version = r.u8().map_err(|_| DropReason::Malformed)?;
    if version != PACKET_VERSION {
        return Err(DropReason::BadVersion);
    }
    let ntags = usize::from(r.u8().map_err(|_| DropReason::Malformed)?);
    if ntags == 0 || ntags > MAX_TAGS {
        return Err(DropReason::Malformed);
    }
    let mut ids = [GearId::DangerNullForTesting; MAX_TAGS];
    let mut tags_len = 0usize;
    for i in 0..ntags {
        let id = r.u8().map_err(|_| DropReason::Malformed)?;
        let gear = GearId::from_u8(id).ok_or(DropReason::UnknownGear)?;
        if ids[..i].contains(&gear) {
            return Err(DropReason::Malformed);
        }
        let info = gear.info();
        if info.kind != GearKind::Mac && ntags > 1 {
            return Err(DropReason::Malformed);
        }
        ids[i] = gear;
        tags_len += info.tag_len;
    }
    let seq = r.u64().map_err(|_| DropReason::Malformed)?;
    if seq == u64::MAX {
        return Err(DropReason::Malformed);
    }
    let header_len = usize::from(r.u16().map_err(|_| DropReason::Malformed)?);
    let header_start = prefix_len(ntags);
    let body_start = header_start + header_len;
    let tags_start = packet
        .len()
        .checked_sub(tags_len)
        .ok_or(DropReason::Malformed)?;
    if body_start > tags_start {
        return Err(DropReason::Malformed);
    }
    let mut tags = [0usize; MAX_TAGS];
    let mut at = tags_start;
    for (i, gear) in ids[..ntags].iter().enumerate() {
        tags[i] = at;
        at += gear.info().tag_len;
    }
    Ok(Layout {
        gears: GearList { ids, len: ntags },
        seq,
        header: header_start..body_start,
        body: body_start..tags_start,
        tags,
    })
}

/// The receiving side of a one-way association. `Clone` only under the `fuzzing` feature,
/// like [`Protector`].
#[derive(Debug)]
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub struct Unprotector {
    keys: GearKeys,
    policy: ReceivePolicy,
    window: ReplayWindow,
    counters: DropCounters,
    /// Failed verifications by gear id, allocated at the first failure: a 2 KiB table in
    /// every receiver made each one a large allocation (a group leader creates one for every
    /// sender whose first packet of a new view it opens, and each such `malloc` of more than
    /// 1 KiB consolidated glibc's fast bins: about a quarter of the leader's CPU in an lkh
    /// leave at 2,500 members).
    failures: Option<Box<[u64; 256]>>,
    retired: GearSet,
}

impl Unprotector {
    /// A receiver with `keys` and `policy`.
    pub fn new(keys: GearKeys, policy: ReceivePolicy) -> Self {
        Unprotector {
            keys,
            policy,
            window: ReplayWindow::new(),
            counters: DropCounters::default(),
            failures: None,
            retired: GearSet::empty(),
        }
    }

    /// The current policy.
    pub fn policy(&self) -> &ReceivePolicy {
        &self.policy
    }

    /// Replaces the policy (e.g. a new floor, or a cheaper tag choice under load).
    pub fn set_policy(&mut self, policy: ReceivePolicy) {
        self.policy = policy;
    }

    /// Accepted and dropped packets so far.
    pub fn counters(&self) -> &DropCounters {
        &self.counters
    }

    /// Failed verifications under `gear` so far.
    pub fn failures(&self, gear: GearId) -> u64 {
        self.failures
            .as_ref()
            .map_or(0, |f| f[usize::from(gear.to_u8())])
    }

    /// Gears retired because they reached their integrity limit; the association needs a
    /// new key before it can use them again.
    pub fn retired(&self) -> GearSet {
        self.retired
    }

    /// Checks `packet` (decrypting its body in place for an AEAD gear) and returns its
    /// contents, or the reason it was dropped (already counted).
    pub fn unprotect<'a>(&mut self, packet: &'a mut [u8]) -> Result<Opened<'a>, DropReason> {
        let result = self.unprotect_inner(packet);
        match &result {
            Ok(_) => self.counters.accepted += 1,
            Err(reason) => self.counters.count(*reason),
        }
        result
    }

    fn unprotect_inner<'a>(&mut self, packet: &'a mut [u8]) -> Result<Opened<'a>, DropReason> {
        let layout = parse(packet)?;
        let (index, gear) = self
            .choose(&layout.gears)
            .ok_or(DropReason::NoAcceptableTag)?;
        match self.window.check(layout.seq) {
            Ok(()) => {}
            Err(ReplayError::Duplicate) => return Err(DropReason::Replayed),
            Err(ReplayError::TooOld) => return Err(DropReason::TooOld),
        }
        let key = self.keys.get(gear).ok_or(DropReason::NoAcceptableTag)?;
        let ok = if key.is_aead() {
            let (aad, rest) = packet.split_at_mut(layout.body.start);
            key.open(layout.seq, aad, rest).is_ok()
        } else {
            let start = layout.tags[index];
            let tag = &packet[start..start + gear.info().tag_len];
            key.verify(
                layout.seq,
                &packet[..layout.body.end],
                layout.body.start,
                tag,
            )
        };
        if !ok {
            let table = self.failures.get_or_insert_with(|| Box::new([0; 256]));
            let f = &mut table[usize::from(gear.to_u8())];
            *f += 1;
            if *f >= gear.info().integrity_limit {
                self.retired.insert(gear);
            }
            return Err(DropReason::AuthFailed);
        }
        self.window.insert(layout.seq);
        let packet: &'a [u8] = packet;
        Ok(Opened {
            seq: layout.seq,
            verified_by: gear,
            gears: layout.gears,
            header: &packet[layout.header],
            body: &packet[layout.body],
        })
    }

    /// The tag to verify: among the packet's gears that this receiver accepts, has keys for,
    /// has not retired and that meet the floor, the strongest or the cheapest.
    fn choose(&self, gears: &GearList) -> Option<(usize, GearId)> {
        let acceptable = gears.as_slice().iter().enumerate().filter(|(_, &g)| {
            self.policy.accepted.contains(g)
                && (g != GearId::DangerNullForTesting || self.policy.danger_accept_null_for_testing)
                && self.keys.get(g).is_some()
                && !self.retired.contains(g)
                && g.info().forgery_bits >= self.policy.floor_bits
        });
        match self.policy.choice {
            TagChoice::Strongest => acceptable
                .max_by(|a, b| a.1.info().forgery_bits.total_cmp(&b.1.info().forgery_bits)),
            TagChoice::Cheapest => acceptable.min_by_key(|(_, g)| crate::cost::nominal_cost(**g)),
        }
        .map(|(i, &g)| (i, g))
    }
}

/// Reads the sequence number and gear ids of a packet without checking its tags, for
/// logging and for choosing a receiver. Nothing it returns is authenticated.
pub fn peek(packet: &[u8]) -> Result<(u64, GearList), DropReason> {
    parse(packet).map(|l| (l.seq, l.gears))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_limit_counts_packets_under_the_gear_not_sequence_numbers() {
        let set: GearSet = [GearId::Aes128Gcm, GearId::Umac64].into_iter().collect();
        let keys = GearKeys::derive(&CryptoProvider::default_provider(), &[1; 32], set).unwrap();
        let mut tx = Protector::new(keys);
        let limit = GearId::Aes128Gcm.info().usage_limit;
        let mut out = Vec::new();
        // Sequence numbers far past the limit are fine while few packets used the key.
        tx.protect_with_seq(limit + 5, &[GearId::Aes128Gcm], b"", b"", &mut out)
            .unwrap();
        tx.set_sent_for_testing(GearId::Aes128Gcm, limit);
        assert_eq!(
            tx.protect(&[GearId::Aes128Gcm], b"", b"", &mut out),
            Err(ProtectError::KeyExhausted(GearId::Aes128Gcm))
        );
        // Other gears of the same protector go on.
        tx.protect(&[GearId::Umac64], b"", b"", &mut out).unwrap();
    }
}
