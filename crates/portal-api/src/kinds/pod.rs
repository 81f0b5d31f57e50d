//! Pods: defaults of the pod spec (shared with pod templates), the
//! selectable fields kubelets and schedulers use, and `kubectl get pods`'
//! columns as kubectl's printer computes them.

use serde_json::{json, Value};

use super::{Subresource, PROXY_VERBS};
use crate::defaults::{array_mut, default};
use crate::schema::{openapi_schema, typed, Generation, Kind, ListStrategy, NameRule, Resource};
use crate::table::cells::*;
use crate::table::{col, human_duration, Column, AGE, NAME};

/// The kind this module defines.
pub const KIND: Kind = Kind::new("", "Pod");

pub static RESOURCE: Resource = Resource {
    group: KIND.group,
    version: "v1",
    plural: "pods",
    singular: "pod",
    kind_name: KIND.name,
    namespaced: true,
    short_names: &["po"],
    categories: &["all"],
    has_status: true,
    name_rule: NameRule::Subdomain,
    decode: typed::<k8s_openapi::api::core::v1::Pod>,
    openapi_schema: openapi_schema::<k8s_openapi::api::core::v1::Pod>,
    defaults,
    validate,
    prepare_create,
    kept_on_update: &[],
    generation: Generation::Spec,
    create_on_update: false,
    selectable_fields: &[
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ],
    field_paths: &[],
    field_defaults: &[("spec.hostNetwork", "false")],
    own_list_strategy: list_strategy,
    list_map_keys: &[],
    columns,
    cells,
    custom: None,
    subresources: &[
        Subresource {
            name: "binding",
            kind: "Binding",
            verbs: &["create"],
            group_version: None,
        },
        // `kubectl drain` looks for it (group and version named).
        Subresource {
            name: "eviction",
            kind: "Eviction",
            verbs: &["create"],
            group_version: Some(("policy", "v1")),
        },
        // Served by the pod's node (`connect`) and by `proxy`.
        Subresource {
            name: "attach",
            kind: "PodAttachOptions",
            verbs: &["create", "get"],
            group_version: None,
        },
        Subresource {
            name: "exec",
            kind: "PodExecOptions",
            verbs: &["create", "get"],
            group_version: None,
        },
        Subresource {
            name: "log",
            kind: "Pod",
            verbs: &["get"],
            group_version: None,
        },
        Subresource {
            name: "portforward",
            kind: "PodPortForwardOptions",
            verbs: &["create", "get"],
            group_version: None,
        },
        Subresource {
            name: "proxy",
            kind: "PodProxyOptions",
            verbs: PROXY_VERBS,
            group_version: None,
        },
    ],
};

fn defaults(object: &mut Value) {
    if let Some(spec) = object.get_mut("spec") {
        spec_defaults(spec);
    }
    // Every write, as the DefaultTolerationSeconds admission: a re-applied
    // manifest without them must not look like a change of tolerations.
    default_toleration_seconds(object);
}

/// On a mirror pod (the API's copy of a node's static pod): the annotation
/// naming its static pod.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The spec as Kubernetes validates it (when it changes: a status write
/// never fails on what was stored before), what an update may change, and
/// the mirror annotation.
fn validate(object: &Value, old: Option<&Value>) -> Vec<crate::Cause> {
    let spec_changed = old.is_none_or(|old| old["spec"] != object["spec"]);
    let mut causes = if spec_changed {
        crate::pod_spec::validate(&object["spec"], "spec")
    } else {
        Vec::new()
    };
    let Some(old) = old else {
        return causes;
    };
    if spec_changed {
        causes.extend(crate::pod_spec::validate_update(object, old));
    }
    causes.extend(mirror_annotation(object, old));
    causes
}

