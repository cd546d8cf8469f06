//! The channel fuzz targets' harnesses (`cohort_channel::fuzzing`) as property tests, so they
//! run in every `cargo test` and cannot rot: each on arbitrary bytes, and on real messages
//! (recorded from real handshakes) with bytes flipped, cut, inserted and spliced, so the
//! tests reach the deep states and not only the first length check.
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

use cohort_channel::fuzzing::{
    batch_proof, client_connection, client_finished, client_hello, record_open, server_connection,
    server_hello, tampered_handshake, valid_handshake_flights, valid_records, Control,
};
use cohort_channel::messages::FrameType;
use cohort_channel::suite::ALL_AUTH_MODES;
use cohort_channel::{AuthMode, ChannelError};
use proptest::prelude::*;

/// One change to a byte string.
#[derive(Clone, Debug)]
enum Mutation {
    /// XOR the byte at (position mod length) with a nonzero value.
    Flip(usize, u8),
    /// Keep the first (position mod (length + 1)) bytes.
    Truncate(usize),
    /// Insert a byte.
    Insert(usize, u8),
    /// Remove a byte.
    Remove(usize),
    /// Replace the bytes from a position on with others.
    Splice(usize, Vec<u8>),
    /// Set a 16-bit big-endian field (a length, say) to a value near its extremes.
    Length(usize, u16),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), 1u8..=255).prop_map(|(p, x)| Mutation::Flip(p, x)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(p, b)| Mutation::Insert(p, b)),
        1 => any::<usize>().prop_map(Mutation::Remove),
        1 => (any::<usize>(), prop::collection::vec(any::<u8>(), 0..40))
            .prop_map(|(p, v)| Mutation::Splice(p, v)),
        1 => (any::<usize>(), prop_oneof![Just(0u16), Just(1), Just(0xffff), any::<u16>()])
            .prop_map(|(p, v)| Mutation::Length(p, v)),
    ]
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec(mutation(), 1..4)
}

fn apply(ms: &[Mutation], bytes: &mut Vec<u8>) {
    for m in ms {
        let len = bytes.len();
        match m {
            Mutation::Flip(p, x) if len > 0 => bytes[p % len] ^= x,
            Mutation::Flip(..) => {}
            Mutation::Truncate(p) => bytes.truncate(p % (len + 1)),
            Mutation::Insert(p, b) => bytes.insert(p % (len + 1), *b),
            Mutation::Remove(p) if len > 0 => {
                bytes.remove(p % len);
            }
            Mutation::Remove(_) => {}
            Mutation::Splice(p, v) => {
                bytes.truncate(p % (len + 1));
                bytes.extend_from_slice(v);
            }
            Mutation::Length(p, v) if len > 1 => {
                let at = p % (len - 1);
                bytes[at..at + 2].copy_from_slice(&v.to_be_bytes());
            }
            Mutation::Length(..) => {}
        }
    }
}

/// `input` with its first (control) byte kept and the mutations applied to the rest.
fn mutated_after_control(ms: &[Mutation], input: &[u8]) -> Vec<u8> {
    let mut rest = input[1..].to_vec();
    apply(ms, &mut rest);
    let mut out = vec![input[0]];
    out.extend(rest);
    out
}

fn body(frame: &[u8]) -> &[u8] {
    &frame[3..]
}

/// The modes whose ClientHello is the same on every connection (password mode's carries a
/// fresh SPAKE2 message), so the recorded server flight answers every client.
const FIXED_HELLO_MODES: [AuthMode; 3] = [AuthMode::None, AuthMode::ServerSignature, AuthMode::Psk];

