//! Real captured packets of a pair through a relay (handshake, S1, A1, S2 in modes N, M and
//! C, A2, signed renewals), chosen and changed as the input says (bits flipped, bytes set,
//! cut, extended, inserted), handed to the relay just before the real one or after the run:
//! the relay forwards no changed packet that a hop can check, and nothing is delivered that
//! was not sent.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cohort_hop::fuzzing::mutate_real(data);
});
