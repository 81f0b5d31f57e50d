//! Patch strategies of list fields (`patchStrategy`/`patchMergeKey` in the
//! Kubernetes types) for the kinds Portal serves. Lists not named here are
//! replaced whole by a strategic merge patch, as upstream.

use crate::resource::Kind;

/// How a list field merges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ListStrategy {
    /// Replaced whole.
    Replace,
    /// Maps merged by this key.
    MergeKey(&'static str),
    /// Primitives merged as a set (e.g. `finalizers`).
    MergePrimitives,
}

/// Pod spec lists, relative to a `PodSpec`.
fn pod_spec(path: &[&str]) -> ListStrategy {
    use ListStrategy::*;
    match path {
        ["containers" | "initContainers" | "ephemeralContainers"] => MergeKey("name"),
        ["containers" | "initContainers", "ports"] => MergeKey("containerPort"),
        ["containers" | "initContainers", "env"] => MergeKey("name"),
        ["containers" | "initContainers", "volumeMounts"] => MergeKey("mountPath"),
        ["containers" | "initContainers", "volumeDevices"] => MergeKey("devicePath"),
        ["volumes" | "imagePullSecrets"] => MergeKey("name"),
        ["hostAliases"] => MergeKey("ip"),
        ["topologySpreadConstraints"] => MergeKey("topologyKey"),
        _ => Replace,
    }
}

/// The strategy of the list at `path` (object field names, list items
/// skipped) in an object of `kind`.
pub(super) fn list_strategy(kind: Kind, path: &[&str]) -> ListStrategy {
    use ListStrategy::*;
    match (kind, path) {
        (_, ["metadata", "finalizers"]) => MergePrimitives,
        (_, ["metadata", "ownerReferences"]) => MergeKey("uid"),
        (Kind::Service, ["spec", "ports"]) => MergeKey("port"),
        (Kind::Pod, ["spec", rest @ ..]) => pod_spec(rest),
        (Kind::Pod, ["status", "conditions"]) => MergeKey("type"),
        (Kind::Pod, ["status", "podIPs"]) => MergeKey("ip"),
        (Kind::ReplicationController, ["spec", "template", "metadata", "finalizers"]) => {
            MergePrimitives
        }
        (Kind::ReplicationController, ["spec", "template", "spec", rest @ ..]) => pod_spec(rest),
        (Kind::ReplicationController, ["status", "conditions"]) => MergeKey("type"),
        (Kind::Node, ["spec", "taints"]) => MergeKey("key"),
        (Kind::Node, ["status", "conditions" | "addresses"]) => MergeKey("type"),
        (Kind::Namespace, ["status", "conditions"]) => MergeKey("type"),
        _ => Replace,
    }
}
