//! Portal's built-in layer-7 proxy: the Ingress controller of the
//! `portal` IngressClass (controller `portal.dev/ingress`). It follows
//! Ingresses, their Services' EndpointSlices and TLS Secrets into a
//! routing table ([`routes`]), and serves HTTP/1.1 and HTTP/2 (h2c, and
//! over TLS by ALPN) on its listeners, sending each request to a ready
//! endpoint directly ([`proxy`]) and terminating TLS by SNI ([`tls`]).
//! Each Ingress it serves shows the proxy's addresses in its status.
//! It is the Gateway API's controller too ([`gateway`]): Gateways of its
//! class are served on the same sockets, their HTTPRoutes first.

mod backends;
mod feed;
pub mod gateway;
mod metrics;
mod proxy;
pub mod publish;
mod routes;
mod tls;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::api::PostParams;
use kube::runtime::watcher;
use kube::{Api, Client};
use portal_client::labels::DEFAULT_INGRESS_CLASS;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub use metrics::Metrics;

/// The controller name of Portal's IngressClass.
pub const CONTROLLER: &str = "portal.dev/ingress";
/// Portal's IngressClass, made at start (the default class).
pub const CLASS: &str = "portal";

/// At most this many client connections at once; more wait to be
/// accepted (a flood of idle connections cannot exhaust descriptors).
const MAX_CONNECTIONS: usize = 16_384;
/// A client has this long to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// ... and to send a request's headers once it started one; an HTTP/2
/// connection is pinged as often and closed if the ping goes unanswered.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("TLS: {0}")]
    Tls(String),
    #[error("cannot start serving on {addr}: {source}")]
    Serve {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Where the proxy listens and what it says its address is.
#[derive(Clone, Debug)]
pub struct Config {
    /// Plain HTTP (and h2c); none: no plain listener.
    pub http: Option<SocketAddr>,
    /// HTTPS; none: no TLS listener.
    pub https: Option<SocketAddr>,
    /// The addresses written in the status of the Ingresses served (the
    /// node's) until the published Service has a load-balancer address;
    /// none are written when empty.
    pub advertised: Vec<IpAddr>,
    /// The node the proxy runs on, to publish its sockets as the endpoint
    /// of the `kube-system/portal-ingress` Service (ADR 0040); none: not
    /// published.
    pub node_name: Option<String>,
}

/// A running proxy.
#[derive(Debug)]
pub struct IngressProxy {
    pub metrics: Arc<Metrics>,
    pub tasks: portal_client::Supervisor,
    /// Where it listens (the ports chosen when the config said 0).
    pub http: Option<SocketAddr>,
    pub https: Option<SocketAddr>,
}

/// Binds the listeners, makes the `portal` IngressClass if there is none,
/// and starts following the cluster. With `gateway_admin` (a client
/// allowed to create CustomResourceDefinitions) it installs the Gateway
/// API when missing and serves it too.
pub async fn start(
    client: Client,
    config: Config,
    gateway_admin: Option<Client>,
) -> Result<IngressProxy, Error> {
    let http = bind(config.http).await?;
    let https = bind(config.https).await?;
    let metrics = Arc::new(Metrics::new());
    let routing = Arc::new(proxy::Routing::new(metrics.clone()));
    let certificates = Arc::new(tls::Certificates::new().map_err(Error::Tls)?);
    let feed = feed::Feed::new();
    let tasks = portal_client::Supervisor::new();

    let class_client = client.clone();
    tasks.once(
        "ingress class",
        async move { ensure_class(class_client).await },
    );
    let any = watcher::Config::default();
    let tls_only = watcher::Config::default().fields("type=kubernetes.io/tls");
    macro_rules! follow {
        ($kind:ty, $name:literal, $config:expr, $map:path) => {{
            let (feed, client, config) = (feed.clone(), client.clone(), $config.clone());
            tasks.restarting($name, move || {
                feed::follow(
                    feed.clone(),
                    Api::<$kind>::all(client.clone()),
                    config.clone(),
                    $name,
                    $map,
                )
            });
        }};
    }
    follow!(Ingress, "ingresses", any, feed::ingresses);
    follow!(IngressClass, "ingress classes", any, feed::classes);
    follow!(Service, "services", any, feed::services);
    follow!(EndpointSlice, "endpoint slices", any, feed::slices);
    follow!(Secret, "tls secrets", tls_only, feed::secrets);
    if let Some(admin) = gateway_admin {
        let (feed, client, supervisor) = (feed.clone(), client.clone(), tasks.clone());
        tasks.once("gateway api", async move {
            // Until the definitions are served (a restart of the API
            // server, a user's definitions not yet established).
            while !gateway::install::definitions(admin.clone()).await {
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
            follow_gateway_api(&supervisor, &feed, &client);
            gateway::install::class(client).await;
        });
    }
    let (status, statuses) = tokio::sync::watch::channel((Vec::new(), Vec::new()));
    let (gateway_status, gateway_statuses) = tokio::sync::watch::channel(Vec::new());
    let serving = feed::Serving {
        sockets: gateway::compile::Sockets {
            http: http
                .as_ref()
                .and_then(|l| l.local_addr().ok())
                .map(|a| a.port()),
            https: https
                .as_ref()
                .and_then(|l| l.local_addr().ok())
                .map(|a| a.port()),
        },
        advertised: config.advertised.clone(),
    };
    tasks.critical(
        "ingress table",
        feed::rebuild(
            feed.clone(),
            routing.clone(),
            certificates.clone(),
            serving,
            status,
            gateway_status,
        ),
    );
    tasks.critical(
        "gateway status",
        gateway::status::write(gateway_statuses, client.clone()),
    );
    if let Some(node_name) = config.node_name.clone() {
        let published = publish::Publish {
            node_name,
            http: http.as_ref().and_then(|l| l.local_addr().ok()),
            https: https.as_ref().and_then(|l| l.local_addr().ok()),
        };
        let client = client.clone();
        tasks.once("publish", async move {
            publish::publish(client, published).await
        });
    }
    tasks.critical("ingress status", feed::write_status(statuses, client));

    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut http_addr = None;
    if let Some(listener) = http {
        http_addr = listener.local_addr().ok();
        let each = Serving {
            routing: routing.clone(),
            tls: None,
            connections: connections.clone(),
        };
        serve_on_threads("ingress http", listener, each, workers, &tasks)?;
    }
    let mut https_addr = None;
    if let Some(listener) = https {
        https_addr = listener.local_addr().ok();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls::server_config(certificates)));
        let each = Serving {
            routing,
            tls: Some(acceptor),
            connections,
        };
        serve_on_threads("ingress https", listener, each, workers, &tasks)?;
    }
    let shown =
        |addr: Option<SocketAddr>| addr.map_or_else(|| "none".to_owned(), |a| a.to_string());
    tracing::info!(http = %shown(http_addr), https = %shown(https_addr), "ingress proxy listening");
    Ok(IngressProxy {
        metrics,
        tasks,
        http: http_addr,
        https: https_addr,
    })
}

