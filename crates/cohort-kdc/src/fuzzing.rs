//! Harnesses shared by the fuzz targets (`fuzz/fuzz_targets/kdc_*.rs`) and the property
//! tests (`tests/fuzz_harness.rs`): one function per input the network controls. None
//! panics on any input except through its own assertions, which are the properties the
//! fuzzer checks (a failed one is a finding); each returns what the tests assert on.
//!
//! Everything is deterministic: fixed keys, fixed nonces. Since MACs are deterministic too,
//! the only authentic messages are the ones these harnesses build themselves, and the
//! properties say so: the KDC answers with a key only a request it could have built, and the
//! requester accepts only the KDC's exact response.
//!
//! The first byte of each input is a control byte: bit 0 set means "start from a real
//! message and XOR the rest of the input over it" (so the fuzzer gets past the MAC checks
//! with few bits to find); bit 1 picks the principal (`alice`, registered, or `mallory`,
//! not); bit 2, with bit 0, keeps only as many bytes as the rest of the input has (so
//! cuts are reachable too).
//!
//! Not part of the crate's API: it exists for the fuzzers and the tests.

use crate::client::{KdcError, PairKeyRequest};
use crate::pair::member_shared_key;
use crate::principal::{PrincipalKey, PrincipalName};
use crate::registry::Registry;
use crate::server::{Kdc, Outcome};
use crate::wire::{Request, RequestBody, Response, NONCE_LEN};
use cohort_crypto::CryptoProvider;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// Where every request comes from.
pub const FROM: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 7000);
/// The requester's name.
pub const LEADER: &str = "leader";
/// A registered principal.
pub const ALICE: &str = "alice";
/// A principal nobody registered.
pub const MALLORY: &str = "mallory";
/// The nonce of [`real_request`].
pub const NONCE: [u8; NONCE_LEN] = [0x5a; NONCE_LEN];

fn provider() -> CryptoProvider {
    CryptoProvider::default_provider()
}

/// A name the harness knows is valid.
pub fn name(s: &'static str) -> PrincipalName {
    PrincipalName::new(s).unwrap_or_else(|e| panic!("harness name {s:?}: {e}"))
}

/// The fixed key of a harness principal.
pub fn key(s: &str) -> PrincipalKey {
    let mut bytes = [0u8; 32];
    for (b, c) in bytes.iter_mut().zip(s.bytes().cycle()) {
        *b = c;
    }
    PrincipalKey::from_bytes(bytes)
}

/// The registry: [`LEADER`] and [`ALICE`].
pub fn registry() -> Registry {
    let mut r = Registry::new();
    r.insert(name(LEADER), key(LEADER));
    r.insert(name(ALICE), key(ALICE));
    r
}

/// A fresh KDC over [`registry`].
pub fn kdc() -> Kdc {
    Kdc::new(provider(), registry())
}

/// The leader's request for `principal` under [`NONCE`].
pub fn real_request(principal: &'static str) -> PairKeyRequest {
    PairKeyRequest::new(
        &provider(),
        name(LEADER),
        &key(LEADER),
        name(principal),
        NONCE,
    )
    .unwrap_or_else(|e| panic!("harness request: {e}"))
}

/// The KDC's response to [`real_request`] for `principal`.
pub fn real_response(principal: &'static str) -> Vec<u8> {
    kdc()
        .handle_request(FROM, real_request(principal).bytes())
        .unwrap_or_else(|| panic!("the KDC answers the harness request"))
}

