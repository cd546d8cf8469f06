//! The hop-by-hop act of `cohort demo`: a path `a - r1 - r2 - b` where only neighbours hear
//! each other. a and b handshake through both relays (cookie, signed anchors), a sends on an
//! ALPHA-M and an ALPHA-N association, and then a forger next to r1 throws packets made from
//! what it overheard at r1: every one dies there, and r2 and b never see any of them. The
//! same `Endpoint` and `Relay` run over UDP in `cohort hop run`.

use crate::UsageError;
use cohort_channel::identity::{Identity, PublicKey};
use cohort_crypto::{CryptoProvider, Secret};
use cohort_hop::wire::{kind, FlowHeader, Packet};
use cohort_hop::{
    AssocId, Endpoint, EndpointConfig, EndpointEvent, HopCounters, HopEvent, HopNode, Mode, Relay,
    RelayConfig, RelayEvent,
};
use cohort_sim::{FnRule, NodeId, PacketView, Sim, SimConfig, SimFailure, Verdict};
use rand_core::{RngCore, SeedableRng};
use std::cell::RefCell;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

const A: NodeId = NodeId::from_index(0);
const R1: NodeId = NodeId::from_index(1);
const R2: NodeId = NodeId::from_index(2);
const B: NodeId = NodeId::from_index(3);
const NAMES: [&str; 4] = ["a", "r1", "r2", "b"];
const MODE_M: Mode = Mode::M { batch: 16 };
/// Forged packets of each kind.
const EACH: usize = 8;
/// What the forger wants b to read.
const EVIL: &[u8] = b"forger: pay mallory";

/// Every datagram the path carried (fault rules do not see injected ones): from, to, bytes.
type Tap = Rc<RefCell<Vec<(NodeId, NodeId, Vec<u8>)>>>;

fn fail(what: &str) -> impl Fn(SimFailure) -> UsageError + '_ {
    move |e| UsageError(format!("demo hop: {what}: {e}"))
}

/// `ed25519:1a2b3c4d5e6f7081..`: enough of a key to recognise it.
fn fingerprint(key: &PublicKey) -> String {
    format!("ed25519:{}..", hex::encode(&key.as_bytes()[..8]))
}

/// Whether a counter counts drops (all but verified, forwarded, delivered, unprotected).
fn is_drop(name: &str) -> bool {
    !matches!(name, "verified" | "forwarded" | "delivered" | "unprotected")
}

/// The sum of the drop counters.
fn drops(c: &HopCounters) -> u64 {
    c.iter()
        .filter(|(name, _)| is_drop(name))
        .map(|(_, n)| n)
        .sum()
}

/// `forged 8, replayed 8`: the drop counters that rose from `before` to `after`.
fn rose(before: &HopCounters, after: &HopCounters) -> String {
    let parts: Vec<String> = before
        .iter()
        .zip(after.iter())
        .filter(|((name, _), _)| is_drop(name))
        .filter(|((_, b), (_, a))| a > b)
        .map(|((name, b), (_, a))| format!("{name} {}", a - b))
        .collect();
    if parts.is_empty() {
        "nothing".into()
    } else {
        parts.join(", ")
    }
}

fn counters(sim: &Sim<HopNode>, id: NodeId) -> HopCounters {
    match sim.node(id) {
        HopNode::Endpoint(e) => *e.counters(),
        HopNode::Relay(r) => *r.counters(),
    }
}

fn random16(rng: &mut impl RngCore) -> [u8; 16] {
    let mut e = [0u8; 16];
    rng.fill_bytes(&mut e);
    e
}

/// Whether `bytes` is a packet of kind `which` on a data association (not the control one).
fn is_data_flow(bytes: &[u8], which: u8) -> bool {
    bytes.get(1) == Some(&which)
        && Packet::parse(bytes)
            .ok()
            .and_then(|p| p.flow_header().copied())
            .is_some_and(|h| h.flow & 0x7fff != 0)
}

/// Messages b received so far, with the association they came on.
fn received_at_b(sim: &Sim<HopNode>) -> Vec<(AssocId, Vec<u8>)> {
    sim.events_of(B)
        .filter_map(|(_, e)| match e {
            HopEvent::Endpoint(EndpointEvent::Received { assoc, data, .. }) => {
                Some((*assoc, data.clone()))
            }
            _ => None,
        })
        .collect()
}

