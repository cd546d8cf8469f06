//! Round trips and edge cases of the provider API that published vectors do not cover:
//! KEM generate/encapsulate/decapsulate, Ed25519 signing, input-length checks, and the
//! `Secret` / `ct_eq` basics.
//!
//! RSA-2048 key generation is slow, so the RSA tests share two generated keys
//! ([`rsa_keys`]).

use cohort_crypto::{
    ct_eq, AeadAlgorithm, CryptoError, CryptoProvider, KemAlgorithm, Secret, SigningKey,
    AEAD_NONCE_LEN,
};
use std::sync::OnceLock;
use zeroize::{Zeroize, ZeroizeOnDrop};

fn provider() -> CryptoProvider {
    CryptoProvider::default_provider()
}

/// (public key, ciphertext, shared secret) lengths, and where the ML-KEM ciphertext starts
/// (`None` for X25519 and RSA).
fn sizes(alg: KemAlgorithm) -> (usize, usize, usize, Option<usize>) {
    match alg {
        KemAlgorithm::X25519 => (32, 32, 32, None),
        KemAlgorithm::MlKem768 => (1184, 1088, 32, Some(0)),
        KemAlgorithm::X25519MlKem768 => (32 + 1184, 32 + 1088, 64, Some(32)),
        KemAlgorithm::Rsa2048E3Oaep => (256, 256, 32, None),
    }
}

/// Two RSA-2048 (e = 3) key pairs from the provider, generated once for all tests.
fn rsa_keys() -> &'static [(Secret, Vec<u8>); 2] {
    static KEYS: OnceLock<[(Secret, Vec<u8>); 2]> = OnceLock::new();
    KEYS.get_or_init(|| {
        let kem = provider()
            .kem(KemAlgorithm::Rsa2048E3Oaep)
            .expect("provider has RSA");
        [
            kem.generate().expect("generate"),
            kem.generate().expect("generate"),
        ]
    })
}

/// Key pair number `i` (0 or 1 within a round): fresh, except for RSA, whose two shared key
/// pairs are reused.
fn key_pair(kem: &dyn cohort_crypto::KemFactory, i: usize) -> (Secret, Vec<u8>) {
    if kem.algorithm() == KemAlgorithm::Rsa2048E3Oaep {
        rsa_keys()[i].clone()
    } else {
        kem.generate().expect("generate")
    }
}

#[test]
fn kems_are_listed_in_preference_order() {
    let p = provider();
    let algs: Vec<KemAlgorithm> = p.kems.iter().map(|k| k.algorithm()).collect();
    assert_eq!(
        algs,
        [
            KemAlgorithm::X25519MlKem768,
            KemAlgorithm::MlKem768,
            KemAlgorithm::X25519,
            KemAlgorithm::Rsa2048E3Oaep,
        ]
    );
    for alg in algs {
        assert_eq!(p.kem(alg).map(|k| k.algorithm()), Some(alg));
    }
}

