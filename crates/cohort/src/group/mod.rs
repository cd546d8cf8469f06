//! Secure process groups for tokio applications: [`Group`], a handle to one member, and
//! [`Events`], its one event stream.
//!
//! ```text
//!   Group (Clone) ── requests (bounded) ──▶ ┐
//!                                           ├─ member task: GroupMember + UDP socket,
//!   Events::next ◀── bounded event queue ◀──┘  timers, send queue, fragments, state transfer
//!        │  (full: the task keeps running and counts; the reader then gets Event::Lost)
//!        └─ calls the snapshot callback at a view boundary (state transfer)
//! ```
//!
//! # A guide
//!
//! Build a [`GroupConfig`] (from the member's TOML file with [`GroupConfig::load`], or in
//! code with [`GroupConfig::builder`]), [`Group::start`] it (this binds the socket and
//! spawns the member's task on the current tokio runtime), [`Group::join`] until the first
//! view with this member in it, then [`Group::send`] and read [`Events::next`]:
//!
//! ```
//! use cohort::group::{Channel, Event, Group, GroupConfig, MemberId};
//! use cohort_channel::identity::Identity;
//! use cohort_crypto::CryptoProvider;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let provider = CryptoProvider::default_provider();
//! let (alice, bob) = (Identity::generate(&provider)?, Identity::generate(&provider)?);
//! let trust = [MemberId(alice.public()), MemberId(bob.public())];
//! let config = |identity| {
//!     GroupConfig::builder("demo")
//!         .identity(identity)
//!         .listen("127.0.0.1:0".parse().unwrap())
//!         .trust(trust)
//! };
//! // Alice founds the group; Bob joins through her address.
//! let (a, mut a_events) = Group::start(config(alice).build()?)?;
//! a.join().await?;
//! let (b, mut b_events) = Group::start(config(bob).peer(a.local_addr()).build()?)?;
//! let view = b.join().await?;
//! assert_eq!(view.members.len(), 2);
//!
//! // Reliable, totally ordered, up to 16 MiB (fragmented under the group key).
//! b.send(Channel::Reliable, vec![7u8; 100_000]).await?;
//! loop {
//!     if let Some(Event::Deliver { sender, data, .. }) = a_events.next().await {
//!         assert_eq!((sender, data.len()), (b.id(), 100_000));
//!         break;
//!     }
//! }
//! b.leave().await?;
//! a.leave().await?;
//! # let _ = b_events.next().await;
//! # Ok(())
//! # }
//! ```
//!
//! ## Sending
//!
//! [`Group::send`] on [`Channel::Reliable`] takes messages of up to [`MAX_MESSAGE`]
//! (16 MiB). A message longer than one datagram's payload (the config's `max_message_len`,
//! default 1400 bytes) is cut into fragments that travel as the member's own reliable
//! messages, so under the same group keys, in the same total order, and each member puts
//! them together again (see [`frag`] for the format). `send` returns once every fragment
//! was handed to the member; while the member's send window is full it waits (this is the
//! back-pressure), and the number it returns is the member's sequence number of the
//! message's last fragment, as [`Event::Deliver`]'s `seq` reports it.
//!
//! [`Channel::Unreliable`] is one datagram per message: up to `max_message_len` bytes, no
//! fragments, an [`Error::TooLong`] above. It never waits for a window.
//!
//! ## Events
//!
//! The member's task never waits for the reader: events go into a queue of `event_queue`
//! entries (default [`DEFAULT_EVENT_QUEUE`]). When it is full
//! the member keeps running (heartbeats, retransmissions, view changes) and counts the
//! events it could not queue; the reader then gets [`Event::Lost`] with the count, where
//! they were lost. [`Group::view`] is always current, lost events or not.
//!
//! ## State transfer
//!
//! Like JGroups' getState/setState. Give the builder a snapshot callback
//! ([`GroupConfigBuilder::snapshot`]). When a view adds members, the senior member that
//! held the state before (the lowest-ranked member of the new view that was in the
//! previous one and had the state) calls it **from its [`Events::next`], at the view
//! boundary**: after the reader got every event before the [`Event::View`], before it gets
//! any event after it. So the snapshot is the state those earlier events built, provided
//! the application applies each event before it asks for the next one. The snapshot goes
//! to the group on the reliable channel.
//!
//! A member that joins a group holds back every event after its first [`Event::View`]
//! until a snapshot for that view (or a later one) arrives; then it gets
//! [`Event::State`], then the held-back events, less the deliveries the snapshot already
//! contains. So its first [`Event::Deliver`] comes after its [`Event::State`], and the
//! snapshot plus the deliveries that follow it are what the other members applied. If
//! the member that should send the snapshot crashes first, the next view picks another.
//! A callback that fails gives the provider [`Event::SnapshotFailed`] and the joiners
//! [`Event::StateUnavailable`] with its reason (their held-back events follow). Members
//! without a callback send an empty answer, so a joiner never waits for nothing: it then
//! gets no `State` event at all.
//!
//! If no member that held the state is left to send it (they all crashed or left), a
//! joiner keeps holding back its events, up to a bound after which they are counted as
//! lost; the facade does not guess a state for it.
//!
//! The members of a component that dissolves into a larger one after a partition
//! ([`Event::Merging`]) are joiners again: they get the larger component's state.

