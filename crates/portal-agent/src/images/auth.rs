//! Registry logins from a pod's `imagePullSecrets`, as the kubelet's
//! keyring finds them: each Secret of type `kubernetes.io/dockerconfigjson`
//! (`{"auths": {KEY: …}}`) or `kubernetes.io/dockercfg` (`{KEY: …}`) names
//! registries by KEY (`host[:port]`, optionally with a scheme and a path
//! prefix, `*.` globs allowed); a login is `auth` (base64 `user:password`)
//! or `username`/`password`, or a `registrytoken` (a bearer token). The
//! logins that match an image's registry are tried in order. An
//! `identitytoken` (an OAuth refresh token) is not used: the registry
//! client has no refresh-token flow.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use oci_client::secrets::RegistryAuth;
use serde_json::Value;

/// The Secret types that carry registry logins.
const DOCKER_CONFIG_JSON: &str = "kubernetes.io/dockerconfigjson";
const DOCKER_CONFIG: &str = "kubernetes.io/dockercfg";

/// A pull secret as read: its type and entries.
pub struct PullSecret<'a> {
    pub secret_type: &'a str,
    pub data: &'a BTreeMap<String, Vec<u8>>,
}

/// Never prints the logins.
impl std::fmt::Debug for PullSecret<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullSecret")
            .field("secret_type", &self.secret_type)
            .field("keys", &self.data.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// The logins of `secrets` for an image in `registry` at `repository`
/// (`library/nginx`), best match first (longest key).
pub fn logins(secrets: &[PullSecret<'_>], registry: &str, repository: &str) -> Vec<RegistryAuth> {
    let mut found: Vec<(usize, RegistryAuth)> = Vec::new();
    for secret in secrets {
        let entries = match secret.secret_type {
            DOCKER_CONFIG_JSON => secret
                .data
                .get(".dockerconfigjson")
                .and_then(|raw| serde_json::from_slice::<Value>(raw).ok())
                .map(|config| config["auths"].clone()),
            DOCKER_CONFIG => secret
                .data
                .get(".dockercfg")
                .and_then(|raw| serde_json::from_slice::<Value>(raw).ok()),
            _ => None,
        };
        let Some(Value::Object(entries)) = entries else {
            continue;
        };
        for (key, entry) in entries {
            if let Some(auth) = matches(&key, registry, repository)
                .then(|| login(&entry))
                .flatten()
            {
                found.push((key.len(), auth));
            }
        }
    }
    // Most specific first; the sort is stable, so secrets keep their order.
    found.sort_by_key(|(len, _)| std::cmp::Reverse(*len));
    found.into_iter().map(|(_, auth)| auth).collect()
}

/// One entry's login.
fn login(entry: &Value) -> Option<RegistryAuth> {
    let text = |field: &str| entry[field].as_str().filter(|s| !s.is_empty());
    if let Some(token) = text("registrytoken") {
        return Some(RegistryAuth::Bearer(token.to_owned()));
    }
    if let (Some(user), Some(password)) = (text("username"), text("password")) {
        return Some(RegistryAuth::Basic(user.to_owned(), password.to_owned()));
    }
    let decoded = BASE64.decode(text("auth")?).ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some(RegistryAuth::Basic(user.to_owned(), password.to_owned()))
}

/// Whether a config key names `registry` (and a prefix of `repository`).
fn matches(key: &str, registry: &str, repository: &str) -> bool {
    let bare = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let (host, path) = bare.split_once('/').unwrap_or((bare, ""));
    let path = path.trim_end_matches('/');
    let host_matches = same_registry(host, registry)
        || host.strip_prefix("*.").is_some_and(|suffix| {
            registry
                .split_once('.')
                .is_some_and(|(_, rest)| rest == suffix)
        });
    // `/v1/`, `/v2/` are API paths in old configs, not repositories.
    let path_matches = path.is_empty()
        || matches!(path, "v1" | "v2")
        || repository == path
        || repository.starts_with(&format!("{path}/"));
    host_matches && path_matches
}

/// Docker Hub goes by several names.
fn same_registry(a: &str, b: &str) -> bool {
    let hub = |name: &str| {
        matches!(
            name,
            "docker.io" | "index.docker.io" | "registry-1.docker.io"
        )
    };
    a == b || (hub(a) && hub(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(json: &str) -> BTreeMap<String, Vec<u8>> {
        BTreeMap::from([(".dockerconfigjson".to_owned(), json.as_bytes().to_vec())])
    }

    #[test]
    fn keys_match_hosts_paths_and_globs() {
        assert!(matches("registry.local:5000", "registry.local:5000", "web"));
        assert!(matches(
            "https://registry.local:5000/v1/",
            "registry.local:5000",
            "web"
        ));
        assert!(!matches("registry.local", "registry.local:5000", "web"));
        assert!(matches(
            "https://index.docker.io/v1/",
            "docker.io",
            "library/nginx"
        ));
        assert!(matches("*.example.com", "eu.example.com", "app"));
        assert!(!matches("*.example.com", "a.b.example.com", "app"));
        assert!(matches("reg.io/team", "reg.io", "team/app"));
        assert!(!matches("reg.io/team", "reg.io", "teamx/app"));
    }

    #[test]
    fn logins_in_every_form_most_specific_first() {
        let auth = BASE64.encode("bob:hunter2");
        let first = secret(&format!(
            r#"{{"auths": {{"reg.io": {{"auth": "{auth}"}}, "other.io": {{"username": "x", "password": "y"}}}}}}"#
        ));
        let second = secret(
            r#"{"auths": {"reg.io/team": {"username": "alice", "password": "pw"}, "reg.io/team/app": {"registrytoken": "t"}, "reg.io/x": {"identitytoken": "i"}}}"#,
        );
        let secrets = [
            PullSecret {
                secret_type: DOCKER_CONFIG_JSON,
                data: &first,
            },
            PullSecret {
                secret_type: DOCKER_CONFIG_JSON,
                data: &second,
            },
            PullSecret {
                secret_type: "Opaque",
                data: &first,
            },
        ];
        let found = logins(&secrets, "reg.io", "team/app");
        assert_eq!(
            found,
            [
                RegistryAuth::Bearer("t".into()),
                RegistryAuth::Basic("alice".into(), "pw".into()),
                RegistryAuth::Basic("bob".into(), "hunter2".into())
            ]
        );
        assert!(logins(&secrets, "none.io", "app").is_empty());
    }
}
