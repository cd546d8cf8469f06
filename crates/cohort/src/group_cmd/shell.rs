//! [`Shell`]: a group member as `cohort group bench` drives it (measurement only:
//! applications and `group run` use the library's `cohort::group` facade). It is itself a [`Machine`], so the tokio
//! driver runs it unchanged; around the member it adds what an application adds:
//!
//! * a bounded queue for reliable sends refused with `WindowFull`, retried after every
//!   input (own messages delivered free the window);
//! * a flood mode for `cohort group bench`: keep the send window full;
//! * replies to commands (status, counters, send errors) on the same event stream as the
//!   member's events, so they arrive in order with them;
//! * a probe that records the sizes of the datagrams one send produces (packet overhead).

use cohort_core::{Machine, Timestamp, Transmit};
use cohort_group::{Channel, GroupEvent, GroupMember, SendError};
use std::collections::VecDeque;
use std::net::SocketAddr;

/// What the shell needs from a member beyond [`Machine`]: sending. (A trait so the queue
/// logic is tested without the group core.)
pub trait Sender {
    /// As [`GroupMember::send`].
    fn send(&mut self, now: Timestamp, channel: Channel, data: &[u8]) -> Result<u64, SendError>;
}

impl Sender for GroupMember {
    fn send(&mut self, now: Timestamp, channel: Channel, data: &[u8]) -> Result<u64, SendError> {
        GroupMember::send(self, now, channel, data)
    }
}

/// Most reliable messages waiting for the send window before sends fail.
pub const QUEUE_LIMIT: usize = 4096;

/// An event of the member, or a reply of the shell.
#[derive(Debug)]
pub enum ShellEvent {
    /// The member's own event.
    Group(GroupEvent),
    /// A send failed (for a reason other than a full window).
    SendFailed(String),
    /// The datagrams one probed send produced: `(destination, size)`.
    Probe {
        /// The probed payload's length.
        payload: usize,
        /// Every datagram written in the drain that followed the send.
        packets: Vec<(SocketAddr, usize)>,
    },
}

/// A member with a send queue, a flood mode and command replies.
pub struct Shell<M> {
    member: M,
    queue: VecDeque<Vec<u8>>,
    flood: Option<(Channel, Vec<u8>)>,
    replies: VecDeque<ShellEvent>,
    probe: Option<(usize, Vec<(SocketAddr, usize)>)>,
}

impl<M: Machine<Event = GroupEvent> + Sender> Shell<M> {
    /// Wraps `member`.
    pub fn new(member: M) -> Self {
        Shell {
            member,
            queue: VecDeque::new(),
            flood: None,
            replies: VecDeque::new(),
            probe: None,
        }
    }

    /// The member.
    #[cfg(test)]
    pub fn member(&self) -> &M {
        &self.member
    }

    /// The member, for commands.
    pub fn member_mut(&mut self) -> &mut M {
        &mut self.member
    }

