//! Installing a view: the coordinator builds, signs and announces the Install (with the
//! key wrapped for every member, or the same key), participants check it, and every member
//! installs the view and its key, keeping the old view's keys for the grace period.
//!
//! Owns: the Install being resent (`Announce`, inside `ViewChange`), and writes the shared
//! view, rank, keys, group key and old views: it is the only file that installs them
//! (leaving, in `trust.rs`, and the grace timer, in `timers.rs`, only drop them). It starts
//! the new view's reliable channel through `Reliable::start_view`.

use super::flush::{Change, Coordinator, Phase};
use super::join::Joining;
use super::output::{Destination, BROADCAST};
use super::timers::interval;
use super::tree_flush::flush_children;
use super::{GroupMember, OldView, MAX_VIEW_MEMBERS};
use crate::config::RekeyMethod;
use crate::event::{Drop, GroupEvent, RemovalReason};
use crate::id::{Member, MemberId, Members, View, ViewId};
use crate::keys::{self, GroupKey, KeyWrap, ViewKeys, GROUP_KEY_LEN};
use crate::wire::{
    decode_roster, encode_roster, encode_roster_into, is_kept, kept_bits, kept_bits_fit,
    left_out_signed_bytes, ranks_left_out, roster_digest, Install, InstallCopies, Joined,
    KeyDelivery, Msg, PairMsg, MAX_PARTS, MAX_PART_LEN, PART_GRANT, PART_LIST, PART_WELCOME,
};
use cohort_core::Timestamp;
use cohort_crypto::Secret;
use rand_core::RngCore;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use zeroize::Zeroizing;

/// An installed view's sending side after the coordinator installed it: Install messages
/// are resent until acknowledged.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct Announce {
    pub(super) view: ViewId,
    /// The Install with every wrap (each member is sent a copy with its own).
    pub(super) install: Box<Install>,
    /// The new view's members (to find a member's rank for its copy).
    pub(super) members: Members,
    pub(super) welcome_key: Option<Zeroizing<Vec<u8>>>,
    /// The members (and whether each is a joiner) that have not acknowledged it.
    pub(super) unacked: Unacked,
    pub(super) resend_at: Timestamp,
    pub(super) until: Timestamp,
    /// When the Install first went out.
    pub(super) sent: Timestamp,
}

/// The members of an announced view that have not acknowledged its Install, by their rank
/// in it: an acknowledgement takes its member out in O(1) once its rank is known (the
/// leader of 10,000 took every folded acknowledgement out with a scan of all members). The
/// list is the view's own (shared, not copied), with one byte of state a rank.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct Unacked {
    members: Members,
    /// By rank: whether the member still owes an acknowledgement, and as what.
    state: Vec<Owed>,
    left: usize,
}

/// What the member at one rank of an [`Unacked`] still owes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Owed {
    /// Acknowledged (or the coordinator itself).
    Nothing,
    /// A survivor's acknowledgement.
    Survivor,
    /// A joiner's acknowledgement.
    Joiner,
}

impl Unacked {
    /// Every member of `members` but `me` unacknowledged; `joiner` tells which are joiners.
    /// `joiner` is asked with each member's rank.
    fn new(members: &Members, me: &MemberId, joiner: impl Fn(usize, &MemberId) -> bool) -> Self {
        let state: Vec<Owed> = members
            .iter()
            .enumerate()
            .map(|(r, m)| match (m.id == *me, joiner(r, &m.id)) {
                (true, _) => Owed::Nothing,
                (false, false) => Owed::Survivor,
                (false, true) => Owed::Joiner,
            })
            .collect();
        let left = state.iter().filter(|s| **s != Owed::Nothing).count();
        Unacked {
            members: members.clone(),
            state,
            left,
        }
    }

    /// Whether every member acknowledged.
    pub(super) fn is_empty(&self) -> bool {
        self.left == 0
    }

    /// The members still unacknowledged, by rank, with whether each is a joiner.
    pub(super) fn iter(&self) -> impl Iterator<Item = (Member, bool)> + '_ {
        self.ranked().map(|(_, owed)| owed)
    }

    /// As [`iter`](Self::iter), with each member's rank.
    pub(super) fn ranked(&self) -> impl Iterator<Item = (usize, (Member, bool))> + '_ {
        self.state
            .iter()
            .zip(self.members.iter())
            .enumerate()
            .filter(|(_, (s, _))| **s != Owed::Nothing)
            .map(|(r, (s, m))| (r, (*m, *s == Owed::Joiner)))
    }

    /// The member at `rank` acknowledged (if it is `id`: a rank of another list is ignored).
    pub(super) fn acked_at(&mut self, rank: usize, id: &MemberId) {
        let (Some(slot), Some(m)) = (self.state.get_mut(rank), self.members.get(rank)) else {
            return;
        };
        if *slot != Owed::Nothing && m.id == *id {
            *slot = Owed::Nothing;
            self.left -= 1;
        }
    }
}

/// A view's member list and each member's incarnation, by rank: what an Install's delta
/// resolves to and its digest covers.
#[derive(Clone)]
pub(super) struct Roster {
    pub(super) members: Members,
    pub(super) incarnations: Arc<[u64]>,
}

/// The parts of one message being put back together: an Install split over group packets,
/// a Welcome over pair records, or a member list. Bounded by [`MAX_PARTS`] parts of at most
/// [`MAX_PART_LEN`] bytes; a part that disagrees with the others on the total starts it over.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct Assembly {
    pub(super) view: ViewId,
    pub(super) what: u8,
    parts: Vec<Option<Vec<u8>>>,
    have: usize,
}

impl Assembly {
    pub(super) fn new(view: ViewId, what: u8, total: u16) -> Self {
        Assembly {
            view,
            what,
            parts: vec![None; usize::from(total).min(MAX_PARTS)],
            have: 0,
        }
    }

    /// Adds part `index` of `total`; `Err` if it does not fit this assembly.
    pub(super) fn add(&mut self, index: u16, total: u16, data: Vec<u8>) -> Result<(), ()> {
        if usize::from(total) != self.parts.len() || data.len() > MAX_PART_LEN {
            return Err(());
        }
        let slot = self.parts.get_mut(usize::from(index)).ok_or(())?;
        if slot.is_none() {
            *slot = Some(data);
            self.have += 1;
        }
        Ok(())
    }

    /// Whether every part is in.
    pub(super) fn complete(&self) -> bool {
        self.have == self.parts.len()
    }

    /// The first part missing, if any.
    pub(super) fn first_missing(&self) -> Option<u16> {
        self.parts
            .iter()
            .position(Option::is_none)
            .map(|i| i as u16)
    }

    /// The parts joined, once complete.
    pub(super) fn take(self) -> Option<Vec<u8>> {
        if !self.complete() {
            return None;
        }
        // One allocation and one copy per part (collecting the bytes one at a time through
        // a flattened iterator was a tenth of the simulator's CPU in a cold start of 5,000).
        let len = self.parts.iter().flatten().map(Vec::len).sum();
        let mut out = Vec::with_capacity(len);
        for part in self.parts.iter().flatten() {
            out.extend_from_slice(part);
        }
        Some(out)
    }
}

/// A member list being fetched from a view's coordinator: by a joiner (its Welcome's list
/// was too long to ride along) or by a survivor whose own copy of the base view did not
/// give the Install's digest.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct ListFetch {
    pub(super) install: Box<Install>,
    /// A joiner's key, from its Welcome; `None` for a survivor in a flush.
    pub(super) welcome_key: Option<Zeroizing<Vec<u8>>>,
    pub(super) coordinator: (MemberId, SocketAddr),
    pub(super) parts: Option<Assembly>,
    pub(super) retry_at: Timestamp,
    pub(super) tries: u32,
}

/// What an [`Assembly`] of Install chunks holds (beside `PART_WELCOME` and `PART_LIST`).
pub(super) const PART_INSTALL: u8 = 0;

/// Suspicion timeouts (gossip rounds) an Exchange's other component has to merge in before
/// the key it handed over is replaced.
const EXCHANGE_MERGE_ROUNDS: u32 = 5;

/// List parts sent for one request: a joiner asks again from the first part it lacks.
const LIST_WINDOW: u16 = 8;

/// Requests for a list's parts before a fetch gives up (a joiner then asks to join again;
/// a survivor waits for the Install's next copy or the next view change).
const MAX_FETCH_TRIES: u32 = 40;

/// Member lists up to this many bytes ride along in a joiner's Welcome (about 60 members):
/// small groups join in one round trip, as before delta Installs.
const INLINE_ROSTER: usize = 4096;

/// The Install a member receives: the Install with only that member's wrapped key (the
/// one-message rekey's wraps are per member; nobody needs another's).
pub(super) fn install_copy_for(install: &Install, rank: Option<u16>) -> Box<Install> {
    let key = key_for(install, rank);
    Box::new(Install {
        view: install.view,
        base: install.base,
        count: install.count,
        left: install.left.clone(),
        joined: install.joined.clone(),
        digest: install.digest,
        next_seqs: install.next_seqs.clone(),
        key_epoch: install.key_epoch,
        final_order: install.final_order,
        key,
        merge_into: install.merge_into,
        removed: install.removed.clone(),
        signature: install.signature.clone(),
    })
}

/// The Install's list of removed members: those of `removed` not removed as suspected, by
/// rank in `base` (ascending). A member not in `base` is left out of the list.
fn removed_by_rank(
    base: &Members,
    removed: &[(MemberId, RemovalReason)],
) -> Vec<(u16, RemovalReason)> {
    let mut out: Vec<(u16, RemovalReason)> = removed
        .iter()
        .filter(|(_, why)| *why != RemovalReason::Suspected)
        .filter_map(|(id, why)| Some((base.rank_of(id)? as u16, *why)))
        .collect();
    out.sort_unstable_by_key(|(r, _)| *r);
    out.dedup_by_key(|(r, _)| *r);
    out
}

