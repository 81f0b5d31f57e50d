//! get and list, served from the watch cache once it is as fresh as the
//! request demands; selectors; list paging.

use base64::Engine;
use http::{Response, StatusCode};
use portal_api::{meta, table, Status};
use portal_store::Revision;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::registry::cache::list_body;
use crate::registry::cache::CachedObject;
use crate::registry::conversion::{served, served_items};
use crate::registry::lookup::{fresh, stored, Filter};
use crate::server::http::{json_response, now_seconds, Body, Output, Query};
use crate::{ApiState, Scope};

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
    let object = match output {
        // A CRD's webhook converts what is read at another version.
        Output::Json | Output::Table(_) => served(state, scope.resource, object).await?,
        _ => object,
    };
    Ok(match output {
        Output::Json => json_response(StatusCode::OK, object.served_json(scope.resource)),
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
            serde_json::to_vec(&crate::server::http::partial_metadata(&object.value))
                .unwrap_or_default(),
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
    super::list_options::check_list(query)?;
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
    let items = match output {
        Output::Json | Output::Table(_) | Output::Protobuf => {
            served_items(state, resource, items).await?
        }
        Output::Metadata => items,
    };
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
            .map(|o| crate::server::http::partial_metadata(&o.value))
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
