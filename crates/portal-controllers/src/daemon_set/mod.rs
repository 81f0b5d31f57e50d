//! The DaemonSet controller (`apps/v1`), as kube-controller-manager's: a
//! pod of the template on every node that should run it ([`nodes::fit`]:
//! node selector, required node affinity, taints against the template's
//! tolerations plus the DaemonSet ones), pinned there by node affinity for
//! the scheduler to bind; a new node gets its pod, a node that no longer
//! fits loses it. Templates are kept as numbered ControllerRevisions
//! (`kubectl rollout history|undo daemonset`) and pods carry their
//! `controller-revision-hash`; `RollingUpdate` replaces them node by node
//! within `maxUnavailable`/`maxSurge` ([`plan::roll`]), `OnDelete` when
//! they are deleted.
//!
//! Like upstream it keeps expectations: pods it created or deleted that
//! the pod cache does not show yet still count, so a sync that runs before
//! the watch catches up never makes a second pod for a node.

pub mod nodes;
pub mod plan;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::Stream;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::api::{DeleteParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use portal_api::selector::LabelSelector;
use portal_client::{Settled, SharedReflector};

use crate::deployment::rollout::scaled;
use crate::events;
use crate::history::{self, History};
use crate::replication::{is_available, is_ready, set_controller};
use nodes::Fit;
use plan::{Plan, HASH_LABEL};

pub use crate::ReconcileError as Error;

const COMPONENT: &str = "daemonset-controller";
/// Pods created or deleted but not yet seen in the cache are forgotten
/// after this (a lost watch event must not stall a DaemonSet for ever).
const EXPECTATION_TTL: Duration = Duration::from_secs(30);
/// The first wait before replacing a failed pod on a node; it doubles up
/// to `MAX_FAILED_BACKOFF`.
const FAILED_BACKOFF: Duration = Duration::from_secs(1);
const MAX_FAILED_BACKOFF: Duration = Duration::from_secs(900);

/// Pods created (name → node and template hash) or deleted, not yet seen
/// so.
#[derive(Debug, Default)]
struct Pending {
    created: HashMap<String, (String, String)>,
    deleted: HashSet<String>,
    since: Option<Instant>,
}

struct Context {
    client: Client,
    retries: crate::Retries,
    events: events::Recorder,
    pods: Store<Pod>,
    nodes: Store<Node>,
    revisions: Store<ControllerRevision>,
    listed: [Arc<crate::Listed>; 3],
    pending: Mutex<HashMap<String, Pending>>,
    /// Per DaemonSet and node: when a failed pod may be replaced next, and
    /// the wait after that.
    failed: Mutex<HashMap<(String, String), (Instant, Duration)>>,
}

fn selector_of(ds: &DaemonSet) -> Option<LabelSelector> {
    crate::label_selector(&ds.spec.as_ref()?.selector).filter(|s| !s.is_empty())
}

/// Runs the controller until the process ends, reading pods from the
/// process's shared pod reflector.
pub async fn run(
    client: Client,
    pods: Store<Pod>,
    pod_changes: impl Stream<Item = Settled<Pod>> + Send + 'static,
) {
    let mut nodes = SharedReflector::new(
        Api::<Node>::all(client.clone()),
        watcher::Config::default(),
        |n: &mut Node| n.metadata.managed_fields = None,
    );
    let mut revisions = SharedReflector::new(
        Api::<ControllerRevision>::all(client.clone()),
        watcher::Config::default(),
        |r: &mut ControllerRevision| r.metadata.managed_fields = None,
    );
    let listed: [Arc<crate::Listed>; 3] = Default::default();
    let context = Arc::new(Context {
        client: client.clone(),
        retries: crate::Retries::new(Duration::from_millis(200)),
        events: events::Recorder::new(client.clone(), COMPONENT),
        pods,
        nodes: nodes.store(),
        revisions: revisions.store(),
        listed: listed.clone(),
        pending: Mutex::default(),
        failed: Mutex::default(),
    });
    let pod_changes = crate::note_listed(pod_changes, listed[0].clone());
    let node_changes = crate::note_listed(nodes.subscribe(), listed[1].clone());
    let revision_changes = crate::note_listed(revisions.subscribe(), listed[2].clone());
    let controller = Controller::new(Api::<DaemonSet>::all(client), watcher::Config::default())
        .with_config(crate::config());
    let daemon_sets = controller.store();
    let all_sets = daemon_sets.clone();
    // A pod concerns its DaemonSet, or as an orphan every DaemonSet whose
    // selector matches it.
    let pod_mapper = move |pod: Arc<Pod>| -> Vec<ObjectRef<DaemonSet>> {
        let namespace = pod.namespace().unwrap_or_default();
        if let Some(owner) = crate::controller_of(pod.owner_references()) {
            return (owner.kind == "DaemonSet")
                .then(|| ObjectRef::new(&owner.name).within(&namespace))
                .into_iter()
                .collect();
        }
        daemon_sets
            .state()
            .iter()
            .filter(|d| d.namespace().as_deref() == Some(namespace.as_str()))
            .filter(|d| crate::selects(selector_of(d).as_ref(), pod.labels()))
            .map(|d| ObjectRef::from_obj(&**d))
            .collect()
    };
    // A node change may concern every DaemonSet.
    let node_mapper = move |_: Arc<Node>| -> Vec<ObjectRef<DaemonSet>> {
        all_sets
            .state()
            .iter()
            .map(|d| ObjectRef::from_obj(&**d))
            .collect()
    };
    let revision_mapper = |revision: Arc<ControllerRevision>| {
        crate::controller_ref::<DaemonSet>(&*revision, "DaemonSet")
    };
    let daemon_sets = crate::drive(
        controller
            .watches_shared_stream(portal_client::shared::objects(pod_changes), pod_mapper)
            .watches_shared_stream(portal_client::shared::objects(node_changes), node_mapper)
            .watches_shared_stream(
                portal_client::shared::objects(revision_changes),
                revision_mapper,
            )
            .run(reconcile, error_policy, context.clone()),
        COMPONENT,
        &context.retries,
    );
    tokio::join!(nodes.run(), revisions.run(), daemon_sets);
}

fn error_policy(ds: Arc<DaemonSet>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::debug!(%error, name = %ds.name_any(), "daemon set sync failed; retrying");
    Action::requeue(ctx.retries.after_failure(ds.as_ref()))
}

async fn reconcile(ds: Arc<DaemonSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.listed.iter().all(|l| l.is_set()) {
        return Ok(Action::requeue(crate::NOT_LISTED_YET));
    }
    let Some(selector) = selector_of(&ds) else {
        return Ok(Action::await_change());
    };
    let step = Step {
        namespace: ds.namespace().unwrap_or_default(),
        name: ds.name_any(),
        uid: ds.metadata.uid.clone().unwrap_or_default(),
        key: format!("{}/{}", ds.namespace().unwrap_or_default(), ds.name_any()),
        ctx: &ctx,
        ds: &ds,
        now: jiff::Timestamp::now(),
    };
    match step.run(&selector).await {
        Err(Error::Api(kube::Error::Api(status))) if status.code == 409 || status.code == 404 => {
            Ok(Action::requeue(Duration::from_millis(100)))
        }
        other => other,
    }
}

/// One sync of one DaemonSet.
struct Step<'a> {
    ctx: &'a Context,
    ds: &'a DaemonSet,
    namespace: String,
    name: String,
    uid: String,
    key: String,
    now: jiff::Timestamp,
}

