//! The HTTP side: each request is matched against the current routing
//! table and sent to one of its backend's ready endpoints, round robin,
//! over pooled keep-alive connections (HTTP/1.1 to the pods whatever the
//! client spoke). An endpoint that refuses the connection is skipped for
//! the next one when the request can be replayed (no body, or a small
//! one held in memory). Upgrades (WebSockets) are spliced through.
//! Forwarding headers are added as common proxies do; hop-by-hop headers
//! are not passed on. Each request is logged (target `access`).
//!
//! A request an HTTPRoute matches goes through its rule's filters
//! (redirects, header changes, rewrites, mirrors), a backend chosen by
//! weight, and its timeouts; otherwise the Ingress rules apply.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::RwLock;

use crate::backends::Backend;
use crate::gateway::routes::{Entry, RedirectTo, Request as RouteRequest};
use crate::metrics::{Label, Metrics, RequestLabels, RouteLabels};
use crate::routes::{Found, Table};

pub(crate) type Body = BoxBody<Bytes, hyper::Error>;

/// Request bodies up to this size are held so a refused connection can
/// be retried on another endpoint; larger ones stream (no retry).
const REPLAYABLE_BODY: u64 = 64 * 1024;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A held request body must arrive within this time.
const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// Headers that belong to one connection, not to the request.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// A client connection's address, and its IP as a header value (made
/// once per connection for the forwarding headers).
#[derive(Clone, Debug)]
pub(crate) struct Peer {
    pub(crate) addr: SocketAddr,
    ip: HeaderValue,
}

impl Peer {
    pub(crate) fn new(addr: SocketAddr) -> Self {
        let ip = HeaderValue::from_str(&addr.ip().to_string())
            .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
        Peer { addr, ip }
    }
}

/// What every serving thread shares: the routing table, the endpoints
/// ejected for failing, and the metrics.
#[derive(Debug)]
pub(crate) struct Routing {
    pub(crate) table: RwLock<Arc<Table>>,
    health: Health,
    pub(crate) metrics: Arc<Metrics>,
}

impl Routing {
    pub(crate) fn new(metrics: Arc<Metrics>) -> Self {
        Routing {
            table: RwLock::new(Arc::new(Table::default())),
            health: Health::default(),
            metrics,
        }
    }
}

/// How long an endpoint that refused a connection (or did not answer
/// it in time) is left out.
const EJECTION: Duration = Duration::from_secs(10);

/// Passive health: endpoints whose connection failed are skipped for a
/// while (tried again when every endpoint of a backend is out, or when
/// the time is up). Outlasts table rebuilds, which happen at any change.
#[derive(Debug, Default)]
struct Health {
    ejected: RwLock<HashMap<SocketAddr, Instant>>,
    /// How many are ejected: the common case (none) takes no lock.
    count: AtomicUsize,
}

impl Health {
    fn any(&self) -> bool {
        self.count.load(Ordering::Relaxed) > 0
    }

    fn is_ejected(&self, endpoint: SocketAddr) -> bool {
        self.any()
            && self
                .ejected
                .read()
                .get(&endpoint)
                .is_some_and(|until| *until > Instant::now())
    }

    /// Leaves an endpoint out; says whether it was in.
    fn eject(&self, endpoint: SocketAddr) -> bool {
        let now = Instant::now();
        let mut ejected = self.ejected.write();
        ejected.retain(|_, until| *until > now);
        let fresh = ejected.insert(endpoint, now + EJECTION).is_none();
        self.count.store(ejected.len(), Ordering::Relaxed);
        fresh
    }

    /// Takes an endpoint back (it answered).
    fn restore(&self, endpoint: SocketAddr) {
        if self.any() {
            let mut ejected = self.ejected.write();
            if ejected.remove(&endpoint).is_some() {
                self.count.store(ejected.len(), Ordering::Relaxed);
            }
        }
    }
}

/// What one serving thread's connections share: the routing, and a pool
/// of backend connections of the thread's own (a request and its backend
/// connection are served on one thread, with no wake-ups across threads).
#[derive(Debug)]
pub(crate) struct Proxy {
    routing: Arc<Routing>,
    client: Client<HttpConnector, Body>,
    metrics: Arc<Metrics>,
}

