#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report
//! Pairwise channels between members: a tiny in-memory network shuttles datagrams between
//! two or three `PairTable`s (zero latency, optional loss and duplication), stepping virtual
//! time straight to the next timer.

use cohort_channel::datagram::DatagramChannel;
use cohort_channel::identity::Identity;
use cohort_channel::{Client, ClientAuth, ClientConfig};
use cohort_core::Machine;
use cohort_core::Timestamp;
use cohort_crypto::{CryptoProvider, Secret};
use cohort_group::pair::{PairEvent, PairFailure, PairTable, MAX_HALF_OPEN, PAIR_KIND};
use cohort_group::MemberId;
use rand_core::SeedableRng;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

const GROUP: &str = "pair-test";

fn addr(n: u8) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, n], 7000))
}

fn identity(n: u8) -> Identity {
    Identity::from_secret(
        &CryptoProvider::default_provider(),
        Secret::from_slice(&[n; 32]),
    )
    .unwrap()
}

fn id(n: u8) -> MemberId {
    MemberId(identity(n).public())
}

fn table(n: u8, trust: &[u8], seed: u8) -> PairTable {
    PairTable::new(
        CryptoProvider::default_provider(),
        identity(n),
        GROUP,
        trust.iter().map(|&t| id(t)).collect::<Vec<_>>(),
        [seed; 32],
    )
}

struct Node {
    addr: SocketAddr,
    table: PairTable,
    events: Vec<PairEvent>,
}

/// Zero-latency datagram delivery between nodes, with every `drop_every`-th datagram lost
/// and every `duplicate_every`-th sent twice.
struct Net {
    nodes: Vec<Node>,
    now: Timestamp,
    wire: VecDeque<(SocketAddr, SocketAddr, Vec<u8>)>,
    sent: u64,
    drop_every: Option<u64>,
    duplicate_every: Option<u64>,
}

impl Net {
    fn new() -> Self {
        Net {
            nodes: Vec::new(),
            now: Timestamp::from_millis(1_000),
            wire: VecDeque::new(),
            sent: 0,
            drop_every: None,
            duplicate_every: None,
        }
    }

    /// Member `n` at `addr(n)`, trusting `trust`; returns its index.
    fn add(&mut self, n: u8, trust: &[u8], seed: u8) -> usize {
        self.add_node(addr(n), table(n, trust, seed))
    }

    fn add_node(&mut self, at: SocketAddr, table: PairTable) -> usize {
        self.nodes.push(Node {
            addr: at,
            table,
            events: Vec::new(),
        });
        self.nodes.len() - 1
    }

    fn send(&mut self, node: usize, to: SocketAddr, expect: Option<MemberId>, data: &[u8]) {
        let now = self.now;
        self.nodes[node].table.send(now, to, expect, data);
    }

    fn collect(&mut self) {
        for node in &mut self.nodes {
            loop {
                let mut buf = Vec::new();
                let Some(t) = node.table.poll_transmit(self.now, &mut buf) else {
                    break;
                };
                assert_eq!(t.size, buf.len());
                assert_eq!(buf[0], PAIR_KIND);
                self.sent += 1;
                if self.drop_every.is_some_and(|k| self.sent.is_multiple_of(k)) {
                    continue;
                }
                if self
                    .duplicate_every
                    .is_some_and(|k| self.sent.is_multiple_of(k))
                {
                    self.wire.push_back((node.addr, t.destination, buf.clone()));
                }
                self.wire.push_back((node.addr, t.destination, buf));
            }
            while let Some(e) = node.table.poll_event() {
                node.events.push(e);
            }
        }
    }

    fn run_for(&mut self, d: Duration) {
        let end = self.now.saturating_add(d);
        for _ in 0..1_000_000 {
            self.collect();
            if let Some((from, to, data)) = self.wire.pop_front() {
                // Datagrams to addresses with no node (spoofed sources) vanish.
                if let Some(n) = self.nodes.iter_mut().find(|n| n.addr == to) {
                    n.table.handle_datagram(self.now, from, &data);
                }
                continue;
            }
            match self
                .nodes
                .iter()
                .filter_map(|n| n.table.poll_timeout())
                .min()
            {
                Some(t) if t <= end => {
                    self.now = self.now.max(t);
                    for n in &mut self.nodes {
                        n.table.handle_timeout(self.now);
                    }
                }
                _ => {
                    self.now = end;
                    self.collect();
                    return;
                }
            }
        }
        panic!("the network did not settle (a timer that never advances?)");
    }

