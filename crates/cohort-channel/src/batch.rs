//! Batch signing, tcpcrypt style: the server signs one Merkle root over many session IDs and
//! sends each client the signature plus the path from its session ID to the root.
//!
//! One Ed25519 signature then authenticates up to [`MAX_BATCH`] handshakes; each client pays
//! a few SHA-256 compressions and one verification.
//!
//! # The tree
//!
//! An RFC 6962 (section 2.1) Merkle tree with cohort's own domain separation:
//!
//! ```text
//! leaf(id)   = SHA-256(0x00 || "cohort-channel/v1 batch" || id)      id: 32-byte session ID
//! node(l, r) = SHA-256(0x01 || l || r)
//! root(D[n]) = leaf(D[0])                                      if n = 1
//!            = node(root(D[0..k]), root(D[k..n]))               k: largest power of 2 < n
//! signed     = "cohort-channel/v1 batch root" || n (u32, big-endian) || root
//! ```
//!
//! Any `n >= 1` works; a path verifies only together with its `(index, n)`, and `n` is part
//! of the signed message, so a proof cannot be replayed as a member of a differently shaped
//! tree.
//!
//! # Wire form of a proof
//!
//! ```text
//! signature [64] | index u32 | leaves u32 | path_len u8 | path_len * [32]
//! ```
//!
//! # Signer
//!
//! [`BatchSigner`] is sans-IO: the caller adds session IDs with the current time, arms a timer
//! for [`BatchSigner::poll_timeout`], calls [`BatchSigner::handle_timeout`] when it fires, and
//! collects proofs with [`BatchSigner::poll_signed`].
//!
//! ```
//! use cohort_channel::batch::{BatchConfig, BatchSigner};
//! use cohort_channel::identity::Identity;
//! use cohort_core::Timestamp;
//! use cohort_crypto::CryptoProvider;
//!
//! let provider = CryptoProvider::default_provider();
//! let identity = Identity::generate(&provider).unwrap();
//! let mut signer = BatchSigner::new(provider, identity, BatchConfig::default());
//! let now = Timestamp::from_millis(10);
//! let a = signer.add(now, [1; 32]);
//! let b = signer.add(now, [2; 32]);
//! let deadline = signer.poll_timeout().unwrap();
//! signer.handle_timeout(deadline);
//! assert_eq!(signer.signatures_made(), 1);
//! let (ticket, proof) = signer.poll_signed().unwrap();
//! assert_eq!(ticket, a);
//! assert!(proof.unwrap().verify(&provider, &signer.public(), &[1; 32]));
//! assert_eq!(signer.poll_signed().unwrap().0, b);
//! assert!(signer.poll_signed().is_none());
//! ```

use crate::identity::{Identity, PublicKey, SIGNATURE_LEN};
use cohort_core::wire::{Reader, Truncated, Writer};
use cohort_core::Timestamp;
use cohort_crypto::{CryptoError, CryptoProvider};
use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

/// The most session IDs one batch (one signature) covers. A path is then at most 12 hashes.
pub const MAX_BATCH: u32 = 4096;
/// The most path entries a proof may carry on the wire, whatever its shape.
pub const MAX_PATH: usize = 32;

const LEAF_LABEL: &[u8] = b"cohort-channel/v1 batch";
const ROOT_LABEL: &[u8] = b"cohort-channel/v1 batch root";
const LEAF_PREFIX: u8 = 0x00;
const NODE_PREFIX: u8 = 0x01;

fn leaf_hash(provider: &CryptoProvider, session_id: &[u8; 32]) -> [u8; 32] {
    provider
        .sha256
        .sha256(&[&[LEAF_PREFIX], LEAF_LABEL, session_id])
}

fn node_hash(provider: &CryptoProvider, left: &[u8; 32], right: &[u8; 32]) -> [u8; 32] {
    provider.sha256.sha256(&[&[NODE_PREFIX], left, right])
}

/// The message the server signs for a tree of `leaves` session IDs with this root.
fn signed_message(leaves: u32, root: &[u8; 32]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(ROOT_LABEL.len() + 4 + 32);
    Writer::new(&mut msg)
        .bytes(ROOT_LABEL)
        .u32(leaves)
        .bytes(root);
    msg
}

