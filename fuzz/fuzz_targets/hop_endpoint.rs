//! A control byte, then datagrams, into an endpoint of an established pair (modes M and C,
//! rounds exchanged, optionally with delivery reports), from its peer's address or a
//! stranger's, then two virtual seconds and one more message on each association: it must
//! never panic, and never delivers a message its peer did not send, nor one twice.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cohort_hop::fuzzing::endpoint(data);
});
