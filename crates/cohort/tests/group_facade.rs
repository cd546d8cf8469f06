//! The `cohort::group` facade as an application uses it, in one process on loopback: members
//! join, send reliable messages above one datagram (up to 16 MiB), see views and leave; a
//! joiner receives the group's state before its first delivery, and it matches what the
//! others hold; a failing snapshot callback is reported on both sides; a member whose
//! application stops reading keeps its place in the group and is told what it lost.
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

use cohort::group::{Channel, Event, Group, GroupConfig, GroupConfigBuilder, MemberId, View};
use cohort_channel::identity::Identity;
use cohort_crypto::CryptoProvider;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(30);

/// `n` identities and the trust list naming them all.
fn identities(n: usize) -> (Vec<Identity>, Vec<MemberId>) {
    let provider = CryptoProvider::default_provider();
    let ids: Vec<Identity> = (0..n)
        .map(|_| Identity::generate(&provider).unwrap())
        .collect();
    let trust = ids.iter().map(|i| MemberId(i.public())).collect();
    (ids, trust)
}

/// A member's builder on loopback with fast timers.
fn builder(identity: Identity, trust: &[MemberId], peers: &[SocketAddr]) -> GroupConfigBuilder {
    let mut b = GroupConfig::builder("facade")
        .identity(identity)
        .listen("127.0.0.1:0".parse().unwrap())
        .trust(trust.iter().copied())
        .heartbeat(Duration::from_millis(50))
        .suspect_timeout(Duration::from_millis(1000))
        .flush_timeout(Duration::from_millis(500));
    for p in peers {
        b = b.peer(*p);
    }
    b
}

async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// Reads events until `pick` returns something.
async fn until<T>(
    events: &mut cohort::group::Events,
    mut pick: impl FnMut(Event) -> Option<T>,
) -> T {
    loop {
        let event = events.next().await.expect("the event stream ended");
        if let Some(t) = pick(event) {
            return t;
        }
    }
}

