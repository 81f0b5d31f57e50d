//! `portal`: Kubernetes Services in one binary. This file only parses the
//! command line and wires components together.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mimalloc::MiMalloc;
use portal_apiserver::{Ipv4Cidr, PortRange};

/// The server allocates and frees many small JSON values per request;
/// mimalloc does that markedly faster than glibc's malloc (measured in
/// docs/BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: MiMalloc = MiMalloc;

#[derive(Parser, Debug)]
#[command(name = "portal", version, about = "Kubernetes Services in one binary")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run everything on this machine on the embedded store.
    Server(ServerArgs),
    /// Run the controllers against an API server.
    Controllers(ClientArgs),
    /// Run the cluster DNS against an API server.
    Dns(DnsArgs),
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
struct ClientArgs {
    /// Credentials and address of the API server.
    #[arg(long)]
    kubeconfig: PathBuf,
}

#[derive(clap::Args, Debug)]
struct ServerArgs {
    /// Keeps the store, credentials and the admin kubeconfig.
    #[arg(long)]
    data_dir: PathBuf,
    /// Where the API listens; port 0 picks a free port (see DIR/kubeconfig).
    #[arg(long, default_value = "127.0.0.1:6443")]
    api_bind: SocketAddr,
    /// Revisions of history kept so watches can resume after a disconnect.
    #[arg(long, default_value_t = 100_000)]
    history_revisions: u64,
    /// Cluster IPs of Services come from this range (IPv4).
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cluster_ip_range: Ipv4Cidr,
    /// Node ports of NodePort and LoadBalancer Services come from this range.
    #[arg(long, default_value = "30000-32767")]
    service_node_port_range: PortRange,
    /// Addresses for LoadBalancer Services (CIDR[,CIDR]); none = they stay pending.
    #[arg(long, value_delimiter = ',')]
    load_balancer_pool: Vec<Ipv4Cidr>,
    /// This node's address: where pods reach the API server.
    #[arg(long)]
    node_ip: Option<IpAddr>,
    /// Where the cluster DNS answers (UDP and TCP); none = no DNS in this
    /// process until the proxy can serve the kube-dns address.
    #[arg(long)]
    dns_bind: Option<SocketAddr>,
    #[command(flatten)]
    dns: DnsOptions,
    /// Components not to run in this process (comma-separated: controllers, dns).
    #[arg(long, value_delimiter = ',')]
    disable: Vec<Component>,
}

/// Components `portal server` runs besides the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Component {
    Controllers,
    Dns,
}

/// Why the process stopped with an error.
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Api(#[from] portal_apiserver::Error),
    #[error(transparent)]
    Controllers(#[from] portal_controllers::Error),
    #[error(transparent)]
    Dns(#[from] portal_dns::Error),
    #[error("cannot serve metrics on {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

async fn server(args: ServerArgs) -> Result<(), Error> {
    let disabled = args.disable.clone();
    let config = portal_apiserver::Config {
        data_dir: args.data_dir,
        bind: args.api_bind,
        history_revisions: args.history_revisions,
        service_cidr: args.service_cluster_ip_range,
        node_ports: args.service_node_port_range,
        advertise_address: args.node_ip,
        load_balancer_pool: args.load_balancer_pool,
    };
    let api = portal_apiserver::ApiServer::start(config).await?;
    if !disabled.contains(&Component::Controllers) {
        // The controllers are API clients like any other, through the
        // kubeconfig the server just wrote.
        let client = portal_controllers::client_from_kubeconfig(&api.kubeconfig).await?;
        tokio::spawn(portal_controllers::run(client));
    }
    if let Some(bind) = args
        .dns_bind
        .filter(|_| !disabled.contains(&Component::Dns))
    {
        let client = portal_controllers::client_from_kubeconfig(&api.kubeconfig).await?;
        let dns = portal_dns::start(client, args.dns.config(bind)).await?;
        let metrics = dns.metrics.clone();
        api.metrics.add_source(move |out| metrics.encode_into(out));
    }
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| portal_apiserver::Error::Signal(e.to_string()))?;
    tokio::select! {
        () = api.wait() => {}
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; stopping"),
        _ = terminate.recv() => tracing::info!("terminated; stopping"),
    }
    Ok(())
}

async fn controllers(args: ClientArgs) -> Result<(), Error> {
    let client = portal_controllers::client_from_kubeconfig(&args.kubeconfig).await?;
    tokio::select! {
        () = portal_controllers::run(client) => {}
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; stopping"),
    }
    Ok(())
}

async fn dns(args: DnsArgs) -> Result<(), Error> {
    let client = portal_controllers::client_from_kubeconfig(&args.kubeconfig).await?;
    let dns = portal_dns::start(client, args.dns.config(args.bind)).await?;
    if let Some(addr) = args.metrics_bind {
        let metrics = dns.metrics.clone();
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Metrics { addr, source })?;
        tokio::spawn(serve_metrics(listener, move || metrics.encode()));
    }
    let _ = tokio::signal::ctrl_c().await;
    tracing::info!("interrupted; stopping");
    Ok(())
}

/// Answers every HTTP request on `listener` with the metrics `encode` gives.
async fn serve_metrics(
    listener: tokio::net::TcpListener,
    encode: impl Fn() -> String + Clone + Send + Sync + 'static,
) {
    use hyper::service::service_fn;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let encode = encode.clone();
        tokio::spawn(async move {
            let service = service_fn(move |_request| {
                let body = http_body_util::Full::new(bytes::Bytes::from(encode()));
                let response = hyper::Response::builder()
                    .header("content-type", "text/plain; version=0.0.4")
                    .body(body);
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
    let cli = Cli::parse();
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
            Command::Server(args) => server(args).await,
            Command::Controllers(args) => controllers(args).await,
            Command::Dns(args) => dns(args).await,
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
