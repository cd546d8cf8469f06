//! Time: every interval derived from the configured timers (`interval`), the tick that
//! drives each concern's deadlines (heartbeats, NAK retries, gossip, suspicion, flush and
//! tree deadlines, leader takeover), and the earliest deadline for `poll_timeout`.
//!
//! Owns: no state; each deadline lives with the concern that arms it. It may not send
//! anything itself except by calling the owning concern.

use super::GroupMember;
use crate::event::RemovalReason;
use crate::id::MemberId;
use crate::wire::Msg;
use cohort_core::Timestamp;
use rand_core::RngCore;
use std::time::Duration;

/// Every interval the member derives from its configured timers, defined once; the
/// files that arm a deadline and `next_timeout` that waits for it use the same function.
pub(super) mod interval {
    use crate::config::GroupConfig;
    use std::time::Duration;

    /// How often a member NAKs a gap again while it lasts.
    pub fn nak_retry(config: &GroupConfig) -> Duration {
        config.heartbeat_interval / 8
    }

    /// How long an own reliable message waits before it is submitted again. Resends go
    /// out with the heartbeat tick, so in effect a message is resent once per heartbeat.
    pub fn submit_resend(config: &GroupConfig) -> Duration {
        config.heartbeat_interval / 2
    }

    /// How often a flushing participant, or a coordinator fetching positions, asks a
    /// survivor again for positions it lacks.
    pub fn fetch_retry(config: &GroupConfig) -> Duration {
        config.heartbeat_interval / 2
    }

    /// How often a coordinator resends Flush, key shares or the Install while it waits.
    pub fn flush_resend(config: &GroupConfig) -> Duration {
        config.flush_timeout / 4
    }

    /// How long a tree node waits for its children's key acknowledgements.
    pub fn tree_ack_wait(config: &GroupConfig) -> Duration {
        config.flush_timeout / 2
    }
}

impl GroupMember {
    pub(super) fn on_tick(&mut self, now: Timestamp) {
        self.old_views.retain(|o| o.expires > now);
        if let Some(a) = self.view_change.announce.as_ref() {
            if now >= a.until || self.view.as_ref().is_none_or(|v| v.id != a.view) {
                self.view_change.announce = None;
            } else if now >= a.resend_at {
                self.resend_announce(now);
            }
        }
        if self.joining.is_some() {
            self.drive_join(now);
        }
        if self.view.is_none() || self.expelled {
            return;
        }
        if now >= self.liveness.next_heartbeat {
            self.liveness.next_heartbeat = now.saturating_add(self.config.heartbeat_interval);
            self.send_heartbeat(now);
            self.submit_pending(now);
            if let Some(l) = self.leaving {
                if !self.is_leader()
                    && now.saturating_duration_since(l) >= self.config.heartbeat_interval
                {
                    if let Some(leader) = self.view.as_ref().map(|v| v.leader().addr) {
                        self.send_msg(leader, &Msg::Leave);
                    }
                }
            }
        }
        // Missing positions are asked for again until they arrive.
        if !self.is_leader()
            && self.view_change.flushing.is_none()
            && self.view_change.coordinator.is_none()
            && self.reliable.known_end > self.reliable.delivered
        {
            let end = self.reliable.known_end;
            self.nak_gap(now, Some(end));
        }
        // The leader gossips its Id now and then (Heal and Exchange).
        if self.is_leader() && now >= self.heal.next_gossip {
            let jitter = Duration::from_millis(self.rng.next_u32() as u64 % 100);
            self.heal.next_gossip = now
                .saturating_add(self.config.suspect_timeout)
                .saturating_add(jitter);
            if self.view_change.coordinator.is_none() {
                self.gossip();
            }
            self.maybe_go_back(now);
        }
        if self.is_leader() {
            self.check_exchange_merged(now);
        }
        // The leader suspects silent members.
        if let Some(s) = self.reliable.sequencer.as_ref() {
            if self.view_change.coordinator.is_none() && self.view_change.flushing.is_none() {
                let timeout = self.config.suspect_timeout;
                let my = usize::from(self.rank);
                // In an overlay view the leader hears only the members that report to it
                // directly; the others are suspected by their overlay parents.
                let silent: Vec<MemberId> = s
                    .heard
                    .iter()
                    .enumerate()
                    .filter(|(r, t)| {
                        *r != my && s.direct[*r] && now.saturating_duration_since(**t) > timeout
                    })
                    .filter_map(|(r, _)| self.member_at(r as u16).map(|m| m.id))
                    .collect();
                for id in silent {
                    if !self.view_change.change_wanted.iter().any(|(m, _)| *m == id) {
                        self.view_change
                            .change_wanted
                            .push((id, RemovalReason::Suspected));
                    }
                }
                self.check_lagging(now);
                self.maybe_start_change(now);
            }
        }
        // Coordinator: deadlines exclude the silent and start again.
        if let Some(c) = self.view_change.coordinator.as_ref() {
            if now >= c.deadline {
                self.restart_flush(now);
            } else {
                self.progress_flush(now);
            }
        }
        if self.view_change.flushing.is_some() {
            self.progress_flush(now);
        }
        if self
            .view_change
            .left_out
            .as_ref()
            .is_some_and(|t| now >= t.at)
        {
            self.left_out_turn(now);
        }
        if let Some(t) = self.tree.tree_wait.as_ref() {
            if now >= t.deadline {
                self.progress_tree(now, true);
            }
        }
        self.tree_flush_tick(now);
        self.overlay_tick(now);
        // A member suspects the leader (or the coordinator it follows) and takes over when
        // no lower rank answers its probes, or when its turn comes (`overlay.rs`).
        if !self.is_leader() && self.view_change.coordinator.is_none() {
            self.takeover_tick(now);
        }
    }

    /// The earliest deadline of any concern: what `on_tick` must be called for next.
    pub(super) fn next_timeout(&self) -> Option<Timestamp> {
        let mut t: Option<Timestamp> = self.pairs.poll_timeout();
        let mut consider = |x: Timestamp| {
            t = Some(t.map_or(x, |y| y.min(x)));
        };
        if let Some(j) = self.joining.as_ref() {
            consider(j.next_try);
        }
        if self.view.is_some() && !self.expelled {
            consider(self.liveness.next_heartbeat);
            if self.rank == 0 {
                consider(self.heal.next_gossip);
            }
            if self.rank != 0
                && self.reliable.known_end > self.reliable.delivered
                && self.view_change.flushing.is_none()
                && self.view_change.coordinator.is_none()
            {
                // A NAK retry (on_tick sends one, which moves last_nak on).
                let retry = interval::nak_retry(&self.config);
                consider(
                    self.reliable
                        .last_nak
                        .map_or(self.liveness.next_heartbeat, |t| t.saturating_add(retry)),
                );
            }
            if let Some(c) = self.view_change.coordinator.as_ref() {
                consider(c.deadline);
                consider(c.resend_at);
            }
            if let Some(t) = self.view_change.left_out.as_ref() {
                consider(t.at);
            }
            // Only with a view: `on_tick` runs the tree flush's deadlines only then.
            if let Some(t) = self.view_change.tree.as_ref() {
                consider(t.next_deadline());
            }
        }
        if let Some(a) = self.view_change.announce.as_ref() {
            consider(a.resend_at);
        }
        if let Some(tw) = self.tree.tree_wait.as_ref() {
            consider(tw.deadline);
        }

        for o in &self.old_views {
            consider(o.expires);
        }
        t
    }
}
