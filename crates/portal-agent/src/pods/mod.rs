//! The agent's pods: the desired set (fed by sources: today the API's pods
//! bound to this node), one worker per pod (`worker`), and the pod
//! lifecycle event generator — a relist of the runtime every second that
//! wakes the workers of pods whose containers changed (the kubelet's PLEG).

mod start;
mod worker;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Container, ObjectReference, Pod, Service};
use kube::runtime::reflector::Store;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::files::DnsSettings;
use crate::images::ImageService;
use crate::metrics::Metrics;
use crate::network::Network;
use crate::node::Identity;
use crate::runtime::{Runtime, State};
use crate::status::StatusManager;

/// How often the runtime is relisted for container changes.
const RELIST: Duration = Duration::from_secs(1);

/// Why one sync of a pod failed (it is retried at the next one).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SyncError {
    #[error(transparent)]
    Network(#[from] crate::network::Error),
    #[error(transparent)]
    Runtime(#[from] crate::runtime::Error),
    #[error("writing status: {0}")]
    Status(#[from] kube::Error),
    #[error("pod files: {0}")]
    Files(String),
}

/// The pods this node should run, by UID.
#[derive(Debug, Default)]
pub(crate) struct Desired {
    pods: Mutex<HashMap<String, Arc<Pod>>>,
}

impl Desired {
    pub(crate) fn get(&self, uid: &str) -> Option<Arc<Pod>> {
        self.pods.lock().get(uid).cloned()
    }

    /// The pod by namespace and name.
    pub(crate) fn find(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pods
            .lock()
            .values()
            .find(|p| {
                p.metadata.namespace.as_deref() == Some(namespace)
                    && p.metadata.name.as_deref() == Some(name)
            })
            .cloned()
    }

    /// Records the pod; returns its UID when more than its status changed
    /// (the agent's own status writes come back through the watch and
    /// must not wake its worker: the kubelet's sources filter them too).
    fn set(&self, pod: Pod) -> Option<String> {
        let uid = pod.metadata.uid.clone()?;
        let mut pods = self.pods.lock();
        let changed = pods.get(&uid).is_none_or(|old| {
            old.spec != pod.spec
                || old.metadata.labels != pod.metadata.labels
                || old.metadata.annotations != pod.metadata.annotations
                || old.metadata.deletion_timestamp != pod.metadata.deletion_timestamp
        });
        pods.insert(uid.clone(), Arc::new(pod));
        changed.then_some(uid)
    }

    fn remove(&self, uid: &str) {
        self.pods.lock().remove(uid);
    }

    fn uids(&self) -> Vec<String> {
        self.pods.lock().keys().cloned().collect()
    }
}

/// The paths of a pod's managed files (bound into its containers).
#[derive(Clone, Debug)]
pub(crate) struct PodFiles {
    pub hosts: Option<PathBuf>,
    pub resolv_conf: PathBuf,
    pub hostname: PathBuf,
}

/// What every worker shares.
pub(crate) struct Context<R: Runtime> {
    pub client: Client,
    pub me: Identity,
    pub runtime: R,
    pub images: ImageService,
    pub network: Network,
    pub dns: DnsSettings,
    pub status: StatusManager,
    pub events: portal_controllers::events::Recorder,
    pub services: Store<Service>,
    pub metrics: Metrics,
    pub probes: crate::prober::Probes,
    pub desired: Desired,
    /// Pods whose deletion this agent confirmed, until the API shows them
    /// gone (a finalizer may hold one).
    pub confirmed: Mutex<std::collections::HashSet<String>>,
    /// Running workers: pod UID → how to wake it.
    pub workers: Mutex<HashMap<String, Arc<Notify>>>,
    /// `DIR/pods/<uid>/`: the pod's managed files.
    pub pods_dir: PathBuf,
    /// `DIR/logs/<ns>_<name>_<uid>/<container>/<attempt>.log`.
    pub logs_dir: PathBuf,
}

impl<R: Runtime> std::fmt::Debug for Context<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("node", &self.me.name)
            .finish_non_exhaustive()
    }
}