/// How many path entries the leaf at `index` of a tree of `leaves` has, if the pair is valid.
///
/// The RFC 6962 tree (split at the largest power of two below n) is the tree built bottom up
/// by pairing neighbours and carrying an odd last node up unchanged; the leaf has a sibling
/// at a level exactly when it is not that carried node.
fn path_len(index: u32, leaves: u32) -> Option<usize> {
    if leaves == 0 || leaves > MAX_BATCH || index >= leaves {
        return None;
    }
    let (mut m, mut n, mut len) = (index, leaves, 0);
    while n > 1 {
        if m & 1 == 1 || m + 1 < n {
            len += 1;
        }
        m >>= 1;
        n = n.div_ceil(2);
    }
    Some(len)
}

/// The levels of the tree over `leaf_hashes`, bottom (the leaves) first, root last.
fn tree_levels(provider: &CryptoProvider, leaf_hashes: Vec<[u8; 32]>) -> Vec<Vec<[u8; 32]>> {
    let mut levels = vec![leaf_hashes];
    while let Some(level) = levels.last().filter(|l| l.len() > 1) {
        let mut next = Vec::with_capacity(level.len().div_ceil(2));
        let mut pairs = level.chunks_exact(2);
        for pair in &mut pairs {
            if let [left, right] = pair {
                next.push(node_hash(provider, left, right));
            }
        }
        // An odd last node is carried up unchanged.
        next.extend_from_slice(pairs.remainder());
        levels.push(next);
    }
    levels
}

/// The audit path of leaf `index`, leaf level first.
fn audit_path(levels: &[Vec<[u8; 32]>], index: usize) -> Vec<[u8; 32]> {
    let mut path = Vec::new();
    let mut m = index;
    for level in levels {
        if let Some(sibling) = level.get(m ^ 1) {
            path.push(*sibling);
        }
        m >>= 1;
    }
    path
}

/// A server's signature over a batch, and one session's place in it.
#[derive(Clone, PartialEq, Eq)]
pub struct BatchProof {
    /// Ed25519 signature over the batch's signed message (see the [module docs](self)).
    pub signature: [u8; 64],
    /// This session's position among the batch's session IDs (0-based).
    pub index: u32,
    /// How many session IDs the batch has (1 to [`MAX_BATCH`]).
    pub leaves: u32,
    /// Sibling hashes from the leaf up to (not including) the root.
    pub path: Vec<[u8; 32]>,
}

impl BatchProof {
    /// Bytes [`BatchProof::encode`] writes.
    pub fn encoded_len(&self) -> usize {
        SIGNATURE_LEN + 4 + 4 + 1 + 32 * self.path.len()
    }

    /// Appends the wire form. A proof whose path has more than [`MAX_PATH`] entries (which
    /// no valid proof has) is written with only its first `MAX_PATH` entries, and so will not
    /// decode.
    pub fn encode(&self, w: &mut Writer<'_>) {
        let path = &self.path[..self.path.len().min(MAX_PATH)];
        // MAX_PATH fits in a u8.
        let count = u8::try_from(path.len()).unwrap_or(u8::MAX);
        w.bytes(&self.signature)
            .u32(self.index)
            .u32(self.leaves)
            .u8(count);
        for node in path {
            w.bytes(node);
        }
    }

    /// Reads one proof from `r`, leaving whatever follows it. Checks the shape before reading
    /// the path: `1 <= leaves <= MAX_BATCH`, `index < leaves`, and a path length equal to the
    /// one `(index, leaves)` implies (so at most [`MAX_PATH`]).
    pub fn decode(r: &mut Reader<'_>) -> Result<BatchProof, BatchProofError> {
        let signature = r.array::<64>()?;
        let index = r.u32()?;
        let leaves = r.u32()?;
        let count = usize::from(r.u8()?);
        if leaves == 0 || leaves > MAX_BATCH {
            return Err(BatchProofError::LeafCount(leaves));
        }
        if index >= leaves {
            return Err(BatchProofError::IndexOutOfRange { index, leaves });
        }
        let expected = path_len(index, leaves).ok_or(BatchProofError::LeafCount(leaves))?;
        if count > MAX_PATH || count != expected {
            return Err(BatchProofError::PathLength {
                found: count,
                expected,
            });
        }
        let mut path = Vec::with_capacity(count);
        for _ in 0..count {
            path.push(r.array::<32>()?);
        }
        Ok(BatchProof {
            signature,
            index,
            leaves,
            path,
        })
    }

