//! Authenticated pairwise channels between group members, sans-IO: no sockets, no clock.
//!
//! The group protocol joins members and wraps fresh group keys under a key shared by two
//! members. [`PairTable`] keeps one such channel per peer address: a
//! [`DatagramChannel`] (the tcpcrypt-shaped handshake over datagrams, with retransmission,
//! opportunistic `ClientAuth::None` and the default hybrid KEM), authenticated afterwards at
//! the application layer with its session ID, as tcpcrypt intends. Each side sends, as its
//! first message on the channel, a proof of identity:
//!
//! ```text
//!   AuthProof = 0x01 | version (1) | Ed25519 public key (32) | signature (64)
//!   signature over "cohort group pair v1" | u8 len | group name | session ID (32)
//! ```
//!
//! A side accepts the peer only if the key is not its own, is in the trust list (and is the
//! caller's expected member, when [`PairTable::send`] named one), and the signature
//! verifies. Since a man in the middle shows as two different session IDs, a proof cannot be
//! relayed into another session. Application data is neither sent nor delivered until both
//! proofs are accepted; until then it waits in a queue of at most [`MAX_QUEUED`] messages.
//!
//! ```text
//!  group core ─ send(addr, expect, data) ─▶ PairTable ─ poll_event ─▶ Established | Message | Failed
//!                                              │  one slot per peer address:
//!                                              │    primary channel (+ pending replacement),
//!                                              │    queue (≤ 64 messages), expected member
//!                                              ▼
//!      DatagramChannel: ClientHello ─▶ ◀─ ServerHello ─ ClientFinished ─▶ (retransmitted)
//!                           │ established: session ID, exporter
//!                           ▼
//!      inner messages:  Proof ─▶ ◀─ Ack      Proof ◀─ ─▶ Ack     (each resent until acked)
//!                       Data ◀═══▶ Data      (only once both proofs are accepted)
//!                       Reject ─▶            (the proof was refused; the channel is dropped)
//!
//!  wire: PAIR_KIND (0xC1) | DatagramChannel datagram (0x00 handshake frame | 0x01 protected)
//! ```
//!
//! Inner messages are the payloads of the channel's protected datagrams: `0x01` proof,
//! `0x02` ack (the sender accepted the receiver's proof), `0x03` application data, `0x04`
//! reject. Data from the peer also counts as an ack: the peer sends data only after it
//! accepted our proof.
//!
//! # Choices
//!
//! **Simultaneous open.** When both members call `send` before either ClientHello arrives,
//! each receives the other's ClientHello while its own client handshake is in progress.
//! Both sides hold the same two ClientHellos (one sent, one received), so the rule is: the
//! handshake with the larger ClientHello (its bytes, compared lexicographically; they hold
//! a random nonce and key share) goes on; the other is abandoned. The side whose hello is
//! smaller drops its client and answers as server; the other side drops the smaller hello and
//! stays client. This settles the race before any public-key work on the losing handshake,
//! needs neither the identities (unknown until the proofs) nor this side's own address
//! (which the table does not know), and leaves one channel per pair. Queued data and the
//! expected member carry over to the surviving channel.
//!
//! **Restart.** A ClientHello from an address whose channel has finished its handshake
//! (the peer restarted, or its hello is an old duplicate) does not disturb that channel: it
//! starts a *pending* channel beside it, which replaces the old one only once both proofs
//! on it are accepted. An attacker who spoofs the peer's address therefore cannot tear down
//! or hijack a working channel; the most it can do is occupy the pending place (a newer
//! hello replaces an older pending one), which can delay a genuine restart until the
//! spoofing stops. A ClientHello for a server channel whose handshake has not finished
//! replaces that channel outright (the client restarted mid-handshake); a spoofer can thus
//! make a handshake in progress fail, which an on-path attacker could do anyway. A pending
//! channel that fails is dropped silently (the working channel is still there).
//!
//! **Flood bound.** Server channels that are not yet authenticated (half-open, including
//! pending replacements) are limited to [`MAX_HALF_OPEN`]; a new one evicts the oldest. A
//! flood of spoofed ClientHellos thus costs at most that many channels, and never touches
//! channels that are authenticated or that this side opened. An evicted or failed server
//! channel is reported as [`PairEvent::Failed`] only if the peer completed the handshake
//! (it is reachable at that address) or the caller queued data for it; the rest vanish with
//! only a counter, so spoofed hellos do not fill the event queue.
//!
//! **Input checks.** A handshake datagram must hold exactly one whole frame (the channel
//! core reads a byte stream, where a partial frame would wait for the next datagram's
//! bytes); anything else is dropped before it reaches a channel. The channel's handshake
//! itself is unauthenticated until the proofs, so a spoofer who races a handshake with a
//! well-formed bad frame can make it fail ([`PairEvent::Failed`]), as an on-path attacker
//! could by dropping packets; it cannot make a proof verify.
//!
//! Everything random that this module chooses (client nonces, the server's nonce generator)
//! comes from the `seed`; the channel's KEM key generation uses the provider's randomness.
//!
//! Limitation: proofs are acknowledged but data is not (the group layers above retransmit
//! what they need). If the proof exchange fails on one side only under heavy loss, the
//! other side may keep sending on a channel this side dropped until the caller
//! [`forget`](PairTable::forget)s it.

use crate::config::TrustList;
use crate::id::MemberId;
use crate::keys::PairKey;
use cohort_channel::datagram::{
    DatagramChannel, DatagramEvent, INITIAL_RTO, KIND_HANDSHAKE, KIND_PROTECTED, MAX_RETRANSMITS,
};
use cohort_channel::identity::Identity;
use cohort_channel::messages::{peek_frame, FrameType};
use cohort_channel::{Client, ClientAuth, ClientConfig, Server, ServerConfig};
use cohort_core::{Machine, Timestamp, Transmit};
use cohort_crypto::CryptoProvider;
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use zeroize::Zeroizing;

/// First byte of every pair-channel datagram. (Group-protected packets start with the
/// gears packet version, 1; other kinds use other bytes.)
pub const PAIR_KIND: u8 = 0xC1;

/// Most application messages queued for one peer until its channel is authenticated; more
/// are refused (counted in [`PairDrops::refused`]).
pub const MAX_QUEUED: usize = 64;

/// Most server channels not yet authenticated, over all addresses; a new one evicts the
/// oldest. 1,024: a cold start of thousands of members sends the leader that many
/// handshakes at once, and with 64 each new hello evicted one still in its first round trip,
/// so a leader admitted about 60 joiners a view change whatever the batch policy (forming
/// 2,500 took 80 view changes). A flood of spoofed hellos costs at most 1,024 handshake
/// states (a few MiB).
pub const MAX_HALF_OPEN: usize = 1024;

/// The version byte of an identity proof.
pub const PROOF_VERSION: u8 = 1;

/// The context that starts every signed proof.
const PROOF_CONTEXT: &[u8] = b"cohort group pair v1";
/// The exporter label for the pair key (followed by u8 len | group name).
const KEY_LABEL: &[u8] = b"cohort group pair key v1";
/// Length of the pair key.
const PAIR_KEY_LEN: usize = 32;

