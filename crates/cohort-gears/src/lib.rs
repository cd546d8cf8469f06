#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

pub mod controller;
mod cost;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod gear;
pub mod ifg;
mod keys;
pub mod link;
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
