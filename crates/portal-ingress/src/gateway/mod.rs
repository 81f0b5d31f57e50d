//! The Gateway API (`gateway.networking.k8s.io`, standard channel) on the
//! same proxy as Ingress: Portal installs the definitions ([`install`]),
//! makes the GatewayClass `portal`, and serves the Gateways of classes
//! naming its controller. Their HTTP and HTTPS listeners are served on the
//! proxy's two sockets, HTTPRoutes attached to them are compiled into
//! per-socket routes ([`compile`], [`routes`]) that the proxy consults
//! before the Ingress rules, and every object gets its status
//! ([`status`]).

pub(crate) mod compile;
pub(crate) mod install;
pub(crate) mod objects;
pub(crate) mod routes;
pub(crate) mod status;

#[cfg(test)]
mod tests;

/// The controller name of Portal's GatewayClass.
pub const CONTROLLER: &str = "portal.dev/gateway-controller";
/// Portal's GatewayClass, made at start.
pub const CLASS: &str = "portal";
