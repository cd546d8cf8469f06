//! Protect a packet the input describes, flip one bit, unprotect: a flip must be refused
//! by every secure gear (a partial MAC may miss a body bit it did not choose).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cohort_gears::fuzzing::flip_one_bit_checked(data);
});
