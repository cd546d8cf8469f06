//! Batched UDP I/O for the drivers (issue 18, section 4): many datagrams per system call.
//! Receiving uses `recvmmsg`, and UDP GRO where the kernel has it (one buffer holds several
//! datagrams of one sender, `stride` bytes apart); sending groups the datagrams queued for
//! one destination into UDP GSO sends (one `sendmsg` carries up to the kernel's segment
//! limit). The system calls, and the detection of GSO/GRO with its fallbacks, are the
//! `quinn-udp` crate's; this module owns the buffers and the grouping.
//!
//! [`Batching::Off`] selects one datagram per system call (the drivers' behaviour before
//! batching), so a benchmark can compare both in one run; `COHORT_UDP_BATCH=off` selects it
//! for every socket a process opens ([`Batching::from_env`]).
//!
//! quinn-udp sets `IP_MTU_DISCOVER` to `IP_PMTUDISC_PROBE` (and `IPV6_DONTFRAG` on IPv6
//! sockets) on the sockets it batches, which QUIC wants and cohort does not: cohort's group
//! datagrams may be larger than a tunnel's MTU, and before batching the kernel fragmented
//! them. [`BatchUdp::new`] puts the kernel's default back on Linux (`IP_PMTUDISC_WANT`,
//! don't-fragment off for IPv6), so a datagram larger than the path MTU is fragmented as
//! before. A GSO run whose segments exceed the path MTU fails; quinn-udp then turns GSO off
//! for the socket and [`BatchUdp::flush`] sends that run one datagram at a time.
//!
//! With [`BatchUdp::set_bundling`] (the group drivers), a flush also packs the packets it
//! holds for one destination into [bundles](crate::bundle) of at most the given size, and
//! [`BatchUdp::received`] unpacks bundles again; a malformed bundle is dropped whole and
//! counted ([`BatchUdp::bundle_counts`]). Packets that arrive unbundled (a peer without
//! bundling) pass as before. [`Batching::Off`] sends no bundles (it is the old path), but
//! still unpacks the ones it receives.

use crate::bundle;
use std::collections::HashMap;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// Largest UDP payload; also the size of each receive slot (a GRO buffer is at most this).
const SLOT_BYTES: usize = 65_535;

/// Whether a [`BatchUdp`] batches its system calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Batching {
    /// `recvmmsg`/GRO and GSO where the kernel has them (the default).
    On,
    /// One datagram per `recvfrom`/`sendto`, as before batching: the baseline for benchmarks.
    Off,
}

impl Batching {
    /// [`Batching::Off`] if the environment variable `COHORT_UDP_BATCH` is `off` or `0`,
    /// else [`Batching::On`].
    pub fn from_env() -> Batching {
        match std::env::var("COHORT_UDP_BATCH").as_deref() {
            Ok("off" | "0") => Batching::Off,
            _ => Batching::On,
        }
    }
}

/// What one [`BatchUdp::flush`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flushed {
    /// Datagrams the kernel took.
    pub datagrams: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Datagrams lost to a send error (unreachable, too large, no buffer).
    pub errors: u64,
    /// System calls made.
    pub syscalls: u64,
}

/// A UDP socket that sends queued datagrams and receives in batches. Owned by one task:
/// queue with [`BatchUdp::queue`], send with [`BatchUdp::flush`], wait with
/// [`BatchUdp::recv`] and read what arrived with [`BatchUdp::received`].
pub struct BatchUdp {
    socket: UdpSocket,
    /// `None`: [`Batching::Off`], or the platform has no batched path.
    state: Option<quinn_udp::UdpSocketState>,
    /// Receive slots, `SLOT_BYTES` each.
    slots: Vec<u8>,
    /// What the last receive put in each slot.
    meta: Vec<quinn_udp::RecvMeta>,
    /// How many slots the last receive filled.
    filled: usize,
    /// Queued datagrams: their bytes back to back, and (destination, start, length).
    queued_bytes: Vec<u8>,
    queued: Vec<(SocketAddr, usize, usize)>,
    /// Scratch for one GSO send: segments back to back.
    gso: Vec<u8>,
    /// The packets of the last receive: (sender, start in `slots`, length), bundles
    /// unpacked.
    packets: Vec<(SocketAddr, usize, usize)>,
    /// Bundle bound in bytes, if bundling (see [`BatchUdp::set_bundling`]).
    bundle: Option<usize>,
    bundles: BundleCounts,
    /// Scratch of [`BatchUdp::flush`], kept so a flush allocates nothing once warm.
    groups: ByDestination,
    /// Scratch of [`BatchUdp::flush`]: one destination's datagrams after bundling.
    packed: Vec<(usize, usize)>,
}

