//! Arbitrary bytes as a batch-signature proof (a ServerAuth body): decoding must never
//! panic, must consume exactly what it re-encodes, and verification must not panic either.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cohort_channel::fuzzing::batch_proof(data);
});
