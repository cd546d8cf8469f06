//! The group's messages: the bodies of protected group packets ([`Msg`]) and of pair-channel
//! messages ([`PairMsg`]). Layouts are in `docs/wire.md`; every parser checks bounds and
//! returns `None` on anything malformed.

use crate::event::RemovalReason;
use crate::id::{Member, MemberId, ViewId};
use crate::keys::{KeyWrap, WRAP_LEN};
use crate::lkh::{LkhDelivery, NodeId, Wrap, MAX_DEGREE, MAX_DEPTH, SEALED_LEN, WRAP_WIRE_LEN};
use cohort_core::wire::{Reader, Truncated, Writer};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use zeroize::Zeroizing;

/// Version of the group message formats. Pair messages carry it as their first byte.
/// Protected group packets carry the gears packet version in their first byte and bind this
/// one into their key derivation (`keys.rs`): a member of another version derives other keys,
/// so its packets fail authentication instead of being misread.
pub const GROUP_VERSION: u8 = 10;
/// Most members a view may list (keeps every list bounded when parsing): ranks are `u16`
/// and `u16::MAX` is the broadcast destination, so ranks run 0..=65,534.
pub const MAX_MEMBERS: usize = u16::MAX as usize;
/// Most parts one Install, Welcome or member list is split into ([`Msg::InstallChunk`],
/// [`PairMsg::Part`]): 512 parts of at most [`MAX_PART_LEN`] bytes hold a member list of
/// [`MAX_MEMBERS`] (about 60 bytes each) with room to spare.
pub const MAX_PARTS: usize = 512;
/// Most bytes in one part: a part and its headers fit a pair-channel record (16 KiB).
pub const MAX_PART_LEN: usize = 15_000;
/// Most entries in one [`Msg::Orders`].
pub const MAX_ORDERS: usize = 4096;
/// Most suspected ranks in one [`Msg::Report`].
pub const MAX_SUSPECTS: usize = 256;
/// Most pending messages in one flush answer.
pub const MAX_PENDING: usize = 1024;
/// Most wraps in one LKH Install.
pub const MAX_LKH_WRAPS: usize = 16_384;
/// Longest sealed LKH path: slot, (version, key) for each level to [`MAX_DEPTH`], tag.
const MAX_LKH_PATH: usize = 4 + (MAX_DEPTH as usize + 1) * 40 + 16;

/// A message inside a protected group packet.
#[derive(Clone, Debug, PartialEq)]
pub enum Msg {
    /// Liveness and acknowledgement. Members send it to the leader; the leader to all.
    Heartbeat {
        /// Reliable messages of this view delivered here (the next expected position).
        delivered: u64,
        /// Leader only: positions assigned so far in this view.
        ordered: u64,
        /// Leader only: positions every member has delivered (members may forget below).
        stable: u64,
        /// The sender's CPU load, 0 to 255.
        load: u8,
        /// Failed verifications at the sender, cumulative.
        failures: u64,
    },
    /// An unreliable application message.
    Unreliable {
        /// The sender's message number.
        seq: u64,
        /// Payload.
        data: Vec<u8>,
    },
    /// A reliable message on its way to the sequencer (the leader).
    Submit {
        /// The sender's message number.
        seq: u64,
        /// Payload.
        data: Vec<u8>,
    },
    /// A reliable message with its position, from the sequencer (or a flush coordinator).
    Ordered {
        /// Position in the view's total order.
        order: u64,
        /// The sender's rank in the view.
        sender: u16,
        /// The sender's message number.
        seq: u64,
        /// Payload.
        data: Vec<u8>,
    },
    /// Consecutive reliable messages with their positions, from a flush coordinator: entry
    /// `i` (the sender's rank, its message number, the payload) is at position `first + i`.
    /// A coordinator appends the survivors' pending messages to the old view's order in one
    /// or a few of these, sealed once for every survivor; one [`Msg::Ordered`] per message
    /// and per survivor was about 47 x 2,450 = 115,150 datagrams after one input in the
    /// simulator's 3,000-member sweep.
    OrderedRun {
        /// Position of the first entry.
        first: u64,
        /// (sender rank, message number, payload), in position order; at least one and at
        /// most [`MAX_PENDING`].
        entries: Vec<(u16, u64, Vec<u8>)>,
    },
    /// Positions for submissions the members received relayed from the sequencer: position
    /// `first + i` goes to entry `i` (the sender's rank and message number).
    Orders {
        /// Position of the first entry.
        first: u64,
        /// (sender rank, message number), in position order.
        entries: Vec<(u16, u64)>,
    },
    /// Please resend positions `from..to` of this view.
    Nak {
        /// First missing position.
        from: u64,
        /// One past the last missing position.
        to: u64,
    },
    /// The coordinator starts a view change: stop sending, report what you have.
    Flush {
        /// The id the next view will have (its coordinator: the sender).
        proposal: ViewRef,
        /// The members the coordinator expects to continue (by rank in the current view).
        survivors: Vec<u16>,
    },
    /// A member's answer to [`Msg::Flush`].
    FlushOk {
        /// The proposal answered.
        proposal: ViewRef,
        /// Reliable messages of this view delivered here.
        delivered: u64,
        /// This member's next reliable message number.
        next_seq: u64,
        /// Own reliable messages not yet seen ordered: `(seq, data)`.
        pending: Vec<(u64, Vec<u8>)>,
    },
    /// The next view. Members deliver up to `final_order` positions of this view, then
    /// install it.
    Install(Box<Install>),
    /// An Install sealed whole in a group packet (type 24, `GROUP_VERSION` 10): as
    /// [`Msg::Install`] without its two view ids (80 bytes), which follow from the packet.
    /// The base is the view whose keys sealed it (a coordinator seals its Install under the
    /// view the change applies to) and the new view's coordinator is its sender; only the
    /// new view's sequence number travels. It decodes with both ids' coordinators and the
    /// base's number zero; the receiver fills them in ([`Install::in_view`]) and then
    /// handles it as an Install. An id filled in wrongly fails the signature or the wrap,
    /// which cover both ids.
    InstallInView(Box<Install>),
    /// A member installed the view (sent under the new view's key).
    InstallAck,
    /// A member asks the leader to remove it.
    Leave,
    /// A member asks the leader for a fresh key.
    RekeyRequest,
    /// Part `index` of `total` of an encoded [`Msg::Install`] for view `view` that does
    /// not fit one datagram. The group packet authenticates each part as coming from a
    /// member; the receiver reassembles every part before decoding, and the coordinator's
    /// signature (identity keys) or the receiver's wrap (KDC mode) authenticates the whole.
    InstallChunk {
        /// The view the Install installs.
        view: ViewId,
        /// This part's index, below `total`.
        index: u16,
        /// How many parts (at most [`MAX_PARTS`]).
        total: u16,
        /// The part's bytes (at most [`MAX_PART_LEN`]).
        data: Vec<u8>,
    },
    /// Failure detection over the overlay (views of more than `OVERLAY_MIN` members): what a
    /// member reports for its subtree to its parent in the overlay (or, once orphaned, to
    /// the leader). See `member/overlay.rs`.
    Report {
        /// The fewest positions delivered by any member of the subtree.
        delivered: u64,
        /// The rank of a member of the subtree that delivered only `delivered`.
        holder: u16,
        /// The highest CPU load in the subtree, 0 to 255.
        load: u8,
        /// Failed verifications in the subtree, summed.
        failures: u64,
        /// Ranks in the subtree suspected of having failed (at most [`MAX_SUSPECTS`]).
        suspects: Vec<u16>,
    },
    /// To the leader, from a member that has not heard the leader through its overlay parent
    /// for a suspicion timeout: the parent is suspected, and this member now reports to the
    /// leader directly until the next view.
    Orphaned {
        /// The silent parent's rank.
        parent: u16,
    },
    /// From a member taking over from a silent leader, to a lower-ranked member: are you
    /// alive? (Answered by [`Msg::ProbeAck`].)
    Probe,
    /// The answer to [`Msg::Probe`].
    ProbeAck,
    /// Flush answers of part of an overlay subtree, on their way up the overlay to the
    /// coordinator (views of more than `OVERLAY_MIN` members; `member/tree_flush.rs`): the
    /// union of [`Msg::FlushOk`]s, folded. Several may cover one subtree; the coordinator
    /// takes their union.
    FlushOks {
        /// The proposal answered.
        proposal: ViewRef,
        /// The most positions any of the answering members delivered.
        delivered: u64,
        /// A member (rank) that delivered `delivered` positions.
        holder: u16,
        /// The ranks that answered, as ascending, disjoint runs `(first, length)`, each of
        /// length at least 1 (at most [`MAX_RUNS`] runs).
        answered: Vec<(u16, u16)>,
        /// The answering members' next reliable message numbers, `(rank, next_seq)`, for
        /// those whose number is not 0 (at most [`MAX_MEMBERS`] entries).
        next_seqs: Vec<(u16, u64)>,
        /// Their reliable messages not yet seen ordered, `(rank, seq, data)` (at most
        /// [`MAX_PENDING`]).
        pending: Vec<(u16, u64, Vec<u8>)>,
    },
    /// Install acknowledgements of part of an overlay subtree, on their way up the old
    /// view's overlay to the coordinator, under the old view's keys (`member/tree_flush.rs`).
    InstallAcks {
        /// The view installed (its coordinator's rank in the old view).
        view: ViewRef,
        /// The ranks (in the old view) that installed it, as in [`Msg::FlushOks`].
        acked: Vec<(u16, u16)>,
    },
    /// From the coordinator of view `view`, under the keys of `base`, to each member of
    /// `base` the new view leaves out (identity keys only): which members of `base` it
    /// keeps, signed. It stands in for the whole Install, which lists every member removed
    /// and so, sent to each of them, grew with the square of a cut (a partition of 10,000).
    /// The same bytes go to every member left out.
    LeftOut {
        /// The new view's id (its coordinator signed this).
        view: ViewId,
        /// The view the change applies to.
        base: ViewId,
        /// One bit per rank of `base`, set for the members the new view keeps
        /// ([`kept_bits`]); exactly `ceil(n / 8)` bytes, unused bits zero.
        kept: Vec<u8>,
        /// Ranks of `base` (left out, ascending) whose member the new view lets in again
        /// under a new incarnation: they are in the other component too.
        rejoined: Vec<u16>,
        /// The coordinator's signature over [`left_out_signed_bytes`].
        signature: Vec<u8>,
    },
}

