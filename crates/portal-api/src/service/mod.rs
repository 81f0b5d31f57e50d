//! What a Service means (SPEC S1–S13, D1): validation with the field paths
//! and messages Kubernetes gives, and the environment variables pods get.

mod env;
pub mod families;
pub(crate) mod validate;

pub use env::environment;
pub use validate::{validate, validate_endpoints};

/// `spec.clusterIP` of a headless Service.
pub const HEADLESS: &str = "None";

/// Whether `svc` needs a cluster IP allocated (not headless, not ExternalName).
pub fn wants_cluster_ip(svc: &serde_json::Value) -> bool {
    let spec = &svc["spec"];
    spec["type"].as_str() != Some("ExternalName") && spec["clusterIP"].as_str() != Some(HEADLESS)
}

/// Whether `svc`'s ports get node ports (NodePort and LoadBalancer types).
pub fn wants_node_ports(svc: &serde_json::Value) -> bool {
    matches!(
        svc["spec"]["type"].as_str(),
        Some("NodePort" | "LoadBalancer")
    )
}
