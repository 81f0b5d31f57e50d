//! Applies image layers, in order, into one root filesystem directory, the
//! way containerd applies them (`archive.Apply`):
//!
//! - gzip, zstd or plain tar, told apart by magic bytes, streamed;
//! - every path resolved *inside* the root (`unpack/resolve.rs`): a symlink a lower
//!   layer (or this one) wrote is followed with the root as `/`, so Debian's
//!   `var/run -> /run` and a later `var/run/nginx/` give `root/run/nginx`,
//!   where resolving on the host would leave the root or fail. The last
//!   component is never followed: it is what the entry replaces;
//! - regular files, directories (an existing one kept, its metadata set),
//!   symlinks (target stored as written), hard links (to a file already in
//!   the root, this layer's or a lower one's), FIFOs; device nodes skipped,
//!   as containerd does when it cannot make them;
//! - owner, mode, mtime, and `SCHILY.xattr.*` extended attributes (file
//!   capabilities: Debian's `ping`), set after the owner since a chown
//!   clears `security.capability`; directory mtimes once the layer is done;
//! - OCI whiteouts: `.wh.NAME` removes NAME, `.wh..wh..opq` empties its
//!   directory of what lower layers put there, wherever the marker comes in
//!   the tar.
//!
//! Nothing outside the root is created, written or removed: an entry name
//! or hard link that climbs out with `..`, or an absolute hard link, is
//! refused with an error, and files are created with `O_EXCL|O_NOFOLLOW`
//! after removing what was there, so a symlink is never written through.

mod decompress;
mod resolve;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::Metadata;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, Timespec, Timestamps, CWD};
use tar::EntryType;

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";
const XATTR: &[u8] = b"SCHILY.xattr.";

/// Applies one layer (a file: gzip, zstd or plain tar) onto `root`.
pub(super) fn apply_layer(layer: &Path, root: &Path) -> io::Result<()> {
    let mut archive = tar::Archive::new(decompress::open(layer)?);
    let mut layer = Layer {
        root: std::fs::canonicalize(root)?,
        written: HashSet::new(),
        holding: HashSet::new(),
        directories: Vec::new(),
    };
    for entry in archive.entries()? {
        let mut entry = entry?;
        let name = entry.path()?.into_owned();
        layer
            .apply(&mut entry, &name)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", name.display())))?;
    }
    layer.finish()?;
    // The rest of the stream (the tar's padding) is read too, as containerd
    // does: a corrupt end (gzip CRC, zstd checksum) is an error.
    io::copy(&mut archive.into_inner(), &mut io::sink())?;
    Ok(())
}

/// One layer being applied.
struct Layer {
    root: PathBuf,
    /// What this layer wrote (resolved, relative to the root): an opaque
    /// marker spares it.
    written: HashSet<PathBuf>,
    /// The directories above what it wrote, spared the same way.
    holding: HashSet<PathBuf>,
    /// Directories and their mtimes, set last (entries inside change them).
    directories: Vec<(PathBuf, Timestamps)>,
}

