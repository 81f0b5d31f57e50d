//! A pod's volumes on the node (the kubelet's volume manager, for the kinds
//! a node serves by itself): each is a directory under
//! `DIR/pods/<uid>/volumes/<plugin>/<name>` (or the node's own path for
//! `hostPath`) that containers bind at their `volumeMounts`.
//!
//! - `emptyDir`: a directory that lives as long as the pod; `medium:
//!   Memory` makes it a tmpfs (bounded by `sizeLimit`).
//! - `configMap`, `secret`, `downwardAPI`, `projected`: files written by
//!   [`atomic`] from one reading of the objects, rewritten at every sync
//!   so updates reach running containers; always read-only; Secrets (and
//!   projections, which may hold them) live on a tmpfs, never on disk.
//! - `hostPath`: the node's path, checked (or made) as its `type` says.
//!
//! Other kinds are refused by the API server at admission; a pod stored
//! before that gets an error here, never a silently missing volume.

pub mod atomic;
pub mod payload;

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod, Volume};
use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::env::Environment;
use crate::objects::Objects;

/// A volume ready to be bound: where it is on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Ready {
    path: PathBuf,
    /// Configuration volumes are read-only whatever the mount says.
    read_only: bool,
}

/// A pod's volumes, set up, by name.
#[derive(Clone, Debug, Default)]
pub struct PodVolumes {
    ready: BTreeMap<String, Ready>,
}

/// A volume that could not be set up (a `FailedMount` event).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("MountVolume.SetUp failed for volume {volume:?} : {message}")]
pub struct SetUpError {
    pub volume: String,
    pub message: String,
}

/// Where `pod`'s volume directories live.
fn volumes_dir(pod_dir: &Path) -> PathBuf {
    pod_dir.join("volumes")
}

/// Sets up every volume of `pod` (idempotent: an existing one is kept,
/// configuration files are brought up to date).
pub fn set_up(pod_dir: &Path, pod: &Pod, objects: &Objects) -> Result<PodVolumes, SetUpError> {
    let spec = pod.spec.as_ref();
    let fs_group = spec
        .and_then(|s| s.security_context.as_ref())
        .and_then(|s| s.fs_group)
        .and_then(|g| u32::try_from(g).ok());
    let mut volumes = PodVolumes::default();
    for volume in spec.and_then(|s| s.volumes.as_ref()).into_iter().flatten() {
        let failed = |message: String| SetUpError {
            volume: volume.name.clone(),
            message,
        };
        let ready =
            set_up_one(&volumes_dir(pod_dir), volume, pod, objects, fs_group).map_err(failed)?;
        volumes.ready.insert(volume.name.clone(), ready);
    }
    Ok(volumes)
}

fn set_up_one(
    dir: &Path,
    volume: &Volume,
    pod: &Pod,
    objects: &Objects,
    fs_group: Option<u32>,
) -> Result<Ready, String> {
    let io = |e: std::io::Error| e.to_string();
    if let Some(empty) = &volume.empty_dir {
        let path = dir.join("kubernetes.io~empty-dir").join(&volume.name);
        make_dir(&path, 0o777).map_err(io)?;
        if empty.medium.as_deref() == Some("Memory") {
            let size = empty
                .size_limit
                .as_ref()
                .and_then(|q| portal_api::quantity::bytes(&q.0));
            ensure_tmpfs(&path, size, 0o777).map_err(io)?;
        }
        if let Some(gid) = fs_group {
            std::os::unix::fs::chown(&path, None, Some(gid)).map_err(io)?;
        }
        return Ok(Ready {
            path,
            read_only: false,
        });
    }
    if let Some(host) = &volume.host_path {
        return host_path(&host.path, host.type_.as_deref().unwrap_or("")).map(|path| Ready {
            path,
            read_only: false,
        });
    }
    if let Some(payload) = payload::of(volume, pod, objects) {
        let payload = payload?;
        let plugin = if volume.config_map.is_some() {
            "kubernetes.io~configmap"
        } else if volume.secret.is_some() {
            "kubernetes.io~secret"
        } else if volume.downward_api.is_some() {
            "kubernetes.io~downward-api"
        } else {
            "kubernetes.io~projected"
        };
        let path = dir.join(plugin).join(&volume.name);
        make_dir(&path, 0o755).map_err(io)?;
        if volume.secret.is_some() || volume.projected.is_some() {
            ensure_tmpfs(&path, None, 0o755).map_err(io)?;
        }
        let owner = fs_group.map(|gid| (0, gid));
        atomic::write(&path, &payload, owner).map_err(io)?;
        return Ok(Ready {
            path,
            read_only: true,
        });
    }
    match &volume.persistent_volume_claim {
        Some(claim) => claimed(&claim.claim_name, claim.read_only == Some(true), objects),
        None => Err("this kind of volume is not supported by this node".into()),
    }
}

