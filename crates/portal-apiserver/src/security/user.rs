//! Who is asking: the user a request is made as, from its client
//! certificate, its bearer token (the admin token, a static token from
//! `--token-auth-file`, a service-account token) or nothing at all
//! (`system:anonymous`); then, when it asks to act as someone else
//! (`Impersonate-User`), that user, once it may.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use http::{header, HeaderMap};
use portal_api::kinds::{pod, secret, service_account};
use portal_api::{kinds, Status};
use rustls_pki_types::CertificateDer;
use serde_json::Value;

use portal_api::join::{NODES_GROUP, NODE_USER_PREFIX};

use crate::security::join::same_secret;
use crate::security::tokens::{Claims, Signer};
use crate::ApiState;

/// The group whose members may do anything (Kubernetes' superusers).
pub(crate) const MASTERS: &str = "system:masters";
pub(crate) const AUTHENTICATED: &str = "system:authenticated";
pub(crate) const UNAUTHENTICATED: &str = "system:unauthenticated";
pub(crate) const ANONYMOUS: &str = "system:anonymous";

/// `extra` keys a service-account token adds, as Kubernetes' do.
const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";
const EXTRA_CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";

/// An authenticated user, as Kubernetes' `user.Info`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct User {
    pub(crate) name: String,
    pub(crate) uid: String,
    pub(crate) groups: Vec<String>,
    pub(crate) extra: BTreeMap<String, Vec<String>>,
}

impl User {
    /// A user in `groups` and in `system:authenticated`.
    pub(crate) fn new(name: &str, groups: &[&str]) -> User {
        let mut all: Vec<String> = groups.iter().map(|g| (*g).to_owned()).collect();
        if !all.iter().any(|g| g == AUTHENTICATED) {
            all.push(AUTHENTICATED.to_owned());
        }
        User {
            name: name.to_owned(),
            groups: all,
            ..User::default()
        }
    }

    /// The holder of the admin token.
    pub(crate) fn admin() -> User {
        User::new("admin", &[MASTERS])
    }

    /// The server's own components (Kubernetes' loopback client).
    pub(crate) fn loopback() -> User {
        User::new("system:apiserver", &[MASTERS])
    }

    /// A request that brought no credential.
    pub(crate) fn anonymous() -> User {
        User {
            name: ANONYMOUS.to_owned(),
            groups: vec![UNAUTHENTICATED.to_owned()],
            ..User::default()
        }
    }

    pub(crate) fn is_admin(&self) -> bool {
        self.groups.iter().any(|g| g == MASTERS)
    }

    /// The node this user is, if a node.
    pub(crate) fn node(&self) -> Option<&str> {
        let node = self.name.strip_prefix(NODE_USER_PREFIX)?;
        (!node.is_empty() && self.groups.iter().any(|g| g == NODES_GROUP)).then_some(node)
    }

    /// Kubernetes' `UserInfo` of this user, as reviews and audit events
    /// show it.
    pub(crate) fn info(&self) -> serde_json::Value {
        let mut info = serde_json::json!({"username": self.name, "groups": self.groups});
        if !self.uid.is_empty() {
            info["uid"] = serde_json::json!(self.uid);
        }
        if !self.extra.is_empty() {
            info["extra"] = serde_json::json!(self.extra);
        }
        info
    }

    /// The user a service account is.
    pub(crate) fn service_account(namespace: &str, name: &str, uid: &str) -> User {
        let [all, own] = service_account::groups(namespace);
        let mut user = User::new(
            &service_account::user_name(namespace, name),
            &[all.as_str(), own.as_str()],
        );
        user.uid = uid.to_owned();
        user
    }
}

/// The user a verified client certificate names (CN user, O groups). A
/// node's certificate counts only while its key is the one the node
/// joined with (`joining`): re-joined or revoked nodes' older ones do not.
pub(crate) fn user_of_certificate(
    der: &CertificateDer<'_>,
    joining: &crate::security::join::Joining,
) -> Option<User> {
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    let subject = cert.subject();
    let name = subject.iter_common_name().next()?.as_str().ok()?.to_owned();
    let groups: Vec<&str> = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .collect();
    let user = User::new(&name, &groups);
    if let Some(node) = user.node() {
        let key = &cert.public_key().subject_public_key.data;
        if !joining.current(node, key) {
            tracing::info!(%node, "a node certificate that is no longer current: refused");
            return None;
        }
    }
    Some(user)
}

