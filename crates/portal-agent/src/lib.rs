//! Portal's node agent, shaped like the kubelet: pod sources (the API
//! server, manifest files, a manifest URL, manifests pushed to its API)
//! merged into one desired set → one serialized worker per pod that diffs
//! desired against actual → a runtime behind a CRI-shaped trait → a status
//! manager that writes pod status (a static pod's to its mirror pod). It
//! registers its Node, heartbeats with a Lease, gives each pod a network
//! namespace with an address from the node's pod range, and runs
//! containers from OCI images under a per-container shim, so they outlive
//! the agent.
//!
//! With no API server (none configured, or not reachable yet) it runs its
//! static pods alone; once the API server answers, the Node is registered
//! and the mirror pods appear, without restarting anything.

mod actions;
mod backoff;
mod cgroups;
mod cluster;
mod durable;
pub mod env;
mod events;
#[cfg(test)]
mod fakes;
pub mod files;
pub mod host_ports;
pub mod images;
pub mod join;
pub mod metrics;
mod mirror;
mod mountinfo;
pub mod netlink;
pub mod network;
pub mod node;
pub mod objects;
mod pods;
pub mod policy;
mod probe_results;
pub mod prober;
pub mod reset;
pub mod routes;
pub mod runtime;
pub mod server;
pub mod shim;
pub mod sources;
pub mod stats;
pub mod status;
pub mod storage;
pub mod tokens;
pub mod volumes;
pub mod vxlan;
mod wake;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Client};
use portal_api::cidr::PodCidrs;

pub use images::Mirror;
pub use metrics::Metrics;

