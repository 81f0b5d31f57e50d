//! In-memory stand-ins for what the pod workers drive — the container
//! runtime, the pod network and the image store — so the workers' state
//! machine is tested without root, runc, namespaces or a registry (the
//! kubelet's `pod_workers_test.go` uses a fake runtime the same way).
//! Tests script them (a container exits, a probe fails) and read back what
//! the workers did.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;

use crate::images::{Image, ImageConfig, ImageStore};
use crate::network::{PodNetwork, Sandbox};
use crate::runtime::{
    ContainerConfig, ContainerMeta, ContainerStatus, Error, ExecResult, ExecSession, Result,
    Runtime, SandboxPaths, State,
};
use crate::shim::{Exit, Started};

/// What happens when a container of a name is started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// It runs until stopped or told to exit.
    Runs,
    /// It exits at once with this code.
    Exits(i32),
}

/// One call of `stop_container`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Stop {
    pub name: String,
    pub signal: Option<String>,
    pub grace: Duration,
}

#[derive(Debug, Default)]
struct Containers {
    next: u64,
    all: BTreeMap<String, ContainerStatus>,
    sandboxes: HashMap<String, SandboxPaths>,
    /// Per container name: what the next starts do (then `Runs`).
    plans: HashMap<String, VecDeque<Outcome>>,
    /// Per container name: whether its exec probes and hooks succeed.
    exec_fails: HashMap<String, bool>,
    stops: Vec<Stop>,
    started: Vec<ContainerMeta>,
}

/// A runtime that keeps containers in a map.
#[derive(Debug, Default)]
pub(crate) struct FakeRuntime {
    state: Mutex<Containers>,
}

fn exit(code: i32) -> Exit {
    Exit {
        exit_code: code,
        reason: if code == 0 { "Completed" } else { "Error" }.into(),
        message: String::new(),
        finished_at: crate::durable::now(),
    }
}

impl FakeRuntime {
    /// The next starts of containers named `name` do `outcomes` in turn.
    pub(crate) fn plan(&self, name: &str, outcomes: &[Outcome]) {
        self.state
            .lock()
            .plans
            .insert(name.to_owned(), outcomes.iter().copied().collect());
    }

    /// Exec probes and hooks in containers named `name` fail (or succeed).
    pub(crate) fn exec_fails(&self, name: &str, fails: bool) {
        self.state.lock().exec_fails.insert(name.to_owned(), fails);
    }

    /// The running container `id` exits with `code`.
    pub(crate) fn exit(&self, id: &str, code: i32) {
        let mut state = self.state.lock();
        if let Some(container) = state.all.get_mut(id) {
            if let State::Running(started) = &container.state {
                container.state = State::Exited {
                    started: Some(started.clone()),
                    exit: exit(code),
                };
            }
        }
    }

    /// Adds a running container as a previous agent left it (adoption).
    pub(crate) fn left_running(&self, meta: ContainerMeta) -> String {
        let mut state = self.state.lock();
        state.next += 1;
        let id = format!("left-{}", state.next);
        let status = ContainerStatus {
            id: id.clone(),
            meta,
            state: State::Running(Started {
                pid: 1000,
                started_at: crate::durable::now(),
            }),
        };
        state.all.insert(id.clone(), status);
        id
    }

    /// Every start so far, in order.
    pub(crate) fn started(&self) -> Vec<ContainerMeta> {
        self.state.lock().started.clone()
    }

    /// Every stop so far, in order.
    pub(crate) fn stops(&self) -> Vec<Stop> {
        self.state.lock().stops.clone()
    }

    pub(crate) fn has_sandbox(&self, pod_uid: &str) -> bool {
        self.state.lock().sandboxes.contains_key(pod_uid)
    }
}

impl Runtime for FakeRuntime {
    async fn run_sandbox(
        &self,
        pod_uid: &str,
        _hostname: &str,
        netns: Option<PathBuf>,
    ) -> Result<SandboxPaths> {
        let paths = SandboxPaths {
            netns,
            uts: PathBuf::from(format!("/fake/{pod_uid}/uts")),
            ipc: PathBuf::from(format!("/fake/{pod_uid}/ipc")),
        };
        self.state
            .lock()
            .sandboxes
            .insert(pod_uid.to_owned(), paths.clone());
        Ok(paths)
    }

    fn sandbox(&self, pod_uid: &str) -> Option<SandboxPaths> {
        self.state.lock().sandboxes.get(pod_uid).cloned()
    }

    async fn remove_sandbox(&self, pod_uid: &str) -> Result<()> {
        let mut state = self.state.lock();
        if state.all.values().any(|c| c.meta.pod_uid == pod_uid) {
            return Err(Error::Config(format!(
                "sandbox {pod_uid} still has containers"
            )));
        }
        state.sandboxes.remove(pod_uid);
        Ok(())
    }

