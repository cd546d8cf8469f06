//! An insider attack on the view change: every member of the old view holds its keys, so a
//! member being removed can seal a perfectly valid group packet as the coordinator. The
//! Install it forges must still be refused, because Installs carry the coordinator's Ed25519
//! signature. The "coordinator" here is the test itself: it lets a real member in over a
//! real pair channel, with a group key the test knows, then drives a view change by hand.

use cohort_channel::identity::Identity;
use cohort_core::{Machine, Timestamp};
use cohort_crypto::{CryptoProvider, Secret};
use cohort_group::keys::{GearPlan, GroupKey, ViewKeys};
use cohort_group::pair::{PairEvent, PairTable, PAIR_KIND};
use cohort_group::wire::{
    encode_roster, kept_bits, left_out_signed_bytes, roster_digest, Install, Joined, KeyDelivery,
    Msg, PairMsg, ViewRef,
};
use cohort_group::{Drop, GroupConfig, GroupEvent, GroupMember, Member, MemberId, ViewId};
use std::net::SocketAddr;

fn identity(i: u8) -> Identity {
    let provider = CryptoProvider::default_provider();
    let mut bytes = [0u8; 32];
    bytes[0] = i;
    bytes[31] = 0x77;
    Identity::from_secret(&provider, Secret::from_slice(&bytes)).expect("identity")
}

struct Harness {
    provider: CryptoProvider,
    coordinator: Identity,
    pairs: PairTable,
    member: GroupMember,
    a: SocketAddr,
    b: SocketAddr,
    now: Timestamp,
    events: Vec<GroupEvent>,
    from_member: Vec<Vec<u8>>,
}

impl Harness {
    /// Shuttles datagrams both ways until quiet; keeps the member's group packets for
    /// inspection and hands pair messages to the test.
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
                } else {
                    self.from_member.push(d);
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

    fn sign(&self, install: &mut Install, by: &Identity) {
        install.signature = by
            .sign(&self.provider, &install.signed_bytes("g"))
            .expect("sign");
    }
}

/// A harness whose member (rank 1) was welcomed into view 1 of two members by the test
/// (rank 0); the view's id, key, its members' roster digest and the keys the test seals
/// with as rank 0.
fn welcomed() -> (Harness, ViewId, [u8; 32], ViewKeys, GearPlan) {
    let provider = CryptoProvider::default_provider();
    let coordinator = identity(1);
    let member_id = identity(2);
    let insider = identity(3);
    let (ca, cb) = (MemberId(coordinator.public()), MemberId(member_id.public()));
    let trust = vec![ca, cb, MemberId(insider.public())];
    let a: SocketAddr = "10.9.0.1:7000".parse().expect("addr");
    let b: SocketAddr = "10.9.0.2:7000".parse().expect("addr");
    let config = GroupConfig::new("g", trust.clone());
    let plan = GearPlan::new(&config.protection);
    let member = GroupMember::new(provider, member_id, b, config.clone(), [9; 32]).expect("m");
    let pairs = PairTable::new(provider, coordinator.clone(), "g", trust, [8; 32]);
    let mut h = Harness {
        provider,
        coordinator,
        pairs,
        member,
        a,
        b,
        now: Timestamp::ZERO,
        events: Vec::new(),
        from_member: Vec::new(),
    };

    // The member asks to join; the test answers as the group's coordinator.
    h.member.start(h.now, &[a]);
    let mut incarnation = None;
    for _ in 0..20 {
        for m in h.pump() {
            if let PairMsg::JoinRequest { incarnation: i, .. } = m {
                incarnation = Some(i);
            }
        }
        if incarnation.is_some() {
            break;
        }
        h.advance(100);
    }
    let incarnation = incarnation.expect("a join request");
    let view1 = ViewId {
        seq: 1,
        coordinator: ca,
    };
    let members = vec![Member { id: ca, addr: a }, Member { id: cb, addr: b }];
    let roster = encode_roster(&members, &[1, incarnation]);
    let digest = roster_digest(provider.keyed_blake3, &roster);
    let key1 = GroupKey::new(1, Secret::from_slice(&[0x11; 32]));
    let view0 = ViewId {
        seq: 0,
        coordinator: ca,
    };
    let mut welcome = two_members(view1, view0, digest);
    welcome.joined = vec![Joined {
        member: members[1],
        next_seq: 0,
        incarnation,
    }];
    let c = h.coordinator.clone();
    h.sign(&mut welcome, &c);
    let msg = PairMsg::Welcome {
        install: Box::new(welcome),
        key: zeroize::Zeroizing::new(key1.expose().to_vec()),
        roster,
    };
    let mut body = Vec::new();
    msg.encode(&mut body);
    h.pairs.send(h.now, b, Some(cb), &body);
    h.pump();
    assert_eq!(h.member.view().map(|v| v.id), Some(view1), "welcomed");
    let keys = ViewKeys::derive(&provider, "g", &key1, view1, 2, 0, &plan).expect("keys");
    (h, view1, digest, keys, plan)
}

