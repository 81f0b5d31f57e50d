//! The `api` source: the pods bound to this node, watched from the API
//! server and passed on as the watch gives them (relists included) to the
//! pod manager, which runs the pods and hands mirror pods to the mirror
//! manager. A source only reports; it never acts on pods itself.

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use tokio::sync::mpsc;

/// Watches the pods bound to `node` until the receiver is gone.
pub(crate) async fn run(client: Client, node: String, events: mpsc::Sender<watcher::Event<Pod>>) {
    let api = Api::<Pod>::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = watcher(api, config).default_backoff().boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(event) => {
                if events.send(event).await.is_err() {
                    return;
                }
            }
            Err(error) => tracing::warn!(%error, "watching this node's pods"),
        }
    }
}
