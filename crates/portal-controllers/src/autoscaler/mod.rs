//! The HorizontalPodAutoscaler controller (`autoscaling/v2`), as
//! kube-controller-manager's: every [`SYNC_PERIOD`] each autoscaler reads
//! its target's `scale` subresource (any kind that has one: Deployments,
//! ReplicaSets, StatefulSets, ReplicationControllers, custom resources),
//! the target's pods (by the scale's selector) and their usage from
//! `metrics.k8s.io`, computes a count per resource metric ([`replicas`]),
//! takes the largest, applies `spec.behavior` ([`behavior`]) and the
//! bounds, scales the target if the count changed (an Event says why) and
//! writes the status: current and desired replicas, each metric's current
//! value, and the `AbleToScale`, `ScalingActive` and `ScalingLimited`
//! conditions with upstream's reasons. Resource metrics only (CPU and
//! memory, per pod or per container); Pods, Object and External metrics
//! need a custom metrics API, which Portal does not serve: such an
//! autoscaler says so in `ScalingActive`.

mod behavior;
mod replicas;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::autoscaling::v2::{
    HorizontalPodAutoscaler, HorizontalPodAutoscalerCondition, HorizontalPodAutoscalerStatus,
    MetricSpec, MetricStatus, MetricValueStatus, ResourceMetricStatus,
};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use portal_api::selector::LabelSelector;

use crate::events;
use replicas::{Group, PodSample, Target};

pub use crate::ReconcileError as Error;

const COMPONENT: &str = "horizontal-pod-autoscaler";

/// How often every autoscaler is looked at
/// (`--horizontal-pod-autoscaler-sync-period`).
pub const SYNC_PERIOD: Duration = Duration::from_secs(15);

/// A pod's CPU is not trusted this long after it started unless it was
/// ready throughout (`--horizontal-pod-autoscaler-cpu-initialization-period`).
const CPU_INITIALIZATION: Duration = Duration::from_secs(300);

/// A history not looked at for this long belongs to a deleted autoscaler.
const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// Readiness changes this soon after start are the first readiness, not
/// a pod going unready (`…-initial-readiness-delay`).
const INITIAL_READINESS_DELAY: Duration = Duration::from_secs(30);

struct Context {
    client: Client,
    pods: Store<Pod>,
    events: events::Recorder,
    retries: crate::Retries,
    /// Each autoscaler's recommendations and scalings, by UID (a new
    /// autoscaler of the same name starts afresh).
    histories: Mutex<HashMap<String, behavior::History>>,
    /// Targets' API resources by (apiVersion, kind), found by discovery.
    resources: Mutex<HashMap<(String, String), ApiResource>>,
}

/// Runs the controller until the process ends.
pub async fn run(client: Client, pods: Store<Pod>) {
    let context = Arc::new(Context {
        client: client.clone(),
        pods,
        events: events::Recorder::new(client.clone(), COMPONENT),
        retries: crate::Retries::new(Duration::from_secs(1)),
        histories: Mutex::default(),
        resources: Mutex::default(),
    });
    let controller = Controller::new(
        Api::<HorizontalPodAutoscaler>::all(client),
        watcher::Config::default(),
    )
    .with_config(crate::config());
    crate::drive(
        controller.run(reconcile, error_policy, context.clone()),
        COMPONENT,
        &context.retries,
    )
    .await;
}

fn error_policy(hpa: Arc<HorizontalPodAutoscaler>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::debug!(%error, name = %hpa.name_any(), "autoscaler sync failed; retrying");
    Action::requeue(ctx.retries.after_failure(hpa.as_ref()))
}

/// What one sync found, for the status.
struct Outcome {
    desired: i32,
    metrics: Vec<MetricStatus>,
    conditions: Vec<(&'static str, bool, &'static str, String)>,
    scaled: bool,
}

