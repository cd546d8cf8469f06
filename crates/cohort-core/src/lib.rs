#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod machine;
mod time;
mod timer;
pub mod wire;

pub use machine::{Machine, Transmit};
pub use time::Timestamp;
pub use timer::{Timer, TimerTable};
