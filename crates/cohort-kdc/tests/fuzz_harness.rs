//! The KDC fuzz targets' harnesses (`cohort_kdc::fuzzing`) as property tests, so they run in
//! every `cargo test` and cannot rot: arbitrary bytes, real messages with bytes XORed in,
//! cut or extended, and every single-bit flip of each real message.
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

use cohort_kdc::fuzzing::{self, real_request, real_response, ALICE, MALLORY};
use cohort_kdc::{KdcError, Outcome};
use proptest::prelude::*;

/// `control | rest`, the harness input format.
fn with_control(control: u8, rest: &[u8]) -> Vec<u8> {
    let mut v = vec![control];
    v.extend_from_slice(rest);
    v
}

/// The XOR mask that flips bit `i` of a message of `len` bytes.
fn flip(len: usize, i: usize) -> Vec<u8> {
    let mut mask = vec![0u8; len];
    mask[i / 8] = 1 << (i % 8);
    mask
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn arbitrary_bytes_never_panic_the_kdc(data in prop::collection::vec(any::<u8>(), 0..160)) {
        let outcome = fuzzing::request(&data);
        // Raw bytes (control bit 0 clear) essentially never carry a valid MAC.
        if data.first().is_some_and(|c| c & 1 == 0) {
            prop_assert!(!matches!(outcome, Outcome::Answered { .. }), "{}", outcome);
        }
    }

    #[test]
    fn arbitrary_bytes_never_open_a_response(data in prop::collection::vec(any::<u8>(), 0..160)) {
        let opened = fuzzing::response(&data);
        if data.first().is_some_and(|c| c & 1 == 0) {
            prop_assert!(opened.is_err());
        }
    }

    #[test]
    fn mutated_real_requests(control in any::<u8>(), mask in prop::collection::vec(any::<u8>(), 0..130)) {
        let outcome = fuzzing::request(&with_control(control | 1, &mask));
        if mask.iter().any(|&b| b != 0) && control & 4 == 0 {
            prop_assert!(
            !matches!(outcome, Outcome::Answered { .. } | Outcome::UnknownPrincipal { .. }),
            "{}",
            outcome
        );
        }
    }

    #[test]
    fn mutated_real_responses(control in any::<u8>(), mask in prop::collection::vec(any::<u8>(), 0..130)) {
        let opened = fuzzing::response(&with_control(control | 1, &mask));
        if mask.iter().any(|&b| b != 0) && control & 4 == 0 {
            prop_assert!(opened.is_err());
        }
    }
}

#[test]
fn the_real_messages_pass_through_the_harnesses() {
    assert!(matches!(fuzzing::request(&[1]), Outcome::Answered { .. }));
    assert!(matches!(
        fuzzing::request(&[3]),
        Outcome::UnknownPrincipal { .. }
    ));
    assert_eq!(fuzzing::response(&[1]), Ok(()));
    assert!(matches!(
        fuzzing::response(&[3]),
        Err(KdcError::WrongPrincipal { .. })
    ));
    assert_eq!(
        fuzzing::request(&[]),
        Outcome::Malformed(cohort_kdc::wire::WireError::Truncated)
    );
    // An unauthenticated hint for someone else, and one for the leader with another nonce.
    let mut hint = vec![0, 1, 4, 3, b'e', b'v', b'e'];
    hint.extend_from_slice(&[0x5a; 16]);
    assert!(matches!(
        fuzzing::response(&hint),
        Err(KdcError::WrongPrincipal { .. })
    ));
    let mut hint = vec![0, 1, 4, 6];
    hint.extend_from_slice(b"leader");
    hint.extend_from_slice(&[0; 16]);
    assert_eq!(fuzzing::response(&hint), Err(KdcError::WrongNonce));
    hint[10..].copy_from_slice(&[0x5a; 16]);
    assert!(matches!(
        fuzzing::response(&hint),
        Err(KdcError::UnknownRequester(_))
    ));
}

#[test]
fn every_bit_flip_of_a_request_is_refused() {
    for principal in [ALICE, MALLORY] {
        let control = if principal == ALICE { 1 } else { 3 };
        let len = real_request(principal).bytes().len();
        for i in 0..len * 8 {
            let outcome = fuzzing::request(&with_control(control, &flip(len, i)));
            assert!(
                !outcome.replied() || matches!(outcome, Outcome::UnknownRequester { .. }),
                "bit {i}: {outcome}"
            );
        }
    }
}

#[test]
fn every_bit_flip_of_a_response_is_refused() {
    for principal in [ALICE, MALLORY] {
        let control = if principal == ALICE { 1 } else { 3 };
        let len = real_response(principal).len();
        for i in 0..len * 8 {
            assert!(
                fuzzing::response(&with_control(control, &flip(len, i))).is_err(),
                "bit {i}"
            );
        }
    }
}

// ---- the fuzz corpus (fuzz/corpus/<target>) -------------------------------------------------

/// Seeds from the real request and response (see the harness's control byte): each as it
/// is, XOR-based with nothing changed, and cut to half.
fn corpus_seeds(real: impl Fn(&'static str) -> Vec<u8>) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (who, bit) in [(ALICE, 0u8), (MALLORY, 2)] {
        let bytes = real(who);
        out.push((format!("{who}-raw"), with_control(0, &bytes)));
        out.push((format!("{who}-real"), with_control(1 | bit, &[])));
        let half = vec![0; bytes.len() / 2];
        out.push((format!("{who}-cut"), with_control(1 | bit | 4, &half)));
    }
    out
}

/// Every input in the corpus runs through its harness as the fuzzer ran it, and the seeds
/// reach what they are for: the real request is answered, the real response opens. With
/// `COHORT_WRITE_CORPUS=1` the seeds are written first (`scripts/fuzz-corpus.sh`).
#[test]
fn fuzz_corpus_replays() {
    let requests = corpus_seeds(|p| real_request(p).bytes().to_vec());
    let responses = corpus_seeds(real_response);
    assert!(matches!(
        fuzzing::request(&requests[1].1),
        Outcome::Answered { .. }
    ));
    assert!(fuzzing::response(&responses[1].1).is_ok());
    cohort_sim::corpus::check(
        "kdc_request",
        |d| {
            let _ = fuzzing::request(d);
        },
        &requests,
    );
    cohort_sim::corpus::check(
        "kdc_response",
        |d| {
            let _ = fuzzing::response(d);
        },
        &responses,
    );
}
