//! TLS termination: the certificate for a handshake is chosen by its SNI
//! name among the Ingresses' TLS hosts (exact, then `*.` wildcard), from
//! the `kubernetes.io/tls` Secrets they name, read at each handshake from
//! the current set, so a rotated Secret serves its new certificate without
//! a restart. A name no Ingress covers gets a self-signed default
//! certificate (as ingress-nginx's "fake" one). ALPN offers h2 and
//! http/1.1.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use parking_lot::{Mutex, RwLock};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::backends::TlsHost;

/// A Secret's resourceVersion and its certificate (none: unusable).
type Parsed = (String, Option<Arc<CertifiedKey>>);

/// The certificates by host, as the Secrets now are.
#[derive(Debug)]
pub(crate) struct Certificates {
    by_host: RwLock<HashMap<String, Arc<CertifiedKey>>>,
    /// Parsed Secrets by `(namespace, name)`, with the resourceVersion
    /// they were parsed at (a rebuild parses only what changed).
    parsed: Mutex<HashMap<(String, String), Parsed>>,
    fallback: Arc<CertifiedKey>,
}

impl Certificates {
    pub(crate) fn new() -> Result<Self, String> {
        Ok(Certificates {
            by_host: RwLock::default(),
            parsed: Mutex::default(),
            fallback: Arc::new(self_signed()?),
        })
    }

    /// Takes the TLS hosts of the routing table with their Secrets
    /// (`secret(namespace, name)`); a Secret that is missing or does not
    /// hold a usable certificate and key leaves its hosts on the fallback.
    pub(crate) fn update(
        &self,
        hosts: &[TlsHost],
        secret: impl Fn(&str, &str) -> Option<Arc<Secret>>,
    ) {
        let mut parsed = self.parsed.lock();
        let mut by_host = HashMap::new();
        let mut used = HashSet::new();
        for host in hosts {
            let key = (host.namespace.clone(), host.secret.clone());
            used.insert(key.clone());
            let Some(found) = secret(&host.namespace, &host.secret) else {
                continue;
            };
            let version = found.metadata.resource_version.clone().unwrap_or_default();
            let fresh = parsed.get(&key).is_some_and(|(v, _)| *v == version);
            if !fresh {
                let certified = match pem_pair(&found)
                    .and_then(|(cert, private)| certified_key(cert, private))
                {
                    Ok(certified) => Some(Arc::new(certified)),
                    Err(error) => {
                        tracing::warn!(secret = %format!("{}/{}", key.0, key.1), %error, "unusable TLS Secret");
                        None
                    }
                };
                parsed.insert(key.clone(), (version, certified));
            }
            if let Some((_, Some(certified))) = parsed.get(&key) {
                by_host.insert(host.host.clone(), certified.clone());
            }
        }
        parsed.retain(|key, _| used.contains(key));
        *self.by_host.write() = by_host;
    }

    /// The certificate for a name: its own, else its one-label wildcard's
    /// (a certificate's `*.` covers one label), else one for any name
    /// (`*`: a Gateway listener without a hostname), else the fallback.
    fn find(&self, name: &str) -> Arc<CertifiedKey> {
        let name = name.to_ascii_lowercase();
        let by_host = self.by_host.read();
        let wildcard = name.split_once('.').map(|(_, rest)| format!("*.{rest}"));
        by_host
            .get(&name)
            .or_else(|| wildcard.and_then(|w| by_host.get(&w)))
            .or_else(|| by_host.get("*"))
            .cloned()
            .unwrap_or_else(|| self.fallback.clone())
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(match hello.server_name() {
            Some(name) => self.find(name),
            None => self.fallback.clone(),
        })
    }
}

/// The server's TLS configuration around `certificates`.
pub(crate) fn server_config(certificates: Arc<Certificates>) -> rustls::ServerConfig {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap_or_else(|_| unreachable!("ring supports TLS 1.2 and 1.3"))
    .with_no_client_auth()
    .with_cert_resolver(certificates);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config
}

