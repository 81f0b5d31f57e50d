//! Which volume a claim may have, as the PV controller's binder decides:
//! a volume already promised to the claim (`claimRef`), else the smallest
//! available one of the claim's class that offers its access modes, size,
//! volume mode, labels (`selector`) and, once a node is chosen for the
//! claim's first pod, that node. Pure functions.

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use kube::ResourceExt;

/// The annotation the scheduler puts on a claim whose class waits for the
/// first consumer: the node its volume must be reachable from.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// Bytes of a `storage` quantity in a map.
pub fn storage_of(
    map: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
) -> Option<i64> {
    map.and_then(|m| m.get("storage"))
        .and_then(|q| portal_api::quantity::bytes(&q.0))
}

/// The class a claim asks for: `""` means none (only volumes without a
/// class), as Kubernetes reads `storageClassName`.
pub fn class_of_claim(claim: &PersistentVolumeClaim) -> &str {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or("")
}

fn class_of_volume(volume: &PersistentVolume) -> &str {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or("")
}

/// Whether `volume` is promised to `claim` (its `claimRef` names it, by
/// UID when the reference has one).
pub fn promised_to(volume: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    let Some(reference) = volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return false;
    };
    reference.name.as_deref() == Some(claim.name_any().as_str())
        && reference.namespace == claim.namespace()
        && reference
            .uid
            .as_ref()
            .is_none_or(|uid| Some(uid) == claim.metadata.uid.as_ref())
}

/// Whether an unpromised `volume` satisfies `claim` (on `node`, when one
/// is chosen).
pub fn satisfies(
    volume: &PersistentVolume,
    claim: &PersistentVolumeClaim,
    node: Option<&Node>,
) -> bool {
    let (Some(spec), Some(wanted)) = (volume.spec.as_ref(), claim.spec.as_ref()) else {
        return false;
    };
    if spec.claim_ref.is_some() || volume.metadata.deletion_timestamp.is_some() {
        return false;
    }
    if class_of_volume(volume) != class_of_claim(claim) {
        return false;
    }
    let offered = spec.access_modes.as_deref().unwrap_or_default();
    if !wanted
        .access_modes
        .iter()
        .flatten()
        .all(|mode| offered.contains(mode))
    {
        return false;
    }
    let mode = |m: Option<&String>| m.map_or("Filesystem", String::as_str).to_owned();
    if mode(spec.volume_mode.as_ref()) != mode(wanted.volume_mode.as_ref()) {
        return false;
    }
    let asked =
        storage_of(wanted.resources.as_ref().and_then(|r| r.requests.as_ref())).unwrap_or(0);
    if storage_of(spec.capacity.as_ref()).unwrap_or(0) < asked {
        return false;
    }
    if let Some(selector) = &wanted.selector {
        let selected = crate::label_selector(selector)
            .is_some_and(|s| s.matches(|k| volume.labels().get(k).map(String::as_str)));
        if !selected {
            return false;
        }
    }
    node.is_none_or(|node| reachable_from(volume, node))
}

/// Whether `volume`'s node affinity lets `node` use it.
pub fn reachable_from(volume: &PersistentVolume, node: &Node) -> bool {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .is_none_or(|selector| crate::placement::node_selector_matches(selector, node))
}

/// The volume for `claim`: the one promised to it, else the smallest that
/// satisfies it.
pub fn find<'a>(
    volumes: &'a [std::sync::Arc<PersistentVolume>],
    claim: &PersistentVolumeClaim,
    node: Option<&Node>,
) -> Option<&'a PersistentVolume> {
    if let Some(promised) = volumes.iter().find(|v| promised_to(v, claim)) {
        return Some(promised);
    }
    volumes
        .iter()
        .filter(|v| satisfies(v, claim, node))
        .min_by_key(|v| {
            (
                storage_of(v.spec.as_ref().and_then(|s| s.capacity.as_ref())).unwrap_or(0),
                v.name_any(),
            )
        })
        .map(|v| v.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    fn volume(name: &str, size: &str, extra: serde_json::Value) -> Arc<PersistentVolume> {
        let mut value = json!({"metadata": {"name": name, "labels": {"tier": "fast"}},
            "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
                     "hostPath": {"path": "/d"}, "storageClassName": "manual"}});
        for (k, v) in extra.as_object().unwrap() {
            value["spec"][k] = v.clone();
        }
        Arc::new(serde_json::from_value(value).unwrap())
    }

    fn claim(extra: serde_json::Value) -> PersistentVolumeClaim {
        let mut value = json!({"metadata": {"name": "data", "namespace": "default", "uid": "c-1"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                     "storageClassName": "manual"}});
        for (k, v) in extra.as_object().unwrap() {
            value["spec"][k] = v.clone();
        }
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_smallest_fitting_volume_wins() {
        let volumes = [
            volume("big", "10Gi", json!({})),
            volume("small", "2Gi", json!({})),
            volume("tiny", "512Mi", json!({})),
            volume("other-class", "1Gi", json!({"storageClassName": "slow"})),
            volume(
                "taken",
                "1Gi",
                json!({"claimRef": {"name": "x", "namespace": "default"}}),
            ),
        ];
        assert_eq!(
            find(&volumes, &claim(json!({})), None).unwrap().name_any(),
            "small"
        );
        let many = claim(json!({"accessModes": ["ReadWriteMany"]}));
        assert!(find(&volumes, &many, None).is_none());
        let labelled = claim(json!({"selector": {"matchLabels": {"tier": "slow"}}}));
        assert!(find(&volumes, &labelled, None).is_none());
    }

    #[test]
    fn a_promised_volume_and_node_affinity() {
        let promised = volume(
            "mine",
            "1Gi",
            json!({"claimRef": {"name": "data", "namespace": "default", "uid": "c-1"}}),
        );
        let volumes = [volume("free", "1Gi", json!({})), promised];
        assert_eq!(
            find(&volumes, &claim(json!({})), None).unwrap().name_any(),
            "mine"
        );
        let pinned = volume(
            "pinned",
            "1Gi",
            json!({"nodeAffinity": {"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}}),
        );
        let node = |name: &str| -> Node {
            serde_json::from_value(
                json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}),
            )
            .unwrap()
        };
        assert!(satisfies(&pinned, &claim(json!({})), Some(&node("n1"))));
        assert!(!satisfies(&pinned, &claim(json!({})), Some(&node("n2"))));
    }
}
