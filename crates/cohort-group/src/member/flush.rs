//! View changes: wanting one (joiners, removals, rekey, merge), coordinating it (Flush,
//! FlushOk, fetching missing positions so every survivor delivers the same set), taking
//! part in one, and restarting without the silent.
//!
//! Owns: `ViewChange` (the proposal, the coordinator's or participant's flush, the
//! Install being announced, what the next change is to do). It hands the key phase to
//! `key_tree.rs` (tree rekey) and the Install to `install.rs`; it may not install a view.

use super::install::{Announce, Assembly, LeftOutTurn, ListFetch, Roster};
use super::output::{Destination, BROADCAST};
use super::reliable::{OrderedMsg, Reliable};
use super::timers::interval;
use super::tree_flush::TreeFlush;
use super::{GroupMember, MAX_VIEW_MEMBERS};
use crate::config::AuthMode;
use crate::event::{Drop, RemovalReason};
use crate::id::{Member, MemberId, View, ViewId};
use crate::keys::{GroupKey, PairKey};
use crate::wire::{Install, Msg, PairMsg, ViewRef, MAX_PENDING};
use cohort_core::Timestamp;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;

/// A view change wanted, coordinated or taken part in: the flush, the Install being announced, and what the next change is to do.
#[derive(Default)]
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct ViewChange {
    /// KDC mode: the key unwrapped while checking an Install, for installing it.
    pub(super) unwrapped: Option<(ViewId, GroupKey)>,
    pub(super) highest_proposal: Option<ViewId>,
    pub(super) flushing: Option<Flushing>,
    pub(super) coordinator: Option<Coordinator>,
    pub(super) announce: Option<Announce>,
    pub(super) change_wanted: Vec<(MemberId, RemovalReason)>,
    pub(super) joiners_wanted: Vec<(Member, u64, u64)>,
    /// When the oldest of `joiners_wanted` arrived (see [`join_batch`]: joiners wait to fill a batch).
    pub(super) joiners_since: Option<Timestamp>,
    /// When the last view change that let joiners in started (joins are streaming in).
    pub(super) last_join_batch: Option<Timestamp>,
    pub(super) rekey_wanted: Option<Timestamp>,
    /// A member list being fetched from a coordinator (`install.rs`).
    pub(super) fetch: Option<ListFetch>,
    /// An Install or Welcome arriving in parts (`install.rs`).
    pub(super) assembly: Option<Assembly>,
    /// This member's part in a view change that travels on the overlay (`tree_flush.rs`).
    pub(super) tree: Option<TreeFlush>,
    /// The view this member installed as its coordinator, every member of which its trust
    /// policy accepted then (survivors checked, joiners checked): the next change it
    /// coordinates from that view checks only joiners. Cleared when the policy changes
    /// (`set_trust`), which also asks for the removal of members no longer trusted.
    pub(super) trusted_view: Option<ViewId>,
    /// Left out of the next view, this member waits its turn to coordinate a view of those
    /// left out with it (`install.rs`, `go_on_left_out`).
    pub(super) left_out: Option<LeftOutTurn>,
}

/// Fewest joiners one view change lets in when that many wait (see [`join_batch`]).
pub(super) const JOIN_BATCH: usize = 128;

/// Most joiners one view change lets in (see [`join_batch`]): the Install lists them at
/// about 60 bytes each, 240 KiB for 4,096, 17 of its [`MAX_PARTS`](crate::wire::MAX_PARTS).
pub(super) const MAX_JOIN_BATCH: usize = 4096;

/// Joiners one view change lets in, in a view of `members`: as many as the view holds,
/// at least [`JOIN_BATCH`] and at most [`MAX_JOIN_BATCH`]. A cold start of thousands is
/// admitted in batches, and every view change costs the leader a flush round with every
/// member (O(n) datagrams); with a fixed batch that is n / 128 rounds of growing size,
/// O(n^2) in all. A batch that grows with the view doubles the group with each change up
/// to the cap, so forming costs O(log n) rounds up to 4,096 members and one round per
/// 4,096 joiners beyond: the flush work per joiner stays bounded.
pub(super) fn join_batch(members: usize) -> usize {
    members.clamp(JOIN_BATCH, MAX_JOIN_BATCH)
}

/// Whether joiners alone (nothing else wanted) wait before a view change lets them in:
/// while joins stream in (a change let joiners in less than `wait` ago) into a view of at
/// least [`JOIN_BATCH`] members, until they fill a batch or the oldest (arrived at
/// `since`) has waited `wait` (a heartbeat interval). Joiners of a cold start arrive
/// spread over their retry jitter; starting a change for each handful costs every member
/// a flush and an install each (an O(n) flush round at the leader), where one change a
/// heartbeat interval lets them all in together. A lone joiner, or any joiner of a smaller
/// view, goes in at once, as before.
pub(super) fn hold_joiners(
    members: usize,
    waiting: usize,
    since: Option<Timestamp>,
    last_batch: Option<Timestamp>,
    now: Timestamp,
    wait: std::time::Duration,
) -> bool {
    members >= JOIN_BATCH
        && waiting < join_batch(members)
        && last_batch.is_some_and(|t| now < t.saturating_add(wait))
        && since.is_some_and(|t| now < t.saturating_add(wait))
}

