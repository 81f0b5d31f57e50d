//! Where a pod may run, node by node: the checks the scheduler and the
//! DaemonSet controller share, as Kubernetes' `NodeUnschedulable`,
//! `NodeAffinity` (the node selector and required node affinity) and
//! `TaintToleration` filters decide them.

use k8s_openapi::api::core::v1::{
    Node, NodeSelector, NodeSelectorRequirement, PodSpec, Taint, Toleration,
};
use kube::ResourceExt;

/// The taint a cordoned node stands for.
pub const UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";

/// Whether the pod tolerates the node being cordoned.
pub fn tolerates_unschedulable(spec: &PodSpec) -> bool {
    let taint = Taint {
        key: UNSCHEDULABLE.into(),
        effect: "NoSchedule".into(),
        ..Taint::default()
    };
    spec.tolerations
        .iter()
        .flatten()
        .any(|t| crate::node_lifecycle::tolerates(t, &taint))
}

/// Whether the node satisfies the pod's node selector and its required
/// node affinity.
pub fn selects_node(spec: &PodSpec, node: &Node) -> bool {
    let labels = node.labels();
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    selector_ok && required.is_none_or(|required| node_selector_matches(required, node))
}

/// The summed weights of the pod's preferred node affinity terms the node
/// matches.
pub fn preferred_weight(spec: &PodSpec, node: &Node) -> i64 {
    spec.affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .into_iter()
        .flatten()
        .filter(|p| {
            let selector = NodeSelector {
                node_selector_terms: vec![p.preference.clone()],
            };
            node_selector_matches(&selector, node)
        })
        .map(|p| i64::from(p.weight))
        .sum()
}

/// A node selector: any of its terms; a term, all of its expressions (on
/// labels) and fields (`metadata.name`); a term with neither selects none.
pub fn node_selector_matches(selector: &NodeSelector, node: &Node) -> bool {
    selector.node_selector_terms.iter().any(|term| {
        let expressions = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        if expressions.is_empty() && fields.is_empty() {
            return false;
        }
        let name = node.name_any();
        expressions
            .iter()
            .all(|r| requirement_matches(r, node.labels().get(&r.key).map(String::as_str)))
            && fields.iter().all(|r| {
                r.key == "metadata.name"
                    && matches!(r.operator.as_str(), "In" | "NotIn")
                    && requirement_matches(r, Some(&name))
            })
    })
}

/// One requirement on a value (`None`: the label is absent).
fn requirement_matches(requirement: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let number = |v: &str| v.parse::<i64>().ok();
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|w| w == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|w| w == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), [bound]) = (value.and_then(number), values) else {
                return false;
            };
            let Some(bound) = number(bound) else {
                return false;
            };
            if requirement.operator == "Gt" {
                have > bound
            } else {
                have < bound
            }
        }
        _ => false,
    }
}

/// The first of the node's taints with one of `effects` that the
/// tolerations do not cover.
pub fn untolerated<'a>(
    tolerations: &[Toleration],
    node: &'a Node,
    effects: &[&str],
) -> Option<&'a Taint> {
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_ref());
    taints.into_iter().flatten().find(|taint| {
        effects.contains(&taint.effect.as_str())
            && !tolerations
                .iter()
                .any(|t| crate::node_lifecycle::tolerates(t, taint))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, labels: serde_json::Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
    }

    fn spec(value: serde_json::Value) -> PodSpec {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn node_affinity_terms_are_ored_and_requirements_anded() {
        let affinity = |terms: serde_json::Value| {
            spec(json!({"containers": [], "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}))
        };
        let ssd = node("a", json!({"disk": "ssd", "cores": "8"}));
        let hdd = node("b", json!({"disk": "hdd"}));
        let pod = affinity(json!([
            {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]},
                                  {"key": "cores", "operator": "Gt", "values": ["4"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["c"]}]}
        ]));
        assert!(selects_node(&pod, &ssd));
        assert!(!selects_node(&pod, &hdd));
        assert!(selects_node(&pod, &node("c", json!({}))), "the second term");
        let pinned = affinity(
            json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}]),
        );
        assert!(selects_node(&pinned, &hdd) && !selects_node(&pinned, &ssd));
        let absent = affinity(json!([{"matchExpressions": [
            {"key": "gpu", "operator": "DoesNotExist"}, {"key": "disk", "operator": "NotIn", "values": ["hdd"]}]}]));
        assert!(selects_node(&absent, &ssd) && !selects_node(&absent, &hdd));
        assert!(
            !selects_node(&affinity(json!([{}])), &ssd),
            "an empty term selects nothing"
        );
        let with_selector = spec(json!({"containers": [], "nodeSelector": {"disk": "hdd"}}));
        assert!(selects_node(&with_selector, &hdd) && !selects_node(&with_selector, &ssd));
    }

    #[test]
    fn cordons_and_taints_need_tolerations() {
        let mut tainted = node("a", json!({}));
        tainted.spec = Some(
            serde_json::from_value(json!({"taints": [
            {"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}))
            .unwrap(),
        );
        assert!(untolerated(&[], &tainted, &["NoSchedule"]).is_some());
        assert!(untolerated(&[], &tainted, &["NoExecute"]).is_none());
        let tolerant = spec(json!({"containers": [], "tolerations": [{"operator": "Exists"}]}));
        assert!(untolerated(
            tolerant.tolerations.as_deref().unwrap(),
            &tainted,
            &["NoSchedule"]
        )
        .is_none());
        assert!(tolerates_unschedulable(&tolerant));
        assert!(!tolerates_unschedulable(&spec(json!({"containers": []}))));
    }
}
