//! The member task's transport seam: where its packets go and come from. UDP (one socket,
//! one datagram per destination member) is one implementation; NATS (feature `nats`: one
//! publish per packet, the broker fans out) is the other. The task asks the protocol core
//! for packets with the call the transport needs ([`Transport::fans_out`]).

use cohort_group::Destination;
use std::io;
use std::net::SocketAddr;
use tokio::net::UdpSocket;

/// How the member reaches the others.
pub enum Transport {
    /// A UDP socket: a packet for every member is sent once per member.
    Udp(UdpSocket),
    /// A NATS connection.
    #[cfg(feature = "nats")]
    Nats(Box<super::nats::NatsCarrier>),
}

/// What came in.
pub enum Incoming {
    /// A packet from `from`, `len` bytes at the start of the caller's buffer.
    Packet {
        /// Its sender.
        from: SocketAddr,
        /// Its length.
        len: usize,
    },
    /// Nothing for the member (an ICMP error on UDP).
    Nothing,
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

    /// Sends `packet` to `to`; returns the bytes handed to the carrier.
    pub async fn send(&mut self, to: Destination, packet: &[u8]) -> io::Result<usize> {
        match (self, to) {
            (Transport::Udp(socket), Destination::Member(addr)) => {
                socket.send_to(packet, addr).await
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

    /// The next packet (into `buf`) or event. Cancel-safe. An error ends the member.
    pub async fn recv(&mut self, buf: &mut [u8]) -> io::Result<Incoming> {
        match self {
            Transport::Udp(socket) => match socket.recv_from(buf).await {
                Ok((len, from)) => Ok(Incoming::Packet { from, len }),
                // ICMP errors surface here on some systems; they are not fatal.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(Incoming::Nothing),
                Err(e) => Err(e),
            },
            #[cfg(feature = "nats")]
            Transport::Nats(carrier) => Ok(match carrier.recv(buf).await? {
                super::nats::Carried::Packet { from, len } => Incoming::Packet { from, len },
                super::nats::Carried::Event(e) => Incoming::Event(e),
            }),
        }
    }

    /// Messages the carrier dropped before the member saw them (NATS: not carriage).
    pub fn dropped(&self) -> u64 {
        match self {
            Transport::Udp(_) => 0,
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
