//! The NATS transport of a group member (feature `nats`, issue 15): an async-nats
//! connection subscribed to its group's subject and its member's own; each packet goes
//! out once, as a [`carriage`](super::carriage) message, to the group's subject (a
//! broadcast: the broker fans out) or to one member's subject. The broker carries sealed
//! packets only; it holds no key.
//!
//! A member has a connection of its own ([`connect`]), or shares one with the other
//! members of its process ([`connect_shared`], through [`NatsLinks`]). On a shared
//! connection the process subscribes to a group's subject once: the broker sends each
//! broadcast to the process once, and a task of the process ([`fan_out`]) hands what arrived
//! to each of its members of that group, in batches, instead of the broker writing one copy
//! per member. A batch that one member sent all of is not handed back to it.
//!
//! ```text
//!   own connections:  broker --copy--> member a     shared:  broker --one copy--> process
//!                     broker --copy--> member b              fan_out --batch--> a, b, c
//!                     broker --copy--> member c
//! ```
//!
//! A KDC over NATS ([`NatsKdc`]) listens on a subject of its own; members in KDC mode
//! publish their requests there with their own subject as the reply subject.
//!
//! Start-up failures (an unreachable or refusing URL, bad credentials, a member subject
//! already taken) come back as one line from [`connect`]; at run time async-nats reconnects
//! on its own and its connection events come out of [`NatsCarrier::recv`].

use super::carriage::{self, Subjects, MAX_PREFIX};
use async_nats::{Client, ConnectOptions, Subject, Subscriber};
use cohort_group::Destination;
use futures_util::{FutureExt, StreamExt};
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, oneshot};

/// How to reach the brokers: the config's `nats`, `nats_credentials` and `nats_ca`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct NatsSetup {
    /// Server URLs (`nats://host:4222`, `tls://...`), nearest first: the member connects
    /// to the first that answers and, when that connection breaks, tries them in order again.
    pub urls: Vec<String>,
    /// A NATS credentials file (JWT and nkey seed).
    pub credentials: Option<PathBuf>,
    /// A CA certificate file (PEM): TLS is then required.
    pub ca: Option<PathBuf>,
}

/// How long start-up waits for a server, and for an answer to the subject probe.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// A member's answer to a probe of its subject.
const TAKEN: &[u8] = b"cohort: taken";
/// Most member subjects kept ready; beyond it the cache starts afresh.
const SUBJECT_CACHE: usize = 4096;
/// Connection events kept for a member that has not read them yet.
const EVENT_QUEUE: usize = 64;
/// On a shared connection: batches of group messages queued for one member of the
/// process. A member that falls this far behind loses the newest, as a full subscription
/// would (async-nats keeps 65,536 messages per subscription), and they are counted in
/// [`NatsCarrier::dropped`].
const SEAT_QUEUE: usize = 16_384;
/// On a shared connection: most messages in one batch (what has arrived is handed out at
/// once, up to this many).
const FAN_BATCH: usize = 64;

/// A member's connection to the brokers.
pub struct NatsCarrier {
    client: Client,
    me: SocketAddr,
    subjects: Subjects,
    group_subject: Subject,
    /// This member's subject: the reply subject of its requests to the KDC.
    own: Subject,
    /// KDC mode: the KDC's name and subject.
    kdc: Option<(SocketAddr, Subject)>,
    group_feed: GroupFeed,
    own_sub: Subscriber,
    events: broadcast::Receiver<String>,
    /// Until the connection's event callback is gone.
    events_open: bool,
    member_subjects: HashMap<SocketAddr, Subject>,
    prefix: Vec<u8>,
    /// The reply subject of a probe [`NatsCarrier::try_recv`] took off a subscription:
    /// answered by the next [`NatsCarrier::recv`].
    held: Option<Subject>,
    dropped: u64,
}

/// Where a member's group messages come from, and the ones it holds but has not read.
enum GroupFeed {
    /// Its own subscription on its own connection.
    Own {
        sub: Subscriber,
        /// The message taken off the subscription, not read yet.
        held: Option<async_nats::Message>,
    },
    /// Its queue from the process's one subscription on a shared connection.
    Shared {
        queue: mpsc::Receiver<Batch>,
        /// The batch in hand and how much of it has been read.
        held: Option<(Batch, usize)>,
        /// What the fan-out lost to this member's full queue.
        lost: Arc<AtomicU64>,
        /// Keeps the process's subscription while this member is on it.
        _fan: Arc<Fan>,
    },
}

