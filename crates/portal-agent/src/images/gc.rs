//! Image garbage collection, as the kubelet's image manager: when the
//! filesystem holding the images is used at or above `high` percent, the
//! images no container uses (running or exited) and older than the
//! minimum age are removed, least recently used first, until usage is at
//! most `low` percent. An image is its unpacked root and the references
//! that resolve to it; its blobs go too unless another image still names
//! them. Skipped while a pull is under way (a pull may be about to use a
//! blob this would remove).

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, SystemTime};

use super::{ImageService, Resolved};

/// When and how much to collect (`--image-gc-high-threshold`,
/// `--image-gc-low-threshold`, `--image-minimum-gc-age`).
#[derive(Clone, Copy, Debug)]
pub struct GcPolicy {
    pub high_percent: u8,
    pub low_percent: u8,
    pub minimum_age: Duration,
    /// How often usage is checked (the kubelet's is five minutes).
    pub period: Duration,
}

impl Default for GcPolicy {
    fn default() -> Self {
        GcPolicy {
            high_percent: 85,
            low_percent: 80,
            minimum_age: Duration::from_secs(120),
            period: Duration::from_secs(300),
        }
    }
}

/// One image on the node: its references and when it was last used.
#[derive(Debug)]
struct OnNode {
    refs: Vec<std::path::PathBuf>,
    resolved: Resolved,
    last_used: SystemTime,
}

/// The percentage of the filesystem holding `path` in use.
fn usage_percent(path: &Path) -> Option<u8> {
    let stats = nix::sys::statvfs::statvfs(path).ok()?;
    let total = stats.blocks() as f64;
    if total == 0.0 {
        return None;
    }
    let free = stats.blocks_available() as f64;
    Some(((total - free) / total * 100.0).round().clamp(0.0, 100.0) as u8)
}

impl ImageService {
    /// Removes unused images if the image filesystem is past `policy`'s
    /// high mark; `in_use`: the image IDs (repo digests) of every container
    /// on the node. The IDs of the images removed.
    pub fn collect_garbage(&self, policy: &GcPolicy, in_use: &HashSet<String>) -> Vec<String> {
        let Some(used) = usage_percent(&self.dir) else {
            return Vec::new();
        };
        if used < policy.high_percent {
            return Vec::new();
        }
        // A pull under way holds its lock; GC waits for a quiet moment.
        let pulls = self.pulls.lock();
        let guards: Vec<_> = pulls.values().map(|lock| lock.try_lock()).collect();
        if guards.iter().any(Result::is_err) {
            return Vec::new();
        }
        let mut images = self.on_node();
        images.sort_by_key(|image| image.last_used);
        let now = SystemTime::now();
        let mut removed = Vec::new();
        for (i, image) in images.iter().enumerate() {
            if usage_percent(&self.dir).is_some_and(|u| u <= policy.low_percent) {
                break;
            }
            let young = now
                .duration_since(image.last_used)
                .is_ok_and(|age| age < policy.minimum_age);
            if young || in_use.contains(&image.resolved.repo_digest) {
                continue;
            }
            // The blobs the images left (and not yet removed) still name.
            let kept: HashSet<&str> = images
                .iter()
                .enumerate()
                .filter(|(j, other)| *j != i && !removed.contains(&other.resolved.repo_digest))
                .flat_map(|(_, other)| {
                    std::iter::once(other.resolved.config_digest.as_str())
                        .chain(other.resolved.layers.iter().map(String::as_str))
                })
                .collect();
            for reference in &image.refs {
                let _ = std::fs::remove_file(reference);
            }
            if let Ok(dir) = self.unpacked(&image.resolved.config_digest) {
                let _ = std::fs::remove_dir_all(dir);
            }
            let blobs =
                std::iter::once(&image.resolved.config_digest).chain(&image.resolved.layers);
            for blob in blobs {
                if !kept.contains(blob.as_str()) {
                    if let Ok(path) = self.blob_path(blob) {
                        let _ = std::fs::remove_file(path);
                    }
                }
            }
            tracing::info!(image = %image.resolved.repo_digest, "image garbage collected");
            removed.push(image.resolved.repo_digest.clone());
        }
        removed
    }

