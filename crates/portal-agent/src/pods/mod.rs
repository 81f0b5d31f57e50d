//! The agent's pods: the desired set (fed by the sources: the API's pods
//! bound to this node and the static pods), one worker per pod (`worker`),
//! and the pod lifecycle event generator — a relist of the runtime every
//! second that wakes the workers of pods whose containers changed (the
//! kubelet's PLEG).

mod start;
mod worker;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, Service};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;

use crate::events::Events;
use crate::files::DnsSettings;
use crate::images::ImageStore;
use crate::metrics::Metrics;
use crate::mirror::Mirrors;
use crate::network::PodNetwork;
use crate::node::Identity;
use crate::prober::Prober;
use crate::runtime::{Runtime, State};
use crate::sources::{is_mirror, Desired, Source};
use crate::status::StatusManager;
use crate::wake::{PodWaker, Wakes};

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
    #[error(transparent)]
    Objects(#[from] crate::objects::ReadError),
}

/// Where a pod's containers start: its sandbox, address, managed files,
/// volumes and the objects its environment reads, as of this sync.
pub(crate) struct Place<'a> {
    pub sandbox: &'a crate::runtime::SandboxPaths,
    pub files: &'a PodFiles,
    pub pod_ip: &'a str,
    /// Every address of the pod, `pod_ip` first (two when dual-stack).
    pub pod_ips: &'a [String],
    pub objects: &'a crate::objects::Objects,
    pub volumes: &'a crate::volumes::PodVolumes,
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
    /// The API server; `None` in standalone mode (static pods only).
    pub client: Option<Client>,
    pub me: Identity,
    pub runtime: Arc<R>,
    pub images: Arc<dyn ImageStore>,
    pub network: Arc<dyn PodNetwork>,
    /// The cluster DNS address is learnt from the API once it is reachable.
    pub dns: RwLock<DnsSettings>,
    /// Whether the cluster DNS address is known (until it is, a pod's
    /// existing `resolv.conf` is left as it is, not rewritten without it).
    pub dns_known: std::sync::atomic::AtomicBool,
    pub status: Arc<StatusManager>,
    pub events: Arc<Events>,
    pub mirrors: Arc<Mirrors>,
    pub services: Store<Service>,
    pub metrics: Metrics,
    pub prober: Prober<R>,
    pub desired: Arc<Desired>,
    /// How anything below the pod manager asks for a pod to be looked at.
    pub waker: PodWaker,
    /// Pods whose deletion this agent confirmed, until the API shows them
    /// gone (a finalizer may hold one).
    pub confirmed: Mutex<std::collections::HashSet<String>>,
    /// Static pods still stopping after their source dropped them, by
    /// namespace/name → UID: a new static pod of that name waits for them.
    pub terminating: Mutex<HashMap<(String, String), String>>,
    /// Running workers: pod UID → how to wake it.
    pub workers: Mutex<HashMap<String, Arc<Notify>>>,
    /// `DIR/pods/<uid>/`: the pod's managed files.
    pub pods_dir: PathBuf,
    /// `DIR/logs/<ns>_<name>_<uid>/<container>/<attempt>.log`.
    pub logs_dir: PathBuf,
    /// The running pods' host ports, programmed in the node's nftables.
    pub host_ports: crate::host_ports::HostPorts,
    /// Service-account tokens kept for the pods' projected volumes.
    pub tokens: crate::tokens::Tokens,
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

    /// Records an Event about this node (its Node object).
    pub(crate) async fn node_event(&self, kind: &str, reason: &str, message: &str) {
        self.events.node_event(kind, reason, message).await;
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
        self.events
            .pod_event(pod, container, kind, reason, message)
            .await;
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

    pub(crate) fn pod_dir(&self, uid: &str) -> PathBuf {
        self.pods_dir.join(uid)
    }

    /// Writes the pod's `/etc/hosts`, `/etc/resolv.conf` and hostname.
    pub(crate) async fn write_pod_files(
        &self,
        pod: &Pod,
        pod_ips: &[String],
    ) -> Result<PodFiles, SyncError> {
        let dir = self.pod_dir(&pod.metadata.uid.clone().unwrap_or_default());
        let failed = |e: std::io::Error| SyncError::Files(format!("{}: {e}", dir.display()));
        std::fs::create_dir_all(&dir).map_err(failed)?;
        let dns = self.dns.read().clone();
        let resolv =
            crate::files::resolv_conf(pod, &dns).map_err(|e| SyncError::Files(e.to_string()))?;
        let files = PodFiles {
            hosts: crate::files::hosts(pod, pod_ips, &dns.cluster_domain)
                .map(|_| dir.join("hosts")),
            resolv_conf: dir.join("resolv.conf"),
            hostname: dir.join("hostname"),
        };
        let hostname = format!("{}\n", crate::files::hostname(pod));
        let mut writes = vec![(files.hostname.clone(), hostname)];
        let dns_known = self.dns_known.load(std::sync::atomic::Ordering::Acquire);
        if dns_known || !files.resolv_conf.exists() {
            writes.push((files.resolv_conf.clone(), resolv));
        }
        if let (Some(path), Some(text)) = (
            &files.hosts,
            crate::files::hosts(pod, pod_ips, &dns.cluster_domain),
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
        self.tokens.retain(|kept| kept != uid);
        crate::volumes::tear_down(&self.pod_dir(uid));
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

/// Gives every desired pod a worker, and, once every source has sent its
/// first set, every pod left on the node (containers, sandboxes) too: a
/// leftover one finds itself undesired and cleans up.
pub(crate) fn sweep<R: Runtime>(ctx: &Arc<Context<R>>) {
    let mut uids: Vec<String> = ctx.desired.uids();
    if ctx.desired.all_ready() {
        uids.extend(ctx.runtime.containers().into_iter().map(|c| c.meta.pod_uid));
        uids.extend(ctx.network.sandboxes_on_disk());
    }
    uids.sort();
    uids.dedup();
    for uid in uids {
        ctx.dispatch(&uid);
    }
}

/// Applies what the static sources read: their sets replace the ones
/// before, the workers of pods that came or went are woken, and each new
/// problem is logged and recorded as an Event on the Node.
pub(crate) async fn merge_static<R: Runtime>(
    ctx: Arc<Context<R>>,
    mut updates: tokio::sync::mpsc::Receiver<crate::sources::Update>,
) {
    // What was last reported, by source and origin: a problem is reported
    // once, and again only when it changes or after it was mended.
    let mut reported: HashMap<(Source, String), String> = HashMap::new();
    while let Some(mut update) = updates.recv().await {
        let first = !ctx.desired.all_ready();
        let replaced = match update.pods.take() {
            Some(pods) => ctx.desired.replace(update.source, pods),
            None => crate::sources::Replaced::default(),
        };
        for pod in &replaced.refused {
            update.problems.push(crate::sources::Problem {
                origin: update.source.name().to_owned(),
                message: format!(
                    "a static pod named {:?} in namespace {:?} comes from another source already; this one is ignored",
                    pod.metadata.name.as_deref().unwrap_or_default(),
                    pod.metadata.namespace.as_deref().unwrap_or_default()
                ),
            });
        }
        let mut now = HashMap::new();
        for problem in &update.problems {
            let key = (update.source, problem.origin.clone());
            if reported.get(&key) != Some(&problem.message) {
                tracing::warn!(
                    source = update.source.name(),
                    "static pod manifest: {problem}"
                );
                // Recorded aside: a slow API server never holds the sources up.
                let ctx = ctx.clone();
                let message = problem.to_string();
                tokio::spawn(async move {
                    ctx.node_event("Warning", "FailedStaticPodManifest", &message)
                        .await;
                });
            }
            now.insert(key, problem.message.clone());
        }
        reported.retain(|(source, _), _| *source != update.source);
        reported.extend(now);
        // A pod that went keeps its name until it has stopped: an edited
        // manifest's new pod waits for the old one (one static pod per name
        // runs at a time, as the kubelet's `allowStaticPodStart`).
        for (uid, pod) in &replaced.gone {
            // The oldest holder keeps the name (a pod that never ran, edited
            // again, does not take it from one still stopping).
            ctx.terminating
                .lock()
                .entry(full_name(pod))
                .or_insert_with(|| uid.clone());
            ctx.dispatch(uid);
        }
        for uid in &replaced.came {
            ctx.dispatch(uid);
        }
        if !replaced.is_empty() {
            ctx.mirrors.poke();
        }
        if first && ctx.desired.source_ready(update.source) {
            sweep(&ctx);
        }
    }
}

/// A pod's namespace and name.
pub(crate) fn full_name(pod: &Pod) -> (String, String) {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// Runs the pod manager until the process ends: the workers woken by UID
/// (from the sources, probes, mirror manager and the relist).
pub(crate) async fn run<R: Runtime>(ctx: Arc<Context<R>>, mut wakes: Wakes) {
    // With no source to wait for (no API, no manifests), what is left on
    // the node from an earlier run is cleaned up now.
    if ctx.desired.all_ready() {
        sweep(&ctx);
    }
    let relisting = tokio::spawn(relist(ctx.clone()));
    while let Some(uid) = wakes.recv().await {
        ctx.dispatch(&uid);
    }
    relisting.abort();
}

/// Applies what the `api` source reports: this node's pods to run, and the
/// mirror pods to the mirror manager. A relist (the first one, or after the
/// watch fell behind) also ends the API pods that vanished meanwhile.
pub(crate) async fn follow_api<R: Runtime>(
    ctx: Arc<Context<R>>,
    mut events: tokio::sync::mpsc::Receiver<watcher::Event<Pod>>,
) {
    let mut relisted: Vec<String> = Vec::new();
    let mut mirrors: Vec<Pod> = Vec::new();
    while let Some(event) = events.recv().await {
        match event {
            watcher::Event::Apply(pod) if is_mirror(&pod) => {
                if let Some(uid) = ctx.status.mirror_drifted(&pod) {
                    ctx.dispatch(&uid);
                }
                ctx.mirrors.apply(pod);
            }
            watcher::Event::Delete(pod) if is_mirror(&pod) => ctx.mirrors.delete(&pod),
            watcher::Event::Apply(pod) => {
                if let Some(uid) = ctx.desired.set(pod) {
                    ctx.dispatch(&uid);
                }
            }
            watcher::Event::Delete(pod) => {
                if let Some(uid) = pod.metadata.uid.as_deref() {
                    ctx.confirmed.lock().remove(uid);
                    ctx.desired.remove(uid);
                    ctx.dispatch(uid);
                }
            }
            watcher::Event::Init => {
                relisted.clear();
                mirrors.clear();
            }
            watcher::Event::InitApply(pod) if is_mirror(&pod) => mirrors.push(pod),
            watcher::Event::InitApply(pod) => {
                if let Some(uid) = pod.metadata.uid.clone() {
                    ctx.desired.set(pod);
                    relisted.push(uid);
                }
            }
            watcher::Event::InitDone => {
                for uid in ctx.desired.uids_of(Source::Api) {
                    if !relisted.contains(&uid) {
                        ctx.desired.remove(&uid);
                        ctx.dispatch(&uid);
                    }
                }
                ctx.mirrors.relisted(std::mem::take(&mut mirrors));
                ctx.desired.source_ready(Source::Api);
                sweep(&ctx);
            }
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
#[cfg(test)]
mod tests;
