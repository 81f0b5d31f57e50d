//! The endpoints controller (SPEC E1, E2): for every Service with a
//! selector, an Endpoints object of the same name and EndpointSlices
//! labelled `kubernetes.io/service-name` listing the selected pods, ready
//! ones as ready. Built on kube-runtime: a Service controller, triggered also
//! by pod changes through a shared pod reflector.

pub mod desired;
mod index;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::TryStreamExt;
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;

use desired::{MANAGED_BY, MANAGED_BY_LABEL, SERVICE_NAME_LABEL, TRIGGER_TIME_ANNOTATION};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request.
    #[error("API request failed: {0}")]
    Api(#[from] kube::Error),
}

struct Context {
    client: Client,
    pods: Store<Pod>,
    index: Arc<Mutex<index::Index>>,
}

fn selector_of(service: &Service) -> Option<&BTreeMap<String, String>> {
    service.spec.as_ref().and_then(|s| s.selector.as_ref())
}

/// Runs the controller until the process ends.
pub async fn run(client: Client) {
    let (pods, pod_writer) = reflector::store::<Pod>();
    let (services, service_writer) = reflector::store::<Service>();
    let (deleted_tx, deleted_rx) = tokio::sync::mpsc::unbounded_channel::<Service>();

    let pod_events = watcher(Api::<Pod>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(pod_writer)
        .touched_objects();
    let index = Arc::new(Mutex::new(index::Index::default()));
    let service_index = index.clone();
    let service_events = watcher(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(service_writer)
    .inspect_ok(move |event| match event {
        watcher::Event::Apply(svc) | watcher::Event::InitApply(svc) => {
            let namespace = svc.namespace().unwrap_or_default();
            service_index
                .lock()
                .set_service(&namespace, &svc.name_any(), selector_of(svc));
        }
        watcher::Event::Delete(svc) => {
            service_index.lock().set_service(
                &svc.namespace().unwrap_or_default(),
                &svc.name_any(),
                None,
            );
            let _ = deleted_tx.send(svc.clone());
        }
        watcher::Event::Init | watcher::Event::InitDone => {}
    })
    .applied_objects();

    // A pod event concerns the Services that select it now and those that
    // selected it before (a relabelled pod must leave the old ones).
    let pod_store = pods.clone();
    let pod_index = index.clone();
    let mapper = move |pod: Pod| {
        let namespace = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        // The reflector has already applied this event: a pod it no longer
        // holds was deleted.
        let gone = pod_store.get(&ObjectRef::from_obj(&pod)).is_none();
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let mut index = pod_index.lock();
        let before = index.set_pod(&namespace, &name, (!gone).then_some(&labels));
        let mut services = index.services_selecting(&namespace, &labels);
        if let Some(before) = before {
            services.extend(index.services_selecting(&namespace, &before));
        }
        services
            .into_iter()
            .map(|s| ObjectRef::new(&s).within(&namespace))
            .collect::<Vec<_>>()
    };

    tokio::spawn(clean_up_deleted(client.clone(), deleted_rx));
    let context = Arc::new(Context {
        client,
        pods,
        index,
    });
    crate::drive(
        Controller::for_stream(service_events, services)
            .watches_stream(pod_events, mapper)
            .run(reconcile, error_policy, context),
        "endpoints reconcile",
    )
    .await;
}

fn error_policy(service: Arc<Service>, error: &Error, _: Arc<Context>) -> Action {
    tracing::warn!(%error, service = %service.name_any(), "endpoints update failed; retrying");
    Action::requeue(Duration::from_millis(500))
}

/// The time of the newest change the endpoints reflect (E2): a pod's
/// readiness transition or the Service's creation.
fn trigger_time(service: &Service, pods: &[Arc<Pod>]) -> String {
    let mut newest = service.metadata.creation_timestamp.as_ref().map(|t| t.0);
    for pod in pods {
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
        if let Some(time) = ready
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0)
        {
            newest = newest.max(Some(time));
        }
    }
    newest.unwrap_or_else(jiff::Timestamp::now).to_string()
}

fn owner_reference(service: &Service) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Service".into(),
        name: service.name_any(),
        uid: service.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

async fn reconcile(service: Arc<Service>, ctx: Arc<Context>) -> Result<Action, Error> {
    let has_selector = service
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .is_some_and(|s| !s.is_empty());
    if !has_selector {
        // Selector-less Services: the user writes the Endpoints (S7).
        return Ok(Action::await_change());
    }
    let namespace = service.namespace().unwrap_or_default();
    let name = service.name_any();
    let empty = BTreeMap::new();
    let selected = ctx
        .index
        .lock()
        .pods_selected(&namespace, selector_of(&service).unwrap_or(&empty));
    let pods: Vec<Arc<Pod>> = selected
        .iter()
        .filter_map(|pod| ctx.pods.get(&ObjectRef::new(pod).within(&namespace)))
        .filter(|p| desired::selects(&service, p))
        .collect();
    let endpoints = desired::endpoints_of(&service, pods.iter().map(|p| &**p));
    let trigger = trigger_time(&service, &pods);
    write_endpoints(
        &ctx.client,
        &service,
        &namespace,
        &name,
        &endpoints,
        &trigger,
    )
    .await?;
    write_slices(
        &ctx.client,
        &service,
        &namespace,
        &name,
        &endpoints,
        &trigger,
    )
    .await?;
    Ok(Action::await_change())
}

async fn write_endpoints(
    client: &Client,
    service: &Service,
    namespace: &str,
    name: &str,
    endpoints: &[desired::PodEndpoint],
    trigger: &str,
) -> Result<(), Error> {
    let api: Api<Endpoints> = Api::namespaced(client.clone(), namespace);
    let subsets = desired::subsets(service, endpoints);
    let subsets = Some(subsets).filter(|s| !s.is_empty());
    let existing = api.get_opt(name).await?;
    let labels = service.metadata.labels.clone();
    if let Some(existing) = &existing {
        if existing.subsets == subsets && existing.metadata.labels == labels {
            return Ok(());
        }
    }
    let object = Endpoints {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels,
            annotations: Some([(TRIGGER_TIME_ANNOTATION.to_owned(), trigger.to_owned())].into()),
            resource_version: existing
                .as_ref()
                .and_then(|e| e.metadata.resource_version.clone()),
            ..ObjectMeta::default()
        },
        subsets,
    };
    match existing {
        Some(_) => api.replace(name, &PostParams::default(), &object).await?,
        None => api.create(&PostParams::default(), &object).await?,
    };
    Ok(())
}

