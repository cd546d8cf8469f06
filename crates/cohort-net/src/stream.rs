//! The tokio TCP driver for `cohort-channel`: [`connect`] and [`accept`] run the handshake
//! over a `TcpStream` and return a [`SecureStream`], an `AsyncRead + AsyncWrite` with the
//! session ID and the authentication result.
//!
//! ```text
//!   app ──write──▶ SecureStream ──Connection::send──▶ records ──▶ TcpStream
//!   app ◀──read─── SecureStream ◀──Connection::recv── records ◀── TcpStream
//!                        │  BatchSignatureNeeded (server, signature mode)
//!                        ▼
//!                  BatchService (one task per server: one signature per batch)
//! ```
//!
//! Reads end cleanly only after the peer's close record; a TCP end without one is an
//! `UnexpectedEof` error ("truncated"), so an attacker who cuts the stream cannot make a
//! truncated transfer look complete. Shutting down the write half sends the close record.

use cohort_channel::batch::{BatchConfig, BatchProof, BatchSigner, BatchTicket};
use cohort_channel::identity::Identity;
use cohort_channel::{ChannelError, Client, Connection, Event, Server, SessionId, SessionInfo};
use cohort_core::Timestamp;
use cohort_crypto::CryptoProvider;
use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// How long a handshake may take before it is abandoned.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Output queued beyond this makes writers wait for the socket.
const MAX_QUEUED_OUTPUT: usize = 256 * 1024;
/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 64 * 1024;
/// Bytes read from the socket at a time during the handshake: its messages are a few KiB,
/// and a server may hold many connections in their handshake at once (a flood of clients
/// that never finish), each with this buffer.
const HANDSHAKE_READ_CHUNK: usize = 4 * 1024;

/// Time since this process first asked, as the cores' [`Timestamp`].
pub fn now() -> Timestamp {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(std::time::Instant::now);
    let nanos = epoch.elapsed().as_nanos();
    Timestamp::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

fn channel_error(e: ChannelError) -> io::Error {
    let kind = match e {
        ChannelError::Truncated => io::ErrorKind::UnexpectedEof,
        ChannelError::NotCohort | ChannelError::Message(_) => io::ErrorKind::InvalidData,
        _ => io::ErrorKind::PermissionDenied,
    };
    io::Error::new(kind, e)
}

/// The [`ChannelError`] inside an error from this module, if it came from the channel.
pub fn as_channel_error(e: &io::Error) -> Option<ChannelError> {
    e.get_ref()?.downcast_ref::<ChannelError>().copied()
}

/// Signs session IDs in batches for every connection of one server (tcpcrypt's batch
/// signing): one Ed25519 signature per batch of up to `max_sessions` or per `window`.
/// Cheap to clone.
#[derive(Clone, Debug)]
pub struct BatchService {
    requests: mpsc::Sender<([u8; 32], oneshot::Sender<BatchProof>)>,
}

impl BatchService {
    /// Starts the signing task.
    pub fn spawn(provider: CryptoProvider, identity: Identity, config: BatchConfig) -> Self {
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(run_batches(
            BatchSigner::new(provider, identity, config),
            rx,
        ));
        BatchService { requests: tx }
    }

    /// The proof for `session_id`, once its batch is signed.
    pub async fn sign(&self, session_id: SessionId) -> io::Result<BatchProof> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .send((session_id.0, tx))
            .await
            .map_err(|_| io::Error::other("batch signer stopped"))?;
        rx.await
            .map_err(|_| io::Error::other("batch signing failed"))
    }
}

async fn run_batches(
    mut signer: BatchSigner,
    mut requests: mpsc::Receiver<([u8; 32], oneshot::Sender<BatchProof>)>,
) {
    let mut waiting: HashMap<BatchTicket, oneshot::Sender<BatchProof>> = HashMap::new();
    loop {
        let deadline = signer.poll_timeout();
        tokio::select! {
            request = requests.recv() => match request {
                Some((sid, reply)) => {
                    let ticket = signer.add(now(), sid);
                    waiting.insert(ticket, reply);
                }
                None => break,
            },
            () = sleep_until(deadline) => signer.handle_timeout(now()),
        }
        while let Some((ticket, proof)) = signer.poll_signed() {
            if let (Some(reply), Ok(proof)) = (waiting.remove(&ticket), proof) {
                let _ = reply.send(proof);
            }
        }
    }
}

async fn sleep_until(deadline: Option<Timestamp>) {
    match deadline {
        Some(t) => {
            let wait = t.saturating_duration_since(now());
            tokio::time::sleep(wait).await;
        }
        None => std::future::pending().await,
    }
}

/// A secure channel over TCP. Read and write plaintext; the records, their keys and the
/// close handshake are handled inside.
#[derive(Debug)]
pub struct SecureStream {
    tcp: TcpStream,
    conn: Connection,
    /// The error that ended reading, returned again on every later read: a truncation
    /// must never turn into a clean end on a retry.
    read_error: Option<ChannelError>,
}

