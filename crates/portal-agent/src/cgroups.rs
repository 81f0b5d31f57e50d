//! The cgroup hierarchies this node's containers go in, checked at start.
//!
//! runc finds the hierarchies in `/proc/self/mountinfo`. A process started
//! by `ip netns exec` runs in a mount namespace of its own in which a fresh
//! sysfs replaces `/sys`, so none is mounted there and every pod would fail
//! with "no cgroup mount found in mountinfo". In such a namespace (never
//! the machine's own) the agent mounts the hierarchies the machine's init
//! has, as it has them: the cgroup v1 controllers and named hierarchies on
//! their tmpfs (cgroup v1 and hybrid hosts), the unified v2 hierarchy, with
//! the same paths, options and controller symlinks. Mounting a hierarchy
//! again attaches to the same one, so the containers' cgroups are the
//! machine's; the mounts live in this namespace only and go with it.

use std::path::Path;

use nix::mount::{mount, MsFlags};

use crate::mountinfo::{read_mountinfo, MountEntry};
use crate::Error;

/// Where cgroup hierarchies are mounted on every distribution.
const ROOT: &str = "/sys/fs/cgroup";

/// What the check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hierarchies {
    /// Mounted where this process runs.
    Present,
    /// Mounted here now, from the machine's.
    Mounted,
}

/// Makes sure the cgroup hierarchies are mounted where this process runs
/// (see the module documentation); an error says what to do.
pub(crate) fn ensure_mounted() -> Result<Hierarchies, Error> {
    let ours = read_mountinfo(Path::new("/proc/self/mountinfo"))?;
    if ours.iter().any(|m| is_cgroup(&m.fstype)) {
        return Ok(Hierarchies::Present);
    }
    // Had this process the init's mount namespace, it would see the same
    // mounts: hierarchies there and none here prove a namespace of its own
    // (/proc/1/ns/mnt itself may not be open to inspection, in sandboxes).
    let machine = read_mountinfo(Path::new("/proc/1/mountinfo"))?;
    let wanted = machine_hierarchies(&machine);
    if !wanted.iter().any(|m| is_cgroup(&m.fstype)) {
        return Err(Error::Config(format!(
            "no cgroup hierarchy is mounted (none in /proc/self/mountinfo, none for the machine's init); mount them first, e.g. `mount -t cgroup2 none {ROOT}`"
        )));
    }
    for entry in &wanted {
        mount_again(entry)?;
        if entry.point == ROOT && entry.fstype == "tmpfs" {
            copy_symlinks()?;
        }
    }
    tracing::info!(
        hierarchies = wanted.iter().filter(|m| is_cgroup(&m.fstype)).count(),
        "mounted the machine's cgroup hierarchies in this mount namespace (it had none, as under `ip netns exec`)"
    );
    Ok(Hierarchies::Mounted)
}

fn is_cgroup(fstype: &str) -> bool {
    fstype == "cgroup" || fstype == "cgroup2"
}

/// The machine's cgroup mounts and the tmpfs holding them, parents first
/// (mountinfo's order).
fn machine_hierarchies(machine: &[MountEntry]) -> Vec<MountEntry> {
    machine
        .iter()
        .filter(|m| {
            let under = m.point == ROOT || m.point.starts_with(&format!("{ROOT}/"));
            under && (is_cgroup(&m.fstype) || (m.point == ROOT && m.fstype == "tmpfs"))
        })
        .cloned()
        .collect()
}

/// The flags of a mount's per-mount options; the tmpfs that only holds
/// mount points stays writable here, as its directories are made after it.
fn flags(entry: &MountEntry) -> MsFlags {
    let mut flags = MsFlags::empty();
    for option in entry.options.split(',') {
        flags |= match option {
            "ro" if entry.fstype != "tmpfs" => MsFlags::MS_RDONLY,
            "nosuid" => MsFlags::MS_NOSUID,
            "nodev" => MsFlags::MS_NODEV,
            "noexec" => MsFlags::MS_NOEXEC,
            "relatime" => MsFlags::MS_RELATIME,
            "noatime" => MsFlags::MS_NOATIME,
            _ => MsFlags::empty(),
        };
    }
    flags
}

/// The superblock options to mount with: which controllers (v1), named
/// hierarchies and features; not the read/write state, set per mount.
fn data(entry: &MountEntry) -> String {
    entry
        .super_options
        .split(',')
        .filter(|o| !o.is_empty() && *o != "rw" && *o != "ro")
        .collect::<Vec<_>>()
        .join(",")
}

fn mount_again(entry: &MountEntry) -> Result<(), Error> {
    let point = Path::new(&entry.point);
    std::fs::create_dir_all(point).map_err(|source| Error::Io {
        path: entry.point.clone(),
        source,
    })?;
    let data = data(entry);
    mount(
        Some(entry.source.as_str()),
        point,
        Some(entry.fstype.as_str()),
        flags(entry),
        (!data.is_empty()).then_some(data.as_str()),
    )
    .map_err(|errno| {
        Error::Config(format!(
            "mounting the cgroup hierarchy {} ({} {data}) in this mount namespace: {errno}",
            entry.point, entry.fstype
        ))
    })
}

/// The controller aliases beside the v1 hierarchies (`cpu -> cpu,cpuacct`),
/// as the machine has them.
fn copy_symlinks() -> Result<(), Error> {
    let machine = Path::new("/proc/1/root").join(ROOT.trim_start_matches('/'));
    let entries = match std::fs::read_dir(&machine) {
        Ok(entries) => entries,
        // runc finds hierarchies by their mounts; the aliases are for
        // people and tools that spell a controller alone.
        Err(error) => {
            tracing::warn!(%error, "cannot read the machine's cgroup controller aliases; left out");
            return Ok(());
        }
    };
    for entry in entries.flatten() {
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue; // a directory: a hierarchy, mounted on its own
        };
        let link = Path::new(ROOT).join(entry.file_name());
        if let Err(source) = std::os::unix::fs::symlink(&target, &link) {
            if source.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(Error::Io {
                    path: link.display().to_string(),
                    source,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mountinfo::{parse_line, SAMPLE};

    #[test]
    fn picks_the_tmpfs_and_every_hierarchy_parents_first() {
        let entries: Vec<MountEntry> = SAMPLE.lines().filter_map(parse_line).collect();
        let picked = machine_hierarchies(&entries);
        let points: Vec<&str> = picked.iter().map(|m| m.point.as_str()).collect();
        assert_eq!(
            points,
            [
                "/sys/fs/cgroup",
                "/sys/fs/cgroup/unified",
                "/sys/fs/cgroup/systemd",
                "/sys/fs/cgroup/cpu,cpuacct"
            ]
        );
        // Controllers and names are kept, the read/write state is not.
        assert_eq!(data(&picked[3]), "cpu,cpuacct");
        assert_eq!(data(&picked[2]), "xattr,name=systemd");
        assert_eq!(data(&picked[0]), "mode=755");
        // The holder tmpfs is made writable (its mount points come after).
        assert!(!flags(&picked[0]).contains(MsFlags::MS_RDONLY));
        assert!(flags(&picked[1]).contains(MsFlags::MS_NOEXEC | MsFlags::MS_NOSUID));
    }

    #[test]
    fn pure_v2_is_one_mount() {
        let line = "30 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot";
        let picked = machine_hierarchies(&[parse_line(line).expect("a mountinfo line")]);
        assert_eq!(picked.len(), 1);
        assert_eq!(data(&picked[0]), "nsdelegate,memory_recursiveprot");
    }
}
