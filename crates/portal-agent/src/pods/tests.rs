//! The pod workers' state machine against the fake runtime, network and
//! images (no root, no runc): static pods go in through the real pipeline
//! (an `Update` from a source → `merge_static` → the pod manager's
//! dispatcher → one worker per pod), and each test reads back what the
//! workers did to the runtime and the status they computed. As the
//! kubelet's `pod_workers_test.go`: start, restart with back-off, probes,
//! graceful stop, init containers, adoption after an agent restart.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus, Service};
use kube::runtime::reflector;
use parking_lot::{Mutex, RwLock};
use tokio::sync::mpsc;

use super::Context;
use crate::events::Events;
use crate::fakes::{FakeImages, FakeNetwork, FakeRuntime, Outcome};
use crate::files::DnsSettings;
use crate::metrics::Metrics;
use crate::mirror::Mirrors;
use crate::network::PodNetwork;
use crate::node::Identity;
use crate::prober::Prober;
use crate::runtime::{ContainerMeta, Runtime, State};
use crate::sources::manifest::{self, Origin};
use crate::sources::{Desired, Source, Update};
use crate::status::StatusManager;
use crate::wake::PodWaker;

/// How long a test waits for what the workers should do at once (they act
/// within the pod manager's one-second relist).
const PATIENCE: Duration = Duration::from_secs(15);

struct Bed {
    ctx: Arc<Context<FakeRuntime>>,
    runtime: Arc<FakeRuntime>,
    network: Arc<FakeNetwork>,
    updates: mpsc::Sender<Update>,
    _dir: tempfile::TempDir,
}

impl Bed {
    fn new() -> Bed {
        Bed::with(FakeRuntime::default(), FakeNetwork::default())
    }

    /// A node whose runtime and network hold what an earlier agent left.
    fn with(runtime: FakeRuntime, network: FakeNetwork) -> Bed {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let runtime = Arc::new(runtime);
        let network = Arc::new(network);
        let (waker, wakes) = PodWaker::channel();
        let status = Arc::new(StatusManager::new(None));
        let mirrors = Arc::new(Mirrors::default());
        let events = Arc::new(Events::new(
            None,
            "n1".into(),
            mirrors.clone(),
            status.clone(),
        ));
        let (services, _writer) = reflector::store::<Service>();
        let ctx = Arc::new(Context {
            client: None,
            me: Identity {
                name: "n1".into(),
                ip: std::net::Ipv4Addr::new(192, 0, 2, 1),
                ip6: None,
                port: 10250,
                lease_seconds: 40,
                pod_cidr: None,
                storage_root: None,
                external_ips: Vec::new(),
            },
            runtime: runtime.clone(),
            images: Arc::new(FakeImages),
            network: network.clone(),
            dns: RwLock::new(DnsSettings {
                cluster_dns: Vec::new(),
                cluster_domain: "cluster.local".into(),
                host_resolv_conf: "nameserver 192.0.2.53\n".into(),
            }),
            dns_known: AtomicBool::new(true),
            prober: Prober::new(runtime.clone(), events.clone(), waker.clone()),
            status,
            events,
            mirrors,
            services,
            metrics: Metrics::new(),
            desired: Arc::new(Desired::expecting(&[Source::File])),
            waker,
            confirmed: Mutex::default(),
            terminating: Mutex::default(),
            workers: Mutex::default(),
            pods_dir: dir.path().join("pods"),
            logs_dir: dir.path().join("logs"),
            host_ports: crate::host_ports::HostPorts::default(),
            tokens: crate::tokens::Tokens::default(),
        });
        let (updates, received) = mpsc::channel(8);
        tokio::spawn(super::merge_static(ctx.clone(), received));
        tokio::spawn(super::run(ctx.clone(), wakes));
        Bed {
            ctx,
            runtime,
            network,
            updates,
            _dir: dir,
        }
    }

    /// The manifest file source now holds exactly these pods.
    async fn run(&self, pods: &[&Pod]) {
        let update = Update {
            source: Source::File,
            pods: Some(pods.iter().map(|p| (*p).clone()).collect()),
            problems: Vec::new(),
        };
        self.updates
            .send(update)
            .await
            .expect("the pod manager runs");
    }

