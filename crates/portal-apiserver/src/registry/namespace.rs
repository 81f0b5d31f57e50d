//! Namespace lifecycle: the system namespaces exist from the start; deleting
//! a namespace marks it Terminating, removes everything in it, says so in
//! its conditions, checks once more that nothing is left, takes its
//! `kubernetes` finalizer off and removes it (also resumed after a
//! restart). As in Kubernetes, even an empty namespace is seen Terminating
//! before it goes, so `kubectl wait --for=delete` finds it.

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use portal_api::{kinds, meta, resources, Resource, Status};
use portal_store::{Error as StoreError, KeyValue, Op, Store};
use serde_json::{json, Value};

use crate::registry::allocator::Allocators;
use crate::registry::cache::CachedObject;
use crate::registry::deletion::{delete_object, Outcome};
use crate::registry::strategy;
use crate::server::http::{json_response, Body};
use crate::{store_error, ApiState, Scope};

/// Namespaces that exist from the start and may not be deleted.
pub(crate) const SYSTEM_NAMESPACES: [&str; 4] =
    ["default", "kube-system", "kube-public", "kube-node-lease"];

/// Creates the system namespaces that are missing.
pub(crate) async fn bootstrap(store: &dyn Store) -> Result<(), StoreError> {
    let resource = &kinds::namespace::RESOURCE;
    for name in SYSTEM_NAMESPACES {
        let key = resource.key(None, name);
        if store.get(&key).await?.is_some() {
            continue;
        }
        let mut object =
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        strategy::prepare_create(resource, &mut object, None);
        let value = Bytes::from(serde_json::to_vec(&object).unwrap_or_default());
        match store.txn(vec![Op::Create { key, value }]).await {
            Ok(_) | Err(StoreError::AlreadyExists { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Finishes deleting namespaces a previous run left Terminating.
pub(crate) async fn resume_terminations(
    store: Arc<dyn Store>,
    allocators: Arc<Allocators>,
) -> Result<(), StoreError> {
    let (namespaces, _) = store.list(&kinds::namespace::RESOURCE.key_prefix()).await?;
    for kv in namespaces {
        let Ok(value) = serde_json::from_slice::<Value>(&kv.value) else {
            continue;
        };
        if meta::meta_str(&value, "deletionTimestamp").is_some() {
            let name = meta::meta_str(&value, "name")
                .unwrap_or_default()
                .to_owned();
            let uid = meta::meta_str(&value, "uid").unwrap_or_default().to_owned();
            tokio::spawn(finish_termination(
                store.clone(),
                allocators.clone(),
                name,
                uid,
            ));
        }
    }
    Ok(())
}

pub(crate) async fn begin_termination(
    state: &ApiState,
    scope: &Scope<'_>,
    name: &str,
    current: KeyValue,
    mut object: Value,
) -> Result<Response<Body>, Status> {
    let key = current.key.clone();
    let already = meta::meta_str(&object, "deletionTimestamp").is_some();
    let revision = if already {
        current.mod_revision
    } else {
        meta::metadata_mut(&mut object)
            .insert("deletionTimestamp".into(), Value::String(strategy::now()));
        object["status"] = json!({"phase": "Terminating"});
        let value =
            Bytes::from(serde_json::to_vec(&object).map_err(|e| Status::internal(e.to_string()))?);
        let op = Op::Update {
            key: key.clone(),
            value,
            expected_revision: current.mod_revision,
        };
        match state.store.txn(vec![op]).await {
            Ok(revision) => revision,
            // Another DELETE marked it first: deleted all the same (200).
            Err(StoreError::Conflict { .. }) => {
                let newer = state.store.get(&key).await.map_err(store_error)?;
                let Some(newer) = newer else {
                    return Err(Status::not_found(scope.target(), name));
                };
                let value: Value = serde_json::from_slice(&newer.value)
                    .map_err(|e| Status::internal(e.to_string()))?;
                let same = meta::meta_str(&value, "uid") == meta::meta_str(&object, "uid");
                if !same || meta::meta_str(&value, "deletionTimestamp").is_none() {
                    return Err(Status::conflict(scope.target(), name));
                }
                return Ok(json_response(
                    StatusCode::OK,
                    CachedObject::from_value(key, value, newer.mod_revision)
                        .json
                        .clone(),
                ));
            }
            Err(e) => return Err(store_error(e)),
        }
    };
    // One loop per namespace: the request that marked it starts it (a
    // restart resumes those already marked).
    if !already {
        tokio::spawn(finish_termination(
            state.store.clone(),
            state.allocators.clone(),
            name.to_owned(),
            meta::meta_str(&object, "uid")
                .unwrap_or_default()
                .to_owned(),
        ));
    }
    Ok(json_response(
        StatusCode::OK,
        CachedObject::from_value(key, object, revision).json.clone(),
    ))
}

/// Deletes one object (and its allocations), re-reading it if it changed;
/// whether it is gone (a pod on a node is only marked: its agent stops it).
async fn delete_with_retry(
    store: &dyn Store,
    allocators: &Allocators,
    resource: &Resource,
    mut current: KeyValue,
) -> Result<bool, StoreError> {
    loop {
        match delete_object(store, allocators, resource, &current, None).await {
            Ok(outcome) => return Ok(matches!(outcome, Outcome::Deleted { .. })),
            Err(StoreError::NotFound { .. }) => return Ok(true),
            Err(StoreError::Conflict { .. }) => match store.get(&current.key).await? {
                Some(newer) => current = newer,
                None => return Ok(true),
            },
            Err(e) => return Err(e),
        }
    }
}

/// How often a terminating namespace looks again for what is left (pods
/// stopping on their nodes).
const RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// Deletes every object in the namespace, waits for those that stop
/// gracefully, confirms nothing is left, then finalizes and deletes the
/// namespace.
///
/// The namespace is known by name *and* uid: every step re-reads it and
/// stops if it is gone or another namespace of the same name took its
/// place (a second task for it, on another server or after a restart,
/// does the same steps and finds them done).
async fn finish_termination(
    store: Arc<dyn Store>,
    allocators: Arc<Allocators>,
    namespace: String,
    uid: String,
) {
    let failed = |error: StoreError| {
        tracing::error!(%error, %namespace, "namespace cleanup failed; will resume at next start");
    };
    // Like Kubernetes' namespace controller: empty it, say so in its
    // conditions, then look once more (a write admitted before the
    // namespace was marked may land after the first pass).
    let mut announced = false;
    loop {
        // Gone, or another namespace of that name now: not ours to empty.
        match terminating(store.as_ref(), &namespace, &uid).await {
            Ok(Some(_)) => {}
            Ok(None) => return,
            Err(error) => return failed(error),
        }
        match remove_content(store.as_ref(), &allocators, &namespace).await {
            Ok(0) if announced => break,
            Ok(0) => {
                let written =
                    update_namespace(store.as_ref(), &namespace, &uid, content_removed).await;
                if let Err(error) = written {
                    return failed(error);
                }
                announced = true;
            }
            Ok(_) => announced = false,
            Err(error) => return failed(error),
        }
        tokio::time::sleep(RECHECK).await;
    }
    let finalized = update_namespace(store.as_ref(), &namespace, &uid, |ns| {
        if let Some(finalizers) = ns
            .pointer_mut("/spec/finalizers")
            .and_then(Value::as_array_mut)
        {
            finalizers.retain(|f| f != "kubernetes");
        }
    });
    if let Err(error) = finalized.await {
        return failed(error);
    }
    match delete_namespace(store.as_ref(), &namespace, &uid).await {
        Ok(true) => tracing::info!(%namespace, "namespace deleted"),
        Ok(false) => {}
        Err(error) => tracing::error!(%error, %namespace, "namespace removal failed"),
    }
}

/// The namespace as stored, if it is still the one being terminated.
async fn terminating(
    store: &dyn Store,
    namespace: &str,
    uid: &str,
) -> Result<Option<(KeyValue, Value)>, StoreError> {
    let key = kinds::namespace::RESOURCE.key(None, namespace);
    let Some(current) = store.get(&key).await? else {
        return Ok(None);
    };
    let Ok(object) = serde_json::from_slice::<Value>(&current.value) else {
        return Ok(None);
    };
    let ours = meta::meta_str(&object, "uid") == Some(uid)
        && meta::meta_str(&object, "deletionTimestamp").is_some();
    Ok(ours.then_some((current, object)))
}

/// Deletes the namespace if it is still this one; whether it did.
async fn delete_namespace(
    store: &dyn Store,
    namespace: &str,
    uid: &str,
) -> Result<bool, StoreError> {
    loop {
        let Some((current, _)) = terminating(store, namespace, uid).await? else {
            return Ok(false);
        };
        let op = Op::Delete {
            key: current.key,
            expected_revision: Some(current.mod_revision),
        };
        match store.txn(vec![op]).await {
            Ok(_) => return Ok(true),
            Err(StoreError::Conflict { .. }) => continue,
            Err(StoreError::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(e),
        }
    }
}

/// Deletes what is in the namespace; how many objects are still stopping.
async fn remove_content(
    store: &dyn Store,
    allocators: &Allocators,
    namespace: &str,
) -> Result<usize, StoreError> {
    let mut left = 0usize;
    for resource in resources().filter(|r| r.namespaced) {
        let (items, _) = store.list(&resource.list_prefix(Some(namespace))).await?;
        for kv in items {
            if !delete_with_retry(store, allocators, resource, kv).await? {
                left += 1;
            }
        }
    }
    Ok(left)
}

/// The conditions Kubernetes' namespace controller writes once the content
/// is gone.
fn content_removed(namespace: &mut Value) {
    let now = strategy::now();
    let condition = |kind: &str, reason: &str, message: &str| json!({"type": kind, "status": "False", "lastTransitionTime": now, "reason": reason, "message": message});
    namespace["status"] = json!({
        "phase": "Terminating",
        "conditions": [
            condition("NamespaceDeletionDiscoveryFailure", "ResourcesDiscovered", "All resources successfully discovered"),
            condition("NamespaceDeletionGroupVersionParsingFailure", "ParsedGroupVersions", "All legacy kube types successfully parsed"),
            condition("NamespaceDeletionContentFailure", "ContentDeleted", "All content successfully deleted, may be waiting on finalization"),
            condition("NamespaceContentRemaining", "ContentRemoved", "All content successfully removed"),
            condition("NamespaceFinalizersRemaining", "ContentHasNoFinalizers", "All content-preserving finalizers finished"),
        ],
    });
}

/// Read, change, compare-and-swap the namespace until it sticks (nothing
/// to do if it is gone, is another namespace now, or the change changes
/// nothing).
async fn update_namespace(
    store: &dyn Store,
    namespace: &str,
    uid: &str,
    change: impl Fn(&mut Value),
) -> Result<(), StoreError> {
    loop {
        let Some((current, mut object)) = terminating(store, namespace, uid).await? else {
            return Ok(());
        };
        let before = object.clone();
        change(&mut object);
        if object == before {
            return Ok(());
        }
        let value = Bytes::from(serde_json::to_vec(&object).unwrap_or_default());
        let op = Op::Update {
            key: current.key,
            value,
            expected_revision: current.mod_revision,
        };
        match store.txn(vec![op]).await {
            Ok(_) => return Ok(()),
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
}
