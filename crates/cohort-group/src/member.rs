//! The group member state machine: membership, the sequencer, the flush that makes view
//! changes virtually synchronous, and key installation. See the crate README for the
//! protocol walk-through.
//!
//! ```text
//!  app: send / rekey / leave                         poll_event: View, Deliver, Rekeyed...
//!        │                                                   ^
//!        v                                                   │
//!  ┌──────────────── GroupMember ─────────────────────────────┴──────────┐
//!  │ reliable: pending ─Submit─> leader (sequencer) ─Ordered─> all: log │
//!  │           ─> deliver in order;  gaps ─Nak─> leader                 │
//!  │ unreliable: ─Unreliable─> every member                             │
//!  │ membership: heartbeats; suspicion; Flush ─> FlushOk ─> Install     │
//!  │ keys: ViewKeys per view (gears), GroupKey per epoch, PairTable     │
//!  └──────┬───────────────────────────────────────────────┬────────────┘
//!         │ protected group packets (gears, view key)       │ pair channel (joins,
//!         v                                                 v  key shares)
//!                                 UDP
//! ```

use crate::channels::Pairs;
use crate::config::{AuthMode, ConfigError, ConfigField, GroupConfig, Protection, RekeyMethod};
use crate::event::{Channel, Drop, DropCounters, GroupEvent, RemovalReason, SendError, Status};
use crate::exchange::{self, Gossip, LocalId, Parsed, GOSSIP_KIND};
use crate::id::{Member, MemberId, View, ViewId};
use crate::kdc_pair::{KdcCredentials, KdcPairTable};
use crate::keys::{self, GearPlan, GroupKey, ViewKeys, GROUP_KEY_LEN};
use crate::pair::{PairEvent, PairTable};
use crate::wire::{Install, KeyDelivery, Msg, PairMsg};
use cohort_channel::identity::Identity;
use cohort_core::{Machine, Timestamp, Transmit};
use cohort_crypto::{ct_eq, CryptoProvider, Secret};
use cohort_gears::controller::{Controller, ControllerConfig, Observation, ReceiverFeedback};
use cohort_gears::{DropReason, GearId, PACKET_VERSION};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;
use zeroize::{Zeroize, Zeroizing};

/// Most ordered positions in flight beyond what every member acknowledged (see
/// `flow_window`). Members acknowledge every quarter of it.
const FLOW_WINDOW: u64 = 256;

/// Most members a view admits: an Install lists every member in about 55 bytes, and must
/// fit one datagram (wrapped keys beyond about 600 members go in per-member copies).
pub const MAX_VIEW_MEMBERS: usize = 1024;

/// Most NAKed positions answered per NAK.
const NAK_BATCH: u64 = 64;

/// A reliable message with its place in the total order.
#[derive(Clone, Debug)]
struct OrderedMsg {
    sender: u16,
    seq: u64,
    data: Vec<u8>,
}

/// An own reliable message not yet delivered.
struct Pending {
    seq: u64,
    data: Vec<u8>,
    sent_at: Option<Timestamp>,
}

/// A submission waiting at the sequencer: the payload, and the packet as it came when it
/// can be relayed to the members unchanged.
type Submission = (Vec<u8>, Option<Vec<u8>>);

/// The leader's sequencer state for the current view.
struct Sequencer {
    next_order: u64,
    /// Per rank: the next message number expected from that sender.
    expected: Vec<u64>,
    /// Per rank: submissions not yet ordered (the payload, and the packet as it came when
    /// it can be relayed).
    early: Vec<BTreeMap<u64, Submission>>,
    /// Per rank: positions delivered there, from heartbeats.
    acked: Vec<u64>,
    /// Per rank: last authenticated packet.
    heard: Vec<Timestamp>,
    /// Per rank: latest load report (0-255) and failure count.
    loads: Vec<(u8, u64)>,
    /// The sender whose turn it is to have a message ordered.
    turn: usize,
    /// Since when the backlog has held ordering back.
    stalled_since: Option<Timestamp>,
    /// Positions given since the last `Orders` message: (sender rank, message number).
    tokens: Vec<(u16, u64)>,
}

/// A view change this member is taking part in (it answered the coordinator).
struct Flushing {
    proposal: ViewId,
    coordinator: u16,
    /// The members the coordinator expects to continue: the only ones whose tree key
    /// shares are taken (a member being removed still holds the old keys).
    survivors: Vec<MemberId>,
    /// The Install, once it arrived, waiting for the positions it needs.
    install: Option<Box<Install>>,
    last_nak: Option<Timestamp>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    /// Waiting for FlushOk from every survivor.
    Collect,
    /// Fetching positions up to `target` from the survivor at rank `from`.
    Fetch { target: u64, from: u16 },
    /// Waiting for pair channels to every new member (one-message rekey).
    Pairing,
    /// Waiting for the tree's acknowledgements.
    Tree,
}

/// What a flush answer carried.
struct FlushAnswer {
    delivered: u64,
    next_seq: u64,
    pending: Vec<(u64, Vec<u8>)>,
}

/// What a view change is to do: the input to `start_coordinating`.
struct Change {
    /// Ranks (in the current view) expected to continue.
    survivors: Vec<u16>,
    /// Members to let in: (member, next message number, incarnation).
    joiners: Vec<(Member, u64, u64)>,
    /// Members to leave out, and why.
    removed: Vec<(MemberId, RemovalReason)>,
    /// Whether the next view gets a fresh key.
    rekey: bool,
    /// When the change was first wanted (rekey time is measured from here).
    started: Timestamp,
    /// Dissolve into the component led there instead of installing a view.
    merge_into: Option<SocketAddr>,
    /// Exchange: install this key (another component's, from a ticket) instead of a fresh
    /// one, with the leader that sent it and where it is.
    exchange: Option<(GroupKey, MemberId, SocketAddr)>,
}

/// A view change this member coordinates.
struct Coordinator {
    proposal: ViewId,
    survivors: Vec<u16>,
    joiners: Vec<(Member, u64, u64)>,
    removed: Vec<(MemberId, RemovalReason)>,
    answers: BTreeMap<u16, FlushAnswer>,
    phase: Phase,
    rekey: bool,
    new_key: Option<GroupKey>,
    tree_holders: BTreeSet<MemberId>,
    /// Dissolve into the component whose leader is there.
    merge_into: Option<SocketAddr>,
    /// Exchange: the key to install (taken into `new_key` by the key phase) and its sender.
    exchange: Option<GroupKey>,
    exchange_from: Option<(MemberId, SocketAddr)>,
    started: Timestamp,
    deadline: Timestamp,
    resend_at: Timestamp,
    final_order: u64,
}

/// An installed view's sending side after the coordinator installed it: Install messages
/// are resent until acknowledged.
struct Announce {
    view: ViewId,
    install: Box<Install>,
    welcome_key: Option<Zeroizing<Vec<u8>>>,
    /// (member, is a joiner) not yet acknowledged.
    unacked: Vec<(Member, bool)>,
    resend_at: Timestamp,
    until: Timestamp,
}

/// A previous view kept for its grace window: its keys, members and log answer late NAKs
/// and accept late unreliable traffic.
struct OldView {
    view: View,
    keys: ViewKeys,
    log: BTreeMap<u64, OrderedMsg>,
    expires: Timestamp,
}

/// Joining: asking contacts until a Welcome arrives.
struct Joining {
    contacts: Vec<SocketAddr>,
    started: Timestamp,
    next_try: Timestamp,
    /// Peers that said they are not in a group, by id.
    not_in_group: BTreeSet<MemberId>,
    /// Whether anyone answered at all.
    answered: bool,
    /// Contacts that answered since the last attempt; the others' pair channels are
    /// dropped before the next one (the far end may have forgotten them).
    replied: BTreeSet<SocketAddr>,
    attempts: u32,
    /// A member in a group pointed at its leader: a group exists, do not found another.
    redirected: bool,
}

impl Joining {
    /// Asking `contacts`, starting now.
    fn new(contacts: Vec<SocketAddr>, now: Timestamp) -> Self {
        Joining {
            contacts,
            started: now,
            next_try: now,
            not_in_group: BTreeSet::new(),
            answered: false,
            replied: BTreeSet::new(),
            attempts: 0,
            redirected: false,
        }
    }
}

/// How a member proves who it is: the choice between the two authentication modes.
pub enum Credentials {
    /// An Ed25519 identity ([`AuthMode::IdentityKeys`]).
    Identity(Identity),
    /// A principal's long-term key and its KDC ([`AuthMode::Kdc`]).
    Kdc(KdcCredentials),
}

impl From<Identity> for Credentials {
    fn from(identity: Identity) -> Self {
        Credentials::Identity(identity)
    }
}

impl From<KdcCredentials> for Credentials {
    fn from(credentials: KdcCredentials) -> Self {
        Credentials::Kdc(credentials)
    }
}

/// One member of a secure group: see the crate README for the protocol.
pub struct GroupMember {
    provider: CryptoProvider,
    /// Signs the Installs this member coordinates.
    /// The Ed25519 identity (None in KDC mode).
    identity: Option<Identity>,
    id: MemberId,
    addr: SocketAddr,
    config: GroupConfig,
    plan: GearPlan,
    controller: Option<Controller>,
    rng: ChaCha20Rng,
    pairs: Pairs,

    joining: Option<Joining>,
    /// Every member seen in a view, and the contacts given to `start`: where a leader looks
    /// for other components of the group.
    known: BTreeMap<MemberId, SocketAddr>,
    contacts: Vec<SocketAddr>,
    /// When the leader gossips its Id next.
    next_gossip: Timestamp,
    /// Exchange: this leader's latest Ids (at most two), to open the tickets answering them.
    local_ids: Vec<LocalId>,
    /// Signature checks left for gossip until `gossip_budget_at` plus a suspicion timeout.
    gossip_budget: u32,
    gossip_budget_at: Timestamp,
    /// When gossip from (or for) an address was last answered or forwarded.
    gossip_answered: HashMap<SocketAddr, Timestamp>,
    /// When a secure Id from an address was last answered.
    secure_answered: HashMap<SocketAddr, Timestamp>,
    /// A ticket's key waiting for the view change in progress to end (appendix 12.1).
    held_exchange: Option<(GroupKey, MemberId, SocketAddr)>,
    /// Joiners that proved they hold the current group key: (member, incarnation).
    key_holders: BTreeSet<(MemberId, u64)>,
    /// Fingerprints of keys this member took through an Exchange.
    exchanged: Vec<[u8; 8]>,
    /// After an Exchange: the other leader, told at the next gossip that the keys match.
    exchange_reply_to: Option<SocketAddr>,
    /// KDC mode, at the leader: joiners granted a token (LSGC message 4), by principal:
    /// where, their next message number and incarnation.
    granted: BTreeMap<MemberId, (SocketAddr, u64, u64)>,
    /// KDC mode: joiners that presented a valid token (message 5): (member, incarnation).
    presented: BTreeSet<(MemberId, u64)>,
    /// KDC mode: valid tokens presented to this member.
    tokens_checked: u64,
    /// KDC mode: the key unwrapped while checking an Install, for installing it.
    unwrapped: Option<(ViewId, GroupKey)>,
    /// Principals seen leaving a view of their own accord. No Exchange runs with them (a
    /// ticket would hand them the key drawn to keep them out): they come back by joining,
    /// which draws a fresh key. (Members removed as untrusted get nothing either, by trust;
    /// members removed as suspected or lagging did not choose to go, and a partitioned or
    /// slow member merges back by Exchange like any component.) At most 4096.
    departed: BTreeSet<MemberId>,
    incarnation: u64,
    /// Incarnations of the view's members, by rank.
    incarnations: Vec<u64>,
    expelled: bool,
    view: Option<View>,
    rank: u16,
    keys: Option<ViewKeys>,
    old_views: Vec<OldView>,
    group_key: Option<GroupKey>,
    key_ledger: Vec<(u64, [u8; 8])>,
    last_rekey: Timestamp,

    log: BTreeMap<u64, OrderedMsg>,
    delivered: u64,
    stable: u64,
    last_ack_sent: u64,
    last_nak: Option<Timestamp>,
    delivered_at_leader_heartbeat: u64,
    next_reliable: u64,
    next_unreliable: u64,
    pending: VecDeque<Pending>,
    delivered_reliable: u64,
    delivered_unreliable: u64,

    sequencer: Option<Sequencer>,
    /// Relayed submissions waiting for their position: (sender rank, number) -> payload.
    relayed: HashMap<(u16, u64), Vec<u8>>,
    /// Positions whose relayed submission has not arrived yet.
    awaiting: HashMap<(u16, u64), u64>,
    /// Per rank: the highest message number delivered from that sender in this view.
    delivered_seq: Vec<Option<u64>>,
    /// One past the highest position this member knows was given (from Orders, Ordered
    /// or the leader's heartbeat): what it must NAK for while it has not delivered it.
    known_end: u64,
    leader_heard: Timestamp,
    next_heartbeat: Timestamp,
    highest_proposal: Option<ViewId>,
    flushing: Option<Flushing>,
    coordinator: Option<Coordinator>,
    announce: Option<Announce>,
    /// A key received down the rekey tree, for the proposal it belongs to.
    tree_key: Option<(ViewId, GroupKey)>,
    /// A tree node's children still to acknowledge, and who acknowledged.
    tree_wait: Option<TreeWait>,
    /// The last acknowledgement sent up the tree, repeated if the share comes again.
    tree_acked: Option<(ViewId, Vec<MemberId>)>,
    change_wanted: Vec<(MemberId, RemovalReason)>,
    joiners_wanted: Vec<(Member, u64, u64)>,
    rekey_wanted: Option<Timestamp>,
    leaving: Option<Timestamp>,

    load: f32,
    out: VecDeque<(SocketAddr, Vec<u8>)>,
    events: VecDeque<GroupEvent>,
    counters: DropCounters,
    insecure_reported: HashMap<SocketAddr, Timestamp>,
    scratch: Vec<u8>,
}

/// A tree node waiting for its children's key acknowledgements.
struct TreeWait {
    proposal: ViewId,
    parent: SocketAddr,
    parent_id: MemberId,
    children: Vec<MemberId>,
    holders: BTreeSet<MemberId>,
    deadline: Timestamp,
}

impl GroupMember {
    /// A member proving itself with `credentials`, reached at `addr`. `seed` seeds its
    /// randomness (keys, nonces): take it from the OS in production, from the simulator in
    /// tests. The credentials must match `config.auth`: an Ed25519 identity for identity
    /// keys, KDC credentials (principal, long-term key, KDC) for KDC mode, where no
    /// public-key operation runs anywhere.
    pub fn new(
        provider: CryptoProvider,
        credentials: impl Into<Credentials>,
        addr: SocketAddr,
        config: GroupConfig,
        seed: [u8; 32],
    ) -> Result<Self, ConfigError> {
        let mut rng = ChaCha20Rng::from_seed(seed);
        let mut pair_seed = [0u8; 32];
        rng.fill_bytes(&mut pair_seed);
        match (credentials.into(), config.auth) {
            (Credentials::Identity(identity), AuthMode::IdentityKeys) => {
                let id = MemberId(identity.public());
                let pairs = Pairs::Identity(Box::new(PairTable::new(
                    provider,
                    identity.clone(),
                    &config.group,
                    config.trust.clone(),
                    pair_seed,
                )));
                Self::assemble(provider, Some(identity), id, pairs, addr, config, rng)
            }
            (Credentials::Kdc(credentials), AuthMode::Kdc) => {
                let id = MemberId::from_principal(&credentials.name);
                let pairs = Pairs::Kdc(Box::new(KdcPairTable::new(
                    provider,
                    credentials,
                    &config.group,
                    config.trust.clone(),
                    config.trust_any_registered,
                    pair_seed,
                )));
                Self::assemble(provider, None, id, pairs, addr, config, rng)
            }
            (Credentials::Identity(_), _) => Err(ConfigError::new(
                ConfigField::Auth,
                "a KDC-mode member needs KDC credentials, not an identity",
            )),
            (Credentials::Kdc(_), _) => Err(ConfigError::new(
                ConfigField::Auth,
                "KDC credentials need a KDC-mode config",
            )),
        }
    }

