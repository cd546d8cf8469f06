//! What `cohort group bench` checks and measures beside the message counts: that every
//! member delivered one total order (each member's [`OrderCheck`]), and the process's CPU
//! time ([`process_cpu`]).
//!
//! The order check at one member, for reliable deliveries: within a view, the total-order
//! positions (`order`) run 0, 1, 2, ... with no gap or repeat, and each sender's message
//! numbers (`seq`) increase. A running hash covers (view, position, sender, seq) of every
//! delivery in the current view; after sending stops and every member has delivered up to
//! the same position, equal hashes mean every member delivered the same messages in the
//! same order.

use cohort_group::{MemberId, ViewId};
use std::collections::HashMap;
use std::time::Duration;

/// One member's record of its reliable deliveries.
#[derive(Default)]
pub struct OrderCheck {
    view: Option<ViewId>,
    /// The next total-order position expected in `view` (`None`: the first delivery in a
    /// view sets it, for a member that joined a view already under way).
    next_order: Option<u64>,
    last_seq: HashMap<MemberId, u64>,
    hash: u64,
    /// Deliveries in `view`.
    in_view: u64,
    /// Gaps or repeats in the order positions, sequence numbers that did not increase, and
    /// reliable deliveries with no order position.
    pub violations: u64,
}

impl OrderCheck {
    /// Records one reliable delivery.
    pub fn deliver(&mut self, view: ViewId, sender: MemberId, seq: u64, order: Option<u64>) {
        if self.view != Some(view) {
            self.view = Some(view);
            self.next_order = None;
            self.hash = FNV_OFFSET;
            self.in_view = 0;
        }
        let Some(order) = order else {
            self.violations += 1;
            return;
        };
        if self.next_order.is_some_and(|next| next != order) {
            self.violations += 1;
        }
        self.next_order = Some(order + 1);
        match self.last_seq.insert(sender, seq) {
            Some(last) if last >= seq => self.violations += 1,
            _ => {}
        }
        self.in_view += 1;
        for word in [view.seq, order, seq] {
            self.hash = fnv(self.hash, &word.to_le_bytes());
        }
        self.hash = fnv(self.hash, sender.as_bytes());
    }

    /// Where this member stands: its view, the next position it expects, and the hash of
    /// its deliveries in that view.
    pub fn position(&self) -> (Option<ViewId>, Option<u64>, u64) {
        (self.view, self.next_order, self.hash)
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a: a checksum over what the members delivered (they are our own, not an
/// adversary's, so no keyed hash is needed).
fn fnv(mut hash: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// Whether every member stands at the same view, position and hash (`None` while they
/// differ in view or position: still delivering; `Some(false)`: same position, different
/// histories).
pub fn agree(positions: &[(Option<ViewId>, Option<u64>, u64)]) -> Option<bool> {
    let first = positions.first()?;
    if positions.iter().any(|p| (p.0, p.1) != (first.0, first.1)) {
        return None;
    }
    Some(positions.iter().all(|p| p.2 == first.2))
}

/// User plus system CPU time of this process (every thread) so far, from /proc/self/stat
/// (Linux; `None` elsewhere). Its unit is USER_HZ, which Linux fixes at 100 per second in
/// what /proc reports.
pub fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line; the rest starts at field 3.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

/// Time this process's threads have spent so far on CPU and waiting in a run queue for a
/// CPU, summed over every thread alive now, from /proc/self/task/*/schedstat (Linux, with
/// schedstats; `None` elsewhere): (on CPU, waiting). The kernel updates a thread's figures
/// when it is switched out and at scheduler ticks (4 ms at 250 Hz), so over a phase of a
/// few milliseconds they come in whole ticks for a thread that keeps running: coarse, not
/// exact, but a wait far above the CPU time still says the phase waited for a CPU.
pub fn scheduler_times() -> Option<(Duration, Duration)> {
    let mut on_cpu = 0u64;
    let mut waiting = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let Ok(line) = std::fs::read_to_string(task.ok()?.path().join("schedstat")) else {
            continue; // the thread ended meanwhile
        };
        let (run, wait) = parse_schedstat(&line)?;
        on_cpu = on_cpu.saturating_add(run);
        waiting = waiting.saturating_add(wait);
    }
    Some((Duration::from_nanos(on_cpu), Duration::from_nanos(waiting)))
}

/// The first two fields of a schedstat line: nanoseconds on CPU, nanoseconds waiting.
fn parse_schedstat(line: &str) -> Option<(u64, u64)> {
    let mut fields = line.split_whitespace().map(str::parse::<u64>);
    Some((fields.next()?.ok()?, fields.next()?.ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_crypto::CryptoProvider;

    #[test]
    fn schedstat_lines_parse() {
        assert_eq!(parse_schedstat("123 456 7\n"), Some((123, 456)));
        assert_eq!(parse_schedstat("123"), None);
        assert_eq!(parse_schedstat("x 1 2"), None);
    }

    fn ids() -> (MemberId, MemberId, ViewId) {
        let provider = CryptoProvider::default_provider();
        let a = cohort_channel::identity::Identity::generate(&provider).unwrap();
        let b = cohort_channel::identity::Identity::generate(&provider).unwrap();
        let (a, b) = (MemberId(a.public()), MemberId(b.public()));
        (
            a,
            b,
            ViewId {
                seq: 3,
                coordinator: a,
            },
        )
    }

    #[test]
    fn the_same_deliveries_agree_and_a_swap_does_not() {
        let (a, b, view) = ids();
        let (mut x, mut y, mut z) = (
            OrderCheck::default(),
            OrderCheck::default(),
            OrderCheck::default(),
        );
        for c in [&mut x, &mut y] {
            c.deliver(view, a, 1, Some(0));
            c.deliver(view, b, 1, Some(1));
        }
        z.deliver(view, b, 1, Some(0));
        z.deliver(view, a, 1, Some(1));
        assert_eq!(x.violations + y.violations + z.violations, 0);
        assert_eq!(agree(&[x.position(), y.position()]), Some(true));
        assert_eq!(agree(&[x.position(), z.position()]), Some(false));
        y.deliver(view, a, 2, Some(2));
        assert_eq!(agree(&[x.position(), y.position()]), None);
    }

    #[test]
    fn gaps_repeats_and_old_sequence_numbers_are_violations() {
        let (a, _, view) = ids();
        let mut c = OrderCheck::default();
        c.deliver(view, a, 5, Some(10));
        assert_eq!(c.violations, 0);
        c.deliver(view, a, 6, Some(12));
        assert_eq!(c.violations, 1);
        c.deliver(view, a, 6, Some(13));
        assert_eq!(c.violations, 2);
        c.deliver(view, a, 7, None);
        assert_eq!(c.violations, 3);
    }

    #[test]
    fn cpu_time_grows_while_spinning() {
        if !cfg!(target_os = "linux") {
            return;
        }
        let start = process_cpu().expect("/proc/self/stat is readable");
        let give_up = std::time::Instant::now() + Duration::from_secs(20);
        let mut x = 0u64;
        while process_cpu().is_some_and(|t| t <= start) {
            for i in 0..100_000u64 {
                x = std::hint::black_box(x.wrapping_add(i));
            }
            assert!(std::time::Instant::now() < give_up, "no CPU time counted");
        }
    }
}
