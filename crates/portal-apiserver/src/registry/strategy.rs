//! What the server itself sets on objects, per kind: system metadata on
//! create, the spec/status split on update, generation tracking.

use portal_api::schema::Generation;
use portal_api::{meta, Resource};
use serde_json::{json, Value};

/// RFC 3339 at second precision, as Kubernetes writes timestamps.
pub(crate) fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Sets a condition, its transition time changing only with its status.
pub(crate) fn set_condition(
    status: &mut Value,
    kind: &str,
    holds: bool,
    reason: &str,
    message: &str,
) {
    let value = if holds { "True" } else { "False" };
    if !status["conditions"].is_array() {
        status["conditions"] = json!([]);
    }
    let Some(conditions) = status["conditions"].as_array_mut() else {
        return;
    };
    let now = now();
    match conditions.iter_mut().find(|c| c["type"] == kind) {
        Some(condition) => {
            if condition["status"] != value {
                condition["lastTransitionTime"] = json!(now);
            }
            condition["status"] = json!(value);
            condition["reason"] = json!(reason);
            condition["message"] = json!(message);
        }
        None => conditions.push(json!({
            "type": kind, "status": value, "reason": reason, "message": message,
            "lastTransitionTime": now,
        })),
    }
}

/// Fills in system metadata and the initial status of a new object.
pub(crate) fn prepare_create(resource: &Resource, object: &mut Value, namespace: Option<&str>) {
    let metadata = meta::metadata_mut(object);
    for field in [
        "resourceVersion",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
    ] {
        metadata.remove(field);
    }
    metadata.insert(
        "uid".into(),
        Value::String(uuid::Uuid::new_v4().to_string()),
    );
    metadata.insert("creationTimestamp".into(), Value::String(now()));
    match namespace {
        Some(ns) if resource.namespaced => {
            metadata.insert("namespace".into(), Value::String(ns.to_owned()))
        }
        _ => metadata.remove("namespace"),
    };
    if resource.generation != Generation::Untracked {
        metadata.insert("generation".into(), json!(1));
    } else {
        metadata.remove("generation");
    }
    (resource.prepare_create)(object);
}

/// What a write to an existing object is aimed at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    /// The object itself (everything but `.status`).
    Main,
    /// The `status` subresource (only `.status`).
    Status,
    /// A Namespace's `finalize` subresource (only `spec.finalizers`).
    Finalize,
    /// A CertificateSigningRequest's `approval` subresource (only
    /// `status.conditions`).
    Approval,
    /// The `scale` subresource: the replica count of the object itself,
    /// recorded and admitted as a write of `scale`.
    Scale,
}

impl Part {
    /// Its subresource's name, as `managedFields` records it.
    pub(crate) fn subresource(self) -> Option<&'static str> {
        match self {
            Part::Main => None,
            Part::Status => Some("status"),
            Part::Finalize => Some("finalize"),
            Part::Approval => Some("approval"),
            Part::Scale => Some("scale"),
        }
    }
}

