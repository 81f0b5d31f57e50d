//! API aggregation, as kube-aggregator: an APIService with a
//! `spec.service` hands its group version to an extension API server (such
//! as metrics-server). Requests for it are authenticated and authorized
//! here, then proxied over TLS to a ready endpoint of that Service with
//! this server's front-proxy client certificate and the user in
//! `X-Remote-*` headers ([`proxy`]); each remote APIService is checked
//! and its discovery fetched ([`availability`]), which discovery merges
//! with this server's own groups ([`discovery`]); this server's own
//! groups have local APIServices kept in step ([`local`]).

pub(crate) mod availability;
pub(crate) mod discovery;
pub(crate) mod local;
pub(crate) mod proxy;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use portal_api::kinds::api_service;
use rustls_pki_types::ServerName;
use serde_json::Value;

use crate::security::pki::FrontProxy;
use crate::server::http::RequestBody;
use crate::server::pool::Pool;
use crate::ApiState;

/// Time to reach an extension server (dial and TLS).
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// What this server knows of the extension API servers.
pub(crate) struct Aggregator {
    identity: FrontProxy,
    /// Client TLS per trust (`caBundle`, or none verified), made once.
    tls: parking_lot::Mutex<HashMap<(String, bool), Arc<rustls::ClientConfig>>>,
    /// Each remote APIService's last discovery, by name.
    remotes: parking_lot::RwLock<HashMap<String, Remote>>,
    /// Connections to extension servers, kept for the next request.
    pub(crate) connections: Arc<Pool<Destination, RequestBody>>,
}

/// A remote group version's discovery (an `APIResourceList`) as last
/// fetched, and whether the last check succeeded.
#[derive(Clone, Debug, Default)]
pub(crate) struct Remote {
    pub(crate) resources: Option<Value>,
    pub(crate) current: bool,
}

impl std::fmt::Debug for Aggregator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aggregator").finish_non_exhaustive()
    }
}

impl Aggregator {
    pub(crate) fn new(identity: FrontProxy) -> Self {
        Aggregator {
            identity,
            tls: Default::default(),
            remotes: Default::default(),
            connections: Default::default(),
        }
    }

    /// The front-proxy CA extension servers trust this server's client
    /// certificate by.
    pub(crate) fn client_ca(&self) -> &str {
        &self.identity.ca_pem
    }

    pub(crate) fn remote(&self, name: &str) -> Option<Remote> {
        self.remotes.read().get(name).cloned()
    }

    pub(crate) fn remember(&self, name: &str, remote: Remote) {
        self.remotes.write().insert(name.to_owned(), remote);
    }

    /// Forgets the APIServices no longer remote.
    pub(crate) fn retain(&self, names: &[String]) {
        self.remotes.write().retain(|name, _| names.contains(name));
    }

    /// TLS to an extension server: its `caBundle` (the cluster CA without
    /// one) or, with `insecureSkipTLSVerify`, no check of who answers;
    /// always this server's client certificate.
    fn tls(&self, state: &ApiState, spec: &Value) -> Result<Arc<rustls::ClientConfig>, String> {
        let bundle = spec["caBundle"].as_str().unwrap_or("").to_owned();
        let insecure = spec["insecureSkipTLSVerify"] == true;
        let key = (bundle, insecure);
        if let Some(tls) = self.tls.lock().get(&key) {
            return Ok(tls.clone());
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = if insecure {
            builder
                .dangerous()
                .with_custom_certificate_verifier(crate::security::pki::any_server(provider))
        } else {
            let pem = match key.0.as_str() {
                "" => state.joining.ca_pem.as_bytes().to_vec(),
                bundle => base64::engine::general_purpose::STANDARD
                    .decode(bundle)
                    .map_err(|e| format!("caBundle: {e}"))?,
            };
            let roots = crate::registry::webhook_client::roots(&pem)?;
            builder.with_root_certificates(roots)
        };
        let mut tls = builder
            .with_client_auth_cert(self.identity.chain.clone(), self.identity.key.clone_key())
            .map_err(|e| e.to_string())?;
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let tls = Arc::new(tls);
        let mut cached = self.tls.lock();
        // Bundles change rarely; a bound keeps a churn of them from growing.
        if cached.len() >= 64 {
            cached.clear();
        }
        cached.insert(key, tls.clone());
        Ok(tls)
    }
}

/// The APIService serving `group`/`version` through a Service, if any.
pub(crate) fn remote_api_service(state: &ApiState, group: &str, version: &str) -> Option<Value> {
    let name = api_service::name_of(group, version);
    let cached = state.cache.get(
        &api_service::RESOURCE,
        &api_service::RESOURCE.key(None, &name),
    )?;
    cached.value["spec"]["service"]
        .is_object()
        .then(|| cached.value.clone())
}

/// Every APIService.
pub(crate) fn api_services(state: &ApiState) -> Vec<Value> {
    let prefix = api_service::RESOURCE.key_prefix();
    let (found, _, _) = state
        .cache
        .list(&api_service::RESOURCE, &prefix, None, 0, |_| true);
    found.iter().map(|o| o.value.clone()).collect()
}

/// Whether the APIService's `Available` condition holds.
pub(crate) fn available(api_service: &Value) -> bool {
    api_service["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Available" && c["status"] == "True")
}

/// The APIService's Service as its requests name it
/// (`name.namespace.svc:port`).
pub(crate) fn service_host(api_service: &Value) -> String {
    let service = &api_service["spec"]["service"];
    format!(
        "{}.{}.svc:{}",
        service["name"].as_str().unwrap_or(""),
        service["namespace"].as_str().unwrap_or(""),
        service["port"].as_u64().unwrap_or(443)
    )
}

/// Where requests for an APIService go now (a ready endpoint, chosen at
/// random) and how it is trusted: connections are kept by this.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Destination {
    pub(crate) address: std::net::SocketAddr,
    server_name: String,
    bundle: String,
    insecure: bool,
}

