//! Credentials made on first start and kept in the data directory: a cluster
//! CA, the API server's serving certificate (re-issued from that CA at every
//! start, so new addresses are covered), the admin bearer token, and the
//! admin kubeconfig that carries them to clients.

use std::fs;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use rand::Rng;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};

use crate::security::issuing::CertificateAuthority;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("certificate generation failed: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("{path}: not a valid PEM file: {reason}")]
    Pem { path: PathBuf, reason: String },
    #[error("TLS configuration failed: {0}")]
    Tls(#[from] rustls::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes a file atomically (temp + rename) readable only by its owner.
pub fn write_private(path: &Path, contents: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io(&tmp))?;
    file.write_all(contents).map_err(io(&tmp))?;
    file.sync_all().map_err(io(&tmp))?;
    fs::rename(&tmp, path).map_err(io(path))
}

/// The cluster's credentials, loaded or created.
pub struct Credentials {
    pub ca_pem: String,
    pub token: String,
    pub tls: Arc<rustls::ServerConfig>,
    /// Signs node certificates (`join`).
    pub(crate) issuer: Arc<Issuer<'static, KeyPair>>,
    /// Signs approved CertificateSigningRequests.
    pub(crate) authority: Arc<CertificateAuthority>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").finish_non_exhaustive()
    }
}

fn ca_params() -> Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "portal-ca");
    dn.push(DnType::OrganizationName, "portal");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

fn read_or_create(path: &Path, create: impl FnOnce() -> Result<String>) -> Result<String> {
    match fs::read_to_string(path) {
        Ok(existing) => Ok(existing),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let fresh = create()?;
            write_private(path, fresh.as_bytes())?;
            Ok(fresh)
        }
        Err(e) => Err(io(path)(e)),
    }
}

/// Loads the CA and token from `dir` (creating them on first start) and
/// issues a serving certificate for `names` and `ips`.
pub fn load_or_create(dir: &Path, names: &[String], ips: &[IpAddr]) -> Result<Credentials> {
    let pki = dir.join("pki");
    fs::create_dir_all(&pki).map_err(io(&pki))?;
    let ca_key_path = pki.join("ca.key");
    let ca_cert_path = pki.join("ca.crt");
    let ca_key_pem = read_or_create(&ca_key_path, || Ok(KeyPair::generate()?.serialize_pem()))?;
    let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(|e| Error::Pem {
        path: ca_key_path.clone(),
        reason: e.to_string(),
    })?;
    let ca_pem = read_or_create(&ca_cert_path, || {
        Ok(ca_params()?.self_signed(&ca_key)?.pem())
    })?;
    let issuer = Issuer::new(ca_params()?, ca_key);
    let ca_der = CertificateDer::from_pem_slice(ca_pem.as_bytes()).map_err(|e| Error::Pem {
        path: ca_cert_path.clone(),
        reason: e.to_string(),
    })?;
    let authority = CertificateAuthority {
        certificate: ca_der.to_vec(),
        key: KeyPair::from_pem(&ca_key_pem).map_err(|e| Error::Pem {
            path: ca_key_path.clone(),
            reason: e.to_string(),
        })?,
    };

    let mut params = CertificateParams::new(names.to_vec())?;
    params
        .distinguished_name
        .push(DnType::CommonName, "portal-apiserver");
    params
        .subject_alt_names
        .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    write_private(&pki.join("apiserver.crt"), cert.pem().as_bytes())?;
    write_private(&pki.join("apiserver.key"), key.serialize_pem().as_bytes())?;

    let token_path = dir.join("admin.token");
    let token = read_or_create(&token_path, || {
        let bytes: [u8; 32] = rand::rng().random();
        Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
    })?
    .trim()
    .to_owned();

    let chain = vec![cert.der().clone(), ca_der.clone()];
    let private =
        PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).map_err(|e| Error::Pem {
            path: pki.join("apiserver.key"),
            reason: e.to_string(),
        })?;
    // Client certificates of the cluster CA identify users (nodes); a
    // client without one may still present the bearer token.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca_der)?;
    let clients = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| rustls::Error::General(e.to_string()))?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(clients)
        .with_single_cert(chain, private)?;
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Credentials {
        ca_pem,
        token,
        tls: Arc::new(tls),
        issuer: Arc::new(issuer),
        authority: Arc::new(authority),
    })
}

/// What the API server presents to node agents: a client certificate from
/// a CA of its own (`pki/kubelet-client-ca.crt`, the file agents are given
/// as `--client-ca-file`), so that no other credential of the cluster
/// opens an agent's exec.
#[derive(Debug)]
pub struct AgentClient {
    pub ca_path: PathBuf,
    pub ca_pem: String,
    pub tls: Arc<rustls::ClientConfig>,
}

/// Loads (or makes) the agents' client CA and issues this server's client
/// certificate from it.
pub fn agent_client(dir: &Path) -> Result<AgentClient> {
    let pki = dir.join("pki");
    let (ca_path, ca_pem, issuer) = own_ca(&pki, "kubelet-client-ca", "portal-kubelet-client-ca")?;
    let (chain, private) = client_identity(
        &issuer,
        &ca_path,
        "portal-apiserver-kubelet-client",
        Some("system:masters"),
    )?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyAgent(provider)))
        .with_client_auth_cert(chain, private)?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(AgentClient {
        ca_path,
        ca_pem,
        tls: Arc::new(tls),
    })
}

