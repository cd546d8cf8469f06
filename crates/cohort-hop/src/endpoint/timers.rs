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
use crate::wire::Packet;
use cohort_core::Timestamp;
use std::net::SocketAddr;
use std::time::Duration;

/// How long one reconnection attempt may take before a fresh one (new pair id, new Hello)
/// replaces it: well under the cookie's lifetime (10 s), so a SYN resent across a long
/// outage never carries an expired cookie.
const ATTEMPT: Duration = Duration::from_secs(4);

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

    /// When the pair counts as dead: `dead_after` after the oldest thing we sent that still
    /// awaits its answer (an S1 its A1, a control message its reply); `None` when nothing
    /// awaits one. Only the peer's chains can answer (a fresh ack element, a control reply
    /// on its control association or signed), so a forger cannot keep a dead pair alive,
    /// and nothing it sends can make a live one count as dead sooner.
    fn dead_at(&self, dead_after: Duration) -> Option<Timestamp> {
        if self.state != PeerState::Established {
            return None;
        }
        let flows = self.out_flows.values().filter_map(|f| f.awaiting_since());
        let controls = self.controls.iter().map(|c| c.since);
        flows.chain(controls).min().map(|t| t + dead_after)
    }

    /// For a reconnection still under way: (since when, whether it is the initiator's).
    fn reconnection(&self) -> Option<Timestamp> {
        self.reconnecting
            .filter(|_| self.initiator && self.handshaking())
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
    /// Drops the pair with `addr` and starts a new handshake with it through the same next
    /// hop, as initiator (a reconnection). When the pair was connected, says so with
    /// `reason` ([`EndpointEvent::Disconnected`]).
    pub(super) fn reconnect(&mut self, now: Timestamp, addr: SocketAddr, reason: &'static str) {
        let Some(p) = self.peers.get(&addr) else {
            return;
        };
        let next_hop = p.next_hop;
        let since = p.reconnecting.unwrap_or(now);
        let was_connected = p.state == PeerState::Established;
        self.forget(addr);
        if was_connected {
            self.events
                .push_back(EndpointEvent::Disconnected { peer: addr, reason });
        }
        self.start_handshake(now, addr, next_hop, Some(since));
    }

    /// Sends the last handshake packet to `addr` again; with a SYN, the Hello too, so that
    /// a fresh Challenge replaces a cookie that expired or was forged.
    fn resend_handshake(&mut self, addr: SocketAddr) {
        let local = self.local;
        let Some(p) = self.peers.get(&addr) else {
            return;
        };
        if p.state == PeerState::Syn {
            let mut hello = Vec::with_capacity(80);
            Packet::Hello(p.header(local)).write(&mut hello);
            self.outbox.urgent(p.next_hop, hello);
        }
        self.outbox.urgent(p.next_hop, p.handshake.clone());
    }

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
            // A connected pair that stopped answering: start again.
            if p.dead_at(self.config.dead_after).is_some_and(|t| now >= t) {
                self.reconnect(now, addr, "no answer from the peer");
                continue;
            }
            // A reconnection: a fresh attempt every ATTEMPT (a cookie expires, a relay may
            // have restarted again), the handshake packet resent at least once a second,
            // until `reconnect_for`.
            if let Some(since) = p.reconnection() {
                if now >= since + self.config.reconnect_for {
                    self.fail(addr, "the peer did not come back");
                } else if now >= p.created + ATTEMPT {
                    self.reconnect(now, addr, "");
                } else if p.handshake_resend.is_due(now, resend::RECONNECT, initial) {
                    p.handshake_resend.resent(now);
                    self.resend_handshake(addr);
                }
                continue;
            }
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
                self.resend_handshake(addr);
            }
            let Some(p) = self.peers.get_mut(&addr) else {
                continue;
            };
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
            if let Some(since) = p.reconnection() {
                consider(p.handshake_resend.deadline(resend::RECONNECT, initial));
                consider(p.created + ATTEMPT);
                consider(since + self.config.reconnect_for);
                continue;
            }
            if p.handshaking() {
                consider(p.handshake_resend.deadline(resend::SIGNALLING, initial));
            }
            if let Some(t) = p.dead_at(self.config.dead_after) {
                consider(t);
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
