//! The CronJob controller (`batch/v1`), as kube-controller-manager's
//! second version: at each scheduled time (in the CronJob's time zone, else
//! the controller's) a Job from the template, named `<cronjob>-<minutes
//! since the epoch>` so a time is never run twice; `Forbid` skips a time
//! while a Job runs, `Replace` deletes it first; a time older than
//! `startingDeadlineSeconds` is missed, not run late. Finished Jobs leave
//! `status.active` and beyond the history limits are deleted.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{CronJob, CronJobStatus, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::api::{DeleteParams, PostParams, PropagationPolicy};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use portal_api::cron::Schedule;
use portal_client::SharedReflector;

use crate::events;

pub use crate::ReconcileError as Error;

const COMPONENT: &str = "cronjob-controller";
/// The annotation with the time a Job was scheduled for.
const SCHEDULED: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";
/// More missed times than this is reported (and only the last one runs).
const TOO_MANY_MISSED: usize = 100;

struct Context {
    client: Client,
    retries: crate::Retries,
    events: events::Recorder,
    jobs: Store<Job>,
    jobs_listed: Arc<crate::Listed>,
}

/// Runs the controller until the process ends.
pub async fn run(client: Client) {
    let mut jobs = SharedReflector::new(
        Api::<Job>::all(client.clone()),
        watcher::Config::default(),
        |job: &mut Job| job.metadata.managed_fields = None,
    );
    let context = Arc::new(Context {
        client: client.clone(),
        retries: crate::Retries::new(Duration::from_millis(500)),
        events: events::Recorder::new(client.clone(), COMPONENT),
        jobs: jobs.store(),
        jobs_listed: Arc::new(crate::Listed::default()),
    });
    let job_changes = crate::note_listed(jobs.subscribe(), context.jobs_listed.clone());
    let mapper = |job: Arc<Job>| -> Vec<ObjectRef<CronJob>> {
        let namespace = job.namespace().unwrap_or_default();
        job.owner_references()
            .iter()
            .find(|o| o.controller == Some(true) && o.kind == "CronJob")
            .map(|o| ObjectRef::new(&o.name).within(&namespace))
            .into_iter()
            .collect()
    };
    let controller = Controller::new(Api::<CronJob>::all(client), watcher::Config::default())
        .with_config(crate::config());
    let cron_jobs = crate::drive(
        controller
            .watches_shared_stream(portal_client::shared::objects(job_changes), mapper)
            .run(reconcile, error_policy, context.clone()),
        COMPONENT,
        &context.retries,
    );
    tokio::join!(jobs.run(), cron_jobs);
}

fn error_policy(cron_job: Arc<CronJob>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::debug!(%error, name = %cron_job.name_any(), "cron job sync failed; retrying");
    Action::requeue(ctx.retries.after_failure(cron_job.as_ref()))
}

/// A Job's finished condition (`Complete` or `Failed`), if it has one.
fn finished(job: &Job) -> Option<&'static str> {
    let conditions = job.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.into_iter().flatten().find_map(|c| {
        (c.status == "True")
            .then_some(match c.type_.as_str() {
                "Complete" => Some("Complete"),
                "Failed" => Some("Failed"),
                _ => None,
            })
            .flatten()
    })
}

fn reference(job: &Job) -> ObjectReference {
    ObjectReference {
        api_version: Some("batch/v1".into()),
        kind: Some("Job".into()),
        name: job.metadata.name.clone(),
        namespace: job.metadata.namespace.clone(),
        uid: job.metadata.uid.clone(),
        resource_version: job.metadata.resource_version.clone(),
        ..ObjectReference::default()
    }
}

