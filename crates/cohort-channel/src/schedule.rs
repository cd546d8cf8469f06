//! The key schedule (tcpcrypt slides 26-27), with HKDF-SHA256.
//!
//! ```text
//!  KEM shared secret ─┐           (or, when resuming: the cached next-session key)
//!                     ├─ HKDF (label "session keys") ─┬─► session ID (public)
//!  transcript hash ───┘  (it covers both nonces)      ├─► c2s / s2c stream secrets
//!                                                     ├─► c2s / s2c datagram secrets
//!                                                     ├─► client / server finished values
//!                                                     ├─► next-session key ─► HKDF ("tickets")
//!                                                     │      └─► n single-use tickets (resumption ID, key)
//!                                                     └─► resumption ID (unused since wire v2)
//! ```
//!
//! One extract and one 288-byte expand give all nine outputs, each a separate 32-byte slice
//! of the PRF's output. The shared secret and the expanded block are erased as soon as the
//! outputs are split off.

use cohort_crypto::{CryptoError, CryptoProvider, Secret};

/// The HKDF salt for every label below: a new wire version changes every key.
const SALT: &[u8] = b"cohort-channel/v1";

/// Labels, one per derived secret.
mod label {
    pub const SESSION_KEYS: &[u8] = b"session keys";
    pub const KEY_UPDATE: &[u8] = b"key update";
    pub const TRANSCRIPT: &[u8] = b"cohort-channel/v1 transcript";
    pub const AUTH_KEY: &[u8] = b"auth key";
    pub const TICKETS: &[u8] = b"tickets";
}

/// A 32-byte public identifier of one connection. Unique per connection if one end is
/// honest (it depends on both nonces and on a KEM secret only the two ends know); equal on
/// both ends exactly when no one sits in the middle.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessionId(pub [u8; 32]);

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl std::fmt::Debug for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionId({self})")
    }
}

/// Everything a handshake derives. `Clone` only under the `fuzzing` feature (the harnesses'
/// copies of a connection, `Connection::fork`).
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub struct SessionKeys {
    /// The public session ID.
    pub session_id: SessionId,
    /// Client-to-server stream record secret.
    pub c2s_stream: Secret,
    /// Server-to-client stream record secret.
    pub s2c_stream: Secret,
    /// Client-to-server datagram secret.
    pub c2s_datagram: Secret,
    /// Server-to-client datagram secret.
    pub s2c_datagram: Secret,
    /// The client's key confirmation value: a PRF output over the shared secret, both
    /// nonces and the transcript hash, so it proves the client holds the same secret and
    /// saw the same transcript. Public once sent; it reveals nothing of the other outputs.
    pub client_finished: [u8; 32],
    /// The server's key confirmation value, likewise.
    pub server_finished: [u8; 32],
    /// Key for the next session (resumption).
    pub next_session: Secret,
    /// Version 1 named the next session with this; since version 2 the tickets from
    /// [`derive_tickets`] carry their own IDs and this block is unused (kept so the split
    /// of the other outputs stays as documented).
    pub resume_id: [u8; 32],
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionKeys({}, redacted)", self.session_id)
    }
}

fn expand(provider: &CryptoProvider, secret: &Secret, what: &[u8]) -> Result<Secret, CryptoError> {
    let mut out = Secret::zeroed(32);
    provider
        .hkdf_sha256
        .derive(SALT, secret.expose(), &[what], out.expose_mut())?;
    Ok(out)
}

/// The transcript hash of a ClientHello body and a ServerHello core, each length-prefixed.
pub fn transcript_hash(
    provider: &CryptoProvider,
    client_hello: &[u8],
    server_core: &[u8],
) -> [u8; 32] {
    let ch_len = (client_hello.len() as u32).to_be_bytes();
    let sh_len = (server_core.len() as u32).to_be_bytes();
    provider.sha256.sha256(&[
        label::TRANSCRIPT,
        &ch_len,
        client_hello,
        &sh_len,
        server_core,
    ])
}

/// How many 32-byte outputs one handshake derives.
const OUTPUTS: usize = 9;

/// Derives the session's keys in one HKDF call: an extract over the shared secret, then one
/// expand (info: the label and the transcript hash, which covers both nonces, every offer
/// and every choice) of nine 32-byte blocks, split in order (session ID, c2s and s2c stream, c2s and
/// s2c datagram, client and server finished values, next session, resumption ID). Each output is
/// a separate slice of a PRF's output, so one reveals nothing of the others. The caller
/// erases `shared` by dropping it (a [`Secret`]); the expanded block is erased here.
pub fn derive_session(
    provider: &CryptoProvider,
    shared: &Secret,
    transcript: &[u8; 32],
) -> Result<SessionKeys, CryptoError> {
    let mut okm = Secret::zeroed(32 * OUTPUTS);
    provider.hkdf_sha256.derive(
        SALT,
        shared.expose(),
        &[label::SESSION_KEYS, transcript],
        okm.expose_mut(),
    )?;
    let block = |i: usize| &okm.expose()[32 * i..32 * (i + 1)];
    let array = |i: usize| {
        let mut a = [0u8; 32];
        a.copy_from_slice(block(i));
        a
    };
    Ok(SessionKeys {
        session_id: SessionId(array(0)),
        c2s_stream: Secret::from_slice(block(1)),
        s2c_stream: Secret::from_slice(block(2)),
        c2s_datagram: Secret::from_slice(block(3)),
        s2c_datagram: Secret::from_slice(block(4)),
        client_finished: array(5),
        server_finished: array(6),
        next_session: Secret::from_slice(block(7)),
        resume_id: array(8),
    })
}

