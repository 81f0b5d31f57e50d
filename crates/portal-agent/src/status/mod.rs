//! A pod's status as the kubelet reports it, computed from the spec, what
//! the runtime shows of its containers and why a container waits (pure),
//! and the status manager that writes it only when it changed.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus as ApiContainerStatus, HostIP, Pod, PodCondition, PodIP,
    PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use parking_lot::Mutex;

use crate::runtime::{ContainerStatus, State};
use crate::shim::Exit;

/// Why a container is not running now (ContainerCreating, ErrImagePull,
/// ImagePullBackOff, CrashLoopBackOff, CreateContainerConfigError, …).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub reason: String,
    pub message: String,
}

/// What the status is computed from.
#[derive(Debug)]
pub struct Observed<'a> {
    pub pod: &'a Pod,
    /// The runtime's instances of this pod's containers.
    pub containers: &'a [ContainerStatus],
    pub waiting: &'a HashMap<String, Waiting>,
    /// What the probes say, by container instance id (none: no probes ran).
    pub verdicts: &'a HashMap<String, crate::probe_results::Verdict>,
    /// The sandbox is up (network and namespaces).
    pub sandbox_ready: bool,
    /// The pod's addresses, primary (IPv4) first.
    pub pod_ips: Vec<String>,
    /// The node's addresses, IPv4 first.
    pub host_ips: Vec<String>,
    /// When the agent first took the pod on.
    pub start_time: jiff::Timestamp,
    /// The node ended it (then it failed): why, in a word and a sentence
    /// (`DeadlineExceeded`, `Evicted`).
    pub ended: Option<(String, String)>,
}

fn parse_time(text: &str) -> Option<Time> {
    text.parse::<jiff::Timestamp>().ok().map(Time)
}

/// The newest instance of container `name`, and the one before it.
fn instances<'a>(
    containers: &'a [ContainerStatus],
    name: &str,
) -> (Option<&'a ContainerStatus>, Option<&'a ContainerStatus>) {
    let mut mine: Vec<&ContainerStatus> =
        containers.iter().filter(|c| c.meta.name == name).collect();
    mine.sort_by_key(|c| std::cmp::Reverse(c.meta.attempt));
    (mine.first().copied(), mine.get(1).copied())
}

/// The most of a termination message kept (the kubelet's 4 KiB).
const MESSAGE_LIMIT: usize = 4096;

/// What the container left as its termination message: its file, else
/// (with `FallbackToLogsOnError` and a failure) the end of its log.
pub(crate) fn termination_message(instance: &ContainerStatus, fallback_to_logs: bool) -> String {
    let State::Exited { exit, .. } = &instance.state else {
        return String::new();
    };
    let read_tail = |path: &std::path::Path, limit: usize| {
        std::fs::read(path)
            .map(|bytes| {
                let start = bytes.len().saturating_sub(limit);
                String::from_utf8_lossy(&bytes[start..]).into_owned()
            })
            .unwrap_or_default()
    };
    let written = instance
        .meta
        .termination_message
        .as_deref()
        .map(|p| read_tail(p, MESSAGE_LIMIT))
        .unwrap_or_default();
    if !written.is_empty() || !fallback_to_logs || exit.exit_code == 0 {
        return written;
    }
    // The log's last lines, without the CRI prefix (time, stream, tag).
    let log = read_tail(&instance.meta.log_path, 2048);
    let lines: Vec<&str> = log
        .lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3))
        .collect();
    lines[lines.len().saturating_sub(80)..].join("\n")
}

fn terminated(exit: &Exit, started_at: Option<&str>, id: &str, message: String) -> ContainerState {
    let message = if message.is_empty() {
        exit.message.clone()
    } else {
        message
    };
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: exit.exit_code,
            reason: Some(exit.reason.clone()),
            message: Some(message).filter(|m| !m.is_empty()),
            started_at: started_at.and_then(parse_time),
            finished_at: parse_time(&exit.finished_at),
            container_id: Some(format!("portal://{id}")),
            signal: None,
        }),
        ..ContainerState::default()
    }
}

fn state_of(instance: &ContainerStatus, fallback_to_logs: bool) -> ContainerState {
    match &instance.state {
        State::Running(started) => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: parse_time(&started.started_at),
            }),
            ..ContainerState::default()
        },
        State::Created => waiting_state("ContainerCreating", ""),
        State::Exited { started, exit } => terminated(
            exit,
            started.as_ref().map(|s| s.started_at.as_str()),
            &instance.id,
            termination_message(instance, fallback_to_logs),
        ),
    }
}

