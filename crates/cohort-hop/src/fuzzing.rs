//! Harnesses shared by the fuzz targets (`fuzz/fuzz_targets/hop_*.rs`) and the property
//! tests (`tests/fuzz_harness.rs`): one function per parser or state machine, taking
//! arbitrary bytes. None panics on any input except through its own assertions, which are
//! the properties the fuzzer checks (a failed one is a finding); each returns what the tests
//! assert on.
//!
//! Everything is deterministic: identities come from fixed secrets, endpoints from fixed
//! seeds, and time is virtual, so [`HopPair::new`] builds the same pair (same pair id, same
//! chains, same packets) in every run and every build. The harnesses therefore check
//! against what the pair's endpoints actually produced in the run: a datagram that a relay
//! forwards must be one an endpoint sent, a message an endpoint delivers must be one the
//! other was asked to send. (A corpus seeded with packets from a *longer* run of the same
//! pair could hold genuine packets of later rounds, which a relay rightly forwards; the
//! targets' own inputs and captures never do.)
//!
//! Not part of the crate's API: it exists for the fuzzers and the tests, and is compiled only
//! with the cargo feature `fuzzing` (`fuzz/Cargo.toml` and this crate's own dev-dependency on
//! itself turn it on).

use crate::event::{AssocId, EndpointEvent, HopCounters};
use crate::wire::{kind, Control, Packet};
use crate::{Endpoint, EndpointConfig, Mode, Relay, RelayConfig};
use cohort_channel::identity::Identity;
use cohort_core::{Machine, Timestamp};
use cohort_crypto::{CryptoError, CryptoProvider, Secret, SignatureScheme};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Endpoint A, the initiator (and the only sender of data).
pub const ADDR_A: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 7000);
/// Endpoint B, the responder.
pub const ADDR_B: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), 7000);
/// The relay between them, when there is one.
pub const ADDR_R: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3)), 7000);
/// An address outside the pair.
pub const ADDR_STRANGER: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 99)), 7000);
/// A's first association.
pub const MODE_M: Mode = Mode::M { batch: 4 };
/// A's second association.
pub const MODE_C: Mode = Mode::C { batch: 4 };
/// Messages A sends on each association while the pair is set up (two rounds each, the
/// second one short).
pub const SETUP_MESSAGES: usize = 6;
/// Rounds per chain: few enough that set-up renews chains.
const CHAIN_ROUNDS: u32 = 4;
/// The time every harness starts at.
const START: Timestamp = Timestamp::from_millis(1_000);
/// Most datagrams one input is split into.
const MAX_DATAGRAMS: usize = 16;
/// Most timer steps a harness runs (a bound against a timer that never moves forward).
const MAX_STEPS: usize = 2_000;
/// Most datagrams one [`HopPair::pump`] delivers (a bound against a ping-pong).
const MAX_DELIVERIES: usize = 20_000;

/// Unwraps harness set-up that cannot fail with the default provider; a failure is a bug
/// the fuzzer should report loudly.
#[allow(clippy::expect_used)] // reason: see above; this is test tooling
fn must<T, E: std::fmt::Debug>(r: Result<T, E>, what: &str) -> T {
    r.expect(what)
}

/// The provider every harness builds its nodes with: the default one, with Ed25519
/// remembered ([`MemoEd25519`]).
pub fn provider() -> CryptoProvider {
    CryptoProvider {
        ed25519: &MEMO_ED25519,
        ..CryptoProvider::default_provider()
    }
}

// ------------------------------------------------------------------- memoized Ed25519

/// Most results [`MemoEd25519`] keeps of each kind. When a table is full it starts again
/// empty (the pair's own signatures come back with the next input), so a long fuzzing run,
/// whose forged signatures are mostly new, does not grow without bound.
pub const MEMO_CAP: usize = 4_096;

/// A table of remembered results (errors too, for verification), bounded by [`MEMO_CAP`].
/// (A hash map: a B-tree's comparisons of long keys sharing long prefixes were 7% of
/// `hop_mutate`.)
type Memo<K, V> = Mutex<Option<HashMap<K, Result<V, CryptoError>>>>;
/// SHA-256 of a seed, and a message.
type SignKey = ([u8; 32], Vec<u8>);
/// Public key, message, signature.
type VerifyKey = (Vec<u8>, Vec<u8>, Vec<u8>);

/// The default provider's Ed25519 with every result remembered: an input it has seen gets
/// the result the default provider gave the first time, without running it again. Ed25519
/// signing, verifying and key derivation are pure functions of their inputs, so the
/// results are the same bytes (`tests/fuzz_harness.rs` checks the memo against the default
/// provider, and a pair built with each).
///
/// Why: every input of the hop targets makes the pair sign and check the same renewals,
/// and a live `hop_mutate` input re-runs the signed handshake; checking those signatures
/// again was over half of `hop_endpoint`'s time. What the harnesses check is cohort-hop:
/// every call into the scheme is still made, and a signature no input gave before (a
/// fuzzed one) still goes to aws-lc.
///
/// Secrets are keyed by their SHA-256, not kept: the harnesses' identities are fixed test
/// secrets, but a table of seeds would still be a copy of them.
pub struct MemoEd25519 {
    /// (SHA-256 of the seed) -> public key.
    public: Memo<[u8; 32], Vec<u8>>,
    /// (SHA-256 of the seed, message) -> signature.
    signed: Memo<SignKey, Vec<u8>>,
    /// (public key, message, signature) -> whether it verified.
    verified: Memo<VerifyKey, ()>,
}

/// The one [`MemoEd25519`] ([`provider`]'s).
pub static MEMO_ED25519: MemoEd25519 = MemoEd25519 {
    public: Mutex::new(None),
    signed: Mutex::new(None),
    verified: Mutex::new(None),
};

