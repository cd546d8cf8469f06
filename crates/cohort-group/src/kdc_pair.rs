//! Pair channels for a group in KDC mode (LSGC 2.1): no public-key operation anywhere.
//!
//! Two members share `σ = {R}_{K_I}` (Leighton-Micali, `cohort-kdc`), where `I` is the side
//! that opens the channel and `R` the side that answers. `I` computes σ alone from its own
//! long-term key; `R` asks the KDC for the pair key `π_{R,I}` and derives σ from it and its
//! own key. A joiner opens the channel to the session leader (LSGC messages 1-3: the
//! joiner's name and nonce, then the leader's request to the KDC); a coordinator that lacks
//! a channel to a member opens one the same way. Each session mixes both sides' nonces
//! into its keys, so nothing recorded from an earlier session is accepted.
//!
//! ```text
//!  Hello   I ─▶ R : kind | ver | 1 | group | I (32) | nonce_I (16)
//!                   R: trusts I? σ cached? else KDC request (SL=R, A=I) and wait
//!  Accept  R ─▶ I : kind | ver | 2 | group | R (32) | I (32) | nonce_I | nonce_R | tag (16)
//!  Confirm I ─▶ R : kind | ver | 3 | group | I (32) | R (32) | nonce_I | nonce_R | tag (16)
//!  Data    both   : kind | ver | 4 | nonce_I (16) | counter (u64) | AEAD(data) (+16)
//!  Reject  R ─▶ I : kind | ver | 5 | group | R (32) | I (32) | nonce_I | reason (u8)
//!  Reset   either : kind | ver | 6 | nonce_I (16)
//! ```
//! A side that gets data for a session it does not hold (it forgot the channel, say when
//! it removed the peer from its view) answers Reset; the other side then drops its end and
//! the next message opens a new session.
//! Tags are HMAC-SHA256 (16 bytes) under a key derived from σ, both names and both nonces,
//! over a label and every byte before them; data is AES-256-GCM under a key per direction
//! derived the same way, with the counter as nonce and a 64-message replay window. A
//! Reject (untrusted, or unknown to the KDC) is not authenticated: the opener reports it
//! as a hint. Members are named by principal: `MemberId::from_principal`.

use crate::config::TrustList;
use crate::id::MemberId;
use crate::keys::PairKey;
use crate::pair::{PairDrops, PairEvent, PairFailure, MAX_QUEUED};
use cohort_core::wire::{Reader, Writer};
use cohort_core::{Timestamp, Transmit};
use cohort_crypto::{ct_eq, AeadAlgorithm, AeadKey, CryptoProvider, Secret};
use cohort_kdc::wire::{Response, ResponseBody};
use cohort_kdc::{member_shared_key, KdcError, PairKeyRequest, PrincipalKey, PrincipalName};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use zeroize::Zeroizing;

/// First byte of a KDC-mode pair datagram.
pub const KDC_PAIR_KIND: u8 = 0xC3;
const VERSION: u8 = 1;
const NONCE: usize = 16;
const TAG: usize = 16;
/// Hellos and Accepts are resent this often until answered.
const RESEND: Duration = Duration::from_millis(200);
/// A channel that is not open after this long fails.
const GIVE_UP: Duration = Duration::from_secs(5);
/// An answered session whose Accepts go unconfirmed this long, with data waiting to go the
/// other way, is given up for a session this side opens (five resends).
const REOPEN: Duration = Duration::from_secs(1);
/// KDC requests are resent this often, up to `KDC_TRIES` times.
const KDC_RESEND: Duration = Duration::from_millis(300);
const KDC_TRIES: u32 = 10;
/// Most KDC requests outstanding at once (a flood of hellos cannot make more); a Hello that
/// needs one more is refused, and its opener sends it again after `RESEND`. This bounds how
/// fast a leader admits new principals: at most this many per round trip to the KDC. At 32
/// (until 2026-11-27) a cold start of 10,000 over 5 ms links admitted about 3,200 joiners a
/// second, so the last ones waited past `3 × suspect_timeout` with no answer, founded groups
/// of their own, and were merged back one Exchange at a time (17 s to one view). Each
/// request holds a few hundred bytes until answered or given up (`KDC_TRIES`).
const MAX_KDC_PENDING: usize = 256;
/// Most σ kept from the KDC.
const MAX_CACHED: usize = 4096;
/// How long a principal the KDC said it does not know is refused without asking again.
const REFUSED_FOR: Duration = Duration::from_secs(10);
/// Most answered sessions not yet open (a flood of spoofed Hellos cannot make more); a new
/// one evicts the oldest. 1,024, as the identity table's `pair::MAX_HALF_OPEN` and for the
/// same reason: in a cold start thousands of joiners send the leader their Hellos at once,
/// and with 64 each new Hello evicted a session still waiting for the KDC or the Confirm,
/// so a leader admitted about 60 joiners a view change. A flood of spoofed Hellos costs at
/// most 1,024 sessions of a few hundred bytes (and at most `MAX_KDC_PENDING` requests).
const MAX_HALF_OPEN: usize = 1024;
/// A Reset is honoured only after this long without an authenticated datagram from the
/// peer (it is not authenticated: an active channel must not be torn down by one).
const RESET_QUIET: Duration = Duration::from_secs(1);
const REJECT_UNTRUSTED: u8 = 1;
const REJECT_UNKNOWN: u8 = 2;
const SALT: &[u8] = b"cohort group kdc pair v1";

/// Who this member is in KDC mode, and where its KDC is.
pub struct KdcCredentials {
    /// The principal's registered name.
    pub name: PrincipalName,
    /// Its long-term key `K_A`, shared with the KDC only.
    pub key: PrincipalKey,
    /// The KDC's UDP address.
    pub kdc: SocketAddr,
}

impl std::fmt::Debug for KdcCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KdcCredentials")
            .field("name", &self.name.as_str())
            .field("kdc", &self.kdc)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Role {
    Opener,
    Answerer,
}

enum State {
    /// Opener: Hello sent.
    HelloSent,
    /// Answerer: waiting for σ from the KDC.
    AwaitKdc,
    /// Answerer: Accept sent, waiting for Confirm (or data).
    Accepted,
    /// Both: keys in use.
    Open,
}

struct Keys {
    send: Box<dyn AeadKey>,
    recv: Box<dyn AeadKey>,
    mac: Secret,
    wrap: Arc<PairKey>,
    sent: u64,
    highest: Option<u64>,
    window: u64,
}

struct Slot {
    role: Role,
    state: State,
    peer: Option<MemberId>,
    expect: Option<MemberId>,
    nonce_i: [u8; NONCE],
    nonce_r: [u8; NONCE],
    keys: Option<Keys>,
    /// Data waiting for the channel to open (it may hold group keys: wiped when dropped).
    queue: VecDeque<Zeroizing<Vec<u8>>>,
    started: Timestamp,
    resend_at: Timestamp,
    opened_at: Option<Timestamp>,
    /// When the peer last sent something authenticated on this session.
    last_heard: Timestamp,
    /// An answered session's number (from 1, never reused; 0 for an opener): how
    /// `KdcPairTable::answered` and `awaiting_kdc` name it wherever it moves.
    serial: u64,
}

impl Slot {
    /// A session started at `now` in `state`: no peer, nonces, keys or queued data yet; the
    /// first resend after [`RESEND`].
    fn new(role: Role, state: State, now: Timestamp) -> Slot {
        Slot {
            role,
            state,
            peer: None,
            expect: None,
            nonce_i: [0; NONCE],
            nonce_r: [0; NONCE],
            keys: None,
            queue: VecDeque::new(),
            started: now,
            resend_at: now.saturating_add(RESEND),
            opened_at: None,
            last_heard: now,
            serial: 0,
        }
    }
}

/// Whether the answered session `serial` at `addr` still waits for σ from the KDC.
fn waits_for_kdc(
    slots: &BTreeMap<SocketAddr, Slot>,
    replacing: &BTreeMap<SocketAddr, Slot>,
    addr: SocketAddr,
    serial: u64,
) -> bool {
    half_open_in(slots, replacing, addr, serial)
        .is_some_and(|(_, s)| matches!(s.state, State::AwaitKdc))
}

/// The answered session `serial` at `addr`, if it is not open yet: whether it waits aside
/// (in `replacing`), and the session.
fn half_open_in<'a>(
    slots: &'a BTreeMap<SocketAddr, Slot>,
    replacing: &'a BTreeMap<SocketAddr, Slot>,
    addr: SocketAddr,
    serial: u64,
) -> Option<(bool, &'a Slot)> {
    let is_it = |s: &&Slot| {
        s.serial == serial && s.role == Role::Answerer && !matches!(s.state, State::Open)
    };
    slots
        .get(&addr)
        .filter(is_it)
        .map(|s| (false, s))
        .or_else(|| replacing.get(&addr).filter(is_it).map(|s| (true, s)))
}

