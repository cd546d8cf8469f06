//! The handshake: Hello, Challenge (a cookie, no state), SYN, ACK and ACKACK with the signed
//! anchors of both control associations, a simultaneous open, a failed or forgotten pair.
//! Owns the cookie secret (`Cookies`). Creates the responder's `Peer` (`connect` in
//! `commands.rs` creates the initiator's), installs both control flows, forgets and fails
//! pairs. Must not touch data flows beyond dropping them, nor the order of the output queues.

use super::peer::{Peer, PeerState};
use super::{Endpoint, CONTROL};
use crate::config::Mode;
use crate::event::EndpointEvent;
use crate::flow::{OwnChain, RecvFlow, SendFlow};
use crate::guard::FlowGuard;
use crate::resend::Resend;
use crate::wire::{
    ack_signed_bytes, ackack_signed_bytes, syn_signed_bytes, AnchorInfo, HandshakeHeader, Packet,
    PairId, SignedHello, COOKIE_LEN,
};
use cohort_channel::identity::PublicKey;
use cohort_core::Timestamp;
use cohort_crypto::{ct_eq, CryptoProvider};
use rand_core::RngCore;
use std::net::SocketAddr;
use std::time::Duration;
use zeroize::Zeroize;

/// How long a cookie stays valid.
const COOKIE_LIFETIME: Duration = Duration::from_secs(10);

/// The responder's cookie secret. A Challenge costs no state: only a SYN that brings back a
/// fresh cookie for its header and the address it came from makes any.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub(super) struct Cookies {
    secret: [u8; 32],
}

impl Drop for Cookies {
    fn drop(&mut self) {
        self.secret.zeroize();
    }
}

impl Cookies {
    /// A new secret from `rng`.
    pub(super) fn new(rng: &mut impl RngCore) -> Cookies {
        let mut secret = [0u8; 32];
        rng.fill_bytes(&mut secret);
        Cookies { secret }
    }

    /// The cookie's timestamp for `now`: milliseconds.
    fn timestamp(now: Timestamp) -> u64 {
        now.as_nanos() / 1_000_000
    }

    /// The cookie for a Hello with `header` from `from` at `timestamp`.
    fn make(
        &self,
        provider: &CryptoProvider,
        header: &HandshakeHeader,
        from: SocketAddr,
        timestamp: u64,
    ) -> [u8; COOKIE_LEN] {
        let mut text = Vec::with_capacity(96);
        let mut raw = Vec::new();
        Packet::Hello(*header).write(&mut raw);
        text.extend_from_slice(&raw[2..]);
        text.extend_from_slice(from.to_string().as_bytes());
        text.extend_from_slice(&timestamp.to_be_bytes());
        let mut out = [0u8; COOKIE_LEN];
        provider
            .keyed_blake3
            .hash(&self.secret, &[b"cohort-hop v1 cookie", &text], &mut out);
        out
    }

    /// Whether a SYN's `cookie` and `timestamp` are ours for `header` and `from`, and at most
    /// [`COOKIE_LIFETIME`] old at `now`.
    fn check(
        &self,
        provider: &CryptoProvider,
        now: Timestamp,
        header: &HandshakeHeader,
        from: SocketAddr,
        timestamp: u64,
        cookie: &[u8; COOKIE_LEN],
    ) -> bool {
        let now_ms = Cookies::timestamp(now);
        let fresh = timestamp <= now_ms && now_ms - timestamp <= COOKIE_LIFETIME.as_millis() as u64;
        fresh && ct_eq(&self.make(provider, header, from, timestamp), cookie)
    }
}

impl Endpoint {
    /// New signature and acknowledgment chains for a pair's control associations.
    pub(super) fn control_chains(&mut self) -> (OwnChain, OwnChain) {
        let sig = OwnChain::generate(
            &self.provider,
            &mut self.rng,
            self.config.chain_rounds,
            0,
            self.config.storage,
        );
        let ack = OwnChain::generate(
            &self.provider,
            &mut self.rng,
            self.config.chain_rounds,
            0,
            self.config.storage,
        );
        (sig, ack)
    }

