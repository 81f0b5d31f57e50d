//! The client side every Portal component shares (the controllers, the
//! proxy, the DNS, the agent): a client from a kubeconfig, the watch
//! streams they follow — [`changes`] for components that keep their own
//! index (a re-list says what is gone), [`settled_objects`] for
//! controllers that read a reflector, [`SharedReflector`] for one cache of
//! a kind shared by a process's controllers — and the well-known labels and
//! annotations of Kubernetes they read and write ([`labels`]), and leader
//! election on a Lease ([`leader`]) for work one process of many must do,
//! and the [`Supervisor`] every long-lived task of a process runs under.

pub mod labels;
pub mod leader;
pub mod shared;
mod stream;
pub mod supervisor;

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

pub use shared::{Settled, SharedReflector};
pub use stream::{changes, settled_objects, Change};
pub use supervisor::Supervisor;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig { path: String, message: String },
    #[error("API client: {0}")]
    Client(#[from] kube::Error),
}

/// A client for the cluster a kubeconfig file describes, for `component`:
/// its requests say `User-Agent: COMPONENT/VERSION`, which names the field
/// manager of its writes (`portal-controllers`, as Kubernetes' say
/// `kube-controller-manager`).
pub async fn client_from_kubeconfig(path: &Path, component: &str) -> Result<Client, Error> {
    let invalid = |message: String| Error::Kubeconfig {
        path: path.display().to_string(),
        message,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| invalid(e.to_string()))?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| invalid(e.to_string()))?;
    let agent = format!("{component}/{}", env!("CARGO_PKG_VERSION"));
    if let Ok(value) = http::HeaderValue::from_str(&agent) {
        config.headers.push((http::header::USER_AGENT, value));
    }
    Ok(Client::try_from(config)?)
}

/// The CA a kubeconfig's current cluster is verified with, as PEM (the
/// controllers publish it for pods): its `certificate-authority-data` or
/// the file `certificate-authority` names.
pub fn kubeconfig_ca(path: &Path) -> Result<String, String> {
    use base64::Engine as _;
    let at = |message: String| format!("kubeconfig {}: {message}", path.display());
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| at(e.to_string()))?;
    let context_name = kubeconfig.current_context.clone().unwrap_or_default();
    let cluster_name = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .or_else(|| kubeconfig.clusters.first().map(|c| c.name.clone()))
        .ok_or_else(|| at("no cluster".into()))?;
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| at(format!("no cluster {cluster_name:?}")))?;
    if let Some(data) = &cluster.certificate_authority_data {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|e| at(format!("certificate-authority-data: {e}")))?;
        return String::from_utf8(bytes).map_err(|e| at(e.to_string()));
    }
    if let Some(file) = &cluster.certificate_authority {
        return std::fs::read_to_string(file).map_err(|e| at(format!("{file}: {e}")));
    }
    Err(at("the cluster names no certificate authority".into()))
}