/// The queued datagrams grouped by destination, destinations in the order they first
/// appear, each destination's datagrams in the order queued (a stable counting sort: the
/// same order a map of lists gives, with buffers reused from flush to flush).
#[derive(Default)]
struct ByDestination {
    /// Destination -> its index in `dests`; cleared each time, capacity kept.
    index: HashMap<SocketAddr, usize>,
    /// Each destination and its datagrams' range in `grouped`.
    dests: Vec<(SocketAddr, std::ops::Range<usize>)>,
    /// Each queued datagram's destination index, in queue order.
    of: Vec<usize>,
    /// (start, length) of every datagram, grouped.
    grouped: Vec<(usize, usize)>,
}

impl ByDestination {
    /// Groups `queued` ((destination, start, length) in queue order).
    fn group(&mut self, queued: &[(SocketAddr, usize, usize)]) {
        self.index.clear();
        self.dests.clear();
        self.of.clear();
        // Count per destination (the ranges' ends hold the counts for now).
        for &(to, _, _) in queued {
            let dests = &mut self.dests;
            let k = *self.index.entry(to).or_insert_with(|| {
                dests.push((to, 0..0));
                dests.len() - 1
            });
            self.dests[k].1.end += 1;
            self.of.push(k);
        }
        // Counts to ranges; `start` then serves as each destination's cursor.
        let mut at = 0;
        for (_, range) in &mut self.dests {
            let count = range.end;
            *range = at..at;
            at += count;
        }
        self.grouped.clear();
        self.grouped.resize(queued.len(), (0, 0));
        for (&(_, start, len), &k) in queued.iter().zip(&self.of) {
            let range = &mut self.dests[k].1;
            self.grouped[range.end] = (start, len);
            range.end += 1;
        }
    }
}

/// Counters of [bundles](crate::bundle) sent and received by one [`BatchUdp`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BundleCounts {
    /// Bundles sent.
    pub sent: u64,
    /// Packets those bundles carried.
    pub packets_sent: u64,
    /// Well-formed bundles received.
    pub received: u64,
    /// Packets those bundles carried.
    pub packets_received: u64,
    /// Malformed bundles received and dropped whole.
    pub malformed: u64,
    /// Datagrams the kernel took from this socket, bundles and lone packets alike (what a
    /// bundle saves shows as fewer datagrams than packets).
    pub datagrams_sent: u64,
    /// Datagrams received, bundles and lone packets alike (a GRO buffer counts as the
    /// datagrams it holds).
    pub datagrams_received: u64,
}

impl BundleCounts {
    /// Packets sent, in bundles or alone.
    pub fn packets_sent_total(&self) -> u64 {
        (self.datagrams_sent + self.packets_sent).saturating_sub(self.sent)
    }

    /// Packets received, in well-formed bundles or alone.
    pub fn packets_received_total(&self) -> u64 {
        (self.datagrams_received + self.packets_received)
            .saturating_sub(self.received + self.malformed)
    }

    /// What was counted after `before` (every counter only grows).
    pub fn since(&self, before: &BundleCounts) -> BundleCounts {
        self.zip(before, u64::saturating_sub)
    }

    /// Both counts together (several sockets).
    pub fn plus(&self, other: &BundleCounts) -> BundleCounts {
        self.zip(other, u64::saturating_add)
    }

    fn zip(&self, other: &BundleCounts, f: fn(u64, u64) -> u64) -> BundleCounts {
        BundleCounts {
            sent: f(self.sent, other.sent),
            packets_sent: f(self.packets_sent, other.packets_sent),
            received: f(self.received, other.received),
            packets_received: f(self.packets_received, other.packets_received),
            malformed: f(self.malformed, other.malformed),
            datagrams_sent: f(self.datagrams_sent, other.datagrams_sent),
            datagrams_received: f(self.datagrams_received, other.datagrams_received),
        }
    }
}

/// A [`BundleCounts`] another task can read while the socket's owner runs: the owner
/// [stores](SharedBundleCounts::store) its socket's counts after each turn, a benchmark
/// [loads](SharedBundleCounts::load) them (each counter on its own; a load racing a store
/// may mix two turns, which a benchmark reading over seconds does not notice).
#[derive(Debug, Default)]
pub struct SharedBundleCounts([AtomicU64; 7]);

impl SharedBundleCounts {
    /// Publishes `counts`.
    pub fn store(&self, counts: &BundleCounts) {
        let values = [
            counts.sent,
            counts.packets_sent,
            counts.received,
            counts.packets_received,
            counts.malformed,
            counts.datagrams_sent,
            counts.datagrams_received,
        ];
        for (slot, value) in self.0.iter().zip(values) {
            slot.store(value, Ordering::Relaxed);
        }
    }

    /// The last published counts.
    pub fn load(&self) -> BundleCounts {
        let [sent, packets_sent, received, packets_received, malformed, datagrams_sent, datagrams_received] =
            self.0.each_ref().map(|a| a.load(Ordering::Relaxed));
        BundleCounts {
            sent,
            packets_sent,
            received,
            packets_received,
            malformed,
            datagrams_sent,
            datagrams_received,
        }
    }
}

