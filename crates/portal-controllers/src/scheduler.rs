//! The scheduler (SPEC W3): binds pods without `spec.nodeName` to a Ready,
//! schedulable Node that their node selector, required node affinity and
//! tolerations allow ([`crate::placement`]) through the `binding`
//! subresource, spreading the pods of
//! one owner (a ReplicationController) across nodes. With no node that
//! fits, the pod stays Pending with a `FailedScheduling` Event; so does a
//! pod whose PersistentVolumeClaims do not exist.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::Stream;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod, PodSpec};
use kube::api::PostParams;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use portal_client::Settled;

use crate::events;
use crate::placement;
use crate::requests::Resources;

const COMPONENT: &str = "default-scheduler";
/// How soon an unschedulable pod is first tried again; the wait doubles up
/// to `MAX_RETRY`. A node change retries every pending pod at once.
const RETRY: Duration = Duration::from_secs(10);
const MAX_RETRY: Duration = Duration::from_secs(300);

pub use crate::ReconcileError as Error;

struct Context {
    client: Client,
    /// Delays between retries of a failing object.
    retries: crate::Retries,
    events: events::Recorder,
    nodes: Store<Node>,
    pods: Store<Pod>,
    /// Bindings made but not yet seen in `pods`, by pod UID.
    assumed: Mutex<HashMap<String, Assumed>>,
    /// Pods no node fits: when to try again, and the wait after that.
    backoff: Arc<Mutex<HashMap<String, (Instant, Duration)>>>,
}

/// A binding made but not yet seen in the pod cache.
#[derive(Clone, Debug)]
struct Assumed {
    node: String,
    owner: Option<String>,
    asks: Resources,
}

/// What is on a node: pods of the owner being placed, all pods, and the
/// resources they ask.
#[derive(Clone, Copy, Debug, Default)]
struct Load {
    same_owner: usize,
    pods: usize,
    used: Resources,
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_else(|| key(pod))
}

fn key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

fn owner_uid(pod: &Pod) -> Option<String> {
    pod.owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.clone())
}

/// Why the pod cannot go to the node (empty: it fits), in the words of
/// Kubernetes' `FailedScheduling` messages: the first check that fails
/// gives its reasons, as Kubernetes' filter plugins do.
fn misfits(node: &Node, pod: &Pod, used: Resources) -> Vec<String> {
    if let Some(reason) = misfit(node, pod) {
        return vec![reason];
    }
    match Resources::allocatable(node) {
        Some(offered) => Resources::insufficient(Resources::of_pod(pod), used, offered),
        None => Vec::new(),
    }
}

/// The checks before resources: readiness, cordon (unless tolerated, as
/// DaemonSet pods do), node selector and required node affinity, taints.
fn misfit(node: &Node, pod: &Pod) -> Option<String> {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if !ready {
        return Some("node(s) were not ready".into());
    }
    let empty = PodSpec::default();
    let pod_spec = pod.spec.as_ref().unwrap_or(&empty);
    let cordoned = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    if cordoned && !placement::tolerates_unschedulable(pod_spec) {
        return Some("node(s) were unschedulable".into());
    }
    if !placement::selects_node(pod_spec, node) {
        return Some("node(s) didn't match Pod's node affinity/selector".into());
    }
    let tolerations = pod_spec.tolerations.as_deref().unwrap_or_default();
    placement::untolerated(tolerations, node, &["NoSchedule", "NoExecute"]).map(|taint| {
        format!(
            "node(s) had untolerated taint {{{}: {}}}",
            taint.key,
            taint.value.as_deref().unwrap_or("")
        )
    })
}

/// The first claim the pod's volumes name that does not exist. This API
/// server does not serve PersistentVolumeClaims yet (they come with
/// storage), so no claim exists and such a pod waits, as it would upstream
/// for a claim not yet created.
fn missing_claim(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()?
        .volumes
        .as_ref()?
        .iter()
        .find_map(|v| v.persistent_volume_claim.as_ref())
        .map(|claim| claim.claim_name.as_str())
}

/// `0/3 nodes are available: 1 node(s) were unschedulable, 2 node(s) had
/// untolerated taint {…}.`
fn unavailable_message(nodes: &[Arc<Node>], pod: &Pod, load: &HashMap<String, Load>) -> String {
    if let Some(claim) = missing_claim(pod) {
        return format!(
            "0/{} nodes are available: persistentvolumeclaim \"{claim}\" not found.",
            nodes.len()
        );
    }
    let mut reasons: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for node in nodes {
        let used = load
            .get(&node.name_any())
            .map(|l| l.used)
            .unwrap_or_default();
        for reason in misfits(node, pod, used) {
            *reasons.entry(reason).or_default() += 1;
        }
    }
    let parts: Vec<String> = reasons
        .iter()
        .map(|(reason, count)| format!("{count} {reason}"))
        .collect();
    if parts.is_empty() {
        return format!("0/{} nodes are available.", nodes.len());
    }
    format!(
        "0/{} nodes are available: {}.",
        nodes.len(),
        parts.join(", ")
    )
}

