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
//!
//! # A guide for applications
//!
//! ## Groups
//!
//! A group is a set of members that see the same messages in the same order, and the same
//! sequence of views (who is in). The module [`group`] holds the handles:
//!
//! 1. Describe the member in a [`group::GroupConfig`]: read the TOML file that
//!    `cohort group run` reads ([`GroupConfig::load`](group::GroupConfig::load)), or build
//!    it in code ([`GroupConfig::builder`](group::GroupConfig::builder)): the member's
//!    identity, the address it listens on, the peers it joins through, the members it
//!    trusts.
//! 2. [`Group::start`](group::Group::start) binds the socket and spawns the member's task
//!    on the current tokio runtime. It gives a [`Group`](group::Group) (a handle to clone
//!    freely) and [`Events`](group::Events) (the one event stream).
//! 3. [`join`](group::Group::join) returns the first view the member is in.
//! 4. [`send`](group::Group::send) on `Channel::Reliable` sends a message of up to 16 MiB
//!    to every member, in one total order (`Channel::Unreliable`: one datagram, best
//!    effort). It waits while the send window is full.
//! 5. [`Events::next`](group::Events::next) gives views, deliveries (with their sender),
//!    removals, merges after a partition, state transfer, and
//!    [`Event::Lost`](group::Event::Lost) if the application read too slowly (the member
//!    itself never waits for the reader).
//! 6. [`leave`](group::Group::leave) leaves and stops the member.
//!
//! Two members on loopback, one founding the group and one joining through it:
//!
//! ```
//! use cohort::group::{Channel, Event, Group, GroupConfig, MemberId};
//! use cohort_channel::identity::Identity;
//! use cohort_crypto::CryptoProvider;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let provider = CryptoProvider::default_provider();
//! let alice = Identity::generate(&provider)?;
//! let bob = Identity::generate(&provider)?;
//! let trust = [MemberId(alice.public()), MemberId(bob.public())];
//! let member = |identity| {
//!     GroupConfig::builder("guide")
//!         .identity(identity)
//!         .listen("127.0.0.1:0".parse().unwrap())
//!         .trust(trust)
//! };
//!
//! let (a, mut a_events) = Group::start(member(alice).build()?)?;
//! a.join().await?; // alone: a founds the group
//! let (b, _b_events) = Group::start(member(bob).peer(a.local_addr()).build()?)?;
//! let view = b.join().await?;
//! assert_eq!(view.members.len(), 2);
//!
//! b.send(Channel::Reliable, b"hello".to_vec()).await?;
//! loop {
//!     match a_events.next().await {
//!         Some(Event::Deliver { sender, data, .. }) => {
//!             assert_eq!((sender, &data[..]), (b.id(), &b"hello"[..]));
//!             break;
//!         }
//!         Some(Event::View(v)) => println!("view {} of {}", v.id, v.members.len()),
//!         Some(_) => {}
//!         None => panic!("a stopped"),
//!     }
//! }
//! b.leave().await?;
//! a.leave().await?;
//! # Ok(())
//! # }
//! ```
//!
//! **State transfer.** Give the builder a snapshot callback
//! ([`snapshot`](group::GroupConfigBuilder::snapshot)): when a member joins, a member that
//! has the state calls it at the view boundary, and the joiner gets
//! [`Event::State`](group::Event::State) before its first delivery. Apply each event before
//! you ask for the next one, so that the snapshot matches the events read. The [`group`]
//! module's documentation has the details, and the kv example uses it.
//!
//! ## Channels and hops
//!
//! * Module `channel`: a secure stream between two parties (`connect`, `accept`, a
//!   `Listener`), as `cohort tunnel` uses it.
//! * Module `hop`: an `Endpoint` for a hop-by-hop authenticated path (`send`, `recv`,
//!   `status`), as `cohort hop run` uses it.
//!
//! ## Examples
//!
//! In the repository, `crates/cohort/examples/` (see its `README.md`): `chat` (a
//! terminal chat over a group) and `kv` (a replicated
//! key-value store on the reliable, totally ordered channel, with crash, partition and
//! state transfer, and a README on what virtual synchrony gives it). Each runs with
//! `cargo run -p cohort --example NAME -- CONFIG.toml`.

#![forbid(unsafe_code)]

pub mod channel;
mod config_file;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
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
