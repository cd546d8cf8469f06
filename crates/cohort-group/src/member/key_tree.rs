//! The tree rekey (Ensemble): the leader sends the new key down a tree of pair channels,
//! acknowledgements climb back, and the key is installed with the next view.
//!
//! Owns: `KeyTree` (a key received for a proposal, children still to acknowledge, the
//! acknowledgement sent up). It may not install anything: the coordinator's flush goes on
//! once the tree has acknowledged.

use super::flush::Phase;
use super::timers::interval;
use super::GroupMember;
use crate::config::RekeyMethod;
use crate::event::Drop;
use crate::id::{Member, MemberId, ViewId};
use crate::keys::{GroupKey, GROUP_KEY_LEN};
use crate::wire::{ranks_left_out, ranks_to_runs, runs_to_ranks, PairMsg, MAX_RUNS};
use cohort_core::Timestamp;
use cohort_crypto::Secret;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use zeroize::Zeroizing;

/// This member's place in a tree rekey: a key received for a proposal, children still to acknowledge, the acknowledgement sent up.
#[derive(Default)]
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct KeyTree {
    /// A key received down the rekey tree, for the proposal it belongs to.
    pub(super) tree_key: Option<(ViewId, GroupKey)>,
    /// A tree node's children still to acknowledge, and who acknowledged.
    pub(super) tree_wait: Option<TreeWait>,
    /// The last acknowledgement sent up the tree, repeated if the share comes again.
    pub(super) tree_acked: Option<(ViewId, BTreeSet<MemberId>)>,
}

/// A tree node waiting for its children's key acknowledgements.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct TreeWait {
    pub(super) proposal: ViewId,
    pub(super) parent: SocketAddr,
    pub(super) parent_id: MemberId,
    pub(super) children: Vec<MemberId>,
    pub(super) holders: BTreeSet<MemberId>,
    pub(super) deadline: Timestamp,
}

/// Splits positions `first .. first + count` of the tree order among up to `degree`
/// children, each taking a contiguous share: its first position is the child, the rest lie
/// below it. Returns (the child's position, the positions below it as (first, count)).
pub(super) fn split_tree(first: usize, count: usize, degree: usize) -> Vec<(usize, (u16, u16))> {
    let degree = degree.max(1);
    if count == 0 {
        return Vec::new();
    }
    let children = degree.min(count);
    let mut out = Vec::with_capacity(children);
    let base = count / children;
    let extra = count % children;
    let mut start = first;
    for i in 0..children {
        let len = base + usize::from(i < extra);
        out.push((start, ((start + 1) as u16, (len - 1) as u16)));
        start += len;
    }
    out
}

/// The tree order of a tree rekey, read in place: the survivors' ranks as the Flush listed
/// them, less the coordinator's (at `skip`, when it is among them).
struct TreeOrder<'a> {
    ranks: &'a [u16],
    skip: Option<usize>,
}

impl TreeOrder<'_> {
    /// The number of positions.
    fn len(&self) -> usize {
        self.ranks.len() - usize::from(self.skip.is_some())
    }

    /// The rank in the current view of the member at `position`.
    fn rank(&self, position: usize) -> Option<u16> {
        let past_coordinator = self.skip.is_some_and(|s| position >= s);
        self.ranks
            .get(position + usize::from(past_coordinator))
            .copied()
    }
}

impl GroupMember {
    /// The members a tree rekey reaches: the surviving members other than the coordinator.
    /// Joiners get the key in their Welcome, over their pair channel with the coordinator.
    pub(super) fn tree_members(&self) -> Vec<Member> {
        let Some(c) = self.view_change.coordinator.as_ref() else {
            return Vec::new();
        };
        c.survivors
            .iter()
            .filter(|r| **r != self.rank)
            .filter_map(|r| self.member_at(*r))
            .collect()
    }

