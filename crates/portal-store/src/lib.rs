//! The storage contract of Portal: keys with revisions, all-or-nothing
//! transactions, and watches that resume from any revision still in history.
//!
//! One global revision counts every committed transaction (like etcd): a
//! transaction's writes all carry the revision it committed at, and
//! `resourceVersion` on the API is that number. Backends: [`embedded`] (redb,
//! the default) and [`etcd`] (several API servers on one etcd cluster).
//! [`conformance`] holds the one test suite
//! every backend must pass.

use std::fmt;
use std::pin::Pin;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::Stream;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub mod embedded;
pub mod etcd;
#[cfg(any(test, feature = "conformance"))]
pub mod etcd_cluster;

pub use embedded::{EmbeddedOptions, EmbeddedStore};
pub use etcd::{EtcdOptions, EtcdStore, EtcdTls};

/// The global revision: increases by one with every committed transaction.
pub type Revision = u64;

/// A key with its current value and revisions.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Bytes,
    /// The revision at which the key was created.
    pub create_revision: Revision,
    /// The revision of the last write to the key (its `resourceVersion`).
    pub mod_revision: Revision,
}

impl fmt::Debug for KeyValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyValue")
            .field("key", &self.key)
            .field("value_len", &self.value.len())
            .field("create_revision", &self.create_revision)
            .field("mod_revision", &self.mod_revision)
            .finish()
    }
}

/// One write inside a transaction. Each op names its precondition, so every
/// write is a compare-and-swap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Write a key that must not exist.
    Create { key: String, value: Bytes },
    /// Overwrite a key whose `mod_revision` must equal `expected_revision`.
    Update {
        key: String,
        value: Bytes,
        expected_revision: Revision,
    },
    /// Remove a key; when `expected_revision` is given it must match.
    Delete {
        key: String,
        expected_revision: Option<Revision>,
    },
}

impl Op {
    pub fn key(&self) -> &str {
        match self {
            Op::Create { key, .. } | Op::Update { key, .. } | Op::Delete { key, .. } => key,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// A change seen by a watch. For `Delete`, `kv.value` is empty, `kv.mod_revision`
/// is the revision of the deletion and `prev` holds the deleted value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub kv: KeyValue,
    /// The value before this change (`None` for a create).
    pub prev: Option<KeyValue>,
}

impl Event {
    pub fn revision(&self) -> Revision {
        self.kv.mod_revision
    }
}

/// The events of one committed transaction, in commit order.
pub type EventBatch = Vec<Event>;

/// Events with revisions greater than the one the watch started after, in
/// order, without gaps. The stream ends with an error if the watcher falls too
/// far behind or the store closes; the watcher then resumes from the last
/// revision it saw.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<EventBatch>> + Send>>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A `Create` found the key already present.
    #[error("key {key:?} already exists")]
    AlreadyExists { key: String },
    /// An `Update` or `Delete` found a different revision than expected.
    #[error("key {key:?} was modified: expected revision {expected}, found {found}")]
    Conflict {
        key: String,
        expected: Revision,
        found: Revision,
    },
    /// An `Update` or `Delete` found no key.
    #[error("key {key:?} not found")]
    NotFound { key: String },
    /// A transaction named the same key twice.
    #[error("key {key:?} appears twice in one transaction")]
    DuplicateKey { key: String },
    /// A watch asked for history that compaction has removed.
    #[error("revision {requested} has been compacted (oldest available is after {compacted})")]
    Compacted {
        requested: Revision,
        compacted: Revision,
    },
    /// A watcher did not keep up with the stream of changes.
    #[error("watcher fell behind and was closed")]
    WatcherLagged,
    /// The store is shutting down.
    #[error("store is closed")]
    Closed,
    /// Stored bytes could not be decoded.
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// The backend failed (I/O, database).
    #[error("storage backend failed: {0}")]
    Backend(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The store every Portal component reads and writes through. Object safe, so
/// the API server can choose the backend at start.
pub trait Store: Send + Sync + 'static {
    /// The current value of one key.
    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<KeyValue>>>;

    /// Every key starting with `prefix`, in key order, with the revision of the
    /// snapshot they were read from.
    fn list(&self, prefix: &str) -> BoxFuture<'_, Result<(Vec<KeyValue>, Revision)>>;

    /// Applies `ops` atomically at one new revision, returned once the change
    /// is durable. If any precondition fails nothing is written.
    fn txn(&self, ops: Vec<Op>) -> BoxFuture<'_, Result<Revision>>;

    /// Changes to keys under `prefix` with revisions after `after`, first from
    /// history, then live. `Error::Compacted` if `after` is older than history.
    fn watch(&self, prefix: &str, after: Revision) -> BoxFuture<'_, Result<WatchStream>>;

    /// The revision of the last committed transaction.
    fn current_revision(&self) -> BoxFuture<'_, Result<Revision>>;

    /// Drops history up to and including `revision`.
    fn compact(&self, revision: Revision) -> BoxFuture<'_, Result<()>>;

    /// Whether the value at `key` is kept in an outdated form (sealed with
    /// a key that is no longer the one writes use), so that an update that
    /// changes nothing must still write it. Plain stores: never.
    fn outdated(&self, _key: &str) -> BoxFuture<'_, Result<bool>> {
        Box::pin(async { Ok(false) })
    }
}
