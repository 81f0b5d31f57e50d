//! Namespace lifecycle: the system namespaces exist from the start; deleting
//! a namespace marks it Terminating, removes everything in it, then removes
//! the namespace itself (also resumed after a restart).

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use portal_api::{meta, resources, Kind, Resource, Status};
use portal_store::{Error as StoreError, KeyValue, Op, Store};
use serde_json::{json, Value};

use crate::allocator::Allocators;
use crate::cache::CachedObject;
use crate::deletion::{delete_object, Outcome};
use crate::http::{json_response, Body};
use crate::write::SYSTEM_NAMESPACES;
use crate::{store_error, strategy, ApiState, Scope};

/// Creates the system namespaces that are missing.
pub(crate) async fn bootstrap(store: &dyn Store) -> Result<(), StoreError> {
    let resource = Resource::of(Kind::Namespace);
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
    let (namespaces, _) = store
        .list(&Resource::of(Kind::Namespace).key_prefix())
        .await?;
    for kv in namespaces {
        let Ok(value) = serde_json::from_slice::<Value>(&kv.value) else {
            continue;
        };
        if meta::meta_str(&value, "deletionTimestamp").is_some() {
            let name = meta::meta_str(&value, "name")
                .unwrap_or_default()
                .to_owned();
            tokio::spawn(finish_termination(store.clone(), allocators.clone(), name));
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
            Err(StoreError::Conflict { .. }) => return Err(Status::conflict(scope.target(), name)),
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
/// gracefully, then deletes the namespace.
async fn finish_termination(store: Arc<dyn Store>, allocators: Arc<Allocators>, namespace: String) {
    loop {
        let mut left = 0usize;
        for resource in resources().filter(|r| r.namespaced) {
            let prefix = resource.list_prefix(Some(&namespace));
            let items = match store.list(&prefix).await {
                Ok((items, _)) => items,
                Err(error) => {
                    tracing::error!(%error, %namespace, "namespace cleanup failed; will resume at next start");
                    return;
                }
            };
            for kv in items {
                match delete_with_retry(store.as_ref(), &allocators, resource, kv).await {
                    Ok(true) => {}
                    Ok(false) => left += 1,
                    Err(error) => {
                        tracing::error!(%error, %namespace, "namespace cleanup failed; will resume at next start");
                        return;
                    }
                }
            }
        }
        if left == 0 {
            break;
        }
        tokio::time::sleep(RECHECK).await;
    }
    let key = Resource::of(Kind::Namespace).key(None, &namespace);
    match store
        .txn(vec![Op::Delete {
            key,
            expected_revision: None,
        }])
        .await
    {
        Ok(_) | Err(StoreError::NotFound { .. }) => tracing::info!(%namespace, "namespace deleted"),
        Err(error) => tracing::error!(%error, %namespace, "namespace removal failed"),
    }
}
