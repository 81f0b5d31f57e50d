//! EndpointSlice mirroring: the Endpoints a user writes for a Service
//! without a selector (SPEC S7) are mirrored into EndpointSlices, as
//! Kubernetes' mirroring controller does, so consumers that read only
//! slices (the proxy, DNS) see them too. Endpoints labelled
//! `endpointslice.kubernetes.io/skip-mirror=true` (the endpoints
//! controller's own) are left alone. Reads come from reflectors only.

use futures_util::TryStreamExt;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};

use crate::endpoints::desired::{
    MAX_ENDPOINTS_PER_SLICE, SERVICE_NAME_LABEL, SKIP_MIRROR_LABEL, TRIGGER_TIME_ANNOTATION,
};

use portal_client::labels::MANAGED_BY as MANAGED_BY_LABEL;
const MIRRORED_BY: &str = "endpointslicemirroring-controller.k8s.io";

pub use crate::ReconcileError as Error;

struct Context {
    client: Client,
    /// Delays between retries of a failing object.
    retries: crate::Retries,
    services: Store<Service>,
    mirrors: Store<EndpointSlice>,
    services_listed: Arc<crate::Listed>,
    mirrors_listed: Arc<crate::Listed>,
}

fn endpoints_of_slice(slice: &EndpointSlice) -> Option<ObjectRef<Endpoints>> {
    let name = slice.labels().get(SERVICE_NAME_LABEL)?;
    Some(ObjectRef::new(name).within(&slice.namespace().unwrap_or_default()))
}

pub async fn run(client: Client) {
    let (services, service_writer) = reflector::store::<Service>();
    let (mirrors, mirror_writer) = reflector::store::<EndpointSlice>();
    let (services_listed, mirrors_listed) = (
        Arc::new(crate::Listed::default()),
        Arc::new(crate::Listed::default()),
    );
    let listed = services_listed.clone();
    // A Service gaining or losing its selector changes whether its
    // Endpoints are mirrored.
    let service_events = portal_client::settled_objects(
        watcher(
            Api::<Service>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect(service_writer)
        .inspect_ok(move |event| listed.on_init_done(event)),
    );
    let listed = mirrors_listed.clone();
    // The mirrors themselves: changed or deleted by someone else, they are
    // put back.
    let mirror_events = portal_client::settled_objects(
        watcher(
            Api::<EndpointSlice>::all(client.clone()),
            watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MIRRORED_BY}")),
        )
        .default_backoff()
        .reflect(mirror_writer)
        .inspect_ok(move |event| listed.on_init_done(event)),
    );
    let context = Arc::new(Context {
        retries: crate::Retries::new(Duration::from_secs(1)),
        client: client.clone(),
        services,
        mirrors,
        services_listed,
        mirrors_listed,
    });
    crate::drive(
        Controller::new(Api::<Endpoints>::all(client), watcher::Config::default())
            .with_config(crate::config())
            .watches_stream(service_events, |svc: Service| {
                Some(
                    ObjectRef::<Endpoints>::new(&svc.name_any())
                        .within(&svc.namespace().unwrap_or_default()),
                )
            })
            .watches_stream(mirror_events, |slice: EndpointSlice| {
                endpoints_of_slice(&slice)
            })
            .run(reconcile, error_policy, context.clone()),
        "endpoints mirroring",
        &context.retries,
    )
    .await;
}

fn error_policy(endpoints: Arc<Endpoints>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, endpoints = %endpoints.name_any(), "mirroring failed; retrying");
    Action::requeue(ctx.retries.after_failure(endpoints.as_ref()))
}

/// One mirrored slice: its address type, ports and endpoints.
struct Mirror {
    address_type: &'static str,
    ports: Vec<EndpointPort>,
    endpoints: Vec<Endpoint>,
}

/// The slices' contents: per subset and address family (a slice holds
/// addresses of one type, as the mirroring controller keys them), chunked,
/// ready and not ready. Addresses that are no IP are left out.
fn mirrored(endpoints: &Endpoints) -> Vec<Mirror> {
    let mut slices = Vec::new();
    for subset in endpoints.subsets.iter().flatten() {
        let ports: Vec<EndpointPort> = subset
            .ports
            .iter()
            .flatten()
            .map(|p| EndpointPort {
                name: Some(p.name.clone().unwrap_or_default()),
                port: Some(p.port),
                protocol: p.protocol.clone(),
                app_protocol: p.app_protocol.clone(),
            })
            .collect();
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for (list, ready) in [
            (&subset.addresses, true),
            (&subset.not_ready_addresses, false),
        ] {
            for address in list.iter().flatten() {
                let family = match address.ip.parse::<std::net::IpAddr>() {
                    Ok(std::net::IpAddr::V4(_)) => &mut v4,
                    Ok(std::net::IpAddr::V6(_)) => &mut v6,
                    Err(_) => continue,
                };
                family.push(Endpoint {
                    addresses: vec![address.ip.clone()],
                    conditions: Some(EndpointConditions {
                        ready: Some(ready),
                        serving: Some(ready),
                        terminating: Some(false),
                    }),
                    hostname: address.hostname.clone(),
                    node_name: address.node_name.clone(),
                    target_ref: address.target_ref.clone(),
                    ..Endpoint::default()
                });
            }
        }
        for (address_type, entries) in [("IPv4", v4), ("IPv6", v6)] {
            for chunk in entries.chunks(MAX_ENDPOINTS_PER_SLICE) {
                slices.push(Mirror {
                    address_type,
                    ports: ports.clone(),
                    endpoints: chunk.to_vec(),
                });
            }
        }
    }
    slices
}

