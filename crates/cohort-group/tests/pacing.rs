//! Not a speed test (the simulator charges no CPU): a flooded group must be paced by its
//! acknowledgements and windows, never by timers. With 1 ms links and every member keeping
//! its window full, a stall that waits for a heartbeat, a resend or a NAK timer shows up as
//! a rate far below what the windows allow.
mod support;
use cohort_group::{Channel, GroupEvent};
use std::time::Duration;

fn flooded_rate(members: usize) -> f64 {
    let mut g = support::Group::new(41, members, |c| {
        c.heartbeat_interval = Duration::from_millis(100);
        c.suspect_timeout = Duration::from_secs(1);
    });
    g.start_all();
    let all: Vec<usize> = (0..members).collect();
    g.wait_converged(&all, Duration::from_secs(6))
        .expect("view");
    let start = g.sim.now();
    for _ in 0..500 {
        for i in 0..members {
            while g.send(i, Channel::Reliable, vec![1; 100]) {}
        }
        g.run_for(Duration::from_millis(1)).expect("run");
    }
    let secs = g.sim.now().saturating_duration_since(start).as_secs_f64();
    let delivered = g.events_per_node()[members - 1]
        .iter()
        .filter(|e| {
            matches!(
                e,
                GroupEvent::Deliver {
                    channel: Channel::Reliable,
                    ..
                }
            )
        })
        .count() as f64;
    g.run_for(Duration::from_secs(2)).expect("drain");
    g.check_all().expect("checkers");
    delivered / secs
}

#[test]
fn a_flooded_group_is_paced_by_acknowledgements_not_by_timers() {
    for members in [2, 4] {
        let rate = flooded_rate(members);
        // The send window (32) per member and 5 ms links allow well over 5,000 messages per
        // second per member; one wait on a 50 ms timer per window would cap it near 640.
        assert!(
            rate > 4_000.0 * members as f64,
            "{members} members: {rate:.0} messages/s"
        );
    }
}
