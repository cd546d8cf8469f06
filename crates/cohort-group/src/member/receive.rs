//! The receive path: a datagram's header, the keys that open it, and the dispatch of the
//! message inside to the concern that owns it. Pair-channel messages (joins, key shares,
//! tickets) are dispatched here too. In an overlay view it passes the leader's broadcasts
//! on to this member's overlay children, unchanged, once they opened (`overlay.rs`).
//!
//! Owns: the `Insecure` reports (`insecure_reported`). It opens packets with the current
//! or a kept old view's keys and counts what it drops. Besides noting who was heard
//! (`liveness.leader_heard`, the sequencer's `heard`), it changes no protocol state itself:
//! it calls the owning concern's `on_*` handler.

use super::flush::Phase;
use super::output::BROADCAST;
use super::reliable::nak_answers;
use super::GroupMember;
use crate::event::{Channel, Drop, DropCounters, GroupEvent, RemovalReason};
use crate::id::{MemberId, View, ViewId};
use crate::keys;
use crate::pair::PairEvent;
use crate::wire::{Msg, PairMsg, ViewRef};
use cohort_core::Timestamp;
use cohort_gears::DropReason;
use std::net::SocketAddr;
use std::time::Duration;
use zeroize::Zeroize;

/// The largest receive buffer a member keeps between packets; a larger packet's buffer is
/// freed after it (one large packet does not pin its size for the member's life).
const RECEIVED_KEEP: usize = 16 * 1024;

/// Parses a protected body: the destination rank, then the message. A message for another
/// member (a copy replayed to the wrong place) is dropped as unexpected.
pub(super) fn decode_for(body: &[u8], my_rank: u16, counters: &mut DropCounters) -> Option<Msg> {
    if body.len() < 2 {
        counters.count(Drop::Malformed);
        return None;
    }
    let dest = u16::from_be_bytes([body[0], body[1]]);
    if dest != BROADCAST && dest != my_rank {
        counters.count(Drop::Unexpected);
        return None;
    }
    let msg = Msg::decode(&body[2..]);
    if msg.is_none() {
        counters.count(Drop::Malformed);
    }
    msg
}

/// The view id `r` names, given the view whose keys sealed the message (see [`ViewRef`]):
/// its coordinator is the member at that rank there.
fn resolve(view: &View, r: ViewRef) -> Option<ViewId> {
    view.members
        .get(usize::from(r.coordinator))
        .map(|m| ViewId {
            seq: r.seq,
            coordinator: m.id,
        })
}

/// `msg` with a [`Msg::InstallInView`] turned into the [`Msg::Install`] it stands for: its
/// base is `view`, whose keys sealed it, and its coordinator the member at `sender` there.
/// `None` (counted `unexpected`) when no member of `view` has that rank.
fn in_view(msg: Msg, view: &View, sender: u16, counters: &mut DropCounters) -> Option<Msg> {
    let Msg::InstallInView(mut install) = msg else {
        return Some(msg);
    };
    let Some(coordinator) = view.members.get(usize::from(sender)) else {
        counters.count(Drop::Unexpected);
        return None;
    };
    install.in_view(view.id, coordinator.id);
    Some(Msg::Install(install))
}

impl GroupMember {
    /// As [`resolve`], in the current view; a rank outside it is counted `unexpected`.
    fn resolve_current(&mut self, r: ViewRef) -> Option<ViewId> {
        let id = self.view.as_ref().and_then(|v| resolve(v, r));
        if id.is_none() {
            self.counters.count(Drop::Unexpected);
        }
        id
    }

