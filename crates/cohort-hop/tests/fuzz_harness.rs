//! The hop fuzz targets' harnesses (`cohort_hop::fuzzing`) as property tests, so they run in
//! every `cargo test` and cannot rot: each on arbitrary bytes, and on real packets captured
//! from an established pair (handshake, S1, A1, S2 in modes N, M and C, A2) with bits
//! flipped, bytes set, cut and extended, so the tests reach past the parser into the checks
//! every hop makes. Plus every single-bit flip of one real packet of each kind, at a relay,
//! after the run and just before the real packet.
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

use cohort_crypto::{CryptoProvider, Secret, SignatureScheme};
use cohort_hop::crypto::ELEMENT_LEN;
use cohort_hop::fuzzing::{
    captured, captured_kinds, drops, endpoint, join_datagrams, mutate_input, mutate_real, packet,
    parse_mutate_input, relay, resumed_with_injections, EndpointControl, HopPair, MutantSpec,
    Mutation, ADDR_A, ADDR_B, ADDR_R, ADDR_STRANGER, CAPTURED_KINDS, MEMO_CAP, MEMO_ED25519,
    SETUP_MESSAGES,
};
use cohort_hop::wire::{kind, Packet, FLOW_FROM_RESPONDER, FLOW_HEADER_LEN};
use cohort_hop::EndpointEvent;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec(any::<[u8; 4]>().prop_map(Mutation::from_bytes), 1..4)
}

fn mutated(real: &[u8], ms: &[Mutation]) -> Vec<u8> {
    let mut m = real.to_vec();
    for mutation in ms {
        mutation.apply(&mut m);
    }
    m
}

/// The messages on the control flows of the captured run (Open, OpenAck): S2 payloads.
fn captured_controls() -> &'static [Vec<u8>] {
    static CONTROLS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    CONTROLS.get_or_init(|| {
        captured()
            .iter()
            .filter_map(|(_, d)| match Packet::parse(d) {
                Ok(Packet::S2 {
                    header, payload, ..
                }) if header.flow & !FLOW_FROM_RESPONDER == 0 => Some(payload.to_vec()),
                _ => None,
            })
            .collect()
    })
}

/// Datagrams A sent B in a pair connected directly, with delivery reports.
fn direct_from_a() -> &'static [Vec<u8>] {
    static DIRECT: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    DIRECT.get_or_init(|| {
        HopPair::new(false, true)
            .sent
            .into_iter()
            .filter(|(from, _, _)| *from == ADDR_A)
            .map(|(_, _, d)| d)
            .collect()
    })
}