    /// Reliable messages waiting for the window.
    #[cfg(test)]
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Sends `data` on `channel`. A reliable message that meets a full window (or queued
    /// messages ahead of it) waits in the queue; a full queue, or any other refusal, comes
    /// back as a [`ShellEvent::SendFailed`].
    pub fn send(&mut self, now: Timestamp, channel: Channel, data: Vec<u8>) {
        if channel == Channel::Reliable && !self.queue.is_empty() {
            self.enqueue(data);
            self.pump(now);
            return;
        }
        match self.member.send(now, channel, &data) {
            Ok(_) => {}
            Err(SendError::WindowFull) if channel == Channel::Reliable => self.enqueue(data),
            Err(e) => self
                .replies
                .push_back(ShellEvent::SendFailed(e.to_string())),
        }
    }

    fn enqueue(&mut self, data: Vec<u8>) {
        if self.queue.len() >= QUEUE_LIMIT {
            self.replies.push_back(ShellEvent::SendFailed(format!(
                "send queue full ({QUEUE_LIMIT} messages wait for the window)"
            )));
        } else {
            self.queue.push_back(data);
        }
    }

    /// Sends `data` as [`Shell::send`] does and records the datagrams that follow.
    /// A send that is refused or has to wait produces a [`ShellEvent::SendFailed`] and no
    /// probe report.
    pub fn probe(&mut self, now: Timestamp, channel: Channel, data: Vec<u8>) {
        let (replies, queued) = (self.replies.len(), self.queue.len());
        self.probe = Some((data.len(), Vec::new()));
        self.send(now, channel, data);
        if self.replies.len() != replies {
            self.probe = None;
        } else if self.queue.len() != queued {
            self.probe = None;
            self.replies.push_back(ShellEvent::SendFailed(
                "probe: the send window is full (the message waits in the queue)".into(),
            ));
        }
    }

    /// Bench mode: from now on keep the window full of `data` on `channel` (`None` stops).
    pub fn set_flood(&mut self, now: Timestamp, flood: Option<(Channel, Vec<u8>)>) {
        self.flood = flood;
        self.pump(now);
    }

    /// Retries queued sends, then floods, until the window is full.
    fn pump(&mut self, now: Timestamp) {
        while let Some(data) = self.queue.front() {
            match self.member.send(now, Channel::Reliable, data) {
                Ok(_) => {
                    self.queue.pop_front();
                }
                Err(SendError::WindowFull) => return,
                Err(e) => {
                    // Not in a view right now (a view change): keep the queue and try again
                    // after the next input; anything else cannot succeed.
                    if e != SendError::NotInGroup {
                        self.queue.pop_front();
                        self.replies
                            .push_back(ShellEvent::SendFailed(e.to_string()));
                        continue;
                    }
                    return;
                }
            }
        }
        if let Some((channel, data)) = &self.flood {
            // Bounded: an unreliable flood (no window) must not spin forever.
            for _ in 0..1024 {
                if self.member.send(now, *channel, data).is_err() {
                    break;
                }
            }
        }
    }
}

impl<M: Machine<Event = GroupEvent> + Sender> Machine for Shell<M> {
    type Event = ShellEvent;

    fn handle_datagram(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        self.member.handle_datagram(now, from, data);
        self.pump(now);
    }

    fn handle_timeout(&mut self, now: Timestamp) {
        self.member.handle_timeout(now);
        self.pump(now);
    }

    fn poll_transmit(&mut self, now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
        let transmit = self.member.poll_transmit(now, buf)?;
        if let Some((_, packets)) = &mut self.probe {
            packets.push((transmit.destination, transmit.size));
        }
        Some(transmit)
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        self.member.poll_timeout()
    }

