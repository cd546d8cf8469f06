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
/// them through `Machine::poll_transmit`, which makes one entry per member of them.
///
/// The packets' bytes live back to back in one buffer (an arena), and an entry names its
/// range: a packet sealed straight into the buffer costs no allocation, a packet for many
/// members is stored once however many entries name it, and taking a packet out frees
/// nothing. (A leader of 10,000 queued each Install copy as a `Vec` of its own: a sixth of
/// its rekey in a profile on a loaded machine, about 4% of it on a quiet one: see
/// `docs/performance.md`.) The buffer empties when the queue does, and its dead front is
/// cut off when it is more than half of it.
#[derive(Default)]
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct Outbox {
    /// The queued packets' bytes; `bytes[0]` is at offset `base` of everything ever queued
    /// since the buffer last emptied.
    bytes: Vec<u8>,
    base: usize,
    /// Each packet: where it goes, and where its bytes start and end (offsets as `base`'s).
    /// Starts never decrease from front to back, so the front's start ends the dead bytes.
    queue: VecDeque<(Destination, usize, usize)>,
}

/// The buffer capacity an [`Outbox`] keeps when it empties; more is given back.
const OUTBOX_KEEP: usize = 256 * 1024;

/// The dead front of an [`Outbox`]'s buffer is cut off only past this many bytes.
const OUTBOX_COMPACT: usize = 64 * 1024;

impl Outbox {
    /// Queues `packet` for the member at `to`.
    pub(super) fn push(&mut self, to: SocketAddr, packet: &[u8]) {
        self.push_copies([Destination::Member(to)], packet);
    }

    /// Queues `packet` once for the whole group.
    pub(super) fn push_group(&mut self, packet: &[u8]) {
        self.push_copies([Destination::Group], packet);
    }

    /// Queues `packet` for each of `to`, its bytes stored once.
    pub(super) fn push_copies(&mut self, to: impl IntoIterator<Item = Destination>, packet: &[u8]) {
        let _ = self.push_with(to, |buf| {
            buf.extend_from_slice(packet);
            Ok::<(), ()>(())
        });
    }

    /// Queues for each of `to` the packet `write` appends to the buffer it is given (it
    /// must only append), its bytes stored once. If `write` fails, or `to` is empty,
    /// whatever it appended is cut off and nothing is queued.
    pub(super) fn push_with<E>(
        &mut self,
        to: impl IntoIterator<Item = Destination>,
        write: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<(), E> {
        let start = self.bytes.len();
        let written = write(&mut self.bytes);
        debug_assert!(
            self.bytes.len() >= start,
            "an Outbox writer may only append"
        );
        if written.is_err() || self.bytes.len() < start {
            self.bytes.truncate(start);
            return written;
        }
        let (first, end) = (self.base + start, self.base + self.bytes.len());
        let before = self.queue.len();
        self.queue.extend(to.into_iter().map(|d| (d, first, end)));
        if self.queue.len() == before {
            self.bytes.truncate(start);
        }
        Ok(())
    }

    /// Where the oldest packet goes.
    pub(super) fn front(&self) -> Option<Destination> {
        self.queue.front().map(|(d, _, _)| *d)
    }

    /// Replaces the oldest entry by one for each of `to`, in order, with the same bytes (a
    /// group entry read by a driver that cannot fan out). With `to` empty it goes nowhere.
    pub(super) fn fan_out_front(&mut self, to: &[SocketAddr]) {
        let Some((_, start, end)) = self.queue.pop_front() else {
            return;
        };
        for a in to.iter().rev() {
            self.queue.push_front((Destination::Member(*a), start, end));
        }
        self.reclaim();
    }

    /// Takes the oldest packet out: appends its bytes to `buf`, and returns where it goes
    /// and its size.
    pub(super) fn pop_into(&mut self, buf: &mut Vec<u8>) -> Option<(Destination, usize)> {
        let (to, start, end) = self.queue.pop_front()?;
        buf.extend_from_slice(&self.bytes[start - self.base..end - self.base]);
        self.reclaim();
        Some((to, end - start))
    }

    /// How many packets are queued.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.queue.len()
    }

