//! What a member reports to its application, and the counters it keeps.

use crate::id::{MemberId, View, ViewId};
use std::net::SocketAddr;
use std::time::Duration;

/// Which of the group's two channels a message travels on (LSGC sections 1-2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Channel {
    /// Atomic, totally ordered, per-sender FIFO, virtually synchronous.
    Reliable,
    /// Best effort: may be lost, duplicated never, reordered; encrypted all the same.
    Unreliable,
}

impl Channel {
    /// `"reliable"` or `"unreliable"`.
    pub fn name(self) -> &'static str {
        match self {
            Channel::Reliable => "reliable",
            Channel::Unreliable => "unreliable",
        }
    }
}

/// Why a member left a view without leaving on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RemovalReason {
    /// It asked to leave.
    Left,
    /// It stopped answering (heartbeats, flush or rekey).
    Suspected,
    /// Its acknowledgements fell beyond the sequencer's backlog.
    Lagged,
    /// The coordinator's trust policy does not (or no longer) list it.
    Untrusted,
}

impl RemovalReason {
    /// A short lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            RemovalReason::Left => "left",
            RemovalReason::Suspected => "suspected",
            RemovalReason::Lagged => "lagged",
            RemovalReason::Untrusted => "untrusted",
        }
    }
}

/// An event for the application.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum GroupEvent {
    /// A view is installed: from now on messages are sent and delivered in it.
    View(View),
    /// A message delivered.
    Deliver {
        /// The channel it came on.
        channel: Channel,
        /// Who sent it.
        sender: MemberId,
        /// The view it was delivered in.
        view: ViewId,
        /// The sender's message number: unique per sender and channel for the member's
        /// lifetime, increasing in send order (the reliable channel delivers each sender's
        /// messages in this order).
        seq: u64,
        /// Reliable channel: the message's position in the view's total order (0, 1, ...);
        /// unreliable: `None`.
        order: Option<u64>,
        /// The payload.
        data: Vec<u8>,
    },
    /// A fresh group key was distributed and installed with a view.
    Rekeyed {
        /// The new key epoch.
        key_epoch: u64,
        /// Members that received it.
        members: usize,
        /// From the coordinator's decision to rekey until this member installed the key
        /// (known exactly at the coordinator; elsewhere `None`).
        took: Option<Duration>,
    },
    /// Members were removed by the view just installed (reported by the survivors).
    Removed {
        /// Who.
        member: MemberId,
        /// Why, as far as the coordinator knew.
        reason: RemovalReason,
    },
    /// This member is no longer in the group: it left, or the others removed it (for example
    /// because it fell behind the backlog). It may join again.
    Expelled {
        /// Why.
        reason: RemovalReason,
    },
    /// A packet of this group under a key this member does not hold, from an address not in
    /// its view: possibly another component of a partitioned group (the merge protocol's
    /// input). Reported at most once per address per second.
    Insecure {
        /// Where it came from.
        from: SocketAddr,
    },
    /// Exchange: this leader sealed its group key to the leader of another component that
    /// holds another key (and that it trusts), so that the two can merge. In KDC mode the
    /// ticket is queued on the pair channel to that leader, which may never open (say, for
    /// a principal the KDC does not know): the key goes nowhere then.
    TicketSent {
        /// The other component's leader.
        to: MemberId,
    },
    /// Exchange: this component took the group key of another component's leader (through
    /// an empty view change, which this member coordinated). The components merge next.
    KeyExchanged {
        /// The leader that handed its key over.
        from: MemberId,
        /// The key's epoch (the other component's numbering).
        key_epoch: u64,
        /// A rekey had been asked for and is dropped: the Exchange completed first
        /// (Ensemble's appendix 12.1). Ask again to rekey the merged group.
        rekey_dropped: bool,
    },
    /// Heal: this component holds the same key as a larger one, and dissolves into it (its
    /// members join the leader at `into`, proving they hold the key, so that with identity
    /// keys the merge needs no fresh key; KDC mode gives every view a fresh key anyway).
    Merging {
        /// The larger component's leader.
        leader: MemberId,
        /// Where it is.
        into: SocketAddr,
    },
    /// KDC mode: a pair channel failed because of the KDC. At a leader: "the KDC does not
    /// know this principal" (the joiner at `addr` is not registered), or "the KDC did not
    /// answer", or the KDC's unauthenticated hint that it does not know this member. At a
    /// joiner: the leader's unauthenticated hint that the KDC does not know it.
    Refused {
        /// The other side.
        addr: SocketAddr,
        /// Why.
        reason: &'static str,
    },
    /// This member's trust policy changed (`GroupMember::set_trust`).
    TrustChanged {
        /// Principals trusted now.
        trusted: usize,
        /// Members of the current view no longer trusted (the leader removes them with a
        /// rekey; a member that no longer trusts its leader leaves and goes on alone).
        untrusted_members: Vec<MemberId>,
    },
}

