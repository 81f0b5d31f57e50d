//! `kubectl logs` on the node: a container instance's CRI log files (the
//! current one and its rotated predecessors, see `shim::log`) turned back
//! into the container's output, with the kubelet's options: `tailLines`,
//! `sinceSeconds`/`sinceTime`, `timestamps`, `limitBytes` and `follow`.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

/// How often a followed log is checked for new lines.
const FOLLOW_POLL: Duration = Duration::from_millis(100);
/// Output is sent in pieces of about this size.
const CHUNK: usize = 32 * 1024;

/// What the client asked for (the query of `/containerLogs/...`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogOptions {
    pub follow: bool,
    pub previous: bool,
    pub tail_lines: Option<usize>,
    pub since: Option<jiff::Timestamp>,
    pub timestamps: bool,
    pub limit_bytes: Option<u64>,
}

impl LogOptions {
    /// Reads the query parameters; an error names the bad one.
    pub fn parse(query: &[(String, String)]) -> Result<Self, String> {
        let get = |name: &str| {
            query
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
                .filter(|v| !v.is_empty())
        };
        let flag = |name: &str| matches!(get(name), Some("true" | "1"));
        let number = |name: &str| -> Result<Option<i64>, String> {
            get(name)
                .map(|v| {
                    v.parse::<i64>()
                        .map_err(|_| format!("{name}: {v:?} is not an integer"))
                })
                .transpose()
        };
        let mut options = LogOptions {
            follow: flag("follow"),
            previous: flag("previous"),
            timestamps: flag("timestamps"),
            ..LogOptions::default()
        };
        // A negative tail means everything, as with the kubelet.
        options.tail_lines = number("tailLines")?
            .filter(|n| *n >= 0)
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        options.limit_bytes = match number("limitBytes")? {
            Some(n) if n < 1 => return Err("limitBytes: must be greater than 0".into()),
            n => n.map(|n| n.unsigned_abs()),
        };
        options.since = match (number("sinceSeconds")?, get("sinceTime")) {
            (Some(_), Some(_)) => {
                return Err("at most one of sinceTime or sinceSeconds may be specified".into())
            }
            (Some(seconds), None) if seconds < 1 => {
                return Err("sinceSeconds: must be greater than 0".into())
            }
            (Some(seconds), None) => {
                Some(jiff::Timestamp::now() - jiff::SignedDuration::from_secs(seconds))
            }
            (None, Some(time)) => Some(
                time.parse::<jiff::Timestamp>()
                    .map_err(|e| format!("sinceTime: {e}"))?,
            ),
            (None, None) => None,
        };
        Ok(options)
    }
}

/// One record of a CRI log file.
#[derive(Debug, PartialEq)]
struct Record<'a> {
    time: &'a [u8],
    /// Not a part of a longer line (`F`, not `P`).
    full: bool,
    content: &'a [u8],
}

/// `<time> <stream> <F|P> <content>`; `None` for a malformed line.
fn parse(line: &[u8]) -> Option<Record<'_>> {
    let mut parts = line.splitn(4, |b| *b == b' ');
    let time = parts.next()?;
    let _stream = parts.next()?;
    let full = match parts.next()? {
        b"F" => true,
        b"P" => false,
        _ => return None,
    };
    Some(Record {
        time,
        full,
        content: parts.next().unwrap_or(b""),
    })
}

/// Turns records into output: timestamps at line starts, `since`, and the
/// byte limit.
#[derive(Debug)]
struct Formatter {
    timestamps: bool,
    since: Option<jiff::Timestamp>,
    remaining: Option<u64>,
    at_line_start: bool,
}

impl Formatter {
    fn new(options: &LogOptions) -> Self {
        Formatter {
            timestamps: options.timestamps,
            since: options.since,
            remaining: options.limit_bytes,
            at_line_start: true,
        }
    }

    fn done(&self) -> bool {
        self.remaining == Some(0)
    }

    /// Appends one record's output; false once the byte limit is reached.
    fn push(&mut self, record: &Record<'_>, out: &mut Vec<u8>) -> bool {
        if let Some(since) = self.since {
            let time = std::str::from_utf8(record.time)
                .ok()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok());
            if time.is_some_and(|t| t < since) {
                return true;
            }
        }
        let start = out.len();
        if self.timestamps && self.at_line_start {
            // The kubelet's RFC3339NanoFixed (nine digits), whatever the
            // runtime wrote.
            let fixed = std::str::from_utf8(record.time)
                .ok()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .map(|t| t.strftime("%Y-%m-%dT%H:%M:%S.%9fZ").to_string());
            match fixed {
                Some(fixed) => out.extend_from_slice(fixed.as_bytes()),
                None => out.extend_from_slice(record.time),
            }
            out.push(b' ');
        }
        out.extend_from_slice(record.content);
        if record.full {
            out.push(b'\n');
        }
        self.at_line_start = record.full;
        if let Some(remaining) = self.remaining.as_mut() {
            let written = (out.len() - start) as u64;
            if written >= *remaining {
                out.truncate(start + usize::try_from(*remaining).unwrap_or(usize::MAX));
                *remaining = 0;
                return false;
            }
            *remaining -= written;
        }
        true
    }
}

