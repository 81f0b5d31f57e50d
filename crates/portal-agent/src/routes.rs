//! Routes to the other nodes' pods (host-gw, as flannel's `host-gw`
//! backend and kube-router do): every other Node's pod range via that
//! Node's InternalIP, following Nodes as they come, change and go; on a
//! dual-stack cluster its IPv6 pod range via its IPv6 InternalIP too. Pods
//! keep their own addresses across nodes (nothing is translated); traffic
//! from pods to anywhere outside the pod ranges is masqueraded behind the
//! node's address (nftables tables `ip portal_egress`, `ip6
//! portal_egress`), as flannel's `--ip-masq` does, so the rest of the
//! network needs no routes to pods. The VXLAN overlay carries both
//! families over an IPv4 underlay.
//!
//! The routes carry a protocol number of their own ([`PROTO`]), so the
//! agent finds the ones it made (also after a restart) and never touches
//! anyone else's. With host-gw nodes must share a link (a LAN); nodes that
//! do not use the VXLAN overlay ([`crate::vxlan`], `--pod-network vxlan`),
//! whose routes go through the VXLAN device instead.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use portal_api::cidr::{IpCidr, Ipv4Cidr, Ipv6Cidr, PodCidrs};

use crate::netlink::Netlink;
use crate::vxlan;
use tokio::process::Command;

/// The `proto` of the routes the agent makes (`ip route show proto 117`).
pub const PROTO: u8 = 117;
/// The routes are checked at least this often (a route removed by hand
/// comes back).
const RESYNC: Duration = Duration::from_secs(30);

/// How pods reach other nodes' pods.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodNetwork {
    /// Routes via the other nodes' addresses (one link).
    #[default]
    HostGw,
    /// A VXLAN overlay (any routed network between nodes).
    Vxlan,
}

/// A route to one node's pod range: via an address, on a device.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Route {
    via: IpAddr,
    /// The VXLAN device (the gateway is on it, `onlink`).
    overlay: bool,
}

/// A Node's pod ranges (`podCIDRs`, else `podCIDR`).
fn ranges_of(node: &Node) -> Vec<IpCidr> {
    portal_api::cidr::node_pod_cidrs(node.spec.as_ref())
}

/// A Node's first InternalIP of each family.
pub fn internal_ips(node: &Node) -> Vec<IpAddr> {
    let mut found: Vec<IpAddr> = Vec::new();
    let addresses = node.status.as_ref().and_then(|s| s.addresses.as_ref());
    for address in addresses.into_iter().flatten() {
        let Ok(ip) = address.address.parse::<IpAddr>() else {
            continue;
        };
        if address.type_ == "InternalIP" && !found.iter().any(|f| f.is_ipv4() == ip.is_ipv4()) {
            found.push(ip);
        }
    }
    found
}

/// The routes the cluster calls for: each other node's pod range of each
/// family via its InternalIP of that family (ranges without one are
/// skipped).
pub fn wanted(nodes: &[Arc<Node>], me: &str) -> BTreeMap<IpCidr, IpAddr> {
    let mine: Vec<IpCidr> = nodes
        .iter()
        .find(|n| n.name_any() == me)
        .map(|n| ranges_of(n))
        .unwrap_or_default();
    nodes
        .iter()
        .filter(|n| n.name_any() != me)
        .flat_map(|n| {
            let addresses = internal_ips(n);
            ranges_of(n).into_iter().filter_map(move |range| {
                let via = addresses
                    .iter()
                    .find(|ip| ip.is_ipv4() == matches!(range, IpCidr::V4(_)))?;
                Some((range, *via))
            })
        })
        // A range that overlaps this node's own (a misconfigured node) or
        // is wider than a node's share never takes this node's routes.
        .filter(|(range, _): &(IpCidr, IpAddr)| {
            let min = match range {
                IpCidr::V4(_) => MIN_PREFIX,
                IpCidr::V6(_) => MIN_PREFIX_V6,
            };
            range.prefix() >= min && !mine.iter().any(|m| m.overlaps(range))
        })
        .collect()
}

/// The widest range routed to one node (no default or LAN-wide routes).
const MIN_PREFIX: u8 = 8;
const MIN_PREFIX_V6: u8 = 32;

/// A node's pod ranges as the overlay uses them (an IPv4 one, perhaps an
/// IPv6 one).
fn overlay_ranges(node: &Node) -> Option<PodCidrs> {
    node.spec.as_ref().and_then(PodCidrs::of_node)
}

