//! create, update and delete: decode, default, validate, then one
//! compare-and-swap transaction in the store.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use portal_api::decode::{self, Decoded, Format};
use portal_api::patch::{PatchError, PatchType};
use portal_api::{meta, Kind, Resource, Status};
use portal_store::{Error as StoreError, KeyValue, Op};
use rand::Rng;
use serde_json::Value;

use crate::allocator::{delete_stored, Allocators};
use crate::cache::CachedObject;
use crate::deletion::{self, Outcome};
use crate::gc::Propagation;
use crate::http::{json_response, Body, FieldValidation, Query};
use crate::read::{fresh, parse_revision, stored, Filter};
use crate::{store_error, strategy, ApiState, Scope};

/// Conflicting writers retry an unconditional update this many times.
const MAX_ATTEMPTS: usize = 16;
/// Namespaces that exist from the start and may not be deleted.
pub(crate) const SYSTEM_NAMESPACES: [&str; 4] =
    ["default", "kube-system", "kube-public", "kube-node-lease"];

/// A decoded request body with the warnings to send back.
pub(crate) struct DecodedBody {
    object: Value,
    warnings: Vec<String>,
}

pub(crate) fn decode_body(
    resource: &Resource,
    body: &[u8],
    content_type: &str,
    query: &Query,
) -> Result<DecodedBody, Status> {
    let format = Format::from_content_type(content_type)
        .ok_or_else(|| Status::unsupported_media_type(content_type))?;
    let validation = FieldValidation::from_query(query)?;
    let value = decode::parse_body(resource, body, format).map_err(|e| match e {
        decode::DecodeError::Unsupported(message) => {
            let mut status = Status::unsupported_media_type(content_type);
            status.message = message;
            status
        }
        other => Status::bad_request(other.to_string()),
    })?;
    let Decoded {
        object,
        unknown_fields,
    } = decode::decode_object(resource, value).map_err(|e| Status::bad_request(e.to_string()))?;
    let mut warnings = Vec::new();
    if !unknown_fields.is_empty() {
        match validation {
            FieldValidation::Strict => {
                return Err(Status::bad_request(
                    decode::DecodeError::UnknownFields(unknown_fields).to_string(),
                ))
            }
            FieldValidation::Warn => warnings.extend(
                unknown_fields
                    .iter()
                    .map(|f| format!("unknown field \"{f}\"")),
            ),
            FieldValidation::Ignore => {}
        }
    }
    Ok(DecodedBody { object, warnings })
}

fn respond(code: StatusCode, object: &CachedObject, warnings: &[String]) -> Response<Body> {
    let mut response = json_response(code, object.json.clone());
    for warning in warnings {
        let text = format!(
            "299 - {}",
            serde_json::to_string(warning).unwrap_or_default()
        );
        if let Ok(value) = HeaderValue::from_str(&text) {
            response.headers_mut().append("warning", value);
        }
    }
    response
}

fn dry_run(query: &Query) -> bool {
    query.get("dryRun") == Some("All")
}

/// Metadata and kind-specific problems of an object about to be stored.
fn problems(resource: &Resource, object: &Value, old: Option<&Value>) -> Vec<portal_api::Cause> {
    let mut causes = meta::validate(resource, object);
    match resource.kind {
        Kind::Service => causes.extend(portal_api::service::validate(object, old)),
        Kind::Endpoints => causes.extend(portal_api::service::validate_endpoints(object)),
        _ => {}
    }
    causes
}

fn invalid(scope: &Scope<'_>, object: &Value, causes: Vec<portal_api::Cause>) -> Status {
    let name = meta::meta_str(object, "name")
        .or(meta::meta_str(object, "generateName"))
        .unwrap_or("");
    Status::invalid(scope.target(), name, causes)
}

/// 404 unless the namespace exists; 403 while it is being deleted. Like
/// Kubernetes' admission, the cache answers first (without waiting for it
/// to catch up: a write must not wait on the watch cache) and the store
/// only when the cache does not know the namespace yet.
async fn check_namespace(state: &ApiState, namespace: &str) -> Result<(), Status> {
    let resource = Resource::of(Kind::Namespace);
    let key = resource.key(None, namespace);
    let terminating = |ns: &Value| meta::meta_str(ns, "deletionTimestamp").is_some();
    let terminating = match state.cache.get(resource, &key) {
        Some(cached) => terminating(&cached.value),
        None => {
            let not_found = || Status::not_found(Scope::cluster(resource).target(), namespace);
            terminating(&stored(state, &key).await?.ok_or_else(not_found)?.value)
        }
    };
    if terminating {
        return Err(Status::forbidden(format!(
            "unable to create new content in namespace {namespace} because it is being terminated"
        )));
    }
    Ok(())
}

