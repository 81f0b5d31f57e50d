//! The disruption controller (`policy/v1`), as kube-controller-manager's:
//! keeps each PodDisruptionBudget's status — how many of its pods are
//! healthy (ready, not going, not just evicted), how many must be, how many
//! may be disrupted now — for the eviction subresource to decide on.
//!
//! `minAvailable` as a number needs the pods alone; a percentage, or
//! `maxUnavailable`, is of the replicas the pods' controllers want (a
//! ReplicaSet's, its Deployment's, a ReplicationController's, a
//! StatefulSet's), read through the API. Pods evicted less than two
//! minutes ago that still exist stay counted as disrupted.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{ObjectReference, Pod, ReplicationController};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::PostParams;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use portal_api::selector::LabelSelector;
use portal_client::Settled;

use crate::events;
use crate::replication::is_ready;

pub use crate::ReconcileError as Error;

const COMPONENT: &str = "controllermanager";
/// How long an evicted pod counts as disrupted while it still exists.
const DELETION_TIMEOUT: i64 = 120;

struct Context {
    client: Client,
    retries: crate::Retries,
    events: events::Recorder,
    pods: Store<Pod>,
    pods_listed: Arc<crate::Listed>,
}

fn selector_of(pdb: &PodDisruptionBudget) -> Option<LabelSelector> {
    let selector = pdb.spec.as_ref()?.selector.as_ref()?;
    let value = serde_json::to_value(selector).ok()?;
    LabelSelector::from_api(&value, "spec.selector").ok()
}

/// Runs the controller until the process ends, reading pods from the
/// process's shared pod reflector.
pub async fn run(
    client: Client,
    pods: Store<Pod>,
    pod_changes: impl Stream<Item = Settled<Pod>> + Send + 'static,
) {
    let context = Arc::new(Context {
        client: client.clone(),
        retries: crate::Retries::new(Duration::from_millis(500)),
        events: events::Recorder::new(client.clone(), COMPONENT),
        pods,
        pods_listed: Arc::new(crate::Listed::default()),
    });
    let pod_changes = crate::note_listed(pod_changes, context.pods_listed.clone());
    let controller = Controller::new(
        Api::<PodDisruptionBudget>::all(client),
        watcher::Config::default(),
    )
    .with_config(crate::config());
    let budgets = controller.store();
    // A pod concerns every budget in its namespace that selects it.
    let mapper = move |pod: Arc<Pod>| -> Vec<ObjectRef<PodDisruptionBudget>> {
        let namespace = pod.namespace().unwrap_or_default();
        budgets
            .state()
            .iter()
            .filter(|b| b.namespace().as_deref() == Some(namespace.as_str()))
            .filter(|b| {
                selector_of(b)
                    .is_some_and(|s| s.matches(|k| pod.labels().get(k).map(String::as_str)))
            })
            .map(|b| ObjectRef::from_obj(&**b))
            .collect()
    };
    crate::drive(
        controller
            .watches_shared_stream(portal_client::shared::objects(pod_changes), mapper)
            .run(reconcile, error_policy, context.clone()),
        COMPONENT,
        &context.retries,
    )
    .await;
}

fn error_policy(pdb: Arc<PodDisruptionBudget>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::debug!(%error, name = %pdb.name_any(), "disruption budget sync failed; retrying");
    Action::requeue(ctx.retries.after_failure(pdb.as_ref()))
}

/// The replicas the pods' controllers want, each controller once; `None`
/// when a pod has no controller whose scale is known.
async fn expected_replicas(
    client: &Client,
    namespace: &str,
    pods: &[Arc<Pod>],
) -> Result<Option<i32>, Error> {
    let mut seen: HashMap<String, i32> = HashMap::new();
    for pod in pods {
        let Some(owner) = pod
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true))
        else {
            return Ok(None);
        };
        if seen.contains_key(&owner.uid) {
            continue;
        }
        let replicas = match owner.kind.as_str() {
            "ReplicaSet" => {
                let rs = Api::<ReplicaSet>::namespaced(client.clone(), namespace)
                    .get(&owner.name)
                    .await?;
                let deployment = rs
                    .owner_references()
                    .iter()
                    .find(|o| o.controller == Some(true) && o.kind == "Deployment")
                    .cloned();
                match deployment {
                    Some(d) => {
                        if seen.contains_key(&d.uid) {
                            seen.insert(owner.uid.clone(), 0);
                            continue;
                        }
                        let deployment = Api::<Deployment>::namespaced(client.clone(), namespace)
                            .get(&d.name)
                            .await?;
                        seen.insert(d.uid.clone(), 0);
                        deployment.spec.and_then(|s| s.replicas).unwrap_or(1)
                    }
                    None => rs.spec.and_then(|s| s.replicas).unwrap_or(1),
                }
            }
            "ReplicationController" => {
                Api::<ReplicationController>::namespaced(client.clone(), namespace)
                    .get(&owner.name)
                    .await?
                    .spec
                    .and_then(|s| s.replicas)
                    .unwrap_or(1)
            }
            "StatefulSet" => Api::<StatefulSet>::namespaced(client.clone(), namespace)
                .get(&owner.name)
                .await?
                .spec
                .and_then(|s| s.replicas)
                .unwrap_or(1),
            _ => return Ok(None),
        };
        seen.insert(owner.uid.clone(), replicas);
    }
    Ok(Some(seen.values().sum()))
}

