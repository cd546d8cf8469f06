//! The control association and SIGNED packets: Open, OpenAck, Renew, RenewAck, Close and
//! CloseAck, received and sent, chain renewal, and signing with the endpoint's identity.
//! Fills `Peer::controls` (answers awaited) and `Peer::renewals` (the last Renew per chain),
//! which `timers.rs` and `receive.rs` only resend. Must not touch the handshake state nor a
//! flow's rounds (it adds and confirms chains, opens and closes flows).

use super::peer::{Peer, PeerState, PendingControl};
use super::{Endpoint, CONTROL, MAX_ASSOC};
use crate::config::{EndpointConfig, Mode};
use crate::event::EndpointEvent;
use crate::flow::{OwnChain, RecvFlow};
use crate::guard::FlowGuard;
use crate::resend::Resend;
use crate::wire::{
    control_signed_bytes, signed_envelope_bytes, Control, Packet, PairId, FLOW_FROM_RESPONDER,
};
use cohort_core::Timestamp;
use cohort_crypto::CryptoProvider;
use std::net::SocketAddr;

impl Endpoint {
    /// Signs `message` with the endpoint's identity.
    pub(super) fn sign(&self, message: &[u8]) -> Vec<u8> {
        sign_with(&self.config, &self.provider, message)
    }

