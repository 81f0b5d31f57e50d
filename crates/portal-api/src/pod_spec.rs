//! Pod spec validation (`pkg/apis/core/validation`), shared by Pods and
//! the pod templates of ReplicationControllers, with Kubernetes' field
//! paths and messages: containers (names, images, ports, pull policy,
//! probes, environment, volume mounts), volumes, restart and DNS policies,
//! deadlines; and on update, which fields of a Pod may change at all.

use std::collections::HashSet;

use serde_json::{json, Value};

use crate::name;
use crate::service::validate::{duplicate, port_name_problems, port_range, unsupported};
use crate::status::Cause;

const RESTART_POLICIES: &str = "\"Always\", \"Never\", \"OnFailure\"";
const DNS_POLICIES: &str = "\"ClusterFirst\", \"ClusterFirstWithHostNet\", \"Default\", \"None\"";
const PULL_POLICIES: &str = "\"Always\", \"IfNotPresent\", \"Never\"";
const PROTOCOLS: &str = "\"SCTP\", \"TCP\", \"UDP\"";
/// The handlers a probe or lifecycle hook may name (one of them).
const PROBE_HANDLERS: [&str; 4] = ["exec", "httpGet", "tcpSocket", "grpc"];
const HOOK_HANDLERS: [&str; 4] = ["exec", "httpGet", "tcpSocket", "sleep"];

fn items(value: &Value) -> &[Value] {
    value.as_array().map_or(&[][..], Vec::as_slice)
}

/// Problems with a pod spec at `path` (`spec`, `spec.template.spec`).
pub fn validate(spec: &Value, path: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    let volumes = validate_volumes(spec, path, &mut causes);
    let containers = items(&spec["containers"]);
    if containers.is_empty() {
        causes.push(Cause::required(&format!("{path}.containers"), ""));
    }
    let mut names = HashSet::new();
    for (list, entries) in [
        ("initContainers", items(&spec["initContainers"])),
        ("containers", containers),
    ] {
        for (i, container) in entries.iter().enumerate() {
            let at = format!("{path}.{list}[{i}]");
            unique_label(&container["name"], &at, &mut names, &mut causes);
            validate_container(
                container,
                &at,
                &volumes,
                list == "initContainers",
                &mut causes,
            );
        }
    }
    let restart = spec["restartPolicy"].as_str().unwrap_or("Always");
    if !matches!(restart, "Always" | "OnFailure" | "Never") {
        causes.push(unsupported(
            &format!("{path}.restartPolicy"),
            restart,
            RESTART_POLICIES,
        ));
    }
    let dns = spec["dnsPolicy"].as_str().unwrap_or("ClusterFirst");
    if !matches!(
        dns,
        "ClusterFirst" | "ClusterFirstWithHostNet" | "Default" | "None"
    ) {
        causes.push(unsupported(&format!("{path}.dnsPolicy"), dns, DNS_POLICIES));
    }
    if dns == "None" && spec["dnsConfig"].is_null() {
        causes.push(Cause::required(
            &format!("{path}.dnsConfig"),
            "must provide `dnsConfig` when `dnsPolicy` is None",
        ));
    }
    if let Some(deadline) = spec.get("activeDeadlineSeconds").filter(|v| !v.is_null()) {
        if !deadline
            .as_i64()
            .is_some_and(|d| (1..=2_147_483_647).contains(&d))
        {
            causes.push(Cause::invalid(
                &format!("{path}.activeDeadlineSeconds"),
                deadline.clone(),
                "must be between 1 and 2147483647, inclusive",
            ));
        }
    }
    non_negative(spec, path, "terminationGracePeriodSeconds", &mut causes);
    causes
}

/// `{at}.name`: required, a DNS label, not in `seen` (then added to it).
fn unique_label(name: &Value, at: &str, seen: &mut HashSet<String>, causes: &mut Vec<Cause>) {
    let field = format!("{at}.name");
    let name = name.as_str().unwrap_or("");
    if name.is_empty() {
        causes.push(Cause::required(&field, ""));
        return;
    }
    for problem in name::dns1123_label(name) {
        causes.push(Cause::invalid(&field, name, &problem));
    }
    if !seen.insert(name.to_owned()) {
        causes.push(duplicate(&field, json!(name)));
    }
}

