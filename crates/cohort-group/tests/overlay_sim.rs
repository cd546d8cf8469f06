//! Failure detection over the overlay (views of more than 64 members), in the simulator with
//! 5 ms links and default timers (heartbeat 100 ms, suspicion 1 s, flush 500 ms): the
//! leader's datagrams per second do not grow with the group, a crashed interior member and a
//! crashed leaf are removed, and a crashed leader with its three next ranks is replaced
//! without waiting rank × suspicion timeout.
//!
//! Not speed tests: every bound is on simulated time or on datagram counts, which the
//! simulator fixes; nothing here reads a clock.
mod support;

use cohort_core::{Machine, Timestamp, Transmit};
use cohort_group::lkh::LkhRekeyStats;
use cohort_group::{
    Channel, Drop, GroupConfig, GroupEvent, GroupMember, MemberId, RekeyMethod, RemovalReason,
};
use cohort_sim::{DuplicateRule, Loss, NodeId, ReorderRule, Sim};
use rand_core::RngCore;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

/// A member that counts the datagrams it sends and receives, and drops its events.
struct Counted {
    member: GroupMember,
    sent: u64,
    /// Bytes of the datagrams it sent.
    sent_bytes: u64,
    received: u64,
    /// Reliable messages delivered.
    delivered: u64,
    /// Views installed.
    views: u64,
    /// Members reported removed as suspected.
    suspected: u64,
    /// Members reported removed because they left.
    left: u64,
}

impl Machine for Counted {
    type Event = GroupEvent;
    fn handle_datagram(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        self.received += 1;
        self.member.handle_datagram(now, from, data);
    }
    fn handle_timeout(&mut self, now: Timestamp) {
        self.member.handle_timeout(now);
    }
    fn poll_transmit(&mut self, now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
        let t = self.member.poll_transmit(now, buf)?;
        self.sent += 1;
        self.sent_bytes += t.size as u64;
        Some(t)
    }
    fn poll_timeout(&self) -> Option<Timestamp> {
        self.member.poll_timeout()
    }
    fn poll_event(&mut self) -> Option<GroupEvent> {
        // Events are not kept: the simulator would log every view every member installs
        // while hundreds of members join one by one (gigabytes). These tests read views.
        while let Some(e) = self.member.poll_event() {
            if let GroupEvent::Deliver {
                channel: Channel::Reliable,
                ..
            } = e
            {
                self.delivered += 1;
            }
            if let GroupEvent::View(_) = e {
                self.views += 1;
            }
            if let GroupEvent::Removed {
                reason: RemovalReason::Suspected,
                ..
            } = e
            {
                self.suspected += 1;
            }
            if let GroupEvent::Removed {
                reason: RemovalReason::Left,
                ..
            } = e
            {
                self.left += 1;
            }
        }
        None
    }
}

struct Big {
    sim: Sim<Counted>,
    nodes: Vec<NodeId>,
    ids: Vec<MemberId>,
    config: GroupConfig,
}

impl Big {
    /// Asserts that `members` hold one group key among them and, when `before` is given,
    /// that it is not that one (a fresh key). `what` names the case in the message.
    fn assert_one_key(
        &self,
        members: &BTreeSet<usize>,
        before: Option<Option<[u8; 8]>>,
        what: &str,
    ) {
        let keys: BTreeSet<_> = members
            .iter()
            .map(|i| self.sim.node(self.nodes[*i]).member.key_fingerprint())
            .collect();
        assert_eq!(keys.len(), 1, "{what}: one key among the members: {keys:?}");
        if let Some(before) = before {
            assert_ne!(
                keys.first().copied().flatten(),
                before,
                "{what}: a fresh key"
            );
        }
    }

    /// `n` members with default timers, started together, run until they share one view
    /// of all `n`.
    fn formed(seed: u64, n: usize) -> Big {
        Big::formed_with(seed, n, |_| {})
    }

    /// As [`Big::formed`], with `tune` applied to the default config.
    fn formed_with(seed: u64, n: usize, tune: impl Fn(&mut GroupConfig)) -> Big {
        Big::formed_but(seed, n, 0, tune)
    }

    /// As [`Big::formed_with`], with the last `spare` of the `n` nodes not started (they
    /// can join later, through [`Big::join`]).
    fn formed_but(seed: u64, n: usize, spare: usize, tune: impl Fn(&mut GroupConfig)) -> Big {
        let mut sim: Sim<Counted> = Sim::new(support::sim_config(seed));
        let identities: Vec<_> = (0..n).map(|i| support::identity(seed, i)).collect();
        let ids: Vec<MemberId> = identities.iter().map(|i| MemberId(i.public())).collect();
        let mut config = GroupConfig::new("overlay", ids.clone());
        tune(&mut config);
        let mut nodes = Vec::new();
        for ident in identities {
            let mut seed_bytes = [0u8; 32];
            sim.rng().fill_bytes(&mut seed_bytes);
            let config = config.clone();
            nodes.push(sim.add_node_with(|_, addr| {
                Counted {
                    member: GroupMember::new(
                        support::kit::provider(),
                        ident,
                        addr,
                        config,
                        seed_bytes,
                    )
                    .expect("member"),
                    sent: 0,
                    sent_bytes: 0,
                    received: 0,
                    delivered: 0,
                    views: 0,
                    suspected: 0,
                    left: 0,
                }
            }));
        }
        let mut big = Big {
            sim,
            nodes,
            ids,
            config,
        };
        // Member 0 founds the group; the others join through it, 100 every second. (With
        // every member a contact of every other, each would open pair channels to hundreds
        // of others; with all joining at once, a joiner the busy leader has not answered
        // within three suspicion timeouts founds a group of its own.)
        let founder = big.sim.addr(big.nodes[0]);
        for (i, x) in big.nodes.clone().into_iter().enumerate().take(n - spare) {
            let contacts: Vec<SocketAddr> = if i == 0 { Vec::new() } else { vec![founder] };
            big.sim
                .with_node(x, |node, now| node.member.start(now, &contacts));
            if i % 100 == 0 {
                big.run_for(Duration::from_secs(1));
            }
        }
        let all: BTreeSet<usize> = (0..n - spare).collect();
        big.wait_view(&all, Duration::from_secs(120))
            .expect("the group forms");
        big
    }