/// A claim's volume: the claim bound, its volume a directory of this node
/// (`hostPath`, or `local`). The built-in provisioner's directories are
/// made on first use, open to every user (as k3s's local-path).
fn claimed(name: &str, read_only: bool, objects: &Objects) -> Result<Ready, String> {
    let claim = objects
        .claims
        .get(name)
        .and_then(Option::as_ref)
        .ok_or_else(|| format!("persistentvolumeclaim {name:?} not found"))?;
    let volume_name = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("persistentvolumeclaim {name:?} is not bound"))?;
    let volume = objects
        .volumes
        .get(volume_name)
        .and_then(Option::as_ref)
        .ok_or_else(|| format!("persistentvolume {volume_name:?} not found"))?;
    let spec = volume.spec.as_ref().ok_or("persistentvolume has no spec")?;
    let local_path = volume
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("pv.kubernetes.io/provisioned-by"))
        .is_some_and(|p| p == LOCAL_PATH_PROVISIONER);
    let path = if let Some(host) = &spec.host_path {
        if local_path {
            let path = PathBuf::from(&host.path);
            make_dir(&path, 0o777).map_err(|e| format!("{}: {e}", path.display()))?;
            path
        } else {
            host_path(&host.path, host.type_.as_deref().unwrap_or(""))?
        }
    } else if let Some(local) = &spec.local {
        host_path(&local.path, "Directory")?
    } else {
        return Err(format!(
            "persistentvolume {volume_name:?}: its source is not one this node mounts (hostPath, local)"
        ));
    };
    Ok(Ready { path, read_only })
}

/// The built-in provisioner's name on the volumes it makes.
pub const LOCAL_PATH_PROVISIONER: &str = "portal.dev/local-path";

/// A `hostPath` checked (or made) as its `type` says, with the kubelet's
/// words when it is not what was asked.
fn host_path(path: &str, kind: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(path);
    let meta = std::fs::metadata(&path);
    let wrong = |what: &str| {
        Err(format!(
            "hostPath type check failed: {} is not a {what}",
            path.display()
        ))
    };
    match kind {
        "" => {}
        "DirectoryOrCreate" => {
            if meta.is_err() {
                make_dir(&path, 0o755).map_err(|e| e.to_string())?;
            } else if !meta.as_ref().is_ok_and(|m| m.is_dir()) {
                return wrong("directory");
            }
        }
        "FileOrCreate" => {
            if meta.is_err() {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&path)
                    .and_then(|f| f.set_permissions(std::fs::Permissions::from_mode(0o644)))
                    .map_err(|e| format!("{}: {e}", path.display()))?;
            } else if !meta.as_ref().is_ok_and(|m| m.is_file()) {
                return wrong("file");
            }
        }
        "Directory" if !meta.as_ref().is_ok_and(|m| m.is_dir()) => return wrong("directory"),
        "File" if !meta.as_ref().is_ok_and(|m| m.is_file()) => return wrong("file"),
        "Socket" if !meta.as_ref().is_ok_and(|m| m.file_type().is_socket()) => {
            return wrong("socket file")
        }
        "CharDevice" if !meta.as_ref().is_ok_and(|m| m.file_type().is_char_device()) => {
            return wrong("character device")
        }
        "BlockDevice" if !meta.as_ref().is_ok_and(|m| m.file_type().is_block_device()) => {
            return wrong("block device")
        }
        "Directory" | "File" | "Socket" | "CharDevice" | "BlockDevice" => {}
        other => return Err(format!("hostPath type {other:?} is not supported")),
    }
    Ok(path)
}