fn random_suffix() -> String {
    // Kubernetes' alphabet: no vowels (no words), no look-alike characters.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

pub(crate) async fn create(
    state: &ApiState,
    scope: &Scope<'_>,
    body: DecodedBody,
    query: &Query,
) -> Result<Response<Body>, Status> {
    let resource = scope.resource;
    let DecodedBody {
        mut object,
        warnings,
    } = body;
    check_body_namespace(scope, &object)?;
    let causes = problems(resource, &object, None);
    if !causes.is_empty() {
        return Err(invalid(scope, &object, causes));
    }
    if let Some(ns) = scope.namespace {
        check_namespace(state, ns).await?;
    }
    strategy::prepare_create(resource, &mut object, scope.namespace);
    let generate = meta::meta_str(&object, "name").unwrap_or("").is_empty();
    for _ in 0..MAX_ATTEMPTS {
        if generate {
            let prefix = meta::meta_str(&object, "generateName")
                .unwrap_or("")
                .to_owned();
            meta::metadata_mut(&mut object).insert(
                "name".into(),
                Value::String(format!("{prefix}{}", random_suffix())),
            );
        }
        let name = meta::meta_str(&object, "name").unwrap_or("").to_owned();
        let key = resource.key(scope.namespace, &name);
        let mut attempt = object.clone();
        let mut reservation = state
            .allocators
            .for_create(resource, &mut attempt)
            .map_err(|cause| Status::invalid(scope.target(), &name, vec![cause]))?;
        if dry_run(query) {
            reservation.abort(None);
            let preview = CachedObject::from_value(key, attempt, 0);
            return Ok(respond(StatusCode::CREATED, &preview, &warnings));
        }
        let value =
            Bytes::from(serde_json::to_vec(&attempt).map_err(|e| Status::internal(e.to_string()))?);
        let mut ops = vec![Op::Create {
            key: key.clone(),
            value,
        }];
        ops.append(&mut reservation.ops);
        match state.store.txn(ops).await {
            Ok(revision) => {
                reservation.commit();
                let stored = CachedObject::from_value(key, attempt, revision);
                return Ok(respond(StatusCode::CREATED, &stored, &warnings));
            }
            // Another server took the address we picked: pick again.
            Err(StoreError::AlreadyExists { key: taken }) if Allocators::is_record(&taken) => {
                reservation.abort(Some(&taken));
            }
            Err(StoreError::AlreadyExists { .. }) if generate => reservation.abort(None),
            Err(StoreError::AlreadyExists { .. }) => {
                reservation.abort(None);
                return Err(Status::already_exists(scope.target(), &name));
            }
            Err(e) => {
                reservation.abort(None);
                return Err(store_error(e));
            }
        }
    }
    Err(Status::timeout(
        "could not generate a unique name; try again",
    ))
}

/// The stored object and its value as the strategies see it (no RV).
fn decode_stored(kv: &KeyValue) -> Result<Value, Status> {
    serde_json::from_slice(&kv.value)
        .map_err(|e| Status::internal(format!("stored object {} is corrupt: {e}", kv.key)))
}

/// Kubernetes lets PUT create these (controllers write them blindly).
fn create_on_update(kind: Kind) -> bool {
    matches!(kind, Kind::Endpoints | Kind::Event)
}

/// What a write to an existing object is aimed at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    /// The object itself (everything but `.status`).
    Main,
    /// The `status` subresource (only `.status`).
    Status,
}

/// The new object a write computes from the current one, and the
/// resourceVersion it insists on (a precondition), if any.
pub(crate) struct Proposal {
    pub(crate) object: Value,
    pub(crate) expected: Option<portal_store::Revision>,
    pub(crate) warnings: Vec<String>,
}