/// The captured datagram of kind `k` matching `pick`, with its index in [`captured`].
fn find(k: u8, pick: impl Fn(&Packet<'_>) -> bool) -> (usize, SocketAddr, Vec<u8>) {
    captured()
        .iter()
        .enumerate()
        .find(|(_, (_, d))| d[1] == k && Packet::parse(d).is_ok_and(|p| pick(&p)))
        .map(|(i, (from, d))| (i, *from, d.clone()))
        .unwrap_or_else(|| panic!("no captured packet of kind {k:#x}"))
}

fn flow_of(p: &Packet<'_>) -> u16 {
    p.flow_header().map_or(u16::MAX, |h| h.flow)
}

/// Which bytes of a packet a hop can check on arrival.
#[derive(Clone, Copy, Debug)]
enum Checked {
    /// All of them.
    Whole,
    /// An S1's: version, kind, flow header, mode and element. The count and the MACs are
    /// checked only when the key comes (in mode M the count is the tree's, under the MAC; in
    /// N and C the parser ties it to the number of MACs).
    S1,
    /// An A1's (with a report): version, kind, flow header and element, and the report flag.
    /// The report commitments (and anything between element and flag) are checked only
    /// later, by the S2s and the A2.
    A1,
}

impl Checked {
    fn bits(self, len: usize) -> Vec<usize> {
        let head = 2 + FLOW_HEADER_LEN;
        let bytes: Vec<usize> = match self {
            Checked::Whole => (0..len).collect(),
            Checked::S1 => (0..head + 1 + ELEMENT_LEN).collect(),
            // The flag sits before the three commitments.
            Checked::A1 => (0..head + ELEMENT_LEN)
                .chain([len - 1 - 3 * ELEMENT_LEN])
                .collect(),
        };
        bytes
            .into_iter()
            .flat_map(|b| (0..8).map(move |i| b * 8 + i))
            .collect()
    }
}

/// One real packet of each kind the relay verifies: (name, index in the capture, sender,
/// bytes, which bytes a hop can check on arrival).
fn targets() -> Vec<(&'static str, usize, SocketAddr, Vec<u8>, Checked)> {
    let p = HopPair::new(true, true);
    let (m, c) = (p.assoc_m, p.assoc_c);
    let mut out = Vec::new();
    let mut add = |name, (i, from, d): (usize, SocketAddr, Vec<u8>), checked| {
        out.push((name, i, from, d, checked));
    };
    add("S1 (M)", find(kind::S1, |p| flow_of(p) == m), Checked::S1);
    add("S1 (C)", find(kind::S1, |p| flow_of(p) == c), Checked::S1);
    add(
        "S1 (control, N)",
        find(kind::S1, |p| flow_of(p) == 0),
        Checked::S1,
    );
    add("A1 (M)", find(kind::A1, |p| flow_of(p) == m), Checked::A1);
    let whole = Checked::Whole;
    add("S2 (M)", find(kind::S2, |p| flow_of(p) == m), whole);
    add("S2 (C)", find(kind::S2, |p| flow_of(p) == c), whole);
    add(
        "S2 (control Open)",
        find(kind::S2, |p| flow_of(p) == 0),
        whole,
    );
    add("A2 (C)", find(kind::A2, |p| flow_of(p) == c), whole);
    add("ACK", find(kind::ACK, |_| true), whole);
    add("ACKACK", find(kind::ACKACK, |_| true), whole);
    add("SIGNED (renewal)", find(kind::SIGNED, |_| true), whole);
    out
}

fn flips(d: &[u8], checked: Checked) -> Vec<Vec<u8>> {
    checked
        .bits(d.len())
        .into_iter()
        .map(|bit| {
            let mut f = d.to_vec();
            f[bit / 8] ^= 1 << (bit % 8);
            f
        })
        .collect()
}

#[test]
fn the_pair_delivers_and_the_capture_holds_every_kind() {
    for relay in [false, true] {
        let p = HopPair::new(relay, true);
        assert_eq!(p.check_deliveries(), 2 * SETUP_MESSAGES);
        assert_eq!(p.check_relay(&[]), 0);
    }
    let kinds = captured_kinds();
    for k in CAPTURED_KINDS {
        assert!(kinds.contains_key(&k), "no {k:#x} in {kinds:?}");
    }
    // Every captured datagram and control message parses and round-trips.
    for (_, d) in captured() {
        assert!(packet(d).0, "{d:02x?}");
    }
    assert!(captured_controls().len() >= 4);
    for c in captured_controls() {
        assert!(packet(c).1, "{c:02x?}");
    }
}

/// A copy of the cached pair is the pair a fresh set-up builds: the same datagrams, relay
/// steps, events and time, and it goes on exactly as a fresh one does (one more message on
/// each association, two seconds of timers).
#[test]
fn a_cached_pair_is_a_fresh_pair() {
    for (relay, reports) in [(false, false), (false, true), (true, false), (true, true)] {
        let mut fresh = HopPair::new(relay, reports);
        let mut cached = HopPair::cached(relay, reports);
        for p in [&mut fresh, &mut cached] {
            assert!(p.send_both("after"));
            p.run_for(Duration::from_secs(2));
        }
        let what = format!("relay {relay}, reports {reports}");
        assert_eq!(fresh.now, cached.now, "{what}");
        assert_eq!(fresh.sent, cached.sent, "{what}");
        assert_eq!(fresh.relay_steps, cached.relay_steps, "{what}");
        assert_eq!(fresh.events_a, cached.events_a, "{what}");
        assert_eq!(fresh.events_b, cached.events_b, "{what}");
        assert_eq!(
            fresh.received_at_b().len(),
            2 * SETUP_MESSAGES + 2,
            "{what}"
        );
    }
}

/// A live `hop_mutate` input resumed from the copy of a clean set-up taken just before its
/// first mutant's packet builds the pair `with_injections` builds from the start, for a
/// mutant of every captured datagram (and for none): the same datagrams, relay steps,
/// events, payloads and time, and it goes on exactly as that one does.
#[test]
fn a_resumed_set_up_is_a_fresh_one() {
    let captured = captured();
    let mut injections = vec![BTreeMap::new()];
    for (i, (_, real)) in captured.iter().enumerate() {
        let mut m = real.clone();
        Mutation::FlipBit(i as u16 * 7, i as u8).apply(&mut m);
        let mut inject = BTreeMap::from([(i, vec![m])]);
        // A second mutant further on, so a resumed run injects past its checkpoint too.
        if i + 3 < captured.len() {
            inject.insert(i + 3, vec![captured[i + 3].1[..1].to_vec()]);
        }
        injections.push(inject);
    }
    for inject in injections {
        let what = format!("{:?}", inject.keys().collect::<Vec<_>>());
        let mut fresh = HopPair::with_injections(true, true, inject.clone());
        let mut resumed = resumed_with_injections(inject);
        for p in [&mut fresh, &mut resumed] {
            p.send_both("after");
            p.run_for(Duration::from_secs(2));
        }
        assert_eq!(fresh.now, resumed.now, "{what}");
        assert_eq!(fresh.sent, resumed.sent, "{what}");
        assert_eq!(fresh.relay_steps, resumed.relay_steps, "{what}");
        assert_eq!(fresh.events_a, resumed.events_a, "{what}");
        assert_eq!(fresh.events_b, resumed.events_b, "{what}");
        assert_eq!(fresh.payloads, resumed.payloads, "{what}");
        assert_eq!(
            (fresh.assoc_m, fresh.assoc_c),
            (resumed.assoc_m, resumed.assoc_c),
            "{what}"
        );
    }
}

/// The harnesses' Ed25519 ([`MemoEd25519`]) gives the default provider's results, the
/// first time (computed) and the second (remembered), for good and bad signatures, and
/// after its tables were emptied for being full.
#[test]
fn the_memoized_ed25519_is_the_default_one() {
    let real = CryptoProvider::default_provider().ed25519;
    let memo = &MEMO_ED25519;
    let mut cases = Vec::new();
    for seed in [1u8, 2, 0x68] {
        let secret = Secret::new(vec![seed; 32]);
        for message in [b"".as_slice(), b"renewal", &[seed; 300]] {
            cases.push((secret.clone(), message.to_vec()));
        }
    }
    for (secret, message) in &cases {
        for round in 0..2 {
            let public = real.public_key(secret).unwrap();
            assert_eq!(memo.public_key(secret).unwrap(), public, "round {round}");
            let sig = real.sign(secret, message).unwrap();
            assert_eq!(memo.sign(secret, message).unwrap(), sig, "round {round}");
            let mut bad_sig = sig.clone();
            bad_sig[7] ^= 4;
            let mut bad_message = message.clone();
            bad_message.push(0);
            let other = real.public_key(&Secret::new(vec![0xee; 32])).unwrap();
            for (k, m, s) in [
                (&public, message, &sig),
                (&public, message, &bad_sig),
                (&public, &bad_message, &sig),
                (&other, message, &sig),
                (&public, message, &sig[..63].to_vec()),
                (&public[..31].to_vec(), message, &sig),
            ] {
                assert_eq!(
                    memo.verify(k, m, s),
                    real.verify(k, m, s),
                    "round {round}, {s:02x?}"
                );
            }
            assert!(memo.verify(&public, message, &sig).is_ok());
            assert!(memo.verify(&public, message, &bad_sig).is_err());
        }
    }
    // A full table starts again empty and stays right (bad signatures: quick to refuse).
    let (public, message) = (real.public_key(&cases[0].0).unwrap(), b"m".as_slice());
    for i in 0..=MEMO_CAP as u32 {
        let sig = i.to_be_bytes();
        assert!(memo.verify(&public, message, &sig).is_err());
    }
    assert!(memo.sizes().2 <= MEMO_CAP, "{:?}", memo.sizes());
    let sig = real.sign(&cases[0].0, message).unwrap();
    assert!(memo.verify(&public, message, &sig).is_ok());
    assert!(memo.verify(&public, message, &sig).is_ok());
}

/// A pair built with the harnesses' provider (Ed25519 remembered) is the pair the default
/// provider builds, and goes on as it does after forged and changed signed packets reach
/// the relay and B (signatures refused), and live mutants of signed packets reach the relay
/// during the set-up.
#[test]
fn a_pair_with_remembered_signatures_is_a_pair_without() {
    let default = CryptoProvider::default_provider();
    let captured = captured();
    let signed: Vec<(usize, SocketAddr, Vec<u8>)> = captured
        .iter()
        .enumerate()
        .filter(|(_, (_, d))| [kind::SYN, kind::ACK, kind::ACKACK, kind::SIGNED].contains(&d[1]))
        .map(|(i, (from, d))| (i, *from, d.clone()))
        .collect();
    assert!(signed.len() >= 4, "{} signed packets", signed.len());
    let forged: Vec<(SocketAddr, Vec<u8>)> = signed
        .iter()
        .flat_map(|(_, from, d)| {
            let mut last = d.clone();
            *last.last_mut().unwrap() ^= 0x10;
            let mut middle = d.clone();
            middle[d.len() / 2] ^= 1;
            [(*from, last), (*from, middle)]
        })
        .collect();
    let mut injections = vec![BTreeMap::new()];
    for (i, _, d) in &signed {
        let mut m = d.clone();
        *m.last_mut().unwrap() ^= 1;
        injections.push(BTreeMap::from([(*i, vec![m])]));
    }
    let mut cases = Vec::new();
    for (relay, reports) in [(false, false), (false, true), (true, false), (true, true)] {
        cases.push((relay, reports, BTreeMap::new()));
    }
    for inject in injections {
        cases.push((true, true, inject));
    }
    for (relay, reports, inject) in cases {
        let what = format!("relay {relay}, reports {reports}, {:?}", inject.keys());
        let mut with = HopPair::with_provider(relay, reports, inject.clone(), default);
        let mut memo = HopPair::with_injections(relay, reports, inject);
        for p in [&mut with, &mut memo] {
            for (from, f) in &forged {
                let to = if relay { ADDR_R } else { ADDR_B };
                p.deliver(*from, to, f, true);
                p.pump();
            }
            p.send_both("after");
            p.run_for(Duration::from_secs(2));
        }
        assert_eq!(with.now, memo.now, "{what}");
        assert_eq!(with.sent, memo.sent, "{what}");
        assert_eq!(with.relay_steps, memo.relay_steps, "{what}");
        assert_eq!(with.events_a, memo.events_a, "{what}");
        assert_eq!(with.events_b, memo.events_b, "{what}");
        assert_eq!(with.payloads, memo.payloads, "{what}");
        assert_eq!(drops(with.b.counters()), drops(memo.b.counters()), "{what}");
    }
}

/// A copy of a cached pair, or a pair resumed from a checkpoint, checks only the relay steps
/// after its set-up's (checked once, when it was built); the full check of the same pair
/// gives the same answer: after real, changed and arbitrary datagrams and a stateless Hello
/// it forwards reach the relay after the run, and after live mutants (a raced S1 among
/// them, which it forwards).
#[test]
fn checking_after_the_set_up_is_checking_all() {
    let captured = captured();
    let all_real: Vec<Vec<u8>> = captured.iter().map(|(_, d)| d.clone()).collect();
    let mut hello = Vec::new();
    Packet::parse(&captured[0].1).unwrap().write(&mut hello);
    hello[3] ^= 1; // another pair id: forwarded without state
    for reports in [false, true] {
        let mut p = HopPair::cached(true, reports);
        for (_, d) in captured {
            let mut changed = d.clone();
            changed[d.len() / 2] ^= 2;
            for x in [d.as_slice(), &changed, &d[..d.len() / 3], &hello] {
                p.deliver(ADDR_STRANGER, ADDR_R, x, true);
                p.pump();
            }
        }
        p.run_for(Duration::from_secs(2));
        p.send_both("after");
        p.run_for(Duration::from_secs(2));
        for also in [&[][..], &all_real] {
            let forwarded = p.check_relay(also);
            assert_eq!(forwarded, p.check_relay_in_full(also), "reports {reports}");
            assert!(forwarded >= captured.len(), "the Hellos: {forwarded}");
        }
    }
    let (race_at, _, s1) = find(kind::S1, |p| flow_of(p) != 0);
    let mut raced = s1.clone();
    *raced.last_mut().unwrap() ^= 1;
    let mut injections = vec![BTreeMap::from([(race_at, vec![raced])])];
    for (i, (_, d)) in captured.iter().enumerate() {
        let mut m = d.clone();
        Mutation::FlipBit(i as u16 * 5, i as u8).apply(&mut m);
        injections.push(BTreeMap::from([(i, vec![m, hello.clone()])]));
    }
    let mut forwarding = 0;
    for (n, inject) in injections.into_iter().enumerate() {
        let what = format!("{:?}", inject.keys().collect::<Vec<_>>());
        let fresh = HopPair::with_injections(true, true, inject.clone());
        let resumed = resumed_with_injections(inject);
        for also in [&[][..], &all_real] {
            let forwarded = fresh.check_relay(also);
            assert_eq!(forwarded, resumed.check_relay(also), "{what}");
            assert_eq!(forwarded, resumed.check_relay_in_full(also), "{what}");
            assert!(n > 0 || forwarded == 1, "the raced S1 is forwarded");
            forwarding += usize::from(forwarded > 0);
        }
    }
    // The Hello is forwarded in most runs (not when an earlier mutant stopped the set-up).
    assert!(
        forwarding > captured.len(),
        "{forwarding} runs forwarded something"
    );
}

/// Found by `hop_mutate` (2026-11-27): a live run in which a changed copy of B's A1 with
/// the real chain element reached the relay before the real one, was forwarded (the
/// exception: nothing can check an A1's report commitments before the A2), and the relay,
/// holding it as the round's A1, later sent it back to A when A's S1 came again. The
/// harness took that for a datagram the relay never got; it is one the relay got and
/// forwarded. The relay cannot tell it from B's (so nothing to fix there, and nothing is
/// delivered that A did not send); the harness now allows a sent-back A1 that the relay got
/// before with the round's real element, and still refuses any other. The input is also in
/// `fuzz/corpus/hop_mutate/regress-relay-returns-a-raced-a1`; a second one, where the relay
/// held such an A1 that it had not forwarded (it came from A's side and was dropped and
/// counted, yet kept as the round's A1) and sent it back, is
/// `regress-relay-returns-a-dropped-a1` (replayed by `fuzz_corpus`).
#[test]
fn a_relay_sends_back_only_an_a1_it_forwarded() {
    let input = [
        0x01, 0x10, 0x00, 0x63, 0x00, 0x00, 0x00, 0x00, 0x20, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88,
        0x88, 0x88, 0x88, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x6d, 0x20, 0x73,
        0x00, 0x88, 0x88, 0x88, 0xff, 0xff, 0xff, 0x35, 0x00, 0x00, 0x31, 0x00, 0x00,
    ];
    let outcome = mutate_real(&input);
    assert!(outcome.forwarded >= 1, "{outcome:?}");
    // The same run, built step by step: the relay sends an A1 back toward A that B never
    // sent, and it is one the relay got and forwarded earlier.
    let (_, specs) = parse_mutate_input(&input).unwrap();
    let captured = captured();
    let mut inject: BTreeMap<usize, Vec<Vec<u8>>> = BTreeMap::new();
    for spec in &specs {
        let i = usize::from(spec.pick) % captured.len();
        inject
            .entry(i)
            .or_default()
            .push(mutated(&captured[i].1, &spec.mutations));
    }
    let p = resumed_with_injections(inject);
    let real: Vec<&[u8]> = p.sent.iter().map(|(_, _, d)| d.as_slice()).collect();
    let (n, sent_back) = p
        .relay_steps
        .iter()
        .enumerate()
        .find_map(|(n, s)| {
            s.outputs
                .iter()
                .find(|(to, out)| {
                    *to == ADDR_A && out != &s.input && !real.contains(&out.as_slice())
                })
                .map(|(_, out)| (n, out.clone()))
        })
        .expect("the relay sends back an A1 B never sent");
    assert_eq!(sent_back[1], kind::A1);
    assert!(p.relay_steps[..n]
        .iter()
        .any(|s| s.input == sent_back && s.outputs.iter().any(|(_, o)| o == &sent_back)));
    assert_eq!(p.check_relay(&[]), p.check_relay_in_full(&[]));
    // A sent-back A1 the relay never forwarded is still refused.
    let mut forged = p.clone();
    let step = forged.relay_steps.get_mut(n).unwrap();
    for (_, out) in &mut step.outputs {
        if out == &sent_back {
            out[40] ^= 1;
        }
    }
    let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        forged.check_relay_in_full(&[])
    }));
    assert!(
        refused.is_err(),
        "an A1 the relay never got passed the check"
    );
}

