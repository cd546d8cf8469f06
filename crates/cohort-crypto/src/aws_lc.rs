//! The default backend: aws-lc-rs, plus RustCrypto `aes` for single AES blocks and `blake3`,
//! and RustCrypto `rsa` only to generate RSA primes with e = 3.

use crate::provider::*;
use crate::secret::Secret;
use aws_lc_rs::encoding::{AsBigEndian, AsDer};
use aws_lc_rs::signature::KeyPair;
use aws_lc_rs::{aead, agreement, digest, hkdf, hmac, kem, rand, signature};
use zeroize::Zeroizing;

pub(crate) const PROVIDER: CryptoProvider = CryptoProvider {
    name: "aws-lc-rs",
    aead: &AwsLcAead,
    hmac_sha256: &AwsLcHmacSha256,
    keyed_blake3: &Blake3,
    aes_block: &RustCryptoAes,
    hkdf_sha256: &AwsLcHkdf,
    sha256: &AwsLcSha256,
    random: &AwsLcRandom,
    // RSA comes last: it is there for tcpcrypt, never preferred.
    kems: &[
        &X25519_MLKEM768,
        &MlKem768Kem,
        &X25519Kem,
        &Rsa2048E3OaepKem,
    ],
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
pub(crate) struct X25519Kem;

pub(crate) const X25519_LEN: usize = 32;

impl X25519Kem {
    pub(crate) fn private_key(secret: &[u8]) -> Result<agreement::PrivateKey, CryptoError> {
        agreement::PrivateKey::from_private_key(&agreement::X25519, secret)
            .map_err(|_| CryptoError::InvalidInput)
    }

    pub(crate) fn agree(
        private: &agreement::PrivateKey,
        public: &[u8],
    ) -> Result<Secret, CryptoError> {
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
pub(crate) struct MlKem768Kem;

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
///
/// Generic over the two parts so that the seeded provider can put its own in.
pub(crate) struct X25519MlKem768Kem {
    pub(crate) x25519: &'static dyn KemFactory,
    pub(crate) mlkem: &'static dyn KemFactory,
}

const X25519_MLKEM768: X25519MlKem768Kem = X25519MlKem768Kem {
    x25519: &X25519Kem,
    mlkem: &MlKem768Kem,
};

impl KemFactory for X25519MlKem768Kem {
    fn algorithm(&self) -> KemAlgorithm {
        KemAlgorithm::X25519MlKem768
    }

    fn generate(&self) -> Result<(Secret, Vec<u8>), CryptoError> {
        let (xs, xp) = self.x25519.generate()?;
        let (ms, mp) = self.mlkem.generate()?;
        let mut secret = Secret::zeroed(xs.len() + ms.len());
        secret.expose_mut()[..xs.len()].copy_from_slice(xs.expose());
        secret.expose_mut()[xs.len()..].copy_from_slice(ms.expose());
        Ok((secret, [xp, mp].concat()))
    }

    fn encapsulate(&self, public: &[u8]) -> Result<(Vec<u8>, Secret), CryptoError> {
        if public.len() != X25519_LEN + MLKEM768_PUBLIC_LEN {
            return Err(CryptoError::InvalidInput);
        }
        let (xc, xk) = self.x25519.encapsulate(&public[..X25519_LEN])?;
        let (mc, mk) = self.mlkem.encapsulate(&public[X25519_LEN..])?;
        Ok(([xc, mc].concat(), concat_secrets(&xk, &mk)))
    }

    fn decapsulate(&self, secret: &Secret, ciphertext: &[u8]) -> Result<Secret, CryptoError> {
        if ciphertext.len() != X25519_LEN + MLKEM768_CIPHERTEXT_LEN || secret.len() <= X25519_LEN {
            return Err(CryptoError::InvalidInput);
        }
        let (xs, ms) = secret.expose().split_at(X25519_LEN);
        let xk = self
            .x25519
            .decapsulate(&Secret::from_slice(xs), &ciphertext[..X25519_LEN])?;
        let mk = self
            .mlkem
            .decapsulate(&Secret::from_slice(ms), &ciphertext[X25519_LEN..])?;
        Ok(concat_secrets(&xk, &mk))
    }
}

/// tcpcrypt's RSA KEM: RSA-2048 with e = 3, RSAES-OAEP with SHA-256, MGF1-SHA256 and an
/// empty label, encrypting a fresh random 32-byte secret.
///
/// * The public key is the 256-byte big-endian modulus `n` alone (e is always 3).
/// * The decapsulation secret is the private key as a PKCS#8 v1 DER document.
/// * Encapsulation (one cube mod n) is cheap; decapsulation (a full private-key operation)
///   is the expensive side, as tcpcrypt intends.
///
/// Implementations: aws-lc-rs cannot *generate* keys with e = 3, so the primes come from
/// RustCrypto `rsa` (`RsaPrivateKey::new_with_exp`), and the key is imported into aws-lc-rs
/// with [`aws_lc_rs::rsa::KeyPair::from_components`], which runs aws-lc's `RSA_check_key`.
/// All OAEP encryption and decryption is done by aws-lc-rs: RustCrypto `rsa`'s decryption
/// is not constant time (RUSTSEC-2023-0071, the Marvin attack), so it never sees a
/// ciphertext. Key generation is slow: RustCrypto's prime search took 0.06 to 1.4 s per key
/// (mean about 0.3 to 0.6 s) in a release build on a 2-core machine, against about 30 us to
/// encapsulate and 1 ms to decapsulate. The small exponent is safe here because OAEP pads
/// with fresh randomness: the small-e attacks (Håstad's broadcast attack, Coppersmith's
/// stereotyped messages) need unpadded or deterministically padded messages.
pub(crate) struct Rsa2048E3OaepKem;

const RSA2048_LEN: usize = 256;
const RSA_KEM_SECRET_LEN: usize = 32;

impl Rsa2048E3OaepKem {
    /// A fresh RSA-2048 key with e = 3, checked by aws-lc and encoded as PKCS#8, and its
    /// modulus.
    fn generate_key() -> Result<(Secret, Vec<u8>), CryptoError> {
        use rsa::traits::{PrivateKeyParts, PublicKeyParts};
        use rsa::BigUint;

        let key = rsa::RsaPrivateKey::new_with_exp(
            &mut rand_core::OsRng,
            RSA2048_LEN * 8,
            &BigUint::from(3u32),
        )
        .map_err(|_| CryptoError::Failed)?;
        let n = key.n().to_bytes_be();
        let e = key.e().to_bytes_be();
        if n.len() != RSA2048_LEN || e != [3] {
            return Err(CryptoError::Failed);
        }
        let [p, q] = key.primes() else {
            return Err(CryptoError::Failed);
        };
        // The CRT values, computed here rather than taken from `rsa`'s precomputation (whose
        // q^-1 is a signed integer). q^-1 mod p = q^(p-2) mod p, as p is prime.
        let p_1 = Zeroizing::new(p - BigUint::from(1u32));
        let q_1 = Zeroizing::new(q - BigUint::from(1u32));
        let p_2 = Zeroizing::new(p - BigUint::from(2u32));
        let dp = Zeroizing::new(key.d() % &*p_1);
        let dq = Zeroizing::new(key.d() % &*q_1);
        let qinv = Zeroizing::new(q.modpow(&p_2, p));
        let be = |x: &BigUint| Zeroizing::new(x.to_bytes_be());
        let (d, p, q, dp, dq, qinv) = (be(key.d()), be(p), be(q), be(&dp), be(&dq), be(&qinv));
        let components = aws_lc_rs::rsa::KeyPairComponents {
            public_key: aws_lc_rs::rsa::PublicKeyComponents {
                n: n.as_slice(),
                e: e.as_slice(),
            },
            d: d.as_slice(),
            p: p.as_slice(),
            q: q.as_slice(),
            dP: dp.as_slice(),
            dQ: dq.as_slice(),
            qInv: qinv.as_slice(),
        };
        // Checks n = pq, the exponents and the CRT values (RSA_check_key).
        let pair = aws_lc_rs::rsa::KeyPair::from_components(&components)
            .map_err(|_| CryptoError::Failed)?;
        let pkcs8 = pair.as_der().map_err(|_| CryptoError::Failed)?;
        let secret = Secret::from_slice(pkcs8.as_ref());
        // The decapsulation path must accept what we hand out.
        let check = Self::decrypting_key(&secret)?;
        if check.key_size_bits() != RSA2048_LEN * 8 {
            return Err(CryptoError::Failed);
        }
        Ok((secret, n))
    }

    fn decrypting_key(
        secret: &Secret,
    ) -> Result<aws_lc_rs::rsa::PrivateDecryptingKey, CryptoError> {
        aws_lc_rs::rsa::PrivateDecryptingKey::from_pkcs8(secret.expose())
            .map_err(|_| CryptoError::InvalidInput)
    }
}

impl KemFactory for Rsa2048E3OaepKem {
    fn algorithm(&self) -> KemAlgorithm {
        KemAlgorithm::Rsa2048E3Oaep
    }

    fn generate(&self) -> Result<(Secret, Vec<u8>), CryptoError> {
        Self::generate_key()
    }

    fn encapsulate(&self, public: &[u8]) -> Result<(Vec<u8>, Secret), CryptoError> {
        use aws_lc_rs::rsa::{
            OaepPublicEncryptingKey, PublicEncryptingKey, PublicKeyComponents,
            OAEP_SHA256_MGF1SHA256,
        };
        // Exactly 2048 bits (top bit set) and odd: anything else is not an RSA-2048 modulus.
        if public.len() != RSA2048_LEN || public[0] & 0x80 == 0 || public[RSA2048_LEN - 1] & 1 == 0
        {
            return Err(CryptoError::InvalidInput);
        }
        let key: PublicEncryptingKey = PublicKeyComponents {
            n: public,
            e: &[3u8][..],
        }
        .try_into()
        .map_err(|_| CryptoError::InvalidInput)?;
        let key = OaepPublicEncryptingKey::new(key).map_err(|_| CryptoError::InvalidInput)?;
        let mut shared = Secret::zeroed(RSA_KEM_SECRET_LEN);
        AwsLcRandom.fill(shared.expose_mut())?;
        let mut ciphertext = vec![0u8; RSA2048_LEN];
        let written = key
            .encrypt(
                &OAEP_SHA256_MGF1SHA256,
                shared.expose(),
                &mut ciphertext,
                Some(&[]),
            )
            .map_err(|_| CryptoError::Failed)?
            .len();
        if written != RSA2048_LEN {
            return Err(CryptoError::Failed);
        }
        Ok((ciphertext, shared))
    }

    fn decapsulate(&self, secret: &Secret, ciphertext: &[u8]) -> Result<Secret, CryptoError> {
        if ciphertext.len() != RSA2048_LEN {
            return Err(CryptoError::InvalidInput);
        }
        let key = Self::decrypting_key(secret)?;
        if key.key_size_bits() != RSA2048_LEN * 8 {
            return Err(CryptoError::InvalidInput);
        }
        let shared = rsa_oaep_sha256_decrypt_with(key, &[], ciphertext)?;
        if shared.len() != RSA_KEM_SECRET_LEN {
            return Err(CryptoError::Failed);
        }
        Ok(shared)
    }
}

/// RSAES-OAEP decryption with SHA-256 and MGF1-SHA256 under `label`: the one decryption
/// routine of the RSA KEM, shared with [`crate::hazmat::rsa_oaep_sha256_decrypt`].
pub(crate) fn rsa_oaep_sha256_decrypt_with(
    key: aws_lc_rs::rsa::PrivateDecryptingKey,
    label: &[u8],
    ciphertext: &[u8],
) -> Result<Secret, CryptoError> {
    use aws_lc_rs::rsa::{OaepPrivateDecryptingKey, OAEP_SHA256_MGF1SHA256};
    if ciphertext.len() != key.key_size_bytes() {
        return Err(CryptoError::InvalidInput);
    }
    let key = OaepPrivateDecryptingKey::new(key).map_err(|_| CryptoError::InvalidInput)?;
    let mut buf = Zeroizing::new(vec![0u8; key.min_output_size()]);
    // One error for every decryption failure (bad padding, wrong label, c >= n): telling them
    // apart is what Manger's attack needs.
    let plaintext = key
        .decrypt(&OAEP_SHA256_MGF1SHA256, ciphertext, &mut buf, Some(label))
        .map_err(|_| CryptoError::Failed)?;
    Ok(Secret::from_slice(plaintext))
}

/// Parses a PKCS#8 RSA private key (2048 to 8192 bits, any valid public exponent) and
/// OAEP-decrypts `ciphertext` with it; see [`crate::hazmat::rsa_oaep_sha256_decrypt`].
pub(crate) fn rsa_oaep_sha256_decrypt(
    private_key_pkcs8: &[u8],
    label: &[u8],
    ciphertext: &[u8],
) -> Result<Secret, CryptoError> {
    let key = aws_lc_rs::rsa::PrivateDecryptingKey::from_pkcs8(private_key_pkcs8)
        .map_err(|_| CryptoError::InvalidInput)?;
    rsa_oaep_sha256_decrypt_with(key, label, ciphertext)
}

fn concat_secrets(a: &Secret, b: &Secret) -> Secret {
    let mut out = Secret::zeroed(a.len() + b.len());
    out.expose_mut()[..a.len()].copy_from_slice(a.expose());
    out.expose_mut()[a.len()..].copy_from_slice(b.expose());
    out
}

// ---- Ed25519 ----------------------------------------------------------------------------

struct AwsLcEd25519;

/// An Ed25519 key pair parsed once (`SignatureScheme::signing_key`): the type
/// `AwsLcEd25519::sign_with_key` recognises as its own. The private key lives in aws-lc's
/// memory (an `EVP_PKEY`), not Rust's: dropping the pair frees it with `EVP_PKEY_free`, whose
/// Ed25519 method frees the key with `OPENSSL_free`, and aws-lc's `OPENSSL_free` overwrites
/// an allocation (`OPENSSL_cleanse`, its whole recorded size) before freeing it. So the
/// pair is wiped on drop like a `Secret`, though not by `zeroize`.
struct AwsLcEd25519Key(signature::Ed25519KeyPair);

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

    fn signing_key(&self, secret: &Secret) -> Result<Option<SigningKey>, CryptoError> {
        let pair = Self::key_pair(secret)?;
        let public = pair.public_key().as_ref().to_vec();
        Ok(Some(SigningKey::new(AwsLcEd25519Key(pair), public)))
    }

    fn sign_with_key(
        &self,
        key: Option<&SigningKey>,
        secret: &Secret,
        message: &[u8],
    ) -> Result<Vec<u8>, CryptoError> {
        match key.and_then(SigningKey::get::<AwsLcEd25519Key>) {
            Some(AwsLcEd25519Key(pair)) => Ok(pair.sign(message).as_ref().to_vec()),
            None => self.sign(secret, message),
        }
    }
}
