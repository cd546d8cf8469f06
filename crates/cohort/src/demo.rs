//! `cohort demo`: first a secure channel (handshake, resumption, a man in the middle; see
//! `demo_channel`), then two in-process peers, keyed by that channel, exchange gear-protected
//! packets in the deterministic simulator while the controller reacts to a CPU spike and to
//! a forgery burst; then a secure group of four survives a crash (see `demo_group`); last,
//! forged packets die at the first relay of a hop-by-hop authenticated path (see `demo_hop`).

use crate::UsageError;
use clap::Args;
use cohort_core::Timestamp;
use cohort_crypto::CryptoProvider;
use cohort_gears::link::{GearLink, LinkConfig, LinkEvent, Role};
use cohort_gears::{DropReason, GearId, GearKeys, GearSet, Protector};
use cohort_sim::{NodeId, Sim, SimConfig};
use std::time::Duration;

#[derive(Args)]
pub struct DemoArgs {
    /// Simulator seed (the same seed prints the same story).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print every delivered packet, not just the story.
    #[arg(long)]
    verbose: bool,
}

const ALICE: NodeId = NodeId::from_index(0);
const BOB: NodeId = NodeId::from_index(1);
const SEND_EVERY: Duration = Duration::from_millis(20);

/// What happens when, in virtual time.
#[derive(Clone, Copy, Debug)]
enum Cue {
    AliceLoad(f32),
    BobLoad(f32),
    Forgeries(u32),
}

const SCRIPT: &[(u64, Cue, &str)] = &[
    (
        0,
        Cue::AliceLoad(0.30),
        "alice's CPU is lightly loaded (30%)",
    ),
    (
        1_000,
        Cue::AliceLoad(0.95),
        "a batch job pins alice's CPU at 95%",
    ),
    (
        5_000,
        Cue::BobLoad(0.92),
        "bob gets busy too (92%): he checks the fast tag, not the strong one",
    ),
    (
        6_500,
        Cue::BobLoad(0.20),
        "bob is idle again: he checks the strong tag",
    ),
    (
        7_000,
        Cue::Forgeries(12),
        "an attacker injects 12 forged packets aimed at bob",
    ),
    (15_000, Cue::AliceLoad(0.20), "alice's batch job ends (20%)"),
];
const END_MS: u64 = 19_000;

pub fn run(args: &DemoArgs) -> Result<(), UsageError> {
    let provider = CryptoProvider::default_provider();
    // The gears story runs on a secret exported from the channel of part 1.
    let exported = crate::demo_channel::run(args.seed)?;
    let secret = exported.expose();
    let gears: GearSet = [
        GearId::HmacSha256,
        GearId::Umac128,
        GearId::Umac96,
        GearId::Umac64,
        GearId::Umac32,
    ]
    .into_iter()
    .collect();
    let floor = 30.0;
    let mut config = LinkConfig::new(floor, gears);
    config.companion_strong_tag = true;
    config.controller.dwell = Duration::from_millis(800);
    config.controller.failure_burst = 8;
    config.controller.failure_window = Duration::from_secs(2);
    config.controller.failure_hold = Duration::from_secs(3);

    let link = |role, peer: NodeId| {
        GearLink::new(
            &provider,
            secret,
            role,
            peer.addr(),
            config.clone(),
            Timestamp::ZERO,
        )
        .map_err(|e| UsageError(format!("demo link: {e}")))
    };
    let mut sim_config = SimConfig::with_seed(args.seed);
    sim_config.latency = Duration::from_millis(5);
    sim_config.jitter = Duration::from_millis(1);
    let mut sim = Sim::new(sim_config);
    sim.add_node(link(Role::Initiator, BOB)?);
    sim.add_node(link(Role::Responder, ALICE)?);

    println!(
        "cohort demo, part 2: ACSA authentication gears between two peers (seed {})",
        args.seed
    );
    println!();
    println!("  alice sends bob a 1200-byte packet every 20 ms over a simulated network.");
    println!("  they agreed on these gears, strongest first, with a floor of {floor} bits:");
    for g in sim.node(ALICE).controller().ladder() {
        println!("    {:<12} {:>5.0} bits", g.name(), g.info().forgery_bits);
    }
    println!("  each packet carries the current gear's tag and, when that is not the strongest,");
    println!("  an hmac-sha256 tag too; bob verifies whichever his own load allows (ACSA 3.4).");
    println!("  bob reports his load and failed verifications to alice every 100 ms; both ends");
    println!("  run a controller for what they send, so bob's follows alice's reported load.");
    println!();

    let mut script = SCRIPT.iter().peekable();
    let mut seen = 0usize;
    let mut stats = Stats::default();
    let mut next_send = Timestamp::ZERO;
    let end = Timestamp::from_millis(END_MS);
    while sim.now() < end {
        while let Some(&&(at, cue, text)) = script.peek() {
            if Timestamp::from_millis(at) > sim.now() {
                break;
            }
            script.next();
            println!("{}  ** {text}", sim.now());
            match cue {
                Cue::AliceLoad(l) => sim.with_node(ALICE, |m, _| m.set_local_load(l)),
                Cue::BobLoad(l) => sim.with_node(BOB, |m, _| m.set_local_load(l)),
                Cue::Forgeries(n) => {
                    let gear = sim.node(ALICE).current_gear();
                    forge(&mut sim, n, gears, gear);
                    stats.forged += u64::from(n);
                }
            }
        }
        if sim.now() >= next_send {
            let payload = vec![0x42u8; 1200];
            if sim.with_node(ALICE, |m, _| m.send(&payload)).is_ok() {
                stats.sent += 1;
            }
            next_send = sim.now() + SEND_EVERY;
        }
        let until = next_send.min(
            script
                .peek()
                .map_or(end, |&&(at, _, _)| Timestamp::from_millis(at)),
        );
        sim.run_until(until.min(end))
            .map_err(|e| UsageError(format!("simulation: {e}")))?;
        for (at, node, event) in sim.events().skip(seen) {
            seen += 1;
            narrate(at, node, event, args.verbose, &mut stats);
        }
    }

    let counters = *sim.node(BOB).counters();
    println!();
    println!("summary after {} of virtual time:", sim.now());
    println!("  packets alice sent:        {}", stats.sent);
    println!("  delivered to bob:          {}", stats.delivered);
    println!("    verified by tag:         {}", stats.by_gear_summary());
    println!("  forged packets injected:   {}", stats.forged);
    println!("  forged packets accepted:   {}", stats.forged_delivered);
    println!(
        "  bob dropped:               {} auth-failed, {} replayed, {} other",
        counters.auth_failed,
        counters.replayed,
        counters.dropped() - counters.auth_failed - counters.replayed
    );
    println!("  gear shifts at alice:      {}", stats.shifts);
    println!();
    println!(
        "see `cohort gears list` for every gear and `cohort gears bench` for their speed here."
    );
    crate::demo_group::run(args.seed, args.verbose)?;
    crate::demo_hop::run(args.seed, args.verbose)
}

