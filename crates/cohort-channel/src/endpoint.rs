//! The long-lived halves: a [`Client`] (its ephemeral key cache and session tickets) and a
//! [`Server`] (its resumption cache). Each hands out one [`Connection`] per connection;
//! cloning shares the caches, so one `Client` or `Server` serves many tasks.

use crate::config::{ClientConfig, ServerConfig};
use crate::connection::{AuthResult, ChannelError, Connection};
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
struct Ephemeral {
    share: KeyShare,
    created: Timestamp,
}

/// What a client keeps to resume a session: the next-session key, named by its
/// resumption ID.
pub(crate) struct Ticket {
    pub resume_id: [u8; 32],
    pub next: Secret,
    pub auth: AuthResult,
    created: Timestamp,
}

pub(crate) struct ClientInner {
    pub provider: CryptoProvider,
    pub config: ClientConfig,
    ephemeral: Mutex<Option<Ephemeral>>,
    tickets: Mutex<HashMap<String, Ticket>>,
}

/// The client side: configuration plus caches. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// Client tickets older than this are not offered (the server's lifetime may be shorter).
const CLIENT_TICKET_LIFETIME_NANOS: u64 = 3600 * 1_000_000_000;

impl Client {
    /// A client with `config`.
    pub fn new(provider: CryptoProvider, config: ClientConfig) -> Self {
        Client {
            inner: Arc::new(ClientInner {
                provider,
                config,
                ephemeral: Mutex::new(None),
                tickets: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// Starts a connection to the server known as `server_name` (the key under which its
    /// session is cached for resumption). `rng` supplies the nonce.
    pub fn connect(
        &self,
        now: Timestamp,
        rng: &mut dyn rand_core::RngCore,
        server_name: &str,
    ) -> Result<Connection, ChannelError> {
        Connection::client(self.clone(), now, rng, server_name)
    }

    /// Whether a ticket for `server_name` is cached.
    pub fn has_ticket(&self, server_name: &str) -> bool {
        lock(&self.inner.tickets).contains_key(server_name)
    }

    /// Erases tickets older than an hour and an ephemeral key pair past its lifetime (they
    /// are also checked whenever used; a driver calls this on a timer).
    pub fn expire(&self, now: Timestamp) {
        lock(&self.inner.tickets).retain(|_, t| {
            now.saturating_duration_since(t.created).as_nanos()
                < u128::from(CLIENT_TICKET_LIFETIME_NANOS)
        });
        let lifetime = self.inner.config.ephemeral_lifetime;
        let mut slot = lock(&self.inner.ephemeral);
        if slot
            .as_ref()
            .is_some_and(|e| now.saturating_duration_since(e.created) >= lifetime)
        {
            *slot = None;
        }
    }

    /// Forgets every ticket and the ephemeral key pair.
    pub fn clear_caches(&self) {
        lock(&self.inner.tickets).clear();
        *lock(&self.inner.ephemeral) = None;
    }

    /// The ephemeral key pair for the preferred suite: the cached one if still fresh, else
    /// a new one (the expensive step for RSA, done by the client as tcpcrypt intends).
    pub(crate) fn ephemeral(&self, now: Timestamp) -> Result<KeyShare, ChannelError> {
        let suite = *self
            .inner
            .config
            .kems
            .first()
            .ok_or(ChannelError::NoCommonSuite)?;
        let lifetime = self.inner.config.ephemeral_lifetime;
        let mut slot = lock(&self.inner.ephemeral);
        if let Some(e) = slot.as_ref() {
            if e.share.suite == suite && now.saturating_duration_since(e.created) < lifetime {
                return Ok(e.share.clone());
            }
        }
        let kem = self
            .inner
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

    /// Takes (single use) the ticket for `server_name` if it suits the configured mode.
    pub(crate) fn take_ticket(&self, now: Timestamp, server_name: &str) -> Option<Ticket> {
        if !self.inner.config.resumption {
            return None;
        }
        let t = lock(&self.inner.tickets).remove(server_name)?;
        let fresh = now.saturating_duration_since(t.created).as_nanos()
            < u128::from(CLIENT_TICKET_LIFETIME_NANOS);
        (fresh && t.auth.mode == self.inner.config.auth.mode()).then_some(t)
    }

    pub(crate) fn store_ticket(
        &self,
        now: Timestamp,
        server_name: &str,
        resume_id: [u8; 32],
        next: Secret,
        auth: AuthResult,
    ) {
        if self.inner.config.resumption {
            let t = Ticket {
                resume_id,
                next,
                auth,
                created: now,
            };
            lock(&self.inner.tickets).insert(server_name.to_owned(), t);
        }
    }
}

/// A server's cached session.
pub(crate) struct CachedSession {
    pub next: Secret,
    pub auth: AuthResult,
    created: Timestamp,
}

#[derive(Default)]
struct ResumptionCache {
    entries: HashMap<[u8; 32], CachedSession>,
    order: VecDeque<([u8; 32], Timestamp)>,
}

pub(crate) struct ServerInner {
    pub provider: CryptoProvider,
    pub config: ServerConfig,
    cache: Mutex<ResumptionCache>,
    /// Server nonces: ChaCha20 keyed once from the provider's randomness. Asking the
    /// operating system per connection costs more than the rest of a resumption.
    nonces: Mutex<ChaCha20Rng>,
}

/// The server side: configuration plus the resumption cache. Cheap to clone.
#[derive(Clone)]
pub struct Server {
    pub(crate) inner: Arc<ServerInner>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// A server with `config`. Its nonce generator is seeded from the provider's
    /// randomness; see [`Server::with_seed`] for simulations.
    ///
    /// # Panics
    /// If the provider cannot supply randomness (the OS generator failed).
    pub fn new(provider: CryptoProvider, config: ServerConfig) -> Self {
        let mut seed = [0u8; 32];
        // Failure of the OS generator leaves the seed zero; nonces would then repeat
        // across restarts, so treat it as fatal for the process.
        #[allow(clippy::expect_used)] // reason: a server cannot go on safely without randomness
        provider
            .random
            .fill(&mut seed)
            .expect("operating-system randomness");
        Self::with_seed(provider, config, seed)
    }

    /// A server whose nonces come from ChaCha20 keyed with `seed` (deterministic: for tests
    /// and the simulator; a real server uses [`Server::new`]).
    pub fn with_seed(provider: CryptoProvider, config: ServerConfig, seed: [u8; 32]) -> Self {
        Server {
            inner: Arc::new(ServerInner {
                provider,
                config,
                cache: Mutex::new(ResumptionCache::default()),
                nonces: Mutex::new(ChaCha20Rng::from_seed(seed)),
            }),
        }
    }

    /// A fresh server nonce.
    pub(crate) fn nonce(&self) -> [u8; 32] {
        let mut n = [0u8; 32];
        lock(&self.inner.nonces).fill_bytes(&mut n);
        n
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.inner.config
    }

    /// A connection waiting for a ClientHello.
    pub fn accept(&self) -> Connection {
        Connection::server(self.clone())
    }

    /// How many sessions are cached.
    pub fn cached_sessions(&self) -> usize {
        lock(&self.inner.cache).entries.len()
    }

    /// Erases every cached session older than the configured lifetime. The cache also
    /// expires entries whenever it is used; a driver calls this on a timer so that keys do
    /// not outlive their lifetime on a server that has gone quiet.
    pub fn expire_sessions(&self, now: Timestamp) {
        let mut cache = lock(&self.inner.cache);
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
        let mut cache = lock(&self.inner.cache);
        self.expire(&mut cache, now);
        let entry = cache.entries.remove(resume_id)?;
        // Checked here too, not only by `expire`, which relies on insertion order.
        let fresh =
            now.saturating_duration_since(entry.created) < self.inner.config.resumption_lifetime;
        (fresh && entry.auth.mode == mode).then_some(entry)
    }

    pub(crate) fn store_session(
        &self,
        now: Timestamp,
        resume_id: [u8; 32],
        next: Secret,
        auth: AuthResult,
    ) {
        let cap = self.inner.config.resumption_capacity;
        if cap == 0 {
            return;
        }
        let mut cache = lock(&self.inner.cache);
        self.expire(&mut cache, now);
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
            let ResumptionCache { entries, order } = &mut *cache;
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
        let lifetime = self.inner.config.resumption_lifetime;
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
