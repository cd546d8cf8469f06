//! The group member state machine: one [`GroupMember`] behind the `Machine` interface,
//! with one file per concern. See the crate README for the protocol walk-through.
//!
//! `GroupMember` (this file) keeps what every concern shares: who this member is, its
//! config, the installed view with its rank and keys, the kept old views, the pair
//! channels, and the output queues (`out`, `events`, `counters`). Each concern owns its
//! own state in a struct of its own and is handed the rest through `self`:
//!
//! ```text
//!  datagram ─> mod.rs (Machine) ─> receive.rs: header, keys, dispatch
//!                 │                   │ Submit/Orders/Ordered/Nak   ─> reliable.rs  (Reliable)
//!                 │                   │ Heartbeat                   ─> heartbeat.rs (Liveness)
//!                 │                   │ Flush/FlushOk/KeyShare/Ack  ─> flush.rs (ViewChange),
//!                 │                   │                                key_tree.rs (KeyTree)
//!                 │                   │ Install                     ─> install.rs
//!                 │                   │ gossip (Id, ticket)         ─> heal.rs (Heal)
//!                 │                   └ pair: Join/Welcome/Grant/Present ─> join.rs
//!                 │                                                       (Joining, Admission)
//!  timeout ─> timers.rs: the tick, each concern's deadlines (interval::*)
//!  app ─> mod.rs: send, rekey, leave; trust.rs: set_trust
//!  every concern ─> output.rs: seal under the view's keys ─> out ─> poll_transmit
//! ```
//!
//! A view change runs one way through the files: `flush.rs` (want, coordinate, Flush,
//! FlushOk, fetch) ─> `key_tree.rs` (tree rekey only) ─> `install.rs` (Install, install
//! the view and key) ─> `reliable.rs` starts the new view's channel.

use crate::channels::Pairs;
use crate::config::{AuthMode, ConfigError, ConfigField, GroupConfig, Protection};
use crate::event::{Channel, Drop, DropCounters, GroupEvent, RemovalReason, SendError, Status};
use crate::exchange::GOSSIP_KIND;
use crate::id::{Member, MemberId, View, ViewId};
use crate::kdc_pair::{KdcCredentials, KdcPairTable};
use crate::keys::{GearPlan, GroupKey, ViewKeys};
use crate::pair::PairTable;
use crate::traffic::Traffic;
use crate::wire::Msg;
use cohort_channel::identity::Identity;
use cohort_core::{Machine, Timestamp, Transmit};
use cohort_crypto::CryptoProvider;
use cohort_gears::controller::{Controller, ControllerConfig};
use cohort_gears::PACKET_VERSION;
use flush::ViewChange;
use heal::Heal;
use heartbeat::Liveness;
use join::Admission;
use join::Joining;
use key_tree::KeyTree;
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use reliable::Reliable;
use reliable::{OrderedMsg, Pending};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

mod flush;
mod heal;
mod heartbeat;
mod install;
mod join;
pub use join::PRESENT_WITNESSES;
mod key_tree;
mod lkh;
mod output;
pub use output::Destination;
mod overlay;
mod receive;
mod reliable;
mod timers;
mod tree_flush;
mod trust;

/// Most members a view admits: 65,535. Ranks are `u16` and `u16::MAX` is the broadcast
/// destination, so ranks run 0..=65,534. Installs carry only the change (delta Installs)
/// and a member list travels in parts, so no datagram bounds it any more; what bounds it
/// in practice is memory: each member holds the list (about 70 bytes a member with its
/// index and incarnation), its view's per-sender key slots and the sequencer's per-member
/// state at the leader, a few hundred bytes per member of the view in all.
pub const MAX_VIEW_MEMBERS: usize = u16::MAX as usize;

