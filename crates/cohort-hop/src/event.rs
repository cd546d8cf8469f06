//! What endpoints and relays report: events for the application, counters for operators.

use crate::config::Mode;
use crate::guard::Refusal;
use cohort_channel::identity::PublicKey;
use std::net::SocketAddr;

/// An association's id within a pair: 1 to 0x7fff (0 is the control association).
pub type AssocId = u16;

/// What an [`crate::Endpoint`] reports to its application.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EndpointEvent {
    /// The handshake with `peer` completed; its key signed the anchors.
    Connected {
        /// The peer's overlay address.
        peer: SocketAddr,
        /// The peer's Ed25519 key.
        key: PublicKey,
    },
    /// A handshake gave up (no answer, or the peer is not trusted).
    ConnectFailed {
        /// The peer.
        peer: SocketAddr,
        /// Why.
        reason: &'static str,
    },
    /// The pair with `peer` ended: nothing we sent was answered for `dead_after` (a relay
    /// or the peer restarted, or the path broke), or the peer restarted and sent a new
    /// handshake. Every association with it is gone (messages still queued are dropped).
    /// A new handshake is under way, ours or the peer's; [`EndpointEvent::Connected`]
    /// follows when it completes, and associations must be opened again.
    Disconnected {
        /// The peer.
        peer: SocketAddr,
        /// Why.
        reason: &'static str,
    },
    /// An association is open: outgoing (ours) or incoming (the peer's).
    Opened {
        /// The peer.
        peer: SocketAddr,
        /// The association.
        assoc: AssocId,
        /// Whether we send on it.
        outgoing: bool,
        /// Its mode.
        mode: Mode,
    },
    /// An association was closed by either end.
    Closed {
        /// The peer.
        peer: SocketAddr,
        /// The association.
        assoc: AssocId,
        /// Whether we sent on it.
        outgoing: bool,
    },
    /// A message arrived and verified.
    Received {
        /// The peer.
        peer: SocketAddr,
        /// The association it came on.
        assoc: AssocId,
        /// The message.
        data: Vec<u8>,
    },
    /// An A2 delivery report for one of our rounds.
    Report {
        /// The peer.
        peer: SocketAddr,
        /// Our association.
        assoc: AssocId,
        /// The round.
        round: u32,
        /// Whether every message of the round arrived.
        delivered: bool,
    },
    /// A chain was replaced by a renewed one (`outgoing`: our signature chain; otherwise our
    /// acknowledgment chain for the peer's association).
    Renewed {
        /// The peer.
        peer: SocketAddr,
        /// The association.
        assoc: AssocId,
        /// Which side's flow.
        outgoing: bool,
    },
    /// A round's S1 went unanswered `max_retries` times (said once per round). The
    /// association waits: it is still sent again (every 2 s at most), because moving on
    /// without its A1 would let a forger finish the round.
    Stalled {
        /// The peer.
        peer: SocketAddr,
        /// Our association.
        assoc: AssocId,
        /// The round.
        round: u32,
    },
}

/// What a [`crate::Relay`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RelayEvent {
    /// A signed handshake passed: the relay now verifies this pair's traffic.
    PairLearned {
        /// Initiator's address.
        initiator: SocketAddr,
        /// Responder's address.
        responder: SocketAddr,
    },
}

macro_rules! counters {
    ($($(#[doc = $doc:literal])+ $name:ident,)*) => {
        /// Packets by fate. Everything from the network that is not used is counted in
        /// exactly one of the drop counters.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct HopCounters {
            $($(#[doc = $doc])+ pub $name: u64,)*
        }

        impl HopCounters {
            /// Every counter with its name, in a fixed order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$((stringify!($name), self.$name)),*].into_iter()
            }
        }
    };
}

counters! {
    /// Data packets that verified (S1, A1, S2, A2), at this hop.
    verified,
    /// Packets a relay forwarded.
    forwarded,
    /// Messages delivered to the application.
    delivered,
    /// Unprotected messages passed on or delivered without any check.
    unprotected,
    /// Drops: not a well-formed packet.
    malformed,
    /// Drops: no pair or flow with that id here.
    unknown,
    /// Drops: a chain element, MAC, Merkle path, signature or report that does not verify.
    forged,
    /// Drops: a message, ack or report seen before.
    replayed,
    /// Drops: a round too old (evicted, or its key may already be public) or too far ahead.
    stale,
    /// Drops: an S2 whose round this hop has not seen acknowledged, so it cannot be verified.
    unverifiable,
    /// Drops: a handshake with a bad, expired or missing cookie.
    bad_cookie,
    /// Drops: a handshake from a key that is not trusted.
    untrusted,
    /// Tables full: handshakes refused (endpoint), or the oldest pair evicted (relay).
    no_room,
    /// Drops: an outgoing message did not fit the association's queue.
    queue_full,
    /// Pairs a relay forgot after `pair_idle` without a verified packet.
    expired,
}

impl HopCounters {
    /// Counts a packet that a flow's checks refused, under its reason.
    pub(crate) fn count_refusal(&mut self, refusal: Refusal) {
        match refusal {
            Refusal::Malformed => self.malformed += 1,
            Refusal::Forged => self.forged += 1,
            Refusal::Replayed => self.replayed += 1,
            Refusal::Stale => self.stale += 1,
            Refusal::Unverifiable => self.unverifiable += 1,
            Refusal::Unknown => self.unknown += 1,
        }
    }
}
