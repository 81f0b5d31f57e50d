//! ClusterRoles (`rbac.authorization.k8s.io/v1`): rules that hold in every
//! namespace, over cluster-scoped resources and non-resource URLs
//! (`/healthz`). An `aggregationRule` makes one the union of every
//! ClusterRole its selectors match (`admin`, `edit`, `view`): the
//! aggregation controller keeps its rules.

use serde_json::Value;

use super::{nothing, replace_lists};
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new(super::role::GROUP, "ClusterRole");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "clusterroles",
    singular: "clusterrole",
    kind_name: KIND.name,
    namespaced: false,
    short_names: &[],
    categories: &[],
    has_status: false,
    name_rule: NameRule::PathSegment,
    decode: typed::<k8s_openapi::api::rbac::v1::ClusterRole>,
    openapi_schema: openapi_schema::<k8s_openapi::api::rbac::v1::ClusterRole>,
    defaults: nothing,
    validate,
    prepare_create: nothing,
    kept_on_update: &[],
    generation: Generation::Untracked,
    create_on_update: false,
    selectable_fields: &[],
    field_paths: &[],
    field_defaults: &[],
    own_list_strategy: replace_lists,
    list_map_keys: &[],
    columns: super::role::columns,
    cells: super::role::cells,
    custom: None,
    subresources: &[],
};

/// Upstream's `ValidateClusterRole`: the rules, and an aggregation rule
/// with at least one valid selector.
fn validate(object: &Value, _old: Option<&Value>) -> Vec<Cause> {
    let mut causes = super::role::rule_causes(object, false);
    if let Some(rule) = object.get("aggregationRule").filter(|r| !r.is_null()) {
        let selectors = rule["clusterRoleSelectors"]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        if selectors.is_empty() {
            causes.push(Cause::required(
                "aggregationRule.clusterRoleSelectors",
                "at least one clusterRoleSelector required if aggregationRule is non-nil",
            ));
        }
        for (i, selector) in selectors.iter().enumerate() {
            let field = format!("aggregationRule.clusterRoleSelectors[{i}]");
            if let Err(problem) = crate::selector::LabelSelector::from_api(selector, &field) {
                causes.push(Cause::invalid(&field, selector.clone(), &problem));
            }
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn aggregation_rules_need_selectors() {
        let aggregated =
            json!({"aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"a": "b"}}]}});
        assert!(validate(&aggregated, None).is_empty());
        let empty = json!({"aggregationRule": {"clusterRoleSelectors": []}});
        assert_eq!(validate(&empty, None).len(), 1);
        let urls = json!({"rules": [{"verbs": ["get"], "nonResourceURLs": ["/healthz"]}]});
        assert!(validate(&urls, None).is_empty());
    }
}
