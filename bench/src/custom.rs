//! Custom resources (issue 30): create throughput of a custom resource
//! whose definition has a structural schema (defaults, an enum, bounds, a
//! map list) and a CEL rule, against a built-in kind of similar size (a
//! ConfigMap with the same bytes of data), on one `portal server`, in
//! alternating rounds so both meet the same machine state; and what a
//! no-op validating webhook adds to a create (one client, latency with
//! and without it, alternating). The webhook is an HTTPS server in this
//! process on loopback, so the figure is the API server's cost of asking
//! one (TLS connection, review, answer), not a pod network's. Last, what
//! API aggregation adds to a read (`crate::aggregation`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use crate::portal::{Client, Portal};
use crate::stats::Samples;
use crate::{creates, Error};

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The portal binary to measure.
    #[arg(long, default_value = "target/release/portal")]
    portal: PathBuf,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Seconds per round.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Rounds of each kind, alternating.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Sequential creates per webhook round.
    #[arg(long, default_value_t = 400)]
    webhook_creates: usize,
    /// Sequential reads per API aggregation round.
    #[arg(long, default_value_t = 1000)]
    aggregated_gets: usize,
    /// Where the extension API server listens: an address of this network
    /// namespace that is not loopback (Endpoints may not name loopback);
    /// `bench/custom_resources.sh` makes a namespace with one.
    #[arg(long, default_value = "192.168.77.1")]
    extension_ip: std::net::IpAddr,
}

const DEFINITION: &str = r#"{
  "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
  "metadata": {"name": "widgets.bench.example.com"},
  "spec": {"group": "bench.example.com", "scope": "Namespaced",
    "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
    "versions": [{"name": "v1", "served": true, "storage": true,
      "schema": {"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "required": ["size"],
          "x-kubernetes-validations": [{"rule": "self.size <= self.limit", "message": "size must not exceed limit"}],
          "properties": {
            "size": {"type": "integer", "minimum": 1, "maximum": 100},
            "limit": {"type": "integer", "default": 50},
            "color": {"type": "string", "enum": ["red", "green", "blue"]},
            "owner": {"type": "string", "maxLength": 64},
            "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
              "items": {"type": "object", "properties": {"name": {"type": "string"}, "port": {"type": "integer"}}}}}}}}}}]}}"#;

fn widget(name: &str) -> Bytes {
    Bytes::from(
        serde_json::json!({
            "apiVersion": "bench.example.com/v1", "kind": "Widget",
            "metadata": {"name": name, "labels": {"app": "bench"}},
            "spec": {"size": 7, "color": "green", "owner": "team-a",
                     "ports": [{"name": "http", "port": 80}, {"name": "https", "port": 443}]},
        })
        .to_string(),
    )
}

/// A ConfigMap carrying as many bytes as a widget's spec.
fn config_map(name: &str) -> Bytes {
    Bytes::from(
        serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {"app": "bench"}},
            "data": {"size": "7", "color": "green", "owner": "team-a",
                     "ports": "http=80,https=443", "limit": "50"},
        })
        .to_string(),
    )
}