    /// The root this proof's path gives for `session_id`, if the proof's shape is valid.
    fn root_for(&self, provider: &CryptoProvider, session_id: &[u8; 32]) -> Option<[u8; 32]> {
        if path_len(self.index, self.leaves)? != self.path.len() {
            return None;
        }
        let mut hash = leaf_hash(provider, session_id);
        let mut siblings = self.path.iter();
        let (mut m, mut n) = (self.index, self.leaves);
        while n > 1 {
            if m & 1 == 1 {
                hash = node_hash(provider, siblings.next()?, &hash);
            } else if m + 1 < n {
                hash = node_hash(provider, &hash, siblings.next()?);
            }
            m >>= 1;
            n = n.div_ceil(2);
        }
        Some(hash)
    }

    /// Whether this proof shows that `server_public` signed a batch holding `session_id` at
    /// `index` of `leaves`. False for any malformed proof; never panics.
    pub fn verify(
        &self,
        provider: &CryptoProvider,
        server_public: &PublicKey,
        session_id: &[u8; 32],
    ) -> bool {
        match self.root_for(provider, session_id) {
            Some(root) => server_public.verify(
                provider,
                &signed_message(self.leaves, &root),
                &self.signature,
            ),
            None => false,
        }
    }
}

impl fmt::Debug for BatchProof {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchProof")
            .field("signature", &hex::encode(self.signature))
            .field("index", &self.index)
            .field("leaves", &self.leaves)
            .field("path_len", &self.path.len())
            .finish()
    }
}

/// Why a proof's wire form was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BatchProofError {
    /// The input ended inside the proof.
    Truncated,
    /// The leaf count is 0 or above [`MAX_BATCH`].
    LeafCount(u32),
    /// The index is not below the leaf count.
    IndexOutOfRange {
        /// The index on the wire.
        index: u32,
        /// The leaf count on the wire.
        leaves: u32,
    },
    /// The path length on the wire is not the one `(index, leaves)` implies.
    PathLength {
        /// The count on the wire.
        found: usize,
        /// The count `(index, leaves)` implies.
        expected: usize,
    },
}

impl From<Truncated> for BatchProofError {
    fn from(_: Truncated) -> Self {
        BatchProofError::Truncated
    }
}

impl fmt::Display for BatchProofError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchProofError::Truncated => f.write_str("batch proof truncated"),
            BatchProofError::LeafCount(n) => {
                write!(f, "batch proof leaf count {n} is not in 1..={MAX_BATCH}")
            }
            BatchProofError::IndexOutOfRange { index, leaves } => {
                write!(
                    f,
                    "batch proof index {index} is not below its leaf count {leaves}"
                )
            }
            BatchProofError::PathLength { found, expected } => write!(
                f,
                "batch proof path has {found} entries where its shape needs {expected}"
            ),
        }
    }
}

impl std::error::Error for BatchProofError {}

/// When a [`BatchSigner`] signs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchConfig {
    /// Sign as soon as the open batch has this many session IDs. 0 is treated as 1, and
    /// values above [`MAX_BATCH`] as `MAX_BATCH`.
    pub max_sessions: usize,
    /// Sign when the open batch is this old (measured from its first session ID).
    pub window: Duration,
}

impl Default for BatchConfig {
    /// 64 sessions or 1 ms, whichever comes first.
    fn default() -> Self {
        BatchConfig {
            max_sessions: 64,
            window: Duration::from_millis(1),
        }
    }
}

/// Names one [`BatchSigner::add`] call, so its proof can be matched up when it is polled.
/// Unique per signer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BatchTicket(u64);

impl BatchTicket {
    /// The ticket's number: 0 for a signer's first `add`, then counting up.
    pub const fn get(self) -> u64 {
        self.0
    }
}

#[derive(Debug)]
struct OpenBatch {
    opened: Timestamp,
    tickets: Vec<BatchTicket>,
    session_ids: Vec<[u8; 32]>,
}

