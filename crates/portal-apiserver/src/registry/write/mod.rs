//! Writes: create, update and patch, delete, each decoded, defaulted and
//! validated by the resource's strategy, then made one compare-and-swap
//! transaction in the store. Shared here: body decoding, answers, checks.

mod apply;
mod create;
mod delete;
pub(crate) mod internal;
pub(crate) mod namespace;
mod update;

pub(crate) use apply::apply;
pub(crate) use create::{create, create_object, random_suffix};
pub(crate) use delete::{delete, delete_collection};
pub(crate) use update::{guaranteed_update, patch, patch_error, update};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use portal_api::decode::{self, Decoded, Format};
use portal_api::patch::{PatchError, PatchType};
use portal_api::{kinds, managed, meta, Resource, Status};
use portal_store::{Error as StoreError, KeyValue, Op};
use rand::Rng;
use serde_json::{json, Value};

use crate::registry::allocator::{delete_stored, Allocators};
use crate::registry::cache::CachedObject;
use crate::registry::deletion::Propagation;
use crate::registry::deletion::{self, Outcome};
use crate::registry::lookup::{fresh, parse_revision, stored, Filter};
use crate::registry::strategy;
use crate::server::http::{json_response, Body, FieldValidation, Query};
use crate::{store_error, ApiState, Scope};

/// What the write path asks of admission (the server's `admission`
/// module) beyond a kind's own strategy: held by the server, so that the
/// registry does not depend on what admission reads.
pub(crate) trait Admission: Send + Sync {
    /// Mutating admission of an object about to be written (after
    /// defaults, before validation); `old` on update. The warnings to
    /// return.
    fn admit<'a>(
        &'a self,
        state: &'a ApiState,
        scope: Scope<'a>,
        write: Write<'a>,
        object: &'a mut Value,
        old: Option<&'a Value>,
    ) -> futures_util::future::BoxFuture<'a, Result<Vec<String>, Status>>;

    /// Validating admission (after validation; of a delete, with `object`
    /// null and `old` the object deleted). The warnings to return, or the
    /// refusal.
    fn validate<'a>(
        &'a self,
        state: &'a ApiState,
        scope: &'a Scope<'a>,
        write: Write<'a>,
        object: &'a Value,
        old: Option<&'a Value>,
    ) -> futures_util::future::BoxFuture<'a, Result<Vec<String>, Status>>;
}

/// What admission is told about a write besides the objects.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Write<'a> {
    /// `CREATE`, `UPDATE` or `DELETE`.
    pub(crate) operation: &'static str,
    /// The subresource written, if not the object itself.
    pub(crate) subresource: Option<&'a str>,
    pub(crate) dry_run: bool,
}

/// Conflicting writers retry an unconditional update this many times.
const MAX_ATTEMPTS: usize = 16;

/// A decoded request body with the warnings to send back.
pub(crate) struct DecodedBody {
    object: Value,
    warnings: Vec<String>,
    /// `managedFields` already worked out (an apply that creates).
    managed: Option<Value>,
}

impl DecodedBody {
    /// An object already decoded and defaulted (a server's own write).
    pub(crate) fn new(object: Value) -> Self {
        DecodedBody {
            object,
            warnings: Vec::new(),
            managed: None,
        }
    }

    /// The decoded object, before defaults.
    pub(crate) fn object(&self) -> &Value {
        &self.object
    }
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
    Ok(DecodedBody {
        object,
        warnings,
        managed: None,
    })
}

async fn respond(
    state: &ApiState,
    resource: &Resource,
    code: StatusCode,
    object: &CachedObject,
    warnings: &[String],
) -> Result<Response<Body>, Status> {
    let served = crate::registry::conversion::served_json(state, resource, object).await?;
    let mut response = json_response(code, served);
    for warning in warnings {
        let text = format!(
            "299 - {}",
            serde_json::to_string(warning).unwrap_or_default()
        );
        if let Ok(value) = HeaderValue::from_str(&text) {
            response.headers_mut().append("warning", value);
        }
    }
    Ok(response)
}

/// Who a write is recorded as, in `managedFields`: `names` are the field
/// manager, the resource's apiVersion and the time.
fn writer<'a>(resource: &Resource, names: &'a [String; 3], part: Part) -> managed::Writer<'a> {
    let [manager, api_version, now] = names;
    managed::Writer {
        manager,
        api_version,
        subresource: part.subresource(),
        has_status: resource.has_status,
        now,
    }
}

