//! Nodes joining the cluster (ADR 0011, k3s's scheme; wire format in
//! [`portal_api::join`]). `portal server` keeps a node token in
//! `DIR/node-token`. A node that shows its secret with a certificate
//! signing request gets a client certificate for `system:node:NAME`
//! (group `system:nodes`) signed by the cluster CA, and the CA whose
//! certificates the agent's own API accepts. Only the request's key is
//! used: subject, usages and lifetime are the server's. The node's private
//! key never leaves it, and it never holds the admin token.
//!
//! A node name stays with the key that first joined under it while its
//! Node object exists: another machine with the token cannot take over a
//! live node's identity (k3s's node password, by public key here).

use portal_api::kinds;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use http::{header, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use portal_api::join::{
    CredentialRequest, CredentialResponse, NodeToken, NODES_GROUP, NODE_USER_PREFIX,
};
use portal_api::Status;
use rand::Rng;
use rcgen::{
    CertificateParams, CertificateSigningRequestParams, DnType, ExtendedKeyUsagePurpose, Issuer,
    KeyPair, KeyUsagePurpose, PublicKeyData,
};

use crate::security::issuing::CertificateAuthority;
use crate::security::pki::{self, write_private};
use crate::server::http::{json_response, text_response, Body, RequestBody};

/// The largest credential request read.
const MAX_REQUEST: usize = 64 * 1024;
/// How long a node certificate lasts (kubelets renew theirs; Portal's
/// agents join again with the token when theirs runs out).
const CERTIFICATE_DAYS: i64 = 365;
/// What the server needs to let nodes join.
pub(crate) struct Joining {
    pub(crate) ca_pem: String,
    pub(crate) kubelet_client_ca_pem: String,
    pub(crate) secret: String,
    pub(crate) issuer: Arc<Issuer<'static, KeyPair>>,
    /// The same CA, for certificates of approved requests.
    pub(crate) authority: Arc<CertificateAuthority>,
    /// `DIR/pki/nodes`: the public key each node name joined with.
    pub(crate) pins: PathBuf,
    /// Held while a join decides on its name.
    pub(crate) pinning: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Joining {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Joining").finish_non_exhaustive()
    }
}

/// Loads (or makes) the node token in `dir/node-token`; its secret.
pub(crate) fn load_or_create_token(dir: &Path, ca_pem: &str) -> Result<String, pki::Error> {
    let path = dir.join("node-token");
    if let Ok(text) = std::fs::read_to_string(&path) {
        match text.parse::<NodeToken>() {
            Ok(token) if token.pins(ca_pem) => return Ok(token.secret),
            _ => {
                tracing::warn!(path = %path.display(), "node token does not match the cluster CA: made anew")
            }
        }
    }
    let bytes: [u8; 24] = rand::rng().random();
    let secret: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let token = NodeToken::new(ca_pem, &secret);
    write_private(&path, format!("{token}\n").as_bytes())?;
    Ok(secret)
}

/// Constant-time equality (tokens, secrets).
pub(crate) fn same_secret(given: &[u8], want: &[u8]) -> bool {
    given.len() == want.len()
        && given
            .iter()
            .zip(want)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// `GET /cacerts`: the cluster CA bundle, exactly the bytes tokens hash.
pub(crate) fn cacerts(joining: &Joining) -> Response<Body> {
    let mut response = text_response(StatusCode::OK, joining.ca_pem.clone());
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/x-pem-file"),
    );
    response
}

/// `POST /portal/v1/node-credential`, `Authorization: Bearer <secret>`.
pub(crate) async fn node_credential(
    state: &crate::ApiState,
    request: Request<RequestBody>,
) -> Result<Response<Body>, Status> {
    let joining = &state.joining;
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if !same_secret(given.trim().as_bytes(), joining.secret.as_bytes()) {
        return Err(Status::unauthorized());
    }
    let body = Limited::new(request.into_body(), MAX_REQUEST)
        .collect()
        .await
        .map_err(|e| Status::bad_request(format!("reading the request: {e}")))?
        .to_bytes();
    let wanted: CredentialRequest = serde_json::from_slice(&body)
        .map_err(|e| Status::bad_request(format!("not a node credential request: {e}")))?;
    let problems = portal_api::name::dns1123_subdomain(&wanted.node_name);
    if !problems.is_empty() {
        return Err(Status::bad_request(format!(
            "node name {:?}: {}",
            wanted.node_name,
            problems.join("; ")
        )));
    }
    let csr = CertificateSigningRequestParams::from_pem(&wanted.csr)
        .map_err(|e| Status::bad_request(format!("certificate signing request: {e}")))?;
    let key_hash = portal_api::join::ca_hash_bytes(csr.public_key.der_bytes());
    pin(state, &wanted.node_name, &key_hash).await?;
    let certificate = sign(joining, &wanted.node_name, csr)
        .map_err(|e| Status::internal(format!("signing the node certificate: {e}")))?;
    tracing::info!(node = %wanted.node_name, "issued a node certificate");
    let answer = CredentialResponse {
        certificate,
        ca: joining.ca_pem.clone(),
        kubelet_client_ca: joining.kubelet_client_ca_pem.clone(),
    };
    Ok(json_response(
        StatusCode::OK,
        serde_json::to_vec(&answer).unwrap_or_default(),
    ))
}

/// Remembers the key a node name joined with. A name whose Node exists
/// keeps its key: another one (or one for a Node registered without
/// joining, like this server's own before it pinned) is refused.
async fn pin(state: &crate::ApiState, node: &str, key_hash: &str) -> Result<(), Status> {
    let joining = &state.joining;
    // One join at a time: two machines racing for a new name must not both win.
    let _one = joining.pinning.lock().await;
    if joining.pinned(node).as_deref() == Some(key_hash) {
        return Ok(());
    }
    let key = kinds::node::RESOURCE.key(None, node);
    if crate::registry::lookup::stored(state, &key)
        .await?
        .is_some()
    {
        return Err(Status::forbidden(format!(
            "node {node:?} already joined with another key; delete the Node to join under that name again"
        )));
    }
    joining
        .write_pin(node, key_hash)
        .map_err(|e| Status::internal(e.to_string()))
}

impl Joining {
    /// The key hash `node` joined with, if it did.
    pub(crate) fn pinned(&self, node: &str) -> Option<String> {
        std::fs::read_to_string(self.pins.join(node))
            .ok()
            .map(|text| text.trim().to_owned())
    }

    fn write_pin(&self, node: &str, key_hash: &str) -> Result<(), pki::Error> {
        std::fs::create_dir_all(&self.pins).map_err(|source| pki::Error::Io {
            path: self.pins.clone(),
            source,
        })?;
        write_private(&self.pins.join(node), key_hash.as_bytes())
    }

    /// Whether a node certificate with this public key is still the one
    /// its node joined with: a node that joined again, or whose record
    /// was removed (`DIR/pki/nodes/NAME`), loses its old certificates.
    pub(crate) fn current(&self, node: &str, public_key: &[u8]) -> bool {
        self.pinned(node).as_deref() == Some(portal_api::join::ca_hash_bytes(public_key).as_str())
    }
}

/// The node certificate for `csr`'s key: only the key is taken from the
/// request; subject, usages and lifetime are the server's.
fn sign(
    joining: &Joining,
    node: &str,
    mut csr: CertificateSigningRequestParams,
) -> Result<String, rcgen::Error> {
    csr.params = node_params(node)?;
    Ok(csr.signed_by(joining.issuer.as_ref())?.pem())
}

fn node_params(node: &str) -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, format!("{NODE_USER_PREFIX}{node}"));
    params
        .distinguished_name
        .push(DnType::OrganizationName, NODES_GROUP);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let now = time_now();
    params.not_before = now - std::time::Duration::from_secs(300);
    params.not_after = now + std::time::Duration::from_secs(CERTIFICATE_DAYS as u64 * 86_400);
    Ok(params)
}

