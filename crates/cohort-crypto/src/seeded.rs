//! A provider for deterministic simulation: every random byte it draws (key generation,
//! encapsulation, [`SecureRandom`]) comes from one stream per thread, which
//! [`seed_thread`] restarts. A simulated run on one thread that seeds its thread first then
//! replays byte for byte, including key shares that an adversary tampers with. The default
//! provider's KEMs draw from aws-lc's own generator, and whether a tampered ML-KEM key still
//! parses depends on its bytes, so such runs did not replay before.
//!
//! **Never for real keys**: the stream is a public function of a 64-bit seed.
//!
//! What is seeded and how:
//! - X25519: the private key is 32 bytes of the stream (aws-lc-rs imports it).
//! - ML-KEM-768: key generation from `d` and `z`, and encapsulation from `m` (FIPS 203's
//!   internal algorithms), by RustCrypto `ml-kem`, since aws-lc-rs takes no seed.
//!   Encapsulation first runs aws-lc's, so that an encapsulation key aws-lc refuses is
//!   refused here too; decapsulation is aws-lc's, so every run checks that the two agree.
//! - The hybrid is the default provider's composition of these two parts.
//! - Not seeded: RSA key generation (`rsa` draws from the OS) and Ed25519 key generation
//!   (simulations build identities from seeds).

use std::cell::RefCell;

use ml_kem::kem::{DecapsulationKey, EncapsulationKey};
use ml_kem::{EncapsulateDeterministic, EncodedSizeUser, KemCore, MlKem768, MlKem768Params, B32};

use crate::aws_lc::{self, MlKem768Kem, X25519Kem, X25519MlKem768Kem};
use crate::provider::{CryptoError, CryptoProvider, KemAlgorithm, KemFactory, SecureRandom};
use crate::secret::Secret;

thread_local! {
    static STREAM: RefCell<blake3::OutputReader> = RefCell::new(stream(0));
}

/// The stream for `seed`: BLAKE3's output in derive-key mode, under a context of its own.
fn stream(seed: u64) -> blake3::OutputReader {
    let mut hasher = blake3::Hasher::new_derive_key("cohort-crypto 2026-11-29 seeded provider");
    hasher.update(&seed.to_le_bytes());
    hasher.finalize_xof()
}

/// Restarts this thread's stream from `seed`. Until a thread calls it, its stream is the
/// one for seed 0.
pub fn seed_thread(seed: u64) {
    STREAM.with(|s| *s.borrow_mut() = stream(seed));
}

/// The next `out.len()` bytes of this thread's stream.
fn draw(out: &mut [u8]) {
    STREAM.with(|s| s.borrow_mut().fill(out));
}

/// The default provider with every KEM and the random source drawing from this thread's
/// seeded stream (see the module documentation).
pub fn seeded_provider() -> CryptoProvider {
    CryptoProvider {
        name: "aws-lc-rs, seeded",
        random: &SeededRandom,
        kems: &[
            &SEEDED_X25519_MLKEM768,
            &SeededMlKem768,
            &SeededX25519,
            &aws_lc::Rsa2048E3OaepKem,
        ],
        ..aws_lc::PROVIDER
    }
}

struct SeededRandom;

impl SecureRandom for SeededRandom {
    fn fill(&self, out: &mut [u8]) -> Result<(), CryptoError> {
        draw(out);
        Ok(())
    }
}

struct SeededX25519;

impl SeededX25519 {
    /// A key pair from 32 bytes of the stream: (private key bytes, public key).
    fn key_pair() -> Result<(Secret, Vec<u8>), CryptoError> {
        let mut bytes = Secret::zeroed(aws_lc::X25519_LEN);
        draw(bytes.expose_mut());
        let private = X25519Kem::private_key(bytes.expose())?;
        let public = private
            .compute_public_key()
            .map_err(|_| CryptoError::Failed)?;
        Ok((bytes, public.as_ref().to_vec()))
    }
}

impl KemFactory for SeededX25519 {
    fn algorithm(&self) -> KemAlgorithm {
        KemAlgorithm::X25519
    }

    fn generate(&self) -> Result<(Secret, Vec<u8>), CryptoError> {
        Self::key_pair()
    }

    fn encapsulate(&self, public: &[u8]) -> Result<(Vec<u8>, Secret), CryptoError> {
        if public.len() != aws_lc::X25519_LEN {
            return Err(CryptoError::InvalidInput);
        }
        let (ephemeral, ciphertext) = Self::key_pair()?;
        let shared = X25519Kem::agree(&X25519Kem::private_key(ephemeral.expose())?, public)?;
        Ok((ciphertext, shared))
    }

