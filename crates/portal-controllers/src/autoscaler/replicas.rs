//! How many replicas one resource metric asks for, as kube-controller-
//! manager's replica calculator: the pods' usage against their requests
//! (or against a target average value), a ratio within the tolerance
//! leaving the count alone, and pods without a usable sample handled so
//! that they can never cause a scale the other way: on a scale-up unready
//! pods and pods without metrics count as idle, on a scale-down pods without
//! metrics count as using all they asked for.

use std::collections::BTreeMap;

/// A ratio within this of 1 changes nothing (`--horizontal-pod-autoscaler-tolerance`).
pub(crate) const TOLERANCE: f64 = 0.1;

/// What the calculator knows of one pod of the target.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PodSample {
    pub(crate) name: String,
    pub(crate) group: Group,
    /// Usage (millicores or bytes) if the metrics API has the pod.
    pub(crate) usage: Option<i64>,
    /// The pod's request of the resource (sum over containers); `None`
    /// when a container asks for none.
    pub(crate) request: Option<i64>,
}

/// How a pod counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Group {
    /// Running and ready (or a memory metric, which readiness does not
    /// affect).
    Ready,
    /// Pending, or CPU not yet trustworthy (just started, not ready).
    Unready,
    /// Being deleted or failed: not counted at all.
    Ignored,
}

/// What the target asks of the pods.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Target {
    /// Percent of the pods' requests.
    Utilization(i64),
    /// Average usage per pod (millicores or bytes).
    AverageValue(i64),
}

/// The outcome for one metric.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Recommendation {
    pub(crate) replicas: i32,
    /// Usage as a percent of requests (utilization targets only).
    pub(crate) utilization: Option<i64>,
    /// Average usage per ready pod with metrics.
    pub(crate) average: i64,
}

/// The replica count for `pods` of a target at `current` replicas.
pub(crate) fn replicas(
    current: i32,
    pods: &[PodSample],
    target: Target,
) -> Result<Recommendation, String> {
    let mut usage: BTreeMap<&str, i64> = BTreeMap::new();
    let mut requests: BTreeMap<&str, i64> = BTreeMap::new();
    let mut unready = Vec::new();
    let mut missing = Vec::new();
    let mut ready_count = 0i64;
    for pod in pods {
        let request = match target {
            Target::Utilization(_) => match pod.request {
                Some(request) if request > 0 => request,
                _ => {
                    return Err(format!(
                        "missing request for the resource in a container of pod {}",
                        pod.name
                    ))
                }
            },
            // A target average is each pod's share: the same request for all.
            Target::AverageValue(value) => value,
        };
        match (pod.group, pod.usage) {
            (Group::Ignored, _) => continue,
            (Group::Unready, _) => unready.push(pod.name.as_str()),
            (Group::Ready, None) => missing.push(pod.name.as_str()),
            (Group::Ready, Some(used)) => {
                usage.insert(&pod.name, used);
                ready_count += 1;
            }
        }
        requests.insert(&pod.name, request);
    }
    if usage.is_empty() {
        return Err("did not receive metrics for targeted pods (pods might be unready)".into());
    }
    let percent = match target {
        Target::Utilization(percent) => percent,
        Target::AverageValue(_) => 100,
    };
    let (ratio, utilization, average) = usage_ratio(&usage, &requests, percent);
    let recommendation = |replicas| Recommendation {
        replicas,
        utilization: matches!(target, Target::Utilization(_)).then_some(utilization),
        average,
    };
    let scale_up_with_unready = !unready.is_empty() && ratio > 1.0;
    if !scale_up_with_unready && missing.is_empty() {
        if (1.0 - ratio).abs() <= TOLERANCE {
            return Ok(recommendation(current));
        }
        return Ok(recommendation(ceil(ratio * ready_count as f64)));
    }
    // Pods without a sample pull towards no change.
    for pod in &missing {
        if ratio < 1.0 {
            let request = requests.get(pod).copied().unwrap_or(0);
            usage.insert(pod, request.saturating_mul(percent.max(100)) / 100);
        } else if ratio > 1.0 {
            usage.insert(pod, 0);
        }
    }
    if scale_up_with_unready {
        for pod in &unready {
            usage.insert(pod, 0);
        }
    }
    let (new_ratio, _, _) = usage_ratio(&usage, &requests, percent);
    if (1.0 - new_ratio).abs() <= TOLERANCE
        || (ratio < 1.0 && new_ratio > 1.0)
        || (ratio > 1.0 && new_ratio < 1.0)
    {
        return Ok(recommendation(current));
    }
    let replicas = ceil(new_ratio * usage.len() as f64);
    if (new_ratio < 1.0 && replicas > current) || (new_ratio > 1.0 && replicas < current) {
        return Ok(recommendation(current));
    }
    Ok(recommendation(replicas))
}

