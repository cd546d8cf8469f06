//! The key schedule (tcpcrypt slides 26-27), with HKDF-SHA256.
//!
//! ```text
//!  KEM shared secret ─┐                       (or, when resuming: the cached next-session key)
//!  client nonce ──────┼─ HKDF ─► master ─┬─► session ID            (public, unique per connection)
//!  server nonce ──────┤                  ├─► c2s / s2c stream keys  (record gears, per direction)
//!  transcript hash ───┘                  ├─► c2s / s2c datagram keys
//!                                        ├─► client / server finished keys
//!                                        └─► next-session key ─► resumption ID
//! ```
//!
//! The shared secret and the master secret are erased as soon as everything is derived from
//! them; each output is an independent HKDF label, so knowing one reveals none of the others.

use cohort_crypto::{CryptoError, CryptoProvider, Secret};

/// The HKDF salt for every label below: a new wire version changes every key.
const SALT: &[u8] = b"cohort-channel/v1";

/// Labels, one per derived secret.
mod label {
    pub const MASTER: &[u8] = b"master";
    pub const SESSION_ID: &[u8] = b"session id";
    pub const C2S_STREAM: &[u8] = b"c2s stream";
    pub const S2C_STREAM: &[u8] = b"s2c stream";
    pub const C2S_DATAGRAM: &[u8] = b"c2s datagram";
    pub const S2C_DATAGRAM: &[u8] = b"s2c datagram";
    pub const CLIENT_FINISHED: &[u8] = b"client finished";
    pub const SERVER_FINISHED: &[u8] = b"server finished";
    pub const NEXT_SESSION: &[u8] = b"next session";
    pub const RESUME_ID: &[u8] = b"resume id";
    pub const KEY_UPDATE: &[u8] = b"key update";
    pub const TRANSCRIPT: &[u8] = b"cohort-channel/v1 transcript";
    pub const AUTH_KEY: &[u8] = b"auth key";
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

/// Everything a handshake derives.
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
    /// Key for the client's finished MAC.
    pub client_finished: Secret,
    /// Key for the server's finished MAC.
    pub server_finished: Secret,
    /// Key for the next session (resumption).
    pub next_session: Secret,
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionKeys({}, redacted)", self.session_id)
    }
}

fn expand(provider: &CryptoProvider, master: &Secret, what: &[u8]) -> Result<Secret, CryptoError> {
    let mut out = Secret::zeroed(32);
    provider
        .hkdf_sha256
        .derive(SALT, master.expose(), &[what], out.expose_mut())?;
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

/// Derives the session's keys; `shared` is erased by the caller dropping it (a [`Secret`]).
pub fn derive_session(
    provider: &CryptoProvider,
    shared: &Secret,
    client_nonce: &[u8; 32],
    server_nonce: &[u8; 32],
    transcript: &[u8; 32],
) -> Result<SessionKeys, CryptoError> {
    let mut master = Secret::zeroed(32);
    provider.hkdf_sha256.derive(
        SALT,
        shared.expose(),
        &[label::MASTER, client_nonce, server_nonce, transcript],
        master.expose_mut(),
    )?;
    let sid = expand(provider, &master, label::SESSION_ID)?;
    let mut session_id = [0u8; 32];
    session_id.copy_from_slice(sid.expose());
    Ok(SessionKeys {
        session_id: SessionId(session_id),
        c2s_stream: expand(provider, &master, label::C2S_STREAM)?,
        s2c_stream: expand(provider, &master, label::S2C_STREAM)?,
        c2s_datagram: expand(provider, &master, label::C2S_DATAGRAM)?,
        s2c_datagram: expand(provider, &master, label::S2C_DATAGRAM)?,
        client_finished: expand(provider, &master, label::CLIENT_FINISHED)?,
        server_finished: expand(provider, &master, label::SERVER_FINISHED)?,
        next_session: expand(provider, &master, label::NEXT_SESSION)?,
    })
    // `master` is dropped (and zeroized) here.
}

/// The public name of a cached session: derived from its next-session key, so it links to
/// nothing an observer saw (not the old session ID).
pub fn resume_id(
    provider: &CryptoProvider,
    next_session: &Secret,
) -> Result<[u8; 32], CryptoError> {
    let id = expand(provider, next_session, label::RESUME_ID)?;
    let mut out = [0u8; 32];
    out.copy_from_slice(id.expose());
    Ok(out)
}

/// The record secret after a key update.
pub fn next_record_secret(
    provider: &CryptoProvider,
    secret: &Secret,
) -> Result<Secret, CryptoError> {
    expand(provider, secret, label::KEY_UPDATE)
}

/// A finished MAC: HMAC-SHA256 over the transcript hash with a finished key.
pub fn finished_mac(provider: &CryptoProvider, key: &Secret, transcript: &[u8; 32]) -> [u8; 32] {
    let mut out = [0u8; 32];
    provider
        .hmac_sha256
        .new_key(key.expose())
        .sign(&[transcript], &mut out);
    out
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
        let k = derive_session(&p, &shared, &[2; 32], &[3; 32], &[4; 32]).unwrap();
        let outs = [
            k.session_id.0.to_vec(),
            k.c2s_stream.expose().to_vec(),
            k.s2c_stream.expose().to_vec(),
            k.c2s_datagram.expose().to_vec(),
            k.s2c_datagram.expose().to_vec(),
            k.client_finished.expose().to_vec(),
            k.server_finished.expose().to_vec(),
            k.next_session.expose().to_vec(),
        ];
        for i in 0..outs.len() {
            for j in 0..i {
                assert_ne!(outs[i], outs[j]);
            }
        }
        let others = [
            derive_session(
                &p,
                &Secret::from_slice(&[9; 32]),
                &[2; 32],
                &[3; 32],
                &[4; 32],
            ),
            derive_session(&p, &shared, &[9; 32], &[3; 32], &[4; 32]),
            derive_session(&p, &shared, &[2; 32], &[9; 32], &[4; 32]),
            derive_session(&p, &shared, &[2; 32], &[3; 32], &[9; 32]),
        ];
        for o in others {
            assert_ne!(o.unwrap().session_id, k.session_id);
        }
        assert_ne!(resume_id(&p, &k.next_session).unwrap(), k.session_id.0);
    }
}