    fn decapsulate(&self, secret: &Secret, ciphertext: &[u8]) -> Result<Secret, CryptoError> {
        X25519Kem.decapsulate(secret, ciphertext)
    }
}

struct SeededMlKem768;

/// 32 bytes of the stream.
fn draw_b32() -> B32 {
    let mut out = B32::default();
    draw(&mut out);
    out
}

impl KemFactory for SeededMlKem768 {
    fn algorithm(&self) -> KemAlgorithm {
        KemAlgorithm::MlKem768
    }

    fn generate(&self) -> Result<(Secret, Vec<u8>), CryptoError> {
        let (d, z) = (draw_b32(), draw_b32());
        let (dk, ek): (
            DecapsulationKey<MlKem768Params>,
            EncapsulationKey<MlKem768Params>,
        ) = MlKem768::generate_deterministic(&d, &z);
        Ok((
            Secret::from_slice(dk.as_bytes().as_slice()),
            ek.as_bytes().to_vec(),
        ))
    }

    fn encapsulate(&self, public: &[u8]) -> Result<(Vec<u8>, Secret), CryptoError> {
        // aws-lc's checks (length, coefficients reduced mod q) decide what is refused; its
        // random ciphertext is thrown away.
        MlKem768Kem.encapsulate(public)?;
        let encoded = public.try_into().map_err(|_| CryptoError::InvalidInput)?;
        let ek = EncapsulationKey::<MlKem768Params>::from_bytes(encoded);
        let (ciphertext, shared) = ek
            .encapsulate_deterministic(&draw_b32())
            .map_err(|()| CryptoError::Failed)?;
        Ok((ciphertext.to_vec(), Secret::from_slice(shared.as_slice())))
    }

    fn decapsulate(&self, secret: &Secret, ciphertext: &[u8]) -> Result<Secret, CryptoError> {
        MlKem768Kem.decapsulate(secret, ciphertext)
    }
}

const SEEDED_X25519_MLKEM768: X25519MlKem768Kem = X25519MlKem768Kem {
    x25519: &SeededX25519,
    mlkem: &SeededMlKem768,
};

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(seed: u64) -> Vec<Vec<u8>> {
        seed_thread(seed);
        let p = seeded_provider();
        let mut out = Vec::new();
        for kem in p.kems.iter().take(3) {
            let (secret, public) = kem.generate().unwrap();
            let (ciphertext, shared) = kem.encapsulate(&public).unwrap();
            // aws-lc decapsulates what the seeded side made.
            assert_eq!(kem.decapsulate(&secret, &ciphertext).unwrap(), shared);
            out.extend([public, ciphertext, shared.expose().to_vec()]);
        }
        let mut bytes = [0u8; 16];
        p.random.fill(&mut bytes).unwrap();
        out.push(bytes.to_vec());
        out
    }

    #[test]
    fn one_seed_gives_the_same_keys_and_ciphertexts_another_does_not() {
        let a = shares(7);
        assert_eq!(a, shares(7));
        let b = shares(8);
        for (x, y) in a.iter().zip(&b) {
            assert_ne!(x, y);
        }
    }

    #[test]
    fn seeded_keys_work_with_the_default_provider() {
        seed_thread(3);
        let seeded = seeded_provider();
        let default = CryptoProvider::default_provider();
        for algorithm in [
            KemAlgorithm::X25519,
            KemAlgorithm::MlKem768,
            KemAlgorithm::X25519MlKem768,
        ] {
            let s = seeded.kem(algorithm).unwrap();
            let d = default.kem(algorithm).unwrap();
            // Seeded key, default encapsulation; default key, seeded encapsulation.
            let (secret, public) = s.generate().unwrap();
            let (ciphertext, shared) = d.encapsulate(&public).unwrap();
            assert_eq!(s.decapsulate(&secret, &ciphertext).unwrap(), shared);
            let (secret, public) = d.generate().unwrap();
            let (ciphertext, shared) = s.encapsulate(&public).unwrap();
            assert_eq!(d.decapsulate(&secret, &ciphertext).unwrap(), shared);
        }
    }

    #[test]
    fn a_key_aws_lc_refuses_is_refused() {
        seed_thread(4);
        let kem = seeded_provider().kem(KemAlgorithm::MlKem768).unwrap();
        let (_, mut public) = kem.generate().unwrap();
        // The first coefficient's 12 bits all set: 4095 is not reduced mod q = 3329.
        public[0] = 0xff;
        public[1] |= 0x0f;
        assert_eq!(kem.encapsulate(&public), Err(CryptoError::InvalidInput));
        assert_eq!(
            kem.encapsulate(&public[1..]),
            Err(CryptoError::InvalidInput)
        );
    }
}
