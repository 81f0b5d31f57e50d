//! The StatefulSet controller (`apps/v1`), as kube-controller-manager's:
//! pods with a stable identity ([`identity`]: `<set>-<ordinal>`, hostname
//! and subdomain for per-pod DNS, one claim per volume claim template),
//! started, removed and updated in the order [`plan`] decides. Templates
//! are kept as numbered ControllerRevisions ([`crate::history`]); pods
//! carry the name of theirs, and the status reports the current revision
//! (what pods below the partition run) and the update revision.
//!
//! Like upstream there are no expectations: an ordered set takes one step
//! per sync and the next sync starts from the pod cache; a create the
//! cache does not show yet fails with `AlreadyExists` and is retried.

pub mod identity;
pub mod plan;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use portal_api::selector::LabelSelector;
use portal_client::{Settled, SharedReflector};

use crate::deployment::rollout::scaled;
use crate::events;
use crate::history::{self, History};
use crate::replication::{is_available, is_ready, set_controller};
use identity::{parent_and_ordinal, REVISION_LABEL};
use plan::{Member, Shape, Step, Strategy};

pub use crate::ReconcileError as Error;

const COMPONENT: &str = "statefulset-controller";
/// The label a StatefulSet's ControllerRevisions carry their hash in.
const HASH_LABEL: &str = "controller.kubernetes.io/hash";

struct Context {
    client: Client,
    retries: crate::Retries,
    events: events::Recorder,
    pods: Store<Pod>,
    revisions: Store<ControllerRevision>,
    listed: [Arc<crate::Listed>; 2],
}

fn selector_of(set: &StatefulSet) -> Option<LabelSelector> {
    crate::label_selector(&set.spec.as_ref()?.selector).filter(|s| !s.is_empty())
}

/// Whether a pod is one of the set's by name and labels (ownership aside).
fn is_member(set: &StatefulSet, selector: Option<&LabelSelector>, pod: &Pod) -> bool {
    parent_and_ordinal(&pod.name_any()).is_some_and(|(parent, _)| parent == set.name_any())
        && crate::selects(selector, pod.labels())
}

/// Runs the controller until the process ends, reading pods from the
/// process's shared pod reflector.
pub async fn run(
    client: Client,
    pods: Store<Pod>,
    pod_changes: impl Stream<Item = Settled<Pod>> + Send + 'static,
) {
    let mut revisions = SharedReflector::new(
        Api::<ControllerRevision>::all(client.clone()),
        watcher::Config::default(),
        |r: &mut ControllerRevision| r.metadata.managed_fields = None,
    );
    let listed: [Arc<crate::Listed>; 2] = Default::default();
    let context = Arc::new(Context {
        client: client.clone(),
        retries: crate::Retries::new(Duration::from_millis(200)),
        events: events::Recorder::new(client.clone(), COMPONENT),
        pods,
        revisions: revisions.store(),
        listed: listed.clone(),
    });
    let pod_changes = crate::note_listed(pod_changes, listed[0].clone());
    let revision_changes = crate::note_listed(revisions.subscribe(), listed[1].clone());
    let controller = Controller::new(Api::<StatefulSet>::all(client), watcher::Config::default())
        .with_config(crate::config());
    let sets = controller.store();
    // A pod concerns its StatefulSet, or as an orphan every set whose
    // selector and name it matches.
    let pod_mapper = move |pod: Arc<Pod>| -> Vec<ObjectRef<StatefulSet>> {
        let namespace = pod.namespace().unwrap_or_default();
        if let Some(owner) = crate::controller_of(pod.owner_references()) {
            return (owner.kind == "StatefulSet")
                .then(|| ObjectRef::new(&owner.name).within(&namespace))
                .into_iter()
                .collect();
        }
        sets.state()
            .iter()
            .filter(|s| s.namespace().as_deref() == Some(namespace.as_str()))
            .filter(|s| is_member(s, selector_of(s).as_ref(), &pod))
            .map(|s| ObjectRef::from_obj(&**s))
            .collect()
    };
    let revision_mapper = |revision: Arc<ControllerRevision>| {
        crate::controller_ref::<StatefulSet>(&*revision, "StatefulSet")
    };
    let sets = crate::drive(
        controller
            .watches_shared_stream(portal_client::shared::objects(pod_changes), pod_mapper)
            .watches_shared_stream(
                portal_client::shared::objects(revision_changes),
                revision_mapper,
            )
            .run(reconcile, error_policy, context.clone()),
        COMPONENT,
        &context.retries,
    );
    tokio::join!(revisions.run(), sets);
}

