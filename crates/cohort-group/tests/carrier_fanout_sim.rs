//! `GroupConfig::carrier_fans_out` (issue 15) in the simulator: each member is driven
//! through `GroupMember::poll_transmit_to`, and a packet queued for the whole group is
//! counted once (one publish) and copied to the other members by the harness, as a broker
//! would. In a small view and in an overlay view (more than 64 members) the group forms,
//! every member delivers every reliable message in one order, and the leader publishes a
//! bounded number of packets per message instead of one per child or member.
//!
//! Bounds are on simulated time and on counts the simulator fixes; nothing reads a clock.
mod support;

use cohort_core::{Machine, Timestamp, Transmit};
use cohort_group::{Channel, Destination, GroupConfig, GroupEvent, GroupMember, MemberId};
use cohort_sim::{NodeId, Sim};
use rand_core::RngCore;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

/// A member behind a carrier that fans out: group entries are counted once and copied.
struct Fanned {
    member: GroupMember,
    /// Copies of a group entry still to hand to the simulator.
    copies: VecDeque<(SocketAddr, Vec<u8>)>,
    /// Packets published to the whole group.
    group_publishes: u64,
    /// Packets sent to one member.
    unicasts: u64,
    /// Reliable deliveries, in order: (sender, message number).
    delivered: Vec<(MemberId, u64)>,
}

impl Machine for Fanned {
    type Event = GroupEvent;
    fn handle_datagram(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        self.member.handle_datagram(now, from, data);
    }
    fn handle_timeout(&mut self, now: Timestamp) {
        self.member.handle_timeout(now);
    }
    fn poll_transmit(&mut self, now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
        loop {
            if let Some((to, packet)) = self.copies.pop_front() {
                buf.extend_from_slice(&packet);
                return Some(Transmit {
                    destination: to,
                    size: packet.len(),
                });
            }
            let mut packet = Vec::new();
            let (to, size) = self.member.poll_transmit_to(now, &mut packet)?;
            match to {
                Destination::Member(addr) => {
                    self.unicasts += 1;
                    buf.extend_from_slice(&packet);
                    return Some(Transmit {
                        destination: addr,
                        size,
                    });
                }
                Destination::Group => {
                    self.group_publishes += 1;
                    let me = self.member.id();
                    let view = self.member.view().expect("a group packet outside a view");
                    for m in view.members.iter().filter(|m| m.id != me) {
                        self.copies.push_back((m.addr, packet.clone()));
                    }
                }
            }
        }
    }
    fn poll_timeout(&self) -> Option<Timestamp> {
        self.member.poll_timeout()
    }
    fn poll_event(&mut self) -> Option<GroupEvent> {
        while let Some(e) = self.member.poll_event() {
            if let GroupEvent::Deliver {
                channel: Channel::Reliable,
                sender,
                seq,
                ..
            } = e
            {
                self.delivered.push((sender, seq));
            }
        }
        None
    }
}

/// `n` members with the switch on, formed into one view; returns the simulator and nodes.
fn formed(seed: u64, n: usize) -> (Sim<Fanned>, Vec<NodeId>) {
    let mut sim: Sim<Fanned> = Sim::new(support::sim_config(seed));
    let identities: Vec<_> = (0..n).map(|i| support::identity(seed, i)).collect();
    let ids: Vec<MemberId> = identities.iter().map(|i| MemberId(i.public())).collect();
    let mut config = GroupConfig::new("fan-out", ids);
    config.carrier_fans_out = true;
    let mut nodes = Vec::new();
    for ident in identities {
        let mut seed_bytes = [0u8; 32];
        sim.rng().fill_bytes(&mut seed_bytes);
        let config = config.clone();
        nodes.push(sim.add_node_with(|_, addr| {
            Fanned {
                member: GroupMember::new(support::kit::provider(), ident, addr, config, seed_bytes)
                    .expect("member"),
                copies: VecDeque::new(),
                group_publishes: 0,
                unicasts: 0,
                delivered: Vec::new(),
            }
        }));
    }
    let founder = sim.addr(nodes[0]);
    for (i, x) in nodes.clone().into_iter().enumerate() {
        let contacts: Vec<SocketAddr> = if i == 0 { Vec::new() } else { vec![founder] };
        sim.with_node(x, |node, now| node.member.start(now, &contacts));
    }
    let all = nodes.clone();
    sim.run_until_cond(Duration::from_secs(120), |s| {
        let first = s.node(all[0]).member.view().map(|v| v.id);
        first.is_some()
            && all.iter().all(|x| {
                let m = &s.node(*x).member;
                !m.status().changing_view
                    && m.view()
                        .is_some_and(|v| Some(v.id) == first && v.members.len() == n)
            })
    })
    .unwrap_or_else(|e| panic!("seed {seed}: the group of {n} does not form: {e}"));
    (sim, nodes)
}

