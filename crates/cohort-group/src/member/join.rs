//! Joining and admission: asking contacts until a Welcome arrives or founding the group
//! alone, and at the leader, deciding which joiners may come in (they hold the key, or in
//! KDC mode they presented a valid token: LSGC messages 4 and 5).
//!
//! Owns: `Joining` (while this member joins) and `Admission` (key holders, grants,
//! presented tokens). It may not change the view: an admitted joiner is handed to the view
//! change (`view_change.joiners_wanted`).

use super::flush::MAX_WAITING_JOINERS;
use super::install::{install_copy_for, wrap_authenticates, ListFetch, Roster};
use super::output::Destination;
use super::{GroupMember, MAX_VIEW_MEMBERS};
use crate::event::{Drop, RemovalReason};
use crate::exchange::{self};
use crate::id::{Member, MemberId, Members, View, ViewId};
use crate::keys::{GroupKey, GROUP_KEY_LEN};
use crate::wire::{Install, KeyDelivery, PairMsg, PART_GRANT};
use cohort_core::Timestamp;
use cohort_crypto::{ct_eq, Secret};
use rand_core::RngCore;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use zeroize::Zeroizing;

/// Who may be let in: joiners that proved they hold the key, and KDC-mode tokens (LSGC messages 4 and 5).
#[derive(Default)]
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct Admission {
    /// Joiners that proved they hold the current group key: (member, incarnation).
    pub(super) key_holders: BTreeSet<(MemberId, u64)>,
    /// KDC mode, at the leader: joiners granted a token (LSGC message 4), by principal:
    /// where, their next message number and incarnation.
    pub(super) granted: BTreeMap<MemberId, (SocketAddr, u64, u64)>,
    /// KDC mode: joiners that presented a valid token (message 5): (member, incarnation).
    pub(super) presented: BTreeSet<(MemberId, u64)>,
    /// KDC mode: valid tokens presented to this member.
    pub(super) tokens_checked: u64,
    /// KDC mode: the gossip Presents this member took (view, joiner, the token's nonce),
    /// so that a copy of one is dropped as replayed; at most [`MAX_PRESENTS_SEEN`].
    pub(super) presents_seen: BTreeSet<(ViewId, MemberId, [u8; 12])>,
}

/// KDC mode: how many members besides the leader a joiner presents its token to (LSGC
/// message 5, the gossip `Present`): the leader names its first successors in the Grant
/// (ranks 1 and 2), and a joiner sends to at most this many of the addresses a Grant lists.
/// LSGC sends message 5 to the whole group; here the leader alone decides (it gets the
/// token over the pair channel) and the members' check only counts, so sending it to every
/// member cost n²/2 datagrams over a cold start and bought nothing (crate README, "KDC
/// mode").
pub const PRESENT_WITNESSES: usize = 2;

/// KDC mode: how many gossip Presents a member remembers to drop copies of. Tokens are
/// valid for the current view and the one before, so entries of older views are forgotten
/// first; a Present that finds the set full of the two latest views' tokens is dropped
/// (`unexpected`): only members of the view can make valid tokens.
pub(super) const MAX_PRESENTS_SEEN: usize = 4096;

/// Joining: asking contacts until a Welcome arrives.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct Joining {
    pub(super) contacts: Vec<SocketAddr>,
    pub(super) started: Timestamp,
    pub(super) next_try: Timestamp,
    /// Peers that said they are not in a group, by id.
    pub(super) not_in_group: BTreeSet<MemberId>,
    /// Whether anyone answered at all.
    pub(super) answered: bool,
    /// Contacts that answered since the last attempt; the others' pair channels are
    /// dropped before the next one (the far end may have forgotten them).
    pub(super) replied: BTreeSet<SocketAddr>,
    pub(super) attempts: u32,
    /// A member in a group pointed at its leader: a group exists, do not found another.
    pub(super) redirected: bool,
    /// When the leader last said this joiner waits for a later batch (a bulk join): the
    /// joiner does not give up on the group while it hears that.
    pub(super) queued_at: Option<Timestamp>,
}