/// Most joiners waiting at the leader for a later batch; more are refused (they retry).
/// Two full batches: a cold start keeps the next batch queued while one is let in.
pub(super) const MAX_WAITING_JOINERS: usize = 2 * MAX_JOIN_BATCH;

/// A view change this member is taking part in (it answered the coordinator).
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct Flushing {
    pub(super) proposal: ViewId,
    pub(super) coordinator: u16,
    /// The members the coordinator expects to continue, by rank in the current view,
    /// ascending (as the Flush lists them): the only ones whose tree key shares are taken
    /// (a member being removed still holds the old keys).
    pub(super) survivors: Vec<u16>,
    /// The Install, once it arrived, waiting for the positions it needs.
    pub(super) install: Option<Box<Install>>,
    /// The new view's list, once resolved from the Install (or fetched).
    pub(super) roster: Option<Roster>,
    /// The next message number this member reported in its first answer to this flush;
    /// later answers repeat it, so that it and the coordinator agree on it without the
    /// Install listing it.
    pub(super) answered_next_seq: Option<u64>,
    pub(super) last_nak: Option<Timestamp>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Phase {
    /// Waiting for FlushOk from every survivor.
    Collect,
    /// Fetching positions up to `target` from the survivor at rank `from`.
    Fetch { target: u64, from: u16 },
    /// Waiting for pair channels to every new member (one-message rekey).
    Pairing,
    /// Waiting for the tree's acknowledgements.
    Tree,
    /// The merge Install is out: staying in the component, resending it and serving the
    /// positions it needs, until every member confirms or the deadline passes; then
    /// dissolving into the component led at `target`.
    Dissolving { target: SocketAddr },
}

/// What a flush answer carried.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct FlushAnswer {
    pub(super) delivered: u64,
    pub(super) next_seq: u64,
    pub(super) pending: Vec<(u64, Vec<u8>)>,
}

impl FlushAnswer {
    /// This member's own answer: what it delivered, its next message number, and its
    /// undelivered messages.
    fn own(reliable: &Reliable) -> FlushAnswer {
        FlushAnswer {
            delivered: reliable.delivered,
            next_seq: reliable.next_reliable,
            pending: reliable
                .pending
                .iter()
                .map(|p| (p.seq, p.data.clone()))
                .collect(),
        }
    }
}

/// What a view change is to do: the input to `start_coordinating`.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct Change {
    /// Ranks (in the current view) expected to continue.
    pub(super) survivors: Vec<u16>,
    /// Members to let in: (member, next message number, incarnation).
    pub(super) joiners: Vec<(Member, u64, u64)>,
    /// Members to leave out, and why.
    pub(super) removed: Vec<(MemberId, RemovalReason)>,
    /// Whether the next view gets a fresh key.
    pub(super) rekey: bool,
    /// When the change was first wanted (rekey time is measured from here).
    pub(super) started: Timestamp,
    /// Dissolve into the component led there instead of installing a view.
    pub(super) merge_into: Option<SocketAddr>,
    /// Exchange: install this key (another component's, from a ticket) instead of a fresh
    /// one, with the leader that sent it and where it is.
    pub(super) exchange: Option<(GroupKey, MemberId, SocketAddr)>,
}

impl Change {
    /// A change to `view` that leaves out `removed` (every other member survives), lets
    /// nobody in and keeps the key; the caller sets whatever else it is to do.
    pub(super) fn removing(
        view: &View,
        removed: Vec<(MemberId, RemovalReason)>,
        started: Timestamp,
    ) -> Change {
        // The removed members' ranks by lookup (O(k log n)), then every other rank, into a
        // vector of known size; before, every member's id was compared with the removed
        // ones and the vector grew by doubling (docs/performance.md, "fifth session
        // (helper leadercpu)").
        let n = view.members.len();
        let mut gone: Vec<usize> = removed
            .iter()
            .filter_map(|(m, _)| view.members.rank_of(m))
            .collect();
        gone.sort_unstable();
        gone.dedup();
        let mut survivors = Vec::with_capacity(n - gone.len());
        let mut from = 0;
        for g in gone {
            survivors.extend(from as u16..g as u16);
            from = g + 1;
        }
        survivors.extend(from as u16..n as u16);
        Change {
            survivors,
            joiners: Vec::new(),
            removed,
            rekey: false,
            started,
            merge_into: None,
            exchange: None,
        }
    }
}