    fn assemble(
        provider: CryptoProvider,
        identity: Option<Identity>,
        id: MemberId,
        pairs: Pairs,
        addr: SocketAddr,
        config: GroupConfig,
        rng: ChaCha20Rng,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        let plan = GearPlan::new(&config.protection);
        let controller = match &config.protection {
            Protection::Authenticate {
                gears, floor_bits, ..
            } if gears.len() > 1 => Some(
                Controller::new(ControllerConfig::new(*floor_bits, plan.gears))
                    .map_err(|e| ConfigError::new(ConfigField::Protection, e.to_string()))?,
            ),
            _ => None,
        };
        Ok(GroupMember {
            provider,
            identity,
            id,
            addr,
            config,
            plan,
            controller,
            rng,
            pairs,
            joining: None,
            known: BTreeMap::new(),
            contacts: Vec::new(),
            next_gossip: Timestamp::ZERO,
            local_ids: Vec::new(),
            gossip_budget: 0,
            gossip_budget_at: Timestamp::ZERO,
            gossip_answered: HashMap::new(),
            secure_answered: HashMap::new(),
            held_exchange: None,
            key_holders: BTreeSet::new(),
            exchanged: Vec::new(),
            exchange_reply_to: None,
            granted: BTreeMap::new(),
            presented: BTreeSet::new(),
            tokens_checked: 0,
            unwrapped: None,
            departed: BTreeSet::new(),
            incarnation: 0,
            incarnations: Vec::new(),
            expelled: false,
            view: None,
            rank: 0,
            keys: None,
            old_views: Vec::new(),
            group_key: None,
            key_ledger: Vec::new(),
            last_rekey: Timestamp::ZERO,
            log: BTreeMap::new(),
            delivered: 0,
            stable: 0,
            last_ack_sent: 0,
            last_nak: None,
            delivered_at_leader_heartbeat: 0,
            next_reliable: 0,
            next_unreliable: 0,
            pending: VecDeque::new(),
            delivered_reliable: 0,
            delivered_unreliable: 0,
            sequencer: None,
            relayed: HashMap::new(),
            awaiting: HashMap::new(),
            delivered_seq: Vec::new(),
            known_end: 0,
            leader_heard: Timestamp::ZERO,
            next_heartbeat: Timestamp::ZERO,
            highest_proposal: None,
            flushing: None,
            coordinator: None,
            announce: None,
            tree_key: None,
            tree_wait: None,
            tree_acked: None,
            change_wanted: Vec::new(),
            joiners_wanted: Vec::new(),
            rekey_wanted: None,
            leaving: None,
            load: 0.0,
            out: VecDeque::new(),
            events: VecDeque::new(),
            counters: DropCounters::default(),
            insecure_reported: HashMap::new(),
            scratch: Vec::new(),
        })
    }

    /// Starts: joins through `contacts`, or founds the group alone when there are none. With
    /// contacts, it founds the group only when every contact that answers is outside any
    /// group and ranks after it (by key bytes), or when nobody answers for three suspicion
    /// timeouts.
    pub fn start(&mut self, now: Timestamp, contacts: &[SocketAddr]) {
        self.expelled = false;
        self.leaving = None;
        self.incarnation = self.rng.next_u64();
        let contacts: Vec<SocketAddr> = contacts
            .iter()
            .copied()
            .filter(|a| *a != self.addr)
            .collect();
        for c in &contacts {
            if !self.contacts.contains(c) {
                self.contacts.push(*c);
            }
        }
        if contacts.is_empty() {
            self.found(now);
            return;
        }
        self.joining = Some(Joining::new(contacts, now));
        self.drive_join(now);
    }

    /// This member's id.
    pub fn id(&self) -> MemberId {
        self.id
    }

    /// The installed view.
    pub fn view(&self) -> Option<&View> {
        self.view.as_ref()
    }

    /// Sends `data` on `channel`; returns the message's per-sender number. During a view
    /// change reliable messages wait and are sent in the next view (Ensemble's "block").
    pub fn send(
        &mut self,
        now: Timestamp,
        channel: Channel,
        data: &[u8],
    ) -> Result<u64, SendError> {
        if data.len() > self.config.max_message_len {
            return Err(SendError::TooLong);
        }
        // A member that dissolved its component to merge into another keeps taking reliable
        // messages: they wait with its undelivered ones and go out in the view it joins.
        let merging = self.joining.is_some() && self.group_key.is_some();
        let reliable_ok = self.view.is_some() || (merging && channel == Channel::Reliable);
        if !reliable_ok || self.expelled {
            return Err(SendError::NotInGroup);
        }
        match channel {
            Channel::Unreliable => {
                let seq = self.next_unreliable;
                self.next_unreliable += 1;
                let view = self.view.as_ref().map(|v| v.id);
                let msg = Msg::Unreliable {
                    seq,
                    data: data.to_vec(),
                };
                self.broadcast(&msg);
                if let Some(view) = view {
                    self.delivered_unreliable += 1;
                    self.events.push_back(GroupEvent::Deliver {
                        channel: Channel::Unreliable,
                        sender: self.id,
                        view,
                        seq,
                        order: None,
                        data: data.to_vec(),
                    });
                }
                Ok(seq)
            }
            Channel::Reliable => {
                if self.pending.len() >= self.config.send_window {
                    return Err(SendError::WindowFull);
                }
                let seq = self.next_reliable;
                self.next_reliable += 1;
                self.pending.push_back(Pending {
                    seq,
                    data: data.to_vec(),
                    sent_at: None,
                });
                self.submit_pending(now);
                Ok(seq)
            }
        }
    }

    /// Asks for a fresh group key now (the leader runs the rekey).
    pub fn rekey(&mut self, now: Timestamp) {
        if self.is_leader() {
            self.rekey_wanted.get_or_insert(now);
            self.maybe_start_change(now);
        } else if let Some(leader) = self.view.as_ref().map(|v| v.leader().addr) {
            self.send_msg(leader, &Msg::RekeyRequest);
        }
    }

    /// Leaves the group: the leader installs a view without this member.
    pub fn leave(&mut self, now: Timestamp) {
        if self.view.is_none() {
            self.expelled = true;
            self.joining = None;
            self.events.push_back(GroupEvent::Expelled {
                reason: RemovalReason::Left,
            });
            return;
        }
        self.leaving = Some(now);
        if self.is_leader() {
            self.change_wanted.push((self.id, RemovalReason::Left));
            self.maybe_start_change(now);
        } else if let Some(leader) = self.view.as_ref().map(|v| v.leader().addr) {
            self.send_msg(leader, &Msg::Leave);
        }
    }

    /// Reports local CPU load (0.0 to 1.0) to the group's gear controllers.
    pub fn set_load(&mut self, load: f32) {
        if load.is_finite() {
            self.load = load.clamp(0.0, 1.0);
        }
    }

    /// A snapshot for `status`.
    pub fn status(&self) -> Status {
        Status {
            view: self.view.clone(),
            changing_view: self.flushing.is_some() || self.coordinator.is_some(),
            delivered_reliable: self.delivered_reliable,
            delivered_unreliable: self.delivered_unreliable,
            pending: self.pending.len(),
            gear: self.current_gear().name(),
            dropped: self.counters,
            key_fingerprint: self.key_fingerprint().map(hex::encode),
        }
    }

    /// Fingerprints of the keys this member took from another component's leader through an
    /// Exchange (it coordinated the empty view change that installed them).
    pub fn exchanged_keys(&self) -> &[[u8; 8]] {
        &self.exchanged
    }

    /// KDC mode: how many valid join tokens (LSGC message 5) were presented to this member.
    pub fn tokens_checked(&self) -> u64 {
        self.tokens_checked
    }

    /// Dropped packets by reason.
    pub fn counters(&self) -> &DropCounters {
        &self.counters
    }

    /// Fingerprints (epoch, first 8 bytes of a SHA-256 of the key) of every group key this
    /// member ever held: for checkers of who learned which key.
    pub fn key_ledger(&self) -> &[(u64, [u8; 8])] {
        &self.key_ledger
    }

    /// A one-line summary of the protocol state, for debugging tests.
    #[doc(hidden)]
    pub fn debug_state(&self) -> String {
        format!(
            "view {:?} rank {} joining {} flushing {:?} coordinating {:?} leader_heard {:?} pending {} delivered {}",
            self.view.as_ref().map(|v| v.id.to_string()),
            self.rank,
            self.joining.is_some(),
            self.flushing.as_ref().map(|f| (f.proposal.to_string(), f.coordinator, f.install.is_some())),
            self.coordinator.as_ref().map(|c| (c.proposal.to_string(), c.phase, c.survivors.clone(), c.answers.keys().copied().collect::<Vec<_>>())),
            self.leader_heard,
            self.pending.len(),
            self.delivered,
        )
    }

    /// The fingerprint of the key the current view uses, if any.
    pub fn key_fingerprint(&self) -> Option<[u8; 8]> {
        self.group_key
            .as_ref()
            .map(|k| k.fingerprint(&self.provider))
    }

    // ---------------------------------------------------------------- helpers

    fn is_leader(&self) -> bool {
        self.view.is_some() && self.rank == 0 && !self.expelled
    }

