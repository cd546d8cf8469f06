//! The reliable totally ordered channel within one view: this member's own undelivered
//! messages, the sequencer at the leader (ordering, relaying the sender's sealed bytes),
//! the log, delivery in order, NAKs for gaps and the flow window.
//!
//! Owns: `Reliable` (log, delivery counters, pending messages, the sequencer, relayed and
//! awaited submissions). It may not start or end a view change: the view change reads its
//! log and asks it to `start_view`, `discard_undelivered` or `leave_view`.

use super::flush::Phase;
use super::output::{Destination, BROADCAST};
use super::timers::interval;
use super::GroupMember;
use crate::event::{Channel, Drop, GroupEvent};
use crate::wire::Msg;
use cohort_core::Timestamp;
use std::collections::{BTreeMap, HashMap, VecDeque};

/// The reliable channel in this view: the sequencer (at the leader), the log, delivery, NAKs and this member's own undelivered messages.
#[derive(Default)]
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct Reliable {
    pub(super) log: BTreeMap<u64, OrderedMsg>,
    pub(super) delivered: u64,
    pub(super) stable: u64,
    pub(super) last_ack_sent: u64,
    pub(super) last_nak: Option<Timestamp>,
    pub(super) delivered_at_leader_heartbeat: u64,
    pub(super) next_reliable: u64,
    pub(super) pending: VecDeque<Pending>,
    pub(super) delivered_reliable: u64,
    pub(super) sequencer: Option<Sequencer>,
    /// Relayed submissions waiting for their position: (sender rank, number) -> payload.
    pub(super) relayed: HashMap<(u16, u64), Vec<u8>>,
    /// Positions whose relayed submission has not arrived yet.
    pub(super) awaiting: HashMap<(u16, u64), u64>,
    /// By rank: the highest message number delivered from that sender in this view. Only
    /// senders that sent appear (a vector of n slots cost 16 bytes x n per member).
    pub(super) delivered_seq: BTreeMap<u16, u64>,
    /// One past the highest position this member knows was given (from Orders, Ordered
    /// or the leader's heartbeat): what it must NAK for while it has not delivered it.
    pub(super) known_end: u64,
}

/// Most ordered positions in flight beyond what every member acknowledged (see
/// `flow_window`). Members acknowledge every quarter of it.
pub(super) const FLOW_WINDOW: u64 = 256;

/// Most NAKed positions answered per NAK.
pub(super) const NAK_BATCH: u64 = 64;

/// A reliable message with its place in the total order.
#[derive(Clone, Debug)]
pub(super) struct OrderedMsg {
    pub(super) sender: u16,
    pub(super) seq: u64,
    pub(super) data: Vec<u8>,
}

/// An own reliable message not yet delivered.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct Pending {
    pub(super) seq: u64,
    pub(super) data: Vec<u8>,
    pub(super) sent_at: Option<Timestamp>,
}

/// A submission waiting at the sequencer: the payload, and the packet as it came when it
/// can be relayed to the members unchanged.
pub(super) type Submission = (Vec<u8>, Option<Vec<u8>>);

/// The leader's sequencer state for the current view.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct Sequencer {
    pub(super) next_order: u64,
    /// Per rank: the next message number expected from that sender.
    pub(super) expected: Vec<u64>,
    /// Per rank: submissions not yet ordered (the payload, and the packet as it came when
    /// it can be relayed).
    pub(super) early: Vec<BTreeMap<u64, Submission>>,
    /// Per rank: positions delivered there, from heartbeats.
    pub(super) acked: Vec<u64>,
    /// Per rank: last authenticated packet.
    pub(super) heard: Vec<Timestamp>,
    /// Per rank: latest load report (0-255) and failure count.
    pub(super) loads: Vec<(u8, u64)>,
    /// The sender whose turn it is to have a message ordered.
    pub(super) turn: usize,
    /// Per rank: the member named as holding `acked` (itself, or in an overlay view the
    /// member holding its subtree's minimum), the one removed if it lags.
    pub(super) holder: Vec<u16>,
    /// Per rank: reports to the leader directly (overlay views: the leader's children, and
    /// members whose overlay parent fell silent); the leader suspects these when silent,
    /// and sends them its broadcasts directly.
    pub(super) direct: Vec<bool>,
    /// Overlay views: the members reporting directly that are not the leader's children
    /// (their parent fell silent), in the order they started.
    pub(super) orphans: Vec<u16>,
    /// Overlay views: the last heartbeat packet sent down the tree, for a member that
    /// starts reporting directly.
    pub(super) last_heartbeat: Option<Vec<u8>>,
    /// Since when the backlog has held ordering back.
    pub(super) stalled_since: Option<Timestamp>,
    /// Positions given since the last `Orders` message: (sender rank, message number).
    pub(super) tokens: Vec<(u16, u64)>,
}

