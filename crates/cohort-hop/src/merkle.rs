//! The Merkle trees of ALPHA-M: one root per round authenticates up to [`MAX_LEAVES`]
//! messages, and each message travels with the path that links its leaf to the root.
//!
//! The tree has the shape of RFC 6962's Merkle tree hash over `k` leaves: a single leaf is its
//! own root; for `k > 1` the first `2^m` leaves (the largest power of two strictly below `k`)
//! form the left subtree and the rest the right one, and a node is
//! [`merkle_node`]`(left, right)`. Leaves are given already hashed ([`merkle_leaf`] of each
//! message, computed by the caller), and leaves and nodes are hashed under different keys.
//!
//! Built bottom up, the same tree pairs the nodes of each level from the left and lifts an odd
//! last node unchanged to the level above. That is how [`MerkleTree::new`] builds it (`k - 1`
//! hashes, every node kept), so [`MerkleTree::path`] only copies siblings, and how
//! [`root_from_path`] walks it (one hash per path element, at most `log2 k`).
//!
//! The root does not commit to the number of leaves: trees of different sizes can give a leaf
//! the same path shape (leaf 0 of 3 and of 4 leaves, say), so the signer must authenticate
//! the count together with the root (ALPHA-M's S1 MAC covers both).
//!
//! [`merkle_leaf`]: crate::crypto::merkle_leaf

use core::fmt;

use cohort_crypto::CryptoProvider;

use crate::crypto::{merkle_node, Element};

/// The most leaves (messages) one tree, and so one ALPHA-M round, may hold; a path then has at
/// most 10 elements.
pub const MAX_LEAVES: usize = 1024;

/// A tree built once per round by the signer, who then hands out one path per message.
#[derive(Clone)]
pub struct MerkleTree {
    /// `levels[0]` are the leaves; each level pairs the one below, lifting an odd last node;
    /// the last level is the root alone.
    levels: Vec<Vec<Element>>,
    root: Element,
}

impl MerkleTree {
    /// Builds the tree over `leaves` (`k - 1` hashes), or `None` if there are none or more
    /// than [`MAX_LEAVES`].
    pub fn new(provider: &CryptoProvider, leaves: &[Element]) -> Option<MerkleTree> {
        if leaves.is_empty() || leaves.len() > MAX_LEAVES {
            return None;
        }
        let mut levels = vec![leaves.to_vec()];
        let mut below = leaves;
        let mut root = leaves[0];
        while below.len() > 1 {
            let pairs = below.chunks_exact(2);
            let odd = pairs.remainder().first().copied();
            let mut level: Vec<Element> = pairs
                .map(|pair| merkle_node(provider, &pair[0], &pair[1]))
                .collect();
            level.extend(odd);
            root = level[0];
            levels.push(level);
            below = &levels[levels.len() - 1];
        }
        Some(MerkleTree { levels, root })
    }

    /// The root, to be MACed (with the leaf count) in the round's S1.
    pub fn root(&self) -> Element {
        self.root
    }

    /// The number of leaves.
    pub fn len(&self) -> usize {
        self.levels[0].len()
    }

    /// Always false: a tree has at least one leaf.
    pub fn is_empty(&self) -> bool {
        self.levels[0].is_empty()
    }

    /// The path of leaf `index`: the sibling of each node from the leaf up (none where a node
    /// is lifted without a sibling), [`path_len`] elements; `None` if there is no such leaf.
    /// Hashes nothing.
    pub fn path(&self, index: usize) -> Option<Vec<Element>> {
        if index >= self.len() {
            return None;
        }
        let mut path = Vec::with_capacity(self.levels.len() - 1);
        let mut position = index;
        for level in &self.levels[..self.levels.len() - 1] {
            if let Some(sibling) = level.get(position ^ 1) {
                path.push(*sibling);
            }
            position /= 2;
        }
        Some(path)
    }
}

/// Prints the size and the root, not every node.
impl fmt::Debug for MerkleTree {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MerkleTree")
            .field("leaves", &self.len())
            .field("root", &self.root)
            .finish()
    }
}

