//! `metrics.k8s.io/v1beta1`, served by this server itself (as k3s ships
//! metrics-server): NodeMetrics and PodMetrics, what `kubectl top` and the
//! HorizontalPodAutoscaler read. Each answer is built from the agents'
//! summary API (`/stats/summary` on the agent port, fetched with this
//! server's client certificate, every node at once): a node or pod is
//! listed once its agent has two samples of it (a CPU rate), as
//! metrics-server lists them. Reads only (`get`, `list`), authorized by
//! RBAC on the `metrics.k8s.io` resources; a user's APIService for the
//! group (metrics-server itself) takes precedence.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use portal_api::selector::{FieldSelector, LabelSelector};
use portal_api::{kinds, Status, Target as StatusTarget};
use serde_json::{json, Value};

use crate::handlers::connect;
use crate::registry::cache::CachedObject;
use crate::security::auth;
use crate::security::user::User;
use crate::server::http::{json_response, Body, Query, RequestBody};
use crate::ApiState;

pub(crate) const GROUP: &str = "metrics.k8s.io";
pub(crate) const VERSION: &str = "v1beta1";

/// The group's resources: (plural, singular, kind, namespaced).
pub(crate) const RESOURCES: [(&str, &str, &str, bool); 2] = [
    ("nodes", "", "NodeMetrics", false),
    ("pods", "", "PodMetrics", true),
];

/// How often agents sample (their `stats::PERIOD`): the window of a rate.
const WINDOW: &str = "5s";

/// How long one agent may take to answer.
const AGENT_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest summary read from an agent.
const MAX_SUMMARY: usize = 32 * 1024 * 1024;

/// A request for the group: the path after `/apis/metrics.k8s.io/v1beta1`.
#[derive(Debug)]
pub(crate) struct Target<'a> {
    pub(crate) resource: &'a str,
    pub(crate) namespace: Option<&'a str>,
    pub(crate) name: Option<&'a str>,
    /// The deprecated `/watch/` prefix was used: not served.
    pub(crate) watch: bool,
}

/// Serves one request (see the module documentation).
pub(crate) async fn serve(
    state: &ApiState,
    user: &User,
    target: Target<'_>,
    request: Request<RequestBody>,
) -> Result<Response<Body>, Status> {
    // NodeMetrics are cluster-scoped: under a namespace they do not exist
    // (else a namespaced Role would read every node).
    let scoped = RESOURCES
        .iter()
        .find(|(plural, ..)| *plural == target.resource)
        .map(|(.., namespaced)| *namespaced);
    match scoped {
        Some(false) if target.namespace.is_some() => return Err(Status::no_route()),
        None => return Err(Status::no_route()),
        _ => {}
    }
    let query = Query::parse(request.uri().query());
    if request.method() != Method::GET || query.flag("watch") || target.watch {
        return Err(Status::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({} {})",
            request.method(),
            request.uri().path()
        )));
    }
    let verb = if target.name.is_some() { "get" } else { "list" };
    let asked = crate::security::rbac::Request::Resource {
        verb,
        group: GROUP,
        resource: target.resource,
        subresource: None,
        name: target.name,
    };
    if !auth::allowed(state, user, target.namespace, &asked) {
        return Err(auth::forbidden_request(user, target.namespace, &asked));
    }
    let selector = LabelSelector::parse(query.get("labelSelector").unwrap_or(""))
        .map_err(|e| Status::bad_request(format!("unable to parse requirement: {e}")))?;
    // metrics-server answers field selectors on the objects' metadata
    // only; kubectl top never sends one.
    let fields = FieldSelector::parse(query.get("fieldSelector").unwrap_or(""))
        .map_err(Status::bad_request)?;
    if let Some(other) = fields
        .requirements
        .iter()
        .find(|r| r.field != "metadata.name" && r.field != "metadata.namespace")
    {
        return Err(Status::bad_request(format!(
            "field label not supported: {}",
            other.field
        )));
    }
    let keep = |object: &Value| {
        selector.matches(|key| portal_api::meta::label(object, key))
            && fields.matches(|field| match field {
                "metadata.name" => object["metadata"]["name"].as_str().unwrap_or("").to_owned(),
                "metadata.namespace" => object["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
                _ => String::new(),
            })
            && target
                .name
                .is_none_or(|name| object["metadata"]["name"] == name)
    };
    let items = match target.resource {
        "nodes" => node_metrics(state, &keep).await,
        "pods" => pod_metrics(state, target.namespace, &keep).await,
        _ => return Err(Status::no_route()),
    };
    let kind = if target.resource == "nodes" {
        "NodeMetrics"
    } else {
        "PodMetrics"
    };
    let value = match target.name {
        Some(name) => items.into_iter().next().ok_or_else(|| {
            let missing = StatusTarget {
                group: GROUP,
                resource: target.resource,
                kind,
            };
            Status::not_found(missing, name)
        })?,
        None => json!({
            "kind": format!("{kind}List"),
            "apiVersion": format!("{GROUP}/{VERSION}"),
            "metadata": {},
            "items": items,
        }),
    };
    Ok(json_response(
        StatusCode::OK,
        serde_json::to_vec(&value).unwrap_or_default(),
    ))
}

