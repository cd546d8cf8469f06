//! A sliding replay window over 64-bit sequence numbers (the IPsec/DTLS shape).

/// Why a sequence number was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplayError {
    /// Already accepted once.
    Duplicate,
    /// Older than the window reaches.
    TooOld,
}

/// Accepts each sequence number at most once, and only if it is no more than
/// [`ReplayWindow::SIZE`] - 1 behind the highest one accepted.
///
/// Check with [`ReplayWindow::check`] *before* verifying a tag (it is cheap), and record with
/// [`ReplayWindow::insert`] only *after* the tag verified, so forged packets cannot move the
/// window.
#[derive(Clone, Debug)]
pub struct ReplayWindow {
    /// One more than the highest accepted sequence number; 0 when nothing was accepted.
    top: u64,
    /// Bit `s % SIZE` is set when `s` (within the window) was accepted.
    bits: [u64; Self::WORDS],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        Self::new()
    }
}

impl ReplayWindow {
    /// Sequence numbers the window remembers.
    pub const SIZE: u64 = 2048;
    const WORDS: usize = (Self::SIZE / 64) as usize;

    /// An empty window.
    pub fn new() -> Self {
        ReplayWindow {
            top: 0,
            bits: [0; Self::WORDS],
        }
    }

    /// The highest accepted sequence number, if any.
    pub fn highest(&self) -> Option<u64> {
        self.top.checked_sub(1)
    }

    /// Whether `seq` would be accepted now.
    pub fn check(&self, seq: u64) -> Result<(), ReplayError> {
        if seq == u64::MAX {
            // Out of the sequence space senders may use: accepting it once would leave the
            // window unable to tell a second copy.
            return Err(ReplayError::TooOld);
        }
        if seq >= self.top {
            return Ok(());
        }
        if self.top - 1 - seq >= Self::SIZE {
            return Err(ReplayError::TooOld);
        }
        if self.get(seq) {
            Err(ReplayError::Duplicate)
        } else {
            Ok(())
        }
    }

    /// Records `seq` as accepted. Call only after [`ReplayWindow::check`] passed and the
    /// packet authenticated.
    pub fn insert(&mut self, seq: u64) {
        if seq >= self.top {
            let advance = seq - self.top.saturating_sub(1);
            if self.top == 0 || advance >= Self::SIZE {
                self.bits = [0; Self::WORDS];
            } else {
                // Clear the slots of the numbers skipped over (top ..= seq).
                for s in self.top..=seq {
                    self.clear(s);
                }
            }
            // Senders never use u64::MAX (the packet parser refuses it), so this cannot wrap.
            self.top = seq.saturating_add(1);
        }
        self.set(seq);
    }

    fn slot(seq: u64) -> (usize, u64) {
        let i = seq % Self::SIZE;
        ((i / 64) as usize, 1u64 << (i % 64))
    }

    fn get(&self, seq: u64) -> bool {
        let (w, b) = Self::slot(seq);
        self.bits[w] & b != 0
    }

    fn set(&mut self, seq: u64) {
        let (w, b) = Self::slot(seq);
        self.bits[w] |= b;
    }

    fn clear(&mut self, seq: u64) {
        let (w, b) = Self::slot(seq);
        self.bits[w] &= !b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn duplicates_and_old_numbers_are_refused() {
        let mut w = ReplayWindow::new();
        assert_eq!(w.highest(), None);
        for s in [5u64, 3, 9, 4] {
            assert_eq!(w.check(s), Ok(()));
            w.insert(s);
        }
        assert_eq!(w.check(5), Err(ReplayError::Duplicate));
        assert_eq!(w.check(3), Err(ReplayError::Duplicate));
        assert_eq!(w.check(6), Ok(()));
        w.insert(9 + ReplayWindow::SIZE);
        assert_eq!(w.check(9), Err(ReplayError::TooOld));
        assert_eq!(w.check(10), Ok(()));
        assert_eq!(w.check(9 + ReplayWindow::SIZE), Err(ReplayError::Duplicate));
    }

    #[test]
    fn zero_and_the_top_of_the_space() {
        let mut w = ReplayWindow::new();
        assert_eq!(w.check(0), Ok(()));
        w.insert(0);
        assert_eq!(w.check(0), Err(ReplayError::Duplicate));
        w.insert(u64::MAX - 1);
        assert_eq!(w.check(u64::MAX - 1), Err(ReplayError::Duplicate));
        assert_eq!(w.check(0), Err(ReplayError::TooOld));
    }

    proptest! {
        /// Against a model that remembers everything: the window never accepts a number
        /// twice, and accepts every fresh number within SIZE of the highest.
        #[test]
        fn matches_a_complete_model(seqs in prop::collection::vec(0u64..6000, 1..400)) {
            let mut w = ReplayWindow::new();
            let mut seen = std::collections::BTreeSet::new();
            let mut highest: Option<u64> = None;
            for s in seqs {
                let fresh = !seen.contains(&s);
                let in_window = highest.is_none_or(|h| s + ReplayWindow::SIZE > h);
                let verdict = w.check(s);
                if !fresh {
                    prop_assert!(verdict.is_err(), "replay of {} accepted", s);
                } else {
                    prop_assert_eq!(verdict.is_ok(), in_window, "seq {} highest {:?}", s, highest);
                }
                if verdict.is_ok() {
                    w.insert(s);
                    seen.insert(s);
                    highest = Some(highest.map_or(s, |h| h.max(s)));
                }
            }
        }
    }
}
