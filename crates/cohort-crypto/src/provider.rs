//! The provider struct and the small traits its backends implement. Owns the algorithm
//! names, the traits and [`CryptoProvider`] itself; it must not name a backend (the default
//! provider is chosen in the crate root, above both this module and `aws_lc`).

use crate::secret::Secret;
use std::any::Any;
use std::fmt;

/// Nonce length of every AEAD the provider offers.
pub const AEAD_NONCE_LEN: usize = 12;
/// Tag length of every AEAD the provider offers.
pub const AEAD_TAG_LEN: usize = 16;

/// Why a crypto operation failed. Deliberately without detail: a caller that got this from
/// input a peer sent must not learn (or leak) more than "it failed".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CryptoError {
    /// A key, nonce or input had a length or encoding the algorithm does not accept.
    InvalidInput,
    /// Authentication or decryption failed.
    Failed,
}

impl fmt::Display for CryptoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CryptoError::InvalidInput => f.write_str("invalid key or input length"),
            CryptoError::Failed => f.write_str("cryptographic operation failed"),
        }
    }
}

impl std::error::Error for CryptoError {}

/// An AEAD algorithm, as data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AeadAlgorithm {
    /// AES-128-GCM (NIST SP 800-38D), 16-byte key.
    Aes128Gcm,
    /// AES-256-GCM, 32-byte key.
    Aes256Gcm,
    /// ChaCha20-Poly1305 (RFC 8439), 32-byte key.
    ChaCha20Poly1305,
}

impl AeadAlgorithm {
    /// Key length in bytes.
    pub const fn key_len(self) -> usize {
        match self {
            AeadAlgorithm::Aes128Gcm => 16,
            AeadAlgorithm::Aes256Gcm | AeadAlgorithm::ChaCha20Poly1305 => 32,
        }
    }
}

/// A key-encapsulation mechanism, as data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KemAlgorithm {
    /// X25519 Diffie-Hellman used as a KEM (the ciphertext is an ephemeral public key).
    X25519,
    /// ML-KEM-768 (FIPS 203).
    MlKem768,
    /// X25519 and ML-KEM-768 together; the shared secret is both outputs concatenated.
    X25519MlKem768,
    /// tcpcrypt's RSA KEM: RSA-2048 with public exponent 3 and RSAES-OAEP (SHA-256,
    /// MGF1-SHA256, empty label) encrypting a random 32-byte shared secret. The public key
    /// is the 256-byte big-endian modulus, the ciphertext 256 bytes. Encapsulation is cheap
    /// and decapsulation expensive. Not post-quantum and slow to generate: the default
    /// provider lists it last.
    Rsa2048E3Oaep,
}

/// An AEAD key ready for use.
pub trait AeadKey: Send + Sync {
    /// The algorithm this key is for.
    fn algorithm(&self) -> AeadAlgorithm;

    /// Encrypts `in_out` in place and returns the tag over `aad` and the ciphertext.
    fn seal_in_place(
        &self,
        nonce: &[u8; AEAD_NONCE_LEN],
        aad: &[u8],
        in_out: &mut [u8],
    ) -> Result<[u8; AEAD_TAG_LEN], CryptoError>;

    /// Checks the tag at the end of `ciphertext_and_tag` and decrypts in place, returning the
    /// plaintext (the front of the buffer). On failure the buffer's contents are unspecified.
    fn open_in_place<'a>(
        &self,
        nonce: &[u8; AEAD_NONCE_LEN],
        aad: &[u8],
        ciphertext_and_tag: &'a mut [u8],
    ) -> Result<&'a mut [u8], CryptoError>;
}

/// Makes AEAD keys.
pub trait AeadFactory: Send + Sync {
    /// A key for `algorithm`; `key` must be `algorithm.key_len()` bytes.
    fn new_key(
        &self,
        algorithm: AeadAlgorithm,
        key: &[u8],
    ) -> Result<Box<dyn AeadKey>, CryptoError>;
}

