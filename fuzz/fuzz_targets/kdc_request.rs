//! A control byte, then bytes as a datagram to the KDC (raw, or XORed over a real request):
//! the KDC must never panic, move exactly one counter, and answer with a pair key (or an
//! authenticated "unknown principal") only a request byte-for-byte equal to the one the
//! registered requester builds.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cohort_kdc::fuzzing::request(data);
});
