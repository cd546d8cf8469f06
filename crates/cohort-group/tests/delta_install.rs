//! Delta Installs from the outside: the test plays a coordinator (its own pair table and
//! the view's keys) against one real member, and checks that a member that lacks the base
//! view fetches the list in parts and checks it against the Install's digest, that a
//! tampered list or Install part is dropped and counted (never installed), and that a
//! leader gives a view's list to nobody outside the view.

use cohort_channel::identity::Identity;
use cohort_core::{Machine, Timestamp};
use cohort_crypto::{CryptoProvider, Secret};
use cohort_group::keys::{GearPlan, GroupKey, ViewKeys};
use cohort_group::pair::{PairEvent, PairTable, PAIR_KIND};
use cohort_group::wire::{
    encode_roster, roster_digest, Install, Joined, KeyDelivery, Msg, PairMsg, ViewRef, PART_LIST,
};
use cohort_group::{Drop, GroupConfig, GroupEvent, GroupMember, Member, MemberId, ViewId};
use std::net::SocketAddr;

fn identity(i: u8) -> Identity {
    let provider = CryptoProvider::default_provider();
    let mut bytes = [0u8; 32];
    bytes[0] = i;
    bytes[31] = 0x55;
    Identity::from_secret(&provider, Secret::from_slice(&bytes)).expect("identity")
}

struct Harness {
    provider: CryptoProvider,
    pairs: PairTable,
    member: GroupMember,
    /// The test's address, and the member's.
    a: SocketAddr,
    b: SocketAddr,
    now: Timestamp,
    events: Vec<GroupEvent>,
}

impl Harness {
    /// Shuttles datagrams both ways until quiet; returns the pair messages the member sent.
    fn pump(&mut self) -> Vec<PairMsg> {
        let mut got = Vec::new();
        for _ in 0..50 {
            let mut moved = false;
            let mut buf = Vec::new();
            while let Some(t) = self.pairs.poll_transmit(self.now, &mut buf) {
                self.member
                    .handle_datagram(self.now, self.a, &buf[..t.size]);
                buf.clear();
                moved = true;
            }
            while let Some(t) = self.member.poll_transmit(self.now, &mut buf) {
                let d = buf[..t.size].to_vec();
                buf.clear();
                if d.first() == Some(&PAIR_KIND) {
                    self.pairs.handle_datagram(self.now, self.b, &d);
                }
                moved = true;
            }
            while let Some(e) = self.pairs.poll_event() {
                if let PairEvent::Message { data, .. } = e {
                    if let Some(m) = PairMsg::decode(&data) {
                        got.push(m);
                    }
                }
            }
            while let Some(e) = self.member.poll_event() {
                self.events.push(e);
            }
            if !moved {
                break;
            }
        }
        got
    }

    fn advance(&mut self, ms: u64) {
        self.now = self
            .now
            .saturating_add(std::time::Duration::from_millis(ms));
        self.member.handle_timeout(self.now);
        self.pairs.handle_timeout(self.now);
    }

    fn send(&mut self, to: MemberId, msg: &PairMsg) {
        let mut body = Vec::new();
        msg.encode(&mut body);
        self.pairs.send(self.now, self.b, Some(to), &body);
    }

    fn sign(&self, install: &mut Install, by: &Identity) {
        install.signature = by
            .sign(&self.provider, &install.signed_bytes("g"))
            .expect("sign");
    }
}

/// A member asking to join the test (its contact); returns the harness and the member's
/// incarnation once its join request arrived.
fn joiner(trust: Vec<MemberId>, coordinator: Identity, member: Identity) -> (Harness, u64) {
    let provider = CryptoProvider::default_provider();
    let a: SocketAddr = "10.8.0.1:7000".parse().expect("addr");
    let b: SocketAddr = "10.8.0.2:7000".parse().expect("addr");
    let config = GroupConfig::new("g", trust.clone());
    let mut member = GroupMember::new(provider, member, b, config, [7; 32]).expect("m");
    member.set_part_limit_for_tests(64);
    let pairs = PairTable::new(provider, coordinator, "g", trust, [6; 32]);
    let mut h = Harness {
        provider,
        pairs,
        member,
        a,
        b,
        now: Timestamp::ZERO,
        events: Vec::new(),
    };
    h.member.start(h.now, &[a]);
    for _ in 0..20 {
        for m in h.pump() {
            if let PairMsg::JoinRequest { incarnation, .. } = m {
                return (h, incarnation);
            }
        }
        h.advance(100);
    }
    panic!("no join request");
}