impl Joining {
    /// Asking `contacts`, starting now.
    pub(super) fn new(contacts: Vec<SocketAddr>, now: Timestamp) -> Self {
        Joining {
            contacts,
            started: now,
            next_try: now,
            not_in_group: BTreeSet::new(),
            answered: false,
            replied: BTreeSet::new(),
            attempts: 0,
            redirected: false,
            queued_at: None,
        }
    }
}

impl GroupMember {
    pub(super) fn found(&mut self, now: Timestamp) {
        self.joining = None;
        let key = self.fresh_key(1);
        let id = self.next_proposal();
        let members = Members::from(vec![Member {
            id: self.id,
            addr: self.addr,
        }]);
        let next_seq = self
            .reliable
            .pending
            .front()
            .map_or(self.reliable.next_reliable, |p| p.seq);
        // Never sent: the founder installs it itself.
        let install = Install {
            view: id,
            base: id,
            count: 1,
            left: Vec::new(),
            joined: Vec::new(),
            digest: [0; 32],
            next_seqs: vec![next_seq],
            key_epoch: 1,
            final_order: 0,
            key: KeyDelivery::Same,
            merge_into: None,
            removed: Vec::new(),
            signature: Vec::new(),
        };
        let roster = Roster {
            members,
            incarnations: vec![self.incarnation].into(),
        };
        self.lkh_found(id, &key);
        self.install_view(now, &install, roster, vec![next_seq], key, None);
    }

    pub(super) fn drive_join(&mut self, now: Timestamp) {
        if self.view_change.fetch.is_some() {
            // Welcomed: fetching the view's list; no new join requests meanwhile.
            self.fetch_tick(now);
            let retry = self.view_change.fetch.as_ref().map(|f| f.retry_at);
            if let (Some(j), Some(t)) = (self.joining.as_mut(), retry) {
                j.next_try = t;
                return;
            }
        }
        let Some(j) = self.joining.as_mut() else {
            return;
        };
        if now < j.next_try {
            return;
        }
        let waited = now.saturating_duration_since(j.started);
        let waited_queued = now.saturating_duration_since(j.queued_at.unwrap_or(j.started));
        let lowest = j.not_in_group.iter().all(|other| self.id < *other);
        // Founding needs answers from outside any group; a redirect means a group exists.
        let everyone_out =
            j.answered && !j.redirected && lowest && waited >= self.config.suspect_timeout;
        let nobody = !j.answered && waited >= self.config.suspect_timeout * 3;
        // Redirected to a leader that never lets us in (it or we do not trust the other,
        // which st-trust allows between members of one component): go on alone.
        let refused = waited_queued >= self.config.suspect_timeout * 5;
        if everyone_out || nobody || refused {
            self.found(now);
            return;
        }
        // Patient retries: a joiner told to wait for a later batch asks again less often,
        // with jitter, so that thousands starting at once do not ask in step. (Others keep
        // the plain flush timeout.)
        let ft = self.config.flush_timeout;
        let jitter = |rng: &mut rand_chacha::ChaCha20Rng, span: std::time::Duration| {
            let ms = (span.as_millis() as u64).max(1);
            std::time::Duration::from_millis(rng.next_u64() % ms)
        };
        let wait = if j.queued_at.is_some() {
            ft * 2 + jitter(&mut self.rng, ft / 2)
        } else if !j.answered && j.attempts >= 1 {
            // Nobody answered yet (a leader swamped by a cold start drops pair handshakes
            // beyond its half-open limit): spread the next tries over a flush timeout.
            ft + jitter(&mut self.rng, ft)
        } else {
            ft
        };
        let Some(j) = self.joining.as_mut() else {
            return;
        };
        j.next_try = now.saturating_add(wait);
        j.attempts += 1;
        let stale: Vec<SocketAddr> = if j.attempts > 1 {
            j.contacts
                .iter()
                .copied()
                .filter(|c| !j.replied.contains(c))
                .collect()
        } else {
            Vec::new()
        };
        j.replied.clear();
        let contacts = j.contacts.clone();
        for c in stale {
            self.pairs.forget(c);
        }
        // Own messages still pending (sent while the component dissolved) go first in the
        // new view.
        let next_seq = self
            .reliable
            .pending
            .front()
            .map_or(self.reliable.next_reliable, |p| p.seq);
        let key_proof = self.group_key.as_ref().map(|k| {
            exchange::merge_proof(
                &self.provider,
                &self.config.group,
                k,
                &self.id,
                self.incarnation,
            )
        });
        let msg = PairMsg::JoinRequest {
            group: self.config.group.clone(),
            incarnation: self.incarnation,
            next_seq,
            key_proof,
        };
        for c in contacts {
            self.send_pair(now, c, None, &msg);
        }
    }

