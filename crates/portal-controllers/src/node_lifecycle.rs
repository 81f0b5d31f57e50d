//! Node lifecycle, as kube-controller-manager's node lifecycle controller
//! and its taint manager:
//!
//! - a Node whose agent has neither renewed its Lease nor posted status for
//!   the grace period (`--node-monitor-grace-period`, 40 s) gets its
//!   conditions `Unknown` (`NodeStatusUnknown`, or `NodeStatusNeverUpdated`
//!   for one that never reported), and its pods are marked not Ready, so
//!   they leave every EndpointSlice at once;
//! - a Node that is not Ready is tainted `node.kubernetes.io/unreachable`
//!   (Unknown) or `node.kubernetes.io/not-ready` (False), `NoSchedule` and
//!   `NoExecute`; the taints go when it is Ready again;
//! - a pod on a node with a `NoExecute` taint it does not tolerate is
//!   evicted (deleted, gracefully) at once, or when its toleration's
//!   `tolerationSeconds` have passed since the taint came (the API server
//!   gives every pod 300 s for both taints unless it says otherwise); its
//!   ReplicationController then makes a new one elsewhere.
//!
//! It looks at every node once a second, from its caches of Nodes, Leases
//! and pods: nothing is written while all is well.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};

use crate::events;

/// How the controller judges nodes.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// A node silent this long is `Unknown` (`--node-monitor-grace-period`).
    pub grace_period: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            grace_period: Duration::from_secs(40),
        }
    }
}

pub const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
pub const NOT_READY: &str = "node.kubernetes.io/not-ready";
/// How often every node is looked at.
const PERIOD: Duration = Duration::from_secs(1);
/// How soon after a node turned Unknown it is looked at again (its pods
/// leave the Services then): time for the watch to bring the write back.
const FOLLOW_UP: Duration = Duration::from_millis(100);
/// The conditions the agent reports; all turn Unknown when it is silent.
const CONDITIONS: [&str; 4] = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];

/// A task that ends when its handle is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs until the process ends, reading pods from the shared pod cache.
pub async fn run(client: Client, config: Config, pods: Store<Pod>) {
    let (nodes, node_writer) = reflector::store::<Node>();
    let (leases, lease_writer) = reflector::store::<Lease>();
    let node_watch = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(node_writer);
    let lease_api = Api::<Lease>::namespaced(client.clone(), "kube-node-lease");
    let lease_watch = watcher(lease_api, watcher::Config::default())
        .default_backoff()
        .reflect(lease_writer);
    // Tied to this future: a controller that stops (a leader that lost its
    // lease) leaves no watch behind.
    let _node_watch = AbortOnDrop(tokio::spawn(futures_util::StreamExt::for_each(
        node_watch,
        |_| async {},
    )));
    // When each renewal arrived, on this controller's clock: silence is
    // measured from there, not from the next look (up to a period later).
    let arrivals: Arrivals = Arc::default();
    let arrived = arrivals.clone();
    let _lease_watch = AbortOnDrop(tokio::spawn(futures_util::StreamExt::for_each(
        lease_watch.touched_objects(),
        move |lease| {
            if let Ok(lease) = lease {
                let renewed = lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.renew_time.as_ref())
                    .map(|t| t.0);
                let mut arrived = arrived.lock();
                let entry = arrived
                    .entry(lease.name_any())
                    .or_insert((renewed, Instant::now()));
                if entry.0 != renewed {
                    *entry = (renewed, Instant::now());
                }
            }
            async {}
        },
    )));
    let _ = nodes.wait_until_ready().await;
    let _ = leases.wait_until_ready().await;
    let _ = pods.wait_until_ready().await;
    let mut lifecycle = Lifecycle {
        events: events::Recorder::new(client.clone(), "node-controller"),
        client,
        config,
        evicted: HashSet::new(),
        heard: HashMap::new(),
        arrivals,
        follow_up: false,
    };
    loop {
        let now = jiff::Timestamp::now();
        let leases: HashMap<String, jiff::Timestamp> = leases
            .state()
            .iter()
            .filter_map(|l| Some((l.name_any(), l.spec.as_ref()?.renew_time.as_ref()?.0)))
            .collect();
        let nodes = nodes.state();
        // Only nodes that are not Ready or carry a NoExecute taint have
        // pods to look at: in a healthy cluster no pod is touched.
        let troubled: HashSet<String> = nodes
            .iter()
            .filter(|n| readiness_taints(n).is_some() || has_no_execute_taint(n))
            .map(|n| n.name_any())
            .collect();
        let pods = if troubled.is_empty() {
            Vec::new()
        } else {
            pods.state()
        };
        let mut by_node: HashMap<&str, Vec<&Pod>> = HashMap::new();
        for pod in &pods {
            let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
            if let Some(node) = node.filter(|n| troubled.contains(*n)) {
                by_node.entry(node).or_default().push(pod);
            }
        }
        // Every node unreachable at once is more likely this controller
        // cut off than all nodes lost: no evictions then (Kubernetes'
        // full-disruption mode).
        let all_unready = !nodes.is_empty() && nodes.iter().all(|n| readiness_taints(n).is_some());
        let known: HashSet<String> = nodes.iter().map(|n| n.name_any()).collect();
        lifecycle.heard.retain(|name, _| known.contains(name));
        for node in &nodes {
            let name = node.name_any();
            let renewed = leases.get(&name).copied();
            let on_node = by_node.get(name.as_str()).map_or(&[][..], Vec::as_slice);
            let evictions = !all_unready;
            if let Err(error) = lifecycle
                .check(node, renewed, on_node, evictions, now)
                .await
            {
                tracing::warn!(%error, node = %name, "node lifecycle; retrying");
            }
        }
        // Forget evictions of pods that are gone (or no longer on a
        // troubled node).
        let present: HashSet<String> = by_node.values().flatten().filter_map(|p| p.uid()).collect();
        lifecycle.evicted.retain(|uid| present.contains(uid));
        // The next look: in a period, or as a node's grace period runs
        // out if that is sooner (losing a node costs the grace period,
        // not a period more).
        let next = lifecycle
            .heard
            .values()
            .map(|(_, seen)| *seen + lifecycle.config.grace_period)
            .filter(|due| *due > Instant::now())
            .min()
            .map_or(PERIOD, |due| (due - Instant::now()).min(PERIOD));
        let next = if std::mem::take(&mut lifecycle.follow_up) {
            next.min(FOLLOW_UP)
        } else {
            next
        };
        tokio::time::sleep(next + Duration::from_millis(5)).await;
    }
}

