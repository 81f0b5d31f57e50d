//! What NetworkPolicies allow, worked out for this node's pods: for each
//! pod that a policy isolates, the traffic its ingress and egress rules
//! let through, as address ranges and ports (named ports resolved). Pure:
//! the objects in, the plan out; `nft` renders it.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector as ApiSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use portal_api::selector::LabelSelector;

use super::ranges::{address, ip_block, merge, Ranges};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub fn of(name: Option<&str>) -> Option<Protocol> {
        match name.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    pub fn nft(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// Ports per protocol (None: every port of it).
pub type Ports = BTreeMap<Protocol, Option<Ranges<u16>>>;

/// Named ports as resolved on one pod.
type Resolved = Vec<(Protocol, u16)>;

/// What one rule lets through: from (ingress) or to (egress) `peers`
/// (None: any address; ranges of both families, see [`super::ranges`]),
/// on `ports` (None: every port of every protocol).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allow {
    pub peers: Option<Ranges<u128>>,
    pub ports: Option<Ports>,
    /// The policy it comes from (`namespace/name`), for the rule's comment.
    pub policy: String,
}

/// A pod this node runs that some policy isolates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Isolated {
    pub ip: Ipv4Addr,
    /// Its IPv6 address on a dual-stack node.
    pub ip6: Option<Ipv6Addr>,
    /// `namespace/name`.
    pub pod: String,
    /// None: not isolated for ingress; Some(rules): only what they allow.
    pub ingress: Option<Vec<Allow>>,
    pub egress: Option<Vec<Allow>>,
}

/// An address Portal's cluster DNS answers on (a node's, from the kube-dns
/// Endpoints), with the ports published there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsEndpoint {
    pub ip: IpAddr,
    /// `(name, protocol, port)`.
    pub ports: Vec<(String, Protocol, u16)>,
}

/// Portal's DNS answers on node addresses, not in pods. Policies written
/// for Kubernetes allow DNS with a peer for the DNS pods (`kube-system`,
/// `k8s-app: kube-dns`): the DNS endpoints stand in for such pods, for
/// egress only and on the DNS ports only (never the rest of the node).
const DNS_NAMESPACE: &str = "kube-system";
const DNS_LABEL: (&str, &str) = ("k8s-app", "kube-dns");

/// The objects the plan is made of.
#[derive(Debug)]
pub struct Cluster<'a> {
    pub policies: &'a [Arc<NetworkPolicy>],
    pub pods: &'a [Arc<Pod>],
    pub namespaces: &'a [Arc<Namespace>],
    pub dns: &'a [DnsEndpoint],
}

/// A pod that takes part: running somewhere with an IPv4 address of its
/// own, and an IPv6 one on a dual-stack network (host-network pods have
/// the node's and are not selected).
struct Member<'a> {
    pod: &'a Pod,
    v4: Ipv4Addr,
    v6: Option<Ipv6Addr>,
    namespace: &'a str,
}

impl Member<'_> {
    fn of(pod: &Pod) -> Option<Member<'_>> {
        let spec = pod.spec.as_ref()?;
        let status = pod.status.as_ref()?;
        if spec.host_network == Some(true)
            || matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"))
        {
            return None;
        }
        let ips = || {
            status
                .pod_ips
                .iter()
                .flatten()
                .map(|p| p.ip.as_str())
                .chain(status.pod_ip.as_deref())
        };
        Some(Member {
            pod,
            v4: ips().find_map(|ip| ip.parse::<Ipv4Addr>().ok())?,
            v6: ips().find_map(|ip| ip.parse::<Ipv6Addr>().ok()),
            namespace: pod.metadata.namespace.as_deref()?,
        })
    }

    /// Its addresses as ranges of the one address space.
    fn ranges(&self) -> impl Iterator<Item = (u128, u128)> {
        let v4 = address(IpAddr::V4(self.v4));
        let v6 = self.v6.map(|v6| address(IpAddr::V6(v6)));
        std::iter::once((v4, v4)).chain(v6.map(|v| (v, v)))
    }

    fn labels(&self) -> Option<&BTreeMap<String, String>> {
        self.pod.metadata.labels.as_ref()
    }

    /// The port this pod's containers name `name` for `protocol`.
    fn named_port(&self, name: &str, protocol: Protocol) -> Option<u16> {
        self.pod
            .spec
            .as_ref()?
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| {
                p.name.as_deref() == Some(name)
                    && Protocol::of(p.protocol.as_deref()) == Some(protocol)
            })
            .and_then(|p| u16::try_from(p.container_port).ok())
    }
}

