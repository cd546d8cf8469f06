//! The fuzz targets' harnesses (`cohort_gears::fuzzing`) as property tests, so they run in
//! every `cargo test` and cannot rot.
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

use cohort_gears::fuzzing::{flip_one_bit, unprotect_arbitrary};
use cohort_gears::{GearId, ALL_GEARS, PACKET_VERSION};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Arbitrary bytes never panic and are never accepted under a secure gear.
    #[test]
    fn arbitrary_bytes_are_dropped_without_panic(data in prop::collection::vec(any::<u8>(), 0..300)) {
        let accepted = unprotect_arbitrary(&data);
        if accepted {
            // Only the null gear can accept bytes nobody tagged.
            prop_assert_eq!(data.get(2).copied(), Some(GearId::DangerNullForTesting.to_u8()));
        }
    }

    /// Bytes that start like a real packet (version, tag count, known gear ids) reach the
    /// deeper checks; still no panic, and no secure gear accepts them.
    #[test]
    fn plausible_framing_reaches_the_tag_check(
        ntags in 1u8..=4,
        gears in prop::collection::vec(0usize..ALL_GEARS.len(), 4),
        rest in prop::collection::vec(any::<u8>(), 0..200),
    ) {
        let mut data = vec![PACKET_VERSION, ntags];
        data.extend(gears.iter().take(usize::from(ntags)).map(|&i| ALL_GEARS[i].id.to_u8()));
        data.extend_from_slice(&rest);
        let accepted = unprotect_arbitrary(&data);
        if accepted {
            prop_assert_eq!(ntags, 1);
            prop_assert_eq!(data[2], GearId::DangerNullForTesting.to_u8());
        }
    }

    /// One flipped bit is refused by every secure gear (partial MACs may miss body bits).
    #[test]
    fn one_flipped_bit_is_refused(data in prop::collection::vec(any::<u8>(), 4..400)) {
        if let Some(outcome) = flip_one_bit(&data) {
            prop_assert!(
                !outcome.accepted || outcome.acceptance_allowed(),
                "{} accepted a flip of bit {}", outcome.gear, outcome.bit
            );
        }
    }
}

proptest! {
    /// The feedback parser never panics; well-formed reports parse.
    #[test]
    fn feedback_parser_never_panics(data in prop::collection::vec(any::<u8>(), 0..64)) {
        let _ = cohort_gears::fuzzing::parse_feedback_arbitrary(&data);
    }

    #[test]
    fn well_formed_feedback_parses(load in 0u16..=1000, fails: u64, replays: u64,
                                   retired in prop::collection::vec(0usize..ALL_GEARS.len(), 0..5)) {
        let mut body = Vec::new();
        body.extend_from_slice(&load.to_be_bytes());
        body.extend_from_slice(&fails.to_be_bytes());
        body.extend_from_slice(&replays.to_be_bytes());
        body.push(retired.len() as u8);
        body.extend(retired.iter().map(|&i| ALL_GEARS[i].id.to_u8()));
        let report = cohort_gears::link::parse_feedback(&body).unwrap();
        prop_assert_eq!(report.auth_failures, fails);
        prop_assert_eq!(report.replayed, replays);
        for &i in &retired {
            prop_assert!(report.retired.contains(ALL_GEARS[i].id));
        }
        prop_assert!(cohort_gears::fuzzing::parse_feedback_arbitrary(&body));
        body.push(0);
        prop_assert!(cohort_gears::link::parse_feedback(&body).is_none());
    }
}

// ---- the fuzz corpus (fuzz/corpus/<target>) -------------------------------------------------

/// A fuzz target: its name, the harness it calls, its seeds.
type CorpusTarget = (&'static str, fn(&[u8]), cohort_sim::corpus::Seeds);

/// The gears crate's fuzz targets, each with the harness its `fuzz/fuzz_targets` file calls,
/// and the seeds built from real packets.
fn corpus_targets() -> [CorpusTarget; 3] {
    use cohort_gears::fuzzing::*;
    [
        (
            "unprotect",
            |d| {
                let _ = unprotect_arbitrary(d);
            },
            sample_packets(),
        ),
        (
            "feedback",
            |d| {
                let _ = parse_feedback_arbitrary(d);
            },
            sample_feedback(),
        ),
        ("flip_one_bit", flip_one_bit_checked, sample_flips()),
    ]
}

/// Every input in the corpus runs through its harness as the fuzzer ran it; the seeds are
/// real and do what they are for (a real packet is accepted, a real report parses). With
/// `COHORT_WRITE_CORPUS=1` the seeds are written first (`scripts/fuzz-corpus.sh`).
#[test]
fn fuzz_corpus_replays() {
    for (target, harness, seeds) in corpus_targets() {
        for (name, data) in &seeds {
            match target {
                "unprotect" => assert!(unprotect_arbitrary(data), "{name} refused"),
                "feedback" => assert!(cohort_gears::fuzzing::parse_feedback_arbitrary(data)),
                _ => assert!(flip_one_bit(data).is_some(), "{name}"),
            }
        }
        cohort_sim::corpus::check(target, harness, &seeds);
    }
}
