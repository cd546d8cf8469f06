#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

pub mod batch;
mod cache;
pub mod config;
pub mod connection;
pub mod datagram;
pub mod endpoint;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod identity;
pub mod messages;
mod outcome;
pub mod pake;
pub mod record;
pub mod schedule;
pub mod suite;

pub use config::{ClientAuth, ClientConfig, ServerConfig};
pub use connection::{AuthResult, ChannelError, Connection, Event, SessionInfo};
pub use endpoint::{Client, Server};
pub use schedule::SessionId;
pub use suite::{AuthMode, KemSuite};