/// Whether `install` is authenticated by each member's own wrap rather than by a
/// signature: a one-message Install (`Wrapped`), in either mode (`GROUP_VERSION` 10). Its
/// copies go to each member on its own and the member's wrap, under the pair key it shares
/// with the coordinator, binds everything a signature would cover; the members it leaves
/// out are told by a notice of their own (`LeftOut` or `PairMsg::Removed`), not by it.
pub(super) fn wrap_authenticates(install: &Install) -> bool {
    matches!(install.key, KeyDelivery::Wrapped(_))
}

/// The key field of the copy of `install` for the member at `rank` (`None`: no member).
fn key_for(install: &Install, rank: Option<u16>) -> KeyDelivery {
    match &install.key {
        KeyDelivery::Wrapped(wraps) => KeyDelivery::Wrapped(own_wraps(wraps, rank)),
        // An LKH Install's wraps go to everyone; a sealed path only to its member.
        KeyDelivery::Lkh(d) => {
            let mut d = d.clone();
            d.paths.retain(|(r, _)| Some(*r) == rank);
            KeyDelivery::Lkh(d)
        }
        other => other.clone(),
    }
}

/// The wraps of `wraps` for `rank`. The coordinator builds them in rank order, so a binary
/// search finds them (a scan of all n for each of n copies was O(n^2): most of the
/// one-message leader's CPU at 10,000 members); a list in another order, or a rank without
/// a wrap, falls back to the scan, which finds the same wraps.
fn own_wraps(wraps: &[(u16, KeyWrap)], rank: Option<u16>) -> Vec<(u16, KeyWrap)> {
    let Some(rank) = rank else {
        return Vec::new();
    };
    match own_wraps_of(wraps, rank) {
        [] => wraps.iter().filter(|(r, _)| *r == rank).cloned().collect(),
        own => own.to_vec(),
    }
}

/// The wraps of `wraps` for `rank`, when they are in rank order (as the coordinator builds
/// them): the run a binary search finds, or none.
fn own_wraps_of(wraps: &[(u16, KeyWrap)], rank: u16) -> &[(u16, KeyWrap)] {
    match wraps.binary_search_by_key(&rank, |(r, _)| *r) {
        Ok(i) => {
            let first = wraps[..i]
                .iter()
                .rposition(|(r, _)| *r != rank)
                .map_or(0, |p| p + 1);
            let end = wraps[i..]
                .iter()
                .position(|(r, _)| *r != rank)
                .map_or(wraps.len(), |p| i + p);
            &wraps[first..end]
        }
        Err(_) => &[],
    }
}

/// Whether every survivor's copy of `install` is the same (no per-member wrap; LKH sealed
/// paths only for joiners, who get theirs in their Welcome), so one copy can go down the
/// overlay for all.
fn shared_by_survivors(install: &Install) -> bool {
    let first_joiner = usize::from(install.count).saturating_sub(install.joined.len());
    match &install.key {
        KeyDelivery::Same | KeyDelivery::Tree(_) => true,
        KeyDelivery::Lkh(d) => d.paths.iter().all(|(r, _)| usize::from(*r) >= first_joiner),
        KeyDelivery::Wrapped(_) => false,
    }
}

/// `install` as the group messages that carry it, sealed under its base's keys: the
/// Install itself when its encoding fits `limit` bytes, as a [`Msg::InstallInView`] (the
/// receiver takes both view ids from the packet), else its whole encoding split into
/// [`Msg::InstallChunk`]s (the receiver decodes the joined parts). `None` when it would
/// take more than [`MAX_PARTS`] parts.
fn install_msgs(install: Box<Install>, limit: usize) -> Option<Vec<Msg>> {
    let view = install.view;
    let msg = Msg::InstallInView(install);
    let mut body = Vec::new();
    msg.encode(&mut body);
    if body.len() <= limit {
        return Some(vec![msg]);
    }
    let Msg::InstallInView(install) = msg else {
        return None;
    };
    body.clear();
    Msg::Install(install).encode(&mut body);
    let parts = split_parts(&body, limit);
    if parts.len() > MAX_PARTS {
        return None;
    }
    let total = parts.len() as u16;
    Some(
        parts
            .into_iter()
            .enumerate()
            .map(|(i, p)| Msg::InstallChunk {
                view,
                index: i as u16,
                total,
                data: p.to_vec(),
            })
            .collect(),
    )
}

/// Splits `bytes` into parts of at most `limit` bytes (at least one part).
pub(super) fn split_parts(bytes: &[u8], limit: usize) -> Vec<&[u8]> {
    if bytes.is_empty() {
        return vec![bytes];
    }
    bytes.chunks(limit.clamp(1, MAX_PART_LEN)).collect()
}

/// The most flush resend intervals a member left out waits for its turn to coordinate
/// those left out with it (see `go_on_left_out`).
const LEFT_OUT_TURNS: usize = 4;

/// A member left out of the next view, waiting its turn to coordinate those left out with
/// it.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct LeftOutTurn {
    /// When its turn comes.
    pub(super) at: Timestamp,
    /// The view it was left out of (the turn lapses if this member is in another by then).
    pub(super) base: ViewId,
    /// The coordinator that left it out (a flush of its does not count as another's).
    pub(super) left_by: MemberId,
    /// The members of `base` that went on without it.
    pub(super) gone: Vec<MemberId>,
}

impl GroupMember {
    pub(super) fn fresh_key(&mut self, epoch: u64) -> GroupKey {
        let mut secret = Secret::zeroed(GROUP_KEY_LEN);
        self.rng.fill_bytes(secret.expose_mut());
        GroupKey::new(epoch, secret)
    }

    pub(super) fn record_key(&mut self, key: &GroupKey) {
        let entry = (key.epoch, key.fingerprint(&self.provider));
        if !self.key_ledger.contains(&entry) {
            self.key_ledger.push(entry);
        }
    }

