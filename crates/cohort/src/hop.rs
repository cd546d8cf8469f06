//! Hop-by-hop authenticated messages (ALPHA) as async handles: an [`Endpoint`] that opens
//! associations to peers and sends and receives on them, and a [`Relay`] that verifies what
//! it forwards.
//!
//! This module owns the handles, the task that routes the core's events to them, and
//! [`Node`]: the I/O around one sans-IO core ([`cohort_hop::Endpoint`] or
//! [`cohort_hop::Relay`]) on one UDP socket, with an optional user-space delay line. The
//! socket is a [`cohort_net::batch::BatchUdp`]: reads take a batch per system call, and
//! everything one drain sends goes out in as few system calls as GSO allows
//! (`COHORT_UDP_BATCH=off`: one datagram per system call). The
//! handles run a `Node` on a task of their own; `cohort hop run` runs one in its own loop
//! (which also reads a TUN device, stdin and a control socket), so both drive the core the
//! same way.
//!
//! ```text
//!   Endpoint::associate/send/status ─▶ closures ─▶ task: Node (UDP socket, timers, delay)
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

use cohort_core::{Machine, Timestamp};
use cohort_crypto::CryptoProvider;
use cohort_hop::{HopEvent, HopNode};
use cohort_net::batch::{BatchUdp, Batching, Flushed};
use cohort_net::Command;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio::time::Instant;

pub use cohort_channel::identity::{Identity, PublicKey};
pub use cohort_hop::{
    AssocId, AssocStatus, EndpointConfig, EndpointEvent, EndpointStatus, HopCounters, HopError,
    Mode, PeerStatus, RelayConfig, RelayEvent, RelayStatus, MAX_MESSAGE,
};

/// Most receive buffers [`Node::wait`] fills before returning (so the caller drains the
/// core again): datagrams unbatched, `recvmmsg` slots (each may hold several GRO segments)
/// batched.
const BURST: usize = 64;
/// Largest datagram the core writes.
const MAX_DATAGRAM: usize = 65_536;

/// What a [`Node`] counts about its socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Datagrams sent.
    pub datagrams_sent: u64,
    /// Their payload bytes.
    pub bytes_sent: u64,
    /// Datagrams received.
    pub datagrams_received: u64,
    /// Their payload bytes.
    pub bytes_received: u64,
    /// Sends that failed (a full socket buffer, an unreachable next hop): lost, as a
    /// network would lose them.
    pub send_errors: u64,
    /// System calls that sent (fewer than datagrams when batched).
    pub send_calls: u64,
    /// System calls that received.
    pub recv_calls: u64,
}

/// What a [`Node::wait`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Woke {
    /// Datagrams arrived and went to the core (this many).
    Datagrams(usize),
    /// The core's deadline passed and it handled its timers.
    Timeout,
    /// Held datagrams became due and were sent.
    DelaySent,
}

/// One hop core (endpoint or relay) on one UDP socket: the drain order of
/// `cohort_core::Machine` (every transmit, then every event), reads in bursts, the core's
/// timers, and an optional user-space delay on everything sent. Owned by one task; the
/// handles ([`Endpoint`], [`Relay`]) run one, and so does `cohort hop run`.
pub struct Node {
    core: HopNode,
    udp: BatchUdp,
    epoch: Instant,
    delay: Duration,
    delayed: VecDeque<(Instant, SocketAddr, Vec<u8>)>,
    send_buf: Vec<u8>,
    stats: NodeStats,
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("delay", &self.delay)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// `core` on `socket`; everything sent is held `delay` first (zero: sent at once). I/O is
    /// batched unless `COHORT_UDP_BATCH=off` ([`Batching::from_env`]).
    pub fn new(core: HopNode, socket: UdpSocket, delay: Duration) -> Node {
        Node::with_batching(core, socket, delay, Batching::from_env())
    }

    /// As [`Node::new`], batched or not as `batching` says.
    pub fn with_batching(
        core: HopNode,
        socket: UdpSocket,
        delay: Duration,
        batching: Batching,
    ) -> Node {
        Node {
            core,
            udp: BatchUdp::new(socket, batching, BURST),
            epoch: Instant::now(),
            delay,
            delayed: VecDeque::new(),
            send_buf: Vec::with_capacity(MAX_DATAGRAM),
            stats: NodeStats::default(),
        }
    }

