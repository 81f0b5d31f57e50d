//! Defaulting, as Kubernetes applies it to every object a client writes
//! (`pkg/apis/core/v1/defaults.go`): what an omitted field means is
//! written down, so every reader sees the same object.

use serde_json::{json, Value};

use crate::resource::Kind;

/// Fills in the defaults of `object`, a decoded object of `kind`.
pub fn apply(kind: Kind, object: &mut Value) {
    match kind {
        Kind::Service => service(object),
        Kind::Pod => {
            if let Some(spec) = object.get_mut("spec") {
                pod_spec(spec);
            }
        }
        Kind::ReplicationController => replication_controller(object),
        Kind::Endpoints => {
            for subset in array_mut(object, "subsets") {
                for port in array_mut(subset, "ports") {
                    default(port, "protocol", json!("TCP"));
                }
            }
        }
        Kind::EndpointSlice => {
            for port in array_mut(object, "ports") {
                default(port, "protocol", json!("TCP"));
            }
        }
        Kind::Namespace | Kind::Node | Kind::Event | Kind::Lease => {}
    }
}

/// Sets `field` when it is missing or null.
fn default(object: &mut Value, field: &str, value: Value) {
    if let Some(map) = object.as_object_mut() {
        let slot = map.entry(field).or_insert(Value::Null);
        if slot.is_null() {
            *slot = value;
        }
    }
}

fn array_mut<'a>(object: &'a mut Value, field: &str) -> impl Iterator<Item = &'a mut Value> {
    object
        .get_mut(field)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
}

fn service(object: &mut Value) {
    let Some(spec) = object.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    default(spec, "type", json!("ClusterIP"));
    let kind = spec["type"].as_str().unwrap_or("ClusterIP").to_owned();
    default(spec, "sessionAffinity", json!("None"));
    if spec["sessionAffinity"] == "ClientIP" {
        default(spec, "sessionAffinityConfig", json!({}));
        let config = &mut spec["sessionAffinityConfig"];
        default(config, "clientIP", json!({}));
        default(&mut config["clientIP"], "timeoutSeconds", json!(10800));
    }
    for port in array_mut(spec, "ports") {
        default(port, "protocol", json!("TCP"));
        let unset = match port.get("targetPort") {
            None | Some(Value::Null) => true,
            Some(Value::Number(n)) => n.as_i64() == Some(0),
            Some(Value::String(s)) => s.is_empty(),
            Some(_) => false,
        };
        if unset {
            let number = port.get("port").cloned().unwrap_or(Value::Null);
            port["targetPort"] = number;
        }
    }
    if kind != "ExternalName" {
        default(spec, "internalTrafficPolicy", json!("Cluster"));
    }
    if kind == "NodePort" || kind == "LoadBalancer" {
        default(spec, "externalTrafficPolicy", json!("Cluster"));
    }
    if kind == "LoadBalancer" {
        default(spec, "allocateLoadBalancerNodePorts", json!(true));
    }
}

/// `latest` (or no tag) is pulled always; a pinned tag or digest if absent.
fn image_pull_policy(image: &str) -> &'static str {
    let last = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') {
        return "IfNotPresent";
    }
    match last.rsplit_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

fn pod_spec(spec: &mut Value) {
    if !spec.is_object() {
        return;
    }
    default(spec, "restartPolicy", json!("Always"));
    default(spec, "dnsPolicy", json!("ClusterFirst"));
    default(spec, "terminationGracePeriodSeconds", json!(30));
    default(spec, "schedulerName", json!("default-scheduler"));
    default(spec, "securityContext", json!({}));
    default(spec, "enableServiceLinks", json!(true));
    for field in ["containers", "initContainers"] {
        for container in array_mut(spec, field) {
            let image = container
                .get("image")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            default(
                container,
                "imagePullPolicy",
                json!(image_pull_policy(&image)),
            );
            default(
                container,
                "terminationMessagePath",
                json!("/dev/termination-log"),
            );
            default(container, "terminationMessagePolicy", json!("File"));
            default(container, "resources", json!({}));
            for port in array_mut(container, "ports") {
                default(port, "protocol", json!("TCP"));
            }
            for var in array_mut(container, "env") {
                if let Some(field) = var.pointer_mut("/valueFrom/fieldRef") {
                    default(field, "apiVersion", json!("v1"));
                }
            }
            for kind in ["readinessProbe", "livenessProbe", "startupProbe"] {
                if let Some(probe) = container.get_mut(kind).filter(|p| p.is_object()) {
                    default(probe, "timeoutSeconds", json!(1));
                    default(probe, "periodSeconds", json!(10));
                    default(probe, "successThreshold", json!(1));
                    default(probe, "failureThreshold", json!(3));
                    http_get(probe);
                }
            }
            for hook in ["postStart", "preStop"] {
                if let Some(handler) = container.pointer_mut(&format!("/lifecycle/{hook}")) {
                    http_get(handler);
                }
            }
        }
    }
}