    fn others(&self) -> impl Iterator<Item = &Member> + '_ {
        let me = self.id;
        self.view
            .iter()
            .flat_map(|v| v.members.iter())
            .filter(move |m| m.id != me)
    }

    /// Most positions the sequencer lets run ahead of the stable point: half the backlog,
    /// and at most [`FLOW_WINDOW`], so that a burst fits the members' socket buffers.
    fn flow_window(&self) -> u64 {
        (self.config.backlog_limit as u64 / 2).clamp(1, FLOW_WINDOW)
    }

    fn current_gear(&self) -> GearId {
        match &self.controller {
            Some(c) => c.current(),
            None => self.plan.ladder[0],
        }
    }

    fn send_gears(&self) -> Vec<GearId> {
        let current = self.current_gear();
        let strongest = self.plan.ladder[0];
        if self.plan.dual_tags && current != strongest {
            vec![strongest, current]
        } else {
            vec![current]
        }
    }

    /// Protects `msg` under the current view's keys for the member at `to` (the body names
    /// the destination's rank, so a copy replayed to another member is refused).
    fn send_msg(&mut self, to: SocketAddr, msg: &Msg) {
        let dest = self
            .view
            .as_ref()
            .and_then(|v| v.members.iter().position(|m| m.addr == to))
            .map_or(BROADCAST, |r| r as u16);
        if let Some(packet) = self.seal(dest, msg) {
            self.out.push_back((to, packet));
        }
    }

    /// Protects `msg` once and sends the same packet to every other member: every receiver
    /// sees the same sequence number, so a copy replayed anywhere hits a replay window.
    fn broadcast(&mut self, msg: &Msg) {
        let Some(packet) = self.seal(BROADCAST, msg) else {
            return;
        };
        let others: Vec<SocketAddr> = self.others().map(|m| m.addr).collect();
        for addr in others {
            self.out.push_back((addr, packet.clone()));
        }
    }

    fn seal(&mut self, dest: u16, msg: &Msg) -> Option<Vec<u8>> {
        let gears = self.send_gears();
        let keys = self.keys.as_mut()?;
        seal_body(keys, &gears, dest, msg, &mut self.scratch)
    }

    /// As `send_msg`, under a kept old view's keys.
    fn send_msg_old(&mut self, view: ViewId, to: SocketAddr, msg: &Msg) {
        let gears = self.send_gears();
        let Some(old) = self.old_views.iter_mut().find(|o| o.view.id == view) else {
            return;
        };
        let dest = old
            .view
            .members
            .iter()
            .position(|m| m.addr == to)
            .map_or(BROADCAST, |r| r as u16);
        if let Some(packet) = seal_body(&mut old.keys, &gears, dest, msg, &mut self.scratch) {
            self.out.push_back((to, packet));
        }
    }

    fn send_pair(
        &mut self,
        now: Timestamp,
        to: SocketAddr,
        expect: Option<MemberId>,
        msg: &PairMsg,
    ) {
        let mut body = Zeroizing::new(Vec::new());
        msg.encode(&mut body);
        self.pairs.send(now, to, expect, &body);
    }

    fn member_at(&self, rank: u16) -> Option<Member> {
        self.view
            .as_ref()
            .and_then(|v| v.members.get(usize::from(rank)).copied())
    }

    fn record_key(&mut self, key: &GroupKey) {
        let entry = (key.epoch, key.fingerprint(&self.provider));
        if !self.key_ledger.contains(&entry) {
            self.key_ledger.push(entry);
        }
    }

    fn fresh_key(&mut self, epoch: u64) -> GroupKey {
        let mut secret = Secret::zeroed(GROUP_KEY_LEN);
        self.rng.fill_bytes(secret.expose_mut());
        GroupKey::new(epoch, secret)
    }

    fn next_proposal(&mut self) -> ViewId {
        let base = self.view.as_ref().map(|v| v.id.seq).unwrap_or(0);
        let seen = self.highest_proposal.map(|p| p.seq).unwrap_or(0);
        let id = ViewId {
            seq: base.max(seen) + 1,
            coordinator: self.id,
        };
        self.highest_proposal = Some(id);
        id
    }

    // ---------------------------------------------------------------- joining

    fn found(&mut self, now: Timestamp) {
        self.joining = None;
        let key = self.fresh_key(1);
        let view = View {
            id: self.next_proposal(),
            members: vec![Member {
                id: self.id,
                addr: self.addr,
            }],
            key_epoch: 1,
        };
        let install = Install {
            view: view.id,
            members: view.members.clone(),
            next_seqs: vec![self.pending.front().map_or(self.next_reliable, |p| p.seq)],
            incarnations: vec![self.incarnation],
            key_epoch: 1,
            final_order: 0,
            key: KeyDelivery::Same,
            merge_into: None,
            removed: Vec::new(),
            signature: Vec::new(),
        };
        self.install_view(now, &install, key, None);
    }

    fn drive_join(&mut self, now: Timestamp) {
        let Some(j) = self.joining.as_mut() else {
            return;
        };
        if now < j.next_try {
            return;
        }
        let waited = now.saturating_duration_since(j.started);
        let lowest = j.not_in_group.iter().all(|other| self.id < *other);
        // Founding needs answers from outside any group; a redirect means a group exists.
        let everyone_out =
            j.answered && !j.redirected && lowest && waited >= self.config.suspect_timeout;
        let nobody = !j.answered && waited >= self.config.suspect_timeout * 3;
        // Redirected to a leader that never lets us in (it or we do not trust the other,
        // which st-trust allows between members of one component): go on alone.
        let refused = waited >= self.config.suspect_timeout * 5;
        if everyone_out || nobody || refused {
            self.found(now);
            return;
        }
        j.next_try = now.saturating_add(self.config.flush_timeout);
        j.attempts += 1;
        let stale: Vec<SocketAddr> = if j.attempts > 1 {
            j.contacts
                .iter()
                .copied()
                .filter(|c| !j.replied.contains(c))
                .collect()
        } else {
            Vec::new()
        };
        j.replied.clear();
        let contacts = j.contacts.clone();
        for c in stale {
            self.pairs.forget(c);
        }
        // Own messages still pending (sent while the component dissolved) go first in the
        // new view.
        let next_seq = self.pending.front().map_or(self.next_reliable, |p| p.seq);
        let key_proof = self.group_key.as_ref().map(|k| {
            exchange::merge_proof(
                &self.provider,
                &self.config.group,
                k,
                &self.id,
                self.incarnation,
            )
        });
        let msg = PairMsg::JoinRequest {
            group: self.config.group.clone(),
            incarnation: self.incarnation,
            next_seq,
            key_proof,
        };
        for c in contacts {
            self.send_pair(now, c, None, &msg);
        }
    }

    fn handle_pair_msg(&mut self, now: Timestamp, peer: MemberId, addr: SocketAddr, data: &[u8]) {
        let Some(msg) = PairMsg::decode(data) else {
            self.counters.count(Drop::Malformed);
            return;
        };
        match msg {
            PairMsg::JoinRequest {
                group,
                incarnation,
                next_seq,
                key_proof,
            } => {
                if group != self.config.group {
                    self.counters.count(Drop::OtherGroup);
                    return;
                }
                self.on_join_request(now, peer, addr, incarnation, next_seq, key_proof);
            }
            PairMsg::Redirect { leader } => {
                if let Some(j) = self.joining.as_mut() {
                    j.answered = true;
                    j.redirected = true;
                    j.replied.insert(addr);
                    if !j.contacts.contains(&leader) && leader != self.addr {
                        j.contacts.push(leader);
                        j.next_try = now;
                    }
                }
            }
            PairMsg::NotInGroup => {
                if let Some(j) = self.joining.as_mut() {
                    j.answered = true;
                    j.replied.insert(addr);
                    j.not_in_group.insert(peer);
                }
            }
            PairMsg::Welcome { install, key } => self.on_welcome(now, peer, install, key),
            PairMsg::KeyShare {
                proposal,
                key_epoch,
                key,
                below,
                degree,
            } => self.on_key_share(now, peer, addr, proposal, key_epoch, key, below, degree),
            PairMsg::KeyAck { proposal, holders } => self.on_key_ack(now, peer, proposal, holders),
            PairMsg::Ping => {}
            PairMsg::Ticket {
                nonce,
                key_epoch,
                key,
            } => self.on_pair_ticket(now, peer, addr, nonce, key_epoch, &key),
            PairMsg::Grant {
                view,
                token,
                members,
            } => self.on_grant(now, peer, addr, view, token, members),
            PairMsg::Present { view, token } => self.on_present(now, peer, view, &token),
            PairMsg::Removed { view, reason } => {
                // From the coordinator of a newer view than ours: it left us out.
                let newer = self
                    .view
                    .as_ref()
                    .is_some_and(|v| view > v.id && view.coordinator == peer);
                if self.identity.is_some() || !newer {
                    self.counters.count(Drop::Unexpected);
                    return;
                }
                match reason {
                    _ if self.leaving.is_some() => self.leave_now(RemovalReason::Left),
                    RemovalReason::Lagged => self.leave_now(RemovalReason::Lagged),
                    // Suspected or untrusted while alive: our own suspicion timeout moves us
                    // on.
                    _ => {}
                }
            }
        }
    }

    fn on_join_request(
        &mut self,
        now: Timestamp,
        peer: MemberId,
        addr: SocketAddr,
        incarnation: u64,
        next_seq: u64,
        key_proof: Option<[u8; 16]>,
    ) {
        if !self.trusts(&peer) {
            self.counters.count(Drop::Untrusted);
            return;
        }
        let Some(view) = self.view.clone() else {
            if self.joining.is_some() {
                if let Some(j) = self.joining.as_mut() {
                    j.answered = true;
                    if !j.contacts.contains(&addr) {
                        j.contacts.push(addr);
                    }
                }
                self.send_pair(now, addr, Some(peer), &PairMsg::NotInGroup);
            }
            return;
        };
        if !self.is_leader() {
            let leader = view.leader().addr;
            self.send_pair(now, addr, Some(peer), &PairMsg::Redirect { leader });
            return;
        }
        if view.members.len() + self.joiners_wanted.len() >= MAX_VIEW_MEMBERS {
            self.counters.count(Drop::Unexpected); // full: see MAX_VIEW_MEMBERS
            return;
        }
        // Already welcomed into the current view at this address: the Welcome was lost.
        if let Some(a) = self.announce.as_ref() {
            if a.unacked
                .iter()
                .any(|(m, j)| *j && m.id == peer && m.addr == addr)
            {
                let whole_fits = fits_one_datagram(&a.install);
                let welcome = PairMsg::Welcome {
                    install: install_copy_for(&a.install, &peer, whole_fits),
                    key: a.welcome_key.clone().unwrap_or_default(),
                };
                self.send_pair(now, addr, Some(peer), &welcome);
                return;
            }
        }
        if let Some(r) = view.rank_of(&peer) {
            if self.incarnations.get(r) == Some(&incarnation) {
                // A late copy of a request already granted.
                return;
            }
            // A member asking to join again restarted: its old incarnation leaves the view
            // and the new one joins.
            if !self.change_wanted.iter().any(|(m, _)| *m == peer) {
                self.change_wanted.push((peer, RemovalReason::Suspected));
            }
        }
        if self.coordinator.as_ref().is_some_and(|c| {
            c.joiners
                .iter()
                .any(|(m, _, inc)| m.id == peer && *inc == incarnation)
        }) {
            return; // being let in right now
        }
        // A member of a component that dissolved into this one after an Exchange holds the
        // key already: it comes in without a rekey.
        if let (Some(proof), Some(key)) = (key_proof, self.group_key.as_ref()) {
            let want =
                exchange::merge_proof(&self.provider, &self.config.group, key, &peer, incarnation);
            if ct_eq(&want, &proof) {
                self.key_holders.insert((peer, incarnation));
            }
        }
        if self.identity.is_none() && !self.presented.contains(&(peer, incarnation)) {
            // KDC mode: LSGC message 4 first. The joiner presents the token (message 5)
            // and is let in when it does.
            self.grant(now, &view, peer, addr, next_seq, incarnation);
            return;
        }
        self.joiners_wanted.retain(|(m, _, _)| m.id != peer);
        self.joiners_wanted
            .push((Member { id: peer, addr }, next_seq, incarnation));
        self.maybe_start_change(now);
    }

    fn on_welcome(
        &mut self,
        now: Timestamp,
        peer: MemberId,
        install: Box<Install>,
        key: Zeroizing<Vec<u8>>,
    ) {
        if self.joining.is_none() {
            return; // not asking (any more): a late Welcome, or one after leave()
        }
        if install.view.coordinator != peer || key.len() != GROUP_KEY_LEN {
            self.counters.count(Drop::Unexpected);
            return;
        }
        // The pair channel authenticated the coordinator; with identity keys the Install
        // carries its signature too.
        if self.identity.is_some() && !self.install_is_signed(&install) {
            self.counters.count(Drop::AuthFailed);
            return;
        }
        let mine = install.members.iter().position(|m| m.id == self.id);
        if mine.and_then(|r| install.incarnations.get(r)) != Some(&self.incarnation) {
            // Not for us, or for an earlier incarnation of this member.
            self.counters.count(Drop::Unexpected);
            return;
        }
        self.joining = None;
        let key = GroupKey::new(install.key_epoch, Secret::from_slice(&key));
        self.install_view(now, &install, key, None);
        self.ack_install(&install);
    }

    // ---------------------------------------------------------------- receive path

    fn handle_group_packet(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        let Some((slot, _)) = keys::peek_header(data) else {
            self.counters.count(Drop::Malformed);
            return;
        };
        let mut packet = data.to_vec();
        let current = self.keys.as_ref().is_some_and(|k| k.slot() == slot);
        if current {
            let Some(keys) = self.keys.as_mut() else {
                return;
            };
            match keys.open(&mut packet) {
                Ok((rank, body)) => {
                    let my = self.rank;
                    let broadcast = packet[body.clone()].starts_with(&BROADCAST.to_be_bytes());
                    let Some(msg) = decode_for(&packet[body], my, &mut self.counters) else {
                        return;
                    };
                    // A submission addressed to everyone is relayed by the sequencer as it
                    // came, so it keeps the original bytes.
                    let raw = (broadcast && matches!(msg, Msg::Submit { .. })).then_some(data);
                    self.handle_msg(now, from, rank, msg, raw);
                }
                Err(e) => self.count_open_failure(now, from, e),
            }
            return;
        }
        if let Some(i) = self.old_views.iter().position(|o| o.keys.slot() == slot) {
            let result = self.old_views[i].keys.open(&mut packet);
            match result {
                Ok((rank, body)) => {
                    let Some(my) = self.old_views[i].view.rank_of(&self.id) else {
                        return;
                    };
                    let Some(msg) = decode_for(&packet[body], my as u16, &mut self.counters) else {
                        return;
                    };
                    self.handle_old_msg(now, i, rank, msg);
                }
                Err(e) => self.count_open_failure(now, from, e),
            }
            return;
        }
        self.counters.count(Drop::KeyNotHeld);
        self.maybe_insecure(now, from);
    }

    fn count_open_failure(&mut self, now: Timestamp, from: SocketAddr, e: DropReason) {
        match e {
            DropReason::Replayed | DropReason::TooOld => self.counters.count(Drop::Replayed),
            DropReason::AuthFailed => {
                self.counters.count(Drop::AuthFailed);
                self.maybe_insecure(now, from);
            }
            _ => self.counters.count(Drop::Malformed),
        }
    }

    /// Reports a packet under a key not held from an address outside the view (another
    /// component, perhaps), at most once per second per address.
    fn maybe_insecure(&mut self, now: Timestamp, from: SocketAddr) {
        if self
            .view
            .as_ref()
            .is_some_and(|v| v.members.iter().any(|m| m.addr == from))
        {
            return;
        }
        if self.insecure_reported.len() >= 1024 {
            // Bounded: forget addresses not reported within the last second; if the table is
            // still full (a flood from many addresses), report nothing new.
            self.insecure_reported
                .retain(|_, t| now.saturating_duration_since(*t) < Duration::from_secs(1));
            if self.insecure_reported.len() >= 1024 {
                return;
            }
        }
        let last = self.insecure_reported.get(&from).copied();
        if last.is_none_or(|t| now.saturating_duration_since(t) >= Duration::from_secs(1)) {
            self.insecure_reported.insert(from, now);
            self.events.push_back(GroupEvent::Insecure { from });
        }
    }

    fn handle_msg(
        &mut self,
        now: Timestamp,
        from: SocketAddr,
        rank: u16,
        msg: Msg,
        raw: Option<&[u8]>,
    ) {
        let Some(sender) = self.member_at(rank) else {
            self.counters.count(Drop::Unexpected);
            return;
        };
        if sender.id == self.id {
            // Our own keys: a reflected or replayed packet.
            self.counters.count(Drop::Unexpected);
            return;
        }
        let _ = from;
        if rank == 0 {
            self.leader_heard = now;
        }
        if let Some(f) = self.flushing.as_ref() {
            if f.coordinator == rank {
                self.leader_heard = now;
            }
        }
        if let Some(s) = self.sequencer.as_mut() {
            s.heard[usize::from(rank)] = now;
        }
        match msg {
            Msg::Heartbeat {
                delivered,
                ordered,
                stable,
                load,
                failures,
            } => self.on_heartbeat(now, rank, delivered, ordered, stable, load, failures),
            Msg::Unreliable { seq, data } => {
                if self.flushing.is_some() && self.coordinator.is_none() {
                    // Still delivered: the unreliable channel makes no view promise.
                }
                if let Some(view) = self.view.as_ref().map(|v| v.id) {
                    self.delivered_unreliable += 1;
                    self.events.push_back(GroupEvent::Deliver {
                        channel: Channel::Unreliable,
                        sender: sender.id,
                        view,
                        seq,
                        order: None,
                        data,
                    });
                }
            }
            Msg::Submit { seq, data } if self.sequencer.is_some() => {
                self.on_submit(now, rank, seq, data, raw.map(<[u8]>::to_vec))
            }
            Msg::Submit { seq, data } => self.on_relayed(now, rank, seq, data),
            Msg::Orders { first, entries } => self.on_orders(now, rank, first, entries),
            Msg::Ordered {
                order,
                sender: s,
                seq,
                data,
            } => self.on_ordered(now, rank, order, s, seq, data),
            Msg::Nak { from: lo, to } => self.on_nak(now, rank, lo, to),
            Msg::Flush {
                proposal,
                survivors,
            } => self.on_flush(now, rank, proposal, survivors),
            Msg::FlushOk {
                proposal,
                delivered,
                next_seq,
                pending,
            } => self.on_flush_ok(now, rank, proposal, delivered, next_seq, pending),
            Msg::Install(install) => self.on_install(now, rank, install),
            Msg::InstallAck => {
                if let Some(a) = self.announce.as_mut() {
                    a.unacked.retain(|(m, _)| m.id != sender.id);
                }
            }
            Msg::Leave => {
                if self.is_leader() {
                    if !self.change_wanted.iter().any(|(m, _)| *m == sender.id) {
                        self.change_wanted.push((sender.id, RemovalReason::Left));
                    }
                    self.maybe_start_change(now);
                }
            }
            Msg::RekeyRequest => {
                if self.is_leader() {
                    self.rekey_wanted.get_or_insert(now);
                    self.maybe_start_change(now);
                }
            }
        }
    }

    fn handle_old_msg(&mut self, now: Timestamp, i: usize, rank: u16, msg: Msg) {
        let view = self.old_views[i].view.clone();
        let Some(sender) = view.members.get(usize::from(rank)).copied() else {
            self.counters.count(Drop::Unexpected);
            return;
        };
        if sender.id == self.id {
            self.counters.count(Drop::Unexpected);
            return;
        }
        match msg {
            Msg::Nak { from: lo, to } => {
                // To the member's address, never the packet's source: no reflection.
                for msg in nak_answers(&self.old_views[i].log, lo, to) {
                    self.send_msg_old(view.id, sender.addr, &msg);
                }
            }
            Msg::Unreliable { seq, data } => {
                self.delivered_unreliable += 1;
                self.events.push_back(GroupEvent::Deliver {
                    channel: Channel::Unreliable,
                    sender: sender.id,
                    view: view.id,
                    seq,
                    order: None,
                    data,
                });
            }
            // A resent Install of the view we already have: the ack was lost.
            Msg::Install(install) if self.view.as_ref().is_some_and(|v| v.id == install.view) => {
                self.ack_install(&install);
            }
            Msg::Install(_) => {}
            Msg::Leave | Msg::RekeyRequest => {
                // Sent before the member saw the new view; it will ask again.
            }
            _ => {
                // Heartbeats, flushes and ordering of a finished view: ignore quietly.
            }
        }
        let _ = now;
    }

    // ---------------------------------------------------------------- reliable channel

    fn submit_pending(&mut self, now: Timestamp) {
        if self.flushing.is_some() || self.coordinator.is_some() || self.view.is_none() {
            return;
        }
        if self.is_leader() {
            let expected = self
                .sequencer
                .as_ref()
                .map_or(0, |s| s.expected[usize::from(self.rank)]);
            let due: Vec<(u64, Vec<u8>)> = self
                .pending
                .iter()
                .filter(|p| p.seq >= expected)
                .map(|p| (p.seq, p.data.clone()))
                .collect();
            let rank = self.rank;
            for (seq, data) in due {
                self.on_submit(now, rank, seq, data, None);
            }
            return;
        }
        let Some(leader) = self.view.as_ref().map(|v| v.leader().addr) else {
            return;
        };
        let resend = self.config.heartbeat_interval / 2;
        let due: Vec<(u64, Vec<u8>)> = self
            .pending
            .iter_mut()
            .filter(|p| {
                p.sent_at
                    .is_none_or(|t| now.saturating_duration_since(t) >= resend)
            })
            .map(|p| {
                p.sent_at = Some(now);
                (p.seq, p.data.clone())
            })
            .collect();
        for (seq, data) in due {
            // Addressed to everyone, sent to the leader: it relays these very bytes.
            if let Some(packet) = self.seal(BROADCAST, &Msg::Submit { seq, data }) {
                self.out.push_back((leader, packet));
            }
        }
    }

    fn on_submit(
        &mut self,
        now: Timestamp,
        rank: u16,
        seq: u64,
        data: Vec<u8>,
        raw: Option<Vec<u8>>,
    ) {
        if self.coordinator.is_some() || self.flushing.is_some() {
            return;
        }
        let window = self.config.send_window as u64;
        let Some(s) = self.sequencer.as_mut() else {
            self.counters.count(Drop::Unexpected);
            return;
        };
        let r = usize::from(rank);
        if seq < s.expected[r] || seq - s.expected[r] > window {
            return; // already ordered, or beyond the sender's window
        }
        s.early[r].entry(seq).or_insert((data, raw));
        self.drain_sequencer(now);
    }

    /// Orders queued submissions while the backlog has room: senders take turns, each
    /// sender's messages go in number order. When the backlog reaches half its limit the
    /// sequencer waits for acknowledgements (back-pressure on every sender, the leader
    /// included); a member that keeps it waiting too long is removed as lagging.
    fn drain_sequencer(&mut self, now: Timestamp) {
        // Nothing is ordered during a view change: the flush alone decides what the view
        // delivers (queued submissions come back as the senders' pending messages).
        if self.coordinator.is_some() || self.flushing.is_some() {
            return;
        }
        self.drain_sequencer_inner(now);
        self.flush_tokens();
    }

    /// Sends the positions given since the last call as one `Orders` message.
    fn flush_tokens(&mut self) {
        let Some(s) = self.sequencer.as_mut() else {
            return;
        };
        if s.tokens.is_empty() {
            return;
        }
        let entries = std::mem::take(&mut s.tokens);
        let first = s.next_order - entries.len() as u64;
        self.broadcast(&Msg::Orders { first, entries });
    }

    fn drain_sequencer_inner(&mut self, now: Timestamp) {
        let high = self.flow_window();
        loop {
            let stable = self.stable;
            let Some(s) = self.sequencer.as_mut() else {
                return;
            };
            let n = s.expected.len();
            let ready = (0..n)
                .map(|k| (s.turn + k) % n)
                .find(|r| s.early[*r].contains_key(&s.expected[*r]));
            let Some(r) = ready else {
                s.stalled_since = None;
                return;
            };
            if s.next_order.saturating_sub(stable) >= high {
                s.stalled_since.get_or_insert(now);
                return;
            }
            s.stalled_since = None;
            let seq = s.expected[r];
            let Some((data, raw)) = s.early[r].remove(&seq) else {
                return;
            };
            s.expected[r] += 1;
            s.turn = (r + 1) % n;
            self.order(now, r as u16, seq, data, raw);
        }
    }

    /// Sequencer: gives a message its position. The payload goes to everyone as the
    /// sender's own sealed packet (relayed unchanged; the leader seals its own messages the
    /// same way), the position in the next `Orders` message: one encryption per message, by
    /// its sender, and a small token per batch.
    fn order(
        &mut self,
        now: Timestamp,
        sender: u16,
        seq: u64,
        data: Vec<u8>,
        raw: Option<Vec<u8>>,
    ) {
        let Some(s) = self.sequencer.as_mut() else {
            return;
        };
        let order = s.next_order;
        s.next_order += 1;
        s.tokens.push((sender, seq));
        if s.tokens.len() >= crate::wire::MAX_ORDERS {
            self.flush_tokens();
        }
        let packet = match raw {
            Some(p) => Some(p),
            None if sender == self.rank => self.seal(
                BROADCAST,
                &Msg::Submit {
                    seq,
                    data: data.clone(),
                },
            ),
            None => None,
        };
        let sender_addr = self.member_at(sender).map(|m| m.addr);
        match packet {
            Some(packet) => {
                let others: Vec<SocketAddr> = self
                    .others()
                    .map(|m| m.addr)
                    .filter(|a| Some(*a) != sender_addr)
                    .collect();
                for addr in others {
                    self.out.push_back((addr, packet.clone()));
                }
            }
            None => {
                // Not relayable (addressed to the leader alone): members fetch it by Nak.
            }
        }
        self.log.insert(order, OrderedMsg { sender, seq, data });
        self.deliver_ready(now);
    }

    /// A member: a submission relayed by the sequencer; it waits for its position.
    fn on_relayed(&mut self, now: Timestamp, rank: u16, seq: u64, data: Vec<u8>) {
        if self.flushing.is_some() || self.coordinator.is_some() {
            return;
        }
        if let Some(order) = self.awaiting.remove(&(rank, seq)) {
            if order >= self.delivered {
                self.log.entry(order).or_insert(OrderedMsg {
                    sender: rank,
                    seq,
                    data,
                });
                self.deliver_ready(now);
            }
            return;
        }
        let stale = self
            .delivered_seq
            .get(usize::from(rank))
            .copied()
            .flatten()
            .is_some_and(|d| seq <= d);
        if stale {
            return; // already delivered (recovered by a NAK first)
        }
        if self.relayed.len() >= 4 * FLOW_WINDOW as usize {
            // Bounded. Entries pile up only when positions were recovered another way;
            // start afresh (anything still needed is fetched by NAK).
            self.relayed.clear();
        }
        self.relayed.insert((rank, seq), data);
    }

    /// A member: positions for relayed submissions (and its own).
    fn on_orders(&mut self, now: Timestamp, from_rank: u16, first: u64, entries: Vec<(u16, u64)>) {
        if from_rank != 0 || self.flushing.is_some() || self.coordinator.is_some() {
            self.counters.count(Drop::Unexpected);
            return;
        }
        let members = self.view.as_ref().map_or(0, |v| v.members.len());
        let limit = self.delivered + self.config.backlog_limit as u64;
        let count = entries.len() as u64;
        for (i, (sender, seq)) in entries.into_iter().enumerate() {
            let order = first.saturating_add(i as u64);
            if usize::from(sender) >= members {
                self.counters.count(Drop::Unexpected);
                continue;
            }
            if order < self.delivered || order >= limit || self.log.contains_key(&order) {
                continue;
            }
            let data = if sender == self.rank {
                self.pending
                    .iter()
                    .find(|p| p.seq == seq)
                    .map(|p| p.data.clone())
            } else {
                self.relayed.remove(&(sender, seq))
            };
            match data {
                Some(data) => {
                    self.log.insert(order, OrderedMsg { sender, seq, data });
                }
                None => {
                    if self.awaiting.len() >= 4 * FLOW_WINDOW as usize {
                        self.awaiting.clear();
                    }
                    self.awaiting.insert((sender, seq), order);
                }
            }
        }
        self.deliver_ready(now);
        let end = first.saturating_add(count);
        self.known_end = self.known_end.max(end);
        if self.delivered < end {
            self.nak_gap(now, Some(end));
        }
    }

    fn on_ordered(
        &mut self,
        now: Timestamp,
        from_rank: u16,
        order: u64,
        sender: u16,
        seq: u64,
        data: Vec<u8>,
    ) {
        // Accept ordering only from the sequencer, or during a flush from the coordinator
        // or from the survivor the coordinator is fetching from.
        let allowed = match (&self.flushing, &self.coordinator) {
            (_, Some(c)) => matches!(c.phase, Phase::Fetch { from, .. } if from == from_rank),
            (Some(f), None) => f.coordinator == from_rank,
            (None, None) => from_rank == 0,
        };
        if !allowed {
            self.counters.count(Drop::Unexpected);
            return;
        }
        let members = self.view.as_ref().map_or(0, |v| v.members.len());
        if usize::from(sender) >= members {
            self.counters.count(Drop::Unexpected);
            return;
        }
        if order < self.delivered || order >= self.delivered + self.config.backlog_limit as u64 {
            return;
        }
        self.log
            .entry(order)
            .or_insert(OrderedMsg { sender, seq, data });
        if self.flushing.is_some() || self.coordinator.is_some() {
            self.progress_flush(now);
            return;
        }
        self.deliver_ready(now);
        if self.log.range(self.delivered..).next().is_some() {
            self.nak_gap(now, None);
        }
    }

    /// Delivers contiguous positions from the log (not during a view change).
    fn deliver_ready(&mut self, now: Timestamp) {
        if self.flushing.is_some() || self.coordinator.is_some() {
            return;
        }
        self.deliver_up_to(u64::MAX);
        let _ = now;
        if self.delivered >= self.last_ack_sent + (self.flow_window() / 4).max(1) {
            self.send_heartbeat(now);
        }
    }

    fn deliver_up_to(&mut self, limit: u64) {
        let Some(view) = self.view.as_ref() else {
            return;
        };
        let view_id = view.id;
        while self.delivered < limit {
            let Some(m) = self.log.get(&self.delivered) else {
                break;
            };
            let Some(sender) = self
                .view
                .as_ref()
                .and_then(|v| v.members.get(usize::from(m.sender)))
            else {
                break;
            };
            let (sender_id, seq, data) = (sender.id, m.seq, m.data.clone());
            let rank = m.sender;
            if let Some(d) = self.delivered_seq.get_mut(usize::from(rank)) {
                *d = Some(seq);
            }
            self.relayed.remove(&(rank, seq));
            self.awaiting.remove(&(rank, seq));
            let order = self.delivered;
            self.delivered += 1;
            self.delivered_reliable += 1;
            if sender_id == self.id {
                while self.pending.front().is_some_and(|p| p.seq <= seq) {
                    self.pending.pop_front();
                }
            }
            self.events.push_back(GroupEvent::Deliver {
                channel: Channel::Reliable,
                sender: sender_id,
                view: view_id,
                seq,
                order: Some(order),
                data,
            });
        }
    }

    fn nak_gap(&mut self, now: Timestamp, known_end: Option<u64>) {
        if self.is_leader() {
            return;
        }
        let half = self.config.heartbeat_interval / 8;
        if self
            .last_nak
            .is_some_and(|t| now.saturating_duration_since(t) < half)
        {
            return;
        }
        let next_have = self.log.range(self.delivered..).next().map(|(o, _)| *o);
        let to = match (next_have, known_end) {
            (Some(a), _) => a,
            (None, Some(b)) => b,
            (None, None) => return,
        };
        if to <= self.delivered {
            return;
        }
        self.last_nak = Some(now);
        let Some(leader) = self.view.as_ref().map(|v| v.leader().addr) else {
            return;
        };
        let msg = Msg::Nak {
            from: self.delivered,
            to,
        };
        self.send_msg(leader, &msg);
    }

    fn on_nak(&mut self, _now: Timestamp, rank: u16, lo: u64, to: u64) {
        let Some(dest) = self.member_at(rank) else {
            return;
        };
        // A NAK below the stable point is stale (the member acknowledged more since): every
        // member's acknowledgement is at or above it. Lagging is detected by the backlog.
        for msg in nak_answers(&self.log, lo, to) {
            self.send_msg(dest.addr, &msg);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_heartbeat(
        &mut self,
        now: Timestamp,
        rank: u16,
        delivered: u64,
        ordered: u64,
        stable: u64,
        load: u8,
        failures: u64,
    ) {
        if let Some(s) = self.sequencer.as_mut() {
            let r = usize::from(rank);
            s.acked[r] = s.acked[r].max(delivered.min(s.next_order));
            s.loads[r] = (load, failures);
            let my = usize::from(self.rank);
            s.acked[my] = self.delivered;
            let stable = s.acked.iter().copied().min().unwrap_or(0);
            if stable > self.stable {
                self.stable = stable;
                self.log = self.log.split_off(&stable);
                self.drain_sequencer(now);
            }
            return;
        }
        if rank != 0 {
            return;
        }
        // From the leader.
        if self.flushing.is_none() && self.coordinator.is_none() {
            let stable = stable.min(self.delivered);
            if stable > self.stable {
                self.stable = stable;
                self.log = self.log.split_off(&stable);
            }
            if ordered > self.delivered && self.delivered == self.delivered_at_leader_heartbeat {
                self.known_end = self.known_end.max(ordered);
                self.nak_gap(now, Some(ordered));
            }
            self.delivered_at_leader_heartbeat = self.delivered;
        }
        self.observe_feedback(now, load, failures);
    }

    fn observe_feedback(&mut self, now: Timestamp, load: u8, failures: u64) {
        let local_failures = self.keys.as_ref().map_or(0, |k| k.failures());
        let local_load = self.load;
        if let Some(c) = self.controller.as_mut() {
            let _ = c.observe(&Observation {
                now,
                local_load,
                local_auth_failures: local_failures,
                receiver: Some(ReceiverFeedback {
                    load: f32::from(load) / 255.0,
                    auth_failures: failures,
                }),
            });
        }
    }

    /// Leader: when the backlog has held ordering back for a suspicion timeout, the members
    /// whose acknowledgements hold the stable point back are removed as lagging.
    fn check_lagging(&mut self, now: Timestamp) {
        let Some(s) = self.sequencer.as_ref() else {
            return;
        };
        let Some(since) = s.stalled_since else {
            return;
        };
        if now.saturating_duration_since(since) < self.config.suspect_timeout {
            return;
        }
        let my = usize::from(self.rank);
        let slowest = s
            .acked
            .iter()
            .enumerate()
            .filter(|(r, _)| *r != my)
            .map(|(_, a)| *a)
            .min()
            .unwrap_or(0);
        let lagging: Vec<MemberId> = s
            .acked
            .iter()
            .enumerate()
            .filter(|(r, a)| *r != my && **a == slowest && s.next_order > **a)
            .filter_map(|(r, _)| self.member_at(r as u16).map(|m| m.id))
            .collect();
        for id in lagging {
            if !self.change_wanted.iter().any(|(m, _)| *m == id) {
                self.change_wanted.push((id, RemovalReason::Lagged));
            }
        }
        self.maybe_start_change(now);
    }

    fn send_heartbeat(&mut self, now: Timestamp) {
        let load = (self.load * 255.0) as u8;
        let failures = self.keys.as_ref().map_or(0, |k| k.failures());
        if let Some(s) = self.sequencer.as_mut() {
            let my = usize::from(self.rank);
            s.acked[my] = self.delivered;
            let stable = s.acked.iter().copied().min().unwrap_or(0);
            if stable > self.stable {
                self.stable = stable;
                self.log = self.log.split_off(&stable);
            }
            let (max_load, sum_failures) = s.loads.iter().fold((0u8, 0u64), |(l, f), (ml, mf)| {
                (l.max(*ml), f.saturating_add(*mf))
            });
            let msg = Msg::Heartbeat {
                delivered: self.delivered,
                ordered: s.next_order,
                stable,
                load: max_load.max(load),
                failures: sum_failures,
            };
            self.broadcast(&msg);
            self.observe_feedback(now, max_load, sum_failures);
        } else if let Some(view) = self.view.as_ref() {
            let to = match self.flushing.as_ref() {
                Some(f) => view.members.get(usize::from(f.coordinator)).map(|m| m.addr),
                None => Some(view.leader().addr),
            };
            let msg = Msg::Heartbeat {
                delivered: self.delivered,
                ordered: 0,
                stable: 0,
                load,
                failures,
            };
            if let Some(to) = to {
                self.send_msg(to, &msg);
            }
        }
        self.last_ack_sent = self.delivered;
    }

    // ---------------------------------------------------------------- view changes

    /// Leader: starts a view change if one is wanted and none is running.
    fn maybe_start_change(&mut self, now: Timestamp) {
        if !self.is_leader() || self.coordinator.is_some() || self.flushing.is_some() {
            return;
        }
        // An Exchange goes first: an empty view change that installs the other component's
        // key. What else is wanted follows in the next change.
        if let Some((key, from, from_addr)) = self.held_exchange.take() {
            let Some(view) = self.view.as_ref() else {
                return;
            };
            let survivors: Vec<u16> = (0..view.members.len() as u16).collect();
            self.start_coordinating(
                now,
                Change {
                    survivors,
                    joiners: Vec::new(),
                    removed: Vec::new(),
                    rekey: true,
                    started: now,
                    merge_into: None,
                    exchange: Some((key, from, from_addr)),
                },
            );
            return;
        }
        let period_due = self
            .config
            .rekey_policy
            .period
            .is_some_and(|p| now.saturating_duration_since(self.last_rekey) >= p);
        if let Some(view) = self.view.as_ref() {
            let incarnations = &self.incarnations;
            self.joiners_wanted.retain(|(m, _, inc)| {
                view.rank_of(&m.id)
                    .is_none_or(|r| incarnations.get(r) != Some(inc))
            });
        }
        if self.change_wanted.is_empty()
            && self.joiners_wanted.is_empty()
            && self.rekey_wanted.is_none()
            && !period_due
        {
            return;
        }
        let Some(view) = self.view.clone() else {
            return;
        };
        let removed = std::mem::take(&mut self.change_wanted);
        let mut joiners = std::mem::take(&mut self.joiners_wanted);
        // Requests from members already in the view with the same incarnation are stale.
        joiners.retain(|(m, _, inc)| {
            view.rank_of(&m.id)
                .is_none_or(|r| self.incarnations.get(r) != Some(inc))
        });
        let survivors: Vec<u16> = (0..view.members.len() as u16)
            .filter(|r| {
                !removed
                    .iter()
                    .any(|(m, _)| view.members[usize::from(*r)].id == *m)
            })
            .collect();
        // Joiners that proved they hold the key (a component merging after an Exchange) do
        // not call for a fresh one.
        let membership_changes = !removed.is_empty()
            || joiners
                .iter()
                .any(|(m, _, inc)| !self.key_holders.contains(&(m.id, *inc)));
        // A member removed because it is no longer trusted never keeps the key, whatever
        // the policy (Ensemble 6.1).
        let untrusted = removed
            .iter()
            .any(|(_, why)| *why == RemovalReason::Untrusted);
        let rekey = self.rekey_wanted.is_some()
            || period_due
            || untrusted
            || (membership_changes && self.config.rekey_policy.on_membership_change);
        let started = self.rekey_wanted.take().unwrap_or(now);
        self.start_coordinating(
            now,
            Change {
                survivors,
                joiners,
                removed,
                rekey,
                started,
                merge_into: None,
                exchange: None,
            },
        );
    }

    fn start_coordinating(&mut self, now: Timestamp, change: Change) {
        let Change {
            mut survivors,
            mut joiners,
            mut removed,
            mut rekey,
            started,
            merge_into,
            exchange,
        } = change;
        // KDC mode: every view gets a fresh key (LSGC), which also authenticates the
        // Install to each member through its wrap.
        if self.config.auth == AuthMode::Kdc {
            rekey = true;
        }
        // Ensemble 6.1: the coordinator keeps only members it trusts, and a view that loses
        // one for that reason gets a fresh key.
        if let Some(view) = self.view.as_ref() {
            let before = survivors.len();
            let mut out = Vec::new();
            survivors.retain(|r| match view.members.get(usize::from(*r)) {
                Some(m) if !self.trusts(&m.id) => {
                    out.push(m.id);
                    false
                }
                _ => true,
            });
            for id in out {
                removed.retain(|(m, _)| *m != id);
                removed.push((id, RemovalReason::Untrusted));
            }
            if survivors.len() != before {
                rekey = true;
            }
        }
        joiners.retain(|(m, _, _)| self.trusts(&m.id));
        let (exchange_key, exchange_from) = match exchange {
            Some((k, from, addr)) => (Some(k), Some((from, addr))),
            None => (None, None),
        };
        let proposal = self.next_proposal();
        // The coordinator takes part in its own flush: it drops ordering it has not
        // delivered (only the flush decides what the view delivers from here).
        self.log = self.log.split_off(&self.stable);
        let delivered = self.delivered;
        self.log.retain(|o, _| *o < delivered);
        self.relayed.clear();
        self.awaiting.clear();
        self.flushing = None;
        let mut answers = BTreeMap::new();
        if survivors.contains(&self.rank) {
            answers.insert(
                self.rank,
                FlushAnswer {
                    delivered: self.delivered,
                    next_seq: self.next_reliable,
                    pending: self
                        .pending
                        .iter()
                        .map(|p| (p.seq, p.data.clone()))
                        .collect(),
                },
            );
        }
        self.coordinator = Some(Coordinator {
            proposal,
            survivors: survivors.clone(),
            joiners,
            removed,
            answers,
            phase: Phase::Collect,
            rekey,
            new_key: None,
            tree_holders: BTreeSet::new(),
            merge_into,
            exchange: exchange_key,
            exchange_from,
            started,
            deadline: now.saturating_add(self.config.flush_timeout),
            resend_at: now,
            final_order: 0,
        });
        self.progress_flush(now);
    }

    fn send_flush(&mut self, now: Timestamp) {
        let Some(c) = self.coordinator.as_mut() else {
            return;
        };
        c.resend_at = now.saturating_add(self.config.flush_timeout / 4);
        let msg = Msg::Flush {
            proposal: c.proposal,
            survivors: c.survivors.clone(),
        };
        let missing: Vec<u16> = c
            .survivors
            .iter()
            .copied()
            .filter(|r| !c.answers.contains_key(r))
            .collect();
        for r in missing {
            if let Some(m) = self.member_at(r) {
                self.send_msg(m.addr, &msg);
            }
        }
    }

    fn on_flush(&mut self, now: Timestamp, rank: u16, proposal: ViewId, survivors: Vec<u16>) {
        if proposal.coordinator != self.member_at(rank).map(|m| m.id).unwrap_or(self.id) {
            self.counters.count(Drop::Unexpected);
            return;
        }
        if !self.trusts(&proposal.coordinator) {
            self.counters.count(Drop::Untrusted);
            return;
        }
        if !survivors.contains(&self.rank) {
            return;
        }
        let current = self
            .flushing
            .as_ref()
            .map(|f| f.proposal)
            .or(self.coordinator.as_ref().map(|c| c.proposal));
        if current.is_some_and(|p| proposal < p) {
            return;
        }
        if self.view.as_ref().is_some_and(|v| proposal <= v.id) {
            return;
        }
        if current != Some(proposal) {
            // A newer view change: join it (abandoning ours, if we coordinated one; what we
            // wanted to change is asked again in the next view).
            if let Some(c) = self.coordinator.take() {
                self.change_wanted.extend(c.removed);
                self.joiners_wanted.extend(c.joiners);
            }
            self.highest_proposal =
                Some(self.highest_proposal.map_or(proposal, |h| h.max(proposal)));
            self.log = self.log.split_off(&self.stable);
            let delivered = self.delivered;
            self.log.retain(|o, _| *o < delivered);
            self.relayed.clear();
            self.awaiting.clear();
            let survivor_ids: Vec<MemberId> = survivors
                .iter()
                .filter_map(|r| self.member_at(*r).map(|m| m.id))
                .collect();
            self.flushing = Some(Flushing {
                proposal,
                coordinator: rank,
                survivors: survivor_ids,
                install: None,
                last_nak: None,
            });
        }
        self.leader_heard = now;
        let msg = Msg::FlushOk {
            proposal,
            delivered: self.delivered,
            next_seq: self.next_reliable,
            pending: self
                .pending
                .iter()
                .map(|p| (p.seq, p.data.clone()))
                .collect(),
        };
        if let Some(m) = self.member_at(rank) {
            self.send_msg(m.addr, &msg);
        }
    }

    fn on_flush_ok(
        &mut self,
        now: Timestamp,
        rank: u16,
        proposal: ViewId,
        delivered: u64,
        next_seq: u64,
        pending: Vec<(u64, Vec<u8>)>,
    ) {
        let Some(c) = self.coordinator.as_mut() else {
            return;
        };
        if c.proposal != proposal || !c.survivors.contains(&rank) || c.phase != Phase::Collect {
            return;
        }
        c.answers.insert(
            rank,
            FlushAnswer {
                delivered,
                next_seq,
                pending,
            },
        );
        self.progress_flush(now);
    }

    /// Moves the coordinated view change forward as far as it can go now.
    fn progress_flush(&mut self, now: Timestamp) {
        // Participant waiting for positions before installing.
        if let Some(f) = self.flushing.as_mut() {
            if let Some(install) = f.install.clone() {
                let final_order = install.final_order;
                let have_all = (self.delivered..final_order).all(|o| self.log.contains_key(&o));
                if have_all {
                    self.finish_participant_install(now, install);
                } else if f.last_nak.is_none_or(|t| {
                    now.saturating_duration_since(t) >= self.config.heartbeat_interval / 2
                }) {
                    f.last_nak = Some(now);
                    let coord = f.coordinator;
                    let from = (self.delivered..final_order)
                        .find(|o| !self.log.contains_key(o))
                        .unwrap_or(self.delivered);
                    if let Some(m) = self.member_at(coord) {
                        self.send_msg(
                            m.addr,
                            &Msg::Nak {
                                from,
                                to: final_order,
                            },
                        );
                    }
                }
            }
            return;
        }
        let Some(c) = self.coordinator.as_ref() else {
            return;
        };
        match c.phase {
            Phase::Collect => {
                if c.survivors.iter().all(|r| c.answers.contains_key(r)) {
                    let (holder, target) = c
                        .answers
                        .iter()
                        .map(|(r, a)| (*r, a.delivered))
                        .max_by_key(|(_, d)| *d)
                        .unwrap_or((self.rank, self.delivered));
                    if let Some(c) = self.coordinator.as_mut() {
                        c.phase = Phase::Fetch {
                            target,
                            from: holder,
                        };
                    }
                    self.progress_flush(now);
                } else if now >= c.resend_at {
                    self.send_flush(now);
                }
            }
            Phase::Fetch { target, from } => {
                let missing = (self.delivered..target).find(|o| !self.log.contains_key(o));
                match missing {
                    None => {
                        self.append_pending(target);
                        self.start_key_phase(now);
                    }
                    Some(lo) => {
                        if now >= c.resend_at {
                            if let Some(c) = self.coordinator.as_mut() {
                                c.resend_at =
                                    now.saturating_add(self.config.heartbeat_interval / 2);
                            }
                            if let Some(m) = self.member_at(from) {
                                self.send_msg(
                                    m.addr,
                                    &Msg::Nak {
                                        from: lo,
                                        to: target,
                                    },
                                );
                            }
                        }
                    }
                }
            }
            Phase::Pairing => {
                let new_ids: Vec<(MemberId, SocketAddr)> =
                    self.new_members().iter().map(|m| (m.id, m.addr)).collect();
                let missing: Vec<(MemberId, SocketAddr)> = new_ids
                    .into_iter()
                    .filter(|(id, _)| *id != self.id && self.pairs.pair_key(id).is_none())
                    .collect();
                if missing.is_empty() {
                    self.send_install(now);
                } else if now >= c.resend_at {
                    if let Some(c) = self.coordinator.as_mut() {
                        c.resend_at = now.saturating_add(self.config.flush_timeout / 4);
                    }
                    for (id, addr) in missing {
                        self.send_pair(now, addr, Some(id), &PairMsg::Ping);
                    }
                }
            }
            Phase::Tree => {
                let new_ids: Vec<MemberId> = self.tree_members().iter().map(|m| m.id).collect();
                if new_ids
                    .iter()
                    .all(|id| *id == self.id || c.tree_holders.contains(id))
                {
                    self.send_install(now);
                } else if now >= c.resend_at {
                    // Key shares travel as datagrams: send again to the children that have
                    // not answered (each forwards again to its own).
                    self.send_tree_shares(now);
                }
            }
        }
    }

    /// Appends the survivors' pending messages (not yet ordered) after `target`.
    fn append_pending(&mut self, target: u64) {
        let Some(c) = self.coordinator.as_mut() else {
            return;
        };
        let mut order = target;
        let mut ordered_seqs: HashMap<u16, u64> = HashMap::new();
        for m in self.log.range(..target).map(|(_, m)| m) {
            let e = ordered_seqs.entry(m.sender).or_insert(0);
            *e = (*e).max(m.seq + 1);
        }
        let mut appended = Vec::new();
        for (rank, answer) in c.answers.iter() {
            let done = ordered_seqs.get(rank).copied().unwrap_or(0);
            for (seq, data) in &answer.pending {
                if *seq >= done && *seq < answer.next_seq {
                    appended.push((
                        order,
                        OrderedMsg {
                            sender: *rank,
                            seq: *seq,
                            data: data.clone(),
                        },
                    ));
                    order += 1;
                }
            }
        }
        c.final_order = order;
        let targets: Vec<u16> = c.survivors.clone();
        for (o, m) in appended {
            let msg = Msg::Ordered {
                order: o,
                sender: m.sender,
                seq: m.seq,
                data: m.data.clone(),
            };
            self.log.insert(o, m);
            for r in &targets {
                if *r != self.rank {
                    if let Some(mm) = self.member_at(*r) {
                        self.send_msg(mm.addr, &msg);
                    }
                }
            }
        }
    }

    /// The next view's members, by rank: survivors in their old order, then joiners.
    fn new_members(&self) -> Vec<Member> {
        let Some(c) = self.coordinator.as_ref() else {
            return Vec::new();
        };
        let mut members: Vec<Member> = c
            .survivors
            .iter()
            .filter_map(|r| self.member_at(*r))
            .collect();
        for (j, _, _) in &c.joiners {
            if !members.iter().any(|m| m.id == j.id) {
                members.push(*j);
            }
        }
        members
    }

    /// The members a tree rekey reaches: the surviving members other than the coordinator.
    /// Joiners get the key in their Welcome, over their pair channel with the coordinator.
    fn tree_members(&self) -> Vec<Member> {
        let Some(c) = self.coordinator.as_ref() else {
            return Vec::new();
        };
        c.survivors
            .iter()
            .filter(|r| **r != self.rank)
            .filter_map(|r| self.member_at(*r))
            .collect()
    }

    fn start_key_phase(&mut self, now: Timestamp) {
        let rekey = self.coordinator.as_ref().is_some_and(|c| c.rekey);
        if !rekey {
            self.send_install(now);
            return;
        }
        let epoch = self
            .group_key
            .as_ref()
            .map_or(0, |k| k.epoch)
            .saturating_add(1);
        let exchanged = self.coordinator.as_mut().and_then(|c| c.exchange.take());
        let key = match exchanged {
            Some(k) => k,
            None => self.fresh_key(epoch),
        };
        match self.config.rekey_method {
            RekeyMethod::OneMessage => {
                if let Some(c) = self.coordinator.as_mut() {
                    c.new_key = Some(key);
                    c.phase = Phase::Pairing;
                    c.resend_at = now;
                    c.deadline = now.saturating_add(self.config.flush_timeout);
                }
                self.progress_flush(now);
            }
            RekeyMethod::Tree { .. } => {
                if let Some(c) = self.coordinator.as_mut() {
                    c.new_key = Some(key);
                    c.phase = Phase::Tree;
                    c.tree_holders.clear();
                    c.resend_at = now;
                    c.deadline = now.saturating_add(self.config.flush_timeout);
                }
                self.progress_flush(now);
            }
        }
    }

    /// Coordinator: sends the fresh key to its tree children that do not hold it yet.
    fn send_tree_shares(&mut self, now: Timestamp) {
        let RekeyMethod::Tree { degree } = self.config.rekey_method else {
            return;
        };
        let members = self.tree_members();
        let Some(c) = self.coordinator.as_mut() else {
            return;
        };
        c.resend_at = now.saturating_add(self.config.flush_timeout / 4);
        let Some(key) = c.new_key.as_ref() else {
            return;
        };
        let (proposal, epoch, key) = (c.proposal, key.epoch, Zeroizing::new(key.expose().to_vec()));
        let holders = c.tree_holders.clone();
        for (child, below) in split_tree(&members, degree) {
            if holders.contains(&child.id) && below.iter().all(|m| holders.contains(&m.id)) {
                continue;
            }
            let share = PairMsg::KeyShare {
                proposal,
                key_epoch: epoch,
                key: key.clone(),
                below,
                degree: degree as u16,
            };
            self.send_pair(now, child.addr, Some(child.id), &share);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_key_share(
        &mut self,
        now: Timestamp,
        peer: MemberId,
        addr: SocketAddr,
        proposal: ViewId,
        key_epoch: u64,
        key: Zeroizing<Vec<u8>>,
        below: Vec<Member>,
        degree: u16,
    ) {
        // Only the proposal's coordinator or a member of the current view (a tree parent)
        // may hand out keys, and only for a proposal this member is flushing for.
        let in_view = self.view.as_ref().is_some_and(|v| v.contains(&peer));
        let expected = self.flushing.as_ref().is_some_and(|f| {
            f.proposal == proposal && (f.survivors.contains(&peer) || peer == proposal.coordinator)
        });
        if key.len() != GROUP_KEY_LEN || !in_view || !expected || degree == 0 {
            self.counters.count(Drop::Unexpected);
            return;
        }
        if self.tree_key.as_ref().is_some_and(|(p, _)| *p == proposal) {
            // A resent share: forward again to children that did not answer, or repeat the
            // acknowledgement.
            match self.tree_wait.as_ref() {
                Some(t) => {
                    let holders = t.holders.clone();
                    for (child, sub) in split_tree(&below, usize::from(degree)) {
                        if holders.contains(&child.id) {
                            continue;
                        }
                        let share = PairMsg::KeyShare {
                            proposal,
                            key_epoch,
                            key: key.clone(),
                            below: sub,
                            degree,
                        };
                        self.send_pair(now, child.addr, Some(child.id), &share);
                    }
                }
                None => {
                    if let Some((p, holders)) = self.tree_acked.clone() {
                        if p == proposal {
                            let ack = PairMsg::KeyAck { proposal, holders };
                            self.send_pair(now, addr, Some(peer), &ack);
                        }
                    }
                }
            }
            return;
        }
        let group_key = GroupKey::new(key_epoch, Secret::from_slice(&key));
        let children = split_tree(&below, usize::from(degree));
        for (child, sub) in &children {
            let share = PairMsg::KeyShare {
                proposal,
                key_epoch,
                key: key.clone(),
                below: sub.clone(),
                degree,
            };
            self.send_pair(now, child.addr, Some(child.id), &share);
        }
        self.tree_key = Some((proposal, group_key));
        let mut holders = BTreeSet::new();
        holders.insert(self.id);
        self.tree_wait = Some(TreeWait {
            proposal,
            parent: addr,
            parent_id: peer,
            children: children.iter().map(|(c, _)| c.id).collect(),
            holders,
            deadline: now.saturating_add(self.config.flush_timeout / 2),
        });
        self.progress_tree(now, false);
    }

    fn on_key_ack(
        &mut self,
        now: Timestamp,
        peer: MemberId,
        proposal: ViewId,
        holders: Vec<MemberId>,
    ) {
        if let Some(c) = self.coordinator.as_mut() {
            if c.proposal == proposal && c.phase == Phase::Tree {
                c.tree_holders.insert(peer);
                c.tree_holders.extend(holders);
                self.progress_flush(now);
                return;
            }
        }
        if let Some(t) = self.tree_wait.as_mut() {
            if t.proposal == proposal && t.children.contains(&peer) {
                t.holders.insert(peer);
                t.holders.extend(holders);
                self.progress_tree(now, false);
            }
        }
    }

    /// A tree node acknowledges up once all children answered (or at its deadline, with
    /// those that did).
    fn progress_tree(&mut self, now: Timestamp, timed_out: bool) {
        let Some(t) = self.tree_wait.as_ref() else {
            return;
        };
        let complete = t.children.iter().all(|c| t.holders.contains(c));
        if complete || timed_out || now >= t.deadline {
            let ack = PairMsg::KeyAck {
                proposal: t.proposal,
                holders: t.holders.iter().copied().collect(),
            };
            let (parent, parent_id) = (t.parent, t.parent_id);
            self.tree_acked = Some((t.proposal, t.holders.iter().copied().collect()));
            self.tree_wait = None;
            self.send_pair(now, parent, Some(parent_id), &ack);
        }
    }

    /// The coordinator sends Install to survivors (old keys) and Welcome to joiners (pair
    /// channels), then installs the view itself.
    fn send_install(&mut self, now: Timestamp) {
        let members = self.new_members();
        let Some(c) = self.coordinator.take() else {
            return;
        };
        let old_epoch = self.group_key.as_ref().map_or(0, |k| k.epoch);
        let key_epoch = c.new_key.as_ref().map_or(old_epoch, |k| k.epoch);
        let next_seqs: Vec<u64> = members
            .iter()
            .map(|m| {
                if let Some(r) = self.view.as_ref().and_then(|v| v.rank_of(&m.id)) {
                    if let Some(a) = c.answers.get(&(r as u16)) {
                        return a.next_seq;
                    }
                }
                c.joiners
                    .iter()
                    .find(|(j, _, _)| j.id == m.id)
                    .map_or(0, |(_, s, _)| *s)
            })
            .collect();
        let incarnations: Vec<u64> = members
            .iter()
            .map(|m| {
                if let Some(j) = c.joiners.iter().find(|(j, _, _)| j.id == m.id) {
                    return j.2;
                }
                self.view
                    .as_ref()
                    .and_then(|v| v.rank_of(&m.id))
                    .and_then(|r| self.incarnations.get(r).copied())
                    .unwrap_or(0)
            })
            .collect();
        let provisional = Install {
            view: c.proposal,
            members: members.clone(),
            next_seqs: next_seqs.clone(),
            incarnations: incarnations.clone(),
            key_epoch,
            final_order: c.final_order,
            key: match (&c.new_key, self.config.rekey_method) {
                (None, _) => KeyDelivery::Same,
                (Some(k), RekeyMethod::Tree { .. }) => {
                    KeyDelivery::Tree(k.fingerprint(&self.provider))
                }
                (Some(_), RekeyMethod::OneMessage) => KeyDelivery::Wrapped(Vec::new()),
            },
            merge_into: c.merge_into,
            removed: c.removed.clone(),
            signature: Vec::new(),
        };
        let bind = self.install_bind(&provisional);
        let key = match (&c.new_key, self.config.rekey_method) {
            (None, _) => KeyDelivery::Same,
            (Some(k), RekeyMethod::Tree { .. }) => KeyDelivery::Tree(k.fingerprint(&self.provider)),
            (Some(k), RekeyMethod::OneMessage) => {
                let mut wraps = Vec::with_capacity(members.len());
                for (r, m) in members.iter().enumerate() {
                    if m.id == self.id {
                        wraps.push(Vec::new());
                        continue;
                    }
                    let wrapped = self
                        .pairs
                        .pair_key(&m.id)
                        .and_then(|pk| {
                            keys::wrap(&self.provider, pk.expose(), &c.proposal, r as u16, k, &bind)
                                .ok()
                        })
                        .unwrap_or_default();
                    wraps.push(wrapped);
                }
                KeyDelivery::Wrapped(wraps)
            }
        };
        let install = Box::new(Install {
            view: c.proposal,
            members: members.clone(),
            next_seqs,
            incarnations,
            key_epoch,
            final_order: c.final_order,
            key,
            merge_into: c.merge_into,
            removed: c.removed.clone(),
            signature: Vec::new(),
        });
        let mut install = install;
        // Identity keys: the coordinator signs. KDC mode: no signature; each member's wrap
        // binds the Install's digest instead.
        if let Some(identity) = self.identity.as_ref() {
            match identity.sign(&self.provider, &install.signed_bytes(&self.config.group)) {
                Ok(sig) => install.signature = sig,
                Err(_) => return, // the backend failed: no view change this time
            }
        }
        let fresh_key = c.new_key.is_some() && c.exchange_from.is_none();
        let new_key = match c.new_key {
            Some(k) => k,
            None => match self.group_key.as_ref() {
                Some(k) => k.duplicate(),
                None => return,
            },
        };
        let welcome_key = Zeroizing::new(new_key.expose().to_vec());
        let mut unacked = Vec::new();
        let mut told = Vec::new();
        let old_members = self
            .view
            .as_ref()
            .map(|v| v.members.clone())
            .unwrap_or_default();
        for m in &members {
            if m.id == self.id {
                continue;
            }
            let joiner = c.joiners.iter().any(|(j, _, _)| j.id == m.id);
            unacked.push((*m, joiner));
        }
        for m in &old_members {
            if m.id != self.id && !members.iter().any(|n| n.id == m.id) {
                let why = c
                    .removed
                    .iter()
                    .find(|(id, _)| *id == m.id)
                    .map(|(_, r)| *r);
                // Removed members hear of it (under the old key they hold; the new key is
                // wrapped for members only). One that was suspected but is alive then goes
                // on in its own component at once, instead of after its suspicion timeout.
                if why.is_some() {
                    told.push(*m);
                }
            }
        }
        let old_view = self.view.as_ref().map(|v| v.id);
        let whole_fits = fits_one_datagram(&install);
        for (m, joiner) in &unacked {
            let copy = install_copy_for(&install, &m.id, whole_fits);
            if *joiner {
                let w = PairMsg::Welcome {
                    install: copy,
                    key: welcome_key.clone(),
                };
                self.send_pair(now, m.addr, Some(m.id), &w);
            } else {
                self.send_msg(m.addr, &Msg::Install(copy));
            }
        }
        // In KDC mode the members left out could not authenticate the Install (they hold no
        // wrap): they hear of it over their pair channel.
        for m in &told {
            if self.identity.is_some() {
                self.send_msg(m.addr, &Msg::Install(install.clone()));
            } else if let Some((_, why)) = install.removed.iter().find(|(id, _)| *id == m.id) {
                let msg = PairMsg::Removed {
                    view: install.view,
                    reason: *why,
                };
                self.send_pair(now, m.addr, Some(m.id), &msg);
            }
        }
        if let Some(target) = c.merge_into {
            self.deliver_up_to(install.final_order);
            self.dissolve(now, target);
            return;
        }
        let took = now.saturating_duration_since(c.started);
        let removed = c.removed.clone();
        let leaving_self = !members.iter().any(|m| m.id == self.id);
        if fresh_key {
            // A fresh key completed first: a ticket that came meanwhile is dropped (the next
            // gossip starts the Exchange again, with this key on our side).
            self.held_exchange = None;
        }
        if let Some((from, from_addr)) = c.exchange_from {
            // Appendix 12.1: the Exchange completed first; a rekey asked for meanwhile is
            // dropped.
            let rekey_dropped = self.rekey_wanted.take().is_some();
            self.exchanged.push(new_key.fingerprint(&self.provider));
            self.events.push_back(GroupEvent::KeyExchanged {
                from,
                key_epoch,
                rekey_dropped,
            });
            // Gossip at once, so the other leader sees that the keys match.
            self.next_gossip = now;
            self.exchange_reply_to = Some(from_addr);
        }
        self.announce = Some(Announce {
            view: install.view,
            install: install.clone(),
            welcome_key: Some(welcome_key),
            unacked,
            resend_at: now.saturating_add(self.config.flush_timeout / 4),
            until: now.saturating_add(self.config.key_grace),
        });
        let _ = old_view;
        if leaving_self {
            self.leave_now(RemovalReason::Left);
            return;
        }
        // The coordinator delivers what every survivor delivers before the new view.
        self.deliver_up_to(install.final_order);
        self.install_view(now, &install, new_key, Some((took, removed)));
    }

    fn on_install(&mut self, now: Timestamp, rank: u16, install: Box<Install>) {
        let Some(coord) = self.member_at(rank) else {
            return;
        };
        if install.view.coordinator != coord.id {
            self.counters.count(Drop::Unexpected);
            return;
        }
        if !self.trusts(&coord.id) {
            self.counters.count(Drop::Untrusted);
            return;
        }
        let relevant = self
            .flushing
            .as_ref()
            .is_some_and(|f| f.proposal == install.view && f.install.is_none())
            || self.view.as_ref().is_some_and(|v| install.view > v.id);
        if !relevant {
            return;
        }
        if !self.install_is_signed(&install) {
            self.counters.count(Drop::AuthFailed);
            return;
        }
        if !install.members.iter().any(|m| m.id == self.id) {
            // We were removed.
            let newer = self
                .flushing
                .as_ref()
                .is_some_and(|f| f.proposal == install.view)
                || self.view.as_ref().is_some_and(|v| install.view > v.id);
            if !newer {
                return;
            }
            let why = install
                .removed
                .iter()
                .find(|(id, _)| *id == self.id)
                .map(|(_, r)| *r);
            match why {
                _ if self.leaving.is_some() => self.leave_now(RemovalReason::Left),
                Some(RemovalReason::Lagged) => self.leave_now(RemovalReason::Lagged),
                _ => {
                    // Suspected while alive: go on at once in a component of those left
                    // out (whoever of them answers), which probing merges back later.
                    if self.coordinator.is_some() {
                        return;
                    }
                    let Some(view) = self.view.clone() else {
                        return;
                    };
                    let gone: Vec<(MemberId, RemovalReason)> = install
                        .members
                        .iter()
                        .map(|m| (m.id, RemovalReason::Suspected))
                        .collect();
                    let survivors: Vec<u16> = (0..view.members.len() as u16)
                        .filter(|r| {
                            !install
                                .members
                                .iter()
                                .any(|m| m.id == view.members[usize::from(*r)].id)
                        })
                        .collect();
                    let rekey = self.config.rekey_policy.on_membership_change;
                    self.start_coordinating(
                        now,
                        Change {
                            survivors,
                            joiners: Vec::new(),
                            removed: gone,
                            rekey,
                            started: now,
                            merge_into: None,
                            exchange: None,
                        },
                    );
                }
            }
            return;
        }
        let Some(f) = self.flushing.as_mut() else {
            return;
        };
        if f.proposal != install.view || f.coordinator != rank {
            return;
        }
        if f.install.is_none() {
            f.install = Some(install);
        }
        self.progress_flush(now);
    }

    fn finish_participant_install(&mut self, now: Timestamp, install: Box<Install>) {
        if let Some(target) = install.merge_into {
            self.deliver_up_to(install.final_order);
            self.dissolve(now, target);
            return;
        }
        if !install.members.iter().any(|m| m.id == self.id) {
            return;
        }
        let key = match &install.key {
            KeyDelivery::Same => self.group_key.as_ref().map(|k| k.duplicate()),
            KeyDelivery::Wrapped(_) => match self.unwrapped.take() {
                Some((view, key)) if view == install.view => Some(key),
                _ => self.unwrap_own(&install),
            },
            KeyDelivery::Tree(fp) => match self.tree_key.as_ref() {
                Some((p, k)) if *p == install.view && k.fingerprint(&self.provider) == *fp => {
                    Some(k.duplicate())
                }
                _ => None,
            },
        };
        let Some(key) = key else {
            // The key did not arrive or did not authenticate: wait for a retransmission (the
            // pair channel may still be coming up) or for the next view change.
            if let Some(f) = self.flushing.as_mut() {
                f.install = None;
            }
            return;
        };
        if key.epoch != install.key_epoch {
            self.counters.count(Drop::Unexpected);
            if let Some(f) = self.flushing.as_mut() {
                f.install = None;
            }
            return;
        }
        self.deliver_up_to(install.final_order);
        self.install_view(now, &install, key, None);
        self.ack_install(&install);
    }

    /// Installs `install` with `key`: new keys, new log, events.
    fn install_view(
        &mut self,
        now: Timestamp,
        install: &Install,
        key: GroupKey,
        coordinated: Option<(Duration, Vec<(MemberId, RemovalReason)>)>,
    ) {
        let Some(rank) = install.members.iter().position(|m| m.id == self.id) else {
            return;
        };
        let view = View {
            id: install.view,
            members: install.members.clone(),
            key_epoch: install.key_epoch,
        };
        let keys = match ViewKeys::derive(
            &self.provider,
            &self.config.group,
            &key,
            view.id,
            view.members.len(),
            rank as u16,
            &self.plan,
        ) {
            Ok(k) => k,
            Err(_) => return,
        };
        // Keep the old view for its grace window.
        if let (Some(old_view), Some(old_keys)) = (self.view.take(), self.keys.take()) {
            let log = std::mem::take(&mut self.log);
            self.old_views.push(OldView {
                view: old_view.clone(),
                keys: old_keys,
                log,
                expires: now.saturating_add(self.config.key_grace),
            });
            while self.old_views.len() > 2 {
                self.old_views.remove(0);
            }
            let removed = install.removed.clone();
            let staying: std::collections::HashSet<MemberId> = view.ids().collect();
            for m in &old_view.members {
                if !staying.contains(&m.id) {
                    let reason = removed
                        .iter()
                        .find(|(id, _)| *id == m.id)
                        .map_or(RemovalReason::Suspected, |(_, r)| *r);
                    self.events.push_back(GroupEvent::Removed {
                        member: m.id,
                        reason,
                    });
                    if reason == RemovalReason::Left {
                        if self.departed.len() >= 4096 {
                            self.departed.clear();
                        }
                        self.departed.insert(m.id);
                    }
                    self.pairs.forget(m.addr);
                }
            }
        }
        let rekeyed = self.group_key.as_ref().is_none_or(|k| {
            k.epoch != key.epoch || k.fingerprint(&self.provider) != key.fingerprint(&self.provider)
        });
        if rekeyed {
            self.key_holders.clear();
        }
        // Tokens presented by members now in the view are spent.
        self.presented
            .retain(|(m, _)| !install.members.iter().any(|x| x.id == *m));
        if self.presented.len() > 1024 {
            self.presented.clear();
        }
        if rank != 0 {
            // Tickets go to leaders; one held by a leader that no longer leads is moot.
            self.held_exchange = None;
        }
        self.record_key(&key);
        self.group_key = Some(key);
        self.rank = rank as u16;
        self.incarnations = install.incarnations.clone();
        self.keys = Some(keys);
        self.log = BTreeMap::new();
        self.relayed.clear();
        self.awaiting.clear();
        self.delivered_seq = vec![None; install.members.len()];
        self.known_end = 0;
        self.delivered = 0;
        self.stable = 0;
        self.last_ack_sent = 0;
        self.last_nak = None;
        self.delivered_at_leader_heartbeat = 0;
        self.flushing = None;
        self.tree_key = None;
        self.tree_wait = None;
        self.highest_proposal = Some(self.highest_proposal.map_or(view.id, |h| h.max(view.id)));
        let next_own = install
            .next_seqs
            .get(rank)
            .copied()
            .unwrap_or(self.next_reliable);
        self.pending.retain(|p| p.seq >= next_own);
        for p in self.pending.iter_mut() {
            p.sent_at = None;
        }
        self.next_reliable = self.next_reliable.max(next_own);
        self.sequencer = if rank == 0 {
            let n = view.members.len();
            Some(Sequencer {
                next_order: 0,
                expected: install.next_seqs.clone(),
                early: (0..n).map(|_| BTreeMap::new()).collect(),
                acked: vec![0; n],
                heard: vec![now; n],
                loads: vec![(0, 0); n],
                turn: 0,
                stalled_since: None,
                tokens: Vec::new(),
            })
        } else {
            None
        };
        self.leader_heard = now;
        self.next_heartbeat = now;
        for m in &view.members {
            if m.id != self.id {
                self.known.insert(m.id, m.addr);
                self.departed.remove(&m.id);
            }
        }
        self.view = Some(view.clone());
        self.events.push_back(GroupEvent::View(view.clone()));
        if rekeyed {
            self.last_rekey = now;
            self.events.push_back(GroupEvent::Rekeyed {
                key_epoch: view.key_epoch,
                members: view.members.len(),
                took: coordinated.as_ref().map(|(t, _)| *t),
            });
        }
        if !self.trusts(&view.leader().id) {
            // A coordinator this member does not trust got it into its view (it was trusted
            // when the flush began): leave at once.
            self.go_alone(now);
            return;
        }
        self.submit_pending(now);
        if self.leaving.is_some() && rank != 0 {
            let leader = view.leader().addr;
            self.send_msg(leader, &Msg::Leave);
        } else if self.leaving.is_some() {
            self.change_wanted.push((self.id, RemovalReason::Left));
        }
        self.maybe_start_change(now);
    }

    /// Whether `install` comes from its coordinator: its Ed25519 signature, or in KDC mode
    /// this member's wrap, which binds the Install's digest under the pair key shared with
    /// the coordinator (an Install that leaves this member out cannot be checked there).
    fn install_is_signed(&mut self, install: &Install) -> bool {
        if self.identity.is_none() {
            // The check unwraps this member's key: keep it for the install that follows.
            return match self.unwrap_own(install) {
                Some(key) => {
                    self.unwrapped = Some((install.view, key));
                    true
                }
                None => false,
            };
        }
        install.view.coordinator.0.verify(
            &self.provider,
            &install.signed_bytes(&self.config.group),
            &install.signature,
        )
    }

    /// KDC mode binds this into every wrap: SHA-256 of what an identity-key coordinator
    /// would sign. Empty with identity keys (the signature covers it).
    fn install_bind(&self, install: &Install) -> Vec<u8> {
        if self.identity.is_some() {
            return Vec::new();
        }
        self.provider
            .sha256
            .sha256(&[&install.signed_bytes(&self.config.group)])
            .to_vec()
    }

    /// This member's key from a one-message Install's wraps.
    fn unwrap_own(&self, install: &Install) -> Option<GroupKey> {
        let KeyDelivery::Wrapped(wraps) = &install.key else {
            return None;
        };
        let my_rank = install.members.iter().position(|m| m.id == self.id)?;
        let pk = self.pairs.pair_key(&install.view.coordinator)?;
        keys::unwrap(
            &self.provider,
            pk.expose(),
            &install.view,
            my_rank as u16,
            install.key_epoch,
            wraps.get(my_rank)?,
            &self.install_bind(install),
        )
    }

    /// Forgets the current component (view, keys, pair channels, logs, any view change) and
    /// takes a new incarnation, keeping the undelivered reliable messages for the next view.
    fn drop_component(&mut self) {
        self.forget_pairs();
        self.view = None;
        self.keys = None;
        self.sequencer = None;
        self.flushing = None;
        self.coordinator = None;
        self.announce = None;
        self.log.clear();
        self.old_views.clear();
        for p in self.pending.iter_mut() {
            p.sent_at = None;
        }
        self.incarnation = self.rng.next_u64();
    }

    /// Leaves this component (after its final flush) to join the one led at `target`.
    fn dissolve(&mut self, now: Timestamp, target: SocketAddr) {
        self.drop_component();
        let mut contacts = vec![target];
        contacts.extend(self.contacts.iter().copied().filter(|c| *c != target));
        self.joining = Some(Joining::new(contacts, now));
        self.drive_join(now);
    }

    /// Whether this member's policy trusts `id` (itself always).
    fn trusts(&self, id: &MemberId) -> bool {
        *id == self.id
            || self.config.trust.contains(id)
            || (self.config.auth == AuthMode::Kdc
                && self.config.trust_any_registered
                && id.principal().is_some())
    }

    fn new_local_id(&self, nonce: [u8; exchange::NONCE_LEN]) -> Option<LocalId> {
        if self.identity.is_none() {
            return Some(LocalId::nonce_only(nonce));
        }
        LocalId::new(&self.provider, nonce)
    }

    // ---------------------------------------------------------------- heal and exchange

    /// The leader sends a fresh Id to the members it knows outside its view and its contacts
    /// (Heal and Exchange): components that hear it merge, or exchange keys first.
    fn gossip(&mut self) {
        let Some(view) = self.view.as_ref() else {
            return;
        };
        let mut targets: Vec<SocketAddr> = self
            .known
            .iter()
            .filter(|(id, _)| !view.contains(id))
            .map(|(_, a)| *a)
            .collect();
        for c in &self.contacts {
            if !view.members.iter().any(|m| m.addr == *c) && !targets.contains(c) {
                targets.push(*c);
            }
        }
        if let Some(a) = self.exchange_reply_to.take() {
            if !targets.contains(&a) {
                targets.push(a);
            }
        }
        if targets.is_empty() {
            return;
        }
        let mut nonce = [0u8; exchange::NONCE_LEN];
        self.rng.fill_bytes(&mut nonce);
        let Some(local) = self.new_local_id(nonce) else {
            return;
        };
        self.local_ids.push(local);
        while self.local_ids.len() > 2 {
            self.local_ids.remove(0);
        }
        let Some(id) = self.encode_own_id() else {
            return;
        };
        for t in targets {
            self.out.push_back((t, id.clone()));
        }
    }

    /// This leader's latest Id, encoded and signed.
    fn encode_own_id(&mut self) -> Option<Vec<u8>> {
        if self.local_ids.is_empty() {
            let mut nonce = [0u8; exchange::NONCE_LEN];
            self.rng.fill_bytes(&mut nonce);
            let local = self.new_local_id(nonce)?;
            self.local_ids.push(local);
        }
        let (view, key, local) = (
            self.view.as_ref()?,
            self.group_key.as_ref()?,
            self.local_ids.last()?,
        );
        let size = view.members.len() as u16;
        match self.identity.as_ref() {
            Some(identity) => exchange::encode_id(
                &self.provider,
                identity,
                &self.config.group,
                self.addr,
                size,
                local,
                key,
            ),
            None => Some(exchange::encode_kdc_id(
                &self.provider,
                &self.id,
                &self.config.group,
                self.addr,
                size,
                local,
                key,
            )),
        }
    }

    /// At most one answer (or forward) per address per heartbeat interval, counted apart
    /// for answers to secure Ids (`secure`): the larger leader's answer that lets the smaller
    /// one merge must not be held back by the ticket it sent a moment before.
    fn gossip_throttle(&mut self, now: Timestamp, addr: SocketAddr, secure: bool) -> bool {
        let gap = self.config.heartbeat_interval;
        let map = if secure {
            &mut self.secure_answered
        } else {
            &mut self.gossip_answered
        };
        if map.len() >= 1024 {
            map.retain(|_, t| now.saturating_duration_since(*t) < gap);
            if map.len() >= 1024 {
                return false;
            }
        }
        match map.get(&addr) {
            Some(t) if now.saturating_duration_since(*t) < gap => false,
            _ => {
                map.insert(addr, now);
                true
            }
        }
    }

    /// Takes one signature check from the gossip budget (32 per suspicion timeout).
    fn spend_verification(&mut self, now: Timestamp) -> bool {
        if now.saturating_duration_since(self.gossip_budget_at) >= self.config.suspect_timeout {
            self.gossip_budget_at = now;
            self.gossip_budget = 32;
        }
        if self.gossip_budget == 0 {
            return false;
        }
        self.gossip_budget -= 1;
        true
    }

    fn handle_gossip(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        let Some(parsed) = exchange::decode(data) else {
            self.counters.count(Drop::Malformed);
            return;
        };
        if parsed.group != self.config.group {
            self.counters.count(Drop::OtherGroup);
            return;
        }
        if self.view.is_none() || self.expelled {
            return;
        }
        match parsed.gossip.clone() {
            Gossip::Id(id) => self.on_id(now, data, &parsed, id),
            Gossip::Ticket(t) => self.on_ticket(now, from, data, &parsed, t),
            Gossip::Present {
                member,
                view,
                token,
            } => {
                // LSGC message 5 at a member: it checks the token under the view's key (only
                // members of the view hold it). The leader decides; this is what LSGC's
                // members do with it.
                if self.identity.is_some() {
                    self.counters.count(Drop::Unexpected);
                } else if self.token_valid(&member, view, &token) {
                    self.tokens_checked += 1;
                } else {
                    self.counters.count(Drop::AuthFailed);
                }
            }
        }
    }

    fn on_id(&mut self, now: Timestamp, data: &[u8], parsed: &Parsed, id: exchange::Id) {
        let Some(view) = self.view.clone() else {
            return;
        };
        if id.principal == self.id || view.contains(&id.principal) {
            return; // our own, or a member's from before it joined us
        }
        if !self.is_leader() {
            // Only leaders take part: pass it on to ours (it answers the address inside).
            if self.gossip_throttle(now, id.addr, false) {
                self.out.push_back((view.leader().addr, data.to_vec()));
            }
            return;
        }
        if self.coordinator.is_some() || self.flushing.is_some() {
            return; // busy: the next gossip comes soon
        }
        let Some(key) = self.group_key.as_ref() else {
            return;
        };
        if exchange::id_is_secure(&self.provider, &self.config.group, key, data, parsed) {
            // Heal: one key, so the components merge. The smaller one yields (between
            // equals, the one whose leader's key sorts higher); both compute the same.
            let mine = (view.members.len() as u16, std::cmp::Reverse(self.id));
            let theirs = (id.size, std::cmp::Reverse(id.principal));
            if mine < theirs {
                self.events.push_back(GroupEvent::Merging {
                    leader: id.principal,
                    into: id.addr,
                });
                let survivors: Vec<u16> = (0..view.members.len() as u16).collect();
                self.start_coordinating(
                    now,
                    Change {
                        survivors,
                        joiners: Vec::new(),
                        removed: Vec::new(),
                        rekey: false,
                        started: now,
                        merge_into: Some(id.addr),
                        exchange: None,
                    },
                );
            } else if self.gossip_throttle(now, id.addr, true) {
                // Tell the smaller one now rather than at our next gossip.
                if let Some(own) = self.encode_own_id() {
                    self.out.push_back((id.addr, own));
                }
            }
            return;
        }
        // Insecure: another key. Exchange only with a leader this one trusts, and not with a
        // principal seen leaving (it would get the key drawn to keep it out; it comes back
        // by joining).
        if !self.trusts(&id.principal) || self.departed.contains(&id.principal) {
            self.counters.count(Drop::Untrusted);
            return;
        }
        if !self.gossip_throttle(now, id.addr, false) {
            return;
        }
        if self.identity.is_none() {
            // KDC mode: the Id is not signed; the ticket goes over a pair channel that only
            // the named principal can open (its keys come from the KDC).
            if id.principal.principal().is_none() {
                self.counters.count(Drop::Malformed);
                return;
            }
            if self.id < id.principal {
                let (Some(key), Some(epoch)) = (
                    self.group_key
                        .as_ref()
                        .map(|k| Zeroizing::new(k.expose().to_vec())),
                    self.group_key.as_ref().map(|k| k.epoch),
                ) else {
                    return;
                };
                let ticket = PairMsg::Ticket {
                    nonce: id.nonce,
                    key_epoch: epoch,
                    key,
                };
                self.send_pair(now, id.addr, Some(id.principal), &ticket);
                self.events
                    .push_back(GroupEvent::TicketSent { to: id.principal });
            } else if let Some(own) = self.encode_own_id() {
                self.out.push_back((id.addr, own));
            }
            return;
        }
        if !self.spend_verification(now) {
            return;
        }
        if !exchange::signature_ok(&self.provider, data, parsed) {
            self.counters.count(Drop::AuthFailed);
            return;
        }
        if self.id < id.principal {
            // The lower principal hands its key over.
            let (Some(key), Some(identity)) = (self.group_key.as_ref(), self.identity.as_ref())
            else {
                return;
            };
            if let Some(ticket) =
                exchange::encode_ticket(&self.provider, identity, &self.config.group, &id, key)
            {
                self.out.push_back((id.addr, ticket));
                self.events
                    .push_back(GroupEvent::TicketSent { to: id.principal });
            }
        } else if let Some(own) = self.encode_own_id() {
            // The other leader sorts lower: it sends the ticket once it hears from us.
            self.out.push_back((id.addr, own));
        }
    }

    fn on_ticket(
        &mut self,
        now: Timestamp,
        from: SocketAddr,
        data: &[u8],
        parsed: &Parsed,
        t: exchange::Ticket,
    ) {
        // KDC mode takes tickets over pair channels only (and runs no signature check). Only
        // the lower principal hands its key over.
        if t.recipient != self.id
            || !self.is_leader()
            || self.identity.is_none()
            || t.sender >= self.id
        {
            self.counters.count(Drop::Unexpected);
            return;
        }
        if !self.trusts(&t.sender) || self.departed.contains(&t.sender) {
            self.counters.count(Drop::Untrusted);
            return;
        }
        // Fresh: for one of our two latest nonces, and the first ticket for it.
        let Some(i) = self
            .local_ids
            .iter()
            .position(|l| l.nonce == t.nonce && !l.used)
        else {
            self.counters.count(Drop::Replayed);
            return;
        };
        if !self.spend_verification(now) {
            return;
        }
        if !exchange::signature_ok(&self.provider, data, parsed) {
            self.counters.count(Drop::AuthFailed);
            return;
        }
        let Some(key) = exchange::open_ticket(
            &self.provider,
            &self.config.group,
            &self.id,
            &self.local_ids[i],
            data,
            &t,
        ) else {
            self.counters.count(Drop::AuthFailed);
            return;
        };
        self.local_ids[i].used = true;
        let same = self
            .group_key
            .as_ref()
            .is_some_and(|k| ct_eq(k.expose(), key.expose()));
        if same {
            return;
        }
        self.held_exchange = Some((key, t.sender, from));
        self.maybe_start_change(now);
    }

    /// KDC mode, LSGC message 4: the view id and the joiner's token, under σ (the pair
    /// channel), with the members' addresses for message 5.
    fn grant(
        &mut self,
        now: Timestamp,
        view: &View,
        peer: MemberId,
        addr: SocketAddr,
        next_seq: u64,
        incarnation: u64,
    ) {
        let mut nonce = [0u8; 12];
        self.rng.fill_bytes(&mut nonce);
        let Some(token) = self.keys.as_ref().and_then(|k| k.seal_token(nonce, &peer)) else {
            return;
        };
        if self.granted.len() >= 1024 && !self.granted.contains_key(&peer) {
            self.counters.count(Drop::Unexpected);
            return;
        }
        self.granted.insert(peer, (addr, next_seq, incarnation));
        let grant = PairMsg::Grant {
            view: view.id,
            token,
            members: view.members.iter().map(|m| m.addr).collect(),
        };
        self.send_pair(now, addr, Some(peer), &grant);
    }

    /// Whether `token` is `member`'s for `view`, the current view or the one before.
    fn token_valid(&self, member: &MemberId, view: ViewId, token: &[u8]) -> bool {
        let current = self
            .keys
            .as_ref()
            .filter(|k| k.view == view)
            .is_some_and(|k| k.check_token(token, member));
        current
            || self
                .old_views
                .iter()
                .any(|o| o.keys.view == view && o.keys.check_token(token, member))
    }

    /// KDC mode, LSGC message 5 reaching the leader: a valid token lets the joiner in.
    fn on_present(&mut self, now: Timestamp, peer: MemberId, view: ViewId, token: &[u8]) {
        if self.identity.is_some() || !self.is_leader() {
            self.counters.count(Drop::Unexpected);
            return;
        }
        let Some((addr, next_seq, incarnation)) = self.granted.get(&peer).copied() else {
            self.counters.count(Drop::Unexpected);
            return;
        };
        if !self.token_valid(&peer, view, token) {
            self.counters.count(Drop::AuthFailed);
            return;
        }
        self.granted.remove(&peer);
        self.presented.insert((peer, incarnation));
        self.on_join_request(now, peer, addr, incarnation, next_seq, None);
    }

    /// KDC mode, at the joiner: message 4 arrived; present the token to the leader over the
    /// pair channel and to every member of the view (message 5).
    fn on_grant(
        &mut self,
        now: Timestamp,
        peer: MemberId,
        addr: SocketAddr,
        view: ViewId,
        token: Vec<u8>,
        members: Vec<SocketAddr>,
    ) {
        if self.identity.is_some() || self.joining.is_none() {
            self.counters.count(Drop::Unexpected);
            return;
        }
        let present = exchange::encode_present(&self.config.group, &self.id, &view, &token);
        for m in members.into_iter().take(MAX_VIEW_MEMBERS) {
            if m != addr && m != self.addr {
                self.out.push_back((m, present.clone()));
            }
        }
        self.send_pair(now, addr, Some(peer), &PairMsg::Present { view, token });
    }

    /// KDC mode's ticket, over the pair channel from `peer`.
    fn on_pair_ticket(
        &mut self,
        now: Timestamp,
        peer: MemberId,
        addr: SocketAddr,
        nonce: [u8; exchange::NONCE_LEN],
        key_epoch: u64,
        key: &[u8],
    ) {
        if self.identity.is_some()
            || !self.is_leader()
            || key.len() != GROUP_KEY_LEN
            || peer >= self.id
        {
            self.counters.count(Drop::Unexpected);
            return;
        }
        if !self.trusts(&peer) || self.departed.contains(&peer) {
            self.counters.count(Drop::Untrusted);
            return;
        }
        let Some(i) = self
            .local_ids
            .iter()
            .position(|l| l.nonce == nonce && !l.used)
        else {
            self.counters.count(Drop::Replayed);
            return;
        };
        self.local_ids[i].used = true;
        let key = GroupKey::new(key_epoch, Secret::from_slice(key));
        let same = self
            .group_key
            .as_ref()
            .is_some_and(|k| ct_eq(k.expose(), key.expose()));
        if same {
            return;
        }
        self.held_exchange = Some((key, peer, addr));
        self.maybe_start_change(now);
    }

    // ---------------------------------------------------------------- trust policy

    /// Replaces this member's trust policy (the principals it trusts). Pair channels to
    /// principals no longer trusted close. A leader removes the members of its view it no
    /// longer trusts, with a rekey (Ensemble 6.1); a member that no longer trusts its leader
    /// leaves the component and goes on alone (it may merge later with components whose
    /// leaders it trusts). Other members stay: they are linked to this one through the
    /// leader, which st-trust allows.
    pub fn set_trust(&mut self, now: Timestamp, trust: Vec<MemberId>) {
        self.config.trust = trust.clone();
        self.pairs.set_trust(trust);
        self.drain_pairs(now);
        let mut untrusted_members = Vec::new();
        if let Some(view) = self.view.clone() {
            untrusted_members = view.ids().filter(|m| !self.trusts(m)).collect();
            if self.is_leader() {
                for m in &untrusted_members {
                    if !self.change_wanted.iter().any(|(w, _)| w == m) {
                        self.change_wanted.push((*m, RemovalReason::Untrusted));
                    }
                }
            }
        }
        let joiners = std::mem::take(&mut self.joiners_wanted);
        self.joiners_wanted = joiners
            .into_iter()
            .filter(|(m, _, _)| self.trusts(&m.id))
            .collect();
        self.events.push_back(GroupEvent::TrustChanged {
            trusted: self.config.trust.len(),
            untrusted_members: untrusted_members.clone(),
        });
        // A view change led by a coordinator no longer trusted is abandoned (it could
        // otherwise install a view that keeps this member with it, under the old key).
        let follows_untrusted = self
            .flushing
            .as_ref()
            .is_some_and(|f| !self.trusts(&f.proposal.coordinator));
        if follows_untrusted {
            self.flushing = None;
        }
        let leader_untrusted = self
            .view
            .as_ref()
            .is_some_and(|v| !self.trusts(&v.leader().id));
        if leader_untrusted {
            self.go_alone(now);
            return;
        }
        self.maybe_start_change(now);
    }

    /// The principals this member trusts.
    pub fn trust(&self) -> &[MemberId] {
        &self.config.trust
    }

    /// Leaves the component (telling the leader) and founds one of its own, keeping its
    /// undelivered reliable messages for the new view.
    fn go_alone(&mut self, now: Timestamp) {
        if let Some(leader) = self.view.as_ref().map(|v| v.leader().addr) {
            self.send_msg(leader, &Msg::Leave);
        }
        self.drop_component();
        self.found(now);
    }

    /// Tells the view's coordinator (under the new view's keys) that it is installed here.
    fn ack_install(&mut self, install: &Install) {
        let coordinator = install
            .members
            .iter()
            .find(|m| m.id == install.view.coordinator)
            .map(|m| m.addr);
        if let Some(addr) = coordinator {
            self.send_msg(addr, &Msg::InstallAck);
        }
    }

    /// Drops the pair channels to every member this one knows (their ends may drop theirs
    /// when they remove this member).
    fn forget_pairs(&mut self) {
        let addrs: Vec<SocketAddr> = self.known.values().copied().collect();
        for a in addrs {
            self.pairs.forget(a);
        }
    }

    fn leave_now(&mut self, reason: RemovalReason) {
        self.forget_pairs();
        self.view = None;
        self.keys = None;
        self.group_key = None;
        self.sequencer = None;
        self.flushing = None;
        self.coordinator = None;
        self.pending.clear();
        self.log.clear();
        self.old_views.clear();
        self.expelled = true;
        self.events.push_back(GroupEvent::Expelled { reason });
    }

    // ---------------------------------------------------------------- timers

    fn on_tick(&mut self, now: Timestamp) {
        self.old_views.retain(|o| o.expires > now);
        if let Some(a) = self.announce.as_ref() {
            if now >= a.until || self.view.as_ref().is_none_or(|v| v.id != a.view) {
                self.announce = None;
            } else if now >= a.resend_at {
                let a = self.announce.take();
                if let Some(mut a) = a {
                    a.resend_at = now.saturating_add(self.config.flush_timeout / 4);
                    let old = self.old_views.last().map(|o| o.view.id);
                    let whole_fits = fits_one_datagram(&a.install);
                    for (m, joiner) in a.unacked.clone() {
                        let copy = install_copy_for(&a.install, &m.id, whole_fits);
                        if joiner {
                            let w = PairMsg::Welcome {
                                install: copy,
                                key: a.welcome_key.clone().unwrap_or_default(),
                            };
                            self.send_pair(now, m.addr, Some(m.id), &w);
                        } else if let Some(old) = old {
                            self.send_msg_old(old, m.addr, &Msg::Install(copy));
                        }
                    }
                    self.announce = Some(a);
                }
            }
        }
        if self.joining.is_some() {
            self.drive_join(now);
        }
        if self.view.is_none() || self.expelled {
            return;
        }
        if now >= self.next_heartbeat {
            self.next_heartbeat = now.saturating_add(self.config.heartbeat_interval);
            self.send_heartbeat(now);
            self.submit_pending(now);
            if let Some(l) = self.leaving {
                if !self.is_leader()
                    && now.saturating_duration_since(l) >= self.config.heartbeat_interval
                {
                    if let Some(leader) = self.view.as_ref().map(|v| v.leader().addr) {
                        self.send_msg(leader, &Msg::Leave);
                    }
                }
            }
        }
        // Missing positions are asked for again until they arrive.
        if !self.is_leader()
            && self.flushing.is_none()
            && self.coordinator.is_none()
            && self.known_end > self.delivered
        {
            let end = self.known_end;
            self.nak_gap(now, Some(end));
        }
        // The leader gossips its Id now and then (Heal and Exchange).
        if self.is_leader() && now >= self.next_gossip {
            let jitter = Duration::from_millis(self.rng.next_u32() as u64 % 100);
            self.next_gossip = now
                .saturating_add(self.config.suspect_timeout)
                .saturating_add(jitter);
            if self.coordinator.is_none() {
                self.gossip();
            }
        }
        // The leader suspects silent members.
        if let Some(s) = self.sequencer.as_ref() {
            if self.coordinator.is_none() && self.flushing.is_none() {
                let timeout = self.config.suspect_timeout;
                let my = usize::from(self.rank);
                let silent: Vec<MemberId> = s
                    .heard
                    .iter()
                    .enumerate()
                    .filter(|(r, t)| *r != my && now.saturating_duration_since(**t) > timeout)
                    .filter_map(|(r, _)| self.member_at(r as u16).map(|m| m.id))
                    .collect();
                for id in silent {
                    if !self.change_wanted.iter().any(|(m, _)| *m == id) {
                        self.change_wanted.push((id, RemovalReason::Suspected));
                    }
                }
                self.check_lagging(now);
                self.maybe_start_change(now);
            }
        }
        // Coordinator: deadlines exclude the silent and start again.
        if let Some(c) = self.coordinator.as_ref() {
            if now >= c.deadline {
                self.restart_flush(now);
            } else {
                self.progress_flush(now);
            }
        }
        if self.flushing.is_some() {
            self.progress_flush(now);
        }
        if let Some(t) = self.tree_wait.as_ref() {
            if now >= t.deadline {
                self.progress_tree(now, true);
            }
        }
        // A member suspects the leader (or the coordinator it follows) and, when its turn
        // comes by rank, takes over.
        if !self.is_leader() && self.coordinator.is_none() {
            let silence = now.saturating_duration_since(self.leader_heard);
            let turn = self.config.suspect_timeout * u32::from(self.rank.max(1));
            if silence > turn {
                let Some(view) = self.view.clone() else {
                    return;
                };
                let followed = self.flushing.as_ref().map_or(0, |f| f.coordinator);
                let survivors: Vec<u16> = (0..view.members.len() as u16)
                    .filter(|r| *r != 0 && *r != followed)
                    .collect();
                let mut removed = vec![(view.members[0].id, RemovalReason::Suspected)];
                if followed != 0 {
                    if let Some(m) = view.members.get(usize::from(followed)) {
                        removed.push((m.id, RemovalReason::Suspected));
                    }
                }
                let rekey = self.config.rekey_policy.on_membership_change;
                self.start_coordinating(
                    now,
                    Change {
                        survivors,
                        joiners: Vec::new(),
                        removed,
                        rekey,
                        started: now,
                        merge_into: None,
                        exchange: None,
                    },
                );
            }
        }
    }

    /// The coordinator's deadline passed: exclude who did not answer, and start over.
    fn restart_flush(&mut self, now: Timestamp) {
        let Some(phase) = self.coordinator.as_ref().map(|c| c.phase) else {
            return;
        };
        // Who did not answer, computed while the coordinator state is still in place.
        let silent: Vec<MemberId> = match phase {
            Phase::Collect => self.coordinator.as_ref().map_or(Vec::new(), |c| {
                c.survivors
                    .iter()
                    .filter(|r| !c.answers.contains_key(r))
                    .filter_map(|r| self.member_at(*r).map(|m| m.id))
                    .collect()
            }),
            Phase::Fetch { from, .. } => {
                self.member_at(from).map(|m| vec![m.id]).unwrap_or_default()
            }
            Phase::Pairing => self
                .new_members()
                .into_iter()
                .filter(|m| m.id != self.id && self.pairs.pair_key(&m.id).is_none())
                .map(|m| m.id)
                .collect(),
            Phase::Tree => {
                let holders = self
                    .coordinator
                    .as_ref()
                    .map(|c| c.tree_holders.clone())
                    .unwrap_or_default();
                self.tree_members()
                    .into_iter()
                    .filter(|m| !holders.contains(&m.id))
                    .map(|m| m.id)
                    .collect()
            }
        };
        // Their pair channels may be half dead (one end forgot): start them afresh.
        let addrs: Vec<SocketAddr> = silent
            .iter()
            .filter_map(|id| self.known.get(id).copied())
            .collect();
        for a in addrs {
            self.pairs.forget(a);
        }
        let Some(c) = self.coordinator.take() else {
            return;
        };
        self.restart_with(now, c, silent);
    }

    fn restart_with(&mut self, now: Timestamp, c: Coordinator, silent: Vec<MemberId>) {
        let mut removed = c.removed.clone();
        let mut survivors = c.survivors.clone();
        let mut joiners = c.joiners.clone();
        for id in &silent {
            removed.push((*id, RemovalReason::Suspected));
            joiners.retain(|(j, _, _)| j.id != *id);
            if let Some(r) = self.view.as_ref().and_then(|v| v.rank_of(id)) {
                survivors.retain(|s| usize::from(*s) != r);
            }
        }
        let rekey =
            c.rekey || (!silent.is_empty() && self.config.rekey_policy.on_membership_change);
        // An Exchange in progress goes on with its key.
        let exchange = match (c.exchange_from, c.exchange.or(c.new_key)) {
            (Some((from, addr)), Some(k)) => Some((k, from, addr)),
            _ => None,
        };
        self.start_coordinating(
            now,
            Change {
                survivors,
                joiners,
                removed,
                rekey,
                started: c.started,
                merge_into: c.merge_into,
                exchange,
            },
        );
    }
}

/// Largest Install body sent whole: leaves room in a 64 KiB datagram for the headers.
const MAX_INSTALL_BODY: usize = 60_000;

/// Whether `install` fits one datagram as it is.
fn fits_one_datagram(install: &Install) -> bool {
    let mut body = Vec::new();
    Msg::Install(Box::new(install.clone())).encode(&mut body);
    body.len() <= MAX_INSTALL_BODY
}

/// The Install a member receives: the whole message when it fits one datagram (LSGC's one
/// message for everyone); otherwise (beyond about 600 members with wrapped keys) a copy
/// with only that member's wrapped key, the others left empty.
fn install_copy_for(install: &Install, member: &MemberId, whole_fits: bool) -> Box<Install> {
    let mut copy = Box::new(install.clone());
    if whole_fits {
        return copy;
    }
    if let KeyDelivery::Wrapped(wraps) = &mut copy.key {
        for (m, w) in install.members.iter().zip(wraps.iter_mut()) {
            if m.id != *member {
                w.clear();
            }
        }
    }
    copy
}

/// Protects `[dest][msg]` under `keys` (`scratch` is the encoding buffer).
fn seal_body(
    keys: &mut ViewKeys,
    gears: &[GearId],
    dest: u16,
    msg: &Msg,
    scratch: &mut Vec<u8>,
) -> Option<Vec<u8>> {
    scratch.clear();
    scratch.extend_from_slice(&dest.to_be_bytes());
    msg.encode(scratch);
    let mut packet = Vec::with_capacity(scratch.len() + 48);
    keys.seal(gears, scratch, &mut packet).ok()?;
    Some(packet)
}

/// The answers to a NAK for positions `lo..to` from `log`: at most [`NAK_BATCH`] of them.
fn nak_answers(log: &BTreeMap<u64, OrderedMsg>, lo: u64, to: u64) -> Vec<Msg> {
    let end = to.min(lo.saturating_add(NAK_BATCH));
    log.range(lo..end)
        .map(|(order, m)| Msg::Ordered {
            order: *order,
            sender: m.sender,
            seq: m.seq,
            data: m.data.clone(),
        })
        .collect()
}

/// The destination rank of a packet sent to every member.
const BROADCAST: u16 = u16::MAX;

/// Parses a protected body: the destination rank, then the message. A message for another
/// member (a copy replayed to the wrong place) is dropped as unexpected.
fn decode_for(body: &[u8], my_rank: u16, counters: &mut DropCounters) -> Option<Msg> {
    if body.len() < 2 {
        counters.count(Drop::Malformed);
        return None;
    }
    let dest = u16::from_be_bytes([body[0], body[1]]);
    if dest != BROADCAST && dest != my_rank {
        counters.count(Drop::Unexpected);
        return None;
    }
    let msg = Msg::decode(&body[2..]);
    if msg.is_none() {
        counters.count(Drop::Malformed);
    }
    msg
}

/// Splits `members` among up to `degree` children: each child gets the members below it.
fn split_tree(members: &[Member], degree: usize) -> Vec<(Member, Vec<Member>)> {
    let degree = degree.max(1);
    if members.is_empty() {
        return Vec::new();
    }
    let children = degree.min(members.len());
    let mut out = Vec::with_capacity(children);
    // Child i takes a contiguous share: its first member is the child, the rest below it.
    let base = members.len() / children;
    let extra = members.len() % children;
    let mut start = 0;
    for i in 0..children {
        let len = base + usize::from(i < extra);
        let share = &members[start..start + len];
        out.push((share[0], share[1..].to_vec()));
        start += len;
    }
    out
}

impl Machine for GroupMember {
    type Event = GroupEvent;

    fn handle_datagram(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        if self.pairs.kdc() == Some(from) {
            self.pairs.handle_kdc(now, data);
            self.drain_pairs(now);
            return;
        }
        match data.first() {
            Some(&PACKET_VERSION) => self.handle_group_packet(now, from, data),
            Some(k) if *k == self.pairs.kind() => {
                self.pairs.handle_datagram(now, from, data);
                self.drain_pairs(now);
            }
            Some(&GOSSIP_KIND) => self.handle_gossip(now, from, data),
            _ => self.counters.count(Drop::Malformed),
        }
    }

    fn handle_timeout(&mut self, now: Timestamp) {
        self.pairs.handle_timeout(now);
        self.drain_pairs(now);
        self.on_tick(now);
    }

    fn poll_transmit(&mut self, now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
        // Pair-channel traffic first: a joiner's Welcome must not trail the next Flush,
        // which it could not open without the key the Welcome carries.
        if let Some(t) = self.pairs.poll_transmit(now, buf) {
            return Some(t);
        }
        let (to, packet) = self.out.pop_front()?;
        buf.extend_from_slice(&packet);
        Some(Transmit {
            destination: to,
            size: packet.len(),
        })
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        let mut t: Option<Timestamp> = self.pairs.poll_timeout();
        let mut consider = |x: Timestamp| {
            t = Some(t.map_or(x, |y| y.min(x)));
        };
        if let Some(j) = self.joining.as_ref() {
            consider(j.next_try);
        }
        if self.view.is_some() && !self.expelled {
            consider(self.next_heartbeat);
            if self.rank == 0 {
                consider(self.next_gossip);
            }
            if self.rank != 0
                && self.known_end > self.delivered
                && self.flushing.is_none()
                && self.coordinator.is_none()
            {
                // A NAK retry (on_tick sends one, which moves last_nak on).
                let retry = self.config.heartbeat_interval / 8;
                consider(
                    self.last_nak
                        .map_or(self.next_heartbeat, |t| t.saturating_add(retry)),
                );
            }
            if let Some(c) = self.coordinator.as_ref() {
                consider(c.deadline);
                consider(c.resend_at);
            }
        }
        if let Some(a) = self.announce.as_ref() {
            consider(a.resend_at);
        }
        if let Some(tw) = self.tree_wait.as_ref() {
            consider(tw.deadline);
        }
        for o in &self.old_views {
            consider(o.expires);
        }
        t
    }

    fn poll_event(&mut self) -> Option<GroupEvent> {
        self.events.pop_front()
    }
}

impl GroupMember {
    fn drain_pairs(&mut self, now: Timestamp) {
        while let Some(e) = self.pairs.poll_event() {
            match e {
                PairEvent::Established { .. } => {
                    if self
                        .coordinator
                        .as_ref()
                        .is_some_and(|c| c.phase == Phase::Pairing)
                    {
                        self.progress_flush(now);
                    }
                    // A participant whose Install waited for the pair key tries again.
                    if self.flushing.is_some() {
                        self.progress_flush(now);
                    }
                }
                PairEvent::Message {
                    peer,
                    addr,
                    mut data,
                } => {
                    self.handle_pair_msg(now, peer, addr, &data);
                    // Pair messages may carry group keys.
                    data.zeroize();
                }
                PairEvent::Failed { addr, reason } => {
                    if reason.is_kdc() {
                        self.events.push_back(GroupEvent::Refused {
                            addr,
                            reason: reason.as_str(),
                        });
                    }
                    let why = if reason.is_trust() {
                        Drop::Untrusted
                    } else {
                        Drop::PairFailed
                    };
                    self.counters.count(why);
                }
            }
        }
    }
}
