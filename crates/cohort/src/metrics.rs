//! Metrics for operators: a [`MetricsEndpoint`] serves a [`Registry`] in the Prometheus /
//! OpenMetrics text format over HTTP (`GET /metrics`).
//!
//! The families themselves are [`prometheus_client`]'s: each command (or application)
//! registers its counters, gauges and histograms once, keeps clones of them to update, and
//! hands the registry to the endpoint. The HTTP side is deliberately small: one request per
//! connection, `GET` only, bounded request size, read timeout and concurrent connections.
//!
//! ```text
//!   protocol loop ──updates──▶ Counter / Gauge / Histogram (shared, atomic)
//!                                         │ registered in
//!   scraper ──GET /metrics──▶ endpoint ──▶ Registry ──encode──▶ text response
//! ```

use prometheus_client::encoding::text::encode;
pub use prometheus_client::registry::Registry;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Longest request head read; longer requests are answered 431 and closed.
const MAX_REQUEST: usize = 8 * 1024;
/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a refused request may go on being sent before the connection is closed.
const LINGER: Duration = Duration::from_secs(1);
/// How much of a refused request is read and discarded at most.
const MAX_LINGER_BYTES: usize = 64 * 1024;
/// Scrapes served at once; further connections wait in the listen queue.
const MAX_CONNECTIONS: usize = 16;
/// The OpenMetrics text content type that [`encode`] writes.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A bound metrics listener. Bind it before starting anything else, so that an address in
/// use is reported at start-up, then [`spawn`](Self::spawn) it.
pub struct MetricsEndpoint {
    listener: TcpListener,
    registry: Arc<Registry>,
}

impl MetricsEndpoint {
    /// Binds `addr` (TCP). Fails if the address is in use or cannot be bound.
    pub async fn bind(addr: SocketAddr, registry: Registry) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        Ok(MetricsEndpoint {
            listener,
            registry: Arc::new(registry),
        })
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves scrapes on the current tokio runtime until the task is aborted.
    pub fn spawn(self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.serve())
    }

    /// Serves scrapes until the future is dropped.
    pub async fn serve(self) {
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let stream = match self.listener.accept().await {
                Ok((stream, _)) => stream,
                // Out of descriptors and the like: back off briefly, keep serving.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let registry = self.registry.clone();
            tokio::spawn(async move {
                let _ = answer(stream, &registry).await;
                drop(permit);
            });
        }
    }
}

/// Binds `addr`, spawns the endpoint on the current tokio runtime and returns the bound
/// address: what a command does when it starts with `--metrics`.
pub async fn serve(addr: SocketAddr, registry: Registry) -> io::Result<SocketAddr> {
    let endpoint = MetricsEndpoint::bind(addr, registry).await?;
    let bound = endpoint.local_addr()?;
    endpoint.spawn();
    Ok(bound)
}

/// Renders `registry` as the text a scrape returns.
pub fn render(registry: &Registry) -> String {
    let mut body = String::new();
    // Writing into a String cannot fail; an encoding error would be a bug in a family.
    if encode(&mut body, registry).is_err() {
        body.clear();
    }
    body
}

/// Reads one request from `stream` and answers it.
async fn answer(mut stream: TcpStream, registry: &Registry) -> io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let complete = tokio::time::timeout(READ_TIMEOUT, async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            if head.len() > MAX_REQUEST {
                return Ok(false);
            }
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<bool, io::Error>(head.len() <= MAX_REQUEST)
    })
    .await
    .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
    let response = if complete {
        respond(&head, registry)
    } else {
        status(
            431,
            "Request Header Fields Too Large",
            "request too large\n",
        )
    };
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await?;
    // Lingering close: a client still sending (a request we refused half read) would
    // otherwise get a reset that discards our answer. Drain a little, briefly.
    let _ = tokio::time::timeout(LINGER, async {
        let mut drained = 0;
        while drained < MAX_LINGER_BYTES {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    })
    .await;
    Ok(())
}

/// The response to the request whose head is `head`.
fn respond(head: &[u8], registry: &Registry) -> String {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, target) = (parts.next().unwrap_or_default(), parts.next());
    let path = target
        .map(|t| t.split(|&b| b == b'?').next().unwrap_or_default())
        .unwrap_or_default();
    match (method, path) {
        (b"GET", b"/metrics") => {
            let body = render(registry);
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
        }
        (b"GET", b"/") => status(200, "OK", "cohort metrics: GET /metrics\n"),
        (b"GET", _) => status(404, "Not Found", "not found; try /metrics\n"),
        _ => status(405, "Method Not Allowed", "only GET\n"),
    }
}

fn status(code: u16, reason: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    fn registry_with(counter: &Counter) -> Registry {
        let mut registry = Registry::with_prefix("cohort");
        registry.register("test_events", "Events seen by the test", counter.clone());
        registry
    }

    async fn get(addr: SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut out = String::new();
        stream.read_to_string(&mut out).await.expect("read");
        out
    }

    #[tokio::test]
    async fn scrape_returns_the_current_values() {
        let counter = Counter::default();
        let endpoint = MetricsEndpoint::bind(
            "127.0.0.1:0".parse().expect("addr"),
            registry_with(&counter),
        )
        .await
        .expect("bind");
        let addr = endpoint.local_addr().expect("addr");
        let task = endpoint.spawn();
        counter.inc_by(41);
        counter.inc();
        let response = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(
            response.contains("\ncohort_test_events_total 42\n"),
            "{response}"
        );
        assert!(response.ends_with("# EOF\n"), "{response}");
        let missing = get(addr, "GET /nothing HTTP/1.1\r\n\r\n").await;
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        let post = get(addr, "POST /metrics HTTP/1.1\r\n\r\n").await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        let huge = format!(
            "GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n",
            "a".repeat(MAX_REQUEST + 10)
        );
        let refused = get(addr, &huge).await;
        assert!(refused.starts_with("HTTP/1.1 431"), "{refused}");
        // The endpoint still serves after refusing.
        counter.inc();
        let again = get(addr, "GET /metrics HTTP/1.0\r\n\r\n").await;
        assert!(again.contains("\ncohort_test_events_total 43\n"), "{again}");
        task.abort();
    }

    #[tokio::test]
    async fn an_address_in_use_fails_at_bind() {
        let first =
            MetricsEndpoint::bind("127.0.0.1:0".parse().expect("addr"), Registry::default())
                .await
                .expect("bind");
        let addr = first.local_addr().expect("addr");
        let second = MetricsEndpoint::bind(addr, Registry::default()).await;
        assert_eq!(
            second.err().map(|e| e.kind()),
            Some(io::ErrorKind::AddrInUse)
        );
    }
}
