//! The group fuzz targets' harnesses (`cohort_group::fuzzing`) as property tests, so they run
//! in every `cargo test` and cannot rot: each on arbitrary bytes, and on real messages (a
//! sample of every variant, and packets captured from a real two-member group) with bytes
//! flipped, cut, inserted and spliced, so the tests reach past the first length check.
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

use cohort_core::{Machine, Timestamp};
use cohort_crypto::CryptoProvider;
use cohort_gears::GearId;
use cohort_group::fuzzing::{
    captured_kdc_pair_datagrams, gossip_packet, identity, join_datagrams, kdc_pair_datagram,
    member_datagram, member_datagram_in, msg_decode, pair_datagram, pair_msg_decode, sample_gossip,
    sample_msgs, sample_pair_msgs, MemberControl, TestGroup, ADDR_A, ADDR_B,
};
use cohort_group::pair::PairTable;
use cohort_group::{Channel, GroupEvent, MemberId};
use proptest::prelude::*;
use std::sync::OnceLock;
use std::time::Duration;

/// One change to a byte string.
#[derive(Clone, Debug)]
enum Mutation {
    /// XOR the byte at (position mod length) with a nonzero value.
    Flip(usize, u8),
    /// Keep the first (position mod (length + 1)) bytes.
    Truncate(usize),
    /// Insert a byte.
    Insert(usize, u8),
    /// Remove a byte.
    Remove(usize),
    /// Replace the bytes from a position on with others (extends as often as it cuts).
    Splice(usize, Vec<u8>),
    /// Set a 16-bit big-endian field (a count, say) to a value near its extremes.
    Length(usize, u16),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), 1u8..=255).prop_map(|(p, x)| Mutation::Flip(p, x)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(p, b)| Mutation::Insert(p, b)),
        1 => any::<usize>().prop_map(Mutation::Remove),
        1 => (any::<usize>(), prop::collection::vec(any::<u8>(), 0..40))
            .prop_map(|(p, v)| Mutation::Splice(p, v)),
        1 => (any::<usize>(), prop_oneof![Just(0u16), Just(1), Just(0xffff), any::<u16>()])
            .prop_map(|(p, v)| Mutation::Length(p, v)),
    ]
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec(mutation(), 1..4)
}

fn apply(ms: &[Mutation], bytes: &mut Vec<u8>) {
    for m in ms {
        let len = bytes.len();
        match m {
            Mutation::Flip(p, x) if len > 0 => bytes[p % len] ^= x,
            Mutation::Flip(..) => {}
            Mutation::Truncate(p) => bytes.truncate(p % (len + 1)),
            Mutation::Insert(p, b) => bytes.insert(p % (len + 1), *b),
            Mutation::Remove(p) if len > 0 => {
                bytes.remove(p % len);
            }
            Mutation::Remove(_) => {}
            Mutation::Splice(p, v) => {
                bytes.truncate(p % (len + 1));
                bytes.extend_from_slice(v);
            }
            Mutation::Length(p, v) if len > 1 => {
                let at = p % (len - 1);
                bytes[at..at + 2].copy_from_slice(&v.to_be_bytes());
            }
            Mutation::Length(..) => {}
        }
    }
}

/// The datagram `which` picks from `all`, with `ms` applied.
fn pick_mutated(all: &[Vec<u8>], which: &prop::sample::Index, ms: &[Mutation]) -> Vec<u8> {
    let mut d = all[which.index(all.len())].clone();
    apply(ms, &mut d);
    d
}

/// One to three picks of a real datagram, each with its mutations.
fn picks() -> impl Strategy<Value = Vec<(prop::sample::Index, Vec<Mutation>)>> {
    prop::collection::vec((any::<prop::sample::Index>(), mutations()), 1..4)
}

/// A control byte, then the picked real datagrams, each mutated, joined as one input.
fn mutated_input(
    control: u8,
    all: &[Vec<u8>],
    picks: &[(prop::sample::Index, Vec<Mutation>)],
) -> Vec<u8> {
    let datagrams: Vec<Vec<u8>> = picks
        .iter()
        .map(|(which, ms)| pick_mutated(all, which, ms))
        .collect();
    let mut input = vec![control];
    input.extend(join_datagrams(datagrams.iter().map(Vec::as_slice)));
    input
}

