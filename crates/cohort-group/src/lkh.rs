//! The logical key hierarchy (Wong, Gouda, Lam, SIGCOMM 1998; RFC 2627) with batch
//! rekeying (Li, Yang, Gouda, Lam, WWW 2001): the tree of keys the leader holds, one rekey
//! batch (fresh keys on the changed paths, each wrapped under its children's keys), and a
//! member's side (its own path, opened from the wraps or from a copy under its pair key).
//!
//! Owns: `Tree` (the leader's slot table and every node key), `Path` (one member's keys),
//! `Wrap` and `LkhDelivery` (what an Install carries). Pure: no `GroupMember`, no I/O, no
//! clock; randomness comes from the caller. It may not install anything: `member/lkh.rs`
//! decides when a batch runs and what a member keeps.
//!
//! Node ids: leaves are level 0, index = the member's slot; the parent of (l, i) is
//! (l + 1, i / d). The root is (depth, 0). When slots outgrow d^depth a new root goes above
//! and no existing node changes its id. Every key a rekey creates has version = the key
//! epoch of the Install that carries it, so a version names its rekey.

use crate::id::{MemberId, ViewId};
use cohort_crypto::{AeadAlgorithm, CryptoError, CryptoProvider, Secret};
use rand_core::RngCore;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Bytes of a node key.
pub const NODE_KEY_LEN: usize = 32;
/// Bytes of a sealed node key (key and AES-GCM tag).
pub const SEALED_LEN: usize = NODE_KEY_LEN + 16;
/// Deepest tree accepted (degree 2 and 65,536 slots need 16).
pub const MAX_DEPTH: u8 = 32;
/// Largest degree accepted.
pub const MAX_DEGREE: usize = 64;
/// Bytes of one wrap on the wire: level, index, child position, sealed key. (The version of
/// the child key that seals it is not sent: the receiver uses the version it holds, which
/// the wrap key's derivation binds, so a wrap under another version does not open.)
pub const WRAP_WIRE_LEN: usize = 1 + 4 + 1 + SEALED_LEN;

const WRAP_SALT: &[u8] = b"cohort lkh wrap v1";
const PATH_SALT: &[u8] = b"cohort lkh path v1";
const FINGERPRINT_LABEL: &[u8] = b"cohort lkh key fingerprint";

/// A node of the tree: leaves are level 0 (index = slot), the root is (depth, 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId {
    /// 0 for leaves.
    pub level: u8,
    /// Position within the level.
    pub index: u32,
}

impl NodeId {
    /// The ancestor of leaf `slot` at `level` in a tree of `degree`.
    pub fn ancestor(slot: u32, level: u8, degree: usize) -> NodeId {
        let mut index = u64::from(slot);
        for _ in 0..level {
            index /= degree as u64;
        }
        NodeId {
            level,
            index: index as u32,
        }
    }

    /// The leaves under this node: `first..end` (end saturates at 2^32).
    fn leaf_range(self, degree: usize) -> (u64, u64) {
        let span = (degree as u64).saturating_pow(u32::from(self.level));
        let first = u64::from(self.index).saturating_mul(span);
        (first, first.saturating_add(span))
    }
}

/// One node key sealed under the key of one of its children.
#[derive(Clone, Debug, PartialEq)]
pub struct Wrap {
    /// The node whose new key this is (its version is the Install's key epoch).
    pub target: NodeId,
    /// Which child's key seals it: its position under `target` (0 to degree - 1). The
    /// version of that child's key is not carried: it is bound into the wrap key's
    /// derivation, and the receiver derives with the version it holds.
    pub child: u8,
    /// AES-256-GCM of the key under a key derived from the child's (see [`WrapContext`]).
    pub sealed: [u8; SEALED_LEN],
}

/// What an Install carries with the LKH rekey (`KeyDelivery::Lkh`).
#[derive(Clone, Debug, PartialEq)]
pub struct LkhDelivery {
    /// The tree's degree.
    pub degree: u8,
    /// The root's level after this rekey.
    pub depth: u8,
    /// The batch: every changed node's new key under each child that needs it, sorted by
    /// (target, child).
    pub wraps: Vec<Wrap>,
    /// Whole paths, each sealed under one member's pair key with the coordinator: joiners,
    /// and everyone when the coordinator reseeds. (rank in the new view, sealed path).
    pub paths: Vec<(u16, Vec<u8>)>,
}

impl LkhDelivery {
    /// Bytes on the wire of the batch (the wraps) and of the path copies.
    pub fn wire_len(&self) -> (usize, usize) {
        (
            self.wraps.len() * WRAP_WIRE_LEN,
            self.paths.iter().map(|(_, p)| 4 + p.len()).sum(),
        )
    }
}

impl Default for LkhDelivery {
    /// An empty delivery (what the KDC-mode digest is computed over).
    fn default() -> Self {
        LkhDelivery {
            degree: crate::config::RekeyMethod::LKH_DEFAULT_DEGREE as u8,
            depth: 1,
            wraps: Vec::new(),
            paths: Vec::new(),
        }
    }
}

