//! HorizontalPodAutoscalers at `autoscaling/v1`: the same objects as
//! `autoscaling/v2` (one store key, stored at v2), seen as Kubernetes
//! serves them to older clients — kubectl 1.20's `autoscale` posts this
//! version. v1 knows only a CPU utilization target; what v2 says beyond it
//! travels in annotations, as upstream's conversion carries it, so a v1
//! client's read-modify-write loses nothing:
//! - `autoscaling.alpha.kubernetes.io/metrics`: the other metrics, as v1
//!   `MetricSpec`s (`targetAverageUtilization`, `metricName`, …);
//! - `…/current-metrics`: every current metric, as v1 `MetricStatus`es;
//! - `…/conditions`: the status conditions;
//! - `…/behavior`: `spec.behavior`, with Go's field names (upstream
//!   marshals its internal type), read back whatever their case.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::horizontal_pod_autoscaler as v2;
use crate::schema::{
    openapi_schema, typed, Column, DecodeError, Decoded, Defined, Generation, ListStrategy,
    NameRule, Resource, ScalePaths,
};
use crate::Cause;

const METRICS: &str = "autoscaling.alpha.kubernetes.io/metrics";
const CURRENT_METRICS: &str = "autoscaling.alpha.kubernetes.io/current-metrics";
const CONDITIONS: &str = "autoscaling.alpha.kubernetes.io/conditions";
const BEHAVIOR: &str = "autoscaling.alpha.kubernetes.io/behavior";
/// v1's implicit target, made explicit at v2 (`DefaultCPUUtilization`).
const DEFAULT_CPU_UTILIZATION: i64 = 80;

pub static RESOURCE: Resource = Resource {
    group: v2::KIND.group,
    version: "v1",
    plural: "horizontalpodautoscalers",
    singular: "horizontalpodautoscaler",
    kind_name: v2::KIND.name,
    namespaced: true,
    short_names: &["hpa"],
    categories: &["all"],
    has_status: true,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::autoscaling::v1::HorizontalPodAutoscaler>,
    openapi_schema: openapi_schema::<k8s_openapi::api::autoscaling::v1::HorizontalPodAutoscaler>,
    defaults,
    validate,
    prepare_create,
    kept_on_update: &[],
    generation: Generation::Spec,
    create_on_update: false,
    selectable_fields: &[],
    field_paths: &[],
    field_defaults: &[],
    own_list_strategy: super::replace_lists,
    list_map_keys: &[],
    columns: Vec::new,
    cells: |_, _| Vec::new(),
    custom: Some(&VIEW),
    subresources: &[],
};

/// v1's own default (`SetDefaults_HorizontalPodAutoscaler`).
fn defaults(object: &mut Value) {
    if let Some(spec) = object.get_mut("spec").filter(|s| s.is_object()) {
        if spec.get("minReplicas").is_none() {
            spec["minReplicas"] = json!(1);
        }
    }
}

fn prepare_create(object: &mut Value) {
    object["status"] = json!({"currentReplicas": 0, "desiredReplicas": 0});
}

/// Upstream validates the internal form, whatever the version: so does
/// this, on the object as it will be stored.
fn validate(object: &Value, old: Option<&Value>) -> Vec<Cause> {
    let stored = |o: &Value| {
        let mut o = o.clone();
        to_v2(&mut o);
        o
    };
    (v2::RESOURCE.validate)(&stored(object), old.map(stored).as_ref())
}

#[derive(Debug)]
struct View;

static VIEW: View = View;

impl Defined for View {
    fn decode(&self, object: Value) -> Result<Decoded, DecodeError> {
        typed::<k8s_openapi::api::autoscaling::v1::HorizontalPodAutoscaler>(object)
    }

    fn defaults(&self, object: &mut Value) {
        defaults(object);
    }

    fn validate(&self, object: &Value, old: Option<&Value>) -> Vec<Cause> {
        validate(object, old)
    }

    // Tables read what the cache holds, the v2 form.
    fn columns(&self) -> Vec<Column> {
        (v2::RESOURCE.columns)()
    }

    fn cells(&self, object: &Value, now: i64) -> Vec<Value> {
        (v2::RESOURCE.cells)(object, now)
    }

    /// `Null`: the typed schema of the function hook serves.
    fn openapi_schema(&self) -> Value {
        Value::Null
    }

