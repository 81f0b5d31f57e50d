//! The node agent's commands: `portal agent`, `portal images import`, the
//! hidden `portal shim` the runtime starts per container, and the agent
//! options `portal server` shares.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use portal_agent::Mirror;

use crate::Error;

/// Agent settings shared by `portal agent` and `portal server`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct AgentOptions {
    /// This node's name (default: the host name).
    #[arg(long)]
    pub node_name: Option<String>,
    /// Pulls from REGISTRY go to URL instead (REGISTRY=URL, repeatable),
    /// e.g. docker.io=http://127.0.0.1:5000.
    #[arg(long = "registry-mirror", value_name = "REGISTRY=URL")]
    pub mirrors: Vec<Mirror>,
    /// Registries (HOST:PORT) reached over plain HTTP (loopback ones always are).
    #[arg(long = "insecure-registry", value_name = "HOST:PORT")]
    pub insecure_registries: Vec<String>,
    /// The DNS server pods use (default: the kube-dns Service's address).
    #[arg(long)]
    pub cluster_dns: Option<Ipv4Addr>,
    /// Addresses this node is reached at from outside the cluster, shown as
    /// its ExternalIPs (comma-separated or repeated).
    #[arg(long = "node-external-ip", value_name = "IP", value_delimiter = ',')]
    pub node_external_ips: Vec<std::net::IpAddr>,
    /// The port of the agent's API (logs, exec, attach, port-forward).
    #[arg(long, default_value_t = 10250)]
    pub agent_port: u16,
    /// Static pods: a directory of Pod manifests (YAML or JSON, hidden
    /// files skipped), or one manifest file.
    #[arg(long, value_name = "DIR")]
    pub pod_manifest_path: Option<PathBuf>,
    /// How often the manifest directory is read again (besides at once on
    /// a change).
    #[arg(long, default_value = "20s", value_parser = crate::parse_period)]
    pub file_check_frequency: std::time::Duration,
    /// Static pods: a URL serving Pod manifests.
    #[arg(long, value_name = "URL")]
    pub manifest_url: Option<String>,
    /// A header sent with the manifest URL's requests (repeatable).
    #[arg(long = "manifest-url-header", value_name = "NAME:VALUE", value_parser = parse_header)]
    pub manifest_url_headers: Vec<(String, String)>,
    /// How often the manifest URL is fetched.
    #[arg(long, default_value = "20s", value_parser = crate::parse_period)]
    pub http_check_frequency: std::time::Duration,
    /// Accept static pods pushed to the agent API (`PUT /manifests`;
    /// client certificates of the agent's client CA only).
    #[arg(long)]
    pub manifest_endpoint: bool,
    /// The node's pod range when the API does not give it: required with
    /// no API server (default: node IPAM's, kept across restarts). An IPv4
    /// CIDR, and an IPv6 one after a comma for dual-stack pods.
    #[arg(long, value_name = "CIDR[,CIDR]")]
    pub pod_cidr: Option<portal_api::cidr::PodCidrs>,
    /// How pods reach other nodes' pods: routes via the nodes' addresses
    /// (host-gw: nodes on one link) or a VXLAN overlay (any routed network).
    #[arg(long, value_enum, default_value = "host-gw")]
    pub pod_network: PodNetwork,
    /// How long the node's Lease lasts; it is renewed every quarter of it
    /// (keep that well below the controllers' --node-monitor-grace-period).
    #[arg(long, default_value_t = portal_agent::node::LEASE_SECONDS, value_parser = clap::value_parser!(i32).range(1..=3600))]
    pub node_lease_duration_seconds: i32,
    /// Unused images are removed when the disk holding them is used at or
    /// above this percentage…
    #[arg(long, default_value_t = 85, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub image_gc_high_threshold: u8,
    /// …until it is used at most this much.
    #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub image_gc_low_threshold: u8,
    /// Images used more recently than this are kept.
    #[arg(long, default_value = "2m", value_parser = crate::parse_period)]
    pub image_minimum_gc_age: std::time::Duration,
    /// How often the image disk is checked (the kubelet's is five minutes).
    #[arg(long, default_value = "5m", value_parser = crate::parse_period)]
    pub image_gc_period: std::time::Duration,
}

/// `--pod-network`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum PodNetwork {
    HostGw,
    Vxlan,
}

/// `NAME:VALUE`, as kubelet's `--manifest-url-header`.
fn parse_header(text: &str) -> Result<(String, String), String> {
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?}: not NAME:VALUE"))?;
    let name = name.trim();
    http::HeaderName::from_bytes(name.as_bytes()).map_err(|e| format!("{name:?}: {e}"))?;
    http::HeaderValue::from_str(value.trim()).map_err(|e| format!("{name}: {e}"))?;
    Ok((name.to_owned(), value.trim().to_owned()))
}

