//! The simulator pieces that the tests, the benchmark and the example share: deterministic
//! identities and KDC principals, a member (watched) or the KDC as a simulator node, and the
//! clocks and statistics the measurements print.
//!
//! Owns only these pieces. It is `support::kit` for the tests and is included by path
//! (`#[path = "../tests/support/kit.rs"] mod kit;`) by `benches/group_scaling.rs` and
//! `examples/rekey_scale.rs`, so it must not touch the rest of `tests/support` nor any one
//! target's harness, and may use only crates all three targets have.
#![allow(dead_code)] // reason: each target that includes it uses a part of it

use cohort_channel::identity::Identity;
use cohort_core::{Machine, Timestamp, Transmit};
use cohort_crypto::{CryptoProvider, Secret};
use cohort_group::{GroupConfig, GroupEvent, GroupMember};
use cohort_kdc::{Kdc, PrincipalKey, PrincipalName, Registry};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

// ------------------------------------------------------------------------ crypto and who is who

/// The crypto provider of every simulated member and KDC: the default one, except that key
/// generation, encapsulation and its random source draw from this thread's seeded stream
/// (`cohort_crypto::seeded`). With [`seed_crypto`] called at the start of a run, the run
/// replays byte for byte, tampered key shares included.
pub fn provider() -> CryptoProvider {
    cohort_crypto::seeded::seeded_provider()
}

/// Restarts this thread's seeded crypto stream for a run seeded with `seed`.
pub fn seed_crypto(seed: u64) {
    cohort_crypto::seeded::seed_thread(seed);
}

/// Member `i`'s identity in a run seeded with `seed` (the same in every run of that seed).
#[allow(clippy::expect_used)] // reason: a fixed 32-byte secret always makes an identity
pub fn identity(seed: u64, i: usize) -> Identity {
    let provider = CryptoProvider::default_provider();
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8..16].copy_from_slice(&(i as u64).to_le_bytes());
    bytes[16] = 0x5a;
    Identity::from_secret(&provider, Secret::from_slice(&bytes)).expect("identity")
}

/// KDC mode: the name of principal `i` (`m0`, `m1`, ...).
#[allow(clippy::expect_used)] // reason: `m<number>` is always a valid name
pub fn principal_name(i: usize) -> PrincipalName {
    PrincipalName::new(&format!("m{i}")).expect("name")
}

/// KDC mode: the long-term keys of principals `0..n` in a run seeded with `seed`.
pub fn principal_keys(seed: u64, n: usize) -> Vec<PrincipalKey> {
    let mut keys_rng = ChaCha20Rng::seed_from_u64(seed ^ 0x6b6463);
    (0..n)
        .map(|_| {
            let mut b = [0u8; 32];
            keys_rng.fill_bytes(&mut b);
            PrincipalKey::from_bytes(b)
        })
        .collect()
}

// ------------------------------------------------------------------------------ nodes

/// What a [`MemberNode`] does with each datagram its member sends.
pub trait SendWatch {
    /// `t` was just sent; `buf` is the buffer the simulator handed to `poll_transmit`.
    fn sent(&mut self, t: &Transmit, buf: &[u8]);
}

/// A group member as a simulator node, with a watch on what it sends.
pub struct MemberNode<W> {
    pub member: GroupMember,
    pub watch: W,
}

impl<W> MemberNode<W> {
    /// A member with `identity` at `addr` under the simulation's [`provider`].
    #[allow(clippy::expect_used)] // reason: the tests' and benchmarks' configs are valid
    pub fn new(
        identity: Identity,
        addr: SocketAddr,
        config: GroupConfig,
        seed: [u8; 32],
        watch: W,
    ) -> MemberNode<W> {
        MemberNode {
            member: GroupMember::new(provider(), identity, addr, config, seed).expect("member"),
            watch,
        }
    }
}

impl<W: SendWatch> Machine for MemberNode<W> {
    type Event = GroupEvent;
    fn handle_datagram(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        self.member.handle_datagram(now, from, data);
    }
    fn handle_timeout(&mut self, now: Timestamp) {
        self.member.handle_timeout(now);
    }
    fn poll_transmit(&mut self, now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
        let t = self.member.poll_transmit(now, buf)?;
        self.watch.sent(&t, buf);
        Some(t)
    }
    fn poll_timeout(&self) -> Option<Timestamp> {
        self.member.poll_timeout()
    }
    fn poll_event(&mut self) -> Option<GroupEvent> {
        self.member.poll_event()
    }
}