/// What one LKH rekey cost the coordinator that ran it (for benchmarks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LkhRekeyStats {
    /// The key epoch it created.
    pub epoch: u64,
    /// Members of the new view.
    pub members: usize,
    /// The root's level.
    pub depth: u8,
    /// Whether it reseeded (every member got its whole path) instead of a batch.
    pub reseed: bool,
    /// Wraps in the Install.
    pub wraps: usize,
    /// Their bytes on the wire.
    pub wrap_bytes: usize,
    /// Whole paths sealed under pair keys (joiners; everyone on a reseed).
    pub paths: usize,
    /// Their bytes on the wire (each member's Install copy carries its own only, once the
    /// Install outgrows a datagram).
    pub path_bytes: usize,
    /// Node keys drawn.
    pub keys_created: usize,
}

/// What every derivation of one rekey is bound to.
#[derive(Clone, Copy, Debug)]
pub struct WrapContext<'a> {
    /// The group's name.
    pub group: &'a str,
    /// The view the Install installs.
    pub view: ViewId,
    /// The Install's key epoch: the version of every key this rekey creates.
    pub epoch: u64,
    /// KDC mode: the Install's digest (wraps left out); empty with identity keys, whose
    /// signature covers the whole Install.
    pub bind: &'a [u8],
}

impl WrapContext<'_> {
    fn info_head(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(1 + self.group.len() + 48 + self.bind.len());
        v.push(self.group.len() as u8);
        v.extend_from_slice(self.group.as_bytes());
        v.extend_from_slice(&self.view.seq.to_be_bytes());
        v.extend_from_slice(self.view.coordinator.as_bytes());
        v.extend_from_slice(&self.epoch.to_be_bytes());
        v.push(self.bind.len() as u8);
        v.extend_from_slice(self.bind);
        v
    }
}

/// The fingerprint of a node key: the first 8 bytes of a labelled SHA-256 (for ledgers).
pub fn fingerprint(provider: &CryptoProvider, key: &[u8]) -> [u8; 8] {
    let h = provider.sha256.sha256(&[FINGERPRINT_LABEL, key]);
    let mut fp = [0u8; 8];
    fp.copy_from_slice(&h[..8]);
    fp
}

/// A fresh derived AEAD key per (child key, view, epoch, target, child): every wrap key is
/// used once, so the zero nonce never repeats under one key.
fn wrap_aead(
    provider: &CryptoProvider,
    head: &[u8],
    child_key: &[u8],
    target: NodeId,
    child: u8,
    child_version: u64,
) -> Result<Box<dyn cohort_crypto::AeadKey>, CryptoError> {
    let mut k = Secret::zeroed(32);
    provider.hkdf_sha256.derive(
        WRAP_SALT,
        child_key,
        &[
            head,
            &[target.level],
            &target.index.to_be_bytes(),
            &[child],
            &child_version.to_be_bytes(),
        ],
        k.expose_mut(),
    )?;
    provider.aead.new_key(AeadAlgorithm::Aes256Gcm, k.expose())
}

#[allow(clippy::too_many_arguments)]
fn seal_wrap(
    provider: &CryptoProvider,
    head: &[u8],
    child_key: &[u8],
    target: NodeId,
    child: u8,
    child_version: u64,
    key: &[u8],
) -> Result<Wrap, CryptoError> {
    let aead = wrap_aead(provider, head, child_key, target, child, child_version)?;
    let mut buf = key.to_vec();
    let tag = aead.seal_in_place(&[0u8; 12], &[], &mut buf)?;
    let mut sealed = [0u8; SEALED_LEN];
    sealed[..NODE_KEY_LEN].copy_from_slice(&buf);
    sealed[NODE_KEY_LEN..].copy_from_slice(&tag);
    zeroize::Zeroize::zeroize(&mut buf);
    Ok(Wrap {
        target,
        child,
        sealed,
    })
}

/// Opens `w` under `child_key`, whose version is `child_version` (the one the opener holds).
fn open_wrap(
    provider: &CryptoProvider,
    head: &[u8],
    child_key: &[u8],
    child_version: u64,
    w: &Wrap,
) -> Option<Secret> {
    let aead = wrap_aead(provider, head, child_key, w.target, w.child, child_version).ok()?;
    let mut buf = Secret::from_slice(&w.sealed);
    let plain = aead.open_in_place(&[0u8; 12], &[], buf.expose_mut()).ok()?;
    (plain.len() == NODE_KEY_LEN).then(|| Secret::from_slice(plain))
}

/// One member's keys: its slot and, for each level from its leaf (0) to the root, the
/// version and key of its ancestor there.
#[derive(Clone, Debug, PartialEq)]
pub struct Path {
    /// The tree's degree.
    pub degree: u8,
    /// The member's leaf.
    pub slot: u32,
    /// (version, key) by level; the last is the root, the group key.
    pub keys: Vec<(u64, Secret)>,
}

