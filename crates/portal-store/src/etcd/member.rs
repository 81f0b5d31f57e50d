//! One connection to one etcd member: a gRPC channel (TLS when asked for,
//! HTTP/2 keep-alives that notice a dead member) and the KV and Watch
//! clients on it, every request marked "leader required" as etcd's own
//! clients do, so a member cut off from the quorum answers at once instead
//! of hanging.

use std::time::Duration;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::api::etcdserverpb::kv_client::KvClient;
use super::api::etcdserverpb::watch_client::WatchClient;
use super::{EtcdOptions, MAX_MESSAGE};
use crate::{Error, Result};

/// How often a quiet connection is probed; also detects a dead member.
const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// How long connecting to one member may take before the next is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Adds etcd's `hasleader` metadata to a request.
type LeaderRequired =
    fn(tonic::Request<()>) -> std::result::Result<tonic::Request<()>, tonic::Status>;

/// A channel whose every request requires a leader.
pub(crate) type Service = InterceptedService<Channel, LeaderRequired>;

fn require_leader(
    mut request: tonic::Request<()>,
) -> std::result::Result<tonic::Request<()>, tonic::Status> {
    request.metadata_mut().insert(
        "hasleader",
        tonic::metadata::MetadataValue::from_static("true"),
    );
    Ok(request)
}

/// The clients of one member. Cheap to clone (one shared channel).
#[derive(Clone, Debug)]
pub(crate) struct Member {
    channel: Channel,
}

impl Member {
    /// A member at `endpoint` (`http://` or `https://host:port`). The
    /// connection is made at the first request, and made again after it
    /// breaks.
    pub(crate) fn new(endpoint: &str, options: &EtcdOptions) -> Result<Self> {
        Ok(Member {
            channel: endpoint_for(endpoint, options)?.connect_lazy(),
        })
    }

    pub(crate) fn kv(&self) -> KvClient<Service> {
        KvClient::with_interceptor(self.channel.clone(), require_leader as LeaderRequired)
            .max_decoding_message_size(MAX_MESSAGE)
    }

    pub(crate) fn watch(&self) -> WatchClient<Service> {
        WatchClient::with_interceptor(self.channel.clone(), require_leader as LeaderRequired)
            .max_decoding_message_size(MAX_MESSAGE)
    }
}

fn endpoint_for(url: &str, options: &EtcdOptions) -> Result<Endpoint> {
    let invalid = |why: String| Error::Backend(format!("etcd endpoint {url:?}: {why}"));
    let mut endpoint = Endpoint::from_shared(url.to_owned())
        .map_err(|e| invalid(e.to_string()))?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(options.request_timeout)
        .http2_keep_alive_interval(KEEP_ALIVE)
        .keep_alive_timeout(KEEP_ALIVE)
        .keep_alive_while_idle(true)
        .tcp_nodelay(true);
    if url.starts_with("https://") {
        let tls = options.tls.as_ref().ok_or_else(|| {
            Error::Backend("https:// etcd endpoints need the etcd CA (--etcd-cafile)".into())
        })?;
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        endpoint = endpoint
            .tls_config(config)
            .map_err(|e| invalid(e.to_string()))?;
    }
    Ok(endpoint)
}

/// A plain channel to an etcd endpoint, for tools that speak etcd's API
/// directly (the benchmarks' raw etcd anchor).
pub fn channel(endpoint: &str) -> Result<Channel> {
    let options = EtcdOptions {
        endpoints: vec![endpoint.to_owned()],
        tls: None,
        request_timeout: Duration::from_secs(30),
    };
    Ok(endpoint_for(endpoint, &options)?.connect_lazy())
}
