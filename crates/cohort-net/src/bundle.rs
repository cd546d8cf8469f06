//! UDP bundles (version 1): several sealed packets for one destination carried in one
//! datagram, so a burst of small or medium packets costs the kernel one datagram instead of
//! one each. This module owns the format only (encoding, bounds-checked parsing); the
//! drivers' [`BatchUdp`](crate::batch::BatchUdp) packs what one flush queues for a
//! destination and unpacks what it receives, so the protocol core above still sees one
//! packet at a time. The format is in `docs/wire.md`, "UDP bundles".
//!
//! ```text
//!  offset  size  field
//!  0       1     kind: 0xCB (no group, pair or gossip packet starts with it)
//!  1       1     bundle version: 1
//!  2       2     length of the first packet (u16, big-endian, at least 1)
//!  4       n     the first packet, as it would be a datagram of its own
//!  ...           more (length, packet) records, at least two in all, to the last byte
//! ```

/// First byte of a bundle.
pub const BUNDLE_KIND: u8 = 0xCB;
/// The bundle format's version.
pub const BUNDLE_VERSION: u8 = 1;
/// Bytes before the first record.
pub const BUNDLE_HEADER: usize = 2;
/// Bytes before each packet.
pub const RECORD_HEADER: usize = 2;
/// The default bound on a bundle's size: the UDP payload that fits a 1500-byte path
/// without IP fragmentation under IPv6 (1500 - 40 - 8; IPv4 would allow 1472), so a
/// bundle never fragments where single packets of that size would not.
pub const DEFAULT_BUNDLE_BYTES: usize = 1452;
/// The largest bound: the largest IPv4 UDP payload (65,535 - 20 - 8).
pub const MAX_BUNDLE_BYTES: usize = 65_507;

/// Whether `datagram` is meant as a bundle (its first byte); it may still be malformed.
pub fn is_bundle(datagram: &[u8]) -> bool {
    datagram.first() == Some(&BUNDLE_KIND)
}

/// Why a bundle was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Malformed {
    /// Shorter than its header, or not this module's kind.
    Short,
    /// A version this build does not know.
    Version,
    /// A record's length is zero or runs past the end.
    Record,
    /// Fewer than two records (a sender never bundles a single packet).
    TooFew,
    /// A record is itself a bundle (bundles do not nest).
    Nested,
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Malformed::Short => "shorter than its header",
            Malformed::Version => "unknown bundle version",
            Malformed::Record => "a record's length is zero or runs past the end",
            Malformed::TooFew => "fewer than two packets",
            Malformed::Nested => "a bundle inside a bundle",
        })
    }
}

/// The packets of `datagram`, a bundle, checked in full before any is returned: either
/// every record is well formed or the whole bundle is refused.
pub fn parse(datagram: &[u8]) -> Result<Records<'_>, Malformed> {
    let [kind, version, body @ ..] = datagram else {
        return Err(Malformed::Short);
    };
    if *kind != BUNDLE_KIND {
        return Err(Malformed::Short);
    }
    if *version != BUNDLE_VERSION {
        return Err(Malformed::Version);
    }
    let mut count = 0usize;
    let mut rest = body;
    while !rest.is_empty() {
        let [hi, lo, tail @ ..] = rest else {
            return Err(Malformed::Record);
        };
        let len = usize::from(u16::from_be_bytes([*hi, *lo]));
        if len == 0 || len > tail.len() {
            return Err(Malformed::Record);
        }
        let (packet, next) = tail.split_at(len);
        if is_bundle(packet) {
            return Err(Malformed::Nested);
        }
        count += 1;
        rest = next;
    }
    if count < 2 {
        return Err(Malformed::TooFew);
    }
    Ok(Records { rest: body })
}

/// The packets of a bundle that [`parse`] accepted, in order.
#[derive(Clone, Debug)]
pub struct Records<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Records<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        // `parse` checked every record; a short rest ends the walk all the same.
        let [hi, lo, tail @ ..] = self.rest else {
            return None;
        };
        let len = usize::from(u16::from_be_bytes([*hi, *lo])).min(tail.len());
        let (packet, next) = tail.split_at(len);
        self.rest = next;
        Some(packet)
    }
}