/// Longest [`Msg::LeftOut`] bitmap: one bit for each of [`MAX_MEMBERS`] ranks.
pub const MAX_KEPT_BYTES: usize = MAX_MEMBERS.div_ceil(8);

/// [`Msg::LeftOut`]'s bitmap for a base view of `n` members of which the ranks `left`
/// (ascending or not) do not go on: bit `r % 8` (least significant first) of byte `r / 8` is
/// set when rank `r` is kept.
pub fn kept_bits(n: usize, left: &[u16]) -> Vec<u8> {
    let mut bits = vec![0xFFu8; n.div_ceil(8)];
    if !n.is_multiple_of(8) {
        if let Some(last) = bits.last_mut() {
            *last = (1u8 << (n % 8)) - 1;
        }
    }
    for r in left.iter().map(|r| usize::from(*r)).filter(|r| *r < n) {
        bits[r / 8] &= !(1 << (r % 8));
    }
    bits
}

/// Whether `bits` ([`kept_bits`]) keeps `rank`.
pub fn is_kept(bits: &[u8], rank: u16) -> bool {
    let r = usize::from(rank);
    bits.get(r / 8).is_some_and(|b| b & (1 << (r % 8)) != 0)
}

/// Whether `bits` is a well-formed bitmap for a view of `n` members: `ceil(n / 8)` bytes,
/// no bit set at or past `n`.
pub fn kept_bits_fit(bits: &[u8], n: usize) -> bool {
    bits.len() == n.div_ceil(8)
        && (n.is_multiple_of(8) || bits.last().is_none_or(|last| last >> (n % 8) == 0))
}

/// What the coordinator signs for a [`Msg::LeftOut`]: a label of its own (no Install's
/// signature can pass for one), the group name, both view ids and the bitmap.
pub fn left_out_signed_bytes(
    group: &str,
    view: &ViewId,
    base: &ViewId,
    kept: &[u8],
    rejoined: &[u16],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + group.len() + 2 * 40 + kept.len() + 2 * rejoined.len());
    out.extend_from_slice(b"cohort group left out v1");
    out.push(group.len() as u8);
    out.extend_from_slice(group.as_bytes());
    let mut w = Writer::new(&mut out);
    put_left_out_fields(&mut w, view, base, kept, rejoined);
    out
}

/// [`Msg::LeftOut`]'s fields before its signature.
fn put_left_out_fields(
    w: &mut Writer<'_>,
    view: &ViewId,
    base: &ViewId,
    kept: &[u8],
    rejoined: &[u16],
) {
    put_view_id(w, view);
    put_view_id(w, base);
    w.u16(kept.len() as u16).bytes(kept);
    w.u16(rejoined.len() as u16);
    for r in rejoined {
        w.u16(*r);
    }
}

/// Most runs of ranks in one [`Msg::FlushOks`] or [`Msg::InstallAcks`].
pub const MAX_RUNS: usize = 4096;

/// The key a new view uses.
#[derive(Clone, Debug, PartialEq)]
pub enum KeyDelivery {
    /// The current group key stays (no rekey was due).
    Same,
    /// LSGC: the fresh key wrapped for members of the new view under each one's pair key
    /// with the coordinator, as (rank in the new view, wrap). The coordinator holds every
    /// wrap; the copy a member receives carries only its own.
    /// Every wrap is [`WRAP_LEN`] bytes; a wrap of another length fails to decode.
    Wrapped(Vec<(u16, KeyWrap)>),
    /// Ensemble: the fresh key already went down the tree; this is its fingerprint.
    Tree([u8; 8]),
    /// LKH (`lkh.rs`): the batch's wraps (in the signature) and whole paths sealed under
    /// pair keys for joiners or on a reseed (not in the signature: each opens only under
    /// its member's pair key, and a large Install's copy keeps only its member's).
    Lkh(Box<LkhDelivery>),
}

/// A member a view change lets in: who, its next reliable message number and its
/// incarnation (a random number drawn when it starts: a join request with another
/// incarnation comes from a restarted process).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Joined {
    /// The member.
    pub member: Member,
    /// Its next reliable message number (from its join request).
    pub next_seq: u64,
    /// Its incarnation.
    pub incarnation: u64,
}

/// The body of [`Msg::Install`]: the change from the view `base` to the view `view`.
///
/// The new view's members are `base`'s members whose ranks are not in `left`, in their old
/// order, then `joined`, in order; `digest` is [`roster_digest`] of that list with every
/// member's incarnation, so a receiver that applied the change to its own copy of `base`
/// knows it holds exactly the coordinator's list, and one that lacks `base` (a joiner)
/// fetches the list ([`PairMsg::ListRequest`]) and checks it against the digest. An
/// Install thus grows with the change, not with the view.
#[derive(Clone, Debug, PartialEq)]
pub struct Install {
    /// The new view's id.
    pub view: ViewId,
    /// The view the change applies to (the coordinator's view).
    pub base: ViewId,
    /// How many members the new view has.
    pub count: u16,
    /// Ranks in `base` that are not in the new view, ascending.
    pub left: Vec<u16>,
    /// Members appended after the survivors.
    pub joined: Vec<Joined>,
    /// [`roster_digest`] of the new view's members and incarnations, by rank.
    pub digest: [u8; 32],
    /// Every member's next reliable message number, by rank, only when the new view's
    /// leader (its sequencer, who needs them all) is not the coordinator (the old leader
    /// left or was taken over from); empty otherwise. Each member knows its own: a
    /// survivor reported it in its flush answer, a joiner's is in `joined`.
    pub next_seqs: Vec<u64>,
    /// The new view's key epoch.
    pub key_epoch: u64,
    /// Positions of the old view every survivor delivers before installing.
    pub final_order: u64,
    /// The new view's key.
    pub key: KeyDelivery,
    /// Set when the view change dissolves this component into another one (whose leader is
    /// at this address): members deliver up to `final_order` and then join there instead
    /// of installing the view.
    pub merge_into: Option<SocketAddr>,
    /// Members of the old view left out for a reason other than suspicion, by their ranks
    /// in `base` (ascending, each one in `left`), and why (as far as the coordinator knows).
    /// A member left out and not listed was suspected. Ranks since `GROUP_VERSION` 10
    /// (before, member ids: 33 bytes an entry in every copy, against 3).
    pub removed: Vec<(u16, RemovalReason)>,
    /// The coordinator's Ed25519 signature over [`Install::signed_bytes`] (64 bytes). Every
    /// member of the old view holds its keys, so without it a member being removed could
    /// forge an Install that keeps the old key. Empty in KDC mode and, since
    /// `GROUP_VERSION` 10, in a [`KeyDelivery::Wrapped`] Install: there each member's wrap
    /// binds SHA-256 of the signed bytes under the pair key it shares with the coordinator.
    pub signature: Vec<u8>,
}

impl Install {
    /// What the coordinator signs: a label, the group name and the Install without its
    /// signature, with wrapped keys left out (they differ between per-member copies and
    /// authenticate themselves under each member's pair key).
    pub fn signed_bytes(&self, group: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(256 + 60 * self.joined.len());
        out.extend_from_slice(b"cohort group install v2");
        out.push(group.len() as u8);
        out.extend_from_slice(group.as_bytes());
        let mut w = Writer::new(&mut out);
        put_install_fields(&mut w, self, false);
        out
    }