#[test]
fn a_joiner_fetches_the_list_in_parts_refuses_a_tampered_one_and_installs() {
    let provider = CryptoProvider::default_provider();
    let coordinator = identity(1);
    let member_id = identity(2);
    let (ca, cb) = (MemberId(coordinator.public()), MemberId(member_id.public()));
    // A view of 5: the test's coordinator, three members that never speak here, and the
    // joiner at rank 4.
    let others: Vec<MemberId> = (3..6).map(|i| MemberId(identity(i).public())).collect();
    let mut trust = vec![ca, cb];
    trust.extend(others.iter().copied());
    let (mut h, incarnation) = joiner(trust, coordinator.clone(), member_id);
    let mut members = vec![Member { id: ca, addr: h.a }];
    for (i, id) in others.iter().enumerate() {
        members.push(Member {
            id: *id,
            addr: format!("10.8.1.{}:7000", i + 1).parse().expect("addr"),
        });
    }
    members.push(Member { id: cb, addr: h.b });
    let incarnations = [1, 2, 3, 4, incarnation];
    let roster = encode_roster(&members, &incarnations);
    let digest = roster_digest(provider.keyed_blake3, &roster);
    let view1 = ViewId {
        seq: 5,
        coordinator: ca,
    };
    let mut install = Install {
        view: view1,
        base: ViewId {
            seq: 4,
            coordinator: ca,
        },
        count: 5,
        left: Vec::new(),
        joined: vec![Joined {
            member: members[4],
            next_seq: 0,
            incarnation,
        }],
        digest,
        next_seqs: Vec::new(),
        key_epoch: 1,
        final_order: 0,
        key: KeyDelivery::Same,
        merge_into: None,
        removed: Vec::new(),
        signature: Vec::new(),
    };
    h.sign(&mut install, &coordinator);
    let key1 = GroupKey::new(1, Secret::from_slice(&[0x21; 32]));
    // The Welcome without the list: the joiner must ask for it.
    h.send(
        cb,
        &PairMsg::Welcome {
            install: Box::new(install.clone()),
            key: zeroize::Zeroizing::new(key1.expose().to_vec()),
            roster: Vec::new(),
        },
    );
    let asked = h.pump();
    assert!(
        asked
            .iter()
            .any(|m| matches!(m, PairMsg::ListRequest { view, from: 0 } if *view == view1)),
        "the joiner did not ask for the list: {asked:?}"
    );
    assert!(h.member.view().is_none(), "installed without the list");

    let parts = |bytes: &[u8]| -> Vec<PairMsg> {
        let chunks: Vec<&[u8]> = bytes.chunks(100).collect();
        let total = chunks.len() as u16;
        chunks
            .iter()
            .enumerate()
            .map(|(i, c)| PairMsg::Part {
                view: view1,
                what: PART_LIST,
                index: i as u16,
                total,
                data: c.to_vec(),
            })
            .collect()
    };
    // A tampered list (one address changed): every part authenticates over the pair
    // channel, but the joined list does not give the Install's digest.
    let mut bad_members = members.clone();
    bad_members[2].addr = "10.66.6.6:7000".parse().expect("addr");
    let bad = encode_roster(&bad_members, &incarnations);
    assert_eq!(bad.len(), roster.len());
    let before = h.member.counters().get(Drop::AuthFailed);
    for p in parts(&bad) {
        h.send(cb, &p);
    }
    h.pump();
    assert!(h.member.view().is_none(), "a tampered list installed");
    assert_eq!(h.member.counters().get(Drop::AuthFailed), before + 1);

    // The joiner asks again (its retry), and the right list installs, with the first
    // part lost on the way: the retry asks from the part it lacks.
    let mut asked_again = Vec::new();
    for _ in 0..5 {
        h.advance(100);
        asked_again.extend(h.pump());
    }
    assert!(
        asked_again
            .iter()
            .any(|m| matches!(m, PairMsg::ListRequest { view, .. } if *view == view1)),
        "no retry"
    );
    let good = parts(&roster);
    assert!(good.len() > 2, "the list should come in several parts");
    for p in good.iter().skip(1) {
        h.send(cb, p);
    }
    h.pump();
    assert!(h.member.view().is_none(), "installed with a part missing");
    let mut from = None;
    for _ in 0..5 {
        h.advance(100);
        for m in h.pump() {
            if let PairMsg::ListRequest { view, from: f } = m {
                if view == view1 {
                    from = Some(f);
                }
            }
        }
        if from.is_some() {
            break;
        }
    }
    assert_eq!(from, Some(0), "the retry asks for the missing part");
    h.send(cb, &good[0]);
    h.pump();
    let view = h.member.view().expect("installed");
    assert_eq!(view.id, view1);
    assert_eq!(&view.members[..], &members[..]);
    assert_eq!(view.rank_of(&cb), Some(4));
    assert!(h
        .events
        .iter()
        .any(|e| matches!(e, GroupEvent::View(v) if v.id == view1)));
}

