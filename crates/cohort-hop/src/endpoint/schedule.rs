//! The scheduler: which packet `poll_transmit` gives out next. Handshake, acknowledgment,
//! control and SIGNED packets first, then data associations take turns one packet each.
//! Owns the output queues (`Outbox`); starts rounds (`pump`, which asks `control.rs` for
//! chain renewals) and collects what flows made ready. Must not parse or verify packets.

use super::peer::PeerState;
use super::{Endpoint, CONTROL};
use crate::event::AssocId;
use cohort_core::Timestamp;
use std::collections::VecDeque;
use std::net::SocketAddr;

/// What waits to be sent: urgent packets in order, then data associations in turn.
#[derive(Default)]
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct Outbox {
    /// Handshake, acknowledgment and control packets: sent first.
    urgent: VecDeque<(SocketAddr, Vec<u8>)>,
    /// Data flows with packets ready, in round-robin order.
    active: VecDeque<(SocketAddr, AssocId)>,
}

impl Outbox {
    /// Queues a handshake, acknowledgment, control or SIGNED packet for `to`: it goes out
    /// ahead of any data.
    pub(super) fn urgent(&mut self, to: SocketAddr, packet: Vec<u8>) {
        self.urgent.push_back((to, packet));
    }

    /// Gives a data association with packets ready its turn (once).
    fn activate(&mut self, peer: SocketAddr, assoc: AssocId) {
        if !self.active.contains(&(peer, assoc)) {
            self.active.push_back((peer, assoc));
        }
    }

    /// Drops the turns of a forgotten peer's associations.
    pub(super) fn forget(&mut self, peer: SocketAddr) {
        self.active.retain(|(a, _)| *a != peer);
    }
}

impl Endpoint {
    /// Starts rounds where possible, and renews chains that are running out.
    pub(super) fn pump(&mut self, now: Timestamp, peer: SocketAddr, assoc: AssocId) {
        let provider = self.provider;
        let margin = (self.config.chain_rounds / 4).max(2);
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        if p.state != PeerState::Established && p.state != PeerState::AckSent {
            return;
        }
        let pair_id = p.pair_id;
        let mut renewals: Vec<(u16, u8, u32)> = Vec::new();
        if let Some(f) = p.out_flows.get_mut(&assoc) {
            if let Some(start) = f.wants_renewal(margin) {
                renewals.push((f.flow, 0, start));
            }
            let started = f.pump(&provider, &pair_id, now);
            if started && assoc != CONTROL && !f.ready.is_empty() {
                self.outbox.activate(peer, assoc);
            }
        }
        if let Some(f) = p.in_flows.get(&assoc) {
            if let Some(start) = f.wants_renewal(margin) {
                renewals.push((f.flow, 1, start));
            }
        }
        for (flow, which, start) in renewals {
            self.renew(now, peer, flow, which, start);
        }
    }

    /// [`Endpoint::pump`] for every association of `peer`, then collects what is ready.
    pub(super) fn pump_all(&mut self, now: Timestamp, peer: SocketAddr) {
        let assocs: Vec<AssocId> = self
            .peers
            .get(&peer)
            .map(|p| {
                p.out_flows
                    .keys()
                    .chain(p.in_flows.keys())
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        for assoc in assocs {
            self.pump(now, peer, assoc);
        }
        self.collect_ready(peer);
    }

    /// Moves packets that flows made ready to the output queues.
    pub(super) fn collect_ready(&mut self, peer: SocketAddr) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        let next_hop = p.next_hop;
        for (&assoc, f) in p.in_flows.iter_mut() {
            let _ = assoc;
            while let Some(packet) = f.ready.pop_front() {
                self.outbox.urgent(next_hop, packet);
            }
        }
        if let Some(control) = p.out_flows.get_mut(&CONTROL) {
            while let Some(packet) = control.ready.pop_front() {
                self.outbox.urgent(next_hop, packet);
            }
        }
        for (&assoc, f) in p.out_flows.iter() {
            if assoc != CONTROL && !f.ready.is_empty() {
                self.outbox.activate(peer, assoc);
            }
        }
    }

    /// The next packet to send and where: urgent ones first, then one packet of the next
    /// data association in turn.
    pub(super) fn next_packet(&mut self) -> Option<(SocketAddr, Vec<u8>)> {
        if let Some(item) = self.outbox.urgent.pop_front() {
            return Some(item);
        }
        while let Some((peer, assoc)) = self.outbox.active.pop_front() {
            let Some(p) = self.peers.get_mut(&peer) else {
                continue;
            };
            let next_hop = p.next_hop;
            let Some(f) = p.out_flows.get_mut(&assoc) else {
                continue;
            };
            let Some(packet) = f.ready.pop_front() else {
                continue;
            };
            if !f.ready.is_empty() {
                self.outbox.active.push_back((peer, assoc));
            }
            return Some((next_hop, packet));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::ChainStorage;
    use crate::config::{EndpointConfig, Mode};
    use crate::endpoint::peer::Peer;
    use crate::flow::{OwnChain, SendFlow};
    use cohort_channel::identity::Identity;
    use cohort_core::Machine;
    use cohort_crypto::CryptoProvider;
    use cohort_crypto::Secret;
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    /// Two open data associations with packets ready, and a control packet: the control
    /// packet goes first, then the associations take turns one packet at a time.
    #[test]
    fn signalling_goes_first_and_associations_take_turns() {
        let provider = CryptoProvider::default_provider();
        let identity = Identity::from_secret(&provider, Secret::new(vec![3; 32])).unwrap();
        let local: SocketAddr = "10.0.0.1:1".parse().unwrap();
        let peer: SocketAddr = "10.0.0.2:1".parse().unwrap();
        let mut e = Endpoint::new(EndpointConfig::new(identity), provider, local, [4; 32]);
        let mut rng = ChaCha20Rng::from_seed([5; 32]);
        let mut p = Peer::new(
            peer,
            peer,
            [1; 8],
            true,
            PeerState::Established,
            Timestamp::ZERO,
        );
        p.next_assoc = 3;
        for assoc in [1u16, 2] {
            let chain = OwnChain::generate(&provider, &mut rng, 4, 0, ChainStorage::Full);
            let mut f = SendFlow::new(assoc, Mode::Unprotected, false, 1, chain, 4, 4).unwrap();
            f.open = true;
            for i in 0..3u8 {
                f.ready.push_back(vec![assoc as u8, i]);
            }
            p.out_flows.insert(assoc, f);
        }
        e.peers.insert(peer, p);
        e.outbox.active.push_back((peer, 1));
        e.outbox.active.push_back((peer, 2));
        e.outbox.urgent(peer, vec![0xcc]);
        let mut order = Vec::new();
        let mut buf = Vec::new();
        while let Some(t) = e.poll_transmit(Timestamp::ZERO, &mut buf) {
            assert_eq!(t.destination, peer);
            order.push(buf.clone());
            buf.clear();
        }
        let expected: Vec<Vec<u8>> = vec![
            vec![0xcc],
            vec![1, 0],
            vec![2, 0],
            vec![1, 1],
            vec![2, 1],
            vec![1, 2],
            vec![2, 2],
        ];
        assert_eq!(order, expected);
    }
}
