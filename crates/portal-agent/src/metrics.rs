//! The agent's metrics, with the kubelet's names where the meaning is the
//! same, and its health: unhealthy when the runtime has not been relisted
//! or the node lease not renewed for a minute.

use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::time::Instant;

/// Shared by the agent's parts; cheap to clone.
#[derive(Clone, Debug)]
pub struct Metrics {
    inner: std::sync::Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    registry: Registry,
    pod_start: Histogram,
    running_pods: Gauge,
    running_containers: Gauge,
    containers: Gauge,
    image_pulls: Counter,
    image_pull_failures: Counter,
    started_containers: Counter,
    /// Last relist and last lease renewal.
    beats: Mutex<(Instant, Instant)>,
}

const UNHEALTHY_AFTER: Duration = Duration::from_secs(60);

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        // 0.5 s … ~10 min, as the kubelet's SLI buckets span.
        let pod_start = Histogram::new(exponential_buckets(0.05, 2.0, 15));
        let (running_pods, running_containers, containers) =
            (Gauge::default(), Gauge::default(), Gauge::default());
        let (image_pulls, image_pull_failures, started_containers) =
            (Counter::default(), Counter::default(), Counter::default());
        registry.register(
            "kubelet_pod_start_sli_duration_seconds",
            "Duration in seconds to start a pod, excluding time to pull images, observed from the pod's creation to when all its containers are running",
            pod_start.clone(),
        );
        registry.register(
            "kubelet_running_pods",
            "Number of pods that have a running pod sandbox",
            running_pods.clone(),
        );
        registry.register(
            "kubelet_running_containers",
            "Number of containers currently running",
            running_containers.clone(),
        );
        registry.register(
            "portal_agent_containers",
            "Number of containers the runtime holds, running or not",
            containers.clone(),
        );
        registry.register(
            "portal_agent_image_pulls",
            "Image pulls completed",
            image_pulls.clone(),
        );
        registry.register(
            "portal_agent_image_pull_failures",
            "Image pulls that failed",
            image_pull_failures.clone(),
        );
        registry.register(
            "kubelet_started_containers",
            "Containers started",
            started_containers.clone(),
        );
        let now = Instant::now();
        Metrics {
            inner: std::sync::Arc::new(Inner {
                registry,
                pod_start,
                running_pods,
                running_containers,
                containers,
                image_pulls,
                image_pull_failures,
                started_containers,
                beats: Mutex::new((now, now)),
            }),
        }
    }

    pub(crate) fn pod_started(&self, seconds: f64) {
        self.inner.pod_start.observe(seconds);
    }

    pub(crate) fn set_pods(&self, running: usize) {
        self.inner
            .running_pods
            .set(i64::try_from(running).unwrap_or(i64::MAX));
        self.inner.beats.lock().0 = Instant::now();
    }

    pub(crate) fn set_containers(&self, running: usize, all: usize) {
        self.inner
            .running_containers
            .set(i64::try_from(running).unwrap_or(i64::MAX));
        self.inner
            .containers
            .set(i64::try_from(all).unwrap_or(i64::MAX));
    }

    pub(crate) fn image_pulled(&self, ok: bool) {
        if ok {
            self.inner.image_pulls.inc();
        } else {
            self.inner.image_pull_failures.inc();
        }
    }

    pub(crate) fn container_started(&self) {
        self.inner.started_containers.inc();
    }

    pub(crate) fn lease_renewed(&self) {
        self.inner.beats.lock().1 = Instant::now();
    }

    /// Whether the relist and the heartbeat are both recent.
    pub fn healthy(&self) -> bool {
        let (relist, lease) = *self.inner.beats.lock();
        relist.elapsed() < UNHEALTHY_AFTER && lease.elapsed() < UNHEALTHY_AFTER
    }

    pub fn encode_into(&self, out: &mut String) {
        let _ = prometheus_client::encoding::text::encode_registry(out, &self.inner.registry);
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        self.encode_into(&mut out);
        let _ = prometheus_client::encoding::text::encode_eof(&mut out);
        out
    }
}