fn error_policy(set: Arc<StatefulSet>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::debug!(%error, name = %set.name_any(), "stateful set sync failed; retrying");
    Action::requeue(ctx.retries.after_failure(set.as_ref()))
}

async fn reconcile(set: Arc<StatefulSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.listed.iter().all(|l| l.is_set()) {
        return Ok(Action::requeue(crate::NOT_LISTED_YET));
    }
    let Some(selector) = selector_of(&set) else {
        return Ok(Action::await_change());
    };
    let sync = Sync {
        namespace: set.namespace().unwrap_or_default(),
        name: set.name_any(),
        uid: set.metadata.uid.clone().unwrap_or_default(),
        ctx: &ctx,
        set: &set,
        now: jiff::Timestamp::now(),
    };
    match sync.run(&selector).await {
        // Written meanwhile, or gone: the next sync starts from the change.
        // (A pod name taken by a pod not the set's is AlreadyExists: that
        // backs off as errors do.)
        Err(Error::Api(kube::Error::Api(status)))
            if (status.code == 409 && status.reason != "AlreadyExists") || status.code == 404 =>
        {
            Ok(Action::requeue(Duration::from_millis(100)))
        }
        other => other,
    }
}

/// One sync of one StatefulSet.
struct Sync<'a> {
    ctx: &'a Context,
    set: &'a StatefulSet,
    namespace: String,
    name: String,
    uid: String,
    now: jiff::Timestamp,
}