    pub(super) fn start_key_phase(&mut self, now: Timestamp) {
        let rekey = self
            .view_change
            .coordinator
            .as_ref()
            .is_some_and(|c| c.rekey);
        if !rekey {
            self.send_install(now);
            return;
        }
        let epoch = self
            .group_key
            .as_ref()
            .map_or(0, |k| k.epoch)
            .saturating_add(1);
        let exchanged = self
            .view_change
            .coordinator
            .as_mut()
            .and_then(|c| c.exchange.take());
        let key = match exchanged {
            Some(k) => k,
            None => self.fresh_key(epoch),
        };
        match self.config.rekey_method {
            RekeyMethod::OneMessage => {
                if let Some(c) = self.view_change.coordinator.as_mut() {
                    c.new_key = Some(key);
                    c.phase = Phase::Pairing;
                    c.resend_at = now;
                    c.deadline = now.saturating_add(self.config.flush_timeout);
                }
                self.progress_flush(now);
            }
            RekeyMethod::Lkh { .. } => {
                // A batch needs pair channels only to the joiners (their sealed paths); a
                // reseed, to everyone (member/lkh.rs).
                let joiners_paired = self.view_change.coordinator.as_ref().is_some_and(|c| {
                    c.joiners
                        .iter()
                        .all(|(j, _, _)| self.pairs.pair_key(&j.id).is_some())
                });
                // Many members leaving at once would rekey most of the tree: a reseed then
                // costs less than a batch (`lkh_batch_is_small`). Joiners do not count:
                // their entries go to every member in the Install whichever way it is
                // keyed, so a large batch of joiners makes a large shared Install anyway,
                // which is best sent down the overlay once.
                // (Counted only when a batch is possible at all: otherwise it reseeds.)
                let can_batch = self.lkh_can_batch();
                let small = !can_batch
                    || match (self.view.as_ref(), self.view_change.coordinator.as_ref()) {
                        (Some(view), Some(c)) => {
                            let left = ranks_left_out(view.members.len(), &c.survivors);
                            self.lkh_batch_is_small(
                                left.filter_map(|r| view.members.get(usize::from(r)).map(|m| m.id)),
                            )
                        }
                        _ => true,
                    };
                let batch = can_batch && small && joiners_paired;
                if let Some(c) = self.view_change.coordinator.as_mut() {
                    c.lkh_reseed = !small;
                    c.new_key = Some(key);
                    c.phase = Phase::Pairing;
                    c.resend_at = now;
                    c.deadline = now.saturating_add(self.config.flush_timeout);
                }
                if batch {
                    self.send_install(now);
                } else {
                    self.progress_flush(now);
                }
            }
            RekeyMethod::Tree { .. } => {
                if let Some(c) = self.view_change.coordinator.as_mut() {
                    c.new_key = Some(key);
                    c.phase = Phase::Tree;
                    c.tree_holders.clear();
                    c.resend_at = now;
                    c.deadline = now.saturating_add(self.config.flush_timeout);
                }
                self.progress_flush(now);
            }
        }
    }

