//! The KDC itself: one request in, at most one response out.
//!
//! ```text
//! bytes ─▶ parse (version, kind, names, exact length)        ── malformed: drop
//!       ─▶ requester registered?                              ── no: UnknownRequester hint
//!       ─▶ MAC under K_req(K_SL)                              ── bad: drop
//!       ─▶ (SL, I_1) seen lately? (bounded replay cache)      ── yes: drop
//!       ─▶ principal registered?                              ── no: UnknownPrincipal (MACed)
//!       ─▶ π_{SL,A} = {A}_{K_SL} ⊕ {SL}_{K_A} ─▶ PairKey (MACed under K_resp(K_SL))
//! ```
//!
//! The cheap checks run first: a request that does not parse, or that claims an unknown
//! requester, costs no cryptography. Every request moves exactly one counter
//! ([`KdcCounters`]). Nothing a peer sends can make the KDC panic or return an error: bad
//! requests are dropped and counted.
//!
//! The replay cache is what lets the KDC answer each authentic request once: it remembers
//! the last [`DEFAULT_REPLAY_CAPACITY`] `(requester, nonce)` pairs (oldest forgotten first).
//! It is not what makes responses fresh — the requester's nonce check does that — so a
//! request older than the cache is answered again, harmlessly (same π, for a nonce the
//! requester no longer waits for). A requester that got no answer asks again with a new
//! nonce.

use crate::auth::MacKey;
use crate::pair::pair_key;
use crate::principal::PrincipalName;
use crate::registry::Registry;
use crate::wire::{Nonce, Request, ResponseBody, WireError};
use cohort_crypto::CryptoProvider;
use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::net::SocketAddr;

/// How many `(requester, nonce)` pairs the replay cache remembers unless told otherwise
/// (about 1 MiB).
pub const DEFAULT_REPLAY_CAPACITY: usize = 16_384;

/// What the KDC did with each request it got. Exactly one counter moves per request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KdcCounters {
    /// Answered with a pair key.
    pub answered: u64,
    /// Answered that the principal asked for is not registered.
    pub unknown_principal: u64,
    /// Answered (unauthenticated) that the requester is not registered.
    pub unknown_requester: u64,
    /// Dropped: does not parse.
    pub malformed: u64,
    /// Dropped: the MAC does not verify under the requester's key.
    pub bad_mac: u64,
    /// Dropped: an authentic request whose nonce the requester already used (recently).
    pub replayed: u64,
}

impl KdcCounters {
    /// All requests counted.
    pub fn total(&self) -> u64 {
        self.answered
            + self.unknown_principal
            + self.unknown_requester
            + self.malformed
            + self.bad_mac
            + self.replayed
    }
}

/// What happened to one request: for logs and tests. Holds names, never keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The requester got `π_{requester,principal}`.
    Answered {
        /// SL.
        requester: PrincipalName,
        /// A.
        principal: PrincipalName,
    },
    /// The requester was told (authenticated) that `principal` is not registered.
    UnknownPrincipal {
        /// SL.
        requester: PrincipalName,
        /// The name the KDC does not know.
        principal: PrincipalName,
    },
    /// The sender was told (unauthenticated) that `requester` is not registered.
    UnknownRequester {
        /// The name the request claimed.
        requester: PrincipalName,
    },
    /// Dropped: the bytes are not a request.
    Malformed(WireError),
    /// Dropped: the MAC does not verify under the claimed requester's key.
    BadMac {
        /// The name the request claimed.
        requester: PrincipalName,
    },
    /// Dropped: the requester's nonce was seen before.
    Replayed {
        /// SL.
        requester: PrincipalName,
    },
}