    /// The images on the node, one per unpacked root, with every reference
    /// that resolves to it; last used: the newest of its references' times
    /// (a reference is touched whenever a container is made from it).
    fn on_node(&self) -> Vec<OnNode> {
        let mut images: Vec<OnNode> = Vec::new();
        let Ok(entries) = std::fs::read_dir(self.dir.join("refs")) else {
            return images;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(resolved) = std::fs::read(&path)
                .map_err(|_| ())
                .and_then(|b| serde_json::from_slice::<Resolved>(&b).map_err(|_| ()))
            else {
                continue;
            };
            let used = entry
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            match images
                .iter_mut()
                .find(|i| i.resolved.config_digest == resolved.config_digest)
            {
                Some(image) => {
                    image.refs.push(path);
                    image.last_used = image.last_used.max(used);
                }
                None => images.push(OnNode {
                    refs: vec![path],
                    resolved,
                    last_used: used,
                }),
            }
        }
        images
    }
}

/// Marks the reference at `path` used now.
pub(super) fn touch(path: &Path) {
    if let Ok(file) = std::fs::File::options().append(true).open(path) {
        let _ = file.set_modified(SystemTime::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(dir: &Path) -> ImageService {
        ImageService::new(
            dir.to_path_buf(),
            Vec::new(),
            Vec::new(),
            crate::metrics::Metrics::new(),
        )
        .unwrap()
    }

    /// An image on disk: its blobs, unpacked root and reference.
    fn image(
        service: &ImageService,
        name: &str,
        config: u64,
        layers: &[u64],
        age: Duration,
    ) -> String {
        let digest = |n: &u64| format!("sha256:{n:064x}");
        let resolved = Resolved {
            repo_digest: format!("reg/{name}@{}", digest(&config)),
            config_digest: digest(&config),
            layers: layers.iter().map(digest).collect(),
        };
        for blob in std::iter::once(&resolved.config_digest).chain(&resolved.layers) {
            std::fs::write(service.blob_path(blob).unwrap(), b"x").unwrap();
        }
        std::fs::create_dir_all(
            service
                .unpacked(&resolved.config_digest)
                .unwrap()
                .join("rootfs"),
        )
        .unwrap();
        let path = service.ref_path(name);
        std::fs::write(&path, serde_json::to_vec(&resolved).unwrap()).unwrap();
        let file = std::fs::File::options().append(true).open(&path).unwrap();
        file.set_modified(SystemTime::now() - age).unwrap();
        resolved.repo_digest
    }

    #[test]
    fn unused_old_images_go_and_shared_blobs_stay() {
        let dir = tempfile::tempdir().unwrap();
        let service = service(dir.path());
        let hour = Duration::from_secs(3600);
        // Configs 1-3, layers 10 (shared), 11-13.
        let used = image(&service, "used", 1, &[10, 11], hour);
        let old = image(&service, "old", 2, &[10, 12], 2 * hour);
        let fresh = image(&service, "fresh", 3, &[13], Duration::ZERO);
        let blob = |n: u64| service.blob_path(&format!("sha256:{n:064x}")).unwrap();
        // Thresholds of 0: collect whatever may be collected.
        let always = GcPolicy {
            high_percent: 0,
            low_percent: 0,
            ..GcPolicy::default()
        };
        let removed = service.collect_garbage(&always, &HashSet::from([used.clone()]));
        assert_eq!(removed, vec![old]);
        assert!(!service.ref_path("old").exists());
        assert!(!service
            .unpacked(&format!("sha256:{:064x}", 2))
            .unwrap()
            .exists());
        assert!(!blob(12).exists() && !blob(2).exists());
        assert!(blob(10).exists(), "still used by another image");
        assert!(service.ref_path("used").exists() && service.ref_path("fresh").exists());
        let _ = fresh;
        // Below the high mark: nothing happens.
        let never = GcPolicy {
            high_percent: 100,
            low_percent: 90,
            ..GcPolicy::default()
        };
        assert!(service.collect_garbage(&never, &HashSet::new()).is_empty());
    }
}