/// Messages a shared connection's fan-out hands to each member at once: every member of
/// the process reads the same batch, so a batch costs one queue entry per member, not one
/// per message.
type Batch = Arc<[async_nats::Message]>;

impl GroupFeed {
    /// The next message held and not read yet, if any.
    fn front(&self) -> Option<&async_nats::Message> {
        match self {
            GroupFeed::Own { held, .. } => held.as_ref(),
            GroupFeed::Shared { held, .. } => held.as_ref().and_then(|(b, read)| b.get(*read)),
        }
    }

    /// Marks [`GroupFeed::front`] read.
    fn advance(&mut self) {
        match self {
            GroupFeed::Own { held, .. } => *held = None,
            GroupFeed::Shared { held, .. } => {
                if let Some((batch, read)) = held {
                    *read += 1;
                    if *read >= batch.len() {
                        *held = None;
                    }
                }
            }
        }
    }

    /// Waits for more messages; `false` once the connection closed for good. Cancel-safe.
    async fn fill(&mut self) -> bool {
        match self {
            GroupFeed::Own { sub, held } => {
                *held = sub.next().await;
                held.is_some()
            }
            GroupFeed::Shared { queue, held, .. } => {
                *held = queue.recv().await.map(|batch| (batch, 0));
                held.is_some()
            }
        }
    }

    /// Takes more messages if some have arrived, without waiting: whether it took any.
    /// An error: the connection closed for good.
    fn fill_now(&mut self) -> io::Result<bool> {
        match self {
            GroupFeed::Own { sub, held } => match sub.next().now_or_never() {
                Some(Some(message)) => {
                    *held = Some(message);
                    Ok(true)
                }
                Some(None) => Err(closed()),
                None => Ok(false),
            },
            GroupFeed::Shared { queue, held, .. } => match queue.try_recv() {
                Ok(batch) => {
                    *held = Some((batch, 0));
                    Ok(true)
                }
                Err(mpsc::error::TryRecvError::Empty) => Ok(false),
                Err(mpsc::error::TryRecvError::Disconnected) => Err(closed()),
            },
        }
    }

    /// Group messages lost before this member saw them.
    fn lost(&self) -> u64 {
        match self {
            GroupFeed::Own { .. } => 0,
            GroupFeed::Shared { lost, .. } => lost.load(Ordering::Relaxed),
        }
    }
}

/// What one carried message is to a member.
enum Step {
    /// A packet from `from`, copied into the caller's buffer (`len` bytes).
    Packet(SocketAddr, usize),
    /// A probe of the member's subject: the answer goes to this subject.
    Probe(Subject),
    /// Its own packet echoed back, or (counted as dropped) not carriage or too long.
    Skip,
}

/// What `message` is to the member `me` (a packet is copied into `buf`).
fn step(me: SocketAddr, dropped: &mut u64, message: &async_nats::Message, buf: &mut [u8]) -> Step {
    if let Some(reply) = &message.reply {
        return Step::Probe(reply.clone());
    }
    match carriage::parse(&message.payload) {
        Ok((from, _)) if from == me => Step::Skip,
        Ok((from, packet)) if packet.len() <= buf.len() => {
            buf[..packet.len()].copy_from_slice(packet);
            Step::Packet(from, packet.len())
        }
        _ => {
            *dropped += 1;
            Step::Skip
        }
    }
}

/// Connections to the brokers shared by the members of one process, one per distinct
/// [`NatsSetup`] (see [`Group::connect_sharing`](super::Group::connect_sharing)). Cloning
/// gives another handle to the same connections. A connection lives while a member or a
/// handle holds it.
#[derive(Clone, Default)]
pub struct NatsLinks {
    links: Arc<tokio::sync::Mutex<HashMap<NatsSetup, Arc<Link>>>>,
}

impl std::fmt::Debug for NatsLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsLinks").finish_non_exhaustive()
    }
}

