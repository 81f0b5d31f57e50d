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
    /// Components not to run in this process (comma-separated: controllers).
    #[arg(long, value_delimiter = ',')]
    disable: Vec<Component>,
}

/// Components `portal server` runs besides the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Component {
    Controllers,
}

/// Why the process stopped with an error.
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Api(#[from] portal_apiserver::Error),
    #[error(transparent)]
    Controllers(#[from] portal_controllers::Error),
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
