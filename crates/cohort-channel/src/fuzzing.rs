//! Harnesses shared by the fuzz targets (`fuzz/`) and the property tests
//! (`tests/fuzz_harness.rs`): one function per parser or state machine, taking arbitrary
//! bytes. None may panic on any input except through its own assertions, which are the
//! properties the fuzzer checks (a failed one is a finding); each returns what the tests
//! assert on.
//!
//! The connection harnesses use fixed clients and servers per authentication mode
//! (X25519 only, so a handshake costs about 100 µs), a fixed client nonce, a fixed server
//! nonce and a client key pair that is never renewed, so every client of one mode (except
//! in password mode, whose SPAKE2 message is random) sends the same ClientHello and the
//! recorded [`valid_handshake_flights`] stay valid for the whole process. That lets the
//! tests mutate real messages and reach the deep states, not only the first length check.
//!
//! Their first input byte is a [`Control`] byte: the authentication mode, how far a real
//! peer takes the handshake before the fuzzed bytes, and the chunk size the bytes are fed in.

use crate::batch::{BatchConfig, BatchProof, BatchProofError, BatchSigner};
use crate::identity::{Identity, PublicKey};
use crate::messages::{
    peek_frame, ClientFinished, ClientHello, FrameType, MessageError, ServerHello, FRAME_HEADER_LEN,
};
use crate::record::{RecordError, RecordReceiver, RecordSender};
use crate::suite::ALL_AUTH_MODES;
use crate::{
    AuthMode, ChannelError, Client, ClientAuth, ClientConfig, Connection, Event, KemSuite, Server,
    ServerConfig, SessionId,
};
use cohort_core::wire::{Reader, Writer};
use cohort_core::Timestamp;
use cohort_crypto::{CryptoProvider, Secret};
use cohort_gears::{GearId, GearKind, GearSet};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// The time every harness runs at (nothing in them expires).
const NOW: Timestamp = Timestamp::from_millis(1_000);
const SERVER_NAME: &str = "fuzz";
const CLIENT_NONCE_SEED: u64 = 0xc0_4e_57;
const SERVER_NONCE: [u8; 32] = [0x53; 32];
const PSK: [u8; 32] = [0x11; 32];
const PASSWORD: &[u8] = b"correct horse battery staple";
const IDENTITY_SEED: [u8; 32] = [0x42; 32];
const RECORD_SECRET: [u8; 32] = [0x5a; 32];
/// What the real peers send each other after the handshake at depth 3.
const CLIENT_MESSAGE: &[u8] = b"ping from the client";
const SERVER_MESSAGE: &[u8] = b"pong from the server";

/// The record gears of the connection harnesses: two AEADs and a MAC.
pub const CHANNEL_GEARS: [GearId; 3] = [
    GearId::Aes128Gcm,
    GearId::ChaCha20Poly1305,
    GearId::HmacSha256_128,
];

/// The gears of [`record_open`]'s receiver (floor 0): AEADs and full-length MACs. Partial
/// MACs are left out on purpose (they may accept a changed body word by design).
pub const RECORD_GEARS: [GearId; 4] = [
    GearId::Aes128Gcm,
    GearId::ChaCha20Poly1305,
    GearId::HmacSha256_128,
    GearId::Umac64,
];

/// Unwraps harness set-up that cannot fail with the default provider; a failure is a bug
/// the fuzzer should report loudly.
#[allow(clippy::expect_used)] // reason: see above; this is test tooling
fn must<T, E: std::fmt::Debug>(r: Result<T, E>, what: &str) -> T {
    r.expect(what)
}

fn provider() -> CryptoProvider {
    CryptoProvider::default_provider()
}

/// A tiny deterministic RNG (SplitMix64) for client nonces: the fuzz harnesses must not
/// depend on the operating system's randomness where they can avoid it.
#[derive(Clone, Debug)]
pub struct FixedRng(u64);

impl FixedRng {
    /// An RNG whose stream is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        FixedRng(seed)
    }
}

