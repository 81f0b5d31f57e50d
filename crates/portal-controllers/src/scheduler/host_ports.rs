//! The scheduler's `NodePorts` filter: a pod asking for a host port (a
//! container port's `hostPort`) fits only nodes where no pod already holds
//! that port for the same protocol on an overlapping address (`hostIP`
//! unset or `0.0.0.0` means every address).

use k8s_openapi::api::core::v1::Pod;

use super::cluster::Placed;

/// One host port a pod holds: protocol, address (`""` for all), port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPort {
    protocol: String,
    ip: String,
    port: i32,
}

/// The host ports `pod` asks for.
pub fn of(pod: &Pod) -> Vec<HostPort> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|p| *p > 0)?;
            let ip = p.host_ip.clone().unwrap_or_default();
            Some(HostPort {
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                ip: if ip == "0.0.0.0" { String::new() } else { ip },
                port,
            })
        })
        .collect()
}

fn overlaps(a: &HostPort, b: &HostPort) -> bool {
    a.protocol == b.protocol
        && a.port == b.port
        && (a.ip.is_empty() || b.ip.is_empty() || a.ip == b.ip)
}

/// Why `node` cannot take a pod asking for `wanted`, if it cannot.
pub fn misfit(wanted: &[HostPort], node: &str, placed: &[Placed]) -> Option<&'static str> {
    if wanted.is_empty() {
        return None;
    }
    let taken = placed
        .iter()
        .filter(|p| &*p.node == node)
        .flat_map(|p| of(&p.pod))
        .any(|held| wanted.iter().any(|w| overlaps(w, &held)));
    taken.then_some("node(s) didn't have free ports for the requested pod ports")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn pod(ports: serde_json::Value) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(serde_json::json!({"metadata": {"name": "p"},
                "spec": {"containers": [{"name": "c", "ports": ports}]}}))
            .unwrap(),
        )
    }

    #[test]
    fn a_host_port_is_held_once_per_protocol_and_address() {
        let placed = [Placed::new(
            pod(serde_json::json!([{"containerPort": 80, "hostPort": 8080}])),
            "n1".into(),
        )];
        let same = of(&pod(
            serde_json::json!([{"containerPort": 8080, "hostPort": 8080, "protocol": "TCP"}]),
        ));
        assert!(misfit(&same, "n1", &placed).is_some());
        assert!(misfit(&same, "n2", &placed).is_none());
        let udp = of(&pod(
            serde_json::json!([{"containerPort": 53, "hostPort": 8080, "protocol": "UDP"}]),
        ));
        assert!(misfit(&udp, "n1", &placed).is_none());
        let pinned = of(&pod(
            serde_json::json!([{"containerPort": 1, "hostPort": 8080, "hostIP": "192.0.2.7"}]),
        ));
        assert!(
            misfit(&pinned, "n1", &placed).is_some(),
            "the held port covers every address"
        );
        assert!(of(&pod(serde_json::json!([{"containerPort": 80}]))).is_empty());
    }
}