    fn list_strategy(&self, _path: &[&str]) -> ListStrategy {
        ListStrategy::Replace
    }

    fn list_map_keys(&self, _path: &[&str]) -> Option<&'static [&'static str]> {
        None
    }

    fn scale(&self) -> Option<&ScalePaths> {
        None
    }

    fn storage_version(&self) -> &'static str {
        "v2"
    }

    fn stored_as(&self) -> Option<&'static Resource> {
        Some(&v2::RESOURCE)
    }

    fn to_version(&self, _resource: &Resource, object: &mut Value) -> bool {
        if object["apiVersion"] == "autoscaling/v1" {
            return false;
        }
        to_v1(object);
        true
    }

    fn to_storage(&self, _resource: &Resource, object: &mut Value) {
        to_v2(object);
    }

    fn strategic_merge(&self) -> bool {
        true
    }

    fn user_defined(&self) -> bool {
        false
    }
}

/// A stored (v2) object as v1 shows it
/// (`Convert_autoscaling_HorizontalPodAutoscaler_To_v1_HorizontalPodAutoscaler`).
fn to_v1(object: &mut Value) {
    object["apiVersion"] = json!("autoscaling/v1");
    let spec = object["spec"].take();
    let status = object["status"].take();
    let mut annotations = take_round_trip_annotations(object).0;

    let metrics = spec["metrics"].as_array().cloned().unwrap_or_default();
    let is_cpu_utilization = |m: &Value| {
        m["type"] == "Resource"
            && m["resource"]["name"] == "cpu"
            && m["resource"]["target"]["averageUtilization"].is_i64()
    };
    let mut v1_spec = Map::new();
    v1_spec.insert("scaleTargetRef".into(), spec["scaleTargetRef"].clone());
    copy(&spec, &mut v1_spec, "minReplicas");
    copy(&spec, &mut v1_spec, "maxReplicas");
    if let Some(cpu) = metrics
        .iter()
        .find(|m| m["type"] == "Resource" && m["resource"]["name"] == "cpu")
        .filter(|m| is_cpu_utilization(m))
    {
        v1_spec.insert(
            "targetCPUUtilizationPercentage".into(),
            cpu["resource"]["target"]["averageUtilization"].clone(),
        );
    }
    let others: Vec<Value> = metrics
        .iter()
        .filter(|m| !is_cpu_utilization(m))
        .map(metric_spec_to_v1)
        .collect();
    if !others.is_empty() {
        annotations.insert(METRICS.into(), json!(Value::Array(others).to_string()));
    }
    if spec["behavior"].is_object() {
        annotations.insert(
            BEHAVIOR.into(),
            json!(behavior_to_go(&spec["behavior"]).to_string()),
        );
    }

    let mut v1_status = Map::new();
    for field in [
        "observedGeneration",
        "lastScaleTime",
        "currentReplicas",
        "desiredReplicas",
    ] {
        copy(&status, &mut v1_status, field);
    }
    v1_status.entry("desiredReplicas").or_insert(json!(0));
    let current = status["currentMetrics"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for metric in &current {
        let resource = &metric["resource"];
        if metric["type"] == "Resource" && resource["name"] == "cpu" {
            if let Some(utilization) = resource["current"]["averageUtilization"].as_i64() {
                v1_status.insert("currentCPUUtilizationPercentage".into(), json!(utilization));
            }
        }
    }
    if !current.is_empty() {
        let v1: Vec<Value> = current.iter().map(metric_status_to_v1).collect();
        annotations.insert(CURRENT_METRICS.into(), json!(Value::Array(v1).to_string()));
    }
    if let Some(conditions) = status["conditions"].as_array().filter(|c| !c.is_empty()) {
        annotations.insert(
            CONDITIONS.into(),
            json!(Value::Array(conditions.clone()).to_string()),
        );
    }

    set_annotations(object, annotations);
    object["spec"] = Value::Object(v1_spec);
    object["status"] = Value::Object(v1_status);
}

/// A v1 object as it is stored (`Convert_v1_HorizontalPodAutoscaler_To_autoscaling_…`).
fn to_v2(object: &mut Value) {
    object["apiVersion"] = json!("autoscaling/v2");
    let spec = object["spec"].take();
    let status = object["status"].take();
    let (annotations, carried) = take_round_trip_annotations(object);
    set_annotations(object, annotations);
    let carried_list = |key: &str| -> Option<Vec<Value>> {
        carried
            .get(key)
            .and_then(|text| serde_json::from_str::<Vec<Value>>(text).ok())
    };

    let mut v2_spec = Map::new();
    v2_spec.insert("scaleTargetRef".into(), spec["scaleTargetRef"].clone());
    copy(&spec, &mut v2_spec, "minReplicas");
    copy(&spec, &mut v2_spec, "maxReplicas");
    // The carried metrics first, the CPU target last, as upstream orders them.
    let mut metrics: Vec<Value> = carried_list(METRICS)
        .unwrap_or_default()
        .iter()
        .map(metric_spec_to_v2)
        .collect();
    if let Some(target) = spec["targetCPUUtilizationPercentage"].as_i64() {
        metrics.push(cpu_utilization(target));
    }
    if metrics.is_empty() {
        metrics.push(cpu_utilization(DEFAULT_CPU_UTILIZATION));
    }
    v2_spec.insert("metrics".into(), Value::Array(metrics));
    if let Some(behavior) = carried
        .get(BEHAVIOR)
        .and_then(|text| serde_json::from_str::<Value>(text).ok())
        .and_then(|go| behavior_from_go(&go))
    {
        v2_spec.insert("behavior".into(), behavior);
    }

    if status.is_object() {
        let mut v2_status = Map::new();
        for field in [
            "observedGeneration",
            "lastScaleTime",
            "currentReplicas",
            "desiredReplicas",
        ] {
            copy(&status, &mut v2_status, field);
        }
        // The annotation's metrics say more than the CPU percentage.
        let current = match carried_list(CURRENT_METRICS) {
            Some(list) => list.iter().map(metric_status_to_v2).collect(),
            None => status["currentCPUUtilizationPercentage"]
                .as_i64()
                .map(|u| vec![json!({"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": u}}})])
                .unwrap_or_default(),
        };
        if !current.is_empty() {
            v2_status.insert("currentMetrics".into(), Value::Array(current));
        }
        if let Some(conditions) = carried_list(CONDITIONS).filter(|c| !c.is_empty()) {
            v2_status.insert("conditions".into(), Value::Array(conditions));
        }
        object["status"] = Value::Object(v2_status);
    } else if let Some(map) = object.as_object_mut() {
        map.remove("status");
    }
    object["spec"] = Value::Object(v2_spec);
}

