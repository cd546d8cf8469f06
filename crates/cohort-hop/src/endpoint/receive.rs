//! The receive path of flow packets (S1, S2, PLAIN, A1, A2): finds the pair and the flow,
//! lets the flow's checks decide, delivers messages, hands control messages to `control.rs`
//! and counts refusals. Owns no state. Must not create or close flows nor answer control
//! messages itself (it only resends a Renew that `control.rs` built, when A1s seem lost).

use super::control::envelope;
use super::peer::{Peer, PeerState};
use super::{Endpoint, CONTROL, MAX_ASSOC};
use crate::config::Mode;
use crate::event::EndpointEvent;
use crate::flow::Received;
use crate::guard::Refusal;
use crate::wire::{FlowHeader, Packet, FLOW_FROM_RESPONDER};
use cohort_core::Timestamp;

impl Endpoint {
    pub(super) fn on_flow_packet(&mut self, now: Timestamp, packet: Packet<'_>) {
        let Some(header) = packet.flow_header().copied() else {
            return;
        };
        let Some(addr) = self.pair(&header.pair_id) else {
            return;
        };
        let provider = self.provider;
        let Some(p) = self.peers.get_mut(&addr) else {
            self.counters.unknown += 1;
            return;
        };
        let dir = header.flow & FLOW_FROM_RESPONDER;
        let assoc = header.flow & MAX_ASSOC;
        let theirs = dir == p.their_dir();
        let result = match packet {
            Packet::S1 {
                mode,
                element,
                count,
                macs,
                ..
            } if theirs => match p.in_flows.get_mut(&assoc) {
                Some(f) => {
                    let repeated = f.repeated_s1;
                    let r = f.on_s1(&provider, &header, mode, &element, count, macs, now);
                    if f.repeated_s1 > repeated && f.repeated_s1 % 2 == 0 {
                        // Our A1s for this flow are not getting through: maybe a relay
                        // never saw our latest ack chain.
                        if let Some(renew) = p.renewals.get(&(header.flow, 1)) {
                            let packet = envelope(&self.config, &provider, p, renew);
                            self.outbox.urgent(p.next_hop, packet);
                        }
                    }
                    if r.is_ok() && assoc == CONTROL && p.state == PeerState::AckSent {
                        // Only the initiator, holding our ACK, can run its control chain:
                        // the handshake is complete even if its ACKACK was lost.
                        p.state = PeerState::Established;
                        if let Some(key) = p.key {
                            self.events
                                .push_back(EndpointEvent::Connected { peer: addr, key });
                        }
                    }
                    r.map(|()| Received::Nothing)
                }
                None => Err(Refusal::Unknown),
            },
            Packet::S2 {
                index,
                key,
                path,
                payload,
                ..
            } if theirs => match p.in_flows.get_mut(&assoc) {
                Some(f) => f.on_s2(&provider, &header, index, &key, path, payload),
                None => Err(Refusal::Unknown),
            },
            Packet::Plain { payload, .. } if theirs => match p.in_flows.get_mut(&assoc) {
                Some(f) if f.mode == Mode::Unprotected => Ok(f.on_plain(payload)),
                _ => Err(Refusal::Stale),
            },
            Packet::A1 {
                element, report, ..
            } if !theirs => match p.out_flows.get_mut(&assoc) {
                Some(f) => match f.on_a1(&provider, &header, &element, report.as_ref(), now) {
                    Ok(sample) => {
                        if let Some(sample) = sample {
                            p.sample_rtt(sample);
                        }
                        Ok(Received::Nothing)
                    }
                    Err(e) => Err(e),
                },
                None => Err(Refusal::Unknown),
            },
            Packet::A2 {
                element,
                delivered,
                secret,
                ..
            } if !theirs => match p.out_flows.get_mut(&assoc) {
                Some(f) => match f.on_a2(&provider, &header, &element, delivered, &secret) {
                    Ok(delivered) => {
                        self.events.push_back(EndpointEvent::Report {
                            peer: addr,
                            assoc,
                            round: header.round,
                            delivered,
                        });
                        Ok(Received::Nothing)
                    }
                    Err(e) => Err(e),
                },
                None => Err(Refusal::Unknown),
            },
            _ => Err(Refusal::Malformed),
        };
        match result {
            Ok(received) => {
                self.counters.verified += 1;
                if let Received::Message(data) = received {
                    if assoc == CONTROL {
                        self.on_control(now, addr, &data);
                        // A control message may have opened a flow or confirmed a chain
                        // that messages were waiting for.
                        self.pump_all(now, addr);
                    } else {
                        if matches!(packet_kind(&header, p), Some(Mode::Unprotected)) {
                            self.counters.unprotected += 1;
                        }
                        self.counters.delivered += 1;
                        self.events.push_back(EndpointEvent::Received {
                            peer: addr,
                            assoc,
                            data,
                        });
                    }
                }
            }
            Err(refusal) => self.counters.count_refusal(refusal),
        }
        self.pump(now, addr, assoc);
        self.collect_ready(addr);
    }
}

pub(super) fn packet_kind(header: &FlowHeader, p: &Peer) -> Option<Mode> {
    p.in_flows.get(&(header.flow & MAX_ASSOC)).map(|f| f.mode)
}