    /// The node index of the member at `rank` in node `at`'s view.
    fn at_rank(&self, at: usize, rank: usize) -> usize {
        let view = self.sim.node(self.nodes[at]).member.view().expect("view");
        let id = view.members[rank].id;
        self.ids.iter().position(|x| *x == id).expect("known")
    }

    fn rank_of(&self, i: usize) -> usize {
        let m = &self.sim.node(self.nodes[i]).member;
        m.view().and_then(|v| v.rank_of(&m.id())).expect("rank")
    }

    /// Whether the members `set` share one view of exactly `set`, none changing views.
    fn has_view(&self, set: &BTreeSet<usize>) -> bool {
        let want: BTreeSet<MemberId> = set.iter().map(|i| self.ids[*i]).collect();
        let mut id = None;
        for i in set {
            let m = &self.sim.node(self.nodes[*i]).member;
            if m.status().changing_view {
                return false;
            }
            let Some(v) = m.view() else {
                return false;
            };
            if *id.get_or_insert(v.id) != v.id || v.ids().collect::<BTreeSet<_>>() != want {
                return false;
            }
        }
        true
    }

    /// Runs until `set` shares a view of exactly `set`; the simulated time it took.
    fn wait_view(&mut self, set: &BTreeSet<usize>, bound: Duration) -> Result<Duration, String> {
        let start = self.sim.now();
        loop {
            if self.has_view(set) {
                return Ok(self.sim.now().saturating_duration_since(start));
            }
            if self.sim.now().saturating_duration_since(start) > bound {
                let mut sizes = std::collections::BTreeMap::new();
                for i in set {
                    let m = &self.sim.node(self.nodes[*i]).member;
                    let k = m.view().map(|v| (v.id.to_string(), v.members.len()));
                    *sizes.entry(k).or_insert(0usize) += 1;
                }
                return Err(format!(
                    "no view of {} members within {bound:?}; views held: {sizes:?}",
                    set.len()
                ));
            }
            let until = self.sim.now().saturating_add(Duration::from_millis(10));
            self.sim.run_until(until).map_err(|e| e.to_string())?;
        }
    }

    /// Starts node `i`, with the member at `contact` as its contact.
    fn join(&mut self, i: usize, contact: usize) {
        let contacts = [self.sim.addr(self.nodes[contact])];
        self.sim
            .with_node(self.nodes[i], |node, now| node.member.start(now, &contacts));
    }

    fn run_for(&mut self, d: Duration) {
        let until = self.sim.now().saturating_add(d);
        self.sim.run_until(until).expect("run");
    }

    /// (sent, received) by node `i` so far.
    fn counts(&self, i: usize) -> (u64, u64) {
        let node = self.sim.node(self.nodes[i]);
        (node.sent, node.received)
    }

    fn crash(&mut self, i: usize) {
        self.sim.crash(self.nodes[i]);
    }

    /// Loses every datagram from a member of `set` to a member outside it, while theirs to
    /// `set` still arrive; the returned count grows with each group packet (not pair channel
    /// or gossip) sent from one member of `set` to another.
    fn lose_datagrams_from(
        &mut self,
        set: &BTreeSet<usize>,
    ) -> std::sync::Arc<std::sync::Mutex<u64>> {
        let side: std::collections::HashMap<NodeId, bool> = (0..self.nodes.len())
            .map(|i| (self.nodes[i], set.contains(&i)))
            .collect();
        let among = std::sync::Arc::new(std::sync::Mutex::new(0u64));
        let tally = among.clone();
        self.sim
            .add_rule(cohort_sim::FnRule::new("one way", move |p, _| {
                match (side[&p.from], side[&p.to]) {
                    (true, false) => cohort_sim::Verdict::Drop,
                    (true, true) => {
                        if p.bytes.first() == Some(&cohort_gears::PACKET_VERSION) {
                            *tally.lock().expect("lock") += 1;
                        }
                        cohort_sim::Verdict::Pass
                    }
                    _ => cohort_sim::Verdict::Pass,
                }
            }));
        among
    }

    /// The counts of the last LKH rekey node `i` coordinated.
    fn lkh_stats(&self, i: usize) -> LkhRekeyStats {
        self.sim
            .node(self.nodes[i])
            .member
            .lkh_last_rekey()
            .cloned()
            .expect("an lkh rekey")
    }
}

/// Datagrams per second (sent + received) over `secs` of steady state, at the leader, at a
/// leaf (the last rank) and at an interior member (rank 1, which has 16 children).
fn steady_rates(big: &mut Big, secs: u64) -> (f64, f64, f64) {
    let n = big.ids.len();
    let leader = big.at_rank(0, 0);
    let leaf = big.at_rank(0, n - 1);
    let inner = big.at_rank(0, 1);
    // Let the view change's traffic die down first.
    big.run_for(Duration::from_secs(2));
    let before: Vec<(u64, u64)> = [leader, leaf, inner]
        .iter()
        .map(|i| big.counts(*i))
        .collect();
    big.run_for(Duration::from_secs(secs));
    let rate = |k: usize, i: usize| {
        let (s, r) = big.counts(i);
        ((s - before[k].0) + (r - before[k].1)) as f64 / secs as f64
    };
    (rate(0, leader), rate(1, leaf), rate(2, inner))
}

/// (a) at 128 and 512 members; (b) and (c) on the 512-member group, reused.
#[test]
fn a_large_group_detects_failures_at_a_cost_the_leader_can_bear() {
    let mut rates = Vec::new();
    let mut last = None;
    for (seed, n) in [(81u64, 128usize), (82, 512)] {
        let mut big = Big::formed(seed, n);
        rates.push(leader_rate(&mut big));
        reliable_messages_go_down_the_tree(&mut big);
        if n == 128 {
            under_loss_duplication_and_reordering(&mut big);
        }
        last = Some(big);
    }
    // The leader's rate does not grow with n (with direct heartbeats it would grow 2.5x).
    assert!(
        rates[1] <= rates[0] * 1.1,
        "the leader's rate grew with n: {rates:?}"
    );
    let mut big = last.expect("the 512-member group");
    interior_and_leaf_crash(&mut big);
    leader_and_next_three_crash(&mut big);
}

