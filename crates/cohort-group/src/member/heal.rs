//! Healing partitions: the leader gossips its Id to known members of other components;
//! when two leaders find each other they run the Exchange (a ticket carries one
//! component's key to the other) and the smaller component merges into the larger.
//!
//! Owns: `Heal` (gossip timers and budget, local Ids, answered addresses, the held ticket
//! key, exchanged key fingerprints). It may not install a view: a merge is a view change
//! asked of `flush.rs`.

use super::flush::Change;
use super::output::Destination;
use super::GroupMember;
use crate::event::{Drop, GroupEvent};
use crate::exchange::{self, Gossip, LocalId, Parsed};
use crate::id::MemberId;
use crate::keys::{GroupKey, GROUP_KEY_LEN};
use crate::wire::PairMsg;
use cohort_core::Timestamp;
use cohort_crypto::{ct_eq, Secret};
use rand_core::RngCore;
use std::collections::HashMap;
use std::net::SocketAddr;
use zeroize::Zeroizing;

/// The leader's side of healing partitions: gossip of its Id, and the Exchange.
#[derive(Default)]
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct Heal {
    /// When the leader gossips its Id next.
    pub(super) next_gossip: Timestamp,
    /// Exchange: this leader's latest Ids (at most two), to open the tickets answering them.
    pub(super) local_ids: Vec<LocalId>,
    /// Signature checks left for gossip until `gossip_budget_at` plus a suspicion timeout.
    pub(super) gossip_budget: u32,
    pub(super) gossip_budget_at: Timestamp,
    /// When gossip from (or for) an address was last answered or forwarded.
    pub(super) gossip_answered: HashMap<SocketAddr, Timestamp>,
    /// When a secure Id from an address was last answered.
    pub(super) secure_answered: HashMap<SocketAddr, Timestamp>,
    /// A ticket's key waiting for the view change in progress to end (appendix 12.1).
    pub(super) held_exchange: Option<(GroupKey, MemberId, SocketAddr)>,
    /// Fingerprints of keys this member took through an Exchange.
    pub(super) exchanged: Vec<[u8; 8]>,
    /// After an Exchange: the other leader, told at the next gossip that the keys match.
    pub(super) exchange_reply_to: Option<SocketAddr>,
    /// After an Exchange: when to check that the leader who handed its key over has merged
    /// in, that leader, and the key's fingerprint (see `check_exchange_merged`).
    pub(super) exchange_check: Option<(Timestamp, MemberId, [u8; 8])>,
}

impl GroupMember {
    /// Leader, some time after taking another component's key through an Exchange: if that
    /// component's leader has not merged in by now (it left, crashed or went elsewhere) and
    /// the group still uses its key, a principal outside the group holds the group key, so
    /// the group rekeys. (Once it has merged, it is a member; in KDC mode its joining
    /// brought a fresh key anyway.)
    pub(super) fn check_exchange_merged(&mut self, now: Timestamp) {
        let Some((at, giver, fingerprint)) = self.heal.exchange_check else {
            return;
        };
        if now < at {
            return;
        }
        self.heal.exchange_check = None;
        let merged = self.view.as_ref().is_some_and(|v| v.contains(&giver));
        let same_key = self
            .group_key
            .as_ref()
            .is_some_and(|k| k.fingerprint(&self.provider) == fingerprint);
        if !merged && same_key {
            self.view_change.rekey_wanted.get_or_insert(now);
            self.maybe_start_change(now);
        }
    }

    pub(super) fn new_local_id(&self, nonce: [u8; exchange::NONCE_LEN]) -> Option<LocalId> {
        if self.identity.is_none() {
            return Some(LocalId::nonce_only(nonce));
        }
        LocalId::new(&self.provider, nonce)
    }

    /// The leader sends a fresh Id to the members it knows outside its view and its contacts
    /// (Heal and Exchange): components that hear it merge, or exchange keys first.
    pub(super) fn gossip(&mut self) {
        let Some(view) = self.view.as_ref() else {
            return;
        };
        let mut targets: Vec<SocketAddr> = self
            .known
            .iter()
            .filter(|(id, _)| !view.contains(id))
            .map(|(_, a)| *a)
            .collect();
        for c in &self.contacts {
            if view.rank_of_addr(c).is_none() && !targets.contains(c) {
                targets.push(*c);
            }
        }
        if let Some(a) = self.heal.exchange_reply_to.take() {
            if !targets.contains(&a) {
                targets.push(a);
            }
        }
        if targets.is_empty() {
            return;
        }
        let mut nonce = [0u8; exchange::NONCE_LEN];
        self.rng.fill_bytes(&mut nonce);
        let Some(local) = self.new_local_id(nonce) else {
            return;
        };
        self.heal.local_ids.push(local);
        while self.heal.local_ids.len() > 2 {
            self.heal.local_ids.remove(0);
        }
        let Some(id) = self.encode_own_id() else {
            return;
        };
        self.out
            .push_copies(targets.into_iter().map(Destination::Member), &id);
    }

