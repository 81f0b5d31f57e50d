//! What a request asks, in Kubernetes' authorization terms, what is left
//! to check once it is allowed, and how a refusal reads.

use portal_api::{Resource, Status};

use crate::security::rbac::Request;
use crate::security::user::User;

/// What a resource request asks, in Kubernetes' authorization terms.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Attributes<'a> {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`.
    pub(crate) verb: &'a str,
    pub(crate) resource: &'static Resource,
    pub(crate) subresource: Option<&'a str>,
    pub(crate) namespace: Option<&'a str>,
    pub(crate) name: Option<&'a str>,
}

impl Attributes<'_> {
    pub(crate) fn request(&self) -> Request<'_> {
        Request::Resource {
            verb: self.verb,
            group: self.resource.group,
            resource: self.resource.plural,
            subresource: self.subresource,
            name: self.name,
        }
    }
}

/// Allowed, given what is left to check once more is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub(crate) enum Allowed {
    Yes,
    /// A node's create: the object must be its own (its Node, its Lease,
    /// a mirror pod bound to it); see [`crate::security::node::admit_create`].
    IfOwnObject,
    /// A node's pod delete or status write: the stored pod must be bound
    /// to it; see [`crate::security::node::check_stored_pod`].
    IfPodOnNode,
    /// A node's write of its own Node: its taints are not its to change
    /// (they keep pods away from it); see [`crate::security::node::check_taints_kept`].
    IfTaintsKept,
    /// A node's read of a ConfigMap, Secret, claim or service account: a
    /// pod bound to it must refer to it; see [`crate::security::node::check_referenced`].
    IfReferencedOnNode,
}

/// Kubernetes' message: `services "web" is forbidden: User
/// "system:node:n2" cannot delete resource "services" in API group "" in
/// the namespace "default"`.
pub(crate) fn forbidden(user: &User, r: &Attributes<'_>) -> Status {
    let request = r.request();
    forbidden_request(user, r.namespace, &request)
}

/// [`forbidden`] for any resource request, also of resources this server
/// does not serve itself (those of extension API servers).
pub(crate) fn forbidden_request(user: &User, namespace: Option<&str>, r: &Request<'_>) -> Status {
    let Request::Resource {
        verb,
        group,
        resource: plural,
        subresource,
        name,
    } = *r
    else {
        return Status::forbidden(format!("User {:?} cannot do that", user.name));
    };
    // `deployments.apps "web" is forbidden: …` (the group-qualified
    // resource, as Kubernetes' `NewForbidden`).
    let qualified = if group.is_empty() {
        plural.to_owned()
    } else {
        format!("{plural}.{group}")
    };
    let what = match name {
        Some(name) => format!("{qualified} {name:?}"),
        None => qualified,
    };
    let resource = match subresource {
        Some(sub) => format!("{plural}/{sub}"),
        None => plural.to_owned(),
    };
    let scope = match namespace {
        Some(namespace) => format!("in the namespace {namespace:?}"),
        None => "at the cluster scope".to_owned(),
    };
    let mut status = Status::forbidden(format!(
        "{what} is forbidden: User {:?} cannot {verb} resource {resource:?} in API group {group:?} {scope}",
        user.name,
    ));
    status.details = Some(Box::new(portal_api::status::Details {
        name: name.map(str::to_owned),
        group: (!group.is_empty()).then(|| group.to_owned()),
        kind: Some(plural.to_owned()),
        ..Default::default()
    }));
    status
}

/// Kubernetes' message for a non-resource path.
pub(crate) fn forbidden_path(user: &User, verb: &str, path: &str) -> Status {
    Status::forbidden(format!(
        "forbidden: User {:?} cannot {verb} path {path:?}",
        user.name
    ))
}
