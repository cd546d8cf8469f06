//! Hop-by-hop authenticated messages (ALPHA) as async handles: an [`Endpoint`] that opens
//! associations to peers and sends and receives on them, and a [`Relay`] that verifies what
//! it forwards.
//!
//! This module owns the handles and the task that routes the core's events to them; the
//! core is `cohort_hop`'s sans-IO [`cohort_hop::Endpoint`] / [`cohort_hop::Relay`], driven on
//! one UDP socket by `cohort_net`'s driver.
//!
//! ```text
//!   Endpoint::associate/send/status ─▶ closures ─▶ cohort_net driver (UDP socket, timers)
//!                                                    │ owns cohort_hop::Endpoint
//!   waiters (connected, opened) ◀── router task ◀────┘ events
//!   Endpoint::recv ◀── bounded queue (Received) ◀──┘   other events ─▶ Endpoint::next_event
//! ```
//!
//! Two endpoints on loopback:
//!
//! ```
//! use cohort::hop::{Endpoint, EndpointConfig, Identity, Mode};
//! use cohort_crypto::CryptoProvider;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let provider = CryptoProvider::default_provider();
//! let (a_id, b_id) = (Identity::generate(&provider)?, Identity::generate(&provider)?);
//! let mut a_config = EndpointConfig::new(a_id);
//! let mut b_config = EndpointConfig::new(b_id);
//! a_config.trust = vec![b_config.identity.public()];
//! b_config.trust = vec![a_config.identity.public()];
//! let any = "127.0.0.1:0".parse()?;
//! let a = Endpoint::start(a_config, any)?;
//! let b = Endpoint::start(b_config, any)?;
//! let assoc = a.associate(b.local_addr(), None, Mode::N).await?;
//! a.send(b.local_addr(), Some(assoc), b"over two hops or ten".to_vec()).await?;
//! let message = b.recv().await.expect("a message");
//! assert_eq!(message.data, b"over two hops or ten");
//! assert_eq!(message.peer, a.local_addr());
//! # Ok(())
//! # }
//! ```

use cohort_core::Timestamp;
use cohort_crypto::CryptoProvider;
use cohort_net::Command;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Mutex};

pub use cohort_channel::identity::{Identity, PublicKey};
pub use cohort_hop::{
    AssocId, AssocStatus, EndpointConfig, EndpointEvent, EndpointStatus, HopCounters, HopError,
    Mode, PeerStatus, RelayConfig, RelayEvent, RelayStatus, MAX_MESSAGE,
};

/// Messages received and not yet read by [`Endpoint::recv`]; more are dropped (and counted
/// in [`Endpoint::lost`]).
const RECEIVE_QUEUE: usize = 4096;
/// Other events not yet read by [`Endpoint::next_event`]; more are dropped.
const EVENT_QUEUE: usize = 1024;
/// How long [`Endpoint::associate`] waits for the handshake and the opening.
pub const ASSOCIATE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a hop call failed.
#[derive(Debug)]
pub enum Error {
    /// The core refused the command.
    Hop(HopError),
    /// The handshake with the peer failed (the reason is the core's).
    ConnectFailed(&'static str),
    /// The pair with the peer ended while waiting.
    Disconnected(&'static str),
    /// [`ASSOCIATE_TIMEOUT`] passed.
    TimedOut,
    /// The endpoint's task has stopped (its socket failed, or it was shut down).
    Stopped,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Hop(e) => write!(f, "{e}"),
            Error::ConnectFailed(r) => write!(f, "the handshake failed: {r}"),
            Error::Disconnected(r) => write!(f, "the pair ended: {r}"),
            Error::TimedOut => f.write_str("timed out"),
            Error::Stopped => f.write_str("the endpoint has stopped"),
        }
    }
}

impl std::error::Error for Error {}

impl From<HopError> for Error {
    fn from(e: HopError) -> Self {
        Error::Hop(e)
    }
}

/// A verified message from a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The peer's overlay address.
    pub peer: SocketAddr,
    /// The association it came on.
    pub assoc: AssocId,
    /// The message.
    pub data: Vec<u8>,
}

