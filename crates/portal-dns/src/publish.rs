//! Makes the cluster DNS reachable at the kube-dns Service address: when
//! this server answers on a node address, that address becomes the
//! Endpoints of a selector-less `kube-system/kube-dns` Service (the service
//! proxy then routes `10.96.0.10:53` there, as it routes any Service). A
//! kube-dns Service with a selector belongs to DNS pods someone deployed and
//! is left alone.

use std::net::SocketAddr;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, Service,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

const NAMESPACE: &str = "kube-system";
const NAME: &str = "kube-dns";

/// Publishes `addr` as kube-dns's endpoints; returns whether it did.
pub async fn publish(client: &Client, addr: SocketAddr) -> Result<bool, kube::Error> {
    let services = Api::<Service>::namespaced(client.clone(), NAMESPACE);
    let Some(service) = services.get_opt(NAME).await? else {
        return Ok(false);
    };
    let selected = service
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .is_some_and(|s| !s.is_empty());
    if selected {
        tracing::info!("kube-dns selects pods: not publishing the built-in DNS there");
        return Ok(false);
    }
    let port = |name: &str, protocol: &str| EndpointPort {
        name: Some(name.into()),
        port: i32::from(addr.port()),
        protocol: Some(protocol.into()),
        app_protocol: None,
    };
    let endpoints = Endpoints {
        metadata: ObjectMeta {
            name: Some(NAME.into()),
            namespace: Some(NAMESPACE.into()),
            labels: Some([("k8s-app".to_owned(), "kube-dns".to_owned())].into()),
            ..ObjectMeta::default()
        },
        subsets: Some(vec![EndpointSubset {
            addresses: Some(vec![EndpointAddress {
                ip: addr.ip().to_string(),
                ..EndpointAddress::default()
            }]),
            ports: Some(vec![port("dns", "UDP"), port("dns-tcp", "TCP")]),
            not_ready_addresses: None,
        }]),
    };
    let api = Api::<Endpoints>::namespaced(client.clone(), NAMESPACE);
    let params = PatchParams::default();
    // A merge patch creates nothing: create, or replace what is there.
    match api.get_opt(NAME).await? {
        None => {
            api.create(&kube::api::PostParams::default(), &endpoints)
                .await?;
        }
        Some(_) => {
            api.patch(NAME, &params, &Patch::Merge(&endpoints)).await?;
        }
    }
    tracing::info!(%addr, "cluster DNS published as the kube-dns endpoints");
    Ok(true)
}