const MSG_PROOF: u8 = 0x01;
const MSG_ACK: u8 = 0x02;
const MSG_DATA: u8 = 0x03;
const MSG_REJECT: u8 = 0x04;
/// type | version | key | signature
const PROOF_LEN: usize = 1 + 1 + 32 + 64;
/// The proof's retransmission timeout stops doubling here.
const MAX_RTO: Duration = Duration::from_secs(10);

/// Why a pair channel failed ([`PairEvent::Failed`]). The member acts on the kind (trust,
/// KDC refusal); [`PairFailure::as_str`] is for logs only.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PairFailure {
    /// The trust policy changed and no longer admits the peer.
    NoLongerTrusted,
    /// The peer is not the member the caller expected at that address.
    NotExpected,
    /// The peer proved an identity the trust policy does not admit.
    UntrustedIdentity,
    /// The peer presented this member's own identity.
    OwnIdentity,
    /// The identity proof did not parse.
    MalformedProof,
    /// The identity proof's signature did not verify.
    BadProofSignature,
    /// The peer refused this member's identity proof.
    ProofRefused,
    /// The peer never acknowledged this member's identity proof.
    ProofUnacknowledged,
    /// The pair key could not be exported from the channel (or its wrap key derived).
    KeyExportFailed,
    /// Signing this member's identity proof failed.
    SigningFailed,
    /// The channel would not carry the identity proof.
    ProofNotSent,
    /// The channel's handshake failed.
    HandshakeFailed,
    /// The channel's handshake timed out.
    HandshakeTimedOut,
    /// A handshake could not be started.
    CouldNotStart,
    /// Newer handshakes took the channel's place.
    Evicted,
    /// The peer did not answer.
    NoAnswer,
    /// KDC mode: the KDC did not answer.
    KdcDidNotAnswer,
    /// KDC mode: the KDC does not know the peer's principal.
    KdcUnknownPrincipal,
    /// KDC mode: an unauthenticated hint that the KDC does not know the peer.
    KdcUnknownMemberHint,
    /// KDC mode: the peer refused, with an unauthenticated hint that the KDC does not know
    /// this principal.
    RefusedKdcUnknown,
    /// KDC mode: the peer refused, with an unauthenticated hint that it does not trust us.
    RefusedUntrusted,
    /// KDC mode: the peer refused, with an unauthenticated hint of no known kind.
    Refused,
    /// KDC mode: the peer lost the channel (it restarted or forgot it).
    PeerLostChannel,
}

impl PairFailure {
    /// The failure for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            PairFailure::NoLongerTrusted => "peer no longer trusted",
            PairFailure::NotExpected => "peer is not the expected member",
            PairFailure::UntrustedIdentity => "untrusted identity",
            PairFailure::OwnIdentity => "peer presented our own identity",
            PairFailure::MalformedProof => "malformed identity proof",
            PairFailure::BadProofSignature => "bad identity proof signature",
            PairFailure::ProofRefused => "peer refused our identity proof",
            PairFailure::ProofUnacknowledged => "peer did not acknowledge our identity proof",
            PairFailure::KeyExportFailed => "pair key export failed",
            PairFailure::SigningFailed => "signing failed",
            PairFailure::ProofNotSent => "channel refused the proof",
            PairFailure::HandshakeFailed => "handshake failed",
            PairFailure::HandshakeTimedOut => "handshake timed out",
            PairFailure::CouldNotStart => "could not start a handshake",
            PairFailure::Evicted => "evicted by newer handshakes",
            PairFailure::NoAnswer => "no answer",
            PairFailure::KdcDidNotAnswer => "the KDC did not answer",
            PairFailure::KdcUnknownPrincipal => "the KDC does not know this principal",
            PairFailure::KdcUnknownMemberHint => {
                "the KDC does not know this member (unauthenticated hint)"
            }
            PairFailure::RefusedKdcUnknown => {
                "refused (unauthenticated hint): the KDC does not know this principal"
            }
            PairFailure::RefusedUntrusted => {
                "refused (unauthenticated hint): the peer does not trust us"
            }
            PairFailure::Refused => "refused (unauthenticated hint)",
            PairFailure::PeerLostChannel => "the peer lost the channel",
        }
    }

    /// Whether the failure is a matter of trust: the peer is not (or no longer) admitted, is
    /// not who was expected, or does not admit us. Counted as `Drop::Untrusted`.
    pub fn is_trust(self) -> bool {
        matches!(
            self,
            PairFailure::NoLongerTrusted
                | PairFailure::NotExpected
                | PairFailure::UntrustedIdentity
                | PairFailure::RefusedUntrusted
        )
    }

    /// Whether the KDC is why the channel failed (it did not answer, or does not know a
    /// principal): reported to the application as `GroupEvent::Refused`.
    pub fn is_kdc(self) -> bool {
        matches!(
            self,
            PairFailure::KdcDidNotAnswer
                | PairFailure::KdcUnknownPrincipal
                | PairFailure::KdcUnknownMemberHint
                | PairFailure::RefusedKdcUnknown
        )
    }
}

impl std::fmt::Display for PairFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a [`PairTable`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PairEvent {
    /// Both identities are proven over the session ID.
    Established {
        /// The authenticated peer.
        peer: MemberId,
        /// Its address.
        addr: SocketAddr,
    },
    /// Application data from an authenticated peer.
    Message {
        /// The authenticated peer.
        peer: MemberId,
        /// Its address.
        addr: SocketAddr,
        /// The data, as passed to the peer's [`PairTable::send`].
        data: Vec<u8>,
    },
    /// The channel to `addr` failed (handshake failure or timeout, bad or untrusted proof).
    /// Its queued data is dropped; the next `send` to `addr` opens a new channel.
    Failed {
        /// The peer's address.
        addr: SocketAddr,
        /// What went wrong.
        reason: PairFailure,
    },
}

/// Drop counters, by reason. [`PairTable::dropped`] is their sum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PairDrops {
    /// Datagrams that are not pair datagrams or do not parse, and inner messages of unknown
    /// type.
    pub malformed: u64,
    /// Datagrams nobody takes: from an address with no channel (and not a ClientHello),
    /// refused by the channel (duplicates, out of order, failed authentication, replays),
    /// a ClientHello that lost a simultaneous open, data before the peer's proof.
    pub unexpected: u64,
    /// Identity proofs refused: malformed, our own key, untrusted or not the expected
    /// member, bad signature.
    pub untrusted: u64,
    /// Channels that failed for other reasons (handshake failure or timeout, no proof).
    pub failed: u64,
    /// Half-open server channels evicted by newer ones: the oldest when
    /// [`MAX_HALF_OPEN`] is reached, or one at the same address replaced by a newer hello.
    pub evicted: u64,
    /// Application messages refused: the queue was full, or the peer is not the expected
    /// member.
    pub refused: u64,
}

impl PairDrops {
    /// The sum of all counters.
    pub fn total(&self) -> u64 {
        self.malformed
            + self.unexpected
            + self.untrusted
            + self.failed
            + self.evicted
            + self.refused
    }
}

