//! `hostPort`: a container port reachable at the node's own addresses, as
//! the portmap CNI plugin does it — DNAT in the node's nftables (table `ip
//! portal_hostports`), for traffic arriving at the node (prerouting) and
//! made on it (output), to the pod's address and container port. Every
//! running pod's mappings are kept here and the table is replaced whole,
//! in one transaction, whenever they change.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::Mutex;

/// One mapping: node port → pod address and port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mapping {
    /// `tcp`, `udp` or `sctp`.
    pub protocol: String,
    /// Only this node address, when the pod asked for one (`hostIP`).
    pub host_ip: Option<Ipv4Addr>,
    pub host_port: u16,
    pub pod_ip: Ipv4Addr,
    pub container_port: u16,
}

/// The mappings `pod` at `pod_ip` asks for.
pub fn of(pod: &Pod, pod_ip: Ipv4Addr) -> Vec<Mapping> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    if spec.host_network == Some(true) {
        // Its ports are the node's already.
        return Vec::new();
    }
    spec.containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let host_port = u16::try_from(p.host_port?).ok().filter(|p| *p > 0)?;
            Some(Mapping {
                protocol: p.protocol.as_deref().unwrap_or("TCP").to_lowercase(),
                host_ip: p
                    .host_ip
                    .as_deref()
                    .and_then(|ip| ip.parse().ok())
                    .filter(|ip: &Ipv4Addr| !ip.is_unspecified()),
                host_port,
                pod_ip,
                container_port: u16::try_from(p.container_port).ok()?,
            })
        })
        .collect()
}

/// The table for `mappings` (replaced whole: `delete` after `table`
/// makes the first run work too). Its chains run just before the proxy's
/// (`dstnat` is -100), as portmap's do before kube-proxy's.
pub fn rules(mappings: &[Mapping]) -> String {
    let mut matches = String::new();
    for m in mappings {
        let address = match m.host_ip {
            Some(ip) => format!("ip daddr {ip}"),
            None => "fib daddr type local".into(),
        };
        matches.push_str(&format!(
            "\t\t{address} {proto} dport {} dnat ip to {}:{}\n",
            m.host_port,
            m.pod_ip,
            m.container_port,
            proto = m.protocol,
        ));
    }
    format!(
        "table ip portal_hostports\n\
         delete table ip portal_hostports\n\
         table ip portal_hostports {{\n\
         \tchain mappings {{\n{matches}\t}}\n\
         \tchain prerouting {{\n\
         \t\ttype nat hook prerouting priority -101; policy accept;\n\
         \t\tjump mappings\n\
         \t}}\n\
         \tchain output {{\n\
         \t\ttype nat hook output priority -101; policy accept;\n\
         \t\tjump mappings\n\
         \t}}\n\
         }}\n"
    )
}

/// Every running pod's mappings, by pod UID.
#[derive(Debug, Default)]
pub struct HostPorts {
    by_pod: Mutex<BTreeMap<String, Vec<Mapping>>>,
}

impl HostPorts {
    /// Sets the pod's mappings (none: forgets it); reprograms the node when
    /// anything changed.
    pub async fn set(&self, uid: &str, mappings: Vec<Mapping>) {
        let mut by_pod = self.by_pod.lock().await;
        let changed = match (by_pod.get(uid), mappings.is_empty()) {
            (None, true) => false,
            (Some(old), _) if *old == mappings => false,
            _ => true,
        };
        if !changed {
            return;
        }
        if mappings.is_empty() {
            by_pod.remove(uid);
        } else {
            by_pod.insert(uid.to_owned(), mappings);
        }
        let all: Vec<Mapping> = by_pod.values().flatten().cloned().collect();
        if let Err(error) = crate::routes::apply_nft(&rules(&all)).await {
            tracing::warn!(%error, "programming host ports");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_map_to_the_pod() {
        let pod: Pod = serde_json::from_value(serde_json::json!({"metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "ports": [
                {"containerPort": 80, "hostPort": 8080},
                {"containerPort": 53, "hostPort": 5353, "protocol": "UDP", "hostIP": "192.0.2.1"},
                {"containerPort": 9000}]}]}}))
        .unwrap();
        let mappings = of(&pod, "10.244.0.5".parse().unwrap());
        assert_eq!(mappings.len(), 2);
        let text = rules(&mappings);
        assert!(
            text.contains("fib daddr type local tcp dport 8080 dnat ip to 10.244.0.5:80"),
            "{text}"
        );
        assert!(
            text.contains("ip daddr 192.0.2.1 udp dport 5353 dnat ip to 10.244.0.5:53"),
            "{text}"
        );
        assert!(text.starts_with("table ip portal_hostports\ndelete table ip portal_hostports\n"));
    }
}