pub mod carriage;
mod config;
pub mod frag;
pub mod local_nats;
#[cfg(feature = "nats")]
mod nats;
mod queue;
pub(crate) mod state;
mod task;
mod transport;

pub use cohort_group::{
    Channel, DropCounters, MemberId, RemovalReason, SendError, Status, View, ViewId,
};
pub use config::{
    parse_gear, ConfigError, Credentials, GroupConfig, GroupConfigBuilder, MemberSetup, SnapshotFn,
    TransportSetup, DEFAULT_EVENT_QUEUE,
};
pub use frag::{FragmentDrops, MAX_MESSAGE};
#[cfg(feature = "nats")]
pub use nats::{serve_kdc, KdcCarried, NatsKdc, NatsLinks, NatsSetup, ReplySubject};

use cohort_crypto::CryptoProvider;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};

/// Largest state snapshot: a state message is the snapshot and a 41-byte header.
pub const MAX_STATE: usize = MAX_MESSAGE - 41;

/// How long [`Group::leave`] waits for the group to confirm before the member stops anyway.
pub const LEAVE_TIMEOUT: Duration = Duration::from_secs(2);

/// An event of the member, for the application.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// A view is installed: from now on messages are sent and delivered in it.
    View(View),
    /// A message delivered (reassembled, if it came in fragments).
    Deliver {
        /// The channel it came on.
        channel: Channel,
        /// Who sent it.
        sender: MemberId,
        /// The view it was delivered in.
        view: ViewId,
        /// The sender's message number (of the message's last fragment): increasing in
        /// send order.
        seq: u64,
        /// Reliable: the message's position among the application messages of this view's
        /// total order (0, 1, 2, ...; the same at every member: a joiner whose snapshot
        /// already holds the first ones starts above 0); unreliable: `None`.
        order: Option<u64>,
        /// The payload.
        data: Vec<u8>,
    },
    /// A fresh group key was installed.
    Rekeyed {
        /// The new key epoch.
        key_epoch: u64,
        /// Members that received it.
        members: usize,
        /// From the decision to rekey until this member installed the key (known at the
        /// coordinator only).
        took: Option<Duration>,
    },
    /// A member was removed by the view just installed.
    Removed {
        /// Who.
        member: MemberId,
        /// Why, as far as the coordinator knew.
        reason: RemovalReason,
    },
    /// This member is no longer in the group. After a [`Group::leave`] this is the last
    /// event.
    Expelled {
        /// Why.
        reason: RemovalReason,
    },
    /// Traffic of this group under a key this member does not hold: possibly another
    /// component of a partitioned group.
    Insecure {
        /// Where it came from.
        from: SocketAddr,
    },
    /// This component dissolves into a larger one (a partition heals); state transfer
    /// brings it the larger one's state.
    Merging {
        /// The larger component's leader.
        leader: MemberId,
        /// Where it is.
        into: SocketAddr,
    },
    /// An event of the protocol core without an application meaning of its own (key
    /// exchange between components, KDC refusals, trust changes).
    Protocol(cohort_group::GroupEvent),
    /// State transfer: the group's state when this member joined (see the module guide).
    /// Comes before the first [`Event::Deliver`] of the view it joined in.
    State(Vec<u8>),
    /// State transfer: the member that was to send the state could not take a snapshot.
    StateUnavailable {
        /// Its callback's reason.
        reason: String,
    },
    /// State transfer: this member's snapshot callback failed; the joiners were told.
    SnapshotFailed {
        /// The callback's reason.
        reason: String,
    },
    /// The event queue was full: `count` events were lost here.
    Lost {
        /// How many.
        count: u64,
    },
    /// The transport's connection changed (NATS: disconnected, connected again, a server
    /// error); async-nats keeps reconnecting on its own.
    Transport(String),
}

