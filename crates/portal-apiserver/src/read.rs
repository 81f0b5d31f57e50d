//! get and list, served from the watch cache once it is as fresh as the
//! request demands; selectors; list paging.

use base64::Engine;
use bytes::{BufMut, Bytes, BytesMut};
use http::{Response, StatusCode};
use portal_api::selector::{FieldSelector, LabelSelector};
use portal_api::{meta, table, Resource, Status};
use portal_store::Revision;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::cache::CachedObject;
use crate::http::{json_response, now_seconds, Body, Output, Query};
use crate::{store_error, ApiState, Scope};

/// Waits until the cache reflects what the request's `resourceVersion` asks:
/// unset = the latest committed state, "0" = anything, N = at least N.
pub(crate) async fn fresh(state: &ApiState, query: &Query) -> Result<(), Status> {
    match query.get("resourceVersion") {
        Some("0") => Ok(()),
        None | Some("") => {
            let current = state.store.current_revision().await.map_err(store_error)?;
            state.cache.wait_for(current).await
        }
        Some(_) => {
            reached(
                state,
                parse_revision(query.get("resourceVersion"))?.unwrap_or(0),
            )
            .await
        }
    }
}

/// Waits until the cache has seen `revision`, which another server may
/// have issued a moment ago. One this cluster never issued (a client
/// from before `portal store migrate`, or a restore) is 410, so that the
/// client lists again rather than wait for a revision that may never come.
pub(crate) async fn reached(state: &ApiState, revision: Revision) -> Result<(), Status> {
    if state.cache.revision() >= revision {
        return Ok(());
    }
    let current = state.store.current_revision().await.map_err(store_error)?;
    if revision > current {
        return Err(Status::expired(format!(
            "resource version {revision} was not issued by this cluster (it is at {current}): list again"
        )));
    }
    state.cache.wait_for(revision).await
}

/// The latest committed object at `key`, read from the store.
pub(crate) async fn stored(state: &ApiState, key: &str) -> Result<Option<CachedObject>, Status> {
    let Some(stored) = state.store.get(key).await.map_err(store_error)? else {
        return Ok(None);
    };
    CachedObject::decode(key, &stored.value, stored.mod_revision)
        .map(Some)
        .map_err(|e| Status::internal(format!("stored object {key}: {e}")))
}

pub(crate) fn parse_revision(value: Option<&str>) -> Result<Option<Revision>, Status> {
    match value {
        None | Some("") => Ok(None),
        Some(v) => v
            .parse::<Revision>()
            .map(Some)
            .map_err(|_| Status::bad_request(format!("invalid resource version: {v:?}"))),
    }
}

pub(crate) async fn get(
    state: &ApiState,
    scope: &Scope<'_>,
    name: &str,
    query: &Query,
    output: Output,
) -> Result<Response<Body>, Status> {
    let key = scope.resource.key(scope.namespace, name);
    let not_found = || Status::not_found(scope.target(), name);
    let object = match query.get("resourceVersion") {
        // Like Kubernetes, a GET of the latest state reads the store: one
        // key costs less than waiting for the cache under a write flood.
        None | Some("") => std::sync::Arc::new(stored(state, &key).await?.ok_or_else(not_found)?),
        Some(_) => {
            fresh(state, query).await?;
            state
                .cache
                .get(scope.resource, &key)
                .ok_or_else(not_found)?
        }
    };
    Ok(match output {
        Output::Json => json_response(StatusCode::OK, object.json.clone()),
        Output::Protobuf => {
            let bytes = portal_api::protobuf::encode(scope.resource, &object.value)
                .map_err(|e| Status::internal(format!("protobuf encoding: {e}")))?;
            let mut response = json_response(StatusCode::OK, bytes);
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(portal_api::protobuf::MEDIA_TYPE),
            );
            response
        }
        Output::Metadata => json_response(
            StatusCode::OK,
            serde_json::to_vec(&crate::http::partial_metadata(&object.value)).unwrap_or_default(),
        ),
        Output::Table(include) => {
            let rv = meta::meta_str(&object.value, "resourceVersion")
                .unwrap_or("")
                .to_owned();
            let meta = json!({"resourceVersion": rv});
            let table = table::table(
                scope.resource,
                [&object.value],
                now_seconds(),
                include,
                meta,
            );
            json_response(
                StatusCode::OK,
                serde_json::to_vec(&table).unwrap_or_default(),
            )
        }
    })
}

/// Label and field selectors of a list or watch, checked against the
/// resource's selectable fields.
#[derive(Debug, Default)]
pub(crate) struct Filter {
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    pub(crate) fn from_query(resource: &Resource, query: &Query) -> Result<Self, Status> {
        let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or(""))
            .map_err(|e| Status::bad_request(format!("unable to parse requirement: {e}")))?;
        let fields = FieldSelector::parse(query.get("fieldSelector").unwrap_or(""))
            .map_err(Status::bad_request)?;
        for requirement in &fields.requirements {
            if !resource.is_selectable(&requirement.field) {
                return Err(Status::bad_request(format!(
                    "field label not supported: {}",
                    requirement.field
                )));
            }
        }
        Ok(Filter { labels, fields })
    }

    pub(crate) fn matches(&self, resource: &Resource, object: &serde_json::Value) -> bool {
        self.labels.matches(|key| meta::label(object, key))
            && self
                .fields
                .matches(|field| resource.field_value(object, field))
    }

    /// A name the field selector pins (`metadata.name=x`), to skip scanning.
    pub(crate) fn pinned_name(&self) -> Option<&str> {
        self.fields.required_value("metadata.name")
    }
}

