//! `cohort hop run`: the event loop around one [`HopNode`] (an endpoint or a relay).
//!
//! The socket side is the library's [`cohort::hop::Node`] (the same that runs under the
//! `cohort::hop::Endpoint` handle): the drain order of `cohort_core::Machine`, bursts of
//! datagrams, the core's timers and the user-space delay line. An endpoint in TUN mode has a
//! second input (the TUN device), and every node has stdin and the control socket, so this
//! loop selects over the node and those:
//!
//! ```text
//!   loop:
//!     drain: Node::transmit (UDP now, or the delay line, held delay_ms)
//!            Node::poll_event (until None) ─▶ stdout / the TUN queue; Connected ─▶ open
//!            associations; then the TUN queue is written (coalesced, see tun::TunDevice)
//!     wait for the first of: Node::wait (datagrams, the core's deadline, the delay line's
//!       head), a TUN read (one packet or a split super-packet; then up to BURST more
//!       reads), a stdin line, a control request, the 1 s tick (counters line, metrics),
//!       SIGINT/SIGTERM
//! ```
//!
//! Recovery is the core's: an endpoint whose pair dies (nothing answered for `dead_after`,
//! 3 s) or whose peer restarts says `disconnected` and handshakes again by itself; every
//! `connected` opens the configured associations again, so traffic resumes with no
//! manual step (`scripts/hop-chaos.sh` kills and restarts relays and endpoints to check
//! it). A configured peer whose handshake fails (`connect_failed`) is tried again after
//! `RECONNECT_AFTER`.
//!
//! With `metrics` set (file or `--metrics`), the counters, drops by reason, handshakes,
//! messages and bytes, and the associations by state and mode are served in the Prometheus
//! text format; the core's counters are copied into them on every 1 s tick.
//!
//! Everything runs on one thread: the core is single-threaded by design and one thread
//! keeps the packet order and the timing of the user-space delay exact.

use super::config::{self, App, HopSetup, Overrides, PeerSetup, Role};
use super::ctl::{self, CtlRequest, Request};
use super::json;
use super::tun::{is_ip_packet, is_whole_ip_packet, TunDevice, TunInput, TunOutput};
use super::RunArgs;
use crate::jsonl;
use crate::UsageError;
use cohort::hop::{Node, NodeStats, Woke};
use cohort::metrics::{MetricsEndpoint, Registry};
use cohort::os_seed;
use cohort_core::Timestamp;
use cohort_crypto::CryptoProvider;
use cohort_hop::{
    Endpoint, EndpointConfig, EndpointEvent, HopEvent, HopNode, Mode, Relay, RelayConfig,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::Instant;

/// Most reads taken from one input before the loop drains the core again.
const BURST: usize = 64;
/// How long after a failed handshake a configured peer is tried again.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);
/// Longest stdin command line.
const MAX_LINE: usize = 256 * 1024;

/// Runs `cohort hop run`.
pub fn run(args: &RunArgs) -> Result<(), UsageError> {
    let provider = CryptoProvider::default_provider();
    let overrides = Overrides {
        listen: args.listen,
        mode: args.mode.clone(),
        associations: args.associations,
        ctl: args.ctl.clone(),
        delay_ms: args.delay_ms,
        metrics: args.metrics,
    };
    let setup =
        config::load(&provider, &args.config, &overrides).map_err(|e| UsageError(e.to_string()))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| UsageError(format!("cannot start the runtime: {e}")))?;
    runtime.block_on(serve(provider, setup, args.exit_on_eof))
}

/// What woke the loop.
enum Wake {
    Node(std::io::Result<Woke>),
    Tun(std::io::Result<()>),
    Stdin(Option<Result<json::Command, Value>>),
    Ctl(Option<CtlRequest>),
    Tick,
    Stop,
}

