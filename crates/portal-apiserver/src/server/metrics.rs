//! Prometheus metrics of the API server and its store, with the upstream
//! names where the meaning is the same.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    pub verb: &'static str,
    pub resource: String,
    pub code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LatencyLabels {
    pub verb: &'static str,
    pub resource: String,
}

/// Metrics of another component served on the same `/metrics`.
type Source = Box<dyn Fn(&mut String) + Send + Sync>;

/// A health check of another component: its name when unhealthy.
type Check = Box<dyn Fn() -> Option<&'static str> + Send + Sync>;

pub struct Metrics {
    registry: Registry,
    /// Other components in this process (DNS, proxy) add theirs.
    sources: parking_lot::Mutex<Vec<Source>>,
    /// Health of other components in this process, for `/healthz`.
    checks: parking_lot::Mutex<Vec<Check>>,
    requests: Family<RequestLabels, Counter>,
    latency: Family<LatencyLabels, Histogram>,
    commit_latency: Histogram,
    commit_batch: Histogram,
    refused_connections: Counter,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<LatencyLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0001, 2.0, 18))
        });
        let commit_latency = Histogram::new(exponential_buckets(0.00005, 2.0, 18));
        let commit_batch = Histogram::new(exponential_buckets(1.0, 2.0, 12));
        registry.register(
            "apiserver_request",
            "API requests by verb, resource and HTTP code",
            requests.clone(),
        );
        registry.register(
            "apiserver_request_duration_seconds",
            "API request latency by verb and resource (watches: time to start streaming)",
            latency.clone(),
        );
        registry.register(
            "portal_store_commit_duration_seconds",
            "Time of one group commit of the embedded store, fsync included",
            commit_latency.clone(),
        );
        registry.register(
            "portal_store_commit_batch_size",
            "Transactions made durable by one group commit",
            commit_batch.clone(),
        );
        let refused_connections = Counter::default();
        registry.register(
            "portal_apiserver_refused_connections",
            "Connections closed at once because the server had its maximum",
            refused_connections.clone(),
        );
        Metrics {
            registry,
            refused_connections,
            sources: parking_lot::Mutex::default(),
            checks: parking_lot::Mutex::default(),
            requests,
            latency,
            commit_latency,
            commit_batch,
        }
    }

    pub fn observe_request(&self, verb: &'static str, resource: &str, code: u16, took: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                verb,
                resource: resource.to_owned(),
                code,
            })
            .inc();
        self.latency
            .get_or_create(&LatencyLabels {
                verb,
                resource: resource.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    pub(crate) fn refused_connection(&self) {
        self.refused_connections.inc();
    }

    pub fn observe_commit(&self, transactions: usize, took: Duration) {
        self.commit_latency.observe(took.as_secs_f64());
        self.commit_batch.observe(transactions as f64);
    }

    /// Serves another component's metrics on this `/metrics` too:
    /// `source` appends its families (text format, no `# EOF`).
    pub fn add_source(&self, source: impl Fn(&mut String) + Send + Sync + 'static) {
        self.sources.lock().push(Box::new(source));
    }

    /// `/healthz` fails while `healthy` says no, naming `component`.
    pub fn add_health_check(
        &self,
        component: &'static str,
        healthy: impl Fn() -> bool + Send + Sync + 'static,
    ) {
        self.checks
            .lock()
            .push(Box::new(move || (!healthy()).then_some(component)));
    }

    /// The components that are unhealthy now.
    pub fn unhealthy(&self) -> Vec<&'static str> {
        self.checks
            .lock()
            .iter()
            .filter_map(|check| check())
            .collect()
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        use prometheus_client::encoding::text;
        let mut out = String::new();
        if text::encode_registry(&mut out, &self.registry).is_err() {
            tracing::error!("metrics encoding failed");
        }
        for source in self.sources.lock().iter() {
            source(&mut out);
        }
        let _ = text::encode_eof(&mut out);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
