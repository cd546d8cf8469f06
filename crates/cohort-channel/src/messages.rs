//! Handshake messages and stream framing (wire format v2, documented in `docs/wire.md`).
//!
//! Everything on a stream is a frame: `type u8 | length u16 | body`. Handshake messages are
//! frames of types 1 to 4, alerts type 0x15, records types 0x17 to 0x19. Over datagrams,
//! each handshake frame is one datagram. Every parser is bounds checked and returns
//! [`MessageError`] on bad input; none panics.

use cohort_core::wire::{Reader, Truncated, Writer};

/// The wire version this crate speaks. Version 2 added the ticket counts (a client asks
/// for several single-use resumption tickets, the server says how many it issued).
pub const VERSION: u8 = 2;
/// The first bytes of every ClientHello and ServerHello body: a peer that does not speak
/// cohort is told apart at once.
pub const MAGIC: &[u8; 6] = b"COHORT";
/// Bytes in a frame header.
pub const FRAME_HEADER_LEN: usize = 3;
/// The largest frame body.
pub const MAX_FRAME_BODY: usize = u16::MAX as usize;
/// Nonce length for both ends.
pub const NONCE_LEN: usize = 32;
/// Session IDs, resumption IDs and finished MACs are this long.
pub const ID_LEN: usize = 32;
/// Most entries in any offer list.
pub const MAX_OFFERS: usize = 16;
/// Most resumption tickets one handshake may ask for or issue.
pub const MAX_TICKETS: u8 = 16;

/// Frame types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameType {
    /// The client's offer and key share.
    ClientHello = 0x01,
    /// The server's choices, KEM ciphertext and key confirmation.
    ServerHello = 0x02,
    /// The client's key confirmation.
    ClientFinished = 0x03,
    /// The server's batch signature over the session ID.
    ServerAuth = 0x04,
    /// An unauthenticated refusal (no common suite, unknown version).
    Alert = 0x15,
    /// Application data.
    Data = 0x17,
    /// The sender's clean close: after it, no more records.
    Close = 0x18,
    /// The sender switches to the next record keys after this record.
    KeyUpdate = 0x19,
}

impl FrameType {
    /// The type with wire value `b`.
    pub fn from_u8(b: u8) -> Option<FrameType> {
        Some(match b {
            0x01 => FrameType::ClientHello,
            0x02 => FrameType::ServerHello,
            0x03 => FrameType::ClientFinished,
            0x04 => FrameType::ServerAuth,
            0x15 => FrameType::Alert,
            0x17 => FrameType::Data,
            0x18 => FrameType::Close,
            0x19 => FrameType::KeyUpdate,
            _ => return None,
        })
    }

    /// Whether frames of this type are protected records.
    pub fn is_record(self) -> bool {
        matches!(
            self,
            FrameType::Data | FrameType::Close | FrameType::KeyUpdate
        )
    }
}

/// Why a message was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MessageError {
    /// Shorter than its fields say.
    Truncated,
    /// Bytes left over after the last field.
    TrailingBytes,
    /// Not `COHORT` at the start: the peer does not speak cohort.
    BadMagic,
    /// A version this crate does not speak.
    UnsupportedVersion(u8),
    /// A field has a value outside its range (a list too long, a flag other than 0 or 1).
    BadField(&'static str),
}

impl From<Truncated> for MessageError {
    fn from(_: Truncated) -> Self {
        MessageError::Truncated
    }
}

impl std::fmt::Display for MessageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MessageError::Truncated => f.write_str("message truncated"),
            MessageError::TrailingBytes => f.write_str("trailing bytes after message"),
            MessageError::BadMagic => f.write_str("peer does not speak cohort"),
            MessageError::UnsupportedVersion(v) => write!(f, "unsupported wire version {v}"),
            MessageError::BadField(name) => write!(f, "bad field: {name}"),
        }
    }
}

impl std::error::Error for MessageError {}

/// Appends a frame header and body.
///
/// # Panics
/// Never for bodies this crate builds; a body over [`MAX_FRAME_BODY`] is a bug and is
/// reported as `None`.
pub fn write_frame(out: &mut Vec<u8>, ty: FrameType, body: &[u8]) -> Option<()> {
    let len = u16::try_from(body.len()).ok()?;
    out.push(ty as u8);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(body);
    Some(())
}

