//! The scheduler (SPEC W3): binds pods without `spec.nodeName` to a node
//! through the `binding` subresource, as kube-scheduler's default plugins
//! decide. Filters: a Ready node, cordon, node selector and required node
//! affinity, taints ([`crate::placement`]), requests against allocatable,
//! host ports ([`host_ports`]), claims and their volumes ([`volumes`]),
//! topology spread constraints ([`spread`]) and inter-pod
//! affinity and anti-affinity ([`pod_affinity`]). Scores ([`score`]):
//! untolerated `PreferNoSchedule` taints, preferred node affinity, spread
//! (by default over the pods of the pod's Services and controller, so what
//! a user sees as one app spreads across nodes), preferred pod affinity,
//! free and balanced resources. With no node that fits, the pod stays
//! Pending with a `FailedScheduling` Event saying why, node by node.

pub mod cluster;
pub mod host_ports;
pub mod pod_affinity;
pub mod score;
pub mod spread;
pub mod terms;
pub mod volumes;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{
    Node, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod, PodSpec, Service,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::PostParams;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use portal_api::selector::LabelSelector;
use portal_client::Settled;

use crate::events;
use crate::placement;
use crate::requests::Resources;
use cluster::{Cluster, Placed};
use pod_affinity::PodAffinity;
use spread::Spread;
use terms::Selection;

const COMPONENT: &str = "default-scheduler";
/// How soon an unschedulable pod is first tried again; the wait doubles up
/// to `MAX_RETRY`. A node change retries every pending pod at once.
const RETRY: Duration = Duration::from_secs(10);
const MAX_RETRY: Duration = Duration::from_secs(300);
/// How long a controller's selector is remembered.
const SELECTOR_TTL: Duration = Duration::from_secs(60);

pub use crate::ReconcileError as Error;

struct Context {
    client: Client,
    /// Delays between retries of a failing object.
    retries: crate::Retries,
    events: events::Recorder,
    nodes: Store<Node>,
    pods: Store<Pod>,
    services: Store<Service>,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    classes: Store<StorageClass>,
    /// Bindings made but not yet seen in `pods`, by pod UID.
    assumed: Mutex<HashMap<String, Assumed>>,
    /// Pods no node fits: when to try again, and the wait after that.
    backoff: Arc<Mutex<HashMap<String, (Instant, Duration)>>>,
    /// What is known of placed pods, by UID ([`load`]).
    facts: Mutex<HashMap<String, Facts>>,
    /// Controllers' selectors by controller UID, read when first needed.
    owner_selectors: Mutex<HashMap<String, (Instant, Option<LabelSelector>)>>,
}

/// A binding made but not yet seen in the pod cache.
#[derive(Clone, Debug)]
struct Assumed {
    node: String,
    pod: Arc<Pod>,
}

/// What is on a node: its pods, the resources they ask, and what they
/// count for in scoring.
#[derive(Clone, Copy, Debug, Default)]
struct Load {
    pods: usize,
    used: Resources,
    scoring: Resources,
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_else(|| key(pod))
}

fn key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

/// Why the pod cannot go to the node (empty: it fits), in the words of
/// The pod's `PodScheduled` condition says why it waits, as the
/// kube-scheduler writes it (`False`, `Unschedulable`, the event's
/// message); written only when it changes.
async fn mark_unschedulable(client: &Client, pod: &Pod, message: &str) -> Result<(), Error> {
    let current = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"));
    if current.is_some_and(|c| c.status == "False" && c.message.as_deref() == Some(message)) {
        return Ok(());
    }
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let patch = serde_json::json!({"status": {"conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": message, "lastProbeTime": null, "lastTransitionTime": now}]}});
    let api = Api::<Pod>::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    match api
        .patch_status(
            &pod.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        // Gone or bound meanwhile: nothing to say.
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(error) => Err(error.into()),
    }
}

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

/// The rules that depend on the pods already placed.
struct PodRules<'a> {
    host_ports: Vec<host_ports::HostPort>,
    placed: &'a [Placed],
    spread: Spread<'a>,
    affinity: PodAffinity<'a>,
}

impl PodRules<'_> {
    fn misfit(&self, node: &str) -> Option<&'static str> {
        host_ports::misfit(&self.host_ports, node, self.placed)
            .or_else(|| self.spread.misfit(node))
            .or_else(|| self.affinity.misfit(node))
    }
}