/// One shared connection and the group subscriptions the process holds on it.
struct Link {
    client: Client,
    events: broadcast::Sender<String>,
    /// Group subject -> its fan-out, while a member is on it.
    fans: tokio::sync::Mutex<HashMap<String, Weak<Fan>>>,
}

/// The process's subscription to one group's subject, handed out to its members by a
/// task ([`fan_out`]); it unsubscribes when the last member's [`GroupFeed`] is dropped.
struct Fan {
    seats: Arc<Mutex<Vec<Seat>>>,
    /// Dropped with the fan: stops its task.
    _stop: oneshot::Sender<()>,
}

/// One member's place in a [`Fan`].
struct Seat {
    me: SocketAddr,
    queue: mpsc::Sender<Batch>,
    lost: Arc<AtomicU64>,
}

impl NatsLinks {
    /// No connections yet: the first member of each setup connects.
    pub fn new() -> NatsLinks {
        NatsLinks::default()
    }

    /// The connection for `setup`, connecting it if this process has none yet.
    async fn link(&self, setup: &NatsSetup) -> Result<Arc<Link>, String> {
        let mut links = self.links.lock().await;
        if let Some(link) = links.get(setup) {
            return Ok(link.clone());
        }
        let name = format!("cohort process {}", std::process::id());
        // Echo on: the process's members hear each other's packets through the broker.
        let (client, events, _) = client(setup, &name, true).await?;
        let link = Arc::new(Link {
            client,
            events,
            fans: tokio::sync::Mutex::default(),
        });
        links.insert(setup.clone(), link.clone());
        Ok(link)
    }
}

impl Link {
    /// A place for the member `me` in the process's subscription to `subject` (subscribing
    /// if no member of the process is on it): its queue and its loss counter.
    async fn seat(&self, subject: &Subject, me: SocketAddr) -> Result<GroupFeed, String> {
        let mut fans = self.fans.lock().await;
        let fan = match fans.get(subject.as_str()).and_then(Weak::upgrade) {
            Some(fan) => fan,
            None => {
                let sub = subscribe(&self.client, subject).await?;
                let (stop, stopped) = oneshot::channel();
                let fan = Arc::new(Fan {
                    seats: Arc::default(),
                    _stop: stop,
                });
                tokio::spawn(fan_out(sub, fan.seats.clone(), stopped));
                fans.insert(subject.to_string(), Arc::downgrade(&fan));
                fan
            }
        };
        let (queue, receiver) = mpsc::channel(SEAT_QUEUE);
        let lost = Arc::new(AtomicU64::new(0));
        fan.seats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Seat {
                me,
                queue,
                lost: lost.clone(),
            });
        Ok(GroupFeed::Shared {
            queue: receiver,
            held: None,
            lost,
            _fan: fan,
        })
    }
}

/// Hands the messages on the process's subscription `sub` to every seated member, in
/// batches of what has arrived (up to [`FAN_BATCH`]); a batch whose messages all come from
/// one member (named by the carriage prefix) is not handed back to it. A member whose queue
/// is full loses the batch; a member that is gone loses its seat. Ends when `stop` fires
/// (the last member left: dropping `sub` unsubscribes) or the connection closes for good
/// (the members' queues then close too).
async fn fan_out(
    mut sub: Subscriber,
    seats: Arc<Mutex<Vec<Seat>>>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut batch = Vec::with_capacity(FAN_BATCH);
    loop {
        let first = tokio::select! {
            m = sub.next() => m,
            _ = &mut stop => return,
        };
        let mut open = first.is_some();
        batch.extend(first);
        while open && batch.len() < FAN_BATCH {
            match sub.next().now_or_never() {
                Some(Some(message)) => batch.push(message),
                Some(None) => open = false,
                None => break,
            }
        }
        let mut seats = seats.lock().unwrap_or_else(|e| e.into_inner());
        if !batch.is_empty() {
            let sender = only_sender(&batch);
            let shared: Batch = batch.drain(..).collect();
            seats.retain(|seat| {
                if sender == Some(seat.me) {
                    return true;
                }
                match seat.queue.try_send(shared.clone()) {
                    Ok(()) => true,
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        seat.lost.fetch_add(shared.len() as u64, Ordering::Relaxed);
                        true
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => false,
                }
            });
        }
        if !open {
            seats.clear();
            return;
        }
    }
}

