//! `/proc/<pid>/mountinfo` (proc(5)): the mounts a process sees, for the
//! cgroup check at start and for `portal reset` (mounts under a data dir).

use std::path::Path;

use crate::Error;

/// One line of a `mountinfo` file: where, what and with which options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MountEntry {
    pub(crate) point: String,
    /// Per-mount options (`rw,nosuid,nodev,noexec,relatime`).
    pub(crate) options: String,
    pub(crate) fstype: String,
    pub(crate) source: String,
    /// Per-superblock options (`rw,cpu,cpuacct`, `rw,nsdelegate`).
    pub(crate) super_options: String,
}

pub(crate) fn read_mountinfo(path: &Path) -> Result<Vec<MountEntry>, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })?;
    Ok(text.lines().filter_map(parse_line).collect())
}

/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
/// (proc(5)): optional fields end at the lone `-`.
pub(crate) fn parse_line(line: &str) -> Option<MountEntry> {
    let (mount_part, super_part) = line.split_once(" - ")?;
    let fields: Vec<&str> = mount_part.split(' ').collect();
    let mut rest = super_part.split(' ');
    Some(MountEntry {
        point: unescape(fields.get(4)?),
        options: (*fields.get(5)?).to_owned(),
        fstype: rest.next()?.to_owned(),
        source: unescape(rest.next()?),
        super_options: rest.next().unwrap_or("").to_owned(),
    })
}

/// mountinfo writes space, tab, newline and backslash as octal escapes.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount points at or below `dir` that this process sees, deepest
/// first (the order they can be unmounted in).
pub(crate) fn mounts_under(dir: &Path) -> Result<Vec<String>, Error> {
    let prefix = dir.display().to_string();
    let mut points: Vec<String> = read_mountinfo(Path::new("/proc/self/mountinfo"))?
        .into_iter()
        .map(|m| m.point)
        .filter(|p| p == &prefix || p.starts_with(&format!("{prefix}/")))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.matches('/').count()));
    points.dedup();
    Ok(points)
}

/// A hybrid host's mountinfo (v1 controllers, a named hierarchy, v2), with
/// an escaped mount point: for this module's tests and the cgroup check's.
#[cfg(test)]
pub(crate) const SAMPLE: &str = "\
25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 25 0:24 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:8 - tmpfs tmpfs ro,mode=755
27 26 0:25 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
28 26 0:26 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,xattr,name=systemd
31 26 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,cpu,cpuacct
40 30 0:40 / /mnt/with\\040space rw - ext4 /dev/vdb rw
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mountinfo_with_optional_fields_and_escapes() {
        let entries: Vec<MountEntry> = SAMPLE.lines().filter_map(parse_line).collect();
        assert_eq!(entries.len(), 6);
        assert_eq!(entries[4].point, "/sys/fs/cgroup/cpu,cpuacct");
        assert_eq!(entries[4].fstype, "cgroup");
        assert_eq!(entries[4].super_options, "rw,cpu,cpuacct");
        assert_eq!(entries[5].point, "/mnt/with space");
        assert_eq!(parse_line("not a mountinfo line"), None);
    }
}
