//! Stream records (tcpcrypt slide 29, with ACSA's gears).
//!
//! ```text
//!   frame:  type u8 | length u16 | gear u8 | body | tag
//!   MAC input / AEAD associated data:  seq u64 (implicit, never sent) | type | length | gear
//! ```
//!
//! Each direction counts records from 0 under each key; the count is the implicit sequence
//! number, so a replayed, dropped, reordered or modified record fails its tag. The sender
//! may change gear on any record, among the gears negotiated in the handshake (their list is
//! in the transcript); the receiver refuses gears outside that set or below its floor.
//! Before any gear's usage limit, the sender sends a KeyUpdate record and both ends move to
//! the next record secret (an HKDF step; the old one is erased), restarting the count, so
//! a nonce never repeats or wraps.

use crate::messages::{FrameType, FRAME_HEADER_LEN};
use crate::schedule::next_record_secret;
use cohort_crypto::{CryptoError, CryptoProvider, Secret};
use cohort_gears::{GearId, GearKey, GearKind, GearSet};

/// The largest plaintext in one record.
pub const MAX_RECORD_PLAINTEXT: usize = 16 * 1024;
/// Bytes of the implicit sequence number in front of the header.
const SEQ_LEN: usize = 8;
/// Record header bytes after the frame header: the gear id.
const GEAR_LEN: usize = 1;

/// Why a record was refused or could not be sent. On a stream every one of these is fatal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordError {
    /// The record names a gear outside the negotiated set or below the floor.
    GearNotAllowed(u8),
    /// The tag did not verify (modified, replayed, reordered, or dropped records).
    BadTag,
    /// Shorter than its gear's tag.
    Truncated,
    /// The plaintext is longer than [`MAX_RECORD_PLAINTEXT`].
    TooLong,
    /// The keys are used up: the key-update counter (after 2^32 updates), or a peer that
    /// went on past a gear's usage limit without a key update.
    Exhausted,
    /// The crypto provider failed.
    Crypto,
}

impl From<CryptoError> for RecordError {
    fn from(_: CryptoError) -> Self {
        RecordError::Crypto
    }
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordError::GearNotAllowed(g) => write!(f, "record gear {g:#04x} not allowed"),
            RecordError::BadTag => f.write_str("record failed authentication"),
            RecordError::Truncated => f.write_str("record shorter than its tag"),
            RecordError::TooLong => f.write_str("record plaintext too long"),
            RecordError::Exhausted => f.write_str("record keys exhausted"),
            RecordError::Crypto => f.write_str("crypto provider failed"),
        }
    }
}

impl std::error::Error for RecordError {}

/// One direction's keys: the current record secret, the gear keys derived from it so far
/// (each gear's key is derived on its first use), and the count.
struct DirectionKeys {
    provider: CryptoProvider,
    secret: Secret,
    keys: Vec<(GearId, GearKey)>,
    gears: GearSet,
    seq: u64,
    epoch: u32,
    update_after: u64,
    /// The protocol's own limit, whatever either end configured: no data record at or past
    /// this count, and not even a KeyUpdate past it (the tightest usage limit among the
    /// negotiated gears, less two).
    last_data_seq: u64,
}

impl DirectionKeys {
    fn new(
        provider: CryptoProvider,
        secret: Secret,
        gears: GearSet,
        first: GearId,
        update_after: u64,
    ) -> Result<Self, RecordError> {
        // Update before the tightest usage limit among the negotiated gears.
        let limit = gears
            .iter()
            .map(|g| g.info().usage_limit)
            .min()
            .unwrap_or(u64::MAX);
        let mut dir = DirectionKeys {
            provider,
            secret,
            keys: Vec::new(),
            gears,
            seq: 0,
            epoch: 0,
            update_after: update_after.min(limit.saturating_sub(1)).max(2),
            last_data_seq: limit.saturating_sub(2).max(1),
        };
        dir.key(first)?;
        Ok(dir)
    }

