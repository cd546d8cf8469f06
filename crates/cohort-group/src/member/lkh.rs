//! The LKH rekey at a member: the coordinator runs a batch on its key tree (or reseeds it)
//! and builds the Install's `KeyDelivery::Lkh`; every member opens its new path from the
//! wraps (or from its sealed copy) and keeps it; the ledger of every tree key it held.
//!
//! Owns: `LkhState` (the tree this member built as coordinator, its own path, the tree
//! key ledger, the last rekey's counts). It may not install anything: `install.rs` calls
//! `lkh_delivery` when it builds an Install and `lkh_install` when it takes one, and
//! installs the key they return; `join.rs` calls `lkh_install` for a joiner's Welcome and
//! `lkh_found` when this member founds a component with a key of its own.
//!
//! Which rekeys are batches: the coordinator holds a tree only if it built it. A batch
//! runs when that tree covers exactly the current view's members and its root is the
//! current group key; otherwise (a coordinator after a takeover, after an Exchange or a
//! merge, after a view change that let members in without a rekey, or on the first LKH
//! rekey of a group) it reseeds: fresh leaf keys for all, each member's whole path sealed
//! under its pair key with the coordinator (n sealed paths of about 40·(depth + 1) bytes:
//! the one-message method's cost, once).

use super::GroupMember;
use crate::config::RekeyMethod;
use crate::id::{Member, MemberId, ViewId};
use crate::keys::GroupKey;
use crate::lkh::{self, LkhRekeyStats, NodeId, Path, Tree, WrapContext};
use crate::wire::{Install, KeyDelivery};
use cohort_crypto::{ct_eq, Secret};
use std::collections::{HashMap, HashSet};

/// The most wraps a batch for its leavers may carry (`batch_wraps`) before the coordinator
/// reseeds instead (`lkh_batch_is_small`): about 14 KB of wraps, one part.
const MAX_BATCH_WRAPS: usize = 256;

/// How many wraps a batch for members leaving from leaves `slots` of a tree of `depth` and
/// `degree` carries at most: each internal node above a leaver gets a fresh key, wrapped
/// under each of its children's keys, and nodes shared by several leavers count once.
/// Stops counting past [`MAX_BATCH_WRAPS`].
fn batch_wraps(slots: impl IntoIterator<Item = u32>, depth: u8, degree: usize) -> usize {
    let mut replaced = HashSet::new();
    for slot in slots {
        for level in 1..=depth {
            replaced.insert(NodeId::ancestor(slot, level, degree));
        }
        if replaced.len().saturating_mul(degree) > MAX_BATCH_WRAPS {
            break;
        }
    }
    replaced.len().saturating_mul(degree)
}

/// The LKH side of a member.
#[derive(Default)]
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct LkhState {
    /// The key tree this member built when it last coordinated an LKH rekey, and the view
    /// it was built for (whose members it holds exactly).
    tree: Option<(ViewId, Tree)>,
    /// This member's keys, leaf to root.
    path: Option<Path>,
    /// Every tree key version this member held: (node, version, fingerprint).
    ledger: Vec<(NodeId, u64, [u8; 8])>,
    /// The same entries as a set, so that recording one is not a scan of the ledger (a
    /// coordinator that reseeds 10,000 members records about 13,000 at once).
    ledger_set: HashSet<(NodeId, u64, [u8; 8])>,
    /// The counts of the last LKH rekey this member coordinated.
    last: Option<LkhRekeyStats>,
}

impl GroupMember {
    /// Fingerprints of every tree key version this member ever held (node, version =
    /// the key epoch that created it, first 8 bytes of a labelled SHA-256): for checkers
    /// of who learned which key. A coordinator holds every key of the tree it built.
    #[doc(hidden)]
    pub fn tree_key_ledger(&self) -> &[(NodeId, u64, [u8; 8])] {
        &self.lkh.ledger
    }

