//! `cohort hop run|ctl|forge`: ALPHA hop-by-hop authentication over real UDP.
//!
//! ```text
//!   stdin JSON lines ─┐   (app = "stdio")
//!   TUN device ───────┤   (app = "tun": IP packets)        ┌─▶ UDP socket (overlay)
//!   control socket ───┼─▶ event loop ── Endpoint | Relay ──┤   (optionally held delay_ms)
//!   UDP socket ───────┤   (run.rs)                          └─▶ stdout JSON lines / TUN
//!   timers, signals ──┘
//! ```
//!
//! `run` is one endpoint or relay (see [`config`] for its file, [`tun`] for TUN mode and
//! its routing, [`ctl`] for the control socket); `ctl` talks to a running one; `forge` is a
//! test tool that sends forged ALPHA packets for live associations, to check that relays
//! drop them.

pub mod config;
pub mod ctl;
pub mod forge;
pub mod json;
pub mod run;
pub mod tun;

use crate::UsageError;
use clap::{Args, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

/// `cohort hop ...`
#[derive(Subcommand)]
pub enum HopCommand {
    /// Run an ALPHA endpoint or relay over UDP (JSON-line events on stdout; commands on
    /// stdin in stdio mode, IP packets through a TUN device in tun mode).
    Run(RunArgs),
    /// Ask a running `hop run` for its associations and counters, or open/close one.
    Ctl(ctl::CtlArgs),
    /// Test tool: send forged and replayed ALPHA packets for a node's live associations.
    Forge(forge::ForgeArgs),
}

/// `cohort hop run`: flags override the file.
#[derive(Args)]
pub struct RunArgs {
    /// The node's configuration file (TOML; see `cohort hop run --help` and the README).
    #[arg(long)]
    pub config: PathBuf,
    /// Listen on this address instead of the file's `listen`.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Every peer's mode: none, n, c:K, m:K (overrides `mode` everywhere in the file).
    #[arg(long)]
    pub mode: Option<String>,
    /// Outgoing associations per peer (overrides `associations` everywhere in the file).
    #[arg(long)]
    pub associations: Option<u16>,
    /// The control socket's path instead of the file's `ctl`.
    #[arg(long)]
    pub ctl: Option<PathBuf>,
    /// Hold every outgoing datagram this long before sending it (a user-space link delay,
    /// for experiments).
    #[arg(long)]
    pub delay_ms: Option<u64>,
    /// Serve Prometheus metrics over HTTP on this address (GET /metrics), instead of the
    /// file's `metrics`.
    #[arg(long)]
    pub metrics: Option<SocketAddr>,
    /// Exit when standard input ends (stdio mode; by default the node runs until SIGINT or
    /// SIGTERM).
    #[arg(long)]
    pub exit_on_eof: bool,
}

/// Runs a `cohort hop` command.
pub fn run(command: HopCommand) -> Result<(), UsageError> {
    match command {
        HopCommand::Run(args) => run::run(&args),
        HopCommand::Ctl(args) => ctl::run(&args),
        HopCommand::Forge(args) => forge::run(&args),
    }
}
