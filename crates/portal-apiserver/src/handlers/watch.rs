//! Watch: newline-delimited JSON events, streamed from the watch cache's ring,
//! or from the store's history when the client resumes from further back.
//!
//! A list followed by a watch from the list's resourceVersion never misses
//! an event: the ring holds every event after its floor, and anything older
//! but still in the store's history is replayed from there. Past that, the
//! client gets 410 Expired and re-lists.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::StreamExt;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use portal_api::{Resource, Status};
use portal_store::{EventKind, Revision};
use tokio::sync::mpsc;

use super::list_options::{self, WatchStart};
use crate::registry::cache::{CacheEvent, CachedObject, WatchCache};
use crate::registry::lookup::{fresh, parse_revision, Filter};
use crate::server::http::{now_seconds, Body, Output, Query};
use crate::{store_error, ApiState, Scope};

/// Events a slow client may have queued before its watch blocks.
const CLIENT_QUEUE: usize = 256;
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(60);
/// Like Kubernetes' `--min-request-timeout`: watches end after a while so
/// clients re-establish them (spreading load); a client may ask for less.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// Who receives the events of one watch, and what it wants to see.
struct Watcher {
    resource: &'static Resource,
    prefix: String,
    filter: Filter,
    bookmarks: bool,
    output: Output,
    tx: mpsc::Sender<Bytes>,
    /// Set for a CRD whose webhook converts objects to the watched version.
    converting: Option<Arc<ApiState>>,
}

fn event_line(kind: &str, object: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(object.len() + 32);
    out.put_slice(b"{\"type\":\"");
    out.put_slice(kind.as_bytes());
    out.put_slice(b"\",\"object\":");
    out.put_slice(object);
    out.put_slice(b"}\n");
    out.freeze()
}

impl Watcher {
    /// Sends what `event` means for this watcher's selectors. `false` once
    /// the client has gone.
    async fn send(&self, event: &CacheEvent) -> bool {
        if !event.object.key.starts_with(&self.prefix) {
            return true;
        }
        let matches = |o: &CachedObject| self.filter.matches(self.resource, &o.value);
        let was = event.prev.as_deref().is_some_and(matches);
        let kind = match event.kind {
            EventKind::Delete if was => "DELETED",
            EventKind::Delete => return true,
            EventKind::Put => match (was, matches(&event.object)) {
                (false, true) => "ADDED",
                (true, true) => "MODIFIED",
                (true, false) => "DELETED",
                (false, false) => return true,
            },
        };
        self.send_line(kind, &event.object).await
    }

    /// Sends the event line of `object`; `false` once the client has gone
    /// or the object could not be converted (the watch then ends with the
    /// error, as upstream's does).
    async fn send_line(&self, kind: &str, object: &CachedObject) -> bool {
        let converted;
        let object = match (&self.converting, self.output) {
            (Some(state), Output::Json | Output::Protobuf | Output::Table(_)) => {
                let object = Arc::new(object.clone());
                match crate::registry::conversion::served(state, self.resource, object).await {
                    Ok(item) => {
                        converted = item;
                        converted.as_ref()
                    }
                    Err(status) => {
                        let _ = self.tx.send(event_line("ERROR", &status.to_body())).await;
                        return false;
                    }
                }
            }
            _ => object,
        };
        self.tx.send(self.line(kind, object)).await.is_ok()
    }

    /// The event line for `object`: the object itself, or a one-row Table.
    fn line(&self, kind: &str, object: &CachedObject) -> Bytes {
        match self.output {
            Output::Json | Output::Protobuf => event_line(kind, &object.served_json(self.resource)),
            Output::Metadata => {
                let partial = crate::server::http::partial_metadata(&object.value);
                event_line(kind, &serde_json::to_vec(&partial).unwrap_or_default())
            }
            Output::Table(include) => {
                let rv = portal_api::meta::meta_str(&object.value, "resourceVersion").unwrap_or("");
                let meta = serde_json::json!({"resourceVersion": rv});
                let table = portal_api::table::table(
                    self.resource,
                    [&object.value],
                    now_seconds(),
                    include,
                    meta,
                );
                event_line(kind, &serde_json::to_vec(&table).unwrap_or_default())
            }
        }
    }

    /// A BOOKMARK at `revision`; `initial_events_end` marks the end of the
    /// state a `sendInitialEvents` watch started with.
    async fn send_bookmark(&self, revision: Revision, initial_events_end: bool) -> bool {
        let (kind, api_version) = match self.output {
            Output::Metadata => ("PartialObjectMetadata", "meta.k8s.io/v1".to_owned()),
            _ => (self.resource.kind_name, self.resource.api_version()),
        };
        let mut object = serde_json::json!({
            "kind": kind,
            "apiVersion": api_version,
            "metadata": {"resourceVersion": revision.to_string()},
        });
        if initial_events_end {
            object["metadata"]["annotations"] =
                serde_json::json!({"k8s.io/initial-events-end": "true"});
        }
        self.tx
            .send(event_line(
                "BOOKMARK",
                &serde_json::to_vec(&object).unwrap_or_default(),
            ))
            .await
            .is_ok()
    }

    async fn send_expired(&self, message: &str) {
        let status = Status::expired(message.to_owned()).to_json();
        let _ = self
            .tx
            .send(event_line(
                "ERROR",
                &serde_json::to_vec(&status).unwrap_or_default(),
            ))
            .await;
    }
}