    /// The coordinator sends Install to survivors (old keys) and Welcome to joiners (pair
    /// channels), then installs the view itself.
    pub(super) fn send_install(&mut self, now: Timestamp) {
        let Some(base) = self.view.clone() else {
            return;
        };
        let Some(mut c) = self.view_change.coordinator.take() else {
            return;
        };
        let old_epoch = self.group_key.as_ref().map_or(0, |k| k.epoch);
        let key_epoch = c.new_key.as_ref().map_or(old_epoch, |k| k.epoch);
        // The change: survivors keep their old order, joiners are appended (`new_members`).
        // The coordinator's survivors are taken, not copied (a merge Install puts them
        // back): they come ascending already, so the sort only checks that.
        let n = base.members.len();
        let mut survivors = std::mem::take(&mut c.survivors);
        survivors.retain(|r| usize::from(*r) < n);
        survivors.sort_unstable();
        survivors.dedup();
        let left: Vec<u16> = ranks_left_out(n, &survivors).collect();
        let mut joined: Vec<Joined> = Vec::new();
        for (j, next_seq, incarnation) in &c.joiners {
            let survives = base
                .rank_of(&j.id)
                .is_some_and(|r| survivors.binary_search(&(r as u16)).is_ok());
            if survives || joined.iter().any(|x| x.member.id == j.id) {
                continue;
            }
            joined.push(Joined {
                member: *j,
                next_seq: *next_seq,
                incarnation: *incarnation,
            });
        }
        let total = survivors.len() + joined.len();
        if total == 0 {
            // Nobody stays (the coordinator leaves a view of its own): no view to install.
            self.leave_or_go_alone(now);
            return;
        }
        if total > MAX_VIEW_MEMBERS {
            return;
        }
        let incarnations: Vec<u64> = survivors
            .iter()
            .map(|r| self.incarnations.get(usize::from(*r)).copied().unwrap_or(0))
            .chain(joined.iter().map(|j| j.incarnation))
            .collect();
        let next_seqs: Vec<u64> = survivors
            .iter()
            .map(|r| c.answers.get(r).map_or(0, |a| a.next_seq))
            .chain(joined.iter().map(|j| j.next_seq))
            .collect();
        // The new list is built once (`Members::changed`: the indexes from the base view's,
        // not sorted again) and the roster encoded from it, into the buffer the view before
        // last's roster used: at 10,000 members each is over half a megabyte, and fresh
        // memory that size costs the leader page faults in every view change.
        let unchanged = left.is_empty() && joined.is_empty();
        let built = if unchanged {
            base.members.clone()
        } else {
            let joiners: Vec<Member> = joined.iter().map(|j| j.member).collect();
            Members::changed(&base.members, &survivors, &joiners)
        };
        let mut roster_bytes = std::mem::take(&mut self.roster_spare);
        encode_roster_into(&built, &incarnations, &mut roster_bytes);
        let digest = roster_digest(self.provider.keyed_blake3, &roster_bytes);
        let members: Members = if unchanged {
            built
        } else {
            Members::intern_built(&digest, built)
        };
        let roster = Roster {
            members: members.clone(),
            incarnations: intern_incarnations(&digest, incarnations),
        };
        // The sequencer of the new view needs every member's next message number: it has
        // them when it is this coordinator; otherwise the Install carries them.
        let leader_is_me = members[0].id == self.id;
        let mut install = Box::new(Install {
            view: c.proposal,
            base: base.id,
            count: members.len() as u16,
            left,
            joined,
            digest,
            next_seqs: if leader_is_me {
                Vec::new()
            } else {
                next_seqs.clone()
            },
            key_epoch,
            final_order: c.final_order,
            key: match (&c.new_key, self.config.rekey_method) {
                (None, _) => KeyDelivery::Same,
                (Some(k), RekeyMethod::Tree { .. }) => {
                    KeyDelivery::Tree(k.fingerprint(&self.provider))
                }
                (Some(_), RekeyMethod::OneMessage) => KeyDelivery::Wrapped(Vec::new()),
                (Some(_), RekeyMethod::Lkh { .. }) => KeyDelivery::Lkh(Box::default()),
            },
            merge_into: c.merge_into,
            // Members removed as suspected are not listed: a receiver reports every member
            // of its view the Install leaves out and does not list as suspected. A cut
            // removes thousands of them at once, and each entry (33 bytes) went in every
            // copy of the Install: the side of a cut of 10,000 that lost 1,250 sent each of
            // its 8,750 members 41 KB for them.
            // The others by their ranks in the base, which every survivor holds.
            removed: removed_by_rank(&base.members, &c.removed),
            signature: Vec::new(),
        });
        if let (Some(k), RekeyMethod::OneMessage) = (&c.new_key, self.config.rekey_method) {
            let bind = self.install_bind(&install);
            let mut wraps = Vec::with_capacity(members.len());
            // The Pairing phase found the pair keys, in the same order (a member it did not
            // list is looked up). A member without a pair key (the Pairing phase waited for
            // every one) or whose wrap failed gets none: it cannot install this view and is
            // removed in the next.
            let mut found = c.pair_keys.iter().peekable();
            for (r, m) in members.iter().enumerate() {
                if m.id == self.id {
                    continue;
                }
                let pk = match found.peek() {
                    Some((id, pk)) if *id == m.id => {
                        found.next();
                        Some(pk)
                    }
                    _ => self.pairs.pair_key(&m.id),
                };
                let wrapped =
                    pk.and_then(|pk| keys::wrap(pk, &c.proposal, r as u16, &m.id, k, &bind).ok());
                if let Some(w) = wrapped {
                    wraps.push((r as u16, w));
                }
            }
            install.key = KeyDelivery::Wrapped(wraps);
        }
        if let (Some(k), RekeyMethod::Lkh { .. }) = (&c.new_key, self.config.rekey_method) {
            install.key = self.lkh_delivery(&install, k, &members, c.lkh_reseed);
        }
        // Identity keys: the coordinator signs, unless each copy carries its member's own
        // wrap (one-message), which binds the Install's digest under the pair key (as in KDC
        // mode, which never signs): the signature was 65 of the 383 bytes of every copy.
        if let (Some(identity), false) = (self.identity.as_ref(), wrap_authenticates(&install)) {
            match identity.sign(&self.provider, &install.signed_bytes(&self.config.group)) {
                Ok(sig) => install.signature = sig,
                Err(_) => return, // the backend failed: no view change this time
            }
        }
        let replaced = self
            .roster_bytes
            .replace((install.view, Arc::new(roster_bytes)));
        if let Some(spare) = replaced.and_then(|(_, b)| Arc::try_unwrap(b).ok()) {
            self.roster_spare = spare;
        }
        let fresh_key = c.new_key.is_some() && c.exchange_from.is_none();
        let new_key = match c.new_key {
            Some(k) => k,
            None => match self.group_key.as_ref() {
                Some(k) => k.duplicate(),
                None => return,
            },
        };
        let welcome_key = Zeroizing::new(new_key.expose().to_vec());
        // Joiners are the last ranks (`Members::changed` appends them).
        let first_joiner = members.len().saturating_sub(install.joined.len());
        let unacked = Unacked::new(&members, &self.id, |r, id| {
            r >= first_joiner && install.joiner_rank(id).is_some()
        });
        let mut told = Vec::new();
        let removed_ids: HashSet<MemberId> = c.removed.iter().map(|(id, _)| *id).collect();
        for r in &install.left {
            let m = base.members[usize::from(*r)];
            // Removed members hear of it (under the old key they hold; the new key is
            // wrapped for members only). One that was suspected but is alive then goes on in
            // its own component at once, instead of after its suspicion timeout.
            if m.id != self.id && removed_ids.contains(&m.id) {
                told.push(m);
            }
        }
        // The leader of an overlay view sends an Install that is the same for every
        // survivor down the tree once (its children pass the sealed bytes on): its bytes and
        // seals do not grow with the view. Members the tree misses (below a dead member)
        // get their own copy when the Install is resent to those that did not acknowledge.
        let down_tree = self.rank == 0
            && self.overlay_active()
            && install.merge_into.is_none()
            && shared_by_survivors(&install)
            && self.install_down_tree(&install);
        // Copies only for those that get one of their own: with the Install down the tree,
        // the joiners (building a copy per survivor too cost the leader of 10,000 an Install
        // clone per member for nothing).
        // A survivor's copy is sealed for its rank in the current view (`survivors[r]`:
        // survivors keep their order and come first).
        let mut copies: Vec<(u16, u16, SocketAddr)> = Vec::new();
        for (r, (m, joiner)) in unacked.ranked() {
            if down_tree && !joiner {
                continue;
            }
            if joiner {
                let copy = install_copy_for(&install, Some(r as u16));
                self.send_welcome(now, &m, copy, &welcome_key);
            } else {
                match survivors.get(r) {
                    Some(old) => copies.push((r as u16, *old, m.addr)),
                    None => {
                        let copy = install_copy_for(&install, Some(r as u16));
                        self.send_install_msg(m.addr, copy, None);
                    }
                }
            }
        }
        self.send_install_copies(&install, &copies);
        // In KDC mode the members left out could not authenticate the Install (they hold no
        // wrap): they hear of it over their pair channel. With identity keys so does a
        // member that asked to leave, when its pair channel is up: it needs only to know
        // that it is out, not the Install (an LKH Install carries every wrap: 1.5 KB at
        // 1,000 members, against a few dozen bytes for the notice).
        let reasons: HashMap<MemberId, RemovalReason> = c.removed.iter().copied().collect();
        let mut left_out = Vec::new();
        for m in &told {
            let why = reasons.get(&m.id).copied();
            if self.identity.is_some()
                && !(why == Some(RemovalReason::Left) && self.pairs.pair_key(&m.id).is_some())
            {
                left_out.push(Destination::Member(m.addr));
            } else if let Some(why) = why {
                let msg = PairMsg::Removed {
                    view: install.view,
                    reason: why,
                };
                self.send_pair(now, m.addr, Some(m.id), &msg);
            }
        }
        if !left_out.is_empty() {
            self.send_left_out(&base, &install, left_out);
        }
        if let Some(target) = c.merge_into {
            // The component ends here, but the coordinator stays in it until every member
            // confirms the merge Install (or the flush timeout passes): it resends the
            // Install and serves the positions it needs meanwhile. Dissolving at once left a
            // member that missed the one copy waiting out its takeover turn, then alone,
            // then merging through an Exchange of its own: seconds (the group chaos runs).
            let waiting: Vec<Member> = unacked.iter().map(|(m, _)| m).collect();
            self.view_change.coordinator = Some(Coordinator {
                phase: Phase::Dissolving { target },
                deadline: now.saturating_add(self.config.flush_timeout),
                resend_at: now.saturating_add(interval::flush_resend(&self.config)),
                final_order: install.final_order,
                dissolving: Some((install, waiting)),
                survivors,
                new_key: None,
                pair_keys: Vec::new(),
                ..c
            });
            self.progress_flush(now);
            return;
        }
        let took = now.saturating_duration_since(c.started);
        let removed = c.removed.clone();
        let leaving_self = members.rank_of(&self.id).is_none();
        if fresh_key {
            // A fresh key completed first: a ticket that came meanwhile is dropped (the next
            // gossip starts the Exchange again, with this key on our side).
            self.heal.held_exchange = None;
        }
        if let Some((from, from_addr)) = c.exchange_from {
            // Appendix 12.1: the Exchange completed first; a rekey asked for meanwhile is
            // dropped.
            let rekey_dropped = self.view_change.rekey_wanted.take().is_some();
            self.heal
                .exchanged
                .push(new_key.fingerprint(&self.provider));
            self.events.push_back(GroupEvent::KeyExchanged {
                from,
                key_epoch,
                rekey_dropped,
            });
            // Gossip at once, so the other leader sees that the keys match.
            self.heal.next_gossip = now;
            self.heal.exchange_reply_to = Some(from_addr);
            // Its component should merge in within a few gossip rounds; if its leader has
            // not by then, the key it handed over is rekeyed away.
            self.heal.exchange_check = Some((
                now.saturating_add(self.config.suspect_timeout * EXCHANGE_MERGE_ROUNDS),
                from,
                new_key.fingerprint(&self.provider),
            ));
        }
        self.view_change.announce = Some(Announce {
            view: install.view,
            install: install.clone(),
            members: members.clone(),
            welcome_key: Some(welcome_key),
            unacked,
            resend_at: now.saturating_add(interval::flush_resend(&self.config)),
            until: now.saturating_add(self.config.key_grace),
            sent: now,
        });
        if leaving_self {
            self.leave_or_go_alone(now);
            return;
        }
        // Every member of the new view passed this coordinator's trust check (survivors in
        // `start_coordinating`, or in the change before; joiners when let in).
        self.view_change.trusted_view = Some(install.view);
        // The coordinator delivers what every survivor delivers before the new view.
        self.deliver_up_to(install.final_order);
        self.install_view(
            now,
            &install,
            roster,
            next_seqs,
            new_key,
            Some((took, removed)),
        );
    }

    /// Adds part `index` of `total` of a message of kind `what` for `view` to the one being
    /// reassembled (a part of another view or kind starts over); the whole message's bytes
    /// once every part is in. A part that does not fit is counted and drops the assembly.
    fn add_part(
        &mut self,
        view: ViewId,
        what: u8,
        index: u16,
        total: u16,
        data: Vec<u8>,
    ) -> Option<Vec<u8>> {
        let fresh = self
            .view_change
            .assembly
            .as_ref()
            .is_none_or(|a| a.view != view || a.what != what);
        if fresh {
            self.view_change.assembly = Some(Assembly::new(view, what, total));
        }
        let a = self.view_change.assembly.as_mut()?;
        if a.add(index, total, data).is_err() {
            self.counters.count(Drop::Malformed);
            self.view_change.assembly = None;
            return None;
        }
        if !a.complete() {
            return None;
        }
        self.view_change.assembly.take().and_then(Assembly::take)
    }