/// Collects session IDs into batches and signs each batch once (sans-IO: time comes in as
/// arguments, nothing is read from a clock).
///
/// A batch opens at the first [`add`](Self::add) after the previous one was signed, and is
/// signed when it reaches [`BatchConfig::max_sessions`], when its
/// [`window`](BatchConfig::window) has passed and [`handle_timeout`](Self::handle_timeout) is
/// called, or on [`flush`](Self::flush).
#[derive(Debug)]
pub struct BatchSigner {
    provider: CryptoProvider,
    identity: Identity,
    max_sessions: usize,
    window: Duration,
    open: Option<OpenBatch>,
    done: VecDeque<(BatchTicket, Result<BatchProof, CryptoError>)>,
    next_ticket: u64,
    signatures_made: u64,
}

impl BatchSigner {
    /// A signer for `identity`, with no open batch.
    pub fn new(provider: CryptoProvider, identity: Identity, config: BatchConfig) -> Self {
        BatchSigner {
            provider,
            identity,
            // MAX_BATCH is small; the conversion cannot fail on any real target.
            max_sessions: config
                .max_sessions
                .clamp(1, usize::try_from(MAX_BATCH).unwrap_or(usize::MAX)),
            window: config.window,
            open: None,
            done: VecDeque::new(),
            next_ticket: 0,
            signatures_made: 0,
        }
    }

    /// Adds a session ID to the open batch (opening one at `now` if there is none) and returns
    /// the ticket its proof will come back with. If the batch is now full it is signed before
    /// this returns.
    pub fn add(&mut self, now: Timestamp, session_id: [u8; 32]) -> BatchTicket {
        let ticket = BatchTicket(self.next_ticket);
        self.next_ticket += 1;
        let batch = self.open.get_or_insert_with(|| OpenBatch {
            opened: now,
            tickets: Vec::new(),
            session_ids: Vec::new(),
        });
        batch.tickets.push(ticket);
        batch.session_ids.push(session_id);
        if batch.session_ids.len() >= self.max_sessions {
            self.flush();
        }
        ticket
    }

