//! Harnesses shared by the fuzz targets (`fuzz/fuzz_targets/group_*.rs`) and the property
//! tests (`tests/fuzz_harness.rs`): one function per parser or state machine, taking
//! arbitrary bytes. None panics on any input except through its own assertions, which are
//! the properties the fuzzer checks (a failed one is a finding); each returns what the tests
//! assert on.
//!
//! Everything is deterministic except the pair channel's KEM key generation (which takes the
//! provider's randomness): identities come from fixed secrets, members and pair tables from
//! fixed seeds, and time is virtual. In particular the group keys of [`TestGroup`] (drawn
//! from the founder's seeded generator) are the same in every build, so real packets
//! captured from one build are valid in another; the harnesses therefore check that nothing
//! is delivered that a member of the harness did not send, not that nothing is delivered.
//!
//! Not part of the crate's API: it exists for the fuzzers and the tests.

use crate::channels::Pairs;
use crate::config::{GroupConfig, Protection};
use crate::event::{Channel, GroupEvent, RemovalReason};
use crate::id::{Member, MemberId, ViewId};
use crate::keys::{GearPlan, GroupKey, ViewKeys};
use crate::pair::{PairEvent, PairTable};
use crate::wire::{Install, Joined, KeyDelivery, Msg, PairMsg};
use crate::GroupMember;
use cohort_channel::identity::Identity;
use cohort_core::{Machine, Timestamp};
use cohort_crypto::{CryptoProvider, Secret};
use cohort_gears::{GearId, GearKeys, ProtectError, Protector, PACKET_VERSION};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;
use zeroize::Zeroizing;

/// The group every harness uses.
pub const GROUP: &str = "fuzz";
/// Where member 0 (the founder, the leader) is.
pub const ADDR_A: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 7000);
/// Where member 1 (the joiner) is.
pub const ADDR_B: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), 7000);
/// An address outside the group.
pub const ADDR_STRANGER: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 99)), 7000);
/// The time every harness starts at.
const START: Timestamp = Timestamp::from_millis(1_000);
/// Most datagrams one input is split into.
const MAX_DATAGRAMS: usize = 16;
/// Most timer steps a harness runs after its input (a bound against a timer that never
/// moves forward; real runs take a few dozen).
const MAX_STEPS: usize = 2_000;
/// What the members of [`TestGroup`] send each other when asked for traffic.
const TRAFFIC: [&[u8]; 4] = [
    b"reliable from a",
    b"reliable from b",
    b"unreliable",
    b"more",
];

/// Unwraps harness set-up that cannot fail with the default provider; a failure is a bug
/// the fuzzer should report loudly.
#[allow(clippy::expect_used)] // reason: see above; this is test tooling
fn must<T, E: std::fmt::Debug>(r: Result<T, E>, what: &str) -> T {
    r.expect(what)
}

fn provider() -> CryptoProvider {
    CryptoProvider::default_provider()
}

/// The fixed identity number `i` (0 and 1 are the members of [`TestGroup`]).
pub fn identity(i: u8) -> Identity {
    let mut secret = [0x6d; 32];
    secret[0] = i;
    must(
        Identity::from_secret(&provider(), Secret::from_slice(&secret)),
        "identity from a fixed secret",
    )
}

/// Splits `data` into at most 16 datagrams: each is `length (u16 BE) | bytes`; a length
/// beyond the end takes what remains.
pub fn split_datagrams(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    while rest.len() >= 2 && out.len() < MAX_DATAGRAMS {
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        let body = &rest[2..];
        let take = len.min(body.len());
        out.push(&body[..take]);
        rest = &body[take..];
    }
    out
}

/// The inverse of [`split_datagrams`], for building inputs.
pub fn join_datagrams<'a>(datagrams: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    for d in datagrams {
        let len = d.len().min(usize::from(u16::MAX));
        out.extend_from_slice(&(len as u16).to_be_bytes());
        out.extend_from_slice(&d[..len]);
    }
    out
}

// ------------------------------------------------------------------------------- codecs

/// Arbitrary bytes as a [`Msg`]: decoding must not panic, and what decodes must survive a
/// round trip: `decode(encode(m)) == m`, and the encoding is the input itself (the format
/// is canonical: no two byte strings decode to one message). Returns the message.
pub fn msg_decode(data: &[u8]) -> Option<Msg> {
    let msg = Msg::decode(data)?;
    let mut out = Vec::new();
    msg.encode(&mut out);
    assert_eq!(Msg::decode(&out).as_ref(), Some(&msg), "Msg round trip");
    assert_eq!(out, data, "Msg encoding is not canonical");
    Some(msg)
}

/// Arbitrary bytes as a [`PairMsg`]: the same properties as [`msg_decode`].
pub fn pair_msg_decode(data: &[u8]) -> Option<PairMsg> {
    let msg = PairMsg::decode(data)?;
    let mut out = Vec::new();
    msg.encode(&mut out);
    assert_eq!(
        PairMsg::decode(&out).as_ref(),
        Some(&msg),
        "PairMsg round trip"
    );
    assert_eq!(out, data, "PairMsg encoding is not canonical");
    Some(msg)
}