/// Packets that look like alice's (her gears, fresh sequence numbers) but carry tags made
/// with a key the attacker guessed.
fn forge(sim: &mut Sim<GearLink>, n: u32, gears: GearSet, gear: GearId) {
    let provider = CryptoProvider::default_provider();
    let Ok(keys) = GearKeys::derive(&provider, &[0x66u8; 32], gears) else {
        return;
    };
    let mut forger = Protector::new(keys);
    for i in 0..n {
        let mut packet = Vec::new();
        let seq = 1_000_000 + u64::from(i);
        if forger
            .protect_with_seq(seq, &[gear], &[1], b"pay the attacker", &mut packet)
            .is_ok()
        {
            sim.inject(
                ALICE.addr(),
                BOB,
                packet,
                Duration::from_millis(u64::from(i) * 3),
            );
        }
    }
}

#[derive(Default)]
struct Stats {
    sent: u64,
    delivered: u64,
    forged: u64,
    forged_delivered: u64,
    shifts: u64,
    auth_drops_shown: u64,
    by_gear: Vec<(GearId, u64)>,
}

impl Stats {
    fn by_gear_summary(&self) -> String {
        self.by_gear
            .iter()
            .map(|(g, n)| format!("{} {n}", g.name()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn narrate(at: Timestamp, node: NodeId, event: &LinkEvent, verbose: bool, stats: &mut Stats) {
    let who = if node == ALICE { "alice" } else { "bob  " };
    match event {
        LinkEvent::Delivered {
            seq,
            verified_by,
            gears,
            payload,
        } => {
            if node == BOB {
                stats.delivered += 1;
                if payload.as_slice() == b"pay the attacker" {
                    stats.forged_delivered += 1;
                }
                match stats.by_gear.iter_mut().find(|(g, _)| g == verified_by) {
                    Some((_, n)) => *n += 1,
                    None => stats.by_gear.push((*verified_by, 1)),
                }
            }
            if verbose {
                let names: Vec<_> = gears.as_slice().iter().map(|g| g.name()).collect();
                println!(
                    "{at}  {who} got #{seq} tagged [{}], verified {}",
                    names.join(", "),
                    verified_by.name()
                );
            }
        }
        LinkEvent::GearShifted(shift) => {
            if node == ALICE {
                stats.shifts += 1;
            }
            println!(
                "{at}  {who} gear {} -> {} ({})",
                shift.from.name(),
                shift.to.name(),
                shift.reason
            );
        }
        LinkEvent::Dropped { reason } => {
            if *reason == DropReason::AuthFailed {
                stats.auth_drops_shown += 1;
            }
            if verbose || (*reason == DropReason::AuthFailed && stats.auth_drops_shown <= 3) {
                println!("{at}  {who} dropped a packet: {reason}");
            } else if stats.auth_drops_shown == 4 {
                println!("{at}  {who} ... (further auth-failed drops counted in the summary)");
            }
        }
        LinkEvent::PeerRetiredLastGear(gear) => {
            println!(
                "{at}  {who} peer retired {gear}, the last gear left: the link needs a new key"
            );
        }
        LinkEvent::Feedback {
            load,
            auth_failures,
        } => {
            if verbose {
                println!("{at}  {who} feedback: peer load {load:.2}, {auth_failures} failures");
            }
        }
        other => {
            if verbose {
                println!("{at}  {who} {other:?}");
            }
        }
    }
}
