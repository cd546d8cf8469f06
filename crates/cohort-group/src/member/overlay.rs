//! The overlay: an implicit tree over the view's ranks that carries failure detection up to
//! the leader and the leader's broadcasts down to the members, in views of more than
//! [`OVERLAY_MIN`] members; and the fast takeover (probing the ranks below) when the
//! leader falls silent.
//!
//! ```text
//!   rank 0 (leader) ── children 1..=R                  (R = ROOT_FANOUT, 2)
//!   rank r >= 1     ── children R+16(r-1)+1 ..= R+16r (< n)
//!   parent of r     ── 0 for r <= R, else (r-R-1)/16 + 1
//! ```
//!
//! The root has few children (issue 14): what the leader sends down the tree once per
//! child (a heartbeat, a Flush, an Install of a kilobyte or more at 10,000 members) costs
//! it 2 copies instead of 16, for one more level below it.
//!
//! Up: each member sends a `Report` for its subtree (the lowest delivered position and who
//! holds it, the highest load, the summed failures, and the suspected ranks) to its parent
//! every heartbeat interval, and at once when a suspicion is new. Down: the leader seals its
//! Heartbeat and Orders, and relays submissions, once (dest `BROADCAST`) and sends the packet
//! to its children; every member passes the same bytes on to its own children. A member that
//! has not heard the leader for a suspicion timeout (plus one heartbeat interval per level,
//! so its ancestors go first) tells the leader its parent is silent (`Orphaned`) and reports
//! to the leader directly until the next view; the leader then sends its broadcasts to it
//! directly too.
//!
//! Owns: `Overlay` (this member's children's latest reports, whether it is orphaned, what
//! it last reported, the takeover probe round), reset when the view changes. The leader's
//! side (who reports directly, the last heartbeat packet) lives in the sequencer
//! (`reliable.rs`). It may not start a view change itself except through the leader's
//! `change_wanted` and `maybe_start_change`, or a takeover through `start_coordinating`.

use super::flush::Change;
use super::output::{Destination, BROADCAST};
use super::GroupMember;
use crate::event::{Drop, RemovalReason};
use crate::id::ViewId;
use crate::wire::{Msg, MAX_SUSPECTS};
use cohort_core::Timestamp;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

/// Children per member in the overlay (but the root).
pub const FANOUT: usize = 16;
/// Children of the root (the leader) in the overlay.
pub const ROOT_FANOUT: usize = 2;
/// Views of more than this many members use the overlay; smaller views heartbeat directly
/// between each member and the leader.
pub const OVERLAY_MIN: usize = 64;
/// Members of rank up to this many probe the ranks below them and take over from a silent
/// leader when none answers; higher ranks wait their turn.
pub const PROBE_RANKS: u16 = 16;
/// Ranks whose turn to take over is more than this many suspicion timeouts away probe
/// instead once that many have passed (`takeover_tick`).
pub const STALE_TURNS: u32 = 3;

/// Whether a view of `n` members uses the overlay.
pub(super) fn active(n: usize) -> bool {
    n > OVERLAY_MIN
}

/// The overlay parent of `rank` (none for the root, rank 0).
pub(super) fn parent(rank: u16) -> Option<u16> {
    let r = usize::from(rank);
    match r {
        0 => None,
        _ if r <= ROOT_FANOUT => Some(0),
        _ => Some(((r - ROOT_FANOUT - 1) / FANOUT + 1) as u16),
    }
}

/// The first child of `rank` (ranks below it are not its children), and one past the last,
/// before clipping to the view.
fn child_span(rank: usize) -> (usize, usize) {
    if rank == 0 {
        (1, ROOT_FANOUT + 1)
    } else {
        let first = ROOT_FANOUT + (rank - 1) * FANOUT + 1;
        (first, first + FANOUT)
    }
}

/// The overlay children of `rank` in a view of `n` members.
pub(super) fn children(rank: u16, n: usize) -> Range<u16> {
    let (first, end) = child_span(usize::from(rank));
    first.min(n) as u16..end.min(n) as u16
}

/// How many hops `rank` is below the root.
pub(super) fn depth(rank: u16) -> u32 {
    let mut d = 0;
    let mut r = rank;
    while let Some(p) = parent(r) {
        d += 1;
        r = p;
    }
    d
}

