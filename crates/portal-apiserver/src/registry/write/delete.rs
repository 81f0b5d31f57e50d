//! delete and delete-collection: options and preconditions, then the
//! graceful deletion plan (`deletion`).

use super::*;
use portal_api::kinds;

use crate::registry::write::namespace::SYSTEM_NAMESPACES;

/// The parts of `DeleteOptions` that change what a delete does.
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeleteOptions {
    #[serde(default)]
    preconditions: Option<Preconditions>,
    #[serde(default)]
    propagation_policy: Option<String>,
    /// The pre-1.7 form of `propagationPolicy: Orphan`.
    #[serde(default)]
    orphan_dependents: Option<bool>,
    /// Seconds a pod gets to stop (0: at once).
    #[serde(default)]
    grace_period_seconds: Option<i64>,
    /// `["All"]`: check, do not delete (kubectl sends it here, not in the query).
    #[serde(default)]
    dry_run: Vec<String>,
}

impl DeleteOptions {
    /// The options of a request body: none, JSON or YAML, or protobuf
    /// (client-go's typed clients send them so when asked to).
    fn decode(body: &[u8], content_type: &str) -> Result<Self, Status> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(DeleteOptions::default());
        }
        let invalid =
            |e: &dyn std::fmt::Display| Status::bad_request(format!("invalid DeleteOptions: {e}"));
        if content_type.starts_with("application/vnd.kubernetes.protobuf") {
            let value = portal_api::protobuf::decode_message(
                "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions",
                "DeleteOptions",
                "meta.k8s.io/v1",
                body,
            )
            .map_err(|e| invalid(&e))?;
            return serde_json::from_value(value).map_err(|e| invalid(&e));
        }
        if content_type.starts_with("application/yaml") {
            return serde_yaml_ng::from_slice(body).map_err(|e| invalid(&e));
        }
        serde_json::from_slice(body).map_err(|e| invalid(&e))
    }

    /// The propagation policy: the body's (`orphanDependents` first), else
    /// the query's.
    fn propagation(&self, query: &Query) -> Result<Propagation, Status> {
        if self.orphan_dependents == Some(true) {
            return Ok(Propagation::Orphan);
        }
        let asked = self
            .propagation_policy
            .as_deref()
            .or(query.get("propagationPolicy"));
        Propagation::parse(asked).map_err(Status::bad_request)
    }

    /// The grace period: the body's, else the query's.
    fn grace(&self, query: &Query) -> Result<Option<i64>, Status> {
        match (self.grace_period_seconds, query.get("gracePeriodSeconds")) {
            (Some(seconds), _) => Ok(Some(seconds)),
            (None, Some(text)) => text
                .parse::<i64>()
                .map(Some)
                .map_err(|_| Status::bad_request(format!("invalid gracePeriodSeconds {text:?}"))),
            (None, None) => Ok(None),
        }
    }

    fn dry_run(&self, query: &Query) -> bool {
        dry_run(query) || self.dry_run.iter().any(|d| d == "All")
    }
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Preconditions {
    uid: Option<String>,
    resource_version: Option<String>,
}

pub(crate) async fn delete(
    state: &ApiState,
    scope: &Scope<'_>,
    name: &str,
    body: &[u8],
    content_type: &str,
    query: &Query,
) -> Result<Response<Body>, Status> {
    let resource = scope.resource;
    let options = DeleteOptions::decode(body, content_type)?;
    let policy = options.propagation(query)?;
    let grace = options.grace(query)?;
    let preconditions = options.preconditions.clone().unwrap_or_default();
    let expected = parse_revision(preconditions.resource_version.as_deref())?;
    if resource.kind() == kinds::namespace::KIND && SYSTEM_NAMESPACES.contains(&name) {
        return Err(Status::forbidden(format!(
            "namespaces \"{name}\" is forbidden: this namespace may not be deleted"
        )));
    }
    let key = resource.key(scope.namespace, name);
    for _ in 0..MAX_ATTEMPTS {
        let Some(current) = state.store.get(&key).await.map_err(store_error)? else {
            return Err(Status::not_found(scope.target(), name));
        };
        let old = decode_stored(&current)?;
        if expected.is_some_and(|rv| rv != current.mod_revision) {
            return Err(Status::conflict(scope.target(), name));
        }
        if let Some(uid) = &preconditions.uid {
            check_uid(
                scope,
                name,
                &serde_json::json!({"metadata": {"uid": uid}}),
                &old,
            )?;
        }
        let dry = options.dry_run(query);
        // Policies and webhooks have their say on deletes too (an object
        // already being deleted is not asked about again).
        let mut warnings = Vec::new();
        if meta::meta_str(&old, "deletionTimestamp").is_none() {
            let write = Write {
                operation: "DELETE",
                subresource: None,
                dry_run: dry,
            };
            let mut visible = old.clone();
            crate::registry::conversion::to_version(
                state,
                resource,
                std::slice::from_mut(&mut visible),
            )
            .await?;
            warnings = state
                .admission
                .validate(state, scope, write, &Value::Null, Some(&visible))
                .await?;
        }
        if dry {
            // Checked, not done.
            return respond(
                state,
                resource,
                StatusCode::OK,
                &CachedObject::from_value(key, old, current.mod_revision),
                &warnings,
            )
            .await;
        }
        if resource.kind() == kinds::namespace::KIND {
            return crate::registry::write::namespace::begin_termination(
                state, scope, name, current, old,
            )
            .await;
        }
        let store = state.store.as_ref();
        match deletion::delete_object(store, &state.allocators, resource, &current, grace, policy)
            .await
        {
            // Marked (a pod stopping on its node, finalizers): it stays.
            Ok(Outcome::Marked { revision, object }) => {
                return respond(
                    state,
                    resource,
                    StatusCode::OK,
                    &CachedObject::from_value(key, object, revision),
                    &warnings,
                )
                .await;
            }
            Ok(Outcome::Pending { object }) => {
                return respond(
                    state,
                    resource,
                    StatusCode::OK,
                    &CachedObject::from_value(key, object, current.mod_revision),
                    &warnings,
                )
                .await;
            }
            // Its dependents are the garbage collector's to delete.
            Ok(Outcome::Deleted { revision, .. }) => {
                return respond(
                    state,
                    resource,
                    StatusCode::OK,
                    &CachedObject::from_value(key, old, revision),
                    &warnings,
                )
                .await;
            }
            Err(StoreError::Conflict { .. }) if expected.is_none() => continue,
            Err(StoreError::NotFound { .. }) => {
                return Err(Status::not_found(scope.target(), name))
            }
            Err(StoreError::Conflict { .. }) => return Err(Status::conflict(scope.target(), name)),
            Err(e) => return Err(store_error(e)),
        }
    }
    Err(Status::conflict(scope.target(), name))
}