/// The member that sent every message of `batch`, if one did (a probe, with its reply
/// subject, counts as no member's).
fn only_sender(batch: &[async_nats::Message]) -> Option<SocketAddr> {
    let sender = |m: &async_nats::Message| match m.reply {
        Some(_) => None,
        None => carriage::parse(&m.payload).ok().map(|(from, _)| from),
    };
    let first = sender(batch.first()?)?;
    batch[1..]
        .iter()
        .all(|m| sender(m) == Some(first))
        .then_some(first)
}

/// The connection event for the application in what a receiver of connection events got:
/// `None`, and `open` false, once the connection's callback is gone (a closed subscription
/// follows).
fn event_text(got: Result<String, broadcast::error::RecvError>, open: &mut bool) -> Option<String> {
    match got {
        Ok(event) => Some(event),
        Err(broadcast::error::RecvError::Lagged(n)) => {
            Some(format!("{n} connection events missed"))
        }
        Err(broadcast::error::RecvError::Closed) => {
            *open = false;
            None
        }
    }
}

/// The error once a subscription ended: the connection closed for good.
fn closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "the NATS connection closed",
    )
}

/// What [`NatsCarrier::recv`] brings.
pub enum Carried {
    /// A packet from the member at `from`, copied into the caller's buffer (`len` bytes).
    Packet {
        /// The sender's address, from the carriage prefix.
        from: SocketAddr,
        /// Its length.
        len: usize,
    },
    /// A connection event (disconnected, reconnected, an error from the server).
    Event(String),
}

/// Connects the member at `me` of `group` over a connection of its own, checks that its
/// own subject is free, and subscribes. In KDC mode `kdc` is the KDC's name: packets to it
/// go to the KDC's subject (see [`NatsKdc`]). The error is one line naming the problem.
pub async fn connect(
    setup: &NatsSetup,
    group: &str,
    me: SocketAddr,
    kdc: Option<SocketAddr>,
) -> Result<NatsCarrier, String> {
    // No echo: on its own connection a member's broadcasts need not come back to it.
    let (client, _, events) = client(setup, &format!("cohort {me}"), false).await?;
    let subjects = Subjects::new(group);
    let group_subject = Subject::from(subjects.group());
    let own = claim(&client, &subjects, group, me).await?;
    let group_feed = GroupFeed::Own {
        sub: subscribe(&client, &group_subject).await?,
        held: None,
    };
    carrier(client, setup, subjects, me, own, kdc, group_feed, events).await
}

/// As [`connect`], on the connection `links` holds for `setup` (connecting it for the
/// process's first member of that setup): the process subscribes to each group's subject
/// once and hands every broadcast to its members itself.
pub async fn connect_shared(
    links: &NatsLinks,
    setup: &NatsSetup,
    group: &str,
    me: SocketAddr,
    kdc: Option<SocketAddr>,
) -> Result<NatsCarrier, String> {
    let link = links.link(setup).await?;
    let subjects = Subjects::new(group);
    let group_subject = Subject::from(subjects.group());
    let own = claim(&link.client, &subjects, group, me).await?;
    let group_feed = link.seat(&group_subject, me).await?;
    let events = link.events.subscribe();
    carrier(
        link.client.clone(),
        setup,
        subjects,
        me,
        own,
        kdc,
        group_feed,
        events,
    )
    .await
}

/// Checks that no member answers on `me`'s subject: its subject, and its subscription.
async fn claim(
    client: &Client,
    subjects: &Subjects,
    group: &str,
    me: SocketAddr,
) -> Result<(Subject, Subscriber), String> {
    let own = Subject::from(subjects.member(me));
    // A member already on this member's subject is another member of a group of the same
    // name at the same address: both would take each other's packets. (Other listeners,
    // such as a monitor subscribed to `>`, do not answer: the probe then times out.)
    probe(client, &own, || {
        format!("another member of a group named {group:?} at {me} is on this broker")
    })
    .await?;
    let own_sub = subscribe(client, &own).await?;
    Ok((own, own_sub))
}

