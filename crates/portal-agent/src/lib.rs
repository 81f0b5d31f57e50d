//! Portal's node agent, shaped like the kubelet: pod sources merged into one
//! desired set → one serialized worker per pod that diffs desired against
//! actual → a runtime behind a CRI-shaped trait → a status manager that
//! writes pod status. It registers its Node, heartbeats with a Lease, gives
//! each pod a network namespace with an address from the node's pod range,
//! and runs containers from OCI images under a per-container shim, so they
//! outlive the agent.

mod actions;
mod backoff;
pub mod env;
pub mod files;
pub mod images;
pub mod metrics;
pub mod network;
pub mod node;
mod pods;
pub mod prober;
mod quantity;
pub mod runtime;
pub mod server;
pub mod shim;
pub mod status;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};

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
    /// The node's address; default: its first global IPv4 address.
    pub node_ip: Option<Ipv4Addr>,
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
}

/// A running agent.
#[derive(Debug)]
pub struct Agent {
    pub metrics: Metrics,
}

/// A stable 32-bit FNV-1a hash, for short unique names (veths, tags).
pub(crate) fn short_hash(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// Registers the node, waits for its pod range, and starts running the
/// pods bound to it.
pub async fn start(client: Client, config: Config) -> Result<Agent, Error> {
    if !nix::unistd::Uid::effective().is_root() {
        return Err(Error::Config(
            "the node agent needs root (namespaces, mounts, cgroups)".into(),
        ));
    }
    let data = &config.data_dir;
    pods::ensure_dir(data)?;
    let data = std::fs::canonicalize(data).map_err(|source| Error::Io {
        path: data.display().to_string(),
        source,
    })?;
    // Names on the machine (netns, cgroups) carry this tag: several agents
    // side by side never collide.
    let tag = format!(
        "{:08x}",
        short_hash(&format!("{}|{}", data.display(), config.node_name))
    );
    let ip = match config.node_ip {
        Some(ip) => ip,
        None => node_address().await,
    };
    let me = node::Identity {
        name: config.node_name.clone(),
        ip,
        port: config.port,
    };
    let metrics = Metrics::new();
    let registered = node::register(&client, &me).await?;
    let node_uid = registered.uid().unwrap_or_default();
    tokio::spawn(node::heartbeat(
        client.clone(),
        me.clone(),
        node_uid,
        metrics.clone(),
    ));
    let range = node::wait_for_pod_cidr(&client, &me.name).await?;
    let range = range
        .parse()
        .map_err(|e: String| Error::Config(format!("the node's pod range: {e}")))?;
    let network = network::Network::new(&tag, range, data.join("leases"));
    network.prepare_node().await?;
    let runtime = runtime::runc::Runc::new(data.join("runtime"), &tag)?;
    let images = images::ImageService::new(
        data.join("images"),
        config.mirrors.clone(),
        config.insecure_registries.clone(),
        metrics.clone(),
    )?;
    let (services, writer) = reflector::store::<Service>();
    let watch = watcher(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(writer);
    tokio::spawn(futures_util::StreamExt::for_each(watch, |_| async {}));
    let cluster_dns = match config.cluster_dns {
        Some(ip) => vec![ip.to_string()],
        None => kube_dns_address(&client).await.into_iter().collect(),
    };
    let dns = files::DnsSettings {
        cluster_dns,
        cluster_domain: config.cluster_domain.clone(),
        host_resolv_conf: std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default(),
    };
    tracing::info!(node = %me.name, ip = %me.ip, pod_cidr = %range, dns = ?dns.cluster_dns, "node agent running");
    let context = Arc::new(pods::Context {
        events: portal_controllers::events::Recorder::new(client.clone(), "kubelet")
            .on_host(&me.name),
        status: status::StatusManager::new(client.clone()),
        client,
        me,
        runtime,
        images,
        network,
        dns,
        services,
        metrics: metrics.clone(),
        probes: prober::Probes::default(),
        desired: pods::Desired::default(),
        workers: parking_lot::Mutex::new(std::collections::HashMap::new()),
        confirmed: parking_lot::Mutex::default(),
        pods_dir: data.join("pods"),
        logs_dir: data.join("logs"),
    });
    match &config.client_ca {
        Some(ca) => {
            let tls = server::tls_config(ca, std::net::IpAddr::V4(ip))?;
            let port = u16::try_from(config.port)
                .map_err(|_| Error::Config(format!("agent API: bad port {}", config.port)))?;
            let addr = std::net::SocketAddr::from(([0, 0, 0, 0], port));
            server::serve(context.clone(), addr, tls).await?;
        }
        None => tracing::warn!(
            "no --client-ca-file: the agent API (logs, exec, attach, port-forward) is off"
        ),
    }
    tokio::spawn(pods::run(context));
    Ok(Agent { metrics })
}

/// The cluster DNS address: the `kube-system/kube-dns` Service's cluster IP.
async fn kube_dns_address(client: &Client) -> Option<String> {
    let api = Api::<Service>::namespaced(client.clone(), "kube-system");
    match api.get_opt("kube-dns").await {
        Ok(Some(service)) => service
            .spec
            .and_then(|s| s.cluster_ip)
            .filter(|ip| !ip.is_empty() && ip != "None"),
        Ok(None) => None,
        Err(error) => {
            tracing::warn!(%error, "looking up the kube-dns Service");
            None
        }
    }
}

/// The node's first global IPv4 address (loopback when it has none).
pub async fn node_address() -> Ipv4Addr {
    let output = tokio::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .await;
    let text = output
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    text.lines()
        .filter(|line| !line.contains(network::BRIDGE))
        .find_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| *w == "inet")?;
            words.next()?.split('/').next()?.parse().ok()
        })
        .unwrap_or(Ipv4Addr::LOCALHOST)
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
