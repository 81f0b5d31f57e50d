//! The resources Portal serves: one static row each, from which routing,
//! discovery and decoding are derived.

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

macro_rules! resource {
    ($kind:ident, $group:expr, $version:expr, $plural:expr, $singular:expr, $namespaced:expr, $short:expr, $status:expr, $rule:ident) => {
        Resource {
            kind: Kind::$kind,
            group: $group,
            version: $version,
            plural: $plural,
            singular: $singular,
            kind_name: stringify!($kind),
            namespaced: $namespaced,
            short_names: $short,
            has_status: $status,
            name_rule: NameRule::$rule,
        }
    };
}

/// Every resource served, in discovery order.
pub const RESOURCES: &[Resource] = &[
    resource!(
        Namespace,
        "",
        "v1",
        "namespaces",
        "namespace",
        false,
        &["ns"],
        true,
        Label1123
    ),
    resource!(Pod, "", "v1", "pods", "pod", true, &["po"], true, Subdomain),
    resource!(
        Service,
        "",
        "v1",
        "services",
        "service",
        true,
        &["svc"],
        true,
        Label1035
    ),
    resource!(
        Endpoints,
        "",
        "v1",
        "endpoints",
        "endpoints",
        true,
        &["ep"],
        false,
        Subdomain
    ),
    resource!(
        ReplicationController,
        "",
        "v1",
        "replicationcontrollers",
        "replicationcontroller",
        true,
        &["rc"],
        true,
        Subdomain
    ),
    resource!(
        Node,
        "",
        "v1",
        "nodes",
        "node",
        false,
        &["no"],
        true,
        Subdomain
    ),
    resource!(
        Event,
        "",
        "v1",
        "events",
        "event",
        true,
        &["ev"],
        false,
        Subdomain
    ),
    resource!(
        EndpointSlice,
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "endpointslice",
        true,
        &[],
        false,
        Subdomain
    ),
    resource!(
        Lease,
        "coordination.k8s.io",
        "v1",
        "leases",
        "lease",
        true,
        &[],
        false,
        Subdomain
    ),
];

impl Resource {
    /// Finds a served resource by group, version and plural name.
    pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
        RESOURCES
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
    }

    pub fn of(kind: Kind) -> &'static Resource {
        // Every Kind has exactly one row; the fallback is never taken.
        RESOURCES
            .iter()
            .find(|r| r.kind == kind)
            .unwrap_or(&RESOURCES[0])
    }

    /// `v1` or `group/version`, as in `apiVersion`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
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
