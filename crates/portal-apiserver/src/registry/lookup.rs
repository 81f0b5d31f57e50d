//! Reads the write path and the handlers share: an object as stored,
//! waiting for the watch cache to be as fresh as a request demands, the
//! `resourceVersion` a request names, and label and field selectors.

use portal_api::selector::{FieldSelector, LabelSelector};
use portal_api::{meta, Resource, Status};
use portal_store::Revision;

use crate::registry::cache::CachedObject;
use crate::server::http::Query;
use crate::{store_error, ApiState};

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

/// The object of `resource` named `name`: as the watch cache has it, else
/// as stored (one written a moment ago the cache has not shown yet).
pub(crate) async fn current(
    state: &ApiState,
    resource: &'static portal_api::Resource,
    namespace: Option<&str>,
    name: &str,
) -> Result<Option<serde_json::Value>, Status> {
    let key = resource.key(namespace, name);
    match state.cache.get(resource, &key) {
        Some(cached) => Ok(Some(cached.value.clone())),
        None => Ok(stored(state, &key).await?.map(|stored| stored.value)),
    }
}

/// A ready endpoint (chosen at random) of a Service's port, named or
/// numbered (the first when `None`): where the proxy subresource and
/// admission webhooks reach a Service, as the node reaches pod addresses.
pub(crate) async fn service_endpoint(
    state: &ApiState,
    namespace: &str,
    name: &str,
    port: Option<&str>,
) -> Result<std::net::SocketAddr, Status> {
    use portal_api::kinds;
    use serde_json::Value;
    let object = |resource: &'static Resource| async move {
        stored(state, &resource.key(Some(namespace), name))
            .await?
            .map(|o| o.value)
            .ok_or_else(|| Status::not_found(crate::Scope::cluster(resource).target(), name))
    };
    let service = object(&kinds::service::RESOURCE).await?;
    let ports: Vec<&Value> = service["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let chosen = match port {
        Some(port) => ports.iter().find(|p| {
            p["name"] == port || p["port"].as_u64().map(|n| n.to_string()).as_deref() == Some(port)
        }),
        None => ports.first(),
    }
    .ok_or_else(|| Status::service_unavailable(format!("no such port on service {name:?}")))?;
    let port_name = chosen["name"].as_str().unwrap_or("");
    let endpoints = object(&kinds::endpoints::RESOURCE).await?;
    let mut candidates = Vec::new();
    for subset in endpoints["subsets"].as_array().into_iter().flatten() {
        let port = subset["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"].as_str().unwrap_or("") == port_name)
            .and_then(|p| p["port"].as_u64())
            .and_then(|p| u16::try_from(p).ok());
        let Some(port) = port else { continue };
        for address in subset["addresses"].as_array().into_iter().flatten() {
            if let Some(ip) = address["ip"]
                .as_str()
                .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
            {
                candidates.push(std::net::SocketAddr::new(ip, port));
            }
        }
    }
    if candidates.is_empty() {
        return Err(Status::service_unavailable(format!(
            "no endpoints available for service {name:?}"
        )));
    }
    Ok(candidates[rand::random_range(0..candidates.len())])
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
