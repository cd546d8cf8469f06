//! Wycheproof vectors (C2SP `testvectors_v1`, copied to `vectors/wycheproof/`), run through
//! the provider API only: `CryptoProvider::default_provider()` and its trait objects.
//!
//! One test per vector file. Every test counts the cases it checked and the cases it skipped
//! (with the reason), asserts `checked + skipped == numberOfTests`, and asserts `checked`
//! equals the number expected for the current file, so a parsing mistake or a changed file
//! cannot make a test pass vacuously. Failures are collected and reported together.
//!
//! File not covered: `xchacha20_poly1305_test.json` (the provider has no XChaCha20-Poly1305).
//!
//! Run with `--nocapture` to see the per-file summaries.

use cohort_crypto::hazmat::rsa_oaep_sha256_decrypt;
use cohort_crypto::{
    ct_eq, AeadAlgorithm, CryptoError, CryptoProvider, KemAlgorithm, Secret, AEAD_NONCE_LEN,
    AEAD_TAG_LEN,
};
use serde_json::Value;
use std::collections::BTreeMap;

macro_rules! vector_file {
    ($name:literal) => {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../vectors/wycheproof/",
            $name
        )
    };
}

// ---- Parsing ----------------------------------------------------------------------------

/// A loaded vector file.
struct Vectors {
    path: &'static str,
    json: Value,
}

impl Vectors {
    fn load(path: &'static str) -> Vectors {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
        let json: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {path}: {e}"));
        let v = Vectors { path, json };
        // Parser sanity: the groups hold exactly `numberOfTests` cases.
        let total: usize = v.groups().iter().map(|g| tests(g).len()).sum();
        assert_eq!(
            total,
            v.number_of_tests(),
            "{path}: numberOfTests disagrees with testGroups"
        );
        assert!(total > 0, "{path}: no tests");
        v
    }

    fn number_of_tests(&self) -> usize {
        let n = self.json["numberOfTests"].as_u64().expect("numberOfTests");
        usize::try_from(n).expect("numberOfTests fits usize")
    }

    fn groups(&self) -> &[Value] {
        self.json["testGroups"]
            .as_array()
            .expect("testGroups is an array")
    }

    fn algorithm(&self) -> &str {
        self.json["algorithm"].as_str().expect("algorithm")
    }
}

fn tests(group: &Value) -> &[Value] {
    group["tests"].as_array().expect("tests is an array")
}

/// A group-level integer field (keySize, ivSize, tagSize), in bits.
fn group_bits(group: &Value, field: &str) -> usize {
    let n = group[field]
        .as_u64()
        .unwrap_or_else(|| panic!("group field {field}"));
    usize::try_from(n).expect("fits usize")
}

fn hex_field(case: &Value, field: &str) -> Vec<u8> {
    let s = case[field]
        .as_str()
        .unwrap_or_else(|| panic!("tcId {}: no field {field}", id(case)));
    hex::decode(s).unwrap_or_else(|e| panic!("tcId {}: field {field} is not hex: {e}", id(case)))
}

fn id(case: &Value) -> u64 {
    case["tcId"].as_u64().expect("tcId")
}