impl Step<'_> {
    fn owner(&self) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: "DaemonSet".into(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    fn reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("apps/v1".into()),
            kind: Some("DaemonSet".into()),
            name: Some(self.name.clone()),
            namespace: Some(self.namespace.clone()),
            uid: Some(self.uid.clone()),
            ..ObjectReference::default()
        }
    }

    async fn event(&self, kind: &str, reason: &str, message: &str) {
        self.ctx
            .events
            .record(&self.reference(), kind, reason, message)
            .await;
    }

    fn deleting(&self) -> bool {
        self.ds.metadata.deletion_timestamp.is_some()
    }

    async fn run(&self, selector: &LabelSelector) -> Result<Action, Error> {
        let hash = self.current_revision(selector).await?;
        let pods = self.claim_pods(selector).await?;
        let spec = nodes::daemon_pod_spec(self.ds);
        let fits: BTreeMap<String, Fit> = self
            .ctx
            .nodes
            .state()
            .iter()
            .map(|node| (node.name_any(), nodes::fit(&spec, node)))
            .collect();
        // What the cache shows (reported), and with what this controller
        // did that it does not show yet (planned from).
        let by_node = nodes::by_node(pods.clone());
        let planned = nodes::by_node(self.with_pending(pods));
        let strategy = self
            .ds
            .spec
            .as_ref()
            .and_then(|s| s.update_strategy.as_ref());
        let rolling = strategy
            .and_then(|s| s.type_.as_deref())
            .unwrap_or("RollingUpdate")
            == "RollingUpdate";
        let rolling_update = strategy.and_then(|s| s.rolling_update.as_ref());
        let desired =
            i32::try_from(fits.values().filter(|f| f.should_run).count()).unwrap_or(i32::MAX);
        let mut max_surge = scaled(
            rolling_update.and_then(|r| r.max_surge.as_ref()),
            desired,
            true,
        );
        let mut max_unavailable = scaled(
            rolling_update.and_then(|r| r.max_unavailable.as_ref()),
            desired,
            true,
        );
        if !rolling {
            max_surge = 0;
        }
        if desired > 0 && max_surge == 0 && max_unavailable == 0 {
            max_unavailable = 1;
        }
        let min_ready = self.min_ready_seconds();
        if !self.deleting() {
            let mut step = plan::manage(&fits, &planned, &hash, max_surge > 0);
            if step == Plan::default() && rolling {
                step = plan::roll(
                    &fits,
                    &planned,
                    &hash,
                    max_unavailable,
                    max_surge,
                    min_ready,
                    self.now,
                );
            }
            self.carry_out(step, &hash).await?;
        }
        self.clean_up_history(selector, &hash, &by_node).await?;
        self.write_status(&fits, &by_node, &hash).await?;
        // Ready pods become available after minReadySeconds: look again then.
        let waiting = by_node
            .values()
            .flatten()
            .any(|p| is_ready(p) && !is_available(p, min_ready, self.now));
        Ok(if waiting {
            Action::requeue(Duration::from_secs(
                u64::try_from(min_ready).unwrap_or(0) + 1,
            ))
        } else {
            Action::requeue(Duration::from_secs(300))
        })
    }

    fn min_ready_seconds(&self) -> i64 {
        self.ds
            .spec
            .as_ref()
            .and_then(|s| s.min_ready_seconds)
            .map_or(0, i64::from)
    }

    /// The DaemonSet's pods: its own that match, orphans that match
    /// (adopted), its own that stopped matching released.
    async fn claim_pods(&self, selector: &LabelSelector) -> Result<Vec<Pod>, Error> {
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        let owner = self.owner();
        let mut claimed = Vec::new();
        for pod in self.ctx.pods.state() {
            if pod.namespace().as_deref() != Some(self.namespace.as_str()) {
                continue;
            }
            let matches = crate::selects(Some(selector), pod.labels());
            match crate::controller_of(pod.owner_references()) {
                Some(o) if o.uid == self.uid => {
                    if matches {
                        claimed.push((*pod).clone());
                    } else if !self.deleting() {
                        set_controller(&api, &pod, None, &self.uid).await?;
                    }
                }
                None if matches
                    && !self.deleting()
                    && pod.metadata.deletion_timestamp.is_none() =>
                {
                    set_controller(&api, &pod, Some(&owner), &self.uid).await?;
                    claimed.push((*pod).clone());
                }
                _ => {}
            }
        }
        Ok(claimed)
    }

    /// The pods with what this controller did and the cache does not show
    /// yet: created pods stand on their node, deleted ones are going.
    fn with_pending(&self, mut pods: Vec<Pod>) -> Vec<Pod> {
        let mut all = self.ctx.pending.lock();
        let pending = all.entry(self.key.clone()).or_default();
        if pending.since.is_some_and(|t| t.elapsed() > EXPECTATION_TTL) {
            *pending = Pending::default();
        }
        let seen: HashMap<String, bool> = pods
            .iter()
            .map(|p| (p.name_any(), p.metadata.deletion_timestamp.is_some()))
            .collect();
        pending.created.retain(|name, _| !seen.contains_key(name));
        pending
            .deleted
            .retain(|name| seen.get(name) == Some(&false));
        for pod in &mut pods {
            if pending.deleted.contains(&pod.name_any()) {
                pod.metadata.deletion_timestamp = Some(Time(self.now));
            }
        }
        for (name, (node, hash)) in &pending.created {
            let mut placeholder = Pod::default();
            placeholder.metadata.name = Some(name.clone());
            placeholder.metadata.labels = Some([(HASH_LABEL.to_owned(), hash.clone())].into());
            placeholder.spec = Some(k8s_openapi::api::core::v1::PodSpec {
                node_name: Some(node.clone()),
                ..Default::default()
            });
            pods.push(placeholder);
        }
        pods
    }

    /// Deletes and creates as planned; failed pods' nodes wait a backoff
    /// before their next pod.
    async fn carry_out(&self, step: Plan, hash: &str) -> Result<(), Error> {
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        for node in &step.failed_on {
            let message = format!("Found failed daemon pod on node {node}, will try to kill it");
            self.event("Warning", "FailedDaemonPod", &message).await;
            let mut failed = self.ctx.failed.lock();
            let entry = failed
                .entry((self.key.clone(), node.clone()))
                .or_insert((Instant::now(), FAILED_BACKOFF / 2));
            let delay = (entry.1 * 2).min(MAX_FAILED_BACKOFF);
            *entry = (Instant::now() + delay, delay);
        }
        for name in &step.delete {
            {
                let mut pending = self.ctx.pending.lock();
                let pending = pending.entry(self.key.clone()).or_default();
                pending.deleted.insert(name.clone());
                pending.since = Some(Instant::now());
            }
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {
                    let message = format!("Deleted pod: {name}");
                    self.event("Normal", "SuccessfulDelete", &message).await;
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        for node in &step.create_on {
            let backing_off = self
                .ctx
                .failed
                .lock()
                .get(&(self.key.clone(), node.clone()))
                .is_some_and(|(until, _)| Instant::now() < *until);
            if backing_off {
                continue;
            }
            let created = api
                .create(&PostParams::default(), &self.pod_for(node, hash))
                .await?;
            let name = created.name_any();
            {
                let mut pending = self.ctx.pending.lock();
                let pending = pending.entry(self.key.clone()).or_default();
                pending
                    .created
                    .insert(name.clone(), (node.clone(), hash.to_owned()));
                pending.since = Some(Instant::now());
            }
            let message = format!("Created pod: {name}");
            self.event("Normal", "SuccessfulCreate", &message).await;
        }
        Ok(())
    }

    /// The DaemonSet's pod for a node.
    fn pod_for(&self, node: &str, hash: &str) -> Pod {
        let template = self
            .ds
            .spec
            .as_ref()
            .map(|s| s.template.clone())
            .unwrap_or_default();
        let mut spec = nodes::daemon_pod_spec(self.ds);
        nodes::pin_to_node(&mut spec, node);
        let mut labels = template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        labels.insert(HASH_LABEL.into(), hash.into());
        Pod {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}-", self.name)),
                namespace: Some(self.namespace.clone()),
                labels: Some(labels),
                annotations: template
                    .metadata
                    .as_ref()
                    .and_then(|m| m.annotations.clone()),
                owner_references: Some(vec![self.owner()]),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
            status: None,
        }
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

    /// The revision of the current template, made (or re-numbered, when an
    /// old template comes back) as needed; its hash.
    async fn current_revision(&self, selector: &LabelSelector) -> Result<String, Error> {
        let template = self
            .ds
            .spec
            .as_ref()
            .map(|s| s.template.clone())
            .unwrap_or_default();
        let status = self.ds.status.clone().unwrap_or_default();
        let revision = self
            .history()
            .revision_of(
                selector,
                &template,
                self.ds.metadata.annotations.as_ref(),
                status.collision_count,
            )
            .await?;
        if let Some(revision) = revision {
            return Ok(history::hash_of(&revision, HASH_LABEL));
        }
        // Another template has this name: count the collision so the next
        // hash differs, and try again.
        let mut updated = self.ds.clone();
        let mut status = status;
        status.collision_count = Some(status.collision_count.unwrap_or(0).saturating_add(1));
        updated.status = Some(status);
        let sets: Api<DaemonSet> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        sets.replace_status(&self.name, &PostParams::default(), &updated)
            .await?;
        Err(crate::conflict(
            "revision name collision counted; trying again",
        ))
    }

    /// Old revisions beyond `revisionHistoryLimit` that no pod runs go,
    /// oldest first.
    async fn clean_up_history(
        &self,
        selector: &LabelSelector,
        hash: &str,
        by_node: &BTreeMap<String, Vec<Pod>>,
    ) -> Result<(), Error> {
        let limit = self
            .ds
            .spec
            .as_ref()
            .and_then(|s| s.revision_history_limit)
            .unwrap_or(10);
        let in_use: HashSet<&str> = by_node
            .values()
            .flatten()
            .filter_map(|p| p.labels().get(HASH_LABEL).map(String::as_str))
            .collect();
        let keep = |r: &ControllerRevision| {
            let own = history::hash_of(r, HASH_LABEL);
            own == hash || in_use.contains(own.as_str())
        };
        self.history().truncate(selector, keep, limit).await
    }

    /// Counts per node, as upstream's `updateDaemonSetStatus`: the oldest
    /// pod on a node decides whether it is ready and available.
    async fn write_status(
        &self,
        fits: &BTreeMap<String, Fit>,
        by_node: &BTreeMap<String, Vec<Pod>>,
        hash: &str,
    ) -> Result<(), Error> {
        let min_ready = self.min_ready_seconds();
        let (mut desired, mut current, mut misscheduled, mut ready, mut available, mut updated) =
            (0, 0, 0, 0, 0, 0);
        for (node, fit) in fits {
            let mut here: Vec<&Pod> = by_node
                .get(node)
                .into_iter()
                .flatten()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            here.sort_by_key(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0));
            if fit.should_run {
                desired += 1;
                let Some(oldest) = here.first() else {
                    continue;
                };
                current += 1;
                if is_ready(oldest) {
                    ready += 1;
                    if is_available(oldest, min_ready, self.now) {
                        available += 1;
                    }
                }
                if here
                    .iter()
                    .any(|p| p.labels().get(HASH_LABEL).is_some_and(|h| h == hash))
                {
                    updated += 1;
                }
            } else if !here.is_empty() {
                misscheduled += 1;
            }
        }
        let old = self.ds.status.clone().unwrap_or_default();
        let status = DaemonSetStatus {
            desired_number_scheduled: desired,
            current_number_scheduled: current,
            number_misscheduled: misscheduled,
            number_ready: ready,
            number_available: (available != 0).then_some(available),
            updated_number_scheduled: (updated != 0).then_some(updated),
            number_unavailable: (desired - available != 0).then_some(desired - available),
            observed_generation: self.ds.metadata.generation,
            collision_count: old.collision_count,
            conditions: old.conditions.clone(),
        };
        if status == old {
            return Ok(());
        }
        let mut written = self.ds.clone();
        written.status = Some(status);
        let api: Api<DaemonSet> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        api.replace_status(&self.name, &PostParams::default(), &written)
            .await?;
        Ok(())
    }
}
