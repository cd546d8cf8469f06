//! A group of one: founding, both channels, rekey, leave.
mod support;
use cohort_group::{Channel, GroupEvent};
use std::time::Duration;

#[test]
fn a_group_of_one_delivers_to_itself() {
    let mut g = support::Group::new(9, 1, |_| {});
    let n = g.nodes[0];
    g.sim.with_node(n, |node, now| node.member.start(now, &[]));
    assert!(g.converged(&[0]));
    for k in 0..5 {
        assert!(g.send(0, Channel::Reliable, vec![k]));
    }
    assert!(g.send(0, Channel::Unreliable, vec![9]));
    g.run_for(Duration::from_millis(200)).expect("run");
    g.sim.with_node(n, |node, now| node.member.rekey(now));
    g.run_for(Duration::from_millis(200)).expect("run");
    assert_eq!(g.current_views()[0].as_ref().map(|v| v.2), Some(2));
    g.check_all().expect("checkers");
    let delivered = g.events_per_node()[0]
        .iter()
        .filter(|e| matches!(e, GroupEvent::Deliver { .. }))
        .count();
    assert_eq!(delivered, 6);
}
