//! `portal reset`: removes what a node agent left on the machine once its
//! process stopped, as `k3s-killall.sh` does. Stopping Portal leaves the
//! containers running by design (pods outlive a restart of the agent); this
//! is the one command that takes everything away:
//!
//! - this agent's containers, their shims and any process left in its
//!   cgroups; pod sandboxes, pod network namespaces and veths, the mounts
//!   under its data directory (volumes, root filesystems), its cgroups and
//!   its socket directory. These carry the agent's tag (its data directory
//!   and node name), so a second agent on the machine keeps its own;
//! - with `network`, what the node's network namespace holds for the one
//!   node that runs in it: the bridge, the VXLAN device, the routes to other
//!   nodes' pods (protocol [`routes::PROTO`]) and Portal's nftables tables.
//!
//! Each step goes on after a failure of another (it reports it), and a
//! second run finds nothing left to do.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use nix::mount::{umount2, MntFlags};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::netlink::Netlink;
use crate::network::{Network, BRIDGE};
use crate::runtime::runc::{socket_dir, Runc};
use crate::runtime::Runtime;
use crate::{mountinfo, routes, short_hash, vxlan, Error};

/// Where the cgroup hierarchies are.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The nftables tables (family, name) of the proxy (one per family), the
/// egress masquerade, host ports and network policies.
const TABLES: [(&str, &str); 7] = [
    ("ip", "portal"),
    ("ip6", "portal"),
    ("ip", "portal_egress"),
    ("ip6", "portal_egress"),
    ("ip", "portal_hostports"),
    ("ip", "portal_policy"),
    ("ip6", "portal_policy"),
];

/// The file the agent keeps its node name in (the tag needs it).
pub(crate) const NODE_NAME_FILE: &str = "node-name";

/// What a reset removed, and what it could not.
#[derive(Debug, Default)]
pub struct Report {
    pub containers: usize,
    pub processes: usize,
    pub sandboxes: usize,
    pub network_namespaces: usize,
    pub mounts: usize,
    pub cgroups: usize,
    pub links: Vec<String>,
    pub routes: usize,
    pub tables: Vec<String>,
    /// Steps that failed, with why.
    pub failures: Vec<String>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} containers, {} leftover processes, {} sandboxes, {} pod network namespaces, {} mounts, {} cgroups, {} routes",
            self.containers,
            self.processes,
            self.sandboxes,
            self.network_namespaces,
            self.mounts,
            self.cgroups,
            self.routes
        )?;
        if !self.links.is_empty() {
            write!(f, ", links {}", self.links.join(" "))?;
        }
        if !self.tables.is_empty() {
            write!(f, ", nftables tables {}", self.tables.join(" "))?;
        }
        Ok(())
    }
}

/// The file a running agent holds locked (`flock`) in its data directory:
/// how `portal reset` knows the directory is in use, however the agent
/// was started.
const LOCK_FILE: &str = "lock";

/// Locks the agent's data directory for as long as this process runs; an
/// error if another process holds it.
pub(crate) fn lock_for_life(agent_dir: &Path) -> Result<(), Error> {
    static HELD: parking_lot::Mutex<Vec<Flock<std::fs::File>>> =
        parking_lot::Mutex::new(Vec::new());
    let lock = try_lock(agent_dir)?.ok_or_else(|| {
        Error::Config(format!(
            "another portal process runs on {} (it holds {LOCK_FILE})",
            agent_dir.display()
        ))
    })?;
    HELD.lock().push(lock);
    Ok(())
}

/// The data directory's lock if no one holds it.
fn try_lock(agent_dir: &Path) -> Result<Option<Flock<std::fs::File>>, Error> {
    let path = agent_dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Some(lock)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, errno)) => Err(Error::Config(format!(
            "locking {}: {errno}",
            path.display()
        ))),
    }
}

/// Removes what the agent with data directory `agent_dir` left (see the
/// module documentation). `node_name` is the one it ran as, when its data
/// directory does not say (agents before this file was kept). Refused
/// while a process holds the directory's lock, and for the network while
/// another `portal` process runs in this network namespace.
pub async fn reset(
    agent_dir: &Path,
    node_name: Option<&str>,
    network: bool,
) -> Result<Report, Error> {
    let agent_dir = std::fs::canonicalize(agent_dir).map_err(|source| Error::Io {
        path: agent_dir.display().to_string(),
        source,
    })?;
    // Held to the end: no agent starts on the directory meanwhile.
    let _lock = try_lock(&agent_dir)?.ok_or_else(|| {
        Error::Config(format!(
            "a portal process (server, node or agent) still runs on {}: stop it first",
            agent_dir.display()
        ))
    })?;
    let _network = if network {
        Some(network_unused().ok_or_else(|| {
            Error::Config(
                "another portal process runs in this network namespace and uses its bridge and tables: stop it first, or pass --keep-network".into(),
            )
        })?)
    } else {
        None
    };
    let mut report = Report::default();
    let name = std::fs::read_to_string(agent_dir.join(NODE_NAME_FILE))
        .ok()
        .map(|n| n.trim().to_owned())
        .or_else(|| node_name.map(str::to_owned));
    match name {
        Some(name) => agent_objects(&agent_dir, &name, &mut report).await,
        None => report.failures.push(format!(
            "{}: no {NODE_NAME_FILE} file; give the node name (--node-name)",
            agent_dir.display()
        )),
    }
    if network {
        node_network(&mut report).await;
    }
    Ok(report)
}