async fn reconcile(hpa: Arc<HorizontalPodAutoscaler>, ctx: Arc<Context>) -> Result<Action, Error> {
    if hpa.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    ctx.pods.wait_until_ready().await?;
    let namespace = hpa.namespace().unwrap_or_default();
    let spec = hpa.spec.clone().unwrap_or_default();
    let target = &spec.scale_target_ref;
    let this = reference(&hpa);
    let resource = match resolve(
        &ctx,
        target.api_version.as_deref().unwrap_or(""),
        &target.kind,
    )
    .await
    {
        Ok(resource) => resource,
        Err(message) => {
            return failed_scale(&ctx, &hpa, &this, "FailedGetScale", message).await;
        }
    };
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &namespace, &resource);
    let mut scale = match api.get_scale(&target.name).await {
        Ok(scale) => scale,
        Err(error) => {
            let message =
                format!("the HPA controller was unable to get the target's current scale: {error}");
            return failed_scale(&ctx, &hpa, &this, "FailedGetScale", message).await;
        }
    };
    let current = scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
    let observed = scale.status.as_ref().map_or(0, |s| s.replicas);
    let min = spec.min_replicas.unwrap_or(1);
    let uid = hpa.metadata.uid.clone().unwrap_or_default();
    let now = Instant::now();
    {
        let mut histories = ctx.histories.lock();
        histories.retain(|_, h| now.duration_since(h.seen) < FORGET_AFTER);
        let history = histories
            .entry(uid.clone())
            .or_insert_with(|| behavior::History::starting_at(now, current));
        history.seen = now;
        // Woken by its own status write (or another change that is not the
        // spec's) before the period is up: wait for the period.
        let unchanged = hpa.metadata.generation.is_some()
            && hpa.metadata.generation == hpa.status.as_ref().and_then(|s| s.observed_generation);
        if let Some(synced) = history.synced.filter(|_| unchanged) {
            let since = now.duration_since(synced);
            if since < SYNC_PERIOD {
                return Ok(Action::requeue(SYNC_PERIOD - since));
            }
        }
        history.synced = Some(now);
    }
    let outcome = if current > spec.max_replicas || (current < min && current != 0) {
        // Out of bounds: back within them first, whatever the metrics say.
        let desired = current.clamp(min, spec.max_replicas);
        let (reason, why) = if current > spec.max_replicas {
            (
                "TooManyReplicas",
                "Current number of replicas above Spec.MaxReplicas",
            )
        } else {
            (
                "TooFewReplicas",
                "Current number of replicas below Spec.MinReplicas",
            )
        };
        let mut conditions = vec![
            got_scale(),
            ("ScalingLimited", true, reason, why.to_owned()),
        ];
        let scaled = rescale(
            &ctx,
            &api,
            &target.name,
            &mut scale,
            &this,
            &uid,
            (current, desired),
            why,
            &mut conditions,
        )
        .await;
        Outcome {
            desired,
            metrics: Vec::new(),
            conditions,
            scaled,
        }
    } else if current == 0 && min != 0 {
        Outcome {
            desired: 0,
            metrics: Vec::new(),
            conditions: vec![
                got_scale(),
                (
                    "ScalingActive",
                    false,
                    "ScalingDisabled",
                    "scaling is disabled since the replica count of the target is zero".into(),
                ),
            ],
            scaled: false,
        }
    } else {
        let selector = scale
            .status
            .as_ref()
            .and_then(|s| s.selector.clone())
            .unwrap_or_default();
        let computed = compute(
            &ctx,
            &namespace,
            &selector,
            &spec.metrics.clone().unwrap_or_else(default_metrics),
            current,
        )
        .await;
        let mut conditions = vec![got_scale()];
        match computed {
            Err((reason, message)) => {
                ctx.events.record(&this, "Warning", reason, &message).await;
                conditions.push((
                    "ScalingActive",
                    false,
                    reason,
                    format!("the HPA was unable to compute the replica count: {message}"),
                ));
                Outcome {
                    desired: current,
                    metrics: Vec::new(),
                    conditions,
                    scaled: false,
                }
            }
            Ok((recommended, metrics, about)) => {
                let rules = behavior::rules(spec.behavior.as_ref());
                let (desired, limit) = ctx
                    .histories
                    .lock()
                    .entry(uid.clone())
                    .or_insert_with(|| behavior::History::starting_at(now, current))
                    .normalize(now, current, recommended, &rules, (min, spec.max_replicas));
                conditions.push((
                    "ScalingActive",
                    true,
                    "ValidMetricFound",
                    format!(
                        "the HPA was able to successfully calculate a replica count from {about}"
                    ),
                ));
                conditions.push(limited(limit));
                let scaled = if desired == current {
                    conditions[0] = (
                        "AbleToScale",
                        true,
                        "ReadyForNewScale",
                        "recommended size matches current size".into(),
                    );
                    false
                } else {
                    let why = if desired > current {
                        format!("{about} above target")
                    } else {
                        "All metrics below target".into()
                    };
                    rescale(
                        &ctx,
                        &api,
                        &target.name,
                        &mut scale,
                        &this,
                        &uid,
                        (current, desired),
                        &why,
                        &mut conditions,
                    )
                    .await
                };
                Outcome {
                    desired,
                    metrics,
                    conditions,
                    scaled,
                }
            }
        }
    };
    write_status(&ctx, &hpa, observed, outcome).await?;
    Ok(Action::requeue(SYNC_PERIOD))
}

