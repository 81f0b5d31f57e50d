//! Portal's controllers: plain API clients, so they run inside `portal
//! server` or alone (`portal controllers --kubeconfig F`) against any API
//! server: the endpoints controller (Endpoints and EndpointSlices),
//! EndpointSlice mirroring, the ReplicationController and ReplicaSet
//! controller, the Deployment, DaemonSet, Job and CronJob controllers, the
//! disruption controller (PodDisruptionBudgets), node IPAM (pod ranges),
//! node lifecycle (unreachable nodes, taint-based eviction), the
//! scheduler, the load-balancer provider, the garbage collector and
//! namespace termination.

pub mod autoscaler;
pub mod cron_job;
pub mod daemon_set;
pub mod deployment;
pub mod disruption;
pub mod endpoints;
pub mod events;
pub mod garbage_collector;
pub mod history;
pub mod job;
pub mod load_balancer;
pub mod mirroring;
pub mod namespace;
pub mod node_ipam;
pub mod node_lifecycle;
pub mod placement;
pub mod pods;
pub mod rbac_aggregation;
pub mod replication;
pub mod requests;
pub mod scheduler;
pub mod service_accounts;
pub mod stateful_set;
pub mod volumes;

use kube::Client;

/// Why a reconcile failed (the controllers' error policies retry it).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The API server refused or failed a request.
    #[error("API request failed: {0}")]
    Api(#[from] kube::Error),
    /// A reflector's initial list has not finished.
    #[error("reflector not ready: {0}")]
    NotReady(#[from] kube::runtime::reflector::store::WriterDropped),
}

/// A conflict of this controller's own making (as a 409 from the API would
/// be): the reconcile is tried again shortly.
pub fn conflict(message: &str) -> ReconcileError {
    ReconcileError::Api(kube::Error::Api(
        kube::core::Status::failure(message, "Conflict")
            .with_code(409)
            .boxed(),
    ))
}

/// How many reconciles one controller runs at once. Each may hold an API
/// connection (HTTP/1.1: one request per connection), so an unbounded
/// controller facing 10,000 Services opens thousands of connections and
/// overflows the API server's accept queue; Kubernetes' controllers run 5
/// workers each.
const CONCURRENCY: u16 = 32;

/// The runtime configuration every controller uses.
/// Whether a reflector has listed once. Reconciles check this and requeue
/// instead of awaiting `Store::wait_until_ready`: that future keeps only the
/// last of several concurrent waiters' wakers (kube-runtime's `DelayedInit`
/// is one oneshot receiver), so a reconcile parked there alongside others
/// may never wake, and every later trigger of its object queues behind it.
#[derive(Debug, Default)]
pub(crate) struct Listed(std::sync::atomic::AtomicBool);

impl Listed {
    pub(crate) fn set(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }

    pub(crate) fn is_set(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Marks the list done when a reflected watch stream says so (after
    /// `reflect`, the store holds the list by then).
    pub(crate) fn on_init_done<K>(&self, event: &kube::runtime::watcher::Event<K>) {
        if matches!(event, kube::runtime::watcher::Event::InitDone) {
            self.set();
        }
    }
}

/// Passes a shared reflector's changes on, marking `listed` once it has
/// re-listed (the store then holds everything).
pub(crate) fn note_listed<K: Send + Sync + 'static>(
    changes: impl futures_util::Stream<Item = portal_client::Settled<K>> + Send + 'static,
    listed: std::sync::Arc<Listed>,
) -> impl futures_util::Stream<Item = portal_client::Settled<K>> + Send + 'static {
    futures_util::StreamExt::inspect(changes, move |change| {
        if matches!(change, portal_client::Settled::Relisted(_)) {
            listed.set();
        }
    })
}

/// The owner that controls an object (`controller: true`), if any.
pub(crate) fn controller_of(
    owners: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    owners.iter().find(|o| o.controller == Some(true))
}

/// Whether a selector selects the labels (none selects nothing).
pub(crate) fn selects(
    selector: Option<&portal_api::selector::LabelSelector>,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    selector.is_some_and(|s| s.matches(|key| labels.get(key).map(String::as_str)))
}

/// A typed `metav1.LabelSelector` as a parsed one; `None` when it does
/// not parse.
pub(crate) fn label_selector(
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) -> Option<portal_api::selector::LabelSelector> {
    let value = serde_json::to_value(selector).ok()?;
    portal_api::selector::LabelSelector::from_api(&value, "spec.selector").ok()
}

/// The object's controller, as a reference to reconcile, when it is a
/// `kind` (in the object's namespace).
pub(crate) fn controller_ref<K>(
    object: &impl kube::Resource,
    kind: &str,
) -> Option<kube::runtime::reflector::ObjectRef<K>>
where
    K: kube::Resource<DynamicType = ()>,
{
    let namespace = object.meta().namespace.clone().unwrap_or_default();
    controller_of(
        object
            .meta()
            .owner_references
            .as_deref()
            .unwrap_or_default(),
    )
    .filter(|o| o.kind == kind)
    .map(|o| kube::runtime::reflector::ObjectRef::new(&o.name).within(&namespace))
}

/// How long a reconcile waits before looking again at reflectors that have
/// not listed yet.
pub(crate) const NOT_LISTED_YET: std::time::Duration = std::time::Duration::from_millis(200);

pub(crate) fn config() -> kube::runtime::controller::Config {
    kube::runtime::controller::Config::default().concurrency(CONCURRENCY)
}

/// Drives a controller's result stream to its end. Failed reconciles were
/// already logged and requeued by the controller's error policy; a success
/// resets the object's retry delay.
pub(crate) async fn drive<K, E: std::fmt::Display>(
    results: impl futures_util::Stream<
        Item = Result<
            (
                kube::runtime::reflector::ObjectRef<K>,
                kube::runtime::controller::Action,
            ),
            E,
        >,
    >,
    name: &'static str,
    retries: &Retries,
) where
    K: kube::Resource,
{
    use futures_util::StreamExt;
    results
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => {
                    retries.succeeded(object.namespace.as_deref(), &object.name);
                }
                Err(error) => tracing::debug!(%error, controller = name, "reconcile"),
            }
        })
        .await;
}

