#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: tests fail loudly on unexpected errors
//! In-memory client/server pairs: every KEM and authentication mode, tampering with every
//! byte of every handshake message, a man in the middle, resumption, truncation, replay,
//! gears at run time, key updates and datagram keys.

use cohort_channel::batch::{BatchConfig, BatchSigner};
use cohort_channel::fuzzing::auth_configs;
use cohort_channel::identity::Identity;
use cohort_channel::messages::{ClientHello, FrameType, ServerHello};
use cohort_channel::{
    AuthMode, ChannelError, Client, ClientAuth, ClientConfig, Connection, Event, KemSuite, Server,
    ServerConfig,
};
use cohort_core::Timestamp;
use cohort_crypto::{CryptoProvider, Secret};
use cohort_gears::{GearId, Protector, ReceivePolicy, Unprotector};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;

fn provider() -> CryptoProvider {
    CryptoProvider::default_provider()
}

/// A test world: a client, a server, and (for signature mode) the server's batch signer.
struct World {
    client: Client,
    server: Server,
    signer: Option<BatchSigner>,
    /// Events other than batch-signing requests, in order.
    events: Vec<Event>,
    rng: ChaCha20Rng,
    now: Timestamp,
}

fn identity() -> Identity {
    Identity::from_secret(&provider(), Secret::from_slice(&[42; 32])).unwrap()
}

impl World {
    fn new(client: ClientConfig, server: ServerConfig) -> World {
        let signer = server
            .identity
            .map(|_| BatchSigner::new(provider(), identity(), BatchConfig::default()));
        World {
            client: Client::new(provider(), client),
            server: Server::new(provider(), server),
            signer,
            events: Vec::new(),
            rng: ChaCha20Rng::seed_from_u64(7),
            now: Timestamp::from_millis(1),
        }
    }

    fn with_auth(mode: AuthMode) -> World {
        let (cc, sc) = configs(mode);
        World::new(cc, sc)
    }

    fn connect(&mut self) -> (Connection, Connection) {
        let c = self
            .client
            .connect(self.now, &mut self.rng, "server")
            .unwrap();
        (c, self.server.accept())
    }

    /// Runs events (batch signing) on one connection.
    fn service(&mut self, conn: &mut Connection) {
        while let Some(ev) = conn.poll_event() {
            if let Event::BatchSignatureNeeded(sid) = ev {
                let signer = self.signer.as_mut().expect("signature mode needs a signer");
                signer.add(self.now, sid.0);
                signer.flush();
                while let Some((_, proof)) = signer.poll_signed() {
                    let proof = proof.expect("signing works");
                    conn.handle_batch_proof(&proof).unwrap();
                }
            } else {
                self.events.push(ev);
            }
        }
    }

    /// Moves bytes both ways, passing each flight through `tamper` (which sees the frames
    /// of one direction: `true` for client to server), until neither side has output.
    fn pump_with(
        &mut self,
        c: &mut Connection,
        s: &mut Connection,
        tamper: &mut dyn FnMut(bool, &mut Vec<u8>),
    ) -> (Result<(), ChannelError>, Result<(), ChannelError>) {
        let mut cr = Ok(());
        let mut sr = Ok(());
        for _ in 0..20 {
            // Both directions every round (`|`, not `||`).
            let moved = self.deliver(c, s, true, &mut sr, tamper)
                | self.deliver(s, c, false, &mut cr, tamper);
            if !moved {
                break;
            }
        }
        (cr, sr)
    }

    /// One direction of [`World::pump_with`]: moves `from`'s output through `tamper` into
    /// `to` (unless `to` already failed, keeping its error in `result`), then runs `to`'s
    /// events. Whether anything moved.
    fn deliver(
        &mut self,
        from: &mut Connection,
        to: &mut Connection,
        to_server: bool,
        result: &mut Result<(), ChannelError>,
        tamper: &mut dyn FnMut(bool, &mut Vec<u8>),
    ) -> bool {
        let mut buf = Vec::new();
        from.take_output(&mut buf);
        let moved = !buf.is_empty() && result.is_ok();
        if moved {
            tamper(to_server, &mut buf);
            *result = to.handle_input(self.now, &buf);
        }
        self.service(to);
        moved
    }

    fn pump(&mut self, c: &mut Connection, s: &mut Connection) {
        let (cr, sr) = self.pump_with(c, s, &mut |_, _| {});
        cr.unwrap();
        sr.unwrap();
        assert!(c.is_established() && s.is_established());
    }
}

/// Matching client and server configurations for `mode`.
fn configs(mode: AuthMode) -> (ClientConfig, ServerConfig) {
    let key = identity().public();
    let (auth, sc) = auth_configs(mode, key, key, &[9; 32], b"hunter2");
    (ClientConfig::new(auth), sc)
}