    /// The key for `gear` (a negotiated gear), derived now if this is its first use.
    fn key(&mut self, gear: GearId) -> Result<&GearKey, RecordError> {
        if !self.gears.contains(gear) {
            return Err(RecordError::GearNotAllowed(gear.to_u8()));
        }
        let at = match self.keys.iter().position(|(g, _)| *g == gear) {
            Some(at) => at,
            None => {
                let key = GearKey::derive(&self.provider, self.secret.expose(), gear)?;
                self.keys.push((gear, key));
                self.keys.len() - 1
            }
        };
        Ok(&self.keys[at].1)
    }

    fn rotate(&mut self) -> Result<(), RecordError> {
        self.epoch = self.epoch.checked_add(1).ok_or(RecordError::Exhausted)?;
        let next = next_record_secret(&self.provider, &self.secret)?;
        self.keys.clear(); // old gear keys are zeroized on drop
        self.secret = next; // and so is the old secret
        self.seq = 0;
        Ok(())
    }
}

/// Seals outgoing records for one direction.
pub struct RecordSender {
    dir: DirectionKeys,
    gear: GearId,
    scratch: Vec<u8>,
}

impl std::fmt::Debug for RecordSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordSender")
            .field("gear", &self.gear)
            .field("seq", &self.dir.seq)
            .field("epoch", &self.dir.epoch)
            .finish_non_exhaustive()
    }
}

impl RecordSender {
    /// A sender starting at `gear` (which must be in `gears`), updating keys after
    /// `update_after` records (or sooner if a gear's usage limit is lower).
    pub fn new(
        provider: CryptoProvider,
        secret: Secret,
        gears: GearSet,
        gear: GearId,
        update_after: u64,
    ) -> Result<Self, RecordError> {
        if !gears.contains(gear) {
            return Err(RecordError::GearNotAllowed(gear.to_u8()));
        }
        Ok(RecordSender {
            dir: DirectionKeys::new(provider, secret, gears, gear, update_after)?,
            gear,
            scratch: Vec::new(),
        })
    }

    /// The gear the next record uses.
    pub fn gear(&self) -> GearId {
        self.gear
    }

    /// Switches gear; only negotiated gears are allowed.
    pub fn set_gear(&mut self, gear: GearId) -> Result<(), RecordError> {
        if !self.dir.gears.contains(gear) {
            return Err(RecordError::GearNotAllowed(gear.to_u8()));
        }
        self.gear = gear;
        Ok(())
    }

    /// How many key updates this direction has made.
    pub fn epoch(&self) -> u32 {
        self.dir.epoch
    }

    /// Appends one record of type `ty` carrying `plaintext` to `out`, preceded by a
    /// KeyUpdate record when the current keys are due for one.
    pub fn seal(
        &mut self,
        ty: FrameType,
        plaintext: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        if plaintext.len() > MAX_RECORD_PLAINTEXT {
            return Err(RecordError::TooLong);
        }
        if self.dir.seq + 1 >= self.dir.update_after {
            self.seal_one(FrameType::KeyUpdate, &[], out)?;
            self.dir.rotate()?;
        }
        self.seal_one(ty, plaintext, out)
    }

    fn seal_one(
        &mut self,
        ty: FrameType,
        plaintext: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        let seq = self.dir.seq;
        let key = self.dir.key(self.gear)?;
        let info = key.info();
        let tag_len = if info.kind == GearKind::Aead {
            16
        } else {
            info.tag_len
        };
        let frame_len = GEAR_LEN + plaintext.len() + tag_len;
        let len = u16::try_from(frame_len).map_err(|_| RecordError::TooLong)?;
        let header = [ty as u8, (len >> 8) as u8, len as u8, self.gear.to_u8()];
        let mut prefix = [0u8; SEQ_LEN + FRAME_HEADER_LEN + GEAR_LEN];
        prefix[..SEQ_LEN].copy_from_slice(&seq.to_be_bytes());
        prefix[SEQ_LEN..].copy_from_slice(&header);

        let start = out.len();
        out.extend_from_slice(&header);
        out.extend_from_slice(plaintext);
        if key.is_aead() {
            let body = &mut out[start + header.len()..];
            let tag = key.seal(seq, &prefix, body)?;
            out.extend_from_slice(&tag);
        } else {
            // MAC gears tag the contiguous bytes seq | header | body.
            self.scratch.clear();
            self.scratch.extend_from_slice(&prefix);
            self.scratch.extend_from_slice(plaintext);
            let mut tag = [0u8; 32];
            let tag = &mut tag[..tag_len];
            key.tag(seq, &self.scratch, prefix.len(), tag)?;
            out.extend_from_slice(tag);
        }
        self.dir.seq += 1;
        Ok(())
    }
}