/// Empties `v` and fills it with `n` copies of `value`, keeping its allocation.
fn refill<T: Clone>(v: &mut Vec<T>, n: usize, value: T) {
    v.clear();
    v.resize(n, value);
}

/// The answers to a NAK for positions `lo..to` from `log`: at most [`NAK_BATCH`] of them.
pub(super) fn nak_answers(log: &BTreeMap<u64, OrderedMsg>, lo: u64, to: u64) -> Vec<Msg> {
    let end = to.min(lo.saturating_add(NAK_BATCH));
    log.range(lo..end)
        .map(|(order, m)| Msg::Ordered {
            order: *order,
            sender: m.sender,
            seq: m.seq,
            data: m.data.clone(),
        })
        .collect()
}

impl Reliable {
    /// The channel of a newly installed view of `n` members, where this member has rank
    /// `rank` and the members' next message numbers are `next_seqs`: positions and delivery
    /// start again from zero, own messages the view already carried are dropped and the
    /// others are sent again, and the leader (rank 0) gets a fresh sequencer.
    pub(super) fn start_view(&mut self, n: usize, next_seqs: &[u64], rank: usize, now: Timestamp) {
        self.log = BTreeMap::new();
        self.relayed.clear();
        self.awaiting.clear();
        self.delivered_seq = BTreeMap::new();
        self.known_end = 0;
        self.delivered = 0;
        self.stable = 0;
        self.last_ack_sent = 0;
        self.last_nak = None;
        self.delivered_at_leader_heartbeat = 0;
        let next_own = next_seqs.get(rank).copied().unwrap_or(self.next_reliable);
        self.pending.retain(|p| p.seq >= next_own);
        for p in self.pending.iter_mut() {
            p.sent_at = None;
        }
        self.next_reliable = self.next_reliable.max(next_own);
        // The leader keeps its per-rank vectors from the view before and refills them: a
        // view change at the leader of 10,000 otherwise freed and allocated six vectors of n
        // (and each large allocation made the allocator consolidate its free lists).
        let old = self.sequencer.take();
        self.sequencer = (rank == 0).then(|| {
            let mut s = old.unwrap_or_else(|| Sequencer {
                next_order: 0,
                expected: Vec::new(),
                early: Vec::new(),
                acked: Vec::new(),
                heard: Vec::new(),
                loads: Vec::new(),
                holder: Vec::new(),
                direct: Vec::new(),
                orphans: Vec::new(),
                last_heartbeat: None,
                turn: 0,
                stalled_since: None,
                tokens: Vec::new(),
            });
            s.next_order = 0;
            s.expected.clear();
            s.expected.extend_from_slice(next_seqs);
            s.early.clear();
            s.early.resize_with(n, BTreeMap::new);
            refill(&mut s.acked, n, 0);
            refill(&mut s.heard, n, now);
            refill(&mut s.loads, n, (0, 0));
            s.holder.clear();
            s.holder.extend((0..n).map(|r| r as u16));
            s.direct.clear();
            s.direct.extend((0..n).map(|r| {
                !super::overlay::active(n) || super::overlay::parent(r as u16) == Some(0)
            }));
            s.orphans.clear();
            s.last_heartbeat = None;
            s.turn = 0;
            s.stalled_since = None;
            s.tokens.clear();
            s
        });
    }