impl std::fmt::Debug for BatchUdp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchUdp")
            .field("batching", &self.batching())
            .field("gso_segments", &self.gso_segments())
            .field("queued", &self.queued.len())
            .finish_non_exhaustive()
    }
}

impl BatchUdp {
    /// Wraps `socket`; receives up to `slots` buffers per system call (at least 1). Each slot
    /// takes 64 KiB of memory (only what the kernel writes is touched). With
    /// [`Batching::On`] on a platform without a batched path, or if quinn-udp cannot set the
    /// socket up, it falls back to [`Batching::Off`].
    pub fn new(socket: UdpSocket, batching: Batching, slots: usize) -> BatchUdp {
        let state = match batching {
            Batching::On => quinn_udp::UdpSocketState::new((&socket).into()).ok(),
            Batching::Off => None,
        };
        if state.is_some() {
            allow_fragmentation(&socket);
        }
        let slots = match &state {
            Some(_) => slots.clamp(1, quinn_udp::BATCH_SIZE),
            None => slots.max(1),
        };
        BatchUdp {
            socket,
            state,
            slots: vec![0u8; slots * SLOT_BYTES],
            meta: vec![quinn_udp::RecvMeta::default(); slots],
            filled: 0,
            queued_bytes: Vec::new(),
            queued: Vec::new(),
            gso: Vec::new(),
            packets: Vec::new(),
            bundle: None,
            bundles: BundleCounts::default(),
            groups: ByDestination::default(),
            packed: Vec::new(),
        }
    }

    /// Bundles packets (see [`crate::bundle`]): with `Some(bound)`, a flush packs the
    /// packets queued for one destination into datagrams of at most `bound` bytes (clamped
    /// to [`bundle::MAX_BUNDLE_BYTES`]) when batching is on, and received bundles are
    /// unpacked; `None` (the default) passes every datagram as it is, in both directions.
    /// A bound under two small packets' worth only unpacks.
    pub fn set_bundling(&mut self, bound: Option<usize>) {
        self.bundle = bound.map(|b| b.min(bundle::MAX_BUNDLE_BYTES));
    }

    /// Bundles sent, received and refused so far, and the datagrams sent and received.
    pub fn bundle_counts(&self) -> BundleCounts {
        self.bundles
    }

    /// The socket (for its address and options).
    pub fn socket(&self) -> &UdpSocket {
        &self.socket
    }

    /// Whether system calls are batched.
    pub fn batching(&self) -> Batching {
        if self.state.is_some() {
            Batching::On
        } else {
            Batching::Off
        }
    }

    /// Most datagrams one send carries (1: no GSO).
    pub fn gso_segments(&self) -> usize {
        self.state
            .as_ref()
            .map_or(1, quinn_udp::UdpSocketState::max_gso_segments)
    }

    /// Queues `bytes` for `to`; nothing is sent before [`BatchUdp::flush`].
    pub fn queue(&mut self, to: SocketAddr, bytes: &[u8]) {
        let start = self.queued_bytes.len();
        self.queued_bytes.extend_from_slice(bytes);
        self.queued.push((to, start, bytes.len()));
    }

    /// Datagrams queued and not yet flushed.
    pub fn queued(&self) -> usize {
        self.queued.len()
    }

    /// Sends every queued datagram, waiting while the socket buffer is full. Datagrams for
    /// one destination keep their order; datagrams for different destinations may go out in
    /// another order than queued (UDP promises no order between them anyway). A datagram
    /// that fails (unreachable, too large) is counted and dropped, as a network would.
    pub async fn flush(&mut self) -> Flushed {
        let mut done = Flushed::default();
        if self.queued.is_empty() {
            return done;
        }
        let queued = std::mem::take(&mut self.queued);
        let bytes = std::mem::take(&mut self.queued_bytes);
        if self.state.is_none() {
            for &(to, start, len) in &queued {
                self.send_one(to, &bytes[start..start + len], &mut done)
                    .await;
            }
        } else {
            // Destinations in order of first appearance, each with its datagrams in order.
            let mut groups = std::mem::take(&mut self.groups);
            groups.group(&queued);
            let mut bytes = bytes;
            let mut packed = std::mem::take(&mut self.packed);
            for (to, range) in &groups.dests {
                let list = &groups.grouped[range.clone()];
                let list = match self.bundle {
                    Some(bound) if list.len() > 1 => {
                        self.pack(bound, &mut bytes, list, &mut packed);
                        &packed[..]
                    }
                    _ => list,
                };
                self.send_runs(*to, &bytes, list, &mut done).await;
            }
            self.groups = groups;
            self.packed = packed;
            return self.keep(queued, bytes, done);
        }
        self.keep(queued, bytes, done)
    }