/// How bearer tokens are told apart, and whether requests without any
/// credential are served as `system:anonymous`.
pub(crate) struct Authenticator {
    pub(crate) admin_token: String,
    /// `--token-auth-file`: token → user.
    pub(crate) static_tokens: HashMap<String, User>,
    pub(crate) signer: Signer,
    pub(crate) anonymous: bool,
}

/// Reads a `--token-auth-file`: CSV lines `token,user,uid[,"group1,group2"]`,
/// as Kubernetes' static token file.
pub fn read_token_file(path: &Path) -> Result<HashMap<String, TokenUser>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut users = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields = split_csv(line);
        let [token, name, uid, rest @ ..] = fields.as_slice() else {
            return Err(format!(
                "{}:{}: want at least token,user,uid",
                path.display(),
                n + 1
            ));
        };
        if token.is_empty() || name.is_empty() {
            return Err(format!("{}:{}: empty token or user", path.display(), n + 1));
        }
        let groups = rest
            .first()
            .map(|g| {
                g.split(',')
                    .map(str::trim)
                    .filter(|g| !g.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        users.insert(
            token.clone(),
            TokenUser {
                name: name.clone(),
                uid: uid.clone(),
                groups,
            },
        );
    }
    Ok(users)
}

/// A user of the static token file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenUser {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
}

impl From<TokenUser> for User {
    fn from(token: TokenUser) -> User {
        let groups: Vec<&str> = token.groups.iter().map(String::as_str).collect();
        let mut user = User::new(&token.name, &groups);
        user.uid = token.uid;
        user
    }
}

/// CSV fields, with `"…"` quoting (a quoted field may hold commas).
fn split_csv(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut field).trim().to_owned()),
            c => field.push(c),
        }
    }
    fields.push(field.trim().to_owned());
    fields
}

/// The connection's certificate user, else the bearer token's, else
/// anonymous (when allowed). A token that is given and wrong is `401`, not
/// anonymous.
pub(crate) fn authenticate(
    state: &ApiState,
    headers: &HeaderMap,
    peer: Option<&User>,
) -> Result<User, Status> {
    if let Some(user) = peer {
        return Ok(user.clone());
    }
    let authn = &state.authn;
    // The scheme is case-insensitive (the Python client sends `bearer`).
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
    else {
        return if authn.anonymous {
            Ok(User::anonymous())
        } else {
            Err(Status::unauthorized())
        };
    };
    if same_secret(given.as_bytes(), authn.admin_token.as_bytes()) {
        return Ok(User::admin());
    }
    if let Some(user) = authn.static_tokens.get(given) {
        return Ok(user.clone());
    }
    if authn.signer.is_ours(given) {
        return service_account_user(state, given).map_err(|why| {
            tracing::debug!(%why, "service-account token refused");
            Status::unauthorized()
        });
    }
    Err(Status::unauthorized())
}

/// The user a service-account token authenticates: signed by this
/// cluster, in its lifetime, for this server's audiences, and still bound
/// to what it names (the account, and its pod, secret or node, with the
/// same uids).
pub(crate) fn service_account_user(state: &ApiState, token: &str) -> Result<User, String> {
    service_account_user_for(state, token, &state.authn.signer.audiences)
}

