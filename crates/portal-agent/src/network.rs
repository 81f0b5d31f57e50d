//! Pod networking: a network namespace per pod joined to the node by a veth
//! on the node's bridge, an address from the node's pod range, and routes
//! through the node (pods are /32s routed by the node, so every packet
//! crosses the node's netfilter hooks: Services, hairpin included, work).
//!
//! Links, addresses, routes and namespaces are made over netlink
//! ([`crate::netlink`]), not by spawning `ip`.
//!
//! Addresses are leased as files (`DIR/<ip>` holding the pod's UID), made
//! with `O_EXCL` like CNI's host-local plugin, so no address is handed out
//! twice or lost across agent restarts. Namespace names carry the agent's
//! tag, so several agents on one machine never collide.
//!
//! On a dual-stack node (an IPv6 pod range besides the IPv4 one) a pod's
//! IPv6 address is the one at its IPv4 address's place in the IPv6 range
//! (`10.244.1.7` → `fd00:10:244:1::7`): one lease covers both, and a pod
//! reached by either address is plainly the same pod. IPv6 is routed the
//! same way (a /128 per pod, the bridge's address as gateway), without
//! duplicate address detection (the node hands out every address itself).

use futures_util::future::BoxFuture;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use portal_api::cidr::{Ipv4Cidr, Ipv6Cidr, PodCidrs};

use crate::netlink::{self, Netlink};

/// The node's bridge; one per node network namespace.
pub const BRIDGE: &str = "portal0";
/// A fixed bridge MAC: otherwise the bridge takes the lowest of its ports'
/// and changes it as pods come and go, and pods' cached gateway goes stale.
const BRIDGE_MAC: [u8; 6] = [0x02, 0x50, 0x4f, 0x52, 0x54, 0x01];
/// The pod's end of its veth.
const POD_LINK: &str = "eth0";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A netlink step failed.
    #[error(transparent)]
    Netlink(#[from] netlink::Error),
    /// A `sysctl` step failed.
    #[error("{command}: {message}")]
    Command { command: String, message: String },
    /// The lease directory could not be read or written.
    #[error("address leases in {path}: {source}")]
    Leases {
        path: String,
        source: std::io::Error,
    },
    /// Every address of the node's range is leased.
    #[error("no free address in {0}")]
    Exhausted(Ipv4Cidr),
}

type Result<T, E = Error> = std::result::Result<T, E>;

/// One node's pod network.
#[derive(Clone, Debug)]
pub struct Network {
    /// Makes namespace names unique to this agent.
    tag: String,
    range: Ipv4Cidr,
    /// The node's IPv6 pod range on a dual-stack node.
    range6: Option<Ipv6Cidr>,
    /// Pods' first address is their IPv6 one (an IPv6-first cluster).
    ipv6_primary: bool,
    leases: PathBuf,
    /// Pod workers lease concurrently: one at a time.
    leasing: std::sync::Arc<parking_lot::Mutex<()>>,
    /// The pods' MTU when it must be below the node's (an overlay's).
    mtu: Option<u32>,
    /// One netlink connection to the node's namespace for every pod's
    /// veth (each connection holds its own buffers).
    node: std::sync::Arc<tokio::sync::OnceCell<Netlink>>,
}

/// The network of one pod as set up.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Sandbox {
    /// Under `/run/netns`.
    pub netns: String,
    pub ip: Ipv4Addr,
    /// The pod's IPv6 address on a dual-stack node.
    #[serde(default)]
    pub ip6: Option<Ipv6Addr>,
    /// Its IPv6 address is its first (an IPv6-first cluster).
    #[serde(default)]
    pub ipv6_primary: bool,
    /// The node side of the veth.
    pub veth: String,
}

impl Sandbox {
    pub fn netns_path(&self) -> PathBuf {
        netlink::netns_path(&self.netns)
    }