/// DELETE on a collection: every object the selectors match, with the
/// DeleteOptions of the body (client-go sends them there) or the query.
/// A dry run answers what it would delete.
pub(crate) async fn delete_collection(
    state: &ApiState,
    scope: &Scope<'_>,
    body: &[u8],
    content_type: &str,
    query: &Query,
) -> Result<Response<Body>, Status> {
    let resource = scope.resource;
    let options = DeleteOptions::decode(body, content_type)?;
    let filter = Filter::from_query(resource, query)?;
    fresh(state, query).await?;
    let prefix = resource.list_prefix(scope.namespace);
    let (items, _, _) = state.cache.list(resource, &prefix, None, 0, |o| {
        filter.matches(resource, &o.value)
    });
    let grace = options.grace(query)?;
    let policy = options.propagation(query)?;
    if options.dry_run(query) {
        let revision = state.store.current_revision().await.map_err(store_error)?;
        let items = crate::registry::conversion::served_items(state, resource, items).await?;
        return Ok(json_response(
            StatusCode::OK,
            crate::registry::cache::list_body(resource, revision, &items, None, 0),
        ));
    }
    let mut deleted = Vec::with_capacity(items.len());
    for item in items {
        for _ in 0..MAX_ATTEMPTS {
            let Some(current) = state.store.get(&item.key).await.map_err(store_error)? else {
                break;
            };
            // Each object is admitted as a delete of its own would be.
            let mut old = decode_stored(&current)?;
            if meta::meta_str(&old, "deletionTimestamp").is_none() {
                crate::registry::conversion::to_version(
                    state,
                    resource,
                    std::slice::from_mut(&mut old),
                )
                .await?;
                let write = Write {
                    operation: "DELETE",
                    subresource: None,
                    dry_run: false,
                };
                state
                    .admission
                    .validate(state, scope, write, &Value::Null, Some(&old))
                    .await?;
            }
            let store = state.store.as_ref();
            match deletion::delete_object(
                store,
                &state.allocators,
                resource,
                &current,
                grace,
                policy,
            )
            .await
            {
                Ok(Outcome::Marked { revision, object }) => {
                    deleted.push(std::sync::Arc::new(CachedObject::from_value(
                        item.key.clone(),
                        object,
                        revision,
                    )));
                    break;
                }
                Ok(Outcome::Pending { object }) => {
                    deleted.push(std::sync::Arc::new(CachedObject::from_value(
                        item.key.clone(),
                        object,
                        current.mod_revision,
                    )));
                    break;
                }
                Ok(Outcome::Deleted {
                    revision,
                    object: value,
                }) => {
                    deleted.push(std::sync::Arc::new(CachedObject::from_value(
                        item.key.clone(),
                        value,
                        revision,
                    )));
                    break;
                }
                Err(StoreError::Conflict { .. }) => continue,
                Err(StoreError::NotFound { .. }) => break,
                Err(e) => return Err(store_error(e)),
            }
        }
    }
    let revision = state.store.current_revision().await.map_err(store_error)?;
    let deleted = crate::registry::conversion::served_items(state, resource, deleted).await?;
    Ok(json_response(
        StatusCode::OK,
        crate::registry::cache::list_body(resource, revision, &deleted, None, 0),
    ))
}
