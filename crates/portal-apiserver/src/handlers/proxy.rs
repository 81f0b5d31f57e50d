//! `pods/NAME/proxy/PATH` and `services/NAME/proxy/PATH` (what `kubectl
//! proxy` users open): the request goes on to the pod's address, or to a
//! ready endpoint of the Service, over plain HTTP from this server (which
//! reaches pod addresses as the node does). Names may carry a port
//! (`web:8080`, `web:http`) and a scheme (`http:web:80`; only HTTP is
//! spoken). Bodies stream both ways; an upgrade (a WebSocket) is spliced.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderName, Request, Response, StatusCode};
use portal_api::{kinds, Resource, Status};
use serde_json::Value;

use crate::server::http::{full, relay_body, splice, upstream_connection, Body, RequestBody};
use crate::{ApiState, Scope};

const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Headers that belong to one hop, never passed on (RFC 9110 §7.6.1), and
/// the caller's credentials, which are this server's business only.
const NOT_FORWARDED: [&str; 7] = [
    "authorization",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
];

/// A `.../proxy/...` path: namespace, `pods` or `services`, the name part,
/// and the path below it.
pub(crate) fn parse(path: &str) -> Option<(String, &'static str, String, String)> {
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    let mut parts = rest.splitn(5, '/');
    let namespace = parts.next()?;
    let kind = match parts.next()? {
        "pods" => "pods",
        "services" => "services",
        _ => return None,
    };
    let name = parts.next()?;
    if parts.next()? != "proxy" || namespace.is_empty() || name.is_empty() {
        return None;
    }
    let below = format!("/{}", parts.next().unwrap_or(""));
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .ok()
            .map(|s| s.into_owned())
    };
    Some((decode(namespace)?, kind, decode(name)?, below))
}

/// `[scheme:]name[:port]`.
fn split_name(name: &str) -> Result<(&str, Option<&str>), Status> {
    let parts: Vec<&str> = name.split(':').collect();
    let (scheme, name, port) = match parts.as_slice() {
        [name] => ("", *name, None),
        [name, port] => ("", *name, Some(*port)),
        [scheme, name, port] => (*scheme, *name, Some(*port)),
        _ => return Err(Status::bad_request(format!("invalid proxy name {name:?}"))),
    };
    if !matches!(scheme, "" | "http") {
        return Err(Status::bad_request(format!(
            "the proxy speaks HTTP only, not {scheme:?}"
        )));
    }
    Ok((name, port.filter(|p| !p.is_empty())))
}

async fn object(
    state: &ApiState,
    resource: &'static Resource,
    namespace: &str,
    name: &str,
) -> Result<Value, Status> {
    let found =
        crate::registry::lookup::stored(state, &resource.key(Some(namespace), name)).await?;
    found
        .map(|o| o.value.clone())
        .ok_or_else(|| Status::not_found(Scope::cluster(resource).target(), name))
}

/// Where a pod's proxy goes: its address and the named, numbered or first
/// declared port (80 when it declares none).
async fn pod_target(state: &ApiState, namespace: &str, name: &str) -> Result<SocketAddr, Status> {
    let (name, port) = split_name(name)?;
    let pod = object(state, &kinds::pod::RESOURCE, namespace, name).await?;
    let ip: IpAddr = pod["status"]["podIP"]
        .as_str()
        .and_then(|ip| ip.parse().ok())
        .ok_or_else(|| Status::service_unavailable(format!("pod {name} has no address yet")))?;
    let declared: Vec<&Value> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .collect();
    let number = match port {
        Some(port) => match port.parse::<u16>() {
            Ok(number) => number,
            Err(_) => declared
                .iter()
                .find(|p| p["name"] == port)
                .and_then(|p| p["containerPort"].as_u64())
                .and_then(|p| u16::try_from(p).ok())
                .ok_or_else(|| Status::bad_request(format!("pod {name} has no port {port:?}")))?,
        },
        None => declared
            .first()
            .and_then(|p| p["containerPort"].as_u64())
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(80),
    };
    Ok(SocketAddr::new(ip, number))
}

/// Where a Service's proxy goes: a ready endpoint (chosen at random) of
/// the named, numbered or only port.
async fn service_target(
    state: &ApiState,
    namespace: &str,
    name: &str,
) -> Result<SocketAddr, Status> {
    let (name, port) = split_name(name)?;
    crate::registry::lookup::service_endpoint(state, namespace, name, port).await
}

