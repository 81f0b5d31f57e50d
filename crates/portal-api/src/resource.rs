//! The resources Portal serves: the identity and names of each (its row
//! lives with the rest of its kind in [`crate::kinds`]), from which
//! routing, discovery and store keys are derived.

/// A kind Portal stores and serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Namespace,
    Pod,
    Service,
    Endpoints,
    ReplicationController,
    Node,
    Event,
    EndpointSlice,
    Lease,
}

/// Everything the API server needs to know about one resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resource {
    pub kind: Kind,
    /// API group; `""` is the core (legacy) group.
    pub group: &'static str,
    pub version: &'static str,
    /// The plural path segment, e.g. `services`.
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind_name: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    /// Groups it belongs to for `kubectl get <category>` (`all`).
    pub categories: &'static [&'static str],
    /// Has a `status` subresource whose writes touch only `.status`.
    pub has_status: bool,
    /// How its names are validated.
    pub name_rule: NameRule,
}

/// Which Kubernetes name validation applies to a resource's objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameRule {
    /// RFC 1123 subdomain (most kinds).
    Subdomain,
    /// RFC 1123 label (Namespace).
    Label1123,
    /// RFC 1035 label (Service).
    Label1035,
}

/// Every resource served, in discovery order (one per kind in
/// [`crate::kinds`]).
pub fn resources() -> impl Iterator<Item = &'static Resource> {
    crate::kinds::ALL.iter().map(|d| &d.resource)
}

impl Resource {
    /// Finds a served resource by group, version and plural name.
    pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
        resources().find(|r| r.group == group && r.version == version && r.plural == plural)
    }

    pub fn of(kind: Kind) -> &'static Resource {
        &crate::kinds::of(kind).resource
    }

    /// Everything else Portal knows about this resource's kind.
    pub fn definition(&self) -> &'static crate::kinds::Definition {
        crate::kinds::of(self.kind)
    }

    /// `v1` or `group/version`, as in `apiVersion`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The kind's schema name in OpenAPI and protobuf:
    /// `io.k8s.api.core.v1.Service`, `io.k8s.api.discovery.v1.EndpointSlice`.
    pub fn openapi_name(&self) -> String {
        let group = match self.group {
            "" => "core",
            group => group.trim_end_matches(".k8s.io"),
        };
        format!("io.k8s.api.{group}.{}.{}", self.version, self.kind_name)
    }

    /// The store key prefix of this resource: `/registry/<group>/<plural>/`.
    pub fn key_prefix(&self) -> String {
        let group = if self.group.is_empty() {
            "core"
        } else {
            self.group
        };
        format!("/registry/{group}/{}/", self.plural)
    }

    /// The store key of one object (`namespace` ignored for cluster-scoped kinds).
    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        match namespace {
            Some(ns) if self.namespaced => format!("{}{ns}/{name}", self.key_prefix()),
            _ => format!("{}{name}", self.key_prefix()),
        }
    }

    /// The key prefix of a namespace's objects, or of all of them.
    pub fn list_prefix(&self, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) if self.namespaced => format!("{}{ns}/", self.key_prefix()),
            _ => self.key_prefix(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_do_not_collide_across_namespaces_or_groups() {
        let svc = Resource::find("", "v1", "services").unwrap();
        assert_eq!(
            svc.key(Some("default"), "web"),
            "/registry/core/services/default/web"
        );
        assert_eq!(
            svc.list_prefix(Some("default")),
            "/registry/core/services/default/"
        );
        let ns = Resource::of(Kind::Namespace);
        assert_eq!(
            ns.key(Some("ignored"), "default"),
            "/registry/core/namespaces/default"
        );
        let slices = Resource::of(Kind::EndpointSlice);
        assert_eq!(slices.api_version(), "discovery.k8s.io/v1");
        assert!(Resource::find("", "v1", "endpointslices").is_none());
    }
}
