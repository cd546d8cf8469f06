//! A path of endpoints and relays in the simulator: `A - R1 - ... - Rk - B`, where only
//! neighbours can reach each other.

#![allow(dead_code)] // each test file uses part of the harness

use cohort_channel::identity::Identity;
use cohort_core::Timestamp;
use cohort_crypto::{CryptoProvider, Secret};
use cohort_hop::{
    AssocId, Endpoint, EndpointConfig, EndpointEvent, HopEvent, HopNode, Mode, Relay, RelayConfig,
};
use cohort_sim::{FnRule, NodeId, Sim, SimConfig, SimFailure, Verdict};
use std::net::SocketAddr;
use std::time::Duration;

/// A deterministic identity for node `n` of seed `seed`.
pub fn identity(seed: u64, n: u8) -> Identity {
    let mut secret = [n; 32];
    secret[..8].copy_from_slice(&seed.to_be_bytes());
    Identity::from_secret(
        &CryptoProvider::default_provider(),
        Secret::new(secret.to_vec()),
    )
    .expect("identity")
}

/// The path.
pub struct Path {
    pub sim: Sim<HopNode>,
    pub a: NodeId,
    pub b: NodeId,
    pub relays: Vec<NodeId>,
    /// Each node's configuration, to restart it with fresh state (A, relays, B).
    configs: Vec<NodeConfig>,
    /// Restarts so far (each restarted endpoint gets a fresh RNG seed).
    restarts: u8,
}

/// What a node was made from.
#[derive(Clone)]
enum NodeConfig {
    Endpoint(EndpointConfig),
    Relay(RelayConfig),
}

impl Path {
    /// `A - R1 .. Rk - B`; `tweak` adjusts both endpoints' configs.
    pub fn new(seed: u64, relays: usize, tweak: impl Fn(&mut EndpointConfig)) -> Path {
        Self::with_sim(
            SimConfig {
                seed,
                latency: Duration::from_millis(5),
                ..SimConfig::default()
            },
            relays,
            tweak,
        )
    }

