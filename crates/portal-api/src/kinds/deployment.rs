//! Deployments (`apps/v1`): a pod template rolled out through ReplicaSets,
//! one per template, by a strategy (`RollingUpdate` within `maxSurge` and
//! `maxUnavailable`, or `Recreate`). Defaults and validation as Kubernetes'
//! `pkg/apis/apps`; the annotations count towards `generation` and the
//! controller reports the revision annotation with its status.

use serde_json::{json, Value};

use super::Subresource;
use crate::defaults::default;
use crate::schema::{openapi_schema, typed, Generation, Kind, ListStrategy, NameRule, Resource};
use crate::selector::LabelSelector;
use crate::service::validate::unsupported;
use crate::table::Column;
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("apps", "Deployment");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "deployments",
    singular: "deployment",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &["deploy"],
    categories: &["all"],
    has_status: true,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::apps::v1::Deployment>,
    openapi_schema: openapi_schema::<k8s_openapi::api::apps::v1::Deployment>,
    defaults,
    validate,
    prepare_create,
    kept_on_update: &[],
    generation: Generation::SpecAndAnnotations,
    create_on_update: false,
    selectable_fields: &[],
    field_paths: &[],
    field_defaults: &[],
    own_list_strategy: list_strategy,
    list_map_keys: &[],
    columns,
    cells,
    custom: None,
    subresources: &[Subresource {
        name: "scale",
        kind: "Scale",
        verbs: &["get", "patch", "update"],
        group_version: Some(("autoscaling", "v1")),
    }],
};

fn defaults(object: &mut Value) {
    let Some(spec) = object.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    default(spec, "replicas", json!(1));
    default(spec, "revisionHistoryLimit", json!(10));
    default(spec, "progressDeadlineSeconds", json!(600));
    default(spec, "strategy", json!({}));
    if let Some(strategy) = spec.get_mut("strategy").filter(|s| s.is_object()) {
        default(strategy, "type", json!("RollingUpdate"));
        if strategy["type"] == "RollingUpdate" {
            default(strategy, "rollingUpdate", json!({}));
            if let Some(rolling) = strategy.get_mut("rollingUpdate").filter(|r| r.is_object()) {
                default(rolling, "maxUnavailable", json!("25%"));
                default(rolling, "maxSurge", json!("25%"));
            }
        }
    }
    if let Some(pod) = object.pointer_mut("/spec/template/spec") {
        super::pod::spec_defaults(pod);
    }
}

fn prepare_create(object: &mut Value) {
    object["status"] = json!({});
}

fn list_strategy(path: &[&str]) -> ListStrategy {
    match path {
        ["spec", "template", "metadata", "finalizers"] => ListStrategy::MergePrimitives,
        ["spec", "template", "spec", rest @ ..] => super::pod::spec_list_strategy(rest),
        ["status", "conditions"] => ListStrategy::MergeKey("type"),
        _ => ListStrategy::Replace,
    }
}

/// An `int-or-string` that is an integer ≥ 0 or a percentage `N%`:
/// `Some(percent)` for a percentage, `None` for an integer, or the cause.
pub(crate) fn int_or_percent(value: &Value, field: &str) -> Result<Option<i64>, Cause> {
    if let Some(n) = value.as_i64() {
        if n < 0 {
            return Err(Cause::invalid(
                field,
                n,
                "must be greater than or equal to 0",
            ));
        }
        return Ok(None);
    }
    let text = value.as_str().unwrap_or("");
    match text.strip_suffix('%').map(str::parse::<i64>) {
        Some(Ok(percent)) if text.starts_with(|c: char| c.is_ascii_digit()) => Ok(Some(percent)),
        _ => Err(Cause::invalid(
            field,
            text,
            "a valid percent string must be a numeric string followed by an ending '%' \
             (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
        )),
    }
}

pub(crate) fn is_zero(value: &Value) -> bool {
    value.as_i64() == Some(0) || value.as_str() == Some("0%")
}