    fn poll_event(&mut self) -> Option<ShellEvent> {
        // The driver drains every transmit before the first event: a probe is complete.
        if let Some((payload, packets)) = self.probe.take() {
            self.replies
                .push_back(ShellEvent::Probe { payload, packets });
        }
        if let Some(event) = self.member.poll_event() {
            return Some(ShellEvent::Group(event));
        }
        self.replies.pop_front()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // reason: test code; a panic is the failure report
mod tests {
    use super::*;

    /// A member with a window of `window` that "delivers" its oldest message whenever a
    /// datagram arrives, and writes one datagram of payload + 10 bytes per send.
    struct Fake {
        window: usize,
        in_flight: usize,
        sent: Vec<Vec<u8>>,
        out: VecDeque<usize>,
        in_view: bool,
    }

    impl Sender for Fake {
        fn send(
            &mut self,
            _now: Timestamp,
            channel: Channel,
            data: &[u8],
        ) -> Result<u64, SendError> {
            if !self.in_view {
                return Err(SendError::NotInGroup);
            }
            if data.len() > 100 {
                return Err(SendError::TooLong);
            }
            if channel == Channel::Reliable {
                if self.in_flight == self.window {
                    return Err(SendError::WindowFull);
                }
                self.in_flight += 1;
            }
            self.sent.push(data.to_vec());
            self.out.push_back(data.len() + 10);
            Ok(self.sent.len() as u64)
        }
    }

    impl Machine for Fake {
        type Event = GroupEvent;
        fn handle_datagram(&mut self, _now: Timestamp, _from: SocketAddr, _data: &[u8]) {
            self.in_flight = self.in_flight.saturating_sub(1);
        }
        fn handle_timeout(&mut self, _now: Timestamp) {}
        fn poll_transmit(&mut self, _now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
            let size = self.out.pop_front()?;
            buf.resize(size, 0);
            Some(Transmit {
                destination: "127.0.0.1:9".parse().unwrap(),
                size,
            })
        }
        fn poll_timeout(&self) -> Option<Timestamp> {
            None
        }
        fn poll_event(&mut self) -> Option<GroupEvent> {
            None
        }
    }

    fn shell(window: usize) -> Shell<Fake> {
        Shell::new(Fake {
            window,
            in_flight: 0,
            sent: Vec::new(),
            out: VecDeque::new(),
            in_view: true,
        })
    }

    fn drain(s: &mut Shell<Fake>) -> Vec<ShellEvent> {
        let mut buf = Vec::new();
        while s.poll_transmit(Timestamp::ZERO, &mut buf).is_some() {
            buf.clear();
        }
        std::iter::from_fn(|| s.poll_event()).collect()
    }

    #[test]
    fn a_full_window_queues_in_order_and_drains_as_the_window_opens() {
        let mut s = shell(2);
        let now = Timestamp::ZERO;
        for i in 0..5u8 {
            s.send(now, Channel::Reliable, vec![i]);
        }
        assert_eq!(s.queued(), 3);
        // Unreliable messages do not wait behind reliable ones.
        s.send(now, Channel::Unreliable, vec![99]);
        assert!(drain(&mut s).is_empty());
        let from = "127.0.0.1:1".parse().unwrap();
        for _ in 0..3 {
            s.handle_datagram(now, from, b"");
        }
        assert_eq!(s.queued(), 0);
        let order: Vec<u8> = s.member().sent.iter().map(|d| d[0]).collect();
        assert_eq!(order, [0, 1, 99, 2, 3, 4]);
    }

    #[test]
    fn the_queue_is_bounded_and_other_errors_are_reported() {
        let mut s = shell(1);
        let now = Timestamp::ZERO;
        for _ in 0..QUEUE_LIMIT + 2 {
            s.send(now, Channel::Reliable, vec![1]);
        }
        assert_eq!(s.queued(), QUEUE_LIMIT);
        let events = drain(&mut s);
        assert_eq!(events.len(), 1);
        assert!(matches!(&events[0], ShellEvent::SendFailed(m) if m.contains("queue full")));
        s.send(now, Channel::Unreliable, vec![0; 101]);
        assert!(matches!(
            drain(&mut s).as_slice(),
            [ShellEvent::SendFailed(_)]
        ));
        s.member_mut().in_view = false;
        s.send(now, Channel::Unreliable, vec![0]);
        assert!(
            matches!(drain(&mut s).as_slice(), [ShellEvent::SendFailed(m)] if m.contains("not in"))
        );
    }

    #[test]
    fn flood_fills_the_window_after_every_input_and_a_probe_sees_the_packets() {
        let mut s = shell(4);
        let now = Timestamp::ZERO;
        s.set_flood(now, Some((Channel::Reliable, vec![7; 50])));
        assert_eq!(s.member().sent.len(), 4);
        s.handle_datagram(now, "127.0.0.1:1".parse().unwrap(), b"");
        assert_eq!(s.member().sent.len(), 5);
        s.set_flood(now, None);
        drain(&mut s);
        s.handle_datagram(now, "127.0.0.1:1".parse().unwrap(), b"");
        assert_eq!(s.member().sent.len(), 5);
        s.probe(now, Channel::Unreliable, vec![1; 30]);
        match drain(&mut s).as_slice() {
            [ShellEvent::Probe { payload, packets }] => {
                assert_eq!(*payload, 30);
                assert_eq!(packets.iter().map(|p| p.1).collect::<Vec<_>>(), [40]);
            }
            other => panic!("{other:?}"),
        }
        // A refused probe reports the refusal and no packets.
        s.member_mut().in_view = false;
        s.probe(now, Channel::Unreliable, vec![1; 30]);
        assert!(matches!(
            drain(&mut s).as_slice(),
            [ShellEvent::SendFailed(_)]
        ));
    }
}
