//! Ed25519 identities, cohort's one public-key text format, and the identity file.
//!
//! A public key is written `ed25519:` followed by 64 lowercase hex characters, everywhere:
//! on the command line, in configuration, in logs. An identity (secret seed and public key)
//! is stored in a small versioned text file:
//!
//! ```text
//! cohort-identity v1
//! public ed25519:<64 hex>
//! secret <64 hex: the Ed25519 seed>
//! ```
//!
//! Loading checks that the public key is the one the secret gives, so a file whose lines
//! were mixed up (or edited) is refused rather than silently used under the wrong name.
//!
//! # Example
//! ```
//! use cohort_channel::identity::{Identity, PublicKey};
//! use cohort_crypto::CryptoProvider;
//!
//! let provider = CryptoProvider::default_provider();
//! let id = Identity::generate(&provider).unwrap();
//! let text = id.to_file_text();
//! let loaded = Identity::from_file_text(&provider, &text).unwrap();
//! assert_eq!(loaded.public(), id.public());
//!
//! let printed = id.public().to_string();
//! assert!(printed.starts_with("ed25519:"));
//! assert_eq!(printed.parse::<PublicKey>().unwrap(), id.public());
//! ```

use cohort_crypto::{CryptoError, CryptoProvider, Secret, SigningKey};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use zeroize::Zeroizing;

/// Length of an Ed25519 public key in bytes.
pub const PUBLIC_KEY_LEN: usize = 32;
/// Length of an Ed25519 secret seed in bytes.
pub const SECRET_SEED_LEN: usize = 32;
/// Length of an Ed25519 signature in bytes.
pub const SIGNATURE_LEN: usize = 64;
/// The prefix of a public key's text form.
pub const PUBLIC_KEY_PREFIX: &str = "ed25519:";
/// The first line of a version 1 identity file.
pub const IDENTITY_FILE_HEADER: &str = "cohort-identity v1";

const FILE_MAGIC: &str = "cohort-identity ";
const PUBLIC_FIELD: &str = "public ";
const SECRET_FIELD: &str = "secret ";

/// An Ed25519 public key. Its text form (`Display`, `FromStr`, `Debug`) is `ed25519:`
/// followed by 64 lowercase hex characters.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey([u8; PUBLIC_KEY_LEN]);

impl PublicKey {
    /// The key with these 32 bytes. Any bytes are accepted; a value that is not a curve point
    /// simply never verifies.
    pub const fn from_bytes(bytes: [u8; PUBLIC_KEY_LEN]) -> Self {
        PublicKey(bytes)
    }

    /// The 32 key bytes.
    pub const fn as_bytes(&self) -> &[u8; PUBLIC_KEY_LEN] {
        &self.0
    }

    /// Whether `signature` is a valid Ed25519 signature on `message` under this key.
    pub fn verify(&self, provider: &CryptoProvider, message: &[u8], signature: &[u8]) -> bool {
        provider.ed25519.verify(&self.0, message, signature).is_ok()
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(PUBLIC_KEY_PREFIX)?;
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

/// Why a public key's text form was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PublicKeyParseError {
    /// The text does not start with `ed25519:` (another algorithm, or no prefix at all).
    MissingPrefix,
    /// After the prefix there were not exactly 64 characters; this is how many there were.
    WrongLength(usize),
    /// After the prefix there was a character that is not a lowercase hex digit.
    NotHex,
}

impl fmt::Display for PublicKeyParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PublicKeyParseError::MissingPrefix => {
                write!(f, "a public key must start with '{PUBLIC_KEY_PREFIX}'")
            }
            PublicKeyParseError::WrongLength(n) => write!(
                f,
                "a public key is '{PUBLIC_KEY_PREFIX}' and 64 hex characters, not {n}"
            ),
            PublicKeyParseError::NotHex => {
                f.write_str("a public key's 64 characters must be lowercase hex (0-9, a-f)")
            }
        }
    }
}

impl std::error::Error for PublicKeyParseError {}

impl FromStr for PublicKey {
    type Err = PublicKeyParseError;