/// The files of one container instance's log, oldest first.
fn files(path: &Path) -> Vec<PathBuf> {
    let mut rotated: Vec<(u32, PathBuf)> = Vec::new();
    if let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                let file = entry.file_name();
                let number = file
                    .to_str()
                    .and_then(|f| f.strip_prefix(name))
                    .and_then(|f| f.strip_prefix('.'))
                    .and_then(|n| n.parse::<u32>().ok());
                if let Some(number) = number {
                    rotated.push((number, entry.path()));
                }
            }
        }
    }
    rotated.sort_by_key(|(n, _)| std::cmp::Reverse(*n));
    rotated.into_iter().map(|(_, p)| p).collect()
}

/// Where the last `lines` whole lines start among `records`.
fn tail_start(records: &[Record<'_>], lines: usize) -> usize {
    if lines == 0 {
        return records.len();
    }
    let mut seen = 0;
    for (i, record) in records.iter().enumerate().rev() {
        if record.full {
            seen += 1;
            if seen > lines {
                return i + 1;
            }
        }
    }
    0
}

/// Sends `out` when it is big enough (or `force`); false when the client
/// went away.
async fn flush(out: &mut Vec<u8>, sink: &mpsc::Sender<Bytes>, force: bool) -> bool {
    if out.is_empty() || (!force && out.len() < CHUNK) {
        return true;
    }
    sink.send(Bytes::from(std::mem::take(out))).await.is_ok()
}

/// Streams the log at `path` to `sink`. With `follow`, keeps going while
/// `running()` says the container runs, across rotations.
pub async fn stream(
    path: PathBuf,
    options: LogOptions,
    running: impl Fn() -> bool + Send,
    sink: mpsc::Sender<Bytes>,
) {
    let mut format = Formatter::new(&options);
    // The current file is opened first: a rotation while the older files
    // are read moves it, and it is then read whole through this handle.
    let mut current = std::fs::File::open(&path).ok();
    let mut history = Vec::new();
    for older in files(&path) {
        if let Ok(mut file) = std::fs::File::open(older) {
            let _ = file.read_to_end(&mut history);
        }
    }
    if let Some(file) = current.as_mut() {
        let _ = file.read_to_end(&mut history);
    }
    // Whole lines only; a partly written last line waits for its end.
    let complete = history
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |i| i + 1);
    let mut pending = history.split_off(complete);
    let records: Vec<Record<'_>> = history.split(|b| *b == b'\n').filter_map(parse).collect();
    let start = options.tail_lines.map_or(0, |n| tail_start(&records, n));
    let mut out = Vec::new();
    for record in &records[start..] {
        if !format.push(record, &mut out) {
            break;
        }
        if !flush(&mut out, &sink, false).await {
            return;
        }
    }
    drop(records);
    if !flush(&mut out, &sink, true).await || !options.follow || format.done() {
        return;
    }
    let Some(mut file) = current else { return };
    let mut buffer = vec![0u8; CHUNK];
    let mut last_look = false;
    loop {
        let n: usize = file.read(&mut buffer).unwrap_or_default();
        if n > 0 {
            pending.extend_from_slice(&buffer[..n]);
            let complete = pending
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |i| i + 1);
            let rest = pending.split_off(complete);
            for record in pending.split(|b| *b == b'\n').filter_map(parse) {
                if !format.push(&record, &mut out) {
                    break;
                }
            }
            pending = rest;
            if !flush(&mut out, &sink, true).await || format.done() {
                return;
            }
            continue;
        }
        // At the end of this file: rotated away? Then on to the new one.
        let moved = match (file.metadata(), std::fs::metadata(&path)) {
            (Ok(open), Ok(named)) => open.ino() != named.ino(),
            _ => false,
        };
        if moved {
            if let Ok(mut next) = std::fs::File::open(&path) {
                let _ = next.seek(SeekFrom::Start(0));
                file = next;
                continue;
            }
        }
        if last_look {
            return;
        }
        // One more read after the container ended: its last lines.
        last_look = !running();
        if !last_look {
            tokio::select! {
                () = tokio::time::sleep(FOLLOW_POLL) => {}
                () = sink.closed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    async fn read(path: PathBuf, options: LogOptions) -> String {
        let (tx, mut rx) = mpsc::channel(16);
        let task = tokio::spawn(stream(path, options, || false, tx));
        let mut all = Vec::new();
        while let Some(chunk) = rx.recv().await {
            all.extend_from_slice(&chunk);
        }
        task.await.unwrap();
        String::from_utf8(all).unwrap()
    }

    fn write_log(dir: &Path) -> PathBuf {
        let path = dir.join("0.log");
        std::fs::write(
            path.with_extension("log.1"),
            "2026-01-01T00:00:01.000000001Z stdout F one\n",
        )
        .unwrap();
        std::fs::write(
            &path,
            "2026-01-01T00:00:02Z stdout F two\n\
             2026-01-01T00:00:03Z stderr P thr\n\
             2026-01-01T00:00:03Z stderr F ee\n\
             garbage\n\
             2026-01-01T00:00:04Z stdout F four\n",
        )
        .unwrap();
        path
    }

    #[tokio::test]
    async fn whole_log_across_rotation_with_partial_lines_joined() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_log(dir.path());
        let text = read(path, LogOptions::default()).await;
        assert_eq!(text, "one\ntwo\nthree\nfour\n");
    }

    #[tokio::test]
    async fn tail_since_timestamps_and_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_log(dir.path());
        let tail = LogOptions {
            tail_lines: Some(2),
            ..LogOptions::default()
        };
        assert_eq!(read(path.clone(), tail).await, "three\nfour\n");
        let none = LogOptions {
            tail_lines: Some(0),
            ..LogOptions::default()
        };
        assert_eq!(read(path.clone(), none).await, "");
        let since = LogOptions {
            since: Some("2026-01-01T00:00:03Z".parse().unwrap()),
            timestamps: true,
            ..LogOptions::default()
        };
        assert_eq!(
            read(path.clone(), since).await,
            "2026-01-01T00:00:03.000000000Z three\n2026-01-01T00:00:04.000000000Z four\n"
        );
        let limit = LogOptions {
            limit_bytes: Some(6),
            ..LogOptions::default()
        };
        assert_eq!(read(path, limit).await, "one\ntw");
    }

    #[tokio::test]
    async fn follow_sees_new_lines_and_rotation_until_the_container_ends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(&path, "2026-01-01T00:00:01Z stdout F a\n").unwrap();
        let running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let flag = running.clone();
        let (tx, mut rx) = mpsc::channel(16);
        let options = LogOptions {
            follow: true,
            ..LogOptions::default()
        };
        let task = tokio::spawn(stream(
            path.clone(),
            options,
            move || flag.load(std::sync::atomic::Ordering::SeqCst),
            tx,
        ));
        assert_eq!(&rx.recv().await.unwrap()[..], b"a\n");
        let append = |line: &str| {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&path)
                .unwrap();
            f.write_all(line.as_bytes()).unwrap();
        };
        append("2026-01-01T00:00:02Z stdout F b\n");
        assert_eq!(&rx.recv().await.unwrap()[..], b"b\n");
        std::fs::rename(&path, path.with_extension("log.1")).unwrap();
        append("2026-01-01T00:00:03Z stdout F c\n");
        assert_eq!(&rx.recv().await.unwrap()[..], b"c\n");
        running.store(false, std::sync::atomic::Ordering::SeqCst);
        assert!(
            rx.recv().await.is_none(),
            "the stream ends with the container"
        );
        task.await.unwrap();
    }

    #[test]
    fn options_from_the_query() {
        let options = LogOptions::parse(&query(&[
            ("follow", "true"),
            ("tailLines", "5"),
            ("timestamps", "true"),
            ("sinceTime", "2026-01-01T00:00:00Z"),
        ]))
        .unwrap();
        assert!(options.follow && options.timestamps);
        assert_eq!(options.tail_lines, Some(5));
        assert!(options.since.is_some());
        assert!(LogOptions::parse(&query(&[("tailLines", "x")])).is_err());
        assert!(LogOptions::parse(&query(&[("limitBytes", "0")])).is_err());
        assert!(LogOptions::parse(&query(&[("sinceSeconds", "1"), ("sinceTime", "x")])).is_err());
        assert_eq!(
            LogOptions::parse(&query(&[("tailLines", "-1")]))
                .unwrap()
                .tail_lines,
            None
        );
    }
}
