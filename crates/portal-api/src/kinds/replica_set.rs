//! ReplicaSets (`apps/v1`): a label selector that must be given and must
//! select the template's labels (and never changes), the template's pod
//! spec defaulted and merged like a pod's, a `scale` subresource.

use serde_json::{json, Value};

use super::Subresource;
use crate::defaults::default;
use crate::schema::{openapi_schema, typed, Generation, Kind, ListStrategy, NameRule, Resource};
use crate::selector::LabelSelector;
use crate::table::Column;
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("apps", "ReplicaSet");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "replicasets",
    singular: "replicaset",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &["rs"],
    categories: &["all"],
    has_status: true,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::apps::v1::ReplicaSet>,
    openapi_schema: openapi_schema::<k8s_openapi::api::apps::v1::ReplicaSet>,
    defaults,
    validate,
    prepare_create,
    kept_on_update: &[],
    generation: Generation::Spec,
    create_on_update: false,
    selectable_fields: &["status.replicas"],
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

/// The selector as given (errors name `spec.selector`).
pub fn selector(object: &Value) -> Result<LabelSelector, String> {
    LabelSelector::from_api(&object["spec"]["selector"], "spec.selector")
}

fn validate(object: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = validate_selector_and_template(object, old, "ReplicaSet");
    if object["spec"]["replicas"].as_i64().is_some_and(|n| n < 0) {
        causes.push(Cause::invalid(
            "spec.replicas",
            object["spec"]["replicas"].clone(),
            "must be greater than or equal to 0",
        ));
    }
    causes
}

/// What every `apps/v1` workload checks: the selector, against the
/// template (and, on update, against the stored one: `apps/v1` selectors
/// are immutable), and the template's pod spec as a pod's (when it
/// changes: a status write never fails on what was stored before), with
/// `restartPolicy: Always` and no `activeDeadlineSeconds` (`kind` names the
/// workload in that message, as upstream's).
pub(crate) fn validate_selector_and_template(
    object: &Value,
    old: Option<&Value>,
    kind: &str,
) -> Vec<Cause> {
    let mut causes = Vec::new();
    let given = &object["spec"]["selector"];
    match selector(object) {
        Err(message) => {
            let (field, detail) = message
                .split_once(": ")
                .unwrap_or(("spec.selector", &message));
            causes.push(Cause::invalid_rendered(field, "", detail));
        }
        Ok(_) if given.is_null() => causes.push(Cause::required("spec.selector", "")),
        Ok(parsed) if parsed.is_empty() => causes.push(Cause::invalid_rendered(
            "spec.selector",
            "v1.LabelSelector{MatchLabels:map[string]string(nil), \
             MatchExpressions:[]v1.LabelSelectorRequirement(nil)}",
            // Upstream's ReplicaSets (and so Deployments) say "deployment".
            &format!(
                "empty selector is invalid for {}",
                match kind {
                    "ReplicaSet" => "deployment".to_owned(),
                    other => other.to_ascii_lowercase(),
                }
            ),
        )),
        Ok(parsed) => {
            let labels = &object["spec"]["template"]["metadata"]["labels"];
            let get = |key: &str| labels.get(key).and_then(Value::as_str);
            if !parsed.matches(get) {
                causes.push(Cause::invalid(
                    "spec.template.metadata.labels",
                    labels.clone(),
                    "`selector` does not match template `labels`",
                ));
            }
        }
    }
    if let Some(old) = old {
        if old["spec"]["selector"] != *given {
            causes.push(Cause::invalid(
                "spec.selector",
                given.clone(),
                "field is immutable",
            ));
        }
    }
    let template = &object["spec"]["template"]["spec"];
    let unchanged = old.is_some_and(|old| old["spec"]["template"]["spec"] == *template);
    if !template.is_null() && !unchanged {
        causes.extend(crate::pod_spec::validate(template, "spec.template.spec"));
        let restart = template["restartPolicy"].as_str().unwrap_or("Always");
        if restart != "Always" {
            causes.push(crate::service::validate::unsupported(
                "spec.template.spec.restartPolicy",
                restart,
                "\"Always\"",
            ));
        }
        if !template["activeDeadlineSeconds"].is_null() {
            causes.push(Cause::forbidden(
                "spec.template.spec.activeDeadlineSeconds",
                &format!("activeDeadlineSeconds in {kind} is not Supported"),
            ));
        }
    }
    causes
}

fn prepare_create(object: &mut Value) {
    object["status"] = json!({"replicas": 0});
}

fn list_strategy(path: &[&str]) -> ListStrategy {
    match path {
        ["spec", "template", "metadata", "finalizers"] => ListStrategy::MergePrimitives,
        ["spec", "template", "spec", rest @ ..] => super::pod::spec_list_strategy(rest),
        ["status", "conditions"] => ListStrategy::MergeKey("type"),
        _ => ListStrategy::Replace,
    }
}

fn defaults(object: &mut Value) {
    let Some(spec) = object.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    default(spec, "replicas", json!(1));
    default(spec, "minReadySeconds", json!(0));
    if let Some(pod) = object.pointer_mut("/spec/template/spec") {
        super::pod::spec_defaults(pod);
    }
}

fn columns() -> Vec<Column> {
    super::replicas_columns()
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    super::replicas_cells(
        object,
        now,
        selector(object).map(|s| s.to_string()).unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rs(selector: Value, labels: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web"},
            "spec": {"selector": selector, "template": {"metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}})
    }

    #[test]
    fn the_selector_is_required_selects_the_template_and_never_changes() {
        let good = rs(
            json!({"matchLabels": {"app": "web"}}),
            json!({"app": "web", "x": "y"}),
        );
        assert!(
            validate(&good, None).is_empty(),
            "{:?}",
            validate(&good, None)
        );
        let mut missing = rs(json!({}), json!({"app": "web"}));
        assert!(validate(&missing, None)[0]
            .display()
            .ends_with("empty selector is invalid for deployment"));
        missing["spec"].as_object_mut().unwrap().remove("selector");
        assert_eq!(
            validate(&missing, None)[0].display(),
            "spec.selector: Required value"
        );
        let mismatch = rs(
            json!({"matchLabels": {"app": "api"}}),
            json!({"app": "web"}),
        );
        assert!(validate(&mismatch, None)[0]
            .display()
            .contains("`selector` does not match template `labels`"));
        let changed = rs(
            json!({"matchLabels": {"x": "y"}}),
            json!({"app": "web", "x": "y"}),
        );
        assert!(validate(&changed, Some(&good))
            .iter()
            .any(|c| c.display().contains("field is immutable")));
    }

    #[test]
    fn defaults_and_table() {
        let mut object = rs(
            json!({"matchLabels": {"app": "web"}}),
            json!({"app": "web"}),
        );
        defaults(&mut object);
        assert_eq!(object["spec"]["replicas"], 1);
        let row = cells(&object, 0);
        assert_eq!(row[1], 1);
        assert_eq!(row[7], "app=web");
    }
}
