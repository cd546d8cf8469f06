//! The event log checkers read, and the counters beside it.

use crate::node::NodeId;
use cohort_core::Timestamp;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

/// The simulator's number for one sent datagram, in send order from zero. Both copies of a
/// duplicated datagram carry the same number.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PacketId(pub(crate) u64);

impl PacketId {
    /// The number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for PacketId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for PacketId {
    /// `#` and the number, e.g. `#12`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Why a datagram was not delivered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// A fault rule of this name said [`Verdict::Drop`](crate::Verdict::Drop).
    Rule(String),
    /// Sender and destination were in different partition components when it was sent.
    Partition,
    /// A partition cut sender and destination apart while it was in flight.
    PartitionInFlight,
    /// It was larger than [`SimConfig::mtu`](crate::SimConfig::mtu).
    Mtu,
    /// No node has the destination address.
    NoRoute,
    /// The destination was crashed when it arrived.
    Crashed,
}

/// What happened, in a [`LogEntry`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogKind<E> {
    /// The node's `poll_event` returned this.
    Event(E),
    /// The node's `poll_timeout` deadline came and `handle_timeout` was called.
    Timeout,
    /// The node's `poll_transmit` produced a datagram.
    Sent {
        /// Its number.
        packet: PacketId,
        /// Where the node sent it.
        to: SocketAddr,
        /// Its length in bytes.
        len: usize,
    },
    /// The node was handed a datagram (`handle_datagram`).
    Delivered {
        /// Its number.
        packet: PacketId,
        /// The sender's address.
        from: SocketAddr,
        /// Its length in bytes.
        len: usize,
    },
    /// A datagram was lost. The entry's node is the sender when the datagram was dropped as
    /// it was sent, and the destination when it was dropped on arrival
    /// ([`DropReason::PartitionInFlight`], [`DropReason::Crashed`]).
    Dropped {
        /// Its number.
        packet: PacketId,
        /// The sender's address.
        from: SocketAddr,
        /// The destination address.
        to: SocketAddr,
        /// Its length in bytes.
        len: usize,
        /// Why.
        reason: DropReason,
    },
    /// A rule delayed a datagram the node sent.
    Delayed {
        /// Its number.
        packet: PacketId,
        /// The rule that said so.
        rule: String,
        /// Extra delay on top of the link's.
        by: Duration,
    },
    /// A rule held back a datagram the node sent so that later ones overtake it.
    Reordered {
        /// Its number.
        packet: PacketId,
        /// The rule that said so.
        rule: String,
        /// Extra delay on top of the link's.
        by: Duration,
    },
    /// A rule duplicated a datagram the node sent.
    Duplicated {
        /// Its number (both copies carry it).
        packet: PacketId,
        /// The rule that said so.
        rule: String,
        /// How long after the original the copy arrives.
        gap: Duration,
    },
    /// A rule flipped one bit of a datagram the node sent: `bytes[byte] ^= 1 << bit`.
    Tampered {
        /// Its number.
        packet: PacketId,
        /// The rule that said so.
        rule: String,
        /// Index of the byte changed.
        byte: usize,
        /// Bit flipped within that byte, 0 being the least significant.
        bit: u8,
    },
    /// The test put a datagram on the wire to this node with
    /// [`Sim::inject`](crate::Sim::inject) (a replay or a forgery).
    Injected {
        /// Its number.
        packet: PacketId,
        /// The source address it claims.
        from: SocketAddr,
        /// Its length in bytes.
        len: usize,
    },
    /// A partition began; the node can now reach exactly these nodes (itself included).
    Partitioned {
        /// The node's component, in index order.
        component: Vec<NodeId>,
    },
    /// Partitions ended; the node can reach every node.
    Healed,
    /// The node crashed: it receives nothing and its timers stop.
    Crashed,
    /// The node restarted with a fresh machine.
    Restarted,
}

/// One line of the simulator's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry<E> {
    /// Virtual time it happened.
    pub at: Timestamp,
    /// The node it happened at (see [`LogKind`] for datagram drops).
    pub node: NodeId,
    /// What happened.
    pub kind: LogKind<E>,
}