pub(crate) async fn run(args: &Args) -> Result<String, Error> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let portal = Portal::start(&args.portal, dir.path(), &["--disable", "proxy,agent"])?;
    let mut admin = portal.connect().await?;
    let namespace = Bytes::from(r#"{"metadata":{"name":"bench"}}"#);
    admin.call("POST", "/api/v1/namespaces", namespace).await?;
    let (code, reply) = admin
        .call(
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            Bytes::from(DEFINITION),
        )
        .await?;
    if code != 201 {
        return Err(format!(
            "the CRD: {code} {}",
            String::from_utf8_lossy(&reply)
        ));
    }
    let widgets = "/apis/bench.example.com/v1/namespaces/bench/widgets";
    let deadline = Instant::now() + Duration::from_secs(10);
    while admin.call("GET", widgets, Bytes::new()).await?.0 != 200 {
        if Instant::now() > deadline {
            return Err("the CRD was not served".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let config_maps = "/api/v1/namespaces/bench/configmaps";
    // Warm both paths.
    creates(&portal, args.clients, 0.5, widgets, widget, "warm").await?;
    creates(&portal, args.clients, 0.5, config_maps, config_map, "warm").await?;
    let (mut anchor, mut custom) = (Samples::default(), Samples::default());
    let (mut anchor_time, mut custom_time) = (0.0, 0.0);
    for round in 0..args.rounds {
        let tag = format!("r{round}");
        let (rate, samples) = creates(
            &portal,
            args.clients,
            args.seconds,
            config_maps,
            config_map,
            &tag,
        )
        .await?;
        anchor_time += samples.len() as f64 / rate;
        anchor.extend(samples);
        let (rate, samples) =
            creates(&portal, args.clients, args.seconds, widgets, widget, &tag).await?;
        custom_time += samples.len() as f64 / rate;
        custom.extend(samples);
        eprintln!("round {round} done");
    }
    let webhook = webhook_overhead(&portal, &mut admin, args.webhook_creates).await?;
    let aggregation =
        crate::aggregation::overhead(&portal, &mut admin, args.aggregated_gets, args.extension_ip)
            .await?;
    let anchor_rate = anchor.len() as f64 / anchor_time;
    let custom_rate = custom.len() as f64 / custom_time;
    let (anchor_p99, custom_p99) = (anchor.percentile_ms(0.99), custom.percentile_ms(0.99));
    Ok(format!(
        "| creates, {} clients, {} rounds of {} s each, alternating | creates/s | p99 |\n|---|---|---|\n\
         | ConfigMap of the same bytes (built-in, anchor) | {anchor_rate:.0} | {anchor_p99:.1} ms |\n\
         | custom resource: structural schema, defaults, enum, bounds, map list, CEL rule | {custom_rate:.0} | {custom_p99:.1} ms |\n\
         | ratio custom / built-in | **{:.2}×** | {:.2}× |\n",
        args.clients,
        args.rounds,
        args.seconds,
        custom_rate / anchor_rate,
        custom_p99 / anchor_p99,
    ) + &webhook
        + &aggregation)
}

/// A no-op webhook: every review allowed. Counts the reviews it answers.
async fn serve_webhook(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    answered: Arc<AtomicU64>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    while let Ok((tcp, _)) = listener.accept().await {
        let (acceptor, answered) = (acceptor.clone(), answered.clone());
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(tcp).await else {
                return;
            };
            let service =
                hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let answered = answered.clone();
                    async move {
                        let body = request.into_body().collect().await?.to_bytes();
                        let review: serde_json::Value =
                            serde_json::from_slice(&body).unwrap_or_default();
                        let answer = serde_json::json!({
                            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                            "response": {"uid": review["request"]["uid"], "allowed": true},
                        });
                        answered.fetch_add(1, Ordering::Relaxed);
                        Ok::<_, hyper::Error>(http::Response::new(Full::new(Bytes::from(
                            answer.to_string(),
                        ))))
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// TLS serving a fresh self-signed certificate for `name`, and that
/// certificate's PEM (the `caBundle` that trusts it).
pub(crate) fn self_signed(name: &str) -> Result<(Arc<rustls::ServerConfig>, String), Error> {
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    // (An address in `name` becomes an IP subject alternative name.)
    let params = rcgen::CertificateParams::new(vec![name.to_owned()]).map_err(|e| e.to_string())?;
    let certificate = params.self_signed(&key).map_err(|e| e.to_string())?;
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_no_client_auth()
    .with_single_cert(
        vec![certificate.der().clone()],
        rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .map_err(|e| e.to_string())?;
    Ok((Arc::new(tls), certificate.pem()))
}

/// Latency of sequential ConfigMap creates without and with a no-op
/// validating webhook, alternating; a table of p50/p99 and what it adds.
async fn webhook_overhead(
    portal: &Portal,
    admin: &mut Client,
    creates: usize,
) -> Result<String, Error> {
    let (tls, pem) = self_signed("127.0.0.1")?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let answered = Arc::new(AtomicU64::new(0));
    tokio::spawn(serve_webhook(listener, tls, answered.clone()));
    let bundle = base64::engine::general_purpose::STANDARD.encode(pem);
    let configuration = serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "noop"},
        "webhooks": [{"name": "noop.bench.example.com", "admissionReviewVersions": ["v1"],
            "sideEffects": "None", "failurePolicy": "Fail",
            "clientConfig": {"url": format!("https://127.0.0.1:{port}/"), "caBundle": bundle},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}]}],
    });
    let path = "/api/v1/namespaces/bench/configmaps";
    let configurations = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";
    let mut client = portal.connect().await?;
    let (mut without, mut with) = (Samples::default(), Samples::default());
    for round in 0..4 {
        let hooked = round % 2 == 1;
        if hooked {
            admin
                .call(
                    "POST",
                    configurations,
                    Bytes::from(configuration.to_string()),
                )
                .await?;
        } else if round > 0 {
            admin
                .call("DELETE", &format!("{configurations}/noop"), Bytes::new())
                .await?;
        }
        // Until a create shows the webhook asked (or not), as configured.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let before = answered.load(Ordering::Relaxed);
            let name = format!("probe-{round}-{}", Instant::now().elapsed().as_nanos());
            client
                .call("POST", path, config_map(&format!("{name}-{before}")))
                .await?;
            if (answered.load(Ordering::Relaxed) > before) == hooked {
                break;
            }
            if Instant::now() > deadline {
                return Err("the webhook configuration did not apply".into());
            }
        }
        let samples = if hooked { &mut with } else { &mut without };
        for i in 0..creates {
            let sent = Instant::now();
            let (code, reply) = client
                .call("POST", path, config_map(&format!("w{round}-{i}")))
                .await?;
            if code != 201 {
                return Err(format!(
                    "create answered {code}: {}",
                    String::from_utf8_lossy(&reply)
                ));
            }
            samples.push(sent.elapsed());
        }
    }
    let (p50, p99) = (without.percentile_ms(0.5), without.percentile_ms(0.99));
    let (hooked50, hooked99) = (with.percentile_ms(0.5), with.percentile_ms(0.99));
    Ok(format!(
        "\n| ConfigMap create, one client, {creates} per round, 4 rounds alternating | p50 | p99 |\n|---|---|---|\n\
         | no webhook (anchor) | {p50:.2} ms | {p99:.2} ms |\n\
         | a no-op validating webhook (HTTPS on loopback) | {hooked50:.2} ms | {hooked99:.2} ms |\n\
         | added by the webhook | **{:.2} ms** | {:.2} ms |\n",
        hooked50 - p50,
        hooked99 - p99,
    ))
}
