//! Targeted properties in the simulator: no state before a cookie, no public-key work per
//! data packet at a relay, trust lists, delivery reports, renewal under continuous traffic.

mod support;

use cohort_crypto::{CryptoError, CryptoProvider, Secret, SignatureScheme};
use cohort_hop::wire::{HandshakeHeader, Packet};
use cohort_hop::{EndpointEvent, HopEvent, HopNode, Mode, Relay, RelayConfig};
use cohort_sim::{FnRule, PacketView, Verdict};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use support::Path;

#[test]
fn a_flood_of_spoofed_first_packets_leaves_no_state() {
    let mut path = Path::new(3, 1, |_| {});
    path.connect().expect("connect");
    let b = path.b;
    let relay = path.relays[0];
    let b_addr = path.addr(b);
    let before = path.sim.node(b).endpoint().unwrap().status().peers.len();
    // 2000 Hellos and 2000 SYNs with made-up cookies from 2000 spoofed addresses, straight
    // at B and at the relay.
    for i in 0..2000u32 {
        let spoofed: SocketAddr = format!("10.66.{}.{}:{}", i / 250, i % 250, 1000 + i)
            .parse()
            .unwrap();
        let header = HandshakeHeader {
            pair_id: (u64::from(i) << 8).to_be_bytes(),
            initiator: spoofed,
            responder: b_addr,
        };
        let mut hello = Vec::new();
        Packet::Hello(header).write(&mut hello);
        let sig = [7u8; 64];
        let mut syn = Vec::new();
        Packet::Syn {
            header,
            timestamp: 1,
            cookie: [i as u8; 16],
            initiator: cohort_hop::wire::SignedHello {
                public_key: [1; 32],
                control_sig: cohort_hop::wire::AnchorInfo {
                    chain_id: [0; 8],
                    anchor: [0; 16],
                    length: 2,
                    start_round: 0,
                },
                control_ack: cohort_hop::wire::AnchorInfo {
                    chain_id: [0; 8],
                    anchor: [0; 16],
                    length: 2,
                    start_round: 0,
                },
                signature: &sig,
            },
        }
        .write(&mut syn);
        path.sim.inject(spoofed, b, hello.clone(), Duration::ZERO);
        path.sim.inject(spoofed, b, syn.clone(), Duration::ZERO);
        path.sim.inject(spoofed, relay, hello, Duration::ZERO);
        path.sim.inject(spoofed, relay, syn, Duration::ZERO);
    }
    path.sim.run_for(Duration::from_secs(2)).expect("run");
    let status = path.sim.node(b).endpoint().unwrap().status();
    assert_eq!(
        status.peers.len(),
        before,
        "B holds state for a spoofed peer"
    );
    assert!(status.counters.bad_cookie >= 2000, "{:?}", status.counters);
    let relay_status = path.sim.node(relay).relay().unwrap().status();
    assert_eq!(
        relay_status.pairs.len(),
        1,
        "the relay learned a pair from a flood"
    );
    // The real pair still works.
    let assoc = path.open(Mode::N).expect("open");
    assert!(path.send(assoc, b"still here"));
    path.sim.run_for(Duration::from_secs(1)).expect("run");
    assert_eq!(path.received_at_b(), vec![b"still here".to_vec()]);
}

/// Ed25519 that counts verifications, around the default backend.
struct CountingEd25519;
static VERIFICATIONS: AtomicU64 = AtomicU64::new(0);
static COUNTING: CountingEd25519 = CountingEd25519;

impl SignatureScheme for CountingEd25519 {
    fn generate(&self) -> Result<(Secret, Vec<u8>), CryptoError> {
        CryptoProvider::default_provider().ed25519.generate()
    }
    fn public_key(&self, secret: &Secret) -> Result<Vec<u8>, CryptoError> {
        CryptoProvider::default_provider()
            .ed25519
            .public_key(secret)
    }
    fn sign(&self, secret: &Secret, message: &[u8]) -> Result<Vec<u8>, CryptoError> {
        CryptoProvider::default_provider()
            .ed25519
            .sign(secret, message)
    }
    fn verify(&self, public: &[u8], message: &[u8], signature: &[u8]) -> Result<(), CryptoError> {
        VERIFICATIONS.fetch_add(1, Ordering::Relaxed);
        CryptoProvider::default_provider()
            .ed25519
            .verify(public, message, signature)
    }
}