async fn reconcile(cron_job: Arc<CronJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.jobs_listed.is_set() {
        return Ok(Action::requeue(crate::NOT_LISTED_YET));
    }
    let namespace = cron_job.namespace().unwrap_or_default();
    let name = cron_job.name_any();
    let uid = cron_job.metadata.uid.clone().unwrap_or_default();
    let jobs_api: Api<Job> = Api::namespaced(ctx.client.clone(), &namespace);
    let cron_api: Api<CronJob> = Api::namespaced(ctx.client.clone(), &namespace);
    let this = ObjectReference {
        api_version: Some("batch/v1".into()),
        kind: Some("CronJob".into()),
        name: Some(name.clone()),
        namespace: Some(namespace.clone()),
        uid: Some(uid.clone()),
        ..ObjectReference::default()
    };
    let event = |kind: &'static str, reason: &'static str, message: String| {
        let ctx = ctx.clone();
        let this = this.clone();
        async move { ctx.events.record(&this, kind, reason, &message).await }
    };
    let spec = cron_job.spec.clone().unwrap_or_default();
    let mut status = cron_job.status.clone().unwrap_or_default();
    let now = jiff::Timestamp::now();

    // The Jobs it owns; finished ones leave `active`, running ones join.
    let mut owned: Vec<Job> = ctx
        .jobs
        .state()
        .iter()
        .filter(|j| j.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|j| {
            j.owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && o.uid == uid)
        })
        .map(|j| (**j).clone())
        .collect();
    let mut active = Vec::new();
    for job in &owned {
        match finished(job) {
            None => active.push(reference(job)),
            Some(state) => {
                let was_active = status
                    .active
                    .iter()
                    .flatten()
                    .any(|r| r.uid == job.metadata.uid);
                if was_active {
                    let message = format!("Saw completed job: {}, status: {state}", job.name_any());
                    event("Normal", "SawCompletedJob", message).await;
                }
                if state == "Complete" {
                    let done = job.status.as_ref().and_then(|s| s.completion_time.clone());
                    if done.as_ref().map(|t| t.0)
                        > status.last_successful_time.as_ref().map(|t| t.0)
                    {
                        status.last_successful_time = done;
                    }
                }
            }
        }
    }
    // A Job just created may not be in the cache yet: kept while it exists.
    for listed in status.active.iter().flatten() {
        let known = owned.iter().any(|j| j.metadata.uid == listed.uid);
        if !known {
            if let Some(job_name) = &listed.name {
                if let Ok(job) = jobs_api.get(job_name).await {
                    if finished(&job).is_none() && job.metadata.uid == listed.uid {
                        active.push(listed.clone());
                    }
                }
            }
        }
    }
    status.active = (!active.is_empty()).then_some(active);

    if cron_job.metadata.deletion_timestamp.is_none() {
        clean_up(&jobs_api, &mut owned, &spec, &event).await?;
    }
    if cron_job.metadata.deletion_timestamp.is_some() || spec.suspend == Some(true) {
        write_status(&cron_api, &cron_job, status).await?;
        return Ok(Action::await_change());
    }
    let zone = match spec.time_zone.as_deref() {
        Some(zone) => jiff::tz::TimeZone::get(zone).unwrap_or(jiff::tz::TimeZone::UTC),
        None => jiff::tz::TimeZone::system(),
    };
    let schedule = match Schedule::parse(&spec.schedule) {
        Ok(schedule) => schedule,
        Err(error) => {
            let message = format!("unparseable schedule: {:?} : {error}", spec.schedule);
            event("Warning", "UnparseableSchedule", message).await;
            write_status(&cron_api, &cron_job, status).await?;
            return Ok(Action::await_change());
        }
    };
    // The most recent time due since the last run (or creation).
    let mut earliest = status
        .last_schedule_time
        .as_ref()
        .or(cron_job.metadata.creation_timestamp.as_ref())
        .map(|t| t.0)
        .unwrap_or(now);
    if let Some(deadline) = spec.starting_deadline_seconds {
        let window = jiff::Timestamp::from_second(now.as_second() - deadline).unwrap_or(now);
        earliest = earliest.max(window);
    }
    let (mut due, mut missed) = (None, 0usize);
    let mut t = schedule.next_after(earliest, &zone);
    while let Some(at) = t.filter(|at| *at <= now) {
        due = Some(at);
        missed += 1;
        if missed > 100_000 {
            break;
        }
        t = schedule.next_after(at, &zone);
    }
    let next = schedule.next_after(now, &zone);
    let wait = next
        .map(|at| {
            Duration::from_millis(u64::try_from((at - now).get_milliseconds()).unwrap_or(0) + 100)
        })
        .unwrap_or(Duration::from_secs(3600));
    let Some(due) = due else {
        write_status(&cron_api, &cron_job, status).await?;
        return Ok(Action::requeue(wait));
    };
    if missed > TOO_MANY_MISSED {
        let message = "too many missed start times. Set or decrease .spec.startingDeadlineSeconds or check clock skew".to_owned();
        event("Warning", "TooManyMissedTimes", message).await;
    }
    let policy = spec.concurrency_policy.as_deref().unwrap_or("Allow");
    if policy == "Forbid" && status.active.is_some() {
        let message =
            "Not starting job because prior execution is running and concurrency policy is Forbid"
                .to_owned();
        event("Normal", "JobAlreadyActive", message).await;
        write_status(&cron_api, &cron_job, status).await?;
        return Ok(Action::requeue(wait));
    }
    if policy == "Replace" {
        for running in status.active.take().into_iter().flatten() {
            let Some(job_name) = running.name else {
                continue;
            };
            delete_job(&jobs_api, &job_name).await?;
            event(
                "Normal",
                "SuccessfulDelete",
                format!("Deleted job {job_name}"),
            )
            .await;
        }
    }
    let job = job_for(&cron_job, due, &zone);
    let job_name = job.name_any();
    let created = match jobs_api.create(&PostParams::default(), &job).await {
        Ok(created) => {
            event(
                "Normal",
                "SuccessfulCreate",
                format!("Created job {job_name}"),
            )
            .await;
            Some(created)
        }
        // Made for this time already (by an earlier sync).
        Err(kube::Error::Api(e)) if e.code == 409 => None,
        Err(e) => return Err(e.into()),
    };
    if let Some(created) = created {
        status
            .active
            .get_or_insert_with(Vec::new)
            .push(reference(&created));
    }
    status.last_schedule_time = Some(Time(due));
    write_status(&cron_api, &cron_job, status).await?;
    Ok(Action::requeue(wait))
}

