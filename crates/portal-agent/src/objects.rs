//! The ConfigMaps, Secrets, claims and service-account tokens a pod refers to (its environment's
//! `configMapKeyRef`/`secretKeyRef`/`envFrom`, its volumes, its
//! `imagePullSecrets`), read from the
//! API once per sync of the pod: environment variables and volume files are
//! made from one consistent reading, and a volume sees an update at the
//! next sync (the kubelet's "Get" change-detection strategy). A node may
//! read only the objects its own pods refer to (the API server's node
//! rules), which is exactly what is asked here.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use kube::{Api, Client};

/// One kind's objects by name: `None` when it does not exist.
type ByName<T> = BTreeMap<String, Option<T>>;

/// What a pod refers to, as read for one sync.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub config_maps: ByName<ConfigMap>,
    pub secrets: ByName<Secret>,
    /// The claims its volumes name, and the volumes bound to them.
    pub claims: ByName<PersistentVolumeClaim>,
    pub volumes: ByName<PersistentVolume>,
    /// The service-account tokens its projected volumes ask for, by the
    /// projection's path: the token, or why there is none.
    pub tokens: BTreeMap<String, Result<String, String>>,
}

/// Why the objects could not be read (the API did not answer as it
/// should); the sync is tried again.
#[derive(Debug, thiserror::Error)]
#[error("reading {kind} {name:?}: {source}")]
pub struct ReadError {
    kind: &'static str,
    name: String,
    source: kube::Error,
}

impl Objects {
    /// A ConfigMap's entries (`data`, then `binaryData` as text where it
    /// is UTF-8), or `None` when it does not exist.
    pub fn config_map(&self, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
        let cm = self.config_maps.get(name)?.as_ref()?;
        let mut entries: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for (key, value) in cm.data.iter().flatten() {
            entries.insert(key.clone(), value.clone().into_bytes());
        }
        for (key, value) in cm.binary_data.iter().flatten() {
            entries.insert(key.clone(), value.0.clone());
        }
        Some(entries)
    }

    /// A Secret's entries, or `None` when it does not exist.
    pub fn secret(&self, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
        let secret = self.secrets.get(name)?.as_ref()?;
        Some(
            secret
                .data
                .iter()
                .flatten()
                .map(|(key, value)| (key.clone(), value.0.clone()))
                .collect(),
        )
    }

    /// Reads what `pod` refers to. Without an API server (a static pod on
    /// a standalone node) nothing can be read: every reference is missing.
    pub async fn read(
        client: Option<&Client>,
        pod: &Pod,
        tokens: &crate::tokens::Tokens,
    ) -> Result<Objects, ReadError> {
        let (config_maps, secrets) = references(pod);
        let mut objects = Objects::default();
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        for name in config_maps {
            let found = match client {
                Some(client) => Api::<ConfigMap>::namespaced(client.clone(), namespace)
                    .get_opt(&name)
                    .await
                    .map_err(|source| ReadError {
                        kind: "configmap",
                        name: name.clone(),
                        source,
                    })?,
                None => None,
            };
            objects.config_maps.insert(name, found);
        }
        for name in secrets {
            let found = match client {
                Some(client) => Api::<Secret>::namespaced(client.clone(), namespace)
                    .get_opt(&name)
                    .await
                    .map_err(|source| ReadError {
                        kind: "secret",
                        name: name.clone(),
                        source,
                    })?,
                None => None,
            };
            objects.secrets.insert(name, found);
        }
        let claims = pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter_map(|v| v.persistent_volume_claim.as_ref())
            .map(|c| c.claim_name.clone());
        for name in claims {
            let Some(client) = client else {
                objects.claims.insert(name, None);
                continue;
            };
            let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
                .get_opt(&name)
                .await
                .map_err(|source| ReadError {
                    kind: "persistentvolumeclaim",
                    name: name.clone(),
                    source,
                })?;
            let bound = claim
                .as_ref()
                .and_then(|c| c.spec.as_ref()?.volume_name.clone())
                .filter(|v| !v.is_empty());
            if let Some(volume) = bound {
                let found = Api::<PersistentVolume>::all(client.clone())
                    .get_opt(&volume)
                    .await
                    .map_err(|source| ReadError {
                        kind: "persistentvolume",
                        name: volume.clone(),
                        source,
                    })?;
                objects.volumes.insert(volume, found);
            }
            objects.claims.insert(name, claim);
        }
        let projections = pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter_map(|v| v.projected.as_ref())
            .flat_map(|p| p.sources.iter().flatten())
            .filter_map(|source| source.service_account_token.as_ref());
        for projection in projections {
            let token = tokens.get(client, pod, projection).await;
            objects.tokens.insert(projection.path.clone(), token);
        }
        Ok(objects)
    }
}

/// The names of the ConfigMaps and the Secrets `pod` refers to.
pub fn references(pod: &Pod) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut config_maps = BTreeSet::new();
    let mut secrets = BTreeSet::new();
    let Some(spec) = &pod.spec else {
        return (config_maps, secrets);
    };
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for container in containers {
        for var in container.env.iter().flatten() {
            let source = var.value_from.as_ref();
            if let Some(r) = source.and_then(|s| s.config_map_key_ref.as_ref()) {
                config_maps.insert(r.name.clone());
            }
            if let Some(r) = source.and_then(|s| s.secret_key_ref.as_ref()) {
                secrets.insert(r.name.clone());
            }
        }
        for from in container.env_from.iter().flatten() {
            if let Some(r) = &from.config_map_ref {
                config_maps.insert(r.name.clone());
            }
            if let Some(r) = &from.secret_ref {
                secrets.insert(r.name.clone());
            }
        }
    }
    for pull in spec.image_pull_secrets.iter().flatten() {
        secrets.insert(pull.name.clone());
    }
    for volume in spec.volumes.iter().flatten() {
        if let Some(cm) = &volume.config_map {
            config_maps.insert(cm.name.clone());
        }
        if let Some(secret) = &volume.secret {
            secrets.extend(secret.secret_name.clone());
        }
        for source in volume
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten())
        {
            if let Some(cm) = &source.config_map {
                config_maps.insert(cm.name.clone());
            }
            if let Some(secret) = &source.secret {
                secrets.insert(secret.name.clone());
            }
        }
    }
    (config_maps, secrets)
}