/// (a) Steady state: the leader's and a leaf's datagrams per second are bounded by
/// constants that do not depend on n. Heartbeat 100 ms: a leader with 2 children (the
/// overlay's root fan-out) sends 2 and receives 2 per interval, 40 a second; with direct
/// heartbeats a 512-member leader would handle 10,220.
fn leader_rate(big: &mut Big) -> f64 {
    let n = big.ids.len();
    let (leader, leaf, inner) = steady_rates(big, 5);
    eprintln!("n {n}: datagrams/s leader {leader:.0}, rank 1 {inner:.0}, leaf {leaf:.0}");
    // Children in, children out, per heartbeat interval, and a quarter more for slack (16:
    // bounded as for any interior member, whatever the root's own fan-out).
    let bound = 2.0 * 16.0 * 10.0 * 1.25;
    assert!(
        leader <= bound,
        "n {n}: the leader handles {leader:.0}/s, above {bound:.0}"
    );
    // At least its 2 children's reports and its heartbeats to them.
    assert!(
        leader >= 2.0 * 2.0 * 10.0 * 0.75,
        "n {n}: the leader is too quiet ({leader:.0}/s)"
    );
    // A leaf: one report up, one heartbeat down per interval.
    assert!(
        leaf <= 2.0 * 10.0 * 1.25,
        "n {n}: a leaf handles {leaf:.0}/s"
    );
    leader
}

/// Reliable messages from the leader, an interior member and a leaf reach every member:
/// the sequencer relays submissions and positions down the tree. 600 messages, more than
/// the flow window (256 positions beyond the stable point), so the stable point must move
/// on the subtree minima the reports carry up; nobody is removed as lagging.
fn reliable_messages_go_down_the_tree(big: &mut Big) {
    let n = big.ids.len();
    let view = big.sim.node(big.nodes[0]).member.view().map(|v| v.id);
    let before: Vec<u64> = big
        .nodes
        .iter()
        .map(|x| big.sim.node(*x).delivered)
        .collect();
    let senders = [big.at_rank(0, 0), big.at_rank(0, 1), big.at_rank(0, n - 1)];
    let mut queued = [0u32; 3];
    let start = big.sim.now();
    while queued.iter().any(|q| *q < 200) {
        for (k, s) in senders.iter().enumerate() {
            let node = big.nodes[*s];
            while queued[k] < 200 {
                let data = [k as u8; 64];
                let sent = big
                    .sim
                    .with_node(node, |x, now| x.member.send(now, Channel::Reliable, &data));
                if sent.is_err() {
                    break; // the send window is full: wait for deliveries
                }
                queued[k] += 1;
            }
        }
        big.run_for(Duration::from_millis(10));
        assert!(
            big.sim.now().saturating_duration_since(start) < Duration::from_secs(30),
            "600 messages not accepted within 30 s: {queued:?}"
        );
    }
    eprintln!(
        "n {n}: 600 reliable messages accepted in {:?}",
        big.sim.now().saturating_duration_since(start)
    );
    big.run_for(Duration::from_secs(2));
    for (i, x) in big.nodes.iter().enumerate() {
        let got = big.sim.node(*x).delivered - before[i];
        assert_eq!(got, 600, "member {i} delivered {got} of 600");
    }
    let after = big.sim.node(big.nodes[0]).member.view().map(|v| v.id);
    assert_eq!(view, after, "the view changed while the group delivered");
}

/// With 2% of datagrams lost, 2% duplicated and 2% reordered, for 20 seconds: nobody is
/// suspected (a child is suspected only after ten reports in a row are lost), and the
/// messages of `reliable_messages_go_down_the_tree` are delivered exactly once everywhere
/// (a duplicate passed down the tree is refused by the replay window, never delivered).
fn under_loss_duplication_and_reordering(big: &mut Big) {
    let view = big.sim.node(big.nodes[0]).member.view().map(|v| v.id);
    big.sim.add_rule(Loss(0.02));
    big.sim.add_rule(DuplicateRule(0.02));
    big.sim.add_rule(ReorderRule(0.02));
    big.run_for(Duration::from_secs(10));
    reliable_messages_go_down_the_tree(big);
    big.run_for(Duration::from_secs(10));
    big.sim.clear_rules();
    let after = big.sim.node(big.nodes[0]).member.view().map(|v| v.id);
    assert_eq!(view, after, "a member was suspected under light loss");
    let replayed: u64 = big
        .nodes
        .iter()
        .map(|x| big.sim.node(*x).member.counters().get(Drop::Replayed))
        .sum();
    assert!(
        replayed > 0,
        "no duplicate reached a member: the faults did not run"
    );
}

/// (b) Two interior members and a leaf crash together: rank 5 (a child of rank 1, parent
/// of ranks 67..=82), rank 17 (a child of rank 1, parent of ranks 259..=274: their
/// suspicion travels up through rank 1) and the last rank. All three are removed within one
/// suspicion timeout, two heartbeat intervals and two flush timeouts, and the leader stays
/// (the orphaned children of the interior members report to it and hear it directly; none
/// takes over).
fn interior_and_leaf_crash(big: &mut Big) {
    let n = big.ids.len();
    let leader = big.at_rank(0, 0);
    let dead = [big.at_rank(0, 5), big.at_rank(0, 17), big.at_rank(0, n - 1)];
    assert_eq!(big.rank_of(dead[1]), 17);
    for d in dead {
        big.crash(d);
    }
    let survivors: BTreeSet<usize> = (0..n)
        .filter(|i| !dead.contains(i) && !big.sim.is_crashed(big.nodes[*i]))
        .collect();
    let took = big
        .wait_view(&survivors, Duration::from_secs(10))
        .expect("all three removed");
    eprintln!("n {n}: two interior members and a leaf crashed, removed in {took:?}");
    // Detection waits one suspicion timeout and at most one heartbeat interval more (the
    // parent's tick), a few hops up, then one view change (well within two flush timeouts).
    let c = &big.config;
    let bound = c.suspect_timeout + c.heartbeat_interval * 2 + c.flush_timeout * 2;
    assert!(took <= bound, "removal took {took:?}, above {bound:?}");
    assert_eq!(big.rank_of(leader), 0, "the leader still leads");
    big.run_for(Duration::from_secs(1));
}

