//! The requester's side (the session leader SL): build a request, open the response.
//!
//! ```text
//! PairKeyRequest::new(SL, K_SL, A, I_1) ── bytes() ──▶ KDC
//!                                        ◀── response
//! open_response: parse ─▶ MAC under K_resp(K_SL) ─▶ echoed SL and A ours? ─▶ I_1 ours?
//!                ─▶ σ_{SL,A} = π ⊕ {A}_{K_SL}
//! ```
//!
//! The request keeps what it needs to open the response (`K_resp` and `{A}_{K_SL}`), not
//! `K_SL` itself; both are wiped when it is dropped. Use a fresh random nonce for every
//! request, including every retry: the KDC drops a nonce it has seen.

use crate::auth::MacKey;
use crate::pair::{lm_prf, shared_from_parts, SharedKey, LM_LEN};
use crate::principal::{PrincipalKey, PrincipalName};
use crate::wire::{Nonce, RequestBody, Response, ResponseBody, WireError, MAX_REQUEST_LEN};
use cohort_crypto::CryptoProvider;
use std::fmt;
use zeroize::Zeroizing;

/// Why a request could not be made or a response gives no key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KdcError {
    /// API misuse: the requester asked for a pair key with itself.
    SamePrincipal,
    /// The response does not parse (or is a request).
    Malformed(WireError),
    /// The response's MAC does not verify under the requester's key: not from the KDC, or
    /// changed on the way.
    BadMac,
    /// An authentic response for another requester or another principal than this
    /// request's.
    WrongPrincipal {
        /// The requester the response names.
        requester: PrincipalName,
        /// The principal the response names (for `UnknownRequester`, the requester again).
        principal: PrincipalName,
    },
    /// A response for another nonce: an old response replayed, or the answer to an earlier
    /// attempt.
    WrongNonce,
    /// The KDC says (authenticated) that this principal is not registered.
    UnknownPrincipal(PrincipalName),
    /// The KDC says that the requester is not registered. **Not authenticated**: anyone can
    /// send it. Treat it as a hint (keep waiting for an authenticated answer until the
    /// request times out; report this only if none comes).
    UnknownRequester(PrincipalName),
}

impl KdcError {
    /// Whether this error comes from an unauthenticated message and may be a lie
    /// ([`KdcError::UnknownRequester`], and failures to parse or verify).
    pub fn is_hint(&self) -> bool {
        matches!(
            self,
            KdcError::UnknownRequester(_) | KdcError::Malformed(_) | KdcError::BadMac
        )
    }
}

impl fmt::Display for KdcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KdcError::SamePrincipal => {
                f.write_str("a principal cannot ask for a pair key with itself")
            }
            KdcError::Malformed(e) => write!(f, "the KDC's response is malformed: {e}"),
            KdcError::BadMac => f.write_str("the KDC's response does not authenticate"),
            KdcError::WrongPrincipal {
                requester,
                principal,
            } => write!(
                f,
                "the KDC's response is for {requester} asking for {principal}, not this request"
            ),
            KdcError::WrongNonce => f.write_str("the KDC's response answers another request"),
            KdcError::UnknownPrincipal(name) => {
                write!(f, "the KDC does not know the principal {name}")
            }
            KdcError::UnknownRequester(name) => write!(
                f,
                "the KDC says it does not know the requester {name} (unauthenticated)"
            ),
        }
    }
}

impl std::error::Error for KdcError {}

/// One pair-key request from SL for A, and what SL needs to open its answer.
pub struct PairKeyRequest {
    provider: CryptoProvider,
    body: RequestBody,
    bytes: Vec<u8>,
    response_key: MacKey,
    /// `{A}_{K_SL}`.
    principal_under_requester: Zeroizing<[u8; LM_LEN]>,
}

impl PairKeyRequest {
    /// A request from `requester` (SL, whose key is `requester_key`) for a pair key with
    /// `principal` (A), under the nonce `nonce` (16 fresh random bytes).
    pub fn new(
        provider: &CryptoProvider,
        requester: PrincipalName,
        requester_key: &PrincipalKey,
        principal: PrincipalName,
        nonce: Nonce,
    ) -> Result<Self, KdcError> {
        if requester == principal {
            return Err(KdcError::SamePrincipal);
        }
        let body = RequestBody {
            requester,
            principal,
            nonce,
        };
        let mut bytes = Vec::with_capacity(MAX_REQUEST_LEN);
        body.encode(&mut bytes);
        let mac = MacKey::request(provider, requester_key).tag(provider, &bytes);
        bytes.extend_from_slice(&mac);
        Ok(PairKeyRequest {
            provider: *provider,
            body,
            bytes,
            response_key: MacKey::response(provider, requester_key),
            principal_under_requester: lm_prf(provider, requester_key, &principal),
        })
    }