fn flags(case: &Value) -> Vec<&str> {
    case["flags"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Valid,
    Invalid,
    Acceptable,
}

fn expect(case: &Value) -> Expect {
    match case["result"].as_str() {
        Some("valid") => Expect::Valid,
        Some("invalid") => Expect::Invalid,
        Some("acceptable") => Expect::Acceptable,
        other => panic!("tcId {}: unknown result {other:?}", id(case)),
    }
}

/// Counts and failures for one file.
#[derive(Default)]
struct Tally {
    checked: usize,
    skipped: BTreeMap<String, usize>,
    failures: Vec<String>,
    notes: BTreeMap<String, usize>,
}

impl Tally {
    fn skip(&mut self, reason: String, n: usize) {
        *self.skipped.entry(reason).or_default() += n;
    }

    fn note(&mut self, what: String) {
        *self.notes.entry(what).or_default() += 1;
    }

    fn fail(&mut self, case: &Value, what: String) {
        self.failures.push(format!(
            "tcId {} ({:?}, flags {:?}, {:?}): {what}",
            id(case),
            expect(case),
            flags(case),
            case["comment"].as_str().unwrap_or("")
        ));
    }

    fn check(&mut self, case: &Value, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.fail(case, what());
        }
    }

    fn skipped_total(&self) -> usize {
        self.skipped.values().sum()
    }

    /// Prints the summary and asserts: no failures, `checked == expected_checked`, and every
    /// case was either checked or skipped.
    fn finish(self, v: &Vectors, expected_checked: usize) {
        println!(
            "{} ({}): checked {}, skipped {} of {}",
            v.path.rsplit('/').next().unwrap_or(v.path),
            v.algorithm(),
            self.checked,
            self.skipped_total(),
            v.number_of_tests()
        );
        for (reason, n) in &self.skipped {
            println!("    skipped {n}: {reason}");
        }
        for (what, n) in &self.notes {
            println!("    {n} x {what}");
        }
        assert!(
            self.failures.is_empty(),
            "{} failures in {}:\n{}",
            self.failures.len(),
            v.path,
            self.failures.join("\n")
        );
        assert!(self.checked > 0, "{}: nothing checked", v.path);
        assert_eq!(
            self.checked + self.skipped_total(),
            v.number_of_tests(),
            "{}: checked + skipped != numberOfTests",
            v.path
        );
        assert_eq!(
            self.checked, expected_checked,
            "{}: unexpected number of checked cases",
            v.path
        );
    }
}

fn provider() -> CryptoProvider {
    CryptoProvider::default_provider()
}

fn nonce(iv: &[u8]) -> Option<[u8; AEAD_NONCE_LEN]> {
    iv.try_into().ok()
}

// ---- HMAC-SHA256 ------------------------------------------------------------------------

#[test]
fn wycheproof_hmac_sha256() {
    let v = Vectors::load(vector_file!("hmac_sha256_test.json"));
    let p = provider();
    let mut tally = Tally::default();
    for group in v.groups() {
        let tag_len = group_bits(group, "tagSize") / 8;
        let key_len = group_bits(group, "keySize") / 8;
        assert!(tag_len > 0 && tag_len <= 32, "tagSize {tag_len} bytes");
        for case in tests(group) {
            let key = hex_field(case, "key");
            let msg = hex_field(case, "msg");
            let tag = hex_field(case, "tag");
            assert_eq!(key.len(), key_len, "tcId {}: keySize", id(case));

            let mac = p.hmac_sha256.new_key(&key);
            assert_eq!(mac.output_len(), 32);
            let mut out = vec![0u8; tag_len];
            mac.sign(&[&msg], &mut out);
            let matches = ct_eq(&out, &tag);

            // Splitting the message into parts must not change the MAC.
            let mid = msg.len() / 2;
            let mut split = vec![0u8; tag_len];
            mac.sign(&[&[], &msg[..mid], &msg[mid..]], &mut split);
            tally.check(case, split == out, || "MAC over parts differs".into());

            match expect(case) {
                Expect::Valid => tally.check(case, matches, || {
                    format!(
                        "tag mismatch: got {} want {}",
                        hex::encode(&out),
                        hex::encode(&tag)
                    )
                }),
                Expect::Invalid => tally.check(case, !matches, || "invalid tag accepted".into()),
                Expect::Acceptable => tally.fail(case, "no acceptable cases expected".into()),
            }
            tally.checked += 1;
        }
    }
    tally.finish(&v, 174);
}

// ---- AEADs ------------------------------------------------------------------------------

