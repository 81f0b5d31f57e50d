//! The layer-7 proxy's metrics: requests by Ingress, backend and status
//! code, and their latency by Ingress (from the request's arrival to the
//! response's headers), plus the routing table's size.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// A label value made once per route or backend and shared by its
/// requests (no allocation per request).
pub(crate) type Label = std::sync::Arc<String>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    /// `namespace/name` of an Ingress, `httproute/namespace/name` of an
    /// HTTPRoute.
    pub(crate) ingress: Label,
    pub(crate) backend: Label,
    pub(crate) code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RouteLabels {
    pub(crate) ingress: Label,
}

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub(crate) requests: Family<RequestLabels, Counter>,
    pub(crate) latency: Family<RouteLabels, Histogram>,
    pub(crate) retries: Counter,
    pub(crate) ejections: Counter,
    pub(crate) mirrors_dropped: Counter,
    pub(crate) routes: Gauge,
    pub(crate) updates: Counter,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        // 0.5 ms … 16 s.
        let latency = Family::<RouteLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 16))
        });
        let (retries, routes, updates) = (Counter::default(), Gauge::default(), Counter::default());
        let (ejections, mirrors_dropped) = (Counter::default(), Counter::default());
        registry.register(
            "portal_ingress_requests",
            "Requests the layer-7 proxy answered, by Ingress (or httproute/namespace/name), backend and status code",
            requests.clone(),
        );
        registry.register(
            "portal_ingress_request_duration_seconds",
            "Time from a request's arrival to its response's headers, by Ingress (or httproute/namespace/name)",
            latency.clone(),
        );
        registry.register(
            "portal_ingress_connect_retries",
            "Requests sent to another endpoint after one refused the connection",
            retries.clone(),
        );
        registry.register(
            "portal_ingress_endpoint_ejections",
            "Endpoints left out for a while after a connection to them failed",
            ejections.clone(),
        );
        registry.register(
            "portal_ingress_mirrors_dropped",
            "Mirrored copies not sent because too many were in flight",
            mirrors_dropped.clone(),
        );
        registry.register(
            "portal_ingress_routes",
            "Routes in the routing table",
            routes.clone(),
        );
        registry.register(
            "portal_ingress_table_updates",
            "Routing tables built and swapped in",
            updates.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            retries,
            ejections,
            mirrors_dropped,
            routes,
            updates,
        }
    }

    pub fn encode_into(&self, out: &mut String) {
        let _ = prometheus_client::encoding::text::encode_registry(out, &self.registry);
    }
}
