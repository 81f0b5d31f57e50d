//! The files of the volumes the agent writes itself (`configMap`, `secret`,
//! `downwardAPI`, `projected`), from one reading of the objects: every key
//! (or the `items` asked for) as a file, `defaultMode` 0644 unless given,
//! each item's own `mode` over it, and the kubelet's error words for a
//! missing object or key. Pure functions.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, KeyToPath, Pod, Volume};

use super::atomic::{File, Payload};
use crate::objects::Objects;

/// Kubernetes' default file mode for these volumes (0644).
pub const DEFAULT_MODE: i32 = 0o644;

/// The payload of `volume` if it is one of these kinds.
pub fn of(volume: &Volume, pod: &Pod, objects: &Objects) -> Option<Result<Payload, String>> {
    let mut payload = Payload::new();
    let result = if let Some(cm) = &volume.config_map {
        let mode = cm.default_mode.unwrap_or(DEFAULT_MODE);
        let entries = objects.config_map(&cm.name);
        keyed(
            &mut payload,
            "configmap",
            &cm.name,
            entries,
            cm.items.as_deref(),
            cm.optional,
            mode,
        )
    } else if let Some(secret) = &volume.secret {
        let name = secret.secret_name.clone().unwrap_or_default();
        let mode = secret.default_mode.unwrap_or(DEFAULT_MODE);
        let entries = objects.secret(&name);
        let items = secret.items.as_deref();
        keyed(
            &mut payload,
            "secret",
            &name,
            entries,
            items,
            secret.optional,
            mode,
        )
    } else if let Some(downward) = &volume.downward_api {
        let mode = downward.default_mode.unwrap_or(DEFAULT_MODE);
        downward_files(&mut payload, pod, downward.items.as_deref(), mode)
    } else if let Some(projected) = &volume.projected {
        let mode = projected.default_mode.unwrap_or(DEFAULT_MODE);
        projected.sources.iter().flatten().try_for_each(|source| {
            if let Some(cm) = &source.config_map {
                let entries = objects.config_map(&cm.name);
                let items = cm.items.as_deref();
                keyed(
                    &mut payload,
                    "configmap",
                    &cm.name,
                    entries,
                    items,
                    cm.optional,
                    mode,
                )
            } else if let Some(secret) = &source.secret {
                let entries = objects.secret(&secret.name);
                let items = secret.items.as_deref();
                keyed(
                    &mut payload,
                    "secret",
                    &secret.name,
                    entries,
                    items,
                    secret.optional,
                    mode,
                )
            } else if let Some(downward) = &source.downward_api {
                downward_files(&mut payload, pod, downward.items.as_deref(), mode)
            } else if let Some(token) = &source.service_account_token {
                let text = match objects.tokens.get(&token.path) {
                    Some(Ok(text)) => text.clone(),
                    Some(Err(why)) => return Err(why.clone()),
                    None => return Err("no service account token was asked for".into()),
                };
                let file = File {
                    contents: text.into_bytes(),
                    mode: u32::try_from(mode & 0o777).unwrap_or(0o644),
                };
                payload.insert(PathBuf::from(&token.path), file);
                Ok(())
            } else {
                // Refused at admission; a pod stored before that rule
                // gets this.
                Err("projected volume source is not supported by this node".into())
            }
        })
    } else {
        return None;
    };
    Some(result.map(|()| payload))
}

/// A ConfigMap's or Secret's keys as files: all of them, or `items`.
fn keyed(
    payload: &mut Payload,
    kind: &str,
    name: &str,
    entries: Option<BTreeMap<String, Vec<u8>>>,
    items: Option<&[KeyToPath]>,
    optional: Option<bool>,
    mode: i32,
) -> Result<(), String> {
    let optional = optional == Some(true);
    let Some(entries) = entries else {
        return if optional {
            Ok(())
        } else {
            Err(format!("{kind} {name:?} not found"))
        };
    };
    let file = |contents: &Vec<u8>, mode: i32| File {
        contents: contents.clone(),
        mode: (mode & 0o777) as u32,
    };
    match items {
        None => {
            for (key, contents) in &entries {
                payload.insert(PathBuf::from(key), file(contents, mode));
            }
        }
        Some(items) => {
            for item in items {
                match entries.get(&item.key) {
                    Some(contents) => {
                        let mode = item.mode.unwrap_or(mode);
                        payload.insert(PathBuf::from(&item.path), file(contents, mode));
                    }
                    None if optional => {}
                    None => {
                        return Err(format!(
                            "{kind} references non-existent {} key: {}",
                            if kind == "secret" { "secret" } else { "config" },
                            item.key
                        ))
                    }
                }
            }
        }
    }
    Ok(())
}

