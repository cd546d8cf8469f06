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

use crate::id::MemberId;
use crate::pair::{PairDrops, PairEvent, MAX_QUEUED};
use cohort_core::wire::{Reader, Writer};
use cohort_core::{Timestamp, Transmit};
use cohort_crypto::{ct_eq, AeadAlgorithm, AeadKey, CryptoProvider, Secret};
use cohort_kdc::{member_shared_key, KdcError, PairKeyRequest, PrincipalKey, PrincipalName};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

/// First byte of a KDC-mode pair datagram.
pub const KDC_PAIR_KIND: u8 = 0xC3;
const VERSION: u8 = 1;
const NONCE: usize = 16;
const TAG: usize = 16;
/// Hellos and Accepts are resent this often until answered.
const RESEND: Duration = Duration::from_millis(200);
/// A channel that is not open after this long fails.
const GIVE_UP: Duration = Duration::from_secs(5);
/// KDC requests are resent this often, up to `KDC_TRIES` times.
const KDC_RESEND: Duration = Duration::from_millis(300);
const KDC_TRIES: u32 = 10;
/// Most KDC requests outstanding at once (a flood of hellos cannot make more).
const MAX_KDC_PENDING: usize = 32;
/// Most σ kept from the KDC.
const MAX_CACHED: usize = 4096;
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
    wrap: Secret,
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
    queue: VecDeque<Vec<u8>>,
    started: Timestamp,
    resend_at: Timestamp,
    opened_at: Option<Timestamp>,
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
    trust: Vec<MemberId>,
    rng: ChaCha20Rng,
    slots: BTreeMap<SocketAddr, Slot>,
    from_kdc: HashMap<MemberId, Secret>,
    pending: BTreeMap<MemberId, KdcPending>,
    outbox: VecDeque<(SocketAddr, Vec<u8>)>,
    events: VecDeque<PairEvent>,
    drops: PairDrops,
    /// Requests answered by the KDC (for benchmarks and tests).
    kdc_answers: u64,
}

impl KdcPairTable {
    /// A table for `credentials` in the group `group` accepting the principals in `trust`.
    pub fn new(
        provider: CryptoProvider,
        credentials: KdcCredentials,
        group: &str,
        trust: Vec<MemberId>,
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
            trust,
            rng: ChaCha20Rng::from_seed(seed),
            slots: BTreeMap::new(),
            from_kdc: HashMap::new(),
            pending: BTreeMap::new(),
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
    pub fn pair_key(&self, peer: &MemberId) -> Option<&Secret> {
        self.slots
            .values()
            .filter(|s| matches!(s.state, State::Open) && s.peer == Some(*peer))
            .max_by_key(|s| s.opened_at)
            .and_then(|s| s.keys.as_ref().map(|k| &k.wrap))
    }

    /// The drop counters.
    pub fn drops(&self) -> &PairDrops {
        &self.drops
    }

    /// Replaces the trust list; open channels to principals no longer trusted close.
    pub fn set_trust(&mut self, trust: Vec<MemberId>) {
        self.trust = trust;
        let gone: Vec<SocketAddr> = self
            .slots
            .iter()
            .filter(|(_, s)| {
                s.peer
                    .is_some_and(|p| !self.trust.is_empty() && !self.trust.contains(&p))
            })
            .map(|(a, _)| *a)
            .collect();
        for addr in gone {
            self.slots.remove(&addr);
            self.events.push_back(PairEvent::Failed {
                addr,
                reason: "peer no longer trusted",
            });
        }
    }

    /// Drops the channel to `addr`.
    pub fn forget(&mut self, addr: SocketAddr) {
        self.slots.remove(&addr);
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
                        reason: "peer is not the expected member",
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
                s.queue.push_back(data.to_vec());
            } else {
                self.drops.refused += 1;
            }
            return;
        }
        let mut nonce_i = [0u8; NONCE];
        self.rng.fill_bytes(&mut nonce_i);
        let mut queue = VecDeque::new();
        queue.push_back(data.to_vec());
        self.slots.insert(
            addr,
            Slot {
                role: Role::Opener,
                state: State::HelloSent,
                peer: None,
                expect,
                nonce_i,
                nonce_r: [0; NONCE],
                keys: None,
                queue,
                started: now,
                resend_at: now.saturating_add(RESEND),
                opened_at: None,
            },
        );
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
            wrap: derive(b"wrap")?,
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

