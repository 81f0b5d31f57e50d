//! Topology aware hints for `service.kubernetes.io/topology-mode: Auto`, as
//! the EndpointSlice controller's topology cache gives them: each zone gets
//! a share of a Service's ready endpoints in proportion to the allocatable
//! CPU of its ready nodes, so no endpoint takes more than 20 % over its
//! fair load. Every ready endpoint is first hinted to its own zone; zones
//! holding more than their share then give endpoints to zones short of
//! theirs. Where that cannot be done safely (a node without zone or CPU,
//! nodes in one zone only, fewer endpoints than zones, an endpoint
//! without zone) there are no hints at all, and the Service says why in an
//! event. The service proxy reads the hints as it reads `PreferClose`'s.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointHints, ForZone};
use kube::ResourceExt;

/// The annotation, and the older one it replaced (read when it is absent).
pub const TOPOLOGY_MODE: &str = "service.kubernetes.io/topology-mode";
pub const TOPOLOGY_AWARE_HINTS: &str = "service.kubernetes.io/topology-aware-hints";

/// The most a zone's endpoints may be loaded over their fair share.
const OVERLOAD_THRESHOLD: f64 = 0.2;

/// Whether the Service asks for automatic hints.
pub fn auto(service: &Service) -> bool {
    let annotations = service.annotations();
    let mode = annotations
        .get(TOPOLOGY_MODE)
        .or_else(|| annotations.get(TOPOLOGY_AWARE_HINTS));
    matches!(mode.map(String::as_str), Some("Auto" | "auto"))
}

/// What one Node adds to its zone's capacity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    pub zone: Option<String>,
    pub ready: bool,
    /// Allocatable CPU in millicores (0: unknown).
    pub cpu_millis: i64,
    /// A control-plane node, never counted.
    pub excluded: bool,
}

impl NodeFacts {
    pub fn of(node: &Node) -> Self {
        let labels = node.labels();
        let status = node.status.as_ref();
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True");
        let cpu_millis = status
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get("cpu"))
            .and_then(|q| portal_api::quantity::millicores(&q.0))
            .unwrap_or(0);
        NodeFacts {
            zone: labels
                .get(portal_client::labels::TOPOLOGY_ZONE)
                .filter(|z| !z.is_empty())
                .cloned(),
            ready,
            cpu_millis,
            excluded: labels.contains_key("node-role.kubernetes.io/control-plane")
                || labels.contains_key("node-role.kubernetes.io/master"),
        }
    }
}

/// Why a Service of `Auto` mode has no hints (the event's message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Disabled {
    InsufficientNodeInfo,
    TooFewEndpoints { endpoints: usize, zones: usize },
    MinimumOverThreshold { endpoints: usize, zones: usize },
    NoZone,
    NoHints,
}

impl Disabled {
    /// Upstream's words, so events read the same.
    pub fn message(&self) -> String {
        match self {
            Disabled::InsufficientNodeInfo => "Insufficient Node information: allocatable CPU or zone not specified on one or more nodes".into(),
            Disabled::TooFewEndpoints { endpoints, zones } => {
                format!("Insufficient number of endpoints ({endpoints} endpoints, {zones} zones)")
            }
            Disabled::MinimumOverThreshold { endpoints, zones } => format!(
                "Unable to allocate minimum required endpoints to each zone without exceeding overload threshold ({endpoints} endpoints, {zones} zones)"
            ),
            Disabled::NoZone => "One or more endpoints do not have a zone specified".into(),
            Disabled::NoHints => "No hints allocated for zones".into(),
        }
    }
}

/// Each zone's share of the cluster's allocatable CPU (ready nodes,
/// control-plane nodes left out). Any counted node without a zone or CPU
/// leaves no shares at all, as upstream; so does a single zone (upstream
/// then reports insufficient node information too).
pub type ZoneShares = Result<BTreeMap<String, f64>, Disabled>;

