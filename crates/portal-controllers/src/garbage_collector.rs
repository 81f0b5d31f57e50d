//! The garbage collector, as kube-controller-manager's: deletes objects
//! whose owners (`metadata.ownerReferences`) are all gone, and carries out
//! the two deletions that wait for it:
//! - `Foreground`: the API server leaves the owner marked with the
//!   `foregroundDeletion` finalizer; the collector deletes its dependents
//!   and removes the finalizer once no dependent with
//!   `blockOwnerDeletion` is left (pods stopping on a node count until
//!   they are gone), and the owner goes;
//! - `Orphan`: the owner is marked with `orphan`; the collector removes
//!   the owner's reference from each dependent, then the finalizer.
//!
//! It watches the metadata of every kind the API serves (found by
//! discovery, looked up again for kinds added later) and keeps a graph of
//! owners and dependents. Everything goes through the API, as any client,
//! with deletions preconditioned on the dependent's uid and updates on its
//! resourceVersion.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    DeleteParams, DynamicObject, ListParams, PartialObjectMeta, Patch, PatchParams, Preconditions,
    PropagationPolicy,
};
use kube::core::discovery::Scope;
use kube::discovery::{verbs, ApiResource, Discovery};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// The field manager of its updates (an orphan's references, finalizers).
pub const MANAGER: &str = "portal-garbage-collector";

const FOREGROUND: &str = "foregroundDeletion";
const ORPHAN: &str = "orphan";

/// How often discovery runs again, for kinds added while it runs.
const REDISCOVER: Duration = Duration::from_secs(30);
/// How many API calls run at once.
const WORKERS: usize = 8;
/// The first retry of a failed item, doubled up to `MAX_RETRY`.
const FIRST_RETRY: Duration = Duration::from_millis(250);
const MAX_RETRY: Duration = Duration::from_secs(30);

/// One kind the collector follows.
#[derive(Clone, Debug)]
struct Kind {
    resource: ApiResource,
    namespaced: bool,
}

/// What one object looks like to the collector.
#[derive(Clone, Debug)]
struct Node {
    kind: usize,
    namespace: Option<String>,
    name: String,
    resource_version: Option<String>,
    owners: Vec<OwnerReference>,
    finalizers: Vec<String>,
    deleting: bool,
}

impl Node {
    fn has_finalizer(&self, finalizer: &str) -> bool {
        self.finalizers.iter().any(|f| f == finalizer)
    }

    /// Marked for deletion, waiting for its blocking dependents to go.
    fn waiting_for_dependents(&self) -> bool {
        self.deleting && self.has_finalizer(FOREGROUND)
    }
}

/// Work on one object, by uid.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Work {
    /// A dependent: delete it if its owners are gone, drop references to
    /// the owners that are gone if some remain.
    Dependent(String),
    /// An owner being deleted in the foreground.
    Foreground(String),
    /// An owner being deleted with its dependents orphaned.
    Orphan(String),
}

/// What a monitor reports: its kind's index and a watch event.
type Report = (usize, Event<PartialObjectMeta<DynamicObject>>);

/// Follows every kind and collects garbage for ever.
pub async fn run(client: Client) {
    let (reports, mut incoming) = mpsc::channel::<Report>(1024);
    let mut collector = Collector::new(client.clone());
    let mut monitors = JoinSet::new();
    let mut rediscover = tokio::time::interval(REDISCOVER);
    let (retries, mut retried) = mpsc::unbounded_channel::<(Work, u32)>();
    loop {
        tokio::select! {
            _ = rediscover.tick() => {
                for (index, kind) in collector.discover().await {
                    monitors.spawn(monitor(client.clone(), index, kind, reports.clone()));
                }
            }
            Some((kind, event)) = incoming.recv() => collector.observe(kind, event),
            Some((work, attempt)) = retried.recv() => collector.enqueue_attempt(work, attempt),
            Some(done) = collector.running.join_next(), if !collector.running.is_empty() => {
                if let Ok((work, attempt, Err(error))) = done {
                    tracing::debug!(%error, ?work, "garbage collection: retrying");
                    let delay = FIRST_RETRY.saturating_mul(1 << attempt.min(8)).min(MAX_RETRY);
                    let retries = retries.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        let _ = retries.send((work, attempt + 1));
                    });
                }
            }
        }
        collector.start_work();
    }
}

