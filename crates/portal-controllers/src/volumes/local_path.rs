//! The built-in provisioner, `portal.dev/local-path` (k3s ships the same
//! idea as `rancher.io/local-path`): a claim's volume is a directory on the
//! node its first pod was scheduled to, under the root that node's agent
//! publishes (the `portal.dev/local-path-root` annotation), pinned to that
//! node by node affinity. The agent makes the directory when a pod mounts
//! it and removes it once the volume object is gone. The default
//! StorageClass, `local-path`, uses it and waits for the first consumer.

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use serde_json::json;

/// The provisioner's name, in StorageClasses and on the volumes it makes.
pub const PROVISIONER: &str = "portal.dev/local-path";
/// Where a node's agent keeps local-path volumes.
pub const ROOT_ANNOTATION: &str = "portal.dev/local-path-root";
/// The default class made at start when no class exists yet.
pub const DEFAULT_CLASS: &str = "local-path";

/// The default StorageClass.
pub fn default_class() -> StorageClass {
    serde_json::from_value(json!({
        "metadata": {"name": DEFAULT_CLASS, "annotations": {
            portal_api::kinds::storage_class::DEFAULT_ANNOTATION: "true"}},
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
    }))
    .unwrap_or_default()
}

/// The volume's name for a claim (upstream's `pvc-<claim uid>`).
pub fn volume_name(claim: &PersistentVolumeClaim) -> String {
    format!("pvc-{}", claim.metadata.uid.as_deref().unwrap_or_default())
}

/// The volume for `claim` of `class` on `node`, or why there cannot be one.
pub fn volume_for(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    node: &Node,
) -> Result<PersistentVolume, String> {
    let root = node
        .annotations()
        .get(ROOT_ANNOTATION)
        .filter(|r| r.starts_with('/'))
        .ok_or_else(|| {
            format!(
                "node {:?} has no local-path root (its agent publishes {ROOT_ANNOTATION})",
                node.name_any()
            )
        })?;
    let spec = claim.spec.clone().unwrap_or_default();
    if spec.volume_mode.as_deref() == Some("Block") {
        return Err(
            "local-path volumes are directories: Block volume mode is not supported".into(),
        );
    }
    let size = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .cloned()
        .ok_or("the claim requests no storage")?;
    let name = volume_name(claim);
    let namespace = claim.namespace().unwrap_or_default();
    let directory = format!(
        "{}/{name}_{namespace}_{}",
        root.trim_end_matches('/'),
        claim.name_any()
    );
    let hostname = node
        .labels()
        .get("kubernetes.io/hostname")
        .cloned()
        .unwrap_or_else(|| node.name_any());
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": spec.access_modes,
            "persistentVolumeReclaimPolicy": class.reclaim_policy.as_deref().unwrap_or("Delete"),
            "storageClassName": class.name_any(),
            "volumeMode": "Filesystem",
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": namespace,
                         "name": claim.name_any(), "uid": claim.metadata.uid},
            "hostPath": {"path": directory, "type": "DirectoryOrCreate"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [hostname]}]}]}},
        },
    }))
    .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volumes_live_under_the_nodes_root_and_stay_there() {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "shop", "uid": "u-1"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
        }))
        .unwrap();
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1",
            "labels": {"kubernetes.io/hostname": "n1"}, "annotations": {ROOT_ANNOTATION: "/var/lib/portal/storage/"}}}))
        .unwrap();
        let volume = volume_for(&claim, &default_class(), &node).unwrap();
        let spec = volume.spec.unwrap();
        assert_eq!(volume.metadata.name.as_deref(), Some("pvc-u-1"));
        assert_eq!(
            spec.host_path.unwrap().path,
            "/var/lib/portal/storage/pvc-u-1_shop_data"
        );
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Delete")
        );
        assert_eq!(spec.claim_ref.unwrap().uid.as_deref(), Some("u-1"));
        let bare: Node = serde_json::from_value(json!({"metadata": {"name": "n2"}})).unwrap();
        assert!(volume_for(&claim, &default_class(), &bare).is_err());
    }
}