    /// A flush begins: positions logged beyond what this member delivered, and relayed
    /// submissions waiting for a position, are dropped (the coordinator settles which
    /// positions every survivor delivers).
    pub(super) fn discard_undelivered(&mut self) {
        let delivered = self.delivered;
        self.log.retain(|o, _| *o < delivered);
        self.relayed.clear();
        self.awaiting.clear();
    }

    /// This member leaves its component: no sequencer, no log; its undelivered messages
    /// stay, to be sent again in the next view.
    pub(super) fn leave_view(&mut self) {
        self.sequencer = None;
        self.log.clear();
        for p in self.pending.iter_mut() {
            p.sent_at = None;
        }
    }

    /// At the leader: records this member's own deliveries among the sequencer's
    /// acknowledgements and computes the stable point (every member delivered below it);
    /// when it is above the last one, moves it and drops the log below it. The stable
    /// point computed and whether it moved (`None` without a sequencer).
    pub(super) fn advance_stable(&mut self, my_rank: u16) -> Option<(u64, bool)> {
        let s = self.sequencer.as_mut()?;
        s.acked[usize::from(my_rank)] = self.delivered;
        let stable = s.acked.iter().copied().min().unwrap_or(0);
        if stable <= self.stable {
            return Some((stable, false));
        }
        self.stable = stable;
        self.log = self.log.split_off(&stable);
        Some((stable, true))
    }
}

impl GroupMember {
    /// Most positions the sequencer lets run ahead of the stable point: half the backlog,
    /// and at most [`FLOW_WINDOW`], so that a burst fits the members' socket buffers.
    pub(super) fn flow_window(&self) -> u64 {
        (self.config.backlog_limit as u64 / 2).clamp(1, FLOW_WINDOW)
    }

    pub(super) fn submit_pending(&mut self, now: Timestamp) {
        if self.view_change.flushing.is_some()
            || self.view_change.coordinator.is_some()
            || self.view.is_none()
        {
            return;
        }
        if self.is_leader() {
            let expected = self
                .reliable
                .sequencer
                .as_ref()
                .map_or(0, |s| s.expected[usize::from(self.rank)]);
            let due: Vec<(u64, Vec<u8>)> = self
                .reliable
                .pending
                .iter()
                .filter(|p| p.seq >= expected)
                .map(|p| (p.seq, p.data.clone()))
                .collect();
            let rank = self.rank;
            for (seq, data) in due {
                self.on_submit(now, rank, seq, data, None);
            }
            return;
        }
        let Some(leader) = self.view.as_ref().map(|v| v.leader().addr) else {
            return;
        };
        let resend = interval::submit_resend(&self.config);
        for i in 0..self.reliable.pending.len() {
            let p = &mut self.reliable.pending[i];
            if p.sent_at
                .is_some_and(|t| now.saturating_duration_since(t) < resend)
            {
                continue;
            }
            p.sent_at = Some(now);
            // The payload is lent to the message while it is sealed, then put back: no copy
            // of it but the one sealing writes.
            let msg = Msg::Submit {
                seq: p.seq,
                data: std::mem::take(&mut p.data),
            };
            // Addressed to everyone, sent to the leader: it relays these very bytes.
            self.seal_to([Destination::Member(leader)], BROADCAST, &msg);
            if let Msg::Submit { data, .. } = msg {
                self.reliable.pending[i].data = data;
            }
        }
    }

    pub(super) fn on_submit(
        &mut self,
        now: Timestamp,
        rank: u16,
        seq: u64,
        data: Vec<u8>,
        raw: Option<Vec<u8>>,
    ) {
        if self.view_change.coordinator.is_some() || self.view_change.flushing.is_some() {
            return;
        }
        let window = self.config.send_window as u64;
        let Some(s) = self.reliable.sequencer.as_mut() else {
            self.counters.count(Drop::Unexpected);
            return;
        };
        let r = usize::from(rank);
        if seq < s.expected[r] || seq - s.expected[r] > window {
            return; // already ordered, or beyond the sender's window
        }
        s.early[r].entry(seq).or_insert((data, raw));
        self.drain_sequencer(now);
    }