/// The volumes' names (each a unique DNS label, with exactly one source).
fn validate_volumes(spec: &Value, path: &str, causes: &mut Vec<Cause>) -> HashSet<String> {
    let mut names = HashSet::new();
    for (i, volume) in items(&spec["volumes"]).iter().enumerate() {
        let at = format!("{path}.volumes[{i}]");
        unique_label(&volume["name"], &at, &mut names, causes);
        let sources = volume.as_object().map_or(0, |v| {
            v.iter()
                .filter(|(k, v)| *k != "name" && !v.is_null())
                .count()
        });
        if sources == 0 {
            causes.push(Cause::required(&at, "must specify a volume type"));
        } else if sources > 1 {
            causes.push(Cause::forbidden(
                &at,
                "may not specify more than 1 volume type",
            ));
        } else {
            validate_volume_source(volume, &at, causes);
        }
    }
    names
}

/// The volume kinds a Portal node sets up. Anything else is refused here,
/// so no pod runs without a volume it asked for.
const SUPPORTED_VOLUMES: [&str; 7] = [
    "emptyDir",
    "hostPath",
    "configMap",
    "secret",
    "downwardAPI",
    "projected",
    "persistentVolumeClaim",
];

/// One volume's source: a supported kind, its object named, its files'
/// paths and modes well formed (upstream's `validateVolumeSource`).
fn validate_volume_source(volume: &Value, at: &str, causes: &mut Vec<Cause>) {
    let Some((kind, source)) = volume
        .as_object()
        .and_then(|v| v.iter().find(|(k, v)| *k != "name" && !v.is_null()))
    else {
        return;
    };
    if !SUPPORTED_VOLUMES.contains(&kind.as_str()) {
        causes.push(Cause::forbidden(
            &format!("{at}.{kind}"),
            &format!(
                "{kind} volumes are not supported by this cluster's nodes (supported: {})",
                SUPPORTED_VOLUMES.join(", ")
            ),
        ));
        return;
    }
    let at = format!("{at}.{kind}");
    let name_field = match kind.as_str() {
        "configMap" => Some("name"),
        "secret" => Some("secretName"),
        "persistentVolumeClaim" => Some("claimName"),
        "hostPath" => Some("path"),
        _ => None,
    };
    if let Some(field) = name_field {
        if source[field].as_str().unwrap_or("").is_empty() {
            causes.push(Cause::required(&format!("{at}.{field}"), ""));
        }
    }
    validate_mode(&source["defaultMode"], &format!("{at}.defaultMode"), causes);
    let files = |source: &Value, at: &str, causes: &mut Vec<Cause>| {
        for (i, item) in items(&source["items"]).iter().enumerate() {
            let at = format!("{at}.items[{i}]");
            file_path(&item["path"], &format!("{at}.path"), causes);
            validate_mode(&item["mode"], &format!("{at}.mode"), causes);
        }
    };
    match kind.as_str() {
        "configMap" | "secret" | "downwardAPI" => files(source, &at, causes),
        "projected" => {
            for (j, projection) in items(&source["sources"]).iter().enumerate() {
                let at = format!("{at}.sources[{j}]");
                let Some((what, inner)) = projection
                    .as_object()
                    .and_then(|p| p.iter().find(|(_, v)| !v.is_null()))
                else {
                    continue;
                };
                if matches!(what.as_str(), "configMap" | "secret" | "downwardAPI") {
                    files(inner, &format!("{at}.{what}"), causes);
                } else if what == "serviceAccountToken" {
                    token_projection(inner, &format!("{at}.{what}"), causes);
                } else {
                    causes.push(Cause::forbidden(
                        &format!("{at}.{what}"),
                        &format!("{what} projections are not supported by this cluster's nodes"),
                    ));
                }
            }
        }
        _ => {}
    }
}

/// Upstream's `validateProjectionSources` for a token: a path, and a life
/// of ten minutes to 2^32 seconds.
fn token_projection(source: &Value, at: &str, causes: &mut Vec<Cause>) {
    if source["path"].as_str().unwrap_or("").is_empty() {
        causes.push(Cause::required(&format!("{at}.path"), ""));
    } else {
        file_path(&source["path"], &format!("{at}.path"), causes);
    }
    if let Some(seconds) = source["expirationSeconds"].as_i64() {
        if seconds < 600 {
            causes.push(Cause::invalid(
                &format!("{at}.expirationSeconds"),
                seconds,
                "may not specify a duration less than 10 minutes",
            ));
        } else if seconds > 1 << 32 {
            causes.push(Cause::invalid(
                &format!("{at}.expirationSeconds"),
                seconds,
                "may not specify a duration larger than 2^32 seconds",
            ));
        }
    }
}

