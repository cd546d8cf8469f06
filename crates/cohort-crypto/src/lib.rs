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
