//! The default backend: aws-lc-rs, plus RustCrypto `aes` for single AES blocks and `blake3`.

use crate::provider::*;
use crate::Secret;
use aws_lc_rs::encoding::AsBigEndian;
use aws_lc_rs::signature::KeyPair;
use aws_lc_rs::{aead, agreement, digest, hkdf, hmac, kem, rand, signature};

pub(crate) const PROVIDER: CryptoProvider = CryptoProvider {
    name: "aws-lc-rs",
    aead: &AwsLcAead,
    hmac_sha256: &AwsLcHmacSha256,
    keyed_blake3: &Blake3,
    aes_block: &RustCryptoAes,
    hkdf_sha256: &AwsLcHkdf,
    sha256: &AwsLcSha256,
    random: &AwsLcRandom,
    kems: &[&X25519MlKem768Kem, &MlKem768Kem, &X25519Kem],
    ed25519: &AwsLcEd25519,
};

// ---- AEAD -------------------------------------------------------------------------------

struct AwsLcAead;

struct AwsLcAeadKey {
    algorithm: AeadAlgorithm,
    key: aead::LessSafeKey,
}

impl AeadFactory for AwsLcAead {
    fn new_key(
        &self,
        algorithm: AeadAlgorithm,
        key: &[u8],
    ) -> Result<Box<dyn AeadKey>, CryptoError> {
        let alg = match algorithm {
            AeadAlgorithm::Aes128Gcm => &aead::AES_128_GCM,
            AeadAlgorithm::Aes256Gcm => &aead::AES_256_GCM,
            AeadAlgorithm::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
        };
        if key.len() != algorithm.key_len() {
            return Err(CryptoError::InvalidInput);
        }
        let unbound = aead::UnboundKey::new(alg, key).map_err(|_| CryptoError::InvalidInput)?;
        Ok(Box::new(AwsLcAeadKey {
            algorithm,
            key: aead::LessSafeKey::new(unbound),
        }))
    }
}

impl AeadKey for AwsLcAeadKey {
    fn algorithm(&self) -> AeadAlgorithm {
        self.algorithm
    }

    fn seal_in_place(
        &self,
        nonce: &[u8; AEAD_NONCE_LEN],
        aad: &[u8],
        in_out: &mut [u8],
    ) -> Result<[u8; AEAD_TAG_LEN], CryptoError> {
        let nonce = aead::Nonce::assume_unique_for_key(*nonce);
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce, aead::Aad::from(aad), in_out)
            .map_err(|_| CryptoError::InvalidInput)?;
        let mut out = [0u8; AEAD_TAG_LEN];
        out.copy_from_slice(tag.as_ref());
        Ok(out)
    }

    fn open_in_place<'a>(
        &self,
        nonce: &[u8; AEAD_NONCE_LEN],
        aad: &[u8],
        ciphertext_and_tag: &'a mut [u8],
    ) -> Result<&'a mut [u8], CryptoError> {
        let nonce = aead::Nonce::assume_unique_for_key(*nonce);
        self.key
            .open_in_place(nonce, aead::Aad::from(aad), ciphertext_and_tag)
            .map_err(|_| CryptoError::Failed)
    }
}

// ---- HMAC-SHA256 ------------------------------------------------------------------------

struct AwsLcHmacSha256;

struct AwsLcHmacKey(hmac::Key);

impl MacFactory for AwsLcHmacSha256 {
    fn new_key(&self, key: &[u8]) -> Box<dyn MacKey> {
        Box::new(AwsLcHmacKey(hmac::Key::new(hmac::HMAC_SHA256, key)))
    }
}

impl MacKey for AwsLcHmacKey {
    fn output_len(&self) -> usize {
        32
    }

    fn sign(&self, parts: &[&[u8]], out: &mut [u8]) {
        let mut ctx = hmac::Context::with_key(&self.0);
        for part in parts {
            ctx.update(part);
        }
        let tag = ctx.sign();
        let n = out.len().min(32);
        out[..n].copy_from_slice(&tag.as_ref()[..n]);
    }
}

