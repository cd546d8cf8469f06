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
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

/// Every datagram a node sent, as the wire saw it: (from, to, bytes, relay restarts so
/// far).
type Tap = Rc<RefCell<Vec<(NodeId, NodeId, Vec<u8>, u32)>>>;

/// Relay restarts so far (a restarted relay remembers nothing it forwarded before).
type Epoch = Rc<Cell<u32>>;

fn wiretap(path: &mut Path) -> (Tap, Epoch) {
    let tap: Tap = Rc::default();
    let epoch: Epoch = Rc::default();
    let (t, e) = (tap.clone(), epoch.clone());
    // Inserted after the path rule: it records only what the path lets through.
    path.sim.add_rule(FnRule::new(
        "wiretap",
        move |p: &PacketView<'_>, _rng: &mut dyn RngCore| {
            t.borrow_mut()
                .push((p.from, p.to, p.bytes.to_vec(), e.get()));
            Verdict::Pass
        },
    ));
    (tap, epoch)
}

/// A link between two neighbours that drops everything both ways while it is down.
fn cut_link(path: &mut Path, x: NodeId, y: NodeId) -> cohort_sim::RuleId {
    path.sim.add_rule(FnRule::new(
        "flap",
        move |p: &PacketView<'_>, _rng: &mut dyn RngCore| {
            if (p.from == x && p.to == y) || (p.from == y && p.to == x) {
                Verdict::Drop
            } else {
                Verdict::Pass
            }
        },
    ))
}

/// One fault of the recovery tests.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// The first relay dies and comes back 2 s later with no state.
    RelayRestart,
    /// The sender dies and comes back 2 s later with no state, and connects again.
    SenderRestart,
    /// The receiver dies and comes back 2 s later with no state (it waits to be called).
    ReceiverRestart,
    /// The link between the two relays drops everything for this long.
    Flap(Duration),
}

/// The adversary of one tick: replays one overheard packet (to where it went or to another
/// node) or sends a crafted copy of it. Returns the crafted packet, if any.
fn adversary(path: &mut Path, tap: &Tap, pick: &mut impl RngCore) -> Option<Vec<u8>> {
    let (from, to, bytes) = {
        let t = tap.borrow();
        if t.is_empty() {
            return None;
        }
        let (f, to, b, _) = &t[(pick.next_u32() as usize) % t.len()];
        (*f, *to, b.clone())
    };
    let nodes: Vec<NodeId> = std::iter::once(path.a)
        .chain(path.relays.iter().copied())
        .chain(std::iter::once(path.b))
        .collect();
    let target = nodes[(pick.next_u32() as usize) % nodes.len()];
    let from_addr = path.addr(from);
    if pick.next_u32().is_multiple_of(2) {
        let to = if pick.next_u32().is_multiple_of(2) {
            to
        } else {
            target
        };
        let after = Duration::from_millis(u64::from(pick.next_u32() % 30));
        path.sim.inject(from_addr, to, bytes, after);
        None
    } else {
        let forged = craft(&bytes, pick)?;
        path.sim
            .inject(from_addr, target, forged.clone(), Duration::from_millis(1));
        Some(forged)
    }
}

