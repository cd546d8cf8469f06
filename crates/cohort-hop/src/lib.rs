#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

pub mod chain;
mod config;
pub mod crypto;
mod endpoint;
mod event;
mod flow;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod guard;
pub mod merkle;
mod node;
mod relay;
mod resend;
pub mod wire;

pub use chain::ChainStorage;
pub use config::{
    EndpointConfig, Mode, RelayConfig, DEFAULT_BATCH, DEFAULT_WINDOW, MAX_BATCH_C, MAX_BATCH_M,
};
pub use endpoint::{AssocStatus, Endpoint, EndpointStatus, HopError, PeerStatus, MAX_MESSAGE};
pub use event::{AssocId, EndpointEvent, HopCounters, RelayEvent};
pub use guard::MAX_WINDOW;
pub use node::{HopEvent, HopNode};
pub use relay::{Relay, RelayPairStatus, RelayStatus};
