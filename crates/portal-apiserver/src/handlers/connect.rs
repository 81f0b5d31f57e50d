//! The pod subresources its node serves: `log`, `exec`, `attach` and
//! `portforward`. The container is checked here (with kube-apiserver's
//! messages), then the request goes to the node agent named by the pod's
//! `spec.nodeName` (its InternalIP and `daemonEndpoints` port) over TLS
//! with this server's agent client certificate. Logs are streamed back;
//! an upgrade (WebSocket or SPDY) is answered with the agent's own 101
//! and the two connections are spliced, so the agent speaks the streaming
//! protocols end to end.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderName, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use portal_api::{kinds, Status};
use serde_json::Value;

use crate::server::http::{
    full, relay_body, splice, upstream_connection, Body, Query, RequestBody,
};
use crate::{ApiState, Scope};

/// How long reaching an agent may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of an agent's error body passed on.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Headers an upgrade carries through, both ways.
const UPGRADE_HEADERS: [&str; 8] = [
    "connection",
    "upgrade",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
    "sec-websocket-accept",
    "sec-websocket-extensions",
    "x-stream-protocol-version",
];

/// The subresources served here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Connect {
    Log,
    Exec,
    Attach,
    PortForward,
}

impl Connect {
    pub(crate) fn parse(subresource: &str) -> Option<Self> {
        match subresource {
            "log" => Some(Connect::Log),
            "exec" => Some(Connect::Exec),
            "attach" => Some(Connect::Attach),
            "portforward" => Some(Connect::PortForward),
            _ => None,
        }
    }
}

/// Serves `pods/NAME/{log,exec,attach,portforward}`.
pub(crate) async fn serve(
    state: &ApiState,
    namespace: &str,
    name: &str,
    what: Connect,
    mut request: Request<RequestBody>,
) -> Result<Response<Body>, Status> {
    let allowed = match what {
        Connect::Log => request.method() == Method::GET,
        _ => matches!(*request.method(), Method::GET | Method::POST),
    };
    if !allowed {
        return Err(Status::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({} pods/{:?})",
            request.method(),
            what
        )));
    }
    let query = Query::parse(request.uri().query());
    let pods = &kinds::pod::RESOURCE;
    let pod = crate::registry::lookup::stored(state, &pods.key(Some(namespace), name))
        .await?
        .ok_or_else(|| Status::not_found(Scope::cluster(pods).target(), name))?
        .value
        .clone();
    let container = match what {
        Connect::PortForward => String::new(),
        _ => container(&pod, name, query.get("container"))?,
    };
    let Some(node) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) else {
        if what == Connect::Log {
            // Nothing ran yet: no log, as kube-apiserver answers.
            return Ok(Response::new(full(Bytes::new())));
        }
        return Err(Status::bad_request(format!(
            "pod {name} does not have a host assigned"
        )));
    };
    let address = agent_address(state, node).await?;
    let path = match what {
        Connect::Log => format!("/containerLogs/{namespace}/{name}/{container}"),
        Connect::Exec => format!("/exec/{namespace}/{name}/{container}"),
        Connect::Attach => format!("/attach/{namespace}/{name}/{container}"),
        Connect::PortForward => format!("/portForward/{namespace}/{name}"),
    };
    let forwarded: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(
            form_urlencoded::parse(request.uri().query().unwrap_or("").as_bytes())
                .filter(|(k, _)| k != "container"),
        )
        .finish();
    let uri = if forwarded.is_empty() {
        path
    } else {
        format!("{path}?{forwarded}")
    };
    let mut upstream = Request::builder()
        .method(request.method().clone())
        .uri(uri)
        .header(header::HOST, address.to_string());
    for name in UPGRADE_HEADERS {
        for value in request.headers().get_all(name) {
            upstream = upstream.header(name, value);
        }
    }
    let upstream = upstream
        .body(Empty::<Bytes>::new())
        .map_err(|e| Status::internal(e.to_string()))?;
    let upgrading = request.headers().contains_key(header::UPGRADE);
    let client_upgrade = upgrading.then(|| hyper::upgrade::on(&mut request));

    let mut sender = dial(state, address, node).await?;
    let mut response = sender
        .send_request(upstream)
        .await
        .map_err(|e| unreachable_node(node, e))?;
    let status = response.status();
    if status == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            return Err(Status::internal("the node switched protocols unasked"));
        };
        let node_upgrade = hyper::upgrade::on(&mut response);
        let mut answer = Response::new(full(Bytes::new()));
        *answer.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        for name in UPGRADE_HEADERS {
            let name = HeaderName::from_static(name);
            for value in response.headers().get_all(&name) {
                answer.headers_mut().append(name.clone(), value.clone());
            }
        }
        splice(client_upgrade, node_upgrade);
        return Ok(answer);
    }
    if !status.is_success() {
        let body = read_error_body(response.into_body()).await;
        return Err(agent_error(status, body));
    }
    // A log: streamed as the agent writes it; an error ends it.
    let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
    let mut answer = Response::new(relay_body(response.into_body()));
    if let Some(content_type) = content_type {
        answer
            .headers_mut()
            .insert(header::CONTENT_TYPE, content_type);
    }
    Ok(answer)
}

