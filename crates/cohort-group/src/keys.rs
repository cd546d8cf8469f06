//! Group keys and the per-view keys derived from them.
//!
//! ```text
//!  GroupKey (32 random bytes, epoch)         fresh on every rekey, unrelated to the last
//!      │ HKDF(salt "cohort group view v1", info: group name ‖ view id)
//!      v
//!  view secret ── HKDF(info: "sender" ‖ rank) ──> GearKeys per sender (derived lazily)
//! ```
//! Every sender has its own keys in every view, so AEAD nonces (the gears sequence number)
//! never repeat across senders, and a packet of one view never verifies in another: replays
//! across views fail authentication; replays within a view hit the per-sender window.
//!
//! A protected group packet is a gears packet (see `cohort-gears`) whose 3-byte header is
//! `key slot (u8, the view's seq mod 256) ‖ sender rank (u16 BE)`: 13 + 3 bytes before the
//! body and the tag after it, 32 bytes in all with a 16-byte tag.

use crate::config::Protection;
use crate::id::ViewId;
use cohort_crypto::{AeadAlgorithm, CryptoError, CryptoProvider, Secret};
use cohort_gears::{
    prefix_len, DropReason, GearId, GearKeys, GearSet, ProtectError, Protector, ReceivePolicy,
    TagChoice, Unprotector,
};
use std::collections::btree_map::{BTreeMap, Entry};

/// Bytes of the group header inside a gears packet.
pub const GROUP_HEADER_LEN: usize = 3;
/// Length of a group key.
pub const GROUP_KEY_LEN: usize = 32;
const VIEW_SALT: &[u8] = b"cohort group view v1";
const WRAP_SALT: &[u8] = b"cohort group wrap v1";
const TOKEN_SALT: &[u8] = b"cohort group token v1";

/// A group key: random, numbered by epoch. Wiped on drop.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub struct GroupKey {
    /// Counts fresh keys.
    pub epoch: u64,
    secret: Secret,
}

impl GroupKey {
    /// A key from 32 bytes.
    pub fn new(epoch: u64, secret: Secret) -> Self {
        GroupKey { epoch, secret }
    }

    /// The key bytes.
    pub fn expose(&self) -> &[u8] {
        self.secret.expose()
    }

    /// A public fingerprint: 8 bytes of SHA-256 over a label and the key.
    pub fn fingerprint(&self, provider: &CryptoProvider) -> [u8; 8] {
        let h = provider
            .sha256
            .sha256(&[b"cohort group key fingerprint", self.secret.expose()]);
        let mut fp = [0u8; 8];
        fp.copy_from_slice(&h[..8]);
        fp
    }

    /// A copy (the secret is duplicated into another wiped buffer).
    pub fn duplicate(&self) -> GroupKey {
        GroupKey {
            epoch: self.epoch,
            secret: Secret::from_slice(self.secret.expose()),
        }
    }
}

fn view_id_bytes(view: &ViewId) -> [u8; 40] {
    let mut b = [0u8; 40];
    b[..8].copy_from_slice(&view.seq.to_be_bytes());
    b[8..].copy_from_slice(view.coordinator.as_bytes());
    b
}

/// The gears a protection mode uses, the receive policy, and what a sender attaches.
#[derive(Clone, Debug)]
pub struct GearPlan {
    /// Every gear keys are derived for.
    pub gears: GearSet,
    /// Receivers' policy.
    pub policy: ReceivePolicy,
    /// Ladder for the controller (strongest first); one entry when fixed.
    pub ladder: Vec<GearId>,
    /// Attach the strongest tag beside the chosen one.
    pub dual_tags: bool,
}

impl GearPlan {
    /// The plan for `protection`.
    pub fn new(protection: &Protection) -> GearPlan {
        let mut gears = GearSet::empty();
        match protection {
            Protection::Encrypt(g) => {
                gears.insert(*g);
                GearPlan {
                    gears,
                    policy: ReceivePolicy::new(gears, g.info().forgery_bits),
                    ladder: vec![*g],
                    dual_tags: false,
                }
            }
            Protection::Authenticate {
                gears: list,
                floor_bits,
                dual_tags,
            } => {
                for g in list {
                    gears.insert(*g);
                }
                let mut policy = ReceivePolicy::new(gears, *floor_bits);
                policy.choice = TagChoice::Cheapest;
                GearPlan {
                    gears,
                    policy,
                    ladder: list.clone(),
                    dual_tags: *dual_tags && list.len() > 1,
                }
            }
            Protection::DangerNoneForTesting => {
                gears.insert(GearId::DangerNullForTesting);
                let mut policy = ReceivePolicy::new(gears, 0.0);
                policy.danger_accept_null_for_testing = true;
                GearPlan {
                    gears,
                    policy,
                    ladder: vec![GearId::DangerNullForTesting],
                    dual_tags: false,
                }
            }
        }
    }
}