/// A control byte, then `data`: a harness's input.
fn with_control(control: u8, data: Vec<u8>) -> Vec<u8> {
    let mut input = vec![control];
    input.extend(data);
    input
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

/// Every sample message, encoded.
fn encoded_msgs() -> Vec<Vec<u8>> {
    sample_msgs()
        .iter()
        .map(|m| {
            let mut out = Vec::new();
            m.encode(&mut out);
            out
        })
        .collect()
}

fn encoded_pair_msgs() -> Vec<Vec<u8>> {
    sample_pair_msgs()
        .iter()
        .map(|m| {
            let mut out = Vec::new();
            m.encode(&mut out);
            out
        })
        .collect()
}

/// Group packets a real two-member group (AES-128-GCM) sent while forming and exchanging
/// messages, both ways.
fn captured_packets() -> &'static [Vec<u8>] {
    static PACKETS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    PACKETS.get_or_init(|| {
        let g = TestGroup::new(false, true);
        let mut all = g.group_packets(1, 0);
        all.extend(g.group_packets(0, 1));
        all
    })
}

/// Pair datagrams member 1's table sent to member 0's during a real handshake, proofs and
/// one message.
fn captured_pair_datagrams() -> &'static [Vec<u8>] {
    static DATAGRAMS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    DATAGRAMS.get_or_init(|| {
        let provider = CryptoProvider::default_provider();
        let (a_id, b_id) = (
            MemberId(identity(0).public()),
            MemberId(identity(1).public()),
        );
        let mut a = PairTable::new(provider, identity(0), "fuzz", vec![b_id], [1; 32]);
        let mut b = PairTable::new(provider, identity(1), "fuzz", vec![a_id], [2; 32]);
        let now = Timestamp::from_millis(1_000);
        b.send(now, ADDR_A, Some(a_id), b"captured");
        let mut captured = Vec::new();
        for _ in 0..50 {
            let mut moved = false;
            let mut buf = Vec::new();
            while let Some(t) = b.poll_transmit(now, &mut buf) {
                moved = true;
                captured.push(buf[..t.size].to_vec());
                a.handle_datagram(now, ADDR_B, &buf[..t.size]);
                buf.clear();
            }
            while let Some(t) = a.poll_transmit(now, &mut buf) {
                moved = true;
                b.handle_datagram(now, ADDR_A, &buf[..t.size]);
                buf.clear();
            }
            if !moved {
                break;
            }
        }
        assert!(a.peer_at(ADDR_B).is_some(), "the real channel came up");
        captured
    })
}

#[test]
fn every_sample_message_round_trips() {
    for (m, bytes) in sample_msgs().iter().zip(encoded_msgs()) {
        assert_eq!(msg_decode(&bytes).as_ref(), Some(m));
        // The traffic counters name each type by its variant.
        let name = cohort_group::wire::msg_type_name(bytes[0]).expect("a named type");
        let debug = format!("{m:?}");
        let rest = debug.strip_prefix(name).unwrap_or("?");
        assert!(
            rest.is_empty() || rest.starts_with([' ', '(']),
            "type {} named {name}: {debug:.40}",
            bytes[0]
        );
    }
    for (m, bytes) in sample_pair_msgs().iter().zip(encoded_pair_msgs()) {
        assert_eq!(pair_msg_decode(&bytes).as_ref(), Some(m));
    }
}

#[test]
fn the_test_group_forms_and_delivers() {
    let mut g = TestGroup::new(false, true);
    assert!(g.formed());
    let events = g.take_events();
    for (i, ev) in events.iter().enumerate() {
        let delivered = ev
            .iter()
            .filter(|e| matches!(e, GroupEvent::Deliver { .. }))
            .count();
        assert_eq!(delivered, 4, "member {i} delivered {delivered}");
    }
    assert!(!captured_packets().is_empty());
}

