//! The runtime on Debian's `runc` (ADR 0007). Each container is a
//! directory — `meta.json`, the bundle's `config.json`, an overlay root
//! (`rootfs`, written into `upper`) over the image's unpacked root, and
//! the shim's `state/` — and a `portal shim` process that owns it. Nothing
//! lives only in the agent's memory: a restarted agent lists the same
//! containers from the directories and adopts them as they are.
//!
//! A pod's sandbox is its network namespace (made by `network`) plus UTS
//! and IPC namespaces kept alive as bind-mounted files (`unshare
//! --uts=FILE`), so the pod needs no pause process.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use tokio::process::Command;

use super::{
    bundle, ContainerConfig, ContainerMeta, ContainerStatus, Error, Image, Result, Runtime,
    SandboxPaths, State,
};
use crate::shim::{Exit, LogLimits, Started};

mod exec;

/// How long a start may take before the agent gives up waiting for it.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// runc-backed runtime of one agent.
#[derive(Clone, Debug)]
pub struct Runc {
    runc: PathBuf,
    /// `DIR/runtime`: `sandboxes/`, `containers/`, and runc's own `runc/`.
    dir: PathBuf,
    /// The `portal` binary, re-executed as `portal shim`.
    portal: PathBuf,
    /// Cgroups go under `/portal/<tag>/`.
    tag: String,
    log_limits: LogLimits,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

impl Runc {
    pub fn new(dir: PathBuf, tag: &str) -> Result<Self> {
        let runc = which("runc").ok_or_else(|| {
            Error::Config("runc is not installed (Debian: apt-get install runc)".into())
        })?;
        let portal = std::env::current_exe().map_err(io("the portal binary"))?;
        for sub in ["sandboxes", "containers", "runc"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(io(format!("{}", dir.display())))?;
        }
        let sockets = socket_dir(tag);
        std::fs::create_dir_all(&sockets).map_err(io(format!("{}", sockets.display())))?;
        std::fs::set_permissions(
            &sockets,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .map_err(io(format!("{}", sockets.display())))?;
        Ok(Runc {
            runc,
            dir,
            portal,
            tag: tag.to_owned(),
            log_limits: LogLimits::default(),
        })
    }

    fn sandbox_dir(&self, pod_uid: &str) -> PathBuf {
        self.dir.join("sandboxes").join(pod_uid)
    }

    fn container_dir(&self, id: &str) -> PathBuf {
        self.dir.join("containers").join(id)
    }

    /// The pod's cgroup (absolute, in every hierarchy); containers below it.
    fn pod_cgroup(&self, pod_uid: &str) -> String {
        format!("/portal/{}/pod{pod_uid}", self.tag)
    }

    fn status_of(&self, id: &str) -> Option<ContainerStatus> {
        let dir = self.container_dir(id);
        let meta: ContainerMeta = read_json(&dir.join("meta.json"))?;
        let state_dir = dir.join("state");
        let started: Option<Started> = read_json(&state_dir.join("started"));
        let exit: Option<Exit> = read_json(&state_dir.join("exit"));
        let shim_pid = std::fs::read_to_string(state_dir.join("shim.pid"))
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok());
        let shim_alive = shim_pid.is_some_and(|pid| process_runs(pid, "shim"));
        // Just made, the shim not yet up: starting, unless that was long ago.
        let starting = shim_pid.is_none()
            && meta
                .created_at
                .parse::<jiff::Timestamp>()
                .is_ok_and(|t| jiff::Timestamp::now().as_second() - t.as_second() < 60);
        let state = match (started, exit) {
            (started, Some(exit)) => State::Exited { started, exit },
            (Some(started), None) => {
                if shim_alive || Path::new(&format!("/proc/{}", started.pid)).exists() {
                    State::Running(started)
                } else {
                    // The shim was killed and the container is gone too.
                    State::Exited {
                        started: Some(started),
                        exit: lost_exit("the container ended while its shim was gone"),
                    }
                }
            }
            (None, None) if shim_alive || starting => State::Created,
            (None, None) => State::Exited {
                started: None,
                exit: Exit {
                    exit_code: 128,
                    reason: "StartError".into(),
                    message: std::fs::read_to_string(state_dir.join("shim.log"))
                        .unwrap_or_else(|_| "the shim did not start".into()),
                    finished_at: crate::durable::now(),
                },
            },
        };
        // An end the shim could not record is recorded now, once: its time
        // must not move at every look.
        if let State::Exited { exit, .. } = &state {
            if !state_dir.join("exit").exists() {
                if let Ok(text) = serde_json::to_vec(exit) {
                    let _ = crate::durable::write_atomic(&state_dir.join("exit"), &text);
                }
            }
        }
        Some(ContainerStatus {
            id: id.to_owned(),
            meta,
            state,
        })
    }

