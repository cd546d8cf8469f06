#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report
//! The channel over datagrams in the deterministic simulator: the same connection core the
//! TCP driver runs, under loss, delay, duplication, reordering and tampering, for many seeds.
//! A failure prints its seed (`COHORT_SIM_SEED=<seed>` replays it, `COHORT_SIM_SEEDS=<n>` runs
//! more).

use cohort_channel::datagram::{DatagramChannel, DatagramEvent};
use cohort_channel::{AuthMode, Client, ClientAuth, ClientConfig, Server, ServerConfig};
use cohort_core::Timestamp;
use cohort_crypto::{CryptoProvider, Secret};
use cohort_sim::{
    sweep, DelayRule, DuplicateRule, Loss, NodeId, ReorderRule, Sim, SimConfig, SimFailure,
    TamperRule,
};
use rand_core::SeedableRng;
use std::collections::BTreeMap;
use std::time::Duration;

const A: NodeId = NodeId::from_index(0);
const B: NodeId = NodeId::from_index(1);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    None,
    Loss,
    Delay,
    Duplicate,
    Reorder,
    Tamper,
    Everything,
}

const FAULTS: [Fault; 7] = [
    Fault::None,
    Fault::Loss,
    Fault::Delay,
    Fault::Duplicate,
    Fault::Reorder,
    Fault::Tamper,
    Fault::Everything,
];

fn run(seed: u64) -> Result<(), SimFailure> {
    let fault = FAULTS[(seed % FAULTS.len() as u64) as usize];
    let psk = seed / FAULTS.len() as u64 % 2 == 1;
    let provider = CryptoProvider::default_provider();
    let (client_auth, mut server_config) = if psk {
        let mut sc = ServerConfig::new();
        sc.auth_modes = vec![AuthMode::Psk];
        sc.psk = Some(Secret::from_slice(&[7; 32]));
        (ClientAuth::Psk(Secret::from_slice(&[7; 32])), sc)
    } else {
        (ClientAuth::None, ServerConfig::new())
    };
    server_config.resumption_capacity = 0;
    let client = Client::new(provider, ClientConfig::new(client_auth));
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let server = Server::with_seed(provider, server_config, seed_bytes);
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(seed);

    let mut sim_config = SimConfig::with_seed(seed);
    sim_config.latency = Duration::from_millis(5);
    sim_config.jitter = Duration::from_millis(2);
    let mut sim = Sim::new(sim_config);
    let alice = DatagramChannel::client(&client, Timestamp::ZERO, &mut rng, "bob", B.addr())
        .map_err(|e| sim.failure(format!("connect: {e}")))?;
    sim.add_node(alice);
    sim.add_node(DatagramChannel::server(&server, A.addr()));
    match fault {
        Fault::None => {}
        Fault::Loss => {
            sim.add_rule(Loss(0.3));
        }
        Fault::Delay => {
            sim.add_rule(DelayRule(0.3, Duration::ZERO..Duration::from_millis(300)));
        }
        Fault::Duplicate => {
            sim.add_rule(DuplicateRule(0.4));
        }
        Fault::Reorder => {
            sim.add_rule(ReorderRule(0.4));
        }
        Fault::Tamper => {
            sim.add_rule(TamperRule(0.05));
        }
        Fault::Everything => {
            sim.add_rule(Loss(0.1));
            sim.add_rule(DuplicateRule(0.1));
            sim.add_rule(ReorderRule(0.1));
            sim.add_rule(DelayRule(0.1, Duration::ZERO..Duration::from_millis(100)));
        }
    }
    sim.run_for(Duration::from_secs(30))?;

    let established = |sim: &Sim<DatagramChannel>, node| {
        sim.events_of(node).find_map(|(_, e)| match e {
            DatagramEvent::Established(info) => Some(info.session_id),
            _ => None,
        })
    };
    let failed = |sim: &Sim<DatagramChannel>, node| {
        sim.events_of(node)
            .any(|(_, e)| matches!(e, DatagramEvent::Failed(_) | DatagramEvent::TimedOut))
    };
    let (ida, idb) = (established(&sim, A), established(&sim, B));
    if fault == Fault::Tamper {
        // A tampered handshake may fail, but never connects the two ends to different
        // sessions, and never both succeeds and fails.
        if let (Some(a), Some(b)) = (ida, idb) {
            sim.check(a == b, format!("different session IDs {a} / {b}"))?;
        } else {
            sim.check(
                failed(&sim, A) || failed(&sim, B),
                "the handshake neither finished nor failed",
            )?;
            return Ok(());
        }
    } else {
        sim.check(
            ida.is_some() && ida == idb,
            format!("{fault:?}: handshake did not finish with one session ID: {ida:?} {idb:?}"),
        )?;
    }

    // Data both ways: every message arrives at most once and unaltered.
    let mut sent: [BTreeMap<Vec<u8>, usize>; 2] = Default::default();
    for round in 0..40u32 {
        for (i, node) in [A, B].into_iter().enumerate() {
            let payload = format!("seed {seed} from {i} round {round}").into_bytes();
            sim.with_node(node, |m, _| m.send(&payload))
                .map_err(|e| sim.failure(format!("send: {e}")))?;
            sent[i].insert(payload, 0);
        }
        sim.run_for(Duration::from_millis(20))?;
    }
    sim.run_for(Duration::from_secs(2))?;
    for (i, node) in [B, A].into_iter().enumerate() {
        for (_, e) in sim.events_of(node) {
            if let DatagramEvent::Data(payload) = e {
                let Some(count) = sent[i].get_mut(payload) else {
                    return Err(sim.failure(format!(
                        "{node:?} accepted a payload never sent: {payload:?}"
                    )));
                };
                *count += 1;
            }
        }
        let delivered = sent[i].values().filter(|&&n| n > 0).count();
        sim.check(
            sent[i].values().all(|&n| n <= 1),
            format!("{fault:?}: a payload was delivered twice"),
        )?;
        let all = matches!(
            fault,
            Fault::None | Fault::Delay | Fault::Duplicate | Fault::Reorder
        );
        sim.check(
            if all { delivered == 40 } else { delivered > 0 },
            format!("{fault:?}: {delivered} of 40 delivered to {node:?}"),
        )?;
    }
    Ok(())
}

#[test]
fn the_channel_over_datagrams_survives_every_fault_rule() {
    sweep(210, run);
}
