//! How candidate nodes are ranked, as Kubernetes' default scoring plugins
//! with their default weights: each plugin scores every node 0–100 and the
//! node with the highest weighted sum wins.

use k8s_openapi::api::core::v1::{Node, PodSpec};

use crate::placement;
use crate::requests::Resources;

/// Plugin weights, as upstream's default configuration.
pub const TAINT_TOLERATION: i64 = 3;
pub const NODE_AFFINITY: i64 = 2;
pub const POD_TOPOLOGY_SPREAD: i64 = 2;
pub const INTER_POD_AFFINITY: i64 = 2;
pub const LEAST_ALLOCATED: i64 = 1;
pub const BALANCED_ALLOCATION: i64 = 1;

/// Preferred node affinity: the weights of the matching terms, scaled so
/// the best node has 100.
pub fn node_affinity(spec: &PodSpec, nodes: &[&Node]) -> Vec<i64> {
    let raw: Vec<i64> = nodes
        .iter()
        .map(|n| placement::preferred_weight(spec, n))
        .collect();
    let max = raw.iter().copied().max().unwrap_or(0);
    raw.iter()
        .map(|w| if max > 0 { w * 100 / max } else { 0 })
        .collect()
}

/// `PreferNoSchedule` taints the pod does not tolerate: the fewest score
/// 100.
pub fn taint_toleration(spec: &PodSpec, nodes: &[&Node]) -> Vec<i64> {
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    let raw: Vec<i64> = nodes
        .iter()
        .map(|n| {
            let taints = n.spec.as_ref().and_then(|s| s.taints.as_ref());
            let count = taints
                .into_iter()
                .flatten()
                .filter(|t| t.effect == "PreferNoSchedule")
                .filter(|t| {
                    !tolerations
                        .iter()
                        .any(|tol| crate::node_lifecycle::tolerates(tol, t))
                })
                .count();
            i64::try_from(count).unwrap_or(i64::MAX)
        })
        .collect();
    let max = raw.iter().copied().max().unwrap_or(0);
    raw.iter()
        .map(|c| if max > 0 { 100 - c * 100 / max } else { 100 })
        .collect()
}

/// The share of CPU and memory left free with the pod on the node
/// (`requested` includes it), averaged; 0 when the node says nothing.
pub fn least_allocated(requested: Resources, node: &Node) -> i64 {
    let Some(offered) = Resources::allocatable(node) else {
        return 0;
    };
    let free = |asked: i64, offered: i64| {
        if offered <= 0 || offered == i64::MAX || asked > offered {
            return 0;
        }
        (offered - asked) * 100 / offered
    };
    (free(requested.milli_cpu, offered.milli_cpu) + free(requested.memory, offered.memory)) / 2
}

/// How evenly CPU and memory would be used, from the pods' actual requests
/// (`requested` includes the pod's): 100 when their shares match. A
/// resource the node does not state is left out.
pub fn balanced_allocation(requested: Resources, node: &Node) -> i64 {
    let Some(offered) = Resources::allocatable(node) else {
        return 0;
    };
    let share = |asked: i64, offered: i64| {
        (offered > 0 && offered != i64::MAX).then(|| (asked as f64 / offered as f64).min(1.0))
    };
    let shares: Vec<f64> = [
        share(requested.milli_cpu, offered.milli_cpu),
        share(requested.memory, offered.memory),
    ]
    .into_iter()
    .flatten()
    .collect();
    // The standard deviation of two shares is half their difference; of
    // one, zero.
    let deviation = match shares[..] {
        [cpu, memory] => (cpu - memory).abs() / 2.0,
        _ => 0.0,
    };
    #[allow(clippy::cast_possible_truncation)]
    let score = ((1.0 - deviation) * 100.0) as i64;
    score
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(extra: serde_json::Value) -> Node {
        let mut node = json!({"metadata": {"name": "n", "labels": {"disk": "ssd"}},
            "status": {"allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"}}});
        for (key, value) in extra.as_object().unwrap() {
            node[key] = value.clone();
        }
        serde_json::from_value(node).unwrap()
    }

    #[test]
    fn preferences_taints_and_load_rank_nodes() {
        let spec: PodSpec = serde_json::from_value(json!({"containers": [],
            "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 40, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}]}}}))
        .unwrap();
        let ssd = node(json!({}));
        let plain = node(json!({"metadata": {"name": "m"},
            "spec": {"taints": [{"key": "k", "effect": "PreferNoSchedule"}]}}));
        assert_eq!(node_affinity(&spec, &[&ssd, &plain]), [100, 0]);
        assert_eq!(taint_toleration(&spec, &[&ssd, &plain]), [100, 0]);
        let half = Resources {
            milli_cpu: 1000,
            memory: 2 << 30,
            pods: 1,
        };
        assert_eq!(least_allocated(half, &ssd), 50);
        assert_eq!(balanced_allocation(half, &ssd), 100);
    }
}