fn validate(object: &Value, old: Option<&Value>) -> Vec<Cause> {
    // Upstream validates a Deployment's template as a ReplicaSet's.
    let mut causes = super::replica_set::validate_selector_and_template(object, old, "ReplicaSet");
    let spec = &object["spec"];
    for field in [
        "replicas",
        "minReadySeconds",
        "revisionHistoryLimit",
        "progressDeadlineSeconds",
    ] {
        if spec[field].as_i64().is_some_and(|n| n < 0) {
            causes.push(Cause::invalid(
                &format!("spec.{field}"),
                spec[field].clone(),
                "must be greater than or equal to 0",
            ));
        }
    }
    if let Some(deadline) = spec["progressDeadlineSeconds"].as_i64() {
        if deadline <= spec["minReadySeconds"].as_i64().unwrap_or(0) {
            causes.push(Cause::invalid(
                "spec.progressDeadlineSeconds",
                deadline,
                "must be greater than minReadySeconds",
            ));
        }
    }
    let strategy = &spec["strategy"];
    match strategy["type"].as_str().unwrap_or("") {
        "Recreate" => {
            if !strategy["rollingUpdate"].is_null() {
                causes.push(Cause::forbidden(
                    "spec.strategy.rollingUpdate",
                    "may not be specified when strategy `type` is 'Recreate'",
                ));
            }
        }
        "RollingUpdate" => causes.extend(validate_rolling(
            &strategy["rollingUpdate"],
            "spec.strategy.rollingUpdate",
        )),
        other => causes.push(unsupported(
            "spec.strategy.type",
            other,
            "\"Recreate\", \"RollingUpdate\"",
        )),
    }
    if let (Some(old), Some(count)) = (old, object["status"]["collisionCount"].as_i64()) {
        let before = old["status"]["collisionCount"].as_i64().unwrap_or(0);
        if count < before {
            causes.push(Cause::invalid(
                "status.collisionCount",
                count,
                "cannot be decremented",
            ));
        }
    }
    causes
}

/// `maxUnavailable` and `maxSurge` of a rolling update at `at`: each an
/// integer ≥ 0 or a percentage, unavailability at most 100 %, not both 0.
pub(crate) fn validate_rolling(rolling: &Value, at: &str) -> Vec<Cause> {
    if rolling.is_null() {
        return vec![Cause::required(
            at,
            "this should be defaulted and never be nil",
        )];
    }
    let mut causes = Vec::new();
    let unavailable = &rolling["maxUnavailable"];
    let surge = &rolling["maxSurge"];
    let mut check = |value: &Value, name: &str| match int_or_percent(value, &format!("{at}.{name}"))
    {
        Ok(percent) => percent,
        Err(cause) => {
            causes.push(cause);
            None
        }
    };
    let unavailable_percent = check(unavailable, "maxUnavailable");
    check(surge, "maxSurge");
    if unavailable_percent.is_some_and(|p| p > 100) {
        causes.push(Cause::invalid(
            &format!("{at}.maxUnavailable"),
            unavailable.clone(),
            "must not be greater than 100%",
        ));
    }
    if is_zero(unavailable) && is_zero(surge) {
        causes.push(Cause::invalid(
            &format!("{at}.maxUnavailable"),
            unavailable.clone(),
            "may not be 0 when `maxSurge` is 0",
        ));
    }
    causes
}

