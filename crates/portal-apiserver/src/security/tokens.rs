//! Service-account tokens: JWTs signed with the cluster's service-account
//! key (ES256), as Kubernetes' TokenRequest API issues them. A token names
//! its service account (and the pod, secret or node it is bound to), its
//! audiences and its expiry; the server checks all of them on every use, so
//! a pod-bound token stops working the moment its pod is gone.
//!
//! The public half is published for anyone who verifies tokens outside the
//! cluster: `/.well-known/openid-configuration` and `/openid/v1/jwks`.

use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use base64::Engine as _;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::Digest;

use crate::security::pki;

/// Where the signing key lives, relative to the data directory (part of
/// the cluster identity: every server of a cluster signs with it).
pub(crate) const KEY_FILE: &str = "pki/service-account.key";

/// Kubernetes' default issuer (k3s uses the same).
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// The issuer of legacy (Secret-held, never expiring) tokens.
pub(crate) const LEGACY_ISSUER: &str = "kubernetes/serviceaccount";

/// The DER prefix of a P-256 public key's SubjectPublicKeyInfo, before the
/// 65-byte uncompressed point (the key id hashes the whole SPKI, as
/// Kubernetes' does).
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// The service-account key and what tokens say about their issuer.
pub(crate) struct Signer {
    encoding: EncodingKey,
    decoding: DecodingKey,
    /// The `kid` of tokens and of the published key.
    key_id: String,
    /// The public point's coordinates, base64url.
    x: String,
    y: String,
    pub(crate) issuer: String,
    /// Who tokens are for unless a request names others (`--api-audiences`,
    /// by default the issuer).
    pub(crate) audiences: Vec<String>,
    /// Where `/openid/v1/jwks` is reached from outside.
    pub(crate) jwks_uri: String,
}

/// What a token's `kubernetes.io` claim says: the account and what the
/// token is bound to.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Private {
    pub(crate) namespace: String,
    pub(crate) serviceaccount: Ref,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) pod: Option<Ref>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) secret: Option<Ref>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) node: Option<Ref>,
    /// When a client should already have fetched a fresh token (an
    /// extended token's real life).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) warnafter: Option<i64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Ref {
    pub(crate) name: String,
    pub(crate) uid: String,
}

/// A token's claims, as Kubernetes writes them.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Claims {
    pub(crate) iss: String,
    pub(crate) sub: String,
    pub(crate) aud: Vec<String>,
    pub(crate) exp: i64,
    pub(crate) iat: i64,
    pub(crate) nbf: i64,
    pub(crate) jti: String,
    #[serde(rename = "kubernetes.io")]
    pub(crate) kubernetes: Private,
}

/// A legacy token's claims: the Secret that holds it names it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct LegacyClaims {
    pub(crate) iss: String,
    pub(crate) sub: String,
    #[serde(rename = "kubernetes.io/serviceaccount/namespace")]
    pub(crate) namespace: String,
    #[serde(rename = "kubernetes.io/serviceaccount/secret.name")]
    pub(crate) secret: String,
    #[serde(rename = "kubernetes.io/serviceaccount/service-account.name")]
    pub(crate) account: String,
    #[serde(rename = "kubernetes.io/serviceaccount/service-account.uid")]
    pub(crate) account_uid: String,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum TokenError {
    #[error("invalid bearer token: {0}")]
    Invalid(String),
}