    /// An empty trust list admits every principal the KDC knows.
    fn trusted(&self, id: &MemberId) -> bool {
        *id != self.me && (self.trust.is_empty() || self.trust.contains(id))
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
            self.on_data(from, data, r);
            return;
        }
        if kind == 6 {
            self.on_reset(from, r);
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
        }
        // A new session (or the peer restarted): answer it, keeping queued data.
        let queue = self
            .slots
            .remove(&from)
            .map(|s| s.queue)
            .unwrap_or_default();
        let mut nonce_r = [0u8; NONCE];
        self.rng.fill_bytes(&mut nonce_r);
        self.slots.insert(
            from,
            Slot {
                role: Role::Answerer,
                state: State::AwaitKdc,
                peer: Some(i),
                expect: None,
                nonce_i,
                nonce_r,
                keys: None,
                queue,
                started: now,
                resend_at: now.saturating_add(RESEND),
                opened_at: None,
            },
        );
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
                }
            }
        }
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
        let Some(s) = self.slots.get(&addr) else {
            return;
        };
        let (Some(i), Some(keys)) = (s.peer, s.keys.as_ref()) else {
            return;
        };
        let mut out = Vec::with_capacity(160);
        let mut w = Writer::new(&mut out);
        self.header(&mut w, 2);
        w.bytes(self.me.as_bytes())
            .bytes(i.as_bytes())
            .bytes(&s.nonce_i)
            .bytes(&s.nonce_r);
        let tag = self.tag(&keys.mac, b"accept", &out);
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

    fn on_accept(&mut self, now: Timestamp, from: SocketAddr, data: &[u8], mut r: Reader<'_>) {
        let parsed = (|| {
            let rid = MemberId::from_bytes(r.array::<32>().ok()?);
            let iid = MemberId::from_bytes(r.array::<32>().ok()?);
            let ni = r.array::<NONCE>().ok()?;
            let nr = r.array::<NONCE>().ok()?;
            let tagged = data.len() - r.remaining();
            let tag = r.array::<TAG>().ok()?;
            r.is_empty().then_some((rid, iid, ni, nr, tagged, tag))
        })();
        let Some((rid, iid, ni, nr, tagged, tag)) = parsed else {
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
        self.send_confirm(from);
        self.open(now, from);
    }

    fn send_confirm(&mut self, addr: SocketAddr) {
        let Some(s) = self.slots.get(&addr) else {
            return;
        };
        let (Some(rid), Some(keys)) = (s.peer, s.keys.as_ref()) else {
            return;
        };
        let mut out = Vec::with_capacity(160);
        let mut w = Writer::new(&mut out);
        self.header(&mut w, 3);
        w.bytes(self.me.as_bytes())
            .bytes(rid.as_bytes())
            .bytes(&s.nonce_i)
            .bytes(&s.nonce_r);
        let tag = self.tag(&keys.mac, b"confirm", &out);
        out.extend_from_slice(&tag);
        self.outbox.push_back((addr, out));
    }

    fn on_confirm(&mut self, now: Timestamp, from: SocketAddr, data: &[u8], mut r: Reader<'_>) {
        let parsed = (|| {
            let iid = MemberId::from_bytes(r.array::<32>().ok()?);
            let rid = MemberId::from_bytes(r.array::<32>().ok()?);
            let ni = r.array::<NONCE>().ok()?;
            let nr = r.array::<NONCE>().ok()?;
            let tagged = data.len() - r.remaining();
            let tag = r.array::<TAG>().ok()?;
            r.is_empty().then_some((iid, rid, ni, nr, tagged, tag))
        })();
        let Some((iid, rid, ni, nr, tagged, tag)) = parsed else {
            self.drops.malformed += 1;
            return;
        };
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
            REJECT_UNKNOWN => {
                "refused (unauthenticated hint): the KDC does not know this principal"
            }
            REJECT_UNTRUSTED => "refused (unauthenticated hint): the peer does not trust us",
            _ => "refused (unauthenticated hint)",
        };
        self.events
            .push_back(PairEvent::Failed { addr: from, reason });
    }

    fn on_reset(&mut self, from: SocketAddr, mut r: Reader<'_>) {
        let Some(ni) = r.array::<NONCE>().ok().filter(|_| r.is_empty()) else {
            self.drops.malformed += 1;
            return;
        };
        let held = self
            .slots
            .get(&from)
            .is_some_and(|s| s.nonce_i == ni && matches!(s.state, State::Open));
        if !held {
            self.drops.unexpected += 1;
            return;
        }
        self.slots.remove(&from);
        self.events.push_back(PairEvent::Failed {
            addr: from,
            reason: "the peer lost the channel",
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
        let queued: Vec<Vec<u8>> = s.queue.drain(..).collect();
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

    fn on_data(&mut self, from: SocketAddr, data: &[u8], mut r: Reader<'_>) {
        let (Ok(ni), Ok(counter)) = (r.array::<NONCE>(), r.u64()) else {
            self.drops.malformed += 1;
            return;
        };
        let aad_len = data.len() - r.remaining();
        if r.remaining() < 16 {
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
            if counter + 64 <= h || (counter <= h && keys.window & (1 << (h - counter)) != 0) {
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
        let Some(peer) = s.peer else {
            return;
        };
        // Data under the session's keys proves the opener got our Accept.
        if !matches!(s.state, State::Open) {
            s.state = State::Open;
            s.opened_at = Some(s.started);
            self.events
                .push_back(PairEvent::Established { peer, addr: from });
            let queued: Vec<Vec<u8>> = self
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
    pub fn handle_kdc(&mut self, _now: Timestamp, data: &[u8]) {
        let mut done = None;
        for (peer, p) in self.pending.iter_mut() {
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
        let waiting: Vec<SocketAddr> = self
            .slots
            .iter()
            .filter(|(_, s)| {
                s.role == Role::Answerer
                    && s.peer == Some(peer)
                    && matches!(s.state, State::AwaitKdc)
            })
            .map(|(a, _)| *a)
            .collect();
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
            }
            Err(_) => {
                for a in waiting {
                    let nonce_i = self.slots.get(&a).map(|s| s.nonce_i).unwrap_or_default();
                    self.send_reject(a, &peer, &nonce_i, REJECT_UNKNOWN);
                    self.slots.remove(&a);
                    self.drops.untrusted += 1;
                    self.events.push_back(PairEvent::Failed {
                        addr: a,
                        reason: "the KDC does not know this principal",
                    });
                }
            }
        }
    }

    /// Resends what is due and gives up on channels and requests that waited too long.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        let addrs: Vec<SocketAddr> = self.slots.keys().copied().collect();
        for addr in addrs {
            let Some(s) = self.slots.get_mut(&addr) else {
                continue;
            };
            if matches!(s.state, State::Open) || now < s.resend_at {
                continue;
            }
            if now.saturating_duration_since(s.started) >= GIVE_UP {
                let reason = match s.state {
                    State::AwaitKdc => "the KDC did not answer",
                    _ => "no answer",
                };
                self.slots.remove(&addr);
                self.drops.failed += 1;
                self.events.push_back(PairEvent::Failed { addr, reason });
                continue;
            }
            s.resend_at = now.saturating_add(RESEND);
            match s.state {
                State::HelloSent => self.send_hello(addr),
                State::Accepted => self.send_accept(addr),
                _ => {}
            }
        }
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
                self.pending.remove(&m);
                continue;
            }
            p.tries += 1;
            p.resend_at = now.saturating_add(KDC_RESEND);
            let bytes = p.request.bytes().to_vec();
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
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        self.slots
            .values()
            .filter(|s| !matches!(s.state, State::Open))
            .map(|s| s.resend_at)
            .chain(self.pending.values().map(|p| p.resend_at))
            .min()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<PairEvent> {
        self.events.pop_front()
    }
}
