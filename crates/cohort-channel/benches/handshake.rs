//! Handshake and record benchmarks: rustls (TLS 1.3 on aws-lc-rs) as the baseline that
//! cohort-channel's own numbers sit beside.
//!
//! | id                              | what is timed                                           |
//! |---------------------------------|---------------------------------------------------------|
//! | `handshake/server/rustls-x25519`| server side of a full TLS 1.3 handshake                 |
//! | `handshake/resume/rustls`       | server side of a TLS 1.3 resumption (PSK + X25519)      |
//! | `records/rustls/16384`          | 16 KiB application-data chunks, server encrypts, client decrypts |
//! | `handshake/server/cohort-<kem>` | server side of a full cohort-channel handshake, per KEM |
//! | `handshake/server/cohort-x25519-mlkem768-batchsig64` | the same with batch signing, 64 sessions per signature |
//! | `handshake/resume/cohort`       | server side of a cohort-channel resumption (no public-key step) |
//! | `records/cohort-<gear>/16384`   | as rustls's records benchmark, per record gear          |
//! | `kem/encapsulate/<kem>`         | the server's public-key step alone, in a tight loop     |
//! | `handshake-b2b/server/<stack>`  | as `handshake/server/<stack>`, in batches of 1024: the server's steps back to back on pregenerated client flights |
//!
//! Handshake benchmarks time only the server's calls (`ServerConnection::new`, `read_tls`,
//! `process_new_packets`, `write_tls`, for both of the server's flights; for cohort,
//! `accept`, `handle_input`, `take_output`) with `Bencher::iter_custom`; the client's work
//! happens between them, untimed. Both stacks run the server's steps in batches, as a busy
//! server would: all first flights of a batch back to back, then (untimed) the clients, then
//! all second flights (64 full handshakes per batch, 8 resumptions, the most rustls's client
//! keeps tickets for). Interleaving the client's work with each server step instead puts a
//! client's private-key operation on the same core just before every timed step; for
//! RSA-2048 (a 1 ms decryption) that tripled the server's measured time. Everything is in
//! memory: no sockets.
//!
//! The `handshake-b2b` group times the same server calls the way rustls's own benchmarks
//! time a server: on client flights generated beforehand, the server's steps back to back
//! with no client work between them. Here that is batches of [`B2B_BATCH`] handshakes:
//! all ClientHellos generated first (untimed), then the server answers all of them (timed),
//! then the clients do their part (untimed), then the server takes all their second flights
//! (timed). The client's heavy work (an RSA decryption, 1 ms) then sits between two long
//! timed phases instead of before every 64 server steps. The interleaved numbers stay in
//! the `handshake` group beside it.
//!
//! Run: `cargo bench -p cohort-channel --bench handshake`.
#![allow(missing_docs, clippy::expect_used, clippy::disallowed_methods)] // reason: criterion macros generate undocumented items; a panic aborts the bench; benchmarks time their own calls with Instant

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// Full handshakes whose server steps run back to back, as on a busy server (both stacks).
const BATCH: usize = 64;
/// Full handshakes per batch in the back-to-back group.
const B2B_BATCH: usize = 1024;
/// Resumptions per batch: rustls's client keeps at most 8 TLS 1.3 tickets per server name,
/// so both stacks resume in batches of 8.
const RESUME_BATCH: usize = 8;

/// Sums `run(n)` over `iters` handshakes, `n` at most `k` at a time.
fn batched(
    iters: u64,
    k: usize,
    mut run: impl FnMut(usize) -> std::time::Duration,
) -> std::time::Duration {
    let mut left = iters as usize;
    let mut total = std::time::Duration::ZERO;
    while left > 0 {
        let n = left.min(k);
        total += run(n);
        left -= n;
    }
    total
}

