//! Probes, as the kubelet's prober manager runs them: a task per running
//! container instance and probe kind (readiness, liveness, startup) that
//! runs the probe's action every `periodSeconds` after
//! `initialDelaySeconds`, turns `successThreshold`/`failureThreshold`
//! consecutive outcomes into a result, and wakes the pod's worker when a
//! result changes. Readiness and liveness wait for the startup probe to
//! succeed. The worker reads the results: readiness makes a container
//! ready, a liveness or startup failure has it restarted.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use parking_lot::Mutex;

use crate::actions;
use crate::events::Events;
use crate::probe_results::Outcome;
pub use crate::probe_results::{Kind, Verdict};
use crate::runtime::Runtime;
use crate::wake::PodWaker;

/// The probes of this agent's containers, by container instance id.
#[derive(Debug, Default)]
pub struct Probes {
    results: Mutex<HashMap<(String, Kind), Outcome>>,
    tasks: Mutex<HashMap<String, Vec<tokio::task::AbortHandle>>>,
}

/// Runs probes: what a probe task needs, and nothing of the pod workers
/// (a changed result wakes the pod's worker through its UID).
pub(crate) struct Prober<R: Runtime> {
    probes: Arc<Probes>,
    runtime: Arc<R>,
    events: Arc<Events>,
    waker: PodWaker,
}

impl<R: Runtime> Clone for Prober<R> {
    fn clone(&self) -> Self {
        Prober {
            probes: self.probes.clone(),
            runtime: self.runtime.clone(),
            events: self.events.clone(),
            waker: self.waker.clone(),
        }
    }
}

impl<R: Runtime> std::fmt::Debug for Prober<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prober")
            .field("probes", &self.probes)
            .finish_non_exhaustive()
    }
}

impl<R: Runtime> Prober<R> {
    pub(crate) fn new(runtime: Arc<R>, events: Arc<Events>, waker: PodWaker) -> Self {
        Prober {
            probes: Arc::default(),
            runtime,
            events,
            waker,
        }
    }

    /// Starts the probes of a running container instance (once).
    pub(crate) fn ensure(&self, pod: &Arc<Pod>, container: &Container, id: &str, pod_ip: &str) {
        let mut tasks = self.probes.tasks.lock();
        if tasks.contains_key(id) {
            return;
        }
        let mut handles = Vec::new();
        for kind in [Kind::Startup, Kind::Readiness, Kind::Liveness] {
            let Some(probe) = kind.of(container).cloned() else {
                continue;
            };
            let task = tokio::spawn(run(
                self.clone(),
                pod.clone(),
                container.clone(),
                id.to_owned(),
                pod_ip.to_owned(),
                kind,
                probe,
            ));
            handles.push(task.abort_handle());
        }
        tasks.insert(id.to_owned(), handles);
    }

    /// What the probes say of container instance `id` of `container`.
    pub(crate) fn verdict(&self, container: &Container, id: &str) -> Verdict {
        self.probes.verdict(container, id)
    }

    /// Stops the probes of an instance that ended or was removed.
    pub(crate) fn forget(&self, id: &str) {
        self.probes.forget(id);
    }
}

impl Probes {
    /// What the probes say of container instance `id` of `container`.
    pub(crate) fn verdict(&self, container: &Container, id: &str) -> Verdict {
        let results = self.results.lock();
        let result = |kind: Kind| results.get(&(id.to_owned(), kind)).copied();
        let started =
            container.startup_probe.is_none() || result(Kind::Startup) == Some(Outcome::Success);
        let ready = started
            && (container.readiness_probe.is_none()
                || result(Kind::Readiness) == Some(Outcome::Success));
        let failed = [Kind::Startup, Kind::Liveness]
            .into_iter()
            .find(|kind| result(*kind) == Some(Outcome::Failure));
        Verdict {
            started,
            ready,
            failed,
        }
    }

    /// Stops the probes of an instance that ended or was removed.
    pub(crate) fn forget(&self, id: &str) {
        if let Some(handles) = self.tasks.lock().remove(id) {
            for handle in handles {
                handle.abort();
            }
        }
        self.results.lock().retain(|(owner, _), _| owner != id);
    }

    fn set(&self, id: &str, kind: Kind, outcome: Outcome) -> bool {
        self.results.lock().insert((id.to_owned(), kind), outcome) != Some(outcome)
    }

    fn get(&self, id: &str, kind: Kind) -> Option<Outcome> {
        self.results.lock().get(&(id.to_owned(), kind)).copied()
    }
}

fn seconds(value: Option<i32>, default: u64) -> Duration {
    Duration::from_secs(
        value
            .and_then(|v| u64::try_from(v).ok())
            .filter(|v| *v > 0)
            .unwrap_or(default),
    )
}

async fn run<R: Runtime>(
    prober: Prober<R>,
    pod: Arc<Pod>,
    container: Container,
    id: String,
    pod_ip: String,
    kind: Kind,
    probe: Probe,
) {
    let period = seconds(probe.period_seconds, 10);
    let timeout = seconds(probe.timeout_seconds, 1);
    let needed_successes = probe.success_threshold.filter(|n| *n > 0).unwrap_or(1);
    let needed_failures = probe.failure_threshold.filter(|n| *n > 0).unwrap_or(3);
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let action = actions::from_parts(
        probe.exec.as_ref(),
        probe.http_get.as_ref(),
        probe.tcp_socket.as_ref(),
        None,
        &container,
        &pod_ip,
    );
    // Until it has run: not ready; alive (liveness has not failed).
    if kind == Kind::Liveness {
        prober.probes.set(&id, kind, Outcome::Success);
    }
    tokio::time::sleep(Duration::from_secs(
        probe
            .initial_delay_seconds
            .and_then(|d| u64::try_from(d).ok())
            .unwrap_or(0),
    ))
    .await;
    let (mut successes, mut failures) = (0, 0);
    loop {
        let waits_for_start = kind != Kind::Startup
            && container.startup_probe.is_some()
            && prober.probes.get(&id, Kind::Startup) != Some(Outcome::Success);
        if !waits_for_start {
            let outcome = match &action {
                Ok(action) => actions::run(&*prober.runtime, &id, action, timeout).await,
                Err(error) => Err(error.clone()),
            };
            match outcome {
                Ok(()) => {
                    (successes, failures) = (successes + 1, 0);
                    if successes >= needed_successes
                        && prober.probes.set(&id, kind, Outcome::Success)
                    {
                        prober.waker.wake(&uid);
                    }
                    // A startup probe is done once it succeeds.
                    if kind == Kind::Startup && successes >= needed_successes {
                        return;
                    }
                }
                Err(message) => {
                    (successes, failures) = (0, failures + 1);
                    let text = format!("{} probe failed: {message}", kind.label());
                    (prober.events)
                        .pod_event(&pod, Some(&container.name), "Warning", "Unhealthy", &text)
                        .await;
                    if failures >= needed_failures && prober.probes.set(&id, kind, Outcome::Failure)
                    {
                        prober.waker.wake(&uid);
                    }
                }
            }
        }
        tokio::time::sleep(period).await;
    }
}