impl Signer {
    /// Loads `DIR/pki/service-account.key`, made on first use.
    pub(crate) fn load_or_create(
        dir: &Path,
        issuer: &str,
        audiences: &[String],
        jwks_uri: String,
    ) -> Result<Signer, pki::Error> {
        let path = dir.join(KEY_FILE);
        let pkcs8 = match std::fs::read_to_string(&path) {
            Ok(pem) => pem_body(&pem).ok_or_else(|| pki::Error::Io {
                path: path.clone(),
                source: std::io::Error::other("not a PEM private key"),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let made = make_key().map_err(|why| pki::Error::Io {
                    path: path.clone(),
                    source: std::io::Error::other(why),
                })?;
                write_key(&path, &made)?;
                made
            }
            Err(source) => return Err(pki::Error::Io { path, source }),
        };
        Signer::from_pkcs8(&pkcs8, issuer, audiences, jwks_uri).map_err(|why| pki::Error::Io {
            path,
            source: std::io::Error::other(why),
        })
    }

    fn from_pkcs8(
        pkcs8: &[u8],
        issuer: &str,
        audiences: &[String],
        jwks_uri: String,
    ) -> Result<Signer, String> {
        let pair = EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_FIXED_SIGNING,
            pkcs8,
            &SystemRandom::new(),
        )
        .map_err(|e| format!("not a P-256 key: {e}"))?;
        let point = pair.public_key().as_ref();
        if point.len() != 65 || point[0] != 4 {
            return Err("unexpected public key form".into());
        }
        let (x, y) = (B64URL.encode(&point[1..33]), B64URL.encode(&point[33..]));
        let mut spki = P256_SPKI_PREFIX.to_vec();
        spki.extend_from_slice(point);
        let key_id = B64URL.encode(sha2::Sha256::digest(&spki));
        let decoding = DecodingKey::from_ec_components(&x, &y).map_err(|e| e.to_string())?;
        let audiences = if audiences.is_empty() {
            vec![issuer.to_owned()]
        } else {
            audiences.to_vec()
        };
        Ok(Signer {
            encoding: EncodingKey::from_ec_der(pkcs8),
            decoding,
            key_id,
            x,
            y,
            issuer: issuer.to_owned(),
            audiences,
            jwks_uri,
        })
    }

    /// Signs `claims`.
    pub(crate) fn sign(&self, claims: &Claims) -> Result<String, String> {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.key_id.clone());
        jsonwebtoken::encode(&header, claims, &self.encoding).map_err(|e| e.to_string())
    }

    /// The claims of a token this cluster signed, for one of its audiences,
    /// in its lifetime. What it is bound to is checked by the caller.
    /// Signs a legacy token (for a `kubernetes.io/service-account-token`
    /// Secret asked for explicitly).
    pub(crate) fn sign_legacy(&self, claims: &LegacyClaims) -> Result<String, String> {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.key_id.clone());
        jsonwebtoken::encode(&header, claims, &self.encoding).map_err(|e| e.to_string())
    }

    /// The claims of a legacy token this cluster signed (they have no
    /// audience and no expiry: the Secret holding them is their life).
    pub(crate) fn verify_legacy(&self, token: &str) -> Result<LegacyClaims, TokenError> {
        let mut validation = Validation::new(Algorithm::ES256);
        validation.set_issuer(&[LEGACY_ISSUER]);
        validation.validate_exp = false;
        validation.validate_aud = false;
        validation.set_required_spec_claims(&["iss", "sub"]);
        jsonwebtoken::decode::<LegacyClaims>(token, &self.decoding, &validation)
            .map(|data| data.claims)
            .map_err(|e| TokenError::Invalid(e.to_string()))
    }

    /// `audiences`: the server's own, or a TokenReview's.
    pub(crate) fn verify_for(
        &self,
        token: &str,
        audiences: &[String],
    ) -> Result<Claims, TokenError> {
        let mut validation = Validation::new(Algorithm::ES256);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(audiences);
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "iss", "sub", "aud"]);
        jsonwebtoken::decode::<Claims>(token, &self.decoding, &validation)
            .map(|data| data.claims)
            .map_err(|e| TokenError::Invalid(e.to_string()))
    }

    /// Whether `token` looks like one of ours (a JWT whose issuer is this
    /// cluster's), without checking it: other bearer tokens go elsewhere.
    pub(crate) fn is_ours(&self, token: &str) -> bool {
        let mut parts = token.split('.');
        let (Some(_), Some(payload), Some(_), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return false;
        };
        B64URL
            .decode(payload)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
            .is_some_and(|claims| {
                claims["iss"] == self.issuer.as_str() || claims["iss"] == LEGACY_ISSUER
            })
    }

    /// Whether a token (already known to be ours) is a legacy one.
    pub(crate) fn is_legacy(token: &str) -> bool {
        token
            .split('.')
            .nth(1)
            .and_then(|payload| B64URL.decode(payload).ok())
            .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
            .is_some_and(|claims| claims["iss"] == LEGACY_ISSUER)
    }

    /// `/.well-known/openid-configuration`.
    pub(crate) fn discovery(&self) -> Value {
        json!({
            "issuer": self.issuer,
            "jwks_uri": self.jwks_uri,
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"],
        })
    }

    /// `/openid/v1/jwks`.
    pub(crate) fn jwks(&self) -> Value {
        json!({"keys": [{
            "use": "sig",
            "kty": "EC",
            "kid": self.key_id,
            "crv": "P-256",
            "alg": "ES256",
            "x": self.x,
            "y": self.y,
        }]})
    }
}