/// A frame at the front of `buf`: `Ok(None)` if more bytes are needed, else the raw type
/// byte and the whole frame length (header included).
pub fn peek_frame(buf: &[u8]) -> Option<(u8, usize)> {
    let [ty, hi, lo, ..] = *buf else {
        return None;
    };
    let len = FRAME_HEADER_LEN + usize::from(u16::from_be_bytes([hi, lo]));
    (buf.len() >= len).then_some((ty, len))
}

fn read_magic(r: &mut Reader<'_>) -> Result<(), MessageError> {
    if r.array::<6>().map_err(|_| MessageError::BadMagic)? != *MAGIC {
        return Err(MessageError::BadMagic);
    }
    match r.u8()? {
        VERSION => Ok(()),
        v => Err(MessageError::UnsupportedVersion(v)),
    }
}

/// A ticket count: at most [`MAX_TICKETS`].
fn read_tickets(r: &mut Reader<'_>) -> Result<u8, MessageError> {
    match r.u8()? {
        n if n <= MAX_TICKETS => Ok(n),
        _ => Err(MessageError::BadField("tickets")),
    }
}

fn read_list(r: &mut Reader<'_>, name: &'static str) -> Result<Vec<u8>, MessageError> {
    let n = usize::from(r.u8()?);
    if n > MAX_OFFERS {
        return Err(MessageError::BadField(name));
    }
    Ok(r.bytes(n)?.to_vec())
}

fn write_list(w: &mut Writer<'_>, list: &[u8]) {
    // Lists are built from configs capped at MAX_OFFERS.
    let n = list.len().min(MAX_OFFERS);
    w.u8(n as u8).bytes(&list[..n]);
}

fn read_flag(r: &mut Reader<'_>, name: &'static str) -> Result<bool, MessageError> {
    match r.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(MessageError::BadField(name)),
    }
}

fn read_u8_prefixed<'a>(r: &mut Reader<'a>) -> Result<&'a [u8], MessageError> {
    let n = usize::from(r.u8()?);
    Ok(r.bytes(n)?)
}

fn finish(r: &Reader<'_>) -> Result<(), MessageError> {
    if r.is_empty() {
        Ok(())
    } else {
        Err(MessageError::TrailingBytes)
    }
}

/// The client's first message: offers, a nonce, one key share, and optionally a resumption
/// request and a PAKE message. Its body is hashed into the transcript exactly as sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientHello {
    /// Fresh per connection.
    pub nonce: [u8; NONCE_LEN],
    /// KEM suite ids, client preference first.
    pub kems: Vec<u8>,
    /// Record gear ids the client accepts, preference first.
    pub gears: Vec<u8>,
    /// Authentication mode ids the client accepts, preference first.
    pub auths: Vec<u8>,
    /// The KEM suite of `key_share` (one of `kems`).
    pub share_kem: u8,
    /// The client's ephemeral public key for `share_kem`.
    pub key_share: Vec<u8>,
    /// The resumption ID of a cached session, if the client asks to resume.
    pub resume: Option<[u8; ID_LEN]>,
    /// How many single-use resumption tickets the client asks this session to yield (0 to
    /// [`MAX_TICKETS`]; 0 when it does not resume).
    pub tickets: u8,
    /// SPAKE2 message when `auths` offers a password (else empty).
    pub pake: Vec<u8>,
}

impl ClientHello {
    /// Appends the body.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer::new(out);
        w.bytes(MAGIC).u8(VERSION).bytes(&self.nonce);
        write_list(&mut w, &self.kems);
        write_list(&mut w, &self.gears);
        write_list(&mut w, &self.auths);
        w.u8(self.share_kem);
        // Key shares are at most 1216 bytes and PAKE messages 33: both fit.
        let _ = w.u16_prefixed(&self.key_share);
        match &self.resume {
            Some(id) => w.u8(1).bytes(id),
            None => w.u8(0),
        };
        w.u8(self.tickets);
        let _ = w.u16_prefixed(&self.pake);
    }

    /// Parses a body.
    pub fn decode(body: &[u8]) -> Result<ClientHello, MessageError> {
        let mut r = Reader::new(body);
        read_magic(&mut r)?;
        let nonce = r.array()?;
        let kems = read_list(&mut r, "kems")?;
        let gears = read_list(&mut r, "gears")?;
        let auths = read_list(&mut r, "auths")?;
        let share_kem = r.u8()?;
        let key_share = r.u16_prefixed()?.to_vec();
        let resume = if read_flag(&mut r, "resume flag")? {
            Some(r.array()?)
        } else {
            None
        };
        let tickets = read_tickets(&mut r)?;
        let pake = r.u16_prefixed()?.to_vec();
        finish(&r)?;
        Ok(ClientHello {
            nonce,
            kems,
            gears,
            auths,
            share_kem,
            key_share,
            resume,
            tickets,
            pake,
        })
    }
}