/// Authenticated pairwise channels to other members, one per peer address.
///
/// Methods come in four kinds: getters (`&self`); [`handle_datagram`](Self::handle_datagram)
/// and [`handle_timeout`](Self::handle_timeout) for input; commands
/// ([`send`](Self::send), [`set_trust`](Self::set_trust), [`forget`](Self::forget)); and
/// `poll_*` for what the caller must do next. After any input or command, call
/// [`poll_transmit`](Self::poll_transmit) until it returns `None`, then
/// [`poll_event`](Self::poll_event) until `None`, then arm a timer at
/// [`poll_timeout`](Self::poll_timeout). A spurious `handle_timeout` is harmless.
pub struct PairTable {
    provider: CryptoProvider,
    identity: Identity,
    me: MemberId,
    group: Vec<u8>,
    trust: TrustList,
    rng: ChaCha20Rng,
    client: Client,
    server: Server,
    /// The channels, by peer address. A hash map: [`pair_key`](Self::pair_key) looks a
    /// slot up for each member of a view (10,000 at a large leader), and a walk down a tree
    /// of 10,000 addresses was half its cost; the only walk over every slot
    /// ([`set_trust`](Self::set_trust)) sorts what it found, so the order the map keeps
    /// cannot change what the table does.
    slots: HashMap<SocketAddr, Slot>,
    /// By peer: the addresses where a channel authenticated it. A superset of the slots
    /// whose primary is authenticated with that peer (a slot's entry goes when the slot
    /// goes; one replaced in place is checked on lookup), so that [`pair_key`](Self::pair_key)
    /// looks up a few addresses instead of scanning every slot: a leader of 10,000 wraps
    /// a key for each member with it. A hash map: it is only looked up, never walked (so
    /// its order cannot change what the table does), and a lookup by a 32-byte id in a
    /// tree of 10,000 compared about 14 ids (the one-message leader looks up every member).
    authenticated: HashMap<MemberId, Vec<SocketAddr>>,
    /// Every slot's earliest deadline (its channels' timers and proof retries), ordered by
    /// time: [`poll_timeout`](Self::poll_timeout) is the first entry, and
    /// [`handle_timeout`](Self::handle_timeout) visits only the slots that are due. A leader
    /// of 10,000 holds 10,000 channels and ticks every heartbeat; visiting (or taking the
    /// minimum over) all of them each time cost it O(n) per tick. Kept by `refresh` after
    /// every change to a slot; an entry may be early (a channel dropped since), never late.
    due: BTreeSet<(Timestamp, SocketAddr)>,
    /// Each slot's entry in `due`.
    due_at: BTreeMap<SocketAddr, Timestamp>,
    /// Every half-open server channel (role server, not authenticated; primary or pending)
    /// by creation order: [`make_room`](Self::make_room) counts them and finds the oldest
    /// here instead of scanning every slot for each ClientHello (a leader of 10,000 gets
    /// 10,000 hellos in a cold start). Kept exact by `refresh`, which runs after every change
    /// to a slot.
    half_open: BTreeSet<(u64, SocketAddr, Which)>,
    /// Each slot's entries in `half_open`: the primary's and the pending channel's `seq`.
    half_open_at: BTreeMap<SocketAddr, [Option<u64>; 2]>,
    outbox: VecDeque<(SocketAddr, Vec<u8>)>,
    events: VecDeque<PairEvent>,
    next_seq: u64,
    drops: PairDrops,
}

impl std::fmt::Debug for PairTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PairTable")
            .field("me", &self.me)
            .field("peers", &self.slots.len())
            .field("drops", &self.drops)
            .finish_non_exhaustive()
    }
}

impl PairTable {
    /// A table for `identity` in the group named `group` (at most 255 bytes, as
    /// `GroupConfig::validate` requires; a longer name is cut to 255 bytes) that accepts the
    /// members in `trust`. Everything random the table chooses comes from `seed`.
    pub fn new(
        provider: CryptoProvider,
        identity: Identity,
        group: &str,
        trust: impl Into<TrustList>,
        seed: [u8; 32],
    ) -> Self {
        let mut rng = ChaCha20Rng::from_seed(seed);
        let mut server_seed = [0u8; 32];
        rng.fill_bytes(&mut server_seed);
        let server = Server::with_seed(provider, ServerConfig::new(), server_seed);
        let client = Client::new(provider, ClientConfig::new(ClientAuth::None));
        let name = group.as_bytes();
        PairTable {
            provider,
            me: MemberId(identity.public()),
            identity,
            group: name[..name.len().min(255)].to_vec(),
            trust: trust.into(),
            rng,
            client,
            server,
            slots: HashMap::new(),
            authenticated: HashMap::new(),
            due: BTreeSet::new(),
            due_at: BTreeMap::new(),
            half_open: BTreeSet::new(),
            half_open_at: BTreeMap::new(),
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            next_seq: 0,
            drops: PairDrops::default(),
        }
    }

    /// The authenticated peer at `addr`, if its channel is up.
    pub fn peer_at(&self, addr: SocketAddr) -> Option<MemberId> {
        let chan = &self.slots.get(&addr)?.primary;
        chan.authenticated_at.and(chan.peer)
    }

    /// A 32-byte secret both ends share (exported from the channel with a label that names
    /// the group), once the channel to `peer` is authenticated. If `peer` is authenticated
    /// at several addresses, the most recently authenticated channel's key.
    pub fn pair_key(&self, peer: &MemberId) -> Option<&Arc<PairKey>> {
        self.authenticated
            .get(peer)?
            .iter()
            .filter_map(|a| self.slots.get(a))
            .map(|s| &s.primary)
            .filter(|c| c.authenticated_at.is_some() && c.peer == Some(*peer))
            .max_by_key(|c| c.authenticated_at)
            .and_then(|c| c.key.as_ref())
    }

    /// Datagrams and messages dropped: the sum of the counters in [`drops`](Self::drops).
    pub fn dropped(&self) -> u64 {
        self.drops.total()
    }

    /// The drop counters, by reason.
    pub fn drops(&self) -> &PairDrops {
        &self.drops
    }

    /// How many channels exist (authenticated or not, pending replacements included).
    #[doc(hidden)]
    pub fn channel_count(&self) -> usize {
        self.slots
            .values()
            .map(|s| 1 + usize::from(s.pending.is_some()))
            .sum()
    }

    /// Replaces the trust list. Authenticated channels to peers no longer trusted are dropped
    /// with [`PairEvent::Failed`].
    pub fn set_trust(&mut self, trust: impl Into<TrustList>) {
        self.trust = trust.into();
        let trust = &self.trust;
        let allowed = |peer: Option<MemberId>, _expect: Option<MemberId>| {
            peer.is_none_or(|p| trust.contains(&p))
        };
        let mut gone = Vec::new();
        let mut changed = Vec::new();
        for (addr, slot) in &mut self.slots {
            if slot
                .pending
                .as_ref()
                .is_some_and(|p| !allowed(p.peer, slot.expect))
            {
                slot.pending = None;
                changed.push(*addr);
            }
            if !allowed(slot.primary.peer, slot.expect) {
                gone.push(*addr);
            }
        }
        changed.sort_unstable();
        gone.sort_unstable();
        for addr in changed {
            self.refresh(addr);
        }
        for addr in gone {
            self.drop_slot(addr);
            self.events.push_back(PairEvent::Failed {
                addr,
                reason: PairFailure::NoLongerTrusted,
            });
        }
    }