    /// Orders queued submissions while the backlog has room: senders take turns, each
    /// sender's messages go in number order. When the backlog reaches half its limit the
    /// sequencer waits for acknowledgements (back-pressure on every sender, the leader
    /// included); a member that keeps it waiting too long is removed as lagging.
    pub(super) fn drain_sequencer(&mut self, now: Timestamp) {
        // Nothing is ordered during a view change: the flush alone decides what the view
        // delivers (queued submissions come back as the senders' pending messages).
        if self.view_change.coordinator.is_some() || self.view_change.flushing.is_some() {
            return;
        }
        self.drain_sequencer_inner(now);
        self.flush_tokens();
    }

    /// Sends the positions given since the last call as one `Orders` message.
    pub(super) fn flush_tokens(&mut self) {
        let Some(s) = self.reliable.sequencer.as_mut() else {
            return;
        };
        if s.tokens.is_empty() {
            return;
        }
        let entries = std::mem::take(&mut s.tokens);
        let first = s.next_order - entries.len() as u64;
        let _ = self.tree_broadcast(&Msg::Orders { first, entries });
    }

    pub(super) fn drain_sequencer_inner(&mut self, now: Timestamp) {
        let high = self.flow_window();
        loop {
            let stable = self.reliable.stable;
            let Some(s) = self.reliable.sequencer.as_mut() else {
                return;
            };
            let n = s.expected.len();
            let ready = (0..n)
                .map(|k| (s.turn + k) % n)
                .find(|r| s.early[*r].contains_key(&s.expected[*r]));
            let Some(r) = ready else {
                s.stalled_since = None;
                return;
            };
            if s.next_order.saturating_sub(stable) >= high {
                s.stalled_since.get_or_insert(now);
                return;
            }
            s.stalled_since = None;
            let seq = s.expected[r];
            let Some((data, raw)) = s.early[r].remove(&seq) else {
                return;
            };
            s.expected[r] += 1;
            s.turn = (r + 1) % n;
            self.order(now, r as u16, seq, data, raw);
        }
    }

    /// Sequencer: gives a message its position. The payload goes to everyone as the
    /// sender's own sealed packet (relayed unchanged; the leader seals its own messages the
    /// same way), the position in the next `Orders` message: one encryption per message, by
    /// its sender, and a small token per batch.
    pub(super) fn order(
        &mut self,
        now: Timestamp,
        sender: u16,
        seq: u64,
        data: Vec<u8>,
        raw: Option<Vec<u8>>,
    ) {
        let Some(s) = self.reliable.sequencer.as_mut() else {
            return;
        };
        let order = s.next_order;
        s.next_order += 1;
        s.tokens.push((sender, seq));
        if s.tokens.len() >= crate::wire::MAX_ORDERS {
            self.flush_tokens();
        }
        let packet = match raw {
            Some(p) => Some(p),
            None if sender == self.rank => self.seal(
                BROADCAST,
                &Msg::Submit {
                    seq,
                    data: data.clone(),
                },
            ),
            None => None,
        };
        let sender_addr = self.member_at(sender).map(|m| m.addr);
        match packet {
            // In an overlay view the packet goes down the tree (its sender passes it on to
            // its own children like any member).
            Some(packet) if self.overlay_active() || self.config.carrier_fans_out => {
                self.send_down(&packet)
            }
            Some(packet) => {
                let others: Vec<Destination> = self
                    .others()
                    .map(|m| m.addr)
                    .filter(|a| Some(*a) != sender_addr)
                    .map(Destination::Member)
                    .collect();
                self.out.push_copies(others, &packet);
            }
            None => {
                // Not relayable (addressed to the leader alone): members fetch it by Nak.
            }
        }
        self.reliable
            .log
            .insert(order, OrderedMsg { sender, seq, data });
        self.deliver_ready(now);
    }

