//! The built-in kinds: one module per kind holding everything Portal knows
//! about it, the way Kubernetes keeps `pkg/registry/<group>/<kind>/strategy.go`
//! — its [`Resource`](crate::schema::Resource) value (names, typed decoding,
//! defaults, validation, what the server sets on create and keeps on update,
//! field selectors, strategic-merge keys, table columns and cells,
//! subresources) and its [`Kind`](crate::schema::Kind).
//!
//! Adding a kind: a module here with its `KIND` and `RESOURCE`, and its
//! line in [`crate::registry`]'s built-in list. Nothing else names it.

pub mod endpoint_slice;
pub mod endpoints;
pub mod event;
pub mod lease;
pub mod namespace;
pub mod node;
pub mod pod;
pub mod replica_set;
pub mod replication_controller;
pub mod service;

use serde_json::Value;

use crate::schema::ListStrategy;
pub(crate) use crate::schema::Subresource;
use crate::Cause;

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