/// Runs an `AeadTest` file: groups with a 12-byte IV, a 16-byte tag and a key size `alg_for`
/// maps to an algorithm are checked; the rest are skipped (counted by reason) unless
/// `nonce_size_is_invalid`, in which case unsupported-IV groups must hold only invalid cases
/// (the provider's `&[u8; 12]` nonce type makes them unrepresentable, i.e. rejected).
fn run_aead_file(
    v: &Vectors,
    alg_for: impl Fn(usize) -> Option<AeadAlgorithm>,
    nonce_size_is_invalid: bool,
) -> Tally {
    let p = provider();
    let mut tally = Tally::default();
    for group in v.groups() {
        let key_bits = group_bits(group, "keySize");
        let iv_bits = group_bits(group, "ivSize");
        let tag_bits = group_bits(group, "tagSize");
        let cases = tests(group);
        let Some(alg) = alg_for(key_bits) else {
            tally.skip(
                format!("{key_bits}-bit key not offered by the provider"),
                cases.len(),
            );
            continue;
        };
        if tag_bits != AEAD_TAG_LEN * 8 {
            tally.skip(format!("{tag_bits}-bit tag (provider: 128)"), cases.len());
            continue;
        }
        if iv_bits != AEAD_NONCE_LEN * 8 {
            if nonce_size_is_invalid {
                // The provider cannot even be asked: that is rejection by construction.
                for case in cases {
                    let iv = hex_field(case, "iv");
                    tally.check(case, expect(case) == Expect::Invalid, || {
                        "a valid case with an unrepresentable nonce".into()
                    });
                    tally.check(case, nonce(&iv).is_none(), || "nonce is 12 bytes".into());
                    tally.note(format!("{}-bit nonce rejected by the nonce type", iv_bits));
                    tally.checked += 1;
                }
            } else {
                tally.skip(format!("{iv_bits}-bit IV (provider: 96)"), cases.len());
            }
            continue;
        }
        for case in cases {
            check_aead_case(&p, alg, case, &mut tally);
            tally.checked += 1;
        }
    }
    tally
}

fn check_aead_case(p: &CryptoProvider, alg: AeadAlgorithm, case: &Value, tally: &mut Tally) {
    let key = hex_field(case, "key");
    let iv = hex_field(case, "iv");
    let aad = hex_field(case, "aad");
    let msg = hex_field(case, "msg");
    let ct = hex_field(case, "ct");
    let tag = hex_field(case, "tag");
    let Some(nonce) = nonce(&iv) else {
        return tally.fail(case, format!("{}-byte IV in a 96-bit group", iv.len()));
    };
    let key = match p.aead.new_key(alg, &key) {
        Ok(k) => k,
        Err(e) => return tally.fail(case, format!("new_key: {e:?}")),
    };
    assert_eq!(key.algorithm(), alg);
    let want = expect(case);

    // Seal: for valid cases the provider must reproduce ct and tag exactly.
    if want == Expect::Valid {
        let mut buf = msg.clone();
        match key.seal_in_place(&nonce, &aad, &mut buf) {
            Ok(t) => {
                tally.check(case, buf == ct, || {
                    format!(
                        "ct mismatch: got {} want {}",
                        hex::encode(&buf),
                        hex::encode(&ct)
                    )
                });
                tally.check(case, t[..] == tag[..], || {
                    format!(
                        "tag mismatch: got {} want {}",
                        hex::encode(t),
                        hex::encode(&tag)
                    )
                });
            }
            Err(e) => tally.fail(case, format!("seal failed: {e:?}")),
        }
    }

    // Open.
    let mut sealed = [ct.as_slice(), tag.as_slice()].concat();
    match (want, key.open_in_place(&nonce, &aad, &mut sealed)) {
        (Expect::Valid, Ok(pt)) => {
            let pt = pt.to_vec();
            tally.check(case, pt == msg, || {
                "open returned the wrong plaintext".into()
            });
        }
        (Expect::Valid, Err(e)) => tally.fail(case, format!("open rejected a valid case: {e:?}")),
        (Expect::Invalid, Ok(_)) => tally.fail(case, "open accepted an invalid case".into()),
        (Expect::Invalid, Err(e)) => {
            tally.check(case, e == CryptoError::Failed, || {
                format!("open error {e:?}")
            });
        }
        (Expect::Acceptable, _) => tally.fail(case, "no acceptable cases expected".into()),
    }
}

