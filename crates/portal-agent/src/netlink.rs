//! The kernel's network configuration, spoken directly over netlink
//! (`rtnetlink`) instead of spawning `ip` and parsing its text: links
//! (bridge, veth pairs), addresses and routes, in the agent's own network
//! namespace or inside a pod's; and named network namespaces made and
//! removed as iproute2's `ip netns add|del` does (a bind mount of the
//! namespace under `/run/netns`), so `ip netns` and `nsenter` see them.
//!
//! A netlink socket stays in the network namespace it was made in: a
//! connection into a pod's namespace is opened by a short-lived thread
//! that entered it, and then used from async code like any other.

use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use futures_util::TryStreamExt;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags, AddressScope};
use rtnetlink::packet_route::link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkMessage};
use rtnetlink::packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteProtocol, RouteScope};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::{Handle, LinkBridge, LinkMessageBuilder, LinkUnspec, RouteMessageBuilder};

/// Where named network namespaces live (iproute2's place).
pub const NETNS_DIR: &str = "/run/netns";

/// A netlink failure, with what was being done.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct Error {
    what: String,
    #[source]
    source: io::Error,
}

type Result<T, E = Error> = std::result::Result<T, E>;

fn failed(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> Error {
    let what = what.into();
    move |error| Error {
        source: as_io(error),
        what,
    }
}

fn io_failed(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let what = what.into();
    move |source| Error { what, source }
}

/// The kernel's errno in a netlink error, as an I/O error.
fn as_io(error: rtnetlink::Error) -> io::Error {
    match &error {
        rtnetlink::Error::NetlinkError(message) => match message.code {
            Some(code) => io::Error::from_raw_os_error(-code.get()),
            None => io::Error::other(error.to_string()),
        },
        _ => io::Error::other(error.to_string()),
    }
}

fn errno(error: &rtnetlink::Error) -> Option<i32> {
    match error {
        rtnetlink::Error::NetlinkError(message) => message.code.map(|code| -code.get()),
        _ => None,
    }
}

/// A netlink connection to one network namespace.
pub struct Netlink {
    handle: Handle,
}

impl std::fmt::Debug for Netlink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Netlink").finish_non_exhaustive()
    }
}

impl Netlink {
    /// In the agent's own network namespace.
    pub fn connect() -> Result<Self> {
        let (connection, handle, _) =
            rtnetlink::new_connection().map_err(io_failed("opening a netlink socket"))?;
        // Ends when the handle (the last request sender) is dropped.
        tokio::spawn(connection);
        Ok(Netlink { handle })
    }

    /// Inside the network namespace at `path`.
    pub fn connect_in(path: &Path) -> Result<Self> {
        let target = path.to_owned();
        // The socket registers with this runtime's reactor.
        let runtime = tokio::runtime::Handle::current();
        let opened = std::thread::spawn(move || {
            let namespace = File::open(&target)?;
            nix::sched::setns(&namespace, nix::sched::CloneFlags::CLONE_NEWNET)?;
            let _entered = runtime.enter();
            rtnetlink::new_connection()
        })
        .join()
        .map_err(|_| io::Error::other("the thread entering the namespace panicked"))
        .and_then(|made| made);
        let (connection, handle, _) =
            opened.map_err(io_failed(format!("netlink in {}", path.display())))?;
        tokio::spawn(connection);
        Ok(Netlink { handle })
    }

