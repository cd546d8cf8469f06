//! One connection, client or server: the handshake, then records. Sans-IO: bytes from the
//! transport go in with [`Connection::handle_input`], bytes for the transport come out of
//! [`Connection::output`]; plaintext goes in with [`Connection::send`] and comes out with
//! [`Connection::recv`]. Time and the nonce's randomness are passed in.
//!
//! ```text
//!  client                                         server
//!  ClientHello  (offers, nonce, key share,  ───►  choose suites; encapsulate (cheap);
//!                [resume id], [SPAKE2 msg])       derive keys
//!               ◄───  ServerHello (choices, nonce, ciphertext, finished, [auth tag])
//!  decapsulate (expensive); derive keys;
//!  check finished and auth tag
//!  ClientFinished (finished, [auth tag])    ───►  check; cache the next-session key
//!               ◄───  ServerAuth (batch signature + Merkle path)   [signature mode]
//!  records  ◄──────────────────────────────────►  records
//! ```

use crate::batch::BatchProof;
use crate::cache::{ClientInner, ServerInner, Ticket};
use crate::config::ClientAuth;
use crate::messages::{
    decode_alert, peek_frame, write_frame, AlertCode, ClientFinished, ClientHello, FrameType,
    MessageError, ServerHello, MAX_OFFERS,
};
use crate::pake::{self, PakeState};
use crate::record::{RecordReceiver, RecordSender, MAX_RECORD_PLAINTEXT};
use crate::schedule::{
    auth_tag, derive_session, derive_tickets, transcript_hash, SessionId, SessionKeys,
};
use crate::suite::{AuthMode, KemSuite};
use cohort_core::wire::{Reader, Writer};
use cohort_core::Timestamp;
use cohort_crypto::{ct_eq, CryptoProvider, Secret};
use cohort_gears::controller::{Controller, ControllerConfig, Observation, Shift};
use cohort_gears::{GearId, GearKeys, GearSet};
use std::collections::VecDeque;
use std::sync::Arc;

pub use crate::outcome::{AuthResult, ChannelError};

/// The first space [`Connection::input_space`] offers (see there).
const FIRST_INPUT_SPACE: usize = 4 * 1024;
const CLIENT_ROLE: &[u8] = b"client";
const SERVER_ROLE: &[u8] = b"server";

/// What was agreed, available once the handshake is done.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionInfo {
    /// The public session ID.
    pub session_id: SessionId,
    /// The KEM used (`None` when resumed: no public-key operation took place).
    pub kem: Option<KemSuite>,
    /// The record gears allowed, in the server's preference order.
    pub gears: Vec<GearId>,
    /// The authentication result.
    pub auth: AuthResult,
}

/// Something the driver must act on.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// The handshake is done; [`Connection::session`] has the details.
    Established,
    /// Server, signature mode: pass this session ID to the batch signer and the proof
    /// back to [`Connection::handle_batch_proof`].
    BatchSignatureNeeded(SessionId),
    /// The peer closed cleanly; no more data will arrive.
    PeerClosed,
}

/// Which side, and its long-lived half.
enum Side {
    Client {
        client: Arc<ClientInner>,
        server_name: String,
    },
    Server {
        server: Arc<ServerInner>,
    },
}

/// Handshake progress.
enum State {
    ClientAwaitHello(Box<ClientPending>),
    ClientAwaitAuth(Box<Established>),
    ServerAwaitHello,
    ServerAwaitFinished(Box<ServerPending>),
    Open,
    Failed(ChannelError),
}

struct ClientPending {
    hello_body: Vec<u8>,
    /// Tickets the ClientHello asked for; the server may issue fewer, never more.
    tickets_asked: u8,
    share_suite: KemSuite,
    share_secret: Arc<Secret>,
    ticket: Option<Ticket>,
    pake: Option<PakeState>,
}

struct ServerPending {
    keys: Option<SessionKeys>,
    auth: AuthResult,
    /// PSK or PAKE key, to check the client's tag.
    auth_secret: Option<Secret>,
    gears: Vec<GearId>,
    /// Resumption tickets the ServerHello issued.
    tickets: u8,
}

/// Keys and details for a handshake that has finished its crypto.
struct Established {
    info: SessionInfo,
    keys: SessionKeys,
    /// Resumption tickets the session yields.
    tickets: u8,
}

/// One secure channel connection (client or server side).
pub struct Connection {
    provider: CryptoProvider,
    side: Side,
    state: State,
    now: Timestamp,
    /// Transport bytes: `in_start..in_end` are received and not yet processed; the rest is
    /// space for the next read (zeroed once, reused). Records are opened in place, and their
    /// plaintext stays here (in `plain`'s ranges, all before `in_start`) until read.
    inbuf: Vec<u8>,
    in_start: usize,
    in_end: usize,
    /// Most bytes [`input_space`](Connection::input_space) offers now: it starts at
    /// [`FIRST_INPUT_SPACE`] and doubles each time a read fills the space, so a connection
    /// that carries little never zeroes (and faults in) a driver's full read size.
    in_space: usize,
    /// The space offered by the last `input_space` call (0 after a copying `handle_input`).
    in_offered: usize,
    /// Output not yet written starts at `out_start`.
    out_start: usize,
    outbuf: Vec<u8>,
    /// Ranges of `inbuf` holding received plaintext not yet read, oldest first.
    plain: VecDeque<std::ops::Range<usize>>,
    /// Bytes in `plain`'s ranges.
    plain_len: usize,
    events: VecDeque<Event>,
    info: Option<SessionInfo>,
    sender: Option<RecordSender>,
    receiver: Option<RecordReceiver>,
    datagram: Option<(Secret, Secret)>,
    datagram_taken: bool,
    controller: Option<Controller>,
    proof_pending: bool,
    handshake_done: bool,
    peer_closed: bool,
    local_closed: bool,
    next_server_nonce: Option<[u8; 32]>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("client", &matches!(self.side, Side::Client { .. }))
            .field("info", &self.info)
            .field("established", &self.is_established())
            .finish_non_exhaustive()
    }
}