/// `container`'s bind mounts: (node path, container path, read-only).
/// `subPath` (and `subPathExpr`, expanded with the container's
/// environment) binds a path inside the volume, made when missing and
/// never one that leads out of it.
pub fn mounts(
    container: &Container,
    volumes: &PodVolumes,
    env: &Environment,
) -> Result<Vec<(PathBuf, String, bool)>, String> {
    let mut out = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let ready = volumes
            .ready
            .get(&mount.name)
            .ok_or_else(|| format!("volume {:?} is not set up", mount.name))?;
        let sub = match (&mount.sub_path, &mount.sub_path_expr) {
            (Some(sub), _) if !sub.is_empty() => sub.clone(),
            (_, Some(expr)) if !expr.is_empty() => crate::env::expand(expr, env),
            _ => String::new(),
        };
        let source = if sub.is_empty() {
            ready.path.clone()
        } else {
            sub_path(&ready.path, &sub, !ready.read_only)
                .map_err(|e| format!("subPath {sub:?} of volume {:?}: {e}", mount.name))?
        };
        let read_only = ready.read_only || mount.read_only == Some(true);
        out.push((source, mount.mount_path.clone(), read_only));
    }
    Ok(out)
}

/// `root/sub`, made as a directory when missing (`create`), and resolved:
/// it must stay inside `root` (a symlink in the volume may not point a
/// container at the node's files).
fn sub_path(root: &Path, sub: &str, create: bool) -> Result<PathBuf, String> {
    let relative = Path::new(sub);
    if !relative
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err("must be a relative path without '..'".into());
    }
    let joined = root.join(relative);
    if create && std::fs::symlink_metadata(&joined).is_err() {
        make_dir(&joined, 0o777).map_err(|e| e.to_string())?;
    }
    let resolved = std::fs::canonicalize(&joined).map_err(|e| e.to_string())?;
    let root = std::fs::canonicalize(root).map_err(|e| e.to_string())?;
    if !resolved.starts_with(&root) {
        return Err("leads out of its volume".into());
    }
    Ok(resolved)
}

fn make_dir(path: &Path, mode: u32) -> std::io::Result<()> {
    if path.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Whether `path` is a mount point (its device differs from its parent's).
fn is_mount_point(path: &Path) -> bool {
    let (Ok(own), Some(Ok(parent))) = (
        std::fs::metadata(path),
        path.parent().map(std::fs::metadata),
    ) else {
        return false;
    };
    own.dev() != parent.dev()
}

/// Mounts a tmpfs on `path` unless one is there.
fn ensure_tmpfs(path: &Path, size: Option<i64>, mode: u32) -> std::io::Result<()> {
    if is_mount_point(path) {
        return Ok(());
    }
    let mut options = format!("mode={mode:o}");
    if let Some(size) = size.filter(|s| *s > 0) {
        options.push_str(&format!(",size={size}"));
    }
    mount(
        Some("tmpfs"),
        path,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(options.as_str()),
    )
    .map_err(std::io::Error::from)
}

/// Why the pod must be evicted for its local storage, if it must: an
/// `emptyDir` on disk using more than its `sizeLimit`, in the eviction
/// manager's words. (A `medium: Memory` one is bounded by its tmpfs.)
pub fn over_limit(pod_dir: &Path, pod: &Pod) -> Option<String> {
    let volumes = pod.spec.as_ref()?.volumes.as_ref()?;
    for volume in volumes {
        let Some(empty) = &volume.empty_dir else {
            continue;
        };
        if empty.medium.as_deref() == Some("Memory") {
            continue;
        }
        let Some(limit) = &empty.size_limit else {
            continue;
        };
        let Some(bytes) = portal_api::quantity::bytes(&limit.0) else {
            continue;
        };
        let dir = volumes_dir(pod_dir)
            .join("kubernetes.io~empty-dir")
            .join(&volume.name);
        if usage(&dir) > u64::try_from(bytes).unwrap_or(0) {
            return Some(format!(
                "Usage of EmptyDir volume \"{}\" exceeds the limit \"{}\". ",
                volume.name, limit.0
            ));
        }
    }
    None
}

/// The disk a directory tree uses (allocated blocks, as `du`), hard links
/// counted once.
fn usage(dir: &Path) -> u64 {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.nlink() > 1 && !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        total += meta.blocks() * 512;
        if meta.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&path) {
                stack.extend(entries.flatten().map(|e| e.path()));
            }
        }
    }
    total
}