/// The TUN side's own counters (the core counts the rest).
#[derive(Default)]
struct TunCounters {
    /// IP packets read from the device and handed to the endpoint.
    sent: u64,
    /// Reads from the device (with offloads, one read may bring many packets).
    reads: u64,
    /// Reads whose super-packet could not be split (malformed headers): dropped.
    read_errors: u64,
    /// IP packets the endpoint received and the loop wrote to the device.
    written: u64,
    /// Messages the endpoint received that are not whole IP packets: dropped.
    received_not_ip: u64,
    /// Batches handed to the device (each written as one or more coalesced packets).
    write_calls: u64,
    /// Packets from the device the endpoint refused (queue full, no open association).
    refused: u64,
    /// Non-IP frames from the device, ignored.
    not_ip: u64,
    /// Packets lost in writes to the device that failed.
    write_errors: u64,
}

struct Daemon {
    node: Node,
    peers: Vec<PeerSetup>,
    reconnect: HashMap<SocketAddr, Instant>,
    tun: Option<TunDevice>,
    tun_counters: TunCounters,
    /// Packets received for the TUN device, written when the drain ends.
    tun_out: TunOutput,
    metrics: HopMetrics,
}

/// Labels of the hop families: a few fixed keys with owned values (modes are formatted).
type Labels = Vec<(&'static str, String)>;

/// What `hop run` exports with `metrics` (names carry the `cohort_hop_` prefix).
#[derive(Default)]
struct HopMetrics {
    /// Messages the application sent and received (`direction`).
    messages: Family<Labels, Counter>,
    /// Its two counters (received, sent), looked up once: a lookup builds and hashes a
    /// label set, once per message otherwise.
    message_counters: Option<(Counter, Counter)>,
    /// UDP payload bytes sent and received (`direction`).
    bytes: Family<Labels, Counter>,
    /// Packets by fate: verified, forwarded, delivered, unprotected (`fate`).
    packets: Family<Labels, Counter>,
    /// Packets dropped, by reason (the core's drop counters, and send errors).
    drops: Family<Labels, Counter>,
    /// Handshakes completed (`result="connected"`), failed and pairs lost, by `reason`.
    handshakes: Family<Labels, Counter>,
    /// Associations now, by `state` (open, opening), `direction` and `mode`.
    associations: Family<Labels, Gauge>,
    /// Peers (endpoint) or pairs (relay) now, by handshake `state`.
    peers: Family<Labels, Gauge>,
    /// Each peer's smoothed round-trip time (S1 to A1), once measured.
    srtt: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// The core's counters at the last copy.
    last: cohort_hop::HopCounters,
    /// The socket's counts at the last copy.
    last_io: NodeStats,
}

/// The core's counters that are drops, as they are named in [`cohort_hop::HopCounters`].
const DROP_COUNTERS: &[&str] = &[
    "malformed",
    "unknown",
    "forged",
    "replayed",
    "stale",
    "unverifiable",
    "bad_cookie",
    "untrusted",
    "no_room",
    "queue_full",
];
/// The core's counters that are packet fates.
const FATE_COUNTERS: &[&str] = &["verified", "forwarded", "delivered", "unprotected"];

fn label(key: &'static str, value: impl Into<String>) -> Labels {
    vec![(key, value.into())]
}

impl HopMetrics {
    /// Registers the families and binds `addr`; the endpoint is spawned by the caller once
    /// the runtime runs the loop.
    async fn bind(&self, addr: SocketAddr) -> Result<MetricsEndpoint, UsageError> {
        let mut registry = Registry::with_prefix("cohort_hop");
        registry.register(
            "messages",
            "Application messages by direction",
            self.messages.clone(),
        );
        registry.register(
            "bytes",
            "UDP payload bytes by direction",
            self.bytes.clone(),
        );
        registry.register("packets", "Packets by fate", self.packets.clone());
        registry.register("drops", "Packets dropped, by reason", self.drops.clone());
        registry.register(
            "handshakes",
            "Handshakes by result (connected, failed, disconnected) and reason",
            self.handshakes.clone(),
        );
        registry.register(
            "associations",
            "Associations by state, direction and mode (the ALPHA mode is the gear)",
            self.associations.clone(),
        );
        registry.register(
            "peers",
            "Peers or relay pairs by handshake state",
            self.peers.clone(),
        );
        registry.register(
            "srtt_seconds",
            "Smoothed round-trip time (S1 to A1) by peer",
            self.srtt.clone(),
        );
        MetricsEndpoint::bind(addr, registry)
            .await
            .map_err(|e| UsageError(format!("cannot serve metrics on {addr}: {e}")))
    }

    /// Counts one message `"received"` or `"sent"`.
    fn message(&mut self, direction: &'static str) {
        let messages = &self.messages;
        let (received, sent) = self.message_counters.get_or_insert_with(|| {
            let counter = |d| messages.get_or_create(&label("direction", d)).clone();
            (counter("received"), counter("sent"))
        });
        if direction == "received" {
            received.inc();
        } else {
            sent.inc();
        }
    }

    fn handshake(&self, result: &'static str, reason: &'static str) {
        self.handshakes
            .get_or_create(&vec![
                ("result", result.to_string()),
                ("reason", reason.to_string()),
            ])
            .inc();
    }

    /// Copies what changed in the core's and the socket's counters, and the associations
    /// and peers now.
    fn update(&mut self, node: &HopNode, io: NodeStats) {
        let last = self.last_io;
        let by = |now: u64, before: u64| now.saturating_sub(before);
        for (direction, n) in [
            ("sent", by(io.bytes_sent, last.bytes_sent)),
            ("received", by(io.bytes_received, last.bytes_received)),
        ] {
            if n > 0 {
                self.bytes
                    .get_or_create(&label("direction", direction))
                    .inc_by(n);
            }
        }
        let errors = by(io.send_errors, last.send_errors);
        if errors > 0 {
            self.drops
                .get_or_create(&label("reason", "send_error"))
                .inc_by(errors);
        }
        self.last_io = io;
        let counters = match node {
            HopNode::Endpoint(e) => *e.counters(),
            HopNode::Relay(r) => *r.counters(),
        };
        let last: HashMap<&str, u64> = self.last.iter().collect();
        for (name, value) in counters.iter() {
            let delta = value.saturating_sub(last.get(name).copied().unwrap_or(0));
            if delta == 0 {
                continue;
            }
            if DROP_COUNTERS.contains(&name) {
                self.drops
                    .get_or_create(&label("reason", name))
                    .inc_by(delta);
            } else if FATE_COUNTERS.contains(&name) {
                self.packets
                    .get_or_create(&label("fate", name))
                    .inc_by(delta);
            }
        }
        self.last = counters;
        self.associations.clear();
        self.peers.clear();
        self.srtt.clear();
        match node {
            HopNode::Endpoint(e) => {
                for peer in e.status().peers {
                    self.peers.get_or_create(&label("state", peer.state)).inc();
                    if let Some(rtt) = peer.srtt {
                        self.srtt
                            .get_or_create(&label("peer", peer.addr.to_string()))
                            .set(rtt.as_secs_f64());
                    }
                    for a in peer.associations.iter().filter(|a| a.id != 0) {
                        let labels = vec![
                            ("state", if a.open { "open" } else { "opening" }.to_string()),
                            (
                                "direction",
                                if a.outgoing { "out" } else { "in" }.to_string(),
                            ),
                            ("mode", a.mode.to_string()),
                        ];
                        self.associations.get_or_create(&labels).inc();
                    }
                }
            }
            HopNode::Relay(r) => {
                let pairs = r.status().pairs.len();
                self.peers
                    .get_or_create(&label("state", "relayed"))
                    .set(pairs as i64);
            }
        }
    }
}

async fn serve(
    provider: CryptoProvider,
    setup: HopSetup,
    exit_on_eof: bool,
) -> Result<(), UsageError> {
    let HopSetup {
        role,
        identity,
        listen,
        ctl: ctl_path,
        trust,
        delay,
        metrics: metrics_addr,
        peers,
    } = setup;
    // Bound before anything else starts, so an address in use stops us cleanly.
    let metrics = HopMetrics::default();
    let metrics_endpoint = match metrics_addr {
        Some(addr) => Some(metrics.bind(addr).await?),
        None => None,
    };
    let socket = cohort_net::bind_udp(listen)
        .map_err(|e| UsageError(format!("cannot listen on {listen}: {e}")))?;
    let local = socket
        .local_addr()
        .map_err(|e| UsageError(format!("cannot read the socket's address: {e}")))?;
    let mut tun = None;
    let (node, role_name, key) = match role {
        Role::Endpoint(e) => {
            let identity =
                identity.ok_or_else(|| UsageError("config error: identity: missing".into()))?;
            let key = identity.public().to_string();
            let mut config = EndpointConfig::new(identity);
            config.trust = trust;
            if let Some(n) = e.chain_rounds {
                config.chain_rounds = n;
            }
            if let Some(s) = e.storage {
                config.storage = s;
            }
            if let Some(b) = e.delivery_reports {
                config.delivery_reports = b;
            }
            // A chain serves at least a window of rounds: short chains narrow the default.
            config.window = e.window.unwrap_or(
                config
                    .window
                    .min(u8::try_from(config.chain_rounds).unwrap_or(u8::MAX)),
            );
            if let Some(n) = e.max_queue {
                config.max_queue = n;
            }
            if let Some(d) = e.retransmit {
                config.retransmit = d;
            }
            if let Some(n) = e.max_retries {
                config.max_retries = n;
            }
            if let App::Tun(setup) = &e.app {
                let device = TunDevice::open(setup).map_err(|e| {
                    UsageError(format!(
                        "cannot create TUN device {:?}: {e} (app = \"tun\" needs Linux and \
                         CAP_NET_ADMIN, e.g. root)",
                        setup.name
                    ))
                })?;
                if let Some(mark) = setup.fwmark {
                    socket2::SockRef::from(&socket)
                        .set_mark(mark)
                        .map_err(|e| {
                            UsageError(format!(
                                "cannot set fwmark {mark} on the UDP socket: {e} (needs \
                             CAP_NET_ADMIN)"
                            ))
                        })?;
                }
                tun = Some(device);
            }
            let seed = os_seed(&provider).map_err(|e| UsageError(e.to_string()))?;
            let endpoint = Endpoint::new(config, provider, local, seed);
            (HopNode::Endpoint(endpoint), "endpoint", Some(key))
        }
        Role::Relay => {
            let mut config = RelayConfig::new();
            config.trust = trust;
            config.routes = peers
                .iter()
                .filter_map(|p| p.via.map(|via| (p.address, via)))
                .collect();
            (
                HopNode::Relay(Relay::new(config, provider, local)),
                "relay",
                None,
            )
        }
    };
    let (mut ctl_rx, _ctl_guard) = ctl::serve(&ctl_path).map_err(|e| {
        UsageError(format!(
            "cannot open the control socket {}: {e}",
            ctl_path.display()
        ))
    })?;
    let mut started = json::started(role_name, local, key, &ctl_path.display().to_string());
    if let Some(t) = &tun {
        started["tun"] = json!(t.name());
    }
    if let Some(endpoint) = metrics_endpoint {
        if let Ok(addr) = endpoint.local_addr() {
            started["metrics"] = json!(addr.to_string());
        }
        endpoint.spawn();
    }
    emit(&started);

    let mut d = Daemon {
        node: Node::new(node, socket, delay),
        peers,
        reconnect: HashMap::new(),
        tun,
        tun_counters: TunCounters::default(),
        tun_out: TunOutput::new(),
        metrics,
    };
    if d.node.core().endpoint().is_some() {
        let now = d.now();
        for p in d.peers.clone() {
            if p.connect {
                if let Some(e) = d.node.endpoint_mut() {
                    e.connect(now, p.address, p.via);
                }
            }
        }
    }

    let mut stdin = jsonl::commands(MAX_LINE, json::parse_command);
    let mut stdin_open = true;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_counters = *d.counters();
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate())
        .map_err(|e| UsageError(format!("cannot watch SIGTERM: {e}")))?;
    let mut interrupt = signal(SignalKind::interrupt())
        .map_err(|e| UsageError(format!("cannot watch SIGINT: {e}")))?;
    let mut tun_in = TunInput::new();

    loop {
        d.drain().await;
        let wake = {
            let tun = d.tun.as_ref();
            tokio::select! {
                r = d.node.wait() => Wake::Node(r),
                r = tun_recv(tun, &mut tun_in) => Wake::Tun(r),
                input = stdin.recv(), if stdin_open => Wake::Stdin(input),
                request = ctl_rx.recv() => Wake::Ctl(request),
                _ = tick.tick() => Wake::Tick,
                _ = interrupt.recv() => Wake::Stop,
                _ = terminate.recv() => Wake::Stop,
            }
        };
        match wake {
            Wake::Node(Ok(Woke::Timeout)) => {
                let now = d.now();
                d.retry_connects(now);
            }
            Wake::Node(Ok(_)) => {}
            Wake::Node(Err(e)) => {
                return Err(UsageError(format!("the UDP socket failed: {e}")));
            }
            Wake::Tun(Ok(())) => {
                d.tun_read(&tun_in);
                for _ in 0..BURST {
                    let Some(tun) = d.tun.as_ref() else { break };
                    match tun.try_recv(&mut tun_in) {
                        Ok(()) => d.tun_read(&tun_in),
                        Err(e) if is_split_error(&e) => d.tun_counters.read_errors += 1,
                        Err(_) => break,
                    }
                }
            }
            Wake::Tun(Err(e)) if is_split_error(&e) => d.tun_counters.read_errors += 1,
            Wake::Tun(Err(e)) => {
                return Err(UsageError(format!("the TUN device failed: {e}")));
            }
            Wake::Stdin(Some(Ok(command))) => d.command(command),
            Wake::Stdin(Some(Err(line))) => emit(&line),
            Wake::Stdin(None) => {
                stdin_open = false;
                if exit_on_eof {
                    break;
                }
            }
            Wake::Ctl(Some(CtlRequest { request, reply })) => {
                let answer = d.control(request);
                let _ = reply.send(answer);
            }
            Wake::Ctl(None) => {}
            Wake::Tick => {
                d.metrics.update(d.node.core(), d.node.stats());
                let counters = *d.counters();
                if counters != last_counters {
                    let mut line = json::counters(&counters);
                    line["event"] = json!("counters");
                    emit(&line);
                    last_counters = counters;
                }
                let now = d.now();
                d.retry_connects(now);
            }
            Wake::Stop => break,
        }
    }
    // Let held datagrams go (a clean stop should not lose what the core already sent).
    d.node.finish().await;
    Ok(())
}

