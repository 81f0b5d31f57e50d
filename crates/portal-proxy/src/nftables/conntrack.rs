//! Stale UDP conntrack entries, deleted with the `conntrack` command
//! (conntrack-tools). UDP has no connection to end, so without this a flow
//! keeps going where its entry says:
//! - to an endpoint that left: delete the entries whose original
//!   destination is one of the Service port's addresses and whose reply
//!   comes from that endpoint;
//! - past a Service port that just got its first endpoints: a client that
//!   sent before the rules existed has an entry without NAT; delete the
//!   entries for the port's addresses (as kube-proxy does).
//!
//! What was programmed is remembered apart from the rule state, so a
//! failed sync in between loses nothing.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::model::{Family, Protocol, ServiceKey, ServicePort};
use crate::tracker::Changes;

#[derive(Debug)]
pub(crate) struct Conntrack {
    /// The family of the table this follows (its ports only).
    family: Family,
    /// UDP ports as last programmed.
    programmed: HashMap<ServiceKey, Vec<ServicePort>>,
    /// A first sync happened: before it, entries were made under the rules
    /// a previous run left, which are still right.
    primed: bool,
    /// Warned once that the command is missing.
    missing: bool,
}

impl Conntrack {
    pub(crate) fn new(family: Family) -> Self {
        Conntrack {
            family,
            programmed: HashMap::new(),
            primed: false,
            missing: false,
        }
    }

    fn udp(&self, ports: &[ServicePort]) -> Vec<ServicePort> {
        ports
            .iter()
            .filter(|p| p.protocol == Protocol::Udp && p.family() == self.family)
            .cloned()
            .collect()
    }

    /// After a successful sync of `changes` (every Service when `full`).
    pub(crate) fn programmed(&mut self, changes: &Changes, full: bool) {
        let mut now: Vec<(ServiceKey, Vec<ServicePort>)> = changes
            .services
            .iter()
            .map(|(key, ports)| (key.clone(), self.udp(ports)))
            .collect();
        if full {
            let gone = self
                .programmed
                .keys()
                .filter(|k| !changes.services.contains_key(*k));
            now.extend(gone.map(|k| (k.clone(), Vec::new())).collect::<Vec<_>>());
        }
        for (key, ports) in now {
            let before = self.programmed.remove(&key).unwrap_or_default();
            for old in &before {
                // Matched by protocol and number: a renamed port is the same port.
                let current = ports.iter().find(|p| p.port == old.port);
                for endpoint in old
                    .endpoints
                    .iter()
                    .filter(|e| current.is_none_or(|c| !c.endpoints.contains(e)))
                {
                    self.forget(old, Some(*endpoint));
                }
            }
            if self.primed {
                for new in ports.iter().filter(|p| !p.endpoints.is_empty()) {
                    let served = before
                        .iter()
                        .any(|b| b.port == new.port && !b.endpoints.is_empty());
                    if !served {
                        self.forget(new, None);
                    }
                }
            }
            if !ports.is_empty() {
                self.programmed.insert(key, ports);
            }
        }
        self.primed = true;
    }

    /// Deletes the UDP entries to `port`'s addresses (and node port) that
    /// `endpoint` answers, or all of them.
    fn forget(&mut self, port: &ServicePort, endpoint: Option<SocketAddr>) {
        let addresses: Vec<IpAddr> = std::iter::once(port.cluster_ip)
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
        let reply: Vec<String> = endpoint.map_or_else(Vec::new, |e| {
            vec![
                "--reply-src".into(),
                e.ip().to_string(),
                "--reply-port-src".into(),
                e.port().to_string(),
            ]
        });
        for filter in filters {
            let family = match self.family {
                Family::V4 => "ipv4",
                Family::V6 => "ipv6",
            };
            let mut args = vec!["-D", "-f", family, "-p", "udp"];
            args.extend(filter.iter().map(String::as_str));
            args.extend(reply.iter().map(String::as_str));
            // Exit status 1 only means "no entry matched".
            if let Err(error) =
                crate::command::run("conntrack", &args, None, Duration::from_secs(10))
            {
                if !self.missing {
                    tracing::warn!(%error, "cannot run conntrack: stale UDP flows stay until they time out");
                    self.missing = true;
                }
                return;
            }
        }
    }
}