/// An update may neither add, change nor remove the mirror annotation: a
/// pod does not become, or stop being, a node's mirror pod.
fn mirror_annotation(object: &Value, old: &Value) -> Vec<crate::Cause> {
    let mirror = |pod: &Value| pod["metadata"]["annotations"][MIRROR_ANNOTATION].clone();
    let field = format!("metadata.annotations[{MIRROR_ANNOTATION}]");
    match (mirror(old), mirror(object)) {
        (before, after) if before == after => Vec::new(),
        (Value::Null, _) => vec![crate::Cause::forbidden(
            &field,
            "may not add mirror pod annotation",
        )],
        _ => vec![crate::Cause::forbidden(
            &field,
            "may not remove or update mirror pod annotation",
        )],
    }
}

fn prepare_create(object: &mut Value) {
    object["status"] = json!({"phase": "Pending"});
}

/// How long a pod stays bound to a node that is not ready or unreachable
/// before it is evicted, unless it says otherwise (the API server's
/// `DefaultTolerationSeconds` admission, 300 s).
const DEFAULT_TOLERATION_SECONDS: i64 = 300;

/// Adds a `NoExecute` toleration for the `not-ready` and `unreachable`
/// node taints, unless the pod already tolerates them.
fn default_toleration_seconds(object: &mut Value) {
    let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let tolerations = spec.entry("tolerations").or_insert_with(|| json!([]));
    if tolerations.is_null() {
        *tolerations = json!([]);
    }
    let Some(list) = tolerations.as_array_mut() else {
        return;
    };
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        let tolerated = list.iter().any(|t| {
            let effect = t["effect"].as_str().unwrap_or("");
            let key_matches = match t["key"].as_str().unwrap_or("") {
                "" => t["operator"] == "Exists",
                k => k == key,
            };
            key_matches && (effect.is_empty() || effect == "NoExecute")
        });
        if !tolerated {
            list.push(json!({
                "key": key,
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": DEFAULT_TOLERATION_SECONDS,
            }));
        }
    }
}

fn list_strategy(path: &[&str]) -> ListStrategy {
    match path {
        ["spec", rest @ ..] => spec_list_strategy(rest),
        ["status", "conditions"] => ListStrategy::MergeKey("type"),
        ["status", "podIPs"] => ListStrategy::MergeKey("ip"),
        _ => ListStrategy::Replace,
    }
}

