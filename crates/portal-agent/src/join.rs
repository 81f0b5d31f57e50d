//! Joining a cluster with a node token (ADR 0011; the wire format is
//! [`portal_api::join`]).
//!
//! The server's CA is fetched without trusting the connection and kept
//! only if its SHA-256 is the one the token carries; from then on the
//! server is verified against it. The node's key is made here once and
//! kept (`DIR/pki/node.key`); a certificate signing request with it and
//! the token's secret buys a client certificate for `system:node:NAME`.
//! The result is a kubeconfig (`DIR/node.kubeconfig`) and the CA the
//! agent's own API accepts (`DIR/pki/kubelet-client-ca.crt`).
//!
//! Every start joins again (a fresh certificate). While the server cannot
//! be reached, the credential of an earlier join is used if there is one;
//! else joining is retried. A refusal (wrong token, another CA, a name
//! taken by another machine) is final: the operator must act.

use std::path::{Path, PathBuf};
use std::time::Duration;

use portal_api::join::{
    node_kubeconfig, CredentialRequest, CredentialResponse, NodeToken, CACERTS_PATH,
    CREDENTIAL_PATH,
};

/// Why joining failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{server}: the CA it serves is not the one the token pins (another cluster, or someone in between)")]
    CaMismatch { server: String },
    #[error("{server} refused to let node {node:?} join: {status} {message}")]
    Refused {
        server: String,
        node: String,
        status: u16,
        message: String,
    },
    #[error("{server}: {message}")]
    Unreachable { server: String, message: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("node key: {0}")]
    Key(#[from] rcgen::Error),
}

/// What joining leaves on the node.
#[derive(Clone, Debug)]
pub struct Joined {
    /// The node's kubeconfig (client certificate, no token).
    pub kubeconfig: PathBuf,
    /// The CA whose client certificates may use the agent's API.
    pub client_ca: PathBuf,
}

/// How long one HTTP exchange may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The longest wait between attempts while the server is unreachable.
const MAX_RETRY: Duration = Duration::from_secs(10);
/// The most of a refusal's body shown.
const MAX_MESSAGE: usize = 512;

/// Joins `server` as `node`, keeping credentials under `dir`; retries
/// until the server answers (using an earlier credential meanwhile if
/// there is one).
pub async fn join(
    server: &str,
    token: &NodeToken,
    node: &str,
    dir: &Path,
) -> Result<Joined, Error> {
    let server = server.trim_end_matches('/');
    let joined = Joined {
        kubeconfig: dir.join("node.kubeconfig"),
        client_ca: dir.join("pki").join("kubelet-client-ca.crt"),
    };
    let mut delay = Duration::from_millis(500);
    loop {
        match join_once(server, token, node, dir, &joined).await {
            Err(Error::Unreachable { message, .. }) => {
                if joined.kubeconfig.exists() && joined.client_ca.exists() {
                    tracing::warn!(%server, %message, "cannot reach the server to join; using the credential of an earlier join");
                    return Ok(joined);
                }
                tracing::warn!(%server, %message, "cannot reach the server to join; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_RETRY);
            }
            other => return other.map(|()| joined),
        }
    }
}

async fn join_once(
    server: &str,
    token: &NodeToken,
    node: &str,
    dir: &Path,
    joined: &Joined,
) -> Result<(), Error> {
    let unreachable = |e: reqwest::Error| Error::Unreachable {
        server: server.to_owned(),
        message: crate::sources::url::error_chain(&e),
    };
    // Trust on first sight, checked against the token before any use.
    let blind = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .timeout(TIMEOUT)
        .build()
        .map_err(unreachable)?;
    let ca_pem = blind
        .get(format!("{server}{CACERTS_PATH}"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(unreachable)?
        .text()
        .await
        .map_err(unreachable)?;
    if !token.pins(&ca_pem) {
        return Err(Error::CaMismatch {
            server: server.to_owned(),
        });
    }
    let ca = reqwest::Certificate::from_pem(ca_pem.as_bytes()).map_err(unreachable)?;
    let verified = reqwest::Client::builder()
        .tls_certs_only([ca])
        .timeout(TIMEOUT)
        .build()
        .map_err(unreachable)?;

    let key = node_key(&dir.join("pki"))?;
    let csr = rcgen::CertificateParams::default()
        .serialize_request(&key)?
        .pem()?;
    let request = CredentialRequest {
        node_name: node.to_owned(),
        csr,
    };
    let response = verified
        .post(format!("{server}{CREDENTIAL_PATH}"))
        .bearer_auth(&token.secret)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&request).unwrap_or_default())
        .send()
        .await
        .map_err(unreachable)?;
    let status = response.status();
    // The server's trouble (a store error, overload) is passing: retried,
    // or an earlier credential used; a refusal is the operator's to fix.
    if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
        return Err(Error::Unreachable {
            server: server.to_owned(),
            message: format!("answered {status}"),
        });
    }
    if !status.is_success() {
        let mut message = response.text().await.unwrap_or_default();
        message.truncate(MAX_MESSAGE);
        return Err(Error::Refused {
            server: server.to_owned(),
            node: node.to_owned(),
            status: status.as_u16(),
            message,
        });
    }
    let body = response.bytes().await.map_err(unreachable)?;
    let answer: CredentialResponse =
        serde_json::from_slice(&body).map_err(|e| Error::Unreachable {
            server: server.to_owned(),
            message: format!("not a node credential: {e}"),
        })?;
    if !token.pins(&answer.ca) {
        return Err(Error::CaMismatch {
            server: server.to_owned(),
        });
    }
    write_private(&joined.client_ca, answer.kubelet_client_ca.as_bytes())?;
    let config = node_kubeconfig(
        server,
        &answer.ca,
        &answer.certificate,
        &key.serialize_pem(),
        node,
    );
    write_private(&joined.kubeconfig, config.as_bytes())?;
    tracing::info!(%server, %node, "joined the cluster with a node certificate");
    Ok(())
}

/// The node's key: made once, kept (the server remembers it per name).
fn node_key(pki: &Path) -> Result<rcgen::KeyPair, Error> {
    let path = pki.join("node.key");
    match std::fs::read_to_string(&path) {
        Ok(pem) => rcgen::KeyPair::from_pem(&pem).map_err(Error::from),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = rcgen::KeyPair::generate()?;
            write_private(&path, key.serialize_pem().as_bytes())?;
            Ok(key)
        }
        Err(source) => Err(Error::Io { path, source }),
    }
}

/// Writes a file only its owner reads, atomically.
fn write_private(path: &Path, contents: &[u8]) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| Error::Io { path, source }
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io(&tmp))?;
    file.write_all(contents).map_err(io(&tmp))?;
    file.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}