/// An unsigned Install of both members into `view` from `base`, keeping the key of epoch 1.
fn two_members(view: ViewId, base: ViewId, digest: [u8; 32]) -> Install {
    Install {
        view,
        base,
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
    }
}

/// `msg` sealed by rank 0 under `keys`, to rank 1.
fn seal(keys: &mut ViewKeys, plan: &GearPlan, msg: &Msg) -> Vec<u8> {
    let mut body = vec![0, 1]; // to rank 1
    msg.encode(&mut body);
    let mut packet = Vec::new();
    keys.seal(&plan.ladder, &body, &mut packet).expect("seal");
    packet
}

/// A view change to view 2 of both members: the test's Flush (rank 0, the coordinator
/// `ca`) under view 1's `keys`; the member is then flushing. Returns the proposal.
fn start_view_change(
    h: &mut Harness,
    keys: &mut ViewKeys,
    plan: &GearPlan,
    ca: MemberId,
) -> ViewId {
    let proposal = ViewId {
        seq: 2,
        coordinator: ca,
    };
    let flush = seal(
        keys,
        plan,
        &Msg::Flush {
            proposal: ViewRef {
                seq: proposal.seq,
                coordinator: 0,
            },
            survivors: vec![0, 1],
        },
    );
    h.member.handle_datagram(h.now, h.a, &flush);
    h.pump();
    assert!(h.member.status().changing_view, "flushing");
    proposal
}

/// Hands `packet` from `from` to the member and asserts that it was refused: counted once
/// as `drop`, and the member still in `view`. `what` names the case in the messages.
fn assert_refused(
    h: &mut Harness,
    from: SocketAddr,
    packet: &[u8],
    drop: Drop,
    view: ViewId,
    what: &str,
) {
    let before = h.member.counters().get(drop);
    h.member.handle_datagram(h.now, from, packet);
    h.pump();
    assert_eq!(
        h.member.view().map(|v| v.id),
        Some(view),
        "{what}: installed"
    );
    assert_eq!(
        h.member.counters().get(drop),
        before + 1,
        "{what}: not counted"
    );
}

#[test]
fn a_forged_install_is_refused_and_a_signed_one_installs() {
    let (mut h, view1, digest, mut keys, plan) = welcomed();
    let (a, c, ca) = (h.a, h.coordinator.clone(), view1.coordinator);
    let insider = identity(3);
    let install = |view: ViewId, base: ViewId, _: Vec<Joined>| two_members(view, base, digest);
    let seal = |keys: &mut ViewKeys, msg: &Msg| seal(keys, &plan, msg);

    let proposal = start_view_change(&mut h, &mut keys, &plan, ca);

    // The forged Install: right proposal, sealed under the right keys (any member of view 1
    // could do this), keeping the old key, but not signed by the coordinator.
    let mut forged = install(proposal, view1, Vec::new());
    h.sign(&mut forged, &insider);
    let packet = seal(&mut keys, &Msg::Install(Box::new(forged.clone())));
    assert_refused(
        &mut h,
        a,
        &packet,
        Drop::AuthFailed,
        view1,
        "a forged Install",
    );

    // The same Install signed by the coordinator installs.
    h.sign(&mut forged, &c);
    let packet = seal(&mut keys, &Msg::Install(Box::new(forged)));
    h.member.handle_datagram(h.now, a, &packet);
    h.pump();
    assert_eq!(h.member.view().map(|v| v.id), Some(proposal));
    assert!(h
        .events
        .iter()
        .any(|e| matches!(e, GroupEvent::View(v) if v.id == proposal)));
}

