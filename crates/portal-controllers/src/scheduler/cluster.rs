//! What the scheduler sees when it places one pod: the nodes and the pods
//! already on them (bound, or assumed bound by this scheduler).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;

use super::terms::Terms;

/// A pod on a node.
#[derive(Clone, Debug)]
pub struct Placed {
    pub pod: Arc<Pod>,
    pub node: Arc<str>,
    /// Its affinity terms, parsed once; `None` when it has none.
    pub terms: Option<Arc<Terms>>,
}

impl Placed {
    pub fn new(pod: Arc<Pod>, node: Arc<str>) -> Placed {
        let terms = Terms::of(&pod);
        Placed {
            terms: (!terms.is_empty()).then(|| Arc::new(terms)),
            pod,
            node,
        }
    }
}

/// The nodes and the pods on them.
#[derive(Debug)]
pub struct Cluster<'a> {
    pub nodes: &'a [Arc<Node>],
    pub placed: &'a [Placed],
    labels: HashMap<&'a str, &'a BTreeMap<String, String>>,
}

impl<'a> Cluster<'a> {
    pub fn new(nodes: &'a [Arc<Node>], placed: &'a [Placed]) -> Self {
        let labels = nodes
            .iter()
            .filter_map(|n| Some((n.metadata.name.as_deref()?, n.labels())))
            .collect();
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

/// Whether a pod is on its way out (its deletion has begun).
pub fn terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}
