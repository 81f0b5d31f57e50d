//! Fan-out of committed events to live watchers, with the revision they are
//! consistent with. Subscribing and publishing share one lock, so a new
//! watcher knows exactly which revisions it must read from history and which
//! will arrive live: no gap, no duplicate.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::{Error, Event, EventBatch, Result, Revision};

/// Batches a live watcher may have queued before it counts as lagging.
const WATCHER_QUEUE: usize = 4096;

#[derive(Debug)]
pub(super) struct Hub {
    state: Mutex<State>,
    closed: AtomicBool,
}

#[derive(Debug)]
struct State {
    /// The newest revision published: everything up to it is committed.
    revision: Revision,
    subscribers: Vec<Subscriber>,
}

#[derive(Debug)]
struct Subscriber {
    prefix: String,
    tx: mpsc::Sender<EventBatch>,
}

impl Hub {
    pub(super) fn new(revision: Revision) -> Self {
        Hub {
            state: Mutex::new(State {
                revision,
                subscribers: Vec::new(),
            }),
            closed: AtomicBool::new(false),
        }
    }

    /// Registers a live watcher. Events after the returned revision will be
    /// delivered on the receiver; older ones must come from history.
    pub(super) fn subscribe(&self, prefix: &str) -> (Revision, mpsc::Receiver<EventBatch>) {
        let (tx, rx) = mpsc::channel(WATCHER_QUEUE);
        let mut state = self.state.lock();
        state.subscribers.push(Subscriber {
            prefix: prefix.to_owned(),
            tx,
        });
        (state.revision, rx)
    }

    /// Publishes the committed transactions of one batch, in revision order.
    /// A watcher whose queue is full is dropped: its stream then ends with
    /// `WatcherLagged` and it resumes from history.
    pub(super) fn publish(&self, revision: Revision, transactions: &[EventBatch]) {
        let mut state = self.state.lock();
        state.subscribers.retain(|sub| {
            for events in transactions {
                let matching: Vec<Event> = events
                    .iter()
                    .filter(|e| e.kv.key.starts_with(&sub.prefix))
                    .cloned()
                    .collect();
                if matching.is_empty() {
                    continue;
                }
                if sub.tx.try_send(matching).is_err() {
                    return false;
                }
            }
            !sub.tx.is_closed()
        });
        state.revision = revision;
    }

    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.state.lock().subscribers.clear();
    }

    /// Why a live stream ended.
    pub(super) fn end_reason(&self) -> Error {
        if self.closed.load(Ordering::SeqCst) {
            Error::Closed
        } else {
            Error::WatcherLagged
        }
    }
}

/// Turns a receiver into the item stream of a watch: batches, then one error.
pub(super) fn live_stream(
    rx: mpsc::Receiver<EventBatch>,
    after: Revision,
    hub: std::sync::Arc<Hub>,
) -> impl futures_util::Stream<Item = Result<EventBatch>> + Send {
    futures_util::stream::unfold(Some((rx, hub)), move |state| async move {
        let (mut rx, hub) = state?;
        loop {
            match rx.recv().await {
                // A watch may start after a future revision: skip until then.
                Some(batch) if batch.first().is_some_and(|e| e.revision() <= after) => continue,
                Some(batch) => return Some((Ok(batch), Some((rx, hub)))),
                None => return Some((Err(hub.end_reason()), None)),
            }
        }
    })
}