/// A keyed MAC or PRF with a fixed output length.
pub trait MacKey: Send + Sync {
    /// Output length in bytes.
    fn output_len(&self) -> usize;
    /// Writes the MAC of the concatenation of `parts` into `out`, which must be
    /// `output_len()` bytes or shorter (then the output is truncated).
    fn sign(&self, parts: &[&[u8]], out: &mut [u8]);
}

/// Makes MAC keys of one algorithm.
pub trait MacFactory: Send + Sync {
    /// A key; any length is accepted (HMAC hashes long keys).
    fn new_key(&self, key: &[u8]) -> Box<dyn MacKey>;
}

/// Keyed hashing with a 32-byte key (keyed BLAKE3).
pub trait KeyedHash: Send + Sync {
    /// Writes the keyed hash of the concatenation of `parts` into `out` (any length: the
    /// output is extendable).
    fn hash(&self, key: &[u8; 32], parts: &[&[u8]], out: &mut [u8]);
}

/// A single-block cipher key (AES-128), for constructions built on a PRP: UMAC's KDF and
/// PDF, and the keystreams of the partial MAC and bit scattering.
pub trait BlockCipher: Send + Sync {
    /// Encrypts each 16-byte block in place (ECB: the caller builds counters).
    fn encrypt_blocks(&self, blocks: &mut [[u8; 16]]);
}

/// Makes block cipher keys.
pub trait BlockCipherFactory: Send + Sync {
    /// An AES-128 key; `key` must be 16 bytes.
    fn aes128(&self, key: &[u8]) -> Result<Box<dyn BlockCipher>, CryptoError>;
}

/// HKDF with SHA-256 (RFC 5869).
pub trait Hkdf: Send + Sync {
    /// HKDF-Extract then HKDF-Expand: `out.len()` bytes (1 to 255 * 32) from `ikm`, `salt`
    /// and the concatenation of `info`.
    fn derive(
        &self,
        salt: &[u8],
        ikm: &[u8],
        info: &[&[u8]],
        out: &mut [u8],
    ) -> Result<(), CryptoError>;
}

/// SHA-256, for transcript hashes and Merkle trees.
pub trait Digest: Send + Sync {
    /// The SHA-256 hash of the concatenation of `parts`.
    fn sha256(&self, parts: &[&[u8]]) -> [u8; 32];
}

/// Randomness from the operating system. Protocol cores take an injected RNG instead; this
/// is for drivers and key generation.
pub trait SecureRandom: Send + Sync {
    /// Fills `out` with random bytes.
    fn fill(&self, out: &mut [u8]) -> Result<(), CryptoError>;
}

/// A key-encapsulation mechanism (X25519 as a KEM, ML-KEM-768, both, or tcpcrypt's RSA).
pub trait KemFactory: Send + Sync {
    /// Which KEM this is.
    fn algorithm(&self) -> KemAlgorithm;
    /// A fresh key pair: (decapsulation secret, encapsulation public key).
    fn generate(&self) -> Result<(Secret, Vec<u8>), CryptoError>;
    /// Encapsulates to `public`: (ciphertext, shared secret).
    fn encapsulate(&self, public: &[u8]) -> Result<(Vec<u8>, Secret), CryptoError>;
    /// Recovers the shared secret from `ciphertext` with the decapsulation secret.
    fn decapsulate(&self, secret: &Secret, ciphertext: &[u8]) -> Result<Secret, CryptoError>;
}

/// A signature scheme (Ed25519).
pub trait SignatureScheme: Send + Sync {
    /// A fresh key pair: (secret seed, public key).
    fn generate(&self) -> Result<(Secret, Vec<u8>), CryptoError>;
    /// The public key for a secret seed.
    fn public_key(&self, secret: &Secret) -> Result<Vec<u8>, CryptoError>;
    /// Signs `message`.
    fn sign(&self, secret: &Secret, message: &[u8]) -> Result<Vec<u8>, CryptoError>;
    /// Checks `signature` on `message` under `public`.
    fn verify(&self, public: &[u8], message: &[u8], signature: &[u8]) -> Result<(), CryptoError>;

