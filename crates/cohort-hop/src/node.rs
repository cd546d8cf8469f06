//! One type for every role, so that one simulator (which runs nodes of a single
//! [`Machine`] type) can hold endpoints and relays on the same path.

use crate::endpoint::Endpoint;
use crate::event::{EndpointEvent, RelayEvent};
use crate::relay::Relay;
use cohort_core::{Machine, Timestamp, Transmit};
use std::net::SocketAddr;

/// An endpoint or a relay.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one per simulated node; boxing buys nothing here
pub enum HopNode {
    /// An endpoint.
    Endpoint(Endpoint),
    /// A relay.
    Relay(Relay),
}

/// An event from either role.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HopEvent {
    /// From an endpoint.
    Endpoint(EndpointEvent),
    /// From a relay.
    Relay(RelayEvent),
}

impl HopNode {
    /// The endpoint, if this node is one.
    pub fn endpoint(&self) -> Option<&Endpoint> {
        match self {
            HopNode::Endpoint(e) => Some(e),
            HopNode::Relay(_) => None,
        }
    }

    /// The endpoint, mutably.
    pub fn endpoint_mut(&mut self) -> Option<&mut Endpoint> {
        match self {
            HopNode::Endpoint(e) => Some(e),
            HopNode::Relay(_) => None,
        }
    }

    /// The relay, if this node is one.
    pub fn relay(&self) -> Option<&Relay> {
        match self {
            HopNode::Relay(r) => Some(r),
            HopNode::Endpoint(_) => None,
        }
    }
}

impl Machine for HopNode {
    type Event = HopEvent;

    fn handle_datagram(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]) {
        match self {
            HopNode::Endpoint(e) => e.handle_datagram(now, from, data),
            HopNode::Relay(r) => r.handle_datagram(now, from, data),
        }
    }

    fn handle_timeout(&mut self, now: Timestamp) {
        match self {
            HopNode::Endpoint(e) => e.handle_timeout(now),
            HopNode::Relay(r) => r.handle_timeout(now),
        }
    }

    fn poll_transmit(&mut self, now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
        match self {
            HopNode::Endpoint(e) => e.poll_transmit(now, buf),
            HopNode::Relay(r) => r.poll_transmit(now, buf),
        }
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        match self {
            HopNode::Endpoint(e) => e.poll_timeout(),
            HopNode::Relay(r) => r.poll_timeout(),
        }
    }

    fn poll_event(&mut self) -> Option<HopEvent> {
        match self {
            HopNode::Endpoint(e) => e.poll_event().map(HopEvent::Endpoint),
            HopNode::Relay(r) => r.poll_event().map(HopEvent::Relay),
        }
    }
}
