//! The ReplicationController and ReplicaSet controllers (SPEC W4; one
//! controller, two kinds, as upstream's ReplicaSet controller serves both):
//! keep `spec.replicas` pods from the template alive, creating and deleting
//! in batches, and report `status.replicas`, `readyReplicas`,
//! `availableReplicas` (ready for `minReadySeconds`), `observedGeneration`.
//!
//! Orphaned pods that match the selector are adopted, and owned pods that
//! stop matching it are released, as upstream does.
//!
//! Like upstream it keeps *expectations*: pods it created or deleted that
//! its pod reflector has not seen yet still count, so a reconcile that runs
//! before the watch catches up never creates or deletes twice.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::Stream;
use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetStatus};
use k8s_openapi::api::core::v1::{
    ObjectReference, Pod, PodTemplateSpec, ReplicationController, ReplicationControllerStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::NamespaceResourceScope;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use portal_api::selector::LabelSelector;
use portal_client::{Settled, SharedReflector};

use crate::events;

/// Most pods created or deleted by one reconcile.
const BATCH: usize = 500;
/// Expectations older than this are dropped (a lost watch event must not
/// block the controller for ever).
const EXPECTATION_TTL: Duration = Duration::from_secs(30);

pub use crate::ReconcileError as Error;

/// Pods created or deleted but not yet seen so by the reflector.
#[derive(Debug, Default)]
struct Expectations {
    created: HashSet<String>,
    deleted: HashSet<String>,
    since: Option<Instant>,
}

/// What one status reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub replicas: i32,
    pub fully_labeled: i32,
    pub ready: i32,
    pub available: i32,
    pub observed_generation: Option<i64>,
    /// The `ReplicaFailure` condition: why pods could not be made or removed.
    pub failure: Option<Failure>,
}

/// A failed create (`FailedCreate`) or delete (`FailedDelete`) of pods.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Failure {
    pub reason: String,
    pub message: String,
}

const REPLICA_FAILURE: &str = "ReplicaFailure";

/// The `ReplicaFailure` condition among an RC's or RS's conditions (two
/// types with the same fields).
fn failure_of<C: serde::Serialize>(conditions: Option<&Vec<C>>) -> Option<Failure> {
    let conditions = serde_json::to_value(conditions?).ok()?;
    let failure = conditions
        .as_array()?
        .iter()
        .find(|c| c["type"] == REPLICA_FAILURE && c["status"] == "True")?;
    Some(Failure {
        reason: failure["reason"].as_str().unwrap_or("").into(),
        message: failure["message"].as_str().unwrap_or("").into(),
    })
}