async fn reconcile(endpoints: Arc<Endpoints>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !(ctx.services_listed.is_set() && ctx.mirrors_listed.is_set()) {
        return Ok(Action::requeue(crate::NOT_LISTED_YET));
    }
    let namespace = endpoints.namespace().unwrap_or_default();
    let name = endpoints.name_any();
    let mut existing: Vec<Arc<EndpointSlice>> = ctx
        .mirrors
        .state()
        .into_iter()
        .filter(|s| {
            s.namespace().as_deref() == Some(namespace.as_str())
                && s.labels().get(SERVICE_NAME_LABEL) == Some(&name)
        })
        .collect();
    // The endpoints controller's own Endpoints (almost all of them) cost
    // nothing here.
    let skip = endpoints
        .labels()
        .get(SKIP_MIRROR_LABEL)
        .map(String::as_str)
        == Some("true");
    if skip && existing.is_empty() {
        return Ok(Action::await_change());
    }
    // In the order they were made: `-mirror-2` before `-mirror-10`.
    existing.sort_by_key(|s| (s.name_any().len(), s.name_any()));
    let service = ctx.services.get(&ObjectRef::new(&name).within(&namespace));
    let selectorless = !skip
        && service.as_ref().is_some_and(|s| {
            s.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .is_none_or(|s| s.is_empty())
        });
    let wanted = if selectorless {
        mirrored(&endpoints)
    } else {
        Vec::new()
    };
    let slices: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut labels = endpoints.labels().clone();
    labels.insert(SERVICE_NAME_LABEL.into(), name.clone());
    labels.insert(MANAGED_BY_LABEL.into(), MIRRORED_BY.into());
    // Slices are matched within their address type (which never changes):
    // the n-th wanted one of a type replaces the n-th existing one.
    let mut kept: Vec<String> = Vec::new();
    let mut place: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for mirror in &wanted {
        let index = place.entry(mirror.address_type).or_default();
        let current = existing
            .iter()
            .filter(|s| s.address_type == mirror.address_type)
            .nth(*index);
        // Named by type and position, not generated: a create from a stale
        // view of the mirrors fails (409) instead of duplicating.
        let fresh_name = match mirror.address_type {
            "IPv4" => format!("{name}-mirror-{index}"),
            other => format!("{name}-mirror-{}-{index}", other.to_lowercase()),
        };
        *index += 1;
        if let Some(current) = current {
            kept.push(current.name_any());
        }
        let ports = Some(mirror.ports.clone());
        if current.is_some_and(|c| c.ports == ports && c.endpoints == mirror.endpoints) {
            continue;
        }
        let slice = EndpointSlice {
            metadata: ObjectMeta {
                name: Some(current.map_or(fresh_name, |c| c.name_any())),
                namespace: Some(namespace.clone()),
                labels: Some(labels.clone()),
                annotations: endpoints
                    .annotations()
                    .get(TRIGGER_TIME_ANNOTATION)
                    .map(|t| [(TRIGGER_TIME_ANNOTATION.to_owned(), t.clone())].into()),
                resource_version: current.and_then(|c| c.metadata.resource_version.clone()),
                // Owned by the Endpoints: deleting them deletes the mirror.
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Endpoints".into(),
                    name: name.clone(),
                    uid: endpoints.metadata.uid.clone().unwrap_or_default(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]),
                ..ObjectMeta::default()
            },
            address_type: mirror.address_type.into(),
            endpoints: mirror.endpoints.clone(),
            ports,
        };
        match current {
            Some(current) => {
                slices
                    .replace(&current.name_any(), &PostParams::default(), &slice)
                    .await?
            }
            None => slices.create(&PostParams::default(), &slice).await?,
        };
    }
    for extra in existing.iter().filter(|s| !kept.contains(&s.name_any())) {
        match slices
            .delete(&extra.name_any(), &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Action::await_change())
}
