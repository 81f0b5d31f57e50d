//! Graceful deletion and finalizers, as Kubernetes' generic store and pod
//! strategy decide them. Deleting an object with finalizers, or a pod that
//! runs on a node, only marks it (`deletionTimestamp`,
//! `deletionGracePeriodSeconds`); it goes when its finalizers are removed
//! (grace 0), or — for a pod — when its node's agent, having stopped its
//! containers, deletes it again with grace 0. An unscheduled or finished
//! pod goes at once, and so does anything deleted with grace 0 and no
//! finalizers (`kubectl delete --force --grace-period=0`).
//!
//! What happens to an object's dependents is the garbage collector's work
//! (a controller): `Foreground` and `Orphan` deletions leave the object
//! marked with the `foregroundDeletion` or `orphan` finalizer, which the
//! collector removes once the dependents are gone or orphaned;
//! `Background` removes the object and the collector deletes its
//! dependents after it.

use bytes::Bytes;
use portal_api::{kinds, meta, Resource};
use portal_store::{Error as StoreError, KeyValue, Op, Store};
use serde_json::{json, Value};

use crate::registry::allocator::{delete_stored, Allocators};

/// A pod's grace period when neither the request nor the spec gives one.
const DEFAULT_POD_GRACE: i64 = 30;

/// What happens to the dependents of a deleted object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Propagation {
    Background,
    Foreground,
    Orphan,
}

impl Propagation {
    pub(crate) fn parse(value: Option<&str>) -> Result<Self, String> {
        match value {
            None | Some("") | Some("Background") => Ok(Propagation::Background),
            Some("Foreground") => Ok(Propagation::Foreground),
            Some("Orphan") => Ok(Propagation::Orphan),
            Some(other) => Err(format!(
                "propagationPolicy {other:?} must be Background, Foreground or Orphan"
            )),
        }
    }

    /// The finalizer that holds the object for the garbage collector.
    fn finalizer(self) -> Option<&'static str> {
        match self {
            Propagation::Background => None,
            Propagation::Foreground => Some("foregroundDeletion"),
            Propagation::Orphan => Some("orphan"),
        }
    }
}

/// Adds `finalizer` to the object's; whether it was missing.
fn add_finalizer(object: &mut Value, finalizer: &str) -> bool {
    let metadata = meta::metadata_mut(object);
    let list = metadata
        .entry("finalizers")
        .or_insert_with(|| Value::Array(Vec::new()));
    if !list.is_array() {
        *list = Value::Array(Vec::new());
    }
    let Some(list) = list.as_array_mut() else {
        return false;
    };
    if list.iter().any(|f| f.as_str() == Some(finalizer)) {
        return false;
    }
    list.push(Value::String(finalizer.to_owned()));
    true
}

/// What a delete request does to the object now.
#[derive(Debug, PartialEq)]
pub(crate) enum Plan {
    /// Remove it.
    Now,
    /// Keep it, marked for deletion: write this object.
    Mark(Value),
    /// Already marked, no sooner than asked: nothing to write.
    Pending,
}