impl Proxy {
    pub(crate) fn new(routing: Arc<Routing>) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        Proxy {
            metrics: routing.metrics.clone(),
            routing,
            client,
        }
    }

    /// Answers one request from `peer` (`tls`: it came over HTTPS).
    pub(crate) async fn serve(
        self: Arc<Self>,
        request: Request<Incoming>,
        peer: Peer,
        tls: bool,
    ) -> Result<Response<Body>, hyper::Error> {
        let started = Instant::now();
        let authority = authority_of(&request);
        let bare = strip_port(&authority).trim_end_matches('.');
        // Most clients send lower case already: no copy then.
        let host: std::borrow::Cow<'_, str> = if bare.bytes().any(|b| b.is_ascii_uppercase()) {
            bare.to_ascii_lowercase().into()
        } else {
            bare.into()
        };
        // A clone of the URI shares its bytes (no copy of the path).
        let uri = request.uri().clone();
        let path = uri.path();
        let method = request.method().clone();
        let table = self.routing.table.read().clone();
        let found = if method == Method::CONNECT {
            None
        } else {
            let view = RouteRequest::new(&method, path, request.uri().query(), request.headers());
            Some(match table.find_route(tls, &host, &view) {
                Some(entry) => Found::Gateway(entry),
                None => table.find(&host, path),
            })
        };
        let (ingress, backend, response) = match found {
            None => (
                none(),
                none(),
                plain(StatusCode::METHOD_NOT_ALLOWED, "CONNECT is not proxied"),
            ),
            Some(Found::Nothing) => (
                none(),
                none(),
                plain(StatusCode::NOT_FOUND, "default backend - 404"),
            ),
            Some(Found::Route(route)) => {
                let response = self
                    .forward(request, &route.backend, &peer, tls, &authority, &[], None)
                    .await;
                (route.ingress.clone(), route.backend.name.clone(), response)
            }
            Some(Found::Gateway(entry)) => {
                let (backend, response) = self
                    .follow_route(
                        request,
                        entry,
                        &peer,
                        tls,
                        &authority,
                        &host,
                        table.port(tls),
                    )
                    .await;
                (entry.action.route.clone(), backend, response)
            }
        };
        let code = response.status().as_u16();
        let elapsed = started.elapsed();
        self.metrics
            .requests
            .get_or_create(&RequestLabels {
                ingress: ingress.clone(),
                backend: backend.clone(),
                code,
            })
            .inc();
        self.metrics
            .latency
            .get_or_create(&RouteLabels {
                ingress: ingress.clone(),
            })
            .observe(elapsed.as_secs_f64());
        let host = &*host;
        // The access log: `RUST_LOG=portal_ingress::access=debug`.
        tracing::debug!(
            target: "portal_ingress::access",
            client = %peer.addr, %method, %host, %path, code, %ingress, %backend,
            ms = elapsed.as_secs_f64() * 1000.0,
        );
        Ok(response)
    }

    /// Applies an HTTPRoute rule: says which backend answered.
    #[allow(clippy::too_many_arguments)]
    async fn follow_route(
        &self,
        mut request: Request<Incoming>,
        entry: &Entry,
        peer: &Peer,
        tls: bool,
        authority: &str,
        host: &str,
        listener_port: Option<u16>,
    ) -> (Label, Response<Body>) {
        let action = &entry.action;
        if action.unsupported {
            let text = "the route's rule uses a filter Portal does not implement";
            return (none(), plain(StatusCode::INTERNAL_SERVER_ERROR, text));
        }
        if let Some(redirect) = &action.redirect {
            return (
                none(),
                redirect_to(
                    redirect,
                    &request,
                    entry,
                    tls,
                    authority,
                    host,
                    listener_port,
                ),
            );
        }
        if let Some(edit) = &action.request_headers {
            edit.apply(request.headers_mut());
        }
        let mut authority = authority.to_owned();
        if let Some(rewrite) = &action.rewrite {
            if let Some(hostname) = &rewrite.hostname {
                if let Ok(value) = HeaderValue::from_str(hostname) {
                    request.headers_mut().insert(header::HOST, value);
                    authority = hostname.clone();
                }
            }
            if let Some(change) = &rewrite.path {
                let path = change.apply(request.uri().path(), entry.prefix());
                let target = match request.uri().query() {
                    Some(query) => format!("{path}?{query}"),
                    None => path,
                };
                match target.parse::<Uri>() {
                    Ok(uri) => *request.uri_mut() = uri,
                    Err(_) => {
                        return (none(), plain(StatusCode::BAD_REQUEST, "bad rewritten path"))
                    }
                }
            }
        }
        let Some(choice) = action.pick() else {
            return (
                none(),
                plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the route's rule has no backend",
                ),
            );
        };
        let Some(backend) = &choice.backend else {
            return (
                none(),
                plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the route's backend reference does not resolve",
                ),
            );
        };
        if let Some(edit) = &choice.request_headers {
            edit.apply(request.headers_mut());
        }
        let forwarded = self.forward(
            request,
            backend,
            peer,
            tls,
            &authority,
            &action.mirrors,
            action.backend_timeout,
        );
        let mut response = match action.timeout {
            Some(limit) => tokio::time::timeout(limit, forwarded)
                .await
                .unwrap_or_else(|_| plain(StatusCode::GATEWAY_TIMEOUT, "request timed out")),
            None => forwarded.await,
        };
        for edit in [&choice.response_headers, &action.response_headers]
            .into_iter()
            .flatten()
        {
            edit.apply(response.headers_mut());
        }
        (backend.name.clone(), response)
    }

    #[allow(clippy::too_many_arguments)]
    async fn forward(
        &self,
        mut request: Request<Incoming>,
        backend: &Backend,
        peer: &Peer,
        tls: bool,
        host: &str,
        mirrors: &[Arc<Backend>],
        attempt_timeout: Option<Duration>,
    ) -> Response<Body> {
        if backend.endpoints.is_empty() {
            return plain(StatusCode::SERVICE_UNAVAILABLE, "no ready endpoints");
        }
        let upgrade = wants_upgrade(request.headers());
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut request));
        let (mut parts, body) = request.into_parts();
        let size = body_size(&parts.method, &parts.headers);
        let mut headers =
            forwarded_headers(std::mem::take(&mut parts.headers), peer, tls, host, upgrade);
        let (replayable, mut streamed) = match size {
            Some(size) if size <= REPLAYABLE_BODY => {
                let collected = tokio::time::timeout(
                    BODY_TIMEOUT,
                    Limited::new(body, REPLAYABLE_BODY as usize).collect(),
                );
                match collected.await {
                    Ok(Ok(collected)) => (Some(collected.to_bytes()), None),
                    Ok(Err(_)) => return plain(StatusCode::BAD_REQUEST, "request body unreadable"),
                    Err(_) => return plain(StatusCode::REQUEST_TIMEOUT, "request body too slow"),
                }
            }
            _ => (None, Some(body.boxed())),
        };
        let path = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        if let Some(body) = &replayable {
            for mirror in mirrors {
                self.mirror(mirror, &parts.method, &path, &headers, body.clone());
            }
        }
        let mut last_error = None;
        let attempts = backend.endpoints.len();
        let health = &self.routing.health;
        // When every endpoint is out, all are tried (better than none).
        // (Nothing ejected, the common case: no look at each endpoint.)
        let skip_ejected = health.any() && backend.endpoints.iter().any(|e| !health.is_ejected(*e));
        for (attempt, (endpoint, authority)) in backend.rotation().enumerate() {
            if skip_ejected && health.is_ejected(endpoint) {
                continue;
            }
            let body = match (&replayable, streamed.take()) {
                (Some(bytes), _) => Full::new(bytes.clone())
                    .map_err(|never| match never {})
                    .boxed(),
                (None, Some(body)) => body,
                // A streamed body went to an endpoint already.
                (None, None) => break,
            };
            let Some(uri) = backend_uri(authority, &path) else {
                return plain(StatusCode::BAD_REQUEST, "bad request path");
            };
            let mut outgoing = Request::new(body);
            *outgoing.method_mut() = parts.method.clone();
            *outgoing.uri_mut() = uri;
            *outgoing.version_mut() = Version::HTTP_11;
            // The last attempt (or the only one) takes the headers.
            *outgoing.headers_mut() = if attempt + 1 >= attempts || replayable.is_none() {
                std::mem::take(&mut headers)
            } else {
                headers.clone()
            };
            let sent = match attempt_timeout {
                Some(limit) => {
                    match tokio::time::timeout(limit, self.client.request(outgoing)).await {
                        Ok(sent) => sent,
                        Err(_) => {
                            return plain(StatusCode::GATEWAY_TIMEOUT, "backend request timed out")
                        }
                    }
                }
                None => self.client.request(outgoing).await,
            };
            match sent {
                Ok(mut response) => {
                    health.restore(endpoint);
                    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                        if let Some(client_side) = client_upgrade {
                            let backend_side = hyper::upgrade::on(&mut response);
                            tokio::spawn(splice(client_side, backend_side));
                            let (parts, _) = response.into_parts();
                            return Response::from_parts(parts, empty());
                        }
                    }
                    let (mut parts, body) = response.into_parts();
                    strip_hop_by_hop(&mut parts.headers);
                    return Response::from_parts(parts, body.boxed());
                }
                Err(error) if error.is_connect() => {
                    tracing::debug!(%endpoint, %error, "endpoint refused; trying the next");
                    self.metrics.retries.inc();
                    if health.eject(endpoint) {
                        self.metrics.ejections.inc();
                    }
                    last_error = Some(error);
                }
                // A kept connection the endpoint closed as the request went
                // out: an idempotent request it never answered goes again.
                Err(error)
                    if replayable.is_some()
                        && idempotent(&parts.method)
                        && closed_early(&error) =>
                {
                    tracing::debug!(%endpoint, %error, "kept connection closed; trying the next");
                    self.metrics.retries.inc();
                    last_error = Some(error);
                }
                Err(error) => {
                    tracing::warn!(%endpoint, %error, "upstream request failed");
                    return plain(StatusCode::BAD_GATEWAY, "upstream request failed");
                }
            }
        }
        if let Some(error) = last_error {
            tracing::warn!(backend = %backend.name, %error, "no endpoint accepted the connection");
        }
        plain(
            StatusCode::BAD_GATEWAY,
            "no endpoint accepted the connection",
        )
    }
}

