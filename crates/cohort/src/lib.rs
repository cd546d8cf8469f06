//! cohort as a library: async handles for tokio applications over cohort's sans-IO
//! protocol cores, and what operators need around them.
//!
//! The `cohort` command is built from this library (its subcommands are thin layers over
//! these handles), so what the command does, an application can do.
//!
//! ```text
//!   application ──▶ cohort (this crate: handles, metrics, seeding)
//!                     │ group ─▶ cohort-group members  ─┐
//!                     │ channel ▶ cohort-channel        ├─▶ cohort-net drivers ─▶ sockets
//!                     │ hop ───▶ cohort-hop endpoints  ─┘
//!                     └ metrics: Prometheus text over HTTP
//! ```
//!
//! Build with `default-features = false` to leave out the command line (argument parsing,
//! completions, the log subscriber).

#![forbid(unsafe_code)]

pub mod channel;
mod config_file;
pub mod group;
pub mod group_ctl;
pub mod group_metrics;
pub mod hop;
pub mod metrics;

use cohort_crypto::CryptoProvider;
use std::io;

/// A fresh 32-byte seed for a protocol core's randomness, from the operating system through
/// `provider`. Every core takes its randomness as a seed (so that the simulator can replay
/// it); real deployments seed each one from here.
pub fn os_seed(provider: &CryptoProvider) -> io::Result<[u8; 32]> {
    let mut seed = [0u8; 32];
    provider
        .random
        .fill(&mut seed)
        .map_err(|e| io::Error::other(format!("no randomness from the operating system: {e}")))?;
    Ok(seed)
}
