//! Inter-pod affinity and anti-affinity, as Kubernetes' `InterPodAffinity`
//! plugin: a pod goes where pods it must be near are (in the same domain
//! of the term's topology key, such as `kubernetes.io/hostname`), not
//! where pods it must avoid are, and not where a pod already there must
//! avoid it. Preferred terms add or take their weight from the nodes in
//! the domains of the pods they match, both ways.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::cluster::Cluster;
use super::terms::{Term, Terms};

/// Upstream's `hardPodAffinityWeight`: what an existing pod's required
/// affinity to the incoming pod adds to its domain's score.
const HARD_AFFINITY_WEIGHT: i64 = 1;

/// The incoming pod's view of the cluster for this plugin, worked out once
/// for all candidate nodes.
#[derive(Debug)]
pub struct PodAffinity<'a> {
    cluster: &'a Cluster<'a>,
    own: Terms,
    /// Per required affinity term, the domains holding a pod that matches
    /// all the terms.
    near: Vec<HashMap<&'a str, usize>>,
    /// Whether no pod anywhere matches the required affinity terms and the
    /// pod matches all of them itself (the first of a group that wants
    /// to be together may go anywhere).
    first_of_group: bool,
    /// Domains (key, value) the pod's own anti-affinity avoids.
    avoid: Vec<(Arc<str>, &'a str)>,
    /// Domains (key, value) where a pod's anti-affinity avoids this one.
    avoided_by_others: Vec<(Arc<str>, &'a str)>,
    /// Preferences by domain (key, value): weights to add.
    preferences: HashMap<(Arc<str>, &'a str), i64>,
}

impl<'a> PodAffinity<'a> {
    pub fn new(pod: &Pod, cluster: &'a Cluster<'a>) -> Self {
        let own = Terms::of(pod);
        let mut near = vec![HashMap::new(); own.affinity.len()];
        let mut avoid = Vec::new();
        let mut avoided_by_others = Vec::new();
        let mut preferences: HashMap<(Arc<str>, &'a str), i64> = HashMap::new();
        let mut any_match = false;
        for placed in cluster.placed {
            let other = &placed.pod;
            let domain = |key: &str| cluster.domain(&placed.node, key);
            // A pod counts for required affinity when it matches every term.
            if !own.affinity.is_empty() && own.affinity.iter().all(|t| t.matches(other)) {
                for (i, term) in own.affinity.iter().enumerate() {
                    if let Some(value) = domain(&term.topology_key) {
                        any_match = true;
                        *near[i].entry(value).or_default() += 1;
                    }
                }
            }
            for term in &own.anti_affinity {
                if let Some(value) = domain(&term.topology_key).filter(|_| term.matches(other)) {
                    avoid.push((term.topology_key.clone(), value));
                }
            }
            let mut prefer = |term: &Term, weight: i64| {
                if let Some(value) = domain(&term.topology_key) {
                    *preferences
                        .entry((term.topology_key.clone(), value))
                        .or_default() += weight;
                }
            };
            for term in own.preferred_affinity.iter().filter(|t| t.matches(other)) {
                prefer(term, term.weight);
            }
            for term in own
                .preferred_anti_affinity
                .iter()
                .filter(|t| t.matches(other))
            {
                prefer(term, -term.weight);
            }
            // What the pods already placed want of this one.
            let Some(theirs) = placed.terms.as_deref() else {
                continue;
            };
            for term in theirs.anti_affinity.iter().filter(|t| t.matches(pod)) {
                if let Some(value) = domain(&term.topology_key) {
                    avoided_by_others.push((term.topology_key.clone(), value));
                }
            }
            for term in theirs.affinity.iter().filter(|t| t.matches(pod)) {
                prefer(term, HARD_AFFINITY_WEIGHT);
            }
            for term in theirs.preferred_affinity.iter().filter(|t| t.matches(pod)) {
                prefer(term, term.weight);
            }
            for term in theirs
                .preferred_anti_affinity
                .iter()
                .filter(|t| t.matches(pod))
            {
                prefer(term, -term.weight);
            }
        }
        let first_of_group = !any_match && own.affinity.iter().all(|t| t.matches(pod));
        PodAffinity {
            cluster,
            own,
            near,
            first_of_group,
            avoid,
            avoided_by_others,
            preferences,
        }
    }

    /// Why the pod cannot go to the node by these rules, in upstream's
    /// words; `None` when it may.
    pub fn misfit(&self, node: &str) -> Option<&'static str> {
        let domain = |key: &str| self.cluster.domain(node, key);
        if !self.own.affinity.is_empty() {
            let mut satisfied = true;
            for (term, near) in self.own.affinity.iter().zip(&self.near) {
                match domain(&term.topology_key) {
                    None => return Some("node(s) didn't match pod affinity rules"),
                    Some(value) => satisfied &= near.contains_key(value),
                }
            }
            if !satisfied && !self.first_of_group {
                return Some("node(s) didn't match pod affinity rules");
            }
        }
        let avoided =
            |key: &str, value: &str| self.avoid.iter().any(|(k, v)| &**k == key && *v == value);
        for term in &self.own.anti_affinity {
            if domain(&term.topology_key).is_some_and(|v| avoided(&term.topology_key, v)) {
                return Some("node(s) didn't match pod anti-affinity rules");
            }
        }
        let others = self
            .avoided_by_others
            .iter()
            .any(|(key, value)| domain(key) == Some(*value));
        others.then_some("node(s) didn't satisfy existing pods anti-affinity rules")
    }

    /// The node's preference score before normalising: the weights of the
    /// domains it is in.
    pub fn raw_score(&self, node: &str) -> i64 {
        self.preferences
            .iter()
            .filter(|((key, value), _)| self.cluster.domain(node, key) == Some(*value))
            .map(|(_, weight)| weight)
            .sum()
    }
}

/// Upstream's normalisation: 0 at the lowest, 100 at the highest, 0 for
/// all when they are equal.
pub fn normalize(scores: &mut [i64]) {
    let max = scores.iter().copied().max().unwrap_or(0);
    let min = scores.iter().copied().min().unwrap_or(0);
    for score in scores.iter_mut() {
        *score = if max > min {
            100 * (*score - min) / (max - min)
        } else {
            0
        };
    }
}

#[cfg(test)]
mod tests {
    use super::super::cluster::Placed;
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;
    use std::sync::Arc;

    fn node(name: &str, zone: &str) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name,
                "labels": {"kubernetes.io/hostname": name, "zone": zone}}}))
            .unwrap(),
        )
    }

    fn pod(labels: serde_json::Value, affinity: serde_json::Value) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "p", "namespace": "default", "labels": labels},
            "spec": {"containers": [], "affinity": affinity}}),
        )
        .unwrap()
    }

    fn placed(node: &str, labels: serde_json::Value, affinity: serde_json::Value) -> Placed {
        Placed::new(Arc::new(pod(labels, affinity)), node.into())
    }

    fn term(key: &str, app: &str) -> serde_json::Value {
        json!({"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key})
    }

    #[test]
    fn anti_affinity_keeps_pods_of_a_kind_apart_both_ways() {
        let nodes = [node("a", "z1"), node("b", "z1"), node("c", "z2")];
        let away = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            term("kubernetes.io/hostname", "web")]}});
        let placed = [placed("a", json!({"app": "web"}), away.clone())];
        let cluster = Cluster::new(&nodes, &placed);
        let incoming = pod(json!({"app": "web"}), away);
        let rules = PodAffinity::new(&incoming, &cluster);
        assert_eq!(
            rules.misfit("a"),
            Some("node(s) didn't match pod anti-affinity rules")
        );
        assert_eq!(rules.misfit("b"), None);
        // A pod without rules still may not join a pod that avoids it.
        let plain = pod(json!({"app": "web"}), json!(null));
        let rules = PodAffinity::new(&plain, &cluster);
        assert_eq!(
            rules.misfit("a"),
            Some("node(s) didn't satisfy existing pods anti-affinity rules")
        );
        assert_eq!(rules.misfit("c"), None);
    }

    #[test]
    fn affinity_brings_pods_together_and_lets_the_first_go_anywhere() {
        let nodes = [node("a", "z1"), node("b", "z1"), node("c", "z2")];
        let near = json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            term("zone", "cache")]}});
        let placed = [placed("b", json!({"app": "cache"}), json!(null))];
        let cluster = Cluster::new(&nodes, &placed);
        let rules = PodAffinity::new(&pod(json!({"app": "web"}), near.clone()), &cluster);
        assert_eq!(rules.misfit("a"), None);
        assert_eq!(rules.misfit("b"), None);
        assert_eq!(
            rules.misfit("c"),
            Some("node(s) didn't match pod affinity rules")
        );
        // No cache anywhere: a web pod waits, a cache pod wanting its own
        // kind is the first of its group.
        let empty = Cluster::new(&nodes, &[]);
        let rules = PodAffinity::new(&pod(json!({"app": "web"}), near), &empty);
        assert!(rules.misfit("a").is_some());
        let itself = json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            term("zone", "cache")]}});
        let rules = PodAffinity::new(&pod(json!({"app": "cache"}), itself), &empty);
        assert_eq!(rules.misfit("c"), None);
    }

    #[test]
    fn preferences_score_the_domains_of_matching_pods() {
        let nodes = [node("a", "z1"), node("b", "z1"), node("c", "z2")];
        let placed = [placed("a", json!({"app": "cache"}), json!(null))];
        let cluster = Cluster::new(&nodes, &placed);
        let prefer = json!({"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "podAffinityTerm": term("zone", "cache")}]}});
        let rules = PodAffinity::new(&pod(json!({"app": "web"}), prefer), &cluster);
        let mut scores: Vec<i64> = ["a", "b", "c"].iter().map(|n| rules.raw_score(n)).collect();
        assert_eq!(scores, [10, 10, 0]);
        normalize(&mut scores);
        assert_eq!(scores, [100, 100, 0]);
    }
}