#[test]
fn a_tampered_install_part_is_refused_and_the_whole_installs() {
    let provider = CryptoProvider::default_provider();
    let coordinator = identity(1);
    let member_id = identity(2);
    let (ca, cb) = (MemberId(coordinator.public()), MemberId(member_id.public()));
    let (mut h, incarnation) = joiner(vec![ca, cb], coordinator.clone(), member_id);
    let members = vec![Member { id: ca, addr: h.a }, Member { id: cb, addr: h.b }];
    let roster = encode_roster(&members, &[1, incarnation]);
    let digest = roster_digest(provider.keyed_blake3, &roster);
    let view1 = ViewId {
        seq: 1,
        coordinator: ca,
    };
    let mut welcome = Install {
        view: view1,
        base: ViewId {
            seq: 0,
            coordinator: ca,
        },
        count: 2,
        left: Vec::new(),
        joined: vec![Joined {
            member: members[1],
            next_seq: 0,
            incarnation,
        }],
        digest,
        next_seqs: Vec::new(),
        key_epoch: 1,
        final_order: 0,
        key: KeyDelivery::Same,
        merge_into: None,
        removed: Vec::new(),
        signature: Vec::new(),
    };
    h.sign(&mut welcome, &coordinator);
    let key1 = GroupKey::new(1, Secret::from_slice(&[0x31; 32]));
    h.send(
        cb,
        &PairMsg::Welcome {
            install: Box::new(welcome),
            key: zeroize::Zeroizing::new(key1.expose().to_vec()),
            roster,
        },
    );
    h.pump();
    assert_eq!(h.member.view().map(|v| v.id), Some(view1), "welcomed");

    // A view change run by the test: Flush, then the Install in parts.
    let plan = GearPlan::new(&GroupConfig::new("g", vec![ca, cb]).protection);
    let mut keys = ViewKeys::derive(&provider, "g", &key1, view1, 2, 0, &plan).expect("keys");
    let mut seal = |msg: &Msg| {
        let mut body = vec![0, 1]; // to rank 1
        msg.encode(&mut body);
        let mut packet = Vec::new();
        keys.seal(&plan.ladder, &body, &mut packet).expect("seal");
        packet
    };
    let proposal = ViewId {
        seq: 2,
        coordinator: ca,
    };
    // The test's Flush, naming its coordinator by `rank` in view 1 (GROUP_VERSION 9's view
    // ref). Naming rank 2, outside the view, it is dropped, counted, and starts nothing.
    let flush_naming = |seal: &mut dyn FnMut(&Msg) -> Vec<u8>, rank: u16| {
        seal(&Msg::Flush {
            proposal: ViewRef {
                seq: proposal.seq,
                coordinator: rank,
            },
            survivors: vec![0, 1],
        })
    };
    let unexpected = h.member.counters().get(Drop::Unexpected);
    let outside = flush_naming(&mut seal, 2);
    h.member.handle_datagram(h.now, h.a, &outside);
    h.pump();
    assert!(
        !h.member.status().changing_view,
        "a Flush naming rank 2 of 2"
    );
    assert_eq!(h.member.counters().get(Drop::Unexpected), unexpected + 1);
    let flush = flush_naming(&mut seal, 0);
    h.member.handle_datagram(h.now, h.a, &flush);
    h.pump();
    assert!(h.member.status().changing_view, "flushing");
    let mut install = Install {
        view: proposal,
        base: view1,
        count: 2,
        left: Vec::new(),
        joined: Vec::new(),
        digest,
        next_seqs: Vec::new(),
        key_epoch: 1,
        final_order: 0,
        key: KeyDelivery::Same,
        merge_into: None,
        removed: Vec::new(),
        signature: Vec::new(),
    };
    h.sign(&mut install, &coordinator);
    let mut body = Vec::new();
    Msg::Install(Box::new(install)).encode(&mut body);
    let chunks = |bytes: &[u8]| -> Vec<Msg> {
        let c: Vec<&[u8]> = bytes.chunks(64).collect();
        let total = c.len() as u16;
        c.iter()
            .enumerate()
            .map(|(i, d)| Msg::InstallChunk {
                view: proposal,
                index: i as u16,
                total,
                data: d.to_vec(),
            })
            .collect()
    };
    // One byte of the signature flipped in the last part: each part is a valid group packet
    // (any member holds the view's keys), the whole fails the coordinator's signature.
    let mut tampered = body.clone();
    let at = tampered.len() - 5;
    tampered[at] ^= 0x40;
    let before = h.member.counters().get(Drop::AuthFailed);
    let parts = chunks(&tampered);
    assert!(parts.len() > 2, "the Install should come in several parts");
    for p in &parts {
        let packet = seal(p);
        h.member.handle_datagram(h.now, h.a, &packet);
    }
    h.pump();
    assert_eq!(
        h.member.view().map(|v| v.id),
        Some(view1),
        "tampered Install installed"
    );
    assert_eq!(h.member.counters().get(Drop::AuthFailed), before + 1);

    // A part whose total disagrees with the others is dropped and counted as malformed.
    let malformed = h.member.counters().get(Drop::Malformed);
    let good = chunks(&body);
    let packet = seal(&good[0]);
    h.member.handle_datagram(h.now, h.a, &packet);
    let odd = seal(&Msg::InstallChunk {
        view: proposal,
        index: 1,
        total: good.len() as u16 + 1,
        data: vec![0; 10],
    });
    h.member.handle_datagram(h.now, h.a, &odd);
    assert_eq!(h.member.counters().get(Drop::Malformed), malformed + 1);

    // The whole Install, in order or not, installs.
    for p in good.iter().rev() {
        let packet = seal(p);
        h.member.handle_datagram(h.now, h.a, &packet);
    }
    h.pump();
    assert_eq!(h.member.view().map(|v| v.id), Some(proposal));
}