    /// Keeps the allocations for the next flush.
    fn keep(
        &mut self,
        queued: Vec<(SocketAddr, usize, usize)>,
        bytes: Vec<u8>,
        done: Flushed,
    ) -> Flushed {
        self.bundles.datagrams_sent += done.datagrams;
        self.queued = queued;
        self.queued.clear();
        self.queued_bytes = bytes;
        self.queued_bytes.clear();
        done
    }

    /// Packs `list` (packets in `bytes`, in order, for one destination) into datagrams of
    /// at most `bound` bytes: consecutive packets that fit together become one bundle,
    /// written to the end of `bytes`; a packet that fits with no neighbour stays as it is.
    /// The datagrams, in the packets' order, go to `out`.
    fn pack(
        &mut self,
        bound: usize,
        bytes: &mut Vec<u8>,
        list: &[(usize, usize)],
        out: &mut Vec<(usize, usize)>,
    ) {
        out.clear();
        let mut i = 0;
        while i < list.len() {
            let (start, len) = list[i];
            if !bundle::bundleable(&bytes[start..start + len], bound) {
                out.push((start, len));
                i += 1;
                continue;
            }
            // As many of the following packets as fit under the bound.
            let mut size = bundle::BUNDLE_HEADER + bundle::RECORD_HEADER + len;
            let mut end = i + 1;
            while let Some(&(s, l)) = list.get(end) {
                if !bundle::bundleable(&bytes[s..s + l], bound)
                    || size + bundle::RECORD_HEADER + l > bound
                {
                    break;
                }
                size += bundle::RECORD_HEADER + l;
                end += 1;
            }
            if end - i == 1 {
                out.push((start, len));
            } else {
                let at = bytes.len();
                bytes.push(bundle::BUNDLE_KIND);
                bytes.push(bundle::BUNDLE_VERSION);
                for &(s, l) in &list[i..end] {
                    // Each packet is at most 65,535 bytes (it came in one datagram slot).
                    let l16 = u16::try_from(l).unwrap_or(u16::MAX);
                    bytes.extend_from_slice(&l16.to_be_bytes());
                    bytes.extend_from_within(s..s + usize::from(l16));
                }
                out.push((at, bytes.len() - at));
                self.bundles.sent += 1;
                self.bundles.packets_sent += (end - i) as u64;
            }
            i = end;
        }
    }

    /// Sends `list` (slices of `bytes`) to `to` as GSO runs: equal-sized segments, the last
    /// of a run possibly shorter, at most the kernel's segment count and 64 KiB.
    async fn send_runs(
        &mut self,
        to: SocketAddr,
        bytes: &[u8],
        list: &[(usize, usize)],
        done: &mut Flushed,
    ) {
        let mut i = 0;
        while i < list.len() {
            let max = self.gso_segments();
            let size = list[i].1;
            let mut end = i + 1;
            let mut total = size;
            if size > 0 {
                while end < list.len()
                    && end - i < max
                    && list[end].1 <= size
                    && list[end].1 > 0
                    && total + list[end].1 <= SLOT_BYTES
                {
                    total += list[end].1;
                    end += 1;
                    if list[end - 1].1 < size {
                        break; // a shorter segment ends a run
                    }
                }
            }
            if end - i == 1 {
                let (start, len) = list[i];
                self.send_one(to, &bytes[start..start + len], done).await;
            } else {
                let mut gso = std::mem::take(&mut self.gso);
                gso.clear();
                for &(start, len) in &list[i..end] {
                    gso.extend_from_slice(&bytes[start..start + len]);
                }
                let segments = (end - i) as u64;
                match self.send_gso(to, &gso, size).await {
                    Ok(()) => {
                        done.datagrams += segments;
                        done.bytes += gso.len() as u64;
                        done.syscalls += 1;
                    }
                    // GSO failed and quinn-udp turned it off: send the run one by one.
                    Err(_) if self.gso_segments() == 1 => {
                        done.syscalls += 1;
                        for &(start, len) in &list[i..end] {
                            self.send_one(to, &bytes[start..start + len], done).await;
                        }
                    }
                    Err(_) => {
                        done.errors += segments;
                        done.syscalls += 1;
                    }
                }
                self.gso = gso;
            }
            i = end;
        }
    }

    async fn send_gso(&self, to: SocketAddr, contents: &[u8], segment: usize) -> io::Result<()> {
        let Some(state) = &self.state else {
            return Err(io::Error::other("not batching"));
        };
        let transmit = quinn_udp::Transmit {
            destination: to,
            ecn: None,
            contents,
            segment_size: Some(segment),
            src_ip: None,
        };
        self.socket
            .async_io(Interest::WRITABLE, || {
                state.try_send((&self.socket).into(), &transmit)
            })
            .await
    }