/// Sends one kind's metadata watch events to the collector.
async fn monitor(client: Client, index: usize, kind: Kind, reports: mpsc::Sender<Report>) {
    // Metadata alone (`PartialObjectMetadata`): all the collector reads.
    let api = Api::<PartialObjectMeta<DynamicObject>>::all_with(client, &kind.resource);
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => {
                if reports.send((index, event)).await.is_err() {
                    return;
                }
            }
            Err(error) => {
                tracing::debug!(%error, resource = %kind.resource.plural, "garbage collector watch")
            }
        }
    }
}

struct Collector {
    client: Client,
    kinds: Vec<Kind>,
    /// Kinds' indices by `apiVersion` and `kind`.
    by_type: HashMap<(String, String), usize>,
    /// Kinds whose first list is done; owners missing from the graph are
    /// only looked up once every kind has listed.
    listed: HashSet<usize>,
    /// Uids a kind's relist has shown (objects gone meanwhile are deleted).
    relisting: HashMap<usize, HashSet<String>>,
    objects: HashMap<String, Node>,
    /// Owner uid → dependents' uids.
    dependents: HashMap<String, HashSet<String>>,
    queue: VecDeque<(Work, u32)>,
    queued: HashSet<Work>,
    running: JoinSet<(Work, u32, Result<(), kube::Error>)>,
}

impl Collector {
    fn new(client: Client) -> Self {
        Collector {
            client,
            kinds: Vec::new(),
            by_type: HashMap::new(),
            listed: HashSet::new(),
            relisting: HashMap::new(),
            objects: HashMap::new(),
            dependents: HashMap::new(),
            queue: VecDeque::new(),
            queued: HashSet::new(),
            running: JoinSet::new(),
        }
    }

    /// Kinds served now that are not followed yet (that can be listed,
    /// watched and deleted).
    async fn discover(&mut self) -> Vec<(usize, Kind)> {
        let discovery = match Discovery::new(self.client.clone()).run().await {
            Ok(discovery) => discovery,
            Err(error) => {
                tracing::warn!(%error, "garbage collector: discovery failed");
                return Vec::new();
            }
        };
        let mut added = Vec::new();
        for group in discovery.groups() {
            for (resource, capabilities) in group.recommended_resources() {
                let usable = [verbs::LIST, verbs::WATCH, verbs::DELETE]
                    .iter()
                    .all(|verb| capabilities.supports_operation(verb));
                let key = (resource.api_version.clone(), resource.kind.clone());
                if !usable || self.by_type.contains_key(&key) {
                    continue;
                }
                let kind = Kind {
                    resource,
                    namespaced: capabilities.scope == Scope::Namespaced,
                };
                let index = self.kinds.len();
                self.kinds.push(kind.clone());
                self.by_type.insert(key, index);
                added.push((index, kind));
            }
        }
        added
    }

    fn all_listed(&self) -> bool {
        !self.kinds.is_empty() && self.listed.len() == self.kinds.len()
    }

    fn observe(&mut self, kind: usize, event: Event<PartialObjectMeta<DynamicObject>>) {
        match event {
            Event::Init => {
                self.relisting.insert(kind, HashSet::new());
            }
            Event::InitApply(object) => {
                if let Some(uid) = object.metadata.uid.clone() {
                    self.relisting.entry(kind).or_default().insert(uid);
                }
                self.upsert(kind, object);
            }
            Event::InitDone => {
                let seen = self.relisting.remove(&kind).unwrap_or_default();
                let gone: Vec<String> = self
                    .objects
                    .iter()
                    .filter(|(uid, node)| node.kind == kind && !seen.contains(*uid))
                    .map(|(uid, _)| uid.clone())
                    .collect();
                for uid in gone {
                    self.remove(&uid);
                }
                let first = self.listed.insert(kind);
                if first && self.all_listed() {
                    // Owners deleted while nobody watched.
                    let orphans: Vec<String> = self
                        .objects
                        .iter()
                        .filter(|(_, node)| {
                            node.owners
                                .iter()
                                .any(|o| !self.objects.contains_key(&o.uid))
                        })
                        .map(|(uid, _)| uid.clone())
                        .collect();
                    for uid in orphans {
                        self.enqueue(Work::Dependent(uid));
                    }
                }
            }
            Event::Apply(object) => self.upsert(kind, object),
            Event::Delete(object) => {
                if let Some(uid) = object.metadata.uid {
                    self.remove(&uid);
                }
            }
        }
    }