/// The body of an Accept or a Confirm: sender, receiver, both nonces, and the tag over
/// every byte before it.
#[derive(Clone, Copy)]
struct Tagged {
    sender: MemberId,
    receiver: MemberId,
    nonce_i: [u8; NONCE],
    nonce_r: [u8; NONCE],
    /// Bytes the tag covers.
    tagged: usize,
    tag: [u8; TAG],
}

impl Tagged {
    fn parse(data: &[u8], mut r: Reader<'_>) -> Option<Tagged> {
        let sender = MemberId::from_bytes(r.array::<32>().ok()?);
        let receiver = MemberId::from_bytes(r.array::<32>().ok()?);
        let nonce_i = r.array::<NONCE>().ok()?;
        let nonce_r = r.array::<NONCE>().ok()?;
        let tagged = data.len() - r.remaining();
        let tag = r.array::<TAG>().ok()?;
        r.is_empty().then_some(Tagged {
            sender,
            receiver,
            nonce_i,
            nonce_r,
            tagged,
            tag,
        })
    }
}

struct KdcPending {
    request: PairKeyRequest,
    resend_at: Timestamp,
    tries: u32,
    hint: Option<KdcError>,
}

/// KDC-mode pair channels, one per peer address. The same interface as
/// [`PairTable`](crate::pair::PairTable), plus [`handle_kdc`](Self::handle_kdc) for the
/// KDC's answers (datagrams from the KDC's address).
pub struct KdcPairTable {
    provider: CryptoProvider,
    me: MemberId,
    name: PrincipalName,
    key: PrincipalKey,
    kdc: SocketAddr,
    group: Vec<u8>,
    trust: TrustList,
    /// Trust every principal the KDC knows.
    trust_any: bool,
    rng: ChaCha20Rng,
    slots: BTreeMap<SocketAddr, Slot>,
    /// A new session answered at an address whose channel is open: it replaces that
    /// channel only once it is open itself (so a spoofed Hello cannot tear one down).
    replacing: BTreeMap<SocketAddr, Slot>,
    from_kdc: HashMap<MemberId, Secret>,
    /// Principals the KDC said it does not know, and when (at most 1024).
    unknown: HashMap<MemberId, Timestamp>,
    pending: BTreeMap<MemberId, KdcPending>,
    /// Deadlines of the sessions not yet open (in `slots` or `replacing`), ordered by time:
    /// [`handle_timeout`](Self::handle_timeout) visits only the addresses that are due and
    /// [`poll_timeout`](Self::poll_timeout) reads the first entry, instead of walking every
    /// slot (a leader of 10,000 holds 10,000 open channels and ticks every heartbeat).
    /// Every session not open has an entry at or before its `resend_at` (added by
    /// `schedule` when it is created or resent); an entry may be early or outlive its
    /// session (a spurious wake-up, harmless), never late.
    due: BTreeSet<(Timestamp, SocketAddr)>,
    /// Answered sessions (address and serial) in the order they were answered: a superset
    /// of those not yet open, each named once. Entries of sessions that opened or went are
    /// dropped when the queue reaches `MAX_HALF_OPEN`, so it holds at most that many and the
    /// half-open bound costs nothing per Hello until then (it used to collect every
    /// session not open into a new set on every Hello: most of a KDC leader's CPU in a cold
    /// start of thousands).
    answered: VecDeque<(SocketAddr, u64)>,
    /// Answered sessions waiting for σ from the KDC, by the principal they wait for: what
    /// an answer from the KDC opens, without a walk over every session in flight. A
    /// superset (sessions that moved on are skipped); a principal's list goes when the KDC
    /// answers for it, and keeps only its waiting sessions when its request gives up.
    awaiting_kdc: HashMap<MemberId, Vec<(SocketAddr, u64)>>,
    /// The last serial given to an answered session.
    last_serial: u64,
    /// By peer: addresses where a channel to it opened (a superset, checked on lookup), so
    /// that [`pair_key`](Self::pair_key) looks at a few slots, not all: a leader wraps a key
    /// for every member with it.
    opened: HashMap<MemberId, Vec<SocketAddr>>,
    outbox: VecDeque<(SocketAddr, Vec<u8>)>,
    events: VecDeque<PairEvent>,
    drops: PairDrops,
    /// Requests answered by the KDC (for benchmarks and tests).
    kdc_answers: u64,
}

impl KdcPairTable {
    /// A table for `credentials` in the group `group` accepting the principals in `trust`,
    /// or with `trust_any` every principal the KDC knows.
    pub fn new(
        provider: CryptoProvider,
        credentials: KdcCredentials,
        group: &str,
        trust: impl Into<TrustList>,
        trust_any: bool,
        seed: [u8; 32],
    ) -> Self {
        let name = group.as_bytes();
        KdcPairTable {
            provider,
            me: MemberId::from_principal(&credentials.name),
            name: credentials.name,
            key: credentials.key,
            kdc: credentials.kdc,
            group: name[..name.len().min(255)].to_vec(),
            trust: trust.into(),
            trust_any,
            rng: ChaCha20Rng::from_seed(seed),
            slots: BTreeMap::new(),
            replacing: BTreeMap::new(),
            from_kdc: HashMap::new(),
            unknown: HashMap::new(),
            pending: BTreeMap::new(),
            due: BTreeSet::new(),
            answered: VecDeque::new(),
            awaiting_kdc: HashMap::new(),
            last_serial: 0,
            opened: HashMap::new(),
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            drops: PairDrops::default(),
            kdc_answers: 0,
        }
    }

    /// The KDC's address.
    pub fn kdc(&self) -> SocketAddr {
        self.kdc
    }

    /// How many pair keys the KDC has sent this member.
    pub fn kdc_answers(&self) -> u64 {
        self.kdc_answers
    }

    /// The authenticated peer at `addr`, if its channel is open.
    pub fn peer_at(&self, addr: SocketAddr) -> Option<MemberId> {
        let s = self.slots.get(&addr)?;
        matches!(s.state, State::Open).then_some(s.peer).flatten()
    }

    /// A 32-byte secret both ends of the open channel to `peer` share (for key wraps).
    pub fn pair_key(&self, peer: &MemberId) -> Option<&Arc<PairKey>> {
        self.opened
            .get(peer)?
            .iter()
            .filter_map(|a| self.slots.get(a))
            .filter(|s| matches!(s.state, State::Open) && s.peer == Some(*peer))
            .max_by_key(|s| s.opened_at)
            .and_then(|s| s.keys.as_ref().map(|k| &k.wrap))
    }

    /// The drop counters.
    pub fn drops(&self) -> &PairDrops {
        &self.drops
    }

    /// Replaces the trust list; open channels to principals no longer trusted close.
    pub fn set_trust(&mut self, trust: impl Into<TrustList>) {
        self.trust = trust.into();
        self.close_where(PairFailure::NoLongerTrusted, |t, s| {
            s.peer.is_some_and(|p| !t.trusted(&p))
        });
        let (trust, any) = (&self.trust, self.trust_any);
        self.replacing
            .retain(|_, s| s.peer.is_none_or(|p| any || trust.contains(&p)));
    }

    /// Closes every channel that `doomed` picks (in address order), each reported as
    /// failed for `reason`.
    fn close_where(&mut self, reason: PairFailure, doomed: impl Fn(&Self, &Slot) -> bool) {
        let gone: Vec<SocketAddr> = self
            .slots
            .iter()
            .filter(|(_, s)| doomed(self, s))
            .map(|(a, _)| *a)
            .collect();
        for addr in gone {
            self.drop_slot(addr);
            self.events.push_back(PairEvent::Failed { addr, reason });
        }
    }

    /// Drops the channel to `addr`.
    pub fn forget(&mut self, addr: SocketAddr) {
        self.drop_slot(addr);
        self.replacing.remove(&addr);
    }

    /// Removes the slot at `addr` and its entry in `opened` (its entry in `due`, if any,
    /// goes when it is due).
    fn drop_slot(&mut self, addr: SocketAddr) -> Option<Slot> {
        let s = self.slots.remove(&addr)?;
        if let Some(peer) = s.peer.filter(|_| matches!(s.state, State::Open)) {
            if let Some(addrs) = self.opened.get_mut(&peer) {
                addrs.retain(|a| *a != addr);
                if addrs.is_empty() {
                    self.opened.remove(&peer);
                }
            }
        }
        Some(s)
    }

    /// The earliest deadline of the sessions at `addr` that are not open.
    fn deadline_at(&self, addr: SocketAddr) -> Option<Timestamp> {
        let slot = self
            .slots
            .get(&addr)
            .filter(|s| !matches!(s.state, State::Open))
            .map(|s| s.resend_at);
        let aside = self.replacing.get(&addr).map(|s| s.resend_at);
        slot.into_iter().chain(aside).min()
    }