/// Most members remembered from past views (for healing partitions): the most recent.
const MAX_KNOWN: usize = 1024;

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
    /// Members seen leaving a view (at most `MAX_KNOWN`, the most recent) and, with
    /// `contacts`, where a leader looks for other components of the group. Members of the
    /// current view are not copied here: they are in the view.
    known: BTreeMap<MemberId, SocketAddr>,
    /// The order `known` was filled in, to forget the oldest first.
    known_order: VecDeque<MemberId>,
    contacts: Vec<SocketAddr>,
    /// The leader's side of healing partitions (`heal.rs`).
    heal: Heal,
    /// Who may be let in (`join.rs`).
    admission: Admission,
    /// A view change wanted, coordinated or taken part in (`flush.rs`).
    view_change: ViewChange,
    /// Principals seen leaving a view of their own accord. No Exchange runs with them (a
    /// ticket would hand them the key drawn to keep them out): they come back by joining,
    /// which draws a fresh key. (Members removed as untrusted get nothing either, by trust;
    /// members removed as suspected or lagging did not choose to go, and a partitioned or
    /// slow member merges back by Exchange like any component.) At most 4096.
    departed: BTreeSet<MemberId>,
    /// The leader this member stopped trusting and left to go on alone, and its address.
    /// Once this member trusts it again, it comes back the way a member that left does, by
    /// joining: its component dissolves into the group at that address (`trust.rs`). (That
    /// group saw it leave, so it refuses Exchange with it; without this it never got back.)
    went_alone_from: Option<(MemberId, SocketAddr)>,
    incarnation: u64,
    /// Incarnations of the view's members, by rank.
    incarnations: Arc<[u64]>,
    /// The current view's member list encoded for members that fetch it (built once per
    /// view, at the coordinator when it sends the Install or on the first request).
    roster_bytes: Option<(ViewId, Arc<Vec<u8>>)>,
    /// The buffer of a replaced `roster_bytes`, for the next Install this member sends
    /// (`send_install`): reused instead of allocated afresh.
    roster_spare: Vec<u8>,
    /// Largest part of an Install, Welcome or member list (`wire::MAX_PART_LEN`; lower in
    /// tests, to split small groups' messages).
    part_limit: usize,
    expelled: bool,
    view: Option<View>,
    rank: u16,
    keys: Option<ViewKeys>,
    old_views: Vec<OldView>,
    group_key: Option<GroupKey>,
    key_ledger: Vec<(u64, [u8; 8])>,
    last_rekey: Timestamp,

    /// The reliable channel in this view (`reliable.rs`).
    reliable: Reliable,
    next_unreliable: u64,
    delivered_unreliable: u64,

    /// Heartbeats (`heartbeat.rs`).
    liveness: Liveness,
    /// This member's place in a tree rekey (`key_tree.rs`).
    tree: KeyTree,
    /// The LKH key tree and this member's path (`lkh.rs`).
    lkh: lkh::LkhState,
    leaving: Option<Timestamp>,

    load: f32,
    out: output::Outbox,
    events: VecDeque<GroupEvent>,
    counters: DropCounters,
    /// Datagrams received, by kind.
    traffic: Traffic,
    insecure_reported: HashMap<SocketAddr, Timestamp>,
    scratch: Vec<u8>,
    /// Where a packet under the current view's keys is opened, kept from packet to packet.
    received: Vec<u8>,
}

/// A copy of a member, for the fuzz harnesses only (`fuzzing` feature): `TestGroup` forms a
/// group once and hands each input a copy. Not `Clone` in ordinary builds: a copy would hold
/// the group key and seal with the same keys and sequence numbers as the original.
///
/// The copy is deep: its random generator is in the original's state (so it draws what the
/// original would), and its pair channels' endpoint caches (tickets, ephemeral key, the
/// server's resumption cache and nonce generator) are copies, not handles to the
/// original's (see `PairTable::fork`). `None` for a KDC-mode member (its pair keys are
/// provider key objects that cannot be copied).
#[cfg(feature = "fuzzing")]
impl GroupMember {
    /// The identity-mode pair table (`None` in KDC mode): for the test of [`fork`](Self::fork).
    pub fn pair_table(&self) -> Option<&PairTable> {
        match &self.pairs {
            Pairs::Identity(t) => Some(t),
            Pairs::Kdc(_) => None,
        }
    }

    /// A deep copy; see above.
    pub fn fork(&self) -> Option<GroupMember> {
        Some(GroupMember {
            provider: self.provider,
            identity: self.identity.clone(),
            id: self.id,
            addr: self.addr,
            config: self.config.clone(),
            plan: self.plan.clone(),
            controller: self.controller.clone(),
            rng: self.rng.clone(),
            pairs: self.pairs.fork()?,
            joining: self.joining.clone(),
            known: self.known.clone(),
            known_order: self.known_order.clone(),
            contacts: self.contacts.clone(),
            heal: self.heal.clone(),
            admission: self.admission.clone(),
            view_change: self.view_change.clone(),
            departed: self.departed.clone(),
            went_alone_from: self.went_alone_from,
            incarnation: self.incarnation,
            incarnations: Arc::clone(&self.incarnations),
            roster_bytes: self.roster_bytes.clone(),
            roster_spare: Vec::new(),
            part_limit: self.part_limit,
            expelled: self.expelled,
            view: self.view.clone(),
            rank: self.rank,
            keys: self.keys.clone(),
            old_views: self.old_views.clone(),
            group_key: self.group_key.clone(),
            key_ledger: self.key_ledger.clone(),
            last_rekey: self.last_rekey,
            reliable: self.reliable.clone(),
            next_unreliable: self.next_unreliable,
            delivered_unreliable: self.delivered_unreliable,
            liveness: self.liveness.clone(),
            tree: self.tree.clone(),
            lkh: self.lkh.clone(),
            leaving: self.leaving,
            load: self.load,
            out: self.out.clone(),
            events: self.events.clone(),
            counters: self.counters,
            traffic: self.traffic.clone(),
            insecure_reported: self.insecure_reported.clone(),
            scratch: self.scratch.clone(),
            received: self.received.clone(),
        })
    }
}