#[test]
fn relays_do_no_public_key_work_per_data_packet() {
    let mut path = Path::new(4, 1, |c| c.chain_rounds = 1 << 12);
    // Swap in a relay whose provider counts signature checks (the path is not connected yet).
    let relay = path.relays[0];
    let provider = CryptoProvider {
        ed25519: &COUNTING,
        ..CryptoProvider::default_provider()
    };
    let addr = path.addr(relay);
    path.sim.restart(
        relay,
        HopNode::Relay(Relay::new(RelayConfig::new(), provider, addr)),
    );
    path.connect().expect("connect");
    let m = path.open(Mode::M { batch: 16 }).expect("open");
    let n = path.open(Mode::N).expect("open");
    path.sim.run_for(Duration::from_millis(200)).expect("run");
    let after_setup = VERIFICATIONS.load(Ordering::Relaxed);
    assert!(
        after_setup >= 2,
        "the relay checked the handshake's signatures"
    );
    for i in 0..500 {
        assert!(path.send(m, format!("m{i}").as_bytes()));
        assert!(path.send(n, format!("n{i}").as_bytes()));
    }
    path.drain(Duration::from_secs(120)).expect("drain");
    path.sim.run_for(Duration::from_secs(1)).expect("run");
    assert_eq!(path.received_at_b().len(), 1000);
    let verified = path.sim.node(relay).relay().unwrap().counters().verified;
    assert!(verified > 1500, "the relay verified the data ({verified})");
    assert_eq!(
        VERIFICATIONS.load(Ordering::Relaxed),
        after_setup,
        "signature checks during data transfer"
    );
}

#[test]
fn untrusted_peers_get_nothing() {
    // B trusts only a key that is not A's.
    let stranger = support::identity(99, 99).public();
    let mut path = Path::new(5, 1, |c| c.trust = vec![stranger]);
    let b = path.addr(path.b);
    let via = Some(path.addr(path.relays[0]));
    let a = path.a;
    path.sim
        .with_node(a, |n, now| n.endpoint_mut().unwrap().connect(now, b, via));
    // Long enough for every retransmission of the SYN to go unanswered.
    path.sim.run_for(Duration::from_secs(60)).expect("run");
    let b_status = path.sim.node(path.b).endpoint().unwrap().status();
    assert!(
        b_status.peers.is_empty(),
        "B holds state for an untrusted peer"
    );
    assert!(b_status.counters.untrusted > 0);
    assert!(!path.sim.node(a).endpoint().unwrap().is_connected(b));
    assert!(
        path.sim
            .events_of(a)
            .any(|(_, e)| matches!(e, HopEvent::Endpoint(EndpointEvent::ConnectFailed { .. }))),
        "A is told the handshake failed"
    );
    assert!(path
        .sim
        .node(path.relays[0])
        .relay()
        .unwrap()
        .status()
        .pairs
        .is_empty());
}

/// A round whose S2 was lost is reported as not delivered once the round a window and one
/// later starts (its S1 overtakes the lossy round's S2s only then); the others as delivered.
#[test]
fn delivery_reports_say_what_arrived() {
    for window in [1, cohort_hop::DEFAULT_WINDOW] {
        reports_say_what_arrived(window);
    }
}

