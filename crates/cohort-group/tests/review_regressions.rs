//! Regression tests for findings of the security review of Exchange, trust and KDC mode.
//! Each failed before its fix.

mod support;

use cohort_crypto::{CryptoProvider, Secret};
use cohort_gears::GearId;
use cohort_group::exchange::{self, Gossip, LocalId, GOSSIP_KIND};
use cohort_group::fuzzing::{identity, TestGroup, ADDR_B};
use cohort_group::keys::GroupKey;
use cohort_group::wire::{Install, KeyDelivery, Msg, ViewRef};
use cohort_group::{Drop, GroupEvent, MemberId, ViewId};
use std::time::Duration;
use support::Group;

const BOUND: Duration = Duration::from_secs(6);

/// The latest Id `node` gossiped (to anyone), parsed.
fn latest_id(g: &Group, node: usize) -> Option<exchange::Id> {
    g.sim
        .node(g.nodes[node])
        .watch
        .tap
        .iter()
        .rev()
        .filter(|(_, p)| p.first() == Some(&GOSSIP_KIND))
        .find_map(|(_, p)| match exchange::decode(p)?.gossip {
            Gossip::Id(id) => Some(id),
            _ => None,
        })
}

/// F1: a member that left could fetch the group key drawn to keep it out by sending one
/// signed Id with a stale tag (the leader answered with a ticket), or hand the leader a key
/// of its own with a ticket. Neither works now.
#[test]
fn a_member_that_left_gets_no_ticket_and_gives_none() {
    let mut g = Group::new(51, 3, |_| {});
    g.start_all();
    g.wait_converged(&[0, 1, 2], BOUND).expect("one view");
    let leader_id = g.current_views()[0].as_ref().expect("view").1[0];
    let leader = g.index_of(&leader_id).expect("leader");
    let leaver = (leader + 1) % 3;
    let stay: Vec<usize> = (0..3).filter(|i| *i != leaver).collect();
    let n = g.nodes[leaver];
    g.sim.with_node(n, |node, now| node.member.leave(now));
    g.wait_converged(&stay, BOUND).expect("without the leaver");
    g.run_for(Duration::from_secs(2)).expect("run"); // the leader gossips to it
    let key_before = g.sim.node(g.nodes[leader]).member.key_fingerprint();
    let p = CryptoProvider::default_provider();
    let stale = GroupKey::new(1, Secret::from_slice(&[9; 32]));
    let local = LocalId::new(&p, [3; 16]).expect("kem");
    let leaver_addr = g.sim.addr(g.nodes[leaver]);
    let id = exchange::encode_id(
        &p,
        &g.identities[leaver],
        "sim",
        leaver_addr,
        1,
        &local,
        &stale,
    )
    .expect("id");
    let before = g.events_per_node()[leader].len();
    let untrusted_before = g
        .sim
        .node(g.nodes[leader])
        .member
        .counters()
        .get(Drop::Untrusted);
    g.sim
        .inject(leaver_addr, g.nodes[leader], id, Duration::from_millis(1));
    // And a ticket with a key of its choosing, answering the leader's latest Id.
    let leader_id_msg = latest_id(&g, leader).expect("the leader gossiped");
    let chosen = GroupKey::new(5, Secret::from_slice(&[7; 32]));
    let ticket = exchange::encode_ticket(&p, &g.identities[leaver], "sim", &leader_id_msg, &chosen)
        .expect("ticket");
    g.sim.inject(
        leaver_addr,
        g.nodes[leader],
        ticket,
        Duration::from_millis(2),
    );
    g.run_for(Duration::from_secs(1)).expect("run");
    let after = &g.events_per_node()[leader][before..];
    assert!(
        !after.iter().any(|e| matches!(
            e,
            GroupEvent::TicketSent { .. } | GroupEvent::KeyExchanged { .. }
        )),
        "the leader exchanged keys with a member that left: {after:?}"
    );
    assert_eq!(
        g.sim.node(g.nodes[leader]).member.key_fingerprint(),
        key_before
    );
    let m = &g.sim.node(g.nodes[leader]).member;
    assert!(
        m.counters().get(Drop::Untrusted) > untrusted_before,
        "the leaver's Id was not refused as untrusted"
    );
}