    fn table(&mut self, node: usize) -> &mut PairTable {
        &mut self.nodes[node].table
    }

    fn established(&self, node: usize) -> Vec<(MemberId, SocketAddr)> {
        self.nodes[node]
            .events
            .iter()
            .filter_map(|e| match e {
                PairEvent::Established { peer, addr } => Some((*peer, *addr)),
                _ => None,
            })
            .collect()
    }

    fn messages(&self, node: usize) -> Vec<(MemberId, SocketAddr, Vec<u8>)> {
        self.nodes[node]
            .events
            .iter()
            .filter_map(|e| match e {
                PairEvent::Message { peer, addr, data } => Some((*peer, *addr, data.clone())),
                _ => None,
            })
            .collect()
    }

    fn failures(&self, node: usize) -> Vec<(SocketAddr, &'static str)> {
        self.nodes[node]
            .events
            .iter()
            .filter_map(|e| match e {
                PairEvent::Failed { addr, reason } => Some((*addr, reason.as_str())),
                _ => None,
            })
            .collect()
    }

    fn clear_events(&mut self) {
        for n in &mut self.nodes {
            n.events.clear();
        }
    }
}

/// Two members that trust each other, with an authenticated channel from `a` to `b`.
fn connected_pair() -> (Net, usize, usize) {
    let mut net = Net::new();
    let a = net.add(1, &[2, 3], 11);
    let b = net.add(2, &[1, 3], 22);
    net.send(a, addr(2), Some(id(2)), b"first");
    net.run_for(Duration::from_secs(5));
    assert_eq!(net.established(a), vec![(id(2), addr(2))]);
    assert_eq!(net.established(b), vec![(id(1), addr(1))]);
    assert_eq!(net.messages(b), vec![(id(1), addr(1), b"first".to_vec())]);
    net.clear_events();
    (net, a, b)
}

/// A ClientHello datagram (PAIR_KIND included) from a member that is in no network.
fn captured_hello(n: u8, to: SocketAddr) -> Vec<u8> {
    let mut t = table(n, &[], n);
    t.send(Timestamp::from_millis(1_000), to, None, b"x");
    let mut buf = Vec::new();
    t.poll_transmit(Timestamp::from_millis(1_000), &mut buf)
        .unwrap();
    buf
}

#[test]
fn establish_and_exchange_both_ways() {
    let mut net = Net::new();
    let a = net.add(1, &[2], 1);
    let b = net.add(2, &[1], 2);
    net.send(a, addr(2), None, b"hello from a");
    net.send(a, addr(2), None, b"and again");
    net.run_for(Duration::from_secs(5));
    assert_eq!(net.established(a), vec![(id(2), addr(2))]);
    assert_eq!(net.established(b), vec![(id(1), addr(1))]);
    assert_eq!(
        net.messages(b),
        vec![
            (id(1), addr(1), b"hello from a".to_vec()),
            (id(1), addr(1), b"and again".to_vec()),
        ]
    );
    // The other way, on the same channel (b is its server).
    net.send(b, addr(1), Some(id(1)), b"hello from b");
    net.run_for(Duration::from_secs(5));
    assert_eq!(
        net.messages(a),
        vec![(id(2), addr(2), b"hello from b".to_vec())]
    );
    assert_eq!(net.table(a).peer_at(addr(2)), Some(id(2)));
    assert_eq!(net.table(b).peer_at(addr(1)), Some(id(1)));
    assert_eq!(net.table(a).channel_count(), 1);
    assert_eq!(net.table(b).channel_count(), 1);
    let ka = net.table(a).pair_key(&id(2)).unwrap().expose().to_vec();
    let kb = net.table(b).pair_key(&id(1)).unwrap().expose().to_vec();
    assert_eq!(ka.len(), 32);
    assert_eq!(ka, kb);
    assert!(net.table(a).pair_key(&id(1)).is_none());
    assert_eq!(net.table(a).dropped(), 0);
    assert_eq!(net.table(b).dropped(), 0);
    assert!(net.failures(a).is_empty() && net.failures(b).is_empty());
}