/// The member's carrier, once the server confirmed its subscriptions.
#[allow(clippy::too_many_arguments)]
// reason: the parts of one carrier, named at its two call sites
async fn carrier(
    client: Client,
    setup: &NatsSetup,
    subjects: Subjects,
    me: SocketAddr,
    (own, own_sub): (Subject, Subscriber),
    kdc: Option<SocketAddr>,
    group_feed: GroupFeed,
    events: broadcast::Receiver<String>,
) -> Result<NatsCarrier, String> {
    confirm(&client, setup).await?;
    let mut prefix = Vec::with_capacity(MAX_PREFIX);
    carriage::encode_prefix(me, &mut prefix);
    Ok(NatsCarrier {
        client,
        me,
        group_subject: Subject::from(subjects.group()),
        subjects,
        own,
        kdc: kdc.map(|addr| (addr, Subject::from(carriage::kdc_subject(addr)))),
        group_feed,
        own_sub,
        events,
        events_open: true,
        member_subjects: HashMap::new(),
        prefix,
        held: None,
        dropped: 0,
    })
}

/// A client connected to the first server of `setup` that answers, and where its
/// connection events go out. With `echo`, what it publishes comes back to its own
/// subscriptions. The error is one line naming the problem.
async fn client(
    setup: &NatsSetup,
    name: &str,
    echo: bool,
) -> Result<
    (
        Client,
        broadcast::Sender<String>,
        broadcast::Receiver<String>,
    ),
    String,
> {
    let (events, first) = broadcast::channel(EVENT_QUEUE);
    let events_tx = events.clone();
    let mut options = ConnectOptions::new();
    if !echo {
        options = options.no_echo();
    }
    let mut options = options
        .name(name)
        .connection_timeout(CONNECT_TIMEOUT)
        // The config's order is the member's preference: its nearest server first, the
        // rest of the cluster after (async-nats would shuffle them). After a server dies
        // the member tries the list from the top again and lands on the first that
        // answers; it goes back to its nearest only when that connection breaks too.
        .retain_servers_order()
        .event_callback(move |event| {
            // A member that falls behind loses connection events, never packets; one with
            // none to read (or none yet) loses nothing else.
            let _ = events_tx.send(event.to_string());
            async {}
        });
    if let Some(path) = &setup.credentials {
        options = options
            .credentials_file(path)
            .await
            .map_err(|e| format!("nats_credentials: cannot use {}: {e}", path.display()))?;
    }
    if let Some(path) = &setup.ca {
        if !path.is_file() {
            return Err(format!(
                "nats_ca: {} is not a readable file",
                path.display()
            ));
        }
        options = options
            .add_root_certificates(path.clone())
            .require_tls(true);
    }
    let urls = setup.urls.join(", ");
    let client = tokio::time::timeout(CONNECT_TIMEOUT * 2, options.connect(setup.urls.clone()))
        .await
        .map_err(|_| format!("nats: no answer from {urls}"))?
        .map_err(|e| one_line(format!("nats: cannot connect to {urls}: {e}")))?;
    Ok((client, events, first))
}

/// Asks whether another cohort process already answers on `subject`; `taken` says who
/// that would be. A timeout or no responders: the subject is free.
async fn probe(
    client: &Client,
    subject: &Subject,
    taken: impl FnOnce() -> String,
) -> Result<(), String> {
    match tokio::time::timeout(
        PROBE_TIMEOUT,
        client.request(subject.clone(), Vec::new().into()),
    )
    .await
    {
        Ok(Ok(answer)) if answer.payload.as_ref() == TAKEN => {
            Err(format!("nats: subject {subject} is taken: {}", taken()))
        }
        Ok(Err(e))
            if !matches!(
                e.kind(),
                async_nats::RequestErrorKind::NoResponders | async_nats::RequestErrorKind::TimedOut
            ) =>
        {
            Err(format!("nats: cannot probe subject {subject}: {e}"))
        }
        _ => Ok(()),
    }
}

