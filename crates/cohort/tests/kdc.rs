//! `cohort kdc add-principal|serve` as a user runs them: principals registered (key files and
//! database owner-only, no silent overwrite), bad configurations refused with a message
//! naming the key, then a real KDC process on loopback UDP answering a leader's request with
//! the σ the member computes from its own key file, an unknown principal's clear error, an
//! unknown requester's hint, and one log line per request with no secret in it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

mod support;

use cohort_crypto::CryptoProvider;
use cohort_kdc::{
    member_shared_key, KdcError, KeyFile, PairKeyRequest, PrincipalKey, PrincipalName,
};
use rand_core::{OsRng, RngCore};
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::process::Output;
#[cfg(unix)]
use support::mode;
use support::{
    arg, assert_missing_config, assert_refused, cohort, exits_2, refused_config, tempdir, text,
    StderrWatch, WAIT,
};

/// `cohort kdc serve`.
const KDC_SERVE: &[&str] = &["kdc", "serve"];

fn add_principal(config: &Path, out: &Path, name: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "kdc",
        "add-principal",
        name,
        "--config",
        arg(config),
        "--out",
        arg(out),
    ];
    args.extend_from_slice(extra);
    cohort(&args)
}

fn read_key_file(path: &Path) -> KeyFile {
    KeyFile::parse(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn nonce() -> [u8; 16] {
    let mut n = [0u8; 16];
    OsRng.fill_bytes(&mut n);
    n
}

/// Sends `request` to the KDC at `kdc` and returns the response.
fn exchange(kdc: SocketAddr, request: &PairKeyRequest) -> Vec<u8> {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_read_timeout(Some(WAIT)).unwrap();
    socket.send_to(request.bytes(), kdc).unwrap();
    let mut buf = [0u8; 2048];
    let (len, from) = socket.recv_from(&mut buf).expect("a response from the KDC");
    assert_eq!(from, kdc);
    buf[..len].to_vec()
}

#[test]
fn config_errors_name_the_key_and_exit_2() {
    let dir = tempdir("kdc-config");
    let cases = [
        (
            "listen = \"127.0.0.1:99999\"\ndatabase = \"kdc.db\"\n",
            "config error: listen:",
        ),
        (
            "listen = \"127.0.0.1:7600\"\n",
            "config error: database: missing",
        ),
        (
            "listen = \"127.0.0.1:7600\"\ndatabase = \"kdc.db\"\nport = 7\n",
            "config error: port: unknown key",
        ),
        (
            "listen = \"127.0.0.1:7600\"\ndatabase = \"missing.db\"\n",
            "config error: database:",
        ),
    ];
    for (config, says) in cases {
        assert_refused(&dir, KDC_SERVE, config, says);
    }
    assert_missing_config(&dir, KDC_SERVE);

    // A database that is not one: the key and the line.
    std::fs::write(dir.join("junk.db"), "cohort-kdc-db v1\nalice nothex\n").unwrap();
    let err = refused_config(
        &dir,
        KDC_SERVE,
        "listen = \"127.0.0.1:7600\"\ndatabase = \"junk.db\"\n",
    );
    assert!(
        err.contains("config error: database:") && err.contains("line 2: key:"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn add_principal_then_serve_pair_keys_over_udp() {
    let dir = tempdir("kdc-serve");
    let keys = dir.join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let config = dir.join("kdc.toml");
    std::fs::write(&config, "listen = \"127.0.0.1:0\"\ndatabase = \"kdc.db\"\n").unwrap();

    // Two principals: the database is created by the first and grows with the second.
    for (name, says) in [
        ("leader", "created, 1 principal)"),
        ("alice", "(2 principals)"),
    ] {
        let out = add_principal(&config, &keys, name, &[]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let said = text(&out.stdout);
        assert!(said.contains(&format!("added principal {name}")), "{said}");
        assert!(said.contains(says), "{said}");
        assert!(said.contains(&format!("{name}.key")), "{said}");
        let key_file = keys.join(format!("{name}.key"));
        assert!(key_file.exists());
        assert_eq!(read_key_file(&key_file).name.as_str(), name);
        #[cfg(unix)]
        assert_eq!(mode(&key_file), 0o600, "{name}.key");
    }
    #[cfg(unix)]
    assert_eq!(mode(&dir.join("kdc.db")), 0o600, "the database");
    let db = std::fs::read_to_string(dir.join("kdc.db")).unwrap();
    let leader = read_key_file(&keys.join("leader.key"));
    let alice = read_key_file(&keys.join("alice.key"));
    assert!(db.contains(&*leader.key.to_hex()) && db.contains(&*alice.key.to_hex()));

    // No silent overwrite; a bad name is refused; --force re-keys.
    let err = exits_2(&add_principal(&config, &keys, "alice", &[]));
    assert!(err.contains("already registered"), "{err}");
    let err = exits_2(&add_principal(&config, &keys, "bad/name", &[]));
    assert!(err.contains("invalid principal name"), "{err}");
    std::fs::write(keys.join("carol.key"), "mine").unwrap();
    let err = exits_2(&add_principal(&config, &keys, "carol", &[]));
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(
        std::fs::read_to_string(keys.join("carol.key")).unwrap(),
        "mine"
    );
    assert!(!std::fs::read_to_string(dir.join("kdc.db"))
        .unwrap()
        .contains("carol"));
    let out = add_principal(&config, &keys, "bob", &[]);
    assert!(out.status.success());
    let old_bob = read_key_file(&keys.join("bob.key"));
    let out = add_principal(&config, &keys, "bob", &["--force"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("re-keyed principal bob"));
    assert_ne!(read_key_file(&keys.join("bob.key")).key, old_bob.key);

    // Serve on an ephemeral port; the first line says which.
    let mut server = StderrWatch::start(&[KDC_SERVE, &["--config", arg(&config)]].concat());
    let line = server.wait_for("listening on");
    let addr: SocketAddr = line
        .split("listening on ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .unwrap()
        .parse()
        .unwrap();
    assert!(line.contains("3 principals"), "{line}");

    // The leader asks for alice: σ equals what alice computes from her own key file.
    let provider = CryptoProvider::default_provider();
    let request =
        PairKeyRequest::new(&provider, leader.name, &leader.key, alice.name, nonce()).unwrap();
    let response = exchange(addr, &request);
    let sigma = request.open_response(&response).unwrap();
    assert_eq!(
        sigma,
        member_shared_key(&provider, &alice.key, &leader.name)
    );
    server.wait_for("answered: leader asked for alice");

    // An unknown principal: the clear, authenticated error.
    let mallory = PrincipalName::new("mallory").unwrap();
    let request =
        PairKeyRequest::new(&provider, leader.name, &leader.key, mallory, nonce()).unwrap();
    let response = exchange(addr, &request);
    assert_eq!(
        request.open_response(&response),
        Err(KdcError::UnknownPrincipal(mallory))
    );
    server.wait_for("unknown principal: leader asked for mallory");

    // A principal added while the KDC runs is served after SIGHUP.
    let out = add_principal(&config, &keys, "dave", &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dave = read_key_file(&keys.join("dave.key"));
    server.process.signal("HUP");
    server.wait_for("reloaded");
    let request =
        PairKeyRequest::new(&provider, leader.name, &leader.key, dave.name, nonce()).unwrap();
    let sigma = request.open_response(&exchange(addr, &request)).unwrap();
    assert_eq!(sigma, member_shared_key(&provider, &dave.key, &leader.name));

    // Two requests in one UDP bundle (what a member's driver sends when one flush queues
    // both): each is answered on its own, in its own datagram.
    let for_alice =
        PairKeyRequest::new(&provider, leader.name, &leader.key, alice.name, nonce()).unwrap();
    let for_dave =
        PairKeyRequest::new(&provider, leader.name, &leader.key, dave.name, nonce()).unwrap();
    let mut both = Vec::new();
    cohort_net::bundle::write(&mut both, [for_alice.bytes(), for_dave.bytes()]);
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_read_timeout(Some(WAIT)).unwrap();
    socket.send_to(&both, addr).unwrap();
    let mut buf = [0u8; 2048];
    let mut sigmas = Vec::new();
    for _ in 0..2 {
        let (len, _) = socket
            .recv_from(&mut buf)
            .expect("an answer to each bundled request");
        let response = &buf[..len];
        // The answers may come in either order: each opens under its own request only.
        let sigma = for_alice
            .open_response(response)
            .or_else(|_| for_dave.open_response(response))
            .expect("an answer to one of the two requests");
        sigmas.push(sigma);
    }
    let alice_sigma = member_shared_key(&provider, &alice.key, &leader.name);
    let dave_sigma = member_shared_key(&provider, &dave.key, &leader.name);
    assert!(sigmas.contains(&alice_sigma) && sigmas.contains(&dave_sigma));
    // A bundle that does not parse is dropped whole, and the log says why.
    socket.send_to(&both[..both.len() - 1], addr).unwrap();
    server.wait_for("malformed bundle");

    // An unregistered requester: only a hint comes back.
    let eve = PrincipalName::new("eve").unwrap();
    let request = PairKeyRequest::new(
        &provider,
        eve,
        &PrincipalKey::generate(&mut OsRng),
        alice.name,
        nonce(),
    )
    .unwrap();
    let response = exchange(addr, &request);
    let e = request.open_response(&response).unwrap_err();
    assert_eq!(e, KdcError::UnknownRequester(eve));
    assert!(e.is_hint());
    server.wait_for("unknown requester: eve");

    // The old bob key no longer works: no answer, and the log says why.
    let request =
        PairKeyRequest::new(&provider, old_bob.name, &old_bob.key, alice.name, nonce()).unwrap();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.send_to(request.bytes(), addr).unwrap();
    server.wait_for("bad MAC: claims to be bob");
    socket.send_to(b"junk", addr).unwrap();
    server.wait_for("malformed");

    // No key ever appears in the log.
    for secret in [&leader.key, &alice.key, &old_bob.key, &dave.key] {
        let hex = secret.to_hex();
        assert!(
            server.seen.iter().all(|l| !l.contains(&hex[..16])),
            "{:#?}",
            server.seen
        );
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