impl rand_core::RngCore for FixedRng {
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

// ---- fixtures ---------------------------------------------------------------------------

/// One authentication mode's client, server, batch signer and recorded handshake.
struct Fixture {
    client: Client,
    server: Server,
    signer: Option<Mutex<BatchSigner>>,
    flights: HandshakeFlights,
}

/// A complete handshake between the fixed client and server of one mode, recorded once
/// per process. Frames include their 3-byte headers.
#[derive(Clone, Debug)]
pub struct HandshakeFlights {
    /// The mode.
    pub mode: AuthMode,
    /// The ClientHello frame. Every client of the mode sends exactly this one, except in
    /// password mode (its SPAKE2 message is fresh per connection).
    pub client_hello: Vec<u8>,
    /// The server's flight: the ServerHello frame, then in signature mode the ServerAuth
    /// frame.
    pub server_flight: Vec<u8>,
    /// Bytes of the ServerHello frame at the front of `server_flight`.
    pub server_hello_len: usize,
    /// The ClientFinished frame.
    pub client_finished: Vec<u8>,
    /// The session ID both ends agreed on.
    pub session_id: SessionId,
}

impl HandshakeFlights {
    /// The ServerHello frame.
    pub fn server_hello(&self) -> &[u8] {
        &self.server_flight[..self.server_hello_len]
    }

    /// The ServerAuth frame (signature mode), else empty.
    pub fn server_auth(&self) -> &[u8] {
        &self.server_flight[self.server_hello_len..]
    }
}

fn identity() -> Identity {
    must(
        Identity::from_secret(&provider(), Secret::from_slice(&IDENTITY_SEED)),
        "fuzzing identity",
    )
}

/// The client's authentication and a server configuration that accepts `mode` alone, each
/// end with its own credentials: the server signs with `server_key` and the client pins
/// `pinned` (signature mode), and each end holds `psk` and `password` (PSK and password
/// modes). Equal credentials give a matching pair; different ones give a man in the middle.
/// Everything else is the configurations' defaults. Shared by these harnesses and
/// `tests/handshake.rs`.
pub fn auth_configs(
    mode: AuthMode,
    server_key: PublicKey,
    pinned: PublicKey,
    psk: &[u8],
    password: &[u8],
) -> (ClientAuth, ServerConfig) {
    let mut sc = ServerConfig::new();
    sc.auth_modes = vec![mode];
    let auth = match mode {
        AuthMode::None => ClientAuth::None,
        AuthMode::ServerSignature => {
            sc.identity = Some(server_key);
            ClientAuth::ServerSignature { pinned }
        }
        AuthMode::Psk => {
            sc.psk = Some(Secret::from_slice(psk));
            ClientAuth::Psk(Secret::from_slice(psk))
        }
        AuthMode::Password => {
            sc.password = Some(Secret::from_slice(password));
            ClientAuth::Password(Secret::from_slice(password))
        }
    };
    (auth, sc)
}

fn configs(mode: AuthMode) -> (ClientConfig, ServerConfig) {
    let key = identity().public();
    let (auth, mut sc) = auth_configs(mode, key, key, &PSK, PASSWORD);
    let mut cc = ClientConfig::new(auth).with_kem(KemSuite::X25519);
    cc.gears = CHANNEL_GEARS.to_vec();
    // One key pair for the whole process, and no tickets: every ClientHello is the same.
    cc.ephemeral_lifetime = Duration::MAX;
    cc.resumption = false;
    cc.key_update_after = 3;
    // The server accepts every KEM suite (a ClientHello may name any), but no resumption:
    // its cache would make runs depend on each other.
    sc.gears = CHANNEL_GEARS.to_vec();
    sc.resumption_capacity = 0;
    sc.key_update_after = 3;
    (cc, sc)
}

impl Fixture {
    fn new(mode: AuthMode) -> Fixture {
        let (cc, sc) = configs(mode);
        let signer = (mode == AuthMode::ServerSignature).then(|| {
            Mutex::new(BatchSigner::new(
                provider(),
                identity(),
                BatchConfig::default(),
            ))
        });
        let mut fx = Fixture {
            client: Client::new(provider(), cc),
            server: Server::new(provider(), sc),
            signer,
            flights: HandshakeFlights {
                mode,
                client_hello: Vec::new(),
                server_flight: Vec::new(),
                server_hello_len: 0,
                client_finished: Vec::new(),
                session_id: SessionId([0; 32]),
            },
        };
        let mut c = fx.connect();
        let client_hello = take_output(&mut c);
        let mut s = fx.accept();
        must(s.handle_input(NOW, &client_hello), "fixture ClientHello");
        fx.service(&mut s);
        let server_flight = take_output(&mut s);
        let server_hello_len = peek_frame(&server_flight).map_or(0, |(_, len)| len);
        must(c.handle_input(NOW, &server_flight), "fixture server flight");
        let client_finished = take_output(&mut c);
        must(
            s.handle_input(NOW, &client_finished),
            "fixture ClientFinished",
        );
        fx.service(&mut s);
        assert!(
            c.is_established() && s.is_established(),
            "fixture handshake"
        );
        let session_id = c.session_id();
        assert_eq!(session_id, s.session_id(), "fixture session IDs");
        fx.flights = HandshakeFlights {
            mode,
            client_hello,
            server_flight,
            server_hello_len,
            client_finished,
            session_id: must(session_id.ok_or("none"), "fixture session ID"),
        };
        fx
    }