fn time_now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

/// A kubeconfig for this server's own node (`portal server`'s agent and
/// proxy): a fresh key and certificate, signed here, no token.
pub(crate) fn own_node_kubeconfig(
    joining: &Joining,
    server: &str,
    node: &str,
) -> Result<String, pki::Error> {
    let key = KeyPair::generate()?;
    let cert = node_params(node)?.signed_by(&key, joining.issuer.as_ref())?;
    // This node's name is its own: no machine with the token takes it.
    let hash = portal_api::join::ca_hash_bytes(key.public_key_raw());
    joining.write_pin(node, &hash)?;
    Ok(portal_api::join::node_kubeconfig(
        server,
        &joining.ca_pem,
        &cert.pem(),
        &key.serialize_pem(),
        node,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_kept_and_pins_the_ca() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create_token(dir.path(), "CA one").unwrap();
        assert_eq!(load_or_create_token(dir.path(), "CA one").unwrap(), first);
        let text = std::fs::read_to_string(dir.path().join("node-token")).unwrap();
        let token: NodeToken = text.parse().unwrap();
        assert!(token.pins("CA one"));
        assert_eq!(token.secret, first);
        // Another CA (a data dir restored elsewhere): a token for it.
        assert_ne!(load_or_create_token(dir.path(), "CA two").unwrap(), first);
    }

    #[test]
    fn only_the_key_of_a_request_is_signed() {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.clone().self_signed(&ca_key).unwrap();
        let ca_pem = ca_cert.pem();
        let authority = CertificateAuthority {
            certificate: ca_cert.der().to_vec(),
            key: KeyPair::from_pem(&ca_key.serialize_pem()).unwrap(),
        };
        let joining = Joining {
            ca_pem,
            kubelet_client_ca_pem: String::new(),
            secret: "s".into(),
            issuer: Arc::new(Issuer::new(ca, ca_key)),
            authority: Arc::new(authority),
            pins: PathBuf::new(),
            pinning: tokio::sync::Mutex::new(()),
        };
        let node_key = KeyPair::generate().unwrap();
        let mut asked = CertificateParams::new(vec!["evil".to_owned()]).unwrap();
        asked
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        let csr_pem = asked.serialize_request(&node_key).unwrap().pem().unwrap();
        let csr = CertificateSigningRequestParams::from_pem(&csr_pem).unwrap();
        let pem = sign(&joining, "n2", csr).unwrap();
        use rustls_pki_types::pem::PemObject;
        let der = rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let joining = Joining {
            pins: dir.path().to_owned(),
            ..joining
        };
        // Not pinned: not a user.
        assert_eq!(
            crate::security::user::user_of_certificate(&der, &joining),
            None
        );
        let hash = portal_api::join::ca_hash_bytes(node_key.public_key_raw());
        joining.write_pin("n2", &hash).unwrap();
        let user = crate::security::user::user_of_certificate(&der, &joining).unwrap();
        assert_eq!(user.node(), Some("n2"));
        // Joined again with another key: the old certificate is done.
        joining.write_pin("n2", "another").unwrap();
        assert_eq!(
            crate::security::user::user_of_certificate(&der, &joining),
            None
        );
    }
}
