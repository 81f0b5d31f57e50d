//! API aggregation (issue 30): what proxying a request to an extension API
//! server adds. One client reads one object, sequentially, in alternating
//! rounds: a ConfigMap served by Portal itself (the anchor), and an object
//! of an APIService's group served by an extension server in this process
//! (HTTPS on an address of the bench's own network namespace, answering at
//! once), reached through Portal (RBAC,
//! the APIService, a kept TLS connection, the `X-Remote-*` identity).

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;

use crate::portal::{Client, Portal};
use crate::stats::Samples;
use crate::Error;

const GROUP_VERSION: &str = "extension.example.com/v1";

/// The extension server: discovery of its group version, and one thing.
async fn serve_extension(listener: tokio::net::TcpListener, tls: Arc<rustls::ServerConfig>) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    while let Ok((tcp, _)) = listener.accept().await {
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(tcp).await else {
                return;
            };
            let service = hyper::service::service_fn(
                |request: http::Request<hyper::body::Incoming>| async move {
                    let body = if request.uri().path() == format!("/apis/{GROUP_VERSION}") {
                        serde_json::json!({"kind": "APIResourceList", "apiVersion": "v1",
                            "groupVersion": GROUP_VERSION, "resources": [{"name": "things",
                            "singularName": "thing", "namespaced": true, "kind": "Thing", "verbs": ["get"]}]})
                    } else {
                        serde_json::json!({"apiVersion": GROUP_VERSION, "kind": "Thing",
                            "metadata": {"name": "x", "namespace": "bench"},
                            "data": {"size": "7", "color": "green", "owner": "team-a",
                                     "ports": "http=80,https=443", "limit": "50"}})
                    };
                    Ok::<_, hyper::Error>(http::Response::new(Full::new(Bytes::from(
                        body.to_string(),
                    ))))
                },
            );
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// A table of sequential GET latency, built-in against proxied.
pub(crate) async fn overhead(
    portal: &Portal,
    admin: &mut Client,
    gets: usize,
    ip: std::net::IpAddr,
) -> Result<String, Error> {
    let (tls, pem) = crate::custom::self_signed("ext.bench.svc")?;
    let listener = tokio::net::TcpListener::bind((ip, 0))
        .await
        .map_err(|e| format!("the extension server on {ip}: {e} (bench/custom_resources.sh makes a network namespace with that address)"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    tokio::spawn(serve_extension(listener, tls));
    // A Service without a selector whose Endpoints are the server.
    let objects = [
        (
            "/api/v1/namespaces/bench/services",
            serde_json::json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "ext"}, "spec": {"ports": [{"port": 443, "targetPort": port}]}}),
        ),
        (
            "/api/v1/namespaces/bench/endpoints",
            serde_json::json!({"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": "ext"},
            "subsets": [{"addresses": [{"ip": ip.to_string()}], "ports": [{"port": port}]}]}),
        ),
        (
            "/apis/apiregistration.k8s.io/v1/apiservices",
            serde_json::json!({
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": "v1.extension.example.com"},
            "spec": {"group": "extension.example.com", "version": "v1", "groupPriorityMinimum": 1000,
                "versionPriority": 15, "service": {"namespace": "bench", "name": "ext"},
                "caBundle": base64::engine::general_purpose::STANDARD.encode(&pem)}}),
        ),
        (
            "/api/v1/namespaces/bench/configmaps",
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x"}, "data": {"size": "7", "color": "green", "owner": "team-a",
                "ports": "http=80,https=443", "limit": "50"}}),
        ),
    ];
    for (path, object) in objects {
        let (code, reply) = admin
            .call("POST", path, Bytes::from(object.to_string()))
            .await?;
        if code != 201 {
            return Err(format!(
                "{path}: {code} {}",
                String::from_utf8_lossy(&reply)
            ));
        }
    }
    let proxied = "/apis/extension.example.com/v1/namespaces/bench/things/x";
    let built_in = "/api/v1/namespaces/bench/configmaps/x";
    let mut client = portal.connect().await?;
    // Until the APIService is Available (its check passed).
    let deadline = Instant::now() + Duration::from_secs(20);
    while client.call("GET", proxied, Bytes::new()).await?.0 != 200 {
        if Instant::now() > deadline {
            return Err("the APIService did not become available".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (mut anchor, mut through) = (Samples::default(), Samples::default());
    for round in 0..4 {
        let (path, samples) = if round % 2 == 0 {
            (built_in, &mut anchor)
        } else {
            (proxied, &mut through)
        };
        for _ in 0..gets {
            let sent = Instant::now();
            let (code, reply) = client.call("GET", path, Bytes::new()).await?;
            if code != 200 {
                return Err(format!(
                    "{path}: {code} {}",
                    String::from_utf8_lossy(&reply)
                ));
            }
            samples.push(sent.elapsed());
        }
    }
    let (p50, p99) = (anchor.percentile_ms(0.5), anchor.percentile_ms(0.99));
    let (through50, through99) = (through.percentile_ms(0.5), through.percentile_ms(0.99));
    Ok(format!(
        "\n| GET of one object, one client, {gets} per round, 4 rounds alternating | p50 | p99 |\n|---|---|---|\n\
         | a ConfigMap, served by Portal (anchor) | {p50:.2} ms | {p99:.2} ms |\n\
         | an extension server's object through an APIService (HTTPS, connection kept) | {through50:.2} ms | {through99:.2} ms |\n\
         | added by the aggregation proxy | **{:.2} ms** | {:.2} ms |\n",
        through50 - p50,
        through99 - p99,
    ))
}