fn make_key() -> Result<Vec<u8>, String> {
    EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &SystemRandom::new())
        .map(|doc| doc.as_ref().to_vec())
        .map_err(|e| format!("cannot make a key: {e}"))
}

/// A new key, as the PEM file the identity shares.
pub(crate) fn new_key_pem() -> Result<String, String> {
    Ok(pem_of(&make_key()?))
}

fn pem_of(pkcs8: &[u8]) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(pkcs8);
    let mut pem = String::from("-----BEGIN PRIVATE KEY-----\n");
    for line in body.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END PRIVATE KEY-----\n");
    pem
}

fn write_key(path: &Path, pkcs8: &[u8]) -> Result<(), pki::Error> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|source| pki::Error::Io {
            path: parent.to_owned(),
            source,
        })?;
    }
    pki::write_private(path, pem_of(pkcs8).as_bytes())
}

fn pem_body(pem: &str) -> Option<Vec<u8>> {
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN PRIVATE KEY-----"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(body.trim())
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(signer: &Signer, exp: i64) -> Claims {
        Claims {
            iss: signer.issuer.clone(),
            sub: "system:serviceaccount:team-a:app".into(),
            aud: signer.audiences.clone(),
            exp,
            iat: exp - 3600,
            nbf: exp - 3600,
            jti: "j".into(),
            kubernetes: Private {
                namespace: "team-a".into(),
                serviceaccount: Ref {
                    name: "app".into(),
                    uid: "u".into(),
                },
                ..Private::default()
            },
        }
    }

    #[test]
    fn tokens_verify_only_with_the_clusters_key_issuer_and_audience() {
        let dir = tempfile::tempdir().unwrap();
        let signer = Signer::load_or_create(dir.path(), DEFAULT_ISSUER, &[], "x".into()).unwrap();
        let again = Signer::load_or_create(dir.path(), DEFAULT_ISSUER, &[], "x".into()).unwrap();
        assert_eq!(signer.key_id, again.key_id, "the key is kept");
        let now = jiff::Timestamp::now().as_second();
        let token = signer.sign(&claims(&signer, now + 3600)).unwrap();
        assert!(signer.is_ours(&token));
        let verify = |s: &Signer, token: &str| s.verify_for(token, &s.audiences);
        let verified = verify(&again, &token).unwrap();
        assert_eq!(verified.kubernetes.serviceaccount.name, "app");
        assert!(verify(&signer, &signer.sign(&claims(&signer, now - 3600)).unwrap()).is_err());
        let mut other = claims(&signer, now + 3600);
        other.aud = vec!["elsewhere".into()];
        assert!(verify(&signer, &signer.sign(&other).unwrap()).is_err());
        let stranger = tempfile::tempdir().unwrap();
        let stranger =
            Signer::load_or_create(stranger.path(), DEFAULT_ISSUER, &[], "x".into()).unwrap();
        assert!(verify(&stranger, &token).is_err(), "another cluster's key");
        assert_eq!(signer.jwks()["keys"][0]["kid"], signer.key_id.as_str());
    }
}
