//! EndpointSlices (`discovery.k8s.io/v1`): ports defaulted to TCP, printed
//! as `kubectl get endpointslices` does.

use serde_json::{json, Value};

use super::{no_validation, nothing, replace_lists};
use crate::defaults::{array_mut, default};
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::table::cells::*;
use crate::table::{col, Column, AGE, NAME};

/// The kind this module defines.
pub const KIND: Kind = Kind::new("discovery.k8s.io", "EndpointSlice");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "endpointslices",
    singular: "endpointslice",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &[],
    categories: &[],
    has_status: false,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::discovery::v1::EndpointSlice>,
    openapi_schema: openapi_schema::<k8s_openapi::api::discovery::v1::EndpointSlice>,
    defaults,
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

fn defaults(object: &mut Value) {
    for port in array_mut(object, "ports") {
        default(port, "protocol", json!("TCP"));
    }
}

fn columns() -> Vec<Column> {
    vec![
        NAME,
        col("AddressType", "The IP protocol for this slice.", 0),
        col("Ports", "Enumerated ports on this slice.", 0),
        col("Endpoints", "Addresses of the endpoints in this slice.", 0),
        AGE,
    ]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    let ports: Vec<String> = arr(object, &["ports"])
        .iter()
        .map(|p| {
            p.get("port")
                .and_then(Value::as_i64)
                .map_or_else(|| "<unset>".to_owned(), |p| p.to_string())
        })
        .collect();
    let addresses: Vec<&str> = arr(object, &["endpoints"])
        .iter()
        .flat_map(|e| arr(e, &["addresses"]).iter().filter_map(Value::as_str))
        .collect();
    let endpoints = match addresses.len() {
        0 => "<none>".to_owned(),
        n if n > 3 => format!("{} + {} more...", addresses[..3].join(","), n - 3),
        _ => addresses.join(","),
    };
    vec![
        name(object),
        json!(s(object, &["addressType"]).unwrap_or("")),
        json!(if ports.is_empty() {
            "<unset>".to_owned()
        } else {
            ports.join(",")
        }),
        json!(endpoints),
        age(object, now),
    ]
}
