//! Portal's controllers: plain API clients, so they run inside `portal
//! server` or alone (`portal controllers --kubeconfig F`) against any API
//! server. Today: the endpoints controller (Endpoints and EndpointSlices)
//! EndpointSlice mirroring, the ReplicationController controller and the
//! scheduler.

pub mod endpoints;
mod events;
pub mod mirroring;
pub mod replication;
pub mod scheduler;

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig { path: String, message: String },
    #[error("API client: {0}")]
    Client(#[from] kube::Error),
}

/// A client for the cluster a kubeconfig file describes.
pub async fn client_from_kubeconfig(path: &Path) -> Result<Client, Error> {
    let invalid = |message: String| Error::Kubeconfig {
        path: path.display().to_string(),
        message,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| invalid(e.to_string()))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| invalid(e.to_string()))?;
    Ok(Client::try_from(config)?)
}

/// Drives a controller's result stream to its end. Failed reconciles were
/// already logged and requeued by the controller's error policy.
pub(crate) async fn drive<T, E: std::fmt::Display>(
    results: impl futures_util::Stream<Item = Result<T, E>>,
    name: &'static str,
) {
    use futures_util::StreamExt;
    results
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, controller = name, "reconcile");
            }
        })
        .await;
}

/// Runs every controller until the process ends.
pub async fn run(client: Client) {
    tokio::join!(
        endpoints::run(client.clone()),
        mirroring::run(client.clone()),
        replication::run(client.clone()),
        scheduler::run(client)
    );
}
