//! Userspace mode (SPEC P3): a listening socket per Service port (on the
//! node address of the port's family, and on its node port), each
//! connection or UDP client sent to an endpoint by round robin or ClientIP
//! affinity, with a retry on another endpoint when a connect fails. The
//! proxying needs no privilege; where nftables is usable, cluster IPs,
//! external and load-balancer addresses are redirected to the listeners
//! by the kernel (an `ip` and, on a node with an IPv6 address, an `ip6`
//! table). IPv6 Service ports are served once the node has an IPv6
//! address (`--node-ip IPv4,IPv6`).

mod balancer;
mod splice;
mod tcp;
mod udp;

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use tokio::runtime::Handle;
use tokio::task::AbortHandle;

use crate::model::{Family, Protocol, ServiceKey, ServicePort};
use crate::nftables::{NftCommand, Nftables};
use crate::tracker::Changes;
use balancer::Balancer;

/// A Service port's listeners.
#[derive(Debug)]
struct Listener {
    balancer: Arc<Balancer>,
    /// Where the proxy listens for this port (on the node address).
    addr: SocketAddr,
    node_port: Option<u16>,
    tasks: Vec<AbortHandle>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// A non-blocking socket for a listener at `addr`: IPv6 sockets IPv6 only
/// (a Service's IPv6 node port must not take the IPv4 one's port); TCP
/// ones reuse the address (a port in TIME_WAIT), UDP ones do not (on
/// Linux that would share a port someone else holds).
fn socket(addr: SocketAddr, kind: socket2::Type) -> std::io::Result<socket2::Socket> {
    let socket = socket2::Socket::new(socket2::Domain::for_address(addr), kind, None)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    if kind == socket2::Type::STREAM {
        socket.set_reuse_address(true)?;
    }
    socket.set_nonblocking(true)?;
    Ok(socket)
}

/// Binds, waiting briefly while the address is still held by a listener
/// whose task was just aborted (abort takes effect asynchronously).
fn retry_in_use<T>(mut bind: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    let mut attempts = 0;
    loop {
        match bind() {
            Err(error) if error.kind() == std::io::ErrorKind::AddrInUse && attempts < 20 => {
                attempts += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            result => return result,
        }
    }
}

/// A listener's slot: a Service port of one family.
type Slot = (ServiceKey, String, Protocol, Family);

fn slot(key: &ServiceKey, port: &ServicePort) -> Slot {
    (
        key.clone(),
        port.port_name.clone(),
        port.protocol,
        port.family(),
    )
}

#[derive(Debug)]
pub struct Userspace {
    bind: Ipv4Addr,
    /// The node's IPv6 address: IPv6 Service ports listen there.
    bind6: Option<Ipv6Addr>,
    /// The kernel rules sending Service addresses to the listeners, per
    /// family.
    redirect: Option<Nftables<NftCommand>>,
    redirect6: Option<Nftables<NftCommand>>,
    /// The IPv6 table's last sync failed: the next is a full one (the
    /// IPv4 side carries on, as in kernel mode).
    v6_failed: bool,
    handle: Handle,
    listeners: HashMap<Slot, Listener>,
    /// Services with a port that could not listen (node port taken):
    /// tried again at each sync without failing the others.
    unbound: BTreeMap<ServiceKey, Vec<ServicePort>>,
}

impl Userspace {
    /// Listeners bind `bind` (and `bind6` for IPv6 Service ports); with
    /// `redirect`, nftables sends Service traffic to them (IPv6's where
    /// `redirect6`: nftables has its ip6 family here).
    pub fn new(
        bind: Ipv4Addr,
        bind6: Option<Ipv6Addr>,
        (redirect, redirect6): (bool, bool),
        handle: Handle,
    ) -> Self {
        Self {
            bind,
            bind6,
            redirect: redirect.then(|| Nftables::redirecting(Family::V4)),
            redirect6: (redirect && redirect6 && bind6.is_some())
                .then(|| Nftables::redirecting(Family::V6)),
            v6_failed: false,
            handle,
            listeners: HashMap::new(),
            unbound: BTreeMap::new(),
        }
    }

    /// The address this port's listener binds (port 0: any free one), and
    /// the wildcard of its family for its node port; `None`: the node has
    /// no address of the port's family.
    fn addresses(&self, port: &ServicePort) -> Option<(IpAddr, IpAddr)> {
        match port.family() {
            Family::V4 => Some((self.bind.into(), Ipv4Addr::UNSPECIFIED.into())),
            Family::V6 => Some((self.bind6?.into(), Ipv6Addr::UNSPECIFIED.into())),
        }
    }

    /// Binds the port's listener (a free port on the node address) and
    /// its node port, and serves them.
    fn open(
        &self,
        port: &ServicePort,
        balancer: &Arc<Balancer>,
    ) -> std::io::Result<(SocketAddr, Vec<AbortHandle>)> {
        let Some((node, any)) = self.addresses(port) else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrNotAvailable,
                "the node has no IPv6 address (--node-ip IPv4,IPv6)",
            ));
        };
        let (addr, main) = self.serve(port.protocol, SocketAddr::new(node, 0), balancer)?;
        let mut tasks = vec![main];
        if let Some(node_port) = port.node_port {
            match self.serve(port.protocol, SocketAddr::new(any, node_port), balancer) {
                Ok((_, task)) => tasks.push(task),
                Err(error) => {
                    tasks.iter().for_each(AbortHandle::abort);
                    return Err(error);
                }
            }
        }
        Ok((addr, tasks))
    }

    fn serve(
        &self,
        protocol: Protocol,
        addr: SocketAddr,
        balancer: &Arc<Balancer>,
    ) -> std::io::Result<(SocketAddr, AbortHandle)> {
        // Registering sockets with the reactor needs the runtime's context.
        let _guard = self.handle.enter();
        let balancer = balancer.clone();
        Ok(match protocol {
            Protocol::Tcp => {
                let listener = tcp::listen(addr)?;
                (
                    listener.local_addr()?,
                    self.handle
                        .spawn(tcp::serve(listener, balancer))
                        .abort_handle(),
                )
            }
            Protocol::Udp => {
                let socket = udp::bind(addr)?;
                (
                    socket.local_addr()?,
                    self.handle
                        .spawn(udp::serve(socket, balancer))
                        .abort_handle(),
                )
            }
        })
    }

    /// Opens, updates and closes listeners for `services` (every Service
    /// when `full`).
    fn sync_listeners(&mut self, services: &BTreeMap<ServiceKey, Vec<ServicePort>>, full: bool) {
        if full {
            // Keep listeners of Services still present (no reconnects).
            self.listeners
                .retain(|(key, ..), _| services.contains_key(key));
        }
        for (key, ports) in services {
            let wanted: Vec<(String, Protocol, Family)> = ports
                .iter()
                .map(|p| (p.port_name.clone(), p.protocol, p.family()))
                .collect();
            self.listeners.retain(|(k, name, protocol, family), _| {
                k != key || wanted.contains(&(name.clone(), *protocol, *family))
            });
            for port in ports {
                let slot = slot(key, port);
                if let Some(listener) = self.listeners.get(&slot) {
                    if listener.node_port == port.node_port {
                        listener.balancer.update(port);
                        continue;
                    }
                    self.listeners.remove(&slot);
                }
                let balancer = Arc::new(Balancer::new(port));
                match self.open(port, &balancer) {
                    Ok((addr, tasks)) => {
                        tracing::debug!(service = %port.id(), %addr, "userspace listener");
                        self.listeners.insert(
                            slot,
                            Listener {
                                balancer,
                                addr,
                                node_port: port.node_port,
                                tasks,
                            },
                        );
                    }
                    Err(error) => {
                        tracing::warn!(service = %port.id(), node_port = ?port.node_port, %error, "cannot listen; retrying at the next sync");
                        self.unbound.insert(key.clone(), ports.clone());
                    }
                }
            }
        }
    }

    /// The Service ports as the kernel should see them: their only
    /// "endpoint" is the listener, no affinity (the proxy keeps it).
    fn redirected(&self, changes: &Changes) -> Changes {
        let services: BTreeMap<ServiceKey, Vec<ServicePort>> = changes
            .services
            .iter()
            .map(|(key, ports)| {
                let ports = ports
                    .iter()
                    .filter_map(|p| {
                        let listener = self.listeners.get(&slot(key, p))?;
                        Some(ServicePort {
                            // None yet: rejected in the kernel, as in kernel mode.
                            endpoints: if p.endpoints.is_empty() {
                                Vec::new()
                            } else {
                                vec![listener.addr]
                            },
                            affinity: None,
                            // The listener on the node port serves it directly.
                            node_port: None,
                            // The listener picks (traffic policies are not
                            // applied in userspace mode).
                            local_endpoints: Vec::new(),
                            internal_local: false,
                            external_local: false,
                            ..p.clone()
                        })
                    })
                    .collect();
                (key.clone(), ports)
            })
            .collect();
        Changes {
            services,
            triggers: Vec::new(),
        }
    }
}