fn cpu_utilization(percent: i64) -> Value {
    json!({"type": "Resource", "resource": {"name": "cpu",
        "target": {"type": "Utilization", "averageUtilization": percent}}})
}

fn copy(from: &Value, to: &mut Map<String, Value>, field: &str) {
    if let Some(value) = from.get(field).filter(|v| !v.is_null()) {
        to.insert(field.into(), value.clone());
    }
}

/// The annotations without the round-trip ones, and those apart.
fn take_round_trip_annotations(
    object: &mut Value,
) -> (Map<String, Value>, HashMap<&'static str, String>) {
    let mut annotations = object["metadata"]["annotations"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let mut carried = HashMap::new();
    for key in [METRICS, CURRENT_METRICS, CONDITIONS, BEHAVIOR] {
        if let Some(value) = annotations.remove(key) {
            carried.insert(key, value.as_str().unwrap_or("").to_owned());
        }
    }
    (annotations, carried)
}

fn set_annotations(object: &mut Value, annotations: Map<String, Value>) {
    let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    if annotations.is_empty() {
        metadata.remove("annotations");
    } else {
        metadata.insert("annotations".into(), Value::Object(annotations));
    }
}

/// A v2 `MetricSpec` as v1 writes it.
fn metric_spec_to_v1(metric: &Value) -> Value {
    let kind = metric["type"].as_str().unwrap_or("");
    let mut out = json!({"type": kind});
    let target = |source: &Value| source["target"].clone();
    match kind {
        "Resource" | "ContainerResource" => {
            let key = resource_key(kind);
            let source = &metric[key];
            let mut v1 = json!({"name": source["name"]});
            put(&mut v1, "container", &source["container"]);
            put(
                &mut v1,
                "targetAverageUtilization",
                &target(source)["averageUtilization"],
            );
            put(
                &mut v1,
                "targetAverageValue",
                &target(source)["averageValue"],
            );
            out[key] = v1;
        }
        "Pods" => {
            let source = &metric["pods"];
            let mut v1 = json!({"metricName": source["metric"]["name"], "targetAverageValue": target(source)["averageValue"]});
            put(&mut v1, "selector", &source["metric"]["selector"]);
            out["pods"] = v1;
        }
        "Object" => {
            let source = &metric["object"];
            let mut v1 = json!({"target": source["describedObject"], "metricName": source["metric"]["name"],
                "targetValue": target(source)["value"]});
            put(&mut v1, "selector", &source["metric"]["selector"]);
            put(&mut v1, "averageValue", &target(source)["averageValue"]);
            out["object"] = v1;
        }
        "External" => {
            let source = &metric["external"];
            let mut v1 = json!({"metricName": source["metric"]["name"]});
            put(&mut v1, "metricSelector", &source["metric"]["selector"]);
            put(&mut v1, "targetValue", &target(source)["value"]);
            put(
                &mut v1,
                "targetAverageValue",
                &target(source)["averageValue"],
            );
            out["external"] = v1;
        }
        _ => {}
    }
    out
}

/// A v1 `MetricSpec` (from the annotation) as v2 writes it.
fn metric_spec_to_v2(metric: &Value) -> Value {
    let kind = metric["type"].as_str().unwrap_or("");
    let mut out = json!({"type": kind});
    match kind {
        "Resource" | "ContainerResource" => {
            let key = resource_key(kind);
            let source = &metric[key];
            let kind = if source["targetAverageUtilization"].is_null() {
                "AverageValue"
            } else {
                "Utilization"
            };
            let mut target = json!({"type": kind});
            put(
                &mut target,
                "averageUtilization",
                &source["targetAverageUtilization"],
            );
            put(&mut target, "averageValue", &source["targetAverageValue"]);
            let mut v2 = json!({"name": source["name"], "target": target});
            put(&mut v2, "container", &source["container"]);
            out[key] = v2;
        }
        "Pods" => {
            let source = &metric["pods"];
            out["pods"] = json!({"metric": identifier(&source["metricName"], &source["selector"]),
                "target": {"type": "AverageValue", "averageValue": source["targetAverageValue"]}});
        }
        "Object" => {
            let source = &metric["object"];
            let kind = if source["averageValue"].is_null() {
                "Value"
            } else {
                "AverageValue"
            };
            let mut target = json!({"type": kind});
            put(&mut target, "value", &source["targetValue"]);
            put(&mut target, "averageValue", &source["averageValue"]);
            out["object"] = json!({"describedObject": source["target"],
                "metric": identifier(&source["metricName"], &source["selector"]), "target": target});
        }
        "External" => {
            let source = &metric["external"];
            let kind = if source["targetValue"].is_null() {
                "AverageValue"
            } else {
                "Value"
            };
            let mut target = json!({"type": kind});
            put(&mut target, "value", &source["targetValue"]);
            put(&mut target, "averageValue", &source["targetAverageValue"]);
            out["external"] = json!({"metric": identifier(&source["metricName"], &source["metricSelector"]),
                "target": target});
        }
        _ => {}
    }
    out
}

/// A v2 `MetricStatus` as v1 writes it.
fn metric_status_to_v1(metric: &Value) -> Value {
    let kind = metric["type"].as_str().unwrap_or("");
    let mut out = json!({"type": kind});
    match kind {
        "Resource" | "ContainerResource" => {
            let key = resource_key(kind);
            let source = &metric[key];
            let mut v1 = json!({"name": source["name"], "currentAverageValue": source["current"]["averageValue"]});
            put(&mut v1, "container", &source["container"]);
            put(
                &mut v1,
                "currentAverageUtilization",
                &source["current"]["averageUtilization"],
            );
            out[key] = v1;
        }
        "Pods" => {
            let source = &metric["pods"];
            let mut v1 = json!({"metricName": source["metric"]["name"], "currentAverageValue": source["current"]["averageValue"]});
            put(&mut v1, "selector", &source["metric"]["selector"]);
            out["pods"] = v1;
        }
        "Object" => {
            let source = &metric["object"];
            let mut v1 = json!({"target": source["describedObject"], "metricName": source["metric"]["name"],
                "currentValue": source["current"]["value"]});
            put(&mut v1, "selector", &source["metric"]["selector"]);
            put(&mut v1, "averageValue", &source["current"]["averageValue"]);
            out["object"] = v1;
        }
        "External" => {
            let source = &metric["external"];
            let mut v1 = json!({"metricName": source["metric"]["name"], "currentValue": source["current"]["value"]});
            put(&mut v1, "metricSelector", &source["metric"]["selector"]);
            put(
                &mut v1,
                "currentAverageValue",
                &source["current"]["averageValue"],
            );
            out["external"] = v1;
        }
        _ => {}
    }
    out
}

/// A v1 `MetricStatus` (from the annotation) as v2 writes it.
fn metric_status_to_v2(metric: &Value) -> Value {
    let kind = metric["type"].as_str().unwrap_or("");
    let mut out = json!({"type": kind});
    let current = |pairs: &[(&str, &Value)]| {
        let mut current = json!({});
        for (key, value) in pairs {
            put(&mut current, key, value);
        }
        current
    };
    match kind {
        "Resource" | "ContainerResource" => {
            let key = resource_key(kind);
            let source = &metric[key];
            let mut v2 = json!({"name": source["name"], "current": current(&[
                ("averageUtilization", &source["currentAverageUtilization"]),
                ("averageValue", &source["currentAverageValue"])])});
            put(&mut v2, "container", &source["container"]);
            out[key] = v2;
        }
        "Pods" => {
            let source = &metric["pods"];
            out["pods"] = json!({"metric": identifier(&source["metricName"], &source["selector"]),
                "current": current(&[("averageValue", &source["currentAverageValue"])])});
        }
        "Object" => {
            let source = &metric["object"];
            out["object"] = json!({"describedObject": source["target"],
                "metric": identifier(&source["metricName"], &source["selector"]),
                "current": current(&[("value", &source["currentValue"]), ("averageValue", &source["averageValue"])])});
        }
        "External" => {
            let source = &metric["external"];
            out["external"] = json!({"metric": identifier(&source["metricName"], &source["metricSelector"]),
                "current": current(&[("value", &source["currentValue"]), ("averageValue", &source["currentAverageValue"])])});
        }
        _ => {}
    }
    out
}

/// The field of a (container) resource metric's source or status.
fn resource_key(kind: &str) -> &'static str {
    if kind == "Resource" {
        "resource"
    } else {
        "containerResource"
    }
}