    /// Fills in what a [`Msg::InstallInView`] leaves out: `base`, the view whose keys sealed
    /// it, and `coordinator`, its sender there, the new view's coordinator.
    pub fn in_view(&mut self, base: ViewId, coordinator: MemberId) {
        self.base = base;
        self.view.coordinator = coordinator;
    }

    /// The rank `id` gets in the new view when it is one of the joiners.
    pub fn joiner_rank(&self, id: &MemberId) -> Option<u16> {
        let first = usize::from(self.count).checked_sub(self.joined.len())?;
        let i = self.joined.iter().position(|j| j.member.id == *id)?;
        u16::try_from(first + i).ok()
    }

    /// The rank that the member at `base_rank` in `base` gets in the new view, if it stays.
    pub fn survivor_rank(&self, base_rank: u16) -> Option<u16> {
        match self.left.binary_search(&base_rank) {
            Ok(_) => None,
            Err(i) => Some(base_rank - i as u16),
        }
    }
}

/// The member list of a view with each member's incarnation, by rank, as hashed into
/// [`Install::digest`] and sent in parts to a member that lacks it: `count: u16`, then per
/// member its id, address and incarnation.
pub fn encode_roster(members: &[Member], incarnations: &[u64]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_roster_into(members, incarnations, &mut out);
    out
}

/// [`encode_roster`] into `out` (cleared first), reusing its allocation.
pub fn encode_roster_into(members: &[Member], incarnations: &[u64], out: &mut Vec<u8>) {
    out.clear();
    out.reserve(2 + 59 * members.len());
    out.extend_from_slice(&(members.len() as u16).to_be_bytes());
    // Each entry assembled on the stack and appended in one copy (the bytes of
    // `put_member` then a `u64`): the leader of 10,000 encodes one per view change.
    let mut entry = [0u8; 32 + 1 + 16 + 2 + 8];
    for (i, m) in members.iter().enumerate() {
        entry[..32].copy_from_slice(m.id.as_bytes());
        let mut at = 33;
        match m.addr.ip() {
            IpAddr::V4(ip) => {
                entry[32] = 4;
                entry[at..at + 4].copy_from_slice(&ip.octets());
                at += 4;
            }
            IpAddr::V6(ip) => {
                entry[32] = 6;
                entry[at..at + 16].copy_from_slice(&ip.octets());
                at += 16;
            }
        }
        entry[at..at + 2].copy_from_slice(&m.addr.port().to_be_bytes());
        at += 2;
        let incarnation = incarnations.get(i).copied().unwrap_or(0);
        entry[at..at + 8].copy_from_slice(&incarnation.to_be_bytes());
        at += 8;
        out.extend_from_slice(&entry[..at]);
    }
}

/// Parses [`encode_roster`]'s bytes; `None` if malformed, empty or longer than
/// [`MAX_MEMBERS`].
pub fn decode_roster(bytes: &[u8]) -> Option<(Vec<Member>, Vec<u64>)> {
    let mut r = Reader::new(bytes);
    let n = get_count(&mut r, MAX_MEMBERS)?;
    if n == 0 {
        return None;
    }
    let mut members = Vec::with_capacity(n);
    let mut incarnations = Vec::with_capacity(n);
    for _ in 0..n {
        members.push(get_member(&mut r)?);
        incarnations.push(r.u64().ok()?);
    }
    r.is_empty().then_some((members, incarnations))
}

/// The BLAKE3 key of [`roster_digest`]: a fixed, public domain key (keyed BLAKE3 with a
/// domain key per use, as elsewhere in cohort), not a secret.
pub const ROSTER_DIGEST_KEY: [u8; 32] = *b"cohort group roster digest v2\0\0\0";

/// BLAKE3, keyed with [`ROSTER_DIGEST_KEY`], of [`encode_roster`]'s bytes (32 bytes): what an
/// Install's `digest` holds. It was SHA-256 (`GROUP_VERSION` 3 and before), which cost a
/// group leader about 1.5 ms of CPU per view change at 10,000 members (600 KB a view, on a
/// CPU without SHA extensions); BLAKE3 hashes the same bytes several times faster (its
/// chunks are compressed in parallel SIMD lanes) with the same 256-bit output and 128-bit
/// collision resistance.
pub fn roster_digest(hash: &dyn cohort_crypto::KeyedHash, roster: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    hash.hash(&ROSTER_DIGEST_KEY, &[roster], &mut out);
    out
}

/// A message over a pair channel (already encrypted and mutually authenticated).
#[derive(Clone, Debug, PartialEq)]
pub enum PairMsg {
    /// Let me in. Carries the joiner's next reliable message number.
    JoinRequest {
        /// The group name.
        group: String,
        /// The joiner's incarnation.
        incarnation: u64,
        /// The joiner's next reliable message number.
        next_seq: u64,
        /// A member that dissolved its component to merge proves it holds the group key
        /// (`exchange::merge_proof`); the leader then lets it in without a rekey.
        key_proof: Option<[u8; 16]>,
    },
    /// I am in a view; its leader is there.
    Redirect {
        /// The leader's address.
        leader: SocketAddr,
    },
    /// I am not in a view either.
    NotInGroup,
    /// For a joiner: the view, with the group key in clear (the channel encrypts it).
    Welcome {
        /// The view (as a change from the coordinator's view, which the joiner lacks).
        install: Box<Install>,
        /// The group key (wiped when dropped).
        key: Zeroizing<Vec<u8>>,
        /// The new view's member list ([`encode_roster`]) when it is short; empty
        /// otherwise, and the joiner fetches it ([`PairMsg::ListRequest`]). Either way the
        /// joiner checks it against the Install's digest.
        roster: Vec<u8>,
    },
    /// Tree rekey: a fresh key for the receiver and the members below it.
    KeyShare {
        /// The view change this key is for.
        proposal: ViewId,
        /// Key epoch.
        key_epoch: u64,
        /// The key (wiped when dropped).
        key: Zeroizing<Vec<u8>>,
        /// The members below the receiver: positions `(first, count)` of the tree order,
        /// the survivors the proposal's Flush listed other than its coordinator, by rank
        /// (every member flushing for the proposal knows them; the receiver splits them
        /// among its children). Since `GROUP_VERSION` 8; before, the members themselves,
        /// which outgrew a datagram past about 6,000 members.
        below: (u16, u16),
        /// Tree degree.
        degree: u16,
    },
    /// Nothing: opens the pair channel (its handshake authenticates both ends).
    Ping,
    /// KDC mode, LSGC message 4: the session leader's answer to a JoinRequest (over the pair
    /// channel, under σ): the view id and the joiner's authentication token `{g, A}_{SK_g}`,
    /// and where the view's members are, for message 5.
    Grant {
        /// The view the token is for.
        view: ViewId,
        /// The token.
        token: Vec<u8>,
        /// The members' addresses (the joiner presents the token to each).
        members: Vec<SocketAddr>,
    },
    /// KDC mode, LSGC message 5 (to the leader, over the pair channel): the joiner presents
    /// its token; a valid one for the leader's current (or previous) view lets it in.
    Present {
        /// The view the token is for.
        view: ViewId,
        /// The token.
        token: Vec<u8>,
    },
    /// KDC mode: the coordinator of `view` left the receiver out, for `reason` (the Install
    /// itself carries no wrap the receiver could authenticate it with).
    Removed {
        /// The view that leaves the receiver out.
        view: ViewId,
        /// Why.
        reason: RemovalReason,
    },
    /// KDC mode's Exchange ticket: a leader hands its group key to the leader whose Id
    /// carried `nonce` (the pair channel authenticates and encrypts it).
    Ticket {
        /// The recipient's nonce, from its Id.
        nonce: [u8; 16],
        /// The key's epoch at the sender.
        key_epoch: u64,
        /// The group key (wiped when dropped).
        key: Zeroizing<Vec<u8>>,
    },
    /// Tree rekey: these members (the sender and those below it that answered) hold the key.
    KeyAck {
        /// The view change.
        proposal: ViewId,
        /// Who holds it: runs of ranks in the view the proposal's Flush came from (since
        /// `GROUP_VERSION` 8; before, member ids).
        holders: Vec<(u16, u16)>,
    },
    /// Part `index` of `total` of something too long for one pair record: a Welcome
    /// ([`PART_WELCOME`], parts of the encoded [`PairMsg::Welcome`]), the member list of
    /// view `view` ([`PART_LIST`], parts of [`encode_roster`]'s bytes) or a KDC-mode Grant
    /// ([`PART_GRANT`], parts of the encoded [`PairMsg::Grant`]). The pair channel
    /// authenticates each part; the receiver reassembles all before decoding, and checks a
    /// list against its Install's digest.
    Part {
        /// The view.
        view: ViewId,
        /// [`PART_WELCOME`], [`PART_LIST`] or [`PART_GRANT`].
        what: u8,
        /// This part's index, below `total`.
        index: u16,
        /// How many parts (at most [`MAX_PARTS`]).
        total: u16,
        /// The part's bytes (at most [`MAX_PART_LEN`]).
        data: Vec<u8>,
    },
    /// A member of view `view` that lacks its member list asks the view's coordinator for
    /// the list's parts from `from` on (a few at a time). Asked by anyone else, it gets
    /// nothing.
    ListRequest {
        /// The view.
        view: ViewId,
        /// The first part wanted.
        from: u16,
    },
}