impl MemoEd25519 {
    fn real() -> &'static dyn SignatureScheme {
        CryptoProvider::default_provider().ed25519
    }

    fn seed_digest(secret: &Secret) -> [u8; 32] {
        CryptoProvider::default_provider()
            .sha256
            .sha256(&[secret.expose()])
    }

    /// The remembered result for `key`, or `compute`'s, remembered if it is `Ok` (or if
    /// `keep_errors`).
    fn remembered<K: Hash + Eq, V: Clone>(
        table: &Memo<K, V>,
        key: K,
        compute: impl FnOnce() -> Result<V, CryptoError>,
        keep_errors: bool,
    ) -> Result<V, CryptoError> {
        // A poisoned lock only means a panic elsewhere (a finding being reported); the
        // table itself is still whole.
        let mut guard = table.lock().unwrap_or_else(|e| e.into_inner());
        let t = guard.get_or_insert_with(HashMap::new);
        if let Some(v) = t.get(&key) {
            return v.clone();
        }
        let v = compute();
        if v.is_ok() || keep_errors {
            if t.len() >= MEMO_CAP {
                t.clear();
            }
            t.insert(key, v.clone());
        }
        v
    }

    /// How many results are remembered: (public keys, signatures, verifications).
    pub fn sizes(&self) -> (usize, usize, usize) {
        fn len<K, V>(t: &Memo<K, V>) -> usize {
            let t = t.lock().unwrap_or_else(|e| e.into_inner());
            t.as_ref().map_or(0, HashMap::len)
        }
        (len(&self.public), len(&self.signed), len(&self.verified))
    }
}

impl SignatureScheme for MemoEd25519 {
    /// Not remembered: fresh randomness every time.
    fn generate(&self) -> Result<(Secret, Vec<u8>), CryptoError> {
        Self::real().generate()
    }

    fn public_key(&self, secret: &Secret) -> Result<Vec<u8>, CryptoError> {
        let key = Self::seed_digest(secret);
        Self::remembered(&self.public, key, || Self::real().public_key(secret), false)
    }

    fn sign(&self, secret: &Secret, message: &[u8]) -> Result<Vec<u8>, CryptoError> {
        let key = (Self::seed_digest(secret), message.to_vec());
        Self::remembered(
            &self.signed,
            key,
            || Self::real().sign(secret, message),
            false,
        )
    }

    fn verify(&self, public: &[u8], message: &[u8], signature: &[u8]) -> Result<(), CryptoError> {
        let key = (public.to_vec(), message.to_vec(), signature.to_vec());
        Self::remembered(
            &self.verified,
            key,
            || Self::real().verify(public, message, signature),
            true,
        )
    }
}

/// The fixed identity number `i` (0 is A, 1 is B).
pub fn identity(i: u8) -> Identity {
    identity_with(i, &provider())
}

/// [`identity`], made with `provider`.
fn identity_with(i: u8, provider: &CryptoProvider) -> Identity {
    let mut secret = [0x68; 32];
    secret[0] = i;
    must(
        Identity::from_secret(provider, Secret::from_slice(&secret)),
        "identity from a fixed secret",
    )
}

/// Splits `data` into at most 16 datagrams: each is `length (u16 BE) | bytes`; a length
/// beyond the end takes what remains.
pub fn split_datagrams(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    while rest.len() >= 2 && out.len() < MAX_DATAGRAMS {
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        let body = &rest[2..];
        let take = len.min(body.len());
        out.push(&body[..take]);
        rest = &body[take..];
    }
    out
}

/// The inverse of [`split_datagrams`], for building inputs.
pub fn join_datagrams<'a>(datagrams: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    for d in datagrams {
        let len = d.len().min(usize::from(u16::MAX));
        out.extend_from_slice(&(len as u16).to_be_bytes());
        out.extend_from_slice(&d[..len]);
    }
    out
}

/// Sum of the drop counters (everything from the network that was not used).
pub fn drops(c: &HopCounters) -> u64 {
    c.malformed
        + c.unknown
        + c.forged
        + c.replayed
        + c.stale
        + c.unverifiable
        + c.bad_cookie
        + c.untrusted
        + c.no_room
}

/// Whether `data` is a packet of the return-routability exchange, which relays forward by
/// its header alone, holding no state (Hello, Challenge, SYN): the responder checks the
/// cookie, then the SYN's signature, before anything is stored anywhere.
pub fn stateless_kind(data: &[u8]) -> bool {
    matches!(
        Packet::parse(data),
        Ok(Packet::Hello(_) | Packet::Challenge { .. } | Packet::Syn { .. })
    )
}

// ------------------------------------------------------------------------------- codecs

/// Arbitrary bytes as a [`Packet`] and as a [`Control`] message: parsing must not panic,
/// and what parses must survive a round trip (`parse(write(p)) == p`) and re-encode to the
/// input itself (the formats are canonical, except a Hello's zero padding, which is
/// re-encoded to the minimum). Returns whether each parsed.
pub fn packet(data: &[u8]) -> (bool, bool) {
    let packet = Packet::parse(data).ok();
    if let Some(p) = &packet {
        let mut out = Vec::new();
        p.write(&mut out);
        assert_eq!(Packet::parse(&out).as_ref(), Ok(p), "Packet round trip");
        if let Packet::Hello(_) = p {
            assert!(
                out.len() <= data.len()
                    && out == data[..out.len()]
                    && data[out.len()..].iter().all(|&b| b == 0),
                "Hello re-encoding is not the input without extra padding"
            );
        } else {
            assert_eq!(out, data, "Packet encoding is not canonical");
        }
        // The accessors agree with the kind.
        assert!(
            p.flow_header().is_none() || p.handshake_header().is_none(),
            "a packet has at most one kind of header"
        );
    }
    let control = Control::parse(data).ok();
    if let Some(c) = &control {
        let mut out = Vec::new();
        c.write(&mut out);
        assert_eq!(Control::parse(&out).as_ref(), Ok(c), "Control round trip");
        assert_eq!(out, data, "Control encoding is not canonical");
    }
    (packet.is_some(), control.is_some())
}

// ------------------------------------------------------------------------------- the pair

/// What a relay did with one datagram.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayStep {
    /// Who sent it.
    pub from: SocketAddr,
    /// The datagram.
    pub input: Vec<u8>,
    /// What the relay emitted right after it: (next hop, bytes).
    pub outputs: Vec<(SocketAddr, Vec<u8>)>,
    /// How much the relay's drop counters ([`drops`]) grew.
    pub dropped: u64,
    /// Whether the harness put it in (a mutant or fuzzed bytes) rather than an endpoint.
    pub injected: bool,
}

