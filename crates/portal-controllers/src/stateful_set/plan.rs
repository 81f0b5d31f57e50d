//! What one sync of a StatefulSet does to its pods, as upstream's
//! `updateStatefulSet`: pure, over a snapshot of the pods, so each rule is
//! tested on its own.
//!
//! Slots `0..replicas` (ordinals `start..start+replicas`) are filled
//! lowest first, ordinals beyond them are condemned and removed highest
//! first. `OrderedReady` takes one step per sync and only once every pod
//! before it is Running, Ready and available; `Parallel` takes them all.
//! Then a `RollingUpdate` replaces pods not at the update revision, highest
//! ordinal first down to the partition, at most `maxUnavailable` at a time.

/// A pod of the set as the plan sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub ordinal: i32,
    pub name: String,
    /// Its `controller-revision-hash` label: the revision name.
    pub revision: String,
    /// Its phase; empty for a pod created in this sync.
    pub phase: String,
    /// Running and Ready.
    pub ready: bool,
    /// Ready for at least `minReadySeconds`.
    pub available: bool,
    pub terminating: bool,
    /// Deleted by this sync, and why.
    pub deleted: Option<Why>,
}

impl Member {
    fn healthy(&self) -> bool {
        self.ready && self.available && !self.terminating
    }

    fn ended(&self) -> bool {
        self.phase == "Failed" || self.phase == "Succeeded"
    }
}

/// How the set updates its pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    OnDelete,
    RollingUpdate {
        /// Slots below this keep the current revision.
        partition: i32,
        max_unavailable: i32,
        /// `rollingUpdate` is given (an explicit `type: RollingUpdate`
        /// without it decides new pods' revisions by `currentReplicas`).
        parameters: bool,
    },
}

/// The set as the plan needs it.
#[derive(Clone, Debug)]
pub struct Shape {
    pub start: i32,
    pub replicas: i32,
    /// `OrderedReady` (one step at a time) rather than `Parallel`.
    pub ordered: bool,
    pub strategy: Strategy,
    pub current_revision: String,
    pub update_revision: String,
    /// `status.currentReplicas` as last written.
    pub current_replicas: i32,
}

/// Why a pod is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// It failed or succeeded: it is replaced.
    Ended,
    /// Its ordinal is beyond the replicas.
    Condemned,
    /// It runs an old revision.
    Update,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Create { ordinal: i32, revision: String },
    Delete { name: String, why: Why },
}

/// The plan's steps, and the pods as they will be after them (created
/// ones with an empty phase, deleted ones terminating), for the status.
pub fn plan(shape: &Shape, pods: &[Member]) -> (Vec<Step>, Vec<Member>) {
    let mut steps = Vec::new();
    let replicas = usize::try_from(shape.replicas).unwrap_or(0);
    let end = shape.start.saturating_add(shape.replicas);
    let mut slots: Vec<Option<Member>> = vec![None; replicas];
    let mut condemned: Vec<Member> = Vec::new();
    for pod in pods {
        if (shape.start..end).contains(&pod.ordinal) {
            // Ordinal `start + i` is slot `i`.
            let slot = usize::try_from(pod.ordinal - shape.start).unwrap_or(0);
            slots[slot] = Some(pod.clone());
        } else if pod.ordinal >= 0 {
            condemned.push(pod.clone());
        }
    }
    condemned.sort_by_key(|m| std::cmp::Reverse(m.ordinal));
    let first_unhealthy = slots
        .iter()
        .find(|s| !s.as_ref().is_some_and(Member::healthy))
        .map(|s| s.as_ref().map(|m| m.ordinal))
        .or_else(|| {
            // The lowest condemned ordinal, as upstream walks them.
            condemned
                .iter()
                .rev()
                .find(|m| !m.healthy())
                .map(|m| Some(m.ordinal))
        });
    let blocked = fill(shape, &mut slots, &mut steps)
        || remove(shape, &mut condemned, first_unhealthy, &mut steps);
    if !blocked {
        if let Strategy::RollingUpdate {
            partition,
            max_unavailable,
            ..
        } = shape.strategy
        {
            roll(shape, &mut slots, partition, max_unavailable, &mut steps);
        }
    }
    let after = slots.into_iter().flatten().chain(condemned).collect();
    (steps, after)
}