    fn upsert(&mut self, kind: usize, object: PartialObjectMeta<DynamicObject>) {
        let metadata = object.metadata;
        let Some(uid) = metadata.uid else {
            return;
        };
        let node = Node {
            kind,
            namespace: metadata.namespace,
            name: metadata.name.unwrap_or_default(),
            resource_version: metadata.resource_version,
            owners: metadata.owner_references.unwrap_or_default(),
            finalizers: metadata.finalizers.unwrap_or_default(),
            deleting: metadata.deletion_timestamp.is_some(),
        };
        if let Some(old) = self.objects.get(&uid) {
            for owner in &old.owners {
                if let Some(set) = self.dependents.get_mut(&owner.uid) {
                    set.remove(&uid);
                    if set.is_empty() {
                        self.dependents.remove(&owner.uid);
                    }
                }
            }
        }
        for owner in &node.owners {
            self.dependents
                .entry(owner.uid.clone())
                .or_default()
                .insert(uid.clone());
        }
        let owner_missing = node
            .owners
            .iter()
            .any(|o| !self.objects.contains_key(&o.uid));
        let owner_waiting = node.owners.iter().any(|o| {
            self.objects
                .get(&o.uid)
                .is_some_and(Node::waiting_for_dependents)
        });
        let (orphaning, foreground) = (
            node.deleting && node.has_finalizer(ORPHAN),
            node.waiting_for_dependents(),
        );
        self.objects.insert(uid.clone(), node);
        if orphaning {
            self.enqueue(Work::Orphan(uid.clone()));
        }
        if foreground {
            self.enqueue(Work::Foreground(uid.clone()));
        }
        if (owner_missing && self.all_listed()) || owner_waiting {
            self.enqueue(Work::Dependent(uid));
        }
    }

    fn remove(&mut self, uid: &str) {
        let Some(node) = self.objects.remove(uid) else {
            return;
        };
        for owner in &node.owners {
            if let Some(set) = self.dependents.get_mut(&owner.uid) {
                set.remove(uid);
                if set.is_empty() {
                    self.dependents.remove(&owner.uid);
                }
            }
            // An owner waiting for this dependent may go now.
            if self
                .objects
                .get(&owner.uid)
                .is_some_and(Node::waiting_for_dependents)
            {
                self.enqueue(Work::Foreground(owner.uid.clone()));
            }
        }
        let dependents: Vec<String> = self
            .dependents
            .get(uid)
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default();
        for dependent in dependents {
            self.enqueue(Work::Dependent(dependent));
        }
    }

    fn enqueue(&mut self, work: Work) {
        self.enqueue_attempt(work, 0);
    }

    fn enqueue_attempt(&mut self, work: Work, attempt: u32) {
        if self.queued.insert(work.clone()) {
            self.queue.push_back((work, attempt));
        }
    }

    /// Starts queued work while workers are free.
    fn start_work(&mut self) {
        while self.running.len() < WORKERS {
            let Some((work, attempt)) = self.queue.pop_front() else {
                return;
            };
            self.queued.remove(&work);
            if let Some(task) = self.plan(&work) {
                self.running
                    .spawn(async move { (work, attempt, task.run().await) });
            }
        }
    }