/// A view change this member coordinates.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct Coordinator {
    pub(super) proposal: ViewId,
    pub(super) survivors: Vec<u16>,
    pub(super) joiners: Vec<(Member, u64, u64)>,
    pub(super) removed: Vec<(MemberId, RemovalReason)>,
    /// The answers that carry something beyond "answered": a next message number that is
    /// not 0, or pending messages (every direct answer is kept whole).
    pub(super) answers: BTreeMap<u16, FlushAnswer>,
    /// Which survivors answered, by rank in the current view.
    pub(super) answered: Vec<bool>,
    /// Survivors that have not answered yet.
    pub(super) missing: usize,
    /// The most positions any answer (or this coordinator) delivered, and who did.
    pub(super) best: (u64, u16),
    /// Flushes sent so far (on the overlay, each resend reaches one level deeper below
    /// members that did not answer).
    pub(super) rounds: u32,
    pub(super) phase: Phase,
    pub(super) rekey: bool,
    pub(super) new_key: Option<GroupKey>,
    /// The pair keys the Pairing phase found, in the order of `new_members` (every member
    /// but this one): the wraps of a one-message Install use them instead of looking each
    /// member up again (a pair table lookup was a tenth of the leader's CPU at 10,000).
    pub(super) pair_keys: Vec<(MemberId, Arc<PairKey>)>,
    pub(super) tree_holders: BTreeSet<MemberId>,
    /// LKH: reseed instead of a batch, because the batch would carry more wraps than a
    /// reseed costs (`member/lkh.rs`, `lkh_batch_is_small`); decided with the key phase.
    pub(super) lkh_reseed: bool,
    /// Dissolve into the component whose leader is there.
    pub(super) merge_into: Option<SocketAddr>,
    /// Exchange: the key to install (taken into `new_key` by the key phase) and its sender.
    pub(super) exchange: Option<GroupKey>,
    pub(super) exchange_from: Option<(MemberId, SocketAddr)>,
    pub(super) started: Timestamp,
    pub(super) deadline: Timestamp,
    pub(super) resend_at: Timestamp,
    pub(super) final_order: u64,
    /// Dissolving: the merge Install and the members that have not confirmed it.
    pub(super) dissolving: Option<(Box<Install>, Vec<Member>)>,
}

impl Coordinator {
    /// Whether the survivor at `rank` answered.
    pub(super) fn has_answered(&self, rank: u16) -> bool {
        self.answered
            .get(usize::from(rank))
            .copied()
            .unwrap_or(false)
    }

    /// `holder` delivered `delivered` positions: the most so far becomes the flush's
    /// target (ties keep the earlier holder, this coordinator first).
    pub(super) fn note_delivered(&mut self, delivered: u64, holder: u16) {
        if delivered > self.best.0 {
            self.best = (delivered, holder);
        }
    }

    /// Takes the answer of the survivor at `rank` (the caller checked it survives): the
    /// first counts, a repeat changes nothing but fills in what the first lacked.
    pub(super) fn record_answer(&mut self, rank: u16, answer: FlushAnswer) {
        let Some(slot) = self.answered.get_mut(usize::from(rank)) else {
            return;
        };
        if !*slot {
            *slot = true;
            self.missing = self.missing.saturating_sub(1);
        }
        self.note_delivered(answer.delivered, rank);
        if answer.next_seq != 0 || !answer.pending.is_empty() {
            self.answers.entry(rank).or_insert(answer);
        }
    }
}

impl GroupMember {
    pub(super) fn next_proposal(&mut self) -> ViewId {
        let base = self.view.as_ref().map(|v| v.id.seq).unwrap_or(0);
        let seen = self
            .view_change
            .highest_proposal
            .map(|p| p.seq)
            .unwrap_or(0);
        let id = ViewId {
            seq: base.max(seen) + 1,
            coordinator: self.id,
        };
        self.view_change.highest_proposal = Some(id);
        id
    }

