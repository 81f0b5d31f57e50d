//! ClusterRoleBindings (`rbac.authorization.k8s.io/v1`): grant a
//! ClusterRole's rules in every namespace and over cluster-scoped
//! resources (`cluster-admin` to the `system:masters` group).

use serde_json::Value;

use super::role::GROUP;
use super::role_binding::{binding_causes, cells, columns, defaults};
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new(GROUP, "ClusterRoleBinding");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "clusterrolebindings",
    singular: "clusterrolebinding",
    kind_name: KIND.name,
    namespaced: false,
    short_names: &[],
    categories: &[],
    has_status: false,
    name_rule: NameRule::PathSegment,
    decode: typed::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>,
    openapi_schema: openapi_schema::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>,
    defaults,
    validate,
    prepare_create: super::nothing,
    kept_on_update: &[],
    generation: Generation::Untracked,
    create_on_update: false,
    selectable_fields: &[],
    field_paths: &[],
    field_defaults: &[],
    own_list_strategy: super::replace_lists,
    list_map_keys: &[],
    columns,
    cells,
    custom: None,
    subresources: &[],
};

fn validate(object: &Value, old: Option<&Value>) -> Vec<Cause> {
    binding_causes(object, old, false)
}
