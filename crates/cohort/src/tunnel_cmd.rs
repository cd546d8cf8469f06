//! `cohort tunnel server|client`: protect unmodified TCP applications (tcpcrypt's
//! compatibility goal) with a cohort channel between two tunnel ends.
//!
//! ```text
//!   app ──TCP──▶ tunnel client ══ cohort channel (TCP) ══▶ tunnel server ──TCP──▶ target
//! ```
//!
//! Each side logs, per connection, the session ID, the suites and the authentication result.

use crate::UsageError;
use clap::{Args, Subcommand};
use cohort_channel::batch::BatchConfig;
use cohort_channel::config::MIN_PSK_LEN;
use cohort_channel::identity::{Identity, PublicKey};
use cohort_channel::{AuthMode, ChannelError, Client, ClientAuth, ClientConfig, KemSuite};
use cohort_channel::{Server, ServerConfig};
use cohort_crypto::{CryptoProvider, Secret};
use cohort_net::stream::{self, as_channel_error, BatchService, SecureStream};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use tokio::net::{TcpListener, TcpStream};

/// Bytes moved per read in each direction: large enough for four full records per write.
const COPY_BUFFER: usize = 64 * 1024;

/// Most connections one tunnel end serves at once; more wait in the kernel's accept queue.
const MAX_CONNECTIONS: usize = 1024;
/// A server that accepts passwords lets one client address start this many handshakes per
/// minute: SPAKE2 allows one guess per handshake, so this bounds online guessing.
const PASSWORD_HANDSHAKES_PER_MINUTE: u32 = 20;

/// Handshakes per client address in the current minute.
#[derive(Default)]
struct Attempts(std::collections::HashMap<std::net::IpAddr, (std::time::Instant, u32)>);

impl Attempts {
    /// Counts one handshake from `ip`; false if it is over the limit.
    #[allow(clippy::disallowed_methods)] // reason: the binary is the I/O shell and owns the clock
    fn allow(&mut self, ip: std::net::IpAddr) -> bool {
        let now = std::time::Instant::now();
        let minute = std::time::Duration::from_secs(60);
        if self.0.len() > 100_000 {
            self.0
                .retain(|_, (start, _)| now.duration_since(*start) < minute);
        }
        let entry = self.0.entry(ip).or_insert((now, 0));
        if now.duration_since(entry.0) >= minute {
            *entry = (now, 0);
        }
        entry.1 += 1;
        entry.1 <= PASSWORD_HANDSHAKES_PER_MINUTE
    }
}

/// The two ends of a tunnel.
#[derive(Subcommand)]
pub enum TunnelCommand {
    /// Accept cohort channels and forward each to a plain TCP target.
    Server(ServerArgs),
    /// Accept plain TCP from local applications and carry each over a cohort channel.
    Client(ClientArgs),
}

/// `cohort tunnel server`.
#[derive(Args)]
pub struct ServerArgs {
    /// Address to accept cohort channels on.
    #[arg(long)]
    listen: SocketAddr,
    /// Plain TCP target (HOST:PORT) for each channel's bytes.
    #[arg(long)]
    forward: String,
    /// Identity file from `cohort keygen`: enables `signature` authentication.
    #[arg(long)]
    key: Option<PathBuf>,
    /// Authentication modes accepted, comma separated: none, signature, psk, password.
    /// Default: `signature,none` with --key, else `none`.
    #[arg(long, value_delimiter = ',')]
    auth: Vec<AuthMode>,
    /// File holding the pre-shared key (at least 32 random bytes, in hex), for `psk`.
    #[arg(long)]
    psk_file: Option<PathBuf>,
    /// File holding the password (first line), for `password`.
    #[arg(long)]
    password_file: Option<PathBuf>,
}

/// `cohort tunnel client`.
#[derive(Args)]
pub struct ClientArgs {
    /// Address local applications connect to.
    #[arg(long)]
    listen: SocketAddr,
    /// The tunnel server's address.
    #[arg(long)]
    connect: String,
    /// The server's public key (`ed25519:...`, printed by `cohort keygen`): requires
    /// `signature` authentication by that key.
    #[arg(long)]
    pin: Option<PublicKey>,
    /// Authentication mode: none, signature, psk or password. Default: `signature` with
    /// --pin, else `none`.
    #[arg(long)]
    auth: Option<AuthMode>,
    /// KEM suite: x25519-mlkem768 (default), mlkem768, x25519, rsa2048-e3.
    #[arg(long, default_value = "x25519-mlkem768")]
    kem: KemSuite,
    /// File holding the pre-shared key (at least 32 random bytes, in hex), for `psk`.
    #[arg(long)]
    psk_file: Option<PathBuf>,
    /// File holding the password (first line), for `password`.
    #[arg(long)]
    password_file: Option<PathBuf>,
    /// If the server does not speak cohort, carry the bytes in the clear (with a loud
    /// warning) instead of refusing. Never with an authentication mode.
    #[arg(long)]
    allow_plaintext: bool,
}

