//! The member task's transport seam: where its packets go and come from. UDP (one socket,
//! one datagram per destination member, queued and sent in batches by
//! [`cohort_net::batch::BatchUdp`], received a batch per system call) is one
//! implementation; NATS (feature `nats`: one
//! publish per packet, the broker fans out) is the other. The task asks the protocol core
//! for packets with the call the transport needs ([`Transport::fans_out`]).

use cohort_group::Destination;
use cohort_net::batch::{BatchUdp, Batching};
use std::io;
use std::net::SocketAddr;

/// How the member reaches the others.
pub enum Transport {
    /// A UDP socket: a packet for every member is sent once per member.
    Udp(Box<BatchUdp>),
    /// A NATS connection.
    #[cfg(feature = "nats")]
    Nats(Box<super::nats::NatsCarrier>),
}

/// What came in.
pub enum Incoming {
    /// A packet from `from`, `len` bytes at the start of the caller's buffer.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    // reason: UDP delivers batches; only NATS fills the caller's buffer
    Packet {
        /// Its sender.
        from: SocketAddr,
        /// Its length.
        len: usize,
    },
    /// UDP: a batch of datagrams, read with [`Transport::batch`].
    Batch,
    /// A change of the carrier's connection, for the application.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    // reason: only NATS has connection events
    Event(String),
}

impl Transport {
    /// Whether the carrier delivers one packet to every member (the core then queues a
    /// broadcast once, as `Destination::Group`).
    pub fn fans_out(&self) -> bool {
        match self {
            Transport::Udp(_) => false,
            #[cfg(feature = "nats")]
            Transport::Nats(_) => true,
        }
    }

    /// Sends `packet` to `to` (UDP: queues it until [`Transport::flush`]); returns the bytes
    /// handed to the carrier.
    pub async fn send(&mut self, to: Destination, packet: &[u8]) -> io::Result<usize> {
        match (self, to) {
            (Transport::Udp(socket), Destination::Member(addr)) => {
                socket.queue(addr, packet);
                Ok(packet.len())
            }
            // The core queues group entries only when the carrier fans out.
            (Transport::Udp(_), Destination::Group) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "UDP does not fan out",
            )),
            #[cfg(feature = "nats")]
            (Transport::Nats(carrier), to) => carrier.send(to, packet).await,
        }
    }

    /// Sends what [`Transport::send`] queued (UDP; NATS sends at once). A datagram the
    /// kernel refuses is lost, as a network would lose it; returns how many were.
    pub async fn flush(&mut self) -> u64 {
        match self {
            Transport::Udp(socket) => socket.flush().await.errors,
            #[cfg(feature = "nats")]
            Transport::Nats(_) => 0,
        }
    }

    /// The next packet (into `buf`), batch of packets or event. Cancel-safe. An error ends
    /// the member.
    #[cfg_attr(not(feature = "nats"), allow(unused_variables))]
    // reason: only NATS reads into `buf`; UDP keeps its batch
    pub async fn recv(&mut self, buf: &mut [u8]) -> io::Result<Incoming> {
        match self {
            // ICMP errors give an empty batch; they are not fatal.
            Transport::Udp(socket) => socket.recv().await.map(|_| Incoming::Batch),
            #[cfg(feature = "nats")]
            Transport::Nats(carrier) => Ok(match carrier.recv(buf).await? {
                super::nats::Carried::Packet { from, len } => Incoming::Packet { from, len },
                super::nats::Carried::Event(e) => Incoming::Event(e),
            }),
        }
    }

    /// UDP with batching: takes another batch if one is ready, without waiting (read it
    /// with [`Transport::batch`]); whether it took one. `Ok(false)` otherwise, and on NATS.
    pub fn try_recv(&mut self) -> io::Result<bool> {
        match self {
            Transport::Udp(socket) if socket.batching() == Batching::On => {
                socket.try_recv().map(|syscalls| syscalls > 0)
            }
            _ => Ok(false),
        }
    }

    /// Whether the member task should take what else is ready, without waiting, after each
    /// wake-up ([`Transport::try_recv`], [`Transport::try_recv_packet`]): UDP with batching,
    /// and NATS.
    pub fn drains(&self) -> bool {
        match self {
            Transport::Udp(socket) => socket.batching() == Batching::On,
            #[cfg(feature = "nats")]
            Transport::Nats(_) => true,
        }
    }

    /// NATS: a packet that has already arrived (into `buf`), without waiting: its sender
    /// and length. `Ok(None)` when none is ready, and on UDP (which takes batches).
    #[cfg_attr(not(feature = "nats"), allow(unused_variables))]
    // reason: only NATS reads into `buf`
    pub fn try_recv_packet(&mut self, buf: &mut [u8]) -> io::Result<Option<(SocketAddr, usize)>> {
        match self {
            Transport::Udp(_) => Ok(None),
            #[cfg(feature = "nats")]
            Transport::Nats(carrier) => carrier.try_recv(buf),
        }
    }

    /// The datagrams of the last [`Incoming::Batch`], with their senders.
    pub fn batch(&self) -> impl Iterator<Item = (SocketAddr, &[u8])> + '_ {
        let udp = match self {
            Transport::Udp(socket) => Some(&**socket),
            #[cfg(feature = "nats")]
            Transport::Nats(_) => None,
        };
        udp.into_iter().flat_map(BatchUdp::received)
    }

    /// Messages the carrier dropped before the member saw them (NATS: not carriage).
    pub fn dropped(&self) -> u64 {
        match self {
            // Malformed bundles, dropped whole.
            Transport::Udp(socket) => socket.bundle_counts().malformed,
            #[cfg(feature = "nats")]
            Transport::Nats(carrier) => carrier.dropped(),
        }
    }

    /// The transport's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Transport::Udp(_) => "UDP socket",
            #[cfg(feature = "nats")]
            Transport::Nats(_) => "NATS connection",
        }
    }
}
