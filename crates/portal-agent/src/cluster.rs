//! What the agent learns about its place in the cluster, with or without
//! an API server: its pod range (given, kept from the last run, or node
//! IPAM's), its Node's registration once the API server answers (retried
//! until then), and the cluster DNS address (given, learnt from the
//! `kube-dns` Service, kept for the next run).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Service};
use kube::{Api, Client, ResourceExt};
use portal_api::cidr::PodCidrs;

use crate::{node, pods, runtime, Config, Error, Metrics};

/// Registers the Node, retrying (backing off up to 10 s) until the API
/// server answers.
async fn register(client: &Client, me: &node::Identity) -> Node {
    let mut delay = Duration::from_millis(500);
    loop {
        match node::register(client, me).await {
            Ok(node) => return node,
            Err(error) => {
                tracing::warn!(%error, node = %me.name, "registering the node; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// Registers the Node once the API server answers (retrying until then),
/// then keeps its Lease and status, and learns the cluster DNS address.
pub(crate) async fn connect<R: runtime::Runtime>(
    ctx: Arc<pods::Context<R>>,
    client: Client,
    learn_dns: Option<PathBuf>,
    metrics: Metrics,
) {
    let registered = register(&client, &ctx.me).await;
    let node_uid = registered.uid().unwrap_or_default();
    let _ = ctx.mirrors.node_uid.set(node_uid.clone());
    ctx.mirrors.poke();
    tokio::spawn(node::heartbeat(
        client.clone(),
        ctx.me.clone(),
        node_uid,
        metrics,
    ));
    let Some(data) = learn_dns else {
        return;
    };
    let mut delay = Duration::from_millis(500);
    loop {
        match kube_dns_address(&client).await {
            Ok(found) => {
                let found: Vec<String> = found.into_iter().collect();
                save_cluster_dns(&data, &found);
                ctx.dns.write().cluster_dns = found;
                ctx.dns_known
                    .store(true, std::sync::atomic::Ordering::Release);
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "looking up the kube-dns Service; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// The node's pod range: `--pod-cidr`, else the range of the last run
/// (kept in the data dir: an agent restarted while the API server is down
/// still runs its pods), else the one node IPAM gives in the API.
pub(crate) async fn pod_range(
    client: Option<&Client>,
    config: &Config,
    me: &node::Identity,
    data: &Path,
) -> Result<PodCidrs, Error> {
    let saved_at = data.join("pod-cidr");
    let saved = std::fs::read_to_string(&saved_at)
        .ok()
        .and_then(|text| text.trim().parse::<PodCidrs>().ok());
    let range = match (config.pod_cidr, saved, client) {
        (Some(range), _, _) => range,
        (None, Some(range), _) => {
            tracing::info!(pod_cidr = %range, "the pod range of the last run");
            range
        }
        (None, None, Some(client)) => {
            register(client, me).await;
            node::wait_for_pod_cidr(client, &me.name).await?
        }
        (None, None, None) => {
            return Err(Error::Config(
                "with no API server (no --kubeconfig) the node needs --pod-cidr".into(),
            ))
        }
    };
    if saved != Some(range) {
        std::fs::write(&saved_at, format!("{range}\n")).map_err(|source| Error::Io {
            path: saved_at.display().to_string(),
            source,
        })?;
    }
    Ok(range)
}

/// The cluster DNS address: the `kube-system/kube-dns` Service's cluster
/// IP (`None`: there is no such Service).
pub(crate) async fn kube_dns_address(client: &Client) -> Result<Option<String>, kube::Error> {
    let api = Api::<Service>::namespaced(client.clone(), "kube-system");
    Ok(api.get_opt("kube-dns").await?.and_then(|service| {
        service
            .spec
            .and_then(|s| s.cluster_ip)
            .filter(|ip| !ip.is_empty() && ip != "None")
    }))
}

/// The cluster DNS as learnt from the API, kept in `DIR/cluster-dns` (one
/// address per line; an empty file: there is none), so pods made while
/// the API server is away get what the last run learnt.
pub(crate) fn saved_cluster_dns(data: &Path) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(data.join("cluster-dns")).ok()?;
    Some(
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect(),
    )
}

pub(crate) fn save_cluster_dns(data: &Path, servers: &[String]) {
    let text: String = servers.iter().map(|s| format!("{s}\n")).collect();
    if let Err(error) = std::fs::write(data.join("cluster-dns"), text) {
        tracing::warn!(%error, "keeping the cluster DNS address");
    }
}
