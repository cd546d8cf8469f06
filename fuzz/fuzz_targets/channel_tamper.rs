//! A real client and server handshake (and one record each way), with one flight changed as
//! the input describes: the two ends must never both finish on a changed handshake, and a
//! changed record must never deliver data.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cohort_channel::fuzzing::tampered_handshake(data);
});