// ---- BLAKE3 -----------------------------------------------------------------------------

struct Blake3;

impl KeyedHash for Blake3 {
    fn hash(&self, key: &[u8; 32], parts: &[&[u8]], out: &mut [u8]) {
        let mut hasher = blake3::Hasher::new_keyed(key);
        for part in parts {
            hasher.update(part);
        }
        hasher.finalize_xof().fill(out);
    }
}

// ---- AES blocks -------------------------------------------------------------------------

struct RustCryptoAes;

struct Aes128Blocks(aes::Aes128);

impl BlockCipherFactory for RustCryptoAes {
    fn aes128(&self, key: &[u8]) -> Result<Box<dyn BlockCipher>, CryptoError> {
        use aes::cipher::KeyInit;
        let cipher = aes::Aes128::new_from_slice(key).map_err(|_| CryptoError::InvalidInput)?;
        Ok(Box::new(Aes128Blocks(cipher)))
    }
}

impl BlockCipher for Aes128Blocks {
    fn encrypt_blocks(&self, blocks: &mut [[u8; 16]]) {
        use aes::cipher::BlockEncrypt;
        for block in blocks.iter_mut() {
            self.0.encrypt_block(block.into());
        }
    }
}

// ---- HKDF-SHA256 ------------------------------------------------------------------------

struct AwsLcHkdf;

struct OkmLen(usize);

impl hkdf::KeyType for OkmLen {
    fn len(&self) -> usize {
        self.0
    }
}

impl Hkdf for AwsLcHkdf {
    fn derive(
        &self,
        salt: &[u8],
        ikm: &[u8],
        info: &[&[u8]],
        out: &mut [u8],
    ) -> Result<(), CryptoError> {
        if out.is_empty() || out.len() > 255 * 32 {
            return Err(CryptoError::InvalidInput);
        }
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, salt).extract(ikm);
        let okm = prk
            .expand(info, OkmLen(out.len()))
            .map_err(|_| CryptoError::InvalidInput)?;
        okm.fill(out).map_err(|_| CryptoError::InvalidInput)
    }
}

// ---- SHA-256 ----------------------------------------------------------------------------

struct AwsLcSha256;

impl Digest for AwsLcSha256 {
    fn sha256(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut ctx = digest::Context::new(&digest::SHA256);
        for part in parts {
            ctx.update(part);
        }
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        out
    }
}

// ---- Randomness -------------------------------------------------------------------------

struct AwsLcRandom;

impl SecureRandom for AwsLcRandom {
    fn fill(&self, out: &mut [u8]) -> Result<(), CryptoError> {
        use aws_lc_rs::rand::SecureRandom as _;
        rand::SystemRandom::new()
            .fill(out)
            .map_err(|_| CryptoError::Failed)
    }
}

// ---- KEMs -------------------------------------------------------------------------------

/// X25519 as a KEM: the ciphertext is a fresh ephemeral public key.
struct X25519Kem;

const X25519_LEN: usize = 32;

impl X25519Kem {
    fn private_key(secret: &[u8]) -> Result<agreement::PrivateKey, CryptoError> {
        agreement::PrivateKey::from_private_key(&agreement::X25519, secret)
            .map_err(|_| CryptoError::InvalidInput)
    }

    fn agree(private: &agreement::PrivateKey, public: &[u8]) -> Result<Secret, CryptoError> {
        let peer = agreement::UnparsedPublicKey::new(&agreement::X25519, public);
        // aws-lc rejects an all-zero shared secret (a low-order peer key).
        agreement::agree(private, peer, CryptoError::Failed, |k| {
            Ok(Secret::from_slice(k))
        })
    }
}

impl KemFactory for X25519Kem {
    fn algorithm(&self) -> KemAlgorithm {
        KemAlgorithm::X25519
    }