#[test]
fn untrusted_identity_is_refused() {
    let mut net = Net::new();
    let a = net.add(1, &[2], 1);
    // b trusts only member 3.
    let b = net.add(2, &[3], 2);
    net.send(a, addr(2), None, b"let me in");
    net.run_for(Duration::from_secs(120));
    assert_eq!(net.failures(b), vec![(addr(1), "untrusted identity")]);
    assert!(net.messages(b).is_empty());
    assert!(net.established(b).is_empty());
    assert_eq!(net.table(b).drops().untrusted, 1);
    assert!(net.table(b).pair_key(&id(1)).is_none());
    assert_eq!(net.table(b).peer_at(addr(1)), None);
    // a learns that its proof was refused and never counts the channel as up.
    assert_eq!(
        net.failures(a),
        vec![(addr(2), "peer refused our identity proof")]
    );
    assert!(net.established(a).is_empty());
    assert!(net.table(a).pair_key(&id(2)).is_none());
    assert_eq!(net.table(b).channel_count(), 0);
}

#[test]
fn expected_identity_mismatch_is_refused() {
    let mut net = Net::new();
    let a = net.add(1, &[2, 3], 1);
    let b = net.add(2, &[1, 3], 2);
    // a believes member 3 is at b's address.
    net.send(a, addr(2), Some(id(3)), b"for member 3 only");
    net.run_for(Duration::from_secs(120));
    assert_eq!(
        net.failures(a),
        vec![(addr(2), "peer is not the expected member")]
    );
    assert!(net.established(a).is_empty());
    assert!(net.established(b).is_empty());
    assert!(net.messages(b).is_empty());
    assert!(net.table(a).pair_key(&id(2)).is_none());
    assert_eq!(net.table(a).drops().untrusted, 1);
}

#[test]
fn proof_for_another_group_is_refused() {
    let mut net = Net::new();
    let a = net.add(1, &[2], 1);
    // b trusts a, but its proofs name another group: a's signature does not verify.
    let other = PairTable::new(
        CryptoProvider::default_provider(),
        identity(2),
        "another-group",
        vec![id(1)],
        [2; 32],
    );
    let b = net.add_node(addr(2), other);
    net.send(a, addr(2), None, b"hello");
    net.run_for(Duration::from_secs(120));
    assert!(net
        .failures(a)
        .contains(&(addr(2), "bad identity proof signature")));
    assert!(net
        .failures(b)
        .contains(&(addr(1), "bad identity proof signature")));
    assert!(net.established(a).is_empty() && net.established(b).is_empty());
    assert!(net.messages(b).is_empty());
}

#[test]
fn own_identity_is_refused() {
    let mut net = Net::new();
    let a = net.add(1, &[1, 2], 1);
    // Another table with a's own identity (a's key is even in the trust lists).
    let twin = net.add_node(addr(5), table(1, &[1, 2], 5));
    net.send(a, addr(5), None, b"hello me");
    net.run_for(Duration::from_secs(120));
    assert!(net
        .failures(a)
        .contains(&(addr(5), "peer presented our own identity")));
    assert!(net.established(a).is_empty() && net.established(twin).is_empty());
    assert!(net.messages(twin).is_empty());
}

#[test]
fn send_with_conflicting_expectation_is_refused() {
    let (mut net, a, b) = connected_pair();
    net.send(a, addr(2), Some(id(3)), b"wrong member");
    net.run_for(Duration::from_secs(5));
    assert_eq!(
        net.failures(a),
        vec![(addr(2), "peer is not the expected member")]
    );
    assert!(net.messages(b).is_empty());
    // The channel itself stays.
    assert_eq!(net.table(a).peer_at(addr(2)), Some(id(2)));
}

