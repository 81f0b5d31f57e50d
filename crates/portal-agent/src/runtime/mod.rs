//! The container runtime behind a CRI-shaped interface: sandboxes (a pod's
//! network, UTS and IPC namespaces) and containers (create+start, stop,
//! remove, list). The pod workers speak only this; [`runc::Runc`] is the
//! implementation (ADR 0007), and tests can put a fake behind it.

pub mod bundle;

pub mod runc;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::images::Image;
use crate::shim::{Exit, Started};

/// Why a runtime call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or mount of the runtime's could not be made or read.
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// A helper command (runc, unshare, the shim) failed.
    #[error("{command}: {message}")]
    Command { command: String, message: String },
    /// The container's configuration cannot be run.
    #[error("{0}")]
    Config(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What identifies a container instance among a pod's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerMeta {
    pub pod_uid: String,
    pub pod_namespace: String,
    pub pod_name: String,
    pub name: String,
    /// 0 for the first instance, +1 per restart (the restart count).
    pub attempt: u32,
    /// As the pod spec names it, and the resolved `repo@sha256:…`.
    pub image: String,
    pub image_id: String,
    pub created_at: String,
    pub log_path: PathBuf,
    /// The signal that asks it to stop (the image's `StopSignal`).
    #[serde(default)]
    pub stop_signal: Option<String>,
    /// Where it writes its termination message (a file on the node).
    #[serde(default)]
    pub termination_message: Option<PathBuf>,
}

/// What a command run in a container did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecResult {
    /// None when it did not finish in time (it was killed).
    pub exit_code: Option<i32>,
    /// Its stdout and stderr, cut at [`EXEC_OUTPUT_LIMIT`].
    pub output: Vec<u8>,
}

/// The most output kept from a hook or probe command (as the kubelet's 10 KiB).
pub const EXEC_OUTPUT_LIMIT: usize = 10 * 1024;

/// What a container runs: the process and its limits, already resolved.
#[derive(Clone, Debug, Default)]
pub struct ContainerConfig {
    pub argv: Vec<String>,
    pub env: Vec<String>,
    pub working_dir: String,
    /// uid, gid.
    pub user: (u32, u32),
    pub memory_limit: Option<i64>,
    /// CPU quota in millicores (limits.cpu) and shares (requests.cpu).
    pub cpu_limit_millis: Option<i64>,
    pub cpu_request_millis: Option<i64>,
    /// Extra read-only/read-write bind mounts: (host path, container path, read-only).
    pub mounts: Vec<(PathBuf, String, bool)>,
    /// The pod shares the node's network namespace.
    pub host_network: bool,
    pub privileged: bool,
    /// `allowPrivilegeEscalation: false`: setuid binaries gain nothing.
    pub no_new_privileges: bool,
    /// The node accounts swap: the memory limit covers it too.
    pub limit_swap: bool,
    /// Stdin kept open for attach (`stdin`, `stdinOnce`), on a terminal (`tty`).
    pub stdin: bool,
    pub stdin_once: bool,
    pub tty: bool,
}

/// Where a container is in its life.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Made, not (yet) started.
    Created,
    Running(Started),
    Exited {
        started: Option<Started>,
        exit: Exit,
    },
}

/// One container instance as the runtime sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerStatus {
    pub id: String,
    pub meta: ContainerMeta,
    pub state: State,
}

/// A pod's shared namespaces as made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxPaths {
    /// Network namespace to join, or `None` for host-network pods.
    pub netns: Option<PathBuf>,
    pub uts: PathBuf,
    pub ipc: PathBuf,
}

/// A CRI-shaped runtime. (Futures are `Send`: pod workers run on tokio's
/// multi-threaded runtime.)
pub trait Runtime: Send + Sync + 'static {
    /// Makes the pod's UTS and IPC namespaces (the hostname set) and
    /// records the network namespace the pod joins.
    fn run_sandbox(
        &self,
        pod_uid: &str,
        hostname: &str,
        netns: Option<PathBuf>,
    ) -> impl Future<Output = Result<SandboxPaths>> + Send;
    /// The sandbox if it (still) exists.
    fn sandbox(&self, pod_uid: &str) -> Option<SandboxPaths>;
    /// Removes the sandbox; its containers must have been removed.
    fn remove_sandbox(&self, pod_uid: &str) -> impl Future<Output = Result<()>> + Send;
    /// Makes and starts a container in the sandbox; returns its id. A
    /// start failure shows as an exit with reason `StartError`.
    fn start_container(
        &self,
        sandbox: &SandboxPaths,
        meta: ContainerMeta,
        image: &Image,
        config: &ContainerConfig,
    ) -> impl Future<Output = Result<String>> + Send;
    /// Asks the container to stop (`signal`, default SIGTERM), then kills
    /// it after `grace`. Returns once it has exited.
    fn stop_container(
        &self,
        id: &str,
        signal: Option<&str>,
        grace: Duration,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Runs `argv` in a running container (hooks and exec probes), killed
    /// after `timeout`.
    fn exec(
        &self,
        id: &str,
        argv: &[String],
        timeout: Duration,
    ) -> impl Future<Output = Result<ExecResult>> + Send;
    /// Forgets an exited container and frees its files.
    fn remove_container(&self, id: &str) -> impl Future<Output = Result<()>> + Send;
    /// Every container of this agent, running or not.
    fn containers(&self) -> Vec<ContainerStatus>;
    /// One container, running or not.
    fn container(&self, id: &str) -> Option<ContainerStatus>;
    /// Starts `argv` in a running container for an exec session, its
    /// streams connected to the caller (through a terminal with `tty`, of
    /// `size` columns × rows when known).
    fn exec_session(
        &self,
        id: &str,
        argv: &[String],
        stdin: bool,
        tty: bool,
        size: Option<(u16, u16)>,
    ) -> impl Future<Output = Result<ExecSession>> + Send;
    /// The container's attach socket (see `shim::attach`).
    fn attach_socket(&self, id: &str) -> PathBuf;
    /// The container's cgroup (absolute, the same in every hierarchy),
    /// below its pod's; `None` where the runtime keeps none.
    fn cgroup(&self, _container: &ContainerStatus) -> Option<String> {
        None
    }
}

/// A process started by [`Runtime::exec_session`].
pub struct ExecSession {
    /// Ends with the process; its exit code is the command's.
    pub child: tokio::process::Child,
    pub stdin: Option<Box<dyn tokio::io::AsyncWrite + Send + Unpin>>,
    pub stdout: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>,
    pub stderr: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>,
    /// The session's terminal, for resizes.
    pub terminal: Option<crate::shim::console::Terminal>,
}

impl std::fmt::Debug for ExecSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecSession")
            .field("child", &self.child)
            .field("terminal", &self.terminal)
            .finish_non_exhaustive()
    }
}