    /// Runs `f` on a short-lived thread inside the network namespace at
    /// `path` (what reads `/proc/sys/net` there sees that namespace's).
    pub fn in_netns<T: Send + 'static>(
        path: &Path,
        f: impl FnOnce() -> io::Result<T> + Send + 'static,
    ) -> Result<T> {
        let target = path.to_owned();
        std::thread::spawn(move || {
            let namespace = File::open(&target)?;
            nix::sched::setns(&namespace, nix::sched::CloneFlags::CLONE_NEWNET)?;
            f()
        })
        .join()
        .map_err(|_| io::Error::other("the thread entering the namespace panicked"))
        .and_then(|done| done)
        .map_err(io_failed(format!("in {}", path.display())))
    }

    /// The index of the link called `name`, if there is one.
    pub async fn link_index(&self, name: &str) -> Result<Option<u32>> {
        let mut links = self
            .handle
            .link()
            .get()
            .match_name(name.to_owned())
            .execute();
        match links.try_next().await {
            Ok(link) => Ok(link.map(|l| l.header.index)),
            Err(error) if errno(&error) == Some(nix::libc::ENODEV) => Ok(None),
            Err(error) => Err(failed(format!("finding link {name}"))(error)),
        }
    }

    async fn index_of(&self, name: &str) -> Result<u32> {
        self.link_index(name).await?.ok_or_else(|| Error {
            what: format!("link {name}"),
            source: io::Error::from_raw_os_error(nix::libc::ENODEV),
        })
    }

    /// Makes a bridge with a fixed MAC address (`ip link add NAME address
    /// MAC type bridge`).
    pub async fn add_bridge(&self, name: &str, mac: [u8; 6]) -> Result<()> {
        let message = LinkBridge::new(name).address(mac.to_vec()).build();
        self.handle
            .link()
            .add(message)
            .execute()
            .await
            .map_err(failed(format!("adding bridge {name}")))
    }

    /// Brings a link up.
    pub async fn set_up(&self, name: &str) -> Result<()> {
        let index = self.index_of(name).await?;
        let message = LinkUnspec::new_with_index(index).up().build();
        self.handle
            .link()
            .set(message)
            .execute()
            .await
            .map_err(failed(format!("setting {name} up")))
    }

    /// Puts a link on a bridge and brings it up.
    pub async fn attach_up(&self, name: &str, bridge: &str) -> Result<()> {
        let (index, bridge_index) = (self.index_of(name).await?, self.index_of(bridge).await?);
        let message = LinkUnspec::new_with_index(index)
            .controller(bridge_index)
            .up()
            .build();
        self.handle
            .link()
            .set(message)
            .execute()
            .await
            .map_err(failed(format!("attaching {name} to {bridge}")))
    }

    /// Gives a link an address, replacing it if it has it already. IPv6
    /// addresses skip duplicate address detection (the agent hands out
    /// every address on its links): usable at once.
    pub async fn replace_address(&self, name: &str, address: IpAddr, prefix: u8) -> Result<()> {
        let index = self.index_of(name).await?;
        let mut request = self.handle.address().add(index, address, prefix).replace();
        if address.is_ipv6() {
            request
                .message_mut()
                .attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        request
            .execute()
            .await
            .map_err(failed(format!("adding {address}/{prefix} to {name}")))
    }

    /// Makes a veth pair whose `peer` end is created inside the network
    /// namespace at `netns` (`ip link add NAME type veth peer name PEER
    /// netns NS`), both with `mtu` when given.
    pub async fn add_veth_into(
        &self,
        name: &str,
        peer: &str,
        netns: &Path,
        mtu: Option<u32>,
    ) -> Result<()> {
        let namespace =
            File::open(netns).map_err(io_failed(format!("opening {}", netns.display())))?;
        let mut peer_end = LinkMessageBuilder::<LinkUnspec>::new()
            .name(peer.to_owned())
            .setns_by_fd(namespace.as_raw_fd());
        let mut node_end =
            LinkMessageBuilder::<rtnetlink::LinkVeth>::new_with_info_kind(InfoKind::Veth)
                .name(name.to_owned());
        if let Some(mtu) = mtu {
            peer_end = peer_end.mtu(mtu);
            node_end = node_end.mtu(mtu);
        }
        let message = node_end
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer_end.build())))
            .build();
        let added = self.handle.link().add(message).execute().await;
        // The kernel has read the namespace's descriptor by now.
        drop(namespace);
        added.map_err(failed(format!("adding veth {name} (peer {peer})")))
    }

    /// Deletes a link; a missing one is not an error.
    pub async fn delete_link(&self, name: &str) -> Result<()> {
        let Some(index) = self.link_index(name).await? else {
            return Ok(());
        };
        match self.handle.link().del(index).execute().await {
            Ok(()) => Ok(()),
            Err(error) if errno(&error) == Some(nix::libc::ENODEV) => Ok(()),
            Err(error) => Err(failed(format!("deleting link {name}"))(error)),
        }
    }

    /// A route to `destination` straight on the link (`ip route add D dev
    /// NAME scope link`).
    pub async fn add_link_route(&self, destination: IpAddr, prefix: u8, name: &str) -> Result<()> {
        let index = self.index_of(name).await?;
        let route = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(destination, prefix)
            .map_err(|e| io_failed(format!("route {destination}/{prefix}"))(io::Error::other(e)))?
            .output_interface(index)
            .scope(RouteScope::Link)
            .build();
        self.handle
            .route()
            .add(route)
            .execute()
            .await
            .map_err(failed(format!(
                "adding route {destination}/{prefix} dev {name}"
            )))
    }

    /// The default route of `gateway`'s family through it on the link
    /// (`ip route add default via G dev NAME`).
    pub async fn add_default_route(&self, gateway: IpAddr, name: &str) -> Result<()> {
        let index = self.index_of(name).await?;
        let route = match gateway {
            IpAddr::V4(v4) => RouteMessageBuilder::<Ipv4Addr>::new()
                .gateway(v4)
                .output_interface(index)
                .build(),
            IpAddr::V6(v6) => RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                .gateway(v6)
                .output_interface(index)
                .build(),
        };
        self.handle
            .route()
            .add(route)
            .execute()
            .await
            .map_err(failed(format!(
                "adding default route via {gateway} dev {name}"
            )))
    }
}