impl Layer {
    fn apply<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>, name: &Path) -> io::Result<()> {
        let kind = entry_type(entry);
        let relative = resolve::clean(name)?;
        // `./`: the root's own metadata is not the layer's to change.
        let Some(name) = relative.file_name().map(OsStr::to_owned) else {
            return Ok(());
        };
        let parent = resolve::resolve(&self.root, relative.parent().unwrap_or(Path::new("")))?;
        if name == OPAQUE {
            return self.opaque(&parent);
        }
        if let Some(hidden) = name.as_bytes().strip_prefix(WHITEOUT.as_bytes()) {
            if hidden.is_empty() || hidden == b"." || hidden == b".." {
                return Err(resolve::refused("not a valid whiteout"));
            }
            return remove(&self.root.join(&parent).join(OsStr::from_bytes(hidden)));
        }
        match kind {
            // Made only where devices may be made; containers get theirs
            // from the runtime.
            EntryType::Char | EntryType::Block => {
                tracing::debug!(entry = %relative.display(), "device node in a layer skipped");
                return Ok(());
            }
            EntryType::XGlobalHeader => return Ok(()),
            _ => {}
        }
        let target = parent.join(&name);
        let path = self.root.join(&target);
        let link = if kind == EntryType::Link {
            let link = self.hard_link_target(entry)?;
            if link == path {
                // A link to itself: already there.
                return Ok(());
            }
            Some(link)
        } else {
            None
        };
        resolve::make_directories(&self.root, &parent)?;
        // What is there is replaced, unless a directory meets a directory.
        let directory_kept = match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() && kind == EntryType::Directory => true,
            Ok(_) => {
                remove(&path)?;
                false
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(e),
        };
        let private = Mode::from_raw_mode(0o700);
        match (kind, link) {
            (EntryType::Directory, _) => {
                if !directory_kept {
                    rustix::fs::mkdirat(CWD, &path, private)?;
                }
            }
            (EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse, _) => {
                // `create_new` is `O_EXCL`, which with `O_NOFOLLOW` never
                // writes through a symlink.
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
                    .mode(0o600)
                    .open(&path)?;
                io::copy(entry, &mut file)?;
            }
            (EntryType::Symlink, _) => {
                let to = entry
                    .link_name()?
                    .ok_or_else(|| resolve::refused("symlink without a target"))?;
                rustix::fs::symlinkat(to.as_ref(), CWD, &path)?;
            }
            (EntryType::Link, Some(link)) => {
                rustix::fs::linkat(CWD, &link, CWD, &path, AtFlags::empty())?;
            }
            (EntryType::Fifo, _) => {
                rustix::fs::mknodat(CWD, &path, rustix::fs::FileType::Fifo, private, 0)?;
            }
            (other, _) => {
                return Err(resolve::refused(format!(
                    "unsupported tar entry type {:?}",
                    other.as_byte() as char
                )))
            }
        }
        self.metadata(entry, kind, &path, &target)?;
        self.wrote(target);
        Ok(())
    }

    /// The file a hard link entry names, resolved in the root like any
    /// path (its last component not followed: a link to a symlink links the
    /// symlink). It must exist; an absolute name or one that climbs out of
    /// the root is refused.
    fn hard_link_target<R: Read>(&self, entry: &tar::Entry<'_, R>) -> io::Result<PathBuf> {
        let name = entry
            .link_name()?
            .ok_or_else(|| resolve::refused("hard link without a target"))?;
        let refused = |why: &dyn std::fmt::Display| {
            resolve::refused(format!("hard link to {}: {why}", name.display()))
        };
        if name.is_absolute() {
            return Err(refused(&"absolute hard links are refused"));
        }
        let relative = resolve::clean(&name).map_err(|e| refused(&e))?;
        let Some(file_name) = relative.file_name() else {
            return Err(refused(&"that is the image root"));
        };
        let parent = resolve::resolve(&self.root, relative.parent().unwrap_or(Path::new("")))
            .map_err(|e| refused(&e))?;
        let target = self.root.join(parent).join(file_name);
        match std::fs::symlink_metadata(&target) {
            Ok(meta) if !meta.is_dir() => Ok(target),
            Ok(_) => Err(refused(&"a directory")),
            Err(e) => Err(io::Error::new(
                e.kind(),
                format!("hard link to {}: {e}", name.display()),
            )),
        }
    }

    /// Owner, extended attributes, mode (after the owner: a chown clears
    /// setuid bits), and times, as containerd sets them, hard links too.
    fn metadata<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        kind: EntryType,
        path: &Path,
        target: &Path,
    ) -> io::Result<()> {
        let header = entry.header();
        let (uid, gid) = (id(header.uid()?)?, id(header.gid()?)?);
        let mode = Mode::from_raw_mode(header.mode()? & 0o7777);
        let mut mtime = Timespec {
            tv_sec: i64::try_from(header.mtime()?).unwrap_or(i64::MAX),
            tv_nsec: 0,
        };
        rustix::fs::chownat(
            CWD,
            path,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )?;
        if let Some(extensions) = entry.pax_extensions()? {
            for extension in extensions {
                let extension = extension?;
                let key = extension.key_bytes();
                if let Some(xattr) = key.strip_prefix(XATTR) {
                    set_xattr(path, xattr, extension.value_bytes())?;
                } else if key == b"mtime" {
                    mtime = pax_time(extension.value_bytes()).unwrap_or(mtime);
                }
            }
        }
        // chmod follows symlinks: never on one (nor on a hard link to one).
        if !std::fs::symlink_metadata(path)?.is_symlink() {
            rustix::fs::chmodat(CWD, path, mode, AtFlags::empty())?;
        }
        let times = Timestamps {
            last_access: mtime,
            last_modification: mtime,
        };
        if kind == EntryType::Directory {
            self.directories.push((target.to_path_buf(), times));
        } else {
            rustix::fs::utimensat(CWD, path, &times, AtFlags::SYMLINK_NOFOLLOW)?;
        }
        Ok(())
    }

    fn wrote(&mut self, target: PathBuf) {
        let mut above = target.parent();
        while let Some(dir) = above.filter(|d| !d.as_os_str().is_empty()) {
            if !self.holding.insert(dir.to_path_buf()) {
                break;
            }
            above = dir.parent();
        }
        self.written.insert(target);
    }

    /// `.wh..wh..opq` in `dir`: what lower layers put there goes, what this
    /// layer wrote stays (also when the marker comes after it).
    fn opaque(&self, dir: &Path) -> io::Result<()> {
        match std::fs::symlink_metadata(self.root.join(dir)) {
            Ok(meta) if meta.is_dir() => self.prune(dir),
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn prune(&self, dir: &Path) -> io::Result<()> {
        for child in std::fs::read_dir(self.root.join(dir))? {
            let child = child?;
            let relative = dir.join(child.file_name());
            if self.written.contains(&relative) || self.holding.contains(&relative) {
                // `file_type` is the entry's own: a symlink is not entered.
                if child.file_type()?.is_dir() {
                    self.prune(&relative)?;
                }
            } else {
                remove(&child.path())?;
            }
        }
        Ok(())
    }

    fn finish(self) -> io::Result<()> {
        for (directory, times) in &self.directories {
            let path = self.root.join(directory);
            match rustix::fs::utimensat(CWD, &path, times, AtFlags::SYMLINK_NOFOLLOW) {
                // Removed again later in the layer.
                Err(rustix::io::Errno::NOENT) => {}
                result => result?,
            }
        }
        Ok(())
    }
}

/// Sets one `SCHILY.xattr.*` attribute. As containerd: `trusted.*` is
/// never set, a filesystem without extended attributes is let be, and
/// `user.*` on what cannot carry it (symlinks, FIFOs) is skipped.
fn set_xattr(path: &Path, name: &[u8], value: &[u8]) -> io::Result<()> {
    let ignore = |why: &dyn std::fmt::Display| {
        tracing::warn!(
            path = %path.display(),
            xattr = %String::from_utf8_lossy(name),
            "extended attribute in a layer ignored: {why}",
        );
        Ok(())
    };
    if name.starts_with(b"trusted.") {
        return ignore(&"trusted.* attributes are not taken from images");
    }
    match rustix::fs::lsetxattr(path, name, value, rustix::fs::XattrFlags::empty()) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::NOTSUP => ignore(&e),
        Err(e)
            if e == rustix::io::Errno::PERM
                && name.starts_with(b"user.")
                && std::fs::symlink_metadata(path).is_ok_and(|m| !plain(&m)) =>
        {
            ignore(&e)
        }
        Err(e) => Err(io::Error::new(
            io::Error::from(e).kind(),
            format!("extended attribute {}: {e}", String::from_utf8_lossy(name)),
        )),
    }
}