/// The downward API's files: pod fields and container resources.
fn downward_files(
    payload: &mut Payload,
    pod: &Pod,
    items: Option<&[DownwardAPIVolumeFile]>,
    mode: i32,
) -> Result<(), String> {
    for item in items.into_iter().flatten() {
        let text = if let Some(field) = &item.field_ref {
            field_text(pod, &field.field_path)?
        } else if let Some(resource) = &item.resource_field_ref {
            resource_text(pod, resource)?
        } else {
            String::new()
        };
        let mode = item.mode.unwrap_or(mode);
        payload.insert(
            PathBuf::from(&item.path),
            File {
                contents: text.into_bytes(),
                mode: (mode & 0o777) as u32,
            },
        );
    }
    Ok(())
}

/// A pod field as the downward API writes it: maps as sorted
/// `key="value"` lines (upstream's `FormatMap`).
fn field_text(pod: &Pod, path: &str) -> Result<String, String> {
    let meta = &pod.metadata;
    let format_map = |map: Option<&BTreeMap<String, String>>| {
        map.into_iter()
            .flatten()
            .map(|(k, v)| format!("{k}={}", serde_json::Value::String(v.clone())))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let keyed = |prefix: &str, map: Option<&BTreeMap<String, String>>| {
        let key = path
            .strip_prefix(prefix)?
            .strip_prefix("['")?
            .strip_suffix("']")?;
        Some(map.and_then(|m| m.get(key)).cloned().unwrap_or_default())
    };
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => format_map(meta.labels.as_ref()),
        "metadata.annotations" => format_map(meta.annotations.as_ref()),
        _ => keyed("metadata.labels", meta.labels.as_ref())
            .or_else(|| keyed("metadata.annotations", meta.annotations.as_ref()))
            .ok_or_else(|| format!("unsupported fieldRef path {path:?} in a downwardAPI volume"))?,
    })
}