fn waiting_state(reason: &str, message: &str) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.into()),
            message: Some(message.to_owned()).filter(|m| !m.is_empty()),
        }),
        ..ContainerState::default()
    }
}

/// The pod's status now.
/// How a container counts in the kubelet's getPhase: a container waiting
/// after it ended (to restart) counts as stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Running,
    Stopped { succeeded: bool },
    Waiting,
}

/// One container's status from its instances and why it waits.
fn container_status(
    container: &Container,
    observed: &Observed<'_>,
    init: bool,
) -> (ApiContainerStatus, Class) {
    let (latest, previous) = instances(observed.containers, &container.name);
    let why = observed.waiting.get(&container.name);
    let fallback = container.termination_message_policy.as_deref() == Some("FallbackToLogsOnError");
    let mut state = match latest {
        Some(instance) => state_of(instance, fallback),
        None if init => waiting_state("PodInitializing", ""),
        None => waiting_state("ContainerCreating", ""),
    };
    // A container waiting to restart (or to be made) says why.
    if let Some(why) = why {
        if state.running.is_none() {
            state = waiting_state(&why.reason, &why.message);
        }
    }
    let last_state = match (why, latest, previous) {
        // Waiting to restart: the last run is the newest instance.
        (Some(_), Some(last), _) if !matches!(last.state, State::Running(_)) => {
            Some(state_of(last, fallback))
        }
        (_, _, Some(previous)) => Some(state_of(previous, fallback)),
        _ => None,
    }
    .filter(|s| s.terminated.is_some());
    let is_running = state.running.is_some();
    let verdict = latest.and_then(|c| observed.verdicts.get(&c.id));
    let class = match (&state.terminated, &state.waiting) {
        (Some(t), _) => Class::Stopped {
            succeeded: t.exit_code == 0,
        },
        (None, Some(_)) if last_state.is_some() => Class::Stopped { succeeded: false },
        (None, Some(_)) => Class::Waiting,
        _ => Class::Running,
    };
    // A completed init container counts as ready, as the kubelet says.
    let completed = init && class == Class::Stopped { succeeded: true };
    // Restarts so far: the newest instance's attempt number.
    let restarts = latest.map_or(0, |c| c.meta.attempt);
    let status = ApiContainerStatus {
        name: container.name.clone(),
        image: container.image.clone().unwrap_or_default(),
        image_id: latest.map(|c| c.meta.image_id.clone()).unwrap_or_default(),
        container_id: latest
            .filter(|_| state.waiting.is_none())
            .map(|c| format!("portal://{}", c.id)),
        ready: completed || (is_running && verdict.is_none_or(|v| v.ready)),
        started: Some(is_running && verdict.is_none_or(|v| v.started)),
        restart_count: i32::try_from(restarts).unwrap_or(i32::MAX),
        state: Some(state),
        last_state: Some(last_state.unwrap_or_default()),
        ..ApiContainerStatus::default()
    };
    (status, class)
}