/// A file mode: 0 to 0777.
fn validate_mode(mode: &Value, at: &str, causes: &mut Vec<Cause>) {
    if mode.as_i64().is_some_and(|m| !(0..=0o777).contains(&m)) {
        causes.push(Cause::invalid(
            at,
            mode.clone(),
            "must be a number between 0 and 0777 (octal), both inclusive",
        ));
    }
}

/// A path inside a volume (an item's `path`, a `subPath`): relative,
/// without `..` (upstream's `validateLocalDescendingPath`).
fn file_path(path: &Value, at: &str, causes: &mut Vec<Cause>) {
    let text = path.as_str().unwrap_or("");
    if text.is_empty() {
        causes.push(Cause::required(at, ""));
        return;
    }
    descending_path(text, at, causes);
    if text.starts_with("..") {
        causes.push(Cause::invalid(at, text, "must not start with '..'"));
    }
}

fn descending_path(text: &str, at: &str, causes: &mut Vec<Cause>) {
    if text.starts_with('/') {
        causes.push(Cause::invalid(at, text, "must be a relative path"));
    }
    if text.split('/').any(|part| part == "..") {
        causes.push(Cause::invalid(at, text, "must not contain '..'"));
    }
}

fn validate_container(
    container: &Value,
    at: &str,
    volumes: &HashSet<String>,
    init: bool,
    causes: &mut Vec<Cause>,
) {
    let image = container["image"].as_str().unwrap_or("");
    if image.is_empty() {
        causes.push(Cause::required(&format!("{at}.image"), ""));
    } else if image.trim() != image {
        causes.push(Cause::invalid(
            &format!("{at}.image"),
            image,
            "must not have leading or trailing whitespace",
        ));
    }
    if let Some(policy) = container["imagePullPolicy"].as_str() {
        if !matches!(policy, "Always" | "IfNotPresent" | "Never") {
            causes.push(unsupported(
                &format!("{at}.imagePullPolicy"),
                policy,
                PULL_POLICIES,
            ));
        }
    }
    validate_resources(container, at, causes);
    let mut port_names = HashSet::new();
    for (i, port) in items(&container["ports"]).iter().enumerate() {
        let at = format!("{at}.ports[{i}]");
        port_range(
            &format!("{at}.containerPort"),
            &port["containerPort"],
            causes,
        );
        if port["hostPort"].as_i64().is_some_and(|p| p != 0) {
            port_range(&format!("{at}.hostPort"), &port["hostPort"], causes);
        }
        let protocol = port["protocol"].as_str().unwrap_or("TCP");
        if !matches!(protocol, "TCP" | "UDP" | "SCTP") {
            causes.push(unsupported(&format!("{at}.protocol"), protocol, PROTOCOLS));
        }
        if let Some(name) = port["name"].as_str().filter(|n| !n.is_empty()) {
            for problem in port_name_problems(name) {
                causes.push(Cause::invalid(&format!("{at}.name"), name, problem));
            }
            if !port_names.insert(name) {
                causes.push(duplicate(&format!("{at}.name"), json!(name)));
            }
        }
    }
    for (i, env) in items(&container["env"]).iter().enumerate() {
        let name = env["name"].as_str().unwrap_or("");
        let field = format!("{at}.env[{i}].name");
        if name.is_empty() {
            causes.push(Cause::required(&field, ""));
        } else if name.contains('=') || !name.bytes().all(|b| (b' '..=b'~').contains(&b)) {
            causes.push(Cause::invalid(
                &field,
                name,
                "a valid environment variable name must consist only of printable ASCII characters other than '='",
            ));
        }
    }
    let mut mount_paths = HashSet::new();
    for (i, mount) in items(&container["volumeMounts"]).iter().enumerate() {
        let at = format!("{at}.volumeMounts[{i}]");
        let name = mount["name"].as_str().unwrap_or("");
        if name.is_empty() {
            causes.push(Cause::required(&format!("{at}.name"), ""));
        } else if !volumes.contains(name) {
            causes.push(Cause {
                reason: "FieldValueNotFound".into(),
                message: format!("Not found: {}", json!(name)),
                field: format!("{at}.name"),
            });
        }
        if let Some(sub) = mount["subPath"].as_str().filter(|s| !s.is_empty()) {
            descending_path(sub, &format!("{at}.subPath"), causes);
        }
        let path = mount["mountPath"].as_str().unwrap_or("");
        if path.is_empty() {
            causes.push(Cause::required(&format!("{at}.mountPath"), ""));
        } else if !mount_paths.insert(path) {
            causes.push(Cause::invalid(
                &format!("{at}.mountPath"),
                path,
                "must be unique",
            ));
        }
    }
    // A regular init container runs to completion: it has no probes (a
    // sidecar, `restartPolicy: Always`, may).
    let sidecar = container["restartPolicy"].as_str() == Some("Always");
    for (probe, must_succeed_once) in [
        ("livenessProbe", true),
        ("readinessProbe", false),
        ("startupProbe", true),
    ] {
        let value = &container[probe];
        if value.is_null() {
            continue;
        }
        let field = format!("{at}.{probe}");
        if init && !sidecar {
            causes.push(Cause::forbidden(
                &field,
                "may not be set for init containers without restartPolicy=Always",
            ));
            continue;
        }
        handler(value, &field, &PROBE_HANDLERS, causes);
        for timing in [
            "initialDelaySeconds",
            "timeoutSeconds",
            "periodSeconds",
            "successThreshold",
            "failureThreshold",
        ] {
            non_negative(value, &field, timing, causes);
        }
        let success = &value["successThreshold"];
        if must_succeed_once && success.as_i64().is_some_and(|s| s != 1) {
            causes.push(Cause::invalid(
                &format!("{field}.successThreshold"),
                success.clone(),
                "must be 1",
            ));
        }
    }
    for hook in ["postStart", "preStop"] {
        let value = &container["lifecycle"][hook];
        if !value.is_null() {
            handler(
                value,
                &format!("{at}.lifecycle.{hook}"),
                &HOOK_HANDLERS,
                causes,
            );
        }
    }
}

