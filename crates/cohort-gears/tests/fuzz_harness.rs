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
