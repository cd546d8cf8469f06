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
use super::timers::interval;
use super::{GroupMember, OldView};
use crate::config::RekeyMethod;
use crate::event::{Drop, GroupEvent, RemovalReason};
use crate::id::{Member, MemberId, View, ViewId};
use crate::keys::{self, GroupKey, ViewKeys, GROUP_KEY_LEN};
use crate::wire::{Install, KeyDelivery, Msg, PairMsg};
use cohort_core::Timestamp;
use cohort_crypto::Secret;
use rand_core::RngCore;
use std::net::SocketAddr;
use std::time::Duration;
use zeroize::Zeroizing;

/// An installed view's sending side after the coordinator installed it: Install messages
/// are resent until acknowledged.
pub(super) struct Announce {
    pub(super) view: ViewId,
    pub(super) install: Box<Install>,
    pub(super) welcome_key: Option<Zeroizing<Vec<u8>>>,
    /// (member, is a joiner) not yet acknowledged.
    pub(super) unacked: Vec<(Member, bool)>,
    pub(super) resend_at: Timestamp,
    pub(super) until: Timestamp,
    /// When the Install first went out.
    pub(super) sent: Timestamp,
}

/// Suspicion timeouts (gossip rounds) an Exchange's other component has to merge in before
/// the key it handed over is replaced.
const EXCHANGE_MERGE_ROUNDS: u32 = 5;

/// Largest Install body sent whole: leaves room in a 64 KiB datagram for the headers.
pub(super) const MAX_INSTALL_BODY: usize = 60_000;

/// Whether `install` fits one datagram as it is.
pub(super) fn fits_one_datagram(install: &Install) -> bool {
    let mut body = Vec::new();
    Msg::Install(Box::new(install.clone())).encode(&mut body);
    body.len() <= MAX_INSTALL_BODY
}