    /// A member: a submission relayed by the sequencer; it waits for its position.
    pub(super) fn on_relayed(&mut self, now: Timestamp, rank: u16, seq: u64, data: Vec<u8>) {
        if self.view_change.flushing.is_some() || self.view_change.coordinator.is_some() {
            return;
        }
        if let Some(order) = self.reliable.awaiting.remove(&(rank, seq)) {
            if order >= self.reliable.delivered {
                self.reliable.log.entry(order).or_insert(OrderedMsg {
                    sender: rank,
                    seq,
                    data,
                });
                self.deliver_ready(now);
            }
            return;
        }
        let stale = self
            .reliable
            .delivered_seq
            .get(&rank)
            .is_some_and(|d| seq <= *d);
        if stale {
            return; // already delivered (recovered by a NAK first)
        }
        if self.reliable.relayed.len() >= 4 * FLOW_WINDOW as usize {
            // Bounded. Entries pile up only when positions were recovered another way;
            // start afresh (anything still needed is fetched by NAK).
            self.reliable.relayed.clear();
        }
        self.reliable.relayed.insert((rank, seq), data);
    }

    /// A member: positions for relayed submissions (and its own).
    pub(super) fn on_orders(
        &mut self,
        now: Timestamp,
        from_rank: u16,
        first: u64,
        entries: Vec<(u16, u64)>,
    ) {
        if from_rank != 0
            || self.view_change.flushing.is_some()
            || self.view_change.coordinator.is_some()
        {
            self.counters.count(Drop::Unexpected);
            return;
        }
        let members = self.view.as_ref().map_or(0, |v| v.members.len());
        let limit = self.reliable.delivered + self.config.backlog_limit as u64;
        let count = entries.len() as u64;
        for (i, (sender, seq)) in entries.into_iter().enumerate() {
            let order = first.saturating_add(i as u64);
            if usize::from(sender) >= members {
                self.counters.count(Drop::Unexpected);
                continue;
            }
            if order < self.reliable.delivered
                || order >= limit
                || self.reliable.log.contains_key(&order)
            {
                continue;
            }
            let data = if sender == self.rank {
                self.reliable
                    .pending
                    .iter()
                    .find(|p| p.seq == seq)
                    .map(|p| p.data.clone())
            } else {
                self.reliable.relayed.remove(&(sender, seq))
            };
            match data {
                Some(data) => {
                    self.reliable
                        .log
                        .insert(order, OrderedMsg { sender, seq, data });
                }
                None => {
                    if self.reliable.awaiting.len() >= 4 * FLOW_WINDOW as usize {
                        self.reliable.awaiting.clear();
                    }
                    self.reliable.awaiting.insert((sender, seq), order);
                }
            }
        }
        self.deliver_ready(now);
        let end = first.saturating_add(count);
        self.reliable.known_end = self.reliable.known_end.max(end);
        if self.reliable.delivered < end {
            self.nak_gap(now, Some(end));
        }
    }

    pub(super) fn on_ordered(
        &mut self,
        now: Timestamp,
        from_rank: u16,
        order: u64,
        sender: u16,
        seq: u64,
        data: Vec<u8>,
    ) {
        if self.store_ordered(from_rank, order, sender, seq, data) {
            self.after_ordered(now);
        }
    }

    /// A [`Msg::OrderedRun`]: each entry as an [`Msg::Ordered`] at its position, then what
    /// follows a stored position once for the whole run.
    pub(super) fn on_ordered_run(
        &mut self,
        now: Timestamp,
        from_rank: u16,
        first: u64,
        entries: Vec<(u16, u64, Vec<u8>)>,
    ) {
        let mut stored = false;
        for (order, (sender, seq, data)) in (first..).zip(entries) {
            // The checks are per entry, as for single messages; one from the wrong member
            // fails them all, and is counted once per entry.
            stored |= self.store_ordered(from_rank, order, sender, seq, data);
        }
        if stored {
            self.after_ordered(now);
        }
    }

    /// Stores the message at `order` from `from_rank`, if that member may order messages
    /// now and the position is in the window; false (counted when not allowed) otherwise.
    fn store_ordered(
        &mut self,
        from_rank: u16,
        order: u64,
        sender: u16,
        seq: u64,
        data: Vec<u8>,
    ) -> bool {
        // Accept ordering only from the sequencer, or during a flush from the coordinator
        // or from the survivor the coordinator is fetching from.
        let allowed = match (&self.view_change.flushing, &self.view_change.coordinator) {
            (_, Some(c)) => matches!(c.phase, Phase::Fetch { from, .. } if from == from_rank),
            (Some(f), None) => f.coordinator == from_rank,
            (None, None) => from_rank == 0,
        };
        if !allowed {
            self.counters.count(Drop::Unexpected);
            return false;
        }
        let members = self.view.as_ref().map_or(0, |v| v.members.len());
        if usize::from(sender) >= members {
            self.counters.count(Drop::Unexpected);
            return false;
        }
        if order < self.reliable.delivered
            || order >= self.reliable.delivered + self.config.backlog_limit as u64
        {
            return false;
        }
        self.reliable
            .log
            .entry(order)
            .or_insert(OrderedMsg { sender, seq, data });
        true
    }