/// Whether `rank` lies in the subtree rooted at `root` (itself included).
pub(super) fn in_subtree(root: u16, rank: u16) -> bool {
    let mut r = rank;
    loop {
        if r == root {
            return true;
        }
        if r < root {
            return false;
        }
        match parent(r) {
            Some(p) => r = p,
            None => return false,
        }
    }
}

/// The ranks of the subtree rooted at `root` in a view of `n` members, level by level: each
/// level is one contiguous range.
pub(super) fn subtree(root: u16, n: usize) -> impl Iterator<Item = u16> {
    let mut level = Some(usize::from(root)..usize::from(root) + 1);
    std::iter::from_fn(move || {
        let l = level.take()?;
        if l.start >= n {
            return None;
        }
        let r = l.start..l.end.min(n);
        // The children of a contiguous range of ranks are one contiguous range.
        level = Some(child_span(r.start).0..child_span(r.end - 1).1);
        Some(r)
    })
    .flatten()
    .map(|r| r as u16)
}

/// A child's latest report.
#[derive(Clone)]
pub(super) struct ChildReport {
    pub(super) heard: Timestamp,
    pub(super) delivered: u64,
    pub(super) holder: u16,
    pub(super) load: u8,
    pub(super) failures: u64,
    pub(super) suspects: Vec<u16>,
}

/// A takeover probe round: the lower ranks asked whether they live, and who answered.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct Probing {
    pub(super) started: Timestamp,
    pub(super) asked: Vec<u16>,
    pub(super) answered: BTreeSet<u16>,
}

/// This member's overlay state in one view.
#[derive(Default)]
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct Overlay {
    /// The view this state belongs to; another view starts afresh.
    pub(super) view: Option<ViewId>,
    /// The children's latest reports, by `child - first child`.
    pub(super) children: Vec<ChildReport>,
    /// The parent fell silent: reports go to the leader directly until the next view.
    pub(super) orphaned: bool,
    /// Suspicions already sent up.
    pub(super) sent_suspects: BTreeSet<u16>,
    /// The delivered position last reported up.
    pub(super) sent_delivered: u64,
    /// The takeover probe round, if one runs.
    pub(super) probing: Option<Probing>,
}

/// How long a takeover candidate waits for the ranks it probed: three heartbeat intervals.
pub(super) fn probe_wait(heartbeat: Duration) -> Duration {
    heartbeat * 3
}

impl GroupMember {
    /// Whether the installed view uses the overlay.
    pub(super) fn overlay_active(&self) -> bool {
        self.view.as_ref().is_some_and(|v| active(v.members.len()))
    }

    /// This member's overlay state for the installed view (fresh after a view change).
    pub(super) fn overlay_mut(&mut self, now: Timestamp) -> &mut Overlay {
        let view = self.view.as_ref().map(|v| v.id);
        let n = self.view.as_ref().map_or(0, |v| v.members.len());
        if self.liveness.overlay.view != view {
            let kids = children(self.rank, n);
            self.liveness.overlay = Overlay {
                view,
                children: kids
                    .map(|c| ChildReport {
                        heard: now,
                        delivered: 0,
                        holder: c,
                        load: 0,
                        failures: 0,
                        suspects: Vec::new(),
                    })
                    .collect(),
                ..Overlay::default()
            };
        }
        &mut self.liveness.overlay
    }

    /// Where this member's own broadcasts down the tree go: its children (the leader also
    /// sends to the members that report to it directly).
    fn tree_targets(&self) -> Vec<SocketAddr> {
        let Some(view) = self.view.as_ref() else {
            return Vec::new();
        };
        let n = view.members.len();
        let mut ranks: Vec<u16> = children(self.rank, n).collect();
        if let Some(s) = self.reliable.sequencer.as_ref() {
            ranks.extend(s.orphans.iter().copied());
        }
        ranks
            .into_iter()
            .filter_map(|r| view.members.get(usize::from(r)).map(|m| m.addr))
            .collect()
    }

    /// Sends a sealed broadcast packet down the tree: to this member's overlay children
    /// (and, at the leader, to the members reporting directly); once to the whole group
    /// when the carrier fans out.
    pub(super) fn send_down(&mut self, packet: &[u8]) {
        // A carrier that fans out delivers to every member: no tree (issue 15).
        if self.config.carrier_fans_out {
            self.out.push_group(packet);
            return;
        }
        let to: Vec<Destination> = self
            .tree_targets()
            .into_iter()
            .map(Destination::Member)
            .collect();
        self.out.push_copies(to, packet);
    }

