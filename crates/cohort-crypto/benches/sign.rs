//! Ed25519 signing with the key parsed once (`SignatureScheme::signing_key`, then
//! `sign_with_key`: what cohort-channel's `Identity::sign` does) against signing from the
//! seed (`sign`: what it did before, deriving the key pair for every signature), in the
//! same run. Rounds alternate the two; each round times `SIGNS` signatures of a 100-byte
//! message by the thread's CPU time (`/proc/thread-self/schedstat`), so other processes on
//! a shared machine weigh less than in wall time. Prints every round's ratio, then the
//! median and the spread.
//!
//! Run: `cargo bench -p cohort-crypto --bench sign`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)] // reason: a panic aborts the bench

use cohort_crypto::{CryptoProvider, Secret};
use std::hint::black_box;

const SIGNS: usize = 2_000;
const ROUNDS: usize = 12;

/// Nanoseconds this thread has run on a CPU.
fn thread_cpu_ns() -> u64 {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    text.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("schedstat's first field")
}

fn timed(mut f: impl FnMut()) -> f64 {
    let start = thread_cpu_ns();
    for _ in 0..SIGNS {
        f();
    }
    (thread_cpu_ns() - start) as f64 / SIGNS as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // `cargo test --benches` runs bench binaries with `--bench` absent: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let p = CryptoProvider::default_provider();
    let secret = Secret::new(vec![0x42; 32]);
    let key = p.ed25519.signing_key(&secret).unwrap();
    let message = [0x5a_u8; 100];
    assert_eq!(
        p.ed25519.sign_with_key(key.as_ref(), &secret, &message),
        p.ed25519.sign(&secret, &message)
    );
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("cpu: {cpu}; load average at start: {}", load.trim());
    println!("round  from seed (ns/sign)  kept key (ns/sign)  ratio");
    let (mut seed, mut kept, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let mut from_seed = || {
            black_box(p.ed25519.sign(&secret, black_box(&message)).unwrap());
        };
        let mut with_key = || {
            black_box(
                p.ed25519
                    .sign_with_key(key.as_ref(), &secret, black_box(&message))
                    .unwrap(),
            );
        };
        // Alternate which goes first, so a load change favours neither.
        let (s, k) = if round % 2 == 0 {
            let s = timed(&mut from_seed);
            (s, timed(&mut with_key))
        } else {
            let k = timed(&mut with_key);
            (timed(&mut from_seed), k)
        };
        println!("{round:5}  {s:19.0}  {k:18.0}  {:5.2}", s / k);
        seed.push(s);
        kept.push(k);
        ratios.push(s / k);
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let (lo, hi) = ratios
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
    println!(
        "median: from seed {:.0} ns, kept key {:.0} ns, ratio {:.2} (rounds {lo:.2} to {hi:.2}); load average at end: {}",
        median(&mut seed),
        median(&mut kept),
        median(&mut ratios),
        load.trim()
    );
}