/// (c) The leader and ranks 1..3 crash together: rank 4 probes ranks 1..3 after one
/// suspicion timeout, hears nothing for three heartbeat intervals and takes over, well
/// before the four suspicion timeouts rank × timeout would wait.
fn leader_and_next_three_crash(big: &mut Big) {
    let alive: Vec<usize> = (0..big.ids.len())
        .filter(|i| !big.sim.is_crashed(big.nodes[*i]))
        .collect();
    let at = alive[0];
    let dead: Vec<usize> = (0..4).map(|r| big.at_rank(at, r)).collect();
    let heir = big.at_rank(at, 4);
    for d in &dead {
        big.crash(*d);
    }
    let survivors: BTreeSet<usize> = alive.into_iter().filter(|i| !dead.contains(i)).collect();
    let took = big
        .wait_view(&survivors, Duration::from_secs(10))
        .expect("a new view without the four");
    eprintln!(
        "n {}: leader and ranks 1..3 crashed, replaced in {took:?}",
        survivors.len() + 4
    );
    let c = &big.config;
    // One suspicion timeout, the tick after it, three intervals of probing, one view change.
    let bound = c.suspect_timeout + c.heartbeat_interval * 5 + c.flush_timeout * 2;
    assert!(took <= bound, "takeover took {took:?}, above {bound:?}");
    assert!(
        took < c.suspect_timeout * 4,
        "takeover waited rank × suspicion"
    );
    assert_eq!(big.rank_of(heir), 0, "rank 4 took over");
}

/// The member at the middle rank of the live members leaves; returns the leader's LKH
/// rekey counts and the bytes the leader sent from the leave until 50 ms after every
/// survivor installed the view without it.
fn leave_at_middle_rank(big: &mut Big, round: usize) -> (LkhRekeyStats, u64) {
    let n = big.nodes.len();
    let leader = big.at_rank(0, 0);
    let alive: Vec<usize> = (0..n)
        .filter(|i| !big.sim.is_crashed(big.nodes[*i]))
        .filter(|i| big.sim.node(big.nodes[*i]).member.view().is_some())
        .collect();
    let leaver = big.at_rank(leader, alive.len() / 2);
    let before = big.sim.node(big.nodes[leader]).sent_bytes;
    big.sim
        .with_node(big.nodes[leaver], |node, now| node.member.leave(now));
    let rest: BTreeSet<usize> = alive.iter().copied().filter(|i| *i != leaver).collect();
    big.wait_view(&rest, Duration::from_secs(5))
        .expect("every survivor installs the view without the leaver");
    big.run_for(Duration::from_millis(50));
    let stats = big.lkh_stats(leader);
    let sent = big.sim.node(big.nodes[leader]).sent_bytes - before;
    eprintln!(
        "round {round}: reseed {} wraps {} leader sent {sent} bytes",
        stats.reseed, stats.wraps
    );
    (stats, sent)
}

/// A member that asks to join while the leader is still flushing a leave goes into that
/// view change (joiners take no part in the flush): one view change instead of two, for
/// the one-message and the LKH rekey. (Before, the leave's change ran to its end and the
/// joiner waited for a second one: each costs every member a Flush, an answer, an Install
/// and an acknowledgement.)
#[test]
fn a_join_during_a_leave_rides_the_same_view_change() {
    for (seed, method) in [(35, RekeyMethod::OneMessage), (36, RekeyMethod::lkh())] {
        let n = 129;
        let mut big = Big::formed_but(seed, n, 1, |c| c.rekey_method = method);
        let joiner = n - 1;
        let leader = big.at_rank(0, 0);
        let leaver = big.at_rank(leader, 64);
        let views = big.sim.node(big.nodes[leader]).views;
        let key_before = big.sim.node(big.nodes[leader]).member.key_fingerprint();
        big.sim
            .with_node(big.nodes[leaver], |node, now| node.member.leave(now));
        big.join(joiner, leader);
        let after: BTreeSet<usize> = (0..n).filter(|i| *i != leaver).collect();
        let took = big
            .wait_view(&after, Duration::from_secs(5))
            .expect("one view with the joiner and without the leaver");
        let installed = big.sim.node(big.nodes[leader]).views - views;
        eprintln!("{method:?}: {installed} view(s) in {took:?}");
        assert_eq!(
            installed, 1,
            "{method:?}: the join and the leave took one view change"
        );
        big.assert_one_key(&after, Some(key_before), &format!("{method:?}"));
    }
}

/// A one-message Install copy carries no signature (the member's own wrap authenticates
/// it), names the members who left by their ranks and leaves out its two view ids, which
/// follow from the packet (`GROUP_VERSION` 10): the largest group datagram the leader sends
/// in a leave's view change is its Install copy. At 200 members I saw 328 bytes before
/// version 10, 234 without the signature and the leaver's id (65 and 30 bytes), and 162
/// without the view ids (72 more). Every survivor still reports the leaver as having left,
/// and holds the new key.
#[test]
fn a_one_message_install_copy_is_unsigned_and_names_the_leaver_by_rank() {
    let n = 200;
    let mut big = Big::formed_with(39, n, |c| c.rekey_method = RekeyMethod::OneMessage);
    let leader = big.at_rank(0, 0);
    let leader_node = big.nodes[leader];
    let largest = std::sync::Arc::new(std::sync::Mutex::new(0usize));
    let seen = largest.clone();
    big.sim.add_rule(cohort_sim::FnRule::new(
        "largest group datagram from the leader",
        move |p, _| {
            if p.from == leader_node && p.bytes.first() == Some(&cohort_gears::PACKET_VERSION) {
                let mut l = seen.lock().expect("lock");
                *l = (*l).max(p.bytes.len());
            }
            cohort_sim::Verdict::Pass
        },
    ));
    let leaver = big.at_rank(leader, n / 2);
    let left_before: Vec<u64> = (0..n).map(|i| big.sim.node(big.nodes[i]).left).collect();
    let key_before = big.sim.node(leader_node).member.key_fingerprint();
    big.sim
        .with_node(big.nodes[leaver], |node, now| node.member.leave(now));
    let rest: BTreeSet<usize> = (0..n).filter(|i| *i != leaver).collect();
    big.wait_view(&rest, Duration::from_secs(5))
        .expect("every survivor installs the view without the leaver");
    let largest = *largest.lock().expect("lock");
    eprintln!("largest group datagram from the leader: {largest} bytes");
    assert!(largest <= 200, "a group datagram of {largest} bytes");
    for i in &rest {
        let node = big.sim.node(big.nodes[*i]);
        assert_eq!(
            node.left - left_before[*i],
            1,
            "member {i}: one member left"
        );
    }
    big.assert_one_key(&rest, Some(key_before), "a leave");
}

