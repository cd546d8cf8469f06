//! The library's fuzz harnesses (`cohort::fuzzing`: the group facade's fragments and
//! state messages) as property tests, plus the seeds and the replay of the committed corpus
//! (`fuzz/corpus/group_facade_frames`, `fuzz/corpus/nats_carriage`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

use cohort::fuzzing;
use cohort::group::frag::{self, Stream};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn arbitrary_fragments_never_panic(data in prop::collection::vec(any::<u8>(), 0..600)) {
        fuzzing::facade_frames(&data);
    }

    #[test]
    fn split_messages_come_back_whole(data in prop::collection::vec(any::<u8>(), 0..3000)) {
        fuzzing::facade_round_trip(&data);
    }
}

/// One harness record: `sender | len | fragment`.
fn record(sender: u8, fragment: &[u8]) -> Vec<u8> {
    let mut v = vec![sender, u8::try_from(fragment.len()).expect("short")];
    v.extend_from_slice(fragment);
    v
}

/// Real fragment sequences: data and state messages split at several payload sizes, from
/// interleaved senders, with a departure in the middle.
fn seeds() -> cohort_sim::corpus::Seeds {
    let mut inputs = Vec::new();
    for (payload, len) in [(20usize, 0usize), (20, 50), (64, 200), (255, 700)] {
        let message: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let fragments = frag::split(Stream::Data, 3, &message, payload).expect("split");
        inputs.push(
            fragments
                .iter()
                .flat_map(|f| record(1, f))
                .collect::<Vec<u8>>(),
        );
        let state = frag::split(Stream::State, 4, &message, payload).expect("split");
        let mut mixed = Vec::new();
        for (a, b) in fragments.iter().zip(state.iter()) {
            mixed.extend(record(2, a));
            mixed.extend(record(3, b));
        }
        mixed.extend(record(0xF3, &[]));
        inputs.push(mixed);
    }
    cohort_sim::corpus::numbered("frames", inputs)
}

#[test]
fn fuzz_corpus_replays() {
    cohort_sim::corpus::check("group_facade_frames", fuzzing::facade_frames, &seeds());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn arbitrary_carriage_never_panics(data in prop::collection::vec(any::<u8>(), 0..64)) {
        fuzzing::nats_carriage(&data);
    }
}

/// Carriage of both address families around short packets, and cut ones.
fn carriage_seeds() -> cohort_sim::corpus::Seeds {
    use cohort::group::carriage;
    let mut inputs = Vec::new();
    for from in ["127.0.0.1:7001", "[2001:db8::1]:4222"] {
        let mut v = Vec::new();
        carriage::encode_prefix(from.parse().unwrap(), &mut v);
        let cut = v.clone();
        v.extend_from_slice(&[0xC0, 1, 2, 3]);
        inputs.push(v);
        inputs.push(cut);
    }
    cohort_sim::corpus::numbered("carriage", inputs)
}

#[test]
fn nats_carriage_corpus_replays() {
    cohort_sim::corpus::check("nats_carriage", fuzzing::nats_carriage, &carriage_seeds());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn arbitrary_bundles_never_panic(data in prop::collection::vec(any::<u8>(), 0..64)) {
        fuzzing::udp_bundle(&data);
    }
}

/// Bundles of two and three packets of the kinds a group sends, a bundle cut short, one
/// with a length past its end, and a plain group packet.
fn bundle_seeds() -> cohort_sim::corpus::Seeds {
    use cohort_net::bundle;
    let mut inputs = Vec::new();
    let packets: [&[u8]; 3] = [&[0x01, 0x01, 0x07, 9, 9, 9], &[0xC1, 5, 5], &[0x01; 40]];
    for n in [2, 3] {
        let mut v = Vec::new();
        bundle::write(&mut v, packets[..n].iter().copied());
        bundle::parse(&v).expect("a seed bundle parses");
        inputs.push(v.clone());
        inputs.push(v[..v.len() - 1].to_vec());
        let mut long = v;
        long[3] = 0xFF;
        inputs.push(long);
    }
    inputs.push(packets[0].to_vec());
    cohort_sim::corpus::numbered("bundle", inputs)
}

#[test]
fn udp_bundle_corpus_replays() {
    cohort_sim::corpus::check("udp_bundle", fuzzing::udp_bundle, &bundle_seeds());
}
