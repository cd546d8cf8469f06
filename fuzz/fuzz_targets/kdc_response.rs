//! A control byte, then bytes as the KDC's answer to the leader's request for alice (raw, or
//! XORed over the KDC's real response): opening must never panic, and a key comes out only
//! for the KDC's exact response, equal to the one alice computes herself.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cohort_kdc::fuzzing::response(data);
});