impl Path {
    /// The root's level.
    pub fn depth(&self) -> u8 {
        self.keys.len().saturating_sub(1) as u8
    }

    /// The root key (the group key) and its version.
    pub fn root(&self) -> Option<&(u64, Secret)> {
        self.keys.last()
    }

    /// The node held at each level, with its version and key.
    pub fn nodes(&self) -> impl Iterator<Item = (NodeId, u64, &Secret)> + '_ {
        self.keys.iter().enumerate().map(|(l, (v, k))| {
            (
                NodeId::ancestor(self.slot, l as u8, usize::from(self.degree)),
                *v,
                k,
            )
        })
    }

    /// The path after the batch in `delivery`: each changed ancestor opened from the wrap
    /// under the key this member holds (or just opened) one level down. `None` if a
    /// changed ancestor has no wrap for this member's child, a wrap does not open, a wrap
    /// names another version than the one held, or the root did not change.
    pub fn advance(
        &self,
        provider: &CryptoProvider,
        ctx: &WrapContext<'_>,
        delivery: &LkhDelivery,
    ) -> Option<Path> {
        let d = usize::from(delivery.degree);
        if delivery.degree != self.degree || delivery.depth < self.depth() || self.keys.is_empty() {
            return None;
        }
        let head = ctx.info_head();
        let mut keys: Vec<(u64, Secret)> = Vec::with_capacity(usize::from(delivery.depth) + 1);
        keys.push(self.keys[0].clone());
        for level in 1..=delivery.depth {
            let node = NodeId::ancestor(self.slot, level, d);
            let below = NodeId::ancestor(self.slot, level - 1, d);
            let child = (below.index % d as u32) as u8;
            let targets = &delivery.wraps[delivery.wraps.partition_point(|w| w.target < node)..]
                .iter()
                .take_while(|w| w.target == node)
                .collect::<Vec<_>>();
            let (held_version, held_key) = keys.last()?;
            if targets.is_empty() {
                // Unchanged: keep it (a node above the old root cannot be unchanged).
                keys.push(self.keys.get(usize::from(level))?.clone());
                continue;
            }
            let w = targets.iter().find(|w| w.child == child)?;
            let key = open_wrap(provider, &head, held_key.expose(), *held_version, w)?;
            keys.push((ctx.epoch, key));
        }
        if keys.last().map(|(v, _)| *v) != Some(ctx.epoch) {
            return None;
        }
        Some(Path {
            degree: self.degree,
            slot: self.slot,
            keys,
        })
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + self.keys.len() * (8 + NODE_KEY_LEN));
        out.extend_from_slice(&self.slot.to_be_bytes());
        for (v, k) in &self.keys {
            out.extend_from_slice(&v.to_be_bytes());
            out.extend_from_slice(k.expose());
        }
        out
    }

    fn decode(degree: u8, depth: u8, bytes: &[u8]) -> Option<Path> {
        let per = 8 + NODE_KEY_LEN;
        let n = usize::from(depth) + 1;
        if bytes.len() != 4 + n * per {
            return None;
        }
        let slot = u32::from_be_bytes(bytes[..4].try_into().ok()?);
        let keys = bytes[4..]
            .chunks_exact(per)
            .map(|c| {
                let v = u64::from_be_bytes(c[..8].try_into().unwrap_or_default());
                (v, Secret::from_slice(&c[8..]))
            })
            .collect();
        Some(Path { degree, slot, keys })
    }

    /// Seals this path for the member at `rank`, under its pair key with the coordinator.
    pub fn seal(
        &self,
        provider: &CryptoProvider,
        ctx: &WrapContext<'_>,
        pair_key: &[u8],
        rank: u16,
    ) -> Result<Vec<u8>, CryptoError> {
        let aead = path_aead(provider, ctx, pair_key, rank)?;
        let mut buf = zeroize::Zeroizing::new(self.encode());
        let tag = aead.seal_in_place(&[0u8; 12], &[self.degree], &mut buf)?;
        let mut out = buf.to_vec();
        out.extend_from_slice(&tag);
        Ok(out)
    }

    /// Opens a path sealed by [`Path::seal`]; it must reach the root at `depth` with the
    /// root at version `ctx.epoch`.
    pub fn open(
        provider: &CryptoProvider,
        ctx: &WrapContext<'_>,
        pair_key: &[u8],
        rank: u16,
        degree: u8,
        depth: u8,
        sealed: &[u8],
    ) -> Option<Path> {
        let aead = path_aead(provider, ctx, pair_key, rank).ok()?;
        let mut buf = Secret::from_slice(sealed);
        let plain = aead
            .open_in_place(&[0u8; 12], &[degree], buf.expose_mut())
            .ok()?;
        let path = Path::decode(degree, depth, plain)?;
        (path.root().map(|(v, _)| *v) == Some(ctx.epoch)).then_some(path)
    }
}

