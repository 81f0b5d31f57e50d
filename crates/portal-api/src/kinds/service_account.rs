//! ServiceAccounts (core `v1`, `sa`): the identity a pod's processes have
//! when they talk to the API (`system:serviceaccount:NS:NAME`). Every
//! namespace gets a `default` one; a pod names its own in
//! `serviceAccountName` and gets a short-lived token for it in a projected
//! volume. The `token` subresource is the TokenRequest API
//! (`kubectl create token`).

use serde_json::{json, Value};

use super::{nothing, replace_lists, Subresource};
use crate::schema::{openapi_schema, typed, Generation, Kind, NameRule, Resource};
use crate::table::cells::*;
use crate::table::{col, Column, AGE, NAME};
use crate::Cause;

/// The kind this module defines.
pub const KIND: Kind = Kind::new("", "ServiceAccount");

/// The account every namespace has and pods use unless they name another.
pub const DEFAULT_NAME: &str = "default";

/// A service account's user name: `system:serviceaccount:NS:NAME`.
pub fn user_name(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// The namespace and name of a service account's user name.
pub fn parse_user_name(user: &str) -> Option<(&str, &str)> {
    let rest = user.strip_prefix("system:serviceaccount:")?;
    let (namespace, name) = rest.split_once(':')?;
    (!namespace.is_empty() && !name.is_empty() && !name.contains(':')).then_some((namespace, name))
}

/// The groups every service account is in: all of them, and its namespace's.
pub fn groups(namespace: &str) -> [String; 2] {
    [
        "system:serviceaccounts".to_owned(),
        format!("system:serviceaccounts:{namespace}"),
    ]
}

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "serviceaccounts",
    singular: "serviceaccount",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &["sa"],
    categories: &[],
    has_status: false,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::core::v1::ServiceAccount>,
    openapi_schema: openapi_schema::<k8s_openapi::api::core::v1::ServiceAccount>,
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
    subresources: &[Subresource {
        name: "token",
        kind: "TokenRequest",
        verbs: &["create"],
        group_version: Some(("authentication.k8s.io", "v1")),
    }],
};

/// Upstream's `ValidateServiceAccount`: the secrets it lists are named.
fn validate(object: &Value, _old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    for field in ["secrets", "imagePullSecrets"] {
        for (i, reference) in arr(object, &[field]).iter().enumerate() {
            if reference["name"].as_str().unwrap_or("").is_empty() {
                causes.push(Cause::required(&format!("{field}[{i}].name"), ""));
            }
        }
    }
    causes
}

fn columns() -> Vec<Column> {
    vec![
        NAME,
        Column {
            kind: "integer",
            ..col("Secrets", "The number of secrets it lists.", 0)
        },
        AGE,
    ]
}

fn cells(object: &Value, now: i64) -> Vec<Value> {
    vec![
        name(object),
        json!(arr(object, &["secrets"]).len()),
        age(object, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_names_round_trip() {
        let user = user_name("team-a", "app");
        assert_eq!(user, "system:serviceaccount:team-a:app");
        assert_eq!(parse_user_name(&user), Some(("team-a", "app")));
        assert_eq!(parse_user_name("system:serviceaccount:team-a"), None);
        assert_eq!(parse_user_name("alice"), None);
        assert!(validate(&json!({"imagePullSecrets": [{}]}), None).len() == 1);
    }
}
