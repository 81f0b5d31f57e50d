//! The arithmetic of a rollout, as kube-controller-manager's deployment
//! controller does it (`pkg/controller/deployment/util`): surge and
//! unavailability from `int-or-percent`, the new ReplicaSet's next size,
//! how many old replicas may go, proportional scaling of a Deployment
//! resized mid-rollout, its status and conditions. Pure functions over the
//! objects, so every rule is unit-tested; the controller applies them.

use std::cmp::Ordering;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::revision::{annotation_number, replicas, MAX_REPLICAS};

pub const PROGRESSING: &str = "Progressing";
pub const AVAILABLE: &str = "Available";
pub const REPLICA_FAILURE: &str = "ReplicaFailure";
pub const NEW_RS_AVAILABLE: &str = "NewReplicaSetAvailable";
pub const TIMED_OUT: &str = "ProgressDeadlineExceeded";
pub const PAUSED: &str = "DeploymentPaused";
pub const RESUMED: &str = "DeploymentResumed";

/// `spec.replicas` of a ReplicaSet.
pub fn size(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

fn status_of(rs: &ReplicaSet) -> (i32, i32, i32) {
    rs.status.as_ref().map_or((0, 0, 0), |s| {
        (
            s.replicas,
            s.ready_replicas.unwrap_or(0),
            s.available_replicas.unwrap_or(0),
        )
    })
}

/// `status.availableReplicas` of a ReplicaSet.
pub fn available(rs: &ReplicaSet) -> i32 {
    status_of(rs).2
}

/// `status.replicas` of a ReplicaSet.
pub fn current(rs: &ReplicaSet) -> i32 {
    status_of(rs).0
}

fn created_then_named(a: &ReplicaSet, b: &ReplicaSet) -> Ordering {
    let created = |rs: &ReplicaSet| rs.metadata.creation_timestamp.as_ref().map(|t| t.0);
    created(a)
        .cmp(&created(b))
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

/// Oldest first (creation time, then name).
pub fn oldest_first(sets: &mut [ReplicaSet]) {
    sets.sort_by(created_then_named);
}

/// Whether the strategy is `Recreate`.
pub fn is_recreate(deployment: &Deployment) -> bool {
    strategy(deployment).0 == "Recreate"
}

fn strategy(deployment: &Deployment) -> (&str, Option<&IntOrString>, Option<&IntOrString>) {
    let strategy = deployment.spec.as_ref().and_then(|s| s.strategy.as_ref());
    let kind = strategy
        .and_then(|s| s.type_.as_deref())
        .unwrap_or("RollingUpdate");
    let rolling = strategy.and_then(|s| s.rolling_update.as_ref());
    (
        kind,
        rolling.and_then(|r| r.max_surge.as_ref()),
        rolling.and_then(|r| r.max_unavailable.as_ref()),
    )
}

/// An `int-or-percent` of `total`: percentages rounded up or down.
pub fn scaled(value: Option<&IntOrString>, total: i32, round_up: bool) -> i32 {
    match value {
        None => 0,
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(text)) => {
            let percent: f64 = text
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .unwrap_or(0.0);
            let exact = percent * f64::from(total) / 100.0;
            let rounded = if round_up {
                exact.ceil()
            } else {
                exact.floor()
            };
            // Within i32: percent ≤ a few hundred of an i32 total, clamped.
            rounded.clamp(0.0, f64::from(i32::MAX)) as i32
        }
    }
}

/// `(maxSurge, maxUnavailable)` as replica counts for `desired` replicas:
/// surge rounds up, unavailability down, and both 0 makes unavailability 1
/// (a rollout must be able to move).
pub fn fenceposts(deployment: &Deployment, desired: i32) -> (i32, i32) {
    let (_, surge, unavailable) = strategy(deployment);
    let surge = scaled(surge, desired, true);
    let unavailable = scaled(unavailable, desired, false);
    if surge == 0 && unavailable == 0 {
        (0, 1)
    } else {
        (surge, unavailable)
    }
}

/// Replicas a rolling update may run above `spec.replicas`.
pub fn max_surge(deployment: &Deployment) -> i32 {
    if strategy(deployment).0 != "RollingUpdate" {
        return 0;
    }
    fenceposts(deployment, replicas(deployment)).0
}

/// Replicas that may be unavailable during a rolling update (never more
/// than there are).
pub fn max_unavailable(deployment: &Deployment) -> i32 {
    let desired = replicas(deployment);
    if strategy(deployment).0 != "RollingUpdate" || desired == 0 {
        return 0;
    }
    fenceposts(deployment, desired).1.min(desired)
}

/// The size the new ReplicaSet should grow to now: as far as the surge
/// allows (rolling update), or straight to `spec.replicas` (recreate).
pub fn new_replicas(deployment: &Deployment, all: &[ReplicaSet], new: &ReplicaSet) -> i32 {
    let desired = replicas(deployment);
    if is_recreate(deployment) {
        return desired;
    }
    let new_size = size(new);
    let current: i32 = all.iter().map(size).sum();
    let most = desired.saturating_add(max_surge(deployment));
    if current >= most {
        return new_size;
    }
    new_size + (most - current).min(desired - new_size).max(0)
}

/// How many old replicas may go now without going below the minimum
/// available, counting the new ReplicaSet's unavailable pods as lost.
pub fn max_scaled_down(
    deployment: &Deployment,
    all: &[ReplicaSet],
    new: Option<&ReplicaSet>,
) -> i32 {
    let all_pods: i32 = all.iter().map(size).sum();
    let min_available = replicas(deployment) - max_unavailable(deployment);
    let new_unavailable = new.map_or(0, |rs| size(rs) - available(rs));
    all_pods - min_available - new_unavailable
}

/// Sizes for old ReplicaSets (oldest first) that lose their unhealthy
/// replicas first, at most `limit` in all: `(index, new size)` for those
/// that shrink.
pub fn unhealthy_cuts(old: &[ReplicaSet], limit: i32) -> Vec<(usize, i32)> {
    let mut cuts = Vec::new();
    let mut done = 0;
    for (index, rs) in old.iter().enumerate() {
        if done >= limit {
            break;
        }
        let spec = size(rs);
        if spec == 0 || spec == available(rs) {
            continue;
        }
        let cut = (limit - done).min(spec - available(rs));
        cuts.push((index, spec - cut));
        done += cut;
    }
    cuts
}

/// Sizes for old ReplicaSets (oldest first) that shrink while more than
/// the minimum stays available: `(index, new size)`.
pub fn healthy_cuts(
    deployment: &Deployment,
    old: &[ReplicaSet],
    new: Option<&ReplicaSet>,
) -> Vec<(usize, i32)> {
    let min_available = replicas(deployment) - max_unavailable(deployment);
    let available_now: i32 = old.iter().chain(new).map(available).sum();
    if available_now <= min_available {
        return Vec::new();
    }
    let mut budget = available_now - min_available;
    let mut cuts = Vec::new();
    for (index, rs) in old.iter().enumerate() {
        if budget <= 0 {
            break;
        }
        let spec = size(rs);
        if spec == 0 {
            continue;
        }
        let cut = spec.min(budget);
        cuts.push((index, spec - cut));
        budget -= cut;
    }
    cuts
}

/// The one ReplicaSet to resize when at most one has replicas: that one,
/// or with none the new one, else the newest old one. `None` when several
/// have replicas (then proportional scaling decides).
pub fn active_or_latest<'a>(
    new: Option<&'a ReplicaSet>,
    old: &'a [ReplicaSet],
) -> Option<&'a ReplicaSet> {
    let mut newest_first: Vec<&ReplicaSet> = old.iter().collect();
    newest_first.sort_by(|a, b| created_then_named(b, a));
    let active: Vec<&ReplicaSet> = new
        .into_iter()
        .chain(newest_first.iter().copied())
        .filter(|rs| size(rs) > 0)
        .collect();
    match active.len() {
        0 => new.or(newest_first.first().copied()),
        1 => Some(active[0]),
        _ => None,
    }
}