    /// Lists `addr`'s earliest deadline in `due` (after a session there was created or its
    /// deadline moved).
    fn schedule(&mut self, addr: SocketAddr) {
        if let Some(t) = self.deadline_at(addr) {
            self.due.insert((t, addr));
        }
    }

    /// The slot at `addr` opened: records it in `opened` and takes its deadline out of
    /// `due` (keeping the one of a session aside at the same address).
    fn opened_at(&mut self, addr: SocketAddr) {
        let Some(s) = self.slots.get(&addr) else {
            return;
        };
        let (resend_at, peer) = (s.resend_at, s.peer);
        self.due.remove(&(resend_at, addr));
        self.schedule(addr);
        if let Some(peer) = peer {
            let slots = &self.slots;
            let addrs = self.opened.entry(peer).or_default();
            // Entries of channels that closed since go here.
            addrs.retain(|a| {
                *a != addr
                    && slots
                        .get(a)
                        .is_some_and(|s| s.peer == Some(peer) && matches!(s.state, State::Open))
            });
            addrs.push(addr);
        }
    }

    /// Runs `f` with the replacing session at `addr` standing in for the open one. If it is
    /// open afterwards it replaces the old channel; otherwise both go back as they were.
    fn with_replacing<R>(&mut self, addr: SocketAddr, f: impl FnOnce(&mut Self) -> R) -> R {
        let Some(new) = self.replacing.remove(&addr) else {
            return f(self);
        };
        let held = self.slots.insert(addr, new);
        let r = f(self);
        let opened = self
            .slots
            .get(&addr)
            .is_some_and(|s| matches!(s.state, State::Open));
        if !opened {
            if let Some(new) = self.slots.remove(&addr) {
                self.replacing.insert(addr, new);
            }
            if let Some(h) = held {
                self.slots.insert(addr, h);
            }
        }
        r
    }

    fn replacing_has(&self, addr: SocketAddr, nonce_i: &[u8; NONCE]) -> bool {
        self.replacing
            .get(&addr)
            .is_some_and(|s| s.nonce_i == *nonce_i)
    }

    /// Queues `data` for the peer at `addr`, opening a channel first if there is none. With
    /// `expect`, the peer must be exactly that principal.
    pub fn send(
        &mut self,
        now: Timestamp,
        addr: SocketAddr,
        expect: Option<MemberId>,
        data: &[u8],
    ) {
        if let Some(s) = self.slots.get_mut(&addr) {
            if let (Some(e), Some(p)) = (expect, s.peer.or(s.expect)) {
                if e != p {
                    self.drops.refused += 1;
                    self.events.push_back(PairEvent::Failed {
                        addr,
                        reason: PairFailure::NotExpected,
                    });
                    return;
                }
            }
            if s.expect.is_none() {
                s.expect = expect;
            }
            if matches!(s.state, State::Open) {
                self.seal(addr, data);
            } else if s.queue.len() < MAX_QUEUED {
                s.queue.push_back(Zeroizing::new(data.to_vec()));
            } else {
                self.drops.refused += 1;
            }
            return;
        }
        let mut queue = VecDeque::new();
        queue.push_back(Zeroizing::new(data.to_vec()));
        self.start_opener(now, addr, expect, queue);
    }

    /// Opens a session to `addr` as the opener (a Hello now, resent until answered), with
    /// `queue` waiting for it.
    fn start_opener(
        &mut self,
        now: Timestamp,
        addr: SocketAddr,
        expect: Option<MemberId>,
        queue: VecDeque<Zeroizing<Vec<u8>>>,
    ) {
        let mut nonce_i = [0u8; NONCE];
        self.rng.fill_bytes(&mut nonce_i);
        self.slots.insert(
            addr,
            Slot {
                expect,
                nonce_i,
                queue,
                ..Slot::new(Role::Opener, State::HelloSent, now)
            },
        );
        self.schedule(addr);
        self.send_hello(addr);
    }

    fn header(&self, w: &mut Writer<'_>, kind: u8) {
        w.u8(KDC_PAIR_KIND)
            .u8(VERSION)
            .u8(kind)
            .u8(self.group.len() as u8)
            .bytes(&self.group);
    }

    fn send_hello(&mut self, addr: SocketAddr) {
        let Some(s) = self.slots.get(&addr) else {
            return;
        };
        let mut out = Vec::with_capacity(64 + self.group.len());
        let mut w = Writer::new(&mut out);
        self.header(&mut w, 1);
        w.bytes(self.me.as_bytes()).bytes(&s.nonce_i);
        self.outbox.push_back((addr, out));
    }

    /// Tag and data keys of a session with σ between opener `i` and answerer `r`.
    fn session_keys(
        &self,
        sigma: &[u8],
        i: &MemberId,
        r: &MemberId,
        nonce_i: &[u8; NONCE],
        nonce_r: &[u8; NONCE],
        role: Role,
    ) -> Option<Keys> {
        let derive = |label: &[u8]| -> Option<Secret> {
            let mut k = Secret::zeroed(32);
            self.provider
                .hkdf_sha256
                .derive(
                    SALT,
                    sigma,
                    &[
                        &[self.group.len() as u8],
                        &self.group,
                        i.as_bytes(),
                        r.as_bytes(),
                        nonce_i,
                        nonce_r,
                        label,
                    ],
                    k.expose_mut(),
                )
                .ok()?;
            Some(k)
        };
        let (i2r, r2i) = (derive(b"i2r")?, derive(b"r2i")?);
        let aead = |k: &Secret| {
            self.provider
                .aead
                .new_key(AeadAlgorithm::Aes256Gcm, k.expose())
                .ok()
        };
        let (send, recv) = match role {
            Role::Opener => (aead(&i2r)?, aead(&r2i)?),
            Role::Answerer => (aead(&r2i)?, aead(&i2r)?),
        };
        Some(Keys {
            send,
            recv,
            mac: derive(b"mac")?,
            wrap: Arc::new(PairKey::new(&self.provider, derive(b"wrap")?).ok()?),
            sent: 0,
            highest: None,
            window: 0,
        })
    }

    fn tag(&self, mac: &Secret, label: &[u8], bytes: &[u8]) -> [u8; TAG] {
        let mut t = [0u8; TAG];
        self.provider
            .hmac_sha256
            .new_key(mac.expose())
            .sign(&[label, bytes], &mut t);
        t
    }

    fn trusted(&self, id: &MemberId) -> bool {
        *id != self.me && (self.trust_any || self.trust.contains(id))
    }

    /// A datagram whose first byte is [`KDC_PAIR_KIND`].
    pub fn handle_datagram(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        let mut r = Reader::new(data);
        let ok = r.u8().ok() == Some(KDC_PAIR_KIND) && r.u8().ok() == Some(VERSION);
        let Some(kind) = r.u8().ok().filter(|_| ok) else {
            self.drops.malformed += 1;
            return;
        };
        if kind == 4 {
            self.on_data(now, from, data, r);
            return;
        }
        if kind == 6 {
            self.on_reset(now, from, r);
            return;
        }
        let n = r.u8().map(usize::from).unwrap_or(usize::MAX);
        if r.bytes(n).ok() != Some(&self.group[..]) {
            self.drops.malformed += 1;
            return;
        }
        match kind {
            1 => self.on_hello(now, from, r),
            2 => self.on_accept(now, from, data, r),
            3 => self.on_confirm(now, from, data, r),
            5 => self.on_reject(from, r),
            _ => self.drops.malformed += 1,
        }
    }

    fn on_hello(&mut self, now: Timestamp, from: SocketAddr, mut r: Reader<'_>) {
        let (Ok(i), Ok(nonce_i)) = (r.array::<32>(), r.array::<NONCE>()) else {
            self.drops.malformed += 1;
            return;
        };
        if !r.is_empty() {
            self.drops.malformed += 1;
            return;
        }
        let i = MemberId::from_bytes(i);
        let Some(i_name) = i.principal() else {
            self.drops.malformed += 1;
            return;
        };
        if !self.trusted(&i) {
            self.drops.untrusted += 1;
            self.send_reject(from, &i, &nonce_i, REJECT_UNTRUSTED);
            return;
        }
        if let Some(s) = self.slots.get(&from) {
            if s.role == Role::Answerer && s.nonce_i == nonce_i {
                // A resent Hello: answer again (the Accept may have been lost).
                if matches!(s.state, State::Accepted | State::Open) {
                    self.send_accept(from);
                }
                return;
            }
            if s.role == Role::Opener && !matches!(s.state, State::Open) && self.me < i {
                // Both opened at once: the lower principal stays the opener.
                return;
            }
            if matches!(s.state, State::Open) {
                // The peer restarted, or someone spoofs its address: answer on the side, and
                // replace the open channel only once the new session opens.
                if self.replacing_has(from, &nonce_i) {
                    self.with_replacing(from, |t| {
                        if t.slots
                            .get(&from)
                            .is_some_and(|s| matches!(s.state, State::Accepted))
                        {
                            t.send_accept(from);
                        }
                    });
                    return;
                }
                self.replacing.remove(&from);
                let held = self.slots.remove(&from);
                self.answer(now, from, i, i_name, nonce_i);
                if let Some(new) = self.slots.remove(&from) {
                    self.replacing.insert(from, new);
                }
                if let Some(h) = held {
                    self.slots.insert(from, h);
                }
                return;
            }
        }
        if self
            .unknown
            .get(&i)
            .is_some_and(|t| now.saturating_duration_since(*t) < REFUSED_FOR)
        {
            // The KDC refused this principal a moment ago: refuse again without asking.
            self.drops.untrusted += 1;
            self.send_reject(from, &i, &nonce_i, REJECT_UNKNOWN);
            return;
        }
        self.answer(now, from, i, i_name, nonce_i);
    }