impl Daemon {
    fn now(&self) -> Timestamp {
        self.node.now()
    }

    fn counters(&self) -> &cohort_hop::HopCounters {
        match self.node.core() {
            HopNode::Endpoint(e) => e.counters(),
            HopNode::Relay(r) => r.counters(),
        }
    }

    /// The machine's call order: every transmit, then every event (which may issue
    /// commands, so again), until neither has anything; then what arrived for the TUN
    /// device is written.
    async fn drain(&mut self) {
        loop {
            self.node.transmit().await;
            let mut any = false;
            while let Some(event) = self.node.poll_event() {
                any = true;
                self.event(event).await;
            }
            if !any {
                break;
            }
        }
        self.write_tun().await;
    }

    /// Writes the queued packets to the TUN device (coalesced, with offloads).
    async fn write_tun(&mut self) {
        let (Some(tun), false) = (&self.tun, self.tun_out.is_empty()) else {
            return;
        };
        let n = self.tun_out.len() as u64;
        self.tun_counters.write_calls += 1;
        match tun.send(&mut self.tun_out).await {
            Ok(_) => self.tun_counters.written += n,
            Err(_) => self.tun_counters.write_errors += n,
        }
    }

    async fn event(&mut self, event: HopEvent) {
        match event {
            HopEvent::Relay(e) => emit(&json::relay_event(&e)),
            HopEvent::Endpoint(EndpointEvent::Received { peer, assoc, data }) => {
                self.metrics.message("received");
                if self.tun.is_some() && !is_whole_ip_packet(&data) {
                    // What the kernel's IP input would drop; kept from the coalescing too.
                    self.tun_counters.received_not_ip += 1;
                } else if self.tun.is_some() {
                    self.tun_out.push(&data);
                    if self.tun_out.len() >= TunOutput::BATCH {
                        self.write_tun().await;
                    }
                } else {
                    emit(&json::endpoint_event(&EndpointEvent::Received {
                        peer,
                        assoc,
                        data,
                    }));
                }
            }
            HopEvent::Endpoint(e) => {
                emit(&json::endpoint_event(&e));
                let now = self.now();
                match &e {
                    EndpointEvent::Connected { .. } => self.metrics.handshake("connected", ""),
                    EndpointEvent::ConnectFailed { reason, .. } => {
                        self.metrics.handshake("failed", reason);
                    }
                    EndpointEvent::Disconnected { reason, .. } => {
                        self.metrics.handshake("disconnected", reason);
                    }
                    _ => {}
                }
                match e {
                    EndpointEvent::Connected { peer, .. } => {
                        self.reconnect.remove(&peer);
                        if let Some(p) = self.peers.iter().find(|p| p.address == peer).cloned() {
                            for _ in 0..p.associations {
                                self.open(now, peer, p.mode);
                            }
                        }
                    }
                    EndpointEvent::ConnectFailed { peer, .. }
                        if self.peers.iter().any(|p| p.address == peer && p.connect) =>
                    {
                        self.reconnect
                            .insert(peer, Instant::now() + RECONNECT_AFTER);
                    }
                    _ => {}
                }
            }
            other => emit(&crate::jsonl::other_event(&other)),
        }
    }

