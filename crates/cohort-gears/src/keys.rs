//! Per-gear keys: derivation from an association secret, and tag computation.
//!
//! Every gear gets its own primary key, derived with HKDF-SHA256 from the association secret
//! and the gear's wire id. Two tags on one packet are therefore always under independent
//! keys (ACSA 3.4; RFC 4418 6.5 forbids a shorter UMAC tag being a prefix of a longer one).
//! Nonce-based gears (GMAC, the AEADs) also get a 12-byte IV; the nonce of packet `seq` is
//! the IV with `seq` xored into its last eight bytes, so it never repeats under one key.

use crate::gear::{GearId, GearInfo, GearKind};
use crate::ifg::Ifg;
use crate::partial::PartialMac;
use crate::umac::Umac;
use cohort_crypto::{
    ct_eq, AeadAlgorithm, AeadKey, CryptoError, CryptoProvider, KeyedHash, MacKey, Secret,
};
use zeroize::Zeroizing;

/// HKDF salt for gear keys; changing it changes every key (a new wire version).
const GEAR_KEY_SALT: &[u8] = b"cohort-gears/v1";
const IV_LEN: usize = 12;

/// One gear's keys, ready to tag, verify, seal or open.
pub struct GearKey {
    info: &'static GearInfo,
    imp: KeyImpl,
}

enum KeyImpl {
    Null,
    Hmac(Box<dyn MacKey>),
    Blake3 {
        key: Zeroizing<[u8; 32]>,
        hash: &'static dyn KeyedHash,
    },
    Gmac {
        key: Box<dyn AeadKey>,
        iv: Zeroizing<[u8; IV_LEN]>,
    },
    Umac(Umac),
    Ifg(Box<Ifg>),
    Partial(Box<PartialMac>),
    Aead {
        key: Box<dyn AeadKey>,
        iv: Zeroizing<[u8; IV_LEN]>,
    },
}

impl std::fmt::Debug for GearKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GearKey({}, redacted)", self.info.name)
    }
}

impl GearKey {
    /// Derives `gear`'s key from an association secret (at least 16 bytes).
    pub fn derive(
        provider: &CryptoProvider,
        association_secret: &[u8],
        gear: GearId,
    ) -> Result<GearKey, CryptoError> {
        if association_secret.len() < 16 {
            return Err(CryptoError::InvalidInput);
        }
        let info = gear.info();
        let mut material = Secret::zeroed(info.key_len + IV_LEN);
        provider.hkdf_sha256.derive(
            GEAR_KEY_SALT,
            association_secret,
            &[b"gear key", &[gear.to_u8()]],
            material.expose_mut(),
        )?;
        let (key, iv_bytes) = material.expose().split_at(info.key_len);
        let mut iv = Zeroizing::new([0u8; IV_LEN]);
        iv.copy_from_slice(iv_bytes);
        let imp = match gear {
            GearId::DangerNullForTesting => KeyImpl::Null,
            GearId::HmacSha256 | GearId::HmacSha256_128 => {
                KeyImpl::Hmac(provider.hmac_sha256.new_key(key))
            }
            GearId::Blake3_128 => {
                let mut k = Zeroizing::new([0u8; 32]);
                k.copy_from_slice(key);
                KeyImpl::Blake3 {
                    key: k,
                    hash: provider.keyed_blake3,
                }
            }
            GearId::GmacAes128 => KeyImpl::Gmac {
                key: provider.aead.new_key(AeadAlgorithm::Aes128Gcm, key)?,
                iv,
            },
            GearId::Umac32 | GearId::Umac64 | GearId::Umac96 | GearId::Umac128 => {
                KeyImpl::Umac(Umac::new(provider, key, info.tag_len)?)
            }
            GearId::IfgExperimental => KeyImpl::Ifg(Box::new(Ifg::new(provider, key)?)),
            GearId::Aes128Gcm => KeyImpl::Aead {
                key: provider.aead.new_key(AeadAlgorithm::Aes128Gcm, key)?,
                iv,
            },
            GearId::Aes256Gcm => KeyImpl::Aead {
                key: provider.aead.new_key(AeadAlgorithm::Aes256Gcm, key)?,
                iv,
            },
            GearId::ChaCha20Poly1305 => KeyImpl::Aead {
                key: provider
                    .aead
                    .new_key(AeadAlgorithm::ChaCha20Poly1305, key)?,
                iv,
            },
            // The partial gears; a registry row without a key type fails the tests below.
            _ => match info.partial_l {
                Some(l) => KeyImpl::Partial(Box::new(PartialMac::new(provider, key, l)?)),
                None => return Err(CryptoError::InvalidInput),
            },
        };
        Ok(GearKey { info, imp })
    }

