//! Which nodes a DaemonSet runs on and the pods it makes there, as
//! upstream's `nodeShouldRunDaemonPod` and `NewPod`: the template with the
//! DaemonSet tolerations added and the pod pinned to its node by node
//! affinity (the scheduler binds it).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    PodSpec, Toleration,
};
use kube::ResourceExt;

use crate::placement;

/// Whether a DaemonSet's pod should start on a node, and whether one there
/// may keep running (a `NoSchedule` taint stops new pods only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fit {
    pub should_run: bool,
    pub may_continue: bool,
}

/// The tolerations every DaemonSet pod gets (upstream's
/// `AddOrUpdateDaemonPodTolerations`): it stays on not-ready and
/// unreachable nodes, under resource pressure and on cordoned nodes.
pub fn with_daemon_tolerations(spec: &mut PodSpec) {
    let mut wanted = vec![
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        (placement::UNSCHEDULABLE, "NoSchedule"),
    ];
    if spec.host_network == Some(true) {
        wanted.push(("node.kubernetes.io/network-unavailable", "NoSchedule"));
    }
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    for (key, effect) in wanted {
        let present = tolerations
            .iter()
            .any(|t| t.key.as_deref() == Some(key) && t.effect.as_deref() == Some(effect));
        if !present {
            tolerations.push(Toleration {
                key: Some(key.into()),
                operator: Some("Exists".into()),
                effect: Some(effect.into()),
                ..Toleration::default()
            });
        }
    }
}

/// The template's pod spec as it would run on a node (tolerations added).
pub fn daemon_pod_spec(ds: &DaemonSet) -> PodSpec {
    let mut spec = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .unwrap_or_default();
    with_daemon_tolerations(&mut spec);
    spec
}

/// Where the DaemonSet's pod stands on `node` (`spec` from
/// [`daemon_pod_spec`]).
pub fn fit(spec: &PodSpec, node: &Node) -> Fit {
    let none = Fit {
        should_run: false,
        may_continue: false,
    };
    if spec
        .node_name
        .as_deref()
        .is_some_and(|n| !n.is_empty() && n != node.name_any())
    {
        return none;
    }
    if !placement::selects_node(spec, node) {
        return none;
    }
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    if placement::untolerated(tolerations, node, &["NoSchedule", "NoExecute"]).is_some() {
        let evicted = placement::untolerated(tolerations, node, &["NoExecute"]).is_some();
        return Fit {
            should_run: false,
            may_continue: !evicted,
        };
    }
    Fit {
        should_run: true,
        may_continue: true,
    }
}

/// Pins a pod spec to a node: its required node affinity becomes one term
/// naming the node (upstream's `ReplaceDaemonSetPodNodeNameNodeAffinity`).
pub fn pin_to_node(spec: &mut PodSpec, node: &str) {
    let term = NodeSelectorTerm {
        match_fields: Some(vec![NodeSelectorRequirement {
            key: "metadata.name".into(),
            operator: "In".into(),
            values: Some(vec![node.into()]),
        }]),
        match_expressions: None,
    };
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    let node_affinity = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    node_affinity.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
        node_selector_terms: vec![term],
    });
}

/// The node a DaemonSet pod is for: where it is bound, or where its node
/// affinity pins it (upstream's `GetTargetNodeName`).
pub fn target_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(node) = spec.node_name.as_ref().filter(|n| !n.is_empty()) {
        return Some(node.clone());
    }
    let required = spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?;
    required.node_selector_terms.iter().find_map(|term| {
        term.match_fields.iter().flatten().find_map(|r| {
            let values = r.values.as_deref().unwrap_or_default();
            (r.key == "metadata.name" && r.operator == "In" && values.len() == 1)
                .then(|| values[0].clone())
        })
    })
}

/// Pods grouped by the node they are for.
pub fn by_node(pods: Vec<Pod>) -> BTreeMap<String, Vec<Pod>> {
    let mut grouped: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
    for pod in pods {
        if let Some(node) = target_node(&pod) {
            grouped.entry(node).or_default().push(pod);
        }
    }
    grouped
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, taints: serde_json::Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": {"kind": "worker"}}, "spec": {"taints": taints}})).unwrap()
    }

    fn daemon_set(spec: serde_json::Value) -> DaemonSet {
        serde_json::from_value(json!({"metadata": {"name": "agent"},
            "spec": {"selector": {}, "template": {"spec": spec}}}))
        .unwrap()
    }

    #[test]
    fn taints_stop_new_pods_and_no_execute_ones_old_pods_too() {
        let spec = daemon_pod_spec(&daemon_set(
            json!({"containers": [], "nodeSelector": {"kind": "worker"}}),
        ));
        let plain = node("a", json!([]));
        assert_eq!(
            fit(&spec, &plain),
            Fit {
                should_run: true,
                may_continue: true
            }
        );
        let no_schedule = node("b", json!([{"key": "dedicated", "effect": "NoSchedule"}]));
        assert_eq!(
            fit(&spec, &no_schedule),
            Fit {
                should_run: false,
                may_continue: true
            }
        );
        let no_execute = node("c", json!([{"key": "dedicated", "effect": "NoExecute"}]));
        assert_eq!(
            fit(&spec, &no_execute),
            Fit {
                should_run: false,
                may_continue: false
            }
        );
        let not_ready = node(
            "d",
            json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]),
        );
        assert!(
            fit(&spec, &not_ready).should_run,
            "DaemonSet pods tolerate these"
        );
        let mut elsewhere: Node =
            serde_json::from_value(json!({"metadata": {"name": "e"}})).unwrap();
        elsewhere.metadata.labels = None;
        assert!(!fit(&spec, &elsewhere).should_run, "the node selector");
    }

    #[test]
    fn pods_are_pinned_by_node_affinity_and_found_by_it() {
        let mut spec = daemon_pod_spec(&daemon_set(json!({"containers": [], "hostNetwork": true})));
        assert!(spec
            .tolerations
            .as_ref()
            .unwrap()
            .iter()
            .any(|t| t.key.as_deref() == Some("node.kubernetes.io/network-unavailable")));
        pin_to_node(&mut spec, "node-2");
        let pod = Pod {
            spec: Some(spec),
            ..Pod::default()
        };
        assert_eq!(target_node(&pod).as_deref(), Some("node-2"));
        assert!(placement::selects_node(
            pod.spec.as_ref().unwrap(),
            &node("node-2", json!([]))
        ));
        assert!(!placement::selects_node(
            pod.spec.as_ref().unwrap(),
            &node("node-1", json!([]))
        ));
    }
}