    /// The datagram to send to the KDC.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// SL.
    pub fn requester(&self) -> &PrincipalName {
        &self.body.requester
    }

    /// A.
    pub fn principal(&self) -> &PrincipalName {
        &self.body.principal
    }

    /// `I_1`.
    pub fn nonce(&self) -> &Nonce {
        &self.body.nonce
    }

    /// Checks a response and returns `σ_{SL,A}`: the MAC, then that it names this request's
    /// requester and principal, then its nonce. An authentic `UnknownPrincipal` answer
    /// comes back as [`KdcError::UnknownPrincipal`]; an `UnknownRequester` hint (checked
    /// for name and nonce only: it has no MAC) as [`KdcError::UnknownRequester`].
    pub fn open_response(&self, bytes: &[u8]) -> Result<SharedKey, KdcError> {
        let response = Response::parse(bytes).map_err(KdcError::Malformed)?;
        let ours = &self.body;
        match response.mac {
            Some(mac) => {
                if !self
                    .response_key
                    .verify(&self.provider, response.covered, &mac)
                {
                    return Err(KdcError::BadMac);
                }
            }
            None => {
                let requester = *response.body.requester();
                if requester != ours.requester {
                    return Err(KdcError::WrongPrincipal {
                        requester,
                        principal: requester,
                    });
                }
                if response.body.nonce() != &ours.nonce {
                    return Err(KdcError::WrongNonce);
                }
                return Err(KdcError::UnknownRequester(requester));
            }
        }
        let (requester, principal, pair_key) = match response.body {
            ResponseBody::PairKey {
                requester,
                principal,
                pair_key,
                ..
            } => (requester, principal, Some(pair_key)),
            ResponseBody::UnknownPrincipal {
                requester,
                principal,
                ..
            } => (requester, principal, None),
            // Has no MAC, so it was handled above.
            ResponseBody::UnknownRequester { requester, .. } => (requester, requester, None),
        };
        if requester != ours.requester || principal != ours.principal {
            return Err(KdcError::WrongPrincipal {
                requester,
                principal,
            });
        }
        if response.body.nonce() != &ours.nonce {
            return Err(KdcError::WrongNonce);
        }
        match pair_key {
            Some(pi) => Ok(shared_from_parts(&pi, &self.principal_under_requester)),
            None => Err(KdcError::UnknownPrincipal(principal)),
        }
    }
}

