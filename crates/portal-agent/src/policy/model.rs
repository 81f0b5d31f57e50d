//! What NetworkPolicies allow, worked out for this node's pods: for each
//! pod that a policy isolates, the traffic its ingress and egress rules
//! let through, as address ranges and ports (named ports resolved). Pure:
//! the objects in, the plan out; `nft` renders it.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector as ApiSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use portal_api::kinds::network_policy::{cidr_bounds, parse_cidr};
use portal_api::selector::LabelSelector;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    fn of(name: Option<&str>) -> Option<Protocol> {
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

/// Inclusive ranges, sorted and merged (no two overlap or touch).
pub type Ranges<T> = Vec<(T, T)>;

/// What one rule lets through: from (ingress) or to (egress) `peers`
/// (None: any address), on `ports` (None: every port of every protocol;
/// per protocol, None: every port of it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allow {
    pub peers: Option<Ranges<u32>>,
    pub ports: Option<BTreeMap<Protocol, Option<Ranges<u16>>>>,
    /// The policy it comes from (`namespace/name`), for the rule's comment.
    pub policy: String,
}

/// A pod this node runs that some policy isolates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Isolated {
    pub ip: Ipv4Addr,
    /// `namespace/name`.
    pub pod: String,
    /// None: not isolated for ingress; Some(rules): only what they allow.
    pub ingress: Option<Vec<Allow>>,
    pub egress: Option<Vec<Allow>>,
}

/// Sorts and merges ranges so none overlap or touch (nft refuses
/// overlapping intervals in a set).
pub fn merge<T: Copy + Ord + num_step::Step>(mut ranges: Ranges<T>) -> Ranges<T> {
    ranges.sort();
    let mut merged: Ranges<T> = Vec::with_capacity(ranges.len());
    for (low, high) in ranges {
        match merged.last_mut() {
            Some(last) if low <= last.1.next_or_max() => last.1 = last.1.max(high),
            _ => merged.push((low, high)),
        }
    }
    merged
}

/// The one thing `merge` needs of a number: its successor.
pub mod num_step {
    pub trait Step {
        fn next_or_max(self) -> Self;
    }
    impl Step for u32 {
        fn next_or_max(self) -> Self {
            self.saturating_add(1)
        }
    }
    impl Step for u16 {
        fn next_or_max(self) -> Self {
            self.saturating_add(1)
        }
    }
}

/// `range` without the `holes`.
fn subtract(range: (u32, u32), holes: &Ranges<u32>) -> Ranges<u32> {
    let mut left = vec![range];
    for &(low, high) in holes {
        left = left
            .into_iter()
            .flat_map(|(a, b)| {
                let mut parts = Vec::new();
                if high < a || low > b {
                    parts.push((a, b));
                } else {
                    if low > a {
                        parts.push((a, low - 1));
                    }
                    if high < b {
                        parts.push((high + 1, b));
                    }
                }
                parts
            })
            .collect();
    }
    left
}

/// An IPv4 block less its exceptions; None for another family or bad text.
fn block_ranges(cidr: &str, except: &[String]) -> Option<Ranges<u32>> {
    let block = parse_cidr(cidr).filter(|(ip, _)| ip.is_ipv4())?;
    let (low, high) = cidr_bounds(block);
    let holes: Ranges<u32> = merge(
        except
            .iter()
            .filter_map(|e| parse_cidr(e).filter(|(ip, _)| ip.is_ipv4()))
            .map(cidr_bounds)
            .map(|(l, h)| (l as u32, h as u32))
            .collect(),
    );
    Some(subtract((low as u32, high as u32), &holes))
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

/// What a peer selector can pick: a pod running somewhere with an IPv4
/// address of its own (host-network pods have the node's and are not
/// selected), or an address of the cluster DNS.
struct Member<'a> {
    /// None: the cluster DNS on a node address.
    pod: Option<&'a Pod>,
    ip: Ipv4Addr,
    namespace: &'a str,
    labels: Option<&'a BTreeMap<String, String>>,
}

/// Portal's cluster DNS answers on node addresses, not in pods. Policies
/// written for Kubernetes allow DNS with a peer for the DNS pods
/// (`namespaceSelector` kube-system, `podSelector` `k8s-app: kube-dns`)
/// and the port names CoreDNS's pods give: those addresses stand in for
/// such pods, with their labels and ports.
const DNS_NAMESPACE: &str = "kube-system";
static DNS_LABELS: std::sync::LazyLock<BTreeMap<String, String>> =
    std::sync::LazyLock::new(|| BTreeMap::from([("k8s-app".to_owned(), "kube-dns".to_owned())]));
const DNS_PORTS: [(&str, Protocol, u16); 2] =
    [("dns", Protocol::Udp, 53), ("dns-tcp", Protocol::Tcp, 53)];