impl Netlink {
    /// A link's MAC address as `ip` prints it (`02:42:ac:11:00:02`).
    pub async fn link_mac(&self, name: &str) -> Result<Option<String>> {
        let Some(link) = self.link(name).await? else {
            return Ok(None);
        };
        Ok(link
            .attributes
            .iter()
            .find_map(|attribute| match attribute {
                LinkAttribute::Address(bytes) if bytes.len() == 6 => Some(format_mac(bytes)),
                _ => None,
            }))
    }

    async fn link(&self, name: &str) -> Result<Option<LinkMessage>> {
        let mut links = self
            .handle
            .link()
            .get()
            .match_name(name.to_owned())
            .execute();
        match links.try_next().await {
            Ok(link) => Ok(link),
            Err(error) if errno(&error) == Some(nix::libc::ENODEV) => Ok(None),
            Err(error) => Err(failed(format!("finding link {name}"))(error)),
        }
    }

    /// Sets a link's MTU.
    pub async fn set_mtu(&self, name: &str, mtu: u32) -> Result<()> {
        let index = self.index_of(name).await?;
        let message = LinkUnspec::new_with_index(index).mtu(mtu).build();
        self.handle
            .link()
            .set(message)
            .execute()
            .await
            .map_err(failed(format!("setting the MTU of {name}")))
    }

    /// Every global IPv4 address with its link's index, in the kernel's order.
    pub async fn global_ipv4_addresses(&self) -> Result<Vec<(u32, Ipv4Addr)>> {
        let mut addresses = self.handle.address().get().execute();
        let mut found = Vec::new();
        while let Some(message) = addresses
            .try_next()
            .await
            .map_err(failed("listing addresses"))?
        {
            if message.header.scope != AddressScope::Universe {
                continue;
            }
            for attribute in &message.attributes {
                if let AddressAttribute::Local(IpAddr::V4(ip)) = attribute {
                    found.push((message.header.index, *ip));
                }
            }
        }
        Ok(found)
    }

    /// The MTU of the link holding `address`.
    pub async fn mtu_of_address(&self, address: Ipv4Addr) -> Result<Option<u32>> {
        let Some((index, _)) = self
            .global_ipv4_addresses()
            .await?
            .into_iter()
            .find(|(_, ip)| *ip == address)
        else {
            return Ok(None);
        };
        let mut links = self.handle.link().get().match_index(index).execute();
        let link = links
            .try_next()
            .await
            .map_err(failed(format!("finding link {index}")))?;
        Ok(link.and_then(|link| {
            link.attributes
                .iter()
                .find_map(|attribute| match attribute {
                    LinkAttribute::Mtu(mtu) => Some(*mtu),
                    _ => None,
                })
        }))
    }

