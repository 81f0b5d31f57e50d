//! One serialized worker per pod (the kubelet's `pod_workers.go`): each
//! sync compares the pod as desired with what the runtime has and does the
//! difference (`computePodActions`): make the sandbox, start containers that
//! are missing, restart those that ended as the restart policy says (with
//! back-off), then write the status. When the pod is no longer desired, the
//! worker stops its containers within the grace period and removes
//! everything it made (containers, sandbox, address, files, logs).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::Notify;

use crate::backoff::Backoff;
use crate::objects::Objects;
use crate::pods::start::{self, StartFailure};
use crate::pods::{Context, Place};
use crate::runtime::{ContainerStatus, Runtime, State};
use crate::status::{self, Observed, Waiting};

mod stop;

/// A sync with nothing to wait for still runs this often.
const RESYNC: Duration = Duration::from_secs(10);
/// Grace period when the spec gives none, as in Kubernetes.
const DEFAULT_GRACE: i64 = 30;

pub(super) struct Worker<R: Runtime> {
    ctx: Arc<Context<R>>,
    uid: String,
    backoff: Backoff,
    waiting: HashMap<String, Waiting>,
    /// The last desired version of the pod seen (for termination).
    last: Option<Arc<Pod>>,
    /// Time spent pulling images for this pod (the start SLI leaves it out).
    pulling: Duration,
    /// The pod's start has been measured.
    start_observed: bool,
    /// The last volume set-up failure reported (one event per new one).
    mount_error: Option<String>,
    /// Containers killed because their image changed: made again next.
    redefined: std::collections::HashSet<String>,
}

impl<R: Runtime> Worker<R> {
    pub(super) fn new(ctx: Arc<Context<R>>, uid: String) -> Self {
        Worker {
            ctx,
            uid,
            backoff: Backoff::default(),
            waiting: HashMap::new(),
            last: None,
            pulling: Duration::ZERO,
            start_observed: false,
            mount_error: None,
            redefined: std::collections::HashSet::new(),
        }
    }

