//! Namespace lifecycle in the registry: the system namespaces exist from
//! the start and may not be deleted; deleting a namespace marks it
//! Terminating, and the namespace controller (in `portal-controllers`,
//! through the API) removes its content, writes its conditions, takes its
//! `kubernetes` finalizer off and deletes it again, which removes it. As in
//! Kubernetes, even an empty namespace is seen Terminating before it goes,
//! so `kubectl wait --for=delete` finds it.

use bytes::Bytes;
use http::{Response, StatusCode};
use portal_api::{kinds, meta, Status};
use portal_store::{Error as StoreError, KeyValue, Op, Store};
use serde_json::{json, Value};

use crate::registry::cache::CachedObject;
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

/// Deleting a namespace: the first DELETE marks it Terminating (the
/// namespace controller empties it, then removes its `kubernetes`
/// finalizer through `finalize`); a DELETE once its finalizers are done
/// removes it.
pub(crate) async fn begin_termination(
    state: &ApiState,
    scope: &Scope<'_>,
    name: &str,
    current: KeyValue,
    mut object: Value,
) -> Result<Response<Body>, Status> {
    let key = current.key.clone();
    let already = meta::meta_str(&object, "deletionTimestamp").is_some();
    let finalized = object
        .pointer("/spec/finalizers")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty);
    if finalized {
        let op = Op::Delete {
            key: key.clone(),
            expected_revision: Some(current.mod_revision),
        };
        return match state.store.txn(vec![op]).await {
            Ok(revision) => Ok(json_response(
                StatusCode::OK,
                CachedObject::from_value(key, object, revision).json.clone(),
            )),
            Err(StoreError::Conflict { .. }) => Err(Status::conflict(scope.target(), name)),
            Err(StoreError::NotFound { .. }) => Err(Status::not_found(scope.target(), name)),
            Err(e) => Err(store_error(e)),
        };
    }
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
    Ok(json_response(
        StatusCode::OK,
        CachedObject::from_value(key, object, revision).json.clone(),
    ))
}
