//! What the proxy programs, as plain data: a Service's ports joined with
//! the ready endpoints of its EndpointSlices. Pure functions of the API
//! objects, so every backend and test sees the same model.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

pub(crate) use portal_client::labels::SERVICE_NAME as SERVICE_NAME_LABEL;

/// Default `sessionAffinityConfig.clientIP.timeoutSeconds` (S12).
const DEFAULT_AFFINITY_SECONDS: u32 = 10_800;

/// `namespace/name` of a Service.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    pub namespace: String,
    pub name: String,
}

impl ServiceKey {
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    /// `TCP`/`UDP` (the API's spelling); SCTP and others are not proxied.
    fn parse(api: Option<&str>) -> Option<Self> {
        match api.unwrap_or("TCP") {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            _ => None,
        }
    }

    /// nftables' and conntrack's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        }
    }
}

/// An address family: the kernel proxy keeps a table for each (`ip portal`,
/// `ip6 portal`), as kube-proxy runs a proxier per family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: IpAddr) -> Self {
        if ip.is_ipv4() {
            Self::V4
        } else {
            Self::V6
        }
    }

    /// nftables' family (`ip`, `ip6`), also its address match (`ip daddr`).
    pub fn nft(self) -> &'static str {
        match self {
            Self::V4 => "ip",
            Self::V6 => "ip6",
        }
    }

    /// nftables' address type in maps and sets.
    pub fn addr_type(self) -> &'static str {
        match self {
            Self::V4 => "ipv4_addr",
            Self::V6 => "ipv6_addr",
        }
    }

    /// The loopback range node ports are not served on.
    pub fn loopback(self) -> &'static str {
        match self {
            Self::V4 => "127.0.0.0/8",
            Self::V6 => "::1",
        }
    }

    /// An EndpointSlice's `addressType` for this family.
    fn address_type(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }
}

/// One port of one Service at one of its cluster IPs (a dual-stack
/// Service has a port of each family), with everything that reaches it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub service: ServiceKey,
    /// The port's name, or its number when unnamed (single-port Services).
    pub port_name: String,
    pub protocol: Protocol,
    pub cluster_ip: IpAddr,
    pub port: u16,
    pub node_port: Option<u16>,
    /// Those of the cluster IP's family.
    pub external_ips: Vec<IpAddr>,
    pub load_balancer_ips: Vec<IpAddr>,
    /// ClientIP affinity timeout in seconds; `None` spreads every connection.
    pub affinity: Option<u32>,
    /// Ready endpoints of the cluster IP's family, sorted and without
    /// duplicates.
    pub endpoints: Vec<SocketAddr>,
    /// Those of `endpoints` on this node (the proxy's `--node-name`).
    pub local_endpoints: Vec<SocketAddr>,
    /// `internalTrafficPolicy: Local`: cluster-IP traffic goes to this
    /// node's endpoints only, and is dropped when there are none.
    pub internal_local: bool,
    /// `externalTrafficPolicy: Local`: node-port, external and
    /// load-balancer traffic goes to this node's endpoints only, keeping
    /// the client's address (dropped when there are none here).
    pub external_local: bool,
    /// Where this node answers load balancers' health checks for the
    /// Service (`healthCheckNodePort`, with `externalTrafficPolicy: Local`).
    pub health_check_node_port: Option<u16>,
}

impl ServicePort {
    pub fn family(&self) -> Family {
        Family::of(self.cluster_ip)
    }

    /// `namespace/name/protocol/port`: unique per Service port, and the
    /// stem of the names of its chains and sets.
    pub fn id(&self) -> String {
        format!(
            "{}/{}/{}",
            self.service,
            self.protocol.as_str(),
            self.port_name
        )
    }

    /// Reached from outside the cluster IP: node port, external or
    /// load-balancer address.
    pub fn is_external(&self) -> bool {
        self.node_port.is_some()
            || !self.external_ips.is_empty()
            || !self.load_balancer_ips.is_empty()
    }
}