    /// A client connection right after connect, its ClientHello in its output.
    fn connect(&self) -> Connection {
        let mut rng = FixedRng::new(CLIENT_NONCE_SEED);
        must(self.client.connect(NOW, &mut rng, SERVER_NAME), "connect")
    }

    /// A fresh server connection with the fixed nonce.
    fn accept(&self) -> Connection {
        let mut s = self.server.accept();
        s.set_server_nonce(SERVER_NONCE);
        s
    }

    /// Runs a server's batch-signing requests; returns the other events.
    fn service(&self, conn: &mut Connection) -> Vec<Event> {
        let mut others = Vec::new();
        while let Some(ev) = conn.poll_event() {
            match (ev, &self.signer) {
                (Event::BatchSignatureNeeded(sid), Some(signer)) => {
                    let proof = self.sign(signer, sid);
                    must(conn.handle_batch_proof(&proof), "handle_batch_proof");
                }
                (ev, _) => others.push(ev),
            }
        }
        others
    }

    fn sign(&self, signer: &Mutex<BatchSigner>, sid: SessionId) -> BatchProof {
        let mut signer = signer.lock().unwrap_or_else(|e| e.into_inner());
        signer.add(NOW, sid.0);
        signer.flush();
        let mut proof = None;
        while let Some((_, p)) = signer.poll_signed() {
            proof = Some(must(p, "batch signing"));
        }
        must(proof.ok_or("no proof"), "batch proof")
    }
}

fn fixture(mode: AuthMode) -> &'static Fixture {
    static FIXTURES: OnceLock<Vec<Fixture>> = OnceLock::new();
    let all = FIXTURES.get_or_init(|| ALL_AUTH_MODES.iter().map(|&m| Fixture::new(m)).collect());
    let at = ALL_AUTH_MODES.iter().position(|&m| m == mode).unwrap_or(0);
    &all[at]
}

fn take_output(conn: &mut Connection) -> Vec<u8> {
    let mut out = Vec::new();
    conn.take_output(&mut out);
    out
}

/// The real handshake of `mode`'s fixed client and server, for tests that mutate real
/// messages.
pub fn valid_handshake_flights(mode: AuthMode) -> &'static HandshakeFlights {
    &fixture(mode).flights
}

// ---- message parsers ----------------------------------------------------------------------

/// Parses `data` as a ClientHello body. What parses re-encodes to exactly `data`.
pub fn client_hello(data: &[u8]) -> Result<ClientHello, MessageError> {
    let parsed = ClientHello::decode(data)?;
    let mut again = Vec::new();
    parsed.encode(&mut again);
    assert_eq!(
        again, data,
        "a ClientHello that does not re-encode to its bytes"
    );
    Ok(parsed)
}

/// Parses `data` as a ServerHello body. What parses re-encodes to exactly `data`, and its
/// reported core (the transcript part) is the front of `data`.
pub fn server_hello(data: &[u8]) -> Result<(ServerHello, usize), MessageError> {
    let (parsed, core_len) = ServerHello::decode(data)?;
    let mut core = Vec::new();
    parsed.encode_core(&mut core);
    assert_eq!(core.len(), core_len, "ServerHello core length");
    assert_eq!(&data[..core_len], &core[..], "ServerHello core bytes");
    let mut again = Vec::new();
    parsed.encode(&mut again);
    assert_eq!(
        again, data,
        "a ServerHello that does not re-encode to its bytes"
    );
    Ok((parsed, core_len))
}

/// Parses `data` as a ClientFinished body. What parses re-encodes to exactly `data`.
pub fn client_finished(data: &[u8]) -> Result<ClientFinished, MessageError> {
    let parsed = ClientFinished::decode(data)?;
    let mut again = Vec::new();
    parsed.encode(&mut again);
    assert_eq!(
        again, data,
        "a ClientFinished that does not re-encode to its bytes"
    );
    Ok(parsed)
}

