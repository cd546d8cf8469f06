#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

pub mod batch;
pub mod bundle;
pub mod stream;

use cohort_core::{Machine, Timestamp};
use std::io;
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Socket buffer size [`bind_udp`] asks for: a group's sequencer may send a few hundred
/// datagrams in a burst, more than the common 208 KiB default receive buffer holds.
pub const UDP_BUFFER_BYTES: usize = 4 << 20;

/// Binds a UDP socket for a driver, asking the kernel for [`UDP_BUFFER_BYTES`] of receive
/// and send buffer. The kernel may grant less (Linux caps it at `net.core.rmem_max` /
/// `wmem_max`); that is not an error.
pub fn bind_udp(addr: std::net::SocketAddr) -> io::Result<UdpSocket> {
    let domain = socket2::Domain::for_address(addr);
    let socket = socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?;
    let _ = socket.set_recv_buffer_size(UDP_BUFFER_BYTES);
    let _ = socket.set_send_buffer_size(UDP_BUFFER_BYTES);
    socket.bind(&addr.into())?;
    socket.set_nonblocking(true)?;
    UdpSocket::from_std(socket.into())
}

/// An application command: runs against the machine at `now`.
pub type Command<M> = Box<dyn FnOnce(&mut M, Timestamp) + Send>;

/// Largest datagram the driver receives.
pub const MAX_DATAGRAM: usize = 65_536;

/// Receive buffers [`run`] fills per system call when batching (see [`batch::BatchUdp`]).
pub const RECV_SLOTS: usize = 8;

/// How [`run_with`] uses its socket.
#[derive(Clone, Debug, Default)]
pub struct UdpOptions {
    /// Pack the packets one drain sends to a destination into [bundles](bundle) of at most
    /// this many bytes, and unpack received bundles (`None`: neither, as [`run`]).
    /// [`bundle::DEFAULT_BUNDLE_BYTES`] avoids IP fragmentation on a 1500-byte path.
    pub bundle: Option<usize>,
    /// Where the driver publishes its socket's bundle and datagram counts after every
    /// flush (`None`: nowhere), for a benchmark to read while it runs.
    pub counts: Option<std::sync::Arc<batch::SharedBundleCounts>>,
}

/// Most further receive batches and commands [`run_with`] takes without waiting after a
/// wake-up, before it sends what they made the machine send: the bound keeps a flood of
/// input from starving the machine's timers and transmits.
pub const DRAIN_ROUNDS: usize = 8;

/// Runs `machine` on `socket` until `commands` closes; sends its events to `events`
/// (dropping them if nobody listens any more). Returns the machine. Everything one drain
/// sends goes out in one batch, and reads take a batch per system call, unless
/// `COHORT_UDP_BATCH=off` ([`batch::Batching::from_env`]). No bundles.
pub async fn run<M: Machine>(
    machine: M,
    socket: UdpSocket,
    commands: mpsc::Receiver<Command<M>>,
    events: mpsc::Sender<M::Event>,
) -> io::Result<M> {
    run_with(machine, socket, commands, events, UdpOptions::default()).await
}

/// [`run`] with `options`. When batching, after each wake-up it also takes, without
/// waiting, up to [`DRAIN_ROUNDS`] more receive batches and commands that are ready, so one
/// flush carries what all of them made the machine send (`COHORT_UDP_BATCH=off` keeps the
/// loop as it was before batching: one wake-up, one flush).
pub async fn run_with<M: Machine>(
    mut machine: M,
    socket: UdpSocket,
    mut commands: mpsc::Receiver<Command<M>>,
    events: mpsc::Sender<M::Event>,
    options: UdpOptions,
) -> io::Result<M> {
    let epoch = Instant::now();
    let now =
        || Timestamp::from_nanos(u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX));
    let mut udp = batch::BatchUdp::new(socket, batch::Batching::from_env(), RECV_SLOTS);
    udp.set_bundling(options.bundle);
    let mut send_buf = Vec::with_capacity(MAX_DATAGRAM);
    let mut commands_open = true;
    loop {
        // Drain in the order the Machine trait documents.
        let t = now();
        while let Some(transmit) = machine.poll_transmit(t, &mut send_buf) {
            udp.queue(transmit.destination, &send_buf[..transmit.size]);
            send_buf.clear();
        }
        // A full socket buffer or an unreachable peer loses the datagram, as a network
        // would; the protocols above recover.
        let _ = udp.flush().await;
        if let Some(counts) = &options.counts {
            counts.store(&udp.bundle_counts());
        }
        while let Some(event) = machine.poll_event() {
            let _ = events.send(event).await;
        }
        if !commands_open {
            return Ok(machine);
        }
        let deadline = machine
            .poll_timeout()
            .map(|at| epoch + Duration::from_nanos(at.as_nanos()));
        tokio::select! {
            // ICMP errors end a receive with no datagrams; they are not fatal.
            received = udp.recv() => {
                received?;
                let at = now();
                for (from, bytes) in udp.received() {
                    machine.handle_datagram(at, from, bytes);
                }
            }
            () = sleep_until(deadline) => machine.handle_timeout(now()),
            command = commands.recv() => match command {
                Some(f) => f(&mut machine, now()),
                None => return Ok(machine),
            },
        }
        // What else is ready, before sending what it all asks for.
        let rounds = match udp.batching() {
            batch::Batching::On => DRAIN_ROUNDS,
            batch::Batching::Off => 0,
        };
        for _ in 0..rounds {
            let mut moved = false;
            if udp.try_recv()? > 0 {
                let at = now();
                for (from, bytes) in udp.received() {
                    moved = true;
                    machine.handle_datagram(at, from, bytes);
                }
            }
            match commands.try_recv() {
                Ok(f) => {
                    moved = true;
                    f(&mut machine, now());
                }
                Err(mpsc::error::TryRecvError::Empty) => {}
                // Send what the last commands asked for, then stop.
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    commands_open = false;
                    break;
                }
            }
            if !moved {
                break;
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A machine running on its own task: send it commands, read its events, await its end.
pub struct Driver<M: Machine> {
    /// Application commands; dropping every sender stops the driver.
    pub commands: mpsc::Sender<Command<M>>,
    /// The machine's events.
    pub events: mpsc::Receiver<M::Event>,
    /// The task; it returns the machine when the driver stops.
    pub task: tokio::task::JoinHandle<io::Result<M>>,
}

/// Spawns [`run`] on the current tokio runtime.
pub fn spawn<M>(machine: M, socket: UdpSocket) -> Driver<M>
where
    M: Machine + Send + 'static,
    M::Event: Send + 'static,
{
    spawn_with(machine, socket, UdpOptions::default())
}

/// Spawns [`run_with`] on the current tokio runtime.
pub fn spawn_with<M>(machine: M, socket: UdpSocket, options: UdpOptions) -> Driver<M>
where
    M: Machine + Send + 'static,
    M::Event: Send + 'static,
{
    let (commands, command_rx) = mpsc::channel(1024);
    let (event_tx, events) = mpsc::channel(4096);
    let task = tokio::spawn(run_with(machine, socket, command_rx, event_tx, options));
    Driver {
        commands,
        events,
        task,
    }
}
