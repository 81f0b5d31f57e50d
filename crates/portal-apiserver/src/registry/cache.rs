//! The watch cache: every object of every resource in memory, each already
//! serialized once, plus a bounded ring of recent events per resource, all
//! fed by one store watch. Lists and watches are served from here at a
//! revision at least as new as the request demands.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::{FutureExt, StreamExt};
use parking_lot::RwLock;
use portal_api::registry::Registry;
use portal_api::{resources, Kind, Resource, Status};
use portal_store::{EventKind, KeyValue, Revision, Store};
use serde_json::Value;
use tokio::sync::watch;

/// Every key Portal writes lives under this prefix.
pub(crate) const REGISTRY_PREFIX: &str = "/registry/";

/// At most this many transactions are applied under one lock.
const MAX_BATCHES_PER_APPLY: usize = 1024;

/// How long a read waits for the cache to catch up before giving up.
const FRESHNESS_TIMEOUT: Duration = Duration::from_secs(3);

/// An object as served: its JSON value and the same bytes pre-serialized,
/// with `metadata.resourceVersion` set.
#[derive(Clone, Debug)]
pub(crate) struct CachedObject {
    pub(crate) key: String,
    pub(crate) value: Value,
    pub(crate) json: Bytes,
}

impl CachedObject {
    /// Decodes a stored value; `revision` becomes its `resourceVersion`.
    pub(crate) fn decode(
        key: &str,
        stored: &[u8],
        revision: Revision,
    ) -> Result<Self, serde_json::Error> {
        let value: Value = serde_json::from_slice(stored)?;
        Ok(Self::from_value(key.to_owned(), value, revision))
    }

    pub(crate) fn from_value(key: String, mut value: Value, revision: Revision) -> Self {
        portal_api::meta::metadata_mut(&mut value).insert(
            "resourceVersion".into(),
            Value::String(revision.to_string()),
        );
        let json = Bytes::from(serde_json::to_vec(&value).unwrap_or_default());
        CachedObject { key, value, json }
    }

    /// Its JSON as `resource` serves it (a kind users define, read at
    /// another version than it is stored at, is converted).
    pub(crate) fn served_json(&self, resource: &Resource) -> Bytes {
        let Some(custom) = resource.custom else {
            return self.json.clone();
        };
        if custom.stored_as().is_none()
            && self.value["apiVersion"].as_str() == Some(resource.api_version().as_str())
        {
            return self.json.clone();
        }
        let mut value = self.value.clone();
        if !portal_api::custom::to_version(resource, &mut value) {
            return self.json.clone();
        }
        Bytes::from(serde_json::to_vec(&value).unwrap_or_default())
    }

    /// The same object at a later revision (a deleted object carries the
    /// revision of its deletion).
    fn at_revision(&self, revision: Revision) -> Self {
        Self::from_value(self.key.clone(), self.value.clone(), revision)
    }
}

/// One change, with the object before it so watchers can tell selector
/// transitions (an object that stops matching is DELETED for that watcher).
#[derive(Debug)]
pub(crate) struct CacheEvent {
    pub(crate) revision: Revision,
    pub(crate) kind: EventKind,
    pub(crate) object: Arc<CachedObject>,
    pub(crate) prev: Option<Arc<CachedObject>>,
}

#[derive(Debug, Default)]
struct ResourceState {
    objects: BTreeMap<String, Arc<CachedObject>>,
    events: VecDeque<Arc<CacheEvent>>,
    /// The ring holds every event of this resource after this revision.
    floor: Revision,
    /// The revision of its latest change (or of the last re-list): what
    /// derived views (the RBAC index) compare to know they are current.
    changed: Revision,
}

#[derive(Debug, Default)]
struct State {
    resources: HashMap<Kind, ResourceState>,
    /// Objects of kinds not served (yet): a CustomResourceDefinition's
    /// objects before it is served, by the key prefix of their resource.
    unclaimed: HashMap<String, BTreeMap<String, Arc<CachedObject>>>,
    revision: Revision,
}

