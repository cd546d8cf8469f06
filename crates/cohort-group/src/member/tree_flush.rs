//! The view change on the overlay (issue 14): in views of more than `OVERLAY_MIN` members
//! led by rank 0, the leader's Flush goes down the overlay, the survivors' answers come
//! back up folded into one [`Msg::FlushOks`] per subtree, and once the view is installed
//! the acknowledgements come back up folded likewise ([`Msg::InstallAcks`], under the old
//! view's keys, over the same tree). The leader then sends a Flush and receives answers
//! and acknowledgements from its children only, not from every member.
//!
//! ```text
//!   flush tree: the overlay of the current view (overlay.rs), with every member that
//!   does not survive skipped: its children hang from its nearest surviving ancestor
//!   (rank 0, the coordinator, is the root even when it leaves).
//!
//!   down: Flush (sealed once, for everyone) ── each member passes the same bytes on
//!   up:   FlushOks  ── a member answers once its flush children did, or after
//!                      `gather_wait`, with what it has; what comes later goes up at once
//!         InstallAcks ── the same, after the member installed the view
//! ```
//!
//! A member that did not answer is reached again by the coordinator's resends, which go
//! directly to the members that did not answer whose nearest answering ancestor is at most
//! `round` levels up (the first resend reaches the children of a crashed member, the next
//! their children, ...); a member that gets a Flush directly from the coordinator answers
//! it directly. So a crashed interior member delays the change by one resend, not by a
//! flush timeout, and members below it are not taken for dead.
//!
//! The coordinator's safety is the same as with direct answers: a survivor counts as
//! answered only when its own answer (delivered positions, next message number, pending
//! messages) reached the coordinator in one message; the folded `delivered` of a message is
//! the most any member it covers delivered, with a member that did (`holder`).
//!
//! Owns: `TreeFlush` (in `ViewChange::tree`): this member's part in one such change (where
//! its answers go, its flush children, what it gathered and sent). It may not install a
//! view or change the coordinator's decisions: it hands answers to `Coordinator` (`flush.rs`)
//! and acknowledgements to `on_install_ack` (`install.rs`).

use super::flush::{Coordinator, FlushAnswer, Phase};
use super::output::{Destination, BROADCAST};
use super::overlay::{active, children, in_subtree, parent};
use super::timers::interval;
use super::GroupMember;
use crate::event::Drop;
use crate::id::{Members, ViewId};
use crate::wire::{ranks_to_runs, runs_to_ranks, Msg, ViewRef, MAX_PENDING, MAX_RUNS};
use cohort_core::Timestamp;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

/// How long a member gathers its flush children's answers (or acknowledgements) before it
/// sends up what it has: half the coordinator's resend interval, so a subtree's answers
/// are in before the coordinator resends.
fn gather_wait(flush_timeout: Duration) -> Duration {
    flush_timeout / 8
}

/// The parent of `rank` in the flush tree over `survivors` (sorted): its nearest surviving
/// overlay ancestor, or the root, rank 0.
pub(super) fn flush_parent(rank: u16, survivors: &[u16]) -> u16 {
    let mut p = parent(rank).unwrap_or(0);
    while p != 0 && survivors.binary_search(&p).is_err() {
        p = parent(p).unwrap_or(0);
    }
    p
}

/// The children of `rank` in the flush tree over `survivors` (sorted) in a view of `n`:
/// its surviving overlay children, and in place of each one that does not survive, that
/// one's flush children. Ascending.
pub(super) fn flush_children(rank: u16, n: usize, survivors: &[u16]) -> Vec<u16> {
    let mut out = Vec::new();
    let mut stack: Vec<u16> = children(rank, n).collect();
    while let Some(c) = stack.pop() {
        if survivors.binary_search(&c).is_ok() {
            out.push(c);
        } else {
            stack.extend(children(c, n));
        }
    }
    out.sort_unstable();
    out
}

/// One member's answer as it travels folded: the most delivered by the message it came in
/// (with a member that delivered it), its next message number and its pending messages.
#[derive(Clone)]
struct Folded {
    delivered: u64,
    holder: u16,
    next_seq: u64,
    pending: Vec<(u64, Vec<u8>)>,
}