#[test]
fn simultaneous_open_converges() {
    // Different seeds give different hellos, so both outcomes of the comparison occur.
    for round in 0..6u8 {
        let mut net = Net::new();
        let a = net.add(1, &[2], 10 + round);
        let b = net.add(2, &[1], 50 + round);
        net.send(a, addr(2), None, b"from a");
        net.send(b, addr(1), None, b"from b");
        net.run_for(Duration::from_secs(10));
        assert_eq!(net.established(a), vec![(id(2), addr(2))], "round {round}");
        assert_eq!(net.established(b), vec![(id(1), addr(1))], "round {round}");
        assert_eq!(net.messages(a), vec![(id(2), addr(2), b"from b".to_vec())]);
        assert_eq!(net.messages(b), vec![(id(1), addr(1), b"from a".to_vec())]);
        // Exactly one side dropped the other's (smaller) hello; the other answered it.
        let dropped_hellos =
            net.nodes[a].table.drops().unexpected + net.nodes[b].table.drops().unexpected;
        assert_eq!(dropped_hellos, 1, "round {round}");
        assert_eq!(net.table(a).channel_count(), 1, "round {round}");
        assert_eq!(net.table(b).channel_count(), 1, "round {round}");
        let ka = net.table(a).pair_key(&id(2)).unwrap().expose().to_vec();
        let kb = net.table(b).pair_key(&id(1)).unwrap().expose().to_vec();
        assert_eq!(ka, kb, "round {round}");
        assert!(net.failures(a).is_empty() && net.failures(b).is_empty());
        // The surviving channel carries data both ways.
        net.clear_events();
        net.send(a, addr(2), None, b"again a");
        net.send(b, addr(1), None, b"again b");
        net.run_for(Duration::from_secs(5));
        assert_eq!(net.messages(a), vec![(id(2), addr(2), b"again b".to_vec())]);
        assert_eq!(net.messages(b), vec![(id(1), addr(1), b"again a".to_vec())]);
    }
}

#[test]
fn loss_and_duplication_still_establish() {
    // (Drop every 2nd is pathological here: with zero latency both ends' timers fire
    // together, and the same end's datagram is always the one lost.)
    for (drop_every, duplicate_every) in [(3, None), (3, Some(4)), (5, Some(2))] {
        let mut net = Net::new();
        net.drop_every = Some(drop_every);
        net.duplicate_every = duplicate_every;
        let a = net.add(1, &[2], 1);
        let b = net.add(2, &[1], 2);
        net.send(a, addr(2), None, b"queued");
        net.run_for(Duration::from_secs(300));
        let case = format!("drop every {drop_every}, duplicate every {duplicate_every:?}");
        assert_eq!(net.established(a), vec![(id(2), addr(2))], "{case}");
        assert_eq!(net.established(b), vec![(id(1), addr(1))], "{case}");
        let ka = net.table(a).pair_key(&id(2)).unwrap().expose().to_vec();
        let kb = net.table(b).pair_key(&id(1)).unwrap().expose().to_vec();
        assert_eq!(ka, kb, "{case}");
        // Data is unreliable, but what arrives is what was sent, once.
        for i in 0..12u8 {
            net.send(a, addr(2), None, &[i]);
            net.send(b, addr(1), None, &[100 + i]);
        }
        net.run_for(Duration::from_secs(5));
        for (node, from, base) in [(a, 2, 100u8), (b, 1, 0)] {
            let got: Vec<Vec<u8>> = net
                .messages(node)
                .into_iter()
                .inspect(|(peer, at, _)| assert_eq!((*peer, *at), (id(from), addr(from))))
                .map(|(_, _, d)| d)
                .filter(|d| d != b"queued")
                .collect();
            assert!(!got.is_empty(), "{case}: nothing arrived");
            let mut unique = got.clone();
            unique.dedup();
            assert_eq!(unique, got, "{case}: a message arrived twice");
            assert!(got
                .iter()
                .all(|d| d.len() == 1 && (base..base + 12).contains(&d[0])));
        }
        assert!(
            net.failures(a).is_empty() && net.failures(b).is_empty(),
            "{case}"
        );
    }
}