/// Per Lease: its last renewal time and when that arrived here.
type Arrivals = Arc<parking_lot::Mutex<HashMap<String, (Option<jiff::Timestamp>, Instant)>>>;

struct Lifecycle {
    client: Client,
    config: Config,
    events: events::Recorder,
    /// Pods deleted by eviction (not asked twice).
    evicted: HashSet<String>,
    /// Per node: the last sign of life it wrote (Lease renewal, heartbeat)
    /// and when this controller saw it change, on its own clock: a node
    /// whose clock is off is judged by when its signs arrive, not by the
    /// times it writes (as Kubernetes' `nodeHealthMap`). A node first
    /// seen gets the whole grace period from then (a restarted control
    /// plane does not find every node silent at once).
    heard: HashMap<String, (Option<jiff::Timestamp>, Instant)>,
    arrivals: Arrivals,
    /// A node just turned Unknown: look again as soon as the cache shows it.
    follow_up: bool,
}

fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// When the node's agent last said it was alive: its Lease, its Ready
/// condition's heartbeat, else when the Node was made.
fn last_heard(node: &Node, renewed: Option<jiff::Timestamp>) -> Option<jiff::Timestamp> {
    let heartbeat = condition(node, "Ready")
        .and_then(|c| c.last_heartbeat_time.as_ref())
        .map(|t| t.0);
    let created = node.metadata.creation_timestamp.as_ref().map(|t| t.0);
    [renewed, heartbeat].into_iter().flatten().max().or(created)
}

fn has_no_execute_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.effect == "NoExecute"))
}

/// The taint a node's readiness calls for: none while it is Ready, or
/// before it ever reported (it has its grace period to do so).
pub fn readiness_taints(node: &Node) -> Option<&'static str> {
    match condition(node, "Ready").map(|c| c.status.as_str()) {
        Some("False") => Some(NOT_READY),
        Some("Unknown") => Some(UNREACHABLE),
        _ => None,
    }
}

impl Lifecycle {
    async fn check(
        &mut self,
        node: &Node,
        renewed: Option<jiff::Timestamp>,
        on_node: &[&Pod],
        evictions: bool,
        now: jiff::Timestamp,
    ) -> Result<(), kube::Error> {
        let name = node.name_any();
        let sign = last_heard(node, renewed);
        // The renewal's arrival when the sign is that renewal; else now.
        let seen = self
            .arrivals
            .lock()
            .get(&name)
            .filter(|(lease, _)| lease.is_some() && *lease == sign)
            .map_or_else(Instant::now, |(_, at)| *at);
        let entry = self.heard.entry(name.clone()).or_insert((sign, seen));
        if entry.0 != sign {
            *entry = (sign, seen);
        }
        let silent = entry.1.elapsed() >= self.config.grace_period;
        let ready = condition(node, "Ready").map(|c| c.status.as_str());
        if silent && ready != Some("Unknown") {
            self.mark_unknown(node, now).await?;
            // The next look, at once, sees the Node as written: its pods
            // are marked not Ready and its taints set then.
            self.follow_up = true;
            return Ok(());
        }
        self.set_taints(node, now).await?;
        if matches!(ready, Some("Unknown" | "False")) {
            for pod in on_node {
                self.mark_not_ready(pod).await?;
            }
        }
        if !evictions {
            return Ok(());
        }
        let taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        for pod in on_node.iter().copied() {
            if let Some(due) = eviction_due(pod, &taints, now) {
                if due && pod.metadata.deletion_timestamp.is_none() {
                    self.evict(pod, &name).await?;
                }
            }
        }
        Ok(())
    }