    async fn runc(&self, args: &[&str]) -> Result<()> {
        let output = Command::new(&self.runc)
            .arg("--root")
            .arg(self.dir.join("runc"))
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .map_err(io("runc"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(Error::Command {
                command: format!("runc {}", args.join(" ")),
                message: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            })
        }
    }

    async fn wait_exited(&self, id: &str, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match self.status_of(id).map(|s| s.state) {
                None | Some(State::Exited { .. }) => return true,
                _ if tokio::time::Instant::now() >= deadline => return false,
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

fn lost_exit(message: &str) -> Exit {
    Exit {
        exit_code: 137,
        reason: "Error".into(),
        message: message.into(),
        finished_at: crate::durable::now(),
    }
}

impl Runtime for Runc {
    async fn run_sandbox(
        &self,
        pod_uid: &str,
        hostname: &str,
        netns: Option<PathBuf>,
    ) -> Result<SandboxPaths> {
        if let Some(existing) = self.sandbox(pod_uid) {
            return Ok(existing);
        }
        let dir = self.sandbox_dir(pod_uid);
        // Whatever a failed attempt left goes first.
        self.remove_sandbox(pod_uid).await?;
        std::fs::create_dir_all(&dir).map_err(io(format!("{}", dir.display())))?;
        let paths = SandboxPaths {
            netns,
            uts: dir.join("uts"),
            ipc: dir.join("ipc"),
        };
        for file in [&paths.uts, &paths.ipc] {
            std::fs::write(file, b"").map_err(io(format!("{}", file.display())))?;
        }
        let uts = format!("--uts={}", paths.uts.display());
        let ipc = format!("--ipc={}", paths.ipc.display());
        let output = Command::new("unshare")
            .args([&uts, &ipc, "hostname", hostname])
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .map_err(io("unshare"))?;
        if !output.status.success() {
            return Err(Error::Command {
                command: format!("unshare {uts} {ipc} hostname {hostname}"),
                message: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            });
        }
        let text = serde_json::to_vec(&paths).map_err(|e| Error::Config(e.to_string()))?;
        crate::durable::write_atomic(&dir.join("sandbox.json"), &text)
            .map_err(io(format!("{}", dir.display())))?;
        Ok(paths)
    }

    fn sandbox(&self, pod_uid: &str) -> Option<SandboxPaths> {
        let dir = self.sandbox_dir(pod_uid);
        let paths: SandboxPaths = read_json(&dir.join("sandbox.json"))?;
        // A namespace file is a mount of nsfs: another device than its directory.
        let dir_dev = std::fs::metadata(&dir).ok()?.dev();
        let mounted = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.dev() != dir_dev);
        (mounted(&paths.uts) && mounted(&paths.ipc)).then_some(paths)
    }

    async fn remove_sandbox(&self, pod_uid: &str) -> Result<()> {
        let dir = self.sandbox_dir(pod_uid);
        for file in ["uts", "ipc"] {
            let _ = umount2(&dir.join(file), MntFlags::MNT_DETACH);
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(Error::Io {
                    what: format!("{}", dir.display()),
                    source,
                })
            }
        }
        remove_cgroup(&self.pod_cgroup(pod_uid));
        Ok(())
    }

    async fn start_container(
        &self,
        sandbox: &SandboxPaths,
        meta: ContainerMeta,
        image: &Image,
        config: &ContainerConfig,
    ) -> Result<String> {
        let id = format!(
            "{:08x}{:08x}",
            crate::short_hash(&format!("{}/{}/{}", meta.pod_uid, meta.name, meta.attempt)),
            crate::short_hash(&crate::durable::now())
        );
        let dir = self.container_dir(&id);
        match self
            .prepare_and_spawn(&id, &dir, sandbox, &meta, image, config)
            .await
        {
            Ok(()) => {}
            Err(error) => {
                // Nothing half-made stays behind: no mount, no directory.
                let _ = umount2(&dir.join("rootfs"), MntFlags::MNT_DETACH);
                let _ = std::fs::remove_dir_all(&dir);
                return Err(error);
            }
        }
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            match self.status_of(&id).map(|s| s.state) {
                Some(State::Created) | None if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                _ => return Ok(id),
            }
        }
    }

    async fn stop_container(&self, id: &str, signal: Option<&str>, grace: Duration) -> Result<()> {
        self.stop(id, signal, grace).await
    }

    async fn exec(
        &self,
        id: &str,
        argv: &[String],
        timeout: Duration,
    ) -> Result<super::ExecResult> {
        self.exec_in(id, argv, timeout).await
    }

    async fn remove_container(&self, id: &str) -> Result<()> {
        self.remove(id).await
    }

    fn container(&self, id: &str) -> Option<ContainerStatus> {
        self.status_of(id)
    }

    async fn exec_session(
        &self,
        id: &str,
        argv: &[String],
        stdin: bool,
        tty: bool,
        size: Option<(u16, u16)>,
    ) -> Result<super::ExecSession> {
        self.exec_interactive(id, argv, stdin, tty, size).await
    }

    fn attach_socket(&self, id: &str) -> PathBuf {
        socket_dir(&self.tag).join(format!("{id}.attach"))
    }

    fn cgroup(&self, container: &ContainerStatus) -> Option<String> {
        Some(format!(
            "{}/{}",
            self.pod_cgroup(&container.meta.pod_uid),
            container.id
        ))
    }

    fn containers(&self) -> Vec<ContainerStatus> {
        let Ok(entries) = std::fs::read_dir(self.dir.join("containers")) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|id| self.status_of(id)))
            .collect()
    }
}