/// A selector as Portal's; None for an invalid one (validation refuses
/// them), which then matches nothing rather than everything. An absent
/// selector is the empty one, which matches everything.
fn selector(given: Option<&ApiSelector>) -> Option<LabelSelector> {
    let Some(given) = given else {
        return Some(LabelSelector::default());
    };
    let value = serde_json::to_value(given).ok()?;
    LabelSelector::from_api(&value, "").ok()
}

fn labels_match(selector: &LabelSelector, labels: Option<&BTreeMap<String, String>>) -> bool {
    selector.matches(|key| labels.and_then(|l| l.get(key)).map(String::as_str))
}

/// A rule's ports: numbered (and protocol-only) ones, and named ones.
/// None: every port.
struct RulePorts {
    numbered: Ports,
    named: Vec<(Protocol, String)>,
}

impl RulePorts {
    fn of(ports: Option<&Vec<NetworkPolicyPort>>) -> Option<RulePorts> {
        let ports = ports.filter(|p| !p.is_empty())?;
        let mut numbered = Ports::new();
        let mut named = Vec::new();
        for port in ports {
            let Some(protocol) = Protocol::of(port.protocol.as_deref()) else {
                continue;
            };
            match &port.port {
                // A protocol alone: all of its ports.
                None => {
                    numbered.insert(protocol, None);
                }
                Some(IntOrString::Int(n)) => {
                    let Ok(low) = u16::try_from(*n) else {
                        continue;
                    };
                    let high = port
                        .end_port
                        .and_then(|e| u16::try_from(e).ok())
                        .unwrap_or(low);
                    // A protocol already open on every port stays so.
                    if let Some(list) = numbered.entry(protocol).or_insert_with(|| Some(Vec::new()))
                    {
                        list.push((low, high.max(low)));
                    }
                }
                Some(IntOrString::String(name)) => named.push((protocol, name.clone())),
            }
        }
        Some(RulePorts { numbered, named })
    }

    /// Whether a port (named `name`) is among these.
    fn covers(&self, name: &str, protocol: Protocol, port: u16) -> bool {
        let numbered = match self.numbered.get(&protocol) {
            Some(None) => true,
            Some(Some(ranges)) => ranges
                .iter()
                .any(|&(low, high)| (low..=high).contains(&port)),
            None => false,
        };
        numbered || self.named.iter().any(|(p, n)| *p == protocol && n == name)
    }
}

/// `numbered` plus `resolved` single ports, merged.
fn with_ports(numbered: &Ports, resolved: impl IntoIterator<Item = (Protocol, u16)>) -> Ports {
    let mut ports = numbered.clone();
    for (protocol, port) in resolved {
        if let Some(list) = ports.entry(protocol).or_insert_with(|| Some(Vec::new())) {
            list.push((port, port));
        }
    }
    ports
        .into_iter()
        .map(|(protocol, ranges)| (protocol, ranges.map(merge)))
        .collect()
}

/// What a rule's peers pick: None for "any address"; else the pods, the
/// ipBlock ranges and (egress) the cluster DNS endpoints.
struct Peers<'a> {
    pods: Vec<&'a Member<'a>>,
    blocks: Ranges<u128>,
    dns: Vec<&'a DnsEndpoint>,
}

impl Peers<'_> {
    fn addresses(&self) -> Ranges<u128> {
        merge(
            self.pods
                .iter()
                .flat_map(|m| m.ranges())
                .chain(self.blocks.iter().copied())
                .collect(),
        )
    }
}

/// The cluster, indexed once per plan.
struct Index<'a> {
    members: Vec<Member<'a>>,
    namespaces: HashMap<&'a str, Option<&'a BTreeMap<String, String>>>,
    dns: &'a [DnsEndpoint],
}

