//! The etcd backend: the [`Store`] contract on an etcd v3 cluster, for when
//! one machine is not enough (several API servers on one etcd).
//!
//! The mapping is direct because the contract was shaped after etcd:
//! revisions are etcd's revisions, every [`Op`] is a compare on the key's
//! `mod_revision` in one etcd transaction (so two API servers can never both
//! win), and a watch is an etcd watch with previous values. What etcd does
//! differently is bridged here:
//! - a failed transaction must say which precondition failed and how: the
//!   transaction's `else` branch reads the keys in the same atomic step;
//! - Portal's `compact(r)` drops history *up to and including* `r`, etcd's
//!   keeps `r` readable, so it becomes etcd's compaction at `r + 1`;
//! - large lists are read in pages at one revision (gRPC messages are
//!   bounded), so a list is still one snapshot.
//!
//! The client is etcd's v3 API generated into [`api`] and committed (no
//! `protoc` needed to build Portal), one [`member`] connection per member.

pub mod api;
mod member;

pub use member::channel;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tonic::{Status, Streaming};

use api::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use api::etcdserverpb::kv_client::KvClient;
use api::etcdserverpb::{
    request_op, response_op, watch_request, CompactionRequest, Compare, DeleteRangeRequest,
    PutRequest, RangeRequest, RequestOp, TxnRequest, WatchCreateRequest, WatchRequest,
    WatchResponse,
};
use api::mvccpb::{self, event::EventType};
use member::Member;

use crate::{
    Error, Event, EventBatch, EventKind, KeyValue, Op, Result, Revision, Store, WatchStream,
};

/// Keys read per page of a list: well under gRPC's message limit for
/// Kubernetes-sized objects, few round trips for large lists.
const LIST_PAGE: i64 = 500;

/// The largest response accepted from etcd (a page of large objects).
const MAX_MESSAGE: usize = 256 * 1024 * 1024;

/// The pause before a request is sent to the next member.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Client certificates and the CA to verify etcd's serving certificate by.
#[derive(Clone, Debug)]
pub struct EtcdTls {
    pub ca_pem: Vec<u8>,
    /// Client certificate and key, when etcd asks for them
    /// (`--client-cert-auth`).
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// Where the etcd cluster is and how to reach it.
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    /// `http://host:port` or `https://host:port`, one per member.
    pub endpoints: Vec<String>,
    pub tls: Option<EtcdTls>,
    /// Give up on an unreachable cluster after this long (per request).
    pub request_timeout: Duration,
}

impl EtcdOptions {
    /// Options from a `--datastore-endpoint` value: `etcd://h:p[,h:p…]`,
    /// `http://…` or `https://…` (comma-separated members).
    pub fn from_endpoint(value: &str) -> Result<Self> {
        let mut endpoints = Vec::new();
        let mut secure = None;
        for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (scheme, rest) = match part.split_once("://") {
                Some((scheme, rest)) => (scheme, rest),
                None => ("etcd", part),
            };
            let tls = match scheme {
                "etcd" | "http" => false,
                "https" => true,
                other => {
                    return Err(Error::Backend(format!(
                        "datastore endpoint {part:?}: unknown scheme {other:?} (use etcd://, http:// or https://)"
                    )))
                }
            };
            let rest = rest.trim_end_matches('/');
            if rest.is_empty() || rest.contains('/') {
                return Err(Error::Backend(format!(
                    "datastore endpoint {part:?}: expected host:port"
                )));
            }
            if secure.is_some_and(|s| s != tls) {
                return Err(Error::Backend(
                    "datastore endpoints mix https:// and plain members".into(),
                ));
            }
            secure = Some(tls);
            let scheme = if tls { "https" } else { "http" };
            endpoints.push(format!("{scheme}://{rest}"));
        }
        if endpoints.is_empty() {
            return Err(Error::Backend(
                "datastore endpoint names no etcd member".into(),
            ));
        }
        Ok(EtcdOptions {
            endpoints,
            tls: None,
            request_timeout: Duration::from_secs(10),
        })
    }

    /// Whether the endpoints ask for TLS.
    pub fn is_secure(&self) -> bool {
        self.endpoints.iter().any(|e| e.starts_with("https://"))
    }
}

