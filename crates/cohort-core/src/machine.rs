//! The one trait every protocol core implements.

use crate::Timestamp;
use std::net::SocketAddr;

/// Where the datagram a core just wrote into the caller's buffer should go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Destination address.
    pub destination: SocketAddr,
    /// Bytes written into the buffer passed to [`Machine::poll_transmit`].
    pub size: usize,
}

/// A sans-IO protocol state machine, driven by the tokio driver or by `cohort-sim`.
///
/// # Call order
/// After any input (`handle_datagram`, `handle_timeout`, or an application command on the
/// concrete type), the driver calls, until each returns `None`:
/// 1. [`Machine::poll_transmit`], sending each datagram;
/// 2. [`Machine::poll_event`], handing each event to the application;
/// 3. [`Machine::poll_timeout`], arming one timer for the earliest deadline.
///
/// When that deadline passes, it calls [`Machine::handle_timeout`]. Calling `handle_timeout`
/// early is harmless. Bad input from the network never panics and never returns an error: the
/// core drops it, counts it, and may report it as an event.
pub trait Machine {
    /// What the core reports to its application.
    type Event;

    /// A datagram arrived from `from`.
    fn handle_datagram(&mut self, now: Timestamp, from: SocketAddr, data: &[u8]);

    /// The deadline from [`Machine::poll_timeout`] has passed (or the driver woke early).
    fn handle_timeout(&mut self, now: Timestamp);

    /// Writes the next datagram into `buf` (which the caller has cleared) and says where it
    /// goes, or returns `None` when there is nothing to send.
    fn poll_transmit(&mut self, now: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit>;

    /// The next time the core needs [`Machine::handle_timeout`], if any.
    fn poll_timeout(&self) -> Option<Timestamp>;

    /// The next event for the application, if any.
    fn poll_event(&mut self) -> Option<Self::Event>;
}
