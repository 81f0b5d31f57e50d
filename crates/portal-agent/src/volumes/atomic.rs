//! Writes a volume's files so that a container never sees half an update:
//! the kubelet's `AtomicWriter`. Each version of the files is a hidden
//! directory (`..2026_11_27_10_00_00.123456789`); `..data` is a symlink to
//! the current one, swapped by `rename(2)`; each visible name is a symlink
//! through it (`key -> ..data/key`). Readers follow `key` and land in one
//! complete version, old or new. A container binds the volume's directory,
//! so it sees every swap; one that binds a single file (`subPath`) keeps
//! the version it started with, as in Kubernetes.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::os::unix::fs::{symlink, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// One file of a volume: its contents and mode bits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct File {
    pub contents: Vec<u8>,
    pub mode: u32,
}

/// A volume's files by relative path (`a`, `dir/b`).
pub type Payload = BTreeMap<PathBuf, File>;

const DATA: &str = "..data";
const DATA_TMP: &str = "..data_tmp";

/// Makes `dir` show `payload`, unless it already does. `owner`: the
/// uid/gid the files are given (`fsGroup`). Whether anything changed.
pub fn write(dir: &Path, payload: &Payload, owner: Option<(u32, u32)>) -> std::io::Result<bool> {
    for path in payload.keys() {
        if !is_plain_relative(path) {
            return Err(std::io::Error::other(format!(
                "{}: a volume path must be relative, without `..` and not start with `..`",
                path.display()
            )));
        }
    }
    std::fs::create_dir_all(dir)?;
    let current = std::fs::read_link(dir.join(DATA)).ok();
    if let Some(current) = &current {
        if same(&dir.join(current), payload)? {
            return Ok(false);
        }
    }
    // The new version, complete, before anyone can see it.
    let stamp = jiff::Timestamp::now().strftime("..%Y_%m_%d_%H_%M_%S.%f");
    let version = dir.join(stamp.to_string());
    std::fs::create_dir(&version)?;
    std::fs::set_permissions(&version, std::fs::Permissions::from_mode(0o755))?;
    for (path, file) in payload {
        let target = version.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(file.mode)
            .open(&target)?;
        out.write_all(&file.contents)?;
        // The umask must not narrow the mode asked for.
        out.set_permissions(std::fs::Permissions::from_mode(file.mode))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&out, Some(uid), Some(gid))?;
        }
    }
    // The swap: `..data_tmp -> version`, renamed over `..data`.
    let tmp = dir.join(DATA_TMP);
    let _ = std::fs::remove_file(&tmp);
    symlink(version.file_name().unwrap_or_default(), &tmp)?;
    std::fs::rename(&tmp, dir.join(DATA))?;
    // Visible names: one symlink per top-level entry; stale ones go.
    let wanted: BTreeSet<PathBuf> = payload.keys().filter_map(|p| top(p)).collect();
    for name in &wanted {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            symlink(Path::new(DATA).join(name), &link)?;
        }
    }
    for entry in std::fs::read_dir(dir)? {
        let name = PathBuf::from(entry?.file_name());
        if !name.to_string_lossy().starts_with("..") && !wanted.contains(&name) {
            let _ = std::fs::remove_file(dir.join(&name));
        }
    }
    if let Some(old) = current {
        let _ = std::fs::remove_dir_all(dir.join(old));
    }
    Ok(true)
}

/// Whether the version directory `dir` holds exactly `payload`.
fn same(dir: &Path, payload: &Payload) -> std::io::Result<bool> {
    let mut found = BTreeSet::new();
    collect(dir, Path::new(""), &mut found)?;
    if found.len() != payload.len() || !payload.keys().all(|p| found.contains(p)) {
        return Ok(false);
    }
    for (path, file) in payload {
        let target = dir.join(path);
        let mode = std::fs::metadata(&target)?.permissions().mode() & 0o7777;
        if mode != file.mode || std::fs::read(&target)? != file.contents {
            return Ok(false);
        }
    }
    Ok(true)
}

fn collect(dir: &Path, prefix: &Path, out: &mut BTreeSet<PathBuf>) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let relative = prefix.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            collect(&entry.path(), &relative, out)?;
        } else {
            out.insert(relative);
        }
    }
    Ok(())
}

/// The first component of a relative path.
fn top(path: &Path) -> Option<PathBuf> {
    match path.components().next()? {
        Component::Normal(name) => Some(PathBuf::from(name)),
        _ => None,
    }
}

/// Relative, every component plain, the first not starting with `..`
/// (those names are the writer's own).
fn is_plain_relative(path: &Path) -> bool {
    let plain = path.components().all(|c| matches!(c, Component::Normal(_)));
    let hidden = path
        .components()
        .next()
        .is_some_and(|c| c.as_os_str().to_string_lossy().starts_with(".."));
    plain && !hidden && !path.as_os_str().is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(entries: &[(&str, &str, u32)]) -> Payload {
        entries
            .iter()
            .map(|(path, text, mode)| {
                (
                    PathBuf::from(path),
                    File {
                        contents: text.as_bytes().to_vec(),
                        mode: *mode,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn versions_swap_whole() {
        let dir = tempfile::tempdir().unwrap();
        let vol = dir.path().join("vol");
        let first = payload(&[("a", "1", 0o644), ("conf/b", "2", 0o600)]);
        assert!(write(&vol, &first, None).unwrap());
        assert_eq!(std::fs::read_to_string(vol.join("a")).unwrap(), "1");
        assert_eq!(std::fs::read_to_string(vol.join("conf/b")).unwrap(), "2");
        let mode = std::fs::metadata(vol.join("conf/b"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            std::fs::read_link(vol.join("a")).unwrap(),
            PathBuf::from("..data/a")
        );
        let old = std::fs::read_link(vol.join(DATA)).unwrap();
        // The same payload again: nothing to do.
        assert!(!write(&vol, &first, None).unwrap());
        let second = payload(&[("a", "one", 0o644), ("c", "3", 0o644)]);
        assert!(write(&vol, &second, None).unwrap());
        assert_eq!(std::fs::read_to_string(vol.join("a")).unwrap(), "one");
        assert!(!vol.join("conf").exists(), "a stale name is removed");
        assert!(!vol.join(old).exists(), "the old version is removed");
        let names: BTreeSet<String> = std::fs::read_dir(&vol)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with("..2"))
            .collect();
        assert_eq!(
            names,
            ["..data", "a", "c"].iter().map(|s| s.to_string()).collect()
        );
    }

    #[test]
    fn paths_stay_inside() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["../x", "/etc/passwd", "..data", "a/../../b"] {
            assert!(
                write(dir.path(), &payload(&[(bad, "x", 0o644)]), None).is_err(),
                "{bad}"
            );
        }
    }
}
