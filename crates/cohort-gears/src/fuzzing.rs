//! Harnesses shared by the fuzz targets (`fuzz/`) and the property tests: one function per
//! parser, taking arbitrary bytes. They must never panic; the tests assert what they return.

use crate::{GearId, GearKeys, GearSet, Protector, ReceivePolicy, Unprotector, ALL_GEARS};
use cohort_crypto::CryptoProvider;
use std::sync::OnceLock;

const FUZZ_SECRET: [u8; 32] = [0x5a; 32];

fn all_keys() -> &'static GearKeys {
    static KEYS: OnceLock<GearKeys> = OnceLock::new();
    KEYS.get_or_init(|| {
        let all: GearSet = ALL_GEARS.iter().map(|g| g.id).collect();
        // Deriving fixed keys cannot fail with the default provider; a failure here is a bug
        // the fuzzer should report loudly.
        #[allow(clippy::expect_used)] // reason: see above; this is test tooling
        GearKeys::derive(&CryptoProvider::default_provider(), &FUZZ_SECRET, all)
            .expect("derive fuzzing keys")
    })
}

/// Feeds `data` to a receiver that accepts every gear, including the null gear (so the
/// fuzzer can reach past the tags). Returns whether the packet was accepted.
pub fn unprotect_arbitrary(data: &[u8]) -> bool {
    let all: GearSet = ALL_GEARS.iter().map(|g| g.id).collect();
    let policy = ReceivePolicy {
        danger_accept_null_for_testing: true,
        ..ReceivePolicy::new(all, 0.0)
    };
    let mut rx = Unprotector::new(all_keys().clone(), policy);
    let mut packet = data.to_vec();
    let accepted = rx.unprotect(&mut packet).is_ok();
    assert_eq!(rx.counters().accepted + rx.counters().dropped(), 1);
    accepted
}

/// Feeds `data` to the feedback parser of [`crate::link`]; returns whether it parsed. A
/// report that parses is exactly as long as its count byte says, and its retired gears are
/// the ids it lists.
pub fn parse_feedback_arbitrary(data: &[u8]) -> bool {
    match crate::link::parse_feedback(data) {
        Some(report) => {
            assert!((0.0..=1.0).contains(&report.load));
            assert_eq!(data.len(), 19 + usize::from(data[18]));
            let listed: GearSet = data[19..]
                .iter()
                .filter_map(|&b| GearId::from_u8(b))
                .collect();
            assert_eq!(report.retired, listed);
            true
        }
        None => false,
    }
}

/// Uses `data` to pick gears, header, body and one bit to flip; protects, flips, and
/// unprotects. Returns what happened, or `None` when `data` did not describe a protectable
/// packet. A flipped packet must be refused unless [`FlipOutcome::acceptance_allowed`].
pub fn flip_one_bit(data: &[u8]) -> Option<FlipOutcome> {
    let (&choice, rest) = data.split_first()?;
    let (&split, rest) = rest.split_first()?;
    let (flip, payload) = rest.split_at_checked(2)?;
    let gear = ALL_GEARS[usize::from(choice) % ALL_GEARS.len()].id;
    let header_len = usize::from(split).min(payload.len());
    let (header, body) = payload.split_at(header_len);
    let set: GearSet = [gear].into_iter().collect();
    let mut tx = Protector::new(all_keys().clone());
    let mut packet = Vec::new();
    tx.protect(&[gear], header, body, &mut packet).ok()?;
    let bit = usize::from(u16::from_le_bytes([flip[0], flip[1]])) % (packet.len() * 8);
    packet[bit / 8] ^= 1 << (bit % 8);
    let body_start = crate::prefix_len(1) + header.len();
    let policy = ReceivePolicy {
        danger_accept_null_for_testing: true,
        ..ReceivePolicy::new(set, 0.0)
    };
    let mut rx = Unprotector::new(all_keys().clone(), policy);
    let accepted = rx.unprotect(&mut packet).is_ok();
    Some(FlipOutcome {
        gear,
        bit,
        body: body_start..body_start + body.len(),
        accepted,
    })
}

/// What [`flip_one_bit`] did.
#[derive(Clone, Debug)]
pub struct FlipOutcome {
    /// The gear the packet was protected with.
    pub gear: GearId,
    /// The flipped bit (byte `bit / 8`, bit `bit % 8`).
    pub bit: usize,
    /// Where the body lies in the packet, in bytes.
    pub body: std::ops::Range<usize>,
    /// Whether the receiver accepted the flipped packet.
    pub accepted: bool,
}

impl FlipOutcome {
    /// Whether accepting the flip is allowed: only under the null gear, or a partial MAC
    /// when the bit lies in the body (a word the walk did not choose).
    pub fn acceptance_allowed(&self) -> bool {
        self.gear == GearId::DangerNullForTesting
            || (self.gear.info().partial_l.is_some() && self.body.contains(&(self.bit / 8)))
    }
}

/// [`flip_one_bit`] with the property the fuzz target checks: a flipped packet is refused
/// unless [`FlipOutcome::acceptance_allowed`]. Panics on a finding.
pub fn flip_one_bit_checked(data: &[u8]) {
    if let Some(outcome) = flip_one_bit(data) {
        assert!(
            !outcome.accepted || outcome.acceptance_allowed(),
            "{}: flipped bit {} accepted",
            outcome.gear,
            outcome.bit
        );
    }
}

/// Real packets under the harness keys, for the `unprotect` corpus: one per gear (a header
/// and a body), one with two tags, and one with an empty body. Each is named after its
/// gears.
pub fn sample_packets() -> Vec<(String, Vec<u8>)> {
    let mut tx = Protector::new(all_keys().clone());
    let mut out = Vec::new();
    let mut plans: Vec<Vec<GearId>> = ALL_GEARS.iter().map(|g| vec![g.id]).collect();
    if let [a, b, ..] = ALL_GEARS {
        plans.push(vec![a.id, b.id]);
    }
    for (i, gears) in plans.iter().enumerate() {
        let body: &[u8] = if i == 0 {
            b""
        } else {
            b"a body long enough to span several words of every MAC"
        };
        let mut packet = Vec::new();
        if tx.protect(gears, b"hdr", body, &mut packet).is_ok() {
            let names: Vec<String> = gears.iter().map(|g| g.to_string()).collect();
            out.push((names.join("+"), packet));
        }
    }
    out
}

/// Inputs for [`flip_one_bit`]: for every gear, a header and a body, with the flipped bit
/// in the header, the tag and the body. Named after the gear and the bit.
pub fn sample_flips() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (i, g) in ALL_GEARS.iter().enumerate() {
        for bit in [3u16, 40, 400] {
            let mut data = vec![i as u8, 5];
            data.extend_from_slice(&bit.to_le_bytes());
            data.extend_from_slice(b"head:a body that a partial MAC may or may not cover");
            out.push((format!("{}-bit{bit}", g.id), data));
        }
    }
    out
}

/// Feedback bodies as a link sends them (see `docs/wire.md`): no retired gear, and two.
pub fn sample_feedback() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (name, load, retired) in [("idle", 0u16, vec![]), ("loaded", 875, vec![0usize, 1])] {
        let mut body = Vec::new();
        body.extend_from_slice(&load.to_be_bytes());
        body.extend_from_slice(&3u64.to_be_bytes());
        body.extend_from_slice(&1u64.to_be_bytes());
        body.push(retired.len() as u8);
        body.extend(
            retired
                .iter()
                .filter_map(|&i| ALL_GEARS.get(i))
                .map(|g| g.id.to_u8()),
        );
        out.push((name.to_owned(), body));
    }
    out
}
