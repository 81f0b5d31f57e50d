//! Follows what the routing table is made of — Ingresses, IngressClasses,
//! Services, EndpointSlices and TLS Secrets — into one in-memory world
//! (without `managedFields`), and rebuilds the table whenever any of it
//! changes: a burst of changes makes one rebuild. The new table is
//! swapped in whole (requests in flight keep the one they started with),
//! the certificates follow, and each Ingress served gets the proxy's
//! addresses in its status (written by a task of its own).

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::api::{Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use parking_lot::Mutex;
use portal_client::Change;
use serde_json::json;
use tokio::sync::{watch, Notify};

use crate::proxy::Proxy;
use crate::routes::{slices_by_service, Table};
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
}

/// What the feed shares with the tasks that fill it.
#[derive(Debug)]
pub(crate) struct Feed {
    world: Mutex<World>,
    changed: Notify,
    /// The kinds whose first list is in the world.
    listed: Mutex<HashSet<&'static str>>,
}

/// How many kinds are followed: the first table waits for all of them
/// (not a half-known world: 503s, 404s, the fallback certificate).
const KINDS: usize = 5;

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

/// Rebuilds the table (and certificates) after every change, once every
/// kind is listed, and hands the Ingresses whose status lacks the proxy's
/// addresses to [`write_status`].
pub(crate) async fn rebuild(
    feed: Arc<Feed>,
    proxy: Arc<Proxy>,
    certificates: Arc<Certificates>,
    advertised: Vec<IpAddr>,
    status: watch::Sender<Vec<Key>>,
) {
    loop {
        feed.changed.notified().await;
        if feed.listed.lock().len() < KINDS {
            continue;
        }
        // A burst (a re-list, a rollout) settles into one rebuild.
        tokio::task::yield_now().await;
        let (table, secrets, stale) = {
            let world = feed.world.lock();
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
            let table = Table::build(&ingresses, &classes, &world.services, &slices);
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
                        .is_some_and(|i| !shows(i, &advertised))
                })
                .cloned()
                .collect();
            (table, secrets, stale)
        };
        // Certificates are parsed off the world's lock (the watches go on).
        certificates.update(&table.tls, |namespace, name| {
            secrets
                .get(&(namespace.to_owned(), name.to_owned()))
                .cloned()
        });
        proxy.metrics.routes.set(table.len() as i64);
        proxy.metrics.updates.inc();
        *proxy.table.write() = Arc::new(table);
        if !advertised.is_empty() {
            status.send_replace(stale);
        }
    }
}

/// Writes the proxy's addresses into the status of the Ingresses handed
/// over, apart from the table's rebuilds (a slow API does not hold routes
/// back).
pub(crate) async fn write_status(
    mut stale: watch::Receiver<Vec<Key>>,
    client: Client,
    advertised: Vec<IpAddr>,
) {
    let ingress: Vec<serde_json::Value> = advertised
        .iter()
        .map(|ip| json!({"ip": ip.to_string()}))
        .collect();
    let patch = json!({"status": {"loadBalancer": {"ingress": ingress}}});
    while stale.changed().await.is_ok() {
        let keys = stale.borrow_and_update().clone();
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
