//! The KDC's request and response (LSGC messages 2 and 3), byte by byte.
//!
//! Every message starts with `version u8 = 0x01 | kind u8`. A name is `len u8 (1..=31) |
//! len bytes of A-Z a-z 0-9 . _ -`. All lengths are checked before anything is read, and a
//! message must end exactly where its last field ends. The authoritative tables are in
//! `docs/wire.md` ("Key distribution center").
//!
//! ```text
//! Request (0x01), SL ──▶ KDC                  PairKey (0x02), KDC ──▶ SL
//!  1   version 0x01                            1   version 0x01
//!  1   kind 0x01                               1   kind 0x02
//!  1+n SL's name                               1+n SL's name (echoed)
//!  1+m A's name                                1+m A's name (echoed)
//!  16  nonce I_1                               16  nonce I_1 (echoed)
//!  32  MAC under K_req(K_SL) of all above      32  π_{SL,A}
//!                                              32  MAC under K_resp(K_SL) of all above
//!
//! UnknownPrincipal (0x03), KDC ──▶ SL          UnknownRequester (0x04), KDC ──▶ ?
//!  1   version 0x01                            1   version 0x01
//!  1   kind 0x03                               1   kind 0x04
//!  1+n SL's name (echoed)                      1+n the requester's name, as claimed
//!  1+m A's name: the unknown one               16  nonce I_1 (echoed)
//!  16  nonce I_1 (echoed)                          (no MAC: the KDC has no key for it)
//!  32  MAC under K_resp(K_SL) of all above
//! ```
//!
//! LSGC's message 2 (`SL, A, I_1`) was not authenticated; cohort adds the MAC so that the
//! KDC answers (and spends work on) registered requesters only, and tells nobody else
//! whether a principal A is registered. (The unauthenticated `UnknownRequester` hint does
//! tell anyone whether a *requester* name is registered: names are not secrets here.)
//! LSGC's message 3 encrypted only `I_1`; cohort authenticates the
//! whole response, so the leader knows that π, both names and the nonce come from the KDC
//! for this very request. π itself stays in the clear, as in LSGC (see [`crate::pair`]).
//! A request naming the same principal twice is malformed (its π would be zero).

use crate::pair::{PairKey, LM_LEN};
use crate::principal::{PrincipalName, MAX_NAME_LEN};
use cohort_core::wire::{Reader, Truncated, Writer};
use std::fmt;

/// The version byte of every KDC message.
pub const VERSION: u8 = 0x01;
/// Length of a nonce `I_1`.
pub const NONCE_LEN: usize = 16;
/// Length of a MAC.
pub const MAC_LEN: usize = 32;
/// Shortest request: one-byte names.
pub const MIN_REQUEST_LEN: usize = 2 + 2 * 2 + NONCE_LEN + MAC_LEN;
/// Longest request: names of [`MAX_NAME_LEN`] bytes.
pub const MAX_REQUEST_LEN: usize = MIN_REQUEST_LEN + 2 * (MAX_NAME_LEN - 1);
/// Longest response (a PairKey with the longest names).
pub const MAX_RESPONSE_LEN: usize = MAX_REQUEST_LEN + LM_LEN;

/// A nonce `I_1`: 16 bytes the requester picks at random for each request.
pub type Nonce = [u8; NONCE_LEN];

/// The kind byte (the second byte) of each message.
pub mod kind {
    /// A pair-key request (SL to the KDC).
    pub const REQUEST: u8 = 0x01;
    /// The pair key (KDC to SL), authenticated.
    pub const PAIR_KEY: u8 = 0x02;
    /// The principal asked for is not registered (KDC to SL), authenticated.
    pub const UNKNOWN_PRINCIPAL: u8 = 0x03;
    /// The requester is not registered (KDC to whoever asked), not authenticated.
    pub const UNKNOWN_REQUESTER: u8 = 0x04;
}

/// Why bytes are not a KDC message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// The message ends before a field.
    Truncated,
    /// Another version than [`VERSION`].
    Version(u8),
    /// A kind this parser does not take (a response where a request belongs, or unknown).
    Kind(u8),
    /// A name field that is empty, too long or has a character names cannot have.
    Name,
    /// A request naming the same principal as requester and as the principal asked for.
    SamePrincipal,
    /// Bytes after the last field.
    TrailingBytes,
}

