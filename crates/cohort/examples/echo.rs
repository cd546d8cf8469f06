//! A secure echo over a cohort channel, built on the library's `cohort::channel`.
//!
//! Owns: the example's two sides and its output lines. The channel (handshake, records,
//! close) is the library's.
//!
//! ```text
//!   cargo run -p cohort --example echo                 # both sides in one process
//!   cargo run -p cohort --example echo -- server ADDR  # prints "key ed25519:..." and serves
//!   cargo run -p cohort --example echo -- client ADDR KEY [MESSAGE...]
//!
//!   client ──Connector (pins KEY)──▶ TCP ──▶ Listener (identity) ──▶ echo task
//!          ◀──────────────── the same bytes, then the close record ──┘
//! ```
//!
//! Each message is sent on its own channel; the client prints `echo OK <bytes> bytes` for
//! each one that came back intact (with the session ID, equal on both ends) and exits 1 on
//! any mismatch. With no messages it sends three: a short line, 64 KiB and 1 MiB.

use cohort::channel::{Acceptor, ClientAuth, Connector, Identity, Listener, PublicKey};
use cohort_crypto::CryptoProvider;
use std::net::SocketAddr;
use std::process::ExitCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Serves echoes on `listener` until the process ends.
async fn serve(mut listener: Listener) {
    while let Ok(mut accepted) = listener.accept().await {
        tokio::spawn(async move {
            let mut data = Vec::new();
            // The echo goes back only once the client's close record arrived (a truncated
            // message is an error, never echoed as if complete).
            if accepted.stream.read_to_end(&mut data).await.is_ok() {
                let _ = accepted.stream.write_all(&data).await;
                let _ = accepted.stream.shutdown().await;
            }
        });
    }
}

/// Starts a server on `addr` with a fresh identity; returns its address and key.
async fn start_server(addr: SocketAddr) -> std::io::Result<(SocketAddr, PublicKey)> {
    let identity = Identity::generate(&CryptoProvider::default_provider())
        .map_err(|e| std::io::Error::other(format!("cannot make an identity: {e}")))?;
    let key = identity.public();
    let acceptor = Acceptor::builder().identity(identity).build()?;
    let listener = Listener::bind(addr, acceptor).await?;
    let local = listener.local_addr()?;
    tokio::spawn(serve(listener));
    Ok((local, key))
}

/// Sends each message over its own channel to `addr` (pinning `key`) and checks the echo.
async fn client(addr: SocketAddr, key: PublicKey, messages: Vec<Vec<u8>>) -> std::io::Result<bool> {
    let connector = Connector::builder(ClientAuth::ServerSignature { pinned: key }).build();
    let mut all_ok = true;
    for message in messages {
        let mut stream = connector.connect(&addr.to_string()).await?;
        let session = stream.session_id();
        let resumed = stream.session().is_some_and(|s| s.auth.resumed);
        stream.write_all(&message).await?;
        stream.shutdown().await?;
        let mut echoed = Vec::new();
        stream.read_to_end(&mut echoed).await?;
        if echoed == message {
            println!(
                "echo OK {} bytes (session {session}{})",
                message.len(),
                if resumed { ", resumed" } else { "" }
            );
        } else {
            println!(
                "echo MISMATCH: sent {} bytes, got {} back",
                message.len(),
                echoed.len()
            );
            all_ok = false;
        }
    }
    Ok(all_ok)
}

fn default_messages() -> Vec<Vec<u8>> {
    let pattern = |n: usize| (0..n).map(|i| (i * 7 % 251) as u8).collect::<Vec<u8>>();
    vec![
        b"hello, secure world".to_vec(),
        pattern(64 * 1024),
        pattern(1024 * 1024),
    ]
}

fn usage() -> ExitCode {
    eprintln!("usage: echo | echo server ADDR | echo client ADDR KEY [MESSAGE...]");
    ExitCode::from(2)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parse_addr = |s: &str| s.parse::<SocketAddr>().ok();
    let result = match args.first().map(String::as_str) {
        None => {
            async {
                let (addr, key) = start_server(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
                println!("server on {addr}, key {key}");
                client(addr, key, default_messages()).await
            }
            .await
        }
        Some("server") => {
            let Some(addr) = args.get(1).and_then(|a| parse_addr(a)) else {
                return usage();
            };
            match start_server(addr).await {
                Ok((addr, key)) => {
                    println!("server on {addr}");
                    println!("key {key}");
                    let _ = tokio::signal::ctrl_c().await;
                    Ok(true)
                }
                Err(e) => Err(e),
            }
        }
        Some("client") => {
            let (Some(addr), Some(key)) = (
                args.get(1).and_then(|a| parse_addr(a)),
                args.get(2).and_then(|k| k.parse::<PublicKey>().ok()),
            ) else {
                return usage();
            };
            let messages: Vec<Vec<u8>> = args[3..].iter().map(|m| m.as_bytes().to_vec()).collect();
            let messages = if messages.is_empty() {
                default_messages()
            } else {
                messages
            };
            client(addr, key, messages).await
        }
        Some(_) => return usage(),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("echo: {e}");
            ExitCode::from(1)
        }
    }
}
