//! Configuration: ALPHA modes, and what endpoints and relays are told by their operator.

use crate::chain::ChainStorage;
use cohort_channel::identity::{Identity, PublicKey};
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use crate::wire::mode_code;

/// Default messages per round for ALPHA-C and ALPHA-M.
pub const DEFAULT_BATCH: u16 = 32;
/// Largest ALPHA-C batch: one S1 carries a MAC per message.
pub const MAX_BATCH_C: u16 = crate::wire::MAX_S1_MACS as u16;
/// Largest ALPHA-M batch: a Merkle tree of up to this many leaves.
pub const MAX_BATCH_M: u16 = crate::merkle::MAX_LEAVES as u16;

/// How an association authenticates its messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// No authentication at all: the baseline that benchmarks compare against. Relays
    /// forward it unchecked. Never use it for traffic that matters.
    Unprotected,
    /// ALPHA-N: one message per round; lowest latency.
    N,
    /// ALPHA-C: up to `batch` messages per round, one MAC each in S1.
    C {
        /// Messages per round (1 to [`MAX_BATCH_C`]).
        batch: u16,
    },
    /// ALPHA-M: up to `batch` messages per round, one MAC over a Merkle root in S1, an
    /// authentication path in each S2.
    M {
        /// Messages per round (1 to [`MAX_BATCH_M`]).
        batch: u16,
    },
}

impl Mode {
    /// The wire code.
    pub fn code(self) -> u8 {
        match self {
            Mode::Unprotected => mode_code::UNPROTECTED,
            Mode::N => mode_code::N,
            Mode::C { .. } => mode_code::C,
            Mode::M { .. } => mode_code::M,
        }
    }

    /// Messages per round.
    pub fn batch(self) -> u16 {
        match self {
            Mode::Unprotected | Mode::N => 1,
            Mode::C { batch } | Mode::M { batch } => batch,
        }
    }

    /// The mode for a wire code and batch, if valid.
    pub fn from_code(code: u8, batch: u16) -> Option<Mode> {
        let mode = match code {
            mode_code::UNPROTECTED => Mode::Unprotected,
            mode_code::N => Mode::N,
            mode_code::C => Mode::C { batch },
            mode_code::M => Mode::M { batch },
            _ => return None,
        };
        mode.is_valid().then_some(mode)
    }

    /// Whether the batch is within the mode's limits.
    pub fn is_valid(self) -> bool {
        match self {
            Mode::Unprotected | Mode::N => true,
            Mode::C { batch } => (1..=MAX_BATCH_C).contains(&batch),
            Mode::M { batch } => (1..=MAX_BATCH_M).contains(&batch),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Unprotected => f.write_str("none"),
            Mode::N => f.write_str("n"),
            Mode::C { batch } => write!(f, "c:{batch}"),
            Mode::M { batch } => write!(f, "m:{batch}"),
        }
    }
}

impl FromStr for Mode {
    type Err = String;

    /// `none`, `n`, `c`, `c:16`, `m`, `m:64`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, batch) = match s.split_once(':') {
            Some((name, batch)) => {
                let batch = batch
                    .parse::<u16>()
                    .map_err(|_| format!("bad batch size in mode {s:?}"))?;
                (name, Some(batch))
            }
            None => (s, None),
        };
        let mode = match (name.to_ascii_lowercase().as_str(), batch) {
            ("none", None) => Mode::Unprotected,
            ("n", None) => Mode::N,
            ("c", b) => Mode::C {
                batch: b.unwrap_or(DEFAULT_BATCH),
            },
            ("m", b) => Mode::M {
                batch: b.unwrap_or(DEFAULT_BATCH),
            },
            _ => {
                return Err(format!(
                    "unknown mode {s:?} (expected none, n, c[:batch] or m[:batch])"
                ))
            }
        };
        if !mode.is_valid() {
            return Err(format!(
                "batch out of range in mode {s:?} (c: 1..={MAX_BATCH_C}, m: 1..={MAX_BATCH_M})"
            ));
        }
        Ok(mode)
    }
}

/// Rounds in flight per outgoing association unless configured otherwise.
pub const DEFAULT_WINDOW: u8 = 8;