/// Waits until `group` is in a view of `n` members.
async fn view_of(group: &Group, n: usize) -> View {
    within(&format!("a view of {n}"), async {
        loop {
            if let Some(v) = group.view() {
                if v.members.len() == n {
                    return v;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(73) ^ (i >> 9) as u8 ^ salt)
        .collect()
}

#[tokio::test(flavor = "current_thread")]
async fn four_members_join_carry_16_mib_messages_and_leave() {
    let (ids, trust) = identities(4);
    let mut ids = ids.into_iter();
    // Datagram payloads of 16 KiB: a 16 MiB message is 1025 fragments.
    let cfg = |id, peers: &[SocketAddr]| {
        builder(id, &trust, peers)
            .max_datagram_payload(16 * 1024)
            .build()
            .unwrap()
    };
    let (a, mut a_ev) = Group::start(cfg(ids.next().unwrap(), &[])).unwrap();
    within("alice's view", a.join()).await.unwrap();
    let mut groups = vec![a.clone()];
    let mut events = Vec::new();
    for id in ids {
        let (g, ev) = Group::start(cfg(id, &[a.local_addr()])).unwrap();
        within("a join", g.join()).await.unwrap();
        groups.push(g);
        events.push(ev);
    }
    let view = view_of(&a, 4).await;
    for g in &groups {
        assert!(view.contains(&g.id()));
    }

    // Bob sends 20 KiB (two fragments) and 16 MiB (1025), carol 1 byte in between.
    let small = pattern(20 * 1024, 1);
    let huge = pattern(16 << 20, 2);
    let (bob, carol) = (groups[1].clone(), groups[2].clone());
    let sends = {
        let (small, huge) = (small.clone(), huge.clone());
        tokio::spawn(async move {
            bob.send(Channel::Reliable, small).await.unwrap();
            bob.send(Channel::Reliable, huge).await.unwrap();
        })
    };
    carol.send(Channel::Reliable, vec![9]).await.unwrap();
    let too_big = groups[3]
        .send(Channel::Reliable, vec![0; (16 << 20) + 1])
        .await;
    assert!(
        matches!(too_big, Err(cohort::group::Error::TooLong { .. })),
        "{too_big:?}"
    );
    let too_big = groups[3]
        .send(Channel::Unreliable, vec![0; 16 * 1024 + 1])
        .await;
    assert!(
        matches!(too_big, Err(cohort::group::Error::TooLong { .. })),
        "{too_big:?}"
    );
    within("bob's sends", sends).await.unwrap();

    // Every member delivers the three messages whole, in one order.
    let mut orders = Vec::new();
    for ev in std::iter::once(&mut a_ev).chain(events.iter_mut()) {
        let mut got = Vec::new();
        within("three deliveries", async {
            while got.len() < 3 {
                if let Some(Event::Deliver {
                    channel: Channel::Reliable,
                    sender,
                    data,
                    order,
                    ..
                }) = ev.next().await
                {
                    got.push((sender, data, order));
                }
            }
        })
        .await;
        // The application's order counts application messages only (the 1025 fragments
        // and the state messages of the joins take places in the core's order too): the
        // three messages are 0, 1 and 2 of the view at every member.
        let positions: Vec<Option<u64>> = got.iter().map(|(_, _, o)| *o).collect();
        assert_eq!(positions, [Some(0), Some(1), Some(2)]);
        let got: Vec<(MemberId, Vec<u8>)> = got.into_iter().map(|(s, d, _)| (s, d)).collect();
        let lens: Vec<usize> = got.iter().map(|(_, d)| d.len()).collect();
        assert!(got.iter().any(|(s, d)| *s == groups[1].id() && *d == small));
        assert!(got.iter().any(|(s, d)| *s == groups[1].id() && *d == huge));
        assert!(got.iter().any(|(s, d)| *s == groups[2].id() && *d == [9]));
        orders.push(lens);
    }
    assert!(orders.windows(2).all(|w| w[0] == w[1]), "{orders:?}");
    let stats = groups[0].stats().await.unwrap();
    assert_eq!(stats.fragments, cohort::group::FragmentDrops::default());
    assert_eq!(stats.reassembly_bytes, 0);
    assert_eq!(stats.delivered_bytes, (16 << 20) as u64 + 20 * 1024 + 1);

    // Dave leaves: his stream ends after "left", the others see a view of 3.
    within("dave's leave", groups[3].leave()).await.unwrap();
    let last = within("dave's last events", async {
        let mut last = None;
        while let Some(e) = events[2].next().await {
            last = Some(e);
        }
        last
    })
    .await;
    assert_eq!(
        last,
        Some(Event::Expelled {
            reason: cohort::group::RemovalReason::Left
        })
    );
    assert!(groups[3].send(Channel::Reliable, vec![1]).await.is_err());
    let v = view_of(&a, 3).await;
    assert!(!v.contains(&groups[3].id()));
    for g in &groups[..3] {
        within("a leave", g.leave()).await.unwrap();
        within("the task's end", g.closed()).await;
    }
}

/// A replicated log: the application state the snapshot carries.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Vec<u8>>>>);

impl Log {
    fn snapshot(&self) -> Vec<u8> {
        self.0.lock().unwrap().join(&b'\n')
    }
    fn restore(bytes: &[u8]) -> Vec<Vec<u8>> {
        if bytes.is_empty() {
            Vec::new()
        } else {
            bytes.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect()
        }
    }
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// Runs an application that applies every reliable delivery to `log`.
fn apply(mut events: cohort::group::Events, log: Log) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(event) = events.next().await {
            if let Event::Deliver {
                channel: Channel::Reliable,
                data,
                ..
            } = event
            {
                log.0.lock().unwrap().push(data);
            }
        }
    })
}

#[tokio::test(flavor = "current_thread")]
async fn a_joiner_gets_the_state_before_its_first_delivery_and_it_matches() {
    let (ids, trust) = identities(3);
    let mut ids = ids.into_iter();
    let with_log = |id, peers: &[SocketAddr], log: &Log| {
        let log = log.clone();
        builder(id, &trust, peers)
            .snapshot(move || Ok(log.snapshot()))
            .build()
            .unwrap()
    };
    let (a_log, b_log) = (Log::default(), Log::default());
    let (a, a_ev) = Group::start(with_log(ids.next().unwrap(), &[], &a_log)).unwrap();
    within("alice's view", a.join()).await.unwrap();
    let a_app = apply(a_ev, a_log.clone());
    let (b, b_ev) = Group::start(with_log(ids.next().unwrap(), &[a.local_addr()], &b_log)).unwrap();
    within("bob's join", b.join()).await.unwrap();
    let b_app = apply(b_ev, b_log.clone());
    for i in 0..20 {
        a.send(Channel::Reliable, format!("before {i}").into_bytes())
            .await
            .unwrap();
    }
    // Carol joins while alice and bob keep sending.
    let senders = {
        let (a, b) = (a.clone(), b.clone());
        tokio::spawn(async move {
            for i in 0..100 {
                a.send(Channel::Reliable, format!("a {i}").into_bytes())
                    .await
                    .unwrap();
                b.send(Channel::Reliable, format!("b {i}").into_bytes())
                    .await
                    .unwrap();
                if i % 10 == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        })
    };
    let c_log = Log::default();
    let (c, mut c_ev) =
        Group::start(with_log(ids.next().unwrap(), &[a.local_addr()], &c_log)).unwrap();
    // Carol's stream: her view, then the state, and only then deliveries.
    let mut state = None;
    within("carol's state and deliveries", async {
        let mut seen_view = false;
        loop {
            match c_ev.next().await.expect("carol's stream ended") {
                Event::View(v) if v.contains(&c.id()) => seen_view = true,
                Event::State(bytes) => {
                    assert!(seen_view, "the state came before carol's view");
                    assert!(state.is_none(), "two states");
                    *c_log.0.lock().unwrap() = Log::restore(&bytes);
                    state = Some(bytes);
                }
                Event::Deliver {
                    channel: Channel::Reliable,
                    data,
                    ..
                } => {
                    assert!(state.is_some(), "a delivery before the state");
                    c_log.0.lock().unwrap().push(data);
                    if c_log.len() == 220 {
                        return;
                    }
                }
                Event::Lost { count } => panic!("lost {count} events"),
                _ => {}
            }
        }
    })
    .await;
    within("the senders", senders).await.unwrap();
    // Everyone applied the same 220 messages in the same order.
    within("alice and bob catch up", async {
        while a_log.len() < 220 || b_log.len() < 220 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let (a_all, b_all, c_all) = (a_log.snapshot(), b_log.snapshot(), c_log.snapshot());
    assert_eq!(a_all, b_all);
    assert_eq!(a_all, c_all, "carol's state plus her deliveries differ");
    let snapshot = Log::restore(&state.unwrap());
    assert!(
        snapshot.len() >= 20,
        "the state holds the messages before the join"
    );
    let stats = c.stats().await.unwrap();
    assert_eq!(stats.snapshots_received, 1);
    for g in [&c, &b, &a] {
        within("a leave", g.leave()).await.unwrap();
    }
    a_app.await.unwrap();
    b_app.await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_failing_snapshot_is_reported_to_the_provider_and_the_joiner() {
    let (ids, trust) = identities(2);
    let mut ids = ids.into_iter();
    let cfg = builder(ids.next().unwrap(), &trust, &[])
        .snapshot(|| Err("the disk is on fire".to_string()))
        .build()
        .unwrap();
    let (a, mut a_ev) = Group::start(cfg).unwrap();
    within("alice's view", a.join()).await.unwrap();
    let cfg = builder(ids.next().unwrap(), &trust, &[a.local_addr()])
        .build()
        .unwrap();
    let (b, mut b_ev) = Group::start(cfg).unwrap();
    let reason = within(
        "alice's failure",
        until(&mut a_ev, |e| match e {
            Event::SnapshotFailed { reason } => Some(reason),
            _ => None,
        }),
    )
    .await;
    assert_eq!(reason, "the disk is on fire");
    let reason = within(
        "bob's news",
        until(&mut b_ev, |e| match e {
            Event::StateUnavailable { reason } => Some(reason),
            Event::State(_) => panic!("a state from a failed callback"),
            _ => None,
        }),
    )
    .await;
    assert_eq!(reason, "the disk is on fire");
    // Bob's deliveries flow after it.
    a.send(Channel::Reliable, b"after".to_vec()).await.unwrap();
    let data = within(
        "bob's delivery",
        until(&mut b_ev, |e| match e {
            Event::Deliver { data, .. } => Some(data),
            _ => None,
        }),
    )
    .await;
    assert_eq!(data, b"after");
    b.leave().await.unwrap();
    a.leave().await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_stalled_reader_does_not_stop_heartbeats_and_then_sees_lost() {
    let (ids, trust) = identities(2);
    let mut ids = ids.into_iter();
    let (a, mut a_ev) =
        Group::start(builder(ids.next().unwrap(), &trust, &[]).build().unwrap()).unwrap();
    within("alice's view", a.join()).await.unwrap();
    let cfg = builder(ids.next().unwrap(), &trust, &[a.local_addr()])
        .event_queue(8)
        .build()
        .unwrap();
    let (b, mut b_ev) = Group::start(cfg).unwrap();
    within("bob's join", b.join()).await.unwrap();
    let view = view_of(&a, 2).await;
    // Nobody reads bob's events while alice sends 200 messages and three suspect
    // timeouts pass.
    for i in 0..200u32 {
        a.send(Channel::Reliable, i.to_be_bytes().to_vec())
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = a.view().unwrap();
    assert_eq!(
        now.id, view.id,
        "the view changed while bob's reader stalled"
    );
    assert!(now.contains(&b.id()));
    let stats = b.stats().await.unwrap();
    assert!(stats.events_lost > 0, "{stats:?}");
    assert!(stats.delivered_messages >= 200, "{stats:?}");
    // The reader comes back: the queued events, then how many were lost.
    let lost = within(
        "the lost count",
        until(&mut b_ev, |e| match e {
            Event::Lost { count } => Some(count),
            _ => None,
        }),
    )
    .await;
    assert_eq!(lost, stats.events_lost);
    // And the member works: a new message arrives.
    a.send(Channel::Reliable, b"again".to_vec()).await.unwrap();
    within(
        "bob's delivery",
        until(&mut b_ev, |e| match e {
            Event::Deliver { data, .. } if data == b"again" => Some(()),
            _ => None,
        }),
    )
    .await;
    let _ = a_ev.next().await;
    b.leave().await.unwrap();
    a.leave().await.unwrap();
}
