//! Stopping a pod's containers and finishing its deletion: the grace
//! period, preStop hooks and stop signals, the final status, the grace-0
//! delete with a UID precondition, and the clean-up of everything the
//! worker made.

use super::*;

impl<R: Runtime> Worker<R> {
    pub(super) async fn stop_all(&self, containers: &[ContainerStatus], grace: Duration) {
        for container in containers {
            self.ctx.prober.forget(&container.id);
        }
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
    pub(super) fn grace(&self) -> Duration {
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
    pub(super) async fn stop_gracefully(&self, grace: Duration) {
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

    pub(super) async fn stop_one(&self, pod: &Pod, container: &ContainerStatus, grace: Duration) {
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
        let spec = crate::pods::containers_of(pod).find(|c| &c.name == name);
        if let Some((spec, hook)) =
            spec.and_then(|c| c.lifecycle.as_ref()?.pre_stop.as_ref().map(|h| (c, h)))
        {
            let pod_ip = pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .unwrap_or_default();
            let runtime = &*self.ctx.runtime;
            let outcome =
                crate::actions::run_hook(runtime, &container.id, hook, spec, &pod_ip, grace).await;
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
    pub(super) async fn finish_deletion(&mut self, pod: &Arc<Pod>) -> bool {
        // Confirmed before but still there (held by a finalizer): its final
        // status stays as written; only the confirmation is repeated.
        if self.ctx.confirmed.lock().contains(&self.uid) {
            return self.confirm_deletion(pod).await;
        }
        self.stop_gracefully(self.grace()).await;
        let containers = self.mine();
        let pod_ips = self
            .ctx
            .network
            .existing(&self.uid)
            .map(|s| s.ips())
            .unwrap_or_default();
        let status = self.status_now(pod, &containers, false, pod_ips, None);
        if let Err(error) = self.ctx.status.set(pod, status).await {
            tracing::debug!(%error, pod = %crate::pods::describe(pod), "final status");
        }
        let confirmed = self.confirm_deletion(pod).await;
        if confirmed {
            self.ctx.confirmed.lock().insert(self.uid.clone());
        }
        confirmed
    }

    /// Deletes the pod for good (grace 0, this pod's UID only); whether
    /// that is done.
    pub(super) async fn confirm_deletion(&self, pod: &Pod) -> bool {
        let Some(client) = &self.ctx.client else {
            return true;
        };
        let api = kube::Api::<Pod>::namespaced(
            client.clone(),
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
                tracing::warn!(%error, pod = %crate::pods::describe(pod), "confirming the deletion failed; retrying");
                false
            }
        }
    }

    /// The pod is no longer wanted: stop within its grace period, then
    /// remove everything that was made for it.
    pub(super) async fn terminate(&mut self) {
        self.ctx.host_ports.set(&self.uid, Vec::new()).await;
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
            self.ctx.prober.forget(&c.id);
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