/// [`PairMsg::Part`] of an encoded Welcome.
pub const PART_WELCOME: u8 = 1;
/// [`PairMsg::Part`] of a view's member list.
pub const PART_LIST: u8 = 2;
/// [`PairMsg::Part`] of an encoded KDC-mode Grant: its member addresses (7 bytes each for
/// IPv4, 19 for IPv6) outgrow a 64 KiB datagram at about 9,300 IPv4 members.
pub const PART_GRANT: u8 = 3;

fn reason_code(why: RemovalReason) -> u8 {
    match why {
        RemovalReason::Left => 1,
        RemovalReason::Suspected => 2,
        RemovalReason::Lagged => 3,
        RemovalReason::Untrusted => 4,
    }
}

fn reason_from(code: u8) -> Option<RemovalReason> {
    Some(match code {
        1 => RemovalReason::Left,
        2 => RemovalReason::Suspected,
        3 => RemovalReason::Lagged,
        4 => RemovalReason::Untrusted,
        _ => return None,
    })
}

/// A view id as a flush names it (`GROUP_VERSION` 9): its sequence number and its
/// coordinator's rank in the view whose keys seal the message, which every receiver of it
/// holds (10 bytes instead of a [`ViewId`]'s 40). The receiver resolves the rank to the
/// coordinator's member id in that view; a rank outside it is `unexpected`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ViewRef {
    /// The view's sequence number.
    pub seq: u64,
    /// Its coordinator's rank in the view the message is sealed under.
    pub coordinator: u16,
}

fn put_view_ref(w: &mut Writer<'_>, r: &ViewRef) {
    w.u64(r.seq).u16(r.coordinator);
}

fn get_view_ref(r: &mut Reader<'_>) -> Option<ViewRef> {
    Some(ViewRef {
        seq: r.u64().ok()?,
        coordinator: r.u16().ok()?,
    })
}

fn put_view_id(w: &mut Writer<'_>, id: &ViewId) {
    w.u64(id.seq).bytes(id.coordinator.as_bytes());
}

fn get_view_id(r: &mut Reader<'_>) -> Result<ViewId, Truncated> {
    let seq = r.u64()?;
    let coordinator = MemberId::from_bytes(r.array()?);
    Ok(ViewId { seq, coordinator })
}

pub(crate) fn put_addr(w: &mut Writer<'_>, addr: &SocketAddr) {
    match addr.ip() {
        IpAddr::V4(ip) => {
            w.u8(4).bytes(&ip.octets());
        }
        IpAddr::V6(ip) => {
            w.u8(6).bytes(&ip.octets());
        }
    }
    w.u16(addr.port());
}

pub(crate) fn get_addr(r: &mut Reader<'_>) -> Option<SocketAddr> {
    let ip = match r.u8().ok()? {
        4 => IpAddr::V4(Ipv4Addr::from(r.array::<4>().ok()?)),
        6 => IpAddr::V6(Ipv6Addr::from(r.array::<16>().ok()?)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, r.u16().ok()?))
}

fn put_member(w: &mut Writer<'_>, m: &Member) {
    w.bytes(m.id.as_bytes());
    put_addr(w, &m.addr);
}

fn get_member(r: &mut Reader<'_>) -> Option<Member> {
    let id = MemberId::from_bytes(r.array().ok()?);
    let addr = get_addr(r)?;
    Some(Member { id, addr })
}

fn put_bytes32(w: &mut Writer<'_>, data: &[u8]) {
    w.u32(data.len() as u32).bytes(data);
}

fn get_bytes32(r: &mut Reader<'_>) -> Option<Vec<u8>> {
    let n = r.u32().ok()? as usize;
    Some(r.bytes(n).ok()?.to_vec())
}

/// A count u16 (at most [`MAX_MEMBERS`]) and that many ranks, strictly ascending.
fn get_ascending_ranks(r: &mut Reader<'_>) -> Option<Vec<u16>> {
    let n = get_count(r, MAX_MEMBERS)?;
    let mut ranks: Vec<u16> = Vec::with_capacity(n);
    for _ in 0..n {
        let rank = r.u16().ok()?;
        if ranks.last().is_some_and(|l| *l >= rank) {
            return None;
        }
        ranks.push(rank);
    }
    Some(ranks)
}

fn get_count(r: &mut Reader<'_>, max: usize) -> Option<usize> {
    let n = r.u16().ok()? as usize;
    (n <= max).then_some(n)
}

/// A Flush's survivors as the ranks left out of `0..n` (a Flush then grows with the
/// change, not with the view): `n: u16` (one past the highest survivor), then the count and
/// the ranks left out, ascending (rank `n - 1` never among them).
fn put_survivors(w: &mut Writer<'_>, survivors: &[u16]) {
    // A coordinator's survivors come ascending: then they are walked as they are, with no
    // copy and no search per rank (a Flush at 10,000 members).
    let owned;
    let sorted: &[u16] = if survivors.windows(2).all(|p| p[0] < p[1]) {
        survivors
    } else {
        let mut v = survivors.to_vec();
        v.sort_unstable();
        v.dedup();
        owned = v;
        &owned
    };
    let n = sorted.last().map_or(0, |m| usize::from(*m) + 1);
    w.u16(n as u16).u16((n - sorted.len()) as u16);
    for r in ranks_left_out(n, sorted) {
        w.u16(r);
    }
}

/// The ranks of `0..n` not in `survivors` (ascending, each below `n`), ascending: one walk
/// over both, not a search per rank.
pub(crate) fn ranks_left_out(n: usize, survivors: &[u16]) -> impl Iterator<Item = u16> + '_ {
    let mut next = survivors.iter().peekable();
    (0..n as u16).filter(move |r| next.next_if_eq(&r).is_none())
}

fn get_survivors(r: &mut Reader<'_>) -> Option<Vec<u16>> {
    let n = r.u16().ok()?;
    let k = get_count(r, usize::from(n))?;
    let mut out = Vec::with_capacity(k);
    for _ in 0..k {
        let rank = r.u16().ok()?;
        if rank >= n || out.last().is_some_and(|l| *l >= rank) {
            return None;
        }
        out.push(rank);
    }
    // `n` is one past the highest survivor, so rank n - 1 is never left out: the encoding
    // is canonical (the fuzzer found `n` = 3 with rank 2 left out, which re-encodes as 2).
    if n > 0 && out.last() == Some(&(n - 1)) {
        return None;
    }
    let mut survivors = Vec::with_capacity(usize::from(n) - k);
    let mut gone = out.iter().peekable();
    for rank in 0..n {
        if gone.peek() == Some(&&rank) {
            gone.next();
        } else {
            survivors.push(rank);
        }
    }
    Some(survivors)
}

/// Runs of ranks: `count: u16`, then `(first: u16, length: u16)` each.
fn put_runs(w: &mut Writer<'_>, runs: &[(u16, u16)]) {
    w.u16(runs.len() as u16);
    for (first, len) in runs {
        w.u16(*first).u16(*len);
    }
}

/// Runs of ranks, checked: each of length at least 1, ending at most at `MAX_MEMBERS`,
/// ascending and apart (a run starts past the end of the one before, so one set of ranks
/// has one encoding).
fn get_runs(r: &mut Reader<'_>) -> Option<Vec<(u16, u16)>> {
    let n = get_count(r, MAX_RUNS)?;
    let mut runs: Vec<(u16, u16)> = Vec::with_capacity(n);
    let mut next_free = 0u32;
    for i in 0..n {
        let first = r.u16().ok()?;
        let len = r.u16().ok()?;
        let end = u32::from(first) + u32::from(len);
        if len == 0 || end > MAX_MEMBERS as u32 || (i > 0 && u32::from(first) <= next_free) {
            return None;
        }
        next_free = end;
        runs.push((first, len));
    }
    Some(runs)
}

/// `ranks` (any order, repeats allowed) as ascending, disjoint, apart runs.
pub fn ranks_to_runs(ranks: &[u16]) -> Vec<(u16, u16)> {
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut runs: Vec<(u16, u16)> = Vec::new();
    for r in sorted {
        match runs.last_mut() {
            Some((first, len)) if u32::from(*first) + u32::from(*len) == u32::from(r) => *len += 1,
            _ => runs.push((r, 1)),
        }
    }
    runs
}

