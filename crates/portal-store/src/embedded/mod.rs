//! The embedded backend: one redb file, one writer thread that group-commits.
//!
//! Every transaction queued while the previous commit was syncing goes into
//! the next redb write transaction, which is fsynced once
//! (`Durability::Immediate`) before any of them is acknowledged: throughput
//! comes from batching, never from skipping the fsync. Each queued transaction
//! still gets its own revision and fails or succeeds on its own.
//!
//! Tables: `kv` (key → revisions and value), `history` ((revision, index) →
//! event with the previous value, for watch replay; compacted to a bounded
//! number of revisions) and `meta` (current and compacted revision).

mod codec;
mod hub;
mod writer;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::{mpsc, oneshot};

use crate::{Error, EventBatch, KeyValue, Op, Result, Revision, Store, WatchStream};
use hub::Hub;
use writer::Request;

const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
const HISTORY: TableDefinition<(u64, u32), &[u8]> = TableDefinition::new("history");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const META_REVISION: &str = "revision";
const META_COMPACTED: &str = "compacted";

/// Called after every group commit: how many transactions, how long the
/// commit (including fsync) took. The API server turns this into metrics.
pub type CommitObserver = Arc<dyn Fn(usize, Duration) + Send + Sync>;

/// Tuning of the embedded store.
#[derive(Clone)]
pub struct EmbeddedOptions {
    /// Revisions of history kept for watches to resume from.
    pub history_revisions: u64,
    /// Most transactions committed together.
    pub max_batch: usize,
    pub commit_observer: Option<CommitObserver>,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            history_revisions: 100_000,
            max_batch: 1024,
            commit_observer: None,
        }
    }
}

impl std::fmt::Debug for EmbeddedOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedOptions")
            .field("history_revisions", &self.history_revisions)
            .field("max_batch", &self.max_batch)
            .finish_non_exhaustive()
    }
}

/// State shared by the handle and the writer thread.
#[derive(Debug)]
struct Shared {
    db: Database,
    hub: Arc<Hub>,
    /// Last committed (and published) revision.
    revision: AtomicU64,
    /// History up to and including this revision is gone.
    compacted: AtomicU64,
}

/// A crash-safe store in one file, for one process. Cheap to clone; the
/// writer stops and the file closes when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct EmbeddedStore {
    shared: Arc<Shared>,
    writer: Arc<Writer>,
}

/// The handle on the writer thread: dropping it closes the queue and waits
/// for the last batch to commit, so the file can be reopened at once.
#[derive(Debug)]
struct Writer {
    requests: Option<mpsc::Sender<Request>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.requests.take();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("store writer thread panicked");
            }
        }
    }
}

/// The most memory redb may use to cache pages.
const PAGE_CACHE_BYTES: usize = 128 << 20;

fn backend(error: impl Into<redb::Error>) -> Error {
    Error::Backend(error.into().to_string())
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `dir/store.redb`. After a crash redb
    /// recovers to the last committed transaction.
    pub fn open(dir: &Path, options: EmbeddedOptions) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::Backend(format!("{}: {e}", dir.display())))?;
        // redb's page cache defaults to 1 GiB, which a busy store fills and
        // keeps. The API server holds every current object in its watch
        // cache already; the store's cache only needs the B-trees' upper
        // levels and recent pages.
        let db = redb::Builder::new()
            .set_cache_size(PAGE_CACHE_BYTES)
            .create(dir.join("store.redb"))
            .map_err(backend)?;
        let (revision, compacted) = {
            let txn = db.begin_write().map_err(backend)?;
            let read = {
                txn.open_table(KV).map_err(backend)?;
                txn.open_table(HISTORY).map_err(backend)?;
                let meta = txn.open_table(META).map_err(backend)?;
                let get = |name| -> Result<u64> {
                    Ok(meta.get(name).map_err(backend)?.map_or(0, |v| v.value()))
                };
                (get(META_REVISION)?, get(META_COMPACTED)?)
            };
            txn.commit().map_err(backend)?;
            read
        };
        let hub = Arc::new(Hub::new(revision));
        let shared = Arc::new(Shared {
            db,
            hub,
            revision: AtomicU64::new(revision),
            compacted: AtomicU64::new(compacted),
        });
        let (requests, rx) = mpsc::channel(options.max_batch * 4);
        let writer_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("portal-store-writer".into())
            .spawn(move || writer::run(&writer_shared, rx, &options))
            .map_err(|e| Error::Backend(format!("cannot start writer thread: {e}")))?;
        tracing::info!(revision, compacted, "embedded store open");
        let writer = Arc::new(Writer {
            requests: Some(requests),
            thread: Some(thread),
        });
        Ok(EmbeddedStore { shared, writer })
    }

    /// The oldest revision a watch may start after.
    pub fn compacted_revision(&self) -> Revision {
        self.shared.compacted.load(Ordering::SeqCst)
    }

    async fn request<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T>>) -> Request,
    ) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        let requests = self.writer.requests.as_ref().ok_or(Error::Closed)?;
        requests.send(make(tx)).await.map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)?
    }

    /// Runs a read-only closure on a snapshot, off the async threads.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&redb::ReadTransaction) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || f(&shared.db.begin_read().map_err(backend)?))
            .await
            .map_err(|e| Error::Backend(format!("read task failed: {e}")))?
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.hub.close();
    }
}

impl Store for EmbeddedStore {
    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<KeyValue>>> {
        let key = key.to_owned();
        self.read(move |txn| {
            let table = txn.open_table(KV).map_err(backend)?;
            let found = table.get(key.as_str()).map_err(backend)?;
            found
                .map(|v| codec::decode_value(&key, v.value()))
                .transpose()
        })
        .boxed()
    }