/// `--node-ip` of a node: its IPv4 address, and on a dual-stack network its
/// IPv6 one after a comma (`192.168.1.2,fd00:1::2`), as the kubelet takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NodeIps {
    pub v4: Ipv4Addr,
    pub v6: Option<std::net::Ipv6Addr>,
}

impl std::str::FromStr for NodeIps {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        let v4 = |text: &str| {
            text.parse::<Ipv4Addr>()
                .map_err(|_| format!("{text:?}: the node's first address must be IPv4"))
        };
        match parts.as_slice() {
            [one] => Ok(NodeIps {
                v4: v4(one)?,
                v6: None,
            }),
            [first, second] => Ok(NodeIps {
                v4: v4(first)?,
                v6: Some(
                    second
                        .parse()
                        .map_err(|_| format!("{second:?}: the second address must be IPv6"))?,
                ),
            }),
            _ => Err(format!("{s:?}: one address, or two (IPv4, then IPv6)")),
        }
    }
}

impl AgentOptions {
    pub(crate) fn node_name(&self) -> String {
        self.node_name.clone().unwrap_or_else(hostname)
    }

    pub(crate) fn config(
        &self,
        data_dir: PathBuf,
        node_ip: Option<Ipv4Addr>,
        node_ip6: Option<std::net::Ipv6Addr>,
        cluster_domain: &str,
        client_ca: Option<PathBuf>,
    ) -> portal_agent::Config {
        portal_agent::Config {
            node_name: self.node_name(),
            pod_network: match self.pod_network {
                PodNetwork::HostGw => portal_agent::routes::PodNetwork::HostGw,
                PodNetwork::Vxlan => portal_agent::routes::PodNetwork::Vxlan,
            },
            node_ip,
            node_ip6,
            external_ips: self.node_external_ips.clone(),
            data_dir,
            cluster_domain: cluster_domain.to_owned(),
            cluster_dns: self.cluster_dns,
            mirrors: self.mirrors.clone(),
            insecure_registries: self.insecure_registries.clone(),
            port: i32::from(self.agent_port),
            client_ca,
            pod_cidr: self.pod_cidr,
            lease_seconds: self.node_lease_duration_seconds,
            image_gc: portal_agent::images::GcPolicy {
                high_percent: self.image_gc_high_threshold,
                low_percent: self
                    .image_gc_low_threshold
                    .min(self.image_gc_high_threshold),
                minimum_age: self.image_minimum_gc_age,
                period: self.image_gc_period,
            },
            static_pods: portal_agent::StaticPods {
                manifest_path: self.pod_manifest_path.clone(),
                file_check_frequency: self.file_check_frequency,
                manifest_url: self.manifest_url.clone().map(|url| {
                    portal_agent::sources::url::ManifestUrl {
                        url,
                        headers: self.manifest_url_headers.clone(),
                    }
                }),
                http_check_frequency: self.http_check_frequency,
                manifest_endpoint: self.manifest_endpoint,
            },
        }
    }
}

/// The machine's host name, lower-cased (a valid node name).
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_ascii_lowercase())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Joining a cluster with its node token (`portal agent`, `portal node`).
#[derive(clap::Args, Debug)]
pub(crate) struct JoinArgs {
    /// The API server to join, e.g. https://192.168.1.10:6443 (with
    /// --token or --token-file): the node gets its own certificate.
    #[arg(long, value_name = "URL", requires = "token_given")]
    pub server: Option<String>,
    /// The cluster's node token (the server's DIR/node-token).
    #[arg(
        long,
        env = "PORTAL_TOKEN",
        hide_env_values = true,
        group = "token_given"
    )]
    token: Option<portal_api::join::NodeToken>,
    /// A file holding the node token.
    #[arg(long, value_name = "FILE", group = "token_given")]
    token_file: Option<PathBuf>,
}

impl JoinArgs {
    /// Joins when --server is given: the node's kubeconfig and client CA.
    pub(crate) async fn join(
        &self,
        node: &str,
        dir: &std::path::Path,
    ) -> Result<Option<portal_agent::join::Joined>, Error> {
        let Some(server) = &self.server else {
            return Ok(None);
        };
        let token = match (&self.token, &self.token_file) {
            (Some(token), _) => token.clone(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|e| Error::Usage(format!("{}: {e}", path.display())))?
                .parse()
                .map_err(|e| Error::Usage(format!("{}: {e}", path.display())))?,
            (None, None) => {
                return Err(Error::Usage(
                    "--server needs --token or --token-file".into(),
                ))
            }
        };
        Ok(Some(
            portal_agent::join::join(server, &token, node, dir).await?,
        ))
    }
}

