//! Arbitrary bytes into a receiver that accepts every gear (the null gear included, so the
//! fuzzer gets past the tags): it must never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cohort_gears::fuzzing::unprotect_arbitrary(data);
});