/// The usage ratio to the target, the utilization (percent of requests),
/// and the average usage, over the pods with usage.
fn usage_ratio(
    usage: &BTreeMap<&str, i64>,
    requests: &BTreeMap<&str, i64>,
    percent: i64,
) -> (f64, i64, i64) {
    let mut used = 0i64;
    let mut requested = 0i64;
    for (pod, value) in usage {
        used = used.saturating_add(*value);
        requested = requested.saturating_add(requests.get(pod).copied().unwrap_or(0));
    }
    let utilization = if requested > 0 {
        used.saturating_mul(100) / requested
    } else {
        0
    };
    let ratio = utilization as f64 / percent.max(1) as f64;
    let average = used / (usage.len().max(1) as i64);
    (ratio, utilization, average)
}

fn ceil(value: f64) -> i32 {
    let rounded = value.ceil();
    if rounded >= f64::from(i32::MAX) {
        i32::MAX
    } else {
        rounded.max(0.0) as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, group: Group, usage: Option<i64>, request: i64) -> PodSample {
        PodSample {
            name: name.into(),
            group,
            usage,
            request: Some(request),
        }
    }

    #[test]
    fn scales_to_the_ratio_and_holds_within_the_tolerance() {
        // One pod at 900m of 500m asked, target 50%: 180% → ceil(3.6) = 4.
        let busy = [pod("a", Group::Ready, Some(900), 500)];
        let up = replicas(1, &busy, Target::Utilization(50)).expect("computes");
        assert_eq!((up.replicas, up.utilization), (4, Some(180)));
        // 52% of a 50% target is within 10%: no change.
        let near = [
            pod("a", Group::Ready, Some(260), 500),
            pod("b", Group::Ready, Some(260), 500),
        ];
        assert_eq!(
            replicas(2, &near, Target::Utilization(50))
                .expect("computes")
                .replicas,
            2
        );
        // Idle: down to what the usage needs (at least one).
        let idle = [
            pod("a", Group::Ready, Some(10), 500),
            pod("b", Group::Ready, Some(10), 500),
        ];
        assert_eq!(
            replicas(2, &idle, Target::Utilization(50))
                .expect("computes")
                .replicas,
            1
        );
    }

    #[test]
    fn pods_without_samples_never_push_the_other_way() {
        // Scale-up: the unready pod counts as idle. (900 + 0) / 1000 = 90%
        // of a 50% target: ceil(1.8 * 2) = 4.
        let pods = [
            pod("a", Group::Ready, Some(900), 500),
            pod("b", Group::Unready, None, 500),
        ];
        assert_eq!(
            replicas(2, &pods, Target::Utilization(50))
                .expect("computes")
                .replicas,
            4
        );
        // Scale-down: a pod without metrics counts as using all it asked:
        // (50 + 500) / 1000 = 55%, within 10% of 50%: no change.
        let pods = [
            pod("a", Group::Ready, Some(50), 500),
            pod("b", Group::Ready, None, 500),
        ];
        assert_eq!(
            replicas(2, &pods, Target::Utilization(50))
                .expect("computes")
                .replicas,
            2
        );
        // Deleted pods are not counted.
        let pods = [
            pod("a", Group::Ready, Some(250), 500),
            pod("b", Group::Ignored, Some(5000), 500),
        ];
        assert_eq!(
            replicas(1, &pods, Target::Utilization(50))
                .expect("computes")
                .replicas,
            1
        );
    }

    #[test]
    fn needs_requests_and_samples() {
        let mut no_request = pod("a", Group::Ready, Some(100), 0);
        no_request.request = None;
        let error = replicas(1, &[no_request], Target::Utilization(50)).expect_err("refused");
        assert!(error.contains("missing request"), "{error}");
        let unready = [pod("a", Group::Unready, None, 500)];
        let error = replicas(1, &unready, Target::Utilization(50)).expect_err("refused");
        assert!(error.contains("did not receive metrics"), "{error}");
    }

    #[test]
    fn an_average_value_is_a_share_per_pod() {
        // 300Mi used over two pods, target 100Mi each: ceil(1.5 * 2) = 3.
        let mib = 1024 * 1024;
        let pods = [
            pod("a", Group::Ready, Some(200 * mib), 0),
            pod("b", Group::Ready, Some(100 * mib), 0),
        ];
        let recommendation = replicas(2, &pods, Target::AverageValue(100 * mib)).expect("computes");
        assert_eq!(
            (recommendation.replicas, recommendation.average),
            (3, 150 * mib)
        );
        assert_eq!(recommendation.utilization, None);
    }
}
