//! The agent's Node: registered at start with its addresses, capacity and
//! system information, kept Ready while the agent is healthy, and a
//! `coordination.k8s.io/v1` Lease in `kube-node-lease` renewed every ten
//! seconds as the kubelet's heartbeat.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};

use crate::Error;

/// The Lease lasts this long by default and is renewed every quarter of
/// it, as the kubelet's (`nodeLeaseDurationSeconds` 40, renewed every 10 s).
pub const LEASE_SECONDS: i32 = 40;
/// The Node's status (conditions' heartbeat) is written at least this often.
const STATUS_EVERY: Duration = Duration::from_secs(60);
/// The most pods one node runs, as the kubelet's `--max-pods` default.
pub const MAX_PODS: u32 = 110;
const LEASE_NAMESPACE: &str = "kube-node-lease";

/// Who this node is.
#[derive(Clone, Debug)]
pub struct Identity {
    pub name: String,
    pub ip: Ipv4Addr,
    /// Its IPv6 address on a dual-stack network.
    pub ip6: Option<std::net::Ipv6Addr>,
    /// The port of the agent's own server (`daemonEndpoints`).
    pub port: i32,
    /// How long its Lease lasts (renewed every quarter of it).
    pub lease_seconds: i32,
    /// The pod range the agent uses when it is its own to say (given, or
    /// kept from the last run); otherwise node IPAM gives it.
    pub pod_cidr: Option<portal_api::cidr::PodCidrs>,
    /// Where this node keeps local-path volumes (published on its Node
    /// for the provisioner), if it keeps them.
    pub storage_root: Option<std::path::PathBuf>,
    /// Addresses the node is reached at from outside the cluster, published
    /// as its `ExternalIP`s (`--node-external-ip`; k3s's flag).
    pub external_ips: Vec<std::net::IpAddr>,
}

impl Identity {
    /// The node's addresses as a pod's `hostIPs` list them (IPv4 first).
    pub fn ips(&self) -> Vec<String> {
        std::iter::once(self.ip.to_string())
            .chain(self.ip6.map(|ip| ip.to_string()))
            .collect()
    }
}

/// The annotation that publishes [`Identity::storage_root`].
pub const STORAGE_ROOT_ANNOTATION: &str = "portal.dev/local-path-root";

fn annotations(me: &Identity) -> BTreeMap<String, String> {
    me.storage_root
        .iter()
        .map(|root| {
            (
                STORAGE_ROOT_ANNOTATION.to_owned(),
                root.display().to_string(),
            )
        })
        .collect()
}

/// Creates the Node or brings an existing one up to date, and returns it.
pub(crate) async fn register(client: &Client, me: &Identity) -> Result<Node, Error> {
    let api = Api::<Node>::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(me.name.clone()),
            labels: Some(labels(&me.name)),
            annotations: Some(annotations(me)),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            // As upstream: `podCIDR` is `podCIDRs[0]`, the primary family's.
            pod_cidr: me.pod_cidr.and_then(|r| r.to_strings().into_iter().next()),
            pod_cidrs: me.pod_cidr.map(|r| r.to_strings()),
            ..NodeSpec::default()
        }),
        // Created with its status, as the kubelet does: no reader ever sees
        // a registered Node without conditions.
        status: Some(status(me, None)),
    };
    match api.create(&PostParams::default(), &node).await {
        Ok(_) => tracing::info!(node = %me.name, "node registered"),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let existing = api.get(&me.name).await?;
            let assigned = existing.spec.as_ref().and_then(assigned_ranges);
            let mut patch = serde_json::json!({"metadata": {"labels": labels(&me.name),
                "annotations": annotations(me)}});
            match (me.pod_cidr, assigned) {
                (Some(mine), None) => {
                    let ranges = mine.to_strings();
                    patch["spec"] = serde_json::json!({"podCIDR": ranges[0], "podCIDRs": ranges});
                }
                (Some(mine), Some(assigned)) if mine != assigned => tracing::error!(
                    node = %me.name, pods_use = %mine, api_says = %assigned,
                    "the node's pod range in the API differs from the one its pods use"
                ),
                _ => {}
            }
            api.patch(&me.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        Err(error) => return Err(error.into()),
    }
    write_status(&api, me).await
}

