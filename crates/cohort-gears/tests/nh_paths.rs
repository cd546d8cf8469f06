//! The SIMD NH paths against the portable one: random keys, lengths (tails of every shape,
//! lengths that are not multiples of 32, 64 or 128 bytes, several chunks) and tag lengths must
//! give identical UHASH values and tags. Also the path selection itself.

use cohort_crypto::CryptoProvider;
use cohort_gears::umac::{NhPath, Umac};
use proptest::prelude::*;

/// The SIMD paths this CPU runs. An unsupported path is reported as SKIPPED on stderr (the
/// README's test command must pass on any x86-64 or other CPU), or fails the test when
/// `COHORT_NH_REQUIRE_ALL=1` is set, as in tests/umac_vectors.rs.
fn simd_paths() -> Vec<NhPath> {
    let mut out = Vec::new();
    for path in [NhPath::Avx2, NhPath::Avx512] {
        if path.is_supported() {
            out.push(path);
        } else if std::env::var_os("COHORT_NH_REQUIRE_ALL").is_some_and(|v| v == "1") {
            panic!(
                "this CPU cannot run the {} NH path: NOT tested here (COHORT_NH_REQUIRE_ALL=1)",
                path.name()
            );
        } else {
            eprintln!(
                "SKIPPED: the {} NH path cannot run on this CPU: NOT tested here",
                path.name()
            );
        }
    }
    out
}

fn umac(key: &[u8; 16], tag_len: usize, path: NhPath) -> Umac {
    let mut u = Umac::new(&CryptoProvider::default_provider(), key, tag_len).expect("valid");
    u.set_nh_path(path).expect("supported");
    u
}

/// Tags and UHASH values of `msg` on every path must equal the portable path's.
fn check_agree(key: &[u8; 16], tag_len: usize, msg: &[u8], nonce: &[u8]) {
    let portable = umac(key, tag_len, NhPath::Portable);
    let mut want_tag = vec![0u8; tag_len];
    portable.tag(nonce, msg, &mut want_tag).expect("tag");
    let mut want_hash = vec![0u8; tag_len];
    portable.uhash(msg, &mut want_hash);
    for path in simd_paths() {
        let u = umac(key, tag_len, path);
        let mut tag = vec![0u8; tag_len];
        u.tag(nonce, msg, &mut tag).expect("tag");
        assert_eq!(
            tag,
            want_tag,
            "tag, {} path, {} bytes",
            path.name(),
            msg.len()
        );
        let mut hash = vec![0u8; tag_len];
        u.uhash(msg, &mut hash);
        assert_eq!(
            hash,
            want_hash,
            "uhash, {} path, {} bytes",
            path.name(),
            msg.len()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn simd_paths_agree_with_portable(
        key in any::<[u8; 16]>(),
        tag_idx in 0usize..4,
        len in prop_oneof![0usize..2200, 2200usize..20_000],
        seed in any::<u64>(),
        nonce in proptest::collection::vec(any::<u8>(), 1..=16),
    ) {
        let mut x = seed | 1;
        let msg: Vec<u8> = (0..len).map(|_| { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x as u8 }).collect();
        check_agree(&key, 4 * (tag_idx + 1), &msg, &nonce);
    }
}

#[test]
fn simd_paths_agree_on_every_tail_shape() {
    // Every length of a last chunk from 0 to 1024 bytes, alone and after two full chunks, with
    // all-ones bytes (the 32-bit sums wrap) and with varied bytes.
    let key = *b"0123456789abcdef";
    let ones = vec![0xFFu8; 2 * 1024 + 1024];
    let varied: Vec<u8> = (0..3 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    for tag_len in [4, 8, 12, 16] {
        for data in [&ones, &varied] {
            for tail in 0..=1024 {
                check_agree(&key, tag_len, &data[..tail], b"n");
                check_agree(&key, tag_len, &data[..2048 + tail], b"n");
            }
        }
    }
}

#[test]
fn path_selection() {
    assert!(NhPath::Portable.is_supported());
    let best = NhPath::detect();
    assert!(best.is_supported());
    // Nothing faster than `detect` is supported.
    for p in NhPath::ALL {
        if p > best {
            assert!(
                !p.is_supported(),
                "{} is supported but detect chose {}",
                p.name(),
                best.name()
            );
        }
    }
    let u = Umac::new(&CryptoProvider::default_provider(), &[7; 16], 8).expect("valid");
    assert_eq!(u.nh_path(), NhPath::default_path());
    // An unsupported path is refused and leaves the key as it was.
    for p in NhPath::ALL {
        let mut u = umac(&[7; 16], 8, NhPath::Portable);
        match u.set_nh_path(p) {
            Ok(()) => assert_eq!(u.nh_path(), p),
            Err(_) => {
                assert!(!p.is_supported());
                assert_eq!(u.nh_path(), NhPath::Portable);
            }
        }
    }
    // On x86-64 CPUs with AVX2 (this project's benchmark machines) the default is SIMD unless
    // COHORT_UMAC_NH says otherwise.
    if std::env::var_os("COHORT_UMAC_NH").is_none() && NhPath::Avx2.is_supported() {
        assert_ne!(NhPath::default_path(), NhPath::Portable);
    }
}
