//! A nats-server child process on loopback, for `cohort group bench --transport nats` and for
//! tests: a broker this process started, owns and kills.
//!
//! The server picks its own port (`-p -1`) and reports it in its log; [`LocalNatsServer`]
//! reads the port from there. A port chosen by the caller (bind port 0, release it, pass
//! the number on) can be taken in between, by another test's server among others, and then
//! the caller's clients talk to a server it did not start; a port the server bound and
//! reported cannot be.

use std::io::{self, BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// What the server's log says once it accepts clients, before the address.
const LISTENING: &str = "Listening for client connections on ";
/// What the server's log says once it serves monitoring (`-m -1`), before the address.
const MONITOR: &str = "Starting http monitor on ";
/// What the server's log says once it is ready.
const READY: &str = "Server is ready";

/// A nats-server on `127.0.0.1` that this process started; killed and reaped when dropped.
#[derive(Debug)]
pub struct LocalNatsServer {
    child: Child,
    port: u16,
    monitor: Option<u16>,
}

impl LocalNatsServer {
    /// Starts `nats-server` on a port it picks itself, with `extra` arguments (for example
    /// `--user`, `--pass` or TLS options), and waits up to `wait` until its log says it is
    /// ready.
    pub fn start(extra: &[&str], wait: Duration) -> io::Result<LocalNatsServer> {
        LocalNatsServer::spawn("-1", extra, wait)
    }

    /// Starts `nats-server` on `port` (for example the port of a server that was stopped, to
    /// restart it), and fails if it listens anywhere else.
    pub fn start_on(port: u16, extra: &[&str], wait: Duration) -> io::Result<LocalNatsServer> {
        let server = LocalNatsServer::spawn(&port.to_string(), extra, wait)?;
        if server.port != port {
            return Err(io::Error::other(format!(
                "nats-server listens on port {} instead of {port}",
                server.port
            )));
        }
        Ok(server)
    }

    fn spawn(port: &str, extra: &[&str], wait: Duration) -> io::Result<LocalNatsServer> {
        let mut child = Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", port])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot start nats-server: {e}")))?;
        let Some(log) = child.stderr.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::other("nats-server's log is not a pipe"));
        };
        let (tx, rx) = mpsc::channel();
        // Reads the log until the server says it is ready, then keeps draining it so that the
        // server never blocks on a full pipe. The thread ends when the server exits.
        std::thread::spawn(move || {
            let port_after = |line: &str, what: &str| {
                let rest = line.split(what).nth(1)?;
                rest.rsplit(':').next()?.trim().parse::<u16>().ok()
            };
            let (mut port, mut monitor) = (None, None);
            for line in BufReader::new(log).lines() {
                let Ok(line) = line else { break };
                port = port.or_else(|| port_after(&line, LISTENING));
                monitor = monitor.or_else(|| port_after(&line, MONITOR));
                if line.contains(READY) {
                    let _ = tx.send((port.take(), monitor.take()));
                }
            }
        });
        let found = rx.recv_timeout(wait);
        let mut server = LocalNatsServer {
            child,
            port: 0,
            monitor: None,
        };
        match found {
            Ok((Some(port), monitor)) => {
                server.port = port;
                server.monitor = monitor;
                Ok(server)
            }
            Ok((None, _)) => Err(io::Error::other(
                "nats-server was ready but its log did not give its client port",
            )),
            Err(_) => {
                let status = server.child.try_wait().ok().flatten();
                Err(io::Error::other(match status {
                    Some(status) => format!("nats-server exited at start-up ({status})"),
                    None => format!("nats-server was not ready within {wait:?}"),
                }))
            }
        }
    }

    /// The loopback port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port of the server's HTTP monitoring (`/connz`, `/varz`), when it was started
    /// with `-m -1` (its log gives the port it took).
    pub fn monitor_port(&self) -> Option<u16> {
        self.monitor
    }

    /// The URL clients connect to: `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The server's process ID (for its CPU time in `/proc`, or a signal).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for LocalNatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