impl From<Truncated> for WireError {
    fn from(_: Truncated) -> Self {
        WireError::Truncated
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Truncated => f.write_str("truncated"),
            WireError::Version(v) => write!(f, "unknown version {v}"),
            WireError::Kind(k) => write!(f, "unexpected kind 0x{k:02x}"),
            WireError::Name => f.write_str("invalid principal name"),
            WireError::SamePrincipal => f.write_str("requester and principal are the same"),
            WireError::TrailingBytes => f.write_str("bytes after the last field"),
        }
    }
}

impl std::error::Error for WireError {}

/// What a request asks: SL's name, A's name, the nonce `I_1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestBody {
    /// SL: who asks (and whose key MACs the request and the response).
    pub requester: PrincipalName,
    /// A: the principal SL wants a pair key with.
    pub principal: PrincipalName,
    /// `I_1`.
    pub nonce: Nonce,
}

impl RequestBody {
    /// Appends the request's bytes up to (not including) its MAC.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer::new(out);
        w.u8(VERSION).u8(kind::REQUEST);
        name(&mut w, &self.requester);
        name(&mut w, &self.principal);
        w.bytes(&self.nonce);
    }
}

/// A parsed request: its body, the bytes its MAC covers, and the MAC (not yet checked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    /// What it asks.
    pub body: RequestBody,
    /// The bytes the MAC covers (everything before it).
    pub covered: &'a [u8],
    /// The MAC as received.
    pub mac: [u8; MAC_LEN],
}

impl<'a> Request<'a> {
    /// Parses a request; checks version, kind, names and exact length, not the MAC.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(bytes);
        header(&mut r, |k| k == kind::REQUEST)?;
        let requester = read_name(&mut r)?;
        let principal = read_name(&mut r)?;
        let nonce = r.array()?;
        let covered = &bytes[..bytes.len() - r.remaining()];
        let mac = r.array()?;
        if !r.is_empty() {
            return Err(WireError::TrailingBytes);
        }
        if requester == principal {
            return Err(WireError::SamePrincipal);
        }
        Ok(Request {
            body: RequestBody {
                requester,
                principal,
                nonce,
            },
            covered,
            mac,
        })
    }
}

/// What a response says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseBody {
    /// The pair key `π_{SL,A}` (kind `0x02`, authenticated).
    PairKey {
        /// SL, echoed.
        requester: PrincipalName,
        /// A, echoed.
        principal: PrincipalName,
        /// `I_1`, echoed.
        nonce: Nonce,
        /// `π_{SL,A}`.
        pair_key: PairKey,
    },
    /// A is not registered (kind `0x03`, authenticated).
    UnknownPrincipal {
        /// SL, echoed.
        requester: PrincipalName,
        /// A, echoed: the name the KDC does not know.
        principal: PrincipalName,
        /// `I_1`, echoed.
        nonce: Nonce,
    },
    /// The requester is not registered (kind `0x04`). Not authenticated: anyone can send
    /// it, so a requester treats it as a hint only.
    UnknownRequester {
        /// The requester's name as the request claimed it.
        requester: PrincipalName,
        /// `I_1`, echoed.
        nonce: Nonce,
    },
}

impl ResponseBody {
    /// The kind byte.
    pub fn kind(&self) -> u8 {
        match self {
            ResponseBody::PairKey { .. } => kind::PAIR_KEY,
            ResponseBody::UnknownPrincipal { .. } => kind::UNKNOWN_PRINCIPAL,
            ResponseBody::UnknownRequester { .. } => kind::UNKNOWN_REQUESTER,
        }
    }

    /// Whether this kind carries a MAC (every kind but `UnknownRequester`).
    pub fn is_authenticated(&self) -> bool {
        !matches!(self, ResponseBody::UnknownRequester { .. })
    }

