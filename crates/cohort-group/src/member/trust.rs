//! The trust policy and leaving: replacing the trusted principals (and removing members
//! no longer trusted), going alone, and leaving the group.
//!
//! Owns: no state of its own beyond the config's trust list; it asks the view change for
//! removals and drops pair channels.

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
        self.config.trust = trust.clone();
        self.pairs.set_trust(trust);
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
    }

    /// The principals this member trusts.
    pub fn trust(&self) -> &[MemberId] {
        &self.config.trust
    }

    /// Leaves the component (telling the leader) and founds one of its own, keeping its
    /// undelivered reliable messages for the new view.
    pub(super) fn go_alone(&mut self, now: Timestamp) {
        if let Some(leader) = self.view.as_ref().map(|v| v.leader().addr) {
            self.send_msg(leader, &Msg::Leave);
        }
        self.drop_component();
        self.found(now);
    }

    /// Drops the pair channels to every member this one knows (their ends may drop theirs
    /// when they remove this member).
    pub(super) fn forget_pairs(&mut self) {
        let addrs: Vec<SocketAddr> = self.known.values().copied().collect();
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
