#![doc = include_str!("../README.md")]
#![deny(unsafe_code)]

pub mod controller;
mod cost;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod gear;
pub mod ifg;
mod keys;
// The one module allowed `unsafe`: entering the SIMD NH kernels after the CPU check.
pub mod link;
#[allow(unsafe_code)]
mod nh_enter;
mod nh_simd;
mod packet;
pub mod partial;
pub mod plain;
mod replay;
pub mod umac;

pub use cost::nominal_cost;
pub use gear::{GearId, GearInfo, GearKind, GearSet, GearStatus, ALL_GEARS, MAX_PACKET_LEN};
pub use keys::GearKey;
pub use packet::{
    peek, prefix_len, DropCounters, DropReason, GearKeys, GearList, Opened, ProtectError,
    Protector, ReceivePolicy, TagChoice, Unprotector, MAX_TAGS, PACKET_VERSION,
};
pub use replay::{ReplayError, ReplayWindow};
