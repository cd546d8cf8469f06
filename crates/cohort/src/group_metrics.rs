//! A group member's Prometheus metrics: the families (messages and bytes delivered by
//! channel, messages and bytes sent, datagrams, drops by reason, view changes, removals,
//! rekeys with a latency histogram, members in view, key epoch, events lost), registered in
//! a [`Registry`] and updated from the member's event stream ([`GroupMetrics::observe`]) and
//! its statistics ([`GroupMetrics::record_stats`]).
//!
//! ```text
//!   Events::next ──▶ application loop ──observe(&event)──▶ ┐
//!   Group::stats (every second, GroupMetrics::serve) ────▶ ├─▶ counters, gauges, histogram
//!                                                          ┘        │ registered in
//!   scraper ──GET /metrics──▶ MetricsEndpoint ──▶ Registry ◀───────┘
//! ```
//!
//! The event stream has a single consumer (the application), so the metrics never read it
//! themselves: whoever reads it hands each event to [`GroupMetrics::observe`] (deliveries by
//! channel, removals, the rekey histogram, the view gauges). Everything the member counts
//! itself comes from [`Stats`], so it is right even for events nobody read. Names, with
//! the registry's `cohort` prefix:
//!
//! | from events | from stats |
//! | --- | --- |
//! | `cohort_group_messages_delivered_total{channel}` | `cohort_group_messages_sent_total` |
//! | `cohort_group_bytes_delivered_total{channel}` | `cohort_group_bytes_sent_total` |
//! | `cohort_group_removed_total{reason}` | `cohort_group_datagrams_total{direction}` |
//! | `cohort_group_rekey_duration_seconds` (histogram) | `cohort_group_datagram_bytes_total{direction}` |
//! | | `cohort_group_dropped_total{reason}` (packets and fragments) |
//! | | `cohort_group_view_changes_total`, `cohort_group_rekeys_total` |
//! | | `cohort_group_events_lost_total` |
//! | `cohort_group_members`, `cohort_group_key_epoch` (gauges, from both) | |
//!
//! The member counts sent messages in total, not by channel; deliveries are by channel.

use crate::group::{Channel, Event, Group, Stats};
use crate::metrics::{MetricsEndpoint, Registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One label: `[(name, value)]`.
type Label = [(&'static str, &'static str); 1];

/// How often [`GroupMetrics::serve`] reads the member's statistics.
const STATS_INTERVAL: Duration = Duration::from_secs(1);

/// The group families. Cheap to clone: clones update the same values.
#[derive(Clone)]
pub struct GroupMetrics {
    delivered: Family<Label, Counter>,
    delivered_bytes: Family<Label, Counter>,
    sent: Counter,
    sent_bytes: Counter,
    datagrams: Family<Label, Counter>,
    datagram_bytes: Family<Label, Counter>,
    dropped: Family<Label, Counter>,
    view_changes: Counter,
    removed: Family<Label, Counter>,
    rekeys: Counter,
    rekey_seconds: Histogram,
    members: Gauge,
    key_epoch: Gauge,
    lost: Counter,
    /// The totals last read from the member, by name (the counters grow by the
    /// difference).
    last: Arc<Mutex<HashMap<(&'static str, &'static str), u64>>>,
    /// The tasks [`GroupMetrics::serve`] started; aborted when the last clone is dropped.
    _tasks: Arc<Tasks>,
}

struct Tasks(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// A bound, not yet serving, metrics endpoint with the group families registered
/// ([`GroupMetrics::bind`]).
pub struct MetricsBinding {
    endpoint: MetricsEndpoint,
    metrics: GroupMetrics,
}

impl MetricsBinding {
    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    /// Serves scrapes and reads `group`'s statistics every second, on tasks of the current
    /// tokio runtime; they stop when the last clone of the returned value is dropped. Hand
    /// every event read from the group to [`GroupMetrics::observe`].
    pub fn start(self, group: Group) -> GroupMetrics {
        let MetricsBinding {
            endpoint,
            mut metrics,
        } = self;
        if let Ok(addr) = endpoint.local_addr() {
            tracing::info!(%addr, "group metrics: serving /metrics");
        }
        let poller = {
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(STATS_INTERVAL);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    match group.stats().await {
                        Ok(stats) => metrics.record_stats(&stats),
                        // The member has stopped: nothing more to read.
                        Err(_) => return,
                    }
                }
            })
        };
        metrics._tasks = Arc::new(Tasks(vec![endpoint.spawn(), poller]));
        metrics
    }
}

fn channel_label(channel: Channel) -> Label {
    [("channel", channel.name())]
}