/// This member's part in a view change on the overlay.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct TreeFlush {
    /// The proposal (the view being installed).
    pub(super) proposal: ViewId,
    /// The view whose overlay carries the change (the view before it).
    base: ViewId,
    /// This member's rank in `base`.
    my_rank: u16,
    /// Where answers and acknowledgements go: the flush parent, or the coordinator (rank
    /// 0) once it sent the Flush here directly.
    up: u16,
    /// The flush children.
    children: Vec<u16>,
    /// Flush children whose answers came.
    answered_children: BTreeSet<u16>,
    /// Answers gathered and not yet sent up, by rank.
    gathered: BTreeMap<u16, Folded>,
    /// Every answer gathered (sent or not): sent up again whole on a repeated Flush.
    all: BTreeMap<u16, Folded>,
    /// Whether the gathered answers went up once (later ones then go up at once).
    answers_sent: bool,
    /// When the gathered answers go up even if some children have not answered.
    answer_deadline: Timestamp,
    /// Flush children whose acknowledgements came.
    acked_children: BTreeSet<u16>,
    /// Acknowledgements gathered and not yet sent up (ranks in `base`).
    acks: Vec<u16>,
    /// Whether this member installed the view.
    installed: bool,
    /// Whether gathered acknowledgements went up once.
    acks_sent: bool,
    /// When the acknowledgements go up even if some children have not acknowledged.
    ack_deadline: Option<Timestamp>,
    /// When this state is dropped whatever happened.
    expires: Timestamp,
}

impl TreeFlush {
    /// The proposal as its answers and acknowledgements name it: by its coordinator's rank
    /// in `base`, always the leader's (a Flush comes down the overlay only from rank 0).
    fn reference(&self) -> ViewRef {
        ViewRef {
            seq: self.proposal.seq,
            coordinator: 0,
        }
    }

    /// The earliest deadline of this state.
    pub(super) fn next_deadline(&self) -> Timestamp {
        let mut t = self.expires;
        if !self.answers_sent || !self.gathered.is_empty() {
            t = t.min(self.answer_deadline);
        }
        if let Some(a) = self.ack_deadline {
            if !self.acks.is_empty() {
                t = t.min(a);
            }
        }
        t
    }
}

/// Splits gathered answers into [`Msg::FlushOks`] that each fit `limit` bytes (a member's
/// whole answer always travels in one message).
fn fold_answers(proposal: ViewRef, answers: &BTreeMap<u16, Folded>, limit: usize) -> Vec<Msg> {
    let mut out = Vec::new();
    let mut ranks: Vec<u16> = Vec::new();
    let mut size = 0usize;
    let mut pending_count = 0usize;
    let flush = |ranks: &mut Vec<u16>, out: &mut Vec<Msg>| {
        if ranks.is_empty() {
            return;
        }
        let mut best: Option<(u64, u16)> = None;
        let mut next_seqs = Vec::new();
        let mut pending = Vec::new();
        for r in ranks.iter() {
            let a = &answers[r];
            if best.is_none_or(|(d, _)| a.delivered > d) {
                best = Some((a.delivered, a.holder));
            }
            if a.next_seq != 0 {
                next_seqs.push((*r, a.next_seq));
            }
            for (seq, data) in &a.pending {
                pending.push((*r, *seq, data.clone()));
            }
        }
        let (delivered, holder) = best.unwrap_or((0, ranks[0]));
        out.push(Msg::FlushOks {
            proposal,
            delivered,
            holder,
            answered: ranks_to_runs(ranks),
            next_seqs,
            pending,
        });
        ranks.clear();
    };
    for (r, a) in answers {
        let cost = 4
            + if a.next_seq != 0 { 10 } else { 0 }
            + a.pending.iter().map(|(_, d)| 14 + d.len()).sum::<usize>();
        let too_big = size + cost > limit
            || ranks.len() >= MAX_RUNS
            || pending_count + a.pending.len() > MAX_PENDING;
        if !ranks.is_empty() && too_big {
            flush(&mut ranks, &mut out);
            size = 0;
            pending_count = 0;
        }
        ranks.push(*r);
        size += cost;
        pending_count += a.pending.len();
    }
    flush(&mut ranks, &mut out);
    out
}

