//! Follows what the routing table is made of — Ingresses, IngressClasses,
//! Services, EndpointSlices and TLS Secrets — into one in-memory world
//! (without `managedFields`), and rebuilds the table whenever any of it
//! changes: a burst of changes makes one rebuild. The new table is
//! swapped in whole (requests in flight keep the one they started with),
//! the certificates follow, and each Ingress served gets the proxy's
//! addresses in its status (written by a task of its own). The Gateway
//! API's objects join the same world once their definitions are served;
//! their routes are compiled in the same rebuild.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::api::{Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use parking_lot::Mutex;
use portal_client::Change;
use serde_json::json;
use tokio::sync::{watch, Notify};

use crate::backends::{slices_by_service, Backends};
use crate::gateway::compile::{compile, Desired, Objects, Sockets};
use crate::gateway::objects::{Gateway, GatewayClass, HttpRoute, ReferenceGrant};
use crate::gateway::status::to_write;
use crate::proxy::Routing;
use crate::routes::Table;
use crate::tls::Certificates;
use crate::CONTROLLER;

type Key = (String, String);

#[derive(Debug, Default)]
pub(crate) struct World {
    ingresses: HashMap<Key, Arc<Ingress>>,
    classes: HashMap<Key, Arc<IngressClass>>,
    services: HashMap<Key, Arc<Service>>,
    slices: HashMap<Key, Arc<EndpointSlice>>,
    secrets: HashMap<Key, Arc<Secret>>,
    gateway_classes: HashMap<Key, Arc<GatewayClass>>,
    gateways: HashMap<Key, Arc<Gateway>>,
    http_routes: HashMap<Key, Arc<HttpRoute>>,
    grants: HashMap<Key, Arc<ReferenceGrant>>,
    namespaces: HashMap<Key, Arc<Namespace>>,
}

/// What the feed shares with the tasks that fill it.
#[derive(Debug)]
pub(crate) struct Feed {
    world: Mutex<World>,
    changed: Notify,
    /// The kinds whose first list is in the world.
    listed: Mutex<HashSet<&'static str>>,
}

/// The kinds the first table waits for (not a half-known world: 503s,
/// 404s, the fallback certificate).
const INGRESS_KINDS: [&str; 5] = [
    "ingresses",
    "ingress classes",
    "services",
    "endpoint slices",
    "tls secrets",
];
/// The kinds the Gateway API's status waits for (routes are served as
/// soon as they are known; status is written from a whole world only).
pub(crate) const GATEWAY_KINDS: [&str; 5] = [
    "gateway classes",
    "gateways",
    "http routes",
    "reference grants",
    "namespaces",
];

impl Feed {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Feed {
            world: Mutex::default(),
            changed: Notify::new(),
            listed: Mutex::default(),
        })
    }
}

fn key_of<K: Resource>(object: &K) -> Key {
    (object.namespace().unwrap_or_default(), object.name_any())
}

/// Applies one watch change to a map of objects.
fn apply<K: Resource + Clone>(map: &mut HashMap<Key, Arc<K>>, change: Change<K>) {
    match change {
        Change::Put(mut object) | Change::Listed(mut object) => {
            object.meta_mut().managed_fields = None;
            map.insert(key_of(&object), Arc::new(object));
        }
        Change::Gone(object) => {
            map.remove(&key_of(&object));
        }
        Change::Relisted(existing) => map.retain(|key, _| existing.contains(key)),
    }
}

/// Follows one kind into the world until the process ends.
pub(crate) async fn follow<K>(
    feed: Arc<Feed>,
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
    map: fn(&mut World) -> &mut HashMap<Key, Arc<K>>,
) where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let events = watcher(api, config).default_backoff();
    let mut changes = std::pin::pin!(portal_client::changes(events, what));
    while let Some(change) = changes.next().await {
        let relisted = matches!(change, Change::Relisted(_));
        apply(map(&mut feed.world.lock()), change);
        if relisted {
            feed.listed.lock().insert(what);
        }
        feed.changed.notify_one();
    }
}

pub(crate) fn ingresses(world: &mut World) -> &mut HashMap<Key, Arc<Ingress>> {
    &mut world.ingresses
}
pub(crate) fn classes(world: &mut World) -> &mut HashMap<Key, Arc<IngressClass>> {
    &mut world.classes
}
pub(crate) fn services(world: &mut World) -> &mut HashMap<Key, Arc<Service>> {
    &mut world.services
}
pub(crate) fn slices(world: &mut World) -> &mut HashMap<Key, Arc<EndpointSlice>> {
    &mut world.slices
}
pub(crate) fn secrets(world: &mut World) -> &mut HashMap<Key, Arc<Secret>> {
    &mut world.secrets
}
pub(crate) fn gateway_classes(world: &mut World) -> &mut HashMap<Key, Arc<GatewayClass>> {
    &mut world.gateway_classes
}
pub(crate) fn gateways(world: &mut World) -> &mut HashMap<Key, Arc<Gateway>> {
    &mut world.gateways
}
pub(crate) fn http_routes(world: &mut World) -> &mut HashMap<Key, Arc<HttpRoute>> {
    &mut world.http_routes
}
pub(crate) fn grants(world: &mut World) -> &mut HashMap<Key, Arc<ReferenceGrant>> {
    &mut world.grants
}
pub(crate) fn namespaces(world: &mut World) -> &mut HashMap<Key, Arc<Namespace>> {
    &mut world.namespaces
}

/// Where the table is served and what the status says.
#[derive(Clone, Debug)]
pub(crate) struct Serving {
    pub(crate) sockets: Sockets,
    /// The node's addresses, shown until the published Service has a
    /// load-balancer address (`publish`).
    pub(crate) advertised: Vec<IpAddr>,
}