/// As [`service_account_user`], for other audiences (a TokenReview's).
pub(crate) fn service_account_user_for(
    state: &ApiState,
    token: &str,
    audiences: &[String],
) -> Result<User, String> {
    if Signer::is_legacy(token) {
        return legacy_user(state, token);
    }
    let claims = state
        .authn
        .signer
        .verify_for(token, audiences)
        .map_err(|e| e.to_string())?;
    check_bound(state, &claims)?;
    let private = &claims.kubernetes;
    let account = &private.serviceaccount;
    let mut user = User::service_account(&private.namespace, &account.name, &account.uid);
    if let Some(pod) = &private.pod {
        user.extra
            .insert(EXTRA_POD_NAME.into(), vec![pod.name.clone()]);
        user.extra
            .insert(EXTRA_POD_UID.into(), vec![pod.uid.clone()]);
    }
    if let Some(node) = &private.node {
        user.extra
            .insert(EXTRA_NODE_NAME.into(), vec![node.name.clone()]);
    }
    if !claims.jti.is_empty() {
        user.extra.insert(
            EXTRA_CREDENTIAL_ID.into(),
            vec![format!("JTI={}", claims.jti)],
        );
    }
    Ok(user)
}

/// A legacy token's user: valid while the Secret holding it (the same
/// token) and its account (the same uid) are there.
fn legacy_user(state: &ApiState, token: &str) -> Result<User, String> {
    let claims = state
        .authn
        .signer
        .verify_legacy(token)
        .map_err(|e| e.to_string())?;
    let live = |resource: &'static portal_api::Resource, name: &str| {
        state
            .cache
            .get(resource, &resource.key(Some(&claims.namespace), name))
            .map(|cached| cached.value.clone())
    };
    let secret = live(&secret::RESOURCE, &claims.secret).ok_or("its secret is gone")?;
    let held = secret["data"]["token"].as_str().unwrap_or("");
    let expected = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, token);
    if held != expected {
        return Err("its secret holds another token".into());
    }
    let account = live(&kinds::service_account::RESOURCE, &claims.account)
        .ok_or("its service account is gone")?;
    if account["metadata"]["uid"].as_str().unwrap_or("") != claims.account_uid {
        return Err("its service account was replaced".into());
    }
    let mut user = User::service_account(&claims.namespace, &claims.account, &claims.account_uid);
    user.extra.insert(
        EXTRA_CREDENTIAL_ID.into(),
        vec![format!("JTI=legacy:{}", claims.secret)],
    );
    Ok(user)
}

/// What a token is bound to must still be there, with its uid.
fn check_bound(state: &ApiState, claims: &Claims) -> Result<(), String> {
    let private = &claims.kubernetes;
    let namespace = private.namespace.as_str();
    let expected =
        portal_api::kinds::service_account::user_name(namespace, &private.serviceaccount.name);
    if claims.sub != expected {
        return Err("the subject does not name the service account".into());
    }
    let live = |resource: &'static portal_api::Resource, namespace: Option<&str>, name: &str| {
        state
            .cache
            .get(resource, &resource.key(namespace, name))
            .map(|cached| cached.value.clone())
    };
    let account = live(
        &kinds::service_account::RESOURCE,
        Some(namespace),
        &private.serviceaccount.name,
    )
    .ok_or("its service account is gone")?;
    let uid_of = |object: &Value| {
        object
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    if !private.serviceaccount.uid.is_empty() && uid_of(&account) != private.serviceaccount.uid {
        return Err("its service account was replaced".into());
    }
    if let Some(bound) = &private.pod {
        let pod = live(&pod::RESOURCE, Some(namespace), &bound.name)
            .ok_or("the pod it is bound to is gone")?;
        if uid_of(&pod) != bound.uid {
            return Err("the pod it is bound to was replaced".into());
        }
    }
    if let Some(bound) = &private.secret {
        let secret = live(&secret::RESOURCE, Some(namespace), &bound.name)
            .ok_or("the secret it is bound to is gone")?;
        if uid_of(&secret) != bound.uid {
            return Err("the secret it is bound to was replaced".into());
        }
    }
    if let Some(bound) = private.node.as_ref().filter(|_| private.pod.is_none()) {
        let node = live(&kinds::node::RESOURCE, None, &bound.name)
            .ok_or("the node it is bound to is gone")?;
        if uid_of(&node) != bound.uid {
            return Err("the node it is bound to was replaced".into());
        }
    }
    Ok(())
}

