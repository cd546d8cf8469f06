//! The bounded event queue between a member's task and its [`Events`](super::Events)
//! reader. The task never waits on it: a full queue counts the event as lost, and the
//! reader gets one [`Event::Lost`] where the losses happened.

use super::{Event, ViewId};
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use tokio::sync::Notify;

/// What the reader takes from the queue.
#[derive(Debug)]
pub enum Item {
    /// An event for the application.
    Event(Event),
    /// State transfer: take a snapshot now, at the boundary of this view.
    Provide(ViewId),
}

struct Inner {
    items: VecDeque<Item>,
    /// Events lost since the last `Lost` was queued.
    lost: u64,
    /// Events lost since the start.
    total_lost: u64,
    closed: bool,
    reader_gone: bool,
}

/// The queue (shared by the task and the reader).
pub struct Queue {
    inner: Mutex<Inner>,
    notify: Notify,
    capacity: usize,
}

impl Queue {
    /// A queue that holds `capacity` events (at least 1).
    pub fn new(capacity: usize) -> Self {
        Queue {
            inner: Mutex::new(Inner {
                items: VecDeque::new(),
                lost: 0,
                total_lost: 0,
                closed: false,
                reader_gone: false,
            }),
            notify: Notify::new(),
            capacity: capacity.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave the queue inconsistent (every
        // change is one push or pop): keep going with it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `event`, or counts it as lost if the queue is full. Never waits.
    pub fn push(&self, event: Event) {
        let mut q = self.lock();
        if q.reader_gone {
            return;
        }
        let events = q.items.len();
        if events >= self.capacity {
            q.lost += 1;
            q.total_lost += 1;
            return;
        }
        if q.lost > 0 {
            let count = std::mem::take(&mut q.lost);
            q.items.push_back(Item::Event(Event::Lost { count }));
        }
        q.items.push_back(Item::Event(event));
        drop(q);
        self.notify.notify_one();
    }

    /// Counts `n` events lost elsewhere (held back too long).
    pub fn count_lost(&self, n: u64) {
        let mut q = self.lock();
        q.lost += n;
        q.total_lost += n;
    }

    /// Queues a snapshot request (never lost). False if nobody reads any more.
    pub fn provide(&self, view: ViewId) -> bool {
        let mut q = self.lock();
        if q.reader_gone {
            return false;
        }
        q.items.push_back(Item::Provide(view));
        drop(q);
        self.notify.notify_one();
        true
    }

    /// No more events will come: the reader gets `None` after the queued ones.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_one();
    }

    /// The reader is gone: discard what is queued and queue nothing more.
    pub fn reader_gone(&self) {
        let mut q = self.lock();
        q.reader_gone = true;
        q.items.clear();
    }

    /// Events waiting, and events lost since the start.
    pub fn counts(&self) -> (usize, u64) {
        let q = self.lock();
        (q.items.len(), q.total_lost)
    }

    /// The next item; `None` once closed and drained.
    pub async fn pop(&self) -> Option<Item> {
        loop {
            {
                let mut q = self.lock();
                if let Some(item) = q.items.pop_front() {
                    return Some(item);
                }
                if q.lost > 0 {
                    let count = std::mem::take(&mut q.lost);
                    return Some(Item::Event(Event::Lost { count }));
                }
                if q.closed {
                    return None;
                }
            }
            self.notify.notified().await;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // reason: test code; a panic is the failure report
mod tests {
    use super::*;

    fn event(n: u64) -> Event {
        Event::Lost { count: 1000 + n }
    }

    #[tokio::test]
    async fn a_full_queue_counts_losses_and_reports_them_where_they_happened() {
        let q = Queue::new(2);
        for n in 0..5 {
            q.push(event(n));
        }
        assert_eq!(q.counts(), (2, 3));
        let mut got = Vec::new();
        got.push(q.pop().await.unwrap());
        q.push(event(9));
        q.close();
        while let Some(item) = q.pop().await {
            got.push(item);
        }
        let got: Vec<Event> = got
            .into_iter()
            .map(|i| match i {
                Item::Event(e) => e,
                Item::Provide(_) => panic!("no provide queued"),
            })
            .collect();
        assert_eq!(
            got,
            [event(0), event(1), Event::Lost { count: 3 }, event(9)]
        );
    }

    #[tokio::test]
    async fn losses_at_the_end_are_reported_before_the_end() {
        let q = Queue::new(1);
        q.push(event(0));
        q.push(event(1));
        q.close();
        assert!(matches!(q.pop().await, Some(Item::Event(e)) if e == event(0)));
        assert!(matches!(
            q.pop().await,
            Some(Item::Event(Event::Lost { count: 1 }))
        ));
        assert!(q.pop().await.is_none());
    }
}