/// A flush message's name for [`sample_view`] (its coordinator at rank 0).
fn sample_ref() -> crate::wire::ViewRef {
    crate::wire::ViewRef {
        seq: sample_view().seq,
        coordinator: 0,
    }
}

fn sample_view() -> ViewId {
    ViewId {
        seq: 7,
        coordinator: MemberId(identity(0).public()),
    }
}

fn sample_members() -> Vec<Member> {
    vec![
        Member {
            id: MemberId(identity(0).public()),
            addr: ADDR_A,
        },
        Member {
            id: MemberId(identity(1).public()),
            addr: SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 7001),
        },
    ]
}

fn sample_install(key: KeyDelivery, merge_into: Option<SocketAddr>) -> Install {
    Install {
        view: sample_view(),
        base: ViewId {
            seq: 6,
            coordinator: MemberId(identity(0).public()),
        },
        count: 2,
        left: vec![1, 4],
        joined: vec![Joined {
            member: sample_members()[1],
            next_seq: 3,
            incarnation: 0x2222,
        }],
        digest: [0x3d; 32],
        next_seqs: vec![3, 0],
        key_epoch: 4,
        final_order: 12,
        key,
        merge_into,
        removed: vec![(1, RemovalReason::Left), (4, RemovalReason::Lagged)],
        signature: vec![0x5a; 64],
    }
}

/// One message of every [`Msg`] variant (and every [`KeyDelivery`] and merge form of
/// Install): seeds for the fuzzers and the mutation tests.
pub fn sample_msgs() -> Vec<Msg> {
    vec![
        Msg::Heartbeat {
            delivered: 5,
            ordered: 9,
            stable: 3,
            load: 200,
            failures: 1,
        },
        Msg::Unreliable {
            seq: 2,
            data: b"unreliable".to_vec(),
        },
        Msg::Submit {
            seq: 3,
            data: b"submit".to_vec(),
        },
        Msg::Ordered {
            order: 4,
            sender: 1,
            seq: 3,
            data: b"ordered".to_vec(),
        },
        Msg::Nak { from: 2, to: 9 },
        Msg::OrderedRun {
            first: 7,
            entries: vec![(1, 4, b"run".to_vec()), (0, 2, Vec::new())],
        },
        Msg::Flush {
            proposal: sample_ref(),
            survivors: vec![0, 1],
        },
        Msg::FlushOk {
            proposal: sample_ref(),
            delivered: 4,
            next_seq: 6,
            pending: vec![(4, b"four".to_vec()), (5, Vec::new())],
        },
        Msg::Install(Box::new(sample_install(KeyDelivery::Same, None))),
        Msg::Install(Box::new(sample_install(
            KeyDelivery::Wrapped(vec![(1, [0x77; 48])]),
            None,
        ))),
        Msg::Install(Box::new(sample_install(
            KeyDelivery::Tree([9; 8]),
            Some(ADDR_B),
        ))),
        Msg::InstallChunk {
            view: sample_view(),
            index: 1,
            total: 3,
            data: vec![0x08; 40],
        },
        Msg::InstallAck,
        Msg::Leave,
        Msg::RekeyRequest,
        Msg::Report {
            delivered: 41,
            holder: 17,
            load: 9,
            failures: 2,
            suspects: vec![18, 300],
        },
        Msg::Orphaned { parent: 3 },
        Msg::Probe,
        Msg::ProbeAck,
        Msg::Install(Box::new(sample_install(
            KeyDelivery::Lkh(Box::new(crate::lkh::LkhDelivery {
                degree: 4,
                depth: 2,
                wraps: vec![crate::lkh::Wrap {
                    target: crate::lkh::NodeId { level: 1, index: 0 },
                    child: 1,
                    sealed: [0x55; crate::lkh::SEALED_LEN],
                }],
                paths: vec![(1, vec![0x66; 4 + 3 * 40 + 16])],
            })),
            None,
        ))),
        Msg::FlushOks {
            proposal: sample_ref(),
            delivered: 12,
            holder: 18,
            answered: vec![(17, 3), (33, 1)],
            next_seqs: vec![(18, 4)],
            pending: vec![(18, 3, b"pending".to_vec())],
        },
        Msg::InstallAcks {
            view: sample_ref(),
            acked: vec![(1, 16), (40, 2)],
        },
        Msg::LeftOut {
            view: sample_view(),
            base: sample_view(),
            kept: crate::wire::kept_bits(12, &[2, 11]),
            rejoined: vec![11],
            signature: vec![0x5A; 64],
        },
        // As it decodes: the ids it leaves out are zero until the receiver fills them in.
        Msg::InstallInView(Box::new(Install {
            view: ViewId {
                seq: 7,
                coordinator: MemberId::from_bytes([0; 32]),
            },
            base: ViewId {
                seq: 0,
                coordinator: MemberId::from_bytes([0; 32]),
            },
            signature: Vec::new(),
            ..sample_install(KeyDelivery::Wrapped(vec![(1, [0x78; 48])]), None)
        })),
    ]
}