/// The keys of one view: this member's protector and, lazily, an unprotector per sender.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub struct ViewKeys {
    /// The view.
    pub view: ViewId,
    /// Its key epoch.
    pub key_epoch: u64,
    slot: u8,
    rank: u16,
    secret: Secret,
    provider: CryptoProvider,
    plan: GearPlan,
    protector: Protector,
    /// Members of the view: ranks at or above are refused.
    members: usize,
    /// One per sender, made on its first packet, keyed by rank. A map, not a slot per
    /// member: a member hears from a handful of senders (the leader, its overlay parent
    /// and children), and a vector of n slots in each of the kept views was 8 bytes x n
    /// per member. Boxed: an `Unprotector` is about 2.5 KB.
    receivers: BTreeMap<u16, Box<Unprotector>>,
}

impl ViewKeys {
    /// Derives the keys of `view` (with `members` members, this member at `rank`) from `key`.
    pub fn derive(
        provider: &CryptoProvider,
        group: &str,
        key: &GroupKey,
        view: ViewId,
        members: usize,
        rank: u16,
        plan: &GearPlan,
    ) -> Result<ViewKeys, CryptoError> {
        let mut secret = Secret::zeroed(32);
        provider.hkdf_sha256.derive(
            VIEW_SALT,
            key.expose(),
            &[
                &[group.len() as u8],
                group.as_bytes(),
                &view_id_bytes(&view),
            ],
            secret.expose_mut(),
        )?;
        let own = sender_keys(provider, &secret, rank, plan)?;
        Ok(ViewKeys {
            view,
            key_epoch: key.epoch,
            slot: view.seq as u8,
            rank,
            secret,
            provider: *provider,
            plan: plan.clone(),
            protector: Protector::new(own),
            members,
            receivers: BTreeMap::new(),
        })
    }

    /// KDC mode's authentication token `{g, A}_{SK_g}` (LSGC message 4): AES-256-GCM under a
    /// key derived from this view's secret, over the view id and the joiner, with a random
    /// 12-byte nonce in front. Only members of the view can make or check one.
    pub fn seal_token(&self, nonce: [u8; 12], joiner: &crate::id::MemberId) -> Option<Vec<u8>> {
        let aead = self.token_key()?;
        let aad = self.token_aad(joiner);
        let mut body = aad.clone();
        let tag = aead.seal_in_place(&nonce, &aad, &mut body).ok()?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&body);
        out.extend_from_slice(&tag);
        Some(out)
    }

    /// Whether `token` is this view's token for `joiner`.
    pub fn check_token(&self, token: &[u8], joiner: &crate::id::MemberId) -> bool {
        let Some(aead) = self.token_key() else {
            return false;
        };
        let aad = self.token_aad(joiner);
        if token.len() != 12 + aad.len() + 16 {
            return false;
        }
        let mut nonce = [0u8; 12];
        nonce.copy_from_slice(&token[..12]);
        let mut buf = token[12..].to_vec();
        match aead.open_in_place(&nonce, &aad, &mut buf) {
            Ok(plain) => cohort_crypto::ct_eq(plain, &aad),
            Err(_) => false,
        }
    }

    fn token_aad(&self, joiner: &crate::id::MemberId) -> Vec<u8> {
        let mut aad = b"cohort group token v1".to_vec();
        aad.extend_from_slice(&view_id_bytes(&self.view));
        aad.extend_from_slice(joiner.as_bytes());
        aad
    }

    fn token_key(&self) -> Option<Box<dyn cohort_crypto::AeadKey>> {
        let mut k = Secret::zeroed(32);
        self.provider
            .hkdf_sha256
            .derive(
                TOKEN_SALT,
                self.secret.expose(),
                &[b"token"],
                k.expose_mut(),
            )
            .ok()?;
        self.provider
            .aead
            .new_key(AeadAlgorithm::Aes256Gcm, k.expose())
            .ok()
    }

    /// The key slot packets of this view carry.
    pub fn slot(&self) -> u8 {
        self.slot
    }

    /// Appends a protected packet carrying `body` to `out`, tagged by `gears`.
    pub fn seal(
        &mut self,
        gears: &[GearId],
        body: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), ProtectError> {
        let rank = self.rank.to_be_bytes();
        let header = [self.slot, rank[0], rank[1]];
        self.protector
            .protect(gears, &header, body, out)
            .map(|_| ())
    }

    /// Verifies (and decrypts) a packet of this view in place; returns the sender's rank and
    /// the body range within `packet`.
    pub fn open(&mut self, packet: &mut [u8]) -> Result<(u16, std::ops::Range<usize>), DropReason> {
        let (_, rank) = peek_header(packet).ok_or(DropReason::Malformed)?;
        if usize::from(rank) >= self.members {
            return Err(DropReason::Malformed);
        }
        let unprotector = match self.receivers.entry(rank) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let keys = sender_keys(&self.provider, &self.secret, rank, &self.plan)
                    .map_err(|_| DropReason::Malformed)?;
                e.insert(Box::new(Unprotector::new(keys, self.plan.policy)))
            }
        };
        let base = packet.as_ptr() as usize;
        let opened = unprotector.unprotect(packet)?;
        let start = opened.body.as_ptr() as usize - base;
        Ok((rank, start..start + opened.body.len()))
    }

    /// Failed verifications under this view's keys, all senders.
    pub fn failures(&self) -> u64 {
        self.receivers
            .values()
            .map(|u| u.counters().get(DropReason::AuthFailed))
            .sum()
    }
}

