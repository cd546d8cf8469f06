//! Password authentication with SPAKE2 (the maintained `spake2` crate, Ed25519 group),
//! bound to the session ID.
//!
//! The client's SPAKE2 message rides in the ClientHello and the server's in the ServerHello,
//! so password mode costs no extra round trip. Both ends then MAC the session ID under a key
//! derived from the SPAKE2 output (see [`crate::schedule::auth_tag`]). A man in the middle
//! who runs two KEM exchanges sees two different session IDs and cannot MAC either without
//! the password; each attempt tests one guess online, and nothing it sees can be searched
//! offline.

use cohort_crypto::Secret;
use spake2::{Ed25519Group, Identity, Password, Spake2};

const CLIENT_ID: &[u8] = b"cohort-channel/v1 client";
const SERVER_ID: &[u8] = b"cohort-channel/v1 server";

/// One side's SPAKE2 state between sending its message and receiving the peer's.
pub struct PakeState(Spake2<Ed25519Group>);

impl std::fmt::Debug for PakeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PakeState(redacted)")
    }
}

/// The client's start: its state and the message for the ClientHello.
pub fn start_client(password: &Secret) -> (PakeState, Vec<u8>) {
    let (state, msg) = Spake2::<Ed25519Group>::start_a(
        &Password::new(password.expose()),
        &Identity::new(CLIENT_ID),
        &Identity::new(SERVER_ID),
    );
    (PakeState(state), msg)
}

/// The server's start: its state and the message for the ServerHello.
pub fn start_server(password: &Secret) -> (PakeState, Vec<u8>) {
    let (state, msg) = Spake2::<Ed25519Group>::start_b(
        &Password::new(password.expose()),
        &Identity::new(CLIENT_ID),
        &Identity::new(SERVER_ID),
    );
    (PakeState(state), msg)
}

impl PakeState {
    /// Finishes with the peer's message: the shared key (equal on both ends only if both
    /// used the same password), or `None` for a malformed message.
    pub fn finish(self, peer_message: &[u8]) -> Option<Secret> {
        self.0.finish(peer_message).ok().map(Secret::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_password_same_key_different_password_different_key() {
        let pw = Secret::from_slice(b"correct horse");
        let (c, cm) = start_client(&pw);
        let (s, sm) = start_server(&pw);
        let kc = c.finish(&sm).unwrap();
        let ks = s.finish(&cm).unwrap();
        assert_eq!(kc.expose(), ks.expose());

        let (c, cm) = start_client(&pw);
        let (s, sm) = start_server(&Secret::from_slice(b"battery staple"));
        let kc = c.finish(&sm).unwrap();
        let ks = s.finish(&cm).unwrap();
        assert_ne!(kc.expose(), ks.expose());

        let (c, _) = start_client(&pw);
        assert!(c.finish(&[0u8; 5]).is_none());
    }
}