/// The lock every Portal process that programs a network namespace (the
/// agent's bridge and routes, the proxy's tables) holds shared while it
/// runs; reset takes it exclusively before it removes them.
fn network_lock_path() -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let namespace = std::fs::metadata("/proc/self/ns/net").ok()?;
    Some(PathBuf::from("/run/portal").join(format!(
        "net-{}-{}.lock",
        namespace.dev(),
        namespace.ino()
    )))
}

fn open_network_lock() -> Option<std::fs::File> {
    let path = network_lock_path()?;
    std::fs::create_dir_all(path.parent()?).ok()?;
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .ok()
}

/// Marks this process as one that uses this network namespace's Portal
/// objects, for as long as it runs (best effort: without root there is
/// nothing of Portal's in the namespace to protect).
pub fn hold_network_lock() {
    static HELD: parking_lot::Mutex<Vec<Flock<std::fs::File>>> =
        parking_lot::Mutex::new(Vec::new());
    if let Some(file) = open_network_lock() {
        if let Ok(lock) = Flock::lock(file, FlockArg::LockSharedNonblock) {
            HELD.lock().push(lock);
        }
    }
}

/// Whether no other Portal process uses this network namespace: the
/// exclusive lock, held while the objects are removed.
fn network_unused() -> Option<Flock<std::fs::File>> {
    let file = open_network_lock()?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).ok()
}

/// The agent's tag, as it computes it at start.
pub(crate) fn tag(agent_dir: &Path, node_name: &str) -> String {
    format!(
        "{:08x}",
        short_hash(&format!("{}|{node_name}", agent_dir.display()))
    )
}

async fn agent_objects(agent_dir: &Path, node_name: &str, report: &mut Report) {
    let tag = tag(agent_dir, node_name);
    // Containers first (their processes hold mounts and namespaces).
    match Runc::new(agent_dir.join("runtime"), &tag) {
        Ok(runtime) => {
            for container in runtime.containers() {
                match runtime.remove_container(&container.id).await {
                    Ok(()) => report.containers += 1,
                    Err(error) => report
                        .failures
                        .push(format!("container {}: {error}", container.id)),
                }
            }
            for uid in entries(&agent_dir.join("runtime").join("sandboxes")) {
                match runtime.remove_sandbox(&uid).await {
                    Ok(()) => report.sandboxes += 1,
                    Err(error) => report.failures.push(format!("sandbox {uid}: {error}")),
                }
            }
        }
        Err(error) => report.failures.push(format!("container runtime: {error}")),
    }
    // Whatever still runs: shims whose container went, exec sessions.
    report.processes = kill_leftovers(agent_dir, &tag);
    // The range only matters for handing out addresses, not for freeing
    // them: the saved one, else any.
    let range = std::fs::read_to_string(agent_dir.join("pod-cidr"))
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .or_else(|| "0.0.0.0/32".parse().ok());
    let range: Option<portal_api::cidr::PodCidrs> = range;
    let pods = range.map(|range| Network::new(&tag, range, agent_dir.join("leases")));
    for uid in pods
        .as_ref()
        .map(Network::sandboxes_on_disk)
        .unwrap_or_default()
    {
        let Some(pods) = &pods else { break };
        match pods.remove_sandbox(&uid).await {
            Ok(()) => report.network_namespaces += 1,
            Err(error) => report
                .failures
                .push(format!("pod network namespace of {uid}: {error}")),
        }
    }
    match mountinfo::mounts_under(agent_dir) {
        Ok(points) => {
            for point in points {
                match umount2(Path::new(&point), MntFlags::MNT_DETACH) {
                    Ok(()) => report.mounts += 1,
                    Err(errno) => report.failures.push(format!("umount {point}: {errno}")),
                }
            }
        }
        Err(error) => report.failures.push(error.to_string()),
    }
    report.cgroups = remove_cgroups(&tag);
    match std::fs::remove_dir_all(socket_dir(&tag)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => report
            .failures
            .push(format!("{}: {e}", socket_dir(&tag).display())),
    }
}

/// The names in a directory (none if it is missing).
fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .collect()
}

/// This agent's cgroup directory in every hierarchy (v1 and v2).
fn cgroup_bases(tag: &str) -> Vec<PathBuf> {
    let root = Path::new(CGROUP_ROOT);
    let mut hierarchies: Vec<PathBuf> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && !p.is_symlink())
        .collect();
    hierarchies.push(root.to_path_buf());
    hierarchies
        .into_iter()
        .map(|h| h.join("portal").join(tag))
        .filter(|base| base.is_dir())
        .collect()
}

