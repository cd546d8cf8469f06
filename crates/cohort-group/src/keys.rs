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
use crate::id::{MemberId, ViewId};
use cohort_crypto::{AeadAlgorithm, CryptoError, CryptoProvider, Secret};
use cohort_gears::{
    prefix_len, DropReason, GearId, GearKeys, GearSet, ProtectError, Protector, ReceivePolicy,
    TagChoice, Unprotector,
};
use std::collections::btree_map::{BTreeMap, Entry};
use zeroize::Zeroize;

/// Bytes of the group header inside a gears packet.
pub const GROUP_HEADER_LEN: usize = 3;
/// Length of a group key.
pub const GROUP_KEY_LEN: usize = 32;
const VIEW_SALT: &[u8] = b"cohort group view v1";
const WRAP_SALT: &[u8] = b"cohort group wrap v2";
const WRAP_INFO: &[u8] = b"wrap";
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

/// Bytes of a wrapped key: the 32-byte key sealed, then the 16-byte tag.
pub const WRAP_LEN: usize = GROUP_KEY_LEN + 16;

/// A wrapped group key ([`wrap`]).
pub type KeyWrap = [u8; WRAP_LEN];

/// A pair key (the 32 bytes two members' pair channel exports) with the AES-256-GCM key
/// its group-key wraps are sealed under.
///
/// The wrap key is HKDF-SHA256(salt `"cohort group wrap v2"`, ikm the pair key, info
/// `"wrap"`), set up once per pair channel; each wrap takes a nonce of its own (see
/// [`wrap`]). Until `GROUP_VERSION` 4 every view and rank had a key of its own (an HKDF
/// Expand, then an AES key schedule, per wrap): the coordinator of a one-message rekey
/// wraps for every member, and at 10,000 members those per-wrap set-ups were a third of
/// its CPU in a rekey.
///
/// The secret is wiped on drop; the AES key schedule is the provider's (aws-lc cleanses
/// its AEAD context when it is freed).
pub struct PairKey {
    secret: Secret,
    /// AES-256-GCM keyed with the wrap key.
    wrap_aead: Box<dyn cohort_crypto::AeadKey>,
}

impl PairKey {
    /// Keeps `secret` (the pair channel's exported key) and derives the wrap key from it;
    /// fails only if the crypto backend does.
    pub fn new(provider: &CryptoProvider, secret: Secret) -> Result<PairKey, CryptoError> {
        let mut k = Secret::zeroed(32);
        provider
            .hkdf_sha256
            .derive(WRAP_SALT, secret.expose(), &[WRAP_INFO], k.expose_mut())?;
        Ok(PairKey {
            wrap_aead: provider
                .aead
                .new_key(AeadAlgorithm::Aes256Gcm, k.expose())?,
            secret,
        })
    }

    /// The pair key's bytes. Keep the borrow short.
    pub fn expose(&self) -> &[u8] {
        self.secret.expose()
    }
}

impl std::fmt::Debug for PairKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PairKey(..)")
    }
}

/// The nonce of the wrap for `rank` of `view`, made by the view's coordinator for `member`
/// (the pair channel's other end): the view's sequence number (8 bytes, big-endian), the
/// rank (2), then 1 when the coordinator's id is the lower of the two ids and 0 otherwise,
/// then a zero byte.
///
/// Unique per pair key as long as a coordinator never installs two views with one sequence
/// number, which the per-view keys of `GROUP_VERSION` 4 also needed (they were a function of
/// the view id and the rank, under a fixed nonce). The end byte keeps apart the two ends of
/// one pair channel that each coordinate a view with the same number (two components that
/// proposed at once) and give each other the same rank.
fn wrap_nonce(view: &ViewId, rank: u16, member: &MemberId) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[..8].copy_from_slice(&view.seq.to_be_bytes());
    n[8..10].copy_from_slice(&rank.to_be_bytes());
    n[10] = u8::from(view.coordinator.as_bytes() < member.as_bytes());
    n
}

/// The associated data of a wrap: the key's epoch, the view id (so the coordinator's whole
/// id is bound, not only which end it is), then `bind`.
fn wrap_aad(epoch: u64, view: &ViewId, bind: &[u8]) -> Vec<u8> {
    let mut aad = Vec::with_capacity(48 + bind.len());
    aad.extend_from_slice(&epoch.to_be_bytes());
    aad.extend_from_slice(&view_id_bytes(view));
    aad.extend_from_slice(bind);
    aad
}

/// Wraps `key` for `member`, at `rank` of `view`, under their pair key (LSGC): AES-256-GCM
/// under the pair's wrap key ([`PairKey`]) with the nonce of the view, the rank and which
/// end coordinates; the epoch, the view id and `bind` are associated data (KDC mode binds
/// the Install's digest, so the wrap authenticates the whole Install to its member).
/// [`WRAP_LEN`] bytes.
pub fn wrap(
    pair_key: &PairKey,
    view: &ViewId,
    rank: u16,
    member: &MemberId,
    key: &GroupKey,
    bind: &[u8],
) -> Result<KeyWrap, CryptoError> {
    let mut out = [0u8; WRAP_LEN];
    let (sealed, tag) = out.split_at_mut(GROUP_KEY_LEN);
    sealed.copy_from_slice(key.expose());
    let nonce = wrap_nonce(view, rank, member);
    match pair_key
        .wrap_aead
        .seal_in_place(&nonce, &wrap_aad(key.epoch, view, bind), sealed)
    {
        Ok(t) => {
            tag.copy_from_slice(&t);
            Ok(out)
        }
        Err(e) => {
            out.zeroize(); // it may still hold the key in the clear
            Err(e)
        }
    }
}