/// What the router waits for on behalf of a caller.
enum Wait {
    /// The pair with this peer connected (or failed).
    Connected(SocketAddr, oneshot::Sender<Result<(), Error>>),
    /// Our association opened (or the pair ended).
    Opened(SocketAddr, AssocId, oneshot::Sender<Result<(), Error>>),
}

/// A running ALPHA endpoint: a handle to its task. Cheap to clone; the task stops when
/// every clone is dropped.
#[derive(Clone)]
pub struct Endpoint {
    inner: Arc<Inner>,
}

struct Inner {
    local: SocketAddr,
    key: PublicKey,
    commands: mpsc::Sender<Command<cohort_hop::Endpoint>>,
    waits: mpsc::UnboundedSender<Wait>,
    received: Mutex<mpsc::Receiver<Message>>,
    events: Mutex<mpsc::Receiver<EndpointEvent>>,
    lost: Arc<AtomicU64>,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("local", &self.inner.local)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// Binds `listen` (UDP) and starts the endpoint on the current tokio runtime, seeded
    /// from the operating system. Its overlay address is the bound address.
    pub fn start(config: EndpointConfig, listen: SocketAddr) -> io::Result<Endpoint> {
        let provider = CryptoProvider::default_provider();
        let socket = cohort_net::bind_udp(listen)?;
        let local = socket.local_addr()?;
        let key = config.identity.public();
        let seed = crate::os_seed(&provider)?;
        let core = cohort_hop::Endpoint::new(config, provider, local, seed);
        let driver = cohort_net::spawn(core, socket);
        let (wait_tx, wait_rx) = mpsc::unbounded_channel();
        let (received_tx, received) = mpsc::channel(RECEIVE_QUEUE);
        let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
        let lost = Arc::new(AtomicU64::new(0));
        tokio::spawn(route(
            driver.events,
            wait_rx,
            received_tx,
            events_tx,
            lost.clone(),
        ));
        Ok(Endpoint {
            inner: Arc::new(Inner {
                local,
                key,
                commands: driver.commands,
                waits: wait_tx,
                received: Mutex::new(received),
                events: Mutex::new(events),
                lost,
            }),
        })
    }

    /// This endpoint's overlay (and UDP) address.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local
    }

    /// This endpoint's public key (peers must trust it).
    pub fn key(&self) -> PublicKey {
        self.inner.key
    }

    /// Runs `f` on the core and returns its result.
    async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut cohort_hop::Endpoint, Timestamp) -> T + Send + 'static,
    ) -> Result<T, Error> {
        let (tx, rx) = oneshot::channel();
        self.inner
            .commands
            .send(Box::new(move |e, now| {
                let _ = tx.send(f(e, now));
            }))
            .await
            .map_err(|_| Error::Stopped)?;
        rx.await.map_err(|_| Error::Stopped)
    }

    async fn wait(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<(), Error>>) -> Wait,
    ) -> Result<oneshot::Receiver<Result<(), Error>>, Error> {
        let (tx, rx) = oneshot::channel();
        self.inner
            .waits
            .send(make(tx))
            .map_err(|_| Error::Stopped)?;
        Ok(rx)
    }

    /// Opens an outgoing association to `peer` in `mode`: handshakes first if there is no
    /// pair yet (through the relay `via`, if given), then waits until the association is
    /// open (at most [`ASSOCIATE_TIMEOUT`]). Returns its id.
    pub async fn associate(
        &self,
        peer: SocketAddr,
        via: Option<SocketAddr>,
        mode: Mode,
    ) -> Result<AssocId, Error> {
        let run = async {
            // The waiter is registered before the command, so its event cannot be missed.
            let connected = self.wait(|tx| Wait::Connected(peer, tx)).await?;
            let already = self
                .call(move |e, now| {
                    let already = e.is_connected(peer);
                    if !already {
                        e.connect(now, peer, via);
                    }
                    already
                })
                .await?;
            if !already {
                connected.await.map_err(|_| Error::Stopped)??;
            }
            let assoc = self.call(move |e, now| e.open(now, peer, mode)).await??;
            let opened = self.wait(|tx| Wait::Opened(peer, assoc, tx)).await?;
            opened.await.map_err(|_| Error::Stopped)??;
            Ok(assoc)
        };
        tokio::time::timeout(ASSOCIATE_TIMEOUT, run)
            .await
            .unwrap_or(Err(Error::TimedOut))
    }

    /// Queues `data` (at most [`MAX_MESSAGE`] bytes) for `peer` on association `assoc`, or
    /// on any open outgoing one. A full queue is [`HopError::QueueFull`]: the message was
    /// not taken (wait and send again).
    pub async fn send(
        &self,
        peer: SocketAddr,
        assoc: Option<AssocId>,
        data: Vec<u8>,
    ) -> Result<(), Error> {
        self.call(move |e, now| match assoc {
            Some(a) => e.send(now, peer, a, &data),
            None => e.send_any(now, peer, &data),
        })
        .await?
        .map_err(Error::Hop)
    }

    /// The next verified message; None once the endpoint has stopped.
    pub async fn recv(&self) -> Option<Message> {
        self.inner.received.lock().await.recv().await
    }

    /// The next event other than a message (connected, opened, closed, reports, ...).
    pub async fn next_event(&self) -> Option<EndpointEvent> {
        self.inner.events.lock().await.recv().await
    }

    /// Messages and events dropped because nobody read them in time.
    pub fn lost(&self) -> u64 {
        self.inner.lost.load(Ordering::Relaxed)
    }

    /// A snapshot of the peers, their associations and the counters.
    pub async fn status(&self) -> Result<EndpointStatus, Error> {
        self.call(|e, _| e.status()).await
    }

    /// Closes our association `assoc` with `peer`.
    pub async fn close(&self, peer: SocketAddr, assoc: AssocId) -> Result<(), Error> {
        self.call(move |e, now| e.close(now, peer, assoc, true))
            .await
    }
}

