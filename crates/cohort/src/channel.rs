//! Secure channels over TCP: a [`Connector`] for clients, an [`Acceptor`] for servers and a
//! [`Listener`] that accepts and authenticates connections, each handing out a
//! [`SecureStream`] (`AsyncRead + AsyncWrite` plaintext, with the session ID and the
//! authentication result).
//!
//! This module owns the facade's configuration of `cohort-channel` (identity, trust,
//! suites, resumption) and the accept loop; the stream itself and its handshake driver are
//! `cohort_net::stream`'s.
//!
//! ```text
//!   Connector::builder(auth) ─build─▶ Connector ──connect(addr)──▶ SecureStream
//!   Acceptor::builder() ─build─▶ Acceptor ──accept(tcp)──▶ SecureStream
//!   Listener::bind(addr, acceptor) ─▶ accept task ─▶ one handshake task per connection
//!                                        (timeout, cap)   └─▶ Accepted { stream, peer } ─▶ accept()
//! ```
//!
//! A secure echo on loopback:
//!
//! ```
//! use cohort::channel::{Acceptor, Connector, ClientAuth, Listener};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let mut listener = Listener::bind("127.0.0.1:0".parse().unwrap(), Acceptor::builder().build()?).await?;
//! let addr = listener.local_addr()?;
//! tokio::spawn(async move {
//!     while let Ok(mut accepted) = listener.accept().await {
//!         tokio::spawn(async move {
//!             let mut buf = Vec::new();
//!             accepted.stream.read_to_end(&mut buf).await?;
//!             accepted.stream.write_all(&buf).await?;
//!             accepted.stream.shutdown().await
//!         });
//!     }
//! });
//! let connector = Connector::builder(ClientAuth::None).build();
//! let mut stream = connector.connect(&addr.to_string()).await?;
//! stream.write_all(b"hello").await?;
//! stream.shutdown().await?; // sends the close record
//! let mut echoed = Vec::new();
//! stream.read_to_end(&mut echoed).await?;
//! assert_eq!(echoed, b"hello");
//! # Ok(())
//! # }
//! ```

use cohort_channel::batch::BatchConfig;
use cohort_channel::config::MIN_PSK_LEN;
use cohort_channel::{Client, ClientConfig, Server, ServerConfig};
use cohort_crypto::{CryptoProvider, Secret};
use cohort_net::stream::{self as net, BatchService};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

pub use cohort_channel::identity::{Identity, PublicKey};
pub use cohort_channel::SessionInfo;
pub use cohort_channel::{AuthMode, AuthResult, ChannelError, ClientAuth, KemSuite, SessionId};
pub use cohort_net::stream::{as_channel_error, SecureStream, HANDSHAKE_TIMEOUT};

/// How a handshake went, for counting: a full key exchange or a resumption.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HandshakeKind {
    /// A full handshake (a KEM exchange).
    Full,
    /// A resumed session (no KEM; it inherits its predecessor's authentication).
    Resumed,
}

impl HandshakeKind {
    /// Which kind `stream`'s handshake was.
    pub fn of(stream: &SecureStream) -> HandshakeKind {
        match stream.session() {
            Some(info) if info.auth.resumed => HandshakeKind::Resumed,
            _ => HandshakeKind::Full,
        }
    }

    /// `full` or `resumed`.
    pub fn name(self) -> &'static str {
        match self {
            HandshakeKind::Full => "full",
            HandshakeKind::Resumed => "resumed",
        }
    }
}