/// Unmounts what [`set_up`] mounted for the pod whose directory is
/// `pod_dir` (before the directory is removed).
pub fn tear_down(pod_dir: &Path) {
    let Ok(plugins) = std::fs::read_dir(volumes_dir(pod_dir)) else {
        return;
    };
    for plugin in plugins.flatten() {
        for volume in std::fs::read_dir(plugin.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = volume.path();
            if is_mount_point(&path) {
                if let Err(error) = umount2(&path, MntFlags::MNT_DETACH) {
                    tracing::warn!(%error, path = %path.display(), "unmounting a volume");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(volumes: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c"}], "volumes": volumes}}))
        .unwrap()
    }

    #[test]
    fn empty_dirs_and_sub_paths() {
        let dir = tempfile::tempdir().unwrap();
        let pod = pod(json!([{"name": "scratch", "emptyDir": {}}]));
        let volumes = set_up(dir.path(), &pod, &Objects::default()).unwrap();
        let container: Container = serde_json::from_value(json!({"name": "c", "volumeMounts": [
            {"name": "scratch", "mountPath": "/data"},
            {"name": "scratch", "mountPath": "/logs", "subPathExpr": "$(POD)/logs", "readOnly": true}]}))
        .unwrap();
        let mut env = Environment::default();
        env.set("POD", "p".into());
        let mounts = mounts(&container, &volumes, &env).unwrap();
        let root = dir.path().join("volumes/kubernetes.io~empty-dir/scratch");
        assert_eq!(mounts[0], (root.clone(), "/data".into(), false));
        assert_eq!(
            mounts[1],
            (
                std::fs::canonicalize(root.join("p/logs")).unwrap(),
                "/logs".into(),
                true
            )
        );
        let escape: Container = serde_json::from_value(json!({"name": "c", "volumeMounts": [
            {"name": "scratch", "mountPath": "/x", "subPath": "../../etc"}]}))
        .unwrap();
        assert!(mounts_err(&escape, &volumes).contains("without '..'"));
        std::os::unix::fs::symlink("/etc", root.join("link")).unwrap();
        let through_link: Container = serde_json::from_value(json!({"name": "c", "volumeMounts": [
            {"name": "scratch", "mountPath": "/x", "subPath": "link"}]}))
        .unwrap();
        assert!(mounts_err(&through_link, &volumes).contains("leads out of its volume"));
    }

    fn mounts_err(container: &Container, volumes: &PodVolumes) -> String {
        mounts(container, volumes, &Environment::default()).unwrap_err()
    }

    #[test]
    fn an_empty_dir_past_its_limit_evicts_the_pod() {
        let dir = tempfile::tempdir().unwrap();
        let pod = pod(
            json!([{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}},
            {"name": "ram", "emptyDir": {"medium": "Memory", "sizeLimit": "1Ki"}}]),
        );
        let root = dir.path().join("volumes/kubernetes.io~empty-dir/scratch");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("small"), vec![1u8; 4096]).unwrap();
        assert_eq!(over_limit(dir.path(), &pod), None);
        std::fs::write(root.join("big"), vec![1u8; 2 << 20]).unwrap();
        std::fs::hard_link(root.join("big"), root.join("same")).unwrap();
        assert_eq!(
            over_limit(dir.path(), &pod).as_deref(),
            Some("Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". ")
        );
        let used = usage(&root);
        assert!(used < 3 << 20, "a hard link counts once: {used}");
    }

    #[test]
    fn host_paths_follow_their_type() {
        let dir = tempfile::tempdir().unwrap();
        let made = dir.path().join("made");
        assert_eq!(
            host_path(made.to_str().unwrap(), "DirectoryOrCreate").unwrap(),
            made
        );
        assert!(made.is_dir());
        let file = dir.path().join("f");
        host_path(file.to_str().unwrap(), "FileOrCreate").unwrap();
        assert!(file.is_file());
        assert_eq!(
            host_path(file.to_str().unwrap(), "Directory").unwrap_err(),
            format!(
                "hostPath type check failed: {} is not a directory",
                file.display()
            )
        );
        assert!(host_path("/nonexistent-portal", "File").is_err());
    }

    #[test]
    fn config_volumes_are_read_only_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut objects = Objects::default();
        let cm = serde_json::from_value(json!({"metadata": {"name": "cfg"}, "data": {"k": "v"}}))
            .unwrap();
        objects.config_maps.insert("cfg".into(), Some(cm));
        let pod = pod(
            json!([{"name": "conf", "configMap": {"name": "cfg"}}, {"name": "gone", "configMap": {"name": "nope"}}]),
        );
        let error = set_up(dir.path(), &pod, &objects).unwrap_err();
        assert_eq!(
            error.to_string(),
            "MountVolume.SetUp failed for volume \"gone\" : configmap \"nope\" not found"
        );
        let root = dir.path().join("volumes/kubernetes.io~configmap/conf");
        assert_eq!(std::fs::read_to_string(root.join("k")).unwrap(), "v");
    }
}