/// Two endpoints, A at [`ADDR_A`] and B at [`ADDR_B`], connected directly or through a
/// relay at [`ADDR_R`] by an in-memory network with no loss. A opened one association in
/// [`MODE_M`] and one in [`MODE_C`] and sent [`SETUP_MESSAGES`] on each, all delivered.
/// Every datagram an endpoint sends, and everything the relay does, is recorded.
///
/// `Clone` (its endpoints and relay are `Clone` under the `fuzzing` feature), so that the
/// harnesses set a pair up once per process and give every input a copy
/// ([`HopPair::cached`]).
#[derive(Clone)]
pub struct HopPair {
    /// The initiator.
    pub a: Endpoint,
    /// The responder.
    pub b: Endpoint,
    /// The relay, if any.
    pub relay: Option<Relay>,
    /// Virtual time.
    pub now: Timestamp,
    /// A's association in [`MODE_M`].
    pub assoc_m: AssocId,
    /// A's association in [`MODE_C`].
    pub assoc_c: AssocId,
    /// Every datagram A or B sent: (from, to, bytes).
    pub sent: Vec<(SocketAddr, SocketAddr, Vec<u8>)>,
    /// Every datagram the relay got, in order.
    pub relay_steps: Vec<RelayStep>,
    /// A's events.
    pub events_a: Vec<EndpointEvent>,
    /// B's events.
    pub events_b: Vec<EndpointEvent>,
    /// What A was asked to send: (association, message).
    pub payloads: Vec<(AssocId, Vec<u8>)>,
    /// Datagrams in flight: (from, to, bytes).
    queue: VecDeque<(SocketAddr, SocketAddr, Vec<u8>)>,
    /// Datagrams to hand the relay just before its n-th real one (counting from 0).
    inject: BTreeMap<usize, Vec<Vec<u8>>>,
    /// Real datagrams the relay got so far.
    relay_inputs: usize,
    /// The part of the record [`HopPair::check_relay`] has checked already, once for every
    /// copy (a cached pair's set-up, a checkpoint's start): see [`CheckedPrefix`].
    checked: Option<Arc<CheckedPrefix>>,
}

/// The first steps of a pair's record, checked once when the pair was built
/// ([`HopPair::mark_checked`]), so that each copy's [`HopPair::check_relay`] checks only what
/// came after. The copies share these steps byte for byte (the set-up is deterministic and
/// copied), and the check of a step only gets easier as more real datagrams are known, so
/// checking them again for every input could never fail where the first check passed.
/// `tests/fuzz_harness.rs` checks that both checks give the same answer.
struct CheckedPrefix {
    /// Relay steps checked: the first `steps` of `relay_steps`.
    steps: usize,
    /// Datagrams the endpoints had sent by then: the first `sent` of `sent`.
    sent: usize,
    /// Those datagrams.
    real: HashSet<Vec<u8>>,
}

impl HopPair {
    /// The pair, set up and quiet. With `relay`, A reaches B only through the relay. With
    /// `reports`, A's associations ask for A2 delivery reports.
    pub fn new(relay: bool, reports: bool) -> HopPair {
        Self::with_injections(relay, reports, BTreeMap::new())
    }

    /// A copy of `HopPair::new(relay, reports)`, built once per process. The set-up is
    /// deterministic (fixed identities, seeds and virtual time), so the copy is the pair a
    /// fresh `new` builds (`tests/fuzz_harness.rs` checks that), without the handshake,
    /// chain generation and rounds it costs each time.
    pub fn cached(relay: bool, reports: bool) -> HopPair {
        static PAIRS: OnceLock<[HopPair; 4]> = OnceLock::new();
        let pairs = PAIRS.get_or_init(|| {
            [
                HopPair::new(false, false),
                HopPair::new(false, true),
                HopPair::new(true, false),
                HopPair::new(true, true),
            ]
            .map(HopPair::mark_checked)
        });
        pairs[usize::from(relay) * 2 + usize::from(reports)].clone()
    }

    /// The pair, its record so far checked ([`HopPair::check_relay_in_full`]: a finding
    /// panics here) and marked as checked, so that copies check only what follows.
    fn mark_checked(mut self) -> HopPair {
        let forwarded = self.check_relay_in_full(&[]);
        assert_eq!(
            forwarded, 0,
            "set-up: the relay forwarded what no endpoint sent"
        );
        self.checked = Some(Arc::new(CheckedPrefix {
            steps: self.relay_steps.len(),
            sent: self.sent.len(),
            real: self.sent.iter().map(|(_, _, d)| d.clone()).collect(),
        }));
        self
    }

    /// Two fresh endpoints (and the relay between them when `relay`), nothing sent yet,
    /// with `inject` waiting for the relay: the start of [`HopPair::with_injections`] and
    /// of its resumable copy.
    fn unstarted(
        relay: bool,
        reports: bool,
        inject: BTreeMap<usize, Vec<Vec<u8>>>,
        provider: CryptoProvider,
    ) -> HopPair {
        let endpoint = |i: u8, addr: SocketAddr| {
            let mut config = EndpointConfig::new(identity_with(i, &provider));
            config.delivery_reports = reports;
            // Short chains: set-up is cheap, and the data associations renew their chains
            // (signed packets) during it.
            config.chain_rounds = CHAIN_ROUNDS;
            Endpoint::new(config, provider, addr, [0xa0 + i; 32])
        };
        HopPair {
            a: endpoint(0, ADDR_A),
            b: endpoint(1, ADDR_B),
            relay: relay.then(|| Relay::new(RelayConfig::new(), provider, ADDR_R)),
            now: START,
            assoc_m: 0,
            assoc_c: 0,
            sent: Vec::new(),
            relay_steps: Vec::new(),
            events_a: Vec::new(),
            events_b: Vec::new(),
            payloads: Vec::new(),
            queue: VecDeque::new(),
            inject,
            relay_inputs: 0,
            checked: None,
        }
    }

    /// As [`HopPair::new`] with a relay, handing it the datagrams of `inject[n]` (from the
    /// same sender) just before the n-th real datagram it gets, counting from 0 (the
    /// injections do not count). The real run is deterministic, so `n` names the same
    /// packet as in [`captured`].
    pub fn with_injections(
        relay: bool,
        reports: bool,
        inject: BTreeMap<usize, Vec<Vec<u8>>>,
    ) -> HopPair {
        Self::with_provider(relay, reports, inject, provider())
    }

