//! The long-lived halves: a [`Client`] (its ephemeral key cache and session tickets) and a
//! [`Server`] (its resumption cache). Each hands out one [`Connection`] per connection;
//! cloning shares the caches, so one `Client` or `Server` serves many tasks.
//!
//! Owns the public handles only; the caches themselves live in `cache`, below both this
//! module and `connection`, so that a connection never reaches up into its endpoint.

use crate::cache::{ClientInner, ServerInner};
use crate::config::{ClientConfig, ServerConfig};
use crate::connection::Connection;
use crate::outcome::ChannelError;
use cohort_core::Timestamp;
use cohort_crypto::CryptoProvider;
use std::sync::Arc;

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

impl Client {
    /// A client with `config`.
    pub fn new(provider: CryptoProvider, config: ClientConfig) -> Self {
        Client {
            inner: Arc::new(ClientInner::new(provider, config)),
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
        Connection::client(Arc::clone(&self.inner), now, rng, server_name)
    }

    /// Whether a ticket for `server_name` is cached.
    pub fn has_ticket(&self, server_name: &str) -> bool {
        self.inner.has_ticket(server_name)
    }

    /// How many single-use tickets for `server_name` are cached.
    pub fn tickets(&self, server_name: &str) -> usize {
        self.inner.tickets_for(server_name)
    }

    /// Erases tickets older than an hour and an ephemeral key pair past its lifetime (they
    /// are also checked whenever used; a driver calls this on a timer).
    pub fn expire(&self, now: Timestamp) {
        self.inner.expire(now);
    }

    /// Forgets every ticket and the ephemeral key pair.
    pub fn clear_caches(&self) {
        self.inner.clear_caches();
    }
}

#[cfg(feature = "fuzzing")]
impl Client {
    /// A client with copies of this one's configuration and caches (tickets, ephemeral key
    /// pair), not shared with it: for the fuzz harnesses only (`fuzzing` feature). Cloning
    /// a `Client` shares its caches; a harness that copies a formed pair per input must not.
    pub fn fork(&self) -> Client {
        Client {
            inner: Arc::new(self.inner.fork()),
        }
    }
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
            inner: Arc::new(ServerInner::new(provider, config, seed)),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.inner.config
    }

    /// A connection waiting for a ClientHello.
    pub fn accept(&self) -> Connection {
        Connection::server(Arc::clone(&self.inner))
    }

    /// How many sessions are cached.
    pub fn cached_sessions(&self) -> usize {
        self.inner.cached_sessions()
    }

    /// Erases every cached session older than the configured lifetime. The cache also
    /// expires entries whenever it is used; a driver calls this on a timer so that keys do
    /// not outlive their lifetime on a server that has gone quiet.
    pub fn expire_sessions(&self, now: Timestamp) {
        self.inner.expire_sessions(now);
    }
}

#[cfg(feature = "fuzzing")]
impl Server {
    /// A server with copies of this one's configuration, resumption cache and nonce
    /// generator (in the same state), not shared with it: for the fuzz harnesses only
    /// (`fuzzing` feature), like [`Client::fork`].
    pub fn fork(&self) -> Server {
        Server {
            inner: Arc::new(self.inner.fork()),
        }
    }
}