/// Carries over from `old` what an update may not change. A write to the
/// `status` subresource changes only `.status`, one to `finalize` only
/// `spec.finalizers`; a write to the object itself changes everything but
/// `.status` and the server-owned fields.
pub(crate) fn prepare_update(resource: &Resource, new: &mut Value, old: &Value, part: Part) {
    if part == Part::Finalize {
        let finalizers = new.pointer("/spec/finalizers").cloned();
        *new = old.clone();
        match finalizers {
            Some(finalizers) => new["spec"]["finalizers"] = finalizers,
            None => drop(
                new.get_mut("spec")
                    .and_then(Value::as_object_mut)
                    .map(|spec| spec.remove("finalizers")),
            ),
        }
        return;
    }
    if part == Part::Approval {
        let conditions = new.pointer("/status/conditions").cloned();
        *new = old.clone();
        match conditions {
            Some(conditions) => new["status"]["conditions"] = conditions,
            None => drop(
                new.get_mut("status")
                    .and_then(Value::as_object_mut)
                    .map(|status| status.remove("conditions")),
            ),
        }
        return;
    }
    if part == Part::Status {
        let status = new.get("status").cloned();
        let annotations = meta::metadata(new).get("annotations").cloned();
        *new = old.clone();
        match status {
            Some(status) => new["status"] = status,
            None => drop(new.as_object_mut().map(|o| o.remove("status"))),
        }
        // The controller's own annotations travel with its report.
        if resource.generation == Generation::SpecAndAnnotations {
            let metadata = meta::metadata_mut(new);
            match annotations {
                Some(annotations) => metadata.insert("annotations".into(), annotations),
                None => metadata.remove("annotations"),
            };
        }
        return;
    }
    if resource.has_status {
        match old.get("status") {
            Some(status) => new["status"] = status.clone(),
            None => drop(new.as_object_mut().map(|o| o.remove("status"))),
        }
    }
    let old_meta = meta::metadata(old).clone();
    let metadata = meta::metadata_mut(new);
    for field in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "namespace",
        "name",
    ] {
        match old_meta.get(field) {
            Some(value) => metadata.insert(field.into(), value.clone()),
            None => metadata.remove(field),
        };
    }
    metadata.remove("resourceVersion");
    let changed = match resource.generation {
        Generation::Untracked => false,
        Generation::Spec => new.get("spec") != old.get("spec"),
        Generation::SpecAndAnnotations => {
            new.get("spec") != old.get("spec")
                || annotations_of(meta::metadata(new)) != annotations_of(&old_meta)
        }
        Generation::Content => {
            let content = |object: &Value| {
                object.as_object().map(|map| {
                    map.iter()
                        .filter(|(k, _)| {
                            *k != "metadata" && !(*k == "status" && resource.has_status)
                        })
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect::<std::collections::BTreeMap<_, _>>()
                })
            };
            content(new) != content(old)
        }
    };
    if changed {
        let generation = old_meta
            .get("generation")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            + 1;
        meta::metadata_mut(new).insert("generation".into(), json!(generation));
    }
    // Server-owned fields (a Namespace's finalizers live on its spec).
    for field in resource.kept_on_update {
        if let Some(kept) = old.get(*field) {
            new[*field] = kept.clone();
        }
    }
}

/// Whether an update would store the same object again (then nothing is
/// written and the resourceVersion stays).
pub(crate) fn unchanged(new: &Value, old: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        meta::metadata_mut(&mut v).remove("resourceVersion");
        v
    };
    strip(new) == strip(old)
}

/// The annotations, none and `{}` alike (as Kubernetes' semantic equality).
fn annotations_of(metadata: &serde_json::Map<String, Value>) -> Option<&Value> {
    metadata
        .get("annotations")
        .filter(|a| a.as_object().is_some_and(|a| !a.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_and_spec_are_written_separately() {
        let rc = &portal_api::kinds::replication_controller::RESOURCE;
        let mut created = json!({"metadata": {"name": "r", "uid": "client-chosen"}, "spec": {"replicas": 1}, "status": {"replicas": 9}});
        prepare_create(rc, &mut created, Some("default"));
        assert_eq!(created["status"], json!({"replicas": 0}));
        assert_eq!(created["metadata"]["generation"], 1);
        assert_ne!(created["metadata"]["uid"], "client-chosen");

        let mut spec_write =
            json!({"metadata": {"name": "r"}, "spec": {"replicas": 3}, "status": {"replicas": 7}});
        prepare_update(rc, &mut spec_write, &created, Part::Main);
        assert_eq!(
            spec_write["status"], created["status"],
            "spec writes keep status"
        );
        assert_eq!(spec_write["metadata"]["generation"], 2);
        assert_eq!(spec_write["metadata"]["uid"], created["metadata"]["uid"]);

        let mut status_write =
            json!({"metadata": {"name": "r"}, "spec": {"replicas": 99}, "status": {"replicas": 3}});
        prepare_update(rc, &mut status_write, &spec_write, Part::Status);
        assert_eq!(
            status_write["spec"]["replicas"], 3,
            "status writes keep spec"
        );
        assert_eq!(status_write["status"]["replicas"], 3);
        assert!(unchanged(&spec_write, &spec_write.clone()));
    }
}
