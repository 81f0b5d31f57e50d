//! The ReplicationController controller (SPEC W4): keeps `spec.replicas`
//! pods from the template alive, creating and deleting in batches, and
//! reports `status.replicas`, `readyReplicas`, `observedGeneration`.
//!
//! Like upstream it keeps *expectations*: pods it created or deleted that
//! its pod reflector has not seen yet still count, so a reconcile that runs
//! before the watch catches up never creates or deletes twice.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    ObjectReference, Pod, ReplicationController, ReplicationControllerStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;

use crate::events;

/// Most pods created or deleted by one reconcile.
const BATCH: usize = 500;
/// Expectations older than this are dropped (a lost watch event must not
/// block the controller for ever).
const EXPECTATION_TTL: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("API request failed: {0}")]
    Api(#[from] kube::Error),
}

/// Pods created or deleted but not yet seen so by the reflector.
#[derive(Debug, Default)]
struct Expectations {
    created: HashSet<String>,
    deleted: HashSet<String>,
    since: Option<Instant>,
}

struct Context {
    client: Client,
    events: events::Recorder,
    pods: Store<Pod>,
    expectations: Mutex<HashMap<String, Expectations>>,
}

pub async fn run(client: Client) {
    let (pods, pod_writer) = reflector::store::<Pod>();
    let pod_events = watcher(Api::<Pod>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(pod_writer)
        .touched_objects();
    let context = Arc::new(Context {
        client: client.clone(),
        events: events::Recorder::new(client.clone(), COMPONENT),
        pods,
        expectations: Mutex::new(HashMap::new()),
    });
    crate::drive(
        Controller::new(
            Api::<ReplicationController>::all(client),
            watcher::Config::default(),
        )
        .owns_stream(pod_events)
        .run(reconcile, error_policy, context),
        "replication reconcile",
    )
    .await;
}

fn error_policy(rc: Arc<ReplicationController>, error: &Error, _: Arc<Context>) -> Action {
    tracing::warn!(%error, rc = %rc.name_any(), "replication update failed; retrying");
    Action::requeue(Duration::from_millis(500))
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
    let namespace = rc.namespace().unwrap_or_default();
    let name = rc.name_any();
    let uid = rc.metadata.uid.clone().unwrap_or_default();
    let key = format!("{namespace}/{name}");
    let spec = rc.spec.clone().unwrap_or_default();
    let wanted = usize::try_from(spec.replicas.unwrap_or(1)).unwrap_or(0);
    let pods: Vec<Arc<Pod>> = ctx
        .pods
        .state()
        .into_iter()
        .filter(|p| {
            p.namespace().as_deref() == Some(namespace.as_str())
                && owned_by(p, &uid)
                && is_active(p)
        })
        .collect();
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
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);

    if current < wanted {
        let template = spec.template.clone().unwrap_or_default();
        let owner = OwnerReference {
            api_version: "v1".into(),
            kind: "ReplicationController".into(),
            name: name.clone(),
            uid: uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
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
    } else if current > wanted {
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
