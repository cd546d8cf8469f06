//! Arbitrary bytes into the gear link's feedback parser: it must never panic, and what it
//! accepts must be consistent with its length.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cohort_gears::fuzzing::parse_feedback_arbitrary(data);
});