    /// As [`HopPair::with_injections`], the nodes built with `provider` instead of the
    /// harnesses' [`provider`] (for the test that remembering Ed25519 changes nothing).
    pub fn with_provider(
        relay: bool,
        reports: bool,
        inject: BTreeMap<usize, Vec<Vec<u8>>>,
        provider: CryptoProvider,
    ) -> HopPair {
        let mut p = HopPair::unstarted(relay, reports, inject, provider);
        // Injected datagrams may well stop the set-up (a mutated Challenge or S1 arriving
        // first wins: the handshake or a round fails), so only a clean run is checked.
        let clean = p.inject.is_empty();
        let via = relay.then_some(ADDR_R);
        p.a.connect(p.now, ADDR_B, via);
        p.run_for(Duration::from_millis(100));
        assert!(
            !clean || (p.a.is_connected(ADDR_B) && p.b.is_connected(ADDR_A)),
            "set-up: the pair connects"
        );
        let now = p.now;
        let (m, c) = (p.a.open(now, ADDR_B, MODE_M), p.a.open(now, ADDR_B, MODE_C));
        if clean {
            p.assoc_m = must(m, "set-up: open M");
            p.assoc_c = must(c, "set-up: open C");
        } else {
            p.assoc_m = m.unwrap_or(0);
            p.assoc_c = c.unwrap_or(0);
        }
        p.run_for(Duration::from_millis(100));
        for i in 0..SETUP_MESSAGES {
            p.send_both(&format!("setup {i}"));
        }
        p.run_for(Duration::from_millis(500));
        assert!(
            !clean || p.received_at_b().len() == 2 * SETUP_MESSAGES,
            "set-up: B delivers every message"
        );
        p
    }

    /// A sends `tag` (with the association's mode in front) on both associations; whether
    /// both were queued.
    pub fn send_both(&mut self, tag: &str) -> bool {
        let now = self.now;
        let mut ok = true;
        for (assoc, mode) in [(self.assoc_m, "m"), (self.assoc_c, "c")] {
            let data = format!("{mode} {tag}").into_bytes();
            if self.a.send(now, ADDR_B, assoc, &data).is_ok() {
                self.payloads.push((assoc, data));
            } else {
                ok = false;
            }
        }
        self.pump();
        ok
    }

    /// Messages B delivered: (association, message).
    pub fn received_at_b(&self) -> Vec<(AssocId, Vec<u8>)> {
        self.events_b
            .iter()
            .filter_map(|e| match e {
                EndpointEvent::Received { assoc, data, .. } => Some((*assoc, data.clone())),
                _ => None,
            })
            .collect()
    }

    /// Every datagram A or B sent, as a set.
    pub fn real_datagrams(&self) -> HashSet<Vec<u8>> {
        self.sent.iter().map(|(_, _, d)| d.clone()).collect()
    }

    fn collect(&mut self) {
        let now = self.now;
        let mut buf = Vec::new();
        for (node, from) in [(&mut self.a, ADDR_A), (&mut self.b, ADDR_B)] {
            while let Some(t) = node.poll_transmit(now, &mut buf) {
                let d = buf[..t.size].to_vec();
                buf.clear();
                self.sent.push((from, t.destination, d.clone()));
                self.queue.push_back((from, t.destination, d));
            }
        }
        while let Some(e) = self.a.poll_event() {
            self.events_a.push(e);
        }
        while let Some(e) = self.b.poll_event() {
            self.events_b.push(e);
        }
    }

    /// Hands `data` to the node at `to` as a datagram from `from` (nothing if no node is
    /// there), and records what follows, but delivers nothing further.
    pub fn deliver(&mut self, from: SocketAddr, to: SocketAddr, data: &[u8], injected: bool) {
        let now = self.now;
        if to == ADDR_A {
            self.a.handle_datagram(now, from, data);
        } else if to == ADDR_B {
            self.b.handle_datagram(now, from, data);
        } else if to == ADDR_R {
            if !injected {
                if let Some(mutants) = self.inject.remove(&self.relay_inputs) {
                    for m in mutants {
                        self.deliver(from, to, &m, true);
                    }
                }
                self.relay_inputs += 1;
            }
            let Some(relay) = self.relay.as_mut() else {
                return;
            };
            let before = drops(relay.counters());
            relay.handle_datagram(now, from, data);
            let mut outputs = Vec::new();
            let mut buf = Vec::new();
            while let Some(t) = relay.poll_transmit(now, &mut buf) {
                outputs.push((t.destination, buf[..t.size].to_vec()));
                buf.clear();
            }
            while relay.poll_event().is_some() {}
            let dropped = drops(relay.counters()) - before;
            for (dest, bytes) in &outputs {
                self.queue.push_back((ADDR_R, *dest, bytes.clone()));
            }
            self.relay_steps.push(RelayStep {
                from,
                input: data.to_vec(),
                outputs,
                dropped,
                injected,
            });
        }
        self.collect();
    }

    /// Delivers every datagram in flight (and what it causes) until all nodes are quiet.
    pub fn pump(&mut self) {
        self.collect();
        for _ in 0..MAX_DELIVERIES {
            let Some((from, to, data)) = self.queue.pop_front() else {
                return;
            };
            self.deliver(from, to, &data, false);
        }
    }