    /// Queues `data` for the peer at `addr`, opening a channel first if there is none
    /// (this side is the client). With `expect`, the peer must prove exactly that identity.
    ///
    /// If the channel to `addr` already expects, or has proven, another member, the data is
    /// refused with [`PairEvent::Failed`] (the channel stays). Data sent before the channel
    /// is authenticated waits in a queue of at most [`MAX_QUEUED`] messages.
    pub fn send(
        &mut self,
        now: Timestamp,
        addr: SocketAddr,
        expect: Option<MemberId>,
        data: &[u8],
    ) {
        self.send_inner(now, addr, expect, data);
        self.refresh(addr);
    }

    /// [`send`](Self::send) without the deadline bookkeeping.
    fn send_inner(
        &mut self,
        now: Timestamp,
        addr: SocketAddr,
        expect: Option<MemberId>,
        data: &[u8],
    ) {
        if let Some(slot) = self.slots.get_mut(&addr) {
            if let Some(e) = expect {
                let conflict = slot.expect.is_some_and(|x| x != e)
                    || slot.primary.peer.is_some_and(|p| p != e);
                if conflict {
                    self.drops.refused += 1;
                    self.events.push_back(PairEvent::Failed {
                        addr,
                        reason: PairFailure::NotExpected,
                    });
                    return;
                }
                slot.expect = Some(e);
            }
            if slot.primary.authenticated_at.is_some() {
                if slot.primary.send_data(data).is_err() {
                    self.drops.refused += 1;
                }
            } else if slot.queue.len() < MAX_QUEUED {
                slot.queue.push_back(Zeroizing::new(data.to_vec()));
            } else {
                self.drops.refused += 1;
            }
            self.pump(now, addr);
            return;
        }
        let name = addr.to_string();
        let mut dc = match DatagramChannel::client(&self.client, now, &mut self.rng, &name, addr) {
            Ok(dc) => dc,
            Err(_) => {
                self.drops.failed += 1;
                self.events.push_back(PairEvent::Failed {
                    addr,
                    reason: PairFailure::CouldNotStart,
                });
                return;
            }
        };
        // The first datagram is the ClientHello: keep it to settle a simultaneous open.
        let mut hello = Vec::new();
        if dc.poll_transmit(now, &mut hello).is_some() {
            self.outbox.push_back((addr, hello.clone()));
        }
        let chan = Chan::new(dc, Role::Client, hello, self.seq());
        let slot = Slot {
            primary: chan,
            pending: None,
            queue: VecDeque::from([Zeroizing::new(data.to_vec())]),
            expect,
        };
        self.slots.insert(addr, slot);
        self.pump(now, addr);
    }

    /// Drops the channel to `addr` (e.g. the peer was removed), with its queued data; the
    /// next send reconnects. No event.
    pub fn forget(&mut self, addr: SocketAddr) {
        self.drop_slot(addr);
    }

    /// Removes the slot at `addr`, its entry in `authenticated` and its deadline.
    fn drop_slot(&mut self, addr: SocketAddr) -> Option<Slot> {
        let slot = self.slots.remove(&addr);
        self.refresh(addr);
        let slot = slot?;
        self.unlist(slot.primary.peer, addr);
        Some(slot)
    }

    /// The earliest deadline of the slot at `addr`'s channels, if it has one.
    fn slot_deadline(&self, addr: SocketAddr) -> Option<Timestamp> {
        let s = self.slots.get(&addr)?;
        std::iter::once(&s.primary)
            .chain(s.pending.as_ref())
            .flat_map(|c| [c.dc.poll_timeout(), c.retry_at])
            .flatten()
            .min()
    }

    /// The `seq` of the slot at `addr`'s half-open server channels: primary, pending.
    fn slot_half_open(&self, addr: SocketAddr) -> [Option<u64>; 2] {
        let Some(s) = self.slots.get(&addr) else {
            return [None, None];
        };
        let seq =
            |c: &Chan| (c.role == Role::Server && c.authenticated_at.is_none()).then_some(c.seq);
        [seq(&s.primary), s.pending.as_ref().and_then(seq)]
    }

    /// Puts the slot at `addr`'s deadline and half-open channels in the indexes again (after
    /// any change to it; a slot that is gone leaves both).
    fn refresh(&mut self, addr: SocketAddr) {
        let open = self.slot_half_open(addr);
        let old_open = self.half_open_at.get(&addr).copied().unwrap_or_default();
        if open != old_open {
            for (seq, which) in old_open.iter().zip([Which::Primary, Which::Pending]) {
                if let Some(seq) = seq {
                    self.half_open.remove(&(*seq, addr, which));
                }
            }
            for (seq, which) in open.iter().zip([Which::Primary, Which::Pending]) {
                if let Some(seq) = seq {
                    self.half_open.insert((*seq, addr, which));
                }
            }
            if open == [None, None] {
                self.half_open_at.remove(&addr);
            } else {
                self.half_open_at.insert(addr, open);
            }
        }
        let at = self.slot_deadline(addr);
        let old = self.due_at.get(&addr).copied();
        if old == at {
            return;
        }
        if let Some(t) = old {
            self.due.remove(&(t, addr));
            self.due_at.remove(&addr);
        }
        if let Some(t) = at {
            self.due.insert((t, addr));
            self.due_at.insert(addr, t);
        }
    }

    /// Forgets that `peer` was authenticated at `addr`.
    fn unlist(&mut self, peer: Option<MemberId>, addr: SocketAddr) {
        let Some(peer) = peer else {
            return;
        };
        if let Some(addrs) = self.authenticated.get_mut(&peer) {
            addrs.retain(|a| *a != addr);
            if addrs.is_empty() {
                self.authenticated.remove(&peer);
            }
        }
    }

    /// A datagram whose first byte is PAIR_KIND.
    pub fn handle_datagram(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        self.handle_datagram_inner(now, from, data);
        self.refresh(from);
    }

