#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: tests fail loudly on unexpected errors
//! Secure channels over real TCP on loopback: bulk data both ways, signature mode with the
//! batch service, resumption, a clean close, and a truncation the reader must notice.

use cohort_channel::batch::BatchConfig;
use cohort_channel::identity::Identity;
use cohort_channel::{
    AuthMode, ChannelError, Client, ClientAuth, ClientConfig, Server, ServerConfig,
};
use cohort_crypto::{CryptoProvider, Secret};
use cohort_net::stream::{self, as_channel_error, BatchService};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn provider() -> CryptoProvider {
    CryptoProvider::default_provider()
}

fn identity() -> Identity {
    Identity::from_secret(&provider(), Secret::from_slice(&[11; 32])).unwrap()
}

fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 253) as u8).collect()
}

/// An echo server: reads everything until the client's close, then echoes it back and
/// closes. Returns each connection's session ID.
async fn echo_server(
    server: Server,
    signer: Option<BatchService>,
    connections: usize,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<Vec<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut handles = Vec::new();
        for _ in 0..connections {
            let (tcp, _) = listener.accept().await.unwrap();
            let (server, signer) = (server.clone(), signer.clone());
            handles.push(tokio::spawn(async move {
                let mut s = stream::accept(&server, tcp, signer.as_ref()).await.unwrap();
                let mut got = Vec::new();
                s.read_to_end(&mut got).await.unwrap();
                s.write_all(&got).await.unwrap();
                s.shutdown().await.unwrap();
                s.session_id().to_string()
            }));
        }
        let mut ids = Vec::new();
        for h in handles {
            ids.push(h.await.unwrap());
        }
        ids
    });
    (addr, task)
}

async fn round_trip(
    client: &Client,
    addr: std::net::SocketAddr,
    payload: &[u8],
) -> (String, bool, Vec<u8>) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut c = stream::connect(client, tcp, "echo").await.unwrap();
    let resumed = c.session().unwrap().auth.resumed;
    c.write_all(payload).await.unwrap();
    c.shutdown().await.unwrap();
    let mut back = Vec::new();
    c.read_to_end(&mut back).await.unwrap();
    (c.session_id().to_string(), resumed, back)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_data_resumption_and_matching_session_ids_over_tcp() {
    let server = Server::new(provider(), ServerConfig::new());
    let (addr, task) = echo_server(server, None, 2).await;
    let client = Client::new(provider(), ClientConfig::new(ClientAuth::None));
    let payload = data(3 << 20);
    let (sid1, resumed1, back) = round_trip(&client, addr, &payload).await;
    assert!(back == payload, "3 MiB echoed byte for byte");
    assert!(!resumed1);
    let (sid2, resumed2, back) = round_trip(&client, addr, b"again").await;
    assert_eq!(back, b"again");
    assert!(resumed2, "the second connection resumes");
    assert_ne!(sid1, sid2);
    assert_eq!(task.await.unwrap(), [sid1, sid2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signature_mode_serves_concurrent_sessions_through_one_batch_service() {
    let mut config = ServerConfig::new();
    config.auth_modes = vec![AuthMode::ServerSignature];
    config.identity = Some(identity().public());
    let signer = BatchService::spawn(provider(), identity(), BatchConfig::default());
    let (addr, task) = echo_server(Server::new(provider(), config), Some(signer), 8).await;
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(tokio::spawn(async move {
            let mut cc = ClientConfig::new(ClientAuth::ServerSignature {
                pinned: identity().public(),
            });
            cc.resumption = false;
            let client = Client::new(provider(), cc);
            round_trip(&client, addr, b"signed").await
        }));
    }
    let mut ids = Vec::new();
    for c in clients {
        let (sid, resumed, back) = c.await.unwrap();
        assert_eq!(back, b"signed");
        assert!(!resumed);
        ids.push(sid);
    }
    let mut server_ids = task.await.unwrap();
    server_ids.sort();
    ids.sort();
    assert_eq!(ids, server_ids);

    // A client pinning another key refuses this server.
    let listener_config = {
        let mut c = ServerConfig::new();
        c.auth_modes = vec![AuthMode::ServerSignature];
        c.identity = Some(identity().public());
        c
    };
    let signer = BatchService::spawn(provider(), identity(), BatchConfig::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Server::new(provider(), listener_config);
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let _ = stream::accept(&server, tcp, Some(&signer)).await;
    });
    let other = Identity::from_secret(&provider(), Secret::from_slice(&[12; 32])).unwrap();
    let client = Client::new(
        provider(),
        ClientConfig::new(ClientAuth::ServerSignature {
            pinned: other.public(),
        }),
    );
    let err = stream::connect(&client, TcpStream::connect(addr).await.unwrap(), "x")
        .await
        .unwrap_err();
    assert_eq!(
        as_channel_error(&err),
        Some(ChannelError::AuthenticationFailed)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_stream_reads_as_truncated_not_as_the_end() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Server::new(provider(), ServerConfig::new());
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut s = stream::accept(&server, tcp, None).await.unwrap();
        s.write_all(&data(100_000)).await.unwrap();
        s.flush().await.unwrap();
        // Dropped without shutdown: no close record, as when an attacker cuts the stream.
    });
    let client = Client::new(provider(), ClientConfig::new(ClientAuth::None));
    let mut c = stream::connect(&client, TcpStream::connect(addr).await.unwrap(), "cut")
        .await
        .unwrap();
    let mut got = Vec::new();
    let err = c.read_to_end(&mut got).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    assert_eq!(as_channel_error(&err), Some(ChannelError::Truncated));
    assert_eq!(
        got.len(),
        100_000,
        "everything before the cut was delivered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_does_not_speak_cohort_is_refused() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 1024];
        let _ = tcp.read(&mut buf).await;
        let _ = tcp
            .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            .await;
    });
    let client = Client::new(provider(), ClientConfig::new(ClientAuth::None));
    let err = stream::connect(&client, TcpStream::connect(addr).await.unwrap(), "http")
        .await
        .unwrap_err();
    assert_eq!(as_channel_error(&err), Some(ChannelError::NotCohort));
}
