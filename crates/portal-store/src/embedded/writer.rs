//! The single writer: drains queued transactions into one redb write
//! transaction, commits it with one fsync, then publishes and acknowledges.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;
use redb::{ReadableTable, Table};
use tokio::sync::{mpsc, oneshot};

use super::{
    backend, codec, EmbeddedOptions, Shared, HISTORY, KV, META, META_COMPACTED, META_REVISION,
};
use crate::{Error, Event, EventBatch, EventKind, KeyValue, Op, Result, Revision};

#[derive(Debug)]
pub(super) enum Request {
    Txn {
        ops: Vec<Op>,
        reply: oneshot::Sender<Result<Revision>>,
    },
    Compact {
        revision: Revision,
        reply: oneshot::Sender<Result<()>>,
    },
}

pub(super) fn run(shared: &Shared, mut rx: mpsc::Receiver<Request>, options: &EmbeddedOptions) {
    let mut batch = Vec::with_capacity(options.max_batch);
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < options.max_batch {
            match rx.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        let started = Instant::now();
        let transactions = batch.len();
        commit_batch(shared, &mut batch, options);
        if let Some(observe) = &options.commit_observer {
            observe(transactions, started.elapsed());
        }
    }
    tracing::debug!("store writer stopped");
}

/// What one request will be answered with once the batch is durable.
enum Outcome {
    Txn(oneshot::Sender<Result<Revision>>, Result<Revision>),
    Compact(oneshot::Sender<Result<()>>, Result<()>),
}

fn commit_batch(shared: &Shared, batch: &mut Vec<Request>, options: &EmbeddedOptions) {
    let start_revision = shared.revision.load(Ordering::SeqCst);
    let mut revision = start_revision;
    let mut compacted = shared.compacted.load(Ordering::SeqCst);
    let mut outcomes = Vec::with_capacity(batch.len());
    let mut published: Vec<EventBatch> = Vec::new();

    let result = (|| -> Result<()> {
        let txn = shared.db.begin_write().map_err(backend)?;
        {
            let mut kv = txn.open_table(KV).map_err(backend)?;
            let mut history = txn.open_table(HISTORY).map_err(backend)?;
            for request in batch.drain(..) {
                match request {
                    Request::Txn { ops, reply } if ops.is_empty() => {
                        outcomes.push(Outcome::Txn(reply, Ok(revision)));
                    }
                    Request::Txn { ops, reply } => {
                        match apply(&mut kv, &mut history, revision + 1, ops) {
                            Ok(events) => {
                                revision += 1;
                                published.push(events);
                                outcomes.push(Outcome::Txn(reply, Ok(revision)));
                            }
                            Err(e) => outcomes.push(Outcome::Txn(reply, Err(e))),
                        }
                    }
                    Request::Compact {
                        revision: target,
                        reply,
                    } => {
                        let cut = target.min(revision);
                        let done = compact(&mut history, compacted, cut).map(|c| compacted = c);
                        outcomes.push(Outcome::Compact(reply, done));
                    }
                }
            }
            // Automatic compaction, amortized: only once history has grown a
            // tenth past its bound.
            let slack = (options.history_revisions / 10).max(1);
            if revision > compacted + options.history_revisions + slack {
                compacted = compact(
                    &mut history,
                    compacted,
                    revision - options.history_revisions,
                )?;
            }
            let mut meta = txn.open_table(META).map_err(backend)?;
            meta.insert(META_REVISION, revision).map_err(backend)?;
            meta.insert(META_COMPACTED, compacted).map_err(backend)?;
        }
        // Durability::Immediate (the default): fsync before returning.
        txn.commit().map_err(backend)
    })();

    match result {
        Ok(()) => {
            shared.compacted.store(compacted, Ordering::SeqCst);
            shared.hub.publish(revision, &published);
            shared.revision.store(revision, Ordering::SeqCst);
            for outcome in outcomes {
                match outcome {
                    Outcome::Txn(reply, result) => drop(reply.send(result)),
                    Outcome::Compact(reply, result) => drop(reply.send(result)),
                }
            }
        }
        Err(error) => {
            tracing::error!(%error, "store commit failed");
            for outcome in outcomes {
                match outcome {
                    Outcome::Txn(reply, _) => drop(reply.send(Err(error_copy(&error)))),
                    Outcome::Compact(reply, _) => drop(reply.send(Err(error_copy(&error)))),
                }
            }
            // Requests not reached before the failure were dropped with the
            // batch: their callers see `Error::Closed`, and nothing was written.
        }
    }
}

