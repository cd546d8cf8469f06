//! The KDC and its requesters end to end, in memory: many principals with random keys, every
//! pair asked for, σ compared with what each member computes alone; responses replayed,
//! redirected and forged; unknown principals and requesters; a database written to disk,
//! read back and served.
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

use cohort_crypto::CryptoProvider;
use cohort_kdc::{
    leader_shared_key, member_shared_key, pair_key, Kdc, KdcError, KeyFile, Nonce, PairKeyRequest,
    PrincipalKey, PrincipalName, Registry,
};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use std::net::SocketAddr;

const FROM: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9);

fn name(s: &str) -> PrincipalName {
    PrincipalName::new(s).unwrap()
}

fn nonce(rng: &mut ChaCha20Rng) -> Nonce {
    let mut n = [0u8; 16];
    rng.fill_bytes(&mut n);
    n
}

#[test]
fn every_pair_of_many_principals_agrees_on_sigma() {
    let provider = CryptoProvider::default_provider();
    let mut rng = ChaCha20Rng::seed_from_u64(7);
    let principals: Vec<(PrincipalName, PrincipalKey)> = (0..12)
        .map(|i| (name(&format!("node-{i}")), PrincipalKey::generate(&mut rng)))
        .collect();
    let mut registry = Registry::new();
    for (n, k) in &principals {
        registry.insert(*n, k.clone());
    }
    let mut kdc = Kdc::new(provider, registry);
    for (sl, k_sl) in &principals {
        for (a, k_a) in &principals {
            if sl == a {
                continue;
            }
            let request = PairKeyRequest::new(&provider, *sl, k_sl, *a, nonce(&mut rng)).unwrap();
            let response = kdc.handle_request(FROM, request.bytes()).unwrap();
            let sigma = request.open_response(&response).unwrap();
            assert_eq!(sigma, member_shared_key(&provider, k_a, sl), "{sl} -> {a}");
        }
    }
    assert_eq!(kdc.counters().answered, 12 * 11);
}

#[test]
fn lm_sigma_agrees_without_any_kdc_for_many_random_keys() {
    let provider = CryptoProvider::default_provider();
    let mut rng = ChaCha20Rng::seed_from_u64(11);
    let (sl, a) = (name("leader"), name("member"));
    for _ in 0..1_000 {
        let (k_sl, k_a) = (
            PrincipalKey::generate(&mut rng),
            PrincipalKey::generate(&mut rng),
        );
        let pi = pair_key(&provider, &sl, &k_sl, &a, &k_a);
        let sigma = member_shared_key(&provider, &k_a, &sl);
        assert_eq!(leader_shared_key(&provider, &k_sl, &a, &pi), sigma);
        assert_ne!(pi.as_bytes(), sigma.expose());
    }
}

#[test]
fn replayed_redirected_and_unknown() {
    let provider = CryptoProvider::default_provider();
    let mut rng = ChaCha20Rng::seed_from_u64(3);
    let k_sl = PrincipalKey::generate(&mut rng);
    let k_alice = PrincipalKey::generate(&mut rng);
    let k_bob = PrincipalKey::generate(&mut rng);
    let mut registry = Registry::new();
    registry.insert(name("sl"), k_sl.clone());
    registry.insert(name("alice"), k_alice);
    registry.insert(name("bob"), k_bob);
    let mut kdc = Kdc::new(provider, registry);
    let ask = |kdc: &mut Kdc, a: &str, n: Nonce| {
        let r = PairKeyRequest::new(&provider, name("sl"), &k_sl, name(a), n).unwrap();
        let response = kdc.handle_request(FROM, r.bytes());
        (r, response)
    };

    // A response replayed to a later request (another nonce) is refused.
    let (_, old) = ask(&mut kdc, "alice", nonce(&mut rng));
    let (later, fresh) = ask(&mut kdc, "alice", nonce(&mut rng));
    assert_eq!(
        later.open_response(old.as_ref().unwrap()),
        Err(KdcError::WrongNonce)
    );
    later.open_response(fresh.as_ref().unwrap()).unwrap();

    // A response for bob does not open a request for alice.
    let (_, bobs) = ask(&mut kdc, "bob", nonce(&mut rng));
    let (for_alice, _) = ask(&mut kdc, "alice", nonce(&mut rng));
    assert!(matches!(
        for_alice.open_response(bobs.as_ref().unwrap()),
        Err(KdcError::WrongPrincipal { principal, .. }) if principal == name("bob")
    ));

    // The same request twice is answered once.
    let (r, first) = ask(&mut kdc, "alice", nonce(&mut rng));
    assert!(first.is_some());
    assert_eq!(kdc.handle_request(FROM, r.bytes()), None);
    assert_eq!(kdc.counters().replayed, 1);

    // An unknown principal: a clear, authenticated error naming it.
    let (r, response) = ask(&mut kdc, "carol", nonce(&mut rng));
    let e = r.open_response(&response.unwrap()).unwrap_err();
    assert_eq!(e, KdcError::UnknownPrincipal(name("carol")));
    assert!(e.to_string().contains("carol"));

    // An unknown requester: a hint, never a key.
    let k_eve = PrincipalKey::generate(&mut rng);
    let r = PairKeyRequest::new(
        &provider,
        name("eve"),
        &k_eve,
        name("alice"),
        nonce(&mut rng),
    )
    .unwrap();
    let response = kdc.handle_request(FROM, r.bytes()).unwrap();
    assert_eq!(
        r.open_response(&response),
        Err(KdcError::UnknownRequester(name("eve")))
    );

    // Someone who knows the names but not K_SL gets nothing.
    let r = PairKeyRequest::new(
        &provider,
        name("sl"),
        &k_eve,
        name("alice"),
        nonce(&mut rng),
    )
    .unwrap();
    assert_eq!(kdc.handle_request(FROM, r.bytes()), None);
    assert_eq!(kdc.counters().bad_mac, 1);
}

#[test]
fn a_database_on_disk_serves_the_key_files_it_came_with() {
    let provider = CryptoProvider::default_provider();
    let mut rng = ChaCha20Rng::seed_from_u64(5);
    let dir = std::env::temp_dir().join(format!("cohort-kdc-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut registry = Registry::new();
    for who in ["leader", "alice"] {
        let file = KeyFile {
            name: name(who),
            key: PrincipalKey::generate(&mut rng),
        };
        registry.insert(file.name, file.key.clone());
        std::fs::write(dir.join(format!("{who}.key")), file.to_text().as_bytes()).unwrap();
    }
    registry.save(&dir.join("kdc.db")).unwrap();

    let mut kdc = Kdc::new(provider, Registry::load(&dir.join("kdc.db")).unwrap());
    let read = |who: &str| {
        KeyFile::parse(&std::fs::read_to_string(dir.join(format!("{who}.key"))).unwrap()).unwrap()
    };
    let (leader, alice) = (read("leader"), read("alice"));
    let r = PairKeyRequest::new(&provider, leader.name, &leader.key, alice.name, [1; 16]).unwrap();
    let sigma = r
        .open_response(&kdc.handle_request(FROM, r.bytes()).unwrap())
        .unwrap();
    assert_eq!(
        sigma,
        member_shared_key(&provider, &alice.key, &leader.name)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
