//! Portal's service proxy (SPEC P1–P4): makes every Service's cluster IP,
//! node ports, external IPs and load-balancer addresses reach its ready
//! endpoints. Watches feed a change tracker; a bounded-frequency runner
//! hands the changed Services to a backend: nftables rules in the kernel,
//! or listeners in userspace. An API client like the DNS, so it also runs
//! against a real Kubernetes cluster.

mod command;
mod feed;
mod health;
pub mod metrics;
pub mod model;
pub mod nftables;
mod runner;
pub mod tracker;
pub mod userspace;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{watch, Notify};

pub use metrics::Metrics;

/// Where the data plane lives (`--mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// nftables when this process may program it, else userspace.
    Auto,
    Nftables,
    Userspace,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub mode: Mode,
    /// This node's address: userspace listeners bind it, and the kernel
    /// redirects Service traffic to them there.
    pub node_ip: Option<Ipv4Addr>,
    /// Its IPv6 address on a dual-stack node: the userspace listeners of
    /// IPv6 Service ports bind it.
    pub node_ip6: Option<std::net::Ipv6Addr>,
    /// This node's name: its endpoints are the local ones of traffic
    /// policies (`Local`); none treats no endpoint as local.
    pub node_name: Option<String>,
    pub min_sync_period: Duration,
    pub sync_period: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("nftables mode: {0}")]
    Nftables(#[from] nftables::Error),
    #[error("starting the proxy: {0}")]
    Start(String),
}

/// A running proxy.
#[derive(Debug)]
pub struct Proxy {
    /// The mode chosen (never `Auto`).
    pub mode: Mode,
    pub metrics: Arc<Metrics>,
    /// The watches and the sync loop: [`portal_client::Supervisor::failed`] answers when
    /// one of them stopped.
    pub tasks: portal_client::Supervisor,
}

/// Whether `nft` runs and may read the ruleset here (root or
/// CAP_NET_ADMIN in this network namespace).
fn nftables_usable() -> bool {
    nftables::Nft::chains(&mut nftables::NftCommand::default()).is_ok()
}

/// Starts the watches and the sync loop; they run until the process ends.
/// Must be called inside a tokio runtime.
pub async fn start(client: kube::Client, config: Config) -> Result<Proxy, Error> {
    // (`nft` runs as a process: off the runtime's threads.)
    let nft = tokio::task::spawn_blocking(nftables_usable)
        .await
        .unwrap_or(false);
    let mode = match config.mode {
        Mode::Auto if nft => Mode::Nftables,
        Mode::Auto => Mode::Userspace,
        mode => mode,
    };
    let backend: Box<dyn runner::Backend> = match mode {
        Mode::Nftables => {
            if !nft {
                // Surface nft's own message (missing binary, no permission).
                nftables::Nft::chains(&mut nftables::NftCommand::default())?;
            }
            Box::new(
                tokio::task::spawn_blocking(nftables::Tables::kernel)
                    .await
                    .map_err(|e| Error::Start(e.to_string()))?,
            )
        }
        _ => {
            let redirect = match config.node_ip {
                Some(_) if nft => true,
                Some(_) => {
                    tracing::info!("nftables unavailable: Services are reachable on the proxy's listeners only");
                    false
                }
                None => false,
            };
            let redirect6 = redirect
                && config.node_ip6.is_some()
                && tokio::task::spawn_blocking(nftables::ip6_usable)
                    .await
                    .unwrap_or(false);
            Box::new(userspace::Userspace::new(
                config.node_ip.unwrap_or(Ipv4Addr::UNSPECIFIED),
                config.node_ip6,
                (redirect, redirect6),
                tokio::runtime::Handle::current(),
            ))
        }
    };
    let metrics = Arc::new(Metrics::new(config.sync_period));
    let tracker = Arc::new(Mutex::new(tracker::Tracker::for_node(
        config.node_name.clone(),
    )));
    let wake = Arc::new(Notify::new());
    let (listed_tx, listed) = watch::channel(false);
    let feed = feed::Feed {
        tracker: tracker.clone(),
        wake: wake.clone(),
        metrics: metrics.clone(),
    };
    let tasks = portal_client::Supervisor::new();
    tasks.critical(
        "proxy watches",
        feed::run(client, feed, listed_tx, config.node_name.clone()),
    );
    tasks.critical(
        "proxy sync loop",
        runner::run(
            tracker,
            wake,
            listed,
            backend,
            metrics.clone(),
            runner::Timing {
                min_sync_period: config.min_sync_period,
                sync_period: config.sync_period,
            },
            health::HealthChecks::new(Ipv4Addr::UNSPECIFIED, metrics.clone()),
        ),
    );
    tracing::info!(?mode, "service proxy started");
    Ok(Proxy {
        mode,
        metrics,
        tasks,
    })
}

impl runner::Backend for nftables::Tables {
    fn sync(&mut self, changes: &tracker::Changes, full: bool) -> Result<(), String> {
        nftables::Tables::sync(self, changes, full).map_err(|e| e.to_string())
    }

    fn tampered(&mut self) -> bool {
        nftables::Tables::tampered(self)
    }

    fn wants_full(&self) -> bool {
        nftables::Tables::wants_full(self)
    }
}

impl<N: nftables::Nft + 'static> runner::Backend for nftables::Nftables<N> {
    fn sync(&mut self, changes: &tracker::Changes, full: bool) -> Result<(), String> {
        nftables::Nftables::sync(self, changes, full).map_err(|e| e.to_string())
    }

    fn tampered(&mut self) -> bool {
        nftables::Nftables::tampered(self)
    }
}
