//! Ensemble's Exchange (section 4): how two components of one group that hold different keys
//! come to hold one, so that they can merge.
//!
//! Component leaders gossip an [`Id`] now and then to the members they know outside their
//! view. An Id names its leader (principal and reply address), carries a fresh nonce and a
//! fresh KEM public key (X25519 + ML-KEM-768), is signed with the leader's identity key, and
//! carries a tag under the sender's group key. A leader that hears an Id:
//!
//! * whose tag verifies under its own key (*secure* gossip: both hold one key) lets the
//!   membership layer merge (the smaller component joins the larger);
//! * whose tag does not (*insecure*: keys differ) checks that it trusts the sender and the
//!   signature, and if its own principal sorts lower (key bytes), answers with a [`Ticket`]:
//!   its group key and epoch, sealed to the Id's KEM key (HPKE-style: KEM, HKDF, AES-256-GCM)
//!   and bound to the recipient's nonce, signed with its identity key.
//!
//! The receiver of a Ticket checks that it trusts the sender, that the nonce is one of its own
//! two latest and unused, the signature, and then opens it and installs the key with an
//! empty view change. Only the recipient can open a Ticket, and it goes only to a principal
//! the sender trusts, which itself accepts only tickets from principals it trusts: a key
//! passes only between leaders that trust each other.
//!
//! ```text
//!  gossip packet = 0xC2 | version (1) | kind (1) | u8 len | group name | body
//!  Id     (kind 1) = principal (32) | reply address | nonce (16) | view size (u16)
//!                    | u16 len | KEM public key | key tag (16) | signature (64)
//!  Ticket (kind 2) = sender (32) | recipient (32) | recipient's nonce (16) | key epoch (u64)
//!                    | u16 len | KEM ciphertext | u16 len | sealed group key | signature (64)
//!  KDC Id (kind 3) = principal (32) | reply address | nonce (16) | view size (u16)
//!                    | key tag (16)
//!  Present (kind 5) = joiner (32) | view id (u64, 32) | u8 len | token   (KDC mode, LSGC 5)
//! ```
//! In KDC mode there is no public-key operation: Ids carry neither a KEM key nor a
//! signature, and the ticket is a pair message (`PairMsg::Ticket`) over the pair channel to
//! the Id's principal, whose keys come from the KDC; it still echoes the nonce.
//! Signatures cover a context label and every byte before them; the key tag is HMAC-SHA256
//! (truncated to 16 bytes) under a key derived from the group key, over every byte before it.

use crate::id::MemberId;
use crate::keys::{GroupKey, GROUP_KEY_LEN};
use crate::wire::{get_addr, put_addr};
use cohort_channel::identity::Identity;
use cohort_core::wire::{Reader, Writer};
use cohort_crypto::{ct_eq, AeadAlgorithm, CryptoProvider, KemAlgorithm, Secret};
use std::net::SocketAddr;

/// First byte of a gossip packet (beside `0x01` group packets and `0xC1` pair datagrams).
pub const GOSSIP_KIND: u8 = 0xC2;
/// Version of the gossip formats.
pub const GOSSIP_VERSION: u8 = 1;
/// Bytes of a gossip nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of an Id's key tag.
pub const TAG_LEN: usize = 16;
/// Bytes of an Ed25519 signature.
const SIGNATURE_LEN: usize = 64;
/// The KEM tickets are sealed with.
pub const TICKET_KEM: KemAlgorithm = KemAlgorithm::X25519MlKem768;
/// Longest KEM public key or ciphertext accepted (the hybrid's are 1216 and 1120 bytes).
const MAX_KEM_BYTES: usize = 1600;

const ID_CONTEXT: &[u8] = b"cohort group id v1";
const TICKET_CONTEXT: &[u8] = b"cohort group ticket v1";
const TAG_SALT: &[u8] = b"cohort group gossip tag v1";
const SEAL_SALT: &[u8] = b"cohort group ticket seal v1";
const PROOF_SALT: &[u8] = b"cohort group merge proof v1";

