//! Leighton-Micali pair keys with a modern PRF.
//!
//! LSGC (Figure 2, message 3): the KDC sends the session leader SL the **pair key**
//! `π_{SL,A} = {A}_{K_SL} ⊕ {SL}_{K_A}`. "The session leader generates the value {A}_{K_SL}.
//! This value is XOR-ed with the pair key π_{SL,A} received from the KDC. The resulting
//! value is a shared secret key ({SL}_{K_A} = σ_{SL,A})", and "A need not communicate with
//! the KDC to obtain the shared secret key {SL}_{K_A} = σ_{SL,A}; she can compute it
//! directly."
//!
//! In general `π_{A,B} = {A}_{K_B} ⊕ {B}_{K_A}` ([`pair_key`]), which is symmetric in A and
//! B. The leader's side is [`leader_shared_key`] (`σ = π ⊕ {A}_{K_SL}`), the member's
//! [`member_shared_key`] (`σ = {SL}_{K_A}`). Roles matter: `σ_{SL,A} = {SL}_{K_A}` is not
//! `σ_{A,SL} = {A}_{K_SL}`, so a member computes it with the *leader's* name.
//!
//! **The PRF.** LSGC wrote `{x}_K` for DES encryption of `x` under `K`. cohort replaces it
//! with a PRF producing 32 bytes:
//!
//! ```text
//! {x}_K = BLAKE3-keyed(K, "cohort-kdc v1 leighton-micali" 0x00 | len(x) u8 | x)
//! ```
//!
//! Keyed BLAKE3 rather than HMAC-SHA256 because its key is exactly a 32-byte `K_A` (no
//! key hashing or padding), it is a PRF by design in one pass with no inner and outer hash,
//! and cohort already uses it as its keyed hash (cohort-hop's chains and MACs), through
//! [`cohort_crypto::KeyedHash`]. The NUL-terminated label keeps these outputs apart from the
//! other values this crate derives from a `K_A` (the request and response MAC keys, whose
//! labels differ within the label), and the length byte makes the input unambiguous.
//!
//! **Why π alone is harmless.** π travels in the clear in LSGC and in Leighton and Micali's
//! scheme pair keys may even be published: without `K_SL` nobody can compute `{A}_{K_SL}`,
//! so π is a one-time pad over σ with a pseudorandom pad. cohort still authenticates every
//! response (see [`crate::wire`]), so nobody can substitute a π of their own.

use crate::principal::{PrincipalKey, PrincipalName};
use cohort_crypto::{ct_eq, CryptoProvider};
use std::fmt;
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

/// Length of `{x}_K`, of a pair key π and of a shared key σ.
pub const LM_LEN: usize = 32;

/// The label of `{x}_K` (NUL-terminated: the labels of one key form a prefix-free set).
const LM_LABEL: &[u8] = b"cohort-kdc v1 leighton-micali\0";

/// `{x}_K`: the PRF of the name `x` under the long-term key `K`. Secret: wiped on drop.
pub fn lm_prf(
    provider: &CryptoProvider,
    key: &PrincipalKey,
    x: &PrincipalName,
) -> Zeroizing<[u8; LM_LEN]> {
    let mut out = Zeroizing::new([0u8; LM_LEN]);
    provider.keyed_blake3.hash(
        key.expose(),
        &[LM_LABEL, &[x.wire_len()], x.as_bytes()],
        &mut out[..],
    );
    out
}

/// A Leighton-Micali pair key `π_{A,B} = {A}_{K_B} ⊕ {B}_{K_A}`: what the KDC hands out.
/// Not secret on its own (see the module documentation), so it prints and compares plainly.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PairKey([u8; LM_LEN]);

impl PairKey {
    /// A pair key from its bytes (as received from the KDC).
    pub fn from_bytes(bytes: [u8; LM_LEN]) -> Self {
        PairKey(bytes)
    }

    /// The pair key's bytes.
    pub fn as_bytes(&self) -> &[u8; LM_LEN] {
        &self.0
    }
}

impl fmt::Debug for PairKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PairKey(")?;
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        f.write_str(")")
    }
}

/// The secret `σ_{SL,A} = {SL}_{K_A}` that the leader SL and the member A share: the key of
/// the channel between them (LSGC messages 4 and 6). Zeroized on drop, redacted in
/// `Debug`, compared in constant time.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct SharedKey([u8; LM_LEN]);

impl SharedKey {
    /// The key's bytes. Keep the borrow short.
    pub fn expose(&self) -> &[u8; LM_LEN] {
        &self.0
    }
}

impl fmt::Debug for SharedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SharedKey(redacted)")
    }
}

impl PartialEq for SharedKey {
    fn eq(&self, other: &Self) -> bool {
        ct_eq(&self.0, &other.0)
    }
}

impl Eq for SharedKey {}

fn xor(a: &[u8; LM_LEN], b: &[u8; LM_LEN]) -> [u8; LM_LEN] {
    let mut out = [0u8; LM_LEN];
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = x ^ y;
    }
    out
}

/// The KDC's side: `π_{A,B} = {A}_{K_B} ⊕ {B}_{K_A}`. Symmetric: `pair_key(A, B)` equals
/// `pair_key(B, A)`. For A = B it is all zeros (the KDC refuses such requests).
pub fn pair_key(
    provider: &CryptoProvider,
    a: &PrincipalName,
    key_a: &PrincipalKey,
    b: &PrincipalName,
    key_b: &PrincipalKey,
) -> PairKey {
    let a_under_b = lm_prf(provider, key_b, a);
    let b_under_a = lm_prf(provider, key_a, b);
    PairKey(xor(&a_under_b, &b_under_a))
}