    async fn start_container(
        &self,
        sandbox: &SandboxPaths,
        meta: ContainerMeta,
        _image: &Image,
        _config: &ContainerConfig,
    ) -> Result<String> {
        let mut state = self.state.lock();
        if !state.sandboxes.values().any(|s| s == sandbox) {
            return Err(Error::Config("no such sandbox".into()));
        }
        let outcome = state
            .plans
            .get_mut(&meta.name)
            .and_then(VecDeque::pop_front)
            .unwrap_or(Outcome::Runs);
        state.next += 1;
        let id = format!("c{}", state.next);
        let started = Started {
            pid: i32::try_from(state.next).unwrap_or(i32::MAX),
            started_at: crate::durable::now(),
        };
        let container_state = match outcome {
            Outcome::Runs => State::Running(started),
            Outcome::Exits(code) => State::Exited {
                started: Some(started),
                exit: exit(code),
            },
        };
        state.started.push(meta.clone());
        state.all.insert(
            id.clone(),
            ContainerStatus {
                id: id.clone(),
                meta,
                state: container_state,
            },
        );
        Ok(id)
    }

    async fn stop_container(&self, id: &str, signal: Option<&str>, grace: Duration) -> Result<()> {
        let mut state = self.state.lock();
        let Some(container) = state.all.get_mut(id) else {
            return Ok(());
        };
        let name = container.meta.name.clone();
        if let State::Running(started) = &container.state {
            container.state = State::Exited {
                started: Some(started.clone()),
                exit: exit(143),
            };
        }
        state.stops.push(Stop {
            name,
            signal: signal.map(str::to_owned),
            grace,
        });
        Ok(())
    }

    async fn exec(&self, id: &str, _argv: &[String], _timeout: Duration) -> Result<ExecResult> {
        let state = self.state.lock();
        let name = state.all.get(id).map(|c| c.meta.name.clone());
        let fails = name
            .and_then(|n| state.exec_fails.get(&n).copied())
            .unwrap_or(false);
        Ok(ExecResult {
            exit_code: Some(i32::from(fails)),
            output: Vec::new(),
        })
    }

    async fn remove_container(&self, id: &str) -> Result<()> {
        self.state.lock().all.remove(id);
        Ok(())
    }

    fn containers(&self) -> Vec<ContainerStatus> {
        self.state.lock().all.values().cloned().collect()
    }

    fn container(&self, id: &str) -> Option<ContainerStatus> {
        self.state.lock().all.get(id).cloned()
    }

    async fn exec_session(
        &self,
        _id: &str,
        _argv: &[String],
        _stdin: bool,
        _tty: bool,
        _size: Option<(u16, u16)>,
    ) -> Result<ExecSession> {
        Err(Error::Config(
            "the fake runtime has no interactive sessions".into(),
        ))
    }

    fn attach_socket(&self, id: &str) -> PathBuf {
        PathBuf::from(format!("/fake/{id}/attach"))
    }
}

/// A pod network that hands out addresses from 10.88.0.0/24 in memory.
#[derive(Debug, Default)]
pub(crate) struct FakeNetwork {
    sandboxes: Mutex<HashMap<String, Sandbox>>,
}

impl PodNetwork for FakeNetwork {
    fn existing(&self, pod_uid: &str) -> Option<Sandbox> {
        self.sandboxes.lock().get(pod_uid).cloned()
    }

    fn create_sandbox<'a>(
        &'a self,
        pod_uid: &'a str,
    ) -> BoxFuture<'a, Result<Sandbox, crate::network::Error>> {
        Box::pin(async move {
            let mut sandboxes = self.sandboxes.lock();
            let host = u8::try_from(sandboxes.len() + 2).unwrap_or(u8::MAX);
            let sandbox = Sandbox {
                netns: format!("fake-{pod_uid}"),
                ip: Ipv4Addr::new(10, 88, 0, host),
                ip6: None,
                ipv6_primary: false,
                veth: format!("veth-{host}"),
            };
            sandboxes.insert(pod_uid.to_owned(), sandbox.clone());
            Ok(sandbox)
        })
    }

    fn remove_sandbox<'a>(
        &'a self,
        pod_uid: &'a str,
    ) -> BoxFuture<'a, Result<(), crate::network::Error>> {
        Box::pin(async move {
            self.sandboxes.lock().remove(pod_uid);
            Ok(())
        })
    }

    fn sandboxes_on_disk(&self) -> Vec<String> {
        self.sandboxes.lock().keys().cloned().collect()
    }
}

/// Every image is present.
#[derive(Debug, Default)]
pub(crate) struct FakeImages;

fn image(reference: &str) -> Image {
    Image {
        rootfs: PathBuf::from("/fake/rootfs"),
        config: ImageConfig {
            cmd: vec!["/bin/app".into()],
            ..ImageConfig::default()
        },
        id: format!("sha256:{:064x}", crate::short_hash(reference)),
    }
}

impl ImageStore for FakeImages {
    fn present(&self, reference: &str) -> Option<Image> {
        Some(image(reference))
    }

    fn pull<'a>(
        &'a self,
        reference: &'a str,
        _secrets: &'a [crate::images::PullSecret<'a>],
    ) -> BoxFuture<'a, Result<Image, crate::images::Error>> {
        Box::pin(async move { Ok(image(reference)) })
    }
}
