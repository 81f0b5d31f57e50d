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

/// Where Portal publishes its cluster DNS (`portal-dns`'s `publish`).
const DNS_NAMESPACE: &str = "kube-system";
const DNS_SERVICE: &str = "kube-dns";

/// The addresses of the kube-dns Endpoints that are no pod: the nodes
/// Portal's DNS answers on (DNS pods someone deployed are pods already).
fn dns_addresses(endpoints: &[Arc<Endpoints>]) -> Vec<std::net::Ipv4Addr> {
    endpoints
        .iter()
        .flat_map(|e| e.subsets.iter().flatten())
        .flat_map(|s| s.addresses.iter().flatten())
        .filter(|a| {
            a.target_ref
                .as_ref()
                .is_none_or(|t| t.kind.as_deref() != Some("Pod"))
        })
        .filter_map(|a| a.ip.parse().ok())
        .collect()
}

/// The table is written again at least this often (rules removed by hand
/// come back).
const RESYNC: Duration = Duration::from_secs(60);

/// Aborts the watch tasks when the loop that owns them ends.
struct Watching(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Watching {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Follows the objects of `api` that `config` picks into a store; each
/// change wakes `changed`.
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
    let watch = watcher(api, config)
        .default_backoff()
        .reflect(writer)
        .touched_objects();
    tasks.push(tokio::spawn(watch.for_each(move |_| {
        notify.notify_one();
        async {}
    })));
    store
}

/// Keeps the policy table in line with the cluster while the agent runs.
pub(crate) async fn run(client: Client, node: String) {
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
    // nothing cost a comparison, not an nft run.
    let mut written: Option<String> = None;
    loop {
        let (all_policies, all_pods, all_namespaces) =
            (policies.state(), pods.state(), namespaces.state());
        let dns_addresses = dns_addresses(&dns.state());
        let cluster = model::Cluster {
            policies: &all_policies,
            pods: &all_pods,
            namespaces: &all_namespaces,
            dns: &dns_addresses,
        };
        let plan = cluster.plan(&node);
        let text = nft::render(&plan);
        if written.as_deref() != Some(text.as_str()) {
            match apply_nft(&text).await {
                Ok(()) => {
                    tracing::debug!(isolated = plan.len(), "network policies applied");
                    written = Some(text);
                }
                Err(error) => {
                    tracing::warn!(%error, "network policies; retrying");
                    written = None;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            }
        }
        tokio::select! {
            () = changed.notified() => {}
            () = tokio::time::sleep(RESYNC) => written = None,
        }
    }
}