    /// [`handle_datagram`](Self::handle_datagram) without the deadline bookkeeping for
    /// `from` (a channel it evicts elsewhere is refreshed where it goes).
    fn handle_datagram_inner(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        let inner = match data.split_first() {
            Some((&PAIR_KIND, inner))
                if matches!(inner.first(), Some(&KIND_HANDSHAKE | &KIND_PROTECTED)) =>
            {
                inner
            }
            _ => {
                self.drops.malformed += 1;
                return;
            }
        };
        // A handshake datagram holds exactly one whole frame. (The connection core reads a
        // byte stream: a partial frame would wait there and corrupt the next one.)
        let frame = (inner.first() == Some(&KIND_HANDSHAKE)).then(|| peek_frame(&inner[1..]));
        if frame.is_some_and(|f| f.is_none_or(|(_, len)| len != inner.len() - 1)) {
            self.drops.malformed += 1;
            return;
        }
        let is_hello = frame.flatten().map(|(ty, _)| ty) == Some(FrameType::ClientHello as u8);
        if is_hello {
            self.handle_hello(now, from, inner);
        } else {
            let Some(slot) = self.slots.get_mut(&from) else {
                self.drops.unexpected += 1;
                return;
            };
            let taken = slot.primary.offer(now, from, inner)
                || slot
                    .pending
                    .as_mut()
                    .is_some_and(|p| p.offer(now, from, inner));
            if !taken {
                self.drops.unexpected += 1;
            }
        }
        self.pump(now, from);
    }

    /// Retransmits handshakes and proofs that are due, and gives up on those that tried too
    /// often.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        // Only the slots whose deadline passed: the others have nothing to do.
        let addrs: Vec<SocketAddr> = self
            .due
            .iter()
            .take_while(|(t, _)| *t <= now)
            .map(|(_, a)| *a)
            .collect();
        for addr in addrs {
            self.timeout_slot(now, addr);
            self.refresh(addr);
        }
    }

    /// One slot's share of [`handle_timeout`](Self::handle_timeout).
    fn timeout_slot(&mut self, now: Timestamp, addr: SocketAddr) {
        let Some(slot) = self.slots.get_mut(&addr) else {
            return;
        };
        slot.primary.dc.handle_timeout(now);
        let primary = slot.primary.on_timeout(now);
        let pending = slot.pending.as_mut().and_then(|p| {
            p.dc.handle_timeout(now);
            p.on_timeout(now)
        });
        if let Some(reason) = pending {
            self.drain(now, addr, Which::Pending);
            self.fail(addr, Which::Pending, reason, false);
        }
        if let Some(reason) = primary {
            self.drain(now, addr, Which::Primary);
            self.fail(addr, Which::Primary, reason, false);
        }
        self.pump(now, addr);
    }

    /// Writes the next datagram into `buf` (after what it holds) and says where it goes.
    pub fn poll_transmit(&mut self, _now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
        let (destination, d) = self.outbox.pop_front()?;
        buf.push(PAIR_KIND);
        buf.extend_from_slice(&d);
        Some(Transmit {
            destination,
            size: d.len() + 1,
        })
    }

    /// When [`handle_timeout`](Self::handle_timeout) must be called next: the earliest
    /// slot deadline.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        self.due.first().map(|(t, _)| *t)
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<PairEvent> {
        self.events.pop_front()
    }

    fn seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    /// A ClientHello from `from`: a new server channel, a retransmission, a simultaneous
    /// open, or a restart (see the module docs).
    fn handle_hello(&mut self, now: Timestamp, from: SocketAddr, hello: &[u8]) {
        if let Some(slot) = self.slots.get_mut(&from) {
            let same = |c: &Chan| c.role == Role::Server && c.hello == hello;
            let target = if same(&slot.primary) {
                Some(&mut slot.primary)
            } else {
                slot.pending.as_mut().filter(|p| same(p))
            };
            if let Some(chan) = target {
                // A retransmission of the hello that started this channel.
                if !chan.offer(now, from, hello) {
                    self.drops.unexpected += 1;
                }
                return;
            }
        }
        let which = match self.slots.get(&from) {
            None => Which::Primary,
            Some(slot) if slot.primary.dc.is_established() => Which::Pending,
            Some(slot) if slot.primary.role == Role::Client => {
                if hello <= slot.primary.hello.as_slice() {
                    // Simultaneous open, and our hello is the larger: the peer will answer it.
                    self.drops.unexpected += 1;
                    return;
                }
                Which::Primary
            }
            // A server handshake in progress: the client restarted it.
            Some(_) => Which::Primary,
        };
        self.make_room(from);
        let seq = self.seq();
        let mut chan = Chan::new(
            DatagramChannel::server(&self.server, from),
            Role::Server,
            hello.to_vec(),
            seq,
        );
        if !chan.offer(now, from, hello) {
            self.drops.unexpected += 1;
        }
        match (which, self.slots.get_mut(&from)) {
            (Which::Pending, Some(slot)) => {
                if slot.pending.replace(chan).is_some() {
                    self.drops.evicted += 1;
                }
            }
            (_, Some(slot)) => {
                if slot.primary.role == Role::Server {
                    self.drops.evicted += 1;
                }
                let old = std::mem::replace(&mut slot.primary, chan);
                self.unlist(old.peer, from);
            }
            (_, None) => {
                self.slots.insert(
                    from,
                    Slot {
                        primary: chan,
                        pending: None,
                        queue: VecDeque::new(),
                        expect: None,
                    },
                );
            }
        }
    }

    /// Evicts the oldest half-open server channel if there are [`MAX_HALF_OPEN`] already.
    /// A half-open channel at `incoming` is left alone: the new one replaces it anyway.
    ///
    /// The policy: half-open means a server channel (primary or pending) not authenticated;
    /// when there are `MAX_HALF_OPEN` or more, the one with the smallest creation `seq`
    /// outside `incoming` goes (its whole slot if it is the primary). The `half_open` index
    /// holds exactly those channels ordered by `seq`, so the count is its length and the
    /// victim is its first entry not at `incoming` (at most two entries are skipped): the
    /// cost no longer grows with the number of slots. Unit tests compare every choice with
    /// the scan over all slots that this replaced (`half_open_scan`).
    fn make_room(&mut self, incoming: SocketAddr) {
        let count = self.half_open.len();
        let oldest = self
            .half_open
            .iter()
            .find(|(_, a, _)| *a != incoming)
            .copied();
        #[cfg(test)]
        assert_eq!(self.half_open_scan(incoming), (count, oldest));
        if count < MAX_HALF_OPEN {
            return;
        }
        if let Some((_, addr, which)) = oldest {
            self.drops.evicted += 1;
            self.remove(addr, which, PairFailure::Evicted);
        }
    }

    /// The half-open count and eviction candidate by a scan over every slot (the code
    /// `make_room` used before its index), to check the index against in tests.
    #[cfg(test)]
    fn half_open_scan(&self, incoming: SocketAddr) -> (usize, Option<(u64, SocketAddr, Which)>) {
        let mut count = 0usize;
        let mut oldest: Option<(u64, SocketAddr, Which)> = None;
        for (addr, slot) in &self.slots {
            for (which, chan) in [
                (Which::Primary, Some(&slot.primary)),
                (Which::Pending, slot.pending.as_ref()),
            ] {
                let Some(chan) = chan else { continue };
                if chan.role != Role::Server || chan.authenticated_at.is_some() {
                    continue;
                }
                count += 1;
                if *addr != incoming && oldest.is_none_or(|(s, _, _)| chan.seq < s) {
                    oldest = Some((chan.seq, *addr, which));
                }
            }
        }
        (count, oldest)
    }

    /// Processes what the channels at `addr` produced: transmits, handshake events, inner
    /// messages.
    fn pump(&mut self, now: Timestamp, addr: SocketAddr) {
        self.pump_chan(now, addr, Which::Pending);
        self.pump_chan(now, addr, Which::Primary);
    }

    fn pump_chan(&mut self, now: Timestamp, addr: SocketAddr, mut which: Which) {
        loop {
            let PairTable {
                provider,
                identity,
                me,
                group,
                trust,
                slots,
                authenticated,
                outbox,
                events,
                drops,
                next_seq,
                ..
            } = self;
            let Some(slot) = slots.get_mut(&addr) else {
                return;
            };
            let expect = slot.expect;
            let chan = match which {
                Which::Primary => &mut slot.primary,
                Which::Pending => match slot.pending.as_mut() {
                    Some(p) => p,
                    None => return,
                },
            };
            let local = Local {
                provider,
                identity,
                me: *me,
                group,
                trust,
                expect,
            };
            let mut outcome = None;
            while outcome.is_none() {
                let Some(event) = chan.dc.poll_event() else {
                    break;
                };
                outcome = match event {
                    DatagramEvent::Established(info) => chan
                        .on_established(now, &local, info.session_id.0)
                        .err()
                        .map(|r| Outcome::Fail(r, false)),
                    DatagramEvent::Data(msg) => chan.on_message(now, &local, &msg, drops),
                    DatagramEvent::Failed(_) => {
                        Some(Outcome::Fail(PairFailure::HandshakeFailed, false))
                    }
                    DatagramEvent::TimedOut => {
                        Some(Outcome::Fail(PairFailure::HandshakeTimedOut, false))
                    }
                    DatagramEvent::BatchSignatureNeeded(_) => None,
                    // An event this table does not know: fail closed.
                    _ => Some(Outcome::Fail(PairFailure::HandshakeFailed, false)),
                };
            }
            while let Some(d) = next_transmit(&mut chan.dc, now) {
                outbox.push_back((addr, d));
            }
            match outcome {
                None => return,
                Some(Outcome::Fail(reason, untrusted)) => {
                    self.fail(addr, which, reason, untrusted);
                    return;
                }
                Some(Outcome::Message(data)) => {
                    if let Some(peer) = chan.peer {
                        events.push_back(PairEvent::Message { peer, addr, data });
                    }
                }
                Some(Outcome::Authenticated(first)) => {
                    *next_seq += 1;
                    chan.authenticated_at = Some(*next_seq);
                    if which == Which::Pending {
                        if let Some(p) = slot.pending.take() {
                            slot.primary = p;
                        }
                        which = Which::Primary;
                    }
                    let chan = &mut slot.primary;
                    if let Some(peer) = chan.peer {
                        let addrs = authenticated.entry(peer).or_default();
                        if !addrs.contains(&addr) {
                            addrs.push(addr);
                        }
                        events.push_back(PairEvent::Established { peer, addr });
                        if let Some(data) = first {
                            events.push_back(PairEvent::Message { peer, addr, data });
                        }
                    }
                    for data in slot.queue.drain(..) {
                        if chan.send_data(&data).is_err() {
                            drops.refused += 1;
                        }
                    }
                    while let Some(d) = next_transmit(&mut chan.dc, now) {
                        outbox.push_back((addr, d));
                    }
                }
            }
        }
    }

    /// Moves a channel's pending datagrams to the outbox (before the channel is dropped).
    fn drain(&mut self, now: Timestamp, addr: SocketAddr, which: Which) {
        let Some(slot) = self.slots.get_mut(&addr) else {
            return;
        };
        let chan = match which {
            Which::Primary => Some(&mut slot.primary),
            Which::Pending => slot.pending.as_mut(),
        };
        if let Some(chan) = chan {
            while let Some(d) = next_transmit(&mut chan.dc, now) {
                self.outbox.push_back((addr, d));
            }
        }
    }

    /// A channel failed: counts it and drops it.
    fn fail(&mut self, addr: SocketAddr, which: Which, reason: PairFailure, untrusted: bool) {
        if untrusted {
            self.drops.untrusted += 1;
        } else {
            self.drops.failed += 1;
        }
        self.remove(addr, which, reason);
    }

    /// Drops a channel. A pending replacement goes silently; a primary takes its slot (queue
    /// included) with it, reported if the peer was reachable or the caller was waiting on it.
    fn remove(&mut self, addr: SocketAddr, which: Which, reason: PairFailure) {
        match which {
            Which::Pending => {
                if let Some(slot) = self.slots.get_mut(&addr) {
                    slot.pending = None;
                }
                self.refresh(addr);
            }
            Which::Primary => {
                let Some(slot) = self.drop_slot(addr) else {
                    return;
                };
                let loud = slot.primary.role == Role::Client
                    || slot.primary.dc.is_established()
                    || !slot.queue.is_empty()
                    || slot.expect.is_some();
                if loud {
                    self.events.push_back(PairEvent::Failed { addr, reason });
                }
            }
        }
    }
}