    /// The gear this key is for.
    pub fn info(&self) -> &'static GearInfo {
        self.info
    }

    /// Computes the tag of a MAC (or null) gear over `data`, whose body starts at
    /// `body_start` (only partial MACs care where). `out` must be `tag_len` bytes.
    ///
    /// # Errors
    /// [`CryptoError::InvalidInput`] for an AEAD gear or a wrong `out` length.
    pub fn tag(
        &self,
        seq: u64,
        data: &[u8],
        body_start: usize,
        out: &mut [u8],
    ) -> Result<(), CryptoError> {
        if out.len() != self.info.tag_len || body_start > data.len() {
            return Err(CryptoError::InvalidInput);
        }
        match &self.imp {
            KeyImpl::Null => Ok(()),
            KeyImpl::Hmac(key) => {
                key.sign(&[data], out);
                Ok(())
            }
            KeyImpl::Blake3 { key, hash } => {
                hash.hash(key, &[data], out);
                Ok(())
            }
            KeyImpl::Gmac { key, iv } => {
                let tag = key.seal_in_place(&nonce(iv, seq), data, &mut [])?;
                out.copy_from_slice(&tag);
                Ok(())
            }
            KeyImpl::Umac(umac) => umac.tag(&seq.to_be_bytes(), data, out),
            KeyImpl::Ifg(ifg) => ifg.tag(seq, data, out),
            KeyImpl::Partial(partial) => partial.tag(seq, data, body_start, out),
            KeyImpl::Aead { .. } => Err(CryptoError::InvalidInput),
        }
    }

    /// Recomputes the tag and compares it in constant time.
    pub fn verify(&self, seq: u64, data: &[u8], body_start: usize, tag: &[u8]) -> bool {
        let mut expected = [0u8; 32];
        let Some(expected) = expected.get_mut(..self.info.tag_len) else {
            return false;
        };
        self.tag(seq, data, body_start, expected).is_ok() && ct_eq(expected, tag)
    }

    /// Encrypts `body` in place under an AEAD gear and returns the 16-byte tag over `aad`
    /// and the ciphertext.
    pub fn seal(&self, seq: u64, aad: &[u8], body: &mut [u8]) -> Result<[u8; 16], CryptoError> {
        match &self.imp {
            KeyImpl::Aead { key, iv } => key.seal_in_place(&nonce(iv, seq), aad, body),
            _ => Err(CryptoError::InvalidInput),
        }
    }

    /// Checks and decrypts `body_and_tag` in place under an AEAD gear; returns the plaintext.
    pub fn open<'a>(
        &self,
        seq: u64,
        aad: &[u8],
        body_and_tag: &'a mut [u8],
    ) -> Result<&'a mut [u8], CryptoError> {
        match &self.imp {
            KeyImpl::Aead { key, iv } => key.open_in_place(&nonce(iv, seq), aad, body_and_tag),
            _ => Err(CryptoError::InvalidInput),
        }
    }

    /// Whether this gear encrypts.
    pub fn is_aead(&self) -> bool {
        self.info.kind == GearKind::Aead
    }
}

fn nonce(iv: &[u8; IV_LEN], seq: u64) -> [u8; IV_LEN] {
    let mut n = *iv;
    for (b, s) in n[4..].iter_mut().zip(seq.to_be_bytes()) {
        *b ^= s;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gear::ALL_GEARS;

    #[test]
    fn every_gear_derives_a_key_and_keys_are_independent() {
        let p = CryptoProvider::default_provider();
        let data = b"0123456789abcdef header and body";
        for g in ALL_GEARS {
            let key = GearKey::derive(&p, &[1u8; 32], g.id).expect(g.name);
            assert_eq!(key.info().id, g.id);
            if g.kind == GearKind::Mac {
                let mut t1 = vec![0u8; g.tag_len];
                key.tag(7, data, 16, &mut t1).unwrap();
                assert!(key.verify(7, data, 16, &t1), "{}", g.name);
                // Another secret gives another tag.
                let other = GearKey::derive(&p, &[2u8; 32], g.id).unwrap();
                assert!(!other.verify(7, data, 16, &t1), "{}", g.name);
                // Nonce-based gears also take the sequence number directly (HMAC and BLAKE3
                // see it only as part of the packet's authenticated prefix).
                let takes_seq = !matches!(
                    g.id,
                    GearId::HmacSha256 | GearId::HmacSha256_128 | GearId::Blake3_128
                );
                assert_eq!(key.verify(8, data, 16, &t1), !takes_seq, "{}", g.name);
            }
        }
        assert!(GearKey::derive(&p, &[1u8; 8], GearId::HmacSha256).is_err());
    }

    #[test]
    fn nonce_xors_the_sequence_number() {
        let iv = [0xffu8; 12];
        let n = nonce(&iv, 1);
        assert_eq!(&n[..11], &[0xff; 11]);
        assert_eq!(n[11], 0xfe);
    }
}