    async fn send_one(&self, to: SocketAddr, datagram: &[u8], done: &mut Flushed) {
        done.syscalls += 1;
        let sent = match &self.state {
            Some(state) => {
                let transmit = quinn_udp::Transmit {
                    destination: to,
                    ecn: None,
                    contents: datagram,
                    segment_size: None,
                    src_ip: None,
                };
                self.socket
                    .async_io(Interest::WRITABLE, || {
                        state.try_send((&self.socket).into(), &transmit)
                    })
                    .await
            }
            None => self.socket.send_to(datagram, to).await.map(|_| ()),
        };
        match sent {
            Ok(()) => {
                done.datagrams += 1;
                done.bytes += datagram.len() as u64;
            }
            Err(_) => done.errors += 1,
        }
    }

    /// Waits for datagrams and takes a batch of them (read them with
    /// [`BatchUdp::received`]); returns how many system calls it made. Cancel-safe: nothing is
    /// taken from the socket unless the future completes. An ICMP error (connection refused)
    /// ends the wait with an empty batch; other errors are the socket's failure.
    pub async fn recv(&mut self) -> io::Result<usize> {
        self.filled = 0;
        self.packets.clear();
        let result = match &self.state {
            Some(state) => {
                let slots = &mut self.slots;
                let meta = &mut self.meta;
                let socket = &self.socket;
                socket
                    .async_io(Interest::READABLE, || {
                        recv_slots(state, socket, slots, meta)
                    })
                    .await
                    .map(|n| (n, 1))
            }
            None => self.recv_one_by_one().await,
        };
        self.took(result)
    }

    /// Takes a batch if one is ready, without waiting: `Ok(0)` (no system call counted)
    /// when nothing is, else as [`BatchUdp::recv`]. Lets a driver drain its socket before
    /// it flushes what the batch made it send.
    pub fn try_recv(&mut self) -> io::Result<usize> {
        self.filled = 0;
        self.packets.clear();
        let result = match &self.state {
            Some(state) => {
                let slots = &mut self.slots;
                let meta = &mut self.meta;
                let socket = &self.socket;
                socket
                    .try_io(Interest::READABLE, || {
                        recv_slots(state, socket, slots, meta)
                    })
                    .map(|n| (n, 1))
            }
            None => match self.socket.try_recv_from(&mut self.slots[..SLOT_BYTES]) {
                Ok((len, from)) => {
                    self.set_meta(0, from, len);
                    Ok(self.more_one_by_one())
                }
                Err(e) => Err(e),
            },
        };
        match result {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            other => self.took(other),
        }
    }

    /// Records what a receive took, and indexes its packets.
    fn took(&mut self, result: io::Result<(usize, usize)>) -> io::Result<usize> {
        match result {
            Ok((n, syscalls)) => {
                self.filled = n;
                self.index();
                Ok(syscalls)
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(1),
            Err(e) => Err(e),
        }
    }

    /// Splits the filled slots into datagrams (a GRO buffer at its stride) and, when
    /// bundling, bundles into their packets.
    fn index(&mut self) {
        for (k, meta) in self.meta[..self.filled].iter().enumerate() {
            let base = k * SLOT_BYTES;
            let len = meta.len.min(SLOT_BYTES);
            let stride = if meta.stride == 0 {
                len.max(1)
            } else {
                meta.stride
            };
            let from = normalise(meta.addr);
            // An empty datagram is one datagram too.
            let count = len.div_ceil(stride).max(1);
            self.bundles.datagrams_received += count as u64;
            for i in 0..count {
                let end = ((i + 1) * stride).min(len);
                let start = (i * stride).min(end);
                let datagram = &self.slots[base + start..base + end];
                if self.bundle.is_none() || !bundle::is_bundle(datagram) {
                    self.packets.push((from, base + start, end - start));
                    continue;
                }
                match bundle::parse(datagram) {
                    Ok(records) => {
                        self.bundles.received += 1;
                        let first = datagram.as_ptr() as usize;
                        for packet in records {
                            let offset = packet.as_ptr() as usize - first;
                            self.packets
                                .push((from, base + start + offset, packet.len()));
                            self.bundles.packets_received += 1;
                        }
                    }
                    Err(_) => self.bundles.malformed += 1,
                }
            }
        }
    }

    /// The unbatched path: one `recv_from` awaited, then more without waiting while they
    /// come and slots remain (one system call each).
    async fn recv_one_by_one(&mut self) -> io::Result<(usize, usize)> {
        let (len, from) = self.socket.recv_from(&mut self.slots[..SLOT_BYTES]).await?;
        self.set_meta(0, from, len);
        Ok(self.more_one_by_one())
    }

    /// After one datagram in slot 0: more without waiting while they come and slots
    /// remain; returns (datagrams, system calls).
    fn more_one_by_one(&mut self) -> (usize, usize) {
        let (mut n, mut syscalls) = (1, 1);
        while n < self.meta.len() {
            let slot = &mut self.slots[n * SLOT_BYTES..(n + 1) * SLOT_BYTES];
            syscalls += 1;
            match self.socket.try_recv_from(slot) {
                Ok((len, from)) => {
                    self.set_meta(n, from, len);
                    n += 1;
                }
                Err(_) => break,
            }
        }
        (n, syscalls)
    }

    fn set_meta(&mut self, slot: usize, from: SocketAddr, len: usize) {
        let mut meta = quinn_udp::RecvMeta::default();
        meta.addr = from;
        meta.len = len;
        meta.stride = len;
        self.meta[slot] = meta;
    }

    /// The packets the last [`BatchUdp::recv`] or [`BatchUdp::try_recv`] took, in arrival
    /// order, with their senders (a GRO buffer split at its stride; with bundling, bundles
    /// unpacked and malformed ones left out).
    pub fn received(&self) -> impl Iterator<Item = (SocketAddr, &[u8])> + '_ {
        self.packets
            .iter()
            .map(|&(from, start, len)| (from, &self.slots[start..start + len]))
    }
}

