//! The registry: which kinds this process serves, found at run time by
//! group, version and plural (a URL), by kind, or by any name `kubectl`
//! uses. The built-in kinds are registered from [`BUILT_IN`]; more can be
//! added while the server runs ([`register`]), which is how kinds defined
//! by users (CustomResourceDefinitions) join (ADR 0015).
//!
//! Readers take a snapshot ([`current`]): one consistent set of kinds for a
//! whole request, never a half-added one. A lookup that misses is an error
//! or `None`, never another kind.

use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;

use crate::kinds;
use crate::schema::{Kind, Resource};

/// The built-in kinds, in discovery order: one line per kind.
pub const BUILT_IN: &[&Resource] = &[
    &kinds::namespace::RESOURCE,
    &kinds::pod::RESOURCE,
    &kinds::service::RESOURCE,
    &kinds::endpoints::RESOURCE,
    &kinds::replication_controller::RESOURCE,
    &kinds::replica_set::RESOURCE,
    &kinds::deployment::RESOURCE,
    &kinds::daemon_set::RESOURCE,
    &kinds::stateful_set::RESOURCE,
    &kinds::controller_revision::RESOURCE,
    &kinds::job::RESOURCE,
    &kinds::cron_job::RESOURCE,
    &kinds::pod_disruption_budget::RESOURCE,
    &kinds::network_policy::RESOURCE,
    &kinds::service_cidr::RESOURCE,
    &kinds::ip_address::RESOURCE,
    &kinds::ingress::RESOURCE,
    &kinds::ingress_class::RESOURCE,
    &kinds::horizontal_pod_autoscaler::RESOURCE,
    &kinds::horizontal_pod_autoscaler_v1::RESOURCE,
    &kinds::node::RESOURCE,
    &kinds::config_map::RESOURCE,
    &kinds::secret::RESOURCE,
    &kinds::service_account::RESOURCE,
    &kinds::persistent_volume::RESOURCE,
    &kinds::persistent_volume_claim::RESOURCE,
    &kinds::storage_class::RESOURCE,
    &kinds::event::RESOURCE,
    &kinds::events_event::RESOURCE,
    &kinds::endpoint_slice::RESOURCE,
    &kinds::lease::RESOURCE,
    &kinds::role::RESOURCE,
    &kinds::cluster_role::RESOURCE,
    &kinds::role_binding::RESOURCE,
    &kinds::cluster_role_binding::RESOURCE,
    &kinds::certificate_signing_request::RESOURCE,
    &kinds::custom_resource_definition::RESOURCE,
    &kinds::api_service::RESOURCE,
    &kinds::validating_admission_policy::RESOURCE,
    &kinds::validating_admission_policy_binding::RESOURCE,
    &kinds::mutating_webhook_configuration::RESOURCE,
    &kinds::validating_webhook_configuration::RESOURCE,
];

/// Why a kind could not be found or added.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("no kind {group:?}/{name:?} is served", group = .0.group, name = .0.name)]
    NotServed(Kind),
    #[error("{0} is already served")]
    AlreadyServed(String),
}

/// One consistent set of served kinds.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    resources: Vec<&'static Resource>,
    /// Each resource's store key prefix, made once (the watch cache looks
    /// up the kind of every stored object it sees).
    key_prefixes: Vec<(String, &'static Resource)>,
}

impl Registry {
    /// The built-in kinds alone.
    pub fn built_in() -> Registry {
        let mut registry = Registry::default();
        for resource in BUILT_IN {
            // The built-in list is checked for clashes by a unit test.
            let _ = registry.add(resource);
        }
        registry
    }

    /// Adds `resource`, refused when its group/version/plural or its kind
    /// at that version is already served, or a short name is taken.
    pub fn add(&mut self, resource: &'static Resource) -> Result<(), RegistryError> {
        // Versions of one kind share its plural and short names.
        let clash = self.resources.iter().find(|r| {
            // (only kinds users define: a CRD cannot add a version to a
            // built-in kind)
            let same_kind = r.kind_name == resource.kind_name
                && r.plural == resource.plural
                && (r.custom.is_some() && resource.custom.is_some()
                    || older_built_in_version(resource, r));
            r.group == resource.group
                && (r.plural == resource.plural && (!same_kind || r.version == resource.version)
                    || r.kind_name == resource.kind_name && r.version == resource.version
                    || !same_kind
                        && r.short_names
                            .iter()
                            .any(|s| resource.short_names.contains(s)))
        });
        if let Some(existing) = clash {
            return Err(RegistryError::AlreadyServed(format!(
                "{}.{} ({})",
                existing.plural,
                existing.group,
                existing.api_version()
            )));
        }
        self.resources.push(resource);
        self.key_prefixes.push((resource.key_prefix(), resource));
        Ok(())
    }

    /// The resource a store key belongs to (a kind served at several
    /// versions: the one registered first, which stores them).
    pub fn of_key(&self, key: &str) -> Option<&'static Resource> {
        self.key_prefixes
            .iter()
            .find(|(prefix, _)| key.starts_with(prefix.as_str()))
            .map(|(_, resource)| *resource)
    }

    /// Every served resource, in discovery order.
    pub fn iter(&self) -> impl Iterator<Item = &'static Resource> + '_ {
        self.resources.iter().copied()
    }

    /// The resource a URL names.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
        self.iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
    }

    /// The preferred (first registered) resource of `kind`.
    pub fn of(&self, kind: Kind) -> Result<&'static Resource, RegistryError> {
        self.iter()
            .find(|r| r.kind() == kind)
            .ok_or(RegistryError::NotServed(kind))
    }
}

