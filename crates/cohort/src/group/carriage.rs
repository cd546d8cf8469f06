//! The NATS carriage of a group packet: a small versioned prefix that names the sender's
//! address (its identity in views, as a UDP source address is), then the packet itself;
//! and the subjects a group, its members and a KDC use. Format in docs/wire.md, "NATS carriage".
//!
//! ```text
//!   version 1 (u8) | family (u8: 4 or 6) | address (4 or 16 bytes) | port (u16 BE) | packet
//! ```
//!
//! A forged prefix is no worse than a spoofed UDP source address: the packet's own
//! cryptography decides whether it is accepted. Parsing checks every length; what does not
//! parse is dropped and counted by the caller.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The carriage format's version byte.
pub const CARRIAGE_VERSION: u8 = 1;
/// Longest prefix: version, family, an IPv6 address, a port.
pub const MAX_PREFIX: usize = 1 + 1 + 16 + 2;

/// Writes the prefix for a packet sent by `from` into `out` (which it clears first).
pub fn encode_prefix(from: SocketAddr, out: &mut Vec<u8>) {
    out.clear();
    out.push(CARRIAGE_VERSION);
    match from.ip() {
        IpAddr::V4(ip) => {
            out.push(4);
            out.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.push(6);
            out.extend_from_slice(&ip.octets());
        }
    }
    out.extend_from_slice(&from.port().to_be_bytes());
}

/// Why a carried message was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CarriageError {
    /// Shorter than its prefix says, or nothing after the prefix.
    Truncated,
    /// An unknown version byte.
    Version,
    /// An address family other than 4 or 6.
    Family,
}

/// Splits a carried message into the sender's address and the packet.
pub fn parse(data: &[u8]) -> Result<(SocketAddr, &[u8]), CarriageError> {
    let (&version, rest) = data.split_first().ok_or(CarriageError::Truncated)?;
    if version != CARRIAGE_VERSION {
        return Err(CarriageError::Version);
    }
    let (&family, rest) = rest.split_first().ok_or(CarriageError::Truncated)?;
    let (ip, rest) = match family {
        4 => {
            let (a, rest) = rest
                .split_first_chunk::<4>()
                .ok_or(CarriageError::Truncated)?;
            (IpAddr::V4(Ipv4Addr::from(*a)), rest)
        }
        6 => {
            let (a, rest) = rest
                .split_first_chunk::<16>()
                .ok_or(CarriageError::Truncated)?;
            (IpAddr::V6(Ipv6Addr::from(*a)), rest)
        }
        _ => return Err(CarriageError::Family),
    };
    let (port, packet) = rest
        .split_first_chunk::<2>()
        .ok_or(CarriageError::Truncated)?;
    if packet.is_empty() {
        return Err(CarriageError::Truncated);
    }
    Ok((SocketAddr::new(ip, u16::from_be_bytes(*port)), packet))
}

/// The subjects of one group: `cohort.<name in hex>.all` for packets to every member and
/// `cohort.<name in hex>.m.<address in hex>` for one member's own. Hex keeps any group
/// name (dots, spaces, wildcards) a single subject token.
#[derive(Clone, Debug)]
pub struct Subjects {
    prefix: String,
}

impl Subjects {
    /// The subjects of the group named `group`.
    pub fn new(group: &str) -> Self {
        let mut prefix = String::from("cohort.");
        for b in group.as_bytes() {
            let _ = write!(prefix, "{b:02x}");
        }
        Subjects { prefix }
    }

    /// The subject every member listens on.
    pub fn group(&self) -> String {
        format!("{}.all", self.prefix)
    }

    /// The subject of the member reached at `addr`.
    pub fn member(&self, addr: SocketAddr) -> String {
        let mut s = format!("{}.m.", self.prefix);
        push_addr_token(&mut s, addr);
        s
    }
}

/// The subject of the KDC named `addr` (its `listen`): `cohort.kdc.<address in hex>`. A
/// KDC serves every group, so its subject names no group; `kdc` is not a hex token, so no
/// group's subjects can collide with it.
pub fn kdc_subject(addr: SocketAddr) -> String {
    let mut s = String::from("cohort.kdc.");
    push_addr_token(&mut s, addr);
    s
}