    /// The name of the link with this index.
    pub async fn link_name(&self, index: u32) -> Result<Option<String>> {
        let mut links = self.handle.link().get().match_index(index).execute();
        let link = links
            .try_next()
            .await
            .map_err(failed(format!("finding link {index}")))?;
        Ok(link.and_then(|link| {
            link.attributes
                .iter()
                .find_map(|attribute| match attribute {
                    LinkAttribute::IfName(name) => Some(name.clone()),
                    _ => None,
                })
        }))
    }

    /// Makes a VXLAN device without learning (`ip link add NAME type vxlan
    /// id VNI local L dstport P nolearning`).
    pub async fn add_vxlan(&self, name: &str, vni: u32, local: Ipv4Addr, port: u16) -> Result<()> {
        let message = rtnetlink::LinkVxlan::new(name, vni)
            .local(local)
            .port(port)
            .learning(false)
            .build();
        self.handle
            .link()
            .add(message)
            .execute()
            .await
            .map_err(failed(format!("adding VXLAN device {name}")))
    }

    /// The routes (both families) of one routing protocol number in the
    /// main table: (destination, prefix length, gateway).
    pub async fn routes_of(&self, protocol: u8) -> Result<Vec<(IpAddr, u8, Option<IpAddr>)>> {
        let mut found = Vec::new();
        for filter in [
            RouteMessageBuilder::<Ipv4Addr>::new().build(),
            RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
        ] {
            let mut routes = self.handle.route().get(filter).execute();
            while let Some(route) = routes.try_next().await.map_err(failed("listing routes"))? {
                if u8::from(route.header.protocol) != protocol {
                    continue;
                }
                let mut destination = None;
                let mut gateway = None;
                for attribute in &route.attributes {
                    match attribute {
                        RouteAttribute::Destination(RouteAddress::Inet(ip)) => {
                            destination = Some(IpAddr::V4(*ip));
                        }
                        RouteAttribute::Destination(RouteAddress::Inet6(ip)) => {
                            destination = Some(IpAddr::V6(*ip));
                        }
                        RouteAttribute::Gateway(RouteAddress::Inet(ip)) => {
                            gateway = Some(IpAddr::V4(*ip));
                        }
                        RouteAttribute::Gateway(RouteAddress::Inet6(ip)) => {
                            gateway = Some(IpAddr::V6(*ip));
                        }
                        _ => {}
                    }
                }
                let Some(destination) = destination else {
                    continue;
                };
                found.push((destination, route.header.destination_prefix_length, gateway));
            }
        }
        Ok(found)
    }

    /// Adds (or, with `replace`, replaces) the route to
    /// `destination/prefix` via `gateway` (one family), marked with
    /// `protocol`; through link `onlink` when given (the gateway is taken
    /// as directly reachable on it).
    pub async fn set_route(
        &self,
        destination: IpAddr,
        prefix: u8,
        gateway: IpAddr,
        protocol: u8,
        onlink: Option<&str>,
        replace: bool,
    ) -> Result<()> {
        let what = || format!("route {destination}/{prefix} via {gateway}");
        let mut route = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(destination, prefix)
            .and_then(|r| r.gateway(gateway))
            .map_err(|e| io_failed(what())(io::Error::other(e)))?
            .protocol(RouteProtocol::from(protocol));
        if let Some(name) = onlink {
            route = route.output_interface(self.index_of(name).await?).onlink();
        }
        let request = self.handle.route().add(route.build());
        let request = if replace { request.replace() } else { request };
        request.execute().await.map_err(failed(what()))
    }

