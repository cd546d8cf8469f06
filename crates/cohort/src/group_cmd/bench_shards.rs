//! `cohort group bench --runtime sharded`: members spread over one single-threaded tokio
//! runtime per core, as N member processes would spread over the cores.
//!
//! Each shard is an OS thread running a current-thread runtime; member `i` lives on shard
//! `i % shards`: its socket is registered with that shard's reactor, and its driver and
//! event pump run there, so a member's datagrams, timers and events never cross threads
//! (members meet only through their UDP sockets, as separate processes do). The bench's
//! measuring task stays on the main thread's runtime and talks to the members over their
//! command and event channels.

use std::thread::JoinHandle;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// Running shards; dropping them stops their runtimes (and every task on them) and joins
/// their threads.
pub struct Shards {
    handles: Vec<Handle>,
    stops: Vec<oneshot::Sender<()>>,
    threads: Vec<JoinHandle<()>>,
}

impl Shards {
    /// Starts `count` shards (at least one).
    pub fn start(count: usize) -> std::io::Result<Shards> {
        let mut shards = Shards {
            handles: Vec::new(),
            stops: Vec::new(),
            threads: Vec::new(),
        };
        for i in 0..count.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (stop, stopped) = oneshot::channel::<()>();
            shards.handles.push(runtime.handle().clone());
            shards.stops.push(stop);
            shards.threads.push(
                std::thread::Builder::new()
                    .name(format!("bench-shard-{i}"))
                    .spawn(move || {
                        // Runs the shard's tasks until told to stop (or the sender is
                        // dropped); the runtime's drop then cancels what is left.
                        let _ = runtime.block_on(stopped);
                    })?,
            );
        }
        Ok(shards)
    }

    /// The runtime member `index` runs on.
    pub fn for_member(&self, index: usize) -> &Handle {
        // `start` made at least one.
        &self.handles[index % self.handles.len()]
    }

    /// How many shards run.
    pub fn count(&self) -> usize {
        self.handles.len()
    }
}

impl Drop for Shards {
    fn drop(&mut self) {
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_go_round_robin_and_tasks_run_on_their_shard() {
        let shards = Shards::start(2).unwrap();
        assert_eq!(shards.count(), 2);
        let names: Vec<String> = (0..4)
            .map(|i| {
                let (tx, rx) = std::sync::mpsc::channel();
                shards.for_member(i).spawn(async move {
                    let _ = tx.send(std::thread::current().name().unwrap_or("").to_string());
                });
                rx.recv().unwrap()
            })
            .collect();
        assert_eq!(
            names,
            [
                "bench-shard-0",
                "bench-shard-1",
                "bench-shard-0",
                "bench-shard-1"
            ]
        );
        drop(shards);
    }
}
