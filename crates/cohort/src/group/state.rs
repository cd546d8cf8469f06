//! State transfer's bookkeeping (no I/O): who needs the group's state, who sends it at a
//! view boundary, and the state message's body.
//!
//! Every member tracks the members it saw join (`needs`) until a state message covering
//! the view they joined in is delivered; at a view where someone still needs the state,
//! the lowest-ranked member that was in the previous view, holds the state and does not
//! itself need it, sends it. Members that went through the same views (virtual synchrony)
//! compute the same sender.
//!
//! ```text
//!   state body = view seq (u64 BE) | view coordinator (32 bytes) | kind (u8: 0 snapshot,
//!                1 none: the sender has no callback, 2 failed) | snapshot, or reason (UTF-8)
//! ```

use super::{MemberId, View, ViewId};
use std::collections::HashMap;

/// What a state message says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The snapshot.
    Snapshot(Vec<u8>),
    /// The sender has no snapshot callback: there is no application state to transfer.
    None,
    /// The sender's callback failed, for this reason.
    Failed(String),
}

/// Encodes a state message for `view`.
pub fn encode(view: ViewId, answer: &Answer) -> Vec<u8> {
    let mut out = Vec::with_capacity(41);
    out.extend_from_slice(&view.seq.to_be_bytes());
    out.extend_from_slice(view.coordinator.as_bytes());
    match answer {
        Answer::Snapshot(bytes) => {
            out.push(0);
            out.extend_from_slice(bytes);
        }
        Answer::None => out.push(1),
        Answer::Failed(reason) => {
            out.push(2);
            out.extend_from_slice(reason.as_bytes());
        }
    }
    out
}

/// Decodes a state message; `None` if it is not one.
pub fn decode(body: &[u8]) -> Option<(ViewId, Answer)> {
    let seq = u64::from_be_bytes(body.get(..8)?.try_into().ok()?);
    let coordinator: [u8; 32] = body.get(8..40)?.try_into().ok()?;
    let rest = body.get(41..)?;
    let answer = match body.get(40)? {
        0 => Answer::Snapshot(rest.to_vec()),
        1 if rest.is_empty() => Answer::None,
        2 => Answer::Failed(String::from_utf8_lossy(rest).into_owned()),
        _ => return None,
    };
    Some((
        ViewId {
            seq,
            coordinator: MemberId::from_bytes(coordinator),
        },
        answer,
    ))
}

/// One member's state-transfer bookkeeping.
pub struct Tracker {
    me: MemberId,
    /// The members of this member's previous view (`None`: it is joining).
    prev: Option<Vec<MemberId>>,
    /// Whether this member holds the group's state.
    has_state: bool,
    /// Members seen to join, with the view they joined in, until the state reaches them.
    needs: HashMap<MemberId, ViewId>,
    /// This member waits for the state since this view.
    waiting: Option<ViewId>,
}

impl Tracker {
    /// A member that is about to join.
    pub fn new(me: MemberId) -> Self {
        Tracker {
            me,
            prev: None,
            has_state: false,
            needs: HashMap::new(),
            waiting: None,
        }
    }

    /// Whether this member waits for the state (and holds back its events).
    pub fn waiting(&self) -> Option<ViewId> {
        self.waiting
    }

    /// A view was installed; true if this member is to send the state now.
    pub fn on_view(&mut self, view: &View) -> bool {
        // A view led by a member this one did not share its last view with: it joined
        // another component (it dissolved into it after a partition, or came back after
        // going on alone). It is a joiner there, with that component's state to receive.
        // (Only the dissolving leader sees the core's `Merging`; its members see this.)
        if self
            .prev
            .as_ref()
            .is_some_and(|p| !p.contains(&view.leader().id))
        {
            self.on_rejoin();
        }
        let members: Vec<MemberId> = view.ids().collect();
        self.needs.retain(|m, _| members.contains(m));
        let provide = match self.prev.take() {
            None => {
                if members.len() == 1 {
                    // Alone: this member founded the group; its state is the group's.
                    self.has_state = true;
                    self.waiting = None;
                } else if !self.has_state {
                    self.waiting.get_or_insert(view.id);
                }
                false
            }
            Some(prev) => {
                for m in &members {
                    if !prev.contains(m) {
                        self.needs.entry(*m).or_insert(view.id);
                    }
                }
                if self.needs.is_empty() || !self.has_state {
                    false
                } else {
                    let provider = members
                        .iter()
                        .find(|m| prev.contains(m) && !self.needs.contains_key(m));
                    provider == Some(&self.me)
                }
            }
        };
        self.prev = Some(members);
        provide
    }

    /// This member left its view (it dissolves into another component, or was expelled):
    /// its next view is a join, and the state comes from that group.
    pub fn on_rejoin(&mut self) {
        self.prev = None;
        self.has_state = false;
        self.needs.clear();
    }