impl Proxy {
    /// Sends a copy of a request to a mirror backend's next endpoint; its
    /// answer is dropped (a mirror never slows or fails the request).
    fn mirror(
        &self,
        backend: &Backend,
        method: &Method,
        path: &PathAndQuery,
        headers: &HeaderMap,
        body: Bytes,
    ) {
        let Some(uri) = backend
            .rotation()
            .next()
            .and_then(|(_, authority)| backend_uri(authority, path))
        else {
            return;
        };
        let mut copy = Request::new(Full::new(body).map_err(|never| match never {}).boxed());
        *copy.method_mut() = method.clone();
        *copy.uri_mut() = uri;
        *copy.headers_mut() = headers.clone();
        // A slow mirror cannot pile up copies: beyond the bound they go.
        let Ok(permit) = mirrors_in_flight().clone().try_acquire_owned() else {
            self.metrics.mirrors_dropped.inc();
            return;
        };
        let sent = self.client.request(copy);
        tokio::spawn(async move {
            let _permit = permit;
            if let Ok(Ok(response)) = tokio::time::timeout(MIRROR_TIMEOUT, sent).await {
                let _ = tokio::time::timeout(MIRROR_TIMEOUT, response.into_body().collect()).await;
            }
        });
    }
}

/// Mirrored requests in flight at once, in the whole process.
fn mirrors_in_flight() -> &'static Arc<tokio::sync::Semaphore> {
    static IN_FLIGHT: std::sync::OnceLock<Arc<tokio::sync::Semaphore>> = std::sync::OnceLock::new();
    IN_FLIGHT.get_or_init(|| Arc::new(tokio::sync::Semaphore::new(MIRRORS_IN_FLIGHT)))
}

