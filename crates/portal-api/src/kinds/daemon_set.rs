//! DaemonSets (`apps/v1`): one pod of a template on every node that may run
//! it, updated node by node (`RollingUpdate` within `maxUnavailable` and
//! `maxSurge`) or when its pods are deleted (`OnDelete`). Defaults and
//! validation as Kubernetes' `pkg/apis/apps`.

use serde_json::{json, Value};

use crate::defaults::default;
use crate::schema::{openapi_schema, typed, Generation, Kind, ListStrategy, NameRule, Resource};
use crate::selector::LabelSelector;
use crate::service::validate::unsupported;
use crate::table::Column;
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("apps", "DaemonSet");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "daemonsets",
    singular: "daemonset",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &["ds"],
    categories: &["all"],
    has_status: true,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::apps::v1::DaemonSet>,
    openapi_schema: openapi_schema::<k8s_openapi::api::apps::v1::DaemonSet>,
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

fn defaults(object: &mut Value) {
    let Some(spec) = object.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    default(spec, "revisionHistoryLimit", json!(10));
    default(spec, "updateStrategy", json!({}));
    if let Some(strategy) = spec.get_mut("updateStrategy").filter(|s| s.is_object()) {
        default(strategy, "type", json!("RollingUpdate"));
        if strategy["type"] == "RollingUpdate" {
            default(strategy, "rollingUpdate", json!({}));
            if let Some(rolling) = strategy.get_mut("rollingUpdate").filter(|r| r.is_object()) {
                default(rolling, "maxUnavailable", json!(1));
                default(rolling, "maxSurge", json!(0));
            }
        }
    }
    if let Some(pod) = object.pointer_mut("/spec/template/spec") {
        super::pod::spec_defaults(pod);
    }
}

fn prepare_create(object: &mut Value) {
    object["status"] = json!({
        "currentNumberScheduled": 0, "numberMisscheduled": 0,
        "desiredNumberScheduled": 0, "numberReady": 0,
    });
}

fn list_strategy(path: &[&str]) -> ListStrategy {
    match path {
        ["spec", "template", "metadata", "finalizers"] => ListStrategy::MergePrimitives,
        ["spec", "template", "spec", rest @ ..] => super::pod::spec_list_strategy(rest),
        ["status", "conditions"] => ListStrategy::MergeKey("type"),
        _ => ListStrategy::Replace,
    }
}

fn validate(object: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = super::replica_set::validate_selector_and_template(object, old, "DaemonSet");
    let spec = &object["spec"];
    for field in ["minReadySeconds", "revisionHistoryLimit"] {
        if spec[field].as_i64().is_some_and(|n| n < 0) {
            causes.push(Cause::invalid(
                &format!("spec.{field}"),
                spec[field].clone(),
                "must be greater than or equal to 0",
            ));
        }
    }
    let strategy = &spec["updateStrategy"];
    match strategy["type"].as_str().unwrap_or("") {
        "OnDelete" => {}
        "RollingUpdate" => causes.extend(super::deployment::validate_rolling(
            &strategy["rollingUpdate"],
            "spec.updateStrategy.rollingUpdate",
        )),
        other => causes.push(unsupported(
            "spec.updateStrategy.type",
            other,
            "\"OnDelete\", \"RollingUpdate\"",
        )),
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
        number(
            "Desired",
            "The total number of nodes that should be running the daemon pod (including nodes \
             correctly running the daemon pod).",
        ),
        number(
            "Current",
            "The number of nodes that are running at least 1 daemon pod and are supposed to run \
             the daemon pod.",
        ),
        number(
            "Ready",
            "numberReady is the number of nodes that should be running the daemon pod and have \
             one or more of the daemon pod running with a Ready Condition.",
        ),
        number(
            "Up-to-date",
            "The total number of nodes that are running updated daemon pod",
        ),
        number(
            "Available",
            "The number of nodes that should be running the daemon pod and have one or more of \
             the daemon pod running and available (ready for at least spec.minReadySeconds)",
        ),
        col(
            "Node Selector",
            "NodeSelector is a selector which must be true for the pod to fit on a node. \
             Selector which must match a node's labels for the pod to be scheduled on that node.",
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
            "A label query over pods that are managed by the daemon set. Must match in order to \
             be controlled. It must match the pod template's labels.",
            1,
        ),
    ]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    use crate::table::cells::*;
    let [names, images] = super::template_containers(&object["spec"]["template"]);
    let node_selector = object
        .pointer("/spec/template/spec/nodeSelector")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let selector = LabelSelector::from_api(&object["spec"]["selector"], "spec.selector")
        .map(|s| s.to_string())
        .unwrap_or_default();
    let status = |field: &str| json!(int(object, &["status", field]));
    vec![
        name(object),
        status("desiredNumberScheduled"),
        status("currentNumberScheduled"),
        status("numberReady"),
        status("updatedNumberScheduled"),
        status("numberAvailable"),
        json!(or_none(node_selector)),
        age(object, now),
        names,
        images,
        json!(or_none(selector)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn daemon_set(strategy: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
            "spec": {"selector": {"matchLabels": {"app": "agent"}}, "updateStrategy": strategy,
                "template": {"metadata": {"labels": {"app": "agent"}},
                    "spec": {"nodeSelector": {"disk": "ssd"}, "containers": [{"name": "c", "image": "busybox"}]}}}})
    }

    #[test]
    fn defaults_validation_and_table() {
        let mut object = daemon_set(json!({}));
        object["spec"]
            .as_object_mut()
            .unwrap()
            .remove("updateStrategy");
        defaults(&mut object);
        assert_eq!(
            object["spec"]["updateStrategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}})
        );
        assert_eq!(object["spec"]["revisionHistoryLimit"], 10);
        assert!(
            validate(&object, None).is_empty(),
            "{:?}",
            validate(&object, None)
        );
        let on_delete = daemon_set(json!({"type": "OnDelete"}));
        assert!(validate(&on_delete, None).is_empty());
        let bad = daemon_set(json!({"type": "Sometimes"}));
        assert!(validate(&bad, None)[0]
            .display()
            .starts_with("spec.updateStrategy.type: Unsupported value: \"Sometimes\""));
        let zero = daemon_set(
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 0}}),
        );
        assert!(validate(&zero, None)[0]
            .display()
            .contains("may not be 0 when `maxSurge` is 0"));
        let row = cells(&object, 0);
        assert_eq!(row[6], "disk=ssd");
        assert_eq!(row[10], "app=agent");
    }
}