/// A component leader announcing itself.
#[derive(Clone, Debug, PartialEq)]
pub struct Id {
    /// The leader.
    pub principal: MemberId,
    /// Where tickets and answers go.
    pub addr: SocketAddr,
    /// Fresh with every Id the leader makes; a ticket must echo it.
    pub nonce: [u8; NONCE_LEN],
    /// Members of the sender's view (the smaller component joins the larger).
    pub size: u16,
    /// The KEM public key tickets to this leader are sealed to.
    pub kem_public: Vec<u8>,
    /// HMAC under a key derived from the sender's group key.
    pub key_tag: [u8; TAG_LEN],
    /// Ed25519 signature by `principal`.
    pub signature: Vec<u8>,
}

/// A group key handed from one leader to another.
#[derive(Clone, Debug, PartialEq)]
pub struct Ticket {
    /// The leader handing its key over.
    pub sender: MemberId,
    /// The only leader that can open it.
    pub recipient: MemberId,
    /// The recipient's nonce, from its Id.
    pub nonce: [u8; NONCE_LEN],
    /// The key's epoch at the sender.
    pub key_epoch: u64,
    /// KEM ciphertext to the recipient's Id key.
    pub kem_ciphertext: Vec<u8>,
    /// The group key under AES-256-GCM (32 bytes and a 16-byte tag).
    pub sealed: Vec<u8>,
    /// Ed25519 signature by `sender`.
    pub signature: Vec<u8>,
}

/// A parsed gossip packet.
#[derive(Clone, Debug, PartialEq)]
pub enum Gossip {
    /// A leader's announcement.
    Id(Id),
    /// A key for the recipient.
    Ticket(Ticket),
    /// KDC mode, LSGC message 5: a joiner presents its token to a member of the view.
    Present {
        /// The joiner.
        member: MemberId,
        /// The view the token is for.
        view: crate::id::ViewId,
        /// `{g, A}_{SK_g}`.
        token: Vec<u8>,
    },
}

/// A gossip packet with the byte ranges its checks cover.
#[derive(Clone, Debug, PartialEq)]
pub struct Parsed {
    /// The group it is for.
    pub group: String,
    /// The message.
    pub gossip: Gossip,
    /// Bytes covered by the signature (everything before it).
    pub signed_len: usize,
    /// Ids: bytes covered by the key tag (everything before it).
    pub tagged_len: usize,
}

fn header(out: &mut Vec<u8>, kind: u8, group: &str) {
    Writer::new(out)
        .u8(GOSSIP_KIND)
        .u8(GOSSIP_VERSION)
        .u8(kind)
        .u8(group.len() as u8)
        .bytes(group.as_bytes());
}

/// HMAC-SHA256 (16 bytes) of `parts` under `HKDF-SHA256(salt, group key, len | group)`.
fn keyed_tag(
    provider: &CryptoProvider,
    salt: &[u8],
    group: &str,
    key: &GroupKey,
    parts: &[&[u8]],
) -> [u8; TAG_LEN] {
    let mut k = Secret::zeroed(32);
    let mut tag = [0u8; TAG_LEN];
    if provider
        .hkdf_sha256
        .derive(
            salt,
            key.expose(),
            &[&[group.len() as u8], group.as_bytes()],
            k.expose_mut(),
        )
        .is_ok()
    {
        provider
            .hmac_sha256
            .new_key(k.expose())
            .sign(parts, &mut tag);
    }
    tag
}

/// An Id's key tag: HMAC under a key derived from the group key, over `bytes`.
fn key_tag(provider: &CryptoProvider, group: &str, key: &GroupKey, bytes: &[u8]) -> [u8; TAG_LEN] {
    keyed_tag(provider, TAG_SALT, group, key, &[bytes])
}

/// A leader's own Id, kept to open the tickets that answer it.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub struct LocalId {
    /// The nonce sent.
    pub nonce: [u8; NONCE_LEN],
    /// Empty in KDC mode (tickets travel over pair channels there).
    kem_secret: Secret,
    kem_public: Vec<u8>,
    /// A ticket for this nonce was taken (each is taken once).
    pub used: bool,
}

