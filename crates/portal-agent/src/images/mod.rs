//! The image service: pulls images over the OCI distribution API
//! (`oci-client`; digests verified), keeps a content store in the data dir
//! (`blobs/sha256/<hex>`), records what each reference resolved to
//! (`refs/`), and unpacks each image once into a read-only root
//! (`unpacked/<config hex>/rootfs`) that containers overlay. Registry
//! mirrors (`docker.io=http://HOST:PORT`) and plain HTTP only for loopback
//! registries and those named insecure.

pub mod auth;
mod config;
pub mod gc;
pub mod import;
mod unpack;

use futures_util::future::BoxFuture;
use futures_util::{StreamExt, TryStreamExt};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::Reference;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sha2::Digest;

pub use auth::PullSecret;
pub use config::{resolve_user, ImageConfig};
pub use gc::GcPolicy;

/// Blobs of one image fetched at once (containerd's default too).
const PARALLEL_FETCHES: usize = 3;

/// The image a container is made from, as the image service resolved it.
#[derive(Clone, Debug)]
pub struct Image {
    /// The unpacked root filesystem (read-only; containers write above it).
    pub rootfs: PathBuf,
    pub config: ImageConfig,
    pub id: String,
}

/// What the pod workers need of the node's images: one already here, or
/// one pulled. [`ImageService`] is the real one; the workers' unit tests
/// use a fake.
pub trait ImageStore: Send + Sync + 'static {
    /// The image if it is on the node (no network).
    fn present(&self, reference: &str) -> Option<Image>;
    /// Pulls the image (at most one pull of a reference at a time), with
    /// the logins of `secrets` for its registry.
    fn pull<'a>(
        &'a self,
        reference: &'a str,
        secrets: &'a [PullSecret<'a>],
    ) -> BoxFuture<'a, Result<Image>>;
}

impl ImageStore for ImageService {
    fn present(&self, reference: &str) -> Option<Image> {
        ImageService::present(self, reference)
    }

    fn pull<'a>(
        &'a self,
        reference: &'a str,
        secrets: &'a [PullSecret<'a>],
    ) -> BoxFuture<'a, Result<Image>> {
        Box::pin(ImageService::pull(self, reference, secrets))
    }
}

/// Why an image cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid image reference {0:?}: {1}")]
    Reference(String, String),
    #[error("{0}")]
    Registry(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Format(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// `imagePullPolicy`, defaulted as Kubernetes does: Always for `:latest`
/// or an untagged reference, IfNotPresent otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    pub fn of(policy: Option<&str>, reference: &str) -> Self {
        match policy {
            Some("Always") => PullPolicy::Always,
            Some("Never") => PullPolicy::Never,
            Some("IfNotPresent") => PullPolicy::IfNotPresent,
            _ => {
                let last = reference.rsplit('/').next().unwrap_or(reference);
                let pinned = reference.contains('@');
                let tag = last.split_once(':').map(|(_, tag)| tag);
                if !pinned && matches!(tag, None | Some("latest")) {
                    PullPolicy::Always
                } else {
                    PullPolicy::IfNotPresent
                }
            }
        }
    }
}

/// What a reference resolved to when it was pulled or imported.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Resolved {
    /// `repo@sha256:…` of the manifest (the pod's `imageID`).
    pub repo_digest: String,
    pub config_digest: String,
    pub layers: Vec<String>,
}

/// A registry mirror: pulls of `registry` go to `host` (`http` or not).
#[derive(Clone, Debug)]
pub struct Mirror {
    pub registry: String,
    pub host: String,
    pub plain_http: bool,
}

impl std::str::FromStr for Mirror {
    type Err = String;

