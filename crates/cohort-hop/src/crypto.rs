//! The hash functions ALPHA is built from: one chain step, the per-round MAC, and the Merkle
//! tree hashes of ALPHA-M. All are keyed BLAKE3 from the caller's [`CryptoProvider`], each
//! under its own fixed domain key, with 16-byte outputs.
//!
//! Why 16 bytes: a chain element and a MAC key are only ever attacked by finding a preimage
//! (a forger must produce the element that hashes to one already disclosed), which costs
//! 2^128 work at 16 bytes. Every chain step also hashes the chain's random 8-byte id and the
//! element's index (salted chains, after Hu, Jakobsson and Perrig), so one precomputed table
//! cannot attack many chains or many positions at once.

use cohort_crypto::CryptoProvider;

/// Length of a chain element, a MAC tag and a Merkle node, in bytes.
pub const ELEMENT_LEN: usize = 16;

/// A hash-chain element, a MAC tag or a Merkle node: 16 bytes.
pub type Element = [u8; ELEMENT_LEN];

/// Length of a chain id: random per chain, hashed into every step.
pub const CHAIN_ID_LEN: usize = 8;

/// A chain's id.
pub type ChainId = [u8; CHAIN_ID_LEN];

/// Domain keys: each use of BLAKE3 gets its own fixed key, so an output of one can never be
/// taken for an output of another.
const CHAIN_STEP_KEY: &[u8; 32] = b"cohort-hop v1 chain step ------.";
const MERKLE_LEAF_KEY: &[u8; 32] = b"cohort-hop v1 merkle leaf -----.";
const MERKLE_NODE_KEY: &[u8; 32] = b"cohort-hop v1 merkle node -----.";
const S1_DIGEST_KEY: &[u8; 32] = b"cohort-hop v1 s1 digest -------.";
const COMMIT_KEY: &[u8; 32] = b"cohort-hop v1 report commitment.";
const MAC_KEY_SUFFIX: &[u8; 16] = b"cohort-hop v1 ma";

/// One step of a chain: `h_index = H(chain_id || index || h_{index-1})`, where `prev` is
/// `h_{index-1}` and `index` is the index of the element being computed (1 for the first
/// step from the seed `h_0`).
pub fn chain_step(
    provider: &CryptoProvider,
    chain_id: &ChainId,
    index: u32,
    prev: &Element,
) -> Element {
    let mut out = [0u8; ELEMENT_LEN];
    provider.keyed_blake3.hash(
        CHAIN_STEP_KEY,
        &[chain_id, &index.to_be_bytes(), prev],
        &mut out,
    );
    out
}

/// Hashes `element` (at index `from`) forward to index `to` (`to >= from`): `to - from`
/// chain steps.
pub fn chain_walk(
    provider: &CryptoProvider,
    chain_id: &ChainId,
    from: u32,
    element: &Element,
    to: u32,
) -> Element {
    let mut e = *element;
    for index in from.saturating_add(1)..=to {
        e = chain_step(provider, chain_id, index, &e);
    }
    e
}

/// The MAC of ALPHA's S1, keyed with a chain element that is not yet disclosed. `parts` are
/// concatenated. The 32-byte BLAKE3 key is the element followed by a fixed 16-byte label, so
/// the key's secret part is the element's 128 bits.
pub fn mac(provider: &CryptoProvider, key: &Element, parts: &[&[u8]]) -> Element {
    let mut k = [0u8; 32];
    k[..ELEMENT_LEN].copy_from_slice(key);
    k[ELEMENT_LEN..].copy_from_slice(MAC_KEY_SUFFIX);
    let mut out = [0u8; ELEMENT_LEN];
    provider.keyed_blake3.hash(&k, parts, &mut out);
    out
}

/// A Merkle leaf: the hash of one message.
pub fn merkle_leaf(provider: &CryptoProvider, message: &[u8]) -> Element {
    let mut out = [0u8; ELEMENT_LEN];
    provider
        .keyed_blake3
        .hash(MERKLE_LEAF_KEY, &[message], &mut out);
    out
}

/// An inner Merkle node from its left and right children.
pub fn merkle_node(provider: &CryptoProvider, left: &Element, right: &Element) -> Element {
    let mut out = [0u8; ELEMENT_LEN];
    provider
        .keyed_blake3
        .hash(MERKLE_NODE_KEY, &[left, right], &mut out);
    out
}

/// A digest that tells S1s of one round apart (their flow header, element, count and MACs):
/// how a hop recognises a retransmission among candidate S1s.
pub fn s1_digest(
    provider: &CryptoProvider,
    flow_header: &[u8],
    element: &Element,
    count: u16,
    macs: &[u8],
) -> Element {
    let mut out = [0u8; ELEMENT_LEN];
    provider.keyed_blake3.hash(
        S1_DIGEST_KEY,
        &[flow_header, element, &count.to_be_bytes(), macs],
        &mut out,
    );
    out
}

/// The commitment to a delivery-report secret: `H(secret)`, carried in A1 and opened in A2.
pub fn commitment(provider: &CryptoProvider, secret: &Element) -> Element {
    let mut out = [0u8; ELEMENT_LEN];
    provider.keyed_blake3.hash(COMMIT_KEY, &[secret], &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walk_is_repeated_steps() {
        let p = CryptoProvider::default_provider();
        let id = [1u8; CHAIN_ID_LEN];
        let h0 = [9u8; ELEMENT_LEN];
        let h1 = chain_step(&p, &id, 1, &h0);
        let h2 = chain_step(&p, &id, 2, &h1);
        assert_eq!(chain_walk(&p, &id, 0, &h0, 2), h2);
        assert_eq!(chain_walk(&p, &id, 2, &h2, 2), h2);
        // Salted: the same element at another index or in another chain hashes differently.
        assert_ne!(chain_step(&p, &id, 2, &h0), h1);
        assert_ne!(chain_step(&p, &[2u8; CHAIN_ID_LEN], 1, &h0), h1);
    }

    #[test]
    fn domains_differ() {
        let p = CryptoProvider::default_provider();
        let a = [3u8; ELEMENT_LEN];
        assert_ne!(merkle_node(&p, &a, &a), mac(&p, &a, &[&a, &a]));
        assert_ne!(merkle_leaf(&p, &[3u8; 32]), merkle_node(&p, &a, &a));
    }
}