/// The KDC as a simulator node: it answers each request to its sender.
pub struct KdcNode {
    pub kdc: Kdc,
    out: VecDeque<(SocketAddr, Vec<u8>)>,
}

/// A group member or the KDC, as one simulator machine (the KDC has no timers and no
/// events).
pub enum MemberOrKdc {
    Member(Box<GroupMember>),
    Kdc(Box<KdcNode>),
}

impl MemberOrKdc {
    /// A KDC (the simulation's [`provider`]) that knows the principals of `registry`.
    pub fn kdc(registry: Registry) -> MemberOrKdc {
        MemberOrKdc::Kdc(Box::new(KdcNode {
            kdc: Kdc::new(provider(), registry),
            out: VecDeque::new(),
        }))
    }

    /// The member. Callers ask only member nodes: the KDC panics.
    pub fn member(&self) -> &GroupMember {
        match self {
            MemberOrKdc::Member(m) => m,
            MemberOrKdc::Kdc(_) => unreachable!("a member index"),
        }
    }

    /// The member. Callers ask only member nodes: the KDC panics.
    pub fn member_mut(&mut self) -> &mut GroupMember {
        match self {
            MemberOrKdc::Member(m) => m,
            MemberOrKdc::Kdc(_) => unreachable!("a member index"),
        }
    }
}

impl Machine for MemberOrKdc {
    type Event = GroupEvent;
    fn handle_datagram(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        match self {
            MemberOrKdc::Member(m) => m.handle_datagram(now, from, data),
            MemberOrKdc::Kdc(k) => {
                if let Some(reply) = k.kdc.handle_request(from, data) {
                    k.out.push_back((from, reply));
                }
            }
        }
    }
    fn handle_timeout(&mut self, now: Timestamp) {
        if let MemberOrKdc::Member(m) = self {
            m.handle_timeout(now);
        }
    }
    fn poll_transmit(&mut self, now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
        match self {
            MemberOrKdc::Member(m) => m.poll_transmit(now, buf),
            MemberOrKdc::Kdc(k) => {
                let (destination, d) = k.out.pop_front()?;
                buf.extend_from_slice(&d);
                Some(Transmit {
                    destination,
                    size: d.len(),
                })
            }
        }
    }
    fn poll_timeout(&self) -> Option<Timestamp> {
        match self {
            MemberOrKdc::Member(m) => m.poll_timeout(),
            MemberOrKdc::Kdc(_) => None,
        }
    }
    fn poll_event(&mut self) -> Option<GroupEvent> {
        match self {
            MemberOrKdc::Member(m) => m.poll_event(),
            MemberOrKdc::Kdc(_) => None,
        }
    }
}

// ------------------------------------------------------------------------------ measuring

/// The real clock, for the wall-clock columns only: the simulated members never see it (the
/// workspace forbids `Instant::now` in protocol cores, which take `now` from the caller).
#[allow(clippy::disallowed_methods)]
pub fn wall_now() -> Instant {
    Instant::now()
}

/// This thread's CPU time so far (`clock_gettime(CLOCK_THREAD_CPUTIME_ID)`: exact to the
/// nanosecond, unlike `/proc/thread-self/schedstat`, which moves in scheduler ticks). One
/// system call, no file to open: cheap enough to read around every call of one member.
pub fn thread_cpu() -> Option<Duration> {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    let secs = u64::try_from(t.tv_sec).ok()?;
    let nanos = u32::try_from(t.tv_nsec).ok()?;
    Some(Duration::new(secs, nanos))
}

/// Milliseconds, as a float.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The median (of an even count, the mean of the middle two); `None` if empty.
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    Some(if v.len().is_multiple_of(2) {
        (v[m - 1] + v[m]) / 2.0
    } else {
        v[m]
    })
}

/// `v` with `digits` decimals, or `-`.
pub fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}