/// One single-use resumption ticket: the key a resumed session starts from, and the public
/// ID that names it.
pub struct TicketKey {
    /// The public resumption ID (links to nothing an observer saw).
    pub resume_id: [u8; 32],
    /// The key the resumed session's schedule starts from.
    pub key: Secret,
}

/// Splits a session's next-session key into `count` independent single-use tickets: one
/// HKDF-SHA256 call (ikm the next-session key, info `"tickets"`, 64 bytes per ticket), each
/// ticket a resumption ID then a key. Each output is a separate slice of a PRF's output, so
/// spending or stealing one ticket reveals nothing of the others. The caller drops
/// `next_session` afterwards.
pub fn derive_tickets(
    provider: &CryptoProvider,
    next_session: &Secret,
    count: u8,
) -> Result<Vec<TicketKey>, CryptoError> {
    if count == 0 {
        return Ok(Vec::new());
    }
    let mut okm = Secret::zeroed(64 * usize::from(count));
    provider.hkdf_sha256.derive(
        SALT,
        next_session.expose(),
        &[label::TICKETS],
        okm.expose_mut(),
    )?;
    Ok(okm
        .expose()
        .chunks_exact(64)
        .map(|c| {
            let mut resume_id = [0u8; 32];
            resume_id.copy_from_slice(&c[..32]);
            TicketKey {
                resume_id,
                key: Secret::from_slice(&c[32..]),
            }
        })
        .collect())
}

/// The record secret after a key update.
pub fn next_record_secret(
    provider: &CryptoProvider,
    secret: &Secret,
) -> Result<Secret, CryptoError> {
    expand(provider, secret, label::KEY_UPDATE)
}

/// An authentication tag over the session ID: HMAC-SHA256 under a key derived from the PSK
/// or PAKE secret, with the role as a label so that neither side's tag can be reflected.
pub fn auth_tag(
    provider: &CryptoProvider,
    auth_secret: &[u8],
    role: &[u8],
    session_id: &SessionId,
) -> Result<[u8; 32], CryptoError> {
    let mut key = Secret::zeroed(32);
    provider
        .hkdf_sha256
        .derive(SALT, auth_secret, &[label::AUTH_KEY], key.expose_mut())?;
    let mut out = [0u8; 32];
    provider
        .hmac_sha256
        .new_key(key.expose())
        .sign(&[role, &session_id.0], &mut out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_output_differs_and_depends_on_every_input() {
        let p = CryptoProvider::default_provider();
        let shared = Secret::from_slice(&[1; 32]);
        let k = derive_session(&p, &shared, &[4; 32]).unwrap();
        let outs = [
            k.session_id.0.to_vec(),
            k.c2s_stream.expose().to_vec(),
            k.s2c_stream.expose().to_vec(),
            k.c2s_datagram.expose().to_vec(),
            k.s2c_datagram.expose().to_vec(),
            k.client_finished.to_vec(),
            k.server_finished.to_vec(),
            k.next_session.expose().to_vec(),
            k.resume_id.to_vec(),
        ];
        for i in 0..outs.len() {
            for j in 0..i {
                assert_ne!(outs[i], outs[j]);
            }
        }
        let others = [
            derive_session(&p, &Secret::from_slice(&[9; 32]), &[4; 32]),
            derive_session(&p, &shared, &[9; 32]),
        ];
        for o in others {
            assert_ne!(o.unwrap().session_id, k.session_id);
        }
    }

    #[test]
    fn tickets_are_distinct_and_a_longer_split_extends_a_shorter_one() {
        let p = CryptoProvider::default_provider();
        let next = Secret::from_slice(&[3; 32]);
        assert!(derive_tickets(&p, &next, 0).unwrap().is_empty());
        let four = derive_tickets(&p, &next, 4).unwrap();
        assert_eq!(four.len(), 4);
        let mut seen = std::collections::HashSet::new();
        for t in &four {
            assert!(seen.insert(t.resume_id.to_vec()));
            assert!(seen.insert(t.key.expose().to_vec()));
            assert!(!seen.contains(next.expose()));
        }
        // HKDF's expand is a prefix stream: both ends agree on ticket i whatever the count.
        let two = derive_tickets(&p, &next, 2).unwrap();
        for (a, b) in two.iter().zip(&four) {
            assert_eq!(a.resume_id, b.resume_id);
            assert_eq!(a.key.expose(), b.key.expose());
        }
        let other = derive_tickets(&p, &Secret::from_slice(&[4; 32]), 1).unwrap();
        assert_ne!(other[0].resume_id, four[0].resume_id);
    }
}