/// The nodes of one round's tree that a verifier has authenticated so far, so that each
/// later message of the round is hashed only up to the first node already known.
///
/// It starts with the root alone (authenticated by the round's MAC). Every path that checks
/// out adds the nodes it computed and the siblings it carried, all of which are then
/// authenticated too. A known node's ancestors and the siblings of all of them are known as
/// well (each check records node and sibling level by level, and stops at a known node), so
/// the check of a later message compares the rest of its path against known siblings
/// instead of hashing: [`check`](Self::check) gives the answer `root_from_path(..) ==
/// Some(root)` would give (up to a hash collision), with about one node hash per message
/// over a whole round instead of `log2 k`.
///
/// Only the levels at most [`KEPT_WIDTH`] nodes wide are kept (at most 127 nodes, about
/// 2 KiB a round whatever the batch): a tree of up to 64 leaves is kept whole, and a message
/// of a larger one hashes its way up to the first kept level, then as above.
///
/// Nodes are compared with `==`, not in constant time: every node of the tree travels in
/// clear in some S2's path, so none is a secret (the round's MAC, which is, is checked in
/// constant time by the caller).
#[derive(Clone)]
pub struct VerifiedNodes {
    count: usize,
    /// The lowest level kept (level 0 are the leaves, the last level is the root).
    lowest: usize,
    /// Where each kept level starts in `nodes` (0 for the levels below `lowest`).
    starts: Vec<usize>,
    nodes: Vec<Option<Element>>,
}

/// The deepest a path goes (`log2` of [`MAX_LEAVES`]).
const MAX_DEPTH: usize = 10;

/// The widest level of a tree that [`VerifiedNodes`] keeps.
pub const KEPT_WIDTH: usize = 64;

impl VerifiedNodes {
    /// A tree of `count` leaves whose root is `root`, already authenticated; `None` if
    /// `count` is 0 or above [`MAX_LEAVES`].
    pub fn new(count: usize, root: Element) -> Option<VerifiedNodes> {
        if count == 0 || count > MAX_LEAVES {
            return None;
        }
        let mut starts = Vec::with_capacity(MAX_DEPTH + 1);
        let (mut width, mut total, mut lowest) = (count, 0, 0);
        loop {
            starts.push(total);
            if width > KEPT_WIDTH {
                lowest += 1;
            } else {
                total += width;
            }
            if width == 1 {
                break;
            }
            width = width.div_ceil(2);
        }
        let mut nodes = vec![None; total];
        nodes[total - 1] = Some(root);
        Some(VerifiedNodes {
            count,
            lowest,
            starts,
            nodes,
        })
    }

    /// The authenticated root.
    pub fn root(&self) -> Option<Element> {
        self.nodes.last().copied().flatten()
    }

    /// Whether `leaf` is leaf `index` of this tree, by `path` (as from
    /// [`MerkleTree::path`]); on success every node the check computed or was given is
    /// remembered. A path of the wrong length, or one that differs from a known sibling
    /// anywhere, is refused, as [`root_from_path`] would refuse it.
    pub fn check(
        &mut self,
        provider: &CryptoProvider,
        leaf: &Element,
        index: usize,
        path: &[Element],
    ) -> bool {
        if path_len(index, self.count) != Some(path.len()) {
            return false;
        }
        // What this check learns, recorded only if it succeeds: (slot, node), at most a node
        // and its sibling per level.
        let mut learned = [(0usize, [0u8; crate::crypto::ELEMENT_LEN]); 2 * MAX_DEPTH];
        let mut n = 0;
        let (mut node, mut position, mut width, mut level) = (*leaf, index, self.count, 0);
        let mut siblings = path.iter();
        loop {
            let kept = level >= self.lowest;
            let slot = self.starts[level] + position;
            if let Some(known) = self.nodes.get(slot).copied().flatten().filter(|_| kept) {
                if known != node || !self.known_siblings(position, width, level, siblings) {
                    return false;
                }
                for &(slot, value) in &learned[..n] {
                    self.nodes[slot] = Some(value);
                }
                return true;
            }
            // The root is always known, so an unknown node has a level above it.
            if kept {
                learned[n] = (slot, node);
                n += 1;
            }
            if (position ^ 1) < width {
                let Some(sibling) = siblings.next() else {
                    return false;
                };
                if kept {
                    learned[n] = (self.starts[level] + (position ^ 1), *sibling);
                    n += 1;
                }
                node = if position % 2 == 1 {
                    merkle_node(provider, sibling, &node)
                } else {
                    merkle_node(provider, &node, sibling)
                };
            }
            position /= 2;
            width = width.div_ceil(2);
            level += 1;
        }
    }

