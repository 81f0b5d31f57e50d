//! `portal`: Kubernetes Services in one binary. This file only parses the
//! command line and wires components together.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

mod agent;
mod apiserver;
mod config_file;
mod node;
mod reset;
mod store;

use clap::{CommandFactory, Parser, Subcommand};
use mimalloc::MiMalloc;
use portal_api::cidr::PodCidrs;
use portal_apiserver::Ipv4Cidr;

/// The server allocates and frees many small JSON values per request;
/// mimalloc does that markedly faster than glibc's malloc (measured in
/// docs/BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: MiMalloc = MiMalloc;

#[derive(Parser, Debug)]
#[command(name = "portal", version, about = "Kubernetes Services in one binary")]
struct Cli {
    /// A YAML file of flag settings (`node-ip: 10.0.0.1`), placed before
    /// the command line's; default `$PORTAL_CONFIG_FILE`, else
    /// /etc/portal/config.yaml if it exists.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run everything on this machine on the embedded store.
    Server(Box<ServerArgs>),
    /// Run the API server alone: one of several on an etcd cluster.
    Apiserver(Box<apiserver::ApiserverArgs>),
    /// Run the controllers against an API server.
    Controllers(ControllersArgs),
    /// Run the cluster DNS against an API server.
    Dns(DnsArgs),
    /// Run the service proxy for this node against an API server.
    Proxy(ProxyArgs),
    /// Run the node agent (pods of this node), against an API server or
    /// standalone (static pods).
    Agent(Box<agent::AgentArgs>),
    /// Join a cluster as a worker node: agent and proxy, with the node's
    /// own credential.
    Node(Box<node::NodeArgs>),
    /// Manage the datastore (move to etcd).
    #[command(subcommand)]
    Store(store::StoreCommand),
    /// Manage the node's images.
    Images(agent::ImagesArgs),
    /// Print a kubeconfig for a user (or one of Portal's components run
    /// apart) with a client certificate of the cluster CA: run it where
    /// the API server keeps its data.
    Kubeconfig(KubeconfigArgs),
    /// Stop and remove what Portal left on this machine after it stopped:
    /// containers, pod namespaces, mounts, cgroups, the node's bridge,
    /// routes and nftables tables (and with --remove-data its data).
    Reset(reset::ResetArgs),
    /// One container's supervisor (started by the agent).
    #[command(hide = true)]
    Shim(agent::ShimArgs),
}

#[derive(clap::Args, Debug)]
struct ProxyArgs {
    /// Credentials and address of the API server.
    #[arg(long, required_unless_present = "cleanup")]
    kubeconfig: Option<PathBuf>,
    /// Remove Portal's nftables table (`ip portal`) from this network
    /// namespace and exit: what the proxy programmed stays after it stops,
    /// so traffic keeps flowing, until this.
    #[arg(long)]
    cleanup: bool,
    /// This node's name (default: the host name): its endpoints are the
    /// local ones of `Local` traffic policies, and its InternalIP is the
    /// node address unless `--node-ip` is given.
    #[arg(long)]
    node_name: Option<String>,
    /// This node's address, and its IPv6 one after a comma on a dual-stack
    /// node (userspace listeners bind them); default: its Node's InternalIPs.
    #[arg(long, value_name = "IPv4[,IPv6]")]
    node_ip: Option<agent::NodeIps>,
    /// Kernel (nftables) or userspace data plane; auto: nftables when usable.
    #[arg(long, value_enum, default_value = "auto")]
    mode: ProxyMode,
    #[command(flatten)]
    timing: ProxyTiming,
    /// Where to serve /metrics and /healthz.
    #[arg(long, default_value = "127.0.0.1:10249")]
    metrics_bind: SocketAddr,
}

/// Sync timing shared by `portal proxy` and `portal server`.
#[derive(clap::Args, Debug)]
struct ProxyTiming {
    /// Least time between two syncs: changes meanwhile are batched (e.g. 1s, 250ms, 0).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    min_sync_period: Duration,
    /// Most time between two syncs (not 0).
    #[arg(long, default_value = "30s", value_parser = parse_period)]
    sync_period: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ProxyMode {
    Auto,
    Nftables,
    Userspace,
}

impl ProxyMode {
    fn config(
        self,
        node_ip: Option<agent::NodeIps>,
        node_name: Option<String>,
        timing: &ProxyTiming,
    ) -> portal_proxy::Config {
        portal_proxy::Config {
            mode: match self {
                Self::Auto => portal_proxy::Mode::Auto,
                Self::Nftables => portal_proxy::Mode::Nftables,
                Self::Userspace => portal_proxy::Mode::Userspace,
            },
            node_ip: node_ip.map(|ips| ips.v4),
            node_ip6: node_ip.and_then(|ips| ips.v6),
            node_name,
            min_sync_period: timing.min_sync_period,
            sync_period: timing.sync_period,
        }
    }
}

/// A duration that is not zero.
pub(crate) fn parse_period(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        Duration::ZERO => Err("must be more than 0".into()),
        period => Ok(period),
    }
}

