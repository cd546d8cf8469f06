//! Arbitrary bytes as fragments of the group facade (`cohort::group`) from four senders,
//! one of which may leave mid-message: reassembly must never panic or exceed its limit, and
//! every completed state message must decode without panic and re-encode to itself.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cohort_fuzzing_facade::fuzzing::facade_frames(data);
});