impl GroupMetrics {
    /// Registers the group families in `registry` (under `group_`; give the registry the
    /// `cohort` prefix) and returns the handles that update them.
    pub fn register(registry: &mut Registry) -> GroupMetrics {
        let metrics = GroupMetrics {
            delivered: Family::default(),
            delivered_bytes: Family::default(),
            sent: Counter::default(),
            sent_bytes: Counter::default(),
            datagrams: Family::default(),
            datagram_bytes: Family::default(),
            dropped: Family::default(),
            view_changes: Counter::default(),
            removed: Family::default(),
            rekeys: Counter::default(),
            // 1 ms to about 16 s.
            rekey_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            members: Gauge::default(),
            key_epoch: Gauge::default(),
            lost: Counter::default(),
            last: Arc::default(),
            _tasks: Arc::new(Tasks(Vec::new())),
        };
        let group = registry.sub_registry_with_prefix("group");
        group.register(
            "messages_delivered",
            "Messages delivered to this member, by channel",
            metrics.delivered.clone(),
        );
        group.register(
            "bytes_delivered",
            "Payload bytes delivered to this member, by channel",
            metrics.delivered_bytes.clone(),
        );
        group.register(
            "messages_sent",
            "Application messages this member sent (before fragmentation)",
            metrics.sent.clone(),
        );
        group.register(
            "bytes_sent",
            "Application payload bytes this member sent",
            metrics.sent_bytes.clone(),
        );
        group.register(
            "datagrams",
            "UDP datagrams, by direction (sent, received)",
            metrics.datagrams.clone(),
        );
        group.register(
            "datagram_bytes",
            "UDP datagram bytes, by direction (sent, received)",
            metrics.datagram_bytes.clone(),
        );
        group.register(
            "dropped",
            "Packets dropped by this member, by reason",
            metrics.dropped.clone(),
        );
        group.register(
            "view_changes",
            "Views installed by this member",
            metrics.view_changes.clone(),
        );
        group.register(
            "removed",
            "Members removed from this member's view, by reason",
            metrics.removed.clone(),
        );
        group.register(
            "rekeys",
            "Group keys installed by this member",
            metrics.rekeys.clone(),
        );
        group.register(
            "rekey_duration_seconds",
            "Time from the start of a rekey to the new key in use",
            metrics.rekey_seconds.clone(),
        );
        group.register(
            "members",
            "Members in this member's current view",
            metrics.members.clone(),
        );
        group.register(
            "key_epoch",
            "The current group key's epoch",
            metrics.key_epoch.clone(),
        );
        group.register(
            "events_lost",
            "Events the application did not read in time and that were dropped",
            metrics.lost.clone(),
        );
        metrics
    }

    /// Registers the group families in a fresh `cohort` registry and binds the metrics
    /// endpoint on `addr` (TCP), so that an address in use fails here, before the member
    /// starts. Serve it with [`MetricsBinding::start`] once the member runs.
    pub async fn bind(addr: SocketAddr) -> io::Result<MetricsBinding> {
        let mut registry = Registry::with_prefix("cohort");
        let metrics = GroupMetrics::register(&mut registry);
        let endpoint = MetricsEndpoint::bind(addr, registry).await?;
        Ok(MetricsBinding { endpoint, metrics })
    }

    /// [`bind`](Self::bind), then [`start`](MetricsBinding::start) at once.
    pub async fn serve(addr: SocketAddr, group: Group) -> io::Result<GroupMetrics> {
        Ok(GroupMetrics::bind(addr).await?.start(group))
    }

    /// Counts what `event` says happened.
    pub fn observe(&self, event: &Event) {
        match event {
            Event::View(view) => {
                self.members.set(gauge(view.members.len() as u64));
                self.key_epoch.set(gauge(view.key_epoch));
            }
            Event::Deliver { channel, data, .. } => {
                let label = channel_label(*channel);
                self.delivered.get_or_create(&label).inc();
                self.delivered_bytes
                    .get_or_create(&label)
                    .inc_by(data.len() as u64);
            }
            Event::Rekeyed {
                key_epoch, took, ..
            } => {
                self.key_epoch.set(gauge(*key_epoch));
                if let Some(took) = took {
                    self.rekey_seconds.observe(took.as_secs_f64());
                }
            }
            Event::Removed { reason, .. } => {
                self.removed
                    .get_or_create(&[("reason", reason.name())])
                    .inc();
            }
            _ => {}
        }
    }

