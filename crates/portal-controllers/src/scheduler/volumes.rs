//! The scheduler's volume binding (upstream's `VolumeBinding` plugin): a
//! pod whose claims are missing, being deleted, or unbound in a class that
//! binds at once waits; a bound claim's volume must be reachable from the
//! node (its node affinity); a claim whose class waits for the first
//! consumer is given the chosen node (`volume.kubernetes.io/selected-node`)
//! and the pod is bound there once the claim is — a node-local volume is
//! made where its pod runs.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::ResourceExt;

use crate::volumes::binding;
pub use crate::volumes::binding::SELECTED_NODE;

/// What a pod's claims allow.
#[derive(Debug)]
pub enum Claims {
    /// No node will do until a claim changes; why, in upstream's words.
    Blocked(String),
    Ready {
        /// Volumes of bound claims: the node must reach each.
        bound: Vec<Arc<PersistentVolume>>,
        /// Claims to bind on the chosen node, and the node already chosen
        /// for one of them, if any.
        delayed: Vec<Arc<PersistentVolumeClaim>>,
        selected: Option<String>,
    },
}

/// The stores the check reads.
#[derive(Debug)]
pub struct Stores<'a> {
    pub claims: &'a Store<PersistentVolumeClaim>,
    pub volumes: &'a Store<PersistentVolume>,
    pub classes: &'a Store<StorageClass>,
}

/// The claims the pod's volumes name.
fn claim_names(pod: &Pod) -> impl Iterator<Item = &str> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.as_str())
}

/// What the pod's claims allow now.
pub fn check(pod: &Pod, stores: &Stores<'_>) -> Claims {
    let namespace = pod.namespace().unwrap_or_default();
    let mut bound = Vec::new();
    let mut delayed = Vec::new();
    let mut selected = None;
    for name in claim_names(pod) {
        let Some(claim) = stores.claims.get(&ObjectRef::new(name).within(&namespace)) else {
            return Claims::Blocked(format!("persistentvolumeclaim \"{name}\" not found"));
        };
        if claim.metadata.deletion_timestamp.is_some() {
            return Claims::Blocked(format!("persistentvolumeclaim \"{name}\" is being deleted"));
        }
        let volume_name = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .filter(|v| !v.is_empty());
        if let Some(volume_name) = volume_name {
            match stores.volumes.get(&ObjectRef::new(volume_name)) {
                Some(volume) => bound.push(volume),
                None => {
                    return Claims::Blocked(format!("persistentvolume \"{volume_name}\" not found"))
                }
            }
            continue;
        }
        let class = binding::class_of_claim(&claim);
        let waits = !class.is_empty()
            && stores
                .classes
                .get(&ObjectRef::new(class))
                .is_some_and(|c| c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"));
        if !waits {
            return Claims::Blocked("pod has unbound immediate PersistentVolumeClaims".into());
        }
        if let Some(node) = claim.annotations().get(SELECTED_NODE) {
            selected = Some(node.clone());
        }
        delayed.push(claim);
    }
    Claims::Ready {
        bound,
        delayed,
        selected,
    }
}

/// Why the node cannot take the pod's volumes, if it cannot.
pub fn misfit(claims: &Claims, node: &Node) -> Option<&'static str> {
    match claims {
        Claims::Blocked(_) => Some("pod's volumes are not ready"),
        Claims::Ready {
            bound, selected, ..
        } => {
            if !bound.iter().all(|v| binding::reachable_from(v, node)) {
                return Some("node(s) had volume node affinity conflict");
            }
            // A claim already promised to a node keeps its pod there.
            match selected {
                Some(chosen) if *chosen != node.name_any() => {
                    Some("node(s) didn't match the node selected for its volumes")
                }
                _ => None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn store<K>(items: Vec<serde_json::Value>) -> Store<K>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + 'static,
        K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    {
        let mut writer = Writer::<K>::default();
        writer.apply_watcher_event(&Event::Init);
        for item in items {
            writer.apply_watcher_event(&Event::InitApply(serde_json::from_value(item).unwrap()));
        }
        writer.apply_watcher_event(&Event::InitDone);
        writer.as_reader()
    }

    fn node(name: &str) -> Node {
        serde_json::from_value(
            json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}),
        )
        .unwrap()
    }

    #[test]
    fn claims_decide_where_a_pod_may_go() {
        let claims = store::<PersistentVolumeClaim>(vec![
            json!({"metadata": {"name": "bound", "namespace": "default"}, "spec": {"volumeName": "pv-1"}}),
            json!({"metadata": {"name": "later", "namespace": "default"}, "spec": {"storageClassName": "local-path"}}),
            json!({"metadata": {"name": "now", "namespace": "default"}, "spec": {"storageClassName": "fast"}}),
        ]);
        let volumes =
            store::<PersistentVolume>(vec![json!({"metadata": {"name": "pv-1"}, "spec": {
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}}})]);
        let classes = store::<StorageClass>(vec![
            json!({"metadata": {"name": "local-path"}, "provisioner": "p", "volumeBindingMode": "WaitForFirstConsumer"}),
            json!({"metadata": {"name": "fast"}, "provisioner": "p", "volumeBindingMode": "Immediate"}),
        ]);
        let stores = Stores {
            claims: &claims,
            volumes: &volumes,
            classes: &classes,
        };
        let pod = |names: &[&str]| -> Pod {
            let volumes: Vec<_> = names
                .iter()
                .map(|n| json!({"name": n, "persistentVolumeClaim": {"claimName": n}}))
                .collect();
            serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "default"},
                "spec": {"containers": [], "volumes": volumes}}))
            .unwrap()
        };
        let verdict = check(&pod(&["bound", "later"]), &stores);
        assert!(
            matches!(&verdict, Claims::Ready { bound, delayed, .. } if bound.len() == 1 && delayed.len() == 1)
        );
        assert_eq!(misfit(&verdict, &node("n1")), None);
        assert_eq!(
            misfit(&verdict, &node("n2")),
            Some("node(s) had volume node affinity conflict")
        );
        assert!(matches!(check(&pod(&["now"]), &stores),
            Claims::Blocked(m) if m == "pod has unbound immediate PersistentVolumeClaims"));
        assert!(matches!(check(&pod(&["gone"]), &stores),
            Claims::Blocked(m) if m == "persistentvolumeclaim \"gone\" not found"));
    }
}
