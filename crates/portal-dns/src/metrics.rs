//! The DNS server's Prometheus metrics: queries by type and response code,
//! answer latency, and programming latency (from an EndpointSlice's
//! trigger-time annotation to the moment the change is answerable).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::answer::Summary;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueryLabels {
    r#type: &'static str,
    rcode: &'static str,
}

/// Every query type and response code label, so the per-query counter is
/// picked from a table instead of hashing labels on every query.
const TYPES: [&str; 10] = [
    "A", "AAAA", "SRV", "PTR", "CNAME", "TXT", "SOA", "NS", "ANY", "other",
];
const RCODES: [&str; 9] = [
    "NOERROR",
    "NXDOMAIN",
    "REFUSED",
    "FORMERR",
    "SERVFAIL",
    "NOTIMP",
    "BADVERS",
    "forwarded",
    "other",
];

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// `TYPES × RCODES` counters of the `queries` family.
    counters: Vec<Counter>,
    latency: Histogram,
    programming: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let queries = Family::<QueryLabels, Counter>::default();
        let latency = Histogram::new(exponential_buckets(0.000_005, 2.0, 20));
        let programming = Histogram::new(exponential_buckets(0.000_5, 2.0, 16));
        registry.register(
            "portal_dns_queries",
            "DNS queries answered, by query type and response code (forwarded: sent upstream)",
            queries.clone(),
        );
        registry.register(
            "portal_dns_query_duration_seconds",
            "Time from receiving a query to sending its answer",
            latency.clone(),
        );
        registry.register(
            "dns_programming_duration_seconds",
            "Time from an EndpointSlice's last-change-trigger-time to the change being answerable",
            programming.clone(),
        );
        let counters = TYPES
            .iter()
            .flat_map(|t| RCODES.iter().map(move |r| (*t, *r)))
            .map(|(r#type, rcode)| {
                queries
                    .get_or_create(&QueryLabels { r#type, rcode })
                    .clone()
            })
            .collect();
        Metrics {
            registry,
            counters,
            latency,
            programming,
        }
    }

    pub(crate) fn query(&self, summary: Summary, took: Duration) {
        let position = |labels: &[&str], label: &str| {
            labels
                .iter()
                .position(|l| *l == label)
                .unwrap_or(labels.len() - 1)
        };
        let index =
            position(&TYPES, summary.query_type) * RCODES.len() + position(&RCODES, summary.rcode);
        if let Some(counter) = self.counters.get(index) {
            counter.inc();
        }
        self.latency.observe(took.as_secs_f64());
    }

    pub(crate) fn programmed(&self, took: Duration) {
        self.programming.observe(took.as_secs_f64());
    }

    /// Appends the families in the Prometheus text format, without the
    /// closing `# EOF` (for a `/metrics` shared with other components).
    pub fn encode_into(&self, out: &mut String) {
        if prometheus_client::encoding::text::encode_registry(out, &self.registry).is_err() {
            tracing::error!("metrics encoding failed");
        }
    }

    /// The Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        self.encode_into(&mut out);
        let _ = prometheus_client::encoding::text::encode_eof(&mut out);
        out
    }
}