/// Whether a Secret holds a certificate chain and the key that belongs to
/// it.
pub(crate) fn usable(secret: &Secret) -> bool {
    pem_pair(secret)
        .and_then(|(cert, key)| certified_key(cert, key))
        .is_ok()
}

/// `tls.crt` and `tls.key` of a `kubernetes.io/tls` Secret.
fn pem_pair(secret: &Secret) -> Result<(&[u8], &[u8]), String> {
    let data = secret.data.as_ref().ok_or("no data")?;
    let cert = data.get("tls.crt").ok_or("no tls.crt")?;
    let key = data.get("tls.key").ok_or("no tls.key")?;
    Ok((&cert.0, &key.0))
}

fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("tls.crt: {e}"))?;
    if chain.is_empty() {
        return Err("tls.crt holds no certificate".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("tls.key: {e}"))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| format!("tls.key: {e}"))?;
    let certified = CertifiedKey::new(chain, signer);
    certified
        .keys_match()
        .map_err(|e| format!("tls.key does not belong to tls.crt: {e}"))?;
    Ok(certified)
}

fn self_signed() -> Result<CertifiedKey, String> {
    let mut params = rcgen::CertificateParams::new(vec!["ingress.portal.invalid".to_owned()])
        .map_err(|e| e.to_string())?;
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        "Portal Ingress Default Certificate",
    );
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    certified_key(cert.pem().as_bytes(), key.serialize_pem().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (Vec<u8>, Vec<u8>) {
        let params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem().into_bytes(), key.serialize_pem().into_bytes())
    }

    fn host(host: &str, secret: &str) -> TlsHost {
        TlsHost {
            host: host.into(),
            namespace: "default".into(),
            secret: secret.into(),
        }
    }

    fn secret(name: &str, (cert, key): &(Vec<u8>, Vec<u8>), version: &str) -> Arc<Secret> {
        use k8s_openapi::ByteString;
        Arc::new(Secret {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                resource_version: Some(version.into()),
                ..Default::default()
            },
            data: Some(
                [
                    ("tls.crt".to_owned(), ByteString(cert.clone())),
                    ("tls.key".to_owned(), ByteString(key.clone())),
                ]
                .into(),
            ),
            ..Default::default()
        })
    }

    #[test]
    fn names_pick_their_secret_and_others_the_fallback() {
        let certificates = Certificates::new().unwrap();
        let (a, wild) = (pair("a.test"), pair("*.wild.test"));
        let hosts = [
            host("a.test", "a"),
            host("*.wild.test", "wild"),
            host("b.test", "missing"),
        ];
        certificates.update(&hosts, |_, name| match name {
            "a" => Some(secret("a", &a, "1")),
            "wild" => Some(secret("wild", &wild, "1")),
            _ => None,
        });
        let cert_of = |name: &str| certificates.find(name).cert[0].clone();
        let a_cert = CertificateDer::from_pem_slice(&a.0).unwrap();
        assert_eq!(cert_of("a.test"), a_cert);
        assert_eq!(cert_of("A.TEST"), a_cert);
        assert_eq!(
            cert_of("x.wild.test"),
            CertificateDer::from_pem_slice(&wild.0).unwrap()
        );
        assert_eq!(cert_of("b.test"), certificates.fallback.cert[0]);
        assert_eq!(cert_of("x.y.wild.test"), certificates.fallback.cert[0]);
        // A new version of the Secret: its new certificate.
        let rotated = pair("a.test");
        certificates.update(&hosts, |_, name| {
            (name == "a").then(|| secret("a", &rotated, "2"))
        });
        assert_eq!(
            cert_of("a.test"),
            CertificateDer::from_pem_slice(&rotated.0).unwrap()
        );
        // A key of another certificate is refused.
        assert!(certified_key(&a.0, &rotated.1)
            .unwrap_err()
            .contains("does not belong"));
    }

    #[test]
    fn a_bad_secret_is_refused_with_a_reason() {
        assert!(certified_key(b"not pem", b"nor this")
            .unwrap_err()
            .contains("tls.crt"));
    }
}
