//! The anchor: a single-member etcd on loopback with its default (fsync on
//! every commit) settings, in a directory of its own.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) struct Etcd {
    child: Child,
    pub(crate) endpoint: String,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(listener.local_addr().map_err(|e| e.to_string())?.port())
}

impl Etcd {
    pub(crate) async fn start(binary: &Path, dir: &Path) -> Result<Self, String> {
        let (client, peer) = (free_port()?, free_port()?);
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new(binary)
            .arg("--data-dir")
            .arg(dir)
            .args([
                "--name",
                "bench",
                "--listen-client-urls",
                &endpoint,
                "--advertise-client-urls",
                &endpoint,
            ])
            .args([
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
            ])
            .args([
                "--initial-cluster",
                &format!("bench={peer_url}"),
                "--log-level",
                "error",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{}: {e}", binary.display()))?;
        let etcd = Etcd { child, endpoint };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut c) = etcd.connect().await {
                if c.put("/bench/ready", "1", None).await.is_ok() {
                    return Ok(etcd);
                }
            }
            if Instant::now() > deadline {
                return Err("etcd did not start".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) async fn connect(&self) -> Result<etcd_client::Client, String> {
        etcd_client::Client::connect([self.endpoint.as_str()], None)
            .await
            .map_err(|e| e.to_string())
    }
}