/// A real packet is sealed and delivered by the harness: forged bodies under the null gear
/// reach the message handlers (or the mutation tests below would test only the parser).
#[test]
fn sealed_bodies_reach_the_members() {
    let unreliable = {
        let mut body = vec![0xff, 0xff];
        cohort_group::wire::Msg::Unreliable {
            seq: 40,
            data: b"more".to_vec(),
        }
        .encode(&mut body);
        body
    };
    let control = MemberControl {
        null: true,
        to_follower: false,
        seal: true,
        from_stranger: false,
        traffic: false,
    };
    let mut input = vec![control.byte()];
    input.extend(join_datagrams([unreliable.as_slice()]));
    let outcome = member_datagram(&input);
    assert_eq!(outcome.delivered, 1, "{outcome:?}");
    assert_eq!(outcome.dropped, 0, "{outcome:?}");
}

/// The null forger that starts at its sequence number is the forger that seals its way up
/// to it: the same packets, byte for byte, for either member and rank.
#[test]
fn the_null_forger_seals_what_the_sealing_forger_seals() {
    let g = TestGroup::new(true, true);
    for (of, rank, skip) in [(0, 1, 1_000), (1, 0, 37), (1, 1, 0)] {
        let mut slow = g.forger(of, rank, skip).expect("forger");
        let mut fast = g.null_forger(of, rank, skip).expect("null forger");
        let bodies: [&[u8]; 3] = [b"", b"\xff\xff a body", &[7; 300]];
        for body in bodies {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            slow.seal(&[GearId::DangerNullForTesting], body, &mut a)
                .expect("seal");
            fast.seal(body, &mut b).expect("seal");
            assert_eq!(a, b, "member {of}, rank {rank}, skip {skip}");
        }
    }
}

/// Inputs for the tests of the cached group: for each of the four groups (`null`,
/// `traffic`) and both members, nothing, a replayed real packet, arbitrary bytes, a body
/// sealed as the peer (an unreliable message, a Leave, a Flush), and a sample of the
/// committed `group_member` corpus.
fn member_inputs() -> Vec<Vec<u8>> {
    let body = |m: cohort_group::wire::Msg| {
        let mut body = vec![0xff, 0xff];
        m.encode(&mut body);
        body
    };
    let bodies = [
        body(cohort_group::wire::Msg::Unreliable {
            seq: 40,
            data: b"more".to_vec(),
        }),
        body(cohort_group::wire::Msg::Leave),
        body(cohort_group::wire::Msg::RekeyRequest),
    ];
    let mut out = Vec::new();
    for null in [false, true] {
        for traffic in [false, true] {
            for to_follower in [false, true] {
                let c = |seal, from_stranger| MemberControl {
                    null,
                    to_follower,
                    seal,
                    from_stranger,
                    traffic,
                };
                out.push(vec![c(false, false).byte()]);
                out.push(with_control(
                    c(false, false).byte(),
                    join_datagrams(captured_packets().iter().take(3).map(Vec::as_slice)),
                ));
                out.push(with_control(
                    c(false, true).byte(),
                    vec![0, 5, 1, 2, 3, 4, 5],
                ));
                if null {
                    for b in &bodies {
                        out.push(with_control(
                            c(true, false).byte(),
                            join_datagrams([b.as_slice()]),
                        ));
                    }
                }
            }
        }
    }
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fuzz/corpus/group_member"
    );
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("the group_member corpus")
        .map(|e| e.expect("a corpus entry").path())
        .collect();
    files.sort();
    out.extend(
        files
            .iter()
            .step_by(25)
            .map(|f| std::fs::read(f).expect("a corpus file")),
    );
    out
}

/// Whether a datagram carries key material drawn from the provider's randomness (which no
/// seed controls): a pair channel's handshake frame (its KEM share or ciphertext) or a
/// gossip packet (its Id's KEM key).
fn draws_randomness(d: &[u8]) -> bool {
    match d {
        [cohort_group::pair::PAIR_KIND, 0, ..] => true,
        [k, ..] => *k == cohort_group::exchange::GOSSIP_KIND,
        [] => false,
    }
}

