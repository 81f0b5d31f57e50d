//! What a Service's Endpoints and EndpointSlices should say, from the
//! Service and the pods it selects (SPEC E1, E2, S2). Pure functions: the
//! controller compares this with what is stored and writes the difference.

use std::collections::BTreeMap;
use std::net::IpAddr;

use portal_api::cidr::IpFamily;

use super::topology::{self, Disabled, ZoneShares};

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, ObjectReference, Pod, Service,
};
use k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointHints, EndpointPort as SlicePort, ForNode, ForZone,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

pub use portal_client::labels::{
    MANAGED_BY as MANAGED_BY_LABEL, SERVICE_NAME as SERVICE_NAME_LABEL,
    SKIP_MIRROR as SKIP_MIRROR_LABEL, TRIGGER_TIME as TRIGGER_TIME_ANNOTATION,
};
pub const MANAGED_BY: &str = "endpointslice-controller.k8s.io";
/// When the change these endpoints reflect happened (E2).
/// Most endpoints in one EndpointSlice.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;

/// One selected pod as an endpoint: its addresses, readiness and ports.
#[derive(Clone, Debug, PartialEq)]
pub struct PodEndpoint {
    /// The pod's primary address (`status.podIP`).
    pub ip: String,
    /// Every address of the pod (`status.podIPs`; two when dual-stack).
    pub ips: Vec<String>,
    /// Ready and not terminating.
    pub ready: bool,
    /// The pod's own readiness, terminating or not (KEP-1672's `serving`).
    pub serving: bool,
    pub terminating: bool,
    pub node_name: Option<String>,
    /// Its node's `topology.kubernetes.io/zone`.
    pub zone: Option<String>,
    pub hostname: Option<String>,
    pub target_ref: ObjectReference,
    /// The Service's ports resolved for this pod (S2), in Service order.
    pub ports: Vec<EndpointPort>,
}

fn labels_match(selector: &BTreeMap<String, String>, pod: &Pod) -> bool {
    let labels = pod.metadata.labels.as_ref();
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// Whether `service` selects `pod` (same namespace, every selector label).
pub fn selects(service: &Service, pod: &Pod) -> bool {
    let Some(selector) = service
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .filter(|s| !s.is_empty())
    else {
        return false;
    };
    service.metadata.namespace == pod.metadata.namespace && labels_match(selector, pod)
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// The port number a Service port's `targetPort` means in `pod`: a number
/// as is, a name looked up among the pod's container ports.
fn resolve_port(target: Option<&IntOrString>, port: i32, protocol: &str, pod: &Pod) -> Option<i32> {
    match target {
        None => Some(port),
        Some(IntOrString::Int(0)) => Some(port),
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(name)) => pod.spec.as_ref()?.containers.iter().find_map(|c| {
            c.ports
                .as_ref()?
                .iter()
                .find(|p| {
                    p.name.as_deref() == Some(name.as_str())
                        && p.protocol.as_deref().unwrap_or("TCP") == protocol
                })
                .map(|p| p.container_port)
        }),
    }
}

/// The endpoint a pod contributes, if it has an address and is not gone.
pub fn pod_endpoint(service: &Service, pod: &Pod) -> Option<PodEndpoint> {
    let ip = pod
        .status
        .as_ref()?
        .pod_ip
        .clone()
        .filter(|ip| !ip.is_empty())?;
    let listed: Vec<String> = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ips.as_ref())
        .map(|ips| ips.iter().map(|i| i.ip.clone()).collect())
        .unwrap_or_default();
    let ips = if listed.is_empty() {
        vec![ip.clone()]
    } else {
        listed
    };
    let spec = service.spec.as_ref()?;
    let terminating = pod.metadata.deletion_timestamp.is_some();
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    let mut ports = Vec::new();
    for port in spec.ports.iter().flatten() {
        let protocol = port.protocol.clone().unwrap_or_else(|| "TCP".into());
        if let Some(number) = resolve_port(port.target_port.as_ref(), port.port, &protocol, pod) {
            ports.push(EndpointPort {
                name: port.name.clone(),
                port: number,
                protocol: Some(protocol),
                app_protocol: port.app_protocol.clone(),
            });
        }
    }
    let service_name = service.metadata.name.as_deref();
    let pod_spec = pod.spec.as_ref();
    let hostname = pod_spec
        .and_then(|s| s.hostname.clone())
        .filter(|_| pod_spec.and_then(|s| s.subdomain.as_deref()) == service_name);
    Some(PodEndpoint {
        ip,
        ips,
        ready: pod_ready(pod) && !terminating,
        serving: pod_ready(pod),
        terminating,
        node_name: pod_spec.and_then(|s| s.node_name.clone()),
        zone: None,
        hostname,
        target_ref: ObjectReference {
            kind: Some("Pod".into()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..ObjectReference::default()
        },
        ports,
    })
}

/// Every endpoint of `service` among `pods`, sorted by address.
pub fn endpoints_of<'a>(
    service: &Service,
    pods: impl IntoIterator<Item = &'a Pod>,
) -> Vec<PodEndpoint> {
    let mut all: Vec<PodEndpoint> = pods
        .into_iter()
        .filter(|p| selects(service, p))
        .filter_map(|p| pod_endpoint(service, p))
        .collect();
    all.sort_by(|a, b| {
        a.ip.cmp(&b.ip)
            .then_with(|| a.target_ref.name.cmp(&b.target_ref.name))
    });
    all
}