/// The pod's containers, app then init (sidecars included).
pub(crate) fn containers_of(pod: &Pod) -> impl Iterator<Item = &Container> {
    pod.spec.iter().flat_map(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
    })
}

/// `namespace/name`, for logs and messages.
pub(crate) fn describe(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

impl<R: Runtime> Context<R> {
    /// Wakes the pod's worker, starting one if it has none.
    pub(crate) fn dispatch(self: &Arc<Self>, uid: &str) {
        let mut workers = self.workers.lock();
        if let Some(wake) = workers.get(uid) {
            wake.notify_one();
            return;
        }
        let wake = Arc::new(Notify::new());
        workers.insert(uid.to_owned(), wake.clone());
        let worker = worker::Worker::new(self.clone(), uid.to_owned());
        tokio::spawn(worker.run(wake));
    }

    /// Records an Event about the pod (and one of its containers).
    pub(crate) async fn event(
        &self,
        pod: &Pod,
        container: Option<&str>,
        kind: &str,
        reason: &str,
        message: &str,
    ) {
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            uid: pod.metadata.uid.clone(),
            field_path: container.map(|c| format!("spec.containers{{{c}}}")),
            ..ObjectReference::default()
        };
        self.events.record(&reference, kind, reason, message).await;
    }

    /// The Services whose variables a new container gets: its namespace's
    /// (when service links are on) and always the `kubernetes` Service.
    pub(crate) fn service_environment(
        &self,
        namespace: &str,
        links: bool,
    ) -> Vec<serde_json::Value> {
        let mut services: Vec<serde_json::Value> = self
            .services
            .state()
            .iter()
            .filter(|s| {
                let ns = s.namespace().unwrap_or_default();
                (links && ns == namespace) || (ns == "default" && s.name_any() == "kubernetes")
            })
            .filter_map(|s| serde_json::to_value(&**s).ok())
            .collect();
        // The kubelet's order: by name, so the variables do not move around.
        services.sort_by(|a, b| {
            a["metadata"]["name"]
                .as_str()
                .cmp(&b["metadata"]["name"].as_str())
        });
        services.dedup_by(|a, b| a["metadata"] == b["metadata"]);
        services
    }

    fn pod_dir(&self, uid: &str) -> PathBuf {
        self.pods_dir.join(uid)
    }

    /// Writes the pod's `/etc/hosts`, `/etc/resolv.conf` and hostname.
    pub(crate) async fn write_pod_files(
        &self,
        pod: &Pod,
        pod_ip: &str,
    ) -> Result<PodFiles, SyncError> {
        let dir = self.pod_dir(&pod.metadata.uid.clone().unwrap_or_default());
        let failed = |e: std::io::Error| SyncError::Files(format!("{}: {e}", dir.display()));
        std::fs::create_dir_all(&dir).map_err(failed)?;
        let resolv = crate::files::resolv_conf(pod, &self.dns)
            .map_err(|e| SyncError::Files(e.to_string()))?;
        let files = PodFiles {
            hosts: crate::files::hosts(pod, pod_ip, &self.dns.cluster_domain)
                .map(|_| dir.join("hosts")),
            resolv_conf: dir.join("resolv.conf"),
            hostname: dir.join("hostname"),
        };
        let hostname = format!("{}\n", crate::files::hostname(pod));
        let mut writes = vec![
            (files.resolv_conf.clone(), resolv),
            (files.hostname.clone(), hostname),
        ];
        if let (Some(path), Some(text)) = (
            &files.hosts,
            crate::files::hosts(pod, pod_ip, &self.dns.cluster_domain),
        ) {
            writes.push((path.clone(), text));
        }
        for (path, text) in writes {
            // Rewritten in place (not renamed): bind mounts keep the inode.
            if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
                std::fs::write(&path, text).map_err(failed)?;
            }
        }
        Ok(files)
    }

    pub(crate) fn remove_pod_files(&self, uid: &str, pod: Option<&Pod>) {
        let _ = std::fs::remove_dir_all(self.pod_dir(uid));
        if let Some(pod) = pod {
            let _ = std::fs::remove_dir_all(self.pod_log_dir(pod));
        }
    }

    fn pod_log_dir(&self, pod: &Pod) -> PathBuf {
        self.logs_dir.join(format!(
            "{}_{}_{}",
            pod.namespace().unwrap_or_default(),
            pod.name_any(),
            pod.metadata.uid.as_deref().unwrap_or_default()
        ))
    }

    pub(crate) fn log_path(&self, pod: &Pod, container: &str, attempt: u32) -> PathBuf {
        self.pod_log_dir(pod)
            .join(container)
            .join(format!("{attempt}.log"))
    }
}