/// Per-object retry delays for the error policies: the first retry after
/// `base`, each further one twice as late, at most `MAX_RETRY_DELAY`, back
/// to `base` after a success (as the work queues of Kubernetes'
/// controllers).
#[derive(Debug)]
pub(crate) struct Retries {
    base: std::time::Duration,
    failures: parking_lot::Mutex<std::collections::HashMap<(Option<String>, String), u32>>,
}

/// The longest a failing object waits for its next try.
const MAX_RETRY_DELAY: std::time::Duration = std::time::Duration::from_secs(300);

impl Retries {
    pub(crate) fn new(base: std::time::Duration) -> Self {
        Retries {
            base,
            failures: parking_lot::Mutex::default(),
        }
    }

    /// The delay before retrying an object that just failed.
    pub(crate) fn after_failure(&self, object: &impl kube::ResourceExt) -> std::time::Duration {
        let key = (object.namespace(), object.name_any());
        let mut failures = self.failures.lock();
        let count = failures.entry(key).or_insert(0);
        let delay = self.base.saturating_mul(1u32 << (*count).min(20));
        *count = count.saturating_add(1);
        delay.min(MAX_RETRY_DELAY)
    }

    fn succeeded(&self, namespace: Option<&str>, name: &str) {
        let mut failures = self.failures.lock();
        if !failures.is_empty() {
            failures.remove(&(namespace.map(str::to_owned), name.to_owned()));
        }
    }
}

/// What the controllers are told.
#[derive(Clone, Debug)]
pub struct Config {
    /// The cluster CA, published in every namespace for pods.
    pub root_ca_pem: String,
    pub ipam: node_ipam::Config,
    pub lifecycle: node_lifecycle::Config,
    pub load_balancer: load_balancer::Config,
}

/// Runs every controller until the process ends. The endpoints,
/// ReplicationController and scheduling controllers share one pod watch and
/// one pod cache.
pub async fn run(client: Client, config: Config) {
    let mut pods = pods::reflector(client.clone());
    let node_lifecycle = node_lifecycle::run(client.clone(), config.lifecycle, pods.store());
    let endpoints = endpoints::run(client.clone(), pods.store(), pods.subscribe());
    let replication = replication::run::<k8s_openapi::api::core::v1::ReplicationController>(
        client.clone(),
        pods.store(),
        pods.subscribe(),
    );
    // ReplicaSets are read by their own controller and by Deployments'.
    let mut sets =
        replication::owner_reflector::<k8s_openapi::api::apps::v1::ReplicaSet>(client.clone());
    let replica_sets = replication::run_shared(
        client.clone(),
        pods.store(),
        pods.subscribe(),
        sets.store(),
        sets.subscribe(),
    );
    let deployments = deployment::run(
        client.clone(),
        pods.store(),
        pods.subscribe(),
        sets.store(),
        sets.subscribe(),
    );
    let daemon_sets = daemon_set::run(client.clone(), pods.store(), pods.subscribe());
    let stateful_sets = stateful_set::run(client.clone(), pods.store(), pods.subscribe());
    let jobs = job::run(client.clone(), pods.store(), pods.subscribe());
    let budgets = disruption::run(client.clone(), pods.store(), pods.subscribe());
    let scheduler = scheduler::run(client.clone(), pods.store(), pods.subscribe());
    let volumes = volumes::run(client.clone(), pods.store(), pods.subscribe());
    let autoscalers = autoscaler::run(client.clone(), pods.store());
    tokio::join!(
        pods.run(),
        endpoints,
        mirroring::run(client.clone()),
        replication,
        sets.run(),
        replica_sets,
        deployments,
        daemon_sets,
        stateful_sets,
        jobs,
        cron_job::run(client.clone()),
        budgets,
        node_ipam::run(client.clone(), config.ipam),
        node_lifecycle,
        scheduler,
        volumes,
        autoscalers,
        load_balancer::run(client.clone(), config.load_balancer),
        garbage_collector::run(client.clone()),
        service_accounts::run(client.clone(), config.root_ca_pem),
        rbac_aggregation::run(client.clone()),
        namespace::run(client)
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;
    use std::time::Duration;

    #[test]
    fn retries_back_off_exponentially_and_reset() {
        let retries = Retries::new(Duration::from_millis(500));
        let mut service = Service::default();
        service.metadata.name = Some("web".into());
        service.metadata.namespace = Some("default".into());
        let delays: Vec<Duration> = (0..4).map(|_| retries.after_failure(&service)).collect();
        assert_eq!(
            delays.iter().map(Duration::as_millis).collect::<Vec<_>>(),
            [500, 1000, 2000, 4000]
        );
        for _ in 0..30 {
            retries.after_failure(&service);
        }
        assert_eq!(retries.after_failure(&service), MAX_RETRY_DELAY);
        retries.succeeded(Some("default"), "web");
        assert_eq!(retries.after_failure(&service), Duration::from_millis(500));
    }
}