    /// Drops everything about `peer`.
    pub(super) fn forget(&mut self, peer: SocketAddr) {
        if let Some(p) = self.peers.remove(&peer) {
            self.by_pair.remove(&p.pair_id);
            self.outbox.forget(peer);
        }
    }

    /// The address of the peer of pair `pair_id`; a pair we do not know is counted.
    pub(super) fn pair(&mut self, pair_id: &PairId) -> Option<SocketAddr> {
        let addr = self.by_pair.get(pair_id).copied();
        if addr.is_none() {
            self.counters.unknown += 1;
        }
        addr
    }

    /// The key of a peer's signed handshake part (from a SYN or an ACK), if the key is
    /// trusted (else counted `untrusted`) and its signature over `signed` verifies (else
    /// counted `forged`).
    fn check_signed_part(&mut self, part: &SignedHello<'_>, signed: &[u8]) -> Option<PublicKey> {
        if !crate::config::trusted(&self.config.trust, &part.public_key) {
            self.counters.untrusted += 1;
            return None;
        }
        let key = PublicKey::from_bytes(part.public_key);
        if !key.verify(&self.provider, signed, part.signature) {
            self.counters.forged += 1;
            return None;
        }
        Some(key)
    }

    fn signed_hello(&self, sig: &AnchorInfo, ack: &AnchorInfo) -> SignedHello<'static> {
        SignedHello {
            public_key: *self.config.identity.public().as_bytes(),
            control_sig: *sig,
            control_ack: *ack,
            signature: &[],
        }
    }

    /// A Hello: answer with a Challenge, keep nothing.
    pub(super) fn on_hello(&mut self, now: Timestamp, from: SocketAddr, header: HandshakeHeader) {
        let timestamp = Cookies::timestamp(now);
        let cookie = self.cookies.make(&self.provider, &header, from, timestamp);
        let mut out = Vec::with_capacity(64);
        Packet::Challenge {
            header,
            timestamp,
            cookie,
        }
        .write(&mut out);
        self.outbox.urgent(from, out);
    }

    /// The responder's Challenge: send the SYN with our signed anchors.
    pub(super) fn on_challenge(
        &mut self,
        now: Timestamp,
        header: HandshakeHeader,
        timestamp: u64,
        cookie: [u8; COOKIE_LEN],
    ) {
        let Some(addr) = self.pair(&header.pair_id) else {
            return;
        };
        let local = self.local;
        let Some(p) = self.peers.get(&addr) else {
            return;
        };
        // In `Syn`, a later Challenge replaces the cookie: the one we used may have expired,
        // or been a forger's (an initiator cannot check a cookie), and the SYN resends also
        // resend the Hello to get a fresh one. The signed part stays the same.
        let resyn = p.state == PeerState::Syn;
        if !(p.state == PeerState::Hello || resyn) || p.header(local) != header {
            self.counters.stale += 1;
            return;
        }
        let Some((sig, ack)) = p.pending_control.as_ref().map(|(s, a)| (s.info, a.info)) else {
            return;
        };
        let part = self.signed_hello(&sig, &ack);
        let signature = if resyn {
            p.our_signature.clone()
        } else {
            self.sign(&syn_signed_bytes(&header, &part))
        };
        let mut out = Vec::with_capacity(300);
        Packet::Syn {
            header,
            timestamp,
            cookie,
            initiator: SignedHello {
                signature: &signature,
                ..part
            },
        }
        .write(&mut out);
        let Some(p) = self.peers.get_mut(&addr) else {
            return;
        };
        if !resyn {
            p.state = PeerState::Syn;
            p.handshake_resend = Resend::new(now);
        }
        p.handshake = out.clone();
        p.our_signature = signature;
        self.outbox.urgent(p.next_hop, out);
    }

    /// A SYN: the cookie first, then trust and signature; only then state and the ACK.
    pub(super) fn on_syn(
        &mut self,
        now: Timestamp,
        from: SocketAddr,
        header: HandshakeHeader,
        timestamp: u64,
        cookie: [u8; COOKIE_LEN],
        initiator: SignedHello<'_>,
    ) {
        // Cheap checks first: the cookie proves the initiator saw our Challenge at `from`.
        if !self
            .cookies
            .check(&self.provider, now, &header, from, timestamp, &cookie)
        {
            self.counters.bad_cookie += 1;
            return;
        }
        // A retransmitted SYN of a pair we hold: answer with the same ACK.
        if let Some(p) = self
            .by_pair
            .get(&header.pair_id)
            .and_then(|a| self.peers.get(a))
        {
            if !p.initiator && p.addr == header.initiator {
                if p.state == PeerState::AckSent || p.state == PeerState::Established {
                    self.outbox.urgent(p.next_hop, p.handshake.clone());
                }
            } else {
                self.counters.stale += 1;
            }
            return;
        }
        // A new handshake from the peer of a connected pair (it restarted, or lost the pair
        // and reconnects) replaces that pair, but only with a cookie we made after the pair
        // was created: a recorded SYN of an earlier handshake, replayed within its cookie's
        // lifetime, cannot tear down the pair that followed it.
        if let Some(existing) = self.peers.get(&header.initiator) {
            if existing.state == PeerState::Established
                && timestamp < Cookies::timestamp(existing.created)
            {
                self.counters.stale += 1;
                return;
            }
        }
        let Some(key) = self.check_signed_part(&initiator, &syn_signed_bytes(&header, &initiator))
        else {
            return;
        };
        // Simultaneous open: both sides connected to each other. The side with the lower
        // address stays initiator; the other gives up its own attempt.
        if let Some(existing) = self.peers.get(&header.initiator) {
            let ours_wins = existing.initiator
                && existing.state != PeerState::Established
                && existing.state != PeerState::Failed
                && self.local < header.initiator;
            if ours_wins {
                self.counters.stale += 1;
                return;
            }
        }
        if !self.peers.contains_key(&header.initiator) && self.peers.len() >= self.config.max_peers
        {
            self.counters.no_room += 1;
            return;
        }
        let was_connected = self.is_connected(header.initiator);
        self.forget(header.initiator);
        let (my_sig, my_ack) = self.control_chains();
        let part = self.signed_hello(&my_sig.info, &my_ack.info);
        let signature = self.sign(&ack_signed_bytes(&header, initiator.signature, &part));
        let mut ack = Vec::with_capacity(400);
        Packet::Ack {
            header,
            initiator,
            responder: SignedHello {
                signature: &signature,
                ..part
            },
        }
        .write(&mut ack);
        let mut p = Peer::new(
            header.initiator,
            from,
            header.pair_id,
            false,
            PeerState::AckSent,
            now,
        );
        p.key = Some(key);
        p.handshake = ack.clone();
        p.our_signature = signature;
        if !self.install_control(
            &mut p,
            my_sig,
            my_ack,
            initiator.control_sig,
            initiator.control_ack,
        ) {
            self.counters.malformed += 1;
            return;
        }
        if was_connected {
            // The peer restarted or reconnects: everything we had with it is gone.
            self.events.push_back(EndpointEvent::Disconnected {
                peer: header.initiator,
                reason: "the peer started a new handshake",
            });
        }
        self.outbox.urgent(from, ack);
        self.by_pair.insert(header.pair_id, header.initiator);
        self.peers.insert(header.initiator, p);
    }

    /// Sets up both control flows from our chains and the peer's anchors.
    fn install_control(
        &mut self,
        p: &mut Peer,
        my_sig: OwnChain,
        my_ack: OwnChain,
        their_sig: AnchorInfo,
        their_ack: AnchorInfo,
    ) -> bool {
        let mut my_sig = my_sig;
        my_sig.confirmed = true;
        let Some(mut send) = SendFlow::new(
            p.my_dir(),
            Mode::N,
            false,
            1,
            my_sig,
            self.config.max_rounds,
            self.config.max_skip_rounds,
        ) else {
            return false;
        };
        if !send.guard.add_ack_chain(their_ack) {
            return false;
        }
        send.open = true;
        let Some(guard) = FlowGuard::new(
            Mode::N,
            false,
            1,
            their_sig,
            self.config.max_rounds,
            self.config.max_skip_rounds,
        ) else {
            return false;
        };
        let Some(recv) = RecvFlow::new(p.their_dir(), guard, my_ack, &mut self.rng) else {
            return false;
        };
        p.out_flows.insert(CONTROL, send);
        p.in_flows.insert(CONTROL, recv);
        true
    }

    /// The responder's ACK: check its signed part, install the control flows, send the
    /// ACKACK.
    pub(super) fn on_ack(
        &mut self,
        now: Timestamp,
        header: HandshakeHeader,
        initiator: SignedHello<'_>,
        responder: SignedHello<'_>,
    ) {
        let Some(addr) = self.pair(&header.pair_id) else {
            return;
        };
        let local = self.local;
        let Some(p) = self.peers.get(&addr) else {
            return;
        };
        if !p.initiator || p.header(local) != header {
            self.counters.stale += 1;
            return;
        }
        if p.state == PeerState::Established {
            // Our ACKACK was lost: send it again.
            if p.key.is_some_and(|k| k.as_bytes() == &responder.public_key) {
                self.outbox.urgent(p.next_hop, p.handshake.clone());
            } else {
                self.counters.stale += 1;
            }
            return;
        }
        if p.state != PeerState::Syn {
            self.counters.stale += 1;
            return;
        }
        // The echo must be exactly what we signed.
        if initiator.signature != p.our_signature.as_slice()
            || initiator.public_key != *self.config.identity.public().as_bytes()
        {
            self.counters.forged += 1;
            return;
        }
        // An untrusted key is dropped, not fatal: anybody who saw our SYN can answer it with a
        // key of its own; the real ACK may still come (if none does, the handshake times out).
        let signed = ack_signed_bytes(&header, initiator.signature, &responder);
        let Some(key) = self.check_signed_part(&responder, &signed) else {
            return;
        };
        let signature = self.sign(&ackack_signed_bytes(&header, responder.signature));
        let mut out = Vec::with_capacity(128);
        Packet::AckAck {
            header,
            signature: &signature,
        }
        .write(&mut out);
        let Some(mut p) = self.peers.remove(&addr) else {
            return;
        };
        let Some((my_sig, my_ack)) = p.pending_control.take() else {
            self.peers.insert(addr, p);
            return;
        };
        if !self.install_control(
            &mut p,
            my_sig,
            my_ack,
            responder.control_sig,
            responder.control_ack,
        ) {
            self.counters.malformed += 1;
            p.state = PeerState::Failed;
            self.peers.insert(addr, p);
            return;
        }
        p.state = PeerState::Established;
        p.reconnecting = None;
        p.key = Some(key);
        p.handshake = out.clone();
        p.handshake_resend.sent_at = now;
        self.outbox.urgent(p.next_hop, out);
        self.peers.insert(addr, p);
        self.events
            .push_back(EndpointEvent::Connected { peer: addr, key });
    }

    /// The initiator's ACKACK: the handshake is complete.
    pub(super) fn on_ackack(&mut self, header: HandshakeHeader, signature: &[u8]) {
        let Some(addr) = self.pair(&header.pair_id) else {
            return;
        };
        let local = self.local;
        let provider = self.provider;
        let Some(p) = self.peers.get_mut(&addr) else {
            return;
        };
        if p.initiator || p.header(local) != header {
            self.counters.stale += 1;
            return;
        }
        if p.state != PeerState::AckSent {
            return; // a repeat
        }
        let Some(key) = p.key else {
            return;
        };
        let Some(Packet::Ack {
            responder: ours, ..
        }) = Packet::parse(&p.handshake).ok()
        else {
            return;
        };
        if !key.verify(
            &provider,
            &ackack_signed_bytes(&header, ours.signature),
            signature,
        ) {
            self.counters.forged += 1;
            return;
        }
        p.state = PeerState::Established;
        self.events
            .push_back(EndpointEvent::Connected { peer: addr, key });
    }

    /// Gives up the pair with `peer` and says why.
    pub(super) fn fail(&mut self, peer: SocketAddr, reason: &'static str) {
        if let Some(p) = self.peers.get_mut(&peer) {
            p.state = PeerState::Failed;
            p.out_flows.clear();
            p.in_flows.clear();
            p.controls.clear();
            self.events
                .push_back(EndpointEvent::ConnectFailed { peer, reason });
        }
    }
}