/// The server's reply. The `core` (everything before `finished`) goes into the transcript
/// hash; `finished` and `auth_tag` are computed from keys that hash depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerHello {
    /// Fresh per connection.
    pub nonce: [u8; NONCE_LEN],
    /// The chosen KEM suite id (0 when resumed).
    pub kem: u8,
    /// The record gears the server allows, its preference first; the first is the gear
    /// both ends start with.
    pub gears: Vec<u8>,
    /// The chosen authentication mode id.
    pub auth: u8,
    /// Whether the server resumed the session the client named.
    pub resumed: bool,
    /// How many single-use resumption tickets this session yields (at most what the client
    /// asked for, and at most [`MAX_TICKETS`]).
    pub tickets: u8,
    /// The KEM ciphertext (empty when resumed).
    pub ciphertext: Vec<u8>,
    /// The server's SPAKE2 message (password mode only, else empty).
    pub pake: Vec<u8>,
    /// HMAC over the transcript with the server's finished key.
    pub finished: [u8; ID_LEN],
    /// PSK or password mode: the server's MAC over the session ID (else empty).
    pub auth_tag: Vec<u8>,
}

impl ServerHello {
    /// Appends the core (the transcript part).
    pub fn encode_core(&self, out: &mut Vec<u8>) {
        let mut w = Writer::new(out);
        w.bytes(MAGIC).u8(VERSION).bytes(&self.nonce).u8(self.kem);
        write_list(&mut w, &self.gears);
        w.u8(self.auth).u8(u8::from(self.resumed)).u8(self.tickets);
        let _ = w.u16_prefixed(&self.ciphertext);
        let _ = w.u16_prefixed(&self.pake);
    }

    /// Appends the whole body.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.encode_core(out);
        self.encode_tail(out);
    }

    /// Appends what follows the core: the finished MAC and the authentication tag.
    pub fn encode_tail(&self, out: &mut Vec<u8>) {
        let mut w = Writer::new(out);
        w.bytes(&self.finished);
        let tag = &self.auth_tag[..self.auth_tag.len().min(255)];
        w.u8(tag.len() as u8).bytes(tag);
    }

    /// Parses a body; also returns the length of its core.
    pub fn decode(body: &[u8]) -> Result<(ServerHello, usize), MessageError> {
        let mut r = Reader::new(body);
        read_magic(&mut r)?;
        let nonce = r.array()?;
        let kem = r.u8()?;
        let gears = read_list(&mut r, "gears")?;
        let auth = r.u8()?;
        let resumed = read_flag(&mut r, "resumed flag")?;
        let tickets = read_tickets(&mut r)?;
        let ciphertext = r.u16_prefixed()?.to_vec();
        let pake = r.u16_prefixed()?.to_vec();
        let core_len = body.len() - r.remaining();
        let finished = r.array()?;
        let auth_tag = read_u8_prefixed(&mut r)?.to_vec();
        finish(&r)?;
        Ok((
            ServerHello {
                nonce,
                kem,
                gears,
                auth,
                resumed,
                tickets,
                ciphertext,
                pake,
                finished,
                auth_tag,
            },
            core_len,
        ))
    }
}

/// The client's key confirmation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientFinished {
    /// HMAC over the transcript with the client's finished key.
    pub finished: [u8; ID_LEN],
    /// PSK or password mode: the client's MAC over the session ID (else empty).
    pub auth_tag: Vec<u8>,
}

impl ClientFinished {
    /// Appends the body.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer::new(out);
        w.bytes(&self.finished);
        let tag = &self.auth_tag[..self.auth_tag.len().min(255)];
        w.u8(tag.len() as u8).bytes(tag);
    }

    /// Parses a body.
    pub fn decode(body: &[u8]) -> Result<ClientFinished, MessageError> {
        let mut r = Reader::new(body);
        let finished = r.array()?;
        let auth_tag = read_u8_prefixed(&mut r)?.to_vec();
        finish(&r)?;
        Ok(ClientFinished { finished, auth_tag })
    }
}

/// Why the sender refused the handshake. Alerts are not authenticated: an attacker can
/// forge one, which only ends a connection it could have cut anyway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlertCode {
    /// No KEM, gear or authentication mode in common.
    NoCommonSuite,
    /// A message that did not parse or was out of order.
    DecodeError,
    /// Key confirmation or authentication failed.
    HandshakeFailure,
    /// A code this version does not know.
    Unknown(u8),
}

