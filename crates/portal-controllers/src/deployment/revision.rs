//! What ties a Deployment's template to its ReplicaSets: the
//! `pod-template-hash` that names them and tells their pods apart, template
//! equality that ignores it, and the revision annotations `kubectl rollout
//! history` and `undo` read.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::Value;

/// The label that tells a template's pods and ReplicaSet from others.
pub const HASH_LABEL: &str = "pod-template-hash";
/// The revision of a ReplicaSet (and of its Deployment's current one).
pub const REVISION: &str = "deployment.kubernetes.io/revision";
/// Earlier revisions a re-used ReplicaSet had, comma-separated.
pub const REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
/// `spec.replicas` of the Deployment when it last sized this ReplicaSet.
pub const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
/// `spec.replicas` plus the surge then: the base of proportional scaling.
pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
/// How long `revision-history` may grow.
const MAX_HISTORY_LENGTH: usize = 2000;

/// Deployment annotations never copied to its ReplicaSets.
const NOT_COPIED: &[&str] = &[
    "kubectl.kubernetes.io/last-applied-configuration",
    REVISION,
    REVISION_HISTORY,
    DESIRED_REPLICAS,
    MAX_REPLICAS,
    "deprecated.deployment.rollback.to",
];

/// Digits of the hash, mapped as Kubernetes' `SafeEncodeString` does so
/// that names never spell words or look like numbers.
const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// The `pod-template-hash` of a template: FNV-1a (32 bits) of it, then of
/// the collision count when there is one, in decimal, each digit mapped
/// into [`ALPHABET`]. Kubernetes hashes a Go dump of the struct, which has
/// no Rust equivalent; this hashes its canonical JSON (sorted keys, empty
/// values left out), so equal templates hash equal.
pub fn template_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let mut hash: u32 = 2_166_136_261;
    let mut write = |bytes: &[u8]| {
        for byte in bytes {
            hash ^= u32::from(*byte);
            hash = hash.wrapping_mul(16_777_619);
        }
    };
    let canonical = canonical(serde_json::to_value(template).unwrap_or_default());
    write(canonical.to_string().as_bytes());
    if let Some(count) = collision_count {
        // As upstream's `uint32(count)`, little-endian, padded to 8 bytes.
        write(&count.to_le_bytes());
        write(&[0; 4]);
    }
    hash.to_string()
        .bytes()
        .map(|digit| char::from(ALPHABET[usize::from(digit) % ALPHABET.len()]))
        .collect()
}

/// The value with nulls, empty objects and empty lists left out and keys
/// sorted: what Kubernetes' semantic equality compares (none and empty are
/// alike).
fn canonical(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let sorted: BTreeMap<String, Value> = map
                .into_iter()
                .map(|(k, v)| (k, canonical(v)))
                .filter(|(_, v)| !is_empty(v))
                .collect();
            Value::Object(sorted.into_iter().collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(canonical).collect()),
        other => other,
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

/// Whether two templates are the same but for the hash label.
pub fn equal_ignoring_hash(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    let strip = |template: &PodTemplateSpec| {
        let mut template = template.clone();
        if let Some(labels) = template.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
            labels.remove(HASH_LABEL);
        }
        canonical(serde_json::to_value(template).unwrap_or_default())
    };
    strip(a) == strip(b)
}

/// A ReplicaSet's revision (0 when it has none or it does not parse).
pub fn revision(rs: &ReplicaSet) -> i64 {
    rs.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REVISION))
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// The highest revision among the ReplicaSets.
pub fn max_revision<'a>(sets: impl IntoIterator<Item = &'a ReplicaSet>) -> i64 {
    sets.into_iter().map(revision).max().unwrap_or(0)
}

/// Brings the new ReplicaSet's annotations up to date with its Deployment:
/// the Deployment's own (but for [`NOT_COPIED`]), the revision (when it
/// rises, the old one joins the history), and on a new ReplicaSet the
/// replica annotations. Whether anything changed.
pub fn set_new_annotations(
    deployment: &Deployment,
    rs: &mut ReplicaSet,
    new_revision: i64,
    exists: bool,
    max_surge: i32,
) -> bool {
    let annotations = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let mut changed = false;
    for (key, value) in deployment.metadata.annotations.iter().flatten() {
        if NOT_COPIED.contains(&key.as_str()) || annotations.get(key) == Some(value) {
            continue;
        }
        annotations.insert(key.clone(), value.clone());
        changed = true;
    }
    let old = annotations.get(REVISION).cloned().unwrap_or_default();
    let old_number = if old.is_empty() {
        Some(0)
    } else {
        old.parse::<i64>().ok()
    };
    if let Some(old_number) = old_number.filter(|n| *n < new_revision) {
        annotations.insert(REVISION.into(), new_revision.to_string());
        changed = true;
        if old_number > 0 {
            let history = match annotations.get(REVISION_HISTORY) {
                Some(h) if !h.is_empty() => format!("{h},{old}"),
                _ => old.clone(),
            };
            // Oldest entries go first when the history grows too long.
            let mut entries: Vec<&str> = history.split(',').collect();
            while entries.join(",").len() > MAX_HISTORY_LENGTH && entries.len() > 1 {
                entries.remove(0);
            }
            let history = entries.join(",");
            if history.len() <= MAX_HISTORY_LENGTH {
                annotations.insert(REVISION_HISTORY.into(), history);
            }
        }
    }
    if !exists {
        changed |= set_replicas_annotations(rs, replicas(deployment), max_surge);
    }
    changed
}