/// One message of every [`PairMsg`] variant.
pub fn sample_pair_msgs() -> Vec<PairMsg> {
    vec![
        PairMsg::JoinRequest {
            group: GROUP.into(),
            incarnation: 0x1234,
            next_seq: 2,
            key_proof: None,
        },
        PairMsg::JoinRequest {
            group: GROUP.into(),
            incarnation: 0x1235,
            next_seq: 0,
            key_proof: Some([0x5c; 16]),
        },
        PairMsg::Redirect { leader: ADDR_A },
        PairMsg::NotInGroup,
        PairMsg::Welcome {
            install: Box::new(sample_install(KeyDelivery::Same, None)),
            key: Zeroizing::new(vec![0x42; 32]),
            roster: crate::wire::encode_roster(&sample_members(), &[0x1111, 0x2222]),
        },
        PairMsg::Part {
            view: sample_view(),
            what: crate::wire::PART_LIST,
            index: 0,
            total: 2,
            data: vec![0x21; 30],
        },
        PairMsg::ListRequest {
            view: sample_view(),
            from: 8,
        },
        PairMsg::KeyShare {
            proposal: sample_view(),
            key_epoch: 5,
            key: Zeroizing::new(vec![0x43; 32]),
            below: (3, 40),
            degree: 2,
        },
        PairMsg::Ping,
        PairMsg::Removed {
            view: sample_view(),
            reason: RemovalReason::Left,
        },
        PairMsg::Grant {
            view: sample_view(),
            token: vec![0x66; 97],
            members: vec![ADDR_A, ADDR_B],
        },
        PairMsg::Present {
            view: sample_view(),
            token: vec![0x66; 97],
        },
        PairMsg::Ticket {
            nonce: [0x11; 16],
            key_epoch: 4,
            key: Zeroizing::new(vec![0x44; 32]),
        },
        PairMsg::KeyAck {
            proposal: sample_view(),
            holders: vec![(1, 3), (7, 40)],
        },
        // A part of a KDC-mode Grant too long for one record (`PART_GRANT`).
        PairMsg::Part {
            view: sample_view(),
            what: crate::wire::PART_GRANT,
            index: 1,
            total: 3,
            data: vec![0x37; 40],
        },
    ]
}

// ------------------------------------------------------------------------------- members

/// Two members in one view, connected by an in-memory network with no loss: member 0 (at
/// [`ADDR_A`]) founded the group and leads it, member 1 (at [`ADDR_B`]) joined through it
/// (a pair channel, a Welcome, a rekey). Every datagram either sends is recorded.
pub struct TestGroup {
    /// The two members.
    pub members: [GroupMember; 2],
    /// Virtual time.
    pub now: Timestamp,
    /// Every datagram sent: (from, to, bytes).
    pub sent: Vec<(SocketAddr, SocketAddr, Vec<u8>)>,
    /// Every event, by member, since the last [`take_events`](Self::take_events).
    pub events: [Vec<GroupEvent>; 2],
}

impl TestGroup {
    /// The group, formed and quiet. With `null`, packets are protected with the null gear
    /// (`Protection::DangerNoneForTesting`), so a fuzzer can forge them; otherwise with
    /// `aes-128-gcm`. With `traffic`, each member sends a reliable and an unreliable message
    /// and both are delivered everywhere before this returns.
    pub fn new(null: bool, traffic: bool) -> TestGroup {
        let ids = [identity(0), identity(1)];
        let trust: Vec<MemberId> = ids.iter().map(|i| MemberId(i.public())).collect();
        let mut config = GroupConfig::new(GROUP, trust);
        if null {
            config.protection = Protection::DangerNoneForTesting;
        }
        let [a, b] = ids;
        let member = |identity: Identity, addr: SocketAddr, seed: u8| {
            must(
                GroupMember::new(provider(), identity, addr, config.clone(), [seed; 32]),
                "member",
            )
        };
        let mut g = TestGroup {
            members: [member(a, ADDR_A, 0xa0), member(b, ADDR_B, 0xb0)],
            now: START,
            sent: Vec::new(),
            events: [Vec::new(), Vec::new()],
        };
        g.members[0].start(g.now, &[]);
        g.members[1].start(g.now, &[ADDR_A]);
        g.run_for(Duration::from_millis(300));
        if traffic {
            let now = g.now;
            let _ = g.members[0].send(now, Channel::Reliable, TRAFFIC[0]);
            let _ = g.members[1].send(now, Channel::Reliable, TRAFFIC[1]);
            let _ = g.members[1].send(now, Channel::Unreliable, TRAFFIC[2]);
            let _ = g.members[0].send(now, Channel::Unreliable, TRAFFIC[3]);
            g.run_for(Duration::from_millis(300));
        }
        g
    }

