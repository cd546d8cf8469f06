//! cohort's crypto provider. Protocol crates name algorithms and take a [`CryptoProvider`]
//! from their caller; they never call a crypto library themselves.
//!
//! ```text
//!   protocol crate ── CryptoProvider { aead, hmac_sha256, keyed_blake3, aes_block, hkdf, ... }
//!                           │  (trait objects; one backend per provider)
//!                           ▼
//!                    aws-lc-rs (AEAD, HMAC, HKDF, X25519, ML-KEM, RSA-OAEP, Ed25519, randomness)
//!                    RustCrypto `aes` (single AES blocks for UMAC's KDF/PDF), `blake3`,
//!                    `rsa` (only to generate RSA keys with e = 3)
//! ```
//!
//! Algorithm *choices* ([`AeadAlgorithm`], [`KemAlgorithm`]) are plain data apart from
//! implementations. Secrets live in [`Secret`], which is zeroized on drop and never printed.
//! Tag comparison is in constant time ([`ct_eq`]).
//!
//! # Example
//! ```
//! use cohort_crypto::{AeadAlgorithm, CryptoProvider};
//! let provider = CryptoProvider::default_provider();
//! let key = provider.aead.new_key(AeadAlgorithm::Aes128Gcm, &[7u8; 16]).unwrap();
//! let nonce = [0u8; 12];
//! let mut msg = *b"attack at dawn";
//! let tag = key.seal_in_place(&nonce, b"header", &mut msg).unwrap();
//! let mut sealed = msg.to_vec();
//! sealed.extend_from_slice(&tag);
//! let opened = key.open_in_place(&nonce, b"header", &mut sealed).unwrap();
//! assert_eq!(opened, b"attack at dawn");
//! ```
#![forbid(unsafe_code)]

mod aws_lc;
mod provider;
mod secret;

pub use provider::{
    AeadAlgorithm, AeadFactory, AeadKey, BlockCipher, BlockCipherFactory, CryptoError,
    CryptoProvider, Digest, Hkdf, KemAlgorithm, KemFactory, KeyedHash, MacFactory, MacKey,
    SecureRandom, SignatureScheme, AEAD_NONCE_LEN, AEAD_TAG_LEN,
};
pub use secret::{ct_eq, Secret};

impl CryptoProvider {
    /// The default backend: aws-lc-rs, with RustCrypto `aes` and `blake3` where aws-lc-rs has
    /// no matching API.
    ///
    /// Defined here, in the crate root, so that `provider` (the traits) never reaches up into
    /// `aws_lc` (a backend implementing them).
    pub fn default_provider() -> CryptoProvider {
        aws_lc::PROVIDER
    }
}

/// Raw primitives behind the provider's algorithms, exposed only so that published test
/// vectors can be run through exactly the code the provider uses. Not a stable API; protocol
/// crates must go through [`CryptoProvider`].
#[doc(hidden)]
pub mod hazmat {
    use crate::{CryptoError, Secret};

    /// RSAES-OAEP decryption (RFC 8017 §7.1.2) with SHA-256 and MGF1-SHA256 under `label`,
    /// by aws-lc-rs: the same routine [`crate::KemAlgorithm::Rsa2048E3Oaep`] decapsulates
    /// with (there with an empty label).
    ///
    /// `private_key_pkcs8` is an RSA private key as PKCS#8 v1 DER, 2048 to 8192 bits, any
    /// valid public exponent. Errors: [`CryptoError::InvalidInput`] for a key that does not
    /// parse or a ciphertext whose length is not the modulus length;
    /// [`CryptoError::Failed`] for every decryption failure (one error, so that callers cannot
    /// leak which check failed).
    pub fn rsa_oaep_sha256_decrypt(
        private_key_pkcs8: &[u8],
        label: &[u8],
        ciphertext: &[u8],
    ) -> Result<Secret, CryptoError> {
        crate::aws_lc::rsa_oaep_sha256_decrypt(private_key_pkcs8, label, ciphertext)
    }
}