/// The tree rekey's shares and acknowledgements name the members below by their positions
/// and ranks, so they do not grow with the group: before `GROUP_VERSION` 8 a share listed
/// every member below its receiver (about 39 bytes each) and an acknowledgement every
/// holder's id (32), so at 10,000 members the top of the tree sent datagrams of 90 KB,
/// over the largest UDP datagram, and a cold start of the group lost most of its members
/// to the key phase's deadline. Here, at 200 members, the largest pair-channel datagram of
/// a leave's tree rekey stays under 400 bytes (I saw 2,031 before the change), and every
/// survivor holds the new key.
#[test]
fn tree_rekey_datagrams_do_not_grow_with_the_group() {
    let n = 200;
    let mut big = Big::formed_with(37, n, |c| c.rekey_method = RekeyMethod::Tree { degree: 4 });
    // The largest protected pair-channel datagram (`0xC1 0x01`: not a handshake, whose
    // flights are about 1.3 KB however large the group).
    let largest = std::sync::Arc::new(std::sync::Mutex::new(None::<usize>));
    let seen = largest.clone();
    big.sim.add_rule(cohort_sim::FnRule::new(
        "largest pair datagram",
        move |p, _| {
            let mut l = seen.lock().expect("lock");
            if let Some(l) = l.as_mut() {
                if p.bytes.starts_with(&[cohort_group::pair::PAIR_KIND, 0x01]) {
                    *l = (*l).max(p.bytes.len());
                }
            }
            cohort_sim::Verdict::Pass
        },
    ));
    let leader = big.at_rank(0, 0);
    let leaver = big.at_rank(leader, n / 2);
    let key_before = big.sim.node(big.nodes[leader]).member.key_fingerprint();
    *largest.lock().expect("lock") = Some(0);
    big.sim
        .with_node(big.nodes[leaver], |node, now| node.member.leave(now));
    let rest: BTreeSet<usize> = (0..n).filter(|i| *i != leaver).collect();
    big.wait_view(&rest, Duration::from_secs(5))
        .expect("every survivor installs the view without the leaver");
    big.assert_one_key(&rest, Some(key_before), "a tree leave");
    let largest = largest.lock().expect("lock").unwrap_or(0);
    eprintln!("largest protected pair datagram in the rekey: {largest} bytes");
    assert!(largest > 0, "the rekey went over pair channels");
    assert!(largest < 400, "a pair datagram of {largest} bytes");
}

/// An Install that is the same for every survivor (here an LKH batch) goes down the tree
/// once: a leave costs the leader far fewer bytes than one copy per member would (an LKH
/// Install of this group is about 1 KB), and when an interior member crashes, the members
/// below it, which the tree copy misses, get theirs when the leader resends to those that
/// did not acknowledge.
#[test]
fn shared_installs_go_down_the_tree() {
    let n = 128;
    let mut big = Big::formed_with(31, n, |c| c.rekey_method = RekeyMethod::lkh());
    // Two leaves in a row; the second is certainly a batch on the leader's tree (the same
    // Install for every survivor).
    for round in 0..2 {
        let (stats, sent) = leave_at_middle_rank(&mut big, round);
        if round == 1 {
            assert!(!stats.reseed, "the second leave is a batch");
            // The Flush and the Install go down the tree, once per child of the leader; one
            // Install per member would be about 126 KB more.
            assert!(sent < 40_000, "the leader sent {sent} bytes for one leave");
        }
    }
    // An interior member (rank 1, parent of ranks 3..=18) crashes: its subtree is reached by
    // the resend, and everyone left installs the view without it.
    let leader = big.at_rank(0, 0);
    let interior = big.at_rank(leader, 1);
    big.crash(interior);
    let rest: BTreeSet<usize> = (0..n)
        .filter(|i| !big.sim.is_crashed(big.nodes[*i]))
        .filter(|i| big.sim.node(big.nodes[*i]).member.view().is_some())
        .collect();
    big.wait_view(&rest, Duration::from_secs(5))
        .expect("a view without the crashed interior member");
}

/// An Install shared by every survivor but longer than one part goes down the tree too, in
/// its parts, each sealed once by the leader and passed on by every member (here parts of
/// 256 bytes, so the group's LKH Install of about 1 KB takes five; at 10,000 members a batch
/// of many leavers makes an Install of hundreds of kilobytes). One copy per member, as
/// before, would cost the leader over 126 parts' worth per leave.
#[test]
fn an_install_longer_than_a_part_goes_down_the_tree_in_parts() {
    let n = 128;
    let mut big = Big::formed_with(33, n, |c| c.rekey_method = RekeyMethod::lkh());
    for node in big.nodes.clone() {
        big.sim
            .with_node(node, |m, _| m.member.set_part_limit_for_tests(256));
    }
    for round in 0..2 {
        let (stats, sent) = leave_at_middle_rank(&mut big, round);
        if round == 1 {
            assert!(!stats.reseed, "the second leave is a batch");
            // The Flush and the Install's parts go once to each child of the leader (about
            // 2 x 6 packets of at most 256 bytes of message); copies to 126 members would
            // be 126 x 6 packets.
            assert!(sent < 20_000, "the leader sent {sent} bytes for one leave");
        }
    }
}