/// What [`batch_proof`] decoded.
#[derive(Clone, Debug)]
pub struct BatchProofOutcome {
    /// The proof.
    pub proof: BatchProof,
    /// Bytes of the input it took (the rest is left to the caller).
    pub consumed: usize,
    /// Whether it verifies for signature mode's recorded session under the fixed identity.
    pub verified: bool,
}

/// Decodes a batch proof from the front of `data` (as a ServerAuth body holds one) and
/// verifies it against the recorded signature-mode session. A decoded proof takes exactly
/// the bytes it re-encodes to.
pub fn batch_proof(data: &[u8]) -> Result<BatchProofOutcome, BatchProofError> {
    let mut r = Reader::new(data);
    let proof = BatchProof::decode(&mut r)?;
    let consumed = data.len() - r.remaining();
    assert_eq!(consumed, proof.encoded_len(), "batch proof length");
    let mut again = Vec::new();
    proof.encode(&mut Writer::new(&mut again));
    assert_eq!(
        again,
        &data[..consumed],
        "a batch proof that does not re-encode"
    );
    let session = valid_handshake_flights(AuthMode::ServerSignature).session_id;
    let verified = proof.verify(&provider(), &identity().public(), &session.0);
    Ok(BatchProofOutcome {
        proof,
        consumed,
        verified,
    })
}

// ---- records ------------------------------------------------------------------------------

/// One record [`record_open`] opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenedRecord {
    /// Its type (data, close or key update).
    pub ty: FrameType,
    /// The gear it named.
    pub gear: GearId,
    /// Its plaintext.
    pub plaintext: Vec<u8>,
}

/// What [`record_open`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordOutcome {
    /// The records opened, in order.
    pub opened: Vec<OpenedRecord>,
    /// The error that stopped it (fatal on a stream), if any.
    pub error: Option<RecordError>,
    /// Bytes left over: an incomplete frame, or everything after the failed one.
    pub left: usize,
}

fn record_secret() -> Secret {
    Secret::from_slice(&RECORD_SECRET)
}

/// Splits `data` into frames and opens them, in order, with a receiver over
/// [`RECORD_GEARS`] at floor 0 and fixed keys (the first byte's low bit adds the null gear,
/// so the fuzzer can get past the tags to key updates), stopping at the first error. An
/// opened record's plaintext lies inside its frame, exactly one tag before its end.
pub fn record_open(data: &[u8]) -> RecordOutcome {
    let mut outcome = RecordOutcome {
        opened: Vec::new(),
        error: None,
        left: 0,
    };
    let Some((&choice, mut rest)) = data.split_first() else {
        return outcome;
    };
    let accept_null = choice & 1 == 1;
    let mut set: GearSet = RECORD_GEARS.into_iter().collect();
    if accept_null {
        set.insert(GearId::DangerNullForTesting);
    }
    let mut rx = must(
        RecordReceiver::new(
            provider(),
            record_secret(),
            set,
            RECORD_GEARS[0],
            0.0,
            u64::MAX,
        ),
        "record receiver",
    );
    while let Some((_, len)) = peek_frame(rest) {
        let mut frame = rest[..len].to_vec();
        rest = &rest[len..];
        let epoch = rx.epoch();
        match rx.open(&mut frame) {
            Ok((ty, gear, range)) => {
                assert!(ty.is_record(), "opened a {ty:?} frame as a record");
                assert!(set.contains(gear), "opened a record under {gear}");
                let tag = match gear.info().kind {
                    GearKind::Aead => 16,
                    _ => gear.info().tag_len,
                };
                assert_eq!(range.start, FRAME_HEADER_LEN + 1, "record body start");
                assert_eq!(range.end + tag, frame.len(), "record body end");
                let updated = u32::from(ty == FrameType::KeyUpdate);
                assert_eq!(rx.epoch(), epoch + updated, "key update epoch");
                outcome.opened.push(OpenedRecord {
                    ty,
                    gear,
                    plaintext: frame[range].to_vec(),
                });
            }
            Err(e) => {
                assert_eq!(rx.epoch(), epoch, "a refused record moved the keys");
                outcome.error = Some(e);
                break;
            }
        }
    }
    outcome.left = rest.len();
    outcome
}