    /// When the open batch's window ends (its first `add` time plus the window), or `None`
    /// when no batch is open.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        self.open.as_ref().map(|b| b.opened + self.window)
    }

    /// Signs the open batch if its window has ended by `now`.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        if self.poll_timeout().is_some_and(|deadline| now >= deadline) {
            self.flush();
        }
    }

    /// Signs the open batch now, if there is one.
    pub fn flush(&mut self) {
        let Some(batch) = self.open.take() else {
            return;
        };
        let leaves = batch.session_ids.len();
        let leaf_hashes = batch
            .session_ids
            .iter()
            .map(|id| leaf_hash(&self.provider, id))
            .collect();
        let levels = tree_levels(&self.provider, leaf_hashes);
        let root = levels.last().and_then(|l| l.first()).copied();
        // `add` keeps batches between 1 and MAX_BATCH, so both conversions succeed.
        let signature = match (root, u32::try_from(leaves)) {
            (Some(root), Ok(n)) => self
                .identity
                .sign(&self.provider, &signed_message(n, &root))
                .and_then(|sig| {
                    <[u8; 64]>::try_from(sig.as_slice()).map_err(|_| CryptoError::Failed)
                })
                .map(|sig| (sig, n)),
            _ => Err(CryptoError::Failed),
        };
        if signature.is_ok() {
            self.signatures_made += 1;
        }
        for (i, ticket) in batch.tickets.into_iter().enumerate() {
            let proof = signature.and_then(|(signature, leaves)| {
                Ok(BatchProof {
                    signature,
                    index: u32::try_from(i).map_err(|_| CryptoError::Failed)?,
                    leaves,
                    path: audit_path(&levels, i),
                })
            });
            self.done.push_back((ticket, proof));
        }
    }

    /// The next ticket whose batch has been signed, in `add` order, with its proof, or with
    /// the error if signing that batch failed (every ticket of the batch then gets the
    /// error; the session IDs are not retried). Each ticket is returned exactly once.
    pub fn poll_signed(&mut self) -> Option<(BatchTicket, Result<BatchProof, CryptoError>)> {
        self.done.pop_front()
    }

    /// How many batches have been signed successfully (one signature each).
    pub fn signatures_made(&self) -> u64 {
        self.signatures_made
    }

    /// How many session IDs wait in the open batch.
    pub fn pending(&self) -> usize {
        self.open.as_ref().map_or(0, |b| b.session_ids.len())
    }

    /// The signing identity's public key, which clients verify proofs against.
    pub fn public(&self) -> PublicKey {
        self.identity.public()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_crypto::{Secret, SignatureScheme};
    use proptest::prelude::*;

    fn provider() -> CryptoProvider {
        CryptoProvider::default_provider()
    }

    fn identity(seed: u8) -> Identity {
        Identity::from_secret(&provider(), Secret::new(vec![seed; 32])).unwrap()
    }

    fn session_id(i: usize) -> [u8; 32] {
        let mut id = [0u8; 32];
        id[..8].copy_from_slice(&(i as u64).to_be_bytes());
        id[31] = 0xa5;
        id
    }

    /// RFC 6962 section 2.1, written straight from the text, to check the bottom-up tree.
    fn mth(p: &CryptoProvider, ids: &[[u8; 32]]) -> [u8; 32] {
        if ids.len() == 1 {
            return leaf_hash(p, &ids[0]);
        }
        let k = ids.len().next_power_of_two() / 2;
        node_hash(p, &mth(p, &ids[..k]), &mth(p, &ids[k..]))
    }

    fn rfc_path(p: &CryptoProvider, m: usize, ids: &[[u8; 32]]) -> Vec<[u8; 32]> {
        if ids.len() == 1 {
            return Vec::new();
        }
        let k = ids.len().next_power_of_two() / 2;
        if m < k {
            let mut path = rfc_path(p, m, &ids[..k]);
            path.push(mth(p, &ids[k..]));
            path
        } else {
            let mut path = rfc_path(p, m - k, &ids[k..]);
            path.push(mth(p, &ids[..k]));
            path
        }
    }

    /// Signs one batch of `n` IDs and returns its proofs in order.
    fn sign_batch(signer: &mut BatchSigner, n: usize) -> Vec<BatchProof> {
        for i in 0..n {
            signer.add(Timestamp::ZERO, session_id(i));
        }
        signer.flush();
        std::iter::from_fn(|| signer.poll_signed())
            .map(|(_, proof)| proof.unwrap())
            .collect()
    }

    fn signer(max_sessions: usize) -> BatchSigner {
        BatchSigner::new(
            provider(),
            identity(7),
            BatchConfig {
                max_sessions,
                window: Duration::from_millis(1),
            },
        )
    }

    #[test]
    fn every_proof_verifies_for_every_size_up_to_70() {
        let p = provider();
        let mut s = signer(4096);
        for n in 1..=70usize {
            let ids: Vec<_> = (0..n).map(session_id).collect();
            let proofs = sign_batch(&mut s, n);
            assert_eq!(proofs.len(), n);
            let root = mth(&p, &ids);
            for (i, proof) in proofs.iter().enumerate() {
                assert_eq!(proof.index as usize, i);
                assert_eq!(proof.leaves as usize, n);
                assert_eq!(proof.path, rfc_path(&p, i, &ids), "n={n} i={i}");
                assert_eq!(proof.root_for(&p, &ids[i]), Some(root), "n={n} i={i}");
                assert!(proof.verify(&p, &s.public(), &ids[i]), "n={n} i={i}");
                assert_eq!(proof.signature, proofs[0].signature);
            }
        }
        assert_eq!(s.signatures_made(), 70);
    }

    #[test]
    fn path_len_matches_the_rfc_for_every_shape_up_to_300() {
        let p = provider();
        for n in 1..=300usize {
            let ids: Vec<_> = (0..n).map(session_id).collect();
            for i in 0..n {
                assert_eq!(
                    path_len(i as u32, n as u32),
                    Some(rfc_path(&p, i, &ids).len()),
                    "n={n} i={i}"
                );
            }
        }
        assert_eq!(path_len(0, MAX_BATCH), Some(12));
        assert_eq!(path_len(MAX_BATCH - 1, MAX_BATCH), Some(12));
        assert_eq!(path_len(0, 0), None);
        assert_eq!(path_len(3, 3), None);
        assert_eq!(path_len(0, MAX_BATCH + 1), None);
    }

    #[test]
    fn a_proof_fails_for_anything_else() {
        let p = provider();
        let mut s = signer(4096);
        let proofs = sign_batch(&mut s, 13);
        let server = s.public();
        for (i, good) in proofs.iter().enumerate() {
            let id = session_id(i);
            assert!(good.verify(&p, &server, &id));
            // Another session ID, including a neighbour's.
            assert!(!good.verify(&p, &server, &session_id(i + 1)));
            assert!(!good.verify(&p, &server, &[0; 32]));
            // Another server.
            assert!(!good.verify(&p, &identity(8).public(), &id));
            // Every signature bit.
            for bit in 0..512 {
                let mut bad = good.clone();
                bad.signature[bit / 8] ^= 1 << (bit % 8);
                assert!(!bad.verify(&p, &server, &id), "i={i} sig bit {bit}");
            }
            // Every path bit.
            for node in 0..good.path.len() {
                for bit in 0..256 {
                    let mut bad = good.clone();
                    bad.path[node][bit / 8] ^= 1 << (bit % 8);
                    assert!(!bad.verify(&p, &server, &id), "i={i} node {node} bit {bit}");
                }
            }
            // Every other index (with the path left as it is), and out of range.
            for j in 0..=14u32 {
                if j as usize != i {
                    let bad = BatchProof {
                        index: j,
                        ..good.clone()
                    };
                    assert!(!bad.verify(&p, &server, &id), "i={i} as index {j}");
                }
            }
            // Other leaf counts, including ones whose path length happens to agree.
            for n in [0, 1, 12, 14, 15, 16, MAX_BATCH, MAX_BATCH + 1, u32::MAX] {
                let bad = BatchProof {
                    leaves: n,
                    ..good.clone()
                };
                assert!(!bad.verify(&p, &server, &id), "i={i} as leaves {n}");
            }
            // A path entry added or removed.
            let mut longer = good.clone();
            longer.path.push([0; 32]);
            assert!(!longer.verify(&p, &server, &id));
            let mut shorter = good.clone();
            shorter.path.pop();
            assert!(!shorter.verify(&p, &server, &id));
        }
    }

    #[test]
    fn the_leaf_count_is_signed() {
        // Same root, different n: the signature must not carry over. Re-sign the root of a
        // 1-leaf tree under n = 2 by hand and check the honest n = 1 proof fails with it.
        let p = provider();
        let id = identity(7);
        let mut s = signer(1);
        let proof = sign_batch(&mut s, 1).remove(0);
        let root = leaf_hash(&p, &session_id(0));
        let sig = p
            .ed25519
            .sign(id.secret(), &signed_message(2, &root))
            .unwrap();
        let forged = BatchProof {
            signature: sig.try_into().unwrap(),
            ..proof.clone()
        };
        assert!(proof.verify(&p, &id.public(), &session_id(0)));
        assert!(!forged.verify(&p, &id.public(), &session_id(0)));
    }

    fn encoded(proof: &BatchProof) -> Vec<u8> {
        let mut buf = Vec::new();
        proof.encode(&mut Writer::new(&mut buf));
        buf
    }

    #[test]
    fn encode_decode_round_trip() {
        let mut s = signer(4096);
        for n in [1, 2, 3, 5, 64, 70] {
            for proof in sign_batch(&mut s, n) {
                let mut buf = encoded(&proof);
                assert_eq!(buf.len(), proof.encoded_len());
                buf.extend_from_slice(b"next");
                let mut r = Reader::new(&buf);
                assert_eq!(BatchProof::decode(&mut r), Ok(proof));
                assert_eq!(r.rest(), b"next");
            }
        }
    }

    #[test]
    fn decode_rejects_truncated_input() {
        let mut s = signer(4096);
        let proof = sign_batch(&mut s, 70).remove(33);
        let buf = encoded(&proof);
        for len in 0..buf.len() {
            assert_eq!(
                BatchProof::decode(&mut Reader::new(&buf[..len])),
                Err(BatchProofError::Truncated),
                "{len}"
            );
        }
    }

    fn raw(index: u32, leaves: u32, count: u8, entries: usize) -> Vec<u8> {
        let mut buf = vec![0u8; 64];
        Writer::new(&mut buf).u32(index).u32(leaves).u8(count);
        buf.resize(buf.len() + 32 * entries, 0);
        buf
    }

    #[test]
    fn decode_rejects_bad_shapes_before_reading_the_path() {
        let decode = |b: Vec<u8>| BatchProof::decode(&mut Reader::new(&b));
        assert!(decode(raw(2, 3, 1, 1)).is_ok());
        assert!(decode(raw(MAX_BATCH - 1, MAX_BATCH, 12, 12)).is_ok());
        assert_eq!(decode(raw(0, 0, 0, 0)), Err(BatchProofError::LeafCount(0)));
        assert_eq!(
            decode(raw(0, MAX_BATCH + 1, 13, 13)),
            Err(BatchProofError::LeafCount(MAX_BATCH + 1))
        );
        assert_eq!(
            decode(raw(0, u32::MAX, 32, 32)),
            Err(BatchProofError::LeafCount(u32::MAX))
        );
        assert_eq!(
            decode(raw(3, 3, 2, 2)),
            Err(BatchProofError::IndexOutOfRange {
                index: 3,
                leaves: 3
            })
        );
        // Index 2 of 3 is the carried node: one sibling, not two.
        assert_eq!(
            decode(raw(2, 3, 2, 2)),
            Err(BatchProofError::PathLength {
                found: 2,
                expected: 1
            })
        );
        assert_eq!(
            decode(raw(0, 3, 1, 1)),
            Err(BatchProofError::PathLength {
                found: 1,
                expected: 2
            })
        );
        // An oversized count is refused from the header alone, even with no path bytes.
        assert_eq!(
            decode(raw(0, 2, 255, 0)),
            Err(BatchProofError::PathLength {
                found: 255,
                expected: 1
            })
        );
        assert_eq!(
            decode(raw(0, 1, 33, 0)),
            Err(BatchProofError::PathLength {
                found: 33,
                expected: 0
            })
        );
    }

    #[test]
    fn an_overlong_path_is_not_encoded_whole() {
        let proof = BatchProof {
            signature: [1; 64],
            index: 0,
            leaves: 2,
            path: vec![[2; 32]; 40],
        };
        let buf = encoded(&proof);
        assert_eq!(buf.len(), 64 + 9 + 32 * MAX_PATH);
        assert!(BatchProof::decode(&mut Reader::new(&buf)).is_err());
    }

    #[test]
    fn one_signature_per_batch_and_max_sessions_is_honoured() {
        let mut s = signer(5);
        let t0 = Timestamp::from_millis(1);
        let mut tickets = Vec::new();
        for i in 0..12 {
            tickets.push(s.add(t0, session_id(i)));
            // The fifth and tenth adds sign at once, without a timeout.
            assert_eq!(s.signatures_made(), (i as u64 + 1) / 5, "after add {i}");
        }
        assert_eq!(s.pending(), 2);
        let ready: Vec<_> = std::iter::from_fn(|| s.poll_signed()).collect();
        assert_eq!(ready.len(), 10);
        for (k, (ticket, proof)) in ready.iter().enumerate() {
            assert_eq!(*ticket, tickets[k]);
            let proof = proof.as_ref().unwrap();
            assert_eq!(proof.leaves, 5);
            assert_eq!(proof.index as usize, k % 5);
            assert!(proof.verify(&provider(), &s.public(), &session_id(k)));
        }
        s.flush();
        assert_eq!(s.signatures_made(), 3);
        let rest: Vec<_> = std::iter::from_fn(|| s.poll_signed()).collect();
        assert_eq!(rest.len(), 2);
        assert_eq!(rest[1].1.as_ref().unwrap().leaves, 2);
        // Nothing open: flushing again signs nothing.
        s.flush();
        assert_eq!(s.signatures_made(), 3);
        assert!(s.poll_signed().is_none());
        // Tickets are unique.
        let mut all: Vec<u64> = tickets.iter().map(|t| t.get()).collect();
        all.dedup();
        assert_eq!(all, (0..12).collect::<Vec<_>>());
    }

    #[test]
    fn the_window_is_honoured_through_poll_timeout() {
        let mut s = BatchSigner::new(
            provider(),
            identity(9),
            BatchConfig {
                max_sessions: 64,
                window: Duration::from_millis(3),
            },
        );
        assert_eq!(s.poll_timeout(), None);
        s.handle_timeout(Timestamp::MAX);
        assert_eq!(s.signatures_made(), 0);

        let opened = Timestamp::from_millis(10);
        s.add(opened, session_id(0));
        // A later add does not move the deadline: the window runs from the first session.
        s.add(Timestamp::from_millis(12), session_id(1));
        let deadline = s.poll_timeout().unwrap();
        assert_eq!(deadline, Timestamp::from_millis(13));
        s.handle_timeout(Timestamp::from_nanos(deadline.as_nanos() - 1));
        assert_eq!(s.signatures_made(), 0);
        assert!(s.poll_signed().is_none());
        s.handle_timeout(deadline);
        assert_eq!(s.signatures_made(), 1);
        assert_eq!(s.poll_timeout(), None);
        assert_eq!(std::iter::from_fn(|| s.poll_signed()).count(), 2);

        // The next add opens a new batch with its own window.
        s.add(Timestamp::from_millis(20), session_id(2));
        assert_eq!(s.poll_timeout(), Some(Timestamp::from_millis(23)));
        s.handle_timeout(Timestamp::from_millis(30));
        assert_eq!(s.signatures_made(), 2);
        let (_, proof) = s.poll_signed().unwrap();
        let proof = proof.unwrap();
        assert_eq!((proof.index, proof.leaves), (0, 1));
        assert!(proof.path.is_empty());
        assert!(proof.verify(&provider(), &s.public(), &session_id(2)));
    }

    #[test]
    fn config_extremes_are_clamped() {
        let mut s = signer(0);
        s.add(Timestamp::ZERO, session_id(0));
        assert_eq!(s.signatures_made(), 1, "max_sessions 0 acts as 1");
        let mut s = signer(usize::MAX);
        for i in 0..MAX_BATCH as usize {
            s.add(Timestamp::ZERO, session_id(i));
        }
        assert_eq!(s.signatures_made(), 1, "a batch never exceeds MAX_BATCH");
        let last = std::iter::from_fn(|| s.poll_signed()).last().unwrap();
        let proof = last.1.unwrap();
        assert_eq!(proof.leaves, MAX_BATCH);
        assert!(proof.verify(
            &provider(),
            &s.public(),
            &session_id(MAX_BATCH as usize - 1)
        ));
    }

    struct FailingEd25519;

    impl SignatureScheme for FailingEd25519 {
        fn generate(&self) -> Result<(Secret, Vec<u8>), CryptoError> {
            Err(CryptoError::Failed)
        }
        fn public_key(&self, secret: &Secret) -> Result<Vec<u8>, CryptoError> {
            CryptoProvider::default_provider()
                .ed25519
                .public_key(secret)
        }
        fn sign(&self, _: &Secret, _: &[u8]) -> Result<Vec<u8>, CryptoError> {
            Err(CryptoError::Failed)
        }
        fn verify(&self, _: &[u8], _: &[u8], _: &[u8]) -> Result<(), CryptoError> {
            Err(CryptoError::Failed)
        }
    }

    static FAILING: FailingEd25519 = FailingEd25519;

    #[test]
    fn a_signing_failure_is_reported_per_ticket_not_a_panic() {
        let broken = CryptoProvider {
            ed25519: &FAILING,
            ..provider()
        };
        let mut s = BatchSigner::new(broken, identity(1), BatchConfig::default());
        let a = s.add(Timestamp::ZERO, session_id(0));
        let b = s.add(Timestamp::ZERO, session_id(1));
        s.flush();
        assert_eq!(s.signatures_made(), 0);
        assert_eq!(s.poll_signed(), Some((a, Err(CryptoError::Failed))));
        assert_eq!(s.poll_signed(), Some((b, Err(CryptoError::Failed))));
        assert_eq!(s.poll_signed(), None);
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let mut r = Reader::new(&bytes);
            if let Ok(proof) = BatchProof::decode(&mut r) {
                // Whatever decodes re-encodes to the bytes it came from.
                let used = bytes.len() - r.remaining();
                prop_assert_eq!(encoded(&proof), bytes[..used].to_vec());
                prop_assert!(!proof.verify(&provider(), &identity(7).public(), &[0; 32]));
            }
        }

        #[test]
        fn decode_of_valid_headers_never_panics(
            index in 0u32..5000,
            leaves in 0u32..5000,
            count in any::<u8>(),
            extra in 0usize..20,
        ) {
            let expected = path_len(index, leaves);
            let b = raw(index, leaves, count, extra);
            let got = BatchProof::decode(&mut Reader::new(&b));
            if let Ok(proof) = got {
                prop_assert_eq!(Some(proof.path.len()), expected);
            }
        }
    }
}