const MIRRORS_IN_FLIGHT: usize = 1024;

/// A mirrored request's answer is waited for this long at most.
const MIRROR_TIMEOUT: Duration = Duration::from_secs(30);

/// The answer of a `RequestRedirect` filter: the request's scheme, host,
/// port and path unless the filter changes them; a port is left out of
/// `Location` when it is the scheme's own.
fn redirect_to(
    redirect: &RedirectTo,
    request: &Request<Incoming>,
    entry: &Entry,
    tls: bool,
    authority: &str,
    host: &str,
    listener_port: Option<u16>,
) -> Response<Body> {
    let scheme = redirect
        .scheme
        .clone()
        .unwrap_or_else(|| if tls { "https" } else { "http" }.to_owned());
    let well_known = |scheme: &str| match scheme {
        "https" => Some(443),
        "http" => Some(80),
        _ => None,
    };
    let asked_port = authority
        .rsplit_once(':')
        .filter(|_| !authority.ends_with(']'))
        .and_then(|(_, p)| p.parse::<u16>().ok());
    let port = match (redirect.port, &redirect.scheme) {
        (Some(port), _) => Some(port),
        (None, Some(scheme)) => well_known(scheme).or(asked_port),
        // The listener's port, as the specification says.
        (None, None) => listener_port.or(asked_port).or(well_known(&scheme)),
    };
    let hostname = redirect.hostname.clone().unwrap_or_else(|| host.to_owned());
    let hostname = if hostname.contains(':') {
        format!("[{hostname}]")
    } else {
        hostname
    };
    let path = match &redirect.path {
        Some(change) => change.apply(request.uri().path(), entry.prefix()),
        None => request.uri().path().to_owned(),
    };
    let mut location = format!("{scheme}://{hostname}");
    if let Some(port) = port.filter(|p| Some(*p) != well_known(&scheme)) {
        location.push_str(&format!(":{port}"));
    }
    location.push_str(&path);
    if let Some(query) = request.uri().query() {
        location.push('?');
        location.push_str(query);
    }
    let code = StatusCode::from_u16(redirect.code).unwrap_or(StatusCode::FOUND);
    let mut response = Response::new(empty());
    *response.status_mut() = code;
    if let Ok(value) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
}