/// Follows the Gateway API's objects (and Namespaces, for listeners that
/// select the namespaces of their routes) into the world.
fn follow_gateway_api(tasks: &portal_client::Supervisor, feed: &Arc<feed::Feed>, client: &Client) {
    use gateway::objects::{Gateway, GatewayClass, HttpRoute, ReferenceGrant};
    macro_rules! follow {
        ($kind:ty, $name:literal, $map:path) => {{
            let (feed, client) = (feed.clone(), client.clone());
            tasks.restarting($name, move || {
                feed::follow(
                    feed.clone(),
                    Api::<$kind>::all(client.clone()),
                    watcher::Config::default(),
                    $name,
                    $map,
                )
            });
        }};
    }
    follow!(GatewayClass, "gateway classes", feed::gateway_classes);
    follow!(Gateway, "gateways", feed::gateways);
    follow!(HttpRoute, "http routes", feed::http_routes);
    follow!(ReferenceGrant, "reference grants", feed::grants);
    follow!(Namespace, "namespaces", feed::namespaces);
}

async fn bind(addr: Option<SocketAddr>) -> Result<Option<TcpListener>, Error> {
    match addr {
        Some(addr) => TcpListener::bind(addr)
            .await
            .map(Some)
            .map_err(|source| Error::Bind { addr, source }),
        None => Ok(None),
    }
}