/// A LeftOut (the notice that stands in for the Install to members a view change leaves
/// out) moves the member on only when the coordinator of the new view signed it, for the
/// member's own view, leaving it out: the same notice replayed to a member it keeps, one
/// for another base, a malformed bitmap and one an insider signed are each refused and
/// counted, and the member stays in its view.
#[test]
fn a_left_out_notice_must_be_signed_for_this_view_and_leave_this_member_out() {
    let (mut h, view1, _, mut keys, plan) = welcomed();
    let (a, c) = (h.a, h.coordinator.clone());
    let insider = identity(3);
    let proposal = ViewId {
        seq: 2,
        coordinator: view1.coordinator,
    };
    let notice = |base: ViewId, kept: Vec<u8>, by: &Identity| {
        let provider = CryptoProvider::default_provider();
        let signed = left_out_signed_bytes("g", &proposal, &base, &kept, &[]);
        Msg::LeftOut {
            view: proposal,
            base,
            kept,
            rejoined: Vec::new(),
            signature: by.sign(&provider, &signed).expect("sign"),
        }
    };
    let refused = |h: &mut Harness, keys: &mut ViewKeys, msg: Msg, drop: Drop, why: &str| {
        let packet = seal(keys, &plan, &msg);
        assert_refused(h, a, &packet, drop, view1, why);
        assert!(
            !h.member.status().changing_view,
            "{why}: a view change began"
        );
    };
    // Keeps both members: the copy sent to a member left out, replayed to this one.
    refused(
        &mut h,
        &mut keys,
        notice(view1, kept_bits(2, &[]), &c),
        Drop::Unexpected,
        "keeps this member",
    );
    let view0 = ViewId {
        seq: 0,
        coordinator: view1.coordinator,
    };
    refused(
        &mut h,
        &mut keys,
        notice(view0, kept_bits(2, &[1]), &c),
        Drop::Unexpected,
        "another base",
    );
    refused(
        &mut h,
        &mut keys,
        notice(view1, vec![0x01, 0x00], &c),
        Drop::Unexpected,
        "a bitmap of the wrong length",
    );
    refused(
        &mut h,
        &mut keys,
        notice(view1, kept_bits(2, &[1]), &insider),
        Drop::AuthFailed,
        "signed by an insider",
    );
    // The coordinator's own: the member goes on at once, in a view without those kept.
    let packet = seal(&mut keys, &plan, &notice(view1, kept_bits(2, &[1]), &c));
    h.member.handle_datagram(h.now, a, &packet);
    h.pump();
    for _ in 0..20 {
        if h.member.view().is_some_and(|v| v.id != view1) {
            break;
        }
        h.advance(50);
        h.pump();
    }
    let view = h.member.view().expect("a view");
    let me = MemberId(identity(2).public());
    assert_ne!(view.id, view1, "still in the view it was left out of");
    assert_eq!(view.id.coordinator, me);
    assert_eq!(
        view.members.iter().map(|m| m.id).collect::<Vec<_>>(),
        vec![me]
    );
}

