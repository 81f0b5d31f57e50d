//! Topology spread, as Kubernetes' `PodTopologySpread` plugin: the pods a
//! constraint selects stay within `maxSkew` of each other across the
//! domains of its topology key (`DoNotSchedule` filters nodes,
//! `ScheduleAnyway` scores them). A pod without constraints of its own
//! gets the cluster defaults (hostname, skew 3; zone, skew 5; both
//! `ScheduleAnyway`) over what a user sees as its app: the pods its
//! Services and its controller select.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;

use super::cluster::{terminating, Cluster};
use super::terms::{label_keys_selector, selector_of, Selection};
use crate::placement;

const HOSTNAME: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";

/// One constraint, parsed.
#[derive(Debug)]
struct Constraint {
    max_skew: i64,
    topology_key: String,
    hard: bool,
    min_domains: i64,
    /// `None`: no label selector, which selects no pod.
    selection: Option<Selection>,
    /// Count only on nodes the pod's node selector and affinity allow
    /// (`nodeAffinityPolicy: Honor`, the default).
    honor_affinity: bool,
    /// Count only on nodes whose taints the pod tolerates
    /// (`nodeTaintsPolicy: Honor`; the default ignores taints).
    honor_taints: bool,
}

impl Constraint {
    fn selects(&self, pod: &Pod) -> bool {
        self.selection
            .as_ref()
            .is_some_and(|s| s.matches(pod.labels()))
    }
}

/// The incoming pod's constraints and the counts of the pods they select.
#[derive(Debug)]
pub struct Spread<'a> {
    cluster: &'a Cluster<'a>,
    constraints: Vec<Constraint>,
    /// Per constraint, matching pods by domain (every eligible domain
    /// present, with 0 if it has none).
    counts: Vec<BTreeMap<&'a str, i64>>,
    /// Whether the pod matches each constraint's own selector.
    self_match: Vec<bool>,
    /// The constraints come from the cluster defaults: nodes without a
    /// topology key are not ruled out, only not scored on it.
    defaulted: bool,
}

impl<'a> Spread<'a> {
    /// `app`: the default spreading selection (the pod's Services' and
    /// controller's selectors), for a pod without constraints of its own;
    /// `None` when nothing selects the pod.
    pub fn new(pod: &Pod, cluster: &'a Cluster<'a>, app: Option<Selection>) -> Self {
        let spec = pod.spec.as_ref();
        let given = spec
            .and_then(|s| s.topology_spread_constraints.as_ref())
            .filter(|c| !c.is_empty());
        let defaulted = given.is_none();
        let constraints: Vec<Constraint> = match given {
            Some(given) => given
                .iter()
                .map(|c| {
                    let selection = selector_of(c.label_selector.as_ref()).map(|s| {
                        let mut all = vec![s];
                        all.extend(label_keys_selector(pod, c.match_label_keys.as_ref()));
                        Selection(all)
                    });
                    Constraint {
                        max_skew: i64::from(c.max_skew.max(1)),
                        topology_key: c.topology_key.clone(),
                        hard: c.when_unsatisfiable == "DoNotSchedule",
                        min_domains: i64::from(c.min_domains.unwrap_or(1).max(1)),
                        selection,
                        honor_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
                        honor_taints: c.node_taints_policy.as_deref() == Some("Honor"),
                    }
                })
                .collect(),
            None => app
                .map(|selection| {
                    [(HOSTNAME, 3), (ZONE, 5)]
                        .into_iter()
                        .map(|(key, skew)| Constraint {
                            max_skew: skew,
                            topology_key: key.into(),
                            hard: false,
                            min_domains: 1,
                            selection: Some(selection.clone()),
                            honor_affinity: true,
                            honor_taints: false,
                        })
                        .collect()
                })
                .unwrap_or_default(),
        };
        let namespace = pod.namespace().unwrap_or_default();
        let mut counts = Vec::with_capacity(constraints.len());
        for constraint in &constraints {
            // The eligible nodes' domains, by node name.
            let eligible: HashMap<&'a str, &'a str> = cluster
                .nodes
                .iter()
                .filter(|n| eligible(constraint, pod, n))
                .filter_map(|n| {
                    let name = n.metadata.name.as_deref()?;
                    // Own constraints count only on nodes with every key
                    // of their kind (filtering or scoring).
                    let all_keys = constraints
                        .iter()
                        .filter(|c| c.hard == constraint.hard)
                        .all(|c| cluster.domain(name, &c.topology_key).is_some());
                    let value = cluster.domain(name, &constraint.topology_key)?;
                    (defaulted || all_keys).then_some((name, value))
                })
                .collect();
            let mut domains: BTreeMap<&'a str, i64> =
                eligible.values().map(|value| (*value, 0)).collect();
            for placed in cluster.placed {
                let other = &placed.pod;
                let Some(value) = eligible.get(&*placed.node) else {
                    continue;
                };
                if other.metadata.namespace.as_deref() == Some(namespace.as_str())
                    && !terminating(other)
                    && constraint.selects(other)
                {
                    *domains.entry(value).or_default() += 1;
                }
            }
            counts.push(domains);
        }
        let self_match = constraints.iter().map(|c| c.selects(pod)).collect();
        Spread {
            cluster,
            constraints,
            counts,
            self_match,
            defaulted,
        }
    }