/// F3: a ticket carrying the largest key epoch made the next rekey overflow.
#[test]
fn a_ticket_with_the_largest_epoch_does_not_break_the_next_rekey() {
    // Three identities; the one that sorts lowest never starts, and hands the leader of the
    // other two a ticket (it is trusted, and not a member that left).
    let mut g = Group::new(52, 3, |_| {});
    let lowest = (0..3).min_by_key(|i| g.ids[*i]).expect("lowest");
    let others: Vec<usize> = (0..3).filter(|i| *i != lowest).collect();
    let addrs: Vec<_> = (0..3).map(|i| g.sim.addr(g.nodes[i])).collect();
    for i in &others {
        let contacts: Vec<_> = (0..3).filter(|j| j != i).map(|j| addrs[j]).collect();
        let n = g.nodes[*i];
        g.sim
            .with_node(n, |node, now| node.member.start(now, &contacts));
    }
    g.wait_converged(&others, BOUND).expect("two members");
    g.run_for(Duration::from_secs(2)).expect("run"); // gossip to the silent contact
    let leader_id = g.current_views()[others[0]].as_ref().expect("view").1[0];
    let leader = g.index_of(&leader_id).expect("leader");
    let id = latest_id(&g, leader).expect("the leader gossiped");
    let p = CryptoProvider::default_provider();
    let huge = GroupKey::new(u64::MAX, Secret::from_slice(&[8; 32]));
    let ticket =
        exchange::encode_ticket(&p, &g.identities[lowest], "sim", &id, &huge).expect("ticket");
    g.sim.inject(
        addrs[lowest],
        g.nodes[leader],
        ticket,
        Duration::from_millis(1),
    );
    g.run_for(Duration::from_secs(1)).expect("run");
    let n = g.nodes[leader];
    g.sim.with_node(n, |node, now| node.member.rekey(now));
    g.run_for(Duration::from_secs(2)).expect("no panic");
    assert!(g.converged(&others));
}

/// F2: a member about to be removed as untrusted started a view change naming itself
/// coordinator; the leader followed it, and after `set_trust` still installed its Install,
/// which kept the member (as leader) and the old key. Now the leader abandons that view
/// change and refuses the Install.
#[test]
fn a_member_no_longer_trusted_cannot_take_over_with_its_own_view_change() {
    let mut g = TestGroup::new(true, false);
    assert!(g.formed());
    let (a, b) = (
        MemberId(identity(0).public()),
        MemberId(identity(1).public()),
    );
    let view = g.members[0].view().expect("view").clone();
    let key_before = g.members[0].key_fingerprint();
    let mut forger = g.forger(0, 1, 1000).expect("forger");
    let seal = |keys: &mut cohort_group::keys::ViewKeys, msg: &Msg| {
        let mut body = 0u16.to_be_bytes().to_vec();
        msg.encode(&mut body);
        let mut packet = Vec::new();
        keys.seal(&[GearId::DangerNullForTesting], &body, &mut packet)
            .expect("seal");
        packet
    };
    let proposal = ViewId {
        seq: view.id.seq + 1,
        coordinator: b,
    };
    let flush = seal(
        &mut forger,
        &Msg::Flush {
            proposal: ViewRef {
                seq: proposal.seq,
                coordinator: 1,
            },
            survivors: vec![0, 1],
        },
    );
    g.feed(0, ADDR_B, &flush);
    assert!(
        g.members[0].status().changing_view,
        "the leader did not follow"
    );
    let now = g.now;
    g.members[0].set_trust(now, vec![a]);
    // Delta Installs keep the base's order, so the forger can no longer list itself first;
    // it is refused before that matters (the leader stopped trusting its coordinator), and
    // its digest of the list is not even checked.
    let mut install = Install {
        view: proposal,
        base: view.id,
        count: 2,
        left: Vec::new(),
        joined: Vec::new(),
        digest: [0; 32],
        next_seqs: vec![0, 0],
        key_epoch: view.key_epoch,
        final_order: 0,
        key: KeyDelivery::Same,
        merge_into: None,
        removed: Vec::new(),
        signature: Vec::new(),
    };
    install.signature = identity(1)
        .sign(
            &CryptoProvider::default_provider(),
            &install.signed_bytes("fuzz"),
        )
        .expect("sign");
    let packet = seal(&mut forger, &Msg::Install(Box::new(install)));
    g.feed(0, ADDR_B, &packet);
    // The member keeps its view alive with heartbeats as its leader (rank 0), as the
    // review's attack did; with the fix the leader never installed that view, and these
    // are dropped.
    for k in 0..30 {
        if let Some(mut f) = g.forger(0, 0, 2000 + k * 10) {
            let hb = Msg::Heartbeat {
                delivered: 0,
                ordered: 0,
                stable: 0,
                load: 0,
                failures: 0,
            };
            let mut body = u16::MAX.to_be_bytes().to_vec();
            hb.encode(&mut body);
            let mut packet = Vec::new();
            f.seal(&[GearId::DangerNullForTesting], &body, &mut packet)
                .expect("seal");
            g.feed(0, ADDR_B, &packet);
        }
        g.run_for(Duration::from_millis(100));
    }
    let now_view = g.members[0].view().expect("view");
    assert_eq!(now_view.leader().id, a, "the untrusted member took over");
    assert!(
        !now_view.contains(&b),
        "the untrusted member is still in the view"
    );
    assert_ne!(
        g.members[0].key_fingerprint(),
        key_before,
        "the old key is still in use"
    );
}