    /// Runs timers and the network for `d` of virtual time.
    pub fn run_for(&mut self, d: Duration) {
        let until = self.now.saturating_add(d);
        self.pump();
        for _ in 0..MAX_STEPS {
            let next = [self.a.poll_timeout(), self.b.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            let Some(next) = next else { break };
            if next > until {
                break;
            }
            // A timer in the past moves time on by a millisecond, so the loop ends.
            self.now = if next > self.now {
                next
            } else {
                self.now.saturating_add(Duration::from_millis(1))
            };
            let now = self.now;
            self.a.handle_timeout(now);
            self.b.handle_timeout(now);
            self.pump();
        }
        self.now = self.now.max(until);
    }

    /// Checks what B delivered: only messages A was asked to send, on the association A
    /// sent them on, each at most once. Returns how many.
    pub fn check_deliveries(&self) -> usize {
        let received = self.received_at_b();
        let mut seen = HashSet::new();
        for r in &received {
            assert!(
                self.payloads.contains(r),
                "B delivered a message A never sent: {r:?}"
            );
            assert!(seen.insert(r.clone()), "B delivered a message twice: {r:?}");
        }
        for e in &self.events_a {
            assert!(
                !matches!(e, EndpointEvent::Received { .. }),
                "A delivered a message B never sent: {e:?}"
            );
        }
        received.len()
    }

    /// Checks what the relay forwarded: every datagram it emitted is the one it got, and
    /// one that an endpoint sent (or a capture of the real run holds), except handshake
    /// packets relays forward without state ([`stateless_kind`]) and, for an S1 or an A1,
    /// one whose only authenticated field (the chain element, with the flow header) is a
    /// real packet's: the rest of an S1 or A1 cannot be checked until the key or the A2
    /// comes, so the first one to arrive wins (ALPHA's design; the S2s and the A2 then
    /// fail). Returns how many datagrams that were not real it forwarded.
    ///
    /// A copy of a cached pair or of a checkpoint checks only the steps after those checked
    /// when it was built ([`CheckedPrefix`]); [`HopPair::check_relay_in_full`] checks all.
    pub fn check_relay(&self, also_real: &[Vec<u8>]) -> usize {
        self.check_relay_after(also_real, self.checked.as_deref())
    }

    /// [`HopPair::check_relay`] of every step, ignoring what was checked before.
    pub fn check_relay_in_full(&self, also_real: &[Vec<u8>]) -> usize {
        self.check_relay_after(also_real, None)
    }

    fn check_relay_after(&self, also_real: &[Vec<u8>], prefix: Option<&CheckedPrefix>) -> usize {
        let (first_step, first_sent) = prefix.map_or((0, 0), |c| (c.steps, c.sent));
        if self.relay_steps.len() <= first_step {
            // Nothing to check (a pair without a relay, or nothing new): building the sets
            // below was an eighth of `hop_endpoint`'s time.
            return 0;
        }
        // Borrowed, not copied: this set is built for every input. With a prefix, it holds
        // what was sent after it, and the prefix's set the rest.
        let newer: HashSet<&[u8]> = self.sent[first_sent.min(self.sent.len())..]
            .iter()
            .map(|(_, _, d)| d.as_slice())
            .chain(also_real.iter().map(Vec::as_slice))
            .collect();
        let older = prefix.map(|c| &c.real);
        let is_real = |d: &[u8]| newer.contains(d) || older.is_some_and(|o| o.contains(d));
        // Only a forwarded datagram that no endpoint sent needs these; built on the first.
        let mut authenticated: Option<HashSet<Vec<u8>>> = None;
        let mut forwarded = 0;
        let authenticated_of = |newer: &HashSet<&[u8]>| -> HashSet<Vec<u8>> {
            newer
                .iter()
                .copied()
                .chain(older.into_iter().flatten().map(Vec::as_slice))
                .filter_map(s1_a1_core)
                .collect()
        };
        // A1s the relay got that no endpoint sent, with the round's real element.
        let mut got_unreal_a1: HashSet<&[u8]> = HashSet::new();
        for step in &self.relay_steps[first_step..] {
            // Besides forwarding what it got, a relay may send back the A1 of a round it
            // holds when a different S1 for that round arrives (the signer's own,
            // retransmitting): that A1 must be one the verifier sent, or one the relay got
            // earlier with the round's real element (the exception below: it cannot tell it
            // from the verifier's, and holds the first; found by `hop_mutate`, 2026-11-27).
            for (_, out) in &step.outputs {
                assert!(
                    out == &step.input
                        || (out.get(1) == Some(&kind::A1)
                            && (is_real(out) || got_unreal_a1.contains(out.as_slice()))),
                    "the relay emitted a datagram it never got (or an A1 it could not hold)"
                );
            }
            if step.input.get(1) == Some(&kind::A1) && !is_real(&step.input) {
                let authenticated = authenticated.get_or_insert_with(|| authenticated_of(&newer));
                if s1_a1_core(&step.input).is_some_and(|c| authenticated.contains(&c)) {
                    got_unreal_a1.insert(&step.input);
                }
            }
            if !step.outputs.iter().any(|(_, out)| out == &step.input) || is_real(&step.input) {
                continue;
            }
            forwarded += 1;
            let authenticated = authenticated.get_or_insert_with(|| authenticated_of(&newer));
            let core_is_real = s1_a1_core(&step.input).is_some_and(|c| authenticated.contains(&c));
            assert!(
                stateless_kind(&step.input) || core_is_real,
                "the relay forwarded a datagram no endpoint sent: {:02x?}",
                step.input
            );
        }
        forwarded
    }
}

/// An S1's or A1's kind, flow header and chain element (what a hop can check on arrival).
fn s1_a1_core(data: &[u8]) -> Option<Vec<u8>> {
    match Packet::parse(data).ok()? {
        Packet::S1 {
            header, element, ..
        }
        | Packet::A1 {
            header, element, ..
        } => {
            let mut out = vec![data[1]];
            out.extend_from_slice(&header.to_bytes());
            out.extend_from_slice(&element);
            Some(out)
        }
        _ => None,
    }
}

// ------------------------------------------------------------------- resumable set-up

/// One step of [`HopPair::with_injections`]'s script, in order ([`SETUP_SCRIPT`]).
#[derive(Clone, Copy, Debug)]
enum SetupOp {
    /// A connects to B (through the relay, if any).
    Connect,
    /// `run_for` this many milliseconds.
    Run(u64),
    /// A clean run is connected.
    CheckConnected,
    /// A opens the M and the C associations.
    Open,
    /// `send_both("setup {i}")`, with its pump.
    Send(usize),
    /// A clean run delivered every set-up message.
    CheckDelivered,
}

/// [`HopPair::with_injections`]'s script, step by step.
const SETUP_SCRIPT: [SetupOp; 13] = [
    SetupOp::Connect,
    SetupOp::Run(100),
    SetupOp::CheckConnected,
    SetupOp::Open,
    SetupOp::Run(100),
    SetupOp::Send(0),
    SetupOp::Send(1),
    SetupOp::Send(2),
    SetupOp::Send(3),
    SetupOp::Send(4),
    SetupOp::Send(5),
    SetupOp::Run(500),
    SetupOp::CheckDelivered,
];
// Checked at compile time: the script sends what `SETUP_MESSAGES` says.
const _: () = assert!(SETUP_MESSAGES == 6);

/// Where a [`Setup`] stands inside a `run_for` or a pump.
#[derive(Clone, Copy, Debug)]
enum Task {
    /// Nothing in progress: next is script step `next`.
    Idle,
    /// A pump with `left` deliveries left (`HopPair::pump`'s bound), inside a `run_for`
    /// until `until` that took `steps` timer steps (`run: Some`), or inside `send_both`
    /// (`run: None`).
    Pump {
        left: usize,
        run: Option<(Timestamp, usize)>,
    },
    /// Inside a `run_for` until `until`, after `steps` timer steps: the next timer step.
    Timer { until: Timestamp, steps: usize },
}

/// [`HopPair::with_injections`] as a machine that goes one delivery or one timer step at a
/// time, so that it can stop just before the relay's n-th real datagram and be copied
/// there: `hop_mutate`'s live inputs then start from the copy taken before their first
/// mutant's packet instead of setting the pair up from the start. It runs the same calls
/// in the same order as `with_injections` (`tests/fuzz_harness.rs` checks that the pairs
/// they end with are equal).
#[derive(Clone)]
struct Setup {
    /// The pair being set up.
    p: HopPair,
    /// Whether A reaches B through the relay.
    relay: bool,
    /// Whether nothing is injected (the checks of a clean run apply).
    clean: bool,
    /// The next step of [`SETUP_SCRIPT`].
    next: usize,
    /// What is in progress.
    task: Task,
}

impl Setup {
    /// The set-up before its first step.
    fn new(relay: bool, reports: bool, inject: BTreeMap<usize, Vec<Vec<u8>>>) -> Setup {
        // Injected datagrams may well stop the set-up (a mutated Challenge or S1 arriving
        // first wins: the handshake or a round fails), so only a clean run is checked.
        let clean = inject.is_empty();
        let p = HopPair::unstarted(relay, reports, inject, provider());
        Setup {
            p,
            relay,
            clean,
            next: 0,
            task: Task::Idle,
        }
    }

