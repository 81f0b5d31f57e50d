//! What a kind is, as data: a [`Resource`] holds everything Portal knows
//! about one kind — its identity and names, its scope, how its bodies
//! decode, its defaults and validation, what the server sets and keeps,
//! its field selectors, how its lists merge, its table and its
//! subresources. The generic paths (decoding, patching, server-side apply,
//! tables, the API server's handlers) read these values and name no kind.
//!
//! This module is the vocabulary between the machinery below it (status,
//! names, metadata, selectors) and the kinds above it (`crate::kinds`);
//! the kinds are found at run time in `crate::registry`.

mod typed;

use serde_json::Value;

use crate::status::Cause;

pub use typed::{openapi_schema, typed, DecodeError, Decoded};

/// A kind's identity: its API group and name (`apps`, `Deployment`),
/// Kubernetes' `GroupKind`. A plain value, so it can be matched on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Kind {
    /// API group; `""` is the core (legacy) group.
    pub group: &'static str,
    pub name: &'static str,
}

impl Kind {
    pub const fn new(group: &'static str, name: &'static str) -> Kind {
        Kind { group, name }
    }
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
    /// Anything that can be one path segment (RBAC roles and bindings:
    /// `system:node`).
    PathSegment,
    /// An IP address in canonical form (IPAddress: `10.96.0.1`,
    /// `2001:db8::1`).
    IpAddress,
}

/// How a list field merges in a strategic merge patch (`patchStrategy` and
/// `patchMergeKey` in the Kubernetes types).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListStrategy {
    /// Replaced whole.
    Replace,
    /// Maps merged by this key.
    MergeKey(&'static str),
    /// Primitives merged as a set (e.g. `finalizers`).
    MergePrimitives,
}

/// One `kubectl get` column: name, type, and priority (0 = always, 1 =
/// `-o wide`).
#[derive(Clone, Copy, Debug)]
pub struct Column {
    pub name: &'static str,
    pub kind: &'static str,
    pub format: &'static str,
    pub description: &'static str,
    pub priority: u8,
}

/// A subresource listed in discovery (served by its own handler).
#[derive(Clone, Copy, Debug)]
pub struct Subresource {
    /// `log` for `pods/log`.
    pub name: &'static str,
    /// The kind its requests and answers carry.
    pub kind: &'static str,
    pub verbs: &'static [&'static str],
    /// Group and version when not the parent's (`autoscaling/v1` Scale).
    pub group_version: Option<(&'static str, &'static str)>,
}

/// What `metadata.generation` of a kind's objects counts: changes of the
/// desired state, which its controller reports having seen in
/// `status.observedGeneration`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Generation {
    /// No generation (kinds without a controller acting on a spec).
    Untracked,
    /// Changes of `spec`.
    Spec,
    /// Changes of `spec` or of `metadata.annotations`: the annotations are
    /// part of the desired state, and the controller reports through the
    /// `status` subresource with annotations of its own (Deployments: the
    /// `deployment.kubernetes.io/revision` annotation).
    SpecAndAnnotations,
    /// Changes of anything but `metadata` (and `status`, when it is a
    /// subresource): custom resources.
    Content,
}

/// The OpenAPI schema of a kind, its definitions added to the generator.
pub type OpenApiSchema = fn(&mut schemars::SchemaGenerator) -> schemars::Schema;

/// Where a kind defined at run time keeps its `/scale` subresource's
/// fields (a CRD's `subresources.scale`): paths such as `.spec.replicas`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScalePaths {
    pub spec_replicas: String,
    pub status_replicas: String,
    pub label_selector: Option<String>,
}

