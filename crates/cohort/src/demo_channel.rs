//! The channel half of `cohort demo`: a full handshake, a resumed one, the session IDs on
//! both ends, and what a man in the middle sees. In memory, with the same sans-IO cores the
//! tunnel runs over TCP.

use crate::UsageError;
use cohort_channel::messages::{peek_frame, FrameType};
use cohort_channel::{
    AuthMode, ChannelError, Client, ClientAuth, ClientConfig, Connection, Server, ServerConfig,
};
use cohort_core::Timestamp;
use cohort_crypto::{CryptoProvider, Secret};
use rand_core::SeedableRng;

fn err(e: ChannelError) -> UsageError {
    UsageError(format!("demo channel: {e}"))
}

/// What one exchange did: each side's result, and the frames that crossed as
/// (client to server?, frame type, length).
type Outcome = Result<(), ChannelError>;
type Frames = Vec<(bool, u8, usize)>;

/// Moves bytes between two connections until both are quiet.
fn pump(c: &mut Connection, s: &mut Connection) -> (Outcome, Outcome, Frames) {
    let now = Timestamp::from_millis(1);
    let (mut cr, mut sr) = (Ok(()), Ok(()));
    let mut seen = Vec::new();
    for _ in 0..10 {
        let mut moved = false;
        for to_server in [true, false] {
            let (from, to, result) = if to_server {
                (&mut *c, &mut *s, &mut sr)
            } else {
                (&mut *s, &mut *c, &mut cr)
            };
            let mut buf = Vec::new();
            from.take_output(&mut buf);
            if buf.is_empty() || result.is_err() {
                continue;
            }
            moved = true;
            let mut at = 0;
            while let Some((ty, len)) = peek_frame(&buf[at..]) {
                seen.push((to_server, ty, len));
                at += len;
            }
            *result = to.handle_input(now, &buf);
        }
        if !moved {
            break;
        }
    }
    (cr, sr, seen)
}

fn frame_name(ty: u8) -> &'static str {
    match FrameType::from_u8(ty) {
        Some(FrameType::ClientHello) => "ClientHello",
        Some(FrameType::ServerHello) => "ServerHello",
        Some(FrameType::ClientFinished) => "ClientFinished",
        Some(FrameType::ServerAuth) => "ServerAuth",
        Some(FrameType::Alert) => "Alert",
        Some(FrameType::Data) => "record (data)",
        Some(FrameType::Close) => "record (close)",
        Some(FrameType::KeyUpdate) => "record (key update)",
        None => "?",
    }
}

fn short(id: Option<cohort_channel::SessionId>) -> String {
    id.map_or_else(|| "-".into(), |id| format!("{}…", &id.to_string()[..16]))
}