/// Routes the core's events: messages to the receive queue, the rest to the event queue,
/// and each to the waiters it completes.
async fn route(
    mut events: mpsc::Receiver<EndpointEvent>,
    mut waits: mpsc::UnboundedReceiver<Wait>,
    received: mpsc::Sender<Message>,
    others: mpsc::Sender<EndpointEvent>,
    lost: Arc<AtomicU64>,
) {
    type Reply = oneshot::Sender<Result<(), Error>>;
    let mut connecting: HashMap<SocketAddr, Vec<Reply>> = HashMap::new();
    let mut opening: HashMap<(SocketAddr, AssocId), Reply> = HashMap::new();
    let mut open: HashSet<(SocketAddr, AssocId)> = HashSet::new();
    loop {
        tokio::select! {
            // Waiters first: one registered before its command must be seen before the
            // command's events.
            biased;
            wait = waits.recv() => match wait {
                Some(Wait::Connected(peer, reply)) => connecting.entry(peer).or_default().push(reply),
                Some(Wait::Opened(peer, assoc, reply)) => {
                    if open.contains(&(peer, assoc)) {
                        let _ = reply.send(Ok(()));
                    } else {
                        opening.insert((peer, assoc), reply);
                    }
                }
                None => return,
            },
            event = events.recv() => {
                let Some(event) = event else { return };
                match &event {
                    EndpointEvent::Received { peer, assoc, data } => {
                        let message = Message { peer: *peer, assoc: *assoc, data: data.clone() };
                        if received.try_send(message).is_err() {
                            lost.fetch_add(1, Ordering::Relaxed);
                        }
                        continue;
                    }
                    EndpointEvent::Connected { peer, .. } => {
                        for reply in connecting.remove(peer).unwrap_or_default() {
                            let _ = reply.send(Ok(()));
                        }
                    }
                    EndpointEvent::ConnectFailed { peer, reason } => {
                        for reply in connecting.remove(peer).unwrap_or_default() {
                            let _ = reply.send(Err(Error::ConnectFailed(reason)));
                        }
                    }
                    EndpointEvent::Disconnected { peer, reason } => {
                        open.retain(|(p, _)| p != peer);
                        let gone: Vec<_> = opening.keys().filter(|(p, _)| p == peer).copied().collect();
                        for key in gone {
                            if let Some(reply) = opening.remove(&key) {
                                let _ = reply.send(Err(Error::Disconnected(reason)));
                            }
                        }
                    }
                    EndpointEvent::Opened { peer, assoc, outgoing: true, .. } => {
                        open.insert((*peer, *assoc));
                        if let Some(reply) = opening.remove(&(*peer, *assoc)) {
                            let _ = reply.send(Ok(()));
                        }
                    }
                    EndpointEvent::Closed { peer, assoc, outgoing: true } => {
                        open.remove(&(*peer, *assoc));
                    }
                    _ => {}
                }
                if others.try_send(event).is_err() {
                    lost.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// A running ALPHA relay: verifies and forwards the traffic of pairs whose signed
/// handshake it saw. A handle to its task; the relay stops when every clone is dropped.
#[derive(Clone)]
pub struct Relay {
    local: SocketAddr,
    commands: mpsc::Sender<Command<cohort_hop::HopNode>>,
}

impl fmt::Debug for Relay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

impl Relay {
    /// Binds `listen` (UDP) and starts the relay on the current tokio runtime. Its events
    /// (pairs learned) are not reported; [`status`](Self::status) shows the pairs.
    pub fn start(config: RelayConfig, listen: SocketAddr) -> io::Result<Relay> {
        let provider = CryptoProvider::default_provider();
        let socket = cohort_net::bind_udp(listen)?;
        let local = socket.local_addr()?;
        let node = cohort_hop::HopNode::Relay(cohort_hop::Relay::new(config, provider, local));
        let mut driver = cohort_net::spawn(node, socket);
        // Drain the events so the driver never waits on them.
        tokio::spawn(async move { while driver.events.recv().await.is_some() {} });
        Ok(Relay {
            local,
            commands: driver.commands,
        })
    }

    /// The relay's UDP address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// A snapshot of the pairs it knows and its counters.
    pub async fn status(&self) -> Result<RelayStatus, Error> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Box::new(move |node, _| {
                if let Some(relay) = node.relay() {
                    let _ = tx.send(relay.status());
                }
            }))
            .await
            .map_err(|_| Error::Stopped)?;
        rx.await.map_err(|_| Error::Stopped)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code
    use super::*;

    fn pair() -> (EndpointConfig, EndpointConfig) {
        let provider = CryptoProvider::default_provider();
        let mut a = EndpointConfig::new(Identity::generate(&provider).unwrap());
        let mut b = EndpointConfig::new(Identity::generate(&provider).unwrap());
        a.trust = vec![b.identity.public()];
        b.trust = vec![a.identity.public()];
        (a, b)
    }

    #[tokio::test]
    async fn messages_cross_a_relay_and_status_counts_them() {
        let (a, b) = pair();
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let relay = Relay::start(RelayConfig::new(), any).unwrap();
        let a = Endpoint::start(a, any).unwrap();
        let b = Endpoint::start(b, any).unwrap();
        let assoc = a
            .associate(
                b.local_addr(),
                Some(relay.local_addr()),
                Mode::M { batch: 4 },
            )
            .await
            .unwrap();
        for i in 0..10u8 {
            a.send(b.local_addr(), Some(assoc), vec![i; 100])
                .await
                .unwrap();
        }
        for i in 0..10u8 {
            let m = tokio::time::timeout(Duration::from_secs(10), b.recv())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(m.data, vec![i; 100]);
        }
        let status = b.status().await.unwrap();
        assert_eq!(status.counters.delivered, 10);
        assert!(relay.status().await.unwrap().counters.verified > 0);
        // A second associate reuses the pair.
        let second = a.associate(b.local_addr(), None, Mode::N).await.unwrap();
        assert_ne!(second, assoc);
    }

    #[tokio::test]
    async fn an_untrusted_peer_fails_to_associate() {
        let (mut a, _) = pair();
        let (_, stranger) = pair();
        // Give up soon: a few quick handshake retransmissions.
        a.retransmit = Duration::from_millis(20);
        a.max_retries = 3;
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let a = Endpoint::start(a, any).unwrap();
        let s = Endpoint::start(stranger, any).unwrap();
        let err = a
            .associate(s.local_addr(), None, Mode::N)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::ConnectFailed(_)), "{err}");
        assert!(matches!(
            a.send(s.local_addr(), None, b"x".to_vec()).await,
            Err(Error::Hop(_))
        ));
    }
}