/// Whether `got` holds exactly the messages of `sent`, each once. ALPHA delivers in arrival
/// order, and the simulated network's jitter reorders the messages of a round.
fn same_messages(got: &[(AssocId, Vec<u8>)], sent: &[(AssocId, Vec<u8>)]) -> bool {
    let mut got = got.to_vec();
    let mut sent = sent.to_vec();
    got.sort();
    sent.sort();
    got == sent
}

/// Spaces as wide as a timestamp column, for a line that goes on from the one above.
fn pad(sim: &Sim<HopNode>) -> String {
    " ".repeat(sim.now().to_string().len())
}

/// Runs the act with the simulator seeded by `seed`.
pub fn run(seed: u64, verbose: bool) -> Result<(), UsageError> {
    let provider = CryptoProvider::default_provider();
    // Identities and endpoint randomness from the seed: the same seed tells the same story.
    let mut keys = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x0068_6f70); // "hop"
    let mut identity = || {
        let mut secret = Secret::zeroed(32);
        keys.fill_bytes(secret.expose_mut());
        let mut rng_seed = [0u8; 32];
        keys.fill_bytes(&mut rng_seed);
        Identity::from_secret(&provider, secret)
            .map(|i| (i, rng_seed))
            .map_err(|e| UsageError(format!("demo hop: identity: {e}")))
    };
    let (a_id, a_seed) = identity()?;
    let (b_id, b_seed) = identity()?;
    let (a_key, b_key) = (a_id.public(), b_id.public());

    let mut sim = Sim::new(SimConfig {
        latency: Duration::from_millis(5),
        jitter: Duration::from_millis(1),
        log_packets: false,
        ..SimConfig::with_seed(seed)
    });
    let (a_addr, b_addr) = (A.addr(), B.addr());
    // Each endpoint trusts only the other's key; the relays check any signed handshake.
    let endpoint = |identity: Identity, peer: PublicKey, at: SocketAddr, rng_seed| {
        let mut config = EndpointConfig::new(identity);
        config.trust = vec![peer];
        HopNode::Endpoint(Endpoint::new(config, provider, at, rng_seed))
    };
    let relay = |route: (SocketAddr, SocketAddr), at: SocketAddr| {
        let mut config = RelayConfig::new();
        config.routes.push(route);
        HopNode::Relay(Relay::new(config, provider, at))
    };
    sim.add_node(endpoint(a_id, b_key, a_addr, a_seed));
    sim.add_node(relay((b_addr, R2.addr()), R1.addr()));
    sim.add_node(relay((a_addr, R1.addr()), R2.addr()));
    sim.add_node(endpoint(b_id, a_key, b_addr, b_seed));
    // Only neighbours on the path hear each other.
    sim.add_rule(FnRule::new(
        "path",
        |p: &PacketView<'_>, _: &mut dyn RngCore| {
            if p.from.index().abs_diff(p.to.index()) == 1 {
                Verdict::Pass
            } else {
                Verdict::Drop
            }
        },
    ));
    // What the forger (and the story) overhears: everything the path lets through.
    let tap: Tap = Rc::default();
    let t = tap.clone();
    sim.add_rule(FnRule::new(
        "wiretap",
        move |p: &PacketView<'_>, _: &mut dyn RngCore| {
            t.borrow_mut().push((p.from, p.to, p.bytes.to_vec()));
            Verdict::Pass
        },
    ));

    println!();
    println!("cohort demo, part 4: hop-by-hop authentication (ALPHA) on a path a - r1 - r2 - b (seed {seed})");
    println!();
    println!("  only neighbours hear each other (5 ms a hop). the relays hold no keys: they check");
    println!("  every packet against hash-chain anchors that a and b signed in their handshake,");
    println!("  with hashes alone, and pass on only what verified.");
    println!();

    // 1. The handshake.
    let mut seen = 0;
    println!(
        "{}  ** a says hello to b via r1 (cookie, then signed anchors)",
        sim.now()
    );
    sim.with_node(A, |n, now| {
        if let Some(e) = n.endpoint_mut() {
            e.connect(now, b_addr, Some(R1.addr()));
        }
    });
    sim.run_until_cond(Duration::from_secs(30), |s| {
        s.node(A).endpoint().is_some_and(|e| e.is_connected(b_addr))
            && s.node(B).endpoint().is_some_and(|e| e.is_connected(a_addr))
    })
    .map_err(fail("handshake"))?;
    narrate(&sim, &mut seen, verbose, [a_key, b_key]);

    // 2. Two associations and some traffic.
    println!(
        "{}  ** a opens an ALPHA-M association ({} messages a round) and an ALPHA-N one",
        sim.now(),
        MODE_M.batch()
    );
    let mut open = |mode| {
        sim.with_node(A, |n, now| {
            n.endpoint_mut()
                .map(|e| e.open(now, b_addr, mode))
                .unwrap_or(Err(cohort_hop::HopError::UnknownPeer))
        })
        .map_err(|e| UsageError(format!("demo hop: open {mode}: {e:?}")))
    };
    let m = open(MODE_M)?;
    let n = open(Mode::N)?;
    sim.run_until_cond(Duration::from_secs(30), |s| {
        s.node(A).endpoint().is_some_and(|e| {
            let open = e.open_associations(b_addr);
            open.contains(&m) && open.contains(&n)
        })
    })
    .map_err(fail("opening"))?;
    narrate(&sim, &mut seen, verbose, [a_key, b_key]);

    let mut sent: Vec<(AssocId, Vec<u8>)> = Vec::new();
    let assocs = [(m, "m"), (n, "n")];
    let (on_m, on_n) = (48, 6);
    println!(
        "{}  ** a sends {on_m} messages on ALPHA-M and {on_n} on ALPHA-N",
        sim.now()
    );
    send(&mut sim, &mut sent, assocs, "hello", [on_m, on_n]);
    let expected = sent.len();
    let done = sim
        .run_until_cond(Duration::from_secs(30), |s| {
            received_at_b(s).len() >= expected
        })
        .map_err(fail("sending"))?;
    narrate(&sim, &mut seen, verbose, [a_key, b_key]);
    let got = received_at_b(&sim);
    let count_on = |assoc| got.iter().filter(|(a, _)| *a == assoc).count();
    println!(
        "{done}  b received {} on ALPHA-M and {} on ALPHA-N: {}",
        count_on(m),
        count_on(n),
        if same_messages(&got, &sent) {
            "all of them, each once"
        } else {
            "NOT what a sent"
        }
    );
    for r in [R1, R2] {
        let c = counters(&sim, r);
        println!(
            "{}  {:<2} verified {} packets and forwarded {}; dropped {}",
            pad(&sim),
            NAMES[r.index()],
            c.verified,
            c.forwarded,
            drops(&c)
        );
    }

    // 3. The forger, next to r1.
    let mut forger = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x6d61_6c6c_6f72); // "mallor"
    let before: Vec<HopCounters> = [A, R1, R2, B]
        .iter()
        .map(|&id| counters(&sim, id))
        .collect();
    let tap_from = tap.borrow().len();
    let received_before = got.len();
    println!(
        "{}  ** a forger next to r1 overhears r1's links and sends r1 packets of its own:",
        sim.now()
    );
    let mut table: Vec<(&str, usize, String)> = Vec::new();

    // (a) While a sends more, the forger races a's S2s: as soon as it hears one leave a, it
    // sends r1 the same S2 (the key is out now) with its own payload, arriving first.
    let r1_before = counters(&sim, R1);
    send(&mut sim, &mut sent, assocs, "again", [32, 4]);
    let expected = sent.len();
    let mut raced = 0;
    let mut heard = tap.borrow().len();
    let limit = sim.now() + Duration::from_secs(30);
    while raced < EACH && sim.now() < limit && sim.step() {
        let new: Vec<(NodeId, NodeId, Vec<u8>)> = tap.borrow()[heard..].to_vec();
        heard += new.len();
        for (from, to, bytes) in new {
            if raced >= EACH || from != A || to != R1 || !is_data_flow(&bytes, kind::S2) {
                continue;
            }
            let Ok(Packet::S2 {
                header,
                index,
                key,
                path,
                ..
            }) = Packet::parse(&bytes)
            else {
                continue;
            };
            let mut forged = Vec::new();
            Packet::S2 {
                header,
                index,
                key,
                path,
                payload: EVIL,
            }
            .write(&mut forged);
            sim.inject(a_addr, R1, forged, Duration::from_millis(1));
            raced += 1;
        }
    }
    sim.run_until_cond(Duration::from_secs(30), |s| {
        received_at_b(s).len() >= expected
    })
    .map_err(fail("sending under attack"))?;
    sim.run_for(Duration::from_millis(100))
        .map_err(fail("sending under attack"))?;
    table.push((
        "S2 with its own payload under the just-disclosed key, ahead of a's",
        raced,
        rose(&r1_before, &counters(&sim, R1)),
    ));

    // What the forger overheard on r1's links.
    let overheard: Vec<(NodeId, NodeId, Vec<u8>)> = tap
        .borrow()
        .iter()
        .filter(|(f, t, _)| *f == R1 || *t == R1)
        .cloned()
        .collect();
    let of = |k: u8, from: NodeId| -> Vec<Vec<u8>> {
        overheard
            .iter()
            .filter(|(f, _, b)| *f == from && is_data_flow(b, k))
            .map(|(_, _, b)| b.clone())
            .collect()
    };
    let (s1s, s2s, a1s) = (of(kind::S1, A), of(kind::S2, A), of(kind::A1, R2));

    // (b) Verbatim replays of real S2s r1 has already passed on.
    let mut phase = |sim: &mut Sim<HopNode>,
                     what: &'static str,
                     from: SocketAddr,
                     packets: Vec<Vec<u8>>|
     -> Result<(), UsageError> {
        let before = counters(sim, R1);
        let count = packets.len();
        for (i, p) in packets.into_iter().enumerate() {
            sim.inject(from, R1, p, Duration::from_millis(1 + i as u64));
        }
        sim.run_for(Duration::from_millis(100))
            .map_err(fail("forging"))?;
        table.push((what, count, rose(&before, &counters(sim, R1))));
        Ok(())
    };
    let replays: Vec<Vec<u8>> = s2s.iter().step_by(3).take(EACH).cloned().collect();
    phase(&mut sim, "S2 of a's, replayed verbatim", a_addr, replays)?;

    // (c) S1s with random chain elements (and MACs), for the round after a's last one.
    let mut s1_forged = Vec::new();
    for i in 0..EACH {
        let Some(real) = s1s.get(s1s.len().saturating_sub(1 + i % 2)) else {
            break;
        };
        let Ok(Packet::S1 {
            header,
            mode,
            count,
            macs,
            ..
        }) = Packet::parse(real)
        else {
            continue;
        };
        let mut fake_macs = vec![0u8; macs.len()];
        forger.fill_bytes(&mut fake_macs);
        let mut out = Vec::new();
        Packet::S1 {
            header: FlowHeader {
                round: header.round + 1 + (i / 2) as u32,
                ..header
            },
            mode,
            element: random16(&mut forger),
            count,
            macs: &fake_macs,
        }
        .write(&mut out);
        s1_forged.push(out);
    }
    phase(
        &mut sim,
        "S1 with a random chain element (and MACs)",
        a_addr,
        s1_forged,
    )?;

    // (d) A1s with random chain elements, for rounds r1 has seen acknowledged.
    let mut a1_forged = Vec::new();
    for real in a1s.iter().rev().take(EACH) {
        let Ok(Packet::A1 { header, report, .. }) = Packet::parse(real) else {
            continue;
        };
        let mut out = Vec::new();
        Packet::A1 {
            header,
            element: random16(&mut forger),
            report,
        }
        .write(&mut out);
        a1_forged.push(out);
    }
    phase(
        &mut sim,
        "A1 with a random chain element",
        R2.addr(),
        a1_forged,
    )?;
    narrate(&sim, &mut seen, verbose, [a_key, b_key]);

    // What it came to.
    let injected: usize = table.iter().map(|(_, n, _)| n).sum();
    for (what, count, fate) in &table {
        println!("    {count:>2} x {what:<66} r1: {fate}");
    }
    let after: Vec<HopCounters> = [A, R1, R2, B]
        .iter()
        .map(|&id| counters(&sim, id))
        .collect();
    let r1_dropped = drops(&after[1]) - drops(&before[1]);
    let r2_dropped = drops(&after[2]) - drops(&before[2]);
    let b_dropped = drops(&after[3]) - drops(&before[3]);
    // Everything r1 sent during the attack, byte for byte something a or b had sent.
    let (genuine, r1_sent) = {
        let t = tap.borrow();
        let genuine: HashSet<&[u8]> = t
            .iter()
            .filter(|(f, _, _)| *f == A || *f == B)
            .map(|(_, _, b)| b.as_slice())
            .collect();
        let r1_sent: Vec<Vec<u8>> = t[tap_from..]
            .iter()
            .filter(|(f, _, _)| *f == R1)
            .map(|(_, _, b)| b.clone())
            .collect();
        let all_genuine = r1_sent.iter().all(|b| genuine.contains(b.as_slice()));
        (all_genuine, r1_sent.len())
    };
    let got = received_at_b(&sim);
    let new_at_b = &got[received_before..];
    let only_as = got.iter().all(|m| sent.contains(m)) && !got.iter().any(|(_, d)| d == EVIL);
    println!(
        "{}  r1's drop counters rose by {r1_dropped} (the forger sent {injected}); r2's by {r2_dropped}, b's by {b_dropped}",
        sim.now()
    );
    println!(
        "{}  all {r1_sent} packets r1 passed on meanwhile were {} a or b sent",
        pad(&sim),
        if genuine {
            "byte for byte packets"
        } else {
            "NOT all packets"
        }
    );
    println!(
        "{}  b received {} more messages, {}",
        pad(&sim),
        new_at_b.len(),
        if only_as && same_messages(&got, &sent) {
            "every one a's, each once: none of the forger's"
        } else if only_as {
            "only a's (but not all of them, or some twice)"
        } else {
            "SOME NOT FROM a"
        }
    );
    let complete = same_messages(&got, &sent);
    let dies =
        r1_dropped == injected as u64 && r2_dropped == 0 && b_dropped == 0 && genuine && only_as;

    // 4. The summary.
    println!();
    let delivery = if complete {
        format!("b got all {} of a's messages", sent.len())
    } else {
        format!("b got {} messages for a's {}", got.len(), sent.len())
    };
    if dies {
        println!(
            "summary: forged traffic dies at the first hop (r1 dropped {injected} of {injected}; r2 and b saw none); {delivery}."
        );
    } else {
        println!(
            "summary: forged traffic did NOT all die at the first hop (r1's drops rose by {r1_dropped} of {injected}, r2's by {r2_dropped}, b's by {b_dropped}); {delivery}."
        );
    }
    Ok(())
}