/// A short, stable word for why a handshake failed (a metrics label): the channel's error
/// (`authentication_failed`, `not_cohort`, ...), `timeout`, or `io`.
pub fn failure_reason(e: &io::Error) -> &'static str {
    if let Some(c) = as_channel_error(e) {
        return match c {
            ChannelError::NotCohort => "not_cohort",
            ChannelError::Message(_) => "malformed",
            ChannelError::UnexpectedFrame(_) => "unexpected_frame",
            ChannelError::PeerAlert(_) => "peer_alert",
            ChannelError::NoCommonSuite => "no_common_suite",
            ChannelError::BadChoice(_) => "bad_choice",
            ChannelError::BadKeyShare => "bad_key_share",
            ChannelError::KeyConfirmationFailed => "key_confirmation_failed",
            ChannelError::AuthenticationFailed => "authentication_failed",
            ChannelError::Record(_) => "record",
            ChannelError::Truncated => "truncated",
            _ => "other",
        };
    }
    match e.kind() {
        io::ErrorKind::TimedOut => "timeout",
        io::ErrorKind::UnexpectedEof => "truncated",
        _ => "io",
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

fn check_psk(psk: &Secret) -> io::Result<()> {
    if psk.expose().len() < MIN_PSK_LEN {
        return Err(invalid(format!(
            "a PSK needs at least {MIN_PSK_LEN} random bytes (it was {}); use a password for human-chosen secrets",
            psk.expose().len()
        )));
    }
    Ok(())
}

/// Builds a [`Connector`]: the authentication the client requires, the KEM suites it
/// offers, and whether it resumes sessions.
#[derive(Debug)]
pub struct ConnectorBuilder {
    config: ClientConfig,
}

impl ConnectorBuilder {
    /// Offer only `kem` (default: every suite, the hybrid X25519+ML-KEM-768 first).
    pub fn kem(mut self, kem: KemSuite) -> Self {
        self.config = self.config.with_kem(kem);
        self
    }

    /// Offer these suites, preference first.
    pub fn kems(mut self, kems: Vec<KemSuite>) -> Self {
        self.config.kems = kems;
        self
    }

    /// Cache sessions and resume them (default: on).
    pub fn resumption(mut self, on: bool) -> Self {
        self.config.resumption = on;
        self
    }

    /// How long one ephemeral key pair serves successive full handshakes (default 30 s);
    /// zero makes a fresh key pair for every connection.
    pub fn ephemeral_lifetime(mut self, lifetime: std::time::Duration) -> Self {
        self.config.ephemeral_lifetime = lifetime;
        self
    }

    /// The client, with the operating system's randomness and the default crypto provider.
    pub fn build(self) -> Connector {
        Connector {
            client: Client::new(CryptoProvider::default_provider(), self.config),
        }
    }
}

/// A channel client: connects to servers and caches their sessions for resumption.
/// Cheap to clone (clones share the cache).
#[derive(Clone, Debug)]
pub struct Connector {
    client: Client,
}

impl Connector {
    /// A builder requiring `auth` of the server: [`ClientAuth::None`] (encryption only;
    /// compare session IDs out of band), `ServerSignature { pinned }`, `Psk` or `Password`.
    pub fn builder(auth: ClientAuth) -> ConnectorBuilder {
        ConnectorBuilder {
            config: ClientConfig::new(auth),
        }
    }

    /// Connects over TCP to `addr` (`HOST:PORT`) and runs the handshake; `addr` also names
    /// the server's cached session.
    pub async fn connect(&self, addr: &str) -> io::Result<SecureStream> {
        let tcp = TcpStream::connect(addr).await?;
        let _ = tcp.set_nodelay(true);
        self.connect_tcp(tcp, addr).await
    }

    /// Runs the handshake over an established TCP connection to the server known as
    /// `server_name` (the key for its cached session).
    pub async fn connect_tcp(&self, tcp: TcpStream, server_name: &str) -> io::Result<SecureStream> {
        self.client.expire(net::now());
        net::connect(&self.client, tcp, server_name).await
    }

    /// Erases expired session tickets and their resumption keys. Each connect does it too;
    /// a client that may sit idle should also call it now and then (once a minute), so that
    /// expired keys do not stay in memory.
    pub fn expire_sessions(&self) {
        self.client.expire(net::now());
    }

    /// The sans-IO client inside.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

/// Builds an [`Acceptor`]: the server's identity, the authentication modes it accepts, its
/// secrets and its session cache.
#[derive(Debug, Default)]
pub struct AcceptorBuilder {
    identity: Option<Identity>,
    modes: Vec<AuthMode>,
    psk: Option<Secret>,
    password: Option<Secret>,
    kems: Option<Vec<KemSuite>>,
    resumption_capacity: Option<usize>,
}

impl AcceptorBuilder {
    /// The server's Ed25519 identity: enables `signature` authentication (its session IDs
    /// are signed in batches).
    pub fn identity(mut self, identity: Identity) -> Self {
        self.identity = Some(identity);
        self
    }

    /// The modes accepted. Default: `signature` and `none` with an identity, else `none`.
    pub fn auth_modes(mut self, modes: Vec<AuthMode>) -> Self {
        self.modes = modes;
        self
    }

    /// The pre-shared key for `psk` (at least 32 random bytes).
    pub fn psk(mut self, psk: Secret) -> Self {
        self.psk = Some(psk);
        self
    }

    /// The password for `password` (SPAKE2: one online guess per handshake).
    pub fn password(mut self, password: Secret) -> Self {
        self.password = Some(password);
        self
    }

    /// The KEM suites accepted (default: all).
    pub fn kems(mut self, kems: Vec<KemSuite>) -> Self {
        self.kems = Some(kems);
        self
    }

    /// Sessions kept for resumption (0 turns resumption off).
    pub fn resumption_capacity(mut self, sessions: usize) -> Self {
        self.resumption_capacity = Some(sessions);
        self
    }

    /// Checks the configuration and builds the server. With an identity this starts the
    /// batch signer, so it must run inside a tokio runtime. An `InvalidInput` error says
    /// what is missing (a mode without its secret, a short PSK).
    pub fn build(self) -> io::Result<Acceptor> {
        let provider = CryptoProvider::default_provider();
        let mut config = ServerConfig::new();
        config.auth_modes = if self.modes.is_empty() {
            if self.identity.is_some() {
                vec![AuthMode::ServerSignature, AuthMode::None]
            } else {
                vec![AuthMode::None]
            }
        } else {
            self.modes
        };
        config.identity = self.identity.as_ref().map(Identity::public);
        if let Some(psk) = &self.psk {
            check_psk(psk)?;
        }
        config.psk = self.psk;
        config.password = self.password;
        if let Some(kems) = self.kems {
            config.kems = kems;
        }
        if let Some(n) = self.resumption_capacity {
            config.resumption_capacity = n;
        }
        for mode in &config.auth_modes {
            if !config.supports(*mode) {
                let need = match mode {
                    AuthMode::ServerSignature => "an identity",
                    AuthMode::Psk => "a PSK",
                    AuthMode::Password => "a password",
                    AuthMode::None => "nothing",
                };
                return Err(invalid(format!("auth mode {mode} needs {need}")));
            }
        }
        let signer = self
            .identity
            .map(|id| BatchService::spawn(provider, id, BatchConfig::default()));
        Ok(Acceptor {
            server: Server::new(provider, config),
            signer,
        })
    }
}

/// A channel server: runs the server side of handshakes on accepted TCP connections.
/// Cheap to clone (clones share the session cache and the batch signer).
#[derive(Clone, Debug)]
pub struct Acceptor {
    server: Server,
    signer: Option<BatchService>,
}

impl Acceptor {
    /// A builder with the defaults (no identity: unauthenticated encryption only).
    pub fn builder() -> AcceptorBuilder {
        AcceptorBuilder::default()
    }

    /// Runs the handshake on `tcp` (no deadline but [`HANDSHAKE_TIMEOUT`]).
    pub async fn accept(&self, tcp: TcpStream) -> io::Result<SecureStream> {
        net::accept(&self.server, tcp, self.signer.as_ref()).await
    }

    /// Like [`accept`](Self::accept), and sets `answered` once the client's first flight
    /// was whole and answered (a server shedding load can spare clients that do not stall).
    pub async fn accept_tracked(
        &self,
        tcp: TcpStream,
        answered: &AtomicBool,
    ) -> io::Result<SecureStream> {
        net::accept_tracked(&self.server, tcp, self.signer.as_ref(), answered).await
    }

    /// Erases expired resumption keys (call it once a minute or so; [`Listener`] does it
    /// every minute).
    pub fn expire_sessions(&self) {
        self.server.expire_sessions(net::now());
    }

    /// Whether the server accepts `mode`.
    pub fn supports(&self, mode: AuthMode) -> bool {
        self.server.config().supports(mode)
    }

    /// The sans-IO server inside.
    pub fn server(&self) -> &Server {
        &self.server
    }
}

/// An authenticated connection from a [`Listener`].
#[derive(Debug)]
pub struct Accepted {
    /// The secure stream.
    pub stream: SecureStream,
    /// The client's TCP address.
    pub peer: SocketAddr,
}

impl Accepted {
    /// The session ID (equal on both ends unless someone sits in the middle).
    pub fn session_id(&self) -> SessionId {
        self.stream.session_id()
    }

    /// How the client was authenticated (mode, resumption).
    pub fn auth(&self) -> Option<&AuthResult> {
        self.stream.session().map(|s| &s.auth)
    }
}

/// Counts of a listener's handshakes.
#[derive(Debug, Default)]
pub struct ListenerStats {
    /// Handshakes completed (handed to [`Listener::accept`]).
    pub completed: AtomicU64,
    /// Handshakes that failed or timed out.
    pub failed: AtomicU64,
    /// Connections closed at once because [`ListenerConfig::max_pending`] handshakes were
    /// running.
    pub refused: AtomicU64,
}

/// A [`Listener`]'s bounds.
#[derive(Clone, Copy, Debug)]
pub struct ListenerConfig {
    /// How long a client has to complete its handshake.
    pub handshake_timeout: Duration,
    /// Most handshakes running at once; connections beyond are closed.
    pub max_pending: usize,
    /// Authenticated streams waiting for [`Listener::accept`].
    pub backlog: usize,
}

impl Default for ListenerConfig {
    fn default() -> Self {
        ListenerConfig {
            handshake_timeout: Duration::from_secs(5),
            max_pending: 1024,
            backlog: 64,
        }
    }
}

/// Accepts TCP connections and runs their handshakes concurrently (each within a deadline,
/// a bounded number at once), yielding only authenticated streams. Dropping it stops the
/// accept loop; streams already accepted live on.
#[derive(Debug)]
pub struct Listener {
    local: SocketAddr,
    ready: mpsc::Receiver<Accepted>,
    stats: Arc<ListenerStats>,
    task: tokio::task::JoinHandle<()>,
}

impl Listener {
    /// Binds `addr` and starts accepting with the default [`ListenerConfig`].
    pub async fn bind(addr: SocketAddr, acceptor: Acceptor) -> io::Result<Listener> {
        Self::bind_with(addr, acceptor, ListenerConfig::default()).await
    }

    /// Binds `addr` and starts accepting with `config`.
    pub async fn bind_with(
        addr: SocketAddr,
        acceptor: Acceptor,
        config: ListenerConfig,
    ) -> io::Result<Listener> {
        let tcp = TcpListener::bind(addr).await?;
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(config.backlog.max(1));
        let stats = Arc::new(ListenerStats::default());
        let task = tokio::spawn(accept_loop(tcp, acceptor, config, tx, stats.clone()));
        Ok(Listener {
            local,
            ready,
            stats,
            task,
        })
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    /// The next authenticated connection. Fails only if the accept loop stopped.
    pub async fn accept(&mut self) -> io::Result<Accepted> {
        self.ready
            .recv()
            .await
            .ok_or_else(|| io::Error::other("the listener's accept loop stopped"))
    }

    /// The handshake counts so far.
    pub fn stats(&self) -> &ListenerStats {
        &self.stats
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(
    tcp: TcpListener,
    acceptor: Acceptor,
    config: ListenerConfig,
    ready: mpsc::Sender<Accepted>,
    stats: Arc<ListenerStats>,
) {
    let pending = Arc::new(tokio::sync::Semaphore::new(config.max_pending.max(1)));
    // Expired resumption keys are erased every minute, even when no one connects.
    let mut expiry = tokio::time::interval(Duration::from_secs(60));
    loop {
        let accepted = tokio::select! {
            accepted = tcp.accept() => accepted,
            _ = expiry.tick() => {
                acceptor.expire_sessions();
                continue;
            }
        };
        let (conn, peer) = match accepted {
            Ok(x) => x,
            Err(_) => {
                // Out of descriptors and the like: back off, keep accepting.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(permit) = pending.clone().try_acquire_owned() else {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let _ = conn.set_nodelay(true);
        let (acceptor, ready, stats) = (acceptor.clone(), ready.clone(), stats.clone());
        tokio::spawn(async move {
            let result =
                tokio::time::timeout(config.handshake_timeout, acceptor.accept(conn)).await;
            drop(permit);
            match result {
                Ok(Ok(stream)) => {
                    stats.completed.fetch_add(1, Ordering::Relaxed);
                    let _ = ready.send(Accepted { stream, peer }).await;
                }
                _ => {
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn signature_auth_and_resumption_through_the_listener() {
        let provider = CryptoProvider::default_provider();
        let identity = Identity::generate(&provider).expect("identity");
        let pinned = identity.public();
        let acceptor = Acceptor::builder().identity(identity).build().unwrap();
        let mut listener = Listener::bind("127.0.0.1:0".parse().unwrap(), acceptor)
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let connector = Connector::builder(ClientAuth::ServerSignature { pinned }).build();
        for expected in [HandshakeKind::Full, HandshakeKind::Resumed] {
            let (client, server) = tokio::join!(connector.connect(&addr), listener.accept());
            let (mut client, mut server) = (client.unwrap(), server.unwrap());
            assert_eq!(client.session_id(), server.session_id());
            assert_eq!(HandshakeKind::of(&client), expected);
            assert_eq!(HandshakeKind::of(&server.stream), expected);
            client.write_all(b"ping").await.unwrap();
            client.shutdown().await.unwrap();
            let mut got = Vec::new();
            server.stream.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, b"ping");
        }
        assert_eq!(listener.stats().completed.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn a_wrong_pin_fails_with_a_reason_and_is_counted() {
        let provider = CryptoProvider::default_provider();
        let server_id = Identity::generate(&provider).expect("identity");
        let other = Identity::generate(&provider).expect("identity").public();
        let acceptor = Acceptor::builder()
            .identity(server_id)
            .auth_modes(vec![AuthMode::ServerSignature])
            .build()
            .unwrap();
        let listener = Listener::bind("127.0.0.1:0".parse().unwrap(), acceptor)
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let connector = Connector::builder(ClientAuth::ServerSignature { pinned: other }).build();
        let err = connector.connect(&addr).await.unwrap_err();
        assert_eq!(failure_reason(&err), "authentication_failed", "{err}");
        // (The server finished its side of that handshake: only the client can tell.)
        // Something that does not speak cohort fails at the server.
        let mut junk = TcpStream::connect(&addr).await.unwrap();
        junk.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
        let _ = junk.read_to_end(&mut Vec::new()).await;
        for _ in 0..100 {
            if listener.stats().failed.load(Ordering::Relaxed) == 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the failed handshake was not counted");
    }

    #[test]
    fn a_mode_without_its_secret_is_refused() {
        let err = Acceptor::builder()
            .auth_modes(vec![AuthMode::Psk])
            .build()
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("needs a PSK"), "{err}");
    }
}