impl LocalId {
    /// A fresh nonce (from the caller's RNG) and KEM key pair.
    pub fn new(provider: &CryptoProvider, nonce: [u8; NONCE_LEN]) -> Option<LocalId> {
        let (kem_secret, kem_public) = provider.kem(TICKET_KEM)?.generate().ok()?;
        Some(LocalId {
            nonce,
            kem_secret,
            kem_public,
            used: false,
        })
    }

    /// A nonce only, for KDC mode (no KEM: no public-key operation anywhere).
    pub fn nonce_only(nonce: [u8; NONCE_LEN]) -> LocalId {
        LocalId {
            nonce,
            kem_secret: Secret::zeroed(0),
            kem_public: Vec::new(),
            used: false,
        }
    }
}

/// The start both kinds of Id share: the header, then principal, address, nonce and size.
fn id_head(
    out: &mut Vec<u8>,
    kind: u8,
    group: &str,
    principal: &MemberId,
    addr: SocketAddr,
    local: &LocalId,
    size: u16,
) {
    header(out, kind, group);
    let mut w = Writer::new(out);
    w.bytes(principal.as_bytes());
    put_addr(&mut w, &addr);
    w.bytes(&local.nonce).u16(size);
}

/// Builds and signs an Id. `None` if the signing backend failed.
pub fn encode_id(
    provider: &CryptoProvider,
    identity: &Identity,
    group: &str,
    addr: SocketAddr,
    size: u16,
    local: &LocalId,
    key: &GroupKey,
) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(1500);
    let principal = MemberId(identity.public());
    id_head(&mut out, 1, group, &principal, addr, local, size);
    Writer::new(&mut out)
        .u16(local.kem_public.len() as u16)
        .bytes(&local.kem_public);
    let tag = key_tag(provider, group, key, &out);
    out.extend_from_slice(&tag);
    let sig = identity.sign(provider, &[ID_CONTEXT, &out].concat()).ok()?;
    out.extend_from_slice(&sig);
    Some(out)
}

/// Builds a KDC-mode Id (kind 3): like an Id but with neither KEM key nor signature. Its
/// only use is to say where the leader is, its size and whether it holds our key (the tag);
/// the ticket answering it travels over a pair channel authenticated through the KDC.
pub fn encode_kdc_id(
    provider: &CryptoProvider,
    principal: &MemberId,
    group: &str,
    addr: SocketAddr,
    size: u16,
    local: &LocalId,
    key: &GroupKey,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    id_head(&mut out, 3, group, principal, addr, local, size);
    let tag = key_tag(provider, group, key, &out);
    out.extend_from_slice(&tag);
    out
}

/// LSGC message 5 as a datagram to one member of the view (kind 5).
pub fn encode_present(
    group: &str,
    member: &MemberId,
    view: &crate::id::ViewId,
    token: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(160);
    header(&mut out, 5, group);
    Writer::new(&mut out)
        .bytes(member.as_bytes())
        .u64(view.seq)
        .bytes(view.coordinator.as_bytes())
        .u8(token.len() as u8)
        .bytes(token);
    out
}