    /// Fingerprints of the keys on this member's current path, leaf to root (node,
    /// version, fingerprint as in [`GroupMember::tree_key_ledger`]).
    #[doc(hidden)]
    pub fn tree_path(&self) -> Vec<(NodeId, u64, [u8; 8])> {
        self.lkh
            .path
            .iter()
            .flat_map(|p| p.nodes())
            .map(|(n, v, k)| (n, v, lkh::fingerprint(&self.provider, k.expose())))
            .collect()
    }

    /// What the last LKH rekey this member coordinated cost: wraps, their bytes, sealed
    /// paths, whether it reseeded. For benchmarks.
    pub fn lkh_last_rekey(&self) -> Option<&LkhRekeyStats> {
        self.lkh.last.as_ref()
    }

    fn lkh_degree(&self) -> usize {
        match self.config.rekey_method {
            RekeyMethod::Lkh { degree } => degree,
            _ => RekeyMethod::LKH_DEFAULT_DEGREE,
        }
    }

    /// Whether the next LKH rekey can be a batch: this member's tree covers exactly the
    /// current view and its root is the current group key.
    pub(super) fn lkh_can_batch(&self) -> bool {
        let (Some(tree), Some(view), Some(key)) = (
            self.lkh.tree.as_ref(),
            self.view.as_ref(),
            self.group_key.as_ref(),
        ) else {
            return false;
        };
        let (built_for, tree) = tree;
        // The tree holds exactly the members of the view it was built for.
        *built_for == view.id
            && tree.degree() == self.lkh_degree()
            && tree.len() == view.members.len()
            && tree
                .root()
                .is_some_and(|(v, k)| *v == key.epoch && ct_eq(k.expose(), key.expose()))
    }

    /// KDC mode: the digest every wrap and sealed path binds (the Install with its LKH
    /// delivery emptied, so it can be computed before the wraps exist). Empty with
    /// identity keys, whose signature covers the Install with its wraps.
    fn lkh_bind(&self, install: &Install) -> Vec<u8> {
        if self.identity.is_some() {
            return Vec::new();
        }
        let mut bare = install.clone();
        bare.key = KeyDelivery::Lkh(Box::default());
        self.install_bind(&bare)
    }

    /// Whether a batch for `leavers` is worth it on this member's tree: one that rekeys
    /// most of the tree (many members leaving at once, as when part of the group is cut
    /// off) carries wraps that every member must receive, since the Install is shared and
    /// goes down the overlay, while a reseed sends each member only its own path, sealed.
    /// At 10,000 members a batch for an eighth of the group cut off carried about 460 KB of
    /// wraps, against a few hundred bytes a member for a reseed. A batch is kept up to
    /// [`MAX_BATCH_WRAPS`] (about one part; one leave at 10,000 is 26 wraps). True without a
    /// tree (the rekey reseeds then anyway).
    pub(super) fn lkh_batch_is_small(&self, leavers: impl Iterator<Item = MemberId>) -> bool {
        let Some((_, tree)) = self.lkh.tree.as_ref() else {
            return true;
        };
        let slots = leavers.filter_map(|id| tree.slot_of(&id));
        batch_wraps(slots, tree.depth(), tree.degree()) <= MAX_BATCH_WRAPS
    }

