//! The state the long-lived endpoints share with their connections: a client's ephemeral key
//! pair and session tickets ([`ClientInner`]), a server's resumption cache and nonce generator
//! ([`ServerInner`]). Owns the caches and their expiry rules. Used by `connection` (which
//! takes and stores entries during a handshake) and wrapped by `endpoint` (which hands out
//! connections); must not reach up into either.

use crate::config::{ClientConfig, ServerConfig};
use crate::messages::MAX_TICKETS;
use crate::outcome::{AuthResult, ChannelError};
use crate::schedule::TicketKey;
use crate::suite::{AuthMode, KemSuite};
use cohort_core::Timestamp;
use cohort_crypto::{CryptoProvider, Secret};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

/// Locks, recovering from a poisoned lock (the caches stay consistent at every step).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A client's ephemeral KEM key pair. Shared by the connections that use it.
#[derive(Clone)]
pub(crate) struct KeyShare {
    pub suite: KemSuite,
    pub secret: Arc<Secret>,
    pub public: Arc<Vec<u8>>,
}

/// The cached key pair, reused for `ephemeral_lifetime`.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
struct Ephemeral {
    share: KeyShare,
    created: Timestamp,
}

/// What a client keeps to resume a session: the next-session key, named by its
/// resumption ID. `Clone` only under the `fuzzing` feature ([`ClientInner::fork`]).
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(crate) struct Ticket {
    pub resume_id: [u8; 32],
    pub next: Secret,
    pub auth: AuthResult,
    created: Timestamp,
}

/// A client's configuration and caches, shared by the `Client` handle and its connections.
pub(crate) struct ClientInner {
    pub provider: CryptoProvider,
    pub config: ClientConfig,
    ephemeral: Mutex<Option<Ephemeral>>,
    /// Per server name, a pool of single-use tickets, oldest first (at most
    /// `config.ticket_pool`).
    tickets: Mutex<HashMap<String, VecDeque<Ticket>>>,
}

/// Client tickets older than this are not offered (the server's lifetime may be shorter).
const CLIENT_TICKET_LIFETIME_NANOS: u64 = 3600 * 1_000_000_000;