/// What the API server presents to extension API servers it proxies to
/// (API aggregation): a client certificate `CN=front-proxy-client` from a
/// CA of its own (`pki/front-proxy-ca.crt`, published as
/// `requestheader-client-ca-file`), whose holder may say who the user is
/// in `X-Remote-*` headers.
pub struct FrontProxy {
    pub ca_pem: String,
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl std::fmt::Debug for FrontProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontProxy").finish_non_exhaustive()
    }
}

/// The name extension servers allow (`requestheader-allowed-names`).
pub const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

/// Loads (or makes) the front-proxy CA and issues this server's client
/// certificate from it.
pub fn front_proxy(dir: &Path) -> Result<FrontProxy> {
    let pki = dir.join("pki");
    let (ca_path, ca_pem, issuer) = own_ca(&pki, "front-proxy-ca", "portal-front-proxy-ca")?;
    let (chain, key) = client_identity(&issuer, &ca_path, FRONT_PROXY_CLIENT, None)?;
    Ok(FrontProxy { ca_pem, chain, key })
}

/// A CA of one purpose in `pki/STEM.{crt,key}`, made on first start: its
/// path, certificate and issuer.
fn own_ca(
    pki: &Path,
    stem: &str,
    common_name: &str,
) -> Result<(PathBuf, String, Issuer<'static, KeyPair>)> {
    fs::create_dir_all(pki).map_err(io(pki))?;
    let key_path = pki.join(format!("{stem}.key"));
    let ca_path = pki.join(format!("{stem}.crt"));
    let key_pem = read_or_create(&key_path, || Ok(KeyPair::generate()?.serialize_pem()))?;
    let ca_key = KeyPair::from_pem(&key_pem).map_err(|e| Error::Pem {
        path: key_path.clone(),
        reason: e.to_string(),
    })?;
    let mut ca = ca_params()?;
    ca.distinguished_name = DistinguishedName::new();
    ca.distinguished_name.push(DnType::CommonName, common_name);
    let ca_pem = read_or_create(&ca_path, || Ok(ca.clone().self_signed(&ca_key)?.pem()))?;
    Ok((ca_path, ca_pem, Issuer::new(ca, ca_key)))
}

/// A fresh client certificate of `issuer` (whose certificate is at
/// `ca_path`): the chain to present and its key.
fn client_identity(
    issuer: &Issuer<'static, KeyPair>,
    ca_path: &Path,
    common_name: &str,
    organization: Option<&str>,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    if let Some(organization) = organization {
        params
            .distinguished_name
            .push(DnType::OrganizationName, organization);
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    let ca_pem = fs::read(ca_path).map_err(io(ca_path))?;
    let chain = vec![
        cert.der().clone(),
        CertificateDer::from_pem_slice(&ca_pem).map_err(|e| Error::Pem {
            path: ca_path.to_owned(),
            reason: e.to_string(),
        })?,
    ];
    let private =
        PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).map_err(|e| Error::Pem {
            path: ca_path.to_owned(),
            reason: e.to_string(),
        })?;
    Ok((chain, private))
}

/// A verifier that checks a server's signatures but not who issued its
/// certificate: agents', and extension servers' with
/// `insecureSkipTLSVerify`.
pub(crate) fn any_server(
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Arc<dyn rustls::client::danger::ServerCertVerifier> {
    Arc::new(AnyAgent(provider))
}

/// Agents serve with certificates they make themselves; like
/// kube-apiserver without `--kubelet-certificate-authority`, the server
/// checks their signatures but not who issued them.
#[derive(Debug)]
struct AnyAgent(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyAgent {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The names and addresses a serving certificate must cover for `bind`.
/// The serving certificate's names: loopback, the bind address, and
/// `extra` (the advertised node address and the `kubernetes` Service's
/// cluster IP, which in-cluster clients connect to by address).
pub fn serving_names(bind: SocketAddr, extra: &[IpAddr]) -> (Vec<String>, Vec<IpAddr>) {
    let names = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
    ]
    .map(String::from)
    .to_vec();
    let mut ips: Vec<IpAddr> = vec![[127, 0, 0, 1].into(), std::net::Ipv6Addr::LOCALHOST.into()];
    for ip in std::iter::once(bind.ip()).chain(extra.iter().copied()) {
        if !ip.is_unspecified() && !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    (names, ips)
}

/// An admin kubeconfig for `server` (e.g. `https://127.0.0.1:6443`).
pub fn kubeconfig(server: &str, ca_pem: &str, token: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: portal\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: admin\n  user:\n    token: {token}\ncontexts:\n- name: portal\n  context:\n    cluster: portal\n    user: admin\n    namespace: default\ncurrent-context: portal\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_persist_across_starts() {
        let dir = tempfile::tempdir().unwrap();
        let (names, ips) = serving_names(
            "127.0.0.1:0".parse().unwrap(),
            &["10.96.0.1".parse().unwrap()],
        );
        let first = load_or_create(dir.path(), &names, &ips).unwrap();
        let second = load_or_create(dir.path(), &names, &ips).unwrap();
        assert_eq!(first.ca_pem, second.ca_pem);
        assert_eq!(first.token, second.token);
        assert_eq!(first.token.len(), 64);
        let config = kubeconfig("https://127.0.0.1:1", &first.ca_pem, &first.token);
        assert!(config.contains(&first.token));
    }
}