impl crate::runner::Backend for Userspace {
    fn sync(&mut self, changes: &Changes, full: bool) -> Result<(), String> {
        // Services with a port that could not listen last time are tried again.
        let mut services = if full {
            BTreeMap::new()
        } else {
            std::mem::take(&mut self.unbound)
        };
        self.unbound.clear();
        // The ports of a family the node has an address of (IPv6 ones
        // wait for `--node-ip IPv4,IPv6`).
        services.extend(changes.services.iter().map(|(k, ports)| {
            let served = ports.iter().filter(|p| self.addresses(p).is_some());
            (k.clone(), served.cloned().collect())
        }));
        self.sync_listeners(&services, full);
        if self.redirect.is_some() {
            let redirected = self.redirected(&Changes {
                services,
                triggers: Vec::new(),
            });
            // (Each table takes its family's ports.)
            if let Some(nft) = &mut self.redirect6 {
                match nft.sync(&redirected, full) {
                    Ok(()) => self.v6_failed = false,
                    Err(error) => {
                        tracing::warn!(%error, "IPv6 redirect rules failed; the next sync rebuilds them");
                        self.v6_failed = true;
                    }
                }
            }
            if let Some(nft) = &mut self.redirect {
                nft.sync(&redirected, full).map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    fn wants_full(&self) -> bool {
        self.v6_failed
    }

    fn tampered(&mut self) -> bool {
        let v4 = self.redirect.as_mut().is_some_and(Nftables::tampered);
        v4 | self.redirect6.as_mut().is_some_and(Nftables::tampered)
    }
}