    fn generate(&self) -> Result<(Secret, Vec<u8>), CryptoError> {
        let private =
            agreement::PrivateKey::generate(&agreement::X25519).map_err(|_| CryptoError::Failed)?;
        let public = private
            .compute_public_key()
            .map_err(|_| CryptoError::Failed)?;
        let seed: aws_lc_rs::encoding::Curve25519SeedBin<'_> =
            private.as_be_bytes().map_err(|_| CryptoError::Failed)?;
        Ok((Secret::from_slice(seed.as_ref()), public.as_ref().to_vec()))
    }

    fn encapsulate(&self, public: &[u8]) -> Result<(Vec<u8>, Secret), CryptoError> {
        if public.len() != X25519_LEN {
            return Err(CryptoError::InvalidInput);
        }
        let ephemeral =
            agreement::PrivateKey::generate(&agreement::X25519).map_err(|_| CryptoError::Failed)?;
        let ciphertext = ephemeral
            .compute_public_key()
            .map_err(|_| CryptoError::Failed)?;
        let shared = Self::agree(&ephemeral, public)?;
        Ok((ciphertext.as_ref().to_vec(), shared))
    }

    fn decapsulate(&self, secret: &Secret, ciphertext: &[u8]) -> Result<Secret, CryptoError> {
        if ciphertext.len() != X25519_LEN {
            return Err(CryptoError::InvalidInput);
        }
        Self::agree(&Self::private_key(secret.expose())?, ciphertext)
    }
}

/// ML-KEM-768 (FIPS 203).
struct MlKem768Kem;

const MLKEM768_PUBLIC_LEN: usize = 1184;
const MLKEM768_CIPHERTEXT_LEN: usize = 1088;

impl KemFactory for MlKem768Kem {
    fn algorithm(&self) -> KemAlgorithm {
        KemAlgorithm::MlKem768
    }

    fn generate(&self) -> Result<(Secret, Vec<u8>), CryptoError> {
        let dk =
            kem::DecapsulationKey::generate(&kem::ML_KEM_768).map_err(|_| CryptoError::Failed)?;
        let ek = dk.encapsulation_key().map_err(|_| CryptoError::Failed)?;
        let ek_bytes = ek.key_bytes().map_err(|_| CryptoError::Failed)?;
        let dk_bytes = dk.key_bytes().map_err(|_| CryptoError::Failed)?;
        Ok((
            Secret::from_slice(dk_bytes.as_ref()),
            ek_bytes.as_ref().to_vec(),
        ))
    }

    fn encapsulate(&self, public: &[u8]) -> Result<(Vec<u8>, Secret), CryptoError> {
        if public.len() != MLKEM768_PUBLIC_LEN {
            return Err(CryptoError::InvalidInput);
        }
        let ek = kem::EncapsulationKey::new(&kem::ML_KEM_768, public)
            .map_err(|_| CryptoError::InvalidInput)?;
        // aws-lc checks that coefficients are reduced mod q only here: a bad key encoding.
        let (ciphertext, shared) = ek.encapsulate().map_err(|_| CryptoError::InvalidInput)?;
        Ok((
            ciphertext.as_ref().to_vec(),
            Secret::from_slice(shared.as_ref()),
        ))
    }

    fn decapsulate(&self, secret: &Secret, ciphertext: &[u8]) -> Result<Secret, CryptoError> {
        if ciphertext.len() != MLKEM768_CIPHERTEXT_LEN {
            return Err(CryptoError::InvalidInput);
        }
        let dk = kem::DecapsulationKey::new(&kem::ML_KEM_768, secret.expose())
            .map_err(|_| CryptoError::InvalidInput)?;
        let shared = dk
            .decapsulate(kem::Ciphertext::from(ciphertext))
            .map_err(|_| CryptoError::Failed)?;
        Ok(Secret::from_slice(shared.as_ref()))
    }
}

/// X25519 and ML-KEM-768 side by side: public keys, ciphertexts and secrets are the X25519
/// part followed by the ML-KEM part. The shared secret is not bound to the ciphertexts or
/// public keys (unlike X-Wing): protocols must feed their transcript into the key schedule,
/// and then it is secure if either part is. (The order is not TLS's `X25519MLKEM768`.)
struct X25519MlKem768Kem;

