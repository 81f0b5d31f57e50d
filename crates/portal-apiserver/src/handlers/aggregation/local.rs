//! This server's own group versions as local APIServices (no
//! `spec.service`), as kube-apiserver registers them: the built-in ones
//! with kube-apiserver's priorities and `automanaged: onstart`, those of
//! CustomResourceDefinitions with priority 1000/100 and `automanaged:
//! true`, made when a definition comes and deleted when it goes. An
//! APIService a user made for the same name is left alone. One server of
//! a cluster does this (the cluster duties).

use std::sync::Arc;

use portal_api::kinds::{api_service, custom_resource_definition as crd};
use portal_api::Status;
use serde_json::{json, Value};

use crate::registry::deletion::{self, Propagation};
use crate::registry::write::internal::{Change, Writer};
use crate::registry::write::Part;
use crate::ApiState;

const MANAGER: &str = "kube-apiserver";

/// kube-apiserver's priorities of its own group versions (group minimum,
/// version); a group not here is a defined one.
fn built_in_priority(group: &str, version: &str) -> Option<(i64, i64)> {
    let group_minimum = match group {
        "" => 18000,
        "events.k8s.io" => 17750,
        "apps" => 17800,
        "authentication.k8s.io" => 17700,
        "authorization.k8s.io" => 17600,
        "autoscaling" => 17500,
        "batch" => 17400,
        "certificates.k8s.io" => 17300,
        "networking.k8s.io" => 17200,
        "policy" => 17100,
        "rbac.authorization.k8s.io" => 17000,
        "storage.k8s.io" => 16800,
        "apiextensions.k8s.io" | "admissionregistration.k8s.io" => 16700,
        "scheduling.k8s.io" => 16600,
        "coordination.k8s.io" => 16500,
        "node.k8s.io" => 16300,
        "discovery.k8s.io" => 16200,
        "flowcontrol.apiserver.k8s.io" => 16100,
        "apiregistration.k8s.io" => 18000,
        _ => return None,
    };
    let version_priority = match (group, version) {
        ("", _) => 1,
        ("autoscaling", "v2") => 30,
        (_, "v1") => 15,
        _ => 9,
    };
    Some((group_minimum, version_priority))
}

/// The local APIServices this server's groups call for.
fn wanted() -> Vec<Value> {
    let mut served: Vec<(&str, &str)> = vec![("", "v1")];
    for (group, versions) in crate::handlers::discovery::groups() {
        served.extend(versions.iter().map(|v| (group, *v)));
    }
    served
        .into_iter()
        .map(|(group, version)| {
            let (priorities, managed) = match built_in_priority(group, version) {
                Some(priorities) => (priorities, "onstart"),
                None => ((1000, 100), "true"),
            };
            json!({
                "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                "metadata": {
                    "name": api_service::name_of(group, version),
                    "labels": {api_service::AUTOMANAGED: managed},
                },
                "spec": {
                    "group": group, "version": version,
                    "groupPriorityMinimum": priorities.0, "versionPriority": priorities.1,
                },
            })
        })
        .collect()
}

/// Keeps the local APIServices whenever definitions change.
pub(crate) async fn run(state: Arc<ApiState>) {
    let mut advanced = state.cache.subscribe();
    let mut handled = None;
    loop {
        let changed = state.cache.changed(&[crd::KIND, api_service::KIND]);
        if handled != Some(changed) {
            handled = Some(changed);
            crate::registry::defined::sync(&state);
            if let Err(status) = reconcile(&state).await {
                tracing::warn!(message = %status.message, "cannot keep the local APIServices");
            }
        }
        if advanced.changed().await.is_err() {
            return;
        }
    }
}

async fn reconcile(state: &ApiState) -> Result<(), Status> {
    let existing = super::api_services(state);
    let wanted = wanted();
    let writer = Writer::new(state, &api_service::RESOURCE, MANAGER);
    for object in &wanted {
        let name = object["metadata"]["name"].as_str().unwrap_or("");
        let current = existing.iter().find(|a| a["metadata"]["name"] == name);
        match current {
            None => match writer.create(None, object.clone()).await {
                Err(status) if status.code != 409 => return Err(status),
                _ => {}
            },
            // Kept in step while it is ours; a user's own is theirs.
            Some(current) if !current["metadata"]["labels"][api_service::AUTOMANAGED].is_null() => {
                if current["spec"] == object["spec"] {
                    continue;
                }
                let spec = object["spec"].clone();
                let written = writer
                    .update(None, name, Part::Main, |current| {
                        if current["spec"] == spec {
                            return Change::Keep;
                        }
                        let mut next = current.clone();
                        next["spec"] = spec.clone();
                        Change::Write(next)
                    })
                    .await;
                match written {
                    Err(status) if status.code != 404 => return Err(status),
                    _ => {}
                }
            }
            Some(_) => {}
        }
    }
    // A definition's group version no longer served: its APIService goes.
    for current in &existing {
        let name = current["metadata"]["name"].as_str().unwrap_or("");
        let ours = current["metadata"]["labels"][api_service::AUTOMANAGED] == "true";
        if ours
            && !current["spec"]["service"].is_object()
            && !wanted.iter().any(|w| w["metadata"]["name"] == name)
        {
            let key = api_service::RESOURCE.key(None, name);
            let Some(stored) = state.store.get(&key).await.map_err(crate::store_error)? else {
                continue;
            };
            match deletion::delete_object(
                state.store.as_ref(),
                &state.allocators,
                &api_service::RESOURCE,
                &stored,
                None,
                Propagation::Background,
            )
            .await
            {
                Ok(_)
                | Err(
                    portal_store::Error::Conflict { .. } | portal_store::Error::NotFound { .. },
                ) => {}
                Err(error) => return Err(crate::store_error(error)),
            }
        }
    }
    Ok(())
}