    /// The seed parsed once into a key that signs many messages
    /// ([`sign_with_key`](Self::sign_with_key)), with its public key; `None` (the default) if
    /// this scheme keeps no such key and signs from the seed every time. For Ed25519,
    /// parsing the seed is a scalar multiplication, as costly as the signature itself.
    fn signing_key(&self, secret: &Secret) -> Result<Option<SigningKey>, CryptoError> {
        let _ = secret;
        Ok(None)
    }

    /// Signs `message` with `key`, the caller's [`signing_key`](Self::signing_key) for
    /// `secret` (from this scheme or another), if this scheme made it; otherwise (the
    /// default, and for a key of another scheme) as [`sign`](Self::sign) from `secret`.
    /// The signature is the same either way.
    fn sign_with_key(
        &self,
        key: Option<&SigningKey>,
        secret: &Secret,
        message: &[u8],
    ) -> Result<Vec<u8>, CryptoError> {
        let _ = key;
        self.sign(secret, message)
    }
}

/// A signing key a [`SignatureScheme`] parsed from its seed ([`SignatureScheme::signing_key`]),
/// kept beside the seed by whoever signs often (cohort-channel's `Identity`). Opaque: only
/// the scheme that made it reads it. It holds secret key material; the scheme's key type
/// wipes it when dropped (each backend says how).
pub struct SigningKey {
    key: Box<dyn Any + Send + Sync>,
    public: Vec<u8>,
}

impl SigningKey {
    /// Wraps a scheme's own key type, with the public key it belongs to.
    pub fn new<K: Any + Send + Sync>(key: K, public: Vec<u8>) -> SigningKey {
        SigningKey {
            key: Box::new(key),
            public,
        }
    }

    /// The scheme's key, if it is of type `K` (a scheme checks that a key is its own).
    pub fn get<K: Any>(&self) -> Option<&K> {
        self.key.downcast_ref()
    }

    /// The public key.
    pub fn public_key(&self) -> &[u8] {
        &self.public
    }
}

impl fmt::Debug for SigningKey {
    /// The public key only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

/// Everything cohort's protocols need from cryptography, as trait objects.
///
/// Build one with [`CryptoProvider::default_provider`]; override one piece with struct-update
/// syntax (`CryptoProvider { aead: &MY_AEAD, ..CryptoProvider::default_provider() }`).
#[derive(Clone, Copy)]
pub struct CryptoProvider {
    /// Backend name, for logs and benchmarks.
    pub name: &'static str,
    /// AES-GCM and ChaCha20-Poly1305.
    pub aead: &'static dyn AeadFactory,
    /// HMAC-SHA256.
    pub hmac_sha256: &'static dyn MacFactory,
    /// Keyed BLAKE3.
    pub keyed_blake3: &'static dyn KeyedHash,
    /// AES-128 single blocks.
    pub aes_block: &'static dyn BlockCipherFactory,
    /// HKDF-SHA256.
    pub hkdf_sha256: &'static dyn Hkdf,
    /// SHA-256.
    pub sha256: &'static dyn Digest,
    /// Operating-system randomness.
    pub random: &'static dyn SecureRandom,
    /// KEMs, in preference order.
    pub kems: &'static [&'static dyn KemFactory],
    /// Ed25519.
    pub ed25519: &'static dyn SignatureScheme,
}

impl CryptoProvider {
    /// The KEM for `algorithm`, if this provider has it.
    pub fn kem(&self, algorithm: KemAlgorithm) -> Option<&'static dyn KemFactory> {
        self.kems
            .iter()
            .copied()
            .find(|k| k.algorithm() == algorithm)
    }
}

impl fmt::Debug for CryptoProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CryptoProvider")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}