fn plain(meta: &Metadata) -> bool {
    meta.is_file() || meta.is_dir()
}

/// A uid or gid as the kernel takes it (`-1` means "unchanged" there).
fn id(raw: u64) -> io::Result<u32> {
    u32::try_from(raw)
        .ok()
        .filter(|&id| id != u32::MAX)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("invalid owner {raw}")))
}

/// A PAX time, `SECONDS[.FRACTION]`.
fn pax_time(value: &[u8]) -> Option<Timespec> {
    let text = std::str::from_utf8(value).ok()?;
    let (seconds, fraction) = text.split_once('.').unwrap_or((text, ""));
    let mut nanos: String = fraction.chars().take(9).collect();
    if !nanos.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    while nanos.len() < 9 {
        nanos.push('0');
    }
    let negative = seconds.starts_with('-');
    let seconds: i64 = seconds.parse().ok()?;
    let nanos: i64 = nanos.parse().ok()?;
    // A negative time's fraction counts back from its seconds.
    Some(if negative && nanos > 0 {
        Timespec {
            tv_sec: seconds - 1,
            tv_nsec: 1_000_000_000 - nanos,
        }
    } else {
        Timespec {
            tv_sec: seconds,
            tv_nsec: nanos,
        }
    })
}

/// The entry's type, with Go's reading of old tars: a regular file whose
/// name ends in `/` is a directory.
fn entry_type<R: Read>(entry: &tar::Entry<'_, R>) -> EntryType {
    let header = entry.header();
    match header.entry_type() {
        EntryType::Regular
            if header.as_old().linkflag[0] == 0 && entry.path_bytes().ends_with(b"/") =>
        {
            EntryType::Directory
        }
        kind => kind,
    }
}

/// Removes `path` itself (a symlink, not what it points to).
fn remove(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        // Nothing there, or nothing that could be (below a file).
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            Ok(())
        }
        Err(e) => Err(e),
    }
}