    /// Whether the next step hands the relay its `n`-th real datagram (counting from 0).
    fn at_relay_input(&self, n: usize) -> bool {
        matches!(self.task, Task::Pump { left, .. } if left > 0)
            && self.p.relay_inputs == n
            && self.p.queue.front().is_some_and(|(_, to, _)| *to == ADDR_R)
    }

    /// Starts a pump (`HopPair::pump`'s first line, then its loop), inside a run or not.
    fn start_pump(&mut self, run: Option<(Timestamp, usize)>) {
        self.p.collect();
        self.task = Task::Pump {
            left: MAX_DELIVERIES,
            run,
        };
    }

    /// One step: a delivery, a timer step, or a script step. False once the script is done.
    fn step(&mut self) -> bool {
        match self.task {
            Task::Pump { left, run } => {
                let popped = if left > 0 {
                    self.p.queue.pop_front()
                } else {
                    None
                };
                match popped {
                    Some((from, to, data)) => {
                        self.p.deliver(from, to, &data, false);
                        self.task = Task::Pump {
                            left: left - 1,
                            run,
                        };
                    }
                    None => {
                        self.task = match run {
                            Some((until, steps)) => Task::Timer { until, steps },
                            None => Task::Idle,
                        }
                    }
                }
                true
            }
            Task::Timer { until, steps } => {
                let next = [self.p.a.poll_timeout(), self.p.b.poll_timeout()]
                    .into_iter()
                    .flatten()
                    .min();
                match next {
                    Some(next) if steps < MAX_STEPS && next <= until => {
                        // As in `run_for`: a timer in the past moves time on by 1 ms.
                        self.p.now = if next > self.p.now {
                            next
                        } else {
                            self.p.now.saturating_add(Duration::from_millis(1))
                        };
                        let now = self.p.now;
                        self.p.a.handle_timeout(now);
                        self.p.b.handle_timeout(now);
                        self.start_pump(Some((until, steps + 1)));
                    }
                    _ => {
                        self.p.now = self.p.now.max(until);
                        self.task = Task::Idle;
                    }
                }
                true
            }
            Task::Idle => {
                let Some(op) = SETUP_SCRIPT.get(self.next).copied() else {
                    return false;
                };
                self.next += 1;
                self.op(op);
                true
            }
        }
    }

    /// Runs one script step (a `run_for` or a send only starts here; [`step`](Self::step)
    /// goes on with it).
    fn op(&mut self, op: SetupOp) {
        let p = &mut self.p;
        match op {
            SetupOp::Connect => {
                let via = self.relay.then_some(ADDR_R);
                p.a.connect(p.now, ADDR_B, via);
            }
            SetupOp::Run(ms) => {
                let until = p.now.saturating_add(Duration::from_millis(ms));
                self.start_pump(Some((until, 0)));
            }
            SetupOp::CheckConnected => assert!(
                !self.clean || (p.a.is_connected(ADDR_B) && p.b.is_connected(ADDR_A)),
                "set-up: the pair connects"
            ),
            SetupOp::Open => {
                let now = p.now;
                let (m, c) = (p.a.open(now, ADDR_B, MODE_M), p.a.open(now, ADDR_B, MODE_C));
                if self.clean {
                    p.assoc_m = must(m, "set-up: open M");
                    p.assoc_c = must(c, "set-up: open C");
                } else {
                    p.assoc_m = m.unwrap_or(0);
                    p.assoc_c = c.unwrap_or(0);
                }
            }
            SetupOp::Send(i) => {
                let now = p.now;
                for (assoc, mode) in [(p.assoc_m, "m"), (p.assoc_c, "c")] {
                    let data = format!("{mode} setup {i}").into_bytes();
                    if p.a.send(now, ADDR_B, assoc, &data).is_ok() {
                        p.payloads.push((assoc, data));
                    }
                }
                self.start_pump(None);
            }
            SetupOp::CheckDelivered => assert!(
                !self.clean || p.received_at_b().len() == 2 * SETUP_MESSAGES,
                "set-up: B delivers every message"
            ),
        }
    }

    /// Runs the rest of the script; the pair set up.
    fn finish(mut self) -> HopPair {
        while self.step() {}
        self.p
    }

    /// Copies of a clean set-up of the pair with a relay and delivery reports (the pair of
    /// [`captured`]), one taken just before each real datagram the relay gets: entry `n`
    /// stands before the `n`-th. Built once per process.
    fn checkpoints() -> &'static [Setup] {
        static CHECKPOINTS: OnceLock<Vec<Setup>> = OnceLock::new();
        CHECKPOINTS.get_or_init(|| {
            let mut s = Setup::new(true, true, BTreeMap::new());
            let mut out = Vec::new();
            loop {
                if s.at_relay_input(out.len()) {
                    let mut checkpoint = s.clone();
                    checkpoint.p = checkpoint.p.mark_checked();
                    out.push(checkpoint);
                }
                if !s.step() {
                    return out;
                }
            }
        })
    }
}

/// [`HopPair::with_injections(true, true, inject)`](HopPair::with_injections), resumed
/// from the copy of a clean set-up taken just before the relay's first real datagram that
/// `inject` names (a fresh set-up if it names none the clean run reaches): everything
/// before that is the clean run's, so the pair is the one `with_injections` builds.
pub fn resumed_with_injections(inject: BTreeMap<usize, Vec<Vec<u8>>>) -> HopPair {
    let first = inject.keys().next().copied();
    let mut s = match first.and_then(|n| Setup::checkpoints().get(n)) {
        Some(checkpoint) => checkpoint.clone(),
        None => Setup::new(true, true, BTreeMap::new()),
    };
    s.clean = inject.is_empty();
    s.p.inject = inject;
    s.finish()
}