/// Runs the scheduler until the process ends, reading pods from the
/// process's shared pod reflector.
pub async fn run(
    client: Client,
    pods: Store<Pod>,
    pod_changes: impl Stream<Item = Settled<Pod>> + Send + 'static,
) {
    let (nodes, node_writer) = reflector::store::<Node>();
    let node_events = portal_client::settled_objects(
        watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .reflect(node_writer),
    );

    // Every pod change reaches the reconcile, which leaves bound pods alone;
    // the store holds every pod, the pending ones among them.
    let controller =
        Controller::for_shared_stream(portal_client::shared::objects(pod_changes), pods.clone())
            .with_config(crate::config());
    let backoff = Arc::new(Mutex::new(HashMap::new()));
    // A node appearing or turning ready is a reason to try every pending pod.
    let node_backoff = backoff.clone();
    let pending = pods.clone();
    let mapper = move |_: Node| {
        node_backoff.lock().clear();
        pending
            .state()
            .iter()
            .filter(|p| p.spec.as_ref().is_none_or(|s| s.node_name.is_none()))
            .map(|p| ObjectRef::from_obj(&**p))
            .collect::<Vec<_>>()
    };
    let context = Arc::new(Context {
        retries: crate::Retries::new(Duration::from_secs(1)),
        events: events::Recorder::new(client.clone(), COMPONENT),
        client,
        nodes,
        pods,
        assumed: Mutex::new(HashMap::new()),
        backoff,
    });
    let results = controller.watches_stream(node_events, mapper).run(
        reconcile,
        error_policy,
        context.clone(),
    );
    crate::drive(results, "scheduling", &context.retries).await;
}

fn error_policy(pod: Arc<Pod>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, pod = %pod.name_any(), "binding failed; retrying");
    Action::requeue(ctx.retries.after_failure(pod.as_ref()))
}

/// What is on each node, counting assumed bindings; pods that ended
/// (Succeeded, Failed) hold no resources.
fn load(
    ctx: &Context,
    assumed: &mut HashMap<String, Assumed>,
    owner: Option<&str>,
) -> HashMap<String, Load> {
    let mut load: HashMap<String, Load> = HashMap::new();
    let mut pending = std::collections::HashSet::new();
    for pod in ctx.pods.state() {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            pending.insert(uid(&pod));
            continue;
        };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let entry = load.entry(node).or_default();
        entry.pods += 1;
        entry.used = entry.used + Resources::of_pod(&pod);
        if owner.is_some() && owner_uid(&pod).as_deref() == owner {
            entry.same_owner += 1;
        }
    }
    // Only pods the cache still shows pending are assumed: once it shows
    // them bound they count from there, and deleted ones count nowhere.
    assumed.retain(|uid, _| pending.contains(uid));
    for binding in assumed.values() {
        let entry = load.entry(binding.node.clone()).or_default();
        entry.pods += 1;
        entry.used = entry.used + binding.asks;
        if owner.is_some() && binding.owner.as_deref() == owner {
            entry.same_owner += 1;
        }
    }
    load
}