    /// The status the workers last computed for `pod`.
    fn status(&self, pod: &Pod) -> Option<PodStatus> {
        self.ctx.status.known(Arc::new(pod.clone())).status.clone()
    }

    /// Polls `check` until it answers (bounded).
    async fn until<T>(&self, what: &str, check: impl Fn(&Bed) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(found) = check(self) {
                return found;
            }
            if tokio::time::Instant::now() >= deadline {
                for pod in self
                    .ctx
                    .desired
                    .uids()
                    .iter()
                    .filter_map(|u| self.ctx.desired.get(u))
                {
                    eprintln!("{}: {:#?}", super::describe(&pod), self.status(&pod));
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; containers: {:#?}; desired: {:?}; workers: {:?}",
                self.runtime.containers(),
                self.ctx.desired.uids(),
                self.ctx.workers.lock().keys().collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn container_state(&self, pod: &Pod, name: &str) -> Option<String> {
        let status = self.status(pod)?;
        let container = status
            .container_statuses
            .iter()
            .chain(status.init_container_statuses.iter())
            .flatten()
            .find(|c| c.name == name)?;
        let state = container.state.as_ref()?;
        if state.running.is_some() {
            Some("running".into())
        } else if let Some(waiting) = &state.waiting {
            Some(format!(
                "waiting:{}",
                waiting.reason.as_deref().unwrap_or("")
            ))
        } else {
            state
                .terminated
                .as_ref()
                .map(|t| format!("terminated:{}", t.exit_code))
        }
    }

    fn phase(&self, pod: &Pod) -> Option<String> {
        self.status(pod)?.phase
    }

    fn ready(&self, pod: &Pod) -> Option<String> {
        self.status(pod)?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status)
    }

    /// The id of the running instance of container `name`.
    fn running_id(&self, name: &str) -> Option<String> {
        self.runtime
            .containers()
            .into_iter()
            .find(|c| c.meta.name == name && matches!(c.state, State::Running(_)))
            .map(|c| c.id)
    }

    fn attempts(&self, name: &str) -> Vec<u32> {
        self.runtime
            .started()
            .into_iter()
            .filter(|m| m.name == name)
            .map(|m| m.attempt)
            .collect()
    }
}

/// A static pod as the file source reads it (its UID a hash of it).
fn pod(yaml: &str) -> Pod {
    let origin = Origin {
        node: "n1",
        source: Source::File,
        location: "/etc/portal/manifests/pod.yaml",
    };
    manifest::read(yaml.as_bytes(), origin)
        .expect("a valid manifest")
        .remove(0)
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().expect("a static pod has a UID")
}

#[tokio::test]
async fn a_new_pod_gets_a_sandbox_an_address_and_running_containers() {
    let bed = Bed::new();
    let web = pod("metadata: {name: web}\nspec: {containers: [{name: app, image: busybox}, {name: side, image: busybox}]}\n");
    bed.run(&[&web]).await;
    bed.until("the pod Running", |b| {
        (b.phase(&web).as_deref() == Some("Running")).then_some(())
    })
    .await;
    assert_eq!(bed.container_state(&web, "app").as_deref(), Some("running"));
    assert_eq!(
        bed.container_state(&web, "side").as_deref(),
        Some("running")
    );
    assert_eq!(bed.ready(&web).as_deref(), Some("True"));
    let sandbox = bed.network.existing(&uid(&web)).expect("a network sandbox");
    let status = bed.status(&web).unwrap();
    assert_eq!(
        status.pod_ip.as_deref(),
        Some(sandbox.ip.to_string().as_str())
    );
    assert!(bed.runtime.has_sandbox(&uid(&web)));
    assert_eq!(bed.attempts("app"), [0]);
}

#[tokio::test]
async fn an_ended_container_restarts_at_once_then_backs_off() {
    let bed = Bed::new();
    bed.runtime
        .plan("app", &[Outcome::Exits(1), Outcome::Exits(1)]);
    let web = pod("metadata: {name: crashy}\nspec: {containers: [{name: app, image: busybox}]}\n");
    bed.run(&[&web]).await;
    // The first end restarts it at once; the second waits out the back-off.
    bed.until("CrashLoopBackOff", |b| {
        (b.container_state(&web, "app").as_deref() == Some("waiting:CrashLoopBackOff"))
            .then_some(())
    })
    .await;
    assert_eq!(bed.attempts("app"), [0, 1]);
    let status = bed.status(&web).unwrap();
    let app = &status.container_statuses.unwrap()[0];
    assert_eq!(app.restart_count, 1);
    let last = app.last_state.as_ref().and_then(|s| s.terminated.as_ref());
    assert_eq!(last.map(|t| t.exit_code), Some(1));
    // Backing off: the workers' next syncs (the relist wakes them every
    // second) do not start it again before the 10 s back-off.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(bed.attempts("app"), [0, 1], "restarted during its back-off");
}

#[tokio::test]
async fn the_relist_sees_a_container_end_and_its_worker_restarts_it() {
    let bed = Bed::new();
    let web = pod("metadata: {name: later}\nspec: {restartPolicy: OnFailure, containers: [{name: app, image: busybox}]}\n");
    bed.run(&[&web]).await;
    let first = bed
        .until("the container running", |b| b.running_id("app"))
        .await;
    // Nothing wakes the worker but the relist noticing the exit.
    bed.runtime.exit(&first, 2);
    let second = bed
        .until("a new instance running", |b| {
            b.running_id("app").filter(|id| *id != first)
        })
        .await;
    assert_ne!(first, second);
    assert_eq!(bed.attempts("app"), [0, 1]);
    bed.until("restartCount 1 in the status", |b| {
        let status = b.status(&web)?;
        (status.container_statuses?[0].restart_count == 1).then_some(())
    })
    .await;
    // A clean end under OnFailure is final: the pod Succeeds.
    bed.runtime.exit(&second, 0);
    bed.until("the pod Succeeded", |b| {
        (b.phase(&web).as_deref() == Some("Succeeded")).then_some(())
    })
    .await;
    assert_eq!(bed.attempts("app"), [0, 1]);
}

#[tokio::test]
async fn with_restart_policy_never_a_failed_container_fails_the_pod() {
    let bed = Bed::new();
    bed.runtime.plan("app", &[Outcome::Exits(3)]);
    let job = pod("metadata: {name: job}\nspec: {restartPolicy: Never, containers: [{name: app, image: busybox}]}\n");
    bed.run(&[&job]).await;
    bed.until("the pod Failed", |b| {
        (b.phase(&job).as_deref() == Some("Failed")).then_some(())
    })
    .await;
    assert_eq!(
        bed.container_state(&job, "app").as_deref(),
        Some("terminated:3")
    );
    assert_eq!(bed.attempts("app"), [0]);
    bed.until("the finished pod's sandbox given back", |b| {
        b.network.existing(&uid(&job)).is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn init_containers_run_in_order_and_gate_the_app() {
    let bed = Bed::new();
    bed.runtime.plan("first", &[Outcome::Exits(0)]);
    bed.runtime.plan("second", &[Outcome::Exits(0)]);
    let web = pod("metadata: {name: inits}\nspec: {initContainers: [{name: first, image: busybox}, {name: second, image: busybox}], containers: [{name: app, image: busybox}]}\n");
    bed.run(&[&web]).await;
    bed.until("the app running", |b| b.running_id("app")).await;
    let order: Vec<String> = bed.runtime.started().into_iter().map(|m| m.name).collect();
    assert_eq!(order, ["first", "second", "app"]);

    // A failing init container of a pod that never restarts fails it, and
    // its app never starts.
    bed.runtime.plan("gate", &[Outcome::Exits(1)]);
    let failing = pod("metadata: {name: gated}\nspec: {restartPolicy: Never, initContainers: [{name: gate, image: busybox}], containers: [{name: never, image: busybox}]}\n");
    bed.run(&[&web, &failing]).await;
    bed.until("the gated pod Failed", |b| {
        (b.phase(&failing).as_deref() == Some("Failed")).then_some(())
    })
    .await;
    assert!(
        bed.attempts("never").is_empty(),
        "the app started after a failed init"
    );
}

#[tokio::test]
async fn readiness_follows_the_probe_and_liveness_failure_restarts() {
    let bed = Bed::new();
    bed.runtime.exec_fails("app", true);
    let web = pod("metadata: {name: probed}\nspec: {containers: [{name: app, image: busybox, readinessProbe: {exec: {command: [check]}, periodSeconds: 1, failureThreshold: 1}}]}\n");
    bed.run(&[&web]).await;
    bed.until("the container running", |b| b.running_id("app"))
        .await;
    bed.until("not ready while the probe fails", |b| {
        (b.ready(&web).as_deref() == Some("False")).then_some(())
    })
    .await;
    bed.runtime.exec_fails("app", false);
    bed.until("ready once it passes", |b| {
        (b.ready(&web).as_deref() == Some("True")).then_some(())
    })
    .await;
    assert_eq!(bed.attempts("app"), [0], "readiness never restarts");

    bed.runtime.exec_fails("live", true);
    let sick = pod("metadata: {name: sick}\nspec: {containers: [{name: live, image: busybox, livenessProbe: {exec: {command: [check]}, periodSeconds: 1, failureThreshold: 1}}]}\n");
    bed.run(&[&web, &sick]).await;
    bed.until("killed for its liveness probe", |b| {
        b.runtime.stops().into_iter().find(|s| s.name == "live")
    })
    .await;
    bed.until("started again", |b| {
        (b.attempts("live").len() >= 2).then_some(())
    })
    .await;
    assert_eq!(bed.attempts("live")[..2], [0, 1]);
}

#[tokio::test]
async fn a_pod_that_goes_stops_within_its_grace_and_leaves_nothing() {
    let bed = Bed::new();
    let web = pod("metadata: {name: going}\nspec: {terminationGracePeriodSeconds: 7, containers: [{name: app, image: busybox, lifecycle: {preStop: {exec: {command: [drain]}}}}]}\n");
    bed.run(&[&web]).await;
    bed.until("the container running", |b| b.running_id("app"))
        .await;
    bed.run(&[]).await;
    bed.until("everything removed", |b| {
        let empty = b.runtime.containers().is_empty()
            && !b.runtime.has_sandbox(&uid(&web))
            && b.network.existing(&uid(&web)).is_none()
            && b.ctx.workers.lock().is_empty();
        empty.then_some(())
    })
    .await;
    let stops = bed.runtime.stops();
    assert_eq!(stops.len(), 1, "{stops:?}");
    // Within the grace period, less what the preStop hook took.
    assert!(stops[0].grace <= Duration::from_secs(7) && stops[0].grace > Duration::from_secs(5));
    assert!(
        !bed.ctx.pods_dir.join(uid(&web)).exists(),
        "the pod's files are removed"
    );
}

#[tokio::test]
async fn containers_an_earlier_agent_left_running_are_adopted() {
    let web = pod("metadata: {name: kept, namespace: default}\nspec: {containers: [{name: app, image: busybox}]}\n");
    let runtime = FakeRuntime::default();
    let network = FakeNetwork::default();
    let sandbox = network.create_sandbox(&uid(&web)).await.unwrap();
    runtime
        .run_sandbox(&uid(&web), "kept", Some(sandbox.netns_path()))
        .await
        .unwrap();
    let left = runtime.left_running(ContainerMeta {
        pod_uid: uid(&web),
        pod_namespace: "default".into(),
        pod_name: "kept".into(),
        name: "app".into(),
        attempt: 0,
        image: "busybox".into(),
        image_id: "sha256:0".into(),
        created_at: crate::durable::now(),
        log_path: "/fake/log".into(),
        stop_signal: None,
        termination_message: None,
    });
    let bed = Bed::with(runtime, network);
    bed.run(&[&web]).await;
    bed.until("the pod Running", |b| {
        (b.phase(&web).as_deref() == Some("Running")).then_some(())
    })
    .await;
    let status = bed.status(&web).unwrap();
    let app = &status.container_statuses.unwrap()[0];
    assert_eq!(
        app.container_id.as_deref(),
        Some(format!("portal://{left}").as_str())
    );
    assert!(
        bed.runtime.started().is_empty(),
        "a new container was started"
    );
    assert!(
        bed.runtime.stops().is_empty(),
        "the adopted container was stopped"
    );
    assert_eq!(status.pod_ip, Some(sandbox.ip.to_string()));
}