impl Outcome {
    /// Whether the KDC sent a response.
    pub fn replied(&self) -> bool {
        matches!(
            self,
            Outcome::Answered { .. }
                | Outcome::UnknownPrincipal { .. }
                | Outcome::UnknownRequester { .. }
        )
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Answered {
                requester,
                principal,
            } => write!(f, "answered: {requester} asked for {principal}"),
            Outcome::UnknownPrincipal {
                requester,
                principal,
            } => write!(
                f,
                "unknown principal: {requester} asked for {principal}, which is not registered"
            ),
            Outcome::UnknownRequester { requester } => write!(
                f,
                "unknown requester: {requester} is not registered (told so, unauthenticated)"
            ),
            Outcome::Malformed(e) => write!(f, "dropped, malformed: {e}"),
            Outcome::BadMac { requester } => {
                write!(f, "dropped, bad MAC: claims to be {requester}")
            }
            Outcome::Replayed { requester } => {
                write!(f, "dropped, replayed nonce: {requester}")
            }
        }
    }
}

/// The outcome of one request and the response to send back to its sender, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handled {
    /// What happened.
    pub outcome: Outcome,
    /// The datagram to send to the request's sender.
    pub reply: Option<Vec<u8>>,
}

/// Remembers the last `capacity` `(requester, nonce)` pairs.
#[derive(Debug)]
struct ReplayCache {
    capacity: usize,
    seen: HashSet<(PrincipalName, Nonce)>,
    order: VecDeque<(PrincipalName, Nonce)>,
}

impl ReplayCache {
    fn new(capacity: usize) -> Self {
        ReplayCache {
            capacity,
            seen: HashSet::new(),
            order: VecDeque::new(),
        }
    }

    /// Records the pair; false if it was already there.
    fn insert(&mut self, requester: PrincipalName, nonce: Nonce) -> bool {
        if self.capacity == 0 {
            return true;
        }
        if !self.seen.insert((requester, nonce)) {
            return false;
        }
        self.order.push_back((requester, nonce));
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
        true
    }
}

/// The key distribution center: the registry of principals, a replay cache and counters.
///
/// Sans-IO: the caller reads datagrams, hands each to [`Kdc::handle`] (or
/// [`Kdc::handle_request`]) and sends the reply, if any, back to the sender. No clock, no
/// randomness: the KDC's answers are a function of its registry and the request.
pub struct Kdc {
    provider: CryptoProvider,
    registry: Registry,
    replay: ReplayCache,
    counters: KdcCounters,
}

impl Kdc {
    /// A KDC serving `registry`, with a replay cache of [`DEFAULT_REPLAY_CAPACITY`].
    pub fn new(provider: CryptoProvider, registry: Registry) -> Kdc {
        Kdc::with_replay_capacity(provider, registry, DEFAULT_REPLAY_CAPACITY)
    }

    /// A KDC whose replay cache remembers `capacity` requests (0: no replay cache; every
    /// authentic request is answered, however often it is repeated).
    pub fn with_replay_capacity(
        provider: CryptoProvider,
        registry: Registry,
        capacity: usize,
    ) -> Kdc {
        Kdc {
            provider,
            registry,
            replay: ReplayCache::new(capacity),
            counters: KdcCounters::default(),
        }
    }

    /// The registered principals.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Replaces the registry (after the database changed); keeps the replay cache and the
    /// counters.
    pub fn replace_registry(&mut self, registry: Registry) {
        self.registry = registry;
    }

    /// What the KDC did so far.
    pub fn counters(&self) -> KdcCounters {
        self.counters
    }

    /// Handles one datagram from `from`; returns the response to send back to `from`.
    /// Never panics, whatever the bytes.
    pub fn handle_request(&mut self, from: SocketAddr, bytes: &[u8]) -> Option<Vec<u8>> {
        self.handle(from, bytes).reply
    }

    /// As [`Kdc::handle_request`], and says what happened. `from` is not used to decide
    /// anything yet: every check is on the request's content (the reply goes to `from`).
    pub fn handle(&mut self, _from: SocketAddr, bytes: &[u8]) -> Handled {
        let (outcome, reply) = self.decide(bytes);
        let c = &mut self.counters;
        match outcome {
            Outcome::Answered { .. } => c.answered += 1,
            Outcome::UnknownPrincipal { .. } => c.unknown_principal += 1,
            Outcome::UnknownRequester { .. } => c.unknown_requester += 1,
            Outcome::Malformed(_) => c.malformed += 1,
            Outcome::BadMac { .. } => c.bad_mac += 1,
            Outcome::Replayed { .. } => c.replayed += 1,
        }
        Handled { outcome, reply }
    }