    /// Deletes the route to `destination/prefix` of `protocol`; a missing
    /// one is not an error.
    pub async fn delete_route(&self, destination: IpAddr, prefix: u8, protocol: u8) -> Result<()> {
        let what = || format!("deleting route {destination}/{prefix}");
        let route = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(destination, prefix)
            .map_err(|e| io_failed(what())(io::Error::other(e)))?
            .protocol(RouteProtocol::from(protocol))
            .build();
        match self.handle.route().del(route).execute().await {
            Ok(()) => Ok(()),
            Err(error) if errno(&error) == Some(nix::libc::ESRCH) => Ok(()),
            Err(error) => Err(failed(what())(error)),
        }
    }

    /// A permanent neighbour entry (`ip neigh replace IP lladdr MAC dev
    /// NAME nud permanent`).
    pub async fn replace_neighbour(&self, name: &str, ip: IpAddr, mac: &[u8]) -> Result<()> {
        let index = self.index_of(name).await?;
        self.handle
            .neighbours()
            .add(index, ip)
            .link_layer_address(mac)
            .state(NeighbourState::Permanent)
            .replace()
            .execute()
            .await
            .map_err(failed(format!("neighbour {ip} on {name}")))
    }

    /// The link's neighbour entries: (message, address), to delete by.
    async fn neighbour_entries(
        &self,
        name: &str,
        family: AddressFamily,
    ) -> Result<Vec<NeighbourMessage>> {
        let index = self.index_of(name).await?;
        let mut request = self.handle.neighbours().get();
        request.message_mut().header.family = family;
        let mut entries = request.execute();
        let mut found = Vec::new();
        while let Some(entry) = entries
            .try_next()
            .await
            .map_err(failed(format!("listing neighbours of {name}")))?
        {
            if entry.header.ifindex == index {
                found.push(entry);
            }
        }
        Ok(found)
    }

    /// The neighbours on the link, of both families.
    pub async fn neighbours(&self, name: &str) -> Result<Vec<IpAddr>> {
        let mut found = Vec::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let entries = self.neighbour_entries(name, family).await?;
            found.extend(entries.iter().filter_map(neighbour_address));
        }
        Ok(found)
    }

    /// Deletes the neighbour entry for `ip` on the link.
    pub async fn delete_neighbour(&self, name: &str, ip: IpAddr) -> Result<()> {
        let family = match ip {
            IpAddr::V4(_) => AddressFamily::Inet,
            IpAddr::V6(_) => AddressFamily::Inet6,
        };
        for entry in self.neighbour_entries(name, family).await? {
            let matches = neighbour_address(&entry) == Some(ip);
            if matches {
                self.handle
                    .neighbours()
                    .del(entry)
                    .execute()
                    .await
                    .map_err(failed(format!("deleting neighbour {ip} on {name}")))?;
            }
        }
        Ok(())
    }

    /// A permanent forwarding entry of the device itself (`bridge fdb
    /// replace MAC dev NAME dst IP self permanent`).
    pub async fn replace_fdb(&self, name: &str, mac: &[u8], destination: Ipv4Addr) -> Result<()> {
        let index = self.index_of(name).await?;
        self.handle
            .neighbours()
            .add_bridge(index, mac)
            .destination(IpAddr::V4(destination))
            .flags(NeighbourFlags::Own)
            .state(NeighbourState::Permanent)
            .replace()
            .execute()
            .await
            .map_err(failed(format!(
                "forwarding entry for {destination} on {name}"
            )))
    }

    /// The device's forwarding entries: (MAC, destination).
    pub async fn fdb(&self, name: &str) -> Result<Vec<(String, Ipv4Addr)>> {
        Ok(self
            .neighbour_entries(name, AddressFamily::Bridge)
            .await?
            .iter()
            .filter_map(|entry| {
                let mut mac = None;
                let mut destination = None;
                for attribute in &entry.attributes {
                    match attribute {
                        NeighbourAttribute::LinkLayerAddress(bytes) if bytes.len() == 6 => {
                            mac = Some(format_mac(bytes));
                        }
                        NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => {
                            destination = Some(*ip);
                        }
                        _ => {}
                    }
                }
                Some((mac?, destination?))
            })
            .collect())
    }

    /// Deletes the device's forwarding entry for `mac` towards `destination`.
    pub async fn delete_fdb(&self, name: &str, mac: &str, destination: Ipv4Addr) -> Result<()> {
        for entry in self.neighbour_entries(name, AddressFamily::Bridge).await? {
            let has = |wanted: &NeighbourAttribute| entry.attributes.contains(wanted);
            let Some(bytes) = parse_mac(mac) else {
                return Ok(());
            };
            if has(&NeighbourAttribute::LinkLayerAddress(bytes.to_vec()))
                && has(&NeighbourAttribute::Destination(NeighbourAddress::Inet(
                    destination,
                )))
            {
                self.handle
                    .neighbours()
                    .del(entry)
                    .execute()
                    .await
                    .map_err(failed(format!("deleting forwarding entry {mac} on {name}")))?;
            }
        }
        Ok(())
    }
}