/// The leader's side: `σ_{SL,A} = π_{SL,A} ⊕ {A}_{K_SL}`, from the pair key the KDC sent
/// and the leader's own key.
pub fn leader_shared_key(
    provider: &CryptoProvider,
    leader_key: &PrincipalKey,
    member: &PrincipalName,
    pair: &PairKey,
) -> SharedKey {
    let member_under_leader = lm_prf(provider, leader_key, member);
    SharedKey(xor(&pair.0, &member_under_leader))
}

/// The member's side: `σ_{SL,A} = {SL}_{K_A}`, from the member's own key and the leader's
/// name, with no message to anyone.
pub fn member_shared_key(
    provider: &CryptoProvider,
    member_key: &PrincipalKey,
    leader: &PrincipalName,
) -> SharedKey {
    SharedKey(*lm_prf(provider, member_key, leader))
}

/// The leader's side from a pair-key value it already holds as `{A}_{K_SL}` (the client
/// keeps that instead of `K_SL`).
pub(crate) fn shared_from_parts(pair: &PairKey, member_under_leader: &[u8; LM_LEN]) -> SharedKey {
    SharedKey(xor(&pair.0, member_under_leader))
}

/// Runs the whole scheme once in memory and reports whether both sides agree: the KDC's pair
/// key for `leader` and `member`, the leader's σ from it, the member's σ computed directly.
/// Cheap (five keyed hashes); a smoke check for a deployment, not a test.
pub fn both_sides_agree(
    provider: &CryptoProvider,
    leader: &PrincipalName,
    leader_key: &PrincipalKey,
    member: &PrincipalName,
    member_key: &PrincipalKey,
) -> bool {
    let pi = pair_key(provider, leader, leader_key, member, member_key);
    leader_shared_key(provider, leader_key, member, &pi)
        == member_shared_key(provider, member_key, leader)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn provider() -> CryptoProvider {
        CryptoProvider::default_provider()
    }

    fn name(s: &str) -> PrincipalName {
        PrincipalName::new(s).unwrap()
    }

    #[test]
    fn both_sides_agree_and_pi_alone_is_not_sigma() {
        let p = provider();
        let (sl, a) = (name("leader"), name("alice"));
        let (k_sl, k_a) = (
            PrincipalKey::from_bytes([1; 32]),
            PrincipalKey::from_bytes([2; 32]),
        );
        let pi = pair_key(&p, &sl, &k_sl, &a, &k_a);
        let at_leader = leader_shared_key(&p, &k_sl, &a, &pi);
        let at_member = member_shared_key(&p, &k_a, &sl);
        assert_eq!(at_leader, at_member);
        assert!(both_sides_agree(&p, &sl, &k_sl, &a, &k_a));
        // π is not σ, and π ⊕ σ is exactly the leader's secret {A}_{K_SL}.
        assert_ne!(pi.as_bytes(), at_member.expose());
        assert_eq!(
            xor(pi.as_bytes(), at_member.expose()),
            *lm_prf(&p, &k_sl, &a)
        );
        // Symmetric pair keys; σ depends on who leads.
        assert_eq!(pi, pair_key(&p, &a, &k_a, &sl, &k_sl));
        assert_ne!(at_member, member_shared_key(&p, &k_sl, &a));
        // Someone with π but another key than K_SL gets something else.
        let wrong = PrincipalKey::from_bytes([3; 32]);
        assert_ne!(leader_shared_key(&p, &wrong, &a, &pi), at_member);
        // π for the same principal twice is zero: the KDC refuses such requests.
        assert_eq!(pair_key(&p, &a, &k_a, &a, &k_a).as_bytes(), &[0; 32]);
        assert_eq!(format!("{at_member:?}"), "SharedKey(redacted)");
    }

    #[test]
    fn the_prf_is_pinned() {
        // A transcript of our own construction (keyed BLAKE3 over the label, the length byte
        // and the name): if this changes, every deployed σ changes.
        let out = lm_prf(
            &provider(),
            &PrincipalKey::from_bytes([0x42; 32]),
            &name("alice"),
        );
        let mut expected = [0u8; 32];
        provider().keyed_blake3.hash(
            &[0x42; 32],
            &[b"cohort-kdc v1 leighton-micali\0\x05alice"],
            &mut expected,
        );
        assert_eq!(*out, expected);
        // Names that share a prefix give unrelated outputs.
        let k = PrincipalKey::from_bytes([0x42; 32]);
        assert_ne!(*lm_prf(&provider(), &k, &name("alic")), *out);
    }

    proptest! {
        #[test]
        fn sigma_agrees_for_random_keys(
            k_sl in any::<[u8; 32]>(),
            k_a in any::<[u8; 32]>(),
            sl in "[a-z0-9._-]{1,31}",
            a in "[A-Z0-9._-]{1,31}",
        ) {
            let p = provider();
            let (sl, a) = (name(&sl), name(&a));
            let (k_sl, k_a) = (PrincipalKey::from_bytes(k_sl), PrincipalKey::from_bytes(k_a));
            let pi = pair_key(&p, &sl, &k_sl, &a, &k_a);
            let sigma = member_shared_key(&p, &k_a, &sl);
            prop_assert_eq!(&leader_shared_key(&p, &k_sl, &a, &pi), &sigma);
            prop_assert_ne!(pi.as_bytes(), sigma.expose());
        }
    }
}