#[test]
fn wycheproof_aes_gcm() {
    let v = Vectors::load(vector_file!("aes_gcm_test.json"));
    let tally = run_aead_file(
        &v,
        |bits| match bits {
            128 => Some(AeadAlgorithm::Aes128Gcm),
            256 => Some(AeadAlgorithm::Aes256Gcm),
            _ => None,
        },
        false,
    );
    // 67 AES-128 + 66 AES-256 cases with 96-bit IVs; AES-192 and other IV sizes skipped.
    tally.finish(&v, 133);
}

#[test]
fn wycheproof_chacha20_poly1305() {
    let v = Vectors::load(vector_file!("chacha20_poly1305_test.json"));
    let tally = run_aead_file(
        &v,
        |bits| (bits == 256).then_some(AeadAlgorithm::ChaCha20Poly1305),
        true,
    );
    // 316 cases with 96-bit nonces, plus 9 invalid ones whose nonce is not 96 bits.
    tally.finish(&v, 325);
}

#[test]
fn wycheproof_aes_gmac() {
    let v = Vectors::load(vector_file!("aes_gmac_test.json"));
    let p = provider();
    let mut tally = Tally::default();
    for group in v.groups() {
        let key_bits = group_bits(group, "keySize");
        let iv_bits = group_bits(group, "ivSize");
        let tag_bits = group_bits(group, "tagSize");
        let cases = tests(group);
        let alg = match key_bits {
            128 => AeadAlgorithm::Aes128Gcm,
            256 => AeadAlgorithm::Aes256Gcm,
            _ => {
                tally.skip(
                    format!("{key_bits}-bit key not offered by the provider"),
                    cases.len(),
                );
                continue;
            }
        };
        if iv_bits != AEAD_NONCE_LEN * 8 || tag_bits != AEAD_TAG_LEN * 8 {
            tally.skip(
                format!("{iv_bits}-bit IV / {tag_bits}-bit tag"),
                cases.len(),
            );
            continue;
        }
        for case in cases {
            tally.checked += 1;
            let key = p
                .aead
                .new_key(alg, &hex_field(case, "key"))
                .expect("key length");
            let Some(nonce) = nonce(&hex_field(case, "iv")) else {
                tally.fail(case, "IV is not 12 bytes".into());
                continue;
            };
            let msg = hex_field(case, "msg");
            let tag = hex_field(case, "tag");
            // GMAC = GCM over an empty plaintext with the message as associated data.
            let computed = key.seal_in_place(&nonce, &msg, &mut []).expect("seal");
            let matches = ct_eq(&computed, &tag);
            let mut buf = tag.clone();
            let opened = key
                .open_in_place(&nonce, &msg, &mut buf)
                .map(|pt| pt.is_empty());
            match expect(case) {
                Expect::Valid => {
                    tally.check(case, matches, || {
                        format!("got {} want {}", hex::encode(computed), hex::encode(&tag))
                    });
                    tally.check(case, opened == Ok(true), || format!("open: {opened:?}"));
                }
                Expect::Invalid => {
                    tally.check(case, !matches, || "invalid tag reproduced".into());
                    tally.check(case, opened == Err(CryptoError::Failed), || {
                        format!("open: {opened:?}")
                    });
                }
                Expect::Acceptable => tally.fail(case, "no acceptable cases expected".into()),
            }
        }
    }
    // AES-128 and AES-256 groups with 96-bit IVs: 2 x 69.
    tally.finish(&v, 138);
}

// ---- HKDF-SHA256 ------------------------------------------------------------------------