/// `250ms`, `1s`, `2m`, `12h`, `90d`, or `0`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("not a duration: {text:?}"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(number)),
        "s" => Ok(Duration::from_secs(number)),
        "" if number == 0 => Ok(Duration::ZERO),
        "m" => Ok(Duration::from_secs(number.saturating_mul(60))),
        "h" => Ok(Duration::from_secs(number.saturating_mul(3600))),
        "d" => Ok(Duration::from_secs(number.saturating_mul(86_400))),
        _ => Err(format!("not a duration: {text:?} (use ms, s, m, h or d)")),
    }
}

#[derive(clap::Args, Debug)]
struct KubeconfigArgs {
    /// The API server's data directory (its `pki/ca.crt` and `ca.key`).
    #[arg(long)]
    data_dir: PathBuf,
    /// The user the certificate names (its CN), e.g. `alice`,
    /// `system:portal-dns`, `system:kube-proxy`,
    /// `system:kube-controller-manager`.
    #[arg(long)]
    user: String,
    /// A group the user is in (its O); repeat for several.
    #[arg(long = "group")]
    groups: Vec<String>,
    /// How long the certificate lasts (`90d`, `8760h`).
    #[arg(long, default_value = "365d", value_parser = parse_period)]
    expiration: Duration,
    /// The API server's URL (default: the one of DATA_DIR/kubeconfig).
    #[arg(long)]
    server: Option<String>,
}

#[derive(clap::Args, Debug)]
struct DnsArgs {
    /// Credentials and address of the API server.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Where to answer, UDP and TCP; port 0 picks a free port.
    #[arg(long, default_value = "0.0.0.0:53")]
    bind: SocketAddr,
    #[command(flatten)]
    dns: DnsOptions,
    /// Where to serve /metrics (Prometheus text); none = not served.
    #[arg(long)]
    metrics_bind: Option<SocketAddr>,
}

/// DNS settings shared by `portal dns` and `portal server`.
#[derive(clap::Args, Debug)]
struct DnsOptions {
    /// The domain of Service names (`web.default.svc.cluster.local`).
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// A resolver for names outside the cluster domain; none = REFUSED.
    #[arg(long)]
    upstream: Option<SocketAddr>,
    /// Seconds clients may cache DNS answers.
    #[arg(long, default_value_t = 5)]
    dns_ttl: u32,
    /// UDP server threads (default: one per core).
    #[arg(long)]
    dns_threads: Option<usize>,
}

impl DnsOptions {
    fn config(&self, bind: SocketAddr) -> portal_dns::Config {
        portal_dns::Config {
            bind,
            cluster_domain: self.cluster_domain.clone(),
            upstream: self.upstream,
            ttl: self.dns_ttl,
            threads: self
                .dns_threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        }
    }
}

#[derive(clap::Args, Debug)]
struct ControllersArgs {
    /// Credentials and address of the API server.
    #[arg(long)]
    kubeconfig: PathBuf,
    #[command(flatten)]
    controllers: ControllerOptions,
    #[command(flatten)]
    leader: apiserver::LeaderElectArgs,
}

/// What the controllers are told (in `portal server` and `portal controllers`).
#[derive(clap::Args, Debug, Clone)]
struct ControllerOptions {
    #[command(flatten)]
    ipam: IpamArgs,
    #[command(flatten)]
    lifecycle: LifecycleArgs,
    /// Addresses for LoadBalancer Services (CIDR[,CIDR]); none = they stay pending.
    #[arg(long, value_delimiter = ',')]
    load_balancer_pool: Vec<Ipv4Cidr>,
}

