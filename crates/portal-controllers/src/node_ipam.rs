//! Node IPAM: gives every Node a pod range (`spec.podCIDR`) of its own from
//! the cluster CIDR, as kube-controller-manager's range allocator does
//! (`--cluster-cidr 10.244.0.0/16`, a /24 each), and on a dual-stack pod
//! network one of each family (`spec.podCIDRs`: the IPv4 range, then the
//! IPv6 one, a /64 each by default). The node agent takes its pods'
//! addresses from them. Ranges are given once, together, and never changed
//! (a Node's `podCIDRs` may only be set from empty).

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
use portal_api::cidr::{IpCidr, PodCidrs};

use crate::ReconcileError as Error;

/// The cluster's pod network and how it is cut into node ranges.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub cluster_cidr: PodCidrs,
    /// The prefix length of one node's IPv4 range (24 → 254 pods per node).
    pub node_prefix: u8,
    /// The prefix length of one node's IPv6 range.
    pub node_prefix_v6: u8,
}

impl Config {
    /// The cluster's ranges with the node range length of each.
    /// (In the cluster's order: a node's ranges list the primary first.)
    fn families(&self) -> Vec<(IpCidr, u8)> {
        self.cluster_cidr
            .ranges()
            .into_iter()
            .map(|range| match range {
                IpCidr::V4(_) => (range, self.node_prefix),
                IpCidr::V6(_) => (range, self.node_prefix_v6),
            })
            .collect()
    }
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
    assigned: Mutex<HashMap<String, (Vec<IpCidr>, Instant)>>,
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

/// The node's ranges (any family), as `podCIDRs` or else `podCIDR` says.
fn pod_cidrs(node: &Node) -> Vec<IpCidr> {
    portal_api::cidr::node_pod_cidrs(node.spec.as_ref())
}

async fn reconcile(node: Arc<Node>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !pod_cidrs(&node).is_empty() {
        return Ok(Action::await_change());
    }
    let name = node.name_any();
    let Some(ranges) = choose(&ctx, &name) else {
        tracing::warn!(node = %name, cidr = %ctx.config.cluster_cidr, "no pod range left");
        return Ok(Action::requeue(Duration::from_secs(30)));
    };
    let listed: Vec<String> = ranges.iter().map(ToString::to_string).collect();
    let range = listed.join(",");
    let patch = serde_json::json!({
        "spec": {"podCIDR": listed[0], "podCIDRs": listed}
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

/// The lowest range of each family no node has and none was just given,
/// recorded for `name`.
fn choose(ctx: &Context, name: &str) -> Option<Vec<IpCidr>> {
    let mut assigned = ctx.assigned.lock();
    let nodes = ctx.nodes.state();
    // Forget what the store now shows, and what it never will.
    assigned.retain(|node, (_, since)| {
        let shown = nodes
            .iter()
            .any(|n| n.name_any() == *node && !pod_cidrs(n).is_empty());
        !shown && since.elapsed() < ASSUMED_FOR
    });
    if let Some((ranges, _)) = assigned.get(name) {
        return Some(ranges.clone());
    }
    let used: Vec<IpCidr> = nodes
        .iter()
        .flat_map(|n| pod_cidrs(n))
        .chain(assigned.values().flat_map(|(r, _)| r.iter().copied()))
        .collect();
    let ranges = ctx
        .config
        .families()
        .into_iter()
        .map(|(cluster, prefix)| free_range(cluster, prefix, &used))
        .collect::<Option<Vec<_>>>()?;
    assigned.insert(name.to_owned(), (ranges.clone(), Instant::now()));
    Some(ranges)
}

/// The first node range (`prefix` long) of `cluster` that overlaps none of
/// `used`.
fn free_range(cluster: IpCidr, prefix: u8, used: &[IpCidr]) -> Option<IpCidr> {
    (0..cluster.subnet_count(prefix))
        .filter_map(|i| cluster.subnet(prefix, i))
        .find(|candidate| !used.iter().any(|u| u.overlaps(candidate)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> IpCidr {
        s.parse().unwrap()
    }

    #[test]
    fn ranges_are_handed_out_lowest_first_and_never_overlap() {
        let cluster = cidr("10.244.0.0/22");
        assert_eq!(free_range(cluster, 24, &[]), Some(cidr("10.244.0.0/24")));
        let used = [cidr("10.244.0.0/24"), cidr("10.244.2.0/24")];
        assert_eq!(free_range(cluster, 24, &used), Some(cidr("10.244.1.0/24")));
        // A wider range someone set by hand covers several node ranges.
        assert_eq!(
            free_range(cluster, 24, &[cidr("10.244.0.0/23")]),
            Some(cidr("10.244.2.0/24"))
        );
        let full = [cidr("10.244.0.0/22")];
        assert_eq!(free_range(cluster, 24, &full), None);
        // IPv6 ranges are counted apart from IPv4 ones.
        let six = cidr("fd00:10:244::/62");
        let used = [cidr("10.244.0.0/24"), cidr("fd00:10:244::/64")];
        assert_eq!(free_range(six, 64, &used), Some(cidr("fd00:10:244:1::/64")));
    }

    #[test]
    fn a_dual_stack_cluster_cuts_both_families() {
        let config = Config {
            cluster_cidr: "10.244.0.0/16,fd00:10:244::/56".parse().unwrap(),
            node_prefix: 24,
            node_prefix_v6: 64,
        };
        assert_eq!(
            config.families(),
            [(cidr("10.244.0.0/16"), 24), (cidr("fd00:10:244::/56"), 64)]
        );
        // IPv6 first: nodes' ranges list IPv6 first too.
        let config = Config {
            cluster_cidr: "fd00:10:244::/56,10.244.0.0/16".parse().unwrap(),
            ..config
        };
        assert_eq!(
            config.families(),
            [(cidr("fd00:10:244::/56"), 64), (cidr("10.244.0.0/16"), 24)]
        );
    }
}
