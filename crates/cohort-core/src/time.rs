//! Time as the caller tells it.

use std::fmt;
use std::ops::{Add, AddAssign, Sub};
use std::time::Duration;

/// A point in time, in nanoseconds since an epoch the driver chooses (the simulator starts at
/// zero; the tokio driver uses the moment it started).
///
/// Cores compare and add timestamps but never read a clock: every `now` comes from the caller.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The epoch.
    pub const ZERO: Timestamp = Timestamp(0);
    /// The latest representable time; adding to it saturates.
    pub const MAX: Timestamp = Timestamp(u64::MAX);

    /// A timestamp `nanos` nanoseconds after the epoch.
    pub const fn from_nanos(nanos: u64) -> Self {
        Timestamp(nanos)
    }

    /// A timestamp `micros` microseconds after the epoch.
    pub const fn from_micros(micros: u64) -> Self {
        Timestamp(micros.saturating_mul(1_000))
    }

    /// A timestamp `millis` milliseconds after the epoch.
    pub const fn from_millis(millis: u64) -> Self {
        Timestamp(millis.saturating_mul(1_000_000))
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time since the epoch.
    pub const fn since_epoch(self) -> Duration {
        Duration::from_nanos(self.0)
    }

    /// How long after `earlier` this is, or zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Timestamp) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// `self + d`, saturating at [`Timestamp::MAX`].
    pub fn saturating_add(self, d: Duration) -> Timestamp {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Timestamp(self.0.saturating_add(nanos))
    }
}

impl Add<Duration> for Timestamp {
    type Output = Timestamp;
    fn add(self, d: Duration) -> Timestamp {
        self.saturating_add(d)
    }
}

impl AddAssign<Duration> for Timestamp {
    fn add_assign(&mut self, d: Duration) {
        *self = self.saturating_add(d);
    }
}

impl Sub<Timestamp> for Timestamp {
    type Output = Duration;
    /// Saturating: a later `rhs` gives zero.
    fn sub(self, rhs: Timestamp) -> Duration {
        self.saturating_duration_since(rhs)
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Timestamp {
    /// Seconds with microsecond precision, e.g. `t=1.250000s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "t={}.{:06}s",
            self.0 / 1_000_000_000,
            (self.0 / 1_000) % 1_000_000
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Timestamp::from_millis(10);
        assert_eq!(t + Duration::from_millis(5), Timestamp::from_millis(15));
        assert_eq!(Timestamp::MAX + Duration::from_secs(1), Timestamp::MAX);
        assert_eq!(t - Timestamp::from_millis(20), Duration::ZERO);
        assert_eq!(Timestamp::from_millis(20) - t, Duration::from_millis(10));
        assert_eq!(
            format!("{}", Timestamp::from_micros(1_250_000)),
            "t=1.250000s"
        );
    }
}