/// What every serving thread of one socket is given.
#[derive(Clone)]
struct Serving {
    routing: Arc<proxy::Routing>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    connections: Arc<Semaphore>,
}

/// Serves a socket on `workers` threads, each with a single-threaded
/// runtime of its own accepting from the same socket (as nginx's workers
/// do): a client connection, its requests and their backend connections
/// stay on one thread. A thread that ends fails the supervisor's task.
fn serve_on_threads(
    name: &'static str,
    listener: TcpListener,
    serving: Serving,
    workers: usize,
    tasks: &portal_client::Supervisor,
) -> Result<(), Error> {
    let addr = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let failed = |source| Error::Serve { addr, source };
    let listener = listener.into_std().map_err(failed)?;
    for worker in 0..workers {
        let listener = listener.try_clone().map_err(failed)?;
        let serving = serving.clone();
        let (alive, ended) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(format!("{name} {worker}"))
            .spawn(move || {
                let _alive = alive;
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(error) => {
                        tracing::error!(%error, "cannot start a serving thread's runtime");
                        return;
                    }
                };
                runtime.block_on(async move {
                    match TcpListener::from_std(listener) {
                        Ok(listener) => {
                            let proxy = Arc::new(proxy::Proxy::new(serving.routing));
                            serve(listener, proxy, serving.tls, serving.connections).await;
                        }
                        Err(error) => tracing::error!(%error, "cannot serve the socket"),
                    }
                });
            })
            .map_err(failed)?;
        tasks.critical(name, async move {
            let _ = ended.await;
        });
    }
    Ok(())
}

/// Accepts connections for ever, each served on its own task.
async fn serve(
    listener: TcpListener,
    proxy: Arc<proxy::Proxy>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    connections: Arc<Semaphore>,
) {
    loop {
        let Ok(permit) = connections.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            // A connection that went before it was accepted: next.
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionAborted => continue,
            Err(error) => {
                // Out of descriptors and the like: wait, do not spin.
                tracing::warn!(%error, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (proxy, tls) = (proxy.clone(), tls.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let secure = tls.is_some();
            let client = proxy::Peer::new(peer);
            let service =
                service_fn(move |request| proxy.clone().serve(request, client.clone(), secure));
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            builder
                .http2()
                .timer(TokioTimer::new())
                .keep_alive_interval(Some(HEADER_TIMEOUT))
                .max_concurrent_streams(256);
            let served = match tls {
                Some(acceptor) => {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            builder
                                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                                .await
                        }
                        Ok(Err(error)) => {
                            tracing::debug!(%peer, %error, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    }
                }
                None => {
                    builder
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .await
                }
            };
            if let Err(error) = served {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        });
    }
}

/// Makes the `portal` IngressClass, the default one, unless it exists.
async fn ensure_class(client: Client) {
    let class = json!({
        "metadata": {"name": CLASS, "annotations": {DEFAULT_INGRESS_CLASS: "true"}},
        "spec": {"controller": CONTROLLER},
    });
    create_unless_present(
        Api::<IngressClass>::all(client),
        class,
        "the portal IngressClass",
    )
    .await;
}

/// Creates a cluster-scoped object unless one of its name exists, trying
/// again for a while (the API server may still be starting).
pub(crate) async fn create_unless_present<K>(api: Api<K>, object: serde_json::Value, what: &str)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let object: K = match serde_json::from_value(object) {
        Ok(object) => object,
        Err(error) => {
            tracing::error!(%error, what, "does not decode");
            return;
        }
    };
    for attempt in 0..10u32 {
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => return,
            Err(kube::Error::Api(status)) if status.code == 409 => return,
            Err(error) => {
                tracing::warn!(%error, attempt, what, "cannot make it yet");
                tokio::time::sleep(Duration::from_millis(200 << attempt.min(5))).await;
            }
        }
    }
}