    /// Accepts exactly `ed25519:` and 64 lowercase hex characters: no whitespace, no
    /// uppercase, so every key has one spelling and text comparison is key comparison.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex_part = s
            .strip_prefix(PUBLIC_KEY_PREFIX)
            .ok_or(PublicKeyParseError::MissingPrefix)?;
        let mut out = [0u8; PUBLIC_KEY_LEN];
        decode_lower_hex(hex_part, &mut out).map_err(|e| match e {
            HexError::Length(n) => PublicKeyParseError::WrongLength(n),
            HexError::Digit => PublicKeyParseError::NotHex,
        })?;
        Ok(PublicKey(out))
    }
}

enum HexError {
    /// Not `2 * out.len()` characters; this many.
    Length(usize),
    /// A character outside `0-9a-f`.
    Digit,
}

/// Decodes exactly `2 * out.len()` lowercase hex characters into `out`, without an
/// intermediate buffer (so a secret is never copied anywhere but `out`).
fn decode_lower_hex(s: &str, out: &mut [u8]) -> Result<(), HexError> {
    let n = s.chars().count();
    if n != out.len() * 2 {
        return Err(HexError::Length(n));
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(HexError::Digit);
    }
    hex::decode_to_slice(s, out).map_err(|_| HexError::Digit)
}

/// An Ed25519 identity: the secret seed (in a [`Secret`]) and its public key.
///
/// `Debug` shows the public key only.
#[derive(Clone)]
pub struct Identity {
    secret: Secret,
    public: PublicKey,
    /// The seed parsed once by the provider that made the identity
    /// ([`SignatureScheme::signing_key`](cohort_crypto::SignatureScheme::signing_key)), so
    /// that [`sign`](Self::sign) does not derive the key pair from the seed for every
    /// signature (a scalar multiplication, about as costly as the signature). `None` if
    /// that provider keeps no such key. Shared by clones; the default provider's key is
    /// aws-lc's, which overwrites it when freed (`EVP_PKEY_free`, then `OPENSSL_free`'s
    /// `OPENSSL_cleanse`) as the last clone drops it.
    key: Option<Arc<SigningKey>>,
}

impl Identity {
    /// A fresh identity from the provider's randomness. This is one of the few places that
    /// uses the operating system's RNG (through the provider); protocol cores take an
    /// existing identity instead.
    pub fn generate(provider: &CryptoProvider) -> Result<Identity, CryptoError> {
        let (secret, _public) = provider.ed25519.generate()?;
        // Derive the public key again rather than trusting the pair: `from_secret` is the one
        // place that decides what an identity's public key is.
        Identity::from_secret(provider, secret)
    }

    /// The identity for a 32-byte Ed25519 seed. `CryptoError::InvalidInput` if the secret is
    /// not 32 bytes or the backend refuses it.
    pub fn from_secret(provider: &CryptoProvider, secret: Secret) -> Result<Identity, CryptoError> {
        if secret.len() != SECRET_SEED_LEN {
            return Err(CryptoError::InvalidInput);
        }
        // One derivation either way: a kept key carries its public key.
        let key = provider.ed25519.signing_key(&secret)?;
        let public = match &key {
            Some(key) => key.public_key().to_vec(),
            None => provider.ed25519.public_key(&secret)?,
        };
        let public: [u8; PUBLIC_KEY_LEN] = public
            .as_slice()
            .try_into()
            .map_err(|_| CryptoError::Failed)?;
        Ok(Identity {
            secret,
            public: PublicKey(public),
            key: key.map(Arc::new),
        })
    }

    /// The public key.
    pub fn public(&self) -> PublicKey {
        self.public
    }

    /// The 32-byte secret seed.
    pub fn secret(&self) -> &Secret {
        &self.secret
    }

    /// An Ed25519 signature (64 bytes) on `message`, by `provider` (with the key parsed
    /// when the identity was made, if `provider`'s scheme made it; from the seed otherwise).
    pub fn sign(&self, provider: &CryptoProvider, message: &[u8]) -> Result<Vec<u8>, CryptoError> {
        provider
            .ed25519
            .sign_with_key(self.key.as_deref(), &self.secret, message)
    }

