//! Bounds-checked codec helpers for wire formats (big-endian, network order).
//!
//! Parsers take a [`Reader`] over borrowed bytes; every read checks the length first and
//! returns [`Truncated`] instead of panicking. Writers append to a caller-owned `Vec<u8>`.

use std::fmt;

/// The input ended before the field being read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Truncated;

impl fmt::Display for Truncated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("input ended before the field")
    }
}

impl std::error::Error for Truncated {}

/// A cursor over borrowed bytes. Reads return borrowed slices; nothing is copied.
#[derive(Clone, Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader positioned at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.bytes.len()
    }

    /// Whether everything has been read.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], Truncated> {
        if n > self.bytes.len() {
            return Err(Truncated);
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], Truncated> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }

    /// The last `n` bytes, removed from the end of the input.
    pub fn bytes_from_end(&mut self, n: usize) -> Result<&'a [u8], Truncated> {
        let keep = self.bytes.len().checked_sub(n).ok_or(Truncated)?;
        let (head, tail) = self.bytes.split_at(keep);
        self.bytes = head;
        Ok(tail)
    }

    /// A `u8`.
    pub fn u8(&mut self) -> Result<u8, Truncated> {
        Ok(self.array::<1>()?[0])
    }

    /// A big-endian `u16`.
    pub fn u16(&mut self) -> Result<u16, Truncated> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    /// A big-endian `u32`.
    pub fn u32(&mut self) -> Result<u32, Truncated> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    /// A big-endian `u64`.
    pub fn u64(&mut self) -> Result<u64, Truncated> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// A `u16` length followed by that many bytes.
    pub fn u16_prefixed(&mut self) -> Result<&'a [u8], Truncated> {
        let n = self.u16()?;
        self.bytes(usize::from(n))
    }
}

/// Appends big-endian fields to a caller-owned buffer.
#[derive(Debug)]
pub struct Writer<'a> {
    buf: &'a mut Vec<u8>,
}

impl<'a> Writer<'a> {
    /// A writer that appends to `buf`.
    pub fn new(buf: &'a mut Vec<u8>) -> Self {
        Writer { buf }
    }

    /// Bytes in the buffer so far (including any that were there before).
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Appends a `u8`.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }

    /// Appends a big-endian `u16`.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// Appends a big-endian `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// Appends a big-endian `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// Appends raw bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }

    /// Appends a `u16` length and the bytes; `None` if `v` is longer than `u16::MAX`.
    pub fn u16_prefixed(&mut self, v: &[u8]) -> Option<&mut Self> {
        let n = u16::try_from(v.len()).ok()?;
        Some(self.u16(n).bytes(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut buf = Vec::new();
        Writer::new(&mut buf)
            .u8(1)
            .u16(0x0203)
            .u32(0x0405_0607)
            .u64(8)
            .bytes(b"xy");
        Writer::new(&mut buf).u16_prefixed(b"abc").unwrap();
        let mut r = Reader::new(&buf);
        assert_eq!(r.u8(), Ok(1));
        assert_eq!(r.u16(), Ok(0x0203));
        assert_eq!(r.u32(), Ok(0x0405_0607));
        assert_eq!(r.u64(), Ok(8));
        assert_eq!(r.bytes(2), Ok(&b"xy"[..]));
        assert_eq!(r.u16_prefixed(), Ok(&b"abc"[..]));
        assert!(r.is_empty());
        assert_eq!(r.u8(), Err(Truncated));
    }

    #[test]
    fn truncation_is_an_error_not_a_panic() {
        let mut r = Reader::new(&[0, 5, 1, 2]);
        assert_eq!(r.clone().u16_prefixed(), Err(Truncated));
        assert_eq!(r.clone().u64(), Err(Truncated));
        assert_eq!(r.bytes_from_end(5), Err(Truncated));
        assert_eq!(r.bytes_from_end(1), Ok(&[2u8][..]));
        assert_eq!(r.rest(), &[0, 5, 1][..]);
    }
}
