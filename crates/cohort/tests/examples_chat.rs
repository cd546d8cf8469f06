//! The chat example's test: three members on loopback, each running the example's own chat
//! loop (`examples/chat/session.rs`, included here) with its input and output in memory; a
//! line typed at one appears at the others with its sender, and joins and leaves print views.
//!
//! Why in-process and not three `chat` processes: the loop is the whole example besides
//! argument parsing, and running it here needs no built example binary (`cargo test --test
//! examples_chat` does not build examples, and their path under `target/` depends on the
//! profile and target triple). Each member runs on its own tokio runtime, as a process would
//! have its own, so that one member stopping stops only its tasks. The `setup` module is
//! tested too: its config files load and form a group.
#![allow(clippy::unwrap_used, clippy::expect_used)] // reason: test code; a panic is the failure report

#[path = "../examples/chat/session.rs"]
mod session;
#[path = "../examples/chat/setup.rs"]
mod setup;

use cohort::group::{Group, GroupConfig, MemberId};
use cohort_channel::identity::Identity;
use cohort_crypto::CryptoProvider;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream};
use tokio::runtime::Runtime;

/// How long a line may take to show up.
const WAIT: Duration = Duration::from_secs(15);

/// One chat member: its own runtime, the write end of its input, the lines it printed.
struct Member {
    rt: Option<Runtime>,
    input: Option<DuplexStream>,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    id: MemberId,
    addr: SocketAddr,
}

impl Member {
    fn start(config: GroupConfig) -> Member {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (group, events) = {
            let _in_rt = rt.enter();
            Group::start(config).unwrap()
        };
        let (id, addr) = (group.id(), group.local_addr());
        let (input, member_in) = tokio::io::duplex(1 << 16);
        let (member_out, output) = tokio::io::duplex(1 << 16);
        rt.spawn(async move {
            session::run(group, events, BufReader::new(member_in), member_out)
                .await
                .unwrap();
        });
        let (tx, lines) = mpsc::channel();
        rt.spawn(async move {
            let mut out = BufReader::new(output).lines();
            while let Ok(Some(line)) = out.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Member {
            rt: Some(rt),
            input: Some(input),
            lines,
            seen: Vec::new(),
            id,
            addr,
        }
    }

    fn type_line(&mut self, line: &str) {
        let input = self.input.as_mut().unwrap();
        self.rt
            .as_ref()
            .unwrap()
            .block_on(input.write_all(format!("{line}\n").as_bytes()))
            .unwrap();
    }

    /// Waits for a printed line that `want` accepts; returns it.
    fn wait(&mut self, what: &str, want: impl Fn(&str) -> bool) -> String {
        if let Some(l) = self.seen.iter().find(|l| want(l)) {
            return l.clone();
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if want(&line) {
                        return line;
                    }
                }
                Err(_) => panic!("no line {what} within {WAIT:?}; saw {:#?}", self.seen),
            }
        }
    }

    /// Ends the member's input: the chat leaves the group.
    fn close_input(&mut self) {
        self.input = None;
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

fn identities(n: usize) -> Vec<Identity> {
    let provider = CryptoProvider::default_provider();
    (0..n)
        .map(|_| Identity::generate(&provider).unwrap())
        .collect()
}

fn config(identity: Identity, trust: &[MemberId], peer: Option<SocketAddr>) -> GroupConfig {
    let mut b = GroupConfig::builder("chat-test")
        .identity(identity)
        .listen("127.0.0.1:0".parse().unwrap())
        .trust(trust.iter().copied())
        .heartbeat(Duration::from_millis(50))
        .suspect_timeout(Duration::from_millis(600))
        .flush_timeout(Duration::from_millis(300));
    if let Some(p) = peer {
        b = b.peer(p);
    }
    b.build().unwrap()
}

fn view_of(n: usize) -> impl Fn(&str) -> bool {
    move |l: &str| {
        l.starts_with("* view ") && l.split(": ").nth(1).map(|m| m.split(' ').count()) == Some(n)
    }
}

#[test]
fn a_line_typed_at_one_member_appears_at_the_others() {
    let ids = identities(3);
    let trust: Vec<MemberId> = ids.iter().map(|i| MemberId(i.public())).collect();
    let mut ids = ids.into_iter();
    let mut a = Member::start(config(ids.next().unwrap(), &trust, None));
    a.wait("joined", |l| l.starts_with("* joined as "));
    let mut b = Member::start(config(ids.next().unwrap(), &trust, Some(a.addr)));
    let mut c = Member::start(config(ids.next().unwrap(), &trust, Some(a.addr)));
    for m in [&mut a, &mut b, &mut c] {
        m.wait("a view of 3", view_of(3));
    }
    // The view lists every member by its short id.
    let view = a.wait("a view of 3", view_of(3));
    for m in &trust {
        assert!(view.contains(&session::short(m)), "{view}");
    }

    a.type_line("hello from a");
    let from_a = format!("[{}] hello from a", session::short(&a.id));
    for m in [&mut a, &mut b, &mut c] {
        m.wait(&from_a, |l| l == from_a);
    }
    c.type_line("and from c");
    let from_c = format!("[{}] and from c", session::short(&c.id));
    for m in [&mut a, &mut b, &mut c] {
        m.wait(&from_c, |l| l == from_c);
    }
    // Lines are delivered in one order everywhere: b and c saw a's line before c's.
    for m in [&b, &c] {
        let pos = |s: &str| m.seen.iter().position(|l| l == s).unwrap();
        assert!(pos(&from_a) < pos(&from_c));
    }

    // End of input: c leaves; the others print the smaller view.
    c.close_input();
    for m in [&mut a, &mut b] {
        m.wait("a view of 2", view_of(2));
    }
    b.type_line("c is gone");
    let from_b = format!("[{}] c is gone", session::short(&b.id));
    a.wait(&from_b, |l| l == from_b);
}

/// `chat setup` writes configs that load and form a group (on ports picked free here).
#[test]
fn setup_writes_configs_that_form_a_group() {
    let dir = std::env::temp_dir().join(format!("cohort-chat-setup-{}", std::process::id()));
    // Two free ports in a row are not guaranteed; try a few bases.
    let base = (0..20)
        .map(|k| 20_000 + (std::process::id() % 20_000) as u16 + k * 7)
        .find(|b| {
            std::net::UdpSocket::bind(("127.0.0.1", *b)).is_ok()
                && std::net::UdpSocket::bind(("127.0.0.1", b + 1)).is_ok()
        })
        .unwrap();
    let paths = setup::write(&dir, 2, base).unwrap();
    assert_eq!(paths.len(), 2);
    let configs: Vec<GroupConfig> = paths
        .iter()
        .map(|p| GroupConfig::load(std::path::Path::new(p)).unwrap())
        .collect();
    let mut members: Vec<Member> = configs.into_iter().map(Member::start).collect();
    for m in &mut members {
        m.wait("a view of 2", view_of(2));
    }
    members[0].type_line("hi");
    let want = format!("[{}] hi", session::short(&members[0].id));
    members[1].wait(&want, |l| l == want);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("m0.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    drop(members);
    std::fs::remove_dir_all(&dir).unwrap();
}