fn scaled(value: &IntOrString, total: i32, round_up: bool) -> i32 {
    crate::deployment::rollout::scaled(Some(value), total, round_up)
}

async fn reconcile(pdb: Arc<PodDisruptionBudget>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.pods_listed.is_set() {
        return Ok(Action::requeue(crate::NOT_LISTED_YET));
    }
    let namespace = pdb.namespace().unwrap_or_default();
    let spec = pdb.spec.clone().unwrap_or_default();
    let selector = selector_of(&pdb);
    let pods: Vec<Arc<Pod>> = ctx
        .pods
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|p| {
            selector
                .as_ref()
                .is_some_and(|s| s.matches(|k| p.labels().get(k).map(String::as_str)))
        })
        .collect();
    let now = jiff::Timestamp::now();
    let old = pdb.status.clone().unwrap_or_default();
    // Evictions recent enough to still be on their way.
    let disrupted: BTreeMap<String, Time> = old
        .disrupted_pods
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|(name, at)| {
            now.as_second() - at.0.as_second() < DELETION_TIMEOUT
                && pods
                    .iter()
                    .any(|p| p.name_any() == *name && p.metadata.deletion_timestamp.is_none())
        })
        .collect();
    let healthy = pods
        .iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && is_ready(p)
                && !disrupted.contains_key(&p.name_any())
        })
        .count();
    let healthy = i32::try_from(healthy).unwrap_or(i32::MAX);
    let count = i32::try_from(pods.len()).unwrap_or(i32::MAX);
    let (expected, desired) = match (&spec.min_available, &spec.max_unavailable) {
        (Some(IntOrString::Int(min)), _) => (Some(count), *min),
        (Some(percent), _) => match expected_replicas(&ctx.client, &namespace, &pods).await? {
            Some(total) => (Some(total), scaled(percent, total, true)),
            None => (None, 0),
        },
        (None, Some(max)) => match expected_replicas(&ctx.client, &namespace, &pods).await? {
            Some(total) => (Some(total), (total - scaled(max, total, true)).max(0)),
            None => (None, 0),
        },
        (None, None) => (Some(count), 0),
    };
    let allowed = match expected {
        Some(_) => (healthy - desired).max(0),
        None => {
            let reference = ObjectReference {
                api_version: Some("policy/v1".into()),
                kind: Some("PodDisruptionBudget".into()),
                name: Some(pdb.name_any()),
                namespace: Some(namespace.clone()),
                uid: pdb.metadata.uid.clone(),
                ..ObjectReference::default()
            };
            let message =
                "found no controllers for the pods (or their scale): minAvailable as a number only";
            ctx.events
                .record(&reference, "Warning", "NoControllers", message)
                .await;
            0
        }
    };
    let (state, reason) = if allowed > 0 {
        ("True", "SufficientPods")
    } else {
        ("False", "InsufficientPods")
    };
    let mut conditions = old.conditions.clone().unwrap_or_default();
    let same = conditions
        .iter()
        .any(|c| c.type_ == "DisruptionAllowed" && c.status == state && c.reason == reason);
    if !same {
        conditions.retain(|c| c.type_ != "DisruptionAllowed");
        conditions.push(Condition {
            type_: "DisruptionAllowed".into(),
            status: state.into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: Time(
                jiff::Timestamp::from_second(now.as_second()).unwrap_or(now),
            ),
            observed_generation: pdb.metadata.generation,
        });
    }
    let status = PodDisruptionBudgetStatus {
        conditions: Some(conditions),
        current_healthy: healthy,
        desired_healthy: desired,
        disrupted_pods: (!disrupted.is_empty()).then_some(disrupted.clone()),
        disruptions_allowed: allowed,
        expected_pods: expected.unwrap_or(0),
        observed_generation: pdb.metadata.generation,
    };
    if pdb.status.as_ref() != Some(&status) {
        let mut updated = (*pdb).clone();
        updated.status = Some(status);
        Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), &namespace)
            .replace_status(&pdb.name_any(), &PostParams::default(), &updated)
            .await?;
    }
    // Recorded evictions expire: look again then.
    Ok(Action::requeue(if disrupted.is_empty() {
        Duration::from_secs(300)
    } else {
        Duration::from_secs(10)
    }))
}
