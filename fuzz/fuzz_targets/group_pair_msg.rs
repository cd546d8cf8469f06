//! Arbitrary bytes as a pair-channel message (a `PairMsg`): decoding must never panic, and
//! whatever decodes must re-encode to exactly the same bytes and decode again to the same
//! message.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cohort_group::fuzzing::pair_msg_decode(data);
});