    /// Leader: starts a view change if one is wanted and none is running.
    pub(super) fn maybe_start_change(&mut self, now: Timestamp) {
        if self.is_leader() && self.view_change.coordinator.is_some() {
            self.join_running_change(now);
        }
        if !self.is_leader()
            || self.view_change.coordinator.is_some()
            || self.view_change.flushing.is_some()
        {
            return;
        }
        // The last Install is still unconfirmed somewhere (a joiner still opening its pair
        // channel, say): a flush now would find that member unable to answer and remove it
        // as suspected right after letting it in. Hold the change for up to a flush timeout.
        if self.view_change.announce.as_ref().is_some_and(|a| {
            !a.unacked.is_empty() && now < a.sent.saturating_add(self.config.flush_timeout)
        }) {
            return;
        }
        // An Exchange goes first: an empty view change that installs the other component's
        // key. What else is wanted follows in the next change.
        if let Some((key, from, from_addr)) = self.heal.held_exchange.take() {
            let Some(view) = self.view.as_ref() else {
                return;
            };
            let change = Change {
                rekey: true,
                exchange: Some((key, from, from_addr)),
                ..Change::removing(view, Vec::new(), now)
            };
            self.start_coordinating(now, change);
            return;
        }
        let period_due = self
            .config
            .rekey_policy
            .period
            .is_some_and(|p| now.saturating_duration_since(self.last_rekey) >= p);
        if let Some(view) = self.view.as_ref() {
            let incarnations = &self.incarnations;
            self.view_change.joiners_wanted.retain(|(m, _, inc)| {
                view.rank_of(&m.id)
                    .is_none_or(|r| incarnations.get(r) != Some(inc))
            });
        }
        if self.view_change.change_wanted.is_empty()
            && self.view_change.joiners_wanted.is_empty()
            && self.view_change.rekey_wanted.is_none()
            && !period_due
        {
            return;
        }
        let Some(view) = self.view.clone() else {
            return;
        };
        let only_joiners = self.view_change.change_wanted.is_empty()
            && self.view_change.rekey_wanted.is_none()
            && !period_due;
        if only_joiners
            && hold_joiners(
                view.members.len(),
                self.view_change.joiners_wanted.len(),
                self.view_change.joiners_since,
                self.view_change.last_join_batch,
                now,
                self.config.heartbeat_interval,
            )
        {
            return;
        }
        let removed = std::mem::take(&mut self.view_change.change_wanted);
        let mut joiners = std::mem::take(&mut self.view_change.joiners_wanted);
        // Bulk joins: a bounded batch now, the rest in the next change (in arrival order).
        let batch = join_batch(view.members.len());
        if joiners.len() > batch {
            self.view_change.joiners_wanted = joiners.split_off(batch);
        } else {
            self.view_change.joiners_since = None;
        }
        if !joiners.is_empty() {
            self.view_change.last_join_batch = Some(now);
        }
        // Requests from members already in the view with the same incarnation are stale.
        joiners.retain(|(m, _, inc)| {
            view.rank_of(&m.id)
                .is_none_or(|r| self.incarnations.get(r) != Some(inc))
        });
        // Joiners that proved they hold the key (a component merging after an Exchange) do
        // not call for a fresh one.
        let membership_changes = !removed.is_empty()
            || joiners
                .iter()
                .any(|(m, _, inc)| !self.admission.key_holders.contains(&(m.id, *inc)));
        // A member removed because it is no longer trusted never keeps the key, whatever
        // the policy (Ensemble 6.1).
        let untrusted = removed
            .iter()
            .any(|(_, why)| *why == RemovalReason::Untrusted);
        let rekey = self.view_change.rekey_wanted.is_some()
            || period_due
            || untrusted
            || (membership_changes && self.config.rekey_policy.on_membership_change);
        let started = self.view_change.rekey_wanted.take().unwrap_or(now);
        let change = Change {
            joiners,
            rekey,
            ..Change::removing(&view, removed, started)
        };
        self.start_coordinating(now, change);
    }

    /// At the leader coordinating a change that is still flushing (collecting answers or
    /// fetching positions): joiners that asked meanwhile go into this change instead of
    /// waiting for the next one. Joiners take no part in the flush (they only receive the
    /// Install, which the key phase builds from `joiners` after the flush), so letting
    /// one in before the key phase changes nothing the survivors answered. A join and a
    /// leave that arrive together then cost one view change (every member's Flush,
    /// answer, Install and acknowledgement) instead of two: issue 14's "one view change".
    /// Not into a merge or an Exchange, not past the batch or the view's bound, and not a
    /// member of the current view (a restarted member's old incarnation must leave first,
    /// which only a change of its own can do).
    fn join_running_change(&mut self, now: Timestamp) {
        let Some(view) = self.view.as_ref() else {
            return;
        };
        let Some(c) = self.view_change.coordinator.as_mut() else {
            return;
        };
        let flushing = matches!(c.phase, Phase::Collect | Phase::Fetch { .. });
        if !flushing
            || c.merge_into.is_some()
            || c.exchange.is_some()
            || c.exchange_from.is_some()
            || self.view_change.joiners_wanted.is_empty()
        {
            return;
        }
        let room = join_batch(view.members.len())
            .min(MAX_VIEW_MEMBERS.saturating_sub(c.survivors.len()))
            .saturating_sub(c.joiners.len());
        let mut taken = 0;
        let mut rekey = false;
        let wanted = std::mem::take(&mut self.view_change.joiners_wanted);
        for (m, next_seq, inc) in wanted {
            let fits = taken < room
                && view.rank_of(&m.id).is_none()
                && !c.joiners.iter().any(|(j, _, _)| j.id == m.id);
            if !fits {
                self.view_change.joiners_wanted.push((m, next_seq, inc));
                continue;
            }
            rekey |= !self.admission.key_holders.contains(&(m.id, inc));
            c.joiners.push((m, next_seq, inc));
            taken += 1;
        }
        if taken == 0 {
            return;
        }
        if rekey && self.config.rekey_policy.on_membership_change {
            c.rekey = true;
        }
        self.view_change.last_join_batch = Some(now);
        if self.view_change.joiners_wanted.is_empty() {
            self.view_change.joiners_since = None;
        }
    }

