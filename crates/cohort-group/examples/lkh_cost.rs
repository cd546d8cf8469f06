//! What one LKH batch costs the coordinator's tree (`cohort_group::lkh::Tree`), outside any
//! group: for each n, a tree of n members (degree 4 unless `--degree D`), then one leave
//! and one join, each timed over `--runs` batches (median), with its wraps and bytes.
//! The group around it (the Install's other fields, sealing, sending) is not counted: the
//! simulator benchmarks measure that.
//!
//! `cargo run --release -p cohort-group --example lkh_cost -- [--degree 4] [--runs 50] [n ...]`

use cohort_crypto::{CryptoProvider, Secret};
use cohort_group::id::{MemberId, ViewId};
use cohort_group::lkh::{Tree, WrapContext};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use std::time::Instant;

fn id(i: u32) -> MemberId {
    let mut b = [0u8; 32];
    b[..4].copy_from_slice(&i.to_be_bytes());
    MemberId::from_bytes(b)
}

/// The real clock: this example times the tree outside any protocol core.
#[allow(clippy::disallowed_methods)]
fn wall_now() -> Instant {
    Instant::now()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut degree = 4usize;
    let mut runs = 50usize;
    let mut sizes = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--degree" => {
                degree = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--degree D")
            }
            "--runs" => runs = args.next().and_then(|v| v.parse().ok()).expect("--runs R"),
            n => sizes.push(n.parse::<u32>().expect("a member count")),
        }
    }
    if sizes.is_empty() {
        sizes = vec![1_000, 10_000];
    }
    let p = CryptoProvider::default_provider();
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    for n in sizes {
        let mut tree = Tree::new(degree);
        let mut members: Vec<MemberId> = (0..n).map(id).collect();
        let mut epoch = 1u64;
        let mut root = Secret::zeroed(32);
        let ctx = |epoch| WrapContext {
            group: "g",
            view: ViewId {
                seq: epoch,
                coordinator: id(0),
            },
            epoch,
            bind: &[],
        };
        let t = wall_now();
        tree.reseed(&p, &mut rng, &ctx(epoch), &members, &root)
            .expect("reseed");
        let reseed_ms = t.elapsed().as_secs_f64() * 1e3;
        let (mut leave_ms, mut join_ms) = (Vec::new(), Vec::new());
        let (mut leave, mut join) = ((0, 0), (0, 0));
        for (next, r) in (n..).zip(0..runs) {
            // One leave (a member in the middle), then one join (who takes its slot).
            members.remove((n as usize / 2 + r) % members.len());
            epoch += 1;
            rng.fill_bytes(root.expose_mut());
            let t = wall_now();
            let b = tree
                .batch(&p, &mut rng, &ctx(epoch), &members, &root)
                .expect("leave");
            leave_ms.push(t.elapsed().as_secs_f64() * 1e3);
            leave = (b.delivery.wraps.len(), b.delivery.wire_len().0);
            members.push(id(next));
            epoch += 1;
            rng.fill_bytes(root.expose_mut());
            let t = wall_now();
            let b = tree
                .batch(&p, &mut rng, &ctx(epoch), &members, &root)
                .expect("join");
            join_ms.push(t.elapsed().as_secs_f64() * 1e3);
            join = (b.delivery.wraps.len(), b.delivery.wire_len().0);
        }
        println!(
            "n {n} degree {degree} depth {}: reseed {reseed_ms:.2} ms (tree only, no sealing); \
             one leave {} wraps {} B, median {:.3} ms; one join {} wraps {} B (+ its sealed \
             path), median {:.3} ms ({runs} runs)",
            tree.depth(),
            leave.0,
            leave.1,
            median(leave_ms),
            join.0,
            join.1,
            median(join_ms),
        );
    }
}
