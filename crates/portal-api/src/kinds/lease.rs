//! Leases (`coordination.k8s.io/v1`): node heartbeats and leader election.

use serde_json::{json, Value};

use super::{no_validation, nothing, replace_lists};
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::table::cells::*;
use crate::table::{col, Column, AGE, NAME};

/// The kind this module defines.
pub const KIND: Kind = Kind::new("coordination.k8s.io", "Lease");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "leases",
    singular: "lease",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &[],
    categories: &[],
    has_status: false,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::coordination::v1::Lease>,
    openapi_schema: openapi_schema::<k8s_openapi::api::coordination::v1::Lease>,
    defaults: nothing,
    validate: no_validation,
    prepare_create: nothing,
    kept_on_update: &[],
    generation: Generation::Untracked,
    create_on_update: false,
    selectable_fields: &[],
    field_paths: &[],
    field_defaults: &[],
    own_list_strategy: replace_lists,
    list_map_keys: &[],
    columns,
    cells,
    custom: None,
    subresources: &[],
};

fn columns() -> Vec<Column> {
    vec![NAME, col("Holder", "The holder of the lease.", 0), AGE]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    vec![
        name(object),
        json!(s(object, &["spec", "holderIdentity"]).unwrap_or("")),
        age(object, now),
    ]
}