/// The conditions with `ReplicaFailure` set to `failure` or removed; an
/// unchanged reason keeps the condition as it was (as upstream's).
fn with_failure<C>(conditions: Option<Vec<C>>, failure: Option<&Failure>) -> Option<Vec<C>>
where
    C: serde::Serialize + serde::de::DeserializeOwned,
{
    let list = serde_json::to_value(conditions.unwrap_or_default()).unwrap_or_default();
    let mut list: Vec<serde_json::Value> = serde_json::from_value(list).unwrap_or_default();
    let kept = list
        .iter()
        .find(|c| c["type"] == REPLICA_FAILURE)
        .filter(|c| failure.is_some_and(|f| c["reason"] == f.reason.as_str()))
        .cloned();
    list.retain(|c| c["type"] != REPLICA_FAILURE);
    if let Some(failure) = failure {
        list.push(kept.unwrap_or_else(|| {
            let now = jiff::Timestamp::now();
            serde_json::json!({
                "type": REPLICA_FAILURE, "status": "True",
                "reason": failure.reason, "message": failure.message,
                "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            })
        }));
    }
    let typed: Vec<C> = serde_json::from_value(serde_json::Value::Array(list)).ok()?;
    (!typed.is_empty()).then_some(typed)
}

/// A kind whose objects keep replicas of a pod template.
pub trait Replicated:
    kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + Default
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + serde::Serialize
    + Send
    + Sync
    + 'static
{
    const API_VERSION: &'static str;
    const KIND: &'static str;
    /// The Events' source component.
    const COMPONENT: &'static str;
    fn replicas(&self) -> usize;
    fn min_ready_seconds(&self) -> i64;
    /// The selector; `None` when it is empty or invalid (selects nothing).
    fn selector(&self) -> Option<LabelSelector>;
    fn template(&self) -> PodTemplateSpec;
    fn counts(&self) -> Option<Counts>;
    fn with_counts(&self, counts: Counts) -> Self;
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

impl Replicated for ReplicationController {
    const API_VERSION: &'static str = "v1";
    const KIND: &'static str = "ReplicationController";
    const COMPONENT: &'static str = "replication-controller";

    fn replicas(&self) -> usize {
        let replicas = self.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        usize::try_from(replicas).unwrap_or(0)
    }

    fn min_ready_seconds(&self) -> i64 {
        self.spec
            .as_ref()
            .and_then(|s| s.min_ready_seconds)
            .map_or(0, i64::from)
    }

    /// A map of labels (the API defaults it to the template's).
    fn selector(&self) -> Option<LabelSelector> {
        let spec = self.spec.as_ref();
        let map = spec
            .and_then(|s| s.selector.clone())
            .filter(|s| !s.is_empty())
            .or_else(|| {
                spec.and_then(|s| s.template.as_ref())
                    .and_then(|t| t.metadata.as_ref())
                    .and_then(|m| m.labels.clone())
            })
            .filter(|m| !m.is_empty())?;
        LabelSelector::from_api(&serde_json::json!({"matchLabels": map}), "spec.selector").ok()
    }

    fn template(&self) -> PodTemplateSpec {
        self.spec
            .as_ref()
            .and_then(|s| s.template.clone())
            .unwrap_or_default()
    }

    fn counts(&self) -> Option<Counts> {
        let status = self.status.as_ref()?;
        Some(Counts {
            replicas: status.replicas,
            fully_labeled: status.fully_labeled_replicas.unwrap_or(0),
            ready: status.ready_replicas.unwrap_or(0),
            available: status.available_replicas.unwrap_or(0),
            observed_generation: status.observed_generation,
            failure: failure_of(status.conditions.as_ref()),
        })
    }

    fn with_counts(&self, counts: Counts) -> Self {
        let mut updated = self.clone();
        let conditions = self.status.as_ref().and_then(|s| s.conditions.clone());
        let conditions = with_failure(conditions, counts.failure.as_ref());
        updated.status = Some(ReplicationControllerStatus {
            replicas: counts.replicas,
            fully_labeled_replicas: Some(counts.fully_labeled),
            ready_replicas: Some(counts.ready),
            available_replicas: Some(counts.available),
            observed_generation: counts.observed_generation,
            conditions,
        });
        updated
    }
}

impl Replicated for ReplicaSet {
    const API_VERSION: &'static str = "apps/v1";
    const KIND: &'static str = "ReplicaSet";
    const COMPONENT: &'static str = "replicaset-controller";

    fn replicas(&self) -> usize {
        let replicas = self.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        usize::try_from(replicas).unwrap_or(0)
    }

    fn min_ready_seconds(&self) -> i64 {
        self.spec
            .as_ref()
            .and_then(|s| s.min_ready_seconds)
            .map_or(0, i64::from)
    }

    fn selector(&self) -> Option<LabelSelector> {
        let selector = serde_json::to_value(&self.spec.as_ref()?.selector).ok()?;
        LabelSelector::from_api(&selector, "spec.selector")
            .ok()
            .filter(|s| !s.is_empty())
    }

    fn template(&self) -> PodTemplateSpec {
        self.spec
            .as_ref()
            .and_then(|s| s.template.clone())
            .unwrap_or_default()
    }

    fn counts(&self) -> Option<Counts> {
        let status = self.status.as_ref()?;
        Some(Counts {
            replicas: status.replicas,
            fully_labeled: status.fully_labeled_replicas.unwrap_or(0),
            ready: status.ready_replicas.unwrap_or(0),
            available: status.available_replicas.unwrap_or(0),
            observed_generation: status.observed_generation,
            failure: failure_of(status.conditions.as_ref()),
        })
    }

    fn with_counts(&self, counts: Counts) -> Self {
        let mut updated = self.clone();
        let conditions = self.status.as_ref().and_then(|s| s.conditions.clone());
        let conditions = with_failure(conditions, counts.failure.as_ref());
        updated.status = Some(ReplicaSetStatus {
            replicas: counts.replicas,
            fully_labeled_replicas: Some(counts.fully_labeled),
            ready_replicas: Some(counts.ready),
            available_replicas: Some(counts.available),
            observed_generation: counts.observed_generation,
            conditions,
            ..ReplicaSetStatus::default()
        });
        updated
    }
}

struct Context {
    client: Client,
    /// Delays between retries of a failing object.
    retries: crate::Retries,
    events: events::Recorder,
    pods: Store<Pod>,
    /// The shared pod reflector has listed: until then an empty store does
    /// not mean no pods (a restarted controller would create replicas that
    /// exist).
    pods_listed: Arc<crate::Listed>,
    expectations: Mutex<HashMap<String, Expectations>>,
}

/// Runs the controller of kind `K` until the process ends, reading pods
/// from the process's shared pod reflector.
pub async fn run<K: Replicated>(
    client: Client,
    pods: Store<Pod>,
    pod_changes: impl Stream<Item = Settled<Pod>> + Send + 'static,
) {
    let mut owners = owner_reflector::<K>(client.clone());
    let (store, changes) = (owners.store(), owners.subscribe());
    tokio::join!(
        owners.run(),
        run_shared(client, pods, pod_changes, store, changes)
    );
}

/// A cache of `K` without managed fields (which no controller reads), to
/// share between the controllers that read `K`.
pub fn owner_reflector<K: Replicated>(client: Client) -> SharedReflector<K> {
    SharedReflector::new(Api::all(client), watcher::Config::default(), |owner| {
        owner.meta_mut().managed_fields = None;
    })
}

/// [`run`] on a cache of `K` shared with other controllers (the
/// Deployment controller reads the ReplicaSets too).
pub async fn run_shared<K: Replicated>(
    client: Client,
    pods: Store<Pod>,
    pod_changes: impl Stream<Item = Settled<Pod>> + Send + 'static,
    owners: Store<K>,
    owner_changes: impl Stream<Item = Settled<K>> + Send + 'static,
) {
    let context = Arc::new(Context {
        retries: crate::Retries::new(Duration::from_millis(500)),
        client: client.clone(),
        events: events::Recorder::new(client.clone(), K::COMPONENT),
        pods,
        pods_listed: Arc::new(crate::Listed::default()),
        expectations: Mutex::new(HashMap::new()),
    });
    let listed = context.pods_listed.clone();
    let pod_changes = futures_util::StreamExt::inspect(pod_changes, move |change| {
        if matches!(change, Settled::Relisted(_)) {
            listed.set();
        }
    });
    let controller =
        Controller::for_shared_stream(portal_client::shared::objects(owner_changes), owners)
            .with_config(crate::config());
    let controllers = controller.store();
    // A pod concerns its controller, or, when it has none, every owner
    // whose selector matches it (to be adopted).
    let mapper = move |pod: Arc<Pod>| -> Vec<ObjectRef<K>> {
        let namespace = pod.namespace().unwrap_or_default();
        if let Some(owner) = pod
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true))
        {
            return (owner.kind == K::KIND && owner.api_version == K::API_VERSION)
                .then(|| ObjectRef::new(&owner.name).within(&namespace))
                .into_iter()
                .collect();
        }
        controllers
            .state()
            .iter()
            .filter(|rc| rc.namespace().as_deref() == Some(namespace.as_str()))
            .filter(|rc| crate::selects(rc.selector().as_ref(), pod.labels()))
            .map(|rc| ObjectRef::from_obj(&**rc))
            .collect()
    };
    crate::drive(
        controller
            .watches_shared_stream(portal_client::shared::objects(pod_changes), mapper)
            .run(reconcile::<K>, error_policy::<K>, context.clone()),
        K::COMPONENT,
        &context.retries,
    )
    .await;
}

/// Adopts an orphan (adds the owner `uid` as its controller) or releases
/// an object that no longer matches (removes `uid` from its owners), as
/// Kubernetes' controller reference manager does: pods of ReplicaSets,
/// ReplicaSets of Deployments.
pub(crate) async fn set_controller<K>(
    api: &Api<K>,
    object: &K,
    owner: Option<&OwnerReference>,
    uid: &str,
) -> Result<(), Error>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let mut owners: Vec<OwnerReference> = object
        .owner_references()
        .iter()
        .filter(|o| o.uid != uid)
        .cloned()
        .collect();
    owners.extend(owner.cloned());
    // The object's uid makes the patch fail if it was replaced meanwhile.
    let patch = serde_json::json!({
        "metadata": {"ownerReferences": owners, "uid": object.meta().uid}
    });
    match api
        .patch(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn error_policy<K: Replicated>(rc: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, kind = K::KIND, name = %rc.name_any(), "replica update failed; retrying");
    Action::requeue(ctx.retries.after_failure(rc.as_ref()))
}

fn reference<K: Replicated>(rc: &K) -> ObjectReference {
    ObjectReference {
        api_version: Some(K::API_VERSION.into()),
        kind: Some(K::KIND.into()),
        name: Some(rc.name_any()),
        namespace: rc.namespace(),
        uid: rc.meta().uid.clone(),
        ..ObjectReference::default()
    }
}

pub(crate) fn is_active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"))
}

