//! Client certificates for approved CertificateSigningRequests, as
//! upstream's signer makes them: the request's own subject, byte for byte
//! (so a user with several groups keeps every `O`, whether the request
//! put them in one multi-valued name or in several), its public key, the
//! usages the request was approved for, and the cluster CA as issuer.
//!
//! rcgen, which makes Portal's other certificates, keeps one value per
//! name attribute; certificates issued for other people's requests are
//! therefore assembled here from the X.509 structures of `x509-cert` and
//! signed with the CA's key.

use std::path::Path;
use std::time::SystemTime;

use base64::Engine as _;

use rcgen::{KeyPair, PublicKeyData as _, SigningKey as _};
use x509_cert::der::asn1::{BitString, GeneralizedTime, OctetString, UtcTime};
use x509_cert::der::oid::db::rfc5280::{ID_CE_SUBJECT_KEY_IDENTIFIER, ID_KP_CLIENT_AUTH};
use x509_cert::der::oid::{AssociatedOid, ObjectIdentifier};
use x509_cert::der::{Any, Decode, Encode, EncodePem as _};
use x509_cert::ext::pkix::{
    AuthorityKeyIdentifier, BasicConstraints, ExtendedKeyUsage, KeyUsage, KeyUsages,
    SubjectKeyIdentifier,
};
use x509_cert::ext::Extension;
use x509_cert::name::{Name, RdnSequence, RelativeDistinguishedName};
use x509_cert::request::CertReq;
use x509_cert::serial_number::SerialNumber;
use x509_cert::spki::{AlgorithmIdentifierOwned, SubjectPublicKeyInfoOwned};
use x509_cert::time::{Time, Validity};
use x509_cert::{Certificate, TbsCertificate, Version};

/// The cluster CA: its certificate and the key that signs with it.
pub(crate) struct CertificateAuthority {
    /// The CA certificate (DER), whose subject names the issuer.
    pub(crate) certificate: Vec<u8>,
    pub(crate) key: KeyPair,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .finish_non_exhaustive()
    }
}

/// What a client certificate may be used for besides client auth.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usages {
    pub(crate) digital_signature: bool,
    pub(crate) key_encipherment: bool,
}