    /// Brings the counters the member keeps (sent, datagrams, drops, views, rekeys, events
    /// lost) and the view gauges up to `stats`.
    pub fn record_stats(&self, stats: &Stats) {
        let status = &stats.status;
        match &status.view {
            Some(view) => {
                self.members.set(gauge(view.members.len() as u64));
                self.key_epoch.set(gauge(view.key_epoch));
            }
            None => {
                self.members.set(0);
            }
        }
        let Ok(mut last) = self.last.lock() else {
            return;
        };
        let mut grow = |key: (&'static str, &'static str), counter: &Counter, total: u64| {
            let before = last.insert(key, total).unwrap_or(0);
            // Totals only grow; a smaller one would be a new member: count it afresh.
            let grown = total.checked_sub(before).unwrap_or(total);
            if grown > 0 {
                counter.inc_by(grown);
            }
        };
        grow(("sent", ""), &self.sent, stats.sent_messages);
        grow(("sent_bytes", ""), &self.sent_bytes, stats.sent_bytes);
        for (dir, n, bytes) in [
            ("sent", stats.datagrams_sent, stats.datagram_bytes_sent),
            (
                "received",
                stats.datagrams_received,
                stats.datagram_bytes_received,
            ),
        ] {
            let label = [("direction", dir)];
            grow(("datagrams", dir), &self.datagrams.get_or_create(&label), n);
            grow(
                ("datagram_bytes", dir),
                &self.datagram_bytes.get_or_create(&label),
                bytes,
            );
        }
        for (reason, total) in status.dropped.iter() {
            grow(
                ("dropped", reason),
                &self.dropped.get_or_create(&[("reason", reason)]),
                total,
            );
        }
        for (reason, total) in [
            ("fragment_garbage", stats.fragments.garbage),
            ("fragment_over_limit", stats.fragments.over_limit),
            ("fragment_sender_left", stats.fragments.sender_left),
        ] {
            grow(
                ("dropped", reason),
                &self.dropped.get_or_create(&[("reason", reason)]),
                total,
            );
        }
        grow(("views", ""), &self.view_changes, stats.views);
        grow(("rekeys", ""), &self.rekeys, stats.rekeys);
        grow(("events_lost", ""), &self.lost, stats.events_lost);
    }
}

/// `v` as a gauge value (gauges are i64).
fn gauge(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // reason: test code; a panic is the failure report
mod tests {
    use super::*;
    use crate::group::MemberId;
    use crate::metrics::render;

    #[test]
    fn events_move_the_families() {
        let mut registry = Registry::with_prefix("cohort");
        let metrics = GroupMetrics::register(&mut registry);
        metrics.observe(&Event::Rekeyed {
            key_epoch: 7,
            members: 3,
            took: Some(Duration::from_millis(3)),
        });
        let text = render(&registry);
        for line in [
            "cohort_group_key_epoch 7\n",
            "cohort_group_rekey_duration_seconds_count 1\n",
            "cohort_group_rekey_duration_seconds_bucket{le=\"0.004\"} 1\n",
            "cohort_group_rekey_duration_seconds_bucket{le=\"0.002\"} 0\n",
        ] {
            assert!(text.contains(line), "{line:?} not in\n{text}");
        }
    }

    async fn scrape(addr: SocketAddr) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        stream.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn a_running_member_is_scraped() {
        use crate::group::GroupConfig;
        use cohort_channel::identity::Identity;
        use cohort_crypto::CryptoProvider;
        let provider = CryptoProvider::default_provider();
        let me = Identity::generate(&provider).unwrap();
        let id = MemberId(me.public());
        let binding = GroupMetrics::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = binding.local_addr().unwrap();
        // The address is taken from the moment of binding.
        assert_eq!(
            GroupMetrics::bind(addr).await.err().map(|e| e.kind()),
            Some(io::ErrorKind::AddrInUse)
        );
        let config = GroupConfig::builder("metrics-test")
            .identity(me)
            .listen("127.0.0.1:0".parse().unwrap())
            .trust([id])
            .build()
            .unwrap();
        let (group, mut events) = crate::group::Group::start(config).unwrap();
        let metrics = binding.start(group.clone());
        group.join().await.unwrap();
        group
            .send(Channel::Reliable, vec![1u8; 5000])
            .await
            .unwrap();
        loop {
            let event = events.next().await.unwrap();
            metrics.observe(&event);
            if matches!(event, Event::Deliver { .. }) {
                break;
            }
        }
        // The statistics are read every second.
        tokio::time::sleep(STATS_INTERVAL + Duration::from_millis(500)).await;
        let text = scrape(addr).await;
        for line in [
            "\ncohort_group_members 1\n",
            "\ncohort_group_messages_delivered_total{channel=\"reliable\"} 1\n",
            "\ncohort_group_bytes_delivered_total{channel=\"reliable\"} 5000\n",
            "\ncohort_group_messages_sent_total 1\n",
            "\ncohort_group_bytes_sent_total 5000\n",
            "\ncohort_group_view_changes_total 1\n",
            "\ncohort_group_dropped_total{reason=\"malformed\"} 0\n",
        ] {
            assert!(text.contains(line), "{line:?} not in\n{text}");
        }
        group.leave().await.unwrap();
        drop(metrics);
    }
}