/// What went wrong.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is wrong (the key is named).
    Config(ConfigError),
    /// The socket could not be bound or read, or the OS gave no randomness.
    Io(std::io::Error),
    /// A message above the limit for its channel.
    TooLong {
        /// Its length.
        len: usize,
        /// The channel's limit.
        limit: usize,
    },
    /// The member refused the message (for example: not in a view).
    Send(SendError),
    /// The member was removed from the group (while waiting to join).
    Expelled(RemovalReason),
    /// The member's task has stopped (it left, or its socket failed).
    Closed,
    /// The transport could not start (NATS: an unreachable or refusing server, bad
    /// credentials, a member subject already taken): one line naming the problem.
    Transport(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(e) => e.fmt(f),
            Error::Io(e) => write!(f, "{e}"),
            Error::TooLong { len, limit } => {
                write!(f, "message of {len} bytes over the limit of {limit} bytes")
            }
            Error::Send(e) => e.fmt(f),
            Error::Expelled(reason) => write!(f, "removed from the group ({})", reason.name()),
            Error::Closed => f.write_str("the member has stopped"),
            Error::Transport(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for Error {}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::Config(e)
    }
}

/// A member's counters and state at a glance.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Stats {
    /// The protocol core's status (view, gear, deliveries in this view, drops by reason,
    /// key fingerprint).
    pub status: Status,
    /// Application messages waiting for the send window (with the one under way).
    pub queued: usize,
    /// Application messages sent and their bytes (before fragmentation).
    pub sent_messages: u64,
    /// See `sent_messages`.
    pub sent_bytes: u64,
    /// Application messages delivered and their bytes.
    pub delivered_messages: u64,
    /// See `delivered_messages`.
    pub delivered_bytes: u64,
    /// Datagrams written to the socket and their bytes.
    pub datagrams_sent: u64,
    /// See `datagrams_sent`.
    pub datagram_bytes_sent: u64,
    /// Datagrams read from the socket and their bytes.
    pub datagrams_received: u64,
    /// See `datagrams_received`.
    pub datagram_bytes_received: u64,
    /// Views installed.
    pub views: u64,
    /// Rekeys installed, and how long the last one took (at the coordinator).
    pub rekeys: u64,
    /// See `rekeys`.
    pub last_rekey: Option<Duration>,
    /// Fragments dropped by reassembly, by reason.
    pub fragments: FragmentDrops,
    /// Messages on the member's NATS subjects dropped before the protocol saw them (not
    /// carriage: see [`carriage`]); over UDP, malformed bundles dropped whole
    /// ([`cohort_net::bundle`]). Carriage that parses but holds no packet of this group is
    /// counted by the protocol, in `status.dropped`.
    pub carrier_dropped: u64,
    /// Bytes held in partial messages.
    pub reassembly_bytes: usize,
    /// Events waiting for the reader.
    pub events_queued: usize,
    /// Events lost because the queue was full (since the start).
    pub events_lost: u64,
    /// State snapshots this member sent, and received.
    pub snapshots_sent: u64,
    /// See `snapshots_sent`.
    pub snapshots_received: u64,
}

/// A handle to one member: cheap to clone, usable from any task.
#[derive(Clone)]
pub struct Group {
    inner: Arc<Handle>,
}

struct Handle {
    requests: mpsc::Sender<task::Request>,
    view: watch::Receiver<task::Membership>,
    id: MemberId,
    local_addr: SocketAddr,
    max_datagram: usize,
}