#[test]
fn a_leader_gives_its_list_to_nobody_outside_the_view() {
    let provider = CryptoProvider::default_provider();
    let leader_id = identity(1);
    let outsider = identity(2);
    let (ca, cb) = (MemberId(leader_id.public()), MemberId(outsider.public()));
    let a: SocketAddr = "10.8.0.1:7000".parse().expect("addr");
    let b: SocketAddr = "10.8.0.2:7000".parse().expect("addr");
    let trust = vec![ca, cb];
    let mut leader = GroupMember::new(
        provider,
        leader_id,
        a,
        GroupConfig::new("g", trust.clone()),
        [5; 32],
    )
    .expect("leader");
    leader.start(Timestamp::ZERO, &[]);
    let view = leader.view().expect("founded").id;
    // The harness's "member" is the leader here; the test's pair table is the outsider.
    let mut h = Harness {
        provider,
        pairs: PairTable::new(provider, outsider, "g", trust, [4; 32]),
        member: leader,
        a: b,
        b: a,
        now: Timestamp::ZERO,
        events: Vec::new(),
    };
    let before = h.member.counters().get(Drop::Unexpected);
    h.send(ca, &PairMsg::ListRequest { view, from: 0 });
    let got = h.pump();
    assert!(
        !got.iter().any(|m| matches!(m, PairMsg::Part { .. })),
        "an outsider got the list: {got:?}"
    );
    assert_eq!(h.member.counters().get(Drop::Unexpected), before + 1);
}
