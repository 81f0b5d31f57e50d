//! Namespace termination, as kube-controller-manager's namespace
//! controller: a namespace marked for deletion is emptied — every
//! namespaced kind the API serves (found by discovery, so kinds added
//! later count too) is deleted by collection — and once nothing is left it
//! says so in its conditions, looks once more (a write admitted before the
//! namespace was marked may land after the first pass), takes its
//! `kubernetes` finalizer off through `finalize`, and deletes it again,
//! which removes it. Pods stopping on their nodes keep it Terminating
//! until they are gone. A restart resumes where it stopped: the state is
//! the namespace's own.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{
    DeleteParams, DynamicObject, ListParams, PartialObjectMeta, Patch, PatchParams, Preconditions,
};
use kube::core::discovery::Scope;
use kube::discovery::{verbs, ApiResource, Discovery};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::ReconcileError as Error;

/// The field manager of its writes (conditions, finalizer).
pub const MANAGER: &str = "portal-namespace-controller";

/// The finalizer the controller is responsible for.
const FINALIZER: &str = "kubernetes";
/// How soon a namespace with content still stopping is looked at again.
const RECHECK: Duration = Duration::from_secs(1);
/// How soon the second look after the content is gone comes.
const LOOK_AGAIN: Duration = Duration::from_millis(200);

struct Context {
    client: Client,
    retries: crate::Retries,
}

pub async fn run(client: Client) {
    let controller = Controller::new(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default(),
    )
    .with_config(crate::config());
    let context = Arc::new(Context {
        client,
        retries: crate::Retries::new(Duration::from_millis(500)),
    });
    let results = controller.run(reconcile, error_policy, context.clone());
    crate::drive(results, "namespace", &context.retries).await;
}

fn error_policy(namespace: Arc<Namespace>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, namespace = %namespace.name_any(), "namespace cleanup failed; retrying");
    Action::requeue(ctx.retries.after_failure(namespace.as_ref()))
}

fn finalizers(namespace: &Namespace) -> Vec<String> {
    namespace
        .spec
        .as_ref()
        .and_then(|spec| spec.finalizers.clone())
        .unwrap_or_default()
}

/// Whether the controller already said the content is gone.
fn announced(namespace: &Namespace) -> bool {
    namespace
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "NamespaceContentRemaining" && c.status == "False")
        })
}

async fn reconcile(namespace: Arc<Namespace>, ctx: Arc<Context>) -> Result<Action, Error> {
    if namespace.metadata.deletion_timestamp.is_none() {
        return Ok(Action::await_change());
    }
    let name = namespace.name_any();
    let api = Api::<Namespace>::all(ctx.client.clone());
    if !finalizers(&namespace).iter().any(|f| f == FINALIZER) {
        // Finalized: the second DELETE removes it.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: namespace.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        return match api.delete(&name, &params).await {
            Ok(_) => {
                tracing::info!(namespace = %name, "namespace deleted");
                Ok(Action::await_change())
            }
            Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => {
                Ok(Action::await_change())
            }
            Err(error) => Err(error.into()),
        };
    }
    let left = remove_content(&ctx.client, &name).await?;
    if left > 0 {
        return Ok(Action::requeue(RECHECK));
    }
    if !announced(&namespace) {
        let patch = json!({"status": {"phase": "Terminating", "conditions": content_removed()}});
        let params = PatchParams {
            field_manager: Some(MANAGER.to_owned()),
            ..PatchParams::default()
        };
        api.patch_status(&name, &params, &Patch::Merge(&patch))
            .await?;
        return Ok(Action::requeue(LOOK_AGAIN));
    }
    finalize(&ctx.client, &namespace).await?;
    Ok(Action::await_change())
}

/// Takes the `kubernetes` finalizer off, as of the version seen.
async fn finalize(client: &Client, namespace: &Namespace) -> Result<(), Error> {
    let name = namespace.name_any();
    let mut finalized = namespace.clone();
    finalized.metadata.managed_fields = None;
    if let Some(spec) = finalized.spec.as_mut() {
        spec.finalizers = Some(
            finalizers(namespace)
                .into_iter()
                .filter(|f| f != FINALIZER)
                .collect(),
        );
    }
    let body = serde_json::to_vec(&finalized).map_err(kube::Error::SerdeError)?;
    let request = http::Request::put(format!(
        "/api/v1/namespaces/{name}/finalize?fieldManager={MANAGER}"
    ))
    .header(http::header::CONTENT_TYPE, "application/json")
    .body(body)
    .map_err(kube::Error::HttpError)?;
    match client.request::<Namespace>(request).await {
        Ok(_) => Ok(()),
        // Gone, or changed since: the next reconcile sees it as it is.
        Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// The namespaced kinds that can be listed and deleted by collection.
async fn namespaced_kinds(client: &Client) -> Result<Vec<ApiResource>, Error> {
    let discovery = Discovery::new(client.clone()).run().await?;
    Ok(discovery
        .groups()
        .flat_map(|group| group.recommended_resources())
        .filter(|(_, capabilities)| {
            capabilities.scope == Scope::Namespaced
                && capabilities.supports_operation(verbs::LIST)
                && capabilities.supports_operation(verbs::DELETE_COLLECTION)
        })
        .map(|(resource, _)| resource)
        .collect())
}

/// Deletes what is in the namespace; how many objects are still there
/// (stopping, or held by finalizers).
async fn remove_content(client: &Client, namespace: &str) -> Result<usize, Error> {
    let mut left = 0;
    for resource in namespaced_kinds(client).await? {
        let api = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource);
        match api
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if matches!(status.code, 404 | 405) => continue,
            Err(error) => return Err(error.into()),
        }
        let metadata = Api::<PartialObjectMeta<DynamicObject>>::namespaced_with(
            client.clone(),
            namespace,
            &resource,
        );
        left += metadata.list(&ListParams::default()).await?.items.len();
    }
    Ok(left)
}

/// The conditions Kubernetes' namespace controller writes once the content
/// is gone.
fn content_removed() -> serde_json::Value {
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let condition = |kind: &str, reason: &str, message: &str| json!({"type": kind, "status": "False", "lastTransitionTime": now, "reason": reason, "message": message});
    json!([
        condition(
            "NamespaceDeletionDiscoveryFailure",
            "ResourcesDiscovered",
            "All resources successfully discovered"
        ),
        condition(
            "NamespaceDeletionGroupVersionParsingFailure",
            "ParsedGroupVersions",
            "All legacy kube types successfully parsed"
        ),
        condition(
            "NamespaceDeletionContentFailure",
            "ContentDeleted",
            "All content successfully deleted, may be waiting on finalization"
        ),
        condition(
            "NamespaceContentRemaining",
            "ContentRemoved",
            "All content successfully removed"
        ),
        condition(
            "NamespaceFinalizersRemaining",
            "ContentHasNoFinalizers",
            "All content-preserving finalizers finished"
        ),
    ])
}