/// The address a neighbour entry is for.
fn neighbour_address(entry: &NeighbourMessage) -> Option<IpAddr> {
    entry
        .attributes
        .iter()
        .find_map(|attribute| match attribute {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => Some(IpAddr::V4(*ip)),
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(ip)) => Some(IpAddr::V6(*ip)),
            _ => None,
        })
}

/// A MAC address as `ip` prints it (`02:42:ac:11:00:02`).
fn format_mac(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A MAC address's six bytes from `02:42:ac:11:00:02`.
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut bytes = [0u8; 6];
    let mut parts = text.trim().split(':');
    for byte in &mut bytes {
        let part = parts.next()?;
        if part.len() != 2 {
            return None;
        }
        *byte = u8::from_str_radix(part, 16).ok()?;
    }
    parts.next().is_none().then_some(bytes)
}

/// The path of the named network namespace.
pub fn netns_path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

/// Makes a named network namespace (`ip netns add NAME`): a new namespace
/// bind-mounted on `/run/netns/NAME`, which keeps it alive without a
/// process in it. Blocking: call it off the async threads.
pub fn add_netns(name: &str) -> Result<()> {
    use nix::mount::{mount, MsFlags};
    let what = || format!("ip netns add {name}");
    let dir = Path::new(NETNS_DIR);
    std::fs::create_dir_all(dir).map_err(io_failed(what()))?;
    // As iproute2: mounts under the directory propagate to the mount
    // namespaces that share it (the directory made a mount point first if
    // it is not one).
    let shared = MsFlags::MS_SHARED | MsFlags::MS_REC;
    if mount(None::<&str>, dir, None::<&str>, shared, None::<&str>).is_err() {
        mount(
            Some(dir),
            dir,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(|e| io_failed(what())(e.into()))?;
        mount(None::<&str>, dir, None::<&str>, shared, None::<&str>)
            .map_err(|e| io_failed(what())(e.into()))?;
    }
    let path = netns_path(name);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(io_failed(what()))?;
    // Only this thread moves to the new namespace, and it ends here.
    let target = path.clone();
    let made = std::thread::spawn(move || -> io::Result<()> {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)?;
        mount(
            Some("/proc/thread-self/ns/net"),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )?;
        Ok(())
    })
    .join()
    .map_err(|_| io::Error::other("the thread making the namespace panicked"))
    .and_then(|made| made);
    if let Err(error) = made {
        let _ = std::fs::remove_file(&path);
        return Err(io_failed(what())(error));
    }
    Ok(())
}

/// Removes a named network namespace (`ip netns del NAME`); a missing one
/// is not an error. Blocking.
pub fn delete_netns(name: &str) -> Result<()> {
    let path = netns_path(name);
    // Not mounted (a half-made one) or already gone: fine.
    let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_failed(format!("ip netns del {name}"))(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse_as_ip_prints_them() {
        assert_eq!(
            parse_mac("02:50:4F:52:54:01"),
            Some([0x02, 0x50, 0x4f, 0x52, 0x54, 0x01])
        );
        assert_eq!(parse_mac("02:50:4f:52:54"), None);
        assert_eq!(parse_mac("02:50:4f:52:54:01:02"), None);
        assert_eq!(parse_mac("2:50:4f:52:54:01"), None);
        assert_eq!(parse_mac("zz:50:4f:52:54:01"), None);
    }
}