    /// This leader's latest Id, encoded and signed.
    pub(super) fn encode_own_id(&mut self) -> Option<Vec<u8>> {
        if self.heal.local_ids.is_empty() {
            let mut nonce = [0u8; exchange::NONCE_LEN];
            self.rng.fill_bytes(&mut nonce);
            let local = self.new_local_id(nonce)?;
            self.heal.local_ids.push(local);
        }
        let (view, key, local) = (
            self.view.as_ref()?,
            self.group_key.as_ref()?,
            self.heal.local_ids.last()?,
        );
        let size = view.members.len() as u16;
        match self.identity.as_ref() {
            Some(identity) => exchange::encode_id(
                &self.provider,
                identity,
                &self.config.group,
                self.addr,
                size,
                local,
                key,
            ),
            None => Some(exchange::encode_kdc_id(
                &self.provider,
                &self.id,
                &self.config.group,
                self.addr,
                size,
                local,
                key,
            )),
        }
    }

    /// At most one answer (or forward) per address per heartbeat interval, counted apart
    /// for answers to secure Ids (`secure`): the larger leader's answer that lets the smaller
    /// one merge must not be held back by the ticket it sent a moment before.
    pub(super) fn gossip_throttle(
        &mut self,
        now: Timestamp,
        addr: SocketAddr,
        secure: bool,
    ) -> bool {
        let gap = self.config.heartbeat_interval;
        let map = if secure {
            &mut self.heal.secure_answered
        } else {
            &mut self.heal.gossip_answered
        };
        if map.len() >= 1024 {
            map.retain(|_, t| now.saturating_duration_since(*t) < gap);
            if map.len() >= 1024 {
                return false;
            }
        }
        match map.get(&addr) {
            Some(t) if now.saturating_duration_since(*t) < gap => false,
            _ => {
                map.insert(addr, now);
                true
            }
        }
    }

    /// Whether the gossip datagram's signature verifies, spending one check of the gossip
    /// budget; a bad signature is counted, an exhausted budget checks nothing.
    fn signature_verified(&mut self, now: Timestamp, data: &[u8], parsed: &Parsed) -> bool {
        if !self.spend_verification(now) {
            return false;
        }
        if !exchange::signature_ok(&self.provider, data, parsed) {
            self.counters.count(Drop::AuthFailed);
            return false;
        }
        true
    }

    /// Takes one signature check from the gossip budget (32 per suspicion timeout).
    fn spend_verification(&mut self, now: Timestamp) -> bool {
        if now.saturating_duration_since(self.heal.gossip_budget_at) >= self.config.suspect_timeout
        {
            self.heal.gossip_budget_at = now;
            self.heal.gossip_budget = 32;
        }
        if self.heal.gossip_budget == 0 {
            return false;
        }
        self.heal.gossip_budget -= 1;
        true
    }

    pub(super) fn handle_gossip(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        let Some(parsed) = exchange::decode(data) else {
            self.counters.count(Drop::Malformed);
            return;
        };
        if parsed.group != self.config.group {
            self.counters.count(Drop::OtherGroup);
            return;
        }
        if self.view.is_none() || self.expelled {
            return;
        }
        match parsed.gossip.clone() {
            Gossip::Id(id) => self.on_id(now, data, &parsed, id),
            Gossip::Ticket(t) => self.on_ticket(now, from, data, &parsed, t),
            Gossip::Present {
                member,
                view,
                token,
            } => self.on_gossip_present(member, view, &token), // LSGC message 5: join.rs
        }
    }