/// A previous view kept for its grace window: its keys, members and log answer late NAKs
/// and accept late unreliable traffic.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
struct OldView {
    view: View,
    keys: ViewKeys,
    log: BTreeMap<u64, OrderedMsg>,
    expires: Timestamp,
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

    pub(super) fn assemble(
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
            known_order: VecDeque::new(),
            contacts: Vec::new(),
            departed: BTreeSet::new(),
            went_alone_from: None,
            incarnation: 0,
            incarnations: Arc::from(Vec::new()),
            roster_bytes: None,
            roster_spare: Vec::new(),
            part_limit: crate::wire::MAX_PART_LEN,
            expelled: false,
            view: None,
            rank: 0,
            keys: None,
            old_views: Vec::new(),
            group_key: None,
            key_ledger: Vec::new(),
            last_rekey: Timestamp::ZERO,
            next_unreliable: 0,
            delivered_unreliable: 0,
            leaving: None,
            heal: Heal::default(),
            admission: Admission::default(),
            reliable: Reliable::default(),
            liveness: Liveness::default(),
            view_change: ViewChange::default(),
            tree: KeyTree::default(),
            lkh: lkh::LkhState::default(),
            load: 0.0,
            out: output::Outbox::default(),
            events: VecDeque::new(),
            counters: DropCounters::default(),
            traffic: Traffic::default(),
            insecure_reported: HashMap::new(),
            scratch: Vec::new(),
            received: Vec::new(),
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
                let msg = Msg::Unreliable {
                    seq,
                    data: data.to_vec(),
                };
                self.broadcast(&msg);
                self.deliver_unreliable(self.id, seq, data.to_vec());
                Ok(seq)
            }
            Channel::Reliable => {
                if self.reliable.pending.len() >= self.config.send_window {
                    return Err(SendError::WindowFull);
                }
                let seq = self.reliable.next_reliable;
                self.reliable.next_reliable += 1;
                self.reliable.pending.push_back(Pending {
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
            self.view_change.rekey_wanted.get_or_insert(now);
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
            self.view_change
                .change_wanted
                .push((self.id, RemovalReason::Left));
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
            changing_view: self.view_change.flushing.is_some()
                || self.view_change.coordinator.is_some(),
            delivered_reliable: self.reliable.delivered_reliable,
            delivered_unreliable: self.delivered_unreliable,
            pending: self.reliable.pending.len(),
            gear: self.current_gear().name(),
            dropped: self.counters,
            key_fingerprint: self.key_fingerprint().map(hex::encode),
        }
    }

    /// Fingerprints of the keys this member took from another component's leader through an
    /// Exchange (it coordinated the empty view change that installed them).
    pub fn exchanged_keys(&self) -> &[[u8; 8]] {
        &self.heal.exchanged
    }

    /// KDC mode: how many valid join tokens (LSGC message 5) were presented to this member.
    pub fn tokens_checked(&self) -> u64 {
        self.admission.tokens_checked
    }

    /// Dropped packets by reason.
    pub fn counters(&self) -> &DropCounters {
        &self.counters
    }

    /// Datagrams received, by kind: each group message type (counted once its packet
    /// opened), pair-channel datagrams and gossip.
    pub fn traffic(&self) -> &Traffic {
        &self.traffic
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
            self.view_change.flushing.as_ref().map(|f| (f.proposal.to_string(), f.coordinator, f.install.is_some())),
            self.view_change.coordinator.as_ref().map(|c| (c.proposal.to_string(), c.phase, c.survivors.clone(), c.survivors.iter().copied().filter(|r| c.has_answered(*r)).collect::<Vec<_>>())),
            self.liveness.leader_heard,
            self.reliable.pending.len(),
            self.reliable.delivered,
        )
    }