fn labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("kubernetes.io/hostname".to_owned(), name.to_owned()),
        ("kubernetes.io/os".to_owned(), "linux".to_owned()),
        ("kubernetes.io/arch".to_owned(), arch().to_owned()),
        ("beta.kubernetes.io/os".to_owned(), "linux".to_owned()),
        ("beta.kubernetes.io/arch".to_owned(), arch().to_owned()),
    ])
}

/// The architecture in Go's names, as Kubernetes reports it.
fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

async fn write_status(api: &Api<Node>, me: &Identity) -> Result<Node, Error> {
    let current = api.get_status(&me.name).await?;
    let status = serde_json::json!({"status": status(me, current.status.as_ref())});
    Ok(api
        .patch_status(&me.name, &PatchParams::default(), &Patch::Merge(&status))
        .await?)
}

/// The Node's status: addresses, capacity, system information, conditions
/// (a condition keeps its transition time while its status holds).
fn status(me: &Identity, previous: Option<&NodeStatus>) -> NodeStatus {
    let now = Time(jiff::Timestamp::now());
    let since = |type_: &str, status: &str| {
        previous
            .and_then(|p| p.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == type_ && c.status == status))
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| now.clone())
    };
    let condition = |type_: &str, status: &str, reason: &str, message: &str| NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(since(type_, status)),
    };
    let capacity = capacity();
    let mut addresses = vec![NodeAddress {
        type_: "InternalIP".into(),
        address: me.ip.to_string(),
    }];
    addresses.extend(me.ip6.map(|ip| NodeAddress {
        type_: "InternalIP".into(),
        address: ip.to_string(),
    }));
    addresses.extend(me.external_ips.iter().map(|ip| NodeAddress {
        type_: "ExternalIP".into(),
        address: ip.to_string(),
    }));
    addresses.push(NodeAddress {
        type_: "Hostname".into(),
        address: me.name.clone(),
    });
    NodeStatus {
        addresses: Some(addresses),
        allocatable: Some(capacity.clone()),
        capacity: Some(capacity),
        conditions: Some(vec![
            condition(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            condition(
                "DiskPressure",
                "False",
                "KubeletHasNoDiskPressure",
                "kubelet has no disk pressure",
            ),
            condition(
                "PIDPressure",
                "False",
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
            condition(
                "Ready",
                "True",
                "KubeletReady",
                "kubelet is posting ready status",
            ),
        ]),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint { port: me.port }),
        }),
        node_info: Some(system_info()),
        ..NodeStatus::default()
    }
}

fn capacity() -> BTreeMap<String, Quantity> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let memory_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    BTreeMap::from([
        ("cpu".to_owned(), Quantity(cpus.to_string())),
        ("memory".to_owned(), Quantity(format!("{memory_kib}Ki"))),
        ("pods".to_owned(), Quantity(MAX_PODS.to_string())),
        ("ephemeral-storage".to_owned(), Quantity("0".to_owned())),
    ])
}

fn system_info() -> NodeSystemInfo {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    };
    let os_image = read("/etc/os-release")
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_owned())
        .unwrap_or_else(|| "Linux".into());
    let version = env!("CARGO_PKG_VERSION");
    NodeSystemInfo {
        architecture: arch().into(),
        boot_id: read("/proc/sys/kernel/random/boot_id"),
        container_runtime_version: format!("portal://{version}"),
        kernel_version: read("/proc/sys/kernel/osrelease"),
        kube_proxy_version: String::new(),
        kubelet_version: format!("v1.33.0-portal.{version}"),
        machine_id: read("/etc/machine-id"),
        operating_system: "linux".into(),
        os_image,
        system_uuid: read("/sys/class/dmi/id/product_uuid"),
        ..NodeSystemInfo::default()
    }
}

