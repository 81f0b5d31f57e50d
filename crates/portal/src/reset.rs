//! `portal reset`: stop and remove what Portal left on this machine after
//! it stopped (containers, pod namespaces, mounts, cgroups, the node's
//! network objects), as `k3s-killall.sh` and `k3s-uninstall.sh` do. The
//! work, and the checks that nothing still runs on the directory or in the
//! network namespace, are `portal_agent::reset`'s; this says what went.

use std::path::PathBuf;

use crate::Error;

#[derive(clap::Args, Debug)]
pub(crate) struct ResetArgs {
    /// The data directory `portal server`, `portal node` or `portal agent`
    /// ran with.
    #[arg(long)]
    data_dir: PathBuf,
    /// The node name it ran as, if its data directory does not say (older
    /// data directories).
    #[arg(long)]
    node_name: Option<String>,
    /// Leave the network objects of this network namespace (the bridge,
    /// the VXLAN device, pod routes, Portal's nftables tables) in place: for
    /// when another node runs in the same namespace.
    #[arg(long)]
    keep_network: bool,
    /// Also delete the data directory: the cluster's state, certificates
    /// and images. Without it, `portal server` on it starts the same
    /// cluster again (its pods are started anew).
    #[arg(long)]
    remove_data: bool,
}

pub(crate) async fn reset(args: ResetArgs) -> Result<(), Error> {
    if !crate::running_as_root() {
        return Err(Error::Usage(
            "portal reset needs root (it stops containers and removes namespaces, mounts and cgroups)".into(),
        ));
    }
    // `portal server` and `portal node` keep the agent's data in `agent/`,
    // `portal agent` in the directory itself.
    let nested = args.data_dir.join("agent");
    let agent_dir = if nested.is_dir() {
        nested
    } else {
        args.data_dir.clone()
    };
    let report =
        portal_agent::reset::reset(&agent_dir, args.node_name.as_deref(), !args.keep_network)
            .await?;
    tracing::info!("removed {report}");
    if args.remove_data {
        match std::fs::remove_dir_all(&args.data_dir) {
            Ok(()) => tracing::info!(dir = %args.data_dir.display(), "removed the data directory"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(Error::Usage(format!(
                    "removing {}: {e}",
                    args.data_dir.display()
                )))
            }
        }
    }
    if report.failures.is_empty() {
        Ok(())
    } else {
        Err(Error::Usage(format!(
            "some of it could not be removed: {}",
            report.failures.join("; ")
        )))
    }
}