/// The Job for the time `due`.
fn job_for(cron_job: &CronJob, due: jiff::Timestamp, zone: &jiff::tz::TimeZone) -> Job {
    let spec = cron_job.spec.clone().unwrap_or_default();
    let template = spec.job_template;
    let template_meta = template.metadata.unwrap_or_default();
    let mut annotations = template_meta.annotations.unwrap_or_default();
    annotations.insert(
        SCHEDULED.into(),
        due.to_zoned(zone.clone())
            .strftime("%Y-%m-%dT%H:%M:%S%:z")
            .to_string(),
    );
    Job {
        metadata: ObjectMeta {
            name: Some(format!("{}-{}", cron_job.name_any(), due.as_second() / 60)),
            namespace: cron_job.namespace(),
            labels: template_meta.labels,
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "batch/v1".into(),
                kind: "CronJob".into(),
                name: cron_job.name_any(),
                uid: cron_job.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(template.spec.unwrap_or_default()),
        status: None,
    }
}

async fn delete_job(api: &Api<Job>, name: &str) -> Result<(), Error> {
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes finished Jobs beyond the history limits, oldest first.
async fn clean_up<F, Fut>(
    api: &Api<Job>,
    owned: &mut [Job],
    spec: &k8s_openapi::api::batch::v1::CronJobSpec,
    event: &F,
) -> Result<(), Error>
where
    F: Fn(&'static str, &'static str, String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let started = |job: &Job| {
        job.status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0)
            .or(job.metadata.creation_timestamp.as_ref().map(|t| t.0))
    };
    owned.sort_by_key(started);
    for (state, limit) in [
        ("Complete", spec.successful_jobs_history_limit.unwrap_or(3)),
        ("Failed", spec.failed_jobs_history_limit.unwrap_or(1)),
    ] {
        let done: Vec<&Job> = owned
            .iter()
            .filter(|j| finished(j) == Some(state) && j.metadata.deletion_timestamp.is_none())
            .collect();
        let excess = done
            .len()
            .saturating_sub(usize::try_from(limit).unwrap_or(0));
        for job in done.into_iter().take(excess) {
            delete_job(api, &job.name_any()).await?;
            event(
                "Normal",
                "SuccessfulDelete",
                format!("Deleted job {}", job.name_any()),
            )
            .await;
        }
    }
    Ok(())
}

async fn write_status(
    api: &Api<CronJob>,
    cron_job: &CronJob,
    status: CronJobStatus,
) -> Result<(), Error> {
    if cron_job.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let mut updated = cron_job.clone();
    updated.status = Some(status);
    api.replace_status(&cron_job.name_any(), &PostParams::default(), &updated)
        .await?;
    Ok(())
}