fn reports_say_what_arrived(window: u8) {
    let mut path = Path::new(6, 2, |c| {
        c.delivery_reports = true;
        c.window = window;
    });
    path.connect().expect("connect");
    let assoc = path.open(Mode::C { batch: 4 }).expect("open");
    for i in 0..8 {
        assert!(path.send(assoc, format!("r{i}").as_bytes()));
    }
    path.sim.run_for(Duration::from_secs(2)).expect("run");
    let reports = |path: &Path| -> Vec<(u32, bool)> {
        path.sim
            .events_of(path.a)
            .filter_map(|(_, e)| match e {
                HopEvent::Endpoint(EndpointEvent::Report {
                    round, delivered, ..
                }) => Some((*round, *delivered)),
                _ => None,
            })
            .collect()
    };
    let clean = reports(&path);
    assert!(
        !clean.is_empty() && clean.iter().all(|&(_, d)| d),
        "{clean:?}"
    );
    // Now lose one S2 on the last link: that round is reported as not delivered once the
    // round a window and one later begins.
    let b = path.b;
    let mut dropped = false;
    let rule = path.sim.add_rule(FnRule::new(
        "drop one S2",
        move |p: &PacketView<'_>, _rng: &mut dyn rand_core::RngCore| {
            if !dropped && p.to == b && p.bytes.get(1) == Some(&cohort_hop::wire::kind::S2) {
                dropped = true;
                Verdict::Drop
            } else {
                Verdict::Pass
            }
        },
    ));
    for i in 0..4 {
        assert!(path.send(assoc, format!("lost-round-{i}").as_bytes()));
    }
    path.sim.run_for(Duration::from_secs(1)).expect("run");
    path.sim.remove_rule(rule);
    for i in 0..4 * (u32::from(window) + 1) {
        assert!(path.send(assoc, format!("next-round-{i}").as_bytes()));
    }
    path.sim.run_for(Duration::from_secs(2)).expect("run");
    let all = reports(&path);
    let new: Vec<_> = all[clean.len()..].to_vec();
    assert!(
        new.iter().any(|&(_, d)| !d),
        "a nack for the lossy round: {new:?}"
    );
    assert!(
        new.iter().any(|&(_, d)| d),
        "an ack for the next round: {new:?}"
    );
    assert_eq!(
        path.received_at_b().len(),
        8 + 3 + 4 * (usize::from(window) + 1)
    );
}

#[test]
fn chains_are_renewed_under_continuous_traffic() {
    // Four rounds per chain: every association and the control association renew many
    // times while messages flow.
    let mut path = Path::new(7, 2, |c| c.chain_rounds = 4);
    path.connect().expect("connect");
    let m = path.open(Mode::M { batch: 8 }).expect("open");
    let n = path.open(Mode::N).expect("open");
    let mut sent = Vec::new();
    for i in 0..400 {
        let msg = format!("c{i}").into_bytes();
        assert!(path.send(if i % 4 == 0 { n } else { m }, &msg));
        sent.push(msg);
        if i % 10 == 0 {
            path.sim.run_for(Duration::from_millis(30)).expect("run");
        }
    }
    path.drain(Duration::from_secs(120)).expect("drain");
    path.sim.run_for(Duration::from_secs(1)).expect("run");
    let mut got = path.received_at_b();
    got.sort();
    sent.sort();
    assert_eq!(got, sent);
    let renewed = |id| {
        path.sim
            .events_of(id)
            .filter(|(_, e)| matches!(e, HopEvent::Endpoint(EndpointEvent::Renewed { .. })))
            .count()
    };
    // 300 messages in rounds of up to 8 and 100 in rounds of 1: well over 4 chains each.
    assert!(renewed(path.a) >= 20, "A renewed {} times", renewed(path.a));
    assert!(renewed(path.b) >= 20, "B renewed {} times", renewed(path.b));
    for &r in &path.relays {
        let c = path.sim.node(r).relay().unwrap().counters();
        assert_eq!(c.stale + c.forged + c.unverifiable, 0, "{c:?}");
    }
}

