//! Packet protection across every gear: round trips, a flip of every bit of every field,
//! replays, multiple tags, receiver policy and limits.
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

use cohort_crypto::CryptoProvider;
use cohort_gears::{
    peek, DropReason, GearId, GearKeys, GearKind, GearSet, ProtectError, Protector, ReceivePolicy,
    TagChoice, Unprotector, ALL_GEARS, MAX_PACKET_LEN,
};

fn keys(secret: u8, gears: GearSet) -> GearKeys {
    GearKeys::derive(&CryptoProvider::default_provider(), &[secret; 32], gears).unwrap()
}

fn pair(gears: GearSet, floor: f64) -> (Protector, Unprotector) {
    let policy = ReceivePolicy::new(gears, floor);
    (
        Protector::new(keys(1, gears)),
        Unprotector::new(keys(1, gears), policy),
    )
}

/// A receiver that also takes the null gear, which only tests and fuzzers may build.
fn pair_with_null(gears: GearSet) -> (Protector, Unprotector) {
    let policy = ReceivePolicy {
        danger_accept_null_for_testing: true,
        ..ReceivePolicy::new(gears, 0.0)
    };
    (
        Protector::new(keys(1, gears)),
        Unprotector::new(keys(1, gears), policy),
    )
}

fn all() -> GearSet {
    ALL_GEARS.iter().map(|g| g.id).collect()
}

#[test]
fn every_gear_round_trips_and_aead_encrypts() {
    for g in ALL_GEARS {
        let set: GearSet = [g.id].into_iter().collect();
        let (mut tx, mut rx) = pair_with_null(set);
        for (header, body) in [
            (&b""[..], &b""[..]),
            (b"h", b"b"),
            (b"header", &[7u8; 3000][..]),
        ] {
            let mut packet = Vec::new();
            let seq = tx.protect(&[g.id], header, body, &mut packet).unwrap();
            if g.kind == GearKind::Aead && body.len() > 16 {
                assert!(
                    !packet.windows(body.len()).any(|w| w == body),
                    "{}: body in clear",
                    g.name
                );
            }
            let opened = rx
                .unprotect(&mut packet)
                .unwrap_or_else(|e| panic!("{}: {e}", g.name));
            assert_eq!(
                (opened.seq, opened.header, opened.body),
                (seq, header, body),
                "{}",
                g.name
            );
            assert_eq!(opened.verified_by, g.id);
        }
        assert_eq!(rx.counters().accepted, 3);
    }
}

/// Flips every bit of a protected packet (version, tag count, gear ids, sequence number,
/// header length, header, body, tags): every secure gear refuses every flip, except that a
/// partial MAC may miss body bits it did not choose.
#[test]
fn every_single_bit_flip_is_refused() {
    for g in ALL_GEARS
        .iter()
        .filter(|g| g.id != GearId::DangerNullForTesting)
    {
        let set: GearSet = [g.id].into_iter().collect();
        let (mut tx, _) = pair(set, 0.0);
        let header = b"hdr:01";
        let body: Vec<u8> = (0..200u8).collect();
        let mut packet = Vec::new();
        tx.protect(&[g.id], header, &body, &mut packet).unwrap();
        let body_range = cohort_gears::prefix_len(1) + header.len()..packet.len() - g.tag_len;
        let mut escaped_body_bits = 0;
        for bit in 0..packet.len() * 8 {
            let mut p = packet.clone();
            p[bit / 8] ^= 1 << (bit % 8);
            let mut rx = Unprotector::new(keys(1, set), ReceivePolicy::new(set, 0.0));
            match rx.unprotect(&mut p) {
                Err(_) => {}
                Ok(_) if g.partial_l.is_some() && body_range.contains(&(bit / 8)) => {
                    escaped_body_bits += 1
                }
                Ok(_) => panic!("{}: flip of bit {bit} accepted", g.name),
            }
        }
        if let Some(l) = g.partial_l {
            // 200 body bytes are 25 words: a flip escapes exactly when its word was not
            // chosen, so every bit of a word escapes or none does.
            assert_eq!(escaped_body_bits % 64, 0, "{}", g.name);
            if l <= 8 {
                assert!(
                    escaped_body_bits / 64 < 25,
                    "{}: no body word covered",
                    g.name
                );
            }
        }
    }
}

#[test]
fn replays_are_refused_and_counted() {
    let set: GearSet = [GearId::Umac64, GearId::Aes128Gcm].into_iter().collect();
    let (mut tx, mut rx) = pair(set, 0.0);
    for gear in [GearId::Umac64, GearId::Aes128Gcm] {
        let mut packet = Vec::new();
        tx.protect(&[gear], b"", b"once", &mut packet).unwrap();
        let copy = packet.clone();
        assert!(rx.unprotect(&mut packet).is_ok());
        let mut again = copy.clone();
        assert_eq!(rx.unprotect(&mut again), Err(DropReason::Replayed));
    }
    assert_eq!(rx.counters().replayed, 2);
    // Far behind the window.
    let mut old = Vec::new();
    let mut tx2 = Protector::new(keys(1, set));
    tx2.protect(&[GearId::Umac64], b"", b"old", &mut old)
        .unwrap(); // seq 0, already used
    for _ in 0..3000 {
        let mut p = Vec::new();
        tx.protect(&[GearId::Umac64], b"", b"x", &mut p).unwrap();
        rx.unprotect(&mut p).unwrap();
    }
    assert_eq!(rx.unprotect(&mut old), Err(DropReason::TooOld));
}