/// Unwraps a key made by [`wrap`] for `member` (this member); `None` if it does not
/// authenticate.
pub fn unwrap(
    pair_key: &PairKey,
    view: &ViewId,
    rank: u16,
    member: &MemberId,
    epoch: u64,
    wrapped: &KeyWrap,
    bind: &[u8],
) -> Option<GroupKey> {
    let mut buf = Secret::from_slice(wrapped);
    let plain = pair_key
        .wrap_aead
        .open_in_place(
            &wrap_nonce(view, rank, member),
            &wrap_aad(epoch, view, bind),
            buf.expose_mut(),
        )
        .ok()?;
    (plain.len() == GROUP_KEY_LEN).then(|| GroupKey::new(epoch, Secret::from_slice(plain)))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A wrap is AES-256-GCM under HKDF-SHA256(salt `WRAP_SALT`, ikm the pair key, info
    /// `"wrap"`), with the nonce seq ‖ rank ‖ end ‖ 0 and the associated data epoch ‖ view
    /// id ‖ bind, the construction `docs/wire.md` states: computed here the long way, with
    /// `Hkdf::derive` and a fresh AES key, for many keys, views, ranks and members; and a
    /// wrap opens for nothing else.
    #[test]
    fn wraps_are_the_documented_aes_gcm() {
        let p = CryptoProvider::default_provider();
        for i in 0u8..40 {
            let secret: Vec<u8> = (0..32u8)
                .map(|b| b.wrapping_mul(i).wrapping_add(i))
                .collect();
            let pk = PairKey::new(&p, Secret::from_slice(&secret)).expect("pair key");
            assert_eq!(pk.expose(), &secret[..]);
            let coordinator = MemberId::from_bytes([i ^ 0x5a; 32]);
            let view = ViewId {
                seq: u64::from(i) * 0x0101_0101_0101,
                coordinator,
            };
            // Half the cases the member's id is the lower one.
            let member = MemberId::from_bytes([if i % 2 == 0 { 0x00 } else { 0xff }; 32]);
            let rank = u16::from(i) * 1_637;
            let mut wrap_key = [0u8; 32];
            p.hkdf_sha256
                .derive(b"cohort group wrap v2", &secret, &[b"wrap"], &mut wrap_key)
                .expect("hkdf");
            let mut nonce = [0u8; 12];
            nonce[..8].copy_from_slice(&view.seq.to_be_bytes());
            nonce[8..10].copy_from_slice(&rank.to_be_bytes());
            nonce[10] = u8::from(i % 2 == 1); // the coordinator's id is the lower one

            let key = GroupKey::new(u64::from(i) + 3, Secret::from_slice(&[i; 32]));
            let bind = vec![i; usize::from(i % 3) * 16];
            let wrapped = wrap(&pk, &view, rank, &member, &key, &bind).expect("wrap");
            let aead = p
                .aead
                .new_key(AeadAlgorithm::Aes256Gcm, &wrap_key)
                .expect("key");
            let mut long_way = key.expose().to_vec();
            let aad = [
                &key.epoch.to_be_bytes()[..],
                &view.seq.to_be_bytes(),
                coordinator.as_bytes(),
                &bind,
            ]
            .concat();
            let tag = aead
                .seal_in_place(&nonce, &aad, &mut long_way)
                .expect("seal");
            long_way.extend_from_slice(&tag);
            assert_eq!(&wrapped[..], &long_way[..], "case {i}");

            let open = |pk: &PairKey, view: &ViewId, rank: u16, member: &MemberId, epoch: u64| {
                unwrap(pk, view, rank, member, epoch, &wrapped, &bind)
            };
            let opened = open(&pk, &view, rank, &member, key.epoch).expect("open");
            assert_eq!(opened.expose(), key.expose());
            assert!(open(&pk, &view, rank ^ 1, &member, key.epoch).is_none());
            assert!(open(&pk, &view, rank, &member, key.epoch + 1).is_none());
            let flipped = MemberId::from_bytes([if i % 2 == 0 { 0xff } else { 0x00 }; 32]);
            assert!(
                open(&pk, &view, rank, &flipped, key.epoch).is_none(),
                "other end"
            );
            let later = ViewId {
                seq: view.seq + 1,
                coordinator,
            };
            assert!(open(&pk, &later, rank, &member, key.epoch).is_none());
            // Another coordinator on the same side of the member: the same nonce, refused
            // by the associated data.
            let mut other_id = *coordinator.as_bytes();
            other_id[31] ^= 1;
            let other_coordinator = ViewId {
                seq: view.seq,
                coordinator: MemberId::from_bytes(other_id),
            };
            assert!(open(&pk, &other_coordinator, rank, &member, key.epoch).is_none());
            assert!(unwrap(&pk, &view, rank, &member, key.epoch, &wrapped, b"x").is_none());
            let other = PairKey::new(&p, Secret::from_slice(&[0xee; 32])).expect("pair key");
            assert!(open(&other, &view, rank, &member, key.epoch).is_none());
        }
    }

    /// The two ends of one pair channel that each coordinate a view with the same sequence
    /// number and give each other the same rank use different nonces.
    #[test]
    fn the_two_ends_of_a_pair_never_share_a_nonce() {
        let (a, b) = (MemberId::from_bytes([2; 32]), MemberId::from_bytes([3; 32]));
        let by_a = ViewId {
            seq: 9,
            coordinator: a,
        };
        let by_b = ViewId {
            seq: 9,
            coordinator: b,
        };
        assert_ne!(wrap_nonce(&by_a, 4, &b), wrap_nonce(&by_b, 4, &a));
        assert_ne!(wrap_nonce(&by_a, 4, &b), wrap_nonce(&by_a, 5, &b));
        assert_ne!(
            wrap_nonce(&by_a, 4, &b),
            wrap_nonce(&ViewId { seq: 10, ..by_a }, 4, &b)
        );
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