pub(crate) fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Ready for more than `min_ready` seconds by `now` (upstream's
/// `IsPodAvailable`: the Ready transition plus `minReadySeconds` is before `now`).
pub(crate) fn is_available(pod: &Pod, min_ready: i64, now: jiff::Timestamp) -> bool {
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready" && c.status == "True"));
    let Some(ready) = ready else {
        return false;
    };
    if min_ready <= 0 {
        return true;
    }
    ready
        .last_transition_time
        .as_ref()
        .is_some_and(|since| now.duration_since(since.0).as_secs_f64() > min_ready as f64)
}

fn owned_by(pod: &Pod, uid: &str) -> bool {
    pod.owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// The annotation that makes a pod cheaper (lower) or dearer to delete.
pub(crate) const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

fn phase_order(pod: &Pod) -> u8 {
    match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Unknown") => 1,
        Some("Running") => 2,
        _ => 0,
    }
}

/// The pod's deletion cost: an int32 written as Kubernetes accepts it
/// (`-N`, `0` or a number without leading zeros); anything else is 0.
fn deletion_cost(pod: &Pod) -> i32 {
    let Some(text) = pod.annotations().get(DELETION_COST) else {
        return 0;
    };
    let canonical = text.starts_with('-')
        || text == "0"
        || text.starts_with(|c: char| ('1'..='9').contains(&c));
    if !canonical {
        return 0;
    }
    text.parse().unwrap_or(0)
}

fn ready_since(pod: &Pod) -> Option<jiff::Timestamp> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready" && c.status == "True"))
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0)
}

