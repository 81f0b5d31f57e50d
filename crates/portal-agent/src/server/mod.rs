//! The agent's own API on the kubelet port (`daemonEndpoints`): what the
//! API server calls for `kubectl logs`, `exec`, `attach` and
//! `port-forward`.
//!
//! - `GET /containerLogs/NS/POD/CTR`: the container's log ([`logs`]);
//! - `GET|POST /exec/NS/POD/CTR?command=..`, `/attach/NS/POD/CTR`,
//!   `/portForward/NS/POD`: HTTP upgrades to the streaming protocols of
//!   `portal-streams` (WebSocket or SPDY/3.1), then [`session`];
//! - `GET|PUT /manifests`: pushed static pods, when on ([`manifests`]).
//!
//! Exec is remote code execution, so there is no anonymous access: TLS
//! with a client certificate signed by the CA the agent is given
//! (`--client-ca-file`), which only the API server's own certificate is.

pub mod logs;
pub mod manifests;
mod session;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use portal_streams::{websocket, Version, Wanted};
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};

use crate::pods::Context;
use crate::runtime::{ContainerStatus, Runtime, State};

type Body = BoxBody<Bytes, std::convert::Infallible>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}: no CA certificate in it")]
    NoCa(String),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// The server's TLS: a certificate of its own (made at start; the API
