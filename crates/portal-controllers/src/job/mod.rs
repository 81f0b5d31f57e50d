//! The Job controller (`batch/v1`), as kube-controller-manager's: pods run
//! to completion, `parallelism` at a time, until `completions` succeeded
//! (in `Indexed` mode each index once, its pods told `JOB_COMPLETION_INDEX`)
//! or until the Job fails: more failures than `backoffLimit`, longer than
//! `activeDeadlineSeconds`, or a `FailJob` rule of its pod failure policy.
//! Failed pods are replaced after a backoff (10 s, doubling, at most six
//! minutes); `suspend` stops the pods and resumes them later;
//! `ttlSecondsAfterFinished` deletes a finished Job (the TTL-after-finished
//! controller's duty, here).
//!
//! Finished pods are counted exactly once, as upstream does: each pod holds
//! the `batch.kubernetes.io/job-tracking` finalizer; a finished one is
//! first written into `status.uncountedTerminatedPods`, then its finalizer
//! is removed, then it moves into the `succeeded`/`failed` counts. A crash
//! between the steps repeats none of them twice.

pub mod tally;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::Stream;
use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus, UncountedTerminatedPods};
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use portal_client::Settled;

use crate::events;
use crate::replication::is_ready;
use tally::{Outcome, INDEX, TRACKING};

pub use crate::ReconcileError as Error;

const COMPONENT: &str = "job-controller";
const EXPECTATION_TTL: Duration = Duration::from_secs(30);

/// Pods created or deleted but not yet seen so in the cache.
#[derive(Debug, Default)]
struct Pending {
    /// Created pod names and their index (Indexed Jobs).
    created: HashMap<String, Option<i64>>,
    deleted: HashSet<String>,
    since: Option<Instant>,
}

struct Context {
    client: Client,
    retries: crate::Retries,
    events: events::Recorder,
    pods: Store<Pod>,
    pods_listed: Arc<crate::Listed>,
    pending: Mutex<HashMap<String, Pending>>,
    /// When each Job's last counted failure was seen (its backoff's start).
    last_failure: Mutex<HashMap<String, Instant>>,
}

/// Runs the controller until the process ends, reading pods from the
/// process's shared pod reflector.
pub async fn run(
    client: Client,
    pods: Store<Pod>,
    pod_changes: impl Stream<Item = Settled<Pod>> + Send + 'static,
) {
    let context = Arc::new(Context {
        client: client.clone(),
        retries: crate::Retries::new(Duration::from_millis(200)),
        events: events::Recorder::new(client.clone(), COMPONENT),
        pods,
        pods_listed: Arc::new(crate::Listed::default()),
        pending: Mutex::default(),
        last_failure: Mutex::default(),
    });
    let pod_changes = crate::note_listed(pod_changes, context.pods_listed.clone());
    let mapper = |pod: Arc<Pod>| -> Vec<ObjectRef<Job>> {
        let namespace = pod.namespace().unwrap_or_default();
        pod.owner_references()
            .iter()
            .find(|o| o.controller == Some(true) && o.kind == "Job")
            .map(|o| ObjectRef::new(&o.name).within(&namespace))
            .into_iter()
            .collect()
    };
    let controller = Controller::new(Api::<Job>::all(client), watcher::Config::default())
        .with_config(crate::config());
    crate::drive(
        controller
            .watches_shared_stream(portal_client::shared::objects(pod_changes), mapper)
            .run(reconcile, error_policy, context.clone()),
        COMPONENT,
        &context.retries,
    )
    .await;
}

fn error_policy(job: Arc<Job>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::debug!(%error, name = %job.name_any(), "job sync failed; retrying");
    Action::requeue(ctx.retries.after_failure(job.as_ref()))
}

