//! Labels and annotations with a meaning in Kubernetes that Portal's
//! components share.

/// On an EndpointSlice: the Service it belongs to.
pub const SERVICE_NAME: &str = "kubernetes.io/service-name";
/// On an EndpointSlice: the controller that manages it.
pub const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// On Endpoints: not to be mirrored into EndpointSlices.
pub const SKIP_MIRROR: &str = "endpointslice.kubernetes.io/skip-mirror";
/// On an Ingress: its class, before `spec.ingressClassName`.
pub const INGRESS_CLASS: &str = "kubernetes.io/ingress.class";
/// On an IngressClass: `"true"` makes it the default class.
pub const DEFAULT_INGRESS_CLASS: &str = "ingressclass.kubernetes.io/is-default-class";
/// On a Node: the zone it is in (topology hints, `trafficDistribution`).
pub const TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
/// On Endpoints and EndpointSlices: when the change they show was caused
/// (network programming latency is measured from it).
pub const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";
