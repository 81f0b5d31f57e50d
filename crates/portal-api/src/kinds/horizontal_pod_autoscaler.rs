//! HorizontalPodAutoscalers (`autoscaling/v2`): accepted, defaulted,
//! validated and shown as Kubernetes does (`kubectl autoscale`, charts that
//! ship one). Nothing scales them yet: that needs resource metrics, which
//! no component serves (`kubectl top` neither).

use serde_json::{json, Value};

use crate::schema::{openapi_schema, typed, Generation, Kind, ListStrategy, NameRule, Resource};
use crate::table::Column;
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("autoscaling", "HorizontalPodAutoscaler");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v2",
    plural: "horizontalpodautoscalers",
    singular: "horizontalpodautoscaler",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &["hpa"],
    categories: &["all"],
    has_status: true,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler>,
    openapi_schema: openapi_schema::<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler>,
    defaults,
    validate,
    prepare_create,
    kept_on_update: &[],
    generation: Generation::Spec,
    create_on_update: false,
    selectable_fields: &[],
    field_paths: &[],
    field_defaults: &[],
    own_list_strategy: list_strategy,
    list_map_keys: &[],
    columns,
    cells,
    custom: None,
    subresources: &[],
};

/// Kubernetes' defaults: one replica at least, 80 % CPU, and when a
/// behaviour is given its omitted rules as upstream fills them.
fn defaults(object: &mut Value) {
    let Some(spec) = object.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    if spec.get("minReplicas").is_none() {
        spec["minReplicas"] = json!(1);
    }
    if spec["metrics"].as_array().is_none_or(Vec::is_empty) {
        spec["metrics"] = json!([{"type": "Resource", "resource": {"name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": 80}}}]);
    }
    if let Some(behavior) = spec.get_mut("behavior").filter(|b| b.is_object()) {
        let up = json!({"stabilizationWindowSeconds": 0, "selectPolicy": "Max", "policies": [
            {"type": "Pods", "value": 4, "periodSeconds": 15},
            {"type": "Percent", "value": 100, "periodSeconds": 15}]});
        let down = json!({"stabilizationWindowSeconds": 300, "selectPolicy": "Max", "policies": [
            {"type": "Percent", "value": 100, "periodSeconds": 15}]});
        for (name, rules) in [("scaleUp", up), ("scaleDown", down)] {
            if !behavior[name].is_object() {
                behavior[name] = json!({});
            }
            for (key, value) in rules.as_object().into_iter().flatten() {
                if behavior[name].get(key).is_none() {
                    behavior[name][key] = value.clone();
                }
            }
        }
    }
}

fn prepare_create(object: &mut Value) {
    object["status"] = json!({"desiredReplicas": 0});
}

fn list_strategy(path: &[&str]) -> ListStrategy {
    match path {
        ["status", "conditions"] => ListStrategy::MergeKey("type"),
        _ => ListStrategy::Replace,
    }
}

fn validate(object: &Value, _old: Option<&Value>) -> Vec<Cause> {
    let spec = &object["spec"];
    let mut causes = Vec::new();
    for field in ["kind", "name"] {
        if spec["scaleTargetRef"][field]
            .as_str()
            .is_none_or(str::is_empty)
        {
            causes.push(Cause::required(&format!("spec.scaleTargetRef.{field}"), ""));
        }
    }
    let min = spec["minReplicas"].as_i64().unwrap_or(1);
    let max = spec["maxReplicas"].as_i64().unwrap_or(0);
    if min < 1 {
        causes.push(Cause::invalid(
            "spec.minReplicas",
            min,
            "must be greater than or equal to 1",
        ));
    }
    if max < 1 {
        causes.push(Cause::invalid(
            "spec.maxReplicas",
            max,
            "must be greater than 0",
        ));
    } else if max < min {
        causes.push(Cause::invalid(
            "spec.maxReplicas",
            max,
            "must be greater than or equal to `minReplicas`",
        ));
    }
    for (at, metric) in spec["metrics"].as_array().into_iter().flatten().enumerate() {
        let kind = metric["type"].as_str().unwrap_or("");
        let source = match kind {
            "Resource" => "resource",
            "ContainerResource" => "containerResource",
            "Pods" => "pods",
            "Object" => "object",
            "External" => "external",
            _ => {
                causes.push(crate::service::validate::unsupported(
                    &format!("spec.metrics[{at}].type"),
                    kind,
                    "\"ContainerResource\", \"External\", \"Object\", \"Pods\", \"Resource\"",
                ));
                continue;
            }
        };
        if !metric[source].is_object() {
            causes.push(Cause::required(
                &format!("spec.metrics[{at}].{source}"),
                &format!("must populate information for the given metric source (type {kind})"),
            ));
        }
    }
    causes
}