/// Many members leaving in one change (here 48 of 512, spread over the group, crash at
/// once, as when part of the group is cut off) would rekey most of the LKH tree: the leader
/// reseeds instead of batching (`lkh_batch_is_small`: a batch of more than 256 wraps), and
/// the survivors end in one view with one key. One leaver after that is a batch again.
#[test]
fn many_leavers_at_once_reseed_the_tree() {
    let n = 512;
    let mut big = Big::formed_with(35, n, |c| c.rekey_method = RekeyMethod::lkh());
    let leader = big.at_rank(0, 0);
    // Make the leader's tree a batch tree first (the group's first LKH rekey reseeds).
    let first = big.at_rank(leader, n / 2);
    big.sim
        .with_node(big.nodes[first], |node, now| node.member.leave(now));
    let mut rest: BTreeSet<usize> = (0..n).filter(|i| *i != first).collect();
    big.wait_view(&rest, Duration::from_secs(5))
        .expect("a view without the first leaver");
    big.run_for(Duration::from_millis(200));
    let victims: Vec<usize> = (0..48).map(|k| big.at_rank(leader, 20 + 10 * k)).collect();
    for v in &victims {
        big.crash(*v);
        rest.remove(v);
    }
    big.wait_view(&rest, Duration::from_secs(10))
        .expect("a view without the 48 crashed");
    let stats = big.lkh_stats(leader);
    assert!(stats.reseed, "48 leavers at once reseed: {stats:?}");
    big.assert_one_key(&rest, None, "48 crashed");
    // One more leave: a batch on the reseeded tree.
    big.run_for(Duration::from_millis(200));
    let last = big.at_rank(leader, 10);
    big.sim
        .with_node(big.nodes[last], |node, now| node.member.leave(now));
    rest.remove(&last);
    big.wait_view(&rest, Duration::from_secs(5))
        .expect("a view without the last leaver");
    let stats = big.lkh_stats(leader);
    assert!(!stats.reseed, "one leaver is a batch: {stats:?}");
}

/// A cut leaves a small side and a large one; the coordinator of each tells the members it
/// leaves out with one signed LeftOut of a bit per member (`docs/wire.md`), not the whole
/// Install, which lists every member removed: on the small side that made the bytes sent
/// across the cut grow with the square of the large side (3.5 GB from one member at
/// 10,000). Every group packet that crosses the cut is counted (the simulator drops it on
/// arrival); both sides must form their views and merge after the heal.
#[test]
fn members_left_out_by_a_cut_are_told_in_bytes_that_grow_linearly() {
    let n = 400;
    let small = 40;
    let mut big = Big::formed(37, n);
    let leader = big.at_rank(0, 0);
    // The small side: every tenth rank from 5 on, so the cut is spread over the tree.
    let cut: BTreeSet<usize> = (0..small)
        .map(|k| big.at_rank(leader, 5 + 10 * k))
        .collect();
    let rest: BTreeSet<usize> = (0..n).filter(|i| !cut.contains(i)).collect();
    // The cut is this rule (the simulator's own partitions drop a datagram before any rule
    // sees it): it drops and counts every datagram between the sides until healed.
    let crossed = std::sync::Arc::new(std::sync::Mutex::new(([0u64; 2], true)));
    let side: std::collections::HashMap<NodeId, usize> = (0..n)
        .map(|i| (big.nodes[i], usize::from(cut.contains(&i))))
        .collect();
    let tally = crossed.clone();
    big.sim
        .add_rule(cohort_sim::FnRule::new("cut", move |p, _| {
            let (from, to) = (side[&p.from], side[&p.to]);
            let mut t = tally.lock().expect("lock");
            if from == to || !t.1 {
                return cohort_sim::Verdict::Pass;
            }
            if p.bytes.first() == Some(&cohort_gears::PACKET_VERSION) {
                t.0[from] += p.bytes.len() as u64;
            }
            cohort_sim::Verdict::Drop
        }));
    big.wait_view(&cut, Duration::from_secs(15))
        .expect("the small side forms its view");
    big.wait_view(&rest, Duration::from_secs(15))
        .expect("the large side forms its view");
    big.run_for(Duration::from_secs(1));
    let [from_large, from_small] = crossed.lock().expect("lock").0;
    println!(
        "group bytes sent across the cut: {from_small} from the {small} cut off to the {} \
         others, {from_large} the other way",
        n - small
    );
    // Each side tells each member it leaves out once per view change it makes (a LeftOut
    // of about 200 bytes here, its bitmap 50), besides what crosses before the cut is
    // noticed (heartbeats, reports, probes): 244 KB from the small side when this test
    // was written, 680 bytes per member. With whole Installs it sent 4.8 MB, 13 KB to each
    // of the 360.
    let per_member = 2_000;
    assert!(
        from_small < per_member * (n - small) as u64,
        "{from_small} bytes from the small side"
    );
    assert!(
        from_large < per_member * small as u64 + 100_000,
        "{from_large} bytes from the large side"
    );
    crossed.lock().expect("lock").1 = false;
    let all: BTreeSet<usize> = (0..n).collect();
    big.wait_view(&all, Duration::from_secs(30))
        .expect("the sides merge after the heal");
}

/// An Install does not list the members it removes as suspected (each entry was a 33-byte
/// id and reason in every copy: 41 KB a copy on the side of a cut of 10,000 that lost
/// 1,250); every survivor still reports each of them removed as suspected. Here 40 of 400
/// are cut off: the largest group datagram among the other 360 while they change views
/// (their one-message Install copies) stays under 700 bytes (I saw 1,693 when the 40 were
/// listed).
#[test]
fn an_install_does_not_list_the_suspected() {
    let n = 400;
    let small = 40;
    let mut big = Big::formed(38, n);
    let leader = big.at_rank(0, 0);
    let cut: BTreeSet<usize> = (0..small)
        .map(|k| big.at_rank(leader, 5 + 10 * k))
        .collect();
    let rest: BTreeSet<usize> = (0..n).filter(|i| !cut.contains(i)).collect();
    // The leader, and a member at the bottom of the tree.
    let watched = [leader, *rest.last().expect("a member")];
    let before: Vec<u64> = watched
        .iter()
        .map(|i| big.sim.node(big.nodes[*i]).suspected)
        .collect();
    let side: std::collections::HashMap<NodeId, bool> =
        (0..n).map(|i| (big.nodes[i], cut.contains(&i))).collect();
    let largest = std::sync::Arc::new(std::sync::Mutex::new(0usize));
    let seen = largest.clone();
    big.sim
        .add_rule(cohort_sim::FnRule::new("cut", move |p, _| {
            let (from, to) = (side[&p.from], side[&p.to]);
            if from != to {
                return cohort_sim::Verdict::Drop;
            }
            if !from && p.bytes.first() == Some(&cohort_gears::PACKET_VERSION) {
                let mut l = seen.lock().expect("lock");
                *l = (*l).max(p.bytes.len());
            }
            cohort_sim::Verdict::Pass
        }));
    big.wait_view(&rest, Duration::from_secs(15))
        .expect("the large side forms its view");
    let largest = *largest.lock().expect("lock");
    eprintln!("largest group datagram on the large side: {largest} bytes");
    assert!(largest < 700, "a group datagram of {largest} bytes");
    for (i, before) in watched.iter().zip(before) {
        let reported = big.sim.node(big.nodes[*i]).suspected - before;
        assert!(
            reported >= small as u64,
            "member {i} reported {reported} suspected removals"
        );
    }
}

