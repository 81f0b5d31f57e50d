//! Nodes: cluster-scoped, registered by their agents; `kubectl get
//! nodes`' columns.

use serde_json::{json, Value};

use super::nothing;
use crate::schema::{openapi_schema, typed, Generation, Kind, ListStrategy, NameRule, Resource};
use crate::table::cells::*;
use crate::table::{col, Column, AGE, NAME};

/// The kind this module defines.
pub const KIND: Kind = Kind::new("", "Node");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "nodes",
    singular: "node",
    kind_name: KIND.name,
    namespaced: false,
    short_names: &["no"],
    categories: &[],
    has_status: true,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::core::v1::Node>,
    openapi_schema: openapi_schema::<k8s_openapi::api::core::v1::Node>,
    defaults: nothing,
    validate,
    prepare_create: nothing,
    kept_on_update: &[],
    generation: Generation::Untracked,
    create_on_update: false,
    selectable_fields: &["spec.unschedulable"],
    field_paths: &[],
    field_defaults: &[("spec.unschedulable", "false")],
    own_list_strategy: list_strategy,
    list_map_keys: &[],
    columns,
    cells,
    custom: None,
    subresources: &[],
};

/// Kubernetes' `ValidateNodeUpdate` for the pod range: it may be set once,
/// never changed (every node routes it; IPAM counts it taken).
fn validate(node: &Value, old: Option<&Value>) -> Vec<crate::Cause> {
    let Some(old) = old else {
        return Vec::new();
    };
    let ranges = |n: &Value| {
        let single = n["spec"]["podCIDR"].as_str().filter(|r| !r.is_empty());
        let many: Vec<String> = n["spec"]["podCIDRs"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        (single.map(str::to_owned), many)
    };
    let (old_single, old_many) = ranges(old);
    let (new_single, new_many) = ranges(node);
    let changed = (old_single.is_some() && old_single != new_single)
        || (!old_many.is_empty() && old_many != new_many);
    if changed {
        return vec![crate::Cause::forbidden(
            "spec.podCIDRs",
            "node updates may not change podCIDR except from \"\" to valid",
        )];
    }
    Vec::new()
}

fn list_strategy(path: &[&str]) -> ListStrategy {
    match path {
        ["spec", "taints"] => ListStrategy::MergeKey("key"),
        ["status", "conditions" | "addresses"] => ListStrategy::MergeKey("type"),
        _ => ListStrategy::Replace,
    }
}

fn columns() -> Vec<Column> {
    vec![
        NAME,
        col("Status", "The status of the node", 0),
        col("Roles", "The roles of the node", 0),
        AGE,
        col("Version", "Kubelet Version reported by the node.", 0),
        col("Internal-IP", "List of internal IPs.", 1),
        col("External-IP", "List of external IPs.", 1),
        col("OS-Image", "OS image reported by the node.", 1),
        col("Kernel-Version", "Kernel version reported by the node.", 1),
        col(
            "Container-Runtime",
            "Container runtime reported by the node.",
            1,
        ),
    ]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    let conditions = arr(object, &["status", "conditions"]);
    let ready = conditions.iter().find(|c| s(c, &["type"]) == Some("Ready"));
    let mut status = match ready.and_then(|c| s(c, &["status"])) {
        Some("True") => "Ready".to_owned(),
        Some("False") => "NotReady".to_owned(),
        _ => "Unknown".to_owned(),
    };
    if object
        .pointer("/spec/unschedulable")
        .and_then(Value::as_bool)
        == Some(true)
    {
        status.push_str(",SchedulingDisabled");
    }
    let mut roles: Vec<&str> = object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .keys()
                .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                .filter(|r| !r.is_empty())
                .collect()
        })
        .unwrap_or_default();
    roles.sort_unstable();
    let address = |kind: &str| {
        arr(object, &["status", "addresses"])
            .iter()
            .filter(|a| s(a, &["type"]) == Some(kind))
            .filter_map(|a| s(a, &["address"]))
            .collect::<Vec<_>>()
            .join(",")
    };
    let info = |field: &str| {
        s(object, &["status", "nodeInfo", field])
            .unwrap_or("")
            .to_owned()
    };
    vec![
        name(object),
        json!(status),
        json!(or_none(roles.join(","))),
        age(object, now),
        json!(info("kubeletVersion")),
        json!(or_none(address("InternalIP"))),
        json!(or_none(address("ExternalIP"))),
        json!(or_none(info("osImage"))),
        json!(or_none(info("kernelVersion"))),
        json!(or_none(info("containerRuntimeVersion"))),
    ]
}