/// The Install a member receives: the whole message when it fits one datagram (LSGC's one
/// message for everyone); otherwise (beyond about 600 members with wrapped keys) a copy
/// with only that member's wrapped key, the others left empty.
pub(super) fn install_copy_for(
    install: &Install,
    member: &MemberId,
    whole_fits: bool,
) -> Box<Install> {
    let mut copy = Box::new(install.clone());
    if whole_fits {
        return copy;
    }
    if let KeyDelivery::Wrapped(wraps) = &mut copy.key {
        for (m, w) in install.members.iter().zip(wraps.iter_mut()) {
            if m.id != *member {
                w.clear();
            }
        }
    }
    if let KeyDelivery::Lkh(d) = &mut copy.key {
        let rank = install.members.iter().position(|m| m.id == *member);
        d.paths.retain(|(r, _)| Some(usize::from(*r)) == rank);
    }
    copy
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
        let members = self.new_members();
        let Some(c) = self.view_change.coordinator.take() else {
            return;
        };
        let old_epoch = self.group_key.as_ref().map_or(0, |k| k.epoch);
        let key_epoch = c.new_key.as_ref().map_or(old_epoch, |k| k.epoch);
        let next_seqs: Vec<u64> = members
            .iter()
            .map(|m| {
                if let Some(r) = self.view.as_ref().and_then(|v| v.rank_of(&m.id)) {
                    if let Some(a) = c.answers.get(&(r as u16)) {
                        return a.next_seq;
                    }
                }
                c.joiners
                    .iter()
                    .find(|(j, _, _)| j.id == m.id)
                    .map_or(0, |(_, s, _)| *s)
            })
            .collect();
        let incarnations: Vec<u64> = members
            .iter()
            .map(|m| {
                if let Some(j) = c.joiners.iter().find(|(j, _, _)| j.id == m.id) {
                    return j.2;
                }
                self.view
                    .as_ref()
                    .and_then(|v| v.rank_of(&m.id))
                    .and_then(|r| self.incarnations.get(r).copied())
                    .unwrap_or(0)
            })
            .collect();
        let provisional = Install {
            view: c.proposal,
            members: members.clone(),
            next_seqs: next_seqs.clone(),
            incarnations: incarnations.clone(),
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
            removed: c.removed.clone(),
            signature: Vec::new(),
        };
        let bind = self.install_bind(&provisional);
        let key = match (&c.new_key, self.config.rekey_method) {
            (None, _) => KeyDelivery::Same,
            (Some(k), RekeyMethod::Tree { .. }) => KeyDelivery::Tree(k.fingerprint(&self.provider)),
            (Some(k), RekeyMethod::Lkh { .. }) => self.lkh_delivery(&provisional, k, &members),
            (Some(k), RekeyMethod::OneMessage) => {
                let mut wraps = Vec::with_capacity(members.len());
                for (r, m) in members.iter().enumerate() {
                    if m.id == self.id {
                        wraps.push(Vec::new());
                        continue;
                    }
                    let wrapped = self
                        .pairs
                        .pair_key(&m.id)
                        .and_then(|pk| {
                            keys::wrap(&self.provider, pk.expose(), &c.proposal, r as u16, k, &bind)
                                .ok()
                        })
                        .unwrap_or_default();
                    wraps.push(wrapped);
                }
                KeyDelivery::Wrapped(wraps)
            }
        };
        let install = Box::new(Install {
            view: c.proposal,
            members: members.clone(),
            next_seqs,
            incarnations,
            key_epoch,
            final_order: c.final_order,
            key,
            merge_into: c.merge_into,
            removed: c.removed.clone(),
            signature: Vec::new(),
        });
        let mut install = install;
        // Identity keys: the coordinator signs. KDC mode: no signature; each member's wrap
        // binds the Install's digest instead.
        if let Some(identity) = self.identity.as_ref() {
            match identity.sign(&self.provider, &install.signed_bytes(&self.config.group)) {
                Ok(sig) => install.signature = sig,
                Err(_) => return, // the backend failed: no view change this time
            }
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
        let mut unacked = Vec::new();
        let mut told = Vec::new();
        let old_members = self
            .view
            .as_ref()
            .map(|v| v.members.clone())
            .unwrap_or_default();
        for m in &members {
            if m.id == self.id {
                continue;
            }
            let joiner = c.joiners.iter().any(|(j, _, _)| j.id == m.id);
            unacked.push((*m, joiner));
        }
        for m in &old_members {
            if m.id != self.id && !members.iter().any(|n| n.id == m.id) {
                let why = c
                    .removed
                    .iter()
                    .find(|(id, _)| *id == m.id)
                    .map(|(_, r)| *r);
                // Removed members hear of it (under the old key they hold; the new key is
                // wrapped for members only). One that was suspected but is alive then goes
                // on in its own component at once, instead of after its suspicion timeout.
                if why.is_some() {
                    told.push(*m);
                }
            }
        }
        let old_view = self.view.as_ref().map(|v| v.id);
        let whole_fits = fits_one_datagram(&install);
        for (m, joiner) in &unacked {
            let copy = install_copy_for(&install, &m.id, whole_fits);
            if *joiner {
                let w = PairMsg::Welcome {
                    install: copy,
                    key: welcome_key.clone(),
                };
                self.send_pair(now, m.addr, Some(m.id), &w);
            } else {
                self.send_msg(m.addr, &Msg::Install(copy));
            }
        }
        // In KDC mode the members left out could not authenticate the Install (they hold no
        // wrap): they hear of it over their pair channel.
        for m in &told {
            if self.identity.is_some() {
                self.send_msg(m.addr, &Msg::Install(install.clone()));
            } else if let Some((_, why)) = install.removed.iter().find(|(id, _)| *id == m.id) {
                let msg = PairMsg::Removed {
                    view: install.view,
                    reason: *why,
                };
                self.send_pair(now, m.addr, Some(m.id), &msg);
            }
        }
        if let Some(target) = c.merge_into {
            // The component ends here, but the coordinator stays in it until every member
            // confirms the merge Install (or the flush timeout passes): it resends the
            // Install and serves the positions it needs meanwhile. Dissolving at once left a
            // member that missed the one copy waiting out its takeover turn, then alone,
            // then merging through an Exchange of its own: seconds (the group chaos runs).
            let waiting: Vec<Member> = unacked.iter().map(|(m, _)| *m).collect();
            self.view_change.coordinator = Some(Coordinator {
                phase: Phase::Dissolving { target },
                deadline: now.saturating_add(self.config.flush_timeout),
                resend_at: now.saturating_add(interval::flush_resend(&self.config)),
                final_order: install.final_order,
                dissolving: Some((install, waiting)),
                new_key: None,
                ..c
            });
            self.progress_flush(now);
            return;
        }
        let took = now.saturating_duration_since(c.started);
        let removed = c.removed.clone();
        let leaving_self = !members.iter().any(|m| m.id == self.id);
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
            welcome_key: Some(welcome_key),
            unacked,
            resend_at: now.saturating_add(interval::flush_resend(&self.config)),
            until: now.saturating_add(self.config.key_grace),
            sent: now,
        });
        let _ = old_view;
        if leaving_self {
            self.leave_now(RemovalReason::Left);
            return;
        }
        // The coordinator delivers what every survivor delivers before the new view.
        self.deliver_up_to(install.final_order);
        self.install_view(now, &install, new_key, Some((took, removed)));
    }

    /// `member` acknowledged the announced Install (or, while this coordinator dissolves
    /// its component, the merge Install): it is not resent there.
    pub(super) fn on_install_ack(&mut self, now: Timestamp, member: MemberId) {
        if let Some(a) = self.view_change.announce.as_mut() {
            a.unacked.retain(|(m, _)| m.id != member);
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
        let whole_fits = fits_one_datagram(install);
        let copies: Vec<(SocketAddr, Box<Install>)> = waiting
            .iter()
            .map(|m| (m.addr, install_copy_for(install, &m.id, whole_fits)))
            .collect();
        for (addr, copy) in copies {
            self.send_msg(addr, &Msg::Install(copy));
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
        if !self.install_is_signed(&install) {
            self.counters.count(Drop::AuthFailed);
            return;
        }
        if !install.members.iter().any(|m| m.id == self.id) {
            // We were removed.
            let newer = self
                .view_change
                .flushing
                .as_ref()
                .is_some_and(|f| f.proposal == install.view)
                || self.view.as_ref().is_some_and(|v| install.view > v.id);
            if !newer {
                return;
            }
            let why = install
                .removed
                .iter()
                .find(|(id, _)| *id == self.id)
                .map(|(_, r)| *r);
            match why {
                _ if self.leaving.is_some() => self.leave_now(RemovalReason::Left),
                Some(RemovalReason::Lagged) => self.leave_now(RemovalReason::Lagged),
                _ => {
                    // Suspected while alive: go on at once in a component of those left
                    // out (whoever of them answers), which probing merges back later.
                    if self.view_change.coordinator.is_some() {
                        return;
                    }
                    let Some(view) = self.view.clone() else {
                        return;
                    };
                    let gone: Vec<(MemberId, RemovalReason)> = install
                        .members
                        .iter()
                        .map(|m| (m.id, RemovalReason::Suspected))
                        .collect();
                    let change = Change {
                        rekey: self.config.rekey_policy.on_membership_change,
                        ..Change::removing(&view, gone, now)
                    };
                    self.start_coordinating(now, change);
                }
            }
            return;
        }
        let Some(f) = self.view_change.flushing.as_mut() else {
            return;
        };
        if f.proposal != install.view || f.coordinator != rank {
            return;
        }
        if f.install.is_none() {
            f.install = Some(install);
        }
        self.progress_flush(now);
    }

    pub(super) fn finish_participant_install(&mut self, now: Timestamp, install: Box<Install>) {
        if let Some(target) = install.merge_into {
            self.deliver_up_to(install.final_order);
            // Confirm under the component's keys before dropping them: the coordinator stays
            // until every member has.
            self.ack_install(&install);
            self.dissolve(now, target);
            return;
        }
        if !install.members.iter().any(|m| m.id == self.id) {
            return;
        }
        let key = match &install.key {
            KeyDelivery::Same => self.group_key.as_ref().map(|k| k.duplicate()),
            KeyDelivery::Wrapped(_) => match self.view_change.unwrapped.take() {
                Some((view, key)) if view == install.view => Some(key),
                _ => self.unwrap_own(&install),
            },
            KeyDelivery::Tree(fp) => match self.tree.tree_key.as_ref() {
                Some((p, k)) if *p == install.view && k.fingerprint(&self.provider) == *fp => {
                    Some(k.duplicate())
                }
                _ => None,
            },
            KeyDelivery::Lkh(_) => self.lkh_install(&install),
        };
        let Some(key) = key else {
            // The key did not arrive or did not authenticate: wait for a retransmission (the
            // pair channel may still be coming up) or for the next view change.
            if let Some(f) = self.view_change.flushing.as_mut() {
                f.install = None;
            }
            return;
        };
        if key.epoch != install.key_epoch {
            self.counters.count(Drop::Unexpected);
            if let Some(f) = self.view_change.flushing.as_mut() {
                f.install = None;
            }
            return;
        }
        self.deliver_up_to(install.final_order);
        self.install_view(now, &install, key, None);
        self.ack_install(&install);
    }

    /// Installs `install` with `key`: new keys, new log, events.
    pub(super) fn install_view(
        &mut self,
        now: Timestamp,
        install: &Install,
        key: GroupKey,
        coordinated: Option<(Duration, Vec<(MemberId, RemovalReason)>)>,
    ) {
        let Some(rank) = install.members.iter().position(|m| m.id == self.id) else {
            return;
        };
        let view = View {
            id: install.view,
            members: install.members.clone(),
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
            self.old_views.push(OldView {
                view: old_view.clone(),
                keys: old_keys,
                log,
                expires: now.saturating_add(self.config.key_grace),
            });
            while self.old_views.len() > 2 {
                self.old_views.remove(0);
            }
            let removed = install.removed.clone();
            let staying: std::collections::HashSet<MemberId> = view.ids().collect();
            for m in &old_view.members {
                if !staying.contains(&m.id) {
                    let reason = removed
                        .iter()
                        .find(|(id, _)| *id == m.id)
                        .map_or(RemovalReason::Suspected, |(_, r)| *r);
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
                }
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
            .retain(|(m, _)| !install.members.iter().any(|x| x.id == *m));
        if self.admission.presented.len() > 1024 {
            self.admission.presented.clear();
        }
        if rank != 0 {
            // Tickets go to leaders; one held by a leader that no longer leads is moot.
            self.heal.held_exchange = None;
        }
        self.record_key(&key);
        self.group_key = Some(key);
        self.rank = rank as u16;
        self.incarnations = install.incarnations.clone();
        self.keys = Some(keys);
        self.reliable
            .start_view(install.members.len(), &install.next_seqs, rank, now);
        self.view_change.flushing = None;
        self.tree.tree_key = None;
        self.tree.tree_wait = None;
        self.view_change.highest_proposal = Some(
            self.view_change
                .highest_proposal
                .map_or(view.id, |h| h.max(view.id)),
        );
        self.liveness.leader_heard = now;
        self.liveness.next_heartbeat = now;
        for m in &view.members {
            if m.id != self.id {
                self.known.insert(m.id, m.addr);
                self.departed.remove(&m.id);
            }
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

    /// Whether `install` comes from its coordinator: its Ed25519 signature, or in KDC mode
    /// this member's wrap, which binds the Install's digest under the pair key shared with
    /// the coordinator (an Install that leaves this member out cannot be checked there).
    pub(super) fn install_is_signed(&mut self, install: &Install) -> bool {
        if self.identity.is_none() {
            // The check unwraps this member's key: keep it for the install that follows.
            return match self.unwrap_own(install) {
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

    /// KDC mode binds this into every wrap: SHA-256 of what an identity-key coordinator
    /// would sign. Empty with identity keys (the signature covers it).
    pub(super) fn install_bind(&self, install: &Install) -> Vec<u8> {
        if self.identity.is_some() {
            return Vec::new();
        }
        self.provider
            .sha256
            .sha256(&[&install.signed_bytes(&self.config.group)])
            .to_vec()
    }

    /// This member's key from a one-message Install's wraps.
    pub(super) fn unwrap_own(&self, install: &Install) -> Option<GroupKey> {
        let KeyDelivery::Wrapped(wraps) = &install.key else {
            return self.lkh_open(install).map(|(key, _)| key);
        };
        let my_rank = install.members.iter().position(|m| m.id == self.id)?;
        let pk = self.pairs.pair_key(&install.view.coordinator)?;
        keys::unwrap(
            &self.provider,
            pk.expose(),
            &install.view,
            my_rank as u16,
            install.key_epoch,
            wraps.get(my_rank)?,
            &self.install_bind(install),
        )
    }

    /// Tells the view's coordinator (under the new view's keys) that it is installed here.
    pub(super) fn ack_install(&mut self, install: &Install) {
        let coordinator = install
            .members
            .iter()
            .find(|m| m.id == install.view.coordinator)
            .map(|m| m.addr);
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