/// The ranks `runs` stand for, in order.
pub fn runs_to_ranks(runs: &[(u16, u16)]) -> impl Iterator<Item = u16> + '_ {
    runs.iter()
        .flat_map(|(first, len)| u32::from(*first)..u32::from(*first) + u32::from(*len))
        .map(|r| r as u16)
}

/// A one-message Install's [`Msg`] encoding around its wraps, for the copies the
/// coordinator sends (each survivor's differs from the next only in the wraps it carries,
/// its own): the fields before and after the wraps are encoded once, and each copy is
/// those bytes with its wraps between. The bytes are [`Msg::encode`]'s for the copy as a
/// [`Msg::InstallInView`].
pub struct InstallCopies {
    /// The message kind and the Install's fields up to its key delivery's kind byte.
    head: Vec<u8>,
    /// The fields after the wraps, and the signature.
    tail: Vec<u8>,
}

impl InstallCopies {
    /// `None` unless `install`'s key delivery is `Wrapped`.
    pub fn new(install: &Install) -> Option<InstallCopies> {
        let KeyDelivery::Wrapped(_) = install.key else {
            return None;
        };
        let (mut head, mut tail) = (Vec::new(), Vec::new());
        let mut w = Writer::new(&mut head);
        w.u8(MSG_INSTALL_IN_VIEW).u64(install.view.seq);
        put_install_change(&mut w, install);
        put_key_delivery(&mut w, &KeyDelivery::Wrapped(Vec::new()), false);
        let mut w = Writer::new(&mut tail);
        put_install_tail(&mut w, install);
        w.u8(install.signature.len() as u8)
            .bytes(&install.signature);
        Some(InstallCopies { head, tail })
    }

    /// Appends the encoding of [`Msg::InstallInView`] of the Install with `wraps` as its
    /// wraps.
    pub fn encode(&self, wraps: &[(u16, KeyWrap)], out: &mut Vec<u8>) {
        out.reserve(self.head.len() + 2 + wraps.len() * (3 + WRAP_LEN) + self.tail.len());
        out.extend_from_slice(&self.head);
        put_key_wraps(&mut Writer::new(out), wraps);
        out.extend_from_slice(&self.tail);
    }
}

/// The name of the [`Msg`] variant whose type byte is `t`, if any.
pub fn msg_type_name(t: u8) -> Option<&'static str> {
    Some(match t {
        1 => "Heartbeat",
        2 => "Unreliable",
        3 => "Submit",
        4 => "Ordered",
        5 => "Nak",
        6 => "Flush",
        7 => "FlushOk",
        8 => "Install",
        9 => "InstallAck",
        10 => "Leave",
        11 => "RekeyRequest",
        12 => "Orders",
        13 => "InstallChunk",
        16 => "Report",
        17 => "Orphaned",
        18 => "Probe",
        19 => "ProbeAck",
        20 => "FlushOks",
        21 => "InstallAcks",
        22 => "LeftOut",
        23 => "OrderedRun",
        24 => "InstallInView",
        _ => return None,
    })
}

/// [`Msg::Install`]'s kind byte.
const MSG_INSTALL: u8 = 8;

/// [`Msg::InstallInView`]'s kind byte.
const MSG_INSTALL_IN_VIEW: u8 = 24;

fn put_install(w: &mut Writer<'_>, i: &Install) {
    put_install_fields(w, i, true);
    w.u8(i.signature.len() as u8).bytes(&i.signature);
}

fn put_install_fields(w: &mut Writer<'_>, i: &Install, with_wraps: bool) {
    put_install_head(w, i);
    put_key_delivery(w, &i.key, with_wraps);
    put_install_tail(w, i);
}

/// An Install's fields before its key delivery.
fn put_install_head(w: &mut Writer<'_>, i: &Install) {
    put_view_id(w, &i.view);
    put_view_id(w, &i.base);
    put_install_change(w, i);
}

/// An Install's fields after its view ids and before its key delivery.
fn put_install_change(w: &mut Writer<'_>, i: &Install) {
    w.u16(i.count);
    w.u16(i.left.len() as u16);
    for r in &i.left {
        w.u16(*r);
    }
    w.u16(i.joined.len() as u16);
    for j in &i.joined {
        put_member(w, &j.member);
        w.u64(j.next_seq).u64(j.incarnation);
    }
    w.bytes(&i.digest);
    w.u16(i.next_seqs.len() as u16);
    for s in &i.next_seqs {
        w.u64(*s);
    }
    w.u64(i.key_epoch).u64(i.final_order);
}

/// An Install's key delivery (without the wraps that are not signed when `with_wraps` is
/// false).
fn put_key_delivery(w: &mut Writer<'_>, key: &KeyDelivery, with_wraps: bool) {
    match key {
        KeyDelivery::Same => {
            w.u8(0);
        }
        KeyDelivery::Wrapped(wraps) => {
            w.u8(1);
            if with_wraps {
                put_key_wraps(w, wraps);
            }
        }
        KeyDelivery::Tree(fp) => {
            w.u8(2).bytes(fp);
        }
        KeyDelivery::Lkh(d) => {
            // The wraps are signed (identity keys); the sealed paths are not.
            w.u8(3).u8(d.degree).u8(d.depth);
            w.u16(d.wraps.len() as u16);
            for x in &d.wraps {
                w.u8(x.target.level)
                    .u32(x.target.index)
                    .u8(x.child)
                    .bytes(&x.sealed);
            }
            if with_wraps {
                w.u16(d.paths.len() as u16);
                for (rank, p) in &d.paths {
                    w.u16(*rank).u16(p.len() as u16).bytes(p);
                }
            }
        }
    }
}

/// The wraps of a `Wrapped` key delivery.
fn put_key_wraps(w: &mut Writer<'_>, wraps: &[(u16, KeyWrap)]) {
    w.u16(wraps.len() as u16);
    for (rank, wrap) in wraps {
        w.u16(*rank).u8(WRAP_LEN as u8).bytes(wrap);
    }
}

/// An Install's fields after its key delivery (the signature apart).
fn put_install_tail(w: &mut Writer<'_>, i: &Install) {
    match &i.merge_into {
        None => {
            w.u8(0);
        }
        Some(addr) => {
            w.u8(1);
            put_addr(w, addr);
        }
    }
    w.u16(i.removed.len() as u16);
    for (rank, why) in &i.removed {
        w.u16(*rank).u8(reason_code(*why));
    }
}

fn get_install(r: &mut Reader<'_>) -> Option<Install> {
    let view = get_view_id(r).ok()?;
    let base = get_view_id(r).ok()?;
    get_install_rest(r, view, base)
}

/// An Install's fields after its two view ids.
fn get_install_rest(r: &mut Reader<'_>, view: ViewId, base: ViewId) -> Option<Install> {
    let count = r.u16().ok()?;
    if count == 0 || usize::from(count) > MAX_MEMBERS {
        return None;
    }
    // Ascending, so that ranks follow by counting (`Install::survivor_rank`).
    let left = get_ascending_ranks(r)?;
    let n = get_count(r, usize::from(count))?;
    let mut joined = Vec::with_capacity(n);
    for _ in 0..n {
        let member = get_member(r)?;
        let next_seq = r.u64().ok()?;
        let incarnation = r.u64().ok()?;
        joined.push(Joined {
            member,
            next_seq,
            incarnation,
        });
    }
    let digest = r.array().ok()?;
    let n = get_count(r, usize::from(count))?;
    if n != 0 && n != usize::from(count) {
        return None;
    }
    let mut next_seqs = Vec::with_capacity(n);
    for _ in 0..n {
        next_seqs.push(r.u64().ok()?);
    }
    let key_epoch = r.u64().ok()?;
    let final_order = r.u64().ok()?;
    let key = match r.u8().ok()? {
        0 => KeyDelivery::Same,
        1 => {
            let n = get_count(r, usize::from(count))?;
            let mut wraps = Vec::with_capacity(n);
            for _ in 0..n {
                let rank = r.u16().ok()?;
                if rank >= count {
                    return None;
                }
                if usize::from(r.u8().ok()?) != WRAP_LEN {
                    return None;
                }
                wraps.push((rank, r.array().ok()?));
            }
            KeyDelivery::Wrapped(wraps)
        }
        2 => KeyDelivery::Tree(r.array().ok()?),
        3 => KeyDelivery::Lkh(Box::new(get_lkh(r, usize::from(count))?)),
        _ => return None,
    };
    let merge_into = match r.u8().ok()? {
        0 => None,
        1 => Some(get_addr(r)?),
        _ => return None,
    };
    // Ranks of `left`, ascending: one encoding, and at most as many as left.
    let n = get_count(r, left.len())?;
    let mut removed: Vec<(u16, RemovalReason)> = Vec::with_capacity(n);
    for _ in 0..n {
        let rank = r.u16().ok()?;
        let why = reason_from(r.u8().ok()?)?;
        if removed.last().is_some_and(|(l, _)| *l >= rank) || left.binary_search(&rank).is_err() {
            return None;
        }
        removed.push((rank, why));
    }
    let n = r.u8().ok()? as usize;
    let signature = r.bytes(n).ok()?.to_vec();
    Some(Install {
        view,
        base,
        count,
        left,
        joined,
        digest,
        next_seqs,
        key_epoch,
        final_order,
        key,
        merge_into,
        removed,
        signature,
    })
}