/// Compares two runs datagram by datagram, and their time and events. Every datagram's
/// sender, receiver, first byte and length must match. From `exact_from` on (the input's
/// first datagram), the bytes must match too, up to the first datagram that
/// [`draws_randomness`]: from there the two runs hold different keys (a fresh KEM key pair
/// in each), so every later record and wrapped key differs in its bytes, not in its size.
/// Returns how many datagrams were compared byte for byte.
fn same_run(a: &TestGroup, b: &TestGroup, exact_from: Option<usize>, what: &str) -> usize {
    assert_eq!(a.now, b.now, "{what}");
    assert_eq!(a.events, b.events, "{what}");
    assert_eq!(a.sent.len(), b.sent.len(), "{what}");
    let mut exact = 0;
    let mut diverged = false;
    for (k, (x, y)) in a.sent.iter().zip(&b.sent).enumerate() {
        let shape = |d: &(_, _, Vec<u8>)| (d.0, d.1, d.2.first().copied(), d.2.len());
        assert_eq!(shape(x), shape(y), "datagram {k}: {what}");
        if exact_from.is_some_and(|from| k >= from) && !diverged {
            diverged = draws_randomness(&x.2);
            if !diverged {
                let at = x.2.iter().zip(&y.2).position(|(p, q)| p != q);
                assert!(x.2 == y.2, "datagram {k} differs at {at:?}: {what}");
                exact += 1;
            }
        }
    }
    exact
}

/// A copy of the cached group (what `group_member` runs each input on) behaves as a group
/// formed for that input did before: for every input of [`member_inputs`], the same
/// outcome, time, events, and datagrams of the same kind and size, to the same members,
/// including those sent while forming. (Not byte for byte: two groups formed apart drew
/// different KEM keys for their pair channel, so their pair records and the keys wrapped
/// under their pair keys differ. The next test compares bytes.)
#[test]
fn a_cached_group_is_a_fresh_group() {
    let inputs = member_inputs();
    assert!(inputs.len() > 40, "{} inputs", inputs.len());
    let mut delivered = 0;
    for input in &inputs {
        let c = MemberControl::from_byte(input[0]);
        let mut fresh = TestGroup::new(c.null, c.traffic);
        let mut cached = TestGroup::cached(c.null, c.traffic);
        let a = member_datagram_in(&mut fresh, input);
        let b = member_datagram_in(&mut cached, input);
        let what = format!("{c:?}, input {input:02x?}");
        assert_eq!(a, b, "{what}");
        same_run(&fresh, &cached, None, &what);
        delivered += a.delivered;
    }
    assert!(delivered > 0, "no input delivered anything");
}

/// A copy is its original, byte for byte, and shares nothing with it. Every pair channel
/// of the copy uses the copy's own endpoint caches (tickets, resumption cache, nonce
/// generator), and the copy and its freshly formed original, given the same input one after
/// the other, send the same bytes (pair records, group packets, wrapped keys) up to the
/// first fresh KEM key either draws ([`same_run`]). So do two copies of the cached group,
/// one run after the other: one input leaves nothing behind for the next.
#[test]
fn a_copy_is_its_original_and_shares_nothing() {
    let inputs = member_inputs();
    let mut exact = 0;
    for input in &inputs {
        let c = MemberControl::from_byte(input[0]);
        let mut original = TestGroup::new(c.null, c.traffic);
        let mut copy = original.fork().expect("a copy");
        for i in 0..2 {
            let channels = original.members[i].pair_table().map_or(0, |t| t.channels());
            assert!(channels > 0, "member {i} has no pair channel to check");
            assert!(copy.pair_caches_are_own(&original, i), "member {i}");
            assert!(original.pair_caches_are_own(&copy, i), "member {i}");
        }
        let what = format!("{c:?}, input {input:02x?}");
        let formed = original.sent.len();
        let a = member_datagram_in(&mut copy, input);
        let b = member_datagram_in(&mut original, input);
        assert_eq!(a, b, "{what}");
        exact += same_run(&copy, &original, Some(formed), &what);
        let (mut first, mut second) = (
            TestGroup::cached(c.null, c.traffic),
            TestGroup::cached(c.null, c.traffic),
        );
        let formed = first.sent.len();
        let a = member_datagram_in(&mut first, input);
        let b = member_datagram_in(&mut second, input);
        assert_eq!(a, b, "{what}");
        exact += same_run(&first, &second, Some(formed), &what);
    }
    assert!(
        exact > 1000,
        "only {exact} datagrams compared byte for byte"
    );
}

