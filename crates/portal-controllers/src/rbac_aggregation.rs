//! ClusterRole aggregation, as kube-controller-manager's
//! clusterrole-aggregation controller: a ClusterRole with an
//! `aggregationRule` holds the rules of every ClusterRole its selectors
//! match (`admin`, `edit` and `view` gather the `aggregate-to-*` roles, so
//! a CRD's roles can extend them). Any ClusterRole change looks at every
//! aggregated role again; only roles whose rules differ are written.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use portal_api::selector::LabelSelector;
use serde_json::json;

/// The field manager of its writes.
pub const MANAGER: &str = "clusterrole-aggregation-controller";

pub async fn run(client: Client) {
    let (roles, writer) = reflector::store::<ClusterRole>();
    let api = Api::<ClusterRole>::all(client.clone());
    let mut events = std::pin::pin!(watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .touched_objects());
    // Changes come in bursts (a chart's roles): one pass per burst.
    while let Some(event) = events.next().await {
        if event.is_err() {
            continue;
        }
        while let Some(Some(_)) = futures_util::FutureExt::now_or_never(events.next()) {}
        if let Err(error) = aggregate_all(&api, &roles).await {
            tracing::warn!(%error, "ClusterRole aggregation failed; next change retries");
            tokio::time::sleep(Duration::from_millis(500)).await;
            let _ = aggregate_all(&api, &roles).await;
        }
    }
}

async fn aggregate_all(
    api: &Api<ClusterRole>,
    roles: &Store<ClusterRole>,
) -> Result<(), kube::Error> {
    let all = roles.state();
    for role in all.iter().filter(|r| r.aggregation_rule.is_some()) {
        let wanted = gathered(role, &all);
        if role.rules.clone().unwrap_or_default() == wanted {
            continue;
        }
        let patch = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": role.name_any()},
            "rules": wanted,
        });
        api.patch(
            &role.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    }
    Ok(())
}

/// The rules of every other ClusterRole `role`'s selectors match, each
/// rule once, in a stable order (by role name).
fn gathered(role: &ClusterRole, all: &[Arc<ClusterRole>]) -> Vec<PolicyRule> {
    let selectors: Vec<LabelSelector> = role
        .aggregation_rule
        .as_ref()
        .and_then(|rule| rule.cluster_role_selectors.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|selector| {
            let value = serde_json::to_value(selector).ok()?;
            LabelSelector::from_api(&value, "clusterRoleSelectors").ok()
        })
        .collect();
    let mut sources: Vec<&Arc<ClusterRole>> = all
        .iter()
        .filter(|other| other.name_any() != role.name_any())
        .filter(|other| {
            let labels = other.labels();
            selectors
                .iter()
                .any(|s| !s.is_empty() && s.matches(|key| labels.get(key).map(String::as_str)))
        })
        .collect();
    sources.sort_by_key(|r| r.name_any());
    let mut rules: Vec<PolicyRule> = Vec::new();
    for source in sources {
        for rule in source.rules.iter().flatten() {
            if !rules.contains(rule) {
                rules.push(rule.clone());
            }
        }
    }
    rules
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(value: serde_json::Value) -> Arc<ClusterRole> {
        Arc::new(serde_json::from_value(value).unwrap())
    }

    #[test]
    fn aggregated_roles_gather_matching_roles_rules_once() {
        let view = role(json!({"metadata": {"name": "view"},
            "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"agg": "view"}}]}}));
        let a = role(json!({"metadata": {"name": "a", "labels": {"agg": "view"}},
            "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]}));
        let b = role(json!({"metadata": {"name": "b", "labels": {"agg": "view"}},
            "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]},
                      {"verbs": ["list"], "apiGroups": ["x"], "resources": ["widgets"]}]}));
        let other = role(json!({"metadata": {"name": "c"},
            "rules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}]}));
        let rules = gathered(&view, &[view.clone(), a, b, other]);
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[1].resources.as_ref().unwrap()[0], "widgets");
    }
}