    /// Coordinator: the LKH delivery of `provisional` (the Install without its key),
    /// whose new group key is `key`, for the new view's `members`: a batch on the tree,
    /// or a reseed (when the tree cannot batch, or when `reseed` asks for one because the
    /// batch would be large). Joiners (everyone, on a reseed) get their whole path sealed
    /// under their pair key. The tree is updated at once: if this Install is never
    /// installed, the next rekey finds the tree does not match the view and reseeds.
    pub(super) fn lkh_delivery(
        &mut self,
        provisional: &Install,
        key: &GroupKey,
        members: &[Member],
        reseed: bool,
    ) -> KeyDelivery {
        let bind = self.lkh_bind(provisional);
        let group = self.config.group.clone();
        let ctx = WrapContext {
            group: &group,
            view: provisional.view,
            epoch: key.epoch,
            bind: &bind,
        };
        // Every member's id, for a reseed or a batch from scratch only: a batch on the
        // tree takes the change from the Install (no list of 10,000 ids to build).
        let ids = || members.iter().map(|m| m.id).collect::<Vec<_>>();
        let root = Secret::from_slice(key.expose());
        let reseed = reseed || !self.lkh_can_batch();
        // A merge Install dissolves the component: nobody keeps its keys (members open
        // their wrap only to authenticate it in KDC mode), so it runs on a copy.
        let merging = provisional.merge_into.is_some();
        let kept = match (reseed, merging) {
            (true, _) => None,
            (false, true) => self.lkh.tree.as_ref().map(|(_, t)| t.clone()),
            (false, false) => self.lkh.tree.take().map(|(_, t)| t),
        };
        let mut tree = kept.unwrap_or_else(|| Tree::new(self.lkh_degree()));
        // A batch on the tree of the view the Install changes takes the change from the
        // Install (who left, who joined): no comparison of every member with the tree.
        let change = self
            .view
            .as_ref()
            .filter(|v| v.id == provisional.base)
            .map(|v| {
                let left: Vec<_> = provisional
                    .left
                    .iter()
                    .filter_map(|r| v.members.get(usize::from(*r)).map(|m| m.id))
                    .collect();
                let joined: Vec<_> = provisional.joined.iter().map(|j| j.member.id).collect();
                (left, joined)
            });
        let result = match (reseed, change) {
            (true, _) => tree.reseed(&self.provider, &mut self.rng, &ctx, &ids(), &root),
            (false, Some((left, joined))) => {
                tree.batch_change(&self.provider, &mut self.rng, &ctx, &left, &joined, &root)
            }
            (false, None) => tree.batch(&self.provider, &mut self.rng, &ctx, &ids(), &root),
        };
        let Ok(batch) = result else {
            // The backend failed (or the tree outgrew MAX_DEPTH): no member opens this
            // Install, and the next rekey reseeds.
            return KeyDelivery::Lkh(Box::default());
        };
        let mut delivery = batch.delivery;
        // Ranks by id, built only when someone gets a sealed copy (a reseed: everyone).
        let ranks: HashMap<_, usize> = if batch.copies.is_empty() {
            HashMap::new()
        } else {
            members.iter().enumerate().map(|(r, m)| (m.id, r)).collect()
        };
        for m in &batch.copies {
            if *m == self.id {
                continue;
            }
            let Some(&rank) = ranks.get(m) else {
                continue;
            };
            let (Some(path), Some(pk)) = (tree.path_of(m), self.pairs.pair_key(m)) else {
                continue;
            };
            if let Ok(sealed) = path.seal(&self.provider, &ctx, pk.expose(), rank as u16) {
                delivery.paths.push((rank as u16, sealed));
            }
        }
        if merging {
            return KeyDelivery::Lkh(Box::new(delivery));
        }
        let (wrap_bytes, path_bytes) = delivery.wire_len();
        self.lkh.last = Some(LkhRekeyStats {
            epoch: key.epoch,
            members: members.len(),
            depth: delivery.depth,
            reseed,
            wraps: delivery.wraps.len(),
            wrap_bytes,
            paths: delivery.paths.len(),
            path_bytes,
            keys_created: batch.created.len(),
        });
        for entry in batch.created {
            self.lkh_record(entry);
        }
        self.lkh.path = tree.path_of(&self.id);
        self.lkh.tree = Some((provisional.view, tree));
        KeyDelivery::Lkh(Box::new(delivery))
    }