fn handshake(c: &mut Criterion) {
    let mut group = c.benchmark_group("handshake");
    group.bench_function("server/rustls-x25519", |b| {
        rustls_side::full_handshake_server(b, BATCH)
    });
    for kem in cohort_channel::suite::ALL_KEM_SUITES {
        group.bench_function(format!("server/cohort-{}", kem.name()), |b| {
            cohort_side::full_handshake_server(b, kem, cohort_side::Auth::None, BATCH)
        });
    }
    // Signature mode, with the batch signer's cost shared by a batch of 64 sessions (the
    // default batch size; one Ed25519 signature per batch).
    group.bench_function("server/cohort-x25519-mlkem768-batchsig64", |b| {
        cohort_side::full_handshake_server(
            b,
            cohort_channel::KemSuite::X25519MlKem768,
            cohort_side::Auth::BatchSignature(64),
            64,
        )
    });
    group.bench_function("resume/rustls", rustls_side::resumed_handshake_server);
    group.bench_function("resume/cohort", cohort_side::resumed_handshake_server);
    group.finish();
}

/// The server's steps back to back on pregenerated client flights, in batches of
/// [`B2B_BATCH`] (see the file's doc). Short runs: every handshake also costs the client's
/// untimed work, up to 1 ms for RSA.
fn handshake_b2b(c: &mut Criterion) {
    let mut group = c.benchmark_group("handshake-b2b");
    group
        .sample_size(10)
        .warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_secs(1));
    group.bench_function("server/rustls-x25519", |b| {
        rustls_side::full_handshake_server(b, B2B_BATCH)
    });
    for kem in cohort_channel::suite::ALL_KEM_SUITES {
        group.bench_function(format!("server/cohort-{}", kem.name()), |b| {
            cohort_side::full_handshake_server(b, kem, cohort_side::Auth::None, B2B_BATCH)
        });
    }
    group.finish();
}

/// The server's public-key step alone, in a tight loop: what each KEM costs the server
/// before anything else in the handshake.
fn kem(c: &mut Criterion) {
    let mut group = c.benchmark_group("kem");
    let p = cohort_crypto::CryptoProvider::default_provider();
    for suite in cohort_channel::suite::ALL_KEM_SUITES {
        let kem = p.kem(suite.algorithm()).expect("kem");
        let (_secret, public) = kem.generate().expect("generate");
        group.bench_function(format!("encapsulate/{}", suite.name()), |b| {
            b.iter(|| {
                kem.encapsulate(std::hint::black_box(&public))
                    .expect("encapsulate")
            })
        });
    }
    group.finish();
}

fn records(c: &mut Criterion) {
    let mut group = c.benchmark_group("records");
    group.throughput(Throughput::Bytes(rustls_side::RECORD_BYTES_PER_ITER));
    group.bench_function(
        BenchmarkId::new("rustls", rustls_side::CHUNK),
        rustls_side::records,
    );
    for gear in [
        cohort_gears::GearId::Aes256Gcm,
        cohort_gears::GearId::Aes128Gcm,
        cohort_gears::GearId::ChaCha20Poly1305,
        cohort_gears::GearId::Umac64,
    ] {
        group.bench_function(
            BenchmarkId::new(format!("cohort-{}", gear.name()), rustls_side::CHUNK),
            |b| cohort_side::records(b, gear),
        );
    }
    group.finish();
}

/// cohort-channel's side, configured to match: no client authentication, the same
/// measurement boundaries (server calls only, client work untimed in between), and for the
/// records the same 64 chunks of 16 KiB per iteration, sealed by one end and opened by the
/// other.
mod cohort_side {
    use cohort_channel::batch::{BatchConfig, BatchSigner};
    use cohort_channel::identity::Identity;
    use cohort_channel::{
        AuthMode, Client, ClientAuth, ClientConfig, Connection, KemSuite, Server, ServerConfig,
    };
    use cohort_core::Timestamp;
    use cohort_crypto::{CryptoProvider, Secret};
    use criterion::Bencher;
    use rand_core::SeedableRng;
    use std::hint::black_box;
    use std::time::{Duration, Instant};

