//! The proxy's metrics, with kube-proxy's names and meanings (SPEC O4),
//! and the health rule kube-proxy's `/healthz` uses: unhealthy when a
//! change has waited, or the last sync is older, than twice the sync period.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::time::Instant;

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub(crate) sync: Histogram,
    pub(crate) sync_full: Histogram,
    pub(crate) sync_partial: Histogram,
    pub(crate) programming: Histogram,
    pub(crate) last_sync: Gauge<f64, AtomicU64>,
    pub(crate) last_queued: Gauge<f64, AtomicU64>,
    pub(crate) service_changes_pending: Gauge,
    pub(crate) endpoint_changes_pending: Gauge,
    pub(crate) service_changes: Counter,
    pub(crate) endpoint_changes: Counter,
    pub(crate) failures: Counter,
    health: Mutex<Health>,
    health_timeout: Duration,
}

#[derive(Debug)]
struct Health {
    started: Instant,
    last_sync: Option<Instant>,
    /// The oldest change not synced yet.
    queued: Option<Instant>,
}

fn seconds_buckets() -> impl Iterator<Item = f64> {
    // 1 ms … 33 s.
    exponential_buckets(0.001, 2.0, 16)
}

impl Metrics {
    pub(crate) fn new(sync_period: Duration) -> Self {
        let mut registry = Registry::default();
        let histogram = || Histogram::new(seconds_buckets());
        let (sync, sync_full, sync_partial, programming) =
            (histogram(), histogram(), histogram(), histogram());
        registry.register(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            sync.clone(),
        );
        registry.register(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            sync_full.clone(),
        );
        registry.register(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            sync_partial.clone(),
        );
        registry.register(
            "kubeproxy_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds (from the EndpointSlice trigger time to rules in place)",
            programming.clone(),
        );
        let last_sync = Gauge::<f64, AtomicU64>::default();
        let last_queued = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            last_sync.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            last_queued.clone(),
        );
        let (service_changes_pending, endpoint_changes_pending) =
            (Gauge::default(), Gauge::default());
        registry.register(
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "Pending proxy rules Service changes",
            service_changes_pending.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "Pending proxy rules Endpoint changes",
            endpoint_changes_pending.clone(),
        );
        let (service_changes, endpoint_changes, failures) =
            (Counter::default(), Counter::default(), Counter::default());
        registry.register(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes",
            service_changes.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes",
            endpoint_changes.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_nftables_sync_failures",
            "Failed proxy rule syncs (nftables or listeners)",
            failures.clone(),
        );
        Self {
            registry,
            sync,
            sync_full,
            sync_partial,
            programming,
            last_sync,
            last_queued,
            service_changes_pending,
            endpoint_changes_pending,
            service_changes,
            endpoint_changes,
            failures,
            health: Mutex::new(Health {
                started: Instant::now(),
                last_sync: None,
                queued: None,
            }),
            health_timeout: sync_period * 2,
        }
    }

    pub(crate) fn queued(&self) {
        let mut health = self.health.lock();
        health.queued.get_or_insert_with(Instant::now);
        self.last_queued.set(unix_now());
    }

    pub(crate) fn synced(&self, started: Instant) {
        let mut health = self.health.lock();
        health.last_sync = Some(Instant::now());
        if health.queued.is_some_and(|q| q <= started) {
            health.queued = None;
        }
        self.last_sync.set(unix_now());
    }

    /// kube-proxy's rule: a change waiting, or no sync, for longer than
    /// twice the sync period means syncs have stopped.
    pub fn healthy(&self) -> bool {
        let health = self.health.lock();
        let now = Instant::now();
        let waited_too_long = health.queued.is_some_and(|q| now - q > self.health_timeout);
        let last = health.last_sync.unwrap_or(health.started);
        !waited_too_long && now - last <= self.health_timeout
    }

    pub fn encode_into(&self, out: &mut String) {
        let _ = prometheus_client::encoding::text::encode_registry(out, &self.registry);
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        self.encode_into(&mut out);
        let _ = prometheus_client::encoding::text::encode_eof(&mut out);
        out
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Metrics {
    pub(crate) fn observe_sync(&self, took: Duration, full: bool) {
        self.sync.observe(took.as_secs_f64());
        if full {
            self.sync_full.observe(took.as_secs_f64());
        } else {
            self.sync_partial.observe(took.as_secs_f64());
        }
    }

    pub(crate) fn observe_programming(&self, triggers: &[jiff::Timestamp]) {
        let now = jiff::Timestamp::now();
        for trigger in triggers {
            if let Ok(took) = Duration::try_from(now.duration_since(*trigger)) {
                self.programming.observe(took.as_secs_f64());
            }
        }
    }

    pub(crate) fn set_pending(&self, (services, endpoints): (u64, u64)) {
        self.service_changes_pending
            .set(i64::try_from(services).unwrap_or(i64::MAX));
        self.endpoint_changes_pending
            .set(i64::try_from(endpoints).unwrap_or(i64::MAX));
    }
}
