//! Deleting stale UDP conntrack entries with the `conntrack` command
//! (conntrack-tools), as kube-proxy once did: the entries whose original
//! destination is one of the Service port's addresses and whose reply
//! comes from the endpoint that left.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::{Command, Stdio};

use crate::model::ServicePort;

#[derive(Debug, Default)]
pub(crate) struct Conntrack {
    /// Warned once that the command is missing.
    missing: bool,
}

impl Conntrack {
    pub(crate) fn forget(&mut self, port: &ServicePort, endpoint: SocketAddrV4) {
        let addresses: Vec<Ipv4Addr> = std::iter::once(port.cluster_ip)
            .chain(port.external_ips.iter().copied())
            .chain(port.load_balancer_ips.iter().copied())
            .collect();
        let mut filters: Vec<Vec<String>> = addresses
            .iter()
            .map(|ip| {
                vec![
                    "--orig-dst".into(),
                    ip.to_string(),
                    "--orig-port-dst".into(),
                    port.port.to_string(),
                ]
            })
            .collect();
        if let Some(node_port) = port.node_port {
            filters.push(vec!["--orig-port-dst".into(), node_port.to_string()]);
        }
        for filter in filters {
            let status = Command::new("conntrack")
                .args(["-D", "-p", "udp"])
                .args(&filter)
                .args([
                    "--reply-src",
                    &endpoint.ip().to_string(),
                    "--reply-port-src",
                    &endpoint.port().to_string(),
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            // Exit status 1 only means "no entry matched".
            if let Err(error) = status {
                if !self.missing {
                    tracing::warn!(%error, "cannot run conntrack: stale UDP flows to removed endpoints stay until they time out");
                    self.missing = true;
                }
                return;
            }
        }
    }
}