/// A container's `resources`, as Kubernetes checks them: standard or fully
/// qualified names, quantities that parse and are not negative, requests
/// no larger than limits, and extended resources (not overcommitable)
/// requested exactly at their limit.
fn validate_resources(container: &Value, at: &str, causes: &mut Vec<Cause>) {
    let resources = &container["resources"];
    let mut parsed: [Vec<(String, String, i64)>; 2] = [Vec::new(), Vec::new()];
    for (part, list) in ["limits", "requests"].iter().zip(parsed.iter_mut()) {
        let Some(map) = resources[*part].as_object() else {
            continue;
        };
        for (name, quantity) in map {
            let field = format!("{at}.resources.{part}[{name}]");
            if !resource_name_ok(name) {
                causes.push(Cause::invalid(
                    &field,
                    name.as_str(),
                    "must be a standard resource type or fully qualified",
                ));
                continue;
            }
            let text = match quantity {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => String::new(),
            };
            match crate::quantity::millicores(&text) {
                Some(value) => list.push((name.clone(), text, value)),
                None if text.trim_start().starts_with('-') => causes.push(Cause::invalid(
                    &field,
                    text.as_str(),
                    "must be greater than or equal to 0",
                )),
                None => causes.push(Cause::invalid(
                    &field,
                    text.as_str(),
                    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
                )),
            }
        }
    }
    let [limits, requests] = parsed;
    for (name, text, value) in &requests {
        let field = format!("{at}.resources.requests[{name}]");
        let limit = limits.iter().find(|(n, _, _)| n == name);
        let extended = name.contains('/') && !name.starts_with("kubernetes.io/");
        match limit {
            Some((_, limit_text, limit)) if extended && value != limit => {
                causes.push(Cause::invalid(
                    &field,
                    text.as_str(),
                    &format!("must be equal to {name} limit of {limit_text}"),
                ))
            }
            Some((_, limit_text, limit)) if value > limit => causes.push(Cause::invalid(
                &field,
                text.as_str(),
                &format!("must be less than or equal to {name} limit of {limit_text}"),
            )),
            None if extended => causes.push(Cause::required(
                &format!("{at}.resources.limits[{name}]"),
                "Limit must be set for non overcommitable resources",
            )),
            _ => {}
        }
    }
}

