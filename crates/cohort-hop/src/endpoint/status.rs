//! Snapshots for operators (`hop ctl`) and tests: `EndpointStatus`, `PeerStatus`,
//! `AssocStatus`, and `Endpoint::status` that builds them. Owns no state; reads only, must
//! not change the endpoint.

use super::peer::PeerState;
use super::Endpoint;
use crate::config::Mode;
use crate::event::{AssocId, HopCounters};
use crate::wire::PairId;
use cohort_channel::identity::PublicKey;
use std::net::SocketAddr;
use std::time::Duration;

/// A snapshot of one association, for `hop ctl` and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AssocStatus {
    /// The association id (0: control).
    pub id: AssocId,
    /// Whether we send on it.
    pub outgoing: bool,
    /// Its mode.
    pub mode: Mode,
    /// Whether it is open.
    pub open: bool,
    /// Rounds left on confirmed signature chains (outgoing only).
    pub rounds_left: u32,
    /// Elements left on the current chain (signature chain if outgoing, ack chain if not).
    pub elements_left: u32,
    /// Messages queued (outgoing only).
    pub queued: usize,
    /// Messages sent or received.
    pub messages: u64,
    /// Outgoing: the next round to start; incoming: the highest round seen.
    pub round: u32,
    /// Outgoing: the oldest round whose S1 awaits its A1, and how often it was sent again.
    pub awaiting_ack: Option<(u32, u32)>,
    /// The association's window: rounds it may have between S1 and S2 at once.
    pub window: u32,
    /// Outgoing: rounds between S1 and S2 now.
    pub in_flight: usize,
}

/// A snapshot of one peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerStatus {
    /// The peer's overlay address.
    pub addr: SocketAddr,
    /// Where packets for it go first (itself or a relay).
    pub next_hop: SocketAddr,
    /// The pair id on the wire.
    pub pair_id: PairId,
    /// Whether we started the handshake.
    pub initiator: bool,
    /// Its key, once known.
    pub key: Option<PublicKey>,
    /// Handshake state, as a word.
    pub state: &'static str,
    /// Smoothed round-trip time of S1 to A1, if measured.
    pub srtt: Option<Duration>,
    /// Its associations.
    pub associations: Vec<AssocStatus>,
}

/// A snapshot of an endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointStatus {
    /// This endpoint's overlay address.
    pub local: SocketAddr,
    /// This endpoint's key.
    pub key: PublicKey,
    /// Its peers.
    pub peers: Vec<PeerStatus>,
    /// Its counters.
    pub counters: HopCounters,
}

impl Endpoint {
    /// A snapshot of everything, for operators.
    pub fn status(&self) -> EndpointStatus {
        let mut peers: Vec<PeerStatus> = self
            .peers
            .values()
            .map(|p| {
                let mut associations: Vec<AssocStatus> = p
                    .out_flows
                    .iter()
                    .map(|(&id, f)| AssocStatus {
                        id,
                        outgoing: true,
                        mode: f.mode,
                        open: f.open,
                        rounds_left: f.rounds_left(),
                        elements_left: f.elements_left(),
                        queued: f.queue.len(),
                        messages: f.sent_messages,
                        round: f.next_round(),
                        awaiting_ack: f.awaiting_ack(),
                        window: f.guard.window(),
                        in_flight: f.in_flight(),
                    })
                    .collect();
                associations.extend(p.in_flows.iter().map(|(&id, f)| AssocStatus {
                    id,
                    outgoing: false,
                    mode: f.mode,
                    open: true,
                    rounds_left: 0,
                    elements_left: f.elements_left(),
                    queued: 0,
                    messages: f.received_messages,
                    round: f.highest_round,
                    awaiting_ack: None,
                    window: f.guard.window(),
                    in_flight: 0,
                }));
                PeerStatus {
                    addr: p.addr,
                    next_hop: p.next_hop,
                    pair_id: p.pair_id,
                    initiator: p.initiator,
                    key: p.key,
                    state: match p.state {
                        PeerState::Hello => "hello-sent",
                        PeerState::Syn => "syn-sent",
                        PeerState::AckSent => "ack-sent",
                        PeerState::Established => "established",
                        PeerState::Failed => "failed",
                    },
                    srtt: p.srtt,
                    associations,
                }
            })
            .collect();
        peers.sort_by_key(|p| p.addr);
        EndpointStatus {
            local: self.local,
            key: self.config.identity.public(),
            peers,
            counters: self.counters,
        }
    }
}