/// Runs the handshake over `tcp`, then wraps it.
async fn handshake(
    mut tcp: TcpStream,
    mut conn: Connection,
    signer: Option<&BatchService>,
    answered: Option<&AtomicBool>,
) -> io::Result<SecureStream> {
    let mut buf = vec![0u8; HANDSHAKE_READ_CHUNK].into_boxed_slice();
    let run = async {
        loop {
            // Send what is ready before waiting on anything (the ServerHello goes out while
            // its batch is being signed).
            if !conn.output().is_empty() {
                tcp.write_all(conn.output()).await?;
                let n = conn.output().len();
                conn.consume_output(n);
            }
            while let Some(event) = conn.poll_event() {
                if let Event::BatchSignatureNeeded(sid) = event {
                    let signer = signer
                        .ok_or_else(|| io::Error::other("signature mode needs a batch signer"))?;
                    let proof = signer.sign(sid).await?;
                    conn.handle_batch_proof(&proof).map_err(channel_error)?;
                }
            }
            if !conn.output().is_empty() {
                tcp.write_all(conn.output()).await?;
                let n = conn.output().len();
                conn.consume_output(n);
            }
            if conn.is_established() {
                return Ok(());
            }
            let n = tcp.read(&mut buf).await?;
            if n == 0 {
                return Err(channel_error(
                    conn.handle_eof().err().unwrap_or(ChannelError::Truncated),
                ));
            }
            if let Err(e) = conn.handle_input(now(), &buf[..n]) {
                // Let the peer see our alert, if one was queued.
                let _ = tcp.write_all(conn.output()).await;
                return Err(channel_error(e));
            }
            if let Some(answered) = answered {
                if !conn.output().is_empty() || conn.is_established() {
                    answered.store(true, Ordering::Relaxed);
                }
            }
        }
    };
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, run).await {
        Ok(Ok(())) => Ok(SecureStream {
            tcp,
            conn,
            read_error: None,
        }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "handshake timed out",
        )),
    }
}

/// Connects as a client over an established TCP connection to the server known as
/// `server_name` (the key for its cached session).
pub async fn connect(
    client: &Client,
    tcp: TcpStream,
    server_name: &str,
) -> io::Result<SecureStream> {
    let mut rng = OsRng;
    let conn = client
        .connect(now(), &mut rng, server_name)
        .map_err(channel_error)?;
    handshake(tcp, conn, None, None).await
}

/// Accepts a client on a TCP connection. Signature mode needs `signer`.
pub async fn accept(
    server: &Server,
    tcp: TcpStream,
    signer: Option<&BatchService>,
) -> io::Result<SecureStream> {
    handshake(tcp, server.accept(), signer, None).await
}

/// Accepts like [`accept`], and sets `answered` once the client's first flight was whole and
/// the server answered it: a server that must close some pending connections can spare the
/// clients that are not stalling (a slowloris sends part of a flight and waits).
pub async fn accept_tracked(
    server: &Server,
    tcp: TcpStream,
    signer: Option<&BatchService>,
    answered: &AtomicBool,
) -> io::Result<SecureStream> {
    handshake(tcp, server.accept(), signer, Some(answered)).await
}

/// Randomness from the operating system (through the crypto provider), as a
/// `rand_core::RngCore` for the cores' injected-randomness parameters.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsRng;

impl rand_core::RngCore for OsRng {
    fn next_u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        self.fill_bytes(&mut b);
        u32::from_le_bytes(b)
    }
    fn next_u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        self.fill_bytes(&mut b);
        u64::from_le_bytes(b)
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        // The OS generator does not fail on Linux; if it did, a zero nonce would still be
        // unique per connection only by luck, so abort loudly instead.
        #[allow(clippy::expect_used)] // reason: no safe way to continue without randomness
        CryptoProvider::default_provider()
            .random
            .fill(dest)
            .expect("operating-system randomness");
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

impl SecureStream {
    /// The session ID (equal on both ends unless someone sits in the middle).
    pub fn session_id(&self) -> SessionId {
        // Established streams always have one.
        self.conn.session_id().unwrap_or(SessionId([0; 32]))
    }

    /// Suites, gears and the authentication result.
    pub fn session(&self) -> Option<&SessionInfo> {
        self.conn.session()
    }

    /// The sans-IO connection inside (for gear control and datagram keys).
    pub fn connection_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// The TCP peer address.
    pub fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.tcp.peer_addr()
    }

    /// Waits until a read would not block: plaintext is buffered, reading has ended, or
    /// the socket has bytes (or an error) to read. Holds no buffer while it waits, so an
    /// idle connection can wait here cheaply before a copy loop allocates its buffers.
    pub async fn wait_readable(&self) -> io::Result<()> {
        if self.conn.readable() > 0 || self.read_error.is_some() || self.conn.peer_closed() {
            return Ok(());
        }
        self.tcp.readable().await
    }

    /// Writes queued output to the socket until it is empty or the socket would block.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.conn.output().is_empty() {
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, self.conn.output()))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.conn.consume_output(n);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for SecureStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.conn.readable() > 0 {
                let n = this.conn.recv(buf.initialize_unfilled());
                buf.advance(n);
                return Poll::Ready(Ok(()));
            }
            if let Some(e) = this.read_error {
                return Poll::Ready(Err(channel_error(e)));
            }
            if this.conn.peer_closed() {
                return Poll::Ready(Ok(())); // the clean end: the peer's close record
            }
            // Read straight into the connection's input buffer.
            let mut rb = ReadBuf::new(this.conn.input_space(READ_CHUNK));
            ready!(Pin::new(&mut this.tcp).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            let result = if n == 0 {
                this.conn.handle_eof()
            } else {
                this.conn.handle_input_in_place(now(), n)
            };
            if let Err(e) = result {
                this.read_error = Some(e);
            }
        }
    }
}

impl AsyncWrite for SecureStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.conn.output().len() >= MAX_QUEUED_OUTPUT {
            ready!(this.poll_drain(cx))?;
        }
        let n = buf.len().min(MAX_QUEUED_OUTPUT);
        this.conn.send(&buf[..n]).map_err(channel_error)?;
        // Start sending now; what does not fit waits for the next write or flush.
        if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.conn.close().map_err(channel_error)?;
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.tcp).poll_shutdown(cx)
    }
}
