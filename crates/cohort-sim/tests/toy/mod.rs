//! A toy core for the simulator's tests: it sends what it is told, reports what it receives,
//! can tick on a timer, and can gossip a counter to random peers on each tick.
#![allow(dead_code, reason = "each test file uses a different part of the toy")]

use cohort_core::{Machine, Timestamp, Transmit};
use cohort_sim::{rand_core::RngCore, SimRng};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

/// What the toy reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToyEvent {
    /// A datagram arrived.
    Got { from: SocketAddr, data: Vec<u8> },
    /// The tick timer fired for the `n`-th time.
    Tick { n: u32 },
    /// Gossip taught the node a larger counter.
    Learned { value: u64 },
}

/// The toy core.
#[derive(Debug)]
pub struct Toy {
    pub addr: SocketAddr,
    out: VecDeque<(SocketAddr, Vec<u8>)>,
    events: VecDeque<ToyEvent>,
    /// Next tick and the period.
    tick: Option<(Timestamp, Duration)>,
    pub ticks: u32,
    /// Answer `?...` with `!...`.
    pub echo: bool,
    /// Send every datagram straight back (to make livelocks).
    pub bounce: bool,
    peers: Vec<SocketAddr>,
    pub counter: u64,
    rng: Option<SimRng>,
    /// Everything received: when, from whom, what.
    pub received: Vec<(Timestamp, SocketAddr, Vec<u8>)>,
}

impl Toy {
    pub fn new(addr: SocketAddr) -> Self {
        Toy {
            addr,
            out: VecDeque::new(),
            events: VecDeque::new(),
            tick: None,
            ticks: 0,
            echo: false,
            bounce: false,
            peers: Vec::new(),
            counter: 0,
            rng: None,
            received: Vec::new(),
        }
    }

    /// A toy that gossips its counter to one random peer per tick.
    pub fn gossip(addr: SocketAddr, peers: Vec<SocketAddr>, rng: SimRng) -> Self {
        Toy {
            peers,
            rng: Some(rng),
            ..Toy::new(addr)
        }
    }

    /// This toy answering `?...` with `!...`.
    pub fn echoing(self) -> Self {
        Toy { echo: true, ..self }
    }

    /// This toy sending every datagram straight back.
    pub fn bouncing(self) -> Self {
        Toy {
            bounce: true,
            ..self
        }
    }

    /// Command: send `data` to `to`.
    pub fn send(&mut self, to: SocketAddr, data: &[u8]) {
        self.out.push_back((to, data.to_vec()));
    }

    /// Command: tick every `period`, first at `now + period`.
    pub fn start_ticking(&mut self, now: Timestamp, period: Duration) {
        self.tick = Some((now + period, period));
    }

    /// Command: stop ticking.
    pub fn stop_ticking(&mut self) {
        self.tick = None;
    }
}

impl Machine for Toy {
    type Event = ToyEvent;

    fn handle_datagram(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        self.received.push((now, from, data.to_vec()));
        self.events.push_back(ToyEvent::Got {
            from,
            data: data.to_vec(),
        });
        if self.bounce {
            self.out.push_back((from, data.to_vec()));
        }
        if self.echo && data.first() == Some(&b'?') {
            let mut reply = data.to_vec();
            reply[0] = b'!';
            self.out.push_back((from, reply));
        }
        if let [b'G', rest @ ..] = data {
            if let Ok(bytes) = <[u8; 8]>::try_from(rest) {
                let value = u64::from_be_bytes(bytes);
                if value > self.counter {
                    self.counter = value;
                    self.events.push_back(ToyEvent::Learned { value });
                }
            }
        }
    }

    fn handle_timeout(&mut self, now: Timestamp) {
        let Some((at, period)) = self.tick else {
            return;
        };
        if now < at {
            return; // early wake-up: harmless
        }
        self.tick = Some((at + period, period));
        self.ticks += 1;
        self.events.push_back(ToyEvent::Tick { n: self.ticks });
        if let Some(rng) = &mut self.rng {
            if !self.peers.is_empty() {
                self.counter += 1;
                let peer = self.peers[(rng.next_u32() as usize) % self.peers.len()];
                let mut msg = vec![b'G'];
                msg.extend_from_slice(&self.counter.to_be_bytes());
                self.out.push_back((peer, msg));
            }
        }
    }

    fn poll_transmit(&mut self, _now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
        let (destination, data) = self.out.pop_front()?;
        buf.extend_from_slice(&data);
        Some(Transmit {
            destination,
            size: data.len(),
        })
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        self.tick.map(|(at, _)| at)
    }

    fn poll_event(&mut self) -> Option<ToyEvent> {
        self.events.pop_front()
    }
}

/// Payloads a node received, in arrival order.
pub fn payloads(sim: &cohort_sim::Sim<Toy>, id: cohort_sim::NodeId) -> Vec<Vec<u8>> {
    sim.node(id)
        .received
        .iter()
        .map(|(_, _, d)| d.clone())
        .collect()
}

/// A sim of `n` plain toys.
pub fn plain(config: cohort_sim::SimConfig, n: usize) -> cohort_sim::Sim<Toy> {
    let mut sim = cohort_sim::Sim::new(config);
    for _ in 0..n {
        sim.add_node_with(|_, addr| Toy::new(addr));
    }
    sim
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn at_ms(n: u64) -> Timestamp {
    Timestamp::from_millis(n)
}