/// Serves one proxied request.
pub(crate) async fn serve(
    state: &ApiState,
    (namespace, kind, name, below): (String, &'static str, String, String),
    request: Request<RequestBody>,
) -> Result<Response<Body>, Status> {
    let target = if kind == "pods" {
        pod_target(state, &namespace, &name).await?
    } else {
        service_target(state, &namespace, &name).await?
    };
    let uri = match request.uri().query() {
        Some(query) => format!("{below}?{query}"),
        None => below,
    };
    let unreachable = |e: &dyn std::fmt::Display| {
        Status::service_unavailable(format!(
            "error trying to reach {kind}/{name} at {target}: {e}"
        ))
    };
    let tcp = tokio::time::timeout(DIAL_TIMEOUT, tokio::net::TcpStream::connect(target))
        .await
        .map_err(|_| unreachable(&"timed out"))?
        .map_err(|e| unreachable(&e))?;
    let sender = upstream_connection(tcp)
        .await
        .map_err(|e| unreachable(&e))?;
    let upstream = Upstream {
        uri,
        host: target.to_string(),
        dropped: |_| false,
        added: http::HeaderMap::new(),
    };
    let Prepared { outgoing, upgrade } = prepare(request, upstream)?;
    let mut sender = sender;
    let response = sender
        .send_request(outgoing)
        .await
        .map_err(|e| unreachable(&e))?;
    relay(response, upgrade)
}

/// Where and how a request goes on: its path and query, `Host`, the
/// headers of the caller's that stay behind (beyond the hop-by-hop ones
/// and its credentials) and those added.
pub(crate) struct Upstream {
    pub(crate) uri: String,
    pub(crate) host: String,
    pub(crate) dropped: fn(&HeaderName) -> bool,
    pub(crate) added: http::HeaderMap,
}

/// A request made ready to go on: the outgoing request, and the caller's
/// side of an upgrade it asks for.
pub(crate) struct Prepared {
    pub(crate) outgoing: Request<RequestBody>,
    pub(crate) upgrade: Option<hyper::upgrade::OnUpgrade>,
}

/// The request as `upstream` says it goes on.
pub(crate) fn prepare(
    mut request: Request<RequestBody>,
    upstream: Upstream,
) -> Result<Prepared, Status> {
    let upgrading = request.headers().contains_key(header::UPGRADE);
    let upgrade = upgrading.then(|| hyper::upgrade::on(&mut request));
    let (parts, body) = request.into_parts();
    let mut builder = Request::builder().method(parts.method).uri(upstream.uri);
    for (name, value) in &parts.headers {
        let connection_header = *name == header::CONNECTION || *name == header::UPGRADE;
        if NOT_FORWARDED.contains(&name.as_str())
            || (*name == header::HOST)
            || (connection_header && !upgrading)
            || (upstream.dropped)(name)
        {
            continue;
        }
        builder = builder.header(name, value);
    }
    for (name, value) in &upstream.added {
        builder = builder.header(name, value);
    }
    let outgoing = builder
        .header(header::HOST, upstream.host)
        .body(body)
        .map_err(|e| Status::internal(e.to_string()))?;
    Ok(Prepared { outgoing, upgrade })
}

/// The backend's answer as the caller's: it streams back, and an upgrade
/// (a WebSocket, SPDY) is spliced both ways.
pub(crate) fn relay(
    mut response: Response<hyper::body::Incoming>,
    upgrade: Option<hyper::upgrade::OnUpgrade>,
) -> Result<Response<Body>, Status> {
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = upgrade else {
            return Err(Status::internal("the backend switched protocols unasked"));
        };
        let backend_upgrade = hyper::upgrade::on(&mut response);
        let mut answer = Response::new(full(Bytes::new()));
        *answer.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        *answer.headers_mut() = response.headers().clone();
        splice(client_upgrade, backend_upgrade);
        return Ok(answer);
    }
    let (parts, body) = response.into_parts();
    let mut answer = Response::new(relay_body(body));
    *answer.status_mut() = parts.status;
    for (name, value) in &parts.headers {
        if !NOT_FORWARDED.contains(&name.as_str())
            && *name != header::CONNECTION
            && *name != HeaderName::from_static("content-length")
        {
            answer.headers_mut().append(name.clone(), value.clone());
        }
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_paths_and_names() {
        assert_eq!(
            parse("/api/v1/namespaces/default/pods/web:8080/proxy/a/b"),
            Some(("default".into(), "pods", "web:8080".into(), "/a/b".into()))
        );
        assert_eq!(
            parse("/api/v1/namespaces/default/services/web/proxy"),
            Some(("default".into(), "services", "web".into(), "/".into()))
        );
        assert_eq!(parse("/api/v1/namespaces/default/pods/web/log"), None);
        assert_eq!(
            parse("/api/v1/namespaces/default/endpoints/web/proxy/"),
            None
        );
        assert_eq!(split_name("http:web:80").unwrap(), ("web", Some("80")));
        assert_eq!(split_name("web").unwrap(), ("web", None));
        assert!(split_name("https:web:443").is_err());
    }
}
