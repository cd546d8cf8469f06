//! Arbitrary bytes (after an optional real server flight, in chunks the first byte picks)
//! into a client connection right after connect: it must never panic, stays failed once
//! failed, and never accepts a ServerHello other than the real one.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cohort_channel::fuzzing::client_connection(data);
});
