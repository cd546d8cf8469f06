//! A failing run names its seed, and the seed replays it.

mod toy;

use cohort_sim::{run_seeds, sweep, FailureKind, Loss, NodeId, SimConfig, SimFailure, SEED_ENV};
use std::panic::{self, AssertUnwindSafe};
use toy::{ms, plain};

/// When a developer replays one seed, the multi-seed assertions below do not apply.
fn replaying() -> bool {
    std::env::var_os(SEED_ENV).is_some()
}

fn panic_message(f: impl FnOnce()) -> String {
    let payload = panic::catch_unwind(AssertUnwindSafe(f)).expect_err("should have panicked");
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .expect("a text panic")
}

/// A run that fails for some seeds: one node sends five datagrams at 30% loss, and the
/// check demands that nothing was lost. (Its whole log fits in a failure's tail.)
fn fragile(seed: u64) -> Result<(), SimFailure> {
    let mut sim = plain(SimConfig::with_seed(seed), 2);
    let (a, b) = (NodeId::from_index(0), NodeId::from_index(1));
    sim.add_rule(Loss(0.3));
    for i in 0..5u8 {
        sim.with_node(a, |t, _| t.send(b.addr(), &[i]));
    }
    sim.run_until_quiet(ms(100))?;
    sim.check(sim.counters().dropped() == 0, "a datagram was lost")
}

#[test]
fn run_seeds_names_the_first_failing_seed() {
    if replaying() {
        return;
    }
    let mut ran = Vec::new();
    let msg = panic_message(|| {
        run_seeds([1, 2, 7, 9], |seed| {
            ran.push(seed);
            if seed == 7 {
                Err(format!("invariant broken at seed {seed}"))
            } else {
                Ok(())
            }
        });
    });
    assert!(msg.contains("seed 7 failed"), "{msg}");
    assert!(msg.contains("COHORT_SIM_SEED=7"), "{msg}");
    assert!(msg.contains("invariant broken"), "{msg}");
    assert_eq!(ran, [1, 2, 7]);
}

#[test]
fn a_panic_inside_a_seed_is_reported_with_the_seed() {
    if replaying() {
        return;
    }
    let msg = panic_message(|| {
        run_seeds(40..50, |seed| {
            assert!(seed != 44, "assertion about seed {seed}");
            Ok::<(), String>(())
        });
    });
    assert!(
        msg.contains("seed 44") && msg.contains("COHORT_SIM_SEED=44"),
        "{msg}"
    );
    assert!(msg.contains("assertion about seed 44"), "{msg}");
}

#[test]
fn a_sim_failure_carries_its_seed_and_the_end_of_the_log() {
    if replaying() {
        return;
    }
    let failing = (0..100)
        .find(|&s| fragile(s).is_err())
        .expect("30% loss drops something");
    let failure = fragile(failing).unwrap_err();
    assert_eq!(failure.seed(), failing);
    assert_eq!(failure.kind(), FailureKind::Check);
    let text = failure.to_string();
    assert!(text.contains(&format!("seed {failing}")), "{text}");
    assert!(
        text.contains(&format!("COHORT_SIM_SEED={failing}")),
        "{text}"
    );
    assert!(text.contains("a datagram was lost"), "{text}");
    // 5 sent, each dropped or delivered (with the toy's event): under 30, so all of it.
    let n = failure.log_tail().len();
    assert!((11..15).contains(&n), "{text}");
    assert!(
        text.contains(&format!("last {n} of {n} log entries")),
        "{text}"
    );
    assert!(
        text.contains("dropped") && text.contains("loss"),
        "the tail shows the drop: {text}"
    );

    // The same seed replays the same failure; sweep finds it too.
    assert_eq!(fragile(failing).unwrap_err(), failure);
    let msg = panic_message(|| {
        sweep(100, fragile);
    });
    assert!(msg.contains(&format!("COHORT_SIM_SEED={failing}")), "{msg}");
}

#[test]
fn sweep_runs_the_default_count() {
    if replaying() || std::env::var_os(cohort_sim::SEEDS_ENV).is_some() {
        return;
    }
    let mut seen = Vec::new();
    let ran = sweep(5, |seed| {
        seen.push(seed);
        Ok::<(), String>(())
    });
    assert_eq!(ran, 5);
    assert_eq!(seen, [0, 1, 2, 3, 4]);
}
