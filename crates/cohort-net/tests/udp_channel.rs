//! The channel over real UDP on loopback: the same `DatagramChannel` machine the simulator
//! runs, driven by the UDP driver. Handshake, equal session IDs, data both ways.
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

use cohort_channel::datagram::{DatagramChannel, DatagramEvent};
use cohort_channel::{Client, ClientAuth, ClientConfig, Server, ServerConfig, SessionId};
use cohort_core::Timestamp;
use cohort_crypto::CryptoProvider;
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;

async fn next_established(events: &mut mpsc::Receiver<DatagramEvent>) -> SessionId {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), events.recv()).await {
            Ok(Some(DatagramEvent::Established(info))) => return info.session_id,
            Ok(Some(DatagramEvent::Failed(e))) => panic!("handshake failed: {e}"),
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => panic!("no handshake"),
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn datagram_channel_over_loopback_udp() {
    let c_sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let s_sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let (c_addr, s_addr) = (c_sock.local_addr().unwrap(), s_sock.local_addr().unwrap());
    let p = CryptoProvider::default_provider();
    let client = Client::new(p, ClientConfig::new(ClientAuth::None));
    let server = Server::new(p, ServerConfig::new());
    let mut rng = cohort_net::stream::OsRng;
    let c = DatagramChannel::client(&client, Timestamp::ZERO, &mut rng, "server", s_addr).unwrap();
    let s = DatagramChannel::server(&server, c_addr);
    let mut sd = cohort_net::spawn(s, s_sock);
    let mut cd = cohort_net::spawn(c, c_sock);

    let (cid, sid) = (
        next_established(&mut cd.events).await,
        next_established(&mut sd.events).await,
    );
    assert_eq!(cid, sid);

    for i in 0..20u32 {
        cd.commands
            .send(Box::new(move |m: &mut DatagramChannel, _| {
                m.send(&i.to_be_bytes()).unwrap();
            }))
            .await
            .unwrap();
    }
    let mut got = Vec::new();
    while got.len() < 20 {
        match tokio::time::timeout(Duration::from_secs(10), sd.events.recv()).await {
            Ok(Some(DatagramEvent::Data(d))) => got.push(u32::from_be_bytes(d.try_into().unwrap())),
            Ok(Some(_)) => {}
            other => panic!("data did not arrive: {other:?} after {got:?}"),
        }
    }
    got.sort_unstable();
    assert_eq!(got, (0..20).collect::<Vec<_>>());
    drop(cd.commands);
    drop(sd.commands);
    cd.task.await.unwrap().unwrap();
    sd.task.await.unwrap().unwrap();
}
