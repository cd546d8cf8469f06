//! The application's commands: `connect`, `open`, `send`, `send_any`, `send_keyed`, `close`,
//! and `HopError`, the refusals they return. Owns no state of its own: each command sets up
//! or queues, then leaves the packets to the handshake, control and scheduler files. Must not
//! parse or verify packets.

use super::control::write_signed_control;
use super::peer::{Peer, PeerState};
use super::{Endpoint, CONTROL, MAX_ASSOC, MAX_MESSAGE};
use crate::config::Mode;
use crate::event::{AssocId, EndpointEvent};
use crate::flow::{OwnChain, SendFlow};
use crate::wire::{Control, Packet, PAIR_ID_LEN};
use cohort_core::Timestamp;
use rand_core::RngCore;
use std::fmt;
use std::net::SocketAddr;

/// A command the endpoint refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HopError {
    /// No pair with that peer (call `connect` first).
    UnknownPeer,
    /// The handshake with that peer has not completed.
    NotConnected,
    /// No such association, or it is not open yet.
    NotOpen,
    /// The association's queue is full; the message was dropped.
    QueueFull,
    /// The message is longer than [`MAX_MESSAGE`].
    TooLarge,
    /// The mode's batch size is out of range.
    BadMode,
    /// Every association id is in use.
    TooManyAssociations,
}

impl fmt::Display for HopError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HopError::UnknownPeer => "no pair with that peer",
            HopError::NotConnected => "the handshake with that peer has not completed",
            HopError::NotOpen => "no such open association",
            HopError::QueueFull => "the association's queue is full",
            HopError::TooLarge => "message too large",
            HopError::BadMode => "mode batch size out of range",
            HopError::TooManyAssociations => "no association id left",
        })
    }
}

impl std::error::Error for HopError {}

impl Endpoint {
    /// Starts a handshake with `peer`, sending through `via` (the first relay) or directly.
    /// A pair that exists already is left alone unless it failed.
    pub fn connect(&mut self, now: Timestamp, peer: SocketAddr, via: Option<SocketAddr>) {
        if self
            .peers
            .get(&peer)
            .is_some_and(|p| p.state != PeerState::Failed)
        {
            return;
        }
        self.forget(peer);
        self.start_handshake(now, peer, via.unwrap_or(peer), None);
    }

    /// A new pair with `peer` (any old one must be gone): a random pair id, new control
    /// chains, and the Hello sent to `next_hop`. `reconnecting` is when the peer was lost,
    /// for a reconnection.
    pub(super) fn start_handshake(
        &mut self,
        now: Timestamp,
        peer: SocketAddr,
        next_hop: SocketAddr,
        reconnecting: Option<Timestamp>,
    ) {
        let mut pair_id = [0u8; PAIR_ID_LEN];
        self.rng.fill_bytes(&mut pair_id);
        let control = self.control_chains();
        let mut p = Peer::new(peer, next_hop, pair_id, true, PeerState::Hello, now);
        p.reconnecting = reconnecting;
        p.pending_control = Some(control);
        Packet::Hello(p.header(self.local)).write(&mut p.handshake);
        self.outbox.urgent(p.next_hop, p.handshake.clone());
        self.by_pair.insert(pair_id, peer);
        self.peers.insert(peer, p);
    }