    /// Answers a Hello from trusted `i` at `from`: a new answerer session (keeping data
    /// queued for that address), with σ from the cache or a request to the KDC.
    fn answer(
        &mut self,
        now: Timestamp,
        from: SocketAddr,
        i: MemberId,
        i_name: PrincipalName,
        nonce_i: [u8; NONCE],
    ) {
        self.bound_half_open();
        let queue = self
            .slots
            .remove(&from)
            .map(|s| s.queue)
            .unwrap_or_default();
        let mut nonce_r = [0u8; NONCE];
        self.rng.fill_bytes(&mut nonce_r);
        self.last_serial += 1;
        let serial = self.last_serial;
        self.slots.insert(
            from,
            Slot {
                peer: Some(i),
                nonce_i,
                nonce_r,
                queue,
                serial,
                ..Slot::new(Role::Answerer, State::AwaitKdc, now)
            },
        );
        self.answered.push_back((from, serial));
        self.schedule(from);
        if self.from_kdc.contains_key(&i) {
            self.accept_with_cached(from);
            return;
        }
        if !self.pending.contains_key(&i) {
            if self.pending.len() >= MAX_KDC_PENDING {
                self.drops.refused += 1;
                self.slots.remove(&from);
                return;
            }
            let mut nonce = [0u8; NONCE];
            self.rng.fill_bytes(&mut nonce);
            match PairKeyRequest::new(&self.provider, self.name, &self.key, i_name, nonce) {
                Ok(request) => {
                    self.outbox.push_back((self.kdc, request.bytes().to_vec()));
                    self.pending.insert(
                        i,
                        KdcPending {
                            request,
                            resend_at: now.saturating_add(KDC_RESEND),
                            tries: 1,
                            hint: None,
                        },
                    );
                }
                Err(_) => {
                    self.drops.failed += 1;
                    self.slots.remove(&from);
                    return;
                }
            }
        }
        self.wait_for_kdc(i, from, serial);
    }

    /// At most `MAX_HALF_OPEN` answered sessions wait (for the KDC or a Confirm): before a
    /// new one, the oldest goes when the bound is reached. The oldest is the one that
    /// started first, a slot before a session aside, then the lower address.
    fn bound_half_open(&mut self) {
        if self.answered.len() < MAX_HALF_OPEN {
            return;
        }
        let (slots, replacing) = (&self.slots, &self.replacing);
        self.answered
            .retain(|&(a, serial)| half_open_in(slots, replacing, a, serial).is_some());
        if self.answered.len() < MAX_HALF_OPEN {
            return;
        }
        let oldest = self
            .answered
            .iter()
            .enumerate()
            .filter_map(|(k, &(a, serial))| {
                half_open_in(slots, replacing, a, serial)
                    .map(|(aside, s)| ((s.started, aside, a), k))
            })
            .min();
        let Some(((_, aside, a), k)) = oldest else {
            return;
        };
        self.answered.remove(k);
        let gone = if aside {
            self.replacing.remove(&a)
        } else {
            self.slots.remove(&a)
        };
        // Its deadline goes too (a flood would otherwise leave one early wake-up per
        // evicted session); one of another session at `a` is listed again.
        if let Some(gone) = gone {
            self.due.remove(&(gone.resend_at, a));
            self.schedule(a);
        }
        self.drops.refused += 1;
    }

    /// The answered session `serial` at `addr` waits for σ of `peer` from the KDC.
    fn wait_for_kdc(&mut self, peer: MemberId, addr: SocketAddr, serial: u64) {
        // Lists of principals whose requests gave up keep sessions that have since gone:
        // past a bound on the principals listed, every list keeps only what still waits.
        if self.awaiting_kdc.len() > MAX_HALF_OPEN + MAX_KDC_PENDING {
            let (slots, replacing) = (&self.slots, &self.replacing);
            self.awaiting_kdc.retain(|_, list| {
                list.retain(|&(a, n)| waits_for_kdc(slots, replacing, a, n));
                !list.is_empty()
            });
        }
        let list = self.awaiting_kdc.entry(peer).or_default();
        if list.len() >= MAX_HALF_OPEN {
            // A flood of Hellos for one principal while its request is out.
            let (slots, replacing) = (&self.slots, &self.replacing);
            list.retain(|&(a, n)| waits_for_kdc(slots, replacing, a, n));
        }
        list.push((addr, serial));
    }

    /// σ for the opener at `addr` came (or was cached): derive the session, send Accept.
    fn accept_with_cached(&mut self, addr: SocketAddr) {
        let Some(s) = self.slots.get(&addr) else {
            return;
        };
        let Some(i) = s.peer else {
            return;
        };
        let Some(sigma) = self.from_kdc.get(&i) else {
            return;
        };
        let keys = self.session_keys(
            sigma.expose(),
            &i,
            &self.me,
            &s.nonce_i,
            &s.nonce_r,
            Role::Answerer,
        );
        let Some(s) = self.slots.get_mut(&addr) else {
            return;
        };
        s.keys = keys;
        s.state = State::Accepted;
        self.send_accept(addr);
    }

    fn send_accept(&mut self, addr: SocketAddr) {
        self.send_tagged(addr, 2, b"accept");
    }

    /// Accept (`kind` 2, label "accept") or Confirm (3, "confirm") for the session at
    /// `addr`: this side, the peer, both nonces and a tag under the session's key.
    fn send_tagged(&mut self, addr: SocketAddr, kind: u8, label: &[u8]) {
        let Some(s) = self.slots.get(&addr) else {
            return;
        };
        let (Some(peer), Some(keys)) = (s.peer, s.keys.as_ref()) else {
            return;
        };
        let mut out = Vec::with_capacity(160);
        let mut w = Writer::new(&mut out);
        self.header(&mut w, kind);
        w.bytes(self.me.as_bytes())
            .bytes(peer.as_bytes())
            .bytes(&s.nonce_i)
            .bytes(&s.nonce_r);
        let tag = self.tag(&keys.mac, label, &out);
        out.extend_from_slice(&tag);
        self.outbox.push_back((addr, out));
    }

    fn send_reject(&mut self, addr: SocketAddr, i: &MemberId, nonce_i: &[u8; NONCE], why: u8) {
        let mut out = Vec::with_capacity(120);
        let mut w = Writer::new(&mut out);
        self.header(&mut w, 5);
        w.bytes(self.me.as_bytes())
            .bytes(i.as_bytes())
            .bytes(nonce_i)
            .u8(why);
        self.outbox.push_back((addr, out));
    }

    fn on_accept(&mut self, now: Timestamp, from: SocketAddr, data: &[u8], r: Reader<'_>) {
        let Some(Tagged {
            sender: rid,
            receiver: iid,
            nonce_i: ni,
            nonce_r: nr,
            tagged,
            tag,
        }) = Tagged::parse(data, r)
        else {
            self.drops.malformed += 1;
            return;
        };
        let Some(s) = self.slots.get(&from) else {
            self.drops.unexpected += 1;
            return;
        };
        if s.role != Role::Opener || s.nonce_i != ni || iid != self.me {
            self.drops.unexpected += 1;
            return;
        }
        if matches!(s.state, State::Open) {
            if s.nonce_r == nr {
                self.send_confirm(from); // our Confirm was lost
            }
            return;
        }
        let Some(r_name) = rid.principal() else {
            self.drops.malformed += 1;
            return;
        };
        if !self.trusted(&rid) || s.expect.is_some_and(|e| e != rid) {
            self.drops.untrusted += 1;
            return;
        }
        let sigma = member_shared_key(&self.provider, &self.key, &r_name);
        let Some(keys) = self.session_keys(sigma.expose(), &self.me, &rid, &ni, &nr, Role::Opener)
        else {
            return;
        };
        if !ct_eq(&self.tag(&keys.mac, b"accept", &data[..tagged]), &tag) {
            self.drops.untrusted += 1;
            return;
        }
        let Some(s) = self.slots.get_mut(&from) else {
            return;
        };
        s.peer = Some(rid);
        s.nonce_r = nr;
        s.keys = Some(keys);
        s.last_heard = now;
        self.send_confirm(from);
        self.open(now, from);
    }