/// A one-message Install carries no signature (`GROUP_VERSION` 10): the member's own wrap,
/// under the pair key it shares with the coordinator, authenticates it. An insider can
/// seal an Install under the old view's keys but cannot make that wrap: one with a wrap of
/// its own making, and the coordinator's real Install with a field changed around the real
/// wrap (the wrap binds every field a signature covered), are each refused and counted,
/// even when the coordinator's signature is attached; the real one, unsigned, installs with
/// the wrapped key.
#[test]
fn a_one_message_install_is_authenticated_by_the_members_wrap() {
    let (mut h, view1, digest, mut keys, plan) = welcomed();
    let (a, c, ca, cb) = (h.a, h.coordinator.clone(), view1.coordinator, {
        let id = identity(2);
        MemberId(id.public())
    });
    let seal = |keys: &mut ViewKeys, msg: &Msg| seal(keys, &plan, msg);
    let proposal = start_view_change(&mut h, &mut keys, &plan, ca);

    // The coordinator's Install: a fresh key of epoch 2, wrapped for rank 1 under the pair
    // key, binding SHA-256 of what a signature would cover.
    let key2 = GroupKey::new(2, Secret::from_slice(&[0x22; 32]));
    let mut real = two_members(proposal, view1, digest);
    real.key_epoch = 2;
    real.key = KeyDelivery::Wrapped(Vec::new());
    let wrap_for = |install: &Install| {
        let bind = h.provider.sha256.sha256(&[&install.signed_bytes("g")]);
        let pk = h.pairs.pair_key(&cb).expect("pair key");
        cohort_group::keys::wrap(pk, &install.view, 1, &cb, &key2, &bind).expect("wrap")
    };
    let wrap = wrap_for(&real);
    real.key = KeyDelivery::Wrapped(vec![(1, wrap)]);

    let refused = |h: &mut Harness, keys: &mut ViewKeys, msg: Msg, what: &str| {
        let packet = seal(keys, &msg);
        assert_refused(h, a, &packet, Drop::AuthFailed, view1, what);
    };
    let whole = |install: &Install| Msg::Install(Box::new(install.clone()));
    // A wrap of the insider's making, with the coordinator's signature over the rest.
    let mut made_up = real.clone();
    made_up.key = KeyDelivery::Wrapped(vec![(1, [0x42; 48])]);
    h.sign(&mut made_up, &c);
    refused(
        &mut h,
        &mut keys,
        whole(&made_up),
        "an Install with a made-up wrap",
    );
    // The real wrap around a changed Install (another final order), signed or not, whole
    // or without its view ids.
    let mut changed = real.clone();
    changed.final_order = 7;
    refused(&mut h, &mut keys, whole(&changed), "a changed Install");
    let in_view = Msg::InstallInView(Box::new(changed.clone()));
    refused(&mut h, &mut keys, in_view, "a changed Install in view");
    h.sign(&mut changed, &c);
    refused(
        &mut h,
        &mut keys,
        whole(&changed),
        "a changed Install, signed",
    );

    // The real one, unsigned, installs, under the wrapped key; sent as coordinators send
    // it, without its view ids (the member takes them from the packet).
    assert!(real.signature.is_empty());
    let packet = seal(&mut keys, &Msg::InstallInView(Box::new(real)));
    h.member.handle_datagram(h.now, a, &packet);
    h.pump();
    assert_eq!(h.member.view().map(|v| v.id), Some(proposal));
    assert_eq!(h.member.view().map(|v| v.key_epoch), Some(2));
    // It holds the wrapped key: a message sealed under the new view's keys is delivered.
    let mut keys2 = ViewKeys::derive(&h.provider, "g", &key2, proposal, 2, 0, &plan).expect("k");
    let msg = Msg::Unreliable {
        seq: 1,
        data: b"under the new key".to_vec(),
    };
    let packet = seal(&mut keys2, &msg);
    h.member.handle_datagram(h.now, a, &packet);
    h.pump();
    assert!(h
        .events
        .iter()
        .any(|e| matches!(e, GroupEvent::Deliver { data, .. } if data == b"under the new key")));
}