    pub(super) fn on_join_request(
        &mut self,
        now: Timestamp,
        peer: MemberId,
        addr: SocketAddr,
        incarnation: u64,
        next_seq: u64,
        key_proof: Option<[u8; 16]>,
    ) {
        if !self.trusts(&peer) {
            self.counters.count(Drop::Untrusted);
            return;
        }
        let Some(view) = self.view.clone() else {
            if self.joining.is_some() {
                if let Some(j) = self.joining.as_mut() {
                    j.answered = true;
                    if !j.contacts.contains(&addr) {
                        j.contacts.push(addr);
                    }
                }
                self.send_pair(now, addr, Some(peer), &PairMsg::NotInGroup);
            }
            return;
        };
        if !self.is_leader() {
            let leader = view.leader().addr;
            self.send_pair(now, addr, Some(peer), &PairMsg::Redirect { leader });
            return;
        }
        if view.members.len() + self.view_change.joiners_wanted.len() >= MAX_VIEW_MEMBERS {
            self.counters.count(Drop::Unexpected); // full: see MAX_VIEW_MEMBERS
            return;
        }
        // Already welcomed into the current view at this address: the Welcome was lost.
        if let Some(a) = self.view_change.announce.as_ref() {
            if a.unacked
                .iter()
                .any(|(m, j)| j && m.id == peer && m.addr == addr)
            {
                let rank = a.members.rank_of(&peer).map(|r| r as u16);
                let copy = install_copy_for(&a.install, rank);
                let key = a.welcome_key.clone().unwrap_or_default();
                self.send_welcome(now, &Member { id: peer, addr }, copy, &key);
                return;
            }
        }
        if let Some(r) = view.rank_of(&peer) {
            if self.incarnations.get(r) == Some(&incarnation) {
                // A late copy of a request already granted.
                return;
            }
            // A member asking to join again restarted: its old incarnation leaves the view
            // and the new one joins.
            if !self
                .view_change
                .change_wanted
                .iter()
                .any(|(m, _)| *m == peer)
            {
                self.view_change
                    .change_wanted
                    .push((peer, RemovalReason::Suspected));
            }
        }
        if self.view_change.coordinator.as_ref().is_some_and(|c| {
            c.joiners
                .iter()
                .any(|(m, _, inc)| m.id == peer && *inc == incarnation)
        }) {
            return; // being let in right now
        }
        // A member of a component that dissolved into this one after an Exchange holds the
        // key already: it comes in without a rekey.
        if let (Some(proof), Some(key)) = (key_proof, self.group_key.as_ref()) {
            let want =
                exchange::merge_proof(&self.provider, &self.config.group, key, &peer, incarnation);
            if ct_eq(&want, &proof) {
                self.admission.key_holders.insert((peer, incarnation));
            }
        }
        if self.identity.is_none() && !self.admission.presented.contains(&(peer, incarnation)) {
            // KDC mode: LSGC message 4 first. The joiner presents the token (message 5)
            // and is let in when it does.
            self.grant(now, &view, peer, addr, next_seq, incarnation);
            return;
        }
        let waiting = &mut self.view_change.joiners_wanted;
        let full = waiting.len() >= MAX_WAITING_JOINERS;
        match waiting.iter_mut().find(|(m, _, _)| m.id == peer) {
            Some(w) => *w = (Member { id: peer, addr }, next_seq, incarnation),
            None if full => {
                // Bulk join: the queue is full; the joiner is told to wait and asks again
                // later (it must not give up on the group and found its own).
                self.counters.count(Drop::Unexpected);
                let leader = self.addr;
                self.send_pair(now, addr, Some(peer), &PairMsg::Redirect { leader });
                return;
            }
            None => {
                if waiting.is_empty() {
                    self.view_change.joiners_since = Some(now);
                }
                self.view_change.joiners_wanted.push((
                    Member { id: peer, addr },
                    next_seq,
                    incarnation,
                ));
            }
        }
        self.maybe_start_change(now);
        // Not let in by a change that started now: tell it to wait for a later batch.
        let admitted = self
            .view_change
            .coordinator
            .as_ref()
            .is_some_and(|c| c.joiners.iter().any(|(m, _, _)| m.id == peer));
        if !admitted {
            let leader = self.addr;
            self.send_pair(now, addr, Some(peer), &PairMsg::Redirect { leader });
        }
    }