/// server does not verify agents, as kube-apiserver without
/// `--kubelet-certificate-authority`), and client certificates required.
pub fn tls_config(
    client_ca: &Path,
    node_ip: std::net::IpAddr,
) -> Result<Arc<rustls::ServerConfig>, Error> {
    let pem = std::fs::read(client_ca).map_err(|source| Error::Read {
        path: client_ca.display().to_string(),
        source,
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem).flatten() {
        roots
            .add(cert)
            .map_err(|e| Error::Tls(format!("client CA: {e}")))?;
    }
    if roots.is_empty() {
        return Err(Error::NoCa(client_ca.display().to_string()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .map_err(|e| Error::Tls(e.to_string()))?;
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .map_err(|e| Error::Tls(e.to_string()))?;
    params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress(node_ip));
    let key = rcgen::KeyPair::generate().map_err(|e| Error::Tls(e.to_string()))?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| Error::Tls(e.to_string()))?;
    let private = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes())
        .map_err(|e| Error::Tls(e.to_string()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![cert.der().clone()], private)
        .map_err(|e| Error::Tls(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serves on `addr` until the process ends.
pub(crate) async fn serve<R: Runtime>(
    ctx: Arc<Context<R>>,
    addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    manifests: Option<manifests::Endpoint>,
    usage: Arc<crate::stats::Stats>,
) -> Result<(), Error> {
    let manifests = manifests.map(Arc::new);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    tracing::info!(%addr, "agent API listening");
    tokio::spawn(async move {
        loop {
            let Ok((tcp, peer)) = listener.accept().await else {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, ctx, manifests, usage) = (
                acceptor.clone(),
                ctx.clone(),
                manifests.clone(),
                usage.clone(),
            );
            tokio::spawn(async move {
                let handshake =
                    tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(tcp));
                let tls = match handshake.await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(error)) => {
                        tracing::debug!(%peer, %error, "agent API: TLS refused");
                        return;
                    }
                    Err(_) => return,
                };
                let service = hyper::service::service_fn(move |request| {
                    let (ctx, manifests, usage) = (ctx.clone(), manifests.clone(), usage.clone());
                    async move {
                        let response = route(&ctx, manifests.as_deref(), &usage, request).await;
                        Ok::<_, std::convert::Infallible>(response)
                    }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .with_upgrades();
                if let Err(error) = connection.await {
                    tracing::debug!(%peer, %error, "agent API connection");
                }
            });
        }
    });
    Ok(())
}

fn text(code: StatusCode, message: impl Into<String>) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(message.into())).boxed());
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn query_pairs(request: &Request<Incoming>) -> Vec<(String, String)> {
    form_urlencoded::parse(request.uri().query().unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

async fn route<R: Runtime>(
    ctx: &Arc<Context<R>>,
    manifests: Option<&manifests::Endpoint>,
    usage: &crate::stats::Stats,
    request: Request<Incoming>,
) -> Response<Body> {
    let path = request.uri().path().to_owned();
    let parts: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .map(|p| {
            percent_encoding::percent_decode_str(p)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect();
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    let upgrade_method = matches!(*request.method(), Method::GET | Method::POST);
    match parts.as_slice() {
        ["healthz"] => text(StatusCode::OK, "ok"),
        ["stats", "summary"] if request.method() == Method::GET => {
            let mut response = text(StatusCode::OK, usage.summary().to_string());
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
        ["metrics", "resource"] if request.method() == Method::GET => {
            let mut response = text(StatusCode::OK, usage.resource_metrics());
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            response
        }
        ["manifests"] => match (manifests, request.method().clone()) {
            (Some(endpoint), Method::GET) => endpoint.get().await,
            (Some(endpoint), Method::PUT) => endpoint.put(request.into_body()).await,
            (Some(_), _) => text(StatusCode::METHOD_NOT_ALLOWED, "GET or PUT"),
            (None, _) => text(StatusCode::NOT_FOUND, "the manifest endpoint is off"),
        },
        ["containerLogs", ns, pod, container] if request.method() == Method::GET => {
            container_logs(ctx, ns, pod, container, &query_pairs(&request)).await
        }
        ["exec", ns, pod, container] | ["exec", ns, pod, _, container] if upgrade_method => {
            let target = (ns.to_string(), pod.to_string(), container.to_string());
            streaming(ctx, request, Kind::Exec, target).await
        }
        ["attach", ns, pod, container] | ["attach", ns, pod, _, container] if upgrade_method => {
            let target = (ns.to_string(), pod.to_string(), container.to_string());
            streaming(ctx, request, Kind::Attach, target).await
        }
        ["portForward", ns, pod] | ["portForward", ns, pod, _] if upgrade_method => {
            let target = (ns.to_string(), pod.to_string(), String::new());
            streaming(ctx, request, Kind::PortForward, target).await
        }
        _ => text(StatusCode::NOT_FOUND, "not found"),
    }
}

/// The pod this node runs by that name.
fn find_pod<R: Runtime>(ctx: &Context<R>, namespace: &str, name: &str) -> Option<Arc<Pod>> {
    ctx.desired.find(namespace, name)
}

/// The pod's instances of a container, newest first.
fn instances<R: Runtime>(ctx: &Context<R>, pod: &Pod, container: &str) -> Vec<ContainerStatus> {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let mut list: Vec<ContainerStatus> = ctx
        .runtime
        .containers()
        .into_iter()
        .filter(|c| c.meta.pod_uid == uid && c.meta.name == container)
        .collect();
    list.sort_by_key(|c| std::cmp::Reverse(c.meta.attempt));
    list
}

fn in_spec(pod: &Pod, container: &str) -> bool {
    crate::pods::containers_of(pod).any(|c| c.name == container)
}

/// Why a container has no log yet, in the kubelet's words.
fn waiting_reason(pod: &Pod, container: &str) -> String {
    let status = pod.status.as_ref().and_then(|s| {
        s.container_statuses
            .iter()
            .flatten()
            .chain(s.init_container_statuses.iter().flatten())
            .find(|c| c.name == container)
    });
    let reason = status
        .and_then(|s| s.state.as_ref())
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.reason.clone());
    match reason {
        Some(reason) => format!(
            "container {container:?} in pod {:?} is waiting to start: {reason}",
            pod.name_any()
        ),
        None => format!(
            "container {container:?} in pod {:?} is waiting to start - no logs yet",
            pod.name_any()
        ),
    }
}

async fn container_logs<R: Runtime>(
    ctx: &Arc<Context<R>>,
    namespace: &str,
    name: &str,
    container: &str,
    query: &[(String, String)],
) -> Response<Body> {
    let options = match logs::LogOptions::parse(query) {
        Ok(options) => options,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    let Some(pod) = find_pod(ctx, namespace, name) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {name:?} does not exist"),
        );
    };
    if !in_spec(&pod, container) {
        return text(
            StatusCode::NOT_FOUND,
            format!("container {container:?} not found in pod {name:?}"),
        );
    }
    let list = instances(ctx, &pod, container);
    let chosen = if options.previous {
        match list.get(1) {
            Some(previous) => previous.clone(),
            None => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "previous terminated container {container:?} in pod {name:?} not found"
                    ),
                )
            }
        }
    } else {
        match list.first() {
            Some(current) if !matches!(current.state, State::Created) => current.clone(),
            _ => return text(StatusCode::BAD_REQUEST, waiting_reason(&pod, container)),
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(8);
    let id = chosen.id.clone();
    let runtime_ctx = ctx.clone();
    let running = move || {
        matches!(
            runtime_ctx.runtime.container(&id).map(|c| c.state),
            Some(State::Running(_) | State::Created)
        )
    };
    // Only the current instance is followed.
    let follow = options.follow && !options.previous;
    let options = logs::LogOptions { follow, ..options };
    tokio::spawn(logs::stream(chosen.meta.log_path, options, running, tx));
    let body = StreamBody::new(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, std::convert::Infallible>(Frame::data(chunk)), rx))
    }));
    let mut response = Response::new(body.boxed());
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Exec,
    Attach,
    PortForward,
}