async fn subscribe(client: &Client, subject: &Subject) -> Result<Subscriber, String> {
    client
        .subscribe(subject.clone())
        .await
        .map_err(|e| format!("nats: cannot subscribe to {subject}: {e}"))
}

/// Waits until the server has seen the subscriptions.
async fn confirm(client: &Client, setup: &NatsSetup) -> Result<(), String> {
    client.flush().await.map_err(|e| {
        format!(
            "nats: {} did not confirm the subscriptions: {e}",
            setup.urls.join(", ")
        )
    })
}

/// `text` on one line (an error chain may hold line breaks).
fn one_line(text: String) -> String {
    if text.contains('\n') {
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    } else {
        text
    }
}

impl NatsCarrier {
    /// Publishes `packet` once to `to`'s subject; returns the bytes handed to the broker
    /// (the carriage prefix and the packet).
    pub async fn send(&mut self, to: Destination, packet: &[u8]) -> io::Result<usize> {
        if let Destination::Member(addr) = to {
            if let Some((_, kdc)) = self.kdc.as_ref().filter(|(k, _)| *k == addr) {
                // A request to the KDC: it answers on this member's subject.
                let kdc = kdc.clone();
                let payload = self.carriage(packet);
                let len = payload.len();
                self.client
                    .publish_with_reply(kdc, self.own.clone(), payload.into())
                    .await
                    .map_err(io::Error::other)?;
                return Ok(len);
            }
        }
        let subject = match to {
            Destination::Group => self.group_subject.clone(),
            Destination::Member(addr) => {
                if self.member_subjects.len() >= SUBJECT_CACHE {
                    self.member_subjects.clear();
                }
                self.member_subjects
                    .entry(addr)
                    .or_insert_with(|| Subject::from(self.subjects.member(addr)))
                    .clone()
            }
        };
        let payload = self.carriage(packet);
        let len = payload.len();
        self.client
            .publish(subject, payload.into())
            .await
            .map_err(io::Error::other)?;
        Ok(len)
    }

    /// This member's carriage prefix and `packet`, in one new buffer (which becomes the
    /// published message without another copy).
    fn carriage(&self, packet: &[u8]) -> Vec<u8> {
        let mut payload = Vec::with_capacity(self.prefix.len() + packet.len());
        payload.extend_from_slice(&self.prefix);
        payload.extend_from_slice(packet);
        payload
    }

    /// The next packet for this member (copied into `buf`) or connection event. Messages
    /// that do not parse are dropped and counted ([`NatsCarrier::dropped`]); this member's
    /// own are dropped. Cancel-safe. An error: the connection is closed for good.
    pub async fn recv(&mut self, buf: &mut [u8]) -> io::Result<Carried> {
        loop {
            if let Some(reply) = self.held.take() {
                // A start-up probe of this member's subject: say it is taken.
                let _ = self.client.publish(reply, TAKEN.into()).await;
                continue;
            }
            let taken = match self.group_feed.front() {
                Some(message) => {
                    let taken = step(self.me, &mut self.dropped, message, buf);
                    self.group_feed.advance();
                    taken
                }
                None => {
                    let message = tokio::select! {
                        open = self.group_feed.fill() => match open {
                            true => continue,
                            false => return Err(closed()),
                        },
                        m = self.own_sub.next() => m,
                        event = self.events.recv(), if self.events_open => {
                            match event_text(event, &mut self.events_open) {
                                Some(event) => return Ok(Carried::Event(event)),
                                None => continue,
                            }
                        }
                    };
                    let Some(message) = message else {
                        return Err(closed());
                    };
                    step(self.me, &mut self.dropped, &message, buf)
                }
            };
            match taken {
                Step::Packet(from, len) => return Ok(Carried::Packet { from, len }),
                Step::Probe(reply) => self.held = Some(reply),
                Step::Skip => {}
            }
        }
    }

