//! Feeds the records from watches of Services and EndpointSlices, so the
//! server runs against Portal or any Kubernetes API server. A re-list
//! (after a broken watch) removes what disappeared meanwhile.

use std::collections::HashSet;
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

const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
const TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";

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
    let (mut relisted_services, mut relisted_slices) = (None, None);
    tokio::join!(
        follow(services, move |event| {
            apply_service(&service_records, &mut relisted_services, event);
        }),
        follow(slices, move |event| {
            apply_slice(&records, &metrics, &mut relisted_slices, event);
        }),
    );
}

async fn follow<K>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    mut apply: impl FnMut(watcher::Event<K>),
) {
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => apply(event),
            Err(error) => tracing::warn!(%error, "DNS watch failed; retrying"),
        }
    }
}

/// Keys seen during a re-list, to drop the rest when it ends.
type Relisted = Option<HashSet<(String, String)>>;

fn key_of<K: kube::Resource>(object: &K) -> (String, String) {
    (object.namespace().unwrap_or_default(), object.name_any())
}

fn apply_service(
    records: &RwLock<Records>,
    relisted: &mut Relisted,
    event: watcher::Event<Service>,
) {
    match event {
        watcher::Event::Init => *relisted = Some(HashSet::new()),
        watcher::Event::InitApply(service) => {
            let key = key_of(&service);
            if let Some(seen) = relisted.as_mut() {
                seen.insert(key.clone());
            }
            records
                .write()
                .set_service(&key, Some(service_info(&service)));
        }
        watcher::Event::InitDone => {
            let seen = relisted.take().unwrap_or_default();
            let mut records = records.write();
            for key in records.service_keys() {
                if !seen.contains(&key) {
                    records.set_service(&key, None);
                }
            }
        }
        watcher::Event::Apply(service) => {
            records
                .write()
                .set_service(&key_of(&service), Some(service_info(&service)));
        }
        watcher::Event::Delete(service) => records.write().set_service(&key_of(&service), None),
    }
}

fn apply_slice(
    records: &RwLock<Records>,
    metrics: &Metrics,
    relisted: &mut Relisted,
    event: watcher::Event<EndpointSlice>,
) {
    match event {
        watcher::Event::Init => *relisted = Some(HashSet::new()),
        watcher::Event::InitApply(slice) => {
            let (namespace, name) = key_of(&slice);
            if let Some(seen) = relisted.as_mut() {
                seen.insert((namespace.clone(), name.clone()));
            }
            records
                .write()
                .set_slice(&namespace, &name, slice_info(&slice));
        }
        watcher::Event::InitDone => {
            let seen = relisted.take().unwrap_or_default();
            let mut records = records.write();
            for (namespace, name) in records.slice_keys() {
                if !seen.contains(&(namespace.clone(), name.clone())) {
                    records.set_slice(&namespace, &name, None);
                }
            }
        }
        watcher::Event::Apply(slice) => {
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
        watcher::Event::Delete(slice) => {
            let (namespace, name) = key_of(&slice);
            records.write().set_slice(&namespace, &name, None);
        }
    }
}