/// Acknowledgements as [`Msg::InstallAcks`] of at most [`MAX_RUNS`] runs each.
fn fold_acks(view: ViewRef, acks: &[u16]) -> Vec<Msg> {
    ranks_to_runs(acks)
        .chunks(MAX_RUNS)
        .map(|runs| Msg::InstallAcks {
            view,
            acked: runs.to_vec(),
        })
        .collect()
}

/// Whether every rank of `runs` lies in `root`'s overlay subtree of a view of `n`.
fn runs_in_subtree(root: u16, n: usize, runs: &[(u16, u16)]) -> bool {
    if root == 0 {
        // Every rank lies below the root: only the range is checked (the leader of 10,000
        // walked each acknowledged rank up the tree).
        return runs_to_ranks(runs).all(|r| usize::from(r) < n);
    }
    runs_to_ranks(runs).all(|r| usize::from(r) < n && in_subtree(root, r))
}

impl GroupMember {
    /// Whether this member, coordinating, runs its flush on the overlay: a view of more
    /// than `OVERLAY_MIN` members, and this member is its root (rank 0).
    pub(super) fn flush_on_tree(&self) -> bool {
        self.rank == 0 && self.overlay_active()
    }

    /// The coordinator on the overlay: the first Flush goes to its flush children, sealed
    /// once for everyone; each resend goes, sealed afresh, directly to the survivors that
    /// have not answered and lie at most `rounds` levels below their nearest answering
    /// ancestor (the root of a silent subtree first, then its children, ...).
    pub(super) fn send_tree_flush(&mut self, now: Timestamp) {
        let n = self.view.as_ref().map_or(0, |v| v.members.len());
        let Some(c) = self.view_change.coordinator.as_mut() else {
            return;
        };
        c.resend_at = now.saturating_add(interval::flush_resend(&self.config));
        let round = c.rounds;
        c.rounds += 1;
        let msg = Msg::Flush {
            proposal: ViewRef {
                seq: c.proposal.seq,
                coordinator: self.rank,
            },
            survivors: c.survivors.clone(),
        };
        let targets: Vec<u16> = if round == 0 {
            flush_children(0, n, &c.survivors)
        } else {
            silent_within(c, round)
        };
        if targets.is_empty() {
            return;
        }
        let to: Vec<Destination> = targets
            .into_iter()
            .filter_map(|r| self.member_at(r))
            .map(|m| Destination::Member(m.addr))
            .collect();
        self.seal_to(to, BROADCAST, &msg);
    }

    /// A member's answer to a Flush that came down the overlay from `from` (`packet`, the
    /// sealed bytes): the Flush goes on to its flush children, and its answer is gathered
    /// with theirs. A repeat (the coordinator resending) goes again to the children that
    /// have not answered, and everything gathered goes up again.
    pub(super) fn tree_flush_answer(
        &mut self,
        now: Timestamp,
        proposal: ViewId,
        survivors: &[u16],
        answer: FlushAnswer,
        from: SocketAddr,
        packet: &[u8],
    ) {
        let Some(view) = self.view.as_ref() else {
            return;
        };
        let n = view.members.len();
        let base = view.id;
        let from_coordinator = view.members.first().is_some_and(|m| m.addr == from);
        let wait = gather_wait(self.config.flush_timeout);
        let fresh = self
            .view_change
            .tree
            .as_ref()
            .is_none_or(|t| t.proposal != proposal);
        if fresh {
            let mut sorted = survivors.to_vec();
            sorted.sort_unstable();
            let up = if from_coordinator {
                0
            } else {
                flush_parent(self.rank, &sorted)
            };
            let own = Folded {
                delivered: answer.delivered,
                holder: self.rank,
                next_seq: answer.next_seq,
                pending: answer.pending,
            };
            let mut gathered = BTreeMap::new();
            gathered.insert(self.rank, own);
            self.view_change.tree = Some(TreeFlush {
                proposal,
                base,
                my_rank: self.rank,
                up,
                children: flush_children(self.rank, n, &sorted),
                answered_children: BTreeSet::new(),
                all: gathered.clone(),
                gathered,
                answers_sent: false,
                answer_deadline: now.saturating_add(wait),
                acked_children: BTreeSet::new(),
                acks: Vec::new(),
                installed: false,
                acks_sent: false,
                ack_deadline: None,
                expires: now.saturating_add(self.config.flush_timeout * 4),
            });
        }
        let Some(t) = self.view_change.tree.as_mut() else {
            return;
        };
        if from_coordinator {
            t.up = 0;
        }
        if !fresh {
            // Asked again: everything goes up again once the children answer.
            t.gathered = t.all.clone();
            t.answers_sent = false;
            t.answer_deadline = now.saturating_add(wait);
        }
        let quiet: Vec<u16> = t
            .children
            .iter()
            .copied()
            .filter(|c| !t.answered_children.contains(c))
            .collect();
        let addrs: Vec<SocketAddr> = quiet
            .iter()
            .filter_map(|r| self.member_at(*r).map(|m| m.addr))
            .collect();
        self.out
            .push_copies(addrs.into_iter().map(Destination::Member), packet);
        if quiet.is_empty() {
            self.send_answers_up();
        }
    }