/// A [`Store`] on an etcd cluster. Cheap to clone: the connections are
/// shared.
#[derive(Clone)]
pub struct EtcdStore {
    /// One connection per member, in the order given.
    members: Arc<[Member]>,
    /// The member requests go to until it fails.
    preferred: Arc<AtomicUsize>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore").finish_non_exhaustive()
    }
}

fn backend(error: Status) -> Error {
    Error::Backend(format!("etcd: {error}"))
}

fn revision(value: i64) -> Revision {
    Revision::try_from(value).unwrap_or(0)
}

fn signed(value: Revision) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The end of the key range that holds exactly the keys starting with
/// `prefix` (etcd's `range_end`).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key
}

fn key_value(kv: mvccpb::KeyValue) -> Result<KeyValue> {
    Ok(KeyValue {
        key: String::from_utf8(kv.key)
            .map_err(|_| Error::Corrupt("etcd key is not UTF-8".into()))?,
        value: kv.value,
        create_revision: revision(kv.create_revision),
        mod_revision: revision(kv.mod_revision),
    })
}

/// How a request that failed at the transport may be treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    /// The request never reached a member (no connection): safe to send to
    /// another.
    NotSent,
    /// The member went away while it had the request: a write may or may
    /// not have committed.
    Ambiguous,
    /// An answer: retrying will not change it.
    Final,
}

fn failure(status: &Status) -> Failure {
    match status.code() {
        // tonic says Unavailable, with a connect error, when no connection
        // could be made at all.
        tonic::Code::Unavailable if status.message().contains("connect") => Failure::NotSent,
        // A member that went away or stopped answering (our own request
        // timeout is Cancelled): the request may have been applied.
        tonic::Code::Unavailable
        | tonic::Code::DeadlineExceeded
        | tonic::Code::Cancelled
        | tonic::Code::Unknown => Failure::Ambiguous,
        _ => Failure::Final,
    }
}

/// A running etcd watch: etcd's responses, and the request side kept open
/// while they are read (etcd ends a watch whose client half-closed only
/// once the stream is reset, which dropping both does).
struct Watch {
    responses: Streaming<WatchResponse>,
    _requests: tokio::sync::mpsc::Sender<WatchRequest>,
}

impl EtcdStore {
    /// Connects to the cluster and checks that it answers.
    pub async fn connect(options: &EtcdOptions) -> Result<Self> {
        if options.endpoints.is_empty() {
            return Err(Error::Backend("no etcd endpoints".into()));
        }
        // One connection per member, not one balanced channel: a dead
        // member must be left for the next one at once, and only this code
        // knows whether a failed write may be sent again.
        let members = options
            .endpoints
            .iter()
            .map(|endpoint| Member::new(endpoint, options))
            .collect::<Result<Vec<_>>>()?;
        let store = EtcdStore {
            members: members.into(),
            preferred: Arc::new(AtomicUsize::new(0)),
        };
        // Fail at start, clearly, rather than at the first request.
        tokio::time::timeout(options.request_timeout, store.current_revision())
            .await
            .map_err(|_| {
                Error::Backend(format!(
                    "etcd at {} did not answer within {:?}",
                    options.endpoints.join(","),
                    options.request_timeout
                ))
            })?
            .map_err(|error| {
                let why = match error {
                    Error::Backend(why) => why,
                    other => other.to_string(),
                };
                Error::Backend(format!("{} ({why})", options.endpoints.join(",")))
            })?;
        Ok(store)
    }

    /// The member requests go to now, and its index.
    fn member(&self) -> (usize, &Member) {
        let index = self.preferred.load(Ordering::Relaxed) % self.members.len();
        (index, &self.members[index])
    }

