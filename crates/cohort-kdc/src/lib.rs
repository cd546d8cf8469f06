//! The key distribution center of LSGC, with Leighton-Micali pair keys over a modern PRF.
//! This crate opens no socket and reads no clock; randomness (keys, nonces) comes from the
//! caller. Only [`Registry::load`] and [`Registry::save`] touch the file system.
//!
//! In LSGC every principal A shares a long-term key `K_A` with the KDC. To admit A, the
//! session leader SL asks the KDC for the pair key `π_{SL,A}` and derives the secret
//! `σ_{SL,A}` it shares with A; A computes the same σ alone. No public-key operation runs
//! anywhere.
//!
//! ```text
//!   A (member)                 SL (session leader)                       KDC (Kdc)
//!   1. A, I_0 ──────────────▶  PairKeyRequest::new(SL, K_SL, A, I_1)
//!                              2. SL, A, I_1, MAC_{K_req} ─────────▶  parse, SL known?, MAC,
//!                                                                      replay cache, A known?
//!                              ◀─── 3. SL, A, I_1, π_{SL,A}, MAC_{K_resp}
//!                              open_response: MAC, names, I_1
//!                              σ = π ⊕ {A}_{K_SL}
//!   σ = {SL}_{K_A}             4. SL, {I_0, g, ...}_σ  ─────▶ (cohort-group's KDC mode)
//!   (member_shared_key)
//! ```
//!
//! * [`principal`]: [`PrincipalName`] (1 to 31 bytes of `A-Z a-z 0-9 . _ -`),
//!   [`PrincipalKey`] (`K_A`, 32 bytes, zeroized), [`KeyFile`] (what a principal keeps).
//! * [`pair`]: `{x}_K` as keyed BLAKE3, [`pair_key`], [`leader_shared_key`],
//!   [`member_shared_key`].
//! * [`wire`]: the request and responses, byte by byte (also in `docs/wire.md`).
//! * [`Kdc`]: the server, sans-IO, with drop counters and a bounded replay cache;
//!   [`Registry`]: its database.
//! * [`PairKeyRequest`]: the requester's side, with typed errors ([`KdcError`]).
//!
//! # Example
//! ```
//! use cohort_crypto::CryptoProvider;
//! use cohort_kdc::{member_shared_key, Kdc, PairKeyRequest, PrincipalKey, PrincipalName, Registry};
//!
//! let provider = CryptoProvider::default_provider();
//! let mut rng = rand_core::OsRng;
//! let (leader, alice) = (PrincipalName::new("leader")?, PrincipalName::new("alice")?);
//! let (k_leader, k_alice) = (PrincipalKey::generate(&mut rng), PrincipalKey::generate(&mut rng));
//! let mut registry = Registry::new();
//! registry.insert(leader, k_leader.clone());
//! registry.insert(alice, k_alice.clone());
//! let mut kdc = Kdc::new(provider, registry);
//!
//! // The leader asks; the KDC answers; the leader opens the answer.
//! let request = PairKeyRequest::new(&provider, leader, &k_leader, alice, [7; 16])?;
//! let from = "127.0.0.1:7000".parse()?;
//! let response = kdc.handle_request(from, request.bytes()).expect("an answer");
//! let at_leader = request.open_response(&response)?;
//!
//! // Alice computes the same secret without asking anyone.
//! assert_eq!(at_leader, member_shared_key(&provider, &k_alice, &leader));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
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