    pub(super) fn start_coordinating(&mut self, now: Timestamp, change: Change) {
        let Change {
            mut survivors,
            mut joiners,
            mut removed,
            mut rekey,
            started,
            merge_into,
            exchange,
        } = change;
        // KDC mode: every view gets a fresh key (LSGC), which also authenticates the
        // Install to each member through its wrap.
        if self.config.auth == AuthMode::Kdc {
            rekey = true;
        }
        // Ensemble 6.1: the coordinator keeps only members it trusts, and a view that loses
        // one for that reason gets a fresh key.
        let view_checked = self
            .view
            .as_ref()
            .is_some_and(|v| self.view_change.trusted_view == Some(v.id));
        if let Some(view) = self.view.as_ref().filter(|_| !view_checked) {
            let before = survivors.len();
            let mut out = Vec::new();
            survivors.retain(|r| match view.members.get(usize::from(*r)) {
                Some(m) if !self.trusts(&m.id) => {
                    out.push(m.id);
                    false
                }
                _ => true,
            });
            for id in out {
                removed.retain(|(m, _)| *m != id);
                removed.push((id, RemovalReason::Untrusted));
            }
            if survivors.len() != before {
                rekey = true;
            }
        }
        joiners.retain(|(m, _, _)| self.trusts(&m.id));
        let (exchange_key, exchange_from) = match exchange {
            Some((k, from, addr)) => (Some(k), Some((from, addr))),
            None => (None, None),
        };
        let proposal = self.next_proposal();
        // The coordinator takes part in its own flush: it drops ordering it has not
        // delivered (only the flush decides what the view delivers from here).
        self.reliable.log = self.reliable.log.split_off(&self.reliable.stable);
        self.reliable.discard_undelivered();
        self.view_change.flushing = None;
        let n = self.view.as_ref().map_or(0, |v| v.members.len());
        survivors.retain(|r| usize::from(*r) < n);
        survivors.sort_unstable();
        survivors.dedup();
        let mut coordinator = Coordinator {
            proposal,
            survivors: survivors.clone(),
            joiners,
            removed,
            answers: BTreeMap::new(),
            answered: vec![false; n],
            missing: survivors.len(),
            best: (self.reliable.delivered, self.rank),
            rounds: 0,
            phase: Phase::Collect,
            rekey,
            new_key: None,
            pair_keys: Vec::new(),
            tree_holders: BTreeSet::new(),
            lkh_reseed: false,
            merge_into,
            exchange: exchange_key,
            exchange_from,
            started,
            deadline: now.saturating_add(self.config.flush_timeout),
            resend_at: now,
            final_order: 0,
            dissolving: None,
        };
        if survivors.binary_search(&self.rank).is_ok() {
            coordinator.record_answer(self.rank, FlushAnswer::own(&self.reliable));
        }
        self.view_change.coordinator = Some(coordinator);
        self.progress_flush(now);
    }

    pub(super) fn send_flush(&mut self, now: Timestamp) {
        if self.flush_on_tree() {
            self.send_tree_flush(now);
            return;
        }
        let Some(c) = self.view_change.coordinator.as_mut() else {
            return;
        };
        c.resend_at = now.saturating_add(interval::flush_resend(&self.config));
        c.rounds += 1;
        let msg = Msg::Flush {
            proposal: ViewRef {
                seq: c.proposal.seq,
                coordinator: self.rank,
            },
            survivors: c.survivors.clone(),
        };
        let missing: Vec<u16> = c
            .survivors
            .iter()
            .copied()
            .filter(|r| !c.has_answered(*r))
            .collect();
        let missing: Vec<Destination> = missing
            .into_iter()
            .filter_map(|r| self.member_at(r))
            .map(|m| Destination::Member(m.addr))
            .collect();
        // Sealed once for all (the Flush lists the ranks left out, which grows with the
        // change: a member coordinating those a cut left out of 10,000 encoded 17 KB per
        // survivor), as the Flush on the tree is.
        if missing.len() == 1 {
            if let Destination::Member(addr) = missing[0] {
                self.send_msg(addr, &msg);
            }
        } else if !missing.is_empty() {
            if let Some(packet) = self.seal(BROADCAST, &msg) {
                self.out.push_copies(missing, &packet);
            }
        }
    }

    /// At the leader: `member` asks to leave; the next view goes without it.
    pub(super) fn on_leave_request(&mut self, now: Timestamp, member: MemberId) {
        if !self.is_leader() {
            return;
        }
        if !self
            .view_change
            .change_wanted
            .iter()
            .any(|(m, _)| *m == member)
        {
            self.view_change
                .change_wanted
                .push((member, RemovalReason::Left));
        }
        self.maybe_start_change(now);
    }

    /// At the leader: a member asks for a fresh key.
    pub(super) fn on_rekey_request(&mut self, now: Timestamp) {
        if self.is_leader() {
            self.view_change.rekey_wanted.get_or_insert(now);
            self.maybe_start_change(now);
        }
    }

