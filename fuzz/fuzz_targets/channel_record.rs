//! Arbitrary frames into a stream record receiver with fixed keys (AEAD and MAC gears, floor
//! 0; the first byte can add the null gear so the fuzzer gets past the tags): it must never
//! panic, and what it opens must lie inside its frame.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cohort_channel::fuzzing::record_open(data);
});