/// Which of a slot's channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Which {
    Primary,
    Pending,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Client,
    Server,
}

/// What a channel's input led to, for the table to act on.
enum Outcome {
    /// Both proofs are accepted; with the first message, if it was what told us.
    Authenticated(Option<Vec<u8>>),
    /// Application data from the authenticated peer.
    Message(Vec<u8>),
    /// The channel is dead: the reason, and whether it is a refused proof.
    Fail(PairFailure, bool),
}

/// Everything at one peer address.
struct Slot {
    /// The channel in use (or being set up).
    primary: Chan,
    /// A newer server channel from the same address, replacing `primary` once authenticated.
    pending: Option<Chan>,
    /// Data waiting for `primary` to be authenticated.
    /// Queued application data (may carry group keys: wiped when dropped).
    queue: VecDeque<Zeroizing<Vec<u8>>>,
    /// The member the caller expects at this address.
    expect: Option<MemberId>,
}

/// This side's view, lent to a channel to build and check proofs.
struct Local<'a> {
    provider: &'a CryptoProvider,
    identity: &'a Identity,
    me: MemberId,
    group: &'a [u8],
    trust: &'a TrustList,
    expect: Option<MemberId>,
}

impl Local<'_> {
    /// What both sides sign: context | u8 len | group | session ID.
    fn signed(&self, session: &[u8; 32]) -> Vec<u8> {
        let mut m = Vec::with_capacity(PROOF_CONTEXT.len() + 1 + self.group.len() + 32);
        m.extend_from_slice(PROOF_CONTEXT);
        m.push(self.group.len() as u8);
        m.extend_from_slice(self.group);
        m.extend_from_slice(session);
        m
    }

    /// Checks a peer's proof; cheap checks first, the signature last.
    fn verify(&self, session: &[u8; 32], msg: &[u8]) -> Result<MemberId, PairFailure> {
        if msg.len() != PROOF_LEN || msg.get(1) != Some(&PROOF_VERSION) {
            return Err(PairFailure::MalformedProof);
        }
        let key: [u8; 32] = msg[2..34]
            .try_into()
            .map_err(|_| PairFailure::MalformedProof)?;
        let id = MemberId::from_bytes(key);
        if id == self.me {
            return Err(PairFailure::OwnIdentity);
        }
        if matches!(self.expect, Some(e) if id != e) {
            return Err(PairFailure::NotExpected);
        }
        if !self.trust.contains(&id) {
            return Err(PairFailure::UntrustedIdentity);
        }
        if !id
            .0
            .verify(self.provider, &self.signed(session), &msg[34..])
        {
            return Err(PairFailure::BadProofSignature);
        }
        Ok(id)
    }
}