    /// A state message for `view` was delivered; true if it is the one this member waits
    /// for (it holds the state from now on).
    pub fn on_state(&mut self, view: ViewId) -> bool {
        self.needs.retain(|_, joined| *joined > view);
        match self.waiting {
            Some(since) if since <= view => {
                self.waiting = None;
                self.has_state = true;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // reason: test code; a panic is the failure report
mod tests {
    use super::*;
    use cohort_group::Member;

    fn id(n: u8) -> MemberId {
        MemberId::from_bytes([n; 32])
    }

    fn view(seq: u64, members: &[u8]) -> View {
        View {
            id: ViewId {
                seq,
                coordinator: id(members[0]),
            },
            members: members
                .iter()
                .map(|n| Member {
                    id: id(*n),
                    addr: format!("127.0.0.1:{}", 7000 + u16::from(*n))
                        .parse()
                        .unwrap(),
                })
                .collect(),
            key_epoch: 1,
        }
    }

    #[test]
    fn the_body_round_trips_and_garbage_is_refused() {
        let v = view(9, &[1, 2]).id;
        for answer in [
            Answer::Snapshot(b"kv".to_vec()),
            Answer::Snapshot(Vec::new()),
            Answer::None,
            Answer::Failed("disk on fire".into()),
        ] {
            assert_eq!(decode(&encode(v, &answer)), Some((v, answer)));
        }
        assert_eq!(decode(&[0; 40]), None);
        let mut bad = encode(v, &Answer::None);
        bad[40] = 7;
        assert_eq!(decode(&bad), None);
        bad[40] = 1;
        bad.push(0);
        assert_eq!(decode(&bad), None);
    }

    #[test]
    fn the_senior_old_member_provides_and_a_joiner_waits() {
        // 1 founds, 2 joins, then 3 joins.
        let (mut a, mut b, mut c) = (
            Tracker::new(id(1)),
            Tracker::new(id(2)),
            Tracker::new(id(3)),
        );
        assert!(!a.on_view(&view(1, &[1])));
        let v2 = view(2, &[1, 2]);
        assert!(a.on_view(&v2), "the founder sends the state to 2");
        assert!(!b.on_view(&v2));
        assert_eq!(b.waiting(), Some(v2.id));
        for t in [&mut a, &mut b] {
            t.on_state(v2.id);
        }
        assert_eq!(b.waiting(), None);
        // Now 1 crashes while 3 joins: 2 is senior and provides.
        let v3 = view(3, &[2, 3]);
        assert!(b.on_view(&v3));
        assert!(!c.on_view(&v3));
        // An old snapshot (for view 2) does not satisfy 3.
        assert!(!c.on_state(v2.id));
        assert!(c.on_state(v3.id));
    }

    #[test]
    fn a_provider_that_crashes_before_sending_is_replaced() {
        let (mut a, mut b) = (Tracker::new(id(1)), Tracker::new(id(2)));
        a.on_view(&view(1, &[1]));
        let v2 = view(2, &[1, 2]);
        assert!(a.on_view(&v2));
        assert!(!b.on_view(&v2));
        assert!(!a.on_state(v2.id));
        assert!(b.on_state(v2.id));
        // 3 joins in view 3 (1 provides), 1 crashes before sending: view 4 = [2, 3].
        let v3 = view(3, &[1, 2, 3]);
        assert!(a.on_view(&v3));
        assert!(!b.on_view(&v3));
        let v4 = view(4, &[2, 3]);
        assert!(b.on_view(&v4), "2 takes over: 3 still needs the state");
        // Once it is delivered, the next view needs no state.
        assert!(!b.on_state(v4.id));
        assert!(!b.on_view(&view(5, &[2, 3])));
    }

    #[test]
    fn a_merging_member_joins_again() {
        let mut t = Tracker::new(id(5));
        t.on_view(&view(1, &[5]));
        t.on_rejoin();
        assert!(!t.on_view(&view(7, &[1, 2, 5])));
        assert_eq!(t.waiting(), Some(view(7, &[1, 2, 5]).id));
    }

    #[test]
    fn a_member_of_a_dissolved_component_waits_for_the_larger_ones_state() {
        // Member 4 was in {5, 4} (led by 5); that component dissolved into the one led by
        // 1. Only 5 saw `Merging`; 4 sees only its new view, led by a member it did not
        // share its last view with.
        let mut t = Tracker::new(id(4));
        t.on_view(&view(1, &[4]));
        assert!(
            t.on_view(&view(2, &[4, 5])),
            "4 holds the state and provides it"
        );
        t.on_state(view(2, &[4, 5]).id);
        assert!(t.waiting().is_none());
        assert!(!t.on_view(&view(3, &[5, 4])));
        assert!(
            t.waiting().is_none(),
            "a takeover by 5, a member of the last view"
        );
        assert!(!t.on_view(&view(9, &[1, 2, 3, 5, 4])));
        assert_eq!(t.waiting(), Some(view(9, &[1, 2, 3, 5, 4]).id));
    }
}