/// A stream of real records under [`record_open`]'s keys: one data record per plaintext,
/// cycling through [`RECORD_GEARS`], key updates every few records, and a close at the end.
/// Feed it to [`record_open`] after a control byte of 0.
pub fn valid_records(plaintexts: &[&[u8]]) -> Vec<u8> {
    let set: GearSet = RECORD_GEARS.into_iter().collect();
    let mut tx = must(
        RecordSender::new(provider(), record_secret(), set, RECORD_GEARS[0], 3),
        "record sender",
    );
    let mut out = Vec::new();
    for (i, p) in plaintexts.iter().enumerate() {
        must(
            tx.set_gear(RECORD_GEARS[i % RECORD_GEARS.len()]),
            "set gear",
        );
        must(tx.seal(FrameType::Data, p, &mut out), "seal");
    }
    must(tx.seal(FrameType::Close, &[], &mut out), "seal close");
    out
}

// ---- connections --------------------------------------------------------------------------

/// The first byte of [`server_connection`]'s and [`client_connection`]'s input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Control {
    /// The authentication mode (bits 0 and 1: an index into `ALL_AUTH_MODES`).
    pub mode: AuthMode,
    /// How far a real peer takes the handshake before the fuzzed bytes (bits 2 and 3):
    /// 0 not at all, 1 its first flight, 2 the whole handshake, 3 the whole handshake and
    /// one data record.
    pub depth: u8,
    /// The bytes are fed in chunks of this many (bits 4 to 7: `n * n` bytes, 0 for all at
    /// once).
    pub chunk: usize,
}

impl Control {
    /// Reads a control byte.
    pub fn from_byte(b: u8) -> Control {
        let n = usize::from(b >> 4);
        Control {
            mode: ALL_AUTH_MODES[usize::from(b & 3)],
            depth: (b >> 2) & 3,
            chunk: n * n,
        }
    }

    /// The control byte for `mode`, `depth` (0 to 3) and chunks of `chunk_root^2` bytes
    /// (`chunk_root` 0 to 15; 0 for all at once).
    pub fn byte(mode: AuthMode, depth: u8, chunk_root: u8) -> u8 {
        (mode.to_u8() & 3) | ((depth & 3) << 2) | ((chunk_root & 15) << 4)
    }
}

/// What a connection harness saw.
#[derive(Clone, Debug, PartialEq)]
pub struct ConnectionOutcome {
    /// `Ok` or the first error (every later input returned the same one).
    pub result: Result<(), ChannelError>,
    /// Whether the connection was established at the end.
    pub established: bool,
    /// The session ID, once the handshake's crypto was done.
    pub session_id: Option<SessionId>,
    /// Plaintext received (including a real peer's message at depth 3).
    pub received: Vec<u8>,
}

/// A connection fed in chunks, checking after each that an error is final.
struct Driven {
    fx: &'static Fixture,
    conn: Connection,
    chunk: usize,
    /// Every byte fed, in order.
    fed: Vec<u8>,
    error: Option<ChannelError>,
    established_events: usize,
    received: Vec<u8>,
    /// Pieces fed so far.
    pieces: usize,
}

/// Feeds `bytes` through [`Connection::input_space`] and
/// [`Connection::handle_input_in_place`], in as many reads as the offered space needs.
fn feed_in_place(conn: &mut Connection, mut bytes: &[u8]) -> Result<(), ChannelError> {
    while !bytes.is_empty() {
        let space = conn.input_space(bytes.len());
        let n = space.len().min(bytes.len());
        space[..n].copy_from_slice(&bytes[..n]);
        conn.handle_input_in_place(NOW, n)?;
        bytes = &bytes[n..];
    }
    Ok(())
}

impl Driven {
    fn new(fx: &'static Fixture, conn: Connection, chunk: usize) -> Driven {
        Driven {
            fx,
            conn,
            chunk,
            fed: Vec::new(),
            error: None,
            established_events: 0,
            received: Vec::new(),
            pieces: 0,
        }
    }

    fn feed(&mut self, bytes: &[u8]) {
        let size = if self.chunk == 0 {
            bytes.len().max(1)
        } else {
            self.chunk
        };
        for piece in bytes.chunks(size) {
            self.fed.extend_from_slice(piece);
            // Every other piece goes in the way a stream driver reads: into the
            // connection's own input space (which may offer less than asked), in place.
            self.pieces += 1;
            let r = if self.pieces.is_multiple_of(2) {
                feed_in_place(&mut self.conn, piece)
            } else {
                self.conn.handle_input(NOW, piece)
            };
            match (self.error, r) {
                (Some(e), r) => assert_eq!(r, Err(e), "a failed connection took more input"),
                (None, Err(e)) => {
                    assert_eq!(self.conn.error(), Some(e), "error() after a failure");
                    self.error = Some(e);
                }
                (None, Ok(())) => assert_eq!(self.conn.error(), None, "error() after Ok"),
            }
            self.service();
        }
    }