/// Whether `subject` is the member subject of the member at `from` in some group
/// (`cohort.<hex>.m.<from in hex>`): the only reply subject a KDC over NATS answers to, so
/// that a request cannot make the KDC publish to any other subject, nor to a member other
/// than the one its carriage prefix names.
pub fn is_member_subject_of(subject: &str, from: SocketAddr) -> bool {
    let mut own = String::from(".m.");
    push_addr_token(&mut own, from);
    let Some(group) = subject
        .strip_prefix("cohort.")
        .and_then(|rest| rest.strip_suffix(own.as_str()))
    else {
        return false;
    };
    !group.is_empty()
        && group
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Appends the subject token of `addr`: its address bytes in hex, a dash, its port.
fn push_addr_token(s: &mut String, addr: SocketAddr) {
    match addr.ip() {
        IpAddr::V4(ip) => ip.octets().iter().for_each(|b| {
            let _ = write!(s, "{b:02x}");
        }),
        IpAddr::V6(ip) => ip.octets().iter().for_each(|b| {
            let _ = write!(s, "{b:02x}");
        }),
    }
    let _ = write!(s, "-{}", addr.port());
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // reason: test code; a panic is the failure report
mod tests {
    use super::*;

    #[test]
    fn a_prefix_round_trips_for_both_families() {
        for from in ["10.1.2.3:7001", "[2001:db8::7]:65535"] {
            let from: SocketAddr = from.parse().unwrap();
            let mut buf = Vec::new();
            encode_prefix(from, &mut buf);
            buf.extend_from_slice(b"packet");
            assert_eq!(parse(&buf).unwrap(), (from, &b"packet"[..]));
        }
    }

    #[test]
    fn every_cut_and_every_bad_header_byte_is_refused() {
        let mut buf = Vec::new();
        encode_prefix("[::1]:9".parse().unwrap(), &mut buf);
        let prefix = buf.len();
        buf.push(0x11);
        for cut in 0..=prefix {
            assert_eq!(parse(&buf[..cut]), Err(CarriageError::Truncated), "{cut}");
        }
        let mut bad = buf.clone();
        bad[0] = 2;
        assert_eq!(parse(&bad), Err(CarriageError::Version));
        bad = buf.clone();
        bad[1] = 5;
        assert_eq!(parse(&bad), Err(CarriageError::Family));
        // A v4 family over a v6 prefix reads a different (valid) address: the packet's
        // crypto decides, as with a spoofed UDP source.
        bad = buf.clone();
        bad[1] = 4;
        assert!(parse(&bad).is_ok());
    }

    #[test]
    fn subjects_are_single_tokens_per_group_and_member() {
        let s = Subjects::new("ops.*>");
        assert_eq!(s.group(), "cohort.6f70732e2a3e.all");
        assert_eq!(
            s.member("127.0.0.1:7001".parse().unwrap()),
            "cohort.6f70732e2a3e.m.7f000001-7001"
        );
        assert_ne!(
            s.member("127.0.0.1:7001".parse().unwrap()),
            s.member("127.0.0.1:7002".parse().unwrap())
        );
    }

    #[test]
    fn the_kdc_answers_only_on_the_member_subject_its_prefix_names() {
        let alice: SocketAddr = "127.0.0.1:7001".parse().unwrap();
        let kdc: SocketAddr = "10.0.0.1:7600".parse().unwrap();
        assert_eq!(kdc_subject(kdc), "cohort.kdc.0a000001-7600");
        let own = Subjects::new("ops").member(alice);
        assert!(is_member_subject_of(&own, alice));
        for (subject, from) in [
            (own.as_str(), "127.0.0.1:7002"),                  // another member
            (own.as_str(), "[::1]:7001"),                      // another family
            ("cohort..m.7f000001-7001", "127.0.0.1:7001"),     // no group token
            ("cohort.6f.x.m.7f000001-7001", "127.0.0.1:7001"), // two tokens
            ("cohort.kdc.m.7f000001-7001", "127.0.0.1:7001"),  // not hex
            ("other.6f.m.7f000001-7001", "127.0.0.1:7001"),
            ("_INBOX.abc", "127.0.0.1:7001"),
            ("cohort.6f.all", "127.0.0.1:7001"),
        ] {
            assert!(
                !is_member_subject_of(subject, from.parse().unwrap()),
                "{subject} for {from}"
            );
        }
    }
}
