//! StorageClasses (`storage.k8s.io/v1`, cluster-scoped, `sc`): how claims
//! of a class get volumes: the provisioner that makes them, what happens
//! to them when released, and whether binding waits for the first pod
//! (`WaitForFirstConsumer`, so a node-local volume is made where the pod
//! runs). The one annotated `storageclass.kubernetes.io/is-default-class`
//! serves claims that name no class.

use serde_json::{json, Value};

use super::{nothing, replace_lists};
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::service::validate::unsupported;
use crate::table::cells::*;
use crate::table::{col, Column, AGE};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("storage.k8s.io", "StorageClass");

/// The annotation that makes a class the default.
pub const DEFAULT_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "storageclasses",
    singular: "storageclass",
    kind_name: KIND.name,
    namespaced: false,
    short_names: &["sc"],
    categories: &[],
    has_status: false,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::storage::v1::StorageClass>,
    openapi_schema: openapi_schema::<k8s_openapi::api::storage::v1::StorageClass>,
    defaults,
    validate,
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

/// `Delete` and `Immediate` unless given.
fn defaults(object: &mut Value) {
    if let Some(map) = object.as_object_mut() {
        map.entry("reclaimPolicy")
            .or_insert_with(|| json!("Delete"));
        map.entry("volumeBindingMode")
            .or_insert_with(|| json!("Immediate"));
    }
}

/// Upstream's `ValidateStorageClass` and its update rule.
fn validate(object: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    match object["provisioner"].as_str().unwrap_or("") {
        "" => causes.push(Cause::required("provisioner", "")),
        provisioner => {
            for problem in crate::name::qualified_name(&provisioner.to_lowercase()) {
                causes.push(Cause::invalid("provisioner", provisioner, &problem));
            }
        }
    }
    match object["reclaimPolicy"].as_str() {
        None | Some("Delete" | "Retain") => {}
        Some(other) => causes.push(unsupported(
            "reclaimPolicy",
            other,
            "\"Delete\", \"Retain\"",
        )),
    }
    match object["volumeBindingMode"].as_str() {
        None | Some("Immediate" | "WaitForFirstConsumer") => {}
        Some(other) => causes.push(unsupported(
            "volumeBindingMode",
            other,
            "\"Immediate\", \"WaitForFirstConsumer\"",
        )),
    }
    if let Some(old) = old {
        for field in ["parameters", "provisioner", "reclaimPolicy"] {
            if old[field] != object[field] {
                causes.push(Cause::forbidden(
                    field,
                    &format!("updates to {field} are forbidden."),
                ));
            }
        }
        if old["volumeBindingMode"] != object["volumeBindingMode"] {
            causes.push(Cause::invalid(
                "volumeBindingMode",
                object["volumeBindingMode"].clone(),
                "field is immutable",
            ));
        }
    }
    causes
}

/// Whether the class is the default one.
pub fn is_default(object: &Value) -> bool {
    object["metadata"]["annotations"][DEFAULT_ANNOTATION] == "true"
}

fn columns() -> Vec<Column> {
    vec![
        Column {
            format: "name",
            ..col("Name", "Name of the class.", 0)
        },
        col("Provisioner", "What makes its volumes.", 0),
        col("ReclaimPolicy", "What happens to released volumes.", 0),
        col("VolumeBindingMode", "When claims are bound.", 0),
        Column {
            kind: "boolean",
            ..col("AllowVolumeExpansion", "Whether claims may grow.", 0)
        },
        AGE,
    ]
}

/// `local-path (default)` for the default class, as kubectl shows it.
fn cells(object: &Value, now: i64) -> Vec<Value> {
    let mut shown = s(object, &["metadata", "name"]).unwrap_or("").to_owned();
    if is_default(object) {
        shown.push_str(" (default)");
    }
    vec![
        json!(shown),
        json!(s(object, &["provisioner"]).unwrap_or("")),
        json!(s(object, &["reclaimPolicy"]).unwrap_or("Delete")),
        json!(s(object, &["volumeBindingMode"]).unwrap_or("Immediate")),
        json!(object["allowVolumeExpansion"].as_bool().unwrap_or(false)),
        age(object, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_keep_how_they_provision() {
        let mut class = json!({"provisioner": "portal.dev/local-path"});
        defaults(&mut class);
        assert_eq!(class["reclaimPolicy"], "Delete");
        assert!(validate(&class, None).is_empty());
        let mut changed = class.clone();
        changed["reclaimPolicy"] = json!("Retain");
        changed["volumeBindingMode"] = json!("WaitForFirstConsumer");
        let fields: Vec<String> = validate(&changed, Some(&class))
            .into_iter()
            .map(|c| c.field)
            .collect();
        assert_eq!(fields, ["reclaimPolicy", "volumeBindingMode"]);
        assert_eq!(validate(&json!({}), None)[0].field, "provisioner");
    }
}