/// The container a request names, or the pod's only one.
fn container(pod: &Value, name: &str, asked: Option<&str>) -> Result<String, Status> {
    let spec = &pod["spec"];
    let names: Vec<&str> = ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|list| spec[list].as_array().into_iter().flatten())
        .filter_map(|c| c["name"].as_str())
        .collect();
    match asked.filter(|c| !c.is_empty()) {
        Some(asked) if names.contains(&asked) => Ok(asked.to_owned()),
        Some(asked) => Err(Status::bad_request(format!(
            "container {asked} is not valid for pod {name}"
        ))),
        None => {
            let regular: Vec<&str> = spec["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["name"].as_str())
                .collect();
            match (regular.as_slice(), names.len()) {
                ([only], 1) => Ok((*only).to_owned()),
                (_, 0) => Err(Status::bad_request(format!(
                    "a container name must be specified for pod {name}"
                ))),
                _ => Err(Status::bad_request(format!(
                    "a container name must be specified for pod {name}, choose one of: [{}]",
                    names.join(" ")
                ))),
            }
        }
    }
}

/// The node's agent: its InternalIP and the port it reports.
async fn agent_address(state: &ApiState, node: &str) -> Result<SocketAddr, Status> {
    let nodes = &kinds::node::RESOURCE;
    let object = crate::registry::lookup::stored(state, &nodes.key(None, node))
        .await?
        .ok_or_else(|| Status::not_found(Scope::cluster(nodes).target(), node))?;
    agent_address_of(&object.value)
        .ok_or_else(|| Status::bad_request(format!("node {node} has no InternalIP address")))
}

/// A Node object's agent address; `None` without an InternalIP.
pub(crate) fn agent_address_of(node: &serde_json::Value) -> Option<SocketAddr> {
    let status = &node["status"];
    let ip = status["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["type"] == "InternalIP")
        .find_map(|a| a["address"].as_str()?.parse::<IpAddr>().ok())?;
    let port = status["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
        .unwrap_or(10250);
    Some(SocketAddr::new(ip, port))
}

fn unreachable_node(node: &str, error: impl std::fmt::Display) -> Status {
    Status::service_unavailable(format!("cannot reach the agent of node {node}: {error}"))
}

/// A TLS connection to the agent, ready for one request (upgrades kept).
pub(crate) async fn dial(
    state: &ApiState,
    address: SocketAddr,
    node: &str,
) -> Result<hyper::client::conn::http1::SendRequest<Empty<Bytes>>, Status> {
    let connect = async {
        let tcp = tokio::net::TcpStream::connect(address).await?;
        let _ = tcp.set_nodelay(true);
        let name = rustls_pki_types::ServerName::IpAddress(address.ip().into());
        tokio_rustls::TlsConnector::from(state.agents.clone())
            .connect(name, tcp)
            .await
    };
    let tls = tokio::time::timeout(DIAL_TIMEOUT, connect)
        .await
        .map_err(|_| unreachable_node(node, "timed out"))?
        .map_err(|e| unreachable_node(node, e))?;
    upstream_connection(tls)
        .await
        .map_err(|e| unreachable_node(node, e))
}

/// Reads at most [`MAX_ERROR_BODY`] of an error answer.
async fn read_error_body(body: Incoming) -> String {
    match http_body_util::Limited::new(body, MAX_ERROR_BODY)
        .collect()
        .await
    {
        Ok(collected) => String::from_utf8_lossy(&collected.to_bytes())
            .trim()
            .to_owned(),
        Err(_) => String::new(),
    }
}

/// An agent's refusal as the client should see it: its words for a bad
/// request (why a log is not there yet), a generic status otherwise.
fn agent_error(status: StatusCode, body: String) -> Status {
    let message = if body.is_empty() {
        format!("the node agent answered {status}")
    } else {
        body
    };
    match status {
        StatusCode::BAD_REQUEST => Status::bad_request(message),
        StatusCode::FORBIDDEN => Status::forbidden(message),
        // As kube-apiserver: the agent's own words are not passed on.
        StatusCode::NOT_FOUND => Status::no_route(),
        _ => Status::internal(message),
    }
}