/// A Service's proxied ports, without endpoints yet: each port at each
/// cluster IP (one per family); none for headless (P4) and ExternalName
/// Services.
pub fn service_ports(key: &ServiceKey, service: &Service) -> Vec<ServicePort> {
    let Some(spec) = &service.spec else {
        return Vec::new();
    };
    if spec.type_.as_deref() == Some("ExternalName") {
        return Vec::new();
    }
    let mut cluster_ips: Vec<IpAddr> = Vec::new();
    for ip in spec
        .cluster_ips
        .iter()
        .flatten()
        .chain(spec.cluster_ip.iter())
        .filter_map(|ip| ip.parse::<IpAddr>().ok())
    {
        if !cluster_ips
            .iter()
            .any(|known| Family::of(*known) == Family::of(ip))
        {
            cluster_ips.push(ip);
        }
    }
    let parse = |ips: &mut dyn Iterator<Item = &String>| -> Vec<IpAddr> {
        let mut ips: Vec<IpAddr> = ips.filter_map(|ip| ip.parse().ok()).collect();
        ips.sort_unstable();
        ips.dedup();
        ips
    };
    let external_ips = parse(&mut spec.external_ips.iter().flatten());
    let load_balancer_ips = parse(
        &mut service
            .status
            .iter()
            .filter_map(|s| s.load_balancer.as_ref())
            .flat_map(|lb| lb.ingress.iter().flatten())
            .filter_map(|ingress| ingress.ip.as_ref()),
    );
    let affinity = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u32::try_from(t).ok())
            .filter(|t| *t > 0)
            .unwrap_or(DEFAULT_AFFINITY_SECONDS)
    });
    let internal_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    let external_local = spec.external_traffic_policy.as_deref() == Some("Local");
    let health_check_node_port = spec
        .health_check_node_port
        .filter(|_| external_local)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0);
    let of_family = |ips: &[IpAddr], family: Family| -> Vec<IpAddr> {
        ips.iter()
            .copied()
            .filter(|ip| Family::of(*ip) == family)
            .collect()
    };
    let ports = spec.ports.iter().flatten();
    cluster_ips
        .iter()
        .flat_map(|cluster_ip| ports.clone().map(move |p| (*cluster_ip, p)))
        .filter_map(|(cluster_ip, p)| {
            let family = Family::of(cluster_ip);
            Some(ServicePort {
                service: key.clone(),
                port_name: p
                    .name
                    .clone()
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| p.port.to_string()),
                protocol: Protocol::parse(p.protocol.as_deref())?,
                cluster_ip,
                port: u16::try_from(p.port).ok()?,
                node_port: p
                    .node_port
                    .and_then(|n| u16::try_from(n).ok())
                    .filter(|n| *n > 0),
                external_ips: of_family(&external_ips, family),
                load_balancer_ips: of_family(&load_balancer_ips, family),
                affinity,
                endpoints: Vec::new(),
                local_endpoints: Vec::new(),
                internal_local,
                external_local,
                health_check_node_port,
            })
        })
        .collect()
}

/// The Service an EndpointSlice belongs to, if any.
pub fn slice_service(slice: &EndpointSlice) -> Option<ServiceKey> {
    let name = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    Some(ServiceKey::new(
        slice.metadata.namespace.as_deref().unwrap_or_default(),
        name,
    ))
}

/// Which endpoints of a slice are wanted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wanted {
    Ready,
    /// Terminating but still serving: used only when none is ready
    /// (KEP-1669), so a Service whose pods are all stopping keeps serving.
    ServingTerminating,
}

/// One endpoint of a slice for one Service port, with what topology needs.
#[derive(Clone, Debug)]
struct Candidate {
    address: SocketAddr,
    /// On this proxy's node.
    local: bool,
    zone_hints: Vec<String>,
    node_hints: Vec<String>,
}