fn columns() -> Vec<Column> {
    use crate::table::{col, AGE, NAME};
    let number = |name, description| Column {
        kind: "integer",
        ..col(name, description, 0)
    };
    vec![
        NAME,
        col(
            "Reference",
            "reference to scaled resource; horizontal pod autoscaler will learn the current \
             resource consumption and will set the desired number of pods by using its Scale \
             subresource.",
            0,
        ),
        col("Targets", "the current and target metrics", 0),
        col(
            "MinPods",
            "minReplicas is the lower limit for the number of replicas to which the autoscaler \
             can scale down.",
            0,
        ),
        number(
            "MaxPods",
            "maxReplicas is the upper limit for the number of replicas to which the autoscaler \
             can scale up.",
        ),
        number(
            "Replicas",
            "currentReplicas is current number of replicas of pods managed by this autoscaler, \
             as last seen by the autoscaler.",
        ),
        AGE,
    ]
}

/// `cpu: <unknown>/80%`, one per metric, as kubectl prints them.
fn targets(object: &Value) -> String {
    let metrics = object["spec"]["metrics"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let shown: Vec<String> = metrics
        .iter()
        .map(|metric| {
            let source = [
                "resource",
                "containerResource",
                "pods",
                "object",
                "external",
            ]
            .iter()
            .find_map(|k| metric.get(*k).filter(|v| v.is_object()))
            .cloned()
            .unwrap_or_default();
            let target = &source["target"];
            let wanted = if let Some(percent) = target["averageUtilization"].as_i64() {
                format!("{percent}%")
            } else {
                target["averageValue"]
                    .as_str()
                    .or(target["value"].as_str())
                    .unwrap_or("<unset>")
                    .to_owned()
            };
            let name = source["name"]
                .as_str()
                .or(source["metric"]["name"].as_str())
                .unwrap_or("");
            format!("{name}: <unknown>/{wanted}")
        })
        .collect();
    if shown.is_empty() {
        "<none>".into()
    } else {
        shown.join(", ")
    }
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    use crate::table::cells::*;
    let target = &object["spec"]["scaleTargetRef"];
    vec![
        name(object),
        json!(format!(
            "{}/{}",
            target["kind"].as_str().unwrap_or(""),
            target["name"].as_str().unwrap_or("")
        )),
        json!(targets(object)),
        json!(object["spec"]["minReplicas"]
            .as_i64()
            .map_or("<unset>".to_owned(), |n| n.to_string())),
        json!(object["spec"]["maxReplicas"].as_i64().unwrap_or(0)),
        json!(int(object, &["status", "currentReplicas"])),
        age(object, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validation_and_table() {
        let mut object = json!({"metadata": {"name": "web"}, "spec": {"maxReplicas": 5,
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60}}}});
        defaults(&mut object);
        assert_eq!(object["spec"]["minReplicas"], 1);
        assert_eq!(
            object["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
            80
        );
        assert_eq!(
            object["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"],
            60
        );
        assert_eq!(
            object["spec"]["behavior"]["scaleUp"]["policies"][0]["value"],
            4
        );
        assert!(
            validate(&object, None).is_empty(),
            "{:?}",
            validate(&object, None)
        );
        let row = cells(&object, 0);
        assert_eq!(row[1], "Deployment/web");
        assert_eq!(row[2], "cpu: <unknown>/80%");
        let mut below = object.clone();
        below["spec"]["minReplicas"] = json!(7);
        assert!(validate(&below, None)[0]
            .display()
            .contains("must be greater than or equal to `minReplicas`"));
    }
}