/// The behaviour of a kind defined at run time (a CustomResourceDefinition's
/// version), which reads its own schema: what the plain function hooks of
/// a built-in [`Resource`] do, for one value each.
pub trait Defined: Send + Sync + std::fmt::Debug {
    /// Checks types and prunes what the schema does not know.
    fn decode(&self, object: Value) -> Result<Decoded, DecodeError>;
    /// Fills in the schema's defaults.
    fn defaults(&self, object: &mut Value);
    /// The schema's checks (types, formats, bounds, rules).
    fn validate(&self, object: &Value, old: Option<&Value>) -> Vec<Cause>;
    /// `kubectl get` columns (the additional printer columns).
    fn columns(&self) -> Vec<Column>;
    fn cells(&self, object: &Value, now: i64) -> Vec<Value>;
    /// The kind's OpenAPI v3 schema, as the CRD states it.
    fn openapi_schema(&self) -> Value;
    /// How the list at `path` merges, from `x-kubernetes-list-type`.
    fn list_strategy(&self, path: &[&str]) -> ListStrategy;
    /// The keys of a `map` list at `path`.
    fn list_map_keys(&self, path: &[&str]) -> Option<&'static [&'static str]>;
    /// The `/scale` subresource's fields, when it has one.
    fn scale(&self) -> Option<&ScalePaths>;
    /// The version objects are stored at (`None` conversion between).
    fn storage_version(&self) -> &'static str;
    /// The resource whose objects these are, seen another way (events.k8s.io
    /// Events are core Events): its keys, its watch cache, its form in the
    /// store. `None` for a kind stored as itself.
    fn stored_as(&self) -> Option<&'static Resource> {
        None
    }
    /// The conversion webhook (`spec.conversion.webhook` of a CRD whose
    /// strategy is `Webhook`): objects change versions only through it,
    /// which the API server calls; [`Defined::to_version`] and
    /// [`Defined::to_storage`] leave them as they are.
    fn conversion_webhook(&self) -> Option<&Value> {
        None
    }
    /// `object` (as stored) as `resource` serves it; `true` if it changed.
    /// By default only `apiVersion` changes (`None` conversion).
    fn to_version(&self, resource: &Resource, object: &mut Value) -> bool {
        let wanted = resource.api_version();
        if object["apiVersion"].as_str() == Some(wanted.as_str())
            || self.conversion_webhook().is_some()
        {
            return false;
        }
        object["apiVersion"] = Value::String(wanted);
        true
    }
    /// `object` (as `resource` serves it) as it is stored.
    fn to_storage(&self, resource: &Resource, object: &mut Value) {
        if self.conversion_webhook().is_none() {
            object["apiVersion"] =
                Value::String(format!("{}/{}", resource.group, self.storage_version()));
        }
    }
    /// Whether strategic merge patches apply (kinds users define have no
    /// merge strategies: upstream refuses them).
    fn strategic_merge(&self) -> bool {
        false
    }
    /// Whether a user defined the kind (a CRD), rather than it being a
    /// built-in view: names its OpenAPI schema after its group.
    fn user_defined(&self) -> bool {
        true
    }
}