/// Which hints `trafficDistribution` asks for (the EndpointSlice
/// controller's `trafficdist`): (zone hints, node hints).
fn hints_wanted(service: &Service) -> (bool, bool) {
    match service
        .spec
        .as_ref()
        .and_then(|s| s.traffic_distribution.as_deref())
    {
        Some("PreferClose" | "PreferSameZone") => (true, false),
        Some("PreferSameNode") => (true, true),
        _ => (false, false),
    }
}

/// A ready endpoint's hints: its own zone and (PreferSameNode) node.
fn hints(endpoint: &PodEndpoint, ready: bool, wanted: (bool, bool)) -> Option<EndpointHints> {
    let (zones, nodes) = wanted;
    if !ready || !zones {
        return None;
    }
    let for_zones = endpoint.zone.clone().map(|name| vec![ForZone { name }]);
    let for_nodes = endpoint
        .node_name
        .clone()
        .filter(|_| nodes)
        .map(|name| vec![ForNode { name }]);
    (for_zones.is_some() || for_nodes.is_some()).then_some(EndpointHints {
        for_zones,
        for_nodes,
    })
}

fn publish_not_ready(service: &Service) -> bool {
    service
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false)
}

/// A Service's address families (`spec.ipFamilies`), primary first;
/// IPv4 when it names none.
pub fn families(service: &Service) -> Vec<IpFamily> {
    let named: Vec<IpFamily> = service
        .spec
        .as_ref()
        .and_then(|s| s.ip_families.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|f| IpFamily::from_name(f))
        .collect();
    if named.is_empty() {
        vec![IpFamily::Ipv4]
    } else {
        named
    }
}

/// The endpoint's address of `family`, if the pod has one.
fn address_of(endpoint: &PodEndpoint, family: IpFamily) -> Option<&String> {
    endpoint.ips.iter().find(|ip| {
        ip.parse::<IpAddr>()
            .is_ok_and(|ip| IpFamily::of(ip) == family)
    })
}

/// `subsets` of the Endpoints object: pods grouped by identical port sets,
/// each by its address of the Service's primary family (the legacy object
/// holds one family, as upstream's controller writes it).
pub fn subsets(service: &Service, endpoints: &[PodEndpoint]) -> Vec<EndpointSubset> {
    let mut groups: Vec<(Vec<EndpointPort>, EndpointSubset)> = Vec::new();
    let all_ready = publish_not_ready(service);
    let primary = families(service)[0];
    for endpoint in endpoints {
        // Terminating pods leave Endpoints (they stay in slices, marked).
        if endpoint.terminating && !all_ready {
            continue;
        }
        let Some(ip) = address_of(endpoint, primary) else {
            continue;
        };
        let address = EndpointAddress {
            ip: ip.clone(),
            hostname: endpoint.hostname.clone(),
            node_name: endpoint.node_name.clone(),
            target_ref: Some(endpoint.target_ref.clone()),
        };
        let index = match groups
            .iter()
            .position(|(ports, _)| *ports == endpoint.ports)
        {
            Some(i) => i,
            None => {
                let subset = EndpointSubset {
                    ports: Some(endpoint.ports.clone()).filter(|p| !p.is_empty()),
                    ..EndpointSubset::default()
                };
                groups.push((endpoint.ports.clone(), subset));
                groups.len() - 1
            }
        };
        let subset = &mut groups[index].1;
        let list = if endpoint.ready || all_ready {
            &mut subset.addresses
        } else {
            &mut subset.not_ready_addresses
        };
        list.get_or_insert_with(Vec::new).push(address);
    }
    groups.into_iter().map(|(_, subset)| subset).collect()
}

