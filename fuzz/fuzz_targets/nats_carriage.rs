//! Arbitrary bytes as a message on a group's NATS subjects (the carriage prefix that names
//! the sender, then the packet): parsing must never panic, and what parses re-encodes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cohort_fuzzing_facade::fuzzing::nats_carriage(data);
});