impl<E: fmt::Debug> fmt::Display for LogEntry<E> {
    /// One line, e.g. `t=0.010000s n1 delivered #0 from n0 (5 bytes)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_entry(self, f, |e, f| write!(f, "{e:?}"))
    }
}

/// Writes one log line, showing events with `event`.
pub(crate) fn write_entry<E>(
    entry: &LogEntry<E>,
    f: &mut fmt::Formatter<'_>,
    event: impl Fn(&E, &mut fmt::Formatter<'_>) -> fmt::Result,
) -> fmt::Result {
    write!(f, "{} {} ", entry.at, entry.node)?;
    match &entry.kind {
        LogKind::Event(e) => {
            f.write_str("event ")?;
            event(e, f)
        }
        LogKind::Timeout => write!(f, "timeout"),
        LogKind::Sent { packet, to, len } => {
            write!(f, "sent {packet} to {} ({len} bytes)", Peer(*to))
        }
        LogKind::Delivered { packet, from, len } => {
            write!(f, "delivered {packet} from {} ({len} bytes)", Peer(*from))
        }
        LogKind::Dropped {
            packet,
            from,
            to,
            len,
            reason,
        } => write!(
            f,
            "dropped {packet} {} -> {} ({len} bytes): {reason:?}",
            Peer(*from),
            Peer(*to)
        ),
        LogKind::Delayed { packet, rule, by } => {
            write!(f, "{rule}: delayed {packet} by {by:?}")
        }
        LogKind::Reordered { packet, rule, by } => {
            write!(f, "{rule}: held back {packet} by {by:?}")
        }
        LogKind::Duplicated { packet, rule, gap } => {
            write!(f, "{rule}: duplicated {packet}, copy {gap:?} later")
        }
        LogKind::Tampered {
            packet,
            rule,
            byte,
            bit,
        } => {
            write!(
                f,
                "{rule}: tampered {packet}, flipped bit {bit} of byte {byte}"
            )
        }
        LogKind::Injected { packet, from, len } => {
            write!(f, "injected {packet} from {} ({len} bytes)", Peer(*from))
        }
        LogKind::Partitioned { component } => write!(f, "partitioned: reaches {component:?}"),
        LogKind::Healed => write!(f, "healed"),
        LogKind::Crashed => write!(f, "crashed"),
        LogKind::Restarted => write!(f, "restarted"),
    }
}

/// An address shown as its node when it is one.
struct Peer(SocketAddr);

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match NodeId::from_addr(self.0) {
            Some(id) => write!(f, "{id}"),
            None => write!(f, "{}", self.0),
        }
    }
}

/// Running totals, kept whether or not datagrams are logged
/// ([`SimConfig::log_packets`](crate::SimConfig::log_packets)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Datagrams the nodes sent.
    pub sent: u64,
    /// Datagrams handed to a node (a duplicated datagram counts twice; injected ones count).
    pub delivered: u64,
    /// Datagrams a fault rule dropped.
    pub dropped_by_rule: u64,
    /// Datagrams a partition dropped, at send time or in flight.
    pub dropped_by_partition: u64,
    /// Datagrams larger than the MTU.
    pub dropped_mtu: u64,
    /// Datagrams to an address no node has.
    pub dropped_no_route: u64,
    /// Datagrams that arrived at a crashed node.
    pub dropped_crashed: u64,
    /// Datagrams a rule delayed.
    pub delayed: u64,
    /// Datagrams a rule held back behind later ones.
    pub reordered: u64,
    /// Datagrams a rule duplicated.
    pub duplicated: u64,
    /// Datagrams a rule tampered with.
    pub tampered: u64,
    /// Datagrams the test injected.
    pub injected: u64,
    /// Calls to `handle_timeout`.
    pub timeouts: u64,
    /// Events the nodes reported.
    pub events: u64,
    /// Steps taken (deliveries and timeouts processed).
    pub steps: u64,
}

impl Counters {
    /// Datagrams dropped for any reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_by_rule
            + self.dropped_by_partition
            + self.dropped_mtu
            + self.dropped_no_route
            + self.dropped_crashed
    }
}
