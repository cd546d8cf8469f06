//! The flood tool of `scripts/tunnel-flood.sh`: floods a `cohort tunnel server` with
//! connections that send half a ClientHello and hang (`half`), or that complete a real
//! handshake and go idle (`idle`), and reports what the server did with them.
//!
//! Owns: opening, holding and timing the flood's connections, and its one-line summary. The
//! checks (bounds, the real client's latency) are the script's.
//!
//! ```text
//! tunnel_flood half|idle --server ADDR --count N [--concurrency C] [--sources K] [--hold S]
//!              [--rate PER_SECOND]
//! ```
//!
//! Each connection is held until the server closes it or `--hold` seconds pass. At most
//! `--concurrency` are open at once (the process needs that many file descriptors). Source
//! addresses rotate over 127.0.0.2 ..= 127.0.0.(K+1) so that ports do not run out.
#![allow(clippy::disallowed_methods)] // reason: a measuring tool owns its clock and randomness
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: a test tool; a panic is the failure report

use cohort_channel::{Client, ClientAuth, ClientConfig};
use cohort_crypto::CryptoProvider;
use cohort_net::stream;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Options from the command line.
struct Options {
    idle: bool,
    server: SocketAddr,
    count: u64,
    concurrency: usize,
    sources: u8,
    hold: Duration,
    /// Connections opened per second at most (0: as fast as the concurrency allows).
    rate: u64,
}

fn usage() -> ! {
    eprintln!(
        "usage: tunnel_flood half|idle --server ADDR --count N [--concurrency C] [--sources K] [--hold SECONDS] [--rate PER_SECOND]"
    );
    std::process::exit(2)
}

fn options() -> Options {
    let mut args = std::env::args().skip(1);
    let idle = match args.next().as_deref() {
        Some("half") => false,
        Some("idle") => true,
        _ => usage(),
    };
    let mut o = Options {
        idle,
        server: SocketAddr::from(([127, 0, 0, 1], 0)),
        count: 0,
        concurrency: 10_000,
        sources: 8,
        hold: Duration::from_secs(30),
        rate: 0,
    };
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--server" => o.server = value.parse().unwrap_or_else(|_| usage()),
            "--count" => o.count = value.parse().unwrap_or_else(|_| usage()),
            "--concurrency" => o.concurrency = value.parse().unwrap_or_else(|_| usage()),
            "--sources" => o.sources = value.parse().unwrap_or_else(|_| usage()),
            "--rate" => o.rate = value.parse().unwrap_or_else(|_| usage()),
            "--hold" => o.hold = Duration::from_secs(value.parse().unwrap_or_else(|_| usage())),
            _ => usage(),
        }
    }
    if o.count == 0 || o.concurrency == 0 || o.sources == 0 || o.sources > 250 {
        usage();
    }
    o
}

/// What happened to the flood's connections.
#[derive(Default)]
struct Tally {
    /// TCP connections established.
    connected: AtomicU64,
    /// Connects that failed.
    connect_failed: AtomicU64,
    /// Half hellos sent, or handshakes completed.
    started: AtomicU64,
    /// Handshakes that failed (idle mode).
    handshake_failed: AtomicU64,
    /// Closed by the server within the hold.
    closed: AtomicU64,
    /// Still open when the hold ran out.
    held: AtomicU64,
    /// Milliseconds from the half hello or the handshake's end to the server's close.
    lifetimes: Mutex<Vec<u32>>,
}

async fn open(server: SocketAddr, source: Ipv4Addr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((source, 0)))?;
    socket.connect(server).await
}

/// Waits until the server closes `tcp` (EOF or an error) or `hold` passes; tallies which.
async fn hang<S: tokio::io::AsyncRead + Unpin>(mut s: S, hold: Duration, tally: &Tally) {
    let start = Instant::now();
    let mut buf = [0u8; 256];
    let closed = tokio::time::timeout(hold, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    if closed.is_ok() {
        tally.closed.fetch_add(1, Relaxed);
        let ms = u32::try_from(start.elapsed().as_millis()).unwrap_or(u32::MAX);
        tally.lifetimes.lock().unwrap().push(ms);
    } else {
        tally.held.fetch_add(1, Relaxed);
    }
}

fn percentile(sorted: &[u32], p: usize) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[(sorted.len() - 1) * p / 100]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let o = options();
    let provider = CryptoProvider::default_provider();
    let mut config = ClientConfig::new(ClientAuth::None);
    // Every idle connection makes a full handshake (the server's most expensive path).
    config.resumption = false;
    let client = Client::new(provider, config);
    // One real ClientHello; each half-hello connection sends its first half.
    let hello = {
        let conn = client
            .connect(stream::now(), &mut stream::OsRng, "flood")
            .unwrap();
        let out = conn.output().to_vec();
        assert!(out.len() >= 2, "no ClientHello");
        Arc::new(out[..out.len() / 2].to_vec())
    };
    let tally = Arc::new(Tally::default());
    let slots = Arc::new(tokio::sync::Semaphore::new(o.concurrency));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..o.count {
        if o.rate > 0 {
            let due = started + Duration::from_secs_f64(i as f64 / o.rate as f64);
            tokio::time::sleep_until(due.into()).await;
        }
        let permit = slots.clone().acquire_owned().await.unwrap();
        let source = Ipv4Addr::new(127, 0, 0, 2 + (i % u64::from(o.sources)) as u8);
        let (tally, hello, client, server, hold, idle) = (
            tally.clone(),
            hello.clone(),
            client.clone(),
            o.server,
            o.hold,
            o.idle,
        );
        tasks.spawn(async move {
            let _permit = permit;
            let Ok(tcp) = open(server, source).await else {
                tally.connect_failed.fetch_add(1, Relaxed);
                return;
            };
            tally.connected.fetch_add(1, Relaxed);
            if idle {
                match stream::connect(&client, tcp, "flood").await {
                    Ok(secure) => {
                        tally.started.fetch_add(1, Relaxed);
                        hang(secure, hold, &tally).await;
                    }
                    Err(_) => {
                        tally.handshake_failed.fetch_add(1, Relaxed);
                    }
                }
            } else {
                let mut tcp = tcp;
                if tcp.write_all(&hello).await.is_ok() {
                    tally.started.fetch_add(1, Relaxed);
                    hang(tcp, hold, &tally).await;
                }
            }
        });
        // Reap finished tasks as we go, so the set stays as small as the concurrency.
        while tasks.try_join_next().is_some() {}
    }
    let opened_in = started.elapsed();
    while tasks.join_next().await.is_some() {}
    let mut lifetimes = std::mem::take(&mut *tally.lifetimes.lock().unwrap());
    lifetimes.sort_unstable();
    println!(
        "flood {}: {} connections ({} connected, {} connect failures, {} {}, {} handshake failures) opened in {:.1} s, done in {:.1} s; closed by the server: {} (after ms: min {} median {} p99 {} max {}), still open after {} s: {}",
        if o.idle { "idle" } else { "half" },
        o.count,
        tally.connected.load(Relaxed),
        tally.connect_failed.load(Relaxed),
        tally.started.load(Relaxed),
        if o.idle { "handshakes completed" } else { "half hellos sent" },
        tally.handshake_failed.load(Relaxed),
        opened_in.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        tally.closed.load(Relaxed),
        percentile(&lifetimes, 0),
        percentile(&lifetimes, 50),
        percentile(&lifetimes, 99),
        percentile(&lifetimes, 100),
        o.hold.as_secs(),
        tally.held.load(Relaxed),
    );
}
