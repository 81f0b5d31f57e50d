//! Whether the user a request is made as may make it. As Kubernetes'
//! authorizer chain: superusers (`system:masters`) may do anything; a
//! node's requests go to the node rules ([`crate::security::node`]) first;
//! then RBAC ([`crate::security::rbac`]); what none allows is forbidden,
//! in Kubernetes' words.

use portal_api::Status;

pub(crate) use crate::security::attributes::{
    forbidden, forbidden_path, forbidden_request, Allowed, Attributes,
};
use crate::security::node;
use crate::security::rbac::Request;
use crate::security::user::{Impersonation, User};
use crate::ApiState;

/// Whether `user` may make the request.
pub(crate) fn authorize(
    state: &ApiState,
    user: &User,
    request: &Attributes<'_>,
) -> Result<Allowed, Status> {
    if user.is_admin() {
        return Ok(Allowed::Yes);
    }
    if let Some(allowed) = user.node().and_then(|n| node::node_rules(n, request)) {
        return Ok(allowed);
    }
    if state
        .rbac
        .allows(user, request.namespace, &request.request())
    {
        return Ok(Allowed::Yes);
    }
    Err(forbidden(user, request))
}

/// The whole chain's answer to any request, also of resources this server
/// does not serve (the access reviews ask about anything). A node's
/// conditional answers count as yes.
pub(crate) fn allowed(
    state: &ApiState,
    user: &User,
    namespace: Option<&str>,
    request: &Request<'_>,
) -> bool {
    if user.is_admin() {
        return true;
    }
    if let (
        Some(node),
        Request::Resource {
            verb,
            group,
            resource,
            subresource,
            name,
        },
    ) = (user.node(), request)
    {
        let served = portal_api::resources().find(|r| r.group == *group && r.plural == *resource);
        if let Some(served) = served {
            let attributes = Attributes {
                verb,
                resource: served,
                subresource: *subresource,
                namespace,
                name: *name,
            };
            if node::node_rules(node, &attributes).is_some() {
                return true;
            }
        }
    }
    state.rbac.allows(user, namespace, request)
}

/// Whether `user` may `verb` a non-resource path (`/metrics`, `/healthz`,
/// discovery).
pub(crate) fn authorize_path(
    state: &ApiState,
    user: &User,
    verb: &str,
    path: &str,
) -> Result<(), Status> {
    if user.is_admin() || state.rbac.allows(user, None, &Request::Path { verb, path }) {
        return Ok(());
    }
    Err(forbidden_path(user, verb, path))
}

/// Whether `user` may act as the impersonated user, its groups, uid and
/// extra (the `impersonate` verb on `users`, `groups`, `serviceaccounts`,
/// `uids` and `userextras/KEY`), as Kubernetes' impersonation filter.
pub(crate) fn authorize_impersonation(
    state: &ApiState,
    user: &User,
    asked: &Impersonation,
) -> Result<User, Status> {
    let may = |group: &str,
               resource: &str,
               subresource: Option<&str>,
               namespace: Option<&str>,
               name: &str| {
        user.is_admin()
            || state.rbac.allows(
                user,
                namespace,
                &Request::Resource {
                    verb: "impersonate",
                    group,
                    resource,
                    subresource,
                    name: Some(name),
                },
            )
    };
    // `users "alice" is forbidden: User "bob" cannot impersonate resource
    // "users" in API group "" at the cluster scope`.
    let refuse = |resource: &str, group: &str, namespace: Option<&str>, name: &str| {
        let (resource, subresource) = match resource.split_once('/') {
            Some((resource, sub)) => (resource, Some(sub)),
            None => (resource, None),
        };
        let request = Request::Resource {
            verb: "impersonate",
            group,
            resource,
            subresource,
            name: Some(name),
        };
        forbidden_request(user, namespace, &request)
    };
    match portal_api::kinds::service_account::parse_user_name(&asked.user) {
        Some((namespace, name)) => {
            if !may("", "serviceaccounts", None, Some(namespace), name) {
                return Err(refuse("serviceaccounts", "", Some(namespace), name));
            }
        }
        None => {
            if !may("", "users", None, None, &asked.user) {
                return Err(refuse("users", "", None, &asked.user));
            }
        }
    }
    for group in &asked.groups {
        if !may("", "groups", None, None, group) {
            return Err(refuse("groups", "", None, group));
        }
    }
    if let Some(uid) = &asked.uid {
        if !may("authentication.k8s.io", "uids", None, None, uid) {
            return Err(refuse("uids", "authentication.k8s.io", None, uid));
        }
    }
    for (key, values) in &asked.extra {
        for value in values {
            if !may(
                "authentication.k8s.io",
                "userextras",
                Some(key),
                None,
                value,
            ) {
                return Err(refuse(
                    &format!("userextras/{key}"),
                    "authentication.k8s.io",
                    None,
                    value,
                ));
            }
        }
    }
    Ok(asked.user())
}