pub(crate) async fn destination(
    state: &ApiState,
    api_service: &Value,
) -> Result<Destination, String> {
    let spec = &api_service["spec"];
    let service = &spec["service"];
    let namespace = service["namespace"].as_str().unwrap_or("");
    let name = service["name"].as_str().unwrap_or("");
    let port = service["port"].as_u64().unwrap_or(443).to_string();
    let address = crate::registry::lookup::service_endpoint(state, namespace, name, Some(&port))
        .await
        .map_err(|status| status.message)?;
    Ok(Destination {
        address,
        server_name: format!("{name}.{namespace}.svc"),
        bundle: spec["caBundle"].as_str().unwrap_or("").to_owned(),
        insecure: spec["insecureSkipTLSVerify"] == true,
    })
}

/// A new TLS connection to `destination`.
pub(crate) async fn dial<B>(
    state: &ApiState,
    api_service: &Value,
    destination: &Destination,
) -> Result<hyper::client::conn::http1::SendRequest<B>, String>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let address = destination.address;
    let tls = state.aggregator.tls(state, &api_service["spec"])?;
    let server_name =
        ServerName::try_from(destination.server_name.clone()).map_err(|e| e.to_string())?;
    let dial = async {
        let tcp = tokio::net::TcpStream::connect(address)
            .await
            .map_err(|e| format!("dial tcp {address}: {e}"))?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        tokio_rustls::TlsConnector::from(tls)
            .connect(server_name, tcp)
            .await
            .map_err(|e| format!("tls with {address}: {e}"))
    };
    let stream = tokio::time::timeout(DIAL_TIMEOUT, dial)
        .await
        .map_err(|_| format!("dial tcp {address}: timed out"))??;
    crate::server::http::upstream_connection(stream)
        .await
        .map_err(|e| e.to_string())
}

/// The headers that say who a proxied request is made as, in the names
/// `extension-apiserver-authentication` publishes.
pub(crate) fn identity_headers(
    name: &str,
    groups: &[String],
    extra: &std::collections::BTreeMap<String, Vec<String>>,
) -> http::HeaderMap {
    let mut headers = http::HeaderMap::new();
    let mut add = |header: &str, value: &str| {
        if let (Ok(header), Ok(value)) = (
            http::HeaderName::from_bytes(header.as_bytes()),
            http::HeaderValue::from_str(value),
        ) {
            headers.append(header, value);
        }
    };
    add("x-remote-user", name);
    for group in groups {
        add("x-remote-group", group);
    }
    for (key, values) in extra {
        // Keys may hold characters headers may not: escaped as upstream.
        let key = percent_encoding::utf8_percent_encode(key, EXTRA_KEY).to_string();
        for value in values {
            add(&format!("x-remote-extra-{key}"), value);
        }
    }
    headers
}

/// What an `X-Remote-Extra-` key escapes (all but RFC 7230 token
/// characters, less `%`).
const EXTRA_KEY: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'!')
    .remove(b'#')
    .remove(b'$')
    .remove(b'&')
    .remove(b'\'')
    .remove(b'*')
    .remove(b'+')
    .remove(b'-')
    .remove(b'.')
    .remove(b'^')
    .remove(b'_')
    .remove(b'`')
    .remove(b'|')
    .remove(b'~');

/// Whether a caller's header stays behind: nobody but this server says
/// who the user is to an extension server.
pub(crate) fn identity_header(name: &http::HeaderName) -> bool {
    let name = name.as_str();
    name.starts_with("x-remote-") || name.starts_with("impersonate-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_travels_in_headers() {
        let extra = [(
            "scopes.example.com/Who".to_owned(),
            vec!["a".to_owned(), "b".to_owned()],
        )]
        .into_iter()
        .collect();
        let headers = identity_headers("alice", &["devs".into(), "ops".into()], &extra);
        assert_eq!(headers["x-remote-user"], "alice");
        let groups: Vec<_> = headers.get_all("x-remote-group").iter().collect();
        assert_eq!(groups, ["devs", "ops"]);
        let extras: Vec<_> = headers
            .get_all("x-remote-extra-scopes.example.com%2fwho")
            .iter()
            .collect();
        assert_eq!(extras, ["a", "b"]);
        assert!(identity_header(&http::HeaderName::from_static(
            "x-remote-user"
        )));
        assert!(identity_header(&http::HeaderName::from_static(
            "impersonate-user"
        )));
        assert!(!identity_header(&http::HeaderName::from_static("accept")));
    }
}