    fn service(&mut self) {
        // Batch signing happens only while the connection is alive (a driver drops a
        // failed connection).
        if self.error.is_none() {
            for ev in self.fx.service(&mut self.conn) {
                if ev == Event::Established {
                    self.established_events += 1;
                }
            }
        } else {
            while let Some(ev) = self.conn.poll_event() {
                if ev == Event::Established {
                    self.established_events += 1;
                }
            }
        }
        let mut buf = [0u8; 4096];
        loop {
            let n = self.conn.recv(&mut buf);
            if n == 0 {
                break;
            }
            self.received.extend_from_slice(&buf[..n]);
        }
    }

    fn ok(&self) -> bool {
        self.error.is_none()
    }

    /// Checks the end state and returns the outcome.
    fn finish(mut self) -> ConnectionOutcome {
        let conn = &mut self.conn;
        assert!(self.established_events <= 1, "Established reported twice");
        if conn.is_established() {
            assert_eq!(self.established_events, 1, "established without the event");
            assert!(conn.session().is_some(), "established without a session");
        }
        if let Some(e) = self.error {
            assert!(!conn.is_established(), "established after {e:?}");
            assert!(!conn.is_handshaking(), "still handshaking after {e:?}");
            assert_eq!(conn.error(), Some(e));
            assert_eq!(conn.handle_input(NOW, &[]), Err(e));
            assert_eq!(conn.handle_input(NOW, &[0x17, 0, 0]), Err(e));
            assert!(conn.send(b"after the end").is_err(), "send after {e:?}");
            assert!(conn.datagram_keys().is_err(), "datagram keys after {e:?}");
            assert_eq!(conn.readable(), 0);
        }
        let outcome = ConnectionOutcome {
            result: self.error.map_or(Ok(()), Err),
            established: conn.is_established(),
            session_id: conn.session_id(),
            received: self.received,
        };
        // The transport ends: unclean unless the peer closed, and a failure stays itself.
        if !conn.peer_closed() {
            let eof = conn.handle_eof();
            assert!(eof.is_err(), "a clean end without the peer's close");
            if let Some(e) = self.error {
                assert_eq!(eof, Err(e), "end of stream changed the error");
            }
        }
        outcome
    }
}

fn split_control(data: &[u8]) -> (Control, &[u8]) {
    match data.split_first() {
        Some((&b, rest)) => (Control::from_byte(b), rest),
        None => (Control::from_byte(0), &[]),
    }
}

/// Feeds a fresh server connection: after the [`Control`] byte's real handshake prefix (a
/// real client's ClientHello, then its ClientFinished, then a data record), the rest of
/// `data`, in the control byte's chunks. Never panics; after an error the connection stays
/// failed with that error. Only a real client's ClientFinished establishes it.
pub fn server_connection(data: &[u8]) -> ConnectionOutcome {
    let (ctrl, fuzzed) = split_control(data);
    let fx = fixture(ctrl.mode);
    let mut s = Driven::new(fx, fx.accept(), ctrl.chunk);
    if ctrl.depth >= 1 {
        let mut c = fx.connect();
        s.feed(&take_output(&mut c));
        assert!(s.ok(), "a real ClientHello was refused: {:?}", s.error);
        if ctrl.depth >= 2 {
            must(c.handle_input(NOW, &take_output(&mut s.conn)), "client");
            s.feed(&take_output(&mut c));
            assert!(
                s.ok() && s.conn.is_established(),
                "real handshake: {:?}",
                s.error
            );
            assert_eq!(s.conn.session_id(), c.session_id(), "session IDs");
        }
        if ctrl.depth >= 3 {
            must(c.send(CLIENT_MESSAGE), "client send");
            s.feed(&take_output(&mut c));
            assert_eq!(s.received, CLIENT_MESSAGE, "real record");
        }
    }
    s.feed(fuzzed);
    if s.conn.is_established() {
        assert!(ctrl.depth >= 2, "established by bytes no real client sent");
    }
    s.finish()
}