impl ControllerOptions {
    /// `root_ca_pem`: the CA pods verify the API server with.
    fn config(&self, root_ca_pem: String) -> Result<portal_controllers::Config, Error> {
        Ok(portal_controllers::Config {
            root_ca_pem,
            ipam: self.ipam.config()?,
            lifecycle: self.lifecycle.config(),
            load_balancer: portal_controllers::load_balancer::Config {
                pool: self.load_balancer_pool.clone(),
            },
        })
    }
}

/// How the pod network is cut into node ranges (node IPAM).
#[derive(clap::Args, Debug, Clone, Copy)]
struct IpamArgs {
    /// Pod addresses come from this range; each node gets a part of it.
    /// An IPv4 CIDR, and for dual-stack pods an IPv6 one after a comma
    /// (`10.244.0.0/16,fd00:10:244::/56`).
    #[arg(long, default_value = "10.244.0.0/16")]
    cluster_cidr: PodCidrs,
    /// The prefix length of one node's IPv4 pod range.
    #[arg(long, alias = "node-cidr-mask-size-ipv4", default_value_t = 24, value_parser = clap::value_parser!(u8).range(8..=30))]
    node_cidr_mask_size: u8,
    /// The prefix length of one node's IPv6 pod range.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u8).range(16..=120))]
    node_cidr_mask_size_ipv6: u8,
}

/// How the node lifecycle controller judges nodes.
#[derive(clap::Args, Debug, Clone, Copy)]
struct LifecycleArgs {
    /// A node whose agent is silent this long is Unknown, tainted
    /// unreachable, and its pods leave the Services.
    #[arg(long, default_value = "40s", value_parser = parse_period)]
    node_monitor_grace_period: Duration,
}

impl LifecycleArgs {
    fn config(self) -> portal_controllers::node_lifecycle::Config {
        portal_controllers::node_lifecycle::Config {
            grace_period: self.node_monitor_grace_period,
        }
    }
}

impl IpamArgs {
    fn config(self) -> Result<portal_controllers::node_ipam::Config, Error> {
        // A node range inside the cluster's; IPv6 ranges at most 2^16 of
        // them, as kube-controller-manager (IPv4's as before).
        let check = |flag: &str, node: u8, cluster: u8, most: u8| match node.checked_sub(cluster) {
            Some(bits) if bits <= most => Ok(()),
            Some(_) => Err(Error::Usage(format!(
                "{flag} {node} cuts --cluster-cidr {} into more than 2^{most} node ranges",
                self.cluster_cidr
            ))),
            None => Err(Error::Usage(format!(
                "{flag} {node} is wider than --cluster-cidr {}",
                self.cluster_cidr
            ))),
        };
        let v4 = self.cluster_cidr.v4.prefix();
        check("--node-cidr-mask-size", self.node_cidr_mask_size, v4, 32)?;
        if let Some(v6) = self.cluster_cidr.v6 {
            let (node, cluster) = (self.node_cidr_mask_size_ipv6, v6.prefix());
            check("--node-cidr-mask-size-ipv6", node, cluster, 16)?;
            // A pod's IPv6 address sits at its IPv4 address's place in the
            // node's IPv6 range.
            if 128 - self.node_cidr_mask_size_ipv6 < 32 - self.node_cidr_mask_size {
                return Err(Error::Usage(format!(
                    "--node-cidr-mask-size-ipv6 {} gives nodes fewer IPv6 than IPv4 addresses (--node-cidr-mask-size {})",
                    self.node_cidr_mask_size_ipv6, self.node_cidr_mask_size
                )));
            }
        }
        Ok(portal_controllers::node_ipam::Config {
            cluster_cidr: self.cluster_cidr,
            node_prefix: self.node_cidr_mask_size,
            node_prefix_v6: self.node_cidr_mask_size_ipv6,
        })
    }
}

#[derive(clap::Args, Debug)]
struct ServerArgs {
    #[command(flatten)]
    api: apiserver::ApiArgs,
    /// This node's address: where pods reach the API server (an IPv4
    /// address for its agent), and its IPv6 one after a comma on a
    /// dual-stack network.
    #[arg(long, value_name = "IP[,IPv6]", value_parser = parse_server_node_ip)]
    node_ip: Option<(IpAddr, Option<std::net::Ipv6Addr>)>,
    /// Where the cluster DNS answers (UDP and TCP); none = no DNS in this
    /// process until the proxy can serve the kube-dns address.
    #[arg(long)]
    dns_bind: Option<SocketAddr>,
    #[command(flatten)]
    dns: DnsOptions,
    /// The service proxy's data plane.
    #[arg(long, value_enum, default_value = "auto")]
    proxy_mode: ProxyMode,
    #[command(flatten)]
    proxy: ProxyTiming,
    #[command(flatten)]
    controllers: ControllerOptions,
    #[command(flatten)]
    agent: agent::AgentOptions,
    #[command(flatten)]
    ingress: IngressOptions,
    /// Components not to run in this process (comma-separated: agent,
    /// controllers, dns, ingress, proxy). The agent runs only as root.
    #[arg(long, value_delimiter = ',')]
    disable: Vec<Component>,
}