    /// Every condition the agent reports turns Unknown (kept times for
    /// the heartbeat, a new transition time).
    async fn mark_unknown(&self, node: &Node, now: jiff::Timestamp) -> Result<(), kube::Error> {
        let name = node.name_any();
        let mut updated = node.clone();
        let status = updated.status.get_or_insert_with(Default::default);
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        for type_ in CONDITIONS {
            let never = !conditions.iter().any(|c| c.type_ == type_);
            let (reason, message) = if never {
                (
                    "NodeStatusNeverUpdated",
                    "Kubelet never posted node status.",
                )
            } else {
                ("NodeStatusUnknown", "Kubelet stopped posting node status.")
            };
            let fresh = NodeCondition {
                type_: type_.to_owned(),
                status: "Unknown".into(),
                reason: Some(reason.into()),
                message: Some(message.into()),
                last_heartbeat_time: None,
                last_transition_time: Some(Time(now)),
            };
            match conditions.iter_mut().find(|c| c.type_ == type_) {
                Some(existing) => {
                    existing.status = fresh.status;
                    existing.reason = fresh.reason;
                    existing.message = fresh.message;
                    existing.last_transition_time = fresh.last_transition_time;
                }
                None => conditions.push(fresh),
            }
        }
        let api = Api::<Node>::all(self.client.clone());
        match api
            .replace_status(&name, &PostParams::default(), &updated)
            .await
        {
            Ok(_) => {
                tracing::warn!(node = %name, "node stopped reporting: its conditions are Unknown");
                self.node_event(
                    node,
                    "NodeNotReady",
                    &format!("Node {name} status is now: NodeNotReady"),
                )
                .await;
                Ok(())
            }
            // Changed meanwhile (the agent came back): looked at again next.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// `not-ready`/`unreachable` taints, `NoSchedule` and `NoExecute`, as
    /// the node's Ready condition calls for; other taints are kept.
    async fn set_taints(&self, node: &Node, now: jiff::Timestamp) -> Result<(), kube::Error> {
        let current: Vec<Taint> = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        let wanted = readiness_taints(node);
        let ours = |t: &Taint| t.key == UNREACHABLE || t.key == NOT_READY;
        let mut taints: Vec<Taint> = current.iter().filter(|t| !ours(t)).cloned().collect();
        if let Some(key) = wanted {
            for effect in ["NoSchedule", "NoExecute"] {
                let kept = current.iter().find(|t| t.key == key && t.effect == effect);
                taints.push(kept.cloned().unwrap_or_else(|| Taint {
                    key: key.to_owned(),
                    effect: effect.to_owned(),
                    time_added: (effect == "NoExecute").then_some(Time(now)),
                    value: None,
                }));
            }
        }
        if taints == current {
            return Ok(());
        }
        let api = Api::<Node>::all(self.client.clone());
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": node.resource_version()},
            "spec": {"taints": taints},
        });
        match api
            .patch(
                &node.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// The pod's Ready condition False (it leaves the EndpointSlices).
    async fn mark_not_ready(&self, pod: &Pod) -> Result<(), kube::Error> {
        let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
        let ready = conditions.and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
        if ready.is_none_or(|c| c.status == "False") {
            return Ok(());
        }
        let patch = serde_json::json!({
            "metadata": {"uid": pod.uid()},
            "status": {"conditions": [{
                "type": "Ready",
                "status": "False",
                "lastTransitionTime": jiff::Timestamp::now().to_string(),
            }]},
        });
        let api = Api::<Pod>::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        match api
            .patch_status(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
            Err(error) => Err(error),
        }
    }

    async fn evict(&mut self, pod: &Pod, node: &str) -> Result<(), kube::Error> {
        let Some(uid) = pod.uid() else {
            return Ok(());
        };
        if !self.evicted.insert(uid.clone()) {
            return Ok(());
        }
        let (namespace, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        let api = Api::<Pod>::namespaced(self.client.clone(), &namespace);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
            Err(error) => {
                self.evicted.remove(&uid);
                return Err(error);
            }
        }
        tracing::info!(pod = %format!("{namespace}/{name}"), %node, "evicted from a node that is not ready");
        let message = format!("Marking for deletion Pod {namespace}/{name}");
        self.events
            .record(
                &pod.object_ref(&()),
                "Normal",
                "TaintManagerEviction",
                &message,
            )
            .await;
        Ok(())
    }

    async fn node_event(&self, node: &Node, reason: &str, message: &str) {
        self.events
            .record(&node.object_ref(&()), "Normal", reason, message)
            .await;
    }
}

/// Whether a toleration covers a taint (the key, the value when the
/// operator is `Equal`, the effect when it names one).
pub(crate) fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect_ok = toleration
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key_ok = match toleration.key.as_deref() {
        None | Some("") => toleration.operator.as_deref() == Some("Exists"),
        Some(key) => key == taint.key,
    };
    let value_ok = match toleration.operator.as_deref() {
        Some("Exists") => true,
        _ => toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
    };
    effect_ok && key_ok && value_ok
}

/// For a pod on a node with `NoExecute` taints: whether its eviction is due
/// now (`None`: there are none, or it tolerates them for ever).
fn eviction_due(pod: &Pod, taints: &[Taint], now: jiff::Timestamp) -> Option<bool> {
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    let mut due: Option<bool> = None;
    for taint in taints.iter().filter(|t| t.effect == "NoExecute") {
        let matching: Vec<&Toleration> =
            tolerations.iter().filter(|t| tolerates(t, taint)).collect();
        if matching.is_empty() {
            return Some(true);
        }
        // The shortest toleration counts; none with seconds: for ever.
        let Some(seconds) = matching.iter().filter_map(|t| t.toleration_seconds).min() else {
            continue;
        };
        let since = taint.time_added.as_ref().map_or(now, |t| t.0);
        let waited = (now - since).total(jiff::Unit::Second).unwrap_or(0.0);
        let this = waited >= seconds.max(0) as f64;
        due = Some(due.unwrap_or(false) || this);
    }
    due
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, seconds_ago: i64, now: jiff::Timestamp) -> Taint {
        Taint {
            key: key.into(),
            effect: "NoExecute".into(),
            time_added: Some(Time(now - jiff::SignedDuration::from_secs(seconds_ago))),
            value: None,
        }
    }