    /// `docker.io=http://127.0.0.1:5000`.
    fn from_str(text: &str) -> Result<Self, String> {
        let (registry, url) = text
            .split_once('=')
            .ok_or_else(|| format!("{text:?}: expected REGISTRY=URL"))?;
        let (plain_http, host) = if let Some(host) = url.strip_prefix("http://") {
            (true, host)
        } else if let Some(host) = url.strip_prefix("https://") {
            (false, host)
        } else {
            (false, url)
        };
        let host = host.trim_end_matches('/');
        if registry.is_empty() || host.is_empty() || host.contains('/') {
            return Err(format!(
                "{text:?}: expected REGISTRY=URL (e.g. docker.io=http://127.0.0.1:5000)"
            ));
        }
        Ok(Mirror {
            registry: registry.to_owned(),
            host: host.to_owned(),
            plain_http,
        })
    }
}

/// The image store of one agent.
pub struct ImageService {
    dir: PathBuf,
    mirrors: Vec<Mirror>,
    /// Registries (`HOST:PORT`) reached over plain HTTP.
    insecure: Vec<String>,
    /// One pull at a time per reference; others wait for its result.
    pulls: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    metrics: crate::metrics::Metrics,
}

impl std::fmt::Debug for ImageService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageService")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// Plain HTTP is allowed for loopback registries and those named insecure.
fn plain_http_hosts(insecure: &[String], mirrors: &[Mirror], registry: &str) -> bool {
    let host = registry.rsplit_once(':').map_or(registry, |(h, _)| h);
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    loopback
        || insecure.iter().any(|i| i == registry)
        || mirrors.iter().any(|m| m.plain_http && m.host == registry)
}

impl ImageService {
    pub fn new(
        dir: PathBuf,
        mirrors: Vec<Mirror>,
        insecure: Vec<String>,
        metrics: crate::metrics::Metrics,
    ) -> Result<Self> {
        for sub in ["blobs/sha256", "refs", "unpacked", "tmp"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(io(dir.display().to_string()))?;
        }
        Ok(ImageService {
            dir,
            mirrors,
            insecure,
            pulls: Mutex::new(HashMap::new()),
            metrics,
        })
    }

    /// A registry client for `host`: plain HTTP only where allowed.
    fn client_for(&self, host: &str) -> Result<oci_client::Client> {
        let protocol = if plain_http_hosts(&self.insecure, &self.mirrors, host) {
            ClientProtocol::HttpsExcept(vec![host.to_owned()])
        } else {
            ClientProtocol::Https
        };
        // `try_from`, not `new`: `new` falls back to defaults (HTTPS
        // everywhere) on a bad configuration instead of saying so.
        oci_client::Client::try_from(ClientConfig {
            protocol,
            connect_timeout: Some(std::time::Duration::from_secs(10)),
            read_timeout: Some(std::time::Duration::from_secs(60)),
            ..ClientConfig::default()
        })
        .map_err(|e| Error::Registry(format!("registry client: {e}")))
    }

    fn ref_path(&self, key: &str) -> PathBuf {
        let safe: String = key
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.dir
            .join("refs")
            .join(format!("{safe}-{:08x}", crate::short_hash(key)))
    }

    fn blob_path(&self, digest: &str) -> Result<PathBuf> {
        Ok(self.dir.join("blobs/sha256").join(hex_of(digest)?))
    }

    fn unpacked(&self, config_digest: &str) -> Result<PathBuf> {
        Ok(self.dir.join("unpacked").join(hex_of(config_digest)?))
    }

    /// A fresh name in the store's `tmp/` (never shared by two writers).
    fn temporary(&self, what: &str) -> PathBuf {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.dir
            .join("tmp")
            .join(format!("{what}-{}-{n}", std::process::id()))
    }

    /// The image if this node has it (pulled or imported, and unpacked).
    pub fn present(&self, reference: &str) -> Option<Image> {
        let key = normalize(reference).ok()?;
        let path = self.ref_path(&key);
        let resolved: Resolved = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
        let image = self.image(&resolved)?;
        // Used now: garbage collection takes the least recently used first.
        gc::touch(&path);
        Some(image)
    }

