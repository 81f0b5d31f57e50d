//! Image paths resolved inside the image root, as `openat2(RESOLVE_IN_ROOT)`
//! and Go's `securejoin` (which containerd uses) resolve them: a symlink met
//! on the way is followed with the root as `/`, so `var/run -> /run` leads
//! to `root/run`, and `..` at the root stays at the root. Done in userspace
//! on paths (lstat, readlink): layers are applied by the agent alone, before
//! any container can touch the root, so nothing changes under our feet.

use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};

/// Symlinks followed in one resolution before giving up (`ELOOP`), as
/// `securejoin` does.
const MAX_FOLLOWS: usize = 255;

/// An entry name relative to the root: `.` and a leading `/` dropped, `..`
/// applied lexically (Go's `filepath.Clean`, as containerd does). A name
/// that climbs out of the root is refused. Empty for the root itself.
pub(super) fn clean(name: &Path) -> io::Result<PathBuf> {
    let mut out = PathBuf::new();
    for component in name.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                if !out.pop() {
                    return Err(refused("the path climbs out of the image root"));
                }
            }
        }
    }
    Ok(out)
}

/// `path` (relative to `root`, as [`clean`] makes it) resolved inside the
/// root: every component that is a symlink is replaced by its target, read
/// with the root as `/`. The result is relative to the root, and every
/// component of it that exists is a real directory or the last component;
/// components that do not exist are kept as named (nothing is created).
pub(super) fn resolve(root: &Path, path: &Path) -> io::Result<PathBuf> {
    let mut resolved = PathBuf::new();
    // Components still to walk, the next one last.
    let mut pending: Vec<OsString> = Vec::new();
    push_components(&mut pending, path);
    let mut follows = 0;
    while let Some(part) = pending.pop() {
        if part == ".." {
            // `resolved` holds no symlinks, so its parent is lexical; at the
            // root this is a no-op, as in the kernel.
            resolved.pop();
            continue;
        }
        let candidate = resolved.join(&part);
        match std::fs::symlink_metadata(root.join(&candidate)) {
            Ok(meta) if meta.file_type().is_symlink() => {
                follows += 1;
                if follows > MAX_FOLLOWS {
                    return Err(rustix::io::Errno::LOOP.into());
                }
                let target = std::fs::read_link(root.join(&candidate))?;
                if target.as_os_str().is_empty() {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("{}: empty symbolic link", candidate.display()),
                    ));
                }
                if target.is_absolute() {
                    resolved = PathBuf::new();
                }
                push_components(&mut pending, &target);
            }
            Ok(_) => resolved = candidate,
            // Not there (or below a non-directory): kept as named; making
            // it is the caller's business.
            Err(e) if is_missing(&e) => resolved = candidate,
            Err(e) => return Err(e),
        }
    }
    Ok(resolved)
}

/// Makes `relative` (resolved by [`resolve`]) a directory in `root`, with
/// its missing components made `0755` as containerd makes them. Something
/// else than a directory on the way is an error, not replaced.
pub(super) fn make_directories(root: &Path, relative: &Path) -> io::Result<()> {
    let mut path = root.to_path_buf();
    for component in relative.components() {
        path.push(component);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => continue,
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::NotADirectory,
                    format!("{}: not a directory", relative.display()),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mode = rustix::fs::Mode::from_raw_mode(0o755);
        rustix::fs::mkdirat(rustix::fs::CWD, &path, mode)?;
        // Not left to the umask.
        rustix::fs::chmodat(rustix::fs::CWD, &path, mode, rustix::fs::AtFlags::empty())?;
    }
    Ok(())
}

fn push_components(pending: &mut Vec<OsString>, path: &Path) {
    let start = pending.len();
    for component in path.components() {
        match component {
            Component::Normal(part) => pending.push(part.to_owned()),
            Component::ParentDir => pending.push("..".into()),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    pending[start..].reverse();
}

fn is_missing(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

/// An entry the unpacker will not apply.
pub(super) fn refused(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_cleaned_and_climbing_refused() {
        assert_eq!(
            clean(Path::new("/etc/./passwd")).unwrap(),
            Path::new("etc/passwd")
        );
        assert_eq!(clean(Path::new("a/../b")).unwrap(), Path::new("b"));
        assert_eq!(clean(Path::new("./")).unwrap(), Path::new(""));
        assert!(clean(Path::new("../etc/passwd")).is_err());
        assert!(clean(Path::new("a/../../etc")).is_err());
    }

    #[test]
    fn symlinks_resolve_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("usr/lib")).unwrap();
        std::os::unix::fs::symlink("/usr/lib", root.join("lib")).unwrap();
        std::os::unix::fs::symlink("../../../../..", root.join("up")).unwrap();
        std::os::unix::fs::symlink("loop", root.join("loop")).unwrap();
        let resolve = |p: &str| resolve(root, Path::new(p));
        assert_eq!(resolve("lib/x").unwrap(), Path::new("usr/lib/x"));
        assert_eq!(resolve("up/etc").unwrap(), Path::new("etc"));
        assert_eq!(resolve("missing/../lib").unwrap(), Path::new("usr/lib"));
        assert!(resolve("loop/x").is_err());
    }
}