fn sender_keys(
    provider: &CryptoProvider,
    view_secret: &Secret,
    rank: u16,
    plan: &GearPlan,
) -> Result<GearKeys, CryptoError> {
    let mut secret = Secret::zeroed(32);
    provider.hkdf_sha256.derive(
        VIEW_SALT,
        view_secret.expose(),
        &[b"sender", &rank.to_be_bytes()],
        secret.expose_mut(),
    )?;
    GearKeys::derive(provider, secret.expose(), plan.gears)
}

/// The key slot and sender rank of a protected group packet, read before verification.
pub fn peek_header(packet: &[u8]) -> Option<(u8, u16)> {
    let ntags = usize::from(*packet.get(1)?);
    let start = prefix_len(ntags);
    let len = u16::from_be_bytes([*packet.get(start - 2)?, *packet.get(start - 1)?]);
    if usize::from(len) != GROUP_HEADER_LEN {
        return None;
    }
    let h = packet.get(start..start + GROUP_HEADER_LEN)?;
    Some((h[0], u16::from_be_bytes([h[1], h[2]])))
}

fn wrap_key(
    provider: &CryptoProvider,
    pair_key: &[u8],
    view: &ViewId,
    rank: u16,
) -> Result<Box<dyn cohort_crypto::AeadKey>, CryptoError> {
    let mut k = Secret::zeroed(32);
    provider.hkdf_sha256.derive(
        WRAP_SALT,
        pair_key,
        &[&view_id_bytes(view), &rank.to_be_bytes()],
        k.expose_mut(),
    )?;
    provider.aead.new_key(AeadAlgorithm::Aes256Gcm, k.expose())
}

/// Wraps `key` for the member at `rank` of `view` under its pair key (LSGC): AES-256-GCM
/// under a key derived from the pair key, the view id and the rank, so each wrapping key is
/// used once; the epoch and `bind` are associated data (KDC mode binds the Install's
/// digest, so the wrap authenticates the whole Install to its member). 48 bytes.
pub fn wrap(
    provider: &CryptoProvider,
    pair_key: &[u8],
    view: &ViewId,
    rank: u16,
    key: &GroupKey,
    bind: &[u8],
) -> Result<Vec<u8>, CryptoError> {
    let aead = wrap_key(provider, pair_key, view, rank)?;
    let mut out = key.expose().to_vec();
    let aad = [&key.epoch.to_be_bytes()[..], bind].concat();
    let tag = aead.seal_in_place(&[0u8; 12], &aad, &mut out)?;
    out.extend_from_slice(&tag);
    Ok(out)
}

/// Unwraps a key made by [`wrap`]; `None` if it does not authenticate.
pub fn unwrap(
    provider: &CryptoProvider,
    pair_key: &[u8],
    view: &ViewId,
    rank: u16,
    epoch: u64,
    wrapped: &[u8],
    bind: &[u8],
) -> Option<GroupKey> {
    let aead = wrap_key(provider, pair_key, view, rank).ok()?;
    let mut buf = Secret::from_slice(wrapped);
    let aad = [&epoch.to_be_bytes()[..], bind].concat();
    let plain = aead
        .open_in_place(&[0u8; 12], &aad, buf.expose_mut())
        .ok()?;
    (plain.len() == GROUP_KEY_LEN).then(|| GroupKey::new(epoch, Secret::from_slice(plain)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::MemberId;

    fn view_keys(key_byte: u8, seq: u64) -> ViewKeys {
        let p = CryptoProvider::default_provider();
        let key = GroupKey::new(1, Secret::from_slice(&[key_byte; 32]));
        let view = ViewId {
            seq,
            coordinator: MemberId::from_bytes([1; 32]),
        };
        let plan = GearPlan::new(&Protection::default());
        ViewKeys::derive(&p, "g", &key, view, 2, 0, &plan).expect("keys")
    }

    #[test]
    fn a_token_checks_only_for_its_joiner_view_and_key() {
        let (a, b) = (MemberId::from_bytes([2; 32]), MemberId::from_bytes([3; 32]));
        let keys = view_keys(7, 5);
        let token = keys.seal_token([9; 12], &a).expect("token");
        assert!(keys.check_token(&token, &a));
        assert!(!keys.check_token(&token, &b), "another joiner");
        assert!(!view_keys(7, 6).check_token(&token, &a), "another view");
        assert!(
            !view_keys(8, 5).check_token(&token, &a),
            "another group key"
        );
        for i in 0..token.len() {
            let mut t = token.clone();
            t[i] ^= 1;
            assert!(!keys.check_token(&t, &a), "bit {i} flipped");
        }
        assert!(!keys.check_token(&token[..token.len() - 1], &a));
    }
}