/// Records the Deployment's size and surge on the ReplicaSet; whether they
/// changed.
pub fn set_replicas_annotations(rs: &mut ReplicaSet, desired: i32, max_surge: i32) -> bool {
    let annotations = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let mut changed = false;
    for (key, value) in [
        (DESIRED_REPLICAS, desired),
        (MAX_REPLICAS, desired.saturating_add(max_surge)),
    ] {
        let value = value.to_string();
        if annotations.get(key) != Some(&value) {
            annotations.insert(key.into(), value);
            changed = true;
        }
    }
    changed
}

/// Whether the ReplicaSet's replica annotations say `desired` and `max`.
pub fn replicas_annotated(rs: &ReplicaSet, desired: i32, max_surge: i32) -> bool {
    let get = |key| {
        rs.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .and_then(|v| v.parse::<i32>().ok())
    };
    get(DESIRED_REPLICAS) == Some(desired)
        && get(MAX_REPLICAS) == Some(desired.saturating_add(max_surge))
}

/// An integer annotation of a ReplicaSet.
pub fn annotation_number(rs: &ReplicaSet, key: &str) -> Option<i32> {
    rs.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .and_then(|v| v.parse().ok())
}

/// The Deployment's `spec.replicas` (1 when not given, as defaulted).
pub fn replicas(deployment: &Deployment) -> i32 {
    deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template(image: &str) -> PodTemplateSpec {
        serde_json::from_value(json!({
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": image}]}
        }))
        .unwrap()
    }

    #[test]
    fn the_hash_is_stable_and_in_kubernetes_alphabet() {
        let a = template("nginx:1");
        assert_eq!(template_hash(&a, None), template_hash(&a.clone(), None));
        assert_ne!(
            template_hash(&a, None),
            template_hash(&template("nginx:2"), None)
        );
        assert_ne!(
            template_hash(&a, None),
            template_hash(&a, Some(0)),
            "no count and a count of 0 differ, as upstream"
        );
        let hash = template_hash(&a, Some(3));
        assert!(!hash.is_empty() && hash.len() <= 10);
        assert!(hash.chars().all(|c| "4567890bcdf".contains(c)), "{hash}");
    }

    #[test]
    fn equality_ignores_the_hash_label_and_empty_values() {
        let a = template("nginx");
        let mut b = a.clone();
        b.metadata
            .as_mut()
            .unwrap()
            .labels
            .as_mut()
            .unwrap()
            .insert(HASH_LABEL.into(), "abc".into());
        b.metadata.as_mut().unwrap().annotations = Some(BTreeMap::new());
        assert!(equal_ignoring_hash(&a, &b));
        assert!(!equal_ignoring_hash(&a, &template("httpd")));
    }

    #[test]
    fn a_rising_revision_keeps_its_history() {
        let deployment: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "d", "annotations": {"kubernetes.io/change-cause": "x", REVISION: "9"}},
            "spec": {"replicas": 4, "selector": {}, "template": {}}
        }))
        .unwrap();
        let mut rs = ReplicaSet::default();
        assert!(set_new_annotations(&deployment, &mut rs, 1, false, 1));
        let annotations = rs.metadata.annotations.clone().unwrap();
        assert_eq!(annotations[REVISION], "1");
        assert_eq!(annotations["kubernetes.io/change-cause"], "x");
        assert_eq!(annotations[DESIRED_REPLICAS], "4");
        assert_eq!(annotations[MAX_REPLICAS], "5");
        assert!(!annotations.contains_key(REVISION_HISTORY));
        assert!(!set_new_annotations(&deployment, &mut rs, 1, true, 1));
        assert!(set_new_annotations(&deployment, &mut rs, 3, true, 1));
        assert!(set_new_annotations(&deployment, &mut rs, 5, true, 1));
        let annotations = rs.metadata.annotations.unwrap();
        assert_eq!(annotations[REVISION], "5");
        assert_eq!(annotations[REVISION_HISTORY], "1,3");
    }
}
