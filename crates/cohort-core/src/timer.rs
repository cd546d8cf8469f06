//! A fixed table of deadlines indexed by a closed enum (the quinn-proto shape).

use crate::Timestamp;

/// A closed set of timers a core uses. Implement it on a fieldless enum.
pub trait Timer: Copy + Eq + std::fmt::Debug + 'static {
    /// Every timer, in index order: `ALL[t.index()] == t`.
    const ALL: &'static [Self];
    /// Position of this timer in the table, below `ALL.len()`.
    fn index(self) -> usize;
}

/// Deadlines for the `N` timers of `T`. `N` must equal `T::ALL.len()`.
///
/// A core sets and stops timers while handling input, reports [`TimerTable::next`] from its
/// `poll_timeout`, and calls [`TimerTable::take_expired`] from `handle_timeout`; a spurious
/// `handle_timeout` finds nothing expired and is harmless.
#[derive(Clone, Debug)]
pub struct TimerTable<T: Timer, const N: usize> {
    deadlines: [Option<Timestamp>; N],
    _kind: std::marker::PhantomData<T>,
}

impl<T: Timer, const N: usize> Default for TimerTable<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Timer, const N: usize> TimerTable<T, N> {
    /// A table with every timer stopped.
    ///
    /// # Panics
    /// If `N != T::ALL.len()`: that is a programming error in the core, caught by its tests.
    pub fn new() -> Self {
        assert_eq!(N, T::ALL.len(), "TimerTable size must match the timer enum");
        TimerTable {
            deadlines: [None; N],
            _kind: std::marker::PhantomData,
        }
    }

    /// Arms `timer` to fire at `at`, replacing any earlier deadline.
    pub fn set(&mut self, timer: T, at: Timestamp) {
        self.deadlines[timer.index()] = Some(at);
    }

    /// Stops `timer`.
    pub fn stop(&mut self, timer: T) {
        self.deadlines[timer.index()] = None;
    }

    /// When `timer` fires, if armed.
    pub fn get(&self, timer: T) -> Option<Timestamp> {
        self.deadlines[timer.index()]
    }

    /// Whether `timer` is armed.
    pub fn is_set(&self, timer: T) -> bool {
        self.get(timer).is_some()
    }

    /// The earliest armed timer and its deadline (ties go to the lower index).
    pub fn next(&self) -> Option<(T, Timestamp)> {
        T::ALL
            .iter()
            .filter_map(|&t| self.deadlines[t.index()].map(|at| (t, at)))
            .min_by_key(|&(t, at)| (at, t.index()))
    }

    /// The earliest deadline, for `poll_timeout`.
    pub fn next_deadline(&self) -> Option<Timestamp> {
        self.next().map(|(_, at)| at)
    }

    /// Stops and yields, in index order, every timer due at or before `now`.
    pub fn take_expired(&mut self, now: Timestamp) -> impl Iterator<Item = T> + '_ {
        T::ALL
            .iter()
            .copied()
            .filter(move |t| match self.deadlines[t.index()] {
                Some(at) if at <= now => {
                    self.deadlines[t.index()] = None;
                    true
                }
                _ => false,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum T3 {
        A,
        B,
        C,
    }
    impl Timer for T3 {
        const ALL: &'static [Self] = &[T3::A, T3::B, T3::C];
        fn index(self) -> usize {
            self as usize
        }
    }

    #[test]
    fn earliest_wins_and_expiry_stops() {
        let mut t = TimerTable::<T3, 3>::new();
        assert_eq!(t.next(), None);
        t.set(T3::C, Timestamp::from_millis(3));
        t.set(T3::A, Timestamp::from_millis(7));
        t.set(T3::B, Timestamp::from_millis(3));
        assert_eq!(t.next(), Some((T3::B, Timestamp::from_millis(3))));
        let fired: Vec<_> = t.take_expired(Timestamp::from_millis(3)).collect();
        assert_eq!(fired, vec![T3::B, T3::C]);
        assert_eq!(t.next_deadline(), Some(Timestamp::from_millis(7)));
        // A spurious timeout fires nothing.
        assert_eq!(t.take_expired(Timestamp::from_millis(6)).count(), 0);
        t.stop(T3::A);
        assert!(!t.is_set(T3::A));
        assert_eq!(t.next(), None);
    }

    #[test]
    #[should_panic(expected = "TimerTable size")]
    fn size_mismatch_is_caught() {
        let _ = TimerTable::<T3, 2>::new();
    }
}
