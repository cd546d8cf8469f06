//! ALPHA in the simulator: paths of 0 to 4 relays, every mode, faults and an adversary.
//!
//! `COHORT_SIM_SEED=<seed>` replays one seed; `COHORT_SIM_SEEDS=<n>` runs `n` seeds.

mod support;

use cohort_hop::Mode;
use std::time::Duration;
use support::Path;

#[test]
fn every_mode_delivers_through_two_relays() {
    for mode in [
        Mode::Unprotected,
        Mode::N,
        Mode::C { batch: 8 },
        Mode::M { batch: 16 },
    ] {
        let mut path = Path::new(1, 2, |_| {});
        path.connect().expect("connect");
        let assoc = path.open(mode).expect("open");
        let sent: Vec<Vec<u8>> = (0..100)
            .map(|i| format!("message {i}").into_bytes())
            .collect();
        for m in &sent {
            assert!(path.send(assoc, m));
        }
        path.sim.run_for(Duration::from_secs(10)).expect("run");
        assert_eq!(path.received_at_b(), sent, "mode {mode}");
        for &r in &path.relays {
            let c = path.sim.node(r).relay().unwrap().counters();
            assert_eq!(
                c.forged + c.malformed + c.stale + c.unverifiable,
                0,
                "{mode}: {c:?}"
            );
        }
    }
}
