//! Real etcd clusters for tests: `etcd` processes on loopback ports, in a
//! temporary directory, stopped (and their data removed) when dropped.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::missing_panics_doc)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The etcd binary: `$ETCD`, else `etcd` on the PATH (Debian's
/// `etcd-server`, installed by `scripts/setup`).
fn etcd_binary() -> PathBuf {
    std::env::var_os("ETCD").map_or_else(|| PathBuf::from("etcd"), PathBuf::from)
}

impl EtcdCluster {
    /// Starts `size` members and waits until every one answers.
    pub fn start(size: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let members: Vec<Member> = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                process: None,
            })
            .collect();
        let token = format!("portal-test-{}", std::process::id());
        let mut cluster = EtcdCluster {
            members,
            dir,
            token,
        };
        for i in 0..size {
            cluster.spawn(i);
        }
        for i in 0..size {
            cluster.wait_healthy(i);
        }
        cluster
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
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {:?} ({e}): the etcd tests need etcd (Debian's etcd-server; scripts/setup installs it)",
                    etcd_binary()
                )
            });
        self.members[index].process = Some(child);
    }

    fn wait_healthy(&self, index: usize) {
        let port = self.members[index].client_port;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                use std::io::{Read, Write};
                let request = b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
                let mut answer = String::new();
                if stream.write_all(request).is_ok()
                    && stream.read_to_string(&mut answer).is_ok()
                    && answer.contains("\"health\":\"true\"")
                {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "etcd member {index} not healthy after 30 s"
            );
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
        self.wait_healthy(index);
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