fn max_restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|statuses| statuses.iter().map(|c| c.restart_count).max())
        .unwrap_or(0)
}

/// Newer first, as upstream compares times for deletion: a missing time
/// counts as newest; times are compared by the power of two of their age
/// (pods of about the same age are equal), then by uid.
fn newer_first(
    a: (Option<jiff::Timestamp>, &str),
    b: (Option<jiff::Timestamp>, &str),
    now: jiff::Timestamp,
) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    match (a.0, b.0) {
        (x, y) if x == y => Ordering::Equal,
        (None, _) => Ordering::Less,
        (_, None) => Ordering::Greater,
        (Some(x), Some(y)) => {
            let bucket = |t: jiff::Timestamp| {
                let age = now.duration_since(t).as_nanos().max(1);
                // floor(log2(age)), as `int(math.Log2(float64(d)))`.
                127 - age.unsigned_abs().leading_zeros()
            };
            bucket(x).cmp(&bucket(y)).then_with(|| a.1.cmp(b.1))
        }
    }
}

/// Which of two pods to delete first (`Less`): upstream's
/// `ActivePodsWithRanks` order. Unscheduled before scheduled; Pending, then
/// Unknown, then Running; not ready before ready; lower deletion cost;
/// more pods of the owner on the same node; more recently ready; more
/// container restarts; newer.
fn delete_first(
    a: &Pod,
    b: &Pod,
    co_located: &HashMap<String, usize>,
    now: jiff::Timestamp,
) -> std::cmp::Ordering {
    let node = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default()
    };
    let uid = |p: &Pod| p.metadata.uid.clone().unwrap_or_default();
    let rank = |p: &Pod| co_located.get(&node(p)).copied().unwrap_or(0);
    let (uid_a, uid_b) = (uid(a), uid(b));
    (!node(a).is_empty())
        .cmp(&!node(b).is_empty())
        .then_with(|| phase_order(a).cmp(&phase_order(b)))
        .then_with(|| is_ready(a).cmp(&is_ready(b)))
        .then_with(|| deletion_cost(a).cmp(&deletion_cost(b)))
        .then_with(|| rank(b).cmp(&rank(a)))
        .then_with(|| {
            if is_ready(a) && is_ready(b) {
                newer_first((ready_since(a), &uid_a), (ready_since(b), &uid_b), now)
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .then_with(|| max_restarts(b).cmp(&max_restarts(a)))
        .then_with(|| {
            let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            newer_first((created(a), &uid_a), (created(b), &uid_b), now)
        })
}

async fn reconcile<K: Replicated>(rc: Arc<K>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.pods_listed.is_set() {
        return Ok(Action::requeue(crate::NOT_LISTED_YET));
    }
    let namespace = rc.namespace().unwrap_or_default();
    let name = rc.name_any();
    let uid = rc.meta().uid.clone().unwrap_or_default();
    let key = format!("{}/{namespace}/{name}", K::KIND);
    let wanted = rc.replicas();
    let selector = rc.selector();
    let deleting = rc.meta().deletion_timestamp.is_some();
    let owner = OwnerReference {
        api_version: K::API_VERSION.into(),
        kind: K::KIND.into(),
        name: name.clone(),
        uid: uid.clone(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut pods: Vec<Arc<Pod>> = Vec::new();
    for pod in ctx.pods.state() {
        if pod.namespace().as_deref() != Some(namespace.as_str()) || !is_active(&pod) {
            continue;
        }
        let matches = crate::selects(selector.as_ref(), pod.labels());
        if owned_by(&pod, &uid) {
            if matches {
                pods.push(pod);
            } else {
                set_controller(&api, &pod, None, &uid).await?;
            }
        } else if matches && crate::controller_of(pod.owner_references()).is_none() && !deleting {
            set_controller(&api, &pod, Some(&owner), &uid).await?;
            pods.push(pod);
        }
    }
    let names: HashSet<String> = pods.iter().map(|p| p.name_any()).collect();

    let (pending_creates, pending_deletes) = {
        let mut all = ctx.expectations.lock();
        let expect = all.entry(key.clone()).or_default();
        if expect.since.is_some_and(|t| t.elapsed() > EXPECTATION_TTL) {
            *expect = Expectations::default();
        }
        expect.created.retain(|n| !names.contains(n));
        expect.deleted.retain(|n| names.contains(n));
        (expect.created.len(), expect.deleted.len())
    };
    let current = pods.len() + pending_creates - pending_deletes.min(pods.len() + pending_creates);
    // Being deleted (the garbage collector orphans or deletes its pods):
    // no replicas are made or removed any more, as in Kubernetes.
    let managing = !deleting;
    // Why the last create or delete failed: reported, then retried.
    let mut manage_error: Option<kube::Error> = None;

    if managing && current < wanted {
        let template = rc.template();
        let count = (wanted - current).min(BATCH);
        let creates = (0..count).map(|_| {
            let pod = Pod {
                metadata: ObjectMeta {
                    generate_name: Some(format!("{name}-")),
                    namespace: Some(namespace.clone()),
                    labels: template.metadata.as_ref().and_then(|m| m.labels.clone()),
                    annotations: template
                        .metadata
                        .as_ref()
                        .and_then(|m| m.annotations.clone()),
                    owner_references: Some(vec![owner.clone()]),
                    ..ObjectMeta::default()
                },
                spec: template.spec.clone(),
                status: None,
            };
            let api = api.clone();
            async move { api.create(&PostParams::default(), &pod).await }
        });
        let created = futures_util::future::join_all(creates).await;
        let mut made = Vec::new();
        let mut first_error = None;
        {
            let mut expect = ctx.expectations.lock();
            let entry = expect.entry(key.clone()).or_default();
            entry.since = Some(Instant::now());
            for result in created {
                match result {
                    Ok(pod) => {
                        entry.created.insert(pod.name_any());
                        made.push(pod.name_any());
                    }
                    Err(e) => first_error = first_error.or(Some(e)),
                }
            }
        }
        for pod in made {
            ctx.events
                .record(
                    &reference(rc.as_ref()),
                    "Normal",
                    "SuccessfulCreate",
                    &format!("Created pod: {pod}"),
                )
                .await;
        }
        manage_error = first_error;
    } else if managing && current > wanted {
        let mut co_located: HashMap<String, usize> = HashMap::new();
        for pod in &pods {
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            *co_located.entry(node.unwrap_or_default()).or_default() += 1;
        }
        let now = jiff::Timestamp::now();
        let mut victims: Vec<&Arc<Pod>> = pods.iter().collect();
        victims.sort_by(|a, b| delete_first(a, b, &co_located, now));
        let victims: Vec<String> = victims
            .iter()
            .take((current - wanted).min(BATCH))
            .map(|p| p.name_any())
            .collect();
        {
            let mut expect = ctx.expectations.lock();
            let entry = expect.entry(key.clone()).or_default();
            entry.since = Some(Instant::now());
            entry.deleted.extend(victims.iter().cloned());
        }
        for victim in &victims {
            match api.delete(victim, &DeleteParams::default()).await {
                Ok(_) => {
                    let message = format!("Deleted pod: {victim}");
                    ctx.events
                        .record(
                            &reference(rc.as_ref()),
                            "Normal",
                            "SuccessfulDelete",
                            &message,
                        )
                        .await;
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(e) => {
                    manage_error = Some(e);
                    break;
                }
            }
        }
    }

    let now = jiff::Timestamp::now();
    let min_ready = rc.min_ready_seconds();
    let ready = pods.iter().filter(|p| is_ready(p)).count();
    let available = pods
        .iter()
        .filter(|p| is_available(p, min_ready, now))
        .count();
    let counts = Counts {
        replicas: count(pods.len()),
        fully_labeled: count(pods.len()),
        ready: count(ready),
        available: count(available),
        observed_generation: rc.meta().generation,
        failure: manage_error.as_ref().map(|error| {
            let reason = if current < wanted {
                "FailedCreate"
            } else {
                "FailedDelete"
            };
            let message = match error {
                kube::Error::Api(status) => status.message.clone(),
                other => other.to_string(),
            };
            // The same reason keeps the condition (and its message) as it was.
            rc.counts()
                .and_then(|c| c.failure)
                .filter(|f| f.reason == reason)
                .unwrap_or(Failure {
                    reason: reason.into(),
                    message,
                })
        }),
    };
    if rc.counts().as_ref() != Some(&counts) {
        let api: Api<K> = Api::namespaced(ctx.client.clone(), &namespace);
        match api
            .replace_status(&name, &PostParams::default(), &rc.with_counts(counts))
            .await
        {
            Ok(_) => {}
            // Changed meanwhile: the change triggers another reconcile.
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    if let Some(error) = manage_error {
        return Err(error.into());
    }
    // Ready pods become available after minReadySeconds: look again then.
    if ready > available && min_ready > 0 {
        return Ok(Action::requeue(Duration::from_secs(
            u64::try_from(min_ready).unwrap_or(0) + 1,
        )));
    }
    Ok(Action::requeue(Duration::from_secs(60)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn ready_since(at: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": at}]},
        }))
        .unwrap()
    }

    #[test]
    fn replica_failure_is_set_kept_and_cleared() {
        use k8s_openapi::api::apps::v1::ReplicaSetCondition;
        let failure = Failure {
            reason: "FailedCreate".into(),
            message: "exceeded quota".into(),
        };
        let set = with_failure::<ReplicaSetCondition>(None, Some(&failure)).unwrap();
        assert_eq!(set[0].type_, "ReplicaFailure");
        assert_eq!(failure_of(Some(&set)), Some(failure.clone()));
        let again = Failure {
            message: "another message".into(),
            ..failure
        };
        assert_eq!(with_failure(Some(set.clone()), Some(&again)).unwrap(), set);
        assert!(with_failure(Some(set), None).is_none());
    }

    #[test]
    fn available_once_ready_for_longer_than_min_ready_seconds() {
        let now: jiff::Timestamp = "2026-11-27T10:00:10Z".parse().unwrap();
        let pod = ready_since("2026-11-27T10:00:00Z");
        assert!(is_available(&pod, 0, now));
        assert!(is_available(&pod, 9, now));
        assert!(
            !is_available(&pod, 10, now),
            "strictly before now, as upstream"
        );
        let not_ready: Pod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}})).unwrap();
        assert!(!is_available(&not_ready, 0, now));
    }

    fn pod(name: &str, extra: serde_json::Value) -> Pod {
        let mut object = serde_json::json!({"metadata": {"name": name, "uid": name}});
        if let (Some(target), Some(more)) = (object.as_object_mut(), extra.as_object()) {
            for (key, value) in more {
                if key == "metadata" {
                    if let Some(meta) = target["metadata"].as_object_mut() {
                        meta.extend(value.as_object().cloned().unwrap_or_default());
                    }
                } else {
                    target.insert(key.clone(), value.clone());
                }
            }
        }
        serde_json::from_value(object).unwrap()
    }

    fn order(pods: &[Pod], now: &str) -> Vec<String> {
        let now: jiff::Timestamp = now.parse().unwrap();
        let mut co_located: HashMap<String, usize> = HashMap::new();
        for p in pods {
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            *co_located.entry(node.unwrap_or_default()).or_default() += 1;
        }
        let mut sorted: Vec<&Pod> = pods.iter().collect();
        sorted.sort_by(|a, b| delete_first(a, b, &co_located, now));
        sorted.iter().map(|p| p.name_any()).collect()
    }

    #[test]
    fn pods_are_deleted_in_upstreams_order() {
        let running_ready = |name: &str, node: &str, since: &str| {
            pod(
                name,
                serde_json::json!({
                    "spec": {"nodeName": node, "containers": []},
                    "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": since}]},
                }),
            )
        };
        let pods = [
            running_ready("old-ready", "n1", "2026-11-27T08:00:00Z"),
            pod("unscheduled", serde_json::json!({})),
            pod(
                "pending",
                serde_json::json!({"spec": {"nodeName": "n2", "containers": []}, "status": {"phase": "Pending"}}),
            ),
            running_ready("fresh-ready", "n1", "2026-11-27T09:59:59Z"),
            pod(
                "running-not-ready",
                serde_json::json!({"spec": {"nodeName": "n2", "containers": []}, "status": {"phase": "Running"}}),
            ),
        ];
        assert_eq!(
            order(&pods, "2026-11-27T10:00:00Z"),
            [
                "unscheduled",
                "pending",
                "running-not-ready",
                "fresh-ready",
                "old-ready"
            ]
        );
        // The deletion cost outranks readiness time; co-location outranks it too.
        let mut cheap = running_ready("cheap", "n3", "2026-11-27T08:00:00Z");
        cheap.metadata.annotations = Some(BTreeMap::from([(
            DELETION_COST.to_owned(),
            "-5".to_owned(),
        )]));
        let pods = [running_ready("fresh", "n4", "2026-11-27T09:59:59Z"), cheap];
        assert_eq!(order(&pods, "2026-11-27T10:00:00Z"), ["cheap", "fresh"]);
        let pods = [
            running_ready("alone", "n5", "2026-11-27T09:59:59Z"),
            running_ready("crowded-a", "n6", "2026-11-27T08:00:00Z"),
            running_ready("crowded-b", "n6", "2026-11-27T08:00:00Z"),
        ];
        assert_eq!(order(&pods, "2026-11-27T10:00:00Z")[2], "alone");
    }

    #[test]
    fn deletion_costs_are_read_as_kubernetes_reads_them() {
        let with = |cost: &str| {
            let mut p = pod("p", serde_json::json!({}));
            p.metadata.annotations = Some(BTreeMap::from([(
                DELETION_COST.to_owned(),
                cost.to_owned(),
            )]));
            deletion_cost(&p)
        };
        assert_eq!(with("-7"), -7);
        assert_eq!(with("0"), 0);
        assert_eq!(with("42"), 42);
        assert_eq!(with("007"), 0, "leading zeros are not canonical");
        assert_eq!(with("x"), 0);
        assert_eq!(with("99999999999"), 0, "beyond int32");
    }

    #[test]
    fn ages_within_a_power_of_two_tie_and_fall_back_to_the_uid() {
        let now: jiff::Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
        let t = |s: &str| Some(s.parse::<jiff::Timestamp>().unwrap());
        // 5 s and 6 s old: same power of two (2^32 ns < both < 2^33 ns).
        let same = newer_first(
            (t("2026-11-27T09:59:55Z"), "b"),
            (t("2026-11-27T09:59:54Z"), "a"),
            now,
        );
        assert_eq!(same, std::cmp::Ordering::Greater, "uid decides");
        let apart = newer_first(
            (t("2026-11-27T09:59:59Z"), "z"),
            (t("2026-11-27T08:00:00Z"), "a"),
            now,
        );
        assert_eq!(apart, std::cmp::Ordering::Less, "the newer goes first");
        assert_eq!(
            newer_first((None, "z"), (t("2026-11-27T08:00:00Z"), "a"), now),
            std::cmp::Ordering::Less
        );
    }

    #[test]
    fn selectors_of_both_kinds() {
        let rc: ReplicationController = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "rc"},
            "spec": {"template": {"metadata": {"labels": {"app": "a"}}}},
        }))
        .unwrap();
        let labels = BTreeMap::from([("app".to_owned(), "a".to_owned())]);
        assert!(
            crate::selects(rc.selector().as_ref(), &labels),
            "defaulted from the template"
        );
        let rs: ReplicaSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "rs"},
            "spec": {"selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["a", "b"]}]}},
        }))
        .unwrap();
        assert!(crate::selects(rs.selector().as_ref(), &labels));
        let empty: ReplicaSet = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "rs"}, "spec": {"selector": {}}}),
        )
        .unwrap();
        assert!(
            !crate::selects(empty.selector().as_ref(), &labels),
            "an empty selector selects nothing"
        );
    }
}