    /// Passes a packet that came down the tree (`packet`, carrying `msg`) on: an Install of
    /// a view change that ran on the overlay here goes to this member's children in that
    /// change's flush tree (which goes around the members it leaves out); anything else to
    /// its overlay children.
    pub(super) fn send_down_for(&mut self, packet: &[u8], msg: &Msg) {
        let install_view = match msg {
            Msg::Install(install) => Some(install.view),
            Msg::InstallChunk { view, .. } => Some(*view),
            _ => None,
        };
        if let Some(view) = install_view {
            if let Some(addrs) = self.flush_tree_addrs(view) {
                self.out
                    .push_copies(addrs.into_iter().map(Destination::Member), packet);
                return;
            }
        }
        self.send_down(packet);
    }

    /// The leader: seals `msg` once for everyone and sends it down the tree when the view
    /// uses the overlay, to every member otherwise. Returns the packet sent down the tree.
    pub(super) fn tree_broadcast(&mut self, msg: &Msg) -> Option<Vec<u8>> {
        if !self.overlay_active() {
            self.broadcast(msg);
            return None;
        }
        let packet = self.seal(BROADCAST, msg)?;
        self.send_down(&packet);
        Some(packet)
    }

    /// Whether a packet from `sender`, addressed to everyone and carrying `msg`, came down
    /// the tree and goes on to this member's children: the leader's Heartbeat, Orders and
    /// Installs (those the same for every survivor, `install.rs`, whole or in parts), and
    /// the submissions it relays.
    pub(super) fn forwards(&self, sender: u16, msg: &Msg) -> bool {
        if self.rank == 0 || !self.overlay_active() || self.config.carrier_fans_out {
            return false;
        }
        match msg {
            Msg::Heartbeat { .. }
            | Msg::Orders { .. }
            | Msg::Install(_)
            | Msg::InstallChunk { .. } => sender == 0,
            Msg::Submit { .. } => true,
            _ => false,
        }
    }

    /// This member's report for its subtree: its own delivered position and load folded with
    /// its children's latest reports; children silent for a suspicion timeout are suspected.
    fn subtree_report(&mut self, now: Timestamp) -> Msg {
        let timeout = self.config.suspect_timeout;
        let my_rank = self.rank;
        let delivered = self.reliable.delivered;
        let load = (self.load * 255.0) as u8;
        let failures = self.keys.as_ref().map_or(0, |k| k.failures());
        let first = child_span(usize::from(my_rank)).0 as u16;
        let o = self.overlay_mut(now);
        let mut min = (delivered, my_rank);
        let mut max_load = load;
        let mut sum = failures;
        let mut suspects = BTreeSet::new();
        for (i, c) in o.children.iter().enumerate() {
            if (c.delivered, c.holder) < min {
                min = (c.delivered, c.holder);
            }
            max_load = max_load.max(c.load);
            sum = sum.saturating_add(c.failures);
            if now.saturating_duration_since(c.heard) > timeout {
                suspects.insert(first + i as u16);
            }
            suspects.extend(c.suspects.iter().copied());
        }
        let suspects: Vec<u16> = suspects.into_iter().take(MAX_SUSPECTS).collect();
        o.sent_suspects.extend(suspects.iter().copied());
        o.sent_delivered = min.0;
        Msg::Report {
            delivered: min.0,
            holder: min.1,
            load: max_load,
            failures: sum,
            suspects,
        }
    }

    /// A member (not the leader) in an overlay view: sends its subtree's report to its
    /// parent, or to the leader when orphaned or a child of the leader.
    pub(super) fn send_report(&mut self, now: Timestamp) {
        let msg = self.subtree_report(now);
        let orphaned = self.overlay_mut(now).orphaned;
        let to = match parent(self.rank) {
            Some(p) if !orphaned => p,
            _ => 0,
        };
        self.send_to_rank(to, &msg);
    }

