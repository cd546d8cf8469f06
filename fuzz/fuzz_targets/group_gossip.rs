//! Arbitrary bytes as a group gossip packet (Exchange's Id, Ticket and KDC-mode Id): the
//! parser and the checks a leader runs must never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cohort_group::fuzzing::gossip_packet(data);
});