    /// The leader of an overlay view: seals the survivors' copy of `install` once (or each
    /// of its parts, when it needs more than one) and sends it down the tree: the flush
    /// tree of the change (`tree_flush.rs`), which goes around the members it leaves out,
    /// and to the members reporting directly. False when it would take more than
    /// `MAX_PARTS` parts or a seal failed: the caller then sends every member its own copy.
    fn install_down_tree(&mut self, install: &Install) -> bool {
        // One longer than a part goes down in its parts, each sealed once: a batch of many
        // leavers rekeys most of the LKH tree (about 460 KB of wraps at 10,000 members when
        // an eighth of them were cut off), and one copy per member of that was 4.6 GB sent
        // by the leader after one input.
        let Some(msgs) = install_msgs(install_copy_for(install, None), self.part_limit) else {
            return false;
        };
        // A carrier that fans out reaches every member with one publish (issue 15): the
        // members do not pass packets down the tree then.
        if self.config.carrier_fans_out {
            return msgs
                .iter()
                .all(|m| self.seal_to([Destination::Group], BROADCAST, m));
        }
        let Some(view) = self.view.as_ref() else {
            return false;
        };
        let n = view.members.len();
        let survivors: Vec<u16> = (0..n as u16)
            .filter(|r| install.left.binary_search(r).is_err())
            .collect();
        let mut targets = flush_children(0, n, &survivors);
        if let Some(s) = self.reliable.sequencer.as_ref() {
            targets.extend(s.orphans.iter().copied());
        }
        targets.sort_unstable();
        targets.dedup();
        let to: Vec<Destination> = targets
            .iter()
            .filter_map(|r| view.members.get(usize::from(*r)))
            .map(|m| Destination::Member(m.addr))
            .collect();
        msgs.iter().all(|m| self.seal_to(to.clone(), BROADCAST, m))
    }

    /// Sends each of `to` (rank in the new view, rank in the current view, address) its own
    /// copy of `install` (only its own wrap or path) under the current view's keys. One copy
    /// is kept and only its key field replaced per member, and each is encoded once and
    /// sealed for the known rank: the one-message leader of 10,000 cloned the Install twice,
    /// encoded it twice and looked the rank up by address for every member. A copy longer
    /// than a part goes through [`send_install_msg`](Self::send_install_msg) in chunks.
    fn send_install_copies(&mut self, install: &Install, to: &[(u16, u16, SocketAddr)]) {
        if to.is_empty() {
            return;
        }
        let gears = self.send_gears();
        let mut msg = Msg::InstallInView(install_copy_for(install, None));
        // A one-message Install's copies differ only in their wraps: encoded once around
        // them (`InstallCopies`, the same bytes as encoding each copy whole).
        // Only for wraps in rank order (the coordinator's are), where a binary search finds
        // a member's own.
        let copies = match &install.key {
            KeyDelivery::Wrapped(wraps) if wraps.is_sorted_by_key(|(r, _)| *r) => {
                InstallCopies::new(install).map(|c| (c, wraps))
            }
            _ => None,
        };
        let mut body = std::mem::take(&mut self.scratch);
        for &(rank, dest, addr) in to {
            body.clear();
            body.extend_from_slice(&dest.to_be_bytes());
            match &copies {
                Some((c, wraps)) => c.encode(own_wraps_of(wraps, rank), &mut body),
                None => {
                    if let Msg::InstallInView(copy) = &mut msg {
                        copy.key = key_for(install, Some(rank));
                    }
                    msg.encode(&mut body);
                }
            }
            if body.len() - 2 > self.part_limit {
                let copy = install_copy_for(install, Some(rank));
                self.send_install_msg(addr, copy, None);
                continue;
            }
            let Some(keys) = self.keys.as_mut() else {
                break;
            };
            // Sealed straight into the outbox's buffer: no packet of its own to allocate
            // and free, 10,000 times at a leader of 10,000.
            let _ = self.out.push_with([Destination::Member(addr)], |buf| {
                keys.seal(&gears, &body, buf)
            });
        }
        self.scratch = body;
    }

    /// Sends `install` to the member at `to` under the current view's keys (or the kept
    /// view `old`'s): whole when it fits one part, otherwise in [`Msg::InstallChunk`]s.
    pub(super) fn send_install_msg(
        &mut self,
        to: SocketAddr,
        install: Box<Install>,
        old: Option<ViewId>,
    ) {
        let Some(msgs) = install_msgs(install, self.part_limit) else {
            return;
        };
        for m in &msgs {
            match old {
                Some(v) => self.send_msg_old(v, to, m),
                None => self.send_msg(to, m),
            }
        }
    }

    /// Tells the members of `base` that `install` leaves out (identity keys) that they are
    /// out, and who goes on without them: one [`Msg::LeftOut`], signed and sealed once for
    /// all of them. It used to be the whole Install to each, which lists every member
    /// removed: the coordinator of the side of a partition cut off from about 8,750 of
    /// 10,000 members sent each of them an Install of some 300 KB (3.5 GB from one member
    /// after one input, seventeenth session).
    fn send_left_out(&mut self, base: &View, install: &Install, to: Vec<Destination>) {
        let Some(identity) = self.identity.as_ref() else {
            return;
        };
        let kept = kept_bits(base.members.len(), &install.left);
        let mut rejoined: Vec<u16> = install
            .joined
            .iter()
            .filter_map(|j| base.members.rank_of(&j.member.id))
            .map(|r| r as u16)
            .collect();
        rejoined.sort_unstable();
        rejoined.dedup();
        let signed = left_out_signed_bytes(
            &self.config.group,
            &install.view,
            &install.base,
            &kept,
            &rejoined,
        );
        let Ok(signature) = identity.sign(&self.provider, &signed) else {
            return; // the backend failed: they learn of it when their suspicion times out
        };
        let msg = Msg::LeftOut {
            view: install.view,
            base: install.base,
            kept,
            rejoined,
            signature,
        };
        if let Some(packet) = self.seal(BROADCAST, &msg) {
            self.out.push_copies(to, &packet);
        }
    }

    /// Sends a joiner its Welcome over the pair channel: in [`PairMsg::Part`]s when it is
    /// longer than a part; with the member list inline when that is short.
    pub(super) fn send_welcome(
        &mut self,
        now: Timestamp,
        m: &Member,
        install: Box<Install>,
        key: &Zeroizing<Vec<u8>>,
    ) {
        let roster = match self.roster_bytes.as_ref() {
            Some((v, bytes)) if *v == install.view && bytes.len() <= INLINE_ROSTER => {
                bytes.to_vec()
            }
            _ => Vec::new(),
        };
        let view = install.view;
        let w = PairMsg::Welcome {
            install,
            key: key.clone(),
            roster,
        };
        self.send_pair_in_parts(now, m.addr, m.id, view, PART_WELCOME, &w);
    }

    /// Resends the announced Install (and Welcomes) to the members that have not
    /// acknowledged it (the timer, every `flush_timeout / 4`).
    pub(super) fn resend_announce(&mut self, now: Timestamp) {
        let Some(mut a) = self.view_change.announce.take() else {
            return;
        };
        a.resend_at = now.saturating_add(interval::flush_resend(&self.config));
        let old = self.old_views.last().map(|o| o.view.id);
        let waiting: Vec<(Member, bool)> = a.unacked.iter().collect();
        for (m, joiner) in waiting {
            let copy = install_copy_for(&a.install, a.members.rank_of(&m.id).map(|r| r as u16));
            if joiner {
                let key = a.welcome_key.clone().unwrap_or_default();
                self.send_welcome(now, &m, copy, &key);
            } else if let Some(old) = old {
                self.send_install_msg(m.addr, copy, Some(old));
            }
        }
        self.view_change.announce = Some(a);
    }

    /// `member` acknowledged the announced Install (or, while this coordinator dissolves
    /// its component, the merge Install): it is not resent there.
    pub(super) fn on_install_ack(&mut self, now: Timestamp, member: MemberId) {
        if let Some(a) = self.view_change.announce.as_mut() {
            if let Some(r) = a.members.rank_of(&member) {
                a.unacked.acked_at(r, &member);
            }
            if a.unacked.is_empty() {
                // A change held back for the last confirmation can start now.
                self.maybe_start_change(now);
            }
        }
        let dissolving = self.view_change.coordinator.as_mut().and_then(|c| {
            matches!(c.phase, Phase::Dissolving { .. })
                .then_some(())
                .and(c.dissolving.as_mut())
        });
        if let Some((_, waiting)) = dissolving {
            waiting.retain(|m| m.id != member);
            self.progress_flush(now);
        }
    }

    /// Dissolving coordinator: sends the merge Install again to the members that have not
    /// confirmed it (under the component's keys, which they still hold).
    pub(super) fn resend_merge_install(&mut self, now: Timestamp) {
        let Some(c) = self.view_change.coordinator.as_mut() else {
            return;
        };
        c.resend_at = now.saturating_add(interval::flush_resend(&self.config));
        let Some((install, waiting)) = c.dissolving.as_ref() else {
            return;
        };
        // A merge Install lets nobody in (survivors only): a member's rank follows from its
        // rank in the current view.
        let copies: Vec<(SocketAddr, Box<Install>)> = waiting
            .iter()
            .map(|m| {
                let rank = self
                    .view
                    .as_ref()
                    .and_then(|v| v.rank_of(&m.id))
                    .and_then(|r| install.survivor_rank(r as u16));
                (m.addr, install_copy_for(install, rank))
            })
            .collect();
        for (addr, copy) in copies {
            self.send_install_msg(addr, copy, None);
        }
    }