/// Sets the target's replicas (`from`, `to`); whether it took. The Event
/// and the `AbleToScale` condition (first in `conditions`) say how it went.
#[allow(clippy::too_many_arguments)]
async fn rescale(
    ctx: &Context,
    api: &Api<DynamicObject>,
    name: &str,
    scale: &mut k8s_openapi::api::autoscaling::v1::Scale,
    this: &ObjectReference,
    uid: &str,
    (from, to): (i32, i32),
    why: &str,
    conditions: &mut [(&'static str, bool, &'static str, String)],
) -> bool {
    if let Some(scale_spec) = scale.spec.as_mut() {
        scale_spec.replicas = Some(to);
    }
    match api
        .replace_scale(name, &PostParams::default(), &*scale)
        .await
    {
        Ok(_) => {
            if let Some(history) = ctx.histories.lock().get_mut(uid) {
                history.scaled(Instant::now(), from, to);
            }
            let message = format!("New size: {to}; reason: {why}");
            ctx.events
                .record(this, "Normal", "SuccessfulRescale", &message)
                .await;
            conditions[0] = (
                "AbleToScale",
                true,
                "SucceededRescale",
                format!("the HPA controller was able to update the target scale to {to}"),
            );
            true
        }
        Err(error) => {
            let message = format!("can't scale {name} to {to}: {error}");
            ctx.events
                .record(this, "Warning", "FailedRescale", &message)
                .await;
            conditions[0] = (
                "AbleToScale",
                false,
                "FailedUpdateScale",
                format!("the HPA controller was unable to update the target scale: {error}"),
            );
            false
        }
    }
}

/// `AbleToScale` once the target's scale was read (a rescale below
/// replaces it with how that went).
fn got_scale() -> (&'static str, bool, &'static str, String) {
    (
        "AbleToScale",
        true,
        "SucceededGetScale",
        "the HPA controller was able to get the target's current scale".into(),
    )
}

/// CPU at 80% of requests: what an autoscaler without metrics means.
fn default_metrics() -> Vec<MetricSpec> {
    serde_json::from_value(serde_json::json!([{
        "type": "Resource",
        "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}
    }]))
    .unwrap_or_default()
}

fn limited(limit: behavior::Limited) -> (&'static str, bool, &'static str, String) {
    use behavior::Limited;
    match limit {
        Limited::None => (
            "ScalingLimited",
            false,
            "DesiredWithinRange",
            "the desired count is within the acceptable range".into(),
        ),
        Limited::TooFewReplicas => (
            "ScalingLimited",
            true,
            "TooFewReplicas",
            "the desired replica count is less than the minimum replica count".into(),
        ),
        Limited::TooManyReplicas => (
            "ScalingLimited",
            true,
            "TooManyReplicas",
            "the desired replica count is more than the maximum replica count".into(),
        ),
        Limited::ScaleUpLimit => (
            "ScalingLimited",
            true,
            "ScaleUpLimit",
            "the desired replica count is increasing faster than the maximum scale rate".into(),
        ),
        Limited::ScaleDownLimit => (
            "ScalingLimited",
            true,
            "ScaleDownLimit",
            "the desired replica count is decreasing faster than the maximum scale rate".into(),
        ),
    }
}

