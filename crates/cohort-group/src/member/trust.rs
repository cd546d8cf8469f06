//! The trust policy and leaving: replacing the trusted principals (and removing members
//! no longer trusted), going alone, and leaving the group.
//!
//! Owns: no state of its own beyond the config's trust list; it asks the view change for
//! removals and drops pair channels.

use super::flush::Change;
use super::GroupMember;
use crate::config::AuthMode;
use crate::event::{GroupEvent, RemovalReason};
use crate::id::MemberId;
use crate::wire::Msg;
use cohort_core::Timestamp;
use std::net::SocketAddr;

impl GroupMember {
    /// Whether this member's policy trusts `id` (itself always).
    pub(super) fn trusts(&self, id: &MemberId) -> bool {
        *id == self.id
            || self.config.trust.contains(id)
            || (self.config.auth == AuthMode::Kdc
                && self.config.trust_any_registered
                && id.principal().is_some())
    }

    /// Replaces this member's trust policy (the principals it trusts). Pair channels to
    /// principals no longer trusted close. A leader removes the members of its view it no
    /// longer trusts, with a rekey (Ensemble 6.1); a member that no longer trusts its leader
    /// leaves the component and goes on alone (it may merge later with components whose
    /// leaders it trusts). Other members stay: they are linked to this one through the
    /// leader, which st-trust allows.
    pub fn set_trust(&mut self, now: Timestamp, trust: Vec<MemberId>) {
        self.config.trust = trust.into();
        // Members checked under the old policy are checked again at the next change.
        self.view_change.trusted_view = None;
        self.pairs.set_trust(self.config.trust.clone());
        self.drain_pairs(now);
        let mut untrusted_members = Vec::new();
        if let Some(view) = self.view.clone() {
            untrusted_members = view.ids().filter(|m| !self.trusts(m)).collect();
            if self.is_leader() {
                for m in &untrusted_members {
                    if !self.view_change.change_wanted.iter().any(|(w, _)| w == m) {
                        self.view_change
                            .change_wanted
                            .push((*m, RemovalReason::Untrusted));
                    }
                }
            }
        }
        let joiners = std::mem::take(&mut self.view_change.joiners_wanted);
        self.view_change.joiners_wanted = joiners
            .into_iter()
            .filter(|(m, _, _)| self.trusts(&m.id))
            .collect();
        self.events.push_back(GroupEvent::TrustChanged {
            trusted: self.config.trust.len(),
            untrusted_members: untrusted_members.clone(),
        });
        // A view change led by a coordinator no longer trusted is abandoned (it could
        // otherwise install a view that keeps this member with it, under the old key).
        let follows_untrusted = self
            .view_change
            .flushing
            .as_ref()
            .is_some_and(|f| !self.trusts(&f.proposal.coordinator));
        if follows_untrusted {
            self.view_change.flushing = None;
        }
        let leader_untrusted = self
            .view
            .as_ref()
            .is_some_and(|v| !self.trusts(&v.leader().id));
        if leader_untrusted {
            self.go_alone(now);
            return;
        }
        self.maybe_start_change(now);
        self.maybe_go_back(now);
    }

    /// A member that went alone because it stopped trusting its leader, and trusts that
    /// leader again, leads its component back into that group: the component dissolves
    /// (after its final flush) and its members join at the old leader's address (joins are
    /// redirected to whoever leads there now), which draws a fresh key there. Called when
    /// the trust changes and at every gossip tick (a view change may be running).
    pub(super) fn maybe_go_back(&mut self, now: Timestamp) {
        let Some((leader, addr)) = self.went_alone_from else {
            return;
        };
        let Some(view) = self.view.clone() else {
            return;
        };
        if view.contains(&leader) || !self.is_leader() {
            // Back together already, or part of a component someone else leads.
            self.went_alone_from = None;
            return;
        }
        if !self.trusts(&leader)
            || self.view_change.coordinator.is_some()
            || self.view_change.flushing.is_some()
        {
            return;
        }
        self.went_alone_from = None;
        self.events
            .push_back(GroupEvent::Merging { leader, into: addr });
        let change = Change {
            merge_into: Some(addr),
            ..Change::removing(&view, Vec::new(), now)
        };
        self.start_coordinating(now, change);
    }

    /// The principals this member trusts.
    pub fn trust(&self) -> &[MemberId] {
        &self.config.trust
    }

    /// Leaves the component (telling the leader) and founds one of its own, keeping its
    /// undelivered reliable messages for the new view.
    pub(super) fn go_alone(&mut self, now: Timestamp) {
        if let Some((id, addr)) = self.view.as_ref().map(|v| (v.leader().id, v.leader().addr)) {
            self.send_msg(addr, &Msg::Leave);
            self.went_alone_from = Some((id, addr));
        }
        self.drop_component();
        self.found(now);
    }

    /// Drops the pair channels to every member this one knows (their ends may drop theirs
    /// when they remove this member).
    pub(super) fn forget_pairs(&mut self) {
        let addrs: Vec<SocketAddr> = self.known_addrs();
        for a in addrs {
            self.pairs.forget(a);
        }
    }

    pub(super) fn leave_now(&mut self, reason: RemovalReason) {
        self.forget_pairs();
        self.view = None;
        self.keys = None;
        self.group_key = None;
        self.reliable.leave_view();
        // Out of the group for good: its undelivered messages will never be sent.
        self.reliable.pending.clear();
        self.view_change.flushing = None;
        self.view_change.coordinator = None;
        self.old_views.clear();
        self.expelled = true;
        self.events.push_back(GroupEvent::Expelled { reason });
    }
}