    /// Opens `packet` (a copy of the datagram) under the current view's keys and decodes
    /// its body: the sender's rank, whether it is addressed to everyone, and the message.
    /// `Ok(None)` when it opened but was dropped (counted); `Err` when it did not open.
    fn open_current(&mut self, packet: &mut [u8]) -> Result<Option<(u16, bool, Msg)>, DropReason> {
        let len = packet.len();
        let Some(keys) = self.keys.as_mut() else {
            return Ok(None);
        };
        let (rank, body) = keys.open(packet)?;
        let broadcast = packet[body.clone()].starts_with(&BROADCAST.to_be_bytes());
        if let Some(t) = packet.get(body.start + 2) {
            self.traffic.message(*t, len);
        }
        Ok(decode_for(&packet[body], self.rank, &mut self.counters).map(|m| (rank, broadcast, m)))
    }

    pub(super) fn handle_group_packet(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        let Some((slot, _)) = keys::peek_header(data) else {
            self.counters.count(Drop::Malformed);
            return;
        };
        let current = self.keys.as_ref().is_some_and(|k| k.slot() == slot);
        if current {
            // Opened in a buffer kept from packet to packet: the decoded message owns its
            // payload, so the buffer goes back before the message is handled.
            let mut packet = std::mem::take(&mut self.received);
            packet.clear();
            packet.extend_from_slice(data);
            let opened = self.open_current(&mut packet);
            if packet.capacity() <= RECEIVED_KEEP {
                self.received = packet;
            }
            match opened {
                Ok(None) => {}
                Ok(Some((rank, broadcast, msg))) => {
                    let my = self.rank;
                    let Some(view) = self.view.as_ref() else {
                        return;
                    };
                    let Some(msg) = in_view(msg, view, rank, &mut self.counters) else {
                        return;
                    };
                    // Down the overlay: the same sealed bytes go on to this member's
                    // children (opened once here, so a duplicate is never passed on).
                    if broadcast && self.forwards(rank, &msg) {
                        self.send_down_for(data, &msg);
                        if rank == my {
                            // Our own submission, relayed down the tree through us.
                            return;
                        }
                    }
                    // A carrier that fans out brings the sequencer's relay of our own
                    // submission back to us, as the overlay does above.
                    if broadcast && rank == my && self.config.carrier_fans_out {
                        return;
                    }
                    // A submission addressed to everyone is relayed by the sequencer as it
                    // came, so it keeps the original bytes.
                    // A Flush addressed to everyone came down the overlay: its bytes go on to
                    // this member's children in the flush (`tree_flush.rs`).
                    let raw = (broadcast && matches!(msg, Msg::Submit { .. } | Msg::Flush { .. }))
                        .then_some(data);
                    self.handle_msg(now, from, rank, msg, raw);
                }
                Err(e) => self.count_open_failure(now, from, e),
            }
            return;
        }
        if let Some(i) = self.old_views.iter().position(|o| o.keys.slot() == slot) {
            let mut packet = data.to_vec();
            let result = self.old_views[i].keys.open(&mut packet);
            match result {
                Ok((rank, body)) => {
                    let Some(my) = self.old_views[i].view.rank_of(&self.id) else {
                        return;
                    };
                    if let Some(t) = packet.get(body.start + 2) {
                        self.traffic.message(*t, data.len());
                    }
                    let Some(msg) = decode_for(&packet[body], my as u16, &mut self.counters) else {
                        return;
                    };
                    let old = &self.old_views[i].view;
                    let Some(msg) = in_view(msg, old, rank, &mut self.counters) else {
                        return;
                    };
                    self.handle_old_msg(now, i, rank, msg);
                }
                Err(e) => self.count_open_failure(now, from, e),
            }
            return;
        }
        self.counters.count(Drop::KeyNotHeld);
        self.maybe_insecure(now, from);
    }

    /// Delivers an unreliable message on arrival, in the installed view (own messages
    /// too, as they are sent).
    pub(super) fn deliver_unreliable(&mut self, sender: MemberId, seq: u64, data: Vec<u8>) {
        let Some(view) = self.view.as_ref().map(|v| v.id) else {
            return;
        };
        self.delivered_unreliable += 1;
        self.events.push_back(GroupEvent::Deliver {
            channel: Channel::Unreliable,
            sender,
            view,
            seq,
            order: None,
            data,
        });
    }