/// The opaque `continue` token: where the previous page stopped.
#[derive(Debug, Serialize, Deserialize)]
struct Continue {
    rv: Revision,
    start: String,
}

fn encode_continue(token: &Continue) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(token).unwrap_or_default())
}

fn decode_continue(value: &str, prefix: &str) -> Result<Continue, Status> {
    let invalid = || Status::bad_request("invalid continue token");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(value)
        .map_err(|_| invalid())?;
    let token: Continue = serde_json::from_slice(&bytes).map_err(|_| invalid())?;
    // A token from another list must not read outside this one.
    if !token.start.starts_with(prefix) {
        return Err(invalid());
    }
    Ok(token)
}

pub(crate) async fn list(
    state: &ApiState,
    scope: &Scope<'_>,
    query: &Query,
    output: Output,
) -> Result<Response<Body>, Status> {
    let resource = scope.resource;
    let filter = Filter::from_query(resource, query)?;
    let limit = usize::try_from(query.number("limit")?.unwrap_or(0)).unwrap_or(usize::MAX);
    let prefix = resource.list_prefix(scope.namespace);
    let token = query
        .get("continue")
        .filter(|c| !c.is_empty())
        .map(|c| decode_continue(c, &prefix))
        .transpose()?;
    if token.is_none() {
        fresh(state, query).await?;
    }
    let keep = |object: &CachedObject| filter.matches(resource, &object.value);
    let (items, revision, remaining) = match filter.pinned_name() {
        Some(name) if scope.namespace.is_some() || !resource.namespaced => {
            let key = resource.key(scope.namespace, name);
            let found = state.cache.get(resource, &key).filter(|o| keep(o));
            (found.into_iter().collect(), state.cache.revision(), 0)
        }
        _ => state.cache.list(
            resource,
            &prefix,
            token.as_ref().map(|t| t.start.as_str()),
            limit,
            keep,
        ),
    };
    // Pages after the first report the revision the listing started at.
    let revision = token.as_ref().map_or(revision, |t| t.rv);
    let next = (remaining > 0)
        .then(|| {
            items.last().map(|last| {
                encode_continue(&Continue {
                    rv: revision,
                    start: last.key.clone(),
                })
            })
        })
        .flatten();
    if let Output::Table(include) = output {
        let mut list_meta = json!({"resourceVersion": revision.to_string()});
        if let Some(next) = &next {
            list_meta["continue"] = json!(next);
            list_meta["remainingItemCount"] = json!(remaining);
        }
        let objects = items.iter().map(|o| &o.value);
        let table = table::table(resource, objects, now_seconds(), include, list_meta);
        return Ok(json_response(
            StatusCode::OK,
            serde_json::to_vec(&table).unwrap_or_default(),
        ));
    }
    if output == Output::Metadata {
        let mut list_meta = json!({"resourceVersion": revision.to_string()});
        if let Some(next) = &next {
            list_meta["continue"] = json!(next);
            list_meta["remainingItemCount"] = json!(remaining);
        }
        let items: Vec<serde_json::Value> = items
            .iter()
            .map(|o| crate::http::partial_metadata(&o.value))
            .collect();
        let list = json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": list_meta,
            "items": items,
        });
        return Ok(json_response(
            StatusCode::OK,
            serde_json::to_vec(&list).unwrap_or_default(),
        ));
    }
    Ok(json_response(
        StatusCode::OK,
        list_body(resource, revision, &items, next.as_deref(), remaining),
    ))
}

/// `{"kind":"ServiceList",...,"items":[...]}` from pre-serialized objects.
pub(crate) fn list_body(
    resource: &Resource,
    revision: Revision,
    items: &[std::sync::Arc<CachedObject>],
    next: Option<&str>,
    remaining: usize,
) -> Bytes {
    let mut metadata = serde_json::json!({"resourceVersion": revision.to_string()});
    if let Some(next) = next {
        metadata["continue"] = next.into();
        metadata["remainingItemCount"] = remaining.into();
    }
    let head = serde_json::json!({
        "kind": format!("{}List", resource.kind_name),
        "apiVersion": resource.api_version(),
        "metadata": metadata,
    });
    let head = serde_json::to_vec(&head).unwrap_or_default();
    let size = head.len() + items.iter().map(|o| o.json.len() + 1).sum::<usize>() + 16;
    let mut out = BytesMut::with_capacity(size);
    // The head without its closing brace, then the items.
    out.put_slice(&head[..head.len().saturating_sub(1)]);
    out.put_slice(b",\"items\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.put_u8(b',');
        }
        out.put_slice(&item.json);
    }
    out.put_slice(b"]}");
    out.freeze()
}