/// Every cgroup directory below `base`, deepest first, `base` last.
fn cgroup_tree(base: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![base.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            }
        }
        found.push(dir);
    }
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

/// Processes of this agent still alive: shims (their command line names
/// the data directory) and anything in its cgroups. Killed, and waited for
/// (bounded), since they hold the mounts and namespaces removed next.
fn kill_leftovers(agent_dir: &Path, tag: &str) -> usize {
    let mut pids: Vec<i32> = shims_of(agent_dir);
    for base in cgroup_bases(tag) {
        for dir in cgroup_tree(&base) {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            pids.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        }
    }
    pids.sort_unstable();
    pids.dedup();
    let me = std::process::id() as i32;
    pids.retain(|pid| *pid != me);
    for pid in &pids {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|pid| alive(*pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    pids.len()
}

fn shims_of(agent_dir: &Path) -> Vec<i32> {
    let marker = agent_dir.display().to_string();
    entries(Path::new("/proc"))
        .into_iter()
        .filter_map(|name| name.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
                args.contains(&b"shim".as_slice())
                    && args.iter().any(|a| {
                        let arg = String::from_utf8_lossy(a);
                        // This directory or below it, not `/data/n10` for `/data/n1`.
                        arg == marker || arg.starts_with(&format!("{marker}/"))
                    })
            })
        })
        .collect()
}

/// Running, not a zombie (a zombie has released what it held).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// Removes the agent's cgroups, deepest first; how many went.
fn remove_cgroups(tag: &str) -> usize {
    let mut removed = 0;
    for base in cgroup_bases(tag) {
        for dir in cgroup_tree(&base) {
            if std::fs::remove_dir(&dir).is_ok() {
                removed += 1;
            }
        }
        // `portal/` itself, once no other agent has a directory in it.
        if let Some(parent) = base.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
    removed
}

/// The node network namespace's objects (the one this process runs in).
async fn node_network(report: &mut Report) {
    match Netlink::connect() {
        Ok(node) => {
            for link in [BRIDGE, vxlan::DEVICE] {
                match node.link_index(link).await {
                    Ok(Some(_)) => match node.delete_link(link).await {
                        Ok(()) => report.links.push(link.to_owned()),
                        Err(error) => report.failures.push(format!("link {link}: {error}")),
                    },
                    Ok(None) => {}
                    Err(error) => report.failures.push(format!("link {link}: {error}")),
                }
            }
            match node.routes_of(routes::PROTO).await {
                Ok(found) => {
                    for (destination, prefix, _) in found {
                        match node.delete_route(destination, prefix, routes::PROTO).await {
                            Ok(()) => report.routes += 1,
                            Err(error) => report
                                .failures
                                .push(format!("route {destination}/{prefix}: {error}")),
                        }
                    }
                }
                Err(error) => report.failures.push(format!("routes: {error}")),
            }
        }
        Err(error) => report.failures.push(format!("netlink: {error}")),
    }
    for (family, table) in TABLES {
        match delete_table(family, table).await {
            Ok(true) => report.tables.push(format!("{family} {table}")),
            Ok(false) => {}
            Err(error) => report
                .failures
                .push(format!("nftables table {family} {table}: {error}")),
        }
    }
}

/// Deletes an nftables table of this namespace; whether there was one.
async fn delete_table(family: &str, table: &str) -> Result<bool, Error> {
    let nft = |args: Vec<&str>| {
        tokio::process::Command::new("nft")
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
    };
    let listed = nft(vec!["list", "table", family, table])
        .await
        .map_err(|source| Error::Io {
            path: "nft".into(),
            source,
        })?;
    if !listed.status.success() {
        return Ok(false);
    }
    let deleted = nft(vec!["delete", "table", family, table])
        .await
        .map_err(|source| Error::Io {
            path: "nft".into(),
            source,
        })?;
    if deleted.status.success() {
        Ok(true)
    } else {
        Err(Error::Config(
            String::from_utf8_lossy(&deleted.stderr).trim().to_owned(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tag_is_the_agents() {
        // The same hash of the same text as `start` computes.
        let dir = Path::new("/var/lib/portal/agent");
        assert_eq!(
            tag(dir, "node-1"),
            format!("{:08x}", short_hash("/var/lib/portal/agent|node-1"))
        );
    }

    #[test]
    fn a_cgroup_tree_is_removed_deepest_first() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let base = dir.path().join("tag");
        std::fs::create_dir_all(base.join("pod1/c1")).expect("dirs");
        std::fs::create_dir_all(base.join("pod2")).expect("dirs");
        let tree = cgroup_tree(&base);
        assert_eq!(tree.last(), Some(&base));
        assert_eq!(tree[0], base.join("pod1/c1"));
        for dir in &tree {
            std::fs::remove_dir(dir).expect("empty when its turn comes");
        }
    }
}
