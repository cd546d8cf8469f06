#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod auth;
pub mod client;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod pair;
pub mod principal;
pub mod registry;
pub mod server;
pub mod wire;

pub use client::{KdcError, PairKeyRequest};
pub use pair::{
    both_sides_agree, leader_shared_key, lm_prf, member_shared_key, pair_key, PairKey, SharedKey,
};
pub use principal::{
    FileError, FileProblem, KeyError, KeyFile, NameError, PrincipalKey, PrincipalName, KEY_LEN,
    MAX_NAME_LEN,
};
pub use registry::{Registry, RegistryError};
pub use server::{Handled, Kdc, KdcCounters, Outcome, DEFAULT_REPLAY_CAPACITY};
pub use wire::{Nonce, NONCE_LEN};