/// Found by `hop_relay` (2026-11-26): a Challenge from a stranger naming the relay itself as
/// the initiator. The relay forwards Challenges without state to their initiator, so it sent
/// this one to itself, got it back and sent it again, forever (the harness's bound of 20,000
/// deliveries per pump stopped it; 300,000 relay steps for one input). Now the relay drops
/// and counts a packet whose next hop is its own address. The input is also in
/// `fuzz/corpus/hop_relay/regress-challenge-to-the-relay-itself`.
#[test]
fn a_relay_does_not_forward_to_itself() {
    // kind CHALLENGE | pair id | initiator 10.0.0.3:7000 (ADDR_R) | responder 10.0.0.2:7000 |
    // the rest of a Challenge.
    let challenge: [u8; 48] = [
        0x02, 0x02, 0x9b, 0x32, 0x58, 0x24, 0x7b, 0xaa, 0xf7, 0x21, 0x04, 0x0a, 0x00, 0x00, 0x03,
        0x1b, 0x58, 0x04, 0x0a, 0x00, 0x00, 0x02, 0x1b, 0x58, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x03, 0xe8, 0xe2, 0x26, 0x40, 0xc7, 0x6d, 0xf0, 0x50, 0xaf, 0x74, 0x34, 0xd6, 0x0e, 0xda,
        0x5e, 0x8b, 0x5e,
    ];
    assert!(matches!(
        Packet::parse(&challenge),
        Ok(Packet::Challenge { header, .. }) if header.initiator == ADDR_R
    ));
    let mut input = vec![0];
    input.extend(join_datagrams([challenge.as_slice()]));
    let outcome = relay(&input);
    assert_eq!((outcome.fed, outcome.dropped), (1, 1), "{outcome:?}");
    assert!(outcome.alive, "{outcome:?}");
}

