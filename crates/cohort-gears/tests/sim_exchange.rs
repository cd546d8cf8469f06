//! A gear-protected exchange between two `GearLink`s in the simulator, under every fault rule
//! and an adversary that forges, replays and tampers, for many seeds. Checkers read the
//! event log; a failure prints its seed (`COHORT_SIM_SEED=<seed>` replays it,
//! `COHORT_SIM_SEEDS=<n>` runs more).
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

use cohort_core::Timestamp;
use cohort_crypto::CryptoProvider;
use cohort_gears::link::{GearLink, LinkConfig, LinkEvent, Role};
use cohort_gears::{GearId, GearKeys, GearSet, Protector};
use cohort_sim::{
    sweep, DelayRule, DuplicateRule, FnRule, Loss, NodeId, ReorderRule, Sim, SimConfig, SimFailure,
    TamperRule, Verdict,
};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

const A: NodeId = NodeId::from_index(0);
const B: NodeId = NodeId::from_index(1);

#[derive(Clone, Copy, Debug)]
enum Fault {
    None,
    Loss,
    Delay,
    Duplicate,
    Reorder,
    Tamper,
    Partition,
    Everything,
}

const FAULTS: [Fault; 8] = [
    Fault::None,
    Fault::Loss,
    Fault::Delay,
    Fault::Duplicate,
    Fault::Reorder,
    Fault::Tamper,
    Fault::Partition,
    Fault::Everything,
];

fn gear_sets() -> Vec<(GearSet, f64)> {
    let set = |g: &[GearId]| g.iter().copied().collect::<GearSet>();
    vec![
        (
            set(&[GearId::HmacSha256, GearId::Umac64, GearId::Umac32]),
            30.0,
        ),
        (set(&[GearId::Aes128Gcm, GearId::ChaCha20Poly1305]), 90.0),
        (
            set(&[
                GearId::Blake3_128,
                GearId::GmacAes128,
                GearId::IfgExperimental,
            ]),
            30.0,
        ),
        (
            set(&[GearId::Umac128, GearId::Umac96, GearId::Aes256Gcm]),
            90.0,
        ),
    ]
}