/// Read, compute, compare-and-swap, retry: Kubernetes' GuaranteedUpdate. A
/// write that names a resourceVersion fails with 409 when it is stale; one
/// that does not is recomputed on the newer object.
pub(crate) async fn guaranteed_update(
    state: &ApiState,
    scope: &Scope<'_>,
    name: &str,
    part: Part,
    query: &Query,
    mut propose: impl FnMut(&Value) -> Result<Proposal, Status>,
) -> Result<(CachedObject, Vec<String>), Status> {
    let resource = scope.resource;
    let key = resource.key(scope.namespace, name);
    for _ in 0..MAX_ATTEMPTS {
        let Some(current) = state.store.get(&key).await.map_err(store_error)? else {
            return Err(Status::not_found(scope.target(), name));
        };
        let old = decode_stored(&current)?;
        // Clients see (and patch) the object with its resourceVersion.
        let mut visible = old.clone();
        meta::metadata_mut(&mut visible).insert(
            "resourceVersion".into(),
            Value::String(current.mod_revision.to_string()),
        );
        let Proposal {
            object,
            expected,
            warnings,
        } = propose(&visible)?;
        if expected.is_some_and(|rv| rv != current.mod_revision) {
            return Err(Status::conflict(scope.target(), name));
        }
        check_uid(scope, name, &object, &old)?;
        let mut new = object;
        strategy::prepare_update(resource, &mut new, &old, part == Part::Status);
        Allocators::keep_allocated(resource, &mut new, &old);
        let causes = problems(resource, &new, Some(&old));
        if !causes.is_empty() {
            return Err(invalid(scope, &new, causes));
        }
        if strategy::unchanged(&new, &old) {
            return Ok((
                CachedObject::from_value(key, new, current.mod_revision),
                warnings,
            ));
        }
        if deletion::released(resource, &old, &new) && !dry_run(query) {
            // The last finalizer went from an object being deleted: it goes.
            match delete_stored(state.store.as_ref(), &state.allocators, resource, &current).await {
                Ok(revision) => {
                    return Ok((CachedObject::from_value(key, new, revision), warnings))
                }
                Err(StoreError::Conflict { .. }) if expected.is_none() => continue,
                Err(StoreError::Conflict { .. }) => {
                    return Err(Status::conflict(scope.target(), name))
                }
                Err(e) => return Err(store_error(e)),
            }
        }
        let mut reservation = state
            .allocators
            .for_update(resource, &mut new, &old)
            .map_err(|cause| Status::invalid(scope.target(), name, vec![cause]))?;
        if dry_run(query) {
            reservation.abort(None);
            return Ok((
                CachedObject::from_value(key, new, current.mod_revision),
                warnings,
            ));
        }
        let value =
            Bytes::from(serde_json::to_vec(&new).map_err(|e| Status::internal(e.to_string()))?);
        let mut ops = vec![Op::Update {
            key: key.clone(),
            value,
            expected_revision: current.mod_revision,
        }];
        ops.append(&mut reservation.ops);
        match state.store.txn(ops).await {
            Ok(revision) => {
                reservation.commit();
                return Ok((CachedObject::from_value(key, new, revision), warnings));
            }
            Err(StoreError::AlreadyExists { key: taken }) if Allocators::is_record(&taken) => {
                reservation.abort(Some(&taken));
            }
            Err(StoreError::Conflict { .. } | StoreError::NotFound { .. })
                if expected.is_none() =>
            {
                reservation.abort(None);
            }
            Err(StoreError::Conflict { .. }) => {
                reservation.abort(None);
                return Err(Status::conflict(scope.target(), name));
            }
            Err(e) => {
                reservation.abort(None);
                return Err(store_error(e));
            }
        }
    }
    Err(Status::conflict(scope.target(), name))
}

