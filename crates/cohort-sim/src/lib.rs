#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod config;
pub mod corpus;
mod fault;
mod log;
mod node;
mod seeds;
mod sim;
mod standard;

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
pub use standard::{split_by_coin, split_prefix, FaultSet, StandardFaults};

/// The RNG traits, re-exported so fault rules and machines can name them without another
/// dependency.
pub use rand_core;
