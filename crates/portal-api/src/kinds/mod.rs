//! The registry: one module per kind holding everything Portal knows about
//! it, the way Kubernetes keeps `pkg/registry/<group>/<kind>/strategy.go` —
//! its resource row, typed decoding, defaults, validation, what the server
//! sets on create and keeps on update, field selectors, strategic-merge
//! keys, table columns and cells, and its subresources. The generic paths
//! (decode, defaults, patch, table, field selectors, the API server's
//! create/update/delete) ask the definition and name no kind.
//!
//! Adding a kind: a module here with its `DEFINITION`, its line in [`ALL`],
//! and its variant in [`Kind`].

mod endpoint_slice;
mod endpoints;
mod event;
mod lease;
mod namespace;
mod node;
mod pod;
mod replication_controller;
mod service;

use serde_json::Value;

use crate::decode::{DecodeError, Decoded};
use crate::patch::ListStrategy;
use crate::resource::{Kind, Resource};
use crate::table::Column;
use crate::Cause;

/// Every kind served, in discovery order.
pub const ALL: &[&Definition] = &[
    &namespace::DEFINITION,
    &pod::DEFINITION,
    &service::DEFINITION,
    &endpoints::DEFINITION,
    &replication_controller::DEFINITION,
    &node::DEFINITION,
    &event::DEFINITION,
    &endpoint_slice::DEFINITION,
    &lease::DEFINITION,
];

/// The definition of a kind.
pub fn of(kind: Kind) -> &'static Definition {
    // Every Kind has exactly one definition (a unit test checks); the
    // fallback is never taken.
    ALL.iter()
        .find(|d| d.resource.kind == kind)
        .copied()
        .unwrap_or(ALL[0])
}

/// Everything kind-specific, as data and plain functions.
#[derive(Debug)]
pub struct Definition {
    pub resource: Resource,
    /// Decodes a JSON object into the kind's typed form and back (unknown
    /// fields reported), before defaulting.
    pub decode: fn(Value) -> Result<Decoded, DecodeError>,
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
    /// `metadata.generation` counts spec changes.
    pub tracks_generation: bool,
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
    /// strategic merge patch.
    pub list_strategy: fn(&[&str]) -> ListStrategy,
    /// `kubectl get` columns, in order, and one object's cells.
    pub columns: fn() -> Vec<Column>,
    pub cells: fn(&Value, i64) -> Vec<Value>,
    /// Subresources beyond `status`, for discovery.
    pub subresources: &'static [Subresource],
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

/// Verbs of the proxy subresources.
const PROXY_VERBS: &[&str] = &["create", "delete", "get", "patch", "update"];

/// For kinds with no validation beyond metadata.
fn no_validation(_: &Value, _: Option<&Value>) -> Vec<Cause> {
    Vec::new()
}

/// For kinds with nothing to set on create or default.
fn nothing(_: &mut Value) {}

/// For kinds whose lists all merge by replacement (finalizers and owners
/// aside, which every kind shares).
fn replace_lists(_: &[&str]) -> ListStrategy {
    ListStrategy::Replace
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_one_definition_and_unique_names() {
        use std::collections::HashSet;
        let kinds: HashSet<Kind> = ALL.iter().map(|d| d.resource.kind).collect();
        assert_eq!(kinds.len(), ALL.len());
        let plurals: HashSet<(&str, &str)> = ALL
            .iter()
            .map(|d| (d.resource.group, d.resource.plural))
            .collect();
        assert_eq!(plurals.len(), ALL.len());
        for definition in ALL {
            assert_eq!(of(definition.resource.kind).resource, definition.resource);
            assert_eq!(
                (definition.columns)().len(),
                (definition.cells)(&serde_json::json!({}), 0).len(),
                "{}: a cell per column",
                definition.resource.kind_name
            );
        }
    }
}
