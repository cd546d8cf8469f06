//! Handshake and record benchmarks: rustls (TLS 1.3 on aws-lc-rs) as the baseline that
//! cohort-channel's own numbers sit beside.
//!
//! | id                              | what is timed                                           |
//! |---------------------------------|---------------------------------------------------------|
//! | `handshake/server/rustls-x25519`| server side of a full TLS 1.3 handshake                 |
//! | `handshake/resume/rustls`       | server side of a TLS 1.3 resumption (PSK + X25519)      |
//! | `records/rustls/16384`          | 16 KiB application-data chunks, server encrypts, client decrypts |
//!
//! Handshake benchmarks time only the server's calls (`ServerConnection::new`, `read_tls`,
//! `process_new_packets`, `write_tls`, for both of the server's flights) with
//! `Bencher::iter_custom`; the client's work happens between them, untimed. Everything is in
//! memory: no sockets.
//!
//! Run: `cargo bench -p cohort-channel --bench handshake`.
#![allow(missing_docs, clippy::expect_used, clippy::disallowed_methods)] // reason: criterion macros generate undocumented items; a panic aborts the bench; benchmarks time their own calls with Instant

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

fn handshake(c: &mut Criterion) {
    let mut group = c.benchmark_group("handshake");
    group.bench_function("server/rustls-x25519", rustls_side::full_handshake_server);
    group.bench_function("resume/rustls", rustls_side::resumed_handshake_server);
    group.finish();
}

fn records(c: &mut Criterion) {
    let mut group = c.benchmark_group("records");
    group.throughput(Throughput::Bytes(rustls_side::RECORD_BYTES_PER_ITER));
    group.bench_function(
        BenchmarkId::new("rustls", rustls_side::CHUNK),
        rustls_side::records,
    );
    group.finish();
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

    /// One handshake with `client`; returns the time spent in the server's calls only.
    fn timed_server_handshake(
        server_config: &Arc<ServerConfig>,
        mut client: ClientConnection,
        expect: HandshakeKind,
    ) -> Duration {
        let mut c2s = Vec::with_capacity(4096);
        let mut s2c = Vec::with_capacity(4096);
        let mut sink = [0u8; 64];

        drain(&mut client, &mut c2s); // ClientHello

        // Server flight 1: ServerHello .. Finished.
        let start = Instant::now();
        let mut server = ServerConnection::new(Arc::clone(server_config)).expect("server");
        feed(&mut server, &c2s, &mut sink);
        drain(&mut server, &mut s2c);
        let mut spent = start.elapsed();

        c2s.clear();
        feed(&mut client, &s2c, &mut sink);
        drain(&mut client, &mut c2s); // client Finished
        s2c.clear();

        // Server flight 2: read the client's Finished, send the session tickets.
        let start = Instant::now();
        feed(&mut server, &c2s, &mut sink);
        drain(&mut server, &mut s2c);
        spent += start.elapsed();

        // The client takes the tickets (for the next resumption), untimed.
        feed(&mut client, &s2c, &mut sink);
        assert!(!server.is_handshaking() && !client.is_handshaking());
        assert_eq!(server.handshake_kind(), Some(expect));
        black_box(&server);
        spent
    }

    pub fn full_handshake_server(b: &mut Bencher<'_>) {
        let server = server_config();
        let client_config = client_config(false);
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    timed_server_handshake(&server, client(&client_config), HandshakeKind::Full)
                })
                .sum()
        });
    }

    pub fn resumed_handshake_server(b: &mut Bencher<'_>) {
        let server = server_config();
        let client_config = client_config(true);
        // Prime the client's ticket cache with one full handshake; every resumption then
        // brings 2 fresh tickets for the one it used.
        timed_server_handshake(&server, client(&client_config), HandshakeKind::Full);
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    timed_server_handshake(&server, client(&client_config), HandshakeKind::Resumed)
                })
                .sum()
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

criterion_group!(benches, handshake, records);
criterion_main!(benches);
