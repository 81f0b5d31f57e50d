//! The `kubernetes` Service in `default` (SPEC S4): the first address of the
//! service range, port 443, pointing at this API server. Created at start;
//! its target port follows the server's real port, its Endpoints the
//! servers alive (`endpoint_leases`). Also the
//! `kube-dns` Service in `kube-system` (the tenth address, as kubeadm
//! does), the address pods are given as their nameserver. It selects no
//! pods: the built-in DNS publishes its own address as its Endpoints.

use bytes::Bytes;
use portal_api::kinds;
use portal_store::{Error as StoreError, Op, Store};
use serde_json::{json, Value};

use crate::registry::allocator::Allocators;
use crate::registry::strategy;

/// Creates `kube-system/kube-dns` unless it exists (a user may change it)
/// or the range has no tenth address.
pub(crate) async fn ensure_dns(
    store: &dyn Store,
    allocators: &Allocators,
) -> Result<(), StoreError> {
    let resource = &kinds::service::RESOURCE;
    let key = resource.key(Some("kube-system"), "kube-dns");
    let Some(address) = allocators.dns_address() else {
        return Ok(());
    };
    if store.get(&key).await?.is_some() {
        return Ok(());
    }
    let mut svc = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kube-dns", "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "Portal-DNS"}},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": address,
            "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
            ],
        },
    });
    strategy::prepare_create(resource, &mut svc, Some("kube-system"));
    (kinds::service::RESOURCE.defaults)(&mut svc);
    let mut reservation = allocators
        .for_create(resource, &mut svc)
        .map_err(|cause| StoreError::Backend(format!("kube-dns Service: {}", cause.display())))?;
    let mut ops = vec![Op::Create {
        key,
        value: Bytes::from(svc.to_string()),
    }];
    ops.append(&mut reservation.ops);
    match store.txn(ops).await {
        Ok(_) => {
            reservation.commit();
            Ok(())
        }
        Err(e) => {
            reservation.abort(None);
            match e {
                // Taken already (by a user's Service, or a second server).
                StoreError::AlreadyExists { .. } => Ok(()),
                e => Err(e),
            }
        }
    }
}

fn ports(api_port: u16) -> Value {
    json!([{"name": "https", "port": 443, "protocol": "TCP", "targetPort": api_port}])
}

/// Creates or updates the Service (its Endpoints are the servers alive:
/// [`crate::duties::endpoint_leases`]).
pub(crate) async fn ensure(
    store: &dyn Store,
    allocators: &Allocators,
    api_port: u16,
) -> Result<(), StoreError> {
    let resource = &kinds::service::RESOURCE;
    let key = resource.key(Some("default"), "kubernetes");
    match store.get(&key).await? {
        None => {
            let mut svc = json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
                "spec": {"type": "ClusterIP", "clusterIP": allocators.first_address(), "ports": ports(api_port)},
            });
            strategy::prepare_create(resource, &mut svc, Some("default"));
            (kinds::service::RESOURCE.defaults)(&mut svc);
            let mut reservation = allocators.for_create(resource, &mut svc).map_err(|cause| {
                StoreError::Backend(format!("kubernetes Service: {}", cause.display()))
            })?;
            let mut ops = vec![Op::Create {
                key,
                value: Bytes::from(svc.to_string()),
            }];
            ops.append(&mut reservation.ops);
            match store.txn(ops).await {
                Ok(_) => reservation.commit(),
                Err(e) => {
                    reservation.abort(None);
                    if !matches!(e, StoreError::AlreadyExists { .. }) {
                        return Err(e);
                    }
                }
            }
        }
        Some(current) => {
            let mut svc: Value = serde_json::from_slice(&current.value)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            if svc["spec"]["ports"] != ports(api_port) {
                svc["spec"]["ports"] = ports(api_port);
                let op = Op::Update {
                    key,
                    value: Bytes::from(svc.to_string()),
                    expected_revision: current.mod_revision,
                };
                match store.txn(vec![op]).await {
                    // Another server starting at the same moment wrote it.
                    Ok(_) | Err(StoreError::Conflict { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(())
}
