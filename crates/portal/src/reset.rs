//! `portal reset`: stop and remove what Portal left on this machine after
//! it stopped (containers, pod namespaces, mounts, cgroups, the node's
//! network objects), as `k3s-killall.sh` and `k3s-uninstall.sh` do. The
//! work is `portal_agent::reset`; this checks that nothing still runs on
//! the data directory and says what went.

use std::path::{Path, PathBuf};

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
    if let Some(pid) = running_on(&args.data_dir) {
        return Err(Error::Usage(format!(
            "portal (pid {pid}) still runs on {}: stop it first",
            args.data_dir.display()
        )));
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
        portal_agent::reset::reset(&agent_dir, args.node_name.as_deref(), !args.keep_network).await;
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

/// A `portal` process (other than this one) that runs on `data_dir`.
fn running_on(data_dir: &Path) -> Option<u32> {
    let wanted = std::fs::canonicalize(data_dir).ok()?;
    let me = std::process::id();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_portal = args
            .first()
            .is_some_and(|a| Path::new(a).file_name().is_some_and(|n| n == "portal"));
        let runs = args
            .get(1)
            .is_some_and(|c| ["server", "agent", "node", "apiserver"].contains(&c.as_str()));
        if is_portal
            && runs
            && data_dir_of(&args).is_some_and(|d| same_dir(&entry.path(), &d, &wanted))
        {
            return Some(pid);
        }
    }
    None
}

/// The `--data-dir` value of a command line.
fn data_dir_of(args: &[String]) -> Option<String> {
    args.iter()
        .enumerate()
        .find_map(|(i, arg)| match arg.strip_prefix("--data-dir") {
            Some("") => args.get(i + 1).cloned(),
            Some(value) => value.strip_prefix('=').map(str::to_owned),
            None => None,
        })
}

/// Whether `dir` (relative to the process's working directory) is `wanted`.
fn same_dir(process: &Path, dir: &str, wanted: &Path) -> bool {
    let path = Path::new(dir);
    let path = if path.is_absolute() {
        path.to_path_buf()
    } else {
        match std::fs::read_link(process.join("cwd")) {
            Ok(cwd) => cwd.join(path),
            Err(_) => return false,
        }
    };
    std::fs::canonicalize(path).is_ok_and(|p| p == wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_data_dir_in_both_spellings() {
        let line = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            data_dir_of(&line(&["portal", "server", "--data-dir", "/d"])).as_deref(),
            Some("/d")
        );
        assert_eq!(
            data_dir_of(&line(&["portal", "node", "--data-dir=/n"])).as_deref(),
            Some("/n")
        );
        assert_eq!(data_dir_of(&line(&["portal", "server"])), None);
    }
}