    /// The pod's addresses as `status.podIPs` lists them: the primary
    /// family (the node's first pod range) first.
    pub fn ips(&self) -> Vec<String> {
        let v4 = self.ip.to_string();
        match self.ip6.map(|ip| ip.to_string()) {
            Some(v6) if self.ipv6_primary => vec![v6, v4],
            Some(v6) => vec![v4, v6],
            None => vec![v4],
        }
    }
}

/// Whether this network namespace's kernel has IPv6 on (not booted with
/// `ipv6.disable=1`, not turned off with `net.ipv6.conf.all.disable_ipv6`).
pub fn ipv6_enabled() -> bool {
    let disabled = std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/disable_ipv6")
        .map(|v| v.trim() == "1")
        .unwrap_or(true);
    std::path::Path::new("/proc/net/if_inet6").exists() && !disabled
}

/// What the pod workers need of the node's pod network: a pod's network
/// namespace with an address, made, found again and removed. [`Network`]
/// is the real one; the workers' unit tests use a fake.
pub trait PodNetwork: Send + Sync + 'static {
    /// The pod's sandbox if it (still) exists.
    fn existing(&self, pod_uid: &str) -> Option<Sandbox>;
    /// Makes the pod's network namespace, veth and address.
    fn create_sandbox<'a>(&'a self, pod_uid: &'a str) -> BoxFuture<'a, Result<Sandbox>>;
    /// Removes them (nothing to do when they are gone).
    fn remove_sandbox<'a>(&'a self, pod_uid: &'a str) -> BoxFuture<'a, Result<()>>;
    /// The pods that have a sandbox left on the node.
    fn sandboxes_on_disk(&self) -> Vec<String>;
}

impl PodNetwork for Network {
    fn existing(&self, pod_uid: &str) -> Option<Sandbox> {
        Network::existing(self, pod_uid)
    }

    fn create_sandbox<'a>(&'a self, pod_uid: &'a str) -> BoxFuture<'a, Result<Sandbox>> {
        Box::pin(Network::create_sandbox(self, pod_uid))
    }

    fn remove_sandbox<'a>(&'a self, pod_uid: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(Network::remove_sandbox(self, pod_uid))
    }

    fn sandboxes_on_disk(&self) -> Vec<String> {
        Network::sandboxes_on_disk(self)
    }
}

impl Network {
    pub fn new(tag: &str, ranges: PodCidrs, leases: PathBuf) -> Self {
        Network {
            tag: tag.to_owned(),
            range: ranges.v4,
            range6: ranges.v6,
            ipv6_primary: ranges.ipv6_primary,
            leases,
            leasing: std::sync::Arc::default(),
            mtu: None,
            node: std::sync::Arc::default(),
        }
    }

    /// Pods get this MTU (the VXLAN device's: packets to other nodes'
    /// pods fit without fragmenting or path MTU discovery).
    pub fn with_mtu(mut self, mtu: Option<u32>) -> Self {
        self.mtu = mtu;
        self
    }

    /// The netlink connection to the node's namespace, opened once.
    async fn node(&self) -> Result<&Netlink> {
        Ok(self
            .node
            .get_or_try_init(|| async { Netlink::connect() })
            .await?)
    }

    /// The node's address on the bridge: the pods' gateway.
    pub fn gateway(&self) -> Ipv4Addr {
        self.range.nth(1).unwrap_or(Ipv4Addr::UNSPECIFIED)
    }

    /// The node's IPv6 address on the bridge, on a dual-stack node.
    pub fn gateway6(&self) -> Option<Ipv6Addr> {
        self.range6.and_then(|range| range.nth(1))
    }

    /// A pod's IPv6 address: the place of its IPv4 one in the IPv6 range.
    fn ip6_for(&self, ip: Ipv4Addr) -> Option<Ipv6Addr> {
        self.range6?.nth(self.range.offset(ip)?)
    }