impl CertificateAuthority {
    /// A client certificate (PEM) for the PKCS#10 request `request` (DER,
    /// its signature already checked), valid from `not_before` to
    /// `not_after`.
    pub(crate) fn issue_client(
        &self,
        request: &[u8],
        usages: Usages,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<String, String> {
        let request = CertReq::from_der(request).map_err(|e| format!("the request: {e}"))?;
        self.issue(
            request.info.subject,
            request.info.public_key,
            usages,
            not_before,
            not_after,
        )
    }

    /// A client certificate (PEM) for `subject` holding `public_key`.
    fn issue(
        &self,
        subject: Name,
        public_key: SubjectPublicKeyInfoOwned,
        usages: Usages,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<String, String> {
        let ca = Certificate::from_der(&self.certificate).map_err(|e| format!("the CA: {e}"))?;
        let algorithm = self.signature_algorithm()?;
        let mut extensions = vec![
            extension(&BasicConstraints {
                ca: false,
                path_len_constraint: None,
            })?,
            extension(&ExtendedKeyUsage(vec![ID_KP_CLIENT_AUTH]))?,
        ];
        let mut key_usage = KeyUsage(Default::default());
        if usages.digital_signature {
            key_usage.0 |= KeyUsages::DigitalSignature;
        }
        if usages.key_encipherment {
            key_usage.0 |= KeyUsages::KeyEncipherment;
        }
        if !key_usage.0.is_empty() {
            extensions.insert(0, extension(&key_usage)?);
        }
        if let Some(key_identifier) = subject_key_identifier(&ca) {
            extensions.push(extension(&AuthorityKeyIdentifier {
                key_identifier: Some(key_identifier),
                authority_cert_issuer: None,
                authority_cert_serial_number: None,
            })?);
        }
        let tbs = TbsCertificate {
            version: Version::V3,
            serial_number: serial()?,
            signature: algorithm.clone(),
            issuer: ca.tbs_certificate.subject.clone(),
            validity: Validity {
                not_before: time(not_before)?,
                not_after: time(not_after)?,
            },
            subject,
            subject_public_key_info: public_key,
            issuer_unique_id: None,
            subject_unique_id: None,
            extensions: Some(extensions),
        };
        let signed = tbs.to_der().map_err(|e| e.to_string())?;
        let signature = self
            .key
            .sign(&signed)
            .map_err(|e| format!("signing failed: {e}"))?;
        Certificate {
            tbs_certificate: tbs,
            signature_algorithm: algorithm,
            signature: BitString::from_bytes(&signature).map_err(|e| e.to_string())?,
        }
        .to_pem(x509_cert::der::pem::LineEnding::LF)
        .map_err(|e| e.to_string())
    }

    /// The AlgorithmIdentifier of signatures by the CA's key.
    fn signature_algorithm(&self) -> Result<AlgorithmIdentifierOwned, String> {
        let algorithm = self.key.algorithm();
        let (oid, null_parameters) = if algorithm == &rcgen::PKCS_ECDSA_P256_SHA256 {
            ("1.2.840.10045.4.3.2", false)
        } else if algorithm == &rcgen::PKCS_ECDSA_P384_SHA384 {
            ("1.2.840.10045.4.3.3", false)
        } else if algorithm == &rcgen::PKCS_ED25519 {
            ("1.3.101.112", false)
        } else if algorithm == &rcgen::PKCS_RSA_SHA256 {
            ("1.2.840.113549.1.1.11", true)
        } else if algorithm == &rcgen::PKCS_RSA_SHA384 {
            ("1.2.840.113549.1.1.12", true)
        } else if algorithm == &rcgen::PKCS_RSA_SHA512 {
            ("1.2.840.113549.1.1.13", true)
        } else {
            return Err(format!(
                "the CA key's algorithm {algorithm:?} cannot sign here"
            ));
        };
        Ok(AlgorithmIdentifierOwned {
            oid: ObjectIdentifier::new_unwrap(oid),
            // RSA's identifiers carry an explicit NULL (RFC 4055), ECDSA's
            // and Ed25519's none (RFC 5758, RFC 8410).
            parameters: null_parameters.then(Any::null),
        })
    }
}

/// `value` as a certificate extension; key usage and basic constraints
/// are critical, as RFC 5280 asks.
fn extension<T: AssociatedOid + Encode>(value: &T) -> Result<Extension, String> {
    let critical = T::OID == KeyUsage::OID || T::OID == BasicConstraints::OID;
    Ok(Extension {
        extn_id: T::OID,
        critical,
        extn_value: OctetString::new(value.to_der().map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?,
    })
}

/// The CA's subject key identifier, which the issued certificate names as
/// its authority key identifier (so clients pick the right CA).
fn subject_key_identifier(ca: &Certificate) -> Option<OctetString> {
    let extension = ca
        .tbs_certificate
        .extensions
        .as_ref()?
        .iter()
        .find(|e| e.extn_id == ID_CE_SUBJECT_KEY_IDENTIFIER)?;
    SubjectKeyIdentifier::from_der(extension.extn_value.as_bytes())
        .ok()
        .map(|id| id.0)
}

/// A random positive 128-bit serial number, as upstream's signer.
fn serial() -> Result<SerialNumber, String> {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    SerialNumber::new(&bytes).map_err(|e| e.to_string())
}

/// RFC 5280: UTCTime through 2049, GeneralizedTime after.
fn time(at: SystemTime) -> Result<Time, String> {
    match UtcTime::from_system_time(at) {
        Ok(utc) => Ok(Time::UtcTime(utc)),
        Err(_) => GeneralizedTime::from_system_time(at)
            .map(Time::GeneralTime)
            .map_err(|e| e.to_string()),
    }
}

/// A user's name as a certificate subject: `CN` the user, one `O` per
/// group (one name each, as `openssl req -subj /CN=u/O=a/O=b` writes).
fn subject(user: &str, groups: &[String]) -> Result<Name, String> {
    // id-at-commonName and id-at-organizationName (RFC 4519).
    let attribute = |oid: &str, value: &str| -> Result<RelativeDistinguishedName, String> {
        let value = x509_cert::der::asn1::Utf8StringRef::new(value).map_err(|e| e.to_string())?;
        let attribute = x509_cert::attr::AttributeTypeAndValue {
            oid: ObjectIdentifier::new_unwrap(oid),
            value: Any::from(value),
        };
        x509_cert::der::asn1::SetOfVec::try_from(vec![attribute])
            .map(RelativeDistinguishedName)
            .map_err(|e| e.to_string())
    };
    let mut names = vec![attribute("2.5.4.3", user)?];
    for group in groups {
        names.push(attribute("2.5.4.10", group)?);
    }
    Ok(RdnSequence(names))
}

/// What `portal kubeconfig` makes a kubeconfig for.
#[derive(Debug, Clone)]
pub struct UserCredential {
    pub user: String,
    pub groups: Vec<String>,
    pub lifetime: std::time::Duration,
    /// The API server's URL; by default the one of `DIR/kubeconfig`.
    pub server: Option<String>,
}

/// A kubeconfig for `wanted.user` with a fresh key and a client
/// certificate of the cluster CA in `data_dir/pki` (as `kubeadm kubeconfig
/// user`): how Portal's components run apart from `portal server` with
/// their own least-privilege identity, and how an admin gives a person
/// access without a CertificateSigningRequest round trip.
pub fn user_kubeconfig(data_dir: &Path, wanted: &UserCredential) -> Result<String, String> {
    if wanted.user.is_empty() {
        return Err("a user name is needed".into());
    }
    let pki = data_dir.join("pki");
    let read = |name: &str| {
        std::fs::read_to_string(pki.join(name)).map_err(|e| {
            format!(
                "{}: {e} (run this where the API server keeps its data)",
                pki.join(name).display()
            )
        })
    };
    let (ca_pem, ca_key) = (read("ca.crt")?, read("ca.key")?);
    let certificate = pem_contents(&ca_pem)?;
    let authority = CertificateAuthority {
        certificate,
        key: KeyPair::from_pem(&ca_key).map_err(|e| format!("pki/ca.key: {e}"))?,
    };
    let server = match &wanted.server {
        Some(server) => server.clone(),
        None => server_of(&data_dir.join("kubeconfig"))?,
    };
    let key = KeyPair::generate().map_err(|e| e.to_string())?;
    let public_key = SubjectPublicKeyInfoOwned::from_der(&key.subject_public_key_info())
        .map_err(|e| e.to_string())?;
    let now = SystemTime::now();
    let certificate = authority.issue(
        subject(&wanted.user, &wanted.groups)?,
        public_key,
        Usages {
            digital_signature: true,
            key_encipherment: true,
        },
        now - std::time::Duration::from_secs(300),
        now + wanted.lifetime,
    )?;
    let base64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "portal", "cluster": {
            "server": server, "certificate-authority-data": base64(&ca_pem)}}],
        "users": [{"name": wanted.user, "user": {
            "client-certificate-data": base64(&certificate),
            "client-key-data": base64(&key.serialize_pem())}}],
        "contexts": [{"name": "portal", "context": {"cluster": "portal", "user": wanted.user}}],
        "current-context": "portal",
    });
    serde_yaml_ng::to_string(&config).map_err(|e| e.to_string())
}

