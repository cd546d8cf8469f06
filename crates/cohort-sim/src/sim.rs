//! The simulator: nodes, the wire between them, and the virtual clock.

use crate::config::SimConfig;
use crate::fault::{below, duration_in, FaultRule, PacketView, Verdict};
use crate::log::{Counters, DropReason, LogEntry, LogKind, PacketId};
use crate::node::{NodeId, MAX_NODES};
use crate::seeds::{FailureKind, SimFailure};
use cohort_core::{Machine, Timestamp};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

/// The simulator's RNG: every random choice of a run comes from one of these, seeded from
/// [`SimConfig::seed`].
pub type SimRng = ChaCha8Rng;

/// A handle to a fault rule added with [`Sim::add_rule`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RuleId(u64);

/// A deterministic network of `M` machines on a virtual clock.
///
/// # How a run proceeds
/// The clock starts at [`Timestamp::ZERO`] and only moves when a step takes it straight to
/// the next event: the earliest datagram arrival or the earliest node deadline
/// (`poll_timeout`). At equal times, arrivals go first, in the order they were scheduled,
/// then deadlines in node order. After every input (an arrival, a timeout, or a command
/// given through [`Sim::with_node`]) the node is drained in the order [`Machine`]
/// documents: `poll_transmit` until `None`, then `poll_event` until `None`, then
/// `poll_timeout`.
///
/// A datagram a node sends is, in order: logged as sent; dropped if no node has its
/// address, if it exceeds the MTU, or if a partition separates the two nodes; judged by the
/// fault rules (first non-[`Verdict::Pass`] wins); and scheduled to arrive after
/// `latency + [0, jitter]` plus whatever the verdict adds. On arrival it is dropped if the
/// destination has crashed or a partition made since cuts it off; otherwise it is handed to
/// `handle_datagram`.
///
/// All randomness comes from one ChaCha RNG seeded from [`SimConfig::seed`], and nothing
/// depends on hash order or the real clock, so one seed always gives the same [`Sim::log`].
///
/// # Methods
/// Getters take `&self`; `add_*`, `partition`, `crash`, ... change the network; `step` and
/// `run_*` move time; `with_node` and `node_mut` give commands to one machine.
pub struct Sim<M: Machine> {
    config: SimConfig,
    rng: SimRng,
    now: Timestamp,
    nodes: Vec<Node<M>>,
    /// Datagrams in flight, by arrival time and then scheduling order.
    wire: BTreeMap<(Timestamp, u64), InFlight>,
    next_seq: u64,
    /// Each live node's next deadline.
    deadlines: BTreeSet<(Timestamp, NodeId)>,
    rules: Vec<(RuleId, Box<dyn FaultRule>)>,
    next_rule: u64,
    next_packet: u64,
    /// Partition component of each node, when partitioned.
    components: Option<Vec<usize>>,
    next_component: usize,
    log: Vec<LogEntry<M::Event>>,
    counters: Counters,
    buf: Vec<u8>,
    /// Indexes of the nodes touched through `node_mut` since the last flush (each node's
    /// `dirty` flag says whether it still needs draining), so that a flush costs the nodes
    /// touched, not every node: `step` flushes before every event.
    touched: Vec<usize>,
}

struct Node<M> {
    machine: M,
    /// The deadline this node has in `Sim::deadlines`.
    deadline: Option<Timestamp>,
    crashed: bool,
    /// Touched through `node_mut` and not yet drained.
    dirty: bool,
}

struct InFlight {
    packet: PacketId,
    from: SocketAddr,
    to: NodeId,
    bytes: Vec<u8>,
    /// Put there by the test: not subject to partitions.
    injected: bool,
}