fn member(pod: &Pod) -> Option<Member<'_>> {
    let spec = pod.spec.as_ref()?;
    let status = pod.status.as_ref()?;
    if spec.host_network == Some(true)
        || matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"))
    {
        return None;
    }
    let ip = status
        .pod_ips
        .iter()
        .flatten()
        .map(|p| p.ip.as_str())
        .chain(status.pod_ip.as_deref())
        .find_map(|ip| ip.parse::<Ipv4Addr>().ok())?;
    Some(Member {
        pod: Some(pod),
        ip,
        namespace: pod.metadata.namespace.as_deref()?,
        labels: pod.metadata.labels.as_ref(),
    })
}

/// The port a member gives `name` for `protocol`.
fn named_port(member: &Member<'_>, name: &str, protocol: Protocol) -> Option<u16> {
    let Some(pod) = member.pod else {
        return DNS_PORTS
            .iter()
            .find(|(n, p, _)| *n == name && *p == protocol)
            .map(|(_, _, port)| *port);
    };
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| {
            p.name.as_deref() == Some(name) && Protocol::of(p.protocol.as_deref()) == Some(protocol)
        })
        .and_then(|p| u16::try_from(p.container_port).ok())
}

/// The objects the plan is made of.
#[derive(Debug)]
pub struct Cluster<'a> {
    pub policies: &'a [Arc<NetworkPolicy>],
    pub pods: &'a [Arc<Pod>],
    pub namespaces: &'a [Arc<Namespace>],
    /// The addresses the cluster DNS answers on that are no pod's.
    pub dns: &'a [Ipv4Addr],
}

/// A rule's ports: numbered (and protocol-only) ones, and named ones to
/// resolve on a pod. `None`: every port.
struct RulePorts {
    numbered: BTreeMap<Protocol, Option<Ranges<u16>>>,
    named: Vec<(Protocol, String)>,
}

fn rule_ports(ports: Option<&Vec<NetworkPolicyPort>>) -> Option<RulePorts> {
    let ports = ports.filter(|p| !p.is_empty())?;
    let mut numbered: BTreeMap<Protocol, Option<Ranges<u16>>> = BTreeMap::new();
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
                let (Ok(low), end) = (u16::try_from(*n), port.end_port) else {
                    continue;
                };
                let high = end.and_then(|e| u16::try_from(e).ok()).unwrap_or(low);
                // A protocol already open on every port stays so.
                if let Some(list) = numbered.entry(protocol).or_insert_with(|| Some(Vec::new())) {
                    list.push((low, high.max(low)));
                }
            }
            Some(IntOrString::String(name)) => named.push((protocol, name.clone())),
        }
    }
    Some(RulePorts { numbered, named })
}

fn with_named(
    numbered: &BTreeMap<Protocol, Option<Ranges<u16>>>,
    resolved: impl IntoIterator<Item = (Protocol, u16)>,
) -> BTreeMap<Protocol, Option<Ranges<u16>>> {
    let mut ports = numbered.clone();
    for (protocol, port) in resolved {
        match ports.get_mut(&protocol) {
            Some(None) => {}
            Some(Some(list)) => list.push((port, port)),
            None => {
                ports.insert(protocol, Some(vec![(port, port)]));
            }
        }
    }
    ports
        .into_iter()
        .map(|(protocol, ranges)| (protocol, ranges.map(merge)))
        .collect()
}

