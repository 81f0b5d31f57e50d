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

use std::net::Ipv4Addr;

use tokio::process::Command;

/// The device's name.
pub const DEVICE: &str = "portal.vxlan";
/// The VXLAN network identifier (flannel's default is 1).
pub const VNI: &str = "7";
/// The IANA VXLAN port.
pub const PORT: &str = "4789";
/// Where a node says its device's MAC.
pub const MAC_ANNOTATION: &str = "portal.dev/vxlan-mac";
/// The encapsulation's cost: outer IPv4 (20), UDP (8), VXLAN (8), Ethernet (14).
const OVERHEAD: u32 = 50;

/// Makes the device (once) with `local` as its source address and `first`
/// (this node's pod range's first address) on it; its MAC.
pub(crate) async fn ensure(local: Ipv4Addr, first: Ipv4Addr) -> Result<String, String> {
    if link(DEVICE).await.is_none() {
        let mtu = pod_mtu(local).await.to_string();
        let local = local.to_string();
        run(
            "ip",
            &[
                "link",
                "add",
                DEVICE,
                "type",
                "vxlan",
                "id",
                VNI,
                "local",
                &local,
                "dstport",
                PORT,
                "nolearning",
            ],
        )
        .await?;
        run("ip", &["link", "set", DEVICE, "mtu", &mtu]).await?;
    }
    run(
        "ip",
        &["addr", "replace", &format!("{first}/32"), "dev", DEVICE],
    )
    .await?;
    run("ip", &["link", "set", DEVICE, "up"]).await?;
    let info = link(DEVICE)
        .await
        .ok_or_else(|| format!("{DEVICE} vanished"))?;
    info["address"]
        .as_str()
        .map(str::to_owned)
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
    pub mac: String,
    /// Its InternalIP: where its frames are sent.
    pub vtep: Ipv4Addr,
}

/// Makes the neighbour and forwarding entries exactly those of `peers`.
pub(crate) async fn sync(peers: &[Peer]) -> Result<(), String> {
    let mut failed = Vec::new();
    for peer in peers {
        let (gateway, vtep) = (peer.gateway.to_string(), peer.vtep.to_string());
        let neigh = [
            "neigh",
            "replace",
            &gateway,
            "lladdr",
            &peer.mac,
            "dev",
            DEVICE,
            "nud",
            "permanent",
        ];
        if let Err(error) = run("ip", &neigh).await {
            failed.push(error);
        }
        let fdb = [
            "fdb",
            "replace",
            &peer.mac,
            "dev",
            DEVICE,
            "dst",
            &vtep,
            "self",
            "permanent",
        ];
        if let Err(error) = run("bridge", &fdb).await {
            failed.push(error);
        }
    }
    // Entries of nodes that are gone.
    for entry in listed("ip", &["-j", "neigh", "show", "dev", DEVICE]).await? {
        let Some(address) = entry["dst"].as_str() else {
            continue;
        };
        if !peers.iter().any(|p| p.gateway.to_string() == address) {
            if let Err(error) = run("ip", &["neigh", "del", address, "dev", DEVICE]).await {
                failed.push(error);
            }
        }
    }
    for entry in listed("bridge", &["-j", "fdb", "show", "dev", DEVICE]).await? {
        let (Some(mac), Some(dst)) = (entry["mac"].as_str(), entry["dst"].as_str()) else {
            continue;
        };
        if !peers.iter().any(|p| p.mac == mac) {
            let delete = ["fdb", "del", mac, "dev", DEVICE, "dst", dst, "self"];
            if let Err(error) = run("bridge", &delete).await {
                failed.push(error);
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
    underlay_mtu(local)
        .await
        .unwrap_or(1500)
        .saturating_sub(OVERHEAD)
}

/// The MTU of the link that carries `local`.
async fn underlay_mtu(local: Ipv4Addr) -> Option<u32> {
    let addresses = listed("ip", &["-j", "-4", "addr", "show"]).await.ok()?;
    addresses
        .iter()
        .find(|link| {
            link["addr_info"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|i| i["local"].as_str() == Some(&local.to_string()))
            })
        })
        .and_then(|link| link["mtu"].as_u64())
        .and_then(|mtu| u32::try_from(mtu).ok())
}

async fn link(name: &str) -> Option<serde_json::Value> {
    listed("ip", &["-j", "link", "show", "dev", name])
        .await
        .ok()?
        .into_iter()
        .next()
}

async fn listed(program: &str, args: &[&str]) -> Result<Vec<serde_json::Value>, String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .await
        .map_err(|e| format!("{program} {}: {e}", args.join(" ")))?;
    if !output.status.success() {
        return Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(serde_json::from_slice(&output.stdout).unwrap_or_default())
}

async fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .await
        .map_err(|e| format!("{program} {}: {e}", args.join(" ")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}
