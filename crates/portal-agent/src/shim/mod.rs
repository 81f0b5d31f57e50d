//! The per-container shim (`portal shim`, started by the runtime): it makes
//! the container outlive the agent. It detaches (own session), becomes the
//! child subreaper, starts the container with `runc run -d` on pipes it
//! owns, copies the output into the CRI-format log, reaps the container,
//! and records how it ended in its state directory before deleting it:
//!
//! - `shim.pid`: the shim itself, for the agent to find it after a restart;
//! - `pid`: the container's init process (written by runc);
//! - `started`: when it started; `exit`: how it ended (see [`Exit`]).
//!
//! It also serves the container's attach socket (see [`attach`]).
//!
//! The shim is plain threads and blocking calls, no async runtime: it runs
//! in a fresh process that the agent spawned (no fork inside tokio).

pub mod attach;
pub mod console;
mod log;

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

pub use log::{LogLimits, LogWriter};

/// What `portal shim` is told by the runtime.
#[derive(Clone, Debug)]
pub struct ShimArgs {
    pub runc: PathBuf,
    /// runc's `--root`: one per agent.
    pub runc_root: PathBuf,
    pub id: String,
    pub bundle: PathBuf,
    /// Where the shim writes `shim.pid`, `started` and `exit`.
    pub state: PathBuf,
    /// The CRI-format log file of this container instance.
    pub log: PathBuf,
    /// Where the shim serves attach (see [`attach`]); its terminal's
    /// console socket is beside it (`.console`).
    pub attach_socket: PathBuf,
    pub log_limits: LogLimits,
    /// The container's cgroup (absolute), read for OOM kills at exit.
    pub cgroup: String,
    /// Keep the container's stdin open for attach (`stdin: true`).
    pub stdin: bool,
    /// The first attach that ends its input ends the container's.
    pub stdin_once: bool,
    /// The container runs on a terminal (`tty: true`).
    pub tty: bool,
}

/// How a container ended, as the shim recorded it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exit {
    pub exit_code: i32,
    /// `Completed`, `Error`, `OOMKilled`, or `StartError` (never ran).
    pub reason: String,
    #[serde(default)]
    pub message: String,
    /// RFC 3339 with nanoseconds.
    pub finished_at: String,
}

/// When the container started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    pub pid: i32,
    pub started_at: String,
}

/// Runs the shim to the container's end; the process exit code.
pub fn run(args: &ShimArgs) -> i32 {
    // Out of the agent's session and process group: a signal to the agent's
    // group (Ctrl-C in a terminal) must not reach the containers.
    let _ = nix::unistd::setsid();
    if let Err(error) = nix::sys::prctl::set_child_subreaper(true) {
        return fail(args, &format!("cannot become a subreaper: {error}"));
    }
    let me = std::process::id().to_string();
    if let Err(error) = crate::durable::write_atomic(&args.state.join("shim.pid"), me.as_bytes()) {
        return fail(args, &format!("cannot write its state: {error}"));
    }
    match supervise(args) {
        Ok(code) => code,
        Err(message) => fail(args, &message),
    }
}