/// Parses a gossip packet; `None` if malformed (bounds are checked, nothing panics).
pub fn decode(bytes: &[u8]) -> Option<Parsed> {
    let mut r = Reader::new(bytes);
    if r.u8().ok()? != GOSSIP_KIND || r.u8().ok()? != GOSSIP_VERSION {
        return None;
    }
    let kind = r.u8().ok()?;
    let n = r.u8().ok()? as usize;
    let group = String::from_utf8(r.bytes(n).ok()?.to_vec()).ok()?;
    match kind {
        // 1: an Id; 3: a KDC-mode Id, the same without KEM key and signature.
        1 | 3 => {
            let signed = kind == 1;
            let principal = MemberId::from_bytes(r.array().ok()?);
            let addr = get_addr(&mut r)?;
            let nonce: [u8; NONCE_LEN] = r.array().ok()?;
            let size = r.u16().ok()?;
            let kem_public = if signed {
                let k = r.u16().ok()? as usize;
                if k > MAX_KEM_BYTES {
                    return None;
                }
                r.bytes(k).ok()?.to_vec()
            } else {
                Vec::new()
            };
            let tagged_len = bytes.len() - r.remaining();
            let key_tag: [u8; TAG_LEN] = r.array().ok()?;
            let (signed_len, signature) = if signed {
                let signed_len = bytes.len() - r.remaining();
                (signed_len, r.bytes(SIGNATURE_LEN).ok()?.to_vec())
            } else {
                (tagged_len, Vec::new())
            };
            if !r.is_empty() {
                return None;
            }
            Some(Parsed {
                group,
                gossip: Gossip::Id(Id {
                    principal,
                    addr,
                    nonce,
                    size,
                    kem_public,
                    key_tag,
                    signature,
                }),
                signed_len,
                tagged_len,
            })
        }
        5 => {
            let member = MemberId::from_bytes(r.array().ok()?);
            let seq = r.u64().ok()?;
            let coordinator = MemberId::from_bytes(r.array().ok()?);
            let n = r.u8().ok()? as usize;
            let token = r.bytes(n).ok()?.to_vec();
            if !r.is_empty() {
                return None;
            }
            let len = bytes.len();
            Some(Parsed {
                group,
                gossip: Gossip::Present {
                    member,
                    view: crate::id::ViewId { seq, coordinator },
                    token,
                },
                signed_len: len,
                tagged_len: len,
            })
        }
        2 => {
            let sender = MemberId::from_bytes(r.array().ok()?);
            let recipient = MemberId::from_bytes(r.array().ok()?);
            let nonce: [u8; NONCE_LEN] = r.array().ok()?;
            let key_epoch = r.u64().ok()?;
            let k = r.u16().ok()? as usize;
            if k > MAX_KEM_BYTES {
                return None;
            }
            let kem_ciphertext = r.bytes(k).ok()?.to_vec();
            let s = r.u16().ok()? as usize;
            if s != GROUP_KEY_LEN + 16 {
                return None;
            }
            let sealed = r.bytes(s).ok()?.to_vec();
            let signed_len = bytes.len() - r.remaining();
            let signature = r.bytes(SIGNATURE_LEN).ok()?.to_vec();
            if !r.is_empty() {
                return None;
            }
            Some(Parsed {
                group,
                gossip: Gossip::Ticket(Ticket {
                    sender,
                    recipient,
                    nonce,
                    key_epoch,
                    kem_ciphertext,
                    sealed,
                    signature,
                }),
                signed_len,
                tagged_len: signed_len,
            })
        }
        _ => None,
    }
}

/// Whether an Id's tag verifies under `key` (the sender holds the same group key).
pub fn id_is_secure(
    provider: &CryptoProvider,
    group: &str,
    key: &GroupKey,
    bytes: &[u8],
    parsed: &Parsed,
) -> bool {
    let Gossip::Id(id) = &parsed.gossip else {
        return false;
    };
    let Some(tagged) = bytes.get(..parsed.tagged_len) else {
        return false;
    };
    ct_eq(&key_tag(provider, group, key, tagged), &id.key_tag)
}

/// Whether the gossip's signature verifies under its signer's key (the Id's principal or the
/// Ticket's sender).
pub fn signature_ok(provider: &CryptoProvider, bytes: &[u8], parsed: &Parsed) -> bool {
    let Some(signed) = bytes.get(..parsed.signed_len) else {
        return false;
    };
    let (signer, context, sig) = match &parsed.gossip {
        Gossip::Id(id) => (id.principal, ID_CONTEXT, &id.signature),
        Gossip::Ticket(t) => (t.sender, TICKET_CONTEXT, &t.signature),
        Gossip::Present { .. } => return false,
    };
    signer.0.verify(provider, &[context, signed].concat(), sig)
}

/// The AES-256-GCM key a ticket's KEM secret gives, bound to the group, both leaders and the
/// nonce.
fn seal_key(
    provider: &CryptoProvider,
    group: &str,
    shared: &Secret,
    sender: &MemberId,
    recipient: &MemberId,
    nonce: &[u8; NONCE_LEN],
) -> Option<Box<dyn cohort_crypto::AeadKey>> {
    let mut k = Secret::zeroed(32);
    provider
        .hkdf_sha256
        .derive(
            SEAL_SALT,
            shared.expose(),
            &[
                &[group.len() as u8],
                group.as_bytes(),
                sender.as_bytes(),
                recipient.as_bytes(),
                nonce,
            ],
            k.expose_mut(),
        )
        .ok()?;
    provider
        .aead
        .new_key(AeadAlgorithm::Aes256Gcm, k.expose())
        .ok()
}