    fn open(&mut self, now: Timestamp, peer: SocketAddr, mode: Mode) -> Value {
        let Some(e) = self.node.endpoint_mut() else {
            return json!({"error": "a relay has no associations of its own"});
        };
        match e.open(now, peer, mode) {
            Ok(assoc) => {
                json!({"opening": assoc, "peer": peer.to_string(), "mode": mode.to_string()})
            }
            Err(err) => {
                let line = jsonl::error(Some("open"), &format!("{peer}: {err}"));
                emit(&line);
                json!({"error": format!("{peer}: {err}")})
            }
        }
    }

    fn retry_connects(&mut self, now: Timestamp) {
        let due: Vec<SocketAddr> = self
            .reconnect
            .iter()
            .filter(|(_, at)| **at <= Instant::now())
            .map(|(p, _)| *p)
            .collect();
        for peer in due {
            self.reconnect.remove(&peer);
            let via = self
                .peers
                .iter()
                .find(|p| p.address == peer)
                .and_then(|p| p.via);
            if let Some(e) = self.node.endpoint_mut() {
                e.connect(now, peer, via);
            }
        }
    }

    /// Hands every IP packet of one device read to the endpoint.
    fn tun_read(&mut self, input: &TunInput) {
        self.tun_counters.reads += 1;
        for packet in input.packets() {
            self.tun_packet(packet);
        }
    }