/// The count every metric asks for (the largest wins), each metric's
/// current value, and what decided it (for messages); or the failure's
/// reason and message.
async fn compute(
    ctx: &Context,
    namespace: &str,
    selector: &str,
    metrics: &[MetricSpec],
    current: i32,
) -> Result<(i32, Vec<MetricStatus>, String), (&'static str, String)> {
    let parsed = LabelSelector::parse(selector).map_err(|e| {
        (
            "InvalidSelector",
            format!("couldn't convert selector into a corresponding internal selector object: {e}"),
        )
    })?;
    if selector.is_empty() {
        return Err((
            "InvalidSelector",
            "the target's scale has no selector".into(),
        ));
    }
    let pods: Vec<Arc<Pod>> = ctx
        .pods
        .state()
        .into_iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
        .filter(|p| parsed.matches(|key| p.labels().get(key).map(String::as_str)))
        .collect();
    let usage = pod_usage(ctx, namespace, selector).await?;
    let mut best: Option<(i32, String)> = None;
    let mut statuses = Vec::new();
    let mut failures: Vec<(&'static str, String)> = Vec::new();
    for metric in metrics {
        match one_metric(metric, &pods, &usage, current) {
            Ok((recommendation, status, about)) => {
                statuses.push(status);
                if best.as_ref().is_none_or(|(r, _)| recommendation > *r) {
                    best = Some((recommendation, about));
                }
            }
            Err(failure) => failures.push(failure),
        }
    }
    // As upstream: a failed metric stops a scale-down (it might have
    // asked for more) but not what the others found otherwise.
    match (&best, failures.first()) {
        (None, Some(failure)) => return Err(failure.clone()),
        (Some((replicas, _)), Some(failure)) if *replicas < current => return Err(failure.clone()),
        _ => {}
    }
    let (replicas, about) = best.ok_or(("FailedGetResourceMetric", "no metrics".to_owned()))?;
    Ok((replicas, statuses, about))
}

/// One metric's count, current value and what it is about (for messages).
fn one_metric(
    metric: &MetricSpec,
    pods: &[Arc<Pod>],
    usage: &HashMap<String, PodUsage>,
    current: i32,
) -> Result<(i32, MetricStatus, String), (&'static str, String)> {
    let (resource, container, target) = match (metric.type_.as_str(), &metric.resource, &metric.container_resource) {
        ("Resource", Some(r), _) => (r.name.clone(), None, r.target.clone()),
        ("ContainerResource", _, Some(c)) => (c.name.clone(), Some(c.container.clone()), c.target.clone()),
        (other, ..) => {
            return Err((
                "FailedGetExternalMetric",
                format!("{other} metrics need a custom or external metrics API, which this cluster does not serve"),
            ))
        }
    };
    let goal = match (
        target.type_.as_str(),
        target.average_utilization,
        &target.average_value,
    ) {
        ("Utilization", Some(percent), _) => Target::Utilization(i64::from(percent)),
        ("AverageValue", _, Some(value)) => {
            Target::AverageValue(amount(&resource, &value.0).ok_or_else(|| {
                (
                    "FailedGetResourceMetric",
                    format!("invalid target value {}", value.0),
                )
            })?)
        }
        _ => {
            return Err((
                "FailedGetResourceMetric",
                format!("invalid target for {resource}"),
            ))
        }
    };
    let samples: Vec<PodSample> = pods
        .iter()
        .map(|pod| sample(pod, &resource, container.as_deref(), usage))
        .collect();
    let recommendation = replicas::replicas(current, &samples, goal).map_err(|message| {
        (
            "FailedGetResourceMetric",
            format!("failed to get {resource} utilization: {message}"),
        )
    })?;
    let about = match (goal, &container) {
        (Target::Utilization(_), None) => {
            format!("{resource} resource utilization (percentage of request)")
        }
        (Target::Utilization(_), Some(c)) => {
            format!("{resource} container resource utilization (percentage of request) of {c}")
        }
        (Target::AverageValue(_), _) => format!("{resource} resource"),
    };
    let value = MetricValueStatus {
        average_utilization: recommendation
            .utilization
            .and_then(|u| i32::try_from(u).ok()),
        average_value: Some(Quantity(quantity(&resource, recommendation.average))),
        value: None,
    };
    let status = match &container {
        None => MetricStatus {
            type_: "Resource".into(),
            resource: Some(ResourceMetricStatus {
                name: resource.clone(),
                current: value,
            }),
            ..MetricStatus::default()
        },
        Some(c) => MetricStatus {
            type_: "ContainerResource".into(),
            container_resource: Some(
                k8s_openapi::api::autoscaling::v2::ContainerResourceMetricStatus {
                    name: resource.clone(),
                    container: c.clone(),
                    current: value,
                },
            ),
            ..MetricStatus::default()
        },
    };
    Ok((recommendation.replicas, status, about))
}

/// A pod's usage from the metrics API: per container, each resource.
struct PodUsage {
    containers: BTreeMap<String, (i64, i64)>,
    timestamp: Option<jiff::Timestamp>,
    window: Duration,
}

async fn pod_usage(
    ctx: &Context,
    namespace: &str,
    selector: &str,
) -> Result<HashMap<String, PodUsage>, (&'static str, String)> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("metrics.k8s.io", "v1beta1", "PodMetrics"),
        "pods",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), namespace, &resource);
    let listed = api
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|e| {
            (
                "FailedGetResourceMetric",
                format!("unable to get metrics for the pods (from the resource metrics API): {e}"),
            )
        })?;
    Ok(listed
        .items
        .into_iter()
        .map(|item| {
            let containers = item.data["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    let usage = &c["usage"];
                    (
                        c["name"].as_str().unwrap_or("").to_owned(),
                        (
                            usage["cpu"]
                                .as_str()
                                .and_then(portal_api::quantity::millicores)
                                .unwrap_or(0),
                            usage["memory"]
                                .as_str()
                                .and_then(portal_api::quantity::bytes)
                                .unwrap_or(0),
                        ),
                    )
                })
                .collect();
            let timestamp = item.data["timestamp"].as_str().and_then(|t| t.parse().ok());
            let window = item.data["window"]
                .as_str()
                .and_then(|w| w.strip_suffix('s'))
                .and_then(|w| w.parse::<f64>().ok())
                .map_or(Duration::ZERO, Duration::from_secs_f64);
            (
                item.name_any(),
                PodUsage {
                    containers,
                    timestamp,
                    window,
                },
            )
        })
        .collect())
}