    /// Dissolving coordinator: every member confirmed the merge Install, or the wait is
    /// over. Delivers what the component's final flush decided and joins the target.
    pub(super) fn finish_dissolving(&mut self, now: Timestamp, target: SocketAddr) {
        let final_order = self
            .view_change
            .coordinator
            .as_ref()
            .map_or(self.reliable.delivered, |c| c.final_order);
        self.view_change.coordinator = None;
        self.deliver_up_to(final_order);
        self.dissolve(now, target);
    }

    /// A [`Msg::LeftOut`] from the member at `rank`: the coordinator of `new_view` left this
    /// member out of it. Taken only from that coordinator, with identity keys, for our view,
    /// for a newer view, when it does not keep this member (a copy replayed to a member it
    /// keeps is refused) and when the signature holds.
    #[allow(clippy::too_many_arguments)] // the message's fields, as the other handlers take them
    pub(super) fn on_left_out(
        &mut self,
        now: Timestamp,
        rank: u16,
        new_view: ViewId,
        base: ViewId,
        kept: Vec<u8>,
        rejoined: Vec<u16>,
        signature: Vec<u8>,
    ) {
        let Some(coord) = self.member_at(rank) else {
            return;
        };
        if self.identity.is_none() || new_view.coordinator != coord.id {
            self.counters.count(Drop::Unexpected);
            return;
        }
        if !self.trusts(&coord.id) {
            self.counters.count(Drop::Untrusted);
            return;
        }
        let Some(view) = self.view.as_ref() else {
            return;
        };
        let n = view.members.len();
        if base != view.id
            || !kept_bits_fit(&kept, n)
            || rejoined.last().is_some_and(|r| usize::from(*r) >= n)
            || is_kept(&kept, self.rank)
        {
            self.counters.count(Drop::Unexpected);
            return;
        }
        let newer = self
            .view_change
            .flushing
            .as_ref()
            .is_some_and(|f| f.proposal == new_view)
            || new_view > view.id;
        if !newer {
            return;
        }
        let signed = left_out_signed_bytes(&self.config.group, &new_view, &base, &kept, &rejoined);
        if !new_view
            .coordinator
            .0
            .verify(&self.provider, &signed, &signature)
        {
            self.counters.count(Drop::AuthFailed);
            return;
        }
        let gone: Vec<MemberId> = (0..n as u16)
            .filter(|r| is_kept(&kept, *r) || rejoined.binary_search(r).is_ok())
            .map(|r| view.members[usize::from(r)].id)
            .collect();
        let view = view.clone();
        self.go_on_left_out(now, &view, new_view.coordinator, gone);
    }

    /// This member learned, authenticated, that the next view (coordinated by `left_by`)
    /// leaves it out of `view`, which goes on with `gone` (kept or let in again). If it asked to leave, it has left. If it
    /// was suspected, untrusted or lagged while alive, it goes on at once in a component of
    /// those left out (whoever of them answers), which probing merges back later. A lagged
    /// member used to leave for good here (no view, no join, no timer) although alive and
    /// reachable: issue 17 §2, tests/lagged_rejoin.rs.
    ///
    /// Only the first of those left out (by rank) coordinates at once; the one after it
    /// waits a flush resend interval, the next two, and so on up to [`LEFT_OUT_TURNS`],
    /// and each goes ahead only if no view change of another has reached it by then. When
    /// every member left out coordinated at once, each sent a Flush to all the others: a
    /// cut of about 1,250 from 10,000 made up to 1,250 x 1,249 Flushes of some 17 KB each
    /// (the 10,000 sweep spent most of its CPU encoding them).
    fn go_on_left_out(
        &mut self,
        now: Timestamp,
        view: &View,
        left_by: MemberId,
        gone: Vec<MemberId>,
    ) {
        if self.leaving.is_some() {
            self.leave_now(RemovalReason::Left);
            return;
        }
        if self.view_change.coordinator.is_some() {
            return;
        }
        // Not this member, though the Install may let it in under an incarnation it no
        // longer has (a stale join request): left in, this member coordinated a change
        // without itself and ended expelled "left" for good.
        let me = self.id;
        let gone: Vec<MemberId> = gone.into_iter().filter(|id| *id != me).collect();
        let going: HashSet<MemberId> = gone.iter().copied().collect();
        let before = view.members[..usize::from(self.rank).min(view.members.len())]
            .iter()
            .filter(|m| !going.contains(&m.id))
            .count();
        if before == 0 {
            self.coordinate_left_out(now, view, gone);
            return;
        }
        let turn = before.min(LEFT_OUT_TURNS) as u32;
        self.view_change.left_out = Some(LeftOutTurn {
            at: now.saturating_add(interval::flush_resend(&self.config) * turn),
            base: view.id,
            left_by,
            gone,
        });
    }

    /// Starts the view change of the members of `view` not in `gone`, this one among them.
    fn coordinate_left_out(&mut self, now: Timestamp, view: &View, gone: Vec<MemberId>) {
        let gone: Vec<(MemberId, RemovalReason)> = gone
            .into_iter()
            .map(|id| (id, RemovalReason::Suspected))
            .collect();
        let change = Change {
            rekey: self.config.rekey_policy.on_membership_change,
            ..Change::removing(view, gone, now)
        };
        self.start_coordinating(now, change);
    }

    /// This member's turn to coordinate those left out with it has come (`on_tick`): it
    /// does, unless it moved on meanwhile (another view, a view change of its own, or the
    /// Flush of another member left out).
    pub(super) fn left_out_turn(&mut self, now: Timestamp) {
        let Some(turn) = self.view_change.left_out.take() else {
            return;
        };
        let Some(view) = self.view.clone().filter(|v| v.id == turn.base) else {
            return;
        };
        let others_flush = self
            .view_change
            .flushing
            .as_ref()
            .is_some_and(|f| f.proposal.coordinator != turn.left_by);
        if others_flush || self.view_change.coordinator.is_some() || self.expelled {
            return;
        }
        self.coordinate_left_out(now, &view, turn.gone);
    }

    /// Part of an Install split over group packets, from the member at `rank`: kept until
    /// every part is in, then handled as the whole Install (which its signature or wrap
    /// authenticates as a whole).
    pub(super) fn on_install_chunk(
        &mut self,
        now: Timestamp,
        rank: u16,
        view: ViewId,
        index: u16,
        total: u16,
        data: Vec<u8>,
    ) {
        let relevant =
            self.view_change.flushing.as_ref().is_some_and(|f| {
                f.proposal == view && f.install.is_none() && f.coordinator == rank
            }) || self.view.as_ref().is_some_and(|v| view > v.id);
        if !relevant {
            return;
        }
        let Some(bytes) = self.add_part(view, PART_INSTALL, index, total, data) else {
            return;
        };
        match Msg::decode(&bytes) {
            Some(Msg::Install(install)) if install.view == view => {
                self.on_install(now, rank, install)
            }
            _ => self.counters.count(Drop::Malformed),
        }
    }

    pub(super) fn on_install(&mut self, now: Timestamp, rank: u16, install: Box<Install>) {
        let Some(coord) = self.member_at(rank) else {
            return;
        };
        if install.view.coordinator != coord.id {
            self.counters.count(Drop::Unexpected);
            return;
        }
        if !self.trusts(&coord.id) {
            self.counters.count(Drop::Untrusted);
            return;
        }
        let relevant = self
            .view_change
            .flushing
            .as_ref()
            .is_some_and(|f| f.proposal == install.view && f.install.is_none())
            || self.view.as_ref().is_some_and(|v| install.view > v.id);
        if !relevant {
            return;
        }
        let Some(view) = self.view.clone() else {
            return;
        };
        if install.base != view.id || !delta_fits(&view, &install) {
            // Flushes run under the base view's keys, so a member taking part holds the
            // base: this Install is for another view than ours.
            self.counters.count(Drop::Unexpected);
            return;
        }
        let new_rank = install.survivor_rank(self.rank);
        if !self.install_is_signed(&install, new_rank) {
            self.counters.count(Drop::AuthFailed);
            return;
        }
        if new_rank.is_none() {
            // We were removed.
            let newer = self
                .view_change
                .flushing
                .as_ref()
                .is_some_and(|f| f.proposal == install.view)
                || install.view > view.id;
            if !newer {
                return;
            }
            let gone: Vec<MemberId> = (0..view.members.len() as u16)
                .filter(|r| install.left.binary_search(r).is_err())
                .map(|r| view.members[usize::from(r)].id)
                .chain(install.joined.iter().map(|j| j.member.id))
                .collect();
            self.go_on_left_out(now, &view, install.view.coordinator, gone);
            return;
        }
        let Some(f) = self.view_change.flushing.as_ref() else {
            return;
        };
        if f.proposal != install.view || f.coordinator != rank || f.install.is_some() {
            return;
        }
        // The new list from our copy of the base; a digest that differs (our copy is not
        // the coordinator's) sends us to fetch the list from the coordinator.
        let roster = self.apply_delta(&view, &install);
        if roster.is_none() {
            self.counters.count(Drop::AuthFailed);
            self.view_change.fetch = Some(ListFetch {
                install: install.clone(),
                welcome_key: None,
                coordinator: (coord.id, coord.addr),
                parts: None,
                retry_at: now,
                tries: 0,
            });
        }
        if let Some(f) = self.view_change.flushing.as_mut() {
            f.install = Some(install);
            f.roster = roster;
        }
        self.progress_flush(now);
    }