/// The harnesses reach what they claim: a real datagram fed to B is taken (and counted as
/// nothing dropped), and a mutant is dropped.
#[test]
fn the_harnesses_reach_the_checks() {
    // A's last S1 of the M association, again, at B: a repeat, answered, not dropped.
    let p = HopPair::new(false, false);
    let s1 = p
        .sent
        .iter()
        .rev()
        .find(|(f, _, d)| *f == ADDR_A && d[1] == kind::S1 && d[11] != 0)
        .map(|(_, _, d)| d.clone())
        .unwrap();
    let c = EndpointControl {
        from_stranger: false,
        reports: false,
        to_a: false,
    };
    let mut input = vec![c.byte()];
    input.extend(join_datagrams([s1.as_slice()]));
    let outcome = endpoint(&input);
    assert_eq!((outcome.fed, outcome.dropped), (1, 0), "{outcome:?}");
    assert!(outcome.alive);
    let mut bad = s1.clone();
    *bad.last_mut().unwrap() ^= 1;
    let mut input = vec![c.byte()];
    input.extend(join_datagrams([bad.as_slice()]));
    let outcome = endpoint(&input);
    assert_eq!((outcome.fed, outcome.dropped), (1, 1), "{outcome:?}");
    // A fuzzed Hello is forwarded by the relay (no state), but nothing else.
    let mut input = vec![0];
    let mut hello = Vec::new();
    Packet::parse(&captured()[0].1).unwrap().write(&mut hello);
    assert_eq!(hello[1], kind::HELLO);
    hello[3] ^= 1; // another pair id
    input.extend(join_datagrams([hello.as_slice(), &[1, 0x10, 0]]));
    let outcome = relay(&input);
    assert_eq!((outcome.fed, outcome.dropped, outcome.forwarded), (2, 1, 1));
    assert!(outcome.alive);
}