/// `0/3 nodes are available: 1 node(s) were unschedulable, 2 node(s) had
/// untolerated taint {…}.`
fn unavailable_message(
    nodes: &[Arc<Node>],
    pod: &Pod,
    load: &HashMap<Arc<str>, Load>,
    rules: Option<&PodRules<'_>>,
    claims: &volumes::Claims,
) -> String {
    if let volumes::Claims::Blocked(why) = claims {
        return format!("0/{} nodes are available: {why}.", nodes.len());
    }
    let mut reasons: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for node in nodes {
        let used = load
            .get(node.name_any().as_str())
            .map(|l| l.used)
            .unwrap_or_default();
        let mut found = misfits(node, pod, used);
        if found.is_empty() {
            found.extend(volumes::misfit(claims, node).map(str::to_owned));
        }
        if found.is_empty() {
            found.extend(
                rules
                    .and_then(|r| r.misfit(&node.name_any()))
                    .map(str::to_owned),
            );
        }
        for reason in found {
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

/// The node with the highest weighted score among those that fit, ties
/// going to the node with fewer pods, then by name.
fn choose(
    pod: &Pod,
    candidates: &[&Arc<Node>],
    load: &HashMap<Arc<str>, Load>,
    rules: &PodRules<'_>,
) -> Option<String> {
    let empty = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&empty);
    let nodes: Vec<&Node> = candidates.iter().map(|n| n.as_ref()).collect();
    let names: Vec<String> = nodes.iter().map(|n| n.name_any()).collect();
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let taints = score::taint_toleration(spec, &nodes);
    let affinity = score::node_affinity(spec, &nodes);
    let spread = rules.spread.scores(&name_refs);
    let mut near: Vec<i64> = name_refs
        .iter()
        .map(|n| rules.affinity.raw_score(n))
        .collect();
    pod_affinity::normalize(&mut near);
    let asks = Resources::scoring(pod);
    let actual = Resources::of_pod(pod);
    // Balanced allocation leaves pods that ask for nothing alone.
    let best_effort = actual.milli_cpu == 0 && actual.memory == 0;
    let mut best: Option<(i64, usize, &str)> = None;
    for (i, node) in nodes.iter().enumerate() {
        let here = load.get(names[i].as_str()).copied().unwrap_or_default();
        let requested = here.scoring + asks;
        let balanced = if best_effort {
            0
        } else {
            score::balanced_allocation(here.used + actual, node)
        };
        let total = score::TAINT_TOLERATION * taints[i]
            + score::NODE_AFFINITY * affinity[i]
            + score::POD_TOPOLOGY_SPREAD * spread[i]
            + score::INTER_POD_AFFINITY * near[i]
            + score::LEAST_ALLOCATED * score::least_allocated(requested, node)
            + score::BALANCED_ALLOCATION * balanced;
        let better = best.is_none_or(|(score, pods, name)| {
            (
                total,
                std::cmp::Reverse(here.pods),
                std::cmp::Reverse(names[i].as_str()),
            ) > (score, std::cmp::Reverse(pods), std::cmp::Reverse(name))
        });
        if better {
            best = Some((total, here.pods, &names[i]));
        }
    }
    best.map(|(_, _, name)| name.to_owned())
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
    let (services, service_writer) = reflector::store::<Service>();
    let service_events = watcher(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|s| s.metadata.managed_fields = None)
    .reflect(service_writer)
    .for_each(|_| std::future::ready(()));
    let (claims, claim_writer) = reflector::store::<PersistentVolumeClaim>();
    let claim_events = watcher(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|c| c.metadata.managed_fields = None)
    .reflect(claim_writer)
    .for_each(|_| std::future::ready(()));
    let (volumes, volume_writer) = reflector::store::<PersistentVolume>();
    let volume_events = watcher(
        Api::<PersistentVolume>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|v| v.metadata.managed_fields = None)
    .reflect(volume_writer)
    .for_each(|_| std::future::ready(()));
    let (classes, class_writer) = reflector::store::<StorageClass>();
    let class_events = watcher(
        Api::<StorageClass>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(class_writer)
    .for_each(|_| std::future::ready(()));

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
        services,
        claims,
        volumes,
        classes,
        assumed: Mutex::new(HashMap::new()),
        backoff,
        facts: Mutex::new(HashMap::new()),
        owner_selectors: Mutex::new(HashMap::new()),
    });
    let results = controller.watches_stream(node_events, mapper).run(
        reconcile,
        error_policy,
        context.clone(),
    );
    tokio::join!(
        service_events,
        claim_events,
        volume_events,
        class_events,
        crate::drive(results, "scheduling", &context.retries)
    );
}

fn error_policy(pod: Arc<Pod>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, pod = %pod.name_any(), "binding failed; retrying");
    Action::requeue(ctx.retries.after_failure(pod.as_ref()))
}

/// What the scheduler works out about a placed pod once per version of
/// it: its node, what it asks, its parsed affinity terms.
#[derive(Debug)]
struct Facts {
    version: Option<String>,
    used: Resources,
    scoring: Resources,
    placed: Placed,
}