/// Writes a bundle of `packets` to the end of `out`. The caller keeps to the rules
/// [`parse`] checks: at least two packets, each 1 to 65,535 bytes and none a bundle.
pub fn write<'p>(out: &mut Vec<u8>, packets: impl IntoIterator<Item = &'p [u8]>) {
    out.push(BUNDLE_KIND);
    out.push(BUNDLE_VERSION);
    for packet in packets {
        let len = u16::try_from(packet.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&packet[..usize::from(len)]);
    }
}

/// Whether a packet of `len` bytes may go into a bundle at all: not empty, not a bundle
/// itself, and small enough that it and one more record could fit under `bound`.
pub fn bundleable(packet: &[u8], bound: usize) -> bool {
    !packet.is_empty()
        && !is_bundle(packet)
        && BUNDLE_HEADER + 2 * RECORD_HEADER + packet.len() < bound
}

/// Fuzz harness (for `fuzz/` and the tests): arbitrary bytes must parse without panic; a
/// bundle that parses re-encodes to the very same bytes, and every packet it yields is
/// non-empty and not a bundle.
pub fn fuzz_parse(data: &[u8]) {
    if let Ok(records) = parse(data) {
        let packets: Vec<&[u8]> = records.collect();
        assert!(packets.len() >= 2);
        assert!(packets.iter().all(|p| !p.is_empty() && !is_bundle(p)));
        let mut again = Vec::with_capacity(data.len());
        write(&mut again, packets);
        assert_eq!(again, data, "a parsed bundle re-encodes to itself");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(packets: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        write(&mut out, packets.iter().copied());
        out
    }

    #[test]
    fn a_bundle_parses_to_its_packets() {
        let b = bundle(&[b"\x01abc", b"\xc1", &[7u8; 1000]]);
        assert_eq!(&b[..4], &[0xCB, 1, 0, 4]);
        let got: Vec<&[u8]> = parse(&b).unwrap().collect();
        assert_eq!(got, vec![&b"\x01abc"[..], b"\xc1", &[7u8; 1000]]);
        fuzz_parse(&b);
    }

    #[test]
    fn every_malformation_is_refused() {
        let good = bundle(&[b"\x01ab", b"\x01cd"]);
        assert!(parse(&good).is_ok());
        assert_eq!(parse(&[]).unwrap_err(), Malformed::Short);
        assert_eq!(parse(&[0xCB]).unwrap_err(), Malformed::Short);
        assert_eq!(parse(b"\x01\x01\x00\x01a").unwrap_err(), Malformed::Short);
        let mut v2 = good.clone();
        v2[1] = 2;
        assert_eq!(parse(&v2).unwrap_err(), Malformed::Version);
        // Every truncation is refused (none ends on a record boundary with two records).
        for cut in 2..good.len() {
            assert!(parse(&good[..cut]).is_err(), "cut at {cut}");
        }
        // A length running past the end, a zero length, one trailing byte.
        let mut long = good.clone();
        long[3] = 200;
        assert_eq!(parse(&long).unwrap_err(), Malformed::Record);
        let mut zero = good.clone();
        zero[2] = 0;
        zero[3] = 0;
        assert_eq!(parse(&zero).unwrap_err(), Malformed::Record);
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(parse(&trailing).unwrap_err(), Malformed::Record);
        assert_eq!(parse(&bundle(&[b"\x01ab"])).unwrap_err(), Malformed::TooFew);
        assert_eq!(parse(&[0xCB, 1]).unwrap_err(), Malformed::TooFew);
        assert_eq!(
            parse(&bundle(&[b"\x01ab", &good])).unwrap_err(),
            Malformed::Nested
        );
    }

    #[test]
    fn bundleable_keeps_room_for_a_second_record() {
        assert!(!bundleable(b"", 1452));
        assert!(!bundleable(&[0xCB, 1], 1452));
        assert!(bundleable(&[1u8; 1000], 1452));
        // 2 + 2 * 2 + 1446 = 1452: no room left for another packet.
        assert!(!bundleable(&[1u8; 1446], 1452));
        assert!(bundleable(&[1u8; 1445], 1452));
    }
}