/// An endpoint's settings.
#[derive(Clone, Debug)]
pub struct EndpointConfig {
    /// The Ed25519 identity that signs this endpoint's anchors.
    pub identity: Identity,
    /// Peers accepted in a handshake; empty accepts any peer whose signatures check (the
    /// anchors are still bound to its key).
    pub trust: Vec<PublicKey>,
    /// Rounds one chain serves before it is renewed (each round uses two elements).
    pub chain_rounds: u32,
    /// How chains are stored: memory against hashes.
    pub storage: ChainStorage,
    /// Whether outgoing associations ask for A2 delivery reports.
    pub delivery_reports: bool,
    /// Rounds an outgoing association may have between S1 and S2 at once (1 to
    /// [`crate::guard::MAX_WINDOW`]; an association uses at most half of `max_rounds` and at
    /// most `chain_rounds`). One round at a time waits a round trip per round; a window of
    /// `w` sends up to `w` rounds per round trip. Relays must remember at least `2w` rounds
    /// (their `max_rounds`) to follow the association.
    pub window: u8,
    /// Messages an outgoing association queues before it drops new ones.
    pub max_queue: usize,
    /// First retransmission timeout (handshake, S1, control messages); later ones adapt to
    /// the measured round-trip time.
    pub retransmit: Duration,
    /// Retransmissions before a handshake fails, before an association says `Stalled` (it
    /// keeps resending), and (doubled) before a peer that answers no control message is
    /// given up.
    pub max_retries: u32,
    /// Rounds a receiver remembers per association (older rounds are evicted).
    pub max_rounds: usize,
    /// Most peers (pairs) at once; handshakes beyond it are refused.
    pub max_peers: usize,
    /// How far ahead (in rounds) a verifier follows a chain after losses.
    pub max_skip_rounds: u32,
    /// How long something sent to a connected peer (an S1 awaiting its A1, a control
    /// message awaiting its answer) may go unanswered before the pair is declared dead: its
    /// associations are dropped ([`crate::EndpointEvent::Disconnected`]) and a new
    /// handshake starts by itself, with a new pair id and new chains.
    pub dead_after: Duration,
    /// How long such a reconnection keeps trying (a new attempt every few seconds, each
    /// resending its handshake packet at least once a second) before it gives up with
    /// [`crate::EndpointEvent::ConnectFailed`].
    pub reconnect_for: Duration,
}

impl EndpointConfig {
    /// Defaults: 1024 rounds per chain, checkpoint storage, no delivery reports, a window
    /// of [`DEFAULT_WINDOW`] rounds.
    pub fn new(identity: Identity) -> Self {
        EndpointConfig {
            identity,
            trust: Vec::new(),
            chain_rounds: 1024,
            storage: ChainStorage::default(),
            delivery_reports: false,
            window: DEFAULT_WINDOW,
            max_queue: 4096,
            retransmit: Duration::from_millis(200),
            max_retries: 8,
            max_rounds: 16,
            max_peers: 1024,
            max_skip_rounds: 64,
            dead_after: Duration::from_secs(3),
            reconnect_for: Duration::from_secs(600),
        }
    }
}

/// A relay's settings.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// Next hop for an endpoint address; endpoints not listed are sent to directly.
    pub routes: Vec<(SocketAddr, SocketAddr)>,
    /// Endpoints whose handshakes the relay accepts (both sides must be listed); empty
    /// accepts any correctly signed handshake (and then anybody with two keys of their own
    /// can take up the relay's pair table).
    pub trust: Vec<PublicKey>,
    /// Most pairs tracked at once (oldest evicted first).
    pub max_pairs: usize,
    /// Rounds remembered per association.
    pub max_rounds: usize,
    /// How far ahead (in rounds) the relay follows a chain after losses.
    pub max_skip_rounds: u32,
    /// A pair with no verified packet for this long is forgotten (its endpoints died or
    /// moved to a new pair after a restart); endpoints that come back to it notice the
    /// silence and handshake again.
    pub pair_idle: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig::new()
    }
}

impl RelayConfig {
    /// Defaults: no routes, trust any signed handshake, 4096 pairs, 16 rounds per flow.
    pub fn new() -> Self {
        RelayConfig {
            routes: Vec::new(),
            trust: Vec::new(),
            max_pairs: 4096,
            max_rounds: 16,
            max_skip_rounds: 64,
            pair_idle: Duration::from_secs(120),
        }
    }

    /// The next hop toward `endpoint`.
    pub fn next_hop(&self, endpoint: SocketAddr) -> SocketAddr {
        self.routes
            .iter()
            .find(|(dest, _)| *dest == endpoint)
            .map_or(endpoint, |(_, via)| *via)
    }
}

/// Whether `key` passes a trust list (an empty list trusts every key).
pub(crate) fn trusted(trust: &[PublicKey], key: &[u8; 32]) -> bool {
    trust.is_empty() || trust.iter().any(|k| k.as_bytes() == key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for s in ["none", "n", "c:16", "m:32", "m:1024"] {
            assert_eq!(s.parse::<Mode>().unwrap().to_string(), s);
        }
        assert_eq!("m".parse::<Mode>().unwrap(), Mode::M { batch: 32 });
        for bad in ["x", "c:0", "c:65", "m:1025", "n:3", "m:x"] {
            assert!(bad.parse::<Mode>().is_err(), "{bad}");
        }
    }
}