/// The resource key prefix (`/registry/<group>/<plural>/`) of a key that
/// may belong to a kind users define: their groups have a dot.
fn defined_prefix(key: &str) -> Option<&str> {
    let rest = key.strip_prefix(REGISTRY_PREFIX)?;
    let mut parts = rest.splitn(3, '/');
    let group = parts.next()?;
    let plural = parts.next()?;
    parts.next()?;
    group
        .contains('.')
        .then(|| &key[..REGISTRY_PREFIX.len() + group.len() + plural.len() + 2])
}

impl State {
    /// The state of `resource`'s kind, made (from what was unclaimed)
    /// when it has just come to be served.
    fn claim(&mut self, resource: &Resource) -> &mut ResourceState {
        let revision = self.revision;
        let unclaimed = &mut self.unclaimed;
        self.resources
            .entry(resource.stored_kind())
            .or_insert_with(|| ResourceState {
                objects: unclaimed.remove(&resource.key_prefix()).unwrap_or_default(),
                floor: revision,
                changed: revision,
                ..ResourceState::default()
            })
    }
}

/// A watcher's position fell out of the ring.
#[derive(Debug)]
pub(crate) struct TooOld;

#[derive(Debug)]
pub(crate) struct WatchCache {
    state: RwLock<State>,
    revision: watch::Sender<Revision>,
    ring_capacity: usize,
}

fn kind_of_key(registry: &Registry, key: &str) -> Option<Kind> {
    registry.of_key(key).map(Resource::kind)
}

impl WatchCache {
    pub(crate) fn new(ring_capacity: usize) -> Arc<Self> {
        Arc::new(WatchCache {
            state: RwLock::default(),
            revision: watch::channel(0).0,
            ring_capacity,
        })
    }