async fn write_slices(
    client: &Client,
    service: &Service,
    namespace: &str,
    name: &str,
    endpoints: &[desired::PodEndpoint],
    trigger: &str,
) -> Result<(), Error> {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
    let selector = format!("{SERVICE_NAME_LABEL}={name},{MANAGED_BY_LABEL}={MANAGED_BY}");
    let mut existing = api
        .list(&ListParams::default().labels(&selector))
        .await?
        .items;
    existing.sort_by_key(ResourceExt::name_any);
    let wanted = desired::slice_contents(service, endpoints);
    let keep = wanted.len();
    let mut labels = service.metadata.labels.clone().unwrap_or_default();
    labels.insert(SERVICE_NAME_LABEL.into(), name.to_owned());
    labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    for (index, (ports, entries)) in wanted.into_iter().enumerate() {
        let ports = Some(ports);
        let current = existing.get(index);
        if current.is_some_and(|c| {
            c.ports == ports
                && c.endpoints == entries
                && c.metadata.labels.as_ref() == Some(&labels)
        }) {
            continue;
        }
        let slice = EndpointSlice {
            metadata: ObjectMeta {
                name: current.map(ResourceExt::name_any),
                generate_name: Some(format!("{name}-")),
                namespace: Some(namespace.to_owned()),
                labels: Some(labels.clone()),
                annotations: Some(
                    [(TRIGGER_TIME_ANNOTATION.to_owned(), trigger.to_owned())].into(),
                ),
                owner_references: Some(vec![owner_reference(service)]),
                resource_version: current.and_then(|c| c.metadata.resource_version.clone()),
                ..ObjectMeta::default()
            },
            address_type: "IPv4".into(),
            endpoints: entries,
            ports,
        };
        match current {
            Some(current) => {
                api.replace(&current.name_any(), &PostParams::default(), &slice)
                    .await?
            }
            None => api.create(&PostParams::default(), &slice).await?,
        };
    }
    for extra in existing.iter().skip(keep) {
        delete_ignoring_missing(&api, &extra.name_any()).await?;
    }
    Ok(())
}

async fn delete_ignoring_missing<K>(api: &Api<K>, name: &str) -> Result<(), Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Removes the Endpoints and slices of deleted Services.
async fn clean_up_deleted(
    client: Client,
    mut deleted: tokio::sync::mpsc::UnboundedReceiver<Service>,
) {
    while let Some(service) = deleted.recv().await {
        let has_selector = service
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .is_some_and(|s| !s.is_empty());
        let namespace = service.namespace().unwrap_or_default();
        let name = service.name_any();
        let result = async {
            if has_selector {
                delete_ignoring_missing(
                    &Api::<Endpoints>::namespaced(client.clone(), &namespace),
                    &name,
                )
                .await?;
            }
            let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
            let selector = format!("{SERVICE_NAME_LABEL}={name},{MANAGED_BY_LABEL}={MANAGED_BY}");
            for slice in slices
                .list(&ListParams::default().labels(&selector))
                .await?
                .items
            {
                delete_ignoring_missing(&slices, &slice.name_any()).await?;
            }
            Ok::<_, Error>(())
        }
        .await;
        if let Err(error) = result {
            tracing::warn!(%error, service = %name, "cleaning up after a deleted Service failed");
        }
    }
}
