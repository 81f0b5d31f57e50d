//! The anchor: a single-member etcd on loopback with its default (fsync on
//! every commit) settings, in a directory of its own.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use portal_store::etcd::api::etcdserverpb::kv_client::KvClient;
use portal_store::etcd::api::etcdserverpb::watch_client::WatchClient;
use portal_store::etcd::api::etcdserverpb::{
    watch_request, PutRequest, RangeRequest, WatchCreateRequest, WatchRequest, WatchResponse,
};
use tonic::transport::Channel;

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
                if c.put("/bench/ready", "1").await.is_ok() {
                    return Ok(etcd);
                }
            }
            if Instant::now() > deadline {
                return Err("etcd did not start".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A new connection of its own (one HTTP/2 connection per client, as
    /// each of etcd's benchmark clients has).
    pub(crate) async fn connect(&self) -> Result<Client, String> {
        let channel = portal_store::etcd::channel(&self.endpoint).map_err(|e| e.to_string())?;
        Ok(Client {
            kv: KvClient::new(channel.clone()),
            watch: WatchClient::new(channel),
        })
    }
}

/// etcd's KV and Watch services on one connection, used raw: the anchor is
/// etcd itself, not a client library's conveniences.
pub(crate) struct Client {
    kv: KvClient<Channel>,
    watch: WatchClient<Channel>,
}

impl Client {
    pub(crate) async fn put(
        &mut self,
        key: impl Into<String>,
        value: impl Into<Bytes>,
    ) -> Result<(), String> {
        let request = PutRequest {
            key: key.into().into_bytes(),
            value: value.into(),
            ..Default::default()
        };
        self.kv.put(request).await.map_err(|e| e.to_string())?;
        Ok(())
    }

    /// How many keys start with `prefix` (all read, values included).
    pub(crate) async fn range_prefix(&mut self, prefix: &str) -> Result<usize, String> {
        let request = RangeRequest {
            key: prefix.as_bytes().to_vec(),
            range_end: prefix_end(prefix),
            ..Default::default()
        };
        let reply = self.kv.range(request).await.map_err(|e| e.to_string())?;
        Ok(reply.into_inner().kvs.len())
    }

    /// The events under `prefix` from now on.
    pub(crate) async fn watch_prefix(
        &mut self,
        prefix: &str,
    ) -> Result<tonic::Streaming<WatchResponse>, String> {
        let create = WatchCreateRequest {
            key: prefix.as_bytes().to_vec(),
            range_end: prefix_end(prefix),
            ..Default::default()
        };
        let request = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(create)),
        };
        // Kept open: a half-closed request side ends the watch.
        let requests = futures_util::StreamExt::chain(
            futures_util::stream::iter([request]),
            futures_util::stream::pending(),
        );
        let reply = self
            .watch
            .watch(requests)
            .await
            .map_err(|e| e.to_string())?;
        Ok(reply.into_inner())
    }
}

fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1; // every prefix here ends in '/'
    }
    end
}
