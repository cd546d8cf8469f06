//! The TUN device of `app = "tun"`: unmodified applications send IP packets into it, the
//! endpoint carries each one as one ALPHA message to its single peer, and the peer writes
//! what it receives back into its own TUN device. With the kernel's offloads (the default)
//! one read brings a TCP flow's data as a super-packet that is split here into packets of
//! the MTU, and the packets written are coalesced first (see [`TunDevice`]).
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

/// Room for the IP packets of one read from the device: a TSO super-packet of up to 64 KiB
/// split at the smallest MSS the configuration allows (MTU 576: 536 bytes) is at most 123
/// segments, within tun-rs's batch of 128.
#[cfg(target_os = "linux")]
const SEGMENTS: usize = tun_rs::IDEAL_BATCH_SIZE;

/// The largest IP packet (or TSO super-packet) the device hands up.
const MAX_IP: usize = 65_535;

/// Room in front of every packet written: the virtio-net header the device takes with
/// offloads on (10 bytes), filled in by the coalescing.
#[cfg(target_os = "linux")]
const HEADROOM: usize = tun_rs::VIRTIO_NET_HDR_LEN;
#[cfg(not(target_os = "linux"))]
const HEADROOM: usize = 10;

/// An open TUN device. Reads go through a [`TunInput`], writes through a [`TunOutput`].
///
/// # Offloads
/// With `offload` on (`[tun] offload`, the default), the device is opened with
/// `IFF_VNET_HDR` and TCP segmentation offload: the kernel hands up a TCP stream's data in
/// super-packets of up to 64 KiB, which one read takes and tun-rs splits into packets of the
/// device MTU (copying the headers and computing each segment's checksums), so one system
/// call brings up to ~50 packets instead of one. Packets written are first coalesced the
/// way the kernel's GRO would (consecutive segments of one TCP flow become one packet with
/// a virtio-net header that says how to cut it), so the receiving application's TCP stack
/// sees one large packet and the daemon makes one write per run of segments. What each
/// packet carries over ALPHA is the same either way: one IP packet of at most the MTU.
pub struct TunDevice {
    #[cfg(target_os = "linux")]
    inner: tun_rs::AsyncDevice,
    name: String,
    offload: bool,
}

impl TunDevice {
    /// Creates the device `setup.name` (needs CAP_NET_ADMIN), gives it the tunnel address
    /// and MTU, turns on the offloads if `setup.offload` and brings it up. The kernel adds
    /// the route to the tunnel subnet. The device disappears when the process exits.
    #[cfg(target_os = "linux")]
    pub fn open(setup: &TunSetup) -> io::Result<TunDevice> {
        let inner = tun_rs::DeviceBuilder::new()
            .name(&setup.name)
            .mtu(setup.mtu)
            .ipv4(setup.address, setup.prefix, None)
            .offload(setup.offload)
            .enable(true)
            .build_async()?;
        let name = inner.name()?;
        Ok(TunDevice {
            inner,
            name,
            offload: setup.offload,
        })
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

    /// Whether the device was opened with the offloads (see the type's doc).
    pub fn offload(&self) -> bool {
        self.offload
    }

    /// Waits for the next read from the device: one IP packet, or with offloads the
    /// segments of one super-packet, in `input`.
    pub async fn recv(&self, input: &mut TunInput) -> io::Result<()> {
        input.count = 0;
        #[cfg(target_os = "linux")]
        {
            let TunInput {
                raw, bufs, sizes, ..
            } = input;
            input.count = self.inner.recv_multiple(raw, bufs, sizes, 0).await?;
            Ok(())
        }
        #[cfg(not(target_os = "linux"))]
        {
            std::future::pending().await
        }
    }

    /// The next read if one is ready now (`WouldBlock` if not): lets the loop take a burst
    /// without going back to the scheduler for each read.
    pub fn try_recv(&self, input: &mut TunInput) -> io::Result<()> {
        input.count = 0;
        #[cfg(target_os = "linux")]
        {
            let TunInput {
                raw, bufs, sizes, ..
            } = input;
            input.count = self.inner.try_recv_multiple(raw, bufs, sizes, 0)?;
            Ok(())
        }
        #[cfg(not(target_os = "linux"))]
        {
            Err(io::ErrorKind::WouldBlock.into())
        }
    }

    /// Hands every packet queued in `output` to the kernel (coalesced first, with
    /// offloads), which routes them to the application, and empties `output`. Returns how
    /// many packets were handed over; on an error, none are counted.
    pub async fn send(&self, output: &mut TunOutput) -> io::Result<usize> {
        let n = output.len;
        output.len = 0;
        if n == 0 {
            return Ok(0);
        }
        #[cfg(target_os = "linux")]
        {
            self.inner
                .send_multiple(&mut output.gro, &mut output.bufs[..n], HEADROOM)
                .await?;
        }
        Ok(n)
    }
}

/// Where a read from the device lands: the raw read (virtio-net header and packet or
/// super-packet) and the IP packets split from it.
pub struct TunInput {
    raw: Vec<u8>,
    bufs: Vec<Vec<u8>>,
    sizes: Vec<usize>,
    count: usize,
}

impl TunInput {
    /// Buffers for the largest read. They are allocated zeroed, so the memory behind the
    /// segments no read reaches is never touched.
    pub fn new() -> TunInput {
        #[cfg(target_os = "linux")]
        let segments = SEGMENTS;
        #[cfg(not(target_os = "linux"))]
        let segments = 1;
        TunInput {
            raw: vec![0; HEADROOM + MAX_IP],
            bufs: (0..segments).map(|_| vec![0; MAX_IP]).collect(),
            sizes: vec![0; segments],
            count: 0,
        }
    }