/// An LKH delivery: degree 2 to 64, depth 1 to 32, each wrap's target inside the tree
/// (level 1 to depth, a child position below the degree), each path for a rank of the view.
fn get_lkh(r: &mut Reader<'_>, members: usize) -> Option<LkhDelivery> {
    let degree = r.u8().ok()?;
    let depth = r.u8().ok()?;
    if !(2..=MAX_DEGREE).contains(&usize::from(degree)) || depth == 0 || depth > MAX_DEPTH {
        return None;
    }
    let n = get_count(r, MAX_LKH_WRAPS)?;
    let mut wraps = Vec::with_capacity(n.min(r.remaining() / WRAP_WIRE_LEN + 1));
    for _ in 0..n {
        let level = r.u8().ok()?;
        let index = r.u32().ok()?;
        let child = r.u8().ok()?;
        let sealed: [u8; SEALED_LEN] = r.array().ok()?;
        if level == 0 || level > depth || child >= degree {
            return None;
        }
        wraps.push(Wrap {
            target: NodeId { level, index },
            child,
            sealed,
        });
    }
    if !wraps.is_sorted_by_key(|w| (w.target, w.child)) {
        return None;
    }
    let count = get_count(r, members)?;
    let mut paths = Vec::with_capacity(count);
    for _ in 0..count {
        let rank = r.u16().ok()?;
        let len = usize::from(r.u16().ok()?);
        if usize::from(rank) >= members || len > MAX_LKH_PATH {
            return None;
        }
        paths.push((rank, r.bytes(len).ok()?.to_vec()));
    }
    Some(LkhDelivery {
        degree,
        depth,
        wraps,
        paths,
    })
}

impl Msg {
    /// Appends the encoding to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer::new(out);
        match self {
            Msg::Heartbeat {
                delivered,
                ordered,
                stable,
                load,
                failures,
            } => {
                w.u8(1)
                    .u64(*delivered)
                    .u64(*ordered)
                    .u64(*stable)
                    .u8(*load)
                    .u64(*failures);
            }
            Msg::Unreliable { seq, data } => {
                w.u8(2).u64(*seq).bytes(data);
            }
            Msg::Submit { seq, data } => {
                w.u8(3).u64(*seq).bytes(data);
            }
            Msg::Ordered {
                order,
                sender,
                seq,
                data,
            } => {
                w.u8(4).u64(*order).u16(*sender).u64(*seq).bytes(data);
            }
            Msg::Nak { from, to } => {
                w.u8(5).u64(*from).u64(*to);
            }
            Msg::OrderedRun { first, entries } => {
                w.u8(23).u64(*first).u16(entries.len() as u16);
                for (sender, seq, data) in entries {
                    w.u16(*sender).u64(*seq);
                    put_bytes32(&mut w, data);
                }
            }
            Msg::Flush {
                proposal,
                survivors,
            } => {
                w.u8(6);
                put_view_ref(&mut w, proposal);
                put_survivors(&mut w, survivors);
            }
            Msg::FlushOk {
                proposal,
                delivered,
                next_seq,
                pending,
            } => {
                w.u8(7);
                put_view_ref(&mut w, proposal);
                w.u64(*delivered).u64(*next_seq).u16(pending.len() as u16);
                for (seq, data) in pending {
                    w.u64(*seq);
                    put_bytes32(&mut w, data);
                }
            }
            Msg::Install(install) => {
                w.u8(MSG_INSTALL);
                put_install(&mut w, install);
            }
            Msg::InstallInView(install) => {
                w.u8(MSG_INSTALL_IN_VIEW).u64(install.view.seq);
                put_install_change(&mut w, install);
                put_key_delivery(&mut w, &install.key, true);
                put_install_tail(&mut w, install);
                w.u8(install.signature.len() as u8)
                    .bytes(&install.signature);
            }
            Msg::InstallAck => {
                w.u8(9);
            }
            Msg::Leave => {
                w.u8(10);
            }
            Msg::RekeyRequest => {
                w.u8(11);
            }
            Msg::Orders { first, entries } => {
                w.u8(12).u64(*first).u16(entries.len() as u16);
                for (sender, seq) in entries {
                    w.u16(*sender).u64(*seq);
                }
            }
            Msg::InstallChunk {
                view,
                index,
                total,
                data,
            } => {
                w.u8(13);
                put_view_id(&mut w, view);
                w.u16(*index).u16(*total).bytes(data);
            }
            Msg::Report {
                delivered,
                holder,
                load,
                failures,
                suspects,
            } => {
                w.u8(16)
                    .u64(*delivered)
                    .u16(*holder)
                    .u8(*load)
                    .u64(*failures)
                    .u16(suspects.len() as u16);
                for s in suspects {
                    w.u16(*s);
                }
            }
            Msg::Orphaned { parent } => {
                w.u8(17).u16(*parent);
            }
            Msg::Probe => {
                w.u8(18);
            }
            Msg::ProbeAck => {
                w.u8(19);
            }
            Msg::FlushOks {
                proposal,
                delivered,
                holder,
                answered,
                next_seqs,
                pending,
            } => {
                w.u8(20);
                put_view_ref(&mut w, proposal);
                w.u64(*delivered).u16(*holder);
                put_runs(&mut w, answered);
                w.u16(next_seqs.len() as u16);
                for (rank, seq) in next_seqs {
                    w.u16(*rank).u64(*seq);
                }
                w.u16(pending.len() as u16);
                for (rank, seq, data) in pending {
                    w.u16(*rank).u64(*seq);
                    put_bytes32(&mut w, data);
                }
            }
            Msg::InstallAcks { view, acked } => {
                w.u8(21);
                put_view_ref(&mut w, view);
                put_runs(&mut w, acked);
            }
            Msg::LeftOut {
                view,
                base,
                kept,
                rejoined,
                signature,
            } => {
                w.u8(22);
                put_left_out_fields(&mut w, view, base, kept, rejoined);
                w.u8(signature.len() as u8).bytes(signature);
            }
        }
    }

    /// Parses a message; `None` if malformed (including trailing bytes where the layout has
    /// no open-ended field).
    pub fn decode(bytes: &[u8]) -> Option<Msg> {
        let mut r = Reader::new(bytes);
        let msg = match r.u8().ok()? {
            1 => Msg::Heartbeat {
                delivered: r.u64().ok()?,
                ordered: r.u64().ok()?,
                stable: r.u64().ok()?,
                load: r.u8().ok()?,
                failures: r.u64().ok()?,
            },
            2 => Msg::Unreliable {
                seq: r.u64().ok()?,
                data: r.rest().to_vec(),
            },
            3 => Msg::Submit {
                seq: r.u64().ok()?,
                data: r.rest().to_vec(),
            },
            4 => Msg::Ordered {
                order: r.u64().ok()?,
                sender: r.u16().ok()?,
                seq: r.u64().ok()?,
                data: r.rest().to_vec(),
            },
            5 => {
                let from = r.u64().ok()?;
                let to = r.u64().ok()?;
                if to <= from {
                    return None;
                }
                Msg::Nak { from, to }
            }
            6 => {
                let proposal = get_view_ref(&mut r)?;
                let survivors = get_survivors(&mut r)?;
                Msg::Flush {
                    proposal,
                    survivors,
                }
            }
            7 => {
                let proposal = get_view_ref(&mut r)?;
                let delivered = r.u64().ok()?;
                let next_seq = r.u64().ok()?;
                let n = get_count(&mut r, MAX_PENDING)?;
                let mut pending = Vec::with_capacity(n);
                for _ in 0..n {
                    let seq = r.u64().ok()?;
                    pending.push((seq, get_bytes32(&mut r)?));
                }
                Msg::FlushOk {
                    proposal,
                    delivered,
                    next_seq,
                    pending,
                }
            }
            8 => Msg::Install(Box::new(get_install(&mut r)?)),
            MSG_INSTALL_IN_VIEW => {
                let view = ViewId {
                    seq: r.u64().ok()?,
                    coordinator: MemberId::from_bytes([0; 32]),
                };
                let base = ViewId {
                    seq: 0,
                    coordinator: MemberId::from_bytes([0; 32]),
                };
                Msg::InstallInView(Box::new(get_install_rest(&mut r, view, base)?))
            }
            9 => Msg::InstallAck,
            10 => Msg::Leave,
            11 => Msg::RekeyRequest,
            12 => {
                let first = r.u64().ok()?;
                let n = get_count(&mut r, MAX_ORDERS)?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    entries.push((r.u16().ok()?, r.u64().ok()?));
                }
                Msg::Orders { first, entries }
            }
            13 => {
                let view = get_view_id(&mut r).ok()?;
                let index = r.u16().ok()?;
                let total = r.u16().ok()?;
                let data = r.rest().to_vec();
                if index >= total || usize::from(total) > MAX_PARTS || data.len() > MAX_PART_LEN {
                    return None;
                }
                Msg::InstallChunk {
                    view,
                    index,
                    total,
                    data,
                }
            }
            16 => {
                let delivered = r.u64().ok()?;
                let holder = r.u16().ok()?;
                let load = r.u8().ok()?;
                let failures = r.u64().ok()?;
                let n = get_count(&mut r, MAX_SUSPECTS)?;
                let mut suspects = Vec::with_capacity(n);
                for _ in 0..n {
                    suspects.push(r.u16().ok()?);
                }
                Msg::Report {
                    delivered,
                    holder,
                    load,
                    failures,
                    suspects,
                }
            }
            17 => Msg::Orphaned {
                parent: r.u16().ok()?,
            },
            18 => Msg::Probe,
            19 => Msg::ProbeAck,
            20 => {
                let proposal = get_view_ref(&mut r)?;
                let delivered = r.u64().ok()?;
                let holder = r.u16().ok()?;
                let answered = get_runs(&mut r)?;
                let n = get_count(&mut r, MAX_MEMBERS)?;
                let mut next_seqs = Vec::with_capacity(n);
                for _ in 0..n {
                    next_seqs.push((r.u16().ok()?, r.u64().ok()?));
                }
                let n = get_count(&mut r, MAX_PENDING)?;
                let mut pending = Vec::with_capacity(n);
                for _ in 0..n {
                    let rank = r.u16().ok()?;
                    let seq = r.u64().ok()?;
                    pending.push((rank, seq, get_bytes32(&mut r)?));
                }
                Msg::FlushOks {
                    proposal,
                    delivered,
                    holder,
                    answered,
                    next_seqs,
                    pending,
                }
            }
            23 => {
                let first = r.u64().ok()?;
                let n = get_count(&mut r, MAX_PENDING)?;
                if n == 0 || first.checked_add(n as u64).is_none() {
                    return None;
                }
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    let sender = r.u16().ok()?;
                    let seq = r.u64().ok()?;
                    entries.push((sender, seq, get_bytes32(&mut r)?));
                }
                Msg::OrderedRun { first, entries }
            }
            21 => Msg::InstallAcks {
                view: get_view_ref(&mut r)?,
                acked: get_runs(&mut r)?,
            },
            22 => {
                let view = get_view_id(&mut r).ok()?;
                let base = get_view_id(&mut r).ok()?;
                let n = get_count(&mut r, MAX_KEPT_BYTES)?;
                let kept = r.bytes(n).ok()?.to_vec();
                let rejoined = get_ascending_ranks(&mut r)?;
                let n = r.u8().ok()? as usize;
                let signature = r.bytes(n).ok()?.to_vec();
                Msg::LeftOut {
                    view,
                    base,
                    kept,
                    rejoined,
                    signature,
                }
            }
            _ => return None,
        };
        r.is_empty().then_some(msg)
    }
}