/// Renews the Lease every ten seconds and the Node's status every minute
/// (and whenever the API does not show it Ready), for as long as the agent
/// runs. Failures are retried at the next tick.
pub(crate) async fn heartbeat(
    client: Client,
    me: Identity,
    node_uid: String,
    metrics: crate::Metrics,
) {
    let leases = Api::<Lease>::namespaced(client.clone(), LEASE_NAMESPACE);
    let nodes = Api::<Node>::all(client);
    let mut last_status = tokio::time::Instant::now();
    let quarter = u64::try_from(me.lease_seconds.max(1)).unwrap_or(40) * 250;
    let mut tick = tokio::time::interval(Duration::from_millis(quarter));
    loop {
        tick.tick().await;
        match renew(&leases, &me, &node_uid).await {
            Ok(()) => metrics.lease_renewed(),
            Err(error) => tracing::warn!(%error, node = %me.name, "renewing the node lease failed"),
        }
        // Also at once when the API says otherwise (the node lifecycle
        // controller marked it Unknown while the agent was away or slow).
        if last_status.elapsed() >= STATUS_EVERY || !ready_in_api(&nodes, &me.name).await {
            match write_status(&nodes, &me).await {
                Ok(_) => last_status = tokio::time::Instant::now(),
                Err(error) => tracing::warn!(%error, node = %me.name, "node status update failed"),
            }
        }
    }
}

/// Whether the API shows this Node Ready (an error counts as Ready: the
/// regular status write retries anyway).
async fn ready_in_api(nodes: &Api<Node>, name: &str) -> bool {
    match nodes.get_status(name).await {
        Ok(node) => node
            .status
            .and_then(|s| s.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
        Err(_) => true,
    }
}

async fn renew(leases: &Api<Lease>, me: &Identity, node_uid: &str) -> Result<(), Error> {
    let now = MicroTime(jiff::Timestamp::now());
    let spec = LeaseSpec {
        holder_identity: Some(me.name.clone()),
        lease_duration_seconds: Some(me.lease_seconds),
        renew_time: Some(now),
        ..LeaseSpec::default()
    };
    let patch = serde_json::json!({"spec": spec});
    match leases
        .patch(&me.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            // Owned by the Node, so it goes when the Node is deleted.
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(me.name.clone()),
                    namespace: Some(LEASE_NAMESPACE.into()),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        name: me.name.clone(),
                        uid: node_uid.to_owned(),
                        ..OwnerReference::default()
                    }]),
                    ..ObjectMeta::default()
                },
                spec: Some(spec),
            };
            leases.create(&PostParams::default(), &lease).await?;
            Ok(())
        }
        Err(error) => Err(error.into()),
    }
}

/// The ranges a Node's spec lists (`podCIDRs`, else `podCIDR`); `None`
/// when it has none (or none Portal can use: an IPv4 range, and at most
/// one IPv6 range beside it, in either order).
pub(crate) fn assigned_ranges(
    spec: &k8s_openapi::api::core::v1::NodeSpec,
) -> Option<portal_api::cidr::PodCidrs> {
    portal_api::cidr::PodCidrs::of_node(spec)
}

/// The node's pod ranges once node IPAM has assigned them.
pub(crate) async fn wait_for_pod_cidr(
    client: &Client,
    name: &str,
) -> Result<portal_api::cidr::PodCidrs, Error> {
    let api = Api::<Node>::all(client.clone());
    let mut logged = false;
    loop {
        let node = api.get(name).await?;
        if let Some(ranges) = node.spec.as_ref().and_then(assigned_ranges) {
            return Ok(ranges);
        }
        if !logged {
            tracing::info!(node = %node.metadata.name.unwrap_or_default(), "waiting for a pod range (node IPAM)");
            logged = true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
