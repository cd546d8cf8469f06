//! The group act of `cohort demo`: four members with fresh identities form a secure group in
//! the deterministic simulator, talk on both channels, one crashes, and the survivors notice,
//! install a view without it and rekey. A table shows each member's view, key epoch and
//! deliveries. The same `GroupMember` runs over UDP in `cohort group run`.

use crate::UsageError;
use cohort_channel::identity::Identity;
use cohort_crypto::{CryptoProvider, Secret};
use cohort_group::{Channel, GroupConfig, GroupEvent, GroupMember, MemberId, View};
use cohort_sim::{NodeId, Sim, SimConfig};
use rand_core::{RngCore, SeedableRng};
use std::collections::BTreeMap;
use std::time::Duration;

const NAMES: [&str; 4] = ["alice", "bob", "carol", "dave"];
/// Messages each member sends on each channel in each round of talk.
const MESSAGES: u64 = 5;

fn fail(what: &str) -> impl Fn(cohort_sim::SimFailure) -> UsageError + '_ {
    move |e| UsageError(format!("demo group: {what}: {e}"))
}

/// `alice (1a2b3c4d)` for a member, `? (..)` for a stranger.
fn who(ids: &[MemberId], id: &MemberId) -> String {
    let short = hex::encode(&id.as_bytes()[..4]);
    match ids.iter().position(|m| m == id) {
        Some(i) => format!("{} ({short})", NAMES[i]),
        None => format!("? ({short})"),
    }
}

