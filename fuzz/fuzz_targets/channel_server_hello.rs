//! Arbitrary bytes as a ServerHello body: the parser must never panic, and whatever it
//! accepts must re-encode to the same bytes, with its transcript core at the front.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cohort_channel::fuzzing::server_hello(data);
});