    /// A copy of this group (`GroupMember::fork`): the same members in the same state, the
    /// same time, datagrams and events, with nothing shared, so running the copy leaves this
    /// group as it was. `None` only if a member cannot be copied (not for this group's
    /// identity-mode members).
    pub fn fork(&self) -> Option<TestGroup> {
        Some(TestGroup {
            members: [self.members[0].fork()?, self.members[1].fork()?],
            now: self.now,
            sent: self.sent.clone(),
            events: self.events.clone(),
        })
    }

    /// A copy of the group [`new`](Self::new) forms for `null` and `traffic`, formed once
    /// per thread and copied per call ([`fork`](Self::fork)): forming it (the pair channel's
    /// handshake, Welcome, rekey) was about two fifths of `group_member`'s time. The copy
    /// goes on as a freshly formed group does (`tests/fuzz_harness.rs`,
    /// `a_cached_group_is_a_fresh_group`): forming is deterministic except for the pair
    /// channel's KEM keys, which only change the bytes of pair-channel datagrams.
    pub fn cached(null: bool, traffic: bool) -> TestGroup {
        thread_local! {
            static GROUPS: std::cell::OnceCell<[TestGroup; 4]> = const { std::cell::OnceCell::new() };
        }
        let copy = GROUPS.with(|groups| {
            groups.get_or_init(|| {
                [
                    TestGroup::new(false, false),
                    TestGroup::new(false, true),
                    TestGroup::new(true, false),
                    TestGroup::new(true, true),
                ]
            })[usize::from(null) * 2 + usize::from(traffic)]
            .fork()
        });
        must(
            copy.ok_or("identity-mode members copy"),
            "a copy of the formed group",
        )
    }

    /// Whether member `i`'s pair channels use caches of their own, none of `other`'s member
    /// `i`'s (the check that [`fork`](Self::fork) shares nothing; false in KDC mode).
    pub fn pair_caches_are_own(&self, other: &TestGroup, i: usize) -> bool {
        match (self.members[i].pair_table(), other.members[i].pair_table()) {
            (Some(mine), Some(theirs)) => mine.caches_are_its_own(theirs),
            _ => false,
        }
    }

    /// Whether both members are in one view of both.
    pub fn formed(&self) -> bool {
        match (self.members[0].view(), self.members[1].view()) {
            (Some(a), Some(b)) => a.id == b.id && a.members.len() == 2,
            _ => false,
        }
    }

    /// The index of the member at `addr`.
    fn index(addr: SocketAddr) -> Option<usize> {
        [ADDR_A, ADDR_B].iter().position(|a| *a == addr)
    }

