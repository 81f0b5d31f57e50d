//! The Deployment controller (`apps/v1`), as kube-controller-manager's:
//! one ReplicaSet per pod template, named `<deployment>-<pod-template-hash>`,
//! sized step by step by the strategy, and a status with `Progressing` and
//! `Available` conditions that `kubectl rollout status` reads.
//!
//! Each sync reads the Deployment's ReplicaSets from a cache (claiming
//! orphans that match, releasing its own that no longer do), makes at most
//! one step of writes and reports. Writes carry the cached
//! `resourceVersion`: a sync that acted on a stale cache gets a conflict
//! and runs again, so there are no expectations to keep. The steps:
//! - a Deployment being deleted only reports;
//! - paused, or resized (a ReplicaSet's `desired-replicas` differs): resize
//!   without rolling out, in proportion when several ReplicaSets have
//!   replicas ([`rollout::proportional_sizes`]);
//! - `RollingUpdate`: grow the new ReplicaSet within `maxSurge`, shrink old
//!   ones within `maxUnavailable`;
//! - `Recreate`: shrink old ones to zero, wait until their pods are gone,
//!   then grow the new one;
//! - when complete, delete old ReplicaSets beyond `revisionHistoryLimit`.

pub mod revision;
pub mod rollout;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use portal_api::selector::LabelSelector;
use portal_client::{Settled, SharedReflector};

use crate::events;
use crate::replication::set_controller;
use revision::{replicas, HASH_LABEL, REVISION};
use rollout::size;

pub use crate::ReconcileError as Error;

const COMPONENT: &str = "deployment-controller";

struct Context {
    client: Client,
    retries: crate::Retries,
    events: events::Recorder,
    replica_sets: Store<ReplicaSet>,
    replica_sets_listed: Arc<crate::Listed>,
    pods: Store<Pod>,
    pods_listed: Arc<crate::Listed>,
}

fn selector_of(deployment: &Deployment) -> Option<LabelSelector> {
    let selector = serde_json::to_value(&deployment.spec.as_ref()?.selector).ok()?;
    LabelSelector::from_api(&selector, "spec.selector").ok()
}

/// Runs the controller until the process ends, reading pods (for
/// `Recreate`) from the process's shared pod reflector and ReplicaSets
/// from the cache it shares with the ReplicaSet controller.
pub async fn run(
    client: Client,
    pods: Store<Pod>,
    pod_changes: impl Stream<Item = Settled<Pod>> + Send + 'static,
    replica_sets: Store<ReplicaSet>,
    set_changes: impl Stream<Item = Settled<ReplicaSet>> + Send + 'static,
) {
    let context = Arc::new(Context {
        client: client.clone(),
        retries: crate::Retries::new(Duration::from_millis(200)),
        events: events::Recorder::new(client.clone(), COMPONENT),
        replica_sets,
        replica_sets_listed: Arc::new(crate::Listed::default()),
        pods,
        pods_listed: Arc::new(crate::Listed::default()),
    });
    let set_changes = crate::note_listed(set_changes, context.replica_sets_listed.clone());
    let pod_changes = crate::note_listed(pod_changes, context.pods_listed.clone());
    // Deployments without their managed fields, which nothing here reads.
    let mut cache: SharedReflector<Deployment> =
        SharedReflector::new(Api::all(client), watcher::Config::default(), |d| {
            d.metadata.managed_fields = None;
        });
    let controller = Controller::for_shared_stream(
        portal_client::shared::objects(cache.subscribe()),
        cache.store(),
    )
    .with_config(crate::config());
    let deployments = controller.store();
    // A ReplicaSet concerns its controller, or as an orphan every
    // Deployment whose selector matches it (to be adopted).
    let set_mapper = move |rs: Arc<ReplicaSet>| -> Vec<ObjectRef<Deployment>> {
        let namespace = rs.namespace().unwrap_or_default();
        if let Some(owner) = crate::controller_of(rs.owner_references()) {
            return (owner.kind == "Deployment" && owner.api_version == "apps/v1")
                .then(|| ObjectRef::new(&owner.name).within(&namespace))
                .into_iter()
                .collect();
        }
        deployments
            .state()
            .iter()
            .filter(|d| d.namespace().as_deref() == Some(namespace.as_str()))
            .filter(|d| {
                crate::selects(
                    selector_of(d).filter(|s| !s.is_empty()).as_ref(),
                    rs.labels(),
                )
            })
            .map(|d| ObjectRef::from_obj(&**d))
            .collect()
    };
    // A pod that goes concerns a Recreate Deployment waiting for its old
    // pods to be gone: through its ReplicaSet to that ReplicaSet's owner.
    let sets_store = context.replica_sets.clone();
    let pod_mapper = move |pod: Arc<Pod>| -> Vec<ObjectRef<Deployment>> {
        let namespace = pod.namespace().unwrap_or_default();
        let Some(owner) =
            crate::controller_of(pod.owner_references()).filter(|o| o.kind == "ReplicaSet")
        else {
            return Vec::new();
        };
        let set = sets_store.get(&ObjectRef::new(&owner.name).within(&namespace));
        set.and_then(|rs| {
            crate::controller_of(rs.owner_references())
                .filter(|o| o.kind == "Deployment")
                .map(|o| ObjectRef::new(&o.name).within(&namespace))
        })
        .into_iter()
        .collect()
    };
    let deployments = crate::drive(
        controller
            .watches_shared_stream(portal_client::shared::objects(set_changes), set_mapper)
            .watches_shared_stream(portal_client::shared::objects(pod_changes), pod_mapper)
            .run(reconcile, error_policy, context.clone()),
        COMPONENT,
        &context.retries,
    );
    tokio::join!(cache.run(), deployments);
}