/// One channel and its proof exchange.
struct Chan {
    dc: DatagramChannel,
    role: Role,
    /// The ClientHello datagram that started it (sent or received).
    hello: Vec<u8>,
    /// Creation order, for eviction.
    seq: u64,
    session: Option<[u8; 32]>,
    /// The pair key, exported once the handshake is done (shared, never changed: a
    /// coordinator holds on to it while it wraps).
    key: Option<Arc<PairKey>>,
    /// Our proof, once sent.
    proof: Option<Vec<u8>>,
    /// The peer, once its proof is accepted.
    peer: Option<MemberId>,
    /// The accepted proof's bytes, to recognize retransmissions.
    peer_proof: Option<Vec<u8>>,
    /// The peer accepted our proof.
    acked: bool,
    retry_at: Option<Timestamp>,
    rto: Duration,
    tries: u32,
    /// Set when both proofs are accepted; grows with every authentication.
    authenticated_at: Option<u64>,
}

impl Chan {
    fn new(dc: DatagramChannel, role: Role, hello: Vec<u8>, seq: u64) -> Self {
        Chan {
            dc,
            role,
            hello,
            seq,
            session: None,
            key: None,
            proof: None,
            peer: None,
            peer_proof: None,
            acked: false,
            retry_at: None,
            rto: INITIAL_RTO,
            tries: 0,
            authenticated_at: None,
        }
    }

    /// Hands a datagram to the channel; false if the channel dropped it.
    fn offer(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) -> bool {
        let before = self.dc.dropped();
        self.dc.handle_datagram(now, from, data);
        self.dc.dropped() == before
    }

    fn send_data(&mut self, data: &[u8]) -> Result<(), cohort_channel::ChannelError> {
        let mut msg = Vec::with_capacity(1 + data.len());
        msg.push(MSG_DATA);
        msg.extend_from_slice(data);
        self.dc.send(&msg)
    }

    /// The channel's handshake is done: derive the pair key and send our proof.
    fn on_established(
        &mut self,
        now: Timestamp,
        local: &Local<'_>,
        session: [u8; 32],
    ) -> Result<(), PairFailure> {
        let mut label = Vec::with_capacity(KEY_LABEL.len() + 1 + local.group.len());
        label.extend_from_slice(KEY_LABEL);
        label.push(local.group.len() as u8);
        label.extend_from_slice(local.group);
        let key = self
            .dc
            .connection()
            .export_secret(&label, PAIR_KEY_LEN)
            .map_err(|_| PairFailure::KeyExportFailed)?;
        let key = PairKey::new(local.provider, key).map_err(|_| PairFailure::KeyExportFailed)?;
        let signature = local
            .identity
            .sign(local.provider, &local.signed(&session))
            .map_err(|_| PairFailure::SigningFailed)?;
        let mut proof = Vec::with_capacity(PROOF_LEN);
        proof.push(MSG_PROOF);
        proof.push(PROOF_VERSION);
        proof.extend_from_slice(local.me.as_bytes());
        proof.extend_from_slice(&signature);
        self.dc
            .send(&proof)
            .map_err(|_| PairFailure::ProofNotSent)?;
        self.session = Some(session);
        self.key = Some(Arc::new(key));
        self.proof = Some(proof);
        self.rto = INITIAL_RTO;
        self.tries = 0;
        self.retry_at = Some(now.saturating_add(self.rto));
        Ok(())
    }

    /// Our proof was accepted.
    fn on_acked(&mut self) -> Option<Outcome> {
        if self.acked || self.proof.is_none() {
            return None;
        }
        self.acked = true;
        self.retry_at = None;
        self.peer.map(|_| Outcome::Authenticated(None))
    }

    /// An inner message from the peer.
    fn on_message(
        &mut self,
        _now: Timestamp,
        local: &Local<'_>,
        msg: &[u8],
        drops: &mut PairDrops,
    ) -> Option<Outcome> {
        match msg.first() {
            Some(&MSG_PROOF) => {
                if let Some(accepted) = &self.peer_proof {
                    // A retransmission: our ack was lost.
                    if accepted.as_slice() == msg {
                        let _ = self.dc.send(&[MSG_ACK]);
                    } else {
                        drops.unexpected += 1;
                    }
                    return None;
                }
                let Some(session) = self.session else {
                    drops.unexpected += 1;
                    return None;
                };
                match local.verify(&session, msg) {
                    Ok(id) => {
                        self.peer = Some(id);
                        self.peer_proof = Some(msg.to_vec());
                        let _ = self.dc.send(&[MSG_ACK]);
                        self.acked.then_some(Outcome::Authenticated(None))
                    }
                    Err(reason) => {
                        let _ = self.dc.send(&[MSG_REJECT]);
                        Some(Outcome::Fail(reason, true))
                    }
                }
            }
            Some(&MSG_ACK) if msg.len() == 1 => self.on_acked(),
            Some(&MSG_DATA) => {
                if self.peer.is_none() {
                    drops.unexpected += 1;
                    return None;
                }
                // The peer sends data only once it accepted our proof: an implicit ack.
                let data = msg[1..].to_vec();
                match self.on_acked() {
                    Some(_) => Some(Outcome::Authenticated(Some(data))),
                    None => Some(Outcome::Message(data)),
                }
            }
            Some(&MSG_REJECT) if msg.len() == 1 => {
                Some(Outcome::Fail(PairFailure::ProofRefused, false))
            }
            _ => {
                drops.malformed += 1;
                None
            }
        }
    }

    /// The proof's retransmission timer; the reason if it gave up.
    fn on_timeout(&mut self, now: Timestamp) -> Option<PairFailure> {
        let at = self.retry_at?;
        if now < at {
            return None;
        }
        if self.tries >= MAX_RETRANSMITS {
            self.retry_at = None;
            return Some(PairFailure::ProofUnacknowledged);
        }
        self.tries += 1;
        self.rto = (self.rto * 2).min(MAX_RTO);
        if let Some(proof) = &self.proof {
            let _ = self.dc.send(proof);
        }
        self.retry_at = Some(now.saturating_add(self.rto));
        None
    }
}

/// The channel's next datagram, if any.
fn next_transmit(dc: &mut DatagramChannel, now: Timestamp) -> Option<Vec<u8>> {
    let mut d = Vec::new();
    dc.poll_transmit(now, &mut d).map(|_| d)
}