/// Three members each send `per` reliable messages; every member must deliver all of them
/// in one order. Returns the leader's group publishes and unicasts per message.
fn one_order(seed: u64, n: usize, per: usize) -> (f64, f64) {
    let (mut sim, nodes) = formed(seed, n);
    let leader = nodes
        .iter()
        .copied()
        .find(|x| {
            let m = &sim.node(*x).member;
            m.view().is_some_and(|v| v.leader().id == m.id())
        })
        .expect("a leader");
    let before = {
        let l = sim.node(leader);
        (l.group_publishes, l.unicasts)
    };
    for x in &nodes {
        sim.with_node(*x, |node, _| node.delivered.clear());
    }
    let senders = [nodes[1], nodes[n / 2], nodes[n - 1]];
    for i in 0..per {
        for s in senders {
            sim.with_node(s, |node, now| {
                node.member
                    .send(now, Channel::Reliable, &[i as u8; 100])
                    .expect("in the window")
            });
        }
        let until = sim.now().saturating_add(Duration::from_millis(20));
        sim.run_until(until).expect("run");
    }
    let total = 3 * per;
    let all = nodes.clone();
    sim.run_until_cond(Duration::from_secs(30), |s| {
        all.iter().all(|x| s.node(*x).delivered.len() >= total)
    })
    .unwrap_or_else(|e| panic!("seed {seed}: not every member delivered {total}: {e}"));
    let reference = sim.node(nodes[0]).delivered.clone();
    assert_eq!(reference.len(), total, "seed {seed}: delivered twice?");
    for x in &nodes {
        assert_eq!(
            sim.node(*x).delivered,
            reference,
            "seed {seed}: one order at every member"
        );
    }
    let l = sim.node(leader);
    let per = (
        (l.group_publishes - before.0) as f64 / total as f64,
        (l.unicasts - before.1) as f64 / total as f64,
    );
    eprintln!(
        "seed {seed}, {n} members: {} deliveries each, leader per message: {:.2} publishes, {:.2} unicasts",
        reference.len(),
        per.0,
        per.1
    );
    per
}

#[test]
fn a_small_view_delivers_in_one_order_with_one_publish_per_relay() {
    for seed in [1, 2] {
        let (publishes, unicasts) = one_order(seed, 8, 10);
        // A relay of each submission and a share of Orders and heartbeats: a few
        // publishes per message, not one packet per member.
        assert!(
            publishes <= 3.0,
            "seed {seed}: {publishes} publishes per message"
        );
        assert!(
            unicasts < 1.0,
            "seed {seed}: {unicasts} unicasts per message"
        );
    }
}

#[test]
fn an_overlay_view_delivers_in_one_order_without_forwarding_down_the_tree() {
    let seed = 3;
    let (publishes, unicasts) = one_order(seed, 70, 5);
    assert!(
        publishes <= 3.0,
        "seed {seed}: {publishes} publishes per message"
    );
    // Over the overlay without the switch the leader sends each relay and Orders to its 16
    // children, one unicast each.
    assert!(
        unicasts < 1.0,
        "seed {seed}: {unicasts} unicasts per message"
    );
}