    /// How the server authenticates.
    #[derive(Clone, Copy)]
    pub enum Auth {
        /// Opportunistic (tcpcrypt's default).
        None,
        /// Batch signing; the batch's one signature is shared by this many sessions.
        BatchSignature(usize),
    }

    const NOW: Timestamp = Timestamp::from_millis(1);

    fn identity() -> Identity {
        Identity::from_secret(
            &CryptoProvider::default_provider(),
            Secret::from_slice(&[3; 32]),
        )
        .expect("identity")
    }

    fn pair(kem: KemSuite, auth: Auth, resumption: bool) -> (Client, Server) {
        let p = CryptoProvider::default_provider();
        let mut cc = ClientConfig::new(match auth {
            Auth::None => ClientAuth::None,
            Auth::BatchSignature(_) => ClientAuth::ServerSignature {
                pinned: identity().public(),
            },
        })
        .with_kem(kem);
        // The client's key pair is reused (and its cost is untimed anyway).
        cc.ephemeral_lifetime = Duration::from_secs(3600);
        cc.resumption = resumption;
        let mut sc = ServerConfig::new();
        if let Auth::BatchSignature(_) = auth {
            sc.auth_modes = vec![AuthMode::ServerSignature];
            sc.identity = Some(identity().public());
        }
        (Client::new(p, cc), Server::new(p, sc))
    }

    fn output(conn: &mut Connection) -> Vec<u8> {
        let mut out = Vec::new();
        conn.take_output(&mut out);
        out
    }

    /// `k` handshakes, the server's steps batched as on a busy server: all `k`
    /// ClientHellos are answered back to back (timed), then the clients do their part
    /// (untimed), then all `k` ClientFinished messages are taken back to back (timed). In
    /// signature mode the `k` sessions share one batch signature, whose cost is timed in
    /// full. Returns the server's time for all `k`.
    fn timed_batch(
        client: &Client,
        server: &Server,
        rng: &mut rand_chacha::ChaCha20Rng,
        signer: Option<&mut BatchSigner>,
        expect_resumed: bool,
        k: usize,
    ) -> Duration {
        // One server name per client, so that each holds its own resumption ticket.
        let mut clients: Vec<Connection> = (0..k)
            .map(|i| {
                client
                    .connect(NOW, rng, &format!("bench-{i}"))
                    .expect("connect")
            })
            .collect();
        let hellos: Vec<Vec<u8>> = clients.iter_mut().map(output).collect();

        let start = Instant::now();
        let mut servers: Vec<Connection> = hellos
            .iter()
            .map(|hello| {
                let mut s = server.accept();
                s.handle_input(NOW, hello).expect("server hello");
                s
            })
            .collect();
        if let Some(signer) = signer {
            let mut tickets = Vec::with_capacity(k);
            for s in &mut servers {
                match s.poll_event() {
                    Some(cohort_channel::Event::BatchSignatureNeeded(sid)) => {
                        tickets.push(signer.add(NOW, sid.0))
                    }
                    other => panic!("expected a signing request, got {other:?}"),
                }
            }
            signer.flush();
            while let Some((ticket, proof)) = signer.poll_signed() {
                let i = tickets.iter().position(|t| *t == ticket).expect("ticket");
                servers[i]
                    .handle_batch_proof(&proof.expect("signed"))
                    .expect("proof");
            }
        }
        let replies: Vec<Vec<u8>> = servers.iter_mut().map(output).collect();
        let mut spent = start.elapsed();

        let finished: Vec<Vec<u8>> = clients
            .iter_mut()
            .zip(&replies)
            .map(|(c, reply)| {
                c.handle_input(NOW, reply).expect("client");
                output(c)
            })
            .collect();

        let start = Instant::now();
        for (s, f) in servers.iter_mut().zip(&finished) {
            s.handle_input(NOW, f).expect("finished");
        }
        spent += start.elapsed();

        for (c, s) in clients.iter().zip(&servers) {
            assert!(c.is_established() && s.is_established());
            assert_eq!(s.session().map(|i| i.auth.resumed), Some(expect_resumed));
        }
        black_box(&servers);
        spent
    }

