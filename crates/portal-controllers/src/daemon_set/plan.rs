//! What one DaemonSet sync changes, decided from the nodes and the pods on
//! them (pure, unit-tested; the controller carries it out), as upstream's
//! `podsShouldBeOnNode` and `rollingUpdate`:
//! - [`manage`]: a pod where one should run and none is; none where none
//!   may stay; one per node (one per template during a surge); failed pods
//!   replaced;
//! - [`roll`]: old pods replaced node by node, at most `maxUnavailable`
//!   unavailable at once (old unavailable pods first, always), or with
//!   `maxSurge` new pods started beside old ones that go once the new one
//!   is available.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::nodes::Fit;
use crate::replication::is_available;

/// The template hash label of DaemonSet (and StatefulSet) pods.
pub const HASH_LABEL: &str = "controller-revision-hash";

/// Pods to delete (by name) and nodes to start a pod on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub create_on: Vec<String>,
    pub delete: Vec<String>,
    /// Nodes whose failed pod was deleted (their next pod waits a backoff).
    pub failed_on: Vec<String>,
}

fn name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

fn is_updated(pod: &Pod, hash: &str) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(HASH_LABEL))
        .is_some_and(|h| h == hash)
}

fn created(pod: &Pod) -> Option<jiff::Timestamp> {
    pod.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

/// Creates and deletes that keep one pod on each node that should run one.
/// `pods` are the DaemonSet's pods by node, deleting ones included (a node
/// whose pod is still going gets no new one yet).
pub fn manage(
    fits: &BTreeMap<String, Fit>,
    pods: &BTreeMap<String, Vec<Pod>>,
    hash: &str,
    surge: bool,
) -> Plan {
    let mut plan = Plan::default();
    let empty = Vec::new();
    for (node, fit) in fits {
        let here = pods.get(node).unwrap_or(&empty);
        if fit.should_run && here.is_empty() {
            plan.create_on.push(node.clone());
            continue;
        }
        let live: Vec<&Pod> = here
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        if !fit.may_continue {
            plan.delete.extend(live.iter().map(|p| name(p)));
            continue;
        }
        let mut running = Vec::new();
        for pod in live {
            if phase(pod) == Some("Failed") {
                plan.delete.push(name(pod));
                plan.failed_on.push(node.clone());
            } else {
                running.push(pod);
            }
        }
        running.sort_by_key(|p| created(p));
        if surge {
            // The oldest of each template stays: the old one until its
            // replacement is available.
            let (mut new_seen, mut old_seen) = (false, false);
            for pod in running {
                let seen = if is_updated(pod, hash) {
                    &mut new_seen
                } else {
                    &mut old_seen
                };
                if *seen {
                    plan.delete.push(name(pod));
                }
                *seen = true;
            }
        } else {
            plan.delete.extend(running.iter().skip(1).map(|p| name(p)));
        }
    }
    // Pods on nodes the DaemonSet has nothing to do with (gone or renamed).
    for (node, here) in pods {
        if !fits.contains_key(node) {
            plan.delete.extend(
                here.iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .map(name),
            );
        }
    }
    plan
}

/// The updated and the old pod on a node, when it has at most one of each.
fn updated_and_old<'a>(pods: &'a [Pod], hash: &str) -> Option<(Option<&'a Pod>, Option<&'a Pod>)> {
    let (mut updated, mut old) = (None, None);
    for pod in pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        let slot = if is_updated(pod, hash) {
            &mut updated
        } else {
            &mut old
        };
        if slot.is_some() {
            return None;
        }
        *slot = Some(pod);
    }
    Some((updated, old))
}