/// One node reached through the overlay: its entries, and its IPv6 range
/// (routed through the overlay too) on a dual-stack cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverlayPeer {
    pub peer: vxlan::Peer,
    pub range6: Option<Ipv6Cidr>,
}

/// The overlay's peers by IPv4 pod range: the nodes of `routes` that
/// published a MAC. Two nodes claiming one MAC are both left out (frames
/// for it would go to whichever was written last). Where this node's
/// pods have IPv6 (`ipv6`), a peer's IPv6 range rides along, unless it
/// overlaps one of `mine` or is wider than a node's share.
pub fn peers(
    nodes: &[Arc<Node>],
    routes: &BTreeMap<IpCidr, IpAddr>,
    (mine, ipv6): (&[IpCidr], bool),
) -> BTreeMap<Ipv4Cidr, OverlayPeer> {
    let candidates: Vec<(Ipv4Cidr, OverlayPeer)> = nodes
        .iter()
        .filter_map(|n| {
            let PodCidrs {
                v4: range,
                v6: range6,
                ..
            } = overlay_ranges(n)?;
            let IpAddr::V4(vtep) = *routes.get(&IpCidr::V4(range))? else {
                return None;
            };
            let mac = n.annotations().get(vxlan::MAC_ANNOTATION)?;
            let mac = vxlan::parse_mac(mac)?;
            let gateway = range.nth(0)?;
            let range6 = range6.filter(|_| ipv6).filter(|r6| {
                let r6 = IpCidr::V6(*r6);
                r6.prefix() >= MIN_PREFIX_V6 && !mine.iter().any(|m| m.overlaps(&r6))
            });
            let gateway6 = range6.and_then(|r6| r6.nth(0));
            let peer = vxlan::Peer {
                gateway,
                gateway6,
                mac,
                vtep,
            };
            Some((range, OverlayPeer { peer, range6 }))
        })
        .collect();
    candidates
        .iter()
        .filter(|(_, candidate)| {
            let mac = &candidate.peer.mac;
            let unique = candidates
                .iter()
                .filter(|(_, c)| c.peer.mac == *mac)
                .count()
                == 1;
            if !unique {
                tracing::warn!(%mac, "two nodes publish one VXLAN MAC: neither is reached");
            }
            unique
        })
        .cloned()
        .collect()
}