/// Every single-bit flip of every real group packet is refused and counted, and delivers
/// nothing.
#[test]
fn flipped_real_packets_are_all_counted_and_never_delivered() {
    let mut g = TestGroup::new(false, true);
    // More traffic on both channels, so the capture holds every kind of packet.
    for k in 0..5u8 {
        let now = g.now;
        g.members[0].send(now, Channel::Reliable, &[k]).unwrap();
        g.members[1].send(now, Channel::Reliable, &[k]).unwrap();
        g.members[1].send(now, Channel::Unreliable, &[k]).unwrap();
        g.run_for(Duration::from_millis(20));
    }
    g.run_for(Duration::from_millis(500));
    let _ = g.take_events();
    let mut total = 0;
    for (from, to) in [(1usize, 0usize), (0, 1)] {
        let packets = g.group_packets(from, to);
        assert!(packets.len() > 10, "captured {} packets", packets.len());
        let addr = [ADDR_A, ADDR_B][from];
        let now = g.now;
        for p in &packets {
            for bit in 0..p.len() * 8 {
                let mut flipped = p.clone();
                flipped[bit / 8] ^= 1 << (bit % 8);
                let before = g.members[to].counters().total();
                g.members[to].handle_datagram(now, addr, &flipped);
                assert_eq!(
                    g.members[to].counters().total(),
                    before + 1,
                    "flipped bit {bit} of a {}-byte packet was not counted once",
                    p.len()
                );
                while let Some(e) = g.members[to].poll_event() {
                    assert!(
                        !matches!(e, GroupEvent::Deliver { .. } | GroupEvent::View(_)),
                        "a flipped packet was taken: {e:?}"
                    );
                }
                let mut buf = Vec::new();
                while g.members[to].poll_transmit(now, &mut buf).is_some() {
                    buf.clear();
                }
                total += 1;
            }
        }
    }
    assert!(total > 1000);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn msg_arbitrary(data in bytes(200)) {
        let _ = msg_decode(&data);
    }

    #[test]
    fn msg_mutated(which in any::<prop::sample::Index>(), ms in mutations()) {
        let _ = msg_decode(&pick_mutated(&encoded_msgs(), &which, &ms));
    }

    #[test]
    fn pair_msg_arbitrary(data in bytes(200)) {
        let _ = pair_msg_decode(&data);
    }

    #[test]
    fn pair_msg_mutated(which in any::<prop::sample::Index>(), ms in mutations()) {
        let _ = pair_msg_decode(&pick_mutated(&encoded_pair_msgs(), &which, &ms));
    }
}

