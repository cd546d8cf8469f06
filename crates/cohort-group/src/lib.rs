#![doc = include_str!("../README.md")]
mod channels;
pub mod config;
pub mod event;
pub mod exchange;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod id;
pub mod kdc_pair;
pub mod keys;
pub mod lkh;
mod member;
pub use member::{MAX_VIEW_MEMBERS, PRESENT_WITNESSES};
pub mod pair;
pub mod traffic;
pub mod wire;

pub use config::{
    AuthMode, ConfigError, ConfigField, GroupConfig, Protection, RekeyMethod, RekeyPolicy,
    TrustList,
};
pub use event::{Channel, Drop, DropCounters, GroupEvent, RemovalReason, SendError, Status};
pub use id::{Member, MemberId, Members, View, ViewId};
pub use member::{Credentials, Destination, GroupMember};
pub use traffic::Traffic;