/// `cpu`, `memory`, `ephemeral-storage`, `hugepages-<size>`, or a name
/// with a domain prefix (`example.com/gpu`).
fn resource_name_ok(name: &str) -> bool {
    match name.split_once('/') {
        None => {
            matches!(name, "cpu" | "memory" | "ephemeral-storage") || name.starts_with("hugepages-")
        }
        Some((domain, rest)) => {
            !domain.is_empty()
                && domain.contains('.')
                && !rest.is_empty()
                && rest
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        }
    }
}

/// Exactly one handler of `kinds`.
fn handler(value: &Value, field: &str, kinds: &[&str], causes: &mut Vec<Cause>) {
    let named = kinds.iter().filter(|k| !value[**k].is_null()).count();
    if named == 0 {
        causes.push(Cause::required(field, "must specify a handler type"));
    } else if named > 1 {
        causes.push(Cause::forbidden(
            field,
            "may not specify more than 1 handler type",
        ));
    }
}

fn non_negative(object: &Value, path: &str, field: &str, causes: &mut Vec<Cause>) {
    let value = &object[field];
    if value.as_i64().is_some_and(|v| v < 0) {
        causes.push(Cause::invalid(
            &format!("{path}.{field}"),
            value.clone(),
            "must be greater than or equal to 0",
        ));
    }
}

