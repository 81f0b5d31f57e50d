//! What server-side apply needs of the kinds' schemas: how each list
//! merges (`x-kubernetes-list-type`, `x-kubernetes-list-map-keys`), which
//! objects are maps rather than structs, and the fields nobody owns.
//! Lists follow the strategic-merge table of each kind (its merge keys are
//! the list-map keys), with the few places where Kubernetes keys a list by
//! more fields than it merges it by.

use serde_json::Value;

use crate::schema::{ListStrategy, Resource};

/// How a list's items are told apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListType {
    /// Owned and replaced whole.
    Atomic,
    /// Scalars, each owned on its own.
    Set,
    /// Objects keyed by these fields, each owned on its own.
    Map(&'static [&'static str]),
}

/// The list at `path` (field names, items skipped) in an object of `kind`.
pub fn list_type(resource: &Resource, path: &[&str]) -> ListType {
    if let Some(custom) = resource.custom {
        // A defined kind's schema says it all (`x-kubernetes-list-type`).
        if let Some(keys) = custom.list_map_keys(path) {
            return ListType::Map(keys);
        }
        return match custom.list_strategy(path) {
            ListStrategy::MergePrimitives => ListType::Set,
            _ => ListType::Atomic,
        };
    }
    if let Some((_, keys)) = resource.list_map_keys.iter().find(|(at, _)| *at == path) {
        return ListType::Map(keys);
    }
    match path {
        // Keyed by more than the strategic merge key (port numbers may be
        // shared by TCP and UDP).
        [.., "containers" | "initContainers" | "ephemeralContainers", "ports"] => {
            ListType::Map(&["containerPort", "protocol"])
        }
        [.., "topologySpreadConstraints"] => ListType::Map(&["topologyKey", "whenUnsatisfiable"]),
        ["spec", "taints"] => ListType::Atomic,
        _ => match resource.list_strategy(path) {
            ListStrategy::Replace => ListType::Atomic,
            ListStrategy::MergePrimitives => ListType::Set,
            ListStrategy::MergeKey(key) => ListType::Map(key_list(key)),
        },
    }
}

/// A one-field key as a static list.
fn key_list(key: &'static str) -> &'static [&'static str] {
    match key {
        "name" => &["name"],
        "type" => &["type"],
        "ip" => &["ip"],
        "uid" => &["uid"],
        "mountPath" => &["mountPath"],
        "devicePath" => &["devicePath"],
        "topologyKey" => &["topologyKey"],
        "key" => &["key"],
        "port" => &["port"],
        "containerPort" => &["containerPort"],
        // Every merge key of the served kinds is listed above; a new one
        // must be added there.
        _ => &[],
    }
}

/// The value a missing key field stands for (`protocol` defaults to TCP).
pub(crate) fn key_default(field: &str) -> Option<Value> {
    match field {
        "protocol" => Some(Value::String("TCP".into())),
        _ => None,
    }
}

/// Objects with free-form keys (owned as a whole and entry by entry), as
/// opposed to structs with named fields.
pub(crate) fn is_map(path: &[&str]) -> bool {
    matches!(
        path,
        [
            ..,
            "labels" | "annotations" | "nodeSelector" | "limits" | "requests"
        ] | [.., "capacity" | "allocatable" | "data"]
            | ["spec", "selector"]
    )
}