fn columns() -> Vec<Column> {
    use crate::table::{col, AGE, NAME};
    vec![
        NAME,
        col("Ready", "Number of the pod with ready state", 0),
        col(
            "Up-to-date",
            "Total number of non-terminated pods targeted by this deployment that have the \
             desired template spec.",
            0,
        ),
        col(
            "Available",
            "Total number of available pods (ready for at least minReadySeconds) targeted by \
             this deployment.",
            0,
        ),
        AGE,
        col("Containers", "Names of each container in the template.", 1),
        col(
            "Images",
            "Images referenced by each container in the template.",
            1,
        ),
        col(
            "Selector",
            "Label selector for pods. Existing ReplicaSets whose pods are selected by this \
             will be the ones affected by this deployment.",
            1,
        ),
    ]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    use crate::table::cells::*;
    let [names, images] = super::template_containers(&object["spec"]["template"]);
    let desired = object
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let selector = LabelSelector::from_api(&object["spec"]["selector"], "spec.selector")
        .map(|s| s.to_string())
        .unwrap_or_default();
    vec![
        name(object),
        json!(format!(
            "{}/{desired}",
            int(object, &["status", "readyReplicas"])
        )),
        json!(int(object, &["status", "updatedReplicas"])),
        json!(int(object, &["status", "availableReplicas"])),
        age(object, now),
        names,
        images,
        json!(or_none(selector)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(spec: Value) -> Value {
        let mut object = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {"selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}});
        for (key, value) in spec.as_object().unwrap() {
            object["spec"][key] = value.clone();
        }
        object
    }

    fn messages(object: &Value) -> Vec<String> {
        validate(object, None).iter().map(Cause::display).collect()
    }

    #[test]
    fn defaults_are_kubernetes_own() {
        let mut object = deployment(json!({}));
        defaults(&mut object);
        let spec = &object["spec"];
        assert_eq!(spec["replicas"], 1);
        assert_eq!(spec["revisionHistoryLimit"], 10);
        assert_eq!(spec["progressDeadlineSeconds"], 600);
        assert_eq!(
            spec["strategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}})
        );
        assert_eq!(spec["template"]["spec"]["restartPolicy"], "Always");
        let mut recreate = deployment(json!({"strategy": {"type": "Recreate"}}));
        defaults(&mut recreate);
        assert_eq!(recreate["spec"]["strategy"], json!({"type": "Recreate"}));
        assert!(messages(&recreate).is_empty(), "{:?}", messages(&recreate));
    }

    #[test]
    fn strategy_and_counts_are_validated() {
        let mut good = deployment(json!({}));
        defaults(&mut good);
        assert!(messages(&good).is_empty(), "{:?}", messages(&good));
        let both_zero = deployment(json!({"strategy": {"type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "0%"}}}));
        assert_eq!(
            messages(&both_zero),
            ["spec.strategy.rollingUpdate.maxUnavailable: Invalid value: 0: may not be 0 when `maxSurge` is 0"]
        );
        let bad_percent = deployment(json!({"strategy": {"type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": "150%", "maxSurge": "x"}}}));
        let got = messages(&bad_percent);
        assert!(
            got.iter()
                .any(|m| m.contains("must not be greater than 100%")),
            "{got:?}"
        );
        assert!(
            got.iter().any(
                |m| m.starts_with("spec.strategy.rollingUpdate.maxSurge: Invalid value: \"x\"")
            ),
            "{got:?}"
        );
        let recreate = deployment(json!({"strategy": {"type": "Recreate", "rollingUpdate": {}}}));
        assert!(messages(&recreate)[0]
            .contains("may not be specified when strategy `type` is 'Recreate'"));
        let deadline = deployment(json!({"minReadySeconds": 10, "progressDeadlineSeconds": 10,
            "strategy": {"type": "Recreate"}}));
        assert_eq!(
            messages(&deadline),
            ["spec.progressDeadlineSeconds: Invalid value: 10: must be greater than minReadySeconds"]
        );
        let mut never = deployment(json!({"strategy": {"type": "Recreate"}}));
        never["spec"]["template"]["spec"]["restartPolicy"] = json!("Never");
        assert!(messages(&never)[0]
            .starts_with("spec.template.spec.restartPolicy: Unsupported value: \"Never\""));
    }

    #[test]
    fn table_shows_ready_of_desired() {
        let mut object = deployment(json!({"replicas": 3}));
        object["status"] =
            json!({"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 1});
        let row = cells(&object, 0);
        assert_eq!(row[1], "2/3");
        assert_eq!(row[2], 3);
        assert_eq!(row[3], 1);
        assert_eq!(row[7], "app=web");
    }
}