fn path_aead(
    provider: &CryptoProvider,
    ctx: &WrapContext<'_>,
    pair_key: &[u8],
    rank: u16,
) -> Result<Box<dyn cohort_crypto::AeadKey>, CryptoError> {
    let mut k = Secret::zeroed(32);
    provider.hkdf_sha256.derive(
        PATH_SALT,
        pair_key,
        &[&ctx.info_head(), &rank.to_be_bytes()],
        k.expose_mut(),
    )?;
    provider.aead.new_key(AeadAlgorithm::Aes256Gcm, k.expose())
}

/// What one batch did, for the caller's ledgers and counters.
pub struct Batch {
    /// The Install's part, without path copies (the caller seals those).
    pub delivery: LkhDelivery,
    /// Members that get their whole path under their pair key: the joiners (all members
    /// on a reseed).
    pub copies: Vec<MemberId>,
    /// Every key this batch created: (node, version, fingerprint).
    pub created: Vec<(NodeId, u64, [u8; 8])>,
}

/// The leader's key tree: which member sits at which leaf, and every node's key.
#[derive(Clone, Debug)]
pub struct Tree {
    degree: usize,
    depth: u8,
    slots: BTreeMap<MemberId, u32>,
    by_slot: BTreeMap<u32, MemberId>,
    /// Slots below `end` that no member holds: the lowest free slot is the first of these,
    /// or `end`, found without scanning the occupied ones.
    free: BTreeSet<u32>,
    /// One past the highest slot ever given in this tree.
    end: u32,
    keys: HashMap<NodeId, (u64, Secret)>,
}

impl Tree {
    /// An empty tree of `degree` (clamped to 2 to [`MAX_DEGREE`]).
    pub fn new(degree: usize) -> Tree {
        Tree {
            degree: degree.clamp(2, MAX_DEGREE),
            depth: 1,
            slots: BTreeMap::new(),
            by_slot: BTreeMap::new(),
            free: BTreeSet::new(),
            end: 0,
            keys: HashMap::new(),
        }
    }

    /// The degree.
    pub fn degree(&self) -> usize {
        self.degree
    }

    /// The root's level.
    pub fn depth(&self) -> u8 {
        self.depth
    }

    /// How many members have a leaf.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no member has a leaf.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// How many node keys the tree holds.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// The leaf of `member`.
    pub fn slot_of(&self, member: &MemberId) -> Option<u32> {
        self.slots.get(member).copied()
    }

    /// The root key and its version.
    pub fn root(&self) -> Option<&(u64, Secret)> {
        self.keys.get(&NodeId {
            level: self.depth,
            index: 0,
        })
    }

    /// Whether exactly `members` have leaves.
    pub fn covers(&self, members: &[MemberId]) -> bool {
        members.len() == self.slots.len() && members.iter().all(|m| self.slots.contains_key(m))
    }

