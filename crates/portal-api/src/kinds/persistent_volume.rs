//! PersistentVolumes (core `v1`, cluster-scoped, `pv`): a piece of storage
//! (a node's directory for the built-in local-path provisioner, or any
//! source an administrator names), bound one-to-one to a claim
//! (`spec.claimRef`), released when the claim goes and then kept or
//! deleted as `persistentVolumeReclaimPolicy` says. The access-mode and
//! size rules claims share live here too.

use serde_json::{json, Value};

use super::replace_lists;
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::service::validate::unsupported;
use crate::table::cells::*;
use crate::table::{col, Column, AGE, NAME};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("", "PersistentVolume");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "persistentvolumes",
    singular: "persistentvolume",
    kind_name: KIND.name,
    namespaced: false,
    short_names: &["pv"],
    categories: &[],
    has_status: true,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::core::v1::PersistentVolume>,
    openapi_schema: openapi_schema::<k8s_openapi::api::core::v1::PersistentVolume>,
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

const ACCESS_MODES: [&str; 4] = [
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];
const ACCESS_MODES_TEXT: &str =
    "\"ReadOnlyMany\", \"ReadWriteMany\", \"ReadWriteOnce\", \"ReadWriteOncePod\"";
const VOLUME_MODES: &str = "\"Block\", \"Filesystem\"";
const RECLAIM_POLICIES: &str = "\"Delete\", \"Recycle\", \"Retain\"";

/// `Retain` and `Filesystem` unless given.
fn defaults(object: &mut Value) {
    let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    spec.entry("persistentVolumeReclaimPolicy")
        .or_insert_with(|| json!("Retain"));
    spec.entry("volumeMode")
        .or_insert_with(|| json!("Filesystem"));
}

/// A new volume is `Pending` until the binder looks at it.
fn prepare_create(object: &mut Value) {
    object["status"] = json!({"phase": "Pending"});
}

/// The access modes at `path`: at least one, each known; ReadWriteOncePod
/// alone.
pub(crate) fn access_mode_causes(modes: &Value, path: &str) -> Vec<Cause> {
    let modes = modes.as_array().map_or(&[][..], Vec::as_slice);
    let mut causes = Vec::new();
    if modes.is_empty() {
        causes.push(Cause::required(path, ""));
    }
    for mode in modes {
        let text = mode.as_str().unwrap_or("");
        if !ACCESS_MODES.contains(&text) {
            causes.push(unsupported(path, text, ACCESS_MODES_TEXT));
        }
    }
    if modes.len() > 1 && modes.iter().any(|m| m == "ReadWriteOncePod") {
        causes.push(Cause::forbidden(
            path,
            "may not use ReadWriteOncePod with other access modes",
        ));
    }
    causes
}

/// A storage size at `path` (`spec.capacity`, `spec.resources.requests`):
/// present and above zero.
pub(crate) fn storage_causes(map: &Value, path: &str) -> Vec<Cause> {
    match map.get("storage") {
        None | Some(Value::Null) => vec![Cause::required(&format!("{path}[storage]"), "")],
        Some(quantity) => {
            let bytes = match quantity {
                Value::String(text) => crate::quantity::bytes(text),
                Value::Number(n) => n.as_i64(),
                _ => None,
            };
            if bytes.is_some_and(|b| b > 0) {
                Vec::new()
            } else {
                vec![Cause::invalid(
                    &format!("{path}[storage]"),
                    quantity.clone(),
                    "must be greater than zero",
                )]
            }
        }
    }
}

pub(crate) fn volume_mode_causes(spec: &Value, path: &str) -> Vec<Cause> {
    match spec["volumeMode"].as_str() {
        None | Some("Filesystem" | "Block") => Vec::new(),
        Some(other) => vec![unsupported(path, other, VOLUME_MODES)],
    }
}

/// The volume sources a PersistentVolume may name (one of them).
const SOURCES: [&str; 22] = [
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "csi",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "glusterfs",
    "hostPath",
    "iscsi",
    "local",
    "nfs",
    "photonPersistentDisk",
    "portworxVolume",
    "quobyte",
    "rbd",
    "scaleIO",
    "storageos",
    "vsphereVolume",
];