/// One batched receive into `slots` (one [`SLOT_BYTES`] slot per datagram) through
/// quinn-udp, filling `meta`; what both the waiting and the non-waiting receive run once
/// the socket is readable.
fn recv_slots(
    state: &quinn_udp::UdpSocketState,
    socket: &UdpSocket,
    slots: &mut [u8],
    meta: &mut [quinn_udp::RecvMeta],
) -> io::Result<usize> {
    let mut bufs: Vec<IoSliceMut<'_>> = slots.chunks_mut(SLOT_BYTES).map(IoSliceMut::new).collect();
    state.recv(socket.into(), &mut bufs, meta)
}

/// quinn-udp reports IPv4 senders on a dual-stack socket as IPv4-mapped IPv6; the drivers
/// compare addresses, so give the plain IPv4 form.
fn normalise(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => addr,
        },
        v4 => v4,
    }
}

/// Undoes quinn-udp's don't-fragment setting (see the module documentation): the kernel's
/// default path-MTU mode, and IPv6's don't-fragment flag off. Best effort: an option the
/// socket does not take (an IPv4 socket has no IPv6 options) is left as it is.
#[cfg(target_os = "linux")]
fn allow_fragmentation(socket: &UdpSocket) {
    use rustix::net::sockopt;
    let _ = sockopt::set_ip_mtu_discover(socket, sockopt::Ipv4PathMtuDiscovery::WANT);
    if socket.local_addr().is_ok_and(|a| a.is_ipv6()) {
        let _ = sockopt::set_ipv6_mtu_discover(socket, sockopt::Ipv6PathMtuDiscovery::WANT);
        let _ =
            nix::sys::socket::setsockopt(socket, nix::sys::socket::sockopt::Ipv6DontFrag, &false);
    }
}