impl KemFactory for X25519MlKem768Kem {
    fn algorithm(&self) -> KemAlgorithm {
        KemAlgorithm::X25519MlKem768
    }

    fn generate(&self) -> Result<(Secret, Vec<u8>), CryptoError> {
        let (xs, xp) = X25519Kem.generate()?;
        let (ms, mp) = MlKem768Kem.generate()?;
        let mut secret = Secret::zeroed(xs.len() + ms.len());
        secret.expose_mut()[..xs.len()].copy_from_slice(xs.expose());
        secret.expose_mut()[xs.len()..].copy_from_slice(ms.expose());
        Ok((secret, [xp, mp].concat()))
    }

    fn encapsulate(&self, public: &[u8]) -> Result<(Vec<u8>, Secret), CryptoError> {
        if public.len() != X25519_LEN + MLKEM768_PUBLIC_LEN {
            return Err(CryptoError::InvalidInput);
        }
        let (xc, xk) = X25519Kem.encapsulate(&public[..X25519_LEN])?;
        let (mc, mk) = MlKem768Kem.encapsulate(&public[X25519_LEN..])?;
        Ok(([xc, mc].concat(), concat_secrets(&xk, &mk)))
    }

    fn decapsulate(&self, secret: &Secret, ciphertext: &[u8]) -> Result<Secret, CryptoError> {
        if ciphertext.len() != X25519_LEN + MLKEM768_CIPHERTEXT_LEN || secret.len() <= X25519_LEN {
            return Err(CryptoError::InvalidInput);
        }
        let (xs, ms) = secret.expose().split_at(X25519_LEN);
        let xk = X25519Kem.decapsulate(&Secret::from_slice(xs), &ciphertext[..X25519_LEN])?;
        let mk = MlKem768Kem.decapsulate(&Secret::from_slice(ms), &ciphertext[X25519_LEN..])?;
        Ok(concat_secrets(&xk, &mk))
    }
}

fn concat_secrets(a: &Secret, b: &Secret) -> Secret {
    let mut out = Secret::zeroed(a.len() + b.len());
    out.expose_mut()[..a.len()].copy_from_slice(a.expose());
    out.expose_mut()[a.len()..].copy_from_slice(b.expose());
    out
}

// ---- Ed25519 ----------------------------------------------------------------------------

struct AwsLcEd25519;

impl AwsLcEd25519 {
    fn key_pair(secret: &Secret) -> Result<signature::Ed25519KeyPair, CryptoError> {
        signature::Ed25519KeyPair::from_seed_unchecked(secret.expose())
            .map_err(|_| CryptoError::InvalidInput)
    }
}

impl SignatureScheme for AwsLcEd25519 {
    fn generate(&self) -> Result<(Secret, Vec<u8>), CryptoError> {
        let pair = signature::Ed25519KeyPair::generate().map_err(|_| CryptoError::Failed)?;
        let seed = pair.seed().map_err(|_| CryptoError::Failed)?;
        let seed: aws_lc_rs::encoding::Curve25519SeedBin<'_> =
            seed.as_be_bytes().map_err(|_| CryptoError::Failed)?;
        Ok((
            Secret::from_slice(seed.as_ref()),
            pair.public_key().as_ref().to_vec(),
        ))
    }

    fn public_key(&self, secret: &Secret) -> Result<Vec<u8>, CryptoError> {
        Ok(Self::key_pair(secret)?.public_key().as_ref().to_vec())
    }

    fn sign(&self, secret: &Secret, message: &[u8]) -> Result<Vec<u8>, CryptoError> {
        Ok(Self::key_pair(secret)?.sign(message).as_ref().to_vec())
    }

    fn verify(&self, public: &[u8], message: &[u8], sig: &[u8]) -> Result<(), CryptoError> {
        signature::UnparsedPublicKey::new(&signature::ED25519, public)
            .verify(message, sig)
            .map_err(|_| CryptoError::Failed)
    }
}
