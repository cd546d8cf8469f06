//! Gears used as plain MACs over a message with caller-supplied key and nonce, as
//! `cohort gears tag` exposes them (like `openssl dgst -mac`). Packet protection derives keys
//! and nonces itself; this is for interoperability checks and scripts.
//!
//! | gear | key | nonce | tag |
//! |---|---|---|---|
//! | `hmac-sha256`, `hmac-sha256-128` | any length | none | HMAC-SHA256 (truncated) |
//! | `blake3-128` | 32 bytes | none | keyed BLAKE3, 16 bytes |
//! | `gmac-aes128` | 16 bytes | 12 bytes | AES-GCM tag, message as associated data |
//! | `umac-32` .. `umac-128` | 16 bytes | 1 to 16 bytes | RFC 4418 |
//! | `ifg` | 64 bytes | 0 to 8 bytes: the sequence number, big-endian | ifg tag |
//! | `partial-<n>` | 32 bytes | 0 to 8 bytes: the sequence number | partial MAC, whole message as body, empty header |
//! | `aes-128-gcm`, `aes-256-gcm`, `chacha20-poly1305` | 16 / 32 / 32 bytes | 12 bytes | AEAD tag over an empty plaintext, message as associated data |

use crate::gear::{GearId, GearKind};
use crate::ifg::Ifg;
use crate::partial::PartialMac;
use crate::umac::Umac;
use cohort_crypto::{AeadAlgorithm, CryptoProvider};
use std::fmt;

/// Why a plain MAC could not be computed. Each names the problem for a one-line message.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlainMacError {
    /// The key has the wrong length.
    KeyLength {
        /// The gear.
        gear: GearId,
        /// What it needs.
        expected: &'static str,
        /// What was given.
        got: usize,
    },
    /// The nonce has the wrong length (or a nonce was given to a gear that takes none).
    NonceLength {
        /// The gear.
        gear: GearId,
        /// What it needs.
        expected: &'static str,
        /// What was given.
        got: usize,
    },
    /// The gear has no tag (the null gear).
    NoTag(GearId),
    /// The message is longer than the gear accepts.
    MessageTooLong(GearId),
}

impl fmt::Display for PlainMacError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlainMacError::KeyLength {
                gear,
                expected,
                got,
            } => {
                write!(f, "{gear} needs a key of {expected}, got {got} bytes")
            }
            PlainMacError::NonceLength {
                gear,
                expected,
                got,
            } => {
                write!(f, "{gear} needs a nonce of {expected}, got {got} bytes")
            }
            PlainMacError::NoTag(gear) => write!(f, "{gear} computes no tag"),
            PlainMacError::MessageTooLong(gear) => write!(f, "message too long for {gear}"),
        }
    }
}

impl std::error::Error for PlainMacError {}

