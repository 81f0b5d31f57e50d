//! No escalation through RBAC itself: a user may write a role only with
//! rules they already hold, and bind a role only if they hold its rules,
//! unless they may `escalate` roles or `bind` that role. Upstream checks
//! this in the roles' and bindings' storage; Portal in the write path,
//! once the object about to be stored is known (creates, updates, patches
//! and applies alike).

use portal_api::kinds::{cluster_role, cluster_role_binding, role, role_binding};
use portal_api::{Resource, Status};
use serde_json::Value;

use super::rule::{uncovered, Request, Rule};
use crate::security::user::{requester, User};
use crate::ApiState;

/// Whether the requester may store `object` (`old`: what it replaces).
pub(crate) fn check(
    state: &ApiState,
    resource: &Resource,
    namespace: Option<&str>,
    object: &Value,
    old: Option<&Value>,
) -> Result<(), Status> {
    let kind = resource.kind();
    let is_role = kind == role::KIND || kind == cluster_role::KIND;
    let is_binding = kind == role_binding::KIND || kind == cluster_role_binding::KIND;
    if !is_role && !is_binding {
        return Ok(());
    }
    // The server's own writes (the bootstrap policy, aggregation) and
    // superusers are not checked.
    let Some(user) = requester().filter(|u| !u.is_admin()) else {
        return Ok(());
    };
    let name = object["metadata"]["name"].as_str().unwrap_or("");
    if is_role {
        let unchanged = old.is_some_and(|old| {
            old["rules"] == object["rules"] && old["aggregationRule"] == object["aggregationRule"]
        });
        if unchanged || may(state, &user, "escalate", resource.plural, namespace, name) {
            return Ok(());
        }
        let granted = if object["aggregationRule"].is_object() {
            // Aggregation can gather any rule: only who holds all may.
            vec![everything()]
        } else {
            Rule::all_of(object)
        };
        return confirm(state, &user, resource, namespace, name, &granted);
    }
    if old.is_some_and(|old| old["roleRef"] == object["roleRef"]) {
        return Ok(());
    }
    let role_ref = &object["roleRef"];
    let role_name = role_ref["name"].as_str().unwrap_or("");
    let (roles, granted) = match role_ref["kind"].as_str() {
        Some("ClusterRole") => (
            "clusterroles",
            stored_rules(state, &cluster_role::RESOURCE, None, role_name),
        ),
        _ => (
            "roles",
            stored_rules(state, &role::RESOURCE, namespace, role_name),
        ),
    };
    if may(state, &user, "bind", roles, namespace, role_name) {
        return Ok(());
    }
    confirm(state, &user, resource, namespace, name, &granted)
}

/// Whether `user` may `verb` the role `name` (`escalate`, `bind`).
fn may(
    state: &ApiState,
    user: &User,
    verb: &str,
    roles: &str,
    namespace: Option<&str>,
    name: &str,
) -> bool {
    let request = Request::Resource {
        verb,
        group: role::GROUP,
        resource: roles,
        subresource: None,
        name: Some(name),
    };
    state.rbac.allows(user, namespace, &request)
}

fn stored_rules(
    state: &ApiState,
    resource: &'static Resource,
    namespace: Option<&str>,
    name: &str,
) -> Vec<Rule> {
    state
        .cache
        .get(resource, &resource.key(namespace, name))
        .map(|cached| Rule::all_of(&cached.value))
        .unwrap_or_default()
}

fn everything() -> Rule {
    let all = || vec!["*".to_owned()];
    Rule {
        verbs: all(),
        api_groups: all(),
        resources: all(),
        ..Rule::default()
    }
}

/// Refused, in upstream's words, unless `user` holds every rule in
/// `granted` where the object applies.
fn confirm(
    state: &ApiState,
    user: &User,
    resource: &Resource,
    namespace: Option<&str>,
    name: &str,
    granted: &[Rule],
) -> Result<(), Status> {
    let held = state.rbac.rules_of(user, namespace);
    let missing = uncovered(&held, granted);
    if missing.is_empty() {
        return Ok(());
    }
    let listed: Vec<String> = missing.iter().map(compact).collect();
    let groups: Vec<String> = user.groups.iter().map(|g| format!("{g:?}")).collect();
    Err(Status::forbidden(format!(
        "{}.{} {name:?} is forbidden: user {:?} (groups=[{}]) is attempting to grant RBAC permissions not currently held:\n{}",
        resource.plural,
        resource.group,
        user.name,
        groups.join(" "),
        listed.join("\n")
    )))
}

/// Upstream's `CompactString` of a rule: `{APIGroups:[""], Resources:["pods"], Verbs:["delete"]}`.
fn compact(rule: &Rule) -> String {
    let list = |items: &[String]| {
        let quoted: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
        format!("[{}]", quoted.join(", "))
    };
    let mut parts = Vec::new();
    for (label, items) in [
        ("APIGroups", &rule.api_groups),
        ("Resources", &rule.resources),
        ("ResourceNames", &rule.resource_names),
        ("NonResourceURLs", &rule.non_resource_urls),
        ("Verbs", &rule.verbs),
    ] {
        if !items.is_empty() {
            parts.push(format!("{label}:{}", list(items)));
        }
    }
    format!("{{{}}}", parts.join(", "))
}