    /// Full handshakes, the server's steps in batches of `batch` (the batch signature's
    /// size in signature mode).
    pub fn full_handshake_server(b: &mut Bencher<'_>, kem: KemSuite, auth: Auth, batch: usize) {
        let (client, server) = pair(kem, auth, false);
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(1);
        let mut signer = match auth {
            Auth::None => None,
            Auth::BatchSignature(n) => Some(BatchSigner::new(
                CryptoProvider::default_provider(),
                identity(),
                BatchConfig {
                    max_sessions: n,
                    window: Duration::from_secs(1),
                },
            )),
        };
        let k = match auth {
            Auth::None => batch,
            Auth::BatchSignature(n) => n,
        };
        b.iter_custom(|iters| {
            super::batched(iters, k, |n| {
                timed_batch(&client, &server, &mut rng, signer.as_mut(), false, n)
            })
        });
    }

    pub fn resumed_handshake_server(b: &mut Bencher<'_>) {
        let (client, server) = pair(KemSuite::X25519MlKem768, Auth::None, true);
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(2);
        // One full handshake per client name primes the tickets; each resumption leaves
        // the next one.
        timed_batch(&client, &server, &mut rng, None, false, super::RESUME_BATCH);
        b.iter_custom(|iters| {
            super::batched(iters, super::RESUME_BATCH, |n| {
                timed_batch(&client, &server, &mut rng, None, true, n)
            })
        });
    }

    pub fn records(b: &mut Bencher<'_>, gear: cohort_gears::GearId) {
        let p = CryptoProvider::default_provider();
        let mut cc = ClientConfig::new(ClientAuth::None).with_kem(KemSuite::X25519);
        cc.gears = vec![gear];
        cc.floor_bits = 0.0;
        let mut sc = ServerConfig::new();
        sc.gears = vec![gear];
        sc.floor_bits = 0.0;
        let (client, server) = (Client::new(p, cc), Server::new(p, sc));
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(3);
        let mut c = client.connect(NOW, &mut rng, "records").expect("connect");
        let mut s = server.accept();
        s.handle_input(NOW, &output(&mut c)).expect("hello");
        c.handle_input(NOW, &output(&mut s)).expect("server hello");
        s.handle_input(NOW, &output(&mut c)).expect("finished");
        assert!(s.is_established() && c.is_established());
        let chunk = vec![0xa5u8; super::rustls_side::CHUNK];
        let mut sink = vec![0u8; super::rustls_side::CHUNK];
        let mut wire = Vec::with_capacity(2 * super::rustls_side::CHUNK);
        b.iter(|| {
            let mut received = 0;
            for _ in 0..64 {
                s.send(&chunk).expect("send");
                s.take_output(&mut wire);
                c.handle_input(NOW, &wire).expect("records");
                wire.clear();
                received += c.recv(&mut sink);
            }
            assert_eq!(received as u64, super::rustls_side::RECORD_BYTES_PER_ITER);
            black_box(&sink);
        });
    }
}