    /// The new view's list from `base` (our copy) and the change, if it gives the
    /// Install's digest. When this process already holds the list and incarnations under
    /// that digest (another member built and checked them: a simulator), ours are compared
    /// with them in O(n) and shared; otherwise built, hashed and remembered.
    pub(super) fn apply_delta(&self, base: &View, install: &Install) -> Option<Roster> {
        if !delta_fits(base, install) {
            return None;
        }
        let left = &install.left;
        let survivors = (0..base.members.len() as u16).filter(|r| left.binary_search(r).is_err());
        let incarnation = |r: u16| self.incarnations.get(usize::from(r)).copied().unwrap_or(0);
        // Whether a list this process holds is this change of the base: compared a run of
        // survivors at a time (every member of a simulated group of 10,000 does this for
        // every view; element by element through a filtered iterator it was most of the
        // simulator's CPU in the tail of a KDC cold start).
        let same_members = |list: &[Member]| {
            list.len() == usize::from(install.count)
                && is_change_of(
                    &base.members,
                    left,
                    install.joined.iter().map(|j| j.member),
                    list,
                )
        };
        let same_incarnations = |incs: &[u64]| {
            incs.len() == usize::from(install.count)
                && if self.incarnations.len() >= base.members.len() {
                    is_change_of(
                        &self.incarnations[..base.members.len()],
                        left,
                        install.joined.iter().map(|j| j.incarnation),
                        incs,
                    )
                } else {
                    survivors
                        .clone()
                        .map(incarnation)
                        .chain(install.joined.iter().map(|j| j.incarnation))
                        .zip(incs)
                        .all(|(a, b)| a == *b)
                }
        };
        let unchanged = left.is_empty() && install.joined.is_empty();
        let held = if unchanged {
            same_members(&base.members).then(|| base.members.clone())
        } else {
            Members::lookup(&install.digest, same_members)
        };
        if let (Some(members), Some(incarnations)) = (
            held,
            lookup_incarnations(&install.digest).filter(|i| same_incarnations(i)),
        ) {
            return Some(Roster {
                members,
                incarnations,
            });
        }
        let list: Vec<Member> = survivors
            .clone()
            .map(|r| base.members[usize::from(r)])
            .chain(install.joined.iter().map(|j| j.member))
            .collect();
        let incarnations: Vec<u64> = survivors
            .map(incarnation)
            .chain(install.joined.iter().map(|j| j.incarnation))
            .collect();
        let bytes = encode_roster(&list, &incarnations);
        if roster_digest(self.provider.keyed_blake3, &bytes) != install.digest {
            return None;
        }
        let members = if unchanged {
            base.members.clone()
        } else {
            let kept: Vec<u16> = (0..base.members.len() as u16)
                .filter(|r| left.binary_search(r).is_err())
                .collect();
            let joiners: Vec<Member> = install.joined.iter().map(|j| j.member).collect();
            Members::intern_built(
                &install.digest,
                Members::changed(&base.members, &kept, &joiners),
            )
        };
        Some(Roster {
            members,
            incarnations: intern_incarnations(&install.digest, incarnations),
        })
    }

    /// A member list for `install` from its bytes, if it gives the digest and has the
    /// Install's length.
    pub(super) fn roster_from_bytes(&self, install: &Install, bytes: &[u8]) -> Option<Roster> {
        if roster_digest(self.provider.keyed_blake3, bytes) != install.digest {
            return None;
        }
        let (list, incarnations) = decode_roster(bytes)?;
        if list.len() != usize::from(install.count) {
            return None;
        }
        let members = Members::lookup(&install.digest, |held| held == &list[..])
            .unwrap_or_else(|| Members::intern(&install.digest, list));
        Some(Roster {
            members,
            incarnations: intern_incarnations(&install.digest, incarnations),
        })
    }

    pub(super) fn finish_participant_install(
        &mut self,
        now: Timestamp,
        install: Box<Install>,
        roster: Roster,
    ) {
        if let Some(target) = install.merge_into {
            self.deliver_up_to(install.final_order);
            // Confirm under the component's keys before dropping them: the coordinator stays
            // until every member has.
            self.ack_install(&install, &roster.members);
            self.dissolve(now, target);
            return;
        }
        let Some(my_rank) = roster.members.rank_of(&self.id) else {
            return;
        };
        let key = match &install.key {
            KeyDelivery::Same => self.group_key.as_ref().map(|k| k.duplicate()),
            KeyDelivery::Wrapped(_) => match self.view_change.unwrapped.take() {
                Some((view, key)) if view == install.view => Some(key),
                _ => self.unwrap_own(&install, Some(my_rank as u16)),
            },
            KeyDelivery::Tree(fp) => match self.tree.tree_key.as_ref() {
                Some((p, k)) if *p == install.view && k.fingerprint(&self.provider) == *fp => {
                    Some(k.duplicate())
                }
                _ => None,
            },
            KeyDelivery::Lkh(_) => self.lkh_install(&install, my_rank as u16),
        };
        let Some(key) = key else {
            // The key did not arrive or did not authenticate: wait for a retransmission (the
            // pair channel may still be coming up) or for the next view change.
            if let Some(f) = self.view_change.flushing.as_mut() {
                f.install = None;
                f.roster = None;
            }
            return;
        };
        if key.epoch != install.key_epoch {
            self.counters.count(Drop::Unexpected);
            if let Some(f) = self.view_change.flushing.as_mut() {
                f.install = None;
                f.roster = None;
            }
            return;
        }
        // Own next message number: the one this member reported in its flush answer.
        let own = self
            .view_change
            .flushing
            .as_ref()
            .and_then(|f| f.answered_next_seq)
            .unwrap_or(self.reliable.next_reliable);
        let next_seqs = self.next_seqs_for(&install, my_rank, own);
        self.deliver_up_to(install.final_order);
        self.install_view(now, &install, roster.clone(), next_seqs, key, None);
        // After a flush on the overlay the acknowledgement goes up the old view's tree.
        if !self.tree_ack_own(now, install.view) {
            self.ack_install(&install, &roster.members);
        }
    }

    /// Every member's next message number for `Reliable::start_view`: the Install's list
    /// when it carries one (the new leader is not its coordinator), else zeros with this
    /// member's own number at its rank (only a sequencer reads the others').
    pub(super) fn next_seqs_for(&self, install: &Install, my_rank: usize, own: u64) -> Vec<u64> {
        if install.next_seqs.len() == usize::from(install.count) {
            return install.next_seqs.clone();
        }
        let mut seqs = vec![0; usize::from(install.count)];
        if let Some(s) = seqs.get_mut(my_rank) {
            *s = own;
        }
        seqs
    }

    /// A joiner or a survivor asks again for the list parts it lacks, when due; gives up
    /// after `MAX_FETCH_TRIES`.
    pub(super) fn fetch_tick(&mut self, now: Timestamp) {
        let retry = interval::fetch_retry(&self.config);
        let Some(f) = self.view_change.fetch.as_mut() else {
            return;
        };
        if now < f.retry_at {
            return;
        }
        if f.tries >= MAX_FETCH_TRIES {
            self.view_change.fetch = None;
            if let Some(fl) = self.view_change.flushing.as_mut() {
                fl.install = None;
            }
            return;
        }
        f.tries += 1;
        f.retry_at = now.saturating_add(retry * 2);
        let from = f
            .parts
            .as_ref()
            .and_then(Assembly::first_missing)
            .unwrap_or(0);
        let msg = PairMsg::ListRequest {
            view: f.install.view,
            from,
        };
        let (id, addr) = f.coordinator;
        self.send_pair(now, addr, Some(id), &msg);
    }

    /// At a view's coordinator: a member of the view asks for its list's parts from `from`.
    /// Anyone not in the view, or a view that is not the current one, gets nothing.
    pub(super) fn on_list_request(
        &mut self,
        now: Timestamp,
        peer: MemberId,
        addr: SocketAddr,
        view: ViewId,
        from: u16,
    ) {
        let Some(current) = self.view.as_ref() else {
            self.counters.count(Drop::Unexpected);
            return;
        };
        let member = current
            .rank_of(&peer)
            .is_some_and(|r| current.members[r].addr == addr);
        if current.id != view || !member || view.coordinator != self.id {
            self.counters.count(Drop::Unexpected);
            return;
        }
        let bytes = match self.roster_bytes.as_ref() {
            Some((v, b)) if *v == view => b.clone(),
            _ => {
                let b = Arc::new(encode_roster(&current.members, &self.incarnations));
                self.roster_bytes = Some((view, b.clone()));
                b
            }
        };
        let parts = split_parts(&bytes, self.part_limit);
        if parts.len() > MAX_PARTS {
            return;
        }
        let total = parts.len() as u16;
        let end = from.saturating_add(LIST_WINDOW).min(total);
        for i in from..end {
            let part = PairMsg::Part {
                view,
                what: PART_LIST,
                index: i,
                total,
                data: parts[usize::from(i)].to_vec(),
            };
            self.send_pair(now, addr, Some(peer), &part);
        }
    }