impl ClientInner {
    /// Empty caches for `config`.
    pub(crate) fn new(provider: CryptoProvider, config: ClientConfig) -> Self {
        ClientInner {
            provider,
            config,
            ephemeral: Mutex::new(None),
            tickets: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a ticket for `server_name` is cached.
    pub(crate) fn has_ticket(&self, server_name: &str) -> bool {
        self.tickets_for(server_name) > 0
    }

    /// How many tickets for `server_name` are cached.
    pub(crate) fn tickets_for(&self, server_name: &str) -> usize {
        lock(&self.tickets)
            .get(server_name)
            .map_or(0, VecDeque::len)
    }

    /// Erases tickets older than an hour and an ephemeral key pair past its lifetime.
    pub(crate) fn expire(&self, now: Timestamp) {
        lock(&self.tickets).retain(|_, pool| {
            pool.retain(|t| {
                now.saturating_duration_since(t.created).as_nanos()
                    < u128::from(CLIENT_TICKET_LIFETIME_NANOS)
            });
            !pool.is_empty()
        });
        let lifetime = self.config.ephemeral_lifetime;
        let mut slot = lock(&self.ephemeral);
        if slot
            .as_ref()
            .is_some_and(|e| now.saturating_duration_since(e.created) >= lifetime)
        {
            *slot = None;
        }
    }

    /// Forgets every ticket and the ephemeral key pair.
    pub(crate) fn clear_caches(&self) {
        lock(&self.tickets).clear();
        *lock(&self.ephemeral) = None;
    }

    /// The ephemeral key pair for the preferred suite: the cached one if still fresh, else
    /// a new one (the expensive step for RSA, done by the client as tcpcrypt intends).
    pub(crate) fn ephemeral(&self, now: Timestamp) -> Result<KeyShare, ChannelError> {
        let suite = *self
            .config
            .kems
            .first()
            .ok_or(ChannelError::NoCommonSuite)?;
        let lifetime = self.config.ephemeral_lifetime;
        let mut slot = lock(&self.ephemeral);
        if let Some(e) = slot.as_ref() {
            if e.share.suite == suite && now.saturating_duration_since(e.created) < lifetime {
                return Ok(e.share.clone());
            }
        }
        let kem = self
            .provider
            .kem(suite.algorithm())
            .ok_or(ChannelError::NoCommonSuite)?;
        let (secret, public) = kem.generate().map_err(|_| ChannelError::Crypto)?;
        let share = KeyShare {
            suite,
            secret: Arc::new(secret),
            public: Arc::new(public),
        };
        if !lifetime.is_zero() {
            *slot = Some(Ephemeral {
                share: share.clone(),
                created: now,
            });
        }
        Ok(share)
    }

    /// Takes (single use) the oldest ticket for `server_name` that suits the configured
    /// mode, erasing stale ones on the way, and says how many tickets to ask the new session
    /// for: enough to refill the pool, at least one (0 with resumption off).
    ///
    /// Oldest first: the server caches a session's tickets only when the client's
    /// ClientFinished arrives, so the newest tickets may not be known there yet when another
    /// connection's ClientHello races ahead of that message.
    pub(crate) fn take_ticket(&self, now: Timestamp, server_name: &str) -> (Option<Ticket>, u8) {
        let target = self.config.ticket_pool.min(MAX_TICKETS);
        if !self.config.resumption || target == 0 {
            return (None, 0);
        }
        let mut tickets = lock(&self.tickets);
        let Some(pool) = tickets.get_mut(server_name) else {
            return (None, target);
        };
        let mut found = None;
        while let Some(t) = pool.pop_front() {
            let fresh = now.saturating_duration_since(t.created).as_nanos()
                < u128::from(CLIENT_TICKET_LIFETIME_NANOS);
            if fresh && t.auth.mode == self.config.auth.mode() {
                found = Some(t);
                break;
            }
        }
        let left = pool.len();
        if pool.is_empty() {
            tickets.remove(server_name);
        }
        let want = usize::from(target).saturating_sub(left).max(1);
        (found, u8::try_from(want).unwrap_or(target))
    }

    /// Adds the tickets a session yielded to the pool for `server_name` (if resumption is
    /// on); beyond the pool's size, the new ones that do not fit are dropped (the oldest are
    /// the ones surely cached by the server).
    pub(crate) fn store_tickets(
        &self,
        now: Timestamp,
        server_name: &str,
        new: Vec<TicketKey>,
        auth: AuthResult,
    ) {
        let cap = usize::from(self.config.ticket_pool.min(MAX_TICKETS));
        if !self.config.resumption || cap == 0 || new.is_empty() {
            return;
        }
        let mut tickets = lock(&self.tickets);
        let pool = tickets.entry(server_name.to_owned()).or_default();
        for t in new {
            pool.push_back(Ticket {
                resume_id: t.resume_id,
                next: t.key,
                auth,
                created: now,
            });
        }
        pool.truncate(cap);
    }
}

/// A server's cached session.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(crate) struct CachedSession {
    pub next: Secret,
    pub auth: AuthResult,
    created: Timestamp,
}

#[derive(Default)]
#[cfg_attr(feature = "fuzzing", derive(Clone))]
struct ResumptionCache {
    entries: HashMap<[u8; 32], CachedSession>,
    order: VecDeque<([u8; 32], Timestamp)>,
}

/// A server's configuration, resumption cache and nonce generator, shared by the `Server`
/// handle and its connections.
pub(crate) struct ServerInner {
    pub provider: CryptoProvider,
    pub config: ServerConfig,
    cache: Mutex<ResumptionCache>,
    /// Server nonces: ChaCha20 keyed once from the provider's randomness. Asking the
    /// operating system per connection costs more than the rest of a resumption.
    nonces: Mutex<ChaCha20Rng>,
}

impl ServerInner {
    /// An empty cache for `config`, nonces from ChaCha20 keyed with `seed`.
    pub(crate) fn new(provider: CryptoProvider, config: ServerConfig, seed: [u8; 32]) -> Self {
        ServerInner {
            provider,
            config,
            cache: Mutex::new(ResumptionCache::default()),
            nonces: Mutex::new(ChaCha20Rng::from_seed(seed)),
        }
    }