    /// Why the node would break a `DoNotSchedule` constraint, in upstream's
    /// words; `None` when it would not.
    pub fn misfit(&self, node: &str) -> Option<&'static str> {
        for ((constraint, counts), self_match) in self
            .constraints
            .iter()
            .zip(&self.counts)
            .zip(&self.self_match)
        {
            if !constraint.hard {
                continue;
            }
            let Some(value) = self.cluster.domain(node, &constraint.topology_key) else {
                return Some(
                    "node(s) didn't match pod topology spread constraints (missing required label)",
                );
            };
            let fewest = if i64::try_from(counts.len()).unwrap_or(i64::MAX) < constraint.min_domains
            {
                0
            } else {
                counts.values().copied().min().unwrap_or(0)
            };
            let here = counts.get(value).copied().unwrap_or(0);
            if here + i64::from(*self_match) - fewest > constraint.max_skew {
                return Some("node(s) didn't match pod topology spread constraints");
            }
        }
        None
    }

    /// The node's raw score over the `ScheduleAnyway` constraints (lower
    /// is better); `None` when the node lacks a key a constraint of the
    /// pod's own needs. `domains` is, per constraint, the number of
    /// domains among the candidate nodes.
    fn raw_score(&self, node: &str, domains: &[usize]) -> Option<i64> {
        let mut score = 0.0;
        for (i, (constraint, counts)) in self.constraints.iter().zip(&self.counts).enumerate() {
            if constraint.hard {
                continue;
            }
            let Some(value) = self.cluster.domain(node, &constraint.topology_key) else {
                if self.defaulted {
                    continue;
                }
                return None;
            };
            let here = counts.get(value).copied().unwrap_or(0);
            // Upstream's `scoreForCount`: the count weighed by log(domains
            // + 2), plus `maxSkew - 1` to water differences down.
            let weight = ((domains[i] + 2) as f64).ln();
            score += here as f64 * weight + (constraint.max_skew - 1) as f64;
        }
        #[allow(clippy::cast_possible_truncation)]
        Some(score.round() as i64)
    }

    /// Scores 0–100 for the candidate nodes, as upstream normalises them:
    /// the fewest matching pods score highest.
    pub fn scores(&self, candidates: &[&str]) -> Vec<i64> {
        if self.constraints.iter().all(|c| c.hard) {
            return vec![0; candidates.len()];
        }
        let domains: Vec<usize> = self
            .constraints
            .iter()
            .map(|c| {
                candidates
                    .iter()
                    .filter_map(|n| self.cluster.domain(n, &c.topology_key))
                    .collect::<BTreeSet<_>>()
                    .len()
            })
            .collect();
        let raw: Vec<Option<i64>> = candidates
            .iter()
            .map(|n| self.raw_score(n, &domains))
            .collect();
        let max = raw.iter().flatten().copied().max().unwrap_or(0);
        let min = raw.iter().flatten().copied().min().unwrap_or(0);
        raw.iter()
            .map(|score| match score {
                None => 0,
                Some(_) if max == 0 => 100,
                Some(s) => 100 * (max + min - s) / max,
            })
            .collect()
    }
}

fn eligible(constraint: &Constraint, pod: &Pod, node: &Node) -> bool {
    let empty = k8s_openapi::api::core::v1::PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&empty);
    (!constraint.honor_affinity || placement::selects_node(spec, node))
        && (!constraint.honor_taints
            || placement::untolerated(
                spec.tolerations.as_deref().unwrap_or_default(),
                node,
                &["NoSchedule", "NoExecute"],
            )
            .is_none())
}

#[cfg(test)]
mod tests {
    use super::super::cluster::Placed;
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    fn node(name: &str, zone: &str) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name,
                "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone}}}))
            .unwrap(),
        )
    }

    fn pod(constraints: serde_json::Value) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "p", "namespace": "default", "labels": {"app": "web"}},
            "spec": {"containers": [], "topologySpreadConstraints": constraints}}),
        )
        .unwrap()
    }

    fn on(node: &str, app: &str) -> Placed {
        let pod: Pod = serde_json::from_value(
            json!({"metadata": {"name": "q", "namespace": "default", "labels": {"app": app}}}),
        )
        .unwrap();
        Placed::new(Arc::new(pod), node.into())
    }

    #[test]
    fn do_not_schedule_keeps_the_skew() {
        let nodes = [node("a", "z1"), node("b", "z1"), node("c", "z2")];
        let placed = [on("a", "web"), on("b", "web"), on("a", "db")];
        let cluster = Cluster::new(&nodes, &placed);
        let by_zone = pod(
            json!([{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]),
        );
        let spread = Spread::new(&by_zone, &cluster, None);
        // z1 has 2 web pods, z2 none: only z2 keeps the skew at most 1.
        assert_eq!(
            spread.misfit("a"),
            Some("node(s) didn't match pod topology spread constraints")
        );
        assert_eq!(spread.misfit("c"), None);
        let by_host = pod(
            json!([{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]),
        );
        let spread = Spread::new(&by_host, &cluster, None);
        assert!(spread.misfit("a").is_some() && spread.misfit("b").is_some());
        assert_eq!(spread.misfit("c"), None);
    }

    #[test]
    fn defaults_spread_an_app_and_score_the_emptiest_node_highest() {
        let nodes = [node("a", "z1"), node("b", "z1"), node("c", "z2")];
        let placed = [
            on("a", "web"),
            on("a", "web"),
            on("b", "web"),
            on("c", "db"),
        ];
        let cluster = Cluster::new(&nodes, &placed);
        let app = Selection(vec![
            portal_api::selector::LabelSelector::parse("app=web").unwrap()
        ]);
        let spread = Spread::new(&pod(json!(null)), &cluster, Some(app));
        let scores = spread.scores(&["a", "b", "c"]);
        assert!(scores[2] > scores[1] && scores[1] > scores[0], "{scores:?}");
        // Nothing selects the pod: no default constraints, no preference.
        let spread = Spread::new(&pod(json!(null)), &cluster, None);
        assert_eq!(spread.scores(&["a", "b", "c"]), [0, 0, 0]);
        assert_eq!(spread.misfit("a"), None);
    }
}
