//! The endpoints controller (SPEC E1, E2): for every Service with a
//! selector, an Endpoints object of the same name and EndpointSlices
//! labelled `kubernetes.io/service-name` listing the selected pods, ready
//! ones as ready. Built on kube-runtime: a Service controller, triggered also
//! by pod changes through a shared pod reflector.

pub mod desired;
mod index;
pub mod topology;
mod written;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use portal_api::cidr::IpFamily;
use portal_client::Settled;

use desired::{
    MANAGED_BY, MANAGED_BY_LABEL, SERVICE_NAME_LABEL, SKIP_MIRROR_LABEL, TRIGGER_TIME_ANNOTATION,
};
use written::{Expected, Written};

pub use crate::ReconcileError as Error;

/// `(namespace, name)` of a Service.
type ServiceKey = (String, String);

/// The events' source, as kube-controller-manager's.
const COMPONENT: &str = "endpoint-slice-controller";

/// The Nodes as the endpoints need them.
struct Nodes {
    facts: HashMap<String, topology::NodeFacts>,
    shares: topology::ZoneShares,
}

impl Default for Nodes {
    fn default() -> Self {
        Nodes {
            facts: HashMap::new(),
            shares: Err(topology::Disabled::InsufficientNodeInfo),
        }
    }
}

/// What a Node change means for the Services.
#[derive(Debug, PartialEq, Eq)]
enum NodeChange {
    None,
    /// The zones' shares changed: Services in `Auto` mode.
    Shares,
    /// A node's zone changed: every Service (endpoints' `zone`).
    Zone,
}

impl Nodes {
    /// Takes the Nodes as they are now (all of them: a Node deleted, also
    /// while the watch was down, is gone from them).
    fn replace(&mut self, facts: HashMap<String, topology::NodeFacts>) -> NodeChange {
        if facts == self.facts {
            return NodeChange::None;
        }
        let zone = |facts: &HashMap<String, topology::NodeFacts>, name: &str| {
            facts.get(name).and_then(|f| f.zone.clone())
        };
        let zone_changed = facts
            .keys()
            .chain(self.facts.keys())
            .any(|name| zone(&facts, name) != zone(&self.facts, name));
        self.facts = facts;
        let shares = topology::zone_shares(self.facts.values());
        let shares_changed = shares != self.shares;
        self.shares = shares;
        match (zone_changed, shares_changed) {
            (true, _) => NodeChange::Zone,
            (false, true) => NodeChange::Shares,
            (false, false) => NodeChange::None,
        }
    }

    fn zone(&self, node: &str) -> Option<String> {
        self.facts.get(node).and_then(|f| f.zone.clone())
    }
}

/// Everything a reconcile reads: reflectors only, never the API server.
struct Context {
    client: Client,
    /// Delays between retries of a failing object.
    retries: crate::Retries,
    pods: Store<Pod>,
    endpoints: Store<Endpoints>,
    slices: Store<EndpointSlice>,
    /// The names of the managed slices of each Service.
    slice_names: Mutex<HashMap<ServiceKey, BTreeSet<String>>>,
    index: Mutex<index::Index>,
    /// What each node says of its zone (`topology.kubernetes.io/zone`,
    /// endpoints' `zone`), readiness and CPU, and the zones' shares of CPU
    /// from them (`topology-mode: Auto`).
    nodes: Mutex<Nodes>,
    /// How `Auto` hinting last went per Service and address type (an event
    /// when it changes).
    auto: Mutex<HashMap<(ServiceKey, IpFamily), Result<(), topology::Disabled>>>,
    events: crate::events::Recorder,
    written: Mutex<Written>,
    /// The pod index holds the first list (set at the first re-list).
    pods_indexed: crate::Listed,
    endpoints_listed: Arc<crate::Listed>,
    slices_listed: Arc<crate::Listed>,
    /// The Nodes are known (zones, `Auto` shares).
    nodes_listed: Arc<crate::Listed>,
}

impl Context {
    /// The managed slices of a Service, by name, as the reflector has them.
    fn slices_of(&self, namespace: &str, service: &str) -> Vec<Arc<EndpointSlice>> {
        let key = (namespace.to_owned(), service.to_owned());
        let names = self
            .slice_names
            .lock()
            .get(&key)
            .cloned()
            .unwrap_or_default();
        names
            .iter()
            .filter_map(|name| self.slices.get(&ObjectRef::new(name).within(namespace)))
            .filter(|slice| service_of_slice(slice).as_deref() == Some(service))
            .collect()
    }