    pub(super) fn count_open_failure(&mut self, now: Timestamp, from: SocketAddr, e: DropReason) {
        match e {
            DropReason::Replayed | DropReason::TooOld => self.counters.count(Drop::Replayed),
            DropReason::AuthFailed => {
                self.counters.count(Drop::AuthFailed);
                self.maybe_insecure(now, from);
            }
            _ => self.counters.count(Drop::Malformed),
        }
    }

    /// Reports a packet under a key not held from an address outside the view (another
    /// component, perhaps), at most once per second per address.
    pub(super) fn maybe_insecure(&mut self, now: Timestamp, from: SocketAddr) {
        if self
            .view
            .as_ref()
            .is_some_and(|v| v.rank_of_addr(&from).is_some())
        {
            return;
        }
        if self.insecure_reported.len() >= 1024 {
            // Bounded: forget addresses not reported within the last second; if the table is
            // still full (a flood from many addresses), report nothing new.
            self.insecure_reported
                .retain(|_, t| now.saturating_duration_since(*t) < Duration::from_secs(1));
            if self.insecure_reported.len() >= 1024 {
                return;
            }
        }
        let last = self.insecure_reported.get(&from).copied();
        if last.is_none_or(|t| now.saturating_duration_since(t) >= Duration::from_secs(1)) {
            self.insecure_reported.insert(from, now);
            self.events.push_back(GroupEvent::Insecure { from });
        }
    }

    pub(super) fn handle_msg(
        &mut self,
        now: Timestamp,
        from: SocketAddr,
        rank: u16,
        msg: Msg,
        raw: Option<&[u8]>,
    ) {
        let Some(sender) = self.member_at(rank) else {
            self.counters.count(Drop::Unexpected);
            return;
        };
        if sender.id == self.id {
            // Our own keys: a reflected or replayed packet.
            self.counters.count(Drop::Unexpected);
            return;
        }
        if rank == 0 {
            self.liveness.leader_heard = now;
        }
        if let Some(f) = self.view_change.flushing.as_ref() {
            if f.coordinator == rank {
                self.liveness.leader_heard = now;
            }
        }
        if let Some(s) = self.reliable.sequencer.as_mut() {
            s.heard[usize::from(rank)] = now;
        }
        match msg {
            Msg::Heartbeat {
                delivered,
                ordered,
                stable,
                load,
                failures,
            } => self.on_heartbeat(now, rank, delivered, ordered, stable, load, failures),
            // Delivered even during a flush: the unreliable channel makes no view promise.
            Msg::Unreliable { seq, data } => self.deliver_unreliable(sender.id, seq, data),
            Msg::Submit { seq, data } if self.reliable.sequencer.is_some() => {
                self.on_submit(now, rank, seq, data, raw.map(<[u8]>::to_vec))
            }
            Msg::Submit { seq, data } => self.on_relayed(now, rank, seq, data),
            Msg::Orders { first, entries } => self.on_orders(now, rank, first, entries),
            Msg::Ordered {
                order,
                sender: s,
                seq,
                data,
            } => self.on_ordered(now, rank, order, s, seq, data),
            Msg::OrderedRun { first, entries } => self.on_ordered_run(now, rank, first, entries),
            Msg::Nak { from: lo, to } => self.on_nak(now, rank, lo, to),
            Msg::Flush {
                proposal,
                survivors,
            } => {
                let Some(proposal) = self.resolve_current(proposal) else {
                    return;
                };
                self.on_flush(now, rank, proposal, survivors, raw.map(|p| (from, p)))
            }
            Msg::FlushOk {
                proposal,
                delivered,
                next_seq,
                pending,
            } => {
                let Some(proposal) = self.resolve_current(proposal) else {
                    return;
                };
                self.on_flush_ok(now, rank, proposal, delivered, next_seq, pending)
            }
            Msg::Install(install) => self.on_install(now, rank, install),
            // Turned into an Install as it was opened (`in_view`).
            Msg::InstallInView(_) => self.counters.count(Drop::Unexpected),
            Msg::InstallChunk {
                view,
                index,
                total,
                data,
            } => self.on_install_chunk(now, rank, view, index, total, data),
            Msg::InstallAck => self.on_install_ack(now, sender.id),
            Msg::Leave => self.on_leave_request(now, sender.id),
            Msg::RekeyRequest => self.on_rekey_request(now),
            Msg::Report {
                delivered,
                holder,
                load,
                failures,
                suspects,
            } => self.on_report(now, rank, delivered, holder, load, failures, suspects),
            Msg::Orphaned { parent } => self.on_orphaned(now, rank, parent),
            Msg::Probe => self.on_probe(rank),
            Msg::ProbeAck => self.on_probe_ack(rank),
            Msg::FlushOks {
                proposal,
                delivered,
                holder,
                answered,
                next_seqs,
                pending,
            } => {
                let Some(proposal) = self.resolve_current(proposal) else {
                    return;
                };
                self.on_flush_oks(
                    now, rank, proposal, delivered, holder, answered, next_seqs, pending,
                )
            }
            Msg::InstallAcks { view, acked } => {
                let Some(view) = self.resolve_current(view) else {
                    return;
                };
                if let Some(base) = self.view.as_ref().map(|v| v.id) {
                    self.on_install_acks(now, base, rank, view, acked)
                }
            }
            Msg::LeftOut {
                view,
                base,
                kept,
                rejoined,
                signature,
            } => self.on_left_out(now, rank, view, base, kept, rejoined, signature),
        }
    }

