//! Arbitrary bytes (after an optional real handshake prefix, in chunks the first byte picks)
//! into a server connection: it must never panic, and once failed it stays failed with the
//! same error.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cohort_channel::fuzzing::server_connection(data);
});