    fn decide(&mut self, bytes: &[u8]) -> (Outcome, Option<Vec<u8>>) {
        let request = match Request::parse(bytes) {
            Ok(r) => r,
            Err(e) => return (Outcome::Malformed(e), None),
        };
        let body = request.body;
        let requester = body.requester;
        let Some(requester_key) = self.registry.get(&requester) else {
            // Smaller than the request (no MAC, one name), so never an amplifier.
            let mut reply = Vec::new();
            ResponseBody::UnknownRequester {
                requester,
                nonce: body.nonce,
            }
            .encode(&mut reply);
            return (Outcome::UnknownRequester { requester }, Some(reply));
        };
        if !MacKey::request(&self.provider, requester_key).verify(
            &self.provider,
            request.covered,
            &request.mac,
        ) {
            return (Outcome::BadMac { requester }, None);
        }
        if !self.replay.insert(requester, body.nonce) {
            return (Outcome::Replayed { requester }, None);
        }
        let principal = body.principal;
        let (outcome, response) = match self.registry.get(&principal) {
            Some(principal_key) => (
                Outcome::Answered {
                    requester,
                    principal,
                },
                ResponseBody::PairKey {
                    requester,
                    principal,
                    nonce: body.nonce,
                    pair_key: pair_key(
                        &self.provider,
                        &requester,
                        requester_key,
                        &principal,
                        principal_key,
                    ),
                },
            ),
            None => (
                Outcome::UnknownPrincipal {
                    requester,
                    principal,
                },
                ResponseBody::UnknownPrincipal {
                    requester,
                    principal,
                    nonce: body.nonce,
                },
            ),
        };
        let mut reply = Vec::with_capacity(crate::wire::MAX_RESPONSE_LEN);
        response.encode(&mut reply);
        let mac = MacKey::response(&self.provider, requester_key).tag(&self.provider, &reply);
        reply.extend_from_slice(&mac);
        (outcome, Some(reply))
    }
}