impl Sync<'_> {
    fn owner(&self) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: "StatefulSet".into(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    async fn event(&self, kind: &str, reason: &str, message: &str) {
        let reference = ObjectReference {
            api_version: Some("apps/v1".into()),
            kind: Some("StatefulSet".into()),
            name: Some(self.name.clone()),
            namespace: Some(self.namespace.clone()),
            uid: Some(self.uid.clone()),
            ..ObjectReference::default()
        };
        self.ctx
            .events
            .record(&reference, kind, reason, message)
            .await;
    }

    fn history(&self) -> History<'_> {
        History {
            client: &self.ctx.client,
            revisions: &self.ctx.revisions,
            namespace: &self.namespace,
            owner: self.owner(),
            hash_label: HASH_LABEL,
        }
    }

    fn min_ready_seconds(&self) -> i64 {
        self.set
            .spec
            .as_ref()
            .and_then(|s| s.min_ready_seconds)
            .map_or(0, i64::from)
    }

    async fn run(&self, selector: &LabelSelector) -> Result<Action, Error> {
        let spec = self.set.spec.clone().unwrap_or_default();
        let status = self.set.status.clone().unwrap_or_default();
        let Some(update) = self
            .history()
            .revision_of(
                selector,
                &spec.template,
                self.set.metadata.annotations.as_ref(),
                Some(status.collision_count.unwrap_or(0)),
            )
            .await?
        else {
            return self.count_collision(status).await;
        };
        let update_name = update.name_any();
        let current = status
            .current_revision
            .as_ref()
            .and_then(|name| {
                self.history()
                    .owned(selector)
                    .into_iter()
                    .find(|r| &r.name_any() == name)
            })
            .map_or_else(|| update.clone(), |r| (*r).clone());
        let pods = self.claim_pods(selector).await?;
        let min_ready = self.min_ready_seconds();
        let members: Vec<Member> = pods
            .iter()
            .filter_map(|pod| {
                let (_, ordinal) = parent_and_ordinal(&pod.name_any())?;
                let phase = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default();
                let ready = phase == "Running" && is_ready(pod);
                Some(Member {
                    ordinal,
                    name: pod.name_any(),
                    revision: pod
                        .labels()
                        .get(REVISION_LABEL)
                        .cloned()
                        .unwrap_or_default(),
                    ready,
                    available: ready && is_available(pod, min_ready, self.now),
                    phase,
                    terminating: pod.metadata.deletion_timestamp.is_some(),
                    deleted: None,
                })
            })
            .collect();
        let replicas = spec.replicas.unwrap_or(1).max(0);
        let shape = Shape {
            start: spec
                .ordinals
                .as_ref()
                .and_then(|o| o.start)
                .unwrap_or(0)
                .max(0),
            replicas,
            ordered: spec.pod_management_policy.as_deref() != Some("Parallel"),
            strategy: strategy(&spec, replicas),
            current_revision: current.name_any(),
            update_revision: update_name.clone(),
            current_replicas: status.current_replicas.unwrap_or(0),
        };
        let in_range = shape.start..shape.start.saturating_add(replicas);
        self.repair_identities(&pods, &in_range).await?;
        let (steps, after) = if self.set.metadata.deletion_timestamp.is_some() {
            (Vec::new(), members.clone())
        } else {
            plan::plan(&shape, &members)
        };
        let result = self.carry_out(&steps, &current, &update).await;
        let deleting = self.set.metadata.deletion_timestamp.is_some();
        if result.is_ok() && !deleting {
            // Claims lost meanwhile are made again for pods still waiting.
            let waiting = members
                .iter()
                .filter(|m| m.phase == "Pending" && in_range.contains(&m.ordinal));
            for member in waiting {
                self.ensure_claims(member.ordinal, &member.name, false)
                    .await?;
            }
        }
        // History and status are kept up to date whatever the steps did.
        let in_use: HashSet<String> = members.iter().map(|m| m.revision.clone()).collect();
        let keep = |r: &ControllerRevision| {
            let name = r.name_any();
            name == shape.current_revision
                || name == shape.update_revision
                || in_use.contains(&name)
        };
        let limit = spec.revision_history_limit.unwrap_or(10);
        if limit >= 0 {
            self.history().truncate(selector, keep, limit).await?;
        }
        self.write_status(&shape, &after, status).await?;
        result?;
        let counts = plan::count(&shape, &after);
        Ok(if min_ready > 0 && counts.available != replicas {
            Action::requeue(Duration::from_secs(
                u64::try_from(min_ready).unwrap_or(0) + 1,
            ))
        } else {
            Action::requeue(Duration::from_secs(300))
        })
    }

    /// Another template has the name the update revision hashes to: count
    /// the collision so the next hash differs, and try again.
    async fn count_collision(&self, mut status: StatefulSetStatus) -> Result<Action, Error> {
        status.collision_count = Some(status.collision_count.unwrap_or(0).saturating_add(1));
        let mut updated = self.set.clone();
        updated.status = Some(status);
        let api: Api<StatefulSet> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        api.replace_status(&self.name, &PostParams::default(), &updated)
            .await?;
        Err(crate::conflict(
            "revision name collision counted; trying again",
        ))
    }

    /// The set's pods: its own that still match, orphans that match by
    /// name and labels (adopted), its own that stopped matching released.
    async fn claim_pods(&self, selector: &LabelSelector) -> Result<Vec<Pod>, Error> {
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        let owner = self.owner();
        let deleting = self.set.metadata.deletion_timestamp.is_some();
        let mut claimed = Vec::new();
        for pod in self.ctx.pods.state() {
            if pod.namespace().as_deref() != Some(self.namespace.as_str()) {
                continue;
            }
            let matches = is_member(self.set, Some(selector), &pod);
            match crate::controller_of(pod.owner_references()) {
                Some(o) if o.uid == self.uid => {
                    if matches {
                        claimed.push((*pod).clone());
                    } else if !deleting {
                        set_controller(&api, &pod, None, &self.uid).await?;
                    }
                }
                None if matches && !deleting && pod.metadata.deletion_timestamp.is_none() => {
                    set_controller(&api, &pod, Some(&owner), &self.uid).await?;
                    claimed.push((*pod).clone());
                }
                _ => {}
            }
        }
        Ok(claimed)
    }

    /// Gives pods back the labels that name them (upstream's
    /// `identityMatches`/`updateIdentity`): a pod whose `pod-name` or
    /// `pod-index` label someone changed or removed, while the set keeps it.
    async fn repair_identities(
        &self,
        pods: &[Pod],
        kept: &std::ops::Range<i32>,
    ) -> Result<(), Error> {
        if self.set.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        for pod in pods {
            let name = pod.name_any();
            let Some((parent, ordinal)) = parent_and_ordinal(&name) else {
                continue;
            };
            let labels = pod.labels();
            let index = ordinal.to_string();
            let intact = labels.get(identity::POD_NAME_LABEL) == Some(&name)
                && labels.get(identity::POD_INDEX_LABEL) == Some(&index);
            if intact
                || parent != self.name
                || !kept.contains(&ordinal)
                || pod.metadata.deletion_timestamp.is_some()
            {
                continue;
            }
            let patch = serde_json::json!({"metadata": {"labels": {
                identity::POD_NAME_LABEL: name, identity::POD_INDEX_LABEL: index}}});
            match api
                .patch(
                    &name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => {
                    let message =
                        format!("update Pod {name} in StatefulSet {} successful", self.name);
                    self.event("Normal", "SuccessfulUpdate", &message).await;
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    let message = format!(
                        "update Pod {name} in StatefulSet {} failed error: {e}",
                        self.name
                    );
                    self.event("Warning", "FailedUpdate", &message).await;
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }

    async fn carry_out(
        &self,
        steps: &[Step],
        current: &ControllerRevision,
        update: &ControllerRevision,
    ) -> Result<(), Error> {
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        for step in steps {
            match step {
                Step::Create { ordinal, revision } => {
                    let source = if *revision == current.name_any() {
                        current
                    } else {
                        update
                    };
                    let template = history::template_of(source).unwrap_or_else(|| {
                        self.set
                            .spec
                            .as_ref()
                            .map(|s| s.template.clone())
                            .unwrap_or_default()
                    });
                    let pod =
                        identity::new_pod(self.set, &template, *ordinal, revision, self.owner());
                    let pod_name = pod.name_any();
                    self.ensure_claims(*ordinal, &pod_name, true).await?;
                    match api.create(&PostParams::default(), &pod).await {
                        Ok(_) => {
                            let message = format!(
                                "create Pod {pod_name} in StatefulSet {} successful",
                                self.name
                            );
                            self.event("Normal", "SuccessfulCreate", &message).await;
                        }
                        // The cache does not show it yet: no event, retried.
                        Err(kube::Error::Api(e)) if e.code == 409 => {
                            return Err(kube::Error::Api(e).into())
                        }
                        Err(e) => {
                            let message = format!(
                                "create Pod {pod_name} in StatefulSet {} failed error: {e}",
                                self.name
                            );
                            self.event("Warning", "FailedCreate", &message).await;
                            return Err(e.into());
                        }
                    }
                }
                // Failed and succeeded pods are deleted without an event
                // of their own, as since Kubernetes 1.31.
                Step::Delete { name, why } => {
                    if *why == plan::Why::Condemned {
                        self.hand_claims_to(name).await?;
                    }
                    match api.delete(name, &DeleteParams::default()).await {
                        Ok(_) => {
                            let message = format!(
                                "delete Pod {name} in StatefulSet {} successful",
                                self.name
                            );
                            self.event("Normal", "SuccessfulDelete", &message).await;
                        }
                        Err(kube::Error::Api(e)) if e.code == 404 => {}
                        Err(e) => {
                            let message = format!(
                                "delete Pod {name} in StatefulSet {} failed error: {e}",
                                self.name
                            );
                            self.event("Warning", "FailedDelete", &message).await;
                            return Err(e.into());
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Makes the claims of the pod at `ordinal` that do not exist yet.
    /// While this API server does not serve PersistentVolumeClaims, the
    /// pod is made without them (the scheduler keeps it Pending, saying
    /// which claim is missing) and, when `report`, a Warning says so.
    async fn ensure_claims(&self, ordinal: i32, pod: &str, report: bool) -> Result<(), Error> {
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.ctx.client.clone(), &self.namespace);
        // `whenDeleted: Delete`: the set owns its claims (not as their
        // controller), so the garbage collector takes them with it.
        let owned_by_set = self.retention().0 == "Delete";
        for (template, name) in identity::claims(self.set, ordinal) {
            let mut claim = identity::claim(self.set, &template, &name);
            if owned_by_set {
                claim.metadata.owner_references = Some(vec![self.claim_owner()]);
            }
            match api.create(&PostParams::default(), &claim).await {
                Ok(_) => {
                    let message = format!(
                        "create Claim {name} Pod {pod} in StatefulSet {} success",
                        self.name
                    );
                    self.event("Normal", "SuccessfulCreate", &message).await;
                }
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => {
                    if report {
                        let message = format!(
                            "create Claim {name} for Pod {pod} in StatefulSet {} failed error: {e}",
                            self.name
                        );
                        self.event("Warning", "FailedCreate", &message).await;
                    }
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }

    /// The claim retention policy: (whenDeleted, whenScaled).
    fn retention(&self) -> (String, String) {
        let policy = self
            .set
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_claim_retention_policy.as_ref());
        let of = |value: Option<&String>| value.cloned().unwrap_or_else(|| "Retain".into());
        (
            of(policy.and_then(|p| p.when_deleted.as_ref())),
            of(policy.and_then(|p| p.when_scaled.as_ref())),
        )
    }

    /// The set as a claim's owner (not its controller).
    fn claim_owner(&self) -> OwnerReference {
        OwnerReference {
            controller: None,
            ..self.owner()
        }
    }

    /// `whenScaled: Delete`: a pod removed by a scale-down takes its claims
    /// with it (it becomes their owner, in the set's place, before it is
    /// deleted).
    async fn hand_claims_to(&self, pod_name: &str) -> Result<(), Error> {
        if self.retention().1 != "Delete" {
            return Ok(());
        }
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        let Some(pod) = pods.get_opt(pod_name).await? else {
            return Ok(());
        };
        let Some(ordinal) = identity::parent_and_ordinal(pod_name)
            .filter(|(parent, _)| *parent == self.name)
            .map(|(_, ordinal)| ordinal)
        else {
            return Ok(());
        };
        let owner = OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: pod_name.to_owned(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            controller: None,
            block_owner_deletion: Some(true),
        };
        let claims: Api<PersistentVolumeClaim> =
            Api::namespaced(self.ctx.client.clone(), &self.namespace);
        for (_, name) in identity::claims(self.set, ordinal) {
            let Some(claim) = claims.get_opt(&name).await? else {
                continue;
            };
            // The pod replaces the set as owner (upstream's
            // `updateClaimOwnerRefForSetAndPod`): the claim goes with it.
            let mut owners = claim.metadata.owner_references.clone().unwrap_or_default();
            if owners.iter().any(|o| o.uid == owner.uid) {
                continue;
            }
            owners.retain(|o| o.uid != self.uid);
            owners.push(owner.clone());
            let patch = serde_json::json!({"metadata": {"ownerReferences": owners,
                "resourceVersion": claim.metadata.resource_version}});
            claims
                .patch(
                    &name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&patch),
                )
                .await?;
        }
        Ok(())
    }

    /// The status as upstream's: counts over the pods, the two revisions,
    /// and once every pod runs the update revision and is ready, the
    /// update revision becomes the current one.
    async fn write_status(
        &self,
        shape: &Shape,
        after: &[Member],
        old: StatefulSetStatus,
    ) -> Result<(), Error> {
        let counts = plan::count(shape, after);
        let mut status = StatefulSetStatus {
            observed_generation: self.set.metadata.generation,
            replicas: counts.replicas,
            ready_replicas: Some(counts.ready),
            available_replicas: Some(counts.available),
            current_replicas: Some(counts.current),
            updated_replicas: Some(counts.updated),
            current_revision: Some(shape.current_revision.clone()),
            update_revision: Some(shape.update_revision.clone()),
            collision_count: Some(old.collision_count.unwrap_or(0)),
            conditions: None,
        };
        let rolling = matches!(shape.strategy, Strategy::RollingUpdate { .. });
        if rolling && counts.updated == counts.replicas && counts.ready == counts.replicas {
            status.current_replicas = status.updated_replicas;
            status.current_revision = status.update_revision.clone();
        }
        if status == old {
            return Ok(());
        }
        let mut written = self.set.clone();
        written.status = Some(status);
        let api: Api<StatefulSet> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        api.replace_status(&self.name, &PostParams::default(), &written)
            .await?;
        Ok(())
    }
}

/// The plan's strategy from the spec; `maxUnavailable` is scaled against
/// the replicas, rounding down, at least 1.
fn strategy(spec: &k8s_openapi::api::apps::v1::StatefulSetSpec, replicas: i32) -> Strategy {
    let strategy = spec.update_strategy.as_ref();
    if strategy.and_then(|s| s.type_.as_deref()) == Some("OnDelete") {
        return Strategy::OnDelete;
    }
    let rolling = strategy.and_then(|s| s.rolling_update.as_ref());
    let one = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1);
    let max_unavailable = rolling
        .and_then(|r| r.max_unavailable.as_ref())
        .unwrap_or(&one);
    Strategy::RollingUpdate {
        partition: rolling.and_then(|r| r.partition).unwrap_or(0).max(0),
        max_unavailable: scaled(Some(max_unavailable), replicas, false).max(1),
        parameters: rolling.is_some(),
    }
}
