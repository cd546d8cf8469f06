//! The pair-channel layer a member runs: identity-key channels ([`PairTable`]) or KDC-mode
//! channels ([`KdcPairTable`]). Both have the same interface; this forwards to the one the
//! group's [`AuthMode`](crate::AuthMode) picked.

use crate::config::TrustList;
use crate::id::MemberId;
use crate::kdc_pair::{KdcPairTable, KDC_PAIR_KIND};
use crate::keys::PairKey;
use crate::pair::{PairEvent, PairTable, PAIR_KIND};
use cohort_core::{Timestamp, Transmit};
use std::net::SocketAddr;
use std::sync::Arc;

pub(crate) enum Pairs {
    Identity(Box<PairTable>),
    Kdc(Box<KdcPairTable>),
}

impl Pairs {
    /// The first byte of this layer's datagrams.
    pub fn kind(&self) -> u8 {
        match self {
            Pairs::Identity(_) => PAIR_KIND,
            Pairs::Kdc(_) => KDC_PAIR_KIND,
        }
    }

    /// The KDC's address, in KDC mode.
    pub fn kdc(&self) -> Option<SocketAddr> {
        match self {
            Pairs::Identity(_) => None,
            Pairs::Kdc(t) => Some(t.kdc()),
        }
    }

    pub fn send(
        &mut self,
        now: Timestamp,
        addr: SocketAddr,
        expect: Option<MemberId>,
        data: &[u8],
    ) {
        match self {
            Pairs::Identity(t) => t.send(now, addr, expect, data),
            Pairs::Kdc(t) => t.send(now, addr, expect, data),
        }
    }

    pub fn forget(&mut self, addr: SocketAddr) {
        match self {
            Pairs::Identity(t) => t.forget(addr),
            Pairs::Kdc(t) => t.forget(addr),
        }
    }

    pub fn set_trust(&mut self, trust: TrustList) {
        match self {
            Pairs::Identity(t) => t.set_trust(trust),
            Pairs::Kdc(t) => t.set_trust(trust),
        }
    }

    pub fn pair_key(&self, peer: &MemberId) -> Option<&Arc<PairKey>> {
        match self {
            Pairs::Identity(t) => t.pair_key(peer),
            Pairs::Kdc(t) => t.pair_key(peer),
        }
    }

    pub fn handle_datagram(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        match self {
            Pairs::Identity(t) => t.handle_datagram(now, from, data),
            Pairs::Kdc(t) => t.handle_datagram(now, from, data),
        }
    }

    /// A datagram from the KDC (KDC mode only).
    pub fn handle_kdc(&mut self, now: Timestamp, data: &[u8]) {
        if let Pairs::Kdc(t) = self {
            t.handle_kdc(now, data);
        }
    }

    pub fn handle_timeout(&mut self, now: Timestamp) {
        match self {
            Pairs::Identity(t) => t.handle_timeout(now),
            Pairs::Kdc(t) => t.handle_timeout(now),
        }
    }

    pub fn poll_transmit(&mut self, now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
        match self {
            Pairs::Identity(t) => t.poll_transmit(now, buf),
            Pairs::Kdc(t) => t.poll_transmit(now, buf),
        }
    }

    pub fn poll_timeout(&self) -> Option<Timestamp> {
        match self {
            Pairs::Identity(t) => t.poll_timeout(),
            Pairs::Kdc(t) => t.poll_timeout(),
        }
    }

    pub fn poll_event(&mut self) -> Option<PairEvent> {
        match self {
            Pairs::Identity(t) => t.poll_event(),
            Pairs::Kdc(t) => t.poll_event(),
        }
    }
}

#[cfg(feature = "fuzzing")]
impl Pairs {
    /// A deep copy (`PairTable::fork`), for the fuzz harnesses only; `None` in KDC mode,
    /// whose channel keys are provider key objects that cannot be copied.
    pub fn fork(&self) -> Option<Pairs> {
        match self {
            Pairs::Identity(t) => Some(Pairs::Identity(Box::new(t.fork()?))),
            Pairs::Kdc(_) => None,
        }
    }
}