fn exchange(world: &mut World, c: &mut Connection, s: &mut Connection, bytes: usize) {
    let data: Vec<u8> = (0..bytes).map(|i| (i * 31 % 251) as u8).collect();
    c.send(&data).unwrap();
    s.send(&data[..bytes / 2]).unwrap();
    world.pump(c, s);
    let mut got = vec![0u8; bytes];
    assert_eq!(s.recv(&mut got), bytes);
    assert_eq!(got, data);
    let mut got = vec![0u8; bytes / 2];
    assert_eq!(c.recv(&mut got), bytes / 2);
    assert_eq!(got, &data[..bytes / 2]);
}

#[test]
fn every_kem_and_auth_mode_agrees_on_a_session_id_and_moves_data() {
    for kem in [
        KemSuite::X25519,
        KemSuite::MlKem768,
        KemSuite::X25519MlKem768,
        KemSuite::Rsa2048E3Oaep,
    ] {
        for mode in [
            AuthMode::None,
            AuthMode::ServerSignature,
            AuthMode::Psk,
            AuthMode::Password,
        ] {
            let (cc, sc) = configs(mode);
            let mut w = World::new(cc.with_kem(kem), sc);
            let (mut c, mut s) = w.connect();
            w.pump(&mut c, &mut s);
            let ci = c.session().unwrap().clone();
            let si = s.session().unwrap().clone();
            assert_eq!(ci.session_id, si.session_id, "{kem} {mode}");
            assert_eq!(ci.kem, Some(kem));
            assert_eq!(si.kem, Some(kem));
            assert_eq!(ci.auth.mode, mode);
            assert_eq!(si.auth.mode, mode);
            assert!(!ci.auth.resumed);
            assert_eq!(c.poll_event(), None);
            exchange(&mut w, &mut c, &mut s, 40_000);
        }
    }
}

/// Records every flight of a clean handshake: (client to server?, bytes).
fn clean_flights(mode: AuthMode, kem: KemSuite) -> Vec<(bool, Vec<u8>)> {
    let (cc, sc) = configs(mode);
    let mut w = World::new(cc.with_kem(kem), sc);
    let (mut c, mut s) = w.connect();
    let mut flights = Vec::new();
    let (cr, sr) = w.pump_with(&mut c, &mut s, &mut |dir, buf| {
        flights.push((dir, buf.clone()))
    });
    cr.unwrap();
    sr.unwrap();
    flights
}

fn tamper_every_byte(mode: AuthMode, kem: KemSuite, step: usize) -> usize {
    let flights = clean_flights(mode, kem);
    let (cc, sc) = configs(mode);
    let mut w = World::new(cc.with_kem(kem), sc);
    let mut tried = 0;
    for (index, (to_server, flight)) in flights.iter().enumerate() {
        for pos in (0..flight.len()).step_by(step) {
            let (mut c, mut s) = w.connect();
            let mut seen = 0;
            let _ = w.pump_with(&mut c, &mut s, &mut |_, buf| {
                if seen == index {
                    buf[pos] ^= 0x01;
                }
                seen += 1;
            });
            tried += 1;
            assert!(
                !(c.is_established() && s.is_established()),
                "{mode} {kem}: flight {index} byte {pos} flipped, yet both ends established"
            );
            // Whatever the server sent, the client checks: a changed byte in it never
            // leaves the client believing in a session.
            assert!(
                *to_server || !c.is_established(),
                "{mode} {kem}: server flight {index} byte {pos} flipped, yet the client established"
            );
        }
    }
    tried
}

#[test]
fn tampering_with_any_byte_of_any_handshake_message_fails_the_handshake() {
    for mode in [
        AuthMode::None,
        AuthMode::ServerSignature,
        AuthMode::Psk,
        AuthMode::Password,
    ] {
        let tried = tamper_every_byte(mode, KemSuite::X25519, 1);
        assert!(tried > 150, "{mode}: only {tried} positions");
    }
    // The larger KEMs: every 13th byte (their key material is most of the message).
    for kem in [KemSuite::X25519MlKem768, KemSuite::Rsa2048E3Oaep] {
        let tried = tamper_every_byte(AuthMode::None, kem, 13);
        assert!(tried > 40, "{kem}: only {tried} positions");
    }
}