impl Facts {
    fn of(pod: &Arc<Pod>, node: &str) -> Facts {
        Facts {
            version: pod.metadata.resource_version.clone(),
            used: Resources::of_pod(pod),
            scoring: Resources::scoring(pod),
            placed: Placed::new(pod.clone(), node.into()),
        }
    }
}

/// What is on each node and the pods placed there, counting assumed
/// bindings; pods that ended (Succeeded, Failed) hold nothing. Every
/// decision sees every pod, so what each pod asks and prefers is worked
/// out once per version and remembered (`known`).
fn load(
    ctx: &Context,
    assumed: &mut HashMap<String, Assumed>,
) -> (HashMap<Arc<str>, Load>, Vec<Placed>) {
    let mut known = ctx.facts.lock();
    let mut load: HashMap<Arc<str>, Load> = HashMap::new();
    let mut placed = Vec::new();
    let mut pending = std::collections::HashSet::new();
    let mut add = |facts: &Facts| {
        let entry = load.entry(facts.placed.node.clone()).or_default();
        entry.pods += 1;
        entry.used = entry.used + facts.used;
        entry.scoring = entry.scoring + facts.scoring;
        placed.push(facts.placed.clone());
    };
    let pods = ctx.pods.state();
    for pod in &pods {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
            pending.insert(uid(pod));
            continue;
        };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let id = pod.metadata.uid.as_deref().unwrap_or_default();
        let current = known
            .get(id)
            .is_some_and(|f| f.version == pod.metadata.resource_version && &*f.placed.node == node);
        if !current {
            known.insert(id.to_owned(), Facts::of(pod, node));
        }
        if let Some(facts) = known.get(id) {
            add(facts);
        }
    }
    // Forget pods that are gone, now and then.
    if known.len() > 2 * pods.len() + 1024 {
        let present: std::collections::HashSet<&str> = pods
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        known.retain(|uid, _| present.contains(uid.as_str()));
    }
    // Only pods the cache still shows pending are assumed: once it shows
    // them bound they count from there, and deleted ones count nowhere.
    assumed.retain(|uid, _| pending.contains(uid));
    for binding in assumed.values() {
        add(&Facts::of(&binding.pod, &binding.node));
    }
    (load, placed)
}

impl Context {
    /// What a user sees as the pod's app, for default spreading: the pods
    /// its Services select and its controller (ReplicationController,
    /// ReplicaSet, StatefulSet) selects, as upstream's `DefaultSelector`;
    /// `None` when nothing selects the pod.
    async fn app_of(&self, pod: &Pod) -> Option<Selection> {
        let namespace = pod.namespace().unwrap_or_default();
        let mut selectors: Vec<LabelSelector> = self
            .services
            .state()
            .iter()
            .filter(|s| s.namespace().as_deref() == Some(namespace.as_str()))
            .filter_map(|s| s.spec.as_ref()?.selector.as_ref())
            .filter(|selector| !selector.is_empty())
            .filter(|selector| selector.iter().all(|(k, v)| pod.labels().get(k) == Some(v)))
            .filter_map(terms::map_selector)
            .collect();
        if let Some(owner) = crate::controller_of(pod.owner_references()) {
            if let Some(selector) = self.owner_selector(&namespace, owner).await {
                selectors.push(selector);
            }
        }
        (!selectors.is_empty()).then_some(Selection(selectors))
    }