    /// A fresh server nonce.
    pub(crate) fn nonce(&self) -> [u8; 32] {
        let mut n = [0u8; 32];
        lock(&self.nonces).fill_bytes(&mut n);
        n
    }

    /// How many sessions are cached.
    pub(crate) fn cached_sessions(&self) -> usize {
        lock(&self.cache).entries.len()
    }

    /// Erases every cached session older than the configured lifetime.
    pub(crate) fn expire_sessions(&self, now: Timestamp) {
        let mut cache = lock(&self.cache);
        self.expire(&mut cache, now);
    }

    /// Removes and returns the cached session `resume_id` if it exists, is fresh, and was
    /// authenticated with `mode`. A session is resumable once: its key is erased on use.
    pub(crate) fn take_session(
        &self,
        now: Timestamp,
        resume_id: &[u8; 32],
        mode: AuthMode,
    ) -> Option<CachedSession> {
        let mut cache = lock(&self.cache);
        self.expire(&mut cache, now);
        let entry = cache.entries.remove(resume_id)?;
        // Checked here too, not only by `expire`, which relies on insertion order.
        let fresh = now.saturating_duration_since(entry.created) < self.config.resumption_lifetime;
        (fresh && entry.auth.mode == mode).then_some(entry)
    }

    /// How many tickets a session issues to a client that asks for `asked`: at most the
    /// configured number and at most the cache's capacity (more would evict the session's
    /// own first tickets), none when the cache is off.
    pub(crate) fn tickets_to_issue(&self, asked: u8) -> u8 {
        let fits = u8::try_from(self.config.resumption_capacity).unwrap_or(u8::MAX);
        asked
            .min(self.config.max_tickets)
            .min(MAX_TICKETS)
            .min(fits)
    }

    /// Caches a session's tickets for resumption (each resumable once), evicting the oldest
    /// beyond the capacity.
    pub(crate) fn store_sessions(&self, now: Timestamp, tickets: Vec<TicketKey>, auth: AuthResult) {
        if self.config.resumption_capacity == 0 || tickets.is_empty() {
            return;
        }
        let mut cache = lock(&self.cache);
        self.expire(&mut cache, now);
        for t in tickets {
            self.store_one(&mut cache, now, t.resume_id, t.key, auth);
        }
    }

    /// Caches one ticket under the lock, evicting the oldest beyond the capacity.
    fn store_one(
        &self,
        cache: &mut ResumptionCache,
        now: Timestamp,
        resume_id: [u8; 32],
        next: Secret,
        auth: AuthResult,
    ) {
        let cap = self.config.resumption_capacity;
        while cache.entries.len() >= cap {
            match cache.order.pop_front() {
                Some((id, _)) => {
                    cache.entries.remove(&id);
                }
                None => break,
            }
        }
        if cache.order.len() >= cap.saturating_mul(2) {
            // Drop the ids of sessions already resumed, so `order` stays bounded.
            let ResumptionCache { entries, order } = cache;
            order.retain(|(id, _)| entries.contains_key(id));
        }
        cache.order.push_back((resume_id, now));
        cache.entries.insert(
            resume_id,
            CachedSession {
                next,
                auth,
                created: now,
            },
        );
    }