proptest! {
    // Each case builds a group (a pair handshake) and runs it for two virtual seconds:
    // about a millisecond.
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn member_arbitrary(control in any::<u8>(), data in bytes(300)) {
        let _ = member_datagram(&with_control(control, data));
    }

    /// Real messages, mutated, sealed as the other member's under the null gear: they pass
    /// authentication and reach the protocol's handlers.
    #[test]
    fn member_sealed_mutated_messages(
        to_follower in any::<bool>(),
        traffic in any::<bool>(),
        picks in prop::collection::vec(
            (any::<prop::sample::Index>(), any::<u16>(), any::<bool>(), mutations()),
            1..4,
        ),
    ) {
        let all = encoded_msgs();
        let bodies: Vec<Vec<u8>> = picks
            .iter()
            .map(|(which, dest, mutate, ms)| {
                // Destination: broadcast, rank 0 or rank 1 mostly, anything sometimes.
                let dest = match dest % 4 { 0 => 0xffff, 1 => 0, 2 => 1, _ => *dest };
                let mut body = dest.to_be_bytes().to_vec();
                let mut m = all[which.index(all.len())].clone();
                if *mutate {
                    apply(ms, &mut m);
                }
                body.extend(m);
                body
            })
            .collect();
        let control = MemberControl {
            null: true,
            to_follower,
            seal: true,
            from_stranger: false,
            traffic,
        };
        let mut input = vec![control.byte()];
        input.extend(join_datagrams(bodies.iter().map(Vec::as_slice)));
        let _ = member_datagram(&input);
    }

    /// Real captured AES-GCM packets, mutated: never delivered unless unchanged.
    #[test]
    fn member_captured_mutated(
        to_follower in any::<bool>(),
        which in any::<prop::sample::Index>(),
        ms in mutations(),
    ) {
        let all = captured_packets();
        let p = pick_mutated(all, &which, &ms);
        let control = MemberControl {
            null: false,
            to_follower,
            seal: false,
            from_stranger: false,
            traffic: false,
        };
        let mut input = vec![control.byte()];
        input.extend(join_datagrams([p.as_slice()]));
        let _ = member_datagram(&input);
    }

    #[test]
    fn pair_arbitrary(control in 0u8..4, data in bytes(400)) {
        let outcome = pair_datagram(&with_control(control, data));
        prop_assert!(outcome.established == 0 || control & 2 != 0);
    }

    /// Real handshake, proof and data datagrams, mutated.
    #[test]
    fn pair_captured_mutated(
        control in 0u8..4,
        picks in picks(),
    ) {
        let input = mutated_input(control, captured_pair_datagrams(), &picks);
        let _ = pair_datagram(&input);
    }

    #[test]
    fn gossip_arbitrary(data in bytes(1600)) {
        let (_, signed) = gossip_packet(&data);
        prop_assert!(!signed, "arbitrary bytes passed a signature check");
    }

    /// Real Ids and Tickets, mutated: a mutation that still parses never keeps a valid
    /// signature unless the bytes are unchanged.
    #[test]
    fn gossip_captured_mutated(which in any::<prop::sample::Index>(), ms in mutations()) {
        let all = sample_gossip();
        let original = all[which.index(all.len())].clone();
        let mut d = original.clone();
        apply(&ms, &mut d);
        let (_, signed) = gossip_packet(&d);
        prop_assert!(!signed || d == original);
    }

    #[test]
    fn kdc_pair_arbitrary(control in 0u8..8, data in bytes(400)) {
        let outcome = kdc_pair_datagram(&with_control(control, data));
        prop_assert!(outcome.established == 0 || control & 2 != 0);
    }

    /// Real KDC-mode handshake and data datagrams, mutated.
    #[test]
    fn kdc_pair_captured_mutated(
        control in 0u8..8,
        picks in picks(),
    ) {
        let input = mutated_input(control, &captured_kdc_pair_datagrams(), &picks);
        let outcome = kdc_pair_datagram(&input);
        prop_assert!(outcome.established == 0 || control & 2 != 0);
    }
}

/// The captured KDC-mode datagrams are a whole handshake through the KDC and data both
/// ways (so the mutation tests above start from real traffic), and replaying all of them
/// at a table that holds the real channel delivers nothing twice.
#[test]
fn captured_kdc_pair_traffic_is_a_whole_session_and_replays_deliver_nothing() {
    let all = captured_kdc_pair_datagrams();
    let kinds: std::collections::BTreeSet<u8> = all
        .iter()
        .filter(|d| d.first() == Some(&cohort_group::kdc_pair::KDC_PAIR_KIND))
        .filter_map(|d| d.get(2).copied())
        .collect();
    assert_eq!(kinds, [1u8, 2, 3, 4].into_iter().collect(), "{kinds:?}");
    let mut input = vec![2u8];
    input.extend(join_datagrams(all.iter().map(Vec::as_slice)));
    let outcome = kdc_pair_datagram(&input);
    assert_eq!(
        outcome.messages, 0,
        "a replayed message was delivered again"
    );
    assert!(outcome.dropped > 0);
}