/// What a harness saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HopOutcome {
    /// Datagrams fed.
    pub fed: usize,
    /// Drops the node fed counted while the input was processed (and after).
    pub dropped: u64,
    /// Messages B delivered after the input (none is expected: all were before).
    pub delivered: usize,
    /// Datagrams the relay forwarded that no endpoint sent (only handshake packets it
    /// forwards without state, or, live, an S1 or A1 with a real element).
    pub forwarded: usize,
    /// After the input, A sent one more message on each association and B delivered both.
    pub alive: bool,
}

/// After the input: timers for two seconds, then one more message each way on A's
/// associations; the checks; the outcome.
fn finish(mut p: HopPair, delivered_before: usize, also_real: &[Vec<u8>]) -> HopOutcome {
    p.run_for(Duration::from_secs(2));
    let delivered = p.received_at_b().len() - delivered_before;
    let queued = p.send_both("after");
    p.run_for(Duration::from_secs(2));
    let after: Vec<_> = p.payloads[p.payloads.len().saturating_sub(2)..].to_vec();
    let received = p.received_at_b();
    let alive = queued && after.iter().all(|m| received.contains(m));
    p.check_deliveries();
    let forwarded = p.check_relay(also_real);
    HopOutcome {
        delivered,
        forwarded,
        alive,
        ..HopOutcome::default()
    }
}

/// The control byte of [`endpoint`]'s input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointControl {
    /// The datagrams come from [`ADDR_STRANGER`], not from the other endpoint.
    pub from_stranger: bool,
    /// A's associations ask for delivery reports.
    pub reports: bool,
    /// The datagrams go to A (the signer: A1s and A2s reach it), not to B.
    pub to_a: bool,
}

impl EndpointControl {
    /// Bit 0 `from_stranger`, bit 1 `reports`, bit 2 `to_a`.
    pub fn from_byte(b: u8) -> EndpointControl {
        EndpointControl {
            from_stranger: b & 1 != 0,
            reports: b & 2 != 0,
            to_a: b & 4 != 0,
        }
    }

    /// The byte for these choices.
    pub fn byte(self) -> u8 {
        u8::from(self.from_stranger) | u8::from(self.reports) << 1 | u8::from(self.to_a) << 2
    }
}

/// A control byte ([`EndpointControl`]), then datagrams (see [`split_datagrams`]) into an
/// endpoint of an established pair connected directly ([`HopPair`]), which then runs two
/// seconds, and A sends one more message on each association. It must never panic, and B
/// delivers only messages A sent, each once.
pub fn endpoint(data: &[u8]) -> HopOutcome {
    let Some((&control, rest)) = data.split_first() else {
        return HopOutcome::default();
    };
    let c = EndpointControl::from_byte(control);
    let mut p = HopPair::cached(false, c.reports);
    let (to, peer) = if c.to_a {
        (ADDR_A, ADDR_B)
    } else {
        (ADDR_B, ADDR_A)
    };
    let from = if c.from_stranger { ADDR_STRANGER } else { peer };
    let delivered_before = p.received_at_b().len();
    let counters = |p: &HopPair| {
        drops(if c.to_a {
            p.a.counters()
        } else {
            p.b.counters()
        })
    };
    let before = counters(&p);
    let datagrams = split_datagrams(rest);
    for d in &datagrams {
        p.deliver(from, to, d, true);
        p.pump();
    }
    let dropped = counters(&p) - before;
    HopOutcome {
        fed: datagrams.len(),
        dropped,
        ..finish(p, delivered_before, &[])
    }
}

/// A control byte (bit 0: delivery reports), then datagrams (see [`split_datagrams`]) into
/// the relay of a pair connected through it ([`HopPair`] with a relay), which then runs two
/// seconds, and A sends one more message on each association. It must never panic; the
/// relay forwards nothing that no endpoint sent (but for handshake packets it forwards
/// without state, see [`HopPair::check_relay`]); B delivers only messages A sent, each once.
pub fn relay(data: &[u8]) -> HopOutcome {
    let Some((&control, rest)) = data.split_first() else {
        return HopOutcome::default();
    };
    let mut p = HopPair::cached(true, control & 1 != 0);
    let delivered_before = p.received_at_b().len();
    let before = p.relay.as_ref().map_or(0, |r| drops(r.counters()));
    let datagrams = split_datagrams(rest);
    for d in &datagrams {
        p.deliver(ADDR_STRANGER, ADDR_R, d, true);
        p.pump();
    }
    let dropped = p.relay.as_ref().map_or(0, |r| drops(r.counters())) - before;
    HopOutcome {
        fed: datagrams.len(),
        dropped,
        ..finish(p, delivered_before, &[])
    }
}

/// The datagrams the relay got in the real run of [`HopPair`] with a relay and delivery
/// reports, in order, with their senders: the handshake, the control rounds that open the
/// associations (S1, A1, S2 in mode N), and data rounds in modes M and C with A2s.
pub fn captured() -> &'static [(SocketAddr, Vec<u8>)] {
    static CAPTURED: OnceLock<Vec<(SocketAddr, Vec<u8>)>> = OnceLock::new();
    CAPTURED.get_or_init(|| {
        HopPair::new(true, true)
            .relay_steps
            .into_iter()
            .map(|s| (s.from, s.input))
            .collect()
    })
}

/// One change to a packet, as [`mutate_real`] reads it: 4 bytes, `op | position (u16 BE) |
/// value`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// Flip bit `value % 8` of the byte at `position % len`.
    FlipBit(u16, u8),
    /// Set the byte at `position % len` to `value`.
    Set(u16, u8),
    /// Keep the first `position % (len + 1)` bytes.
    Truncate(u16),
    /// Append `value % 32 + 1` copies of `value`.
    Extend(u8),
    /// Insert `value` at `position % (len + 1)`.
    Insert(u16, u8),
}

impl Mutation {
    /// The mutation a 4-byte record names.
    pub fn from_bytes(b: [u8; 4]) -> Mutation {
        let pos = u16::from_be_bytes([b[1], b[2]]);
        match b[0] % 5 {
            0 => Mutation::FlipBit(pos, b[3]),
            1 => Mutation::Set(pos, b[3]),
            2 => Mutation::Truncate(pos),
            3 => Mutation::Extend(b[3]),
            _ => Mutation::Insert(pos, b[3]),
        }
    }

