//! Heartbeats: what members tell the leader (delivered positions, load, failures) and the
//! leader tells members (positions given), the stable point, gear feedback to the
//! controller, and removing members that lag too far behind.
//!
//! Owns: `Liveness` (when the leader was last heard, the next heartbeat, the overlay state).
//! Suspicion of the silent is decided by the tick (`timers.rs`) from what this file records.
//! In views of more than `OVERLAY_MIN` members, members report to their overlay parent
//! instead of heartbeating to the leader, and the leader's heartbeat goes down the tree
//! (`overlay.rs`).

use super::overlay::Overlay;
use super::GroupMember;
use crate::event::RemovalReason;
use crate::id::MemberId;
use crate::wire::Msg;
use cohort_core::Timestamp;
use cohort_gears::controller::{Observation, ReceiverFeedback};

/// Heartbeats: when the leader was last heard, when this member sends its next heartbeat,
/// and its place in the overlay of a large view (`overlay.rs`).
#[derive(Default)]
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct Liveness {
    pub(super) leader_heard: Timestamp,
    pub(super) next_heartbeat: Timestamp,
    pub(super) overlay: Overlay,
}

impl GroupMember {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_heartbeat(
        &mut self,
        now: Timestamp,
        rank: u16,
        delivered: u64,
        ordered: u64,
        stable: u64,
        load: u8,
        failures: u64,
    ) {
        if let Some(s) = self.reliable.sequencer.as_mut() {
            let r = usize::from(rank);
            s.acked[r] = s.acked[r].max(delivered.min(s.next_order));
            s.loads[r] = (load, failures);
            if let Some((_, true)) = self.reliable.advance_stable(self.rank) {
                self.drain_sequencer(now);
            }
            return;
        }
        if rank != 0 {
            return;
        }
        // From the leader.
        if self.view_change.flushing.is_none() && self.view_change.coordinator.is_none() {
            let stable = stable.min(self.reliable.delivered);
            if stable > self.reliable.stable {
                self.reliable.stable = stable;
                self.reliable.log = self.reliable.log.split_off(&stable);
            }
            if ordered > self.reliable.delivered
                && self.reliable.delivered == self.reliable.delivered_at_leader_heartbeat
            {
                self.reliable.known_end = self.reliable.known_end.max(ordered);
                self.nak_gap(now, Some(ordered));
            }
            self.reliable.delivered_at_leader_heartbeat = self.reliable.delivered;
        }
        self.observe_feedback(now, load, failures);
    }

    pub(super) fn observe_feedback(&mut self, now: Timestamp, load: u8, failures: u64) {
        let local_failures = self.keys.as_ref().map_or(0, |k| k.failures());
        let local_load = self.load;
        if let Some(c) = self.controller.as_mut() {
            let _ = c.observe(&Observation {
                now,
                local_load,
                local_auth_failures: local_failures,
                receiver: Some(ReceiverFeedback {
                    load: f32::from(load) / 255.0,
                    auth_failures: failures,
                }),
            });
        }
    }

    /// Leader: when the backlog has held ordering back for a suspicion timeout, the members
    /// whose acknowledgements hold the stable point back are removed as lagging.
    pub(super) fn check_lagging(&mut self, now: Timestamp) {
        let Some(s) = self.reliable.sequencer.as_ref() else {
            return;
        };
        let Some(since) = s.stalled_since else {
            return;
        };
        if now.saturating_duration_since(since) < self.config.suspect_timeout {
            return;
        }
        let my = usize::from(self.rank);
        let slowest = s
            .acked
            .iter()
            .enumerate()
            .filter(|(r, _)| *r != my)
            .map(|(_, a)| *a)
            .min()
            .unwrap_or(0);
        // The member holding the slowest position (in an overlay view a subtree's report
        // names the member that holds its minimum).
        let mut lagging: Vec<MemberId> = s
            .acked
            .iter()
            .enumerate()
            .filter(|(r, a)| *r != my && **a == slowest && s.next_order > **a)
            .map(|(r, _)| s.holder[r])
            .filter(|h| usize::from(*h) != my)
            .filter_map(|h| self.member_at(h).map(|m| m.id))
            .collect();
        lagging.sort_unstable();
        lagging.dedup();
        for id in lagging {
            if !self.view_change.change_wanted.iter().any(|(m, _)| *m == id) {
                self.view_change
                    .change_wanted
                    .push((id, RemovalReason::Lagged));
            }
        }
        self.maybe_start_change(now);
    }

    pub(super) fn send_heartbeat(&mut self, now: Timestamp) {
        let load = (self.load * 255.0) as u8;
        let failures = self.keys.as_ref().map_or(0, |k| k.failures());
        let advanced = self.reliable.advance_stable(self.rank);
        if let (Some((stable, _)), Some(s)) = (advanced, self.reliable.sequencer.as_ref()) {
            let (max_load, sum_failures) = s.loads.iter().fold((0u8, 0u64), |(l, f), (ml, mf)| {
                (l.max(*ml), f.saturating_add(*mf))
            });
            let msg = Msg::Heartbeat {
                delivered: self.reliable.delivered,
                ordered: s.next_order,
                stable,
                load: max_load.max(load),
                failures: sum_failures,
            };
            let packet = self.tree_broadcast(&msg);
            if let Some(s) = self.reliable.sequencer.as_mut() {
                s.last_heartbeat = packet;
            }
            self.observe_feedback(now, max_load, sum_failures);
        } else if self.overlay_active() && self.view_change.flushing.is_none() {
            self.send_report(now);
        } else if self.following_tree_flush() {
            // A flush on the overlay: the answers going up tell the coordinator this member
            // lives; a heartbeat from every member would cost it one datagram each.
        } else if let Some(view) = self.view.as_ref() {
            let to = match self.view_change.flushing.as_ref() {
                Some(f) => view.members.get(usize::from(f.coordinator)).map(|m| m.addr),
                None => Some(view.leader().addr),
            };
            let msg = Msg::Heartbeat {
                delivered: self.reliable.delivered,
                ordered: 0,
                stable: 0,
                load,
                failures,
            };
            if let Some(to) = to {
                self.send_msg(to, &msg);
            }
        }
        self.reliable.last_ack_sent = self.reliable.delivered;
    }
}