fn shared() -> &'static RwLock<Arc<Registry>> {
    static CURRENT: OnceLock<RwLock<Arc<Registry>>> = OnceLock::new();
    CURRENT.get_or_init(|| RwLock::new(Arc::new(Registry::built_in())))
}

/// The kinds served now.
pub fn current() -> Arc<Registry> {
    shared().read().clone()
}

/// Serves one more kind from now on; readers holding an older snapshot
/// keep it until they finish.
pub fn register(resource: &'static Resource) -> Result<(), RegistryError> {
    let mut guard = shared().write();
    let mut next = Registry::clone(&guard);
    next.add(resource)?;
    *guard = Arc::new(next);
    Ok(())
}

/// Serves exactly the built-in kinds and `defined` (kinds of
/// CustomResourceDefinitions) from now on; a defined resource that clashes
/// with one served before it is left out and returned with the reason.
pub fn set_defined(defined: &[&'static Resource]) -> Vec<(&'static Resource, RegistryError)> {
    let mut next = Registry::built_in();
    let mut refused = Vec::new();
    for resource in defined {
        if let Err(error) = next.add(resource) {
            refused.push((*resource, error));
        }
    }
    *shared().write() = Arc::new(next);
    refused
}

/// Whether `view` is a built-in kind's other version, stored as `stored`
/// (`autoscaling/v1` HorizontalPodAutoscalers, stored at v2).
fn older_built_in_version(view: &Resource, stored: &'static Resource) -> bool {
    view.custom.is_some_and(|custom| {
        !custom.user_defined() && custom.stored_as().is_some_and(|s| std::ptr::eq(s, stored))
    })
}

/// Every resource served now, in discovery order.
pub fn resources() -> impl Iterator<Item = &'static Resource> {
    let snapshot = current();
    let all: Vec<&'static Resource> = snapshot.iter().collect();
    all.into_iter()
}

/// The resource a URL names, among those served now.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
    current().find(group, version, plural)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn built_in_kinds_are_distinct_and_whole() {
        let registry = Registry::built_in();
        assert_eq!(
            registry.iter().count(),
            BUILT_IN.len(),
            "no clash dropped a kind"
        );
        let kinds: HashSet<Kind> = registry.iter().map(Resource::kind).collect();
        let other_versions = registry
            .iter()
            .filter(|r| registry.of(r.kind()) != Ok(*r))
            .map(|r| r.api_version())
            .collect::<Vec<_>>();
        assert_eq!(other_versions, ["autoscaling/v1"]);
        assert_eq!(kinds.len(), BUILT_IN.len() - other_versions.len());
        for resource in registry.iter() {
            if other_versions.contains(&resource.api_version()) {
                continue;
            }
            assert_eq!(registry.of(resource.kind()), Ok(resource));
            assert_eq!(
                (resource.columns)().len(),
                (resource.cells)(&serde_json::json!({}), 0).len(),
                "{}: a cell per column",
                resource.kind_name
            );
        }
    }

    #[test]
    fn lookups_that_miss_are_errors() {
        let registry = Registry::built_in();
        let missing = Kind::new("node.k8s.io", "RuntimeClass");
        assert_eq!(registry.of(missing), Err(RegistryError::NotServed(missing)));
        assert!(registry
            .find("node.k8s.io", "v1", "runtimeclasses")
            .is_none());
        assert!(registry.find("", "v1", "endpointslices").is_none());
    }

    #[test]
    fn kinds_join_at_run_time() {
        static WIDGETS: Resource = Resource {
            group: "example.com",
            version: "v1",
            plural: "widgets",
            singular: "widget",
            kind_name: "Widget",
            short_names: &["wd"],
            ..kinds::events_event::RESOURCE
        };
        let before = current();
        register(&WIDGETS).unwrap();
        assert_eq!(
            find("example.com", "v1", "widgets").map(Resource::kind),
            Some(Kind::new("example.com", "Widget"))
        );
        assert!(
            before.find("example.com", "v1", "widgets").is_none(),
            "a snapshot stays whole"
        );
        assert!(matches!(
            register(&WIDGETS),
            Err(RegistryError::AlreadyServed(_))
        ));
        let mut registry = Registry::built_in();
        assert!(matches!(
            registry.add(&kinds::lease::RESOURCE),
            Err(RegistryError::AlreadyServed(_))
        ));
        // Another version of a kind shares its plural and short names;
        // another kind may not.
        static WIDGETS_V2: Resource = Resource {
            version: "v2",
            ..WIDGETS
        };
        static GADGETS: Resource = Resource {
            kind_name: "Gadget",
            plural: "gadgets",
            ..WIDGETS
        };
        registry.add(&WIDGETS).unwrap();
        registry.add(&WIDGETS_V2).unwrap();
        assert!(registry.add(&GADGETS).is_err(), "the short name is taken");
        let refused = set_defined(&[&WIDGETS, &WIDGETS_V2, &GADGETS]);
        assert_eq!(refused.len(), 1);
        assert_eq!(current().of(WIDGETS.kind()), Ok(&WIDGETS));
    }
}
