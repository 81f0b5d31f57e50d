//! The node's side of the local-path provisioner: its volumes are
//! directories under `DIR/storage/`, named `<volume>_<namespace>_<claim>`
//! by the provisioner, made when a pod first mounts one
//! ([`crate::volumes`]). A directory whose PersistentVolume no longer
//! exists is removed: its claim was deleted and its reclaim policy said
//! `Delete`, or it was deleted by hand. Judged only on a complete list of
//! volumes (the watch's), at each deletion and every minute, so an agent
//! that was down catches up when it starts.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};

/// How often the directories are checked besides deletions.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Keeps `root` free of directories of volumes that are gone.
pub async fn run(client: Client, root: PathBuf) {
    let events = watcher(
        Api::<PersistentVolume>::all(client),
        watcher::Config::default(),
    )
    .default_backoff();
    futures_util::pin_mut!(events);
    let mut known: HashSet<String> = HashSet::new();
    let mut listing: HashSet<String> = HashSet::new();
    let mut listed = false;
    let mut sweep = tokio::time::interval(SWEEP_EVERY);
    loop {
        tokio::select! {
            event = events.next() => {
                let Some(event) = event else { return };
                let Ok(event) = event else { continue };
                match event {
                    Event::Init => listing.clear(),
                    Event::InitApply(volume) => drop(listing.insert(volume.name_any())),
                    Event::InitDone => {
                        known = std::mem::take(&mut listing);
                        listed = true;
                        remove_orphans(&root, &known);
                    }
                    Event::Apply(volume) => drop(known.insert(volume.name_any())),
                    Event::Delete(volume) => {
                        known.remove(&volume.name_any());
                        if listed {
                            remove_orphans(&root, &known);
                        }
                    }
                }
            }
            _ = sweep.tick() => if listed { remove_orphans(&root, &known) },
        }
    }
}

/// Removes the directories under `root` whose volume is not in `known`.
fn remove_orphans(root: &Path, known: &HashSet<String>) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((volume, _)) = name.split_once('_') else {
            continue;
        };
        if !volume.starts_with("pvc-") || known.contains(volume) {
            continue;
        }
        let path = entry.path();
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {
                tracing::info!(volume, path = %path.display(), "removed a deleted volume's data")
            }
            Err(error) => {
                tracing::warn!(%error, path = %path.display(), "removing a deleted volume's data")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_directories_of_gone_volumes_go() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["pvc-a_default_data", "pvc-b_default_logs", "notes", "pvc-c"] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
        }
        let known = HashSet::from(["pvc-a".to_owned()]);
        remove_orphans(dir.path(), &known);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["notes", "pvc-a_default_data", "pvc-c"]);
    }
}