    /// A packet that has already arrived (copied into `buf`), without waiting: `None` when
    /// none is ready. The member task drains what queued up while it worked this way, so
    /// one wake-up and one round of sends serve many packets. A probe of this member's
    /// subject (it needs an answer sent) stops the drain and waits for [`NatsCarrier::recv`].
    pub fn try_recv(&mut self, buf: &mut [u8]) -> io::Result<Option<(SocketAddr, usize)>> {
        loop {
            if self.held.is_some() {
                return Ok(None);
            }
            let taken = match self.group_feed.front() {
                Some(message) => {
                    let taken = step(self.me, &mut self.dropped, message, buf);
                    self.group_feed.advance();
                    taken
                }
                None => {
                    if self.group_feed.fill_now()? {
                        continue;
                    }
                    // A subscription that is not ready registers the no-op waker here; the
                    // task's next `recv` polls it again with its own waker before it sleeps.
                    match self.own_sub.next().now_or_never() {
                        Some(Some(message)) => step(self.me, &mut self.dropped, &message, buf),
                        Some(None) => return Err(closed()),
                        None => return Ok(None),
                    }
                }
            };
            match taken {
                Step::Packet(from, len) => return Ok(Some((from, len))),
                Step::Probe(reply) => {
                    self.held = Some(reply);
                    return Ok(None);
                }
                Step::Skip => {}
            }
        }
    }

    /// Messages on this member's subjects that it dropped: not carriage (or too long), or,
    /// on a shared connection, lost to its full queue.
    pub fn dropped(&self) -> u64 {
        self.dropped + self.group_feed.lost()
    }
}

/// A KDC's connection to the brokers (`cohort kdc serve` with `transport = "nats"`): it
/// listens on its own subject ([`carriage::kdc_subject`] of its name) and answers each
/// request on the requesting member's subject. Requests and replies travel as carriage;
/// the replies are sealed under each member's long-term key by the KDC, so the broker
/// carries no key.
pub struct NatsKdc {
    client: Client,
    subject: Subject,
    sub: Subscriber,
    events: broadcast::Receiver<String>,
    /// Until the connection's event callback is gone.
    events_open: bool,
    prefix: Vec<u8>,
    dropped: u64,
}

/// Where a KDC over NATS sends its answer to a request: the member subject the request
/// named as its reply subject, checked against its carriage prefix.
pub struct ReplySubject(Subject);

/// What [`NatsKdc::recv`] brings.
pub enum KdcCarried {
    /// A request from the member named `from`, copied into the caller's buffer.
    Request {
        /// The requester's name, from the carriage prefix.
        from: SocketAddr,
        /// Where the answer goes.
        reply: ReplySubject,
        /// The request's length.
        len: usize,
    },
    /// A connection event (disconnected, reconnected, an error from the server).
    Event(String),
}

/// Connects the KDC named `me` (its `listen`, not bound), checks that no other KDC serves
/// that name on these brokers, and subscribes to its subject. The error is one line naming
/// the problem.
pub async fn serve_kdc(setup: &NatsSetup, me: SocketAddr) -> Result<NatsKdc, String> {
    let (client, _, events) = client(setup, &format!("cohort kdc {me}"), false).await?;
    let subject = Subject::from(carriage::kdc_subject(me));
    probe(&client, &subject, || {
        format!("another KDC named {me} is on this broker")
    })
    .await?;
    let sub = subscribe(&client, &subject).await?;
    confirm(&client, setup).await?;
    let mut prefix = Vec::with_capacity(MAX_PREFIX);
    carriage::encode_prefix(me, &mut prefix);
    Ok(NatsKdc {
        client,
        subject,
        sub,
        events,
        events_open: true,
        prefix,
        dropped: 0,
    })
}

impl NatsKdc {
    /// The subject the KDC listens on.
    pub fn subject(&self) -> &str {
        self.subject.as_str()
    }