    /// An IP packet from the TUN device: to the single peer, on any open association.
    fn tun_packet(&mut self, packet: &[u8]) {
        if !is_ip_packet(packet) {
            self.tun_counters.not_ip += 1;
            return;
        }
        let Some(peer) = self.peers.first().map(|p| p.address) else {
            return;
        };
        let now = self.now();
        let Some(e) = self.node.endpoint_mut() else {
            return;
        };
        // One connection stays on one association (so TCP sees no reordering); several
        // connections spread over the associations.
        match e.send_keyed(now, peer, connection_hash(packet), packet) {
            Ok(()) => {
                self.tun_counters.sent += 1;
                self.metrics.message("sent");
            }
            // Like a router with a full queue: drop; TCP above slows down and resends.
            Err(_) => self.tun_counters.refused += 1,
        }
    }

    /// The peer a command means: the one named, or the only one there is.
    fn peer_for(&self, named: Option<SocketAddr>) -> Result<SocketAddr, String> {
        if let Some(p) = named {
            return Ok(p);
        }
        let known: Vec<SocketAddr> = match self.node.core().endpoint() {
            Some(e) => e.status().peers.iter().map(|p| p.addr).collect(),
            None => Vec::new(),
        };
        let mut all: Vec<SocketAddr> = self.peers.iter().map(|p| p.address).collect();
        for k in known {
            if !all.contains(&k) {
                all.push(k);
            }
        }
        match all.as_slice() {
            [one] => Ok(*one),
            [] => Err("no peer yet: name one with \"peer\"".into()),
            _ => Err("several peers: name one with \"peer\"".into()),
        }
    }