    fn send_confirm(&mut self, addr: SocketAddr) {
        self.send_tagged(addr, 3, b"confirm");
    }

    fn on_confirm(&mut self, now: Timestamp, from: SocketAddr, data: &[u8], r: Reader<'_>) {
        let Some(confirm) = Tagged::parse(data, r) else {
            self.drops.malformed += 1;
            return;
        };
        if self.replacing_has(from, &confirm.nonce_i) {
            self.with_replacing(from, |t| t.confirm(now, from, data, &confirm));
            return;
        }
        self.confirm(now, from, data, &confirm);
    }

    fn confirm(&mut self, now: Timestamp, from: SocketAddr, data: &[u8], c: &Tagged) {
        let Tagged {
            sender: iid,
            receiver: rid,
            nonce_i: ni,
            nonce_r: nr,
            tagged,
            tag,
        } = *c;
        let Some(s) = self.slots.get(&from) else {
            self.drops.unexpected += 1;
            return;
        };
        let fits = s.role == Role::Answerer
            && s.peer == Some(iid)
            && rid == self.me
            && s.nonce_i == ni
            && s.nonce_r == nr;
        let Some(keys) = s.keys.as_ref().filter(|_| fits) else {
            self.drops.unexpected += 1;
            return;
        };
        if !ct_eq(&self.tag(&keys.mac, b"confirm", &data[..tagged]), &tag) {
            self.drops.untrusted += 1;
            return;
        }
        if !matches!(s.state, State::Open) {
            self.open(now, from);
        }
        if let Some(s) = self.slots.get_mut(&from) {
            s.last_heard = now;
        }
    }

    fn on_reject(&mut self, from: SocketAddr, mut r: Reader<'_>) {
        let parsed = (|| {
            let _rid = r.array::<32>().ok()?;
            let iid = MemberId::from_bytes(r.array::<32>().ok()?);
            let ni = r.array::<NONCE>().ok()?;
            let why = r.u8().ok()?;
            r.is_empty().then_some((iid, ni, why))
        })();
        let Some((iid, ni, why)) = parsed else {
            self.drops.malformed += 1;
            return;
        };
        let fits = self.slots.get(&from).is_some_and(|s| {
            s.role == Role::Opener
                && s.nonce_i == ni
                && iid == self.me
                && !matches!(s.state, State::Open)
        });
        if !fits {
            self.drops.unexpected += 1;
            return;
        }
        self.slots.remove(&from);
        self.drops.failed += 1;
        let reason = match why {
            REJECT_UNKNOWN => PairFailure::RefusedKdcUnknown,
            REJECT_UNTRUSTED => PairFailure::RefusedUntrusted,
            _ => PairFailure::Refused,
        };
        self.events
            .push_back(PairEvent::Failed { addr: from, reason });
    }

    fn on_reset(&mut self, now: Timestamp, from: SocketAddr, mut r: Reader<'_>) {
        let Some(ni) = r.array::<NONCE>().ok().filter(|_| r.is_empty()) else {
            self.drops.malformed += 1;
            return;
        };
        let held = self.slots.get(&from).is_some_and(|s| {
            s.nonce_i == ni
                && matches!(s.state, State::Open)
                && now.saturating_duration_since(s.last_heard) >= RESET_QUIET
        });
        if !held {
            self.drops.unexpected += 1;
            return;
        }
        self.drop_slot(from);
        self.events.push_back(PairEvent::Failed {
            addr: from,
            reason: PairFailure::PeerLostChannel,
        });
    }

    fn open(&mut self, now: Timestamp, addr: SocketAddr) {
        let Some(s) = self.slots.get_mut(&addr) else {
            return;
        };
        s.state = State::Open;
        s.opened_at = Some(now);
        let Some(peer) = s.peer else {
            return;
        };
        self.opened_at(addr);
        let Some(s) = self.slots.get_mut(&addr) else {
            return;
        };
        let queued: Vec<Zeroizing<Vec<u8>>> = s.queue.drain(..).collect();
        self.events.push_back(PairEvent::Established { peer, addr });
        for d in queued {
            self.seal(addr, &d);
        }
    }

    fn seal(&mut self, addr: SocketAddr, data: &[u8]) {
        let Some(s) = self.slots.get_mut(&addr) else {
            return;
        };
        let Some(keys) = s.keys.as_mut() else {
            return;
        };
        let counter = keys.sent;
        keys.sent += 1;
        let mut out = Vec::with_capacity(data.len() + 48);
        Writer::new(&mut out)
            .u8(KDC_PAIR_KIND)
            .u8(VERSION)
            .u8(4)
            .bytes(&s.nonce_i)
            .u64(counter);
        let aad_len = out.len();
        out.extend_from_slice(data);
        let mut nonce = [0u8; 12];
        nonce[4..].copy_from_slice(&counter.to_be_bytes());
        let (aad, body) = out.split_at_mut(aad_len);
        match keys.send.seal_in_place(&nonce, aad, body) {
            Ok(tag) => {
                out.extend_from_slice(&tag);
                self.outbox.push_back((addr, out));
            }
            Err(_) => self.drops.failed += 1,
        }
    }

    fn on_data(&mut self, now: Timestamp, from: SocketAddr, data: &[u8], mut r: Reader<'_>) {
        let (Ok(ni), Ok(counter)) = (r.array::<NONCE>(), r.u64()) else {
            self.drops.malformed += 1;
            return;
        };
        if self.replacing_has(from, &ni) {
            let rest = r.remaining();
            self.with_replacing(from, |t| t.data(now, from, data, ni, counter, rest));
            return;
        }
        let rest = r.remaining();
        self.data(now, from, data, ni, counter, rest);
    }

    fn data(
        &mut self,
        now: Timestamp,
        from: SocketAddr,
        data: &[u8],
        ni: [u8; NONCE],
        counter: u64,
        remaining: usize,
    ) {
        let aad_len = data.len() - remaining;
        if remaining < 16 {
            self.drops.malformed += 1;
            return;
        }
        let held = self
            .slots
            .get(&from)
            .is_some_and(|s| s.nonce_i == ni && s.keys.is_some());
        if !held {
            // Not a session we hold: tell the sender, so it opens a new one.
            self.drops.unexpected += 1;
            let mut out = Vec::with_capacity(20);
            Writer::new(&mut out)
                .u8(KDC_PAIR_KIND)
                .u8(VERSION)
                .u8(6)
                .bytes(&ni);
            self.outbox.push_back((from, out));
            return;
        }
        let Some(s) = self.slots.get_mut(&from) else {
            return;
        };
        let Some(keys) = s.keys.as_mut() else {
            return;
        };
        if let Some(h) = keys.highest {
            if counter.saturating_add(64) <= h
                || (counter <= h && keys.window & (1 << (h - counter)) != 0)
            {
                self.drops.unexpected += 1;
                return;
            }
        }
        let mut nonce = [0u8; 12];
        nonce[4..].copy_from_slice(&counter.to_be_bytes());
        let mut buf = data[aad_len..].to_vec();
        let Ok(plain) = keys.recv.open_in_place(&nonce, &data[..aad_len], &mut buf) else {
            self.drops.unexpected += 1;
            return;
        };
        let plain = plain.to_vec();
        match keys.highest {
            Some(h) if counter <= h => keys.window |= 1 << (h - counter),
            Some(h) => {
                let shift = counter - h;
                keys.window = if shift >= 64 { 0 } else { keys.window << shift };
                keys.window |= 1;
                keys.highest = Some(counter);
            }
            None => {
                keys.window = 1;
                keys.highest = Some(counter);
            }
        }
        s.last_heard = now;
        let Some(peer) = s.peer else {
            return;
        };
        // Data under the session's keys proves the opener got our Accept.
        if !matches!(s.state, State::Open) {
            s.state = State::Open;
            s.opened_at = Some(s.started);
            self.opened_at(from);
            self.events
                .push_back(PairEvent::Established { peer, addr: from });
            let queued: Vec<Zeroizing<Vec<u8>>> = self
                .slots
                .get_mut(&from)
                .map(|s| s.queue.drain(..).collect())
                .unwrap_or_default();
            for d in queued {
                self.seal(from, &d);
            }
        }
        self.events.push_back(PairEvent::Message {
            peer,
            addr: from,
            data: plain,
        });
    }