/// Other platforms keep what quinn-udp set.
#[cfg(not(target_os = "linux"))]
fn allow_fragmentation(_socket: &UdpSocket) {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batched socket fragments as an unbatched one does (the kernel's default path-MTU
    /// mode, no IPv6 don't-fragment flag), not as quinn-udp leaves it.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn batched_sockets_may_fragment() {
        use rustix::net::sockopt;
        let v4 = crate::bind_udp("127.0.0.1:0".parse().unwrap()).unwrap();
        let v4 = BatchUdp::new(v4, Batching::On, 4);
        assert_eq!(v4.batching(), Batching::On);
        assert_eq!(
            sockopt::ip_mtu_discover(v4.socket()).unwrap(),
            sockopt::Ipv4PathMtuDiscovery::WANT
        );
        let Ok(v6) = crate::bind_udp("[::1]:0".parse().unwrap()) else {
            eprintln!("no IPv6 loopback here: only the IPv4 half ran");
            return;
        };
        let v6 = BatchUdp::new(v6, Batching::On, 4);
        assert_eq!(
            sockopt::ipv6_mtu_discover(v6.socket()).unwrap(),
            sockopt::Ipv6PathMtuDiscovery::WANT
        );
        let dontfrag =
            nix::sys::socket::getsockopt(v6.socket(), nix::sys::socket::sockopt::Ipv6DontFrag);
        assert!(!dontfrag.unwrap());
    }

    fn pair(batching: Batching) -> (BatchUdp, BatchUdp) {
        let a = crate::bind_udp("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = crate::bind_udp("127.0.0.1:0".parse().unwrap()).unwrap();
        (BatchUdp::new(a, batching, 8), BatchUdp::new(b, batching, 8))
    }

    /// Sends `datagrams` from `a` to `b` in one flush and returns what `b` receives, in order.
    async fn round_trip(batching: Batching, datagrams: &[Vec<u8>]) -> (Flushed, Vec<Vec<u8>>) {
        let (mut a, mut b) = pair(batching);
        let to = b.socket().local_addr().unwrap();
        let from = a.socket().local_addr().unwrap();
        for d in datagrams {
            a.queue(to, d);
        }
        let flushed = a.flush().await;
        assert_eq!(a.queued(), 0);
        let mut got = Vec::new();
        while got.len() < datagrams.len() {
            tokio::time::timeout(std::time::Duration::from_secs(5), b.recv())
                .await
                .expect("datagrams arrive")
                .unwrap();
            for (sender, bytes) in b.received() {
                assert_eq!(sender, from);
                got.push(bytes.to_vec());
            }
        }
        (flushed, got)
    }

    fn datagrams() -> Vec<Vec<u8>> {
        // Runs of equal sizes, a shorter one ending a run, an empty one, a longer one.
        let mut out = Vec::new();
        for i in 0..40u8 {
            out.push(vec![i; 1200]);
        }
        out.push(vec![200; 300]);
        out.push(vec![201; 1200]);
        out.push(Vec::new());
        out.push(vec![202; 1400]);
        out.push(vec![203; 1400]);
        out
    }

    #[tokio::test]
    async fn batched_datagrams_arrive_whole_and_in_order() {
        let sent = datagrams();
        let (flushed, got) = round_trip(Batching::On, &sent).await;
        assert_eq!(got, sent);
        assert_eq!(flushed.datagrams, sent.len() as u64);
        assert_eq!(flushed.errors, 0);
    }

    #[tokio::test]
    async fn unbatched_datagrams_arrive_whole_and_in_order() {
        let sent = datagrams();
        let (flushed, got) = round_trip(Batching::Off, &sent).await;
        assert_eq!(got, sent);
        assert_eq!(flushed.syscalls, sent.len() as u64);
    }

    #[tokio::test]
    async fn gso_takes_fewer_system_calls_than_datagrams() {
        let (a, _) = pair(Batching::On);
        if a.gso_segments() == 1 {
            eprintln!("no UDP GSO on this kernel: nothing to compare");
            return;
        }
        let sent = datagrams();
        let (flushed, _) = round_trip(Batching::On, &sent).await;
        assert!(flushed.syscalls < sent.len() as u64 / 4, "{flushed:?}");
    }

    #[tokio::test]
    async fn datagrams_to_two_destinations_keep_their_order_per_destination() {
        let (mut a, mut b) = pair(Batching::On);
        let (mut c, _) = pair(Batching::On);
        let to_b = b.socket().local_addr().unwrap();
        let to_c = c.socket().local_addr().unwrap();
        for i in 0..20u8 {
            a.queue(to_b, &[i; 100]);
            a.queue(to_c, &[i; 100]);
        }
        assert_eq!(a.flush().await.datagrams, 40);
        for socket in [&mut b, &mut c] {
            let mut got = Vec::new();
            while got.len() < 20 {
                socket.recv().await.unwrap();
                got.extend(socket.received().map(|(_, d)| d[0]));
            }
            assert_eq!(got, (0..20).collect::<Vec<u8>>());
        }
    }

    /// Receives until `want` packets arrived at `b`.
    async fn take(b: &mut BatchUdp, want: usize) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        while got.len() < want {
            tokio::time::timeout(std::time::Duration::from_secs(5), b.recv())
                .await
                .expect("packets arrive")
                .unwrap();
            got.extend(b.received().map(|(_, d)| d.to_vec()));
        }
        got
    }

    #[tokio::test]
    async fn bundled_packets_arrive_whole_and_in_order() {
        let (mut a, mut b) = pair(Batching::On);
        a.set_bundling(Some(1452));
        b.set_bundling(Some(1452));
        let to = b.socket().local_addr().unwrap();
        let mut sent = datagrams();
        sent.extend((204..207u8).map(|i| vec![i; 100]));
        // A packet whose first byte is a bundle's (0xCB, here the filler 203) is taken for
        // a bundle on a socket that unpacks: no group packet starts so.
        for packet in &mut sent {
            if let Some(first) = packet
                .first_mut()
                .filter(|b| **b == crate::bundle::BUNDLE_KIND)
            {
                *first = 0x01;
            }
        }
        for d in &sent {
            a.queue(to, d);
        }
        let flushed = a.flush().await;
        assert_eq!(flushed.errors, 0);
        // The empty packet cannot be bundled and goes alone; so do the ones of 300 bytes
        // and more (no neighbour fits beside them in 1452 bytes); the last three share one.
        let counts = a.bundle_counts();
        assert_eq!((counts.sent, counts.packets_sent), (1, 3), "{counts:?}");
        assert!(flushed.datagrams < sent.len() as u64, "{flushed:?}");
        let got = take(&mut b, sent.len()).await;
        assert_eq!(got, sent);
        assert_eq!(b.bundle_counts().received, counts.sent);
        assert_eq!(b.bundle_counts().packets_received, counts.packets_sent);
        // Every packet is counted once, in a bundle or alone, on both sides.
        let got = b.bundle_counts();
        assert_eq!(counts.datagrams_sent, flushed.datagrams);
        assert_eq!(counts.packets_sent_total(), sent.len() as u64);
        assert_eq!(got.datagrams_received, flushed.datagrams);
        assert_eq!(got.packets_received_total(), sent.len() as u64);
        // What another task reads is what the socket counted.
        let shared = SharedBundleCounts::default();
        shared.store(&got);
        assert_eq!(shared.load(), got);
        assert_eq!(got.since(&got), BundleCounts::default());
        assert_eq!(got.plus(&counts).since(&counts), got);
    }

    #[tokio::test]
    async fn small_packets_share_datagrams_up_to_the_bound() {
        let (mut a, mut b) = pair(Batching::On);
        a.set_bundling(Some(1000));
        b.set_bundling(Some(1000));
        let to = b.socket().local_addr().unwrap();
        let sent: Vec<Vec<u8>> = (0..100u8).map(|i| vec![i; 98]).collect();
        for d in &sent {
            a.queue(to, d);
        }
        let flushed = a.flush().await;
        // 2 + 9 * (2 + 98) = 902 <= 1000 < 1002: nine packets per bundle, the last one
        // holds one packet and goes alone.
        assert_eq!(flushed.datagrams, 12, "{flushed:?}");
        assert_eq!(a.bundle_counts().sent, 11);
        assert!(flushed.bytes <= 12 * 1000);
        assert_eq!(take(&mut b, sent.len()).await, sent);
    }

    #[tokio::test]
    async fn the_unbatched_path_sends_no_bundles_but_unpacks_them() {
        let (mut a, mut b) = pair(Batching::Off);
        a.set_bundling(Some(1452));
        b.set_bundling(Some(1452));
        let to = b.socket().local_addr().unwrap();
        for i in 0..10u8 {
            a.queue(to, &[i; 50]);
        }
        assert_eq!(a.flush().await.datagrams, 10);
        assert_eq!(a.bundle_counts().sent, 0);
        // A bundle from a batched peer still arrives as its packets.
        let mut one = Vec::new();
        crate::bundle::write(&mut one, [&[1u8, 2][..], &[3u8][..]]);
        a.queue(to, &one);
        a.flush().await;
        let got = take(&mut b, 12).await;
        assert_eq!(&got[10..], &[vec![1, 2], vec![3]]);
    }

    #[tokio::test]
    async fn a_malformed_bundle_is_dropped_whole_and_counted() {
        let (mut a, mut b) = pair(Batching::On);
        b.set_bundling(Some(1452));
        let to = b.socket().local_addr().unwrap();
        let mut good = Vec::new();
        crate::bundle::write(&mut good, [&[1u8; 10][..], &[2u8; 10][..]]);
        let mut bad = good.clone();
        bad[3] = 200; // the first length runs past the end
        a.queue(to, &bad);
        a.flush().await;
        a.queue(to, &[9, 9]);
        a.flush().await;
        let got = take(&mut b, 1).await;
        assert_eq!(got, vec![vec![9, 9]]);
        assert_eq!(b.bundle_counts().malformed, 1);
        // Two datagrams arrived; only the lone packet counts as received.
        assert_eq!(b.bundle_counts().datagrams_received, 2);
        assert_eq!(b.bundle_counts().packets_received_total(), 1);
        // Without bundling a socket passes the same bytes on untouched (the ALPHA sockets).
        let (mut c, mut d) = pair(Batching::On);
        let to = d.socket().local_addr().unwrap();
        c.queue(to, &bad);
        c.flush().await;
        assert_eq!(take(&mut d, 1).await, vec![bad]);
    }

    #[test]
    fn grouping_keeps_first_appearance_and_queue_order() {
        let a: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:3".parse().unwrap();
        let c: SocketAddr = "[::1]:1".parse().unwrap();
        let queued = [
            (a, 0, 1),
            (b, 1, 2),
            (a, 3, 4),
            (c, 7, 1),
            (b, 8, 5),
            (a, 13, 2),
        ];
        let mut g = ByDestination::default();
        // Twice: the second grouping reuses the first one's buffers and must not see them.
        for _ in 0..2 {
            g.group(&queued);
            let got: Vec<(SocketAddr, Vec<(usize, usize)>)> = g
                .dests
                .iter()
                .map(|(to, r)| (*to, g.grouped[r.clone()].to_vec()))
                .collect();
            assert_eq!(
                got,
                vec![
                    (a, vec![(0, 1), (3, 4), (13, 2)]),
                    (b, vec![(1, 2), (8, 5)]),
                    (c, vec![(7, 1)]),
                ]
            );
        }
        g.group(&queued[3..4]);
        assert_eq!(g.dests, vec![(c, 0..1)]);
        assert_eq!(g.grouped, vec![(7, 1)]);
    }

    #[test]
    fn mapped_addresses_become_ipv4() {
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:9".parse().unwrap();
        assert_eq!(normalise(mapped), "127.0.0.1:9".parse().unwrap());
        let v6: SocketAddr = "[::1]:9".parse().unwrap();
        assert_eq!(normalise(v6), v6);
    }
}
