#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod aws_lc;
mod provider;
mod secret;
#[cfg(feature = "seeded")]
pub mod seeded;

pub use provider::{
    AeadAlgorithm, AeadFactory, AeadKey, BlockCipher, BlockCipherFactory, CryptoError,
    CryptoProvider, Digest, Hkdf, KemAlgorithm, KemFactory, KeyedHash, MacFactory, MacKey,
    SecureRandom, SignatureScheme, SigningKey, AEAD_NONCE_LEN, AEAD_TAG_LEN,
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