    /// A datagram from the KDC's address: the answer to one of this table's requests.
    pub fn handle_kdc(&mut self, now: Timestamp, data: &[u8]) {
        // An answer that names its principal is tried against that principal's request
        // alone (with `MAX_KDC_PENDING` requests out, trying each cost up to that many MAC
        // checks an answer). A hint names none: it is tried against every request.
        let named = match Response::parse(data).map(|r| r.body) {
            Ok(ResponseBody::PairKey { principal, .. })
            | Ok(ResponseBody::UnknownPrincipal { principal, .. }) => {
                Some(MemberId::from_principal(&principal))
            }
            _ => None,
        };
        let mut done = None;
        let candidates = self
            .pending
            .iter_mut()
            .filter(|(peer, _)| named.is_none_or(|m| **peer == m));
        for (peer, p) in candidates {
            match p.request.open_response(data) {
                Ok(sigma) => {
                    done = Some((*peer, Ok(Secret::from_slice(sigma.expose()))));
                    break;
                }
                Err(e @ KdcError::UnknownPrincipal(_)) => {
                    done = Some((*peer, Err(e)));
                    break;
                }
                Err(e) if e.is_hint() && matches!(e, KdcError::UnknownRequester(_)) => {
                    p.hint = Some(e);
                }
                Err(_) => {}
            }
        }
        let Some((peer, outcome)) = done else {
            self.drops.unexpected += 1;
            return;
        };
        self.pending.remove(&peer);
        // The sessions waiting for this σ, slots then sessions aside, each in address order.
        let (mut waiting, mut waiting_aside) = (Vec::new(), Vec::new());
        for (a, serial) in self.awaiting_kdc.remove(&peer).unwrap_or_default() {
            match half_open_in(&self.slots, &self.replacing, a, serial) {
                Some((aside, s)) if s.peer == Some(peer) && matches!(s.state, State::AwaitKdc) => {
                    if aside {
                        waiting_aside.push(a);
                    } else {
                        waiting.push(a);
                    }
                }
                _ => {}
            }
        }
        waiting.sort_unstable();
        waiting_aside.sort_unstable();
        match outcome {
            Ok(sigma) => {
                self.kdc_answers += 1;
                if self.from_kdc.len() >= MAX_CACHED {
                    self.from_kdc.clear();
                }
                self.from_kdc.insert(peer, sigma);
                for a in waiting {
                    self.accept_with_cached(a);
                }
                for a in waiting_aside {
                    self.with_replacing(a, |t| t.accept_with_cached(a));
                }
            }
            Err(_) => {
                if self.unknown.len() >= 1024 {
                    self.unknown.clear();
                }
                self.unknown.insert(peer, now);
                for a in waiting_aside {
                    self.replacing.remove(&a);
                }
                for a in waiting {
                    let nonce_i = self.slots.get(&a).map(|s| s.nonce_i).unwrap_or_default();
                    self.send_reject(a, &peer, &nonce_i, REJECT_UNKNOWN);
                    self.slots.remove(&a);
                    self.drops.untrusted += 1;
                    self.events.push_back(PairEvent::Failed {
                        addr: a,
                        reason: PairFailure::KdcUnknownPrincipal,
                    });
                }
            }
        }
    }