    fn api_of(&self, node: &Node) -> Api<DynamicObject> {
        let kind = &self.kinds[node.kind];
        match (&node.namespace, kind.namespaced) {
            (Some(namespace), true) => {
                Api::namespaced_with(self.client.clone(), namespace, &kind.resource)
            }
            _ => Api::all_with(self.client.clone(), &kind.resource),
        }
    }

    /// What to do for `work`, from the graph as it is now.
    fn plan(&self, work: &Work) -> Option<Task> {
        match work {
            Work::Dependent(uid) => {
                let node = self.objects.get(uid)?;
                let mut owners = Vec::new();
                for owner in &node.owners {
                    let state = match self.objects.get(&owner.uid) {
                        Some(o) if o.waiting_for_dependents() => OwnerState::Waiting,
                        Some(_) => OwnerState::Present,
                        None => {
                            let kind = self
                                .by_type
                                .get(&(owner.api_version.clone(), owner.kind.clone()))
                                .map(|index| &self.kinds[*index]);
                            match kind {
                                // A kind not served: never taken for gone.
                                None => OwnerState::Present,
                                Some(kind) => {
                                    OwnerState::Unseen(Box::new(self.owner_api(kind, node)))
                                }
                            }
                        }
                    };
                    owners.push((owner.clone(), state));
                }
                Some(Task::Dependent {
                    api: self.api_of(node),
                    uid: uid.clone(),
                    node: node.clone(),
                    owners,
                    has_dependents: self.dependents.contains_key(uid),
                })
            }
            Work::Foreground(uid) => {
                let node = self.objects.get(uid)?;
                if !node.waiting_for_dependents() {
                    return None;
                }
                let mut blocking = 0;
                let mut delete = Vec::new();
                for dependent in self.dependents.get(uid).into_iter().flatten() {
                    let Some(child) = self.objects.get(dependent) else {
                        continue;
                    };
                    let blocks = child
                        .owners
                        .iter()
                        .any(|o| o.uid == *uid && o.block_owner_deletion == Some(true));
                    if blocks {
                        blocking += 1;
                    }
                    if !child.deleting {
                        delete.push(Doomed {
                            api: self.api_of(child),
                            name: child.name.clone(),
                            uid: dependent.clone(),
                            // Its own dependents go first too.
                            foreground: self.dependents.contains_key(dependent),
                        });
                    }
                }
                Some(Task::Foreground {
                    api: self.api_of(node),
                    uid: uid.clone(),
                    node: node.clone(),
                    blocking,
                    delete,
                    lister: self.lister(node),
                })
            }
            Work::Orphan(uid) => {
                let node = self.objects.get(uid)?;
                if !(node.deleting && node.has_finalizer(ORPHAN)) {
                    return None;
                }
                let dependents = self
                    .dependents
                    .get(uid)
                    .into_iter()
                    .flatten()
                    .filter_map(|d| {
                        self.objects
                            .get(d)
                            .map(|child| (self.api_of(child), child.clone()))
                    })
                    .collect();
                Some(Task::Orphan {
                    api: self.api_of(node),
                    uid: uid.clone(),
                    node: node.clone(),
                    dependents,
                    lister: self.lister(node),
                })
            }
        }
    }

    fn lister(&self, owner: &Node) -> Lister {
        Lister {
            client: self.client.clone(),
            kinds: self.kinds.clone(),
            namespace: owner.namespace.clone(),
        }
    }

    fn owner_api(&self, kind: &Kind, dependent: &Node) -> Api<DynamicObject> {
        match (&dependent.namespace, kind.namespaced) {
            (Some(namespace), true) => {
                Api::namespaced_with(self.client.clone(), namespace, &kind.resource)
            }
            _ => Api::all_with(self.client.clone(), &kind.resource),
        }
    }
}

/// Finds an owner's dependents through the API, not the graph: before a
/// finalizer goes, a dependent whose watch event has not reached the graph
/// yet (its kind's watch lags the owner's) must not be missed.
struct Lister {
    client: Client,
    kinds: Vec<Kind>,
    /// The owner's namespace (a cluster-scoped owner: everywhere).
    namespace: Option<String>,
}

