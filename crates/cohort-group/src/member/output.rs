//! What goes out on the group channel: sealing a message under the view's keys with the
//! gear the controller chose, addressed to one rank or to all, and queueing the packet.
//!
//! Owns: [`Outbox`], the queue of sealed packets and where each goes (one member, or the
//! whole group when the carrier fans out); it writes only `GroupMember::out` and the
//! encoding scratch buffer. It may not decide what to send: every other concern calls it.

use super::install::split_parts;
use super::GroupMember;
use crate::id::{MemberId, ViewId};
use crate::keys::ViewKeys;
use crate::wire::{Msg, PairMsg, MAX_PARTS};
use cohort_core::Timestamp;
use cohort_gears::GearId;
use std::collections::VecDeque;
use std::net::SocketAddr;
use zeroize::Zeroizing;

/// Where a packet from [`GroupMember::poll_transmit_to`] goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Destination {
    /// The member (or contact, or KDC) at this address.
    Member(SocketAddr),
    /// Every other member of the current view, through a carrier that fans out (one
    /// publish to the group's subject). Only with `GroupConfig::carrier_fans_out`.
    Group,
}

/// The member's queue of sealed packets, in the order they were made. Entries for the whole
/// group (carrier fan-out only) stay one entry until a driver that cannot fan out reads
/// them through `Machine::poll_transmit`, which copies them per member.
#[derive(Default)]
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct Outbox {
    queue: VecDeque<(Destination, Vec<u8>)>,
}

impl Outbox {
    /// Queues `packet` for the member at `to` (the call shape of the queue it replaced).
    pub(super) fn push_back(&mut self, (to, packet): (SocketAddr, Vec<u8>)) {
        self.queue.push_back((Destination::Member(to), packet));
    }

    /// Queues `packet` once for the whole group.
    pub(super) fn push_group(&mut self, packet: Vec<u8>) {
        self.queue.push_back((Destination::Group, packet));
    }

    /// The oldest packet and where it goes.
    pub(super) fn pop_front(&mut self) -> Option<(Destination, Vec<u8>)> {
        self.queue.pop_front()
    }

    /// Puts packets back at the front, in the order given (a group entry copied per member).
    pub(super) fn push_front_all(
        &mut self,
        packets: impl DoubleEndedIterator<Item = (SocketAddr, Vec<u8>)>,
    ) {
        for (to, packet) in packets.rev() {
            self.queue.push_front((Destination::Member(to), packet));
        }
    }
}

/// Protects `[dest][msg]` under `keys` (`scratch` is the encoding buffer).
pub(super) fn seal_body(
    keys: &mut ViewKeys,
    gears: &[GearId],
    dest: u16,
    msg: &Msg,
    scratch: &mut Vec<u8>,
) -> Option<Vec<u8>> {
    scratch.clear();
    scratch.extend_from_slice(&dest.to_be_bytes());
    msg.encode(scratch);
    let mut packet = Vec::with_capacity(scratch.len() + 48);
    keys.seal(gears, scratch, &mut packet).ok()?;
    Some(packet)
}

/// The destination rank of a packet sent to every member.
pub(super) const BROADCAST: u16 = u16::MAX;

impl GroupMember {
    pub(super) fn current_gear(&self) -> GearId {
        match &self.controller {
            Some(c) => c.current(),
            None => self.plan.ladder[0],
        }
    }

    pub(super) fn send_gears(&self) -> Vec<GearId> {
        let current = self.current_gear();
        let strongest = self.plan.ladder[0];
        if self.plan.dual_tags && current != strongest {
            vec![strongest, current]
        } else {
            vec![current]
        }
    }

    /// Protects `msg` under the current view's keys for the member at `to` (the body names
    /// the destination's rank, so a copy replayed to another member is refused).
    pub(super) fn send_msg(&mut self, to: SocketAddr, msg: &Msg) {
        let dest = self
            .view
            .as_ref()
            .and_then(|v| v.rank_of_addr(&to))
            .map_or(BROADCAST, |r| r as u16);
        if let Some(packet) = self.seal(dest, msg) {
            self.out.push_back((to, packet));
        }
    }

    /// As `send_msg`, to the member at `rank` in the current view, if there is one.
    pub(super) fn send_to_rank(&mut self, rank: u16, msg: &Msg) {
        if let Some(m) = self.member_at(rank) {
            self.send_msg(m.addr, msg);
        }
    }

    /// Protects `msg` once and sends the same packet to every other member: every receiver
    /// sees the same sequence number, so a copy replayed anywhere hits a replay window.
    /// When the carrier fans out, the packet is queued once for the group.
    pub(super) fn broadcast(&mut self, msg: &Msg) {
        let Some(packet) = self.seal(BROADCAST, msg) else {
            return;
        };
        if self.config.carrier_fans_out {
            if self.others().next().is_some() {
                self.out.push_group(packet);
            }
            return;
        }
        let others: Vec<SocketAddr> = self.others().map(|m| m.addr).collect();
        for addr in others {
            self.out.push_back((addr, packet.clone()));
        }
    }

    pub(super) fn seal(&mut self, dest: u16, msg: &Msg) -> Option<Vec<u8>> {
        let gears = self.send_gears();
        let keys = self.keys.as_mut()?;
        seal_body(keys, &gears, dest, msg, &mut self.scratch)
    }

    /// As `send_msg`, under a kept old view's keys.
    pub(super) fn send_msg_old(&mut self, view: ViewId, to: SocketAddr, msg: &Msg) {
        let gears = self.send_gears();
        let Some(old) = self.old_views.iter_mut().find(|o| o.view.id == view) else {
            return;
        };
        let dest = old.view.rank_of_addr(&to).map_or(BROADCAST, |r| r as u16);
        if let Some(packet) = seal_body(&mut old.keys, &gears, dest, msg, &mut self.scratch) {
            self.out.push_back((to, packet));
        }
    }

    pub(super) fn send_pair(
        &mut self,
        now: Timestamp,
        to: SocketAddr,
        expect: Option<MemberId>,
        msg: &PairMsg,
    ) {
        let mut body = Zeroizing::new(Vec::new());
        msg.encode(&mut body);
        self.pairs.send(now, to, expect, &body);
    }

    /// Sends `msg` (a Welcome or a Grant, which grow with the view) to `to` whole when it
    /// fits one pair record (`part_limit`), else as [`PairMsg::Part`]s of kind `what`
    /// labelled `view`, each in its own record; a message past `MAX_PARTS` parts is not
    /// sent at all (the receiver could not take it).
    pub(super) fn send_pair_in_parts(
        &mut self,
        now: Timestamp,
        to: SocketAddr,
        expect: MemberId,
        view: ViewId,
        what: u8,
        msg: &PairMsg,
    ) {
        let mut body = Zeroizing::new(Vec::new());
        msg.encode(&mut body);
        if body.len() <= self.part_limit {
            self.pairs.send(now, to, Some(expect), &body);
            return;
        }
        let parts = split_parts(&body, self.part_limit);
        if parts.len() > MAX_PARTS {
            return;
        }
        let total = parts.len() as u16;
        for (i, p) in parts.into_iter().enumerate() {
            let part = PairMsg::Part {
                view,
                what,
                index: i as u16,
                total,
                data: p.to_vec(),
            };
            self.send_pair(now, to, Some(expect), &part);
        }
    }
}