    /// Delivers every queued datagram (and what it causes) until both members are quiet.
    pub fn pump(&mut self) {
        // Bounded: a protocol that answers every packet with another runs forever otherwise.
        let mut buf = Vec::new();
        for _ in 0..10_000 {
            let mut moved = false;
            for i in 0..2 {
                let from = [ADDR_A, ADDR_B][i];
                while let Some(t) = self.members[i].poll_transmit(self.now, &mut buf) {
                    moved = true;
                    let d = buf[..t.size].to_vec();
                    buf.clear();
                    if let Some(j) = Self::index(t.destination) {
                        self.members[j].handle_datagram(self.now, from, &d);
                    }
                    // Recorded after delivery, so the one copy serves both.
                    self.sent.push((from, t.destination, d));
                }
                while let Some(e) = self.members[i].poll_event() {
                    self.events[i].push(e);
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// Runs timers and the network for `d` of virtual time.
    pub fn run_for(&mut self, d: Duration) {
        let until = self.now.saturating_add(d);
        self.pump();
        for _ in 0..MAX_STEPS {
            let next = self.members.iter().filter_map(|m| m.poll_timeout()).min();
            let Some(next) = next else { break };
            if next > until {
                break;
            }
            // A timer in the past moves time on by a millisecond, so the loop ends.
            self.now = if next > self.now {
                next
            } else {
                self.now.saturating_add(Duration::from_millis(1))
            };
            for m in &mut self.members {
                m.handle_timeout(self.now);
            }
            self.pump();
        }
        self.now = self.now.max(until);
    }

    /// Hands `data` to member `to` as a datagram from `from`, then delivers what follows.
    pub fn feed(&mut self, to: usize, from: SocketAddr, data: &[u8]) {
        self.members[to].handle_datagram(self.now, from, data);
        self.pump();
    }

    /// Takes the recorded events.
    pub fn take_events(&mut self) -> [Vec<GroupEvent>; 2] {
        std::mem::take(&mut self.events)
    }

    /// Group packets (not pair datagrams) that member `from` sent to member `to`.
    pub fn group_packets(&self, from: usize, to: usize) -> Vec<Vec<u8>> {
        let (f, t) = ([ADDR_A, ADDR_B][from], [ADDR_A, ADDR_B][to]);
        self.sent
            .iter()
            .filter(|(a, b, d)| *a == f && *b == t && d.first() == Some(&PACKET_VERSION))
            .map(|(_, _, d)| d.clone())
            .collect()
    }

    /// Keys that seal bodies as member `rank` of member `of`'s current view, for a group
    /// built with `null`: any key will do under the null gear. The first `skip` sequence
    /// numbers are used up, so the packets are not taken for replays of real ones.
    pub fn forger(&self, of: usize, rank: u16, skip: usize) -> Option<ViewKeys> {
        let view = self.members[of].view()?;
        let plan = GearPlan::new(&Protection::DangerNoneForTesting);
        let key = GroupKey::new(view.key_epoch, Secret::from_slice(&[0; 32]));
        let mut keys = ViewKeys::derive(
            &provider(),
            GROUP,
            &key,
            view.id,
            view.members.len(),
            rank,
            &plan,
        )
        .ok()?;
        let mut scratch = Vec::new();
        for _ in 0..skip {
            scratch.clear();
            keys.seal(&[GearId::DangerNullForTesting], &[], &mut scratch)
                .ok()?;
        }
        Some(keys)
    }

    /// What [`forger`](Self::forger) makes, without sealing `skip` packets first: the
    /// forger starts at sequence number `skip` directly, so its packets are byte for byte
    /// those of `forger(of, rank, skip)` (`tests/fuzz_harness.rs` checks that) at a
    /// fraction of the cost (a thousand seals per input were an eighth of `group_member`'s
    /// time).
    pub fn null_forger(&self, of: usize, rank: u16, skip: usize) -> Option<Forger> {
        let view = self.members[of].view()?;
        let plan = GearPlan::new(&Protection::DangerNoneForTesting);
        // Under the null gear any key will do (see `forger`).
        let keys = GearKeys::derive(&provider(), &[0; 32], plan.gears).ok()?;
        let [hi, lo] = rank.to_be_bytes();
        Some(Forger {
            protector: Protector::new(keys),
            header: [view.id.seq as u8, hi, lo],
            next_seq: u64::try_from(skip).ok()?,
        })
    }
}

/// Seals bodies as one member of a view under the null gear, from a chosen sequence number
/// on ([`TestGroup::null_forger`]).
pub struct Forger {
    protector: Protector,
    /// The group header: key slot, sender rank.
    header: [u8; 3],
    /// The sequence number of the next packet.
    next_seq: u64,
}

impl Forger {
    /// Appends a packet carrying `body` to `out`, as the view's keys would seal it.
    pub fn seal(&mut self, body: &[u8], out: &mut Vec<u8>) -> Result<(), ProtectError> {
        self.protector.protect_with_seq(
            self.next_seq,
            &[GearId::DangerNullForTesting],
            &self.header,
            body,
            out,
        )?;
        self.next_seq += 1;
        Ok(())
    }
}

/// What [`member_datagram`] saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberOutcome {
    /// Datagrams fed.
    pub fed: usize,
    /// Drops the receiving member counted while the input was processed (and after).
    pub dropped: u64,
    /// Messages delivered after the input, at either member.
    pub delivered: usize,
    /// Views installed after the input, at either member.
    pub views: usize,
}

/// The control byte of [`member_datagram`]'s input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberControl {
    /// Packets are protected with the null gear (forgeable), not `aes-128-gcm`.
    pub null: bool,
    /// The input goes to member 1 (the follower), not member 0 (the leader).
    pub to_follower: bool,
    /// Null gear only: each datagram is a body (`destination u16 | Msg`) that the harness
    /// seals as a packet of the other member in the current view.
    pub seal: bool,
    /// The datagrams come from an address outside the group, not from the other member.
    pub from_stranger: bool,
    /// The members exchange traffic on both channels before the input.
    pub traffic: bool,
}

impl MemberControl {
    /// Bit 0 `null`, bit 1 `to_follower`, bit 2 `seal`, bit 3 `from_stranger`, bit 4
    /// `traffic`.
    pub fn from_byte(b: u8) -> MemberControl {
        MemberControl {
            null: b & 1 != 0,
            to_follower: b & 2 != 0,
            seal: b & 4 != 0,
            from_stranger: b & 8 != 0,
            traffic: b & 16 != 0,
        }
    }

    /// The byte for these choices.
    pub fn byte(self) -> u8 {
        u8::from(self.null)
            | u8::from(self.to_follower) << 1
            | u8::from(self.seal) << 2
            | u8::from(self.from_stranger) << 3
            | u8::from(self.traffic) << 4
    }
}

/// A control byte ([`MemberControl`]), then datagrams (see [`split_datagrams`]) for a member
/// of a formed two-member group ([`TestGroup`]), which then runs for two seconds of virtual
/// time (heartbeats, suspicion, view changes, key phases) with its peer. It must never
/// panic; under `aes-128-gcm` nothing may be delivered that the harness's members did not
/// send, and the group must still be one view. (Under the null gear a forged packet is as
/// good as a real one, and the group may well change its view.)
///
/// Each input gets a copy of a group formed once ([`TestGroup::cached`]).
pub fn member_datagram(data: &[u8]) -> MemberOutcome {
    let Some(&control) = data.first() else {
        return MemberOutcome::default();
    };
    let c = MemberControl::from_byte(control);
    member_datagram_in(&mut TestGroup::cached(c.null, c.traffic), data)
}

/// [`member_datagram`] on a given group, formed as the control byte says (`null` and
/// `traffic`): for the test that a cached group behaves as a fresh one. The group's events
/// from the input on are left in `g.events`, and what it sent in `g.sent`.
pub fn member_datagram_in(g: &mut TestGroup, data: &[u8]) -> MemberOutcome {
    let Some((&control, rest)) = data.split_first() else {
        return MemberOutcome::default();
    };
    let c = MemberControl::from_byte(control);
    let to = usize::from(c.to_follower);
    let from = if c.from_stranger {
        ADDR_STRANGER
    } else {
        [ADDR_B, ADDR_A][to]
    };
    let _ = g.take_events();
    let before = g.members[to].counters().total();
    let mut forger = if c.null && c.seal {
        // Past every sequence number the real sender used and will use while the harness
        // runs (it sends far fewer packets than this), and well inside the replay window.
        let skip = g.sent.len() + 1_000;
        g.null_forger(to, 1 - to as u16, skip)
    } else {
        None
    };
    let datagrams = split_datagrams(rest);
    for d in &datagrams {
        match forger.as_mut() {
            Some(forger) => {
                let mut packet = Vec::new();
                if forger.seal(d, &mut packet).is_ok() {
                    g.feed(to, from, &packet);
                }
            }
            None => g.feed(to, from, d),
        }
    }
    // Two seconds: the shortest run in which the `formed` check below still sees a group
    // an input broke: a member that stops hearing its peer suspects it after
    // `suspect_timeout` (1 s), then flushes (`flush_timeout`, 0.5 s) and installs the smaller
    // view. Most of what an input costs is this run's heartbeats (ten a second each way).
    g.run_for(Duration::from_secs(2));
    let events = g.take_events();
    let mut outcome = MemberOutcome {
        fed: datagrams.len(),
        dropped: g.members[to].counters().total().saturating_sub(before),
        ..MemberOutcome::default()
    };
    for e in events.iter().flatten() {
        match e {
            GroupEvent::Deliver { data, .. } => {
                outcome.delivered += 1;
                if !c.null {
                    assert!(
                        TRAFFIC.contains(&data.as_slice()),
                        "delivered a message no member sent: {data:?}"
                    );
                }
            }
            GroupEvent::View(_) => outcome.views += 1,
            _ => {}
        }
    }
    if !c.null {
        assert!(g.formed(), "arbitrary datagrams broke up the group");
    }
    g.events = events;
    outcome
}

// ------------------------------------------------------------------------------- pairs

/// What [`pair_datagram`] saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PairOutcome {
    /// Datagrams fed.
    pub fed: usize,
    /// The table's drop counter grew by this much.
    pub dropped: u64,
    /// `Established` events after the input.
    pub established: usize,
    /// `Message` events after the input.
    pub messages: usize,
    /// `Failed` events after the input.
    pub failed: usize,
}

impl PairOutcome {
    /// Counts one event of the table under test. Only the real peer `b_id` (and only when
    /// `real_peer`) may be established, and only [`PAIR_HELLO`] may be delivered: anything
    /// else panics.
    fn count(&mut self, e: PairEvent, real_peer: bool, b_id: MemberId) {
        match e {
            PairEvent::Established { peer, .. } => {
                assert!(
                    real_peer && peer == b_id,
                    "an unproven peer was established"
                );
                self.established += 1;
            }
            PairEvent::Message { peer, data, .. } => {
                assert!(
                    real_peer && peer == b_id && data == PAIR_HELLO,
                    "a message the peer did not send was delivered"
                );
                self.messages += 1;
            }
            PairEvent::Failed { .. } => self.failed += 1,
        }
    }
}

/// What the real peer of [`pair_datagram`] sends once its channel is up.
const PAIR_HELLO: &[u8] = b"hello over the pair channel";

/// Delivers datagrams between two pair tables (the first at [`ADDR_A`], the second at
/// [`ADDR_B`]) until both are quiet.
fn pump_pairs(now: Timestamp, a: &mut PairTable, b: &mut PairTable) {
    for _ in 0..1_000 {
        let mut moved = false;
        let mut buf = Vec::new();
        while let Some(t) = a.poll_transmit(now, &mut buf) {
            moved = true;
            if t.destination == ADDR_B {
                b.handle_datagram(now, ADDR_A, &buf[..t.size]);
            }
            buf.clear();
        }
        while let Some(t) = b.poll_transmit(now, &mut buf) {
            moved = true;
            if t.destination == ADDR_A {
                a.handle_datagram(now, ADDR_B, &buf[..t.size]);
            }
            buf.clear();
        }
        if !moved {
            return;
        }
    }
}

/// A control byte, then datagrams (see [`split_datagrams`]) from [`ADDR_B`] into the
/// [`PairTable`] of member 0, which trusts only member 1. Control bit 0: the table first
/// opens a channel to `ADDR_B` (so it waits as a client for a ServerHello); bit 1: member
/// 1's real table first completes an authenticated channel with it (so the bytes reach an
/// established channel). After each datagram the table's timers run 300 ms on. It must never
/// panic, and never report an authenticated peer or a message that the real peer did not
/// make: without bit 1 nothing is ever established.
pub fn pair_datagram(data: &[u8]) -> PairOutcome {
    let Some((&control, rest)) = data.split_first() else {
        return PairOutcome::default();
    };
    let b_id = MemberId(identity(1).public());
    let now = START;
    let mut table = PairTable::new(provider(), identity(0), GROUP, vec![b_id], [0xa1; 32]);
    let real_peer = control & 2 != 0;
    if control & 1 != 0 {
        table.send(now, ADDR_B, Some(b_id), b"from a");
    }
    if real_peer {
        let a_id = MemberId(identity(0).public());
        let mut peer = PairTable::new(provider(), identity(1), GROUP, vec![a_id], [0xb1; 32]);
        peer.send(now, ADDR_A, Some(a_id), PAIR_HELLO);
        pump_pairs(now, &mut table, &mut peer);
    }
    let mut table = Pairs::Identity(Box::new(table));
    feed_pairs(&mut table, rest, now, false, real_peer, b_id)
}

/// Feeds the datagrams of `rest` (see [`split_datagrams`]) to `table`, after dropping the
/// events it already had: each from the KDC if `from_kdc`, else from [`ADDR_B`], then its
/// timers run 300 ms on and what it sends is dropped. Counts the events as
/// [`PairOutcome::count`] does, and the drops.
fn feed_pairs(
    table: &mut Pairs,
    rest: &[u8],
    mut now: Timestamp,
    from_kdc: bool,
    real_peer: bool,
    b_id: MemberId,
) -> PairOutcome {
    let dropped = |t: &Pairs| match t {
        Pairs::Identity(t) => t.drops().total(),
        Pairs::Kdc(t) => t.drops().total(),
    };
    while table.poll_event().is_some() {}
    let before = dropped(table);
    let mut outcome = PairOutcome::default();
    let mut buf = Vec::new();
    let datagrams = split_datagrams(rest);
    outcome.fed = datagrams.len();
    for d in datagrams {
        if from_kdc {
            table.handle_kdc(now, d);
        } else {
            table.handle_datagram(now, ADDR_B, d);
        }
        now = now.saturating_add(Duration::from_millis(300));
        table.handle_timeout(now);
        while table.poll_transmit(now, &mut buf).is_some() {
            buf.clear();
        }
        while let Some(e) = table.poll_event() {
            outcome.count(e, real_peer, b_id);
        }
    }
    outcome.dropped = dropped(table).saturating_sub(before);
    outcome
}

// ------------------------------------------------------------------------ gossip, KDC pairs

/// Parses a gossip packet (`exchange::decode`) and runs the checks a leader runs on it under
/// a fixed group key. It must never panic. A parsed Id or Ticket can pass its signature
/// check only if it is byte for byte one the harness's identities made (the fuzzer cannot
/// forge Ed25519); returns whether it parsed and whether a signature verified.
pub fn gossip_packet(data: &[u8]) -> (bool, bool) {
    let Some(parsed) = crate::exchange::decode(data) else {
        return (false, false);
    };
    let key = GroupKey::new(1, Secret::from_slice(&[0x42; 32]));
    let _ = crate::exchange::id_is_secure(&provider(), GROUP, &key, data, &parsed);
    let signed = crate::exchange::signature_ok(&provider(), data, &parsed);
    if let crate::exchange::Gossip::Ticket(t) = &parsed.gossip {
        let local = crate::exchange::LocalId::nonce_only(t.nonce);
        let _ = crate::exchange::open_ticket(&provider(), GROUP, &t.recipient, &local, data, t);
    }
    (true, signed)
}

/// Real gossip packets: an Id, a Ticket answering it, and a KDC-mode Id.
pub fn sample_gossip() -> Vec<Vec<u8>> {
    let p = provider();
    let key = GroupKey::new(3, Secret::from_slice(&[0x42; 32]));
    let mut out = Vec::new();
    let Some(local) = crate::exchange::LocalId::new(&p, [9; 16]) else {
        return out;
    };
    if let Some(id) = crate::exchange::encode_id(&p, &identity(0), GROUP, ADDR_A, 2, &local, &key) {
        if let Some(crate::exchange::Parsed {
            gossip: crate::exchange::Gossip::Id(parsed),
            ..
        }) = crate::exchange::decode(&id)
        {
            if let Some(t) = crate::exchange::encode_ticket(&p, &identity(1), GROUP, &parsed, &key)
            {
                out.push(t);
            }
        }
        out.push(id);
    }
    let kdc_id = MemberId::from_principal(&kdc_name(0));
    out.push(crate::exchange::encode_kdc_id(
        &p,
        &kdc_id,
        GROUP,
        ADDR_A,
        2,
        &crate::exchange::LocalId::nonce_only([8; 16]),
        &key,
    ));
    out
}

fn kdc_name(i: u8) -> cohort_kdc::PrincipalName {
    must(
        cohort_kdc::PrincipalName::new(&format!("p{i}")),
        "a principal name",
    )
}

fn kdc_key(i: u8) -> cohort_kdc::PrincipalKey {
    cohort_kdc::PrincipalKey::from_bytes([0x30 + i; 32])
}

/// The KDC address of [`kdc_pair_datagram`].
pub const ADDR_KDC: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 50)), 7600);