/// The stored objects of a resource under `namespace` (all: `None`) that
/// `keep` accepts.
fn objects(
    state: &ApiState,
    resource: &portal_api::Resource,
    namespace: Option<&str>,
    keep: &(dyn Fn(&Value) -> bool + Sync),
) -> Vec<std::sync::Arc<CachedObject>> {
    let prefix = resource.list_prefix(namespace);
    state
        .cache
        .list(resource, &prefix, None, 0, |o| keep(&o.value))
        .0
}

async fn node_metrics(state: &ApiState, keep: &(dyn Fn(&Value) -> bool + Sync)) -> Vec<Value> {
    let nodes = objects(state, &kinds::node::RESOURCE, None, keep);
    let names: Vec<String> = nodes.iter().map(|n| name_of(&n.value)).collect();
    let summaries = summaries(state, &nodes).await;
    nodes
        .iter()
        .zip(names)
        .filter_map(|(node, name)| {
            let summary = summaries.get(&name)?;
            let usage = usage(&summary["node"])?;
            Some(json!({
                "kind": "NodeMetrics",
                "apiVersion": format!("{GROUP}/{VERSION}"),
                "metadata": {
                    "name": name,
                    "creationTimestamp": now(),
                    "labels": node.value["metadata"]["labels"],
                },
                "timestamp": summary["node"]["cpu"]["time"],
                "window": WINDOW,
                "usage": usage,
            }))
        })
        .collect()
}

async fn pod_metrics(
    state: &ApiState,
    namespace: Option<&str>,
    keep: &(dyn Fn(&Value) -> bool + Sync),
) -> Vec<Value> {
    let pods = objects(state, &kinds::pod::RESOURCE, namespace, keep);
    let wanted: HashSet<&str> = pods
        .iter()
        .filter_map(|p| p.value["spec"]["nodeName"].as_str())
        .collect();
    let nodes = objects(state, &kinds::node::RESOURCE, None, &|n: &Value| {
        n["metadata"]["name"]
            .as_str()
            .is_some_and(|name| wanted.contains(name))
    });
    let summaries = summaries(state, &nodes).await;
    // Each pod's stats by node and UID: only the node the pod is bound to
    // speaks for it.
    let mut by_uid: HashMap<(&str, &str), &Value> = HashMap::new();
    for (node, summary) in &summaries {
        for pod in summary["pods"].as_array().into_iter().flatten() {
            if let Some(uid) = pod["podRef"]["uid"].as_str() {
                by_uid.insert((node.as_str(), uid), pod);
            }
        }
    }
    pods.iter()
        .filter_map(|pod| {
            let node = pod.value["spec"]["nodeName"].as_str()?;
            let stats = by_uid.get(&(node, pod.value["metadata"]["uid"].as_str()?))?;
            let containers: Vec<Value> = stats["containers"]
                .as_array()?
                .iter()
                .map(|c| Some(json!({"name": c["name"], "usage": usage(c)?})))
                .collect::<Option<_>>()?;
            // A pod is shown once every container has a rate (as
            // metrics-server: partial figures would mislead autoscalers).
            if containers.is_empty() {
                return None;
            }
            let meta = &pod.value["metadata"];
            Some(json!({
                "kind": "PodMetrics",
                "apiVersion": format!("{GROUP}/{VERSION}"),
                "metadata": {
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "creationTimestamp": now(),
                    "labels": meta["labels"],
                },
                "timestamp": stats["cpu"]["time"],
                "window": WINDOW,
                "containers": containers,
            }))
        })
        .collect()
}