/// The rustls baseline.
///
/// Configuration, shared by every benchmark here: TLS 1.3 only; the aws-lc-rs provider with
/// its key exchange groups cut down to X25519 (so no ML-KEM hybrid share and no
/// HelloRetryRequest); rustls's default cipher suite order, so TLS13_AES_256_GCM_SHA384 is
/// negotiated; an Ed25519 leaf certificate (`data/server.pem`) under an Ed25519 CA the client
/// trusts; no client authentication; no ALPN. The client fully verifies the chain (untimed).
///
/// Resumption: rustls 0.23's `ServerConfig` defaults are kept: no ticketer
/// (`NeverProducesTickets`) and an in-memory `ServerSessionMemoryCache` of 256 sessions, and
/// 2 TLS 1.3 tickets sent after each handshake. So the "tickets" are *stateful*: each is a
/// random 32-byte ID into the server's cache, consumed (removed) when used. The client always
/// offers psk_dhe_ke, the only mode rustls supports, so a resumption still does an X25519
/// exchange but no certificate and no signature. Because the defaults send tickets, the full
/// handshake benchmark also includes issuing (and caching) 2 tickets in the server's second
/// flight.
mod rustls_side {
    use criterion::Bencher;
    use rustls::client::Resumption;
    use rustls::crypto::{aws_lc_rs, CryptoProvider};
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use rustls::{
        ClientConfig, ClientConnection, ConnectionCommon, HandshakeKind, RootCertStore,
        ServerConfig, ServerConnection,
    };
    use std::hint::black_box;
    use std::io::{ErrorKind, Read, Write};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// Plaintext bytes per `write` in the records benchmark: one full TLS record.
    pub const CHUNK: usize = 16384;
    /// Chunks the server writes (and the client reads) per iteration.
    const CHUNKS_PER_ITER: usize = 64;
    /// Application bytes per records iteration, for `Throughput::Bytes`.
    pub const RECORD_BYTES_PER_ITER: u64 = (CHUNK * CHUNKS_PER_ITER) as u64;

    fn data(name: &str) -> String {
        format!("{}/benches/data/{name}", env!("CARGO_MANIFEST_DIR"))
    }

    fn provider() -> Arc<CryptoProvider> {
        Arc::new(CryptoProvider {
            kx_groups: vec![aws_lc_rs::kx_group::X25519],
            ..aws_lc_rs::default_provider()
        })
    }