pub fn zone_shares<'a>(nodes: impl IntoIterator<Item = &'a NodeFacts>) -> ZoneShares {
    let mut cpu: BTreeMap<String, i64> = BTreeMap::new();
    for node in nodes {
        if node.excluded || !node.ready {
            continue;
        }
        match &node.zone {
            Some(zone) if node.cpu_millis > 0 => {
                let sum = cpu.entry(zone.clone()).or_default();
                *sum = sum.saturating_add(node.cpu_millis);
            }
            _ => return Err(Disabled::InsufficientNodeInfo),
        }
    }
    let total = cpu.values().fold(0i64, |sum, c| sum.saturating_add(*c));
    if total == 0 || cpu.len() < 2 {
        return Err(Disabled::InsufficientNodeInfo);
    }
    Ok(cpu
        .into_iter()
        .map(|(zone, millis)| (zone, millis as f64 / total as f64))
        .collect())
}

/// How many endpoints a zone should get.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Allocation {
    minimum: usize,
    desired: f64,
}

fn allocations(
    shares: &BTreeMap<String, f64>,
    endpoints: usize,
) -> Result<BTreeMap<&str, Allocation>, Disabled> {
    let zones = shares.len();
    if zones > endpoints {
        return Err(Disabled::TooFewEndpoints { endpoints, zones });
    }
    let mut remaining = endpoints as i64;
    let mut found = BTreeMap::new();
    for (zone, share) in shares {
        let desired = share * endpoints as f64;
        let minimum = (desired / (1.0 + OVERLOAD_THRESHOLD)).ceil() as usize;
        remaining -= minimum as i64;
        if remaining < 0 {
            return Err(Disabled::MinimumOverThreshold { endpoints, zones });
        }
        found.insert(
            zone.as_str(),
            Allocation {
                minimum,
                desired: desired.max(minimum as f64),
            },
        );
    }
    Ok(found)
}

fn ready(endpoint: &Endpoint) -> bool {
    endpoint.conditions.as_ref().and_then(|c| c.ready) == Some(true)
}

fn hint(zone: &str) -> Option<EndpointHints> {
    Some(EndpointHints {
        for_zones: Some(vec![ForZone {
            name: zone.to_owned(),
        }]),
        for_nodes: None,
    })
}

/// Hints the ready endpoints of one address type (all of a Service's slices
/// of it) to zones; on `Err` none has a hint.
pub fn assign(endpoints: &mut [&mut Endpoint], shares: &ZoneShares) -> Result<(), Disabled> {
    let result = try_assign(endpoints, shares);
    if result.is_err() {
        for endpoint in endpoints.iter_mut() {
            endpoint.hints = None;
        }
    }
    result
}

fn try_assign(endpoints: &mut [&mut Endpoint], shares: &ZoneShares) -> Result<(), Disabled> {
    let shares = shares.as_ref().map_err(Clone::clone)?;
    let total = endpoints.iter().filter(|e| ready(e)).count();
    let allocations = allocations(shares, total)?;
    // 1. Every ready endpoint to its own zone.
    let mut hinted: BTreeMap<String, usize> = BTreeMap::new();
    for endpoint in endpoints.iter_mut() {
        if !ready(endpoint) {
            endpoint.hints = None;
            continue;
        }
        let Some(zone) = endpoint.zone.clone().filter(|z| !z.is_empty()) else {
            return Err(Disabled::NoZone);
        };
        endpoint.hints = hint(&zone);
        *hinted.entry(zone).or_default() += 1;
    }
    if hinted.is_empty() {
        return Err(Disabled::NoHints);
    }
    // 2. How many endpoints each zone gives and takes.
    let (mut giving, mut receiving) = giving_and_receiving(&allocations, &hinted);
    // 3. Endpoints of giving zones hinted to receiving ones.
    for endpoint in endpoints.iter_mut() {
        if giving.is_empty() || receiving.is_empty() {
            break;
        }
        if !ready(endpoint) {
            continue;
        }
        let Some(from) = endpoint.zone.clone() else {
            continue;
        };
        let Some(left) = giving.get_mut(&from) else {
            continue;
        };
        let Some((to, wanted)) = receiving.iter_mut().next() else {
            break;
        };
        endpoint.hints = hint(to);
        *left -= 1;
        *wanted -= 1;
        let to = to.clone();
        if *left == 0 {
            giving.remove(&from);
        }
        if receiving.get(&to) == Some(&0) {
            receiving.remove(&to);
        }
    }
    Ok(())
}