    /// A contact points at the leader; the leader pointing at itself means "you wait for
    /// a later batch".
    pub(super) fn on_redirect(&mut self, now: Timestamp, addr: SocketAddr, leader: SocketAddr) {
        if let Some(j) = self.joining.as_mut() {
            j.answered = true;
            j.redirected = true;
            j.replied.insert(addr);
            if leader == addr {
                j.queued_at = Some(now);
            }
            if !j.contacts.contains(&leader) && leader != self.addr {
                j.contacts.push(leader);
                j.next_try = now;
            }
        }
    }

    /// A Welcome from the coordinator of the view that lets this member in: the change and
    /// the key; the member list rides along when short, else it is fetched in parts.
    pub(super) fn on_welcome(
        &mut self,
        now: Timestamp,
        peer: MemberId,
        addr: SocketAddr,
        install: Box<Install>,
        key: Zeroizing<Vec<u8>>,
        roster: Vec<u8>,
    ) {
        if self.joining.is_none() {
            return; // not asking (any more): a late Welcome, or one after leave()
        }
        if install.view.coordinator != peer || key.len() != GROUP_KEY_LEN {
            self.counters.count(Drop::Unexpected);
            return;
        }
        if self
            .view_change
            .fetch
            .as_ref()
            .is_some_and(|f| f.install.view == install.view)
        {
            return; // a resent Welcome: the fetch is under way
        }
        // The pair channel authenticated the coordinator; with identity keys an Install
        // that is not one-message (whose copies are not signed) carries its signature too.
        if self.identity.is_some()
            && !wrap_authenticates(&install)
            && !self.install_is_signed(&install, None)
        {
            self.counters.count(Drop::AuthFailed);
            return;
        }
        let mine = install.joined.iter().find(|j| j.member.id == self.id);
        if mine.map(|j| j.incarnation) != Some(self.incarnation) {
            // Not for us, or for an earlier incarnation of this member.
            self.counters.count(Drop::Unexpected);
            return;
        }
        if !roster.is_empty() {
            match self.roster_from_bytes(&install, &roster) {
                Some(r) => {
                    self.finish_welcome(now, install, key, r);
                    return;
                }
                None => self.counters.count(Drop::AuthFailed),
            }
        }
        self.view_change.fetch = Some(ListFetch {
            install,
            welcome_key: Some(key),
            coordinator: (peer, addr),
            parts: None,
            retry_at: now,
            tries: 0,
        });
        self.fetch_tick(now);
    }

