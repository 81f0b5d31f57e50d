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

use tokio::sync::mpsc;

use crate::registry::allocator::Allocators;
use crate::registry::cache::CachedObject;
use crate::registry::deletion::{delete_object, Outcome, Propagation};
use crate::registry::strategy::{self, Part};
use crate::registry::write::internal::{Change, Writer};
use crate::server::http::{json_response, Body};
use crate::{store_error, ApiState, Scope};

/// The field manager of the namespace lifecycle's writes (its conditions
/// and finalizer), as Kubernetes' namespace controller records itself.
pub(crate) const MANAGER: &str = "portal-namespace-controller";

/// Where a DELETE that marks a namespace Terminating sends it (name, uid)
/// for its content to be removed.
pub(crate) type Terminations = mpsc::UnboundedSender<(String, String)>;

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

/// The namespaces a previous run left Terminating, to finish.
pub(crate) async fn marked(store: &dyn Store) -> Result<Vec<(String, String)>, StoreError> {
    let (namespaces, _) = store.list(&kinds::namespace::RESOURCE.key_prefix()).await?;
    Ok(namespaces
        .iter()
        .filter_map(|kv| serde_json::from_slice::<Value>(&kv.value).ok())
        .filter(|ns| meta::meta_str(ns, "deletionTimestamp").is_some())
        .map(|ns| {
            let field = |name| meta::meta_str(&ns, name).unwrap_or_default().to_owned();
            (field("name"), field("uid"))
        })
        .collect())
}

/// Empties and removes every namespace sent here, each in a task of its
/// own, for as long as the server runs (the tasks stop with it).
pub(crate) async fn terminate(
    state: std::sync::Arc<ApiState>,
    mut marked: mpsc::UnboundedReceiver<(String, String)>,
) {
    let mut running = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            next = marked.recv() => match next {
                Some((name, uid)) => drop(running.spawn(finish_termination(state.clone(), name, uid))),
                None => break,
            },
            Some(_) = running.join_next(), if !running.is_empty() => {}
        }
    }
    while running.join_next().await.is_some() {}
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
    // One task per namespace: the request that marked it starts it (a
    // restart resumes those already marked).
    if !already {
        let uid = meta::meta_str(&object, "uid").unwrap_or_default();
        let _ = state.terminations.send((name.to_owned(), uid.to_owned()));
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
        match delete_object(
            store,
            allocators,
            resource,
            &current,
            None,
            Propagation::Background,
        )
        .await
        {
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
async fn finish_termination(state: Arc<ApiState>, namespace: String, uid: String) {
    let (store, allocators) = (state.store.clone(), state.allocators.clone());
    let failed = |error: StoreError| {
        tracing::error!(%error, %namespace, "namespace cleanup failed; will resume at next start");
    };
    let refused = |status: Status| {
        tracing::error!(error = %status.message, %namespace, "namespace cleanup failed; will resume at next start");
    };
    // Its conditions and its finalizer are written through the registry,
    // as the namespace controller's (recorded in managedFields).
    let writer = Writer::new(&state, &kinds::namespace::RESOURCE, MANAGER);
    let ours = |ns: &Value| {
        meta::meta_str(ns, "uid") == Some(uid.as_str())
            && meta::meta_str(ns, "deletionTimestamp").is_some()
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
                let written = writer
                    .update(None, &namespace, Part::Status, |ns| {
                        if !ours(ns) {
                            return Change::Keep;
                        }
                        let mut next = ns.clone();
                        content_removed(&mut next);
                        Change::Write(next)
                    })
                    .await;
                match written {
                    Ok(_) => {}
                    Err(Status { code: 404, .. }) => return,
                    Err(status) => return refused(status),
                }
                announced = true;
            }
            Ok(_) => announced = false,
            Err(error) => return failed(error),
        }
        tokio::time::sleep(RECHECK).await;
    }
    let finalized = writer
        .update(None, &namespace, Part::Finalize, |ns| {
            if !ours(ns) {
                return Change::Keep;
            }
            let mut next = ns.clone();
            if let Some(finalizers) = next
                .pointer_mut("/spec/finalizers")
                .and_then(Value::as_array_mut)
            {
                finalizers.retain(|f| f != "kubernetes");
            }
            Change::Write(next)
        })
        .await;
    match finalized {
        Ok(_) => {}
        Err(Status { code: 404, .. }) => return,
        Err(status) => return refused(status),
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
