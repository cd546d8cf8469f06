//! A gears-only speed check: partial-64 (or other gears) against hmac-sha256, timed in one
//! process by the method of `cohort gears bench` (an iteration count for about a fifth of
//! the budget, then the best of five runs, a fresh sequence number per packet, a 16-byte
//! header), without building the whole `cohort` binary.
//!
//! ```sh
//! cargo run --release -p cohort-gears --example partial_bench -- [millis] [sizes] [gears]
//! cargo run --release -p cohort-gears --example partial_bench -- 200 65536,8192 partial-64
//! ```
//!
//! `PARTIAL_BENCH_ITERS=n` skips the calibration and times `n` tags per run.
//!
//! Prints, per gear and size, MB/s by wall time and by the thread's CPU time (from
//! `/proc/thread-self/schedstat`, Linux), and the ratio to hmac-sha256 by each.
#![allow(clippy::expect_used)] // reason: a bench; a failed setup should abort it
#![allow(clippy::disallowed_methods)] // reason: a bench owns its clock; the library takes none

use cohort_crypto::CryptoProvider;
use cohort_gears::{GearId, GearKey, GearKind, ALL_GEARS};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Bytes of each packet treated as header, as in `cohort gears bench`.
const HEADER: usize = 16;

/// Nanoseconds this thread has run on a CPU, if the kernel tells.
fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// (bytes per second by wall time, by thread CPU time) tagging `size`-byte packets.
fn measure(key: &GearKey, size: usize, budget: Duration) -> (f64, f64) {
    let mut data = vec![0xa5u8; size];
    let mut tag = vec![0u8; key.info().tag_len];
    let mut seq = 0u64;
    let mut once = |data: &mut Vec<u8>| {
        seq += 1;
        if key.info().kind == GearKind::Aead {
            let (aad, body) = data.split_at_mut(HEADER);
            let _ = black_box(key.seal(seq, aad, body));
        } else {
            let _ = key.tag(seq, black_box(data.as_slice()), HEADER, &mut tag);
            black_box(&tag);
        }
    };
    // PARTIAL_BENCH_ITERS fixes the count (for instruction counts under valgrind, where
    // the calibration below would pick different counts per build).
    let fixed: Option<u64> = std::env::var("PARTIAL_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok());
    let mut iters = fixed.unwrap_or(1);
    while fixed.is_none() {
        let start = Instant::now();
        for _ in 0..iters {
            once(&mut data);
        }
        if start.elapsed() >= budget / 5 || iters >= 1 << 30 {
            break;
        }
        iters *= 2;
    }
    let mut best_wall = Duration::MAX;
    let mut best_cpu = u64::MAX;
    for _ in 0..5 {
        let cpu0 = thread_cpu_ns();
        let start = Instant::now();
        for _ in 0..iters {
            once(&mut data);
        }
        best_wall = best_wall.min(start.elapsed());
        if let (Some(a), Some(b)) = (cpu0, thread_cpu_ns()) {
            best_cpu = best_cpu.min(b.saturating_sub(a));
        }
    }
    let bytes = size as f64 * iters as f64;
    let wall = bytes / best_wall.as_secs_f64().max(1e-12);
    let cpu = if best_cpu == u64::MAX {
        f64::NAN
    } else {
        bytes / (best_cpu.max(1) as f64 * 1e-9)
    };
    (wall, cpu)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let millis: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    let sizes: Vec<usize> = args
        .next()
        .map(|a| a.split(',').filter_map(|s| s.parse().ok()).collect())
        .unwrap_or_else(|| vec![65_536]);
    let names = args.next().unwrap_or_else(|| "partial-64".into());
    let gears: Vec<GearId> = names
        .split(',')
        .map(|n| {
            ALL_GEARS
                .iter()
                .find(|g| g.name == n)
                .map(|g| g.id)
                .expect("unknown gear name")
        })
        .collect();
    let provider = CryptoProvider::default_provider();
    let budget = Duration::from_millis(millis);
    for &size in &sizes {
        let base_key = GearKey::derive(&provider, &[0x42; 32], GearId::HmacSha256).expect("key");
        let (base_wall, base_cpu) = measure(&base_key, size, budget);
        println!(
            "{:<14} {size:>6} B  wall {:>10.1} MB/s  cpu {:>10.1} MB/s",
            "hmac-sha256",
            base_wall / 1e6,
            base_cpu / 1e6
        );
        for &g in &gears {
            let key = GearKey::derive(&provider, &[0x42; 32], g).expect("key");
            let (wall, cpu) = measure(&key, size, budget);
            println!(
                "{:<14} {size:>6} B  wall {:>10.1} MB/s  cpu {:>10.1} MB/s  ratio wall {:>6.1}x  cpu {:>6.1}x",
                g.name(),
                wall / 1e6,
                cpu / 1e6,
                wall / base_wall,
                cpu / base_cpu
            );
        }
    }
}