async fn reconcile(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action, Error> {
    let bound = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some();
    let scheduler = pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduler_name.as_deref())
        .unwrap_or(COMPONENT);
    let assumed = ctx.assumed.lock().contains_key(&uid(&pod));
    if bound || pod.metadata.deletion_timestamp.is_some() || scheduler != COMPONENT || assumed {
        return Ok(Action::await_change());
    }
    let nodes = ctx.nodes.state();
    let owner = owner_uid(&pod);
    // Choosing and assuming are one step: pods reconciled concurrently must
    // each see the others' choices.
    let (chosen, load) = {
        let mut assumed = ctx.assumed.lock();
        let load = load(&ctx, &mut assumed, owner.as_deref());
        let used = |node: &Node| {
            load.get(&node.name_any())
                .map(|l| l.used)
                .unwrap_or_default()
        };
        let fitting: Vec<&Arc<Node>> = nodes
            .iter()
            .filter(|_| missing_claim(&pod).is_none())
            .filter(|n| misfits(n, &pod, used(n)).is_empty())
            .collect();
        let chosen = fitting.iter().map(|n| n.name_any()).min_by_key(|n| {
            let l = load.get(n).copied().unwrap_or_default();
            (l.same_owner, l.pods, n.clone())
        });
        if let Some(node) = &chosen {
            assumed.insert(
                uid(&pod),
                Assumed {
                    node: node.clone(),
                    owner: owner.clone(),
                    asks: Resources::of_pod(&pod),
                },
            );
        }
        (chosen, load)
    };
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.name_any()),
        namespace: pod.namespace(),
        uid: pod.metadata.uid.clone(),
        ..ObjectReference::default()
    };
    let Some(chosen) = chosen else {
        // Pod updates (status, labels) re-trigger the reconcile; only the
        // backoff's deadline or a node change makes a new attempt.
        let now = Instant::now();
        let wait = {
            let mut backoff = ctx.backoff.lock();
            match backoff.get(&key(&pod)).copied() {
                Some((due, _)) if due > now => Some(due - now),
                previous => {
                    let wait = previous.map_or(RETRY, |(_, wait)| (wait * 2).min(MAX_RETRY));
                    backoff.insert(key(&pod), (now + wait, wait));
                    None
                }
            }
        };
        if let Some(wait) = wait {
            return Ok(Action::requeue(wait));
        }
        let message = unavailable_message(&nodes, &pod, &load);
        ctx.events
            .record(&reference, "Warning", "FailedScheduling", &message)
            .await;
        let wait = ctx.backoff.lock().get(&key(&pod)).map_or(RETRY, |b| b.1);
        return Ok(Action::requeue(wait));
    };
    ctx.backoff.lock().remove(&key(&pod));
    let binding = serde_json::json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": pod.name_any(), "namespace": pod.namespace()},
        "target": {"apiVersion": "v1", "kind": "Node", "name": chosen},
    });
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &pod.namespace().unwrap_or_default());
    match api
        .create_subresource::<_, serde_json::Value>(
            "binding",
            &pod.name_any(),
            &PostParams::default(),
            &binding,
        )
        .await
    {
        Ok(_) => {}
        // Bound meanwhile (another scheduler, or a retry): nothing to do.
        Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {
            ctx.assumed.lock().remove(&uid(&pod));
            return Ok(Action::await_change());
        }
        Err(e) => {
            ctx.assumed.lock().remove(&uid(&pod));
            return Err(e.into());
        }
    }
    let message = format!(
        "Successfully assigned {}/{} to {chosen}",
        pod.namespace().unwrap_or_default(),
        pod.name_any()
    );
    ctx.events
        .record(&reference, "Normal", "Scheduled", &message)
        .await;
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, extra: serde_json::Value) -> Arc<Node> {
        let mut node = serde_json::json!({
            "metadata": {"name": name, "labels": {"disk": "ssd"}},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        });
        for (key, value) in extra.as_object().unwrap() {
            node["spec"][key] = value.clone();
        }
        Arc::new(serde_json::from_value(node).unwrap())
    }

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
            .unwrap()
    }

    #[test]
    fn pods_wait_for_their_claims() {
        let nodes = vec![node("a", serde_json::json!({}))];
        let claiming = pod(serde_json::json!({"containers": [{"name": "c"}],
            "volumes": [{"name": "tmp", "emptyDir": {}},
                {"name": "www", "persistentVolumeClaim": {"claimName": "www-web-0"}}]}));
        assert_eq!(missing_claim(&claiming), Some("www-web-0"));
        assert_eq!(
            unavailable_message(&nodes, &claiming, &HashMap::new()),
            "0/1 nodes are available: persistentvolumeclaim \"www-web-0\" not found."
        );
        let mut projected = claiming.clone();
        crate::pods::project(&mut projected);
        assert_eq!(missing_claim(&projected), Some("www-web-0"));
    }

    #[test]
    fn taints_selectors_and_cordons_keep_pods_away_with_reasons() {
        let tainted = serde_json::json!({"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]});
        let nodes = vec![
            node("a", tainted.clone()),
            node("b", serde_json::json!({"unschedulable": true})),
            node("c", tainted),
        ];
        let plain = pod(serde_json::json!({"containers": [{"name": "c"}]}));
        assert_eq!(
            unavailable_message(&nodes, &plain, &HashMap::new()),
            "0/3 nodes are available: 2 node(s) had untolerated taint {dedicated: db}, 1 node(s) were unschedulable."
        );
        let tolerant = pod(serde_json::json!({"containers": [{"name": "c"}],
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}]}));
        assert!(misfit(&nodes[0], &tolerant).is_none());
        let elsewhere = pod(
            serde_json::json!({"containers": [{"name": "c"}], "nodeSelector": {"disk": "hdd"},
            "tolerations": [{"operator": "Exists"}]}),
        );
        assert_eq!(
            misfit(&nodes[0], &elsewhere).as_deref(),
            Some("node(s) didn't match Pod's node affinity/selector")
        );
    }

    #[test]
    fn requests_must_fit_what_is_left_of_allocatable() {
        let mut nodes = vec![
            node("a", serde_json::json!({})),
            node("b", serde_json::json!({})),
        ];
        for n in &mut nodes {
            let n = Arc::make_mut(n);
            n.status.get_or_insert_with(Default::default).allocatable = serde_json::from_value(
                serde_json::json!({"cpu": "2", "memory": "1Gi", "pods": "110"}),
            )
            .ok();
        }
        let big = pod(serde_json::json!({"containers": [{"name": "c",
            "resources": {"requests": {"cpu": "1500m", "memory": "100Mi"}}}]}));
        assert!(misfits(&nodes[0], &big, Resources::default()).is_empty());
        let mut load = HashMap::new();
        let half = Resources {
            milli_cpu: 1000,
            memory: 0,
            pods: 1,
        };
        load.insert(
            "a".to_owned(),
            Load {
                used: half,
                ..Load::default()
            },
        );
        load.insert(
            "b".to_owned(),
            Load {
                used: half,
                ..Load::default()
            },
        );
        assert_eq!(
            unavailable_message(&nodes, &big, &load),
            "0/2 nodes are available: 2 Insufficient cpu."
        );
    }
}