#[test]
fn a_downgraded_offer_is_detected() {
    // The attacker strips the hybrid suite and every strong gear from the offer, leaving
    // what it prefers; the server would accept, but key confirmation fails.
    let (mut cc, sc) = configs(AuthMode::None);
    cc.kems = vec![KemSuite::X25519, KemSuite::X25519MlKem768];
    cc.gears = vec![GearId::Aes128Gcm, GearId::Aes256Gcm];
    let mut w = World::new(cc, sc);
    let (mut c, mut s) = w.connect();
    let (cr, _) = w.pump_with(&mut c, &mut s, &mut |to_server, buf| {
        if to_server && buf[0] == FrameType::ClientHello as u8 {
            // kems list follows magic(6) version(1) nonce(32): count byte at 3 + 39.
            let at = 3 + 39;
            assert_eq!(buf[at], 2);
            buf[at + 2] = KemSuite::X25519.to_u8(); // offer X25519 twice, no hybrid
        }
    });
    assert_eq!(cr, Err(ChannelError::KeyConfirmationFailed));
    assert!(!c.is_established());
}

/// A man in the middle who runs one handshake with each end and relays the data.
fn mitm(mode: AuthMode) -> (Result<(), ChannelError>, Option<(Connection, Connection)>) {
    let (cc, sc) = configs(mode);
    let mut w = World::new(cc, sc);
    // The attacker's halves: a server facing the client and a client facing the server,
    // with its own credentials (it knows none of the real ones).
    let evil_id = Identity::from_secret(&provider(), Secret::from_slice(&[66; 32])).unwrap();
    // It signs with its own key, while its client half pins the real one.
    let (evil_auth, evil_sc) = auth_configs(
        mode,
        evil_id.public(),
        identity().public(),
        &[1; 32],
        b"guess",
    );
    let mut evil = World::new(ClientConfig::new(evil_auth), evil_sc);
    if mode == AuthMode::ServerSignature {
        evil.signer = Some(BatchSigner::new(
            provider(),
            evil_id,
            BatchConfig::default(),
        ));
    }
    // client <-> evil server
    let (mut c, _) = w.connect();
    let mut es = evil.server.accept();
    let (cr, _) = evil.pump_with(&mut c, &mut es, &mut |_, _| {});
    // evil client <-> server
    let (mut ec, _) = evil.connect();
    let mut s = w.server.accept();
    let _ = w.pump_with(&mut ec, &mut s, &mut |_, _| {});
    if cr.is_err() || !c.is_established() {
        return (cr.and(Err(ChannelError::NotReady)), None);
    }
    assert!(es.is_established() && ec.is_established());
    (Ok(()), Some((c, s)))
}

#[test]
fn a_man_in_the_middle_shows_as_different_session_ids_or_fails_authentication() {
    let (r, ends) = mitm(AuthMode::None);
    r.unwrap();
    let (c, s) = ends.unwrap();
    // Unauthenticated: both ends connect, but the session IDs differ, which is how an
    // application that compares them out of band finds the attacker.
    assert_ne!(c.session_id(), s.session_id());
    assert!(c.session_id().is_some() && s.session_id().is_some());

    for mode in [AuthMode::ServerSignature, AuthMode::Psk, AuthMode::Password] {
        let (r, ends) = mitm(mode);
        assert!(
            ends.is_none(),
            "{mode}: the client connected through the attacker"
        );
        assert!(r.is_err(), "{mode}");
    }
}

#[test]
fn a_short_psk_is_refused_by_both_ends() {
    let client = Client::new(
        provider(),
        ClientConfig::new(ClientAuth::Psk(Secret::from_slice(b"passwordpassword"))),
    );
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    assert!(matches!(
        client.connect(Timestamp::ZERO, &mut rng, "s"),
        Err(ChannelError::Config(_))
    ));
    let mut sc = ServerConfig::new();
    sc.auth_modes = vec![AuthMode::Psk];
    sc.psk = Some(Secret::from_slice(&[1; 31]));
    assert!(!sc.supports(AuthMode::Psk));
    sc.psk = Some(Secret::from_slice(&[1; 32]));
    assert!(sc.supports(AuthMode::Psk));
}

#[test]
fn nothing_about_the_session_is_reported_before_it_is_verified() {
    // Signature mode: the client has checked the ServerHello but not yet the signature.
    let mut w = World::with_auth(AuthMode::ServerSignature);
    let (mut c, mut s) = w.connect();
    let mut hello = Vec::new();
    c.take_output(&mut hello);
    s.handle_input(w.now, &hello).unwrap();
    assert!(s.session().is_none() && s.session_id().is_none());
    let mut reply = Vec::new();
    s.take_output(&mut reply); // the ServerHello, without the ServerAuth
    c.handle_input(w.now, &reply).unwrap();
    assert!(!c.is_established());
    assert!(c.session().is_none() && c.session_id().is_none());
}

