//! Applies image layers, in order, into one root filesystem directory:
//! gzip or plain tar, OCI whiteouts (`.wh.NAME` deletes NAME, `.wh..wh..opq`
//! empties its directory of what lower layers put there, wherever the
//! marker comes in the tar), ownership and modes kept, and nothing written
//! or removed outside the root (`tar`'s `unpack_in` refuses `..` and
//! symlinks out of it; whiteouts check their directory the same way).
//!
//! Known limit: `tar` refuses a file below an absolute symlink of a lower
//! layer (`var/run -> /run`, then `var/run/x`), since it resolves links on
//! the host; such images fail to unpack with a clear error.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read};
use std::path::{Component, Path, PathBuf};

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// Applies one layer (a file, gzip-compressed or not) onto `root`.
pub(super) fn apply_layer(layer: &Path, root: &Path) -> std::io::Result<()> {
    let file = std::fs::File::open(layer)?;
    let mut reader = BufReader::new(file);
    let gzip = reader.fill_buf()?.starts_with(&[0x1f, 0x8b]);
    let stream: Box<dyn Read> = if gzip {
        Box::new(flate2::read::GzDecoder::new(reader))
    } else {
        Box::new(reader)
    };
    let root = std::fs::canonicalize(root)?;
    let root = root.as_path();
    // What this layer wrote: an opaque marker spares it.
    let mut written: HashSet<PathBuf> = HashSet::new();
    let mut opaque: Vec<PathBuf> = Vec::new();
    let mut archive = tar::Archive::new(stream);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        let Some(relative) = clean(&path) else {
            continue;
        };
        let name = relative
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        let parent = relative.parent().map(Path::to_path_buf).unwrap_or_default();
        if name == OPAQUE {
            opaque.push(parent);
            continue;
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT) {
            if hidden.is_empty() || hidden == "." || hidden == ".." {
                continue;
            }
            if let Some(dir) = inside(root, &parent) {
                remove(&dir.join(hidden))?;
            }
            continue;
        }
        // Nothing is touched through a parent that leads out of the root
        // (a lower layer's `a -> /`, then `a/etc`): such an entry is refused.
        let parent_dir = match inside(root, &parent) {
            Some(dir) => Some(dir),
            None if std::fs::symlink_metadata(root.join(&parent)).is_ok() => {
                return Err(std::io::Error::other(format!(
                    "{}: its directory leads out of the image root",
                    relative.display()
                )));
            }
            // Not made yet: there is nothing to replace.
            None => None,
        };
        // A directory over a file (or the reverse) replaces it.
        if let Some(target) = parent_dir.map(|dir| dir.join(&name)) {
            if let Ok(existing) = std::fs::symlink_metadata(&target) {
                let is_dir = entry.header().entry_type().is_dir();
                if existing.is_dir() != is_dir {
                    remove(&target)?;
                }
            }
        }
        entry.unpack_in(root)?;
        written.insert(relative);
    }
    for parent in opaque {
        if let Some(dir) = inside(root, &parent) {
            empty_directory(&dir, &parent, &written)?;
        }
    }
    Ok(())
}

/// `root/relative` resolved, if it stays inside `root` (a lower layer's
/// symlink must not point a whiteout at the host).
fn inside(root: &Path, relative: &Path) -> Option<PathBuf> {
    let resolved = std::fs::canonicalize(root.join(relative)).ok()?;
    resolved.starts_with(root).then_some(resolved)
}

/// The path inside the root, without `.` or a leading `/`; `None` for a
/// path that climbs out (`..`).
fn clean(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            Component::ParentDir => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Removes what lower layers put in `dir` (`relative` in the image),
/// keeping what this layer wrote.
fn empty_directory(dir: &Path, relative: &Path, written: &HashSet<PathBuf>) -> std::io::Result<()> {
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry?;
                if !written.contains(&relative.join(entry.file_name())) {
                    remove(&entry.path())?;
                }
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(dir: &Path, name: &str, files: &[(&str, Option<&str>)]) -> PathBuf {
        let path = dir.join(name);
        let file = std::fs::File::create(&path).unwrap();
        let gz = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
        let mut builder = tar::Builder::new(gz);
        for (name, contents) in files {
            let mut header = tar::Header::new_gnu();
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            match contents {
                Some(text) => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_size(text.len() as u64);
                    header.set_mode(0o644);
                    builder
                        .append_data(&mut header, name, text.as_bytes())
                        .unwrap();
                }
                None => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_size(0);
                    header.set_mode(0o755);
                    builder.append_data(&mut header, name, &[][..]).unwrap();
                }
            }
        }
        builder.into_inner().unwrap().finish().unwrap();
        path
    }

    #[test]
    fn layers_stack_with_whiteouts() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let base = layer(
            dir.path(),
            "1",
            &[
                ("etc/", None),
                ("etc/a", Some("a1")),
                ("etc/b", Some("b1")),
                ("var/", None),
                ("var/cache/", None),
                ("var/cache/old", Some("x")),
            ],
        );
        let top = layer(
            dir.path(),
            "2",
            &[
                ("etc/a", Some("a2")),
                ("etc/.wh.b", Some("")),
                // The marker after a sibling of this layer: the sibling stays.
                ("var/cache/new", Some("y")),
                ("var/cache/.wh..wh..opq", Some("")),
            ],
        );
        apply_layer(&base, &root).unwrap();
        apply_layer(&top, &root).unwrap();
        assert_eq!(std::fs::read_to_string(root.join("etc/a")).unwrap(), "a2");
        assert!(!root.join("etc/b").exists());
        assert!(!root.join("var/cache/old").exists());
        assert_eq!(
            std::fs::read_to_string(root.join("var/cache/new")).unwrap(),
            "y"
        );
        assert!(!root.join("etc/.wh.b").exists());
    }

    #[test]
    fn nothing_outside_the_root_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let victim = dir.path().join("victim");
        std::fs::create_dir_all(root.join("")).unwrap();
        std::fs::create_dir_all(victim.join("keep")).unwrap();
        let path = dir.path().join("evil");
        let file = std::fs::File::create(&path).unwrap();
        let mut builder = tar::Builder::new(file);
        let mut link = tar::Header::new_gnu();
        link.set_entry_type(tar::EntryType::Symlink);
        link.set_size(0);
        link.set_mode(0o777);
        link.set_uid(0);
        link.set_gid(0);
        link.set_mtime(0);
        builder.append_link(&mut link, "a", &victim).unwrap();
        for name in ["a/keep", "a/.wh.keep", "a/.wh..wh..opq"] {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(1);
            header.set_mode(0o644);
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            builder.append_data(&mut header, name, &b"x"[..]).unwrap();
        }
        builder.into_inner().unwrap();
        assert!(apply_layer(&path, &root).is_err());
        assert!(
            victim.join("keep").is_dir(),
            "a directory outside the root was removed"
        );
    }

    #[test]
    fn paths_out_of_the_root_are_refused() {
        assert_eq!(clean(Path::new("../etc/passwd")), None);
        assert_eq!(
            clean(Path::new("/etc/./passwd")),
            Some(PathBuf::from("etc/passwd"))
        );
    }
}