fn finalizers(object: &Value) -> bool {
    meta::metadata(object)
        .get("finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
}

/// The grace period a delete gives `object` (`asked`: the request's).
fn grace_period(resource: &Resource, object: &Value, asked: Option<i64>) -> i64 {
    if resource.kind() != kinds::pod::KIND {
        return 0;
    }
    let scheduled = object["spec"]["nodeName"]
        .as_str()
        .is_some_and(|n| !n.is_empty());
    let finished = matches!(
        object["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    );
    if !scheduled || finished {
        return 0;
    }
    match asked {
        // A negative grace period means the shortest one, as Kubernetes reads it.
        Some(seconds) if seconds < 0 => 1,
        Some(seconds) => seconds,
        None => object["spec"]["terminationGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(DEFAULT_POD_GRACE)
            .max(0),
    }
}

/// Decides what deleting `object` with the requested grace period and
/// propagation does.
pub(crate) fn plan(
    resource: &Resource,
    object: &Value,
    asked: Option<i64>,
    propagation: Propagation,
    now: jiff::Timestamp,
) -> Plan {
    let grace = grace_period(resource, object, asked);
    let mut marked_object = object.clone();
    let held = propagation
        .finalizer()
        .is_some_and(|finalizer| add_finalizer(&mut marked_object, finalizer));
    let metadata = meta::metadata(object);
    let marked = metadata.get("deletionTimestamp").is_some();
    if marked {
        let current = metadata
            .get("deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        // A second delete may only shorten the grace period (and add the
        // garbage collector's finalizer).
        if grace >= current {
            return if held {
                Plan::Mark(marked_object)
            } else {
                Plan::Pending
            };
        }
    }
    if grace == 0 && !finalizers(&marked_object) {
        return Plan::Now;
    }
    let at = now
        .checked_add(jiff::SignedDuration::from_secs(grace))
        .unwrap_or(now)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let metadata = meta::metadata_mut(&mut marked_object);
    metadata.insert("deletionTimestamp".into(), json!(at));
    metadata.insert("deletionGracePeriodSeconds".into(), json!(grace));
    Plan::Mark(marked_object)
}

/// Whether an update released an object being deleted: it removed the
/// last finalizer, and no grace period runs (a pod waits for its agent).
/// Namespaces keep theirs in `spec` and their own termination.
pub(crate) fn released(resource: &Resource, old: &Value, new: &Value) -> bool {
    resource.kind() != kinds::namespace::KIND && finalizers(old) && finished(new)
}

fn finished(object: &Value) -> bool {
    let metadata = meta::metadata(object);
    metadata.get("deletionTimestamp").is_some()
        && !finalizers(object)
        && metadata
            .get("deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            == 0
}

/// What a delete did to a stored object.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Removed at this revision.
    Deleted { revision: u64, object: Value },
    /// Marked for deletion at this revision.
    Marked { revision: u64, object: Value },
    /// Already marked: unchanged.
    Pending { object: Value },
}

/// Deletes `current` as [`plan`] says: removes it (with its allocations)
/// or marks it, in one compare-and-swap on its revision.
pub(crate) async fn delete_object(
    store: &dyn Store,
    allocators: &Allocators,
    resource: &Resource,
    current: &KeyValue,
    asked: Option<i64>,
    propagation: Propagation,
) -> Result<Outcome, StoreError> {
    let object: Value =
        serde_json::from_slice(&current.value).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    // A pod bound to a node that does not exist has no agent to stop it:
    // it goes at once (Kubernetes' pod garbage collector does the same).
    let node = object["spec"]["nodeName"]
        .as_str()
        .filter(|n| !n.is_empty());
    let asked = match node {
        Some(node) if resource.kind() == kinds::pod::KIND => {
            let key = kinds::node::RESOURCE.key(None, node);
            if store.get(&key).await?.is_none() {
                Some(0)
            } else {
                asked
            }
        }
        _ => asked,
    };
    match plan(
        resource,
        &object,
        asked,
        propagation,
        jiff::Timestamp::now(),
    ) {
        Plan::Now => {
            let revision = delete_stored(store, allocators, resource, current).await?;
            Ok(Outcome::Deleted { revision, object })
        }
        Plan::Mark(marked) => {
            let op = Op::Update {
                key: current.key.clone(),
                value: Bytes::from(marked.to_string()),
                expected_revision: current.mod_revision,
            };
            let revision = store.txn(vec![op]).await?;
            Ok(Outcome::Marked {
                revision,
                object: marked,
            })
        }
        Plan::Pending => Ok(Outcome::Pending { object }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(node: &str, phase: &str) -> Value {
        json!({"metadata": {"name": "p"}, "spec": {"nodeName": node, "terminationGracePeriodSeconds": 20}, "status": {"phase": phase}})
    }

    const BG: Propagation = Propagation::Background;

    #[test]
    fn pods_on_a_node_are_marked_others_go_at_once() {
        let pods = &kinds::pod::RESOURCE;
        let now = jiff::Timestamp::from_second(1_700_000_000).unwrap();
        assert_eq!(plan(pods, &pod("", "Pending"), None, BG, now), Plan::Now);
        assert_eq!(plan(pods, &pod("n", "Succeeded"), None, BG, now), Plan::Now);
        assert_eq!(
            plan(pods, &pod("n", "Running"), Some(0), BG, now),
            Plan::Now
        );
        let Plan::Mark(marked) = plan(pods, &pod("n", "Running"), None, BG, now) else {
            panic!("a running pod is marked");
        };
        assert_eq!(marked["metadata"]["deletionGracePeriodSeconds"], 20);
        assert_eq!(
            marked["metadata"]["deletionTimestamp"],
            "2023-11-14T22:13:40Z"
        );
        assert!(!finished(&marked), "the agent confirms");
        assert!(
            matches!(plan(pods, &pod("n", "Running"), Some(-5), BG, now), Plan::Mark(m) if m["metadata"]["deletionGracePeriodSeconds"] == 1)
        );
        assert_eq!(plan(pods, &marked, None, BG, now), Plan::Pending);
        assert_eq!(
            plan(pods, &marked, Some(30), BG, now),
            Plan::Pending,
            "never longer"
        );
        assert!(matches!(
            plan(pods, &marked, Some(5), BG, now),
            Plan::Mark(_)
        ));
        assert_eq!(
            plan(pods, &marked, Some(0), BG, now),
            Plan::Now,
            "the agent's final delete"
        );
    }

    #[test]
    fn finalizers_hold_any_kind() {
        let services = &kinds::service::RESOURCE;
        let now = jiff::Timestamp::from_second(1_700_000_000).unwrap();
        let held = json!({"metadata": {"name": "s", "finalizers": ["example.com/x"]}});
        let Plan::Mark(marked) = plan(services, &held, None, BG, now) else {
            panic!("held by a finalizer");
        };
        assert!(!finished(&marked));
        let mut released = marked.clone();
        released["metadata"]["finalizers"] = json!([]);
        assert!(super::released(services, &marked, &released));
        assert!(
            !super::released(services, &released, &released),
            "nothing was removed"
        );
        let namespaces = &kinds::namespace::RESOURCE;
        assert!(!super::released(namespaces, &marked, &released));
        assert_eq!(
            plan(services, &json!({"metadata": {"name": "s"}}), None, BG, now),
            Plan::Now
        );
    }

    #[test]
    fn foreground_and_orphan_hold_the_object_for_the_collector() {
        let services = &kinds::service::RESOURCE;
        let now = jiff::Timestamp::from_second(1_700_000_000).unwrap();
        let plain = json!({"metadata": {"name": "s"}});
        let Plan::Mark(held) = plan(services, &plain, None, Propagation::Foreground, now) else {
            panic!("foreground marks it");
        };
        assert_eq!(
            held["metadata"]["finalizers"],
            json!(["foregroundDeletion"])
        );
        assert!(held["metadata"]["deletionTimestamp"].is_string());
        assert_eq!(
            plan(services, &held, None, Propagation::Foreground, now),
            Plan::Pending
        );
        let Plan::Mark(both) = plan(services, &held, None, Propagation::Orphan, now) else {
            panic!("a second delete adds its finalizer");
        };
        assert_eq!(
            both["metadata"]["finalizers"],
            json!(["foregroundDeletion", "orphan"])
        );
        assert_eq!(
            both["metadata"]["deletionTimestamp"],
            held["metadata"]["deletionTimestamp"]
        );
        assert!(Propagation::parse(Some("Sideways")).is_err());
    }
}
