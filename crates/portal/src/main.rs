//! `portal`: Kubernetes Services in one binary. This file only parses the
//! command line and wires components together.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
}

async fn server(args: ServerArgs) -> Result<(), portal_apiserver::Error> {
    let config = portal_apiserver::Config {
        data_dir: args.data_dir,
        bind: args.api_bind,
        history_revisions: args.history_revisions,
    };
    let api = portal_apiserver::ApiServer::start(config).await?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| portal_apiserver::Error::Signal(e.to_string()))?;
    tokio::select! {
        () = api.wait() => {}
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; stopping"),
        _ = terminate.recv() => tracing::info!("terminated; stopping"),
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