/// A container's limit or request, divided by `divisor` and rounded up
/// (the kubelet's `ExtractContainerResourceValue`); "0" when unset.
fn resource_text(
    pod: &Pod,
    selector: &k8s_openapi::api::core::v1::ResourceFieldSelector,
) -> Result<String, String> {
    let container_name = selector.container_name.as_deref().unwrap_or_default();
    let container = pod
        .spec
        .iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .find(|c| c.name == container_name)
        .ok_or_else(|| format!("resourceFieldRef: no container {container_name:?}"))?;
    let resources = container.resources.as_ref();
    let (map, name) = match selector.resource.split_once('.') {
        Some(("limits", name)) => (resources.and_then(|r| r.limits.as_ref()), name),
        Some(("requests", name)) => (resources.and_then(|r| r.requests.as_ref()), name),
        _ => return Err(format!("unsupported resource {:?}", selector.resource)),
    };
    let Some(quantity) = map.and_then(|m| m.get(name)) else {
        return Ok("0".into());
    };
    let divisor = selector.divisor.as_ref().map_or("1", |d| d.0.as_str());
    let divided = if name == "cpu" {
        let value = portal_api::quantity::millicores(&quantity.0);
        let per = portal_api::quantity::millicores(divisor);
        value
            .zip(per.filter(|p| *p > 0))
            .map(|(v, p)| (v + p - 1) / p)
    } else {
        let value = portal_api::quantity::bytes(&quantity.0);
        let per = portal_api::quantity::bytes(divisor);
        value
            .zip(per.filter(|p| *p > 0))
            .map(|(v, p)| (v + p - 1) / p)
    };
    divided.map(|v| v.to_string()).ok_or_else(|| {
        format!(
            "resource {} {:?} / {divisor:?}",
            selector.resource, quantity.0
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web", "tier": "fe"}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"memory": "64Mi", "cpu": "250m"}}}]}
        }))
        .unwrap()
    }

    fn objects() -> Objects {
        let mut objects = Objects::default();
        let cm = serde_json::from_value(json!({"metadata": {"name": "cfg"},
            "data": {"a.conf": "A"}, "binaryData": {"b.bin": "AAE="}}))
        .unwrap();
        objects.config_maps.insert("cfg".into(), Some(cm));
        objects.secrets.insert("gone".into(), None);
        objects
    }

    fn volume(value: serde_json::Value) -> Volume {
        serde_json::from_value(value).unwrap()
    }

    fn files(payload: &Payload) -> Vec<(String, Vec<u8>, u32)> {
        payload
            .iter()
            .map(|(p, f)| (p.display().to_string(), f.contents.clone(), f.mode))
            .collect()
    }

    #[test]
    fn config_maps_give_every_key_or_their_items() {
        let all = of(
            &volume(json!({"name": "v", "configMap": {"name": "cfg"}})),
            &pod(),
            &objects(),
        );
        assert_eq!(
            files(&all.unwrap().unwrap()),
            [
                ("a.conf".into(), b"A".to_vec(), 0o644),
                ("b.bin".into(), vec![0, 1], 0o644)
            ]
        );
        let items = of(
            &volume(
                json!({"name": "v", "configMap": {"name": "cfg", "defaultMode": 0o400,
                "items": [{"key": "a.conf", "path": "conf/a"}, {"key": "b.bin", "path": "b", "mode": 0o600}]}}),
            ),
            &pod(),
            &objects(),
        );
        assert_eq!(
            files(&items.unwrap().unwrap()),
            [
                ("b".into(), vec![0, 1], 0o600),
                ("conf/a".into(), b"A".to_vec(), 0o400)
            ]
        );
        let missing_key = of(
            &volume(
                json!({"name": "v", "configMap": {"name": "cfg", "items": [{"key": "x", "path": "x"}]}}),
            ),
            &pod(),
            &objects(),
        );
        assert_eq!(
            missing_key.unwrap().unwrap_err(),
            "configmap references non-existent config key: x"
        );
    }

    #[test]
    fn missing_objects_fail_unless_optional() {
        let required = of(
            &volume(json!({"name": "v", "secret": {"secretName": "gone"}})),
            &pod(),
            &objects(),
        );
        assert_eq!(required.unwrap().unwrap_err(), "secret \"gone\" not found");
        let optional = of(
            &volume(json!({"name": "v", "secret": {"secretName": "gone", "optional": true}})),
            &pod(),
            &objects(),
        );
        assert!(optional.unwrap().unwrap().is_empty());
        assert!(of(
            &volume(json!({"name": "v", "emptyDir": {}})),
            &pod(),
            &objects()
        )
        .is_none());
    }

    #[test]
    fn downward_api_and_projections() {
        let projected = of(
            &volume(json!({"name": "v", "projected": {"sources": [
                {"downwardAPI": {"items": [
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                    {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                    {"path": "mem", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory", "divisor": "1Mi"}},
                    {"path": "cpu", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu", "divisor": "1"}}]}},
                {"configMap": {"name": "cfg", "items": [{"key": "a.conf", "path": "a"}]}}]}})),
            &pod(),
            &objects(),
        );
        let payload = projected.unwrap().unwrap();
        let text =
            |p: &str| String::from_utf8(payload[&PathBuf::from(p)].contents.clone()).unwrap();
        assert_eq!(text("labels"), "app=\"web\"\ntier=\"fe\"");
        assert_eq!(text("name"), "web");
        assert_eq!(text("mem"), "64");
        assert_eq!(text("cpu"), "1");
        assert_eq!(text("a"), "A");
    }
}
