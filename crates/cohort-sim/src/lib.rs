//! A deterministic network simulator for cohort's sans-IO protocol cores. It reads no real
//! clock, opens no socket and spawns no thread: time is virtual and every random choice comes
//! from one RNG seeded by the test, so a seed replays a run exactly.
//!
//! ```text
//!  test ── with_node(id, |m, now| m.command()) ─┐
//!                                               v
//!   ┌─────────────── node (impl Machine) ───────────────┐      ┌────────── log ──────────┐
//!   │ handle_datagram / handle_timeout   <-- inputs      │      │ LogEntry { at, node,    │
//!   │ poll_transmit -> poll_event -> poll_timeout        │----->│   Event | Sent | ...    │
//!   └──────┬───────────────────────────────────┬────────┘      │   Dropped | Tampered }  │
//!          │ datagram                           │ deadline      └──── checkers read ──────┘
//!          v                                    v
//!   route: address -> node, MTU,          deadlines (BTreeSet)
//!   partition at send time                      │
//!          │                                    │
//!   fault rules, in order (first non-Pass wins) │
//!   Pass | Drop | Delay | Duplicate |           │
//!   Reorder | Tamper   (seeded RNG)             │
//!          │ + latency + jitter                 │
//!          v                                    │
//!   wire: (arrival time, seq) -> datagram       │
//!          │                                    │
//!          └───── clock jumps to the earliest ──┘
//!                 arrival (crash / new partition may drop it) or deadline,
//!                 then hands it to the node: handle_datagram or handle_timeout
//! ```
//!
//! * [`Sim`]: `N` nodes of one [`Machine`](cohort_core::Machine) type (roles are enum
//!   variants inside it), the virtual clock, the wire, partitions, crashes and the log.
//! * [`FaultRule`] and [`Verdict`], with ready-made [`Loss`], [`DelayRule`],
//!   [`DuplicateRule`], [`ReorderRule`], [`TamperRule`] and the closure-based [`FnRule`];
//!   [`FaultRuleExt`] narrows a rule to some datagrams or renames it.
//! * [`LogEntry`] / [`LogKind`]: what checkers read; [`Counters`]: running totals.
//! * [`run_seeds`] / [`sweep`]: run many seeds and panic with the failing one and the line
//!   that replays it (`COHORT_SIM_SEED=<seed>`); [`SimFailure`]: a failure with its seed and
//!   the end of the log.
//!
//! # Example
//! ```
//! use cohort_core::{Machine, Timestamp, Transmit};
//! use cohort_sim::{sweep, LogKind, Loss, Sim, SimConfig, SimFailure};
//! use std::collections::VecDeque;
//! use std::net::SocketAddr;
//! use std::time::Duration;
//!
//! /// Reports every datagram it receives and answers `?...` with `!`.
//! #[derive(Default)]
//! struct Echo {
//!     out: VecDeque<(SocketAddr, Vec<u8>)>,
//!     got: VecDeque<Vec<u8>>,
//! }
//!
//! impl Echo {
//!     fn send(&mut self, to: SocketAddr, data: &[u8]) {
//!         self.out.push_back((to, data.to_vec()));
//!     }
//! }
//!
//! impl Machine for Echo {
//!     type Event = Vec<u8>;
//!     fn handle_datagram(&mut self, _now: Timestamp, from: SocketAddr, data: &[u8]) {
//!         self.got.push_back(data.to_vec());
//!         if data.first() == Some(&b'?') {
//!             self.out.push_back((from, b"!".to_vec()));
//!         }
//!     }
//!     fn handle_timeout(&mut self, _now: Timestamp) {}
//!     fn poll_transmit(&mut self, _now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
//!         let (destination, data) = self.out.pop_front()?;
//!         buf.extend_from_slice(&data);
//!         Some(Transmit { destination, size: data.len() })
//!     }
//!     fn poll_timeout(&self) -> Option<Timestamp> {
//!         None
//!     }
//!     fn poll_event(&mut self) -> Option<Vec<u8>> {
//!         self.got.pop_front()
//!     }
//! }
//!
//! // Every seed must pass; a failure panics naming the seed (COHORT_SIM_SEED=<seed> replays it).
//! sweep(8, |seed| -> Result<(), SimFailure> {
//!     let config = SimConfig { seed, latency: Duration::from_millis(10), ..SimConfig::default() };
//!     let mut sim = Sim::new(config);
//!     let a = sim.add_node(Echo::default());
//!     let b = sim.add_node(Echo::default());
//!     let to_b = sim.addr(b);
//!
//!     sim.with_node(a, |echo, _now| echo.send(to_b, b"?ping"));
//!     sim.run_until_quiet(Duration::from_secs(1))?;
//!     let seen: Vec<_> = sim.events().map(|(at, n, e)| (at, n, e.clone())).collect();
//!     sim.check(
//!         seen == [
//!             (Timestamp::from_millis(10), b, b"?ping".to_vec()),
//!             (Timestamp::from_millis(20), a, b"!".to_vec()),
//!         ],
//!         format!("unexpected events {seen:?}"),
//!     )?;
//!
//!     // Now the network loses everything.
//!     let loss = sim.add_rule(Loss(1.0));
//!     sim.with_node(a, |echo, _now| echo.send(to_b, b"?again"));
//!     sim.run_for(Duration::from_secs(1))?;
//!     sim.check(sim.counters().dropped_by_rule == 1, "the datagram should be lost")?;
//!     let lost = sim.log().iter().any(|e| matches!(e.kind, LogKind::Dropped { .. }));
//!     sim.check(lost, "the drop should be logged")?;
//!     sim.remove_rule(loss);
//!     Ok(())
//! });
//! ```
#![forbid(unsafe_code)]

mod config;
mod fault;
mod log;
mod node;
mod seeds;
mod sim;

pub use config::SimConfig;
pub use fault::{
    below, chance, duration_in, DelayRule, DuplicateRule, FaultRule, FaultRuleExt, FnRule, Loss,
    Named, PacketView, ReorderRule, TamperRule, Verdict, When,
};
pub use log::{Counters, DropReason, LogEntry, LogKind, PacketId};
pub use node::{NodeId, MAX_NODES, NODE_PORT};
pub use seeds::{
    replay_seed, run_seeds, seed_count, sweep, FailureKind, SimFailure, SEEDS_ENV, SEED_ENV,
};
pub use sim::{RuleId, Sim, SimRng};

/// The RNG traits, re-exported so fault rules and machines can name them without another
/// dependency.
pub use rand_core;