    fn pod_tolerating(tolerations: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c"}], "tolerations": tolerations},
        }))
        .unwrap()
    }

    #[test]
    fn eviction_waits_for_the_toleration() {
        let now = jiff::Timestamp::now();
        let tolerant = pod_tolerating(serde_json::json!([
            {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
        ]));
        assert_eq!(
            eviction_due(&tolerant, &[taint(UNREACHABLE, 10, now)], now),
            Some(false)
        );
        assert_eq!(
            eviction_due(&tolerant, &[taint(UNREACHABLE, 301, now)], now),
            Some(true)
        );
        // Another NoExecute taint it does not tolerate: now.
        assert_eq!(
            eviction_due(&tolerant, &[taint(NOT_READY, 0, now)], now),
            Some(true)
        );
        let forever = pod_tolerating(serde_json::json!([{"operator": "Exists"}]));
        assert_eq!(
            eviction_due(&forever, &[taint(UNREACHABLE, 10_000, now)], now),
            None
        );
        assert_eq!(eviction_due(&tolerant, &[], now), None);
    }

    #[test]
    fn readiness_calls_for_taints() {
        let node = |status: Option<&str>| -> Node {
            let conditions = status.map(|s| serde_json::json!([{"type": "Ready", "status": s}]));
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}, "status": {"conditions": conditions}})).unwrap()
        };
        assert_eq!(readiness_taints(&node(Some("True"))), None);
        assert_eq!(readiness_taints(&node(Some("False"))), Some(NOT_READY));
        assert_eq!(readiness_taints(&node(Some("Unknown"))), Some(UNREACHABLE));
        assert_eq!(
            readiness_taints(&node(None)),
            None,
            "not before it reported"
        );
    }

    #[test]
    fn a_node_is_heard_by_its_lease_or_its_heartbeat() {
        let now = jiff::Timestamp::now();
        let earlier = now - jiff::SignedDuration::from_secs(100);
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n", "creationTimestamp": earlier.to_string()},
            "status": {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": earlier.to_string()}]},
        }))
        .unwrap();
        assert_eq!(last_heard(&node, Some(now)), Some(now));
        assert_eq!(
            last_heard(&node, None).map(|t| t.as_second()),
            Some(earlier.as_second())
        );
    }
}
