//! What a Job's pods add up to (pure, unit-tested): which finished pods are
//! still to be counted (they hold the `batch.kubernetes.io/job-tracking`
//! finalizer until the Job's status has them), which failures the pod
//! failure policy ignores or turns into a failed Job, and how many pods —
//! or which indexes — should run now.

use std::collections::BTreeSet;

use k8s_openapi::api::batch::v1::{Job, PodFailurePolicyRule};
use k8s_openapi::api::core::v1::Pod;

/// The finalizer a Job's pods keep until they are counted.
pub const TRACKING: &str = "batch.kubernetes.io/job-tracking";
/// The label and annotation with a pod's completion index.
pub const INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// What a finished pod means for its Job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed,
    /// A failure the pod failure policy ignores (not counted).
    Ignored,
    /// A failure that fails the Job (`FailJob`), with the message.
    FailsJob(String),
}

pub fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

pub fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// The pod's completion index (Indexed Jobs).
pub fn index(pod: &Pod) -> Option<i64> {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(INDEX))
        .and_then(|i| i.parse().ok())
}

pub fn tracked(pod: &Pod) -> bool {
    pod.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == TRACKING)
}

/// Running or about to: not finished, not being deleted.
pub fn is_active(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase(pod), Some("Succeeded" | "Failed"))
}

/// A finished pod's outcome; `None` while it runs. A pod deleted before it
/// finished counts as failed, as upstream's.
pub fn outcome(job: &Job, pod: &Pod) -> Option<Outcome> {
    match phase(pod) {
        Some("Succeeded") => Some(Outcome::Succeeded),
        Some("Failed") => Some(by_policy(job, pod)),
        _ if pod.metadata.deletion_timestamp.is_some() => Some(Outcome::Failed),
        _ => None,
    }
}

/// The pod failure policy's verdict on a failed pod: the first rule that
/// matches decides (`FailJob`, `Ignore`, `Count`); none counts it.
fn by_policy(job: &Job, pod: &Pod) -> Outcome {
    let rules = job
        .spec
        .as_ref()
        .and_then(|s| s.pod_failure_policy.as_ref())
        .map(|p| p.rules.as_slice())
        .unwrap_or_default();
    for (at, rule) in rules.iter().enumerate() {
        let Some(why) = rule_matches(rule, pod) else {
            continue;
        };
        return match rule.action.as_str() {
            "FailJob" => Outcome::FailsJob(format!("{why} matching FailJob rule at index {at}")),
            "Ignore" => Outcome::Ignored,
            _ => Outcome::Failed,
        };
    }
    Outcome::Failed
}

/// Why a rule matches the pod (the start of upstream's message), if it
/// does.
fn rule_matches(rule: &PodFailurePolicyRule, pod: &Pod) -> Option<String> {
    let name = format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    );
    if let Some(codes) = &rule.on_exit_codes {
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref());
        for status in statuses.into_iter().flatten() {
            if codes
                .container_name
                .as_ref()
                .is_some_and(|c| *c != status.name)
            {
                continue;
            }
            let Some(code) = status
                .state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .map(|t| t.exit_code)
            else {
                continue;
            };
            let listed = codes.values.contains(&code);
            let hit = match codes.operator.as_str() {
                "In" => listed,
                "NotIn" => !listed && code != 0,
                _ => false,
            };
            if hit {
                return Some(format!(
                    "Container {} for pod {name} failed with exit code {code}",
                    status.name
                ));
            }
        }
    }
    for pattern in rule.on_pod_conditions.iter().flatten() {
        let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
        // The API defaults an omitted status to True.
        let status = Some(pattern.status.as_str())
            .filter(|s| !s.is_empty())
            .unwrap_or("True");
        if conditions
            .into_iter()
            .flatten()
            .any(|c| c.type_ == pattern.type_ && c.status == status)
        {
            return Some(format!(
                "Pod {name} has condition {} matching",
                pattern.type_
            ));
        }
    }
    None
}