    /// The joiner holds its Welcome's list: installs the view and confirms.
    pub(super) fn finish_welcome(
        &mut self,
        now: Timestamp,
        install: Box<Install>,
        key: Zeroizing<Vec<u8>>,
        roster: Roster,
    ) {
        let Some(my_rank) = roster.members.rank_of(&self.id) else {
            self.counters.count(Drop::Unexpected);
            return;
        };
        if roster.incarnations.get(my_rank) != Some(&self.incarnation) {
            self.counters.count(Drop::Unexpected);
            return;
        }
        let own = install
            .joined
            .iter()
            .find(|j| j.member.id == self.id)
            .map_or(self.reliable.next_reliable, |j| j.next_seq);
        if matches!(install.key, KeyDelivery::Lkh(_)) {
            // Our path must open and end in the Welcome's key; else wait for another copy.
            let opens = self
                .lkh_open(&install, my_rank as u16)
                .is_some_and(|(k, _)| ct_eq(k.expose(), &key));
            if !opens || self.lkh_install(&install, my_rank as u16).is_none() {
                self.counters.count(Drop::AuthFailed);
                return;
            }
        }
        self.joining = None;
        self.view_change.fetch = None;
        let next_seqs = self.next_seqs_for(&install, my_rank, own);
        let key = GroupKey::new(install.key_epoch, Secret::from_slice(&key));
        let members = roster.members.clone();
        self.install_view(now, &install, roster, next_seqs, key, None);
        self.ack_install(&install, &members);
    }

    /// KDC mode, LSGC message 4: the view id and the joiner's token, under σ (the pair
    /// channel), with the members' addresses for message 5.
    pub(super) fn grant(
        &mut self,
        now: Timestamp,
        view: &View,
        peer: MemberId,
        addr: SocketAddr,
        next_seq: u64,
        incarnation: u64,
    ) {
        let mut nonce = [0u8; 12];
        self.rng.fill_bytes(&mut nonce);
        let Some(token) = self.keys.as_ref().and_then(|k| k.seal_token(nonce, &peer)) else {
            return;
        };
        if self.admission.granted.len() >= 1024 && !self.admission.granted.contains_key(&peer) {
            self.counters.count(Drop::Unexpected);
            return;
        }
        self.admission
            .granted
            .insert(peer, (addr, next_seq, incarnation));
        // The witnesses of message 5: the leader's first successors, not every member
        // (that made a cold start cost n²/2 Presents, and a Grant grow with the view).
        let witnesses = view
            .members
            .iter()
            .map(|m| m.addr)
            .filter(|a| *a != self.addr && *a != addr)
            .take(PRESENT_WITNESSES)
            .collect();
        let grant = PairMsg::Grant {
            view: view.id,
            token,
            members: witnesses,
        };
        // A Grant longer than one pair record goes in parts (`PART_GRANT`), as a Welcome
        // does. With the witnesses bounded this one never is; a joiner still takes parts
        // from a leader of an earlier build, whose Grants listed every member.
        self.send_pair_in_parts(now, addr, peer, view.id, PART_GRANT, &grant);
    }

    /// Whether `token` is `member`'s for `view`, the current view or the one before.
    pub(super) fn token_valid(&self, member: &MemberId, view: ViewId, token: &[u8]) -> bool {
        let current = self
            .keys
            .as_ref()
            .filter(|k| k.view == view)
            .is_some_and(|k| k.check_token(token, member));
        current
            || self
                .old_views
                .iter()
                .any(|o| o.keys.view == view && o.keys.check_token(token, member))
    }

    /// KDC mode, LSGC message 5 reaching the leader: a valid token lets the joiner in.
    pub(super) fn on_present(
        &mut self,
        now: Timestamp,
        peer: MemberId,
        view: ViewId,
        token: &[u8],
    ) {
        if self.identity.is_some() || !self.is_leader() {
            self.counters.count(Drop::Unexpected);
            return;
        }
        let Some((addr, next_seq, incarnation)) = self.admission.granted.get(&peer).copied() else {
            self.counters.count(Drop::Unexpected);
            return;
        };
        if !self.token_valid(&peer, view, token) {
            self.counters.count(Drop::AuthFailed);
            return;
        }
        self.admission.granted.remove(&peer);
        self.admission.presented.insert((peer, incarnation));
        self.on_join_request(now, peer, addr, incarnation, next_seq, None);
    }

