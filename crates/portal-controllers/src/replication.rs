//! The ReplicationController controller (SPEC W4): keeps `spec.replicas`
//! pods from the template alive, creating and deleting in batches, and
//! reports `status.replicas`, `readyReplicas`, `observedGeneration`.
//!
//! Orphaned pods that match the selector are adopted, and owned pods that
//! stop matching it are released, as upstream does.
//!
//! Like upstream it keeps *expectations*: pods it created or deleted that
//! its pod reflector has not seen yet still count, so a reconcile that runs
//! before the watch catches up never creates or deletes twice.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::Stream;
use k8s_openapi::api::core::v1::{
    ObjectReference, Pod, ReplicationController, ReplicationControllerStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use portal_client::Settled;

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

/// Runs the controller until the process ends, reading pods from the
/// process's shared pod reflector.
pub async fn run(
    client: Client,
    pods: Store<Pod>,
    pod_changes: impl Stream<Item = Settled<Pod>> + Send + 'static,
) {
    let context = Arc::new(Context {
        retries: crate::Retries::new(Duration::from_millis(500)),
        client: client.clone(),
        events: events::Recorder::new(client.clone(), COMPONENT),
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
    let controller = Controller::new(
        Api::<ReplicationController>::all(client),
        watcher::Config::default(),
    )
    .with_config(crate::config());
    let controllers = controller.store();
    // A pod concerns its controller, or, when it has none, every RC whose
    // selector matches it (to be adopted).
    let mapper = move |pod: Arc<Pod>| -> Vec<ObjectRef<ReplicationController>> {
        let namespace = pod.namespace().unwrap_or_default();
        if let Some(owner) = pod
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true))
        {
            return (owner.kind == "ReplicationController")
                .then(|| ObjectRef::new(&owner.name).within(&namespace))
                .into_iter()
                .collect();
        }
        controllers
            .state()
            .iter()
            .filter(|rc| rc.namespace().as_deref() == Some(namespace.as_str()))
            .filter(|rc| selects(&selector_of(rc), pod.labels()))
            .map(|rc| ObjectRef::from_obj(&**rc))
            .collect()
    };
    crate::drive(
        controller
            .watches_shared_stream(portal_client::shared::objects(pod_changes), mapper)
            .run(reconcile, error_policy, context.clone()),
        "replication reconcile",
        &context.retries,
    )
    .await;
}

/// The RC's selector (the API defaults it to the template's labels).
fn selector_of(rc: &ReplicationController) -> BTreeMap<String, String> {
    let spec = rc.spec.as_ref();
    spec.and_then(|s| s.selector.clone())
        .filter(|s| !s.is_empty())
        .or_else(|| {
            spec.and_then(|s| s.template.as_ref())
                .and_then(|t| t.metadata.as_ref())
                .and_then(|m| m.labels.clone())
        })
        .unwrap_or_default()
}

/// An empty selector selects nothing.
fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn controller_of(pod: &Pod) -> Option<&OwnerReference> {
    pod.owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
}

/// Adopts an orphan (adds this RC as its controller) or releases a pod that
/// no longer matches (removes this RC from its owners), as Kubernetes'
/// controller reference manager does.
async fn set_controller(
    api: &Api<Pod>,
    pod: &Pod,
    owner: Option<&OwnerReference>,
    uid: &str,
) -> Result<(), Error> {
    let mut owners: Vec<OwnerReference> = pod
        .owner_references()
        .iter()
        .filter(|o| o.uid != uid)
        .cloned()
        .collect();
    owners.extend(owner.cloned());
    // The pod's uid makes the patch fail if the pod was replaced meanwhile.
    let patch = serde_json::json!({
        "metadata": {"ownerReferences": owners, "uid": pod.metadata.uid}
    });
    match api
        .patch(
            &pod.name_any(),
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

fn error_policy(rc: Arc<ReplicationController>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, rc = %rc.name_any(), "replication update failed; retrying");
    Action::requeue(ctx.retries.after_failure(rc.as_ref()))
}

const COMPONENT: &str = "replication-controller";

fn reference(rc: &ReplicationController) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ReplicationController".into()),
        name: Some(rc.name_any()),
        namespace: rc.namespace(),
        uid: rc.metadata.uid.clone(),
        ..ObjectReference::default()
    }
}

fn is_active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"))
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn owned_by(pod: &Pod, uid: &str) -> bool {
    pod.owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// Which pods to delete first: unscheduled, then not running, then not
/// ready, then the youngest (upstream's ranking, simplified).
fn deletion_rank(pod: &Pod) -> (u8, u8, u8, std::cmp::Reverse<Option<jiff::Timestamp>>) {
    let scheduled = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some();
    let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    (
        u8::from(scheduled),
        u8::from(running),
        u8::from(is_ready(pod)),
        std::cmp::Reverse(pod.metadata.creation_timestamp.as_ref().map(|t| t.0)),
    )
}

async fn reconcile(rc: Arc<ReplicationController>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.pods_listed.is_set() {
        return Ok(Action::requeue(crate::NOT_LISTED_YET));
    }
    let namespace = rc.namespace().unwrap_or_default();
    let name = rc.name_any();
    let uid = rc.metadata.uid.clone().unwrap_or_default();
    let key = format!("{namespace}/{name}");
    let spec = rc.spec.clone().unwrap_or_default();
    let wanted = usize::try_from(spec.replicas.unwrap_or(1)).unwrap_or(0);
    let selector = selector_of(&rc);
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "ReplicationController".into(),
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
        let matches = selects(&selector, pod.labels());
        if owned_by(&pod, &uid) {
            if matches {
                pods.push(pod);
            } else {
                set_controller(&api, &pod, None, &uid).await?;
            }
        } else if matches
            && controller_of(&pod).is_none()
            && rc.metadata.deletion_timestamp.is_none()
        {
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
    let managing = rc.metadata.deletion_timestamp.is_none();

    if managing && current < wanted {
        let template = spec.template.clone().unwrap_or_default();
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
                    &reference(&rc),
                    "Normal",
                    "SuccessfulCreate",
                    &format!("Created pod: {pod}"),
                )
                .await;
        }
        if let Some(e) = first_error {
            return Err(e.into());
        }
    } else if managing && current > wanted {
        let mut victims: Vec<&Arc<Pod>> = pods.iter().collect();
        victims.sort_by_key(|p| deletion_rank(p));
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
                        .record(&reference(&rc), "Normal", "SuccessfulDelete", &message)
                        .await;
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    let status = ReplicationControllerStatus {
        replicas: i32::try_from(pods.len()).unwrap_or(i32::MAX),
        ready_replicas: Some(
            i32::try_from(pods.iter().filter(|p| is_ready(p)).count()).unwrap_or(i32::MAX),
        ),
        available_replicas: Some(
            i32::try_from(pods.iter().filter(|p| is_ready(p)).count()).unwrap_or(i32::MAX),
        ),
        fully_labeled_replicas: Some(i32::try_from(pods.len()).unwrap_or(i32::MAX)),
        observed_generation: rc.metadata.generation,
        conditions: None,
    };
    if rc.status.as_ref() != Some(&status) {
        let rcs: Api<ReplicationController> = Api::namespaced(ctx.client.clone(), &namespace);
        let mut updated = (*rc).clone();
        updated.status = Some(status);
        match rcs
            .replace_status(&name, &PostParams::default(), &updated)
            .await
        {
            Ok(_) => {}
            // Changed meanwhile: the change triggers another reconcile.
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Action::requeue(Duration::from_secs(60)))
}