/// Runs the pod sources, the workers and the relist until the process ends.
pub(crate) async fn run<R: Runtime>(ctx: Arc<Context<R>>) {
    let relist = tokio::spawn(relist(ctx.clone()));
    api_source(ctx).await;
    relist.abort();
}

/// Pods bound to this node, from the API. A re-list (the first one, or
/// after the watch fell behind) also ends the pods that vanished meanwhile,
/// and the containers of pods this agent no longer knows (deleted while it
/// was down).
async fn api_source<R: Runtime>(ctx: Arc<Context<R>>) {
    let api = Api::<Pod>::all(ctx.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", ctx.me.name));
    let mut relisted: Vec<String> = Vec::new();
    let mut events = watcher(api, config).default_backoff().boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(pod)) => {
                if let Some(uid) = ctx.desired.set(pod) {
                    ctx.dispatch(&uid);
                }
            }
            Ok(watcher::Event::Delete(pod)) => {
                if let Some(uid) = pod.metadata.uid.as_deref() {
                    ctx.confirmed.lock().remove(uid);
                    ctx.desired.remove(uid);
                    ctx.dispatch(uid);
                }
            }
            Ok(watcher::Event::Init) => relisted.clear(),
            Ok(watcher::Event::InitApply(pod)) => {
                if let Some(uid) = pod.metadata.uid.clone() {
                    ctx.desired.set(pod);
                    relisted.push(uid);
                }
            }
            Ok(watcher::Event::InitDone) => {
                for uid in ctx.desired.uids() {
                    if !relisted.contains(&uid) {
                        ctx.desired.remove(&uid);
                    }
                }
                // Every pod known now or leftover on disk gets a worker:
                // a leftover one finds itself undesired and cleans up.
                let mut uids: Vec<String> = ctx.desired.uids();
                uids.extend(ctx.runtime.containers().into_iter().map(|c| c.meta.pod_uid));
                uids.extend(ctx.network.sandboxes_on_disk());
                uids.sort();
                uids.dedup();
                for uid in uids {
                    ctx.dispatch(&uid);
                }
            }
            Err(error) => tracing::warn!(%error, "watching this node's pods"),
        }
    }
}

/// Every second: wakes the workers of pods whose containers changed state.
async fn relist<R: Runtime>(ctx: Arc<Context<R>>) {
    let mut last: HashMap<String, Vec<(String, u8, i32)>> = HashMap::new();
    let mut tick = tokio::time::interval(RELIST);
    loop {
        tick.tick().await;
        let mut now: HashMap<String, Vec<(String, u8, i32)>> = HashMap::new();
        let (mut running, mut containers) = (0usize, 0usize);
        for c in ctx.runtime.containers() {
            let (kind, code) = match &c.state {
                State::Created => (0, 0),
                State::Running(_) => {
                    running += 1;
                    (1, 0)
                }
                State::Exited { exit, .. } => (2, exit.exit_code),
            };
            containers += 1;
            now.entry(c.meta.pod_uid)
                .or_default()
                .push((c.id, kind, code));
        }
        ctx.metrics.set_containers(running, containers);
        ctx.metrics.set_pods(ctx.desired.uids().len());
        for (uid, fingerprint) in &mut now {
            fingerprint.sort();
            if last.get(uid) != Some(fingerprint) && ctx.workers.lock().contains_key(uid) {
                ctx.dispatch(uid);
            }
        }
        last = now;
    }
}

/// The directory of one agent's state under the data dir.
pub(crate) fn ensure_dir(path: &Path) -> Result<(), crate::Error> {
    std::fs::create_dir_all(path).map_err(|source| crate::Error::Io {
        path: path.display().to_string(),
        source,
    })
}