impl AlertCode {
    /// The wire value.
    pub fn to_u8(self) -> u8 {
        match self {
            AlertCode::NoCommonSuite => 1,
            AlertCode::DecodeError => 2,
            AlertCode::HandshakeFailure => 3,
            AlertCode::Unknown(b) => b,
        }
    }

    /// The code for a wire value.
    pub fn from_u8(b: u8) -> AlertCode {
        match b {
            1 => AlertCode::NoCommonSuite,
            2 => AlertCode::DecodeError,
            3 => AlertCode::HandshakeFailure,
            b => AlertCode::Unknown(b),
        }
    }
}

impl std::fmt::Display for AlertCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AlertCode::NoCommonSuite => f.write_str("no common suite"),
            AlertCode::DecodeError => f.write_str("decode error"),
            AlertCode::HandshakeFailure => f.write_str("handshake failure"),
            AlertCode::Unknown(b) => write!(f, "unknown alert {b}"),
        }
    }
}

/// Parses an alert body (one byte).
pub fn decode_alert(body: &[u8]) -> Result<AlertCode, MessageError> {
    match body {
        [b] => Ok(AlertCode::from_u8(*b)),
        [] => Err(MessageError::Truncated),
        _ => Err(MessageError::TrailingBytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> ClientHello {
        ClientHello {
            nonce: [7; 32],
            kems: vec![3, 1],
            gears: vec![0x40, 0x42],
            auths: vec![0],
            share_kem: 3,
            key_share: vec![9; 1216],
            resume: Some([5; 32]),
            tickets: 8,
            pake: vec![],
        }
    }

    #[test]
    fn client_hello_round_trips_and_rejects_every_truncation() {
        let ch = hello();
        let mut body = Vec::new();
        ch.encode(&mut body);
        assert_eq!(ClientHello::decode(&body), Ok(ch));
        for n in 0..body.len() {
            assert!(ClientHello::decode(&body[..n]).is_err(), "prefix {n}");
        }
        body.push(0);
        assert_eq!(ClientHello::decode(&body), Err(MessageError::TrailingBytes));
    }

    #[test]
    fn server_hello_round_trips_and_reports_its_core() {
        let sh = ServerHello {
            nonce: [1; 32],
            kem: 1,
            gears: vec![0x40],
            auth: 2,
            resumed: false,
            tickets: 3,
            ciphertext: vec![4; 32],
            pake: vec![],
            finished: [8; 32],
            auth_tag: vec![6; 32],
        };
        let mut core = Vec::new();
        sh.encode_core(&mut core);
        let mut body = Vec::new();
        sh.encode(&mut body);
        let (parsed, core_len) = ServerHello::decode(&body).unwrap();
        assert_eq!(parsed, sh);
        assert_eq!(&body[..core_len], &core[..]);
        for n in 0..body.len() {
            assert!(ServerHello::decode(&body[..n]).is_err(), "prefix {n}");
        }
    }

    #[test]
    fn magic_and_version_are_checked() {
        let mut body = Vec::new();
        hello().encode(&mut body);
        let mut http = body.clone();
        http[..6].copy_from_slice(b"HTTP/1");
        assert_eq!(ClientHello::decode(&http), Err(MessageError::BadMagic));
        body[6] = 1;
        assert_eq!(
            ClientHello::decode(&body),
            Err(MessageError::UnsupportedVersion(1))
        );
    }

    #[test]
    fn ticket_counts_above_the_bound_are_refused() {
        let mut ch = hello();
        ch.tickets = MAX_TICKETS;
        let mut body = Vec::new();
        ch.encode(&mut body);
        assert_eq!(ClientHello::decode(&body), Ok(ch.clone()));
        // The count sits just before the 2-byte PAKE length (the PAKE message is empty).
        let at = body.len() - 3;
        assert_eq!(body[at], MAX_TICKETS);
        body[at] = MAX_TICKETS + 1;
        assert_eq!(
            ClientHello::decode(&body),
            Err(MessageError::BadField("tickets"))
        );
    }

    #[test]
    fn frames_are_found_only_when_complete() {
        let mut out = Vec::new();
        write_frame(&mut out, FrameType::Alert, &[1]).unwrap();
        assert_eq!(peek_frame(&out), Some((0x15, 4)));
        assert_eq!(peek_frame(&out[..3]), None);
        assert!(write_frame(&mut out, FrameType::Data, &vec![0; 70_000]).is_none());
    }
}