impl Cluster<'_> {
    fn namespace_labels(&self, name: &str) -> Option<&BTreeMap<String, String>> {
        self.namespaces
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(name))
            .and_then(|n| n.metadata.labels.as_ref())
    }

    /// The pods a peer's selectors pick, for a policy in `namespace`.
    fn peer_pods<'a>(&'a self, peer: &NetworkPolicyPeer, namespace: &str) -> Vec<Member<'a>> {
        // No namespace selector: the policy's own namespace.
        let namespaces = match &peer.namespace_selector {
            None => None,
            Some(given) => match selector(Some(given)) {
                Some(selector) => Some(selector),
                None => return Vec::new(),
            },
        };
        let Some(pods) = selector(peer.pod_selector.as_ref()) else {
            return Vec::new();
        };
        self.members()
            .filter(|m| match &namespaces {
                // A pod selector alone: the policy's own namespace.
                None => m.namespace == namespace,
                Some(selector) => labels_match(selector, self.namespace_labels(m.namespace)),
            })
            .filter(|m| labels_match(&pods, m.labels))
            .collect()
    }

    /// Every pod that takes part, and the cluster DNS's addresses.
    fn members(&self) -> impl Iterator<Item = Member<'_>> {
        let dns = self.dns.iter().map(|ip| Member {
            pod: None,
            ip: *ip,
            namespace: DNS_NAMESPACE,
            labels: Some(&DNS_LABELS),
        });
        self.pods.iter().filter_map(|p| member(p)).chain(dns)
    }

    /// Each policy direction's rules for the pod at `local`.
    fn allows(
        &self,
        policy: &str,
        namespace: &str,
        local: &Member<'_>,
        rules: impl Iterator<
            Item = (
                Option<Vec<NetworkPolicyPeer>>,
                Option<Vec<NetworkPolicyPort>>,
            ),
        >,
        ingress: bool,
    ) -> Vec<Allow> {
        let mut allows = Vec::new();
        for (peers, ports) in rules {
            let ports = rule_ports(ports.as_ref());
            // None: any address; else the pods picked and the blocks.
            let mut pods: Option<Vec<Member<'_>>> = None;
            let mut blocks: Ranges<u32> = Vec::new();
            if let Some(peers) = peers.filter(|p| !p.is_empty()) {
                let mut picked = Vec::new();
                for peer in &peers {
                    if let Some(block) = &peer.ip_block {
                        blocks.extend(
                            block_ranges(&block.cidr, block.except.as_deref().unwrap_or(&[]))
                                .unwrap_or_default(),
                        );
                    } else {
                        picked.extend(self.peer_pods(peer, namespace));
                    }
                }
                pods = Some(picked);
            }
            let addresses = |pods: &[Member<'_>]| -> Ranges<u32> {
                merge(
                    pods.iter()
                        .map(|m| (u32::from(m.ip), u32::from(m.ip)))
                        .chain(blocks.iter().copied())
                        .collect(),
                )
            };
            let Some(ports) = ports else {
                allows.push(Allow {
                    peers: pods.as_deref().map(addresses),
                    ports: None,
                    policy: policy.to_owned(),
                });
                continue;
            };
            if ingress || ports.named.is_empty() {
                // Named ports of ingress rules are the local pod's own.
                let resolved = ports.named.iter().filter_map(|(protocol, name)| {
                    Some((*protocol, named_port(local, name, *protocol)?))
                });
                let merged = with_named(&ports.numbered, resolved);
                if !merged.is_empty() {
                    allows.push(Allow {
                        peers: pods.as_deref().map(addresses),
                        ports: Some(merged),
                        policy: policy.to_owned(),
                    });
                }
                continue;
            }
            // Egress with named ports: numbered ones for every peer, named
            // ones resolved on each destination pod (blocks have no names).
            if !ports.numbered.is_empty() {
                allows.push(Allow {
                    peers: pods.as_deref().map(addresses),
                    ports: Some(with_named(&ports.numbered, [])),
                    policy: policy.to_owned(),
                });
            }
            let destinations: Vec<Member<'_>> = match pods {
                Some(pods) => pods,
                None => self.members().collect(),
            };
            for destination in destinations {
                let resolved: Vec<(Protocol, u16)> = ports
                    .named
                    .iter()
                    .filter_map(|(protocol, name)| {
                        Some((*protocol, named_port(&destination, name, *protocol)?))
                    })
                    .collect();
                if !resolved.is_empty() {
                    let ip = u32::from(destination.ip);
                    allows.push(Allow {
                        peers: Some(vec![(ip, ip)]),
                        ports: Some(with_named(&BTreeMap::new(), resolved)),
                        policy: policy.to_owned(),
                    });
                }
            }
        }
        // A rule whose peers resolved to no address allows nothing.
        allows.retain(|a| a.peers.as_ref().is_none_or(|p| !p.is_empty()));
        allows
    }

    /// The isolated pods on `node`, by address.
    pub fn plan(&self, node: &str) -> Vec<Isolated> {
        let mut plan: BTreeMap<Ipv4Addr, Isolated> = BTreeMap::new();
        let locals: Vec<Member<'_>> = self
            .pods
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .filter_map(|p| member(p))
            .collect();
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
            let (ingress, egress) = policy_types(spec);
            let id = format!("{namespace}/{name}");
            for local in locals.iter().filter(|m| m.namespace == namespace) {
                if !labels_match(&selects, local.labels) {
                    continue;
                }
                let entry = plan.entry(local.ip).or_insert_with(|| Isolated {
                    ip: local.ip,
                    pod: format!(
                        "{}/{}",
                        local.namespace,
                        local
                            .pod
                            .and_then(|p| p.metadata.name.as_deref())
                            .unwrap_or("")
                    ),
                    ingress: None,
                    egress: None,
                });
                if ingress {
                    let rules = spec
                        .ingress
                        .iter()
                        .flatten()
                        .map(|r| (r.from.clone(), r.ports.clone()));
                    let allows = self.allows(&id, namespace, local, rules, true);
                    entry.ingress.get_or_insert_with(Vec::new).extend(allows);
                }
                if egress {
                    let rules = spec
                        .egress
                        .iter()
                        .flatten()
                        .map(|r| (r.to.clone(), r.ports.clone()));
                    let allows = self.allows(&id, namespace, local, rules, false);
                    entry.egress.get_or_insert_with(Vec::new).extend(allows);
                }
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