    fn expire(&self, cache: &mut ResumptionCache, now: Timestamp) {
        let lifetime = self.config.resumption_lifetime;
        // `order` may hold ids already taken; skip them. Entries are in insertion order.
        while let Some(&(id, created)) = cache.order.front() {
            let stale = now.saturating_duration_since(created) >= lifetime;
            let gone = !cache.entries.contains_key(&id);
            if !(stale || gone) {
                break;
            }
            cache.order.pop_front();
            if stale {
                if let Some(e) = cache.entries.get(&id) {
                    if e.created == created {
                        cache.entries.remove(&id);
                    }
                }
            }
        }
    }
}

/// Deep copies of the caches, for the fuzz harnesses only (see `Connection::fork`): the copy
/// holds its own tickets, ephemeral key slot, resumption cache and nonce generator (in the
/// same state), so using one leaves the other as it was.
#[cfg(feature = "fuzzing")]
impl ClientInner {
    pub(crate) fn fork(&self) -> ClientInner {
        ClientInner {
            provider: self.provider,
            config: self.config.clone(),
            ephemeral: Mutex::new(lock(&self.ephemeral).clone()),
            tickets: Mutex::new(lock(&self.tickets).clone()),
        }
    }
}

#[cfg(feature = "fuzzing")]
impl ServerInner {
    pub(crate) fn fork(&self) -> ServerInner {
        ServerInner {
            provider: self.provider,
            config: self.config.clone(),
            cache: Mutex::new(lock(&self.cache).clone()),
            nonces: Mutex::new(lock(&self.nonces).clone()),
        }
    }
}

#[cfg(all(test, feature = "fuzzing"))]
mod fork_tests {
    #![allow(clippy::unwrap_used)] // reason: test code
    use super::*;
    use crate::config::ClientAuth;

    fn auth() -> AuthResult {
        AuthResult {
            mode: AuthMode::None,
            server_key: None,
            resumed: false,
        }
    }

    fn tickets(first: u8) -> Vec<TicketKey> {
        (first..first + 3)
            .map(|i| TicketKey {
                resume_id: [i; 32],
                key: Secret::from_slice(&[i; 32]),
            })
            .collect()
    }

    /// A forked server draws the nonces the original would have drawn next, and drawing
    /// them leaves the original's generator where it was; its resumption cache is a copy.
    #[test]
    fn a_forked_server_copies_its_nonces_and_cache_and_shares_neither() {
        let now = Timestamp::from_millis(5);
        let p = CryptoProvider::default_provider();
        let server = ServerInner::new(p, ServerConfig::new(), [7; 32]);
        let _ = server.nonce();
        server.store_sessions(now, tickets(1), auth());
        let fork = server.fork();
        let drawn: Vec<_> = (0..3).map(|_| fork.nonce()).collect();
        assert!(fork.take_session(now, &[1; 32], AuthMode::None).is_some());
        assert_eq!(server.nonce(), drawn[0], "the original did not move on");
        assert_eq!(server.nonce(), drawn[1]);
        assert_eq!(server.cached_sessions(), 3);
        assert_eq!(fork.cached_sessions(), 2);
        assert!(server.take_session(now, &[1; 32], AuthMode::None).is_some());
    }

    /// A forked client has the original's tickets, and taking them leaves the original's.
    #[test]
    fn a_forked_client_copies_its_tickets_and_shares_none() {
        let now = Timestamp::from_millis(5);
        let p = CryptoProvider::default_provider();
        let client = ClientInner::new(p, ClientConfig::new(ClientAuth::None));
        client.store_tickets(now, "s", tickets(1), auth());
        let fork = client.fork();
        assert_eq!(fork.tickets_for("s"), 3);
        let (t, _) = fork.take_ticket(now, "s");
        assert_eq!(t.unwrap().resume_id, [1; 32]);
        fork.store_tickets(now, "t", tickets(9), auth());
        assert_eq!(client.tickets_for("s"), 3);
        assert_eq!(client.tickets_for("t"), 0);
        let (t, _) = client.take_ticket(now, "s");
        assert_eq!(t.unwrap().resume_id, [1; 32]);
    }
}
