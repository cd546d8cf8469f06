//! Fuzz harnesses for what the library itself parses from the network: the group facade's
//! fragments and state-transfer messages (`docs/wire.md`, "Facade framing"). Behind the
//! `fuzzing` feature; the targets in `fuzz/` and this crate's `tests/fuzz_harness.rs` call
//! them.

use crate::group::frag::{self, Reassembler, Stream};
use crate::group::state;
use cohort_group::MemberId;

/// A reassembly limit small enough that the fuzzer reaches it.
const LIMIT: usize = 4096;

/// Arbitrary bytes as the reliable deliveries of a few senders: the input is a sequence of
/// records `sender (u8, mod 4) | len (u8) | len bytes`, each pushed as one fragment from
/// that sender. Reassembly must never panic, never hold more than its limit, and never
/// return a message over it; every state message it completes is decoded (which must not
/// panic either), and a decoded answer must encode back to the same bytes (a failure's
/// reason, read as lossy UTF-8, to bytes that decode the same).
pub fn facade_frames(data: &[u8]) {
    let mut reassembler = Reassembler::new(LIMIT);
    let senders: Vec<MemberId> = (0..4u8).map(|i| MemberId::from_bytes([i; 32])).collect();
    let mut rest = data;
    while let [who, len, tail @ ..] = rest {
        let take = usize::from(*len).min(tail.len());
        let (fragment, next) = tail.split_at(take);
        rest = next;
        let sender = senders[usize::from(*who % 4)];
        if *who >= 0xF0 {
            // Now and then the sender leaves mid-message.
            reassembler.retain(&senders[..3]);
        }
        if let Some((stream, message)) = reassembler.push(sender, fragment) {
            assert!(message.len() <= LIMIT, "a message over the limit");
            if stream == Stream::State {
                if let Some((view, answer)) = state::decode(&message) {
                    let again = state::encode(view, &answer);
                    // A failure's reason is read as lossy UTF-8, so only its decoding is
                    // stable; everything else re-encodes to the very bytes.
                    if !matches!(answer, state::Answer::Failed(_)) {
                        assert_eq!(again, message, "state re-encodes");
                    }
                    assert_eq!(
                        state::decode(&again),
                        Some((view, answer)),
                        "stable decoding"
                    );
                }
            }
        }
        assert!(reassembler.held() <= LIMIT, "held over the limit");
    }
}

/// A message split into fragments and pushed back: the same message comes out, whatever
/// the payload size (the input's first byte picks it).
pub fn facade_round_trip(data: &[u8]) {
    let Some((&size, message)) = data.split_first() else {
        return;
    };
    let payload = usize::from(size).max(frag::HEADER + 1);
    let Some(fragments) = frag::split(Stream::Data, 7, message, payload) else {
        return;
    };
    let mut reassembler = Reassembler::new(frag::MAX_MESSAGE);
    let sender = MemberId::from_bytes([9; 32]);
    let mut out = None;
    for (i, f) in fragments.iter().enumerate() {
        assert!(f.len() <= payload, "a fragment over the payload size");
        let got = reassembler.push(sender, f);
        assert_eq!(
            got.is_some(),
            i + 1 == fragments.len(),
            "completed early or late"
        );
        out = got;
    }
    assert_eq!(out, Some((Stream::Data, message.to_vec())));
}

/// Arbitrary bytes as a message on a group's NATS subjects (`docs/wire.md`, "NATS
/// carriage"): parsing must never panic; what parses re-encodes to the same prefix, and the
/// packet is the rest of the input.
pub fn nats_carriage(data: &[u8]) {
    use crate::group::carriage;
    if let Ok((from, packet)) = carriage::parse(data) {
        let mut prefix = Vec::new();
        carriage::encode_prefix(from, &mut prefix);
        assert_eq!(&data[..prefix.len()], &prefix[..], "the prefix re-encodes");
        assert_eq!(&data[prefix.len()..], packet, "the packet is the rest");
        assert!(!packet.is_empty(), "an empty packet parsed");
    }
}

/// Arbitrary bytes as a received UDP datagram that may be a bundle (`docs/wire.md`, "UDP
/// bundles"): parsing must never panic; a bundle that parses has at least two non-empty
/// packets, none a bundle, and re-encodes to the same bytes.
pub fn udp_bundle(data: &[u8]) {
    cohort_net::bundle::fuzz_parse(data);
}