impl<M> Sim<M>
where
    M: Machine,
    M::Event: fmt::Debug,
{
    /// An empty network at time zero.
    pub fn new(config: SimConfig) -> Self {
        Sim {
            rng: SimRng::seed_from_u64(config.seed),
            config,
            now: Timestamp::ZERO,
            nodes: Vec::new(),
            wire: BTreeMap::new(),
            next_seq: 0,
            deadlines: BTreeSet::new(),
            rules: Vec::new(),
            next_rule: 0,
            next_packet: 0,
            components: None,
            next_component: 0,
            log: Vec::new(),
            counters: Counters::default(),
            buf: Vec::with_capacity(65_536),
            touched: Vec::new(),
        }
    }

    /// An empty network with the default configuration and this seed.
    pub fn with_seed(seed: u64) -> Self {
        Sim::new(SimConfig::with_seed(seed))
    }

    // ---- getters ------------------------------------------------------------------------

    /// The seed that replays this run.
    pub fn seed(&self) -> u64 {
        self.config.seed
    }

    /// The configuration.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// Virtual time.
    pub fn now(&self) -> Timestamp {
        self.now
    }

    /// How many nodes have been added.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Every node, in the order added.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> {
        (0..self.nodes.len()).map(NodeId::from_index)
    }

    /// A node's address (see [`NodeId::addr`]).
    pub fn addr(&self, id: NodeId) -> SocketAddr {
        id.addr()
    }

    /// The node at `addr`, if this simulation has it.
    pub fn node_by_addr(&self, addr: SocketAddr) -> Option<NodeId> {
        NodeId::from_addr(addr).filter(|id| id.index() < self.nodes.len())
    }

    /// A node's machine, to inspect.
    ///
    /// # Panics
    /// If `id` is not a node of this simulation (as every method taking a `NodeId`).
    pub fn node(&self, id: NodeId) -> &M {
        &self.nodes[self.check_id(id)].machine
    }

    /// Whether the node is crashed.
    pub fn is_crashed(&self, id: NodeId) -> bool {
        self.nodes[self.check_id(id)].crashed
    }

    /// Whether a datagram from `a` would reach `b` under the current partition.
    pub fn can_reach(&self, a: NodeId, b: NodeId) -> bool {
        self.check_id(a);
        self.check_id(b);
        match &self.components {
            None => true,
            Some(c) => a == b || c[a.index()] == c[b.index()],
        }
    }

    /// The groups of nodes that can reach each other, each in node order, ordered by their
    /// first node. One group of every node when there is no partition.
    pub fn components(&self) -> Vec<Vec<NodeId>> {
        let mut groups: BTreeMap<usize, Vec<NodeId>> = BTreeMap::new();
        let mut order = Vec::new();
        for id in self.node_ids() {
            let c = self.components.as_ref().map_or(0, |c| c[id.index()]);
            let group = groups.entry(c).or_default();
            if group.is_empty() {
                order.push(c);
            }
            group.push(id);
        }
        order
            .into_iter()
            .filter_map(|c| groups.remove(&c))
            .collect()
    }

    /// Everything that has happened, in order.
    pub fn log(&self) -> &[LogEntry<M::Event>] {
        &self.log
    }

    /// The events nodes reported, in order: `(when, which node, event)`.
    pub fn events(&self) -> impl Iterator<Item = (Timestamp, NodeId, &M::Event)> + '_ {
        self.log.iter().filter_map(|e| match &e.kind {
            LogKind::Event(ev) => Some((e.at, e.node, ev)),
            _ => None,
        })
    }

    /// The events one node reported, in order, with their times.
    pub fn events_of(&self, id: NodeId) -> impl Iterator<Item = (Timestamp, &M::Event)> + '_ {
        self.events()
            .filter(move |(_, n, _)| *n == id)
            .map(|(at, _, ev)| (at, ev))
    }

    /// Running totals.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Datagrams scheduled but not yet arrived.
    pub fn in_flight(&self) -> usize {
        self.wire.len()
    }

    /// When the next step would happen, if anything is scheduled. Nodes changed through
    /// [`Sim::node_mut`] are only accounted for after [`Sim::flush`] (every `step` and
    /// `run_*` flushes first).
    pub fn next_event_time(&self) -> Option<Timestamp> {
        let arrival = self.wire.keys().next().map(|&(at, _)| at);
        let deadline = self.deadlines.iter().next().map(|&(at, _)| at);
        match (arrival, deadline) {
            (Some(a), Some(d)) => Some(a.min(d)),
            (a, d) => a.or(d),
        }
    }

    /// Whether nothing is scheduled: no datagram in flight and no node deadline.
    pub fn is_quiet(&self) -> bool {
        self.wire.is_empty() && self.deadlines.is_empty()
    }

    /// A failure report at the current time: the seed, `message` and the last
    /// [`SimConfig::failure_tail`] log entries.
    pub fn failure(&self, message: impl fmt::Display) -> SimFailure {
        self.failure_of(FailureKind::Check, message.to_string())
    }

    /// `Ok` if `cond` holds, else [`Sim::failure`] with `message`.
    ///
    /// ```
    /// # use cohort_sim::{Sim, SimFailure};
    /// # fn check_all(sim: &Sim<impl cohort_core::Machine<Event = u8>>) -> Result<(), SimFailure> {
    /// sim.check(sim.counters().tampered == 0, "nothing should be tampered with")?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn check(&self, cond: bool, message: impl fmt::Display) -> Result<(), SimFailure> {
        if cond {
            Ok(())
        } else {
            Err(self.failure(message))
        }
    }

    // ---- building the network -----------------------------------------------------------

    /// Adds a node running `machine`, at [`NodeId::addr`] of the returned id, and drains it
    /// (a machine may have datagrams or a deadline from the start).
    ///
    /// While the network is partitioned, a new node is isolated in a component of its own.
    ///
    /// # Panics
    /// Beyond [`MAX_NODES`](crate::MAX_NODES) nodes.
    pub fn add_node(&mut self, machine: M) -> NodeId {
        self.add_node_with(|_, _| machine)
    }

    /// Adds the node `make(id, address)` returns, for machines that must know their own
    /// address. Peers' addresses are known in advance from [`NodeId::addr`]; a machine's RNG
    /// can come from [`Sim::fork_rng`].
    pub fn add_node_with(&mut self, make: impl FnOnce(NodeId, SocketAddr) -> M) -> NodeId {
        assert!(self.nodes.len() < MAX_NODES, "cohort-sim: too many nodes");
        let id = NodeId::from_index(self.nodes.len());
        let machine = make(id, id.addr());
        self.nodes.push(Node {
            machine,
            deadline: None,
            crashed: false,
            dirty: false,
        });
        if let Some(c) = &mut self.components {
            c.push(self.next_component);
            self.next_component += 1;
        }
        self.drain(id);
        id
    }

    /// The simulation's RNG, for random choices a test makes (they are part of the seed's
    /// run).
    pub fn rng(&mut self) -> &mut SimRng {
        &mut self.rng
    }

    /// A new RNG seeded from the simulation's, to hand to a machine.
    pub fn fork_rng(&mut self) -> SimRng {
        let mut seed = <SimRng as SeedableRng>::Seed::default();
        self.rng.fill_bytes(&mut seed);
        SimRng::from_seed(seed)
    }

    /// Appends a fault rule; it is asked after the rules already there.
    pub fn add_rule(&mut self, rule: impl FaultRule + 'static) -> RuleId {
        let id = RuleId(self.next_rule);
        self.next_rule += 1;
        self.rules.push((id, Box::new(rule)));
        id
    }

    /// Removes a rule; datagrams already judged keep their verdicts. Returns the rule, or
    /// `None` if it was already removed.
    pub fn remove_rule(&mut self, id: RuleId) -> Option<Box<dyn FaultRule>> {
        let pos = self.rules.iter().position(|(r, _)| *r == id)?;
        Some(self.rules.remove(pos).1)
    }

    /// Removes every rule.
    pub fn clear_rules(&mut self) {
        self.rules.clear();
    }

    /// The names of the rules, in the order they are asked.
    pub fn rule_names(&self) -> Vec<&str> {
        self.rules.iter().map(|(_, r)| r.name()).collect()
    }

    /// Splits the network: nodes reach only nodes of their own group. Nodes that no group
    /// lists are each isolated alone. A node always reaches itself. Replaces any earlier
    /// partition; datagrams in flight across the new cut are dropped when they arrive.
    ///
    /// # Panics
    /// If a node is listed twice or is not a node of this simulation.
    pub fn partition(&mut self, groups: &[&[NodeId]]) {
        self.flush();
        let mut component = vec![usize::MAX; self.nodes.len()];
        for (g, group) in groups.iter().enumerate() {
            for &id in group.iter() {
                let i = self.check_id(id);
                assert!(
                    component[i] == usize::MAX,
                    "cohort-sim: {id} is in two partition groups"
                );
                component[i] = g;
            }
        }
        let mut next = groups.len();
        for c in component.iter_mut().filter(|c| **c == usize::MAX) {
            *c = next;
            next += 1;
        }
        self.next_component = next;
        self.components = Some(component.clone());
        if !self.config.log_partitions {
            return;
        }
        // Each component's nodes in index order, built once (not n x n reachability tests).
        let mut members: Vec<Vec<NodeId>> = vec![Vec::new(); next];
        for id in self.node_ids() {
            members[component[id.index()]].push(id);
        }
        for id in self.node_ids().collect::<Vec<_>>() {
            let reach = members[component[id.index()]].clone();
            self.record(id, LogKind::Partitioned { component: reach });
        }
    }

    /// Ends any partition: every node reaches every node again.
    pub fn heal(&mut self) {
        self.flush();
        self.components = None;
        for id in self.node_ids().collect::<Vec<_>>() {
            self.record(id, LogKind::Healed);
        }
    }

    /// Stops a node: it receives nothing (datagrams arriving are dropped and logged), its
    /// deadline is forgotten, and its outputs are no longer polled. Datagrams it sent
    /// before crashing are still delivered. Its machine stays readable with [`Sim::node`].
    pub fn crash(&mut self, id: NodeId) {
        let i = self.check_id(id);
        self.flush();
        self.nodes[i].crashed = true;
        self.set_deadline(id, None);
        self.record(id, LogKind::Crashed);
    }

    /// Replaces a node's machine with `machine` (a reboot: the old state is gone) and brings
    /// the node back, draining the new machine. Works on nodes that are not crashed too.
    pub fn restart(&mut self, id: NodeId, machine: M) {
        let i = self.check_id(id);
        self.flush();
        self.nodes[i].machine = machine;
        self.nodes[i].crashed = false;
        self.record(id, LogKind::Restarted);
        self.drain(id);
    }

    /// Puts `bytes` on the wire to node `to` as if sent from `from`, arriving `after` from
    /// now: a replay or a forgery. Injected datagrams skip fault rules and partitions; only
    /// a crash stops them.
    pub fn inject(
        &mut self,
        from: SocketAddr,
        to: NodeId,
        bytes: Vec<u8>,
        after: Duration,
    ) -> PacketId {
        self.check_id(to);
        let packet = self.new_packet();
        self.counters.injected += 1;
        self.record_packet(to, || LogKind::Injected {
            packet,
            from,
            len: bytes.len(),
        });
        let at = self.now + after;
        self.schedule(
            at,
            InFlight {
                packet,
                from,
                to,
                bytes,
                injected: true,
            },
        );
        packet
    }

    // ---- application commands -----------------------------------------------------------

    /// Gives the machine a command, `f(machine, now)`, then drains it. A crashed node's
    /// machine is still handed over, but its outputs are not polled.
    ///
    /// ```
    /// # use cohort_core::{Machine, Timestamp, Transmit};
    /// # use std::net::SocketAddr;
    /// # #[derive(Default)] struct Chat { out: Vec<(SocketAddr, Vec<u8>)> }
    /// # impl Chat { fn say(&mut self, to: SocketAddr, s: &str) { self.out.push((to, s.into())) } }
    /// # impl Machine for Chat {
    /// #     type Event = ();
    /// #     fn handle_datagram(&mut self, _: Timestamp, _: SocketAddr, _: &[u8]) {}
    /// #     fn handle_timeout(&mut self, _: Timestamp) {}
    /// #     fn poll_transmit(&mut self, _: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
    /// #         let (destination, data) = self.out.pop()?;
    /// #         buf.extend_from_slice(&data);
    /// #         Some(Transmit { destination, size: data.len() })
    /// #     }
    /// #     fn poll_timeout(&self) -> Option<Timestamp> { None }
    /// #     fn poll_event(&mut self) -> Option<()> { None }
    /// # }
    /// let mut sim = cohort_sim::Sim::with_seed(1);
    /// let a = sim.add_node(Chat::default());
    /// let b = sim.add_node(Chat::default());
    /// let to = sim.addr(b);
    /// sim.with_node(a, |chat, _now| chat.say(to, "hello"));
    /// assert_eq!(sim.counters().sent, 1);
    /// ```
    pub fn with_node<R>(&mut self, id: NodeId, f: impl FnOnce(&mut M, Timestamp) -> R) -> R {
        let i = self.check_id(id);
        self.flush();
        let r = f(&mut self.nodes[i].machine, self.now);
        self.drain(id);
        r
    }

    /// A node's machine, to give it commands. The node is drained at the next
    /// [`Sim::flush`], `step` or `run_*`; prefer [`Sim::with_node`], which drains at once.
    pub fn node_mut(&mut self, id: NodeId) -> &mut M {
        let i = self.check_id(id);
        if !self.nodes[i].dirty {
            self.nodes[i].dirty = true;
            self.touched.push(i);
        }
        &mut self.nodes[i].machine
    }

    /// Drains every node changed through [`Sim::node_mut`], in node order.
    pub fn flush(&mut self) {
        if self.touched.is_empty() {
            return;
        }
        let mut touched = std::mem::take(&mut self.touched);
        touched.sort_unstable();
        touched.dedup();
        for &i in &touched {
            // Listed twice, or drained meanwhile: drained once.
            if self.nodes[i].dirty {
                self.drain(NodeId::from_index(i));
            }
        }
        // Keep the allocation for the next flush.
        touched.clear();
        if self.touched.is_empty() {
            self.touched = touched;
        }
    }

    // ---- moving time --------------------------------------------------------------------

    /// Advances the clock to the next event and processes it. Returns false, leaving the
    /// clock alone, when nothing is scheduled.
    pub fn step(&mut self) -> bool {
        self.flush();
        let arrival = self.wire.keys().next().copied();
        let deadline = self.deadlines.iter().next().copied();
        match (arrival, deadline) {
            (Some((a, _)), Some((d, id))) if d < a => self.fire(d, id),
            (Some(key), _) => self.arrive(key),
            (None, Some((d, id))) => self.fire(d, id),
            (None, None) => return false,
        }
        self.counters.steps += 1;
        true
    }

    /// Processes every event up to and including `until`, then sets the clock to `until`
    /// (if it is later than now).
    ///
    /// # Errors
    /// [`FailureKind::StepLimit`] after [`SimConfig::max_steps`] steps.
    pub fn run_until(&mut self, until: Timestamp) -> Result<(), SimFailure> {
        self.flush();
        let mut steps = 0;
        while self.next_event_time().is_some_and(|t| t <= until) {
            self.budget(&mut steps)?;
            self.step();
        }
        self.now = self.now.max(until);
        Ok(())
    }

    /// [`Sim::run_until`] `now + d`.
    ///
    /// # Errors
    /// As [`Sim::run_until`].
    pub fn run_for(&mut self, d: Duration) -> Result<(), SimFailure> {
        self.run_until(self.now + d)
    }

    /// Runs until nothing is scheduled (no datagram in flight, no deadline) and returns the
    /// time that happened.
    ///
    /// # Errors
    /// [`FailureKind::Deadline`] if something is still scheduled `limit` from now (the
    /// clock is then at that limit), [`FailureKind::StepLimit`] as for `run_until`.
    pub fn run_until_quiet(&mut self, limit: Duration) -> Result<Timestamp, SimFailure> {
        self.run_until_cond(limit, |sim| sim.is_quiet())
            .map_err(|mut failure| {
                if failure.kind == FailureKind::Deadline {
                    failure.message = format!(
                        "not quiet after {limit:?}: {} datagrams in flight, next event at {:?}",
                        self.in_flight(),
                        self.next_event_time()
                    );
                }
                failure
            })
    }

    /// Steps until `cond(self)` holds (checked before the first step and after each one)
    /// and returns the time it first held.
    ///
    /// # Errors
    /// [`FailureKind::Deadline`] if it does not hold by `limit` from now, or nothing is left
    /// to happen before then (the clock is then at that limit); [`FailureKind::StepLimit`]
    /// as for `run_until`.
    pub fn run_until_cond(
        &mut self,
        limit: Duration,
        mut cond: impl FnMut(&Self) -> bool,
    ) -> Result<Timestamp, SimFailure> {
        let deadline = self.now + limit;
        let mut steps = 0;
        loop {
            self.flush();
            if cond(self) {
                return Ok(self.now);
            }
            if self.next_event_time().is_none_or(|t| t > deadline) {
                self.now = self.now.max(deadline);
                let msg = format!("condition not met within {limit:?}");
                return Err(self.failure_of(FailureKind::Deadline, msg));
            }
            self.budget(&mut steps)?;
            self.step();
        }
    }

    // ---- internals ----------------------------------------------------------------------

    fn check_id(&self, id: NodeId) -> usize {
        assert!(
            id.index() < self.nodes.len(),
            "cohort-sim: {id} is not a node (there are {})",
            self.nodes.len()
        );
        id.index()
    }

    fn budget(&self, steps: &mut u64) -> Result<(), SimFailure> {
        if *steps >= self.config.max_steps {
            let msg = format!(
                "step limit of {} reached in one run call (livelock?)",
                self.config.max_steps
            );
            return Err(self.failure_of(FailureKind::StepLimit, msg));
        }
        *steps += 1;
        Ok(())
    }

    fn failure_of(&self, kind: FailureKind, message: String) -> SimFailure {
        let start = self.log.len().saturating_sub(self.config.failure_tail);
        SimFailure {
            seed: self.config.seed,
            at: self.now,
            kind,
            message,
            tail: self.log[start..].iter().map(ToString::to_string).collect(),
            log_len: self.log.len(),
        }
    }

    fn record(&mut self, node: NodeId, kind: LogKind<M::Event>) {
        let entry = LogEntry {
            at: self.now,
            node,
            kind,
        };
        if self.config.trace {
            eprintln!("[seed {}] {entry}", self.config.seed);
        }
        self.log.push(entry);
    }

    /// Logs a datagram entry if datagrams are logged (building it only then).
    fn record_packet(&mut self, node: NodeId, kind: impl FnOnce() -> LogKind<M::Event>) {
        if self.config.log_packets {
            self.record(node, kind());
        }
    }

    fn new_packet(&mut self) -> PacketId {
        let packet = PacketId(self.next_packet);
        self.next_packet += 1;
        packet
    }

    fn schedule(&mut self, at: Timestamp, flight: InFlight) {
        self.wire.insert((at, self.next_seq), flight);
        self.next_seq += 1;
    }

    fn set_deadline(&mut self, id: NodeId, deadline: Option<Timestamp>) {
        let node = &mut self.nodes[id.index()];
        if let Some(old) = node.deadline.take() {
            self.deadlines.remove(&(old, id));
        }
        if node.crashed {
            return;
        }
        // A deadline already past fires at once.
        if let Some(at) = deadline.map(|d| d.max(self.now)) {
            node.deadline = Some(at);
            self.deadlines.insert((at, id));
        }
    }

    /// Polls a node's outputs in the documented order and acts on them.
    fn drain(&mut self, id: NodeId) {
        let now = self.now;
        let seed = self.config.seed;
        let max = self.config.max_outputs_per_drain;
        let node = &mut self.nodes[id.index()];
        node.dirty = false;
        if node.crashed {
            return;
        }
        let mut datagrams = Vec::new();
        loop {
            self.buf.clear();
            let Some(t) = node.machine.poll_transmit(now, &mut self.buf) else {
                break;
            };
            assert!(
                t.size <= self.buf.len(),
                "cohort-sim (seed {seed}): {id} reported a {}-byte transmit but wrote {} bytes",
                t.size,
                self.buf.len()
            );
            datagrams.push((t.destination, self.buf[..t.size].to_vec()));
            if datagrams.len() > max {
                panic!(
                    "cohort-sim (seed {seed}): {id} sent over {max} datagrams after one input, \
                     at {now:?}: {}",
                    burst_summary(&datagrams)
                );
            }
        }
        let mut events = Vec::new();
        while let Some(e) = node.machine.poll_event() {
            events.push(e);
            assert!(
                events.len() <= max,
                "cohort-sim (seed {seed}): {id} reported over {max} events after one input"
            );
        }
        let deadline = node.machine.poll_timeout();
        for (to, bytes) in datagrams {
            self.send(id, to, bytes);
        }
        for e in events {
            self.counters.events += 1;
            self.record(id, LogKind::Event(e));
        }
        self.set_deadline(id, deadline);
    }

    /// Routes one datagram a node just sent.
    fn send(&mut self, from_id: NodeId, to_addr: SocketAddr, mut bytes: Vec<u8>) {
        let packet = self.new_packet();
        let from = from_id.addr();
        let len = bytes.len();
        self.counters.sent += 1;
        self.record_packet(from_id, || LogKind::Sent {
            packet,
            to: to_addr,
            len,
        });
        let dropped = |reason| LogKind::Dropped {
            packet,
            from,
            to: to_addr,
            len,
            reason,
        };

        let Some(to) = self.node_by_addr(to_addr) else {
            self.counters.dropped_no_route += 1;
            self.record_packet(from_id, || dropped(DropReason::NoRoute));
            return;
        };
        if len > self.config.mtu {
            self.counters.dropped_mtu += 1;
            self.record_packet(from_id, || dropped(DropReason::Mtu));
            return;
        }
        if !self.can_reach(from_id, to) {
            self.counters.dropped_by_partition += 1;
            self.record_packet(from_id, || dropped(DropReason::Partition));
            return;
        }

        let view = PacketView {
            packet,
            from: from_id,
            to,
            now: self.now,
            bytes: &bytes,
        };
        let mut verdict = Verdict::Pass;
        let mut rule = String::new();
        for (_, r) in &mut self.rules {
            let v = r.judge(&view, &mut self.rng);
            if v != Verdict::Pass {
                verdict = v;
                rule = r.name().to_owned();
                break;
            }
        }

        let mut at = self.now + self.config.latency;
        if !self.config.jitter.is_zero() {
            at += duration_in(&mut self.rng, Duration::ZERO..self.config.jitter + NANO);
        }
        match verdict {
            Verdict::Pass => {}
            Verdict::Drop => {
                self.counters.dropped_by_rule += 1;
                self.record_packet(from_id, || dropped(DropReason::Rule(rule)));
                return;
            }
            Verdict::Delay(by) => {
                self.counters.delayed += 1;
                self.record_packet(from_id, || LogKind::Delayed { packet, rule, by });
                at += by;
            }
            Verdict::Reorder => {
                let w = self.config.reorder_window;
                let by = duration_in(&mut self.rng, w / 2..w + NANO);
                self.counters.reordered += 1;
                self.record_packet(from_id, || LogKind::Reordered { packet, rule, by });
                at += by;
            }
            Verdict::Duplicate => {
                let gap = duration_in(&mut self.rng, NANO..self.config.duplicate_gap + NANO);
                self.counters.duplicated += 1;
                self.record_packet(from_id, || LogKind::Duplicated { packet, rule, gap });
                let copy = InFlight {
                    packet,
                    from,
                    to,
                    bytes: bytes.clone(),
                    injected: false,
                };
                self.schedule(at, copy);
                at += gap;
            }
            Verdict::Tamper if bytes.is_empty() => {}
            Verdict::Tamper => {
                let bits = (bytes.len() as u64).saturating_mul(8);
                let pick = below(&mut self.rng, bits);
                let (byte, bit) = ((pick / 8) as usize, (pick % 8) as u8);
                bytes[byte] ^= 1 << bit;
                self.counters.tampered += 1;
                self.record_packet(from_id, || LogKind::Tampered {
                    packet,
                    rule,
                    byte,
                    bit,
                });
            }
        }
        self.schedule(
            at,
            InFlight {
                packet,
                from,
                to,
                bytes,
                injected: false,
            },
        );
    }

    /// A datagram arrives.
    fn arrive(&mut self, key: (Timestamp, u64)) {
        let Some(flight) = self.wire.remove(&key) else {
            return;
        };
        self.now = self.now.max(key.0);
        let InFlight {
            packet,
            from,
            to,
            bytes,
            injected,
        } = flight;
        let len = bytes.len();
        let dropped = |reason| LogKind::Dropped {
            packet,
            from,
            to: to.addr(),
            len,
            reason,
        };
        if self.nodes[to.index()].crashed {
            self.counters.dropped_crashed += 1;
            self.record_packet(to, || dropped(DropReason::Crashed));
            return;
        }
        let cut = !injected
            && self
                .node_by_addr(from)
                .is_some_and(|f| !self.can_reach(f, to));
        if cut {
            self.counters.dropped_by_partition += 1;
            self.record_packet(to, || dropped(DropReason::PartitionInFlight));
            return;
        }
        self.counters.delivered += 1;
        self.record_packet(to, || LogKind::Delivered { packet, from, len });
        self.nodes[to.index()]
            .machine
            .handle_datagram(self.now, from, &bytes);
        self.drain(to);
    }

    /// A node's deadline comes.
    fn fire(&mut self, at: Timestamp, id: NodeId) {
        self.deadlines.remove(&(at, id));
        self.nodes[id.index()].deadline = None;
        self.now = self.now.max(at);
        self.counters.timeouts += 1;
        if self.config.log_timeouts {
            self.record(id, LogKind::Timeout);
        }
        self.nodes[id.index()].machine.handle_timeout(self.now);
        self.drain(id);
    }
}

