//! What the endpoint keeps per peer: the handshake state, the associations both ways, the
//! control messages awaiting an answer, the last renewals and the measured round trip. Owns
//! the `Peer` record and its small derived values (directions, handshake header); the
//! handshake, control and timer files change it. Must not send or queue packets.

use crate::event::AssocId;
use crate::flow::{OwnChain, RecvFlow, SendFlow};
use crate::resend::Resend;
use crate::wire::{HandshakeHeader, PairId, FLOW_FROM_RESPONDER};
use cohort_channel::identity::PublicKey;
use cohort_core::Timestamp;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

/// Where a pair's handshake stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PeerState {
    /// Initiator: Hello sent, waiting for the Challenge.
    Hello,
    /// Initiator: SYN sent, waiting for the ACK.
    Syn,
    /// Responder: ACK sent, waiting for the ACKACK.
    AckSent,
    /// Both sides hold each other's signed anchors.
    Established,
    /// Gave up.
    Failed,
}

/// A control message waiting for the peer's answer.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct PendingControl {
    /// What answers it: (answer code, flow, which chain, start round).
    pub(super) answer: (u8, u16, u8, u32),
    pub(super) bytes: Vec<u8>,
    pub(super) resend: Resend,
    /// Sent as a signed packet rather than on the control association.
    pub(super) signed: bool,
    /// When it was first sent (the peer counts as dead when it stays unanswered for
    /// `dead_after`).
    pub(super) since: Timestamp,
}

#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct Peer {
    pub(super) addr: SocketAddr,
    pub(super) next_hop: SocketAddr,
    pub(super) pair_id: PairId,
    pub(super) initiator: bool,
    pub(super) state: PeerState,
    pub(super) key: Option<PublicKey>,
    /// The last handshake packet we sent, for retransmission (and our signed part).
    pub(super) handshake: Vec<u8>,
    /// When it was last sent and how often again.
    pub(super) handshake_resend: Resend,
    /// Our signature on the last handshake packet we signed (binds the next one).
    pub(super) our_signature: Vec<u8>,
    /// Our control chains until the handshake completes: signature chain, ack chain.
    pub(super) pending_control: Option<(OwnChain, OwnChain)>,
    pub(super) out_flows: BTreeMap<AssocId, SendFlow>,
    pub(super) in_flows: BTreeMap<AssocId, RecvFlow>,
    pub(super) next_assoc: AssocId,
    pub(super) controls: Vec<PendingControl>,
    /// The last Renew sent for each (flow, which chain): sent again when a flow stalls, in
    /// case a relay on the path missed it (a replayed copy may have reached the peer).
    pub(super) renewals: HashMap<(u16, u8), Vec<u8>>,
    pub(super) srtt: Option<Duration>,
    /// When this pair was created here: a SYN whose cookie is older cannot replace it.
    pub(super) created: Timestamp,
    /// Since when we have been trying to get this peer back after its pair died (a
    /// reconnection: no give-up after `max_retries`, a fresh attempt every
    /// `ATTEMPT`, until `reconnect_for`). `None` for a first connection or a responder.
    pub(super) reconnecting: Option<Timestamp>,
}

impl Peer {
    /// A pair just created at `now`: no key, no handshake packet, no flows yet.
    pub(super) fn new(
        addr: SocketAddr,
        next_hop: SocketAddr,
        pair_id: PairId,
        initiator: bool,
        state: PeerState,
        now: Timestamp,
    ) -> Peer {
        Peer {
            addr,
            next_hop,
            pair_id,
            initiator,
            state,
            key: None,
            handshake: Vec::new(),
            handshake_resend: Resend::new(now),
            our_signature: Vec::new(),
            pending_control: None,
            out_flows: BTreeMap::new(),
            in_flows: BTreeMap::new(),
            next_assoc: 1,
            controls: Vec::new(),
            renewals: HashMap::new(),
            srtt: None,
            created: now,
            reconnecting: None,
        }
    }

    pub(super) fn my_dir(&self) -> u16 {
        if self.initiator {
            0
        } else {
            FLOW_FROM_RESPONDER
        }
    }

    pub(super) fn their_dir(&self) -> u16 {
        self.my_dir() ^ FLOW_FROM_RESPONDER
    }

    pub(super) fn header(&self, local: SocketAddr) -> HandshakeHeader {
        if self.initiator {
            HandshakeHeader {
                pair_id: self.pair_id,
                initiator: local,
                responder: self.addr,
            }
        } else {
            HandshakeHeader {
                pair_id: self.pair_id,
                initiator: self.addr,
                responder: local,
            }
        }
    }
}