    fn mode_for(&self, peer: SocketAddr, text: Option<&str>) -> Result<Mode, String> {
        match text {
            Some(t) => config::parse_mode(t),
            None => Ok(self
                .peers
                .iter()
                .find(|p| p.address == peer)
                .map_or(Mode::M { batch: 32 }, |p| p.mode)),
        }
    }

    /// A stdin command.
    fn command(&mut self, command: json::Command) {
        let now = self.now();
        let result = match command {
            json::Command::Status => {
                let mut line = self.status();
                line["event"] = json!("status");
                emit(&line);
                return;
            }
            json::Command::Send { peer, assoc, data } => (|| {
                let peer = self.peer_for(peer)?;
                let e = self
                    .node
                    .endpoint_mut()
                    .ok_or("a relay sends nothing of its own")?;
                match assoc {
                    Some(a) => e.send(now, peer, a, &data),
                    None => e.send_any(now, peer, &data),
                }
                .map_err(|err| format!("{peer}: {err}"))?;
                self.metrics.message("sent");
                Ok(())
            })()
            .map_err(|e| ("send", e)),
            json::Command::Open { peer, mode } => (|| {
                let peer = self.peer_for(peer)?;
                let mode = self.mode_for(peer, mode.as_deref())?;
                // A refusal prints its own error line; success shows up as `opened`.
                self.open(now, peer, mode);
                Ok(())
            })()
            .map_err(|e| ("open", e)),
            json::Command::Close { peer, assoc } => self
                .close(now, peer, assoc)
                .map(|_| ())
                .map_err(|e| ("close", e)),
        };
        if let Err((cmd, e)) = result {
            emit(&jsonl::error(Some(cmd), &e));
        }
    }

