//! Secret bytes that are wiped when dropped, and constant-time comparison.

use std::fmt;
use subtle::ConstantTimeEq;
use zeroize::{Zeroize, ZeroizeOnDrop};

/// Key material: zeroized on drop, redacted in `Debug`, compared in constant time.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// Takes ownership of `bytes`.
    pub fn new(bytes: Vec<u8>) -> Self {
        Secret(bytes)
    }

    /// Copies `bytes`.
    pub fn from_slice(bytes: &[u8]) -> Self {
        Secret(bytes.to_vec())
    }

    /// `len` zero bytes, to be filled in place.
    pub fn zeroed(len: usize) -> Self {
        Secret(vec![0; len])
    }

    /// The secret bytes. Keep the borrow short.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// The secret bytes, mutably (for filling in place).
    pub fn expose_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the secret is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes, redacted)", self.0.len())
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        ct_eq(&self.0, &other.0)
    }
}

impl Eq for Secret {}

/// Constant-time equality: the time taken depends only on the lengths, never on where the
/// inputs differ. Use it for every tag comparison.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_is_redacted_and_eq_is_by_value() {
        let s = Secret::from_slice(b"hunter2");
        assert_eq!(format!("{s:?}"), "Secret(7 bytes, redacted)");
        assert_eq!(s, Secret::from_slice(b"hunter2"));
        assert_ne!(s, Secret::from_slice(b"hunter3"));
        assert!(!ct_eq(b"ab", b"abc"));
    }
}