    fn list(&self, prefix: &str) -> BoxFuture<'_, Result<(Vec<KeyValue>, Revision)>> {
        let prefix = prefix.to_owned();
        self.read(move |txn| {
            let meta = txn.open_table(META).map_err(backend)?;
            let revision = meta
                .get(META_REVISION)
                .map_err(backend)?
                .map_or(0, |v| v.value());
            let table = txn.open_table(KV).map_err(backend)?;
            let mut items = Vec::new();
            for entry in table.range(prefix.as_str()..).map_err(backend)? {
                let (key, value) = entry.map_err(backend)?;
                let key = key.value();
                if !key.starts_with(prefix.as_str()) {
                    break;
                }
                items.push(codec::decode_value(key, value.value())?);
            }
            Ok((items, revision))
        })
        .boxed()
    }

    fn txn(&self, ops: Vec<Op>) -> BoxFuture<'_, Result<Revision>> {
        self.request(move |reply| Request::Txn { ops, reply })
            .boxed()
    }

    fn watch(&self, prefix: &str, after: Revision) -> BoxFuture<'_, Result<WatchStream>> {
        let prefix = prefix.to_owned();
        async move {
            let (live_from, rx) = self.shared.hub.subscribe(&prefix);
            let history = if after < live_from {
                let prefix = prefix.clone();
                self.read(move |txn| read_history(txn, &prefix, after, live_from))
                    .await?
            } else {
                Vec::new()
            };
            let live = hub::live_stream(rx, after.max(live_from), self.shared.hub.clone());
            let stream = futures_util::stream::iter(history.into_iter().map(Ok)).chain(live);
            Ok(Box::pin(stream) as WatchStream)
        }
        .boxed()
    }

    fn current_revision(&self) -> BoxFuture<'_, Result<Revision>> {
        let revision = self.shared.revision.load(Ordering::SeqCst);
        async move { Ok(revision) }.boxed()
    }

    fn compact(&self, revision: Revision) -> BoxFuture<'_, Result<()>> {
        self.request(move |reply| Request::Compact { revision, reply })
            .boxed()
    }
}

/// Events under `prefix` with revisions in `(after, until]`, one batch per
/// revision, from a snapshot that must still hold them.
fn read_history(
    txn: &redb::ReadTransaction,
    prefix: &str,
    after: Revision,
    until: Revision,
) -> Result<Vec<EventBatch>> {
    let meta = txn.open_table(META).map_err(backend)?;
    let compacted = meta
        .get(META_COMPACTED)
        .map_err(backend)?
        .map_or(0, |v| v.value());
    if after < compacted {
        return Err(Error::Compacted {
            requested: after,
            compacted,
        });
    }
    let table = txn.open_table(HISTORY).map_err(backend)?;
    let mut batches: Vec<EventBatch> = Vec::new();
    for entry in table
        .range((after + 1, 0)..=(until, u32::MAX))
        .map_err(backend)?
    {
        let (key, value) = entry.map_err(backend)?;
        let (revision, _) = key.value();
        let event = codec::decode_event(revision, value.value())?;
        if !event.kv.key.starts_with(prefix) {
            continue;
        }
        match batches.last_mut() {
            Some(batch) if batch[0].revision() == revision => batch.push(event),
            _ => batches.push(vec![event]),
        }
    }
    Ok(batches)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &Path) -> std::future::Ready<EmbeddedStore> {
        std::future::ready(EmbeddedStore::open(dir, EmbeddedOptions::default()).unwrap())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conforms() {
        crate::conformance::run_all(open).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn history_is_compacted_automatically() {
        let dir = tempfile::tempdir().unwrap();
        let options = EmbeddedOptions {
            history_revisions: 10,
            ..EmbeddedOptions::default()
        };
        let store = EmbeddedStore::open(dir.path(), options).unwrap();
        for i in 0..40 {
            let op = Op::Create {
                key: format!("/k/{i}"),
                value: bytes::Bytes::from_static(b"v"),
            };
            store.txn(vec![op]).await.unwrap();
        }
        let compacted = store.compacted_revision();
        assert!((28..=30).contains(&compacted), "compacted at {compacted}");
        assert!(matches!(
            store.watch("/k/", 1).await,
            Err(Error::Compacted { .. })
        ));
        assert!(store.watch("/k/", 40 - 10).await.is_ok());
        assert_eq!(store.list("/k/").await.unwrap().0.len(), 40);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_transactions_share_commits() {
        let dir = tempfile::tempdir().unwrap();
        let batches = Arc::new(AtomicU64::new(0));
        let counted = batches.clone();
        let observer: CommitObserver = Arc::new(move |_, _| {
            counted.fetch_add(1, Ordering::SeqCst);
        });
        let options = EmbeddedOptions {
            commit_observer: Some(observer),
            ..EmbeddedOptions::default()
        };
        let store = EmbeddedStore::open(dir.path(), options).unwrap();
        let writes = (0..200).map(|i| {
            let op = Op::Create {
                key: format!("/g/{i}"),
                value: bytes::Bytes::from_static(b"v"),
            };
            store.txn(vec![op])
        });
        let revisions = futures_util::future::join_all(writes).await;
        assert!(revisions.iter().all(Result::is_ok));
        let commits = batches.load(Ordering::SeqCst);
        assert!(
            commits < 200,
            "200 concurrent writes took {commits} commits: no grouping"
        );
    }
}