#[test]
fn wrong_credentials_and_missing_modes_fail() {
    // PSK mismatch.
    let (_, mut sc) = configs(AuthMode::Psk);
    sc.psk = Some(Secret::from_slice(&[8; 32]));
    let mut w = World::new(configs(AuthMode::Psk).0, sc);
    let (mut c, mut s) = w.connect();
    let (cr, _) = w.pump_with(&mut c, &mut s, &mut |_, _| {});
    assert_eq!(cr, Err(ChannelError::AuthenticationFailed));
    assert!(!s.is_established());
    // Wrong password.
    let (_, mut sc) = configs(AuthMode::Password);
    sc.password = Some(Secret::from_slice(b"hunter3"));
    let mut w = World::new(configs(AuthMode::Password).0, sc);
    let (mut c, mut s) = w.connect();
    let (cr, _) = w.pump_with(&mut c, &mut s, &mut |_, _| {});
    assert_eq!(cr, Err(ChannelError::AuthenticationFailed));
    assert!(!s.is_established());
    // The client wants a signature; the server offers only None.
    let mut w = World::new(
        configs(AuthMode::ServerSignature).0,
        configs(AuthMode::None).1,
    );
    let (mut c, mut s) = w.connect();
    let (cr, sr) = w.pump_with(&mut c, &mut s, &mut |_, _| {});
    assert_eq!(sr, Err(ChannelError::NoCommonSuite));
    assert_eq!(
        cr,
        Err(ChannelError::PeerAlert(
            cohort_channel::messages::AlertCode::NoCommonSuite
        ))
    );
}

#[test]
fn resumption_needs_no_public_key_step_and_old_keys_cannot_read_the_new_session() {
    for mode in [AuthMode::None, AuthMode::ServerSignature, AuthMode::Psk] {
        // One ticket at a time, so that "single use" shows in the counts.
        let (mut cc, sc) = configs(mode);
        cc.ticket_pool = 1;
        let mut w = World::new(cc, sc);
        let (mut c1, mut s1) = w.connect();
        w.pump(&mut c1, &mut s1);
        assert!(w.client.has_ticket("server"));
        assert_eq!(w.server.cached_sessions(), 1);

        let (mut c2, mut s2) = w.connect();
        assert!(!w.client.has_ticket("server"), "tickets are single use");
        let mut resume_hello = Vec::new();
        let (cr, sr) = w.pump_with(&mut c2, &mut s2, &mut |to_server, buf| {
            if to_server && resume_hello.is_empty() {
                resume_hello = buf.clone();
            }
        });
        cr.unwrap();
        sr.unwrap();
        let (i1, i2) = (c1.session().unwrap(), c2.session().unwrap());
        assert_eq!(i2.kem, None, "{mode}: no KEM on resumption");
        assert!(i2.auth.resumed && !i1.auth.resumed);
        assert_eq!(i2.auth.mode, mode);
        assert_eq!(c2.session_id(), s2.session_id());
        assert_ne!(i1.session_id, i2.session_id);
        assert_eq!(
            w.server.cached_sessions(),
            1,
            "spent entry erased, new one cached"
        );
        exchange(&mut w, &mut c2, &mut s2, 1000);

        // Records of the new session mean nothing under the spent session's keys.
        c2.send(b"for the new session only").unwrap();
        let mut bytes = Vec::new();
        c2.take_output(&mut bytes);
        assert!(matches!(
            s1.handle_input(w.now, &bytes),
            Err(ChannelError::Record(_))
        ));

        // Replaying the resuming ClientHello gets a full handshake, not the session.
        let mut s3 = w.server.accept();
        s3.handle_input(w.now, &resume_hello).unwrap();
        let mut reply = Vec::new();
        s3.take_output(&mut reply);
        assert_eq!(reply[0], FrameType::ServerHello as u8);
        let (sh, _) = ServerHello::decode(&reply[3..]).unwrap();
        assert!(!sh.resumed, "{mode}: a replayed resumption was honoured");
        assert_ne!(sh.kem, 0);
        assert!(
            s3.session().is_none(),
            "nothing is reported before the handshake ends"
        );
    }
}

#[test]
fn the_resumption_cache_is_bounded_in_size_and_age() {
    let (mut cc, mut sc) = configs(AuthMode::None);
    cc.ticket_pool = 1;
    sc.resumption_capacity = 2;
    sc.resumption_lifetime = std::time::Duration::from_secs(10);
    let mut w = World::new(cc, sc);
    // Three clients' worth of sessions: use three client names.
    let mut names = Vec::new();
    for name in ["a", "b", "c"] {
        let mut c = w.client.connect(w.now, &mut w.rng, name).unwrap();
        let mut s = w.server.accept();
        w.pump(&mut c, &mut s);
        names.push(name);
    }
    assert_eq!(w.server.cached_sessions(), 2);
    let resumed = |w: &mut World, name: &str| {
        let mut c = w.client.connect(w.now, &mut w.rng, name).unwrap();
        let mut s = w.server.accept();
        w.pump(&mut c, &mut s);
        c.session().unwrap().auth.resumed
    };
    assert!(!resumed(&mut w, "a"), "the oldest was evicted");
    assert!(resumed(&mut w, "c"));
    w.now = Timestamp::from_millis(60_000);
    assert!(!resumed(&mut w, "b"), "expired");
    // A quiet server erases expired sessions when its driver's timer says so.
    assert!(w.server.cached_sessions() > 0);
    w.server.expire_sessions(Timestamp::from_millis(120_000));
    assert_eq!(w.server.cached_sessions(), 0);
    assert!(w.client.has_ticket("b"));
    w.client.expire(Timestamp::from_millis(4_000_000_000));
    assert!(!w.client.has_ticket("b"));
}