/// Applies the control byte (see the module documentation) to `real` and the rest of
/// `data`.
fn input(data: &[u8], real: impl Fn(&'static str) -> Vec<u8>) -> Vec<u8> {
    let Some((&control, rest)) = data.split_first() else {
        return Vec::new();
    };
    if control & 1 == 0 {
        return rest.to_vec();
    }
    let mut bytes = real(if control & 2 == 0 { ALICE } else { MALLORY });
    if control & 4 != 0 {
        bytes.truncate(rest.len());
    }
    for (i, x) in rest.iter().enumerate() {
        match bytes.get_mut(i) {
            Some(b) => *b ^= x,
            None => bytes.push(*x),
        }
    }
    bytes
}

/// Feeds one datagram (built from `data` as the module documentation says) to a fresh KDC.
/// Checks: exactly one counter moves; a reply comes exactly with the outcomes that have
/// one, and parses as a response to the request; an authenticated answer is only ever given
/// to a request byte-for-byte equal to the one the registered requester would build (no
/// malleability, nothing answered without the key); a request that parses re-encodes to the
/// same bytes.
pub fn request(data: &[u8]) -> Outcome {
    let bytes = input(data, |p| real_request(p).bytes().to_vec());
    let mut kdc = kdc();
    let handled = kdc.handle(FROM, &bytes);
    assert_eq!(kdc.counters().total(), 1, "one counter per request");
    assert_eq!(handled.reply.is_some(), handled.outcome.replied());

    if let Ok(parsed) = Request::parse(&bytes) {
        let mut again = Vec::new();
        parsed.body.encode(&mut again);
        again.extend_from_slice(&parsed.mac);
        assert_eq!(again, bytes, "a request re-encodes to its bytes");
    }
    if let Some(reply) = &handled.reply {
        let response = Response::parse(reply).unwrap_or_else(|e| panic!("own reply: {e}"));
        let parsed = Request::parse(&bytes).unwrap_or_else(|e| panic!("answered: {e}"));
        assert_eq!(response.body.requester(), &parsed.body.requester);
        assert_eq!(response.body.nonce(), &parsed.body.nonce);
        assert!(reply.len() <= crate::wire::MAX_RESPONSE_LEN);
    }
    if let Outcome::Answered {
        requester,
        principal,
    }
    | Outcome::UnknownPrincipal {
        requester,
        principal,
    } = handled.outcome
    {
        let parsed = Request::parse(&bytes).unwrap_or_else(|e| panic!("answered: {e}"));
        let canonical = PairKeyRequest::new(
            &provider(),
            requester,
            &key(requester.as_str()),
            principal,
            parsed.body.nonce,
        )
        .unwrap_or_else(|e| panic!("answered: {e}"));
        assert_eq!(
            canonical.bytes(),
            &bytes[..],
            "answered only a genuine request"
        );
    }
    handled.outcome
}

/// Hands one datagram (built from `data`; the real message is the KDC's response to the
/// leader's request for the principal) to the leader's open request for [`ALICE`]. Checks:
/// a key comes out only for the KDC's exact response, and it is the σ Alice computes; an
/// authenticated "unknown principal" never comes out (the real one is for another
/// principal); a response that parses re-encodes to the same bytes.
pub fn response(data: &[u8]) -> Result<(), KdcError> {
    let bytes = input(data, real_response);
    if let Ok(parsed) = Response::parse(&bytes) {
        let mut again = Vec::new();
        parsed.body.encode(&mut again);
        if let Some(mac) = parsed.mac {
            again.extend_from_slice(&mac);
        }
        assert_eq!(again, bytes, "a response re-encodes to its bytes");
    }
    let request = real_request(ALICE);
    let opened = request.open_response(&bytes);
    match &opened {
        Ok(sigma) => {
            assert_eq!(bytes, real_response(ALICE), "only the KDC's response opens");
            assert_eq!(
                sigma,
                &member_shared_key(&provider(), &key(ALICE), &name(LEADER))
            );
        }
        Err(KdcError::UnknownPrincipal(p)) => panic!("an authentic 'unknown {p}' for alice"),
        Err(KdcError::WrongPrincipal { .. })
            if Response::parse(&bytes).is_ok_and(|r| r.mac.is_some()) =>
        {
            assert_eq!(
                bytes,
                real_response(MALLORY),
                "only the KDC's own MAC passes"
            );
        }
        Err(_) => {}
    }
    opened.map(|_| ())
}

/// Re-encodes a request body with a MAC (for tests that build requests by hand).
pub fn encode_request(body: &RequestBody, mac: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    body.encode(&mut out);
    out.extend_from_slice(mac);
    out
}