impl fmt::Debug for PairKeyRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PairKeyRequest")
            .field("requester", &self.body.requester)
            .field("principal", &self.body.principal)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pair::member_shared_key;
    use crate::registry::Registry;
    use crate::server::Kdc;
    use crate::wire::{MAC_LEN, NONCE_LEN};
    use std::net::{Ipv4Addr, SocketAddr};

    const FROM: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 1);

    fn name(s: &str) -> PrincipalName {
        PrincipalName::new(s).unwrap()
    }

    struct World {
        p: CryptoProvider,
        kdc: Kdc,
        k_sl: PrincipalKey,
        k_a: PrincipalKey,
    }

    fn world() -> World {
        let p = CryptoProvider::default_provider();
        let k_sl = PrincipalKey::from_bytes([0x51; 32]);
        let k_a = PrincipalKey::from_bytes([0xa1; 32]);
        let mut r = Registry::new();
        r.insert(name("sl"), k_sl.clone());
        r.insert(name("alice"), k_a.clone());
        r.insert(name("bob"), PrincipalKey::from_bytes([0xb0; 32]));
        World {
            p,
            kdc: Kdc::new(p, r),
            k_sl,
            k_a,
        }
    }

    impl World {
        fn request(&self, a: &str, nonce: u8) -> PairKeyRequest {
            PairKeyRequest::new(&self.p, name("sl"), &self.k_sl, name(a), [nonce; NONCE_LEN])
                .unwrap()
        }
        fn ask(&mut self, r: &PairKeyRequest) -> Vec<u8> {
            self.kdc.handle_request(FROM, r.bytes()).unwrap()
        }
    }

    #[test]
    fn sigma_matches_what_the_member_computes() {
        let mut w = world();
        let r = w.request("alice", 1);
        let response = w.ask(&r);
        let sigma = r.open_response(&response).unwrap();
        assert_eq!(sigma, member_shared_key(&w.p, &w.k_a, &name("sl")));
        assert_eq!(r.nonce(), &[1; NONCE_LEN]);
        assert_eq!(r.principal(), &name("alice"));
        assert_eq!(r.requester(), &name("sl"));
        assert!(!format!("{r:?}").contains("51"));
    }

    #[test]
    fn a_response_replayed_for_another_nonce_is_refused() {
        let mut w = world();
        let first = w.request("alice", 1);
        let old = w.ask(&first);
        let second = w.request("alice", 2);
        assert_eq!(second.open_response(&old), Err(KdcError::WrongNonce));
        // Rewriting the echoed nonce breaks the MAC.
        let mut rewritten = old.clone();
        let nonce_at = 2 + 1 + 2 + 1 + 5;
        rewritten[nonce_at..nonce_at + NONCE_LEN].copy_from_slice(&[2; NONCE_LEN]);
        assert_eq!(second.open_response(&rewritten), Err(KdcError::BadMac));
        // The right one still opens.
        let fresh = w.ask(&second);
        second.open_response(&fresh).unwrap();
    }

    #[test]
    fn a_response_for_another_principal_is_refused() {
        let mut w = world();
        let for_bob = w.request("bob", 1);
        let bobs = w.ask(&for_bob);
        // Same nonce (a careless requester) and different: either way, not alice's key.
        let for_alice_same_nonce = w.request("alice", 1);
        assert_eq!(
            for_alice_same_nonce.open_response(&bobs),
            Err(KdcError::WrongPrincipal {
                requester: name("sl"),
                principal: name("bob")
            })
        );
        let for_alice = w.request("alice", 7);
        assert!(matches!(
            for_alice.open_response(&bobs),
            Err(KdcError::WrongPrincipal { .. })
        ));
        // A response to another requester (its own key) does not authenticate.
        let k_other = PrincipalKey::from_bytes([0xb0; 32]);
        let bob_asks =
            PairKeyRequest::new(&w.p, name("bob"), &k_other, name("alice"), [7; 16]).unwrap();
        let to_bob = w.ask(&bob_asks);
        assert!(bob_asks.open_response(&to_bob).is_ok());
        assert_eq!(for_alice.open_response(&to_bob), Err(KdcError::BadMac));
    }

    #[test]
    fn an_unknown_principal_gives_the_clear_error() {
        let mut w = world();
        let r = w.request("mallory", 1);
        let response = w.ask(&r);
        let e = r.open_response(&response).unwrap_err();
        assert_eq!(e, KdcError::UnknownPrincipal(name("mallory")));
        assert!(!e.is_hint());
        assert_eq!(e.to_string(), "the KDC does not know the principal mallory");
    }

    #[test]
    fn an_unknown_requester_is_only_a_hint() {
        let mut w = world();
        let k = PrincipalKey::from_bytes([0xee; 32]);
        let r = PairKeyRequest::new(&w.p, name("eve"), &k, name("alice"), [3; 16]).unwrap();
        let response = w.kdc.handle_request(FROM, r.bytes()).unwrap();
        let e = r.open_response(&response).unwrap_err();
        assert_eq!(e, KdcError::UnknownRequester(name("eve")));
        assert!(e.is_hint());
        // A hint for another nonce or another name is not even that.
        let other = PairKeyRequest::new(&w.p, name("eve"), &k, name("alice"), [4; 16]).unwrap();
        assert_eq!(other.open_response(&response), Err(KdcError::WrongNonce));
        let sl = w.request("alice", 3);
        assert!(matches!(
            sl.open_response(&response),
            Err(KdcError::WrongPrincipal { .. })
        ));
    }

    #[test]
    fn every_bit_flip_of_a_response_is_refused() {
        let mut w = world();
        let r = w.request("alice", 5);
        let good = w.ask(&r);
        for i in 0..good.len() * 8 {
            let mut bad = good.clone();
            bad[i / 8] ^= 1 << (i % 8);
            assert!(r.open_response(&bad).is_err(), "bit {i}");
        }
        assert!(r.open_response(&good[..good.len() - MAC_LEN]).is_err());
        assert_eq!(
            PairKeyRequest::new(&w.p, name("sl"), &w.k_sl, name("sl"), [0; 16]).unwrap_err(),
            KdcError::SamePrincipal
        );
    }
}