#[test]
fn the_scheduler_shares_the_link_between_associations() {
    let mut path = Path::new(8, 1, |_| {});
    path.connect().expect("connect");
    let x = path.open(Mode::M { batch: 16 }).expect("open");
    let y = path.open(Mode::M { batch: 16 }).expect("open");
    // Record what A puts on the wire, in order.
    let a = path.a;
    let order = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let o = order.clone();
    path.sim.add_rule(FnRule::new(
        "a's output",
        move |p: &PacketView<'_>, _rng: &mut dyn rand_core::RngCore| {
            if p.from == a {
                o.borrow_mut().push(p.bytes.to_vec());
            }
            Verdict::Pass
        },
    ));
    // x gets its whole backlog first; y's messages come after, all at once.
    for i in 0..160 {
        assert!(path.send(x, format!("x{i}").as_bytes()));
    }
    for i in 0..160 {
        assert!(path.send(y, format!("y{i}").as_bytes()));
    }
    path.sim.run_for(Duration::from_secs(5)).expect("run");
    assert_eq!(path.received_at_b().len(), 320);
    let flows: Vec<(u8, u16)> = order
        .borrow()
        .iter()
        .filter_map(|b| match Packet::parse(b) {
            Ok(p) => p.flow_header().map(|h| (b[1], h.flow & 0x7fff)),
            Err(_) => None,
        })
        .collect();
    // Fair at the round level: while both have S2s to send, neither gets more than a round
    // ahead. (The simulator drains a node's output at once, so this sees rounds, not the
    // packet-by-packet round robin; `endpoint::tests` checks that.)
    let s2: Vec<u16> = flows
        .iter()
        .filter(|(k, _)| *k == cohort_hop::wire::kind::S2)
        .map(|(_, f)| *f)
        .collect();
    let (mut nx, mut ny, mut worst) = (0i64, 0i64, 0i64);
    for f in &s2 {
        if *f == x {
            nx += 1;
        } else if *f == y {
            ny += 1;
        }
        if nx < 160 && ny < 160 {
            worst = worst.max((nx - ny).abs());
        }
    }
    assert_eq!((nx, ny), (160, 160));
    // Each association has up to a window of rounds (of 16) between S1 and S2.
    let bound = i64::from(cohort_hop::DEFAULT_WINDOW) * 16 + 1;
    assert!(
        worst <= bound,
        "one association ran {worst} S2s ahead of the other (bound {bound})"
    );
}

/// A signer never moves more than its window past a round whose A1 it did not get: the S1
/// of the round a window later would disclose an element that hashes to that round's key,
/// and a forger who kept the real S1 from the hops could then finish the round with a
/// message of its own. Under an outage the signer keeps resending the same S1s (and says
/// the association is stalled); when the path comes back, everything arrives, in order.
/// (Here `dead_after` is longer than the outage;
/// `a_dead_pair_gives_up_its_round_only_with_its_chains` checks the default.)
#[test]
fn a_signer_never_moves_past_an_unacknowledged_round() {
    for window in [1, 2, cohort_hop::DEFAULT_WINDOW] {
        signer_stays_within_its_window(window);
    }
}

fn signer_stays_within_its_window(window: u8) {
    let mut path = Path::new(9, 1, |c| {
        c.dead_after = Duration::from_secs(600);
        c.window = window;
    });
    path.connect().expect("connect");
    let assoc = path.open(Mode::N).expect("open");
    let a = path.a;
    let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let s = seen.clone();
    let outage = path.sim.add_rule(FnRule::new(
        "drop a's data S1s",
        move |p: &PacketView<'_>, _rng: &mut dyn rand_core::RngCore| match Packet::parse(p.bytes) {
            Ok(Packet::S1 { header, .. }) if p.from == a && header.flow == assoc => {
                s.borrow_mut().push(header.round);
                Verdict::Drop
            }
            _ => Verdict::Pass,
        },
    ));
    // More messages than the window holds rounds (one message per round in mode N).
    let count = usize::from(window) + 2;
    for i in 0..count {
        assert!(path.send(assoc, format!("during-{i}").as_bytes()));
    }
    path.sim.run_for(Duration::from_secs(60)).expect("run");
    let rounds = seen.borrow().clone();
    assert!(
        rounds.len() > 10,
        "the S1 was sent again ({} times)",
        rounds.len()
    );
    let first = rounds[0];
    assert!(
        rounds
            .iter()
            .all(|&r| r >= first && r < first + u32::from(window)),
        "an S1 beyond the window of {window} went out while round {first} was \
         unacknowledged: {rounds:?}"
    );
    // The window is used: every round of it went out (one message per round in mode N).
    for r in first..first + u32::from(window) {
        assert!(rounds.contains(&r), "round {r} never went out: {rounds:?}");
    }
    assert!(path
        .sim
        .events_of(a)
        .any(|(_, e)| matches!(e, HopEvent::Endpoint(EndpointEvent::Stalled { .. }))));
    assert!(path.received_at_b().is_empty());
    path.sim.remove_rule(outage);
    path.sim.run_for(Duration::from_secs(10)).expect("run");
    let got: Vec<String> = path
        .received_at_b()
        .iter()
        .map(|m| String::from_utf8_lossy(m).into_owned())
        .collect();
    assert_eq!(
        got,
        (0..count)
            .map(|i| format!("during-{i}"))
            .collect::<Vec<_>>()
    );
}