#[test]
fn garbage_is_counted_and_harmless() {
    let (mut net, a, b) = connected_pair();
    let now = net.now;
    let before = net.table(b).dropped();
    let mut garbage: Vec<Vec<u8>> = vec![
        vec![],
        vec![0x00],
        vec![PAIR_KIND],
        vec![PAIR_KIND, 0x07],
        vec![PAIR_KIND, 0x01],
        vec![PAIR_KIND, 0x01, 1, 2, 3],
        vec![PAIR_KIND, 0x00],
        vec![PAIR_KIND, 0x00, 0x01],
        vec![PAIR_KIND, 0x00, 0x01, 0x00, 0x05, 1, 2],
        vec![PAIR_KIND, 0x00, 0x01, 0x00, 0x02, 0xff, 0xff],
        vec![PAIR_KIND, 0x00, 0x02, 0x00, 0x01, 0xff],
        vec![PAIR_KIND, 0x00, 0x03, 0x00, 0x00],
    ];
    // A real hello, cut short and with each of its first bytes flipped.
    let hello = captured_hello(4, addr(2));
    garbage.push(hello[..hello.len() - 1].to_vec());
    for i in 1..40 {
        let mut h = hello.clone();
        h[i] ^= 0x5a;
        garbage.push(h);
    }
    // Pseudo-random datagrams.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..500 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = (x % 200) as usize;
        let mut d: Vec<u8> = (0..len).map(|i| (x >> (i % 57)) as u8).collect();
        if let Some(first) = d.first_mut() {
            *first = if x & 1 == 0 { PAIR_KIND } else { *first };
        }
        if d.len() > 1 {
            d[1] = (x >> 3) as u8 & 1;
        }
        garbage.push(d);
    }
    let sources = [addr(1), addr(9), SocketAddr::from(([192, 0, 2, 7], 1))];
    for (i, d) in garbage.iter().enumerate() {
        net.table(b).handle_datagram(now, sources[i % 3], d);
    }
    net.run_for(Duration::from_secs(120));
    let counted = net.table(b).dropped() - before;
    assert!(
        counted >= garbage.len() as u64,
        "{counted} drops counted for {} garbage datagrams",
        garbage.len()
    );
    assert!(net.failures(b).is_empty(), "{:?}", net.failures(b));
    // The channel still works both ways.
    net.send(a, addr(2), None, b"still here");
    net.send(b, addr(1), None, b"me too");
    net.run_for(Duration::from_secs(5));
    assert_eq!(
        net.messages(b),
        vec![(id(1), addr(1), b"still here".to_vec())]
    );
    assert_eq!(net.messages(a), vec![(id(2), addr(2), b"me too".to_vec())]);
    assert_eq!(net.table(b).channel_count(), 1);
}

#[test]
fn partial_handshake_frame_does_not_break_a_handshake() {
    let mut net = Net::new();
    let a = net.add(1, &[2], 1);
    let b = net.add(2, &[1], 2);
    net.send(a, addr(2), None, b"hello");
    // Before b answers, a spoofer sends what looks like the start of a ServerHello
    // (type 2, declared length 0x0500, three bytes): a stream parser would wait for the
    // rest and swallow the real ServerHello into it.
    let now = net.now;
    let partial = [PAIR_KIND, 0x00, 0x02, 0x05, 0x00, 1, 2, 3];
    net.table(a).handle_datagram(now, addr(2), &partial);
    assert_eq!(net.table(a).drops().malformed, 1);
    net.run_for(Duration::from_secs(10));
    assert_eq!(net.established(a), vec![(id(2), addr(2))]);
    assert_eq!(net.messages(b), vec![(id(1), addr(1), b"hello".to_vec())]);
}

#[test]
fn unauthenticated_peer_cannot_deliver_data() {
    // A bare channel client that completes the handshake but never proves an identity,
    // then sends a data message and a proof that does not parse.
    let provider = CryptoProvider::default_provider();
    let mut b = table(2, &[1], 2);
    let client = Client::new(provider, ClientConfig::new(ClientAuth::None));
    let mut rng = rand_chacha::ChaCha20Rng::from_seed([3; 32]);
    let now = Timestamp::from_millis(1_000);
    let mut rogue = DatagramChannel::client(&client, now, &mut rng, "b", addr(2)).unwrap();
    let mut sneaked = false;
    for _ in 0..20 {
        let mut buf = Vec::new();
        while rogue.poll_transmit(now, &mut buf).is_some() {
            let mut d = vec![PAIR_KIND];
            d.extend_from_slice(&buf);
            b.handle_datagram(now, addr(1), &d);
            buf.clear();
        }
        while b.poll_transmit(now, &mut buf).is_some() {
            rogue.handle_datagram(now, addr(2), &buf[1..]);
            buf.clear();
        }
        if rogue.is_established() && !sneaked {
            rogue.send(b"\x03sneaky data").unwrap();
            rogue.send(b"\x01\x01short proof").unwrap();
            sneaked = true;
        }
    }
    assert!(sneaked, "the rogue's handshake did not complete");
    let mut events = Vec::new();
    while let Some(e) = b.poll_event() {
        events.push(e);
    }
    assert_eq!(
        events,
        vec![PairEvent::Failed {
            addr: addr(1),
            reason: PairFailure::MalformedProof
        }]
    );
    assert!(b.drops().unexpected >= 1, "{:?}", b.drops());
    assert_eq!(b.peer_at(addr(1)), None);
    assert_eq!(b.channel_count(), 0);
}