    pub(super) fn on_id(&mut self, now: Timestamp, data: &[u8], parsed: &Parsed, id: exchange::Id) {
        let Some(view) = self.view.clone() else {
            return;
        };
        if id.principal == self.id || view.contains(&id.principal) {
            return; // our own, or a member's from before it joined us
        }
        if !self.is_leader() {
            // Only leaders take part: pass it on to ours (it answers the address inside).
            if self.gossip_throttle(now, id.addr, false) {
                self.out.push(view.leader().addr, data);
            }
            return;
        }
        if self.view_change.coordinator.is_some() || self.view_change.flushing.is_some() {
            return; // busy: the next gossip comes soon
        }
        let Some(key) = self.group_key.as_ref() else {
            return;
        };
        if exchange::id_is_secure(&self.provider, &self.config.group, key, data, parsed) {
            // Heal: one key, so the components merge. The smaller one yields (between
            // equals, the one whose leader's key sorts higher); both compute the same.
            let mine = (view.members.len() as u16, std::cmp::Reverse(self.id));
            let theirs = (id.size, std::cmp::Reverse(id.principal));
            if mine < theirs {
                self.events.push_back(GroupEvent::Merging {
                    leader: id.principal,
                    into: id.addr,
                });
                let change = Change {
                    merge_into: Some(id.addr),
                    ..Change::removing(&view, Vec::new(), now)
                };
                self.start_coordinating(now, change);
            } else if self.gossip_throttle(now, id.addr, true) {
                // Tell the smaller one now rather than at our next gossip.
                if let Some(own) = self.encode_own_id() {
                    self.out.push(id.addr, &own);
                }
            }
            return;
        }
        // Insecure: another key. Exchange only with a leader this one trusts, and not with a
        // principal seen leaving (it would get the key drawn to keep it out; it comes back
        // by joining).
        if !self.trusts(&id.principal) || self.departed.contains(&id.principal) {
            self.counters.count(Drop::Untrusted);
            return;
        }
        if !self.gossip_throttle(now, id.addr, false) {
            return;
        }
        if self.identity.is_none() {
            // KDC mode: the Id is not signed; the ticket goes over a pair channel that only
            // the named principal can open (its keys come from the KDC).
            if id.principal.principal().is_none() {
                self.counters.count(Drop::Malformed);
                return;
            }
            if self.id < id.principal {
                let (Some(key), Some(epoch)) = (
                    self.group_key
                        .as_ref()
                        .map(|k| Zeroizing::new(k.expose().to_vec())),
                    self.group_key.as_ref().map(|k| k.epoch),
                ) else {
                    return;
                };
                let ticket = PairMsg::Ticket {
                    nonce: id.nonce,
                    key_epoch: epoch,
                    key,
                };
                self.send_pair(now, id.addr, Some(id.principal), &ticket);
                self.events
                    .push_back(GroupEvent::TicketSent { to: id.principal });
            } else if let Some(own) = self.encode_own_id() {
                self.out.push(id.addr, &own);
            }
            return;
        }
        if !self.signature_verified(now, data, parsed) {
            return;
        }
        if self.id < id.principal {
            // The lower principal hands its key over.
            let (Some(key), Some(identity)) = (self.group_key.as_ref(), self.identity.as_ref())
            else {
                return;
            };
            if let Some(ticket) =
                exchange::encode_ticket(&self.provider, identity, &self.config.group, &id, key)
            {
                self.out.push(id.addr, &ticket);
                self.events
                    .push_back(GroupEvent::TicketSent { to: id.principal });
            }
        } else if let Some(own) = self.encode_own_id() {
            // The other leader sorts lower: it sends the ticket once it hears from us.
            self.out.push(id.addr, &own);
        }
    }

    pub(super) fn on_ticket(
        &mut self,
        now: Timestamp,
        from: SocketAddr,
        data: &[u8],
        parsed: &Parsed,
        t: exchange::Ticket,
    ) {
        // KDC mode takes tickets over pair channels only (and runs no signature check). Only
        // the lower principal hands its key over.
        if t.recipient != self.id
            || !self.is_leader()
            || self.identity.is_none()
            || t.sender >= self.id
        {
            self.counters.count(Drop::Unexpected);
            return;
        }
        let Some(i) = self.ticket_slot(&t.sender, &t.nonce) else {
            return;
        };
        if !self.signature_verified(now, data, parsed) {
            return;
        }
        let Some(key) = exchange::open_ticket(
            &self.provider,
            &self.config.group,
            &self.id,
            &self.heal.local_ids[i],
            data,
            &t,
        ) else {
            self.counters.count(Drop::AuthFailed);
            return;
        };
        self.heal.local_ids[i].used = true;
        self.take_ticket_key(now, key, t.sender, from);
    }

    /// KDC mode's ticket, over the pair channel from `peer`.
    pub(super) fn on_pair_ticket(
        &mut self,
        now: Timestamp,
        peer: MemberId,
        addr: SocketAddr,
        nonce: [u8; exchange::NONCE_LEN],
        key_epoch: u64,
        key: &[u8],
    ) {
        if self.identity.is_some()
            || !self.is_leader()
            || key.len() != GROUP_KEY_LEN
            || peer >= self.id
        {
            self.counters.count(Drop::Unexpected);
            return;
        }
        let Some(i) = self.ticket_slot(&peer, &nonce) else {
            return;
        };
        self.heal.local_ids[i].used = true;
        let key = GroupKey::new(key_epoch, Secret::from_slice(key));
        self.take_ticket_key(now, key, peer, addr);
    }

    /// The local Id a ticket from `sender` answers, if the sender may hand us a key (trusted,
    /// not seen leaving) and the ticket is fresh: for one of our two latest nonces, and the
    /// first ticket for it. Refusals are counted.
    fn ticket_slot(
        &mut self,
        sender: &MemberId,
        nonce: &[u8; exchange::NONCE_LEN],
    ) -> Option<usize> {
        if !self.trusts(sender) || self.departed.contains(sender) {
            self.counters.count(Drop::Untrusted);
            return None;
        }
        let slot = self
            .heal
            .local_ids
            .iter()
            .position(|l| l.nonce == *nonce && !l.used);
        if slot.is_none() {
            self.counters.count(Drop::Replayed);
        }
        slot
    }

    /// A ticket's key: unless it is the key this component already holds, it is held for
    /// an Exchange view change (appendix 12.1), started as soon as none is in progress.
    fn take_ticket_key(&mut self, now: Timestamp, key: GroupKey, from: MemberId, addr: SocketAddr) {
        let same = self
            .group_key
            .as_ref()
            .is_some_and(|k| ct_eq(k.expose(), key.expose()));
        if same {
            return;
        }
        self.heal.held_exchange = Some((key, from, addr));
        self.maybe_start_change(now);
    }
}
