//! Container logs in the CRI format the kubelet reads
//! (`2016-10-06T00:17:09.669794202Z stdout F the line`, `P` for a part of
//! a line longer than [`MAX_LINE`]), size-bounded with rotation: when the
//! file would pass `max_bytes` it becomes `FILE.1` (older ones shift up to
//! `FILE.<max_files - 1>`, the oldest is dropped) and a new file starts.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The longest line written as one record (containerd's default).
pub(super) const MAX_LINE: usize = 16 * 1024;

/// How much log one container instance keeps (kubelet's defaults: 10 MiB, 5 files).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogLimits {
    pub max_bytes: u64,
    pub max_files: u32,
}

impl Default for LogLimits {
    fn default() -> Self {
        LogLimits {
            max_bytes: 10 * 1024 * 1024,
            max_files: 5,
        }
    }
}

/// Appends records to a log file, rotating it at the size limit.
#[derive(Debug)]
pub struct LogWriter {
    path: PathBuf,
    file: File,
    size: u64,
    limits: LogLimits,
}

impl LogWriter {
    pub fn open(path: &Path, limits: LogLimits) -> std::io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let size = file.metadata()?.len();
        Ok(LogWriter {
            path: path.to_owned(),
            file,
            size,
            limits,
        })
    }

    /// Writes one record; `full` is false for a part of a longer line.
    /// Errors (a full disk) drop the record: the container must not stall.
    pub fn line(&mut self, stream: &str, content: &[u8], full: bool) {
        let timestamp = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S.%9fZ");
        let tag = if full { 'F' } else { 'P' };
        let mut record = format!("{timestamp} {stream} {tag} ").into_bytes();
        record.extend_from_slice(content);
        record.push(b'\n');
        if self.size + record.len() as u64 > self.limits.max_bytes && self.size > 0 {
            if let Err(error) = self.rotate() {
                tracing::debug!(%error, "log rotation failed");
            }
        }
        if self.file.write_all(&record).is_ok() {
            self.size += record.len() as u64;
        }
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        let numbered = |n: u32| PathBuf::from(format!("{}.{n}", self.path.display()));
        let keep = self.limits.max_files.max(1) - 1;
        if keep == 0 {
            self.file.set_len(0)?;
            self.size = 0;
            return Ok(());
        }
        let _ = std::fs::remove_file(numbered(keep));
        for n in (1..keep).rev() {
            let _ = std::fs::rename(numbered(n), numbered(n + 1));
        }
        std::fs::rename(&self.path, numbered(1))?;
        self.file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        self.size = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_cri_formatted_and_rotated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        let limits = LogLimits {
            max_bytes: 200,
            max_files: 3,
        };
        let mut log = LogWriter::open(&path, limits).unwrap();
        log.line("stdout", b"hello", true);
        log.line("stderr", b"par", false);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let first: Vec<&str> = lines[0].splitn(4, ' ').collect();
        assert!(first[0].ends_with('Z') && first[0].contains('T'));
        assert_eq!(&first[1..], ["stdout", "F", "hello"]);
        assert!(lines[1].ends_with(" stderr P par"));
        for i in 0..20 {
            log.line(
                "stdout",
                format!("line {i:03} padding padding").as_bytes(),
                true,
            );
        }
        let current = std::fs::read_to_string(&path).unwrap();
        assert!(current.len() <= 200);
        assert!(current.ends_with("line 019 padding padding\n"));
        assert!(dir.path().join("0.log.1").exists() && dir.path().join("0.log.2").exists());
        assert!(!dir.path().join("0.log.3").exists(), "at most 3 files");
    }
}