pub(crate) async fn watch(
    state: &ApiState,
    scope: &Scope<'_>,
    query: &Query,
    output: Output,
) -> Result<Response<Body>, Status> {
    let resource = scope.resource;
    let start = list_options::check_watch(query)?;
    let filter = Filter::from_query(resource, query)?;
    let requested = parse_revision(query.get("resourceVersion"))?;
    let timeout = query
        .number("timeoutSeconds")?
        .map_or(DEFAULT_TIMEOUT, Duration::from_secs)
        .min(DEFAULT_TIMEOUT);
    let (tx, rx) = mpsc::channel(CLIENT_QUEUE);
    let watcher = Watcher {
        resource,
        prefix: resource.list_prefix(scope.namespace),
        filter,
        bookmarks: query.flag("allowWatchBookmarks"),
        output,
        tx,
        converting: crate::registry::conversion::webhook(resource)
            .and_then(|_| state.this.upgrade()),
    };
    let cache = state.cache.clone();
    let store = state.store.clone();
    let stopping = state.stopping.clone();
    match (start, requested) {
        // The current state as ADDED events (at least as fresh as the
        // position asked for, the latest without one), then changes.
        (WatchStart::StateFirst, _) => {
            fresh(state, query).await?;
            let end_marked = watcher.bookmarks;
            tokio::spawn(bounded(stopping.clone(), timeout, async move {
                let (items, revision, _) = cache.list(resource, &watcher.prefix, None, 0, |o| {
                    watcher.filter.matches(resource, &o.value)
                });
                for item in items {
                    if !watcher.send_line("ADDED", &item).await {
                        return;
                    }
                }
                if end_marked && !watcher.send_bookmark(revision, true).await {
                    return;
                }
                follow_cache(&cache, &watcher, revision).await;
            }));
        }
        // Changes from now (`sendInitialEvents=false` without a position).
        (WatchStart::ChangesOnly, None | Some(0)) => {
            fresh(state, query).await?;
            let position = cache.revision();
            tokio::spawn(bounded(stopping.clone(), timeout, async move {
                follow_cache(&cache, &watcher, position).await
            }));
        }
        (WatchStart::ChangesOnly, Some(position)) if position >= cache.floor(resource) => {
            // A position the cache has not reached yet must still be valid.
            crate::registry::lookup::reached(state, position).await?;
            tokio::spawn(bounded(stopping.clone(), timeout, async move {
                follow_cache(&cache, &watcher, position).await
            }));
        }
        (WatchStart::ChangesOnly, Some(position)) => {
            let stream = match store.watch(&watcher.prefix, position).await {
                Ok(stream) => stream,
                Err(portal_store::Error::Compacted { .. }) => {
                    return Err(Status::expired(format!(
                        "too old resource version: {position}"
                    )))
                }
                Err(e) => return Err(store_error(e)),
            };
            tokio::spawn(bounded(
                stopping.clone(),
                timeout,
                follow_store(stream, watcher),
            ));
        }
    }
    let body = StreamBody::new(
        tokio_stream::wrappers::ReceiverStream::new(rx).map(|b| Ok(Frame::data(b))),
    );
    let mut response = Response::new(BodyExt::boxed(body));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    Ok(response)
}

/// Runs a watch's sender until it ends, its timeout passes or the server
/// drains; then its channel closes and the client's stream ends cleanly.
async fn bounded(
    mut stopping: tokio::sync::watch::Receiver<bool>,
    timeout: Duration,
    watch: impl std::future::Future<Output = ()>,
) {
    tokio::select! {
        _ = tokio::time::timeout(timeout, watch) => {}
        () = crate::stopped(&mut stopping) => {}
    }
}

/// Streams the cache's events after `position` until the client leaves.
async fn follow_cache(cache: &WatchCache, watcher: &Watcher, mut position: Revision) {
    let mut changes = cache.subscribe();
    let mut bookmark = tokio::time::interval(BOOKMARK_INTERVAL);
    bookmark.tick().await;
    loop {
        changes.mark_unchanged();
        match cache.events_after(watcher.resource, position) {
            Ok((events, revision)) => {
                for event in &events {
                    if !watcher.send(event).await {
                        return;
                    }
                }
                position = position.max(revision);
            }
            Err(_) => {
                watcher
                    .send_expired(&format!("too old resource version: {position}"))
                    .await;
                return;
            }
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            _ = bookmark.tick(), if watcher.bookmarks => if !watcher.send_bookmark(position, false).await { return },
            () = watcher.tx.closed() => return,
        }
    }
}

/// Replays history from the store (and then its live events) for a client
/// resuming from before the cache's ring.
async fn follow_store(mut stream: portal_store::WatchStream, watcher: Watcher) {
    let prev_of = |event: &portal_store::Event| -> Option<Arc<CachedObject>> {
        let prev = event.prev.as_ref()?;
        CachedObject::decode(&prev.key, &prev.value, prev.mod_revision)
            .ok()
            .map(Arc::new)
    };
    loop {
        let batch = tokio::select! {
            item = stream.next() => item,
            () = watcher.tx.closed() => return,
        };
        let batch = match batch {
            Some(Ok(batch)) => batch,
            Some(Err(error)) => {
                watcher.send_expired(&format!("watch ended: {error}")).await;
                return;
            }
            None => return,
        };
        for event in batch {
            let revision = event.revision();
            let prev = prev_of(&event);
            let object = match event.kind {
                EventKind::Put => {
                    CachedObject::decode(&event.kv.key, &event.kv.value, revision).ok()
                }
                EventKind::Delete => prev
                    .as_ref()
                    .map(|p| CachedObject::from_value(p.key.clone(), p.value.clone(), revision)),
            };
            let Some(object) = object else { continue };
            let cached = CacheEvent {
                revision,
                kind: event.kind,
                object: Arc::new(object),
                prev,
            };
            if !watcher.send(&cached).await {
                return;
            }
        }
    }
}