/// The Ingresses whose status lacks the addresses, and the addresses.
pub(crate) type StaleIngresses = (Vec<IpAddr>, Vec<Key>);

/// Rebuilds the table (and certificates) after every change, once every
/// Ingress kind is listed, and hands the Ingresses whose status lacks the
/// proxy's addresses to [`write_status`], the Gateway API objects whose
/// status differs to `gateway::status::write`.
pub(crate) async fn rebuild(
    feed: Arc<Feed>,
    routing: Arc<Routing>,
    certificates: Arc<Certificates>,
    serving: Serving,
    status: watch::Sender<StaleIngresses>,
    gateway_status: watch::Sender<Vec<Desired>>,
) {
    loop {
        feed.changed.notified().await;
        let (ingress_ready, gateway_ready) = {
            let listed = feed.listed.lock();
            (
                INGRESS_KINDS.iter().all(|k| listed.contains(k)),
                GATEWAY_KINDS.iter().all(|k| listed.contains(k)),
            )
        };
        if !ingress_ready {
            continue;
        }
        // A burst (a re-list, a rollout) settles into one rebuild.
        tokio::task::yield_now().await;
        let (table, secrets, addresses, stale, gateway_stale) = {
            let world = feed.world.lock();
            let addresses = crate::publish::addresses(&world.services, &serving.advertised);
            let classes: Vec<String> = world
                .classes
                .values()
                .filter(|c| {
                    c.spec.as_ref().and_then(|s| s.controller.as_deref()) == Some(CONTROLLER)
                })
                .map(|c| c.name_any())
                .collect();
            let ingresses: Vec<Arc<Ingress>> = world.ingresses.values().cloned().collect();
            let slices = slices_by_service(world.slices.values().cloned());
            let mut backends = Backends::new(&world.services, &slices);
            let mut table = Table::build(&ingresses, &classes, &mut backends);
            let objects = Objects {
                classes: &world.gateway_classes,
                gateways: &world.gateways,
                routes: &world.http_routes,
                grants: &world.grants,
                namespaces: &world.namespaces,
                secrets: &world.secrets,
            };
            let compiled = compile(&objects, serving.sockets, &addresses, &mut backends);
            table.gateway_plain = compiled.plain;
            table.gateway_secure = compiled.secure;
            table.ports = serving.sockets;
            for host in compiled.tls {
                if !table.tls.iter().any(|t| t.host == host.host) {
                    table.tls.push(host);
                }
            }
            let secrets: HashMap<Key, Arc<Secret>> = table
                .tls
                .iter()
                .filter_map(|t| {
                    let key = (t.namespace.clone(), t.secret.clone());
                    Some((key.clone(), world.secrets.get(&key)?.clone()))
                })
                .collect();
            let stale: Vec<Key> = table
                .ingresses
                .iter()
                .filter(|key| {
                    world
                        .ingresses
                        .get(*key)
                        .is_some_and(|i| !shows(i, &addresses))
                })
                .cloned()
                .collect();
            let gateway_stale = if gateway_ready {
                gateway_writes(&world, compiled.statuses)
            } else {
                Vec::new()
            };
            (table, secrets, addresses, stale, gateway_stale)
        };
        // Certificates are parsed off the world's lock (the watches go on).
        certificates.update(&table.tls, |namespace, name| {
            secrets
                .get(&(namespace.to_owned(), name.to_owned()))
                .cloned()
        });
        routing.metrics.routes.set(table.len() as i64);
        routing.metrics.updates.inc();
        *routing.table.write() = Arc::new(table);
        if !addresses.is_empty() {
            status.send_replace((addresses, stale));
        }
        if !gateway_stale.is_empty() {
            gateway_status.send_replace(gateway_stale);
        }
    }
}

/// The statuses that differ from what the objects show, filled in.
fn gateway_writes(world: &World, desired: Vec<Desired>) -> Vec<Desired> {
    use crate::gateway::compile::Kind;
    let now = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
        .map(|t| t.to_string())
        .unwrap_or_default();
    desired
        .into_iter()
        .filter_map(|mut d| {
            let key = (d.namespace.clone(), d.name.clone());
            let current = match d.kind {
                Kind::GatewayClass => world.gateway_classes.get(&key).map(|o| &o.status),
                Kind::Gateway => world.gateways.get(&key).map(|o| &o.status),
                Kind::HttpRoute => world.http_routes.get(&key).map(|o| &o.status),
            }?;
            d.status = to_write(&d.status, current, &now)?;
            Some(d)
        })
        .collect()
}

/// Writes the proxy's addresses into the status of the Ingresses handed
/// over, apart from the table's rebuilds (a slow API does not hold routes
/// back).
pub(crate) async fn write_status(mut stale: watch::Receiver<StaleIngresses>, client: Client) {
    while stale.changed().await.is_ok() {
        let (addresses, keys) = stale.borrow_and_update().clone();
        let ingress: Vec<serde_json::Value> = addresses
            .iter()
            .map(|ip| json!({"ip": ip.to_string()}))
            .collect();
        let patch = json!({"status": {"loadBalancer": {"ingress": ingress}}});
        for (namespace, name) in keys {
            let api: Api<Ingress> = Api::namespaced(client.clone(), &namespace);
            if let Err(error) = api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                tracing::warn!(%namespace, %name, %error, "cannot write an Ingress's status");
            }
        }
    }
}

/// Whether an Ingress's status lists exactly these addresses.
fn shows(ingress: &Ingress, addresses: &[IpAddr]) -> bool {
    let listed: Vec<String> = ingress
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|items| items.iter().filter_map(|i| i.ip.clone()).collect())
        .unwrap_or_default();
    let wanted: Vec<String> = addresses.iter().map(ToString::to_string).collect();
    listed == wanted
}