    /// Whether the rest of a path, from the node at `position` of `level` (a level `width`
    /// wide) up, is exactly the known siblings of that node and its ancestors.
    fn known_siblings<'a>(
        &self,
        mut position: usize,
        mut width: usize,
        mut level: usize,
        mut rest: impl Iterator<Item = &'a Element>,
    ) -> bool {
        while width > 1 {
            if (position ^ 1) < width {
                let known = self.nodes[self.starts[level] + (position ^ 1)];
                match (rest.next(), known) {
                    (Some(given), Some(known)) if *given == known => {}
                    _ => return false,
                }
            }
            position /= 2;
            width = width.div_ceil(2);
            level += 1;
        }
        rest.next().is_none()
    }
}

/// Prints the size and how many nodes are known.
impl fmt::Debug for VerifiedNodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerifiedNodes")
            .field("leaves", &self.count)
            .field("known", &self.nodes.iter().flatten().count())
            .finish()
    }
}

/// The number of path elements for leaf `index` of a tree of `count` leaves (0 if `count` is
/// 1); `None` if `index >= count`, `count == 0` or `count > MAX_LEAVES`.
pub fn path_len(index: usize, count: usize) -> Option<usize> {
    let mut len = 0;
    walk(index, count, |has_sibling, _| {
        len += usize::from(has_sibling);
        true
    })?;
    Some(len)
}

/// Recomputes the root from a leaf and its path (as from [`MerkleTree::path`]); `None` if
/// `index` and `count` are out of range or the path's length is wrong for them.
///
/// A matching root proves the leaf is at `index` of a tree of `count` leaves only if `count`
/// is authenticated with the root (see the module documentation).
pub fn root_from_path(
    provider: &CryptoProvider,
    leaf: &Element,
    index: usize,
    count: usize,
    path: &[Element],
) -> Option<Element> {
    if path.len() != path_len(index, count)? {
        return None;
    }
    let mut node = *leaf;
    let mut siblings = path.iter();
    walk(index, count, |has_sibling, is_right| {
        if !has_sibling {
            return true;
        }
        let Some(sibling) = siblings.next() else {
            return false;
        };
        node = if is_right {
            merkle_node(provider, sibling, &node)
        } else {
            merkle_node(provider, &node, sibling)
        };
        true
    })?;
    Some(node)
}

