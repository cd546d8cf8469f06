//! Groups past the old 1,024-member cap, formed from cold: one member founds the group and
//! the others start over a few seconds with it as their only contact; the leader lets them
//! in in batches (`JOIN_BATCH`), each joiner fetching the member list in parts. The checkers
//! then read every event.

mod support;

use cohort_group::Channel;
use std::time::Duration;
use support::Group;

/// Joiners started every 100 ms: members come up over a few seconds, 500 a second, and the
/// leader lets them in in batches.
const JOINERS_PER_100MS: usize = 50;

/// 300 members from cold: three batches; the group then delivers and the checkers pass.
#[test]
fn three_hundred_members_form_from_cold_in_batches() {
    let n = 300;
    let mut g = Group::new(71, n, |_| {});
    let took = g
        .form_from_cold(JOINERS_PER_100MS, Duration::from_secs(60))
        .expect("formed");
    println!("{n} members formed in {took:?} of simulated time");
    for i in [0, 7, n - 1] {
        assert!(g.send(i, Channel::Reliable, format!("hello from {i}").into_bytes()));
    }
    g.run_for(Duration::from_secs(1)).expect("run");
    g.check_all().expect("checkers");
}

/// 1,100 members, past the old cap of 1,024.
#[test]
fn eleven_hundred_members_form_one_view() {
    let n = 1100;
    let mut g = Group::new(72, n, |_| {});
    let took = g
        .form_from_cold(JOINERS_PER_100MS, Duration::from_secs(60))
        .expect("formed");
    println!("{n} members formed in {took:?} of simulated time");
    assert!(g.send(n - 1, Channel::Reliable, b"past the cap".to_vec()));
    g.run_for(Duration::from_secs(1)).expect("run");
    g.check_all().expect("checkers");
}
