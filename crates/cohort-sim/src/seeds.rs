//! Running many seeds, and saying which one failed.

use cohort_core::Timestamp;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};

/// Environment variable that replays one seed: `COHORT_SIM_SEED=17 cargo test ...` makes
/// [`run_seeds`] and [`sweep`] run seed 17 only.
pub const SEED_ENV: &str = "COHORT_SIM_SEED";

/// Environment variable that sets how many seeds [`sweep`] runs (`COHORT_SIM_SEEDS=10000`
/// for a long soak), overriding the count the test gives.
pub const SEEDS_ENV: &str = "COHORT_SIM_SEEDS";

/// What kind of failure a [`SimFailure`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// A check made by the test ([`Sim::check`](crate::Sim::check),
    /// [`Sim::failure`](crate::Sim::failure)) did not hold.
    Check,
    /// A `run_*` call used up [`SimConfig::max_steps`](crate::SimConfig::max_steps).
    StepLimit,
    /// A `run_until_*` call reached its time limit before its condition held.
    Deadline,
}

/// A failed simulation: the seed to replay it, the virtual time, a message and the last
/// entries of the log. `Display` and `Debug` print the same report, so that `unwrap()` and a
/// test returning `Result<(), SimFailure>` show the seed and the log readably.
#[derive(Clone, PartialEq, Eq)]
pub struct SimFailure {
    pub(crate) seed: u64,
    pub(crate) at: Timestamp,
    pub(crate) kind: FailureKind,
    pub(crate) message: String,
    pub(crate) tail: Vec<String>,
    pub(crate) log_len: usize,
}

impl SimFailure {
    /// The seed that replays the failing run.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Virtual time of the failure.
    pub fn at(&self) -> Timestamp {
        self.at
    }

    /// What kind of failure it is.
    pub fn kind(&self) -> FailureKind {
        self.kind
    }

    /// The message, without seed or log.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The last log entries, formatted, oldest first.
    pub fn log_tail(&self) -> &[String] {
        &self.tail
    }
}

impl fmt::Display for SimFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "simulation failed at {} (seed {}): {}",
            self.at, self.seed, self.message
        )?;
        writeln!(f, "replay with {SEED_ENV}={}", self.seed)?;
        write!(
            f,
            "last {} of {} log entries:",
            self.tail.len(),
            self.log_len
        )?;
        for line in &self.tail {
            write!(f, "\n  {line}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for SimFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for SimFailure {}

impl From<SimFailure> for String {
    /// Lets `?` turn a failure into the `String` error of a [`run_seeds`] closure.
    fn from(failure: SimFailure) -> String {
        failure.to_string()
    }
}

/// Runs `f` for each seed, stopping at the first failure with a panic whose message holds
/// the seed and `COHORT_SIM_SEED=<seed>`. A panic inside `f` (an `assert!` in the test, or
/// a panicking core) is reported the same way. Returns how many seeds ran.
///
/// If [`SEED_ENV`] is set, only that seed runs, whatever `seeds` holds.
///
/// # Panics
/// On the first failing seed, and if [`SEED_ENV`] is set but is not a number.
///
/// ```
/// use cohort_sim::run_seeds;
///
/// # if std::env::var_os(cohort_sim::SEED_ENV).is_some() { return; }
/// // Each seed builds and runs its own simulation; here the "run" is a stand-in.
/// let ran = run_seeds(0..4, |seed| if seed < 10 { Ok(()) } else { Err(format!("{seed} too big")) });
/// assert_eq!(ran, 4);
/// ```
pub fn run_seeds<E: fmt::Display>(
    seeds: impl IntoIterator<Item = u64>,
    f: impl FnMut(u64) -> Result<(), E>,
) -> u64 {
    match replay_seed() {
        Some(seed) => run_each([seed], f),
        None => run_each(seeds, f),
    }
}

/// Runs seeds `0..n` through [`run_seeds`], where `n` is [`SEEDS_ENV`] if set and
/// `default_count` otherwise ([`SEED_ENV`] still replays a single seed).
///
/// # Panics
/// As [`run_seeds`], and if [`SEEDS_ENV`] is set but is not a number.
pub fn sweep<E: fmt::Display>(default_count: u64, f: impl FnMut(u64) -> Result<(), E>) -> u64 {
    run_seeds(0..seed_count(default_count), f)
}

/// The seed in [`SEED_ENV`], if set.
///
/// # Panics
/// If the variable is set but is neither decimal nor `0x`-prefixed hexadecimal.
pub fn replay_seed() -> Option<u64> {
    env_number(SEED_ENV)
}

/// [`SEEDS_ENV`] if set, else `default_count`.
///
/// # Panics
/// If the variable is set but is not a number.
pub fn seed_count(default_count: u64) -> u64 {
    env_number(SEEDS_ENV).unwrap_or(default_count)
}

fn env_number(var: &str) -> Option<u64> {
    let text = std::env::var(var).ok()?;
    match parse_u64(&text) {
        Some(n) => Some(n),
        None => panic!("{var}={text:?} is not a number"),
    }
}

fn parse_u64(text: &str) -> Option<u64> {
    let text = text.trim();
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

fn run_each<E: fmt::Display>(
    seeds: impl IntoIterator<Item = u64>,
    mut f: impl FnMut(u64) -> Result<(), E>,
) -> u64 {
    let mut ran = 0;
    for seed in seeds {
        // The closure is not touched again after a panic: we re-panic at once.
        match panic::catch_unwind(AssertUnwindSafe(|| f(seed))) {
            Ok(Ok(())) => ran += 1,
            Ok(Err(e)) => panic!("{}", seed_failed(seed, &e.to_string())),
            Err(payload) => {
                let msg = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".to_owned());
                panic!("{}", seed_failed(seed, &format!("panicked: {msg}")));
            }
        }
    }
    ran
}

fn seed_failed(seed: u64, what: &str) -> String {
    format!("cohort-sim: seed {seed} failed (replay with {SEED_ENV}={seed}): {what}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_parse() {
        assert_eq!(parse_u64("17"), Some(17));
        assert_eq!(parse_u64(" 0x1f "), Some(31));
        assert_eq!(parse_u64("seventeen"), None);
    }

    #[test]
    fn run_each_names_the_failing_seed() {
        let mut seen = Vec::new();
        let result = panic::catch_unwind(AssertUnwindSafe(|| {
            run_each([3, 5, 8, 13], |seed| {
                seen.push(seed);
                if seed == 8 {
                    Err("boom")
                } else {
                    Ok(())
                }
            })
        }));
        let payload = result.expect_err("seed 8 fails");
        let msg = payload.downcast_ref::<String>().expect("formatted message");
        assert!(
            msg.contains("seed 8 failed") && msg.contains("COHORT_SIM_SEED=8"),
            "{msg}"
        );
        assert!(msg.contains("boom"), "{msg}");
        assert_eq!(seen, [3, 5, 8], "stops at the first failure");
        assert_eq!(run_each(0..5, |_| Ok::<(), String>(())), 5);
    }
}