impl fmt::Debug for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Group")
            .field("id", &self.inner.id.to_string())
            .field("local_addr", &self.inner.local_addr)
            .finish_non_exhaustive()
    }
}

/// The member's one event stream. Single consumer; dropping it is allowed (events are
/// then discarded, and state transfer answers for this member without a snapshot).
pub struct Events {
    queue: Arc<queue::Queue>,
    /// Weak: the task stops (leaving) once every [`Group`] handle is gone.
    requests: mpsc::WeakSender<task::Request>,
    snapshot: Option<SnapshotFn>,
}

impl fmt::Debug for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Group {
    /// Validates `config`, binds the member's UDP socket, seeds it from the OS and spawns
    /// its task on the current tokio runtime (which must have time and I/O enabled). The
    /// member starts joining at once (through the config's peers; alone, it founds the
    /// group).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start(config: GroupConfig) -> Result<(Group, Events), Error> {
        let provider = CryptoProvider::default_provider();
        let setup = config.setup(&provider)?;
        if setup.transport != TransportSetup::Udp {
            return Err(Error::Config(crate::config_file::err(
                "transport",
                "this transport connects asynchronously: use Group::connect",
            )));
        }
        Self::spawn_udp(&config, setup, provider)
    }

    /// As [`Group::start`], for every transport: over UDP it is `start`; over NATS
    /// (`transport = "nats"`) it connects to the brokers first, checks that this member's
    /// subject is free and subscribes. The member's address (`listen`, not bound over
    /// NATS, and its port may not be 0) is its name on the broker. A server that cannot be
    /// reached or refuses, bad credentials or a taken subject: [`Error::Transport`] with
    /// one line naming the problem.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub async fn connect(config: GroupConfig) -> Result<(Group, Events), Error> {
        #[cfg(feature = "nats")]
        return Self::connect_over(config, None).await;
        #[cfg(not(feature = "nats"))]
        {
            let provider = CryptoProvider::default_provider();
            let setup = config.setup(&provider)?;
            Self::spawn_udp(&config, setup, provider)
        }
    }

    /// As [`Group::connect`], but over NATS the member shares the connection `links` holds
    /// for its servers and credentials with the other members of this process that use the
    /// same `links` (the first of them connects it). The process then subscribes to each
    /// group's subject once: the broker sends it one copy of each broadcast, and the
    /// process hands it to its members, instead of one copy per member. For processes that
    /// run many members (`cohort group many`). Over UDP it is `connect`.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    #[cfg(feature = "nats")]
    pub async fn connect_sharing(
        config: GroupConfig,
        links: &NatsLinks,
    ) -> Result<(Group, Events), Error> {
        Self::connect_over(config, Some(links)).await
    }

    /// `connect` and `connect_sharing`: a connection of the member's own without `links`.
    #[cfg(feature = "nats")]
    async fn connect_over(
        config: GroupConfig,
        links: Option<&NatsLinks>,
    ) -> Result<(Group, Events), Error> {
        let provider = CryptoProvider::default_provider();
        let setup = config.setup(&provider)?;
        match setup.transport.clone() {
            TransportSetup::Udp => Self::spawn_udp(&config, setup, provider),
            TransportSetup::Nats(nats) => {
                let group = setup.config.group.clone();
                let kdc = match &setup.credentials {
                    Credentials::Kdc(c) => Some(c.kdc),
                    _ => None,
                };
                let carrier = match links {
                    Some(links) => {
                        nats::connect_shared(links, &nats, &group, setup.listen, kdc).await
                    }
                    None => nats::connect(&nats, &group, setup.listen, kdc).await,
                }
                .map_err(Error::Transport)?;
                let local_addr = setup.listen;
                Self::spawn(
                    &config,
                    setup,
                    transport::Transport::Nats(Box::new(carrier)),
                    local_addr,
                    provider,
                )
            }
        }
    }

    /// Binds the member's UDP socket and spawns its task (`start`, and `connect` over UDP).
    fn spawn_udp(
        config: &GroupConfig,
        setup: MemberSetup,
        provider: CryptoProvider,
    ) -> Result<(Group, Events), Error> {
        let socket = bind(setup.listen)?;
        let local_addr = socket.local_addr().map_err(Error::Io)?;
        let batching = cohort_net::batch::Batching::from_env();
        let mut udp = cohort_net::batch::BatchUdp::new(socket, batching, UDP_RECV_SLOTS);
        udp.set_bundling(config.udp_bundle_bytes());
        Self::spawn(
            config,
            setup,
            transport::Transport::Udp(Box::new(udp)),
            local_addr,
            provider,
        )
    }

    fn spawn(
        config: &GroupConfig,
        mut setup: MemberSetup,
        transport: transport::Transport,
        local_addr: SocketAddr,
        provider: CryptoProvider,
    ) -> Result<(Group, Events), Error> {
        let seed = crate::os_seed(&provider).map_err(Error::Io)?;
        let max_datagram = setup.config.max_message_len;
        setup.config.carrier_fans_out = transport.fans_out();
        let member = cohort_group::GroupMember::new(
            provider,
            setup.credentials,
            local_addr,
            setup.config,
            seed,
        )
        .map_err(|e| Error::Config(config::core_error(e)))?;
        let id = member.id();
        let queue = Arc::new(queue::Queue::new(config.event_queue()));
        let (requests, request_rx) = mpsc::channel(256);
        let (view_tx, view) = watch::channel(task::Membership::Joining);
        let state_transfer = config.snapshot().is_some();
        tokio::spawn(task::run(task::Task::new(
            member,
            transport,
            setup.peers,
            request_rx,
            queue.clone(),
            view_tx,
            state_transfer,
            max_datagram,
        )));
        let group = Group {
            inner: Arc::new(Handle {
                requests: requests.clone(),
                view,
                id,
                local_addr,
                max_datagram,
            }),
        };
        let events = Events {
            queue,
            requests: requests.downgrade(),
            snapshot: config.snapshot().cloned(),
        };
        Ok((group, events))
    }

    /// Waits until the member is in a view, and returns it. [`Error::Closed`] if the member
    /// stopped first.
    pub async fn join(&self) -> Result<View, Error> {
        let mut view = self.inner.view.clone();
        loop {
            match &*view.borrow_and_update() {
                task::Membership::In(v) if v.contains(&self.inner.id) => return Ok(v.clone()),
                task::Membership::Stopped => return Err(Error::Closed),
                task::Membership::Out(reason) => return Err(Error::Expelled(*reason)),
                _ => {}
            }
            view.changed().await.map_err(|_| Error::Closed)?;
        }
    }

    /// Sends `data` on `channel` (see the module guide for the limits). Waits while the
    /// send window is full; returns the member's sequence number of the message (its last
    /// fragment).
    pub async fn send(&self, channel: Channel, data: impl Into<Vec<u8>>) -> Result<u64, Error> {
        let data = data.into();
        let limit = match channel {
            Channel::Reliable => MAX_MESSAGE,
            Channel::Unreliable => self.inner.max_datagram,
        };
        if data.len() > limit {
            return Err(Error::TooLong {
                len: data.len(),
                limit,
            });
        }
        self.call(|reply| task::Request::Send {
            channel,
            data,
            reply,
        })
        .await?
    }

    /// The installed view, if the member is in one.
    pub fn view(&self) -> Option<View> {
        match &*self.inner.view.borrow() {
            task::Membership::In(v) => Some(v.clone()),
            _ => None,
        }
    }

    /// This member's id.
    pub fn id(&self) -> MemberId {
        self.inner.id
    }

    /// The address the member's socket is bound to (and others reach it at).
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr
    }

    /// Asks for a fresh group key (the leader runs the rekey; [`Event::Rekeyed`] follows).
    pub async fn rekey(&self) -> Result<(), Error> {
        self.call(task::Request::Rekey).await
    }

    /// Replaces the set of principals allowed in (untrusted members are removed).
    pub async fn set_trust(&self, trusted: Vec<MemberId>) -> Result<(), Error> {
        self.call(|reply| task::Request::SetTrust { trusted, reply })
            .await
    }

    /// The principals this member trusts now.
    pub async fn trust(&self) -> Result<Vec<MemberId>, Error> {
        self.call(task::Request::Trust).await
    }

    /// Leaves the group and stops the member: returns once the group confirmed (or after
    /// [`LEAVE_TIMEOUT`]). The event stream ends after the final [`Event::Expelled`].
    /// Leaving a member that already stopped is not an error.
    pub async fn leave(&self) -> Result<(), Error> {
        match self.call(task::Request::Leave).await {
            Err(Error::Closed) => Ok(()),
            other => other,
        }
    }

    /// Waits until the member's task has stopped (after a leave, or a socket error).
    pub async fn closed(&self) {
        let mut view = self.inner.view.clone();
        while !matches!(*view.borrow_and_update(), task::Membership::Stopped) {
            if view.changed().await.is_err() {
                return;
            }
        }
    }

    /// The member's counters and state.
    pub async fn stats(&self) -> Result<Stats, Error> {
        self.call(task::Request::Stats).await
    }

    /// Test hook: the group key this member holds now (its epoch and bytes), for tests that
    /// search what a broker saw for key material. For tests only: it hands out the key.
    #[doc(hidden)]
    pub async fn danger_group_key_for_tests(
        &self,
    ) -> Result<Option<(u64, zeroize::Zeroizing<Vec<u8>>)>, Error> {
        self.call(task::Request::DangerKeyForTests).await
    }

    async fn call<T>(
        &self,
        request: impl FnOnce(oneshot::Sender<T>) -> task::Request,
    ) -> Result<T, Error> {
        let (reply, answer) = oneshot::channel();
        self.inner
            .requests
            .send(request(reply))
            .await
            .map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)
    }
}