    /// The tree order of the tree rekey for `proposal`: the survivors its Flush listed,
    /// by rank, other than its coordinator (the coordinator's `tree_members`, and what a
    /// member flushing for it knows from the Flush). A share names positions in it.
    ///
    /// It is read in place, not built: a member finds its children in O(1) per share, where
    /// building the order cost O(n) for each share every member took.
    fn tree_order(&self, proposal: ViewId) -> Option<TreeOrder<'_>> {
        if let Some(c) = self
            .view_change
            .coordinator
            .as_ref()
            .filter(|c| c.proposal == proposal)
        {
            let skip = c.survivors.iter().position(|r| *r == self.rank);
            return Some(TreeOrder {
                ranks: &c.survivors,
                skip,
            });
        }
        let f = self
            .view_change
            .flushing
            .as_ref()
            .filter(|f| f.proposal == proposal)?;
        Some(TreeOrder {
            ranks: &f.survivors,
            skip: f.survivors.binary_search(&f.coordinator).ok(),
        })
    }

    /// `holders` as runs of their ranks in the current view, at most [`MAX_RUNS`] of them
    /// (past that the rest go unreported: the coordinator then sends them the key again,
    /// which costs a resend, never a wrong holder).
    fn holder_runs(&self, holders: &BTreeSet<MemberId>) -> Vec<(u16, u16)> {
        let Some(view) = self.view.as_ref() else {
            return Vec::new();
        };
        let ranks: Vec<u16> = holders
            .iter()
            .filter_map(|id| view.rank_of(id).map(|r| r as u16))
            .collect();
        let mut runs = ranks_to_runs(&ranks);
        runs.truncate(MAX_RUNS);
        runs
    }

    /// Coordinator: sends the fresh key to its tree children that do not hold it yet.
    pub(super) fn send_tree_shares(&mut self, now: Timestamp) {
        let RekeyMethod::Tree { degree } = self.config.rekey_method else {
            return;
        };
        let members = self.tree_members();
        let Some(c) = self.view_change.coordinator.as_mut() else {
            return;
        };
        c.resend_at = now.saturating_add(interval::flush_resend(&self.config));
        let Some(key) = c.new_key.as_ref() else {
            return;
        };
        let (proposal, epoch, key) = (c.proposal, key.epoch, Zeroizing::new(key.expose().to_vec()));
        let holders = c.tree_holders.clone();
        for (child, below) in split_tree(0, members.len(), degree) {
            let (first, count) = (usize::from(below.0), usize::from(below.1));
            let all_hold = holders.contains(&members[child].id)
                && members[first..first + count]
                    .iter()
                    .all(|m| holders.contains(&m.id));
            if all_hold {
                continue;
            }
            let share = PairMsg::KeyShare {
                proposal,
                key_epoch: epoch,
                key: key.clone(),
                below,
                degree: degree as u16,
            };
            let to = members[child];
            self.send_pair(now, to.addr, Some(to.id), &share);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_key_share(
        &mut self,
        now: Timestamp,
        peer: MemberId,
        addr: SocketAddr,
        proposal: ViewId,
        key_epoch: u64,
        key: Zeroizing<Vec<u8>>,
        below: (u16, u16),
        degree: u16,
    ) {
        // Only the proposal's coordinator or a member of the current view (a tree parent)
        // may hand out keys, and only for a proposal this member is flushing for.
        let peer_rank = self.view.as_ref().and_then(|v| v.rank_of(&peer));
        let expected = self.view_change.flushing.as_ref().is_some_and(|f| {
            f.proposal == proposal
                && (peer == proposal.coordinator
                    || peer_rank.is_some_and(|r| f.survivors.binary_search(&(r as u16)).is_ok()))
        });
        let (first, count) = (usize::from(below.0), usize::from(below.1));
        let children: Option<Vec<(Member, (u16, u16))>> =
            self.tree_order(proposal).and_then(|order| {
                if degree == 0 || first + count > order.len() {
                    return None;
                }
                split_tree(first, count, usize::from(degree))
                    .into_iter()
                    .map(|(child, sub)| Some((self.member_at(order.rank(child)?)?, sub)))
                    .collect()
            });
        let Some(children) =
            children.filter(|_| key.len() == GROUP_KEY_LEN && peer_rank.is_some() && expected)
        else {
            self.counters.count(Drop::Unexpected);
            return;
        };
        if self
            .tree
            .tree_key
            .as_ref()
            .is_some_and(|(p, _)| *p == proposal)
        {
            // A resent share: forward again to children that did not answer, or repeat the
            // acknowledgement.
            match self.tree.tree_wait.as_ref() {
                Some(t) => {
                    let holders = t.holders.clone();
                    for (to, sub) in children {
                        if holders.contains(&to.id) {
                            continue;
                        }
                        let share = PairMsg::KeyShare {
                            proposal,
                            key_epoch,
                            key: key.clone(),
                            below: sub,
                            degree,
                        };
                        self.send_pair(now, to.addr, Some(to.id), &share);
                    }
                }
                None => {
                    if let Some((p, holders)) = self.tree.tree_acked.clone() {
                        if p == proposal {
                            let holders = self.holder_runs(&holders);
                            let ack = PairMsg::KeyAck { proposal, holders };
                            self.send_pair(now, addr, Some(peer), &ack);
                        }
                    }
                }
            }
            return;
        }
        let group_key = GroupKey::new(key_epoch, Secret::from_slice(&key));
        for (to, sub) in &children {
            let share = PairMsg::KeyShare {
                proposal,
                key_epoch,
                key: key.clone(),
                below: *sub,
                degree,
            };
            self.send_pair(now, to.addr, Some(to.id), &share);
        }
        self.tree.tree_key = Some((proposal, group_key));
        let mut holders = BTreeSet::new();
        holders.insert(self.id);
        self.tree.tree_wait = Some(TreeWait {
            proposal,
            parent: addr,
            parent_id: peer,
            children: children.iter().map(|(to, _)| to.id).collect(),
            holders,
            deadline: now.saturating_add(interval::tree_ack_wait(&self.config)),
        });
        self.progress_tree(now, false);
    }

    pub(super) fn on_key_ack(
        &mut self,
        now: Timestamp,
        peer: MemberId,
        proposal: ViewId,
        holders: Vec<(u16, u16)>,
    ) {
        let holders: Vec<MemberId> = runs_to_ranks(&holders)
            .filter_map(|r| self.member_at(r).map(|m| m.id))
            .collect();
        if let Some(c) = self.view_change.coordinator.as_mut() {
            if c.proposal == proposal && c.phase == Phase::Tree {
                c.tree_holders.insert(peer);
                c.tree_holders.extend(holders);
                self.progress_flush(now);
                return;
            }
        }
        if let Some(t) = self.tree.tree_wait.as_mut() {
            if t.proposal == proposal && t.children.contains(&peer) {
                t.holders.insert(peer);
                t.holders.extend(holders);
                self.progress_tree(now, false);
            }
        }
    }

    /// A tree node acknowledges up once all children answered (or at its deadline, with
    /// those that did).
    pub(super) fn progress_tree(&mut self, now: Timestamp, timed_out: bool) {
        let Some(t) = self.tree.tree_wait.as_ref() else {
            return;
        };
        let complete = t.children.iter().all(|c| t.holders.contains(c));
        if complete || timed_out || now >= t.deadline {
            let ack = PairMsg::KeyAck {
                proposal: t.proposal,
                holders: self.holder_runs(&t.holders),
            };
            let (parent, parent_id) = (t.parent, t.parent_id);
            self.tree.tree_acked = Some((t.proposal, t.holders.clone()));
            self.tree.tree_wait = None;
            self.send_pair(now, parent, Some(parent_id), &ack);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{split_tree, TreeOrder};

    #[test]
    fn the_tree_order_skips_the_coordinator_in_place() {
        let ranks = [0u16, 1, 3, 4, 7];
        let read = |skip| {
            let order = TreeOrder {
                ranks: &ranks,
                skip,
            };
            let all: Vec<u16> = (0..order.len()).filter_map(|p| order.rank(p)).collect();
            assert_eq!(order.rank(order.len()), None);
            all
        };
        // The coordinator at rank 3 (index 2 of the list) is left out, the rest keep their
        // order; a coordinator not among the survivors leaves the list as it is.
        assert_eq!(read(Some(2)), vec![0, 1, 4, 7]);
        assert_eq!(read(Some(0)), vec![1, 3, 4, 7]);
        assert_eq!(read(Some(4)), vec![0, 1, 3, 4]);
        assert_eq!(read(None), vec![0, 1, 3, 4, 7]);
    }

    #[test]
    fn a_share_splits_its_positions_into_contiguous_subtrees() {
        assert_eq!(
            split_tree(0, 10, 4),
            vec![(0, (1, 2)), (3, (4, 2)), (6, (7, 1)), (8, (9, 1))]
        );
        assert_eq!(split_tree(5, 2, 4), vec![(5, (6, 0)), (6, (7, 0))]);
        assert!(split_tree(3, 0, 4).is_empty());
        // Every position below a share is reached exactly once, down to the leaves.
        for count in 0..60usize {
            for degree in 1..6usize {
                let mut seen = vec![0u32; count];
                let mut work = vec![(0usize, count)];
                while let Some((first, n)) = work.pop() {
                    for (child, (f, c)) in split_tree(first, n, degree) {
                        seen[child] += 1;
                        assert_eq!(usize::from(f), child + 1);
                        work.push((usize::from(f), usize::from(c)));
                    }
                }
                assert!(
                    seen.iter().all(|s| *s == 1),
                    "count {count} degree {degree}"
                );
            }
        }
    }
}