    /// Sends the gathered answers up (to the flush parent or the coordinator).
    fn send_answers_up(&mut self) {
        let limit = self.part_limit;
        let Some(t) = self.view_change.tree.as_mut() else {
            return;
        };
        t.answers_sent = true;
        if t.gathered.is_empty() {
            return;
        }
        let msgs = fold_answers(t.reference(), &t.gathered, limit);
        t.gathered.clear();
        let up = t.up;
        for m in &msgs {
            self.send_to_rank(up, m);
        }
    }

    /// Folded flush answers from the member at `rank`: at the coordinator they count for
    /// every survivor they cover; at a member taking part they are gathered (or, once this
    /// member's answers went up, passed on at once).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_flush_oks(
        &mut self,
        now: Timestamp,
        rank: u16,
        proposal: ViewId,
        delivered: u64,
        holder: u16,
        answered: Vec<(u16, u16)>,
        next_seqs: Vec<(u16, u64)>,
        pending: Vec<(u16, u64, Vec<u8>)>,
    ) {
        let n = self.view.as_ref().map_or(0, |v| v.members.len());
        // Only a member's own subtree: nobody answers for members elsewhere in the tree.
        let covered = |r: u16| usize::from(r) < n && in_subtree(rank, r);
        if !active(n)
            || !covered(holder)
            || !runs_in_subtree(rank, n, &answered)
            || next_seqs.iter().any(|(r, _)| !covered(*r))
            || pending.iter().any(|(r, _, _)| !covered(*r))
        {
            self.counters.count(Drop::Unexpected);
            return;
        }
        if let Some(c) = self.view_change.coordinator.as_mut() {
            if self.rank != 0 {
                self.counters.count(Drop::Unexpected);
                return;
            }
            if c.proposal != proposal || c.phase != Phase::Collect {
                // Late, or for a flush given up: as with a direct answer, nothing to do.
                return;
            }
            c.note_delivered(delivered, holder);
            // The answers go straight to the coordinator's record, rank by rank: a map of
            // every rank of the runs (a subtree of thousands at the leader of 10,000) was
            // built and dropped for each message. Numbers and pending messages are few (only
            // members that sent something) and looked up; as below, those of ranks the
            // message does not mark answered are ignored, and a later number for a rank
            // replaces an earlier one.
            let seqs: BTreeMap<u16, u64> = next_seqs.into_iter().collect();
            let mut pend: BTreeMap<u16, Vec<(u64, Vec<u8>)>> = BTreeMap::new();
            for (r, seq, data) in pending {
                pend.entry(r).or_default().push((seq, data));
            }
            // Runs come in rank order and survivors are sorted, so the survivor after the
            // last one found is almost always the next rank: checked first, before a binary
            // search (one per rank was a tenth of the leader's CPU in an lkh leave at 10,000).
            let mut hint = 0;
            for r in runs_to_ranks(&answered) {
                let at = if c.survivors.get(hint) == Some(&r) {
                    Some(hint)
                } else {
                    c.survivors.binary_search(&r).ok()
                };
                if let Some(i) = at {
                    hint = i + 1;
                    c.record_answer(
                        r,
                        FlushAnswer {
                            delivered,
                            next_seq: seqs.get(&r).copied().unwrap_or(0),
                            pending: pend.remove(&r).unwrap_or_default(),
                        },
                    );
                }
            }
            self.progress_flush(now);
            return;
        }
        let mut folded: BTreeMap<u16, Folded> = runs_to_ranks(&answered)
            .map(|r| {
                (
                    r,
                    Folded {
                        delivered,
                        holder,
                        next_seq: 0,
                        pending: Vec::new(),
                    },
                )
            })
            .collect();
        // Numbers and pending messages of ranks the message does not mark answered are
        // ignored: an answer counts only whole.
        for (r, seq) in next_seqs {
            if let Some(f) = folded.get_mut(&r) {
                f.next_seq = seq;
            }
        }
        for (r, seq, data) in pending {
            if let Some(f) = folded.get_mut(&r) {
                f.pending.push((seq, data));
            }
        }
        let view_id = self.view.as_ref().map(|v| v.id);
        let Some(t) = self.view_change.tree.as_mut() else {
            self.counters.count(Drop::Unexpected);
            return;
        };
        if t.proposal != proposal || Some(t.base) != view_id {
            // For a flush this member no longer takes part in.
            return;
        }
        if !t.children.contains(&rank) {
            self.counters.count(Drop::Unexpected);
            return;
        }
        t.answered_children.insert(rank);
        for (r, f) in folded {
            t.all.insert(r, f.clone());
            t.gathered.insert(r, f);
        }
        let complete = t.children.iter().all(|c| t.answered_children.contains(c));
        if t.answers_sent || complete {
            self.send_answers_up();
        }
    }

    /// A member installed the view its flush on the overlay proposed: its acknowledgement
    /// goes up the old view's tree with its flush children's. False when this view change
    /// did not run on the overlay here (the caller acknowledges directly).
    pub(super) fn tree_ack_own(&mut self, now: Timestamp, view: ViewId) -> bool {
        let wait = gather_wait(self.config.flush_timeout);
        let Some(t) = self.view_change.tree.as_mut() else {
            return false;
        };
        if t.proposal != view {
            return false;
        }
        if !t.installed {
            t.installed = true;
            t.acks.push(t.my_rank);
        }
        t.ack_deadline.get_or_insert(now.saturating_add(wait));
        let complete = t.children.iter().all(|c| t.acked_children.contains(c));
        if t.acks_sent || complete {
            self.send_acks_up();
        }
        true
    }

    /// Sends the gathered acknowledgements up, under the old view's keys.
    fn send_acks_up(&mut self) {
        let Some(t) = self.view_change.tree.as_mut() else {
            return;
        };
        t.acks_sent = true;
        if t.acks.is_empty() {
            return;
        }
        let msgs = fold_acks(t.reference(), &t.acks);
        t.acks.clear();
        let (base, up) = (t.base, t.up);
        let addr = if self.view.as_ref().is_some_and(|v| v.id == base) {
            self.member_at(up).map(|m| m.addr)
        } else {
            self.old_views
                .iter()
                .find(|o| o.view.id == base)
                .and_then(|o| o.view.members.get(usize::from(up)).map(|m| m.addr))
        };
        let Some(addr) = addr else {
            return;
        };
        let current = self.view.as_ref().is_some_and(|v| v.id == base);
        for m in &msgs {
            if current {
                self.send_msg(addr, m);
            } else {
                self.send_msg_old(base, addr, m);
            }
        }
    }

    /// Folded acknowledgements of `view` from the member at `rank` of the view `base` they
    /// travel in: at the coordinator each acknowledges its member; at a member taking part
    /// they are gathered with its own (or passed on at once once its own went up).
    pub(super) fn on_install_acks(
        &mut self,
        now: Timestamp,
        base: ViewId,
        rank: u16,
        view: ViewId,
        acked: Vec<(u16, u16)>,
    ) {
        let members = if self.view.as_ref().is_some_and(|v| v.id == base) {
            self.view.as_ref().map(|v| v.members.clone())
        } else {
            self.old_views
                .iter()
                .find(|o| o.view.id == base)
                .map(|o| o.view.members.clone())
        };
        let Some(members) = members else {
            self.counters.count(Drop::Unexpected);
            return;
        };
        let n = members.len();
        if !active(n) || !runs_in_subtree(rank, n, &acked) {
            self.counters.count(Drop::Unexpected);
            return;
        }
        let announced = self
            .view_change
            .announce
            .as_ref()
            .is_some_and(|a| a.view == view && a.install.base == base);
        if announced {
            self.on_install_acks_at_coordinator(now, &members, &acked);
            return;
        }
        let Some(t) = self.view_change.tree.as_mut() else {
            self.counters.count(Drop::Unexpected);
            return;
        };
        if t.proposal != view || t.base != base {
            return;
        }
        if !t.children.contains(&rank) {
            self.counters.count(Drop::Unexpected);
            return;
        }
        t.acked_children.insert(rank);
        t.acks.extend(runs_to_ranks(&acked));
        t.ack_deadline
            .get_or_insert(now.saturating_add(gather_wait(self.config.flush_timeout)));
        let complete = t.children.iter().all(|c| t.acked_children.contains(c));
        if t.acks_sent || (t.installed && complete) {
            self.send_acks_up();
        }
    }

    /// The coordinator: the members at the ranks `acked` of the base view (`base_members`)
    /// acknowledged the announced Install. A survivor's new rank follows from its old one
    /// and the Install's `left` (a binary search over the change), so taking out a folded
    /// run costs O(run × log change), not a scan of every unacknowledged member.
    fn on_install_acks_at_coordinator(
        &mut self,
        now: Timestamp,
        base_members: &Members,
        acked: &[(u16, u16)],
    ) {
        let Some(a) = self.view_change.announce.as_mut() else {
            return;
        };
        for r in runs_to_ranks(acked) {
            let Some(m) = base_members.get(usize::from(r)) else {
                continue;
            };
            match a.install.survivor_rank(r) {
                Some(new)
                    if a.members
                        .get(usize::from(new))
                        .is_some_and(|n| n.id == m.id) =>
                {
                    a.unacked.acked_at(usize::from(new), &m.id);
                }
                // Not where the change puts it (an order a merge set): looked up.
                _ => {
                    if let Some(new) = a.members.rank_of(&m.id) {
                        a.unacked.acked_at(new, &m.id);
                    }
                }
            }
        }
        if a.unacked.is_empty() {
            self.maybe_start_change(now);
        }
    }

    /// On the tick: gathered answers or acknowledgements whose wait is over go up; the
    /// state is dropped when it expires.
    pub(super) fn tree_flush_tick(&mut self, now: Timestamp) {
        let Some(t) = self.view_change.tree.as_ref() else {
            return;
        };
        if now >= t.expires {
            self.view_change.tree = None;
            return;
        }
        // The same conditions as `next_deadline`: a deadline it reports is always acted on.
        let answers_due = (!t.answers_sent || !t.gathered.is_empty()) && now >= t.answer_deadline;
        let acks_due = t
            .ack_deadline
            .is_some_and(|d| now >= d && !t.acks.is_empty());
        if answers_due {
            self.send_answers_up();
        }
        if acks_due {
            self.send_acks_up();
        }
    }

    /// The addresses of this member's flush children in the change that proposed `view`,
    /// if it took part in one on the overlay.
    pub(super) fn flush_tree_addrs(&self, view: ViewId) -> Option<Vec<SocketAddr>> {
        let t = self.view_change.tree.as_ref()?;
        if t.proposal != view {
            return None;
        }
        let members = &self.view.as_ref()?.members;
        Some(
            t.children
                .iter()
                .filter_map(|r| members.get(usize::from(*r)).map(|m| m.addr))
                .collect(),
        )
    }

    /// Whether this member follows a flush on the overlay now (it then sends no
    /// heartbeats to the coordinator: its answers tell the coordinator it lives).
    pub(super) fn following_tree_flush(&self) -> bool {
        match (
            self.view_change.flushing.as_ref(),
            self.view_change.tree.as_ref(),
        ) {
            (Some(f), Some(t)) => f.proposal == t.proposal,
            _ => false,
        }
    }
}

