//! Criterion benchmarks: every gear tagging (or sealing) packets of 64, 1500, 8192 and 65536
//! bytes. Ratios against hmac-sha256 from one process are printed by
//! `cohort gears bench --goals`; criterion reports the absolute numbers.
#![allow(missing_docs, clippy::expect_used)] // reason: criterion macros generate undocumented items; a panic aborts the bench

use cohort_crypto::CryptoProvider;
use cohort_gears::{GearKey, GearKind, ALL_GEARS};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use std::time::Duration;

const HEADER: usize = 16;

fn gears(c: &mut Criterion) {
    let provider = CryptoProvider::default_provider();
    for size in [64usize, 1500, 8192, 65536 - 64] {
        let mut group = c.benchmark_group(format!("tag/{size}"));
        group.throughput(Throughput::Bytes(size as u64));
        group.warm_up_time(Duration::from_millis(300));
        group.measurement_time(Duration::from_millis(800));
        group.sample_size(20);
        for g in ALL_GEARS {
            let key = GearKey::derive(&provider, &[0x42; 32], g.id).expect("derive");
            let mut data = vec![0xa5u8; size];
            let mut tag = vec![0u8; g.tag_len];
            let mut seq = 0u64;
            group.bench_function(BenchmarkId::from_parameter(g.name), |b| {
                b.iter(|| {
                    seq += 1;
                    if g.kind == GearKind::Aead {
                        let (aad, body) = data.split_at_mut(HEADER);
                        black_box(key.seal(seq, aad, body).expect("seal"));
                    } else {
                        key.tag(seq, black_box(&data), HEADER, &mut tag)
                            .expect("tag");
                        black_box(&tag);
                    }
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, gears);
criterion_main!(benches);