#[test]
fn a_pool_of_tickets_lets_concurrent_connections_all_resume() {
    for mode in [AuthMode::None, AuthMode::ServerSignature, AuthMode::Psk] {
        let mut w = World::with_auth(mode);
        let (mut c, mut s) = w.connect();
        w.pump(&mut c, &mut s);
        let pool = usize::from(cohort_channel::config::DEFAULT_TICKETS);
        assert_eq!(w.client.tickets("server"), pool, "{mode}");
        assert_eq!(w.server.cached_sessions(), pool, "{mode}");
        // Four connections opened before any finishes: each takes its own ticket.
        let mut open: Vec<(Connection, Connection)> = (0..4).map(|_| w.connect()).collect();
        assert_eq!(w.client.tickets("server"), pool - 4);
        let mut ids = std::collections::HashSet::new();
        for (c, s) in &mut open {
            w.pump(c, s);
            let info = c.session().unwrap();
            assert!(
                info.auth.resumed,
                "{mode}: a concurrent connection did not resume"
            );
            assert_eq!(info.kem, None);
            assert_eq!(c.session_id(), s.session_id());
            assert!(ids.insert(c.session_id()));
        }
        // They asked for 1, 2, 3 and 4 tickets (what the pool lacked when each started):
        // the server cached all ten, the client keeps its pool's size.
        assert_eq!(w.server.cached_sessions(), pool - 4 + 10, "{mode}");
        assert_eq!(w.client.tickets("server"), pool, "{mode}");
    }
}

#[test]
fn the_server_issues_at_most_its_limit_and_a_client_without_a_pool_asks_for_none() {
    let (cc, mut sc) = configs(AuthMode::None);
    sc.max_tickets = 2;
    let mut w = World::new(cc, sc);
    let (mut c, mut s) = w.connect();
    w.pump(&mut c, &mut s);
    assert_eq!(w.client.tickets("server"), 2);
    assert_eq!(w.server.cached_sessions(), 2);

    let (mut cc, sc) = configs(AuthMode::None);
    cc.resumption = false;
    let mut w = World::new(cc, sc);
    for _ in 0..2 {
        let (mut c, mut s) = w.connect();
        w.pump(&mut c, &mut s);
        assert!(!c.session().unwrap().auth.resumed);
    }
    assert_eq!(w.client.tickets("server"), 0);
    assert_eq!(
        w.server.cached_sessions(),
        0,
        "tickets no one asked for were cached"
    );
}

#[test]
fn a_server_hello_issuing_more_tickets_than_asked_is_refused() {
    let (mut cc, sc) = configs(AuthMode::None);
    cc.ticket_pool = 2;
    let mut w = World::new(cc, sc);
    let (mut c, mut s) = w.connect();
    let mut hello = Vec::new();
    c.take_output(&mut hello);
    // The server is told the client asked for more than it did; its answer then issues
    // more than the client asked for.
    let mut ch = ClientHello::decode(&hello[3..]).unwrap();
    assert_eq!(ch.tickets, 2);
    ch.tickets = 5;
    let mut body = Vec::new();
    ch.encode(&mut body);
    let mut frame = Vec::new();
    cohort_channel::messages::write_frame(&mut frame, FrameType::ClientHello, &body).unwrap();
    s.handle_input(w.now, &frame).unwrap();
    let mut reply = Vec::new();
    s.take_output(&mut reply);
    let (sh, _) = ServerHello::decode(&reply[3..]).unwrap();
    assert_eq!(sh.tickets, 5);
    assert_eq!(
        c.handle_input(w.now, &reply),
        Err(ChannelError::BadChoice("tickets"))
    );
}