    /// A report from the member at `rank`: at the leader it moves the acknowledgements of
    /// that member's subtree and brings its suspicions; elsewhere it is kept for this
    /// member's own report, which goes up at once if it brings a new suspicion.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_report(
        &mut self,
        now: Timestamp,
        rank: u16,
        delivered: u64,
        holder: u16,
        load: u8,
        failures: u64,
        suspects: Vec<u16>,
    ) {
        let n = self.view.as_ref().map_or(0, |v| v.members.len());
        if !active(n)
            || usize::from(holder) >= n
            || !in_subtree(rank, holder)
            || suspects
                .iter()
                .any(|s| *s == rank || usize::from(*s) >= n || !in_subtree(rank, *s))
        {
            self.counters.count(Drop::Unexpected);
            return;
        }
        if self.is_leader() {
            self.on_report_at_leader(now, rank, delivered, holder, load, failures, suspects);
            return;
        }
        if parent(rank) != Some(self.rank) {
            self.counters.count(Drop::Unexpected);
            return;
        }
        let first = children(self.rank, n).start;
        let flow = (self.flow_window() / 4).max(1);
        let o = self.overlay_mut(now);
        let Some(c) = o.children.get_mut(usize::from(rank - first)) else {
            return;
        };
        *c = ChildReport {
            heard: now,
            delivered: c.delivered.max(delivered),
            holder: if delivered >= c.delivered {
                holder
            } else {
                c.holder
            },
            load,
            failures,
            suspects,
        };
        let new_suspicion = c.suspects.iter().any(|s| !o.sent_suspects.contains(s));
        let sent = o.sent_delivered;
        let min = o
            .children
            .iter()
            .map(|c| c.delivered)
            .min()
            .unwrap_or(u64::MAX)
            .min(self.reliable.delivered);
        // Suspicions go up at once; so do acknowledgements that free a quarter of the flow
        // window, so the sequencer is paced by deliveries, not by the heartbeat timer.
        if new_suspicion || min >= sent.saturating_add(flow) {
            self.send_report(now);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_report_at_leader(
        &mut self,
        now: Timestamp,
        rank: u16,
        delivered: u64,
        holder: u16,
        load: u8,
        failures: u64,
        suspects: Vec<u16>,
    ) {
        let n = self.view.as_ref().map_or(0, |v| v.members.len());
        let Some(s) = self.reliable.sequencer.as_mut() else {
            return;
        };
        let newly_direct = !s.direct[usize::from(rank)];
        if newly_direct {
            s.direct[usize::from(rank)] = true;
            s.orphans.push(rank);
        }
        let delivered = delivered.min(s.next_order);
        // The subtree's minimum bounds every member of it from below.
        for r in subtree(rank, n) {
            let r = usize::from(r);
            if s.acked[r] < delivered {
                s.acked[r] = delivered;
                s.holder[r] = holder;
            }
        }
        s.loads[usize::from(rank)] = (load, failures);
        if newly_direct {
            // A member reporting directly hears the leader's broadcasts directly too; the
            // latest heartbeat tells it at once that the leader lives.
            if let (Some(p), Some(m)) = (s.last_heartbeat.clone(), self.member_at(rank)) {
                self.out.push(m.addr, &p);
            }
        }
        for r in suspects {
            self.suspect_rank(r);
        }
        if let Some((_, true)) = self.reliable.advance_stable(self.rank) {
            self.drain_sequencer(now);
        }
        self.maybe_start_change(now);
    }

    /// The leader: a member says its overlay parent fell silent. The parent is suspected
    /// unless the leader hears it directly.
    pub(super) fn on_orphaned(&mut self, now: Timestamp, rank: u16, parent_rank: u16) {
        if !self.is_leader() || !self.overlay_active() || parent(rank) != Some(parent_rank) {
            self.counters.count(Drop::Unexpected);
            return;
        }
        let timeout = self.config.suspect_timeout;
        let Some(s) = self.reliable.sequencer.as_mut() else {
            return;
        };
        let p = usize::from(parent_rank);
        let heard_directly = (parent(parent_rank) == Some(0) || s.direct[p])
            && now.saturating_duration_since(s.heard[p]) <= timeout;
        if !s.direct[usize::from(rank)] {
            s.direct[usize::from(rank)] = true;
            s.orphans.push(rank);
            if let (Some(pk), Some(m)) = (s.last_heartbeat.clone(), self.member_at(rank)) {
                self.out.push(m.addr, &pk);
            }
        }
        if !heard_directly {
            self.suspect_rank(parent_rank);
            self.maybe_start_change(now);
        }
    }

    /// The leader: `rank` is to be removed as suspected.
    fn suspect_rank(&mut self, rank: u16) {
        if rank == self.rank {
            return;
        }
        let Some(m) = self.member_at(rank) else {
            return;
        };
        if !self
            .view_change
            .change_wanted
            .iter()
            .any(|(x, _)| *x == m.id)
        {
            self.view_change
                .change_wanted
                .push((m.id, RemovalReason::Suspected));
        }
    }

    /// A member in an overlay view, on the tick: suspicions of silent children go up at
    /// once; a member that has not heard the leader for a suspicion timeout plus one
    /// heartbeat interval per level below the root tells the leader its parent is silent
    /// and reports to the leader directly from then on.
    pub(super) fn overlay_tick(&mut self, now: Timestamp) {
        if self.is_leader()
            || !self.overlay_active()
            || self.view_change.flushing.is_some()
            || self.view_change.coordinator.is_some()
        {
            return;
        }
        let timeout = self.config.suspect_timeout;
        let first = child_span(usize::from(self.rank)).0 as u16;
        let o = self.overlay_mut(now);
        let new_silent = o.children.iter().enumerate().any(|(i, c)| {
            now.saturating_duration_since(c.heard) > timeout
                && !o.sent_suspects.contains(&(first + i as u16))
        });
        if new_silent {
            self.send_report(now);
        }
        let Some(p) = parent(self.rank) else {
            return;
        };
        if p == 0 || self.liveness.overlay.orphaned {
            return;
        }
        let wait = timeout + self.config.heartbeat_interval * depth(self.rank);
        if now.saturating_duration_since(self.liveness.leader_heard) > wait {
            self.liveness.overlay.orphaned = true;
            self.send_to_rank(0, &Msg::Orphaned { parent: p });
            self.send_report(now);
        }
    }

    /// A lower-ranked member probing whether this one lives.
    pub(super) fn on_probe(&mut self, rank: u16) {
        if rank <= self.rank {
            self.counters.count(Drop::Unexpected);
            return;
        }
        self.send_to_rank(rank, &Msg::ProbeAck);
    }

    /// A probed member lives.
    pub(super) fn on_probe_ack(&mut self, rank: u16) {
        match self.liveness.overlay.probing.as_mut() {
            Some(p) if p.asked.contains(&rank) => {
                p.answered.insert(rank);
            }
            _ => self.counters.count(Drop::Unexpected),
        }
    }

    /// One round of probes (`takeover_tick`): starts a round asking `asked` when none is
    /// under way or the last one ended answered; when a round ends with no answer, the
    /// ranks it asked (`Some`), for the takeover to leave out. An empty `asked` counts as
    /// unanswered.
    fn probe_round(&mut self, now: Timestamp, asked: Vec<u16>) -> Option<Vec<u16>> {
        let wait = probe_wait(self.config.heartbeat_interval);
        let _ = self.overlay_mut(now);
        let round_done = self
            .liveness
            .overlay
            .probing
            .as_ref()
            .map(|p| now.saturating_duration_since(p.started) >= wait);
        if round_done == Some(false) {
            return None;
        }
        if let Some(p) = self.liveness.overlay.probing.take() {
            if p.answered.is_empty() {
                return Some(p.asked);
            }
        }
        if asked.is_empty() {
            return Some(Vec::new());
        }
        for r in &asked {
            self.send_to_rank(*r, &Msg::Probe);
        }
        self.liveness.overlay.probing = Some(Probing {
            started: now,
            asked,
            answered: BTreeSet::new(),
        });
        None
    }

    /// A member (not coordinating) on the tick: takes over when the leader (or the
    /// coordinator it follows) has been silent long enough.
    ///
    /// Ranks 1..=[`PROBE_RANKS`]: after a suspicion timeout of silence, rank r probes ranks
    /// 1..r and takes over if none answers within [`probe_wait`], removing the leader (and
    /// the coordinator it followed) and every rank that did not answer; if one answers,
    /// it probes again (that rank should take over first). Higher ranks wait their turn:
    /// `suspect_timeout × (1 + r / PROBE_RANKS)`; when that is more than [`STALE_TURNS`]
    /// timeouts, they probe the leader, the coordinator they follow and the probing ranks
    /// after `STALE_TURNS` timeouts instead, and take over if none answers (the group went
    /// on without them). Every rank also keeps the old turn,
    /// `suspect_timeout × r`, as a last resort (a lower rank that answers probes but does
    /// not take over, say because it still hears the leader).
    pub(super) fn takeover_tick(&mut self, now: Timestamp) {
        let silence = now.saturating_duration_since(self.liveness.leader_heard);
        let timeout = self.config.suspect_timeout;
        let rank = self.rank.max(1);
        if silence <= timeout {
            self.liveness.overlay.probing = None;
            return;
        }
        let mut take_over = silence > timeout * u32::from(rank);
        let mut silent: Vec<u16> = Vec::new();
        let turn = 1 + u32::from(rank / PROBE_RANKS);
        // Once the last resort came, nobody probes any more.
        if !take_over && rank <= PROBE_RANKS {
            // Ranks below this one: if one answers, it should take over first.
            if let Some(unanswered) = self.probe_round(now, (1..rank).collect()) {
                take_over = true;
                silent = unanswered;
            }
        } else if !take_over && turn > STALE_TURNS && silence > timeout * STALE_TURNS {
            // A high rank whose turn is far off: the leader, the coordinator it follows and
            // the probing ranks are asked whether they are still in this view. None
            // answering means the group went on without this member (its Install or
            // LeftOut was lost) or they are all gone: either way it takes over now, and
            // the members it reaches form a view that the heal merges back. Waiting for
            // its turn left live members in an old view for minutes (the 3,000-member
            // sweep: rank 2,282 of a view whose members had all moved on would have waited
            // 143 s). One that answers is in this view: no takeover then but the old turn.
            let followed = self.view_change.flushing.as_ref().map(|f| f.coordinator);
            let mut asked: Vec<u16> = std::iter::once(0)
                .chain(followed)
                .chain(1..=PROBE_RANKS)
                .filter(|r| *r < self.rank)
                .collect();
            asked.sort_unstable();
            asked.dedup();
            if let Some(unanswered) = self.probe_round(now, asked) {
                take_over = true;
                silent = unanswered;
            }
        } else {
            take_over |= silence > timeout * turn;
        }
        if !take_over {
            return;
        }
        self.liveness.overlay.probing = None;
        let Some(view) = self.view.clone() else {
            return;
        };
        let followed = self
            .view_change
            .flushing
            .as_ref()
            .map_or(0, |f| f.coordinator);
        let mut removed = vec![(view.members[0].id, RemovalReason::Suspected)];
        for r in std::iter::once(followed).chain(silent) {
            if r == 0 || r == self.rank {
                continue;
            }
            if let Some(m) = view.members.get(usize::from(r)) {
                if !removed.iter().any(|(x, _)| *x == m.id) {
                    removed.push((m.id, RemovalReason::Suspected));
                }
            }
        }
        // Every other member survives: the leader, the coordinator followed and the ranks
        // that did not answer the probes are the ones left out.
        let change = Change {
            rekey: self.config.rekey_policy.on_membership_change,
            ..Change::removing(&view, removed, now)
        };
        self.start_coordinating(now, change);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_and_children_agree() {
        let n = 1000;
        for r in 0..n as u16 {
            for c in children(r, n) {
                assert_eq!(parent(c), Some(r));
            }
        }
        assert_eq!(children(0, n), 1..3);
        assert_eq!(children(1, n), 3..19);
        assert_eq!(children(2, n), 19..35);
        assert_eq!(children(3, n), 35..51);
        assert_eq!(children(62, n), 979..995);
        assert_eq!(children(63, n), 995..1000);
        assert!(children(64, n).is_empty());
        assert_eq!(depth(0), 0);
        assert_eq!(depth(2), 1);
        assert_eq!(depth(3), 2);
        assert_eq!(depth(34), 2);
        assert_eq!(depth(35), 3);
        assert_eq!(depth(547), 4);
    }

    #[test]
    fn a_subtree_is_every_rank_that_descends_from_its_root() {
        let n = 1000;
        for root in [0u16, 1, 5, 16, 17, 40, 62, 999] {
            let listed: Vec<u16> = subtree(root, n).collect();
            let walked: Vec<u16> = (0..n as u16).filter(|r| in_subtree(root, *r)).collect();
            let mut sorted = listed.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, walked, "root {root}");
            assert_eq!(listed[0], root);
        }
        assert_eq!(subtree(0, n).count(), n);
        assert_eq!(subtree(1, n).count(), 1 + 16 + 256 + 453);
    }
}
