//! Every deadline of the endpoint: handshake and control resends, S1 resends (through the
//! flows), the RTO from the measured round trip, and what happens when time runs out
//! (stalled associations, a peer given up). The backoff rule itself is `crate::resend`. Owns
//! no state of its own (`Peer::srtt`, the `Resend` records); must not build packets other
//! than resending the ones already built.

use super::control::envelope;
use super::peer::{Peer, PeerState};
use super::{Endpoint, CONTROL};
use crate::event::EndpointEvent;
use crate::flow::SendTimeout;
use crate::resend;
use cohort_core::Timestamp;
use std::net::SocketAddr;
use std::time::Duration;

impl Peer {
    /// The S1 resend timeout: three smoothed round trips (between 2 ms and 2 s), or
    /// `initial` before any was measured.
    pub(super) fn rto(&self, initial: Duration) -> Duration {
        match self.srtt {
            Some(srtt) => (srtt * 3).clamp(Duration::from_millis(2), Duration::from_secs(2)),
            None => initial,
        }
    }

    /// Takes one S1-to-A1 round trip into the smoothed round trip (7/8 old, 1/8 new).
    pub(super) fn sample_rtt(&mut self, sample: Duration) {
        self.srtt = Some(match self.srtt {
            Some(s) => (s * 7 + sample) / 8,
            None => sample,
        });
    }

    /// Whether its handshake packet is still resent.
    fn handshaking(&self) -> bool {
        matches!(
            self.state,
            PeerState::Hello | PeerState::Syn | PeerState::AckSent
        )
    }
}

impl Endpoint {
    /// Resends what is due, reports stalled associations and gives up silent peers.
    pub(super) fn on_timeout(&mut self, now: Timestamp) {
        let initial = self.config.retransmit;
        let max_retries = self.config.max_retries;
        let addrs: Vec<SocketAddr> = self.peers.keys().copied().collect();
        for addr in addrs {
            let Some(p) = self.peers.get_mut(&addr) else {
                continue;
            };
            let rto = p.rto(initial);
            // Handshake retransmissions.
            let handshaking = p.handshaking();
            if handshaking && p.handshake_resend.is_due(now, resend::SIGNALLING, initial) {
                if p.handshake_resend.tries >= max_retries {
                    if p.initiator {
                        self.fail(addr, "no answer to the handshake");
                    } else {
                        self.forget(addr);
                    }
                    continue;
                }
                p.handshake_resend.resent(now);
                self.outbox.urgent(p.next_hop, p.handshake.clone());
            }
            // S1 retransmissions.
            let mut stalled_rounds = Vec::new();
            let mut stalled = Vec::new();
            for (&assoc, f) in p.out_flows.iter_mut() {
                match f.on_timeout(now, rto, max_retries) {
                    SendTimeout::Stalled(round) => stalled_rounds.push((assoc, round)),
                    SendTimeout::Retransmitted(tries) if tries >= 2 => {
                        // No A1 after two tries: maybe a relay missed our latest chain.
                        if let Some(renew) = p.renewals.get(&(f.flow, 0)) {
                            stalled.push(renew.clone());
                        }
                    }
                    SendTimeout::Retransmitted(_) | SendTimeout::Nothing => {}
                }
            }
            // Control messages not answered.
            let mut resend = Vec::new();
            let mut resend_signed = Vec::new();
            for c in p.controls.iter_mut() {
                if c.resend.is_due(now, resend::SIGNALLING, initial) {
                    c.resend.resent(now);
                    if c.signed {
                        resend_signed.push(c.bytes.clone());
                    } else {
                        resend.push(c.bytes.clone());
                    }
                }
            }
            for bytes in resend_signed.iter().chain(&stalled) {
                let packet = envelope(&self.config, &self.provider, p, bytes);
                self.outbox.urgent(p.next_hop, packet);
            }
            let give_up = p.controls.iter().any(|c| c.resend.tries > max_retries * 2);
            if let Some(control) = p.out_flows.get_mut(&CONTROL) {
                control.queue.extend(resend);
            }
            for (assoc, round) in stalled_rounds {
                self.events.push_back(EndpointEvent::Stalled {
                    peer: addr,
                    assoc,
                    round,
                });
            }
            if give_up {
                self.fail(addr, "peer stopped answering control messages");
                continue;
            }
            self.pump_all(now, addr);
        }
    }

    /// The earliest deadline of any peer: a handshake or control resend, or an S1 resend.
    pub(super) fn next_deadline(&self) -> Option<Timestamp> {
        let initial = self.config.retransmit;
        let mut next: Option<Timestamp> = None;
        let mut consider = |t: Timestamp| next = Some(next.map_or(t, |n: Timestamp| n.min(t)));
        for p in self.peers.values() {
            if p.handshaking() {
                consider(p.handshake_resend.deadline(resend::SIGNALLING, initial));
            }
            let rto = p.rto(initial);
            for f in p.out_flows.values() {
                if let Some(t) = f.deadline(rto) {
                    consider(t);
                }
            }
            for c in &p.controls {
                consider(c.resend.deadline(resend::SIGNALLING, initial));
            }
        }
        next
    }
}
