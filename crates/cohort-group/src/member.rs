//! The group member state machine.
#![allow(missing_docs, unused)]

use crate::config::GroupConfig;
use crate::event::{Channel, DropCounters, GroupEvent, SendError, Status};
use crate::id::{MemberId, View};
use cohort_channel::identity::Identity;
use cohort_core::{Machine, Timestamp, Transmit};
use cohort_crypto::CryptoProvider;
use std::net::SocketAddr;

/// One member of a secure group.
pub struct GroupMember {
    id: MemberId,
    counters: DropCounters,
}

impl GroupMember {
    /// A member with `identity`, reached at `addr`. `seed` seeds its randomness (keys,
    /// nonces): take it from the OS in production, from the simulator in tests.
    pub fn new(
        provider: CryptoProvider,
        identity: Identity,
        addr: SocketAddr,
        config: GroupConfig,
        seed: [u8; 32],
    ) -> Result<Self, String> {
        unimplemented!()
    }
    /// Starts: joins through `contacts`, or founds the group alone when none answers and this
    /// member ranks first among those that do.
    pub fn start(&mut self, now: Timestamp, contacts: &[SocketAddr]) {
        unimplemented!()
    }
    /// This member's id.
    pub fn id(&self) -> MemberId {
        self.id
    }
    /// The installed view.
    pub fn view(&self) -> Option<&View> {
        unimplemented!()
    }
    /// Sends `data` on `channel`; returns the message's per-sender number.
    pub fn send(&mut self, now: Timestamp, channel: Channel, data: &[u8]) -> Result<u64, SendError> {
        unimplemented!()
    }
    /// Asks for a fresh group key now.
    pub fn rekey(&mut self, now: Timestamp) {
        unimplemented!()
    }
    /// Leaves the group.
    pub fn leave(&mut self, now: Timestamp) {
        unimplemented!()
    }
    /// Reports local CPU load (0.0 to 1.0) to the group's gear controllers.
    pub fn set_load(&mut self, load: f32) {
        unimplemented!()
    }
    /// A snapshot for `status`.
    pub fn status(&self) -> Status {
        unimplemented!()
    }
    /// Dropped packets by reason.
    pub fn counters(&self) -> &DropCounters {
        &self.counters
    }
    /// Fingerprints (epoch, first 8 bytes of SHA-256 of the key) of every group key this
    /// member ever held: for checkers of who learned which key.
    pub fn key_ledger(&self) -> &[(u64, [u8; 8])] {
        unimplemented!()
    }
}

impl Machine for GroupMember {
    type Event = GroupEvent;
    fn handle_datagram(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        unimplemented!()
    }
    fn handle_timeout(&mut self, now: Timestamp) {
        unimplemented!()
    }
    fn poll_transmit(&mut self, now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
        unimplemented!()
    }
    fn poll_timeout(&self) -> Option<Timestamp> {
        unimplemented!()
    }
    fn poll_event(&mut self) -> Option<GroupEvent> {
        unimplemented!()
    }
}
