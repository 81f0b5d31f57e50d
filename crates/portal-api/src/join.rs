//! The node join protocol's wire format (ADR 0011), shared by the API
//! server that lets nodes join and the agents that do.
//!
//! A node token is `K10<SHA-256 of the CA bundle, hex>::node:<secret>`
//! (k3s's form). The joining node fetches [`CACERTS_PATH`] without
//! trusting it and keeps it only if its hash is the token's; then it
//! POSTs a [`CredentialRequest`] to [`CREDENTIAL_PATH`] with
//! `Authorization: Bearer <secret>` and gets a [`CredentialResponse`].

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Where the cluster CA bundle is served to anyone (it is public).
pub const CACERTS_PATH: &str = "/cacerts";
/// Where a node exchanges the token's secret and a CSR for its certificate.
pub const CREDENTIAL_PATH: &str = "/portal/v1/node-credential";
/// The group of every node certificate (Kubernetes' Node authorizer).
pub const NODES_GROUP: &str = "system:nodes";
/// Node users are `system:node:<name>`.
pub const NODE_USER_PREFIX: &str = "system:node:";

/// A parsed node token.
#[derive(Clone, PartialEq, Eq)]
pub struct NodeToken {
    /// Hex SHA-256 of the CA bundle served at [`CACERTS_PATH`].
    pub ca_hash: String,
    pub secret: String,
}

impl std::fmt::Debug for NodeToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret in logs.
        f.debug_struct("NodeToken")
            .field("ca_hash", &self.ca_hash)
            .finish_non_exhaustive()
    }
}

impl NodeToken {
    /// A token for the cluster whose CA bundle is `ca_pem`.
    pub fn new(ca_pem: &str, secret: &str) -> Self {
        NodeToken {
            ca_hash: ca_hash(ca_pem),
            secret: secret.to_owned(),
        }
    }

    /// Whether `ca_pem` is the bundle this token pins.
    pub fn pins(&self, ca_pem: &str) -> bool {
        ca_hash(ca_pem) == self.ca_hash
    }
}

impl std::fmt::Display for NodeToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "K10{}::node:{}", self.ca_hash, self.secret)
    }
}

impl std::str::FromStr for NodeToken {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let malformed = || {
            "not a node token (K10<CA hash>::node:<secret>; see the server's DIR/node-token)"
                .to_owned()
        };
        let rest = text.trim().strip_prefix("K10").ok_or_else(malformed)?;
        let (hash, credential) = rest.split_once("::").ok_or_else(malformed)?;
        let (user, secret) = credential.split_once(':').ok_or_else(malformed)?;
        let hex = hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit());
        if !hex || user != "node" || secret.is_empty() {
            return Err(malformed());
        }
        Ok(NodeToken {
            ca_hash: hash.to_ascii_lowercase(),
            secret: secret.to_owned(),
        })
    }
}

/// The hex SHA-256 a token pins a CA bundle with.
pub fn ca_hash(ca_pem: &str) -> String {
    ca_hash_bytes(ca_pem.as_bytes())
}

/// Hex SHA-256 of `bytes`.
pub fn ca_hash_bytes(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What a joining node sends.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CredentialRequest {
    pub node_name: String,
    /// PEM `CERTIFICATE REQUEST` made with the node's own key.
    pub csr: String,
}

/// What it gets back.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialResponse {
    /// PEM client certificate for `system:node:<name>`.
    pub certificate: String,
    /// The cluster CA bundle (the API server's issuer).
    pub ca: String,
    /// The CA of the API server's client certificate: what the agent's
    /// own API (logs, exec) accepts.
    pub kubelet_client_ca: String,
}

/// A kubeconfig that authenticates with a node's client certificate.
pub fn node_kubeconfig(
    server: &str,
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
    node: &str,
) -> String {
    use base64::Engine;
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: portal\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\nusers:\n- name: {NODE_USER_PREFIX}{node}\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: portal\n  context:\n    cluster: portal\n    user: {NODE_USER_PREFIX}{node}\ncurrent-context: portal\n",
        b64(ca_pem),
        b64(cert_pem),
        b64(key_pem),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_parse_only_in_their_form() {
        let hash = "a".repeat(64);
        let token: NodeToken = format!("K10{hash}::node:s3cret").parse().unwrap();
        assert_eq!(
            (token.ca_hash.as_str(), token.secret.as_str()),
            (hash.as_str(), "s3cret")
        );
        assert_eq!(token.to_string(), format!("K10{hash}::node:s3cret"));
        for bad in [
            "s3cret".to_owned(),
            format!("K10{hash}::server:s3cret"),
            format!("K10{}::node:s3cret", "a".repeat(63)),
            format!("K10{hash}::node:"),
        ] {
            assert!(bad.parse::<NodeToken>().is_err(), "{bad}");
        }
        assert!(!format!("{token:?}").contains("s3cret"));
    }

    #[test]
    fn a_token_pins_its_ca() {
        let token = NodeToken::new("CA one", "s");
        assert!(token.pins("CA one"));
        assert!(!token.pins("CA two"));
    }
}
