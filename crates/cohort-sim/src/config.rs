//! How a simulation is set up.

use std::time::Duration;

/// Settings for a [`Sim`](crate::Sim). Change a few fields with struct-update syntax:
///
/// ```
/// use cohort_sim::SimConfig;
/// use std::time::Duration;
///
/// let config = SimConfig { seed: 42, jitter: Duration::from_millis(3), ..SimConfig::default() };
/// assert_eq!(config.latency, Duration::from_millis(10));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Seeds the one RNG behind every random choice; the same seed replays the same run.
    pub seed: u64,
    /// Base one-way delay of every datagram. Default 10 ms.
    pub latency: Duration,
    /// Extra one-way delay drawn uniformly from `[0, jitter]` for each datagram. Jitter
    /// larger than the spacing between datagrams reorders them. Default zero, so that links
    /// are FIFO unless a rule says otherwise.
    pub jitter: Duration,
    /// Largest datagram delivered, in bytes; larger ones are dropped and logged.
    /// Default 1500.
    pub mtu: usize,
    /// A [`Verdict::Duplicate`](crate::Verdict::Duplicate) copy arrives after the original
    /// by a gap drawn from `(0, duplicate_gap]`. Default 1 ms.
    pub duplicate_gap: Duration,
    /// A [`Verdict::Reorder`](crate::Verdict::Reorder) holds a datagram back by an extra
    /// delay drawn from `[reorder_window / 2, reorder_window]`, so that datagrams sent
    /// shortly after it overtake it. Default 50 ms.
    pub reorder_window: Duration,
    /// Most steps one `run_*` call may take before it gives up with
    /// [`FailureKind::StepLimit`](crate::FailureKind::StepLimit) instead of hanging.
    /// Default 10 000 000.
    pub max_steps: u64,
    /// Most datagrams (and, separately, events) one node may emit after one input before
    /// the simulator panics, naming the seed: a core that never stops sending is a bug.
    /// Default 100 000.
    pub max_outputs_per_drain: usize,
    /// Whether datagram entries (sent, delivered, dropped, fault verdicts) go into the log.
    /// Events, timeouts, partitions and crashes are always logged and counters always
    /// count. Default true; turn it off for long runs that only check events.
    pub log_packets: bool,
    /// Whether a [`LogKind::Timeout`](crate::LogKind::Timeout) entry goes into the log each
    /// time a node's deadline fires. The `timeouts` counter counts them either way. Default
    /// true; turn it off for runs of thousands of nodes, whose timers would fill the log
    /// (10,000 nodes with a 100 ms timer log 100,000 entries a simulated second).
    pub log_timeouts: bool,
    /// Whether [`Sim::partition`](crate::Sim::partition) logs, for every node, the nodes it
    /// can reach ([`LogKind::Partitioned`](crate::LogKind::Partitioned)): n entries that
    /// list up to n nodes each, so n² node ids for one cut. Default true; turn it off for
    /// runs of thousands of nodes. `heal` is logged either way.
    pub log_partitions: bool,
    /// How many of the last log entries a [`SimFailure`](crate::SimFailure) shows.
    /// Default 30.
    pub failure_tail: usize,
    /// Print every log entry to stderr as it is recorded. Default false.
    pub trace: bool,
}

impl SimConfig {
    /// The defaults with another seed.
    pub fn with_seed(seed: u64) -> Self {
        SimConfig {
            seed,
            ..SimConfig::default()
        }
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 0,
            latency: Duration::from_millis(10),
            jitter: Duration::ZERO,
            mtu: 1500,
            duplicate_gap: Duration::from_millis(1),
            reorder_window: Duration::from_millis(50),
            max_steps: 10_000_000,
            max_outputs_per_drain: 100_000,
            log_packets: true,
            log_timeouts: true,
            log_partitions: true,
            failure_tail: 30,
            trace: false,
        }
    }
}