    pub(super) fn handle_old_msg(&mut self, now: Timestamp, i: usize, rank: u16, msg: Msg) {
        let view = self.old_views[i].view.clone();
        let Some(sender) = view.members.get(usize::from(rank)).copied() else {
            self.counters.count(Drop::Unexpected);
            return;
        };
        if sender.id == self.id {
            self.counters.count(Drop::Unexpected);
            return;
        }
        match msg {
            Msg::Nak { from: lo, to } => {
                // To the member's address, never the packet's source: no reflection.
                for msg in nak_answers(&self.old_views[i].log, lo, to) {
                    self.send_msg_old(view.id, sender.addr, &msg);
                }
            }
            Msg::Unreliable { seq, data } => {
                self.delivered_unreliable += 1;
                self.events.push_back(GroupEvent::Deliver {
                    channel: Channel::Unreliable,
                    sender: sender.id,
                    view: view.id,
                    seq,
                    order: None,
                    data,
                });
            }
            // A resent Install of the view we already have: the ack was lost.
            Msg::Install(install) if self.view.as_ref().is_some_and(|v| v.id == install.view) => {
                if let Some(members) = self.view.as_ref().map(|v| v.members.clone()) {
                    self.ack_install(&install, &members);
                }
            }
            Msg::InstallChunk {
                view: v, index: 0, ..
            } if self.view.as_ref().is_some_and(|cur| cur.id == v) => {
                self.ack_current_view();
            }
            Msg::Install(_) | Msg::InstallChunk { .. } => {}
            // Acknowledgements of the view installed since travel under the old keys.
            Msg::InstallAcks { view: v, acked } => match resolve(&view, v) {
                Some(v) => self.on_install_acks(now, view.id, rank, v, acked),
                None => self.counters.count(Drop::Unexpected),
            },
            Msg::Leave | Msg::RekeyRequest => {
                // Sent before the member saw the new view; it will ask again.
            }
            _ => {
                // Heartbeats, flushes and ordering of a finished view: ignore quietly.
            }
        }
        let _ = now;
    }

