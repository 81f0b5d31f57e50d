//! Portal's built-in layer-7 proxy: the Ingress controller of the
//! `portal` IngressClass (controller `portal.dev/ingress`). It follows
//! Ingresses, their Services' EndpointSlices and TLS Secrets into a
//! routing table ([`routes`]), and serves HTTP/1.1 and HTTP/2 (h2c, and
//! over TLS by ALPN) on its listeners, sending each request to a ready
//! endpoint directly ([`proxy`]) and terminating TLS by SNI ([`tls`]).
//! Each Ingress it serves shows the proxy's addresses in its status.

mod feed;
mod metrics;
mod proxy;
mod routes;
mod tls;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::api::PostParams;
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::json;
use tokio::net::TcpListener;

pub use metrics::Metrics;

/// The controller name of Portal's IngressClass.
pub const CONTROLLER: &str = "portal.dev/ingress";
/// Portal's IngressClass, made at start (the default class).
pub const CLASS: &str = "portal";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("TLS: {0}")]
    Tls(String),
}

/// Where the proxy listens and what it says its address is.
#[derive(Clone, Debug)]
pub struct Config {
    /// Plain HTTP (and h2c).
    pub http: SocketAddr,
    /// HTTPS; none: no TLS listener.
    pub https: Option<SocketAddr>,
    /// The addresses written in the status of the Ingresses served (the
    /// node's); none are written when empty.
    pub advertised: Vec<IpAddr>,
}

/// A running proxy.
#[derive(Debug)]
pub struct IngressProxy {
    pub metrics: Arc<Metrics>,
    pub tasks: portal_client::Supervisor,
    /// Where it listens (the ports chosen when the config said 0).
    pub http: SocketAddr,
    pub https: Option<SocketAddr>,
}

/// Binds the listeners, makes the `portal` IngressClass if there is none,
/// and starts following the cluster.
pub async fn start(client: Client, config: Config) -> Result<IngressProxy, Error> {
    let http = TcpListener::bind(config.http)
        .await
        .map_err(|source| Error::Bind {
            addr: config.http,
            source,
        })?;
    let https = match config.https {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|source| Error::Bind { addr, source })?,
        ),
        None => None,
    };
    let metrics = Arc::new(Metrics::new());
    let proxy = Arc::new(proxy::Proxy::new(metrics.clone()));
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
    tasks.critical(
        "ingress table",
        feed::rebuild(
            feed.clone(),
            proxy.clone(),
            certificates.clone(),
            client,
            config.advertised.clone(),
        ),
    );

    let http_addr = http.local_addr().map_err(|source| Error::Bind {
        addr: config.http,
        source,
    })?;
    tasks.critical("ingress http", serve(http, proxy.clone(), None));
    let mut https_addr = None;
    if let Some(listener) = https {
        https_addr = listener.local_addr().ok();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls::server_config(certificates)));
        tasks.critical("ingress https", serve(listener, proxy, Some(acceptor)));
    }
    let https_shown = https_addr.map_or_else(|| "none".to_owned(), |a| a.to_string());
    tracing::info!(http = %http_addr, https = %https_shown, "ingress proxy listening");
    Ok(IngressProxy {
        metrics,
        tasks,
        http: http_addr,
        https: https_addr,
    })
}

/// Accepts connections for ever, each served on its own task.
async fn serve(
    listener: TcpListener,
    proxy: Arc<proxy::Proxy>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors and the like: wait, do not spin.
                tracing::warn!(%error, "accepting a connection failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (proxy, tls) = (proxy.clone(), tls.clone());
        tokio::spawn(async move {
            let secure = tls.is_some();
            let service = service_fn(move |request| proxy.clone().serve(request, peer, secure));
            let builder = auto::Builder::new(TokioExecutor::new());
            let served = match tls {
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(stream) => {
                        builder
                            .serve_connection_with_upgrades(TokioIo::new(stream), service)
                            .await
                    }
                    Err(error) => {
                        tracing::debug!(%peer, %error, "TLS handshake failed");
                        return;
                    }
                },
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
    let api: Api<IngressClass> = Api::all(client);
    let class: IngressClass = match serde_json::from_value(json!({
        "metadata": {"name": CLASS, "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}},
        "spec": {"controller": CONTROLLER},
    })) {
        Ok(class) => class,
        Err(error) => {
            tracing::error!(%error, "the portal IngressClass does not decode");
            return;
        }
    };
    for attempt in 0..10u32 {
        match api.create(&PostParams::default(), &class).await {
            Ok(_) => return,
            Err(kube::Error::Api(status)) if status.code == 409 => return,
            Err(error) => {
                tracing::warn!(%error, attempt, "cannot make the portal IngressClass yet");
                tokio::time::sleep(std::time::Duration::from_millis(200 << attempt.min(5))).await;
            }
        }
    }
}