/// What one slice holds: its address family, ports and endpoints.
pub type SliceContent = (IpFamily, Vec<SlicePort>, Vec<Endpoint>);

/// The contents of the slices: per family of the Service and port set,
/// endpoints in chunks of at most [`MAX_ENDPOINTS_PER_SLICE`], in a stable
/// order so updates touch few slices. A family without endpoints (none
/// of the pods has an address of it) has one empty slice, as upstream's
/// placeholder per address type.
///
/// Hints: a Service in `topology-mode: Auto` gets [`topology`]'s, from the
/// zones' `shares` of CPU (the annotation wins, as upstream); otherwise
/// its `trafficDistribution` says.
pub fn slice_contents(service: &Service, endpoints: &[PodEndpoint], shares: &ZoneShares) -> Wanted {
    let auto = topology::auto(service);
    let mut wanted = Wanted::default();
    for family in families(service) {
        let (found, outcome) = family_slices(service, endpoints, family, auto.then_some(shares));
        if let Some(outcome) = outcome {
            wanted.auto.push((family, outcome));
        }
        if found.is_empty() {
            wanted
                .slices
                .push((family, placeholder_ports(service), Vec::new()));
        }
        for (ports, entries) in found {
            wanted.slices.push((family, ports, entries));
        }
    }
    wanted
}

/// A Service's slices, and for `topology-mode: Auto` how hinting went for
/// each address type.
#[derive(Debug, Default)]
pub struct Wanted {
    pub slices: Vec<SliceContent>,
    pub auto: Vec<(IpFamily, Result<(), Disabled>)>,
}

type FamilySlices = Vec<(Vec<SlicePort>, Vec<Endpoint>)>;

fn family_slices(
    service: &Service,
    endpoints: &[PodEndpoint],
    family: IpFamily,
    auto: Option<&ZoneShares>,
) -> (FamilySlices, Option<Result<(), Disabled>>) {
    let all_ready = publish_not_ready(service);
    // `Auto` hints are given below, over all of the family's endpoints.
    let wanted = match auto {
        Some(_) => (false, false),
        None => hints_wanted(service),
    };
    let mut groups: Vec<(Vec<EndpointPort>, Vec<Endpoint>)> = Vec::new();
    for endpoint in endpoints {
        let Some(ip) = address_of(endpoint, family) else {
            continue;
        };
        let ready = endpoint.ready || all_ready;
        let entry = Endpoint {
            addresses: vec![ip.clone()],
            conditions: Some(EndpointConditions {
                ready: Some(ready),
                serving: Some(endpoint.serving || all_ready),
                terminating: Some(endpoint.terminating),
            }),
            hints: hints(endpoint, ready, wanted),
            hostname: endpoint.hostname.clone(),
            node_name: endpoint.node_name.clone(),
            zone: endpoint.zone.clone(),
            target_ref: Some(endpoint.target_ref.clone()),
            ..Endpoint::default()
        };
        match groups
            .iter_mut()
            .find(|(ports, _)| *ports == endpoint.ports)
        {
            Some((_, list)) => list.push(entry),
            None => groups.push((endpoint.ports.clone(), vec![entry])),
        }
    }
    let outcome = auto.map(|shares| {
        let mut all: Vec<&mut Endpoint> = groups
            .iter_mut()
            .flat_map(|(_, list)| list.iter_mut())
            .collect();
        topology::assign(&mut all, shares)
    });
    let mut slices = Vec::new();
    for (ports, entries) in groups {
        let slice_ports: Vec<SlicePort> = ports
            .iter()
            .map(|p| SlicePort {
                // Always present, "" for an unnamed port, as Kubernetes
                // writes it: `kubectl describe svc` dereferences it.
                name: Some(p.name.clone().unwrap_or_default()),
                port: Some(p.port),
                protocol: p.protocol.clone(),
                app_protocol: p.app_protocol.clone(),
            })
            .collect();
        for chunk in entries.chunks(MAX_ENDPOINTS_PER_SLICE) {
            slices.push((slice_ports.clone(), chunk.to_vec()));
        }
    }
    (slices, outcome)
}