    /// The IP packets of the last read, in order.
    pub fn packets(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.bufs[..self.count]
            .iter()
            .zip(&self.sizes)
            .map(|(b, &n)| &b[..n.min(b.len())])
    }
}

impl Default for TunInput {
    fn default() -> Self {
        TunInput::new()
    }
}

/// Packets waiting to be written to the device, each behind room for the virtio-net
/// header; the buffers are kept from one write to the next.
pub struct TunOutput {
    bufs: Vec<Vec<u8>>,
    len: usize,
    #[cfg(target_os = "linux")]
    gro: tun_rs::GROTable,
}

impl TunOutput {
    /// How many packets one write call takes at most before the loop flushes.
    #[cfg(target_os = "linux")]
    pub const BATCH: usize = tun_rs::IDEAL_BATCH_SIZE;
    /// How many packets one write call takes at most before the loop flushes.
    #[cfg(not(target_os = "linux"))]
    pub const BATCH: usize = 128;

    /// An empty queue.
    pub fn new() -> TunOutput {
        TunOutput {
            bufs: Vec::new(),
            len: 0,
            #[cfg(target_os = "linux")]
            gro: tun_rs::GROTable::default(),
        }
    }

    /// Queues one IP packet (copied behind the header room).
    pub fn push(&mut self, packet: &[u8]) {
        if self.len == self.bufs.len() {
            // Room for a whole coalesced packet: tun-rs appends a flow's later segments to
            // its first one only within the buffer's capacity (it never reallocates), so
            // a buffer sized for one packet would coalesce nothing. The pages are touched
            // only as far as packets fill them.
            self.bufs.push(Vec::with_capacity(2 * HEADROOM + MAX_IP));
        }
        let buf = &mut self.bufs[self.len];
        buf.clear();
        buf.resize(HEADROOM, 0);
        buf.extend_from_slice(packet);
        self.len += 1;
    }

    /// Packets queued.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Default for TunOutput {
    fn default() -> Self {
        TunOutput::new()
    }
}

/// Whether `packet` is an IPv4 or IPv6 packet (the version nibble): the device may hand up
/// anything; only IP packets are carried.
pub fn is_ip_packet(packet: &[u8]) -> bool {
    matches!(packet.first().map(|b| b >> 4), Some(4) | Some(6))
}

/// Whether a packet the peer sent is an IP packet whose header lengths hold, as the
/// kernel's own IPv4 and IPv6 input checks them: an IPv4 header of at least 20 bytes inside
/// the packet and a total length between the header's and the packet's; an IPv6 packet of
/// at least its 40-byte header with the payload length inside it. Anything else is dropped
/// and counted before it reaches the device (and its coalescing, which parses these
/// headers).
pub fn is_whole_ip_packet(packet: &[u8]) -> bool {
    match packet.first().map(|b| b >> 4) {
        Some(4) if packet.len() >= 20 => {
            let header = usize::from(packet[0] & 0x0f) * 4;
            let total = usize::from(u16::from_be_bytes([packet[2], packet[3]]));
            header >= 20 && header <= total && total <= packet.len()
        }
        Some(6) if packet.len() >= 40 => {
            let payload = usize::from(u16::from_be_bytes([packet[4], packet[5]]));
            40 + payload <= packet.len()
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ip_packets_pass() {
        assert!(is_ip_packet(&[0x45, 0]));
        assert!(is_ip_packet(&[0x60]));
        assert!(!is_ip_packet(&[]));
        assert!(!is_ip_packet(&[0x00, 1]));
    }

    #[test]
    fn packets_from_the_peer_must_have_consistent_ip_lengths() {
        let mut v4 = vec![0u8; 60];
        v4[0] = 0x45;
        v4[2..4].copy_from_slice(&60u16.to_be_bytes());
        assert!(is_whole_ip_packet(&v4));
        // Trailing bytes past the total length: the kernel trims them, so they pass.
        v4[2..4].copy_from_slice(&40u16.to_be_bytes());
        assert!(is_whole_ip_packet(&v4));
        // A total length past the end, or inside the header.
        v4[2..4].copy_from_slice(&61u16.to_be_bytes());
        assert!(!is_whole_ip_packet(&v4));
        v4[2..4].copy_from_slice(&19u16.to_be_bytes());
        assert!(!is_whole_ip_packet(&v4));
        // A header length under 20 bytes, or past the total length.
        v4[2..4].copy_from_slice(&60u16.to_be_bytes());
        v4[0] = 0x44;
        assert!(!is_whole_ip_packet(&v4));
        v4[0] = 0x4f;
        v4[2..4].copy_from_slice(&40u16.to_be_bytes());
        assert!(!is_whole_ip_packet(&v4));
        assert!(!is_whole_ip_packet(&v4[..19]));

        let mut v6 = vec![0u8; 100];
        v6[0] = 0x60;
        v6[4..6].copy_from_slice(&60u16.to_be_bytes());
        assert!(is_whole_ip_packet(&v6));
        v6[4..6].copy_from_slice(&61u16.to_be_bytes());
        assert!(!is_whole_ip_packet(&v6));
        assert!(!is_whole_ip_packet(&v6[..39]));

        assert!(!is_whole_ip_packet(&[]));
        assert!(!is_whole_ip_packet(&[0x00; 60]));
    }
}
