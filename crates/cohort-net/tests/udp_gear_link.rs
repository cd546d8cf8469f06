//! Two gear-protected links over real UDP sockets on loopback; a forger's datagrams from a
//! third socket are dropped.
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

use cohort_core::Timestamp;
use cohort_crypto::CryptoProvider;
use cohort_gears::link::{GearLink, LinkConfig, LinkEvent, Role};
use cohort_gears::{DropReason, GearId, GearKeys, GearSet, Protector};
use std::time::Duration;
use tokio::net::UdpSocket;

#[tokio::test(flavor = "current_thread")]
async fn gear_link_over_loopback_udp() {
    let a_sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let b_sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let (a_addr, b_addr) = (a_sock.local_addr().unwrap(), b_sock.local_addr().unwrap());
    let gears: GearSet = [GearId::HmacSha256_128, GearId::Umac64]
        .into_iter()
        .collect();
    let config = LinkConfig::new(60.0, gears);
    let p = CryptoProvider::default_provider();
    let secret = [0x21u8; 32];
    let a = GearLink::new(
        &p,
        &secret,
        Role::Initiator,
        b_addr,
        config.clone(),
        Timestamp::ZERO,
    )
    .unwrap();
    let b = GearLink::new(
        &p,
        &secret,
        Role::Responder,
        a_addr,
        config,
        Timestamp::ZERO,
    )
    .unwrap();
    let cohort_net::Driver {
        commands: a_cmd,
        events: _a_events,
        task: a_task,
    } = cohort_net::spawn(a, a_sock);
    let cohort_net::Driver {
        commands: b_cmd,
        events: mut b_events,
        task: b_task,
    } = cohort_net::spawn(b, b_sock);

    for i in 0..100u32 {
        a_cmd
            .send(Box::new(move |m: &mut GearLink, _| {
                m.send(&i.to_be_bytes()).unwrap();
            }))
            .await
            .unwrap();
    }
    // A forger who does not hold the secret sends from its own socket.
    let forger = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let keys = GearKeys::derive(&p, &[0x99; 32], gears).unwrap();
    let mut forged = Protector::new(keys);
    for i in 0..5u64 {
        let mut packet = Vec::new();
        forged
            .protect_with_seq(
                10_000 + i,
                &[GearId::HmacSha256_128],
                &[1],
                b"evil",
                &mut packet,
            )
            .unwrap();
        forger.send_to(&packet, b_addr).await.unwrap();
    }

    let mut delivered = Vec::new();
    let mut auth_failed = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while delivered.len() < 100 || auth_failed < 5 {
        let event = tokio::time::timeout_at(deadline, b_events.recv())
            .await
            .expect("events within 10 s")
            .expect("driver alive");
        match event {
            LinkEvent::Delivered { payload, .. } => {
                assert_ne!(payload, b"evil");
                delivered.push(u32::from_be_bytes(payload.try_into().unwrap()));
            }
            LinkEvent::Dropped {
                reason: DropReason::AuthFailed,
            } => auth_failed += 1,
            _ => {}
        }
    }
    delivered.sort_unstable();
    assert_eq!(delivered, (0..100).collect::<Vec<_>>());
    drop((a_cmd, b_cmd));
    let b = b_task.await.unwrap().unwrap();
    // 100 data packets, plus any feedback from a that arrived before the end.
    assert!(b.counters().accepted >= 100);
    assert_eq!(b.counters().auth_failed, 5);
    a_task.await.unwrap().unwrap();
}