/// Feeds a client connection right after connect: after the [`Control`] byte's real
/// handshake prefix (a real server's ServerHello, then its ServerAuth in signature mode,
/// then a data record), the rest of `data`, in the control byte's chunks. Never panics;
/// after an error the connection stays failed with that error; and it never accepts a
/// ServerHello other than the one the real server sent for its ClientHello (the one in
/// [`valid_handshake_flights`] when there is no prefix): its session ID is that server's.
pub fn client_connection(data: &[u8]) -> ConnectionOutcome {
    let (ctrl, fuzzed) = split_control(data);
    let fx = fixture(ctrl.mode);
    let mut conn = fx.connect();
    let hello = take_output(&mut conn);
    let mut c = Driven::new(fx, conn, ctrl.chunk);
    // The only ServerHello the client may accept, and the session it makes.
    let mut expected: Option<(Vec<u8>, SessionId)> = None;
    if ctrl.depth >= 1 {
        let mut s = fx.accept();
        must(s.handle_input(NOW, &hello), "real server");
        fx.service(&mut s);
        let flight = take_output(&mut s);
        let sh_len = peek_frame(&flight).map_or(0, |(_, len)| len);
        let sid = must(
            s.unverified_session_id().ok_or("none"),
            "real server session",
        );
        expected = Some((flight[..sh_len].to_vec(), sid));
        c.feed(&flight[..sh_len]);
        assert!(c.ok(), "a real ServerHello was refused: {:?}", c.error);
        if ctrl.depth >= 2 {
            c.feed(&flight[sh_len..]);
            assert!(
                c.ok() && c.conn.is_established(),
                "real handshake: {:?}",
                c.error
            );
            must(
                s.handle_input(NOW, &take_output(&mut c.conn)),
                "real server finish",
            );
            fx.service(&mut s);
        }
        if ctrl.depth >= 3 {
            must(s.send(SERVER_MESSAGE), "server send");
            c.feed(&take_output(&mut s));
            assert_eq!(c.received, SERVER_MESSAGE, "real record");
        }
    } else if hello == fx.flights.client_hello {
        expected = Some((fx.flights.server_hello().to_vec(), fx.flights.session_id));
    }
    c.feed(fuzzed);
    if let Some(sid) = c.conn.session_id() {
        let Some((server_hello, expected_sid)) = &expected else {
            panic!("the client accepted a ServerHello for a ClientHello nobody answered");
        };
        assert!(
            c.fed.starts_with(server_hello),
            "the client accepted a changed ServerHello"
        );
        assert_eq!(sid, *expected_sid, "the client made another session");
    }
    c.finish()
}

/// What [`tampered_handshake`] did.
#[derive(Clone, Debug, PartialEq)]
pub struct TamperOutcome {
    /// The mode.
    pub mode: AuthMode,
    /// Whether the changed handshake was a resumption (the client held a ticket).
    pub resuming: bool,
    /// The flight changed: 0 ClientHello, 1 server flight, 2 ClientFinished, 3 the
    /// client's data record, 4 the server's (the last two only after a clean handshake).
    pub flight: usize,
    /// Whether the flight's bytes actually changed.
    pub changed: bool,
    /// Whether the change only appended bytes (the real frames came through whole).
    pub appended_only: bool,
    /// Whether the client's session says it resumed.
    pub resumed: bool,
    /// The client's end.
    pub client: ConnectionOutcome,
    /// The server's end.
    pub server: ConnectionOutcome,
}

/// Runs a handshake between `client` and `server` and, if it finished, one data record
/// each way, passing each flight through `tamper` (flight index, bytes). Also returns
/// whether the handshake finished on both ends.
fn run_handshake(
    fx: &'static Fixture,
    client: &Client,
    server: &Server,
    tamper: &mut dyn FnMut(usize, Vec<u8>) -> Vec<u8>,
) -> (Driven, Driven, bool) {
    let mut rng = FixedRng::new(CLIENT_NONCE_SEED);
    let conn = must(client.connect(NOW, &mut rng, SERVER_NAME), "connect");
    let mut c = Driven::new(fx, conn, 0);
    let mut conn = server.accept();
    conn.set_server_nonce(SERVER_NONCE);
    let mut s = Driven::new(fx, conn, 0);
    let hello = tamper(0, take_output(&mut c.conn));
    s.feed(&hello);
    let flight = tamper(1, take_output(&mut s.conn));
    c.feed(&flight);
    let finished = tamper(2, take_output(&mut c.conn));
    s.feed(&finished);
    let finished = c.conn.is_established() && s.conn.is_established();
    if finished {
        must(c.conn.send(CLIENT_MESSAGE), "client send");
        let record = tamper(3, take_output(&mut c.conn));
        s.feed(&record);
        // A server that refused the changed client record sends nothing more.
        if s.ok() {
            must(s.conn.send(SERVER_MESSAGE), "server send");
            let record = tamper(4, take_output(&mut s.conn));
            c.feed(&record);
        }
    }
    (c, s, finished)
}