/// Why the agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request.
    #[error("API request failed: {0}")]
    Api(#[from] kube::Error),
    /// The node's network could not be set up.
    #[error("pod network: {0}")]
    Network(#[from] network::Error),
    #[error("container runtime: {0}")]
    Runtime(#[from] runtime::Error),
    #[error("images: {0}")]
    Images(#[from] images::Error),
    /// A file or directory of the agent's could not be used.
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    /// The agent's own API could not start.
    #[error("agent API: {0}")]
    Server(#[from] server::Error),
    /// The configuration cannot work.
    #[error("{0}")]
    Config(String),
}

/// How the agent runs.
#[derive(Clone, Debug)]
pub struct Config {
    pub node_name: String,
    /// How pods reach other nodes' pods.
    pub pod_network: routes::PodNetwork,
    /// The node's address; default: its first global IPv4 address.
    pub node_ip: Option<Ipv4Addr>,
    /// The node's IPv6 address on a dual-stack network (its second
    /// InternalIP, the way to its IPv6 pods).
    pub node_ip6: Option<std::net::Ipv6Addr>,
    /// The node's `ExternalIP`s.
    pub external_ips: Vec<std::net::IpAddr>,
    /// Keeps images, containers, pod files, logs and address leases.
    pub data_dir: PathBuf,
    pub cluster_domain: String,
    /// The cluster DNS address for pods; default: the `kube-dns` Service's.
    pub cluster_dns: Option<Ipv4Addr>,
    pub mirrors: Vec<Mirror>,
    pub insecure_registries: Vec<String>,
    /// The port of the agent's API (logs, exec, attach, port-forward),
    /// reported in the Node's `daemonEndpoints`.
    pub port: i32,
    /// The CA whose client certificates may use the agent's API (the API
    /// server's); without one the API is off (no anonymous access).
    pub client_ca: Option<PathBuf>,
    /// The node's pod range when it is not (or not yet) the API's to give:
    /// needed with no API server. Default: the API's node IPAM, else the
    /// range of the last run.
    pub pod_cidr: Option<PodCidrs>,
    pub static_pods: StaticPods,
    /// How long the node's Lease lasts (renewed every quarter of it).
    pub lease_seconds: i32,
    /// When unused images are removed.
    pub image_gc: images::GcPolicy,
}

/// Where static pods come from besides the API.
#[derive(Clone, Debug)]
pub struct StaticPods {
    /// A directory of manifests (or one manifest file).
    pub manifest_path: Option<PathBuf>,
    pub file_check_frequency: Duration,
    pub manifest_url: Option<sources::url::ManifestUrl>,
    pub http_check_frequency: Duration,
    /// Accept manifests pushed to the agent's API (`PUT /manifests`).
    pub manifest_endpoint: bool,
}

impl Default for StaticPods {
    fn default() -> Self {
        StaticPods {
            manifest_path: None,
            file_check_frequency: Duration::from_secs(20),
            manifest_url: None,
            http_check_frequency: Duration::from_secs(20),
            manifest_endpoint: false,
        }
    }
}

/// A running agent.
#[derive(Debug)]
pub struct Agent {
    pub metrics: Metrics,
    /// The agent's loops; [`Supervisor::failed`](portal_client::Supervisor::failed)
    /// answers when one it cannot do without stops.
    pub tasks: portal_client::Supervisor,
}

/// A stable 32-bit FNV-1a hash, for short unique names (veths, tags).
pub(crate) fn short_hash(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// Starts running this node's pods: its static pods at once, and with an
/// API server (`client`) the pods bound to it, once it is reachable.
pub async fn start(client: Option<Client>, config: Config) -> Result<Agent, Error> {
    if !nix::unistd::Uid::effective().is_root() {
        return Err(Error::Config(
            "the node agent needs root (namespaces, mounts, cgroups)".into(),
        ));
    }
    // Before any container: runc needs the hierarchies where it runs.
    cgroups::ensure_mounted()?;
    let data = &config.data_dir;
    pods::ensure_dir(data)?;
    let data = std::fs::canonicalize(data).map_err(|source| Error::Io {
        path: data.display().to_string(),
        source,
    })?;
    // Names on the machine (netns, cgroups) carry this tag: several agents
    // side by side never collide.
    // One agent per data directory; `portal reset` checks the same lock,
    // and the one of the network namespace it programs.
    reset::lock_for_life(&data)?;
    reset::hold_network_lock();
    let tag = reset::tag(&data, &config.node_name);
    // `portal reset` finds the tag again from the data directory.
    std::fs::write(data.join(reset::NODE_NAME_FILE), &config.node_name).map_err(|source| {
        Error::Io {
            path: data.join(reset::NODE_NAME_FILE).display().to_string(),
            source,
        }
    })?;
    let ip = match config.node_ip {
        Some(ip) => ip,
        None => node_address().await,
    };
    let me = node::Identity {
        name: config.node_name.clone(),
        ip,
        ip6: config.node_ip6,
        port: config.port,
        lease_seconds: config.lease_seconds,
        pod_cidr: None,
        storage_root: Some(data.join("storage")),
        external_ips: config.external_ips.clone(),
    };
    let range = cluster::pod_range(client.as_ref(), &config, &me, &data).await?;
    let me = node::Identity {
        pod_cidr: Some(range),
        ..me
    };
    let metrics = Metrics::new();
    let pod_mtu = match config.pod_network {
        routes::PodNetwork::Vxlan => Some(vxlan::pod_mtu(ip).await),
        routes::PodNetwork::HostGw => None,
    };
    // Pods get IPv6 addresses only where the kernel has IPv6 and other
    // nodes route to them: over the VXLAN overlay (which carries IPv6
    // over the IPv4 underlay), or on host-gw via the node's own IPv6
    // address.
    let pod_ranges = match (range.v6, config.node_ip6, config.pod_network) {
        (None, _, _) => range,
        (Some(v6), _, _) if !network::ipv6_enabled() => {
            tracing::warn!(pod_cidr = %v6, "IPv6 is disabled on this node: its pods get IPv4 addresses only");
            range.ipv4_only()
        }
        (Some(_), Some(_), routes::PodNetwork::HostGw)
        | (Some(_), _, routes::PodNetwork::Vxlan) => range,
        (Some(v6), None, routes::PodNetwork::HostGw) => {
            tracing::warn!(pod_cidr = %v6, "the node has an IPv6 pod range but no IPv6 address (--node-ip IPv4,IPv6): its pods get IPv4 addresses only");
            range.ipv4_only()
        }
    };
    // On an IPv6-first cluster the kubernetes and kube-dns Services are
    // IPv6 only: IPv4-only pods, or a node that cannot reach the server's
    // IPv6 address, cannot use them.
    if range.ipv6_primary && (pod_ranges.v6.is_none() || config.node_ip6.is_none()) {
        tracing::error!("the cluster is IPv6-first, but this node has no IPv6 address (--node-ip IPv4,IPv6) or IPv6 is off: its pods cannot reach the kubernetes and kube-dns Services");
    }
    let network = network::Network::new(&tag, pod_ranges, data.join("leases")).with_mtu(pod_mtu);
    network.prepare_node().await?;
    let runtime = runtime::runc::Runc::new(data.join("runtime"), &tag)?;
    let images = Arc::new(images::ImageService::new(
        data.join("images"),
        config.mirrors.clone(),
        config.insecure_registries.clone(),
        metrics.clone(),
    )?);
    let (services, writer) = reflector::store::<Service>();
    // The cluster DNS: given, else learnt from the API (now if it answers
    // at once, else once it does), else what the last run learnt.
    let mut cluster_dns = match config.cluster_dns {
        Some(ip) => Some(vec![ip.to_string()]),
        None => cluster::saved_cluster_dns(&data),
    };
    if let (None, None, Some(client)) = (config.cluster_dns, &cluster_dns, &client) {
        let lookup =
            tokio::time::timeout(Duration::from_secs(2), cluster::kube_dns_address(client));
        if let Ok(Ok(found)) = lookup.await {
            let found: Vec<String> = found.into_iter().collect();
            cluster::save_cluster_dns(&data, &found);
            cluster_dns = Some(found);
        }
    }
    let dns = files::DnsSettings {
        cluster_dns: cluster_dns.clone().unwrap_or_default(),
        cluster_domain: config.cluster_domain.clone(),
        host_resolv_conf: std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default(),
    };
    let statics = &config.static_pods;
    let mut sources = Vec::new();
    if client.is_some() {
        sources.push(sources::Source::Api);
    }
    if statics.manifest_path.is_some() {
        sources.push(sources::Source::File);
    }
    if statics.manifest_url.is_some() {
        sources.push(sources::Source::Url);
    }
    tracing::info!(node = %me.name, ip = %me.ip, pod_cidr = %range, sources = ?sources.iter().map(|s| s.name()).collect::<Vec<_>>(), api = client.is_some(), "node agent running");
    // One way: sources, probes and the mirror manager wake pods by UID
    // (`waker`); only the pod manager (`pods`) holds the workers.
    let (waker, wakes) = wake::PodWaker::channel();
    let runtime = Arc::new(runtime);
    let status = Arc::new(status::StatusManager::new(client.clone()));
    let mirrors = Arc::new(mirror::Mirrors::default());
    let recorder = client.as_ref().map(|client| {
        portal_controllers::events::Recorder::new(client.clone(), "kubelet").on_host(&me.name)
    });
    let events = Arc::new(events::Events::new(
        recorder,
        me.name.clone(),
        mirrors.clone(),
        status.clone(),
    ));
    let context = Arc::new(pods::Context {
        prober: prober::Prober::new(runtime.clone(), events.clone(), waker.clone()),
        events,
        status,
        client: client.clone(),
        me,
        runtime,
        images: images.clone(),
        network: Arc::new(network),
        dns: parking_lot::RwLock::new(dns),
        dns_known: std::sync::atomic::AtomicBool::new(cluster_dns.is_some() || client.is_none()),
        services,
        metrics: metrics.clone(),
        desired: Arc::new(sources::Desired::expecting(&sources)),
        mirrors,
        waker,
        workers: parking_lot::Mutex::new(std::collections::HashMap::new()),
        terminating: parking_lot::Mutex::default(),
        confirmed: parking_lot::Mutex::default(),
        pods_dir: data.join("pods"),
        logs_dir: data.join("logs"),
        host_ports: host_ports::HostPorts::default(),
        tokens: tokens::Tokens::default(),
    });
    let tasks = portal_client::Supervisor::new();
    // Resource usage for `kubectl top` and autoscalers (the agent API).
    let usage = stats::Stats::new(&context.me.name);
    tasks.critical("resource usage", usage.clone().run(context.runtime.clone()));
    tasks.critical(
        "image garbage collection",
        collect_images(images, context.runtime.clone(), config.image_gc),
    );
    let (updates, received) = tokio::sync::mpsc::channel(8);
    // Ends when every static source is gone (none configured: at once).
    tasks.once("static pods", pods::merge_static(context.clone(), received));
    match &config.client_ca {
        Some(ca) => {
            let tls = server::tls_config(ca, std::net::IpAddr::V4(ip))?;
            let port = u16::try_from(config.port)
                .map_err(|_| Error::Config(format!("agent API: bad port {}", config.port)))?;
            let addr = std::net::SocketAddr::from(([0, 0, 0, 0], port));
            let endpoint = statics.manifest_endpoint.then(|| {
                server::manifests::Endpoint::new(context.me.name.clone(), updates.clone())
            });
            server::serve(context.clone(), addr, tls, endpoint, usage.clone()).await?;
        }
        None if statics.manifest_endpoint => {
            return Err(Error::Config(
                "the manifest endpoint is on the agent API, which needs --client-ca-file".into(),
            ))
        }
        None => tracing::warn!(
            "no --client-ca-file: the agent API (logs, exec, attach, port-forward) is off"
        ),
    }
    if let Some(path) = &statics.manifest_path {
        let (path, node) = (path.clone(), context.me.name.clone());
        let every = statics.file_check_frequency;
        tasks.critical(
            "manifest files",
            sources::file::run(path, node, every, updates.clone()),
        );
    }
    if let Some(url) = &statics.manifest_url {
        let (url, node) = (url.clone(), context.me.name.clone());
        let every = statics.http_check_frequency;
        tasks.critical(
            "manifest URL",
            sources::url::run(url, node, every, updates.clone()),
        );
    }
    drop(updates);
    if let Some(client) = client {
        let watch = watcher(
            Api::<Service>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect(writer);
        tasks.critical(
            "services",
            futures_util::StreamExt::for_each(watch, |_| async {}),
        );
        tasks.critical(
            "local volumes",
            storage::run(client.clone(), data.join("storage")),
        );
        let learn_dns = config.cluster_dns.is_none().then(|| data.clone());
        tasks.once(
            "node registration",
            cluster::connect(context.clone(), client.clone(), learn_dns, metrics.clone()),
        );
        let (api_pods, api_events) = tokio::sync::mpsc::channel(64);
        tasks.critical(
            "api pods",
            sources::api::run(client.clone(), context.me.name.clone(), api_pods),
        );
        tasks.critical(
            "api pods, applied",
            pods::follow_api(context.clone(), api_events),
        );
        let (routes_client, node, pod_network, ip) = (
            client.clone(),
            context.me.name.clone(),
            config.pod_network,
            context.me.ip,
        );
        // IPv6 tables (egress, policies) only where pods have IPv6: a
        // kernel without IPv6 nftables never sees them.
        let ipv6 = pod_ranges.v6.is_some();
        tasks.restarting("routes to other nodes", move || {
            routes::run(routes_client.clone(), node.clone(), pod_network, ip, ipv6)
        });
        let (policy_client, node) = (client.clone(), context.me.name.clone());
        tasks.restarting("network policies", move || {
            policy::run(policy_client.clone(), node.clone(), ipv6)
        });
        let mirroring = mirror::Mirroring {
            mirrors: context.mirrors.clone(),
            desired: context.desired.clone(),
            status: context.status.clone(),
            waker: context.waker.clone(),
            node: context.me.name.clone(),
            client,
        };
        tasks.restarting("mirror pods", move || mirror::run(mirroring.clone()));
    } else {
        drop(writer);
    }
    tasks.critical("pod workers", pods::run(context, wakes));
    Ok(Agent { metrics, tasks })
}

/// The node's first global IPv4 address (loopback when it has none), not
/// counting the pods' bridge.
pub async fn node_address() -> Ipv4Addr {
    let Ok(node) = netlink::Netlink::connect() else {
        return Ipv4Addr::LOCALHOST;
    };
    let addresses = node.global_ipv4_addresses().await.unwrap_or_default();
    for (index, ip) in addresses {
        let name = node.link_name(index).await.ok().flatten();
        if name.as_deref() != Some(network::BRIDGE) {
            return ip;
        }
    }
    Ipv4Addr::LOCALHOST
}

/// `portal images import FILE`: loads the archive's images into the
/// agent's store under `data_dir`.
pub async fn import_images(data_dir: PathBuf, archive: PathBuf) -> Result<Vec<String>, Error> {
    let images = images::ImageService::new(
        data_dir.join("images"),
        Vec::new(),
        Vec::new(),
        Metrics::new(),
    )?;
    Ok(images::import::import(&images, &archive).await?)
}

/// Checks the image filesystem every `policy.period` and removes unused
/// images past the high mark (never one a container on the node uses).
async fn collect_images<R: runtime::Runtime>(
    images: Arc<images::ImageService>,
    runtime: Arc<R>,
    policy: images::GcPolicy,
) {
    let mut every = tokio::time::interval(policy.period);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let in_use: std::collections::HashSet<String> = runtime
            .containers()
            .into_iter()
            .map(|c| c.meta.image_id)
            .collect();
        let images = images.clone();
        let _ = tokio::task::spawn_blocking(move || images.collect_garbage(&policy, &in_use)).await;
    }
}