fn identifier(name: &Value, selector: &Value) -> Value {
    let mut metric = json!({"name": name});
    put(&mut metric, "selector", selector);
    metric
}

/// Sets `key` unless `value` is null.
fn put(object: &mut Value, key: &str, value: &Value) {
    if !value.is_null() {
        object[key] = value.clone();
    }
}

/// `spec.behavior` as Go marshals upstream's internal type: its field
/// names, nil pointers as null.
fn behavior_to_go(behavior: &Value) -> Value {
    let rules = |rules: &Value| {
        if !rules.is_object() {
            return Value::Null;
        }
        let policies: Vec<Value> = rules["policies"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| json!({"Type": p["type"], "Value": p["value"], "PeriodSeconds": p["periodSeconds"]}))
            .collect();
        json!({"StabilizationWindowSeconds": rules["stabilizationWindowSeconds"],
            "SelectPolicy": rules["selectPolicy"], "Policies": policies,
            "Tolerance": rules["tolerance"]})
    };
    json!({"ScaleUp": rules(&behavior["scaleUp"]), "ScaleDown": rules(&behavior["scaleDown"])})
}

/// The behaviour annotation back, its keys matched case-insensitively as
/// Go's `encoding/json` matches them.
fn behavior_from_go(go: &Value) -> Option<Value> {
    let field = |object: &Value, name: &str| -> Value {
        object
            .as_object()
            .and_then(|map| {
                map.iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.clone())
            })
            .unwrap_or(Value::Null)
    };
    let rules = |rules: Value| -> Option<Value> {
        if !rules.is_object() {
            return None;
        }
        let mut out = json!({});
        put(
            &mut out,
            "stabilizationWindowSeconds",
            &field(&rules, "StabilizationWindowSeconds"),
        );
        put(&mut out, "selectPolicy", &field(&rules, "SelectPolicy"));
        put(&mut out, "tolerance", &field(&rules, "Tolerance"));
        if let Some(policies) = field(&rules, "Policies").as_array() {
            out["policies"] = policies
                .iter()
                .map(|p| {
                    json!({"type": field(p, "Type"), "value": field(p, "Value"),
                    "periodSeconds": field(p, "PeriodSeconds")})
                })
                .collect();
        }
        Some(out)
    };
    let mut out = json!({});
    if let Some(up) = rules(field(go, "ScaleUp")) {
        out["scaleUp"] = up;
    }
    if let Some(down) = rules(field(go, "ScaleDown")) {
        out["scaleDown"] = down;
    }
    out.as_object()
        .is_some_and(|m| !m.is_empty())
        .then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored() -> Value {
        json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web", "namespace": "default", "annotations": {"team": "a"}},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                "minReplicas": 1, "maxReplicas": 5,
                "metrics": [
                    {"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "100Mi"}}},
                    {"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {"type": "AverageValue", "averageValue": "10"}}},
                    {"type": "External", "external": {"metric": {"name": "queue", "selector": {"matchLabels": {"q": "a"}}},
                        "target": {"type": "Value", "value": "30"}}},
                    {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}],
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60, "selectPolicy": "Max",
                    "policies": [{"type": "Percent", "value": 50, "periodSeconds": 15}]}}},
            "status": {"currentReplicas": 2, "desiredReplicas": 3,
                "currentMetrics": [{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 71, "averageValue": "355m"}}}],
                "conditions": [{"type": "AbleToScale", "status": "True", "reason": "SucceededRescale", "lastTransitionTime": "2026-11-28T00:00:00Z"}]}})
    }

    #[test]
    fn v1_shows_the_cpu_target_and_carries_the_rest_in_annotations() {
        let mut v1 = stored();
        assert!(VIEW.to_version(&RESOURCE, &mut v1));
        assert_eq!(v1["apiVersion"], "autoscaling/v1");
        assert_eq!(
            v1["spec"],
            json!({"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "minReplicas": 1, "maxReplicas": 5, "targetCPUUtilizationPercentage": 50})
        );
        assert_eq!(
            v1["status"],
            json!({"currentReplicas": 2, "desiredReplicas": 3, "currentCPUUtilizationPercentage": 71})
        );
        let annotations = &v1["metadata"]["annotations"];
        assert_eq!(annotations["team"], "a");
        let metrics: Value = serde_json::from_str(annotations[METRICS].as_str().unwrap()).unwrap();
        assert_eq!(
            metrics,
            json!([
            {"type": "Resource", "resource": {"name": "memory", "targetAverageValue": "100Mi"}},
            {"type": "Pods", "pods": {"metricName": "qps", "targetAverageValue": "10"}},
            {"type": "External", "external": {"metricName": "queue", "metricSelector": {"matchLabels": {"q": "a"}}, "targetValue": "30"}}])
        );
        let behavior: Value =
            serde_json::from_str(annotations[BEHAVIOR].as_str().unwrap()).unwrap();
        assert_eq!(behavior["ScaleDown"]["StabilizationWindowSeconds"], 60);
        assert_eq!(behavior["ScaleUp"], Value::Null);

        // And back, whole.
        let mut back = v1.clone();
        VIEW.to_storage(&RESOURCE, &mut back);
        assert_eq!(back, stored());
    }

    #[test]
    fn a_plain_v1_object_is_stored_with_its_explicit_metric() {
        let mut object = json!({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web"}, "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "maxReplicas": 3}});
        defaults(&mut object);
        assert!(validate(&object, None).is_empty());
        VIEW.to_storage(&RESOURCE, &mut object);
        assert_eq!(object["spec"]["minReplicas"], 1);
        assert_eq!(object["spec"]["metrics"], json!([cpu_utilization(80)]));
        assert!(object.get("status").is_none());

        let mut bad = json!({"spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "minReplicas": 4, "maxReplicas": 3}});
        let fields: Vec<String> = validate(&bad, None).into_iter().map(|c| c.field).collect();
        assert_eq!(fields, ["spec.maxReplicas"]);
        bad["spec"]["targetCPUUtilizationPercentage"] = json!(20);
        VIEW.to_storage(&RESOURCE, &mut bad);
        assert_eq!(bad["spec"]["metrics"], json!([cpu_utilization(20)]));
    }
}
