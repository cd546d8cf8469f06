//! The NATS transport of a group member (feature `nats`, issue 15): one async-nats
//! connection per member, subscribed to its group's subject and its own; each packet goes
//! out once, as a [`carriage`](super::carriage) message, to the group's subject (a
//! broadcast: the broker fans out) or to one member's subject. The broker carries sealed
//! packets only; it holds no key.
//!
//! Start-up failures (an unreachable or refusing URL, bad credentials, a member subject
//! already taken) come back as one line from [`connect`]; at run time async-nats reconnects
//! on its own and its connection events come out of [`NatsCarrier::recv`].

use super::carriage::{self, Subjects, MAX_PREFIX};
use async_nats::{Client, ConnectOptions, Subject, Subscriber};
use cohort_group::Destination;
use futures_util::StreamExt;
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
    group_sub: Subscriber,
    own_sub: Subscriber,
    events: mpsc::Receiver<async_nats::Event>,
    member_subjects: HashMap<SocketAddr, Subject>,
    prefix: Vec<u8>,
    payload: Vec<u8>,
    dropped: u64,
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
/// subscribes. The error is one line naming the problem.
pub async fn connect(
    setup: &NatsSetup,
    group: &str,
    me: SocketAddr,
) -> Result<NatsCarrier, String> {
    let (events_tx, events) = mpsc::channel(64);
    let mut options = ConnectOptions::new()
        .no_echo()
        .name(format!("cohort {me}"))
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
        .map_err(|e| format!("nats: cannot connect to {urls}: {e}"))?;
    let subjects = Subjects::new(group);
    let own = subjects.member(me);
    // A member already on this member's subject is another member of a group of the same
    // name at the same address: both would take each other's packets. (Other listeners,
    // such as a monitor subscribed to `>`, do not answer: the probe then times out.)
    match tokio::time::timeout(
        PROBE_TIMEOUT,
        client.request(own.clone(), Vec::new().into()),
    )
    .await
    {
        Ok(Ok(answer)) if answer.payload.as_ref() == TAKEN => {
            return Err(format!(
                "nats: subject {own} is taken: another member of a group named {group:?} \
                 at {me} is on this broker"
            ))
        }
        Ok(Err(e))
            if !matches!(
                e.kind(),
                async_nats::RequestErrorKind::NoResponders | async_nats::RequestErrorKind::TimedOut
            ) =>
        {
            return Err(format!("nats: cannot probe subject {own}: {e}"))
        }
        _ => {}
    }
    let group_subject = Subject::from(subjects.group());
    let group_sub = client
        .subscribe(group_subject.clone())
        .await
        .map_err(|e| format!("nats: cannot subscribe to {group_subject}: {e}"))?;
    let own_sub = client
        .subscribe(own.clone())
        .await
        .map_err(|e| format!("nats: cannot subscribe to {own}: {e}"))?;
    client
        .flush()
        .await
        .map_err(|e| format!("nats: {urls} did not confirm the subscriptions: {e}"))?;
    let mut prefix = Vec::with_capacity(MAX_PREFIX);
    carriage::encode_prefix(me, &mut prefix);
    Ok(NatsCarrier {
        client,
        me,
        subjects,
        group_subject,
        group_sub,
        own_sub,
        events,
        member_subjects: HashMap::new(),
        prefix,
        payload: Vec::new(),
        dropped: 0,
    })
}

impl NatsCarrier {
    /// Publishes `packet` once to `to`'s subject; returns the bytes handed to the broker
    /// (the carriage prefix and the packet).
    pub async fn send(&mut self, to: Destination, packet: &[u8]) -> io::Result<usize> {
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
        self.payload.clear();
        self.payload.extend_from_slice(&self.prefix);
        self.payload.extend_from_slice(packet);
        let len = self.payload.len();
        self.client
            .publish(subject, self.payload.clone().into())
            .await
            .map_err(io::Error::other)?;
        Ok(len)
    }

    /// The next packet for this member (copied into `buf`) or connection event. Messages
    /// that do not parse are dropped and counted ([`NatsCarrier::dropped`]); this member's
    /// own are dropped. Cancel-safe. An error: the connection is closed for good.
    pub async fn recv(&mut self, buf: &mut [u8]) -> io::Result<Carried> {
        loop {
            let message = tokio::select! {
                m = self.group_sub.next() => m,
                m = self.own_sub.next() => m,
                Some(event) = self.events.recv() => return Ok(Carried::Event(event.to_string())),
            };
            let Some(message) = message else {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "the NATS connection closed",
                ));
            };
            if let Some(reply) = message.reply {
                // A start-up probe of this member's subject: say it is taken.
                let _ = self.client.publish(reply, TAKEN.into()).await;
                continue;
            }
            match carriage::parse(&message.payload) {
                Ok((from, _)) if from == self.me => {}
                Ok((from, packet)) if packet.len() <= buf.len() => {
                    buf[..packet.len()].copy_from_slice(packet);
                    return Ok(Carried::Packet {
                        from,
                        len: packet.len(),
                    });
                }
                _ => self.dropped += 1,
            }
        }
    }

    /// Messages on this member's subjects that were not carriage (or too long): dropped.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}