#[test]
fn forged_packets_do_not_move_the_window() {
    let set: GearSet = [GearId::HmacSha256_128].into_iter().collect();
    let (mut tx, mut rx) = pair(set, 0.0);
    let mut forger = Protector::new(keys(9, set));
    let mut forged = Vec::new();
    forger
        .protect_with_seq(10_000, &[GearId::HmacSha256_128], b"", b"evil", &mut forged)
        .unwrap();
    assert_eq!(rx.unprotect(&mut forged), Err(DropReason::AuthFailed));
    // A genuine packet with a low number still gets through: the forgery did not advance it.
    let mut genuine = Vec::new();
    tx.protect(&[GearId::HmacSha256_128], b"", b"ok", &mut genuine)
        .unwrap();
    assert!(rx.unprotect(&mut genuine).is_ok());
    assert_eq!(rx.failures(GearId::HmacSha256_128), 1);
}

#[test]
fn multiple_tags_each_receiver_verifies_its_choice() {
    let set: GearSet = [GearId::Umac32, GearId::HmacSha256_128, GearId::Partial64]
        .into_iter()
        .collect();
    let mut tx = Protector::new(keys(1, set));
    let gears = [GearId::Partial64, GearId::Umac32, GearId::HmacSha256_128];
    let mut packet = Vec::new();
    tx.protect(&gears, b"h", &[5u8; 4096], &mut packet).unwrap();
    let (seq, listed) = peek(&packet).unwrap();
    assert_eq!((seq, listed.as_slice()), (0, &gears[..]));

    let strong = ReceivePolicy::new(set, 0.0);
    let cheap = ReceivePolicy {
        choice: TagChoice::Cheapest,
        ..strong
    };
    let floor60 = ReceivePolicy {
        floor_bits: 60.0,
        choice: TagChoice::Cheapest,
        ..strong
    };
    for (policy, expect) in [
        (strong, GearId::HmacSha256_128),
        (cheap, GearId::Partial64),
        (floor60, GearId::HmacSha256_128),
    ] {
        let mut rx = Unprotector::new(keys(1, set), policy);
        let mut p = packet.clone();
        assert_eq!(
            rx.unprotect(&mut p).unwrap().verified_by,
            expect,
            "{policy:?}"
        );
    }

    // Each tag is independent: break the strong one and a receiver checking the fast one
    // still accepts, while one checking the strong one refuses.
    let mut broken = packet.clone();
    let last = broken.len() - 1;
    broken[last] ^= 1; // inside the hmac tag, which comes last
    let mut rx = Unprotector::new(
        keys(1, set),
        ReceivePolicy {
            floor_bits: 20.0,
            ..cheap
        },
    );
    assert_eq!(
        rx.unprotect(&mut broken.clone()).unwrap().verified_by,
        GearId::Umac32
    );
    let mut rx = Unprotector::new(keys(1, set), strong);
    assert_eq!(rx.unprotect(&mut broken), Err(DropReason::AuthFailed));
}

#[test]
fn stripping_the_strong_tag_cannot_lower_the_floor() {
    let set: GearSet = [GearId::Umac32, GearId::HmacSha256_128]
        .into_iter()
        .collect();
    let mut tx = Protector::new(keys(1, set));
    let mut weak_only = Vec::new();
    tx.protect(&[GearId::Umac32], b"", b"payload", &mut weak_only)
        .unwrap();
    let mut rx = Unprotector::new(keys(1, set), ReceivePolicy::new(set, 100.0));
    assert_eq!(
        rx.unprotect(&mut weak_only),
        Err(DropReason::NoAcceptableTag)
    );
    // A gear the receiver did not agree to is not acceptable either.
    let only_hmac: GearSet = [GearId::HmacSha256_128].into_iter().collect();
    let mut rx = Unprotector::new(keys(1, set), ReceivePolicy::new(only_hmac, 0.0));
    let mut p = Vec::new();
    tx.protect(&[GearId::Umac32], b"", b"payload", &mut p)
        .unwrap();
    assert_eq!(rx.unprotect(&mut p), Err(DropReason::NoAcceptableTag));
}

