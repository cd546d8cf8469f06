//! `--metrics ADDR` as an operator uses it: `tunnel server` and `tunnel client`, `kdc serve`,
//! `hop run` and `group run` started with a metrics port (or the config file's `metrics`), a little traffic pushed through them, then
//! scraped with curl and parsed with the Python prometheus_client OpenMetrics parser (the
//! reference parser: a format slip fails here). The values are checked against the traffic
//! the test made. A metrics address already in use is one line and exit status 2, with
//! nothing started.
//!
//! Needs `curl`, `python3` and the `prometheus-client` package (`pip install
//! prometheus-client`; .ci/run installs it). Missing, the test fails and says so.
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

mod support;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use cohort_crypto::CryptoProvider;
use cohort_kdc::{KeyFile, PairKeyRequest};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{arg, cohort, exits_2, free_port, keygen, need, tempdir, Daemon, StderrWatch, WAIT};

/// The parser run on a scrape (one JSON line per sample, `[name, labels, value]`): the
/// operators' script, so that it is tested too.
fn metrics_check() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/metrics_check.py")
}

/// One parsed sample.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A parsed scrape.
struct Scrape(Vec<Sample>);

impl Scrape {
    /// The sample `name` whose labels include every pair of `labels`, summed over the rest
    /// (0 if none).
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
            .sum()
    }

    fn has(&self, name: &str) -> bool {
        self.0.iter().any(|s| s.name == name)
    }
}

impl std::fmt::Debug for Scrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for s in &self.0 {
            writeln!(f, "{} {:?} {}", s.name, s.labels, s.value)?;
        }
        Ok(())
    }
}

/// Fails the test, loudly, if the scraping tools are missing.
fn need_tools() {
    need("curl");
    let check = Command::new("python3")
        .args(["-c", "import prometheus_client.openmetrics.parser"])
        .output();
    match check {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "this test needs the Python package prometheus-client (pip install prometheus-client; .ci/run installs it): {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!("this test needs python3 on the PATH with prometheus-client installed: {e}"),
    }
}