    /// A part over a pair channel: of a joiner's Welcome or KDC-mode Grant, or of the member
    /// list it (or a survivor) fetches.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_part(
        &mut self,
        now: Timestamp,
        peer: MemberId,
        addr: SocketAddr,
        view: ViewId,
        what: u8,
        index: u16,
        total: u16,
        data: Vec<u8>,
    ) {
        if what == PART_GRANT {
            // KDC mode, at a joiner: a Grant too long for one record (`join.rs`, `grant`).
            // Each part came over the pair channel with the leader, which authenticated it;
            // the whole is taken only once every part is in and it decodes as a Grant for
            // the parts' view.
            if self.identity.is_some() || self.joining.is_none() {
                self.counters.count(Drop::Unexpected);
                return;
            }
            let Some(bytes) = self.add_part(view, PART_GRANT, index, total, data) else {
                return;
            };
            match PairMsg::decode(&bytes) {
                Some(PairMsg::Grant {
                    view: granted,
                    token,
                    members,
                }) if granted == view => self.on_grant(now, peer, addr, view, token, members),
                _ => self.counters.count(Drop::Malformed),
            }
            return;
        }
        if what == PART_WELCOME {
            if self.joining.is_none() || view.coordinator != peer {
                self.counters.count(Drop::Unexpected);
                return;
            }
            let Some(bytes) = self.add_part(view, PART_WELCOME, index, total, data) else {
                return;
            };
            match PairMsg::decode(&bytes) {
                Some(PairMsg::Welcome {
                    install,
                    key,
                    roster,
                }) if install.view == view => {
                    self.on_welcome(now, peer, addr, install, key, roster)
                }
                _ => self.counters.count(Drop::Malformed),
            }
            return;
        }
        let Some(f) = self.view_change.fetch.as_mut() else {
            self.counters.count(Drop::Unexpected);
            return;
        };
        if f.install.view != view || f.coordinator.0 != peer {
            self.counters.count(Drop::Unexpected);
            return;
        }
        let a = f
            .parts
            .get_or_insert_with(|| Assembly::new(view, PART_LIST, total));
        if a.add(index, total, data).is_err() {
            self.counters.count(Drop::Malformed);
            f.parts = None;
            return;
        }
        if !a.complete() {
            // The window is in: ask for the next one now rather than at the retry.
            let window_done = a
                .first_missing()
                .is_some_and(|m| m > index && m % LIST_WINDOW == 0);
            if window_done {
                f.retry_at = now;
                self.fetch_tick(now);
            }
            return;
        }
        let Some(f) = self.view_change.fetch.take() else {
            return;
        };
        let bytes = f.parts.and_then(Assembly::take).unwrap_or_default();
        let Some(roster) = self.roster_from_bytes(&f.install, &bytes) else {
            // Tampered with or not the Install's list: counted, and fetched again.
            self.counters.count(Drop::AuthFailed);
            self.view_change.fetch = Some(ListFetch {
                parts: None,
                retry_at: now.saturating_add(interval::fetch_retry(&self.config)),
                ..f
            });
            return;
        };
        match f.welcome_key {
            Some(key) => self.finish_welcome(now, f.install, key, roster),
            None => {
                if let Some(fl) = self.view_change.flushing.as_mut() {
                    if fl.install.as_ref().is_some_and(|i| i.view == view) {
                        fl.roster = Some(roster);
                    }
                }
                self.progress_flush(now);
            }
        }
    }

    /// Installs `install` with `key`: new keys, new log, events.
    pub(super) fn install_view(
        &mut self,
        now: Timestamp,
        install: &Install,
        roster: Roster,
        next_seqs: Vec<u64>,
        key: GroupKey,
        coordinated: Option<(Duration, Vec<(MemberId, RemovalReason)>)>,
    ) {
        let Some(rank) = roster.members.rank_of(&self.id) else {
            return;
        };
        let view = View {
            id: install.view,
            members: roster.members.clone(),
            key_epoch: install.key_epoch,
        };
        let keys = match ViewKeys::derive(
            &self.provider,
            &self.config.group,
            &key,
            view.id,
            view.members.len(),
            rank as u16,
            &self.plan,
        ) {
            Ok(k) => k,
            Err(_) => return,
        };
        // Keep the old view for its grace window.
        if let (Some(old_view), Some(old_keys)) = (self.view.take(), self.keys.take()) {
            let log = std::mem::take(&mut self.reliable.log);
            // Looked up by id: a scan of the list per member removed was O(k²) for each
            // member (the side of a cut of 10,000 that removes 8,750).
            // (The list names ranks in the Install's base: for a member whose old view is
            // another, a joiner, it names nobody it knew.)
            let removed: HashMap<MemberId, RemovalReason> = if old_view.id == install.base {
                install
                    .removed
                    .iter()
                    .filter_map(|(r, why)| Some((old_view.members.get(usize::from(*r))?.id, *why)))
                    .collect()
            } else {
                HashMap::new()
            };
            // Survivors keep their relative order and joiners are appended, so a walk
            // along the new list finds almost every survivor in O(1); a member the walk
            // does not meet next is looked up (a removed member, or an order a merge set).
            let mut next_new = 0;
            for m in old_view.members.iter() {
                if view.members.get(next_new).is_some_and(|n| n.id == m.id) {
                    next_new += 1;
                    continue;
                }
                if view.rank_of(&m.id).is_none() {
                    let reason = removed
                        .get(&m.id)
                        .copied()
                        .unwrap_or(RemovalReason::Suspected);
                    self.events.push_back(GroupEvent::Removed {
                        member: m.id,
                        reason,
                    });
                    if reason == RemovalReason::Left {
                        if self.departed.len() >= 4096 {
                            self.departed.clear();
                        }
                        self.departed.insert(m.id);
                    }
                    self.pairs.forget(m.addr);
                    self.remember_departed(m.id, m.addr);
                }
            }
            self.old_views.push(OldView {
                view: old_view,
                keys: old_keys,
                log,
                expires: now.saturating_add(self.config.key_grace),
            });
            while self.old_views.len() > 2 {
                self.old_views.remove(0);
            }
        }
        let rekeyed = self.group_key.as_ref().is_none_or(|k| {
            k.epoch != key.epoch || k.fingerprint(&self.provider) != key.fingerprint(&self.provider)
        });
        if rekeyed {
            self.admission.key_holders.clear();
        }
        // Tokens presented by members now in the view are spent.
        self.admission
            .presented
            .retain(|(m, _)| view.rank_of(m).is_none());
        if self.admission.presented.len() > 1024 {
            self.admission.presented.clear();
        }
        if rank != 0 {
            // Tickets go to leaders; one held by a leader that no longer leads is moot.
            self.heal.held_exchange = None;
            // So are the changes it wanted: its new leader suspects silent members itself,
            // a joiner asks again and a leaving member tells the new leader. Kept, they
            // were applied whenever this member led again, however much later: six live
            // members removed as suspected, and a member let in again under an incarnation
            // it had left behind (tests/chaos_schedule.rs, seed 97).
            self.view_change.change_wanted.clear();
            self.view_change.joiners_wanted.clear();
            self.view_change.joiners_since = None;
        }
        self.record_key(&key);
        self.group_key = Some(key);
        self.rank = rank as u16;
        self.incarnations = roster.incarnations.clone();
        if self
            .roster_bytes
            .as_ref()
            .is_some_and(|(v, _)| *v != view.id)
        {
            self.roster_bytes = None;
        }
        self.keys = Some(keys);
        self.reliable
            .start_view(view.members.len(), &next_seqs, rank, now);
        self.view_change.flushing = None;
        self.view_change.fetch = None;
        self.tree.tree_key = None;
        self.tree.tree_wait = None;
        self.view_change.highest_proposal = Some(
            self.view_change
                .highest_proposal
                .map_or(view.id, |h| h.max(view.id)),
        );
        self.liveness.leader_heard = now;
        self.liveness.next_heartbeat = now;
        // Members in the view are no longer "departed" or known only from the past: the
        // few that joined are checked, not the whole view.
        for j in &install.joined {
            self.departed.remove(&j.member.id);
            self.known.remove(&j.member.id);
        }
        self.view = Some(view.clone());
        self.events.push_back(GroupEvent::View(view.clone()));
        if rekeyed {
            self.last_rekey = now;
            self.events.push_back(GroupEvent::Rekeyed {
                key_epoch: view.key_epoch,
                members: view.members.len(),
                took: coordinated.as_ref().map(|(t, _)| *t),
            });
        }
        if !self.trusts(&view.leader().id) {
            // A coordinator this member does not trust got it into its view (it was trusted
            // when the flush began): leave at once.
            self.go_alone(now);
            return;
        }
        self.submit_pending(now);
        if self.leaving.is_some() && rank != 0 {
            let leader = view.leader().addr;
            self.send_msg(leader, &Msg::Leave);
        } else if self.leaving.is_some() {
            self.view_change
                .change_wanted
                .push((self.id, RemovalReason::Left));
        }
        self.maybe_start_change(now);
    }

    /// A coordinator whose own change leaves it out: it is done if it asked to leave. If it
    /// did not (no path should get here, but one did: tests/chaos_schedule.rs), it is alive
    /// and goes on in a view of its own, which probing merges back, rather than ending
    /// expelled "left" for good with no view and no timer.
    fn leave_or_go_alone(&mut self, now: Timestamp) {
        if self.leaving.is_some() {
            self.leave_now(RemovalReason::Left);
        } else {
            self.drop_component();
            self.found(now);
        }
    }

    /// Whether `install` comes from its coordinator: this member's wrap (for rank
    /// `new_rank` in the new view), which binds the Install's digest under the pair key
    /// shared with the coordinator, in KDC mode and for every one-message Install (an
    /// Install that leaves this member out cannot be checked there); otherwise its Ed25519
    /// signature.
    pub(super) fn install_is_signed(&mut self, install: &Install, new_rank: Option<u16>) -> bool {
        if self.identity.is_none() || wrap_authenticates(install) {
            // The check unwraps this member's key: keep it for the install that follows.
            return match self.unwrap_own(install, new_rank) {
                Some(key) => {
                    self.view_change.unwrapped = Some((install.view, key));
                    true
                }
                None => false,
            };
        }
        install.view.coordinator.0.verify(
            &self.provider,
            &install.signed_bytes(&self.config.group),
            &install.signature,
        )
    }

    /// What every wrap binds in KDC mode, and with identity keys in a one-message Install
    /// (which is not signed): SHA-256 of what an identity-key coordinator signs (which holds
    /// the member list's digest). Empty for a signed Install (the signature covers it).
    pub(super) fn install_bind(&self, install: &Install) -> Vec<u8> {
        if self.identity.is_some() && !wrap_authenticates(install) {
            return Vec::new();
        }
        self.provider
            .sha256
            .sha256(&[&install.signed_bytes(&self.config.group)])
            .to_vec()
    }

    /// This member's key from a one-message Install's wraps, at `rank` in the new view.
    pub(super) fn unwrap_own(&self, install: &Install, rank: Option<u16>) -> Option<GroupKey> {
        let KeyDelivery::Wrapped(wraps) = &install.key else {
            return self.lkh_open(install, rank?).map(|(key, _)| key);
        };
        let my_rank = rank?;
        let (_, wrap) = wraps.iter().find(|(r, _)| *r == my_rank)?;
        let pk = self.pairs.pair_key(&install.view.coordinator)?;
        keys::unwrap(
            pk,
            &install.view,
            my_rank,
            &self.id,
            install.key_epoch,
            wrap,
            &self.install_bind(install),
        )
    }

    /// Tells the view's coordinator (under the new view's keys) that it is installed here.
    pub(super) fn ack_install(&mut self, install: &Install, members: &Members) {
        let coordinator = members
            .rank_of(&install.view.coordinator)
            .map(|r| members[r].addr);
        if let Some(addr) = coordinator {
            self.send_msg(addr, &Msg::InstallAck);
        }
    }

    /// Tells the current view's coordinator again that it is installed here (its Install
    /// came again, in parts, under the old view's keys: the first ack was lost).
    pub(super) fn ack_current_view(&mut self) {
        let coordinator = self
            .view
            .as_ref()
            .and_then(|v| v.rank_of(&v.id.coordinator).map(|r| v.members[r].addr));
        if let Some(addr) = coordinator {
            self.send_msg(addr, &Msg::InstallAck);
        }
    }

    /// Forgets the current component (view, keys, pair channels, logs, any view change) and
    /// takes a new incarnation, keeping the undelivered reliable messages for the next view.
    pub(super) fn drop_component(&mut self) {
        self.forget_pairs();
        self.view = None;
        self.keys = None;
        self.reliable.leave_view();
        self.view_change.flushing = None;
        self.view_change.coordinator = None;
        self.view_change.announce = None;
        self.view_change.fetch = None;
        self.view_change.assembly = None;
        self.view_change.tree = None;
        self.old_views.clear();
        self.incarnation = self.rng.next_u64();
    }

    /// Leaves this component (after its final flush) to join the one led at `target`.
    pub(super) fn dissolve(&mut self, now: Timestamp, target: SocketAddr) {
        self.drop_component();
        let mut contacts = vec![target];
        contacts.extend(self.contacts.iter().copied().filter(|c| *c != target));
        self.joining = Some(Joining::new(contacts, now));
        self.drive_join(now);
    }
}

