//! Arbitrary bytes as a ClientHello body: the parser must never panic, and whatever it
//! accepts must re-encode to exactly the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cohort_channel::fuzzing::client_hello(data);
});