impl<'a> Index<'a> {
    fn namespace_labels(&self, name: &str) -> Option<&'a BTreeMap<String, String>> {
        self.namespaces.get(name).copied().flatten()
    }

    /// What `peers` of a policy in `namespace` pick (None: anyone).
    fn peers(
        &'a self,
        peers: Option<&[NetworkPolicyPeer]>,
        namespace: &str,
        egress: bool,
    ) -> Option<Peers<'a>> {
        let peers = peers.filter(|p| !p.is_empty())?;
        let mut picked = Peers {
            pods: Vec::new(),
            blocks: Vec::new(),
            dns: Vec::new(),
        };
        for peer in peers {
            if let Some(block) = &peer.ip_block {
                picked.blocks.extend(ip_block(
                    &block.cidr,
                    block.except.as_deref().unwrap_or(&[]),
                ));
                continue;
            }
            let Some(pods) = selector(peer.pod_selector.as_ref()) else {
                continue;
            };
            // No namespace selector: the policy's own namespace.
            let namespaces = match &peer.namespace_selector {
                None => None,
                Some(given) => match selector(Some(given)) {
                    Some(selector) => Some(selector),
                    None => continue,
                },
            };
            let in_scope = |ns: &str| match &namespaces {
                None => ns == namespace,
                Some(selector) => labels_match(selector, self.namespace_labels(ns)),
            };
            picked.pods.extend(
                self.members
                    .iter()
                    .filter(|m| in_scope(m.namespace) && labels_match(&pods, m.labels())),
            );
            let dns_labels = BTreeMap::from([(DNS_LABEL.0.to_owned(), DNS_LABEL.1.to_owned())]);
            if egress && in_scope(DNS_NAMESPACE) && labels_match(&pods, Some(&dns_labels)) {
                picked.dns.extend(self.dns.iter());
            }
        }
        picked.dns.dedup_by(|a, b| a.ip == b.ip);
        Some(picked)
    }
}

/// The allows of one egress rule (the same for every pod it applies to).
fn egress_allows(
    policy: &str,
    peers: Option<&Peers<'_>>,
    ports: Option<&RulePorts>,
    index: &Index<'_>,
) -> Vec<Allow> {
    let allow = |peers: Option<Ranges<u128>>, ports: Option<Ports>| Allow {
        peers,
        ports,
        policy: policy.to_owned(),
    };
    let mut allows = Vec::new();
    let Some(ports) = ports else {
        allows.push(allow(peers.map(Peers::addresses), None));
        allows.extend(
            peers
                .into_iter()
                .flat_map(|p| dns_allows(policy, &p.dns, None)),
        );
        return allows;
    };
    if !ports.numbered.is_empty() {
        allows.push(allow(
            peers.map(Peers::addresses),
            Some(with_ports(&ports.numbered, [])),
        ));
    }
    if !ports.named.is_empty() {
        // Named ports are the destination pods' own: destinations grouped
        // by what the names resolve to on them (ipBlocks have no names).
        let everyone: Vec<&Member<'_>> = index.members.iter().collect();
        let destinations = peers.map_or(everyone.as_slice(), |p| p.pods.as_slice());
        let mut groups: BTreeMap<Resolved, Ranges<u128>> = BTreeMap::new();
        for destination in destinations {
            let mut resolved: Vec<(Protocol, u16)> = ports
                .named
                .iter()
                .filter_map(|(protocol, name)| {
                    Some((*protocol, destination.named_port(name, *protocol)?))
                })
                .collect();
            resolved.sort_unstable();
            resolved.dedup();
            if !resolved.is_empty() {
                groups
                    .entry(resolved)
                    .or_default()
                    .extend(destination.ranges());
            }
        }
        for (resolved, addresses) in groups {
            allows.push(allow(
                Some(merge(addresses)),
                Some(with_ports(&Ports::new(), resolved)),
            ));
        }
    }
    // With "any address" the DNS is reached by the rules above already.
    if let Some(peers) = peers {
        allows.extend(dns_allows(policy, &peers.dns, Some(ports)));
    }
    allows
}

/// The cluster DNS endpoints a rule picked, on the DNS ports the rule's
/// ports cover (all of them when it names none).
fn dns_allows(policy: &str, dns: &[&DnsEndpoint], ports: Option<&RulePorts>) -> Vec<Allow> {
    dns.iter()
        .filter_map(|endpoint| {
            let covered: Vec<(Protocol, u16)> = endpoint
                .ports
                .iter()
                .filter(|(name, protocol, port)| {
                    ports.is_none_or(|p| p.covers(name, *protocol, *port))
                })
                .map(|(_, protocol, port)| (*protocol, *port))
                .collect();
            let ip = address(endpoint.ip);
            (!covered.is_empty()).then(|| Allow {
                peers: Some(vec![(ip, ip)]),
                ports: Some(with_ports(&Ports::new(), covered)),
                policy: policy.to_owned(),
            })
        })
        .collect()
}