    /// KDC mode, LSGC message 5 reaching a member as gossip: it checks the token under the
    /// view's key (only members of the view hold it) and counts it; a copy of one it took
    /// is `replayed`, a token that fails `auth_failed`. It decides nothing: the leader
    /// admits on the copy it gets over the pair channel.
    pub(super) fn on_gossip_present(&mut self, member: MemberId, view: ViewId, token: &[u8]) {
        if self.identity.is_some() {
            self.counters.count(Drop::Unexpected);
            return;
        }
        if !self.token_valid(&member, view, token) {
            self.counters.count(Drop::AuthFailed);
            return;
        }
        // A valid token is 97 bytes, its nonce first.
        let Some(nonce) = token.get(..12).and_then(|n| <[u8; 12]>::try_from(n).ok()) else {
            self.counters.count(Drop::Malformed);
            return;
        };
        let seen = &mut self.admission.presents_seen;
        if seen.contains(&(view, member, nonce)) {
            self.counters.count(Drop::Replayed);
            return;
        }
        if seen.len() >= MAX_PRESENTS_SEEN {
            // Forget the tokens of views no longer valid (neither current nor previous).
            let live: BTreeSet<ViewId> = self
                .keys
                .iter()
                .map(|k| k.view)
                .chain(self.old_views.iter().map(|o| o.keys.view))
                .collect();
            seen.retain(|(v, _, _)| live.contains(v));
            if seen.len() >= MAX_PRESENTS_SEEN {
                self.counters.count(Drop::Unexpected);
                return;
            }
        }
        seen.insert((view, member, nonce));
        self.admission.tokens_checked += 1;
    }

    /// KDC mode, at the joiner: message 4 arrived; present the token to the leader over the
    /// pair channel and, as gossip, to at most [`PRESENT_WITNESSES`] other members the Grant
    /// lists (message 5).
    pub(super) fn on_grant(
        &mut self,
        now: Timestamp,
        peer: MemberId,
        addr: SocketAddr,
        view: ViewId,
        token: Vec<u8>,
        members: Vec<SocketAddr>,
    ) {
        if self.identity.is_some() || self.joining.is_none() {
            self.counters.count(Drop::Unexpected);
            return;
        }
        let present = exchange::encode_present(&self.config.group, &self.id, &view, &token);
        // At most PRESENT_WITNESSES, whatever the Grant lists: a leader of an earlier build
        // listed every member.
        let witnesses = members
            .into_iter()
            .filter(|m| *m != addr && *m != self.addr)
            .take(PRESENT_WITNESSES);
        self.out
            .push_copies(witnesses.map(Destination::Member), &present);
        self.send_pair(now, addr, Some(peer), &PairMsg::Present { view, token });
    }
}

#[cfg(test)]
mod tests {
    use super::super::install::split_parts;
    use super::*;
    use crate::config::{AuthMode, GroupConfig};
    use crate::event::Drop;
    use crate::kdc_pair::KdcCredentials;
    use cohort_crypto::CryptoProvider;
    use cohort_kdc::{PrincipalKey, PrincipalName};
    use std::net::{IpAddr, Ipv4Addr};