    /// A control message from `peer`, on the control association or in a SIGNED packet:
    /// acts on it, answers it, and ends the resends of what it answers.
    pub(super) fn on_control(&mut self, now: Timestamp, peer: SocketAddr, bytes: &[u8]) {
        let Ok(message) = Control::parse(bytes) else {
            self.counters.malformed += 1;
            return;
        };
        let provider = self.provider;
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        let Some(key) = p.key else {
            return;
        };
        let signed_ok = |m: &Control<'_>, signature: &[u8]| {
            key.verify(&provider, &control_signed_bytes(&p.pair_id, m), signature)
        };
        // Every control message is about one flow: its association, and whether we send on it.
        let assoc = message.flow() & MAX_ASSOC;
        let ours = message.flow() & FLOW_FROM_RESPONDER == p.my_dir();
        use crate::wire::control_code as cc;
        let mut reply: Option<Vec<u8>> = None;
        let mut answered: Option<(u8, u16, u8, u32)> = None;
        match message {
            Control::Open {
                flow,
                mode,
                batch,
                reports,
                window,
                chain,
                signature,
            } => {
                if flow & FLOW_FROM_RESPONDER != p.their_dir() || flow & MAX_ASSOC == CONTROL {
                    self.counters.malformed += 1;
                    return;
                }
                if !signed_ok(&message, signature) {
                    self.counters.forged += 1;
                    return;
                }
                let Some(mode) = Mode::from_code(mode, batch) else {
                    self.counters.malformed += 1;
                    return;
                };
                let ack_anchor = match p.in_flows.get(&assoc) {
                    // A retransmitted Open: answer again with the same chain.
                    Some(existing) if existing.guard.mode() == mode => existing.first_ack_anchor(),
                    _ => {
                        let Some(guard) = FlowGuard::new(
                            mode,
                            reports,
                            window,
                            chain,
                            self.config.max_rounds,
                            self.config.max_skip_rounds,
                        ) else {
                            self.counters.malformed += 1;
                            return;
                        };
                        let ack_chain = OwnChain::generate(
                            &provider,
                            &mut self.rng,
                            self.config.chain_rounds,
                            0,
                            self.config.storage,
                        );
                        let Some(recv) = RecvFlow::new(flow, guard, ack_chain, &mut self.rng)
                        else {
                            self.counters.malformed += 1;
                            return;
                        };
                        let anchor = recv.first_ack_anchor();
                        p.in_flows.insert(assoc, recv);
                        self.events.push_back(EndpointEvent::Opened {
                            peer,
                            assoc,
                            outgoing: false,
                            mode,
                        });
                        anchor
                    }
                };
                let m = Control::OpenAck {
                    flow,
                    chain: ack_anchor,
                    signature: &[],
                };
                reply = Some(write_signed_control(&self.config, &provider, &p.pair_id, m));
            }
            Control::OpenAck {
                flow,
                chain,
                signature,
            } => {
                if !signed_ok(&message, signature) {
                    self.counters.forged += 1;
                    return;
                }
                if ours {
                    if let Some(f) = p.out_flows.get_mut(&assoc) {
                        if !f.open && (f.mode == Mode::Unprotected || f.guard.add_ack_chain(chain))
                        {
                            f.open = true;
                            self.events.push_back(EndpointEvent::Opened {
                                peer,
                                assoc,
                                outgoing: true,
                                mode: f.mode,
                            });
                        }
                    }
                }
                answered = Some((cc::OPEN_ACK, flow, 0, 0));
            }
            Control::Renew {
                flow,
                which,
                chain,
                signature,
            } => {
                if !signed_ok(&message, signature) {
                    self.counters.forged += 1;
                    return;
                }
                let ok = match (which, ours) {
                    // The peer renews its signature chain of its flow.
                    (0, false) => p
                        .in_flows
                        .get_mut(&assoc)
                        .is_some_and(|f| f.guard.add_sig_chain(chain)),
                    // The peer renews its ack chain for our flow.
                    (1, true) => p
                        .out_flows
                        .get_mut(&assoc)
                        .is_some_and(|f| f.guard.add_ack_chain(chain)),
                    _ => false,
                };
                if ok {
                    let mut out = Vec::new();
                    Control::RenewAck {
                        flow,
                        which,
                        start_round: chain.start_round,
                    }
                    .write(&mut out);
                    reply = Some(out);
                } else {
                    self.counters.stale += 1;
                }
            }
            Control::RenewAck {
                flow,
                which,
                start_round,
            } => {
                match (which, ours) {
                    (0, true) => {
                        if let Some(f) = p.out_flows.get_mut(&assoc) {
                            if f.confirm_renewal(start_round) {
                                self.events.push_back(EndpointEvent::Renewed {
                                    peer,
                                    assoc,
                                    outgoing: true,
                                });
                            }
                        }
                    }
                    (1, false) => {
                        if let Some(f) = p.in_flows.get_mut(&assoc) {
                            if f.renewing {
                                f.renewing = false;
                                self.events.push_back(EndpointEvent::Renewed {
                                    peer,
                                    assoc,
                                    outgoing: false,
                                });
                            }
                        }
                    }
                    _ => {}
                }
                answered = Some((cc::RENEW_ACK, flow, which, start_round));
            }
            Control::Close { flow } => {
                let removed = if ours {
                    p.out_flows.remove(&assoc).is_some()
                } else {
                    p.in_flows.remove(&assoc).is_some()
                };
                if removed && assoc != CONTROL {
                    self.events.push_back(EndpointEvent::Closed {
                        peer,
                        assoc,
                        outgoing: ours,
                    });
                }
                let mut out = Vec::new();
                Control::CloseAck { flow }.write(&mut out);
                reply = Some(out);
            }
            Control::CloseAck { flow } => {
                answered = Some((cc::CLOSE_ACK, flow, 0, 0));
            }
        }
        if let Some(answer) = answered {
            p.controls.retain(|c| c.answer != answer);
        }
        if let Some(bytes) = reply {
            self.send_control(now, peer, bytes, None);
        }
    }

    /// Queues a control message on our control flow; `answer` says what reply ends its
    /// retransmissions (none for replies themselves).
    pub(super) fn send_control(
        &mut self,
        now: Timestamp,
        peer: SocketAddr,
        bytes: Vec<u8>,
        answer: Option<(u8, u16, u8, u32)>,
    ) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        let Some(control) = p.out_flows.get_mut(&CONTROL) else {
            return;
        };
        // Renewals travel signed, outside the control association: renewing the control
        // association's own chains through itself could deadlock once both ran out.
        let signed = matches!(
            bytes.first(),
            Some(&(crate::wire::control_code::RENEW | crate::wire::control_code::RENEW_ACK))
        );
        if signed {
            let envelope = envelope(&self.config, &self.provider, p, &bytes);
            self.outbox.urgent(p.next_hop, envelope);
        } else {
            // Control messages are few; the queue bound is for data.
            control.queue.push_back(bytes.clone());
        }
        if let Some(answer) = answer {
            p.controls.push(PendingControl {
                answer,
                bytes,
                resend: Resend::new(now),
                signed,
                since: now,
            });
        }
        self.pump(now, peer, CONTROL);
        self.collect_ready(peer);
    }

    /// A SIGNED packet: checked against the peer's key, then handled as a control message.
    pub(super) fn on_signed(
        &mut self,
        now: Timestamp,
        pair_id: PairId,
        from_responder: bool,
        message: &[u8],
        signature: &[u8],
    ) {
        let Some(addr) = self.pair(&pair_id) else {
            return;
        };
        let Some(p) = self.peers.get(&addr) else {
            return;
        };
        let their_dir_is_responder = p.their_dir() == FLOW_FROM_RESPONDER;
        let Some(key) = p.key.filter(|_| p.state == PeerState::Established) else {
            self.counters.unverifiable += 1;
            return;
        };
        if from_responder != their_dir_is_responder
            || !key.verify(
                &self.provider,
                &signed_envelope_bytes(&pair_id, from_responder, message),
                signature,
            )
        {
            self.counters.forged += 1;
            return;
        }
        self.counters.verified += 1;
        self.on_control(now, addr, message);
        self.pump_all(now, addr);
    }

    /// Makes the next chain of a flow (`which`: 0 signature, 1 acknowledgment) starting at
    /// round `start`, and announces it in a signed Renew.
    pub(super) fn renew(
        &mut self,
        now: Timestamp,
        peer: SocketAddr,
        flow: u16,
        which: u8,
        start: u32,
    ) {
        let chain = OwnChain::generate(
            &self.provider,
            &mut self.rng,
            self.config.chain_rounds,
            start,
            self.config.storage,
        );
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        let assoc = flow & MAX_ASSOC;
        let info = chain.info;
        match which {
            0 => match p.out_flows.get_mut(&assoc) {
                Some(f) => f.push_renewal(chain),
                None => return,
            },
            _ => match p.in_flows.get_mut(&assoc) {
                Some(f) => f.push_renewal(chain),
                None => return,
            },
        }
        let m = Control::Renew {
            flow,
            which,
            chain: info,
            signature: &[],
        };
        let bytes = write_signed_control(&self.config, &self.provider, &p.pair_id, m);
        p.renewals.insert((flow, which), bytes.clone());
        let answer = (crate::wire::control_code::RENEW_ACK, flow, which, start);
        self.send_control(now, peer, bytes, Some(answer));
    }
}

