//! Nominal verification cost of each gear, for ordering only (the receiver's
//! [`TagChoice::Cheapest`](crate::TagChoice::Cheapest) and the controller's tie-breaks).
//!
//! The numbers are nanoseconds to tag a 1500-byte packet as measured by `cohort gears bench`
//! on the development machine on 2026-11-22 (recorded in `docs/performance.md`). Only their order matters;
//! a machine where the order differs still works, it just picks a slightly slower tag.

use crate::gear::GearId;

/// Nanoseconds to tag 1500 bytes on the reference machine (order is what counts).
pub fn nominal_cost(gear: GearId) -> u32 {
    match gear {
        GearId::DangerNullForTesting => 0,
        GearId::HmacSha256 | GearId::HmacSha256_128 => 1040,
        GearId::Blake3_128 => 1310,
        GearId::GmacAes128 => 153,
        GearId::Umac32 => 105,
        GearId::Umac64 => 150,
        GearId::Umac96 => 218,
        GearId::Umac128 => 262,
        GearId::IfgExperimental => 274,
        GearId::Partial2 => 256,
        GearId::Partial4 => 171,
        GearId::Partial8 => 123,
        GearId::Partial16 => 101,
        GearId::Partial32 => 89,
        GearId::Partial64 => 83,
        GearId::Partial128 => 77,
        GearId::Partial256 => 69,
        GearId::Aes128Gcm => 170,
        GearId::Aes256Gcm => 192,
        GearId::ChaCha20Poly1305 => 848,
    }
}