#[test]
fn truncation_is_told_apart_from_a_clean_close() {
    let mut w = World::with_auth(AuthMode::None);
    let (mut c, mut s) = w.connect();
    w.pump(&mut c, &mut s);
    c.send(b"complete").unwrap();
    c.close().unwrap();
    assert_eq!(c.send(b"more"), Err(ChannelError::NotReady));
    w.pump(&mut c, &mut s);
    assert!(s.peer_closed());
    assert_eq!(w.events.last(), Some(&Event::PeerClosed));
    assert_eq!(s.handle_eof(), Ok(()));

    let (mut c, mut s) = w.connect();
    w.pump(&mut c, &mut s);
    c.send(&[5u8; 3000]).unwrap();
    let mut bytes = Vec::new();
    c.take_output(&mut bytes);
    // An attacker cuts the stream mid-record, or between records.
    s.handle_input(w.now, &bytes[..1000]).unwrap();
    assert_eq!(s.handle_eof(), Err(ChannelError::Truncated));
    let (mut c, mut s) = w.connect();
    w.pump(&mut c, &mut s);
    c.send(&[5u8; 3000]).unwrap();
    w.pump(&mut c, &mut s);
    assert_eq!(s.handle_eof(), Err(ChannelError::Truncated));
}

#[test]
fn in_place_input_space_starts_small_and_doubles_while_reads_fill_it() {
    let mut w = World::with_auth(AuthMode::None);
    let (mut c, mut s) = w.connect();
    w.pump(&mut c, &mut s);
    let data: Vec<u8> = (0..200_000).map(|i| (i * 7 % 253) as u8).collect();
    c.send(&data).unwrap();
    let mut wire = Vec::new();
    c.take_output(&mut wire);
    // A driver that asks for 64 KiB each time and always gets all it is offered.
    let mut offers = Vec::new();
    let mut at = 0;
    let mut got = Vec::new();
    while at < wire.len() {
        let space = s.input_space(64 * 1024);
        offers.push(space.len());
        let n = space.len().min(wire.len() - at);
        space[..n].copy_from_slice(&wire[at..at + n]);
        at += n;
        s.handle_input_in_place(w.now, n).unwrap();
        let mut buf = vec![0u8; s.readable()];
        let read = s.recv(&mut buf);
        got.extend_from_slice(&buf[..read]);
    }
    assert_eq!(got, data);
    assert_eq!(&offers[..5], &[4096, 8192, 16384, 32768, 65536]);
    assert!(offers[5..].iter().all(|&o| o == 65536), "{offers:?}");

    // A short read does not grow the space; a copying handle_input leaves it alone.
    let (mut c, mut s) = w.connect();
    w.pump(&mut c, &mut s);
    c.send(b"hello").unwrap();
    let mut wire = Vec::new();
    c.take_output(&mut wire);
    let space = s.input_space(64 * 1024);
    assert_eq!(space.len(), 4096);
    space[..wire.len()].copy_from_slice(&wire);
    s.handle_input_in_place(w.now, wire.len()).unwrap();
    assert_eq!(s.input_space(64 * 1024).len(), 4096);
    s.handle_input_in_place(w.now, 0).unwrap();
    assert_eq!(s.input_space(100).len(), 100);
    let mut buf = [0u8; 5];
    assert_eq!(s.recv(&mut buf), 5);
    assert_eq!(&buf, b"hello");
}

#[test]
fn records_read_in_place_survive_partial_reads_and_the_buffer_moving() {
    use rand_core::RngCore;
    let mut rng = ChaCha20Rng::seed_from_u64(18);
    let mut w = World::with_auth(AuthMode::None);
    let (mut c, mut s) = w.connect();
    w.pump(&mut c, &mut s);
    let data: Vec<u8> = (0..300_000).map(|i| (i * 11 % 241) as u8).collect();
    // Records of many sizes, some empty.
    let mut at = 0;
    while at < data.len() {
        let n = (rng.next_u32() as usize % 40_000).min(data.len() - at);
        c.send(&data[at..at + n]).unwrap();
        at += n;
    }
    let mut wire = Vec::new();
    c.take_output(&mut wire);
    // Transport reads of random sizes, and reads of the plaintext that leave some behind
    // while more input arrives (so unread plaintext is moved with the buffer).
    let (mut fed, mut got) = (0, Vec::new());
    while got.len() < data.len() {
        if fed < wire.len() {
            let ask = 1 + rng.next_u32() as usize % 70_000;
            let space = s.input_space(ask);
            let n = (1 + rng.next_u32() as usize % space.len()).min(wire.len() - fed);
            space[..n].copy_from_slice(&wire[fed..fed + n]);
            fed += n;
            s.handle_input_in_place(w.now, n).unwrap();
        }
        let want = if fed == wire.len() {
            s.readable()
        } else {
            rng.next_u32() as usize % 20_000
        };
        let avail = s.readable();
        let mut buf = vec![0u8; want];
        let read = s.recv(&mut buf);
        assert_eq!(read, want.min(avail));
        assert_eq!(s.readable(), avail - read);
        got.extend_from_slice(&buf[..read]);
        assert_eq!(&got[..], &data[..got.len()]);
    }
    assert_eq!(got, data);
    assert_eq!(s.readable(), 0);
}