/// Whole endpoints each zone should give away and take in, from the
/// fractional differences between desired and hinted counts (the largest
/// difference first, until less than half an endpoint is left to move).
fn giving_and_receiving(
    allocations: &BTreeMap<&str, Allocation>,
    hinted: &BTreeMap<String, usize>,
) -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
    let mut give: BTreeMap<String, f64> = BTreeMap::new();
    let mut take: BTreeMap<String, f64> = BTreeMap::new();
    for (zone, allocation) in allocations {
        let have = hinted.get(*zone).copied().unwrap_or(0) as f64;
        if have > allocation.desired {
            give.insert((*zone).to_owned(), have - allocation.desired);
        } else if have < allocation.desired {
            take.insert((*zone).to_owned(), allocation.desired - have);
        }
    }
    let most = |zones: &BTreeMap<String, f64>| {
        zones
            .iter()
            .filter(|(_, n)| **n > 0.0)
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(z, n)| (z.clone(), *n))
    };
    let (mut giving, mut receiving) = (BTreeMap::new(), BTreeMap::new());
    while let (Some((from, out)), Some((to, into))) = (most(&give), most(&take)) {
        if (out < 1.0 && into < 1.0) || out < 0.5 || into < 0.5 {
            break;
        }
        *giving.entry(from.clone()).or_insert(0) += 1;
        *give.get_mut(&from).expect("present") -= 1.0;
        *receiving.entry(to.clone()).or_insert(0) += 1;
        *take.get_mut(&to).expect("present") -= 1.0;
    }
    (giving, receiving)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::EndpointConditions;

    fn node(zone: Option<&str>, cpu: i64) -> NodeFacts {
        NodeFacts {
            zone: zone.map(str::to_owned),
            ready: true,
            cpu_millis: cpu,
            excluded: false,
        }
    }

    fn endpoint(zone: Option<&str>, is_ready: bool) -> Endpoint {
        Endpoint {
            addresses: vec!["10.0.0.1".into()],
            conditions: Some(EndpointConditions {
                ready: Some(is_ready),
                ..EndpointConditions::default()
            }),
            zone: zone.map(str::to_owned),
            ..Endpoint::default()
        }
    }

    /// Ready endpoints, one per zone given.
    fn ready_in(zones: &[&str]) -> Vec<Endpoint> {
        zones.iter().map(|z| endpoint(Some(z), true)).collect()
    }

    fn hinted(endpoints: &[Endpoint]) -> Vec<Option<String>> {
        endpoints
            .iter()
            .map(|e| {
                e.hints
                    .as_ref()
                    .and_then(|h| h.for_zones.as_ref())
                    .map(|z| z[0].name.clone())
            })
            .collect()
    }

    fn run(endpoints: &mut [Endpoint], shares: &ZoneShares) -> Result<(), Disabled> {
        let mut refs: Vec<&mut Endpoint> = endpoints.iter_mut().collect();
        assign(&mut refs, shares)
    }

    #[test]
    fn shares_follow_allocatable_cpu_of_ready_nodes() {
        let mut control = node(Some("c"), 64_000);
        control.excluded = true;
        let mut down = node(None, 0);
        down.ready = false;
        let shares =
            zone_shares(&[node(Some("a"), 3000), node(Some("b"), 1000), control, down]).unwrap();
        assert_eq!(
            shares,
            [("a".to_owned(), 0.75), ("b".to_owned(), 0.25)].into()
        );
        assert_eq!(
            zone_shares(&[node(Some("a"), 1000), node(None, 1000)]),
            Err(Disabled::InsufficientNodeInfo)
        );
        assert_eq!(
            zone_shares(&[node(Some("a"), 1000), node(Some("b"), 0)]),
            Err(Disabled::InsufficientNodeInfo)
        );
        assert_eq!(
            zone_shares(&[node(Some("a"), 1000), node(Some("a"), 1000)]),
            Err(Disabled::InsufficientNodeInfo)
        );
    }

    #[test]
    fn endpoints_go_to_their_zone_and_surplus_to_zones_short_of_their_share() {
        let shares = zone_shares(&[node(Some("a"), 1000), node(Some("b"), 1000)]);
        // Balanced: each to its own zone; an unready one gets none.
        let mut balanced = ready_in(&["a", "b"]);
        balanced.push(endpoint(Some("b"), false));
        run(&mut balanced, &shares).unwrap();
        assert_eq!(
            hinted(&balanced),
            [Some("a".into()), Some("b".into()), None]
        );
        // Three in a, one in b, equal CPU: one of a's serves b.
        let mut skewed = ready_in(&["a", "a", "a", "b"]);
        run(&mut skewed, &shares).unwrap();
        assert_eq!(
            hinted(&skewed),
            [
                Some("b".into()),
                Some("a".into()),
                Some("a".into()),
                Some("b".into())
            ]
        );
    }

    #[test]
    fn hints_are_withheld_where_they_would_overload_or_cannot_be_given() {
        let shares = zone_shares(&[
            node(Some("a"), 1000),
            node(Some("b"), 1000),
            node(Some("c"), 1000),
        ]);
        let mut few = ready_in(&["a", "b"]);
        assert_eq!(
            run(&mut few, &shares),
            Err(Disabled::TooFewEndpoints {
                endpoints: 2,
                zones: 3
            })
        );
        assert_eq!(hinted(&few), [None, None]);
        let mut unzoned = ready_in(&["a", "b"]);
        unzoned.push(endpoint(None, true));
        assert_eq!(run(&mut unzoned, &shares), Err(Disabled::NoZone));
        assert_eq!(hinted(&unzoned), [None, None, None]);
        // 90/10 CPU with 2 endpoints: b's minimum (1) leaves a one, less
        // than its own minimum (ceil(1.8 / 1.2) = 2).
        let lopsided = zone_shares(&[node(Some("a"), 9000), node(Some("b"), 1000)]);
        let mut two = ready_in(&["a", "b"]);
        assert_eq!(
            run(&mut two, &lopsided),
            Err(Disabled::MinimumOverThreshold {
                endpoints: 2,
                zones: 2
            })
        );
        // Node information missing: no hints, its reason.
        let mut any = ready_in(&["a", "b"]);
        assert_eq!(
            run(&mut any, &Err(Disabled::InsufficientNodeInfo)),
            Err(Disabled::InsufficientNodeInfo)
        );
        assert_eq!(
            Disabled::TooFewEndpoints {
                endpoints: 2,
                zones: 3
            }
            .message(),
            "Insufficient number of endpoints (2 endpoints, 3 zones)"
        );
    }

    #[test]
    fn the_annotation_and_its_older_name_turn_it_on() {
        let with = |key: &str, value: &str| -> Service {
            serde_json::from_value(
                serde_json::json!({"metadata": {"name": "s", "annotations": {key: value}}}),
            )
            .unwrap()
        };
        assert!(auto(&with(TOPOLOGY_MODE, "Auto")));
        assert!(auto(&with(TOPOLOGY_AWARE_HINTS, "auto")));
        assert!(!auto(&with(TOPOLOGY_MODE, "Disabled")));
        assert!(!auto(&Service::default()));
    }
}