    /// Resends what is due and gives up on channels and requests that waited too long.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        // Only the addresses whose deadline passed (see `due`); each is listed again below
        // with its next deadline if a session there is still not open.
        let mut addrs = BTreeSet::new();
        while let Some(&(t, addr)) = self.due.first() {
            if t > now {
                break;
            }
            self.due.remove(&(t, addr));
            addrs.insert(addr);
        }
        for &addr in &addrs {
            self.timeout_slot(now, addr);
        }
        for &addr in &addrs {
            self.timeout_aside(now, addr);
        }
        for &addr in &addrs {
            self.schedule(addr);
        }
        self.timeout_kdc(now);
    }

    /// [`handle_timeout`](Self::handle_timeout) for the slot at `addr`: resend, or give up.
    fn timeout_slot(&mut self, now: Timestamp, addr: SocketAddr) {
        let Some(s) = self.slots.get_mut(&addr) else {
            return;
        };
        if matches!(s.state, State::Open) || now < s.resend_at {
            return;
        }
        if now.saturating_duration_since(s.started) >= GIVE_UP {
            let reason = match s.state {
                State::AwaitKdc => PairFailure::KdcDidNotAnswer,
                _ => PairFailure::NoAnswer,
            };
            self.slots.remove(&addr);
            self.drops.failed += 1;
            self.events.push_back(PairEvent::Failed { addr, reason });
            return;
        }
        if s.role == Role::Answerer
            && matches!(s.state, State::Accepted)
            && !s.queue.is_empty()
            && now.saturating_duration_since(s.started) >= REOPEN
        {
            // Our Accepts go unanswered while data waits: the opener may have dropped its
            // session (a member forgets the channels of those it removes) and will not
            // send another Hello. Open one of our own rather than hold the data until
            // GIVE_UP: a ticket queued here once held a merge back by 4 s
            // (tests/chaos_schedule.rs, KDC mode).
            let (expect, queue) = (s.expect.or(s.peer), std::mem::take(&mut s.queue));
            self.slots.remove(&addr);
            self.start_opener(now, addr, expect, queue);
            return;
        }
        s.resend_at = now.saturating_add(RESEND);
        match s.state {
            State::HelloSent => self.send_hello(addr),
            State::Accepted => self.send_accept(addr),
            _ => {}
        }
    }

    /// [`handle_timeout`](Self::handle_timeout) for the session aside at `addr`.
    fn timeout_aside(&mut self, now: Timestamp, addr: SocketAddr) {
        let Some(s) = self.replacing.get_mut(&addr) else {
            return;
        };
        if now < s.resend_at {
            return;
        }
        if now.saturating_duration_since(s.started) >= GIVE_UP {
            self.replacing.remove(&addr);
            self.drops.failed += 1;
            return;
        }
        s.resend_at = now.saturating_add(RESEND);
        if matches!(s.state, State::Accepted) {
            self.with_replacing(addr, |t| t.send_accept(addr));
        }
    }

    /// [`handle_timeout`](Self::handle_timeout) for the requests to the KDC (at most
    /// `MAX_KDC_PENDING`).
    fn timeout_kdc(&mut self, now: Timestamp) {
        let due: Vec<MemberId> = self
            .pending
            .iter()
            .filter(|(_, p)| now >= p.resend_at)
            .map(|(m, _)| *m)
            .collect();
        for m in due {
            let Some(p) = self.pending.get_mut(&m) else {
                continue;
            };
            if p.tries >= KDC_TRIES {
                // The KDC never answered with a key. If it said (unauthenticated) that it
                // does not know this member, pass that on.
                let hinted = p.hint.is_some();
                self.pending.remove(&m);
                if hinted {
                    self.close_where(PairFailure::KdcUnknownMemberHint, |_, s| {
                        s.peer == Some(m) && matches!(s.state, State::AwaitKdc)
                    });
                }
                // A later request for `m` may still open the sessions that wait.
                let (slots, replacing) = (&self.slots, &self.replacing);
                if let Some(list) = self.awaiting_kdc.get_mut(&m) {
                    list.retain(|&(a, n)| waits_for_kdc(slots, replacing, a, n));
                    if list.is_empty() {
                        self.awaiting_kdc.remove(&m);
                    }
                }
                continue;
            }
            p.tries += 1;
            p.resend_at = now.saturating_add(KDC_RESEND);
            // A fresh nonce for every retry: the KDC drops a nonce it has seen, so when the
            // first request got through and only the answer was lost (a one-way cut from
            // the KDC), resending the same bytes could never succeed (found in KDC mode by
            // tests/chaos_schedule.rs). A late answer to the old nonce no longer opens.
            let Some(peer_name) = m.principal() else {
                continue;
            };
            let mut nonce = [0u8; NONCE];
            self.rng.fill_bytes(&mut nonce);
            let Ok(request) =
                PairKeyRequest::new(&self.provider, self.name, &self.key, peer_name, nonce)
            else {
                continue;
            };
            let bytes = request.bytes().to_vec();
            if let Some(p) = self.pending.get_mut(&m) {
                p.request = request;
            }
            self.outbox.push_back((self.kdc, bytes));
        }
    }

    /// The next datagram to send.
    pub fn poll_transmit(&mut self, _now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
        let (destination, d) = self.outbox.pop_front()?;
        buf.extend_from_slice(&d);
        Some(Transmit {
            destination,
            size: d.len(),
        })
    }

    /// When [`handle_timeout`](Self::handle_timeout) must run next.
    /// (The first entry of `due`, which may be early: a spurious call is harmless.)
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        self.due
            .first()
            .map(|(t, _)| *t)
            .into_iter()
            .chain(self.pending.values().map(|p| p.resend_at))
            .min()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<PairEvent> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_kdc::{Kdc, Registry};

    const A: &str = "10.0.0.1:7000";
    const B: &str = "10.0.0.2:7000";
    const KDC: &str = "10.0.0.9:7600";

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("addr")
    }

    fn name(s: &str) -> PrincipalName {
        PrincipalName::new(s).expect("name")
    }

    fn table(me: &str, peer: &str, seed: u8) -> KdcPairTable {
        table_trusting(me, vec![MemberId::from_principal(&name(peer))], false, seed)
    }

    /// The table of `me` ("a", "b" or "c", long-term keys 1, 2, 3), trusting `trust` (or,
    /// with `any`, every principal the KDC knows).
    fn table_trusting(me: &str, trust: Vec<MemberId>, any: bool, seed: u8) -> KdcPairTable {
        let key = match me {
            "a" => 1,
            "b" => 2,
            _ => 3,
        };
        KdcPairTable::new(
            CryptoProvider::default_provider(),
            KdcCredentials {
                name: name(me),
                key: PrincipalKey::from_bytes([key; 32]),
                kdc: addr(KDC),
            },
            "g",
            trust,
            any,
            [seed; 32],
        )
    }

    fn kdc() -> Kdc {
        let mut r = Registry::new();
        r.insert(name("a"), PrincipalKey::from_bytes([1; 32]));
        r.insert(name("b"), PrincipalKey::from_bytes([2; 32]));
        Kdc::new(CryptoProvider::default_provider(), r)
    }

    /// Delivers everything both tables and the KDC send; returns the datagrams A sent.
    fn pump(now: Timestamp, a: &mut KdcPairTable, b: &mut KdcPairTable, k: &mut Kdc) {
        let mut buf = Vec::new();
        for _ in 0..32 {
            let moved_a = drain(now, a, addr(A), b, k, &mut buf);
            let moved_b = drain(now, b, addr(B), a, k, &mut buf);
            if !(moved_a || moved_b) {
                return;
            }
        }
    }

    /// Delivers everything `from` (at `at`) sends now: to the KDC (and the KDC's answer
    /// back to `from`) or to `to`. Whether it sent anything.
    fn drain(
        now: Timestamp,
        from: &mut KdcPairTable,
        at: SocketAddr,
        to: &mut KdcPairTable,
        k: &mut Kdc,
        buf: &mut Vec<u8>,
    ) -> bool {
        let mut moved = false;
        while let Some(t) = from.poll_transmit(now, buf) {
            moved = true;
            let d = buf[..t.size].to_vec();
            buf.clear();
            if t.destination == addr(KDC) {
                if let Some(r) = k.handle_request(at, &d) {
                    from.handle_kdc(now, &r);
                }
            } else {
                to.handle_datagram(now, at, &d);
            }
        }
        moved
    }

    /// A Hello of group "g" from principal `who`, every nonce byte `nonce` (anyone can
    /// send one: it is not authenticated).
    fn hello_from(who: &str, nonce: u8) -> Vec<u8> {
        let mut h = Vec::new();
        Writer::new(&mut h)
            .u8(KDC_PAIR_KIND)
            .u8(VERSION)
            .u8(1)
            .u8(1)
            .bytes(b"g")
            .bytes(MemberId::from_principal(&name(who)).as_bytes())
            .bytes(&[nonce; NONCE]);
        h
    }

    fn messages(t: &mut KdcPairTable) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(e) = t.poll_event() {
            if let PairEvent::Message { data, .. } = e {
                out.push(data);
            }
        }
        out
    }

    fn open_pair() -> (KdcPairTable, KdcPairTable, Kdc, Timestamp) {
        let now = Timestamp::from_millis(1000);
        let (mut a, mut b, mut k) = (table("a", "b", 1), table("b", "a", 2), kdc());
        b.send(now, addr(A), None, b"hello");
        pump(now, &mut a, &mut b, &mut k);
        assert_eq!(messages(&mut a), vec![b"hello".to_vec()]);
        assert_eq!(
            a.peer_at(addr(B)),
            Some(MemberId::from_principal(&name("b")))
        );
        assert_eq!(a.kdc_answers(), 1, "the answerer asked the KDC once");
        (a, b, k, now)
    }

    #[test]
    fn a_spoofed_hello_does_not_tear_down_an_open_channel() {
        let (mut a, mut b, mut k, now) = open_pair();
        let mut hello = hello_from("b", 0x77);
        let last = hello.len() - 1;
        for i in 0..100 {
            hello[last] = i;
            a.handle_datagram(now, addr(B), &hello);
        }
        assert!(
            a.peer_at(addr(B)).is_some(),
            "the open channel was replaced"
        );
        b.send(now, addr(A), None, b"still here");
        pump(now, &mut a, &mut b, &mut k);
        assert!(messages(&mut a).contains(&b"still here".to_vec()));
        // At most MAX_HALF_OPEN sessions wait on the side.
        assert!(a.replacing.len() <= 1 && a.slots.len() <= MAX_HALF_OPEN + 1);
    }

    /// Hellos from one principal at more addresses than the half-open bound, while its one
    /// request to the KDC is out: the index of answered sessions and the list of those
    /// waiting for σ stay within the bound, and the KDC's answer sends an Accept to every
    /// session that still waits (the newest `MAX_HALF_OPEN`), in address order, and to no
    /// evicted one.
    #[test]
    fn sessions_waiting_for_the_kdc_stay_bounded_and_all_open_on_its_answer() {
        let now = Timestamp::from_millis(1000);
        let (mut a, mut k) = (table("a", "b", 1), kdc());
        let b_id = MemberId::from_principal(&name("b"));
        let spoofed = |i: usize| SocketAddr::from(([172, 16, (i >> 8) as u8, i as u8], 4000));
        let extra = 300;
        let (mut buf, mut requests) = (Vec::new(), Vec::new());
        for i in 0..MAX_HALF_OPEN + extra {
            a.handle_datagram(now, spoofed(i), &hello_from("b", i as u8));
            while let Some(t) = a.poll_transmit(now, &mut buf) {
                assert_eq!(t.destination, addr(KDC), "nothing but the KDC request yet");
                requests.push(buf[..t.size].to_vec());
                buf.clear();
            }
            assert!(a.answered.len() <= MAX_HALF_OPEN);
            assert!(a.awaiting_kdc.get(&b_id).map_or(0, Vec::len) <= MAX_HALF_OPEN);
        }
        assert_eq!(requests.len(), 1, "one request per principal in flight");
        assert_eq!(a.drops.refused, extra as u64, "the oldest went");
        let answer = k
            .handle_request(addr(A), &requests[0])
            .expect("the KDC answers");
        a.handle_kdc(now, &answer);
        let mut accepted = Vec::new();
        while let Some(t) = a.poll_transmit(now, &mut buf) {
            assert_eq!(buf[2], 2, "an Accept");
            accepted.push(t.destination);
            buf.clear();
        }
        let expected: Vec<SocketAddr> = (extra..MAX_HALF_OPEN + extra).map(spoofed).collect();
        assert_eq!(accepted, expected);
        assert!(a.awaiting_kdc.is_empty());
        assert_eq!(a.kdc_answers(), 1);
    }

    /// With requests out for two principals, each answer from the KDC opens the sessions
    /// of the principal it names and no other, in whichever order the answers come; an
    /// answer with a broken MAC opens nothing and is counted.
    #[test]
    fn a_kdc_answer_opens_only_the_sessions_of_the_principal_it_names() {
        let now = Timestamp::from_millis(1000);
        let trust = ["b", "c"].map(|p| MemberId::from_principal(&name(p)));
        let mut a = table_trusting("a", trust.to_vec(), false, 1);
        let mut k = kdc();
        k.replace_registry({
            let mut r = Registry::new();
            r.insert(name("a"), PrincipalKey::from_bytes([1; 32]));
            r.insert(name("b"), PrincipalKey::from_bytes([2; 32]));
            r.insert(name("c"), PrincipalKey::from_bytes([3; 32]));
            r
        });
        let (at_b, at_c) = (addr("10.0.0.2:7000"), addr("10.0.0.3:7000"));
        a.handle_datagram(now, at_b, &hello_from("b", 1));
        a.handle_datagram(now, at_c, &hello_from("c", 2));
        let mut buf = Vec::new();
        let mut answers = Vec::new();
        while let Some(t) = a.poll_transmit(now, &mut buf) {
            assert_eq!(t.destination, addr(KDC));
            answers.push(k.handle_request(addr(A), &buf[..t.size]).expect("answered"));
            buf.clear();
        }
        assert_eq!(answers.len(), 2, "one request per principal");
        let mut sent_to = |a: &mut KdcPairTable| {
            let mut to = Vec::new();
            while let Some(t) = a.poll_transmit(now, &mut buf) {
                assert_eq!(buf[2], 2, "an Accept");
                to.push(t.destination);
                buf.clear();
            }
            to
        };
        let mut forged = answers[1].clone();
        let last = forged.len() - 1;
        forged[last] ^= 1;
        a.handle_kdc(now, &forged);
        assert!(sent_to(&mut a).is_empty());
        assert_eq!(a.drops.unexpected, 1);
        a.handle_kdc(now, &answers[1]);
        assert_eq!(sent_to(&mut a), vec![at_c]);
        a.handle_kdc(now, &answers[0]);
        assert_eq!(sent_to(&mut a), vec![at_b]);
        assert_eq!(a.kdc_answers(), 2);
        a.handle_kdc(now, &answers[0]);
        assert!(sent_to(&mut a).is_empty(), "an answer is taken once");
        assert_eq!(a.drops.unexpected, 2);
    }

    #[test]
    fn half_open_sessions_are_bounded_oldest_first_and_time_out_through_the_index() {
        let (mut a, _, _, now) = open_pair();
        let b_id = MemberId::from_principal(&name("b"));
        let spoofed = |i: usize| SocketAddr::from(([172, 16, (i >> 8) as u8, i as u8], 4000));
        let extra = 76;
        // Hellos from b's principal at other addresses, one ms apart: σ is cached, so each
        // is answered at once and waits for a Confirm (half-open).
        for i in 0..MAX_HALF_OPEN + extra {
            let at = now.saturating_add(Duration::from_millis(i as u64));
            a.handle_datagram(at, spoofed(i), &hello_from("b", i as u8));
        }
        assert_eq!(
            a.slots.len(),
            MAX_HALF_OPEN + 1,
            "the bound, and the open channel"
        );
        assert_eq!(a.drops.refused, extra as u64);
        assert!(
            (0..extra).all(|i| !a.slots.contains_key(&spoofed(i))),
            "oldest first"
        );
        assert!(a.slots.contains_key(&spoofed(extra)));
        assert!(a.pair_key(&b_id).is_some() && a.peer_at(addr(B)) == Some(b_id));
        // The next deadline is the oldest waiting session's resend (every open channel has
        // none), and the index drops each session that gives up.
        let first = now.saturating_add(Duration::from_millis(extra as u64) + RESEND);
        assert_eq!(a.poll_timeout(), Some(first));
        let mut ticks = 0;
        while let Some(t) = a.poll_timeout() {
            a.handle_timeout(t);
            ticks += 1;
            assert!(ticks < 100_000, "the timers do not end");
        }
        assert_eq!(a.slots.len(), 1, "only the open channel is left");
        assert!(a.due.is_empty());
        assert_eq!(a.drops.failed, MAX_HALF_OPEN as u64);
        assert!(a.pair_key(&b_id).is_some());
    }

    #[test]
    fn a_restarted_peer_replaces_the_channel_once_its_new_session_opens() {
        let (mut a, _, mut k, now) = open_pair();
        let mut b2 = table("b", "a", 3); // same principal, new process (other nonces)
        b2.send(now, addr(A), None, b"again");
        pump(now, &mut a, &mut b2, &mut k);
        assert!(messages(&mut a).contains(&b"again".to_vec()));
        a.send(now, addr(B), None, b"back");
        pump(now, &mut a, &mut b2, &mut k);
        assert_eq!(messages(&mut b2), vec![b"back".to_vec()]);
    }

    /// The opener forgets its half-open session (a member forgets the channels of those it
    /// removes) while the answerer's Accept is on the way: the answerer, with data to send
    /// back, opens a session of its own after [`REOPEN`] instead of holding the data until
    /// [`GIVE_UP`] and dropping it (found in KDC mode by tests/chaos_schedule.rs).
    #[test]
    fn an_answerer_whose_opener_forgot_the_session_opens_its_own_for_waiting_data() {
        let start = Timestamp::from_millis(1000);
        let (mut a, mut b, mut k) = (table("a", "b", 1), table("b", "a", 2), kdc());
        b.send(start, addr(A), None, b"first");
        let mut buf = Vec::new();
        drain(start, &mut b, addr(B), &mut a, &mut k, &mut buf);
        // A asks the KDC and answers; its Accept is lost, and B forgets the session.
        while let Some(t) = a.poll_transmit(start, &mut buf) {
            let d = buf[..t.size].to_vec();
            buf.clear();
            if t.destination == addr(KDC) {
                if let Some(r) = k.handle_request(addr(A), &d) {
                    a.handle_kdc(start, &r);
                }
            }
        }
        b.forget(addr(A));
        a.send(start, addr(B), None, b"for b");
        let mut now = start;
        let mut got = Vec::new();
        while got.is_empty() && now.saturating_duration_since(start) < GIVE_UP {
            now = now.saturating_add(RESEND);
            a.handle_timeout(now);
            b.handle_timeout(now);
            pump(now, &mut a, &mut b, &mut k);
            got = messages(&mut b);
        }
        assert_eq!(got, vec![b"for b".to_vec()]);
        let took = now.saturating_duration_since(start);
        assert!(took <= REOPEN + RESEND * 2, "took {took:?}");
        assert_eq!(
            a.peer_at(addr(B)),
            Some(MemberId::from_principal(&name("b")))
        );
    }

    /// The KDC answers the answerer's first request, but the answer is lost: the retry
    /// carries a fresh nonce (the KDC drops one it has seen) and gets the key.
    #[test]
    fn a_retry_after_a_lost_kdc_answer_gets_the_key() {
        let start = Timestamp::from_millis(1000);
        let (mut a, mut b, mut k) = (table("a", "b", 1), table("b", "a", 2), kdc());
        b.send(start, addr(A), None, b"hello");
        let mut buf = Vec::new();
        drain(start, &mut b, addr(B), &mut a, &mut k, &mut buf);
        let mut asked = 0;
        while let Some(t) = a.poll_transmit(start, &mut buf) {
            let d = buf[..t.size].to_vec();
            buf.clear();
            if t.destination == addr(KDC) {
                asked += 1;
                // The KDC answers; the answer is lost on the way back.
                assert!(k.handle_request(addr(A), &d).is_some());
            }
        }
        assert_eq!(asked, 1);
        let now = start.saturating_add(KDC_RESEND);
        a.handle_timeout(now);
        pump(now, &mut a, &mut b, &mut k);
        assert_eq!(messages(&mut a), vec![b"hello".to_vec()]);
        assert_eq!(a.kdc_answers(), 1);
    }

    #[test]
    fn a_data_counter_near_the_end_of_u64_is_dropped_not_a_panic() {
        let (mut a, mut b, mut k, now) = open_pair();
        b.send(now, addr(A), None, b"x");
        // Take B's next data datagram and push its counter to the top.
        let mut buf = Vec::new();
        let t = b.poll_transmit(now, &mut buf).expect("data");
        let mut d = buf[..t.size].to_vec();
        let at = 3 + NONCE;
        d[at..at + 8].copy_from_slice(&u64::MAX.to_be_bytes());
        a.handle_datagram(now, addr(B), &d);
        d[at..at + 8].copy_from_slice(&(u64::MAX - 3).to_be_bytes());
        a.handle_datagram(now, addr(B), &d);
        assert!(
            messages(&mut a).is_empty(),
            "a datagram with a changed counter opened"
        );
        pump(now, &mut a, &mut b, &mut k);
    }

    #[test]
    fn a_principal_the_kdc_refused_is_refused_again_without_asking() {
        let now = Timestamp::from_millis(1000);
        let mut a = table_trusting("a", Vec::new(), true, 1);
        let mut k = kdc(); // knows a and b, not c
        let mut to_kdc = 0;
        let mut buf = Vec::new();
        for round in 0..5u8 {
            a.handle_datagram(now, addr(B), &hello_from("c", round));
            while let Some(t) = a.poll_transmit(now, &mut buf) {
                let d = buf[..t.size].to_vec();
                buf.clear();
                if t.destination == addr(KDC) {
                    to_kdc += 1;
                    if let Some(r) = k.handle_request(addr(A), &d) {
                        a.handle_kdc(now, &r);
                    }
                }
            }
        }
        assert_eq!(
            to_kdc, 1,
            "the KDC was asked about the same unknown principal again"
        );
        assert!(a.drops().untrusted >= 5);
    }

    #[test]
    fn a_reset_is_honoured_only_after_the_peer_went_quiet() {
        let (mut a, _b, _k, now) = open_pair();
        let nonce_i = a.slots.get(&addr(B)).map(|s| s.nonce_i).expect("slot");
        let mut reset = Vec::new();
        Writer::new(&mut reset)
            .u8(KDC_PAIR_KIND)
            .u8(VERSION)
            .u8(6)
            .bytes(&nonce_i);
        a.handle_datagram(now, addr(B), &reset);
        assert!(
            a.peer_at(addr(B)).is_some(),
            "a Reset tore down an active channel"
        );
        let later = now.saturating_add(RESET_QUIET);
        a.handle_datagram(later, addr(B), &reset);
        assert!(
            a.peer_at(addr(B)).is_none(),
            "a Reset after silence was ignored"
        );
    }
}