impl Lister {
    /// Every object whose owners include `uid`: its API, uid and metadata.
    async fn referencing(
        &self,
        uid: &str,
    ) -> Result<Vec<(Api<DynamicObject>, String, Node)>, kube::Error> {
        let mut found = Vec::new();
        for (index, kind) in self.kinds.iter().enumerate() {
            let list_api = match (&self.namespace, kind.namespaced) {
                (Some(namespace), true) => {
                    Api::<PartialObjectMeta<DynamicObject>>::namespaced_with(
                        self.client.clone(),
                        namespace,
                        &kind.resource,
                    )
                }
                // A namespaced owner has no cluster-scoped dependents.
                (Some(_), false) => continue,
                (None, _) => Api::<PartialObjectMeta<DynamicObject>>::all_with(
                    self.client.clone(),
                    &kind.resource,
                ),
            };
            let listed = match list_api.list(&ListParams::default()).await {
                Ok(listed) => listed,
                Err(kube::Error::Api(status)) if matches!(status.code, 404 | 405) => continue,
                Err(error) => return Err(error),
            };
            for item in listed.items {
                let metadata = item.metadata;
                let owners = metadata.owner_references.unwrap_or_default();
                if !owners.iter().any(|o| o.uid == uid) {
                    continue;
                }
                let own_uid = metadata.uid.unwrap_or_default();
                let node = Node {
                    kind: index,
                    namespace: metadata.namespace.clone(),
                    name: metadata.name.unwrap_or_default(),
                    resource_version: metadata.resource_version,
                    owners,
                    finalizers: metadata.finalizers.unwrap_or_default(),
                    deleting: metadata.deletion_timestamp.is_some(),
                };
                let api = match (&metadata.namespace, kind.namespaced) {
                    (Some(namespace), true) => {
                        Api::namespaced_with(self.client.clone(), namespace, &kind.resource)
                    }
                    _ => Api::all_with(self.client.clone(), &kind.resource),
                };
                found.push((api, own_uid, node));
            }
        }
        Ok(found)
    }
}

/// How an owner looked when the work was planned.
enum OwnerState {
    Present,
    /// Marked, waiting for its dependents (foreground deletion).
    Waiting,
    /// Not in the graph: looked up through this API before it counts as
    /// gone (the graph may lag, or the owner's kind not be followed yet).
    Unseen(Box<Api<DynamicObject>>),
}

/// A dependent to delete for an owner deleted in the foreground.
struct Doomed {
    api: Api<DynamicObject>,
    name: String,
    uid: String,
    foreground: bool,
}

/// The API calls one piece of work makes.
enum Task {
    Dependent {
        api: Api<DynamicObject>,
        uid: String,
        node: Node,
        owners: Vec<(OwnerReference, OwnerState)>,
        has_dependents: bool,
    },
    Foreground {
        api: Api<DynamicObject>,
        uid: String,
        node: Node,
        blocking: usize,
        delete: Vec<Doomed>,
        lister: Lister,
    },
    Orphan {
        api: Api<DynamicObject>,
        uid: String,
        node: Node,
        dependents: Vec<(Api<DynamicObject>, Node)>,
        lister: Lister,
    },
}

/// Gone, or another object of that name now: nothing left to do.
fn settled<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error),
    }
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

/// Deletes one object if its uid is still `uid`.
async fn delete(
    api: &Api<DynamicObject>,
    name: &str,
    uid: &str,
    policy: PropagationPolicy,
) -> Result<(), kube::Error> {
    let params = DeleteParams {
        propagation_policy: Some(policy),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        // Its uid precondition failed: another object of that name.
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        other => settled(other),
    }
}

/// Writes one list of the object's metadata (`null` when empty, which
/// removes it), as of the version the collector saw.
async fn write_metadata_list<T: serde::Serialize>(
    api: &Api<DynamicObject>,
    node: &Node,
    field: &str,
    kept: &[T],
) -> Result<(), kube::Error> {
    let list = if kept.is_empty() {
        serde_json::Value::Null
    } else {
        json!(kept)
    };
    let patch = json!({"metadata": {"resourceVersion": node.resource_version, field: list}});
    settled(
        api.patch(&node.name, &params(), &Patch::Merge(&patch))
            .await,
    )
}