    fn close(
        &mut self,
        now: Timestamp,
        peer: Option<SocketAddr>,
        assoc: u16,
    ) -> Result<Value, String> {
        let peer = self.peer_for(peer)?;
        let e = self
            .node
            .endpoint_mut()
            .ok_or("a relay has no associations of its own")?;
        let status = e.status();
        let assocs = status
            .peers
            .iter()
            .find(|p| p.addr == peer)
            .map(|p| p.associations.clone())
            .unwrap_or_default();
        let outgoing = if assocs.iter().any(|a| a.id == assoc && a.outgoing) {
            true
        } else if assocs.iter().any(|a| a.id == assoc && !a.outgoing) {
            false
        } else {
            return Err(format!("{peer}: no association {assoc}"));
        };
        e.close(now, peer, assoc, outgoing);
        Ok(
            json!({"closed": assoc, "peer": peer.to_string(), "dir": if outgoing { "out" } else { "in" }}),
        )
    }

    /// A control-socket request.
    fn control(&mut self, request: Request) -> Value {
        let now = self.now();
        match request {
            Request::Status => self.status(),
            Request::Open { peer, mode } => {
                let peer = match self.peer_for(peer) {
                    Ok(p) => p,
                    Err(e) => return json!({ "error": e }),
                };
                match self.mode_for(peer, mode.as_deref()) {
                    Ok(mode) => self.open(now, peer, mode),
                    Err(e) => json!({ "error": e }),
                }
            }
            Request::Close { peer, assoc } => {
                let Ok(assoc) = u16::try_from(assoc) else {
                    return json!({"error": "no such association"});
                };
                self.close(now, peer, assoc)
                    .unwrap_or_else(|e| json!({ "error": e }))
            }
        }
    }