    /// As [`Path::new`] with a given simulator configuration.
    pub fn with_sim(config: SimConfig, relays: usize, tweak: impl Fn(&mut EndpointConfig)) -> Path {
        let seed = config.seed;
        let mut sim = Sim::new(config);
        let provider = CryptoProvider::default_provider();
        let n = relays + 2;
        let addr = |i: usize| NodeId::from_index(i).addr();
        let a_addr = addr(0);
        let b_addr = addr(n - 1);
        let mut ids = Vec::new();
        let mut configs = Vec::new();
        for i in 0..n {
            let node = if i == 0 || i == n - 1 {
                let mut config = EndpointConfig::new(identity(seed, i as u8));
                tweak(&mut config);
                configs.push(NodeConfig::Endpoint(config.clone()));
                let mut rng_seed = [i as u8; 32];
                rng_seed[..8].copy_from_slice(&seed.to_le_bytes());
                HopNode::Endpoint(Endpoint::new(config, provider, addr(i), rng_seed))
            } else {
                let mut config = RelayConfig::new();
                // Toward B: the next relay (or B itself); toward A: the previous one.
                if i + 1 < n - 1 {
                    config.routes.push((b_addr, addr(i + 1)));
                }
                if i > 1 {
                    config.routes.push((a_addr, addr(i - 1)));
                }
                configs.push(NodeConfig::Relay(config.clone()));
                HopNode::Relay(Relay::new(config, provider, addr(i)))
            };
            ids.push(sim.add_node(node));
        }
        // Only neighbours on the path hear each other.
        sim.add_rule(FnRule::new(
            "path",
            |p: &cohort_sim::PacketView<'_>, _rng: &mut dyn rand_core::RngCore| {
                let (f, t) = (p.from.index(), p.to.index());
                if f.abs_diff(t) == 1 {
                    Verdict::Pass
                } else {
                    Verdict::Drop
                }
            },
        ));
        Path {
            sim,
            a: ids[0],
            b: ids[n - 1],
            relays: ids[1..n - 1].to_vec(),
            configs,
            restarts: 0,
        }
    }

    /// Replaces node `id` with a fresh one (a process restart: all state gone, the same
    /// configuration and identity, for an endpoint a new RNG seed). A restarted A connects
    /// to B again, as an application does when it starts.
    pub fn restart(&mut self, id: NodeId) {
        let provider = CryptoProvider::default_provider();
        let addr = self.addr(id);
        self.restarts = self.restarts.wrapping_add(1);
        let node = match self.configs[id.index()].clone() {
            NodeConfig::Endpoint(config) => {
                let mut rng_seed = [0xEE; 32];
                rng_seed[..8].copy_from_slice(&self.sim.seed().to_le_bytes());
                rng_seed[8] = id.index() as u8;
                rng_seed[9] = self.restarts;
                HopNode::Endpoint(Endpoint::new(config, provider, addr, rng_seed))
            }
            NodeConfig::Relay(config) => HopNode::Relay(Relay::new(config, provider, addr)),
        };
        self.sim.restart(id, node);
        if id == self.a {
            let b = self.addr(self.b);
            let via = self.relays.first().map(|&r| self.addr(r));
            self.sim.with_node(self.a, |n, now| {
                n.endpoint_mut().expect("A").connect(now, b, via)
            });
        }
    }

    /// What an application does after a `Connected`: if A is connected to B and has no
    /// outgoing association (open or opening), it opens one in `mode`.
    pub fn keep_open(&mut self, mode: Mode) {
        let b = self.addr(self.b);
        self.sim.with_node(self.a, |n, now| {
            let e = n.endpoint_mut().expect("A");
            let has_one = e
                .status()
                .peers
                .iter()
                .any(|p| p.addr == b && p.associations.iter().any(|x| x.outgoing && x.id != 0));
            if e.is_connected(b) && !has_one {
                let _ = e.open(now, b, mode);
            }
        });
    }

    /// A sends `data` on any open association to B; false if none is open.
    pub fn send_any(&mut self, data: &[u8]) -> bool {
        let b_addr = self.addr(self.b);
        self.sim.with_node(self.a, |n, now| {
            n.endpoint_mut()
                .expect("A")
                .send_any(now, b_addr, data)
                .is_ok()
        })
    }

    /// Runs for `d` in steps of 50 ms, keeping an association of `mode` open at A.
    pub fn run_keeping_open(&mut self, mode: Mode, d: Duration) -> Result<(), SimFailure> {
        let end = self.sim.now() + d;
        while self.sim.now() < end {
            self.keep_open(mode);
            self.sim.run_for(Duration::from_millis(50))?;
        }
        Ok(())
    }

    pub fn addr(&self, id: NodeId) -> SocketAddr {
        self.sim.addr(id)
    }

    /// A connects to B through the first relay and both wait for Connected.
    pub fn connect(&mut self) -> Result<(), SimFailure> {
        let b = self.addr(self.b);
        let via = self.relays.first().map(|&r| self.addr(r));
        self.sim.with_node(self.a, |n, now| {
            n.endpoint_mut().expect("A").connect(now, b, via)
        });
        let (a, b) = (self.a, self.b);
        let (a_addr, b_addr) = (self.addr(a), self.addr(b));
        self.sim.run_until_cond(Duration::from_secs(30), |s| {
            s.node(a).endpoint().is_some_and(|e| e.is_connected(b_addr))
                && s.node(b).endpoint().is_some_and(|e| e.is_connected(a_addr))
        })?;
        Ok(())
    }

    /// A opens an association to B in `mode` and waits until it is open at both ends.
    pub fn open(&mut self, mode: Mode) -> Result<AssocId, SimFailure> {
        let b_addr = self.addr(self.b);
        let assoc = self
            .sim
            .with_node(self.a, |n, now| {
                n.endpoint_mut().expect("A").open(now, b_addr, mode)
            })
            .map_err(|e| self.sim.failure(format!("open: {e}")))?;
        let a = self.a;
        self.sim.run_until_cond(Duration::from_secs(30), |s| {
            s.node(a)
                .endpoint()
                .is_some_and(|e| e.open_associations(b_addr).contains(&assoc))
        })?;
        Ok(assoc)
    }

    /// A sends `data` on `assoc`.
    pub fn send(&mut self, assoc: AssocId, data: &[u8]) -> bool {
        let b_addr = self.addr(self.b);
        self.sim.with_node(self.a, |n, now| {
            n.endpoint_mut()
                .expect("A")
                .send(now, b_addr, assoc, data)
                .is_ok()
        })
    }

    /// Runs until A has nothing queued and nothing awaiting an acknowledgment on any
    /// association, for at most `limit` of virtual time.
    pub fn drain(&mut self, limit: Duration) -> Result<(), SimFailure> {
        let a = self.a;
        self.sim.run_until_cond(limit, |s| {
            s.node(a).endpoint().is_some_and(|e| {
                e.status().peers.iter().all(|p| {
                    p.associations
                        .iter()
                        .all(|x| x.queued == 0 && x.awaiting_ack.is_none())
                })
            })
        })?;
        Ok(())
    }

    /// Messages B received, in order.
    pub fn received_at_b(&self) -> Vec<Vec<u8>> {
        self.received_at(self.b)
    }

    /// Messages a node received, in order.
    pub fn received_at(&self, id: NodeId) -> Vec<Vec<u8>> {
        self.sim
            .events_of(id)
            .filter_map(|(_, e)| match e {
                HopEvent::Endpoint(EndpointEvent::Received { data, .. }) => Some(data.clone()),
                _ => None,
            })
            .collect()
    }

    pub fn now(&self) -> Timestamp {
        self.sim.now()
    }
}