// ---- the fuzz corpus (fuzz/corpus/<target>) -------------------------------------------------

/// A control byte and then each of `datagrams` alone, and all of them at once.
fn each_and_all(name: &str, control: u8, datagrams: &[Vec<u8>]) -> Vec<(String, Vec<u8>)> {
    let mut out = cohort_sim::corpus::numbered(
        name,
        datagrams
            .iter()
            .map(|d| with_control(control, join_datagrams([d.as_slice()]))),
    );
    out.push((
        format!("{name}-all"),
        with_control(control, join_datagrams(datagrams.iter().map(Vec::as_slice))),
    ));
    out
}

/// Seeds for every group fuzz target: every message variant, packets and pair datagrams
/// captured from a real two-member group, real gossip and a real KDC-mode handshake.
fn corpus_seeds() -> Vec<(&'static str, cohort_sim::corpus::Seeds)> {
    let c = |null, to_follower, seal, traffic| {
        MemberControl {
            null,
            to_follower,
            seal,
            from_stranger: false,
            traffic,
        }
        .byte()
    };
    let mut member = Vec::new();
    for byte in 0..32u8 {
        member.push((format!("control-{byte:02x}"), vec![byte]));
    }
    // Real AES-GCM packets from member 1 to the leader (the first 16 each alone, and 16 at
    // once, the harness's most).
    let captured: Vec<Vec<u8>> = captured_packets().iter().take(16).cloned().collect();
    member.extend(each_and_all(
        "captured",
        c(false, false, false, true),
        &captured,
    ));
    // Every message variant sealed by the harness under the null gear, as a broadcast body.
    let bodies: Vec<Vec<u8>> = encoded_msgs()
        .into_iter()
        .map(|m| [vec![0xff, 0xff], m].concat())
        .collect();
    member.extend(each_and_all("sealed", c(true, false, true, true), &bodies));
    member.extend(each_and_all(
        "sealed-follower",
        c(true, true, true, false),
        &bodies,
    ));

    let mut pair = Vec::new();
    let mut kdc_pair = Vec::new();
    for control in 0..4u8 {
        pair.extend(each_and_all(
            &format!("c{control}"),
            control,
            captured_pair_datagrams(),
        ));
    }
    let kdc_datagrams = captured_kdc_pair_datagrams();
    for control in 0..8u8 {
        kdc_pair.extend(each_and_all(
            &format!("c{control}"),
            control,
            &kdc_datagrams,
        ));
    }
    vec![
        (
            "group_msg",
            cohort_sim::corpus::numbered("msg", encoded_msgs()),
        ),
        (
            "group_pair_msg",
            cohort_sim::corpus::numbered("pair-msg", encoded_pair_msgs()),
        ),
        (
            "group_gossip",
            cohort_sim::corpus::numbered("gossip", sample_gossip()),
        ),
        ("group_member", member),
        ("group_pair_table", pair),
        ("group_kdc_pair", kdc_pair),
    ]
}

/// The harness each group fuzz target calls (`fuzz/fuzz_targets/<target>.rs`).
fn corpus_harness(target: &str) -> fn(&[u8]) {
    match target {
        "group_msg" => |d| {
            let _ = msg_decode(d);
        },
        "group_pair_msg" => |d| {
            let _ = pair_msg_decode(d);
        },
        "group_gossip" => |d| {
            let _ = gossip_packet(d);
        },
        "group_member" => |d| {
            let _ = member_datagram(d);
        },
        "group_pair_table" => |d| {
            let _ = pair_datagram(d);
        },
        "group_kdc_pair" => |d| {
            let _ = kdc_pair_datagram(d);
        },
        other => panic!("not a group fuzz target: {other}"),
    }
}

/// Every input in the corpus runs through its harness as the fuzzer ran it; the seeds
/// themselves run too. With `COHORT_WRITE_CORPUS=1` the seeds are written first
/// (`scripts/fuzz-corpus.sh`).
#[test]
fn fuzz_corpus_replays() {
    for (target, seeds) in corpus_seeds() {
        cohort_sim::corpus::check(target, corpus_harness(target), &seeds);
    }
}