async fn reconcile(job: Arc<Job>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.pods_listed.is_set() {
        return Ok(Action::requeue(crate::NOT_LISTED_YET));
    }
    let step = Step {
        namespace: job.namespace().unwrap_or_default(),
        name: job.name_any(),
        uid: job.metadata.uid.clone().unwrap_or_default(),
        ctx: &ctx,
        job: &job,
        latest: Mutex::new((*job).clone()),
        now: jiff::Timestamp::from_second(jiff::Timestamp::now().as_second()).unwrap_or_default(),
    };
    match step.run().await {
        Err(Error::Api(kube::Error::Api(status))) if status.code == 409 || status.code == 404 => {
            Ok(Action::requeue(Duration::from_millis(100)))
        }
        other => other,
    }
}

fn condition<'a>(status: &'a JobStatus, kind: &str) -> Option<&'a JobCondition> {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == kind && c.status == "True")
}

/// Sets a condition (a new status or reason replaces it, moving its
/// transition time; the same keeps it).
fn set_condition(
    status: &mut JobStatus,
    kind: &str,
    state: &str,
    reason: &str,
    message: &str,
    now: jiff::Timestamp,
) {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    if let Some(existing) = conditions.iter_mut().find(|c| c.type_ == kind) {
        if existing.status == state && existing.reason.as_deref() == Some(reason) {
            return;
        }
        *existing = JobCondition {
            type_: kind.into(),
            status: state.into(),
            reason: Some(reason.into()),
            message: Some(message.into()),
            last_probe_time: Some(Time(now)),
            last_transition_time: Some(Time(now)),
        };
        return;
    }
    conditions.push(JobCondition {
        type_: kind.into(),
        status: state.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_probe_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    });
}

fn nonzero(n: i32) -> Option<i32> {
    (n != 0).then_some(n)
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// One sync of one Job.
struct Step<'a> {
    ctx: &'a Context,
    job: &'a Job,
    /// The Job as last written (each status write answers the next
    /// `resourceVersion`).
    latest: Mutex<Job>,
    namespace: String,
    name: String,
    uid: String,
    now: jiff::Timestamp,
}