    /// Sets up the node side once: bridge, forwarding, and no bridge
    /// netfilter (pods are routed; see the module doc).
    pub async fn prepare_node(&self) -> Result<()> {
        std::fs::create_dir_all(&self.leases).map_err(|source| self.lease_error(source))?;
        let node = self.node().await?;
        if node.link_index(BRIDGE).await?.is_none() {
            node.add_bridge(BRIDGE, BRIDGE_MAC).await?;
        }
        // `replace` keeps this idempotent across restarts.
        let mut settings = vec![
            ("net/ipv4/ip_forward", "1"),
            ("net/ipv4/conf/all/send_redirects", "0"),
            ("net/ipv4/conf/portal0/send_redirects", "0"),
            ("net/bridge/bridge-nf-call-iptables", "0"),
        ];
        if self.range6.is_some() {
            keep_router_advertisements();
            settings.extend([
                ("net/ipv6/conf/all/forwarding", "1"),
                ("net/bridge/bridge-nf-call-ip6tables", "0"),
            ]);
        }
        Self::set_sysctls(&settings)?;
        node.replace_address(BRIDGE, IpAddr::V4(self.gateway()), self.range.prefix())
            .await?;
        if let (Some(gateway), Some(range)) = (self.gateway6(), self.range6) {
            node.replace_address(BRIDGE, IpAddr::V6(gateway), range.prefix())
                .await?;
        }
        node.set_up(BRIDGE).await?;
        Ok(())
    }

    /// Writes `/proc/sys` settings of the current network namespace.
    fn set_sysctls(settings: &[(&str, &str)]) -> Result<()> {
        for (key, value) in settings {
            let path = Path::new("/proc/sys").join(key);
            // bridge-nf-call-* exists only with br_netfilter loaded.
            if path.exists() {
                std::fs::write(&path, value).map_err(|e| Error::Command {
                    command: format!("sysctl {key}={value}"),
                    message: e.to_string(),
                })?;
            }
        }
        Ok(())
    }

    fn lease_error(&self, source: std::io::Error) -> Error {
        Error::Leases {
            path: self.leases.display().to_string(),
            source,
        }
    }

    /// The namespace name of a pod, unique to this agent.
    pub fn netns_name(&self, pod_uid: &str) -> String {
        format!("portal-{}-{pod_uid}", self.tag)
    }