/// Every single-bit flip of one real packet of each kind, handed to the relay after the
/// run: none is forwarded, and each moves the relay's drop counters by exactly one.
#[test]
fn flipped_real_packets_die_at_the_relay_after_the_run() {
    let mut p = HopPair::new(true, true);
    let mut total = 0;
    let mut failures = Vec::new();
    for (name, _, from, real, _) in targets() {
        for (bit, f) in flips(&real, Checked::Whole).into_iter().enumerate() {
            let before = drops(p.relay.as_ref().unwrap().counters());
            p.deliver(from, ADDR_R, &f, true);
            let step = p.relay_steps.last().unwrap();
            let after = drops(p.relay.as_ref().unwrap().counters());
            // Never forwarded (a relay may answer a changed S1 of an acknowledged round
            // with the round's real A1, toward the signer: that is not forwarding it).
            let forwarded = step.outputs.iter().any(|(_, out)| out == &f);
            if forwarded || after != before + 1 {
                failures.push(format!(
                    "{name}: bit {bit} (byte {}): forwarded {}, drops +{}",
                    bit / 8,
                    forwarded,
                    after - before
                ));
            }
            total += 1;
        }
    }
    assert!(total > 5_000, "{total}");
    assert!(
        failures.is_empty(),
        "{} of {total} flipped packets were not dropped once:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Nothing reached B.
    p.pump();
    assert_eq!(p.check_deliveries(), 2 * SETUP_MESSAGES);
}

/// The same flips handed to the relay just before the real packet, when it is waiting for
/// it: none is forwarded, each is counted once, and the real packet still goes through (B
/// delivers everything). For S1 and A1 only the bytes a hop can check on arrival are
/// flipped (see [`Checked`]): the rest can only be checked when the key or the A2 comes, so
/// a changed copy that arrives first is passed on (see
/// `a_raced_s1_forges_nothing_and_loses_nothing_silently`).
/// The ACK's flips meet a relay that holds no pair yet: both signatures are checked.
#[test]
fn flipped_real_packets_die_at_the_relay_just_before_the_real_one() {
    for (name, i, _, real, checked) in targets() {
        let all = flips(&real, checked);
        let n = all.len();
        let p = HopPair::with_injections(true, true, BTreeMap::from([(i, all)]));
        let injected: Vec<_> = p.relay_steps.iter().filter(|s| s.injected).collect();
        assert_eq!(injected.len(), n, "{name}");
        for (bit, s) in checked.bits(real.len()).into_iter().zip(&injected) {
            assert!(
                s.outputs.is_empty() && s.dropped == 1,
                "{name}: bit {bit} (byte {}): forwarded {}, drops +{}",
                bit / 8,
                s.outputs.len(),
                s.dropped
            );
        }
        assert_eq!(p.check_deliveries(), 2 * SETUP_MESSAGES, "{name}");
        assert_eq!(p.check_relay(&[]), 0, "{name}");
    }
}

/// ALPHA's race, pinned: a copy of a real S1 with a MAC changed, arriving at the relay
/// first, is passed on (nothing can check the MACs before the key is disclosed). Nothing
/// forged is delivered, and the round's messages are either delivered after all or the
/// loss is not silent: A gets a negative delivery report for the round.
#[test]
fn a_raced_s1_forges_nothing_and_loses_nothing_silently() {
    let p0 = HopPair::new(true, true);
    let (i, _, real) = find(kind::S1, |p| flow_of(p) == p0.assoc_m);
    let round = Packet::parse(&real).unwrap().flow_header().unwrap().round;
    let mut raced = real.clone();
    *raced.last_mut().unwrap() ^= 1;
    let mut p = HopPair::with_injections(true, true, BTreeMap::from([(i, vec![raced.clone()])]));
    let step = p.relay_steps.iter().find(|s| s.injected).unwrap();
    assert_eq!(
        step.outputs.len(),
        1,
        "an S1 with the real element is passed on"
    );
    p.run_for(Duration::from_secs(5));
    let delivered = p.check_deliveries();
    let nack = p.events_a.iter().any(|e| {
        matches!(e, EndpointEvent::Report { assoc, round: r, delivered: false, .. }
            if *assoc == p0.assoc_m && *r == round)
    });
    assert!(
        delivered == 2 * SETUP_MESSAGES || nack,
        "{delivered} delivered, and A was not told: {:?}",
        p.events_a
    );
    // The harness's relay check knows the exception, and nothing else was forwarded.
    assert_eq!(p.check_relay(&[real]), 1);
}

/// A relay forwards a repeated ACK of a pair it knows only if it is the ACK it verified (it
/// once forwarded any ACK with the pair's id, addresses and responder key, unchecked).
#[test]
fn a_relay_forwards_no_changed_ack() {
    let mut p = HopPair::new(true, true);
    let (_, from, ack) = find(kind::ACK, |_| true);
    // The last byte: the responder's signature.
    let mut changed = ack.clone();
    *changed.last_mut().unwrap() ^= 1;
    p.deliver(from, ADDR_R, &changed, true);
    let step = p.relay_steps.last().unwrap();
    assert!(
        step.outputs.is_empty(),
        "the relay forwarded an ACK with a broken signature"
    );
    // The real one again is still forwarded (a retransmission).
    p.deliver(from, ADDR_R, &ack, true);
    assert_eq!(p.relay_steps.last().unwrap().outputs.len(), 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn packet_arbitrary(data in bytes(200)) {
        let _ = packet(&data);
    }

    #[test]
    fn packet_mutated(which in any::<prop::sample::Index>(), ms in mutations()) {
        let all = captured();
        let _ = packet(&mutated(&all[which.index(all.len())].1, &ms));
    }

    #[test]
    fn control_mutated(which in any::<prop::sample::Index>(), ms in mutations()) {
        let all = captured_controls();
        let _ = packet(&mutated(&all[which.index(all.len())], &ms));
    }
}

proptest! {
    // Each case sets a pair up (a handshake, two associations, four rounds) and runs it for
    // four virtual seconds.
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn endpoint_arbitrary(control in 0u8..8, data in bytes(300)) {
        let mut input = vec![control];
        input.extend(data);
        let outcome = endpoint(&input);
        prop_assert!(outcome.alive, "{:?}", outcome);
        prop_assert_eq!(outcome.delivered, 0);
    }

    /// Real datagrams A sent, mutated, to B from A or a stranger (or to A).
    #[test]
    fn endpoint_mutated(
        control in 0u8..8,
        picks in prop::collection::vec((any::<prop::sample::Index>(), mutations()), 1..4),
    ) {
        let all = direct_from_a();
        let datagrams: Vec<Vec<u8>> = picks
            .iter()
            .map(|(which, ms)| mutated(&all[which.index(all.len())], ms))
            .collect();
        let mut input = vec![control];
        input.extend(join_datagrams(datagrams.iter().map(Vec::as_slice)));
        let outcome = endpoint(&input);
        prop_assert!(outcome.alive, "{:?}", outcome);
        prop_assert_eq!(outcome.delivered, 0);
    }

    #[test]
    fn relay_arbitrary(control in 0u8..2, data in bytes(300)) {
        let mut input = vec![control];
        input.extend(data);
        let outcome = relay(&input);
        prop_assert!(outcome.alive, "{:?}", outcome);
        prop_assert_eq!(outcome.delivered, 0);
    }

    /// Real datagrams, mutated, straight to the relay.
    #[test]
    fn relay_mutated(
        picks in prop::collection::vec((any::<prop::sample::Index>(), mutations()), 1..4),
    ) {
        let all = captured();
        let datagrams: Vec<Vec<u8>> = picks
            .iter()
            .map(|(which, ms)| mutated(&all[which.index(all.len())].1, ms))
            .collect();
        let mut input = vec![1];
        input.extend(join_datagrams(datagrams.iter().map(Vec::as_slice)));
        let _ = relay(&input);
    }

    #[test]
    fn mutate_real_arbitrary(data in bytes(100)) {
        let _ = mutate_real(&data);
    }

    #[test]
    fn mutate_real_specs(
        live in any::<bool>(),
        specs in prop::collection::vec((any::<u8>(), mutations()), 1..4),
    ) {
        let specs: Vec<MutantSpec> = specs
            .into_iter()
            .map(|(pick, mutations)| MutantSpec { pick, mutations })
            .collect();
        let outcome = mutate_real(&mutate_input(live, &specs));
        prop_assert_eq!(outcome.fed, specs.len());
    }
}

#[test]
fn mutate_input_round_trips() {
    let specs = vec![
        MutantSpec {
            pick: 3,
            mutations: vec![Mutation::FlipBit(7, 2), Mutation::Truncate(9)],
        },
        MutantSpec {
            pick: 200,
            mutations: vec![
                Mutation::Extend(5),
                Mutation::Set(1, 0),
                Mutation::Insert(0, 9),
            ],
        },
    ];
    let input = mutate_input(true, &specs);
    assert_eq!(
        cohort_hop::fuzzing::parse_mutate_input(&input),
        Some((true, specs))
    );
}