    pub(super) fn handle_pair_msg(
        &mut self,
        now: Timestamp,
        peer: MemberId,
        addr: SocketAddr,
        data: &[u8],
    ) {
        let Some(msg) = PairMsg::decode(data) else {
            self.counters.count(Drop::Malformed);
            return;
        };
        match msg {
            PairMsg::JoinRequest {
                group,
                incarnation,
                next_seq,
                key_proof,
            } => {
                if group != self.config.group {
                    self.counters.count(Drop::OtherGroup);
                    return;
                }
                self.on_join_request(now, peer, addr, incarnation, next_seq, key_proof);
            }
            PairMsg::Redirect { leader } => self.on_redirect(now, addr, leader),
            PairMsg::NotInGroup => {
                if let Some(j) = self.joining.as_mut() {
                    j.answered = true;
                    j.replied.insert(addr);
                    j.not_in_group.insert(peer);
                }
            }
            PairMsg::Welcome {
                install,
                key,
                roster,
            } => self.on_welcome(now, peer, addr, install, key, roster),
            PairMsg::Part {
                view,
                what,
                index,
                total,
                data,
            } => self.on_part(now, peer, addr, view, what, index, total, data),
            PairMsg::ListRequest { view, from } => {
                self.on_list_request(now, peer, addr, view, from)
            }
            PairMsg::KeyShare {
                proposal,
                key_epoch,
                key,
                below,
                degree,
            } => self.on_key_share(now, peer, addr, proposal, key_epoch, key, below, degree),
            PairMsg::KeyAck { proposal, holders } => self.on_key_ack(now, peer, proposal, holders),
            PairMsg::Ping => {}
            PairMsg::Ticket {
                nonce,
                key_epoch,
                key,
            } => self.on_pair_ticket(now, peer, addr, nonce, key_epoch, &key),
            PairMsg::Grant {
                view,
                token,
                members,
            } => self.on_grant(now, peer, addr, view, token, members),
            PairMsg::Present { view, token } => self.on_present(now, peer, view, &token),
            PairMsg::Removed { view, .. } => {
                // From the coordinator of a newer view than ours: it left us out. With
                // identity keys only a member that asked to leave takes it (the others learn
                // of a removal from the signed Install).
                let newer = self
                    .view
                    .as_ref()
                    .is_some_and(|v| view > v.id && view.coordinator == peer);
                if (self.identity.is_some() && self.leaving.is_none()) || !newer {
                    self.counters.count(Drop::Unexpected);
                    return;
                }
                // Whatever the reason (suspected, untrusted or lagged), a member that did
                // not ask to leave is alive: its own suspicion timeout moves it on. A lagged
                // member used to leave for good here (issue 17 §2).
                if self.leaving.is_some() {
                    self.leave_now(RemovalReason::Left);
                }
            }
        }
    }

    pub(super) fn drain_pairs(&mut self, now: Timestamp) {
        while let Some(e) = self.pairs.poll_event() {
            match e {
                PairEvent::Established { .. } => {
                    if self
                        .view_change
                        .coordinator
                        .as_ref()
                        .is_some_and(|c| c.phase == Phase::Pairing)
                    {
                        self.progress_flush(now);
                    }
                    // A participant whose Install waited for the pair key tries again.
                    if self.view_change.flushing.is_some() {
                        self.progress_flush(now);
                    }
                }
                PairEvent::Message {
                    peer,
                    addr,
                    mut data,
                } => {
                    self.handle_pair_msg(now, peer, addr, &data);
                    // Pair messages may carry group keys.
                    data.zeroize();
                }
                PairEvent::Failed { addr, reason } => {
                    if reason.is_kdc() {
                        self.events.push_back(GroupEvent::Refused {
                            addr,
                            reason: reason.as_str(),
                        });
                    }
                    let why = if reason.is_trust() {
                        Drop::Untrusted
                    } else {
                        Drop::PairFailed
                    };
                    self.counters.count(why);
                }
            }
        }
    }
}