fn any_mode() -> impl Strategy<Value = AuthMode> {
    prop::sample::select(ALL_AUTH_MODES.to_vec())
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

// ---- the real inputs reach the deep states ----------------------------------------------------

#[test]
fn real_messages_parse_and_reach_the_end_of_each_state_machine() {
    for mode in ALL_AUTH_MODES {
        let f = valid_handshake_flights(mode);
        let ch = client_hello(body(&f.client_hello)).unwrap();
        assert_eq!(ch.auths, [mode.to_u8()]);
        let (sh, _) = server_hello(body(f.server_hello())).unwrap();
        assert_eq!(sh.auth, mode.to_u8());
        client_finished(body(&f.client_finished)).unwrap();
        if mode == AuthMode::ServerSignature {
            let proof = batch_proof(body(f.server_auth())).unwrap();
            assert!(proof.verified);
            assert_eq!(proof.consumed, body(f.server_auth()).len());
        } else {
            assert!(f.server_auth().is_empty());
        }

        // The server, at every depth and in chunks: a real client's handshake establishes it.
        for depth in 0..4 {
            for chunk_root in [0, 1, 5] {
                let out = server_connection(&[Control::byte(mode, depth, chunk_root)]);
                assert_eq!(out.result, Ok(()), "{mode} depth {depth}");
                assert_eq!(out.established, depth >= 2, "{mode} depth {depth}");
                assert_eq!(out.received.len(), if depth == 3 { 20 } else { 0 });
            }
        }
        // The recorded ClientHello and ClientFinished: the ClientHello is answered, the
        // ClientFinished belongs to another server's keys.
        let mut input = vec![Control::byte(mode, 0, 3)];
        input.extend_from_slice(&f.client_hello);
        input.extend_from_slice(&f.client_finished);
        let out = server_connection(&input);
        assert_eq!(
            out.result,
            Err(ChannelError::KeyConfirmationFailed),
            "{mode}"
        );

        // The client, at every depth.
        for depth in 1..4 {
            for chunk_root in [0, 1, 5] {
                let out = client_connection(&[Control::byte(mode, depth, chunk_root)]);
                assert_eq!(out.result, Ok(()), "{mode} depth {depth}");
                let established = depth >= 2 || mode != AuthMode::ServerSignature;
                assert_eq!(out.established, established, "{mode} depth {depth}");
            }
        }
    }
    // The recorded server flight answers every client whose ClientHello is fixed.
    for mode in FIXED_HELLO_MODES {
        let f = valid_handshake_flights(mode);
        let mut input = vec![Control::byte(mode, 0, 0)];
        input.extend_from_slice(&f.server_flight);
        let out = client_connection(&input);
        assert_eq!(out.result, Ok(()), "{mode}");
        assert!(out.established, "{mode}");
        assert_eq!(out.session_id, Some(f.session_id));
    }
}

#[test]
fn real_records_open_in_order() {
    let plain: Vec<Vec<u8>> = (0..9u8).map(|i| vec![i; usize::from(i) * 37]).collect();
    let refs: Vec<&[u8]> = plain.iter().map(Vec::as_slice).collect();
    for null in [0u8, 1] {
        let mut input = vec![null];
        input.extend(valid_records(&refs));
        let out = record_open(&input);
        assert_eq!(out.error, None);
        assert_eq!(out.left, 0);
        let data: Vec<_> = out
            .opened
            .iter()
            .filter(|r| r.ty == FrameType::Data)
            .map(|r| r.plaintext.clone())
            .collect();
        assert_eq!(data, plain);
        assert!(out.opened.iter().any(|r| r.ty == FrameType::KeyUpdate));
        assert_eq!(out.opened.last().unwrap().ty, FrameType::Close);
    }
}

#[test]
fn untouched_handshakes_finish_in_every_mode() {
    for mode in ALL_AUTH_MODES {
        for resume in [0, 0x04] {
            for which in 0..5 {
                // Change 4 is none at all.
                let out = tampered_handshake(&[mode.to_u8() | resume, which, 0xff, 0xff, 4, 0]);
                let out = out.unwrap();
                assert!(!out.changed);
                assert_eq!(out.resumed, resume != 0, "{mode}");
                assert!(out.client.established && out.server.established, "{mode}");
                assert_eq!(out.client.session_id, out.server.session_id);
                assert_eq!(out.server.received, b"ping from the client");
                assert_eq!(out.client.received, b"pong from the server");
            }
        }
    }
}

// ---- message parsers -----------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn client_hello_arbitrary(data in bytes(300)) {
        let _ = client_hello(&data);
    }

    #[test]
    fn client_hello_mutated(mode in any_mode(), ms in mutations()) {
        let f = valid_handshake_flights(mode);
        let mut data = body(&f.client_hello).to_vec();
        apply(&ms, &mut data);
        let parsed = client_hello(&data);
        if data == body(&f.client_hello) {
            prop_assert!(parsed.is_ok());
        }
    }

    #[test]
    fn server_hello_arbitrary(data in bytes(300)) {
        let _ = server_hello(&data);
    }

    #[test]
    fn server_hello_mutated(mode in any_mode(), ms in mutations()) {
        let f = valid_handshake_flights(mode);
        let mut data = body(f.server_hello()).to_vec();
        apply(&ms, &mut data);
        let parsed = server_hello(&data);
        if data == body(f.server_hello()) {
            prop_assert!(parsed.is_ok());
        }
    }

    #[test]
    fn client_finished_arbitrary(data in bytes(300)) {
        let _ = client_finished(&data);
    }

    #[test]
    fn client_finished_mutated(mode in any_mode(), ms in mutations()) {
        let f = valid_handshake_flights(mode);
        let mut data = body(&f.client_finished).to_vec();
        apply(&ms, &mut data);
        let _ = client_finished(&data);
    }

    #[test]
    fn batch_proof_arbitrary(data in bytes(600)) {
        if let Ok(out) = batch_proof(&data) {
            prop_assert!(!out.verified, "random bytes verified as a proof");
        }
    }

    /// Proofs of a plausible shape (a leaf count, an index below it and the path length they
    /// imply) with random contents: they decode, and do not verify.
    #[test]
    fn batch_proof_plausible(leaves in 1u32..=4096, index_seed: u32, sig in bytes(64),
                             path in bytes(32 * 13), extra in bytes(8)) {
        let index = index_seed % leaves;
        // The path length of leaf `index` in a tree of `leaves`.
        let (mut m, mut n, mut len) = (index, leaves, 0usize);
        while n > 1 {
            if m & 1 == 1 || m + 1 < n {
                len += 1;
            }
            m >>= 1;
            n = n.div_ceil(2);
        }
        let mut data = sig.clone();
        data.resize(64, 0);
        data.extend_from_slice(&index.to_be_bytes());
        data.extend_from_slice(&leaves.to_be_bytes());
        data.push(len as u8);
        let mut p = path.clone();
        p.resize(32 * len, 7);
        data.extend_from_slice(&p);
        data.extend_from_slice(&extra);
        let out = batch_proof(&data).unwrap();
        prop_assert_eq!(out.consumed, data.len() - extra.len());
        prop_assert!(!out.verified);
    }

    /// A proof whose bytes changed never verifies (bytes after it are not its business).
    #[test]
    fn batch_proof_mutated(ms in mutations()) {
        let f = valid_handshake_flights(AuthMode::ServerSignature);
        let real = body(f.server_auth());
        let mut data = real.to_vec();
        apply(&ms, &mut data);
        if let Ok(out) = batch_proof(&data) {
            if out.verified {
                prop_assert_eq!(&data[..out.consumed], real, "a changed proof verified");
            }
        }
    }
}