fn header_values<'a>(request: &'a Request<Incoming>, name: &str) -> Vec<&'a str> {
    request
        .headers()
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect()
}

/// An exec, attach or port-forward: checks what it addresses, answers the
/// upgrade in the protocol the client asked for, and runs the session on
/// the upgraded connection.
async fn streaming<R: Runtime>(
    ctx: &Arc<Context<R>>,
    mut request: Request<Incoming>,
    kind: Kind,
    (namespace, name, container): (String, String, String),
) -> Response<Body> {
    let query = query_pairs(&request);
    let Some(pod) = find_pod(ctx, &namespace, &name) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {name:?} does not exist"),
        );
    };
    let mut wanted = Wanted::from_query(&query);
    let target = match kind {
        Kind::PortForward => session::Target::Pod,
        Kind::Exec | Kind::Attach => {
            let running = instances(ctx, &pod, &container)
                .into_iter()
                .next()
                .filter(|c| matches!(c.state, State::Running(_)));
            let Some(running) = running else {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("container {container:?} in pod {name:?} is not running"),
                );
            };
            if !wanted.any() {
                return text(
                    StatusCode::BAD_REQUEST,
                    "you must specify at least 1 of stdin, stdout, stderr",
                );
            }
            if kind == Kind::Attach {
                // The container's own terminal decides, as with the kubelet.
                let tty = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.containers.iter().find(|c| c.name == container))
                    .and_then(|c| c.tty)
                    == Some(true);
                wanted.tty = tty;
                wanted.stderr = wanted.stderr && !tty;
                session::Target::Attach(running.id)
            } else {
                let command: Vec<String> = query
                    .iter()
                    .filter(|(k, _)| k == "command")
                    .map(|(_, v)| v.clone())
                    .collect();
                if command.is_empty() {
                    return text(StatusCode::BAD_REQUEST, "no command given");
                }
                session::Target::Exec(running.id, command)
            }
        }
    };
    let ports: Vec<u16> = query
        .iter()
        .filter(|(k, _)| k == "port" || k == "ports")
        .flat_map(|(_, v)| {
            v.split(',')
                .map(str::trim)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter_map(|p| p.parse().ok())
        .collect();
    let upgrade = request
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let on_upgrade = hyper::upgrade::on(&mut request);
    let mut response = Response::new(Full::new(Bytes::new()).boxed());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    let protocol = if upgrade == "websocket" {
        let Some(key) = request.headers().get(header::SEC_WEBSOCKET_KEY) else {
            return text(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key");
        };
        let offered = header_values(&request, "sec-websocket-protocol");
        let Some(choice) = websocket::choose(offered, kind == Kind::PortForward) else {
            return text(
                StatusCode::FORBIDDEN,
                "unable to upgrade: no supported WebSocket subprotocol",
            );
        };
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        if let Ok(accept) = HeaderValue::from_str(&websocket::accept_key(key.as_bytes())) {
            headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
        }
        headers.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static(choice.name()),
        );
        session::Protocol::WebSocket(choice)
    } else if upgrade.contains("spdy/3.1") {
        let offered = header_values(&request, "x-stream-protocol-version");
        let chosen = if kind == Kind::PortForward {
            offered
                .iter()
                .flat_map(|h| h.split(','))
                .any(|p| p.trim() == portal_streams::spdy::PORT_FORWARD_PROTOCOL)
                .then_some((portal_streams::spdy::PORT_FORWARD_PROTOCOL, Version::V4))
        } else {
            portal_streams::spdy::choose_exec(offered)
        };
        let Some((name, version)) = chosen else {
            return text(
                StatusCode::FORBIDDEN,
                "unable to upgrade: unable to negotiate protocol",
            );
        };
        headers.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
        headers.insert("x-stream-protocol-version", HeaderValue::from_static(name));
        session::Protocol::Spdy(version)
    } else {
        return text(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: missing upgrade headers in request",
        );
    };
    let ctx = ctx.clone();
    let described = format!("{namespace}/{name}");
    let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(upgraded) => TokioIo::new(upgraded),
            Err(error) => {
                tracing::debug!(%error, pod = %described, "upgrade failed");
                return;
            }
        };
        let session = session::Session {
            protocol,
            wanted,
            target,
            ports,
            pod: described,
            pod_uid,
        };
        session.run(&ctx, upgraded).await;
    });
    response
}