/// Writes the object's owner references, keeping those `keep` accepts.
async fn keep_owners(
    api: &Api<DynamicObject>,
    node: &Node,
    keep: impl Fn(&OwnerReference) -> bool,
) -> Result<(), kube::Error> {
    let kept: Vec<&OwnerReference> = node.owners.iter().filter(|o| keep(o)).collect();
    write_metadata_list(api, node, "ownerReferences", &kept).await
}

/// Removes one of the collector's finalizers from an owner.
async fn release(
    api: &Api<DynamicObject>,
    node: &Node,
    finalizer: &str,
) -> Result<(), kube::Error> {
    let kept: Vec<&String> = node.finalizers.iter().filter(|f| *f != finalizer).collect();
    write_metadata_list(api, node, "finalizers", &kept).await
}

impl Task {
    async fn run(self) -> Result<(), kube::Error> {
        match self {
            Task::Dependent {
                api,
                uid,
                node,
                owners,
                has_dependents,
            } => {
                let (mut solid, mut gone, mut waiting) = (0, HashSet::new(), HashSet::new());
                for (owner, state) in owners {
                    match state {
                        OwnerState::Present => solid += 1,
                        OwnerState::Waiting => {
                            waiting.insert(owner.uid);
                        }
                        OwnerState::Unseen(owner_api) => {
                            let found = owner_api.get_metadata_opt(&owner.name).await?;
                            match found {
                                Some(found)
                                    if found.metadata.uid.as_deref() == Some(&owner.uid) =>
                                {
                                    solid += 1
                                }
                                _ => {
                                    gone.insert(owner.uid);
                                }
                            }
                        }
                    }
                }
                if gone.is_empty() && waiting.is_empty() {
                    return Ok(());
                }
                if solid > 0 {
                    // Other owners remain: only the references go.
                    return keep_owners(&api, &node, |o| {
                        !gone.contains(&o.uid) && !waiting.contains(&o.uid)
                    })
                    .await;
                }
                let policy = if !waiting.is_empty() && has_dependents {
                    PropagationPolicy::Foreground
                } else {
                    PropagationPolicy::Background
                };
                tracing::debug!(name = %node.name, namespace = ?node.namespace, "garbage collector: deleting a dependent");
                delete(&api, &node.name, &uid, policy).await
            }
            Task::Foreground {
                api,
                uid,
                node,
                blocking,
                delete: doomed,
                lister,
            } => {
                for child in doomed {
                    let policy = if child.foreground {
                        PropagationPolicy::Foreground
                    } else {
                        PropagationPolicy::Background
                    };
                    delete(&child.api, &child.name, &child.uid, policy).await?;
                }
                if blocking > 0 {
                    return Ok(());
                }
                // None left in the graph; the API has the last word.
                let live = lister.referencing(&uid).await?;
                let mut waiting = false;
                for (child_api, child_uid, child) in live {
                    let blocks = child
                        .owners
                        .iter()
                        .any(|o| o.uid == uid && o.block_owner_deletion == Some(true));
                    if !child.deleting {
                        let policy = PropagationPolicy::Background;
                        delete(&child_api, &child.name, &child_uid, policy).await?;
                    }
                    waiting |= blocks;
                }
                if waiting {
                    // Their deletions come back as watch events.
                    return Ok(());
                }
                release(&api, &node, FOREGROUND).await
            }
            Task::Orphan {
                api,
                uid,
                node,
                dependents,
                lister,
            } => {
                for (child_api, child) in dependents {
                    keep_owners(&child_api, &child, |o| o.uid != uid).await?;
                }
                // Dependents the graph has not seen yet.
                for (child_api, _, child) in lister.referencing(&uid).await? {
                    keep_owners(&child_api, &child, |o| o.uid != uid).await?;
                }
                release(&api, &node, ORPHAN).await
            }
        }
    }
}
