//! `cohort hop forge`: a test tool that plays an attacker on the path. It captures nothing:
//! it reads the live associations from an endpoint's control socket (`hop ctl --json`
//! data: peers, pair ids when the endpoint reports them, association ids and modes) and
//! sends, for each, packets with random chain elements, MACs and keys, each payload carrying
//! a marker string, plus exact duplicates of them (replays):
//!
//! * S1 with a random element (not on the chain) and random MACs;
//! * S2 with a random "disclosed" key (and a random Merkle path in mode M), payload = marker;
//! * A1 and A2 with random elements and secrets;
//! * PLAIN (unprotected) packets on protected flows, payload = marker;
//! * the same for random pair ids (a forger who does not even know the pair).
//!
//! With `--replay FILE` (one captured datagram per line, in hex), it first sends each
//! captured datagram again, unchanged (a replay), and takes the pair ids of the captured
//! data packets as pairs to forge for (an on-path attacker sees them: they travel in clear).
//!
//! A relay must drop every one (its `forged`, `unknown`, `unverifiable`, `stale`,
//! `replayed` or `malformed` counters grow) and the receiving endpoint must deliver none.

use crate::UsageError;
use clap::Args;
use cohort_hop::wire::{FlowHeader, Packet, PairId, FLOW_FROM_RESPONDER, PAIR_ID_LEN};
use rand_core::{OsRng, RngCore};
use serde_json::{json, Value};
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::time::Duration;

/// `cohort hop forge`.
#[derive(Args)]
pub struct ForgeArgs {
    /// Where to send the forgeries (a relay on the path, or an endpoint).
    #[arg(long)]
    to: SocketAddr,
    /// An endpoint's control socket to read live associations from.
    #[arg(long)]
    ctl: Option<PathBuf>,
    /// A pair id to attack (16 hex digits; repeatable), in addition to those from `--ctl`.
    #[arg(long = "pair-id")]
    pair_ids: Vec<String>,
    /// Rounds tried per flow and packet kind.
    #[arg(long, default_value_t = 20)]
    rounds: u32,
    /// Text every forged payload carries (to check that none is delivered).
    #[arg(long, default_value = "FORGED-BY-COHORT-HOP-FORGE")]
    marker: String,
    /// Datagrams captured on the path (hex, one per line): replayed unchanged, and their
    /// pair ids attacked.
    #[arg(long)]
    replay: Option<PathBuf>,
    /// Local address to send from (default: any, port chosen by the system).
    #[arg(long)]
    bind: Option<SocketAddr>,
}