/// The headers that ask to act as another user (`kubectl --as`).
pub(crate) struct Impersonation {
    pub(crate) user: String,
    pub(crate) uid: Option<String>,
    pub(crate) groups: Vec<String>,
    pub(crate) extra: BTreeMap<String, Vec<String>>,
}

/// The impersonation a request asks for, if any (`400` for groups or extra
/// without a user).
pub(crate) fn impersonation(headers: &HeaderMap) -> Result<Option<Impersonation>, Status> {
    let values = |name: &str| -> Vec<String> {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::to_owned)
            .collect()
    };
    let users = values("impersonate-user");
    let groups = values("impersonate-group");
    let uid = values("impersonate-uid").into_iter().next();
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in headers {
        if let Some(key) = name.as_str().strip_prefix("impersonate-extra-") {
            let key = percent_encoding::percent_decode_str(key)
                .decode_utf8_lossy()
                .into_owned();
            if let Ok(value) = value.to_str() {
                extra.entry(key).or_default().push(value.to_owned());
            }
        }
    }
    let Some(user) = users.into_iter().next() else {
        if !groups.is_empty() || !extra.is_empty() || uid.is_some() {
            return Err(Status::bad_request(
                "requested impersonation of groups, uid or extra without impersonating a user",
            ));
        }
        return Ok(None);
    };
    Ok(Some(Impersonation {
        user,
        uid,
        groups,
        extra,
    }))
}

impl Impersonation {
    /// The user acted as: a service account gets its groups, anyone else
    /// `system:authenticated` (unless it is `system:anonymous`).
    pub(crate) fn user(&self) -> User {
        let mut groups = self.groups.clone();
        if let Some((namespace, _)) = service_account::parse_user_name(&self.user) {
            for group in service_account::groups(namespace) {
                if !groups.contains(&group) {
                    groups.push(group);
                }
            }
        }
        let marker = if self.user == ANONYMOUS {
            UNAUTHENTICATED
        } else {
            AUTHENTICATED
        };
        if !groups.iter().any(|g| g == marker) {
            groups.push(marker.to_owned());
        }
        User {
            name: self.user.clone(),
            uid: self.uid.clone().unwrap_or_default(),
            groups,
            extra: self.extra.clone(),
        }
    }
}

tokio::task_local! {
    /// The user the request being served is made as: writes deep in the
    /// registry (RBAC escalation checks, a CSR's requester) ask it.
    pub(crate) static REQUESTER: User;
}

/// The user of the request being served; `None` for the server's own
/// writes outside any request.
pub(crate) fn requester() -> Option<User> {
    REQUESTER.try_with(Clone::clone).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_files_read_as_kubernetes_static_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.csv");
        std::fs::write(&path, "# comment\nt1,alice,u1,\"dev,ops\"\nt2,bob,u2\n").unwrap();
        let users = read_token_file(&path).unwrap();
        assert_eq!(users["t1"].groups, ["dev", "ops"]);
        let bob: User = users["t2"].clone().into();
        assert_eq!(bob.groups, [AUTHENTICATED]);
        std::fs::write(&path, "t3\n").unwrap();
        assert!(read_token_file(&path).is_err());
    }

    #[test]
    fn impersonated_users_get_their_groups() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "impersonate-user",
            "system:serviceaccount:team-a:app".parse().unwrap(),
        );
        let asked = impersonation(&headers).unwrap().unwrap();
        let user = asked.user();
        assert!(user
            .groups
            .contains(&"system:serviceaccounts:team-a".to_owned()));
        assert!(user.groups.contains(&AUTHENTICATED.to_owned()));
        let mut groups_only = HeaderMap::new();
        groups_only.insert("impersonate-group", "dev".parse().unwrap());
        assert!(impersonation(&groups_only).is_err());
        assert!(User::admin().is_admin() && !User::anonymous().is_admin());
        assert_eq!(
            User::new("system:node:n1", &[NODES_GROUP]).node(),
            Some("n1")
        );
        assert_eq!(User::new("system:node:n1", &[]).node(), None);
    }
}