    /// The identity file's text (see the [module docs](self)), ending in a newline. It holds
    /// the secret, so it is wiped when dropped; write it to a file only the owner can read.
    pub fn to_file_text(&self) -> Zeroizing<String> {
        let secret_hex = Zeroizing::new(hex::encode(self.secret.expose()));
        let public = self.public.to_string();
        let len = IDENTITY_FILE_HEADER.len()
            + 1
            + PUBLIC_FIELD.len()
            + public.len()
            + 1
            + SECRET_FIELD.len()
            + secret_hex.len()
            + 1;
        // Allocated once at its final size: a growing String would leave unwiped copies of
        // the secret in the buffers it outgrew.
        let mut text = Zeroizing::new(String::with_capacity(len));
        for part in [
            IDENTITY_FILE_HEADER,
            "\n",
            PUBLIC_FIELD,
            &public,
            "\n",
            SECRET_FIELD,
            &secret_hex,
            "\n",
        ] {
            text.push_str(part);
        }
        text
    }

    /// Reads an identity file's text. Lines may end in `\n` or `\r\n`; nothing else is
    /// tolerated (no blank lines, comments or extra fields), and the public key must be the
    /// one the secret gives.
    pub fn from_file_text(
        provider: &CryptoProvider,
        text: &str,
    ) -> Result<Identity, IdentityError> {
        let mut lines = text.lines();
        let header = lines.next().ok_or(IdentityError::NotAnIdentityFile)?;
        if header != IDENTITY_FILE_HEADER {
            return Err(if header.starts_with(FILE_MAGIC) {
                IdentityError::UnsupportedVersion
            } else {
                IdentityError::NotAnIdentityFile
            });
        }
        let public = lines
            .next()
            .and_then(|l| l.strip_prefix(PUBLIC_FIELD))
            .ok_or(IdentityError::BadLine(2))?;
        let public: PublicKey = public.parse().map_err(IdentityError::PublicKey)?;
        let secret_hex = lines
            .next()
            .and_then(|l| l.strip_prefix(SECRET_FIELD))
            .ok_or(IdentityError::BadLine(3))?;
        if lines.next().is_some() {
            return Err(IdentityError::BadLine(4));
        }
        let mut secret = Secret::zeroed(SECRET_SEED_LEN);
        decode_lower_hex(secret_hex, secret.expose_mut()).map_err(|_| IdentityError::BadSecret)?;
        let identity = Identity::from_secret(provider, secret).map_err(IdentityError::Crypto)?;
        if identity.public != public {
            return Err(IdentityError::PublicKeyMismatch);
        }
        Ok(identity)
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

/// Why an identity file was refused. No variant carries any part of the secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdentityError {
    /// The first line is not `cohort-identity ...` (or the text is empty).
    NotAnIdentityFile,
    /// A `cohort-identity` file of a version this build does not read.
    UnsupportedVersion,
    /// This line (1-based) is missing, does not start with the expected field name, or (line
    /// 4 onwards) should not be there.
    BadLine(usize),
    /// The `public` line's key is not in the `ed25519:<64 hex>` form.
    PublicKey(PublicKeyParseError),
    /// The `secret` line is not 64 lowercase hex characters.
    BadSecret,
    /// The crypto backend refused the secret.
    Crypto(CryptoError),
    /// The `public` line is not the public key of the `secret` line.
    PublicKeyMismatch,
}

impl fmt::Display for IdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdentityError::NotAnIdentityFile => write!(
                f,
                "not a cohort identity file (the first line should be '{IDENTITY_FILE_HEADER}')"
            ),
            IdentityError::UnsupportedVersion => write!(
                f,
                "unsupported identity file version (this build reads '{IDENTITY_FILE_HEADER}')"
            ),
            IdentityError::BadLine(2) => {
                f.write_str("identity file line 2 should be 'public ed25519:<64 hex>'")
            }
            IdentityError::BadLine(3) => {
                f.write_str("identity file line 3 should be 'secret <64 hex>'")
            }
            IdentityError::BadLine(n) => write!(f, "identity file has an unexpected line {n}"),
            IdentityError::PublicKey(e) => write!(f, "identity file public key: {e}"),
            IdentityError::BadSecret => {
                f.write_str("identity file secret is not 64 lowercase hex characters")
            }
            IdentityError::Crypto(e) => write!(f, "identity file secret refused: {e}"),
            IdentityError::PublicKeyMismatch => {
                f.write_str("identity file public key does not match its secret")
            }
        }
    }
}

