//! What each way of storing a hash chain costs its owner: memory against hashes per disclosed
//! element, measured by generating a chain and disclosing all of it.
//!
//! ```sh
//! cargo run --release -p cohort-hop --example chain_storage
//! ```
//!
//! For chains of 2^10, 2^14, 2^17 and 2^20 elements and each strategy (full storage,
//! checkpoints every ≈√n and every 64 elements, logarithmic pebbling) it prints the time to
//! generate the chain, the most elements held at any time (and their bytes, 16 per element,
//! without the anchor or bookkeeping), the average and largest number of hashes spent on one
//! disclosed element, and the wall-clock time per disclosed element over the whole chain.
// A benchmark, not a protocol core: it reads the clock.
#![allow(clippy::disallowed_methods)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use cohort_crypto::CryptoProvider;
use cohort_hop::chain::{ChainStorage, HashChain};
use cohort_hop::crypto::ELEMENT_LEN;

/// What one chain cost.
struct Measured {
    generation: Duration,
    peak_elements: usize,
    hashes: u64,
    max_hashes: u64,
    disclosure: Duration,
}

fn measure(provider: &CryptoProvider, n: u32, storage: ChainStorage) -> Measured {
    let start = Instant::now();
    let mut chain = HashChain::generate(provider, *b"bench-id", [7; ELEMENT_LEN], n, storage);
    let generation = start.elapsed();
    let mut max_hashes = 0;
    let mut before = 0;
    let start = Instant::now();
    while let Some(disclosed) = chain.next(provider) {
        black_box(disclosed);
        let hashes = chain.hashes();
        max_hashes = max_hashes.max(hashes - before);
        before = hashes;
    }
    let disclosure = start.elapsed();
    Measured {
        generation,
        peak_elements: chain.peak_stored_elements(),
        hashes: chain.hashes(),
        max_hashes,
        disclosure,
    }
}

fn main() {
    let provider = CryptoProvider::default_provider();
    println!(concat!(
        "| n | storage | generation (ms) | peak elements | peak bytes ",
        "| hashes/element (avg) | hashes/element (max) | ns/element |"
    ));
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for log2_n in [10, 14, 17, 20] {
        let n = 1u32 << log2_n;
        // Rounded √n; exact for even powers of two.
        let root = f64::from(n).sqrt().round() as u32;
        let strategies = [
            ChainStorage::Full,
            ChainStorage::Checkpoint { interval: root },
            ChainStorage::Checkpoint { interval: 64 },
            ChainStorage::Logarithmic,
        ];
        for storage in strategies {
            let m = measure(&provider, n, storage);
            println!(
                "| 2^{log2_n} | {} | {:.2} | {} | {} | {:.3} | {} | {:.0} |",
                storage.name(),
                m.generation.as_secs_f64() * 1e3,
                m.peak_elements,
                m.peak_elements * ELEMENT_LEN,
                m.hashes as f64 / f64::from(n),
                m.max_hashes,
                m.disclosure.as_secs_f64() * 1e9 / f64::from(n),
            );
        }
    }
}
