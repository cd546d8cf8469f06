//! The NATS transport of a group member (feature `nats`, issue 15): one async-nats
//! connection per member, subscribed to its group's subject and its own; each packet goes
//! out once, as a [`carriage`](super::carriage) message, to the group's subject (a
//! broadcast: the broker fans out) or to one member's subject. The broker carries sealed
//! packets only; it holds no key.
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
use std::time::Duration;
use tokio::sync::mpsc;

/// How to reach the brokers: the config's `nats`, `nats_credentials` and `nats_ca`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
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
    group_sub: Subscriber,
    own_sub: Subscriber,
    events: mpsc::Receiver<async_nats::Event>,
    member_subjects: HashMap<SocketAddr, Subject>,
    prefix: Vec<u8>,
    /// A probe [`NatsCarrier::try_recv`] took off a subscription: answered by the next
    /// [`NatsCarrier::recv`].
    held: Option<async_nats::Message>,
    dropped: u64,
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

/// Connects the member at `me` of `group`, checks that its own subject is free, and
/// subscribes. In KDC mode `kdc` is the KDC's name: packets to it go to the KDC's subject
/// (see [`NatsKdc`]). The error is one line naming the problem.
pub async fn connect(
    setup: &NatsSetup,
    group: &str,
    me: SocketAddr,
    kdc: Option<SocketAddr>,
) -> Result<NatsCarrier, String> {
    let (client, events) = client(setup, &format!("cohort {me}")).await?;
    let subjects = Subjects::new(group);
    let own = Subject::from(subjects.member(me));
    // A member already on this member's subject is another member of a group of the same
    // name at the same address: both would take each other's packets. (Other listeners,
    // such as a monitor subscribed to `>`, do not answer: the probe then times out.)
    probe(&client, &own, || {
        format!("another member of a group named {group:?} at {me} is on this broker")
    })
    .await?;
    let group_subject = Subject::from(subjects.group());
    let group_sub = subscribe(&client, &group_subject).await?;
    let own_sub = subscribe(&client, &own).await?;
    confirm(&client, setup).await?;
    let mut prefix = Vec::with_capacity(MAX_PREFIX);
    carriage::encode_prefix(me, &mut prefix);
    Ok(NatsCarrier {
        client,
        me,
        subjects,
        group_subject,
        own,
        kdc: kdc.map(|addr| (addr, Subject::from(carriage::kdc_subject(addr)))),
        group_sub,
        own_sub,
        events,
        member_subjects: HashMap::new(),
        prefix,
        held: None,
        dropped: 0,
    })
}

/// A client connected to the first server of `setup` that answers, with its connection
/// events. The error is one line naming the problem.
async fn client(
    setup: &NatsSetup,
    name: &str,
) -> Result<(Client, mpsc::Receiver<async_nats::Event>), String> {
    let (events_tx, events) = mpsc::channel(64);
    let mut options = ConnectOptions::new()
        .no_echo()
        .name(name)
        .connection_timeout(CONNECT_TIMEOUT)
        // The config's order is the member's preference: its nearest server first, the
        // rest of the cluster after (async-nats would shuffle them). After a server dies
        // the member tries the list from the top again and lands on the first that
        // answers; it goes back to its nearest only when that connection breaks too.
        .retain_servers_order()
        .event_callback(move |event| {
            let tx = events_tx.clone();
            async move {
                // A full queue loses connection events, never packets.
                let _ = tx.try_send(event);
            }
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
    Ok((client, events))
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
            let message = match self.held.take() {
                Some(message) => Some(message),
                None => tokio::select! {
                    m = self.group_sub.next() => m,
                    m = self.own_sub.next() => m,
                    Some(event) = self.events.recv() => return Ok(Carried::Event(event.to_string())),
                },
            };
            let Some(message) = message else {
                return Err(closed());
            };
            if let Some(reply) = message.reply {
                // A start-up probe of this member's subject: say it is taken.
                let _ = self.client.publish(reply, TAKEN.into()).await;
                continue;
            }
            if let Some((from, len)) = self.unwrap_into(&message.payload, buf) {
                return Ok(Carried::Packet { from, len });
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
            // A subscription that is not ready registers the no-op waker here; the task's
            // next `recv` polls it again with its own waker before it sleeps.
            let message = match self.group_sub.next().now_or_never() {
                Some(m) => m,
                None => match self.own_sub.next().now_or_never() {
                    Some(m) => m,
                    None => return Ok(None),
                },
            };
            let Some(message) = message else {
                return Err(closed());
            };
            if message.reply.is_some() {
                self.held = Some(message);
                return Ok(None);
            }
            if let Some(packet) = self.unwrap_into(&message.payload, buf) {
                return Ok(Some(packet));
            }
        }
    }

    /// The packet in a carriage `payload`, copied into `buf`: its sender and length. `None`
    /// for this member's own packets (the broker echoes broadcasts) and, counted as dropped,
    /// for what is not carriage or does not fit.
    fn unwrap_into(&mut self, payload: &[u8], buf: &mut [u8]) -> Option<(SocketAddr, usize)> {
        match carriage::parse(payload) {
            Ok((from, _)) if from == self.me => None,
            Ok((from, packet)) if packet.len() <= buf.len() => {
                buf[..packet.len()].copy_from_slice(packet);
                Some((from, packet.len()))
            }
            _ => {
                self.dropped += 1;
                None
            }
        }
    }

    /// Messages on this member's subjects that were not carriage (or too long): dropped.
    pub fn dropped(&self) -> u64 {
        self.dropped
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
    events: mpsc::Receiver<async_nats::Event>,
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
    let (client, events) = client(setup, &format!("cohort kdc {me}")).await?;
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
                Some(event) = self.events.recv() => return Ok(KdcCarried::Event(event.to_string())),
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