fn kdc_table(i: u8, peer: u8) -> crate::kdc_pair::KdcPairTable {
    crate::kdc_pair::KdcPairTable::new(
        provider(),
        crate::kdc_pair::KdcCredentials {
            name: kdc_name(i),
            key: kdc_key(i),
            kdc: ADDR_KDC,
        },
        GROUP,
        vec![MemberId::from_principal(&kdc_name(peer))],
        false,
        [0xc0 + i; 32],
    )
}

/// Moves datagrams between two KDC-mode tables (at [`ADDR_A`] and [`ADDR_B`]) and a KDC
/// that knows both, until nothing moves.
fn pump_kdc_pairs(
    now: Timestamp,
    a: &mut crate::kdc_pair::KdcPairTable,
    b: &mut crate::kdc_pair::KdcPairTable,
    kdc: &mut cohort_kdc::Kdc,
    mut tap: Option<&mut Vec<Vec<u8>>>,
) {
    let mut buf = Vec::new();
    for _ in 0..64 {
        let mut moved = false;
        for side in 0..2 {
            let from = if side == 0 { ADDR_A } else { ADDR_B };
            let mut sent = Vec::new();
            {
                let me = if side == 0 { &mut *a } else { &mut *b };
                while let Some(t) = me.poll_transmit(now, &mut buf) {
                    sent.push((t.destination, buf[..t.size].to_vec()));
                    buf.clear();
                }
            }
            for (to, d) in sent {
                moved = true;
                if let Some(tap) = tap.as_deref_mut() {
                    tap.push(d.clone());
                }
                if to == ADDR_KDC {
                    if let Some(reply) = kdc.handle_request(from, &d) {
                        let me = if side == 0 { &mut *a } else { &mut *b };
                        me.handle_kdc(now, &reply);
                    }
                } else if to == ADDR_A {
                    a.handle_datagram(now, from, &d);
                } else if to == ADDR_B {
                    b.handle_datagram(now, from, &d);
                }
            }
        }
        if !moved {
            return;
        }
    }
}