    /// After a position was stored: the flush goes on, or what is ready is delivered and a
    /// gap behind it asked for.
    fn after_ordered(&mut self, now: Timestamp) {
        if self.view_change.flushing.is_some() || self.view_change.coordinator.is_some() {
            self.progress_flush(now);
            return;
        }
        self.deliver_ready(now);
        if self
            .reliable
            .log
            .range(self.reliable.delivered..)
            .next()
            .is_some()
        {
            self.nak_gap(now, None);
        }
    }

    /// Delivers contiguous positions from the log (not during a view change).
    pub(super) fn deliver_ready(&mut self, now: Timestamp) {
        if self.view_change.flushing.is_some() || self.view_change.coordinator.is_some() {
            return;
        }
        self.deliver_up_to(u64::MAX);
        let _ = now;
        if self.reliable.delivered >= self.reliable.last_ack_sent + (self.flow_window() / 4).max(1)
        {
            self.send_heartbeat(now);
        }
    }

    pub(super) fn deliver_up_to(&mut self, limit: u64) {
        let Some(view) = self.view.as_ref() else {
            return;
        };
        let view_id = view.id;
        while self.reliable.delivered < limit {
            let Some(m) = self.reliable.log.get(&self.reliable.delivered) else {
                break;
            };
            let Some(sender) = self
                .view
                .as_ref()
                .and_then(|v| v.members.get(usize::from(m.sender)))
            else {
                break;
            };
            let (sender_id, seq, data) = (sender.id, m.seq, m.data.clone());
            let rank = m.sender;
            self.reliable.delivered_seq.insert(rank, seq);
            self.reliable.relayed.remove(&(rank, seq));
            self.reliable.awaiting.remove(&(rank, seq));
            let order = self.reliable.delivered;
            self.reliable.delivered += 1;
            self.reliable.delivered_reliable += 1;
            if sender_id == self.id {
                while self.reliable.pending.front().is_some_and(|p| p.seq <= seq) {
                    self.reliable.pending.pop_front();
                }
            }
            self.events.push_back(GroupEvent::Deliver {
                channel: Channel::Reliable,
                sender: sender_id,
                view: view_id,
                seq,
                order: Some(order),
                data,
            });
        }
    }

    pub(super) fn nak_gap(&mut self, now: Timestamp, known_end: Option<u64>) {
        if self.is_leader() {
            return;
        }
        let retry = interval::nak_retry(&self.config);
        if self
            .reliable
            .last_nak
            .is_some_and(|t| now.saturating_duration_since(t) < retry)
        {
            return;
        }
        let next_have = self
            .reliable
            .log
            .range(self.reliable.delivered..)
            .next()
            .map(|(o, _)| *o);
        let to = match (next_have, known_end) {
            (Some(a), _) => a,
            (None, Some(b)) => b,
            (None, None) => return,
        };
        if to <= self.reliable.delivered {
            return;
        }
        self.reliable.last_nak = Some(now);
        let Some(leader) = self.view.as_ref().map(|v| v.leader().addr) else {
            return;
        };
        let msg = Msg::Nak {
            from: self.reliable.delivered,
            to,
        };
        self.send_msg(leader, &msg);
    }

    pub(super) fn on_nak(&mut self, _now: Timestamp, rank: u16, lo: u64, to: u64) {
        let Some(dest) = self.member_at(rank) else {
            return;
        };
        // A NAK below the stable point is stale (the member acknowledged more since): every
        // member's acknowledgement is at or above it. Lagging is detected by the backlog.
        for msg in nak_answers(&self.reliable.log, lo, to) {
            self.send_msg(dest.addr, &msg);
        }
    }
}