    /// Moves on from member `index` (unless another request already did).
    fn failed(&self, index: usize) {
        let next = (index + 1) % self.members.len();
        let _ = self
            .preferred
            .compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// How many times a request is sent before giving up: every member
    /// twice (one may be restarting).
    fn attempts(&self) -> usize {
        self.members.len() * 2
    }

    /// Runs a read, again on another member if this one failed.
    async fn read<T, F, Fut>(&self, mut attempt: F) -> Result<T>
    where
        F: FnMut(KvClient<member::Service>) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, Status>>,
    {
        let mut tries = 0;
        loop {
            let (index, member) = self.member();
            match attempt(member.kv()).await {
                Ok(response) => return Ok(response.into_inner()),
                Err(error) if failure(&error) != Failure::Final && tries + 1 < self.attempts() => {
                    tries += 1;
                    self.failed(index);
                    tracing::debug!(%error, tries, "etcd read failed; trying another member");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(error) => return Err(backend(error)),
            }
        }
    }

    async fn get_key(&self, key: &str) -> Result<Option<KeyValue>> {
        let response = self
            .read(|mut kv| {
                let request = RangeRequest {
                    key: key.as_bytes().to_vec(),
                    ..Default::default()
                };
                async move { kv.range(request).await }
            })
            .await?;
        response.kvs.into_iter().next().map(key_value).transpose()
    }

    async fn list_prefix(&self, prefix: &str) -> Result<(Vec<KeyValue>, Revision)> {
        let end = prefix_end(prefix);
        let mut items = Vec::new();
        let mut from = prefix.as_bytes().to_vec();
        let mut at: Option<i64> = None;
        loop {
            let request = RangeRequest {
                key: from.clone(),
                range_end: end.clone(),
                limit: LIST_PAGE,
                revision: at.unwrap_or(0),
                ..Default::default()
            };
            let page = self
                .read(|mut kv| {
                    let request = request.clone();
                    async move { kv.range(request).await }
                })
                .await?;
            let snapshot = page.header.as_ref().map_or(0, |h| h.revision);
            let at = *at.get_or_insert(snapshot);
            let next = match page.kvs.last() {
                Some(last) if page.more => {
                    let mut next = last.key.clone();
                    next.push(0);
                    Some(next)
                }
                _ => None,
            };
            for kv in page.kvs {
                let key = String::from_utf8_lossy(&kv.key).into_owned();
                match key_value(kv) {
                    Ok(item) => items.push(item),
                    // Not written by Portal: one bad key must not make the
                    // whole range unreadable.
                    Err(error) => tracing::warn!(%error, key, "skipping a key in etcd"),
                }
            }
            match next {
                Some(next) => from = next,
                None => return Ok((items, revision(at))),
            }
        }
    }

    async fn commit(&self, ops: Vec<Op>) -> Result<Revision> {
        if ops.is_empty() {
            return self.current_revision().await;
        }
        let mut seen = std::collections::HashSet::new();
        for op in &ops {
            if !seen.insert(op.key()) {
                return Err(Error::DuplicateKey {
                    key: op.key().to_owned(),
                });
            }
        }
        let txn = transaction(&ops);
        let mut tries = 0;
        let mut uncertain = false;
        let response = loop {
            let (index, member) = self.member();
            match member.kv().txn(txn.clone()).await {
                Ok(response) => break response.into_inner(),
                Err(error) => {
                    let failure = failure(&error);
                    if failure == Failure::Final || tries + 1 >= self.attempts() {
                        return Err(backend(error));
                    }
                    // Sending it again is safe even if the lost attempt
                    // committed: every op compares a revision, so at most
                    // one of the two can win (the answer below tells which).
                    uncertain |= failure == Failure::Ambiguous;
                    tries += 1;
                    self.failed(index);
                    tracing::debug!(%error, tries, "etcd write failed; trying another member");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
        };
        let at = response.header.as_ref().map_or(0, |h| revision(h.revision));
        if response.succeeded {
            return Ok(at);
        }
        // The else branch read every key in the same atomic step.
        let found: Vec<Option<KeyValue>> = response
            .responses
            .into_iter()
            .map(|r| match r.response {
                Some(response_op::Response::ResponseRange(range)) => {
                    range.kvs.into_iter().next().map(key_value).transpose()
                }
                _ => Ok(None),
            })
            .collect::<Result<_>>()?;
        if uncertain {
            if let Some(revision) = committed_at(&ops, &found) {
                return Ok(revision);
            }
            // Only deletes, all done: ours, most likely (had another client
            // deleted first, ours would have failed the same way).
            if ops.iter().all(|op| matches!(op, Op::Delete { .. }))
                && found.iter().all(Option::is_none)
            {
                return Ok(at);
            }
            // The lost attempt may have committed and been changed since:
            // saying "precondition failed" could be false.
            return Err(Error::Backend(
                "etcd: an etcd member went away during this write and its outcome is unknown; read the object again".into(),
            ));
        }
        Err(precondition_failure(&ops, &found))
    }

    /// Creates a watch on one member and waits for etcd to confirm it. The
    /// watch lasts as long as the returned [`Watch`]: dropping it ends the
    /// request side, and with both sides dropped the HTTP/2 stream is reset,
    /// which ends the watch in etcd.
    async fn start_watch(member: &Member, create: WatchCreateRequest) -> Result<Watch> {
        let request = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(create)),
        };
        let (requests, feed) = tokio::sync::mpsc::channel::<WatchRequest>(1);
        requests
            .send(request)
            .await
            .map_err(|_| Error::Backend("etcd watch: request channel closed".into()))?;
        let feed = futures_util::stream::unfold(feed, |mut feed| async move {
            feed.recv().await.map(|request| (request, feed))
        });
        let mut watch = member
            .watch()
            .watch(feed)
            .await
            .map_err(backend)?
            .into_inner();
        match watch.message().await.map_err(backend)? {
            Some(created) if created.created && !created.canceled => Ok(Watch {
                responses: watch,
                _requests: requests,
            }),
            Some(refused) if refused.compact_revision > 0 => Err(Error::Compacted {
                requested: 0,
                compacted: revision(refused.compact_revision).saturating_sub(1),
            }),
            Some(refused) => Err(Error::Backend(format!(
                "etcd refused the watch: {}",
                refused.cancel_reason
            ))),
            None => Err(Error::Backend("etcd closed the watch".into())),
        }
    }

    async fn open_watch(&self, prefix: &str, after: Revision) -> Result<WatchStream> {
        // etcd reports a compacted start only after the watch is created, a
        // moment later; a read at the start revision says so at once.
        let start = signed(after).saturating_add(1);
        if after > 0 {
            let request = RangeRequest {
                key: prefix.as_bytes().to_vec(),
                range_end: prefix_end(prefix),
                revision: start,
                count_only: true,
                ..Default::default()
            };
            let probe = self
                .read(|mut kv| {
                    let request = request.clone();
                    async move { kv.range(request).await }
                })
                .await;
            match probe {
                Err(Error::Backend(message)) if message.contains("has been compacted") => {
                    return Err(Error::Compacted {
                        requested: after,
                        compacted: after,
                    })
                }
                Err(Error::Backend(message)) if message.contains("future revision") => {}
                Err(error) => return Err(error),
                Ok(_) => {}
            }
        }
        let create = WatchCreateRequest {
            key: prefix.as_bytes().to_vec(),
            range_end: prefix_end(prefix),
            start_revision: start,
            prev_kv: true,
            progress_notify: true,
            ..Default::default()
        };
        let mut tries = 0;
        let (watch, member) = loop {
            let (index, member) = self.member();
            let error = match Self::start_watch(member, create.clone()).await {
                Ok(watch) => break (watch, index),
                Err(Error::Compacted { compacted, .. }) => {
                    return Err(Error::Compacted {
                        requested: after,
                        compacted,
                    })
                }
                Err(error) => error,
            };
            tries += 1;
            if tries >= self.attempts() {
                return Err(error);
            }
            self.failed(index);
            tracing::debug!(%error, tries, "etcd watch failed to start; trying another member");
            tokio::time::sleep(RETRY_PAUSE).await;
        };
        // A watch that breaks sends the next one (the caller resumes) to
        // another member.
        let store = self.clone();
        let stream = futures_util::stream::unfold(Some((watch, after)), move |state| {
            let store = store.clone();
            async move {
                let (mut watch, last) = state?;
                loop {
                    let response = match watch.responses.message().await {
                        Ok(Some(response)) => response,
                        Ok(None) => {
                            store.failed(member);
                            return Some((
                                Err(Error::Backend("etcd closed the watch".into())),
                                None,
                            ));
                        }
                        Err(error) => {
                            store.failed(member);
                            return Some((Err(backend(error)), None));
                        }
                    };
                    if response.canceled {
                        let error = if response.compact_revision > 0 {
                            Error::Compacted {
                                requested: last,
                                compacted: revision(response.compact_revision).saturating_sub(1),
                            }
                        } else {
                            Error::Backend(format!(
                                "etcd cancelled the watch: {}",
                                response.cancel_reason
                            ))
                        };
                        return Some((Err(error), None));
                    }
                    // Progress notifications carry no events.
                    if response.events.is_empty() {
                        continue;
                    }
                    // etcd never splits one revision over two responses (no
                    // fragmenting asked), so one response holds whole
                    // transactions.
                    let batches = match batches(response.events) {
                        Ok(batches) => batches,
                        Err(error) => return Some((Err(error), None)),
                    };
                    let last = batches
                        .last()
                        .and_then(|b| b.first())
                        .map_or(last, Event::revision);
                    return Some((Ok(batches), Some((watch, last))));
                }
            }
        });
        let flattened = futures_util::StreamExt::flat_map(stream, |item| {
            let items: Vec<Result<EventBatch>> = match item {
                Ok(batches) => batches.into_iter().map(Ok).collect(),
                Err(error) => vec![Err(error)],
            };
            futures_util::stream::iter(items)
        });
        Ok(Box::pin(flattened))
    }
}

/// `ops` as one etcd transaction: each op's precondition compares the key's
/// `mod_revision`; if all hold, the writes; if not, a read of every key (so
/// the answer says which precondition failed, read in the same step).
fn transaction(ops: &[Op]) -> TxnRequest {
    let mut txn = TxnRequest::default();
    for op in ops {
        let key = op.key().as_bytes().to_vec();
        let (result, expected) = match op {
            Op::Create { .. } => (CompareResult::Equal, 0),
            Op::Update {
                expected_revision, ..
            } => (CompareResult::Equal, signed(*expected_revision)),
            Op::Delete {
                expected_revision: Some(expected),
                ..
            } => (CompareResult::Equal, signed(*expected)),
            Op::Delete {
                expected_revision: None,
                ..
            } => (CompareResult::Greater, 0),
        };
        txn.compare.push(Compare {
            result: result as i32,
            target: CompareTarget::Mod as i32,
            key: key.clone(),
            range_end: Vec::new(),
            target_union: Some(TargetUnion::ModRevision(expected)),
        });
        let write = match op {
            Op::Create { value, .. } | Op::Update { value, .. } => {
                request_op::Request::RequestPut(PutRequest {
                    key: key.clone(),
                    value: value.clone(),
                    ..Default::default()
                })
            }
            Op::Delete { .. } => request_op::Request::RequestDeleteRange(DeleteRangeRequest {
                key: key.clone(),
                ..Default::default()
            }),
        };
        txn.success.push(RequestOp {
            request: Some(write),
        });
        txn.failure.push(RequestOp {
            request: Some(request_op::Request::RequestRange(RangeRequest {
                key,
                ..Default::default()
            })),
        });
    }
    txn
}

/// Whether the keys show `ops` committed (by an earlier attempt whose
/// answer was lost), and at which revision: every written key holds exactly
/// the written value, all at one revision, and every deleted key is gone.
fn committed_at(ops: &[Op], found: &[Option<KeyValue>]) -> Option<Revision> {
    let mut at = None;
    for (op, found) in ops.iter().zip(found) {
        match (op, found) {
            (Op::Create { value, .. } | Op::Update { value, .. }, Some(kv))
                if kv.value == value =>
            {
                if at.is_some_and(|at| at != kv.mod_revision) {
                    return None;
                }
                at = Some(kv.mod_revision);
            }
            (Op::Delete { .. }, None) => {}
            _ => return None,
        }
    }
    at
}

/// The first precondition of `ops` that the keys as `found` break, named as
/// the embedded store names it.
fn precondition_failure(ops: &[Op], found: &[Option<KeyValue>]) -> Error {
    for (op, found) in ops.iter().zip(found) {
        let key = op.key().to_owned();
        let found = found.as_ref().map(|kv| kv.mod_revision);
        match (op, found) {
            (Op::Create { .. }, Some(_)) => return Error::AlreadyExists { key },
            (Op::Update { .. } | Op::Delete { .. }, None) => return Error::NotFound { key },
            (
                Op::Update {
                    expected_revision: expected,
                    ..
                }
                | Op::Delete {
                    expected_revision: Some(expected),
                    ..
                },
                Some(found),
            ) if found != *expected => {
                return Error::Conflict {
                    key,
                    expected: *expected,
                    found,
                }
            }
            _ => {}
        }
    }
    Error::Backend("etcd refused a transaction whose preconditions all hold".into())
}

/// etcd's events of one response as Portal's batches, one per revision.
fn batches(events: Vec<mvccpb::Event>) -> Result<Vec<EventBatch>> {
    let mut batches: Vec<EventBatch> = Vec::new();
    for event in events {
        let kind = EventType::try_from(event.r#type)
            .map_err(|_| Error::Corrupt(format!("etcd event type {}", event.r#type)))?;
        let Some(kv) = event.kv else { continue };
        let prev = event.prev_kv.map(key_value).transpose()?;
        let event = match kind {
            EventType::Put => Event {
                kind: EventKind::Put,
                kv: key_value(kv)?,
                prev,
            },
            EventType::Delete => {
                let mut deleted = key_value(kv)?;
                deleted.value = Bytes::new();
                deleted.create_revision = prev.as_ref().map_or(0, |p| p.create_revision);
                Event {
                    kind: EventKind::Delete,
                    kv: deleted,
                    prev,
                }
            }
        };
        match batches.last_mut() {
            Some(batch) if batch[0].revision() == event.revision() => batch.push(event),
            _ => batches.push(vec![event]),
        }
    }
    Ok(batches)
}

impl Store for EtcdStore {
    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<KeyValue>>> {
        let key = key.to_owned();
        async move { self.get_key(&key).await }.boxed()
    }

    fn list(&self, prefix: &str) -> BoxFuture<'_, Result<(Vec<KeyValue>, Revision)>> {
        let prefix = prefix.to_owned();
        async move { self.list_prefix(&prefix).await }.boxed()
    }

    fn txn(&self, ops: Vec<Op>) -> BoxFuture<'_, Result<Revision>> {
        self.commit(ops).boxed()
    }

    fn watch(&self, prefix: &str, after: Revision) -> BoxFuture<'_, Result<WatchStream>> {
        let prefix = prefix.to_owned();
        async move { self.open_watch(&prefix, after).await }.boxed()
    }

    fn current_revision(&self) -> BoxFuture<'_, Result<Revision>> {
        async move {
            let response = self
                .read(|mut kv| async move {
                    let request = RangeRequest {
                        key: b"/".to_vec(),
                        count_only: true,
                        ..Default::default()
                    };
                    kv.range(request).await
                })
                .await?;
            Ok(response.header.map_or(0, |h| revision(h.revision)))
        }
        .boxed()
    }

    fn compact(&self, up_to: Revision) -> BoxFuture<'_, Result<()>> {
        async move {
            // Portal drops `up_to` itself; etcd keeps the revision it is
            // given, so compact at the next one (never past the present).
            let current = self.current_revision().await?;
            let at = up_to.saturating_add(1).min(current);
            if at == 0 {
                return Ok(());
            }
            let compacted = self
                .read(|mut kv| async move {
                    let request = CompactionRequest {
                        revision: signed(at),
                        physical: false,
                    };
                    kv.compact(request).await
                })
                .await;
            match compacted {
                Ok(_) => Ok(()),
                // Someone compacted as far already.
                Err(Error::Backend(message)) if message.contains("has been compacted") => Ok(()),
                Err(error) => Err(error),
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd_cluster::EtcdCluster;

    async fn connect(cluster: &EtcdCluster) -> EtcdStore {
        EtcdStore::connect(&EtcdOptions::from_endpoint(&cluster.endpoint()).unwrap())
            .await
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conforms_on_one_member() {
        let cluster = EtcdCluster::start(1);
        crate::conformance::run_all(|_| connect(&cluster)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conforms_on_three_members() {
        let cluster = EtcdCluster::start(3);
        crate::conformance::run_all(|_| connect(&cluster)).await;
    }

    /// Two clients (two API servers) racing to create the same keys: each
    /// key has exactly one winner, and the loser is told it exists.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn racing_creates_have_one_winner() {
        let cluster = EtcdCluster::start(1);
        let (a, b) = (connect(&cluster).await, connect(&cluster).await);
        let attempt = |store: EtcdStore, who: &'static str| async move {
            let mut won = Vec::new();
            for i in 0..50 {
                let op = Op::Create {
                    key: format!("/race/{i}"),
                    value: Bytes::from(who),
                };
                match store.txn(vec![op]).await {
                    Ok(_) => won.push(i),
                    Err(Error::AlreadyExists { .. }) => {}
                    Err(error) => panic!("{error}"),
                }
            }
            won
        };
        let (won_a, won_b) = tokio::join!(attempt(a.clone(), "a"), attempt(b, "b"));
        assert_eq!(won_a.len() + won_b.len(), 50);
        let (items, _) = a.list("/race/").await.unwrap();
        assert_eq!(items.len(), 50);
    }

    /// etcd's count of watchers (its `/metrics`, plain HTTP on the client
    /// port).
    fn etcd_watchers(endpoint: &str) -> u64 {
        use std::io::{Read, Write};
        let address = endpoint.trim_start_matches("http://");
        let mut connection = std::net::TcpStream::connect(address).unwrap();
        write!(
            connection,
            "GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        connection.read_to_string(&mut text).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("etcd_debugging_mvcc_watcher_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    }

    /// A dropped watch ends in etcd too (not only on this side): else every
    /// client that went away would leave a watcher behind.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropped_watches_end_in_etcd() {
        let cluster = EtcdCluster::start(1);
        let endpoint = cluster.endpoint();
        let store = connect(&cluster).await;
        let before = etcd_watchers(&endpoint);
        let mut watches = Vec::new();
        for _ in 0..5 {
            watches.push(store.watch("/dropped/", 0).await.unwrap());
        }
        assert_eq!(etcd_watchers(&endpoint), before + 5);
        drop(watches);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while etcd_watchers(&endpoint) != before {
            assert!(
                std::time::Instant::now() < deadline,
                "etcd still has {} watchers, {before} before",
                etcd_watchers(&endpoint)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A list larger than one page is still one snapshot.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn long_lists_are_paged_at_one_revision() {
        let cluster = EtcdCluster::start(1);
        let store = connect(&cluster).await;
        let total = usize::try_from(LIST_PAGE).unwrap() * 2 + 7;
        let ops: Vec<Op> = (0..total)
            .map(|i| Op::Create {
                key: format!("/paged/{i:05}"),
                value: Bytes::from_static(b"v"),
            })
            .collect();
        for chunk in ops.chunks(100) {
            store.txn(chunk.to_vec()).await.unwrap();
        }
        let (items, revision) = store.list("/paged/").await.unwrap();
        assert_eq!(items.len(), total);
        assert!(items.windows(2).all(|w| w[0].key < w[1].key));
        assert_eq!(revision, store.current_revision().await.unwrap());
    }

    /// Losing one member of three: reads, writes and a watch carry on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn survives_losing_a_member() {
        let mut cluster = EtcdCluster::start(3);
        let store = connect(&cluster).await;
        let mut watch = store.watch("/ha/", 0).await.unwrap();
        let first = store
            .txn(vec![Op::Create {
                key: "/ha/before".into(),
                value: Bytes::from_static(b"v"),
            }])
            .await
            .unwrap();
        cluster.kill(0);
        // Every write succeeds: the store moves on to a live member.
        let written = 20;
        for i in 0..written {
            let op = Op::Create {
                key: format!("/ha/after-{i}"),
                value: Bytes::from_static(b"v"),
            };
            store.txn(vec![op]).await.unwrap();
        }
        let (items, _) = store.list("/ha/").await.unwrap();
        assert_eq!(items.len(), written + 1);
        // The watch saw the first write, or ended with an error if it was
        // on the killed member; the caller resumes from the last revision
        // it saw and misses nothing.
        use futures_util::StreamExt;
        let (resume_from, expected) = match watch.next().await.unwrap() {
            Ok(seen) => {
                assert_eq!(seen[0].revision(), first);
                (first, written)
            }
            Err(_) => (0, written + 1),
        };
        let mut resumed = store.watch("/ha/", resume_from).await.unwrap();
        let mut count = 0;
        while count < expected {
            let batch = tokio::time::timeout(Duration::from_secs(10), resumed.next())
                .await
                .expect("events in time")
                .unwrap()
                .unwrap();
            count += batch.len();
        }
        assert_eq!(count, expected);
    }

    fn stored(key: &str, value: &str, mod_revision: Revision) -> Option<KeyValue> {
        Some(KeyValue {
            key: key.into(),
            value: Bytes::from(value.to_owned()),
            create_revision: 1,
            mod_revision,
        })
    }

    /// A write sent again after its answer was lost: the keys tell whether
    /// the first attempt committed.
    #[test]
    fn lost_answers_are_resolved_from_the_keys() {
        let ops = vec![
            Op::Create {
                key: "/a".into(),
                value: Bytes::from_static(b"new"),
            },
            Op::Delete {
                key: "/b".into(),
                expected_revision: Some(3),
            },
        ];
        assert_eq!(committed_at(&ops, &[stored("/a", "new", 9), None]), Some(9));
        // Someone else's value, or the delete not done: not ours.
        assert_eq!(committed_at(&ops, &[stored("/a", "other", 9), None]), None);
        assert_eq!(
            committed_at(&ops, &[stored("/a", "new", 9), stored("/b", "x", 3)]),
            None
        );
        assert!(matches!(
            precondition_failure(&ops, &[stored("/a", "other", 9), None]),
            Error::AlreadyExists { .. }
        ));
        assert!(matches!(
            precondition_failure(&ops, &[None, stored("/b", "x", 4)]),
            Error::Conflict {
                expected: 3,
                found: 4,
                ..
            }
        ));
        assert!(matches!(
            precondition_failure(&ops, &[None, None]),
            Error::NotFound { .. }
        ));
    }

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end("/registry/"), b"/registry0".to_vec());
        assert_eq!(prefix_end("a"), b"b".to_vec());
        assert_eq!(prefix_end(""), vec![0]);
    }

    #[test]
    fn endpoints_parse() {
        let options = EtcdOptions::from_endpoint("etcd://127.0.0.1:2379,127.0.0.2:2379").unwrap();
        assert_eq!(
            options.endpoints,
            ["http://127.0.0.1:2379", "http://127.0.0.2:2379"]
        );
        assert!(!options.is_secure());
        let options = EtcdOptions::from_endpoint("https://etcd-0:2379/").unwrap();
        assert_eq!(options.endpoints, ["https://etcd-0:2379"]);
        assert!(options.is_secure());
        assert!(EtcdOptions::from_endpoint("").is_err());
        assert!(EtcdOptions::from_endpoint("mysql://x:1").is_err());
        assert!(EtcdOptions::from_endpoint("https://a:1,http://b:2").is_err());
    }
}