impl Connection {
    fn new(provider: CryptoProvider, side: Side, state: State, now: Timestamp) -> Self {
        Connection {
            provider,
            side,
            state,
            now,
            inbuf: Vec::new(),
            in_start: 0,
            in_end: 0,
            in_space: FIRST_INPUT_SPACE,
            in_offered: 0,
            out_start: 0,
            outbuf: Vec::new(),
            plain: VecDeque::new(),
            plain_len: 0,
            events: VecDeque::new(),
            info: None,
            sender: None,
            receiver: None,
            datagram: None,
            datagram_taken: false,
            controller: None,
            proof_pending: false,
            handshake_done: false,
            peer_closed: false,
            local_closed: false,
            next_server_nonce: None,
        }
    }

    pub(crate) fn client(
        client: Arc<ClientInner>,
        now: Timestamp,
        rng: &mut dyn rand_core::RngCore,
        server_name: &str,
    ) -> Result<Connection, ChannelError> {
        let provider = client.provider;
        let config = &client.config;
        if let ClientAuth::Psk(psk) = &config.auth {
            if psk.len() < crate::config::MIN_PSK_LEN {
                return Err(ChannelError::Config(
                    "a PSK must be at least 32 bytes of random key material",
                ));
            }
        }
        let mut nonce = [0u8; 32];
        rng.fill_bytes(&mut nonce);
        let share = client.ephemeral(now)?;
        let (share_suite, share_secret, share_public) = (share.suite, share.secret, share.public);
        let (ticket, tickets) = client.take_ticket(now, server_name);
        let (pake, pake_msg) = match &config.auth {
            ClientAuth::Password(pw) => {
                let (state, msg) = pake::start_client(pw);
                (Some(state), msg)
            }
            _ => (None, Vec::new()),
        };
        let hello = ClientHello {
            nonce,
            kems: config
                .kems
                .iter()
                .take(MAX_OFFERS)
                .map(|k| k.to_u8())
                .collect(),
            gears: config
                .gears
                .iter()
                .take(MAX_OFFERS)
                .map(|g| g.to_u8())
                .collect(),
            auths: vec![config.auth.mode().to_u8()],
            share_kem: share_suite.to_u8(),
            key_share: share_public.to_vec(),
            resume: ticket.as_ref().map(|t| t.resume_id),
            tickets,
            pake: pake_msg,
        };
        let mut hello_body = Vec::new();
        hello.encode(&mut hello_body);
        let pending = ClientPending {
            hello_body,
            tickets_asked: tickets,
            share_suite,
            share_secret,
            ticket,
            pake,
        };
        let mut conn = Connection::new(
            provider,
            Side::Client {
                client,
                server_name: server_name.to_owned(),
            },
            State::ClientAwaitHello(Box::new(pending)),
            now,
        );
        if let State::ClientAwaitHello(p) = &conn.state {
            write_frame(&mut conn.outbuf, FrameType::ClientHello, &p.hello_body)
                .ok_or(ChannelError::Crypto)?;
        }
        Ok(conn)
    }

    pub(crate) fn server(server: Arc<ServerInner>) -> Connection {
        let provider = server.provider;
        Connection::new(
            provider,
            Side::Server { server },
            State::ServerAwaitHello,
            Timestamp::ZERO,
        )
    }

    /// Supplies the server's nonce for the coming ServerHello (by default it comes from
    /// the provider's randomness). For deterministic tests and simulations.
    pub fn set_server_nonce(&mut self, nonce: [u8; 32]) {
        self.next_server_nonce = Some(nonce);
    }

    /// Whether this is the client side.
    pub fn is_client(&self) -> bool {
        matches!(self.side, Side::Client { .. })
    }

    /// Whether the handshake (including authentication) is done and data may flow.
    pub fn is_established(&self) -> bool {
        matches!(self.state, State::Open) && self.handshake_done && !self.proof_pending
    }

    /// Whether the handshake is still running (neither established nor failed).
    pub fn is_handshaking(&self) -> bool {
        !matches!(self.state, State::Open | State::Failed(_))
            || (matches!(self.state, State::Open) && self.proof_pending)
    }

    /// Whether a handshake frame of type `ty` is what this connection expects next (an
    /// alert always is). Over datagrams, a frame that arrives early (a ServerAuth before
    /// its ServerHello) is dropped and waits for the peer's retransmission instead of
    /// failing the handshake.
    pub fn expects_frame(&self, ty: u8) -> bool {
        let expected = match self.state {
            State::ClientAwaitHello(_) => FrameType::ServerHello,
            State::ClientAwaitAuth(_) => FrameType::ServerAuth,
            State::ServerAwaitHello => FrameType::ClientHello,
            State::ServerAwaitFinished(_) => FrameType::ClientFinished,
            State::Open | State::Failed(_) => return false,
        };
        ty == expected as u8 || ty == FrameType::Alert as u8
    }