    /// Opens an outgoing association to a connected `peer`. It is usable once the event
    /// [`EndpointEvent::Opened`] says so; messages sent before then wait in its queue.
    pub fn open(
        &mut self,
        now: Timestamp,
        peer: SocketAddr,
        mode: Mode,
    ) -> Result<AssocId, HopError> {
        if !mode.is_valid() {
            return Err(HopError::BadMode);
        }
        let chain = OwnChain::generate(
            &self.provider,
            &mut self.rng,
            self.config.chain_rounds,
            0,
            self.config.storage,
        );
        let p = self.peers.get_mut(&peer).ok_or(HopError::UnknownPeer)?;
        if p.state != PeerState::Established {
            return Err(HopError::NotConnected);
        }
        let assoc = (p.next_assoc..=MAX_ASSOC)
            .chain(1..p.next_assoc)
            .find(|a| !p.out_flows.contains_key(a))
            .ok_or(HopError::TooManyAssociations)?;
        p.next_assoc = if assoc == MAX_ASSOC { 1 } else { assoc + 1 };
        let flow = p.my_dir() | assoc;
        let reports = self.config.delivery_reports && mode != Mode::Unprotected;
        // The window as configured, within what the chain and the hops' round memory allow.
        let window = if mode == Mode::Unprotected {
            1
        } else {
            let chain = u8::try_from(self.config.chain_rounds).unwrap_or(u8::MAX);
            let rounds = u8::try_from(self.config.max_rounds / 2).unwrap_or(u8::MAX);
            self.config.window.min(chain).min(rounds).max(1)
        };
        let mut send = SendFlow::new(
            flow,
            mode,
            reports,
            window,
            chain,
            self.config.max_rounds,
            self.config.max_skip_rounds,
        )
        .ok_or(HopError::BadMode)?;
        let anchor = send.first_anchor();
        send.confirm_renewal(anchor.start_round);
        p.out_flows.insert(assoc, send);
        let message = Control::Open {
            flow,
            mode: mode.code(),
            batch: mode.batch(),
            reports,
            window,
            chain: anchor,
            signature: &[],
        };
        let bytes = write_signed_control(&self.config, &self.provider, &p.pair_id, message);
        let answer = (crate::wire::control_code::OPEN_ACK, flow, 0, 0);
        self.send_control(now, peer, bytes, Some(answer));
        Ok(assoc)
    }

    /// Queues `data` on an outgoing association.
    pub fn send(
        &mut self,
        now: Timestamp,
        peer: SocketAddr,
        assoc: AssocId,
        data: &[u8],
    ) -> Result<(), HopError> {
        if data.len() > MAX_MESSAGE {
            return Err(HopError::TooLarge);
        }
        let p = self.peers.get_mut(&peer).ok_or(HopError::UnknownPeer)?;
        let flow = p
            .out_flows
            .get_mut(&assoc)
            .filter(|_| assoc != CONTROL)
            .ok_or(HopError::NotOpen)?;
        if !flow.push(data, self.config.max_queue) {
            self.counters.queue_full += 1;
            return Err(HopError::QueueFull);
        }
        self.pump(now, peer, assoc);
        Ok(())
    }

    /// Queues `data` on the open outgoing association to `peer` with the shortest queue.
    pub fn send_any(
        &mut self,
        now: Timestamp,
        peer: SocketAddr,
        data: &[u8],
    ) -> Result<(), HopError> {
        let p = self.peers.get(&peer).ok_or(HopError::UnknownPeer)?;
        let assoc = p
            .out_flows
            .iter()
            .filter(|(&id, f)| id != CONTROL && f.open)
            .min_by_key(|(&id, f)| (f.queue.len() + usize::from(!f.is_idle()), id))
            .map(|(&id, _)| id)
            .ok_or(HopError::NotOpen)?;
        self.send(now, peer, assoc, data)
    }

    /// Queues `data` on one of the open outgoing associations to `peer`, chosen by `key`:
    /// messages with the same key always take the same association, so they stay in order
    /// (rounds of different associations complete independently). A tunnel passes a hash of
    /// each packet's connection (addresses, protocol, ports), so one TCP connection is never
    /// reordered while several spread over the associations.
    pub fn send_keyed(
        &mut self,
        now: Timestamp,
        peer: SocketAddr,
        key: u64,
        data: &[u8],
    ) -> Result<(), HopError> {
        let p = self.peers.get(&peer).ok_or(HopError::UnknownPeer)?;
        let open: Vec<AssocId> = p
            .out_flows
            .iter()
            .filter(|(&id, f)| id != CONTROL && f.open)
            .map(|(&id, _)| id)
            .collect();
        if open.is_empty() {
            return Err(HopError::NotOpen);
        }
        let pick = open[(key % open.len() as u64) as usize];
        self.send(now, peer, pick, data)
    }

    /// Closes an association (ours or the peer's); the peer is told.
    pub fn close(&mut self, now: Timestamp, peer: SocketAddr, assoc: AssocId, outgoing: bool) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        if assoc == CONTROL {
            return;
        }
        let flow = if outgoing {
            p.out_flows.remove(&assoc);
            p.my_dir() | assoc
        } else {
            p.in_flows.remove(&assoc);
            p.their_dir() | assoc
        };
        self.events.push_back(EndpointEvent::Closed {
            peer,
            assoc,
            outgoing,
        });
        let mut bytes = Vec::new();
        Control::Close { flow }.write(&mut bytes);
        let answer = (crate::wire::control_code::CLOSE_ACK, flow, 0, 0);
        self.send_control(now, peer, bytes, Some(answer));
    }
}