    /// The pod's address: the one it holds, else the next free one after
    /// the last handed out (so a just-freed address is not reused at once).
    pub fn lease(&self, pod_uid: &str) -> Result<Ipv4Addr> {
        let _one_at_a_time = self.leasing.lock();
        let held = self.leases_held()?;
        if let Some((ip, _)) = held.iter().find(|(_, uid)| uid == pod_uid) {
            return Ok(*ip);
        }
        let last_path = self.leases.join("last");
        let last = std::fs::read_to_string(&last_path)
            .ok()
            .and_then(|s| s.trim().parse::<Ipv4Addr>().ok())
            .and_then(|ip| self.range.offset(ip))
            .unwrap_or(1);
        let size = self.range.size();
        // Offsets 0 (network), 1 (gateway) and size-1 (broadcast) are not pods'.
        for step in 1..size {
            let offset = (last + step) % size;
            if offset < 2 || offset == size - 1 {
                continue;
            }
            let Some(ip) = self.range.nth(offset) else {
                continue;
            };
            let path = self.leases.join(ip.to_string());
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut file) => {
                    file.write_all(pod_uid.as_bytes())
                        .and_then(|()| file.sync_all())
                        .map_err(|source| self.lease_error(source))?;
                    crate::durable::write_atomic(&last_path, ip.to_string().as_bytes())
                        .map_err(|source| self.lease_error(source))?;
                    return Ok(ip);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(source) => return Err(self.lease_error(source)),
            }
        }
        Err(Error::Exhausted(self.range))
    }

    /// Every lease: (address, pod UID).
    pub fn leases_held(&self) -> Result<Vec<(Ipv4Addr, String)>> {
        let entries = match std::fs::read_dir(&self.leases) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(self.lease_error(source)),
        };
        let mut held = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(ip) = name.to_str().and_then(|n| n.parse::<Ipv4Addr>().ok()) else {
                continue;
            };
            if let Ok(uid) = std::fs::read_to_string(entry.path()) {
                held.push((ip, uid.trim().to_owned()));
            }
        }
        Ok(held)
    }

    /// Frees the pod's address (if it had one).
    pub fn release(&self, pod_uid: &str) -> Result<()> {
        let _one_at_a_time = self.leasing.lock();
        for (ip, uid) in self.leases_held()? {
            if uid == pod_uid {
                match std::fs::remove_file(self.leases.join(ip.to_string())) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(source) => return Err(self.lease_error(source)),
                }
            }
        }
        Ok(())
    }

    /// Marks a sandbox as completely made (a crash mid-way leaves none).
    fn plumbed_marker(&self, pod_uid: &str) -> PathBuf {
        self.leases.join(format!("{pod_uid}.plumbed"))
    }

    /// The pod's sandbox if its namespace, links and addresses are in
    /// place, as this node's ranges call for. The marker records the IPv6
    /// address it was given: a sandbox whose IPv6 address the ranges no
    /// longer give is made again, while one made without IPv6 (before the
    /// node had an IPv6 range it could route) is kept as it is, IPv4 only,
    /// as a pod's addresses never change under it: upgrading a node
    /// restarts none of its pods.
    pub fn existing(&self, pod_uid: &str) -> Option<Sandbox> {
        let netns = self.netns_name(pod_uid);
        if !netlink::netns_path(&netns).exists() {
            return None;
        }
        let plumbed = std::fs::read_to_string(self.plumbed_marker(pod_uid)).ok()?;
        let given: Option<Ipv6Addr> = plumbed.trim().parse().ok();
        let (ip, _) = self
            .leases_held()
            .ok()?
            .into_iter()
            .find(|(_, uid)| uid == pod_uid)?;
        let ip6 = match (given, self.ip6_for(ip)) {
            (None, _) => None,
            (Some(given), Some(wanted)) if given == wanted => Some(given),
            (Some(_), _) => return None,
        };
        Some(Sandbox {
            netns,
            ip,
            ip6,
            ipv6_primary: self.ipv6_primary && ip6.is_some(),
            veth: veth_name(pod_uid),
        })
    }

    /// Creates the pod's namespace, veth and routes (from scratch: a
    /// half-made sandbox is removed first).
    pub async fn create_sandbox(&self, pod_uid: &str) -> Result<Sandbox> {
        let ip = self.lease(pod_uid)?;
        let _ = std::fs::remove_file(self.plumbed_marker(pod_uid));
        let sandbox = Sandbox {
            netns: self.netns_name(pod_uid),
            ip,
            ip6: self.ip6_for(ip),
            ipv6_primary: self.ipv6_primary && self.range6.is_some(),
            veth: veth_name(pod_uid),
        };
        self.remove_links(&sandbox).await;
        let made = self.plumb(&sandbox).await;
        if let Err(error) = made {
            self.remove_links(&sandbox).await;
            return Err(error);
        }
        let recorded = sandbox.ip6.map(|ip| ip.to_string()).unwrap_or_default();
        std::fs::write(self.plumbed_marker(pod_uid), recorded)
            .map_err(|source| self.lease_error(source))?;
        Ok(sandbox)
    }

    async fn plumb(&self, sandbox: &Sandbox) -> Result<()> {
        let name = sandbox.netns.clone();
        tokio::task::spawn_blocking(move || netlink::add_netns(&name))
            .await
            .map_err(|e| Error::Command {
                command: format!("ip netns add {}", sandbox.netns),
                message: e.to_string(),
            })??;
        let netns = sandbox.netns_path();
        let node = self.node().await?;
        node.add_veth_into(&sandbox.veth, POD_LINK, &netns, self.mtu)
            .await?;
        node.attach_up(&sandbox.veth, BRIDGE).await?;
        let pod = Netlink::connect_in(&netns)?;
        let gateway = IpAddr::V4(self.gateway());
        pod.set_up("lo").await?;
        pod.set_up(POD_LINK).await?;
        if let (Some(ip6), Some(gateway6)) = (sandbox.ip6, self.gateway6()) {
            // The node forwards pod-to-pod traffic back out of the bridge,
            // and IPv6 has no switch to stop it sending redirects then: a
            // pod that heeded one would bypass the node (and the Services'
            // reverse NAT). Pods ignore them instead.
            tokio::task::spawn_blocking({
                let netns = netns.clone();
                move || {
                    Netlink::in_netns(&netns, || {
                        for key in ["all", "default", POD_LINK] {
                            let path = format!("/proc/sys/net/ipv6/conf/{key}/accept_redirects");
                            std::fs::write(path, "0")?;
                        }
                        Ok(())
                    })
                }
            })
            .await
            .map_err(|e| Error::Command {
                command: format!("sysctl accept_redirects=0 in {}", sandbox.netns),
                message: e.to_string(),
            })??;
            pod.replace_address(POD_LINK, IpAddr::V6(ip6), 128).await?;
            pod.add_link_route(IpAddr::V6(gateway6), 128, POD_LINK)
                .await?;
            pod.add_default_route(IpAddr::V6(gateway6), POD_LINK)
                .await?;
        }
        pod.replace_address(POD_LINK, IpAddr::V4(sandbox.ip), 32)
            .await?;
        pod.add_link_route(gateway, 32, POD_LINK).await?;
        pod.add_default_route(gateway, POD_LINK).await?;
        Ok(())
    }

    /// Deletes the pod's namespace and veth (missing parts are fine).
    async fn remove_links(&self, sandbox: &Sandbox) {
        if let Ok(node) = self.node().await {
            let _ = node.delete_link(&sandbox.veth).await;
        }
        let name = sandbox.netns.clone();
        let _ = tokio::task::spawn_blocking(move || netlink::delete_netns(&name)).await;
    }

    /// Removes the sandbox and frees its address.
    pub async fn remove_sandbox(&self, pod_uid: &str) -> Result<()> {
        let sandbox = Sandbox {
            netns: self.netns_name(pod_uid),
            ip: Ipv4Addr::UNSPECIFIED,
            ip6: None,
            ipv6_primary: false,
            veth: veth_name(pod_uid),
        };
        self.remove_links(&sandbox).await;
        match std::fs::remove_file(self.plumbed_marker(pod_uid)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(self.lease_error(source)),
        }
        self.release(pod_uid)
    }

    /// Pod UIDs that have a namespace of this agent (for cleaning up pods
    /// that went away while the agent was down).
    pub fn sandboxes_on_disk(&self) -> Vec<String> {
        let prefix = format!("portal-{}-", self.tag);
        std::fs::read_dir(netlink::NETNS_DIR)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_prefix(&prefix).map(str::to_owned))
            })
            .collect()
    }
}

/// A node that forwards IPv6 ignores router advertisements unless told
/// otherwise: links that take them (`accept_ra=1`, the address or default
/// route of a SLAAC node) are told to take them anyway (`2`), so turning
/// forwarding on never costs the node its own IPv6 configuration.
fn keep_router_advertisements() {
    let forwarding = std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/forwarding");
    if forwarding.is_ok_and(|v| v.trim() == "1") {
        return;
    }
    for link in std::fs::read_dir("/proc/sys/net/ipv6/conf")
        .into_iter()
        .flatten()
        .flatten()
    {
        let path = link.path().join("accept_ra");
        if std::fs::read_to_string(&path).is_ok_and(|v| v.trim() == "1") {
            if let Err(error) = std::fs::write(&path, "2") {
                tracing::warn!(%error, path = %path.display(), "keeping router advertisements");
            }
        }
    }
}

/// The node side of a pod's veth: unique per pod, at most 15 bytes.
pub fn veth_name(pod_uid: &str) -> String {
    format!("pv{:08x}", crate::short_hash(pod_uid))
}
