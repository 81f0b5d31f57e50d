//! The rules one Service owns in Portal's table, as data: chains of
//! [`Rule`]s, verdict-map elements, affinity sets and hairpin addresses.
//! Rendering to nft syntax and the packet tracer both read this.
//!
//! Layout (ADR 0006): `services` looks the packet up in verdict maps keyed
//! by `address . protocol . port` (one lookup whatever the number of
//! Services), which jump to the Service port's `svc-` chain (cluster IP) or
//! `ext-` chain (node port, external and load-balancer addresses: marks for
//! masquerade, then `svc-`). A `svc-` chain picks an endpoint with a
//! cascade of `numgen random mod k 0` rules, each with its own `dnat`,
//! kube-proxy's iptables-mode choice without a chain per endpoint:
//! anonymous maps and per-endpoint chains made the kernel's commits
//! hundreds of times slower at 10,000 Services.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::net::{IpAddr, SocketAddr};

use crate::model::{Family, Protocol, ServicePort};

/// Portal's table of a family: `ip portal`, `ip6 portal`.
pub(crate) fn table(family: Family) -> &'static str {
    match family {
        Family::V4 => "ip portal",
        Family::V6 => "ip6 portal",
    }
}

/// The name of the table in either family.
pub(crate) const TABLE_NAME: &str = "portal";

/// Verdict maps from an address (or node port) to a Service port's chain.
pub(crate) const CLUSTER_IPS: &str = "cluster-ips";
pub(crate) const EXTERNAL_IPS: &str = "external-ips";
pub(crate) const LOAD_BALANCER_IPS: &str = "load-balancer-ips";
pub(crate) const NODE_PORTS: &str = "node-ports";
/// Addresses and node ports of Service ports without ready endpoints:
/// rejected (ICMP port unreachable) so clients fail fast, as kube-proxy.
pub(crate) const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
pub(crate) const NO_ENDPOINT_NODE_PORTS: &str = "no-endpoint-node-ports";
/// `endpoint . endpoint` pairs: a connection that DNAT sent back to its own
/// source (a pod reaching itself through its Service) is masqueraded.
pub(crate) const HAIRPIN: &str = "hairpin";
pub(crate) const MARK_FOR_MASQUERADE: &str = "mark-for-masquerade";
pub(crate) const REJECT: &str = "reject-no-endpoints";
/// The bridge Portal's agent plugs this node's pods into.
pub(crate) const POD_BRIDGE: &str = "portal0";

/// One rule of a Service port's chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Rule {
    /// `jump mark-for-masquerade`.
    MarkForMasquerade,
    /// `goto chain`.
    Goto(String),
    /// A client with an affinity entry for this endpoint goes back to it.
    Sticky {
        set: String,
        to: SocketAddr,
        protocol: Protocol,
    },
    /// Endpoint `to` with probability 1/`of` (1 = always), recording the
    /// client in the affinity set when there is one.
    Pick {
        of: usize,
        to: SocketAddr,
        protocol: Protocol,
        affinity: Option<String>,
    },
    /// The rule, for packets sent from this node itself (`fib saddr type
    /// local`).
    FromNode(Box<Rule>),
    /// The rule, for packets from this node's pods (they arrive on the
    /// agent's pod bridge, kube-proxy's `--detect-local-mode=BridgeInterface`).
    FromPods(Box<Rule>),
    /// `drop`: a Local traffic policy with no endpoint on this node.
    Drop,
}

impl Rule {
    fn render(&self, out: &mut String) {
        match self {
            Self::MarkForMasquerade => out.push_str("jump mark-for-masquerade"),
            Self::Goto(chain) => {
                let _ = write!(out, "goto {chain}");
            }
            Self::Sticky { set, to, protocol } => {
                let ip = Family::of(to.ip()).nft();
                let _ = write!(
                    out,
                    "{ip} saddr @{set} update @{set} {{ {ip} saddr }} meta l4proto {} dnat to {to}",
                    protocol.as_str()
                );
            }
            Self::Pick {
                of,
                to,
                protocol,
                affinity,
            } => {
                if *of > 1 {
                    let _ = write!(out, "numgen random mod {of} 0 ");
                }
                if let Some(set) = affinity {
                    let ip = Family::of(to.ip()).nft();
                    let _ = write!(out, "update @{set} {{ {ip} saddr }} ");
                }
                let _ = write!(out, "meta l4proto {} dnat to {to}", protocol.as_str());
            }
            Self::FromNode(rule) => {
                out.push_str("fib saddr type local ");
                rule.render(out);
            }
            Self::FromPods(rule) => {
                let _ = write!(out, "iifname \"{POD_BRIDGE}\" ");
                rule.render(out);
            }
            Self::Drop => out.push_str("drop"),
        }
    }
}

/// What one Service owns in the table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ServiceRules {
    pub chains: BTreeMap<String, Vec<Rule>>,
    /// (map, key) → verdict.
    pub elements: BTreeMap<(&'static str, String), String>,
    /// Affinity set → timeout in seconds.
    pub sets: BTreeMap<String, u32>,
    pub hairpin: BTreeSet<IpAddr>,
}

