//! A control byte, then datagrams, into a member's pair-channel table (fresh, waiting as a
//! client, or with an authenticated channel to the real peer at the same address): it must
//! never panic, and never reports a peer or a message that the real peer did not prove or
//! send.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cohort_group::fuzzing::pair_datagram(data);
});
