//! Secure channels in the tcpcrypt shape.
#![forbid(unsafe_code)]

pub mod identity;
pub mod batch;