    fn server_config() -> Arc<ServerConfig> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(data("server.pem"))
            .expect("open server.pem")
            .collect::<Result<_, _>>()
            .expect("parse server.pem");
        let key = PrivateKeyDer::from_pem_file(data("server.key.pem")).expect("server.key.pem");
        let config = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("TLS 1.3")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("server certificate");
        Arc::new(config)
    }

    fn client_config(resumption: bool) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_file_iter(data("ca.pem")).expect("open ca.pem") {
            roots.add(ca.expect("parse ca.pem")).expect("add CA");
        }
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("TLS 1.3")
            .with_root_certificates(roots)
            .with_no_client_auth();
        if !resumption {
            config.resumption = Resumption::disabled();
        }
        Arc::new(config)
    }

    fn client(config: &Arc<ClientConfig>) -> ClientConnection {
        let name = ServerName::try_from("localhost").expect("server name");
        ClientConnection::new(Arc::clone(config), name).expect("client")
    }

    /// Everything `conn` wants to send, appended to `out`.
    fn drain<D>(conn: &mut ConnectionCommon<D>, out: &mut Vec<u8>) {
        while conn.wants_write() {
            conn.write_tls(out).expect("write_tls");
        }
    }

    /// Feeds all of `bytes` to `conn`, processing as it goes; plaintext that arrives is read
    /// into `sink` (so rustls's 16 KiB received-plaintext limit is never hit). Returns the
    /// plaintext byte count.
    fn feed<D>(conn: &mut ConnectionCommon<D>, mut bytes: &[u8], sink: &mut [u8]) -> usize {
        let mut got = 0;
        while !bytes.is_empty() {
            conn.read_tls(&mut bytes).expect("read_tls");
            conn.process_new_packets().expect("process_new_packets");
            loop {
                match conn.reader().read(sink) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) => panic!("read: {e}"),
                }
            }
        }
        got
    }

    /// `clients.len()` handshakes with the server's steps batched, as the cohort side does:
    /// every server's first flight back to back (timed), the clients' part (untimed), every
    /// server's second flight back to back (timed), then the clients take their tickets
    /// (untimed). Returns the server's time for all of them.
    fn timed_server_handshakes(
        server_config: &Arc<ServerConfig>,
        mut clients: Vec<ClientConnection>,
        expect: HandshakeKind,
    ) -> Duration {
        let mut sink = [0u8; 64];
        let hellos: Vec<Vec<u8>> = clients
            .iter_mut()
            .map(|c| {
                let mut out = Vec::with_capacity(4096);
                drain(c, &mut out); // ClientHello
                out
            })
            .collect();

        // Server flight 1: ServerHello .. Finished, for every client.
        let start = Instant::now();
        let mut servers = Vec::with_capacity(hellos.len());
        let mut replies = Vec::with_capacity(hellos.len());
        for hello in &hellos {
            let mut server = ServerConnection::new(Arc::clone(server_config)).expect("server");
            feed(&mut server, hello, &mut sink);
            let mut out = Vec::with_capacity(4096);
            drain(&mut server, &mut out);
            servers.push(server);
            replies.push(out);
        }
        let mut spent = start.elapsed();

        let finished: Vec<Vec<u8>> = clients
            .iter_mut()
            .zip(&replies)
            .map(|(c, reply)| {
                feed(c, reply, &mut sink);
                let mut out = Vec::with_capacity(256);
                drain(c, &mut out); // client Finished
                out
            })
            .collect();

        // Server flight 2: read each client's Finished, send the session tickets.
        let start = Instant::now();
        let mut tickets = Vec::with_capacity(finished.len());
        for (server, f) in servers.iter_mut().zip(&finished) {
            feed(server, f, &mut sink);
            let mut out = Vec::with_capacity(1024);
            drain(server, &mut out);
            tickets.push(out);
        }
        spent += start.elapsed();

        // The clients take the tickets (for the next resumptions), untimed.
        for ((c, s), t) in clients.iter_mut().zip(&servers).zip(&tickets) {
            feed(c, t, &mut sink);
            assert!(!s.is_handshaking() && !c.is_handshaking());
            assert_eq!(s.handshake_kind(), Some(expect));
        }
        black_box(&servers);
        spent
    }

    /// Full handshakes, the server's steps in batches of `batch`.
    pub fn full_handshake_server(b: &mut Bencher<'_>, batch: usize) {
        let server = server_config();
        let client_config = client_config(false);
        b.iter_custom(|iters| {
            super::batched(iters, batch, |n| {
                let clients = (0..n).map(|_| client(&client_config)).collect();
                timed_server_handshakes(&server, clients, HandshakeKind::Full)
            })
        });
    }

    pub fn resumed_handshake_server(b: &mut Bencher<'_>) {
        let server = server_config();
        let client_config = client_config(true);
        // Prime the client's ticket cache with full handshakes; every resumption then
        // brings 2 fresh tickets for the one it used (the cache keeps 8 per server name).
        let clients = (0..super::RESUME_BATCH)
            .map(|_| client(&client_config))
            .collect();
        timed_server_handshakes(&server, clients, HandshakeKind::Full);
        b.iter_custom(|iters| {
            super::batched(iters, super::RESUME_BATCH, |n| {
                let clients = (0..n).map(|_| client(&client_config)).collect();
                timed_server_handshakes(&server, clients, HandshakeKind::Resumed)
            })
        });
    }

    pub fn records(b: &mut Bencher<'_>) {
        let server_config = server_config();
        let mut client = client(&client_config(false));
        let mut server = ServerConnection::new(server_config).expect("server");
        let mut wire = Vec::with_capacity(2 * CHUNK);
        let mut sink = vec![0u8; CHUNK];
        while client.is_handshaking() || server.is_handshaking() {
            drain(&mut client, &mut wire);
            feed(&mut server, &wire, &mut sink);
            wire.clear();
            drain(&mut server, &mut wire);
            feed(&mut client, &wire, &mut sink);
            wire.clear();
        }
        let chunk = vec![0xa5u8; CHUNK];
        b.iter(|| {
            let mut received = 0;
            for _ in 0..CHUNKS_PER_ITER {
                server.writer().write_all(&chunk).expect("write");
                drain(&mut server, &mut wire);
                received += feed(&mut client, &wire, &mut sink);
                wire.clear();
            }
            assert_eq!(received, CHUNK * CHUNKS_PER_ITER);
            black_box(&sink);
        });
    }
}

criterion_group!(benches, handshake, handshake_b2b, kem, records);
criterion_main!(benches);
