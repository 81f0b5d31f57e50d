//! The `kubernetes` Service in `default` (SPEC S4): the first address of the
//! service range, port 443, pointing at this API server. Created at start;
//! its target port follows the server's real port, its Endpoints the
//! servers alive (`endpoint_leases`). Also the
//! `kube-dns` Service in `kube-system` (the tenth address, as kubeadm
//! does), the address pods are given as their nameserver. It selects no
//! pods: the built-in DNS publishes its own address as its Endpoints.

use portal_api::{kinds, Status};
use serde_json::{json, Value};

use super::endpoint_leases::MANAGER;
use crate::registry::write::internal::{Change, Writer};
use crate::registry::write::Part;
use crate::ApiState;

/// Creates `kube-system/kube-dns` unless it exists (a user may change it)
/// or the range has no tenth address.
pub(crate) async fn ensure_dns(state: &ApiState) -> Result<(), Status> {
    let Some(address) = state.allocators.dns_address() else {
        return Ok(());
    };
    let svc = json!({
        "apiVersion": "v1", "kind": "Service",
        // `kubectl cluster-info` lists the kube-system Services labelled
        // `kubernetes.io/cluster-service`, by their `kubernetes.io/name`.
        "metadata": {"name": "kube-dns", "labels": {
            "k8s-app": "kube-dns", "kubernetes.io/name": "Portal-DNS",
            "kubernetes.io/cluster-service": "true",
        }},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": address,
            "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
            ],
        },
    });
    let writer = Writer::new(state, &kinds::service::RESOURCE, MANAGER);
    match writer.create(Some("kube-system"), svc).await {
        Ok(_) => Ok(()),
        // Taken already (by a user's Service, or a second server); one this
        // server made before it carried the cluster-service label gets it.
        Err(status) if status.code == 409 => {
            let labelled = writer
                .update(Some("kube-system"), "kube-dns", Part::Main, |current| {
                    let labels = &current["metadata"]["labels"];
                    if labels["kubernetes.io/name"] != "Portal-DNS"
                        || !labels["kubernetes.io/cluster-service"].is_null()
                    {
                        return Change::Keep;
                    }
                    let mut svc = current.clone();
                    svc["metadata"]["labels"]["kubernetes.io/cluster-service"] = json!("true");
                    Change::Write(svc)
                })
                .await;
            match labelled {
                Err(status) if status.code != 404 && status.code != 409 => Err(status),
                _ => Ok(()),
            }
        }
        Err(status) => Err(status),
    }
}

fn ports(api_port: u16) -> Value {
    json!([{"name": "https", "port": 443, "protocol": "TCP", "targetPort": api_port}])
}

/// Creates or updates the Service (its Endpoints are the servers alive:
/// [`super::endpoint_leases`]).
pub(crate) async fn ensure(state: &ApiState, api_port: u16) -> Result<(), Status> {
    let writer = Writer::new(state, &kinds::service::RESOURCE, MANAGER);
    let ports = ports(api_port);
    let updated = writer
        .update(Some("default"), "kubernetes", Part::Main, |current| {
            if current["spec"]["ports"] == ports {
                return Change::Keep;
            }
            let mut svc = current.clone();
            svc["spec"]["ports"] = ports.clone();
            Change::Write(svc)
        })
        .await;
    match updated {
        Ok(_) => Ok(()),
        Err(status) if status.code == 404 => {
            let svc = json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
                "spec": {"type": "ClusterIP", "clusterIP": state.allocators.first_address(), "ports": ports},
            });
            match writer.create(Some("default"), svc).await {
                // Another server starting at the same moment made it.
                Ok(_) => Ok(()),
                Err(status) if status.code == 409 => Ok(()),
                Err(status) => Err(status),
            }
        }
        Err(status) if status.code == 409 => Ok(()),
        Err(status) => Err(status),
    }
}
