//! Hop-by-hop authentication with hash chains (ALPHA). This crate does no I/O: it reads no
//! clock, opens no socket and spawns no thread; time and randomness come from the caller.
//!
//! Every relay on a path can verify every packet with hashes alone, so forged traffic dies
//! at the first hop instead of crossing the network.
//!
//! ```text
//!  signer (Endpoint)                 relay(s) (Relay)                  verifier (Endpoint)
//!  S1: round, e_i1, MAC(e_i0, m) ──▶ e_i1 fresh in the chain? store MAC ──▶ same, A1
//!                                 ◀── A1: a_i1 fresh in the ack chain? round may open ◀──
//!  S2: e_i0, m [, Merkle path]  ──▶ H(e_i0) = e_i1, MAC matches?        ──▶ same, deliver
//!                                 ◀── A2 (optional): the ack/nack secret under a_i0 ◀──
//! ```
//!
//! * [`Endpoint`]: handshake (cookie, SYN, ACK, ACKACK with signed anchors), associations
//!   in modes N, C and M (and an unprotected baseline), chain renewal over the control
//!   association, a fair scheduler.
//! * [`Relay`]: forwards only what it verified; bounded state; no public-key operation per
//!   data packet (one signature check per handshake and per announced chain).
//! * [`HopNode`]: either role, for the simulator.
//! * [`chain`]: hash chains with full, checkpoint and logarithmic storage; [`merkle`]: the
//!   trees of ALPHA-M; [`wire`]: the packet formats; [`guard`]: the checks every hop makes.
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
pub use config::{EndpointConfig, Mode, RelayConfig, DEFAULT_BATCH, MAX_BATCH_C, MAX_BATCH_M};
pub use endpoint::{AssocStatus, Endpoint, EndpointStatus, HopError, PeerStatus, MAX_MESSAGE};
pub use event::{AssocId, EndpointEvent, HopCounters, RelayEvent};
pub use node::{HopEvent, HopNode};
pub use relay::{Relay, RelayPairStatus, RelayStatus};
