//! The member's task: one `GroupMember`, its transport (a UDP socket or a NATS connection,
//! [`Transport`]) and its timers, driven in one loop
//! that never waits for the application. Requests come from [`Group`](super::Group)
//! handles; events go to the bounded [`Queue`]; reliable messages go out as fragments from
//! an ordered send queue that waits for the member's send window; state transfer's
//! snapshots go out on the same queue.

use super::frag::{self, Reassembler, Stream, MAX_MESSAGE};
use super::queue::Queue;
use super::state::{self, Answer, Tracker};
use super::transport::{Incoming, Transport};
use super::{Channel, Error, Event, MemberId, Stats, View, ViewId, LEAVE_TIMEOUT};
use cohort_core::{Machine, Timestamp};
use cohort_group::{Destination, GroupEvent, GroupMember, RemovalReason, SendError};
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

/// Where the member stands, for `join`, `view` and `closed`.
#[derive(Clone, Debug)]
pub enum Membership {
    /// Joining (or rejoining after a merge).
    Joining,
    /// In this view.
    In(View),
    /// Removed from the group; the task still runs.
    Out(RemovalReason),
    /// The task has stopped.
    Stopped,
}

/// A request from a handle.
pub enum Request {
    /// Send `data` on `channel`; answered once handed to the member.
    Send {
        channel: Channel,
        data: Vec<u8>,
        reply: oneshot::Sender<Result<u64, Error>>,
    },
    /// Ask for a fresh key.
    Rekey(oneshot::Sender<()>),
    /// Replace the trusted principals.
    SetTrust {
        trusted: Vec<MemberId>,
        reply: oneshot::Sender<()>,
    },
    /// The trusted principals.
    Trust(oneshot::Sender<Vec<MemberId>>),
    /// Leave and stop; answered when done.
    Leave(oneshot::Sender<()>),
    /// Counters.
    Stats(oneshot::Sender<Stats>),
    /// Test hook: the group key held now.
    DangerKeyForTests(oneshot::Sender<Option<(u64, zeroize::Zeroizing<Vec<u8>>)>>),
    /// The reader took the snapshot for `view` (`None`: it has no callback).
    Snapshot {
        view: ViewId,
        snapshot: Option<Result<Vec<u8>, String>>,
    },
}

/// Most bytes of partial messages held for reassembly (every sender together).
const REASSEMBLY_LIMIT: usize = 4 * MAX_MESSAGE;
/// Most events a joiner holds back while it waits for the state, and their payload bytes.
const HELD_EVENTS: usize = 1 << 16;
const HELD_BYTES: usize = 4 * MAX_MESSAGE;

/// One application message (or state answer) on its way into the member.
struct Outgoing {
    stream: Stream,
    len: usize,
    fragments: VecDeque<Vec<u8>>,
    started: bool,
    last_seq: u64,
    reply: Option<oneshot::Sender<Result<u64, Error>>>,
}

#[derive(Default)]
struct Counters {
    sent_messages: u64,
    sent_bytes: u64,
    delivered_messages: u64,
    delivered_bytes: u64,
    datagrams_sent: u64,
    datagram_bytes_sent: u64,
    datagrams_received: u64,
    datagram_bytes_received: u64,
    views: u64,
    rekeys: u64,
    last_rekey: Option<Duration>,
    snapshots_sent: u64,
    snapshots_received: u64,
}

/// The task's state.
pub struct Task {
    member: GroupMember,
    transport: Transport,
    peers: Vec<SocketAddr>,
    requests: mpsc::Receiver<Request>,
    queue: Arc<Queue>,
    membership: watch::Sender<Membership>,
    state_transfer: bool,
    out: VecDeque<Outgoing>,
    next_message: u32,
    payload: usize,
    reassembler: Reassembler,
    tracker: Tracker,
    held: VecDeque<Event>,
    held_bytes: usize,
    leaving: Option<(Instant, Vec<oneshot::Sender<()>>)>,
    stop: bool,
    counters: Counters,
    /// The view of the last reliable application message completed, and how many were
    /// completed in it: the `order` reported to the application.
    app_order: Option<(ViewId, u64)>,
}

