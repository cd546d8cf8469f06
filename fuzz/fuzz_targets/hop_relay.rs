//! A control byte, then datagrams, into the relay between the two endpoints of an
//! established pair: it must never panic, never forwards a datagram that neither endpoint
//! sent (but for the Hello, Challenge and SYN it forwards without state), and the far
//! endpoint never delivers a message that was not sent.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cohort_hop::fuzzing::relay(data);
});
