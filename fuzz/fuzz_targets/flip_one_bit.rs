//! Protect a packet the input describes, flip one bit, unprotect: a flip must be refused
//! by every secure gear (a partial MAC may miss a body bit it did not choose).
#![no_main]
use cohort_gears::{GearId, GearInfo};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((gear, bit, body_start, accepted)) = cohort_gears::fuzzing::flip_one_bit(data) {
        let info: &GearInfo = gear.info();
        let in_body = bit / 8 >= body_start;
        let may_escape = gear == GearId::DangerNullForTesting || (info.partial_l.is_some() && in_body);
        assert!(!accepted || may_escape, "{gear}: flipped bit {bit} accepted");
    }
});