// ---- records ---------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn record_arbitrary(data in bytes(600)) {
        let out = record_open(&data);
        if data.first().is_some_and(|b| b & 1 == 0) {
            prop_assert!(out.opened.is_empty(), "random bytes opened as a record");
        }
    }

    /// Records that are a little off: a real frame header (type, length, gear) over random
    /// bytes, reaching the tag checks of every gear and the null gear's body handling.
    #[test]
    fn record_plausible_framing(
        choice in any::<u8>(),
        frames in prop::collection::vec(
            (prop_oneof![Just(0x17u8), Just(0x18), Just(0x19), any::<u8>()],
             prop::sample::select(vec![0x00u8, 0x02, 0x12, 0x40, 0x41, 0x42, 0x33]),
             bytes(80)),
            1..6),
    ) {
        let mut data = vec![choice];
        for (ty, gear, body) in &frames {
            data.push(*ty);
            data.extend_from_slice(&(body.len() as u16 + 1).to_be_bytes());
            data.push(*gear);
            data.extend_from_slice(body);
        }
        let out = record_open(&data);
        if choice & 1 == 0 {
            prop_assert!(out.opened.is_empty());
        }
    }

    /// Real records with changes: whatever opens is exactly what was sent, in order.
    #[test]
    fn record_mutated(null in 0u8..2, sizes in prop::collection::vec(0usize..300, 1..7),
                      ms in mutations()) {
        let plain: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| vec![i as u8; n]).collect();
        let refs: Vec<&[u8]> = plain.iter().map(Vec::as_slice).collect();
        let mut real = vec![null];
        real.extend(valid_records(&refs));
        let reference = record_open(&real);
        let data = mutated_after_control(&ms, &real);
        let out = record_open(&data);
        if null == 0 {
            prop_assert!(reference.opened.starts_with(&out.opened),
                         "a changed record opened: {:?}", out.opened.last());
        }
    }
}