/// Added to the end of a range so that it includes its upper bound (at ns resolution).
const NANO: Duration = Duration::from_nanos(1);

impl<M: Machine> Drop for Sim<M> {
    /// A panic that unwinds through a simulation (a failed `assert!` in the test, a
    /// panicking core) prints the seed and the end of the log, so every failure names its
    /// seed even outside [`run_seeds`](crate::run_seeds).
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let seed = self.config.seed;
        eprintln!(
            "cohort-sim: panic during a simulation with seed {seed} at {} \
             (replay with {}={seed} under run_seeds/sweep); last log entries:",
            self.now,
            crate::SEED_ENV
        );
        let start = self.log.len().saturating_sub(self.config.failure_tail);
        for entry in &self.log[start..] {
            eprintln!("  {}", Brief(entry));
        }
    }
}

/// A log entry shown without requiring `Debug` of the event (`Drop` can have no such bound).
struct Brief<'a, E>(&'a LogEntry<E>);

impl<E> fmt::Display for Brief<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::log::write_entry(self.0, f, |_, f| f.write_str("(not shown)"))
    }
}

impl<M: Machine> fmt::Debug for Sim<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sim")
            .field("seed", &self.config.seed)
            .field("now", &self.now)
            .field("nodes", &self.nodes.len())
            .field("in_flight", &self.wire.len())
            .field("log_len", &self.log.len())
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