/// A control message in a signed packet.
pub(super) fn envelope(
    config: &EndpointConfig,
    provider: &CryptoProvider,
    p: &Peer,
    message: &[u8],
) -> Vec<u8> {
    let from_responder = !p.initiator;
    let signature = sign_with(
        config,
        provider,
        &signed_envelope_bytes(&p.pair_id, from_responder, message),
    );
    let mut out = Vec::with_capacity(message.len() + 80);
    Packet::Signed {
        pair_id: p.pair_id,
        from_responder,
        message,
        signature: &signature,
    }
    .write(&mut out);
    out
}

/// `message` (Open, OpenAck or Renew) as bytes, signed with the endpoint's identity for the
/// pair `pair_id`; the signature it carries is replaced.
pub(super) fn write_signed_control(
    config: &EndpointConfig,
    provider: &CryptoProvider,
    pair_id: &PairId,
    message: Control<'_>,
) -> Vec<u8> {
    let signature = sign_with(config, provider, &control_signed_bytes(pair_id, &message));
    let mut message: Control<'_> = message;
    match &mut message {
        Control::Open { signature: s, .. }
        | Control::OpenAck { signature: s, .. }
        | Control::Renew { signature: s, .. } => *s = &signature,
        Control::RenewAck { .. } | Control::Close { .. } | Control::CloseAck { .. } => {}
    }
    let mut out = Vec::new();
    message.write(&mut out);
    out
}

/// Signs with the endpoint's identity. Ed25519 signing with a valid key does not fail; an
/// empty signature would simply never verify at the peer.
pub(super) fn sign_with(
    config: &EndpointConfig,
    provider: &CryptoProvider,
    message: &[u8],
) -> Vec<u8> {
    config.identity.sign(provider, message).unwrap_or_default()
}