/// The first certificate of a PEM text, as DER.
fn pem_contents(pem: &str) -> Result<Vec<u8>, String> {
    x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map(|(_, pem)| pem.contents)
        .map_err(|e| format!("pki/ca.crt: {e}"))
}

/// The server URL of the kubeconfig at `path`.
fn server_of(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "{}: {e} (give the API server's URL with --server)",
            path.display()
        )
    })?;
    let config: serde_json::Value =
        serde_yaml_ng::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    config["clusters"][0]["cluster"]["server"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("{} names no server", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use x509_parser::prelude::FromDer as _;

    fn authority() -> CertificateAuthority {
        let key = KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "test-ca");
        let certificate = params.self_signed(&key).unwrap().der().to_vec();
        CertificateAuthority { certificate, key }
    }

    /// A request for CN=alice in two groups, as `openssl req -subj
    /// /CN=alice/O=devs/O=ops` makes it (one name per value).
    fn request() -> Vec<u8> {
        let key = KeyPair::generate().unwrap();
        let one_name = rcgen::CertificateParams::default()
            .serialize_request(&key)
            .unwrap();
        // The same request for another subject: the subject is the
        // requester's to choose.
        let mut parsed = CertReq::from_der(one_name.der()).unwrap();
        parsed.info.subject = subject("alice", &["devs".into(), "ops".into()]).unwrap();
        let info = parsed.info.to_der().unwrap();
        parsed.signature = BitString::from_bytes(&key.sign(&info).unwrap()).unwrap();
        parsed.to_der().unwrap()
    }

    #[test]
    fn keeps_every_group_and_verifies_against_the_ca() {
        let ca = authority();
        let now = SystemTime::now();
        let usages = Usages {
            digital_signature: true,
            key_encipherment: false,
        };
        let pem = ca
            .issue_client(&request(), usages, now, now + Duration::from_secs(3600))
            .unwrap();
        let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        let (_, cert) = x509_parser::certificate::X509Certificate::from_der(&pem.contents).unwrap();
        let groups: Vec<_> = cert
            .subject()
            .iter_organization()
            .map(|o| o.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(groups, ["devs", "ops"]);
        assert_eq!(
            cert.subject()
                .iter_common_name()
                .next()
                .unwrap()
                .as_str()
                .unwrap(),
            "alice"
        );
        let (_, issuer) =
            x509_parser::certificate::X509Certificate::from_der(&ca.certificate).unwrap();
        cert.verify_signature(Some(issuer.public_key())).unwrap();
        assert_eq!(cert.issuer(), issuer.subject());
        assert!(!cert.is_ca());
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        let ku = cert.key_usage().unwrap().unwrap();
        assert!(ku.critical && ku.value.digital_signature() && !ku.value.key_encipherment());
    }

    #[test]
    fn a_user_kubeconfig_names_the_user_and_groups() {
        let dir = tempfile::tempdir().unwrap();
        let ca = authority();
        std::fs::create_dir(dir.path().join("pki")).unwrap();
        let pem = |label: &str, der: &[u8]| {
            let encoded = base64::engine::general_purpose::STANDARD.encode(der);
            let lines: Vec<_> = encoded
                .as_bytes()
                .chunks(64)
                .map(|l| std::str::from_utf8(l).unwrap())
                .collect();
            format!(
                "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
                lines.join("\n")
            )
        };
        std::fs::write(
            dir.path().join("pki/ca.crt"),
            pem("CERTIFICATE", &ca.certificate),
        )
        .unwrap();
        std::fs::write(dir.path().join("pki/ca.key"), ca.key.serialize_pem()).unwrap();
        let mut wanted = UserCredential {
            user: "system:portal-dns".into(),
            groups: vec!["g1".into(), "g2".into()],
            lifetime: std::time::Duration::from_secs(3600),
            server: None,
        };
        let missing = user_kubeconfig(dir.path(), &wanted).unwrap_err();
        assert!(missing.contains("--server"), "{missing}");
        wanted.server = Some("https://127.0.0.1:6443".into());
        let config: serde_json::Value =
            serde_yaml_ng::from_str(&user_kubeconfig(dir.path(), &wanted).unwrap()).unwrap();
        assert_eq!(
            config["clusters"][0]["cluster"]["server"],
            "https://127.0.0.1:6443"
        );
        let data = config["users"][0]["user"]["client-certificate-data"]
            .as_str()
            .unwrap();
        let certificate = base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap();
        let der = pem_contents(std::str::from_utf8(&certificate).unwrap()).unwrap();
        let (_, cert) = x509_parser::certificate::X509Certificate::from_der(&der).unwrap();
        let names: Vec<_> = cert
            .subject()
            .iter()
            .flat_map(|rdn| rdn.iter())
            .map(|a| a.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["system:portal-dns", "g1", "g2"]);
    }

    #[test]
    fn a_rustls_server_accepts_it_as_a_client_certificate() {
        let ca = authority();
        let now = SystemTime::now();
        let pem = ca
            .issue_client(
                &request(),
                Usages::default(),
                now - Duration::from_secs(60),
                now + Duration::from_secs(3600),
            )
            .unwrap();
        let der = rustls::pki_types::CertificateDer::from(
            x509_parser::pem::parse_x509_pem(pem.as_bytes())
                .unwrap()
                .1
                .contents,
        );
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.certificate.clone().into()).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.into(),
            rustls::crypto::ring::default_provider().into(),
        )
        .build()
        .unwrap();
        verifier
            .verify_client_cert(&der, &[], rustls::pki_types::UnixTime::now())
            .unwrap();
    }
}
