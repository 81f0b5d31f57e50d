//! The VXLAN overlay (`--pod-network vxlan`, flannel's `vxlan` backend):
//! for nodes that do not share a link. Each node has one VXLAN device,
//! [`DEVICE`] (VNI [`VNI`], UDP [`PORT`]), holding the first address of its
//! pod range; it publishes the device's MAC on its Node
//! ([`MAC_ANNOTATION`]). For every other node, with pod range R, InternalIP
//! I and MAC M:
//!
//! - a route `R via R.0 dev portal.vxlan onlink` (marked like host-gw's);
//! - a permanent neighbour `R.0 lladdr M` (no ARP across the overlay);
//! - a forwarding entry `M dst I` (where to send M's frames).
//!
//! So a pod's packet to another node's pod is wrapped in UDP to that
//! node's address, which only needs to be reachable, not on the same link.
//!
//! On a dual-stack cluster the overlay carries IPv6 too, over the same
//! IPv4 underlay and device: the device also holds the first address of
//! the node's IPv6 range, and each peer's IPv6 range is routed via the
//! first address of that range (`R6 via R6::0 dev portal.vxlan onlink`),
//! a permanent neighbour of the same MAC.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::netlink::{self, Netlink};

/// The device's name.
pub const DEVICE: &str = "portal.vxlan";
/// The VXLAN network identifier (flannel's default is 1).
pub const VNI: u32 = 7;
/// The IANA VXLAN port.
pub const PORT: u16 = 4789;
/// Where a node says its device's MAC.
pub const MAC_ANNOTATION: &str = "portal.dev/vxlan-mac";
/// The encapsulation's cost: outer IPv4 (20), UDP (8), VXLAN (8), Ethernet (14).
const OVERHEAD: u32 = 50;

/// Makes the device (once) with `local` as its source address and `first`
/// (this node's pod range's first address; `first6`, its IPv6 range's) on
/// it; its MAC.
pub(crate) async fn ensure(
    local: Ipv4Addr,
    first: Ipv4Addr,
    first6: Option<Ipv6Addr>,
) -> Result<String, String> {
    let node = Netlink::connect().map_err(|e| e.to_string())?;
    let failed = |e: netlink::Error| e.to_string();
    if node.link_index(DEVICE).await.map_err(failed)?.is_none() {
        let mtu = pod_mtu(local).await;
        node.add_vxlan(DEVICE, VNI, local, PORT)
            .await
            .map_err(failed)?;
        node.set_mtu(DEVICE, mtu).await.map_err(failed)?;
    }
    node.replace_address(DEVICE, first.into(), 32)
        .await
        .map_err(failed)?;
    if let Some(first6) = first6 {
        node.replace_address(DEVICE, first6.into(), 128)
            .await
            .map_err(failed)?;
    }
    node.set_up(DEVICE).await.map_err(failed)?;
    node.link_mac(DEVICE)
        .await
        .map_err(failed)?
        .ok_or_else(|| format!("{DEVICE} has no MAC address"))
}

/// A MAC address as `ip` prints it (six lower-case hex pairs), or none.
pub fn parse_mac(text: &str) -> Option<String> {
    let parts: Vec<&str> = text.trim().split(':').collect();
    let valid = parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()));
    valid.then(|| text.trim().to_ascii_lowercase())
}

/// One other node, as the overlay needs it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Peer {
    /// The first address of its pod range (its device's address).
    pub gateway: Ipv4Addr,
    /// The first address of its IPv6 pod range, on a dual-stack cluster.
    pub gateway6: Option<Ipv6Addr>,
    pub mac: String,
    /// Its InternalIP: where its frames are sent.
    pub vtep: Ipv4Addr,
}

/// Makes the neighbour and forwarding entries exactly those of `peers`.
pub(crate) async fn sync(peers: &[Peer]) -> Result<(), String> {
    let node = Netlink::connect().map_err(|e| e.to_string())?;
    let mut failed = Vec::new();
    for peer in peers {
        let Some(mac) = netlink::parse_mac(&peer.mac) else {
            failed.push(format!("{}: invalid MAC {:?}", peer.vtep, peer.mac));
            continue;
        };
        let gateways =
            std::iter::once(IpAddr::V4(peer.gateway)).chain(peer.gateway6.map(IpAddr::V6));
        for gateway in gateways {
            if let Err(error) = node.replace_neighbour(DEVICE, gateway, &mac).await {
                failed.push(error.to_string());
            }
        }
        if let Err(error) = node.replace_fdb(DEVICE, &mac, peer.vtep).await {
            failed.push(error.to_string());
        }
    }
    // Entries of nodes that are gone.
    let neighbours = node.neighbours(DEVICE).await.map_err(|e| e.to_string())?;
    for address in neighbours {
        let known = peers.iter().any(|p| {
            IpAddr::V4(p.gateway) == address || p.gateway6.map(IpAddr::V6) == Some(address)
        });
        if !known {
            if let Err(error) = node.delete_neighbour(DEVICE, address).await {
                failed.push(error.to_string());
            }
        }
    }
    for (mac, destination) in node.fdb(DEVICE).await.map_err(|e| e.to_string())? {
        if !peers.iter().any(|p| p.mac == mac) {
            if let Err(error) = node.delete_fdb(DEVICE, &mac, destination).await {
                failed.push(error.to_string());
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

/// What fits in the overlay: the MTU of the link that carries `local`
/// (1500 if unknown) less the encapsulation.
pub(crate) async fn pod_mtu(local: Ipv4Addr) -> u32 {
    let underlay = match Netlink::connect() {
        Ok(node) => node.mtu_of_address(local).await.ok().flatten(),
        Err(_) => None,
    };
    underlay.unwrap_or(1500).saturating_sub(OVERHEAD)
}