fn error_policy(deployment: Arc<Deployment>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::debug!(%error, name = %deployment.name_any(), "deployment sync failed; retrying");
    Action::requeue(ctx.retries.after_failure(deployment.as_ref()))
}

async fn reconcile(deployment: Arc<Deployment>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.replica_sets_listed.is_set() || !ctx.pods_listed.is_set() {
        return Ok(Action::requeue(crate::NOT_LISTED_YET));
    }
    let mut step = Rollout::new(&ctx, (*deployment).clone());
    match step.run().await {
        Ok(()) => {}
        // Changed or gone meanwhile: the change triggers the next sync.
        Err(Error::Api(kube::Error::Api(status))) if status.code == 409 || status.code == 404 => {
            return Ok(Action::requeue(Duration::from_millis(100)));
        }
        Err(error) => return Err(error),
    }
    let status = step.deployment.status.clone().unwrap_or_default();
    let next = rollout::recheck_after(&step.deployment, &status, step.now)
        .unwrap_or(Duration::from_secs(300));
    Ok(Action::requeue(next))
}

/// One sync of one Deployment: its latest copy (updated by each write) and
/// the clients to write with.
struct Rollout<'a> {
    ctx: &'a Context,
    deployment: Deployment,
    namespace: String,
    name: String,
    sets: Api<ReplicaSet>,
    deployments: Api<Deployment>,
    now: jiff::Timestamp,
}

impl<'a> Rollout<'a> {
    fn new(ctx: &'a Context, deployment: Deployment) -> Self {
        let namespace = deployment.namespace().unwrap_or_default();
        let name = deployment.name_any();
        // Whole seconds, as Kubernetes writes condition times.
        let now = jiff::Timestamp::now();
        let now = jiff::Timestamp::from_second(now.as_second()).unwrap_or(now);
        Rollout {
            ctx,
            sets: Api::namespaced(ctx.client.clone(), &namespace),
            deployments: Api::namespaced(ctx.client.clone(), &namespace),
            namespace,
            name,
            deployment,
            now,
        }
    }