    fn image(&self, resolved: &Resolved) -> Option<Image> {
        let dir = self.unpacked(&resolved.config_digest).ok()?;
        let config: ImageConfig =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).ok()?).ok()?;
        Some(Image {
            rootfs: dir.join("rootfs"),
            config,
            id: resolved.repo_digest.clone(),
        })
    }

    /// Pulls the image (the manifest always, blobs only when missing) and
    /// unpacks it if it is new.
    pub async fn pull(&self, reference: &str, secrets: &[PullSecret<'_>]) -> Result<Image> {
        let key = normalize(reference)?;
        let lock = self.pulls.lock().entry(key.clone()).or_default().clone();
        let _one_at_a_time = lock.lock().await;
        let result = self.pull_now(&key, secrets).await;
        self.metrics.image_pulled(result.is_ok());
        result
    }

    async fn pull_now(&self, key: &str, secrets: &[PullSecret<'_>]) -> Result<Image> {
        let mut reference: Reference = key
            .parse()
            .map_err(|e: oci_client::ParseError| Error::Reference(key.to_owned(), e.to_string()))?;
        let registry = reference.resolve_registry().to_owned();
        if let Some(mirror) = self
            .mirrors
            .iter()
            .find(|m| m.registry == reference.registry())
        {
            reference.set_mirror_registry(mirror.host.clone());
        }
        let client = self.client_for(reference.resolve_registry())?;
        // Each matching login in turn (anonymous without one); the
        // client keeps the token the one that worked earned for the blobs.
        let mut logins = auth::logins(secrets, &registry, reference.repository());
        if logins.is_empty() {
            logins.push(RegistryAuth::Anonymous);
        }
        let mut pulled = None;
        let mut refused = None;
        for login in &logins {
            match client.pull_image_manifest(&reference, login).await {
                Ok(found) => {
                    pulled = Some(found);
                    break;
                }
                Err(error) => refused = Some(error),
            }
        }
        let (manifest, manifest_digest) = match (pulled, refused) {
            (Some(found), _) => found,
            (None, Some(error)) => return Err(Error::Registry(registry_message(&error))),
            (None, None) => return Err(Error::Registry("no login to try".into())),
        };
        self.fetch_blob(&client, &reference, &manifest.config)
            .await?;
        // Layers come in three at a time, as containerd fetches them, and
        // each is applied as soon as those below it are: unpacking the
        // first overlaps fetching the rest.
        let target = self.unpacked(&manifest.config.digest)?;
        let mut unpacking = None;
        let (layers_ready, ready) = std::sync::mpsc::channel::<PathBuf>();
        if !target.join("config.json").exists() {
            let config_blob = self.blob_path(&manifest.config.digest)?;
            let staging = self.temporary("unpack");
            let count = manifest.layers.len();
            unpacking = Some(tokio::task::spawn_blocking(move || {
                unpack_image(&config_blob, ready, count, &staging, &target)
            }));
        }
        let fetches: Vec<_> = manifest
            .layers
            .iter()
            .map(|descriptor| self.fetch_layer(&client, &reference, descriptor))
            .collect();
        let mut fetched = futures_util::stream::iter(fetches).buffered(PARALLEL_FETCHES);
        while let Some(layer) = fetched.try_next().await? {
            // A failed unpack ends the pull below, with its reason.
            if unpacking.is_some() && layers_ready.send(layer).is_err() {
                break;
            }
        }
        drop(layers_ready);
        if let Some(unpacking) = unpacking {
            unpacking
                .await
                .map_err(|e| Error::Format(format!("unpacking: {e}")))??;
        }
        let resolved = Resolved {
            repo_digest: format!(
                "{}/{}@{manifest_digest}",
                registry_name(&registry),
                reference.repository()
            ),
            config_digest: manifest.config.digest.clone(),
            layers: manifest.layers.iter().map(|l| l.digest.clone()).collect(),
        };
        self.store_resolved(key, &resolved).await
    }

    /// Fetches a layer (unless present): where it is kept.
    async fn fetch_layer(
        &self,
        client: &oci_client::Client,
        reference: &Reference,
        descriptor: &OciDescriptor,
    ) -> Result<PathBuf> {
        self.fetch_blob(client, reference, descriptor).await?;
        self.blob_path(&descriptor.digest)
    }

    async fn fetch_blob(
        &self,
        client: &oci_client::Client,
        reference: &Reference,
        descriptor: &OciDescriptor,
    ) -> Result<()> {
        // The registry's word is checked before it names a file.
        let path = self.blob_path(&descriptor.digest)?;
        if path.exists() {
            return Ok(());
        }
        let temporary = self.temporary("blob");
        let file = tokio::fs::File::create(&temporary)
            .await
            .map_err(io(temporary.display().to_string()))?;
        let mut writer = tokio::io::BufWriter::new(file);
        // `pull_blob` checks the content against the descriptor's digest.
        let pulled = client.pull_blob(reference, descriptor, &mut writer).await;
        if let Err(error) = pulled {
            let _ = tokio::fs::remove_file(&temporary).await;
            return Err(Error::Registry(registry_message(&error)));
        }
        tokio::fs::rename(&temporary, &path)
            .await
            .map_err(io(path.display().to_string()))
    }

    /// Unpacks the image if needed and records what `key` resolved to.
    pub(crate) async fn store_resolved(&self, key: &str, resolved: &Resolved) -> Result<Image> {
        let dir = self.unpacked(&resolved.config_digest)?;
        if !dir.join("config.json").exists() {
            let blobs: Vec<PathBuf> = resolved
                .layers
                .iter()
                .map(|d| self.blob_path(d))
                .collect::<Result<_>>()?;
            let config_blob = self.blob_path(&resolved.config_digest)?;
            let staging = self.temporary("unpack");
            let target = dir.clone();
            tokio::task::spawn_blocking(move || {
                let (layers, ready) = std::sync::mpsc::channel();
                let count = blobs.len();
                for blob in blobs {
                    let _ = layers.send(blob);
                }
                drop(layers);
                unpack_image(&config_blob, ready, count, &staging, &target)
            })
            .await
            .map_err(|e| Error::Format(format!("unpacking: {e}")))??;
        }
        let text = serde_json::to_vec(resolved).map_err(|e| Error::Format(e.to_string()))?;
        let path = self.ref_path(key);
        crate::durable::write_atomic(&path, &text).map_err(io(path.display().to_string()))?;
        self.image(resolved)
            .ok_or_else(|| Error::Format(format!("image {key} did not unpack")))
    }

    /// Copies a blob into the store, checking it against its digest.
    pub(crate) fn add_blob(&self, digest: &str, source: &Path) -> Result<()> {
        let path = self.blob_path(digest)?;
        if path.exists() {
            return Ok(());
        }
        let actual = sha256_file(source)?;
        if actual != digest {
            return Err(Error::Format(format!(
                "{}: content is {actual}, expected {digest}",
                source.display()
            )));
        }
        let temporary = self.temporary("import");
        std::fs::copy(source, &temporary).map_err(io(source.display().to_string()))?;
        std::fs::rename(&temporary, &path).map_err(io(path.display().to_string()))
    }
}

/// Unpacks `count` layers, bottom first, into `staging/rootfs` as they
/// arrive, then moves it into place whole. Fewer layers (the pull failed
/// and stopped sending) leave nothing behind.
fn unpack_image(
    config_blob: &Path,
    layers: std::sync::mpsc::Receiver<PathBuf>,
    count: usize,
    staging: &Path,
    target: &Path,
) -> Result<()> {
    let _ = std::fs::remove_dir_all(staging);
    let rootfs = staging.join("rootfs");
    std::fs::create_dir_all(&rootfs).map_err(io(rootfs.display().to_string()))?;
    let mut applied = 0;
    for layer in layers {
        let result = unpack::apply_layer(&layer, &rootfs)
            .map_err(|e| Error::Format(format!("layer {}: {e}", layer.display())));
        if let Err(error) = result {
            let _ = std::fs::remove_dir_all(staging);
            return Err(error);
        }
        applied += 1;
    }
    if applied != count {
        let _ = std::fs::remove_dir_all(staging);
        return Err(Error::Format(format!(
            "the pull ended after {applied} of {count} layers"
        )));
    }
    let document: serde_json::Value = serde_json::from_slice(
        &std::fs::read(config_blob).map_err(io(config_blob.display().to_string()))?,
    )
    .map_err(|e| Error::Format(format!("image config: {e}")))?;
    let config = ImageConfig::from_document(&document);
    let text = serde_json::to_vec(&config).map_err(|e| Error::Format(e.to_string()))?;
    std::fs::write(staging.join("config.json"), text).map_err(io(staging.display().to_string()))?;
    // Another pull or import of the same image may get there first: the
    // same content, so either is fine.
    match std::fs::rename(staging, target) {
        Ok(()) => Ok(()),
        Err(_) if target.join("config.json").exists() => {
            let _ = std::fs::remove_dir_all(staging);
            Ok(())
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(staging);
            Err(Error::Io {
                what: target.display().to_string(),
                source: e,
            })
        }
    }
}

/// The hex of a `sha256:` digest, refusing anything else (a digest from a
/// registry or an archive becomes a file name).
pub(crate) fn hex_of(digest: &str) -> Result<&str> {
    digest
        .strip_prefix("sha256:")
        .filter(|hex| {
            hex.len() == 64
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
        .ok_or_else(|| Error::Format(format!("unsupported or malformed digest {digest:?}")))
}

pub(crate) fn sha256_file(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path).map_err(io(path.display().to_string()))?;
    let mut hasher = sha2::Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(io(path.display().to_string()))?;
    Ok(format!("sha256:{:x}", hasher.finalize()))
}

/// `docker.io/library/busybox:1.36` for `busybox:1.36` (and the same for
/// pinned references), the key a reference is stored under.
pub fn normalize(reference: &str) -> Result<String> {
    let parsed: Reference = reference.parse().map_err(|e: oci_client::ParseError| {
        Error::Reference(reference.to_owned(), e.to_string())
    })?;
    Ok(parsed.whole())
}

/// Docker Hub's name in image IDs, as Kubernetes shows them.
fn registry_name(registry: &str) -> &str {
    match registry {
        "index.docker.io" | "registry-1.docker.io" => "docker.io",
        other => other,
    }
}

/// The registry's answer in a line (a missing image reads "not found").
fn registry_message(error: &oci_client::errors::OciDistributionError) -> String {
    error
        .to_string()
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_and_policies() {
        assert_eq!(
            normalize("busybox:1.36").unwrap(),
            "docker.io/library/busybox:1.36"
        );
        assert_eq!(
            normalize("127.0.0.1:5000/web:1").unwrap(),
            "127.0.0.1:5000/web:1"
        );
        assert!(normalize("UPPER:case").is_err());
        assert_eq!(PullPolicy::of(None, "busybox"), PullPolicy::Always);
        assert_eq!(PullPolicy::of(None, "busybox:latest"), PullPolicy::Always);
        assert_eq!(
            PullPolicy::of(None, "127.0.0.1:5000/web"),
            PullPolicy::Always
        );
        assert_eq!(
            PullPolicy::of(None, "127.0.0.1:5000/web:1"),
            PullPolicy::IfNotPresent
        );
        assert_eq!(
            PullPolicy::of(None, "web@sha256:ab"),
            PullPolicy::IfNotPresent
        );
        assert_eq!(PullPolicy::of(Some("Never"), "web:1"), PullPolicy::Never);
        let mirror: Mirror = "docker.io=http://127.0.0.1:5000".parse().unwrap();
        assert!(mirror.plain_http && mirror.host == "127.0.0.1:5000");
        assert!("docker.io".parse::<Mirror>().is_err());
        assert!(plain_http_hosts(&[], &[], "127.0.0.1:5000"));
        assert!(plain_http_hosts(&[], &[], "localhost:5000"));
        assert!(!plain_http_hosts(&[], &[], "registry.example:5000"));
        assert!(hex_of("sha256:../../etc/passwd").is_err());
        assert!(hex_of(&format!("sha256:{}", "a".repeat(64))).is_ok());
        assert!(hex_of(&format!("sha512:{}", "a".repeat(64))).is_err());
        assert!(plain_http_hosts(
            &["registry.example:5000".into()],
            &[],
            "registry.example:5000"
        ));
    }
}