/// Why a packet was dropped, for [`DropCounters`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Drop {
    /// Too short, unknown version or kind, bad lengths.
    Malformed,
    /// Another group's packet.
    OtherGroup,
    /// Under a key this member does not hold (another component, a future view, or an old
    /// view past its grace window).
    KeyNotHeld,
    /// A tag or AEAD failed.
    AuthFailed,
    /// Seen before (or too old for the replay window).
    Replayed,
    /// Authenticated but not from a member of the view it claims, or out of protocol.
    Unexpected,
    /// A pair-channel or join packet from a principal outside the trust list.
    Untrusted,
    /// A pair channel failed for another reason (handshake failure or timeout).
    PairFailed,
}

impl Drop {
    /// Every reason, in the order of the counters.
    pub const ALL: [Drop; 8] = [
        Drop::Malformed,
        Drop::OtherGroup,
        Drop::KeyNotHeld,
        Drop::AuthFailed,
        Drop::Replayed,
        Drop::Unexpected,
        Drop::Untrusted,
        Drop::PairFailed,
    ];

    /// A short snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            Drop::Malformed => "malformed",
            Drop::OtherGroup => "other_group",
            Drop::KeyNotHeld => "key_not_held",
            Drop::AuthFailed => "auth_failed",
            Drop::Replayed => "replayed",
            Drop::Unexpected => "unexpected",
            Drop::Untrusted => "untrusted",
            Drop::PairFailed => "pair_failed",
        }
    }
}

/// Dropped packets by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropCounters([u64; 8]);

impl DropCounters {
    /// Counts one drop.
    pub fn count(&mut self, reason: Drop) {
        let i = Drop::ALL.iter().position(|r| *r == reason).unwrap_or(0);
        self.0[i] = self.0[i].saturating_add(1);
    }

    /// Drops for `reason`.
    pub fn get(&self, reason: Drop) -> u64 {
        let i = Drop::ALL.iter().position(|r| *r == reason).unwrap_or(0);
        self.0[i]
    }

    /// All drops.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// `(name, count)` for every reason.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Drop::ALL.iter().map(|r| (r.name(), self.get(*r)))
    }
}

/// Why [`GroupMember::send`](crate::GroupMember::send) refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendError {
    /// Not in a view yet (or no longer).
    NotInGroup,
    /// The reliable send window is full: wait for deliveries of own messages.
    WindowFull,
    /// Longer than the configured largest message.
    TooLong,
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SendError::NotInGroup => "not in a group view",
            SendError::WindowFull => "reliable send window full",
            SendError::TooLong => "message longer than max_message_len",
        })
    }
}

impl std::error::Error for SendError {}

/// A member's state at a glance, for `status` commands.
#[derive(Clone, Debug, PartialEq)]
pub struct Status {
    /// The installed view, if any.
    pub view: Option<View>,
    /// Whether a view change is under way.
    pub changing_view: bool,
    /// Reliable messages delivered in the current view.
    pub delivered_reliable: u64,
    /// Unreliable messages delivered in the current view.
    pub delivered_unreliable: u64,
    /// Own reliable messages not yet delivered.
    pub pending: usize,
    /// The gear this member currently sends with.
    pub gear: &'static str,
    /// Dropped packets by reason.
    pub dropped: DropCounters,
    /// The group key's public fingerprint (two members hold one key if and only if these
    /// match), hex.
    pub key_fingerprint: Option<String>,
}