    /// Its 4-byte record.
    pub fn to_bytes(self) -> [u8; 4] {
        let (op, pos, value) = match self {
            Mutation::FlipBit(p, v) => (0, p, v),
            Mutation::Set(p, v) => (1, p, v),
            Mutation::Truncate(p) => (2, p, 0),
            Mutation::Extend(v) => (3, 0, v),
            Mutation::Insert(p, v) => (4, p, v),
        };
        let [hi, lo] = pos.to_be_bytes();
        [op, hi, lo, value]
    }

    /// Applies it.
    pub fn apply(self, bytes: &mut Vec<u8>) {
        let len = bytes.len();
        match self {
            Mutation::FlipBit(p, v) if len > 0 => bytes[usize::from(p) % len] ^= 1 << (v % 8),
            Mutation::Set(p, v) if len > 0 => bytes[usize::from(p) % len] = v,
            Mutation::FlipBit(..) | Mutation::Set(..) => {}
            Mutation::Truncate(p) => bytes.truncate(usize::from(p) % (len + 1)),
            Mutation::Extend(v) => bytes.extend(std::iter::repeat_n(v, usize::from(v % 32) + 1)),
            Mutation::Insert(p, v) => bytes.insert(usize::from(p) % (len + 1), v),
        }
    }
}

/// One mutated packet of [`mutate_real`]'s input: which captured datagram, and changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MutantSpec {
    /// Index into [`captured`] (modulo its length).
    pub pick: u8,
    /// Changes, in order (one to four).
    pub mutations: Vec<Mutation>,
}

/// Encodes a [`mutate_real`] input: control byte, then per mutant `pick | count - 1 |
/// mutations`.
pub fn mutate_input(live: bool, mutants: &[MutantSpec]) -> Vec<u8> {
    let mut out = vec![u8::from(live)];
    for m in mutants {
        let n = m.mutations.len().clamp(1, 4);
        out.push(m.pick);
        out.push((n - 1) as u8);
        for i in 0..n {
            let mutation = m.mutations.get(i).copied().unwrap_or(Mutation::Extend(0));
            out.extend_from_slice(&mutation.to_bytes());
        }
    }
    out
}

/// Parses a [`mutate_real`] input (at most eight mutants; a cut record is dropped).
pub fn parse_mutate_input(data: &[u8]) -> Option<(bool, Vec<MutantSpec>)> {
    let (&control, mut rest) = data.split_first()?;
    let mut mutants = Vec::new();
    while rest.len() >= 2 && mutants.len() < 8 {
        let (pick, n) = (rest[0], usize::from(rest[1] % 4) + 1);
        rest = &rest[2..];
        let mut mutations = Vec::new();
        for _ in 0..n {
            let Some((record, tail)) = rest.split_first_chunk::<4>() else {
                break;
            };
            mutations.push(Mutation::from_bytes(*record));
            rest = tail;
        }
        if mutations.is_empty() {
            break;
        }
        mutants.push(MutantSpec { pick, mutations });
    }
    Some((control & 1 != 0, mutants))
}

/// A control byte (bit 0: *live*), then mutants ([`parse_mutate_input`]): real captured
/// datagrams of the pair with a relay and delivery reports ([`captured`]: handshake, S1,
/// A1, S2 in modes N, M and C, A2) with bits flipped, bytes set, cut or extended.
///
/// *Live*: each mutant reaches the relay just before the real datagram it was made from,
/// in a fresh run of the same pair (the strongest position: the relay is waiting for that
/// very packet). Otherwise the mutants reach the relay, and B directly, after the run.
///
/// It must never panic; the relay forwards no mutant unless it is byte-identical to a real
/// datagram (but for the exceptions of [`HopPair::check_relay`]; after the run there are
/// none but stateless handshake packets), and B delivers only messages A sent, each once
/// (after the run: nothing).
pub fn mutate_real(data: &[u8]) -> HopOutcome {
    let Some((live, specs)) = parse_mutate_input(data) else {
        return HopOutcome::default();
    };
    let captured = captured();
    let mutants: Vec<(usize, SocketAddr, Vec<u8>)> = specs
        .iter()
        .map(|s| {
            let i = usize::from(s.pick) % captured.len();
            let (from, real) = &captured[i];
            let mut m = real.clone();
            for mutation in &s.mutations {
                mutation.apply(&mut m);
            }
            (i, *from, m)
        })
        .collect();
    // The captured datagrams without their senders, copied once per process.
    static ALL_REAL: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    let all_real = ALL_REAL.get_or_init(|| captured.iter().map(|(_, d)| d.clone()).collect());
    if live {
        let mut inject: BTreeMap<usize, Vec<Vec<u8>>> = BTreeMap::new();
        for (i, _, m) in &mutants {
            inject.entry(*i).or_default().push(m.clone());
        }
        let p = resumed_with_injections(inject);
        let dropped = p
            .relay_steps
            .iter()
            .filter(|s| s.injected)
            .map(|s| s.dropped)
            .sum();
        return HopOutcome {
            fed: mutants.len(),
            dropped,
            ..finish(p, 0, all_real)
        };
    }
    let mut p = HopPair::cached(true, true);
    let delivered_before = p.received_at_b().len();
    let before = p.relay.as_ref().map_or(0, |r| drops(r.counters()));
    for (_, from, m) in &mutants {
        p.deliver(*from, ADDR_R, m, true);
        p.deliver(ADDR_R, ADDR_B, m, true);
        p.pump();
    }
    let dropped = p.relay.as_ref().map_or(0, |r| drops(r.counters())) - before;
    let outcome = HopOutcome {
        fed: mutants.len(),
        dropped,
        ..finish(p, delivered_before, all_real)
    };
    assert_eq!(outcome.delivered, 0, "B delivered something after the run");
    outcome
}

/// Whether `data` is a real captured datagram of kind `k` (see [`kind`]).
pub fn is_kind(data: &[u8], k: u8) -> bool {
    data.len() >= 2 && data[1] == k && Packet::parse(data).is_ok()
}

/// Every datagram kind a [`captured`] run must hold (see [`captured_kinds`]).
pub const CAPTURED_KINDS: [u8; 10] = [
    kind::HELLO,
    kind::CHALLENGE,
    kind::SYN,
    kind::ACK,
    kind::ACKACK,
    kind::SIGNED,
    kind::S1,
    kind::A1,
    kind::S2,
    kind::A2,
];

/// The kinds a [`captured`] run holds, for tests: how many datagrams of each.
pub fn captured_kinds() -> BTreeMap<u8, usize> {
    let mut out = BTreeMap::new();
    for (_, d) in captured() {
        for k in CAPTURED_KINDS {
            if is_kind(d, k) {
                *out.entry(k).or_default() += 1;
            }
        }
    }
    out
}
