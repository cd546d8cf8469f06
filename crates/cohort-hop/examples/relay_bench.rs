//! Relay verification speed: a real pair (A - R - B) runs in memory, and only the time the
//! relay spends in `handle_datagram` and `poll_transmit` is counted. Each mode is compared
//! with the unprotected baseline (the relay only looks the pair up and forwards), measured
//! in the same process, one core.
//!
//! `cargo run --release -p cohort-hop --example relay_bench [-- --messages 200000 --size 1300]`
#![allow(clippy::disallowed_methods)] // a benchmark, not a protocol core: it reads the clock
#![allow(missing_docs)]

use cohort_channel::identity::Identity;
use cohort_core::{Machine, Timestamp};
use cohort_crypto::{CryptoProvider, Secret};
use cohort_hop::{Endpoint, EndpointConfig, Mode, Relay, RelayConfig};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const A: usize = 0;
const R: usize = 1;
const B: usize = 2;

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 9, 0, i as u8 + 1], 7000))
}

fn identity(n: u8) -> Identity {
    Identity::from_secret(
        &CryptoProvider::default_provider(),
        Secret::new(vec![n; 32]),
    )
    .expect("identity")
}

struct Run {
    a: Endpoint,
    r: Relay,
    b: Endpoint,
    now: Timestamp,
    wire: VecDeque<(usize, usize, Vec<u8>)>,
    relay_time: Duration,
    relay_packets: u64,
    delivered: u64,
}

impl Run {
    fn new(mode_rounds: u32) -> Run {
        let provider = CryptoProvider::default_provider();
        let config = |n| {
            let mut c = EndpointConfig::new(identity(n));
            c.chain_rounds = mode_rounds;
            c.max_queue = 1 << 20;
            c
        };
        Run {
            a: Endpoint::new(config(1), provider, addr(A), [1; 32]),
            r: Relay::new(RelayConfig::new(), provider, addr(R)),
            b: Endpoint::new(config(2), provider, addr(B), [2; 32]),
            now: Timestamp::from_millis(1),
            wire: VecDeque::new(),
            relay_time: Duration::ZERO,
            relay_packets: 0,
            delivered: 0,
        }
    }

    fn index(a: SocketAddr) -> usize {
        usize::from(match a.ip() {
            std::net::IpAddr::V4(ip) => ip.octets()[3],
            std::net::IpAddr::V6(_) => 0,
        }) - 1
    }

    fn drain(&mut self, from: usize) {
        let mut buf = Vec::with_capacity(2048);
        loop {
            buf.clear();
            let start = Instant::now();
            let t = match from {
                A => self.a.poll_transmit(self.now, &mut buf),
                R => self.r.poll_transmit(self.now, &mut buf),
                _ => self.b.poll_transmit(self.now, &mut buf),
            };
            if from == R {
                self.relay_time += start.elapsed();
            }
            let Some(t) = t else { break };
            self.wire
                .push_back((from, Self::index(t.destination), buf[..t.size].to_vec()));
        }
        if from == B {
            while let Some(e) = self.b.poll_event() {
                if matches!(e, cohort_hop::EndpointEvent::Received { .. }) {
                    self.delivered += 1;
                }
            }
        }
        while self.a.poll_event().is_some() {}
        while self.r.poll_event().is_some() {}
    }

    /// Delivers everything on the wire (no loss, no delay), then fires due timers.
    fn settle(&mut self) {
        while let Some((from, to, bytes)) = self.wire.pop_front() {
            self.now += Duration::from_micros(1);
            let from_addr = addr(from);
            match to {
                A => self.a.handle_datagram(self.now, from_addr, &bytes),
                R => {
                    let start = Instant::now();
                    self.r.handle_datagram(self.now, from_addr, &bytes);
                    self.relay_time += start.elapsed();
                    self.relay_packets += 1;
                }
                _ => self.b.handle_datagram(self.now, from_addr, &bytes),
            }
            self.drain(to);
        }
    }
}

/// Runs `messages` messages of `size` bytes through the relay in `mode`; returns
/// (messages delivered per second of relay time, relay packets per second of relay time).
fn measure(mode: Mode, messages: usize, size: usize) -> (f64, f64, u64) {
    let mut run = Run::new(1 << 14);
    let b = addr(B);
    run.a.connect(run.now, b, Some(addr(R)));
    run.drain(A);
    run.settle();
    let assoc = run.a.open(run.now, b, mode).expect("open");
    run.drain(A);
    run.settle();
    // Only the data phase counts.
    run.relay_time = Duration::ZERO;
    run.relay_packets = 0;
    let payload = vec![0x5a; size];
    let batch = usize::from(mode.batch()).max(1) * 4;
    let mut sent = 0;
    while sent < messages {
        for _ in 0..batch.min(messages - sent) {
            run.a.send(run.now, b, assoc, &payload).expect("send");
            sent += 1;
        }
        run.drain(A);
        run.settle();
    }
    for _ in 0..100 {
        run.settle();
        run.now += Duration::from_millis(5);
        run.a.handle_timeout(run.now);
        run.drain(A);
    }
    let secs = run.relay_time.as_secs_f64();
    (
        run.delivered as f64 / secs,
        run.relay_packets as f64 / secs,
        run.delivered,
    )
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let messages = arg("--messages", 100_000);
    let size = arg("--size", 1300);
    println!("relay verification, one core, {messages} messages of {size} bytes per mode");
    println!(
        "{:<8} {:>14} {:>16} {:>10} {:>10}",
        "mode", "msgs/s", "relay pkts/s", "delivered", "vs none"
    );
    let (base, base_pkts, delivered) = measure(Mode::Unprotected, messages, size);
    println!(
        "{:<8} {:>14.0} {:>16.0} {:>10} {:>10.2}",
        "none", base, base_pkts, delivered, 1.0
    );
    for mode in [
        Mode::N,
        Mode::C { batch: 32 },
        Mode::M { batch: 32 },
        Mode::M { batch: 256 },
    ] {
        let (rate, pkts, delivered) = measure(mode, messages, size);
        println!(
            "{:<8} {:>14.0} {:>16.0} {:>10} {:>10.2}",
            mode.to_string(),
            rate,
            pkts,
            delivered,
            rate / base
        );
    }
}
