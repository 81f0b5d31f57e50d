//! Roles (`rbac.authorization.k8s.io/v1`): what may be done within one
//! namespace, as a list of rules (verbs on resources of API groups,
//! optionally only some names). A Role grants nothing until a RoleBinding
//! names it; ClusterRoles ([`super::cluster_role`]) share the rule checks.

use serde_json::{json, Value};

use super::{nothing, replace_lists};
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::table::cells::*;
use crate::table::{Column, NAME};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new(GROUP, "Role");

/// The RBAC API group.
pub const GROUP: &str = "rbac.authorization.k8s.io";

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "roles",
    singular: "role",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &[],
    categories: &[],
    has_status: false,
    name_rule: NameRule::PathSegment,
    decode: typed::<k8s_openapi::api::rbac::v1::Role>,
    openapi_schema: openapi_schema::<k8s_openapi::api::rbac::v1::Role>,
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
    columns,
    cells,
    custom: None,
    subresources: &[],
};

fn validate(object: &Value, _old: Option<&Value>) -> Vec<Cause> {
    rule_causes(object, true)
}

/// Upstream's `ValidatePolicyRule` for each of `rules`: verbs always;
/// resource rules name groups and resources, non-resource rules only URLs
/// (and only cluster-wide).
pub(crate) fn rule_causes(object: &Value, namespaced: bool) -> Vec<Cause> {
    let mut causes = Vec::new();
    let has = |rule: &Value, field: &str| rule[field].as_array().is_some_and(|a| !a.is_empty());
    for (i, rule) in arr(object, &["rules"]).iter().enumerate() {
        let path = |field: &str| format!("rules[{i}].{field}");
        if !has(rule, "verbs") {
            causes.push(Cause::required(
                &path("verbs"),
                "verbs must contain at least one value",
            ));
        }
        if has(rule, "nonResourceURLs") {
            let urls = rule["nonResourceURLs"].clone();
            if namespaced {
                causes.push(Cause::invalid(
                    &path("nonResourceURLs"),
                    urls.clone(),
                    "namespaced rules cannot apply to non-resource URLs",
                ));
            }
            if has(rule, "apiGroups") || has(rule, "resources") || has(rule, "resourceNames") {
                causes.push(Cause::invalid(
                    &path("nonResourceURLs"),
                    urls,
                    "rules cannot apply to both regular resources and non-resource URLs",
                ));
            }
            continue;
        }
        if !has(rule, "apiGroups") {
            causes.push(Cause::required(
                &path("apiGroups"),
                "resource rules must supply at least one api group",
            ));
        }
        if !has(rule, "resources") {
            causes.push(Cause::required(
                &path("resources"),
                "resource rules must supply at least one resource",
            ));
        }
    }
    causes
}

/// Roles print their name and creation time, as kubectl shows them.
pub(crate) fn columns() -> Vec<Column> {
    vec![
        NAME,
        Column {
            kind: "date",
            ..crate::table::col("Created At", "When it was created.", 0)
        },
    ]
}

pub(crate) fn cells(object: &Value, _now: i64) -> Vec<Value> {
    vec![
        name(object),
        json!(s(object, &["metadata", "creationTimestamp"]).unwrap_or("")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_are_checked_as_upstream() {
        let good = json!({"rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]});
        assert!(validate(&good, None).is_empty());
        let causes = validate(&json!({"rules": [{"apiGroups": [""]}]}), None);
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["rules[0].verbs", "rules[0].resources"]);
        let urls = json!({"rules": [{"verbs": ["get"], "nonResourceURLs": ["/healthz"]}]});
        assert_eq!(validate(&urls, None).len(), 1, "namespaced");
        assert!(rule_causes(&urls, false).is_empty());
    }
}
