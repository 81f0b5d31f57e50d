//! The built-in kinds: one module per kind holding everything Portal knows
//! about it, the way Kubernetes keeps `pkg/registry/<group>/<kind>/strategy.go`
//! — its [`Resource`](crate::schema::Resource) value (names, typed decoding,
//! defaults, validation, what the server sets on create and keeps on update,
//! field selectors, strategic-merge keys, table columns and cells,
//! subresources) and its [`Kind`](crate::schema::Kind).
//!
//! Adding a kind: a module here with its `KIND` and `RESOURCE`, and its
//! line in [`crate::registry`]'s built-in list. Nothing else names it.

pub mod api_service;
pub mod certificate_signing_request;
pub mod cluster_role;
pub mod cluster_role_binding;
pub mod config_map;
pub mod controller_revision;
pub mod cron_job;
pub mod custom_resource_definition;
pub mod daemon_set;
pub mod deployment;
pub mod endpoint_slice;
pub mod endpoints;
pub mod event;
pub mod events_event;
pub mod horizontal_pod_autoscaler;
pub mod horizontal_pod_autoscaler_v1;
pub mod ingress;
pub mod ingress_class;
pub mod ip_address;
pub mod job;
pub mod lease;
pub mod mutating_webhook_configuration;
pub mod namespace;
pub mod network_policy;
pub mod node;
pub mod persistent_volume;
pub mod persistent_volume_claim;
pub mod pod;
pub mod pod_disruption_budget;
pub mod replica_set;
pub mod replication_controller;
pub mod role;
pub mod role_binding;
pub mod secret;
pub mod service;
pub mod service_account;
pub mod service_cidr;
pub mod stateful_set;
pub mod storage_class;
pub mod validating_admission_policy;
pub mod validating_admission_policy_binding;
pub mod validating_webhook_configuration;

use serde_json::Value;

use crate::schema::ListStrategy;
pub(crate) use crate::schema::Subresource;
use crate::Cause;

/// Verbs of the proxy subresources.
const PROXY_VERBS: &[&str] = &["create", "delete", "get", "patch", "update"];

/// The columns of the kinds that keep replicas of a pod template
/// (ReplicationControllers, ReplicaSets), as kubectl shows them.
fn replicas_columns() -> Vec<crate::table::Column> {
    use crate::table::{col, Column, AGE, NAME};
    vec![
        NAME,
        Column {
            kind: "integer",
            ..col("Desired", "Number of desired pods.", 0)
        },
        Column {
            kind: "integer",
            ..col("Current", "Number of actually running pods.", 0)
        },
        Column {
            kind: "integer",
            ..col("Ready", "Number of pods ready.", 0)
        },
        AGE,
        col("Containers", "Names of each container in the template.", 1),
        col(
            "Images",
            "Images referenced by each container in the template.",
            1,
        ),
        col("Selector", "Label selector for pods.", 1),
    ]
}

/// Their cells, with the selector as the kind prints it.
fn replicas_cells(object: &Value, now: i64, selector: String) -> Vec<Value> {
    use crate::table::cells::*;
    use serde_json::json;
    let [names, images] = template_containers(&object["spec"]["template"]);
    vec![
        name(object),
        json!(object
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1)),
        json!(int(object, &["status", "replicas"])),
        json!(int(object, &["status", "readyReplicas"])),
        age(object, now),
        names,
        images,
        json!(or_none(selector)),
    ]
}

/// The wide columns of a pod template: its containers' names and images,
/// comma-separated.
fn template_containers(template: &Value) -> [Value; 2] {
    use crate::table::cells::*;
    let containers = arr(template, &["spec", "containers"]);
    let joined = |field: &str| {
        let values: Vec<&str> = containers.iter().filter_map(|c| s(c, &[field])).collect();
        serde_json::json!(values.join(","))
    };
    [joined("name"), joined("image")]
}

/// For kinds with no validation beyond metadata.
fn no_validation(_: &Value, _: Option<&Value>) -> Vec<Cause> {
    Vec::new()
}

/// For kinds with nothing to set on create or default.
fn nothing(_: &mut Value) {}

/// For kinds whose lists all merge by replacement (finalizers and owners
/// aside, which every kind shares).
fn replace_lists(_: &[&str]) -> ListStrategy {
    ListStrategy::Replace
}

/// For kinds whose only keyed list is `status.conditions` (by `type`).
fn conditions_by_type(path: &[&str]) -> ListStrategy {
    match path {
        ["status", "conditions"] => ListStrategy::MergeKey("type"),
        _ => ListStrategy::Replace,
    }
}

/// The `DATA` column of ConfigMaps and Secrets: how many keys they hold
/// (upstream types it a string, though it prints a number).
fn data_column() -> crate::table::Column {
    crate::table::col("Data", "Number of keys the object holds.", 0)
}