fn supervise(args: &ShimArgs) -> Result<i32, String> {
    let (out_read, out_write) = nix::unistd::pipe().map_err(|e| format!("pipe: {e}"))?;
    let (err_read, err_write) = nix::unistd::pipe().map_err(|e| format!("pipe: {e}"))?;
    let pid_file = args.state.join("pid");
    let runc_log = args.state.join("runc.log");
    let _ = std::fs::remove_file(&args.attach_socket);
    let listener = std::os::unix::net::UnixListener::bind(&args.attach_socket)
        .map_err(|e| format!("attach socket {}: {e}", args.attach_socket.display()))?;
    let console_path = args.attach_socket.with_extension("console");
    let console = args
        .tty
        .then(|| console::ConsoleSocket::bind(&console_path))
        .transpose()
        .map_err(|e| format!("console socket: {e}"))?;
    let (stdin, input) = if args.stdin && !args.tty {
        let (read, write) = nix::unistd::pipe().map_err(|e| format!("pipe: {e}"))?;
        (Stdio::from(read), Some(std::fs::File::from(write)))
    } else {
        (Stdio::null(), None)
    };
    let mut runc = Command::new(&args.runc);
    runc.arg("--root")
        .arg(&args.runc_root)
        .arg("--log")
        .arg(&runc_log)
        .args(["--log-format", "json", "run", "--detach", "--pid-file"])
        .arg(&pid_file);
    if console.is_some() {
        runc.arg("--console-socket").arg(&console_path);
    }
    let status = runc
        .arg("--bundle")
        .arg(&args.bundle)
        .arg(&args.id)
        .stdin(stdin)
        .stdout(Stdio::from(out_write))
        .stderr(Stdio::from(err_write))
        .status()
        .map_err(|e| format!("cannot run {}: {e}", args.runc.display()))?;
    // The command holds the pipes' write ends: only the container may keep
    // them, or the output never ends.
    drop(runc);
    let writer = LogWriter::open(&args.log, args.log_limits)
        .map_err(|e| format!("log {}: {e}", args.log.display()))?;
    let writer = Arc::new(Mutex::new(writer));
    // On a terminal, output and input both go through its master end.
    let terminal = match (&console, status.success()) {
        (Some(console), true) => Some(console.receive().map_err(|e| format!("terminal: {e}"))?),
        _ => None,
    };
    let _ = std::fs::remove_file(&console_path);
    let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| format!("terminal: {e}"));
    let (input, terminal_output, terminal_control) = match &terminal {
        Some(master) => (
            Some(std::fs::File::from(dup(master)?)),
            Some(dup(master)?),
            Some(dup(master)?),
        ),
        None => (input, None, None),
    };
    let attach = attach::Attach::new(input, terminal_control, args.stdin_once);
    attach.serve(listener);
    let mut sources = vec![
        ("stdout", attach::STDOUT, out_read),
        ("stderr", attach::STDERR, err_read),
    ];
    sources.extend(terminal_output.map(|fd| ("stdout", attach::STDOUT, fd)));
    let copiers: Vec<_> = sources
        .into_iter()
        .map(|(stream, kind, fd)| {
            let (writer, attach) = (writer.clone(), attach.clone());
            std::thread::spawn(move || copy(fd, stream, &writer, |data| attach.publish(kind, data)))
        })
        .collect();
    drop(terminal);
    if !status.success() {
        // runc ends the container it could not start; its reason is in
        // its log (e.g. the executable does not exist).
        for copier in copiers {
            let _ = copier.join();
        }
        let message = runc_error(&runc_log).unwrap_or_else(|| format!("runc exited with {status}"));
        record_exit(args, 128, "StartError", &message);
        delete(args);
        return Ok(1);
    }
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or("runc wrote no pid file")?;
    let started = Started {
        pid,
        started_at: crate::durable::now(),
    };
    let text = serde_json::to_vec(&started).map_err(|e| e.to_string())?;
    crate::durable::write_atomic(&args.state.join("started"), &text)
        .map_err(|e| format!("state: {e}"))?;
    let code = reap(Pid::from_raw(pid));
    // The output ends with the container (its pid namespace died with it).
    for copier in copiers {
        let _ = copier.join();
    }
    attach.close();
    let reason = if oom_killed(&args.cgroup) {
        "OOMKilled"
    } else if code == 0 {
        "Completed"
    } else {
        "Error"
    };
    record_exit(args, code, reason, "");
    delete(args);
    Ok(0)
}

/// Waits for the container's init process; its exit code (128 + signal
/// when killed). Other orphans that land on the shim are reaped as well.
fn reap(container: Pid) -> i32 {
    loop {
        match waitpid(None, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == container => return code,
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == container => {
                return 128 + signal as i32
            }
            Ok(_) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            // Not our child after all (it was never reparented here): poll.
            Err(_) => {
                while Path::new(&format!("/proc/{container}")).exists() {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                return 255;
            }
        }
    }
}

fn copy(fd: OwnedFd, stream: &'static str, writer: &Mutex<LogWriter>, publish: impl Fn(&[u8])) {
    let mut pipe = std::fs::File::from(fd);
    let mut buffer = vec![0u8; log::MAX_LINE];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let n = match pipe.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        publish(&buffer[..n]);
        pending.extend_from_slice(&buffer[..n]);
        let mut lines = writer.lock();
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            lines.line(stream, &pending[..end], true);
            pending.drain(..=end);
        }
        // A line longer than the limit is split into partial (P) records.
        while pending.len() >= log::MAX_LINE {
            lines.line(stream, &pending[..log::MAX_LINE], false);
            pending.drain(..log::MAX_LINE);
        }
    }
    if !pending.is_empty() {
        writer.lock().line(stream, &pending, true);
    }
}

/// Whether the kernel OOM-killed a process of the cgroup (v1 `memory`
/// controller's `oom_control`, or v2 `memory.events`).
fn oom_killed(cgroup: &str) -> bool {
    let count = |path: String, key: &str| {
        std::fs::read_to_string(path).ok().and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
    };
    let v1 = count(
        format!("/sys/fs/cgroup/memory{cgroup}/memory.oom_control"),
        "oom_kill ",
    );
    let v2 = count(format!("/sys/fs/cgroup{cgroup}/memory.events"), "oom_kill ");
    v1.or(v2).unwrap_or(0) > 0
}

/// The last error runc logged (JSON lines with `level` and `msg`).
fn runc_error(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines().rev().find_map(|line| {
        let entry: serde_json::Value = serde_json::from_str(line).ok()?;
        (entry["level"] == "error")
            .then(|| entry["msg"].as_str().map(str::to_owned))
            .flatten()
    })
}

fn record_exit(args: &ShimArgs, exit_code: i32, reason: &str, message: &str) {
    let exit = Exit {
        exit_code,
        reason: reason.into(),
        message: message.into(),
        finished_at: crate::durable::now(),
    };
    if let Ok(text) = serde_json::to_vec(&exit) {
        let _ = crate::durable::write_atomic(&args.state.join("exit"), &text);
    }
}

/// Removes the stopped container from runc (and with it its cgroup).
fn delete(args: &ShimArgs) {
    let _ = Command::new(&args.runc)
        .arg("--root")
        .arg(&args.runc_root)
        .args(["delete", "--force", &args.id])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn fail(args: &ShimArgs, message: &str) -> i32 {
    record_exit(args, 128, "StartError", message);
    delete(args);
    1
}