    async fn owner_selector(
        &self,
        namespace: &str,
        owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    ) -> Option<LabelSelector> {
        if let Some((read, selector)) = self.owner_selectors.lock().get(&owner.uid) {
            if read.elapsed() < SELECTOR_TTL {
                return selector.clone();
            }
        }
        let selector = match (owner.api_version.as_str(), owner.kind.as_str()) {
            ("v1", "ReplicationController") => {
                let api: Api<k8s_openapi::api::core::v1::ReplicationController> =
                    Api::namespaced(self.client.clone(), namespace);
                api.get_opt(&owner.name)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|rc| rc.spec?.selector)
                    .and_then(|s| terms::map_selector(&s))
            }
            ("apps/v1", "ReplicaSet") => {
                let api: Api<k8s_openapi::api::apps::v1::ReplicaSet> =
                    Api::namespaced(self.client.clone(), namespace);
                let rs = api.get_opt(&owner.name).await.ok().flatten();
                terms::selector_of(rs.and_then(|r| r.spec).map(|s| s.selector).as_ref())
            }
            ("apps/v1", "StatefulSet") => {
                let api: Api<k8s_openapi::api::apps::v1::StatefulSet> =
                    Api::namespaced(self.client.clone(), namespace);
                let set = api.get_opt(&owner.name).await.ok().flatten();
                terms::selector_of(set.and_then(|s| s.spec).map(|s| s.selector).as_ref())
            }
            _ => None,
        }
        .filter(|s| !s.is_empty());
        let mut cache = self.owner_selectors.lock();
        // Bounded: a cache of many controllers starts over.
        if cache.len() > 10_000 {
            cache.clear();
        }
        cache.insert(owner.uid.clone(), (Instant::now(), selector.clone()));
        selector
    }
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
    let app = ctx.app_of(&pod).await;
    let claims = volumes::check(
        &pod,
        &volumes::Stores {
            claims: &ctx.claims,
            volumes: &ctx.volumes,
            classes: &ctx.classes,
        },
    );
    // Choosing and assuming are one step: pods reconciled concurrently must
    // each see the others' choices.
    let (chosen, message) = {
        let mut assumed = ctx.assumed.lock();
        let (load, placed) = load(&ctx, &mut assumed);
        let cluster = Cluster::new(&nodes, &placed);
        let rules = PodRules {
            host_ports: host_ports::of(&pod),
            placed: &placed,
            spread: Spread::new(&pod, &cluster, app),
            affinity: PodAffinity::new(&pod, &cluster),
        };
        let used = |node: &Node| {
            load.get(node.name_any().as_str())
                .map(|l| l.used)
                .unwrap_or_default()
        };
        let fitting: Vec<&Arc<Node>> = nodes
            .iter()
            .filter(|n| misfits(n, &pod, used(n)).is_empty())
            .filter(|n| volumes::misfit(&claims, n).is_none())
            .filter(|n| rules.misfit(&n.name_any()).is_none())
            .collect();
        let chosen = choose(&pod, &fitting, &load, &rules);
        if let Some(node) = &chosen {
            assumed.insert(
                uid(&pod),
                Assumed {
                    node: node.clone(),
                    pod: pod.clone(),
                },
            );
        }
        let message = chosen
            .is_none()
            .then(|| unavailable_message(&nodes, &pod, &load, Some(&rules), &claims));
        (chosen, message)
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
        let message = message.unwrap_or_default();
        ctx.events
            .record(&reference, "Warning", "FailedScheduling", &message)
            .await;
        mark_unschedulable(&ctx.client, &pod, &message).await?;
        let wait = ctx.backoff.lock().get(&key(&pod)).map_or(RETRY, |b| b.1);
        return Ok(Action::requeue(wait));
    };
    ctx.backoff.lock().remove(&key(&pod));
    if let volumes::Claims::Ready { delayed, .. } = &claims {
        if !delayed.is_empty() {
            // Claims that bind on the first consumer learn its node; the
            // pod is bound once they are (the store is polled, no calls).
            ctx.assumed.lock().remove(&uid(&pod));
            for claim in delayed {
                if claim.annotations().get(volumes::SELECTED_NODE) != Some(&chosen) {
                    let patch = serde_json::json!({"metadata": {"annotations": {volumes::SELECTED_NODE: chosen}}});
                    Api::<PersistentVolumeClaim>::namespaced(
                        ctx.client.clone(),
                        &claim.namespace().unwrap_or_default(),
                    )
                    .patch(
                        &claim.name_any(),
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(&patch),
                    )
                    .await?;
                }
            }
            return Ok(Action::requeue(Duration::from_millis(500)));
        }
    }
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

    fn ready() -> volumes::Claims {
        volumes::Claims::Ready {
            bound: Vec::new(),
            delayed: Vec::new(),
            selected: None,
        }
    }

    #[test]
    fn pods_wait_for_their_claims() {
        let nodes = vec![node("a", serde_json::json!({}))];
        let claiming = pod(serde_json::json!({"containers": [{"name": "c"}],
            "volumes": [{"name": "tmp", "emptyDir": {}},
                {"name": "www", "persistentVolumeClaim": {"claimName": "www-web-0"}}]}));
        let blocked =
            volumes::Claims::Blocked("persistentvolumeclaim \"www-web-0\" not found".into());
        assert_eq!(
            unavailable_message(&nodes, &claiming, &HashMap::new(), None, &blocked),
            "0/1 nodes are available: persistentvolumeclaim \"www-web-0\" not found."
        );
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
            unavailable_message(&nodes, &plain, &HashMap::new(), None, &ready()),
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
            Arc::from("a"),
            Load {
                used: half,
                ..Load::default()
            },
        );
        load.insert(
            Arc::from("b"),
            Load {
                used: half,
                ..Load::default()
            },
        );
        assert_eq!(
            unavailable_message(&nodes, &big, &load, None, &ready()),
            "0/2 nodes are available: 2 Insufficient cpu."
        );
    }
}