/// Whether the new ReplicaSet alone serves the Deployment: full size,
/// annotated so, all available.
pub fn saturated(deployment: &Deployment, new: &ReplicaSet) -> bool {
    let desired = replicas(deployment);
    size(new) == desired
        && annotation_number(new, super::revision::DESIRED_REPLICAS) == Some(desired)
        && available(new) == desired
}

/// New sizes for the ReplicaSets with replicas when a Deployment is
/// resized mid-rollout: each keeps its share (by the `max-replicas` it was
/// sized for), the largest absorbs the rounding, none goes below zero.
pub fn proportional_sizes(deployment: &Deployment, active: &[ReplicaSet]) -> Vec<i32> {
    let desired = replicas(deployment);
    let surge = max_surge(deployment);
    let allowed = if desired > 0 { desired + surge } else { 0 };
    let total: i32 = active.iter().map(size).sum();
    let to_add = allowed - total;
    let mut order: Vec<usize> = (0..active.len()).collect();
    // Larger first; among equals newer first when growing, older when shrinking.
    order.sort_by(|&a, &b| {
        size(&active[b]).cmp(&size(&active[a])).then_with(|| {
            let age = created_then_named(&active[a], &active[b]);
            if to_add > 0 {
                age.reverse()
            } else {
                age
            }
        })
    });
    let mut sizes: Vec<i32> = active.iter().map(size).collect();
    if to_add == 0 {
        return sizes;
    }
    let status_replicas = deployment
        .status
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(0);
    let mut added = 0;
    for &index in &order {
        let rs = &active[index];
        let spec = size(rs);
        if spec == 0 || to_add == added {
            continue;
        }
        let fraction = if desired == 0 {
            -spec
        } else {
            let base = annotation_number(rs, MAX_REPLICAS).unwrap_or(status_replicas);
            if base == 0 {
                0
            } else {
                let exact = f64::from(spec) * f64::from(desired + surge) / f64::from(base);
                // Half away from zero, as upstream's `int32(x + 0.5)`.
                (exact.round() as i32) - spec
            }
        };
        let left = to_add - added;
        let share = if to_add > 0 {
            fraction.min(left)
        } else {
            fraction.max(left)
        };
        sizes[index] = spec + share;
        added += share;
    }
    // The rest goes to (or comes from) the first, never below zero.
    if let Some(&first) = order.first() {
        sizes[first] = (sizes[first] + to_add - added).max(0);
    }
    sizes
}

