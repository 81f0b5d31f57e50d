//! `pods/{name}/eviction` (`policy/v1` Eviction): how `kubectl drain` and
//! other tools ask a pod to go. With no PodDisruptionBudgets served, every
//! eviction is allowed: it is the pod's deletion with the Eviction's
//! `deleteOptions` (graceful, preconditions, dry run), answered as
//! kube-apiserver answers (201 and a Success Status).

use http::Response;
use portal_api::Status;
use serde_json::Value;

use crate::registry::write;
use crate::server::http::{created_success, Body, Query};
use crate::{ApiState, Scope};

pub(crate) async fn evict(
    state: &ApiState,
    scope: &Scope<'_>,
    name: &str,
    body: &[u8],
    query: &Query,
) -> Result<Response<Body>, Status> {
    let eviction: Value = serde_json::from_slice(body)
        .map_err(|e| Status::bad_request(format!("invalid Eviction: {e}")))?;
    let named = eviction["metadata"]["name"].as_str().unwrap_or("");
    if named != name {
        return Err(Status::bad_request(
            "name in URL does not match name in Eviction object",
        ));
    }
    if let Some(namespace) = eviction["metadata"]["namespace"].as_str() {
        if !namespace.is_empty() && Some(namespace) != scope.namespace {
            return Err(Status::bad_request(
                "namespace in URL does not match namespace in Eviction object",
            ));
        }
    }
    let options = match &eviction["deleteOptions"] {
        Value::Null => Vec::new(),
        options => serde_json::to_vec(options).unwrap_or_default(),
    };
    write::delete(state, scope, name, &options, query).await?;
    Ok(created_success())
}
