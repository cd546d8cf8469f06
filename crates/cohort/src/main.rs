//! `cohort`: the command-line face of cohort's protocol cores.
//!
//! ```text
//!   cohort gears list|tag|bench  ──▶ cohort-gears (registry, plain MACs, GearKey timing)
//!   cohort demo                  ──▶ cohort-sim running channels, GearLinks, group members
//!   cohort keygen                ──▶ cohort-channel identity (Ed25519 identity file)
//!   cohort tunnel server|client  ──▶ cohort-net TCP driver ──▶ cohort-channel
//!   cohort group run|bench       ──▶ cohort-net UDP driver ──▶ cohort-group members
//!   cohort hop run|ctl|forge     ──▶ own UDP/TUN loop ──▶ cohort-hop endpoints and relays
//!   cohort kdc serve|add-principal ──▶ own UDP loop ──▶ cohort-kdc Kdc (LSGC's KDC)
//!   cohort completions SHELL | man ──▶ clap_complete / clap_mangen over this parser
//! ```
//!
//! Human logs go to stderr through `tracing` (filter: `COHORT_LOG`, else `RUST_LOG`, else
//! `warn`; see [`logging`]); stdout carries only the commands' output.

mod bench;
mod completions;
// The group config moved into the library (which compiles its own copy of this module);
// `Number` is only the group's.
#[allow(dead_code)]
mod config_file;
mod demo;
mod demo_channel;
mod demo_group;
mod demo_hop;
mod gears_cmd;
mod group_cmd;
mod group_ctl_cmd;
mod hop_cmd;
mod jsonl;
mod kdc_cmd;
mod keygen_cmd;
mod logging;
mod tunnel_cmd;

use clap::{CommandFactory, Parser, Subcommand};
use std::process::ExitCode;

/// Secure communication for groups, channels and multi-hop paths, with a choice of how much
/// strength to buy for how much CPU.
#[derive(Parser)]
#[command(name = "cohort", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Authentication gears (ACSA): list them, tag data, benchmark them.
    Gears {
        #[command(subcommand)]
        command: gears_cmd::GearsCommand,
    },
    /// A secure channel; two in-process peers exchange protected packets while the gear
    /// controller reacts to load and to a forgery burst; a group of four survives a crash;
    /// forged packets die at the first relay of a hop-by-hop authenticated path. All in the
    /// deterministic simulator.
    Demo(demo::DemoArgs),
    /// Write a new Ed25519 identity file (owner-only) and print its public key.
    Keygen(keygen_cmd::KeygenArgs),
    /// Protect unmodified TCP applications: a cohort channel between two tunnel ends.
    Tunnel {
        #[command(subcommand)]
        command: tunnel_cmd::TunnelCommand,
    },
    /// Secure process groups over UDP: run a member, or benchmark a group on loopback.
    Group {
        #[command(subcommand)]
        command: group_cmd::GroupCommand,
    },
    /// Hop-by-hop authentication (ALPHA) over UDP: run an endpoint or relay, control it.
    Hop {
        #[command(subcommand)]
        command: hop_cmd::HopCommand,
    },
    /// LSGC's key distribution center: serve pair keys over UDP, register principals.
    Kdc {
        #[command(subcommand)]
        command: kdc_cmd::KdcCommand,
    },
    /// Print a shell completion script (bash: `source <(cohort completions bash)`).
    Completions(completions::CompletionsArgs),
    /// Print the man page in roff (`cohort man | man -l -`), or write every page to --dir.
    Man(completions::ManArgs),
}

/// An error the user can fix: printed as one line, exit status 2.
#[derive(Debug)]
pub struct UsageError(pub String);

fn main() -> ExitCode {
    quiet_on_broken_pipe();
    let cli = Cli::parse();
    let result = logging::init().and_then(|()| match cli.command {
        Command::Gears { command } => gears_cmd::run(command),
        Command::Demo(args) => demo::run(&args),
        Command::Keygen(args) => keygen_cmd::run(&args),
        Command::Tunnel { command } => tunnel_cmd::run(command),
        Command::Group { command } => group_cmd::run(command),
        Command::Hop { command } => hop_cmd::run(command),
        Command::Kdc { command } => kdc_cmd::run(command),
        Command::Completions(args) => completions::completions(&args, Cli::command()),
        Command::Man(args) => completions::man(&args, Cli::command()),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(UsageError(msg)) => {
            eprintln!("cohort: {msg}");
            ExitCode::from(2)
        }
    }
}

/// `cohort gears list | head -1` closes the pipe early; `println!` then panics. Leave quietly
/// instead, as a filter in a pipeline should.
fn quiet_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info);
    }));
}
