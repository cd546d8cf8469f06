//! Arbitrary bytes as the body of a protected group packet (a `Msg`): decoding must never
//! panic, and whatever decodes must re-encode to exactly the same bytes and decode again to
//! the same message.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cohort_group::fuzzing::msg_decode(data);
});
