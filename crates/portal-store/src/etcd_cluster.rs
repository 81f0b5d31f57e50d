//! Real etcd clusters for tests: `etcd` processes on loopback ports, in a
//! temporary directory, stopped (and their data removed) when dropped.
//!
//! Starting is made robust against a busy machine: ports are taken below
//! the kernel's ephemeral range (where outgoing connections could grab a
//! port between our check and etcd's bind), never twice in one process,
//! each cluster has its own token (members of two clusters can never join
//! each other), and a cluster whose member exits or stays unhealthy is
//! started again on fresh ports; a final failure shows the members' logs.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::missing_panics_doc,
    clippy::print_stderr
)]

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a member may take to answer healthy.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Whole-cluster start attempts before giving up.
const START_ATTEMPTS: usize = 3;
/// Ports below this are left to well-known services.
const LOWEST_PORT: u16 = 20_000;

/// One member: its process (if running) and its addresses.
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    process: Option<Child>,
}

/// An etcd cluster of one or more members on 127.0.0.1.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: tempfile::TempDir,
    token: String,
}

/// Ports this process has handed out (never given twice).
static TAKEN_PORTS: parking_lot::Mutex<Option<HashSet<u16>>> = parking_lot::const_mutex(None);

/// The first port of the kernel's ephemeral range (outgoing connections).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .filter(|start| *start > LOWEST_PORT + 1000)
        .unwrap_or(32_768)
}

/// A loopback port nobody listens on, outside the ephemeral range, not
/// handed out before by this process.
fn free_port() -> u16 {
    let span = u64::from(ephemeral_start() - LOWEST_PORT);
    let mut taken = TAKEN_PORTS.lock();
    let taken = taken.get_or_insert_with(HashSet::new);
    for _ in 0..1000 {
        let random = RandomState::new().hash_one((std::process::id(), Instant::now()));
        let port = LOWEST_PORT + u16::try_from(random % span).unwrap();
        if !taken.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            taken.insert(port);
            return port;
        }
    }
    panic!("no free loopback port between {LOWEST_PORT} and the ephemeral range");
}

/// The etcd binary: `$ETCD`, else `etcd` on the PATH (Debian's
/// `etcd-server`, installed by `scripts/setup`).
fn etcd_binary() -> PathBuf {
    std::env::var_os("ETCD").map_or_else(|| PathBuf::from("etcd"), PathBuf::from)
}

impl EtcdCluster {
    /// Starts `size` members and waits until every one answers; a start
    /// that fails is tried again on fresh ports.
    pub fn start(size: usize) -> Self {
        let mut failure = String::new();
        for attempt in 1..=START_ATTEMPTS {
            let mut cluster = Self::new(size);
            for i in 0..size {
                cluster.spawn(i);
            }
            match (0..size).try_for_each(|i| cluster.wait_healthy(i)) {
                Ok(()) => return cluster,
                Err(why) => {
                    failure = format!("attempt {attempt}: {why}\n{}", cluster.logs());
                    eprintln!("etcd cluster did not start, trying again: {failure}");
                }
            }
        }
        panic!(
            "etcd cluster of {size} did not start in {START_ATTEMPTS} attempts; last: {failure}"
        );
    }

    fn new(size: usize) -> Self {
        static CLUSTERS: AtomicU64 = AtomicU64::new(0);
        let members = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                process: None,
            })
            .collect();
        let number = CLUSTERS.fetch_add(1, Ordering::Relaxed);
        EtcdCluster {
            members,
            dir: tempfile::tempdir().unwrap(),
            token: format!("portal-test-{}-{number}", std::process::id()),
        }
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, index: usize) {
        let initial = self.initial_cluster();
        let data = self.dir.path().join(&self.members[index].name);
        let member = &self.members[index];
        let client = format!("http://127.0.0.1:{}", member.client_port);
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let child = Command::new(etcd_binary())
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.token])
            .args(["--logger", "zap", "--log-level", "error"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(self.log_file(index))
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {:?} ({e}): the etcd tests need etcd (Debian's etcd-server; scripts/setup installs it)",
                    etcd_binary()
                )
            });
        self.members[index].process = Some(child);
    }

    fn log_path(&self, index: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.log", self.members[index].name))
    }

    fn log_file(&self, index: usize) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(index))
            .unwrap()
    }

    /// The members' logs (errors only), for a failure message.
    fn logs(&self) -> String {
        (0..self.members.len())
            .map(|i| {
                let log = std::fs::read_to_string(self.log_path(i)).unwrap_or_default();
                format!("--- {} log:\n{}", self.members[i].name, log.trim_end())
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until member `index` says it is healthy; why not, if it exits
    /// or stays unhealthy for [`START_TIMEOUT`].
    fn wait_healthy(&mut self, index: usize) -> Result<(), String> {
        let port = self.members[index].client_port;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(child) = self.members[index].process.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!("etcd member {index} exited ({status})"));
                }
            }
            if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                use std::io::{Read, Write};
                let request = b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
                let mut answer = String::new();
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                if stream.write_all(request).is_ok()
                    && stream.read_to_string(&mut answer).is_ok()
                    && answer.contains("\"health\":\"true\"")
                {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "etcd member {index} not healthy after {} s",
                    START_TIMEOUT.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The members' client URLs, comma-separated (a `--datastore-endpoint`).
    pub fn endpoint(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Kills member `index` at once (SIGKILL).
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.members[index].process.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `index` again on its data and waits for it.
    pub fn restart(&mut self, index: usize) {
        self.kill(index);
        self.spawn(index);
        if let Err(why) = self.wait_healthy(index) {
            panic!("{why}\n{}", self.logs());
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
