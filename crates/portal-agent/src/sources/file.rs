//! The `file` source: the static pods in `--pod-manifest-path` (a
//! directory, or one file), read again every `--file-check-frequency` and
//! at once when inotify says the directory changed. Hidden files and
//! sub-directories are skipped; a file that cannot be read or holds a bad
//! manifest is reported and skipped, and the others still run. A missing
//! directory is an empty set (it may be made later).

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use super::manifest::{self, Origin, Problem};
use super::{Source, Update, Updates};

/// Changes this close together are read once (an editor's save is several
/// writes).
const SETTLE: Duration = Duration::from_millis(200);
/// The most files read from the directory.
const MAX_FILES: usize = 1000;

/// Reads the static pods under `path` for `node`.
pub fn read(path: &Path, node: &str) -> Update {
    let mut found = Vec::new();
    let mut problems = Vec::new();
    for file in manifest_files(path, &mut problems) {
        let location = file.display().to_string();
        let origin = Origin {
            node,
            source: Source::File,
            location: &location,
        };
        let pods = read_bounded(&file).and_then(|bytes| manifest::read(&bytes, origin));
        match pods {
            Ok(pods) => found.extend(pods.into_iter().map(|p| (p, location.clone()))),
            Err(message) => problems.push(Problem {
                origin: location,
                message,
            }),
        }
    }
    let (mut pods, duplicates) = manifest::first_of_each_name(found);
    problems.extend(duplicates);
    if pods.len() > manifest::MAX_PODS {
        problems.push(Problem {
            origin: path.display().to_string(),
            message: format!(
                "more than {} static pods; the rest are ignored",
                manifest::MAX_PODS
            ),
        });
        pods.truncate(manifest::MAX_PODS);
    }
    Update {
        source: Source::File,
        pods: Some(pods),
        problems,
    }
}

/// The files to read, in name order: `path` itself when it is a file.
fn manifest_files(path: &Path, problems: &mut Vec<Problem>) -> Vec<PathBuf> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Vec::new();
    };
    if meta.is_file() {
        return vec![path.to_owned()];
    }
    let entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(error) => {
            problems.push(Problem {
                origin: path.display().to_string(),
                message: error.to_string(),
            });
            return Vec::new();
        }
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter(|e| std::fs::metadata(e.path()).is_ok_and(|m| m.is_file()))
        .map(|e| e.path())
        .collect();
    files.sort();
    if files.len() > MAX_FILES {
        problems.push(Problem {
            origin: path.display().to_string(),
            message: format!("more than {MAX_FILES} files; the rest are not read"),
        });
        files.truncate(MAX_FILES);
    }
    files
}

fn read_bounded(file: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .and_then(|f| {
            f.take(manifest::MAX_BYTES as u64 + 1)
                .read_to_end(&mut bytes)
        })
        .map_err(|e| e.to_string())?;
    if bytes.len() > manifest::MAX_BYTES {
        return Err(format!("larger than {} bytes", manifest::MAX_BYTES));
    }
    Ok(bytes)
}

/// Sends the set under `path` now, every `every`, and when it changes.
pub async fn run(path: PathBuf, node: String, every: Duration, updates: Updates) {
    let mut watch: Option<Changes> = None;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is now
    loop {
        // Watched from the first check that finds the path; again after it
        // was removed and made anew.
        if watch.is_none() {
            watch = watch_path(&path);
        }
        // Blocking reads and parsing, off the async workers.
        let (at, name) = (path.clone(), node.clone());
        let Ok(update) = tokio::task::spawn_blocking(move || read(&at, &name)).await else {
            return;
        };
        if updates.send(update).await.is_err() {
            return;
        }
        tokio::select! {
            _ = tick.tick() => {}
            gone = changed(watch.as_mut()) => {
                if gone {
                    watch = None;
                }
                tokio::time::sleep(SETTLE).await;
                if let Some(changes) = &mut watch {
                    while changes.try_recv().is_ok() {}
                }
            }
        }
    }
}

/// Change notifications: `true` when the watched path itself went away.
type Changes = tokio::sync::mpsc::Receiver<bool>;

/// Watches `path` with inotify from a thread of its own (a blocking read;
/// the thread ends at the first event after the watch is dropped).
fn watch_path(path: &Path) -> Option<Changes> {
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC).ok()?;
    let flags = AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF;
    inotify.add_watch(path, flags).ok()?;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let gone_flags =
        AddWatchFlags::IN_IGNORED | AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF;
    std::thread::Builder::new()
        .name("manifest-watch".into())
        .spawn(move || loop {
            let gone = match inotify.read_events() {
                Ok(events) => events.iter().any(|e| e.mask.intersects(gone_flags)),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => true,
            };
            // A full channel already holds a change to read.
            if let Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) = tx.try_send(gone) {
                return;
            }
            if gone {
                return; // the closed channel says so too
            }
        })
        .ok()?;
    Some(rx)
}

/// Waits for a change (for ever without a watch); whether the watched
/// path itself went away.
async fn changed(watch: Option<&mut Changes>) -> bool {
    match watch {
        Some(changes) => changes.recv().await.unwrap_or(true),
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "metadata: {name: NAME}\nspec: {containers: [{name: c, image: x}]}\n";

    #[test]
    fn bad_files_are_reported_and_the_others_still_run() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), POD.replace("NAME", "a")).unwrap();
        std::fs::write(dir.path().join("b.json"), "{broken").unwrap();
        std::fs::write(dir.path().join(".hidden.yaml"), POD.replace("NAME", "h")).unwrap();
        std::fs::write(dir.path().join("c.yaml"), POD.replace("NAME", "a")).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let update = read(dir.path(), "n1");
        let names: Vec<_> = update
            .pods
            .unwrap()
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["a-n1"]);
        let origins: Vec<_> = update
            .problems
            .iter()
            .map(|p| p.origin.rsplit('/').next().unwrap().to_owned())
            .collect();
        assert_eq!(origins, ["b.json", "c.yaml"], "{:?}", update.problems);
    }

    #[test]
    fn a_missing_directory_is_an_empty_set_and_a_file_path_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let missing = read(&dir.path().join("none"), "n1");
        assert_eq!(missing.pods.unwrap().len(), 0);
        assert!(missing.problems.is_empty());
        let file = dir.path().join("one.yaml");
        std::fs::write(&file, POD.replace("NAME", "one")).unwrap();
        assert_eq!(read(&file, "n1").pods.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_change_is_sent_at_once_without_waiting_for_the_period() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        let task = tokio::spawn(run(
            dir.path().to_owned(),
            "n1".into(),
            Duration::from_secs(3600),
            tx,
        ));
        let first = rx.recv().await.unwrap();
        assert!(first.pods.unwrap().is_empty());
        std::fs::write(dir.path().join("p.yaml"), POD.replace("NAME", "p")).unwrap();
        let update = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(update.pods.unwrap().len(), 1);
        task.abort();
    }
}
