//! Arbitrary bytes as a cohort-hop packet and as a control message: parsing must never
//! panic, and whatever parses must re-encode to the same bytes (a Hello up to its zero
//! padding) and parse again to the same packet.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cohort_hop::fuzzing::packet(data);
});