/// `curl` GET /metrics from `addr`, parsed with the Python OpenMetrics parser.
fn scrape(addr: &str) -> Scrape {
    let out = Command::new("curl")
        .args(["-sS", "--fail", "--max-time", "10"])
        .arg(format!("http://{addr}/metrics"))
        .output()
        .expect("run curl");
    assert!(
        out.status.success(),
        "curl http://{addr}/metrics: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut python = Command::new("python3")
        .arg(metrics_check())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3");
    python.stdin.take().unwrap().write_all(&out.stdout).unwrap();
    let parsed = python.wait_with_output().unwrap();
    assert!(
        parsed.status.success(),
        "the OpenMetrics parser refused the scrape: {}\n{}",
        String::from_utf8_lossy(&parsed.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let samples = String::from_utf8(parsed.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let (name, labels, value): (String, BTreeMap<String, String>, f64) =
                serde_json::from_str(line).unwrap();
            Sample {
                name,
                labels,
                value,
            }
        })
        .collect();
    Scrape(samples)
}

/// Scrapes until `done` holds (the values move as the processes catch up), then returns
/// that scrape; fails after [`WAIT`] showing the last one.
fn scrape_until(addr: &str, what: &str, done: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = Instant::now() + WAIT;
    loop {
        let s = scrape(addr);
        if done(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{addr} never showed {what}:\n{s:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The address in a "... metrics on http://ADDR/metrics" line.
fn metrics_addr(line: &str) -> String {
    line.split("http://")
        .nth(1)
        .and_then(|rest| rest.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("no metrics address in {line:?}"))
        .to_string()
}

/// A plain TCP echo server on loopback (the tunnel's target); returns its address.
fn echo_target() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 * 1024];
                loop {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if conn.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn tunnel_server_and_client_export_handshakes_bytes_and_failures() {
    need_tools();
    let dir = tempdir("metrics-tunnel");
    let key = keygen(&dir, "server");
    let target = echo_target();
    let server_port = free_port();
    let client_port = free_port();
    let server_listen = format!("127.0.0.1:{server_port}");
    let client_listen = format!("127.0.0.1:{client_port}");
    let mut server = StderrWatch::start(&[
        "tunnel",
        "server",
        "--listen",
        &server_listen,
        "--forward",
        &target.to_string(),
        "--key",
        arg(&dir.join("server.key")),
        "--metrics",
        "127.0.0.1:0",
    ]);
    let server_metrics = metrics_addr(&server.wait_for("metrics on http://"));
    server.wait_for("listening on");
    let mut client = StderrWatch::start(&[
        "tunnel",
        "client",
        "--listen",
        &client_listen,
        "--connect",
        &server_listen,
        "--pin",
        &key,
        "--metrics",
        "127.0.0.1:0",
    ]);
    let client_metrics = metrics_addr(&client.wait_for("metrics on http://"));
    client.wait_for("listening on");

    // Three connections through the tunnel, 10,000 bytes each way, each closed cleanly.
    const CONNECTIONS: usize = 3;
    const BYTES: usize = 10_000;
    for i in 0..CONNECTIONS {
        let mut app = TcpStream::connect(&client_listen).unwrap();
        app.set_read_timeout(Some(WAIT)).unwrap();
        let data: Vec<u8> = (0..BYTES).map(|j| (i + j) as u8).collect();
        app.write_all(&data).unwrap();
        let mut back = vec![0u8; BYTES];
        app.read_exact(&mut back).unwrap();
        assert_eq!(back, data);
        app.shutdown(std::net::Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        app.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    }
    // Something that does not speak cohort, straight at the server: a failed handshake.
    let mut junk = TcpStream::connect(&server_listen).unwrap();
    junk.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    junk.set_read_timeout(Some(WAIT)).unwrap();
    let _ = junk.read_to_end(&mut Vec::new());

    let n = CONNECTIONS as f64;
    for (side, addr) in [("client", &client_metrics), ("server", &server_metrics)] {
        let s = scrape_until(addr, "every tunnel closed", |s| {
            s.sum("cohort_tunnel_handshakes_total", &[]) >= n
                && s.sum("cohort_tunnel_open", &[]) == 0.0
                && s.sum("cohort_tunnel_bytes_total", &[("direction", "received")])
                    >= (CONNECTIONS * BYTES) as f64
        });
        // Every connection made one handshake: the first full, the others resumed.
        assert_eq!(
            s.sum("cohort_tunnel_handshakes_total", &[]),
            n,
            "{side}: {s:?}"
        );
        assert_eq!(
            s.sum("cohort_tunnel_handshakes_total", &[("kind", "full")]),
            1.0,
            "{side}: {s:?}"
        );
        assert_eq!(
            s.sum("cohort_tunnel_handshakes_total", &[("kind", "resumed")]),
            n - 1.0,
            "{side}: {s:?}"
        );
        assert_eq!(
            s.sum("cohort_tunnel_handshake_seconds_count", &[]),
            n,
            "{side}: {s:?}"
        );
        assert!(
            s.sum("cohort_tunnel_handshake_seconds_sum", &[]) > 0.0,
            "{side}: {s:?}"
        );
        // Plaintext bytes: what the applications sent, both ways.
        for direction in ["sent", "received"] {
            assert_eq!(
                s.sum("cohort_tunnel_bytes_total", &[("direction", direction)]),
                (CONNECTIONS * BYTES) as f64,
                "{side} {direction}: {s:?}"
            );
        }
        // A gear was in use and is no longer.
        assert!(s.has("cohort_tunnel_gear_tunnels"), "{side}: {s:?}");
        assert_eq!(
            s.sum("cohort_tunnel_gear_tunnels", &[]),
            0.0,
            "{side}: {s:?}"
        );
    }
    let s = scrape_until(&server_metrics, "the failed handshake", |s| {
        s.sum("cohort_tunnel_handshake_failures_total", &[]) >= 1.0
    });
    assert_eq!(
        s.sum(
            "cohort_tunnel_handshake_failures_total",
            &[("reason", "not_cohort")]
        ),
        1.0,
        "{s:?}"
    );
    assert_eq!(
        s.sum("cohort_tunnel_connections_total", &[]),
        n + 1.0,
        "{s:?}"
    );
    let c = scrape(&client_metrics);
    assert_eq!(c.sum("cohort_tunnel_connections_total", &[]), n, "{c:?}");
    assert_eq!(
        c.sum("cohort_tunnel_handshake_failures_total", &[]),
        0.0,
        "{c:?}"
    );
    drop((server, client));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kdc_serve_exports_requests_drops_and_bytes() {
    need_tools();
    let dir = tempdir("metrics-kdc");
    let config = dir.join("kdc.toml");
    std::fs::write(
        &config,
        "listen = \"127.0.0.1:0\"\ndatabase = \"kdc.db\"\nmetrics = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    for name in ["leader", "alice"] {
        let out = cohort(&[
            "kdc",
            "add-principal",
            name,
            "--config",
            arg(&config),
            "--out",
            arg(&dir),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut kdc = StderrWatch::start(&["kdc", "serve", "--config", arg(&config)]);
    let metrics = metrics_addr(&kdc.wait_for("metrics on http://"));
    let line = kdc.wait_for("listening on");
    let addr: SocketAddr = line
        .split("listening on ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .unwrap()
        .parse()
        .unwrap();
    let read = |name: &str| {
        KeyFile::parse(&std::fs::read_to_string(dir.join(format!("{name}.key"))).unwrap()).unwrap()
    };
    let (leader, alice) = (read("leader"), read("alice"));
    let provider = CryptoProvider::default_provider();
    let request =
        PairKeyRequest::new(&provider, leader.name, &leader.key, alice.name, [7; 16]).unwrap();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_read_timeout(Some(WAIT)).unwrap();
    socket.send_to(request.bytes(), addr).unwrap();
    let mut buf = [0u8; 2048];
    let (reply_len, _) = socket.recv_from(&mut buf).expect("an answer");
    request.open_response(&buf[..reply_len]).unwrap();
    // The same request again (a replay), then junk: both dropped.
    socket.send_to(request.bytes(), addr).unwrap();
    kdc.wait_for("replayed");
    socket.send_to(b"junk", addr).unwrap();
    kdc.wait_for("malformed");

    let s = scrape(&metrics);
    assert_eq!(
        s.sum("cohort_kdc_requests_total", &[("outcome", "answered")]),
        1.0,
        "{s:?}"
    );
    assert_eq!(s.sum("cohort_kdc_requests_total", &[]), 1.0, "{s:?}");
    assert_eq!(
        s.sum("cohort_kdc_drops_total", &[("reason", "replayed")]),
        1.0,
        "{s:?}"
    );
    assert_eq!(
        s.sum("cohort_kdc_drops_total", &[("reason", "malformed")]),
        1.0,
        "{s:?}"
    );
    let received = (2 * request.bytes().len() + 4) as f64;
    assert_eq!(
        s.sum("cohort_kdc_bytes_total", &[("direction", "received")]),
        received,
        "{s:?}"
    );
    assert_eq!(
        s.sum("cohort_kdc_bytes_total", &[("direction", "sent")]),
        reply_len as f64,
        "{s:?}"
    );
    assert_eq!(s.sum("cohort_kdc_principals", &[]), 2.0, "{s:?}");
    assert_eq!(s.sum("cohort_kdc_handle_seconds_count", &[]), 3.0, "{s:?}");
    drop(kdc);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hop_run_exports_messages_handshakes_and_associations() {
    need_tools();
    let dir = tempdir("metrics-hop");
    let ka = keygen(&dir, "a");
    let kb = keygen(&dir, "b");
    let mut b = Daemon::start(
        &dir,
        "b",
        HOP_RUN,
        &format!(
            "role = \"endpoint\"\nidentity = \"b.key\"\nlisten = \"127.0.0.1:0\"\ntrust = [\"{ka}\"]\nmetrics = \"127.0.0.1:0\"\n"
        ),
    );
    let b_listen = b.started_str("listen");
    let b_metrics = b.started_str("metrics");
    let mut a = Daemon::start(
        &dir,
        "a",
        HOP_RUN,
        &format!(
            "role = \"endpoint\"\nidentity = \"a.key\"\nlisten = \"127.0.0.1:0\"\nmode = \"m:4\"\n\
             metrics = \"127.0.0.1:0\"\n[[peer]]\naddress = \"{b_listen}\"\ntrust = \"{kb}\"\n"
        ),
    );
    let a_metrics = a.started_str("metrics");
    a.wait("an outgoing association", |v| {
        v["event"] == "opened" && v["dir"] == "out"
    });
    const MESSAGES: usize = 8;
    for i in 0..MESSAGES {
        a.command(json!({"cmd": "send", "data": BASE64.encode(format!("m{i}"))}));
    }
    b.wait_count("every message", MESSAGES, |v: &Value| {
        v["event"] == "received"
    });
    let n = MESSAGES as f64;
    let sa = scrape_until(&a_metrics, "the messages", |s| {
        s.sum("cohort_hop_messages_total", &[("direction", "sent")]) >= n
    });
    assert_eq!(
        sa.sum("cohort_hop_messages_total", &[("direction", "sent")]),
        n,
        "{sa:?}"
    );
    assert_eq!(
        sa.sum("cohort_hop_handshakes_total", &[("result", "connected")]),
        1.0,
        "{sa:?}"
    );
    assert!(
        sa.sum("cohort_hop_bytes_total", &[("direction", "sent")]) > 0.0,
        "{sa:?}"
    );
    // The association is open, outgoing, in the configured mode (updated every second).
    let sa = scrape_until(&a_metrics, "the open association", |s| {
        s.sum(
            "cohort_hop_associations",
            &[("state", "open"), ("direction", "out")],
        ) >= 1.0
    });
    assert_eq!(
        sa.sum(
            "cohort_hop_associations",
            &[("state", "open"), ("direction", "out"), ("mode", "m:4")]
        ),
        1.0,
        "{sa:?}"
    );
    // A's round trips to B were measured (S1 to A1 on loopback: well under a second).
    let sa = scrape_until(&a_metrics, "a round-trip time", |s| {
        s.has("cohort_hop_srtt_seconds")
    });
    let srtt = sa.sum("cohort_hop_srtt_seconds", &[("peer", &b_listen)]);
    assert!(srtt > 0.0 && srtt < 1.0, "{sa:?}");
    let sb = scrape_until(&b_metrics, "the delivered messages", |s| {
        s.sum("cohort_hop_packets_total", &[("fate", "delivered")]) >= n
    });
    assert_eq!(
        sb.sum("cohort_hop_messages_total", &[("direction", "received")]),
        n,
        "{sb:?}"
    );
    assert_eq!(
        sb.sum("cohort_hop_packets_total", &[("fate", "delivered")]),
        n,
        "{sb:?}"
    );
    assert_eq!(sb.sum("cohort_hop_drops_total", &[]), 0.0, "{sb:?}");
    assert_eq!(
        sb.sum("cohort_hop_peers", &[("state", "established")]),
        1.0,
        "{sb:?}"
    );
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `cohort hop run`.
const HOP_RUN: &[&str] = &["hop", "run"];

/// Runs `args` against a metrics address that is taken; checks the one line and exit 2.
fn refused_in_use(args: &[&str], taken: &str) {
    let out = cohort(args);
    let stderr = exits_2(&out);
    assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    assert!(
        stderr.contains(&format!("cannot serve metrics on {taken}")),
        "{args:?}: {stderr}"
    );
    assert!(
        stderr.to_lowercase().contains("in use"),
        "{args:?}: {stderr}"
    );
}

#[test]
fn a_metrics_address_in_use_is_one_line_and_exit_2() {
    let dir = tempdir("metrics-in-use");
    let holder = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = holder.local_addr().unwrap().to_string();
    let free = format!("127.0.0.1:{}", free_port());
    refused_in_use(
        &[
            "tunnel",
            "server",
            "--listen",
            &free,
            "--forward",
            "127.0.0.1:9",
            "--metrics",
            &taken,
        ],
        &taken,
    );
    // Nothing half started: the tunnel port was never bound.
    TcpListener::bind(&free).expect("the tunnel server's port is free");
    refused_in_use(
        &[
            "tunnel",
            "client",
            "--listen",
            &free,
            "--connect",
            "127.0.0.1:9",
            "--metrics",
            &taken,
        ],
        &taken,
    );
    let config = dir.join("kdc.toml");
    std::fs::write(&config, "listen = \"127.0.0.1:0\"\ndatabase = \"kdc.db\"\n").unwrap();
    let out = cohort(&[
        "kdc",
        "add-principal",
        "x",
        "--config",
        arg(&config),
        "--out",
        arg(&dir),
    ]);
    assert!(out.status.success());
    refused_in_use(
        &[
            "kdc",
            "serve",
            "--config",
            arg(&config),
            "--metrics",
            &taken,
        ],
        &taken,
    );
    keygen(&dir, "a");
    let hop = dir.join("a.toml");
    std::fs::write(
        &hop,
        format!("role = \"endpoint\"\nidentity = \"a.key\"\nlisten = \"127.0.0.1:0\"\nmetrics = \"{taken}\"\n"),
    )
    .unwrap();
    refused_in_use(&["hop", "run", "--config", arg(&hop)], &taken);
    // The control socket was never created.
    assert!(!Path::new(&dir.join("a.sock")).exists());
    drop(holder);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `group run` member's TOML (its key is `<name>.key` in the test's directory).
fn group_config(name: &str, peers: &[&str], trust: &[&str], extra: &str) -> String {
    let quoted = |items: &[&str]| {
        let q: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
        format!("[{}]", q.join(", "))
    };
    format!(
        "identity = \"{name}.key\"\ngroup = \"metrics\"\nlisten = \"127.0.0.1:0\"\n\
         peers = {}\ntrust = {}\nheartbeat_ms = 50\nsuspect_ms = 500\nflush_ms = 300\n{extra}",
        quoted(peers),
        quoted(trust)
    )
}

#[test]
fn group_run_exports_messages_views_and_rekeys() {
    need_tools();
    let dir = tempdir("metrics-group");
    let (a_id, b_id) = (keygen(&dir, "a"), keygen(&dir, "b"));
    let trust = [a_id.as_str(), b_id.as_str()];
    // a takes its metrics address from the file, b from the command line.
    let (a_metrics, b_metrics) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let mut a = Daemon::start(
        &dir,
        "a",
        &["group", "run"],
        &group_config("a", &[], &trust, &format!("metrics = \"{a_metrics}\"\n")),
    );
    let a_listen = a.started_str("listen");
    let mut b = Daemon::start(
        &dir,
        "b",
        &["group", "run", "--metrics", &b_metrics],
        &group_config("b", &[&a_listen], &trust, ""),
    );
    for m in [&mut a, &mut b] {
        m.wait("a view of two", |v| {
            v["event"] == "view" && v["members"].as_array().is_some_and(|m| m.len() == 2)
        });
    }
    for i in 0..3u8 {
        a.command(json!({"cmd": "send", "channel": "reliable", "data": BASE64.encode([i; 1000])}));
    }
    a.command(json!({"cmd": "rekey"}));
    let delivered = |s: &Scrape| {
        s.sum(
            "cohort_group_messages_delivered_total",
            &[("channel", "reliable")],
        )
    };
    // Counters from the member's stats are copied once a second; the rest as events come.
    let at_a = scrape_until(&a_metrics, "3 sent, 3 delivered and a rekey at a", |s| {
        delivered(s) >= 3.0
            && s.sum("cohort_group_messages_sent_total", &[]) >= 3.0
            && s.sum("cohort_group_rekey_duration_seconds_count", &[]) >= 1.0
    });
    let at_b = scrape_until(&b_metrics, "3 deliveries at b", |s| delivered(s) >= 3.0);
    for (who, s) in [("a", &at_a), ("b", &at_b)] {
        assert_eq!(delivered(s), 3.0, "{who}:\n{s:?}");
        assert_eq!(
            s.sum(
                "cohort_group_bytes_delivered_total",
                &[("channel", "reliable")]
            ),
            3000.0,
            "{who}:\n{s:?}"
        );
        assert_eq!(s.sum("cohort_group_members", &[]), 2.0, "{who}:\n{s:?}");
        assert!(s.has("cohort_group_dropped_total"), "{who}:\n{s:?}");
    }
    // The sender's own counters: three messages of 1000 bytes.
    assert_eq!(
        at_a.sum("cohort_group_messages_sent_total", &[]),
        3.0,
        "{at_a:?}"
    );
    assert_eq!(
        at_a.sum("cohort_group_bytes_sent_total", &[]),
        3000.0,
        "{at_a:?}"
    );
    assert!(
        at_a.sum("cohort_group_view_changes_total", &[]) >= 2.0,
        "{at_a:?}"
    );
    assert!(
        at_a.sum("cohort_group_datagrams_total", &[("direction", "sent")]) > 0.0,
        "{at_a:?}"
    );
    // After the rekey both hold the same key epoch.
    let epoch = at_a.sum("cohort_group_key_epoch", &[]);
    scrape_until(&b_metrics, "b at a's key epoch", |s| {
        s.sum("cohort_group_key_epoch", &[]) == epoch
    });
}
