//! RoleBindings (`rbac.authorization.k8s.io/v1`): grant a Role's (or a
//! ClusterRole's) rules to users, groups and service accounts within one
//! namespace. Which role a binding grants never changes (`roleRef` is
//! immutable: delete and create to rebind); ClusterRoleBindings
//! ([`super::cluster_role_binding`]) share the checks.

use serde_json::{json, Value};

use super::replace_lists;
use super::role::GROUP;
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::service::validate::unsupported;
use crate::table::cells::*;
use crate::table::{col, Column, AGE, NAME};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new(GROUP, "RoleBinding");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "rolebindings",
    singular: "rolebinding",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &[],
    categories: &[],
    has_status: false,
    name_rule: NameRule::PathSegment,
    decode: typed::<k8s_openapi::api::rbac::v1::RoleBinding>,
    openapi_schema: openapi_schema::<k8s_openapi::api::rbac::v1::RoleBinding>,
    defaults,
    validate,
    prepare_create: super::nothing,
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

/// Upstream's defaults: the RBAC group for the role and for user and group
/// subjects (a service account's is the core group).
pub(crate) fn defaults(object: &mut Value) {
    if let Some(role) = object.get_mut("roleRef").and_then(Value::as_object_mut) {
        if role
            .get("apiGroup")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
        {
            role.insert("apiGroup".into(), json!(GROUP));
        }
    }
    for subject in object
        .get_mut("subjects")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        let group = match subject["kind"].as_str() {
            Some("User" | "Group") => GROUP,
            _ => "",
        };
        if let Some(map) = subject.as_object_mut() {
            if map
                .get("apiGroup")
                .and_then(Value::as_str)
                .unwrap_or("")
                .is_empty()
            {
                map.insert("apiGroup".into(), json!(group));
            }
        }
    }
}

fn validate(object: &Value, old: Option<&Value>) -> Vec<Cause> {
    binding_causes(object, old, true)
}

/// Upstream's `ValidateRoleBinding` / `ValidateClusterRoleBinding` and
/// their update rule.
pub(crate) fn binding_causes(object: &Value, old: Option<&Value>, namespaced: bool) -> Vec<Cause> {
    let mut causes = Vec::new();
    let role = &object["roleRef"];
    if role["apiGroup"] != GROUP {
        causes.push(unsupported(
            "roleRef.apiGroup",
            role["apiGroup"].as_str().unwrap_or(""),
            &format!("{GROUP:?}"),
        ));
    }
    let kinds: &[&str] = if namespaced {
        &["Role", "ClusterRole"]
    } else {
        &["ClusterRole"]
    };
    let kind = role["kind"].as_str().unwrap_or("");
    if !kinds.contains(&kind) {
        let supported: Vec<String> = kinds.iter().map(|k| format!("{k:?}")).collect();
        causes.push(unsupported("roleRef.kind", kind, &supported.join(", ")));
    }
    match role["name"].as_str().unwrap_or("") {
        "" => causes.push(Cause::required("roleRef.name", "")),
        name => {
            for problem in crate::name::path_segment(name) {
                causes.push(Cause::invalid("roleRef.name", name, &problem));
            }
        }
    }
    for (i, subject) in arr(object, &["subjects"]).iter().enumerate() {
        causes.extend(subject_causes(
            subject,
            namespaced,
            &format!("subjects[{i}]"),
        ));
    }
    if let Some(old) = old {
        if old["roleRef"] != object["roleRef"] {
            causes.push(Cause::invalid(
                "roleRef",
                object["roleRef"].clone(),
                "cannot change roleRef",
            ));
        }
    }
    causes
}

/// Upstream's `ValidateRoleBindingSubject`.
fn subject_causes(subject: &Value, namespaced: bool, at: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    let field = |f: &str| format!("{at}.{f}");
    let name = subject["name"].as_str().unwrap_or("");
    let group = subject["apiGroup"].as_str().unwrap_or("");
    if name.is_empty() {
        causes.push(Cause::required(&field("name"), ""));
    }
    match subject["kind"].as_str().unwrap_or("") {
        "ServiceAccount" => {
            if !name.is_empty() {
                for problem in crate::name::dns1123_subdomain(name) {
                    causes.push(Cause::invalid(&field("name"), name, &problem));
                }
            }
            if !group.is_empty() {
                causes.push(unsupported(&field("apiGroup"), group, "\"\""));
            }
            if !namespaced && subject["namespace"].as_str().unwrap_or("").is_empty() {
                causes.push(Cause::required(&field("namespace"), ""));
            }
        }
        "User" | "Group" => {
            if group != GROUP {
                causes.push(unsupported(
                    &field("apiGroup"),
                    group,
                    &format!("{GROUP:?}"),
                ));
            }
        }
        other => causes.push(unsupported(
            &field("kind"),
            other,
            "\"ServiceAccount\", \"User\", \"Group\"",
        )),
    }
    causes
}

/// kubectl's columns: the role, then (wide) who it is granted to.
pub(crate) fn columns() -> Vec<Column> {
    vec![
        NAME,
        col("Role", "The role it grants.", 0),
        AGE,
        col("Users", "The users it is granted to.", 1),
        col("Groups", "The groups it is granted to.", 1),
        col(
            "ServiceAccounts",
            "The service accounts it is granted to.",
            1,
        ),
    ]
}

pub(crate) fn cells(object: &Value, now: i64) -> Vec<Value> {
    let subjects = arr(object, &["subjects"]);
    let of = |kind: &str| -> String {
        subjects
            .iter()
            .filter(|s| s["kind"] == kind)
            .map(|s| match (kind, s["namespace"].as_str()) {
                ("ServiceAccount", Some(ns)) => {
                    format!("{ns}/{}", s["name"].as_str().unwrap_or(""))
                }
                _ => s["name"].as_str().unwrap_or("").to_owned(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    vec![
        name(object),
        json!(format!(
            "{}/{}",
            s(object, &["roleRef", "kind"]).unwrap_or(""),
            s(object, &["roleRef", "name"]).unwrap_or("")
        )),
        age(object, now),
        json!(of("User")),
        json!(of("Group")),
        json!(of("ServiceAccount")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bindings_are_defaulted_and_checked_as_upstream() {
        let mut binding = json!({
            "roleRef": {"kind": "Role", "name": "reader"},
            "subjects": [{"kind": "User", "name": "alice"}, {"kind": "ServiceAccount", "name": "app"}]});
        defaults(&mut binding);
        assert_eq!(binding["roleRef"]["apiGroup"], GROUP);
        assert_eq!(binding["subjects"][0]["apiGroup"], GROUP);
        assert_eq!(binding["subjects"][1]["apiGroup"], "");
        assert!(validate(&binding, None).is_empty());
        // A cluster binding's service accounts name their namespace, and
        // grant only ClusterRoles.
        let causes = binding_causes(&binding, None, false);
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["roleRef.kind", "subjects[1].namespace"]);
        let mut rebound = binding.clone();
        rebound["roleRef"]["name"] = json!("writer");
        assert_eq!(validate(&rebound, Some(&binding)).len(), 1);
    }
}
