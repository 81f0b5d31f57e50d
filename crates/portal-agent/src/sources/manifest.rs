//! Static pod manifests: read (YAML or JSON, one or more Pods per file:
//! YAML documents, or a `List`/`PodList`), checked, defaulted as the API
//! server would, and made into the pod this node runs, named as Kubernetes
//! names static pods (the kubelet's `config/common.go`):
//!
//! - name `<name>-<node>`, namespace `default` when it has none, bound to
//!   this node, tolerating every `NoExecute` taint;
//! - a UID that is a hash of the node, the source, where the manifest was
//!   read and its content: the same manifest is the same pod across agent
//!   restarts, an edited one is a new pod (the old one stops);
//! - annotations `kubernetes.io/config.hash` (the UID),
//!   `kubernetes.io/config.source` and `kubernetes.io/config.seen`.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::Pod;
use portal_api::kinds;
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::Source;

pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
pub const CONFIG_SEEN: &str = "kubernetes.io/config.seen";
/// On a mirror pod: the hash of the static pod it mirrors.
pub const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";

/// The largest manifest read: a file, a URL's body, a pushed body.
pub const MAX_BYTES: usize = 1 << 20;
/// The most static pods one source may give (the node's pod capacity).
pub const MAX_PODS: usize = crate::node::MAX_PODS as usize;

/// Something wrong with one manifest (the others still run).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Where the manifest came from (file path, URL, `endpoint`).
    pub origin: String,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.origin, self.message)
    }
}

/// The objects in a manifest: each YAML document, with `List` and
/// `PodList` documents replaced by their items.
pub fn parse(bytes: &[u8]) -> Result<Vec<Value>, String> {
    if bytes.len() > MAX_BYTES {
        return Err(format!("larger than {MAX_BYTES} bytes"));
    }
    let mut objects = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_slice(bytes) {
        let value = Value::deserialize(document).map_err(|e| format!("not YAML or JSON: {e}"))?;
        match value {
            Value::Null => {}
            Value::Object(ref map)
                if matches!(
                    map.get("kind").and_then(Value::as_str),
                    Some("List" | "PodList")
                ) =>
            {
                let items = map.get("items").and_then(Value::as_array);
                objects.extend(items.into_iter().flatten().cloned());
            }
            value => objects.push(value),
        }
        if objects.len() > MAX_PODS {
            return Err(format!("more than {MAX_PODS} pods"));
        }
    }
    Ok(objects)
}

/// Where a static pod comes from.
#[derive(Clone, Copy, Debug)]
pub struct Origin<'a> {
    pub node: &'a str,
    pub source: Source,
    /// The file path or URL (part of the pod's identity).
    pub location: &'a str,
}

/// Reads every pod of one manifest; all or nothing (a manifest with one
/// bad pod is skipped as a whole, as a bad file is).
pub fn read(bytes: &[u8], origin: Origin<'_>) -> Result<Vec<Pod>, String> {
    parse(bytes)?
        .into_iter()
        .enumerate()
        .map(|(index, object)| {
            static_pod(object, origin).map_err(|e| {
                if index == 0 {
                    e
                } else {
                    format!("pod {}: {e}", index + 1)
                }
            })
        })
        .collect()
}

/// One manifest object as the static pod this node runs.
pub fn static_pod(object: Value, origin: Origin<'_>) -> Result<Pod, String> {
    let resource = &kinds::pod::RESOURCE;
    let decoded = portal_api::decode::decode_object(resource, object).map_err(|e| e.to_string())?;
    let mut object = decoded.object;
    check(&object)?;
    let uid = identity(&object, origin);
    let node = origin.node.to_ascii_lowercase();
    let name = format!(
        "{}-{node}",
        object["metadata"]["name"].as_str().unwrap_or("")
    );
    if let Some(problem) = portal_api::name::dns1123_subdomain(&name).first() {
        return Err(format!("the static pod's name {name:?}: {problem}"));
    }
    let metadata = &mut object["metadata"];
    metadata["name"] = json!(name);
    metadata["uid"] = json!(uid);
    if metadata["namespace"].as_str().is_none_or(str::is_empty) {
        metadata["namespace"] = json!("default");
    }
    let mut annotations: BTreeMap<String, Value> = metadata
        .get("annotations")
        .and_then(|a| serde_json::from_value(a.clone()).ok())
        .unwrap_or_default();
    annotations.insert(CONFIG_HASH.into(), json!(uid));
    annotations.insert(CONFIG_SOURCE.into(), json!(origin.source.name()));
    annotations.insert(
        CONFIG_SEEN.into(),
        json!(jiff::Timestamp::now().to_string()),
    );
    metadata["annotations"] = json!(annotations);
    for field in [
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "selfLink",
    ] {
        if let Some(map) = metadata.as_object_mut() {
            map.remove(field);
        }
    }
    let spec = &mut object["spec"];
    spec["nodeName"] = json!(origin.node);
    let tolerations = spec
        .as_object_mut()
        .map(|s| s.entry("tolerations").or_insert_with(|| json!([])));
    if let Some(Value::Array(list)) = tolerations {
        list.push(json!({"operator": "Exists", "effect": "NoExecute"}));
    }
    // The status is the agent's to compute (and to write to the mirror pod).
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
    }
    serde_json::from_value(object).map_err(|e| format!("unable to decode the pod: {e}"))
}