/// A slice's wanted endpoints for one Service port (of its family),
/// matched by port name and protocol like kube-proxy (an unnamed Service
/// port matches the slice's unnamed port).
fn slice_endpoints(
    slice: &EndpointSlice,
    port: &ServicePort,
    unnamed: bool,
    wanted: Wanted,
    node: Option<&str>,
) -> Vec<Candidate> {
    let family = port.family();
    if slice.address_type != family.address_type() {
        return Vec::new();
    }
    let wanted_name = if unnamed { "" } else { port.port_name.as_str() };
    let Some(number) = slice.ports.iter().flatten().find_map(|p| {
        let name = p.name.as_deref().unwrap_or("");
        let protocol = Protocol::parse(p.protocol.as_deref())?;
        (name == wanted_name && protocol == port.protocol)
            .then_some(p.port)
            .flatten()
    }) else {
        return Vec::new();
    };
    let Ok(number) = u16::try_from(number) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for endpoint in &slice.endpoints {
        let conditions = endpoint.conditions.as_ref();
        // Unset means ready, and serving when ready (discovery.k8s.io/v1).
        let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
        let serving = conditions.and_then(|c| c.serving).unwrap_or(ready);
        let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
        let take = match wanted {
            Wanted::Ready => ready,
            Wanted::ServingTerminating => serving && terminating,
        };
        if !take {
            continue;
        }
        let local = node.is_some() && endpoint.node_name.as_deref() == node;
        let hints = endpoint.hints.as_ref();
        let zone_hints: Vec<String> = hints
            .and_then(|h| h.for_zones.as_ref())
            .into_iter()
            .flatten()
            .map(|z| z.name.clone())
            .collect();
        let node_hints: Vec<String> = hints
            .and_then(|h| h.for_nodes.as_ref())
            .into_iter()
            .flatten()
            .map(|n| n.name.clone())
            .collect();
        for address in &endpoint.addresses {
            let Ok(ip) = address.parse::<IpAddr>() else {
                continue;
            };
            if Family::of(ip) == family {
                found.push(Candidate {
                    address: SocketAddr::new(ip, number),
                    local,
                    zone_hints: zone_hints.clone(),
                    node_hints: node_hints.clone(),
                });
            }
        }
    }
    found
}

/// Where this proxy runs, for local endpoints and topology hints.
#[derive(Clone, Copy, Debug, Default)]
pub struct Topology<'a> {
    pub node: Option<&'a str>,
    /// The node's `topology.kubernetes.io/zone`.
    pub zone: Option<&'a str>,
}

/// The ready endpoints this node sends cluster traffic to, as kube-proxy's
/// `topologyModeFromHints`: when every one has a node hint and one is for
/// this node, those for this node; else when every one has a zone hint and
/// one is for this node's zone, those for the zone; else all of them.
fn by_topology(ready: &[Candidate], topology: &Topology<'_>) -> Vec<SocketAddr> {
    let all_have =
        |hints: fn(&Candidate) -> &Vec<String>| ready.iter().all(|c| !hints(c).is_empty());
    let for_me = |hints: fn(&Candidate) -> &Vec<String>, me: Option<&str>| -> Vec<SocketAddr> {
        ready
            .iter()
            .filter(|c| me.is_some_and(|me| hints(c).iter().any(|h| h == me)))
            .map(|c| c.address)
            .collect()
    };
    if !ready.is_empty() && all_have(|c| &c.node_hints) {
        let mine = for_me(|c| &c.node_hints, topology.node);
        if !mine.is_empty() {
            return mine;
        }
    }
    if !ready.is_empty() && all_have(|c| &c.zone_hints) {
        let mine = for_me(|c| &c.zone_hints, topology.zone);
        if !mine.is_empty() {
            return mine;
        }
    }
    ready.iter().map(|c| c.address).collect()
}