/// `"0-2,5"`: indexes as Kubernetes writes `completedIndexes`.
pub fn format_indexes(indexes: &BTreeSet<i64>) -> String {
    let mut parts = Vec::new();
    let mut iter = indexes.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end = iter.next().unwrap_or(end);
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    parts.join(",")
}

/// The indexes of `"0-2,5"` (unparsable parts are skipped).
pub fn parse_indexes(text: &str) -> BTreeSet<i64> {
    let mut indexes = BTreeSet::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<i64>(), b.parse::<i64>()) {
                    indexes.extend(a..=b.min(a.saturating_add(1_000_000)));
                }
            }
            None => indexes.extend(part.parse::<i64>().ok()),
        }
    }
    indexes
}

/// How many more pods a non-indexed Job runs now.
pub fn wanted_active(completions: Option<i32>, parallelism: i32, succeeded: i32) -> i32 {
    match completions {
        Some(total) => parallelism.min(total - succeeded).max(0),
        None if succeeded > 0 => 0,
        None => parallelism,
    }
}

/// The indexes an Indexed Job starts now: the lowest not completed and not
/// running, as many as `room`.
pub fn next_indexes(
    completions: i32,
    completed: &BTreeSet<i64>,
    running: &BTreeSet<i64>,
    room: usize,
) -> Vec<i64> {
    (0..i64::from(completions))
        .filter(|i| !completed.contains(i) && !running.contains(i))
        .take(room)
        .collect()
}

/// The wait before a failed Job's next pod: 10 s doubling per failure, at
/// most six minutes (upstream's pod failure backoff).
pub fn backoff(failures: i32) -> std::time::Duration {
    if failures <= 0 {
        return std::time::Duration::ZERO;
    }
    let doublings = u32::try_from(failures - 1).unwrap_or(0).min(10);
    (std::time::Duration::from_secs(10) * 2u32.pow(doublings))
        .min(std::time::Duration::from_secs(360))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn indexes_are_written_as_ranges() {
        let set: BTreeSet<i64> = [0, 1, 2, 5, 7, 8].into();
        assert_eq!(format_indexes(&set), "0-2,5,7-8");
        assert_eq!(parse_indexes("0-2,5,7-8"), set);
        assert_eq!(format_indexes(&BTreeSet::new()), "");
        let running: BTreeSet<i64> = [3].into();
        assert_eq!(next_indexes(6, &[0, 1].into(), &running, 2), vec![2, 4]);
    }

    #[test]
    fn wanted_pods_and_backoff() {
        assert_eq!(wanted_active(Some(5), 2, 4), 1);
        assert_eq!(wanted_active(Some(5), 2, 0), 2);
        assert_eq!(wanted_active(None, 3, 0), 3);
        assert_eq!(
            wanted_active(None, 3, 1),
            0,
            "a work queue is done once one succeeds"
        );
        assert_eq!(backoff(1).as_secs(), 10);
        assert_eq!(backoff(3).as_secs(), 40);
        assert_eq!(backoff(30).as_secs(), 360);
    }

    #[test]
    fn the_pod_failure_policy_decides_what_a_failure_means() {
        let job: Job = serde_json::from_value(json!({"metadata": {"name": "j"}, "spec": {"template": {},
            "podFailurePolicy": {"rules": [
                {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}},
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}}})).unwrap();
        let failed = |code: i32, condition: Option<&str>| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns"},
                "status": {"phase": "Failed",
                    "conditions": condition.map(|c| vec![json!({"type": c, "status": "True"})]).unwrap_or_default(),
                    "containerStatuses": [{"name": "main", "image": "", "imageID": "", "ready": false, "restartCount": 0,
                        "state": {"terminated": {"exitCode": code}}}]}})).unwrap()
        };
        assert_eq!(
            outcome(&job, &failed(42, None)),
            Some(Outcome::FailsJob("Container main for pod ns/p failed with exit code 42 matching FailJob rule at index 0".into()))
        );
        assert_eq!(
            outcome(&job, &failed(1, Some("DisruptionTarget"))),
            Some(Outcome::Ignored)
        );
        assert_eq!(outcome(&job, &failed(1, None)), Some(Outcome::Failed));
    }
}
