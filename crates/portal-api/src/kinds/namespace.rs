//! Namespaces: cluster-scoped; the server labels each with its own name,
//! keeps its finalizers in `spec` (server-owned) and starts it Active.

use serde_json::{json, Value};

use super::{no_validation, nothing};
use crate::meta;
use crate::schema::{openapi_schema, typed, Generation, Kind, ListStrategy, NameRule, Resource};
use crate::table::cells::*;
use crate::table::{col, Column, AGE, NAME};

/// The kind this module defines.
pub const KIND: Kind = Kind::new("", "Namespace");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "namespaces",
    singular: "namespace",
    kind_name: KIND.name,
    namespaced: false,
    short_names: &["ns"],
    categories: &[],
    has_status: true,
    name_rule: NameRule::Label1123,
    decode: typed::<k8s_openapi::api::core::v1::Namespace>,
    openapi_schema: openapi_schema::<k8s_openapi::api::core::v1::Namespace>,
    defaults: nothing,
    validate: no_validation,
    prepare_create,
    kept_on_update: &["spec"],
    generation: Generation::Untracked,
    create_on_update: false,
    selectable_fields: &["status.phase"],
    field_paths: &[],
    field_defaults: &[],
    own_list_strategy: list_strategy,
    list_map_keys: &[],
    columns,
    cells,
    custom: None,
    subresources: &[],
};

fn prepare_create(object: &mut Value) {
    let name = meta::meta_str(object, "name")
        .unwrap_or_default()
        .to_owned();
    let labels = meta::metadata_mut(object)
        .entry("labels")
        .or_insert_with(|| json!({}));
    labels["kubernetes.io/metadata.name"] = Value::String(name);
    object["spec"] = json!({"finalizers": ["kubernetes"]});
    object["status"] = json!({"phase": "Active"});
}

fn list_strategy(path: &[&str]) -> ListStrategy {
    match path {
        ["status", "conditions"] => ListStrategy::MergeKey("type"),
        _ => ListStrategy::Replace,
    }
}

fn columns() -> Vec<Column> {
    vec![NAME, col("Status", "The status of the namespace", 0), AGE]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    vec![
        name(object),
        json!(s(object, &["status", "phase"]).unwrap_or("")),
        age(object, now),
    ]
}