fn nonzero(n: i32) -> Option<i32> {
    (n != 0).then_some(n)
}

/// A condition of the status by type.
pub fn condition<'a>(status: &'a DeploymentStatus, kind: &str) -> Option<&'a DeploymentCondition> {
    status.conditions.iter().flatten().find(|c| c.type_ == kind)
}

/// Sets a condition: the same status and reason change nothing; a new
/// reason keeps the transition time; the condition moves to the end.
pub fn set_condition(status: &mut DeploymentStatus, mut new: DeploymentCondition) {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    if let Some(old) = conditions.iter().find(|c| c.type_ == new.type_) {
        if old.status == new.status && old.reason == new.reason {
            return;
        }
        if old.status == new.status {
            new.last_transition_time = old.last_transition_time.clone();
        }
    }
    conditions.retain(|c| c.type_ != new.type_);
    conditions.push(new);
}

pub fn remove_condition(status: &mut DeploymentStatus, kind: &str) {
    if let Some(conditions) = status.conditions.as_mut() {
        conditions.retain(|c| c.type_ != kind);
        if conditions.is_empty() {
            status.conditions = None;
        }
    }
}

/// A condition updated and transitioned `now`.
pub fn new_condition(
    kind: &str,
    status: &str,
    reason: &str,
    message: String,
    now: jiff::Timestamp,
) -> DeploymentCondition {
    DeploymentCondition {
        type_: kind.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_update_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// The counts of every ReplicaSet summed, and `Available` set by whether
/// enough replicas are.
pub fn calculate_status(
    deployment: &Deployment,
    all: &[ReplicaSet],
    new: Option<&ReplicaSet>,
    now: jiff::Timestamp,
) -> DeploymentStatus {
    let old = deployment.status.clone().unwrap_or_default();
    let replicas_sum: i32 = all.iter().map(current).sum();
    let ready: i32 = all.iter().map(|rs| status_of(rs).1).sum();
    let available_sum: i32 = all.iter().map(available).sum();
    let spec_sum: i32 = all.iter().map(size).sum();
    let mut status = DeploymentStatus {
        observed_generation: deployment.metadata.generation,
        replicas: nonzero(replicas_sum),
        updated_replicas: nonzero(new.map_or(0, current)),
        ready_replicas: nonzero(ready),
        available_replicas: nonzero(available_sum),
        unavailable_replicas: nonzero((spec_sum - available_sum).max(0)),
        collision_count: old.collision_count,
        conditions: old.conditions.clone(),
        terminating_replicas: None,
    };
    if available_sum >= replicas(deployment) - max_unavailable(deployment) {
        set_condition(
            &mut status,
            new_condition(
                AVAILABLE,
                "True",
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.".into(),
                now,
            ),
        );
    } else {
        set_condition(
            &mut status,
            new_condition(
                AVAILABLE,
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.".into(),
                now,
            ),
        );
    }
    status
}

fn counts(status: &DeploymentStatus) -> (i32, i32, i32, i32) {
    (
        status.replicas.unwrap_or(0),
        status.updated_replicas.unwrap_or(0),
        status.ready_replicas.unwrap_or(0),
        status.available_replicas.unwrap_or(0),
    )
}

/// Every replica is the new template's, there and available, and the
/// controller has seen the latest spec.
pub fn complete(deployment: &Deployment, status: &DeploymentStatus) -> bool {
    let desired = replicas(deployment);
    let (replicas_now, updated, _, available_now) = counts(status);
    updated == desired
        && replicas_now == desired
        && available_now == desired
        && status.observed_generation >= deployment.metadata.generation
}

/// Whether the rollout moved since the last status: more updated, fewer
/// old, more ready or more available replicas.
fn progressed(old: &DeploymentStatus, new: &DeploymentStatus) -> bool {
    let (old_replicas, old_updated, old_ready, old_available) = counts(old);
    let (replicas_now, updated, ready, available_now) = counts(new);
    updated > old_updated
        || replicas_now - updated < old_replicas - old_updated
        || ready > old_ready
        || available_now > old_available
}

/// The progress deadline in seconds, if the Deployment has one.
pub fn deadline(deployment: &Deployment) -> Option<i64> {
    deployment
        .spec
        .as_ref()
        .and_then(|s| s.progress_deadline_seconds)
        .filter(|s| *s != i32::MAX)
        .map(i64::from)
}

fn timed_out(deployment: &Deployment, status: &DeploymentStatus, now: jiff::Timestamp) -> bool {
    let (Some(seconds), Some(progressing)) = (deadline(deployment), condition(status, PROGRESSING))
    else {
        return false;
    };
    match progressing.reason.as_deref() {
        Some(NEW_RS_AVAILABLE) => false,
        Some(TIMED_OUT) => true,
        _ => progressing
            .last_update_time
            .as_ref()
            .is_some_and(|t| now.as_second() > t.0.as_second() + seconds),
    }
}

/// The status after a rollout step: counts, then `Progressing` (complete,
/// progressing or timed out against the deadline) and `ReplicaFailure`
/// taken from the ReplicaSets.
pub fn rollout_status(
    deployment: &Deployment,
    all: &[ReplicaSet],
    new: Option<&ReplicaSet>,
    now: jiff::Timestamp,
) -> DeploymentStatus {
    let old = deployment.status.clone().unwrap_or_default();
    let mut status = calculate_status(deployment, all, new, now);
    if deadline(deployment).is_none() {
        remove_condition(&mut status, PROGRESSING);
    }
    let current = condition(&status, PROGRESSING).cloned();
    let done = status.replicas == status.updated_replicas
        && current.as_ref().and_then(|c| c.reason.as_deref()) == Some(NEW_RS_AVAILABLE);
    if deadline(deployment).is_some() && !done {
        let what = match new {
            Some(rs) => format!("ReplicaSet {:?}", rs.metadata.name.as_deref().unwrap_or("")),
            None => format!(
                "Deployment {:?}",
                deployment.metadata.name.as_deref().unwrap_or("")
            ),
        };
        if complete(deployment, &status) {
            set_condition(
                &mut status,
                new_condition(
                    PROGRESSING,
                    "True",
                    NEW_RS_AVAILABLE,
                    format!("{what} has successfully progressed."),
                    now,
                ),
            );
        } else if progressed(&old, &status) {
            let mut condition = new_condition(
                PROGRESSING,
                "True",
                "ReplicaSetUpdated",
                format!("{what} is progressing."),
                now,
            );
            // Always replaced, so the update time (the deadline's clock) moves.
            if let Some(current) = current.filter(|c| c.status == "True") {
                condition.last_transition_time = current.last_transition_time;
            }
            remove_condition(&mut status, PROGRESSING);
            status
                .conditions
                .get_or_insert_with(Vec::new)
                .push(condition);
        } else if timed_out(deployment, &status, now) {
            set_condition(
                &mut status,
                new_condition(
                    PROGRESSING,
                    "False",
                    TIMED_OUT,
                    format!("{what} has timed out progressing."),
                    now,
                ),
            );
        }
    }
    let failures: Vec<&ReplicaSet> = new.into_iter().chain(all.iter()).collect();
    let failure = failures.iter().find_map(|rs| {
        rs.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == REPLICA_FAILURE))
    });
    match failure {
        Some(failure) => set_condition(
            &mut status,
            DeploymentCondition {
                type_: REPLICA_FAILURE.into(),
                status: failure.status.clone(),
                reason: failure.reason.clone(),
                message: failure.message.clone(),
                last_update_time: failure.last_transition_time.clone(),
                last_transition_time: failure.last_transition_time.clone(),
            },
        ),
        None => remove_condition(&mut status, REPLICA_FAILURE),
    }
    status
}

