//! Userspace mode (SPEC P3): a listening socket per Service port (on the
//! node address, and on its node port), each connection or UDP client sent
//! to an endpoint by round robin or ClientIP affinity, with a retry on
//! another endpoint when a connect fails. The proxying needs no privilege;
//! where nftables is usable, cluster IPs, external and load-balancer
//! addresses are redirected to the listeners by the kernel.

mod balancer;
mod splice;
mod tcp;
mod udp;

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;

use tokio::runtime::Handle;
use tokio::task::AbortHandle;

use crate::model::{Protocol, ServiceKey, ServicePort};
use crate::nftables::{NftCommand, Nftables};
use crate::tracker::Changes;
use balancer::Balancer;

/// A Service port's listeners.
#[derive(Debug)]
struct Listener {
    balancer: Arc<Balancer>,
    /// Where the proxy listens for this port (on the node address).
    addr: SocketAddrV4,
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

#[derive(Debug)]
pub struct Userspace {
    bind: Ipv4Addr,
    /// The kernel rules sending Service addresses to the listeners.
    redirect: Option<Nftables<NftCommand>>,
    handle: Handle,
    listeners: HashMap<(ServiceKey, String, Protocol), Listener>,
    /// Services with a port that could not listen (node port taken):
    /// tried again at each sync without failing the others.
    unbound: BTreeMap<ServiceKey, Vec<ServicePort>>,
}

impl Userspace {
    /// Listeners bind `bind`; with `redirect` (the node address), nftables
    /// sends Service traffic to them.
    pub fn new(bind: Ipv4Addr, redirect: Option<Ipv4Addr>, handle: Handle) -> Self {
        Self {
            bind,
            redirect: redirect.map(|_| Nftables::redirecting()),
            handle,
            listeners: HashMap::new(),
            unbound: BTreeMap::new(),
        }
    }

    /// Binds the port's listener (a free port on the node address) and
    /// its node port, and serves them.
    fn open(
        &self,
        port: &ServicePort,
        balancer: &Arc<Balancer>,
    ) -> std::io::Result<(SocketAddrV4, Vec<AbortHandle>)> {
        let (addr, main) = self.serve(port.protocol, SocketAddrV4::new(self.bind, 0), balancer)?;
        let mut tasks = vec![main];
        if let Some(node_port) = port.node_port {
            match self.serve(
                port.protocol,
                SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, node_port),
                balancer,
            ) {
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
        addr: SocketAddrV4,
        balancer: &Arc<Balancer>,
    ) -> std::io::Result<(SocketAddrV4, AbortHandle)> {
        // Registering sockets with the reactor needs the runtime's context.
        let _guard = self.handle.enter();
        let balancer = balancer.clone();
        Ok(match protocol {
            Protocol::Tcp => {
                let listener = tcp::listen(addr)?;
                (
                    tcp::local_v4(listener.local_addr()?),
                    self.handle
                        .spawn(tcp::serve(listener, balancer))
                        .abort_handle(),
                )
            }
            Protocol::Udp => {
                let socket = udp::bind(addr)?;
                (
                    tcp::local_v4(socket.local_addr()?),
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
                .retain(|(key, _, _), _| services.contains_key(key));
        }
        for (key, ports) in services {
            let wanted: Vec<(String, Protocol)> = ports
                .iter()
                .map(|p| (p.port_name.clone(), p.protocol))
                .collect();
            self.listeners.retain(|(k, name, protocol), _| {
                k != key || wanted.contains(&(name.clone(), *protocol))
            });
            for port in ports {
                let slot = (key.clone(), port.port_name.clone(), port.protocol);
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
                        let listener =
                            self.listeners
                                .get(&(key.clone(), p.port_name.clone(), p.protocol))?;
                        Some(ServicePort {
                            // None yet: rejected in the kernel, as in kernel mode.
                            endpoints: if p.endpoints.is_empty() {
                                Vec::new()
                            } else {
                                vec![std::net::SocketAddr::V4(listener.addr)]
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
        // IPv4 only: the listeners are the node's IPv4 sockets (IPv6
        // Services need the kernel mode).
        services.extend(changes.services.iter().map(|(k, ports)| {
            let v4 = ports
                .iter()
                .filter(|p| p.family() == crate::model::Family::V4);
            (k.clone(), v4.cloned().collect())
        }));
        self.sync_listeners(&services, full);
        if self.redirect.is_some() {
            let redirected = self.redirected(&Changes {
                services,
                triggers: Vec::new(),
            });
            if let Some(nft) = &mut self.redirect {
                nft.sync(&redirected, full).map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    fn tampered(&mut self) -> bool {
        self.redirect.as_mut().is_some_and(Nftables::tampered)
    }
}