/// One step of a rolling update over the nodes that should run the pod.
#[allow(clippy::too_many_arguments)]
pub fn roll(
    fits: &BTreeMap<String, Fit>,
    pods: &BTreeMap<String, Vec<Pod>>,
    hash: &str,
    max_unavailable: i32,
    max_surge: i32,
    min_ready: i64,
    now: jiff::Timestamp,
) -> Plan {
    let mut plan = Plan::default();
    let available = |pod: &Pod| is_available(pod, min_ready, now);
    let nodes = fits
        .iter()
        .filter(|(_, fit)| fit.should_run)
        .filter_map(|(node, _)| pods.get(node).map(|p| (node, p)));
    if max_surge == 0 {
        let mut unavailable = 0;
        let (mut replace_now, mut candidates) = (Vec::new(), Vec::new());
        for (_, here) in nodes {
            match updated_and_old(here, hash) {
                None | Some((None, None)) | Some((Some(_), Some(_))) => unavailable += 1,
                Some((Some(updated), None)) => {
                    if !available(updated) {
                        unavailable += 1;
                    }
                }
                Some((None, Some(old))) => {
                    if !available(old) {
                        replace_now.push(name(old));
                    } else if unavailable < max_unavailable {
                        candidates.push(name(old));
                    }
                }
            }
        }
        let room = (max_unavailable - unavailable).max(0);
        let room = usize::try_from(room).unwrap_or(0).min(candidates.len());
        plan.delete = replace_now;
        plan.delete.extend(candidates.into_iter().take(room));
    } else {
        let mut surging = 0;
        let (mut create_now, mut candidates) = (Vec::new(), Vec::new());
        for (node, here) in nodes {
            match updated_and_old(here, hash) {
                Some((None, Some(old))) => {
                    if !available(old) {
                        create_now.push(node.clone());
                    } else if surging < max_surge {
                        candidates.push(node.clone());
                    }
                }
                Some((Some(updated), Some(old))) => {
                    if available(updated) {
                        plan.delete.push(name(old));
                    } else {
                        surging += 1;
                    }
                }
                _ => {}
            }
        }
        let room = (max_surge - surging).max(0);
        let room = usize::try_from(room).unwrap_or(0).min(candidates.len());
        plan.create_on = create_now;
        plan.create_on.extend(candidates.into_iter().take(room));
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: &str = "2026-11-27T10:00:00Z";

    fn pod(name: &str, hash: &str, ready: bool) -> Pod {
        let conditions = if ready {
            json!([{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-27T09:00:00Z"}])
        } else {
            json!([])
        };
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {HASH_LABEL: hash}, "creationTimestamp": "2026-11-27T08:00:00Z"},
            "status": {"phase": "Running", "conditions": conditions},
        }))
        .unwrap()
    }

    fn fits(nodes: &[&str]) -> BTreeMap<String, Fit> {
        nodes
            .iter()
            .map(|n| {
                (
                    n.to_string(),
                    Fit {
                        should_run: true,
                        may_continue: true,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn manage_keeps_one_pod_per_eligible_node() {
        let mut all = fits(&["a", "b", "c"]);
        all.insert(
            "d".into(),
            Fit {
                should_run: false,
                may_continue: false,
            },
        );
        let pods: BTreeMap<String, Vec<Pod>> = [
            ("a".to_owned(), vec![pod("a1", "h", true)]),
            (
                "b".to_owned(),
                vec![pod("b1", "h", true), pod("b2", "h", true)],
            ),
            ("d".to_owned(), vec![pod("d1", "h", true)]),
            ("gone".to_owned(), vec![pod("g1", "h", true)]),
        ]
        .into();
        let plan = manage(&all, &pods, "h", false);
        assert_eq!(plan.create_on, vec!["c"]);
        assert_eq!(plan.delete, vec!["b2", "d1", "g1"]);
    }

    #[test]
    fn rolling_replaces_within_max_unavailable_unavailable_old_pods_first() {
        let now: jiff::Timestamp = NOW.parse().unwrap();
        let pods: BTreeMap<String, Vec<Pod>> = [
            ("a".to_owned(), vec![pod("a1", "old", true)]),
            ("b".to_owned(), vec![pod("b1", "old", false)]),
            ("c".to_owned(), vec![pod("c1", "old", true)]),
        ]
        .into();
        let plan = roll(&fits(&["a", "b", "c"]), &pods, "new", 1, 0, 0, now);
        assert_eq!(
            plan.delete,
            vec!["b1", "a1"],
            "the unavailable one always, one more within the budget"
        );
        let updating: BTreeMap<String, Vec<Pod>> = [
            ("a".to_owned(), vec![pod("a2", "new", false)]),
            ("b".to_owned(), vec![pod("b1", "old", true)]),
        ]
        .into();
        assert!(
            roll(&fits(&["a", "b"]), &updating, "new", 1, 0, 0, now)
                .delete
                .is_empty(),
            "a's new pod is not available yet"
        );
    }

    #[test]
    fn surge_starts_new_pods_beside_old_ones() {
        let now: jiff::Timestamp = NOW.parse().unwrap();
        let pods: BTreeMap<String, Vec<Pod>> = [
            (
                "a".to_owned(),
                vec![pod("a1", "old", true), pod("a2", "new", true)],
            ),
            ("b".to_owned(), vec![pod("b1", "old", true)]),
            ("c".to_owned(), vec![pod("c1", "old", true)]),
        ]
        .into();
        let plan = roll(&fits(&["a", "b", "c"]), &pods, "new", 0, 1, 0, now);
        assert_eq!(plan.delete, vec!["a1"], "a's replacement is available");
        assert_eq!(plan.create_on, vec!["b"], "one more surge pod");
        let managed = manage(&fits(&["a", "b", "c"]), &pods, "new", true);
        assert!(
            managed.delete.is_empty() && managed.create_on.is_empty(),
            "{managed:?}"
        );
    }
}
