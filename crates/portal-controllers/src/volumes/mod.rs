//! Persistent storage, as kube-controller-manager's PV controller and
//! protection controllers (ADR 0025):
//!
//! - **Claims**: a claim with no class gets the default one (retroactively,
//!   as Kubernetes ≥ 1.28); it is bound to the volume promised to it or the
//!   smallest available one that fits ([`binding`]), else a volume is made
//!   by its class's provisioner — the built-in [`local_path`] one here, on
//!   the node the scheduler chose (`WaitForFirstConsumer`), or, for another
//!   provisioner, the claim is marked for it and waits. A bound claim shows
//!   `Bound` with its volume's capacity and access modes; one whose volume
//!   vanished is `Lost`. The `kubernetes.io/pvc-protection` finalizer keeps
//!   a claim in use by a pod until the pod is gone.
//! - **Volumes**: `Available` without a claim, `Bound` with one, `Released`
//!   when their claim is gone, then kept (`Retain`) or deleted (`Delete`,
//!   for the volumes the built-in provisioner made; the node's agent then
//!   removes the data). Others with `Delete` fail, as upstream's without a
//!   deleter plugin.

pub mod binding;
pub mod local_path;

use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{
    Node, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use portal_client::Settled;
use serde_json::json;

use crate::events;
use binding::SELECTED_NODE;

pub use crate::ReconcileError as Error;

const COMPONENT: &str = "persistentvolume-controller";
/// Keeps a claim while a pod uses it.
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// The provisioner a claim waits for (and its older, beta name).
const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
const BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";

struct Context {
    client: Client,
    retries: crate::Retries,
    events: events::Recorder,
    volumes: Store<PersistentVolume>,
    classes: Store<StorageClass>,
    pods: Store<Pod>,
}

/// Runs the claim and volume controllers until the process ends; pods come
/// from the process's shared pod reflector.
pub async fn run(
    client: Client,
    pods: Store<Pod>,
    pod_changes: impl Stream<Item = Settled<Pod>> + Send + 'static,
) {
    ensure_default_class(&client).await;
    let (volumes, volume_writer) = reflector::store::<PersistentVolume>();
    let volume_events = portal_client::settled_objects(
        watcher(
            Api::<PersistentVolume>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .modify(|v| v.metadata.managed_fields = None)
        .reflect(volume_writer),
    );
    let (classes, class_writer) = reflector::store::<StorageClass>();
    let class_events = watcher(
        Api::<StorageClass>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(class_writer)
    .for_each(|_| std::future::ready(()));
    let context = Arc::new(Context {
        client: client.clone(),
        retries: crate::Retries::new(Duration::from_millis(500)),
        events: events::Recorder::new(client.clone(), COMPONENT),
        volumes,
        classes,
        pods,
    });
    let claims = Controller::new(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
    )
    .with_config(crate::config());
    // A volume concerns the claim it names; a pod, the claims it uses.
    let by_volume = |volume: PersistentVolume| {
        let reference = volume.spec.and_then(|s| s.claim_ref)?;
        Some(ObjectRef::new(reference.name.as_deref()?).within(reference.namespace.as_deref()?))
    };
    let by_pod = |pod: Arc<Pod>| -> Vec<ObjectRef<PersistentVolumeClaim>> {
        let namespace = pod.namespace().unwrap_or_default();
        claims_of(&pod)
            .map(|name| ObjectRef::new(name).within(&namespace))
            .collect()
    };
    let claim_results = claims
        .watches_stream(volume_events, by_volume)
        .watches_shared_stream(portal_client::shared::objects(pod_changes), by_pod)
        .run(reconcile_claim, claim_error, context.clone());
    let volume_controller = Controller::new(
        Api::<PersistentVolume>::all(client.clone()),
        watcher::Config::default(),
    )
    .with_config(crate::config());
    // A claim concerns the volume it names.
    let volume_results = volume_controller
        .watches(
            Api::<PersistentVolumeClaim>::all(client),
            watcher::Config::default(),
            |claim| Some(ObjectRef::new(claim.spec.as_ref()?.volume_name.as_deref()?)),
        )
        .run(reconcile_volume, volume_error, context.clone());
    tokio::join!(
        class_events,
        crate::drive(claim_results, COMPONENT, &context.retries),
        crate::drive(volume_results, COMPONENT, &context.retries),
    );
}

/// Makes the default class when the cluster has no class at all (a first
/// start); one deleted later stays deleted.
async fn ensure_default_class(client: &Client) {
    let api: Api<StorageClass> = Api::all(client.clone());
    for _ in 0..30 {
        match api.list(&kube::api::ListParams::default().limit(1)).await {
            Ok(list) if !list.items.is_empty() => return,
            Ok(_) => match api
                .create(&PostParams::default(), &local_path::default_class())
                .await
            {
                Ok(_) => return,
                Err(kube::Error::Api(status)) if status.code == 409 => return,
                Err(error) => tracing::warn!(%error, "making the default StorageClass"),
            },
            Err(error) => tracing::debug!(%error, "listing StorageClasses"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The claims a pod's volumes name.
fn claims_of(pod: &Pod) -> impl Iterator<Item = &str> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.as_str())
}

fn claim_error(claim: Arc<PersistentVolumeClaim>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::debug!(%error, claim = %claim.name_any(), "claim sync failed; retrying");
    Action::requeue(ctx.retries.after_failure(claim.as_ref()))
}

fn volume_error(volume: Arc<PersistentVolume>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::debug!(%error, volume = %volume.name_any(), "volume sync failed; retrying");
    Action::requeue(ctx.retries.after_failure(volume.as_ref()))
}

fn reference_to(claim: &PersistentVolumeClaim) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        name: Some(claim.name_any()),
        namespace: claim.namespace(),
        uid: claim.metadata.uid.clone(),
        ..ObjectReference::default()
    }
}

impl Context {
    fn claims(&self, namespace: &str) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), namespace)
    }

    fn volumes_api(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    fn default_class(&self) -> Option<Arc<StorageClass>> {
        let mut defaults: Vec<Arc<StorageClass>> = self
            .classes
            .state()
            .into_iter()
            .filter(|c| {
                c.annotations()
                    .get(portal_api::kinds::storage_class::DEFAULT_ANNOTATION)
                    .is_some_and(|v| v == "true")
            })
            .collect();
        // Several defaults: the newest, as upstream picks.
        defaults.sort_by_key(|c| {
            (
                c.metadata.creation_timestamp.as_ref().map(|t| t.0),
                c.name_any(),
            )
        });
        defaults.pop()
    }

    /// Whether a pod that has not ended uses the claim.
    fn in_use(&self, claim: &PersistentVolumeClaim) -> bool {
        let namespace = claim.namespace();
        let name = claim.name_any();
        self.pods.state().iter().any(|pod| {
            pod.namespace() == namespace
                && !matches!(
                    pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                )
                && claims_of(pod).any(|c| c == name)
        })
    }
}

async fn reconcile_claim(
    claim: Arc<PersistentVolumeClaim>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let namespace = claim.namespace().unwrap_or_default();
    let name = claim.name_any();
    let api = ctx.claims(&namespace);
    let finalizers = claim.finalizers().to_vec();
    let protected = finalizers.iter().any(|f| f == PVC_PROTECTION);
    if claim.metadata.deletion_timestamp.is_some() {
        if protected && !ctx.in_use(&claim) {
            let kept: Vec<&String> = finalizers.iter().filter(|f| *f != PVC_PROTECTION).collect();
            let patch = json!({"metadata": {"finalizers": kept, "resourceVersion": claim.resource_version()}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        return Ok(Action::await_change());
    }
    if !protected {
        let mut all = finalizers.clone();
        all.push(PVC_PROTECTION.into());
        let patch =
            json!({"metadata": {"finalizers": all, "resourceVersion": claim.resource_version()}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        return Ok(Action::await_change());
    }
    let spec = claim.spec.clone().unwrap_or_default();
    if spec.storage_class_name.is_none() {
        if let Some(class) = ctx.default_class() {
            let patch = json!({"spec": {"storageClassName": class.name_any()}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            return Ok(Action::await_change());
        }
    }
    match spec.volume_name.as_deref().filter(|v| !v.is_empty()) {
        Some(volume) => sync_bound_claim(&claim, volume, &ctx).await,
        None => sync_unbound_claim(&claim, &ctx).await,
    }
}

/// A claim that names its volume: `Bound` once the volume names it back
/// (a volume it was pre-bound to is promised to it here), `Lost` when the
/// volume is gone.
async fn sync_bound_claim(
    claim: &PersistentVolumeClaim,
    volume_name: &str,
    ctx: &Context,
) -> Result<Action, Error> {
    let namespace = claim.namespace().unwrap_or_default();
    let api = ctx.claims(&namespace);
    let volume = ctx
        .volumes
        .get(&ObjectRef::new(volume_name))
        .filter(|v| v.metadata.deletion_timestamp.is_none());
    let Some(volume) = volume else {
        if phase_of(claim) == Some("Bound") {
            ctx.events
                .record(
                    &reference_to(claim),
                    "Warning",
                    "ClaimLost",
                    "Bound claim has lost its PersistentVolume. Data on the volume is lost!",
                )
                .await;
            let status = json!({"status": {"phase": "Lost"}});
            api.patch_status(
                &claim.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&status),
            )
            .await?;
        }
        return Ok(Action::await_change());
    };
    let volume_spec = volume.spec.clone().unwrap_or_default();
    match &volume_spec.claim_ref {
        None => {
            promise(&volume, claim, ctx).await?;
            return Ok(Action::await_change());
        }
        Some(_) if !binding::promised_to(&volume, claim) => {
            ctx.events
                .record(
                    &reference_to(claim),
                    "Warning",
                    "FailedBinding",
                    &format!("volume \"{volume_name}\" already bound to a different claim."),
                )
                .await;
            return Ok(Action::await_change());
        }
        Some(_) => {}
    }
    let annotations = claim.annotations();
    if annotations
        .get("pv.kubernetes.io/bind-completed")
        .map(String::as_str)
        != Some("yes")
    {
        let patch = json!({"metadata": {"annotations": {
            "pv.kubernetes.io/bind-completed": "yes",
            "pv.kubernetes.io/bound-by-controller": "yes"}}});
        api.patch(
            &claim.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    }
    let status = claim.status.clone().unwrap_or_default();
    let capacity = volume_spec.capacity.clone();
    if status.phase.as_deref() != Some("Bound")
        || status.capacity != capacity
        || status.access_modes != volume_spec.access_modes
    {
        let patch = json!({"status": {"phase": "Bound", "capacity": capacity,
            "accessModes": volume_spec.access_modes}});
        api.patch_status(
            &claim.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    }
    Ok(Action::await_change())
}

/// A claim without a volume: one that fits, or one made for it.
async fn sync_unbound_claim(claim: &PersistentVolumeClaim, ctx: &Context) -> Result<Action, Error> {
    let class_name = binding::class_of_claim(claim).to_owned();
    let class = (!class_name.is_empty())
        .then(|| ctx.classes.get(&ObjectRef::new(&class_name)))
        .flatten();
    let waits_for_consumer = class
        .as_ref()
        .and_then(|c| c.volume_binding_mode.as_deref())
        == Some("WaitForFirstConsumer");
    let selected = claim.annotations().get(SELECTED_NODE).cloned();
    if waits_for_consumer && selected.is_none() {
        ctx.events
            .record(
                &reference_to(claim),
                "Normal",
                "WaitForFirstConsumer",
                "waiting for first consumer to be created before binding",
            )
            .await;
        return Ok(Action::await_change());
    }
    let node = match &selected {
        Some(name) => Api::<Node>::all(ctx.client.clone()).get_opt(name).await?,
        None => None,
    };
    let volumes = ctx.volumes.state();
    if let Some(volume) = binding::find(&volumes, claim, node.as_ref()) {
        if volume
            .spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .is_none()
        {
            promise(volume, claim, ctx).await?;
        }
        // The claim names the volume last: a crash between the two leaves
        // a promise this finds again.
        let patch = json!({"spec": {"volumeName": volume.name_any()}});
        ctx.claims(&claim.namespace().unwrap_or_default())
            .patch(
                &claim.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        return Ok(Action::await_change());
    }
    let Some(class) = class else {
        let message = if class_name.is_empty() {
            "no persistent volumes available for this claim and no storage class is set".to_owned()
        } else {
            format!("storageclass.storage.k8s.io \"{class_name}\" not found")
        };
        ctx.events
            .record(
                &reference_to(claim),
                "Warning",
                "ProvisioningFailed",
                &message,
            )
            .await;
        return Ok(Action::await_change());
    };
    provision(claim, &class, node, ctx).await
}

/// Asks the class's provisioner for a volume: the built-in one makes it
/// now; another is named on the claim for it to act.
async fn provision(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    node: Option<Node>,
    ctx: &Context,
) -> Result<Action, Error> {
    let namespace = claim.namespace().unwrap_or_default();
    let api = ctx.claims(&namespace);
    let reference = reference_to(claim);
    if claim.annotations().get(STORAGE_PROVISIONER) != Some(&class.provisioner) {
        let patch = json!({"metadata": {"annotations": {
            STORAGE_PROVISIONER: class.provisioner, BETA_STORAGE_PROVISIONER: class.provisioner}}});
        api.patch(
            &claim.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    }
    if class.provisioner != local_path::PROVISIONER {
        let message = format!(
            "Waiting for a volume to be created either by the external provisioner '{}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered.",
            class.provisioner
        );
        ctx.events
            .record(&reference, "Normal", "ExternalProvisioning", &message)
            .await;
        return Ok(Action::await_change());
    }
    // Immediate binding: any ready node that keeps local volumes.
    let node = match node {
        Some(node) => node,
        None => {
            let nodes = Api::<Node>::all(ctx.client.clone())
                .list(&kube::api::ListParams::default())
                .await?;
            let mut usable: Vec<Node> = nodes
                .items
                .into_iter()
                .filter(|n| n.annotations().contains_key(local_path::ROOT_ANNOTATION))
                .collect();
            usable.sort_by_key(|n| n.name_any());
            match usable.into_iter().next() {
                Some(node) => node,
                None => {
                    ctx.events
                        .record(
                            &reference,
                            "Warning",
                            "ProvisioningFailed",
                            "no node keeps local-path volumes yet",
                        )
                        .await;
                    return Ok(Action::requeue(Duration::from_secs(10)));
                }
            }
        }
    };
    let volume = match local_path::volume_for(claim, class, &node) {
        Ok(volume) => volume,
        Err(message) => {
            ctx.events
                .record(&reference, "Warning", "ProvisioningFailed", &message)
                .await;
            return Ok(Action::requeue(Duration::from_secs(30)));
        }
    };
    ctx.events
        .record(
            &reference,
            "Normal",
            "Provisioning",
            &format!(
                "External provisioner is provisioning volume for claim \"{namespace}/{}\"",
                claim.name_any()
            ),
        )
        .await;
    match ctx
        .volumes_api()
        .create(&PostParams::default(), &volume)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(error) => return Err(error.into()),
    }
    ctx.events
        .record(
            &reference,
            "Normal",
            "ProvisioningSucceeded",
            &format!("Successfully provisioned volume {}", volume.name_any()),
        )
        .await;
    Ok(Action::await_change())
}

/// Promises `volume` to `claim` (its `claimRef`), guarded by the volume's
/// version so two claims never both get it.
async fn promise(
    volume: &PersistentVolume,
    claim: &PersistentVolumeClaim,
    ctx: &Context,
) -> Result<(), Error> {
    let patch = json!({
        "metadata": {"resourceVersion": volume.resource_version(),
                     "annotations": {"pv.kubernetes.io/bound-by-controller": "yes"}},
        "spec": {"claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "namespace": claim.namespace(), "name": claim.name_any(), "uid": claim.metadata.uid,
            "resourceVersion": claim.resource_version()}},
    });
    ctx.volumes_api()
        .patch(
            &volume.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}

fn phase_of(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim.status.as_ref().and_then(|s| s.phase.as_deref())
}

async fn reconcile_volume(
    volume: Arc<PersistentVolume>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    if volume.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let spec = volume.spec.clone().unwrap_or_default();
    let phase = volume.status.as_ref().and_then(|s| s.phase.clone());
    let api = ctx.volumes_api();
    let set_phase = |phase: &'static str, message: Option<String>| {
        let api = api.clone();
        let name = volume.name_any();
        async move {
            let patch = json!({"status": {"phase": phase, "message": message}});
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
        }
    };
    let Some(reference) = &spec.claim_ref else {
        if phase.as_deref() != Some("Available") {
            set_phase("Available", None).await?;
        }
        return Ok(Action::await_change());
    };
    // The claim, read fresh: a volume is never released on a stale cache.
    let claim = match (&reference.namespace, &reference.name) {
        (Some(namespace), Some(name)) => ctx.claims(namespace).get_opt(name).await?,
        _ => None,
    };
    let claimed = claim
        .as_ref()
        .is_some_and(|c| reference.uid.is_none() || c.metadata.uid == reference.uid);
    if claimed {
        let named_back = claim
            .as_ref()
            .and_then(|c| c.spec.as_ref()?.volume_name.as_deref())
            == Some(volume.name_any().as_str());
        if named_back && phase.as_deref() != Some("Bound") {
            set_phase("Bound", None).await?;
        }
        return Ok(Action::await_change());
    }
    if reference.uid.is_none() {
        // Pre-bound to a claim not made yet: it waits for it.
        if phase.as_deref() != Some("Available") {
            set_phase("Available", None).await?;
        }
        return Ok(Action::await_change());
    }
    // Its claim is gone.
    if phase.as_deref() != Some("Released") && phase.as_deref() != Some("Failed") {
        set_phase("Released", None).await?;
        return Ok(Action::await_change());
    }
    if spec.persistent_volume_reclaim_policy.as_deref() != Some("Delete")
        || phase.as_deref() == Some("Failed")
    {
        return Ok(Action::await_change());
    }
    let ours = volume
        .annotations()
        .get("pv.kubernetes.io/provisioned-by")
        .map(String::as_str)
        == Some(local_path::PROVISIONER);
    if !ours {
        let message =
            "error getting deleter volume plugin for volume: no deletable volume plugin matched"
                .to_owned();
        set_phase("Failed", Some(message)).await?;
        return Ok(Action::await_change());
    }
    match api.delete(&volume.name_any(), &Default::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(error) => return Err(error.into()),
    }
    Ok(Action::await_change())
}