/// Builds a signed ticket handing `key` to the leader that sent `to`. `None` if the Id's KEM
/// key is unusable or the backend failed.
pub fn encode_ticket(
    provider: &CryptoProvider,
    identity: &Identity,
    group: &str,
    to: &Id,
    key: &GroupKey,
) -> Option<Vec<u8>> {
    let sender = MemberId(identity.public());
    let (ciphertext, shared) = provider.kem(TICKET_KEM)?.encapsulate(&to.kem_public).ok()?;
    let aead = seal_key(provider, group, &shared, &sender, &to.principal, &to.nonce)?;
    let mut out = Vec::with_capacity(1500);
    header(&mut out, 2, group);
    Writer::new(&mut out)
        .bytes(sender.as_bytes())
        .bytes(to.principal.as_bytes())
        .bytes(&to.nonce)
        .u64(key.epoch)
        .u16(ciphertext.len() as u16)
        .bytes(&ciphertext)
        .u16((GROUP_KEY_LEN + 16) as u16);
    // The AAD is everything before the sealed key.
    let aad = out.clone();
    let mut sealed = zeroize::Zeroizing::new(key.expose().to_vec());
    let tag = aead.seal_in_place(&[0u8; 12], &aad, &mut sealed).ok()?;
    out.extend_from_slice(&sealed);
    out.extend_from_slice(&tag);
    let sig = identity
        .sign(provider, &[TICKET_CONTEXT, &out].concat())
        .ok()?;
    out.extend_from_slice(&sig);
    Some(out)
}

/// Opens a ticket addressed to `me` with the Id it answers. The caller has checked trust,
/// the nonce and the signature. `None` if it does not open.
pub fn open_ticket(
    provider: &CryptoProvider,
    group: &str,
    me: &MemberId,
    local: &LocalId,
    bytes: &[u8],
    ticket: &Ticket,
) -> Option<GroupKey> {
    if ticket.recipient != *me || ticket.nonce != local.nonce {
        return None;
    }
    let shared = provider
        .kem(TICKET_KEM)?
        .decapsulate(&local.kem_secret, &ticket.kem_ciphertext)
        .ok()?;
    let aead = seal_key(provider, group, &shared, &ticket.sender, me, &ticket.nonce)?;
    let aad_len = bytes
        .len()
        .checked_sub(SIGNATURE_LEN + ticket.sealed.len())?;
    let aad = bytes.get(..aad_len)?;
    let mut buf = zeroize::Zeroizing::new(ticket.sealed.clone());
    let plain = aead.open_in_place(&[0u8; 12], aad, &mut buf).ok()?;
    if plain.len() != GROUP_KEY_LEN {
        return None;
    }
    Some(GroupKey::new(ticket.key_epoch, Secret::from_slice(plain)))
}