pub(crate) async fn update(
    state: &ApiState,
    scope: &Scope<'_>,
    name: &str,
    part: Part,
    body: DecodedBody,
    query: &Query,
) -> Result<Response<Body>, Status> {
    let DecodedBody { object, warnings } = body;
    let body_name = meta::meta_str(&object, "name").unwrap_or("");
    if body_name != name {
        return Err(Status::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    check_body_namespace(scope, &object)?;
    let expected = parse_revision(meta::meta_str(&object, "resourceVersion"))?;
    let key = scope.resource.key(scope.namespace, name);
    if create_on_update(scope.resource.kind)
        && part == Part::Main
        && state.store.get(&key).await.map_err(store_error)?.is_none()
    {
        return create(state, scope, DecodedBody { object, warnings }, query).await;
    }
    let propose = |_: &Value| {
        Ok(Proposal {
            object: object.clone(),
            expected,
            warnings: warnings.clone(),
        })
    };
    let (stored, warnings) = guaranteed_update(state, scope, name, part, query, propose).await?;
    Ok(respond(StatusCode::OK, &stored, &warnings))
}

fn check_body_namespace(scope: &Scope<'_>, object: &Value) -> Result<(), Status> {
    match (scope.namespace, meta::meta_str(object, "namespace")) {
        (Some(ns), Some(body_ns)) if !body_ns.is_empty() && body_ns != ns => Err(Status::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        _ => Ok(()),
    }
}

/// Decodes a patched object like a request body (strict or not).
pub(crate) fn decode_patched(
    resource: &Resource,
    patched: Value,
    query: &Query,
) -> Result<(Value, Vec<String>), Status> {
    let validation = FieldValidation::from_query(query)?;
    let Decoded {
        object,
        unknown_fields,
    } = decode::decode_object(resource, patched).map_err(|e| Status::bad_request(e.to_string()))?;
    let warnings = match validation {
        FieldValidation::Strict if !unknown_fields.is_empty() => {
            return Err(Status::bad_request(
                decode::DecodeError::UnknownFields(unknown_fields).to_string(),
            ))
        }
        FieldValidation::Warn => unknown_fields
            .iter()
            .map(|f| format!("unknown field \"{f}\""))
            .collect(),
        _ => Vec::new(),
    };
    Ok((object, warnings))
}

pub(crate) fn patch_error(scope: &Scope<'_>, name: &str, error: PatchError) -> Status {
    match error {
        PatchError::Malformed(message) => Status::bad_request(message),
        PatchError::Failed(message) => {
            let mut status = Status::invalid(scope.target(), name, Vec::new());
            status.message = message;
            status
        }
    }
}

/// PATCH of an object or its status.
pub(crate) async fn patch(
    state: &ApiState,
    scope: &Scope<'_>,
    name: &str,
    part: Part,
    patch_type: PatchType,
    body: &[u8],
    query: &Query,
) -> Result<Response<Body>, Status> {
    let resource = scope.resource;
    let propose = |visible: &Value| {
        let patched = portal_api::patch::apply(resource.kind, patch_type, visible, body)
            .map_err(|e| patch_error(scope, name, e))?;
        // The object is patched with its resourceVersion in it: only a patch
        // that changed it asks for a precondition. Otherwise a lost race is
        // retried on the newer object, as Kubernetes does (a retried patch
        // that names a stale version then fails the check).
        let patched_version = meta::meta_str(&patched, "resourceVersion");
        let expected = if patched_version == meta::meta_str(visible, "resourceVersion") {
            None
        } else {
            parse_revision(patched_version)?
        };
        let (object, warnings) = decode_patched(resource, patched, query)?;
        Ok(Proposal {
            object,
            expected,
            warnings,
        })
    };
    let (stored, warnings) = guaranteed_update(state, scope, name, part, query, propose).await?;
    Ok(respond(StatusCode::OK, &stored, &warnings))
}

fn check_uid(scope: &Scope<'_>, name: &str, object: &Value, old: &Value) -> Result<(), Status> {
    match (meta::meta_str(object, "uid"), meta::meta_str(old, "uid")) {
        (Some(given), Some(stored)) if !given.is_empty() && given != stored => {
            let mut status = Status::conflict(scope.target(), name);
            status.message = format!(
                "Precondition failed: UID in precondition: {given}, UID in object meta: {stored}"
            );
            Err(status)
        }
        _ => Ok(()),
    }
}

/// The parts of `DeleteOptions` that change what a delete does.
#[derive(Debug, Default, serde::Deserialize)]
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

#[derive(Debug, Default, serde::Deserialize)]
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
    query: &Query,
) -> Result<Response<Body>, Status> {
    let resource = scope.resource;
    let options: DeleteOptions = if body.iter().all(u8::is_ascii_whitespace) {
        DeleteOptions::default()
    } else {
        serde_json::from_slice(body)
            .map_err(|e| Status::bad_request(format!("invalid DeleteOptions: {e}")))?
    };
    let policy = if options.orphan_dependents == Some(true) {
        Propagation::Orphan
    } else {
        let asked = options
            .propagation_policy
            .as_deref()
            .or(query.get("propagationPolicy"));
        Propagation::parse(asked).map_err(Status::bad_request)?
    };
    let preconditions = options.preconditions.unwrap_or_default();
    let expected = parse_revision(preconditions.resource_version.as_deref())?;
    let grace = match (
        options.grace_period_seconds,
        query.get("gracePeriodSeconds"),
    ) {
        (Some(seconds), _) => Some(seconds),
        (None, Some(text)) => Some(
            text.parse::<i64>()
                .map_err(|_| Status::bad_request(format!("invalid gracePeriodSeconds {text:?}")))?,
        ),
        (None, None) => None,
    };
    if resource.kind == Kind::Namespace && SYSTEM_NAMESPACES.contains(&name) {
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
        if dry_run(query) || options.dry_run.iter().any(|d| d == "All") {
            // Checked, not done.
            return Ok(json_response(
                StatusCode::OK,
                CachedObject::from_value(key, old, current.mod_revision)
                    .json
                    .clone(),
            ));
        }
        if resource.kind == Kind::Namespace {
            return crate::namespace::begin_termination(state, scope, name, current, old).await;
        }
        let uid = meta::meta_str(&old, "uid").unwrap_or("").to_owned();
        let namespace = scope.namespace.map(str::to_owned);
        let collector = state.collector();
        let store = state.store.as_ref();
        match deletion::delete_object(store, &state.allocators, resource, &current, grace).await {
            // Marked (a pod stopping on its node, finalizers): it stays.
            Ok(Outcome::Marked { revision, object }) => {
                return Ok(json_response(
                    StatusCode::OK,
                    CachedObject::from_value(key, object, revision).json.clone(),
                ));
            }
            Ok(Outcome::Pending { object }) => {
                return Ok(json_response(
                    StatusCode::OK,
                    CachedObject::from_value(key, object, current.mod_revision)
                        .json
                        .clone(),
                ));
            }
            Ok(Outcome::Deleted { revision, .. }) => {
                // The owner goes first, so no controller recreates what is
                // being removed. Foreground and Orphan finish before the
                // reply; Background after it.
                if !uid.is_empty() {
                    if policy == Propagation::Background {
                        tokio::spawn(async move {
                            if let Err(error) = collector.collect(namespace, uid, policy).await {
                                tracing::warn!(%error, "deleting dependents failed");
                            }
                        });
                    } else {
                        collector
                            .collect(namespace, uid, policy)
                            .await
                            .map_err(store_error)?;
                    }
                }
                return Ok(json_response(
                    StatusCode::OK,
                    CachedObject::from_value(key, old, revision).json.clone(),
                ));
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

/// DELETE on a collection: every object the selectors match.
pub(crate) async fn delete_collection(
    state: &ApiState,
    scope: &Scope<'_>,
    query: &Query,
) -> Result<Response<Body>, Status> {
    let resource = scope.resource;
    let filter = Filter::from_query(resource, query)?;
    fresh(state, query).await?;
    let prefix = resource.list_prefix(scope.namespace);
    let (items, _, _) = state.cache.list(resource, &prefix, None, 0, |o| {
        filter.matches(resource, &o.value)
    });
    let grace = match query.get("gracePeriodSeconds") {
        Some(text) => Some(
            text.parse::<i64>()
                .map_err(|_| Status::bad_request(format!("invalid gracePeriodSeconds {text:?}")))?,
        ),
        None => None,
    };
    let mut deleted = Vec::with_capacity(items.len());
    for item in items {
        for _ in 0..MAX_ATTEMPTS {
            let Some(current) = state.store.get(&item.key).await.map_err(store_error)? else {
                break;
            };
            let store = state.store.as_ref();
            match deletion::delete_object(store, &state.allocators, resource, &current, grace).await
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
                    let uid = meta::meta_str(&value, "uid").unwrap_or("").to_owned();
                    let (collector, namespace) =
                        (state.collector(), scope.namespace.map(str::to_owned));
                    tokio::spawn(async move {
                        if let Err(error) = collector
                            .collect(namespace, uid, Propagation::Background)
                            .await
                        {
                            tracing::warn!(%error, "deleting dependents failed");
                        }
                    });
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
    Ok(json_response(
        StatusCode::OK,
        crate::read::list_body(resource, revision, &deleted, None, 0),
    ))
}