/// Records the write in `new`'s `managedFields`: the apply's own, or the
/// writer's update of `old` (`{}` for a new object).
fn record_managers(
    resource: &Resource,
    old: &Value,
    new: &mut Value,
    managed_by_apply: Option<Value>,
    writer: &managed::Writer<'_>,
) -> Result<(), Status> {
    match managed_by_apply {
        Some(Value::Null) => drop(meta::metadata_mut(new).remove("managedFields")),
        Some(entries) => drop(meta::metadata_mut(new).insert("managedFields".into(), entries)),
        None => managed::track_update(resource, old, new, writer)
            .map_err(|why| Status::bad_request(format!("invalid managedFields: {why}")))?,
    }
    Ok(())
}

fn dry_run(query: &Query) -> bool {
    query.get("dryRun") == Some("All")
}

/// Who writes, and whether for real: all the registry needs of a request
/// beyond its object. Handlers take it from the query (`fieldManager`,
/// `dryRun`); the server's own writers name themselves, so their writes
/// are recorded in `managedFields` like anyone's.
#[derive(Clone, Debug)]
pub(crate) struct WriteOptions {
    pub(crate) manager: String,
    pub(crate) dry_run: bool,
}

impl WriteOptions {
    pub(crate) fn from_query(query: &Query) -> Result<Self, Status> {
        Ok(WriteOptions {
            manager: query.field_manager()?,
            dry_run: dry_run(query),
        })
    }

    /// A write of the server's own, as `manager`.
    pub(crate) fn internal(manager: &str) -> Self {
        WriteOptions {
            manager: manager.to_owned(),
            dry_run: false,
        }
    }
}

/// An object as the store keeps it: kinds stored in another form than the
/// one written (a CRD's storage version, events.k8s.io Events as core
/// Events) are converted at the last moment, so everything before works
/// on the form the client sent.
fn stored_bytes(resource: &Resource, object: &Value) -> Result<Bytes, Status> {
    let encode = |v: &Value| {
        serde_json::to_vec(v)
            .map(Bytes::from)
            .map_err(|e| Status::internal(e.to_string()))
    };
    if resource.custom.is_none() {
        return encode(object);
    }
    let mut stored = object.clone();
    portal_api::custom::to_storage(resource, &mut stored);
    encode(&stored)
}

/// [`stored_bytes`], for kinds whose versions a webhook converts too (the
/// webhook is asked first).
async fn storable(state: &ApiState, resource: &Resource, object: &Value) -> Result<Bytes, Status> {
    if crate::registry::conversion::webhook(resource).is_none() {
        return stored_bytes(resource, object);
    }
    let mut stored = object.clone();
    crate::registry::conversion::to_storage(state, resource, &mut stored).await?;
    stored_bytes(resource, &stored)
}

/// Metadata and kind-specific problems of an object about to be stored.
fn problems(resource: &Resource, object: &Value, old: Option<&Value>) -> Vec<portal_api::Cause> {
    let mut causes = meta::validate(resource, object);
    causes.extend(resource.validate_object(object, old));
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
    let resource = &kinds::namespace::RESOURCE;
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

/// The stored object and its value as the strategies see it (no RV).
fn decode_stored(kv: &KeyValue) -> Result<Value, Status> {
    serde_json::from_slice(&kv.value)
        .map_err(|e| Status::internal(format!("stored object {} is corrupt: {e}", kv.key)))
}

pub(crate) use crate::registry::strategy::Part;

/// The new object a write computes from the current one, and the
/// resourceVersion it insists on (a precondition), if any.
pub(crate) struct Proposal {
    pub(crate) object: Value,
    pub(crate) expected: Option<portal_store::Revision>,
    pub(crate) warnings: Vec<String>,
    /// `managedFields` already worked out (by an apply); `None`: the write
    /// is recorded as an update by its field manager.
    pub(crate) managed: Option<Value>,
}

fn check_body_namespace(scope: &Scope<'_>, object: &Value) -> Result<(), Status> {
    match (scope.namespace, meta::meta_str(object, "namespace")) {
        (Some(ns), Some(body_ns)) if !body_ns.is_empty() && body_ns != ns => Err(Status::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        _ => Ok(()),
    }
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