    /// The core's clock now.
    pub fn now(&self) -> Timestamp {
        Timestamp::from_nanos(u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// The core.
    pub fn core(&self) -> &HopNode {
        &self.core
    }

    /// The core, to command it.
    pub fn core_mut(&mut self) -> &mut HopNode {
        &mut self.core
    }

    /// The endpoint core, if this is one.
    pub fn endpoint_mut(&mut self) -> Option<&mut cohort_hop::Endpoint> {
        self.core.endpoint_mut()
    }

    /// The socket (for options such as a firewall mark).
    pub fn socket(&self) -> &UdpSocket {
        self.udp.socket()
    }

    /// Whether the socket's I/O is batched.
    pub fn batching(&self) -> Batching {
        self.udp.batching()
    }

    /// The user-space delay.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// The socket's counts so far.
    pub fn stats(&self) -> NodeStats {
        self.stats
    }

    /// Sends (or holds) everything the core has to send.
    pub async fn transmit(&mut self) {
        let now = self.now();
        let mut buf = std::mem::take(&mut self.send_buf);
        while let Some(t) = self.core.poll_transmit(now, &mut buf) {
            if self.delay.is_zero() {
                self.udp.queue(t.destination, &buf[..t.size]);
            } else {
                self.delayed.push_back((
                    Instant::now() + self.delay,
                    t.destination,
                    buf[..t.size].to_vec(),
                ));
            }
            buf.clear();
        }
        self.send_buf = buf;
        self.flush().await;
    }

    /// Sends what is queued on the socket, counting it.
    async fn flush(&mut self) {
        let Flushed {
            datagrams,
            bytes,
            errors,
            syscalls,
        } = self.udp.flush().await;
        self.stats.datagrams_sent += datagrams;
        self.stats.bytes_sent += bytes;
        self.stats.send_errors += errors;
        self.stats.send_calls += syscalls;
    }

    /// The core's next event.
    pub fn poll_event(&mut self) -> Option<HopEvent> {
        self.core.poll_event()
    }

    /// Waits for the first of: datagrams (up to a burst, handed to the core), the core's
    /// deadline (its timers run), held datagrams becoming due (sent). Cancel-safe: nothing
    /// is lost if another branch of a `select!` wins. Fails only if the socket fails.
    pub async fn wait(&mut self) -> io::Result<Woke> {
        let deadline = self
            .core
            .poll_timeout()
            .map(|at| self.epoch + Duration::from_nanos(at.as_nanos()));
        let due = self.delayed.front().map(|(at, _, _)| *at);
        tokio::select! {
            // ICMP errors (port unreachable) end a wait with no datagrams; they are not fatal.
            r = self.udp.recv() => {
                self.stats.recv_calls += r? as u64;
                let now = self.now();
                let mut count = 0;
                for (from, bytes) in self.udp.received() {
                    self.stats.datagrams_received += 1;
                    self.stats.bytes_received += bytes.len() as u64;
                    self.core.handle_datagram(now, from, bytes);
                    count += 1;
                }
                Ok(Woke::Datagrams(count))
            },
            () = sleep_until(deadline) => {
                let now = self.now();
                self.core.handle_timeout(now);
                Ok(Woke::Timeout)
            }
            () = sleep_until(due) => {
                self.send_due().await;
                Ok(Woke::DelaySent)
            }
        }
    }

    async fn send_due(&mut self) {
        let now = Instant::now();
        while self.delayed.front().is_some_and(|(at, _, _)| *at <= now) {
            if let Some((_, to, bytes)) = self.delayed.pop_front() {
                self.udp.queue(to, &bytes);
            }
        }
        self.flush().await;
    }

    /// Sends every held datagram as it becomes due (a clean stop should not lose what the
    /// core already sent).
    pub async fn finish(&mut self) {
        while let Some(at) = self.delayed.front().map(|(at, _, _)| *at) {
            tokio::time::sleep_until(at).await;
            self.send_due().await;
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Runs `node` until every command sender is gone, running each command on the core and
/// passing its events to `events`.
async fn run_node(
    mut node: Node,
    mut commands: mpsc::Receiver<Command<HopNode>>,
    events: mpsc::Sender<HopEvent>,
) {
    loop {
        node.transmit().await;
        while let Some(event) = node.poll_event() {
            // The router never blocks; a relay's reader drains; a gone reader is no loss.
            let _ = events.send(event).await;
        }
        tokio::select! {
            r = node.wait() => {
                if r.is_err() {
                    return;
                }
            }
            command = commands.recv() => match command {
                Some(f) => {
                    let now = node.now();
                    f(node.core_mut(), now);
                }
                None => {
                    node.finish().await;
                    return;
                }
            },
        }
    }
}

/// The parts of a started node: its command sender, its events and its address.
type Started = (
    mpsc::Sender<Command<HopNode>>,
    mpsc::Receiver<HopEvent>,
    SocketAddr,
);

/// Starts the core `make` builds on a [`Node`] bound to `listen`, everything it sends held
/// `delay`.
fn spawn_node(
    make: impl FnOnce(SocketAddr) -> io::Result<HopNode>,
    listen: SocketAddr,
    delay: Duration,
) -> io::Result<Started> {
    let socket = cohort_net::bind_udp(listen)?;
    let local = socket.local_addr()?;
    let node = Node::new(make(local)?, socket, delay);
    let (commands, command_rx) = mpsc::channel(1024);
    let (event_tx, events) = mpsc::channel(4096);
    tokio::spawn(run_node(node, command_rx, event_tx));
    Ok((commands, events, local))
}

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
    commands: mpsc::Sender<Command<HopNode>>,
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
        let key = config.identity.public();
        let seed = crate::os_seed(&provider)?;
        let (commands, node_events, local) = spawn_node(
            |local| {
                Ok(HopNode::Endpoint(cohort_hop::Endpoint::new(
                    config, provider, local, seed,
                )))
            },
            listen,
            Duration::ZERO,
        )?;
        let (wait_tx, wait_rx) = mpsc::unbounded_channel();
        let (received_tx, received) = mpsc::channel(RECEIVE_QUEUE);
        let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
        let lost = Arc::new(AtomicU64::new(0));
        tokio::spawn(route(
            node_events,
            wait_rx,
            received_tx,
            events_tx,
            lost.clone(),
        ));
        Ok(Endpoint {
            inner: Arc::new(Inner {
                local,
                key,
                commands,
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
            .send(Box::new(move |node: &mut HopNode, now| {
                if let Some(e) = node.endpoint_mut() {
                    let _ = tx.send(f(e, now));
                }
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
    mut events: mpsc::Receiver<HopEvent>,
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
                let HopEvent::Endpoint(event) = event else { continue };
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
    commands: mpsc::Sender<Command<HopNode>>,
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
        let (commands, mut events, local) = spawn_node(
            |local| {
                Ok(HopNode::Relay(cohort_hop::Relay::new(
                    config, provider, local,
                )))
            },
            listen,
            Duration::ZERO,
        )?;
        // Drain the events so the node never waits on them.
        tokio::spawn(async move { while events.recv().await.is_some() {} });
        Ok(Relay { local, commands })
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
    async fn a_node_holds_what_it_sends_for_its_delay() {
        let (a, b) = pair();
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let b = Endpoint::start(b, any).unwrap();
        let delay = Duration::from_millis(150);
        let provider = CryptoProvider::default_provider();
        let seed = [9u8; 32];
        let (commands, mut events, _) = spawn_node(
            |local| {
                Ok(HopNode::Endpoint(cohort_hop::Endpoint::new(
                    a, provider, local, seed,
                )))
            },
            any,
            delay,
        )
        .unwrap();
        let started = Instant::now();
        let peer = b.local_addr();
        commands
            .send(Box::new(move |node: &mut HopNode, now| {
                if let Some(e) = node.endpoint_mut() {
                    e.connect(now, peer, None);
                }
            }))
            .await
            .unwrap();
        loop {
            let event = tokio::time::timeout(Duration::from_secs(10), events.recv())
                .await
                .unwrap()
                .unwrap();
            if matches!(event, HopEvent::Endpoint(EndpointEvent::Connected { .. })) {
                break;
            }
        }
        // The handshake needs two of our packets to leave (and an answer between them):
        // each held for the delay.
        let took = started.elapsed();
        assert!(took >= 2 * delay, "connected after {took:?}");
        assert!(took < 20 * delay, "connected after {took:?}");
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