/// The tag of `message` under `gear` with an explicit `key` and `nonce`.
pub fn plain_mac(
    provider: &CryptoProvider,
    gear: GearId,
    key: &[u8],
    nonce: &[u8],
    message: &[u8],
) -> Result<Vec<u8>, PlainMacError> {
    let info = gear.info();
    let key_err = |expected| PlainMacError::KeyLength {
        gear,
        expected,
        got: key.len(),
    };
    let nonce_err = |expected| PlainMacError::NonceLength {
        gear,
        expected,
        got: nonce.len(),
    };
    let seq = |nonce: &[u8]| -> Result<u64, PlainMacError> {
        if nonce.len() > 8 {
            return Err(nonce_err("0 to 8 bytes"));
        }
        Ok(nonce.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    };
    let mut tag = vec![0u8; info.tag_len];
    match gear {
        GearId::DangerNullForTesting => return Err(PlainMacError::NoTag(gear)),
        GearId::HmacSha256 | GearId::HmacSha256_128 => {
            if !nonce.is_empty() {
                return Err(nonce_err("0 bytes (HMAC takes no nonce)"));
            }
            provider.hmac_sha256.new_key(key).sign(&[message], &mut tag);
        }
        GearId::Blake3_128 => {
            let k: &[u8; 32] = key.try_into().map_err(|_| key_err("32 bytes"))?;
            if !nonce.is_empty() {
                return Err(nonce_err("0 bytes (BLAKE3 takes no nonce)"));
            }
            provider.keyed_blake3.hash(k, &[message], &mut tag);
        }
        GearId::Umac32 | GearId::Umac64 | GearId::Umac96 | GearId::Umac128 => {
            if key.len() != 16 {
                return Err(key_err("16 bytes"));
            }
            if nonce.is_empty() || nonce.len() > 16 {
                return Err(nonce_err("1 to 16 bytes"));
            }
            let umac = Umac::new(provider, key, info.tag_len).map_err(|_| key_err("16 bytes"))?;
            umac.tag(nonce, message, &mut tag)
                .map_err(|_| nonce_err("1 to 16 bytes"))?;
        }
        GearId::IfgExperimental => {
            let ifg = Ifg::new(provider, key).map_err(|_| key_err("64 bytes"))?;
            ifg.tag(seq(nonce)?, message, &mut tag)
                .map_err(|_| PlainMacError::MessageTooLong(gear))?;
        }
        _ if info.partial_l.is_some() => {
            let l = info.partial_l.unwrap_or(2);
            let pm = PartialMac::new(provider, key, l).map_err(|_| key_err("32 bytes"))?;
            pm.tag(seq(nonce)?, message, 0, &mut tag)
                .map_err(|_| PlainMacError::MessageTooLong(gear))?;
        }
        _ => {
            let (algorithm, expected) = match gear {
                GearId::GmacAes128 | GearId::Aes128Gcm => (AeadAlgorithm::Aes128Gcm, "16 bytes"),
                GearId::Aes256Gcm => (AeadAlgorithm::Aes256Gcm, "32 bytes"),
                _ => (AeadAlgorithm::ChaCha20Poly1305, "32 bytes"),
            };
            debug_assert!(gear == GearId::GmacAes128 || info.kind == GearKind::Aead);
            let k = provider
                .aead
                .new_key(algorithm, key)
                .map_err(|_| key_err(expected))?;
            let n: &[u8; 12] = nonce.try_into().map_err(|_| nonce_err("12 bytes"))?;
            let t = k
                .seal_in_place(n, message, &mut [])
                .map_err(|_| PlainMacError::MessageTooLong(gear))?;
            tag.copy_from_slice(&t);
        }
    }
    Ok(tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc4418_row_through_the_plain_interface() {
        let p = CryptoProvider::default_provider();
        let msg = "abc".repeat(500);
        let tag = plain_mac(
            &p,
            GearId::Umac64,
            b"abcdefghijklmnop",
            b"bcdefghi",
            msg.as_bytes(),
        )
        .unwrap();
        assert_eq!(hex::encode(tag), "d4cf26ddefd5c01a");
    }

    #[test]
    fn rfc4231_case_2_through_the_plain_interface() {
        let p = CryptoProvider::default_provider();
        let tag = plain_mac(
            &p,
            GearId::HmacSha256,
            b"Jefe",
            &[],
            b"what do ya want for nothing?",
        )
        .unwrap();
        assert_eq!(
            hex::encode(tag),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn bad_lengths_name_the_problem() {
        let p = CryptoProvider::default_provider();
        let e = plain_mac(&p, GearId::Umac32, &[0; 15], b"n", b"m").unwrap_err();
        assert_eq!(
            e.to_string(),
            "umac-32 needs a key of 16 bytes, got 15 bytes"
        );
        let e = plain_mac(&p, GearId::Umac32, &[0; 16], &[], b"m").unwrap_err();
        assert_eq!(
            e.to_string(),
            "umac-32 needs a nonce of 1 to 16 bytes, got 0 bytes"
        );
        assert!(plain_mac(&p, GearId::GmacAes128, &[0; 16], &[0; 8], b"m").is_err());
        assert!(plain_mac(&p, GearId::DangerNullForTesting, &[], &[], b"m").is_err());
        assert!(plain_mac(&p, GearId::Partial64, &[0; 32], &[0; 9], b"m").is_err());
    }
}