/// `{"cpu": "…n", "memory": "…Ki"}` from a summary entry; `None` until it
/// has a CPU rate.
fn usage(entry: &Value) -> Option<Value> {
    let nano_cores = entry["cpu"]["usageNanoCores"].as_u64()?;
    let memory = entry["memory"]["workingSetBytes"].as_u64()?;
    Some(json!({"cpu": format!("{nano_cores}n"), "memory": bytes_quantity(memory)}))
}

/// Bytes as Kubernetes writes a binary quantity: `Ki` when exact.
fn bytes_quantity(bytes: u64) -> String {
    if bytes > 0 && bytes % 1024 == 0 {
        format!("{}Ki", bytes / 1024)
    } else {
        bytes.to_string()
    }
}

fn name_of(object: &Value) -> String {
    object["metadata"]["name"].as_str().unwrap_or("").to_owned()
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Each node's summary, by node name, asked of every agent at once; nodes
/// whose agent does not answer are left out (and logged).
async fn summaries(
    state: &ApiState,
    nodes: &[std::sync::Arc<CachedObject>],
) -> HashMap<String, Value> {
    let asks = nodes.iter().filter_map(|node| {
        let name = name_of(&node.value);
        let address = connect::agent_address_of(&node.value)?;
        Some(async move {
            let fetched = tokio::time::timeout(AGENT_TIMEOUT, summary(state, address, &name)).await;
            match fetched {
                Ok(Ok(summary)) => Some((name, summary)),
                Ok(Err(error)) => {
                    tracing::debug!(node = %name, %error, "no resource usage from the node");
                    None
                }
                Err(_) => {
                    tracing::debug!(node = %name, "the node's agent did not answer in time");
                    None
                }
            }
        })
    });
    futures_util::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .collect()
}

async fn summary(state: &ApiState, address: SocketAddr, node: &str) -> Result<Value, String> {
    let mut sender = connect::dial(state, address, node)
        .await
        .map_err(|status| status.message)?;
    let host = match address.ip() {
        IpAddr::V6(ip) => format!("[{ip}]:{}", address.port()),
        IpAddr::V4(ip) => format!("{ip}:{}", address.port()),
    };
    let request = Request::get("/stats/summary")
        .header(http::header::HOST, host)
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    if response.status() != StatusCode::OK {
        return Err(format!("the agent answered {}", response.status()));
    }
    let body = http_body_util::Limited::new(response.into_body(), MAX_SUMMARY)
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_needs_a_rate_and_writes_quantities() {
        let early =
            json!({"cpu": {"usageCoreNanoSeconds": 5}, "memory": {"workingSetBytes": 4096}});
        assert_eq!(usage(&early), None);
        let later =
            json!({"cpu": {"usageNanoCores": 250_000_000u64}, "memory": {"workingSetBytes": 4096}});
        assert_eq!(
            usage(&later),
            Some(json!({"cpu": "250000000n", "memory": "4Ki"}))
        );
        assert_eq!(bytes_quantity(1000), "1000");
        assert_eq!(bytes_quantity(0), "0");
    }
}