/// a queues `counts[i]` messages on association `assocs[i]`; those taken go into `sent`.
fn send(
    sim: &mut Sim<HopNode>,
    sent: &mut Vec<(AssocId, Vec<u8>)>,
    assocs: [(AssocId, &str); 2],
    word: &str,
    counts: [usize; 2],
) {
    let b_addr = B.addr();
    for ((assoc, name), count) in assocs.into_iter().zip(counts) {
        for i in 0..count {
            let data = format!("{word} {name}#{i} from a").into_bytes();
            let ok = sim.with_node(A, |node, now| {
                node.endpoint_mut()
                    .is_some_and(|e| e.send(now, b_addr, assoc, &data).is_ok())
            });
            if ok {
                sent.push((assoc, data));
            }
        }
    }
}

/// Prints the handshake and association events after the first `seen`.
fn narrate(sim: &Sim<HopNode>, seen: &mut usize, verbose: bool, keys: [PublicKey; 2]) {
    for (at, node, event) in sim.events().skip(*seen) {
        *seen += 1;
        let name = NAMES.get(node.index()).copied().unwrap_or("?");
        let peer_name = |addr: &SocketAddr| {
            NodeId::from_addr(*addr)
                .and_then(|id| NAMES.get(id.index()).copied())
                .unwrap_or("?")
        };
        match event {
            HopEvent::Relay(RelayEvent::PairLearned {
                initiator,
                responder,
            }) => println!(
                "{at}  {name:<2} learned the pair {} -> {} from their signed anchors",
                peer_name(initiator),
                peer_name(responder)
            ),
            HopEvent::Endpoint(EndpointEvent::Connected { peer, key }) => {
                let expected = if node == A { keys[1] } else { keys[0] };
                let note = if *key == expected {
                    "as configured"
                } else {
                    "NOT the key configured"
                };
                println!(
                    "{at}  {name:<2} connected to {}, whose anchors are signed by {} ({note})",
                    peer_name(peer),
                    fingerprint(key)
                );
            }
            HopEvent::Endpoint(EndpointEvent::Opened {
                assoc,
                outgoing,
                mode,
                ..
            }) => {
                if verbose || !outgoing {
                    println!("{at}  {name:<2} association {assoc} open (mode {mode})");
                }
            }
            HopEvent::Endpoint(EndpointEvent::Received { assoc, data, .. }) => {
                if verbose {
                    println!(
                        "{at}  {name:<2} received on {assoc}: {}",
                        String::from_utf8_lossy(data)
                    );
                }
            }
            HopEvent::Endpoint(other) => {
                if verbose {
                    println!("{at}  {name:<2} {other:?}");
                }
            }
            other => {
                if verbose {
                    println!("{at}  {name:<2} {other:?}");
                }
            }
        }
    }
}