    /// Every key with its node and version (for the leader's ledger).
    pub fn all_keys(&self) -> impl Iterator<Item = (NodeId, u64, &Secret)> + '_ {
        self.keys.iter().map(|(n, (v, k))| (*n, *v, k))
    }

    /// `member`'s path, from its leaf to the root.
    pub fn path_of(&self, member: &MemberId) -> Option<Path> {
        let slot = self.slot_of(member)?;
        let keys = (0..=self.depth)
            .map(|l| {
                self.keys
                    .get(&NodeId::ancestor(slot, l, self.degree))
                    .cloned()
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Path {
            degree: self.degree as u8,
            slot,
            keys,
        })
    }

    /// Whether any occupied leaf is under `node`, and whether any of those is not in
    /// `copied` (a member that gets its path whole needs no wrap).
    fn occupancy(&self, node: NodeId, copied: &BTreeSet<MemberId>) -> (bool, bool) {
        let (first, end) = node.leaf_range(self.degree);
        if first > u64::from(u32::MAX) {
            return (false, false);
        }
        let end = end.min(u64::from(u32::MAX) + 1);
        let mut any = false;
        let range = if end > u64::from(u32::MAX) {
            self.by_slot.range(first as u32..)
        } else {
            self.by_slot.range(first as u32..end as u32)
        };
        for (_, m) in range {
            any = true;
            if !copied.contains(m) {
                return (true, true);
            }
        }
        (any, false)
    }

    /// Throws every key away and gives `members` leaves 0, 1, ... in order, all with fresh
    /// keys, the root being `root`: every member then needs its whole path (a reseed).
    pub fn reseed(
        &mut self,
        provider: &CryptoProvider,
        rng: &mut dyn RngCore,
        ctx: &WrapContext<'_>,
        members: &[MemberId],
        root: &Secret,
    ) -> Result<Batch, CryptoError> {
        let degree = self.degree;
        *self = Tree::new(degree);
        self.batch(provider, rng, ctx, members, root)
    }

    /// One batch: the leaves of members of the tree not in `members` are freed, members
    /// without a leaf take the lowest free ones, the tree grows a level while the slots
    /// outgrow it, and every node on the path of a freed or taken leaf (and the root)
    /// gets a fresh key (the root: `root`), version `ctx.epoch`, wrapped under each
    /// non-empty child's key (its new one if it changed). Joiners get no wraps: the
    /// caller sends them their whole path ([`Batch::copies`]). Commits at once.
    pub fn batch(
        &mut self,
        provider: &CryptoProvider,
        rng: &mut dyn RngCore,
        ctx: &WrapContext<'_>,
        members: &[MemberId],
        root: &Secret,
    ) -> Result<Batch, CryptoError> {
        let keep: std::collections::HashSet<MemberId> = members.iter().copied().collect();
        let left: Vec<MemberId> = self
            .slots
            .keys()
            .filter(|m| !keep.contains(m))
            .copied()
            .collect();
        let joined: Vec<MemberId> = members
            .iter()
            .filter(|m| !self.slots.contains_key(m))
            .copied()
            .collect();
        self.batch_change(provider, rng, ctx, &left, &joined, root)
    }

    /// [`batch`](Self::batch) given the change instead of the new member list: the leaves
    /// of `left` are freed and `joined` (in order; those already in the tree are skipped)
    /// take the lowest free ones. Its cost grows with the change and the tree's depth,
    /// not with the members: a coordinator that knows the change (a delta Install) does
    /// not compare 10,000 members against the tree's slots for one leave.
    pub fn batch_change(
        &mut self,
        provider: &CryptoProvider,
        rng: &mut dyn RngCore,
        ctx: &WrapContext<'_>,
        left: &[MemberId],
        joined: &[MemberId],
        root: &Secret,
    ) -> Result<Batch, CryptoError> {
        let d = self.degree;
        let mut touched: BTreeSet<u32> = BTreeSet::new();
        // Leaves.
        for m in left {
            if let Some(s) = self.slots.remove(m) {
                self.by_slot.remove(&s);
                self.free.insert(s);
                touched.insert(s);
            }
        }
        // Joins, lowest free slot first.
        let mut copies = Vec::new();
        for m in joined {
            if self.slots.contains_key(m) {
                continue;
            }
            let next_free = match self.free.pop_first() {
                Some(s) => s,
                None => {
                    let s = self.end;
                    self.end = self.end.saturating_add(1);
                    s
                }
            };
            self.slots.insert(*m, next_free);
            self.by_slot.insert(next_free, *m);
            touched.insert(next_free);
            copies.push(*m);
        }
        let copied: BTreeSet<MemberId> = copies.iter().copied().collect();
        // Growth.
        let old_depth = if self.keys.is_empty() { 0 } else { self.depth };
        let max_slot = self.by_slot.keys().next_back().copied().unwrap_or(0);
        let mut depth = self.depth.max(1);
        while (d as u64).saturating_pow(u32::from(depth)) <= u64::from(max_slot) {
            depth += 1;
            if depth > MAX_DEPTH {
                return Err(CryptoError::Failed);
            }
        }
        self.depth = depth;
        // The changed nodes, level by level.
        let mut changed: Vec<BTreeSet<u32>> = vec![BTreeSet::new(); usize::from(depth) + 1];
        for s in &touched {
            for l in 0..=depth {
                changed[usize::from(l)].insert(NodeId::ancestor(*s, l, d).index);
            }
        }
        for l in (old_depth + 1)..=depth {
            changed[usize::from(l)].insert(0);
        }
        changed[usize::from(depth)].insert(0);
        let head = ctx.info_head();
        let mut wraps = Vec::new();
        let mut created = Vec::new();
        for level in 0..=depth {
            for index in changed[usize::from(level)].iter().copied() {
                let node = NodeId { level, index };
                let (occupied, _) = self.occupancy(node, &copied);
                if !occupied {
                    self.keys.remove(&node);
                    continue;
                }
                let key = if level == depth && index == 0 {
                    Secret::from_slice(root.expose())
                } else {
                    let mut k = Secret::zeroed(NODE_KEY_LEN);
                    rng.fill_bytes(k.expose_mut());
                    k
                };
                if level > 0 {
                    for c in 0..d as u32 {
                        let Some(ci) = index.checked_mul(d as u32).and_then(|x| x.checked_add(c))
                        else {
                            break;
                        };
                        let child = NodeId {
                            level: level - 1,
                            index: ci,
                        };
                        let (_, needs) = self.occupancy(child, &copied);
                        if !needs {
                            continue;
                        }
                        let Some((cv, ck)) = self.keys.get(&child) else {
                            return Err(CryptoError::Failed);
                        };
                        wraps.push(seal_wrap(
                            provider,
                            &head,
                            ck.expose(),
                            node,
                            c as u8,
                            *cv,
                            key.expose(),
                        )?);
                    }
                }
                created.push((node, ctx.epoch, fingerprint(provider, key.expose())));
                self.keys.insert(node, (ctx.epoch, key));
            }
        }
        wraps.sort_by_key(|w| (w.target, w.child));
        Ok(Batch {
            delivery: LkhDelivery {
                degree: d as u8,
                depth,
                wraps,
                paths: Vec::new(),
            },
            copies,
            created,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    fn id(i: u32) -> MemberId {
        let mut b = [0u8; 32];
        b[..4].copy_from_slice(&i.to_be_bytes());
        b[31] = 1;
        MemberId::from_bytes(b)
    }

    fn ctx(epoch: u64) -> WrapContext<'static> {
        WrapContext {
            group: "g",
            view: ViewId {
                seq: epoch,
                coordinator: id(0),
            },
            epoch,
            bind: &[],
        }
    }

    fn root(rng: &mut ChaCha20Rng) -> Secret {
        let mut k = Secret::zeroed(32);
        rand_core::RngCore::fill_bytes(rng, k.expose_mut());
        k
    }

    /// A leader's tree of `n` members after a reseed at epoch 1, and every member's path.
    fn grown(n: u32, degree: usize) -> (Tree, BTreeMap<MemberId, Path>, ChaCha20Rng) {
        let p = CryptoProvider::default_provider();
        let mut rng = ChaCha20Rng::seed_from_u64(n as u64);
        let mut tree = Tree::new(degree);
        let members: Vec<MemberId> = (0..n).map(id).collect();
        let r = root(&mut rng);
        let b = tree
            .reseed(&p, &mut rng, &ctx(1), &members, &r)
            .expect("reseed");
        assert!(b.delivery.wraps.is_empty(), "a reseed sends paths only");
        assert_eq!(b.copies.len(), n as usize);
        let paths = members
            .iter()
            .map(|m| (*m, tree.path_of(m).expect("path")))
            .collect();
        (tree, paths, rng)
    }

    /// Applies a batch to every member's path: joiners take theirs from the tree (as their
    /// sealed copy would give it), the others open the wraps.
    fn follow(
        p: &CryptoProvider,
        tree: &Tree,
        paths: &mut BTreeMap<MemberId, Path>,
        members: &[MemberId],
        b: &Batch,
        c: &WrapContext<'_>,
    ) {
        paths.retain(|m, _| members.contains(m));
        for m in members {
            let next = if b.copies.contains(m) {
                tree.path_of(m).expect("joiner path")
            } else {
                paths[m].advance(p, c, &b.delivery).expect("member follows")
            };
            assert_eq!(next, tree.path_of(m).expect("tree path"), "member {m}");
            paths.insert(*m, next);
        }
    }

    #[test]
    fn a_batch_of_joins_and_leaves_reaches_every_member_and_no_leaver() {
        let p = CryptoProvider::default_provider();
        let (mut tree, mut paths, mut rng) = grown(20, 4);
        let old = paths.clone();
        // 3 leave, 2 join.
        let mut members: Vec<MemberId> = (0..20)
            .filter(|i| ![3, 7, 15].contains(i))
            .map(id)
            .collect();
        members.extend([id(100), id(101)]);
        let r = root(&mut rng);
        let c = ctx(2);
        let b = tree.batch(&p, &mut rng, &c, &members, &r).expect("batch");
        assert_eq!(b.copies, vec![id(100), id(101)]);
        // Joiners take the lowest free slots: the leavers' 3 and 7.
        assert_eq!(tree.slot_of(&id(100)), Some(3));
        assert_eq!(tree.slot_of(&id(101)), Some(7));
        follow(&p, &tree, &mut paths, &members, &b, &c);
        let root_key = tree.root().expect("root").1.clone();
        assert_eq!(root_key, r);
        // Forward secrecy: a leaver's old path opens nothing of this batch.
        for gone in [3, 7, 15] {
            assert!(old[&id(gone)].advance(&p, &c, &b.delivery).is_none());
        }
        // Backward secrecy: every key on a joiner's path is new.
        for j in [id(100), id(101)] {
            assert!(paths[&j].keys.iter().all(|(v, _)| *v == 2));
        }
        // A member's leaf did not change; its root did.
        assert_eq!(paths[&id(0)].keys[0], old[&id(0)].keys[0]);
        assert_ne!(paths[&id(0)].root(), old[&id(0)].root());
    }

    #[test]
    fn the_tree_grows_a_level_without_renaming_nodes() {
        let p = CryptoProvider::default_provider();
        let (mut tree, mut paths, mut rng) = grown(4, 4);
        assert_eq!(tree.depth(), 1);
        let leaf0 = tree.path_of(&id(0)).expect("path").keys[0].clone();
        let members: Vec<MemberId> = (0..5).map(id).collect();
        let r = root(&mut rng);
        let c = ctx(2);
        let b = tree.batch(&p, &mut rng, &c, &members, &r).expect("batch");
        assert_eq!(tree.depth(), 2);
        assert_eq!(tree.slot_of(&id(4)), Some(4));
        follow(&p, &tree, &mut paths, &members, &b, &c);
        assert_eq!(paths[&id(0)].keys[0], leaf0);
        // (1, 0) holds the four first members and did not change; (2, 0) is new above it.
        assert_eq!(paths[&id(0)].keys[1].0, 1);
        assert_eq!(paths[&id(0)].keys[2].0, 2);
    }

    fn one_leave(n: u32) -> (usize, usize, u8) {
        let p = CryptoProvider::default_provider();
        let (mut tree, mut paths, mut rng) = grown(n, 4);
        let members: Vec<MemberId> = (0..n).filter(|i| *i != n / 2).map(id).collect();
        let r = root(&mut rng);
        let c = ctx(2);
        let b = tree.batch(&p, &mut rng, &c, &members, &r).expect("batch");
        assert!(b.copies.is_empty());
        follow(&p, &tree, &mut paths, &members, &b, &c);
        let (bytes, copies) = b.delivery.wire_len();
        assert_eq!(copies, 0);
        (b.delivery.wraps.len(), bytes, tree.depth())
    }

    /// d·log_d(n) wraps: the leaver's ancestors each wrapped under at most d children (its
    /// parent under d - 1).
    fn assert_bound(n: u32) {
        let (wraps, bytes, depth) = one_leave(n);
        let depth_needed = (f64::from(n).ln() / 4f64.ln()).ceil() as u8;
        assert_eq!(depth, depth_needed, "n = {n}");
        assert!(wraps <= 4 * usize::from(depth), "n = {n}: {wraps} wraps");
        assert!(wraps <= 64, "n = {n}: {wraps} wraps");
        assert!(bytes <= 4096, "n = {n}: {bytes} bytes");
        eprintln!(
            "one leave at n = {n}, d = 4: {wraps} wraps, {bytes} bytes of wraps, depth {depth}"
        );
    }

    #[test]
    fn one_leave_at_1000_costs_at_most_d_log_d_n_wraps() {
        assert_bound(1000);
    }

    #[test]
    fn one_leave_at_10000_costs_at_most_d_log_d_n_wraps() {
        assert_bound(10_000);
    }

    #[test]
    fn a_tampered_or_misbound_wrap_is_refused() {
        let p = CryptoProvider::default_provider();
        let (mut tree, paths, mut rng) = grown(16, 4);
        let members: Vec<MemberId> = (1..16).map(id).collect();
        let r = root(&mut rng);
        let c = ctx(2);
        let b = tree.batch(&p, &mut rng, &c, &members, &r).expect("batch");
        let m = id(1);
        assert!(paths[&m].advance(&p, &c, &b.delivery).is_some());
        for i in 0..b.delivery.wraps.len() {
            for byte in [0, SEALED_LEN - 1] {
                let mut d = b.delivery.clone();
                d.wraps[i].sealed[byte] ^= 1;
                let mine = NodeId::ancestor(1, d.wraps[i].target.level, 4) == d.wraps[i].target
                    && NodeId::ancestor(1, d.wraps[i].target.level - 1, 4).index % 4
                        == u32::from(d.wraps[i].child);
                assert_eq!(paths[&m].advance(&p, &c, &d).is_none(), mine, "wrap {i}");
            }
        }
        // A member holding other versions of its keys derives other wrap keys.
        let mut other = paths[&m].clone();
        other.keys.iter_mut().for_each(|k| k.0 += 1);
        assert!(
            other.advance(&p, &c, &b.delivery).is_none(),
            "another version"
        );
        let other_view = WrapContext {
            view: ViewId {
                seq: 9,
                coordinator: id(0),
            },
            ..c
        };
        assert!(paths[&m].advance(&p, &other_view, &b.delivery).is_none());
        let bound = WrapContext {
            bind: &[1; 32],
            ..c
        };
        assert!(paths[&m].advance(&p, &bound, &b.delivery).is_none());
        // Sealed paths: open only for their rank, pair key and context.
        let path = tree.path_of(&m).expect("path");
        let sealed = path.seal(&p, &c, &[5; 32], 3).expect("seal");
        assert_eq!(
            Path::open(&p, &c, &[5; 32], 3, 4, tree.depth(), &sealed),
            Some(path)
        );
        assert!(Path::open(&p, &c, &[5; 32], 4, 4, tree.depth(), &sealed).is_none());
        assert!(Path::open(&p, &c, &[6; 32], 3, 4, tree.depth(), &sealed).is_none());
        assert!(Path::open(&p, &bound, &[5; 32], 3, 4, tree.depth(), &sealed).is_none());
        let mut bad = sealed.clone();
        bad[10] ^= 1;
        assert!(Path::open(&p, &c, &[5; 32], 3, 4, tree.depth(), &bad).is_none());
    }

    fn install_with(d: LkhDelivery) -> Vec<u8> {
        use crate::wire::{Install, KeyDelivery, Msg};
        let install = Install {
            view: ViewId {
                seq: 3,
                coordinator: id(0),
            },
            base: ViewId {
                seq: 2,
                coordinator: id(0),
            },
            count: 2,
            left: Vec::new(),
            joined: Vec::new(),
            digest: [9; 32],
            next_seqs: Vec::new(),
            key_epoch: 3,
            final_order: 0,
            key: KeyDelivery::Lkh(Box::new(d)),
            merge_into: None,
            removed: Vec::new(),
            signature: vec![7; 64],
        };
        let mut out = Vec::new();
        Msg::Install(Box::new(install)).encode(&mut out);
        out
    }

    #[test]
    fn the_delivery_round_trips_and_every_bound_is_checked() {
        use crate::wire::{KeyDelivery, Msg};
        let wrap = |level, index, child| Wrap {
            target: NodeId { level, index },
            child,
            sealed: [9; SEALED_LEN],
        };
        let good = LkhDelivery {
            degree: 4,
            depth: 2,
            wraps: vec![wrap(1, 0, 1), wrap(2, 0, 0)],
            paths: vec![(1, vec![3; 4 + 3 * 40 + 16])],
        };
        let bytes = install_with(good.clone());
        let Some(Msg::Install(i)) = Msg::decode(&bytes) else {
            panic!("does not decode")
        };
        assert_eq!(i.key, KeyDelivery::Lkh(Box::new(good.clone())));
        for cut in 0..bytes.len() {
            assert!(Msg::decode(&bytes[..cut]).is_none(), "truncated at {cut}");
        }
        let bad = [
            LkhDelivery {
                degree: 1,
                ..good.clone()
            },
            LkhDelivery {
                degree: 65,
                ..good.clone()
            },
            LkhDelivery {
                depth: 0,
                ..good.clone()
            },
            LkhDelivery {
                depth: MAX_DEPTH + 1,
                ..good.clone()
            },
            LkhDelivery {
                wraps: vec![wrap(0, 0, 0)],
                ..good.clone()
            },
            LkhDelivery {
                wraps: vec![wrap(3, 0, 0)],
                ..good.clone()
            },
            LkhDelivery {
                wraps: vec![wrap(1, 0, 4)],
                ..good.clone()
            },
            LkhDelivery {
                wraps: vec![wrap(2, 0, 0), wrap(1, 0, 1)],
                ..good.clone()
            },
            LkhDelivery {
                paths: vec![(2, vec![3; 10])],
                ..good.clone()
            },
            LkhDelivery {
                paths: vec![(0, vec![3; 1341])],
                ..good.clone()
            },
        ];
        for (k, d) in bad.into_iter().enumerate() {
            assert!(
                Msg::decode(&install_with(d)).is_none(),
                "bad delivery {k} parsed"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Any sequence of batches keeps every member's path equal to the tree's, and a
        /// member removed by a batch opens none of it.
        #[test]
        fn batches_keep_every_path_in_step(
            degree in 2usize..6,
            start in 1u32..40,
            steps in proptest::collection::vec((0u32..8, 0u32..6, any::<u64>()), 1..6),
        ) {
            let p = CryptoProvider::default_provider();
            let mut rng = ChaCha20Rng::seed_from_u64(u64::from(start));
            let mut tree = Tree::new(degree);
            let mut members: Vec<MemberId> = (0..start).map(id).collect();
            let r = root(&mut rng);
            tree.reseed(&p, &mut rng, &ctx(1), &members, &r).expect("reseed");
            let mut paths: BTreeMap<MemberId, Path> =
                members.iter().map(|m| (*m, tree.path_of(m).expect("path"))).collect();
            let mut next_id = 1000;
            for (step, (leaves, joins, pick)) in steps.into_iter().enumerate() {
                let epoch = step as u64 + 2;
                let mut pick = pick;
                let mut gone = Vec::new();
                for _ in 0..leaves.min(members.len() as u32 - 1) {
                    let i = (pick % members.len() as u64) as usize;
                    pick = pick.rotate_left(7) ^ 0x9e37;
                    gone.push(members.remove(i));
                }
                for _ in 0..joins {
                    members.push(id(next_id));
                    next_id += 1;
                }
                let r = root(&mut rng);
                let c = ctx(epoch);
                let b = tree.batch(&p, &mut rng, &c, &members, &r).expect("batch");
                for g in &gone {
                    prop_assert!(paths[g].advance(&p, &c, &b.delivery).is_none());
                }
                follow(&p, &tree, &mut paths, &members, &b, &c);
                prop_assert!(tree.covers(&members));
                prop_assert_eq!(tree.key_count() >= members.len(), true);
            }
        }
    }
}
