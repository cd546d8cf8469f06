//! What the two ends negotiate: KEM suites and authentication modes, with their wire ids.

use cohort_crypto::KemAlgorithm;
use std::fmt;
use std::str::FromStr;

/// A key-encapsulation suite. The client generates the key pair (the expensive step for RSA
/// and ML-KEM decapsulation); the server only encapsulates (tcpcrypt slide 9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KemSuite {
    /// X25519 used as a KEM.
    X25519,
    /// ML-KEM-768 (FIPS 203).
    MlKem768,
    /// X25519 and ML-KEM-768 together (the default): secure if either is.
    X25519MlKem768,
    /// RSA-2048 with e = 3 and OAEP-SHA256: the literal tcpcrypt suite. Encryption with
    /// e = 3 is very cheap for the server; the client pays for key generation and decryption.
    Rsa2048E3Oaep,
}

/// Every KEM suite, in default preference order.
pub const ALL_KEM_SUITES: [KemSuite; 4] = [
    KemSuite::X25519MlKem768,
    KemSuite::MlKem768,
    KemSuite::X25519,
    KemSuite::Rsa2048E3Oaep,
];

impl KemSuite {
    /// The wire id.
    pub const fn to_u8(self) -> u8 {
        match self {
            KemSuite::X25519 => 1,
            KemSuite::MlKem768 => 2,
            KemSuite::X25519MlKem768 => 3,
            KemSuite::Rsa2048E3Oaep => 4,
        }
    }

    /// The suite with wire id `id`.
    pub fn from_u8(id: u8) -> Option<KemSuite> {
        ALL_KEM_SUITES.into_iter().find(|s| s.to_u8() == id)
    }

    /// The name used on the command line and in logs.
    pub const fn name(self) -> &'static str {
        match self {
            KemSuite::X25519 => "x25519",
            KemSuite::MlKem768 => "mlkem768",
            KemSuite::X25519MlKem768 => "x25519-mlkem768",
            KemSuite::Rsa2048E3Oaep => "rsa2048-e3",
        }
    }

    /// The provider algorithm.
    pub const fn algorithm(self) -> KemAlgorithm {
        match self {
            KemSuite::X25519 => KemAlgorithm::X25519,
            KemSuite::MlKem768 => KemAlgorithm::MlKem768,
            KemSuite::X25519MlKem768 => KemAlgorithm::X25519MlKem768,
            KemSuite::Rsa2048E3Oaep => KemAlgorithm::Rsa2048E3Oaep,
        }
    }
}

impl fmt::Display for KemSuite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KemSuite {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ALL_KEM_SUITES
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownName {
                what: "KEM",
                known: ALL_KEM_SUITES.iter().map(|k| k.name()).collect(),
            })
    }
}

/// How a connection authenticates its session ID (tcpcrypt slide 17). Chosen per connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AuthMode {
    /// Opportunistic: stops passive eavesdroppers only. Compare session IDs out of band to
    /// detect a man in the middle.
    None,
    /// The server signs its session IDs with its Ed25519 identity, in batches (a Merkle root
    /// over many session IDs, one signature per batch); the client checks a pinned key.
    ServerSignature,
    /// Both sides MAC the session ID with a pre-shared key (random key material of at least
    /// 32 bytes: whoever connects sees a MAC under it and may search a weak key offline).
    Psk,
    /// Both sides run SPAKE2 with a password and MAC the session ID with its key: an
    /// attacker gets one online guess per connection and nothing to search offline.
    Password,
}

/// Every authentication mode.
pub const ALL_AUTH_MODES: [AuthMode; 4] = [
    AuthMode::None,
    AuthMode::ServerSignature,
    AuthMode::Psk,
    AuthMode::Password,
];

impl AuthMode {
    /// The wire id.
    pub const fn to_u8(self) -> u8 {
        match self {
            AuthMode::None => 0,
            AuthMode::ServerSignature => 1,
            AuthMode::Psk => 2,
            AuthMode::Password => 3,
        }
    }

    /// The mode with wire id `id`.
    pub fn from_u8(id: u8) -> Option<AuthMode> {
        ALL_AUTH_MODES.into_iter().find(|s| s.to_u8() == id)
    }

    /// The name used on the command line and in logs.
    pub const fn name(self) -> &'static str {
        match self {
            AuthMode::None => "none",
            AuthMode::ServerSignature => "signature",
            AuthMode::Psk => "psk",
            AuthMode::Password => "password",
        }
    }
}

impl fmt::Display for AuthMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AuthMode {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ALL_AUTH_MODES
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownName {
                what: "authentication mode",
                known: ALL_AUTH_MODES.iter().map(|k| k.name()).collect(),
            })
    }
}

/// A name that is not a known suite or mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownName {
    what: &'static str,
    known: Vec<&'static str>,
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown {}; known: {}", self.what, self.known.join(", "))
    }
}

impl std::error::Error for UnknownName {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_round_trip() {
        for k in ALL_KEM_SUITES {
            assert_eq!(KemSuite::from_u8(k.to_u8()), Some(k));
            assert_eq!(k.name().parse::<KemSuite>(), Ok(k));
        }
        for a in ALL_AUTH_MODES {
            assert_eq!(AuthMode::from_u8(a.to_u8()), Some(a));
            assert_eq!(a.name().parse::<AuthMode>(), Ok(a));
        }
        assert_eq!(KemSuite::from_u8(0), None);
        assert_eq!(AuthMode::from_u8(4), None);
        assert!("rsa".parse::<KemSuite>().is_err());
    }
}