#[test]
fn wycheproof_hkdf_sha256() {
    let v = Vectors::load(vector_file!("hkdf_sha256_test.json"));
    let p = provider();
    let mut tally = Tally::default();
    for group in v.groups() {
        for case in tests(group) {
            tally.checked += 1;
            let ikm = hex_field(case, "ikm");
            let salt = hex_field(case, "salt");
            let info = hex_field(case, "info");
            let okm = hex_field(case, "okm");
            let size = usize::try_from(case["size"].as_u64().expect("size")).expect("usize");
            let mut out = vec![0u8; size];
            let r = p.hkdf_sha256.derive(&salt, &ikm, &[&info], &mut out);
            match expect(case) {
                Expect::Valid => {
                    tally.check(case, r.is_ok(), || format!("derive failed: {r:?}"));
                    tally.check(case, out == okm, || "okm mismatch".into());
                    // `info` given in parts is concatenated.
                    let mid = info.len() / 3;
                    let mut split = vec![0u8; size];
                    let r2 = p.hkdf_sha256.derive(
                        &salt,
                        &ikm,
                        &[&info[..mid], &info[mid..]],
                        &mut split,
                    );
                    tally.check(case, r2.is_ok() && split == okm, || {
                        "split info differs".into()
                    });
                }
                Expect::Invalid => {
                    tally.check(case, r == Err(CryptoError::InvalidInput), || {
                        format!("derive of {size} bytes returned {r:?}")
                    });
                }
                Expect::Acceptable => tally.fail(case, "no acceptable cases expected".into()),
            }
        }
    }
    tally.finish(&v, 86);
}

// ---- X25519 -----------------------------------------------------------------------------

/// X25519 through the KEM interface: `decapsulate(private, public)` is DH(private, public).
///
/// Policy for `acceptable` cases (all of them in this file are acceptable *public keys*):
/// * an all-zero shared secret (low-order public key, RFC 7748 §6.1) must be rejected: the
///   provider documents that it rejects it, and protocols rely on that;
/// * every other acceptable case (points on the twist, non-canonical encodings of u >= p)
///   must be accepted with exactly the expected output: X25519 is defined on all 32-byte
///   strings and RFC 7748 §5 says non-canonical values MUST be accepted and reduced mod p.
#[test]
fn wycheproof_x25519() {
    let v = Vectors::load(vector_file!("x25519_test.json"));
    let kem = provider()
        .kem(KemAlgorithm::X25519)
        .expect("provider has X25519");
    let mut tally = Tally::default();
    for group in v.groups() {
        assert_eq!(group["curve"].as_str(), Some("curve25519"));
        for case in tests(group) {
            tally.checked += 1;
            let private = Secret::from_slice(&hex_field(case, "private"));
            let public = hex_field(case, "public");
            let shared = hex_field(case, "shared");
            let zero_shared = shared.iter().all(|&b| b == 0);
            let r = kem.decapsulate(&private, &public);
            let got = r.as_ref().map(|s| s.expose().to_vec());
            match (expect(case), &got) {
                (Expect::Valid, Ok(k)) => tally.check(case, *k == shared, || {
                    format!("got {} want {}", hex::encode(k), hex::encode(&shared))
                }),
                (Expect::Valid, Err(e)) => {
                    tally.fail(case, format!("rejected a valid case: {e:?}"))
                }
                (Expect::Invalid, Ok(_)) => tally.fail(case, "accepted an invalid case".into()),
                (Expect::Invalid, Err(_)) => {}
                (Expect::Acceptable, Ok(k)) => {
                    tally.note("acceptable case accepted".into());
                    tally.check(case, !zero_shared, || {
                        "all-zero shared secret accepted".into()
                    });
                    tally.check(case, *k == shared, || {
                        format!(
                            "accepted with {} want {}",
                            hex::encode(k),
                            hex::encode(&shared)
                        )
                    });
                }
                (Expect::Acceptable, Err(e)) => {
                    tally.note(format!("acceptable case rejected ({e:?})"));
                    tally.check(case, zero_shared, || {
                        format!("rejected a non-zero-output acceptable case: {e:?}")
                    });
                }
            }
        }
    }
    tally.finish(&v, 518);
}

// ---- Ed25519 ----------------------------------------------------------------------------