/// A resource amount in the calculator's unit: millicores for CPU, the
/// plain value (bytes) otherwise.
fn amount(resource: &str, text: &str) -> Option<i64> {
    if resource == "cpu" {
        portal_api::quantity::millicores(text)
    } else {
        portal_api::quantity::bytes(text)
    }
}

fn quantity(resource: &str, value: i64) -> String {
    if resource == "cpu" {
        format!("{value}m")
    } else {
        value.to_string()
    }
}

/// What the calculator needs of one pod for `resource` (one container's
/// share with `container`).
fn sample(
    pod: &Pod,
    resource: &str,
    container: Option<&str>,
    usage: &HashMap<String, PodUsage>,
) -> PodSample {
    let name = pod.name_any();
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let mut request = Some(0i64);
    for c in containers
        .iter()
        .filter(|c| container.is_none_or(|name| c.name == name))
    {
        let asked = c
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(resource))
            .and_then(|q| amount(resource, &q.0));
        request = match (request, asked) {
            (Some(sum), Some(value)) => Some(sum + value),
            _ => None,
        };
    }
    let metrics = usage.get(&name);
    // (A container the metrics do not list has no sample: the pod's
    // usage is missing, not zero.)
    let used = metrics.and_then(|m| {
        if container.is_some_and(|name| !m.containers.contains_key(name)) {
            return None;
        }
        Some(
            m.containers
                .iter()
                .filter(|(c, _)| container.is_none_or(|name| c.as_str() == name))
                .map(|(_, (cpu, memory))| if resource == "cpu" { *cpu } else { *memory })
                .sum(),
        )
    });
    PodSample {
        group: group(pod, resource, metrics),
        usage: used,
        request,
        name,
    }
}

/// How a pod counts (upstream's `groupPods`): deleted and failed pods not
/// at all, pending ones as unready; for CPU, a pod that just started
/// counts once it was ready for a whole sample window.
fn group(pod: &Pod, resource: &str, metrics: Option<&PodUsage>) -> Group {
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("");
    if pod.metadata.deletion_timestamp.is_some() || phase == "Failed" {
        return Group::Ignored;
    }
    if phase == "Pending" {
        return Group::Unready;
    }
    let Some(metrics) = metrics else {
        return Group::Ready; // missing metrics, handled as such
    };
    if resource != "cpu" {
        return Group::Ready;
    }
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    let started = status.and_then(|s| s.start_time.as_ref());
    let (Some(ready), Some(started)) = (ready, started) else {
        return Group::Unready;
    };
    let now = jiff::Timestamp::now();
    let started = started.0;
    let transition = ready.last_transition_time.as_ref().map_or(started, |t| t.0);
    let plus = |t: jiff::Timestamp, d: Duration| {
        t.checked_add(jiff::SignedDuration::try_from(d).unwrap_or_default())
            .unwrap_or(t)
    };
    let unready = if plus(started, CPU_INITIALIZATION) > now {
        ready.status == "False"
            || metrics
                .timestamp
                .is_none_or(|sampled| sampled < plus(transition, metrics.window))
    } else {
        ready.status == "False" && plus(started, INITIAL_READINESS_DELAY) > transition
    };
    if unready {
        Group::Unready
    } else {
        Group::Ready
    }
}

