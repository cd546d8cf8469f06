//! Client and server configuration.

use crate::identity::PublicKey;
use crate::suite::{AuthMode, KemSuite};
use cohort_crypto::Secret;
use cohort_gears::{GearId, GearKind};
use std::time::Duration;

/// The record gears offered by default: AEADs only, so the channel always encrypts.
pub const DEFAULT_GEARS: [GearId; 3] = [
    GearId::Aes128Gcm,
    GearId::ChaCha20Poly1305,
    GearId::Aes256Gcm,
];

/// Keys are updated after this many records at most (gears with lower usage limits update
/// sooner).
pub const DEFAULT_KEY_UPDATE_AFTER: u64 = 1 << 32;

/// The shortest pre-shared key accepted, in bytes. A man in the middle (or any client, in
/// front of a server) sees a MAC under the PSK and can test guesses offline, so a PSK must
/// be random key material, never a human-chosen secret (use password mode for those).
pub const MIN_PSK_LEN: usize = 32;

/// Single-use resumption tickets a client keeps per server, and a server issues per
/// handshake at most, by default: more than the connections a client usually opens at once.
pub const DEFAULT_TICKETS: u8 = 8;

/// How the client authenticates the connection. It offers exactly this mode.
#[derive(Debug)]
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub enum ClientAuth {
    /// Opportunistic encryption; compare session IDs out of band to detect a man in the
    /// middle.
    None,
    /// The server must sign the session ID with this Ed25519 key.
    ServerSignature {
        /// The server key the client expects (from `cohort keygen` on the server).
        pinned: PublicKey,
    },
    /// Both sides MAC the session ID with this pre-shared key: random key material of at
    /// least [`MIN_PSK_LEN`] bytes.
    Psk(Secret),
    /// Both sides run SPAKE2 with this password.
    Password(Secret),
}

impl ClientAuth {
    /// The mode this offers.
    pub fn mode(&self) -> AuthMode {
        match self {
            ClientAuth::None => AuthMode::None,
            ClientAuth::ServerSignature { .. } => AuthMode::ServerSignature,
            ClientAuth::Psk(_) => AuthMode::Psk,
            ClientAuth::Password(_) => AuthMode::Password,
        }
    }
}

/// What a client offers and requires.
#[derive(Debug)]
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub struct ClientConfig {
    /// KEM suites offered, preference first; the client sends a key share for the first.
    pub kems: Vec<KemSuite>,
    /// Record gears offered, preference first. MAC-only gears make an
    /// authentication-only channel; offer only AEADs to require encryption.
    pub gears: Vec<GearId>,
    /// The authentication mode the client requires.
    pub auth: ClientAuth,
    /// The weakest gear (in forgery bits) the client accepts on received records.
    pub floor_bits: f64,
    /// How long one ephemeral key pair is reused across connections to amortize key
    /// generation (tcpcrypt clients kept theirs for a while). Zero makes a fresh pair per
    /// connection. Forward secrecy for a session starts when its key pair is discarded.
    pub ephemeral_lifetime: Duration,
    /// Whether to cache sessions and ask to resume them.
    pub resumption: bool,
    /// Single-use tickets kept per server (at most 16): each session asks the server for
    /// enough to refill the pool, so this many connections at once can all resume. 0
    /// turns resumption off.
    pub ticket_pool: u8,
    /// Update record keys after this many records per direction (at most).
    pub key_update_after: u64,
}

impl ClientConfig {
    /// Defaults: the hybrid KEM first, then the others; AEAD gears; a 64-bit floor;
    /// ephemeral keys reused for 30 s; resumption on.
    pub fn new(auth: ClientAuth) -> Self {
        ClientConfig {
            kems: vec![
                KemSuite::X25519MlKem768,
                KemSuite::MlKem768,
                KemSuite::X25519,
                KemSuite::Rsa2048E3Oaep,
            ],
            gears: DEFAULT_GEARS.to_vec(),
            auth,
            floor_bits: 64.0,
            ephemeral_lifetime: Duration::from_secs(30),
            resumption: true,
            ticket_pool: DEFAULT_TICKETS,
            key_update_after: DEFAULT_KEY_UPDATE_AFTER,
        }
    }

    /// The same, with `kem` as the only KEM offered.
    pub fn with_kem(mut self, kem: KemSuite) -> Self {
        self.kems = vec![kem];
        self
    }
}

/// What a server accepts, and its credentials.
#[derive(Debug)]
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub struct ServerConfig {
    /// KEM suites accepted. The server takes the suite of the client's key share if it is
    /// here (there is no retry round: a client must lead with a suite the server accepts).
    pub kems: Vec<KemSuite>,
    /// Record gears allowed, server preference first.
    pub gears: Vec<GearId>,
    /// Authentication modes accepted. `ServerSignature` needs a batch signer in the driver,
    /// `Psk` needs `psk`, `Password` needs `password`.
    pub auth_modes: Vec<AuthMode>,
    /// The server's public identity, for `ServerSignature` (the driver's batch signer holds
    /// the secret).
    pub identity: Option<PublicKey>,
    /// The pre-shared key, for `Psk`: random key material of at least [`MIN_PSK_LEN`]
    /// bytes (a shorter one disables `Psk`).
    pub psk: Option<Secret>,
    /// The password, for `Password`.
    pub password: Option<Secret>,
    /// The weakest gear (in forgery bits) the server allows.
    pub floor_bits: f64,
    /// Most cached sessions; the oldest is evicted first.
    pub resumption_capacity: usize,
    /// How long a cached session may be resumed.
    pub resumption_lifetime: Duration,
    /// Most single-use tickets one handshake issues (at most 16; the client says how many
    /// it wants). Each takes one place in the resumption cache.
    pub max_tickets: u8,
    /// Update record keys after this many records per direction (at most).
    pub key_update_after: u64,
}

impl ServerConfig {
    /// Defaults: every KEM suite; AEAD gears; only `AuthMode::None` (add modes together
    /// with their credentials); a 64-bit floor; 10 000 cached sessions for up to 1 hour.
    pub fn new() -> Self {
        ServerConfig {
            kems: crate::suite::ALL_KEM_SUITES.to_vec(),
            gears: DEFAULT_GEARS.to_vec(),
            auth_modes: vec![AuthMode::None],
            identity: None,
            psk: None,
            password: None,
            floor_bits: 64.0,
            resumption_capacity: 10_000,
            resumption_lifetime: Duration::from_secs(3600),
            max_tickets: DEFAULT_TICKETS,
            key_update_after: DEFAULT_KEY_UPDATE_AFTER,
        }
    }

    /// Whether the server can authenticate with `mode`.
    pub fn supports(&self, mode: AuthMode) -> bool {
        self.auth_modes.contains(&mode)
            && match mode {
                AuthMode::None => true,
                AuthMode::ServerSignature => self.identity.is_some(),
                AuthMode::Psk => self.psk.as_ref().is_some_and(|k| k.len() >= MIN_PSK_LEN),
                AuthMode::Password => self.password.is_some(),
            }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether every gear in `gears` encrypts.
pub fn all_aead(gears: &[GearId]) -> bool {
    gears.iter().all(|g| g.info().kind == GearKind::Aead)
}