/// Steady traffic A -> B through two relays (a message every 50 ms, ALPHA-M), an adversary
/// replaying and forging all along, and one `fault`. Checks that B delivers only what A
/// sent, each once, and that traffic is back within 10 s of the fault's end, and that
/// everything sent from a second after that arrives. Returns the recovery time (from the
/// fault's end to B's first delivery after it).
fn recovery_after(seed: u64, fault: Fault) -> Result<Duration, SimFailure> {
    let mode = Mode::M { batch: 8 };
    let mut path = Path::new(seed, 2, |_| {});
    let (tap, epoch) = wiretap(&mut path);
    path.connect()?;
    path.open(mode)?;
    let mut pick = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x5EC0);
    let mut sent: HashMap<Vec<u8>, cohort_core::Timestamp> = HashMap::new();
    let mut n = 0u32;
    let mut tick = |path: &mut Path, pick: &mut rand_chacha::ChaCha8Rng, attack: bool| {
        if !path.sim.is_crashed(path.a) {
            path.keep_open(mode);
            let m = format!("m{n}").into_bytes();
            n += 1;
            if path.send_any(&m) {
                sent.insert(m, path.now());
            }
        }
        if attack {
            adversary(path, &tap, pick);
        }
        path.sim.run_for(Duration::from_millis(50))
    };
    for _ in 0..40 {
        tick(&mut path, &mut pick, true)?;
    }
    let fault_start = path.now();
    let (r1, r2) = (path.relays[0], path.relays[1]);
    match fault {
        Fault::RelayRestart | Fault::SenderRestart | Fault::ReceiverRestart => {
            let node = match fault {
                Fault::RelayRestart => r1,
                Fault::SenderRestart => path.a,
                _ => path.b,
            };
            path.sim.crash(node);
            for _ in 0..40 {
                tick(&mut path, &mut pick, true)?;
            }
            if node == r1 {
                epoch.set(epoch.get() + 1);
            }
            path.restart(node);
        }
        Fault::Flap(d) => {
            let rule = cut_link(&mut path, r1, r2);
            for _ in 0..d.as_millis() / 50 {
                tick(&mut path, &mut pick, true)?;
            }
            path.sim.remove_rule(rule);
        }
    }
    let fault_end = path.now();
    for _ in 0..300 {
        tick(&mut path, &mut pick, true)?;
    }
    // The adversary stops (a forged S1 raced ahead of the real one costs the real round's
    // messages, by design: see the README), and traffic goes on for 3 s.
    let quiet = path.now();
    for _ in 0..60 {
        tick(&mut path, &mut pick, false)?;
    }
    path.sim.run_for(Duration::from_secs(5))?;
    let context = format!("{fault:?}");
    let b = path.b;
    let deliveries: Vec<(cohort_core::Timestamp, Vec<u8>)> = path
        .sim
        .events_of(b)
        .filter_map(|(t, e)| match e {
            HopEvent::Endpoint(EndpointEvent::Received { data, .. }) => Some((t, data.clone())),
            _ => None,
        })
        .collect();
    let mut seen = HashSet::new();
    for (_, m) in &deliveries {
        path.sim.check(
            sent.contains_key(m),
            format!(
                "{context}: B delivered {:?}, never sent",
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
    let Some(first) = deliveries.iter().map(|(t, _)| *t).find(|t| *t >= fault_end) else {
        return Err(path.sim.failure(format!(
            "{context}: nothing delivered after the fault\n{}",
            dump(&path)
        )));
    };
    let recovery = first.saturating_duration_since(fault_end);
    path.sim.check(
        recovery <= Duration::from_secs(10),
        format!("{context}: traffic came back {recovery:?} after the fault ended"),
    )?;
    // Once the adversary stopped, everything sent arrived.
    let settled = quiet + Duration::from_millis(500);
    for (m, at) in &sent {
        if *at >= settled {
            path.sim.check(
                seen.contains(m),
                format!(
                    "{context}: {:?} sent {at:?} (the attack stopped at {quiet:?}) never arrived\n{}",
                    String::from_utf8_lossy(m),
                    dump(&path)
                ),
            )?;
        }
    }
    // The recovery went the way it should: a restart (or an outage longer than
    // `dead_after`) ends the pair and a new handshake replaces it; a short flap does not.
    let disconnects = [path.a, path.b]
        .iter()
        .flat_map(|&x| path.sim.events_of(x).collect::<Vec<_>>())
        .filter(|(t, e)| {
            *t >= fault_start && matches!(e, HopEvent::Endpoint(EndpointEvent::Disconnected { .. }))
        })
        .count();
    let expect_new_pair = !matches!(fault, Fault::Flap(d) if d < Duration::from_secs(2));
    path.sim.check(
        (disconnects > 0) == expect_new_pair,
        format!("{context}: {disconnects} Disconnected events"),
    )?;
    let _ = fault_start;
    Ok(recovery)
}

#[test]
fn traffic_resumes_after_restarts_and_flaps() {
    for fault in [
        Fault::RelayRestart,
        Fault::SenderRestart,
        Fault::ReceiverRestart,
        Fault::Flap(Duration::from_millis(1000)),
        Fault::Flap(Duration::from_secs(6)),
        Fault::Flap(Duration::from_secs(20)),
    ] {
        for seed in 1..=3 {
            match recovery_after(seed, fault) {
                Ok(d) => println!("{fault:?} seed {seed}: traffic back after {d:?}"),
                Err(e) => panic!("{e}"),
            }
        }
    }
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
    // The endpoints' events other than deliveries (handshakes, associations, stalls).
    for (name, id) in [("A", path.a), ("B", path.b)] {
        for (t, e) in path.sim.events_of(id) {
            if !matches!(e, HopEvent::Endpoint(EndpointEvent::Received { .. })) {
                out += &format!("\n{name} {t:?}: {e:?}");
            }
        }
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
    let window = [1, 2, 4, 8][(pick.next_u32() % 4) as usize];
    let mut path = Path::new(seed, relays, |c| {
        c.delivery_reports = reports;
        c.chain_rounds = chain_rounds;
        c.window = window;
    });
    let (tap, epoch) = wiretap(&mut path);
    path.connect()?;
    path.open(mode)?;
    // Half the runs restart a node (a relay, the sender or the receiver, with no state) or
    // cut a link for a while, at a random moment of the faulty phase.
    let restart_at = if pick.next_u32() % 2 == 0 {
        Some(10 + pick.next_u32() % 40)
    } else {
        None
    };
    let restart_what = pick.next_u32() as usize % (relays + 3);
    let mut cut: Option<(cohort_sim::RuleId, u32)> = None;
    let context = format!(
        "relays {relays}, mode {mode}, reports {reports}, chain {chain_rounds}, window {window}"
    );

    // Faults: 3 % loss, duplication and reordering, 5 % delay of 1 to 40 ms, 1 % tampering.
    let faults = StandardFaults::light().add_to(&mut path.sim);
    let mut sent: HashSet<Vec<u8>> = HashSet::new();
    let mut crafted: HashSet<Vec<u8>> = HashSet::new();
    let nodes: Vec<NodeId> = std::iter::once(path.a)
        .chain(path.relays.iter().copied())
        .chain(std::iter::once(path.b))
        .collect();
    for tick in 0..60u32 {
        if restart_at == Some(tick) {
            // 0: A, 1..=relays: a relay, relays + 1: B, relays + 2: a link flap.
            if restart_what <= relays + 1 {
                let node = nodes[restart_what];
                if path.relays.contains(&node) {
                    epoch.set(epoch.get() + 1);
                }
                path.restart(node);
            } else {
                let i = pick.next_u32() as usize % (nodes.len() - 1);
                let rule = cut_link(&mut path, nodes[i], nodes[i + 1]);
                cut = Some((rule, tick + 1 + pick.next_u32() % 60));
            }
        }
        if let Some((rule, until)) = cut {
            if tick >= until {
                path.sim.remove_rule(rule);
                cut = None;
            }
        }
        path.keep_open(mode);
        for k in 0..(pick.next_u32() % 12) {
            let m = format!("s{seed}-t{tick}-k{k}").into_bytes();
            if path.send_any(&m) {
                sent.insert(m);
            }
        }
        // The adversary replays and forges from what it overheard.
        let overheard: Vec<(NodeId, NodeId, Vec<u8>)> = {
            let t = tap.borrow();
            let n = t.len();
            (0..3.min(n))
                .map(|_| {
                    let (f, to, b, _) = &t[(pick.next_u32() as usize) % n];
                    (*f, *to, b.clone())
                })
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
    if let Some((rule, _)) = cut {
        path.sim.remove_rule(rule);
    }
    path.run_keeping_open(mode, Duration::from_secs(5))?;
    // After a restart the pair is new: wait (at most 10 s) for A's association to open.
    let b_addr = path.addr(path.b);
    let a = path.a;
    let open = |path: &Path| {
        path.sim
            .node(a)
            .endpoint()
            .is_some_and(|e| !e.open_associations(b_addr).is_empty())
    };
    let waited = path.now();
    while !open(&path) && path.now() < waited + Duration::from_secs(10) {
        path.run_keeping_open(mode, Duration::from_millis(50))?;
    }

    // After the faults: everything sent now arrives.
    let after: Vec<Vec<u8>> = (0..40)
        .map(|i| format!("after-{seed}-{i}").into_bytes())
        .collect();
    for m in &after {
        let ok = path.send_any(m);
        path.sim
            .check(ok, format!("{context}: send after faults\n{}", dump(&path)))?;
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
        .filter(|(from, _, _, _)| *from == path.a || *from == path.b)
        .map(|(_, _, b, _)| b.clone())
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
    let mut forwarded_s2: HashMap<(NodeId, u32, Vec<u8>), u32> = HashMap::new();
    for (from, _, bytes, epoch) in tap.borrow().iter() {
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
                *forwarded_s2
                    .entry((*from, *epoch, bytes.clone()))
                    .or_default() += 1;
            }
        }
    }
    // The simulator may duplicate a datagram on the wire after the relay sent it once; a
    // relay itself sends each S2 at most once (between restarts: a restarted relay
    // remembers nothing, and a replayed old handshake can teach it an old pair again; what
    // it passes on then dies at the endpoint, which checks its own chains).
    for ((relay, _, _), n) in forwarded_s2 {
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
    // A restart replaces the pair (and its chains); the last one may be too short-lived to
    // reach its renewal.
    let replaced = [path.a, path.b].iter().any(|&x| {
        path.sim
            .events_of(x)
            .any(|(_, e)| matches!(e, HopEvent::Endpoint(EndpointEvent::Disconnected { .. })))
    });
    if chain_rounds == 8 && !replaced && restart_at.is_none() {
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

/// A SYN of an earlier handshake, replayed while its cookie is still fresh, cannot replace
/// the pair that followed it: the restarted sender's new pair stays, and traffic flows.
#[test]
fn a_replayed_old_syn_does_not_replace_a_newer_pair() {
    let mut path = Path::new(11, 1, |_| {});
    let (tap, _) = wiretap(&mut path);
    path.connect().expect("connect");
    let (a, b) = (path.a, path.b);
    let old_syn = tap
        .borrow()
        .iter()
        .find(|(from, to, bytes, _)| *from == path.relays[0] && *to == b && bytes[1] == kind::SYN)
        .map(|(_, _, bytes, _)| bytes.clone())
        .expect("a SYN reached B");
    path.sim.run_for(Duration::from_millis(500)).expect("run");
    // A restarts and connects again: B replaces the pair (the cookie is newer than it).
    path.restart(a);
    let (a_addr, b_addr) = (path.addr(a), path.addr(b));
    path.sim
        .run_until_cond(Duration::from_secs(5), |s| {
            s.node(a).endpoint().is_some_and(|e| e.is_connected(b_addr))
                && s.node(b).endpoint().is_some_and(|e| e.is_connected(a_addr))
        })
        .expect("reconnected");
    let pair_at_b = |path: &Path| path.sim.node(b).endpoint().expect("B").status().peers[0].pair_id;
    let new_pair = pair_at_b(&path);
    let stale = path.sim.node(b).endpoint().expect("B").counters().stale;
    // The old SYN (its cookie about 1 s old, within the 10 s lifetime) comes back.
    let relay = path.addr(path.relays[0]);
    path.sim.inject(relay, b, old_syn, Duration::from_millis(1));
    path.sim.run_for(Duration::from_millis(200)).expect("run");
    assert_eq!(
        pair_at_b(&path),
        new_pair,
        "the old SYN replaced the new pair"
    );
    assert_eq!(
        path.sim.node(b).endpoint().expect("B").counters().stale,
        stale + 1,
        "the old SYN was not refused as stale"
    );
    let assoc = path.open(Mode::N).expect("open on the new pair");
    assert!(path.send(assoc, b"after the replay"));
    path.sim.run_for(Duration::from_secs(1)).expect("run");
    assert_eq!(path.received_at_b(), vec![b"after the replay".to_vec()]);
}

/// A relay forgets a pair idle for `pair_idle` (counted `expired`); when A sends again, it
/// finds the pair dead, handshakes again (the relay learns the new pair) and the message
/// gets through.
#[test]
fn a_relay_forgets_an_idle_pair_and_the_endpoints_come_back() {
    let mode = Mode::N;
    let mut path = Path::new(5, 1, |_| {});
    path.connect().expect("connect");
    path.open(mode).expect("open");
    assert!(path.send_any(b"before"));
    path.sim.run_for(Duration::from_secs(1)).expect("run");
    let r = path.relays[0];
    let pairs = |path: &Path| {
        path.sim
            .node(r)
            .relay()
            .expect("relay")
            .status()
            .pairs
            .len()
    };
    assert_eq!(pairs(&path), 1);
    // Idle for longer than pair_idle (120 s) and one sweep (30 s).
    path.sim.run_for(Duration::from_secs(160)).expect("run");
    assert_eq!(pairs(&path), 0, "the idle pair is still there");
    assert_eq!(
        path.sim.node(r).relay().expect("relay").counters().expired,
        1
    );
    assert!(path.send_any(b"after"));
    path.run_keeping_open(mode, Duration::from_secs(8))
        .expect("run");
    assert!(path.send_any(b"on the new pair"));
    path.run_keeping_open(mode, Duration::from_secs(2))
        .expect("run");
    let got = path.received_at_b();
    assert!(got.contains(&b"on the new pair".to_vec()), "{got:?}");
    assert_eq!(pairs(&path), 1, "the relay did not learn the new pair");
    // "after" went to the old pair, which no hop knew any more: lost, and said so.
    assert!(path
        .sim
        .events_of(path.a)
        .any(|(_, e)| matches!(e, HopEvent::Endpoint(EndpointEvent::Disconnected { .. }))));
}

/// A forged Challenge (the real one's cookie changed) that reaches the initiator first does
/// not stall the handshake: its SYN is refused, but the SYN resend brings a Hello, the real
/// Challenge that answers it replaces the cookie, and the pair connects.
#[test]
fn a_forged_challenge_does_not_stall_the_handshake() {
    let mut path = Path::new(21, 1, |_| {});
    let a = path.a;
    let first: Rc<RefCell<Option<Vec<u8>>>> = Rc::default();
    let f = first.clone();
    // The first real Challenge toward A is kept from it (and kept for the forger).
    let rule = path.sim.add_rule(FnRule::new(
        "hold the first challenge",
        move |p: &PacketView<'_>, _rng: &mut dyn RngCore| {
            if p.to == a && p.bytes.get(1) == Some(&kind::CHALLENGE) && f.borrow().is_none() {
                *f.borrow_mut() = Some(p.bytes.to_vec());
                return Verdict::Drop;
            }
            Verdict::Pass
        },
    ));
    let b_addr = path.addr(path.b);
    let via = path.addr(path.relays[0]);
    path.sim.with_node(a, |n, now| {
        n.endpoint_mut().expect("A").connect(now, b_addr, Some(via))
    });
    path.sim.run_for(Duration::from_millis(30)).expect("run");
    let mut forged = first.borrow().clone().expect("a challenge was sent");
    let last = forged.len() - 1;
    forged[last] ^= 0x01; // the cookie's last byte
    path.sim.inject(via, a, forged, Duration::from_millis(1));
    path.sim.run_for(Duration::from_millis(100)).expect("run");
    path.sim.remove_rule(rule);
    let a_addr = path.addr(a);
    let b = path.b;
    path.sim
        .run_until_cond(Duration::from_secs(3), |s| {
            s.node(a).endpoint().is_some_and(|e| e.is_connected(b_addr))
                && s.node(b).endpoint().is_some_and(|e| e.is_connected(a_addr))
        })
        .expect("connected despite the forged challenge");
    assert!(
        path.sim
            .node(b)
            .endpoint()
            .expect("B")
            .counters()
            .bad_cookie
            >= 1
    );
}
