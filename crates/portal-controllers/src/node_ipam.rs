//! Node IPAM: gives every Node a pod range (`spec.podCIDR`) of its own from
//! the cluster CIDR, as kube-controller-manager's range allocator does
//! (`--cluster-cidr 10.244.0.0/16`, a /24 each). The node agent takes its
//! pods' addresses from that range. A range is never changed once set.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use portal_api::cidr::Ipv4Cidr;

use crate::ReconcileError as Error;

/// The cluster's pod network and how it is cut into node ranges.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub cluster_cidr: Ipv4Cidr,
    /// The prefix length of one node's range (24 → 254 pods per node).
    pub node_prefix: u8,
}

struct Context {
    client: Client,
    /// Delays between retries of a failing object.
    retries: crate::Retries,
    config: Config,
    nodes: Store<Node>,
    /// Ranges handed out but not yet seen in `nodes`: node → (range, when).
    /// Reconciles of different nodes run concurrently; the choice and this
    /// record are made under one lock so two nodes never get one range.
    assigned: Mutex<HashMap<String, (Ipv4Cidr, Instant)>>,
}

/// How long a handed-out range is held for a node the store does not show.
const ASSUMED_FOR: Duration = Duration::from_secs(60);

pub async fn run(client: Client, config: Config) {
    let controller = Controller::new(Api::<Node>::all(client.clone()), watcher::Config::default())
        .with_config(crate::config());
    let context = Arc::new(Context {
        retries: crate::Retries::new(Duration::from_secs(2)),
        nodes: controller.store(),
        client,
        config,
        assigned: Mutex::new(HashMap::new()),
    });
    let results = controller.run(reconcile, error_policy, context.clone());
    crate::drive(results, "node-ipam", &context.retries).await;
}

fn error_policy(node: Arc<Node>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, node = %node.name_any(), "pod range assignment failed; retrying");
    Action::requeue(ctx.retries.after_failure(node.as_ref()))
}

fn pod_cidr(node: &Node) -> Option<Ipv4Cidr> {
    node.spec.as_ref()?.pod_cidr.as_deref()?.parse().ok()
}

async fn reconcile(node: Arc<Node>, ctx: Arc<Context>) -> Result<Action, Error> {
    if pod_cidr(&node).is_some() {
        return Ok(Action::await_change());
    }
    let name = node.name_any();
    let Some(range) = choose(&ctx, &name) else {
        tracing::warn!(node = %name, cidr = %ctx.config.cluster_cidr, "no pod range left");
        return Ok(Action::requeue(Duration::from_secs(30)));
    };
    let patch = serde_json::json!({
        "spec": {"podCIDR": range.to_string(), "podCIDRs": [range.to_string()]}
    });
    let api = Api::<Node>::all(ctx.client.clone());
    if let Err(error) = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        ctx.assigned.lock().remove(&name);
        return Err(error.into());
    }
    tracing::info!(node = %name, pod_cidr = %range, "pod range assigned");
    Ok(Action::await_change())
}

/// The lowest range no node has and none was just given, recorded for `name`.
fn choose(ctx: &Context, name: &str) -> Option<Ipv4Cidr> {
    let mut assigned = ctx.assigned.lock();
    let nodes = ctx.nodes.state();
    // Forget what the store now shows, and what it never will.
    assigned.retain(|node, (_, since)| {
        let shown = nodes
            .iter()
            .any(|n| n.name_any() == *node && pod_cidr(n).is_some());
        !shown && since.elapsed() < ASSUMED_FOR
    });
    if let Some((range, _)) = assigned.get(name) {
        return Some(*range);
    }
    let used: Vec<Ipv4Cidr> = nodes
        .iter()
        .filter_map(|n| pod_cidr(n))
        .chain(assigned.values().map(|(r, _)| *r))
        .collect();
    let range = free_range(ctx.config, &used)?;
    assigned.insert(name.to_owned(), (range, Instant::now()));
    Some(range)
}

/// The first node range of `config` that overlaps none of `used`.
fn free_range(config: Config, used: &[Ipv4Cidr]) -> Option<Ipv4Cidr> {
    let overlaps = |a: &Ipv4Cidr, b: &Ipv4Cidr| {
        let (first_a, first_b) = (a.nth(0), b.nth(0));
        matches!((first_a, first_b), (Some(x), Some(y)) if a.contains(y) || b.contains(x))
    };
    (0..config.cluster_cidr.subnet_count(config.node_prefix))
        .filter_map(|i| config.cluster_cidr.subnet(config.node_prefix, i))
        .find(|candidate| !used.iter().any(|u| overlaps(u, candidate)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Ipv4Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn ranges_are_handed_out_lowest_first_and_never_overlap() {
        let config = Config {
            cluster_cidr: cidr("10.244.0.0/22"),
            node_prefix: 24,
        };
        assert_eq!(free_range(config, &[]), Some(cidr("10.244.0.0/24")));
        let used = [cidr("10.244.0.0/24"), cidr("10.244.2.0/24")];
        assert_eq!(free_range(config, &used), Some(cidr("10.244.1.0/24")));
        // A wider range someone set by hand covers several node ranges.
        assert_eq!(
            free_range(config, &[cidr("10.244.0.0/23")]),
            Some(cidr("10.244.2.0/24"))
        );
        let full = [cidr("10.244.0.0/22")];
        assert_eq!(free_range(config, &full), None);
    }
}