    /// Syncs until the pod is gone and cleaned up.
    pub(super) async fn run(mut self, wake: Arc<Notify>) {
        let _unregister = Unregister {
            ctx: self.ctx.clone(),
            uid: self.uid.clone(),
        };
        loop {
            let desired = self.ctx.desired.get(&self.uid);
            match desired {
                // Deleted through the API: stop gracefully, then confirm.
                Some(pod) if pod.metadata.deletion_timestamp.is_some() => {
                    self.last = Some(pod.clone());
                    if self.finish_deletion(&pod).await {
                        self.ctx.desired.remove(&self.uid);
                        self.terminate().await;
                        self.ctx.workers.lock().remove(&self.uid);
                        if self.ctx.desired.get(&self.uid).is_some() {
                            self.ctx.dispatch(&self.uid);
                        }
                        return;
                    }
                }
                // A static pod whose name an older one still holds waits for
                // it to stop (woken when it has).
                Some(pod) if self.name_held(&pod) => self.last = Some(pod),
                Some(pod) => {
                    let pod = self.ctx.status.known(pod);
                    self.last = Some(pod.clone());
                    if let Err(error) = self.sync(&pod).await {
                        tracing::warn!(%error, pod = %crate::pods::describe(&pod), "pod sync failed");
                    }
                }
                None => {
                    self.terminate().await;
                    self.release_name();
                    self.ctx.workers.lock().remove(&self.uid);
                    // A pod re-added meanwhile gets a new worker.
                    if self.ctx.desired.get(&self.uid).is_some() {
                        self.ctx.dispatch(&self.uid);
                    }
                    return;
                }
            }
            let now = Instant::now();
            let wait = self
                .backoff
                .next_expiry(now)
                .map_or(RESYNC, |at| at.duration_since(now).min(RESYNC));
            tokio::select! {
                () = wake.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Whether another static pod of this one's namespace/name is still
    /// stopping.
    fn name_held(&self, pod: &Pod) -> bool {
        if !status::is_static(pod) {
            return false;
        }
        let name = crate::pods::full_name(pod);
        self.ctx
            .terminating
            .lock()
            .get(&name)
            .is_some_and(|uid| *uid != self.uid)
    }

    /// This pod has stopped: its name is free for the pod waiting for it.
    fn release_name(&self) {
        let Some(pod) = &self.last else {
            return;
        };
        let name = crate::pods::full_name(pod);
        let mut terminating = self.ctx.terminating.lock();
        if terminating.get(&name) != Some(&self.uid) {
            return;
        }
        terminating.remove(&name);
        drop(terminating);
        if let Some(next) = self.ctx.desired.find(&name.0, &name.1) {
            if let Some(uid) = next.metadata.uid.as_deref() {
                self.ctx.dispatch(uid);
            }
        }
    }

    fn mine(&self) -> Vec<ContainerStatus> {
        self.ctx
            .runtime
            .containers()
            .into_iter()
            .filter(|c| c.meta.pod_uid == self.uid)
            .collect()
    }

    async fn sync(&mut self, pod: &Arc<Pod>) -> Result<(), crate::pods::SyncError> {
        let spec = pod.spec.clone().unwrap_or_default();
        let host_network = spec.host_network == Some(true);
        let mut containers = self.mine();
        // Past its activeDeadlineSeconds: stopped for good, and Failed.
        let started_at = pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0);
        let exceeded = match (spec.active_deadline_seconds, started_at) {
            (Some(deadline), Some(at)) => {
                jiff::Timestamp::now().as_second() - at.as_second() >= deadline
            }
            _ => false,
        };
        let finished = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed");
        if exceeded && !finished {
            let message = "Pod was active on the node longer than the specified deadline";
            self.ctx
                .event(pod, None, "Normal", "DeadlineExceeded", message)
                .await;
            self.stop_gracefully(self.grace()).await;
            let ended = ("DeadlineExceeded".to_owned(), message.to_owned());
            let status = self.status_now(pod, &self.mine(), false, ips_in_status(pod), Some(ended));
            self.ctx.status.set(pod, status).await?;
            return Ok(());
        }
        // An emptyDir past its sizeLimit: the pod is evicted (the kubelet's
        // eviction manager, for local storage).
        let over = if finished {
            None
        } else {
            crate::volumes::over_limit(&self.ctx.pod_dir(&self.uid), pod)
        };
        if let Some(message) = over {
            self.ctx
                .event(pod, None, "Warning", "Evicted", &message)
                .await;
            self.stop_gracefully(self.grace()).await;
            let ended = ("Evicted".to_owned(), message);
            let status = self.status_now(pod, &self.mine(), false, ips_in_status(pod), Some(ended));
            self.ctx.status.set(pod, status).await?;
            return Ok(());
        }
        let terminal = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed");
        // Sandbox: a pod whose network namespace vanished (a reboot) starts over.
        let (sandbox, pod_ips) = if terminal {
            // A finished pod gives its sandbox and address back at once
            // (its containers' records stay for its status and logs).
            self.stop_all(&containers, Duration::ZERO).await;
            if let Err(error) = self.ctx.runtime.remove_sandbox(&self.uid).await {
                tracing::warn!(%error, pod = %self.uid, "removing a finished pod's sandbox");
            }
            self.ctx.network.remove_sandbox(&self.uid).await?;
            (None, ips_in_status(pod))
        } else {
            let (netns, ips) = if host_network {
                (None, self.ctx.me.ips())
            } else {
                match self.ctx.network.existing(&self.uid) {
                    Some(sandbox) => (Some(sandbox.netns_path()), sandbox.ips()),
                    None => {
                        self.stop_all(&containers, Duration::ZERO).await;
                        let made = self.ctx.network.create_sandbox(&self.uid).await?;
                        (Some(made.netns_path()), made.ips())
                    }
                }
            };
            let hostname = crate::files::hostname(pod);
            let sandbox = self
                .ctx
                .runtime
                .run_sandbox(&self.uid, &hostname, netns)
                .await?;
            (Some(sandbox), ips)
        };
        let pod_ip = pod_ips.first().cloned();
        // Host ports forward to the pod's IPv4 address (on an IPv6-first
        // node its second).
        let ipv4 = pod_ips
            .iter()
            .find_map(|ip| ip.parse::<std::net::Ipv4Addr>().ok());
        let mappings = match (&sandbox, ipv4) {
            (Some(_), Some(ip)) => crate::host_ports::of(pod, ip),
            _ => Vec::new(),
        };
        self.ctx.host_ports.set(&self.uid, mappings).await;
        if let (Some(sandbox), Some(ip)) = (&sandbox, &pod_ip) {
            let files = self.ctx.write_pod_files(pod, &pod_ips).await?;
            // One reading of the objects per sync: configuration volumes
            // are brought up to date even while everything runs.
            let objects = Objects::read(self.ctx.client.as_ref(), pod, &self.ctx.tokens).await?;
            let pod_dir = self.ctx.pod_dir(&self.uid);
            match crate::volumes::set_up(&pod_dir, pod, &objects) {
                Ok(volumes) => {
                    self.mount_error = None;
                    let place = Place {
                        sandbox,
                        files: &files,
                        pod_ip: ip,
                        pod_ips: &pod_ips,
                        objects: &objects,
                        volumes: &volumes,
                    };
                    self.run_containers(pod, &place, &mut containers).await;
                }
                // Nothing new starts until its volumes are there (the
                // pod stays ContainerCreating, as with the kubelet).
                Err(error) => {
                    let message = error.to_string();
                    if self.mount_error.as_ref() != Some(&message) {
                        self.ctx
                            .event(pod, None, "Warning", "FailedMount", &message)
                            .await;
                        self.mount_error = Some(message);
                    }
                }
            }
        }
        self.prune(&containers).await;
        let containers = self.mine();
        let status = self.status_now(pod, &containers, sandbox.is_some(), pod_ips, None);
        let all_running = status
            .container_statuses
            .iter()
            .flatten()
            .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
        if all_running && !self.start_observed {
            self.start_observed = true;
            if let Some(created) = pod.metadata.creation_timestamp.as_ref() {
                let since = (jiff::Timestamp::now() - created.0)
                    .total(jiff::Unit::Second)
                    .unwrap_or(0.0);
                self.ctx
                    .metrics
                    .pod_started((since - self.pulling.as_secs_f64()).max(0.0));
            }
        }
        self.ctx.status.set(pod, status).await?;
        Ok(())
    }

    /// Runs the init containers in order (each must succeed before the
    /// next; sidecars, `restartPolicy: Always`, must be running), then
    /// starts what is missing and restarts what ended, per restart policy.
    async fn run_containers(
        &mut self,
        pod: &Arc<Pod>,
        place: &Place<'_>,
        containers: &mut Vec<ContainerStatus>,
    ) {
        let spec = pod.spec.clone().unwrap_or_default();
        let policy = spec.restart_policy.as_deref().unwrap_or("Always");
        for init in spec.init_containers.iter().flatten() {
            let sidecar = init.restart_policy.as_deref() == Some("Always");
            // A failed init container is retried unless the pod never restarts.
            let own_policy = match (sidecar, policy) {
                (true, _) => "Always",
                (false, "Never") => "Never",
                (false, _) => "OnFailure",
            };
            let step = self.step(pod, init, own_policy, place, containers).await;
            // Once the app containers have started, a sidecar restarting
            // does not hold them back.
            let app_started = containers
                .iter()
                .any(|c| spec.containers.iter().any(|app| app.name == c.meta.name));
            let done = match step {
                Step::Running => sidecar,
                Step::Succeeded => !sidecar,
                Step::Waiting | Step::Failed => sidecar && app_started,
            };
            if !done {
                *containers = self.mine();
                return;
            }
        }
        for container in &spec.containers {
            self.step(pod, container, policy, place, containers).await;
        }
        *containers = self.mine();
    }

    /// One container: started when missing, restarted when it ended and
    /// the policy says so (with back-off), killed when a liveness or
    /// startup probe failed. Where it stands afterwards.
    async fn step(
        &mut self,
        pod: &Arc<Pod>,
        container: &k8s_openapi::api::core::v1::Container,
        policy: &str,
        place: &Place<'_>,
        containers: &[ContainerStatus],
    ) -> Step {
        let name = container.name.as_str();
        let latest = containers
            .iter()
            .filter(|c| c.meta.name == name)
            .max_by_key(|c| c.meta.attempt);
        let now = Instant::now();
        let attempt = match latest.map(|c| &c.state) {
            None => 0,
            Some(State::Created) => return Step::Waiting,
            Some(State::Running(started)) => {
                self.waiting.remove(name);
                let id = latest.map(|c| c.id.clone()).unwrap_or_default();
                // A pod's containers may change only their image: a running
                // one with another image is made again, whatever the
                // restart policy (the kubelet's "definition changed").
                let image = container.image.as_deref().unwrap_or_default();
                if latest.is_some_and(|c| c.meta.image != image) {
                    let message = format!("Container {name} definition changed, will be restarted");
                    self.kill(pod, name, &id, ("Normal", "Killing"), &message)
                        .await;
                    self.ctx.prober.forget(&id);
                    // Made again at once, so no status shows the pod ended
                    // in between (with `restartPolicy: Never` it would
                    // stay ended); should the start fail, the next sync
                    // still makes it.
                    self.redefined.insert(name.to_owned());
                    self.backoff.reset(name);
                    latest.map_or(0, |c| c.meta.attempt + 1)
                } else {
                    self.ctx.prober.ensure(pod, container, &id, place.pod_ip);
                    if let Some(kind) = self.ctx.prober.verdict(container, &id).failed {
                        // Restarted as its restart policy says, like any end.
                        let what = if kind == crate::probe_results::Kind::Startup {
                            "startup"
                        } else {
                            "liveness"
                        };
                        let message =
                            format!("Container {name} failed {what} probe, will be restarted");
                        self.kill(pod, name, &id, ("Normal", "Killing"), &message)
                            .await;
                        self.ctx.prober.forget(&id);
                        return Step::Waiting;
                    }
                    let ran = started
                        .started_at
                        .parse::<jiff::Timestamp>()
                        .ok()
                        .and_then(|t| (jiff::Timestamp::now() - t).try_into().ok());
                    if ran.is_some_and(|d: std::time::Duration| d >= crate::backoff::RESET_AFTER) {
                        self.backoff.reset(name);
                    }
                    return Step::Running;
                }
            }
            Some(State::Exited { exit, .. }) => {
                if let Some(ended) = latest {
                    self.ctx.prober.forget(&ended.id);
                }
                let redefined = self.redefined.remove(name);
                let restart = redefined
                    || match policy {
                        "Never" => false,
                        "OnFailure" => exit.exit_code != 0,
                        _ => true,
                    };
                if redefined {
                    self.backoff.reset(name);
                }
                if !restart {
                    self.waiting.remove(name);
                    return if exit.exit_code == 0 {
                        Step::Succeeded
                    } else {
                        Step::Failed
                    };
                }
                if self.backoff.remaining(name, now).is_some() {
                    self.back_off(pod, name).await;
                    return Step::Waiting;
                }
                self.backoff.fail(name, now);
                latest.map_or(0, |c| c.meta.attempt + 1)
            }
        };
        let started =
            start::start(&self.ctx, &mut self.backoff, pod, container, place, attempt).await;
        match started {
            Ok((pulling, id)) => {
                self.pulling += pulling;
                self.waiting.remove(name);
                self.redefined.remove(name);
                if self.post_start(pod, container, &id, place.pod_ip).await {
                    Step::Running
                } else {
                    Step::Waiting
                }
            }
            Err(StartFailure::Waiting(waiting)) => {
                self.waiting.insert(name.to_owned(), waiting);
                Step::Waiting
            }
        }
    }

    /// Runs the container's postStart hook, if it has one; a failed hook
    /// kills the container (restarted as its policy says). Whether it runs.
    async fn post_start(
        &self,
        pod: &Pod,
        container: &k8s_openapi::api::core::v1::Container,
        id: &str,
        pod_ip: &str,
    ) -> bool {
        let Some(hook) = container
            .lifecycle
            .as_ref()
            .and_then(|l| l.post_start.as_ref())
        else {
            return true;
        };
        let runtime = &*self.ctx.runtime;
        let outcome =
            crate::actions::run_hook(runtime, id, hook, container, pod_ip, self.grace()).await;
        let Err(error) = outcome else {
            return true;
        };
        let message = format!("PostStartHook failed: {error}");
        let event = ("Warning", "FailedPostStartHook");
        self.kill(pod, &container.name, id, event, &message).await;
        false
    }

    /// Stops a container for a reason the pod's Events say (it is then
    /// restarted as its restart policy says, like any end).
    async fn kill(&self, pod: &Pod, name: &str, id: &str, event: (&str, &str), message: &str) {
        let (kind, reason) = event;
        self.ctx.event(pod, Some(name), kind, reason, message).await;
        if let Err(error) = self
            .ctx
            .runtime
            .stop_container(id, None, self.grace())
            .await
        {
            tracing::warn!(%error, container = %id, reason, "stopping a container");
        }
    }

    /// Says why a container waits to be restarted (CrashLoopBackOff).
    async fn back_off(&mut self, pod: &Pod, name: &str) {
        let delay = self.backoff.delay(name).unwrap_or_default();
        let message = format!(
            "back-off {} restarting failed container={name} pod={}",
            humanize(delay),
            crate::pods::describe(pod)
        );
        if self.waiting.get(name).map(|w| w.reason.as_str()) != Some("CrashLoopBackOff") {
            let text = format!(
                "Back-off restarting failed container {name} in pod {}",
                crate::pods::describe(pod)
            );
            self.ctx
                .event(pod, Some(name), "Warning", "BackOff", &text)
                .await;
        }
        self.waiting.insert(
            name.to_owned(),
            Waiting {
                reason: "CrashLoopBackOff".into(),
                message,
            },
        );
    }

    /// The pod's status from what runs now (probes included).
    fn status_now(
        &self,
        pod: &Pod,
        containers: &[ContainerStatus],
        sandbox_ready: bool,
        pod_ips: Vec<String>,
        ended: Option<(String, String)>,
    ) -> k8s_openapi::api::core::v1::PodStatus {
        let start_time = pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map_or_else(jiff::Timestamp::now, |t| t.0);
        status::compute(&Observed {
            pod,
            containers,
            waiting: &self.waiting,
            verdicts: &self.verdicts(pod, containers),
            sandbox_ready,
            pod_ips,
            host_ips: self.ctx.me.ips(),
            start_time,
            ended,
        })
    }

    /// What the probes say of each running container instance.
    fn verdicts(
        &self,
        pod: &Pod,
        containers: &[ContainerStatus],
    ) -> HashMap<String, crate::probe_results::Verdict> {
        let specs: Vec<&k8s_openapi::api::core::v1::Container> =
            crate::pods::containers_of(pod).collect();
        containers
            .iter()
            .filter_map(|c| {
                let spec = specs.iter().find(|s| s.name == c.meta.name)?;
                Some((c.id.clone(), self.ctx.prober.verdict(spec, &c.id)))
            })
            .collect()
    }

    /// Keeps the newest two instances of each container (the current one
    /// and the one `lastState`/`logs --previous` show); removes the rest.
    async fn prune(&self, containers: &[ContainerStatus]) {
        let mut by_name: HashMap<&str, Vec<&ContainerStatus>> = HashMap::new();
        for c in containers {
            by_name.entry(c.meta.name.as_str()).or_default().push(c);
        }
        for (_, mut list) in by_name {
            list.sort_by_key(|c| std::cmp::Reverse(c.meta.attempt));
            for old in list.iter().skip(2) {
                if matches!(old.state, State::Exited { .. }) {
                    self.ctx.prober.forget(&old.id);
                    if let Err(error) = self.ctx.runtime.remove_container(&old.id).await {
                        tracing::warn!(%error, container = %old.id, "removing an old container failed");
                    }
                    let _ = std::fs::remove_file(&old.meta.log_path);
                }
            }
        }
    }
}

/// The addresses a pod's status gives (`podIPs`, else `podIP`).
fn ips_in_status(pod: &Pod) -> Vec<String> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    match &status.pod_ips {
        Some(ips) if !ips.is_empty() => ips.iter().map(|ip| ip.ip.clone()).collect(),
        _ => status.pod_ip.iter().cloned().collect(),
    }
}

/// Where one container stands after a step of its worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Running,
    /// Ended with 0 and stays ended.
    Succeeded,
    /// Ended otherwise and stays ended.
    Failed,
    /// Starting, backing off, or failed to start.
    Waiting,
}

/// Forgets a worker that panicked, so the next event starts a new one
/// instead of waking a dead task.
struct Unregister<R: Runtime> {
    ctx: Arc<Context<R>>,
    uid: String,
}

impl<R: Runtime> Drop for Unregister<R> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.ctx.workers.lock().remove(&self.uid);
            self.ctx
                .terminating
                .lock()
                .retain(|_, uid| *uid != self.uid);
        }
    }
}

/// `10s`, `1m20s`, `5m0s`, as Go prints durations in these messages.
fn humanize(delay: Duration) -> String {
    let seconds = delay.as_secs();
    if seconds < 60 {
        format!("{seconds}s")
    } else {
        format!("{}m{}s", seconds / 60, seconds % 60)
    }
}