#[test]
fn replayed_and_reordered_records_are_rejected() {
    /// A fresh established pair (kept alive for the caller), and the client's records of
    /// "one" then "two", not yet delivered.
    fn two_records(w: &mut World) -> (Connection, Connection, Vec<u8>, Vec<u8>) {
        let (mut c, mut s) = w.connect();
        w.pump(&mut c, &mut s);
        c.send(b"one").unwrap();
        let mut first = Vec::new();
        c.take_output(&mut first);
        c.send(b"two").unwrap();
        let mut second = Vec::new();
        c.take_output(&mut second);
        (c, s, first, second)
    }

    let mut w = World::with_auth(AuthMode::None);
    let (_c, mut s, first, _) = two_records(&mut w);
    s.handle_input(w.now, &first).unwrap();
    assert!(matches!(
        s.handle_input(w.now, &first),
        Err(ChannelError::Record(_))
    ));

    let (_c, mut s, _, second) = two_records(&mut w);
    assert!(matches!(
        s.handle_input(w.now, &second),
        Err(ChannelError::Record(_))
    ));
}

#[test]
fn a_peer_that_does_not_speak_cohort_is_refused() {
    let mut w = World::with_auth(AuthMode::None);
    let (mut c, mut s) = w.connect();
    assert_eq!(
        c.handle_input(w.now, b"HTTP/1.1 400 Bad Request\r\n\r\n"),
        Err(ChannelError::NotCohort)
    );
    assert_eq!(
        s.handle_input(w.now, b"GET / HTTP/1.1\r\n"),
        Err(ChannelError::NotCohort)
    );
    // A server that hangs up, even mid-frame, is not proof that it does not speak cohort (a
    // tunnel must not fall back to plaintext for it): that is a truncation.
    let (mut c, _) = w.connect();
    assert_eq!(c.handle_eof(), Err(ChannelError::Truncated));
    let (mut c, _) = w.connect();
    c.handle_input(w.now, &[FrameType::ServerHello as u8, 0x04])
        .unwrap();
    assert_eq!(c.handle_eof(), Err(ChannelError::Truncated));
}

#[test]
fn gears_shift_at_run_time_within_the_negotiated_set() {
    let (mut cc, mut sc) = configs(AuthMode::None);
    cc.gears = vec![GearId::Aes256Gcm, GearId::Aes128Gcm, GearId::Umac64];
    sc.gears = vec![GearId::Aes256Gcm, GearId::Aes128Gcm, GearId::Umac64];
    cc.floor_bits = 60.0;
    sc.floor_bits = 60.0;
    let mut w = World::new(cc, sc);
    let (mut c, mut s) = w.connect();
    w.pump(&mut c, &mut s);
    assert_eq!(
        s.session().unwrap().gears,
        [GearId::Aes256Gcm, GearId::Aes128Gcm, GearId::Umac64]
    );
    // The sender starts on the controller's strongest rung; equally strong AEADs share a
    // rung and the cheaper one stands for it.
    assert_eq!(c.send_gear(), Some(GearId::Aes128Gcm));
    // Explicit: an authentication-only record, then back.
    c.set_send_gear(GearId::Umac64).unwrap();
    assert!(c.set_send_gear(GearId::ChaCha20Poly1305).is_err());
    exchange(&mut w, &mut c, &mut s, 5000);
    // The controller (ACSA's IPsec case) on an authentication-only channel: sustained load
    // walks the sender down the negotiated ladder, and each record names its gear.
    let ladder = vec![GearId::HmacSha256, GearId::Umac64, GearId::Umac32];
    let (mut cc, mut sc) = configs(AuthMode::None);
    cc.gears = ladder.clone();
    sc.gears = ladder.clone();
    cc.floor_bits = 30.0;
    sc.floor_bits = 30.0;
    let mut w = World::new(cc, sc);
    let (mut c, mut s) = w.connect();
    w.pump(&mut c, &mut s);
    assert_eq!(
        c.send_gear(),
        Some(GearId::HmacSha256),
        "starts at the strongest"
    );
    let t0 = Timestamp::from_millis(10_000);
    let mut shifts = Vec::new();
    for step in 0..40u64 {
        let now = t0.saturating_add(std::time::Duration::from_secs(step));
        if let Some(sh) = c.observe_load(now, 0.99) {
            shifts.push(sh.to);
            exchange(&mut w, &mut c, &mut s, 3000);
        }
    }
    assert_eq!(shifts, [GearId::Umac64, GearId::Umac32]);
    assert_eq!(c.send_gear(), Some(GearId::Umac32));
}

