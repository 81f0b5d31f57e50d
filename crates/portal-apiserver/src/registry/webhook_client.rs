//! The HTTPS client of webhooks (admission webhooks, CRD conversion
//! webhooks): a `clientConfig` (a URL, or a Service reached at a ready
//! endpoint and verified as `<service>.<namespace>.svc`) against its
//! `caBundle` (the cluster CA without one); a JSON review POSTed, its JSON
//! answer read. Connections are kept for the next call.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use rustls_pki_types::{pem::PemObject, ServerName};
use serde_json::Value;

use crate::server::pool::Pool;
use crate::ApiState;

/// The largest answer read from a webhook.
const MAX_RESPONSE: usize = 10 * 1024 * 1024;

/// POSTs the review to the webhook; its parsed answer.
pub(crate) async fn post(
    state: &ApiState,
    config: &Value,
    review: &Value,
    timeout: Duration,
) -> Result<Value, String> {
    let (address, server_name, path) = match config["url"].as_str() {
        Some(url) => {
            let uri: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
            let host = uri
                .host()
                .ok_or("the URL has no host")?
                .trim_matches(['[', ']'])
                .to_owned();
            let port = uri.port_u16().unwrap_or(443);
            let address = tokio::net::lookup_host((host.as_str(), port))
                .await
                .map_err(|e| format!("{host}: {e}"))?
                .next()
                .ok_or_else(|| format!("{host}: no address"))?;
            let path = uri
                .path_and_query()
                .map(|p| p.as_str().to_owned())
                .unwrap_or("/".into());
            (address, host, path)
        }
        None => {
            let service = &config["service"];
            let namespace = service["namespace"].as_str().unwrap_or("");
            let name = service["name"].as_str().unwrap_or("");
            let port = service["port"].as_u64().unwrap_or(443).to_string();
            let address =
                crate::registry::lookup::service_endpoint(state, namespace, name, Some(&port))
                    .await
                    .map_err(|status| status.message)?;
            let path = service["path"].as_str().unwrap_or("/").to_owned();
            (address, format!("{name}.{namespace}.svc"), path)
        }
    };
    let key = PoolKey {
        address,
        server_name: server_name.clone(),
        bundle: config["caBundle"].as_str().unwrap_or("").to_owned(),
    };
    let separator = if path.contains('?') { '&' } else { '?' };
    let body = Bytes::from(serde_json::to_vec(review).map_err(|e| e.to_string())?);
    let request = || {
        http::Request::post(format!("{path}{separator}timeout={}s", timeout.as_secs()))
            .header(http::header::HOST, server_name.as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json")
            .body(Full::new(body.clone()))
            .map_err(|e| e.to_string())
    };
    // A kept connection first: one the webhook closed meanwhile hands the
    // review back unsent, which then goes on a new one (a review that may
    // have been delivered is not sent twice).
    let fresh = |request: http::Request<Full<Bytes>>| async {
        let mut sender = dial(state, config, address, &server_name).await?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((sender, response))
    };
    let (mut sender, response) = match pool().take(&key) {
        Some(mut idle) => match idle.try_send_request(request()?).await {
            Ok(response) => (idle, response),
            Err(mut failed) => match failed.take_message() {
                Some(unsent) => fresh(unsent).await?,
                None => return Err(failed.error().to_string()),
            },
        },
        None => fresh(request()?).await?,
    };
    let code = response.status();
    let body = Limited::new(response.into_body(), MAX_RESPONSE)
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if sender.ready().await.is_ok() {
        pool().give(key, sender);
    }
    if !code.is_success() {
        return Err(format!(
            "the server answered {code}: {}",
            String::from_utf8_lossy(&body[..body.len().min(512)])
        ));
    }
    serde_json::from_slice(&body).map_err(|e| format!("the answer is not an AdmissionReview: {e}"))
}

/// A connection to a webhook, kept for the next review (as upstream's
/// HTTP client keeps them alive): dialling TLS for every write would cost
/// more than the review.
type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// Connections are shared by the same address, name and trust.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct PoolKey {
    address: std::net::SocketAddr,
    server_name: String,
    bundle: String,
}

fn pool() -> &'static Pool<PoolKey, Full<Bytes>> {
    static POOL: std::sync::OnceLock<Pool<PoolKey, Full<Bytes>>> = std::sync::OnceLock::new();
    POOL.get_or_init(Default::default)
}

async fn dial(
    state: &ApiState,
    config: &Value,
    address: std::net::SocketAddr,
    server_name: &str,
) -> Result<Sender, String> {
    let tls = tls_config(state, config)?;
    let tcp = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|e| format!("dial tcp {address}: {e}"))?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let name = ServerName::try_from(server_name.to_owned()).map_err(|e| e.to_string())?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("tls: {e}"))?;
    crate::server::http::upstream_connection(stream)
        .await
        .map_err(|e| e.to_string())
}

/// TLS trusting the webhook's `caBundle` (the cluster CA without one).
fn tls_config(state: &ApiState, config: &Value) -> Result<Arc<rustls::ClientConfig>, String> {
    let bundle = match config["caBundle"].as_str().filter(|b| !b.is_empty()) {
        Some(bundle) => base64::engine::general_purpose::STANDARD
            .decode(bundle)
            .map_err(|e| format!("caBundle: {e}"))?,
        None => state.joining.ca_pem.as_bytes().to_vec(),
    };
    let roots = roots(&bundle)?;
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(tls))
}

/// The certificates of a PEM bundle (a `caBundle`) as trust roots.
pub(crate) fn roots(pem: &[u8]) -> std::result::Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in rustls_pki_types::CertificateDer::pem_slice_iter(pem) {
        let certificate = certificate.map_err(|e| format!("caBundle: {e}"))?;
        roots
            .add(certificate)
            .map_err(|e| format!("caBundle: {e}"))?;
    }
    if roots.is_empty() {
        return Err("caBundle: no certificate".into());
    }
    Ok(roots)
}