/// With a window, a lost S1 does not cost the rounds after it their place: their S1s
/// arrive first, the verifier holds their A1s (A1s go out in round order, each element
/// revealing the earlier ones), and when the lost S1 comes again every round completes.
/// No hop refuses anything on the way.
#[test]
fn a_lost_s1_is_overtaken_and_the_window_still_completes() {
    let mut path = Path::new(12, 2, |c| c.window = 4);
    path.connect().expect("connect");
    let assoc = path.open(Mode::N).expect("open");
    let a = path.a;
    let dropped = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let d = dropped.clone();
    path.sim.add_rule(FnRule::new(
        "drop round 0's first S1",
        move |p: &PacketView<'_>, _rng: &mut dyn rand_core::RngCore| match Packet::parse(p.bytes) {
            Ok(Packet::S1 { header, .. })
                if p.from == a && header.flow == assoc && header.round == 0 && d.get() == 0 =>
            {
                d.set(1);
                Verdict::Drop
            }
            _ => Verdict::Pass,
        },
    ));
    for i in 0..4 {
        assert!(path.send(assoc, format!("m{i}").as_bytes()));
    }
    path.sim.run_for(Duration::from_secs(5)).expect("run");
    assert_eq!(dropped.get(), 1, "the rule never saw round 0's S1");
    let mut got: Vec<String> = path
        .received_at_b()
        .iter()
        .map(|m| String::from_utf8_lossy(m).into_owned())
        .collect();
    got.sort();
    assert_eq!(got, ["m0", "m1", "m2", "m3"]);
    for &r in &path.relays {
        let c = path.sim.node(r).relay().unwrap().counters();
        assert_eq!(c.stale + c.forged + c.unverifiable, 0, "{c:?}");
    }
}

/// With the default `dead_after`, an outage ends the pair and a new handshake starts: the
/// round whose A1 never came is given up only with its chains. Every S1 of the old pair
/// (its pair id) is the same round, and the next S1s carry a new pair id (new chains).
#[test]
fn a_dead_pair_gives_up_its_round_only_with_its_chains() {
    let mut path = Path::new(9, 1, |_| {});
    path.connect().expect("connect");
    let assoc = path.open(Mode::N).expect("open");
    let a = path.a;
    let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let s = seen.clone();
    let outage = path.sim.add_rule(FnRule::new(
        "drop a's S1s",
        move |p: &PacketView<'_>, _rng: &mut dyn rand_core::RngCore| match Packet::parse(p.bytes) {
            Ok(Packet::S1 { header, .. }) if p.from == a => {
                s.borrow_mut()
                    .push((header.pair_id, header.flow, header.round));
                Verdict::Drop
            }
            _ => Verdict::Pass,
        },
    ));
    let old_pair = path.sim.node(a).endpoint().expect("A").status().peers[0].pair_id;
    for i in 0..5 {
        assert!(path.send(assoc, format!("during-{i}").as_bytes()));
    }
    path.sim.run_for(Duration::from_secs(10)).expect("run");
    path.sim.remove_rule(outage);
    let seen = seen.borrow().clone();
    let old: Vec<_> = seen
        .iter()
        .filter(|(p, f, _)| *p == old_pair && *f == assoc)
        .collect();
    assert!(old.len() > 3, "the S1 was sent again ({} times)", old.len());
    let window = u32::from(cohort_hop::DEFAULT_WINDOW);
    assert!(
        old.iter()
            .all(|x| x.2 >= old[0].2 && x.2 < old[0].2 + window),
        "an S1 beyond the window of the old pair went out: {old:?}"
    );
    assert!(path
        .sim
        .events_of(a)
        .any(|(_, e)| matches!(e, HopEvent::Endpoint(EndpointEvent::Disconnected { .. }))));
    let new_pair = path.sim.node(a).endpoint().expect("A").status().peers[0].pair_id;
    assert_ne!(new_pair, old_pair, "no new pair after the outage");
}