/// Aborts a helper task when its owner ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Keeps the routes in line with the Nodes for as long as the agent runs.
/// `ipv6`: this node's pods have IPv6 addresses (an `ip6` egress table).
pub(crate) async fn run(
    client: Client,
    me: String,
    network: PodNetwork,
    node_ip: Ipv4Addr,
    ipv6: bool,
) {
    let (nodes, writer) = reflector::store::<Node>();
    let changed = Arc::new(tokio::sync::Notify::new());
    // The watch runs on its own (the store fills only while it is polled).
    let notify = changed.clone();
    let node_api = Api::<Node>::all(client);
    let watch = watcher(node_api.clone(), watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .touched_objects();
    // Stopped with this loop (a restart starts a new one).
    let _watching = AbortOnDrop(tokio::spawn(watch.for_each(move |_| {
        notify.notify_one();
        async {}
    })));
    if nodes.wait_until_ready().await.is_err() {
        return;
    }
    // What was last made so: only a change (or the periodic check) costs
    // any `ip` calls, whatever the Nodes' heartbeats.
    let mut last: Option<Plan> = None;
    loop {
        let all = nodes.state();
        let plan = Plan::of(&all, &me, network, ipv6);
        if last.as_ref() != Some(&plan) {
            let mut problems = Vec::new();
            if network == PodNetwork::Vxlan {
                let peers: Vec<vxlan::Peer> = plan.peers.values().map(|p| p.peer.clone()).collect();
                if let Err(error) = overlay(&node_api, &all, &me, (node_ip, ipv6), &peers).await {
                    problems.push(error);
                }
            }
            // One bad peer or route holds up nothing else; egress keeps
            // working whatever happened to the routes.
            if let Err(error) = sync(&plan.routes).await {
                problems.push(error);
            }
            if let Err(error) = masquerade(&pod_ranges(&all), ipv6).await {
                problems.push(error);
            }
            if problems.is_empty() {
                last = Some(plan);
            } else {
                tracing::warn!(error = %problems.join("; "), "routes to other nodes' pods; retrying");
                last = None;
            }
        }
        tokio::select! {
            () = changed.notified() => {}
            () = tokio::time::sleep(RESYNC) => last = None,
        }
    }
}

/// Everything the routes task makes from the Nodes.
#[derive(Debug, PartialEq, Eq)]
struct Plan {
    routes: BTreeMap<IpCidr, Route>,
    peers: BTreeMap<Ipv4Cidr, OverlayPeer>,
    /// This node's ranges and published MAC (the overlay's own part).
    mine: Option<(Vec<IpCidr>, Option<String>)>,
}

impl Plan {
    /// `ipv6`: this node's pods have IPv6 (the overlay carries it then).
    fn of(nodes: &[Arc<Node>], me: &str, network: PodNetwork, ipv6: bool) -> Plan {
        let hosts = wanted(nodes, me);
        if network == PodNetwork::HostGw {
            let routes = hosts
                .into_iter()
                .map(|(range, via)| {
                    (
                        range,
                        Route {
                            via,
                            overlay: false,
                        },
                    )
                })
                .collect();
            return Plan {
                routes,
                peers: BTreeMap::new(),
                mine: None,
            };
        }
        let me = nodes.iter().find(|n| n.name_any() == me);
        let my_ranges = me.map(|n| ranges_of(n)).unwrap_or_default();
        let peers = peers(nodes, &hosts, (&my_ranges, ipv6));
        // Only nodes the overlay reaches are routed, through it: each range
        // via its first address (the peer's device).
        let overlay = |via: IpAddr| Route { via, overlay: true };
        let routes = peers
            .iter()
            .flat_map(|(range, p)| {
                let v4 = (IpCidr::V4(*range), overlay(IpAddr::V4(p.peer.gateway)));
                let v6 = p
                    .range6
                    .zip(p.peer.gateway6)
                    .map(|(r6, gateway6)| (IpCidr::V6(r6), overlay(IpAddr::V6(gateway6))));
                std::iter::once(v4).chain(v6)
            })
            .collect();
        let mine = me.map(|n| {
            (
                my_ranges.clone(),
                n.annotations().get(vxlan::MAC_ANNOTATION).cloned(),
            )
        });
        Plan {
            routes,
            peers,
            mine: Some(mine.unwrap_or_default()),
        }
    }
}

/// The VXLAN device of this node (once its pod range is known), its MAC
/// on its Node, and the peers' entries.
async fn overlay(
    api: &Api<Node>,
    nodes: &[Arc<Node>],
    me: &str,
    (node_ip, ipv6): (Ipv4Addr, bool),
    peers: &[vxlan::Peer],
) -> Result<(), String> {
    let Some(node) = nodes.iter().find(|n| n.name_any() == me) else {
        return Err("this node is not registered yet".into());
    };
    let Some(ranges) = overlay_ranges(node) else {
        return Err("this node has no pod range yet".into());
    };
    let Some(first) = ranges.v4.nth(0) else {
        return Err("this node's pod range has no address".into());
    };
    // The IPv6 range's first address only where this node's pods have IPv6.
    let first6 = ranges.v6.filter(|_| ipv6).and_then(|r| r.nth(0));
    let mac = vxlan::ensure(node_ip, first, first6).await?;
    if node.annotations().get(vxlan::MAC_ANNOTATION) != Some(&mac) {
        let patch = serde_json::json!({"metadata": {"annotations": {vxlan::MAC_ANNOTATION: mac}}});
        api.patch(
            me,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .map_err(|e| format!("publishing the VXLAN MAC: {e}"))?;
    }
    vxlan::sync(peers).await
}

/// Makes the kernel's routes of [`PROTO`] exactly `wanted`.
async fn sync(wanted: &BTreeMap<IpCidr, Route>) -> Result<(), String> {
    let node = Netlink::connect().map_err(|e| e.to_string())?;
    let current = current(&node).await?;
    // One bad route (a gateway not on this link) does not hold up the others.
    let mut failed = Vec::new();
    for (range, route) in wanted {
        let Some(network) = range.nth(0) else {
            continue;
        };
        let replace = match current.get(range) {
            Some(gateway) if *gateway == Some(route.via) => continue,
            // Only a route of ours is replaced: adding fails rather than
            // take over a route someone else made for the same range.
            Some(_) => true,
            None => false,
        };
        let onlink = route.overlay.then_some(vxlan::DEVICE);
        let set = node
            .set_route(network, range.prefix(), route.via, PROTO, onlink, replace)
            .await;
        match set {
            Ok(()) => {
                tracing::info!(pods = %range, via = %route.via, "route to another node's pods")
            }
            Err(error) => failed.push(error.to_string()),
        }
    }
    for range in current.keys() {
        if !wanted.contains_key(range) {
            let Some(network) = range.nth(0) else {
                continue;
            };
            match node.delete_route(network, range.prefix(), PROTO).await {
                Ok(()) => tracing::info!(pods = %range, "route to a node that is gone removed"),
                Err(error) => failed.push(error.to_string()),
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

/// Every node's pod ranges (this one's too), IPv4 first.
fn pod_ranges(nodes: &[Arc<Node>]) -> Vec<IpCidr> {
    let mut ranges: Vec<IpCidr> = nodes.iter().flat_map(|n| ranges_of(n)).collect();
    ranges.sort();
    ranges.dedup();
    ranges
}

/// The egress rules: from a pod range to anywhere else, masquerade; a
/// table per family (IPv6's when `ipv6`: this node's pods have IPv6).
pub fn egress_rules(ranges: &[IpCidr], ipv6: bool) -> String {
    let mut rules = String::new();
    for (family, addr_type, v6) in [("ip", "ipv4_addr", false), ("ip6", "ipv6_addr", true)] {
        if v6 && !ipv6 {
            continue;
        }
        let elements: Vec<String> = ranges
            .iter()
            .filter(|r| matches!(r, IpCidr::V6(_)) == v6)
            .map(ToString::to_string)
            .collect();
        let set = if elements.is_empty() {
            String::new()
        } else {
            format!("elements = {{ {} }}", elements.join(", "))
        };
        rules.push_str(&format!(
            "table {family} portal_egress\n\
             delete table {family} portal_egress\n\
             table {family} portal_egress {{\n\
             \tset pods {{ type {addr_type}; flags interval; {set} }}\n\
             \tchain postrouting {{\n\
             \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
             \t\t{family} saddr @pods {family} daddr != @pods masquerade\n\
             \t}}\n\
             }}\n"
        ));
    }
    rules
}

/// Replaces the egress tables in one nft transaction.
async fn masquerade(ranges: &[IpCidr], ipv6: bool) -> Result<(), String> {
    apply_nft(&egress_rules(ranges, ipv6)).await
}

/// Runs `nft -f -` with `rules`: one transaction, all or nothing.
pub(crate) async fn apply_nft(rules: &str) -> Result<(), String> {
    use tokio::io::AsyncWriteExt;
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("nft: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(rules.as_bytes())
            .await
            .map_err(|e| format!("nft: {e}"))?;
    }
    let output = child
        .wait_with_output()
        .await
        .map_err(|e| format!("nft: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// The routes of [`PROTO`]: destination → gateway.
async fn current(node: &Netlink) -> Result<BTreeMap<IpCidr, Option<IpAddr>>, String> {
    let routes = node.routes_of(PROTO).await.map_err(|e| e.to_string())?;
    Ok(routes
        .into_iter()
        .filter_map(|(destination, prefix, gateway)| {
            let range = format!("{destination}/{prefix}").parse::<IpCidr>().ok()?;
            Some((range, gateway))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, range: Option<&str>, ip: Option<&str>) -> Arc<Node> {
        let addresses = ip.map(|ip| serde_json::json!([{"type": "Hostname", "address": name}, {"type": "InternalIP", "address": ip}]));
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"podCIDR": range},
            "status": {"addresses": addresses},
        }))
        .map(Arc::new)
        .unwrap()
    }

    #[test]
    fn pods_are_masqueraded_only_when_leaving_the_pod_ranges() {
        let nodes = [
            node("a", Some("10.244.1.0/24"), Some("192.168.1.1")),
            node("b", Some("10.244.0.0/24"), Some("192.168.1.2")),
        ];
        let rules = egress_rules(&pod_ranges(&nodes), false);
        assert!(
            rules.contains("elements = { 10.244.0.0/24, 10.244.1.0/24 }"),
            "{rules}"
        );
        assert!(rules.contains("ip saddr @pods ip daddr != @pods masquerade"));
        assert!(rules.starts_with("table ip portal_egress\ndelete table ip portal_egress\n"));
    }

    #[test]
    fn ipv6_ranges_go_via_ipv6_addresses_and_get_their_own_egress_table() {
        let dual = |name: &str, v4: &str, v6: &str, ips: serde_json::Value| -> Arc<Node> {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "spec": {"podCIDR": v4, "podCIDRs": [v4, v6]},
                "status": {"addresses": ips},
            }))
            .map(Arc::new)
            .unwrap()
        };
        let nodes = [
            dual(
                "me",
                "10.244.0.0/24",
                "fd00:10:244::/64",
                serde_json::json!([{"type": "InternalIP", "address": "192.168.1.1"}, {"type": "InternalIP", "address": "fd00:1::1"}]),
            ),
            dual(
                "b",
                "10.244.1.0/24",
                "fd00:10:244:1::/64",
                serde_json::json!([{"type": "InternalIP", "address": "192.168.1.2"}, {"type": "InternalIP", "address": "fd00:1::2"}]),
            ),
            // No IPv6 address: its IPv6 pods are not reachable this way.
            dual(
                "c",
                "10.244.2.0/24",
                "fd00:10:244:2::/64",
                serde_json::json!([{"type": "InternalIP", "address": "192.168.1.3"}]),
            ),
        ];
        let routes: Vec<(String, String)> = wanted(&nodes, "me")
            .iter()
            .map(|(range, via)| (range.to_string(), via.to_string()))
            .collect();
        assert_eq!(
            routes,
            [
                ("10.244.1.0/24".to_owned(), "192.168.1.2".to_owned()),
                ("10.244.2.0/24".to_owned(), "192.168.1.3".to_owned()),
                ("fd00:10:244:1::/64".to_owned(), "fd00:1::2".to_owned()),
            ]
        );
        let rules = egress_rules(&pod_ranges(&nodes), true);
        assert!(rules.contains("table ip6 portal_egress {"), "{rules}");
        assert!(rules.contains("type ipv6_addr; flags interval; elements = { fd00:10:244::/64, fd00:10:244:1::/64, fd00:10:244:2::/64 }"), "{rules}");
        assert!(rules.contains("ip6 saddr @pods ip6 daddr != @pods masquerade"));
        let v4_only = egress_rules(&pod_ranges(&nodes), false);
        assert!(!v4_only.contains("ip6"), "{v4_only}");
    }

    #[test]
    fn the_overlay_carries_ipv6_ranges_via_their_first_address() {
        // IPv6 first (an IPv6-first cluster), no IPv6 InternalIP needed.
        let overlay_node = |name: &str, v4: &str, v6: &str, ip: &str, mac: &str| -> Arc<Node> {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "annotations": {vxlan::MAC_ANNOTATION: mac}},
                "spec": {"podCIDR": v6, "podCIDRs": [v6, v4]},
                "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
            }))
            .map(Arc::new)
            .unwrap()
        };
        let nodes = [
            overlay_node(
                "me",
                "10.244.0.0/24",
                "fd00:10:244::/64",
                "192.168.101.1",
                "02:00:00:00:00:01",
            ),
            overlay_node(
                "b",
                "10.244.1.0/24",
                "fd00:10:244:1::/64",
                "192.168.102.1",
                "02:00:00:00:00:02",
            ),
        ];
        let plan = Plan::of(&nodes, "me", PodNetwork::Vxlan, true);
        let routes: Vec<(String, String, bool)> = plan
            .routes
            .iter()
            .map(|(range, r)| (range.to_string(), r.via.to_string(), r.overlay))
            .collect();
        assert_eq!(
            routes,
            [
                ("10.244.1.0/24".to_owned(), "10.244.1.0".to_owned(), true),
                (
                    "fd00:10:244:1::/64".to_owned(),
                    "fd00:10:244:1::".to_owned(),
                    true
                ),
            ]
        );
        let peer = &plan.peers.values().next().unwrap().peer;
        assert_eq!(peer.gateway6, Some("fd00:10:244:1::".parse().unwrap()));
        assert_eq!(peer.vtep, "192.168.102.1".parse::<Ipv4Addr>().unwrap());
        // Pods without IPv6 here: IPv4 routes only.
        let v4_only = Plan::of(&nodes, "me", PodNetwork::Vxlan, false);
        assert_eq!(v4_only.routes.len(), 1);
    }

    #[test]
    fn every_other_node_with_a_range_and_an_address() {
        let nodes = [
            node("me", Some("10.244.0.0/24"), Some("192.168.1.1")),
            node("b", Some("10.244.1.0/24"), Some("192.168.1.2")),
            node("no-range", None, Some("192.168.1.3")),
            node("no-address", Some("10.244.3.0/24"), None),
        ];
        let routes = wanted(&nodes, "me");
        assert_eq!(routes.len(), 1);
        let overlapping = [
            node("me", Some("10.244.0.0/24"), Some("192.168.1.1")),
            node("bad", Some("10.244.0.0/16"), Some("192.168.1.9")),
            node("default", Some("0.0.0.0/0"), Some("192.168.1.8")),
        ];
        assert!(
            wanted(&overlapping, "me").is_empty(),
            "never over this node's own or the default route"
        );
        let (range, via) = routes.iter().next().unwrap();
        assert_eq!(
            (range.to_string(), via.to_string()),
            ("10.244.1.0/24".into(), "192.168.1.2".into())
        );
    }
}