#[derive(clap::Args, Debug)]
pub(crate) struct AgentArgs {
    /// Credentials and address of the API server. Without one (or
    /// --server) the agent runs standalone: static pods only (needs
    /// --pod-cidr).
    #[arg(long, conflicts_with = "server")]
    kubeconfig: Option<PathBuf>,
    #[command(flatten)]
    join: JoinArgs,
    /// Keeps images, containers, pod files, logs and address leases.
    #[arg(long, default_value = "/var/lib/portal/agent")]
    data_dir: PathBuf,
    /// This node's address (default: its first global IPv4 address), and
    /// its IPv6 one after a comma on a dual-stack network.
    #[arg(long, value_name = "IP[,IPv6]")]
    node_ip: Option<NodeIps>,
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    #[command(flatten)]
    options: AgentOptions,
    /// Where to serve /metrics and /healthz.
    #[arg(long, default_value = "127.0.0.1:10248")]
    metrics_bind: SocketAddr,
    /// Client certificates from this CA may use the agent's API: the API
    /// server's `DIR/pki/kubelet-client-ca.crt` (joining with --server
    /// fetches it). Without it the agent serves no logs, exec, attach or
    /// port-forward.
    #[arg(long)]
    client_ca_file: Option<PathBuf>,
}

pub(crate) async fn agent(args: AgentArgs) -> Result<(), Error> {
    let joined = args
        .join
        .join(&args.options.node_name(), &args.data_dir)
        .await?;
    let kubeconfig = joined
        .as_ref()
        .map(|j| j.kubeconfig.clone())
        .or(args.kubeconfig.clone());
    let client = match &kubeconfig {
        Some(path) => Some(portal_client::client_from_kubeconfig(path, "portal-agent").await?),
        None => None,
    };
    let client_ca = args.client_ca_file.or(joined.map(|j| j.client_ca));
    let addr = args.metrics_bind;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Metrics { addr, source })?;
    let config = args.options.config(
        args.data_dir,
        args.node_ip.map(|ips| ips.v4),
        args.node_ip.and_then(|ips| ips.v6),
        &args.cluster_domain,
        client_ca,
    );
    let agent = portal_agent::start(client, config).await?;
    let (metrics, health) = (agent.metrics.clone(), agent.metrics.clone());
    tokio::spawn(crate::serve_metrics_and_health(
        listener,
        move || metrics.encode(),
        move || health.healthy(),
    ));
    crate::until_signal_or_failure(&agent.tasks, "containers keep running").await
}

#[derive(clap::Args, Debug)]
pub(crate) struct ImagesArgs {
    #[command(subcommand)]
    command: ImagesCommand,
}

#[derive(clap::Subcommand, Debug)]
enum ImagesCommand {
    /// Load the images of an OCI archive or a `docker save` tarball.
    Import {
        /// The archive.
        file: PathBuf,
        /// The agent's data directory (`portal server`: DIR/agent).
        #[arg(long, default_value = "/var/lib/portal/agent")]
        data_dir: PathBuf,
    },
}

pub(crate) async fn images(args: ImagesArgs) -> Result<(), Error> {
    match args.command {
        ImagesCommand::Import { file, data_dir } => {
            let names = portal_agent::import_images(data_dir, file).await?;
            for name in names {
                tracing::info!(image = %name, "imported");
            }
            Ok(())
        }
    }
}

/// `portal shim`: started by the agent's runtime, never by hand.
#[derive(clap::Args, Debug)]
pub(crate) struct ShimArgs {
    #[arg(long)]
    runc: PathBuf,
    #[arg(long)]
    runc_root: PathBuf,
    #[arg(long)]
    id: String,
    #[arg(long)]
    bundle: PathBuf,
    #[arg(long)]
    state: PathBuf,
    #[arg(long)]
    log: PathBuf,
    #[arg(long)]
    attach_socket: PathBuf,
    #[arg(long)]
    cgroup: String,
    #[arg(long)]
    log_max_bytes: u64,
    #[arg(long)]
    log_max_files: u32,
    #[arg(long)]
    stdin: bool,
    #[arg(long)]
    stdin_once: bool,
    #[arg(long)]
    tty: bool,
}

/// Runs the shim (no async runtime); the process exit code.
pub(crate) fn shim(args: ShimArgs) -> i32 {
    portal_agent::shim::run(&portal_agent::shim::ShimArgs {
        runc: args.runc,
        runc_root: args.runc_root,
        id: args.id,
        bundle: args.bundle,
        state: args.state,
        log: args.log,
        attach_socket: args.attach_socket,
        log_limits: portal_agent::shim::LogLimits {
            max_bytes: args.log_max_bytes,
            max_files: args.log_max_files,
        },
        cgroup: args.cgroup,
        stdin: args.stdin,
        stdin_once: args.stdin_once,
        tty: args.tty,
    })
}
