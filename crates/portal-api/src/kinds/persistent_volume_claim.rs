//! PersistentVolumeClaims (core `v1`, `pvc`): a pod's request for storage
//! of a size, access modes and class. The binder gives it a volume
//! (`spec.volumeName`) once and for all; the rest of the spec never
//! changes but the requested size.

use serde_json::{json, Value};

use super::persistent_volume::{
    access_mode_causes, access_modes_text, storage_causes, volume_mode_causes,
};
use super::replace_lists;
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::table::cells::*;
use crate::table::{col, Column, AGE, NAME};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("", "PersistentVolumeClaim");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "persistentvolumeclaims",
    singular: "persistentvolumeclaim",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &["pvc"],
    categories: &[],
    has_status: true,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::core::v1::PersistentVolumeClaim>,
    openapi_schema: openapi_schema::<k8s_openapi::api::core::v1::PersistentVolumeClaim>,
    defaults,
    validate,
    prepare_create,
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

/// `Filesystem` unless given.
fn defaults(object: &mut Value) {
    if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) {
        spec.entry("volumeMode")
            .or_insert_with(|| json!("Filesystem"));
    }
}

/// A new claim is `Pending` until the binder gives it a volume.
fn prepare_create(object: &mut Value) {
    object["status"] = json!({"phase": "Pending"});
}

/// Upstream's `ValidatePersistentVolumeClaim` and its update rule.
fn validate(object: &Value, old: Option<&Value>) -> Vec<Cause> {
    let spec = &object["spec"];
    let mut causes = access_mode_causes(&spec["accessModes"], "spec.accessModes");
    causes.extend(storage_causes(
        &spec["resources"]["requests"],
        "spec.resources",
    ));
    causes.extend(volume_mode_causes(spec, "spec.volumeMode"));
    if let Some(class) = spec["storageClassName"].as_str().filter(|c| !c.is_empty()) {
        for problem in crate::name::dns1123_subdomain(class) {
            causes.push(Cause::invalid("spec.storageClassName", class, &problem));
        }
    }
    let Some(old) = old else {
        return causes;
    };
    // What may change: the requested size; the volume once (the binder);
    // the class once, when it had none (the default class, retroactively).
    let mut before = old["spec"].clone();
    let mut after = spec.clone();
    for side in [&mut before, &mut after] {
        if let Some(requests) = side
            .pointer_mut("/resources/requests")
            .and_then(Value::as_object_mut)
        {
            requests.remove("storage");
        }
    }
    let take = |before: &mut Value, field: &str| {
        if let (Some(map), Some(value)) = (before.as_object_mut(), after.get(field)) {
            map.insert(field.to_owned(), value.clone());
        }
    };
    if before["volumeName"].as_str().unwrap_or("").is_empty() {
        take(&mut before, "volumeName");
    }
    if before["storageClassName"].is_null() {
        take(&mut before, "storageClassName");
    }
    if before != after {
        causes.push(Cause::forbidden(
            "spec",
            "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
        ));
    }
    causes
}

fn columns() -> Vec<Column> {
    vec![
        NAME,
        col("Status", "Where the claim is in its life.", 0),
        col("Volume", "The volume bound to the claim.", 0),
        col("Capacity", "The storage capacity of the bound volume.", 0),
        col(
            "Access Modes",
            "Modes the bound volume can be mounted with.",
            0,
        ),
        col("StorageClass", "The class of the claim.", 0),
        col(
            "VolumeAttributesClass",
            "The attributes class of the claim.",
            0,
        ),
        AGE,
        col("VolumeMode", "Filesystem or Block.", 1),
    ]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    let spec = &object["spec"];
    vec![
        name(object),
        json!(s(object, &["status", "phase"]).unwrap_or("")),
        json!(s(spec, &["volumeName"]).unwrap_or("")),
        json!(s(object, &["status", "capacity", "storage"]).unwrap_or("")),
        json!(access_modes_text(arr(object, &["status", "accessModes"]))),
        json!(s(spec, &["storageClassName"]).unwrap_or("")),
        json!(s(spec, &["volumeAttributesClassName"]).unwrap_or("<unset>")),
        age(object, now),
        json!(s(spec, &["volumeMode"]).unwrap_or("")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> Value {
        json!({"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
            "volumeMode": "Filesystem"}})
    }

    #[test]
    fn claims_need_modes_and_a_size() {
        assert!(validate(&claim(), None).is_empty());
        let fields: Vec<String> = validate(&json!({"spec": {}}), None)
            .into_iter()
            .map(|c| c.field)
            .collect();
        assert_eq!(fields, ["spec.accessModes", "spec.resources[storage]"]);
    }

    #[test]
    fn only_size_volume_and_a_missing_class_change() {
        let old = claim();
        assert!(
            validate(&claim(), Some(&old)).is_empty(),
            "an unchanged spec"
        );
        let mut bound = claim();
        bound["spec"]["volumeName"] = json!("pv-1");
        bound["spec"]["storageClassName"] = json!("local-path");
        bound["spec"]["resources"]["requests"]["storage"] = json!("2Gi");
        assert!(validate(&bound, Some(&old)).is_empty());
        let mut rebound = bound.clone();
        rebound["spec"]["volumeName"] = json!("pv-2");
        assert_eq!(validate(&rebound, Some(&bound))[0].field, "spec");
        let mut modes = claim();
        modes["spec"]["accessModes"] = json!(["ReadWriteMany"]);
        assert_eq!(validate(&modes, Some(&old))[0].field, "spec");
    }
}