fn error_copy(error: &Error) -> Error {
    Error::Backend(error.to_string())
}

/// Checks every precondition, then writes: a transaction is all or nothing.
fn apply(
    kv: &mut Table<&str, &[u8]>,
    history: &mut Table<(u64, u32), &[u8]>,
    revision: Revision,
    ops: Vec<Op>,
) -> Result<EventBatch> {
    let mut seen = HashSet::with_capacity(ops.len());
    let mut current = Vec::with_capacity(ops.len());
    for op in &ops {
        let key = op.key();
        if !seen.insert(key) {
            return Err(Error::DuplicateKey {
                key: key.to_owned(),
            });
        }
        let existing = kv
            .get(key)
            .map_err(backend)?
            .map(|v| codec::decode_value(key, v.value()))
            .transpose()?;
        check(op, existing.as_ref())?;
        current.push(existing);
    }

    let mut events = Vec::with_capacity(ops.len());
    for (index, (op, prev)) in ops.into_iter().zip(current).enumerate() {
        let event = match op {
            Op::Create { key, value } | Op::Update { key, value, .. } => {
                let create_revision = prev.as_ref().map_or(revision, |p| p.create_revision);
                kv.insert(
                    key.as_str(),
                    codec::encode_value(create_revision, revision, &value).as_slice(),
                )
                .map_err(backend)?;
                Event {
                    kind: EventKind::Put,
                    kv: KeyValue {
                        key,
                        value,
                        create_revision,
                        mod_revision: revision,
                    },
                    prev,
                }
            }
            Op::Delete { key, .. } => {
                kv.remove(key.as_str()).map_err(backend)?;
                let create_revision = prev.as_ref().map_or(revision, |p| p.create_revision);
                Event {
                    kind: EventKind::Delete,
                    kv: KeyValue {
                        key,
                        value: Bytes::new(),
                        create_revision,
                        mod_revision: revision,
                    },
                    prev,
                }
            }
        };
        let index = u32::try_from(index).map_err(|_| Error::Backend("too many ops".into()))?;
        history
            .insert((revision, index), codec::encode_event(&event).as_slice())
            .map_err(backend)?;
        events.push(event);
    }
    Ok(events)
}

fn check(op: &Op, existing: Option<&KeyValue>) -> Result<()> {
    match (op, existing) {
        (Op::Create { key, .. }, Some(_)) => Err(Error::AlreadyExists { key: key.clone() }),
        (Op::Create { .. }, None) => Ok(()),
        (Op::Update { key, .. } | Op::Delete { key, .. }, None) => {
            Err(Error::NotFound { key: key.clone() })
        }
        (
            Op::Update {
                key,
                expected_revision,
                ..
            },
            Some(found),
        )
        | (
            Op::Delete {
                key,
                expected_revision: Some(expected_revision),
            },
            Some(found),
        ) if found.mod_revision != *expected_revision => Err(Error::Conflict {
            key: key.clone(),
            expected: *expected_revision,
            found: found.mod_revision,
        }),
        _ => Ok(()),
    }
}

/// Drops history entries up to `cut`; returns the new compacted revision.
fn compact(
    history: &mut Table<(u64, u32), &[u8]>,
    compacted: Revision,
    cut: Revision,
) -> Result<Revision> {
    if cut <= compacted {
        return Ok(compacted);
    }
    history
        .retain_in(..=(cut, u32::MAX), |_, _| false)
        .map_err(backend)?;
    Ok(cut)
}