/// What an update may change in a Pod's spec, as Kubernetes allows: images,
/// `activeDeadlineSeconds`, added tolerations, and a negative grace
/// period made 1. (`nodeName` may also be set once on an unbound pod: the
/// binding subresource goes through the same update path here.)
pub fn validate_update(new: &Value, old: &Value) -> Vec<Cause> {
    let (mut new, mut old) = (new["spec"].clone(), old["spec"].clone());
    for spec in [&mut new, &mut old] {
        for list in ["containers", "initContainers"] {
            if let Some(containers) = spec[list].as_array_mut() {
                for container in containers {
                    container["image"] = Value::Null;
                }
            }
        }
        if let Some(map) = spec.as_object_mut() {
            map.remove("activeDeadlineSeconds");
        }
    }
    // A toleration's seconds may change; otherwise only additions.
    let without_seconds = |list: &Value| -> Vec<Value> {
        items(list)
            .iter()
            .map(|t| {
                let mut t = t.clone();
                if let Some(map) = t.as_object_mut() {
                    map.remove("tolerationSeconds");
                }
                t
            })
            .collect()
    };
    let old_tolerations = without_seconds(&old["tolerations"]);
    let new_tolerations = without_seconds(&new["tolerations"]);
    // Fields that may change take the old value (absent stays absent).
    let keep_old = |new: &mut Value, field: &str| match (new.as_object_mut(), old.get(field)) {
        (Some(map), Some(value)) => {
            map.insert(field.to_owned(), value.clone());
        }
        (Some(map), None) => {
            map.remove(field);
        }
        (None, _) => {}
    };
    if old_tolerations.iter().all(|t| new_tolerations.contains(t)) {
        keep_old(&mut new, "tolerations");
    }
    if old["terminationGracePeriodSeconds"]
        .as_i64()
        .is_some_and(|g| g < 0)
        && new["terminationGracePeriodSeconds"].as_i64() == Some(1)
    {
        keep_old(&mut new, "terminationGracePeriodSeconds");
    }
    if old["nodeName"].as_str().is_none_or(str::is_empty) {
        keep_old(&mut new, "nodeName");
    }
    if new == old {
        return Vec::new();
    }
    vec![Cause::forbidden(
        "spec",
        "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
    )]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(containers: Value) -> Value {
        json!({"containers": containers})
    }

    fn messages(spec: &Value) -> Vec<String> {
        validate(spec, "spec").iter().map(Cause::display).collect()
    }

    #[test]
    fn resources_are_checked_as_kubernetes_does() {
        let with = |resources: Value| {
            messages(&spec(
                json!([{"name": "c", "image": "i", "resources": resources}]),
            ))
        };
        assert!(with(
            json!({"limits": {"cpu": "1", "memory": "1Gi", "example.com/gpu": "1"},
            "requests": {"cpu": "500m", "memory": "512Mi", "example.com/gpu": "1"}})
        )
        .is_empty());
        assert_eq!(
            with(json!({"limits": {"memory": "1Gi"}, "requests": {"memory": "2Gi"}})),
            ["spec.containers[0].resources.requests[memory]: Invalid value: \"2Gi\": must be less than or equal to memory limit of 1Gi"]
        );
        assert_eq!(
            with(json!({"limits": {"cpu": "-1"}})),
            ["spec.containers[0].resources.limits[cpu]: Invalid value: \"-1\": must be greater than or equal to 0"]
        );
        assert_eq!(
            with(json!({"limits": {"example.com/gpu": "2"}, "requests": {"example.com/gpu": "1"}})),
            ["spec.containers[0].resources.requests[example.com/gpu]: Invalid value: \"1\": must be equal to example.com/gpu limit of 2"]
        );
        assert_eq!(with(json!({"limits": {"cpu": "lots"}})).len(), 1);
        assert_eq!(with(json!({"limits": {"disk": "1"}})).len(), 1);
    }

    #[test]
    fn a_minimal_spec_is_valid() {
        assert!(messages(&spec(json!([{"name": "c", "image": "busybox"}]))).is_empty());
    }

    #[test]
    fn containers_are_checked_as_kubernetes_does() {
        assert_eq!(
            messages(&spec(json!([]))),
            ["spec.containers: Required value"]
        );
        assert_eq!(
            messages(&spec(json!([{"name": "", "image": "x"}]))),
            ["spec.containers[0].name: Required value"]
        );
        assert_eq!(
            messages(&spec(
                json!([{"name": "c", "image": "x"}, {"name": "c", "image": "y"}])
            )),
            ["spec.containers[1].name: Duplicate value: \"c\""]
        );
        assert_eq!(
            messages(&spec(json!([{"name": "c"}]))),
            ["spec.containers[0].image: Required value"]
        );
        let bad = messages(&spec(json!([{"name": "Bad_Name", "image": "x"}])));
        assert!(
            bad[0].starts_with(
                "spec.containers[0].name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 label"
            ),
            "{bad:?}"
        );
        assert_eq!(
            messages(&spec(json!([{"name": "c", "image": "x", "imagePullPolicy": "Sometimes"}]))),
            ["spec.containers[0].imagePullPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"IfNotPresent\", \"Never\""]
        );
    }

    #[test]
    fn ports_probes_env_and_mounts() {
        let container = json!({
            "name": "c", "image": "x",
            "ports": [{"containerPort": 0}, {"containerPort": 80, "name": "http"}, {"containerPort": 81, "name": "http", "protocol": "ICMP"}],
            "livenessProbe": {"exec": {"command": ["true"]}, "httpGet": {"port": 80}, "successThreshold": 2},
            "readinessProbe": {"periodSeconds": -1},
            "env": [{"name": ""}, {"name": "A=B"}],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        });
        assert_eq!(
            messages(&spec(json!([container]))),
            [
                "spec.containers[0].ports[0].containerPort: Invalid value: 0: must be between 1 and 65535, inclusive",
                "spec.containers[0].ports[2].protocol: Unsupported value: \"ICMP\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
                "spec.containers[0].ports[2].name: Duplicate value: \"http\"",
                "spec.containers[0].env[0].name: Required value",
                "spec.containers[0].env[1].name: Invalid value: \"A=B\": a valid environment variable name must consist only of printable ASCII characters other than '='",
                "spec.containers[0].volumeMounts[0].name: Not found: \"data\"",
                "spec.containers[0].livenessProbe: Forbidden: may not specify more than 1 handler type",
                "spec.containers[0].livenessProbe.successThreshold: Invalid value: 2: must be 1",
                "spec.containers[0].readinessProbe: Required value: must specify a handler type",
                "spec.containers[0].readinessProbe.periodSeconds: Invalid value: -1: must be greater than or equal to 0",
            ]
        );
    }

    #[test]
    fn policies_volumes_and_deadlines() {
        let mut s = spec(json!([{"name": "c", "image": "x"}]));
        s["restartPolicy"] = json!("Sometimes");
        s["dnsPolicy"] = json!("None");
        s["activeDeadlineSeconds"] = json!(0);
        s["volumes"] =
            json!([{"name": "v"}, {"name": "v", "emptyDir": {}, "hostPath": {"path": "/"}}]);
        assert_eq!(
            messages(&s),
            [
                "spec.volumes[0]: Required value: must specify a volume type",
                "spec.volumes[1].name: Duplicate value: \"v\"",
                "spec.volumes[1]: Forbidden: may not specify more than 1 volume type",
                "spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"Never\", \"OnFailure\"",
                "spec.dnsConfig: Required value: must provide `dnsConfig` when `dnsPolicy` is None",
                "spec.activeDeadlineSeconds: Invalid value: 0: must be between 1 and 2147483647, inclusive",
            ]
        );
    }

    #[test]
    fn unsupported_volumes_and_bad_paths_are_refused() {
        let mut s = spec(json!([{"name": "c", "image": "x",
            "volumeMounts": [{"name": "cfg", "mountPath": "/c", "subPath": "../x"}]}]));
        s["volumes"] = json!([
            {"name": "nfs", "nfs": {"server": "s", "path": "/"}},
            {"name": "cfg", "configMap": {"name": "", "defaultMode": 512, "items": [{"key": "k", "path": "..a"}]}},
            {"name": "tok", "projected": {"sources": [{"serviceAccountToken": {"path": "t", "expirationSeconds": 60}}]}},
        ]);
        assert_eq!(
            messages(&s),
            [
                "spec.volumes[0].nfs: Forbidden: nfs volumes are not supported by this cluster's nodes (supported: emptyDir, hostPath, configMap, secret, downwardAPI, projected, persistentVolumeClaim)",
                "spec.volumes[1].configMap.name: Required value",
                "spec.volumes[1].configMap.defaultMode: Invalid value: 512: must be a number between 0 and 0777 (octal), both inclusive",
                "spec.volumes[1].configMap.items[0].path: Invalid value: \"..a\": must not start with '..'",
                "spec.volumes[2].projected.sources[0].serviceAccountToken.expirationSeconds: Invalid value: 60: may not specify a duration less than 10 minutes",
                "spec.containers[0].volumeMounts[0].subPath: Invalid value: \"../x\": must not contain '..'",
            ]
        );
    }

    #[test]
    fn init_containers_share_names_and_may_not_probe_unless_sidecars() {
        let mut s = spec(json!([{"name": "c", "image": "x"}]));
        s["initContainers"] = json!([
            {"name": "c", "image": "x", "readinessProbe": {"exec": {"command": ["true"]}}},
            {"name": "side", "image": "x", "restartPolicy": "Always", "readinessProbe": {"exec": {"command": ["true"]}}},
        ]);
        assert_eq!(
            messages(&s),
            [
                "spec.initContainers[0].readinessProbe: Forbidden: may not be set for init containers without restartPolicy=Always",
                "spec.containers[0].name: Duplicate value: \"c\"",
            ]
        );
    }

    #[test]
    fn an_update_may_change_only_what_kubernetes_allows() {
        let pod = |image: &str, extra: Value| {
            let mut p = json!({"spec": {"containers": [{"name": "c", "image": image}], "tolerations": [{"key": "a"}]}});
            for (k, v) in extra.as_object().unwrap() {
                p["spec"][k] = v.clone();
            }
            p
        };
        let old = pod("x:1", json!({}));
        assert!(validate_update(&pod("x:2", json!({"activeDeadlineSeconds": 5})), &old).is_empty());
        assert!(validate_update(
            &pod("x:1", json!({"tolerations": [{"key": "a"}, {"key": "b"}]})),
            &old
        )
        .is_empty());
        assert!(
            validate_update(
                &pod(
                    "x:1",
                    json!({"tolerations": [{"key": "a", "tolerationSeconds": 5}]})
                ),
                &old
            )
            .is_empty(),
            "a toleration's seconds may change"
        );
        assert!(
            validate_update(&pod("x:1", json!({"nodeName": "n1"})), &old).is_empty(),
            "binding"
        );
        let bound = pod("x:1", json!({"nodeName": "n1"}));
        assert_eq!(
            validate_update(&pod("x:1", json!({"nodeName": "n2"})), &bound).len(),
            1
        );
        assert_eq!(
            validate_update(&pod("x:1", json!({"tolerations": []})), &old).len(),
            1
        );
        let changed = validate_update(&pod("x:1", json!({"restartPolicy": "Never"})), &old);
        assert!(changed[0]
            .display()
            .starts_with("spec: Forbidden: pod updates may not change fields other than"));
    }
}