/// Runs `cohort hop forge`; prints one JSON line: what was sent.
pub fn run(args: &ForgeArgs) -> Result<(), UsageError> {
    let mut pairs: Vec<PairId> = Vec::new();
    for text in &args.pair_ids {
        pairs.push(parse_pair_id(text).map_err(|e| UsageError(format!("--pair-id: {e}")))?);
    }
    // Flows to attack: (flow id without direction bit, mode code, batch).
    let mut flows: Vec<(u16, u8, u16)> = Vec::new();
    if let Some(path) = &args.ctl {
        let status = super::ctl::ask(path, &json!({"cmd": "status"}))?;
        if let Some(peers) = status.get("peers").and_then(Value::as_array) {
            for p in peers {
                if let Some(id) = p.get("pair_id").and_then(Value::as_str) {
                    let id = parse_pair_id(id)
                        .map_err(|e| UsageError(format!("the status's pair_id: {e}")))?;
                    if !pairs.contains(&id) {
                        pairs.push(id);
                    }
                }
            }
        }
        for a in status
            .get("associations")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(id) = a.get("assoc").and_then(Value::as_u64) else {
                continue;
            };
            let mode = a.get("mode").and_then(Value::as_str).unwrap_or("n");
            let (code, batch) = match mode.parse::<cohort_hop::Mode>() {
                Ok(m) => (m.code(), m.batch()),
                Err(_) => (cohort_hop::wire::mode_code::N, 1),
            };
            if let Ok(id) = u16::try_from(id) {
                if !flows.iter().any(|f| f.0 == id) {
                    flows.push((id, code, batch));
                }
            }
        }
    }
    let mut captured: Vec<Vec<u8>> = Vec::new();
    if let Some(path) = &args.replay {
        let text = std::fs::read_to_string(path)
            .map_err(|e| UsageError(format!("--replay {}: {e}", path.display())))?;
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let bytes = hex::decode(line.trim()).map_err(|e| {
                UsageError(format!(
                    "--replay {} line {}: not hex: {e}",
                    path.display(),
                    i + 1
                ))
            })?;
            if let Ok(packet) = Packet::parse(&bytes) {
                if let Some(h) = packet.flow_header() {
                    if !pairs.contains(&h.pair_id) {
                        pairs.push(h.pair_id);
                    }
                }
            }
            captured.push(bytes);
        }
    }
    let known_pairs = pairs.len();
    if flows.is_empty() {
        flows = vec![
            (0, cohort_hop::wire::mode_code::N, 1),
            (1, cohort_hop::wire::mode_code::N, 1),
        ];
    }
    // A forger who does not know the pair at all.
    for _ in 0..2 {
        let mut id = [0u8; PAIR_ID_LEN];
        OsRng.fill_bytes(&mut id);
        pairs.push(id);
    }

    let bind = args.bind.unwrap_or_else(|| {
        if args.to.is_ipv4() {
            SocketAddr::from(([0, 0, 0, 0], 0))
        } else {
            SocketAddr::from(([0u16; 8], 0))
        }
    });
    let socket =
        UdpSocket::bind(bind).map_err(|e| UsageError(format!("cannot bind {bind}: {e}")))?;
    let marker = args.marker.as_bytes();
    let mut sent = 0u64;
    let mut by_kind: std::collections::BTreeMap<&str, u64> = Default::default();
    let mut out = Vec::new();
    for bytes in &captured {
        if socket.send_to(bytes, args.to).is_ok() {
            sent += 1;
            *by_kind.entry("replay").or_default() += 1;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let mut send = |kind: &'static str, packet: &Packet<'_>, out: &mut Vec<u8>| {
        out.clear();
        packet.write(out);
        // Each forgery twice: the second copy is a replay of the first.
        for _ in 0..2 {
            if socket.send_to(out, args.to).is_ok() {
                sent += 1;
                *by_kind.entry(kind).or_default() += 1;
            }
        }
        // Pace a little so the relay's socket buffer never overflows: drops must be the
        // relay's decision, not the kernel's.
        std::thread::sleep(Duration::from_micros(200));
    };
    for pair in &pairs {
        for &(id, code, batch) in &flows {
            for dir in [0, FLOW_FROM_RESPONDER] {
                let flow = dir | id;
                for i in 0..args.rounds {
                    // Rounds near the start and random ones.
                    let round = if i % 2 == 0 {
                        i / 2
                    } else {
                        OsRng.next_u32() % 100_000
                    };
                    let header = FlowHeader {
                        pair_id: *pair,
                        flow,
                        round,
                    };
                    let macs = random(
                        16 * if code == cohort_hop::wire::mode_code::C {
                            usize::from(batch)
                        } else {
                            1
                        },
                    );
                    send(
                        "s1",
                        &Packet::S1 {
                            header,
                            mode: code,
                            element: random16(),
                            count: if code == cohort_hop::wire::mode_code::C {
                                batch
                            } else {
                                1
                            },
                            macs: &macs,
                        },
                        &mut out,
                    );
                    let depth = if code == cohort_hop::wire::mode_code::M {
                        usize::try_from(u16::BITS - batch.saturating_sub(1).leading_zeros())
                            .unwrap_or(0)
                    } else {
                        0
                    };
                    let path = random(16 * depth);
                    send(
                        "s2",
                        &Packet::S2 {
                            header,
                            index: 0,
                            key: random16(),
                            path: &path,
                            payload: marker,
                        },
                        &mut out,
                    );
                    send(
                        "a1",
                        &Packet::A1 {
                            header,
                            element: random16(),
                            report: None,
                        },
                        &mut out,
                    );
                    send(
                        "a2",
                        &Packet::A2 {
                            header,
                            element: random16(),
                            delivered: true,
                            secret: random16(),
                        },
                        &mut out,
                    );
                    send(
                        "plain",
                        &Packet::Plain {
                            header,
                            payload: marker,
                        },
                        &mut out,
                    );
                }
            }
        }
    }
    println!(
        "{}",
        json!({
            "event": "forged",
            "to": args.to.to_string(),
            "sent": sent,
            "kinds": by_kind,
            "known_pairs": known_pairs,
            "flows": flows.iter().map(|f| f.0).collect::<Vec<_>>(),
            "marker": args.marker,
        })
    );
    Ok(())
}

fn random16() -> [u8; 16] {
    let mut b = [0u8; 16];
    OsRng.fill_bytes(&mut b);
    b
}

fn random(len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    OsRng.fill_bytes(&mut b);
    b
}

fn parse_pair_id(text: &str) -> Result<PairId, String> {
    let bytes = hex::decode(text.trim()).map_err(|e| format!("{text:?} is not hex: {e}"))?;
    PairId::try_from(bytes.as_slice()).map_err(|_| format!("{text:?} is not {PAIR_ID_LEN} bytes"))
}
