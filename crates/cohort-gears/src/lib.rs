//! ACSA authentication gears: MACs from strong to fast, partial MACs, bit scattering,
//! several tags per packet, packet protection with a replay window, and the adaptive
//! controller that picks the gear. Sans-IO: nothing here reads a clock or touches a socket.
//!
//! ```text
//!  association secret ──HKDF per gear id──▶ GearKeys ─┬─▶ Protector   (sender)
//!                                                     └─▶ Unprotector (receiver)
//!
//!  sender:   Controller(floor, gears, load, failures, feedback) ─▶ gear(s)
//!            Protector::protect(gears, header, body) ─▶ packet naming its gears
//!  receiver: Unprotector::unprotect(packet): parse ─▶ policy (accepted, floor, choice)
//!            ─▶ replay window ─▶ verify one chosen tag ─▶ header, body
//!                     │ failures, load
//!                     └──────────────▶ feedback to the sender's controller
//! ```
//!
//! # Example
//! ```
//! use cohort_crypto::CryptoProvider;
//! use cohort_gears::{GearId, GearKeys, GearSet, Protector, ReceivePolicy, Unprotector};
//!
//! let provider = CryptoProvider::default_provider();
//! let secret = [42u8; 32]; // from a key exchange in real use
//! let gears: GearSet = [GearId::HmacSha256_128, GearId::Umac32].into_iter().collect();
//! let mut tx = Protector::new(GearKeys::derive(&provider, &secret, gears).unwrap());
//! // The receiver agreed to both gears but will verify only tags worth 100 bits or more.
//! let policy = ReceivePolicy::new(gears, 100.0);
//! let mut rx = Unprotector::new(GearKeys::derive(&provider, &secret, gears).unwrap(), policy);
//!
//! // A strong and a fast tag on one packet (ACSA 3.4); each receiver picks one.
//! let mut packet = Vec::new();
//! tx.protect(&[GearId::Umac32, GearId::HmacSha256_128], b"hdr", b"hello", &mut packet).unwrap();
//! let opened = rx.unprotect(&mut packet).unwrap();
//! assert_eq!(opened.body, b"hello");
//! assert_eq!(opened.verified_by, GearId::HmacSha256_128);
//! ```
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