/// How external traffic is treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum External {
    /// Masqueraded (kernel mode: the endpoint may answer on another path).
    Masquerade,
    /// Left alone (userspace mode: the proxy terminates the connection).
    Keep,
}

/// The rules for all ports of one Service.
pub(crate) fn service_rules(ports: &[ServicePort], external: External) -> ServiceRules {
    let mut rules = ServiceRules::default();
    for port in ports {
        add_port(&mut rules, port, external);
    }
    rules
}

fn add_port(rules: &mut ServiceRules, port: &ServicePort, external: External) {
    let id = port.id();
    let protocol = port.protocol.as_str();
    let key = |ip: IpAddr, number: u16| format!("{ip} . {protocol} . {number}");
    let addresses = std::iter::once((CLUSTER_IPS, port.cluster_ip))
        .chain(port.external_ips.iter().map(|ip| (EXTERNAL_IPS, *ip)))
        .chain(
            port.load_balancer_ips
                .iter()
                .map(|ip| (LOAD_BALANCER_IPS, *ip)),
        );
    if port.endpoints.is_empty() {
        for (_, ip) in addresses {
            rules.elements.insert(
                (NO_ENDPOINT_SERVICES, key(ip, port.port)),
                format!("goto {REJECT}"),
            );
        }
        if let Some(node_port) = port.node_port {
            rules.elements.insert(
                (NO_ENDPOINT_NODE_PORTS, format!("{protocol} . {node_port}")),
                format!("goto {REJECT}"),
            );
        }
        return;
    }
    let svc = format!("svc-{id}");
    let chain = pick_chain(rules, port, &id, &port.endpoints, "");
    rules.chains.insert(svc.clone(), chain);
    // This node's endpoints, for Local traffic policies; none drops.
    let local = format!("local-{id}");
    let wants_local = port.internal_local || (port.external_local && port.is_external());
    let local_verdict = match (wants_local, port.local_endpoints.is_empty()) {
        (false, _) => None,
        (true, true) => Some("drop".to_owned()),
        (true, false) => {
            let chain = pick_chain(rules, port, &id, &port.local_endpoints, "local/");
            rules.chains.insert(local.clone(), chain);
            Some(format!("goto {local}"))
        }
    };
    let internal = match &local_verdict {
        Some(verdict) if port.internal_local => verdict.clone(),
        _ => format!("goto {svc}"),
    };
    let external = if !port.is_external() || external == External::Keep {
        format!("goto {svc}")
    } else {
        let ext = format!("ext-{id}");
        let chain = match &local_verdict {
            // The client's address is kept: only this node's endpoints,
            // no masquerade. This node's pods and the node itself still
            // reach every endpoint (the node's connections masqueraded),
            // as with kube-proxy.
            Some(verdict) if port.external_local => vec![
                Rule::FromPods(Box::new(Rule::Goto(svc.clone()))),
                Rule::FromNode(Box::new(Rule::MarkForMasquerade)),
                Rule::FromNode(Box::new(Rule::Goto(svc.clone()))),
                match verdict.strip_prefix("goto ") {
                    Some(chain) => Rule::Goto(chain.to_owned()),
                    None => Rule::Drop,
                },
            ],
            _ => vec![Rule::MarkForMasquerade, Rule::Goto(svc.clone())],
        };
        rules.chains.insert(ext.clone(), chain);
        format!("goto {ext}")
    };
    for (map, ip) in addresses {
        let verdict = if map == CLUSTER_IPS {
            &internal
        } else {
            &external
        };
        rules
            .elements
            .insert((map, key(ip, port.port)), verdict.clone());
    }
    if let Some(node_port) = port.node_port {
        rules
            .elements
            .insert((NODE_PORTS, format!("{protocol} . {node_port}")), external);
    }
}

/// A chain that picks one of `endpoints` (sticky first, with affinity);
/// `scope` keeps the affinity sets of the local chain apart.
fn pick_chain(
    rules: &mut ServiceRules,
    port: &ServicePort,
    id: &str,
    endpoints: &[SocketAddr],
    scope: &str,
) -> Vec<Rule> {
    let mut chain = Vec::new();
    let timeout = port.affinity.unwrap_or_default();
    // nft names take letters, digits and `/-_.` only: an IPv6 address's
    // colons become `_` (no address has one, so names stay distinct).
    let affinity_set = |to: &SocketAddr| {
        let ip = to.ip().to_string().replace(':', "_");
        format!("aff-{id}/{scope}{ip}/{}/{timeout}", to.port())
    };
    if port.affinity.is_some() {
        for to in endpoints {
            let set = affinity_set(to);
            rules.sets.insert(set.clone(), timeout);
            chain.push(Rule::Sticky {
                set,
                to: *to,
                protocol: port.protocol,
            });
        }
    }
    let n = endpoints.len();
    for (i, to) in endpoints.iter().enumerate() {
        chain.push(Rule::Pick {
            of: n - i,
            to: *to,
            protocol: port.protocol,
            affinity: port.affinity.map(|_| affinity_set(to)),
        });
        rules.hairpin.insert(to.ip());
    }
    chain
}