/// Whether `list` is `base` without the positions in `left` (strictly ascending, each
/// below `base.len()`, as a decoded Install's are), followed by `joined`: the survivors
/// compared a run at a time.
fn is_change_of<T: PartialEq + Copy>(
    base: &[T],
    left: &[u16],
    mut joined: impl Iterator<Item = T>,
    list: &[T],
) -> bool {
    let (mut from, mut at) = (0usize, 0usize);
    let ends = left.iter().map(|r| usize::from(*r)).chain([base.len()]);
    for end in ends {
        let Some(run) = base.get(from..end) else {
            return false;
        };
        if list.get(at..at + run.len()) != Some(run) {
            return false;
        }
        at += run.len();
        from = end + 1;
    }
    // Every run matched a slice of `list`, so `at` is within it.
    let rest = &list[at..];
    let mut n = 0;
    for (m, j) in rest.iter().zip(joined.by_ref()) {
        if *m != j {
            return false;
        }
        n += 1;
    }
    n == rest.len() && joined.next().is_none()
}

/// Whether `install`'s change can apply to `base`: ranks that left are in it, and the
/// count adds up.
fn delta_fits(base: &View, install: &Install) -> bool {
    let n = base.members.len();
    install.left.last().is_none_or(|r| usize::from(*r) < n)
        && n - install.left.len().min(n) + install.joined.len() == usize::from(install.count)
}

/// Incarnation lists by roster digest.
type IncarnationTable = HashMap<[u8; 32], Weak<[u64]>>;

/// Incarnation lists built in this process, by roster digest (see `Members::intern`).
static INCARNATIONS: Mutex<Option<IncarnationTable>> = Mutex::new(None);

/// The incarnations this process holds under `key`, if any.
fn lookup_incarnations(key: &[u8; 32]) -> Option<Arc<[u64]>> {
    let guard = INCARNATIONS.lock().unwrap_or_else(|e| e.into_inner());
    guard.as_ref()?.get(key).and_then(Weak::upgrade)
}

/// `incarnations`, shared with the same list under `key` if this process holds it already
/// (the caller checked that `key` names this content), else remembered under `key`.
fn intern_incarnations(key: &[u8; 32], incarnations: Vec<u64>) -> Arc<[u64]> {
    let mut guard = INCARNATIONS.lock().unwrap_or_else(|e| e.into_inner());
    let map = guard.get_or_insert_with(HashMap::new);
    if let Some(held) = map.get(key).and_then(Weak::upgrade) {
        if held[..] == incarnations[..] {
            return held;
        }
    }
    let arc: Arc<[u64]> = incarnations.into();
    if map.len() >= 64 {
        map.retain(|_, w| w.strong_count() > 0);
    }
    map.insert(*key, Arc::downgrade(&arc));
    arc
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddrV4};

    fn member(i: u8) -> Member {
        Member {
            id: MemberId::from_bytes([i; 32]),
            addr: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7000 + u16::from(i))),
        }
    }

    /// `is_change_of` against the plain definition (filter the survivors, chain the
    /// joiners, compare), on random bases, changes and lists: the right list, and lists
    /// off by one element, one too many or one too few.
    #[test]
    fn a_change_compared_by_runs_agrees_with_the_plain_definition() {
        use rand_core::{RngCore, SeedableRng};
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(7);
        let plain = |base: &[u64], left: &[u16], joined: &[u64], list: &[u64]| {
            let want: Vec<u64> = (0..base.len())
                .filter(|r| left.binary_search(&(*r as u16)).is_err())
                .map(|r| base[r])
                .chain(joined.iter().copied())
                .collect();
            want == list
        };
        let mut agreed = [0usize; 2];
        for _ in 0..2000 {
            let n = (rng.next_u32() % 12) as usize;
            let base: Vec<u64> = (0..n).map(|_| u64::from(rng.next_u32() % 4)).collect();
            let left: Vec<u16> = (0..n as u16).filter(|_| rng.next_u32() % 3 == 0).collect();
            let joined: Vec<u64> = (0..rng.next_u32() % 4)
                .map(|_| u64::from(rng.next_u32() % 4))
                .collect();
            let mut list: Vec<u64> = (0..n)
                .filter(|r| left.binary_search(&(*r as u16)).is_err())
                .map(|r| base[r])
                .chain(joined.iter().copied())
                .collect();
            match rng.next_u32() % 4 {
                0 => {}
                1 if !list.is_empty() => {
                    let i = rng.next_u32() as usize % list.len();
                    list[i] += 1 + u64::from(rng.next_u32() % 3);
                }
                2 => list.push(u64::from(rng.next_u32() % 4)),
                _ => {
                    list.pop();
                }
            }
            let expected = plain(&base, &left, &joined, &list);
            assert_eq!(
                is_change_of(&base, &left, joined.iter().copied(), &list),
                expected,
                "base {base:?} left {left:?} joined {joined:?} list {list:?}"
            );
            agreed[usize::from(expected)] += 1;
        }
        assert!(
            agreed[0] > 100 && agreed[1] > 100,
            "both outcomes were tried: {agreed:?}"
        );
    }

    #[test]
    fn parts_that_came_in_any_order_join_in_index_order_once_all_are_in() {
        let view = ViewId {
            coordinator: MemberId::from_bytes([1; 32]),
            seq: 3,
        };
        let mut a = Assembly::new(view, PART_INSTALL, 3);
        assert_eq!(a.add(2, 3, b"ef".to_vec()), Ok(()));
        assert_eq!(a.add(0, 3, b"abc".to_vec()), Ok(()));
        assert!(!a.complete());
        assert_eq!(a.first_missing(), Some(1));
        assert_eq!(a.add(1, 4, b"d".to_vec()), Err(()), "another total");
        assert_eq!(a.add(1, 3, b"d".to_vec()), Ok(()));
        assert_eq!(a.add(1, 3, b"x".to_vec()), Ok(()), "a copy is ignored");
        assert_eq!(a.take(), Some(b"abcdef".to_vec()));
        let mut b = Assembly::new(view, PART_INSTALL, 2);
        assert_eq!(b.add(0, 2, b"ab".to_vec()), Ok(()));
        assert_eq!(b.take(), None, "incomplete");
    }

    #[test]
    fn unacked_members_leave_by_rank_and_only_the_member_at_that_rank() {
        let list: Vec<Member> = (0..6).map(member).collect();
        let members = Members::new(list.clone());
        // Member 0 is the coordinator; ranks 4 and 5 are joiners.
        let mut u = Unacked::new(&members, &list[0].id, |r, _| r >= 4);
        assert_eq!(u.iter().count(), 5);
        assert!(u
            .iter()
            .all(|(m, j)| j == (m.id == list[4].id || m.id == list[5].id)));
        // A rank that holds another member, a rank out of range and the coordinator's own
        // rank change nothing.
        u.acked_at(2, &list[3].id);
        u.acked_at(17, &list[3].id);
        u.acked_at(0, &list[0].id);
        assert_eq!(u.iter().count(), 5);
        for r in [1, 2, 3, 4] {
            u.acked_at(r, &list[r].id);
            // Twice: counted once.
            u.acked_at(r, &list[r].id);
            assert!(!u.is_empty());
        }
        let left: Vec<(usize, Member)> = u.ranked().map(|(r, (m, _))| (r, m)).collect();
        assert_eq!(left, vec![(5, list[5])]);
        u.acked_at(5, &list[5].id);
        assert!(u.is_empty());
        assert_eq!(u.iter().count(), 0);
    }
}