    /// The requester's name, echoed.
    pub fn requester(&self) -> &PrincipalName {
        match self {
            ResponseBody::PairKey { requester, .. }
            | ResponseBody::UnknownPrincipal { requester, .. }
            | ResponseBody::UnknownRequester { requester, .. } => requester,
        }
    }

    /// The nonce, echoed.
    pub fn nonce(&self) -> &Nonce {
        match self {
            ResponseBody::PairKey { nonce, .. }
            | ResponseBody::UnknownPrincipal { nonce, .. }
            | ResponseBody::UnknownRequester { nonce, .. } => nonce,
        }
    }

    /// Appends the response's bytes up to (not including) its MAC; for `UnknownRequester`,
    /// the whole message.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer::new(out);
        w.u8(VERSION).u8(self.kind());
        match self {
            ResponseBody::PairKey {
                requester,
                principal,
                nonce,
                pair_key,
            } => {
                name(&mut w, requester);
                name(&mut w, principal);
                w.bytes(nonce).bytes(pair_key.as_bytes());
            }
            ResponseBody::UnknownPrincipal {
                requester,
                principal,
                nonce,
            } => {
                name(&mut w, requester);
                name(&mut w, principal);
                w.bytes(nonce);
            }
            ResponseBody::UnknownRequester { requester, nonce } => {
                name(&mut w, requester);
                w.bytes(nonce);
            }
        }
    }
}

/// A parsed response: its body, the bytes its MAC covers and the MAC (not yet checked;
/// `None` exactly for `UnknownRequester`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Response<'a> {
    /// What it says.
    pub body: ResponseBody,
    /// The bytes the MAC covers (the whole message when there is no MAC).
    pub covered: &'a [u8],
    /// The MAC as received.
    pub mac: Option<[u8; MAC_LEN]>,
}

impl<'a> Response<'a> {
    /// Parses a response; checks version, kind, names and exact length, not the MAC.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(bytes);
        let k = header(&mut r, |k| {
            matches!(
                k,
                kind::PAIR_KEY | kind::UNKNOWN_PRINCIPAL | kind::UNKNOWN_REQUESTER
            )
        })?;
        let requester = read_name(&mut r)?;
        let body = match k {
            kind::PAIR_KEY => {
                let principal = read_name(&mut r)?;
                let nonce = r.array()?;
                let pair_key = PairKey::from_bytes(r.array()?);
                ResponseBody::PairKey {
                    requester,
                    principal,
                    nonce,
                    pair_key,
                }
            }
            kind::UNKNOWN_PRINCIPAL => {
                let principal = read_name(&mut r)?;
                let nonce = r.array()?;
                ResponseBody::UnknownPrincipal {
                    requester,
                    principal,
                    nonce,
                }
            }
            _ => ResponseBody::UnknownRequester {
                requester,
                nonce: r.array()?,
            },
        };
        let covered = &bytes[..bytes.len() - r.remaining()];
        let mac = if body.is_authenticated() {
            Some(r.array()?)
        } else {
            None
        };
        if !r.is_empty() {
            return Err(WireError::TrailingBytes);
        }
        Ok(Response { body, covered, mac })
    }
}

/// Reads and checks `version | kind`; returns the kind.
fn header(r: &mut Reader<'_>, kind_ok: impl Fn(u8) -> bool) -> Result<u8, WireError> {
    let version = r.u8()?;
    if version != VERSION {
        return Err(WireError::Version(version));
    }
    let k = r.u8()?;
    if !kind_ok(k) {
        return Err(WireError::Kind(k));
    }
    Ok(k)
}

fn read_name(r: &mut Reader<'_>) -> Result<PrincipalName, WireError> {
    let len = r.u8()?;
    // Check the length byte before reading, so a long bogus length reads nothing.
    if len == 0 || usize::from(len) > MAX_NAME_LEN {
        return Err(WireError::Name);
    }
    PrincipalName::from_bytes(r.bytes(usize::from(len))?).map_err(|_| WireError::Name)
}