impl Task {
    /// A task for `member` on `transport`, to join through `peers`.
    #[allow(clippy::too_many_arguments)] // reason: one call site, every part distinct
    pub fn new(
        member: GroupMember,
        transport: Transport,
        peers: Vec<SocketAddr>,
        requests: mpsc::Receiver<Request>,
        queue: Arc<Queue>,
        membership: watch::Sender<Membership>,
        state_transfer: bool,
        payload: usize,
    ) -> Self {
        let me = member.id();
        Task {
            member,
            transport,
            peers,
            requests,
            queue,
            membership,
            state_transfer,
            out: VecDeque::new(),
            next_message: 0,
            payload,
            reassembler: Reassembler::new(REASSEMBLY_LIMIT),
            tracker: Tracker::new(me),
            held: VecDeque::new(),
            held_bytes: 0,
            leaving: None,
            stop: false,
            counters: Counters::default(),
            app_order: None,
        }
    }
}

/// Runs the member until it leaves (or its transport fails).
pub async fn run(mut t: Task) {
    let epoch = Instant::now();
    let now =
        || Timestamp::from_nanos(u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX));
    let peers = std::mem::take(&mut t.peers);
    t.member.start(now(), &peers);
    let mut recv_buf = vec![0u8; cohort_net::MAX_DATAGRAM];
    let mut send_buf = Vec::with_capacity(cohort_net::MAX_DATAGRAM);
    let mut requests_open = true;
    let result: io::Result<()> = loop {
        // Drain in the order the Machine trait documents, until nothing moves: events can
        // queue sends (state answers), sends write datagrams.
        for _ in 0..16 {
            let t_now = now();
            t.pump(t_now);
            let fans_out = t.transport.fans_out();
            loop {
                let next = if fans_out {
                    t.member.poll_transmit_to(t_now, &mut send_buf)
                } else {
                    t.member
                        .poll_transmit(t_now, &mut send_buf)
                        .map(|tr| (Destination::Member(tr.destination), tr.size))
                };
                let Some((to, size)) = next else { break };
                // A full socket buffer or an unreachable peer loses the datagram, as a
                // network would; the protocol recovers.
                if let Ok(bytes) = t.transport.send(to, &send_buf[..size]).await {
                    t.counters.datagrams_sent += 1;
                    t.counters.datagram_bytes_sent += bytes as u64;
                }
                send_buf.clear();
            }
            // UDP queued them: one batch (GSO runs per destination) for the lot.
            let lost = t.transport.flush().await;
            t.counters.datagrams_sent = t.counters.datagrams_sent.saturating_sub(lost);
            let mut any = false;
            while let Some(event) = t.member.poll_event() {
                any = true;
                t.on_event(event);
            }
            if !any {
                break;
            }
        }
        if t.stop {
            break Ok(());
        }
        let deadline = t
            .member
            .poll_timeout()
            .map(|at| epoch + Duration::from_nanos(at.as_nanos()));
        let leave_deadline = t.leaving.as_ref().map(|(at, _)| *at);
        tokio::select! {
            received = t.transport.recv(&mut recv_buf) => match received {
                Ok(Incoming::Packet { from, len }) => {
                    t.counters.datagrams_received += 1;
                    t.counters.datagram_bytes_received += len as u64;
                    t.member.handle_datagram(now(), from, &recv_buf[..len]);
                }
                Ok(Incoming::Batch) => {
                    let at = now();
                    for (from, bytes) in t.transport.batch() {
                        t.counters.datagrams_received += 1;
                        t.counters.datagram_bytes_received += bytes.len() as u64;
                        t.member.handle_datagram(at, from, bytes);
                    }
                }
                Ok(Incoming::Event(what)) => {
                    tracing::info!("group member {}: {}: {what}", t.member.id(), t.transport.name());
                    t.queue.push(Event::Transport(what));
                }
                Err(e) => break Err(e),
            },
            () = sleep_until(deadline) => t.member.handle_timeout(now()),
            () = sleep_until(leave_deadline) => t.stop = true,
            request = t.requests.recv(), if requests_open => match request {
                Some(request) => t.on_request(now(), request),
                // Every handle is gone: leave, as a dropped handle would want.
                None => {
                    requests_open = false;
                    t.start_leave(now(), None);
                }
            },
        }
        // With batched UDP or NATS, take what else is ready (batches or packets, requests)
        // before the next round of sends, so one round carries what all of it makes the
        // member send.
        if let Err(e) = t.drain(&mut requests_open, &now, &mut recv_buf) {
            break Err(e);
        }
    };
    if let Err(e) = &result {
        tracing::warn!(
            "group member {}: the {} failed: {e}",
            t.member.id(),
            t.transport.name()
        );
    }
    t.finish();
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Most further receive rounds the loop takes without waiting after one wake-up (each
/// round: one UDP batch or up to [`DRAIN_PACKETS`] NATS packets, and up to
/// [`DRAIN_REQUESTS`] requests).
const DRAIN_ROUNDS: usize = 8;
/// Most requests one drain round takes.
const DRAIN_REQUESTS: usize = 32;
/// Most NATS packets one drain round takes (about what one UDP batch holds).
const DRAIN_PACKETS: usize = 32;

impl Task {
    /// Takes ready batches or packets and requests, without waiting and up to a bound, when
    /// the transport drains ([`Transport::drains`]: UDP with batching on, NATS); otherwise
    /// does nothing, as before batching. `buf` takes NATS packets.
    fn drain(
        &mut self,
        requests_open: &mut bool,
        now: &impl Fn() -> Timestamp,
        buf: &mut [u8],
    ) -> io::Result<()> {
        if !self.transport.drains() {
            return Ok(());
        }
        for _ in 0..DRAIN_ROUNDS {
            let mut moved = false;
            if self.transport.try_recv()? {
                let at = now();
                for (from, bytes) in self.transport.batch() {
                    moved = true;
                    self.counters.datagrams_received += 1;
                    self.counters.datagram_bytes_received += bytes.len() as u64;
                    self.member.handle_datagram(at, from, bytes);
                }
            }
            for _ in 0..DRAIN_PACKETS {
                let Some((from, len)) = self.transport.try_recv_packet(buf)? else {
                    break;
                };
                moved = true;
                self.counters.datagrams_received += 1;
                self.counters.datagram_bytes_received += len as u64;
                self.member.handle_datagram(now(), from, &buf[..len]);
            }
            let mut taken = 0;
            while *requests_open && taken < DRAIN_REQUESTS {
                match self.requests.try_recv() {
                    Ok(request) => {
                        moved = true;
                        taken += 1;
                        self.on_request(now(), request);
                    }
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => {
                        *requests_open = false;
                        self.start_leave(now(), None);
                    }
                }
            }
            if !moved || self.stop {
                break;
            }
        }
        Ok(())
    }

    fn on_request(&mut self, now: Timestamp, request: Request) {
        match request {
            Request::Send {
                channel,
                data,
                reply,
            } => match channel {
                Channel::Unreliable => {
                    let result = self
                        .member
                        .send(now, Channel::Unreliable, &data)
                        .map_err(|e| match e {
                            SendError::TooLong => Error::TooLong {
                                len: data.len(),
                                limit: self.payload,
                            },
                            e => Error::Send(e),
                        });
                    if result.is_ok() {
                        self.counters.sent_messages += 1;
                        self.counters.sent_bytes += data.len() as u64;
                    }
                    let _ = reply.send(result);
                }
                Channel::Reliable => self.enqueue(Stream::Data, &data, Some(reply)),
            },
            Request::Rekey(reply) => {
                self.member.rekey(now);
                let _ = reply.send(());
            }
            Request::SetTrust { trusted, reply } => {
                self.member.set_trust(now, trusted);
                let _ = reply.send(());
            }
            Request::Trust(reply) => {
                let _ = reply.send(self.member.trust().to_vec());
            }
            Request::Leave(reply) => self.start_leave(now, Some(reply)),
            Request::Stats(reply) => {
                let _ = reply.send(self.stats());
            }
            Request::DangerKeyForTests(reply) => {
                let _ = reply.send(self.member.danger_group_key_for_tests());
            }
            Request::Snapshot { view, snapshot } => {
                let answer = match snapshot {
                    None => Answer::None,
                    Some(Ok(bytes)) => Answer::Snapshot(bytes),
                    Some(Err(reason)) => Answer::Failed(reason),
                };
                self.send_state(view, &answer);
            }
        }
    }

    fn start_leave(&mut self, now: Timestamp, reply: Option<oneshot::Sender<()>>) {
        match &mut self.leaving {
            Some((_, waiting)) => waiting.extend(reply),
            None => {
                self.leaving = Some((Instant::now() + LEAVE_TIMEOUT, reply.into_iter().collect()));
                self.member.leave(now);
            }
        }
    }

    fn enqueue(
        &mut self,
        stream: Stream,
        data: &[u8],
        reply: Option<oneshot::Sender<Result<u64, Error>>>,
    ) {
        let message = self.next_message;
        self.next_message = self.next_message.wrapping_add(1);
        match frag::split(stream, message, data, self.payload) {
            Some(fragments) => self.out.push_back(Outgoing {
                stream,
                len: data.len(),
                fragments: fragments.into(),
                started: false,
                last_seq: 0,
                reply,
            }),
            None => {
                if let Some(reply) = reply {
                    let _ = reply.send(Err(Error::TooLong {
                        len: data.len(),
                        limit: MAX_MESSAGE,
                    }));
                }
            }
        }
    }

    fn send_state(&mut self, view: ViewId, answer: &Answer) {
        let body = state::encode(view, answer);
        if body.len() > MAX_MESSAGE {
            let reason = format!(
                "snapshot of {} bytes over the limit of {} bytes",
                body.len(),
                MAX_MESSAGE - 41
            );
            self.send_state(view, &Answer::Failed(reason));
            return;
        }
        self.counters.snapshots_sent += 1;
        self.enqueue(Stream::State, &body, None);
    }

    /// Hands queued fragments to the member while its window takes them.
    fn pump(&mut self, now: Timestamp) {
        while let Some(o) = self.out.front_mut() {
            while let Some(fragment) = o.fragments.front() {
                match self.member.send(now, Channel::Reliable, fragment) {
                    Ok(seq) => {
                        o.fragments.pop_front();
                        o.started = true;
                        o.last_seq = seq;
                    }
                    Err(SendError::WindowFull) => return,
                    // Between views (merging): the rest of a message under way waits.
                    Err(SendError::NotInGroup) if o.started => return,
                    Err(e) => {
                        if let Some(reply) = o.reply.take() {
                            let _ = reply.send(Err(Error::Send(e)));
                        }
                        break;
                    }
                }
            }
            let Some(o) = self.out.pop_front() else {
                return;
            };
            if o.fragments.is_empty() {
                if o.stream == Stream::Data {
                    self.counters.sent_messages += 1;
                    self.counters.sent_bytes += o.len as u64;
                }
                if let Some(reply) = o.reply {
                    let _ = reply.send(Ok(o.last_seq));
                }
            }
        }
    }

    /// Fails every queued send (the member is out of the group).
    fn fail_sends(&mut self, error: SendError) {
        for o in self.out.drain(..) {
            if let Some(reply) = o.reply {
                let _ = reply.send(Err(Error::Send(error)));
            }
        }
    }

    fn on_event(&mut self, event: GroupEvent) {
        let event = match event {
            GroupEvent::Deliver {
                channel,
                sender,
                view,
                seq,
                order,
                data,
            } => {
                let data = match channel {
                    Channel::Unreliable => data,
                    Channel::Reliable => match self.reassembler.push_owned(sender, data) {
                        None => return,
                        Some((Stream::Data, data)) => data,
                        Some((Stream::State, body)) => {
                            self.on_state(&body);
                            return;
                        }
                    },
                };
                // The application's order counts application messages only: fragments and
                // state messages take places in the core's total order too. Every member
                // completes the same messages in the same order, so the count agrees.
                let order = order.map(|_| {
                    let next = match self.app_order {
                        Some((v, n)) if v == view => n,
                        _ => 0,
                    };
                    self.app_order = Some((view, next + 1));
                    next
                });
                self.counters.delivered_messages += 1;
                self.counters.delivered_bytes += data.len() as u64;
                Event::Deliver {
                    channel,
                    sender,
                    view,
                    seq,
                    order,
                    data,
                }
            }
            GroupEvent::View(view) => {
                self.counters.views += 1;
                let ids: Vec<MemberId> = view.ids().collect();
                self.reassembler.retain(&ids);
                self.membership.send_replace(Membership::In(view.clone()));
                let provide = self.tracker.on_view(&view);
                let id = view.id;
                self.emit(Event::View(view));
                if provide && (!self.state_transfer || !self.queue.provide(id)) {
                    self.send_state(id, &Answer::None);
                }
                return;
            }
            GroupEvent::Rekeyed {
                key_epoch,
                members,
                took,
            } => {
                self.counters.rekeys += 1;
                if took.is_some() {
                    self.counters.last_rekey = took;
                }
                Event::Rekeyed {
                    key_epoch,
                    members,
                    took,
                }
            }
            GroupEvent::Removed { member, reason } => {
                self.reassembler.forget(&member);
                Event::Removed { member, reason }
            }
            GroupEvent::Expelled { reason } => {
                self.tracker.on_rejoin();
                self.fail_sends(SendError::NotInGroup);
                if self.leaving.is_some() && reason == RemovalReason::Left {
                    self.stop = true;
                    self.membership.send_replace(Membership::Stopped);
                } else {
                    self.membership.send_replace(Membership::Out(reason));
                }
                Event::Expelled { reason }
            }
            GroupEvent::Insecure { from } => Event::Insecure { from },
            GroupEvent::Merging { leader, into } => {
                self.tracker.on_rejoin();
                self.membership.send_replace(Membership::Joining);
                Event::Merging { leader, into }
            }
            other => Event::Protocol(other),
        };
        self.emit(event);
    }

    /// Queues an event for the reader, or holds it back while this member waits for the
    /// state.
    fn emit(&mut self, event: Event) {
        if self.tracker.waiting().is_none()
            || matches!(event, Event::View(_)) && self.held.is_empty()
        {
            self.queue.push(event);
            return;
        }
        let bytes = match &event {
            Event::Deliver { data, .. } => data.len(),
            _ => 0,
        };
        if self.held.len() >= HELD_EVENTS || self.held_bytes + bytes > HELD_BYTES {
            self.queue.count_lost(1);
            return;
        }
        self.held_bytes += bytes;
        self.held.push_back(event);
    }

    fn on_state(&mut self, body: &[u8]) {
        let Some((view, answer)) = state::decode(body) else {
            self.reassembler.note_garbage();
            tracing::debug!(
                "group member {}: a malformed state message",
                self.member.id()
            );
            return;
        };
        if !self.tracker.on_state(view) {
            return;
        }
        self.counters.snapshots_received += 1;
        match answer {
            Answer::Snapshot(bytes) => self.queue.push(Event::State(bytes)),
            Answer::None => {}
            Answer::Failed(reason) => self.queue.push(Event::StateUnavailable { reason }),
        }
        // The snapshot holds every delivery before its view.
        for event in std::mem::take(&mut self.held) {
            match &event {
                Event::Deliver { view: at, .. } if *at < view => {}
                _ => self.queue.push(event),
            }
        }
        self.held_bytes = 0;
    }

    fn stats(&self) -> Stats {
        let (events_queued, events_lost) = self.queue.counts();
        let c = &self.counters;
        Stats {
            status: self.member.status(),
            queued: self.out.iter().filter(|o| o.stream == Stream::Data).count(),
            sent_messages: c.sent_messages,
            sent_bytes: c.sent_bytes,
            delivered_messages: c.delivered_messages,
            delivered_bytes: c.delivered_bytes,
            datagrams_sent: c.datagrams_sent,
            datagram_bytes_sent: c.datagram_bytes_sent,
            datagrams_received: c.datagrams_received,
            datagram_bytes_received: c.datagram_bytes_received,
            views: c.views,
            rekeys: c.rekeys,
            last_rekey: c.last_rekey,
            fragments: self.reassembler.drops(),
            carrier_dropped: self.transport.dropped(),
            reassembly_bytes: self.reassembler.held(),
            events_queued,
            events_lost,
            snapshots_sent: c.snapshots_sent,
            snapshots_received: c.snapshots_received,
        }
    }

    /// Stops: answers the leave, fails the queued sends, ends the event stream.
    fn finish(mut self) {
        self.fail_sends(SendError::NotInGroup);
        if let Some((_, waiting)) = self.leaving.take() {
            for reply in waiting {
                let _ = reply.send(());
            }
        }
        self.membership.send_replace(Membership::Stopped);
        self.queue.close();
    }
}
