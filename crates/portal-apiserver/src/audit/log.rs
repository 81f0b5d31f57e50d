//! Where audit events go: one JSON line each, appended to a file (or
//! standard output for `-`), rotated as kube-apiserver's log backend does
//! (`--audit-log-maxsize` megabytes, then the file is renamed with its time
//! and a new one begun; `--audit-log-maxbackup` and `--audit-log-maxage`
//! bound the old ones).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

/// Rotation bounds; zero means unbounded.
#[derive(Clone, Copy, Debug, Default)]
pub struct Rotation {
    pub max_megabytes: u64,
    pub max_backups: usize,
    pub max_age_days: u64,
}

pub(crate) struct Sink {
    path: Option<PathBuf>,
    rotation: Rotation,
    file: Mutex<Option<(std::fs::File, u64)>>,
}

impl Sink {
    /// `path` `-` is standard output.
    pub(crate) fn open(path: &Path, rotation: Rotation) -> std::io::Result<Sink> {
        let path = (path != Path::new("-")).then(|| path.to_owned());
        let file = match &path {
            Some(path) => {
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent)?;
                }
                let file = open_append(path)?;
                let size = file.metadata()?.len();
                Some((file, size))
            }
            None => None,
        };
        Ok(Sink {
            path,
            rotation,
            file: Mutex::new(file),
        })
    }

    /// Writes one line; a failure is logged, never the request's.
    pub(crate) fn write(&self, line: &[u8]) {
        let Some(path) = &self.path else {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(line).and_then(|()| out.write_all(b"\n"));
            return;
        };
        let mut file = self.file.lock();
        let limit = self.rotation.max_megabytes.saturating_mul(1024 * 1024);
        if let Some((_, size)) = file.as_ref() {
            if limit > 0 && *size + line.len() as u64 + 1 > limit && *size > 0 {
                *file = None;
                if let Err(error) = self.rotate(path) {
                    tracing::warn!(%error, "audit log rotation failed");
                }
            }
        }
        if file.is_none() {
            match open_append(path) {
                Ok(opened) => *file = Some((opened, 0)),
                Err(error) => {
                    tracing::warn!(%error, path = %path.display(), "cannot open the audit log");
                    return;
                }
            }
        }
        if let Some((handle, size)) = file.as_mut() {
            match handle
                .write_all(line)
                .and_then(|()| handle.write_all(b"\n"))
            {
                Ok(()) => *size += line.len() as u64 + 1,
                Err(error) => tracing::warn!(%error, "cannot write the audit log"),
            }
        }
    }

    /// `audit.log` becomes `audit-2026-11-27T15-04-05.000.log`; backups
    /// past the bounds are removed, oldest first.
    fn rotate(&self, path: &Path) -> std::io::Result<()> {
        let stamp = jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H-%M-%S%.3f")
            .to_string();
        let (stem, extension) = stem_and_extension(path);
        let mut backup = path.with_file_name(format!("{stem}-{stamp}{extension}"));
        // Two rotations in one millisecond keep both.
        for n in 1.. {
            if !backup.exists() {
                break;
            }
            backup = path.with_file_name(format!("{stem}-{stamp}-{n}{extension}"));
        }
        std::fs::rename(path, &backup)?;
        let mut backups = self.backups(path)?;
        backups.sort_by_key(|(modified, _)| std::cmp::Reverse(*modified));
        let max_age = Duration::from_secs(self.rotation.max_age_days.saturating_mul(86_400));
        for (i, (modified, old)) in backups.iter().enumerate() {
            let too_many = self.rotation.max_backups > 0 && i >= self.rotation.max_backups;
            let too_old =
                self.rotation.max_age_days > 0 && modified.elapsed().is_ok_and(|age| age > max_age);
            if too_many || too_old {
                std::fs::remove_file(old)?;
            }
        }
        Ok(())
    }

    fn backups(&self, path: &Path) -> std::io::Result<Vec<(SystemTime, PathBuf)>> {
        let (stem, extension) = stem_and_extension(path);
        let prefix = format!("{stem}-");
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix) && name.ends_with(&extension) && entry.path() != path {
                found.push((entry.metadata()?.modified()?, entry.path()));
            }
        }
        Ok(found)
    }
}

fn stem_and_extension(path: &Path) -> (String, String) {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let extension = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    (stem, extension)
}

fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_rotate_past_their_size_and_keep_their_backups_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let sink = Sink::open(
            &path,
            Rotation {
                max_megabytes: 1,
                max_backups: 2,
                max_age_days: 0,
            },
        )
        .unwrap();
        let line = vec![b'x'; 400 * 1024];
        for _ in 0..12 {
            sink.write(&line);
        }
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 3, "the log and two backups: {names:?}");
        assert!(std::fs::metadata(&path).unwrap().len() <= 1024 * 1024);
    }
}