#[test]
fn protect_refuses_misuse_with_details() {
    let set: GearSet = [GearId::Umac32, GearId::Aes128Gcm, GearId::HmacSha256]
        .into_iter()
        .collect();
    let mut tx = Protector::new(keys(1, set));
    let mut out = Vec::new();
    assert_eq!(
        tx.protect(&[], b"", b"", &mut out),
        Err(ProtectError::NoGears)
    );
    assert_eq!(
        tx.protect(&[GearId::Umac32, GearId::Umac32], b"", b"", &mut out),
        Err(ProtectError::DuplicateGear(GearId::Umac32))
    );
    assert_eq!(
        tx.protect(&[GearId::Umac64], b"", b"", &mut out),
        Err(ProtectError::GearNotInSuite(GearId::Umac64))
    );
    assert_eq!(
        tx.protect(&[GearId::Umac32, GearId::Aes128Gcm], b"", b"", &mut out),
        Err(ProtectError::MustStandAlone(GearId::Aes128Gcm))
    );
    assert_eq!(
        tx.protect(&[GearId::Umac32], &[0; 70_000], b"", &mut out),
        Err(ProtectError::HeaderTooLong)
    );
    assert_eq!(
        tx.protect(&[GearId::Umac32], b"", &vec![0; MAX_PACKET_LEN], &mut out),
        Err(ProtectError::PacketTooLong)
    );
    assert!(out.is_empty(), "a refused packet leaves nothing behind");
    tx.protect_with_seq(10, &[GearId::Umac32], b"", b"", &mut out)
        .unwrap();
    assert_eq!(
        tx.protect_with_seq(10, &[GearId::Umac32], b"", b"", &mut out),
        Err(ProtectError::SequenceReused)
    );
    assert_eq!(tx.next_seq(), 11);
    assert_eq!(
        tx.protect_with_seq(u64::MAX, &[GearId::Umac32], b"", b"", &mut out),
        Err(ProtectError::SequenceReused)
    );
}

#[test]
fn the_null_gear_needs_an_explicit_danger_flag() {
    let set: GearSet = [GearId::DangerNullForTesting, GearId::Umac64]
        .into_iter()
        .collect();
    let (mut tx, mut rx) = pair(set, 0.0);
    let mut p = Vec::new();
    tx.protect(
        &[GearId::DangerNullForTesting],
        b"",
        b"anyone could send this",
        &mut p,
    )
    .unwrap();
    assert_eq!(
        rx.unprotect(&mut p.clone()),
        Err(DropReason::NoAcceptableTag)
    );
    let (_, mut rx) = pair_with_null(set);
    assert!(rx.unprotect(&mut p).is_ok());
}

#[test]
fn integrity_limit_retires_a_weak_gear() {
    let set: GearSet = [GearId::Umac32].into_iter().collect();
    let (mut tx, mut rx) = pair(set, 0.0);
    let mut forger = Protector::new(keys(2, set));
    let limit = GearId::Umac32.info().integrity_limit;
    assert_eq!(limit, 1 << 10);
    for i in 0..limit {
        let mut p = Vec::new();
        forger
            .protect_with_seq(100 + i, &[GearId::Umac32], b"", b"x", &mut p)
            .unwrap();
        // A forgery under a 32-bit tag succeeds with about 2^-30 per try: never in 1024.
        assert_eq!(rx.unprotect(&mut p), Err(DropReason::AuthFailed));
    }
    assert!(rx.retired().contains(GearId::Umac32));
    let mut genuine = Vec::new();
    tx.protect(&[GearId::Umac32], b"", b"x", &mut genuine)
        .unwrap();
    assert_eq!(rx.unprotect(&mut genuine), Err(DropReason::NoAcceptableTag));
}

#[test]
fn truncated_and_garbage_packets_are_counted_not_panics() {
    let set = all();
    let (mut tx, mut rx) = pair(set, 0.0);
    let mut packet = Vec::new();
    tx.protect(
        &[GearId::Umac64, GearId::Blake3_128],
        b"head",
        b"body",
        &mut packet,
    )
    .unwrap();
    for len in 0..packet.len() {
        let mut p = packet[..len].to_vec();
        assert!(rx.unprotect(&mut p).is_err(), "truncated to {len}");
    }
    let mut bad_version = packet.clone();
    bad_version[0] = 2;
    assert_eq!(rx.unprotect(&mut bad_version), Err(DropReason::BadVersion));
    let mut unknown = packet.clone();
    unknown[2] = 0xee;
    assert_eq!(rx.unprotect(&mut unknown), Err(DropReason::UnknownGear));
    let mut zero_tags = packet.clone();
    zero_tags[1] = 0;
    assert_eq!(rx.unprotect(&mut zero_tags), Err(DropReason::Malformed));
    assert_eq!(rx.counters().accepted, 0);
    assert_eq!(rx.counters().dropped(), packet.len() as u64 + 3);
}

#[test]
fn different_association_secrets_do_not_interoperate() {
    for g in ALL_GEARS
        .iter()
        .filter(|g| g.id != GearId::DangerNullForTesting)
    {
        let set: GearSet = [g.id].into_iter().collect();
        let mut tx = Protector::new(keys(1, set));
        let mut rx = Unprotector::new(keys(2, set), ReceivePolicy::new(set, 0.0));
        let mut p = Vec::new();
        tx.protect(&[g.id], b"h", b"same bytes", &mut p).unwrap();
        assert_eq!(
            rx.unprotect(&mut p),
            Err(DropReason::AuthFailed),
            "{}",
            g.name
        );
    }
}
