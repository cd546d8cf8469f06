#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report
//! The channel over datagrams in the deterministic simulator: the same connection core the
//! TCP driver runs, under loss, delay, duplication, reordering and tampering, for many seeds.
//! A failure prints its seed (`COHORT_SIM_SEED=<seed>` replays it, `COHORT_SIM_SEEDS=<n>` runs
//! more).

use cohort_channel::batch::{BatchConfig, BatchSigner};
use cohort_channel::datagram::{DatagramChannel, DatagramEvent};
use cohort_channel::identity::Identity;
use cohort_channel::{AuthMode, Client, ClientAuth, ClientConfig, Server, ServerConfig};
use cohort_core::Timestamp;
use cohort_crypto::Secret;
use cohort_sim::{sweep, NodeId, Sim, SimConfig, SimFailure, StandardFaults};
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

impl Fault {
    /// This test's rates for the fault, as a standard mix: one rule each, added in the mix's
    /// order (loss, duplicate, reorder, delay, tamper).
    fn rules(self) -> StandardFaults {
        let none = StandardFaults::none();
        match self {
            Fault::None => none,
            Fault::Loss => StandardFaults { loss: 0.3, ..none },
            Fault::Delay => StandardFaults {
                delay: 0.3,
                delay_range: Duration::ZERO..Duration::from_millis(300),
                ..none
            },
            Fault::Duplicate => StandardFaults {
                duplicate: 0.4,
                ..none
            },
            Fault::Reorder => StandardFaults {
                reorder: 0.4,
                ..none
            },
            Fault::Tamper => StandardFaults {
                tamper: 0.05,
                ..none
            },
            Fault::Everything => StandardFaults {
                loss: 0.1,
                duplicate: 0.1,
                reorder: 0.1,
                delay: 0.1,
                delay_range: Duration::ZERO..Duration::from_millis(100),
                ..none
            },
        }
    }
}

fn run(seed: u64) -> Result<(), SimFailure> {
    let fault = FAULTS[(seed % FAULTS.len() as u64) as usize];
    // The authentication mode: none, a PSK, or a batch-signed server key.
    let mode = seed / FAULTS.len() as u64 % 3;
    // Key shares from a stream seeded by the run's seed, so that a seed replays exactly.
    cohort_crypto::seeded::seed_thread(seed);
    let provider = cohort_crypto::seeded::seeded_provider();
    let identity = Identity::from_secret(&provider, Secret::from_slice(&[9; 32])).unwrap();
    let mut server_config = ServerConfig::new();
    let client_auth = match mode {
        0 => ClientAuth::None,
        1 => {
            server_config.auth_modes = vec![AuthMode::Psk];
            server_config.psk = Some(Secret::from_slice(&[7; 32]));
            ClientAuth::Psk(Secret::from_slice(&[7; 32]))
        }
        _ => {
            server_config.auth_modes = vec![AuthMode::ServerSignature];
            server_config.identity = Some(identity.public());
            ClientAuth::ServerSignature {
                pinned: identity.public(),
            }
        }
    };
    let mut signer = BatchSigner::new(provider, identity, BatchConfig::default());
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
    let _faults = fault.rules().add_to(&mut sim);
    // 30 s of virtual time; the server's batch signer answers its requests as they come.
    let mut signed = 0;
    for _ in 0..3000 {
        sim.run_for(Duration::from_millis(10))?;
        let requests: Vec<_> = sim
            .events_of(B)
            .filter_map(|(_, e)| match e {
                DatagramEvent::BatchSignatureNeeded(sid) => Some(*sid),
                _ => None,
            })
            .skip(signed)
            .collect();
        for sid in requests {
            signed += 1;
            signer.add(sim.now(), sid.0);
            signer.flush();
            while let Some((_, proof)) = signer.poll_signed() {
                let proof = proof.unwrap();
                // The connection may have failed meanwhile (a tampered run); that is fine.
                let _ = sim.with_node(B, |m, _| m.handle_batch_proof(&proof));
            }
        }
    }

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
    // Seeds cycle through the 7 faults, then the 3 modes: 210 seeds cover every pair 10 times.
    sweep(210, run);
}
