//! Endpoints: validated like upstream (`crate::service`), written blindly by
//! controllers (a PUT creates), printed as `kubectl get ep` does.

use serde_json::{json, Value};

use super::{nothing, replace_lists};
use crate::defaults::{array_mut, default};
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::table::cells::*;
use crate::table::{col, Column, AGE, NAME};

/// The kind this module defines.
pub const KIND: Kind = Kind::new("", "Endpoints");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "endpoints",
    singular: "endpoints",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &["ep"],
    categories: &[],
    has_status: false,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::core::v1::Endpoints>,
    openapi_schema: openapi_schema::<k8s_openapi::api::core::v1::Endpoints>,
    defaults,
    validate,
    prepare_create: nothing,
    kept_on_update: &[],
    generation: Generation::Untracked,
    create_on_update: true,
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
    for subset in array_mut(object, "subsets") {
        for port in array_mut(subset, "ports") {
            default(port, "protocol", json!("TCP"));
        }
    }
}

fn validate(object: &Value, _: Option<&Value>) -> Vec<crate::Cause> {
    crate::service::validate_endpoints(object)
}

fn columns() -> Vec<Column> {
    vec![NAME, col("Endpoints", "Endpoints of the service.", 0), AGE]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    vec![name(object), json!(endpoints(object)), age(object, now)]
}

/// `10.0.0.1:80,10.0.0.2:80,10.0.0.3:80 + 2 more...`
fn endpoints(object: &Value) -> String {
    const MAX: usize = 3;
    let mut list = Vec::new();
    let mut count = 0;
    for subset in arr(object, &["subsets"]) {
        let addresses: Vec<&str> = arr(subset, &["addresses"])
            .iter()
            .filter_map(|a| s(a, &["ip"]))
            .collect();
        let ports = arr(subset, &["ports"]);
        if ports.is_empty() {
            count += addresses.len();
            list.extend(addresses.iter().map(|ip| (*ip).to_owned()));
            continue;
        }
        for port in ports {
            count += addresses.len();
            let port = int(port, &["port"]);
            list.extend(addresses.iter().map(|ip| {
                if ip.contains(':') {
                    format!("[{ip}]:{port}")
                } else {
                    format!("{ip}:{port}")
                }
            }));
        }
    }
    if list.is_empty() {
        return NONE.into();
    }
    if count > MAX {
        list.truncate(MAX);
        return format!("{} + {} more...", list.join(","), count - MAX);
    }
    list.join(",")
}