/// What a burst of datagrams held, for the livelock guard's message: how many bytes, how
/// many destinations, the most sent to one destination, and the commonest sizes. Without it
/// a failure at thousands of nodes says only that a node sent too much.
fn burst_summary(datagrams: &[(SocketAddr, Vec<u8>)]) -> String {
    let mut per_dest: std::collections::HashMap<SocketAddr, usize> = Default::default();
    let mut sizes: std::collections::BTreeMap<usize, usize> = Default::default();
    let mut bytes = 0usize;
    for (to, d) in datagrams {
        *per_dest.entry(*to).or_default() += 1;
        *sizes.entry(d.len()).or_default() += 1;
        bytes += d.len();
    }
    let most = per_dest.values().copied().max().unwrap_or(0);
    let mut common: Vec<(usize, usize)> = sizes.into_iter().collect();
    common.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    common.truncate(8);
    format!(
        "{bytes} bytes to {} destinations (at most {most} to one); commonest sizes (bytes, count): {common:?}",
        per_dest.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_core::Transmit;

    /// Sends one byte to `to` on every command and every `tick` of its timer; reports an
    /// event per datagram it receives.
    struct Pinger {
        to: SocketAddr,
        tick: Duration,
        next: Timestamp,
        queued: u32,
        got: u32,
    }

    impl Pinger {
        fn new(to: SocketAddr, tick_ms: u64) -> Pinger {
            let tick = Duration::from_millis(tick_ms);
            Pinger {
                to,
                tick,
                next: Timestamp::ZERO + tick,
                queued: 0,
                got: 0,
            }
        }
    }

    impl Machine for Pinger {
        type Event = u32;
        fn handle_datagram(&mut self, _: Timestamp, _: SocketAddr, _: &[u8]) {
            self.got += 1;
        }
        fn handle_timeout(&mut self, now: Timestamp) {
            self.queued += 1;
            self.next = now + self.tick;
        }
        fn poll_transmit(&mut self, _: Timestamp, buf: &mut Vec<u8>) -> Option<Transmit> {
            if self.queued == 0 {
                return None;
            }
            self.queued -= 1;
            buf.push(1);
            Some(Transmit {
                destination: self.to,
                size: 1,
            })
        }
        fn poll_timeout(&self) -> Option<Timestamp> {
            Some(self.next)
        }
        fn poll_event(&mut self) -> Option<u32> {
            let g = std::mem::take(&mut self.got);
            (g > 0).then_some(g)
        }
    }

    fn ring(config: SimConfig, n: usize) -> Sim<Pinger> {
        let mut sim = Sim::new(config);
        for i in 0..n {
            let to = NodeId::from_index((i + 1) % n).addr();
            sim.add_node(Pinger::new(to, 7 + i as u64));
        }
        sim
    }

    #[test]
    fn the_livelock_guard_says_what_the_burst_held() {
        let config = SimConfig {
            max_outputs_per_drain: 10,
            ..SimConfig::with_seed(3)
        };
        let mut sim = ring(config, 3);
        sim.node_mut(NodeId::from_index(1)).queued += 11;
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.flush()));
        let message = caught
            .expect_err("the guard stops the node")
            .downcast::<String>()
            .expect("a formatted message");
        assert!(
            message.contains("n1 sent over 10 datagrams after one input")
                && message.contains("11 bytes to 1 destinations (at most 11 to one)")
                && message.contains("[(1, 11)]"),
            "{message}"
        );
    }

    #[test]
    fn flush_drains_touched_nodes_in_node_order_once() {
        let mut sim = ring(SimConfig::with_seed(1), 6);
        // Touched out of order, one of them twice.
        for i in [4, 1, 4, 3] {
            sim.node_mut(NodeId::from_index(i)).queued += 1;
        }
        sim.flush();
        let senders: Vec<usize> = sim
            .log()
            .iter()
            .filter(|e| matches!(e.kind, LogKind::Sent { .. }))
            .map(|e| e.node.index())
            .collect();
        // Node 4 was touched twice but drained once, sending both datagrams.
        assert_eq!(senders, vec![1, 3, 4, 4]);
        // Nothing left to drain: a second flush sends nothing.
        sim.flush();
        assert_eq!(sim.counters().sent, 4);
    }

    #[test]
    fn timeouts_unlogged_change_nothing_else() {
        let run = |log_timeouts| {
            let config = SimConfig {
                log_timeouts,
                jitter: Duration::from_millis(3),
                ..SimConfig::with_seed(9)
            };
            let mut sim = ring(config, 5);
            sim.run_until(Timestamp::ZERO + Duration::from_millis(500))
                .unwrap();
            let rest: Vec<LogEntry<u32>> = sim
                .log()
                .iter()
                .filter(|e| !matches!(e.kind, LogKind::Timeout))
                .cloned()
                .collect();
            let timeouts = sim.log().len() - rest.len();
            (rest, sim.counters(), timeouts)
        };
        let (log_on, counters_on, timeouts_on) = run(true);
        let (log_off, counters_off, timeouts_off) = run(false);
        assert!(timeouts_on > 100, "{timeouts_on}");
        assert_eq!(timeouts_off, 0);
        assert_eq!(counters_on, counters_off);
        assert_eq!(counters_on.timeouts, timeouts_on as u64);
        assert_eq!(log_on, log_off);
    }

    #[test]
    fn partitions_log_each_nodes_component_or_nothing() {
        let n = 7;
        let ids: Vec<NodeId> = (0..n).map(NodeId::from_index).collect();
        let mut sim = ring(SimConfig::with_seed(2), n);
        sim.partition(&[&[ids[5], ids[0]], &[ids[2], ids[3], ids[6]]]);
        let logged: Vec<(NodeId, Vec<NodeId>)> = sim
            .log()
            .iter()
            .filter_map(|e| match &e.kind {
                LogKind::Partitioned { component } => Some((e.node, component.clone())),
                _ => None,
            })
            .collect();
        // Every node, in node order, with exactly the nodes it reaches, in index order.
        let want: Vec<(NodeId, Vec<NodeId>)> = ids
            .iter()
            .map(|&a| {
                (
                    a,
                    ids.iter()
                        .copied()
                        .filter(|&b| sim.can_reach(a, b))
                        .collect(),
                )
            })
            .collect();
        assert_eq!(logged, want);
        assert_eq!(logged[0].1, vec![ids[0], ids[5]]);
        assert_eq!(logged[1].1, vec![ids[1]]);

        let mut quiet = ring(
            SimConfig {
                log_partitions: false,
                ..SimConfig::with_seed(2)
            },
            n,
        );
        quiet.partition(&[&[ids[5], ids[0]], &[ids[2], ids[3], ids[6]]]);
        assert!(quiet.log().is_empty());
        for &a in &ids {
            for &b in &ids {
                assert_eq!(quiet.can_reach(a, b), sim.can_reach(a, b));
            }
        }
    }
}