    /// A Flush from the member at `rank`. `tree` holds, for a Flush that came down the
    /// overlay (sealed for everyone), the address it came from and its sealed bytes, which
    /// go on to this member's children in the flush (`tree_flush.rs`).
    pub(super) fn on_flush(
        &mut self,
        now: Timestamp,
        rank: u16,
        proposal: ViewId,
        survivors: Vec<u16>,
        tree: Option<(SocketAddr, &[u8])>,
    ) {
        if proposal.coordinator != self.member_at(rank).map(|m| m.id).unwrap_or(self.id) {
            self.counters.count(Drop::Unexpected);
            return;
        }
        if !self.trusts(&proposal.coordinator) {
            self.counters.count(Drop::Untrusted);
            return;
        }
        if !survivors.contains(&self.rank) {
            return;
        }
        if self
            .view_change
            .coordinator
            .as_ref()
            .is_some_and(|c| matches!(c.phase, Phase::Dissolving { .. }))
        {
            // Our merge Install is out: this component ends in it, not in another change.
            return;
        }
        let current = self
            .view_change
            .flushing
            .as_ref()
            .map(|f| f.proposal)
            .or(self.view_change.coordinator.as_ref().map(|c| c.proposal));
        if current.is_some_and(|p| proposal < p) {
            return;
        }
        if self.view.as_ref().is_some_and(|v| proposal <= v.id) {
            return;
        }
        if current != Some(proposal) {
            // A newer view change: join it (abandoning ours, if we coordinated one; what we
            // wanted to change is asked again in the next view if this member leads it).
            // Suspicions are not kept: the flush joined here decides who is alive, and a
            // suspicion kept past it once removed six live members a view later, when this
            // member led again (tests/chaos_schedule.rs, seed 97).
            if let Some(c) = self.view_change.coordinator.take() {
                self.view_change
                    .change_wanted
                    .extend(c.removed.into_iter().filter(|(_, why)| {
                        !matches!(why, RemovalReason::Suspected | RemovalReason::Lagged)
                    }));
                self.view_change.joiners_wanted.extend(c.joiners);
            }
            self.view_change.highest_proposal = Some(
                self.view_change
                    .highest_proposal
                    .map_or(proposal, |h| h.max(proposal)),
            );
            self.reliable.log = self.reliable.log.split_off(&self.reliable.stable);
            self.reliable.discard_undelivered();
            self.view_change.flushing = Some(Flushing {
                proposal,
                coordinator: rank,
                survivors: survivors.clone(),
                install: None,
                roster: None,
                answered_next_seq: None,
                last_nak: None,
            });
        }
        self.liveness.leader_heard = now;
        let mut answer = FlushAnswer::own(&self.reliable);
        if let Some(f) = self.view_change.flushing.as_mut() {
            // A repeated answer repeats the first one's next message number (messages
            // sent since go in the next view).
            let first = *f.answered_next_seq.get_or_insert(answer.next_seq);
            answer.next_seq = first;
            answer.pending.retain(|(seq, _)| *seq < first);
        }
        if let Some((from, packet)) = tree.filter(|_| rank == 0 && self.overlay_active()) {
            self.tree_flush_answer(now, proposal, &survivors, answer, from, packet);
            return;
        }
        let msg = Msg::FlushOk {
            proposal: ViewRef {
                seq: proposal.seq,
                coordinator: rank,
            },
            delivered: answer.delivered,
            next_seq: answer.next_seq,
            pending: answer.pending,
        };
        self.send_to_rank(rank, &msg);
    }

    pub(super) fn on_flush_ok(
        &mut self,
        now: Timestamp,
        rank: u16,
        proposal: ViewId,
        delivered: u64,
        next_seq: u64,
        pending: Vec<(u64, Vec<u8>)>,
    ) {
        let Some(c) = self.view_change.coordinator.as_mut() else {
            return;
        };
        if c.proposal != proposal
            || c.survivors.binary_search(&rank).is_err()
            || c.phase != Phase::Collect
        {
            return;
        }
        c.record_answer(
            rank,
            FlushAnswer {
                delivered,
                next_seq,
                pending,
            },
        );
        self.progress_flush(now);
    }