/// The survivors that have not answered and lie at most `round` levels below their nearest
/// ancestor that answered (or the root), in the flush tree.
fn silent_within(c: &Coordinator, round: u32) -> Vec<u16> {
    c.survivors
        .iter()
        .copied()
        .filter(|r| !c.has_answered(*r))
        .filter(|r| {
            let mut levels = 0u32;
            let mut p = flush_parent(*r, &c.survivors);
            while p != 0 && !c.has_answered(p) {
                levels += 1;
                p = flush_parent(p, &c.survivors);
            }
            levels <= round
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs under the root are checked by range only: the same answers as walking each
    /// rank up the tree, for runs inside the view, past its end, and wrapping past u16.
    #[test]
    fn runs_under_the_root_need_only_lie_in_the_view() {
        let n = 10_000;
        let walked = |root: u16, runs: &[(u16, u16)]| {
            runs_to_ranks(runs).all(|r| usize::from(r) < n && in_subtree(root, r))
        };
        let cases: [&[(u16, u16)]; 6] = [
            &[],
            &[(0, 1)],
            &[(1, 9_999)],
            &[(3, 16), (400, 3), (9_990, 10)],
            &[(9_990, 11)],
            &[(65_535, 2)],
        ];
        for runs in cases {
            assert_eq!(runs_in_subtree(0, n, runs), walked(0, runs), "{runs:?}");
        }
        assert!(runs_in_subtree(0, n, &[(1, 9_999)]));
        assert!(!runs_in_subtree(0, n, &[(9_990, 11)]));
        // Below another root, ranks of other subtrees still fail.
        assert!(runs_in_subtree(1, n, &[(3, 16)]));
        assert!(!runs_in_subtree(1, n, &[(19, 1)]));
    }

    #[test]
    fn the_flush_tree_skips_members_that_do_not_survive() {
        let n = 300;
        // Rank 1 leaves: its children 3..=18 hang from the root.
        let survivors: Vec<u16> = (0..n as u16).filter(|r| *r != 1).collect();
        let root: Vec<u16> = (2..=18).collect();
        assert_eq!(flush_children(0, n, &survivors), root);
        assert_eq!(flush_parent(5, &survivors), 0);
        assert_eq!(flush_parent(20, &survivors), 2);
        assert_eq!(flush_parent(35, &survivors), 3);
        assert!(flush_children(1, n, &survivors).len() == 16);
        // Every survivor but the root has exactly one flush parent that lists it.
        for r in survivors.iter().copied().filter(|r| *r != 0) {
            let p = flush_parent(r, &survivors);
            assert!(flush_children(p, n, &survivors).contains(&r), "rank {r}");
        }
    }

    #[test]
    fn answers_fold_into_messages_that_fit_and_keep_each_answer_whole() {
        let proposal = ViewRef {
            seq: 3,
            coordinator: 0,
        };
        let mut answers = BTreeMap::new();
        for r in 0..500u16 {
            answers.insert(
                r,
                Folded {
                    delivered: u64::from(r % 7),
                    holder: r,
                    next_seq: u64::from(r % 3),
                    pending: if r % 50 == 0 {
                        vec![(1, vec![7; 100])]
                    } else {
                        Vec::new()
                    },
                },
            );
        }
        let msgs = fold_answers(proposal, &answers, 1000);
        assert!(msgs.len() > 1);
        let mut seen = BTreeSet::new();
        for m in &msgs {
            let mut bytes = Vec::new();
            m.encode(&mut bytes);
            assert!(bytes.len() <= 1000 + 64, "{} bytes", bytes.len());
            let Msg::FlushOks {
                answered,
                next_seqs,
                pending,
                delivered,
                holder,
                ..
            } = m
            else {
                panic!("not FlushOks");
            };
            let ranks: BTreeSet<u16> = runs_to_ranks(answered).collect();
            assert!(next_seqs.iter().all(|(r, _)| ranks.contains(r)));
            assert!(pending.iter().all(|(r, _, _)| ranks.contains(r)));
            assert_eq!(
                *delivered,
                ranks.iter().map(|r| u64::from(r % 7)).max().unwrap()
            );
            assert_eq!(u64::from(holder % 7), *delivered);
            seen.extend(ranks);
        }
        assert_eq!(seen.len(), 500);
    }
}