/// Creates missing pods and replaces ended ones, lowest slot first; true
/// when an ordered set must stop here.
fn fill(shape: &Shape, slots: &mut [Option<Member>], steps: &mut Vec<Step>) -> bool {
    for (index, slot) in slots.iter_mut().enumerate() {
        let ordinal = shape.start + i32::try_from(index).unwrap_or(i32::MAX);
        match slot {
            Some(pod) if pod.ended() => {
                // Deleted now, made again once it is gone.
                if !pod.terminating {
                    steps.push(Step::Delete {
                        name: pod.name.clone(),
                        why: Why::Ended,
                    });
                    pod.terminating = true;
                    pod.deleted = Some(Why::Ended);
                }
                if shape.ordered {
                    return true;
                }
            }
            None => {
                let revision = revision_for(shape, index).to_owned();
                steps.push(Step::Create {
                    ordinal,
                    revision: revision.clone(),
                });
                *slot = Some(Member {
                    ordinal,
                    name: String::new(),
                    revision,
                    phase: String::new(),
                    ready: false,
                    available: false,
                    terminating: false,
                    deleted: None,
                });
                if shape.ordered {
                    return true;
                }
            }
            Some(pod) => {
                if shape.ordered && !pod.healthy() {
                    return true;
                }
            }
        }
    }
    false
}

/// The revision a new pod in `slot` starts at: the current one below the
/// partition (or, without rolling-update parameters, below the pods
/// already current), else the update revision.
fn revision_for(shape: &Shape, slot: usize) -> &str {
    let slot = i32::try_from(slot).unwrap_or(i32::MAX);
    let keep_current = match shape.strategy {
        Strategy::RollingUpdate {
            parameters: false, ..
        } => slot < shape.current_replicas,
        Strategy::RollingUpdate {
            partition,
            parameters: true,
            ..
        } => slot < partition,
        Strategy::OnDelete => false,
    };
    if keep_current {
        &shape.current_revision
    } else {
        &shape.update_revision
    }
}

/// Deletes condemned pods, highest ordinal first; an ordered set deletes
/// one at a time and only a healthy one (or the first unhealthy pod of
/// the set). True when an ordered set must stop here.
fn remove(
    shape: &Shape,
    condemned: &mut [Member],
    first_unhealthy: Option<Option<i32>>,
    steps: &mut Vec<Step>,
) -> bool {
    for pod in condemned.iter_mut() {
        if pod.terminating {
            if shape.ordered {
                return true;
            }
            continue;
        }
        if shape.ordered && !pod.healthy() && first_unhealthy != Some(Some(pod.ordinal)) {
            return true;
        }
        steps.push(Step::Delete {
            name: pod.name.clone(),
            why: Why::Condemned,
        });
        pod.terminating = true;
        pod.deleted = Some(Why::Condemned);
        if shape.ordered {
            return true;
        }
    }
    false
}

/// Deletes pods at an old revision from the highest slot down to the
/// partition, while fewer than `max_unavailable` pods are unavailable.
fn roll(
    shape: &Shape,
    slots: &mut [Option<Member>],
    partition: i32,
    max_unavailable: i32,
    steps: &mut Vec<Step>,
) {
    let unavailable = slots
        .iter()
        .filter(|s| !s.as_ref().is_some_and(Member::healthy))
        .count();
    let mut budget = usize::try_from(max_unavailable.max(1))
        .unwrap_or(1)
        .saturating_sub(unavailable);
    let lowest = usize::try_from(partition).unwrap_or(0);
    for slot in slots.iter_mut().skip(lowest).rev() {
        if budget == 0 {
            return;
        }
        let Some(pod) = slot else { continue };
        if pod.revision != shape.update_revision && !pod.terminating && !pod.name.is_empty() {
            steps.push(Step::Delete {
                name: pod.name.clone(),
                why: Why::Update,
            });
            pod.terminating = true;
            pod.deleted = Some(Why::Update);
            budget -= 1;
        }
    }
}

