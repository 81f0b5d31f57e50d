//! create, update and delete: decode, default, validate, then one
//! compare-and-swap transaction in the store.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use portal_api::decode::{self, Decoded, Format};
use portal_api::{meta, Kind, Resource, Status};
use portal_store::{Error as StoreError, KeyValue, Op};
use rand::Rng;
use serde_json::Value;

use crate::cache::CachedObject;
use crate::http::{json_response, Body, FieldValidation, Query};
use crate::read::{fresh, parse_revision, Filter};
use crate::{store_error, strategy, ApiState, Scope};

/// Conflicting writers retry an unconditional update this many times.
const MAX_ATTEMPTS: usize = 16;
/// Namespaces that exist from the start and may not be deleted.
pub(crate) const SYSTEM_NAMESPACES: [&str; 3] = ["default", "kube-system", "kube-public"];

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
    let value = decode::parse_body(body, format).map_err(|e| Status::bad_request(e.to_string()))?;
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

fn invalid(scope: &Scope<'_>, object: &Value, causes: Vec<portal_api::Cause>) -> Status {
    let name = meta::meta_str(object, "name")
        .or(meta::meta_str(object, "generateName"))
        .unwrap_or("");
    Status::invalid(scope.target(), name, causes)
}

/// 404 unless the namespace exists; 403 while it is being deleted.
async fn check_namespace(state: &ApiState, namespace: &str) -> Result<(), Status> {
    let current = state.store.current_revision().await.map_err(store_error)?;
    state.cache.wait_for(current).await?;
    let resource = Resource::of(Kind::Namespace);
    let Some(ns) = state.cache.get(resource, &resource.key(None, namespace)) else {
        return Err(Status::not_found(
            Scope::cluster(resource).target(),
            namespace,
        ));
    };
    if meta::meta_str(&ns.value, "deletionTimestamp").is_some() {
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
    if let (Some(ns), Some(body_ns)) = (scope.namespace, meta::meta_str(&object, "namespace")) {
        if !body_ns.is_empty() && body_ns != ns {
            return Err(Status::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    }
    let causes = meta::validate(resource, &object);
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
        if dry_run(query) {
            return Ok(respond(
                StatusCode::CREATED,
                &CachedObject::from_value(key, object, 0),
                &warnings,
            ));
        }
        let value =
            Bytes::from(serde_json::to_vec(&object).map_err(|e| Status::internal(e.to_string()))?);
        match state
            .store
            .txn(vec![Op::Create {
                key: key.clone(),
                value,
            }])
            .await
        {
            Ok(revision) => {
                let stored = CachedObject::from_value(key, object, revision);
                return Ok(respond(StatusCode::CREATED, &stored, &warnings));
            }
            Err(StoreError::AlreadyExists { .. }) if generate => continue,
            Err(StoreError::AlreadyExists { .. }) => {
                return Err(Status::already_exists(scope.target(), &name))
            }
            Err(e) => return Err(store_error(e)),
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

pub(crate) async fn update(
    state: &ApiState,
    scope: &Scope<'_>,
    name: &str,
    status_subresource: bool,
    body: DecodedBody,
    query: &Query,
) -> Result<Response<Body>, Status> {
    let resource = scope.resource;
    let DecodedBody { object, warnings } = body;
    let body_name = meta::meta_str(&object, "name").unwrap_or("");
    if body_name != name {
        return Err(Status::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    if let (Some(ns), Some(body_ns)) = (scope.namespace, meta::meta_str(&object, "namespace")) {
        if !body_ns.is_empty() && body_ns != ns {
            return Err(Status::bad_request("the namespace of the provided object does not match the namespace sent on the request"));
        }
    }
    let expected = parse_revision(meta::meta_str(&object, "resourceVersion"))?;
    let key = resource.key(scope.namespace, name);
    for _ in 0..MAX_ATTEMPTS {
        let Some(current) = state.store.get(&key).await.map_err(store_error)? else {
            if create_on_update(resource.kind) && !status_subresource {
                let body = DecodedBody {
                    object: object.clone(),
                    warnings: warnings.clone(),
                };
                return create(state, scope, body, query).await;
            }
            return Err(Status::not_found(scope.target(), name));
        };
        if expected.is_some_and(|rv| rv != current.mod_revision) {
            return Err(Status::conflict(scope.target(), name));
        }
        let old = decode_stored(&current)?;
        check_uid(scope, name, &object, &old)?;
        let mut new = object.clone();
        strategy::prepare_update(resource, &mut new, &old, status_subresource);
        let causes = meta::validate(resource, &new);
        if !causes.is_empty() {
            return Err(invalid(scope, &new, causes));
        }
        if strategy::unchanged(&new, &old) || dry_run(query) {
            let revision = current.mod_revision;
            return Ok(respond(
                StatusCode::OK,
                &CachedObject::from_value(key, new, revision),
                &warnings,
            ));
        }
        let value =
            Bytes::from(serde_json::to_vec(&new).map_err(|e| Status::internal(e.to_string()))?);
        let op = Op::Update {
            key: key.clone(),
            value,
            expected_revision: current.mod_revision,
        };
        match state.store.txn(vec![op]).await {
            Ok(revision) => {
                return Ok(respond(
                    StatusCode::OK,
                    &CachedObject::from_value(key, new, revision),
                    &warnings,
                ))
            }
            // Someone wrote in between: a conditional update loses, an
            // unconditional one tries again on the new state.
            Err(StoreError::Conflict { .. } | StoreError::NotFound { .. })
                if expected.is_none() =>
            {
                continue
            }
            Err(StoreError::Conflict { .. }) => return Err(Status::conflict(scope.target(), name)),
            Err(e) => return Err(store_error(e)),
        }
    }
    Err(Status::conflict(scope.target(), name))
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
) -> Result<Response<Body>, Status> {
    let resource = scope.resource;
    let options: DeleteOptions = if body.iter().all(u8::is_ascii_whitespace) {
        DeleteOptions::default()
    } else {
        serde_json::from_slice(body)
            .map_err(|e| Status::bad_request(format!("invalid DeleteOptions: {e}")))?
    };
    let preconditions = options.preconditions.unwrap_or_default();
    let expected = parse_revision(preconditions.resource_version.as_deref())?;
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
        if resource.kind == Kind::Namespace {
            return crate::namespace::begin_termination(state, scope, name, current, old).await;
        }
        let op = Op::Delete {
            key: key.clone(),
            expected_revision: Some(current.mod_revision),
        };
        match state.store.txn(vec![op]).await {
            Ok(revision) => {
                return Ok(json_response(
                    StatusCode::OK,
                    CachedObject::from_value(key, old, revision).json.clone(),
                ))
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
    let mut deleted = Vec::with_capacity(items.len());
    for item in items {
        let op = Op::Delete {
            key: item.key.clone(),
            expected_revision: None,
        };
        match state.store.txn(vec![op]).await {
            Ok(revision) => deleted.push(std::sync::Arc::new(CachedObject::from_value(
                item.key.clone(),
                item.value.clone(),
                revision,
            ))),
            Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(store_error(e)),
        }
    }
    let revision = state.store.current_revision().await.map_err(store_error)?;
    Ok(json_response(
        StatusCode::OK,
        crate::read::list_body(resource, revision, &deleted, None, 0),
    ))
}