/// An `httpGet` action's defaults (path `/`, scheme HTTP).
fn http_get(handler: &mut Value) {
    if let Some(get) = handler.get_mut("httpGet").filter(|g| g.is_object()) {
        default(get, "path", json!("/"));
        default(get, "scheme", json!("HTTP"));
    }
}

fn replication_controller(object: &mut Value) {
    let Some(spec) = object.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    default(spec, "replicas", json!(1));
    let template_labels = spec.pointer("/template/metadata/labels").cloned();
    if let Some(labels) = template_labels.filter(|l| l.as_object().is_some_and(|m| !m.is_empty())) {
        let selector_empty = spec
            .get("selector")
            .and_then(Value::as_object)
            .is_none_or(|m| m.is_empty());
        if selector_empty {
            spec["selector"] = labels.clone();
        }
        let metadata = object
            .as_object_mut()
            .map(|o| o.entry("metadata").or_insert(json!({})));
        if let Some(metadata) = metadata {
            let labels_empty = metadata
                .get("labels")
                .and_then(Value::as_object)
                .is_none_or(|m| m.is_empty());
            if labels_empty {
                metadata["labels"] = labels;
            }
        }
    }
    if let Some(pod) = object.pointer_mut("/spec/template/spec") {
        pod_spec(pod);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_env_probes_and_hooks_are_defaulted() {
        let mut pod = json!({"spec": {"containers": [{"name": "c", "image": "busybox:1.36",
            "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "readinessProbe": {"httpGet": {"port": 80}},
            "lifecycle": {"preStop": {"httpGet": {"port": 80, "path": "/stop"}}}}]}});
        apply(Kind::Pod, &mut pod);
        let container = &pod["spec"]["containers"][0];
        assert_eq!(
            container["env"][0]["valueFrom"]["fieldRef"]["apiVersion"],
            "v1"
        );
        assert_eq!(
            container["readinessProbe"],
            json!({"httpGet": {"port": 80, "path": "/", "scheme": "HTTP"}, "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3})
        );
        assert_eq!(
            container["lifecycle"]["preStop"]["httpGet"]["path"],
            "/stop"
        );
        assert_eq!(
            container["lifecycle"]["preStop"]["httpGet"]["scheme"],
            "HTTP"
        );
    }

    #[test]
    fn service_defaults() {
        let mut svc = json!({"spec": {"ports": [{"port": 80}, {"port": 53, "protocol": "UDP", "targetPort": "dns"}], "sessionAffinity": "ClientIP"}});
        apply(Kind::Service, &mut svc);
        assert_eq!(svc["spec"]["type"], "ClusterIP");
        assert_eq!(
            svc["spec"]["ports"][0],
            json!({"port": 80, "protocol": "TCP", "targetPort": 80})
        );
        assert_eq!(svc["spec"]["ports"][1]["targetPort"], "dns");
        assert_eq!(
            svc["spec"]["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"],
            10800
        );
        assert_eq!(svc["spec"]["internalTrafficPolicy"], "Cluster");
        assert!(svc["spec"].get("externalTrafficPolicy").is_none());
    }

    #[test]
    fn rc_defaults_from_template() {
        let mut rc = json!({"metadata": {"name": "r"}, "spec": {"template": {"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}}});
        apply(Kind::ReplicationController, &mut rc);
        assert_eq!(rc["spec"]["replicas"], 1);
        assert_eq!(rc["spec"]["selector"], json!({"app": "a"}));
        assert_eq!(rc["metadata"]["labels"], json!({"app": "a"}));
        assert_eq!(
            rc["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"],
            "IfNotPresent"
        );
        assert_eq!(rc["spec"]["template"]["spec"]["restartPolicy"], "Always");
    }

    #[test]
    fn pull_policy() {
        assert_eq!(image_pull_policy("busybox"), "Always");
        assert_eq!(image_pull_policy("busybox:latest"), "Always");
        assert_eq!(image_pull_policy("registry:5000/busybox"), "Always");
        assert_eq!(image_pull_policy("registry:5000/busybox:1"), "IfNotPresent");
        assert_eq!(image_pull_policy("busybox@sha256:abc"), "IfNotPresent");
    }
}
