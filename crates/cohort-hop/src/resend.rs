//! When an endpoint sends something again: the one backoff rule for handshake packets,
//! unanswered control messages and unacknowledged S1s. Owns only the timing of one resent
//! packet (when it was last sent, how often again); what is resent and when to give up
//! stay with the caller. Must not touch packets, flows or peers.

use cohort_core::Timestamp;
use std::time::Duration;

/// How the wait between sends grows: doubling after each resend, for at most
/// `max_doublings` doublings, and never longer than `cap` (nor shorter than the base).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    max_doublings: u32,
    cap: Duration,
}

/// Handshake packets and control messages: the base doubles up to 64 times itself.
pub(crate) const SIGNALLING: Backoff = Backoff {
    max_doublings: 6,
    cap: Duration::MAX,
};

/// The handshake packet of a reconnection: the base doubles, but it is resent at least once
/// a second, so a path that comes back is found within a second.
pub(crate) const RECONNECT: Backoff = Backoff {
    max_doublings: 6,
    cap: Duration::from_secs(1),
};

/// An S1 awaiting its A1: the RTO doubles up to 16 times itself, but a resend comes at
/// least every 2 s.
pub(crate) const S1: Backoff = Backoff {
    max_doublings: 4,
    cap: Duration::from_secs(2),
};

impl Backoff {
    /// The wait after the send numbered `tries` (0: the first send) when the base is `base`.
    fn wait(self, base: Duration, tries: u32) -> Duration {
        (base * (1 << tries.min(self.max_doublings)))
            .min(self.cap)
            .max(base)
    }
}

/// One packet that is sent again until answered: when it was last sent and how many times
/// it was sent again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Resend {
    /// When it was last sent.
    pub sent_at: Timestamp,
    /// How many times it was sent again.
    pub tries: u32,
}

impl Resend {
    /// Sent for the first time at `now`.
    pub fn new(now: Timestamp) -> Resend {
        Resend {
            sent_at: now,
            tries: 0,
        }
    }

    /// When it is due to be sent again, under `rule` with base `base`.
    pub fn deadline(&self, rule: Backoff, base: Duration) -> Timestamp {
        self.sent_at + rule.wait(base, self.tries)
    }

    /// Whether it is due at `now`.
    pub fn is_due(&self, now: Timestamp, rule: Backoff, base: Duration) -> bool {
        now >= self.deadline(rule, base)
    }

    /// It was sent again at `now`.
    pub fn resent(&mut self, now: Timestamp) {
        self.tries += 1;
        self.sent_at = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signalling_doubles_six_times_then_stays() {
        let base = Duration::from_millis(200);
        let mut r = Resend::new(Timestamp::ZERO);
        let mut waits = Vec::new();
        for _ in 0..9 {
            waits.push(r.deadline(SIGNALLING, base).as_nanos() / 1_000_000);
            r.tries += 1;
        }
        assert_eq!(
            waits,
            [200, 400, 800, 1600, 3200, 6400, 12800, 12800, 12800]
        );
    }

    #[test]
    fn reconnect_doubles_up_to_one_second() {
        let base = Duration::from_millis(200);
        let mut r = Resend::new(Timestamp::ZERO);
        let mut waits = Vec::new();
        for _ in 0..6 {
            waits.push(r.deadline(RECONNECT, base).as_nanos() / 1_000_000);
            r.tries += 1;
        }
        assert_eq!(waits, [200, 400, 800, 1000, 1000, 1000]);
    }

    #[test]
    fn s1_doubles_to_two_seconds_and_never_below_the_rto() {
        let mut r = Resend::new(Timestamp::from_millis(1000));
        let ms = |r: &Resend, base| r.deadline(S1, base).as_nanos() / 1_000_000 - 1000;
        let rto = Duration::from_millis(300);
        let waits: Vec<u64> = (0..6)
            .map(|t| {
                r.tries = t;
                ms(&r, rto)
            })
            .collect();
        assert_eq!(waits, [300, 600, 1200, 2000, 2000, 2000]);
        // An RTO above the cap is used as it is.
        r.tries = 3;
        assert_eq!(ms(&r, Duration::from_secs(3)), 3000);
        assert!(!r.is_due(Timestamp::from_millis(3999), S1, Duration::from_secs(3)));
        assert!(r.is_due(Timestamp::from_millis(4000), S1, Duration::from_secs(3)));
        r.resent(Timestamp::from_millis(4000));
        assert_eq!(
            r,
            Resend {
                sent_at: Timestamp::from_millis(4000),
                tries: 4
            }
        );
    }
}