/// A Service's ports joined with the ready endpoints of its slices;
/// `topology` (where this proxy runs) tells which are local and which
/// topology hints are for it.
pub fn join<'a>(
    key: &ServiceKey,
    service: &Service,
    slices: impl Iterator<Item = &'a EndpointSlice> + Clone,
    topology: &Topology<'_>,
) -> Vec<ServicePort> {
    let named_in_spec = |name: &str| {
        service
            .spec
            .iter()
            .flat_map(|s| s.ports.iter().flatten())
            .any(|p| p.name.as_deref() == Some(name))
    };
    let mut ports = service_ports(key, service);
    for port in &mut ports {
        let unnamed = !named_in_spec(&port.port_name);
        let pick = |wanted| -> Vec<Candidate> {
            let mut found: Vec<Candidate> = slices
                .clone()
                .flat_map(|slice| slice_endpoints(slice, port, unnamed, wanted, topology.node))
                .collect();
            found.sort_by_key(|c| c.address);
            found.dedup_by_key(|c| c.address);
            found
        };
        let ready = pick(Wanted::Ready);
        // Topology narrows ready endpoints only; with none ready, the
        // serving terminating ones anywhere.
        let (all, mut cluster) = if ready.is_empty() {
            let stopping = pick(Wanted::ServingTerminating);
            let addresses = stopping.iter().map(|c| c.address).collect();
            (stopping, addresses)
        } else {
            let cluster = by_topology(&ready, topology);
            (ready, cluster)
        };
        cluster.sort_unstable();
        port.local_endpoints = all.iter().filter(|c| c.local).map(|c| c.address).collect();
        port.endpoints = cluster;
    }
    ports
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(spec: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": spec,
        }))
        .unwrap_or_default()
    }

    fn slice(ports: serde_json::Value, endpoints: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-x", "namespace": "default", "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4",
            "ports": ports,
            "endpoints": endpoints,
        }))
        .unwrap_or_else(|_| EndpointSlice {
            address_type: String::new(),
            endpoints: Vec::new(),
            metadata: Default::default(),
            ports: None,
        })
    }

    fn key() -> ServiceKey {
        ServiceKey::new("default", "web")
    }

    #[test]
    fn ports_join_the_ready_endpoints_of_every_slice_by_name_and_protocol() {
        let web = service(serde_json::json!({
            "clusterIP": "10.96.0.20",
            "type": "LoadBalancer",
            "externalIPs": ["192.0.2.10"],
            "sessionAffinity": "ClientIP",
            "ports": [
                {"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080},
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "sctp", "port": 9, "protocol": "SCTP"},
            ],
        }));
        let mut web = web;
        web.status = serde_json::from_value(
            serde_json::json!({"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}]}}),
        )
        .ok();
        // A named target port may resolve to other numbers on other pods.
        let a = slice(
            serde_json::json!([{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "dns", "port": 5353, "protocol": "UDP"}]),
            serde_json::json!([
                {"addresses": ["10.244.0.5"], "conditions": {"ready": true}},
                {"addresses": ["10.244.0.6"], "conditions": {"ready": false}},
                {"addresses": ["10.244.0.7"]},
            ]),
        );
        let b = slice(
            serde_json::json!([{"name": "http", "port": 9090, "protocol": "TCP"}]),
            serde_json::json!([{"addresses": ["10.244.0.8"], "conditions": {"ready": true}}]),
        );
        let ports = join(&key(), &web, [&a, &b].into_iter(), &Topology::default());
        assert_eq!(ports.len(), 2, "SCTP is not proxied");
        let http = &ports[0];
        assert_eq!(http.id(), "default/web/tcp/http");
        assert_eq!(
            http.endpoints,
            vec![
                "10.244.0.5:8080".parse::<SocketAddr>().unwrap(),
                "10.244.0.7:8080".parse::<SocketAddr>().unwrap(),
                "10.244.0.8:9090".parse::<SocketAddr>().unwrap(),
            ]
        );
        assert_eq!(http.node_port, Some(30080));
        assert_eq!(
            http.external_ips,
            vec!["192.0.2.10".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            http.load_balancer_ips,
            vec!["198.51.100.1".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(http.affinity, Some(DEFAULT_AFFINITY_SECONDS));
        let dns = &ports[1];
        assert_eq!((dns.protocol, dns.endpoints.len()), (Protocol::Udp, 2));
    }

    #[test]
    fn an_unnamed_port_matches_the_unnamed_slice_port() {
        let web = service(serde_json::json!({"clusterIP": "10.96.0.20", "ports": [{"port": 80}]}));
        let s = slice(
            serde_json::json!([{"port": 8080, "protocol": "TCP"}]),
            serde_json::json!([{"addresses": ["10.244.0.5"]}]),
        );
        let ports = join(&key(), &web, std::iter::once(&s), &Topology::default());
        assert_eq!(ports[0].id(), "default/web/tcp/80");
        assert_eq!(ports[0].endpoints.len(), 1);
    }

    #[test]
    fn serving_terminating_endpoints_only_when_none_is_ready() {
        let web = service(serde_json::json!({"clusterIP": "10.96.0.20", "ports": [{"port": 80}]}));
        let stopping = serde_json::json!({"addresses": ["10.244.0.5"], "conditions": {"ready": false, "serving": true, "terminating": true}});
        let gone = serde_json::json!({"addresses": ["10.244.0.6"], "conditions": {"ready": false, "serving": false, "terminating": true}});
        let ready = serde_json::json!({"addresses": ["10.244.0.7"], "conditions": {"ready": true, "serving": true, "terminating": false}});
        let ports = serde_json::json!([{"port": 8080, "protocol": "TCP"}]);
        let only_stopping = slice(ports.clone(), serde_json::json!([stopping, gone]));
        let addresses = |s: &EndpointSlice| -> Vec<String> {
            join(&key(), &web, std::iter::once(s), &Topology::default())[0]
                .endpoints
                .iter()
                .map(|e| e.ip().to_string())
                .collect()
        };
        assert_eq!(addresses(&only_stopping), ["10.244.0.5"]);
        let mixed = slice(ports, serde_json::json!([stopping, ready]));
        assert_eq!(addresses(&mixed), ["10.244.0.7"]);
    }

    #[test]
    fn traffic_policies_know_this_nodes_endpoints() {
        let web = service(serde_json::json!({
            "clusterIP": "10.96.0.20", "type": "LoadBalancer", "healthCheckNodePort": 32000,
            "externalTrafficPolicy": "Local", "internalTrafficPolicy": "Local",
            "ports": [{"port": 80, "nodePort": 30080}],
        }));
        let s = slice(
            serde_json::json!([{"port": 8080, "protocol": "TCP"}]),
            serde_json::json!([
                {"addresses": ["10.244.1.5"], "nodeName": "n1"},
                {"addresses": ["10.244.2.5"], "nodeName": "n2"},
            ]),
        );
        let port = &join(
            &key(),
            &web,
            std::iter::once(&s),
            &Topology {
                node: Some("n2"),
                zone: None,
            },
        )[0];
        assert_eq!(port.endpoints.len(), 2);
        assert_eq!(
            port.local_endpoints,
            vec!["10.244.2.5:8080".parse::<SocketAddr>().unwrap()]
        );
        assert!(port.internal_local && port.external_local);
        assert_eq!(port.health_check_node_port, Some(32000));
        let cluster = service(
            serde_json::json!({"clusterIP": "10.96.0.20", "healthCheckNodePort": 32000, "ports": [{"port": 80}]}),
        );
        let port = &join(&key(), &cluster, std::iter::once(&s), &Topology::default())[0];
        assert!(port.local_endpoints.is_empty() && !port.internal_local && !port.external_local);
        assert_eq!(port.health_check_node_port, None);
    }

    #[test]
    fn a_dual_stack_service_is_proxied_at_each_address_with_endpoints_of_its_family() {
        let dual = service(serde_json::json!({
            "clusterIP": "fd00::20", "clusterIPs": ["fd00::20", "10.96.0.20"],
            "ipFamilies": ["IPv6", "IPv4"], "externalIPs": ["192.0.2.1", "2001:db8::1"],
            "ports": [{"name": "http", "port": 80}]
        }));
        let v4 = slice(
            serde_json::json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
            serde_json::json!([{"addresses": ["10.244.0.5"]}]),
        );
        let mut v6 = slice(
            serde_json::json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
            serde_json::json!([{"addresses": ["fd00:10:244::5"]}]),
        );
        v6.address_type = "IPv6".into();
        let ports = join(&key(), &dual, [&v4, &v6].into_iter(), &Topology::default());
        let seen: Vec<(String, Vec<String>, Vec<String>)> = ports
            .iter()
            .map(|p| {
                (
                    p.cluster_ip.to_string(),
                    p.external_ips.iter().map(ToString::to_string).collect(),
                    p.endpoints.iter().map(ToString::to_string).collect(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (
                    "fd00::20".into(),
                    vec!["2001:db8::1".into()],
                    vec!["[fd00:10:244::5]:8080".into()]
                ),
                (
                    "10.96.0.20".into(),
                    vec!["192.0.2.1".into()],
                    vec!["10.244.0.5:8080".into()]
                ),
            ]
        );
        assert_eq!(
            (ports[0].family(), ports[1].family()),
            (Family::V6, Family::V4)
        );
        assert_eq!(ports[0].id(), ports[1].id(), "one name, in two tables");
    }

    #[test]
    fn headless_and_external_name_services_are_not_proxied() {
        let headless = service(serde_json::json!({"clusterIP": "None", "ports": [{"port": 80}]}));
        assert!(service_ports(&key(), &headless).is_empty());
        let external =
            service(serde_json::json!({"type": "ExternalName", "externalName": "example.com"}));
        assert!(service_ports(&key(), &external).is_empty());
    }

    #[test]
    fn topology_hints_narrow_cluster_traffic_to_this_zone_or_node() {
        let web = service(serde_json::json!({"clusterIP": "10.96.0.20", "ports": [{"port": 80}]}));
        let hinted = |endpoints: serde_json::Value| {
            slice(
                serde_json::json!([{"port": 8080, "protocol": "TCP"}]),
                endpoints,
            )
        };
        let s = hinted(serde_json::json!([
            {"addresses": ["10.244.1.5"], "nodeName": "n1", "zone": "east", "hints": {"forZones": [{"name": "east"}]}},
            {"addresses": ["10.244.2.5"], "nodeName": "n2", "zone": "west", "hints": {"forZones": [{"name": "west"}]}},
            {"addresses": ["10.244.3.5"], "nodeName": "n3", "zone": "west", "hints": {"forZones": [{"name": "west"}]}},
        ]));
        let cluster = |topology: Topology<'_>, s: &EndpointSlice| -> Vec<String> {
            join(&key(), &web, std::iter::once(s), &topology)[0]
                .endpoints
                .iter()
                .map(|e| e.ip().to_string())
                .collect()
        };
        let west = Topology {
            node: Some("n2"),
            zone: Some("west"),
        };
        assert_eq!(cluster(west, &s), ["10.244.2.5", "10.244.3.5"]);
        // No endpoint for this zone, or no zone: every endpoint.
        assert_eq!(
            cluster(
                Topology {
                    node: Some("n9"),
                    zone: Some("north")
                },
                &s
            )
            .len(),
            3
        );
        assert_eq!(cluster(Topology::default(), &s).len(), 3);
        // The local endpoints are still all of this node's.
        let port = &join(&key(), &web, std::iter::once(&s), &west)[0];
        assert_eq!(port.local_endpoints.len(), 1);
        // One ready endpoint without a hint: hints are ignored.
        let partial = hinted(serde_json::json!([
            {"addresses": ["10.244.1.5"], "zone": "east", "hints": {"forZones": [{"name": "east"}]}},
            {"addresses": ["10.244.2.5"], "zone": "west"},
        ]));
        assert_eq!(
            cluster(
                Topology {
                    node: None,
                    zone: Some("east")
                },
                &partial
            )
            .len(),
            2
        );
        // Node hints (PreferSameNode) come before zone hints.
        let nodes = hinted(serde_json::json!([
            {"addresses": ["10.244.1.5"], "nodeName": "n1", "hints": {"forZones": [{"name": "east"}], "forNodes": [{"name": "n1"}]}},
            {"addresses": ["10.244.1.6"], "nodeName": "n4", "hints": {"forZones": [{"name": "east"}], "forNodes": [{"name": "n4"}]}},
        ]));
        assert_eq!(
            cluster(
                Topology {
                    node: Some("n1"),
                    zone: Some("east")
                },
                &nodes
            ),
            ["10.244.1.5"]
        );
        assert_eq!(
            cluster(
                Topology {
                    node: Some("n7"),
                    zone: Some("east")
                },
                &nodes
            )
            .len(),
            2
        );
    }
}