/// The counts a status reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub replicas: i32,
    pub ready: i32,
    pub available: i32,
    pub current: i32,
    pub updated: i32,
}

/// Counts over the pods after the plan: every created pod (terminating
/// ones too), ready and available ones, and the live ones at the current
/// and update revisions. As upstream's recount, a pod this sync deleted
/// still counts as it was, except that one replaced by the update no
/// longer counts as current.
pub fn count(shape: &Shape, pods: &[Member]) -> Counts {
    let mut counts = Counts::default();
    for pod in pods {
        let terminating = match pod.deleted {
            Some(Why::Update) => true,
            Some(Why::Ended | Why::Condemned) => false,
            None => pod.terminating,
        };
        if !pod.phase.is_empty() {
            counts.replicas += 1;
        }
        if pod.ready {
            counts.ready += 1;
            if pod.available {
                counts.available += 1;
            }
        }
        if !pod.phase.is_empty() && !terminating {
            if pod.revision == shape.current_revision {
                counts.current += 1;
            }
            if pod.revision == shape.update_revision {
                counts.updated += 1;
            }
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(replicas: i32, ordered: bool, strategy: Strategy) -> Shape {
        Shape {
            start: 0,
            replicas,
            ordered,
            strategy,
            current_revision: "web-a".into(),
            update_revision: "web-a".into(),
            current_replicas: 0,
        }
    }

    const ROLLING: Strategy = Strategy::RollingUpdate {
        partition: 0,
        max_unavailable: 1,
        parameters: true,
    };

    fn pod(ordinal: i32, revision: &str, ready: bool) -> Member {
        Member {
            ordinal,
            name: format!("web-{ordinal}"),
            revision: revision.into(),
            phase: if ready { "Running" } else { "Pending" }.into(),
            ready,
            available: ready,
            terminating: false,
            deleted: None,
        }
    }

    fn create(ordinal: i32, revision: &str) -> Step {
        Step::Create {
            ordinal,
            revision: revision.into(),
        }
    }

    fn delete(ordinal: i32, why: Why) -> Step {
        Step::Delete {
            name: format!("web-{ordinal}"),
            why,
        }
    }

    #[test]
    fn ordered_sets_start_one_pod_at_a_time_after_the_previous_is_ready() {
        let set = shape(3, true, ROLLING);
        assert_eq!(plan(&set, &[]).0, [create(0, "web-a")]);
        assert_eq!(plan(&set, &[pod(0, "web-a", false)]).0, []);
        assert_eq!(plan(&set, &[pod(0, "web-a", true)]).0, [create(1, "web-a")]);
        // A lost pod comes back under its own name before anything else.
        let (steps, _) = plan(&set, &[pod(1, "web-a", true), pod(2, "web-a", true)]);
        assert_eq!(steps, [create(0, "web-a")]);
    }

    #[test]
    fn parallel_sets_start_every_pod_at_once() {
        let set = shape(3, false, ROLLING);
        let (steps, after) = plan(&set, &[pod(1, "web-a", false)]);
        assert_eq!(steps, [create(0, "web-a"), create(2, "web-a")]);
        assert_eq!(after.len(), 3);
    }

    #[test]
    fn scale_down_removes_the_highest_ordinal_first_one_by_one_when_ordered() {
        let pods: Vec<Member> = (0..4).map(|i| pod(i, "web-a", true)).collect();
        assert_eq!(
            plan(&shape(1, true, ROLLING), &pods).0,
            [delete(3, Why::Condemned)]
        );
        let mut going = pods.clone();
        going[3].terminating = true;
        assert_eq!(plan(&shape(1, true, ROLLING), &going).0, []);
        assert_eq!(
            plan(&shape(1, false, ROLLING), &pods).0,
            [
                delete(3, Why::Condemned),
                delete(2, Why::Condemned),
                delete(1, Why::Condemned)
            ]
        );
        // An unready condemned pod waits, unless it is the first unhealthy one.
        let mut unready = pods.clone();
        unready[2].ready = false;
        assert_eq!(
            plan(&shape(2, true, ROLLING), &unready).0,
            [delete(3, Why::Condemned)]
        );
        unready.pop();
        assert_eq!(
            plan(&shape(2, true, ROLLING), &unready).0,
            [delete(2, Why::Condemned)]
        );
        // Of two unready condemned pods the lowest is the first unhealthy:
        // the highest waits.
        let mut both = pods.clone();
        both[2].ready = false;
        both[3].ready = false;
        assert_eq!(plan(&shape(2, true, ROLLING), &both).0, []);
        // A pod deleted by this sync still counts as it was.
        let (_, after) = plan(&shape(3, true, ROLLING), &pods);
        assert_eq!(count(&shape(3, true, ROLLING), &after).current, 4);
    }

    #[test]
    fn ended_pods_are_replaced() {
        let mut failed = pod(1, "web-a", false);
        failed.phase = "Failed".into();
        let pods = [pod(0, "web-a", true), failed, pod(2, "web-a", true)];
        assert_eq!(
            plan(&shape(3, true, ROLLING), &pods).0,
            [delete(1, Why::Ended)]
        );
        let mut gone = pods.clone();
        gone[1].terminating = true;
        assert_eq!(plan(&shape(3, true, ROLLING), &gone).0, []);
    }

    #[test]
    fn rolling_updates_go_from_the_highest_ordinal_down_to_the_partition() {
        let mut set = shape(3, true, ROLLING);
        set.update_revision = "web-b".into();
        let pods: Vec<Member> = (0..3).map(|i| pod(i, "web-a", true)).collect();
        assert_eq!(plan(&set, &pods).0, [delete(2, Why::Update)]);
        // The replacement is made at the update revision, then waited for.
        let rest = &pods[..2];
        assert_eq!(plan(&set, rest).0, [create(2, "web-b")]);
        let mut updating = rest.to_vec();
        updating.push(pod(2, "web-b", false));
        assert_eq!(plan(&set, &updating).0, []);
        updating[2] = pod(2, "web-b", true);
        assert_eq!(plan(&set, &updating).0, [delete(1, Why::Update)]);

        set.strategy = Strategy::RollingUpdate {
            partition: 2,
            max_unavailable: 1,
            parameters: true,
        };
        assert_eq!(plan(&set, &updating).0, []);
        // Below the partition a lost pod comes back at the current revision.
        assert_eq!(plan(&set, &updating[1..]).0, [create(0, "web-a")]);
    }

    #[test]
    fn max_unavailable_bounds_the_pods_replaced_at_once() {
        let mut set = shape(
            4,
            false,
            Strategy::RollingUpdate {
                partition: 0,
                max_unavailable: 2,
                parameters: true,
            },
        );
        set.update_revision = "web-b".into();
        let pods: Vec<Member> = (0..4).map(|i| pod(i, "web-a", true)).collect();
        assert_eq!(
            plan(&set, &pods).0,
            [delete(3, Why::Update), delete(2, Why::Update)]
        );
        let mut one_down = pods.clone();
        one_down[0].ready = false;
        assert_eq!(plan(&set, &one_down).0, [delete(3, Why::Update)]);
    }

    #[test]
    fn on_delete_replaces_only_deleted_pods_at_the_update_revision() {
        let mut set = shape(2, true, Strategy::OnDelete);
        set.update_revision = "web-b".into();
        let pods = [pod(0, "web-a", true), pod(1, "web-a", true)];
        assert_eq!(plan(&set, &pods).0, []);
        assert_eq!(plan(&set, &pods[..1]).0, [create(1, "web-b")]);
    }

    #[test]
    fn counts_follow_upstream() {
        let mut set = shape(3, true, ROLLING);
        set.update_revision = "web-b".into();
        let mut going = pod(2, "web-b", true);
        going.terminating = true;
        let pods = [pod(0, "web-a", true), pod(1, "web-b", false), going];
        let counts = count(&set, &pods);
        assert_eq!(
            counts,
            Counts {
                replicas: 3,
                ready: 2,
                available: 2,
                current: 1,
                updated: 1
            }
        );
    }
}