fn view_members(ids: &[MemberId], view: &View) -> String {
    view.ids()
        .map(|id| match ids.iter().position(|m| *m == id) {
            Some(i) => NAMES[i].to_string(),
            None => hex::encode(&id.as_bytes()[..4]),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether every node in `nodes` has installed the same view of `n` members with a key
/// epoch above `epoch`.
fn agreed(sim: &Sim<GroupMember>, nodes: &[NodeId], n: usize, epoch: u64) -> bool {
    let views: Vec<Option<&View>> = nodes.iter().map(|id| sim.node(*id).view()).collect();
    match views.first() {
        Some(Some(first)) => views.iter().all(|v| {
            v.is_some_and(|v| v.id == first.id && v.members.len() == n && v.key_epoch > epoch)
        }),
        _ => false,
    }
}

/// Whether `nodes` share one view of `n` members and one key, and none is changing views.
fn one_key(sim: &Sim<GroupMember>, nodes: &[NodeId], n: usize) -> bool {
    let first = sim.node(nodes[0]);
    let (Some(view), Some(key)) = (first.view(), first.key_fingerprint()) else {
        return false;
    };
    view.members.len() == n
        && nodes.iter().all(|id| {
            let m = sim.node(*id);
            !m.status().changing_view
                && m.view().is_some_and(|v| v.id == view.id)
                && m.key_fingerprint() == Some(key)
        })
}

/// Runs the act with the simulator seeded by `seed`.
pub fn run(seed: u64, verbose: bool) -> Result<(), UsageError> {
    let provider = CryptoProvider::default_provider();
    // Fresh identities, from the seed so the same seed tells the same story.
    let mut keys = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x0067_726f_7570); // "group"
    let mut identities = Vec::new();
    for _ in NAMES {
        let mut secret = Secret::zeroed(32);
        keys.fill_bytes(secret.expose_mut());
        identities.push(
            Identity::from_secret(&provider, secret)
                .map_err(|e| UsageError(format!("demo group: identity: {e}")))?,
        );
    }
    let ids: Vec<MemberId> = identities.iter().map(|i| MemberId(i.public())).collect();
    let mut config = GroupConfig::new("demo", ids.clone());
    config.heartbeat_interval = Duration::from_millis(50);
    config.suspect_timeout = Duration::from_millis(300);
    config.flush_timeout = Duration::from_millis(200);

    let mut sim = Sim::new(SimConfig {
        latency: Duration::from_millis(5),
        jitter: Duration::from_millis(1),
        log_packets: false,
        ..SimConfig::with_seed(seed)
    });
    let nodes: Vec<NodeId> = (0..NAMES.len()).map(NodeId::from_index).collect();
    for (identity, node) in identities.into_iter().zip(&nodes) {
        let mut member_seed = [0u8; 32];
        sim.rng().fill_bytes(&mut member_seed);
        let member = GroupMember::new(provider, identity, node.addr(), config.clone(), member_seed)
            .map_err(|e| UsageError(format!("demo group: {e}")))?;
        sim.add_node(member);
    }

    println!();
    println!("cohort demo, part 3: a secure group of four (seed {seed})");
    println!();
    println!(
        "  {} members with fresh Ed25519 identities, each trusting the others, join a group",
        NAMES.len()
    );
    println!("  named \"demo\" over a simulated network (5 ms latency). Every packet is encrypted");
    println!(
        "  with the group's key (aes-128-gcm); a fresh key is sent whenever membership changes."
    );
    println!("  Then one member crashes, and later the network splits and heals: the two sides");
    println!("  hold different keys, hand one over (Ensemble's Exchange) and merge.");
    println!();
    for node in &nodes {
        let contacts: Vec<_> = nodes
            .iter()
            .filter(|n| *n != node)
            .map(|n| n.addr())
            .collect();
        sim.with_node(*node, |m, now| m.start(now, &contacts));
    }
    let mut seen = 0;
    let mut story = Story::default();
    sim.run_until_cond(Duration::from_secs(20), |s| agreed(s, &nodes, 4, 0))
        .map_err(fail("forming the group"))?;
    story.read(&sim, &ids, &mut seen, verbose);

    println!(
        "{}  ** everyone talks: {MESSAGES} reliable and {MESSAGES} unreliable messages each",
        sim.now()
    );
    talk(&mut sim, &nodes, "hello");
    sim.run_for(Duration::from_millis(500))
        .map_err(fail("talking"))?;
    story.read(&sim, &ids, &mut seen, verbose);

    // The member ranked third crashes: not the leader, so the sequencer stays put.
    let victim = sim
        .node(nodes[0])
        .view()
        .and_then(|v| v.members.get(2))
        .and_then(|m| nodes.iter().find(|n| n.addr() == m.addr).copied())
        .unwrap_or(nodes[2]);
    let epoch = sim.node(nodes[0]).view().map_or(0, |v| v.key_epoch);
    println!("{}  ** {} crashes", sim.now(), NAMES[victim.index()]);
    sim.crash(victim);
    let survivors: Vec<NodeId> = nodes.iter().copied().filter(|n| *n != victim).collect();
    let crashed_at = sim.now();
    let noticed = sim
        .run_until_cond(Duration::from_secs(10), |s| agreed(s, &survivors, 3, epoch))
        .map_err(fail("noticing the crash"))?;
    story.read(&sim, &ids, &mut seen, verbose);
    println!(
        "{}  ** the survivors agree on a view of 3 with a fresh key, {:?} after the crash",
        noticed,
        noticed - crashed_at
    );
    println!("{}  ** the survivors talk again", sim.now());
    talk(&mut sim, &survivors, "again");
    sim.run_for(Duration::from_millis(500))
        .map_err(fail("talking after the crash"))?;
    story.read(&sim, &ids, &mut seen, verbose);

    // A partition cuts one survivor off; each side goes on with its own view and key.
    // When the network heals, the leaders' gossip shows different keys: the lower
    // principal seals its key to the other leader (Exchange), which installs it with an
    // empty view change, and the smaller side then joins the larger without a fresh key.
    let alone = survivors[2];
    let rest: Vec<NodeId> = survivors[..2].to_vec();
    println!(
        "{}  ** the network splits: {} is cut off from the others",
        sim.now(),
        NAMES[alone.index()]
    );
    sim.partition(&[&rest, &[alone]]);
    sim.run_until_cond(Duration::from_secs(10), |s| {
        one_key(s, &rest, 2) && one_key(s, &[alone], 1)
    })
    .map_err(fail("splitting"))?;
    story.read(&sim, &ids, &mut seen, verbose);
    println!("{}  ** the network heals", sim.now());
    sim.heal();
    let healed_at = sim.now();
    let merged = sim
        .run_until_cond(Duration::from_secs(10), |s| one_key(s, &survivors, 3))
        .map_err(fail("merging"))?;
    story.read(&sim, &ids, &mut seen, verbose);
    println!(
        "{}  ** one view and one key again, {:?} after the heal",
        merged,
        merged - healed_at
    );
    talk(&mut sim, &survivors, "merged");
    sim.run_for(Duration::from_millis(500))
        .map_err(fail("talking after the merge"))?;
    story.read(&sim, &ids, &mut seen, verbose);

    println!();
    println!("summary after {} of virtual time:", sim.now());
    println!(
        "  {:<16} {:<12} {:<24} {:>5} {:>9} {:>11}",
        "member", "view", "members (by rank)", "epoch", "reliable", "unreliable"
    );
    for node in &nodes {
        let member = sim.node(*node);
        let (view_id, members, epoch) = match member.view() {
            Some(v) => (
                v.id.to_string(),
                view_members(&ids, v),
                v.key_epoch.to_string(),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        let counts = story
            .delivered
            .get(&node.index())
            .copied()
            .unwrap_or_default();
        let crashed = if sim.is_crashed(*node) {
            " (crashed)"
        } else {
            ""
        };
        println!(
            "  {:<16} {:<12} {:<24} {:>5} {:>9} {:>11}{crashed}",
            who(&ids, &member.id()),
            view_id,
            members,
            epoch,
            counts.0,
            counts.1
        );
    }
    let orders: Vec<&Vec<(MemberId, u64)>> = survivors
        .iter()
        .filter_map(|n| story.order.get(&n.index()))
        .collect();
    let same = orders.windows(2).all(|w| w[0] == w[1]);
    println!();
    println!(
        "  reliable messages in the same order at every survivor: {}",
        if same && orders.len() == survivors.len() {
            "yes"
        } else {
            "NO"
        }
    );
    let keeper = survivors[0];
    let keys: Vec<String> = sim
        .node(keeper)
        .key_ledger()
        .iter()
        .map(|(epoch, print)| format!("{epoch}:{}", hex::encode(print)))
        .collect();
    println!(
        "  keys {} held (epoch:fingerprint): {}",
        NAMES[keeper.index()],
        keys.join(" ")
    );
    Ok(())
}

/// Every node in `nodes` sends `MESSAGES` reliable and `MESSAGES` unreliable messages.
fn talk(sim: &mut Sim<GroupMember>, nodes: &[NodeId], word: &str) {
    for node in nodes {
        for i in 0..MESSAGES {
            let text = format!("{word} #{i} from {}", NAMES[node.index()]);
            for channel in [Channel::Reliable, Channel::Unreliable] {
                // A full window refuses; the demo's few messages fit the default window.
                let _ = sim.with_node(*node, |m, now| m.send(now, channel, text.as_bytes()));
            }
        }
    }
}

/// What the log has told so far.
#[derive(Default)]
struct Story {
    /// Per node: (reliable, unreliable) deliveries.
    delivered: BTreeMap<usize, (u64, u64)>,
    /// Per node: reliable deliveries in order, as (sender, seq).
    order: BTreeMap<usize, Vec<(MemberId, u64)>>,
}

impl Story {
    /// Narrates the events after the first `seen`.
    fn read(&mut self, sim: &Sim<GroupMember>, ids: &[MemberId], seen: &mut usize, verbose: bool) {
        for (at, node, event) in sim.events().skip(*seen) {
            *seen += 1;
            let name = NAMES.get(node.index()).copied().unwrap_or("?");
            match event {
                GroupEvent::View(view) => println!(
                    "{at}  {name:<5} installs view {} [{}], key epoch {}",
                    view.id,
                    view_members(ids, view),
                    view.key_epoch
                ),
                GroupEvent::Deliver {
                    channel,
                    sender,
                    seq,
                    data,
                    ..
                } => {
                    let counts = self.delivered.entry(node.index()).or_default();
                    if *channel == Channel::Reliable {
                        counts.0 += 1;
                        self.order
                            .entry(node.index())
                            .or_default()
                            .push((*sender, *seq));
                    } else {
                        counts.1 += 1;
                    }
                    if verbose {
                        println!(
                            "{at}  {name:<5} delivers {} #{seq} from {}: {}",
                            channel.name(),
                            who(ids, sender),
                            String::from_utf8_lossy(data)
                        );
                    }
                }
                GroupEvent::Rekeyed {
                    key_epoch,
                    members,
                    took,
                } => {
                    if let Some(took) = took {
                        println!(
                            "{at}  {name:<5} rekeyed: epoch {key_epoch} for {members} members in {took:?}"
                        );
                    } else if verbose {
                        println!("{at}  {name:<5} installs key epoch {key_epoch}");
                    }
                }
                GroupEvent::Removed { member, reason } => println!(
                    "{at}  {name:<5} sees {} removed ({})",
                    who(ids, member),
                    reason.name()
                ),
                GroupEvent::Expelled { reason } => {
                    println!("{at}  {name:<5} is out of the group ({})", reason.name())
                }
                GroupEvent::Insecure { from } => {
                    if verbose {
                        println!("{at}  {name:<5} got a packet under an unknown key from {from}");
                    }
                }
                GroupEvent::TicketSent { to } => println!(
                    "{at}  {name:<5} seals its group key to {} (Exchange ticket)",
                    who(ids, to)
                ),
                GroupEvent::KeyExchanged { from, .. } => println!(
                    "{at}  {name:<5} takes the key of {} with an empty view change",
                    who(ids, from)
                ),
                GroupEvent::Merging { leader, .. } => println!(
                    "{at}  {name:<5} holds the same key as {}'s larger component and merges into it",
                    who(ids, leader)
                ),
                GroupEvent::TrustChanged { .. } => {}
                GroupEvent::Refused { addr, reason } => {
                    println!("{at}  {name:<5} refused {addr}: {reason}")
                }
                other => println!("{at}  {name:<5} {other:?}"),
            }
        }
    }
}