    /// The next request (copied into `buf`) or connection event. A message without a
    /// reply subject, one that is not carriage (or too long), or one whose reply subject
    /// is not the member subject of its sender is dropped and counted
    /// ([`NatsKdc::dropped`]); a start-up probe from another KDC is told the subject is
    /// taken. Cancel-safe. An error: the connection is closed for good.
    pub async fn recv(&mut self, buf: &mut [u8]) -> io::Result<KdcCarried> {
        loop {
            let message = tokio::select! {
                m = self.sub.next() => m,
                event = self.events.recv(), if self.events_open => {
                    match event_text(event, &mut self.events_open) {
                        Some(event) => return Ok(KdcCarried::Event(event)),
                        None => continue,
                    }
                }
            };
            let Some(message) = message else {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "the NATS connection closed",
                ));
            };
            let Some(reply) = message.reply else {
                self.dropped += 1;
                continue;
            };
            if message.payload.is_empty() {
                let _ = self.client.publish(reply, TAKEN.into()).await;
                continue;
            }
            match carriage::parse(&message.payload) {
                Ok((from, packet))
                    if packet.len() <= buf.len()
                        && carriage::is_member_subject_of(reply.as_str(), from) =>
                {
                    buf[..packet.len()].copy_from_slice(packet);
                    return Ok(KdcCarried::Request {
                        from,
                        reply: ReplySubject(reply),
                        len: packet.len(),
                    });
                }
                _ => self.dropped += 1,
            }
        }
    }

    /// Publishes `packet` (an answer) to `to` with the KDC's carriage prefix; returns the
    /// bytes handed to the broker.
    pub async fn reply(&mut self, to: ReplySubject, packet: &[u8]) -> io::Result<usize> {
        let mut payload = Vec::with_capacity(self.prefix.len() + packet.len());
        payload.extend_from_slice(&self.prefix);
        payload.extend_from_slice(packet);
        let len = payload.len();
        self.client
            .publish(to.0, payload.into())
            .await
            .map_err(io::Error::other)?;
        Ok(len)
    }

    /// Messages on the KDC's subject that were dropped before the KDC saw them.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message on the group's subject as the broker delivers it.
    fn carried(from: SocketAddr, packet: &[u8], reply: Option<&str>) -> async_nats::Message {
        let mut payload = Vec::new();
        carriage::encode_prefix(from, &mut payload);
        payload.extend_from_slice(packet);
        async_nats::Message {
            subject: Subject::from("cohort.test.all"),
            reply: reply.map(Subject::from),
            length: payload.len(),
            payload: payload.into(),
            headers: None,
            status: None,
            description: None,
        }
    }

    fn at(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn a_batch_goes_back_to_no_one_unless_one_member_sent_all_of_it() {
        let (a, b) = (at(1), at(2));
        assert_eq!(only_sender(&[]), None);
        assert_eq!(only_sender(&[carried(a, b"x", None)]), Some(a));
        assert_eq!(
            only_sender(&[carried(a, b"x", None), carried(a, b"y", None)]),
            Some(a)
        );
        assert_eq!(
            only_sender(&[carried(a, b"x", None), carried(b, b"y", None)]),
            None
        );
        // A probe, or what is not carriage, is no member's: the batch goes to everyone.
        assert_eq!(
            only_sender(&[carried(a, b"x", None), carried(a, b"y", Some("_INBOX.1"))]),
            None
        );
        let mut junk = carried(a, b"x", None);
        junk.payload = vec![9u8, 9, 9].into();
        assert_eq!(only_sender(&[carried(a, b"x", None), junk]), None);
    }

    #[test]
    fn a_member_takes_others_packets_skips_its_own_and_counts_junk() {
        let (me, other) = (at(1), at(2));
        let mut dropped = 0;
        let mut buf = [0u8; 8];
        assert!(matches!(
            step(me, &mut dropped, &carried(other, b"hello", None), &mut buf),
            Step::Packet(from, 5) if from == other
        ));
        assert_eq!(&buf[..5], b"hello");
        assert!(matches!(
            step(me, &mut dropped, &carried(me, b"mine", None), &mut buf),
            Step::Skip
        ));
        assert_eq!(dropped, 0, "its own echo is not junk");
        assert!(matches!(
            step(
                me,
                &mut dropped,
                &carried(other, b"too long!", None),
                &mut buf
            ),
            Step::Skip
        ));
        let mut junk = carried(other, b"x", None);
        junk.payload = vec![7u8].into();
        assert!(matches!(
            step(me, &mut dropped, &junk, &mut buf),
            Step::Skip
        ));
        assert_eq!(dropped, 2);
        assert!(matches!(
            step(me, &mut dropped, &carried(other, b"", Some("_INBOX.2")), &mut buf),
            Step::Probe(reply) if reply.as_str() == "_INBOX.2"
        ));
    }
}