/// Resolves a target's kind to its resource (plural) by discovery, once.
async fn resolve(ctx: &Context, api_version: &str, kind: &str) -> Result<ApiResource, String> {
    let key = (api_version.to_owned(), kind.to_owned());
    if let Some(found) = ctx.resources.lock().get(&key) {
        return Ok(found.clone());
    }
    let (group, version) = match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    };
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, _) = kube::discovery::pinned_kind(&ctx.client, &gvk)
        .await
        .map_err(|e| format!("the HPA controller was unable to get the target's current scale: no matches for kind \"{kind}\" in group \"{group}\": {e}"))?;
    ctx.resources.lock().insert(key, resource.clone());
    Ok(resource)
}

fn reference(hpa: &HorizontalPodAutoscaler) -> ObjectReference {
    ObjectReference {
        api_version: Some("autoscaling/v2".into()),
        kind: Some("HorizontalPodAutoscaler".into()),
        name: hpa.metadata.name.clone(),
        namespace: hpa.metadata.namespace.clone(),
        uid: hpa.metadata.uid.clone(),
        resource_version: hpa.metadata.resource_version.clone(),
        ..ObjectReference::default()
    }
}

/// The target cannot be read: say so and look again next period.
async fn failed_scale(
    ctx: &Context,
    hpa: &HorizontalPodAutoscaler,
    this: &ObjectReference,
    reason: &'static str,
    message: String,
) -> Result<Action, Error> {
    ctx.events.record(this, "Warning", reason, &message).await;
    let observed = hpa
        .status
        .as_ref()
        .and_then(|s| s.current_replicas)
        .unwrap_or(0);
    let outcome = Outcome {
        desired: hpa.status.as_ref().map_or(0, |s| s.desired_replicas),
        metrics: Vec::new(),
        conditions: vec![("AbleToScale", false, reason, message)],
        scaled: false,
    };
    write_status(ctx, hpa, observed, outcome).await?;
    Ok(Action::requeue(SYNC_PERIOD))
}

async fn write_status(
    ctx: &Context,
    hpa: &HorizontalPodAutoscaler,
    observed: i32,
    outcome: Outcome,
) -> Result<(), Error> {
    let old = hpa.status.clone().unwrap_or_default();
    let now = Time(jiff::Timestamp::now());
    let mut conditions = old.conditions.clone().unwrap_or_default();
    for (type_, status, reason, message) in outcome.conditions {
        let status = if status { "True" } else { "False" }.to_owned();
        match conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(existing) => {
                if existing.status != status {
                    existing.last_transition_time = Some(now.clone());
                }
                existing.status = status;
                existing.reason = Some(reason.into());
                existing.message = Some(message);
            }
            None => conditions.push(HorizontalPodAutoscalerCondition {
                type_: type_.into(),
                status,
                reason: Some(reason.into()),
                message: Some(message),
                last_transition_time: Some(now.clone()),
            }),
        }
    }
    let status = HorizontalPodAutoscalerStatus {
        observed_generation: hpa.metadata.generation,
        current_replicas: Some(observed),
        desired_replicas: outcome.desired,
        current_metrics: (!outcome.metrics.is_empty()).then_some(outcome.metrics),
        conditions: Some(conditions),
        last_scale_time: if outcome.scaled {
            Some(now)
        } else {
            old.last_scale_time.clone()
        },
    };
    if hpa.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let api: Api<HorizontalPodAutoscaler> =
        Api::namespaced(ctx.client.clone(), &hpa.namespace().unwrap_or_default());
    let mut patch = serde_json::json!({"status": status});
    // A merge patch keeps what it leaves out: say "none" outright.
    if status.current_metrics.is_none() {
        patch["status"]["currentMetrics"] = serde_json::Value::Null;
    }
    api.patch_status(
        &hpa.name_any(),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}