/// The allow of one ingress rule for the pod `local` (its named ports are
/// its own); None when the rule can let nothing through.
fn ingress_allow(
    policy: &str,
    addresses: Option<&Ranges<u128>>,
    ports: Option<&RulePorts>,
    local: &Member<'_>,
) -> Option<Allow> {
    let ports = match ports {
        None => None,
        Some(ports) => {
            let resolved = ports.named.iter().filter_map(|(protocol, name)| {
                Some((*protocol, local.named_port(name, *protocol)?))
            });
            let merged = with_ports(&ports.numbered, resolved);
            if merged.is_empty() {
                return None;
            }
            Some(merged)
        }
    };
    Some(Allow {
        peers: addresses.cloned(),
        ports,
        policy: policy.to_owned(),
    })
}

impl Cluster<'_> {
    /// The isolated pods on `node`, by address.
    pub fn plan(&self, node: &str) -> Vec<Isolated> {
        let index = Index {
            members: self.pods.iter().filter_map(|p| Member::of(p)).collect(),
            namespaces: self
                .namespaces
                .iter()
                .filter_map(|n| Some((n.metadata.name.as_deref()?, n.metadata.labels.as_ref())))
                .collect(),
            dns: self.dns,
        };
        let locals: Vec<&Member<'_>> = index
            .members
            .iter()
            .filter(|m| m.pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .collect();
        let mut plan: BTreeMap<Ipv4Addr, Isolated> = BTreeMap::new();
        for policy in self.policies {
            let (Some(namespace), Some(name), Some(spec)) = (
                policy.metadata.namespace.as_deref(),
                policy.metadata.name.as_deref(),
                policy.spec.as_ref(),
            ) else {
                continue;
            };
            let Some(selects) = selector(spec.pod_selector.as_ref()) else {
                continue;
            };
            let selected: Vec<&&Member<'_>> = locals
                .iter()
                .filter(|m| m.namespace == namespace && labels_match(&selects, m.labels()))
                .collect();
            if selected.is_empty() {
                continue;
            }
            let id = format!("{namespace}/{name}");
            let (ingress, egress) = policy_types(spec);
            // Each rule's peers are worked out once, whatever the pods.
            let ingress_rules: Vec<(Option<Ranges<u128>>, Option<RulePorts>)> = spec
                .ingress
                .iter()
                .flatten()
                .map(|rule| {
                    let peers = index.peers(rule.from.as_deref(), namespace, false);
                    (
                        peers.as_ref().map(Peers::addresses),
                        RulePorts::of(rule.ports.as_ref()),
                    )
                })
                .collect();
            let egress_rules: Vec<Allow> = spec
                .egress
                .iter()
                .flatten()
                .flat_map(|rule| {
                    let peers = index.peers(rule.to.as_deref(), namespace, true);
                    egress_allows(
                        &id,
                        peers.as_ref(),
                        RulePorts::of(rule.ports.as_ref()).as_ref(),
                        &index,
                    )
                })
                .collect();
            for local in selected {
                let ip = local.v4;
                let entry = plan.entry(ip).or_insert_with(|| Isolated {
                    ip,
                    ip6: local.v6,
                    pod: format!(
                        "{}/{}",
                        local.namespace,
                        local.pod.metadata.name.as_deref().unwrap_or("")
                    ),
                    ingress: None,
                    egress: None,
                });
                if ingress {
                    let allows = ingress_rules.iter().filter_map(|(addresses, ports)| {
                        ingress_allow(&id, addresses.as_ref(), ports.as_ref(), local)
                    });
                    entry.ingress.get_or_insert_with(Vec::new).extend(allows);
                }
                if egress {
                    entry
                        .egress
                        .get_or_insert_with(Vec::new)
                        .extend(egress_rules.iter().cloned());
                }
            }
        }
        // A rule whose peers resolved to no address allows nothing.
        for isolated in plan.values_mut() {
            for allows in [&mut isolated.ingress, &mut isolated.egress]
                .into_iter()
                .flatten()
            {
                allows.retain(|a| a.peers.as_ref().is_none_or(|p| !p.is_empty()));
            }
        }
        plan.into_values().collect()
    }
}

/// Which directions a policy isolates (`policyTypes`, defaulted as the API
/// server does for objects written before the default).
fn policy_types(spec: &NetworkPolicySpec) -> (bool, bool) {
    match spec.policy_types.as_deref() {
        Some(types) if !types.is_empty() => (
            types.iter().any(|t| t == "Ingress"),
            types.iter().any(|t| t == "Egress"),
        ),
        _ => (true, spec.egress.as_ref().is_some_and(|e| !e.is_empty())),
    }
}