impl fmt::Debug for Kdc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kdc")
            .field("registry", &self.registry)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::PairKeyRequest;
    use crate::principal::PrincipalKey;
    use crate::wire::{Response, NONCE_LEN};
    use std::net::{IpAddr, Ipv4Addr};

    const FROM: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 4000);

    fn name(s: &str) -> PrincipalName {
        PrincipalName::new(s).unwrap()
    }

    fn setup(capacity: usize) -> (Kdc, PrincipalKey) {
        let mut r = Registry::new();
        let k_sl = PrincipalKey::from_bytes([1; 32]);
        r.insert(name("sl"), k_sl.clone());
        r.insert(name("alice"), PrincipalKey::from_bytes([2; 32]));
        (
            Kdc::with_replay_capacity(CryptoProvider::default_provider(), r, capacity),
            k_sl,
        )
    }

    fn request(k_sl: &PrincipalKey, a: &str, nonce: u8) -> PairKeyRequest {
        PairKeyRequest::new(
            &CryptoProvider::default_provider(),
            name("sl"),
            k_sl,
            name(a),
            [nonce; NONCE_LEN],
        )
        .unwrap()
    }

    #[test]
    fn each_outcome_moves_its_own_counter() {
        let (mut kdc, k_sl) = setup(4);
        let ok = request(&k_sl, "alice", 1);
        let h = kdc.handle(FROM, ok.bytes());
        assert_eq!(
            h.outcome,
            Outcome::Answered {
                requester: name("sl"),
                principal: name("alice")
            }
        );
        assert!(h.outcome.replied());
        ok.open_response(&h.reply.unwrap()).unwrap();
        assert_eq!(
            kdc.handle(FROM, ok.bytes()).outcome,
            Outcome::Replayed {
                requester: name("sl")
            }
        );

        let unknown = request(&k_sl, "mallory", 2);
        let h = kdc.handle(FROM, unknown.bytes());
        assert!(matches!(h.outcome, Outcome::UnknownPrincipal { .. }));
        assert!(h.reply.is_some());

        let mut forged = request(&k_sl, "alice", 3).bytes().to_vec();
        *forged.last_mut().unwrap() ^= 1;
        assert_eq!(
            kdc.handle(FROM, &forged).outcome,
            Outcome::BadMac {
                requester: name("sl")
            }
        );

        let stranger = PrincipalKey::from_bytes([5; 32]);
        let eve = PairKeyRequest::new(
            &CryptoProvider::default_provider(),
            name("eve"),
            &stranger,
            name("alice"),
            [4; NONCE_LEN],
        )
        .unwrap();
        let h = kdc.handle(FROM, eve.bytes());
        assert_eq!(
            h.outcome,
            Outcome::UnknownRequester {
                requester: name("eve")
            }
        );
        let reply = h.reply.unwrap();
        assert!(reply.len() < eve.bytes().len(), "no amplification");
        assert!(!Response::parse(&reply).unwrap().body.is_authenticated());

        assert!(matches!(
            kdc.handle(FROM, b"").outcome,
            Outcome::Malformed(WireError::Truncated)
        ));
        assert_eq!(
            kdc.counters(),
            KdcCounters {
                answered: 1,
                unknown_principal: 1,
                unknown_requester: 1,
                malformed: 1,
                bad_mac: 1,
                replayed: 1,
            }
        );
        assert_eq!(kdc.counters().total(), 6);
        let debug = format!("{kdc:?}");
        assert!(
            debug.contains("alice") && !debug.contains("0101"),
            "{debug}"
        );
    }

    #[test]
    fn the_replay_cache_is_bounded_and_can_be_off() {
        let (mut kdc, k_sl) = setup(2);
        let reqs: Vec<_> = (0..3).map(|i| request(&k_sl, "alice", i)).collect();
        for r in &reqs {
            assert!(kdc.handle_request(FROM, r.bytes()).is_some());
        }
        // The first was forgotten (capacity 2), the last two are remembered.
        assert!(kdc.handle_request(FROM, reqs[2].bytes()).is_none());
        assert!(kdc.handle_request(FROM, reqs[1].bytes()).is_none());
        assert!(kdc.handle_request(FROM, reqs[0].bytes()).is_some());
        assert_eq!(kdc.replay.order.len(), 2);
        assert_eq!(kdc.replay.seen.len(), 2);

        let (mut off, k_sl) = setup(0);
        let r = request(&k_sl, "alice", 9);
        assert!(off.handle_request(FROM, r.bytes()).is_some());
        assert!(off.handle_request(FROM, r.bytes()).is_some());
    }

    #[test]
    fn a_new_registry_takes_effect() {
        let (mut kdc, k_sl) = setup(8);
        let r = request(&k_sl, "bob", 1);
        assert!(matches!(
            kdc.handle(FROM, r.bytes()).outcome,
            Outcome::UnknownPrincipal { .. }
        ));
        let mut registry = kdc.registry().clone();
        registry.insert(name("bob"), PrincipalKey::from_bytes([3; 32]));
        kdc.replace_registry(registry);
        let r = request(&k_sl, "bob", 2);
        assert!(matches!(
            kdc.handle(FROM, r.bytes()).outcome,
            Outcome::Answered { .. }
        ));
    }

    #[test]
    fn outcomes_read_well_in_a_log() {
        let o = Outcome::UnknownPrincipal {
            requester: name("sl"),
            principal: name("mallory"),
        };
        assert_eq!(
            o.to_string(),
            "unknown principal: sl asked for mallory, which is not registered"
        );
        assert_eq!(
            Outcome::Malformed(WireError::Version(9)).to_string(),
            "dropped, malformed: unknown version 9"
        );
    }
}
