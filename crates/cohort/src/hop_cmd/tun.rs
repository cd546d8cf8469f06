//! The TUN device of `app = "tun"`: unmodified applications send IP packets into it, the
//! endpoint carries each one as one ALPHA message to its single peer, and the peer writes
//! what it receives back into its own TUN device.
//!
//! # Routing: why cohort's own packets never loop into the tunnel
//! The tunnel has its own subnet (`[tun] address = "10.200.0.1/24"` at one end,
//! `10.200.0.2/24` at the other), separate from the addresses the UDP overlay uses on the
//! real interface (`listen`, the peer's `address` and `via`). Bringing the device up installs
//! one route, "10.200.0.0/24 dev cohort0"; only packets *to tunnel addresses* enter the
//! device. The overlay's UDP datagrams go to real-interface addresses, which that route does
//! not cover, so they leave through the real interface and never pass the daemon twice.
//! (The ALPHA prototype, which tunnelled traffic to the peer's own address, needed firewall
//! marks and a second routing table for this; separate subnets need neither.) The
//! configuration refuses a tunnel subnet that contains an overlay address.
//!
//! Applications therefore talk to the peer's *tunnel* address: `ping 10.200.0.2`,
//! `iperf3 -c 10.200.0.2`.
//!
//! # MTU
//! Each IP packet becomes one ALPHA message in one UDP datagram. The device MTU (default
//! [`super::config::DEFAULT_TUN_MTU`], 1300) leaves room for the largest S2 header (ALPHA-M
//! adds the disclosed key and a Merkle path: about 40 + 16 x log2(batch) bytes) and UDP/IP,
//! inside a 1500-byte link MTU, so no datagram is fragmented.

use super::config::TunSetup;
use std::io;
use std::net::Ipv4Addr;

/// An open TUN device; `recv` and `send` move whole IP packets.
pub struct TunDevice {
    #[cfg(target_os = "linux")]
    inner: tokio_tun::Tun,
    name: String,
}

impl TunDevice {
    /// Creates the device `setup.name` (needs CAP_NET_ADMIN), gives it the tunnel address
    /// and MTU and brings it up. The kernel adds the route to the tunnel subnet. The device
    /// disappears when the process exits.
    #[cfg(target_os = "linux")]
    pub fn open(setup: &TunSetup) -> io::Result<TunDevice> {
        let mut devices = tokio_tun::Tun::builder()
            .name(&setup.name)
            .mtu(i32::from(setup.mtu))
            .address(setup.address)
            .netmask(netmask(setup.prefix))
            .up()
            .build()
            .map_err(|e| io::Error::other(e.to_string()))?;
        let inner = devices
            .pop()
            .ok_or_else(|| io::Error::other("the kernel returned no TUN queue"))?;
        let name = inner.name().to_string();
        Ok(TunDevice { inner, name })
    }

    /// TUN devices are Linux-only here.
    #[cfg(not(target_os = "linux"))]
    pub fn open(_setup: &TunSetup) -> io::Result<TunDevice> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "app = \"tun\" needs Linux",
        ))
    }

    /// The interface's name as the kernel knows it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits for the next IP packet an application sent into the tunnel.
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        #[cfg(target_os = "linux")]
        {
            self.inner.recv(buf).await
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = buf;
            std::future::pending().await
        }
    }

    /// The next packet if one is ready now (`WouldBlock` if not): lets the loop take a burst
    /// without going back to the scheduler for each packet.
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        #[cfg(target_os = "linux")]
        {
            self.inner.try_recv(buf)
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = buf;
            Err(io::ErrorKind::WouldBlock.into())
        }
    }

    /// Hands one received IP packet to the kernel, which routes it to the application.
    pub async fn send(&self, packet: &[u8]) -> io::Result<()> {
        #[cfg(target_os = "linux")]
        {
            self.inner.send(packet).await.map(|_| ())
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = packet;
            Ok(())
        }
    }
}

/// The netmask of a prefix length (0..=32).
pub fn netmask(prefix: u8) -> Ipv4Addr {
    let bits = u32::from(prefix.min(32));
    Ipv4Addr::from(u32::MAX.checked_shl(32 - bits).unwrap_or(0))
}

/// Whether `packet` is an IPv4 or IPv6 packet (the version nibble): the device may hand up
/// anything; only IP packets are carried.
pub fn is_ip_packet(packet: &[u8]) -> bool {
    matches!(packet.first().map(|b| b >> 4), Some(4) | Some(6))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netmasks() {
        assert_eq!(netmask(24), Ipv4Addr::new(255, 255, 255, 0));
        assert_eq!(netmask(30), Ipv4Addr::new(255, 255, 255, 252));
        assert_eq!(netmask(0), Ipv4Addr::new(0, 0, 0, 0));
        assert_eq!(netmask(32), Ipv4Addr::new(255, 255, 255, 255));
    }

    #[test]
    fn only_ip_packets_pass() {
        assert!(is_ip_packet(&[0x45, 0]));
        assert!(is_ip_packet(&[0x60]));
        assert!(!is_ip_packet(&[]));
        assert!(!is_ip_packet(&[0x00, 1]));
    }
}