/// Walks from leaf `index` of `count` up to the root, calling `step(has_sibling, is_right)` at
/// each level below the root (`is_right`: the node is its parent's right child). Stops with
/// `None` if `step` returns false or `(index, count)` is out of range.
fn walk(index: usize, count: usize, mut step: impl FnMut(bool, bool) -> bool) -> Option<()> {
    if count == 0 || count > MAX_LEAVES || index >= count {
        return None;
    }
    let (mut position, mut width) = (index, count);
    while width > 1 {
        if !step((position ^ 1) < width, position % 2 == 1) {
            return None;
        }
        position /= 2;
        width = width.div_ceil(2);
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::merkle_leaf;
    use cohort_crypto::KeyedHash;
    use proptest::prelude::*;
    use std::cell::Cell;

    fn provider() -> CryptoProvider {
        CryptoProvider::default_provider()
    }

    fn leaves(k: usize) -> Vec<Element> {
        let p = provider();
        (0..k)
            .map(|i| merkle_leaf(&p, format!("message {i}").as_bytes()))
            .collect()
    }

    /// RFC 6962's recursive definition, as written there.
    fn reference_root(p: &CryptoProvider, leaves: &[Element]) -> Element {
        if leaves.len() == 1 {
            return leaves[0];
        }
        // The largest power of two strictly below the number of leaves.
        let split = 1usize << (usize::BITS - 1 - (leaves.len() - 1).leading_zeros());
        let left = reference_root(p, &leaves[..split]);
        let right = reference_root(p, &leaves[split..]);
        merkle_node(p, &left, &right)
    }

    /// Checks every leaf of a tree of `k`; returns the tree.
    fn check_tree(k: usize) -> MerkleTree {
        let p = provider();
        let leaves = leaves(k);
        let tree = MerkleTree::new(&p, &leaves).unwrap();
        assert_eq!(tree.len(), k);
        assert!(!tree.is_empty());
        assert_eq!(tree.root(), reference_root(&p, &leaves), "k={k}");
        for (i, leaf) in leaves.iter().enumerate() {
            let path = tree.path(i).unwrap();
            assert_eq!(Some(path.len()), path_len(i, k));
            assert!(path.len() <= 10);
            assert_eq!(
                root_from_path(&p, leaf, i, k, &path),
                Some(tree.root()),
                "k={k} i={i}"
            );
        }
        assert_eq!(tree.path(k), None);
        tree
    }

    #[test]
    fn every_leaf_round_trips() {
        for k in (1..=70).chain([127, 128, 129, 1000, 1023, MAX_LEAVES]) {
            check_tree(k);
        }
    }

    #[test]
    fn small_trees_have_rfc6962_shapes() {
        let p = provider();
        let l = leaves(5);
        let node = |a: &Element, b: &Element| merkle_node(&p, a, b);
        let t = |k: usize| MerkleTree::new(&p, &l[..k]).unwrap().root();
        assert_eq!(t(1), l[0]);
        assert_eq!(t(2), node(&l[0], &l[1]));
        assert_eq!(t(3), node(&node(&l[0], &l[1]), &l[2]));
        let four = node(&node(&l[0], &l[1]), &node(&l[2], &l[3]));
        assert_eq!(t(4), four);
        assert_eq!(t(5), node(&four, &l[4]));
        assert_eq!(MerkleTree::new(&p, &l[..1]).unwrap().path(0), Some(vec![]));
        assert_eq!(
            MerkleTree::new(&p, &l[..5]).unwrap().path(4),
            Some(vec![four])
        );
    }

    #[test]
    fn sizes_out_of_range_are_refused() {
        let p = provider();
        assert!(MerkleTree::new(&p, &[]).is_none());
        assert!(MerkleTree::new(&p, &leaves(MAX_LEAVES + 1)).is_none());
        assert_eq!(path_len(0, 0), None);
        assert_eq!(path_len(3, 3), None);
        assert_eq!(path_len(0, MAX_LEAVES + 1), None);
        assert_eq!(path_len(0, 1), Some(0));
        assert_eq!(path_len(4, 5), Some(1));
        assert_eq!(path_len(0, 5), Some(3));
        assert_eq!(path_len(MAX_LEAVES - 1, MAX_LEAVES), Some(10));
        let leaf = leaves(1)[0];
        assert_eq!(root_from_path(&p, &leaf, 0, 0, &[]), None);
        assert_eq!(root_from_path(&p, &leaf, 1, 1, &[]), None);
        assert_eq!(root_from_path(&p, &leaf, 0, 1, &[]), Some(leaf));
    }

    #[test]
    fn wrong_path_lengths_are_refused() {
        let p = provider();
        let k = 37;
        let leaves = leaves(k);
        let tree = MerkleTree::new(&p, &leaves).unwrap();
        for i in 0..k {
            let path = tree.path(i).unwrap();
            let mut longer = path.clone();
            longer.push(leaves[0]);
            assert_eq!(root_from_path(&p, &leaves[i], i, k, &longer), None);
            assert_eq!(root_from_path(&p, &leaves[i], i, k, &path[1..]), None);
            assert_eq!(root_from_path(&p, &leaves[i], i, k, &[]), None);
        }
    }

    /// The sequence of (has sibling, is right) from a leaf to the root.
    fn shape(index: usize, count: usize) -> Option<Vec<(bool, bool)>> {
        let mut shape = Vec::new();
        walk(index, count, |s, r| {
            shape.push((s, r));
            true
        })?;
        Some(shape)
    }

    /// Flips every bit of the leaf, of each path element, of the index and of the count.
    fn tampering_fails(k: usize) {
        let p = provider();
        let leaves = leaves(k);
        let tree = MerkleTree::new(&p, &leaves).unwrap();
        let root = tree.root();
        for (i, leaf) in leaves.iter().enumerate() {
            let path = tree.path(i).unwrap();
            for bit in 0..128 {
                let mut bad_leaf = *leaf;
                bad_leaf[bit / 8] ^= 1 << (bit % 8);
                assert_ne!(root_from_path(&p, &bad_leaf, i, k, &path), Some(root));
                for e in 0..path.len() {
                    let mut bad = path.clone();
                    bad[e][bit / 8] ^= 1 << (bit % 8);
                    assert_ne!(root_from_path(&p, leaf, i, k, &bad), Some(root));
                }
            }
            // Higher bits put index and count beyond MAX_LEAVES.
            for bit in 0..12 {
                let other = i ^ (1 << bit);
                assert_ne!(
                    root_from_path(&p, leaf, other, k, &path),
                    Some(root),
                    "k={k} i={i} other={other}"
                );
                // The count is not committed to by the root alone: only where the path
                // keeps its shape does the same root come out.
                let count = k ^ (1 << bit);
                let got = root_from_path(&p, leaf, i, count, &path);
                if shape(i, count) == shape(i, k) {
                    assert_eq!(got, Some(root));
                } else {
                    assert_ne!(got, Some(root), "k={k} i={i} count={count}");
                }
            }
        }
    }

    #[test]
    fn a_flipped_bit_anywhere_fails() {
        for k in [1, 2, 3, 5, 8, 13, 33] {
            tampering_fails(k);
        }
    }

    thread_local! {
        static HASHES: Cell<u64> = const { Cell::new(0) };
    }

    /// The default keyed BLAKE3, counting calls on this thread.
    struct Counting;

    impl KeyedHash for Counting {
        fn hash(&self, key: &[u8; 32], parts: &[&[u8]], out: &mut [u8]) {
            HASHES.with(|h| h.set(h.get() + 1));
            provider().keyed_blake3.hash(key, parts, out);
        }
    }

    static COUNTING: Counting = Counting;

    #[test]
    fn building_costs_k_minus_1_hashes_and_paths_none() {
        let p = CryptoProvider {
            keyed_blake3: &COUNTING,
            ..provider()
        };
        for k in [1, 2, 3, 70, 513, MAX_LEAVES] {
            let leaves = leaves(k);
            HASHES.with(|h| h.set(0));
            let tree = MerkleTree::new(&p, &leaves).unwrap();
            assert_eq!(HASHES.with(Cell::get), k as u64 - 1);
            for i in 0..k {
                tree.path(i).unwrap();
            }
            assert_eq!(HASHES.with(Cell::get), k as u64 - 1);
            let path = tree.path(k - 1).unwrap();
            root_from_path(&p, &leaves[k - 1], k - 1, k, &path).unwrap();
            assert_eq!(HASHES.with(Cell::get), k as u64 - 1 + path.len() as u64);
        }
    }

    #[test]
    fn known_nodes_hash_each_kept_node_once() {
        let p = CryptoProvider {
            keyed_blake3: &COUNTING,
            ..provider()
        };
        // (leaves, levels below the kept ones, nodes kept)
        for (k, unkept, kept) in [
            (1, 0, 1),
            (2, 0, 3),
            (3, 0, 6),
            (32, 0, 63),
            (33, 0, 70),
            (64, 0, 127),
            (65, 1, 70),
            (70, 1, 73),
            (MAX_LEAVES, 4, 127),
        ] {
            let leaves = leaves(k);
            let tree = MerkleTree::new(&p, &leaves).unwrap();
            let mut known = VerifiedNodes::new(k, tree.root()).unwrap();
            assert_eq!(known.nodes.len(), kept, "k={k}");
            HASHES.with(|h| h.set(0));
            // Out of order, as datagrams may come.
            for i in (0..k).rev().step_by(2).chain((0..k).step_by(2).skip(k % 2)) {
                let path = tree.path(i).unwrap();
                assert!(known.check(&p, &leaves[i], i, &path), "k={k} i={i}");
            }
            // Each kept inner node is computed once at most, and each message hashes its
            // way up to the kept levels; a full walk per leaf would cost k * log2 k.
            let most = (kept - 1 + unkept * k) as u64;
            assert!(HASHES.with(Cell::get) <= most, "k={k}");
            assert_eq!(known.root(), Some(tree.root()));
        }
    }

    /// Checks every leaf of a tree of `k` in a shuffled order, each after a tampered try,
    /// and compares every answer with a full walk to the root.
    fn known_nodes_agree_with_the_full_walk(k: usize, seed: u64, flip: usize) {
        let p = provider();
        let leaves = leaves(k);
        let tree = MerkleTree::new(&p, &leaves).unwrap();
        let root = tree.root();
        let mut known = VerifiedNodes::new(k, root).unwrap();
        let mut order: Vec<usize> = (0..k).collect();
        let mut x = seed | 1;
        for i in (1..k).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
        for &i in &order {
            let path = tree.path(i).unwrap();
            let mut tries = vec![(leaves[i], i, path.clone())];
            let mut leaf = leaves[i];
            leaf[flip / 8] ^= 1 << (flip % 8);
            tries.push((leaf, i, path.clone()));
            for e in 0..path.len() {
                let mut bad = path.clone();
                bad[e][flip / 8] ^= 1 << (flip % 8);
                tries.push((leaves[i], i, bad));
            }
            if !path.is_empty() {
                tries.push((leaves[i], i, path[..path.len() - 1].to_vec()));
            }
            if (i ^ 1) < k {
                tries.push((leaves[i ^ 1], i ^ 1, path.clone()));
            }
            tries.push((leaves[i], i, [path.clone(), vec![root]].concat()));
            // The honest try last, so the tampered ones meet the state before it.
            tries.rotate_left(1);
            for (leaf, index, path) in tries {
                let full = index < k && root_from_path(&p, &leaf, index, k, &path) == Some(root);
                assert_eq!(
                    known.check(&p, &leaf, index, &path),
                    full,
                    "k={k} index={index} (leaf {i}) seed={seed}"
                );
            }
        }
        assert_eq!(
            known.nodes.iter().filter(|n| n.is_some()).count(),
            known.nodes.len(),
            "every kept node is known once every leaf checked out"
        );
    }

    #[test]
    fn known_nodes_agree_with_the_full_walk_on_small_trees() {
        for k in 1..=40 {
            for seed in 0..4 {
                known_nodes_agree_with_the_full_walk(k, seed, (k * 7 + seed as usize) % 128);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn known_nodes_agree_with_the_full_walk_on_random_trees(
            k in 1usize..=300,
            seed in any::<u64>(),
            flip in 0usize..128,
        ) {
            known_nodes_agree_with_the_full_walk(k, seed, flip);
        }

        #[test]
        fn random_trees_round_trip(
            leaves in proptest::collection::vec(any::<Element>(), 1..=MAX_LEAVES),
            pick in any::<usize>(),
            flip in 0usize..128,
        ) {
            let p = provider();
            let k = leaves.len();
            let tree = MerkleTree::new(&p, &leaves).unwrap();
            prop_assert_eq!(tree.root(), reference_root(&p, &leaves));
            let i = pick % k;
            let path = tree.path(i).unwrap();
            prop_assert_eq!(Some(path.len()), path_len(i, k));
            prop_assert_eq!(root_from_path(&p, &leaves[i], i, k, &path), Some(tree.root()));
            let mut leaf = leaves[i];
            leaf[flip / 8] ^= 1 << (flip % 8);
            prop_assert_ne!(root_from_path(&p, &leaf, i, k, &path), Some(tree.root()));
            if !path.is_empty() {
                let mut bad = path.clone();
                let e = pick % bad.len();
                bad[e][flip / 8] ^= 1 << (flip % 8);
                prop_assert_ne!(root_from_path(&p, &leaves[i], i, k, &bad), Some(tree.root()));
            }
        }
    }
}
