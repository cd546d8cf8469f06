//! ALPHA in the simulator: paths of 0 to 4 relays, every mode, faults and an adversary.
//!
//! `COHORT_SIM_SEED=<seed>` replays one seed; `COHORT_SIM_SEEDS=<n>` runs `n` seeds.

mod support;

use cohort_hop::Mode;
use std::time::Duration;
use support::Path;

#[test]
fn every_mode_delivers_through_two_relays() {
    for mode in [
        Mode::Unprotected,
        Mode::N,
        Mode::C { batch: 8 },
        Mode::M { batch: 16 },
    ] {
        let mut path = Path::new(1, 2, |_| {});
        path.connect().expect("connect");
        let assoc = path.open(mode).expect("open");
        let sent: Vec<Vec<u8>> = (0..100)
            .map(|i| format!("message {i}").into_bytes())
            .collect();
        for m in &sent {
            assert!(path.send(assoc, m));
        }
        path.sim.run_for(Duration::from_secs(10)).expect("run");
        assert_eq!(path.received_at_b(), sent, "mode {mode}");
        for &r in &path.relays {
            let c = path.sim.node(r).relay().unwrap().counters();
            assert_eq!(
                c.forged + c.malformed + c.stale + c.unverifiable,
                0,
                "{mode}: {c:?}"
            );
        }
    }
}

use cohort_hop::wire::{kind, Packet};
use cohort_hop::{EndpointEvent, HopEvent};
use cohort_sim::rand_core::RngCore;
use cohort_sim::{sweep, FnRule, NodeId, PacketView, SimFailure, StandardFaults, Verdict};
use rand_chacha::rand_core::SeedableRng;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

/// Every datagram a node sent, as the wire saw it: (from, to, bytes).
type Tap = Rc<RefCell<Vec<(NodeId, NodeId, Vec<u8>)>>>;

fn wiretap(path: &mut Path) -> Tap {
    let tap: Tap = Rc::default();
    let t = tap.clone();
    // Inserted after the path rule: it records only what the path lets through.
    path.sim.add_rule(FnRule::new(
        "wiretap",
        move |p: &PacketView<'_>, _rng: &mut dyn RngCore| {
            t.borrow_mut().push((p.from, p.to, p.bytes.to_vec()));
            Verdict::Pass
        },
    ));
    tap
}

/// An adversary's version of a real packet: a field changed so that it must not verify.
fn craft(real: &[u8], rng: &mut dyn RngCore) -> Option<Vec<u8>> {
    let packet = Packet::parse(real).ok()?;
    let mut out = real.to_vec();
    let at = |lo: usize, hi: usize, rng: &mut dyn RngCore| {
        lo + (rng.next_u32() as usize) % (hi - lo).max(1)
    };
    // Offsets: version, kind, pair id (8), flow (2), round (4) = 16 bytes of flow header.
    match packet {
        Packet::S1 { .. } => {
            // A MAC or the element.
            let i = at(17, out.len(), rng);
            out[i] ^= 1 << (rng.next_u32() % 8);
        }
        Packet::S2 { path, payload, .. } => match rng.next_u32() % 4 {
            // Another payload under the disclosed key (the classic forgery).
            0 => {
                let start = out.len() - payload.len();
                out.truncate(start);
                out.extend_from_slice(b"EVIL forged payload");
            }
            // The key: an element from elsewhere in the chain.
            1 => {
                let i = at(18, 34, rng);
                out[i] ^= 1 << (rng.next_u32() % 8);
            }
            // The index (another message's MAC) or the path.
            2 => {
                out[16] ^= 0x01;
            }
            _ => {
                if path.is_empty() || payload.is_empty() {
                    let last = out.len() - 1;
                    out[last] ^= 0x80;
                } else {
                    let i = at(35, 35 + path.len(), rng);
                    out[i] ^= 1 << (rng.next_u32() % 8);
                }
            }
        },
        Packet::A1 { .. } | Packet::A2 { .. } => {
            let i = at(16, out.len(), rng);
            out[i] ^= 1 << (rng.next_u32() % 8);
        }
        _ => {
            let i = at(2, out.len(), rng);
            out[i] ^= 1 << (rng.next_u32() % 8);
        }
    }
    (out != real).then_some(out)
}