/// Upstream's `ValidatePersistentVolume` (the parts a user meets).
fn validate(object: &Value, old: Option<&Value>) -> Vec<Cause> {
    let spec = &object["spec"];
    let mut causes = access_mode_causes(&spec["accessModes"], "spec.accessModes");
    if spec["capacity"].is_null() {
        causes.push(Cause::required("spec.capacity", ""));
    } else {
        causes.extend(storage_causes(&spec["capacity"], "spec.capacity"));
    }
    let sources: Vec<&str> = SOURCES
        .iter()
        .copied()
        .filter(|s| !spec[*s].is_null())
        .collect();
    match sources.as_slice() {
        [] => causes.push(Cause::required("spec", "must specify a volume type")),
        [_] => {}
        _ => causes.push(Cause::forbidden(
            "spec",
            "may not specify more than 1 volume type",
        )),
    }
    if !spec["hostPath"].is_null() && spec["hostPath"]["path"].as_str().unwrap_or("").is_empty() {
        causes.push(Cause::required("spec.hostPath.path", ""));
    }
    if !spec["local"].is_null() {
        if spec["local"]["path"].as_str().unwrap_or("").is_empty() {
            causes.push(Cause::required("spec.local.path", ""));
        }
        if spec["nodeAffinity"].is_null() {
            causes.push(Cause::required(
                "spec.nodeAffinity",
                "Local volume requires node affinity",
            ));
        }
    }
    match spec["persistentVolumeReclaimPolicy"].as_str() {
        None | Some("Retain" | "Delete" | "Recycle") => {}
        Some(other) => causes.push(unsupported(
            "spec.persistentVolumeReclaimPolicy",
            other,
            RECLAIM_POLICIES,
        )),
    }
    causes.extend(volume_mode_causes(spec, "spec.volumeMode"));
    if let Some(class) = spec["storageClassName"].as_str().filter(|c| !c.is_empty()) {
        for problem in crate::name::dns1123_subdomain(class) {
            causes.push(Cause::invalid("spec.storageClassName", class, &problem));
        }
    }
    if let Some(old) = old {
        let old_spec = &old["spec"];
        for source in SOURCES {
            if !old_spec[source].is_null() && old_spec[source] != spec[source] {
                causes.push(Cause::forbidden(
                    "spec.persistentvolumesource",
                    "spec.persistentvolumesource is immutable after creation",
                ));
                break;
            }
        }
        if old_spec["volumeMode"] != spec["volumeMode"] {
            causes.push(Cause::invalid(
                "spec.volumeMode",
                spec["volumeMode"].clone(),
                "field is immutable",
            ));
        }
        if !old_spec["nodeAffinity"].is_null() && old_spec["nodeAffinity"] != spec["nodeAffinity"] {
            causes.push(Cause::invalid_rendered(
                "spec.nodeAffinity",
                "\"…\"",
                "field is immutable",
            ));
        }
    }
    causes
}

/// `RWO,ROX`, as kubectl abbreviates access modes.
pub(crate) fn access_modes_text(modes: &[Value]) -> String {
    modes
        .iter()
        .filter_map(Value::as_str)
        .map(|mode| match mode {
            "ReadWriteOnce" => "RWO",
            "ReadOnlyMany" => "ROX",
            "ReadWriteMany" => "RWX",
            "ReadWriteOncePod" => "RWOP",
            other => other,
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn columns() -> Vec<Column> {
    vec![
        NAME,
        col("Capacity", "The storage capacity of the volume.", 0),
        col("Access Modes", "Modes the volume can be mounted with.", 0),
        col(
            "Reclaim Policy",
            "What happens to the volume once released.",
            0,
        ),
        col("Status", "Where the volume is in its life.", 0),
        col("Claim", "The claim bound to the volume.", 0),
        col("StorageClass", "The class of the volume.", 0),
        col(
            "VolumeAttributesClass",
            "The attributes class of the volume.",
            0,
        ),
        col("Reason", "Why the volume is in its phase.", 0),
        AGE,
        col("VolumeMode", "Filesystem or Block.", 1),
    ]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    let spec = &object["spec"];
    let claim = match (
        s(spec, &["claimRef", "namespace"]),
        s(spec, &["claimRef", "name"]),
    ) {
        (Some(namespace), Some(name)) => format!("{namespace}/{name}"),
        _ => String::new(),
    };
    vec![
        name(object),
        json!(s(spec, &["capacity", "storage"]).unwrap_or("")),
        json!(access_modes_text(arr(spec, &["accessModes"]))),
        json!(s(spec, &["persistentVolumeReclaimPolicy"]).unwrap_or("")),
        json!(s(object, &["status", "phase"]).unwrap_or("")),
        json!(claim),
        json!(s(spec, &["storageClassName"]).unwrap_or("")),
        json!(s(spec, &["volumeAttributesClassName"]).unwrap_or("<unset>")),
        json!(s(object, &["status", "reason"]).unwrap_or("")),
        age(object, now),
        json!(s(spec, &["volumeMode"]).unwrap_or("")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volumes_need_modes_a_size_and_one_source() {
        let fields = |object: Value| -> Vec<String> {
            validate(&object, None)
                .into_iter()
                .map(|c| c.field)
                .collect()
        };
        assert_eq!(
            fields(json!({"spec": {}})),
            ["spec.accessModes", "spec.capacity", "spec"]
        );
        assert_eq!(
            fields(
                json!({"spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "0"},
                "local": {"path": "/d"}}})
            ),
            ["spec.capacity[storage]", "spec.nodeAffinity"]
        );
        assert!(fields(
            json!({"spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
            "hostPath": {"path": "/d"}, "persistentVolumeReclaimPolicy": "Delete"}})
        )
        .is_empty());
    }

    #[test]
    fn access_modes_print_short() {
        assert_eq!(
            access_modes_text(&[json!("ReadWriteOnce"), json!("ReadOnlyMany")]),
            "RWO,ROX"
        );
    }
}
