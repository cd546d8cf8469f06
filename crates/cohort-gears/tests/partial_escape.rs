//! The partial MAC's escape rate, measured on real tags, against ACSA's (1 - p)^w and the
//! exact figure from `partial::escape_probability`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

use cohort_crypto::CryptoProvider;
use cohort_gears::partial::{escape_probability, PartialMac};

/// Modifies `w` body words spread `gap` words apart and counts over `trials` packets how
/// often the tag does not change.
fn measured_escape(l: u32, first: usize, w: usize, gap: usize, trials: u64) -> (f64, Vec<usize>) {
    let pm = PartialMac::new(&CryptoProvider::default_provider(), &[0x33; 32], l).unwrap();
    let header = 8;
    let positions: Vec<usize> = (0..w).map(|i| first + i * gap).collect();
    let words = positions.last().unwrap() + 4;
    let mut data = vec![0u8; header + words * 8];
    let mut modified = data.clone();
    for &p in &positions {
        modified[header + p * 8 + 3] ^= 0x10;
    }
    let mut escaped = 0u64;
    for seq in 0..trials {
        data[0] = 1; // header byte, same in both
        modified[0] = 1;
        let (mut a, mut b) = ([0u8; 8], [0u8; 8]);
        pm.tag(seq, &data, header, &mut a).unwrap();
        pm.tag(seq, &modified, header, &mut b).unwrap();
        if a == b {
            escaped += 1;
        }
    }
    (escaped as f64 / trials as f64, positions)
}

#[test]
fn escape_rate_matches_acsa_equation_4() {
    let trials = 20_000u64;
    for (l, first, w) in [
        (2u32, 0usize, 1usize),
        (4, 0, 1),
        (4, 16, 4),
        (16, 0, 1),
        (16, 3, 8),
        (64, 0, 1),
        (64, 256, 16),
        (256, 0, 32),
    ] {
        let gap = 4 * l as usize + 3;
        let (rate, positions) = measured_escape(l, first, w, gap, trials);
        let exact = escape_probability(&positions, l);
        let p = 2.0 / (2.0 * f64::from(l) + 1.0);
        let acsa = (1.0 - p).powi(w as i32);
        // Binomial standard deviation of the measured rate; 5 sigma (plus a floor for rates
        // near 0 or 1).
        let sigma = (exact * (1.0 - exact) / trials as f64)
            .sqrt()
            .max(1.0 / trials as f64);
        assert!(
            (rate - exact).abs() < 5.0 * sigma,
            "L={l} w={w}: measured {rate:.4}, exact {exact:.4} (sigma {sigma:.5})"
        );
        // Words 4L+3 apart are close to independent, so ACSA's formula is close too.
        assert!(
            (exact - acsa).abs() < 0.01 + 5.0 * sigma,
            "L={l} w={w}: exact {exact:.4} vs (1-p)^w {acsa:.4}"
        );
        eprintln!(
            "L={l:>3} first={first:>3} w={w:>2}: measured {rate:.4}  exact {exact:.4}  (1-p)^w {acsa:.4}"
        );
    }
}

#[test]
fn adjacent_words_escape_less_independently() {
    // Neighbouring words are not independent (the walk never skips more than 2L - 1 words);
    // the exact computation captures that, and the measurement agrees with it.
    let (rate, positions) = measured_escape(4, 0, 8, 1, 20_000);
    let exact = escape_probability(&positions, 4);
    let sigma = (exact * (1.0 - exact) / 20_000.0)
        .sqrt()
        .max(1.0 / 20_000.0);
    assert!(
        (rate - exact).abs() < 5.0 * sigma,
        "measured {rate}, exact {exact}"
    );
    // With 2L = 8 the first landing is within words 0..8 and no step skips 8 words, so eight
    // adjacent words from the start cannot all be missed.
    assert_eq!(exact, 0.0);
    assert_eq!(rate, 0.0);
}