    fn status(&self) -> Value {
        let mut v = match self.node.core() {
            HopNode::Endpoint(e) => json::endpoint_status(&e.status()),
            HopNode::Relay(r) => json::relay_status(&r.status()),
        };
        v["delay_ms"] = json!(self.node.delay().as_secs_f64() * 1e3);
        let io = self.node.stats();
        v["send_errors"] = json!(io.send_errors);
        // Batched UDP (COHORT_UDP_BATCH=off turns it off): datagrams per system call.
        v["udp"] = json!({
            "batched": self.node.batching() == cohort_net::batch::Batching::On,
            "datagrams_sent": io.datagrams_sent,
            "send_calls": io.send_calls,
            "datagrams_received": io.datagrams_received,
            "recv_calls": io.recv_calls,
        });
        if let Some(t) = &self.tun {
            let c = &self.tun_counters;
            v["tun"] = json!({
                "name": t.name(),
                "offload": t.offload(),
                "sent": c.sent,
                "reads": c.reads,
                "read_errors": c.read_errors,
                "written": c.written,
                "received_not_ip": c.received_not_ip,
                "write_calls": c.write_calls,
                "refused": c.refused,
                "not_ip": c.not_ip,
                "write_errors": c.write_errors,
            });
        }
        v
    }
}

/// A hash of an IP packet's connection: addresses, protocol and (for TCP and UDP) ports.
/// Anything it cannot parse hashes by its addresses alone (or to 0).
fn connection_hash(packet: &[u8]) -> u64 {
    let (fields, proto, l4): (&[u8], u8, usize) = match packet.first().map(|b| b >> 4) {
        Some(4) if packet.len() >= 20 => {
            let ihl = usize::from(packet[0] & 0x0f) * 4;
            (&packet[12..20], packet[9], ihl)
        }
        Some(6) if packet.len() >= 40 => (&packet[8..40], packet[6], 40),
        _ => return 0,
    };
    // FNV-1a: not a security boundary, only a spread.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut mix = |b: u8| {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    };
    fields.iter().copied().for_each(&mut mix);
    mix(proto);
    if (proto == 6 || proto == 17) && packet.len() >= l4 + 4 {
        packet[l4..l4 + 4].iter().copied().for_each(&mut mix);
    }
    h
}

async fn tun_recv(tun: Option<&TunDevice>, input: &mut TunInput) -> std::io::Result<()> {
    match tun {
        Some(t) => t.recv(input).await,
        None => std::future::pending().await,
    }
}

/// Whether a TUN read failed because its super-packet could not be split (tun-rs's own
/// error, no system error behind it): that read is dropped, the device is fine.
fn is_split_error(e: &std::io::Error) -> bool {
    e.raw_os_error().is_none() && e.kind() != std::io::ErrorKind::WouldBlock
}

/// Writes one JSON line and flushes it. A closed stdout means nobody listens: the node goes
/// on (a TUN endpoint or a relay is useful without anyone reading its lines).
fn emit(value: &Value) {
    let _ = jsonl::write_line(value);
}
