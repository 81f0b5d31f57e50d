//! What the scheduler sees when it places one pod: the nodes, the pods
//! already on them (bound, or assumed bound by this scheduler), and label
//! queries over those pods as the scheduling plugins ask them.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use portal_api::selector::LabelSelector;

/// A pod on a node.
#[derive(Clone, Debug)]
pub struct Placed {
    pub pod: Arc<Pod>,
    pub node: String,
}

/// The nodes and the pods on them.
#[derive(Debug)]
pub struct Cluster<'a> {
    pub nodes: &'a [Arc<Node>],
    pub placed: &'a [Placed],
    labels: BTreeMap<String, &'a BTreeMap<String, String>>,
}

impl<'a> Cluster<'a> {
    pub fn new(nodes: &'a [Arc<Node>], placed: &'a [Placed]) -> Self {
        let labels = nodes.iter().map(|n| (n.name_any(), n.labels())).collect();
        Cluster {
            nodes,
            placed,
            labels,
        }
    }

    /// The value of a node's label: the node's topology domain for `key`.
    pub fn domain(&self, node: &str, key: &str) -> Option<&'a str> {
        self.labels.get(node)?.get(key).map(String::as_str)
    }
}

/// A conjunction of label selectors (each must match); empty matches
/// every pod.
#[derive(Clone, Debug, Default)]
pub struct Selection(pub Vec<LabelSelector>);

impl Selection {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0
            .iter()
            .all(|s| s.matches(|key| labels.get(key).map(String::as_str)))
    }
}

/// A `metav1.LabelSelector` from a typed one; `None` for none (which
/// selects no pod) or one that does not parse.
pub fn selector_of(
    selector: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
) -> Option<LabelSelector> {
    let value = serde_json::to_value(selector?).ok()?;
    LabelSelector::from_api(&value, "labelSelector").ok()
}

/// `key=value` for each of `keys` the pod has: what `matchLabelKeys` adds
/// to a selector.
pub fn label_keys_selector(pod: &Pod, keys: Option<&Vec<String>>) -> Option<LabelSelector> {
    let labels = pod.labels();
    let parts: Vec<String> = keys
        .into_iter()
        .flatten()
        .filter_map(|key| labels.get(key).map(|value| format!("{key}={value}")))
        .collect();
    if parts.is_empty() {
        return None;
    }
    LabelSelector::parse(&parts.join(",")).ok()
}

/// Whether a pod is on its way out (its deletion has begun).
pub fn terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}