impl Runc {
    /// The container's directory, mount, bundle and shim.
    async fn prepare_and_spawn(
        &self,
        id: &str,
        dir: &Path,
        sandbox: &SandboxPaths,
        meta: &ContainerMeta,
        image: &Image,
        config: &ContainerConfig,
    ) -> Result<()> {
        let rootfs = dir.join("rootfs");
        let state = dir.join("state");
        for sub in [&rootfs, &dir.join("upper"), &dir.join("work"), &state] {
            std::fs::create_dir_all(sub).map_err(io(format!("{}", sub.display())))?;
        }
        // First: a directory with `meta.json` is listed (and cleaned up)
        // whatever happens next.
        write_json(&dir.join("meta.json"), meta)?;
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            image.rootfs.display(),
            dir.join("upper").display(),
            dir.join("work").display()
        );
        mount(
            Some("overlay"),
            &rootfs,
            Some("overlay"),
            MsFlags::empty(),
            Some(options.as_str()),
        )
        .map_err(|e| Error::Io {
            what: format!("overlay mount on {}", rootfs.display()),
            source: e.into(),
        })?;
        let cgroup = format!("{}/{id}", self.pod_cgroup(&meta.pod_uid));
        let spec = bundle::config(&rootfs, sandbox, config, &cgroup);
        write_json(&dir.join("config.json"), &spec)?;
        if let Some(parent) = meta.log_path.parent() {
            std::fs::create_dir_all(parent).map_err(io(format!("{}", parent.display())))?;
        }
        let shim_log = std::fs::File::create(state.join("shim.log")).map_err(io("shim log"))?;
        let mut child = Command::new(&self.portal)
            .arg("shim")
            .arg("--runc")
            .arg(&self.runc)
            .arg("--runc-root")
            .arg(self.dir.join("runc"))
            .args(["--id", id])
            .arg("--bundle")
            .arg(dir)
            .arg("--state")
            .arg(&state)
            .arg("--log")
            .arg(&meta.log_path)
            .arg("--attach-socket")
            .arg(self.attach_socket(id))
            .args(["--cgroup", &cgroup])
            .args(["--log-max-bytes", &self.log_limits.max_bytes.to_string()])
            .args(["--log-max-files", &self.log_limits.max_files.to_string()])
            .args(
                [
                    (config.stdin, "--stdin"),
                    (config.stdin_once, "--stdin-once"),
                    (config.tty, "--tty"),
                ]
                .into_iter()
                .filter_map(|(on, flag)| on.then_some(flag)),
            )
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(shim_log)
            // Its own process group: a signal to the agent's group does
            // not reach it. It must outlive the agent: never killed on drop.
            .process_group(0)
            .spawn()
            .map_err(io("starting the shim"))?;
        // Reap the shim when it ends while this agent runs.
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
        Ok(())
    }

    async fn stop(&self, id: &str, signal: Option<&str>, grace: Duration) -> Result<()> {
        if !matches!(
            self.status_of(id).map(|s| s.state),
            Some(State::Running(_) | State::Created)
        ) {
            return Ok(());
        }
        let stop_signal = self.status_of(id).and_then(|s| s.meta.stop_signal);
        let signal = signal.or(stop_signal.as_deref()).unwrap_or("SIGTERM");
        if !grace.is_zero() {
            // A container that already went away is fine.
            let _ = self.runc(&["kill", id, signal]).await;
            if self.wait_exited(id, grace).await {
                return Ok(());
            }
        }
        let _ = self.runc(&["kill", "--all", id, "SIGKILL"]).await;
        if !self.wait_exited(id, Duration::from_secs(10)).await {
            // The shim is gone and cannot record it: record it here.
            let text = serde_json::to_vec(&lost_exit("killed while its shim was gone"))
                .map_err(|e| Error::Config(e.to_string()))?;
            let state = self.container_dir(id).join("state");
            crate::durable::write_atomic(&state.join("exit"), &text)
                .map_err(io("container state"))?;
        }
        Ok(())
    }

    async fn remove(&self, id: &str) -> Result<()> {
        self.stop(id, Some("SIGKILL"), Duration::ZERO).await?;
        let _ = self.runc(&["delete", "--force", id]).await;
        let dir = self.container_dir(id);
        let attach = self.attach_socket(id);
        let _ = std::fs::remove_file(attach.with_extension("console"));
        let _ = std::fs::remove_file(attach);
        let _ = umount2(&dir.join("rootfs"), MntFlags::MNT_DETACH);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::Io {
                what: format!("{}", dir.display()),
                source,
            }),
        }
    }
}

/// Where this agent's containers' sockets live: a short path, as a Unix
/// socket's may not pass 107 bytes (data directories can be deep), only
/// root's to open.
pub fn socket_dir(tag: &str) -> PathBuf {
    PathBuf::from("/run/portal").join(tag)
}

fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_vec_pretty(value).map_err(|e| Error::Config(e.to_string()))?;
    crate::durable::write_atomic(path, &text).map_err(io(format!("{}", path.display())))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Whether `pid` runs and its command line mentions `word` (a reused pid
/// is not taken for our process).
fn process_runs(pid: i32, word: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|cmdline| cmdline.split(|b| *b == 0).any(|arg| arg == word.as_bytes()))
}

/// Removes a cgroup directory from every hierarchy that has it (runc
/// removes a container's own, not the pod's above it).
fn remove_cgroup(path: &str) {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    let mut roots: Vec<PathBuf> = hierarchies.flatten().map(|e| e.path()).collect();
    roots.push(PathBuf::from("/sys/fs/cgroup"));
    for root in roots {
        let _ = std::fs::remove_dir(root.join(path.trim_start_matches('/')));
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}