/// The pod's status now.
pub fn compute(observed: &Observed<'_>) -> PodStatus {
    let spec = observed.pod.spec.clone().unwrap_or_default();
    let policy = spec.restart_policy.as_deref().unwrap_or("Always");
    // Init containers: regular ones must have succeeded, sidecars
    // (restartPolicy Always) must run.
    let mut init_statuses = Vec::new();
    let (mut initialized, mut init_failed) = (true, false);
    for container in spec.init_containers.iter().flatten() {
        let sidecar = container.restart_policy.as_deref() == Some("Always");
        let (status, class) = container_status(container, observed, true);
        let done = if sidecar {
            class == Class::Running && status.started == Some(true)
        } else {
            class == Class::Stopped { succeeded: true }
        };
        if !sidecar && class == (Class::Stopped { succeeded: false }) && policy == "Never" {
            init_failed = true;
        }
        initialized &= done;
        init_statuses.push(status);
    }
    let mut statuses = Vec::new();
    let (mut running, mut stopped, mut succeeded, mut waiting) = (0, 0, 0, 0);
    for container in &spec.containers {
        let (status, class) = container_status(container, observed, false);
        match class {
            Class::Running => running += 1,
            Class::Stopped { succeeded: ok } => {
                stopped += 1;
                succeeded += usize::from(ok);
            }
            Class::Waiting => waiting += 1,
        }
        statuses.push(status);
    }
    let total = spec.containers.len();
    // The kubelet's getPhase.
    let phase = if init_failed {
        "Failed"
    } else if !initialized || waiting > 0 || total == 0 {
        "Pending"
    } else if running > 0 {
        "Running"
    } else if stopped > 0 {
        match policy {
            // Every container is about to be restarted.
            "Always" => "Running",
            _ if stopped == succeeded => "Succeeded",
            "OnFailure" => "Running",
            _ => "Failed",
        }
    } else {
        "Pending"
    };
    let all_ready = initialized && total > 0 && statuses.iter().all(|s| s.ready);
    let gates_pass = spec.readiness_gates.iter().flatten().all(|gate| {
        observed
            .pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c.type_ == gate.condition_type && c.status == "True")
            })
    });
    let previous = observed
        .pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let now = Time(jiff::Timestamp::now());
    let condition = |type_: &str, ok: bool, reason: Option<&str>| {
        let status = if ok { "True" } else { "False" };
        let since = previous
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| now.clone());
        PodCondition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.filter(|_| !ok).map(str::to_owned),
            last_transition_time: Some(since),
            ..PodCondition::default()
        }
    };
    let terminal = matches!(phase, "Succeeded" | "Failed");
    let conditions = vec![
        condition(
            "PodReadyToStartContainers",
            observed.sandbox_ready && !terminal,
            None,
        ),
        condition("Initialized", initialized, Some("ContainersNotInitialized")),
        condition(
            "Ready",
            all_ready && gates_pass,
            Some(if terminal {
                "PodCompleted"
            } else {
                "ContainersNotReady"
            }),
        ),
        condition(
            "ContainersReady",
            all_ready,
            Some(if terminal {
                "PodCompleted"
            } else {
                "ContainersNotReady"
            }),
        ),
        condition("PodScheduled", true, None),
    ];
    // Conditions other agents own (readiness gates) are kept as they are.
    let mut merged: Vec<PodCondition> = conditions;
    for kept in previous {
        if !merged.iter().any(|c| c.type_ == kept.type_) {
            merged.push(kept);
        }
    }
    // A finished pod stays finished (the kubelet refuses that transition
    // back), with the reason it ended for.
    let current = observed.pod.status.as_ref();
    let finished = current
        .and_then(|s| s.phase.as_deref())
        .filter(|p| matches!(*p, "Succeeded" | "Failed"));
    let (phase, reason, message) = if let Some(finished) = finished {
        (
            finished,
            current.and_then(|s| s.reason.clone()),
            current.and_then(|s| s.message.clone()),
        )
    } else if let Some((reason, message)) = &observed.ended {
        ("Failed", Some(reason.clone()), Some(message.clone()))
    } else {
        (phase, None, None)
    };
    PodStatus {
        phase: Some(phase.into()),
        reason,
        message,
        conditions: Some(merged),
        host_ip: observed.host_ips.first().cloned(),
        host_ips: Some(
            observed
                .host_ips
                .iter()
                .map(|ip| HostIP { ip: ip.clone() })
                .collect(),
        ),
        pod_ip: observed.pod_ips.first().cloned(),
        pod_ips: (!observed.pod_ips.is_empty()).then(|| {
            observed
                .pod_ips
                .iter()
                .map(|ip| PodIP { ip: ip.clone() })
                .collect()
        }),
        start_time: Some(Time(observed.start_time)),
        container_statuses: Some(statuses),
        init_container_statuses: Some(init_statuses).filter(|s| !s.is_empty()),
        qos_class: Some(qos_class(observed.pod).into()),
        ..PodStatus::default()
    }
}

/// Guaranteed when every container's requests equal its limits for cpu
/// and memory, BestEffort with none at all, Burstable otherwise.
fn qos_class(pod: &Pod) -> &'static str {
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let mut any = false;
    let mut guaranteed = true;
    for container in containers {
        let resources = container.resources.clone().unwrap_or_default();
        let limits = resources.limits.unwrap_or_default();
        let requests = resources.requests.unwrap_or_default();
        any |= !limits.is_empty() || !requests.is_empty();
        for name in ["cpu", "memory"] {
            let limit = limits.get(name);
            let request = requests.get(name).or(limit);
            if limit.is_none() || request != limit {
                guaranteed = false;
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

/// Keeps each pod's latest status and writes it to the API, skipping
/// writes that would change nothing. A static pod's status goes to its
/// mirror pod once there is one (until then, and with no API server at
/// all, it is only kept here: the worker reads it back).
pub struct StatusManager {
    client: Option<Client>,
    /// The latest status computed per pod UID.
    latest: Mutex<HashMap<String, PodStatus>>,
    /// The last status written per API object UID (timestamps included: a
    /// status whose only change is a time is still the same status).
    written: Mutex<HashMap<String, serde_json::Value>>,
    /// Static pod UID → its mirror pod's UID.
    mirrors: Mutex<HashMap<String, String>>,
}

impl std::fmt::Debug for StatusManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusManager").finish_non_exhaustive()
    }
}

/// Whether the pod is a static one (from a file, a URL or the endpoint),
/// as the kubelet tells: by its `kubernetes.io/config.source`.
pub(crate) fn is_static(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::sources::CONFIG_SOURCE))
        .is_some_and(|source| source != crate::sources::Source::Api.name())
}