// ---- connections -----------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn server_arbitrary(data in bytes(400)) {
        let out = server_connection(&data);
        let depth = Control::from_byte(data.first().copied().unwrap_or(0)).depth;
        if depth < 2 {
            prop_assert!(!out.established);
        }
    }

    /// Bytes that start like a ClientHello (right type, plausible length), so the parser
    /// gets past the frame header.
    #[test]
    fn server_plausible_hello(ctrl in any::<u8>(), len in 0u16..300, rest in bytes(300)) {
        let mut data = vec![ctrl & !0x0c, FrameType::ClientHello as u8];
        data.extend_from_slice(&len.to_be_bytes());
        data.extend_from_slice(b"COHORT\x01");
        data.extend_from_slice(&rest);
        let out = server_connection(&data);
        prop_assert!(!out.established);
    }

    /// The real ClientHello and ClientFinished with changes, at depth 0, in any chunks.
    #[test]
    fn server_mutated(mode in any_mode(), chunk_root in 0u8..16, ms in mutations()) {
        let f = valid_handshake_flights(mode);
        let mut real = vec![Control::byte(mode, 0, chunk_root)];
        real.extend_from_slice(&f.client_hello);
        real.extend_from_slice(&f.client_finished);
        let out = server_connection(&mutated_after_control(&ms, &real));
        prop_assert!(!out.established);
    }

    /// After a real client's ClientHello (depth 1) or whole handshake and a record (depth
    /// 2 or 3): the recorded ClientFinished with changes, or arbitrary bytes.
    #[test]
    fn server_deep(mode in any_mode(), depth in 1u8..4, chunk_root in 0u8..16,
                   ms in mutations(), junk in bytes(200), use_junk: bool) {
        let f = valid_handshake_flights(mode);
        let mut real = vec![Control::byte(mode, depth, chunk_root)];
        if use_junk {
            real.extend_from_slice(&junk);
        } else {
            real.extend_from_slice(&f.client_finished);
        }
        let data = mutated_after_control(&ms, &real);
        let out = server_connection(&data);
        if depth == 1 {
            prop_assert!(!out.established);
        }
    }

    #[test]
    fn client_arbitrary(data in bytes(400)) {
        let _ = client_connection(&data);
    }

    /// Bytes that start like a ServerHello or an alert.
    #[test]
    fn client_plausible_hello(ctrl in any::<u8>(), alert: bool, len in 0u16..300,
                              rest in bytes(300)) {
        let ty = if alert { FrameType::Alert } else { FrameType::ServerHello };
        let mut data = vec![ctrl & !0x0c, ty as u8];
        data.extend_from_slice(&len.to_be_bytes());
        data.extend_from_slice(b"COHORT\x01");
        data.extend_from_slice(&rest);
        let out = client_connection(&data);
        prop_assert!(out.session_id.is_none());
    }

    /// The real server flight with changes: the client never accepts a ServerHello other
    /// than the real one (the harness checks the bytes and the session ID), and never
    /// finishes on a changed flight.
    #[test]
    fn client_mutated(mode in prop::sample::select(FIXED_HELLO_MODES.to_vec()),
                      chunk_root in 0u8..16, ms in mutations()) {
        let f = valid_handshake_flights(mode);
        let mut real = vec![Control::byte(mode, 0, chunk_root)];
        real.extend_from_slice(&f.server_flight);
        let data = mutated_after_control(&ms, &real);
        let out = client_connection(&data);
        if !data[1..].starts_with(&f.server_flight) {
            prop_assert!(!out.established || data[1..].starts_with(f.server_hello()),
                         "{} finished on a changed flight", mode);
            if mode != AuthMode::ServerSignature {
                prop_assert!(!out.established, "{} finished on a changed flight", mode);
            }
        }
        if out.session_id.is_some() {
            prop_assert!(data[1..].starts_with(f.server_hello()));
        }
    }

    /// After a real server's ServerHello (depth 1: in signature mode the client then waits
    /// for the ServerAuth) or whole handshake: arbitrary bytes, or the recorded ServerAuth
    /// with changes (it belongs to another session).
    #[test]
    fn client_deep(mode in any_mode(), depth in 1u8..4, chunk_root in 0u8..16,
                   ms in mutations(), junk in bytes(200), use_junk: bool) {
        let f = valid_handshake_flights(AuthMode::ServerSignature);
        let mut real = vec![Control::byte(mode, depth, chunk_root)];
        if use_junk {
            real.extend_from_slice(&junk);
        } else {
            real.extend_from_slice(f.server_auth());
        }
        let out = client_connection(&mutated_after_control(&ms, &real));
        if depth == 1 && mode == AuthMode::ServerSignature {
            prop_assert!(!out.established);
        }
    }

    #[test]
    fn tampered_handshake_arbitrary(data in bytes(64)) {
        let _ = tampered_handshake(&data);
    }

    /// Every kind of change to every flight, in every mode.
    #[test]
    fn tampered_handshake_any_flight(mode in any_mode(), resume: bool, which in 0u8..5,
                                     pos: u16, op in 0u8..4, value: u8, tail in bytes(40)) {
        let mut data = vec![mode.to_u8() | if resume { 0x04 } else { 0 }, which];
        data.extend_from_slice(&pos.to_be_bytes());
        data.extend_from_slice(&[op, value]);
        data.extend_from_slice(&tail);
        let out = tampered_handshake(&data).unwrap();
        if out.changed && !out.appended_only && which <= 2 {
            prop_assert!(!(out.client.established && out.server.established));
        }
    }
}