/// `http://<endpoint><path>`, from parts made before (no copies).
fn backend_uri(authority: &Authority, path: &PathAndQuery) -> Option<Uri> {
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(http::uri::Scheme::HTTP);
    parts.authority = Some(authority.clone());
    parts.path_and_query = Some(path.clone());
    Uri::from_parts(parts).ok()
}

/// The label of a request no route took.
fn none() -> Label {
    static NONE: std::sync::LazyLock<Label> = std::sync::LazyLock::new(Label::default);
    NONE.clone()
}

/// Copies both ways between an upgraded client and backend connection.
async fn splice(client: hyper::upgrade::OnUpgrade, backend: hyper::upgrade::OnUpgrade) {
    let (Ok(client), Ok(backend)) = (client.await, backend.await) else {
        return;
    };
    let (mut client, mut backend) = (TokioIo::new(client), TokioIo::new(backend));
    let _ = tokio::io::copy_bidirectional(&mut client, &mut backend).await;
}

/// The request's authority as the client sent it: an absolute-form
/// target's, else `Host`, else the HTTP/2 `:authority`.
fn authority_of(request: &Request<Incoming>) -> String {
    let from_uri = || request.uri().authority().map(|a| a.as_str().to_owned());
    let absolute = request.uri().scheme().is_some();
    let host = || {
        request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned)
    };
    (if absolute {
        from_uri().or_else(host)
    } else {
        host().or_else(from_uri)
    })
    .unwrap_or_default()
}

fn idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE
    )
}

/// Whether a request failed because its kept connection closed before
/// any answer (the request may be sent again).
fn closed_early(error: &hyper_util::client::legacy::Error) -> bool {
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(hyper) = cause.downcast_ref::<hyper::Error>() {
            return hyper.is_incomplete_message() || hyper.is_canceled();
        }
        source = cause.source();
    }
    false
}

fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
}

/// The size of a request's body when it is known to be small enough to
/// hold: none (a method without a body and no length) or its length.
fn body_size(method: &Method, headers: &HeaderMap) -> Option<u64> {
    match headers.get(header::CONTENT_LENGTH) {
        Some(length) => length.to_str().ok()?.parse().ok(),
        None if headers.contains_key(header::TRANSFER_ENCODING) => None,
        None if matches!(
            *method,
            Method::GET | Method::HEAD | Method::DELETE | Method::OPTIONS
        ) =>
        {
            Some(0)
        }
        None => None,
    }
}