    /// The reflector's resourceVersion of an object the controller wrote.
    fn seen(&self, namespace: &str, object: &str) -> Option<String> {
        let version = |meta: &ObjectMeta| meta.resource_version.clone();
        match object.split_once('/') {
            Some(("endpoints", name)) => self
                .endpoints
                .get(&ObjectRef::new(name).within(namespace))
                .and_then(|e| version(&e.metadata)),
            Some(("slice", name)) => self
                .slices
                .get(&ObjectRef::new(name).within(namespace))
                .and_then(|s| version(&s.metadata)),
            _ => None,
        }
    }

    fn record(&self, service: &ServiceKey, object: String, meta: Option<&ObjectMeta>) {
        let expected = match meta.and_then(|m| m.resource_version.clone()) {
            Some(version) => Expected::Version(version),
            None => Expected::Deleted,
        };
        self.written.lock().record(service, &object, expected);
    }
}

fn selector_of(service: &Service) -> Option<&BTreeMap<String, String>> {
    service.spec.as_ref().and_then(|s| s.selector.as_ref())
}

fn service_of_slice(slice: &EndpointSlice) -> Option<String> {
    slice.labels().get(SERVICE_NAME_LABEL).cloned()
}

/// Runs the controller until the process ends, reading pods from the
/// process's shared pod reflector.
pub async fn run(
    client: Client,
    pods: Store<Pod>,
    pod_changes: impl Stream<Item = Settled<Pod>> + Send + 'static,
) {
    let (services, service_writer) = reflector::store::<Service>();
    let (endpoints, endpoints_writer) = reflector::store::<Endpoints>();
    let (slices, slice_writer) = reflector::store::<EndpointSlice>();
    let (deleted_tx, deleted_rx) = tokio::sync::mpsc::unbounded_channel::<Service>();
    let context = Arc::new(Context {
        retries: crate::Retries::new(Duration::from_millis(500)),
        client: client.clone(),
        pods,
        endpoints,
        slices,
        slice_names: Mutex::default(),
        index: Mutex::default(),
        nodes: Mutex::new(Nodes::default()),
        auto: Mutex::default(),
        events: crate::events::Recorder::new(client.clone(), COMPONENT),
        written: Mutex::default(),
        pods_indexed: crate::Listed::default(),
        endpoints_listed: Arc::default(),
        slices_listed: Arc::default(),
        nodes_listed: Arc::default(),
    });

    let ctx = context.clone();
    let service_events = watcher(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(service_writer)
    .inspect_ok(move |event| match event {
        watcher::Event::Apply(svc) | watcher::Event::InitApply(svc) => {
            let namespace = svc.namespace().unwrap_or_default();
            ctx.index
                .lock()
                .set_service(&namespace, &svc.name_any(), selector_of(svc));
        }
        watcher::Event::Delete(svc) => {
            let key = (svc.namespace().unwrap_or_default(), svc.name_any());
            ctx.index.lock().set_service(&key.0, &key.1, None);
            ctx.written.lock().forget(&key);
            ctx.auto.lock().retain(|(service, _), _| *service != key);
            let _ = deleted_tx.send(svc.clone());
        }
        watcher::Event::Init | watcher::Event::InitDone => {}
    })
    .applied_objects();

    // The managed slices trigger their Service: a write's event releases a
    // Service waiting on it, and a slice changed or deleted by someone else
    // is put back.
    let endpoints_events = portal_client::settled_objects(
        watcher(
            Api::<Endpoints>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect(endpoints_writer)
        .inspect_ok({
            let listed = context.endpoints_listed.clone();
            move |event| listed.on_init_done(event)
        }),
    );
    let ctx = context.clone();
    let slice_events = portal_client::settled_objects(
        watcher(
            Api::<EndpointSlice>::all(client.clone()),
            watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}")),
        )
        .default_backoff()
        .reflect(slice_writer)
        .inspect_ok(move |event| {
            ctx.slices_listed.on_init_done(event);
            // Names only ever point into the reflector, so a name left behind
            // by a re-list is harmless: `slices_of` skips it.
            let (watcher::Event::Apply(slice)
            | watcher::Event::InitApply(slice)
            | watcher::Event::Delete(slice)) = event
            else {
                return;
            };
            let Some(service) = service_of_slice(slice) else {
                return;
            };
            let key = (slice.namespace().unwrap_or_default(), service);
            let mut names = ctx.slice_names.lock();
            let set = names.entry(key.clone()).or_default();
            if matches!(event, watcher::Event::Delete(_)) {
                set.remove(&slice.name_any());
                if set.is_empty() {
                    names.remove(&key);
                }
            } else {
                set.insert(slice.name_any());
            }
        }),
    );

    // A pod change concerns the Services that select it now and those that
    // selected it before (a relabelled pod must leave the old ones); the
    // end of a re-list concerns every Service.
    let ctx = context.clone();
    let pod_triggers =
        pod_changes.flat_map(move |change| futures_util::stream::iter(pod_triggers(&ctx, change)));

    // Like Kubernetes, Endpoints written by someone else are left alone
    // until they are deleted (then recreated); events of the controller's
    // own writes release the Service waiting on them.
    let ctx = context.clone();
    let endpoints_mapper = move |endpoints: Endpoints| {
        let key = (
            endpoints.namespace().unwrap_or_default(),
            endpoints.name_any(),
        );
        let gone = ctx
            .endpoints
            .get(&ObjectRef::from_obj(&endpoints))
            .is_none();
        (gone || ctx.written.lock().pending(&key)).then(|| ObjectRef::new(&key.1).within(&key.0))
    };

    // A node changing zone changes its endpoints' zone (and hints): every
    // Service is looked at again (zones change rarely). A change of the
    // zones' CPU shares (a node ready or not, its CPU) concerns the
    // Services in `topology-mode: Auto`.
    let ctx = context.clone();
    let all_services = services.clone();
    let nodes_listed = context.nodes_listed.clone();
    let (node_store, node_writer) = reflector::store::<Node>();
    let zone_triggers = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(node_writer)
        .inspect_ok(move |event| nodes_listed.on_init_done(event))
        // The store holds the change (or a whole re-list) by these events.
        .filter_map(|event| async move {
            match event {
                Ok(
                    watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone,
                ) => Some(()),
                _ => None,
            }
        })
        .flat_map(move |()| {
            let facts = node_store
                .state()
                .iter()
                .map(|node| (node.name_any(), topology::NodeFacts::of(node)))
                .collect();
            let change = ctx.nodes.lock().replace(facts);
            // (Heartbeats change nothing: no look at the Services.)
            let refs: Vec<ObjectRef<Service>> = match change {
                NodeChange::None => Vec::new(),
                _ => all_services
                    .state()
                    .iter()
                    .filter(|s| change == NodeChange::Zone || topology::auto(s))
                    .map(|s| ObjectRef::from_obj(&**s))
                    .collect(),
            };
            futures_util::stream::iter(refs)
        });

    tokio::spawn(clean_up_deleted(context.clone(), deleted_rx));
    crate::drive(
        Controller::for_stream(service_events, services)
            .with_config(crate::config())
            .reconcile_on(pod_triggers)
            .reconcile_on(zone_triggers)
            .watches_stream(endpoints_events, endpoints_mapper)
            .watches_stream(slice_events, |s: EndpointSlice| {
                let namespace = s.namespace().unwrap_or_default();
                service_of_slice(&s).map(|name| ObjectRef::new(&name).within(&namespace))
            })
            .run(reconcile, error_policy, context.clone()),
        "endpoints reconcile",
        &context.retries,
    )
    .await;
}

/// The Services a pod change concerns (see `run`).
fn pod_triggers(ctx: &Context, change: Settled<Pod>) -> Vec<ObjectRef<Service>> {
    let refs = |namespace: &str, names: HashSet<String>| {
        names
            .into_iter()
            .map(|s| ObjectRef::new(&s).within(namespace))
            .collect::<Vec<_>>()
    };
    match change {
        Settled::Changed(pod) => {
            let namespace = pod.namespace().unwrap_or_default();
            // The reflector already shows this change: a pod it no longer
            // holds was deleted.
            let gone = ctx.pods.get(&ObjectRef::from_obj(&*pod)).is_none();
            let labels = pod.metadata.labels.clone().unwrap_or_default();
            let mut index = ctx.index.lock();
            let before = index.set_pod(&namespace, &pod.name_any(), (!gone).then_some(&labels));
            let mut services = index.services_selecting(&namespace, &labels);
            if let Some(before) = before {
                services.extend(index.services_selecting(&namespace, &before));
            }
            refs(&namespace, services)
        }
        Settled::Relisted(_) => {
            let pods = ctx.pods.state();
            let mut index = ctx.index.lock();
            index.reset_pods(pods.iter().map(|p| {
                (
                    p.namespace().unwrap_or_default(),
                    p.name_any(),
                    p.metadata.labels.clone().unwrap_or_default(),
                )
            }));
            ctx.pods_indexed.set();
            index
                .services()
                .into_iter()
                .map(|(namespace, name)| ObjectRef::new(&name).within(&namespace))
                .collect()
        }
    }
}

fn error_policy(service: Arc<Service>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, service = %service.name_any(), "endpoints update failed; retrying");
    Action::requeue(ctx.retries.after_failure(service.as_ref()))
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
    let has_selector = selector_of(&service).is_some_and(|s| !s.is_empty());
    if !has_selector {
        // Selector-less Services: the user writes the Endpoints (S7).
        return Ok(Action::await_change());
    }
    // Acting before the reflectors (and the pod index) hold the cluster
    // would rewrite every Service's endpoints as empty. The first pod
    // re-list triggers every Service again; the requeue is a backstop.
    let listed = [&ctx.endpoints_listed, &ctx.slices_listed, &ctx.nodes_listed];
    if !(ctx.pods_indexed.is_set() && listed.iter().all(|l| l.is_set())) {
        return Ok(Action::requeue(crate::NOT_LISTED_YET));
    }
    let namespace = service.namespace().unwrap_or_default();
    let key = (namespace.clone(), service.name_any());
    if !ctx
        .written
        .lock()
        .caught_up(&key, |object| ctx.seen(&namespace, object))
    {
        // The watch event of our own write re-triggers this Service; the
        // requeue is only a backstop.
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
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
    let mut endpoints = desired::endpoints_of(&service, pods.iter().map(|p| &**p));
    let shares = {
        let nodes = ctx.nodes.lock();
        for endpoint in &mut endpoints {
            endpoint.zone = endpoint
                .node_name
                .as_ref()
                .and_then(|node| nodes.zone(node));
        }
        nodes.shares.clone()
    };
    let trigger = trigger_time(&service, &pods);
    write_endpoints(&ctx, &service, &key, &endpoints, &trigger).await?;
    let desired::Wanted { slices, auto } = desired::slice_contents(&service, &endpoints, &shares);
    write_slices(&ctx, &service, &key, slices, &trigger).await?;
    tell_auto_outcome(&ctx, &service, &key, auto).await;
    Ok(Action::await_change())
}

async fn write_endpoints(
    ctx: &Context,
    service: &Service,
    key: &ServiceKey,
    endpoints: &[desired::PodEndpoint],
    trigger: &str,
) -> Result<(), Error> {
    let (namespace, name) = key;
    let api: Api<Endpoints> = Api::namespaced(ctx.client.clone(), namespace);
    let subsets = desired::subsets(service, endpoints);
    let subsets = Some(subsets).filter(|s| !s.is_empty());
    let existing = ctx.endpoints.get(&ObjectRef::new(name).within(namespace));
    let mut labels = service.metadata.labels.clone().unwrap_or_default();
    labels.insert(SKIP_MIRROR_LABEL.into(), "true".into());
    let labels = Some(labels);
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
    let written = match existing {
        Some(_) => api.replace(name, &PostParams::default(), &object).await?,
        None => api.create(&PostParams::default(), &object).await?,
    };
    ctx.record(key, format!("endpoints/{name}"), Some(&written.metadata));
    Ok(())
}

/// Events when `Auto` hinting of a Service's address type turns on, off,
/// or fails for another reason (upstream's words and reasons).
async fn tell_auto_outcome(
    ctx: &Context,
    service: &Service,
    key: &ServiceKey,
    outcomes: Vec<(IpFamily, Result<(), topology::Disabled>)>,
) {
    let mut told = Vec::new();
    {
        let mut last = ctx.auto.lock();
        for family in [IpFamily::Ipv4, IpFamily::Ipv6] {
            let now = outcomes
                .iter()
                .find(|(f, _)| *f == family)
                .map(|(_, o)| o.clone());
            let slot = (key.clone(), family);
            let before = match &now {
                Some(outcome) => last.insert(slot, outcome.clone()),
                None => last.remove(&slot),
            };
            if before == now {
                continue;
            }
            let address_type = family.name();
            let (kind, reason, what) = match (now, before) {
                (Some(Ok(())), _) => (
                    "Normal",
                    "TopologyAwareHintsEnabled",
                    "Topology Aware Hints has been enabled".to_owned(),
                ),
                (Some(Err(why)), _) => ("Warning", "TopologyAwareHintsDisabled", why.message()),
                // (A warning, as upstream's.)
                (None, Some(Ok(()))) => (
                    "Warning",
                    "TopologyAwareHintsDisabled",
                    "Topology Aware Hints has been disabled".to_owned(),
                ),
                (None, _) => continue,
            };
            told.push((kind, reason, format!("{what}, addressType: {address_type}")));
        }
    }
    let reference = kube::Resource::object_ref(service, &());
    for (kind, reason, message) in told {
        ctx.events.record(&reference, kind, reason, &message).await;
    }
}

async fn write_slices(
    ctx: &Context,
    service: &Service,
    key: &ServiceKey,
    wanted: Vec<desired::SliceContent>,
    trigger: &str,
) -> Result<(), Error> {
    let (namespace, name) = key;
    let api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), namespace);
    let existing = ctx.slices_of(namespace, name);
    let mut labels = service.metadata.labels.clone().unwrap_or_default();
    labels.insert(SERVICE_NAME_LABEL.into(), name.to_owned());
    labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    // Slices are matched within their address type (which never changes):
    // the n-th wanted slice of a family replaces the n-th existing one.
    let mut kept: Vec<String> = Vec::new();
    let mut place: HashMap<IpFamily, usize> = HashMap::new();
    for (family, ports, entries) in wanted {
        let ports = Some(ports);
        let index = place.entry(family).or_default();
        let current = existing
            .iter()
            .filter(|s| s.address_type == family.name())
            .nth(*index);
        *index += 1;
        if let Some(current) = current {
            kept.push(current.name_any());
        }
        if current.is_some_and(|c| {
            c.ports == ports
                && c.endpoints == entries
                && c.metadata.labels.as_ref() == Some(&labels)
        }) {
            continue;
        }
        let slice = EndpointSlice {
            metadata: ObjectMeta {
                name: current.map(|c| c.name_any()),
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
            address_type: family.name().into(),
            endpoints: entries,
            ports,
        };
        let written = match current {
            Some(current) => {
                api.replace(&current.name_any(), &PostParams::default(), &slice)
                    .await?
            }
            None => api.create(&PostParams::default(), &slice).await?,
        };
        ctx.record(
            key,
            format!("slice/{}", written.name_any()),
            Some(&written.metadata),
        );
    }
    for extra in existing.iter().filter(|s| !kept.contains(&s.name_any())) {
        delete_ignoring_missing(&api, &extra.name_any()).await?;
        ctx.record(key, format!("slice/{}", extra.name_any()), None);
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
    ctx: Arc<Context>,
    mut deleted: tokio::sync::mpsc::UnboundedReceiver<Service>,
) {
    while let Some(service) = deleted.recv().await {
        let has_selector = selector_of(&service).is_some_and(|s| !s.is_empty());
        let namespace = service.namespace().unwrap_or_default();
        let name = service.name_any();
        let result = async {
            if has_selector {
                delete_ignoring_missing(
                    &Api::<Endpoints>::namespaced(ctx.client.clone(), &namespace),
                    &name,
                )
                .await?;
            }
            let api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &namespace);
            for slice in ctx.slices_of(&namespace, &name) {
                delete_ignoring_missing(&api, &slice.name_any()).await?;
            }
            ctx.slice_names
                .lock()
                .remove(&(namespace.clone(), name.clone()));
            Ok::<_, Error>(())
        }
        .await;
        if let Err(error) = result {
            tracing::warn!(%error, service = %name, "cleaning up after a deleted Service failed");
        }
    }
}