/// Members left out together that hear it (here the 40 whose datagrams to the others are
/// all lost, while the others' reach them) go on in one view of their own, and do not all
/// coordinate it at once: the first of them by rank starts at once, the next waits a flush
/// resend interval for its Flush, and so on. When each started at once, each sent a Flush
/// to all the others (at 10,000 the sweep spent most of its CPU encoding them). Every
/// group packet among the 40 is counted from the cut until their view forms.
#[test]
fn members_left_out_together_form_one_view_without_all_coordinating() {
    let n = 200;
    let small = 40;
    let mut big = Big::formed(41, n);
    let leader = big.at_rank(0, 0);
    let cut: BTreeSet<usize> = (0..small).map(|k| big.at_rank(leader, 7 + 4 * k)).collect();
    let among = big.lose_datagrams_from(&cut);
    let rest: BTreeSet<usize> = (0..n).filter(|i| !cut.contains(i)).collect();
    big.wait_view(&rest, Duration::from_secs(15))
        .expect("the others form a view without the 40");
    big.wait_view(&cut, Duration::from_secs(15))
        .expect("the 40 form one view of their own");
    let among = *among.lock().expect("lock");
    println!("group packets among the {small} left out until their view: {among}");
    // One coordinator: a Flush, a FlushOk, an Install and an InstallAck per member, their
    // resends, and the heartbeats among the 40 before and after: 529 when this test was
    // written. With all 40 coordinating at once, 1,975.
    assert!(among < 1_000, "{among} group packets among the {small}");
}

/// As above, but the leader crashes with the cut, and so does the first of the 40 by rank:
/// rank 1 takes over and leaves the 40 out of its view, and the second of them by rank must
/// coordinate the rest at its turn. (A first version of the turns took the coordinator of
/// the view left, not of the view that left them out, for the one whose flush does not
/// count: each of the 40 saw rank 1's flush as another's and stood back, and with the first
/// of them gone nobody coordinated; the 1,000-member sweep's seed 0 stuck that way.)
#[test]
fn members_left_out_by_a_new_coordinator_go_on_when_the_first_of_them_is_gone() {
    let n = 200;
    let small = 40;
    let mut big = Big::formed(43, n);
    let leader = big.at_rank(0, 0);
    let cut: Vec<usize> = (0..small).map(|k| big.at_rank(leader, 7 + 4 * k)).collect();
    let first = cut[0];
    big.lose_datagrams_from(&cut.iter().copied().collect());
    big.crash(leader);
    big.crash(first);
    let rest: BTreeSet<usize> = (0..n)
        .filter(|i| !cut.contains(i) && *i != leader)
        .collect();
    big.wait_view(&rest, Duration::from_secs(15))
        .expect("the others form a view without the 40 and the leader");
    let left_out: BTreeSet<usize> = cut[1..].iter().copied().collect();
    // Within a suspicion timeout (1 s) of the others' view: by the turns, not by waiting to
    // suspect a silent coordinator (0.78 s when this test was written; 1.9 s with the
    // first version's mistake).
    let took = big
        .wait_view(&left_out, Duration::from_secs(10))
        .expect("the 39 left out form one view of their own");
    println!("the 39 formed their view {took:?} after the others'");
    assert!(took < big.config.suspect_timeout, "the 39 took {took:?}");
}

/// A coordinator appends the survivors' pending messages (sent but never ordered) to the old
/// view's order in runs, each sealed once for every survivor. It used to send each message
/// to each survivor as a datagram of its own: in the 3,000-member sweep about 47 pending
/// messages made 115,150 datagrams after one input, which stopped the simulator. Here the
/// leader crashes, 40 members each send one reliable message to it (never ordered), and rank
/// 1 takes over: every survivor delivers the 40 messages, and rank 1 sends few datagrams
/// per survivor for the whole change.
#[test]
fn pending_messages_reach_the_survivors_in_runs() {
    let n = 200;
    let pending = 40;
    let mut big = Big::formed(47, n);
    big.run_for(Duration::from_secs(1));
    let leader = big.at_rank(0, 0);
    let coordinator = big.at_rank(leader, 1);
    let senders: Vec<usize> = (0..pending)
        .map(|k| big.at_rank(leader, 20 + 4 * k))
        .collect();
    let delivered_before: Vec<u64> = (0..n)
        .map(|i| big.sim.node(big.nodes[i]).delivered)
        .collect();
    let (sent_before, _) = big.counts(coordinator);
    big.crash(leader);
    for (k, s) in senders.iter().enumerate() {
        big.sim.with_node(big.nodes[*s], |node, now| {
            node.member
                .send(now, Channel::Reliable, format!("pending {k}").as_bytes())
                .expect("send");
        });
    }
    let rest: BTreeSet<usize> = (0..n).filter(|i| *i != leader).collect();
    big.wait_view(&rest, Duration::from_secs(15))
        .expect("the survivors form a view without the leader");
    let (sent_after, _) = big.counts(coordinator);
    let sent = sent_after - sent_before;
    for i in &rest {
        let got = big.sim.node(big.nodes[*i]).delivered - delivered_before[*i];
        assert_eq!(
            got, pending as u64,
            "member {i} delivered {got} of the {pending}"
        );
    }
    println!("rank 1 sent {sent} datagrams from the crash to the new view, {n} members");
    // The Flush, its resends, the runs, the Install, pair channel traffic and heartbeats:
    // 1,614 when this test was written; with one datagram per message and survivor, 9,336.
    assert!(sent < 15 * n as u64, "rank 1 sent {sent} datagrams");
}