/// The ports of the empty slice of a Service without endpoints.
fn placeholder_ports(service: &Service) -> Vec<SlicePort> {
    service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .map(|ports| {
            ports
                .iter()
                .filter(|p| matches!(p.target_port, None | Some(IntOrString::Int(_))))
                .map(|p| SlicePort {
                    name: Some(p.name.clone().unwrap_or_default()),
                    port: match &p.target_port {
                        Some(IntOrString::Int(n)) if *n != 0 => Some(*n),
                        _ => Some(p.port),
                    },
                    protocol: p.protocol.clone(),
                    app_protocol: p.app_protocol.clone(),
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, ContainerPort, PodCondition, PodSpec, PodStatus, ServicePort, ServiceSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const NO_SHARES: ZoneShares = Err(Disabled::InsufficientNodeInfo);

    fn service(target: IntOrString) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                selector: Some([("app".to_owned(), "web".to_owned())].into()),
                ports: Some(vec![ServicePort {
                    name: Some("http".into()),
                    port: 80,
                    target_port: Some(target),
                    protocol: Some("TCP".into()),
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            status: None,
        }
    }

    fn pod(name: &str, ip: &str, ready: bool, port_name: &str, number: i32) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                labels: Some([("app".to_owned(), "web".to_owned())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    ports: Some(vec![ContainerPort {
                        name: Some(port_name.into()),
                        container_port: number,
                        protocol: Some("TCP".into()),
                        ..ContainerPort::default()
                    }]),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                pod_ip: Some(ip.into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
        }
    }

    #[test]
    fn named_target_ports_resolve_per_pod() {
        let svc = service(IntOrString::String("web".into()));
        let pods = [
            pod("a", "10.0.0.1", true, "web", 8080),
            pod("b", "10.0.0.2", true, "web", 9090),
            pod("c", "10.0.0.3", false, "web", 8080),
        ];
        let endpoints = endpoints_of(&svc, &pods);
        let subsets = subsets(&svc, &endpoints);
        assert_eq!(subsets.len(), 2, "different numbers, different subsets");
        assert_eq!(subsets[0].ports.as_ref().unwrap()[0].port, 8080);
        assert_eq!(subsets[0].addresses.as_ref().unwrap().len(), 1);
        assert_eq!(
            subsets[0].not_ready_addresses.as_ref().unwrap()[0].ip,
            "10.0.0.3"
        );
        assert_eq!(subsets[1].ports.as_ref().unwrap()[0].port, 9090);
        let slices = slice_contents(&svc, &endpoints, &NO_SHARES).slices;
        assert_eq!(slices.len(), 2);
        assert_eq!(slices[0].2.len(), 2);
        assert_eq!(
            slices[0].2[1].conditions.as_ref().unwrap().ready,
            Some(false)
        );
    }

    #[test]
    fn unselected_unaddressed_and_many() {
        let svc = service(IntOrString::Int(8080));
        let mut other = pod("x", "10.0.0.9", true, "p", 1);
        other.metadata.labels = Some([("app".to_owned(), "other".to_owned())].into());
        let mut no_ip = pod("y", "", true, "p", 1);
        no_ip.status.as_mut().unwrap().pod_ip = None;
        assert!(endpoints_of(&svc, &[other, no_ip]).is_empty());
        let many: Vec<Pod> = (0..250)
            .map(|i| {
                pod(
                    &format!("p{i}"),
                    &format!("10.1.{}.{}", i / 200, i % 200),
                    true,
                    "p",
                    1,
                )
            })
            .collect();
        let endpoints = endpoints_of(&svc, &many);
        let slices = slice_contents(&svc, &endpoints, &NO_SHARES).slices;
        assert_eq!(
            slices.iter().map(|s| s.2.len()).collect::<Vec<_>>(),
            [100, 100, 50]
        );
        let mut published = svc.clone();
        published.spec.as_mut().unwrap().publish_not_ready_addresses = Some(true);
        let unready = [pod("u", "10.0.0.4", false, "p", 1)];
        let subsets = subsets(&published, &endpoints_of(&published, &unready));
        assert_eq!(subsets[0].addresses.as_ref().unwrap().len(), 1);
    }

    #[test]
    fn a_slice_per_family_of_the_service_and_endpoints_of_the_primary() {
        let mut svc = service(IntOrString::Int(8080));
        let dual = |name: &str, v4: &str, v6: &str| {
            let mut pod = pod(name, v4, true, "p", 1);
            pod.status.as_mut().unwrap().pod_ips = Some(vec![
                k8s_openapi::api::core::v1::PodIP { ip: v4.into() },
                k8s_openapi::api::core::v1::PodIP { ip: v6.into() },
            ]);
            pod
        };
        let pods = [
            dual("a", "10.0.0.1", "fd00::1"),
            pod("b", "10.0.0.2", true, "p", 1),
        ];
        svc.spec.as_mut().unwrap().ip_families = Some(vec!["IPv6".into(), "IPv4".into()]);
        let endpoints = endpoints_of(&svc, &pods);
        let slices = slice_contents(&svc, &endpoints, &NO_SHARES).slices;
        let summary: Vec<(IpFamily, Vec<String>)> = slices
            .iter()
            .map(|(family, _, entries)| {
                (
                    *family,
                    entries.iter().flat_map(|e| e.addresses.clone()).collect(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                (IpFamily::Ipv6, vec!["fd00::1".to_owned()]),
                (
                    IpFamily::Ipv4,
                    vec!["10.0.0.1".to_owned(), "10.0.0.2".to_owned()]
                )
            ]
        );
        // The Endpoints object: the primary family's addresses only.
        let subsets = subsets(&svc, &endpoints);
        let ips: Vec<&str> = subsets[0]
            .addresses
            .iter()
            .flatten()
            .map(|a| a.ip.as_str())
            .collect();
        assert_eq!(ips, ["fd00::1"]);
        // No endpoints: an empty slice of each family.
        let slices = slice_contents(&svc, &[], &NO_SHARES).slices;
        let empty: Vec<(IpFamily, usize)> = slices.iter().map(|s| (s.0, s.2.len())).collect();
        assert_eq!(empty, [(IpFamily::Ipv6, 0), (IpFamily::Ipv4, 0)]);
    }

    /// An endpoint's zone, zone hints and node hints.
    type Seen = (Option<String>, Option<Vec<String>>, Option<Vec<String>>);

    #[test]
    fn traffic_distribution_hints_each_ready_endpoint_to_its_zone() {
        let mut svc = service(IntOrString::Int(8080));
        let with_node = |name: &str, ip: &str, ready: bool, node: &str, zone: Option<&str>| {
            let mut pod = pod(name, ip, ready, "p", 1);
            pod.spec.as_mut().unwrap().node_name = Some(node.into());
            let mut endpoint = endpoints_of(&svc, &[pod]).remove(0);
            endpoint.zone = zone.map(str::to_owned);
            endpoint
        };
        let endpoints = [
            with_node("a", "10.0.0.1", true, "n1", Some("east")),
            with_node("b", "10.0.0.2", true, "n2", None),
            with_node("c", "10.0.0.3", false, "n3", Some("west")),
        ];
        let hints = |svc: &Service| -> Vec<Seen> {
            slice_contents(svc, &endpoints, &NO_SHARES).slices[0]
                .2
                .iter()
                .map(|e| {
                    let h = e.hints.as_ref();
                    (
                        e.zone.clone(),
                        h.and_then(|h| h.for_zones.as_ref())
                            .map(|z| z.iter().map(|z| z.name.clone()).collect()),
                        h.and_then(|h| h.for_nodes.as_ref())
                            .map(|n| n.iter().map(|n| n.name.clone()).collect()),
                    )
                })
                .collect()
        };
        // Without trafficDistribution: zones, no hints.
        assert_eq!(
            hints(&svc),
            [
                (Some("east".into()), None, None),
                (None, None, None),
                (Some("west".into()), None, None)
            ]
        );
        svc.spec.as_mut().unwrap().traffic_distribution = Some("PreferClose".into());
        assert_eq!(
            hints(&svc),
            [
                (Some("east".into()), Some(vec!["east".into()]), None),
                (None, None, None),
                // Not ready: no hint.
                (Some("west".into()), None, None)
            ]
        );
        svc.spec.as_mut().unwrap().traffic_distribution = Some("PreferSameNode".into());
        assert_eq!(
            hints(&svc)[0],
            (
                Some("east".into()),
                Some(vec!["east".into()]),
                Some(vec!["n1".into()])
            )
        );
        assert_eq!(hints(&svc)[1], (None, None, Some(vec!["n2".into()])));
    }
}