/// Both endpoints' status and the relays' counters, for failure messages.
fn dump(path: &Path) -> String {
    let mut out = format!(
        "A: {:#?}\nB: {:#?}",
        path.sim.node(path.a).endpoint().map(|e| e.status()),
        path.sim.node(path.b).endpoint().map(|e| e.status())
    );
    for &r in &path.relays {
        out += &format!(
            "\nrelay {r:?}: {:?}",
            path.sim.node(r).relay().map(|r| r.counters())
        );
    }
    out
}

/// What one sweep run checks: faults, an adversary, any path length and mode; nothing
/// forged or replayed is accepted anywhere, and after the faults stop traffic flows again.
fn faults_and_adversary(seed: u64) -> Result<(), SimFailure> {
    let mut pick = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0xA1FA);
    let relays = 1 + (pick.next_u32() % 4) as usize;
    let mode = match pick.next_u32() % 4 {
        0 => Mode::N,
        1 => Mode::C {
            batch: 1 + (pick.next_u32() % 16) as u16,
        },
        2 => Mode::M {
            batch: 1 + (pick.next_u32() % 64) as u16,
        },
        _ => Mode::M { batch: 32 },
    };
    let reports = pick.next_u32() % 2 == 0;
    let chain_rounds = [8, 64, 1024][(pick.next_u32() % 3) as usize];
    let mut path = Path::new(seed, relays, |c| {
        c.delivery_reports = reports;
        c.chain_rounds = chain_rounds;
    });
    let tap = wiretap(&mut path);
    path.connect()?;
    let assoc = path.open(mode)?;
    let context = format!("relays {relays}, mode {mode}, reports {reports}, chain {chain_rounds}");

    // Faults: 3 % loss, duplication and reordering, 5 % delay of 1 to 40 ms, 1 % tampering.
    let faults = StandardFaults::light().add_to(&mut path.sim);
    let mut sent: HashSet<Vec<u8>> = HashSet::new();
    let mut crafted: HashSet<Vec<u8>> = HashSet::new();
    let nodes: Vec<NodeId> = std::iter::once(path.a)
        .chain(path.relays.iter().copied())
        .chain(std::iter::once(path.b))
        .collect();
    for tick in 0..60u32 {
        for k in 0..(pick.next_u32() % 12) {
            let m = format!("s{seed}-t{tick}-k{k}").into_bytes();
            if path.send(assoc, &m) {
                sent.insert(m);
            }
        }
        // The adversary replays and forges from what it overheard.
        let overheard: Vec<(NodeId, NodeId, Vec<u8>)> = {
            let t = tap.borrow();
            let n = t.len();
            (0..3.min(n))
                .map(|_| t[(pick.next_u32() as usize) % n].clone())
                .collect()
        };
        for (from, to, bytes) in overheard {
            let target = nodes[(pick.next_u32() as usize) % nodes.len()];
            let from_addr = path.addr(from);
            if pick.next_u32() % 2 == 0 {
                // A verbatim replay, to the same node or another.
                let to = if pick.next_u32() % 2 == 0 { to } else { target };
                path.sim.inject(
                    from_addr,
                    to,
                    bytes,
                    Duration::from_millis(u64::from(pick.next_u32() % 30)),
                );
            } else if let Some(forged) = craft(&bytes, &mut pick) {
                crafted.insert(forged.clone());
                path.sim
                    .inject(from_addr, target, forged, Duration::from_millis(1));
            }
        }
        path.sim.run_for(Duration::from_millis(50))?;
    }
    faults.remove(&mut path.sim);
    path.sim.run_for(Duration::from_secs(5))?;

    // After the faults: everything sent now arrives.
    let after: Vec<Vec<u8>> = (0..40)
        .map(|i| format!("after-{seed}-{i}").into_bytes())
        .collect();
    for m in &after {
        let ok = path.send(assoc, m);
        path.sim
            .check(ok, format!("{context}: send after faults"))?;
        sent.insert(m.clone());
    }
    // ALPHA-N moves one message per round trip: give the backlog time to drain.
    if path.drain(Duration::from_secs(300)).is_err() {
        return Err(path.sim.failure(format!(
            "{context}: the backlog never drained\n{}",
            dump(&path)
        )));
    }
    path.sim.run_for(Duration::from_secs(2))?;

    let received = path.received_at_b();
    let mut seen = HashSet::new();
    for m in &received {
        path.sim.check(
            sent.contains(m),
            format!(
                "{context}: B delivered a message nobody sent: {:?}",
                String::from_utf8_lossy(m)
            ),
        )?;
        path.sim.check(
            seen.insert(m.clone()),
            format!(
                "{context}: B delivered {:?} twice",
                String::from_utf8_lossy(m)
            ),
        )?;
    }
    for m in &after {
        path.sim.check(
            seen.contains(m),
            format!(
                "{context}: {:?} sent after the faults never arrived\nA: {:#?}\nB: {:#?}",
                String::from_utf8_lossy(m),
                path.sim.node(path.a).endpoint().map(|e| e.status()),
                path.sim.node(path.b).endpoint().map(|e| e.status()),
            ) + &path
                .relays
                .iter()
                .map(|&r| {
                    format!(
                        "\nrelay {r:?}: {:?}",
                        path.sim.node(r).relay().map(|r| r.counters())
                    )
                })
                .collect::<String>(),
        )?;
    }
    // No relay ever passed on a crafted packet, and no relay forwarded one S2 twice.
    let genuine: HashSet<Vec<u8>> = tap
        .borrow()
        .iter()
        .filter(|(from, _, _)| *from == path.a || *from == path.b)
        .map(|(_, _, b)| b.clone())
        .collect();
    let genuine_elements: HashSet<(u32, u16, [u8; 16])> = genuine
        .iter()
        .filter_map(|b| match Packet::parse(b) {
            Ok(
                Packet::S1 {
                    header, element, ..
                }
                | Packet::A1 {
                    header, element, ..
                },
            ) => Some((header.round, header.flow, element)),
            _ => None,
        })
        .collect();
    let mut forwarded_s2: HashMap<(NodeId, Vec<u8>), u32> = HashMap::new();
    for (from, _, bytes) in tap.borrow().iter() {
        // The return-routability exchange (Hello, Challenge, SYN) passes relays unchecked by
        // design: no state, and the responder checks it.
        // An S1's MACs (and an A1's report commitments) cannot be checked by anyone before
        // the key (the next ack element) is disclosed, and the element they come with is
        // public as soon as it is sent: a repeat of a real element with other MACs is held
        // and passed on as a candidate (bounded), and the S2s (A2) that follow verify only
        // against the real one. So for S1 and A1 the element must be real; an S2, A2,
        // signed or handshake packet must be real byte for byte.
        let unchecked = matches!(
            bytes.get(1),
            Some(&(kind::HELLO | kind::CHALLENGE | kind::SYN))
        ) || matches!(
            Packet::parse(bytes),
            Ok(Packet::S1 { header, element, .. } | Packet::A1 { header, element, .. })
                if genuine_elements.contains(&(header.round, header.flow, element))
        );
        if path.relays.contains(from) && !unchecked {
            path.sim.check(
                !crafted.contains(bytes) || genuine.contains(bytes),
                format!(
                    "{context}: relay {from:?} forwarded a forged packet: {:?}",
                    Packet::parse(bytes)
                ),
            )?;
            if bytes.get(1) == Some(&kind::S2) {
                *forwarded_s2.entry((*from, bytes.clone())).or_default() += 1;
            }
        }
    }
    // The simulator may duplicate a datagram on the wire after the relay sent it once; a
    // relay itself sends each S2 at most once.
    for ((relay, _), n) in forwarded_s2 {
        path.sim.check(
            n == 1,
            format!("{context}: relay {relay:?} forwarded one S2 {n} times"),
        )?;
    }
    let renewed = path
        .sim
        .events_of(path.a)
        .filter(|(_, e)| matches!(e, HopEvent::Endpoint(EndpointEvent::Renewed { .. })))
        .count();
    if chain_rounds == 8 {
        path.sim.check(
            renewed > 0,
            format!("{context}: short chains never renewed"),
        )?;
    }
    Ok(())
}

#[test]
fn random_faults_and_adversary() {
    sweep(24, faults_and_adversary);
}
