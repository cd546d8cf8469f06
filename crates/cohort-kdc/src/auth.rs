//! The MAC keys derived from the requester's `K_SL`, and the MAC itself.
//!
//! ```text
//! K_req  = BLAKE3-keyed(K_SL, "cohort-kdc v1 request mac" 0x00)
//! K_resp = BLAKE3-keyed(K_SL, "cohort-kdc v1 response mac" 0x00)
//! MAC(K, bytes) = BLAKE3-keyed(K, bytes), 32 bytes
//! ```
//!
//! One key per direction, so a request can never pass as a response or the other way
//! round; the labels are NUL-terminated and differ from the Leighton-Micali label of
//! [`crate::pair`], so no derived key equals any `{x}_{K_SL}`.

use crate::principal::PrincipalKey;
use crate::wire::MAC_LEN;
use cohort_crypto::{ct_eq, CryptoProvider};
use zeroize::Zeroizing;

const REQUEST_LABEL: &[u8] = b"cohort-kdc v1 request mac\0";
const RESPONSE_LABEL: &[u8] = b"cohort-kdc v1 response mac\0";

/// A MAC key for one direction, wiped on drop.
pub(crate) struct MacKey(Zeroizing<[u8; 32]>);

impl MacKey {
    fn derive(provider: &CryptoProvider, key: &PrincipalKey, label: &[u8]) -> MacKey {
        let mut out = Zeroizing::new([0u8; 32]);
        provider
            .keyed_blake3
            .hash(key.expose(), &[label], &mut out[..]);
        MacKey(out)
    }

    /// `K_req`: the key requests are MACed under.
    pub(crate) fn request(provider: &CryptoProvider, requester_key: &PrincipalKey) -> MacKey {
        Self::derive(provider, requester_key, REQUEST_LABEL)
    }

    /// `K_resp`: the key responses to this requester are MACed under.
    pub(crate) fn response(provider: &CryptoProvider, requester_key: &PrincipalKey) -> MacKey {
        Self::derive(provider, requester_key, RESPONSE_LABEL)
    }

    /// The MAC of `covered`.
    pub(crate) fn tag(&self, provider: &CryptoProvider, covered: &[u8]) -> [u8; MAC_LEN] {
        let mut out = [0u8; MAC_LEN];
        provider.keyed_blake3.hash(&self.0, &[covered], &mut out);
        out
    }

    /// Whether `mac` is the MAC of `covered` (compared in constant time).
    pub(crate) fn verify(
        &self,
        provider: &CryptoProvider,
        covered: &[u8],
        mac: &[u8; MAC_LEN],
    ) -> bool {
        ct_eq(&self.tag(provider, covered), mac)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pair::lm_prf;
    use crate::principal::PrincipalName;

    #[test]
    fn directions_have_their_own_keys() {
        let p = CryptoProvider::default_provider();
        let k = PrincipalKey::from_bytes([9; 32]);
        let (req, resp) = (MacKey::request(&p, &k), MacKey::response(&p, &k));
        assert_ne!(*req.0, *resp.0);
        assert_ne!(req.tag(&p, b"x"), resp.tag(&p, b"x"));
        assert!(req.verify(&p, b"x", &req.tag(&p, b"x")));
        assert!(!req.verify(&p, b"y", &req.tag(&p, b"x")));
        // Not an LM value of any short name either (distinct labels).
        let n = PrincipalName::new("request").unwrap();
        assert_ne!(*lm_prf(&p, &k, &n), *req.0);
    }
}