/// Runs a tunnel end until interrupted.
pub fn run(command: TunnelCommand) -> Result<(), UsageError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| UsageError(format!("cannot start the runtime: {e}")))?;
    match command {
        TunnelCommand::Server(args) => runtime.block_on(run_server(args)),
        TunnelCommand::Client(args) => runtime.block_on(run_client(args)),
    }
}

fn read_file(path: &Path, what: &str) -> Result<String, UsageError> {
    std::fs::read_to_string(path)
        .map_err(|e| UsageError(format!("cannot read {what} {}: {e}", path.display())))
}

fn load_psk(path: &Path) -> Result<Secret, UsageError> {
    let text = zeroize::Zeroizing::new(read_file(path, "PSK file")?);
    let bytes = hex::decode(text.trim()).map_err(|_| {
        UsageError(format!(
            "{} must hold the PSK in hex (for example from `head -c 32 /dev/urandom | xxd -p -c 64`); for a human-chosen secret use --auth password",
            path.display()
        ))
    })?;
    if bytes.len() < MIN_PSK_LEN {
        return Err(UsageError(format!(
            "the PSK in {} is {} bytes; at least {MIN_PSK_LEN} random bytes are needed (a weak PSK can be searched offline; use --auth password for human-chosen secrets)",
            path.display(),
            bytes.len()
        )));
    }
    Ok(Secret::new(bytes))
}

fn load_password(path: &Path) -> Result<Secret, UsageError> {
    let text = zeroize::Zeroizing::new(read_file(path, "password file")?);
    let line = text.lines().next().unwrap_or("");
    if line.is_empty() {
        return Err(UsageError(format!("{} holds no password", path.display())));
    }
    Ok(Secret::from_slice(line.as_bytes()))
}

async fn run_server(args: ServerArgs) -> Result<(), UsageError> {
    let provider = CryptoProvider::default_provider();
    let mut config = ServerConfig::new();
    let identity = match &args.key {
        Some(path) => Some(
            Identity::from_file_text(&provider, &read_file(path, "identity")?)
                .map_err(|e| UsageError(format!("{}: {e}", path.display())))?,
        ),
        None => None,
    };
    config.auth_modes = if args.auth.is_empty() {
        // The server signing its session IDs costs the client nothing, and clients that do
        // not pin a key still get encryption.
        if identity.is_some() {
            vec![AuthMode::ServerSignature, AuthMode::None]
        } else {
            vec![AuthMode::None]
        }
    } else {
        args.auth.clone()
    };
    config.identity = identity.as_ref().map(Identity::public);
    if let Some(path) = &args.psk_file {
        config.psk = Some(load_psk(path)?);
    }
    if let Some(path) = &args.password_file {
        config.password = Some(load_password(path)?);
    }
    for mode in &config.auth_modes {
        if !config.supports(*mode) {
            let need = match mode {
                AuthMode::ServerSignature => "--key",
                AuthMode::Psk => "--psk-file",
                AuthMode::Password => "--password-file",
                AuthMode::None => "nothing",
            };
            return Err(UsageError(format!("--auth {mode} needs {need}")));
        }
    }
    let signer = identity.map(|id| BatchService::spawn(provider, id, BatchConfig::default()));
    let server = Server::new(provider, config);
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| UsageError(format!("cannot listen on {}: {e}", args.listen)))?;
    eprintln!(
        "cohort tunnel server: listening on {}, forwarding to {}",
        args.listen, args.forward
    );
    let forward = std::sync::Arc::new(args.forward);
    // Expired resumption keys are erased every minute even when no one connects.
    let expiring = server.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
            expiring.expire_sessions(stream::now());
        }
    });
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let limit_passwords = server.config().supports(AuthMode::Password);
    let mut attempts = Attempts::default();
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return Ok(());
        };
        let (tcp, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                eprintln!("cohort tunnel server: accept failed: {e}");
                continue;
            }
        };
        if limit_passwords && !attempts.allow(peer.ip()) {
            eprintln!(
                "cohort tunnel server: {peer}: refused: over {PASSWORD_HANDSHAKES_PER_MINUTE} handshakes a minute from {} (password guessing limit)",
                peer.ip()
            );
            continue;
        }
        let _ = tcp.set_nodelay(true);
        let (server, signer, forward) = (server.clone(), signer.clone(), forward.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let mut secure = match stream::accept(&server, tcp, signer.as_ref()).await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("cohort tunnel server: {peer}: handshake failed: {e}");
                    return;
                }
            };
            log_session("server", peer, &secure);
            let mut target = match TcpStream::connect(forward.as_str()).await {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("cohort tunnel server: {peer}: cannot reach {forward}: {e}");
                    return;
                }
            };
            let _ = target.set_nodelay(true);
            match tokio::io::copy_bidirectional_with_sizes(&mut secure, &mut target, COPY_BUFFER, COPY_BUFFER).await {
                Ok((up, down)) => eprintln!(
                    "cohort tunnel server: {peer}: session {} closed cleanly ({up} bytes in, {down} out)",
                    secure.session_id()
                ),
                Err(e) => {
                    eprintln!(
                        "cohort tunnel server: {peer}: session {} ended: {e}",
                        secure.session_id()
                    );
                    // A reset, not a clean end: the target must not take a truncated stream
                    // for a complete one.
                    let _ = target.set_zero_linger();
                }
            }
        });
    }
}