/// When to look again at a rollout that has not moved: just after its
/// deadline would pass.
pub fn recheck_after(
    deployment: &Deployment,
    status: &DeploymentStatus,
    now: jiff::Timestamp,
) -> Option<std::time::Duration> {
    let seconds = deadline(deployment)?;
    let progressing = condition(status, PROGRESSING)?;
    if complete(deployment, status) || progressing.reason.as_deref() == Some(TIMED_OUT) {
        return None;
    }
    let updated = progressing.last_update_time.as_ref()?.0.as_second();
    let left = updated + seconds - now.as_second();
    Some(std::time::Duration::from_secs(
        u64::try_from(left.max(0)).unwrap_or(0) + 1,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(
        replicas: i32,
        surge: serde_json::Value,
        unavailable: serde_json::Value,
    ) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "generation": 1},
            "spec": {"replicas": replicas, "selector": {}, "template": {},
                "progressDeadlineSeconds": 600,
                "strategy": {"type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}}},
        }))
        .unwrap()
    }

    fn rs(name: &str, created: &str, spec: i32, available: i32, max: Option<i32>) -> ReplicaSet {
        let mut annotations = serde_json::Map::new();
        if let Some(max) = max {
            annotations.insert(MAX_REPLICAS.into(), json!(max.to_string()));
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "creationTimestamp": created, "annotations": annotations},
            "spec": {"replicas": spec, "selector": {}},
            "status": {"replicas": spec, "readyReplicas": available, "availableReplicas": available},
        }))
        .unwrap()
    }

    #[test]
    fn fenceposts_round_surge_up_and_unavailability_down() {
        assert_eq!(
            fenceposts(&deployment(10, json!("25%"), json!("25%")), 10),
            (3, 2)
        );
        assert_eq!(
            fenceposts(&deployment(1, json!("25%"), json!("25%")), 1),
            (1, 0)
        );
        assert_eq!(
            fenceposts(&deployment(3, json!(0), json!("10%")), 3),
            (0, 1)
        );
        assert_eq!(max_unavailable(&deployment(2, json!(0), json!(5))), 2);
        let mut recreate = deployment(3, json!(1), json!(1));
        recreate.spec.as_mut().unwrap().strategy =
            serde_json::from_value(json!({"type": "Recreate"})).unwrap();
        assert_eq!((max_surge(&recreate), max_unavailable(&recreate)), (0, 0));
    }

    #[test]
    fn the_new_replica_set_grows_within_the_surge() {
        let d = deployment(10, json!("25%"), json!("25%"));
        let old = rs("a", "2026-01-01T00:00:00Z", 10, 10, None);
        let new = rs("b", "2026-01-02T00:00:00Z", 0, 0, None);
        assert_eq!(new_replicas(&d, &[old.clone(), new.clone()], &new), 3);
        let grown = rs("b", "2026-01-02T00:00:00Z", 3, 0, None);
        assert_eq!(
            new_replicas(&d, &[old, grown.clone()], &grown),
            3,
            "13 is the most"
        );
    }

    #[test]
    fn old_replicas_go_unhealthy_first_then_within_availability() {
        let d = deployment(10, json!("25%"), json!("25%"));
        let old = vec![rs("a", "2026-01-01T00:00:00Z", 10, 8, None)];
        let new = rs("b", "2026-01-02T00:00:00Z", 3, 0, None);
        let all = [old[0].clone(), new.clone()];
        // 13 pods, 8 must stay available, 3 new ones are not: 2 may go.
        assert_eq!(max_scaled_down(&d, &all, Some(&new)), 2);
        assert_eq!(unhealthy_cuts(&old, 2), vec![(0, 8)]);
        let healthy = vec![rs("a", "2026-01-01T00:00:00Z", 8, 8, None)];
        let ready_new = rs("b", "2026-01-02T00:00:00Z", 3, 3, None);
        // 11 available, 8 needed: 3 old replicas may go.
        assert_eq!(healthy_cuts(&d, &healthy, Some(&ready_new)), vec![(0, 5)]);
    }

    #[test]
    fn a_resize_mid_rollout_is_shared_in_proportion() {
        // Upstream's example: 10 replicas, surge 3, ReplicaSets of 8 and 5
        // (13 = the most); resized to 15 (18 now): 5 more, shared 3 and 2.
        let d = deployment(15, json!(3), json!(0));
        let active = [
            rs("a", "2026-01-01T00:00:00Z", 8, 8, Some(13)),
            rs("b", "2026-01-02T00:00:00Z", 5, 0, Some(13)),
        ];
        let sizes = proportional_sizes(&d, &active);
        assert_eq!(sizes.iter().sum::<i32>(), 18);
        assert_eq!(sizes, vec![11, 7]);
        let zero = deployment(0, json!(3), json!(0));
        assert_eq!(proportional_sizes(&zero, &active), vec![0, 0]);
    }

    #[test]
    fn active_or_latest_picks_the_one_to_resize() {
        let new = rs("b", "2026-01-02T00:00:00Z", 0, 0, None);
        let old = [
            rs("a", "2026-01-01T00:00:00Z", 0, 0, None),
            rs("c", "2026-01-03T00:00:00Z", 0, 0, None),
        ];
        assert_eq!(
            active_or_latest(Some(&new), &old)
                .unwrap()
                .metadata
                .name
                .as_deref(),
            Some("b")
        );
        assert_eq!(
            active_or_latest(None, &old)
                .unwrap()
                .metadata
                .name
                .as_deref(),
            Some("c")
        );
        let busy = [
            rs("a", "2026-01-01T00:00:00Z", 2, 0, None),
            rs("c", "2026-01-03T00:00:00Z", 1, 0, None),
        ];
        assert!(active_or_latest(None, &busy).is_none());
    }

    #[test]
    fn progress_is_complete_moving_or_timed_out() {
        let now: jiff::Timestamp = "2026-11-27T10:00:00Z".parse().unwrap();
        let mut d = deployment(2, json!(1), json!(0));
        let new = rs("web-1", "2026-01-01T00:00:00Z", 2, 1, None);
        let status = rollout_status(&d, std::slice::from_ref(&new), Some(&new), now);
        let progressing = condition(&status, PROGRESSING).unwrap();
        assert_eq!(progressing.reason.as_deref(), Some("ReplicaSetUpdated"));
        assert_eq!(
            progressing.message.as_deref(),
            Some("ReplicaSet \"web-1\" is progressing.")
        );
        assert_eq!(
            condition(&status, AVAILABLE).unwrap().status,
            "False",
            "1 of 2, none may be unavailable"
        );
        d.status = Some(status);
        let later = jiff::Timestamp::from_second(now.as_second() + 601).unwrap();
        assert_eq!(
            recheck_after(&d, d.status.as_ref().unwrap(), now),
            Some(std::time::Duration::from_secs(601))
        );
        let stuck = rollout_status(&d, std::slice::from_ref(&new), Some(&new), later);
        assert_eq!(
            condition(&stuck, PROGRESSING).unwrap().reason.as_deref(),
            Some(TIMED_OUT)
        );
        let done = rs("web-1", "2026-01-01T00:00:00Z", 2, 2, None);
        let finished = rollout_status(&d, std::slice::from_ref(&done), Some(&done), later);
        let progressing = condition(&finished, PROGRESSING).unwrap();
        assert_eq!(progressing.reason.as_deref(), Some(NEW_RS_AVAILABLE));
        assert_eq!(
            progressing.message.as_deref(),
            Some("ReplicaSet \"web-1\" has successfully progressed.")
        );
        assert!(complete(&d, &finished));
    }
}
