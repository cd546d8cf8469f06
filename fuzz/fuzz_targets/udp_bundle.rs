//! Arbitrary bytes as a UDP datagram that may be a bundle of group packets (the drivers'
//! `cohort_net::bundle`): parsing must never panic, and what parses re-encodes to itself.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cohort_fuzzing_facade::fuzzing::udp_bundle(data);
});