    /// Follows the store until it closes: list, then watch; on a broken
    /// watch resume from the last revision seen, and re-list only if history
    /// is gone.
    pub(crate) async fn run(self: Arc<Self>, store: Arc<dyn Store>) {
        loop {
            if let Err(error) = self.follow(store.as_ref()).await {
                if matches!(error, portal_store::Error::Closed) {
                    return;
                }
                tracing::warn!(%error, "watch cache lost the store; re-listing");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    async fn follow(&self, store: &dyn Store) -> portal_store::Result<()> {
        let (items, revision) = store.list(REGISTRY_PREFIX).await?;
        self.reset(&items, revision);
        let mut last = revision;
        loop {
            let mut stream = store.watch(REGISTRY_PREFIX, last).await?;
            let mut ended = None;
            while let Some(item) = stream.next().await {
                // Take every transaction already waiting: one lock and one
                // wake-up of the watchers for all of them.
                let mut batches = Vec::new();
                let mut item = Some(item);
                while let Some(next) = item.take() {
                    match next {
                        Ok(batch) => batches.push(batch),
                        Err(error) => {
                            ended = Some(error);
                            break;
                        }
                    }
                    if batches.len() < MAX_BATCHES_PER_APPLY {
                        item = stream.next().now_or_never().flatten();
                    }
                }
                if let Some(revision) = batches.last().and_then(|b| b.first()).map(|e| e.revision())
                {
                    last = revision;
                }
                self.apply(&batches);
                if let Some(error) = ended.take() {
                    tracing::info!(%error, last, "store watch ended; resuming");
                    break;
                }
            }
        }
    }

    fn reset(&self, items: &[KeyValue], revision: Revision) {
        let mut resources: HashMap<Kind, ResourceState> = resources()
            .map(|r| {
                (
                    r.stored_kind(),
                    ResourceState {
                        floor: revision,
                        changed: revision,
                        ..ResourceState::default()
                    },
                )
            })
            .collect();
        let registry = portal_api::registry::current();
        let mut unclaimed: HashMap<String, BTreeMap<String, Arc<CachedObject>>> = HashMap::new();
        for kv in items {
            let kind = kind_of_key(&registry, &kv.key);
            let prefix = defined_prefix(&kv.key);
            if kind.is_none() && prefix.is_none() {
                continue;
            }
            match CachedObject::decode(&kv.key, &kv.value, kv.mod_revision) {
                Ok(object) => {
                    let objects = match (kind, prefix) {
                        (Some(kind), _) => resources.get_mut(&kind).map(|r| &mut r.objects),
                        (None, Some(prefix)) => {
                            Some(unclaimed.entry(prefix.to_owned()).or_default())
                        }
                        (None, None) => None,
                    };
                    if let Some(objects) = objects {
                        objects.insert(kv.key.clone(), Arc::new(object));
                    }
                }
                Err(error) => tracing::error!(key = %kv.key, %error, "undecodable object in store"),
            }
        }
        *self.state.write() = State {
            resources,
            unclaimed,
            revision,
        };
        self.revision.send_replace(revision);
    }

    /// Applies committed transactions, each one revision, in order.
    fn apply(&self, transactions: &[Vec<portal_store::Event>]) {
        let Some(newest) = transactions
            .last()
            .and_then(|t| t.first())
            .map(portal_store::Event::revision)
        else {
            return;
        };
        // Decode and re-serialize before taking the lock: readers (lists,
        // watches) are not held up by the JSON work.
        let registry = portal_api::registry::current();
        let decoded: Vec<_> = transactions
            .iter()
            .flatten()
            .filter_map(|event| {
                let resource = registry.of_key(&event.kv.key);
                if resource.is_none() && defined_prefix(&event.kv.key).is_none() {
                    return None;
                }
                let object = match event.kind {
                    EventKind::Put => {
                        match CachedObject::decode(&event.kv.key, &event.kv.value, event.revision()) {
                            Ok(object) => Some(Arc::new(object)),
                            Err(error) => {
                                tracing::error!(key = %event.kv.key, %error, "undecodable object in store");
                                return None;
                            }
                        }
                    }
                    EventKind::Delete => None,
                };
                Some((event, object))
            })
            .collect();
        let mut state = self.state.write();
        // Which kind serves a key is decided under the lock: a CRD served
        // (or dropped) meanwhile has moved its objects under this lock too.
        let registry = portal_api::registry::current();
        for (event, object) in decoded {
            let key = &event.kv.key;
            let Some(resource) = registry.of_key(key) else {
                // Not served (yet): kept for when it is.
                if let Some(prefix) = defined_prefix(key) {
                    let objects = state.unclaimed.entry(prefix.to_owned()).or_default();
                    match object {
                        Some(object) => drop(objects.insert(key.clone(), object)),
                        None => drop(objects.remove(key)),
                    }
                }
                continue;
            };
            let resource = state.claim(resource);
            let revision = event.revision();
            resource.changed = revision;
            let prev = resource.objects.get(key).cloned();
            let object = match object {
                Some(object) => {
                    resource.objects.insert(key.clone(), object.clone());
                    object
                }
                None => {
                    resource.objects.remove(key);
                    match &prev {
                        Some(prev) => Arc::new(prev.at_revision(revision)),
                        None => continue,
                    }
                }
            };
            resource.events.push_back(Arc::new(CacheEvent {
                revision,
                kind: event.kind,
                object,
                prev,
            }));
            while resource.events.len() > self.ring_capacity {
                if let Some(dropped) = resource.events.pop_front() {
                    resource.floor = dropped.revision;
                }
            }
        }
        state.revision = newest;
        drop(state);
        self.revision.send_replace(newest);
    }

    /// A receiver that changes whenever the cache advances.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Revision> {
        self.revision.subscribe()
    }

    /// Waits until the cache has seen `revision` (504 after a few seconds).
    pub(crate) async fn wait_for(&self, revision: Revision) -> Result<(), Status> {
        let mut rx = self.revision.subscribe();
        let caught_up = tokio::time::timeout(FRESHNESS_TIMEOUT, rx.wait_for(|r| *r >= revision))
            .await
            .is_ok_and(|waited| waited.is_ok());
        if caught_up {
            return Ok(());
        }
        let current = *self.revision.borrow();
        Err(Status::timeout(format!(
            "Too large resource version: {revision}, current: {current}"
        )))
    }

    pub(crate) fn get(&self, resource: &Resource, key: &str) -> Option<Arc<CachedObject>> {
        self.state
            .read()
            .resources
            .get(&resource.stored_kind())?
            .objects
            .get(key)
            .cloned()
    }

    /// Objects under `prefix` with keys after `after`, accepted by `keep`, at
    /// most `limit` (0 = all); with the snapshot revision and how many more
    /// matching objects there are.
    pub(crate) fn list(
        &self,
        resource: &Resource,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        keep: impl Fn(&CachedObject) -> bool,
    ) -> (Vec<Arc<CachedObject>>, Revision, usize) {
        let state = self.state.read();
        let Some(objects) = state
            .resources
            .get(&resource.stored_kind())
            .map(|r| &r.objects)
        else {
            return (Vec::new(), state.revision, 0);
        };
        let start = match after {
            Some(after) => std::ops::Bound::Excluded(after.to_owned()),
            None => std::ops::Bound::Included(prefix.to_owned()),
        };
        let mut items = Vec::new();
        let mut remaining = 0;
        for (key, object) in objects.range((start, std::ops::Bound::Unbounded)) {
            if !key.starts_with(prefix) {
                break;
            }
            if !keep(object) {
                continue;
            }
            if limit == 0 || items.len() < limit {
                items.push(object.clone());
            } else {
                remaining += 1;
            }
        }
        (items, state.revision, remaining)
    }

    /// Events of `resource` after `position`, and the revision the cache is
    /// at (the watcher's next position). `TooOld` once the ring has moved on.
    pub(crate) fn events_after(
        &self,
        resource: &Resource,
        position: Revision,
    ) -> Result<(Vec<Arc<CacheEvent>>, Revision), TooOld> {
        let state = self.state.read();
        let Some(ring) = state.resources.get(&resource.stored_kind()) else {
            return Ok((Vec::new(), state.revision));
        };
        if position < ring.floor {
            return Err(TooOld);
        }
        let start = ring.events.partition_point(|e| e.revision <= position);
        Ok((
            ring.events.range(start..).cloned().collect(),
            state.revision,
        ))
    }

    /// The oldest position a new watch on `resource` may start from.
    pub(crate) fn floor(&self, resource: &Resource) -> Revision {
        self.state
            .read()
            .resources
            .get(&resource.stored_kind())
            .map_or(0, |r| r.floor)
    }

    pub(crate) fn revision(&self) -> Revision {
        self.state.read().revision
    }

    /// Follows a change of the kinds served: kinds now served get their
    /// objects (kept while they were not), kinds no longer served give
    /// theirs back.
    pub(crate) fn follow_registry(&self, registry: &Registry) {
        let mut state = self.state.write();
        let gone: Vec<Kind> = state
            .resources
            .keys()
            .filter(|kind| registry.of(**kind).is_err())
            .copied()
            .collect();
        for kind in gone {
            let Some(resource) = state.resources.remove(&kind) else {
                continue;
            };
            for (key, object) in resource.objects {
                if let Some(prefix) = defined_prefix(&key) {
                    let prefix = prefix.to_owned();
                    state
                        .unclaimed
                        .entry(prefix)
                        .or_default()
                        .insert(key, object);
                }
            }
        }
    }

    /// The latest revision at which an object of one of `kinds` changed.
    pub(crate) fn changed(&self, kinds: &[Kind]) -> Revision {
        let state = self.state.read();
        kinds
            .iter()
            .filter_map(|kind| state.resources.get(kind))
            .map(|r| r.changed)
            .max()
            .unwrap_or(0)
    }
}

/// `{"kind":"ServiceList",...,"items":[...]}` from pre-serialized objects.
pub(crate) fn list_body(
    resource: &Resource,
    revision: Revision,
    items: &[Arc<CachedObject>],
    next: Option<&str>,
    remaining: usize,
) -> Bytes {
    let mut metadata = serde_json::json!({"resourceVersion": revision.to_string()});
    if let Some(next) = next {
        metadata["continue"] = next.into();
        metadata["remainingItemCount"] = remaining.into();
    }
    let head = serde_json::json!({
        "kind": format!("{}List", resource.kind_name),
        "apiVersion": resource.api_version(),
        "metadata": metadata,
    });
    let head = serde_json::to_vec(&head).unwrap_or_default();
    let size = head.len() + items.iter().map(|o| o.json.len() + 1).sum::<usize>() + 16;
    let converted = resource.custom.is_some();
    let mut out = BytesMut::with_capacity(size);
    // The head without its closing brace, then the items.
    out.put_slice(&head[..head.len().saturating_sub(1)]);
    out.put_slice(b",\"items\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.put_u8(b',');
        }
        if converted {
            out.put_slice(&item.served_json(resource));
        } else {
            out.put_slice(&item.json);
        }
    }
    out.put_slice(b"]}");
    out.freeze()
}
