//! `portal images import FILE`: images for air-gapped nodes from an OCI
//! image archive (`index.json` + `blobs/`, e.g. `skopeo copy … oci-archive:`)
//! or a `docker save` tarball (`manifest.json` + layer tars). Every blob is
//! checked against its digest and the images land in the same store pulls
//! use, under the names the archive gives them.

use std::path::{Path, PathBuf};

use super::{normalize, sha256_file, Error, ImageService, Resolved, Result};

/// Imports every named image of `archive`; returns the names imported.
pub async fn import(service: &ImageService, archive: &Path) -> Result<Vec<String>> {
    let staging = tempfile_dir(service)?;
    let result = import_from(service, archive, &staging).await;
    let _ = std::fs::remove_dir_all(&staging);
    result
}

fn tempfile_dir(service: &ImageService) -> Result<PathBuf> {
    let dir = service.dir.join("tmp").join(format!(
        "import-{}-{}",
        std::process::id(),
        crate::short_hash(&crate::durable::now())
    ));
    std::fs::create_dir_all(&dir).map_err(super::io(dir.display().to_string()))?;
    Ok(dir)
}

async fn import_from(
    service: &ImageService,
    archive: &Path,
    staging: &Path,
) -> Result<Vec<String>> {
    let file = std::fs::File::open(archive).map_err(super::io(archive.display().to_string()))?;
    let (archive_path, staging_path) = (archive.to_owned(), staging.to_owned());
    tokio::task::spawn_blocking(move || {
        let mut tar = tar::Archive::new(std::io::BufReader::new(file));
        tar.unpack(&staging_path)
            .map_err(|e| Error::Format(format!("{}: {e}", archive_path.display())))
    })
    .await
    .map_err(|e| Error::Format(e.to_string()))??;
    let images = if staging.join("index.json").exists() {
        oci_layout(service, staging)?
    } else if staging.join("manifest.json").exists() {
        docker_save(service, staging)?
    } else {
        return Err(Error::Format(format!(
            "{}: neither an OCI archive (index.json) nor a docker save tarball (manifest.json)",
            archive.display()
        )));
    };
    if images.is_empty() {
        return Err(Error::Format(format!(
            "{}: no named image in it",
            archive.display()
        )));
    }
    let mut names = Vec::new();
    for (name, resolved) in images {
        let key = normalize(&name)?;
        service.store_resolved(&key, &resolved).await?;
        names.push(key);
    }
    Ok(names)
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read(path).map_err(super::io(path.display().to_string()))?;
    serde_json::from_slice(&text).map_err(|e| Error::Format(format!("{}: {e}", path.display())))
}

fn blob(dir: &Path, digest: &str) -> Result<PathBuf> {
    member(dir, &format!("blobs/sha256/{}", super::hex_of(digest)?))
}

/// An OCI image layout: each manifest of `index.json` named by its
/// `io.containerd.image.name` or `org.opencontainers.image.ref.name`.
fn oci_layout(service: &ImageService, dir: &Path) -> Result<Vec<(String, Resolved)>> {
    let index = read_json(&dir.join("index.json"))?;
    let mut images = Vec::new();
    for entry in index["manifests"].as_array().into_iter().flatten() {
        let annotations = &entry["annotations"];
        let name = annotations["io.containerd.image.name"]
            .as_str()
            .or_else(|| annotations["org.opencontainers.image.ref.name"].as_str());
        let (Some(name), Some(digest)) = (name, entry["digest"].as_str()) else {
            continue;
        };
        let manifest_path = blob(dir, digest)?;
        if sha256_file(&manifest_path)? != digest {
            return Err(Error::Format(format!(
                "manifest {digest}: content does not match"
            )));
        }
        let manifest = read_json(&manifest_path)?;
        let config = manifest["config"]["digest"].as_str().ok_or_else(|| {
            Error::Format(format!(
                "manifest {digest}: no config (an index of indexes is not supported)"
            ))
        })?;
        service.add_blob(config, &blob(dir, config)?)?;
        let mut layers = Vec::new();
        for layer in manifest["layers"].as_array().into_iter().flatten() {
            let layer_digest = layer["digest"].as_str().unwrap_or_default();
            service.add_blob(layer_digest, &blob(dir, layer_digest)?)?;
            layers.push(layer_digest.to_owned());
        }
        let repository = name.split(['@']).next().unwrap_or(name);
        let repository = repository
            .rsplit_once(':')
            .filter(|(_, tag)| !tag.contains('/'))
            .map_or(repository, |(repo, _)| repo);
        images.push((
            name.to_owned(),
            Resolved {
                repo_digest: format!("{}@{digest}", normalize_repository(repository)),
                config_digest: config.to_owned(),
                layers,
            },
        ));
    }
    Ok(images)
}

/// A `docker save` tarball: `manifest.json` lists each image's config,
/// layer files and tags.
/// A file the archive names, which must be inside it.
fn member(dir: &Path, name: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    let inside = std::fs::canonicalize(&path)
        .ok()
        .zip(std::fs::canonicalize(dir).ok())
        .is_some_and(|(path, dir)| path.starts_with(dir));
    if inside && !Path::new(name).is_absolute() {
        Ok(path)
    } else {
        Err(Error::Format(format!(
            "{name:?} is not a file of the archive"
        )))
    }
}

fn docker_save(service: &ImageService, dir: &Path) -> Result<Vec<(String, Resolved)>> {
    let manifest = read_json(&dir.join("manifest.json"))?;
    let mut images = Vec::new();
    for entry in manifest.as_array().into_iter().flatten() {
        let config_path = member(dir, entry["Config"].as_str().unwrap_or_default())?;
        let config = sha256_file(&config_path)?;
        service.add_blob(&config, &config_path)?;
        let mut layers = Vec::new();
        for layer in entry["Layers"].as_array().into_iter().flatten() {
            let path = member(dir, layer.as_str().unwrap_or_default())?;
            let digest = sha256_file(&path)?;
            service.add_blob(&digest, &path)?;
            layers.push(digest);
        }
        for tag in entry["RepoTags"].as_array().into_iter().flatten() {
            let Some(tag) = tag.as_str() else { continue };
            let repository = tag.rsplit_once(':').map_or(tag, |(repo, _)| repo);
            images.push((
                tag.to_owned(),
                Resolved {
                    // docker save has no manifest digest: the config's identifies it.
                    repo_digest: format!("{}@{config}", normalize_repository(repository)),
                    config_digest: config.clone(),
                    layers: layers.clone(),
                },
            ));
        }
    }
    Ok(images)
}

fn normalize_repository(repository: &str) -> String {
    normalize(&format!("{repository}:x"))
        .map(|whole| whole.trim_end_matches(":x").to_owned())
        .unwrap_or_else(|_| repository.to_owned())
}