#[test]
fn wycheproof_ed25519() {
    let v = Vectors::load(vector_file!("ed25519_test.json"));
    let p = provider();
    let mut tally = Tally::default();
    for group in v.groups() {
        let key = &group["publicKey"];
        assert_eq!(key["curve"].as_str(), Some("edwards25519"));
        let public = hex_field(key, "pk");
        assert_eq!(public.len(), 32);
        for case in tests(group) {
            tally.checked += 1;
            let msg = hex_field(case, "msg");
            let sig = hex_field(case, "sig");
            let r = p.ed25519.verify(&public, &msg, &sig);
            match expect(case) {
                Expect::Valid => tally.check(case, r.is_ok(), || format!("rejected: {r:?}")),
                Expect::Invalid => tally.check(case, r.is_err(), || "accepted".into()),
                Expect::Acceptable => tally.fail(case, "no acceptable cases expected".into()),
            }
        }
    }
    tally.finish(&v, 151);
}

// ---- ML-KEM-768 encapsulation -----------------------------------------------------------

/// The provider's encapsulation is randomized (aws-lc-rs takes no `m`), so `c` and `K` cannot
/// be reproduced. What is checked: valid encapsulation keys are accepted and give a 1088-byte
/// ciphertext and a 32-byte secret (the lengths of `c` and `K`); invalid ones (wrong length,
/// coefficients not reduced mod q: the FIPS 203 §7.2 modulus check) are rejected. The same
/// key is also run through the X25519+ML-KEM-768 hybrid (behind a valid X25519 key), which
/// must accept and reject exactly the same keys.
///
/// Error kinds: wrong lengths give `InvalidInput`; unreduced 1184-byte keys currently give
/// `Failed`, because aws-lc-rs's `EncapsulationKey::new` accepts them and only `encapsulate`
/// performs the modulus check (the summary prints the counts). Either error is a rejection.
#[test]
fn wycheproof_mlkem_768_encaps() {
    let v = Vectors::load(vector_file!("mlkem_768_encaps_test.json"));
    let p = provider();
    let kem = p
        .kem(KemAlgorithm::MlKem768)
        .expect("provider has ML-KEM-768");
    let hybrid = p
        .kem(KemAlgorithm::X25519MlKem768)
        .expect("provider has the hybrid");
    let mut x25519_base_point = [0u8; 32];
    x25519_base_point[0] = 9;
    let mut tally = Tally::default();
    for group in v.groups() {
        assert_eq!(group["parameterSet"].as_str(), Some("ML-KEM-768"));
        for case in tests(group) {
            tally.checked += 1;
            let ek = hex_field(case, "ek");
            let r = kem.encapsulate(&ek);
            let hybrid_ok = hybrid
                .encapsulate(&[&x25519_base_point[..], &ek].concat())
                .is_ok();
            tally.check(case, hybrid_ok == r.is_ok(), || {
                format!(
                    "hybrid accepted: {hybrid_ok}, ML-KEM accepted: {}",
                    r.is_ok()
                )
            });
            match (expect(case), r) {
                (Expect::Valid, Ok((c, k))) => {
                    let want_c = hex_field(case, "c").len();
                    let want_k = hex_field(case, "K").len();
                    tally.check(case, c.len() == want_c && k.len() == want_k, || {
                        format!(
                            "lengths ({}, {}) want ({want_c}, {want_k})",
                            c.len(),
                            k.len()
                        )
                    });
                }
                (Expect::Valid, Err(e)) => tally.fail(case, format!("rejected: {e:?}")),
                (Expect::Invalid, Ok(_)) => {
                    tally.fail(case, format!("accepted a {}-byte invalid key", ek.len()));
                }
                (Expect::Invalid, Err(e)) => {
                    if ek.len() == 1184 {
                        tally.note(format!("unreduced 1184-byte key rejected with {e:?}"));
                    } else {
                        tally.check(case, e == CryptoError::InvalidInput, || {
                            format!("wrong-length key: error {e:?}")
                        });
                        tally.note(format!("wrong-length key rejected with {e:?}"));
                    }
                }
                (Expect::Acceptable, _) => tally.fail(case, "no acceptable cases expected".into()),
            }
        }
    }
    tally.finish(&v, 265);
}

