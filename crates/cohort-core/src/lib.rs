//! The floor every cohort protocol core stands on. This crate does no I/O: it reads no clock,
//! opens no socket and spawns no thread.
//!
//! ```text
//!   driver (tokio or cohort-sim)                      protocol core (impl Machine)
//!   ----------------------------                      ----------------------------
//!   datagram from the network  -- handle_datagram --> parse (wire::Reader), update state
//!   clock reached poll_timeout -- handle_timeout  --> fire due timers (TimerTable)
//!   socket ready               <-- poll_transmit  --  bytes written into the driver's buffer
//!   arm a timer                <-- poll_timeout   --  earliest deadline
//!   application                <-- poll_event     --  what happened (delivered, dropped, ...)
//! ```
//!
//! * [`Timestamp`]: virtual or real time, always handed in by the caller.
//! * [`TimerTable`]: a fixed array of deadlines indexed by a closed enum of timers.
//! * [`Transmit`]: where the datagram a core just wrote should go.
//! * [`Machine`]: the one trait that lets the tokio driver and the simulator run every protocol.
//! * [`wire`]: bounds-checked big-endian readers and writers for wire formats.
//!
//! # Example
//! ```
//! use cohort_core::{Timestamp, TimerTable, Timer};
//! use std::time::Duration;
//!
//! #[derive(Clone, Copy, Debug, PartialEq, Eq)]
//! enum MyTimer { Retransmit, Idle }
//! impl Timer for MyTimer {
//!     const ALL: &'static [Self] = &[MyTimer::Retransmit, MyTimer::Idle];
//!     fn index(self) -> usize { self as usize }
//! }
//!
//! let mut timers = TimerTable::<MyTimer, 2>::new();
//! let now = Timestamp::from_millis(5);
//! timers.set(MyTimer::Idle, now + Duration::from_secs(30));
//! timers.set(MyTimer::Retransmit, now + Duration::from_millis(200));
//! assert_eq!(timers.next(), Some((MyTimer::Retransmit, Timestamp::from_millis(205))));
//! let due: Vec<_> = timers.take_expired(Timestamp::from_millis(300)).collect();
//! assert_eq!(due, vec![MyTimer::Retransmit]);
//! ```
#![forbid(unsafe_code)]

mod machine;
mod time;
mod timer;
pub mod wire;

pub use machine::{Machine, Transmit};
pub use time::Timestamp;
pub use timer::{Timer, TimerTable};