    /// The error that ended this connection, if any.
    pub fn error(&self) -> Option<ChannelError> {
        match self.state {
            State::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// Details of the session, once established (before that, nothing in them would be
    /// verified yet).
    pub fn session(&self) -> Option<&SessionInfo> {
        self.info.as_ref().filter(|_| self.is_established())
    }

    /// The session ID, once established.
    pub fn session_id(&self) -> Option<SessionId> {
        self.session().map(|i| i.session_id)
    }

    /// The session ID as soon as the keys are derived, before anything is verified: for
    /// the crate's own test harnesses only.
    #[cfg(feature = "fuzzing")]
    pub(crate) fn unverified_session_id(&self) -> Option<SessionId> {
        self.info.as_ref().map(|i| i.session_id)
    }

    /// The next event for the driver.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Bytes waiting to be written to the transport.
    pub fn output(&self) -> &[u8] {
        &self.outbuf[self.out_start..]
    }

    /// Marks the first `n` bytes of [`output`](Self::output) as written.
    pub fn consume_output(&mut self, n: usize) {
        self.out_start = (self.out_start + n).min(self.outbuf.len());
        if self.out_start == self.outbuf.len() {
            self.outbuf.clear();
            self.out_start = 0;
        }
    }

    /// Moves all pending output into `out`.
    pub fn take_output(&mut self, out: &mut Vec<u8>) {
        if self.out_start > 0 {
            self.outbuf.drain(..self.out_start);
            self.out_start = 0;
        }
        if out.is_empty() {
            std::mem::swap(out, &mut self.outbuf);
        } else {
            out.append(&mut self.outbuf);
        }
    }

    /// Whether the peer closed cleanly.
    pub fn peer_closed(&self) -> bool {
        self.peer_closed
    }

    /// Plaintext received and not yet read.
    pub fn readable(&self) -> usize {
        self.plain_len
    }

    /// Copies received plaintext into `buf`; returns how many bytes (0 if none is waiting).
    pub fn recv(&mut self, buf: &mut [u8]) -> usize {
        let mut n = 0;
        while n < buf.len() {
            let Some(range) = self.plain.front_mut() else {
                break;
            };
            let take = range.len().min(buf.len() - n);
            buf[n..n + take].copy_from_slice(&self.inbuf[range.start..range.start + take]);
            range.start += take;
            n += take;
            if range.start == range.end {
                self.plain.pop_front();
            }
        }
        self.plain_len -= n;
        n
    }

    /// Protects `data` into records (up to 16 KiB each) queued for output.
    pub fn send(&mut self, data: &[u8]) -> Result<(), ChannelError> {
        if !self.is_established() || self.local_closed {
            return Err(ChannelError::NotReady);
        }
        let sender = self.sender.as_mut().ok_or(ChannelError::NotReady)?;
        for chunk in data.chunks(MAX_RECORD_PLAINTEXT) {
            sender.seal(FrameType::Data, chunk, &mut self.outbuf)?;
        }
        Ok(())
    }

    /// Queues the close record: the peer can then tell a clean end from a truncation.
    pub fn close(&mut self) -> Result<(), ChannelError> {
        if self.local_closed {
            return Ok(());
        }
        let sender = self.sender.as_mut().ok_or(ChannelError::NotReady)?;
        sender.seal(FrameType::Close, &[], &mut self.outbuf)?;
        self.local_closed = true;
        Ok(())
    }

    /// The transport reached its end. Clean only if the peer's close record came first.
    pub fn handle_eof(&mut self) -> Result<(), ChannelError> {
        if let State::Failed(e) = self.state {
            return Err(e);
        }
        if self.peer_closed {
            Ok(())
        } else {
            let e = match self.state {
                // Only bytes that are not a cohort frame prove the peer does not speak
                // cohort (see `process_frames`); a server that hangs up, even mid-frame, may
                // be a cohort server in trouble, so a fallback to plaintext must not follow.
                State::Failed(e) => e,
                _ => ChannelError::Truncated,
            };
            Err(self.fail(e))
        }
    }

    /// The gear the next outgoing record uses.
    pub fn send_gear(&self) -> Option<GearId> {
        self.sender.as_ref().map(|s| s.gear())
    }

    /// Switches the outgoing gear (one of the negotiated set).
    pub fn set_send_gear(&mut self, gear: GearId) -> Result<(), ChannelError> {
        let sender = self.sender.as_mut().ok_or(ChannelError::NotReady)?;
        sender.set_gear(gear)?;
        Ok(())
    }

    /// Reports this host's load (0 to 1) to the gear controller (ACSA's IPsec case): under
    /// sustained load the sender shifts to a cheaper negotiated gear, and back when the load
    /// falls. Returns the shift, if one happened.
    pub fn observe_load(&mut self, now: Timestamp, load: f32) -> Option<Shift> {
        let controller = self.controller.as_mut()?;
        let shift = controller.observe(&Observation {
            now,
            local_load: load,
            local_auth_failures: 0,
            receiver: None,
        })?;
        if let Some(sender) = self.sender.as_mut() {
            // The controller only chooses among the negotiated gears.
            let _ = sender.set_gear(shift.to);
        }
        Some(shift)
    }

    /// Keys for datagrams inside other cohort protocols: (send, receive), over the
    /// negotiated gears, for `cohort_gears::Protector` and `Unprotector` (explicit sequence
    /// numbers and a replay window, so loss and reordering are tolerated). Derived from the
    /// session's own datagram secrets, independent of the stream keys.
    ///
    /// The keys are handed out once: two protectors from the same keys would both start at
    /// sequence number 0 and repeat nonces. A second call returns
    /// [`ChannelError::KeysTaken`].
    pub fn datagram_keys(&mut self) -> Result<(GearKeys, GearKeys), ChannelError> {
        if self.datagram_taken {
            return Err(ChannelError::KeysTaken);
        }
        let (send, recv) = self.datagram.as_ref().ok_or(ChannelError::NotReady)?;
        let info = self.session().ok_or(ChannelError::NotReady)?;
        let set: GearSet = info.gears.iter().copied().collect();
        let p = &self.provider;
        let keys =
            |s: &Secret| GearKeys::derive(p, s.expose(), set).map_err(|_| ChannelError::Crypto);
        let out = (keys(send)?, keys(recv)?);
        self.datagram_taken = true;
        Ok(out)
    }

    /// A secret both ends derive alike from this session, for another protocol keyed by it
    /// (as a TLS exporter): HKDF over both datagram secrets with `label`. Different labels
    /// give independent secrets; none reveals the channel's own keys.
    pub fn export_secret(&self, label: &[u8], len: usize) -> Result<Secret, ChannelError> {
        let (mine, theirs) = self.datagram.as_ref().ok_or(ChannelError::NotReady)?;
        let (c2s, s2c) = if self.is_client() {
            (mine, theirs)
        } else {
            (theirs, mine)
        };
        let mut ikm = Secret::zeroed(64);
        ikm.expose_mut()[..32].copy_from_slice(c2s.expose());
        ikm.expose_mut()[32..].copy_from_slice(s2c.expose());
        let mut out = Secret::zeroed(len);
        self.provider
            .hkdf_sha256
            .derive(
                b"cohort-channel/v1 exporter",
                ikm.expose(),
                &[label],
                out.expose_mut(),
            )
            .map_err(|_| ChannelError::Crypto)?;
        Ok(out)
    }

    /// Server, signature mode: the batch signer's proof for this session; queues the
    /// ServerAuth message.
    pub fn handle_batch_proof(&mut self, proof: &BatchProof) -> Result<(), ChannelError> {
        // Signing is asynchronous: the connection may have failed while it waited.
        if let State::Failed(e) = self.state {
            return Err(e);
        }
        if !self.proof_pending {
            return Err(ChannelError::NotReady);
        }
        let mut body = Vec::new();
        proof.encode(&mut Writer::new(&mut body));
        write_frame(&mut self.outbuf, FrameType::ServerAuth, &body).ok_or(ChannelError::Crypto)?;
        self.proof_pending = false;
        self.maybe_established();
        Ok(())
    }

    /// Feeds bytes read from the transport. On error the connection is dead; an alert may
    /// have been queued for the peer.
    pub fn handle_input(&mut self, now: Timestamp, data: &[u8]) -> Result<(), ChannelError> {
        if let State::Failed(e) = self.state {
            return Err(e);
        }
        self.in_offered = 0;
        self.reserve_input(data.len()).copy_from_slice(data);
        self.commit_input(now, data.len())
    }

    /// Space at the end of the input buffer for up to `len` transport bytes, so that a
    /// driver can read into it directly (one copy fewer than [`handle_input`](Self::handle_input)); then call
    /// [`handle_input_in_place`](Self::handle_input_in_place) with how many it filled.
    ///
    /// The space may be shorter than `len`: it starts at 4 KiB and doubles (up to `len`)
    /// each time a read fills it, so a connection that moves a few hundred bytes does not
    /// zero and fault in a bulk transfer's buffer, and one that moves megabytes reaches
    /// `len` after a few reads.
    pub fn input_space(&mut self, len: usize) -> &mut [u8] {
        let offer = len.min(self.in_space);
        self.in_offered = offer;
        self.reserve_input(offer)
    }

    /// Exactly `len` bytes of space after the unprocessed input, moving that input to the
    /// front of the buffer or growing the buffer if needed.
    fn reserve_input(&mut self, len: usize) -> &mut [u8] {
        // Keep the unread plaintext and the unprocessed input.
        let keep = self.plain.front().map_or(self.in_start, |r| r.start);
        if keep == self.in_end {
            self.in_start = 0;
            self.in_end = 0;
        } else if keep > 0 && self.inbuf.len() - self.in_end < len {
            self.inbuf.copy_within(keep..self.in_end, 0);
            self.in_end -= keep;
            self.in_start -= keep;
            for range in &mut self.plain {
                *range = range.start - keep..range.end - keep;
            }
        }
        if self.inbuf.len() - self.in_end < len {
            self.inbuf.resize(self.in_end + len, 0);
        }
        &mut self.inbuf[self.in_end..self.in_end + len]
    }

    /// Processes the first `filled` bytes of the space [`input_space`](Self::input_space)
    /// returned, as [`handle_input`](Self::handle_input) does.
    pub fn handle_input_in_place(
        &mut self,
        now: Timestamp,
        filled: usize,
    ) -> Result<(), ChannelError> {
        if let State::Failed(e) = self.state {
            return Err(e);
        }
        if filled >= self.in_offered && self.in_offered == self.in_space {
            // The read filled all it was offered: more is probably waiting.
            self.in_space = self.in_space.saturating_mul(2);
        }
        self.commit_input(now, filled)
    }

    fn commit_input(&mut self, now: Timestamp, filled: usize) -> Result<(), ChannelError> {
        self.now = now;
        self.in_end = (self.in_end + filled).min(self.inbuf.len());
        let result = self.process_frames();
        result.map_err(|e| self.fail(e))
    }

    fn fail(&mut self, e: ChannelError) -> ChannelError {
        if !matches!(self.state, State::Failed(_)) {
            let alert = match e {
                ChannelError::NoCommonSuite => Some(AlertCode::NoCommonSuite),
                ChannelError::Message(_) | ChannelError::UnexpectedFrame(_) => {
                    Some(AlertCode::DecodeError)
                }
                ChannelError::KeyConfirmationFailed
                | ChannelError::AuthenticationFailed
                | ChannelError::BadKeyShare => Some(AlertCode::HandshakeFailure),
                _ => None,
            };
            if let (Some(a), false) = (alert, self.handshake_done) {
                write_frame(&mut self.outbuf, FrameType::Alert, &[a.to_u8()]);
            }
            self.state = State::Failed(e);
            self.sender = None;
            self.receiver = None;
            self.datagram = None;
        }
        e
    }

    fn process_frames(&mut self) -> Result<(), ChannelError> {
        loop {
            let buf = &self.inbuf[self.in_start..self.in_end];
            if let State::ClientAwaitHello(_) | State::ServerAwaitHello = self.state {
                // A peer that does not speak cohort: its first byte is no hello or alert.
                if let Some(&b) = buf.first() {
                    let expected = if self.is_client() {
                        [FrameType::ServerHello as u8, FrameType::Alert as u8]
                    } else {
                        [FrameType::ClientHello as u8, FrameType::ClientHello as u8]
                    };
                    if !expected.contains(&b) {
                        return Err(ChannelError::NotCohort);
                    }
                }
            }
            let Some((ty, len)) = peek_frame(buf) else {
                return Ok(());
            };
            let start = self.in_start;
            self.in_start += len;
            if self.peer_closed {
                return Err(ChannelError::UnexpectedFrame(ty));
            }
            let frame_type = FrameType::from_u8(ty).ok_or(ChannelError::UnexpectedFrame(ty))?;
            if frame_type.is_record() {
                self.handle_record(start, len)?;
                continue;
            }
            let body = self.inbuf[start + 3..start + len].to_vec();
            match frame_type {
                FrameType::Alert => {
                    return Err(ChannelError::PeerAlert(decode_alert(&body)?));
                }
                FrameType::ClientHello if matches!(self.state, State::ServerAwaitHello) => {
                    self.server_on_hello(&body)?;
                }
                FrameType::ServerHello if matches!(self.state, State::ClientAwaitHello(_)) => {
                    self.client_on_hello(&body)?;
                }
                FrameType::ClientFinished
                    if matches!(self.state, State::ServerAwaitFinished(_)) =>
                {
                    self.server_on_finished(&body)?;
                }
                FrameType::ServerAuth if matches!(self.state, State::ClientAwaitAuth(_)) => {
                    self.client_on_auth(&body)?;
                }
                _ => return Err(ChannelError::UnexpectedFrame(ty)),
            }
        }
    }

    fn handle_record(&mut self, start: usize, len: usize) -> Result<(), ChannelError> {
        if !matches!(self.state, State::Open) {
            return Err(ChannelError::UnexpectedFrame(self.inbuf[start]));
        }
        let receiver = self.receiver.as_mut().ok_or(ChannelError::NotReady)?;
        let frame = &mut self.inbuf[start..start + len];
        let (ty, _gear, range) = receiver.open(frame)?;
        match ty {
            FrameType::Data if !range.is_empty() => {
                // Read in place by `recv`, with no copy here.
                self.plain_len += range.len();
                self.plain.push_back(start + range.start..start + range.end);
            }
            FrameType::Close => {
                self.peer_closed = true;
                self.events.push_back(Event::PeerClosed);
            }
            // KeyUpdate (the receiver already moved to the next keys), or empty data.
            _ => {}
        }
        Ok(())
    }

    /// The client half and the server's name (owned: the handlers also borrow `self`).
    fn client_side(&self) -> Result<(Arc<ClientInner>, String), ChannelError> {
        match &self.side {
            Side::Client {
                client,
                server_name,
            } => Ok((client.clone(), server_name.clone())),
            Side::Server { .. } => Err(ChannelError::NotReady),
        }
    }

    /// The server half.
    fn server_side(&self) -> Result<Arc<ServerInner>, ChannelError> {
        match &self.side {
            Side::Server { server } => Ok(server.clone()),
            Side::Client { .. } => Err(ChannelError::NotReady),
        }
    }

    // ---- client ---------------------------------------------------------------------

    fn client_on_hello(&mut self, body: &[u8]) -> Result<(), ChannelError> {
        let State::ClientAwaitHello(pending) = std::mem::replace(&mut self.state, State::Open)
        else {
            return Err(ChannelError::NotReady);
        };
        let (client, server_name) = self.client_side()?;
        let config = &client.config;
        let p = self.provider;
        let (sh, core_len) = ServerHello::decode(body)?;

        // Everything the server chose must have been offered.
        let mode = AuthMode::from_u8(sh.auth)
            .filter(|m| *m == config.auth.mode())
            .ok_or(ChannelError::BadChoice("authentication mode"))?;
        let mut gears = Vec::new();
        for &g in &sh.gears {
            let gear = GearId::from_u8(g)
                .filter(|g| config.gears.contains(g) && g.info().forgery_bits >= config.floor_bits)
                .ok_or(ChannelError::BadChoice("gear"))?;
            if gears.contains(&gear) {
                return Err(ChannelError::BadChoice("gear"));
            }
            gears.push(gear);
        }
        if gears.is_empty() {
            return Err(ChannelError::BadChoice("gear"));
        }
        if sh.tickets > pending.tickets_asked {
            return Err(ChannelError::BadChoice("tickets"));
        }
        let (shared, kem, ticket_auth) = if sh.resumed {
            let ticket = pending
                .ticket
                .ok_or(ChannelError::BadChoice("resumption"))?;
            if sh.kem != 0
                || !sh.ciphertext.is_empty()
                || !sh.pake.is_empty()
                || !sh.auth_tag.is_empty()
            {
                return Err(ChannelError::BadChoice("resumption"));
            }
            (ticket.next, None, Some(ticket.auth))
        } else {
            if sh.kem != pending.share_suite.to_u8() {
                return Err(ChannelError::BadChoice("KEM"));
            }
            let kem = p
                .kem(pending.share_suite.algorithm())
                .ok_or(ChannelError::NoCommonSuite)?;
            // The expensive step, on the client (tcpcrypt slide 9).
            let shared = kem
                .decapsulate(&pending.share_secret, &sh.ciphertext)
                .map_err(|_| ChannelError::BadKeyShare)?;
            (shared, Some(pending.share_suite), None)
        };
        let transcript = transcript_hash(&p, &pending.hello_body, &body[..core_len]);
        let keys = derive_session(&p, &shared, &transcript).map_err(|_| ChannelError::Crypto)?;
        drop(shared);
        if !ct_eq(&keys.server_finished, &sh.finished) {
            return Err(ChannelError::KeyConfirmationFailed);
        }

        // Authentication of the session ID (full handshakes; resumption inherits).
        let auth_secret = match (&config.auth, sh.resumed) {
            (_, true) => None,
            (ClientAuth::Psk(psk), false) => Some(Secret::from_slice(psk.expose())),
            (ClientAuth::Password(_), false) => {
                let state = pending.pake.ok_or(ChannelError::AuthenticationFailed)?;
                Some(
                    state
                        .finish(&sh.pake)
                        .ok_or(ChannelError::AuthenticationFailed)?,
                )
            }
            _ => None,
        };
        if let Some(secret) = &auth_secret {
            let tag = auth_tag(&p, secret.expose(), SERVER_ROLE, &keys.session_id)
                .map_err(|_| ChannelError::Crypto)?;
            if !ct_eq(&tag, &sh.auth_tag) {
                return Err(ChannelError::AuthenticationFailed);
            }
        } else if !sh.resumed && !sh.auth_tag.is_empty() {
            return Err(ChannelError::BadChoice("authentication tag"));
        }
        let finished = ClientFinished {
            finished: keys.client_finished,
            auth_tag: match &auth_secret {
                Some(s) => auth_tag(&p, s.expose(), CLIENT_ROLE, &keys.session_id)
                    .map_err(|_| ChannelError::Crypto)?
                    .to_vec(),
                None => Vec::new(),
            },
        };
        let mut cf = Vec::new();
        finished.encode(&mut cf);
        write_frame(&mut self.outbuf, FrameType::ClientFinished, &cf)
            .ok_or(ChannelError::Crypto)?;

        let auth = match ticket_auth {
            Some(a) => AuthResult { resumed: true, ..a },
            None => AuthResult {
                mode,
                server_key: match &config.auth {
                    ClientAuth::ServerSignature { pinned } => Some(*pinned),
                    _ => None,
                },
                resumed: false,
            },
        };
        let info = SessionInfo {
            session_id: keys.session_id,
            kem,
            gears,
            auth,
        };
        let est = Established {
            info,
            keys,
            tickets: sh.tickets,
        };
        if mode == AuthMode::ServerSignature && !sh.resumed {
            self.info = Some(est.info.clone());
            self.state = State::ClientAwaitAuth(Box::new(est));
            return Ok(());
        }
        self.client_open(est, &client, &server_name)
    }

    fn client_on_auth(&mut self, body: &[u8]) -> Result<(), ChannelError> {
        let State::ClientAwaitAuth(est) = std::mem::replace(&mut self.state, State::Open) else {
            return Err(ChannelError::NotReady);
        };
        let (client, server_name) = self.client_side()?;
        let ClientAuth::ServerSignature { pinned } = &client.config.auth else {
            return Err(ChannelError::UnexpectedFrame(FrameType::ServerAuth as u8));
        };
        let mut r = Reader::new(body);
        let proof = BatchProof::decode(&mut r)
            .map_err(|_| ChannelError::Message(MessageError::Truncated))?;
        if !r.is_empty() {
            return Err(ChannelError::Message(MessageError::TrailingBytes));
        }
        if !proof.verify(&self.provider, pinned, &est.keys.session_id.0) {
            return Err(ChannelError::AuthenticationFailed);
        }
        self.client_open(*est, &client, &server_name)
    }

    fn client_open(
        &mut self,
        est: Established,
        client: &ClientInner,
        server_name: &str,
    ) -> Result<(), ChannelError> {
        let config = &client.config;
        let Established {
            info,
            keys,
            tickets,
        } = est;
        self.open_records(
            &info.gears,
            keys.c2s_stream,
            keys.s2c_stream,
            config.floor_bits,
            config.key_update_after,
        )?;
        self.datagram = Some((keys.c2s_datagram, keys.s2c_datagram));
        let tickets = derive_tickets(&self.provider, &keys.next_session, tickets)
            .map_err(|_| ChannelError::Crypto)?;
        client.store_tickets(self.now, server_name, tickets, info.auth);
        self.info = Some(info);
        self.state = State::Open;
        self.handshake_done = true;
        self.events.push_back(Event::Established);
        Ok(())
    }

    // ---- server ---------------------------------------------------------------------

    fn server_on_hello(&mut self, body: &[u8]) -> Result<(), ChannelError> {
        let server = self.server_side()?;
        let config = &server.config;
        let p = self.provider;
        let ch = ClientHello::decode(body)?;

        let mode = ch
            .auths
            .iter()
            .filter_map(|&a| AuthMode::from_u8(a))
            .find(|&m| config.supports(m))
            .ok_or(ChannelError::NoCommonSuite)?;
        let gears: Vec<GearId> = config
            .gears
            .iter()
            .copied()
            .filter(|g| ch.gears.contains(&g.to_u8()) && g.info().forgery_bits >= config.floor_bits)
            .collect();
        if gears.is_empty() {
            return Err(ChannelError::NoCommonSuite);
        }
        let cached = ch
            .resume
            .and_then(|id| server.take_session(self.now, &id, mode));

        let nonce = self
            .next_server_nonce
            .take()
            .unwrap_or_else(|| server.nonce());
        let (shared, kem, ciphertext, resumed_auth) = match cached {
            Some(session) => (session.next, None, Vec::new(), Some(session.auth)),
            None => {
                let suite = KemSuite::from_u8(ch.share_kem)
                    .filter(|s| config.kems.contains(s) && ch.kems.contains(&s.to_u8()))
                    .ok_or(ChannelError::NoCommonSuite)?;
                let kem = p
                    .kem(suite.algorithm())
                    .ok_or(ChannelError::NoCommonSuite)?;
                // The cheap step, on the server.
                let (ciphertext, shared) = kem
                    .encapsulate(&ch.key_share)
                    .map_err(|_| ChannelError::BadKeyShare)?;
                (shared, Some(suite), ciphertext, None)
            }
        };
        let resumed = resumed_auth.is_some();
        let tickets = server.tickets_to_issue(ch.tickets);
        let (pake_msg, auth_secret) = match (mode, resumed) {
            (AuthMode::Psk, false) => (
                Vec::new(),
                config.psk.as_ref().map(|k| Secret::from_slice(k.expose())),
            ),
            (AuthMode::Password, false) => {
                let pw = config
                    .password
                    .as_ref()
                    .ok_or(ChannelError::NoCommonSuite)?;
                let (state, msg) = pake::start_server(pw);
                let key = state
                    .finish(&ch.pake)
                    .ok_or(ChannelError::AuthenticationFailed)?;
                (msg, Some(key))
            }
            _ => (Vec::new(), None),
        };
        let mut sh = ServerHello {
            nonce,
            kem: kem.map_or(0, |k| k.to_u8()),
            gears: gears.iter().map(|g| g.to_u8()).collect(),
            auth: mode.to_u8(),
            resumed,
            tickets,
            ciphertext,
            pake: pake_msg,
            finished: [0; 32],
            auth_tag: Vec::new(),
        };
        // The body is built once: the core (hashed into the transcript), then the finished
        // MAC and the tag appended to it.
        let mut out = Vec::with_capacity(160 + sh.ciphertext.len() + sh.pake.len());
        sh.encode_core(&mut out);
        let transcript = transcript_hash(&p, body, &out);
        let keys = derive_session(&p, &shared, &transcript).map_err(|_| ChannelError::Crypto)?;
        drop(shared);
        sh.finished = keys.server_finished;
        if let Some(secret) = &auth_secret {
            sh.auth_tag = auth_tag(&p, secret.expose(), SERVER_ROLE, &keys.session_id)
                .map_err(|_| ChannelError::Crypto)?
                .to_vec();
        }
        sh.encode_tail(&mut out);
        write_frame(&mut self.outbuf, FrameType::ServerHello, &out).ok_or(ChannelError::Crypto)?;

        let auth = match resumed_auth {
            Some(a) => AuthResult { resumed: true, ..a },
            None => AuthResult {
                mode,
                server_key: (mode == AuthMode::ServerSignature)
                    .then_some(config.identity)
                    .flatten(),
                resumed: false,
            },
        };
        if mode == AuthMode::ServerSignature && !resumed {
            self.proof_pending = true;
            self.events
                .push_back(Event::BatchSignatureNeeded(keys.session_id));
        }
        self.info = Some(SessionInfo {
            session_id: keys.session_id,
            kem,
            gears: gears.clone(),
            auth,
        });
        self.state = State::ServerAwaitFinished(Box::new(ServerPending {
            keys: Some(keys),
            auth,
            auth_secret,
            gears,
            tickets,
        }));
        Ok(())
    }

    fn server_on_finished(&mut self, body: &[u8]) -> Result<(), ChannelError> {
        let State::ServerAwaitFinished(mut pending) =
            std::mem::replace(&mut self.state, State::Open)
        else {
            return Err(ChannelError::NotReady);
        };
        let server = self.server_side()?;
        let config = &server.config;
        let p = self.provider;
        let cf = ClientFinished::decode(body)?;
        let keys = pending.keys.take().ok_or(ChannelError::NotReady)?;
        if !ct_eq(&keys.client_finished, &cf.finished) {
            return Err(ChannelError::KeyConfirmationFailed);
        }
        match &pending.auth_secret {
            Some(secret) => {
                let tag = auth_tag(&p, secret.expose(), CLIENT_ROLE, &keys.session_id)
                    .map_err(|_| ChannelError::Crypto)?;
                if !ct_eq(&tag, &cf.auth_tag) {
                    return Err(ChannelError::AuthenticationFailed);
                }
            }
            None if !cf.auth_tag.is_empty() => {
                return Err(ChannelError::Message(MessageError::BadField("auth tag")));
            }
            None => {}
        }
        self.open_records(
            &pending.gears,
            keys.s2c_stream,
            keys.c2s_stream,
            config.floor_bits,
            config.key_update_after,
        )?;
        self.datagram = Some((keys.s2c_datagram, keys.c2s_datagram));
        if pending.tickets > 0 {
            let tickets = derive_tickets(&p, &keys.next_session, pending.tickets)
                .map_err(|_| ChannelError::Crypto)?;
            server.store_sessions(self.now, tickets, pending.auth);
        }
        self.handshake_done = true;
        self.maybe_established();
        Ok(())
    }

    /// Starts the record layer: the gear controller, and the two directions' keys. The
    /// sender starts on the controller's choice (its strongest rung) if there is one, else
    /// on the server's first preference; the receiver derives that gear's key at once.
    fn open_records(
        &mut self,
        gears: &[GearId],
        send_secret: Secret,
        receive_secret: Secret,
        floor_bits: f64,
        key_update_after: u64,
    ) -> Result<(), ChannelError> {
        let set: GearSet = gears.iter().copied().collect();
        self.controller = controller_for(floor_bits, set);
        let first = self
            .controller
            .as_ref()
            .map_or(gears[0], Controller::current);
        self.sender = Some(RecordSender::new(
            self.provider,
            send_secret,
            set,
            first,
            key_update_after,
        )?);
        self.receiver = Some(RecordReceiver::new(
            self.provider,
            receive_secret,
            set,
            first,
            floor_bits,
            key_update_after,
        )?);
        Ok(())
    }

    fn maybe_established(&mut self) {
        if self.is_established() {
            self.events.push_back(Event::Established);
        }
    }
}

fn controller_for(floor_bits: f64, set: GearSet) -> Option<Controller> {
    Controller::new(ControllerConfig::new(floor_bits, set)).ok()
}

/// Deep copies for the fuzz harnesses (`fuzzing` feature only): a harness forms a group or
/// a pair once and hands each input a copy of it. A derived `Clone` would be wrong here: a
/// connection's `Side` is an `Arc` handle to its endpoint's caches (the client's tickets
/// and ephemeral key, the server's resumption cache and nonce generator), so a copy would
/// share them with the original and one input's tickets and nonces would leak into the next.
/// The copy instead points at the endpoint copy the caller made with [`Client::fork`] /
/// [`Server::fork`](crate::Server::fork), and copies everything else, keys and buffers
/// included.
#[cfg(feature = "fuzzing")]
impl Connection {
    /// A copy of this connection that uses `client`'s caches (a client connection) or
    /// `server`'s (a server connection) instead of its own endpoint's: pass the forks of the
    /// endpoint it was made from. `None` while a client waits for the ServerHello in
    /// password mode (the SPAKE2 state cannot be copied).
    ///
    /// [`Client::fork`]: crate::Client::fork
    pub fn fork(&self, client: &crate::Client, server: &crate::Server) -> Option<Connection> {
        let side = match &self.side {
            Side::Client { server_name, .. } => Side::Client {
                client: Arc::clone(&client.inner),
                server_name: server_name.clone(),
            },
            Side::Server { .. } => Side::Server {
                server: Arc::clone(&server.inner),
            },
        };
        let state = match &self.state {
            State::ClientAwaitHello(p) => {
                if p.pake.is_some() {
                    return None;
                }
                State::ClientAwaitHello(Box::new(ClientPending {
                    hello_body: p.hello_body.clone(),
                    tickets_asked: p.tickets_asked,
                    share_suite: p.share_suite,
                    share_secret: Arc::clone(&p.share_secret),
                    ticket: p.ticket.clone(),
                    pake: None,
                }))
            }
            State::ClientAwaitAuth(e) => State::ClientAwaitAuth(Box::new(Established {
                info: e.info.clone(),
                keys: e.keys.clone(),
                tickets: e.tickets,
            })),
            State::ServerAwaitHello => State::ServerAwaitHello,
            State::ServerAwaitFinished(p) => State::ServerAwaitFinished(Box::new(ServerPending {
                keys: p.keys.clone(),
                auth: p.auth,
                auth_secret: p.auth_secret.clone(),
                gears: p.gears.clone(),
                tickets: p.tickets,
            })),
            State::Open => State::Open,
            State::Failed(e) => State::Failed(*e),
        };
        let sender = match &self.sender {
            Some(s) => Some(s.fork()?),
            None => None,
        };
        let receiver = match &self.receiver {
            Some(r) => Some(r.fork()?),
            None => None,
        };
        Some(Connection {
            provider: self.provider,
            side,
            state,
            now: self.now,
            inbuf: self.inbuf.clone(),
            in_start: self.in_start,
            in_end: self.in_end,
            in_space: self.in_space,
            in_offered: self.in_offered,
            out_start: self.out_start,
            outbuf: self.outbuf.clone(),
            plain: self.plain.clone(),
            plain_len: self.plain_len,
            events: self.events.clone(),
            info: self.info.clone(),
            sender,
            receiver,
            datagram: self.datagram.clone(),
            datagram_taken: self.datagram_taken,
            controller: self.controller.clone(),
            proof_pending: self.proof_pending,
            handshake_done: self.handshake_done,
            peer_closed: self.peer_closed,
            local_closed: self.local_closed,
            next_server_nonce: self.next_server_nonce,
        })
    }

    /// Whether this connection uses `client`'s or `server`'s caches (the test of
    /// [`fork`](Self::fork)).
    pub fn uses_caches_of(&self, client: &crate::Client, server: &crate::Server) -> bool {
        match &self.side {
            Side::Client { client: c, .. } => Arc::ptr_eq(c, &client.inner),
            Side::Server { server: s } => Arc::ptr_eq(s, &server.inner),
        }
    }
}