/// The headers sent on: the client's without hop-by-hop ones (an upgrade
/// keeps `Connection: upgrade` and `Upgrade`), with `Host` and the
/// `X-Forwarded-*` headers; changed in place.
fn forwarded_headers(
    mut headers: HeaderMap,
    peer: &Peer,
    tls: bool,
    host: &str,
    upgrade: bool,
) -> HeaderMap {
    let protocol = upgrade
        .then(|| headers.get(header::UPGRADE).cloned())
        .flatten();
    // HTTP/2 sends each cookie as a field of its own; HTTP/1.1 wants one
    // `Cookie` header, joined with "; " (RFC 9113 section 8.2.3).
    if headers.get_all(header::COOKIE).iter().nth(1).is_some() {
        let joined: Vec<&str> = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        if let Ok(value) = HeaderValue::from_str(&joined.join("; ")) {
            headers.insert(header::COOKIE, value);
        }
    }
    strip_hop_by_hop(&mut headers);
    if let Some(protocol) = protocol {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, protocol);
    }
    if !headers.contains_key(header::HOST) {
        if let Ok(value) = HeaderValue::from_str(host) {
            headers.insert(header::HOST, value);
        }
    }
    let forwarded_for = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(earlier) => HeaderValue::from_str(&format!("{earlier}, {}", peer.addr.ip())).ok(),
        None => Some(peer.ip.clone()),
    };
    if let Some(value) = forwarded_for {
        headers.insert(HeaderName::from_static("x-forwarded-for"), value);
    }
    headers.insert(HeaderName::from_static("x-real-ip"), peer.ip.clone());
    if let Ok(value) = HeaderValue::from_str(host) {
        headers.insert(HeaderName::from_static("x-forwarded-host"), value);
    }
    let proto = HeaderValue::from_static(if tls { "https" } else { "http" });
    headers.insert(HeaderName::from_static("x-forwarded-proto"), proto);
    headers
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Headers `Connection` names are hop-by-hop too.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in HOP_BY_HOP.iter().chain(&named) {
        headers.remove(name);
    }
    headers.remove(header::UPGRADE);
}

fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed()
}

fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from_static(text.as_bytes()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_lose_their_port() {
        assert_eq!(strip_port("a.test:8080"), "a.test");
        assert_eq!(strip_port("a.test"), "a.test");
        assert_eq!(strip_port("[fd00::1]:80"), "fd00::1");
    }

    #[test]
    fn forwarding_headers() {
        let mut incoming = HeaderMap::new();
        incoming.insert(header::HOST, HeaderValue::from_static("a.test"));
        incoming.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        incoming.insert("x-secret", HeaderValue::from_static("1"));
        incoming.insert("x-forwarded-for", HeaderValue::from_static("192.0.2.1"));
        let peer = &Peer::new("10.0.0.5:4000".parse().unwrap());
        let sent = forwarded_headers(incoming.clone(), peer, true, "a.test", false);
        assert!(sent.get(header::CONNECTION).is_none() && sent.get("x-secret").is_none());
        assert_eq!(sent["x-forwarded-for"], "192.0.2.1, 10.0.0.5");
        assert_eq!(sent["x-forwarded-proto"], "https");
        assert_eq!(sent[header::HOST], "a.test");
        let mut ws = HeaderMap::new();
        ws.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        ws.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(wants_upgrade(&ws));
        let mut cookies = HeaderMap::new();
        cookies.append(header::COOKIE, HeaderValue::from_static("a=1"));
        cookies.append(header::COOKIE, HeaderValue::from_static("b=2"));
        let sent = forwarded_headers(cookies.clone(), peer, false, "a.test:8080", false);
        assert_eq!(
            sent.get_all(header::COOKIE).iter().collect::<Vec<_>>(),
            ["a=1; b=2"]
        );
        assert_eq!(sent[header::HOST], "a.test:8080");
        let sent = forwarded_headers(ws.clone(), peer, false, "a.test", true);
        assert_eq!(sent[header::UPGRADE], "websocket");
        assert_eq!(sent[header::HOST], "a.test");
    }

    #[test]
    fn failed_endpoints_are_left_out_until_they_answer() {
        let health = Health::default();
        let (a, b): (SocketAddr, SocketAddr) = (
            "10.0.0.1:80".parse().unwrap(),
            "10.0.0.2:80".parse().unwrap(),
        );
        assert!(!health.is_ejected(a));
        assert!(health.eject(a));
        assert!(!health.eject(a), "once");
        assert!(health.is_ejected(a) && !health.is_ejected(b));
        health.restore(a);
        assert!(!health.is_ejected(a));
        assert_eq!(health.count.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn which_bodies_are_held_for_a_retry() {
        let mut headers = HeaderMap::new();
        assert_eq!(body_size(&Method::GET, &headers), Some(0));
        assert_eq!(body_size(&Method::POST, &headers), None);
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("12"));
        assert_eq!(body_size(&Method::POST, &headers), Some(12));
    }
}
