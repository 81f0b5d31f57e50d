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

use super::start::{self, StartFailure};
use super::Context;
use crate::backoff::Backoff;
use crate::runtime::{ContainerStatus, Runtime, SandboxPaths, State};
use crate::status::{self, Observed, Waiting};

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
                Some(pod) => {
                    self.last = Some(pod.clone());
                    if let Err(error) = self.sync(&pod).await {
                        tracing::warn!(%error, pod = %super::describe(&pod), "pod sync failed");
                    }
                }
                None => {
                    self.terminate().await;
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

    fn mine(&self) -> Vec<ContainerStatus> {
        self.ctx
            .runtime
            .containers()
            .into_iter()
            .filter(|c| c.meta.pod_uid == self.uid)
            .collect()
    }

    async fn sync(&mut self, pod: &Arc<Pod>) -> Result<(), super::SyncError> {
        let spec = pod.spec.clone().unwrap_or_default();
        let host_network = spec.host_network == Some(true);
        let mut containers = self.mine();
        let terminal = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed");
        // Sandbox: a pod whose network namespace vanished (a reboot) starts over.
        let (sandbox, pod_ip) = if terminal {
            // A finished pod gives its sandbox and address back at once
            // (its containers' records stay for its status and logs).
            self.stop_all(&containers, Duration::ZERO).await;
            if let Err(error) = self.ctx.runtime.remove_sandbox(&self.uid).await {
                tracing::warn!(%error, pod = %self.uid, "removing a finished pod's sandbox");
            }
            self.ctx.network.remove_sandbox(&self.uid).await?;
            (None, pod.status.as_ref().and_then(|s| s.pod_ip.clone()))
        } else {
            let (netns, ip) = if host_network {
                (None, self.ctx.me.ip.to_string())
            } else {
                match self.ctx.network.existing(&self.uid) {
                    Some(sandbox) => (Some(sandbox.netns_path()), sandbox.ip.to_string()),
                    None => {
                        self.stop_all(&containers, Duration::ZERO).await;
                        let made = self.ctx.network.create_sandbox(&self.uid).await?;
                        (Some(made.netns_path()), made.ip.to_string())
                    }
                }
            };
            let hostname = crate::files::hostname(pod);
            let sandbox = self
                .ctx
                .runtime
                .run_sandbox(&self.uid, &hostname, netns)
                .await?;
            (Some(sandbox), Some(ip))
        };
        if let (Some(sandbox), Some(ip)) = (&sandbox, &pod_ip) {
            let files = self.ctx.write_pod_files(pod, ip).await?;
            self.run_containers(pod, sandbox, &files, ip, &mut containers)
                .await;
        }
        self.prune(&containers).await;
        let containers = self.mine();
        let start_time = pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map_or_else(jiff::Timestamp::now, |t| t.0);
        let status = status::compute(&Observed {
            pod,
            containers: &containers,
            waiting: &self.waiting,
            sandbox_ready: sandbox.is_some(),
            pod_ip,
            host_ip: self.ctx.me.ip.to_string(),
            start_time,
        });
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

    /// Starts what is missing and restarts what ended, per restart policy.
    async fn run_containers(
        &mut self,
        pod: &Arc<Pod>,
        sandbox: &SandboxPaths,
        files: &super::PodFiles,
        pod_ip: &str,
        containers: &mut Vec<ContainerStatus>,
    ) {
        let spec = pod.spec.clone().unwrap_or_default();
        let policy = spec.restart_policy.as_deref().unwrap_or("Always");
        for container in &spec.containers {
            let name = container.name.as_str();
            let latest = containers
                .iter()
                .filter(|c| c.meta.name == name)
                .max_by_key(|c| c.meta.attempt);
            let now = Instant::now();
            let attempt = match latest.map(|c| &c.state) {
                None => 0,
                Some(State::Created) => continue,
                Some(State::Running(started)) => {
                    self.waiting.remove(name);
                    let ran = started
                        .started_at
                        .parse::<jiff::Timestamp>()
                        .ok()
                        .and_then(|t| (jiff::Timestamp::now() - t).try_into().ok());
                    if ran.is_some_and(|d: std::time::Duration| d >= crate::backoff::RESET_AFTER) {
                        self.backoff.reset(name);
                    }
                    continue;
                }
                Some(State::Exited { exit, .. }) => {
                    let restart = match policy {
                        "Never" => false,
                        "OnFailure" => exit.exit_code != 0,
                        _ => true,
                    };
                    if !restart {
                        self.waiting.remove(name);
                        continue;
                    }
                    if self.backoff.remaining(name, now).is_some() {
                        let delay = self.backoff.delay(name).unwrap_or_default();
                        let message = format!(
                            "back-off {} restarting failed container={name} pod={}",
                            humanize(delay),
                            super::describe(pod)
                        );
                        if self.waiting.get(name).map(|w| w.reason.as_str())
                            != Some("CrashLoopBackOff")
                        {
                            self.ctx
                                .event(
                                    pod,
                                    Some(name),
                                    "Warning",
                                    "BackOff",
                                    &format!(
                                        "Back-off restarting failed container {name} in pod {}",
                                        super::describe(pod)
                                    ),
                                )
                                .await;
                        }
                        self.waiting.insert(
                            name.to_owned(),
                            Waiting {
                                reason: "CrashLoopBackOff".into(),
                                message,
                            },
                        );
                        continue;
                    }
                    self.backoff.fail(name, now);
                    latest.map_or(0, |c| c.meta.attempt + 1)
                }
            };
            match start::start(
                &self.ctx,
                &mut self.backoff,
                pod,
                container,
                sandbox,
                files,
                pod_ip,
                attempt,
            )
            .await
            {
                Ok(pulling) => {
                    self.pulling += pulling;
                    self.waiting.remove(name);
                }
                Err(StartFailure::Waiting(waiting)) => {
                    self.waiting.insert(name.to_owned(), waiting);
                }
            }
        }
        *containers = self.mine();
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
                    if let Err(error) = self.ctx.runtime.remove_container(&old.id).await {
                        tracing::warn!(%error, container = %old.id, "removing an old container failed");
                    }
                    let _ = std::fs::remove_file(&old.meta.log_path);
                }
            }
        }
    }

    async fn stop_all(&self, containers: &[ContainerStatus], grace: Duration) {
        let stops = containers
            .iter()
            .filter(|c| !matches!(c.state, State::Exited { .. }))
            .map(|c| self.ctx.runtime.stop_container(&c.id, None, grace));
        for result in futures_util::future::join_all(stops).await {
            if let Err(error) = result {
                tracing::warn!(%error, pod = %self.uid, "stopping a container failed");
            }
        }
    }

    /// The grace period the pod has to stop: what its deletion set, else
    /// its spec's.
    fn grace(&self) -> Duration {
        let pod = self.last.as_ref();
        let seconds = pod
            .and_then(|p| p.metadata.deletion_grace_period_seconds)
            .or_else(|| {
                pod.and_then(|p| p.spec.as_ref())
                    .and_then(|s| s.termination_grace_period_seconds)
            })
            .unwrap_or(DEFAULT_GRACE)
            .max(0);
        Duration::from_secs(seconds.unsigned_abs())
    }

    /// Stops every running container within `grace`, all at once: the
    /// preStop hook, then the stop signal, then SIGKILL when time is up.
    async fn stop_gracefully(&self, grace: Duration) {
        let Some(pod) = self.last.clone() else {
            self.stop_all(&self.mine(), Duration::ZERO).await;
            return;
        };
        let running: Vec<ContainerStatus> = self
            .mine()
            .into_iter()
            .filter(|c| !matches!(c.state, State::Exited { .. }))
            .collect();
        let stops = running.iter().map(|c| self.stop_one(&pod, c, grace));
        futures_util::future::join_all(stops).await;
    }

    async fn stop_one(&self, pod: &Pod, container: &ContainerStatus, grace: Duration) {
        let name = &container.meta.name;
        self.ctx
            .event(
                pod,
                Some(name),
                "Normal",
                "Killing",
                &format!("Stopping container {name}"),
            )
            .await;
        let began = Instant::now();
        let spec = pod
            .spec
            .iter()
            .flat_map(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
            })
            .find(|c| &c.name == name);
        if let Some((spec, hook)) =
            spec.and_then(|c| c.lifecycle.as_ref()?.pre_stop.as_ref().map(|h| (c, h)))
        {
            let pod_ip = pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .unwrap_or_default();
            let action = crate::actions::from_parts(
                hook.exec.as_ref(),
                hook.http_get.as_ref(),
                hook.tcp_socket.as_ref(),
                hook.sleep.as_ref().map(|s| s.seconds),
                spec,
                &pod_ip,
            );
            let outcome = match action {
                Ok(action) => {
                    crate::actions::run(&self.ctx.runtime, &container.id, &action, grace).await
                }
                Err(error) => Err(error),
            };
            if let Err(error) = outcome {
                let message = format!("PreStopHook failed: {error}");
                self.ctx
                    .event(pod, Some(name), "Warning", "FailedPreStopHook", &message)
                    .await;
            }
        }
        // The kubelet leaves at least 2 s between the stop signal and SIGKILL.
        let left = grace
            .saturating_sub(began.elapsed())
            .max(Duration::from_secs(2).min(grace));
        if let Err(error) = self
            .ctx
            .runtime
            .stop_container(&container.id, None, left)
            .await
        {
            tracing::warn!(%error, container = %container.id, "stopping a container failed");
        }
    }

    /// A pod deleted through the API: stop it, report how its containers
    /// ended, then delete it for good (grace 0, this pod's UID only).
    /// Whether it is gone.
    async fn finish_deletion(&mut self, pod: &Arc<Pod>) -> bool {
        self.stop_gracefully(self.grace()).await;
        let containers = self.mine();
        let pod_ip = self
            .ctx
            .network
            .existing(&self.uid)
            .map(|s| s.ip.to_string());
        let start_time = pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map_or_else(jiff::Timestamp::now, |t| t.0);
        let status = status::compute(&Observed {
            pod,
            containers: &containers,
            waiting: &HashMap::new(),
            sandbox_ready: false,
            pod_ip,
            host_ip: self.ctx.me.ip.to_string(),
            start_time,
        });
        if let Err(error) = self.ctx.status.set(pod, status).await {
            tracing::debug!(%error, pod = %super::describe(pod), "final status");
        }
        let api = kube::Api::<Pod>::namespaced(
            self.ctx.client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or("default"),
        );
        let params = kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(kube::api::Preconditions {
                uid: Some(self.uid.clone()),
                resource_version: None,
            }),
            ..kube::api::DeleteParams::default()
        };
        match api
            .delete(pod.metadata.name.as_deref().unwrap_or_default(), &params)
            .await
        {
            Ok(_) => true,
            // Gone already, or the name now belongs to another pod.
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => true,
            Err(error) => {
                tracing::warn!(%error, pod = %super::describe(pod), "confirming the deletion failed; retrying");
                false
            }
        }
    }

    /// The pod is no longer wanted: stop within its grace period, then
    /// remove everything that was made for it.
    async fn terminate(&mut self) {
        self.stop_gracefully(self.grace()).await;
        let containers = self.mine();
        if containers.is_empty()
            && self.ctx.network.existing(&self.uid).is_none()
            && self.ctx.runtime.sandbox(&self.uid).is_none()
        {
            self.ctx.remove_pod_files(&self.uid, self.last.as_deref());
            self.ctx.status.forget(&self.uid);
            return;
        }
        for c in &containers {
            if let Err(error) = self.ctx.runtime.remove_container(&c.id).await {
                tracing::warn!(%error, container = %c.id, "removing a container failed");
            }
        }
        if let Err(error) = self.ctx.runtime.remove_sandbox(&self.uid).await {
            tracing::warn!(%error, pod = %self.uid, "removing the sandbox failed");
        }
        if let Err(error) = self.ctx.network.remove_sandbox(&self.uid).await {
            tracing::warn!(%error, pod = %self.uid, "removing the pod network failed");
        }
        self.ctx.remove_pod_files(&self.uid, self.last.as_deref());
        self.ctx.status.forget(&self.uid);
        tracing::info!(pod = %self.uid, "pod removed from the node");
    }
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
