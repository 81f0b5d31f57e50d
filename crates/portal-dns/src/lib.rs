//! Portal's cluster DNS (SPEC D2): authoritative for the cluster domain,
//! answering from an in-memory index of Services and EndpointSlices that
//! watch events keep current, so a change is answerable within
//! milliseconds. Names outside the cluster go to `--upstream` when given and
//! are REFUSED otherwise: never an open resolver. An API client like the
//! controllers, so it also serves a real Kubernetes cluster.

pub mod answer;
mod feed;
pub mod metrics;
pub mod publish;
pub mod records;
mod server;

use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::RwLock;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub use answer::{answer, Outcome, Settings, Transport};
pub use metrics::Metrics;
pub use records::Records;

/// How to run the DNS server.
#[derive(Clone, Debug)]
pub struct Config {
    /// UDP and TCP on the same address; port 0 picks a free one.
    pub bind: SocketAddr,
    /// `cluster.local`.
    pub cluster_domain: String,
    /// Where names outside the cluster domain go; none: REFUSED.
    pub upstream: Option<SocketAddr>,
    /// Seconds clients may cache answers (and negative answers).
    pub ttl: u32,
    /// UDP server threads.
    pub threads: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A running DNS server.
#[derive(Debug)]
pub struct Dns {
    /// Where it answers (UDP and TCP).
    pub addr: SocketAddr,
    pub metrics: Arc<Metrics>,
    /// The TCP server and the watches: [`portal_client::Supervisor::failed`]
    /// answers when one of them stopped.
    pub tasks: portal_client::Supervisor,
}

/// Starts the sockets and the watches; both keep running until the process
/// ends. Must be called inside a tokio runtime.
pub async fn start(client: kube::Client, config: Config) -> Result<Dns, Error> {
    let records = Arc::new(RwLock::new(Records::new(&config.cluster_domain)));
    let metrics = Arc::new(Metrics::new());
    let shared = Arc::new(server::Shared {
        records: records.clone(),
        metrics: metrics.clone(),
        settings: Settings {
            ttl: config.ttl,
            upstream: config.upstream.is_some(),
        },
        upstream: config.upstream,
        forwards: Semaphore::new(server::MAX_FORWARDS),
    });
    let bind_error = |source| Error::Bind {
        addr: config.bind,
        source,
    };
    // UDP and TCP share one port. With port 0 the free UDP port may be
    // taken for TCP (by any TCP socket): then try another.
    let mut attempts = 0;
    let (addr, sockets, listener) = loop {
        let (addr, sockets) = server::bind_udp(config.bind, config.threads).map_err(bind_error)?;
        match TcpListener::bind(addr).await {
            Ok(listener) => break (addr, sockets, listener),
            Err(error)
                if error.kind() == std::io::ErrorKind::AddrInUse
                    && config.bind.port() == 0
                    && attempts < 20 =>
            {
                attempts += 1;
            }
            Err(error) => return Err(bind_error(error)),
        }
    };
    server::serve_udp(sockets, &shared, &tokio::runtime::Handle::current()).map_err(bind_error)?;
    let tasks = portal_client::Supervisor::new();
    tasks.critical("DNS over TCP", server::serve_tcp(listener, shared));
    tasks.critical("DNS watches", feed::run(client, records, metrics.clone()));
    tracing::info!(%addr, domain = %config.cluster_domain, "DNS serving");
    Ok(Dns {
        addr,
        metrics,
        tasks,
    })
}