impl Step<'_> {
    fn spec(&self) -> k8s_openapi::api::batch::v1::JobSpec {
        self.job.spec.clone().unwrap_or_default()
    }

    fn pods_api(&self) -> Api<Pod> {
        Api::namespaced(self.ctx.client.clone(), &self.namespace)
    }

    fn jobs_api(&self) -> Api<Job> {
        Api::namespaced(self.ctx.client.clone(), &self.namespace)
    }

    async fn event(&self, kind: &str, reason: &str, message: &str) {
        let reference = ObjectReference {
            api_version: Some("batch/v1".into()),
            kind: Some("Job".into()),
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

    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The Job's pods in the cache.
    fn pods(&self) -> Vec<Pod> {
        self.ctx
            .pods
            .state()
            .iter()
            .filter(|p| p.namespace().as_deref() == Some(self.namespace.as_str()))
            .filter(|p| {
                p.owner_references()
                    .iter()
                    .any(|o| o.controller == Some(true) && o.uid == self.uid)
            })
            .map(|p| (**p).clone())
            .collect()
    }

    async fn run(&self) -> Result<Action, Error> {
        let pods = self.pods();
        let mut status = self.job.status.clone().unwrap_or_default();
        let finished =
            condition(&status, "Complete").is_some() || condition(&status, "Failed").is_some();

        // Count finished pods: into the uncounted lists, then their
        // finalizers go, then into the counts.
        let (status_after, failing) = self.count_finished(&pods, status.clone()).await?;
        status = status_after;
        if finished {
            return self.after_finish(&status).await;
        }

        let spec = self.spec();
        let indexed = spec.completion_mode.as_deref() == Some("Indexed");
        let parallelism = spec.parallelism.unwrap_or(1);
        let completions = spec.completions;
        let uncounted = status.uncounted_terminated_pods.clone().unwrap_or_default();
        let succeeded =
            status.succeeded.unwrap_or(0) + count(uncounted.succeeded.iter().flatten().count());
        let on_failure = spec
            .template
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.as_deref())
            == Some("OnFailure");
        let active_pods = self.with_pending(
            pods.iter()
                .filter(|p| tally::is_active(p))
                .cloned()
                .collect(),
        );
        let restarts: i32 = if on_failure {
            active_pods
                .iter()
                .flat_map(|p| {
                    p.status
                        .iter()
                        .flat_map(|s| s.container_statuses.iter().flatten())
                })
                .map(|c| c.restart_count)
                .sum()
        } else {
            0
        };
        let failed = status.failed.unwrap_or(0)
            + count(uncounted.failed.iter().flatten().count())
            + restarts;
        let completed: BTreeSet<i64> =
            tally::parse_indexes(status.completed_indexes.as_deref().unwrap_or(""));

        // Finished by success, failure or deadline?
        let done = if indexed {
            completed.len() >= usize::try_from(completions.unwrap_or(0)).unwrap_or(0)
        } else {
            match completions {
                Some(total) => succeeded >= total,
                None => succeeded > 0 && active_pods.is_empty(),
            }
        };
        let deadline_passed = spec
            .active_deadline_seconds
            .zip(status.start_time.as_ref())
            .is_some_and(|(seconds, start)| self.now.as_second() - start.0.as_second() >= seconds);
        let failure = if let Some(message) = failing {
            Some(("PodFailurePolicy", message))
        } else if failed > spec.backoff_limit.unwrap_or(6) {
            Some((
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit".to_owned(),
            ))
        } else if deadline_passed {
            Some((
                "DeadlineExceeded",
                "Job was active longer than specified deadline".to_owned(),
            ))
        } else {
            None
        };

        let mut step_status = status.clone();
        if let Some((reason, message)) = failure {
            self.delete_pods(&active_pods).await?;
            set_condition(
                &mut step_status,
                "FailureTarget",
                "True",
                reason,
                &message,
                self.now,
            );
            let terminating = pods
                .iter()
                .any(|p| !matches!(tally::phase(p), Some("Succeeded" | "Failed")));
            if !terminating {
                set_condition(
                    &mut step_status,
                    "Failed",
                    "True",
                    reason,
                    &message,
                    self.now,
                );
                self.event("Warning", reason, &message).await;
            }
        } else if done {
            self.delete_pods(&active_pods).await?;
            let message = "Reached expected number of succeeded pods";
            set_condition(
                &mut step_status,
                "SuccessCriteriaMet",
                "True",
                "CompletionsReached",
                message,
                self.now,
            );
            set_condition(
                &mut step_status,
                "Complete",
                "True",
                "CompletionsReached",
                message,
                self.now,
            );
            step_status.completion_time = Some(Time(self.now));
            self.event("Normal", "Completed", "Job completed").await;
        } else if spec.suspend == Some(true) {
            self.delete_pods(&active_pods).await?;
            if condition(&step_status, "Suspended").is_none() {
                set_condition(
                    &mut step_status,
                    "Suspended",
                    "True",
                    "JobSuspended",
                    "Job suspended",
                    self.now,
                );
                step_status.start_time = None;
                self.event("Normal", "Suspended", "Job suspended").await;
            }
        } else {
            if condition(&step_status, "Suspended").is_some() {
                set_condition(
                    &mut step_status,
                    "Suspended",
                    "False",
                    "JobResumed",
                    "Job resumed",
                    self.now,
                );
                self.event("Normal", "Resumed", "Job resumed").await;
            }
            if step_status.start_time.is_none() {
                step_status.start_time = Some(Time(self.now));
            }
            let waited = self.failure_backoff(failed);
            if waited.is_zero() {
                self.scale(
                    &active_pods,
                    indexed,
                    parallelism,
                    completions,
                    succeeded,
                    &completed,
                )
                .await?;
            } else {
                self.write_status(&pods, step_status).await?;
                return Ok(Action::requeue(waited));
            }
        }
        self.write_status(&pods, step_status.clone()).await?;
        let until_deadline = spec
            .active_deadline_seconds
            .zip(step_status.start_time.as_ref())
            .map(|(seconds, start)| {
                let left = start.0.as_second() + seconds - self.now.as_second();
                Duration::from_secs(u64::try_from(left.max(0)).unwrap_or(0) + 1)
            });
        Ok(Action::requeue(
            until_deadline
                .unwrap_or(Duration::from_secs(300))
                .min(Duration::from_secs(300)),
        ))
    }

    /// The backoff still to wait before replacing failed pods.
    fn failure_backoff(&self, failed: i32) -> Duration {
        let mut seen = self.ctx.last_failure.lock();
        if failed == 0 {
            seen.remove(&self.key());
            return Duration::ZERO;
        }
        let since = *seen.entry(self.key()).or_insert_with(Instant::now);
        tally::backoff(failed).saturating_sub(since.elapsed())
    }

    /// Counts finished pods once (the three steps in the module docs);
    /// returns the status and, when a `FailJob` rule matched, its message.
    async fn count_finished(
        &self,
        pods: &[Pod],
        mut status: JobStatus,
    ) -> Result<(JobStatus, Option<String>), Error> {
        let mut uncounted = status.uncounted_terminated_pods.clone().unwrap_or_default();
        let listed = |list: &Option<Vec<String>>| -> HashSet<String> {
            list.iter().flatten().cloned().collect()
        };
        let (mut succeeded, mut failed) = (listed(&uncounted.succeeded), listed(&uncounted.failed));
        let mut completed = tally::parse_indexes(status.completed_indexes.as_deref().unwrap_or(""));
        let mut failing = None;
        let mut ignored = Vec::new();
        let mut changed = false;
        for pod in pods.iter().filter(|p| tally::tracked(p)) {
            let uid = tally::uid(pod);
            if succeeded.contains(&uid) || failed.contains(&uid) {
                continue;
            }
            match tally::outcome(self.job, pod) {
                Some(Outcome::Succeeded) => {
                    succeeded.insert(uid);
                    completed.extend(tally::index(pod));
                    changed = true;
                }
                Some(Outcome::Failed) => {
                    failed.insert(uid);
                    self.ctx
                        .last_failure
                        .lock()
                        .insert(self.key(), Instant::now());
                    changed = true;
                }
                Some(Outcome::FailsJob(message)) => {
                    failed.insert(uid);
                    failing = Some(message);
                    changed = true;
                }
                Some(Outcome::Ignored) => ignored.push(pod.name_any()),
                None => {}
            }
        }
        let sorted = |set: &HashSet<String>| -> Option<Vec<String>> {
            let mut list: Vec<String> = set.iter().cloned().collect();
            list.sort();
            (!list.is_empty()).then_some(list)
        };
        if changed {
            uncounted = UncountedTerminatedPods {
                succeeded: sorted(&succeeded),
                failed: sorted(&failed),
            };
            status.uncounted_terminated_pods = Some(uncounted.clone());
            if self.spec().completion_mode.as_deref() == Some("Indexed") {
                status.completed_indexes = Some(tally::format_indexes(&completed));
            }
            status = self.put_status(status).await?;
        }
        // Their finalizers go (and those of ignored failures).
        let counted: HashSet<&String> = succeeded.iter().chain(failed.iter()).collect();
        for pod in pods.iter().filter(|p| tally::tracked(p)) {
            if counted.contains(&tally::uid(pod)) || ignored.contains(&pod.name_any()) {
                self.release(pod).await?;
            }
        }
        // Then into the counts.
        if !counted.is_empty() {
            status.succeeded = nonzero(status.succeeded.unwrap_or(0) + count(succeeded.len()));
            status.failed = nonzero(status.failed.unwrap_or(0) + count(failed.len()));
            status.uncounted_terminated_pods = Some(UncountedTerminatedPods::default());
            status = self.put_status(status).await?;
        }
        Ok((status, failing))
    }

    /// Removes the tracking finalizer from a pod.
    async fn release(&self, pod: &Pod) -> Result<(), Error> {
        let finalizers: Vec<&String> = pod
            .metadata
            .finalizers
            .iter()
            .flatten()
            .filter(|f| *f != TRACKING)
            .collect();
        let patch = serde_json::json!({"metadata": {"finalizers": finalizers, "resourceVersion": pod.metadata.resource_version}});
        match self
            .pods_api()
            .patch(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// A finished Job: its pods' finalizers go; past
    /// `ttlSecondsAfterFinished` it is deleted with its pods.
    async fn after_finish(&self, status: &JobStatus) -> Result<Action, Error> {
        for pod in self.pods().iter().filter(|p| tally::tracked(p)) {
            self.release(pod).await?;
        }
        let Some(ttl) = self.spec().ttl_seconds_after_finished else {
            return Ok(Action::await_change());
        };
        let finished_at = ["Complete", "Failed"]
            .iter()
            .filter_map(|kind| condition(status, kind))
            .filter_map(|c| c.last_transition_time.as_ref())
            .map(|t| t.0.as_second())
            .max()
            .unwrap_or(self.now.as_second());
        let left = finished_at + i64::from(ttl) - self.now.as_second();
        if left > 0 {
            return Ok(Action::requeue(Duration::from_secs(
                u64::try_from(left).unwrap_or(0),
            )));
        }
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Foreground),
            ..DeleteParams::default()
        };
        match self.jobs_api().delete(&self.name, &params).await {
            Ok(_) => Ok(Action::await_change()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(Action::await_change()),
            Err(e) => Err(e.into()),
        }
    }

    /// The active pods with what this controller did that the cache does
    /// not show yet: created pods count as active, deleted ones do not.
    fn with_pending(&self, mut active: Vec<Pod>) -> Vec<Pod> {
        let names: HashSet<String> = self.pods().iter().map(|p| p.name_any()).collect();
        let mut all = self.ctx.pending.lock();
        let pending = all.entry(self.key()).or_default();
        if pending.since.is_some_and(|t| t.elapsed() > EXPECTATION_TTL) {
            *pending = Pending::default();
        }
        pending.created.retain(|name, _| !names.contains(name));
        pending
            .deleted
            .retain(|name| active.iter().any(|p| p.name_any() == *name));
        active.retain(|p| !pending.deleted.contains(&p.name_any()));
        for (name, index) in &pending.created {
            let mut placeholder = Pod::default();
            placeholder.metadata.name = Some(name.clone());
            if let Some(index) = index {
                placeholder.metadata.labels = Some([(INDEX.to_owned(), index.to_string())].into());
            }
            active.push(placeholder);
        }
        active
    }

    async fn delete_pods(&self, pods: &[Pod]) -> Result<(), Error> {
        for pod in pods.iter().filter(|p| p.metadata.uid.is_some()) {
            let name = pod.name_any();
            {
                let mut all = self.ctx.pending.lock();
                let pending = all.entry(self.key()).or_default();
                pending.deleted.insert(name.clone());
                pending.since = Some(Instant::now());
            }
            match self
                .pods_api()
                .delete(&name, &DeleteParams::default())
                .await
            {
                Ok(_) => {
                    self.event(
                        "Normal",
                        "SuccessfulDelete",
                        &format!("Deleted pod: {name}"),
                    )
                    .await
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Starts or stops pods towards what should run now.
    async fn scale(
        &self,
        active: &[Pod],
        indexed: bool,
        parallelism: i32,
        completions: Option<i32>,
        succeeded: i32,
        completed: &BTreeSet<i64>,
    ) -> Result<(), Error> {
        let running = count(active.len());
        if indexed {
            let indexes: BTreeSet<i64> = active.iter().filter_map(tally::index).collect();
            let room = usize::try_from((parallelism - running).max(0)).unwrap_or(0);
            for index in tally::next_indexes(completions.unwrap_or(0), completed, &indexes, room) {
                self.create(Some(index)).await?;
            }
            return Ok(());
        }
        let wanted = tally::wanted_active(completions, parallelism, succeeded);
        if running < wanted {
            for _ in running..wanted {
                self.create(None).await?;
            }
        } else if running > wanted {
            // Not-ready pods go first.
            let mut extra: Vec<Pod> = active.to_vec();
            extra.sort_by_key(is_ready);
            extra.truncate(usize::try_from(running - wanted).unwrap_or(0));
            self.delete_pods(&extra).await?;
        }
        Ok(())
    }

    /// Creates one pod (of `index`, in an Indexed Job).
    async fn create(&self, index: Option<i64>) -> Result<(), Error> {
        let template = self.spec().template;
        let mut metadata = template.metadata.clone().unwrap_or_default();
        let mut spec = template.spec.clone().unwrap_or_default();
        let mut generate_name = format!("{}-", self.name);
        if let Some(index) = index {
            let text = index.to_string();
            metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert(INDEX.into(), text.clone());
            metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(INDEX.into(), text.clone());
            generate_name = format!("{}-{index}-", self.name);
            if spec.hostname.is_none() {
                spec.hostname = Some(format!("{}-{index}", self.name));
            }
            let variable = EnvVar {
                name: "JOB_COMPLETION_INDEX".into(),
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: format!("metadata.annotations['{INDEX}']"),
                        api_version: None,
                    }),
                    ..EnvVarSource::default()
                }),
                value: None,
            };
            for container in spec
                .containers
                .iter_mut()
                .chain(spec.init_containers.iter_mut().flatten())
            {
                container
                    .env
                    .get_or_insert_with(Vec::new)
                    .push(variable.clone());
            }
        }
        let pod = Pod {
            metadata: ObjectMeta {
                generate_name: Some(generate_name),
                namespace: Some(self.namespace.clone()),
                labels: metadata.labels,
                annotations: metadata.annotations,
                finalizers: Some(vec![TRACKING.into()]),
                owner_references: Some(vec![OwnerReference {
                    api_version: "batch/v1".into(),
                    kind: "Job".into(),
                    name: self.name.clone(),
                    uid: self.uid.clone(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
            status: None,
        };
        let created = self.pods_api().create(&PostParams::default(), &pod).await?;
        let name = created.name_any();
        {
            let mut all = self.ctx.pending.lock();
            let pending = all.entry(self.key()).or_default();
            pending.created.insert(name.clone(), index);
            pending.since = Some(Instant::now());
        }
        self.event(
            "Normal",
            "SuccessfulCreate",
            &format!("Created pod: {name}"),
        )
        .await;
        Ok(())
    }

    /// Writes the status with the pods' counts, when it changed.
    async fn write_status(&self, pods: &[Pod], mut status: JobStatus) -> Result<(), Error> {
        let active: Vec<&Pod> = pods.iter().filter(|p| tally::is_active(p)).collect();
        status.active = nonzero(count(active.len()));
        status.ready = Some(count(active.iter().filter(|p| is_ready(p)).count()));
        status.terminating = Some(count(
            pods.iter()
                .filter(|p| {
                    p.metadata.deletion_timestamp.is_some()
                        && !matches!(tally::phase(p), Some("Succeeded" | "Failed"))
                })
                .count(),
        ));
        let current = self.latest.lock().status.clone();
        if Some(&status) != current.as_ref() {
            self.put_status(status).await?;
        }
        Ok(())
    }

    async fn put_status(&self, status: JobStatus) -> Result<JobStatus, Error> {
        let mut job = self.latest.lock().clone();
        job.status = Some(status);
        let written = self
            .jobs_api()
            .replace_status(&self.name, &PostParams::default(), &job)
            .await?;
        let status = written.status.clone().unwrap_or_default();
        *self.latest.lock() = written;
        Ok(status)
    }
}