/// What a pod must have for the node to run it.
fn check(object: &Value) -> Result<(), String> {
    let metadata = &object["metadata"];
    let name = metadata["name"].as_str().unwrap_or("");
    if name.is_empty() {
        return Err("metadata.name: Required value".into());
    }
    if let Some(problem) = portal_api::name::dns1123_subdomain(name).first() {
        return Err(format!("metadata.name {name:?}: {problem}"));
    }
    if let Some(namespace) = metadata["namespace"].as_str().filter(|n| !n.is_empty()) {
        if let Some(problem) = portal_api::name::dns1123_label(namespace).first() {
            return Err(format!("metadata.namespace {namespace:?}: {problem}"));
        }
    }
    let spec = &object["spec"];
    let containers = spec["containers"].as_array().map_or(&[][..], Vec::as_slice);
    if containers.is_empty() {
        return Err("spec.containers: Required value".into());
    }
    let init = spec["initContainers"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let mut names = HashSet::new();
    for (i, container) in containers.iter().chain(init).enumerate() {
        let name = container["name"].as_str().unwrap_or("");
        if let Some(problem) = portal_api::name::dns1123_label(name).first() {
            return Err(format!("container {} name {name:?}: {problem}", i + 1));
        }
        if !names.insert(name) {
            return Err(format!("container name {name:?}: Duplicate value"));
        }
        if container["image"]
            .as_str()
            .is_none_or(|i| i.trim().is_empty())
        {
            return Err(format!("container {name:?}: image: Required value"));
        }
    }
    Ok(())
}

/// The static pod's UID: 32 hex digits of a SHA-256 of the node, the
/// source, where it was read and its (decoded, defaulted) content.
fn identity(object: &Value, origin: Origin<'_>) -> String {
    let mut hasher = Sha256::new();
    hasher.update(format!("host:{}\n", origin.node));
    hasher.update(format!("{}:{}\n", origin.source.name(), origin.location));
    hasher.update(serde_json::to_vec(object).unwrap_or_default());
    let digest = hasher.finalize();
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// Keeps the first pod of each namespace/name; the others are problems.
pub fn first_of_each_name(pods: Vec<(Pod, String)>) -> (Vec<Pod>, Vec<Problem>) {
    let mut seen = HashSet::new();
    let mut kept = Vec::new();
    let mut problems = Vec::new();
    for (pod, origin) in pods {
        let key = (pod.metadata.namespace.clone(), pod.metadata.name.clone());
        if seen.insert(key) {
            kept.push(pod);
        } else {
            problems.push(Problem {
                origin,
                message: format!(
                    "a static pod named {:?} in namespace {:?} exists already; this one is ignored",
                    pod.metadata.name.unwrap_or_default(),
                    pod.metadata.namespace.unwrap_or_default()
                ),
            });
        }
    }
    (kept, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORIGIN: Origin<'static> = Origin {
        node: "Node-1",
        source: Source::File,
        location: "/etc/portal/manifests/web.yaml",
    };

    const WEB: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  labels: {app: web}\nspec:\n  containers:\n  - name: web\n    image: web:1\n";

    #[test]
    fn a_manifest_becomes_a_static_pod_named_after_the_node() {
        let pods = read(WEB.as_bytes(), ORIGIN).unwrap();
        let pod = &pods[0];
        let meta = &pod.metadata;
        assert_eq!(meta.name.as_deref(), Some("web-node-1"));
        assert_eq!(meta.namespace.as_deref(), Some("default"));
        let uid = meta.uid.clone().unwrap();
        assert_eq!(uid.len(), 32);
        let annotations = meta.annotations.clone().unwrap();
        assert_eq!(annotations[CONFIG_HASH], uid);
        assert_eq!(annotations[CONFIG_SOURCE], "file");
        assert!(annotations[CONFIG_SEEN].parse::<jiff::Timestamp>().is_ok());
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("Node-1"));
        // Defaulted as the API server would.
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(
            spec.containers[0].image_pull_policy.as_deref(),
            Some("IfNotPresent")
        );
        let tolerations = spec.tolerations.clone().unwrap();
        assert_eq!(tolerations[0].effect.as_deref(), Some("NoExecute"));
    }

    #[test]
    fn the_uid_is_stable_and_follows_the_content_and_the_origin() {
        let uid = |text: &str, origin| {
            read(text.as_bytes(), origin).unwrap()[0]
                .metadata
                .uid
                .clone()
        };
        assert_eq!(uid(WEB, ORIGIN), uid(WEB, ORIGIN));
        // Key order and JSON vs YAML do not matter: the decoded content does.
        let json = r#"{"spec":{"containers":[{"image":"web:1","name":"web"}]},"metadata":{"labels":{"app":"web"},"name":"web"},"kind":"Pod","apiVersion":"v1"}"#;
        assert_eq!(uid(WEB, ORIGIN), uid(json, ORIGIN));
        assert_ne!(
            uid(WEB, ORIGIN),
            uid(&WEB.replace("web:1", "web:2"), ORIGIN)
        );
        let elsewhere = Origin {
            location: "/other.yaml",
            ..ORIGIN
        };
        assert_ne!(uid(WEB, ORIGIN), uid(WEB, elsewhere));
        let by_url = Origin {
            source: Source::Url,
            ..ORIGIN
        };
        assert_ne!(uid(WEB, ORIGIN), uid(WEB, by_url));
    }

    #[test]
    fn several_pods_per_file_as_documents_or_a_list() {
        let two = format!(
            "{WEB}---\n{}",
            WEB.replace("name: web\n  labels", "name: api\n  labels")
        );
        assert_eq!(read(two.as_bytes(), ORIGIN).unwrap().len(), 2);
        let list = r#"{"apiVersion":"v1","kind":"List","items":[{"metadata":{"name":"a"},"spec":{"containers":[{"name":"a","image":"x"}]}}]}"#;
        assert_eq!(
            read(list.as_bytes(), ORIGIN).unwrap()[0]
                .metadata
                .name
                .as_deref(),
            Some("a-node-1")
        );
        assert!(read(b"---\n", ORIGIN).unwrap().is_empty());
    }

    #[test]
    fn bad_manifests_are_refused_with_a_reason() {
        let refuse = |text: &str| read(text.as_bytes(), ORIGIN).unwrap_err();
        assert!(refuse("{not yaml").contains("not YAML"));
        assert!(refuse("kind: Service\nmetadata: {name: x}\n").contains("kind"));
        assert!(refuse("metadata: {name: x}\nspec: {containers: []}\n").contains("spec.containers"));
        assert!(refuse("spec: {containers: [{name: a, image: x}]}\n").contains("metadata.name"));
        assert!(
            refuse("metadata: {name: Bad_Name}\nspec: {containers: [{name: a, image: x}]}\n")
                .contains("metadata.name")
        );
        assert!(refuse("metadata: {name: x}\nspec: {containers: [{name: a}]}\n").contains("image"));
        assert!(refuse(
            "metadata: {name: x}\nspec: {containers: [{name: a, image: x}, {name: a, image: y}]}\n"
        )
        .contains("Duplicate"));
        assert!(refuse(
            "metadata: {name: x}\nspec: {containers: [{name: a, image: 3, ports: nope}]}\n"
        )
        .contains("decode"));
        // One bad pod in a file: the file's second pod is named in the error.
        let second_bad = format!("{WEB}---\nmetadata: {{name: y}}\nspec: {{}}\n");
        assert!(refuse(&second_bad).starts_with("pod 2:"));
        let huge = "#".repeat(MAX_BYTES + 1);
        assert!(refuse(&huge).contains("larger"));
    }

    #[test]
    fn the_first_pod_of_a_name_wins() {
        let pods = read(WEB.as_bytes(), ORIGIN).unwrap();
        let twice = vec![
            (pods[0].clone(), "a.yaml".to_owned()),
            (pods[0].clone(), "b.yaml".to_owned()),
        ];
        let (kept, problems) = first_of_each_name(twice);
        assert_eq!(kept.len(), 1);
        assert_eq!(problems[0].origin, "b.yaml");
    }
}