impl StatusManager {
    pub fn new(client: Option<Client>) -> Self {
        StatusManager {
            client,
            latest: Mutex::new(HashMap::new()),
            written: Mutex::new(HashMap::new()),
            mirrors: Mutex::new(HashMap::new()),
        }
    }

    /// The pod with the status the agent knows: a static pod has none in
    /// its manifest, so it gets the latest one computed.
    pub(crate) fn known(&self, pod: std::sync::Arc<Pod>) -> std::sync::Arc<Pod> {
        if pod.status.is_some() {
            return pod;
        }
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        match self.latest.lock().get(uid) {
            Some(status) => std::sync::Arc::new(Pod {
                status: Some(status.clone()),
                ..(*pod).clone()
            }),
            None => pod,
        }
    }

    /// Records `status` for `pod` and writes it unless that was written
    /// last.
    pub async fn set(&self, pod: &Pod, status: PodStatus) -> Result<(), kube::Error> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let value = serde_json::to_value(&status).unwrap_or_default();
        self.latest.lock().insert(uid.clone(), status);
        let target = if is_static(pod) {
            match self.mirrors.lock().get(&uid) {
                Some(mirror) => mirror.clone(),
                None => return Ok(()),
            }
        } else {
            // The API's copy already says so (after an agent restart).
            let current = pod
                .status
                .as_ref()
                .and_then(|s| serde_json::to_value(s).ok());
            if current.as_ref() == Some(&value) {
                return Ok(());
            }
            uid
        };
        let Some(client) = &self.client else {
            return Ok(());
        };
        if self.written.lock().get(&target) == Some(&value) {
            return Ok(());
        }
        let api = Api::<Pod>::namespaced(
            client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or("default"),
        );
        let patch = serde_json::json!({
            "metadata": {"uid": target},
            "status": value,
        });
        api.patch_status(
            pod.metadata.name.as_deref().unwrap_or_default(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
        // Not for a mirror unlinked meanwhile (deleted: never written again).
        let linked = !is_static(pod) || self.mirrors.lock().values().any(|m| *m == target);
        if linked {
            self.written.lock().insert(target, value);
        }
        Ok(())
    }

    /// The static pod's status goes to this mirror pod from now on;
    /// whether that is new (then it must be written).
    pub(crate) fn link_mirror(&self, static_uid: &str, mirror_uid: &str) -> bool {
        let mut mirrors = self.mirrors.lock();
        if mirrors.get(static_uid).map(String::as_str) == Some(mirror_uid) {
            return false;
        }
        mirrors.insert(static_uid.to_owned(), mirror_uid.to_owned());
        true
    }

    /// A mirror pod as the API shows it: when its Ready condition is not
    /// what the agent last computed (someone else wrote it: the node
    /// lifecycle controller marks pods not Ready while a node is away),
    /// the status is due again; the static pod's UID, to wake its worker.
    pub(crate) fn mirror_drifted(&self, mirror: &Pod) -> Option<String> {
        let mirror_uid = mirror.metadata.uid.as_deref()?;
        let static_uid = self
            .mirrors
            .lock()
            .iter()
            .find(|(_, m)| m.as_str() == mirror_uid)
            .map(|(s, _)| s.clone())?;
        let ready = |status: Option<&PodStatus>| {
            status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .map(|c| c.status.clone())
        };
        let computed = ready(self.latest.lock().get(&static_uid));
        if computed.is_none() || computed == ready(mirror.status.as_ref()) {
            return None;
        }
        self.written.lock().remove(mirror_uid);
        Some(static_uid)
    }

    /// The UID of the static pod's mirror pod, if it has one.
    pub(crate) fn mirror_of(&self, static_uid: &str) -> Option<String> {
        self.mirrors.lock().get(static_uid).cloned()
    }

    pub(crate) fn unlink_mirror(&self, static_uid: &str) {
        if let Some(mirror) = self.mirrors.lock().remove(static_uid) {
            self.written.lock().remove(&mirror);
        }
    }

    pub fn forget(&self, uid: &str) {
        self.latest.lock().remove(uid);
        self.written.lock().remove(uid);
        self.unlink_mirror(uid);
    }
}
#[cfg(test)]
mod tests;