    /// Drops every queued packet.
    #[cfg(test)]
    pub(super) fn clear(&mut self) {
        self.queue.clear();
        self.reclaim();
    }

    /// Frees the bytes no entry names any more: all of them when the queue is empty (the
    /// capacity kept up to [`OUTBOX_KEEP`]), else the dead front once it is large.
    fn reclaim(&mut self) {
        match self.queue.front() {
            None => {
                self.bytes.clear();
                self.bytes.shrink_to(OUTBOX_KEEP);
                self.base = 0;
            }
            Some(&(_, start, _)) => {
                let dead = start - self.base;
                if dead >= OUTBOX_COMPACT && dead > self.bytes.len() / 2 {
                    self.bytes.drain(..dead);
                    self.base = start;
                }
            }
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
    let mut packet = Vec::new();
    seal_body_into(keys, gears, dest, msg, scratch, &mut packet).ok()?;
    Some(packet)
}

/// As [`seal_body`], appending the packet to `out` (nothing on failure).
pub(super) fn seal_body_into(
    keys: &mut ViewKeys,
    gears: &[GearId],
    dest: u16,
    msg: &Msg,
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Result<(), ()> {
    scratch.clear();
    scratch.extend_from_slice(&dest.to_be_bytes());
    msg.encode(scratch);
    keys.seal(gears, scratch, out).map_err(|_| ())
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

    /// Protects `msg` under the current view's keys for the member at `to` (the body
    /// names the destination's rank, so a copy replayed to another member is refused).
    pub(super) fn send_msg(&mut self, to: SocketAddr, msg: &Msg) {
        let dest = self
            .view
            .as_ref()
            .and_then(|v| v.rank_of_addr(&to))
            .map_or(BROADCAST, |r| r as u16);
        self.seal_to([Destination::Member(to)], dest, msg);
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
        if self.config.carrier_fans_out {
            if self.others().next().is_some() {
                self.seal_to([Destination::Group], BROADCAST, msg);
            }
            return;
        }
        let others: Vec<Destination> = self.others().map(|m| Destination::Member(m.addr)).collect();
        self.seal_to(others, BROADCAST, msg);
    }

    /// Protects `[dest][msg]` under the current view's keys straight into the outbox, once,
    /// queued for each of `to`. False (nothing queued) without keys or if sealing fails.
    pub(super) fn seal_to(
        &mut self,
        to: impl IntoIterator<Item = Destination>,
        dest: u16,
        msg: &Msg,
    ) -> bool {
        let gears = self.send_gears();
        let (Some(keys), scratch) = (self.keys.as_mut(), &mut self.scratch) else {
            return false;
        };
        self.out
            .push_with(to, |buf| {
                seal_body_into(keys, &gears, dest, msg, scratch, buf)
            })
            .is_ok()
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
        let scratch = &mut self.scratch;
        let _ = self.out.push_with([Destination::Member(to)], |buf| {
            seal_body_into(&mut old.keys, &gears, dest, msg, scratch, buf)
        });
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

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    fn pop_all(out: &mut Outbox) -> Vec<(Destination, Vec<u8>)> {
        let mut got = Vec::new();
        let mut buf = Vec::new();
        while let Some((to, size)) = out.pop_into(&mut buf) {
            assert_eq!(size, buf.len());
            got.push((to, std::mem::take(&mut buf)));
        }
        got
    }

    /// Packets come out in the order they went in, each with its own bytes, whether copied
    /// in, written in place or queued for several members at once; a failed or
    /// undirected write leaves nothing behind.
    #[test]
    fn an_outbox_gives_back_what_was_queued_in_order() {
        let mut out = Outbox::default();
        out.push(addr(1), b"one");
        out.push_copies([addr(2), addr(3)].map(Destination::Member), b"two");
        assert!(out
            .push_with([Destination::Member(addr(4))], |b| {
                b.extend_from_slice(b"partial");
                Err::<(), &str>("seal failed")
            })
            .is_err());
        let empty: [Destination; 0] = [];
        out.push_copies(empty, b"nobody");
        out.push_group(b"all");
        out.push_with([Destination::Member(addr(5))], |b| {
            b.extend_from_slice(b"sealed");
            Ok::<(), ()>(())
        })
        .expect("written");
        assert_eq!(out.len(), 5);
        // Only the bytes of packets that were queued are held, each once.
        assert_eq!(
            out.bytes.len(),
            "one".len() + "two".len() + "all".len() + "sealed".len()
        );
        let got = pop_all(&mut out);
        let want: Vec<(Destination, Vec<u8>)> = vec![
            (Destination::Member(addr(1)), b"one".to_vec()),
            (Destination::Member(addr(2)), b"two".to_vec()),
            (Destination::Member(addr(3)), b"two".to_vec()),
            (Destination::Group, b"all".to_vec()),
            (Destination::Member(addr(5)), b"sealed".to_vec()),
        ];
        assert_eq!(got, want);
        assert!(out.bytes.is_empty() && out.base == 0);
    }

    /// A group entry fanned out becomes one entry per member, in order, ahead of what
    /// followed it; with nobody to send to it is gone and the next entry is the front.
    #[test]
    fn fanning_out_the_front_keeps_the_order() {
        let mut out = Outbox::default();
        out.push_group(b"g1");
        out.push(addr(9), b"after");
        out.push_group(b"g2");
        assert_eq!(out.front(), Some(Destination::Group));
        out.fan_out_front(&[addr(1), addr(2)]);
        assert_eq!(out.front(), Some(Destination::Member(addr(1))));
        let mut buf = Vec::new();
        assert_eq!(
            out.pop_into(&mut buf),
            Some((Destination::Member(addr(1)), 2))
        );
        assert_eq!(
            out.pop_into(&mut buf),
            Some((Destination::Member(addr(2)), 2))
        );
        assert_eq!(buf, b"g1g1");
        assert_eq!(
            out.pop_into(&mut buf),
            Some((Destination::Member(addr(9)), 5))
        );
        out.fan_out_front(&[]);
        assert_eq!(out.front(), None);
        assert!(out.bytes.is_empty());
    }

    /// An outbox that is never quite empty (packets queued while others wait) still gives
    /// every packet back intact, and its buffer does not keep the bytes of packets long
    /// gone: it stays within twice what is queued plus the compaction threshold.
    #[test]
    fn an_outbox_that_never_empties_does_not_grow() {
        let mut out = Outbox::default();
        let packet = |i: u32| -> Vec<u8> {
            let len = 100 + (i as usize * 37) % 1_300;
            (0..len).map(|j| (i as usize + j) as u8).collect()
        };
        let (mut next_in, mut next_out) = (0u32, 0u32);
        let mut buf = Vec::new();
        let mut compacted = false;
        for round in 0..2_000u32 {
            for _ in 0..(1 + round % 5) {
                out.push_copies(
                    [Destination::Member(addr(next_in as u16))],
                    &packet(next_in),
                );
                next_in += 1;
            }
            // Take fewer out than went in for a while, then more, never all of them.
            let take = if round < 1_000 {
                round % 3
            } else {
                1 + round % 6
            };
            for _ in 0..take {
                if out.len() <= 1 {
                    break;
                }
                buf.clear();
                let (to, _) = out.pop_into(&mut buf).expect("queued");
                assert_eq!(to, Destination::Member(addr(next_out as u16)));
                assert_eq!(buf, packet(next_out));
                next_out += 1;
            }
            compacted |= out.base > 0;
            let queued: usize = out.queue.iter().map(|(_, s, e)| e - s).sum();
            assert!(
                out.bytes.len() <= 2 * queued + OUTBOX_COMPACT + 1_400,
                "round {round}: {} bytes held for {queued} queued",
                out.bytes.len()
            );
        }
        assert!(out.len() >= 1 && next_out > 1_000);
        assert!(compacted, "the dead front was never cut off");
        let rest = pop_all(&mut out);
        for (i, (_, p)) in rest.iter().enumerate() {
            assert_eq!(*p, packet(next_out + i as u32));
        }
    }
}