#[test]
fn kem_round_trips() {
    let p = provider();
    let mut checked = 0;
    for kem in p.kems {
        let alg = kem.algorithm();
        let (pk_len, ct_len, ss_len, mlkem_offset) = sizes(alg);
        // RSA reuses its two shared keys: more rounds would repeat the same checks.
        let rounds = if alg == KemAlgorithm::Rsa2048E3Oaep {
            1
        } else {
            4
        };
        for _ in 0..rounds {
            let (sk, pk) = key_pair(*kem, 0);
            assert_eq!(pk.len(), pk_len, "{alg:?} public key length");
            let (ct, ss) = kem.encapsulate(&pk).expect("encapsulate");
            assert_eq!(ct.len(), ct_len, "{alg:?} ciphertext length");
            assert_eq!(ss.len(), ss_len, "{alg:?} secret length");
            let ss2 = kem.decapsulate(&sk, &ct).expect("decapsulate");
            assert_eq!(ss, ss2, "{alg:?}: decapsulated secret differs");

            // Encapsulation is randomized.
            let (ct_b, ss_b) = kem.encapsulate(&pk).expect("encapsulate");
            assert_ne!(
                ct, ct_b,
                "{alg:?}: two encapsulations gave the same ciphertext"
            );
            assert_ne!(ss, ss_b);
            assert_eq!(kem.decapsulate(&sk, &ct_b).expect("decapsulate"), ss_b);

            // Wrong lengths are rejected.
            for bad in [
                &ct[..ct.len() - 1],
                &[ct.as_slice(), &[0]].concat()[..],
                &[],
            ] {
                assert_eq!(
                    kem.decapsulate(&sk, bad).map(|_| ()),
                    Err(CryptoError::InvalidInput),
                    "{alg:?}: {}-byte ciphertext",
                    bad.len()
                );
            }
            for bad in [
                &pk[..pk.len() - 1],
                &[pk.as_slice(), &[0]].concat()[..],
                &[],
            ] {
                assert_eq!(
                    kem.encapsulate(bad).map(|_| ()),
                    Err(CryptoError::InvalidInput),
                    "{alg:?}: {}-byte public key",
                    bad.len()
                );
            }

            // ML-KEM's implicit rejection: a tampered ciphertext decapsulates to a different
            // (pseudorandom) secret rather than failing.
            if let Some(off) = mlkem_offset {
                let mut tampered = ct.clone();
                tampered[off + 100] ^= 0x01;
                let other = kem.decapsulate(&sk, &tampered).expect("implicit rejection");
                assert_eq!(other.len(), ss_len);
                assert_ne!(
                    other, ss,
                    "{alg:?}: tampered ciphertext gave the same secret"
                );
                // Deterministic: the same tampered ciphertext gives the same secret.
                assert_eq!(kem.decapsulate(&sk, &tampered).expect("decapsulate"), other);
                if alg == KemAlgorithm::X25519MlKem768 {
                    // Only the ML-KEM half changes.
                    assert_eq!(other.expose()[..32], ss.expose()[..32]);
                }
            }
            // RSA-OAEP has no implicit rejection: a tampered ciphertext fails.
            if alg == KemAlgorithm::Rsa2048E3Oaep {
                for at in [0, 100, 255] {
                    let mut tampered = ct.clone();
                    tampered[at] ^= 0x01;
                    assert_eq!(
                        kem.decapsulate(&sk, &tampered).map(|_| ()),
                        Err(CryptoError::Failed),
                        "RSA: ciphertext tampered at byte {at}"
                    );
                }
            }
            // Tampering with the X25519 part (an ephemeral public key) changes that half.
            if matches!(alg, KemAlgorithm::X25519 | KemAlgorithm::X25519MlKem768) {
                let mut tampered = ct.clone();
                tampered[0] ^= 0x02;
                if let Ok(other) = kem.decapsulate(&sk, &tampered) {
                    assert_ne!(other.expose()[..32], ss.expose()[..32]);
                }
            }

            // Another key pair cannot decapsulate.
            let (sk_other, _) = key_pair(*kem, 1);
            if let Ok(wrong) = kem.decapsulate(&sk_other, &ct) {
                assert_ne!(
                    wrong, ss,
                    "{alg:?}: a different key decapsulated the secret"
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 3 * 4 + 1);
}

#[test]
fn x25519_generated_keys_agree_both_ways() {
    // The exported secret must be the key that `generate` returned the public key of:
    // DH(a, B) == DH(b, A).
    let kem = provider().kem(KemAlgorithm::X25519).expect("X25519");
    let (a, pa) = kem.generate().expect("generate");
    let (b, pb) = kem.generate().expect("generate");
    assert_eq!(a.len(), 32);
    let ab = kem.decapsulate(&a, &pb).expect("dh");
    let ba = kem.decapsulate(&b, &pa).expect("dh");
    assert_eq!(ab, ba);
    // A private key of the wrong length is rejected.
    assert_eq!(
        kem.decapsulate(&Secret::from_slice(&[1; 31]), &pb)
            .map(|_| ()),
        Err(CryptoError::InvalidInput)
    );
}

#[test]
fn x25519_rejects_zero_shared_secret() {
    let kem = provider().kem(KemAlgorithm::X25519).expect("X25519");
    let (sk, _) = kem.generate().expect("generate");
    // u = 0 and u = 1 are low-order points: the shared secret would be all zeros.
    let mut one = [0u8; 32];
    one[0] = 1;
    for public in [[0u8; 32], one] {
        assert!(kem.decapsulate(&sk, &public).is_err());
        assert!(kem.encapsulate(&public).is_err());
    }
}

#[test]
fn mlkem_rejects_malformed_decapsulation_key() {
    let kem = provider().kem(KemAlgorithm::MlKem768).expect("ML-KEM-768");
    let (sk, pk) = kem.generate().expect("generate");
    assert_eq!(
        sk.len(),
        2400,
        "FIPS 203 ML-KEM-768 decapsulation key length"
    );
    let (ct, _) = kem.encapsulate(&pk).expect("encapsulate");
    let short = Secret::from_slice(&sk.expose()[..sk.len() - 1]);
    assert!(kem.decapsulate(&short, &ct).is_err());
    // FIPS 203 §7.3 hash check: the dk embeds ek and H(ek); a dk whose ek or H(ek) was
    // altered is rejected rather than used.
    for at in [1152 + 5, 2400 - 50] {
        let mut bad = sk.clone();
        bad.expose_mut()[at] ^= 1;
        assert!(
            kem.decapsulate(&bad, &ct).is_err(),
            "dk tampered at byte {at}"
        );
    }
}

#[test]
fn rsa_keys_are_2048_bit_with_e_3() {
    use rsa::pkcs8::DecodePrivateKey;
    use rsa::traits::{PrivateKeyParts, PublicKeyParts};
    use rsa::BigUint;

    let kem = provider()
        .kem(KemAlgorithm::Rsa2048E3Oaep)
        .expect("provider has RSA");
    let three = BigUint::from(3u32);
    let [(sk0, pk0), (_, pk1)] = rsa_keys();
    assert_ne!(pk0, pk1, "two generated keys are the same");
    for (sk, pk) in rsa_keys() {
        assert_eq!(pk.len(), 256);
        assert!(pk[0] & 0x80 != 0, "top bit of the modulus");
        assert!(pk[255] & 1 == 1, "the modulus is odd");
        // The decapsulation secret is PKCS#8 for the same modulus, with e = 3.
        let key = rsa::RsaPrivateKey::from_pkcs8_der(sk.expose()).expect("PKCS#8");
        let n = key.n();
        assert_eq!(n.bits(), 2048);
        assert_eq!(n.to_bytes_be(), *pk);
        assert_eq!(*key.e(), three);

        // Encapsulation cubes: c = EM^3 mod n, where EM = c^d (textbook RSA, computed here
        // only to look at it) starts with OAEP's zero byte.
        let (ct, _) = kem.encapsulate(pk).expect("encapsulate");
        let c = BigUint::from_bytes_be(&ct);
        assert!(c < *n);
        let em = c.modpow(key.d(), n);
        assert_eq!(em.modpow(&three, n), c, "ciphertext is not EM^3 mod n");
        assert!(em.bits() <= 2040, "EM does not start with a zero byte");
    }

    // An independent implementation (RustCrypto `rsa`, encryption only) with (n, e = 3),
    // OAEP-SHA256, MGF1-SHA256 and an empty label encapsulates to our keys.
    let mut rng = rand_core::OsRng;
    let public = rsa::RsaPublicKey::new(BigUint::from_bytes_be(pk0), three.clone())
        .expect("RustCrypto accepts the public key");
    let oaep = || rsa::Oaep::new::<rsa::sha2::Sha256>();
    let msg = [0x5a; 32];
    let ct = public.encrypt(&mut rng, oaep(), &msg).expect("encrypt");
    let ss = kem.decapsulate(sk0, &ct).expect("decapsulate");
    assert_eq!(ss.expose(), msg);
    // Not 32 bytes, a label, or e = 65537 instead of 3: decapsulation fails.
    for len in [0, 31, 33] {
        let ct = public
            .encrypt(&mut rng, oaep(), &vec![7; len])
            .expect("encrypt");
        assert_eq!(
            kem.decapsulate(sk0, &ct).map(|_| ()),
            Err(CryptoError::Failed),
            "{len}-byte plaintext"
        );
    }
    let labelled = rsa::Oaep::new_with_label::<rsa::sha2::Sha256, _>("tcpcrypt");
    let ct = public.encrypt(&mut rng, labelled, &msg).expect("encrypt");
    assert_eq!(
        kem.decapsulate(sk0, &ct).map(|_| ()),
        Err(CryptoError::Failed)
    );
    let e65537 = rsa::RsaPublicKey::new(BigUint::from_bytes_be(pk0), BigUint::from(65537u32))
        .expect("public key");
    let ct = e65537.encrypt(&mut rng, oaep(), &msg).expect("encrypt");
    assert_eq!(
        kem.decapsulate(sk0, &ct).map(|_| ()),
        Err(CryptoError::Failed)
    );
}

#[test]
fn rsa_rejects_bad_public_keys() {
    let kem = provider()
        .kem(KemAlgorithm::Rsa2048E3Oaep)
        .expect("provider has RSA");
    let pk = &rsa_keys()[0].1;
    let mut even = pk.clone();
    even[255] ^= 1;
    let mut top_bit_clear = pk.clone();
    top_bit_clear[0] &= 0x7f;
    let mut leading_zero = vec![0u8];
    leading_zero.extend_from_slice(&pk[..255]);
    let long = [pk.as_slice(), &[1]].concat();
    let bad: [(&str, &[u8]); 7] = [
        ("empty", &[]),
        ("255 bytes", &pk[..255]),
        ("257 bytes", &long),
        ("128 bytes", &pk[..128]),
        ("even", &even),
        ("top bit clear", &top_bit_clear),
        ("leading zero byte", &leading_zero),
    ];
    for (what, public) in bad {
        assert_eq!(
            kem.encapsulate(public).map(|_| ()),
            Err(CryptoError::InvalidInput),
            "{what}"
        );
    }
    assert!(kem.encapsulate(pk).is_ok());
}

#[test]
fn rsa_decapsulation_failures() {
    let kem = provider()
        .kem(KemAlgorithm::Rsa2048E3Oaep)
        .expect("provider has RSA");
    let [(sk0, pk0), (sk1, _)] = rsa_keys();
    let (ct, ss) = kem.encapsulate(pk0).expect("encapsulate");
    assert_eq!(kem.decapsulate(sk0, &ct).expect("decapsulate"), ss);
    // The other key.
    assert_eq!(
        kem.decapsulate(sk1, &ct).map(|_| ()),
        Err(CryptoError::Failed)
    );
    // 0 (EM = 0, bad padding) and a value >= n.
    for c in [[0u8; 256], [0xff; 256]] {
        assert_eq!(
            kem.decapsulate(sk0, &c).map(|_| ()),
            Err(CryptoError::Failed)
        );
    }
    // A decapsulation secret that is not an RSA PKCS#8 key.
    let truncated = Secret::from_slice(&sk0.expose()[..sk0.len() - 1]);
    let x25519 = provider()
        .kem(KemAlgorithm::X25519)
        .expect("X25519")
        .generate()
        .expect("generate")
        .0;
    for bad in [truncated, x25519, Secret::new(Vec::new())] {
        assert_eq!(
            kem.decapsulate(&bad, &ct).map(|_| ()),
            Err(CryptoError::InvalidInput)
        );
    }
}

#[test]
fn ed25519_sign_verify_round_trip() {
    let p = provider();
    for _ in 0..4 {
        let (sk, pk) = p.ed25519.generate().expect("generate");
        assert_eq!(sk.len(), 32, "seed length");
        assert_eq!(pk.len(), 32, "public key length");
        assert_eq!(p.ed25519.public_key(&sk).expect("public_key"), pk);
        for msg in [&b""[..], b"cohort", &[0xa5; 1000]] {
            let sig = p.ed25519.sign(&sk, msg).expect("sign");
            assert_eq!(sig.len(), 64);
            // Ed25519 is deterministic.
            assert_eq!(p.ed25519.sign(&sk, msg).expect("sign"), sig);
            assert_eq!(p.ed25519.verify(&pk, msg, &sig), Ok(()));
            let mut other = msg.to_vec();
            other.push(0);
            assert!(p.ed25519.verify(&pk, &other, &sig).is_err());
            let mut bad = sig.clone();
            bad[10] ^= 1;
            assert!(p.ed25519.verify(&pk, msg, &bad).is_err());
            assert!(p.ed25519.verify(&pk, msg, &sig[..63]).is_err());
        }
        let (_, other_pk) = p.ed25519.generate().expect("generate");
        let sig = p.ed25519.sign(&sk, b"x").expect("sign");
        assert!(p.ed25519.verify(&other_pk, b"x", &sig).is_err());
    }
}

#[test]
fn ed25519_rfc8032_test_1() {
    // RFC 8032 §7.1, TEST 1 (empty message).
    let p = provider();
    let sk = Secret::new(
        hex::decode("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
            .expect("hex"),
    );
    let pk = hex::decode("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
        .expect("hex");
    let sig = hex::decode(
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
    )
    .expect("hex");
    assert_eq!(p.ed25519.public_key(&sk).expect("public_key"), pk);
    assert_eq!(p.ed25519.sign(&sk, b"").expect("sign"), sig);
    assert_eq!(p.ed25519.verify(&pk, b"", &sig), Ok(()));
}

#[test]
fn ed25519_rejects_bad_seed_length() {
    let p = provider();
    for len in [0, 31, 33, 64] {
        let sk = Secret::new(vec![7; len]);
        assert_eq!(
            p.ed25519.public_key(&sk),
            Err(CryptoError::InvalidInput),
            "{len}"
        );
        assert_eq!(
            p.ed25519.sign(&sk, b"m"),
            Err(CryptoError::InvalidInput),
            "{len}"
        );
    }
}

/// A key parsed once signs exactly what signing from the seed does; `None`, or a key the
/// scheme did not make, falls back to the seed; a bad seed is refused as before.
#[test]
fn ed25519_signing_key_signs_as_the_seed_does() {
    let p = provider();
    for _ in 0..3 {
        let (sk, pk) = p.ed25519.generate().expect("generate");
        let key = p
            .ed25519
            .signing_key(&sk)
            .expect("signing_key")
            .expect("aws-lc keeps a key");
        assert_eq!(key.public_key(), pk.as_slice());
        let foreign = SigningKey::new(7u32, pk.clone());
        for msg in [b"".as_slice(), b"hello", &[0xa5; 1000]] {
            let sig = p.ed25519.sign(&sk, msg).expect("sign");
            for k in [Some(&key), None, Some(&foreign)] {
                assert_eq!(p.ed25519.sign_with_key(k, &sk, msg), Ok(sig.clone()));
            }
            assert_eq!(p.ed25519.verify(&pk, msg, &sig), Ok(()));
        }
        assert!(!format!("{key:?}").contains(&format!("{:?}", sk.expose())));
    }
    for len in [0, 31, 33] {
        let sk = Secret::new(vec![7; len]);
        assert_eq!(
            p.ed25519.signing_key(&sk).err(),
            Some(CryptoError::InvalidInput),
            "{len}"
        );
    }
}

#[test]
fn aead_rejects_wrong_key_length_and_short_input() {
    let p = provider();
    for alg in [
        AeadAlgorithm::Aes128Gcm,
        AeadAlgorithm::Aes256Gcm,
        AeadAlgorithm::ChaCha20Poly1305,
    ] {
        for len in [0, alg.key_len() - 1, alg.key_len() + 1, 24] {
            assert!(
                p.aead.new_key(alg, &vec![1; len]).is_err(),
                "{alg:?} {len}-byte key"
            );
        }
        let key = p.aead.new_key(alg, &vec![1; alg.key_len()]).expect("key");
        let nonce = [0u8; AEAD_NONCE_LEN];
        // Shorter than a tag.
        let mut short = [0u8; 15];
        assert!(key.open_in_place(&nonce, b"", &mut short).is_err());
        // Round trip, and a wrong AAD or nonce fails.
        let mut buf = *b"payload";
        let tag = key.seal_in_place(&nonce, b"aad", &mut buf).expect("seal");
        let sealed = [&buf[..], &tag[..]].concat();
        let mut copy = sealed.clone();
        assert_eq!(
            key.open_in_place(&nonce, b"aad", &mut copy).expect("open"),
            b"payload"
        );
        let mut copy = sealed.clone();
        assert!(key.open_in_place(&nonce, b"aaD", &mut copy).is_err());
        let mut copy = sealed.clone();
        assert!(key
            .open_in_place(&[1; AEAD_NONCE_LEN], b"aad", &mut copy)
            .is_err());
    }
}

#[test]
fn hkdf_output_length_limits() {
    let p = provider();
    let mut max = vec![0u8; 255 * 32];
    assert_eq!(
        p.hkdf_sha256.derive(b"salt", b"ikm", &[b"info"], &mut max),
        Ok(())
    );
    let mut too_long = vec![0u8; 255 * 32 + 1];
    assert_eq!(
        p.hkdf_sha256
            .derive(b"salt", b"ikm", &[b"info"], &mut too_long),
        Err(CryptoError::InvalidInput)
    );
    // A shorter output is a prefix of a longer one (same PRK and info).
    let mut short = [0u8; 40];
    p.hkdf_sha256
        .derive(b"salt", b"ikm", &[b"info"], &mut short)
        .expect("derive");
    assert_eq!(short[..], max[..40]);
}

#[test]
fn hmac_truncation_is_a_prefix() {
    let p = provider();
    let key = p.hmac_sha256.new_key(b"key");
    let mut full = [0u8; 32];
    key.sign(
        &[b"The quick brown fox ", b"jumps over the lazy dog"],
        &mut full,
    );
    // Well-known value (computed independently with Python's hmac module).
    assert_eq!(
        hex::encode(full),
        "f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8"
    );
    for n in [0, 1, 16, 31] {
        let mut out = vec![0u8; n];
        key.sign(&[b"The quick brown fox jumps over the lazy dog"], &mut out);
        assert_eq!(out[..], full[..n]);
    }
}

#[test]
fn aes_block_fips197_vector() {
    // FIPS 197 Appendix C.1 (AES-128).
    let p = provider();
    let key = hex::decode("000102030405060708090a0b0c0d0e0f").expect("hex");
    let cipher = p.aes_block.aes128(&key).expect("key");
    let mut blocks = [[0u8; 16]; 2];
    blocks[0].copy_from_slice(&hex::decode("00112233445566778899aabbccddeeff").expect("hex"));
    blocks[1] = blocks[0];
    cipher.encrypt_blocks(&mut blocks);
    for b in blocks {
        assert_eq!(hex::encode(b), "69c4e0d86a7b0430d8cdb78070b4c55a");
    }
    assert!(p.aes_block.aes128(&key[..15]).is_err());
    assert!(p.aes_block.aes128(&[0; 32]).is_err());
}

#[test]
fn random_fills() {
    let p = provider();
    let mut a = [0u8; 32];
    let mut b = [0u8; 32];
    p.random.fill(&mut a).expect("fill");
    p.random.fill(&mut b).expect("fill");
    assert_ne!(a, b);
    assert_ne!(a, [0; 32]);
    p.random.fill(&mut []).expect("empty fill");
}

// ---- Secret and ct_eq -------------------------------------------------------------------

#[test]
fn ct_eq_basics() {
    assert!(ct_eq(b"", b""));
    assert!(ct_eq(b"abc", b"abc"));
    assert!(!ct_eq(b"abc", b"abd"));
    assert!(!ct_eq(b"abc", b"bbc"));
    assert!(!ct_eq(b"abc", b"ab"));
    assert!(!ct_eq(b"", b"\0"));
    assert!(!ct_eq(&[0u8; 32], &[0u8; 33]));
    let mut x = [0x5au8; 64];
    for i in 0..64 {
        x[i] ^= 0x80;
        assert!(!ct_eq(&x, &[0x5a; 64]), "difference at {i}");
        x[i] ^= 0x80;
    }
    assert!(ct_eq(&x, &[0x5a; 64]));
}

#[test]
fn secret_basics() {
    fn zeroized_on_drop<T: ZeroizeOnDrop>() {}
    zeroized_on_drop::<Secret>();

    let mut s = Secret::new(vec![0xde, 0xad, 0xbe, 0xef]);
    assert_eq!(s.len(), 4);
    assert!(!s.is_empty());
    let debug = format!("{s:?}");
    assert_eq!(debug, "Secret(4 bytes, redacted)");
    assert!(
        !debug.to_lowercase().contains("dead"),
        "Debug leaks the bytes"
    );
    assert!(
        !format!("{:#?}", s).contains("222"),
        "Debug leaks the bytes"
    );

    let c = s.clone();
    assert_eq!(c, s);
    s.expose_mut()[0] = 0;
    assert_ne!(c, s);
    assert_eq!(s.expose(), [0, 0xad, 0xbe, 0xef]);

    s.zeroize();
    assert!(s.is_empty(), "zeroize clears the secret");
    assert_eq!(
        c.expose(),
        [0xde, 0xad, 0xbe, 0xef],
        "a clone is independent"
    );

    let z = Secret::zeroed(5);
    assert_eq!(z.expose(), [0; 5]);
    assert_eq!(Secret::from_slice(&[1, 2]), Secret::new(vec![1, 2]));
    assert_ne!(Secret::from_slice(&[1, 2]), Secret::from_slice(&[1, 2, 0]));
    assert!(Secret::new(Vec::new()).is_empty());
}

#[test]
fn provider_debug_shows_only_the_name() {
    let p = provider();
    assert_eq!(p.name, "aws-lc-rs");
    assert_eq!(
        format!("{p:?}"),
        "CryptoProvider { name: \"aws-lc-rs\", .. }"
    );
}

#[test]
fn sha256_matches_fips_180_vectors_and_splits_anywhere() {
    // FIPS 180-2 appendix B.1 and the empty string.
    let p = provider();
    assert_eq!(
        hex::encode(p.sha256.sha256(&[b"abc"])),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(
        hex::encode(p.sha256.sha256(&[])),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        p.sha256.sha256(&[b"a", b"", b"bc"]),
        p.sha256.sha256(&[b"abc"])
    );
}