fn log_session(side: &str, peer: SocketAddr, secure: &SecureStream) {
    if let Some(info) = secure.session() {
        let gears: Vec<&str> = info.gears.iter().map(|g| g.name()).collect();
        eprintln!(
            "cohort tunnel {side}: {peer}: session {} kem {} gears {} auth {}",
            info.session_id,
            info.kem.map_or("none (resumed)", |k| k.name()),
            gears.join(","),
            info.auth
        );
    }
}

async fn run_client(args: ClientArgs) -> Result<(), UsageError> {
    let provider = CryptoProvider::default_provider();
    let mode = args.auth.unwrap_or(if args.pin.is_some() {
        AuthMode::ServerSignature
    } else {
        AuthMode::None
    });
    let auth = match mode {
        AuthMode::None => ClientAuth::None,
        AuthMode::ServerSignature => ClientAuth::ServerSignature {
            pinned: args
                .pin
                .ok_or_else(|| UsageError("--auth signature needs --pin".into()))?,
        },
        AuthMode::Psk => ClientAuth::Psk(load_psk(
            args.psk_file
                .as_deref()
                .ok_or_else(|| UsageError("--auth psk needs --psk-file".into()))?,
        )?),
        AuthMode::Password => {
            ClientAuth::Password(load_password(args.password_file.as_deref().ok_or_else(
                || UsageError("--auth password needs --password-file".into()),
            )?)?)
        }
    };
    if args.pin.is_some() && mode != AuthMode::ServerSignature {
        return Err(UsageError(format!(
            "--pin needs --auth signature (it was --auth {mode}, which would ignore the pin)"
        )));
    }
    if args.allow_plaintext && mode != AuthMode::None {
        return Err(UsageError(format!(
            "--allow-plaintext cannot be combined with --auth {mode}: authentication is never dropped"
        )));
    }
    let client = Client::new(provider, ClientConfig::new(auth).with_kem(args.kem));
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| UsageError(format!("cannot listen on {}: {e}", args.listen)))?;
    eprintln!(
        "cohort tunnel client: listening on {}, tunnelling to {} (kem {}, auth {mode})",
        args.listen, args.connect, args.kem
    );
    let remote = std::sync::Arc::new(args.connect);
    let allow_plaintext = args.allow_plaintext;
    let expiring = client.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
            expiring.expire(stream::now());
        }
    });
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return Ok(());
        };
        let (mut local, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                eprintln!("cohort tunnel client: accept failed: {e}");
                continue;
            }
        };
        let _ = local.set_nodelay(true);
        let (client, remote) = (client.clone(), remote.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let tcp = match TcpStream::connect(remote.as_str()).await {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("cohort tunnel client: {peer}: cannot reach {remote}: {e}");
                    return;
                }
            };
            let _ = tcp.set_nodelay(true);
            let mut secure = match stream::connect(&client, tcp, &remote).await {
                Ok(s) => s,
                Err(e) if as_channel_error(&e) == Some(ChannelError::NotCohort) => {
                    if !allow_plaintext {
                        eprintln!(
                            "cohort tunnel client: {peer}: REFUSED: {remote} does not speak cohort (use --allow-plaintext to fall back to an unprotected connection)"
                        );
                        return;
                    }
                    eprintln!(
                        "cohort tunnel client: {peer}: WARNING: {remote} does not speak cohort; THIS CONNECTION IS NOT ENCRYPTED OR AUTHENTICATED (--allow-plaintext)"
                    );
                    plaintext(local, &remote).await;
                    return;
                }
                Err(e) => {
                    eprintln!("cohort tunnel client: {peer}: handshake with {remote} failed: {e}");
                    return;
                }
            };
            log_session("client", peer, &secure);
            match tokio::io::copy_bidirectional_with_sizes(&mut local, &mut secure, COPY_BUFFER, COPY_BUFFER).await {
                Ok((up, down)) => eprintln!(
                    "cohort tunnel client: {peer}: session {} closed cleanly ({up} bytes out, {down} in)",
                    secure.session_id()
                ),
                Err(e) => {
                    eprintln!(
                        "cohort tunnel client: {peer}: session {} ended: {e}",
                        secure.session_id()
                    );
                    // A reset, not a clean end: the application must not take a truncated
                    // stream for a complete one.
                    let _ = local.set_zero_linger();
                }
            }
        });
    }
}

async fn plaintext(mut local: TcpStream, remote: &str) {
    match TcpStream::connect(remote).await {
        Ok(mut tcp) => {
            let _ = tokio::io::copy_bidirectional(&mut local, &mut tcp).await;
        }
        Err(e) => eprintln!("cohort tunnel client: cannot reach {remote}: {e}"),
    }
}