/// Binds the member's UDP socket at `listen`.
/// Receive buffers a member's UDP socket fills per system call (64 KiB of address space
/// each, touched only as datagrams arrive; with GRO one holds several datagrams).
const UDP_RECV_SLOTS: usize = 8;

fn bind(listen: SocketAddr) -> Result<tokio::net::UdpSocket, Error> {
    cohort_net::bind_udp(listen).map_err(|e| {
        Error::Io(std::io::Error::new(
            e.kind(),
            format!("cannot listen on {listen}: {e}"),
        ))
    })
}

impl Events {
    /// The next event; `None` once the member has stopped and every event was read.
    ///
    /// At a view boundary where this member is to send the state (see the module guide),
    /// this calls the snapshot callback before it returns the event after the view.
    ///
    /// Cancel-safe: a `next` dropped before it returned (in a `select!`) loses no event.
    pub async fn next(&mut self) -> Option<Event> {
        loop {
            match self.queue.pop().await? {
                queue::Item::Event(event) => return Some(event),
                queue::Item::Provide(view) => {
                    let snapshot = self.snapshot.as_ref().map(|callback| {
                        callback().and_then(|bytes| {
                            if bytes.len() > MAX_STATE {
                                Err(format!(
                                    "snapshot of {} bytes over the limit of {MAX_STATE} bytes",
                                    bytes.len()
                                ))
                            } else {
                                Ok(bytes)
                            }
                        })
                    });
                    let failed = match &snapshot {
                        Some(Err(reason)) => Some(reason.clone()),
                        _ => None,
                    };
                    // The task may have stopped; then nobody waits for the snapshot. No
                    // await here: a `next` cancelled in a select! loses no snapshot.
                    if let Some(requests) = self.requests.upgrade() {
                        let request = task::Request::Snapshot { view, snapshot };
                        if let Err(mpsc::error::TrySendError::Full(request)) =
                            requests.try_send(request)
                        {
                            tokio::spawn(async move { requests.send(request).await });
                        }
                    }
                    if let Some(reason) = failed {
                        return Some(Event::SnapshotFailed { reason });
                    }
                }
            }
        }
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        self.queue.reader_gone();
    }
}

#[cfg(test)]
mod tests {
    /// The handles cross tasks and threads: the control socket holds a clone of `Group`.
    #[test]
    fn handles_are_send_and_sync() {
        fn shareable<T: Clone + Send + Sync + 'static>() {}
        fn sendable<T: Send + 'static>() {}
        shareable::<super::Group>();
        sendable::<super::Events>();
        sendable::<super::GroupConfig>();
        sendable::<super::Event>();
        sendable::<super::Error>();
    }
}