    /// Moves the coordinated view change forward as far as it can go now.
    pub(super) fn progress_flush(&mut self, now: Timestamp) {
        // Participant waiting for positions before installing.
        if let Some(f) = self.view_change.flushing.as_mut() {
            if let Some(install) = f.install.clone() {
                let Some(roster) = f.roster.clone() else {
                    // Fetching the list from the coordinator.
                    self.fetch_tick(now);
                    return;
                };
                let final_order = install.final_order;
                let have_all = (self.reliable.delivered..final_order)
                    .all(|o| self.reliable.log.contains_key(&o));
                if have_all {
                    self.finish_participant_install(now, install, roster);
                } else if f.last_nak.is_none_or(|t| {
                    now.saturating_duration_since(t) >= interval::fetch_retry(&self.config)
                }) {
                    f.last_nak = Some(now);
                    let coord = f.coordinator;
                    let from = (self.reliable.delivered..final_order)
                        .find(|o| !self.reliable.log.contains_key(o))
                        .unwrap_or(self.reliable.delivered);
                    if let Some(m) = self.member_at(coord) {
                        self.send_msg(
                            m.addr,
                            &Msg::Nak {
                                from,
                                to: final_order,
                            },
                        );
                    }
                }
            }
            return;
        }
        let Some(c) = self.view_change.coordinator.as_ref() else {
            return;
        };
        match c.phase {
            Phase::Collect => {
                if c.missing == 0 {
                    // The view delivers at least what any survivor delivered, and what this
                    // coordinator delivered even when it leaves itself out (a leader that
                    // leaves): it delivered every position it ordered at once, perhaps
                    // before any survivor, and survivors' pending messages appended at
                    // those positions would give them another order than the one it
                    // delivered, and lose the messages only it had delivered. Its log holds
                    // every position from the stable point up to what it delivered. (`best`
                    // starts at this coordinator's own and takes the most of every answer.)
                    let (target, holder) = c.best;
                    if let Some(c) = self.view_change.coordinator.as_mut() {
                        c.phase = Phase::Fetch {
                            target,
                            from: holder,
                        };
                    }
                    self.progress_flush(now);
                } else if now >= c.resend_at {
                    self.send_flush(now);
                }
            }
            Phase::Fetch { target, from } => {
                let missing =
                    (self.reliable.delivered..target).find(|o| !self.reliable.log.contains_key(o));
                match missing {
                    None => {
                        self.append_pending(target);
                        self.start_key_phase(now);
                    }
                    Some(lo) => {
                        if now >= c.resend_at {
                            if let Some(c) = self.view_change.coordinator.as_mut() {
                                c.resend_at =
                                    now.saturating_add(interval::fetch_retry(&self.config));
                            }
                            if let Some(m) = self.member_at(from) {
                                self.send_msg(
                                    m.addr,
                                    &Msg::Nak {
                                        from: lo,
                                        to: target,
                                    },
                                );
                            }
                        }
                    }
                }
            }
            Phase::Dissolving { target } => {
                let done = c
                    .dissolving
                    .as_ref()
                    .is_none_or(|(_, left)| left.is_empty());
                if done {
                    self.finish_dissolving(now, target);
                } else if now >= c.resend_at {
                    self.resend_merge_install(now);
                }
            }
            Phase::Pairing => {
                let new_members = self.new_members();
                let mut found = Vec::with_capacity(new_members.len());
                let mut missing: Vec<(MemberId, SocketAddr)> = Vec::new();
                for m in new_members.iter().filter(|m| m.id != self.id) {
                    match self.pairs.pair_key(&m.id) {
                        Some(k) => found.push((m.id, Arc::clone(k))),
                        None => missing.push((m.id, m.addr)),
                    }
                }
                if missing.is_empty() {
                    if let Some(c) = self.view_change.coordinator.as_mut() {
                        c.pair_keys = found;
                    }
                    self.send_install(now);
                } else if now >= c.resend_at {
                    if let Some(c) = self.view_change.coordinator.as_mut() {
                        c.resend_at = now.saturating_add(interval::flush_resend(&self.config));
                    }
                    for (id, addr) in missing {
                        self.send_pair(now, addr, Some(id), &PairMsg::Ping);
                    }
                }
            }
            Phase::Tree => {
                let new_ids: Vec<MemberId> = self.tree_members().iter().map(|m| m.id).collect();
                if new_ids
                    .iter()
                    .all(|id| *id == self.id || c.tree_holders.contains(id))
                {
                    self.send_install(now);
                } else if now >= c.resend_at {
                    // Key shares travel as datagrams: send again to the children that have
                    // not answered (each forwards again to its own).
                    self.send_tree_shares(now);
                }
            }
        }
    }

    /// Appends the survivors' pending messages (not yet ordered) after `target`.
    pub(super) fn append_pending(&mut self, target: u64) {
        let Some(c) = self.view_change.coordinator.as_mut() else {
            return;
        };
        let mut order = target;
        let mut ordered_seqs: HashMap<u16, u64> = HashMap::new();
        for m in self.reliable.log.range(..target).map(|(_, m)| m) {
            let e = ordered_seqs.entry(m.sender).or_insert(0);
            *e = (*e).max(m.seq + 1);
        }
        let mut appended = Vec::new();
        for (rank, answer) in c.answers.iter() {
            let done = ordered_seqs.get(rank).copied().unwrap_or(0);
            for (seq, data) in &answer.pending {
                if *seq >= done && *seq < answer.next_seq {
                    appended.push((
                        order,
                        OrderedMsg {
                            sender: *rank,
                            seq: *seq,
                            data: data.clone(),
                        },
                    ));
                    order += 1;
                }
            }
        }
        c.final_order = order;
        if appended.is_empty() {
            return;
        }
        let survivors = c.survivors.clone();
        let to: Vec<Destination> = survivors
            .iter()
            .filter(|r| **r != self.rank)
            .filter_map(|r| self.member_at(*r))
            .map(|m| Destination::Member(m.addr))
            .collect();
        // In runs of consecutive positions that fit a part, each sealed once for every
        // survivor: one datagram per run and survivor, not per message and survivor.
        let limit = self.part_limit;
        let mut runs: Vec<Msg> = Vec::new();
        let mut size = 0usize;
        for (o, m) in appended {
            let entry = (m.sender, m.seq, m.data.clone());
            let entry_size = 14 + m.data.len();
            self.reliable.log.insert(o, m);
            match runs.last_mut() {
                Some(Msg::OrderedRun { entries, .. })
                    if size + entry_size <= limit && entries.len() < MAX_PENDING =>
                {
                    entries.push(entry);
                    size += entry_size;
                }
                _ => {
                    runs.push(Msg::OrderedRun {
                        first: o,
                        entries: vec![entry],
                    });
                    size = entry_size;
                }
            }
        }
        for run in &runs {
            self.seal_to(to.clone(), BROADCAST, run);
        }
    }