/// One kind, served as one resource: everything kind-specific, as data and
/// plain functions (Kubernetes keeps the same in
/// `pkg/registry/<group>/<kind>/strategy.go` and its REST storage).
#[derive(Clone, Copy, Debug)]
pub struct Resource {
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
    /// Decodes a JSON object into the kind's typed form and back (unknown
    /// fields reported), before defaulting.
    pub decode: fn(Value) -> Result<Decoded, DecodeError>,
    /// Its OpenAPI schema (`kubectl explain`, client-side validation).
    pub openapi_schema: OpenApiSchema,
    /// Fills in what an omitted field means (`pkg/apis/.../defaults.go`).
    pub defaults: fn(&mut Value),
    /// Kind-specific validation of an object about to be stored (`old`: the
    /// stored object on update), beyond the metadata checks all kinds get.
    pub validate: fn(&Value, Option<&Value>) -> Vec<Cause>,
    /// What the server sets on a new object beyond system metadata (its
    /// initial status, server-owned fields).
    pub prepare_create: fn(&mut Value),
    /// Top-level fields an ordinary update may not change (server-owned).
    pub kept_on_update: &'static [&'static str],
    /// What `metadata.generation` counts.
    pub generation: Generation,
    /// A PUT of an object that does not exist creates it.
    pub create_on_update: bool,
    /// Field-selector fields beyond `metadata.name` and
    /// `metadata.namespace`.
    pub selectable_fields: &'static [&'static str],
    /// Selector fields read from another path (`source` of an Event).
    pub field_paths: &'static [(&'static str, &'static str)],
    /// What an absent selectable field reads as ("" unless named here).
    pub field_defaults: &'static [(&'static str, &'static str)],
    /// How the list at a path (field names, items skipped) merges in a
    /// strategic merge patch, beyond metadata's lists (which every kind
    /// shares: see [`Resource::list_strategy`]).
    pub own_list_strategy: fn(&[&str]) -> ListStrategy,
    /// Lists that server-side apply keys by more fields than a strategic
    /// merge patch merges them by (a Service's ports by port and protocol).
    pub list_map_keys: &'static [(&'static [&'static str], &'static [&'static str])],
    /// `kubectl get` columns, in order, and one object's cells.
    pub columns: fn() -> Vec<Column>,
    pub cells: fn(&Value, i64) -> Vec<Value>,
    /// Subresources beyond `status`, for discovery.
    pub subresources: &'static [Subresource],
    /// A kind defined at run time: its behaviour, which replaces the
    /// function hooks above (`decode` … `cells`, the list strategy).
    pub custom: Option<&'static dyn Defined>,
}

/// Two resources are the same when they serve the same kind at the same
/// version under the same name.
impl PartialEq for Resource {
    fn eq(&self, other: &Self) -> bool {
        self.kind() == other.kind() && self.version == other.version && self.plural == other.plural
    }
}

impl Eq for Resource {}

impl Resource {
    /// The kind this resource serves.
    pub const fn kind(&self) -> Kind {
        Kind::new(self.group, self.kind_name)
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
        // A defined kind's: the group's labels reversed (`com.example.v1.Widget`).
        if self.custom.is_some_and(|c| c.user_defined()) {
            let group: Vec<&str> = self.group.rsplit('.').collect();
            return format!("{}.{}.{}", group.join("."), self.version, self.kind_name);
        }
        // The Go package: the group's first label (`rbac` of
        // `rbac.authorization.k8s.io`).
        let group = match self.group {
            "" => "core",
            group => group.split('.').next().unwrap_or(group),
        };
        format!("io.k8s.api.{group}.{}.{}", self.version, self.kind_name)
    }

    /// The kind whose objects this resource serves: its own, or the one
    /// it is a view of.
    pub fn stored_kind(&self) -> Kind {
        match self.custom.and_then(|c| c.stored_as()) {
            Some(stored) => stored.kind(),
            None => self.kind(),
        }
    }

    /// The store key prefix of this resource: `/registry/<group>/<plural>/`
    /// (a view's: that of the resource it views).
    pub fn key_prefix(&self) -> String {
        if let Some(stored) = self.custom.and_then(|c| c.stored_as()) {
            return stored.key_prefix();
        }
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

    /// How the list at `path` (object field names, list items skipped)
    /// merges: metadata's lists as for every kind, the rest as the kind
    /// says. Lists named nowhere are replaced whole, as upstream.
    pub fn list_strategy(&self, path: &[&str]) -> ListStrategy {
        match path {
            ["metadata", "finalizers"] => ListStrategy::MergePrimitives,
            ["metadata", "ownerReferences"] => ListStrategy::MergeKey("uid"),
            _ => match self.custom {
                Some(custom) => custom.list_strategy(path),
                None => (self.own_list_strategy)(path),
            },
        }
    }

    /// Decodes a JSON object of this kind (types checked, unknown fields
    /// collected and dropped).
    pub fn decode_value(&self, object: Value) -> Result<Decoded, DecodeError> {
        match self.custom {
            Some(custom) => custom.decode(object),
            None => (self.decode)(object),
        }
    }

    /// Fills in what omitted fields mean.
    pub fn apply_defaults(&self, object: &mut Value) {
        match self.custom {
            Some(custom) => custom.defaults(object),
            None => (self.defaults)(object),
        }
    }

    /// The kind's own checks of an object about to be stored.
    pub fn validate_object(&self, object: &Value, old: Option<&Value>) -> Vec<Cause> {
        match self.custom {
            Some(custom) => custom.validate(object, old),
            None => (self.validate)(object, old),
        }
    }

    /// `kubectl get` columns.
    pub fn table_columns(&self) -> Vec<Column> {
        match self.custom {
            Some(custom) => custom.columns(),
            None => (self.columns)(),
        }
    }

    /// One object's `kubectl get` cells.
    pub fn table_cells(&self, object: &Value, now: i64) -> Vec<Value> {
        match self.custom {
            Some(custom) => custom.cells(object, now),
            None => (self.cells)(object, now),
        }
    }

    /// Whether `field` may be used in a field selector on this kind.
    pub fn is_selectable(&self, field: &str) -> bool {
        matches!(field, "metadata.name" | "metadata.namespace")
            || self.selectable_fields.contains(&field)
    }

    /// The value of a selectable field as a string ("" when absent), the
    /// way Kubernetes' field sets present it.
    pub fn field_value(&self, object: &Value, field: &str) -> String {
        let lookup = |pairs: &[(&'static str, &'static str)]| {
            pairs.iter().find(|(name, _)| *name == field).map(|p| p.1)
        };
        let path = lookup(self.field_paths).unwrap_or(field);
        let mut current = object;
        for part in path.split('.') {
            match current.get(part) {
                Some(next) => current = next,
                None => return lookup(self.field_defaults).unwrap_or_default().to_owned(),
            }
        }
        match current {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        }
    }
}