/// Runs a real handshake in the mode `data[0]` picks (as [`Control`]; with bit 2 set, a
/// fresh client and server first finish a clean handshake, so the changed one is a
/// resumption), then one data record each way, changing one flight as `data[1..]`
/// describes: `data[1]` the flight (mod 5), `data[2..4]` a position, `data[4]` the change
/// (mod 5: XOR a byte with `data[5]`, or 1 if that is 0; truncate; insert `data[5]`;
/// replace the tail with `data[6..]`; none, for a control run). `None` if `data` is
/// shorter than 6 bytes.
///
/// The two ends never both finish a handshake whose bytes were changed (other than by
/// appending), a changed record never delivers data, and an unchanged run finishes (as a
/// resumption when the client held a ticket).
pub fn tampered_handshake(data: &[u8]) -> Option<TamperOutcome> {
    let [ctrl, which, hi, lo, op, value, ref tail @ ..] = *data else {
        return None;
    };
    let resuming = ctrl & 0x04 != 0;
    let ctrl = Control::from_byte(ctrl);
    let which = usize::from(which) % 5;
    let pos = usize::from(u16::from_be_bytes([hi, lo]));
    let fx = fixture(ctrl.mode);
    let mut changed = false;
    let mut appended_only = true;
    let mut tamper = |index: usize, flight: Vec<u8>| -> Vec<u8> {
        if index != which {
            return flight;
        }
        let mut out = flight.clone();
        let len = out.len();
        match op % 5 {
            0 if len > 0 => out[pos % len] ^= value.max(1),
            1 => out.truncate(pos % (len + 1)),
            2 => out.insert(pos % (len + 1), value),
            3 => {
                out.truncate(pos % (len + 1));
                out.extend_from_slice(tail);
            }
            _ => {}
        }
        changed = out != flight;
        appended_only = out.starts_with(&flight);
        out
    };
    let (c, s, handshake_finished) = if resuming {
        // A fresh pair that caches sessions, and one clean handshake to fill the caches.
        let (mut cc, mut sc) = configs(ctrl.mode);
        cc.resumption = true;
        sc.resumption_capacity = 4;
        let client = Client::new(provider(), cc);
        let server = Server::new(provider(), sc);
        let (c0, s0, finished) = run_handshake(fx, &client, &server, &mut |_, f| f);
        assert!(
            finished,
            "{}: a clean first handshake failed: {:?} {:?}",
            ctrl.mode, c0.error, s0.error
        );
        assert!(
            client.has_ticket(SERVER_NAME),
            "no ticket after a clean handshake"
        );
        run_handshake(fx, &client, &server, &mut tamper)
    } else {
        run_handshake(fx, &fx.client, &fx.server, &mut tamper)
    };
    let real_change = changed && !appended_only;
    let both = c.conn.is_established() && s.conn.is_established();
    if real_change && which <= 2 {
        assert!(
            !both,
            "{}: flight {which} changed, yet both ends finished",
            ctrl.mode
        );
    }
    if !changed || which >= 3 {
        assert!(
            handshake_finished,
            "{}: an unchanged handshake failed: {:?} {:?}",
            ctrl.mode, c.error, s.error
        );
    }
    if which == 3 {
        assert!(
            s.received.is_empty() || (s.received == CLIENT_MESSAGE && appended_only),
            "{}: a changed client record delivered {:?}",
            ctrl.mode,
            s.received
        );
    }
    if which == 4 {
        assert!(
            c.received.is_empty() || (c.received == SERVER_MESSAGE && appended_only),
            "{}: a changed server record delivered {:?}",
            ctrl.mode,
            c.received
        );
    }
    let resumed = c.conn.session().is_some_and(|i| i.auth.resumed);
    if !changed {
        assert_eq!(resumed, resuming, "{}: resumption", ctrl.mode);
        assert_eq!(c.received, SERVER_MESSAGE, "{}: server record", ctrl.mode);
        assert_eq!(s.received, CLIENT_MESSAGE, "{}: client record", ctrl.mode);
    }
    Some(TamperOutcome {
        mode: ctrl.mode,
        resuming,
        flight: which,
        changed,
        appended_only,
        resumed,
        client: c.finish(),
        server: s.finish(),
    })
}