/// Opens incoming records for one direction.
pub struct RecordReceiver {
    dir: DirectionKeys,
    floor_bits: f64,
    scratch: Vec<u8>,
}

impl std::fmt::Debug for RecordReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordReceiver")
            .field("seq", &self.dir.seq)
            .field("epoch", &self.dir.epoch)
            .finish_non_exhaustive()
    }
}

impl RecordReceiver {
    /// A receiver accepting `gears` at or above `floor_bits`; the key for `expected`, the
    /// gear the peer is expected to start with, is derived at once, the others on first use.
    pub fn new(
        provider: CryptoProvider,
        secret: Secret,
        gears: GearSet,
        expected: GearId,
        floor_bits: f64,
        update_after: u64,
    ) -> Result<Self, RecordError> {
        Ok(RecordReceiver {
            dir: DirectionKeys::new(provider, secret, gears, expected, update_after)?,
            floor_bits,
            scratch: Vec::new(),
        })
    }

    /// How many key updates the peer has made.
    pub fn epoch(&self) -> u32 {
        self.dir.epoch
    }

    /// Checks and opens the record `frame` (header included), decrypting in place; returns
    /// its type, its gear and the plaintext's range within `frame`. A KeyUpdate record moves
    /// this receiver to the next keys.
    pub fn open(
        &mut self,
        frame: &mut [u8],
    ) -> Result<(FrameType, GearId, std::ops::Range<usize>), RecordError> {
        let (header, rest) = frame
            .split_at_mut_checked(FRAME_HEADER_LEN + GEAR_LEN)
            .ok_or(RecordError::Truncated)?;
        let ty = FrameType::from_u8(header[0])
            .filter(|t| t.is_record())
            .ok_or(RecordError::Truncated)?;
        let gear_byte = header[3];
        let gear = GearId::from_u8(gear_byte)
            .filter(|g| g.info().forgery_bits >= self.floor_bits)
            .ok_or(RecordError::GearNotAllowed(gear_byte))?;
        let seq = self.dir.seq;
        // A peer that skips its key update would push a gear past its usage limit.
        if seq > self.dir.last_data_seq
            || (seq == self.dir.last_data_seq && ty != FrameType::KeyUpdate)
        {
            return Err(RecordError::Exhausted);
        }
        let key = self.dir.key(gear)?;
        let mut prefix = [0u8; SEQ_LEN + FRAME_HEADER_LEN + GEAR_LEN];
        prefix[..SEQ_LEN].copy_from_slice(&seq.to_be_bytes());
        prefix[SEQ_LEN..].copy_from_slice(header);
        let body_start = FRAME_HEADER_LEN + GEAR_LEN;
        let plain_len = if key.is_aead() {
            let plain = key
                .open(seq, &prefix, rest)
                .map_err(|_| RecordError::BadTag)?;
            plain.len()
        } else {
            let tag_len = key.info().tag_len;
            let body_len = rest
                .len()
                .checked_sub(tag_len)
                .ok_or(RecordError::Truncated)?;
            let (body, tag) = rest.split_at(body_len);
            self.scratch.clear();
            self.scratch.extend_from_slice(&prefix);
            self.scratch.extend_from_slice(body);
            if !key.verify(seq, &self.scratch, prefix.len(), tag) {
                return Err(RecordError::BadTag);
            }
            body_len
        };
        self.dir.seq += 1;
        if ty == FrameType::KeyUpdate {
            self.dir.rotate()?;
        }
        Ok((ty, gear, body_start..body_start + plain_len))
    }
}