    fn reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("apps/v1".into()),
            kind: Some("Deployment".into()),
            name: Some(self.name.clone()),
            namespace: Some(self.namespace.clone()),
            uid: self.deployment.metadata.uid.clone(),
            ..ObjectReference::default()
        }
    }

    async fn event(&self, kind: &str, reason: &str, message: &str) {
        self.ctx
            .events
            .record(&self.reference(), kind, reason, message)
            .await;
    }

    fn spec(&self) -> k8s_openapi::api::apps::v1::DeploymentSpec {
        self.deployment.spec.clone().unwrap_or_default()
    }

    async fn run(&mut self) -> Result<(), Error> {
        let selector = selector_of(&self.deployment).filter(|s| !s.is_empty());
        let Some(selector) = selector else {
            self.event(
                "Warning",
                "SelectingAll",
                "This deployment is selecting all pods. A non-empty selector is required.",
            )
            .await;
            let mut status = self.deployment.status.clone().unwrap_or_default();
            if status.observed_generation < self.deployment.metadata.generation {
                status.observed_generation = self.deployment.metadata.generation;
                self.write_status(status).await?;
            }
            return Ok(());
        };
        let sets = self.claim(&selector).await?;
        if self.deployment.metadata.deletion_timestamp.is_some() {
            let (new, old) = self.split(sets, false).await?;
            let all = all_of(&old, new.as_ref());
            let status = rollout::calculate_status(&self.deployment, &all, new.as_ref(), self.now);
            return self.write_status(status).await;
        }
        self.check_paused().await?;
        let spec = self.spec();
        let paused = spec.paused == Some(true);
        let desired = replicas(&self.deployment);
        let resized = sets.iter().any(|rs| {
            size(rs) > 0
                && revision::annotation_number(rs, revision::DESIRED_REPLICAS)
                    .is_some_and(|n| n != desired)
        });
        if paused || resized {
            return self.resize_only(sets).await;
        }
        if rollout::is_recreate(&self.deployment) {
            self.recreate(sets).await
        } else {
            self.roll(sets).await
        }
    }

    /// The Deployment's ReplicaSets: its own that still match, and orphans
    /// that match, adopted (after a fresh look that it is still there and
    /// not being deleted, as upstream checks).
    async fn claim(&mut self, selector: &LabelSelector) -> Result<Vec<ReplicaSet>, Error> {
        let uid = self.deployment.metadata.uid.clone().unwrap_or_default();
        let deleting = self.deployment.metadata.deletion_timestamp.is_some();
        let owner = OwnerReference {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: self.name.clone(),
            uid: uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        let mut claimed = Vec::new();
        let mut may_adopt: Option<bool> = None;
        for rs in self.ctx.replica_sets.state() {
            if rs.namespace().as_deref() != Some(self.namespace.as_str()) {
                continue;
            }
            let matches = crate::selects(Some(selector), rs.labels());
            match crate::controller_of(rs.owner_references()) {
                Some(o) if o.uid == uid => {
                    if matches {
                        claimed.push((*rs).clone());
                    } else if !deleting {
                        set_controller(&self.sets, &rs, None, &uid).await?;
                    }
                }
                Some(_) => {}
                None => {
                    if deleting || !matches || rs.metadata.deletion_timestamp.is_some() {
                        continue;
                    }
                    if may_adopt.is_none() {
                        let fresh = self.deployments.get(&self.name).await?;
                        may_adopt = Some(
                            fresh.metadata.uid.as_deref() == Some(uid.as_str())
                                && fresh.metadata.deletion_timestamp.is_none(),
                        );
                    }
                    if may_adopt == Some(true) {
                        set_controller(&self.sets, &rs, Some(&owner), &uid).await?;
                        let mut adopted = (*rs).clone();
                        adopted.metadata.owner_references = Some(vec![owner.clone()]);
                        claimed.push(adopted);
                    }
                }
            }
        }
        Ok(claimed)
    }

    /// Splits the ReplicaSets into the new one (the oldest whose template
    /// is the Deployment's) and the old ones, bringing the new one's
    /// revision up to date, or creating it when `create` says so.
    async fn split(
        &mut self,
        mut sets: Vec<ReplicaSet>,
        create: bool,
    ) -> Result<(Option<ReplicaSet>, Vec<ReplicaSet>), Error> {
        rollout::oldest_first(&mut sets);
        let template = self.spec().template;
        let position = sets
            .iter()
            .position(|rs| revision::equal_ignoring_hash(&rs_template(rs), &template));
        let new = position.map(|i| sets.remove(i));
        let old = sets;
        let next_revision = revision::max_revision(&old) + 1;
        let new = match new {
            Some(existing) => Some(self.sync_revision(existing, next_revision).await?),
            None if create => self.create_new(&old, next_revision).await?,
            None => None,
        };
        Ok((new, old))
    }

    /// An existing new ReplicaSet: annotations and `minReadySeconds` as the
    /// Deployment's (written, and the rest waits for the next sync), then
    /// the Deployment's revision annotation and `FoundNewReplicaSet`.
    async fn sync_revision(
        &mut self,
        rs: ReplicaSet,
        next_revision: i64,
    ) -> Result<ReplicaSet, Error> {
        let mut updated = rs.clone();
        let surge = rollout::max_surge(&self.deployment);
        let changed = revision::set_new_annotations(
            &self.deployment,
            &mut updated,
            next_revision,
            true,
            surge,
        );
        let min_ready = self.spec().min_ready_seconds;
        let rs_min_ready = rs.spec.as_ref().and_then(|s| s.min_ready_seconds);
        if changed || rs_min_ready.unwrap_or(0) != min_ready.unwrap_or(0) {
            if let Some(spec) = updated.spec.as_mut() {
                spec.min_ready_seconds = min_ready;
            }
            let written = self
                .sets
                .replace(&rs.name_any(), &PostParams::default(), &updated)
                .await?;
            return Ok(written);
        }
        let mut status = self.deployment.status.clone().unwrap_or_default();
        let revision_changed = self.set_revision_annotation(&updated);
        let mut status_changed = false;
        if rollout::deadline(&self.deployment).is_some()
            && rollout::condition(&status, rollout::PROGRESSING).is_none()
        {
            let message = format!("Found new replica set {:?}", rs.name_any());
            let condition = rollout::new_condition(
                rollout::PROGRESSING,
                "True",
                "FoundNewReplicaSet",
                message,
                self.now,
            );
            rollout::set_condition(&mut status, condition);
            status_changed = true;
        }
        if revision_changed || status_changed {
            self.write_status(status).await?;
        }
        Ok(updated)
    }

    /// Sets the Deployment's revision annotation to the ReplicaSet's;
    /// whether it changed (written with the next status).
    fn set_revision_annotation(&mut self, rs: &ReplicaSet) -> bool {
        let Some(value) = rs
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REVISION))
        else {
            return false;
        };
        let annotations = self
            .deployment
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new);
        if annotations.get(REVISION) == Some(value) {
            return false;
        }
        annotations.insert(REVISION.into(), value.clone());
        true
    }

    /// Creates the ReplicaSet of the current template, named by its hash;
    /// a name taken by another template is a collision: counted, so the
    /// next sync hashes differently.
    async fn create_new(
        &mut self,
        old: &[ReplicaSet],
        next_revision: i64,
    ) -> Result<Option<ReplicaSet>, Error> {
        let spec = self.spec();
        let status = self.deployment.status.clone().unwrap_or_default();
        let hash = revision::template_hash(&spec.template, status.collision_count);
        let mut template = spec.template.clone();
        template
            .metadata
            .get_or_insert_with(ObjectMeta::default)
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(HASH_LABEL.into(), hash.clone());
        let mut selector = spec.selector.clone();
        selector
            .match_labels
            .get_or_insert_with(BTreeMap::new)
            .insert(HASH_LABEL.into(), hash.clone());
        let name = format!("{}-{hash}", self.name);
        let mut rs = ReplicaSet {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: template.metadata.as_ref().and_then(|m| m.labels.clone()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "apps/v1".into(),
                    kind: "Deployment".into(),
                    name: self.name.clone(),
                    uid: self.deployment.metadata.uid.clone().unwrap_or_default(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]),
                ..ObjectMeta::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(0),
                min_ready_seconds: spec.min_ready_seconds,
                selector,
                template: Some(template),
            }),
            status: None,
        };
        let mut all = old.to_vec();
        all.push(rs.clone());
        let replicas = rollout::new_replicas(&self.deployment, &all, &rs);
        if let Some(spec) = rs.spec.as_mut() {
            spec.replicas = Some(replicas);
        }
        let surge = rollout::max_surge(&self.deployment);
        revision::set_new_annotations(&self.deployment, &mut rs, next_revision, false, surge);
        let has_deadline = rollout::deadline(&self.deployment).is_some();
        let created = match self.sets.create(&PostParams::default(), &rs).await {
            Ok(created) => {
                if replicas > 0 {
                    let message = format!("Scaled up replica set {name} from 0 to {replicas}");
                    self.event("Normal", "ScalingReplicaSet", &message).await;
                }
                let mut status = status;
                self.set_revision_annotation(&created);
                if has_deadline {
                    let message = format!("Created new replica set {name:?}");
                    let condition = rollout::new_condition(
                        rollout::PROGRESSING,
                        "True",
                        "NewReplicaSetCreated",
                        message,
                        self.now,
                    );
                    rollout::set_condition(&mut status, condition);
                }
                self.write_status(status).await?;
                created
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let existing = self.sets.get(&name).await?;
                let ours = crate::controller_of(existing.owner_references())
                    .is_some_and(|o| Some(&o.uid) == self.deployment.metadata.uid.as_ref());
                if ours && revision::equal_ignoring_hash(&rs_template(&existing), &spec.template) {
                    if self.set_revision_annotation(&existing) {
                        self.write_status(status).await?;
                    }
                    existing
                } else {
                    let mut status = status;
                    status.collision_count =
                        Some(status.collision_count.unwrap_or(0).saturating_add(1));
                    self.write_status(status).await?;
                    return Err(kube::Error::Api(e).into());
                }
            }
            Err(kube::Error::Api(e)) => {
                let message = format!("Failed to create new replica set {name:?}: {}", e.message);
                self.event("Warning", "ReplicaSetCreateError", &message)
                    .await;
                if has_deadline {
                    let mut status = status;
                    let condition = rollout::new_condition(
                        rollout::PROGRESSING,
                        "False",
                        "ReplicaSetCreateError",
                        message,
                        self.now,
                    );
                    rollout::set_condition(&mut status, condition);
                    self.write_status(status).await?;
                }
                return Err(kube::Error::Api(e).into());
            }
            Err(e) => return Err(e.into()),
        };
        Ok(Some(created))
    }

    /// Writes the status (and the revision annotation) when either changed.
    async fn write_status(&mut self, status: DeploymentStatus) -> Result<(), Error> {
        let mut updated = self.deployment.clone();
        updated.status = Some(status);
        let written = self
            .deployments
            .replace_status(&self.name, &PostParams::default(), &updated)
            .await?;
        self.deployment = written;
        Ok(())
    }

    /// Resizes a ReplicaSet (and records the Deployment's size and surge on
    /// it), with a `ScalingReplicaSet` event when its size changes.
    async fn scale(&mut self, rs: &ReplicaSet, to: i32) -> Result<ReplicaSet, Error> {
        let from = size(rs);
        let desired = replicas(&self.deployment);
        let surge = rollout::max_surge(&self.deployment);
        if from == to && revision::replicas_annotated(rs, desired, surge) {
            return Ok(rs.clone());
        }
        let mut updated = rs.clone();
        if let Some(spec) = updated.spec.as_mut() {
            spec.replicas = Some(to);
        }
        revision::set_replicas_annotations(&mut updated, desired, surge);
        let written = self
            .sets
            .replace(&rs.name_any(), &PostParams::default(), &updated)
            .await?;
        if from != to {
            let direction = if to > from { "up" } else { "down" };
            let message = format!(
                "Scaled {direction} replica set {} from {from} to {to}",
                rs.name_any()
            );
            self.event("Normal", "ScalingReplicaSet", &message).await;
        }
        Ok(written)
    }

    /// Resizes only when the size differs.
    async fn scale_if_needed(
        &mut self,
        rs: &ReplicaSet,
        to: i32,
    ) -> Result<(ReplicaSet, bool), Error> {
        if size(rs) == to {
            return Ok((rs.clone(), false));
        }
        Ok((self.scale(rs, to).await?, true))
    }

    /// Scales every ReplicaSet with replicas to zero; whether any had some.
    async fn scale_to_zero(&mut self, sets: &mut [ReplicaSet]) -> Result<bool, Error> {
        let mut scaled = false;
        for rs in sets.iter_mut().filter(|rs| size(rs) > 0) {
            *rs = self.scale(&rs.clone(), 0).await?;
            scaled = true;
        }
        Ok(scaled)
    }

    /// Paused: `Progressing` says so (and says when resumed), unless the
    /// rollout already timed out.
    async fn check_paused(&mut self) -> Result<(), Error> {
        if rollout::deadline(&self.deployment).is_none() {
            return Ok(());
        }
        let mut status = self.deployment.status.clone().unwrap_or_default();
        let reason =
            rollout::condition(&status, rollout::PROGRESSING).and_then(|c| c.reason.clone());
        if reason.as_deref() == Some(rollout::TIMED_OUT) {
            return Ok(());
        }
        let paused = self.spec().paused == Some(true);
        let condition = if paused && reason.as_deref() != Some(rollout::PAUSED) {
            rollout::new_condition(
                rollout::PROGRESSING,
                "Unknown",
                rollout::PAUSED,
                "Deployment is paused".into(),
                self.now,
            )
        } else if !paused && reason.as_deref() == Some(rollout::PAUSED) {
            rollout::new_condition(
                rollout::PROGRESSING,
                "Unknown",
                rollout::RESUMED,
                "Deployment is resumed".into(),
                self.now,
            )
        } else {
            return Ok(());
        };
        rollout::set_condition(&mut status, condition);
        self.write_status(status).await
    }

    /// Paused or resized: sizes change, templates do not roll out.
    async fn resize_only(&mut self, sets: Vec<ReplicaSet>) -> Result<(), Error> {
        let (mut new, mut old) = self.split(sets, false).await?;
        let desired = replicas(&self.deployment);
        if let Some(target) = rollout::active_or_latest(new.as_ref(), &old).cloned() {
            if size(&target) != desired {
                let written = self.scale(&target, desired).await?;
                replace(&mut new, &mut old, written);
            }
        } else if new
            .as_ref()
            .is_some_and(|rs| rollout::saturated(&self.deployment, rs))
        {
            self.scale_to_zero(&mut old).await?;
        } else if !rollout::is_recreate(&self.deployment) {
            let mut active: Vec<ReplicaSet> = new
                .iter()
                .chain(old.iter())
                .filter(|rs| size(rs) > 0)
                .cloned()
                .collect();
            let sizes = rollout::proportional_sizes(&self.deployment, &active);
            for (rs, to) in active.iter_mut().zip(sizes) {
                // Every one is written: the annotations end the resize.
                *rs = self.scale(&rs.clone(), to).await?;
            }
            for rs in active {
                replace(&mut new, &mut old, rs);
            }
        }
        if self.spec().paused == Some(true) {
            old = self.clean_up(old).await?;
        }
        let all = all_of(&old, new.as_ref());
        let status = rollout::calculate_status(&self.deployment, &all, new.as_ref(), self.now);
        if Some(&status) != self.deployment.status.as_ref() {
            self.write_status(status).await?;
        }
        Ok(())
    }

    async fn roll(&mut self, sets: Vec<ReplicaSet>) -> Result<(), Error> {
        let (mut new, mut old) = self.split(sets, true).await?;
        // Grow (or shrink) the new ReplicaSet first.
        if let Some(rs) = new.clone() {
            let desired = replicas(&self.deployment);
            let all = all_of(&old, Some(&rs));
            let to = if size(&rs) > desired {
                desired
            } else {
                rollout::new_replicas(&self.deployment, &all, &rs)
            };
            let (written, scaled) = self.scale_if_needed(&rs, to).await?;
            new = Some(written);
            if scaled {
                return self.report(&old, new.as_ref()).await;
            }
        }
        // Then let old replicas go, unhealthy ones first.
        let all = all_of(&old, new.as_ref());
        if old.iter().any(|rs| size(rs) > 0) {
            let limit = rollout::max_scaled_down(&self.deployment, &all, new.as_ref());
            let mut scaled = false;
            if limit > 0 {
                let mut active: Vec<ReplicaSet> =
                    old.iter().filter(|rs| size(rs) > 0).cloned().collect();
                rollout::oldest_first(&mut active);
                for (index, to) in rollout::unhealthy_cuts(&active, limit) {
                    active[index] = self.scale(&active[index].clone(), to).await?;
                    scaled = true;
                }
                for (index, to) in rollout::healthy_cuts(&self.deployment, &active, new.as_ref()) {
                    active[index] = self.scale(&active[index].clone(), to).await?;
                    scaled = true;
                }
                for rs in active {
                    replace(&mut new, &mut old, rs);
                }
            }
            if scaled {
                return self.report(&old, new.as_ref()).await;
            }
        }
        let current = self.deployment.status.clone().unwrap_or_default();
        if rollout::complete(&self.deployment, &current) {
            old = self.clean_up(old).await?;
        }
        self.report(&old, new.as_ref()).await
    }

    async fn recreate(&mut self, sets: Vec<ReplicaSet>) -> Result<(), Error> {
        let (mut new, mut old) = self.split(sets, false).await?;
        let scaled_down = self.scale_to_zero(&mut old).await?;
        if scaled_down || self.old_pods_running(&old, new.as_ref()) {
            return self.report(&old, new.as_ref()).await;
        }
        if new.is_none() {
            let sets = old.clone();
            (new, old) = self.split(sets, true).await?;
        }
        if let Some(rs) = new.clone() {
            let desired = replicas(&self.deployment);
            new = Some(self.scale_if_needed(&rs, desired).await?.0);
        }
        let current = self.deployment.status.clone().unwrap_or_default();
        if rollout::complete(&self.deployment, &current) {
            old = self.clean_up(old).await?;
        }
        self.report(&old, new.as_ref()).await
    }

    /// Old ReplicaSets still have pods, or pods of theirs (terminating or
    /// not) are not finished.
    fn old_pods_running(&self, old: &[ReplicaSet], new: Option<&ReplicaSet>) -> bool {
        if old.iter().map(rollout::current).sum::<i32>() > 0 {
            return true;
        }
        let old_uids: Vec<&str> = old
            .iter()
            .filter_map(|rs| rs.metadata.uid.as_deref())
            .collect();
        let new_uid = new.and_then(|rs| rs.metadata.uid.as_deref());
        self.ctx.pods.state().iter().any(|pod| {
            let owner = crate::controller_of(pod.owner_references()).map(|o| o.uid.as_str());
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            pod.namespace().as_deref() == Some(self.namespace.as_str())
                && owner.is_some_and(|uid| old_uids.contains(&uid) && Some(uid) != new_uid)
                && !matches!(phase, Some("Failed" | "Succeeded"))
        })
    }

    /// Deletes the oldest old ReplicaSets beyond `revisionHistoryLimit`
    /// that have nothing left; returns those that stay.
    async fn clean_up(&mut self, mut old: Vec<ReplicaSet>) -> Result<Vec<ReplicaSet>, Error> {
        let Some(limit) = self
            .spec()
            .revision_history_limit
            .filter(|l| *l != i32::MAX)
        else {
            return Ok(old);
        };
        let limit = usize::try_from(limit).unwrap_or(0);
        let mut cleanable: Vec<usize> = (0..old.len())
            .filter(|&i| old[i].metadata.deletion_timestamp.is_none())
            .collect();
        if cleanable.len() <= limit {
            return Ok(old);
        }
        let excess = cleanable.len() - limit;
        cleanable.sort_by(|&a, &b| {
            revision::revision(&old[a])
                .cmp(&revision::revision(&old[b]))
                .then_with(|| {
                    let created =
                        |rs: &ReplicaSet| rs.metadata.creation_timestamp.as_ref().map(|t| t.0);
                    created(&old[a]).cmp(&created(&old[b]))
                })
        });
        let mut gone = Vec::new();
        for &index in cleanable.iter().take(excess) {
            let rs = &old[index];
            let observed = rs.status.as_ref().and_then(|s| s.observed_generation);
            let settled =
                rollout::current(rs) == 0 && size(rs) == 0 && rs.metadata.generation <= observed;
            if !settled {
                continue;
            }
            match self
                .sets
                .delete(&rs.name_any(), &DeleteParams::default())
                .await
            {
                Ok(_) => gone.push(index),
                Err(kube::Error::Api(e)) if e.code == 404 => gone.push(index),
                Err(e) => return Err(e.into()),
            }
        }
        gone.sort_unstable();
        for index in gone.into_iter().rev() {
            old.remove(index);
        }
        Ok(old)
    }

    /// Writes the status after a rollout step, when it changed.
    async fn report(&mut self, old: &[ReplicaSet], new: Option<&ReplicaSet>) -> Result<(), Error> {
        let all = all_of(old, new);
        let status = rollout::rollout_status(&self.deployment, &all, new, self.now);
        if Some(&status) != self.deployment.status.as_ref() {
            self.write_status(status).await?;
        }
        Ok(())
    }
}

fn rs_template(rs: &ReplicaSet) -> k8s_openapi::api::core::v1::PodTemplateSpec {
    rs.spec
        .as_ref()
        .and_then(|s| s.template.clone())
        .unwrap_or_default()
}

fn all_of(old: &[ReplicaSet], new: Option<&ReplicaSet>) -> Vec<ReplicaSet> {
    old.iter().chain(new).cloned().collect()
}

/// Puts a written ReplicaSet back in place of its older copy.
fn replace(new: &mut Option<ReplicaSet>, old: &mut [ReplicaSet], written: ReplicaSet) {
    if new
        .as_ref()
        .is_some_and(|rs| rs.metadata.name == written.metadata.name)
    {
        *new = Some(written);
    } else if let Some(slot) = old
        .iter_mut()
        .find(|rs| rs.metadata.name == written.metadata.name)
    {
        *slot = written;
    }
}
