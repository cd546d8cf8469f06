//! The hop fuzz targets' corpus (`fuzz/corpus/<target>`): every input replayed through the
//! harness its target calls, and the seeds, built from the datagrams a real A - R - B pair
//! exchanges (`cohort_hop::fuzzing::captured`: handshakes, S1, A1 and S2 in every mode, A2,
//! signed renewals), written when `COHORT_WRITE_CORPUS=1` (`scripts/fuzz-corpus.sh`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

use cohort_hop::fuzzing::{
    captured, endpoint, join_datagrams, mutate_input, mutate_real, packet, relay, EndpointControl,
    MutantSpec, Mutation,
};

/// A control byte, then each real datagram alone (the first 24), and the first 16 at once.
fn each_and_all(name: &str, control: u8) -> Vec<(String, Vec<u8>)> {
    let real: Vec<&[u8]> = captured().iter().map(|(_, d)| d.as_slice()).collect();
    let mut out = cohort_sim::corpus::numbered(
        name,
        real.iter().take(24).map(|d| {
            let mut input = vec![control];
            input.extend(join_datagrams([*d]));
            input
        }),
    );
    let mut all = vec![control];
    all.extend(join_datagrams(real.iter().take(16).copied()));
    out.push((format!("{name}-all"), all));
    out
}

fn corpus_seeds() -> Vec<(&'static str, cohort_sim::corpus::Seeds)> {
    let real = captured();
    assert!(real.len() >= 8, "captured {} datagrams", real.len());
    let mut endpoints = Vec::new();
    for byte in 0..8u8 {
        let c = EndpointControl::from_byte(byte);
        endpoints.extend(each_and_all(&format!("c{}", c.byte()), c.byte()));
    }
    let mut relays = each_and_all("plain", 0);
    relays.extend(each_and_all("reports", 1));
    let mut mutants = Vec::new();
    for live in [false, true] {
        mutants.push((format!("live{live}-untouched"), mutate_input(live, &[])));
        for pick in 0..real.len().min(32) as u8 {
            let spec = MutantSpec {
                pick,
                mutations: vec![Mutation::FlipBit(pick.into(), pick)],
            };
            mutants.push((
                format!("live{live}-flip{pick:02}"),
                mutate_input(live, &[spec]),
            ));
        }
    }
    vec![
        (
            "hop_packet",
            cohort_sim::corpus::numbered("captured", real.iter().map(|(_, d)| d.clone())),
        ),
        ("hop_endpoint", endpoints),
        ("hop_relay", relays),
        ("hop_mutate", mutants),
    ]
}

/// The harness each hop fuzz target calls (`fuzz/fuzz_targets/<target>.rs`).
fn corpus_harness(target: &str) -> fn(&[u8]) {
    match target {
        "hop_packet" => |d| {
            let _ = packet(d);
        },
        "hop_endpoint" => |d| {
            let _ = endpoint(d);
        },
        "hop_relay" => |d| {
            let _ = relay(d);
        },
        "hop_mutate" => |d| {
            let _ = mutate_real(d);
        },
        other => panic!("not a hop fuzz target: {other}"),
    }
}

/// Every input in the corpus runs through its harness as the fuzzer ran it, and real
/// datagrams parse. With `COHORT_WRITE_CORPUS=1` the seeds are written first.
#[test]
fn fuzz_corpus_replays() {
    for (_, d) in captured() {
        assert!(packet(d).0, "a captured datagram does not parse");
    }
    for (target, seeds) in corpus_seeds() {
        cohort_sim::corpus::check(target, corpus_harness(target), &seeds);
    }
}