impl PairMsg {
    /// Appends the encoding (version byte first) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer::new(out);
        w.u8(GROUP_VERSION);
        match self {
            PairMsg::JoinRequest {
                group,
                incarnation,
                next_seq,
                key_proof,
            } => {
                w.u8(1)
                    .u8(group.len() as u8)
                    .bytes(group.as_bytes())
                    .u64(*incarnation)
                    .u64(*next_seq);
                match key_proof {
                    None => w.u8(0),
                    Some(p) => w.u8(1).bytes(p),
                };
            }
            PairMsg::Redirect { leader } => {
                w.u8(2);
                put_addr(&mut w, leader);
            }
            PairMsg::NotInGroup => {
                w.u8(3);
            }
            PairMsg::Welcome {
                install,
                key,
                roster,
            } => {
                w.u8(4);
                put_install(&mut w, install);
                w.u8(key.len() as u8).bytes(key);
                put_bytes32(&mut w, roster);
            }
            PairMsg::KeyShare {
                proposal,
                key_epoch,
                key,
                below,
                degree,
            } => {
                w.u8(5);
                put_view_id(&mut w, proposal);
                w.u64(*key_epoch).u8(key.len() as u8).bytes(key);
                w.u16(below.0).u16(below.1);
                w.u16(*degree);
            }
            PairMsg::Ping => {
                w.u8(7);
            }
            PairMsg::Grant {
                view,
                token,
                members,
            } => {
                w.u8(12);
                put_view_id(&mut w, view);
                w.u8(token.len() as u8).bytes(token);
                w.u16(members.len() as u16);
                for m in members {
                    put_addr(&mut w, m);
                }
            }
            PairMsg::Present { view, token } => {
                w.u8(13);
                put_view_id(&mut w, view);
                w.u8(token.len() as u8).bytes(token);
            }
            PairMsg::Removed { view, reason } => {
                w.u8(11);
                put_view_id(&mut w, view);
                w.u8(reason_code(*reason));
            }
            PairMsg::Ticket {
                nonce,
                key_epoch,
                key,
            } => {
                w.u8(10)
                    .bytes(nonce)
                    .u64(*key_epoch)
                    .u8(key.len() as u8)
                    .bytes(key);
            }
            PairMsg::KeyAck { proposal, holders } => {
                w.u8(6);
                put_view_id(&mut w, proposal);
                put_runs(&mut w, holders);
            }
            PairMsg::Part {
                view,
                what,
                index,
                total,
                data,
            } => {
                w.u8(16);
                put_view_id(&mut w, view);
                w.u8(*what).u16(*index).u16(*total).bytes(data);
            }
            PairMsg::ListRequest { view, from } => {
                w.u8(17);
                put_view_id(&mut w, view);
                w.u16(*from);
            }
        }
    }

    /// Parses a pair message; `None` if malformed or of another version.
    pub fn decode(bytes: &[u8]) -> Option<PairMsg> {
        let mut r = Reader::new(bytes);
        if r.u8().ok()? != GROUP_VERSION {
            return None;
        }
        let msg = match r.u8().ok()? {
            1 => {
                let n = r.u8().ok()? as usize;
                let group = String::from_utf8(r.bytes(n).ok()?.to_vec()).ok()?;
                let incarnation = r.u64().ok()?;
                let next_seq = r.u64().ok()?;
                let key_proof = match r.u8().ok()? {
                    0 => None,
                    1 => Some(r.array().ok()?),
                    _ => return None,
                };
                PairMsg::JoinRequest {
                    group,
                    incarnation,
                    next_seq,
                    key_proof,
                }
            }
            2 => PairMsg::Redirect {
                leader: get_addr(&mut r)?,
            },
            3 => PairMsg::NotInGroup,
            4 => {
                let install = Box::new(get_install(&mut r)?);
                let n = r.u8().ok()? as usize;
                let key = Zeroizing::new(r.bytes(n).ok()?.to_vec());
                let roster = get_bytes32(&mut r)?;
                PairMsg::Welcome {
                    install,
                    key,
                    roster,
                }
            }
            5 => {
                let proposal = get_view_id(&mut r).ok()?;
                let key_epoch = r.u64().ok()?;
                let n = r.u8().ok()? as usize;
                let key = Zeroizing::new(r.bytes(n).ok()?.to_vec());
                let below = (r.u16().ok()?, r.u16().ok()?);
                if u32::from(below.0) + u32::from(below.1) > MAX_MEMBERS as u32 {
                    return None;
                }
                PairMsg::KeyShare {
                    proposal,
                    key_epoch,
                    key,
                    below,
                    degree: r.u16().ok()?,
                }
            }
            6 => {
                let proposal = get_view_id(&mut r).ok()?;
                let holders = get_runs(&mut r)?;
                PairMsg::KeyAck { proposal, holders }
            }
            7 => PairMsg::Ping,
            12 => {
                let view = get_view_id(&mut r).ok()?;
                let n = r.u8().ok()? as usize;
                let token = r.bytes(n).ok()?.to_vec();
                let count = get_count(&mut r, MAX_MEMBERS)?;
                let mut members = Vec::with_capacity(count);
                for _ in 0..count {
                    members.push(get_addr(&mut r)?);
                }
                PairMsg::Grant {
                    view,
                    token,
                    members,
                }
            }
            13 => {
                let view = get_view_id(&mut r).ok()?;
                let n = r.u8().ok()? as usize;
                PairMsg::Present {
                    view,
                    token: r.bytes(n).ok()?.to_vec(),
                }
            }
            11 => PairMsg::Removed {
                view: get_view_id(&mut r).ok()?,
                reason: reason_from(r.u8().ok()?)?,
            },
            16 => {
                let view = get_view_id(&mut r).ok()?;
                let what = r.u8().ok()?;
                let index = r.u16().ok()?;
                let total = r.u16().ok()?;
                let data = r.rest().to_vec();
                let bad = !matches!(what, PART_WELCOME | PART_LIST | PART_GRANT)
                    || index >= total
                    || usize::from(total) > MAX_PARTS
                    || data.len() > MAX_PART_LEN;
                if bad {
                    return None;
                }
                PairMsg::Part {
                    view,
                    what,
                    index,
                    total,
                    data,
                }
            }
            17 => PairMsg::ListRequest {
                view: get_view_id(&mut r).ok()?,
                from: r.u16().ok()?,
            },
            10 => {
                let nonce = r.array().ok()?;
                let key_epoch = r.u64().ok()?;
                let n = r.u8().ok()? as usize;
                PairMsg::Ticket {
                    nonce,
                    key_epoch,
                    key: Zeroizing::new(r.bytes(n).ok()?.to_vec()),
                }
            }
            _ => return None,
        };
        r.is_empty().then_some(msg)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code

    use super::*;

    /// The LeftOut bitmap keeps exactly the ranks not left, for sizes on and off a byte
    /// boundary, and only bitmaps of the right length with no stray bits fit.
    #[test]
    fn kept_bits_mark_exactly_the_ranks_kept() {
        for n in [1usize, 7, 8, 9, 16, 1000, MAX_MEMBERS] {
            let left: Vec<u16> = (0..n as u16)
                .filter(|r| r % 3 == 1 || *r == n as u16 - 1)
                .collect();
            let bits = kept_bits(n, &left);
            assert!(kept_bits_fit(&bits, n), "n = {n}");
            for r in 0..n as u16 {
                assert_eq!(
                    is_kept(&bits, r),
                    left.binary_search(&r).is_err(),
                    "n = {n}, rank {r}"
                );
            }
            assert!(!is_kept(&bits, n as u16));
            assert!(!kept_bits_fit(&bits, n + 8), "n = {n}");
            if n % 8 != 0 {
                let mut stray = kept_bits(n, &[]);
                *stray.last_mut().unwrap() |= 0x80;
                assert!(!kept_bits_fit(&stray, n), "n = {n}");
            }
        }
        assert!(kept_bits_fit(&[], 0));
    }

    fn view(seq: u64, c: u8) -> ViewId {
        ViewId {
            seq,
            coordinator: MemberId::from_bytes([c; 32]),
        }
    }

    /// The copies a coordinator encodes around their wraps are the bytes of each copy
    /// encoded whole, for wraps of one rank, several, none, with and without a merge target,
    /// joiners, removals and a signature; and each decodes to that copy.
    #[test]
    fn install_copies_are_each_copy_encoded_whole() {
        let member = |b: u8| Member {
            id: MemberId::from_bytes([b; 32]),
            addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, b)), 4000 + u16::from(b)),
        };
        let wraps: Vec<(u16, KeyWrap)> = (1u16..9)
            .map(|r| (r, [r as u8; WRAP_LEN]))
            .chain([(4, [0xee; WRAP_LEN])])
            .collect::<Vec<_>>();
        let mut sorted = wraps.clone();
        sorted.sort_by_key(|(r, _)| *r);
        for case in 0..4u8 {
            let install = Install {
                view: view(9, 1),
                base: view(8, 1),
                count: 9,
                left: if case % 2 == 0 { vec![3] } else { Vec::new() },
                joined: if case >= 2 {
                    vec![Joined {
                        member: member(7),
                        next_seq: 5,
                        incarnation: 6,
                    }]
                } else {
                    Vec::new()
                },
                digest: [case; 32],
                next_seqs: if case == 1 { vec![7; 9] } else { Vec::new() },
                key_epoch: 12,
                final_order: 34,
                key: KeyDelivery::Wrapped(sorted.clone()),
                merge_into: (case == 3).then(|| member(9).addr),
                removed: if case % 2 == 0 {
                    vec![(3, RemovalReason::Left)]
                } else {
                    Vec::new()
                },
                signature: vec![0x5a; 64 * usize::from(case % 2)],
            };
            let copies = InstallCopies::new(&install).expect("wrapped");
            for own in [&sorted[..0], &sorted[..1], &sorted[3..5], &sorted[..]] {
                let mut copy = install.clone();
                copy.key = KeyDelivery::Wrapped(own.to_vec());
                let mut whole = Vec::new();
                Msg::InstallInView(Box::new(copy.clone())).encode(&mut whole);
                let mut built = vec![0xab];
                copies.encode(own, &mut built);
                assert_eq!(&built[1..], &whole[..], "case {case}, {} wraps", own.len());
                let Some(Msg::InstallInView(mut decoded)) = Msg::decode(&whole) else {
                    panic!("case {case}: not an Install in its view");
                };
                assert_eq!(decoded.view.seq, copy.view.seq);
                decoded.in_view(copy.base, copy.view.coordinator);
                assert_eq!(*decoded, copy);
            }
        }
        let mut same = Install {
            key: KeyDelivery::Same,
            ..plain_install()
        };
        assert!(InstallCopies::new(&same).is_none());
        same.key = KeyDelivery::Tree([1; 8]);
        assert!(InstallCopies::new(&same).is_none());
    }

    /// A wrap of another length than `WRAP_LEN` fails the whole Install's decoding.
    /// The roster encoded entry by entry on the stack is the field-by-field encoding
    /// (`put_member`, then the incarnation), for IPv4 and IPv6 members, into a buffer that
    /// held a longer roster before; and it decodes back.
    #[test]
    fn a_roster_is_its_members_field_by_field_and_decodes_back() {
        let members: Vec<Member> = (0u8..5)
            .map(|b| Member {
                id: MemberId::from_bytes([b; 32]),
                addr: if b % 2 == 0 {
                    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, b)), 4000 + u16::from(b))
                } else {
                    SocketAddr::new(
                        IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(b))),
                        u16::MAX - u16::from(b),
                    )
                },
            })
            .collect();
        let incarnations: Vec<u64> = (0..5).map(|i| u64::MAX - i).collect();
        let mut expected = Vec::new();
        let mut w = Writer::new(&mut expected);
        w.u16(5);
        for (m, inc) in members.iter().zip(&incarnations) {
            put_member(&mut w, m);
            w.u64(*inc);
        }
        let mut out = vec![0xaa; 4096];
        encode_roster_into(&members, &incarnations, &mut out);
        assert_eq!(out, expected);
        assert_eq!(encode_roster(&members, &incarnations), expected);
        assert_eq!(decode_roster(&out), Some((members, incarnations)));
    }

    /// A Flush's survivors encode the same whether they come ascending (walked as they
    /// are) or in any order with repeats (sorted first), and decode ascending.
    #[test]
    fn a_flush_encodes_its_survivors_in_any_order_alike() {
        let flush = |survivors: Vec<u16>| {
            let mut out = Vec::new();
            Msg::Flush {
                proposal: ViewRef {
                    seq: 3,
                    coordinator: 2,
                },
                survivors,
            }
            .encode(&mut out);
            out
        };
        let ascending = flush(vec![0, 1, 3, 4, 7, 8, 9]);
        assert_eq!(ascending, flush(vec![9, 3, 0, 8, 1, 4, 7, 3, 9]));
        match Msg::decode(&ascending) {
            Some(Msg::Flush { survivors, .. }) => assert_eq!(survivors, vec![0, 1, 3, 4, 7, 8, 9]),
            _ => panic!("a Flush did not decode"),
        }
        // Nobody, and one member: no ranks left out below the highest survivor.
        for s in [vec![], vec![0], vec![5]] {
            match Msg::decode(&flush(s.clone())) {
                Some(Msg::Flush { survivors, .. }) => assert_eq!(survivors, s),
                _ => panic!("a Flush did not decode"),
            }
        }
    }

    #[test]
    fn a_wrap_of_another_length_is_malformed() {
        let install = Install {
            key: KeyDelivery::Wrapped(vec![(1, [7; WRAP_LEN])]),
            ..plain_install()
        };
        let mut bytes = Vec::new();
        Msg::Install(Box::new(install)).encode(&mut bytes);
        assert!(Msg::decode(&bytes).is_some());
        let at = bytes
            .windows(3 + WRAP_LEN)
            .position(|w| w[..3] == [0, 1, WRAP_LEN as u8])
            .expect("the wrap");
        for len in [0u8, 47, 49] {
            let mut bad = bytes.clone();
            bad[at + 2] = len;
            assert_eq!(Msg::decode(&bad), None, "len {len}");
        }
    }

    fn plain_install() -> Install {
        Install {
            view: view(2, 1),
            base: view(1, 1),
            count: 3,
            left: Vec::new(),
            joined: Vec::new(),
            digest: [0; 32],
            next_seqs: Vec::new(),
            key_epoch: 1,
            final_order: 0,
            key: KeyDelivery::Same,
            merge_into: None,
            removed: Vec::new(),
            signature: Vec::new(),
        }
    }
}
