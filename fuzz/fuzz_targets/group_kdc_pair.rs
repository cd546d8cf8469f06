//! A control byte, then datagrams, into a KDC-mode pair-channel table (fresh, opening, or
//! with a channel to the real peer through a KDC): it must never panic, and never reports
//! a peer or a message that the real peer did not make.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cohort_group::fuzzing::kdc_pair_datagram(data);
});
