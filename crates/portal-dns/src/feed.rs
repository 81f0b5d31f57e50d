//! Feeds the records from watches of Services and EndpointSlices, so the
//! server runs against Portal or any Kubernetes API server. A re-list
//! (after a broken watch) removes what disappeared meanwhile.

use std::net::IpAddr;
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use parking_lot::RwLock;

use crate::metrics::Metrics;
use crate::records::{EndpointInfo, Port, Records, ServiceInfo, SliceInfo};

use portal_client::labels::{
    SERVICE_NAME as SERVICE_NAME_LABEL, TRIGGER_TIME as TRIGGER_TIME_ANNOTATION,
};
use portal_client::Change;

fn port(name: Option<&String>, protocol: Option<&String>, number: Option<i32>) -> Option<Port> {
    Some(Port {
        name: name.cloned().unwrap_or_default(),
        protocol: protocol.map_or("tcp".into(), |p| p.to_ascii_lowercase()),
        port: u16::try_from(number?).ok()?,
    })
}

/// What DNS needs of a Service.
pub(crate) fn service_info(service: &Service) -> ServiceInfo {
    let Some(spec) = &service.spec else {
        return ServiceInfo::default();
    };
    if spec.type_.as_deref() == Some("ExternalName") {
        return ServiceInfo {
            external_name: spec.external_name.clone(),
            ..ServiceInfo::default()
        };
    }
    let mut cluster_ips: Vec<IpAddr> = spec
        .cluster_ips
        .iter()
        .flatten()
        .chain(spec.cluster_ip.iter())
        .filter_map(|ip| ip.parse().ok())
        .collect();
    cluster_ips.sort_unstable();
    cluster_ips.dedup();
    ServiceInfo {
        cluster_ips,
        external_name: None,
        ports: spec
            .ports
            .iter()
            .flatten()
            .filter_map(|p| port(p.name.as_ref(), p.protocol.as_ref(), Some(p.port)))
            .collect(),
    }
}

/// What DNS needs of an EndpointSlice; `None` for slices of no Service.
pub(crate) fn slice_info(slice: &EndpointSlice) -> Option<SliceInfo> {
    let service = slice.labels().get(SERVICE_NAME_LABEL)?.clone();
    Some(SliceInfo {
        service,
        endpoints: slice
            .endpoints
            .iter()
            .map(|e| EndpointInfo {
                addresses: e.addresses.iter().filter_map(|a| a.parse().ok()).collect(),
                hostname: e.hostname.clone(),
                // Unset means ready (discovery.k8s.io/v1).
                ready: e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true),
            })
            .collect(),
        ports: slice
            .ports
            .iter()
            .flatten()
            .filter_map(|p| port(p.name.as_ref(), p.protocol.as_ref(), p.port))
            .collect(),
    })
}

/// Follows Services and EndpointSlices until the process ends.
pub(crate) async fn run(client: Client, records: Arc<RwLock<Records>>, metrics: Arc<Metrics>) {
    let services = watcher(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff();
    let slices = watcher(
        Api::<EndpointSlice>::all(client),
        watcher::Config::default(),
    )
    .default_backoff();
    let service_records = records.clone();
    tokio::join!(
        follow(services, "dns services", move |change| {
            apply_service(&service_records, change);
        }),
        follow(slices, "dns endpointslices", move |change| {
            apply_slice(&records, &metrics, change);
        }),
    );
}

async fn follow<K: kube::Resource + Send + 'static>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    what: &'static str,
    mut apply: impl FnMut(Change<K>),
) {
    let mut changes = std::pin::pin!(portal_client::changes(events, what));
    while let Some(change) = changes.next().await {
        apply(change);
    }
}

fn key_of<K: kube::Resource>(object: &K) -> (String, String) {
    (object.namespace().unwrap_or_default(), object.name_any())
}

fn apply_service(records: &RwLock<Records>, change: Change<Service>) {
    match change {
        Change::Put(service) | Change::Listed(service) => {
            records
                .write()
                .set_service(&key_of(&service), Some(service_info(&service)));
        }
        Change::Relisted(seen) => {
            let mut records = records.write();
            for key in records.service_keys() {
                if !seen.contains(&key) {
                    records.set_service(&key, None);
                }
            }
        }
        Change::Gone(service) => records.write().set_service(&key_of(&service), None),
    }
}

fn apply_slice(records: &RwLock<Records>, metrics: &Metrics, change: Change<EndpointSlice>) {
    match change {
        // Listed again: the state, not a change to measure.
        Change::Listed(slice) => {
            let (namespace, name) = key_of(&slice);
            records
                .write()
                .set_slice(&namespace, &name, slice_info(&slice));
        }
        Change::Relisted(seen) => {
            let mut records = records.write();
            for (namespace, name) in records.slice_keys() {
                if !seen.contains(&(namespace.clone(), name.clone())) {
                    records.set_slice(&namespace, &name, None);
                }
            }
        }
        Change::Put(slice) => {
            let (namespace, name) = key_of(&slice);
            records
                .write()
                .set_slice(&namespace, &name, slice_info(&slice));
            // Answerable from now on: the programming latency (E2).
            let trigger = slice
                .annotations()
                .get(TRIGGER_TIME_ANNOTATION)
                .and_then(|t| t.parse::<jiff::Timestamp>().ok());
            if let Some(trigger) = trigger {
                let took = jiff::Timestamp::now().duration_since(trigger);
                if let Ok(took) = std::time::Duration::try_from(took) {
                    metrics.programmed(took);
                }
            }
        }
        Change::Gone(slice) => {
            let (namespace, name) = key_of(&slice);
            records.write().set_slice(&namespace, &name, None);
        }
    }
}