    /// Test knob: splits Installs, Welcomes and member lists into parts of at most `limit`
    /// bytes (at least 64; at most `wire::MAX_PART_LEN`, the default), so that tests see
    /// small groups' messages in parts.
    #[doc(hidden)]
    pub fn set_part_limit_for_tests(&mut self, limit: usize) {
        self.part_limit = limit.clamp(64, crate::wire::MAX_PART_LEN);
    }

    /// Test hook: the group key this member holds now, its epoch and bytes, so that a test
    /// can search what a carrier or broker saw for it. For tests only; `danger` because it
    /// hands out the key.
    #[doc(hidden)]
    pub fn danger_group_key_for_tests(&self) -> Option<(u64, zeroize::Zeroizing<Vec<u8>>)> {
        self.group_key
            .as_ref()
            .map(|k| (k.epoch, zeroize::Zeroizing::new(k.expose().to_vec())))
    }

    /// The fingerprint of the key the current view uses, if any.
    pub fn key_fingerprint(&self) -> Option<[u8; 8]> {
        self.group_key
            .as_ref()
            .map(|k| k.fingerprint(&self.provider))
    }

    pub(super) fn is_leader(&self) -> bool {
        self.view.is_some() && self.rank == 0 && !self.expelled
    }

    pub(super) fn others(&self) -> impl Iterator<Item = &Member> + '_ {
        let me = self.id;
        self.view
            .iter()
            .flat_map(|v| v.members.iter())
            .filter(move |m| m.id != me)
    }

    /// Remembers a member that left a view (for healing), forgetting the oldest beyond
    /// `MAX_KNOWN`.
    pub(super) fn remember_departed(&mut self, id: MemberId, addr: SocketAddr) {
        if self.known.insert(id, addr).is_none() {
            self.known_order.push_back(id);
        }
        while self.known.len() > MAX_KNOWN {
            match self.known_order.pop_front() {
                Some(old) => {
                    self.known.remove(&old);
                }
                None => break,
            }
        }
    }

    /// Addresses of the current view's other members and of the members remembered from
    /// past views: every pair channel this member may hold.
    pub(super) fn known_addrs(&self) -> Vec<SocketAddr> {
        self.others()
            .map(|m| m.addr)
            .chain(self.known.values().copied())
            .collect()
    }

    pub(super) fn member_at(&self, rank: u16) -> Option<Member> {
        self.view
            .as_ref()
            .and_then(|v| v.members.get(usize::from(rank)).copied())
    }
}

impl GroupMember {
    /// As [`Machine::poll_transmit`], for drivers whose carrier fans out
    /// (`GroupConfig::carrier_fans_out`): a packet for every other member comes once, as
    /// [`Destination::Group`], to be published once. Writes the packet into `buf` and
    /// returns where it goes and its size. Call it where `poll_transmit` would be called.
    pub fn poll_transmit_to(
        &mut self,
        now: Timestamp,
        buf: &mut Vec<u8>,
    ) -> Option<(Destination, usize)> {
        if let Some(t) = self.pairs.poll_transmit(now, buf) {
            return Some((Destination::Member(t.destination), t.size));
        }
        self.out.pop_into(buf)
    }
}

impl Machine for GroupMember {
    type Event = GroupEvent;

    fn handle_datagram(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        if self.pairs.kdc() == Some(from) {
            self.traffic.kdc(data.len());
            self.pairs.handle_kdc(now, data);
            self.drain_pairs(now);
            return;
        }
        match data.first() {
            Some(&PACKET_VERSION) => self.handle_group_packet(now, from, data),
            Some(k) if *k == self.pairs.kind() => {
                self.traffic.pair(data.len());
                self.pairs.handle_datagram(now, from, data);
                self.drain_pairs(now);
            }
            Some(&GOSSIP_KIND) => {
                self.traffic.gossip(data.len());
                self.handle_gossip(now, from, data)
            }
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
        // This driver cannot fan out: a group entry becomes one entry per other member,
        // sharing its bytes. A group entry with no other member goes nowhere; the entries
        // after it still go.
        loop {
            match self.out.front()? {
                Destination::Member(to) => {
                    let (_, size) = self.out.pop_into(buf)?;
                    return Some(Transmit {
                        destination: to,
                        size,
                    });
                }
                Destination::Group => {
                    let others: Vec<SocketAddr> = self.others().map(|m| m.addr).collect();
                    self.out.fan_out_front(&others);
                }
            }
        }
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        self.next_timeout()
    }

    fn poll_event(&mut self) -> Option<GroupEvent> {
        self.events.pop_front()
    }
}
