//! `pods/{name}/eviction` (`policy/v1` Eviction): how `kubectl drain` and
//! other tools ask a pod to go, honouring its PodDisruptionBudget as
//! kube-apiserver does. A pod that is not running yet, finished or already
//! going is deleted at once; one no budget selects too; one that two
//! budgets select is refused (500). Otherwise the budget must allow a
//! disruption: the eviction takes one (`disruptionsAllowed` down by one,
//! the pod recorded in `disruptedPods`, one compare-and-swap on the budget's
//! status) and deletes the pod with the Eviction's `deleteOptions`; with
//! none left it is refused with 429 and the budget's numbers. A budget the
//! disruption controller has not caught up with refuses too (429), and an
//! unhealthy pod may go whenever the budget's policy allows.

use http::Response;
use portal_api::selector::LabelSelector;
use portal_api::{kinds, Cause, Status};
use serde_json::{json, Value};

use crate::registry::write::{self, guaranteed_update, Part, Proposal, WriteOptions};
use crate::server::http::{created_success, Body, Query};
use crate::{ApiState, Scope};

pub(crate) async fn evict(
    state: &ApiState,
    scope: &Scope<'_>,
    name: &str,
    body: &[u8],
    content_type: &str,
    query: &Query,
) -> Result<Response<Body>, Status> {
    let eviction = super::review::decode_request(body, content_type, "policy", "Eviction")?;
    let named = eviction["metadata"]["name"].as_str().unwrap_or("");
    if named != name {
        return Err(Status::bad_request(
            "name in URL does not match name in Eviction object",
        ));
    }
    if let Some(namespace) = eviction["metadata"]["namespace"].as_str() {
        if !namespace.is_empty() && Some(namespace) != scope.namespace {
            return Err(Status::bad_request(
                "namespace in URL does not match namespace in Eviction object",
            ));
        }
    }
    let options = match &eviction["deleteOptions"] {
        Value::Null => Vec::new(),
        options => serde_json::to_vec(options).unwrap_or_default(),
    };
    let dry_run = query.get("dryRun").is_some() || eviction["deleteOptions"]["dryRun"].is_array();
    if let Some(pod) = state
        .cache
        .get(scope.resource, &scope.resource.key(scope.namespace, name))
    {
        if !ignores_budgets(&pod.value) {
            take_disruption(state, scope, &pod.value, dry_run).await?;
        }
    }
    write::delete(state, scope, name, &options, "application/json", query).await?;
    Ok(created_success())
}

/// Pods evicted without asking their budget: not running yet, finished,
/// or already being deleted.
fn ignores_budgets(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Pending" | "Succeeded" | "Failed") | None
    ) || pod["metadata"]["deletionTimestamp"].is_string()
}

fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// Takes one disruption from the pod's budget, or refuses.
async fn take_disruption(
    state: &ApiState,
    scope: &Scope<'_>,
    pod: &Value,
    dry_run: bool,
) -> Result<(), Status> {
    let budgets_resource = &kinds::pod_disruption_budget::RESOURCE;
    let namespace = scope.namespace.unwrap_or("");
    let prefix = format!("{}{namespace}/", budgets_resource.key_prefix());
    let labels = &pod["metadata"]["labels"];
    let (budgets, _, _) = state
        .cache
        .list(budgets_resource, &prefix, None, 0, |budget| {
            LabelSelector::from_api(&budget.value["spec"]["selector"], "spec.selector")
                .is_ok_and(|s| s.matches(|k| labels.get(k).and_then(Value::as_str)))
        });
    let budget = match budgets.as_slice() {
        [] => return Ok(()),
        [one] => one.value.clone(),
        _ => {
            return Err(Status::internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ))
        }
    };
    let budget_name = budget["metadata"]["name"].as_str().unwrap_or("").to_owned();
    let status = &budget["status"];
    let healthy = status["currentHealthy"].as_i64().unwrap_or(0);
    let desired = status["desiredHealthy"].as_i64().unwrap_or(0);
    // An unhealthy pod may go if the budget's policy says so, or while the
    // budget holds (upstream's IfHealthyBudget).
    if !is_ready(pod) {
        let policy = budget["spec"]["unhealthyPodEvictionPolicy"].as_str();
        if policy == Some("AlwaysAllow") || healthy >= desired && desired > 0 {
            return Ok(());
        }
    }
    let pod_name = pod["metadata"]["name"].as_str().unwrap_or("").to_owned();
    let budget_scope = Scope {
        resource: budgets_resource,
        namespace: scope.namespace,
    };
    let options = WriteOptions::internal("portal-eviction");
    let propose = |current: &Value| -> Result<Proposal, Status> {
        let observed = current["status"]["observedGeneration"]
            .as_i64()
            .unwrap_or(0);
        let generation = current["metadata"]["generation"].as_i64().unwrap_or(0);
        if observed < generation {
            return Err(Status::too_many_requests(
                format!(
                    "the disruption budget {budget_name} is still being processed by the server"
                ),
                Vec::new(),
            ));
        }
        let allowed = current["status"]["disruptionsAllowed"]
            .as_i64()
            .unwrap_or(0);
        if allowed <= 0 {
            let healthy = current["status"]["currentHealthy"].as_i64().unwrap_or(0);
            let desired = current["status"]["desiredHealthy"].as_i64().unwrap_or(0);
            return Err(Status::too_many_requests(
                "Cannot evict pod as it would violate the pod's disruption budget.",
                vec![Cause {
                    reason: "DisruptionBudget".into(),
                    message: format!(
                        "The disruption budget {budget_name} needs {desired} healthy pods and has {healthy} currently"
                    ),
                    field: String::new(),
                }],
            ));
        }
        let mut object = current.clone();
        object["status"]["disruptionsAllowed"] = json!(allowed - 1);
        if !object["status"]["disruptedPods"].is_object() {
            object["status"]["disruptedPods"] = json!({});
        }
        object["status"]["disruptedPods"][&pod_name] = json!(crate::registry::strategy::now());
        Ok(Proposal {
            object,
            expected: None,
            warnings: Vec::new(),
            managed: None,
        })
    };
    if dry_run {
        // Checked against the budget as it stands; nothing is written.
        return propose(&budget).map(|_| ());
    }
    guaranteed_update(
        state,
        &budget_scope,
        &budget_name.clone(),
        Part::Status,
        &options,
        propose,
    )
    .await?;
    Ok(())
}