fn name(w: &mut Writer<'_>, name: &PrincipalName) {
    w.u8(name.wire_len()).bytes(name.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> PrincipalName {
        PrincipalName::new(s).unwrap()
    }

    fn request_bytes(sl: &str, a: &str) -> Vec<u8> {
        let mut out = Vec::new();
        RequestBody {
            requester: n(sl),
            principal: n(a),
            nonce: [0x11; NONCE_LEN],
        }
        .encode(&mut out);
        out.extend_from_slice(&[0x22; MAC_LEN]);
        out
    }

    #[test]
    fn a_request_is_laid_out_as_documented() {
        let bytes = request_bytes("sl", "bob");
        let mut expected = vec![0x01, 0x01, 2, b's', b'l', 3, b'b', b'o', b'b'];
        expected.extend_from_slice(&[0x11; 16]);
        expected.extend_from_slice(&[0x22; 32]);
        assert_eq!(bytes, expected);
        assert_eq!(bytes.len(), 52 + 2 + 3);
        let parsed = Request::parse(&bytes).unwrap();
        assert_eq!(parsed.body.requester, n("sl"));
        assert_eq!(parsed.body.principal, n("bob"));
        assert_eq!(parsed.covered, &bytes[..bytes.len() - MAC_LEN]);
        assert_eq!(parsed.mac, [0x22; MAC_LEN]);
        assert_eq!(request_bytes("a", "b").len(), MIN_REQUEST_LEN);
        let long = "x".repeat(31);
        assert_eq!(
            request_bytes(&long, "y".repeat(31).as_str()).len(),
            MAX_REQUEST_LEN
        );
    }

    #[test]
    fn requests_are_refused_for_every_kind_of_wrongness() {
        let good = request_bytes("sl", "bob");
        for cut in 0..good.len() {
            assert_eq!(
                Request::parse(&good[..cut]),
                Err(WireError::Truncated),
                "{cut}"
            );
        }
        let mut long = good.clone();
        long.push(0);
        assert_eq!(Request::parse(&long), Err(WireError::TrailingBytes));
        let mut v = good.clone();
        v[0] = 2;
        assert_eq!(Request::parse(&v), Err(WireError::Version(2)));
        let mut k = good.clone();
        k[1] = kind::PAIR_KEY;
        assert_eq!(Request::parse(&k), Err(WireError::Kind(kind::PAIR_KEY)));
        let mut zero = good.clone();
        zero[2] = 0;
        assert_eq!(Request::parse(&zero), Err(WireError::Name));
        let mut huge = good.clone();
        huge[2] = 32;
        assert_eq!(Request::parse(&huge), Err(WireError::Name));
        let mut space = good.clone();
        space[3] = b' ';
        assert_eq!(Request::parse(&space), Err(WireError::Name));
        assert_eq!(
            Request::parse(&request_bytes("bob", "bob")),
            Err(WireError::SamePrincipal)
        );
    }

    #[test]
    fn responses_round_trip() {
        let bodies = [
            ResponseBody::PairKey {
                requester: n("sl"),
                principal: n("alice"),
                nonce: [1; NONCE_LEN],
                pair_key: PairKey::from_bytes([2; 32]),
            },
            ResponseBody::UnknownPrincipal {
                requester: n("sl"),
                principal: n("mallory"),
                nonce: [3; NONCE_LEN],
            },
            ResponseBody::UnknownRequester {
                requester: n("eve"),
                nonce: [4; NONCE_LEN],
            },
        ];
        for body in bodies {
            let mut bytes = Vec::new();
            body.encode(&mut bytes);
            let covered = bytes.len();
            if body.is_authenticated() {
                bytes.extend_from_slice(&[9; MAC_LEN]);
            }
            let parsed = Response::parse(&bytes).unwrap();
            assert_eq!(parsed.body, body);
            assert_eq!(parsed.covered.len(), covered);
            assert_eq!(parsed.mac.is_some(), body.is_authenticated());
            for cut in 0..bytes.len() {
                assert!(Response::parse(&bytes[..cut]).is_err());
            }
            bytes.push(0);
            assert_eq!(Response::parse(&bytes), Err(WireError::TrailingBytes));
        }
        assert_eq!(
            Response::parse(&request_bytes("a", "b")),
            Err(WireError::Kind(kind::REQUEST))
        );
    }
}
