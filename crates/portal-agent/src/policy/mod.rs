//! NetworkPolicy enforcement for this node's pods, as a network plugin's
//! node agent does it (kube-router in k3s, Calico's Felix): follow the
//! cluster's NetworkPolicies, pods and namespaces; work out which traffic
//! each isolated local pod may send and receive (`model`); and keep the
//! node's nftables table `ip portal_policy` saying exactly that (`nft`).
//! Only new connections are judged: established ones keep flowing through
//! a policy change. Pods' traffic to and from their own node is always
//! allowed, as Kubernetes requires (the node's probes, the cluster DNS on
//! the node address).

pub mod model;
pub mod nft;
pub mod ranges;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Endpoints, Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource};

use crate::routes::apply_nft;

/// The table is written again at least this often (rules removed by hand
/// come back).
const RESYNC: Duration = Duration::from_secs(60);
/// Writes are at least this far apart: a change after a quiet spell is
/// written at once, a burst (a thousand policies applied, pods of a
/// rollout coming and going) is batched into a few writes, as
/// kube-proxy's minimum sync period does.
const MIN_INTERVAL: Duration = Duration::from_millis(250);
/// A failed write is tried again after this, doubling up to `RETRY_MOST`.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MOST: Duration = Duration::from_secs(30);

/// Aborts the watch tasks when the loop that owns them ends.
struct Watching(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Watching {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Follows the objects of `api` that `config` picks into a store; every
/// event wakes `changed` (also a relist's end, when the store is swapped).
fn follow<K>(
    api: Api<K>,
    config: watcher::Config,
    changed: &Arc<tokio::sync::Notify>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Store<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let notify = changed.clone();
    let watch = watcher(api, config).default_backoff().reflect(writer);
    tasks.push(tokio::spawn(watch.for_each(move |_| {
        notify.notify_one();
        async {}
    })));
    store
}

/// Where Portal publishes its cluster DNS (`portal-dns`'s `publish`).
const DNS_NAMESPACE: &str = "kube-system";
const DNS_SERVICE: &str = "kube-dns";

/// The kube-dns Endpoints' addresses that are no pod (the nodes Portal's
/// DNS answers on; DNS pods someone deployed are pods already), with
/// their ports.
fn dns_endpoints(endpoints: &[Arc<Endpoints>]) -> Vec<model::DnsEndpoint> {
    let mut found = Vec::new();
    for subset in endpoints.iter().flat_map(|e| e.subsets.iter().flatten()) {
        let ports: Vec<(String, model::Protocol, u16)> = subset
            .ports
            .iter()
            .flatten()
            .filter_map(|p| {
                let protocol = model::Protocol::of(p.protocol.as_deref())?;
                Some((
                    p.name.clone().unwrap_or_default(),
                    protocol,
                    u16::try_from(p.port).ok()?,
                ))
            })
            .collect();
        for address in subset.addresses.iter().flatten() {
            let pod = address
                .target_ref
                .as_ref()
                .is_some_and(|t| t.kind.as_deref() == Some("Pod"));
            if let (false, Ok(ip)) = (pod, address.ip.parse()) {
                found.push(model::DnsEndpoint {
                    ip,
                    ports: ports.clone(),
                });
            }
        }
    }
    found
}

/// Keeps the policy table in line with the cluster while the agent runs.
/// `ipv6`: this node's pods have IPv6 addresses (an `ip6` table too).
pub(crate) async fn run(client: Client, node: String, ipv6: bool) {
    let changed = Arc::new(tokio::sync::Notify::new());
    let mut tasks = Vec::new();
    let all = watcher::Config::default;
    let policies = follow(
        Api::<NetworkPolicy>::all(client.clone()),
        all(),
        &changed,
        &mut tasks,
    );
    let pods = follow(Api::<Pod>::all(client.clone()), all(), &changed, &mut tasks);
    let namespaces = follow(
        Api::<Namespace>::all(client.clone()),
        all(),
        &changed,
        &mut tasks,
    );
    let dns = follow(
        Api::<Endpoints>::namespaced(client.clone(), DNS_NAMESPACE),
        all().fields(&format!("metadata.name={DNS_SERVICE}")),
        &changed,
        &mut tasks,
    );
    let _watching = Watching(tasks);
    for ready in [
        policies.wait_until_ready().await,
        pods.wait_until_ready().await,
        namespaces.wait_until_ready().await,
        dns.wait_until_ready().await,
    ] {
        if ready.is_err() {
            return;
        }
    }
    // What the table last said: pods' status heartbeats that change
    // nothing cost a plan and a comparison, not an nft run.
    let mut written: Option<String> = None;
    let mut resync = tokio::time::interval(RESYNC);
    resync.tick().await;
    let mut retry = RETRY_FIRST;
    let mut last_write: Option<tokio::time::Instant> = None;
    loop {
        if let Some(last) = last_write {
            // Changes meanwhile coalesce in the one stored wake-up.
            tokio::time::sleep_until(last + MIN_INTERVAL).await;
        }
        let (node, stores) = (
            node.clone(),
            (
                policies.state(),
                pods.state(),
                namespaces.state(),
                dns.state(),
            ),
        );
        // Planning walks every pod and policy: off the async workers.
        let planned = tokio::task::spawn_blocking(move || {
            let (policies, pods, namespaces, endpoints) = stores;
            let dns = dns_endpoints(&endpoints);
            let cluster = model::Cluster {
                policies: &policies,
                pods: &pods,
                namespaces: &namespaces,
                dns: &dns,
            };
            let plan = cluster.plan(&node);
            (plan.len(), nft::render(&plan, ipv6))
        })
        .await;
        let Ok((isolated, text)) = planned else {
            return;
        };
        if written.as_deref() != Some(text.as_str()) {
            last_write = Some(tokio::time::Instant::now());
            match apply_nft(&text).await {
                Ok(()) => {
                    tracing::debug!(isolated, "network policies applied");
                    written = Some(text);
                    retry = RETRY_FIRST;
                }
                Err(error) => {
                    // The table in force stays until a write succeeds.
                    tracing::warn!(%error, retry_in = ?retry, "network policies; retrying");
                    written = None;
                    tokio::time::sleep(retry).await;
                    retry = (retry * 2).min(RETRY_MOST);
                    continue;
                }
            }
        }
        tokio::select! {
            () = changed.notified() => {}
            _ = resync.tick() => written = None,
        }
    }
}