/// Runs the channel story and returns a secret exported from the channel, which keys the
/// gears story that follows.
pub fn run(seed: u64) -> Result<Secret, UsageError> {
    let provider = CryptoProvider::default_provider();
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(seed);
    let now = Timestamp::from_millis(1);
    let client = Client::new(provider, ClientConfig::new(ClientAuth::None));
    let server = Server::new(provider, ServerConfig::new());

    println!("cohort demo, part 1: a secure channel in the tcpcrypt shape");
    println!();
    println!(
        "  alice (client) connects to bob (server). the client offers its suites and sends an"
    );
    println!("  ephemeral public key; bob only encapsulates to it (the cheap step), alice");
    println!("  decapsulates (the expensive one). both derive a session ID from the transcript.");
    println!();

    let mut c = client.connect(now, &mut rng, "bob").map_err(err)?;
    let mut s = server.accept();
    let (cr, sr, frames) = pump(&mut c, &mut s);
    cr.map_err(err)?;
    sr.map_err(err)?;
    println!("  full handshake, one round trip:");
    for (to_server, ty, len) in &frames {
        let arrow = if *to_server {
            "alice -> bob"
        } else {
            "bob -> alice"
        };
        println!("    {arrow}  {:<15} {len:>5} bytes", frame_name(*ty));
    }
    let info = c.session().ok_or(err(ChannelError::NotReady))?.clone();
    println!(
        "    kem {}, gears {}, auth: {}",
        info.kem.map_or("-", |k| k.name()),
        info.gears
            .iter()
            .map(|g| g.name())
            .collect::<Vec<_>>()
            .join(","),
        info.auth
    );
    println!("    session ID at alice: {}", info.session_id);
    println!(
        "    session ID at bob:   {}   (equal: no one in the middle)",
        s.session_id().map_or_else(String::new, |i| i.to_string())
    );
    println!("    (session IDs change from run to run: the KEM draws fresh randomness)");
    let exported = c.export_secret(b"cohort demo gears", 32).map_err(err)?;

    let mut c2 = client.connect(now, &mut rng, "bob").map_err(err)?;
    let mut s2 = server.accept();
    let (cr, sr, frames) = pump(&mut c2, &mut s2);
    cr.map_err(err)?;
    sr.map_err(err)?;
    let bytes: usize = frames.iter().map(|f| f.2).sum();
    println!();
    println!("  alice reconnects: she names the cached session; both derive fresh keys from its");
    println!(
        "  next-session key and new nonces, with no public-key operation ({bytes} bytes in all)."
    );
    println!(
        "    resumed: {}; kem: {}; session ID {} at alice, {} at bob",
        c2.session().is_some_and(|i| i.auth.resumed),
        c2.session()
            .and_then(|i| i.kem)
            .map_or("none", |k| k.name()),
        short(c2.session_id()),
        short(s2.session_id()),
    );

    // What a passive eavesdropper sees of application data.
    let secret_text = b"meet at the usual place at noon";
    c2.send(secret_text).map_err(err)?;
    let mut wire = Vec::new();
    c2.take_output(&mut wire);
    let shown = wire.len().min(24);
    println!();
    println!(
        "  on the wire, alice's {:?} is",
        std::str::from_utf8(secret_text).unwrap_or("")
    );
    println!(
        "    {} … ({} bytes: type, length, gear, ciphertext, tag)",
        hex::encode(&wire[..shown]),
        wire.len()
    );
    s2.handle_input(now, &wire).map_err(err)?;

    // An active man in the middle: mallory runs one handshake with each side.
    println!();
    println!("  mallory sits in the middle and runs one handshake with each side:");
    let mallory_server = Server::new(provider, ServerConfig::new());
    let mallory_client = Client::new(provider, ClientConfig::new(ClientAuth::None));
    let fresh = Client::new(provider, ClientConfig::new(ClientAuth::None));
    let mut a = fresh.connect(now, &mut rng, "bob").map_err(err)?;
    let mut ma = mallory_server.accept();
    let _ = pump(&mut a, &mut ma);
    let mut mb = mallory_client.connect(now, &mut rng, "bob").map_err(err)?;
    let mut b = server.accept();
    let _ = pump(&mut mb, &mut b);
    println!(
        "    without authentication both connect, but alice sees {} and bob sees {}:",
        short(a.session_id()),
        short(b.session_id())
    );
    println!("    the session IDs differ, so any comparison of them (by the application, or");
    println!("    by a person reading them out) exposes mallory.");

    // With a pre-shared key, mallory cannot finish either handshake.
    let psk = || Secret::from_slice(b"a 32-byte key shared in advance!");
    let alice_psk = Client::new(provider, ClientConfig::new(ClientAuth::Psk(psk())));
    let mut mallory_config = ServerConfig::new();
    mallory_config.auth_modes = vec![AuthMode::Psk];
    mallory_config.psk = Some(Secret::from_slice(b"mallory guesses a key, wrongly.."));
    let mallory_psk = Server::new(provider, mallory_config);
    let mut a = alice_psk.connect(now, &mut rng, "bob").map_err(err)?;
    let mut ma = mallory_psk.accept();
    let (cr, _, _) = pump(&mut a, &mut ma);
    println!(
        "    with a pre-shared key (--auth psk), alice refuses: {}",
        cr.err().map_or_else(|| "?".into(), |e| e.to_string())
    );
    println!("    (a server signature, --auth signature with a pinned key, or a password");
    println!("    through SPAKE2 stop mallory the same way.)");
    println!();
    Ok(exported)
}