fn run(seed: u64) -> Result<(), SimFailure> {
    let fault = FAULTS[(seed % FAULTS.len() as u64) as usize];
    let sets = gear_sets();
    let (gears, floor) = sets[(seed / FAULTS.len() as u64 % sets.len() as u64) as usize];
    let provider = CryptoProvider::default_provider();
    let secret = [seed as u8 ^ 0x5c; 32];
    let mut config = LinkConfig::new(floor, gears);
    config.companion_strong_tag = true;
    config.controller.dwell = Duration::from_millis(200);

    let mut sim_config = SimConfig::with_seed(seed);
    sim_config.latency = Duration::from_millis(3);
    sim_config.jitter = Duration::from_millis(2);
    let mut sim = Sim::new(sim_config);
    for (role, peer) in [(Role::Initiator, B), (Role::Responder, A)] {
        let link = GearLink::new(
            &provider,
            &secret,
            role,
            peer.addr(),
            config.clone(),
            Timestamp::ZERO,
        )
        .map_err(|e| sim.failure(format!("link: {e}")))?;
        sim.add_node(link);
    }
    match fault {
        Fault::None => {}
        Fault::Loss => {
            let _ = sim.add_rule(Loss(0.2));
        }
        Fault::Delay => {
            let _ = sim.add_rule(DelayRule(0.3, Duration::ZERO..Duration::from_millis(80)));
        }
        Fault::Duplicate => {
            let _ = sim.add_rule(DuplicateRule(0.3));
        }
        Fault::Reorder => {
            let _ = sim.add_rule(ReorderRule(0.3));
        }
        Fault::Tamper => {
            let _ = sim.add_rule(TamperRule(0.3));
        }
        Fault::Partition => {} // cut and healed during the run, below
        Fault::Everything => {
            sim.add_rule(Loss(0.05));
            sim.add_rule(TamperRule(0.1));
            sim.add_rule(DuplicateRule(0.1));
            sim.add_rule(ReorderRule(0.1));
            sim.add_rule(DelayRule(0.1, Duration::ZERO..Duration::from_millis(50)));
        }
    }
    // The adversary records every datagram on the wire, to replay later.
    let recorded: Rc<RefCell<Vec<Vec<u8>>>> = Rc::default();
    let tap = recorded.clone();
    sim.add_rule(FnRule::new("tap", move |p, _| {
        tap.borrow_mut().push(p.bytes.to_vec());
        Verdict::Pass
    }));

    let mut sent: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut forged = 0u64;
    for round in 0..150u64 {
        let payload = format!("seed {seed} message {round}").into_bytes();
        let load = if (40..90).contains(&round) { 0.95 } else { 0.2 };
        if let Fault::Partition = fault {
            match round {
                60 => sim.partition(&[&[A], &[B]]),
                90 => sim.heal(),
                _ => {}
            }
        }
        let seq = sim.with_node(A, |m, _| {
            m.set_local_load(load);
            m.send(&payload)
        });
        let seq = seq.map_err(|e| sim.failure(format!("send: {e}")))?;
        sent.insert(seq, payload);
        if round % 25 == 10 {
            // Forgeries under every agreed gear, with a guessed key and fresh numbers.
            let keys = GearKeys::derive(&provider, &[0xee; 32], gears).expect("keys");
            let mut forger = Protector::new(keys);
            for (i, g) in gears.iter().enumerate() {
                let mut p = Vec::new();
                forger
                    .protect_with_seq(5_000 + round * 10 + i as u64, &[g], &[1], b"forged", &mut p)
                    .expect("forge");
                sim.inject(A.addr(), B, p, Duration::from_millis(1));
                forged += 1;
            }
            // Replays of everything recorded so far.
            for old in recorded.borrow().iter().take(20) {
                sim.inject(A.addr(), B, old.clone(), Duration::from_millis(2));
            }
        }
        sim.run_for(Duration::from_millis(10))?;
    }
    sim.run_for(Duration::from_millis(500))?;

    // Checkers over the event log.
    let mut delivered: BTreeMap<u64, usize> = BTreeMap::new();
    for (_, node, event) in sim.events() {
        if node != B {
            continue;
        }
        if let LinkEvent::Delivered {
            seq,
            payload,
            verified_by,
            ..
        } = event
        {
            sim.check(
                sent.get(seq) == Some(payload),
                format!("bob accepted seq {seq} with a payload alice never sent: {payload:?}"),
            )?;
            sim.check(
                verified_by.info().forgery_bits >= floor,
                format!("bob verified {verified_by}, below the floor {floor}"),
            )?;
            *delivered.entry(*seq).or_default() += 1;
        }
    }
    // The sender side: bob's reports reach alice, and they carry the forgeries he refused.
    let reported = sim.events_of(A).filter_map(|(_, e)| match e {
        LinkEvent::Feedback { auth_failures, .. } => Some(*auth_failures),
        _ => None,
    });
    let max_reported = reported.max();
    sim.check(
        max_reported.is_some_and(|n| n > 0),
        format!("alice never heard of bob's failed verifications (reports: {max_reported:?})"),
    )?;
    for (seq, n) in &delivered {
        sim.check(*n == 1, format!("seq {seq} delivered {n} times"))?;
    }
    let counters = *sim.node(B).counters();
    // Every forgery is refused: by its tag, or (on a link that requires privacy) because a
    // clear packet is not acceptable at all.
    sim.check(
        counters.auth_failed + counters.no_acceptable_tag >= forged,
        format!(
            "{forged} forgeries but only {} auth failures and {} unacceptable",
            counters.auth_failed, counters.no_acceptable_tag
        ),
    )?;
    sim.check(
        counters.replayed + counters.too_old > 0,
        "replays were not counted",
    )?;
    match fault {
        Fault::None | Fault::Delay | Fault::Duplicate | Fault::Reorder => sim.check(
            delivered.len() == sent.len(),
            format!("{fault:?}: {} of {} delivered", delivered.len(), sent.len()),
        )?,
        Fault::Partition => {
            // Nothing sent across the cut arrives; everything sent after the heal does.
            let cut = sent
                .keys()
                .copied()
                .filter(|s| !delivered.contains_key(s))
                .count();
            sim.check(
                (25..=35).contains(&cut),
                format!("partition: {cut} messages lost, expected those of rounds 60 to 89"),
            )?;
            let last = *sent.keys().next_back().expect("sent");
            sim.check(delivered.contains_key(&last), "no delivery after the heal")?;
        }
        Fault::Loss | Fault::Tamper | Fault::Everything => sim.check(
            !delivered.is_empty() && delivered.len() < sent.len(),
            format!("{fault:?}: {} of {} delivered", delivered.len(), sent.len()),
        )?,
    }
    Ok(())
}

#[test]
fn protected_exchange_under_every_fault_rule() {
    sweep(1000, run);
}

#[test]
fn same_seed_same_story() {
    fn story(seed: u64) -> Vec<String> {
        let provider = CryptoProvider::default_provider();
        let gears: GearSet = [GearId::Umac64, GearId::HmacSha256].into_iter().collect();
        let config = LinkConfig::new(50.0, gears);
        let mut sim = Sim::new(SimConfig::with_seed(seed));
        for (role, peer) in [(Role::Initiator, B), (Role::Responder, A)] {
            sim.add_node(
                GearLink::new(
                    &provider,
                    &[1; 32],
                    role,
                    peer.addr(),
                    config.clone(),
                    Timestamp::ZERO,
                )
                .unwrap(),
            );
        }
        sim.add_rule(Loss(0.3));
        sim.add_rule(TamperRule(0.2));
        for i in 0..50u32 {
            sim.with_node(A, |m, _| m.send(&i.to_be_bytes())).unwrap();
            sim.run_for(Duration::from_millis(7)).unwrap();
        }
        sim.log().iter().map(|e| format!("{e:?}")).collect()
    }
    assert_eq!(story(7), story(7));
    assert_ne!(story(7), story(8));
}