    /// The next view's members, by rank: survivors in their old order, then joiners (each
    /// once, and none that survives). O(n log n).
    pub(super) fn new_members(&self) -> Vec<Member> {
        let Some(c) = self.view_change.coordinator.as_ref() else {
            return Vec::new();
        };
        let mut survivors = c.survivors.clone();
        survivors.sort_unstable();
        survivors.dedup();
        let mut members: Vec<Member> = survivors
            .iter()
            .filter_map(|r| self.member_at(*r))
            .collect();
        let mut seen = BTreeSet::new();
        for (j, _, _) in &c.joiners {
            let survives = self
                .view
                .as_ref()
                .and_then(|v| v.rank_of(&j.id))
                .is_some_and(|r| survivors.binary_search(&(r as u16)).is_ok());
            if !survives && seen.insert(j.id) {
                members.push(*j);
            }
        }
        members
    }

    /// The coordinator's deadline passed: exclude who did not answer, and start over.
    pub(super) fn restart_flush(&mut self, now: Timestamp) {
        let Some(phase) = self.view_change.coordinator.as_ref().map(|c| c.phase) else {
            return;
        };
        if let Phase::Dissolving { target } = phase {
            // Members that did not confirm by now fall back on their own (takeover, then
            // an Exchange); the merge does not wait for them any longer.
            self.finish_dissolving(now, target);
            return;
        }
        // Who did not answer, computed while the coordinator state is still in place.
        let silent: Vec<MemberId> = match phase {
            Phase::Collect => self
                .view_change
                .coordinator
                .as_ref()
                .map_or(Vec::new(), |c| {
                    c.survivors
                        .iter()
                        .filter(|r| !c.has_answered(**r))
                        .filter_map(|r| self.member_at(*r).map(|m| m.id))
                        .collect()
                }),
            Phase::Fetch { from, .. } => {
                self.member_at(from).map(|m| vec![m.id]).unwrap_or_default()
            }
            Phase::Pairing => self
                .new_members()
                .into_iter()
                .filter(|m| m.id != self.id && self.pairs.pair_key(&m.id).is_none())
                .map(|m| m.id)
                .collect(),
            Phase::Dissolving { .. } => Vec::new(),
            Phase::Tree => {
                let holders = self
                    .view_change
                    .coordinator
                    .as_ref()
                    .map(|c| c.tree_holders.clone())
                    .unwrap_or_default();
                self.tree_members()
                    .into_iter()
                    .filter(|m| !holders.contains(&m.id))
                    .map(|m| m.id)
                    .collect()
            }
        };
        // Their pair channels may be half dead (one end forgot): start them afresh.
        let joiners: Vec<Member> = self
            .view_change
            .coordinator
            .as_ref()
            .map_or(Vec::new(), |c| {
                c.joiners.iter().map(|(m, _, _)| *m).collect()
            });
        let addrs: Vec<SocketAddr> = silent
            .iter()
            .filter_map(|id| {
                self.view
                    .as_ref()
                    .and_then(|v| v.rank_of(id).map(|r| v.members[r].addr))
                    .or_else(|| joiners.iter().find(|m| m.id == *id).map(|m| m.addr))
            })
            .collect();
        for a in addrs {
            self.pairs.forget(a);
        }
        let Some(c) = self.view_change.coordinator.take() else {
            return;
        };
        self.restart_with(now, c, silent);
    }

    pub(super) fn restart_with(&mut self, now: Timestamp, c: Coordinator, silent: Vec<MemberId>) {
        let mut removed = c.removed.clone();
        let mut survivors = c.survivors.clone();
        let mut joiners = c.joiners.clone();
        for id in &silent {
            removed.push((*id, RemovalReason::Suspected));
            joiners.retain(|(j, _, _)| j.id != *id);
            if let Some(r) = self.view.as_ref().and_then(|v| v.rank_of(id)) {
                survivors.retain(|s| usize::from(*s) != r);
            }
        }
        let rekey =
            c.rekey || (!silent.is_empty() && self.config.rekey_policy.on_membership_change);
        // An Exchange in progress goes on with its key.
        let exchange = match (c.exchange_from, c.exchange.or(c.new_key)) {
            (Some((from, addr)), Some(k)) => Some((k, from, addr)),
            _ => None,
        };
        self.start_coordinating(
            now,
            Change {
                survivors,
                joiners,
                removed,
                rekey,
                started: c.started,
                merge_into: c.merge_into,
                exchange,
            },
        );
    }
}
