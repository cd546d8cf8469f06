//! Secure channels in the tcpcrypt shape.
#![forbid(unsafe_code)]

pub mod batch;
pub mod identity;