// ---- the fuzz corpus (fuzz/corpus/<target>) -------------------------------------------------

/// The first flights (ClientHello, ServerHello bodies) of a full handshake that issues a
/// pool of tickets, then of a resumption that asks for one more (wire version 2).
fn ticket_pool_flights() -> [(Vec<u8>, Vec<u8>); 2] {
    use cohort_channel::{Client, ClientAuth, ClientConfig, Server, ServerConfig};
    use rand_core::SeedableRng;
    let p = cohort_crypto::CryptoProvider::default_provider();
    let client = Client::new(
        p,
        ClientConfig::new(ClientAuth::None).with_kem(cohort_channel::KemSuite::X25519),
    );
    let server = Server::new(p, ServerConfig::new());
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(18);
    let now = cohort_core::Timestamp::from_millis(1);
    let mut run = || {
        let mut c = client.connect(now, &mut rng, "pool").unwrap();
        let mut s = server.accept();
        let (mut hello, mut reply, mut fin) = (Vec::new(), Vec::new(), Vec::new());
        c.take_output(&mut hello);
        s.handle_input(now, &hello).unwrap();
        s.take_output(&mut reply);
        c.handle_input(now, &reply).unwrap();
        c.take_output(&mut fin);
        s.handle_input(now, &fin).unwrap();
        assert!(c.is_established() && s.is_established());
        (body(&hello).to_vec(), body(&reply).to_vec())
    };
    let full = run();
    assert_eq!(client.tickets("pool"), 8);
    let resumed = run();
    [full, resumed]
}

