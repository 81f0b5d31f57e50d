//! Portal's controllers: plain API clients, so they run inside `portal
//! server` or alone (`portal controllers --kubeconfig F`) against any API
//! server: the endpoints controller (Endpoints and EndpointSlices),
//! EndpointSlice mirroring, the ReplicationController controller, node IPAM
//! (pod ranges) and the scheduler.

pub mod endpoints;
pub mod events;
pub mod mirroring;
pub mod node_ipam;
pub mod replication;
pub mod scheduler;

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use kube::{Client, Config};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig { path: String, message: String },
    #[error("API client: {0}")]
    Client(#[from] kube::Error),
}

/// Why a reconcile failed (the controllers' error policies retry it).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The API server refused or failed a request.
    #[error("API request failed: {0}")]
    Api(#[from] kube::Error),
    /// A reflector's initial list has not finished.
    #[error("reflector not ready: {0}")]
    NotReady(#[from] kube::runtime::reflector::store::WriterDropped),
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

/// The objects a reflected watch changed, each passed on only once the
/// reflector shows it: during a re-list kube's reflector keeps the old state
/// until the re-list ends, so re-listed objects are held until then (a
/// reconcile triggered earlier would read the old state and never run
/// again). Use after `.reflect(writer)` instead of `.touched_objects()`.
pub(crate) fn settled_objects<K: Send + 'static>(
    events: impl futures_util::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
) -> impl futures_util::Stream<Item = Result<K, watcher::Error>> + Send {
    use futures_util::{StreamExt, TryStreamExt};
    let mut relisted = Vec::new();
    events
        .map_ok(move |event| {
            let ready = match event {
                watcher::Event::Apply(object) | watcher::Event::Delete(object) => vec![object],
                watcher::Event::Init => {
                    relisted.clear();
                    Vec::new()
                }
                watcher::Event::InitApply(object) => {
                    relisted.push(object);
                    Vec::new()
                }
                watcher::Event::InitDone => std::mem::take(&mut relisted),
            };
            futures_util::stream::iter(ready.into_iter().map(Ok))
        })
        .try_flatten()
        .boxed()
}

/// Runs every controller until the process ends.
pub async fn run(client: Client, ipam: node_ipam::Config) {
    tokio::join!(
        endpoints::run(client.clone()),
        mirroring::run(client.clone()),
        replication::run(client.clone()),
        node_ipam::run(client.clone(), ipam),
        scheduler::run(client)
    );
}
