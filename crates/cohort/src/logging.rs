//! Human logs for the `cohort` command: a `tracing` subscriber that writes to standard error,
//! filtered by `COHORT_LOG` (or, when that is unset, `RUST_LOG`), `warn` by default.
//!
//! ```text
//!   tracing::warn!/info!/debug! (library and commands)
//!        │
//!        ▼
//!   EnvFilter (COHORT_LOG > RUST_LOG > "warn") ──▶ fmt layer ──▶ stderr (people, journald)
//!
//!   JSON events ──▶ stdout (programs) -- never touched by this module
//! ```
//!
//! Standard output stays reserved for the commands' JSON lines and tables, so a log line can
//! never corrupt what a program reads.

use crate::UsageError;
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// The variable that wins over `RUST_LOG`.
pub const COHORT_LOG: &str = "COHORT_LOG";
/// The filter used when neither variable is set.
pub const DEFAULT_FILTER: &str = "warn";

/// Installs the stderr subscriber. A malformed `COHORT_LOG` is a user error (exit 2); a
/// malformed `RUST_LOG`, which may be meant for another program, is reported on stderr and
/// the default filter is used.
pub fn init() -> Result<(), UsageError> {
    let filter = choose_filter(
        std::env::var(COHORT_LOG).ok().as_deref(),
        std::env::var("RUST_LOG").ok().as_deref(),
    )?;
    let installed = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
    // Only a second installation fails; the first one stays and keeps logging.
    if installed.is_ok() {
        tracing::debug!(version = env!("CARGO_PKG_VERSION"), "cohort starting");
    }
    Ok(())
}

/// The filter for the given `COHORT_LOG` and `RUST_LOG` values (unset or empty: not given).
fn choose_filter(cohort: Option<&str>, rust: Option<&str>) -> Result<EnvFilter, UsageError> {
    let given = |v: Option<&str>| {
        v.map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    if let Some(spec) = given(cohort) {
        return EnvFilter::try_new(&spec)
            .map_err(|e| UsageError(format!("{COHORT_LOG}={spec:?} is not a log filter: {e}")));
    }
    if let Some(spec) = given(rust) {
        match EnvFilter::try_new(&spec) {
            Ok(filter) => return Ok(filter),
            Err(e) => {
                eprintln!("cohort: ignoring RUST_LOG={spec:?} ({e}); logging at {DEFAULT_FILTER:?}")
            }
        }
    }
    Ok(EnvFilter::new(DEFAULT_FILTER))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(cohort: Option<&str>, rust: Option<&str>) -> String {
        match choose_filter(cohort, rust) {
            Ok(f) => f.to_string(),
            Err(UsageError(e)) => format!("error: {e}"),
        }
    }

    #[test]
    fn cohort_log_wins_then_rust_log_then_warn() {
        assert_eq!(shown(Some("debug"), Some("trace")), "debug");
        assert_eq!(shown(None, Some("info")), "info");
        assert_eq!(shown(Some(" "), Some("info")), "info");
        assert_eq!(shown(None, None), "warn");
        assert_eq!(shown(None, Some("[[[")), "warn");
        assert!(shown(Some("[[["), None).starts_with("error: COHORT_LOG"));
    }
}