/// The built-in layer-7 proxy (the `portal` IngressClass).
#[derive(clap::Args, Debug)]
struct IngressOptions {
    /// Where Ingresses are served over HTTP (and h2c). Without this flag
    /// and `--ingress-tls-bind`: the node address's ports 80 and 443 on a
    /// node running pods, else nowhere; with either, just what they say.
    #[arg(long, value_name = "ADDR:PORT")]
    ingress_bind: Option<SocketAddr>,
    /// Where Ingresses are served over HTTPS (see `--ingress-bind`).
    #[arg(long, value_name = "ADDR:PORT")]
    ingress_tls_bind: Option<SocketAddr>,
}

/// Components `portal server` runs besides the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Component {
    Agent,
    Controllers,
    Dns,
    Ingress,
    Proxy,
}

/// Why the process stopped with an error.
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Api(#[from] portal_apiserver::Error),
    #[error(transparent)]
    Client(#[from] portal_client::Error),
    #[error(transparent)]
    Dns(#[from] portal_dns::Error),
    #[error(transparent)]
    Proxy(#[from] portal_proxy::Error),
    #[error("ingress proxy: {0}")]
    Ingress(#[from] portal_ingress::Error),
    #[error("node agent: {0}")]
    Agent(#[from] portal_agent::Error),
    #[error("joining: {0}")]
    Join(#[from] portal_agent::join::Error),
    #[error("{0}")]
    Usage(String),
    #[error("a task this process needs stopped: {0}")]
    Stopped(&'static str),
    #[error("node {name}: {message}")]
    Node { name: String, message: String },
    #[error("cannot serve metrics on {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Runs the layer-7 proxy where the flags say, or on the node address's
/// ports 80 and 443 (`node`); a default port already taken only warns
/// (the other one still serves), a port asked for fails the server. On a
/// node (`node_name`) it is published as the `kube-system/portal-ingress`
/// LoadBalancer Service.
async fn start_ingress(
    api: &portal_apiserver::ApiServer,
    options: &IngressOptions,
    node: Option<IpAddr>,
    node_name: Option<String>,
    components: &portal_client::Supervisor,
) -> Result<(), Error> {
    let explicit = options.ingress_bind.is_some() || options.ingress_tls_bind.is_some();
    let (mut http, mut https) = match (explicit, node) {
        (true, _) => (options.ingress_bind, options.ingress_tls_bind),
        (false, Some(ip)) => (
            Some(SocketAddr::new(ip, 80)),
            Some(SocketAddr::new(ip, 443)),
        ),
        (false, None) => return Ok(()),
    };
    let advertised = match node {
        Some(ip) => vec![ip],
        None => [http, https]
            .into_iter()
            .flatten()
            .map(|a| a.ip())
            .find(|ip| !ip.is_unspecified())
            .into_iter()
            .collect(),
    };
    loop {
        // It reads Ingresses, Services, slices and TLS Secrets and writes
        // Ingress status: RBAC's `system:portal-ingress` grants that, no more.
        let client = api.loopback_client_as("portal-ingress", "system:portal-ingress");
        let config = portal_ingress::Config {
            http,
            https,
            advertised: advertised.clone(),
            node_name: node_name.clone(),
        };
        // Installing the Gateway API's definitions takes an administrator.
        let admin = api.loopback_client("portal-gateway-api");
        match portal_ingress::start(client, config, Some(admin)).await {
            Ok(ingress) => {
                let tasks = ingress.tasks.clone();
                components.critical("ingress proxy", async move {
                    let task = tasks.failed().await;
                    tracing::error!(task, "the ingress proxy stopped");
                });
                let metrics = ingress.metrics.clone();
                api.metrics.add_source(move |out| metrics.encode_into(out));
                return Ok(());
            }
            Err(portal_ingress::Error::Bind { addr, source }) if !explicit => {
                tracing::warn!(%addr, error = %source, "the ingress proxy does not serve there (pass --ingress-bind / --ingress-tls-bind)");
                if http == Some(addr) {
                    http = None;
                } else {
                    https = None;
                }
                if http.is_none() && https.is_none() {
                    return Ok(());
                }
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// The server's `--node-ip`: any one address (the API server may serve on
/// IPv6 alone), or an IPv4 and an IPv6 one.
fn parse_server_node_ip(text: &str) -> Result<(IpAddr, Option<std::net::Ipv6Addr>), String> {
    match text.parse::<IpAddr>() {
        Ok(ip) => Ok((ip, None)),
        Err(_) => {
            let ips: agent::NodeIps = text.parse()?;
            Ok((IpAddr::V4(ips.v4), ips.v6))
        }
    }
}

async fn server(args: ServerArgs) -> Result<(), Error> {
    let disabled = args.disable.clone();
    let agent_wanted = !disabled.contains(&Component::Agent) && running_as_root();
    // A node needs its address: given, or found for the agent.
    // The node's IPv6 address: the second of two, or a lone IPv6 one.
    let node_ip6 = args.node_ip.and_then(|(ip, v6)| {
        v6.or(match ip {
            IpAddr::V6(v6) => Some(v6),
            IpAddr::V4(_) => None,
        })
    });
    let node_ip = match args.node_ip.map(|(ip, _)| ip) {
        Some(ip) => Some(ip),
        None if agent_wanted => Some(IpAddr::V4(portal_agent::node_address().await)),
        None => None,
    };
    // The address of the cluster's primary family (the service range's
    // first): the kubernetes Service's endpoint and the cluster DNS's.
    let primary_node_ip = match args.api.primary_family() {
        portal_apiserver::IpFamily::Ipv6 => node_ip6.map(IpAddr::V6).or(node_ip),
        portal_apiserver::IpFamily::Ipv4 => node_ip,
    };
    let reachable_node_ip = primary_node_ip.filter(|ip| !ip.is_loopback());
    let data_dir = args.api.data_dir.clone();
    let agent_data = data_dir.join("agent");
    let client_ca = data_dir.join("pki").join("kubelet-client-ca.crt");
    let cluster_domain = args.dns.cluster_domain.clone();
    // This machine's agent and proxy act as its node, like any other
    // node's: a node certificate, not the admin token.
    let node_kubeconfig = data_dir.join("node.kubeconfig");
    let node_token = data_dir.join("node-token");
    let node_name = args.agent.node_name();
    let mut config = args.api.config(primary_node_ip)?;
    // Nodes may join at either of a dual-stack node's addresses.
    config.other_addresses = node_ip
        .into_iter()
        .chain(node_ip6.map(IpAddr::V6))
        .filter(|ip| Some(*ip) != primary_node_ip)
        .collect();
    let mut api = portal_apiserver::ApiServer::start(config).await?;
    api.write_node_kubeconfig(&node_name, &node_kubeconfig)?;
    let controllers = args.controllers.config(api.ca_pem().to_owned())?;
    tracing::info!(
        "other nodes join with: portal node --server https://<this node's address>:{} --token-file {}",
        api.address.port(),
        node_token.display()
    );
    // The components beside the API server: if one stops, the process
    // fails loudly (the node agent excepted: see below).
    let components = portal_client::Supervisor::new();
    let mut controllers_election = None;
    if !disabled.contains(&Component::Controllers) {
        // The controllers are API clients like any other, answered in
        // memory (`portal controllers` runs them against a remote server).
        // As kube-controller-manager (with every controller's role and the
        // scheduler's, ADR 0027), not as a superuser.
        let client = api.loopback_client_as("portal-controllers", "system:kube-controller-manager");
        // With other servers on the same store, one runs the controllers.
        let election = args
            .api
            .shared()
            .then(|| portal_client::leader::Election::new("kube-system", "portal-controllers"));
        controllers_election = election.clone().map(|e| (client.clone(), e));
        components.critical(
            "controllers",
            run_controllers(client, controllers, election),
        );
    }
    // With pods on this node, the DNS answers on the node address by
    // default and is published as the kube-dns Service's endpoints.
    let default_dns = reachable_node_ip
        .filter(|_| agent_wanted)
        .map(|ip| SocketAddr::new(ip, 53));
    if let Some(bind) = args
        .dns_bind
        .or(default_dns)
        .filter(|_| !disabled.contains(&Component::Dns))
    {
        // The DNS reads Services and slices and publishes its own
        // Endpoints: RBAC's `system:portal-dns` grants that, no more.
        let client = api.loopback_client_as("portal-dns", "system:portal-dns");
        match portal_dns::start(client.clone(), args.dns.config(bind)).await {
            Ok(dns) => {
                let tasks = dns.tasks.clone();
                components.critical("cluster DNS", async move {
                    let task = tasks.failed().await;
                    tracing::error!(task, "the cluster DNS stopped");
                });
                let metrics = dns.metrics.clone();
                api.metrics.add_source(move |out| metrics.encode_into(out));
                let published = match dns.addr.ip() {
                    ip if ip.is_unspecified() => {
                        reachable_node_ip.map(|n| SocketAddr::new(n, dns.addr.port()))
                    }
                    ip if ip.is_loopback() => None,
                    _ => Some(dns.addr),
                };
                if let Some(addr) = published {
                    if let Err(error) = portal_dns::publish::publish(&client, addr).await {
                        tracing::warn!(%error, "publishing the cluster DNS as kube-dns");
                    }
                }
            }
            // The default address may be taken (a resolver on the node's
            // port 53): the rest runs without the built-in DNS.
            Err(error) if args.dns_bind.is_none() => {
                tracing::warn!(%error, "no cluster DNS on the node address (pass --dns-bind)");
            }
            Err(error) => return Err(error.into()),
        }
    }
    if !disabled.contains(&Component::Proxy) {
        let client =
            portal_client::client_from_kubeconfig(&node_kubeconfig, "portal-proxy").await?;
        let node_ip = match node_ip {
            Some(IpAddr::V4(v4)) => Some(agent::NodeIps { v4, v6: node_ip6 }),
            _ => None,
        };
        // `portal reset` leaves this namespace's tables while it runs.
        portal_agent::reset::hold_network_lock();
        let proxy = portal_proxy::start(
            client,
            args.proxy_mode
                .config(node_ip, Some(node_name.clone()), &args.proxy),
        )
        .await?;
        let tasks = proxy.tasks.clone();
        components.critical("service proxy", async move {
            let task = tasks.failed().await;
            tracing::error!(task, "the service proxy stopped");
        });
        let (metrics, health) = (proxy.metrics.clone(), proxy.metrics.clone());
        api.metrics.add_source(move |out| metrics.encode_into(out));
        api.metrics
            .add_health_check("proxy", move || health.healthy());
    }
    if !disabled.contains(&Component::Ingress) {
        start_ingress(
            &api,
            &args.ingress,
            reachable_node_ip.filter(|_| agent_wanted),
            Some(node_name.clone()).filter(|_| agent_wanted),
            &components,
        )
        .await?;
    }
    if !disabled.contains(&Component::Agent) {
        if agent_wanted {
            let client =
                portal_client::client_from_kubeconfig(&node_kubeconfig, "portal-agent").await?;
            let node_ip = match node_ip {
                Some(IpAddr::V4(ip)) => Some(ip),
                _ => None,
            };
            let config = args.agent.config(
                agent_data,
                node_ip,
                node_ip6,
                &cluster_domain,
                Some(client_ca),
            );
            let registry = api.metrics.clone();
            // In its own task: it waits for a pod range (node IPAM), and a
            // node that cannot run pods must not take the API down.
            tokio::spawn(async move {
                match portal_agent::start(Some(client), config).await {
                    Ok(agent) => {
                        let (metrics, health) = (agent.metrics.clone(), agent.metrics.clone());
                        registry.add_source(move |out| metrics.encode_into(out));
                        registry.add_health_check("agent", move || health.healthy());
                        // The API goes on; the node says why it runs no pods.
                        let failed = agent.tasks.failed().await;
                        tracing::error!(
                            task = failed,
                            "the node agent stopped: a task it needs ended"
                        );
                    }
                    Err(portal_agent::Error::Config(why)) => {
                        tracing::warn!("no node agent in this process: {why}");
                    }
                    Err(error) => tracing::error!(%error, "the node agent stopped"),
                }
            });
        } else {
            tracing::warn!("not running as root: no node agent in this process (pods stay Pending); --disable agent silences this");
        }
    }
    let outcome = tokio::select! {
        () = api.wait() => Ok(()),
        result = until_signal_or_failure(&components, "containers keep running") => result,
    };
    if let Some((client, election)) = controllers_election {
        give_up(client, &election).await;
    }
    api.shutdown(DRAIN).await;
    outcome
}

/// Returns at SIGINT or SIGTERM, or fails when a task the process cannot
/// do without has stopped (it was logged with its cause).
pub(crate) async fn until_signal_or_failure(
    tasks: &portal_client::Supervisor,
    what_stays: &str,
) -> Result<(), Error> {
    tokio::select! {
        result = wait_for_signal(what_stays) => result,
        name = tasks.failed() => Err(Error::Stopped(name)),
    }
}

/// How long a stopping API server lets requests in flight finish.
pub(crate) const DRAIN: std::time::Duration = std::time::Duration::from_secs(8);

/// Gives up a Lease at a clean stop, so another candidate takes over at
/// once (bounded: a server already gone is not waited for).
pub(crate) async fn give_up(client: kube::Client, election: &portal_client::leader::Election) {
    let release = portal_client::leader::release(client, election);
    match tokio::time::timeout(std::time::Duration::from_secs(2), release).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::warn!(%error, "could not give up the lease; others wait for it to run out")
        }
        Err(_) => tracing::warn!("giving up the lease timed out; others wait for it to run out"),
    }
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// Returns at SIGINT or SIGTERM.
pub(crate) async fn wait_for_signal(what_stays: &str) -> Result<(), Error> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| portal_apiserver::Error::Signal(e.to_string()))?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; stopping ({what_stays})"),
        _ = terminate.recv() => tracing::info!("terminated; stopping ({what_stays})"),
    }
    Ok(())
}

async fn controllers(args: ControllersArgs) -> Result<(), Error> {
    let config = args
        .controllers
        .config(portal_client::kubeconfig_ca(&args.kubeconfig).map_err(Error::Usage)?)?;
    let election = args.leader.election()?;
    let client =
        portal_client::client_from_kubeconfig(&args.kubeconfig, "portal-controllers").await?;
    let held = election.clone();
    tokio::select! {
        () = run_controllers(client.clone(), config, election) => Ok(()),
        result = wait_for_signal("the other candidates take over") => {
            if let Some(election) = held {
                give_up(client, &election).await;
            }
            result
        }
    }
}

/// The controllers, while leading when an election is given.
async fn run_controllers(
    client: kube::Client,
    config: portal_controllers::Config,
    election: Option<portal_client::leader::Election>,
) {
    match election {
        None => portal_controllers::run(client, config).await,
        Some(election) => {
            portal_client::leader::lead(client.clone(), election, move || {
                portal_controllers::run(client.clone(), config.clone())
            })
            .await
        }
    }
}

fn kubeconfig(args: KubeconfigArgs) -> Result<(), Error> {
    let wanted = portal_apiserver::issuing::UserCredential {
        user: args.user,
        groups: args.groups,
        lifetime: args.expiration,
        server: args.server,
    };
    let config = portal_apiserver::issuing::user_kubeconfig(&args.data_dir, &wanted)
        .map_err(Error::Usage)?;
    use std::io::Write as _;
    std::io::stdout()
        .write_all(config.as_bytes())
        .map_err(|e| Error::Usage(format!("cannot write the kubeconfig: {e}")))
}

async fn dns(args: DnsArgs) -> Result<(), Error> {
    let client = portal_client::client_from_kubeconfig(&args.kubeconfig, "portal-dns").await?;
    let dns = portal_dns::start(client, args.dns.config(args.bind)).await?;
    if let Some(addr) = args.metrics_bind {
        let metrics = dns.metrics.clone();
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Metrics { addr, source })?;
        dns.tasks
            .critical("metrics", serve_metrics(listener, move || metrics.encode()));
    }
    until_signal_or_failure(&dns.tasks, "no state to keep").await
}

async fn proxy(args: ProxyArgs) -> Result<(), Error> {
    if args.cleanup {
        let removed = portal_proxy::nftables::cleanup().map_err(portal_proxy::Error::from)?;
        if removed {
            tracing::info!("removed the nftables tables ip portal and ip6 portal");
        } else {
            tracing::info!("no nftables table portal here: nothing to clean up");
        }
        return Ok(());
    }
    let Some(kubeconfig) = &args.kubeconfig else {
        return Ok(());
    };
    let client = portal_client::client_from_kubeconfig(kubeconfig, "portal-proxy").await?;
    let node_ip = match (args.node_ip, &args.node_name) {
        (Some(ip), _) => Some(ip),
        (None, Some(name)) => Some(node_internal_ips(&client, name).await?),
        (None, None) => None,
    };
    let addr = args.metrics_bind;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Metrics { addr, source })?;
    // `portal reset` leaves this namespace's tables while it runs.
    portal_agent::reset::hold_network_lock();
    let proxy = portal_proxy::start(
        client,
        args.mode.config(
            node_ip,
            // kube-proxy's default: the host name names this node's endpoints.
            Some(args.node_name.clone().unwrap_or_else(agent::hostname)),
            &args.timing,
        ),
    )
    .await?;
    let (metrics, health) = (proxy.metrics.clone(), proxy.metrics.clone());
    proxy.tasks.critical(
        "metrics and health",
        serve_metrics_and_health(listener, move || metrics.encode(), move || health.healthy()),
    );
    // The rules stay in the kernel: traffic keeps flowing until the next start.
    until_signal_or_failure(&proxy.tasks, "rules stay in place").await
}

/// The Node's first InternalIP of each family (an IPv4 one is needed).
async fn node_internal_ips(client: &kube::Client, name: &str) -> Result<agent::NodeIps, Error> {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let error = |message: String| Error::Node {
        name: name.to_owned(),
        message,
    };
    let node = nodes.get(name).await.map_err(|e| error(e.to_string()))?;
    let internal = portal_agent::routes::internal_ips(&node);
    let v4 = internal
        .iter()
        .find_map(|ip| match ip {
            std::net::IpAddr::V4(v4) => Some(*v4),
            std::net::IpAddr::V6(_) => None,
        })
        .ok_or_else(|| error("has no IPv4 InternalIP; pass --node-ip".into()))?;
    let v6 = internal.iter().find_map(|ip| match ip {
        std::net::IpAddr::V6(v6) => Some(*v6),
        std::net::IpAddr::V4(_) => None,
    });
    Ok(agent::NodeIps { v4, v6 })
}

/// Answers every HTTP request on `listener` with the metrics `encode` gives.
async fn serve_metrics(
    listener: tokio::net::TcpListener,
    encode: impl Fn() -> String + Clone + Send + Sync + 'static,
) {
    serve_metrics_and_health(listener, encode, || true).await;
}

/// `/healthz`: 200 "ok" while `healthy`, else 503; anything else: metrics.
pub(crate) async fn serve_metrics_and_health(
    listener: tokio::net::TcpListener,
    encode: impl Fn() -> String + Clone + Send + Sync + 'static,
    healthy: impl Fn() -> bool + Clone + Send + Sync + 'static,
) {
    use hyper::service::service_fn;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (encode, healthy) = (encode.clone(), healthy.clone());
        tokio::spawn(async move {
            let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let response = if request.uri().path() == "/healthz" {
                    let ok = healthy();
                    hyper::Response::builder()
                        .status(if ok { 200 } else { 503 })
                        .header("content-type", "text/plain")
                        .body(http_body_util::Full::new(bytes::Bytes::from(if ok {
                            "ok"
                        } else {
                            "proxy syncs have stopped"
                        })))
                } else {
                    hyper::Response::builder()
                        .header("content-type", "text/plain; version=0.0.4")
                        .body(http_body_util::Full::new(bytes::Bytes::from(encode())))
                };
                async move { response }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        });
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = match config_file::apply(std::env::args_os().collect(), &Cli::command()) {
        Ok(args) => args,
        Err(error) => {
            tracing::error!("{error}");
            return ExitCode::FAILURE;
        }
    };
    let cli = Cli::parse_from(args);
    if let Command::Shim(args) = cli.command {
        // A plain process: no async runtime, no threads before it forks runc.
        return ExitCode::from(u8::try_from(agent::shim(args)).unwrap_or(1));
    }
    // The registry client (reqwest) takes the process's rustls provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Server(args) => server(*args).await,
            Command::Apiserver(args) => apiserver::apiserver(*args).await,
            Command::Controllers(args) => controllers(args).await,
            Command::Dns(args) => dns(args).await,
            Command::Proxy(args) => proxy(args).await,
            Command::Agent(args) => agent::agent(*args).await,
            Command::Node(args) => node::node(*args).await,
            Command::Images(args) => agent::images(args).await,
            Command::Store(command) => store::store(command).await,
            Command::Kubeconfig(args) => kubeconfig(args),
            Command::Reset(args) => reset::reset(args).await,
            Command::Shim(_) => Ok(()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "portal failed");
            ExitCode::FAILURE
        }
    }
}