/// A live member of high rank cut off alone, whose notice that the others went on without
/// it is lost with everything else: after three suspicion timeouts it probes the leader and
/// the lowest ranks, none answers, and it takes over with a view of its own, instead of
/// waiting its turn, `suspect_timeout x (1 + rank / 16)` (10 s at rank 150). Once the cut
/// heals, the group merges it back. The 3,000-member sweep left members in an old view
/// past its 30 s bound this way (the Install or LeftOut for them lost).
#[test]
fn a_high_rank_left_behind_goes_on_without_waiting_its_turn() {
    let n = 200;
    let mut big = Big::formed(53, n);
    let leader = big.at_rank(0, 0);
    let alone = big.at_rank(leader, 150);
    let node = big.nodes[alone];
    let cut = big
        .sim
        .add_rule(cohort_sim::FnRule::new("alone", move |p, _| {
            if p.from == node || p.to == node {
                cohort_sim::Verdict::Drop
            } else {
                cohort_sim::Verdict::Pass
            }
        }));
    let start = big.sim.now();
    let rest: BTreeSet<usize> = (0..n).filter(|i| *i != alone).collect();
    big.wait_view(&rest, Duration::from_secs(15))
        .expect("the others form a view without it");
    let me: BTreeSet<usize> = [alone].into();
    big.wait_view(&me, Duration::from_secs(30))
        .expect("the member cut off forms a view of its own");
    let took = big.sim.now().saturating_duration_since(start);
    println!("rank 150, cut off alone, had a view of its own {took:?} after the cut");
    // Three suspicion timeouts, a probe round (0.3 s), then its flush to the others, which
    // no one answers: 3.9 s when this test was written; waiting its turn (10 s) it took
    // 10.6 s.
    let bound = big.config.suspect_timeout * 6;
    assert!(took < bound, "took {took:?}, bound {bound:?}");
    big.sim.remove_rule(cut);
    let all: BTreeSet<usize> = (0..n).collect();
    big.wait_view(&all, Duration::from_secs(20))
        .expect("the heal merges it back");
}

/// The same at 1,000 members (the most a view holds today is 1,024): the numbers the crate
/// README quotes. Ignored in the normal run for its time; `cargo test --release -p
/// cohort-group --test overlay_sim -- --ignored --nocapture` prints them.
#[test]
#[ignore]
fn at_a_thousand_members() {
    let mut big = Big::formed(85, 1000);
    leader_rate(&mut big);
    reliable_messages_go_down_the_tree(&mut big);
    interior_and_leaf_crash(&mut big);
    leader_and_next_three_crash(&mut big);
}

/// Issue 14, the view change on the overlay: one leave from a group of `n` (LKH, whose
/// Install goes down the tree), measured at the leader against as long a window of steady
/// state just before. The Flush goes down the tree and the answers and acknowledgements come
/// up folded, so the change adds about three datagrams per child of the leader (Flush,
/// Install, answers up, acknowledgements up) on top of steady state, where a flush sent to
/// every member adds two per member (a FlushOk and an InstallAck each: about 2n received).
///
/// With `crash` ranks given, those (interior members) crash the moment the leave is asked
/// for: the Flush misses their subtrees, which the leader's resends reach directly one level
/// at a time. Every member below them stays in the view; the crashed ones are removed in the
/// same change after one flush timeout.
fn one_leave_on_the_tree(seed: u64, n: usize, crash: &[usize]) {
    let mut big = Big::formed_with(seed, n, |c| c.rekey_method = RekeyMethod::lkh());
    big.run_for(Duration::from_secs(2));
    let leader = big.at_rank(0, 0);
    let leaver = big.at_rank(leader, n / 2);
    let dead: Vec<usize> = crash.iter().map(|r| big.at_rank(leader, *r)).collect();
    // Steady state over a window as long as the change will be given.
    let window = Duration::from_secs(2);
    let (s0, r0) = big.counts(leader);
    big.run_for(window);
    let (s1, r1) = big.counts(leader);
    let (steady_sent, steady_received) = (s1 - s0, r1 - r0);
    big.sim
        .with_node(big.nodes[leaver], |node, now| node.member.leave(now));
    for d in &dead {
        big.crash(*d);
    }
    let rest: BTreeSet<usize> = (0..n)
        .filter(|i| *i != leaver && !dead.contains(i))
        .collect();
    let took = big
        .wait_view(&rest, window)
        .expect("a view without the leaver and the crashed, with everyone else");
    // The rest of the window: the same length as the steady-state one.
    big.run_for(window.saturating_sub(took));
    let (s2, r2) = big.counts(leader);
    let extra_sent = (s2 - s1).saturating_sub(steady_sent);
    let extra_received = (r2 - r1).saturating_sub(steady_received);
    eprintln!(
        "n {n}, crashed ranks {crash:?}: view in {took:?}; the leader sent {} and received {} \
         datagrams (steady state: {steady_sent} and {steady_received})",
        s2 - s1,
        r2 - r1
    );
    let fanout = 16u64;
    // Flush, Install (one part), a resend of each per silent subtree root and its children,
    // the crashed members' direct copies; answers and acknowledgements: one or two
    // messages per child, and per directly reached member.
    let direct = crash.len() as u64 * (1 + fanout);
    let bound = 4 * fanout + 3 * direct + 16;
    assert!(
        extra_received <= bound,
        "n {n}: the view change cost the leader {extra_received} datagrams received, above \
         {bound} (about {} with a direct flush)",
        2 * (n - 2)
    );
    assert!(
        extra_sent <= bound,
        "n {n}: the view change cost the leader {extra_sent} datagrams sent, above {bound}"
    );
    let c = &big.config;
    let limit = if crash.is_empty() {
        c.flush_timeout
    } else {
        c.flush_timeout * 2 + c.heartbeat_interval * 2
    };
    assert!(
        took <= limit,
        "n {n}: the change took {took:?}, above {limit:?}"
    );
}

/// One leave at 300 members, then one during which two interior members crash (rank 17,
/// parent of ranks 259..=274, and rank 2, a child of the leader and parent of ranks
/// 19..=34, grandparent of 291..), see [`one_leave_on_the_tree`].
#[test]
fn a_view_change_travels_on_the_tree() {
    one_leave_on_the_tree(91, 300, &[]);
    one_leave_on_the_tree(92, 300, &[17, 2]);
}

/// The same at 1,000 members, with rank 1 (a child of the leader whose subtree holds 726
/// members) and rank 40 crashing during the change. Ignored in the normal run for its time (CI runs it).
#[test]
#[ignore]
fn a_view_change_travels_on_the_tree_at_a_thousand() {
    one_leave_on_the_tree(93, 1000, &[]);
    one_leave_on_the_tree(94, 1000, &[1, 40]);
}