/// `add rule ip portal CHAIN RULE` lines for a chain's rules.
pub(crate) fn render_rules(out: &mut String, table: &str, chain: &str, rules: &[Rule]) {
    for rule in rules {
        let _ = write!(out, "add rule {table} {chain} ");
        rule.render(out);
        out.push('\n');
    }
}

/// An affinity set: client addresses of `family` remembered for `timeout`.
pub(crate) fn affinity_set_type(family: Family, timeout: u32) -> String {
    format!(
        "{{ type {} ; flags dynamic,timeout ; timeout {timeout}s ; }}",
        family.addr_type()
    )
}

/// The table's fixed objects: hooks, dispatch chains, maps, hairpin set.
/// Every statement is idempotent (`add`), and the chains are flushed and
/// refilled, so applying it over an existing table changes nothing.
pub(crate) fn render_base(out: &mut String, family: Family) {
    let table = table(family);
    let address = format!("{} . inet_proto . inet_service", family.addr_type());
    let maps: [(&str, &str); 6] = [
        (CLUSTER_IPS, &address),
        (EXTERNAL_IPS, &address),
        (LOAD_BALANCER_IPS, &address),
        (NODE_PORTS, "inet_proto . inet_service"),
        (NO_ENDPOINT_SERVICES, &address),
        (NO_ENDPOINT_NODE_PORTS, "inet_proto . inet_service"),
    ];
    let _ = writeln!(out, "add table {table}");
    for (name, key) in maps {
        let _ = writeln!(out, "add map {table} {name} {{ type {key} : verdict ; }}");
        let _ = writeln!(out, "flush map {table} {name}");
    }
    let addr = family.addr_type();
    let _ = writeln!(
        out,
        "add set {table} {HAIRPIN} {{ type {addr} . {addr} ; }}"
    );
    let _ = writeln!(out, "flush set {table} {HAIRPIN}");
    for (name, hook, rules) in base(family) {
        if hook.is_empty() {
            let _ = writeln!(out, "add chain {table} {name}");
        } else {
            let _ = writeln!(out, "add chain {table} {name} {{ {hook} }}");
        }
        let _ = writeln!(out, "flush chain {table} {name}");
        for rule in rules {
            let _ = writeln!(out, "add rule {table} {name} {rule}");
        }
    }
}

/// The fixed chains: name, hook (empty: a regular chain), rules. Regular
/// chains come first: a rule may only jump to a chain that exists.
fn base(family: Family) -> [(&'static str, &'static str, Vec<String>); 10] {
    let ip = family.nft();
    let loopback = family.loopback();
    [
        (
            MARK_FOR_MASQUERADE,
            "",
            vec!["meta mark set meta mark | 0x4000".into()],
        ),
        (REJECT, "", vec!["reject".into()]),
        (
            "endpoints-check",
            "",
            vec![format!("{ip} daddr . meta l4proto . th dport vmap @no-endpoint-services")],
        ),
        (
            "services",
            "",
            vec![
                format!("{ip} daddr . meta l4proto . th dport vmap @cluster-ips"),
                format!("{ip} daddr . meta l4proto . th dport vmap @external-ips"),
                format!("{ip} daddr . meta l4proto . th dport vmap @load-balancer-ips"),
                format!("fib daddr type local {ip} daddr != {loopback} meta l4proto . th dport vmap @node-ports"),
            ],
        ),
        (
            "nat-prerouting",
            "type nat hook prerouting priority dstnat ;",
            vec!["jump services".into()],
        ),
        (
            "nat-output",
            "type nat hook output priority -100 ;",
            vec!["jump services".into()],
        ),
        (
            "nat-postrouting",
            "type nat hook postrouting priority srcnat ;",
            vec![
                "meta mark & 0x4000 == 0x4000 meta mark set meta mark ^ 0x4000 masquerade fully-random".into(),
                format!("ct status dnat {ip} saddr . {ip} daddr @hairpin masquerade fully-random"),
            ],
        ),
        (
            "filter-forward",
            "type filter hook forward priority filter ;",
            vec!["ct state new jump endpoints-check".into()],
        ),
        (
            "filter-output",
            "type filter hook output priority filter ;",
            vec!["ct state new jump endpoints-check".into()],
        ),
        (
            "filter-input",
            "type filter hook input priority filter ;",
            vec!["ct state new meta l4proto . th dport vmap @no-endpoint-node-ports".into()],
        ),
    ]
}

/// Names of the fixed chains (never deleted as stale).
pub(crate) const BASE_CHAINS: [&str; 10] = [
    MARK_FOR_MASQUERADE,
    REJECT,
    "endpoints-check",
    "services",
    "nat-prerouting",
    "nat-output",
    "nat-postrouting",
    "filter-forward",
    "filter-output",
    "filter-input",
];