    fn addr(i: u8) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, i)), 7000)
    }

    fn principal(name: &str) -> MemberId {
        MemberId::from_principal(&PrincipalName::new(name).expect("name"))
    }

    /// A KDC-mode member at `addr(1)`, joining through the leader at `addr(2)`.
    fn joiner() -> GroupMember {
        let mut config = GroupConfig::new("grant-parts", Vec::new());
        config.auth = AuthMode::Kdc;
        config.trust_any_registered = true;
        let credentials = KdcCredentials {
            name: PrincipalName::new("j").expect("name"),
            key: PrincipalKey::from_bytes([7; 32]),
            kdc: addr(50),
        };
        let provider = CryptoProvider::default_provider();
        let mut m =
            GroupMember::new(provider, credentials, addr(1), config, [9; 32]).expect("member");
        m.start(Timestamp::ZERO, &[addr(2)]);
        drain(&mut m);
        m
    }

    /// How many group-channel datagrams `m` queued (gossip Presents go there), dropping them.
    fn drain(m: &mut GroupMember) -> usize {
        let n = m.out.len();
        m.out.clear();
        n
    }

    fn view(seq: u64) -> ViewId {
        ViewId {
            seq,
            coordinator: principal("l"),
        }
    }

    /// A Grant for `view` listing the leader, the joiner and 40 other members.
    fn grant_bytes(view: ViewId) -> Vec<u8> {
        let mut members = vec![addr(2), addr(1)];
        members.extend((10..50).map(addr));
        let mut out = Vec::new();
        PairMsg::Grant {
            view,
            token: vec![0x66; 97],
            members,
        }
        .encode(&mut out);
        out
    }

    /// Feeds `bytes` to `m` as `PART_GRANT` parts of 64 bytes labelled `view`, from the
    /// leader; `total` overrides the count each part claims.
    fn feed(m: &mut GroupMember, view: ViewId, bytes: &[u8], total: Option<u16>) {
        let parts = split_parts(bytes, 64);
        let total = total.unwrap_or(parts.len() as u16);
        for (i, p) in parts.iter().enumerate() {
            let leader = principal("l");
            m.on_part(
                Timestamp::ZERO,
                leader,
                addr(2),
                view,
                PART_GRANT,
                i as u16,
                total,
                p.to_vec(),
            );
        }
    }

    #[test]
    fn a_grant_in_parts_is_taken_only_whole_and_bad_parts_are_dropped_and_counted() {
        let mut m = joiner();
        let bytes = grant_bytes(view(5));
        let parts = split_parts(&bytes, 64).len();
        assert!(parts > 4, "the Grant must need several parts");

        // All but the last part: nothing happens yet.
        let leader = principal("l");
        for (i, p) in split_parts(&bytes, 64).iter().enumerate().take(parts - 1) {
            m.on_part(
                Timestamp::ZERO,
                leader,
                addr(2),
                view(5),
                PART_GRANT,
                i as u16,
                parts as u16,
                p.to_vec(),
            );
        }
        assert_eq!(drain(&mut m), 0, "no Present before the last part");
        // A part that claims another count breaks the assembly: counted, nothing taken.
        let malformed = m.counters.get(Drop::Malformed);
        let last = split_parts(&bytes, 64)[parts - 1].to_vec();
        m.on_part(
            Timestamp::ZERO,
            leader,
            addr(2),
            view(5),
            PART_GRANT,
            (parts - 1) as u16,
            parts as u16 + 1,
            last,
        );
        assert_eq!(m.counters.get(Drop::Malformed), malformed + 1);
        assert_eq!(drain(&mut m), 0);

        // A truncated Grant (its first half, sent as if whole) does not decode: counted.
        feed(&mut m, view(5), &bytes[..bytes.len() / 2], None);
        assert_eq!(m.counters.get(Drop::Malformed), malformed + 2);
        assert_eq!(drain(&mut m), 0);

        // Parts labelled with another view than the Grant inside: counted.
        feed(&mut m, view(6), &bytes, None);
        assert_eq!(m.counters.get(Drop::Malformed), malformed + 3);
        assert_eq!(drain(&mut m), 0);

        // The whole Grant (as a leader of an earlier build sent it, listing every member):
        // the joiner presents its token as gossip to PRESENT_WITNESSES of the 40 members
        // listed besides the leader (which gets it over the pair channel) and itself.
        feed(&mut m, view(5), &bytes, None);
        assert_eq!(m.counters.get(Drop::Malformed), malformed + 3);
        assert_eq!(drain(&mut m), PRESENT_WITNESSES);

        // Once it is not joining, a Grant part is unexpected.
        m.joining = None;
        let unexpected = m.counters.get(Drop::Unexpected);
        feed(&mut m, view(5), &bytes, None);
        assert!(m.counters.get(Drop::Unexpected) > unexpected);
        assert_eq!(drain(&mut m), 0);
    }
}
