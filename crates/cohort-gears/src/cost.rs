//! Nominal verification cost of each gear, for ordering only (the receiver's
//! [`TagChoice::Cheapest`](crate::TagChoice::Cheapest) and the controller's tie-breaks).
//!
//! The numbers are nanoseconds to tag a 1500-byte packet as measured by `cohort gears bench`
//! on the development machine (recorded in `docs/performance.md`). Only their order matters;
//! a machine where the order differs still works, it just picks a slightly slower tag.

use crate::gear::GearId;

/// Nanoseconds to tag 1500 bytes on the reference machine (order is what counts).
pub fn nominal_cost(gear: GearId) -> u32 {
    match gear {
        GearId::DangerNullForTesting => 0,
        GearId::HmacSha256 | GearId::HmacSha256_128 => 1000,
        GearId::Blake3_128 => 1200,
        GearId::GmacAes128 => 150,
        GearId::Umac32 => 100,
        GearId::Umac64 => 180,
        GearId::Umac96 => 260,
        GearId::Umac128 => 340,
        GearId::IfgExperimental => 400,
        GearId::Partial2 => 150,
        GearId::Partial4 => 120,
        GearId::Partial8 => 100,
        GearId::Partial16 => 90,
        GearId::Partial32 => 80,
        GearId::Partial64 => 75,
        GearId::Partial128 => 70,
        GearId::Partial256 => 65,
        GearId::Aes128Gcm => 200,
        GearId::Aes256Gcm => 250,
        GearId::ChaCha20Poly1305 => 900,
    }
}