    /// A member that founds a component (at start, or alone again after leaving one)
    /// draws its group key itself, outside any rekey: its path becomes a one-member tree's
    /// whose root is that key. Invariant: with the LKH method, a member's path (if any)
    /// has the current group key as its root. A founder that kept the path of the
    /// component it left broke it: if another component took its key through an Exchange
    /// and it merged in (a joiner that holds the key: no rekey), it held a stale root while
    /// the others held the new one (seed 126 of `lkh_random_faults_crashes_and_an_adversary`).
    /// The tree is not kept: the founder's first rekey still reseeds.
    pub(super) fn lkh_found(&mut self, view: ViewId, key: &GroupKey) {
        self.lkh.tree = None;
        self.lkh.path = None;
        if !matches!(self.config.rekey_method, RekeyMethod::Lkh { .. }) {
            return;
        }
        let group = self.config.group.clone();
        let ctx = WrapContext {
            group: &group,
            view,
            epoch: key.epoch,
            bind: &[],
        };
        let root = Secret::from_slice(key.expose());
        let mut tree = Tree::new(self.lkh_degree());
        // The backend failed: no path, and the next rekey reseeds as it would anyway.
        let Ok(batch) = tree.reseed(&self.provider, &mut self.rng, &ctx, &[self.id], &root) else {
            return;
        };
        for entry in batch.created {
            self.lkh_record(entry);
        }
        self.lkh.path = tree.path_of(&self.id);
    }

    fn lkh_record(&mut self, entry: (NodeId, u64, [u8; 8])) {
        if self.lkh.ledger_set.insert(entry) {
            self.lkh.ledger.push(entry);
        }
    }

    /// This member's new path and the group key from an LKH Install: its sealed copy if
    /// the Install carries one for its rank, else its path advanced through the wraps.
    /// `rank` is this member's rank in the new view. `None` if it does not open (wrong or
    /// tampered wraps, a stale path, no copy).
    pub(super) fn lkh_open(&self, install: &Install, rank: u16) -> Option<(GroupKey, Path)> {
        let KeyDelivery::Lkh(d) = &install.key else {
            return None;
        };
        let bind = self.lkh_bind(install);
        let ctx = WrapContext {
            group: &self.config.group,
            view: install.view,
            epoch: install.key_epoch,
            bind: &bind,
        };
        let path = match d.paths.iter().find(|(r, _)| *r == rank) {
            Some((_, sealed)) => {
                let pk = self.pairs.pair_key(&install.view.coordinator)?;
                Path::open(
                    &self.provider,
                    &ctx,
                    pk.expose(),
                    rank,
                    d.degree,
                    d.depth,
                    sealed,
                )?
            }
            None => self.lkh.path.as_ref()?.advance(&self.provider, &ctx, d)?,
        };
        let (_, root) = path.root()?;
        let key = GroupKey::new(install.key_epoch, Secret::from_slice(root.expose()));
        Some((key, path))
    }

    /// Takes an LKH Install: opens this member's path, keeps it, records its keys in the
    /// ledger, and returns the group key (the root). `rank` is this member's rank in the
    /// new view.
    pub(super) fn lkh_install(&mut self, install: &Install, rank: u16) -> Option<GroupKey> {
        let (key, path) = self.lkh_open(install, rank)?;
        let entries: Vec<_> = path
            .nodes()
            .map(|(n, v, k)| (n, v, lkh::fingerprint(&self.provider, k.expose())))
            .collect();
        for e in entries {
            self.lkh_record(e);
        }
        self.lkh.path = Some(path);
        Some(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_counts_each_replaced_node_once() {
        // Degree 4, depth 7 (up to 16,384 leaves): one leaver replaces its 7 ancestors.
        assert_eq!(batch_wraps([5], 7, 4), 28);
        // Two leaves under the same parent share all 7 ancestors.
        assert_eq!(batch_wraps([4, 5], 7, 4), 28);
        // Leaves 0 and 4 part at level 1 and meet from level 2 up: 8 nodes.
        assert_eq!(batch_wraps([0, 4], 7, 4), 32);
        // No leaver, no wrap.
        assert_eq!(batch_wraps([], 7, 4), 0);
        // Leavers spread over the tree replace most of it; the count stops past the bound.
        let spread = batch_wraps((0..1_250).map(|k| k * 8), 7, 4);
        assert!(spread > MAX_BATCH_WRAPS && spread <= MAX_BATCH_WRAPS + 4 * 7 + 4);
    }
}