/// Deep copies for the fuzz harnesses only (`fuzzing` feature; see `GroupMember::fork`).
///
/// The table's `Client` and `Server` are handles to caches behind `Arc`s, shared with every
/// channel they made; a derived `Clone` would share them with the original. The copy forks
/// both endpoints once and re-points every channel's connection at the forks, so the copy's
/// channels share the copy's caches as the original's share the original's, and nothing
/// one does (take a ticket, draw a server nonce) shows in the other.
#[cfg(feature = "fuzzing")]
impl PairTable {
    /// A copy in the same state, with its own endpoint caches. `None` if a channel cannot be
    /// copied (a password-mode client waiting for its ServerHello; pair channels never use
    /// password mode, so not in practice).
    pub fn fork(&self) -> Option<PairTable> {
        let client = self.client.fork();
        let server = self.server.fork();
        let mut slots = HashMap::with_capacity(self.slots.len());
        for (addr, slot) in &self.slots {
            slots.insert(*addr, slot.fork(&client, &server)?);
        }
        Some(PairTable {
            provider: self.provider,
            identity: self.identity.clone(),
            me: self.me,
            group: self.group.clone(),
            trust: self.trust.clone(),
            rng: self.rng.clone(),
            client,
            server,
            slots,
            authenticated: self.authenticated.clone(),
            due: self.due.clone(),
            due_at: self.due_at.clone(),
            half_open: self.half_open.clone(),
            half_open_at: self.half_open_at.clone(),
            outbox: self.outbox.clone(),
            events: self.events.clone(),
            next_seq: self.next_seq,
            drops: self.drops,
        })
    }

    /// Whether every channel of this table uses this table's own endpoint caches and none
    /// uses `other`'s (the check of [`fork`](Self::fork)).
    pub fn caches_are_its_own(&self, other: &PairTable) -> bool {
        self.slots
            .values()
            .flat_map(|s| std::iter::once(&s.primary).chain(s.pending.as_ref()))
            .all(|c| {
                let conn = c.dc.connection();
                conn.uses_caches_of(&self.client, &self.server)
                    && !conn.uses_caches_of(&other.client, &other.server)
            })
    }

    /// How many channels the table holds (primary and pending).
    pub fn channels(&self) -> usize {
        self.slots
            .values()
            .map(|s| 1 + usize::from(s.pending.is_some()))
            .sum()
    }
}

#[cfg(feature = "fuzzing")]
impl Slot {
    fn fork(&self, client: &Client, server: &Server) -> Option<Slot> {
        Some(Slot {
            primary: self.primary.fork(client, server)?,
            pending: match &self.pending {
                Some(c) => Some(c.fork(client, server)?),
                None => None,
            },
            queue: self.queue.clone(),
            expect: self.expect,
        })
    }
}

#[cfg(feature = "fuzzing")]
impl Chan {
    fn fork(&self, client: &Client, server: &Server) -> Option<Chan> {
        Some(Chan {
            dc: self.dc.fork(client, server)?,
            role: self.role,
            hello: self.hello.clone(),
            seq: self.seq,
            session: self.session,
            key: self.key.clone(),
            proof: self.proof.clone(),
            peer: self.peer,
            peer_proof: self.peer_proof.clone(),
            acked: self.acked,
            retry_at: self.retry_at,
            rto: self.rto,
            tries: self.tries,
            authenticated_at: self.authenticated_at,
        })
    }
}

#[cfg(test)]
mod tests {
    //! The half-open index against the scan it replaced: `make_room` asserts (in test
    //! builds) that its count and victim equal `half_open_scan`'s at every call.
    #![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code

    use super::*;
    use cohort_crypto::Secret;

    fn identity(n: u8) -> Identity {
        Identity::from_secret(
            &CryptoProvider::default_provider(),
            Secret::from_slice(&[n; 32]),
        )
        .unwrap()
    }

    fn table(n: u8, seed: u8) -> PairTable {
        PairTable::new(
            CryptoProvider::default_provider(),
            identity(n),
            "pair-unit",
            Vec::<MemberId>::new(),
            [seed; 32],
        )
    }

    /// A ClientHello datagram from member `n` (a fresh client each call, seeded by `seed`).
    fn hello(n: u8, seed: u8, to: SocketAddr) -> Vec<u8> {
        let mut t = table(n, seed);
        let now = Timestamp::from_millis(1_000);
        t.send(now, to, None, b"x");
        let mut buf = Vec::new();
        t.poll_transmit(now, &mut buf).unwrap();
        buf
    }

    fn spoofed(i: usize) -> SocketAddr {
        SocketAddr::from(([172, 16, (i >> 8) as u8, i as u8], 4000))
    }

    #[test]
    fn eviction_takes_the_oldest_half_open_channel_outside_the_incoming_address() {
        let me = SocketAddr::from(([10, 0, 0, 2], 7000));
        let mut t = table(2, 2);
        let (h1, h2) = (hello(5, 5, me), hello(5, 6, me));
        let now = Timestamp::from_millis(2_000);
        // Fill most of the table, restart some handshakes (a new hello at the same address
        // replaces the half-open primary, with a newer seq), then fill it to the bound.
        let first = MAX_HALF_OPEN - 200;
        for i in 0..first {
            t.handle_datagram(now, spoofed(i), &h1);
        }
        for i in (0..first).step_by(7) {
            t.handle_datagram(now, spoofed(i), &h2);
        }
        assert_eq!(
            t.drops.evicted,
            first.div_ceil(7) as u64,
            "replaced, not evicted"
        );
        for i in first..MAX_HALF_OPEN {
            t.handle_datagram(now, spoofed(i), &h1);
        }
        assert_eq!(t.half_open.len(), MAX_HALF_OPEN);
        // Each new address now evicts the oldest channel: address 1 (seq 2) first, then 2,
        // 3, 4, 5, 6, 8 (7 was restarted, so it is newer).
        let expect = [1usize, 2, 3, 4, 5, 6, 8];
        for (k, gone) in expect.iter().enumerate() {
            let before = t.slots.contains_key(&spoofed(*gone));
            t.handle_datagram(now, spoofed(MAX_HALF_OPEN + k), &h1);
            assert!(
                before && !t.slots.contains_key(&spoofed(*gone)),
                "{k}: {gone}"
            );
            assert_eq!(t.half_open.len(), MAX_HALF_OPEN);
        }
        assert!(t.slots.contains_key(&spoofed(0)) && t.slots.contains_key(&spoofed(7)));
        // A restart at the oldest address does not evict that address's own channel (the
        // new one replaces it); the policy still counts it, so the next oldest goes too.
        let mut by_age = t.half_open.iter().map(|(_, a, _)| *a);
        let (oldest, next) = (by_age.next().unwrap(), by_age.next().unwrap());
        t.handle_datagram(now, oldest, &h2);
        assert!(t.slots.contains_key(&oldest) && !t.slots.contains_key(&next));
        assert_eq!(t.half_open.len(), MAX_HALF_OPEN - 1);
        // Timeouts drop the half-open channels and the index with them.
        for _ in 0..100_000 {
            let Some(at) = t.poll_timeout() else { break };
            t.handle_timeout(at);
        }
        assert!(t.slots.is_empty() && t.half_open.is_empty() && t.half_open_at.is_empty());
    }
}
