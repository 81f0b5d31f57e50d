//! `portal node`: the usual worker command. Joins the cluster with the
//! node token (a certificate of its own, never the admin's), then runs
//! this node's agent (pods) and service proxy (Services on this node) in
//! one process, both as `system:node:NAME`.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::agent::{AgentOptions, JoinArgs};
use crate::{Error, ProxyMode, ProxyTiming};

#[derive(clap::Args, Debug)]
pub(crate) struct NodeArgs {
    #[command(flatten)]
    join: JoinArgs,
    /// Keeps the node's credentials (and the agent's files in DIR/agent).
    #[arg(long, default_value = "/var/lib/portal/node")]
    data_dir: PathBuf,
    /// This node's address (default: its first global IPv4 address), and
    /// its IPv6 one after a comma on a dual-stack network.
    #[arg(long, value_name = "IP[,IPv6]")]
    node_ip: Option<crate::agent::NodeIps>,
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    #[command(flatten)]
    agent: AgentOptions,
    /// The service proxy's data plane.
    #[arg(long, value_enum, default_value = "auto")]
    proxy_mode: ProxyMode,
    #[command(flatten)]
    proxy: ProxyTiming,
    /// Where to serve /metrics and /healthz (agent and proxy).
    #[arg(long, default_value = "127.0.0.1:10249")]
    metrics_bind: SocketAddr,
}

pub(crate) async fn node(args: NodeArgs) -> Result<(), Error> {
    if args.join.server.is_none() {
        return Err(Error::Usage(
            "portal node joins a cluster: --server URL and --token (or --token-file)".into(),
        ));
    }
    let name = args.agent.node_name();
    let joined = args
        .join
        .join(&name, &args.data_dir)
        .await?
        .ok_or_else(|| Error::Usage("--server is required".into()))?;
    let node_ip = match args.node_ip {
        Some(ips) => ips.v4,
        None => portal_agent::node_address().await,
    };
    let listener = tokio::net::TcpListener::bind(args.metrics_bind)
        .await
        .map_err(|source| Error::Metrics {
            addr: args.metrics_bind,
            source,
        })?;

    let client = portal_client::client_from_kubeconfig(&joined.kubeconfig, "portal-node").await?;
    // `portal reset` leaves this namespace's tables while it runs.
    portal_agent::reset::hold_network_lock();
    let proxy = portal_proxy::start(
        client.clone(),
        args.proxy_mode.config(
            Some(crate::agent::NodeIps {
                v4: node_ip,
                v6: args.node_ip.and_then(|ips| ips.v6),
            }),
            Some(name.clone()),
            &args.proxy,
        ),
    )
    .await?;
    let config = args.agent.config(
        args.data_dir.join("agent"),
        Some(node_ip),
        args.node_ip.and_then(|ips| ips.v6),
        &args.cluster_domain,
        Some(joined.client_ca),
    );
    let agent = portal_agent::start(Some(client), config).await?;

    let (proxy_metrics, agent_metrics) = (proxy.metrics.clone(), agent.metrics.clone());
    let (proxy_health, agent_health) = (proxy.metrics.clone(), agent.metrics.clone());
    tokio::spawn(crate::serve_metrics_and_health(
        listener,
        move || {
            let mut out = String::new();
            agent_metrics.encode_into(&mut out);
            proxy_metrics.encode_into(&mut out);
            let _ = prometheus_client::encoding::text::encode_eof(&mut out);
            out
        },
        move || proxy_health.healthy() && agent_health.healthy(),
    ));
    crate::until_signal_or_failure(
        &agent.tasks,
        "containers keep running, the proxy's rules stay",
    )
    .await
}
