//! The controllers' one pod cache: a shared reflector of every pod, trimmed
//! to the fields the endpoints controller, the ReplicationController
//! controller and the scheduler read. At 50,000 pods the full objects
//! (images, commands, environment, volumes, container statuses) are most
//! of the controllers' memory and none of their input.

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodSpec, PodStatus,
    Volume,
};
use kube::runtime::watcher;
use kube::{Api, Client};
use portal_client::SharedReflector;

/// A reflector of every pod, projected by [`project`].
pub fn reflector(client: Client) -> SharedReflector<Pod> {
    SharedReflector::new(Api::all(client), watcher::Config::default(), project)
}

/// Keeps what the controllers read: identity, labels, owners, deletion and
/// creation times; the node, scheduler, hostname, subdomain, tolerations,
/// node selector, affinity and topology spread; claim volumes; container names, ports (named target ports)
/// and resources (scheduling); phase, conditions, addresses, and per
/// container its readiness, restarts and exit code.
pub fn project(pod: &mut Pod) {
    let metadata = &mut pod.metadata;
    metadata.managed_fields = None;
    // Only the deletion cost, which orders a ReplicaSet's scale-down.
    metadata.annotations = metadata.annotations.take().and_then(|mut all| {
        let cost = all.remove(crate::replication::DELETION_COST)?;
        Some([(crate::replication::DELETION_COST.to_owned(), cost)].into())
    });
    if let Some(spec) = pod.spec.take() {
        pod.spec = Some(PodSpec {
            node_name: spec.node_name,
            scheduler_name: spec.scheduler_name,
            hostname: spec.hostname,
            subdomain: spec.subdomain,
            // Scheduling and node lifecycle: where a pod may go and how
            // long it stays on an unreachable node.
            tolerations: spec.tolerations,
            node_selector: spec.node_selector,
            affinity: spec.affinity,
            topology_spread_constraints: spec.topology_spread_constraints,
            containers: spec
                .containers
                .into_iter()
                .map(|c| Container {
                    name: c.name,
                    ports: c.ports,
                    // What the scheduler counts against allocatable.
                    resources: c.resources,
                    ..Container::default()
                })
                .collect(),
            init_containers: spec.init_containers.map(|inits| {
                inits
                    .into_iter()
                    .map(|c| Container {
                        name: c.name,
                        resources: c.resources,
                        ..Container::default()
                    })
                    .collect()
            }),
            overhead: spec.overhead,
            // Claims: the scheduler waits for them.
            volumes: spec
                .volumes
                .map(|volumes| {
                    volumes
                        .into_iter()
                        .filter(|v| v.persistent_volume_claim.is_some())
                        .map(|v| Volume {
                            name: v.name,
                            persistent_volume_claim: v.persistent_volume_claim,
                            ..Volume::default()
                        })
                        .collect::<Vec<_>>()
                })
                .filter(|claims| !claims.is_empty()),
            ..PodSpec::default()
        });
    }
    if let Some(status) = pod.status.take() {
        pod.status = Some(PodStatus {
            phase: status.phase,
            conditions: status.conditions,
            // The autoscaler trusts a new pod's CPU only after a while.
            start_time: status.start_time,
            pod_ip: status.pod_ip,
            pod_ips: status.pod_ips,
            // Restarts (deletion order, Jobs' backoff) and exit codes
            // (Jobs' pod failure policy).
            container_statuses: status.container_statuses.map(|statuses| {
                statuses
                    .into_iter()
                    .map(|c| ContainerStatus {
                        name: c.name,
                        ready: c.ready,
                        restart_count: c.restart_count,
                        state: c.state.and_then(|s| s.terminated).map(|t| ContainerState {
                            terminated: Some(ContainerStateTerminated {
                                exit_code: t.exit_code,
                                reason: t.reason,
                                ..ContainerStateTerminated::default()
                            }),
                            ..ContainerState::default()
                        }),
                        ..ContainerStatus::default()
                    })
                    .collect()
            }),
            ..PodStatus::default()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoints::desired;

    #[test]
    fn a_projected_pod_gives_the_same_endpoints() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "default", "uid": "u1",
                "labels": {"app": "web"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{…}"}},
            "spec": {"nodeName": "n1", "hostname": "h", "subdomain": "web",
                "containers": [{"name": "c", "image": "nginx", "env": [{"name": "A", "value": "b"}],
                    "ports": [{"name": "http", "containerPort": 8080}]}],
                "volumes": [{"name": "v", "emptyDir": {}}]},
            "status": {"phase": "Running", "podIP": "10.244.0.5", "podIPs": [{"ip": "10.244.0.5"}],
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "c", "image": "nginx", "imageID": "sha256:x",
                    "ready": true, "restartCount": 0}]}
        }))
        .unwrap();
        let service: k8s_openapi::api::core::v1::Service =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]}
            }))
            .unwrap();
        let mut projected = pod.clone();
        project(&mut projected);
        let endpoint = desired::pod_endpoint(&service, &pod);
        assert!(endpoint.as_ref().is_some_and(|e| e.hostname.is_some()));
        assert_eq!(desired::pod_endpoint(&service, &projected), endpoint);
        let spec = projected.spec.as_ref().unwrap();
        assert!(spec.volumes.is_none() && spec.containers[0].env.is_none());
        assert!(projected.metadata.annotations.is_none());
        let statuses = projected.status.unwrap().container_statuses.unwrap();
        assert_eq!(
            (statuses[0].name.as_str(), statuses[0].image.as_str()),
            ("c", "")
        );
    }
}