#[test]
fn hello_flood_keeps_state_bounded() {
    let (mut net, a, b) = connected_pair();
    let c = net.add(3, &[2], 33);
    let hello = captured_hello(5, addr(2));
    let now = net.now;
    let flood = MAX_HALF_OPEN as u32 + 1000;
    for i in 0..flood {
        let spoofed = SocketAddr::from(([172, 16, (i >> 8) as u8, i as u8], 4000));
        net.table(b).handle_datagram(now, spoofed, &hello);
        assert!(net.table(b).channel_count() <= MAX_HALF_OPEN + 1);
    }
    assert_eq!(net.table(b).channel_count(), MAX_HALF_OPEN + 1);
    assert_eq!(net.table(b).drops().evicted, 1000);
    net.run_for(Duration::from_secs(5));
    assert!(
        net.failures(b).is_empty(),
        "spoofed hellos are not reported"
    );
    // The authenticated channel survived, and a genuine newcomer still gets in.
    assert_eq!(net.table(b).peer_at(addr(1)), Some(id(1)));
    net.send(a, addr(2), None, b"after the flood");
    net.send(c, addr(2), Some(id(2)), b"newcomer");
    net.run_for(Duration::from_secs(10));
    assert_eq!(
        net.messages(b),
        vec![
            (id(1), addr(1), b"after the flood".to_vec()),
            (id(3), addr(3), b"newcomer".to_vec()),
        ]
    );
    assert_eq!(net.established(c), vec![(id(2), addr(2))]);
    // The half-open channels time out.
    net.run_for(Duration::from_secs(600));
    assert_eq!(net.table(b).channel_count(), 2);
}

#[test]
fn restarted_peer_replaces_its_channel_once_authenticated() {
    let (mut net, a, b) = connected_pair();
    // Someone spoofing b's address sends a hello it cannot authenticate: the working
    // channel is untouched.
    let spoof = captured_hello(7, addr(1));
    let now = net.now;
    net.table(a).handle_datagram(now, addr(2), &spoof);
    net.run_for(Duration::from_secs(300));
    assert!(net.failures(a).is_empty());
    assert_eq!(net.table(a).peer_at(addr(2)), Some(id(2)));
    net.send(b, addr(1), None, b"still the old b");
    net.run_for(Duration::from_secs(5));
    assert_eq!(
        net.messages(a),
        vec![(id(2), addr(2), b"still the old b".to_vec())]
    );
    let old_key = net.table(a).pair_key(&id(2)).unwrap().expose().to_vec();
    net.clear_events();

    // b restarts: same identity and address, no state.
    net.nodes[b].table = table(2, &[1, 3], 99);
    net.send(b, addr(1), None, b"i am back");
    net.run_for(Duration::from_secs(10));
    assert_eq!(net.established(a), vec![(id(2), addr(2))]);
    assert_eq!(
        net.messages(a),
        vec![(id(2), addr(2), b"i am back".to_vec())]
    );
    assert_eq!(net.table(a).channel_count(), 1);
    net.send(a, addr(2), None, b"welcome back");
    net.run_for(Duration::from_secs(5));
    assert_eq!(
        net.messages(b),
        vec![(id(1), addr(1), b"welcome back".to_vec())]
    );
    let ka = net.table(a).pair_key(&id(2)).unwrap().expose().to_vec();
    let kb = net.table(b).pair_key(&id(1)).unwrap().expose().to_vec();
    assert_eq!(ka, kb);
    assert_ne!(ka, old_key);
    assert!(net.failures(a).is_empty() && net.failures(b).is_empty());
}

#[test]
fn forget_and_untrust_drop_the_channel() {
    let (mut net, a, b) = connected_pair();
    net.table(a).forget(addr(2));
    assert_eq!(net.table(a).peer_at(addr(2)), None);
    assert_eq!(net.table(a).channel_count(), 0);
    // The next send reconnects (b sees a restart of its client).
    net.send(a, addr(2), None, b"reconnected");
    net.run_for(Duration::from_secs(10));
    assert_eq!(
        net.messages(b),
        vec![(id(1), addr(1), b"reconnected".to_vec())]
    );
    assert_eq!(net.table(b).channel_count(), 1);
    // b stops trusting a.
    net.table(b).set_trust(vec![id(3)]);
    net.collect();
    assert_eq!(net.failures(b), vec![(addr(1), "peer no longer trusted")]);
    assert_eq!(net.table(b).peer_at(addr(1)), None);
}