/// A joiner's proof that it holds `key` (the component it dissolved from and the one it joins
/// share it after an Exchange), bound to the group, the joiner and its incarnation (it travels
/// over the joiner's authenticated pair channel). A leader lets such joiners in without a
/// rekey.
pub fn merge_proof(
    provider: &CryptoProvider,
    group: &str,
    key: &GroupKey,
    joiner: &MemberId,
    incarnation: u64,
) -> [u8; TAG_LEN] {
    keyed_tag(
        provider,
        PROOF_SALT,
        group,
        key,
        &[joiner.as_bytes(), &incarnation.to_be_bytes()],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ident(b: u8) -> Identity {
        Identity::from_secret(
            &CryptoProvider::default_provider(),
            Secret::from_slice(&[b; 32]),
        )
        .expect("identity")
    }

    fn key(b: u8, epoch: u64) -> GroupKey {
        GroupKey::new(epoch, Secret::from_slice(&[b; 32]))
    }

    #[test]
    fn an_id_round_trips_its_tag_tells_keys_apart_and_its_signature_verifies() {
        let p = CryptoProvider::default_provider();
        let a = ident(1);
        let local = LocalId::new(&p, [7; 16]).expect("kem");
        let addr: SocketAddr = "10.0.0.1:4000".parse().expect("addr");
        let bytes = encode_id(&p, &a, "g", addr, 3, &local, &key(9, 2)).expect("id");
        let parsed = decode(&bytes).expect("parse");
        let Gossip::Id(id) = &parsed.gossip else {
            panic!("not an id")
        };
        assert_eq!(id.principal, MemberId(a.public()));
        assert_eq!((id.addr, id.size, id.nonce), (addr, 3, [7; 16]));
        assert!(id_is_secure(&p, "g", &key(9, 2), &bytes, &parsed));
        assert!(!id_is_secure(&p, "g", &key(8, 2), &bytes, &parsed));
        assert!(!id_is_secure(&p, "other", &key(9, 2), &bytes, &parsed));
        assert!(signature_ok(&p, &bytes, &parsed));
        // Any flipped bit fails to parse, or fails the signature.
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            if let Some(q) = decode(&b) {
                assert!(
                    !signature_ok(&p, &b, &q),
                    "bit flip at {i} kept the signature"
                );
            }
        }
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_none());
        }
    }

    #[test]
    fn a_ticket_opens_only_for_its_recipient_and_nonce() {
        let p = CryptoProvider::default_provider();
        let (q, r) = (ident(1), ident(2));
        let local = LocalId::new(&p, [5; 16]).expect("kem");
        let addr: SocketAddr = "10.0.0.2:4000".parse().expect("addr");
        let id_bytes = encode_id(&p, &r, "g", addr, 2, &local, &key(3, 1)).expect("id");
        let Gossip::Id(id) = decode(&id_bytes).expect("parse").gossip else {
            panic!("not an id")
        };
        let t = encode_ticket(&p, &q, "g", &id, &key(4, 6)).expect("ticket");
        let parsed = decode(&t).expect("parse");
        assert!(signature_ok(&p, &t, &parsed));
        let Gossip::Ticket(ticket) = &parsed.gossip else {
            panic!("not a ticket")
        };
        let me = MemberId(r.public());
        let k = open_ticket(&p, "g", &me, &local, &t, ticket).expect("opens");
        assert_eq!((k.epoch, k.expose()), (6, &[4u8; 32][..]));
        // Another nonce (an older Id), another recipient, another group: nothing.
        let other = LocalId::new(&p, [6; 16]).expect("kem");
        assert!(open_ticket(&p, "g", &me, &other, &t, ticket).is_none());
        assert!(open_ticket(&p, "g", &MemberId(q.public()), &local, &t, ticket).is_none());
        assert!(open_ticket(&p, "h", &me, &local, &t, ticket).is_none());
        // A changed epoch breaks the AEAD (and the signature).
        let mut b = t.clone();
        let epoch_at = 4 + 1 + 32 + 32 + 16 + 7;
        b[epoch_at] ^= 1;
        let q2 = decode(&b).expect("parse");
        let Gossip::Ticket(t2) = &q2.gossip else {
            panic!("not a ticket")
        };
        assert!(!signature_ok(&p, &b, &q2));
        assert!(open_ticket(&p, "g", &me, &local, &b, t2).is_none());
    }

    #[test]
    fn merge_proofs_bind_joiner_incarnation_group_and_key() {
        let p = CryptoProvider::default_provider();
        let (a, b) = (MemberId(ident(1).public()), MemberId(ident(2).public()));
        let base = merge_proof(&p, "g", &key(1, 1), &a, 5);
        assert_eq!(base, merge_proof(&p, "g", &key(1, 1), &a, 5));
        assert_ne!(base, merge_proof(&p, "g", &key(2, 1), &a, 5));
        assert_ne!(base, merge_proof(&p, "g", &key(1, 1), &b, 5));
        assert_ne!(base, merge_proof(&p, "g", &key(1, 1), &a, 6));
        assert_ne!(base, merge_proof(&p, "h", &key(1, 1), &a, 5));
    }
}