#[test]
fn keys_update_before_their_limit_through_the_connection() {
    let (mut cc, mut sc) = configs(AuthMode::None);
    cc.key_update_after = 5;
    sc.key_update_after = 5;
    let mut w = World::new(cc, sc);
    let (mut c, mut s) = w.connect();
    w.pump(&mut c, &mut s);
    for i in 0..40u8 {
        c.send(&[i; 100]).unwrap();
        s.send(&[i; 10]).unwrap();
    }
    w.pump(&mut c, &mut s);
    let mut got = vec![0u8; 4000];
    assert_eq!(s.recv(&mut got), 4000);
    assert!(got
        .chunks(100)
        .enumerate()
        .all(|(i, ch)| ch.iter().all(|&b| b == i as u8)));
    assert_eq!(c.recv(&mut got), 400);
}

#[test]
fn datagram_keys_from_the_handshake_protect_packets_both_ways() {
    let mut w = World::with_auth(AuthMode::None);
    let (mut c, mut s) = w.connect();
    w.pump(&mut c, &mut s);
    let (c_send, c_recv) = c.datagram_keys().unwrap();
    let (s_send, s_recv) = s.datagram_keys().unwrap();
    // Handed out once: a second protector would restart at sequence 0 and repeat nonces.
    assert_eq!(c.datagram_keys().err(), Some(ChannelError::KeysTaken));
    let gears = c_send.gears();
    let (c_send2, c_recv2) = (c_send.clone(), c_recv.clone());
    for (send, recv) in [(c_send, s_recv), (s_send, c_recv)] {
        let mut p = Protector::new(send);
        let mut u = Unprotector::new(recv, ReceivePolicy::new(gears, 64.0));
        for i in 0..5u8 {
            let mut pkt = Vec::new();
            p.protect(&[GearId::Aes128Gcm], b"hdr", &[i; 50], &mut pkt)
                .unwrap();
            let opened = u.unprotect(&mut pkt).unwrap();
            assert_eq!(opened.body, &[i; 50]);
        }
    }
    // The two directions use different keys: a packet cannot be reflected.
    let (c_send, c_recv) = (c_send2, c_recv2);
    let mut pkt = Vec::new();
    Protector::new(c_send)
        .protect(&[GearId::Aes128Gcm], b"", b"x", &mut pkt)
        .unwrap();
    assert!(Unprotector::new(c_recv, ReceivePolicy::new(gears, 64.0))
        .unprotect(&mut pkt)
        .is_err());
}

#[test]
fn exported_secrets_agree_across_ends_and_differ_by_label() {
    let mut w = World::with_auth(AuthMode::None);
    let (mut c, mut s) = w.connect();
    assert_eq!(
        c.export_secret(b"x", 32).err(),
        Some(ChannelError::NotReady)
    );
    w.pump(&mut c, &mut s);
    let a = c.export_secret(b"gears", 32).unwrap();
    let b = s.export_secret(b"gears", 32).unwrap();
    assert_eq!(a.expose(), b.expose());
    assert_ne!(a.expose(), c.export_secret(b"other", 32).unwrap().expose());
    let (mut c2, mut s2) = w.connect();
    w.pump(&mut c2, &mut s2);
    assert_ne!(a.expose(), c2.export_secret(b"gears", 32).unwrap().expose());
}

#[test]
fn a_failed_connection_stays_failed_for_late_proofs_and_end_of_stream() {
    // A batch proof that arrives after the connection failed sends nothing.
    let mut w = World::with_auth(AuthMode::ServerSignature);
    let (mut c, mut s) = w.connect();
    let mut input = Vec::new();
    c.take_output(&mut input);
    input.extend_from_slice(&[0x42, 0, 0]);
    let err = s.handle_input(w.now, &input).unwrap_err();
    let Some(Event::BatchSignatureNeeded(sid)) = s.poll_event() else {
        panic!("no signing request");
    };
    let signer = w.signer.as_mut().unwrap();
    let ticket = signer.add(w.now, sid.0);
    signer.flush();
    let (t, proof) = signer.poll_signed().unwrap();
    assert_eq!(t, ticket);
    let before = s.output().len();
    assert_eq!(s.handle_batch_proof(&proof.unwrap()), Err(err));
    assert_eq!(s.output().len(), before, "a failed connection sent more");
    // End of stream after a failure reports the failure, even after the peer's close.
    let (mut c, mut s) = w.connect();
    w.pump(&mut c, &mut s);
    c.close().unwrap();
    let mut bytes = Vec::new();
    c.take_output(&mut bytes);
    bytes.extend_from_slice(&[0x17, 0, 0]); // a frame after the close
    assert!(s.handle_input(w.now, &bytes).is_err());
    assert!(s.peer_closed());
    assert!(s.handle_eof().is_err());
}