/// Copies for the fuzz harnesses only (`Connection::fork`). The gear keys are derived
/// again from the direction's current secret (they are always derived from it, and a
/// `GearKey` holds provider key objects that cannot be copied); `None` if that fails.
#[cfg(feature = "fuzzing")]
impl DirectionKeys {
    fn fork(&self) -> Option<DirectionKeys> {
        let keys = self
            .keys
            .iter()
            .map(|(g, _)| {
                Some((
                    *g,
                    GearKey::derive(&self.provider, self.secret.expose(), *g).ok()?,
                ))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(DirectionKeys {
            provider: self.provider,
            secret: self.secret.clone(),
            keys,
            gears: self.gears,
            seq: self.seq,
            epoch: self.epoch,
            update_after: self.update_after,
            last_data_seq: self.last_data_seq,
        })
    }
}

#[cfg(feature = "fuzzing")]
impl RecordSender {
    /// A copy in the same state (same keys, same next sequence number): for the fuzz
    /// harnesses only (`fuzzing` feature).
    pub fn fork(&self) -> Option<RecordSender> {
        Some(RecordSender {
            dir: self.dir.fork()?,
            gear: self.gear,
            scratch: self.scratch.clone(),
        })
    }
}

#[cfg(feature = "fuzzing")]
impl RecordReceiver {
    /// A copy in the same state: for the fuzz harnesses only (`fuzzing` feature).
    pub fn fork(&self) -> Option<RecordReceiver> {
        Some(RecordReceiver {
            dir: self.dir.fork()?,
            floor_bits: self.floor_bits,
            scratch: self.scratch.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // reason: tests fail loudly on unexpected errors
    use super::*;

    fn pair(gears: &[GearId], update_after: u64) -> (RecordSender, RecordReceiver) {
        let p = CryptoProvider::default_provider();
        let set: GearSet = gears.iter().copied().collect();
        let s = RecordSender::new(p, Secret::from_slice(&[3; 32]), set, gears[0], update_after)
            .unwrap();
        let r = RecordReceiver::new(
            p,
            Secret::from_slice(&[3; 32]),
            set,
            gears[0],
            0.0,
            update_after,
        )
        .unwrap();
        (s, r)
    }

    fn open_all(r: &mut RecordReceiver, mut wire: Vec<u8>) -> Result<Vec<Vec<u8>>, RecordError> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < wire.len() {
            let (_, len) = crate::messages::peek_frame(&wire[at..]).unwrap();
            let (ty, _, range) = r.open(&mut wire[at..at + len])?;
            if ty == FrameType::Data {
                out.push(wire[at + range.start..at + range.end].to_vec());
            }
            at += len;
        }
        Ok(out)
    }

    #[test]
    fn every_gear_kind_round_trips_and_shifts_mid_stream() {
        let gears = [
            GearId::Aes128Gcm,
            GearId::ChaCha20Poly1305,
            GearId::Umac64,
            GearId::HmacSha256_128,
            GearId::Partial16,
        ];
        let (mut s, mut r) = pair(&gears, u64::MAX);
        let mut wire = Vec::new();
        for (i, g) in gears.iter().enumerate() {
            s.set_gear(*g).unwrap();
            s.seal(FrameType::Data, &vec![i as u8; 1000 + i], &mut wire)
                .unwrap();
        }
        let got = open_all(&mut r, wire).unwrap();
        assert_eq!(got.len(), gears.len());
        for (i, p) in got.iter().enumerate() {
            assert_eq!(p, &vec![i as u8; 1000 + i]);
        }
    }

    #[test]
    fn aead_records_hide_the_plaintext_and_mac_records_do_not() {
        let (mut s, _) = pair(&[GearId::Aes128Gcm, GearId::Umac64], u64::MAX);
        let secret = b"the plaintext that must not appear";
        let mut wire = Vec::new();
        s.seal(FrameType::Data, secret, &mut wire).unwrap();
        assert!(!wire.windows(secret.len()).any(|w| w == secret));
        s.set_gear(GearId::Umac64).unwrap();
        wire.clear();
        s.seal(FrameType::Data, secret, &mut wire).unwrap();
        assert!(wire.windows(secret.len()).any(|w| w == secret));
    }

    #[test]
    fn replayed_reordered_dropped_and_modified_records_fail() {
        for gear in [GearId::Aes128Gcm, GearId::Umac64] {
            let (mut s, _) = pair(&[gear], u64::MAX);
            let mut a = Vec::new();
            let mut b = Vec::new();
            s.seal(FrameType::Data, b"first", &mut a).unwrap();
            s.seal(FrameType::Data, b"second", &mut b).unwrap();
            let fresh = || pair(&[gear], u64::MAX).1;
            // Replay: a twice.
            let mut r = fresh();
            assert!(open_all(&mut r, [a.clone(), a.clone()].concat()).is_err());
            // Reorder and drop: b first.
            let mut r = fresh();
            assert_eq!(open_all(&mut r, b.clone()), Err(RecordError::BadTag));
            // Every bit of a.
            for bit in 0..a.len() * 8 {
                let mut bad = a.clone();
                bad[bit / 8] ^= 1 << (bit % 8);
                let mut r = fresh();
                let ok = match crate::messages::peek_frame(&bad) {
                    Some((_, len)) if len == bad.len() => r.open(&mut bad).is_ok(),
                    _ => false,
                };
                assert!(!ok, "{gear}: bit {bit} flipped was accepted");
            }
            let mut r = fresh();
            assert_eq!(open_all(&mut r, [a, b].concat()).unwrap().len(), 2);
        }
    }

    #[test]
    fn gears_outside_the_set_or_below_the_floor_are_refused() {
        let p = CryptoProvider::default_provider();
        let (mut s, _) = pair(&[GearId::Umac32, GearId::Aes128Gcm], u64::MAX);
        s.set_gear(GearId::Umac32).unwrap();
        assert!(s.set_gear(GearId::Aes256Gcm).is_err());
        let mut wire = Vec::new();
        s.seal(FrameType::Data, b"x", &mut wire).unwrap();
        let set: GearSet = [GearId::Umac32, GearId::Aes128Gcm].into_iter().collect();
        let mut strict = RecordReceiver::new(
            p,
            Secret::from_slice(&[3; 32]),
            set,
            GearId::Aes128Gcm,
            64.0,
            u64::MAX,
        )
        .unwrap();
        assert_eq!(
            strict.open(&mut wire),
            Err(RecordError::GearNotAllowed(GearId::Umac32.to_u8()))
        );
    }

    #[test]
    fn a_peer_that_skips_its_key_update_is_refused_at_the_usage_limit() {
        let (mut s, mut r) = pair(&[GearId::Aes128Gcm], u64::MAX);
        let limit = GearId::Aes128Gcm.info().usage_limit;
        // Jump both ends to just below the limit (reaching it for real takes 2^23 records).
        s.dir.seq = limit - 3;
        r.dir.seq = limit - 3;
        s.dir.update_after = u64::MAX; // a misbehaving sender that never updates
        let mut wire = Vec::new();
        s.seal(FrameType::Data, b"last allowed", &mut wire).unwrap();
        s.seal(FrameType::Data, b"one too many", &mut wire).unwrap();
        let (_, first) = crate::messages::peek_frame(&wire).unwrap();
        let (head, tail) = wire.split_at_mut(first);
        assert!(r.open(head).is_ok());
        assert_eq!(r.open(tail), Err(RecordError::Exhausted));
    }

    #[test]
    fn keys_update_before_the_limit_and_old_keys_stop_working() {
        let (mut s, mut r) = pair(&[GearId::Aes128Gcm], 4);
        let mut wire = Vec::new();
        for i in 0..10u8 {
            s.seal(FrameType::Data, &[i], &mut wire).unwrap();
        }
        assert!(s.epoch() >= 3, "epoch {}", s.epoch());
        let got = open_all(&mut r, wire).unwrap();
        assert_eq!(got, (0..10u8).map(|i| vec![i]).collect::<Vec<_>>());
        assert_eq!(r.epoch(), s.epoch());
        // A receiver that never saw the updates cannot read a record sealed after them.
        let mut late = Vec::new();
        s.seal(FrameType::Data, b"after", &mut late).unwrap();
        let (_, mut stale) = pair(&[GearId::Aes128Gcm], 4);
        assert_eq!(stale.open(&mut late), Err(RecordError::BadTag));
    }
}