impl std::error::Error for IdentityError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            IdentityError::PublicKey(e) => Some(e),
            IdentityError::Crypto(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() -> CryptoProvider {
        CryptoProvider::default_provider()
    }

    fn fixed(seed_byte: u8) -> Identity {
        Identity::from_secret(&provider(), Secret::new(vec![seed_byte; 32])).unwrap()
    }

    #[test]
    fn rfc8032_test_1_public_key_and_signature() {
        // RFC 8032 section 7.1, TEST 1 (empty message).
        let seed = hex::decode("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
            .unwrap();
        let id = Identity::from_secret(&provider(), Secret::new(seed)).unwrap();
        assert_eq!(
            id.public().to_string(),
            "ed25519:d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
        );
        let sig = id.sign(&provider(), b"").unwrap();
        assert_eq!(
            hex::encode(&sig),
            "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155\
             5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
        );
        assert!(id.public().verify(&provider(), b"", &sig));
        assert!(!id.public().verify(&provider(), b"x", &sig));
    }

    /// A scheme that keeps no parsed key (the trait's defaults): signs from the seed.
    struct SeedOnly;

    impl cohort_crypto::SignatureScheme for SeedOnly {
        fn generate(&self) -> Result<(Secret, Vec<u8>), CryptoError> {
            provider().ed25519.generate()
        }
        fn public_key(&self, secret: &Secret) -> Result<Vec<u8>, CryptoError> {
            provider().ed25519.public_key(secret)
        }
        fn sign(&self, secret: &Secret, message: &[u8]) -> Result<Vec<u8>, CryptoError> {
            provider().ed25519.sign(secret, message)
        }
        fn verify(&self, public: &[u8], message: &[u8], sig: &[u8]) -> Result<(), CryptoError> {
            provider().ed25519.verify(public, message, sig)
        }
    }

    static SEED_ONLY: SeedOnly = SeedOnly;

    /// An identity signs with the key it parsed once exactly what signing from the seed
    /// gives, and so does one made by a provider that keeps no key, and their clones;
    /// signing goes through the provider it is given (a key made by another stays unused).
    #[test]
    fn the_kept_key_signs_as_the_seed_does() {
        let seed_only = CryptoProvider {
            ed25519: &SEED_ONLY,
            ..provider()
        };
        for byte in [1u8, 0x68, 0xff] {
            let kept = fixed(byte);
            let unkept = Identity::from_secret(&seed_only, Secret::new(vec![byte; 32])).unwrap();
            assert!(kept.key.is_some() && unkept.key.is_none());
            assert_eq!(kept.public(), unkept.public());
            for message in [b"".as_slice(), b"install", &[byte; 500]] {
                let want = provider().ed25519.sign(kept.secret(), message).unwrap();
                assert_eq!(kept.sign(&provider(), message).unwrap(), want);
                assert_eq!(kept.clone().sign(&provider(), message).unwrap(), want);
                assert_eq!(kept.sign(&seed_only, message).unwrap(), want);
                assert_eq!(unkept.sign(&provider(), message).unwrap(), want);
                assert_eq!(unkept.sign(&seed_only, message).unwrap(), want);
                assert!(kept.public().verify(&provider(), message, &want));
            }
        }
    }

    #[test]
    fn public_key_text_round_trips() {
        let id = Identity::generate(&provider()).unwrap();
        let text = id.public().to_string();
        assert_eq!(text.len(), 8 + 64);
        assert!(text.starts_with("ed25519:"));
        assert!(text[8..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_eq!(text.parse::<PublicKey>().unwrap(), id.public());
        assert_eq!(format!("{:?}", id.public()), format!("PublicKey({text})"));
        let bytes = *id.public().as_bytes();
        assert_eq!(PublicKey::from_bytes(bytes), id.public());
    }

    #[test]
    fn public_key_text_rejections() {
        let good = format!("ed25519:{}", "ab".repeat(32));
        assert!(good.parse::<PublicKey>().is_ok());
        let cases: Vec<(String, PublicKeyParseError)> = vec![
            (String::new(), PublicKeyParseError::MissingPrefix),
            ("ab".repeat(32), PublicKeyParseError::MissingPrefix),
            (
                format!("x25519:{}", "ab".repeat(32)),
                PublicKeyParseError::MissingPrefix,
            ),
            (
                format!("ED25519:{}", "ab".repeat(32)),
                PublicKeyParseError::MissingPrefix,
            ),
            (
                format!(" ed25519:{}", "ab".repeat(32)),
                PublicKeyParseError::MissingPrefix,
            ),
            ("ed25519:".into(), PublicKeyParseError::WrongLength(0)),
            (
                format!("ed25519:{}", "ab".repeat(31)),
                PublicKeyParseError::WrongLength(62),
            ),
            (
                format!("ed25519:{}a", "ab".repeat(32)),
                PublicKeyParseError::WrongLength(65),
            ),
            (format!("{good}\n"), PublicKeyParseError::WrongLength(65)),
            (
                format!("ed25519:{}", "AB".repeat(32)),
                PublicKeyParseError::NotHex,
            ),
            (
                format!("ed25519:{}zz", "ab".repeat(31)),
                PublicKeyParseError::NotHex,
            ),
            (
                format!("ed25519:{} a", "ab".repeat(31)),
                PublicKeyParseError::NotHex,
            ),
            // 64 characters but not 64 bytes: counted in characters, refused as non-hex.
            (
                format!("ed25519:{}é", "ab".repeat(32).get(1..).unwrap()),
                PublicKeyParseError::NotHex,
            ),
        ];
        for (text, want) in cases {
            let got = text.parse::<PublicKey>();
            assert_eq!(got, Err(want), "{text:?}");
            // Every error has a one-line message.
            let msg = want.to_string();
            assert!(!msg.is_empty() && !msg.contains('\n'));
        }
    }

    #[test]
    fn identity_file_round_trips() {
        let id = Identity::generate(&provider()).unwrap();
        let text = id.to_file_text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], "cohort-identity v1");
        assert_eq!(lines[1], format!("public {}", id.public()));
        assert_eq!(
            lines[2],
            format!("secret {}", hex::encode(id.secret().expose()))
        );
        assert!(text.ends_with('\n'));
        assert_eq!(text.capacity(), text.len(), "built without reallocating");
        let back = Identity::from_file_text(&provider(), &text).unwrap();
        assert_eq!(back.public(), id.public());
        assert_eq!(back.secret(), id.secret());
        // CRLF line endings and a missing final newline are fine.
        let crlf = text.replace('\n', "\r\n");
        assert_eq!(
            Identity::from_file_text(&provider(), &crlf)
                .unwrap()
                .public(),
            id.public()
        );
        assert_eq!(
            Identity::from_file_text(&provider(), text.trim_end())
                .unwrap()
                .public(),
            id.public()
        );
    }

    #[test]
    fn two_generated_identities_differ() {
        let a = Identity::generate(&provider()).unwrap();
        let b = Identity::generate(&provider()).unwrap();
        assert_ne!(a.public(), b.public());
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let id = fixed(0x5a);
        let secret_hex = hex::encode(id.secret().expose());
        let debug = format!("{id:?}");
        assert!(debug.contains(&id.public().to_string()), "{debug}");
        assert!(!debug.contains(&secret_hex), "{debug}");
        assert!(!debug.contains("5a5a"), "{debug}");
    }

    #[test]
    fn from_secret_rejects_wrong_lengths() {
        for len in [0, 31, 33, 64] {
            assert_eq!(
                Identity::from_secret(&provider(), Secret::zeroed(len)).err(),
                Some(CryptoError::InvalidInput),
                "{len}"
            );
        }
    }

    #[test]
    fn identity_file_rejections() {
        let id = fixed(1);
        let other = fixed(2);
        let public = format!("public {}", id.public());
        let secret = format!("secret {}", hex::encode(id.secret().expose()));
        let file = |lines: &[&str]| lines.join("\n");
        let cases: Vec<(String, IdentityError)> = vec![
            (String::new(), IdentityError::NotAnIdentityFile),
            (
                file(&["cohort-key v1", &public, &secret]),
                IdentityError::NotAnIdentityFile,
            ),
            (
                file(&["", "cohort-identity v1", &public, &secret]),
                IdentityError::NotAnIdentityFile,
            ),
            (
                file(&["cohort-identity v2", &public, &secret]),
                IdentityError::UnsupportedVersion,
            ),
            (
                file(&["cohort-identity v1 ", &public, &secret]),
                IdentityError::UnsupportedVersion,
            ),
            (file(&["cohort-identity v1"]), IdentityError::BadLine(2)),
            (
                file(&["cohort-identity v1", &secret, &public]),
                IdentityError::BadLine(2),
            ),
            (
                file(&["cohort-identity v1", "", &public, &secret]),
                IdentityError::BadLine(2),
            ),
            (
                file(&["cohort-identity v1", &public]),
                IdentityError::BadLine(3),
            ),
            (
                file(&["cohort-identity v1", &public, &public]),
                IdentityError::BadLine(3),
            ),
            (
                // A blank line after the final newline.
                file(&["cohort-identity v1", &public, &secret, "", ""]),
                IdentityError::BadLine(4),
            ),
            (
                file(&["cohort-identity v1", &public, &secret, "# comment"]),
                IdentityError::BadLine(4),
            ),
            (
                file(&[
                    "cohort-identity v1",
                    &format!("public x25519:{}", "00".repeat(32)),
                    &secret,
                ]),
                IdentityError::PublicKey(PublicKeyParseError::MissingPrefix),
            ),
            (
                file(&["cohort-identity v1", "public ed25519:00", &secret]),
                IdentityError::PublicKey(PublicKeyParseError::WrongLength(2)),
            ),
            (
                file(&["cohort-identity v1", &public, "secret 0011"]),
                IdentityError::BadSecret,
            ),
            (
                file(&[
                    "cohort-identity v1",
                    &public,
                    &format!("secret {}", "AB".repeat(32)),
                ]),
                IdentityError::BadSecret,
            ),
            (
                file(&["cohort-identity v1", &public, &format!("{secret}00")]),
                IdentityError::BadSecret,
            ),
            (
                file(&["cohort-identity v1", &public, &format!("{secret} ")]),
                IdentityError::BadSecret,
            ),
            (
                file(&[
                    "cohort-identity v1",
                    &format!("public {}", other.public()),
                    &secret,
                ]),
                IdentityError::PublicKeyMismatch,
            ),
        ];
        let secret_hex = hex::encode(id.secret().expose());
        for (text, want) in cases {
            let got = Identity::from_file_text(&provider(), &text).err();
            assert_eq!(got, Some(want), "{text:?}");
            let msg = want.to_string();
            assert!(!msg.contains('\n'), "{msg}");
            assert!(!msg.contains(&secret_hex), "{msg}");
        }
    }

    #[test]
    fn mismatch_is_caught_even_when_both_lines_are_well_formed() {
        // Swap the secrets of two valid files: each line parses, the pair does not match.
        let a = fixed(3).to_file_text();
        let b = fixed(4).to_file_text();
        let a_lines: Vec<&str> = a.lines().collect();
        let b_lines: Vec<&str> = b.lines().collect();
        let spliced = [a_lines[0], a_lines[1], b_lines[2]].join("\n");
        assert_eq!(
            Identity::from_file_text(&provider(), &spliced).err(),
            Some(IdentityError::PublicKeyMismatch)
        );
    }
}