// ---- RSA-OAEP (SHA-256, MGF1-SHA256) ----------------------------------------------------

/// RSAES-OAEP decryption through `hazmat::rsa_oaep_sha256_decrypt`, the aws-lc-rs routine
/// the `Rsa2048E3Oaep` KEM decapsulates with. Wycheproof's key has e = 65537 (the KEM's have
/// e = 3), which makes no difference to decryption.
///
/// Every case: valid ones must decrypt to `msg` under their `label`; invalid ones must fail,
/// and those with bad OAEP padding with exactly `Failed` (one error for every padding
/// failure, against Manger's attack); malformed ciphertexts may also give `InvalidInput`
/// (the summary prints which). There are no acceptable cases in this file; any would be
/// recorded, not failed. Cases with an empty label also go through the KEM's `decapsulate`
/// (with Wycheproof's key as the decapsulation secret): only a valid 32-byte message may
/// come out, and it must be `msg`.
#[test]
fn wycheproof_rsa_oaep_2048_sha256() {
    let v = Vectors::load(vector_file!("rsa_oaep_2048_sha256_mgf1sha256_test.json"));
    let kem = provider()
        .kem(KemAlgorithm::Rsa2048E3Oaep)
        .expect("provider has RSA");
    let mut tally = Tally::default();
    let mut kem_checked = 0;
    for group in v.groups() {
        assert_eq!(group["type"].as_str(), Some("RsaesOaepDecrypt"));
        assert_eq!(group["sha"].as_str(), Some("SHA-256"));
        assert_eq!(group["mgf"].as_str(), Some("MGF1"));
        assert_eq!(group["mgfSha"].as_str(), Some("SHA-256"));
        assert_eq!(group_bits(group, "keySize"), 2048);
        let pkcs8 = hex_field(group, "privateKeyPkcs8");
        for case in tests(group) {
            tally.checked += 1;
            let msg = hex_field(case, "msg");
            let ct = hex_field(case, "ct");
            let label = hex_field(case, "label");
            let got = rsa_oaep_sha256_decrypt(&pkcs8, &label, &ct).map(|pt| pt.expose().to_vec());
            match (expect(case), &got) {
                (Expect::Valid, Ok(pt)) => tally.check(case, *pt == msg, || {
                    format!("got {} want {}", hex::encode(pt), hex::encode(&msg))
                }),
                (Expect::Valid, Err(e)) => tally.fail(case, format!("rejected: {e:?}")),
                (Expect::Invalid, Ok(pt)) => {
                    tally.fail(case, format!("accepted, giving {}", hex::encode(pt)))
                }
                (Expect::Invalid, Err(e)) => {
                    if flags(case).contains(&"InvalidOaepPadding") {
                        tally.check(case, *e == CryptoError::Failed, || {
                            format!("bad padding gave {e:?}, not Failed")
                        });
                    }
                    tally.note(format!("invalid {:?} rejected with {e:?}", flags(case)));
                }
                (Expect::Acceptable, Ok(_)) => tally.note("acceptable case decrypted".into()),
                (Expect::Acceptable, Err(e)) => {
                    tally.note(format!("acceptable case rejected ({e:?})"))
                }
            }

            if label.is_empty() {
                kem_checked += 1;
                let secret = Secret::from_slice(&pkcs8);
                let r = kem.decapsulate(&secret, &ct);
                let want = (expect(case) == Expect::Valid && msg.len() == 32).then_some(&msg);
                match (want, &r) {
                    (Some(m), Ok(ss)) => tally.check(case, ss.expose() == m.as_slice(), || {
                        "KEM decapsulated a different secret".into()
                    }),
                    (Some(_), Err(e)) => tally.fail(case, format!("KEM rejected: {e:?}")),
                    (None, Ok(_)) => tally.fail(case, "KEM accepted".into()),
                    (None, Err(_)) => {}
                }
            }
        }
    }
    // 8 cases have a label; tcId 7 is the only valid 32-byte message.
    assert_eq!(kem_checked, 29, "cases run through the KEM");
    tally.finish(&v, 37);
}