/// Seeds for every channel fuzz target, from real handshakes and records in every mode.
fn corpus_seeds() -> Vec<(&'static str, cohort_sim::corpus::Seeds)> {
    let (mut ch, mut sh, mut cf, mut proof) = (vec![], vec![], vec![], vec![]);
    for (name, (hello, reply)) in ["pool-full", "pool-resumed"]
        .into_iter()
        .zip(ticket_pool_flights())
    {
        ch.push((name.to_owned(), hello));
        sh.push((name.to_owned(), reply));
    }
    let (mut server, mut client, mut tamper) = (vec![], vec![], vec![]);
    for mode in ALL_AUTH_MODES {
        let f = valid_handshake_flights(mode);
        ch.push((format!("{mode}"), body(&f.client_hello).to_vec()));
        sh.push((format!("{mode}"), body(f.server_hello()).to_vec()));
        cf.push((format!("{mode}"), body(&f.client_finished).to_vec()));
        if !f.server_auth().is_empty() {
            proof.push((format!("{mode}"), body(f.server_auth()).to_vec()));
        }
        for depth in 0..4 {
            for chunk_root in [0, 5] {
                let name = format!("{mode}-depth{depth}-chunk{chunk_root}");
                server.push((name.clone(), vec![Control::byte(mode, depth, chunk_root)]));
                if depth > 0 {
                    client.push((name, vec![Control::byte(mode, depth, chunk_root)]));
                }
            }
        }
        let mut recorded = vec![Control::byte(mode, 0, 3)];
        recorded.extend_from_slice(&f.client_hello);
        recorded.extend_from_slice(&f.client_finished);
        server.push((format!("{mode}-recorded"), recorded));
        if FIXED_HELLO_MODES.contains(&mode) {
            let mut flight = vec![Control::byte(mode, 0, 0)];
            flight.extend_from_slice(&f.server_flight);
            client.push((format!("{mode}-recorded"), flight));
        }
        for resume in [0u8, 0x04] {
            for which in 0..5u8 {
                let name = format!("{mode}-resume{resume}-flight{which}");
                tamper.push((
                    format!("{name}-none"),
                    vec![mode.to_u8() | resume, which, 0xff, 0xff, 4, 0],
                ));
                tamper.push((
                    format!("{name}-flip"),
                    vec![mode.to_u8() | resume, which, 0, 9, 0, 0x40],
                ));
            }
        }
    }
    let plain: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; usize::from(i) * 61]).collect();
    let refs: Vec<&[u8]> = plain.iter().map(Vec::as_slice).collect();
    let records = [0u8, 1]
        .into_iter()
        .map(|null| {
            let mut input = vec![null];
            input.extend(valid_records(&refs));
            (format!("null{null}"), input)
        })
        .collect();
    vec![
        ("channel_client_hello", ch),
        ("channel_server_hello", sh),
        ("channel_client_finished", cf),
        ("channel_batch_proof", proof),
        ("channel_record", records),
        ("channel_server", server),
        ("channel_client", client),
        ("channel_tamper", tamper),
    ]
}

/// The harness each channel fuzz target calls (`fuzz/fuzz_targets/<target>.rs`).
fn corpus_harness(target: &str) -> fn(&[u8]) {
    match target {
        "channel_client_hello" => |d| {
            let _ = client_hello(d);
        },
        "channel_server_hello" => |d| {
            let _ = server_hello(d);
        },
        "channel_client_finished" => |d| {
            let _ = client_finished(d);
        },
        "channel_batch_proof" => |d| {
            let _ = batch_proof(d);
        },
        "channel_record" => |d| {
            let _ = record_open(d);
        },
        "channel_server" => |d| {
            let _ = server_connection(d);
        },
        "channel_client" => |d| {
            let _ = client_connection(d);
        },
        "channel_tamper" => |d| {
            let _ = tampered_handshake(d);
        },
        other => panic!("not a channel fuzz target: {other}"),
    }
}

/// Every input in the corpus runs through its harness as the fuzzer ran it; the seeds
/// themselves run too. With `COHORT_WRITE_CORPUS=1` the seeds are written first
/// (`scripts/fuzz-corpus.sh`).
#[test]
fn fuzz_corpus_replays() {
    for (target, seeds) in corpus_seeds() {
        cohort_sim::corpus::check(target, corpus_harness(target), &seeds);
    }
}