/// Pod spec lists, relative to a `PodSpec`.
pub(super) fn spec_list_strategy(path: &[&str]) -> ListStrategy {
    use ListStrategy::*;
    match path {
        ["containers" | "initContainers" | "ephemeralContainers"] => MergeKey("name"),
        ["containers" | "initContainers", "ports"] => MergeKey("containerPort"),
        ["containers" | "initContainers", "env"] => MergeKey("name"),
        ["containers" | "initContainers", "volumeMounts"] => MergeKey("mountPath"),
        ["containers" | "initContainers", "volumeDevices"] => MergeKey("devicePath"),
        ["volumes" | "imagePullSecrets"] => MergeKey("name"),
        ["hostAliases"] => MergeKey("ip"),
        ["topologySpreadConstraints"] => MergeKey("topologyKey"),
        _ => Replace,
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

pub(super) fn spec_defaults(spec: &mut Value) {
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

fn columns() -> Vec<Column> {
    vec![
        NAME,
        col(
            "Ready",
            "The aggregate readiness state of this pod for accepting traffic.",
            0,
        ),
        col(
            "Status",
            "The aggregate status of the containers in this pod.",
            0,
        ),
        Column {
            kind: "string",
            ..col(
                "Restarts",
                "The number of times the containers in this pod have been restarted.",
                0,
            )
        },
        AGE,
        col("IP", "IP address allocated to the pod.", 1),
        col("Node", "Name of the node the pod is assigned to.", 1),
        col(
            "Nominated Node",
            "Name of the node where the pod is nominated.",
            1,
        ),
        col("Readiness Gates", "Pod readiness gates.", 1),
    ]
}

/// kubectl's `printPod`: the STATUS a user sees (init progress, a waiting
/// or terminated reason, Terminating), READY, and RESTARTS with the time of
/// the last one.
fn cells(object: &Value, now: i64) -> Vec<Value> {
    let containers = arr(object, &["spec", "containers"]).len();
    let mut restarts: i64 = 0;
    let mut last_restart: Option<i64> = None;
    let mut note_restart = |status: &Value| {
        restarts += int(status, &["restartCount"]);
        if let Some(at) =
            s(status, &["lastState", "terminated", "finishedAt"]).and_then(parse_rfc3339)
        {
            last_restart = Some(last_restart.map_or(at, |t: i64| t.max(at)));
        }
    };
    let mut reason = s(object, &["status", "reason"])
        .or(s(object, &["status", "phase"]))
        .unwrap_or("")
        .to_owned();
    let init_specs = arr(object, &["spec", "initContainers"]);
    let init_statuses = arr(object, &["status", "initContainerStatuses"]);
    let mut initializing = false;
    for (i, status) in init_statuses.iter().enumerate() {
        note_restart(status);
        let sidecar = init_specs
            .iter()
            .find(|c| s(c, &["name"]) == s(status, &["name"]))
            .is_some_and(|c| s(c, &["restartPolicy"]) == Some("Always"));
        let terminated = status.pointer("/state/terminated");
        let waiting = s(status, &["state", "waiting", "reason"])
            .filter(|r| !r.is_empty() && *r != "PodInitializing");
        if terminated.is_some_and(|t| int(t, &["exitCode"]) == 0) {
            continue;
        }
        if sidecar && status.get("started").and_then(Value::as_bool) == Some(true) {
            continue;
        }
        reason = match (terminated, waiting) {
            (Some(t), _) => match s(t, &["reason"]).filter(|r| !r.is_empty()) {
                Some(r) => format!("Init:{r}"),
                None if int(t, &["signal"]) != 0 => format!("Init:Signal:{}", int(t, &["signal"])),
                None => format!("Init:ExitCode:{}", int(t, &["exitCode"])),
            },
            (None, Some(w)) => format!("Init:{w}"),
            (None, None) => format!("Init:{i}/{}", init_specs.len()),
        };
        initializing = true;
        break;
    }
    let conditions = arr(object, &["status", "conditions"]);
    let condition_true = |kind: &str| {
        conditions
            .iter()
            .any(|c| s(c, &["type"]) == Some(kind) && s(c, &["status"]) == Some("True"))
    };
    let mut ready = 0;
    if !initializing || condition_true("Initialized") {
        restarts = 0;
        last_restart = None;
        let mut has_running = false;
        for status in arr(object, &["status", "containerStatuses"]).iter().rev() {
            restarts += int(status, &["restartCount"]);
            if let Some(at) =
                s(status, &["lastState", "terminated", "finishedAt"]).and_then(parse_rfc3339)
            {
                last_restart = Some(last_restart.map_or(at, |t: i64| t.max(at)));
            }
            let terminated = status.pointer("/state/terminated");
            if let Some(waiting) =
                s(status, &["state", "waiting", "reason"]).filter(|r| !r.is_empty())
            {
                reason = waiting.to_owned();
            } else if let Some(t) = terminated {
                reason = match s(t, &["reason"]).filter(|r| !r.is_empty()) {
                    Some(r) => r.to_owned(),
                    None if int(t, &["signal"]) != 0 => format!("Signal:{}", int(t, &["signal"])),
                    None => format!("ExitCode:{}", int(t, &["exitCode"])),
                };
            } else if status.get("ready").and_then(Value::as_bool) == Some(true)
                && status.pointer("/state/running").is_some()
            {
                has_running = true;
                ready += 1;
            }
        }
        // Some container still runs: the pod is not "Completed".
        if reason == "Completed" && has_running {
            reason = if condition_true("Ready") {
                "Running"
            } else {
                "NotReady"
            }
            .into();
        }
    }
    if s(object, &["metadata", "deletionTimestamp"]).is_some() {
        reason = "Terminating".into();
    }
    let restarts = match last_restart {
        Some(at) if restarts > 0 => format!("{restarts} ({} ago)", human_duration(now - at)),
        _ => restarts.to_string(),
    };
    let gates = arr(object, &["spec", "readinessGates"]);
    let gates = if gates.is_empty() {
        NONE.to_owned()
    } else {
        let conditions = arr(object, &["status", "conditions"]);
        let met = gates
            .iter()
            .filter(|g| {
                conditions.iter().any(|c| {
                    s(c, &["type"]) == s(g, &["conditionType"]) && s(c, &["status"]) == Some("True")
                })
            })
            .count();
        format!("{met}/{}", gates.len())
    };
    vec![
        name(object),
        json!(format!("{ready}/{containers}")),
        json!(reason),
        json!(restarts),
        age(object, now),
        json!(s(object, &["status", "podIP"])
            .filter(|ip| !ip.is_empty())
            .unwrap_or(NONE)),
        json!(s(object, &["spec", "nodeName"])
            .filter(|n| !n.is_empty())
            .unwrap_or(NONE)),
        json!(s(object, &["status", "nominatedNodeName"])
            .filter(|n| !n.is_empty())
            .unwrap_or(NONE)),
        json!(gates),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policy() {
        assert_eq!(image_pull_policy("busybox"), "Always");
        assert_eq!(image_pull_policy("busybox:latest"), "Always");
        assert_eq!(image_pull_policy("registry:5000/busybox"), "Always");
        assert_eq!(image_pull_policy("registry:5000/busybox:1"), "IfNotPresent");
        assert_eq!(image_pull_policy("busybox@sha256:abc"), "IfNotPresent");
    }

    #[test]
    fn pods_tolerate_unready_nodes_for_300_seconds_unless_they_say() {
        let mut plain = json!({"spec": {"containers": [{"name": "c", "image": "x"}]}});
        default_toleration_seconds(&mut plain);
        let tolerations = plain["spec"]["tolerations"].as_array().unwrap();
        assert_eq!(tolerations.len(), 2);
        assert_eq!(tolerations[1]["key"], "node.kubernetes.io/unreachable");
        assert_eq!(tolerations[1]["tolerationSeconds"], 300);
        let mut own = json!({"spec": {"tolerations": [
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}
        ]}});
        default_toleration_seconds(&mut own);
        let tolerations = own["spec"]["tolerations"].as_array().unwrap();
        assert_eq!(tolerations.len(), 2, "only not-ready is added");
        assert_eq!(tolerations[0]["tolerationSeconds"], 5);
        let mut everything = json!({"spec": {"tolerations": [{"operator": "Exists"}]}});
        default_toleration_seconds(&mut everything);
        assert_eq!(
            everything["spec"]["tolerations"].as_array().unwrap().len(),
            1
        );
    }

    #[test]
    fn a_mirror_annotation_cannot_change_on_update() {
        let pod = |mirror: Option<&str>| {
            let annotations = match mirror {
                Some(hash) => json!({MIRROR_ANNOTATION: hash, "other": "x"}),
                None => json!({"other": "x"}),
            };
            json!({
                "metadata": {"name": "web-n1", "annotations": annotations},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            })
        };
        assert!(
            validate(&pod(Some("h")), None).is_empty(),
            "a create may carry it"
        );
        assert!(validate(&pod(Some("h")), Some(&pod(Some("h")))).is_empty());
        assert!(validate(&pod(None), Some(&pod(None))).is_empty());
        let added = validate(&pod(Some("h")), Some(&pod(None)));
        assert_eq!(
            added[0].message,
            "Forbidden: may not add mirror pod annotation"
        );
        assert_eq!(
            added[0].field,
            "metadata.annotations[kubernetes.io/config.mirror]"
        );
        for changed in [pod(Some("other")), pod(None)] {
            let causes = validate(&changed, Some(&pod(Some("h"))));
            assert_eq!(
                causes[0].message,
                "Forbidden: may not remove or update mirror pod annotation"
            );
        }
    }
}