/// Real KDC-mode pair datagrams: a whole handshake between two members and a KDC, and
/// data both ways.
pub fn captured_kdc_pair_datagrams() -> Vec<Vec<u8>> {
    let mut registry = cohort_kdc::Registry::new();
    registry.insert(kdc_name(0), kdc_key(0));
    registry.insert(kdc_name(1), kdc_key(1));
    let mut kdc = cohort_kdc::Kdc::new(provider(), registry);
    let (mut a, mut b) = (kdc_table(0, 1), kdc_table(1, 0));
    let mut tap = Vec::new();
    let b_id = MemberId::from_principal(&kdc_name(1));
    b.send(START, ADDR_A, None, PAIR_HELLO);
    pump_kdc_pairs(START, &mut a, &mut b, &mut kdc, Some(&mut tap));
    a.send(START, ADDR_B, Some(b_id), b"back");
    pump_kdc_pairs(START, &mut a, &mut b, &mut kdc, Some(&mut tap));
    tap
}

/// A control byte, then datagrams from [`ADDR_B`] into the KDC-mode pair table of principal
/// `p0`, which trusts only `p1`. Control bit 0: the table first opens a channel to `ADDR_B`;
/// bit 1: `p1`'s real table first opens a channel to it through a KDC that knows both, and
/// sends a message. Datagrams for the KDC are dropped after that (so the fuzzer's input
/// cannot lean on a live KDC); bit 2 feeds each datagram as if it came from the KDC
/// instead. It must never panic, and never report a peer or a message that `p1` did not
/// make: without bit 1 nothing is ever established.
pub fn kdc_pair_datagram(data: &[u8]) -> PairOutcome {
    let Some((&control, rest)) = data.split_first() else {
        return PairOutcome::default();
    };
    let b_id = MemberId::from_principal(&kdc_name(1));
    let now = START;
    let mut table = kdc_table(0, 1);
    let real_peer = control & 2 != 0;
    if control & 1 != 0 {
        table.send(now, ADDR_B, Some(b_id), b"from a");
    }
    if real_peer {
        let mut registry = cohort_kdc::Registry::new();
        registry.insert(kdc_name(0), kdc_key(0));
        registry.insert(kdc_name(1), kdc_key(1));
        let mut kdc = cohort_kdc::Kdc::new(provider(), registry);
        let mut peer = kdc_table(1, 0);
        peer.send(now, ADDR_A, None, PAIR_HELLO);
        pump_kdc_pairs(now, &mut table, &mut peer, &mut kdc, None);
    }
    let mut table = Pairs::Kdc(Box::new(table));
    feed_pairs(&mut table, rest, now, control & 4 != 0, real_peer, b_id)
}
