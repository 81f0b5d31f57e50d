//! ReplicationControllers: selector and labels defaulted from the
//! template, the template's pod spec defaulted and merged like a pod's, a
//! `scale` subresource (`autoscaling/v1` Scale).

use serde_json::{json, Value};

use super::Subresource;
use crate::defaults::default;
use crate::schema::{openapi_schema, typed, Generation, Kind, ListStrategy, NameRule, Resource};
use crate::table::cells::*;
use crate::table::Column;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("", "ReplicationController");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "replicationcontrollers",
    singular: "replicationcontroller",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &["rc"],
    categories: &["all"],
    has_status: true,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::core::v1::ReplicationController>,
    openapi_schema: openapi_schema::<k8s_openapi::api::core::v1::ReplicationController>,
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

/// The template's pod spec, as a pod's (checked when it changes: a status
/// write never fails on what was stored before).
fn validate(object: &Value, old: Option<&Value>) -> Vec<crate::Cause> {
    let template = &object["spec"]["template"]["spec"];
    let unchanged = old.is_some_and(|old| old["spec"]["template"]["spec"] == *template);
    if template.is_null() || unchanged {
        return Vec::new();
    }
    crate::pod_spec::validate(template, "spec.template.spec")
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
    let template_labels = spec.pointer("/template/metadata/labels").cloned();
    if let Some(labels) = template_labels.filter(|l| l.as_object().is_some_and(|m| !m.is_empty())) {
        let selector_empty = spec
            .get("selector")
            .and_then(Value::as_object)
            .is_none_or(|m| m.is_empty());
        if selector_empty {
            spec["selector"] = labels.clone();
        }
        let metadata = object
            .as_object_mut()
            .map(|o| o.entry("metadata").or_insert(json!({})));
        if let Some(metadata) = metadata {
            let labels_empty = metadata
                .get("labels")
                .and_then(Value::as_object)
                .is_none_or(|m| m.is_empty());
            if labels_empty {
                metadata["labels"] = labels;
            }
        }
    }
    if let Some(pod) = object.pointer_mut("/spec/template/spec") {
        super::pod::spec_defaults(pod);
    }
}

fn columns() -> Vec<Column> {
    super::replicas_columns()
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    super::replicas_cells(object, now, format_labels(object.pointer("/spec/selector")))
}
